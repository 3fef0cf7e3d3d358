//! Replaying the fuzz targets on stable Rust, shared by every crate's `tests/fuzz_corpus.rs`
//! (each includes this file with `#[path]`): the committed seed corpus (`fuzz/corpus/<target>/`),
//! the check that it matches the seeds the harnesses generate, their regeneration, and random
//! mutations of the seeds from a fixed-seed generator. Coverage-guided fuzzing itself runs with
//! `scripts/fuzz.sh` (nightly).

#![allow(dead_code)] // each crate's tests use the part they need

use std::path::PathBuf;

/// A generated seed: (target, file name, bytes), as the crates' `fuzzing::seed_corpus` give them.
pub type Seed = (&'static str, String, Vec<u8>);

/// `fuzz/corpus/<target>`.
pub fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target)
}

/// Files of a target's corpus, sorted; fails if there are fewer than five (the corpus must not
/// vanish).
pub fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = corpus_dir(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("readable dir entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(files.len() >= 5, "{}: seed corpus missing", dir.display());
    files
        .into_iter()
        .map(|p| {
            let b = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, b)
        })
        .collect()
}

/// Runs `f` on every file of `target`'s corpus.
pub fn replay(target: &str, f: impl Fn(&[u8])) {
    for (path, data) in corpus(target) {
        eprintln!("{target} {}", path.display());
        f(&data);
    }
}

/// The committed corpus holds every generated seed byte for byte (a change of the wire format or
/// of a harness's input language shows up here, and the seeds get regenerated).
pub fn assert_seeds_current(seeds: impl IntoIterator<Item = Seed>) {
    let package = env!("CARGO_PKG_NAME");
    for (target, name, bytes) in seeds {
        let p = corpus_dir(target).join(&name);
        let on_disk = std::fs::read(&p).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (regenerate: cargo test -p {package} --test fuzz_corpus -- --ignored)",
                p.display()
            )
        });
        assert_eq!(on_disk, bytes, "{} is stale", p.display());
    }
}

/// Writes the generated seeds into `fuzz/corpus`.
pub fn write_seeds(seeds: impl IntoIterator<Item = Seed>) {
    for (target, name, bytes) in seeds {
        let dir = corpus_dir(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

/// `rounds` inputs to `f`: every other one random bytes (up to 400), the others the seeds in
/// turn; each with one byte changed and cut at a random length. A fixed-seed generator, so that a
/// failure repeats.
pub fn mutations(seeds: &[Vec<u8>], rounds: usize, f: impl Fn(&[u8])) {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..rounds {
        let mut data: Vec<u8> = if i % 2 == 0 || seeds.is_empty() {
            (0..next() % 400).map(|_| next() as u8).collect()
        } else {
            seeds[i % seeds.len()].clone()
        };
        if !data.is_empty() {
            let at = (next() as usize) % data.len();
            data[at] = next() as u8;
            data.truncate(1 + (next() as usize) % data.len());
        }
        f(&data);
    }
}
