//! The health checker's HTTP status-line parser. See `braid_lb::fuzzing::health_http`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    braid_lb::fuzzing::health_http(data);
});
