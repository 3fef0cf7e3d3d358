//! Records the git commit braid is built from, for the `braid_build_info` metric: `BRAID_GIT_COMMIT`
//! from the environment if set (packagers building from a tarball), else `git rev-parse HEAD` if
//! this is a git checkout and git is installed, else nothing (the metric then says "unknown").
//! It lives in the binary crate, the leaf of the build graph, so that a new commit recompiles
//! main.rs only; main hands the value to `braid_linux::metrics::set_git_commit`.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=BRAID_GIT_COMMIT");
    let commit = std::env::var("BRAID_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| {
            // Rebuild when HEAD moves: HEAD itself (branch switch), the branch's ref (commit), and
            // packed-refs. In a worktree, HEAD lives in the worktree's git dir, refs in the common one.
            if let (Some(dir), Some(common)) = (
                git(&["rev-parse", "--absolute-git-dir"]),
                git(&["rev-parse", "--path-format=absolute", "--git-common-dir"]),
            ) {
                let mut watch = vec![Path::new(&dir).join("HEAD")];
                watch.push(Path::new(&common).join("packed-refs"));
                if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
                    watch.push(Path::new(&common).join(r));
                }
                // A path that does not exist would make cargo rerun this script on every build.
                for p in watch.iter().filter(|p| p.exists()) {
                    println!("cargo:rerun-if-changed={}", p.display());
                }
            }
            git(&["rev-parse", "--short=12", "HEAD"])
        });
    if let Some(c) = commit {
        println!("cargo:rustc-env=BRAID_GIT_COMMIT={c}");
    }
}
