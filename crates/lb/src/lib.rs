//! braid-lb: the load balancer's policy, with no I/O.
#![deny(unsafe_code)]
