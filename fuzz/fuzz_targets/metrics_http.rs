//! The metrics server's HTTP request handling: one well-formed reply for any request head.
//! See `braid_linux::fuzzing::metrics_http`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    braid_linux::fuzzing::metrics_http(data);
});
