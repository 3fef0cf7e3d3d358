//! braid-lb's fuzz targets on stable Rust, in the ordinary test suite: every file of the
//! committed seed corpus (`fuzz/corpus/<target>/`) and random inputs go through the functions the
//! cargo-fuzz targets call (`braid_lb::fuzzing`). Coverage-guided fuzzing runs with
//! `scripts/fuzz.sh` (nightly).
//!
//! To (re)write the generated seeds: `cargo test -p braid-lb --test fuzz_corpus -- --ignored`.

use std::path::PathBuf;

use braid_lb::fuzzing::{dsr_frames, health_http, seed_corpus};
use proptest::prelude::*;

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target)
}

/// Files of a target's corpus, sorted; fails if there are none (the corpus must not vanish).
fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
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

#[test]
fn dsr_frames_corpus() {
    for (path, data) in corpus("dsr_frames") {
        eprintln!("dsr_frames {}", path.display());
        dsr_frames(&data);
    }
}

#[test]
fn health_http_corpus() {
    for (path, data) in corpus("health_http") {
        eprintln!("health_http {}", path.display());
        health_http(&data);
    }
}

#[test]
fn committed_seeds_are_current() {
    for (target, name, bytes) in seed_corpus() {
        let p = corpus_dir(target).join(&name);
        let on_disk = std::fs::read(&p).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (regenerate: cargo test -p braid-lb --test fuzz_corpus -- --ignored)",
                p.display()
            )
        });
        assert_eq!(on_disk, bytes, "{} is stale", p.display());
    }
}

#[test]
#[ignore = "writes fuzz/corpus; run by hand after changing a harness's input language"]
fn write_seed_corpus() {
    for (target, name, bytes) in seed_corpus() {
        let dir = corpus_dir(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]
    #[test]
    fn dsr_frames_random(data in proptest::collection::vec(any::<u8>(), 0..600)) {
        dsr_frames(&data);
    }

    #[test]
    fn health_http_random(data in proptest::collection::vec(any::<u8>(), 0..40)) {
        health_http(&data);
        let mut line = b"HTTP/1.1 ".to_vec();
        line.extend(&data);
        health_http(&line);
    }
}
