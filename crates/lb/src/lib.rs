//! braid-lb: the load balancer's policy, with no I/O: backend tables and selection algorithms
//! (including Maglev), health state machines, the flow table, and DSR frame handling.
#![deny(unsafe_code)]

pub mod dsr;
