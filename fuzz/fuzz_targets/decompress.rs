//! The inner header decompressor over a stream of encoded packets. See
//! `braid_core::fuzzing::decompress_stream`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    braid_core::fuzzing::decompress_stream(data);
});
