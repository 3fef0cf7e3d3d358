//! # braid-core: the bundle, with no I/O
//!
//! Everything braid needs to run a bundle of links, as pure logic: no sockets, no TUN, no clock.
//! Every input carries `now` (a [`std::time::Instant`] the caller supplies), so the same code runs
//! under the Linux daemon and under the deterministic simulator in [`sim`].
//!
//! Where things live:
//! - [`wire`]: every byte on the wire, as checked views and validated `Repr`s (see `docs/protocol.md`).
//! - [`compress`]: inner TCP/IP header compression, robust to reordering and loss.
//! - [`frag`]: inner packets cut to fit a link and put back together (Multilink PPP style).
//! - [`crypto`]: HKDF key schedule and AEAD sealing (ring), [`replay`]: the per-link anti-replay
//!   windows and nonce counters, [`ratelimit`]: the server's HELLO-ACK budget.
//! - [`health`]: per-link RTT (RFC 6298), loss, delivery rate, UP/DEGRADED/DOWN with hysteresis.
//! - [`inner`]: what the endpoint reads of the IP packets it carries (TCP ACK or not).
//! - [`pmtu`]: path MTU discovery per link (RFC 8899 probing; ICMP lowers, never raises).
//! - [`routes`]: a concentrator's prefix table (longest match: routing and source checks) and address pool.
//! - [`sched`]: the schedulers behind one trait, selectable by name.
//! - [`reorder`]: the receiver's reorder buffer (and which gaps to ask for again).
//! - [`arq`]: the sender's ring of sent packets for in-tunnel loss repair (NACK, reinjection).
//! - [`bqueue`]: the bundle's one queue under back-pressure (waiting time bounded).
//! - [`equalize`]: how fast delay equalisation may lengthen the inner round trip under traffic.
//! - [`endpoint`]: the bundle state machine that ties them together (`handle_*` in, `poll_*` out).
//! - [`netem`]: the link model (rate, drop-tail queue, delay, jitter, loss) of both the simulator
//!   and the lab's emulator.
//! - [`sim`]: a network simulator in virtual time that drives two endpoints against each other.
//!
//! Crate choices: `ring` for AEAD and HKDF (audited, constant-time, assembly fast paths for
//! ChaCha20-Poly1305 and AES-GCM); `rand_core` so callers inject randomness (OS randomness in the
//! daemon, a seeded ChaCha in the simulator: runs are reproducible).
#![deny(unsafe_code)]

pub mod arq;
pub mod bqueue;
pub mod compress;
pub mod concentrator;
pub mod crypto;
pub mod endpoint;
pub mod equalize;
pub mod frag;
pub mod fuzzing;
pub mod health;
pub mod identity;
pub mod inner;
pub mod linkspec;
pub mod netem;
pub mod pmtu;
pub mod ratelimit;
pub mod reorder;
pub mod replay;
pub mod routes;
pub mod rwnd;
pub mod sched;
pub mod sim;
pub mod wire;

/// Identifies a link inside a bundle. Chosen by the client for each of its uplinks and carried in
/// every packet's header; the server learns links by it.
pub type LinkId = u16;

pub use endpoint::{
    BatchJob, Config, Endpoint, Event, LinkConfig, OpenJob, Opening, Received, Role, Transmit,
};
pub use health::LinkState;
