//! Every wire parser over arbitrary bytes: header, HELLO, each session body; whatever parses must
//! re-emit to the same bytes. See `braid_core::fuzzing::parse_any`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    braid_core::fuzzing::parse_any(data);
});
