#!/usr/bin/env bash
# Runs every cargo-fuzz target (fuzz/fuzz_targets/: wire parsers and endpoints of braid-core; DSR
# frames, health-check HTTP, metrics HTTP, control-socket JSON) for a bounded time (default 60 s each).
#
#   scripts/fuzz.sh [SECONDS]
#
# Needs the nightly toolchain; installs cargo-fuzz (cargo install cargo-fuzz --locked) if missing.
# The committed seed corpus (fuzz/corpus/<target>/) is read, never written: libFuzzer's own finds
# go to fuzz/target/corpus/<target>/ (ignored by git). A crash leaves its input in
# fuzz/artifacts/<target>/ and makes this script exit non-zero; replay it with
#   cargo +nightly fuzz run <target> fuzz/artifacts/<target>/<file>
# and add it to fuzz/corpus/<target>/ once fixed (the owning crate's tests/fuzz_corpus.rs then
# guards it on stable).
set -euo pipefail

secs="${1:-60}"
case "$secs" in
  ''|*[!0-9]*) echo "usage: $0 [SECONDS]  (a whole number of seconds per target)" >&2; exit 2 ;;
esac

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root/fuzz"

if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz.sh: the nightly toolchain is required (rustup toolchain install nightly)" >&2
  exit 1
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "fuzz.sh: installing cargo-fuzz" >&2
  cargo install cargo-fuzz --locked
fi

targets=$(cargo +nightly fuzz list)
status=0
for t in $targets; do
  work="$root/fuzz/target/corpus/$t"
  mkdir -p "$work" "$root/fuzz/corpus/$t"
  echo "=== fuzz target $t: ${secs}s ==="
  # -timeout: one input taking over 10 s is a hang, reported as a failure.
  if ! cargo +nightly fuzz run "$t" "$work" "$root/fuzz/corpus/$t" -- \
        -max_total_time="$secs" -timeout=10 -print_final_stats=1; then
    echo "fuzz.sh: target $t FAILED (see fuzz/artifacts/$t/)" >&2
    status=1
  fi
done
exit $status
