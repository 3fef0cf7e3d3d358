//! Control-socket request lines into a real balancer: one JSON reply line each. See
//! `braid_balance::fuzzing::control_json`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    braid_balance::fuzzing::control_json(data);
});
