//! The metrics_http fuzz target on stable Rust, in the ordinary test suite: every file of the
//! committed seed corpus (`fuzz/corpus/metrics_http/`) and random inputs go through the function
//! the cargo-fuzz target calls (`braid_linux::fuzzing`). Coverage-guided fuzzing runs with
//! `scripts/fuzz.sh` (nightly).
//!
//! To (re)write the generated seeds: `cargo test -p braid-linux --test fuzz_corpus -- --ignored`.

use std::path::PathBuf;

use braid_linux::fuzzing::{metrics_http, seed_corpus};

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target)
}

#[test]
fn metrics_http_corpus() {
    let dir = corpus_dir("metrics_http");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("readable dir entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(files.len() >= 5, "{}: seed corpus missing", dir.display());
    for p in files {
        eprintln!("metrics_http {}", p.display());
        metrics_http(&std::fs::read(&p).unwrap());
    }
}

#[test]
fn committed_seeds_are_current() {
    for (target, name, bytes) in seed_corpus() {
        let p = corpus_dir(target).join(&name);
        let on_disk = std::fs::read(&p).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (regenerate: cargo test -p braid-linux --test fuzz_corpus -- --ignored)",
                p.display()
            )
        });
        assert_eq!(on_disk, bytes, "{} is stale", p.display());
    }
}

#[test]
#[ignore = "writes fuzz/corpus; run by hand after changing the harness's input language"]
fn write_seed_corpus() {
    for (target, name, bytes) in seed_corpus() {
        let dir = corpus_dir(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

/// Random inputs, and random mutations of the seeds (a byte changed, the input cut), from a
/// fixed-seed generator so that a failure repeats.
#[test]
fn metrics_http_random() {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let seeds: Vec<Vec<u8>> = seed_corpus().into_iter().map(|(_, _, b)| b).collect();
    for i in 0..4000 {
        let mut data: Vec<u8> = if i % 2 == 0 {
            (0..next() % 400).map(|_| next() as u8).collect()
        } else {
            seeds[i % seeds.len()].clone()
        };
        if !data.is_empty() {
            let at = (next() as usize) % data.len();
            data[at] = next() as u8;
            data.truncate(1 + (next() as usize) % data.len());
        }
        metrics_http(&data);
    }
}
