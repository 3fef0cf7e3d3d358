//! The bundle state machine: one endpoint of a braid tunnel. (Skeleton: signatures are the
//! contract; the body is being written.)
//!
//! Grammar (as quinn-proto): `handle_*` feeds events in, `poll_*` takes work out, every call carries
//! `now`. The caller owns sockets, the TUN device and the clock:
//! - a datagram arrived on a link socket: [`Endpoint::handle_datagram`];
//! - an IP packet was read from the TUN device: [`Endpoint::send_packet`];
//! - then drain [`Endpoint::poll_transmit`] (datagrams to send), [`Endpoint::poll_deliver`]
//!   (IP packets for the TUN device) and [`Endpoint::poll_event`];
//! - sleep until [`Endpoint::poll_timeout`], then call [`Endpoint::handle_timeout`].

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::health::{HealthConfig, LinkState};
use crate::reorder::ReorderConfig;
use crate::wire::CipherId;
use crate::LinkId;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Client,
    Server,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub role: Role,
    pub psk: [u8; 32],
    pub cipher: CipherId,
    /// Scheduler name (see [`crate::sched::NAMES`]).
    pub scheduler: String,
    pub health: HealthConfig,
    pub reorder: ReorderConfig,
    /// Client: resend HELLO this often until answered.
    pub hello_interval: Duration,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkConfig {
    pub name: String,
    /// Estimated bandwidth in bit/s (used by `weighted`, and as the first guess of `adaptive`).
    pub bandwidth_bps: Option<u64>,
    /// Used by `backup`: higher is preferred.
    pub priority: u8,
}

/// A datagram to send on `link`. Client: on that link's socket to its configured remote
/// (`dst` is `None`). Server: on the listening socket to `dst`.
#[derive(Debug)]
pub struct Transmit {
    pub link: LinkId,
    pub dst: Option<SocketAddr>,
    pub payload: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A session with the peer is established (first, or a new one after a peer restart).
    SessionUp { session: u32 },
    /// The peer said goodbye (CLOSE), or the session was replaced.
    SessionClosed,
    LinkState { link: LinkId, state: LinkState },
    /// Server: a link appeared, or moved to a new address (NAT rebinding).
    LinkLearned { link: LinkId, addr: SocketAddr },
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum EndpointError {
    #[error("link {0} already exists")]
    LinkExists(LinkId),
    #[error("no link {0}")]
    NoSuchLink(LinkId),
    #[error(transparent)]
    Scheduler(#[from] crate::sched::UnknownScheduler),
}

/// Why received datagrams were dropped.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct DropStats {
    /// Could not be parsed (bad version, type, length).
    pub malformed: u64,
    /// Failed authentication.
    pub auth: u64,
    /// Replayed, or too old for the anti-replay window.
    pub replay: u64,
    /// Addressed to a session this endpoint does not have.
    pub unknown_session: u64,
    /// Client: arrived on a socket whose link does not match the header.
    pub wrong_link: u64,
    /// IP packets from the TUN device dropped because no session is up.
    pub no_session: u64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct LinkStats {
    pub id: LinkId,
    pub name: String,
    pub state: LinkState,
    pub addr: Option<SocketAddr>,
    pub bandwidth_bps: Option<u64>,
    pub priority: u8,
    pub srtt_us: Option<u64>,
    pub rttvar_us: Option<u64>,
    pub min_rtt_us: Option<u64>,
    pub loss: f64,
    pub delivery_rate_bps: f64,
    pub qdelay_us: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    /// Recent send and receive rates on this link, bit/s.
    pub tx_rate_bps: f64,
    pub rx_rate_bps: f64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct BundleStats {
    pub role: Role,
    pub scheduler: String,
    pub session: Option<u32>,
    pub links: Vec<LinkStats>,
    /// IP packets taken from the TUN device / delivered to it.
    pub tun_rx_packets: u64,
    pub tun_rx_bytes: u64,
    pub tun_tx_packets: u64,
    pub tun_tx_bytes: u64,
    pub reorder: crate::reorder::ReorderStats,
    pub reorder_depth: usize,
    pub reorder_timeout_us: u64,
    pub drops: DropStats,
}

pub struct Endpoint {}

impl Endpoint {
    /// `rng` supplies session ids and salts (OS randomness in the daemon, seeded in the simulator).
    pub fn new(
        config: Config,
        now: Instant,
        rng: Box<dyn rand_core::RngCore + Send>,
    ) -> Result<Self, EndpointError> {
        todo!()
    }
    /// Client: adds an uplink (it starts probing at once). Server: pre-declares nothing; links
    /// are learned from the client's packets, but `add_link` may name one in advance.
    pub fn add_link(&mut self, now: Instant, id: LinkId, cfg: LinkConfig) -> Result<(), EndpointError> {
        todo!()
    }
    pub fn remove_link(&mut self, now: Instant, id: LinkId) -> Result<(), EndpointError> {
        todo!()
    }
    pub fn set_link(
        &mut self,
        id: LinkId,
        bandwidth_bps: Option<Option<u64>>,
        priority: Option<u8>,
    ) -> Result<(), EndpointError> {
        todo!()
    }
    /// A datagram arrived. `via`: the client's link socket it came in on (`None` on the server's
    /// shared listening socket). `from`: its source address. Never panics, whatever the bytes.
    pub fn handle_datagram(&mut self, now: Instant, via: Option<LinkId>, from: SocketAddr, datagram: &mut [u8]) {
        todo!()
    }
    /// An IP packet from the TUN device, to be carried to the peer.
    pub fn send_packet(&mut self, now: Instant, packet: &[u8]) {
        todo!()
    }
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        todo!()
    }
    /// Next IP packet for the TUN device, in order.
    pub fn poll_deliver(&mut self, now: Instant) -> Option<Vec<u8>> {
        todo!()
    }
    pub fn poll_event(&mut self) -> Option<Event> {
        todo!()
    }
    pub fn poll_timeout(&self) -> Option<Instant> {
        todo!()
    }
    pub fn handle_timeout(&mut self, now: Instant) {
        todo!()
    }
    /// Gives a buffer back for reuse (from `Transmit::payload` or `poll_deliver`).
    pub fn recycle(&mut self, buf: Vec<u8>) {
        todo!()
    }
    /// Says goodbye (CLOSE on every link); drain `poll_transmit` afterwards.
    pub fn close(&mut self, now: Instant) {
        todo!()
    }
    pub fn stats(&self, now: Instant) -> BundleStats {
        todo!()
    }
    pub fn link_ids(&self) -> Vec<LinkId> {
        todo!()
    }
}
