//! braid-linux: the only place braid talks to the kernel for the tunnel.
//!
//! - [`tun`]: the TUN device (batch read/write of IP packets);
//! - [`udp`]: link sockets with `recvmmsg`/`sendmmsg` batches, `SO_BINDTODEVICE`, big buffers;
//! - [`offload`]: TUN offload packet logic: TSO super-packets split, segments coalesced (GRO);
//! - [`netlink`]: interface address/MTU/up/delete through rtnetlink, and a [`netlink::Monitor`] of
//!   link and address changes;
//! - [`control`]: the control socket (server and client, one JSON object per line);
//! - [`fuzzing`]: the body of the metrics HTTP fuzz target (shared by `fuzz/` and the tests);
//! - [`metrics`]: a tiny HTTP server for Prometheus text on `GET /metrics`, and `braid_build_info`;
//! - [`serve`]: bounded concurrent serving of short connections (cap, request deadline, accept
//!   back-off) for the two above;
//! - [`service`]: readiness and shutdown notices to systemd (`Type=notify` units);
//! - [`sysctl`]: `/proc/sys` keys, also inside a named network namespace;
//! - [`timer`]: the thread's timer slack (precise short waits for batching).
pub mod control;
pub mod fuzzing;
pub mod metrics;
pub mod netlink;
pub mod offload;
pub mod serve;
pub mod service;
pub mod sysctl;
pub mod timer;
pub mod tun;
pub mod udp;
