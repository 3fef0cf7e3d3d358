#!/bin/sh
# Builds the Debian package of braid with cargo-deb (`cargo install cargo-deb`):
#   1. builds the release binary,
#   2. writes the man pages (`braid man --dir`) and shell completions (`braid completions SHELL`)
#      into dist/generated/ (git-ignored; not under target/, where cargo-deb only takes
#      target/release/), where crates/braid/Cargo.toml's [package.metadata.deb] finds them,
#   3. runs `cargo deb`, which packs the binary, the systemd units (dist/systemd/), the man pages,
#      the completions, the guides and the example configurations (examples/*.toml).
# The .deb lands in target/debian/. Extra arguments go to cargo deb (e.g. --no-strip).
# BRAID_GIT_COMMIT=... sets the commit shown by the braid_build_info metric when building
# outside a git checkout.
set -eu
cd "$(dirname "$0")/.."
command -v cargo-deb >/dev/null || { echo "build-deb: cargo-deb is missing: cargo install cargo-deb" >&2; exit 1; }
cargo build --release -p braid
bin="$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')/release/braid"
out=dist/generated
rm -rf "$out"
mkdir -p "$out/man" "$out/completions"
"$bin" man --dir "$out/man"
"$bin" completions bash > "$out/completions/braid.bash"
"$bin" completions zsh > "$out/completions/_braid"
"$bin" completions fish > "$out/completions/braid.fish"
cargo deb -p braid --no-build "$@"
