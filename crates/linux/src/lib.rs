//! braid-linux: the only place braid talks to the kernel (tunnel, balancer and lab).
//!
//! - [`tun`]: the TUN device (batch read/write of IP packets);
//! - [`udp`]: link sockets with `recvmmsg`/`sendmmsg` batches, `SO_BINDTODEVICE`, big buffers;
//! - [`offload`]: TUN offload packet logic: TSO super-packets split, segments coalesced (GRO);
//! - [`netlink`]: interface address/MTU/up/delete through rtnetlink, and a [`netlink::Monitor`] of
//!   link and address changes;
//! - [`ethtool`]: a device's offloads (`SIOCETHTOOL`), for the lab's veths;
//! - [`icmp`]: ICMP echo (ping) from a raw socket, for the lab;
//! - [`packet`]: `AF_PACKET` raw sockets in batches, for the DSR balancer and the lab's link
//!   emulator;
//! - [`process`]: open-files limit, timer precision of a thread, signals to children;
//! - [`control`]: the control socket (server and client, one JSON object per line);
//! - [`fuzzing`]: the body of the metrics HTTP fuzz target (shared by `fuzz/` and the tests);
//! - [`metrics`]: a tiny HTTP server for Prometheus text on `GET /metrics`, and `braid_build_info`;
//! - [`serve`]: bounded concurrent serving of short connections (cap, request deadline, accept
//!   back-off) for the two above;
//! - [`service`]: readiness and shutdown notices to systemd (`Type=notify` units);
//! - [`sysctl`]: `/proc/sys` keys, also inside a named network namespace, and [`sysctl::in_netns`]
//!   (work done, a socket opened, inside a named network namespace);
//! - [`tcp_info`]: what the kernel's TCP knows of a connection (round trip, window, BBR's
//!   state), for the lab's sender.
pub mod control;
pub mod ethtool;
pub mod fuzzing;
pub mod icmp;
pub mod metrics;
pub mod netlink;
pub mod offload;
pub mod packet;
pub mod process;
pub mod serve;
pub mod service;
pub mod sysctl;
pub mod tcp_info;
pub mod tun;
pub mod udp;
