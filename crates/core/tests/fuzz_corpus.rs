//! The fuzz targets on stable Rust, in the ordinary test suite: every file of the committed seed
//! corpus (`fuzz/corpus/<target>/`) and a few thousand random inputs go through the same functions
//! the cargo-fuzz targets call (`braid_core::fuzzing`). Coverage-guided fuzzing itself runs with
//! `scripts/fuzz.sh` (nightly).
//!
//! To (re)write the generated seeds: `cargo test -p braid-core --test fuzz_corpus -- --ignored`.

use braid_core::fuzzing::op;
use braid_core::fuzzing::{
    decompress_seeds, decompress_stream, learn_addresses, learn_addresses_report, learn_src,
    parse_any, reassemble_seeds, reassemble_stream, receive_path, receive_path_carried,
    receive_path_report, seed_corpus, Carry,
};
use proptest::prelude::*;

#[path = "../../../fuzz/corpus_replay.rs"]
mod corpus_replay;
use corpus_replay::{assert_seeds_current, replay, write_seeds};

#[test]
fn parse_corpus() {
    replay("parse", parse_any);
}

#[test]
fn receive_corpus() {
    replay("receive", receive_path);
}

#[test]
fn learn_corpus() {
    replay("learn", learn_addresses);
}

/// The address-learning harness reaches what it claims: a link that moves is followed, replays
/// from elsewhere do not move it, and 100 link ids end at the session's bound of windows.
#[test]
fn learn_harness_reaches_the_endpoint() {
    let seeds = seed_corpus();
    let seed = |name: &str| {
        seeds
            .iter()
            .find(|(t, n, _)| *t == "learn" && n == name)
            .map(|(_, _, b)| b.clone())
            .unwrap_or_else(|| panic!("no seed {name}"))
    };
    let r = learn_addresses_report(&seed("nat-rebinding-and-replays"));
    assert!(
        r.links.contains(&(1, learn_src(0x62))),
        "link 1 not at its last address: {:?}",
        r.links
    );
    assert!(r.server.drops.replay >= 1, "{:?}", r.server.drops);
    let r = learn_addresses_report(&seed("many-link-ids"));
    assert_eq!(r.windows, braid_core::replay::MAX_LINKS);
    assert_eq!(r.links.len(), braid_core::replay::MAX_LINKS);
    assert!(r.accepted < 101);
    let r = learn_addresses_report(&seed("garbage-and-tampered"));
    assert!(
        r.server.drops.auth >= 1 && r.server.drops.malformed + r.server.drops.unknown_session >= 1
    );
    let r = learn_addresses_report(&seed("forgotten-then-back"));
    // Link 0 (the confirming packet's) and link 2 fell silent past forget_link_after; link 2
    // came back from a new address.
    assert_eq!(r.links, vec![(2, learn_src(4))]);
}

/// The harness reaches what it claims: the observer learns the keys, a sealed DATA gets through
/// authentication to the tunnel, garbage and replays are counted as such.
#[test]
fn receive_harness_reaches_the_endpoint() {
    let seeds = seed_corpus();
    let seed = |name: &str| {
        seeds
            .iter()
            .find(|(t, n, _)| *t == "receive" && n == name)
            .map(|(_, _, b)| b.clone())
            .unwrap_or_else(|| panic!("no seed {name}"))
    };
    let empty = receive_path_report(&[]);
    assert!(empty.keys_observed, "handshake not observed");
    assert!(empty.client.session.is_some() && empty.server.session.is_some());

    let r = receive_path_report(&seed("sealed-data-unordered"));
    assert!(r.keys_observed);
    assert_eq!(r.server.drops.auth, 0, "{:?}", r.server.drops);
    assert!(
        r.server.tun_tx_packets >= 1,
        "sealed DATA not delivered: {:?}",
        r.server
    );

    let r = receive_path_report(&seed("sealed-data"));
    assert!(
        r.server.tun_tx_packets >= 1,
        "sealed DATA not delivered: {:?}",
        r.server
    );

    // The fuzzer's own HELLO is answered, and its DATA under the new keys switches the server
    // over (the old session is closed), then gets delivered.
    let before = receive_path_report(&[]).server.session;
    let r = receive_path_report(&seed("second-client-takes-over"));
    assert!(
        r.server.session.is_some() && r.server.session != before,
        "{:?}",
        r.server
    );
    assert!(r.server.tun_tx_packets >= 1, "{:?}", r.server);

    let r = receive_path_report(&seed("raw-garbage"));
    assert!(r.server.drops.malformed + r.server.drops.unknown_session >= 1);

    let r = receive_path_report(&seed("replay-and-tamper"));
    let d = &r.client.drops;
    let s = &r.server.drops;
    assert!(
        d.replay + d.auth + s.replay + s.auth + d.malformed + s.malformed >= 2,
        "replays not dropped: {d:?} {s:?}"
    );
}

/// The deferred opening in the harness is more than batches of one: 40 packets into the
/// tunnel at each end arrive at the other in one batch, opened as jobs back to front, and end
/// as they do inline (the check `receive_path` makes on every input).
#[test]
fn receive_harness_opens_batches_as_jobs() {
    let mut program = Vec::new();
    for i in 0..80u8 {
        let mut packet = [0u8; 60];
        (packet[0], packet[9], packet[20]) = (0x45, 17, i);
        program.extend_from_slice(&[op::SEND, i % 2, 0, 60]);
        program.extend_from_slice(&packet);
    }
    program.extend_from_slice(&[op::ADVANCE, 1]);
    let inline = receive_path_carried(&program, Carry::Batches);
    let deferred = receive_path_carried(&program, Carry::DeferredBatches);
    assert_eq!(inline.jobs, 0);
    assert!(deferred.jobs >= 80, "{} jobs", deferred.jobs);
    assert!(deferred.server.tun_tx_packets >= 40 && deferred.client.tun_tx_packets >= 40);
    assert_eq!(
        format!("{:?}", (&inline.client, &inline.server)),
        format!("{:?}", (&deferred.client, &deferred.server))
    );
}

/// The committed corpus holds every generated seed, byte for byte (so a change of the wire format
/// or of the harness's input language shows up here and the seeds get regenerated).
#[test]
fn committed_seeds_are_current() {
    assert_seeds_current(
        seed_corpus()
            .into_iter()
            .chain(decompress_seeds())
            .chain(reassemble_seeds()),
    );
}

#[test]
#[ignore = "writes fuzz/corpus; run by hand after changing the wire format or the harness"]
fn write_seed_corpus() {
    write_seeds(
        seed_corpus()
            .into_iter()
            .chain(decompress_seeds())
            .chain(reassemble_seeds()),
    );
}

/// Inputs that look like braid traffic more often than uniform bytes would: a plausible header
/// (version 1, a known type) in front of random bytes half of the time.
fn datagram_like() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..300),
        (1u8..=6, proptest::collection::vec(any::<u8>(), 0..300)).prop_map(|(t, rest)| {
            let mut d = vec![1, t];
            d.extend(rest);
            d
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]
    #[test]
    fn parse_random(data in datagram_like()) {
        parse_any(&data);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]
    #[test]
    fn learn_random(data in proptest::collection::vec(any::<u8>(), 0..400)) {
        learn_addresses(&data);
    }
}

proptest! {
    // Each case builds and handshakes two endpoints: fewer cases, still thousands of operations.
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]
    #[test]
    fn receive_random(data in proptest::collection::vec(any::<u8>(), 0..400)) {
        receive_path(&data);
    }
}

#[test]
fn decompress_corpus() {
    replay("decompress", decompress_stream);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]
    #[test]
    fn decompress_random(data in proptest::collection::vec(any::<u8>(), 0..600)) {
        decompress_stream(&data);
    }
}

#[test]
fn reassemble_corpus() {
    replay("reassemble", reassemble_stream);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]
    #[test]
    fn reassemble_random(data in proptest::collection::vec(any::<u8>(), 0..600)) {
        reassemble_stream(&data);
    }
}
