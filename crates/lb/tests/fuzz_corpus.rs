//! braid-lb's fuzz targets on stable Rust, in the ordinary test suite: every file of the
//! committed seed corpus (`fuzz/corpus/<target>/`) and random inputs go through the functions the
//! cargo-fuzz targets call (`braid_lb::fuzzing`). Coverage-guided fuzzing runs with
//! `scripts/fuzz.sh` (nightly).
//!
//! To (re)write the generated seeds: `cargo test -p braid-lb --test fuzz_corpus -- --ignored`.

use braid_lb::fuzzing::{dsr_frames, health_http, seed_corpus};
use proptest::prelude::*;

#[path = "../../../fuzz/corpus_replay.rs"]
mod corpus_replay;
use corpus_replay::{assert_seeds_current, replay, write_seeds};

#[test]
fn dsr_frames_corpus() {
    replay("dsr_frames", dsr_frames);
}

#[test]
fn health_http_corpus() {
    replay("health_http", health_http);
}

#[test]
fn committed_seeds_are_current() {
    assert_seeds_current(seed_corpus());
}

#[test]
#[ignore = "writes fuzz/corpus; run by hand after changing a harness's input language"]
fn write_seed_corpus() {
    write_seeds(seed_corpus());
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
