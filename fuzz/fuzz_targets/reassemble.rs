//! The fragment reassembler over arbitrary pieces. See `braid_core::fuzzing::reassemble_stream`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    braid_core::fuzzing::reassemble_stream(data);
});
