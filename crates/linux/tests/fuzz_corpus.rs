//! The metrics_http fuzz target on stable Rust, in the ordinary test suite: every file of the
//! committed seed corpus (`fuzz/corpus/metrics_http/`) and random inputs go through the function
//! the cargo-fuzz target calls (`braid_linux::fuzzing`). Coverage-guided fuzzing runs with
//! `scripts/fuzz.sh` (nightly).
//!
//! To (re)write the generated seeds: `cargo test -p braid-linux --test fuzz_corpus -- --ignored`.

use braid_linux::fuzzing::{metrics_http, seed_corpus};

#[path = "../../../fuzz/corpus_replay.rs"]
mod corpus_replay;
use corpus_replay::{assert_seeds_current, mutations, replay, write_seeds};

#[test]
fn metrics_http_corpus() {
    replay("metrics_http", metrics_http);
}

#[test]
fn committed_seeds_are_current() {
    assert_seeds_current(seed_corpus());
}

#[test]
#[ignore = "writes fuzz/corpus; run by hand after changing the harness's input language"]
fn write_seed_corpus() {
    write_seeds(seed_corpus());
}

/// Random inputs, and random mutations of the seeds (a byte changed, the input cut).
#[test]
fn metrics_http_random() {
    let seeds: Vec<Vec<u8>> = seed_corpus().into_iter().map(|(_, _, b)| b).collect();
    mutations(&seeds, 4000, metrics_http);
}
