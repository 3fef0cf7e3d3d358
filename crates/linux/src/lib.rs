//! braid-linux: the only place braid talks to the kernel for the tunnel.
//!
//! - [`tun`]: the TUN device (batch read/write of IP packets);
//! - [`udp`]: link sockets with `recvmmsg`/`sendmmsg` batches, `SO_BINDTODEVICE`, big buffers;
//! - [`netlink`]: interface address/MTU/up/delete through rtnetlink, and a [`netlink::Monitor`] of
//!   link and address changes;
//! - [`control`]: the control socket (server and client, one JSON object per line);
//! - [`metrics`]: a tiny HTTP server for Prometheus text on `GET /metrics`, and `braid_build_info`;
//! - [`service`]: readiness and shutdown notices to systemd (`Type=notify` units);
//! - [`sysctl`]: `/proc/sys` keys, also inside a named network namespace.
pub mod control;
pub mod metrics;
pub mod netlink;
pub mod service;
pub mod sysctl;
pub mod tun;
pub mod udp;
