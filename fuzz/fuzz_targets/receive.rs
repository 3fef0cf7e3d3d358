//! The receive path of a handshaken client/server `Endpoint` pair, driven by a small program
//! decoded from the input (raw and correctly sealed datagrams, replays, time, tunnel traffic),
//! run inline and through the deferred opening, which must agree. See
//! `braid_core::fuzzing::receive_path`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    braid_core::fuzzing::receive_path(data);
});
