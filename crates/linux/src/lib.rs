//! braid-linux: the only place braid talks to the kernel.
pub mod control;
