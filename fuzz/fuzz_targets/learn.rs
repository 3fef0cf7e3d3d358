//! A server learning its client's links and their addresses (NAT rebinding) from sealed packets
//! on any link id, from many source addresses, amid garbage, tampered packets and replays,
//! checked against a model. See `braid_core::fuzzing::learn_addresses`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    braid_core::fuzzing::learn_addresses(data);
});
