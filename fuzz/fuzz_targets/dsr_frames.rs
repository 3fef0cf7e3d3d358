//! DSR frames up to 9 KB through a balancer with three backends, with time steps and health
//! changes; forwards change only MACs, connection counts match the flow table. See
//! `braid_lb::fuzzing::dsr_frames`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    braid_lb::fuzzing::dsr_frames(data);
});
