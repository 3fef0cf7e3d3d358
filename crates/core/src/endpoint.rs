//! The bundle state machine: one endpoint of a braid tunnel.
//!
//! Grammar (as quinn-proto): `handle_*` feeds events in, `poll_*` takes work out, every call carries
//! `now`. The caller owns sockets, the TUN device and the clock:
//! - a datagram arrived on a link socket: [`Endpoint::handle_datagram`];
//! - an IP packet was read from the TUN device: [`Endpoint::send_packet`];
//! - then drain [`Endpoint::poll_transmit`] (datagrams to send), [`Endpoint::poll_deliver`]
//!   (IP packets for the TUN device) and [`Endpoint::poll_event`];
//! - sleep until [`Endpoint::poll_timeout`], then call [`Endpoint::handle_timeout`].

//!
//! Session set-up: the client sends HELLO (sealed under a key derived from the pre-shared key) on
//! every link until a HELLO-ACK comes back; both sides then derive one key per direction from the
//! PSK and both random salts. The server keeps its previous session until the first packet
//! authenticated under the new keys arrives, so a replayed HELLO cannot disturb a working
//! session, and a restarted client simply gets a new one. A client that has heard nothing
//! authenticated for [`Config::rehandshake_after`] starts a new handshake (how a restarted server
//! is re-joined) while still sending under the old keys.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::crypto::{self, Aead, SessionKeys};
use crate::health::{HealthConfig, LinkHealth, LinkState};
use crate::reorder::{Arrival, ReorderBuffer, ReorderConfig};
use crate::replay::ReplayWindow;
use crate::sched::{LinkView, Scheduler};
use crate::wire::{
    Body, CipherId, Common, DataRepr, Header, HelloRepr, PacketType, ProbeAckRepr, ProbeRepr,
    FLAG_UNORDERED,
};
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
    /// Client: start a new handshake after hearing nothing authenticated for this long.
    pub rehandshake_after: Duration,
    /// Server: forget a learned link that has been silent for this long.
    pub forget_link_after: Duration,
    /// Delay equalisation: hold each received packet that [`equalized`] names (every TCP
    /// segment but a pure ACK, other packets of [`EQUALIZE_MIN_LEN`] bytes or more) until the slowest live link's base one-way delay has passed since it was sent,
    /// adding at most this much (`ZERO`: off). The inner
    /// TCP then sees one steady RTT whatever links the scheduler uses (see [`Endpoint`]'s
    /// receive path).
    pub equalize_max: Duration,
}

impl Config {
    /// A configuration with the defaults: ChaCha20-Poly1305, `adaptive`, 100 ms probes.
    pub fn new(role: Role, psk: [u8; 32]) -> Self {
        Config {
            role,
            psk,
            cipher: CipherId::ChaCha20Poly1305,
            scheduler: "adaptive".to_string(),
            health: HealthConfig::default(),
            reorder: ReorderConfig::default(),
            hello_interval: Duration::from_millis(250),
            rehandshake_after: Duration::from_secs(2),
            forget_link_after: Duration::from_secs(120),
            equalize_max: DEFAULT_EQUALIZE_MAX,
        }
    }
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
    SessionUp {
        session: u32,
    },
    /// The peer said goodbye (CLOSE), or the session was replaced.
    SessionClosed,
    LinkState {
        link: LinkId,
        state: LinkState,
    },
    /// Server: a link appeared, or moved to a new address (NAT rebinding).
    LinkLearned {
        link: LinkId,
        addr: SocketAddr,
    },
}

/// What [`Endpoint::handle_datagram`] made of a datagram, for the I/O layer: which link, if any,
/// it authenticated as. Only such datagrams may teach the I/O layer anything about the peer
/// (e.g. which local address a wildcard listener answers that link from): anyone can send a
/// datagram from any address, only the peer can make one authenticate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// Dropped (malformed, not authenticated, replayed, unknown session...): learn nothing.
    Ignored,
    /// A HELLO that opened under the handshake key for this link. It may be a replay, so it
    /// teaches only where to send its own HELLO-ACK (its source), nothing lasting.
    Hello(LinkId),
    /// A fresh, authenticated packet of a session on this link: the link's peer is at its source.
    Link(LinkId),
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
    /// IP packets from the TUN device dropped because every link's queue was full (offered load
    /// above the bundle's capacity).
    pub queue_full: u64,
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
    /// The rate the scheduler currently assumes for this link (learned by `adaptive`).
    pub sched_rate_bps: Option<f64>,
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
    /// Delay equalisation: how long bulk-size packets from the fastest live link are held now
    /// (the spread of the live links' base one-way delays, within `equalize_max`); 0 when off.
    pub equalize_us: u64,
    pub drops: DropStats,
}

/// Outer IPv4 (20) + UDP (8) headers: counted in per-link byte rates so that they measure what
/// the uplink carries.
pub const IP_UDP_OVERHEAD: usize = 28;
/// Bytes on the wire per tunnelled packet beyond the packet itself.
pub const WIRE_OVERHEAD: usize = IP_UDP_OVERHEAD + crate::wire::DATA_OVERHEAD;

/// How often rates, the reorder timeout and link expiry are refreshed.
const TICK: Duration = Duration::from_millis(100);
/// Extra hold time on top of the measured delay spread, for jitter.
const REORDER_MARGIN: Duration = Duration::from_millis(3);
/// Packets shorter than this are not held for delay equalisation: pure TCP acks, DNS, keystrokes
/// and game updates keep the lowest latency the links give, while bulk-size packets get a delay
/// that does not depend on which link carried them. For a bulk TCP flow that makes the RTT the
/// slowest link's one-way delay plus the fastest's (acks take the fastest link), steady from
/// the first packet to the last.
pub const EQUALIZE_MIN_LEN: usize = 256;

/// Whether delay equalisation holds this inner packet: every TCP segment but a pure ACK (see
/// [`crate::inner::is_pure_tcp_ack`]), and other packets of [`EQUALIZE_MIN_LEN`] bytes or more.
pub fn equalized(packet: &[u8]) -> bool {
    if crate::inner::is_tcp(packet) {
        !crate::inner::is_pure_tcp_ack(packet)
    } else {
        packet.len() >= EQUALIZE_MIN_LEN
    }
}
/// Default bound of delay equalisation ([`Config::equalize_max`]).
pub const DEFAULT_EQUALIZE_MAX: Duration = Duration::from_millis(100);

struct Session {
    /// The id the peer puts in packets for us.
    local_id: u32,
    /// The id we put in packets for the peer.
    remote_id: u32,
    keys: SessionKeys,
    send_counter: u64,
    replay: ReplayWindow,
    /// Server: the client's HELLO that made this session (answered again if repeated).
    client_salt: [u8; 32],
    /// Server: our HELLO-ACK body, kept to answer repeated HELLOs identically.
    ack: Option<HelloRepr>,
}

/// Client: a handshake in progress.
struct Hello {
    local_id: u32,
    salt: [u8; 32],
}

/// Smoothed byte-rate meter, updated once per tick.
#[derive(Default, Clone, Copy)]
struct Meter {
    last_bytes: u64,
    bps: f64,
}

impl Meter {
    fn tick(&mut self, bytes: u64, dt: Duration) {
        let secs = dt.as_secs_f64();
        if secs <= 0.0 {
            return;
        }
        let sample = (bytes.wrapping_sub(self.last_bytes)) as f64 * 8.0 / secs;
        self.last_bytes = bytes;
        // ~1 s time constant at a 100 ms tick.
        self.bps += (sample - self.bps) * 0.25;
    }
}

struct Link {
    id: LinkId,
    cfg: LinkConfig,
    /// Server: where the client's packets for this link come from (replies go there).
    addr: Option<SocketAddr>,
    health: LinkHealth,
    tx_seq: u32,
    next_probe_id: u32,
    tx_packets: u64,
    tx_bytes: u64,
    rx_packets: u64,
    rx_bytes: u64,
    tx_meter: Meter,
    rx_meter: Meter,
    /// Last time a DATA packet arrived on this link.
    last_data_rx: Option<Instant>,
    last_rx: Option<Instant>,
}

pub struct Endpoint {
    cfg: Config,
    epoch: Instant,
    rng: Box<dyn rand_core::RngCore + Send>,
    hs_key: Aead,
    sched: Box<dyn Scheduler>,
    links: Vec<Link>,
    session: Option<Session>,
    /// Server: a session set up by a HELLO but not yet confirmed by the client.
    pending: Option<Session>,
    /// Client: handshake in progress.
    hello: Option<Hello>,
    next_hello: Option<Instant>,
    last_auth_rx: Option<Instant>,
    next_tick: Instant,
    last_tick: Instant,
    reorder: ReorderBuffer,
    /// Delay equalisation target: the relative one-way delay (`local_ts - send_ts`, wrapping
    /// microseconds) a DATA packet is held until, when equalisation is on and measured.
    equalize_rel: Option<u32>,
    /// What the target adds to the fastest live link's base delay (for `stats`).
    equalize_add: Duration,
    next_data_seq: u64,
    transmits: VecDeque<Transmit>,
    direct: VecDeque<Vec<u8>>,
    events: VecDeque<Event>,
    pool: Vec<Vec<u8>>,
    views: Vec<LinkView>,
    picks: Vec<LinkId>,
    tun_rx_packets: u64,
    tun_rx_bytes: u64,
    tun_tx_packets: u64,
    tun_tx_bytes: u64,
    drops: DropStats,
    /// What the datagram being handled authenticated as (returned by `handle_datagram`).
    received: Received,
}

const POOL_MAX: usize = 4096;
const BUF_CAPACITY: usize = 2048;

impl Endpoint {
    /// `rng` supplies session ids and salts (OS randomness in the daemon, seeded in the simulator).
    pub fn new(
        config: Config,
        now: Instant,
        rng: Box<dyn rand_core::RngCore + Send>,
    ) -> Result<Self, EndpointError> {
        let mut sched = crate::sched::by_name(&config.scheduler)?;
        // Both ends run braid's default equalisation unless told otherwise; the peer's own
        // setting is not on the wire, so ours stands for it.
        sched.set_equalization(config.equalize_max, EQUALIZE_MIN_LEN + WIRE_OVERHEAD);
        let hs_key = crypto::handshake_key(&config.psk, config.cipher);
        let reorder = ReorderBuffer::new(config.reorder.clone());
        let mut ep = Endpoint {
            epoch: now,
            rng,
            hs_key,
            sched,
            links: Vec::new(),
            session: None,
            pending: None,
            hello: None,
            next_hello: None,
            last_auth_rx: None,
            next_tick: now + TICK,
            last_tick: now,
            reorder,
            equalize_rel: None,
            equalize_add: Duration::ZERO,
            next_data_seq: 0,
            transmits: VecDeque::new(),
            direct: VecDeque::new(),
            events: VecDeque::new(),
            pool: Vec::new(),
            views: Vec::new(),
            picks: Vec::new(),
            tun_rx_packets: 0,
            tun_rx_bytes: 0,
            tun_tx_packets: 0,
            tun_tx_bytes: 0,
            drops: DropStats::default(),
            received: Received::Ignored,
            cfg: config,
        };
        if ep.cfg.role == Role::Client {
            ep.start_handshake(now);
        }
        Ok(ep)
    }

    /// Client: adds an uplink (it starts probing at once). Server: pre-declares nothing; links
    /// are learned from the client's packets, but `add_link` may name one in advance.
    pub fn add_link(
        &mut self,
        now: Instant,
        id: LinkId,
        cfg: LinkConfig,
    ) -> Result<(), EndpointError> {
        if self.link_index(id).is_some() {
            return Err(EndpointError::LinkExists(id));
        }
        self.links.push(Link {
            id,
            cfg,
            addr: None,
            health: LinkHealth::new(self.cfg.health.clone(), now),
            tx_seq: 0,
            next_probe_id: 0,
            tx_packets: 0,
            tx_bytes: 0,
            rx_packets: 0,
            rx_bytes: 0,
            tx_meter: Meter::default(),
            rx_meter: Meter::default(),
            last_data_rx: None,
            last_rx: None,
        });
        if self.cfg.role == Role::Client && self.hello.is_some() {
            // A new link during a handshake: say HELLO on it right away.
            self.next_hello = Some(now);
        }
        Ok(())
    }

    pub fn remove_link(&mut self, _now: Instant, id: LinkId) -> Result<(), EndpointError> {
        let i = self.link_index(id).ok_or(EndpointError::NoSuchLink(id))?;
        self.links.remove(i);
        Ok(())
    }

    pub fn set_link(
        &mut self,
        id: LinkId,
        bandwidth_bps: Option<Option<u64>>,
        priority: Option<u8>,
    ) -> Result<(), EndpointError> {
        let i = self.link_index(id).ok_or(EndpointError::NoSuchLink(id))?;
        if let Some(b) = bandwidth_bps {
            self.links[i].cfg.bandwidth_bps = b;
        }
        if let Some(p) = priority {
            self.links[i].cfg.priority = p;
        }
        Ok(())
    }

    /// The I/O layer could not send on `link` because the kernel says its network is gone
    /// (ENETDOWN, ENETUNREACH...): the link is DOWN now, without waiting for probes to go
    /// unanswered. Probing goes on, so it comes back by itself once its acks do.
    pub fn handle_link_error(&mut self, now: Instant, link: LinkId) {
        if let Some(i) = self.link_index(link) {
            if let Some(state) = self.links[i].health.force_down(now) {
                self.events.push_back(Event::LinkState { link, state });
            }
        }
    }

    pub fn link_ids(&self) -> Vec<LinkId> {
        self.links.iter().map(|l| l.id).collect()
    }

    /// True once a session with the peer is established.
    pub fn is_connected(&self) -> bool {
        self.session.is_some()
    }

    fn link_index(&self, id: LinkId) -> Option<usize> {
        self.links.iter().position(|l| l.id == id)
    }

    /// This endpoint's clock in the wire's units: microseconds since creation, wrapping.
    fn wire_ts(&self, now: Instant) -> u32 {
        now.saturating_duration_since(self.epoch).as_micros() as u32
    }

    fn take_buf(&mut self) -> Vec<u8> {
        let mut b = self
            .pool
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(BUF_CAPACITY));
        b.clear();
        b
    }

    /// Gives a buffer back for reuse (from `Transmit::payload` or `poll_deliver`).
    pub fn recycle(&mut self, buf: Vec<u8>) {
        if self.pool.len() < POOL_MAX && buf.capacity() >= BUF_CAPACITY {
            self.pool.push(buf);
        }
    }

    fn random_id(&mut self) -> u32 {
        loop {
            let id = self.rng.next_u32();
            if id != 0 {
                return id;
            }
        }
    }

    fn start_handshake(&mut self, now: Instant) {
        let local_id = self.random_id();
        let mut salt = [0u8; 32];
        self.rng.fill_bytes(&mut salt);
        self.hello = Some(Hello { local_id, salt });
        self.next_hello = Some(now);
    }

    fn send_hellos(&mut self, now: Instant) {
        let Some(hello) = self.hello.as_ref() else {
            return;
        };
        let repr = HelloRepr {
            session: hello.local_id,
            salt: hello.salt,
            cipher: self.cfg.cipher,
        };
        let ids: Vec<LinkId> = self.links.iter().map(|l| l.id).collect();
        for id in ids {
            let header = Header {
                ptype: PacketType::Hello,
                link: id,
                session: 0,
                counter: self.rng.next_u64(),
            };
            let mut out = self.take_buf();
            crypto::seal_hello(&self.hs_key, &header, &repr, &mut out);
            self.transmits.push_back(Transmit {
                link: id,
                dst: None,
                payload: out,
            });
        }
        self.next_hello = Some(now + self.cfg.hello_interval);
    }

    // ------------------------------------------------------------------ receive

    /// A datagram arrived. `via`: the client's link socket it came in on (`None` on the server's
    /// shared listening socket). `from`: its source address. Never panics, whatever the bytes.
    /// Returns which link, if any, the datagram authenticated as (see [`Received`]).
    pub fn handle_datagram(
        &mut self,
        now: Instant,
        via: Option<LinkId>,
        from: SocketAddr,
        datagram: &mut [u8],
    ) -> Received {
        self.received = Received::Ignored;
        let header = match Header::parse(datagram) {
            Ok(h) => h,
            Err(_) => {
                self.drops.malformed += 1;
                return Received::Ignored;
            }
        };
        if let Some(v) = via {
            if v != header.link {
                self.drops.wrong_link += 1;
                return Received::Ignored;
            }
        }
        match header.ptype {
            PacketType::Hello => self.handle_hello(&header, from, datagram),
            PacketType::HelloAck => self.handle_hello_ack(now, &header, datagram),
            _ => self.handle_sealed(now, &header, from, datagram),
        }
        self.received
    }

    /// Opens and checks a HELLO or HELLO-ACK (sealed under the handshake key), counting why
    /// it was dropped if it was.
    fn open_hello(&mut self, header: &Header, datagram: &mut [u8]) -> Option<HelloRepr> {
        let hello = match crypto::open(&self.hs_key, header, datagram) {
            Ok(pt) => HelloRepr::parse(pt).ok(),
            Err(crypto::CryptoError::Auth) => {
                self.drops.auth += 1;
                return None;
            }
            Err(_) => None,
        };
        match hello {
            Some(h) if h.cipher == self.cfg.cipher && h.session != 0 => Some(h),
            _ => {
                self.drops.malformed += 1;
                None
            }
        }
    }

    fn handle_hello(&mut self, header: &Header, from: SocketAddr, datagram: &mut [u8]) {
        if self.cfg.role != Role::Server || header.session != 0 {
            self.drops.malformed += 1;
            return;
        }
        let Some(hello) = self.open_hello(header, datagram) else {
            return;
        };
        // A repeated HELLO (sent on every link, or retransmitted) gets the same answer.
        let same = |s: &Session| s.remote_id == hello.session && s.client_salt == hello.salt;
        let ack = match (&self.pending, &self.session) {
            (Some(p), _) if same(p) => p.ack,
            (_, Some(s)) if same(s) => s.ack,
            _ => None,
        };
        let ack = match ack {
            Some(a) => a,
            None => {
                let local_id = self.random_id();
                let mut salt = [0u8; 32];
                self.rng.fill_bytes(&mut salt);
                let keys =
                    crypto::session_keys(&self.cfg.psk, self.cfg.cipher, &hello.salt, &salt, false);
                let ack = HelloRepr {
                    session: local_id,
                    salt,
                    cipher: self.cfg.cipher,
                };
                self.pending = Some(Session {
                    local_id,
                    remote_id: hello.session,
                    keys,
                    send_counter: 0,
                    replay: ReplayWindow::new(),
                    client_salt: hello.salt,
                    ack: Some(ack),
                });
                ack
            }
        };
        let reply = Header {
            ptype: PacketType::HelloAck,
            link: header.link,
            session: hello.session,
            counter: self.rng.next_u64(),
        };
        let mut out = self.take_buf();
        crypto::seal_hello(&self.hs_key, &reply, &ack, &mut out);
        self.received = Received::Hello(header.link);
        self.transmits.push_back(Transmit {
            link: header.link,
            dst: Some(from),
            payload: out,
        });
    }

    fn handle_hello_ack(&mut self, now: Instant, header: &Header, datagram: &mut [u8]) {
        if self.cfg.role != Role::Client {
            self.drops.malformed += 1;
            return;
        }
        let Some((local_id, salt)) = self.hello.as_ref().map(|h| (h.local_id, h.salt)) else {
            // Late duplicate of an ack we already used.
            self.drops.unknown_session += 1;
            return;
        };
        if header.session != local_id {
            self.drops.unknown_session += 1;
            return;
        }
        let Some(ack) = self.open_hello(header, datagram) else {
            return;
        };
        let keys = crypto::session_keys(&self.cfg.psk, self.cfg.cipher, &salt, &ack.salt, true);
        let session = Session {
            local_id,
            remote_id: ack.session,
            keys,
            send_counter: 0,
            replay: ReplayWindow::new(),
            client_salt: salt,
            ack: None,
        };
        self.hello = None;
        self.next_hello = None;
        self.install_session(now, session);
        // Confirm at once on every link (the server switches on the first authenticated packet).
        let ids: Vec<LinkId> = self.links.iter().map(|l| l.id).collect();
        for id in ids {
            self.send_probe(now, id);
        }
    }

    fn install_session(&mut self, now: Instant, session: Session) {
        let id = session.local_id;
        if self.session.is_some() {
            self.events.push_back(Event::SessionClosed);
        }
        self.session = Some(session);
        self.last_auth_rx = Some(now);
        // A new session may be a new peer process: what each link learned of the old one
        // (its link sequence numbers, clock, delivery feedback) would make the peer's fresh
        // counters look like total loss and stall its sending window. Measure afresh.
        for link in &mut self.links {
            link.health = LinkHealth::new(self.cfg.health.clone(), now);
            link.tx_seq = 0;
        }
        self.next_data_seq = 0;
        self.reorder.reset(0);
        self.direct.clear();
        self.events.push_back(Event::SessionUp { session: id });
    }

    fn handle_sealed(
        &mut self,
        now: Instant,
        header: &Header,
        from: SocketAddr,
        datagram: &mut [u8],
    ) {
        // Which session is it for? The current one, or (server) the one a HELLO just set up.
        let is_pending = match (&self.session, &self.pending) {
            (Some(s), _) if s.local_id == header.session => false,
            (_, Some(p)) if p.local_id == header.session => true,
            _ => {
                self.drops.unknown_session += 1;
                return;
            }
        };
        let Some(session) = (if is_pending {
            self.pending.as_mut()
        } else {
            self.session.as_mut()
        }) else {
            return;
        };
        if !session.replay.check(header.counter) {
            self.drops.replay += 1;
            return;
        }
        let len = datagram.len();
        let plaintext = match crypto::open(&session.keys.recv, header, datagram) {
            Ok(pt) => pt,
            Err(crypto::CryptoError::Auth) => {
                self.drops.auth += 1;
                return;
            }
            Err(_) => {
                self.drops.malformed += 1;
                return;
            }
        };
        let body = match Body::parse(header.ptype, plaintext) {
            Ok(b) => b,
            Err(_) => {
                self.drops.malformed += 1;
                return;
            }
        };
        if !session.replay.update(header.counter) {
            self.drops.replay += 1;
            return;
        }
        if is_pending {
            // The client has the new keys: switch to the new session.
            if let Some(p) = self.pending.take() {
                self.install_session(now, p);
            }
        }
        self.last_auth_rx = Some(now);

        // The link: known, or (server) learned now from an authenticated, fresh packet.
        let li = match self.link_index(header.link) {
            Some(i) => i,
            None => {
                if self.cfg.role == Role::Client {
                    self.drops.wrong_link += 1;
                    return;
                }
                let cfg = LinkConfig {
                    name: format!("link{}", header.link),
                    ..Default::default()
                };
                if self.add_link(now, header.link, cfg).is_err() {
                    return;
                }
                self.links.len() - 1
            }
        };
        self.received = Received::Link(header.link);
        if self.cfg.role == Role::Server && self.links[li].addr != Some(from) {
            self.links[li].addr = Some(from);
            self.events.push_back(Event::LinkLearned {
                link: header.link,
                addr: from,
            });
        }
        let local_ts = self.wire_ts(now);
        let link = &mut self.links[li];
        link.rx_packets += 1;
        link.rx_bytes += len as u64;
        link.last_rx = Some(now);
        let common = match &body {
            Body::Data(d) => d.common,
            Body::Probe(p) => p.common,
            Body::ProbeAck(a) => a.common,
            Body::Close(c) => *c,
        };
        link.health
            .on_packet_received(now, &common, len + IP_UDP_OVERHEAD, local_ts);
        // What arrived on this link, sent when (reorder rule (b)); ordered DATA tells the
        // reorder buffer itself when it is pushed.
        let ordered_data = matches!(&body, Body::Data(d) if d.flags & FLAG_UNORDERED == 0);
        if !ordered_data {
            self.reorder.link_progress(now, header.link, common.ts);
        }

        match body {
            Body::Data(d) => {
                link.last_data_rx = Some(now);
                let mut buf = self.take_buf();
                buf.extend_from_slice(d.payload);
                if d.flags & FLAG_UNORDERED != 0 {
                    self.direct.push_back(buf);
                } else {
                    // Equalised delivery: hold until `send_ts + target` in our clock.
                    let release = match self.equalize_rel {
                        Some(target) if equalized(d.payload) => {
                            let rel = local_ts.wrapping_sub(d.common.ts);
                            let early = target.wrapping_sub(rel) as i32;
                            let early = Duration::from_micros(early.max(0) as u64);
                            now + early.min(self.cfg.equalize_max)
                        }
                        _ => now,
                    };
                    let arrival = Arrival {
                        seq: d.seq,
                        link: header.link,
                        ts: Some(d.common.ts),
                        release,
                    };
                    let _ = self.reorder.push_arrival(now, arrival, buf);
                }
            }
            Body::Probe(p) => self.send_probe_ack(now, li, &p),
            Body::ProbeAck(a) => {
                if let Some(state) = self.links[li].health.on_probe_ack(now, &a) {
                    self.events.push_back(Event::LinkState {
                        link: header.link,
                        state,
                    });
                }
            }
            Body::Close(_) => {
                self.session = None;
                self.pending = None;
                self.events.push_back(Event::SessionClosed);
                if self.cfg.role == Role::Client {
                    self.start_handshake(now);
                }
            }
        }
    }

    // ------------------------------------------------------------------ send

    /// Seals `body` for link index `li` under the current session and queues it.
    fn queue_sealed(&mut self, li: usize, ptype: PacketType, body: &Body<'_>) -> bool {
        let Some(session) = self.session.as_mut() else {
            return false;
        };
        let link = &self.links[li];
        let header = Header {
            ptype,
            link: link.id,
            session: session.remote_id,
            counter: session.send_counter,
        };
        session.send_counter += 1;
        let mut out = self
            .pool
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(BUF_CAPACITY));
        out.clear();
        crypto::seal(&session.keys.send, &header, body, &mut out);
        let link = &mut self.links[li];
        if self.cfg.role == Role::Server && link.addr.is_none() {
            self.recycle(out);
            return false;
        }
        link.tx_packets += 1;
        link.tx_bytes += out.len() as u64;
        self.transmits.push_back(Transmit {
            link: link.id,
            dst: link.addr,
            payload: out,
        });
        true
    }

    fn next_common(&mut self, now: Instant, li: usize) -> Common {
        let ts = self.wire_ts(now);
        let link = &mut self.links[li];
        let c = Common {
            link_seq: link.tx_seq,
            ts,
        };
        link.tx_seq = link.tx_seq.wrapping_add(1);
        c
    }

    fn send_probe(&mut self, now: Instant, id: LinkId) {
        let Some(li) = self.link_index(id) else {
            return;
        };
        if self.session.is_none() {
            return;
        }
        let common = self.next_common(now, li);
        let probe_id = self.links[li].next_probe_id;
        self.links[li].next_probe_id = probe_id.wrapping_add(1);
        let body = Body::Probe(ProbeRepr {
            common,
            probe_id,
            padding: 0,
        });
        if self.queue_sealed(li, PacketType::Probe, &body) {
            let len = self.transmits.back().map_or(0, |t| t.payload.len());
            let link = &mut self.links[li];
            link.health.on_probe_sent(now, probe_id);
            link.health.on_packet_sent(now, common.link_seq, len);
        }
    }

    fn send_probe_ack(&mut self, now: Instant, li: usize, probe: &ProbeRepr) {
        let common = self.next_common(now, li);
        let mut ack = ProbeAckRepr {
            common,
            probe_id: probe.probe_id,
            echo_ts: probe.common.ts,
            hold_us: 0,
            ..Default::default()
        };
        self.links[li].health.fill_report(now, &mut ack);
        ack.owd_offset_us = self.owd_offset_us(li);
        if self.queue_sealed(li, PacketType::ProbeAck, &Body::ProbeAck(ack)) {
            let len = self.transmits.back().map_or(0, |t| t.payload.len());
            self.links[li]
                .health
                .on_packet_sent(now, common.link_seq, len);
        }
    }

    /// How much later than our fastest incoming link this link's packets arrive (base delays).
    fn owd_offset_us(&self, li: usize) -> i32 {
        let Some(mine) = self.links[li].health.base_rel_owd() else {
            return 0;
        };
        let mut best = 0i32;
        for l in &self.links {
            if let Some(o) = l.health.base_rel_owd() {
                best = best.min(o.wrapping_sub(mine) as i32);
            }
        }
        // best <= 0 is (fastest - mine); the offset is mine - fastest.
        best.saturating_neg()
    }

    /// Flow identity of an IP packet (addresses, protocol, ports), for `flow-hash`.
    fn flow_hash(packet: &[u8]) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut mix = |bytes: &[u8]| {
            for &b in bytes {
                h ^= b as u64;
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        };
        match packet.first().map(|b| b >> 4) {
            Some(4) if packet.len() >= 20 => {
                let ihl = ((packet[0] & 0x0f) as usize) * 4;
                let proto = packet[9];
                mix(&packet[12..20]);
                mix(&[proto]);
                let frag = u16::from_be_bytes([packet[6], packet[7]]) & 0x1fff;
                if (proto == 6 || proto == 17) && frag == 0 {
                    if let Some(ports) = packet.get(ihl..ihl + 4) {
                        mix(ports);
                    }
                }
            }
            Some(6) if packet.len() >= 40 => {
                let nh = packet[6];
                mix(&packet[8..40]);
                mix(&[nh]);
                if nh == 6 || nh == 17 {
                    if let Some(ports) = packet.get(40..44) {
                        mix(ports);
                    }
                }
            }
            _ => mix(packet.get(..packet.len().min(20)).unwrap_or(&[])),
        }
        h
    }

    fn link_view(&self, l: &Link, min_rtt_all: Option<Duration>) -> LinkView {
        let base = min_rtt_all.map_or(Duration::ZERO, |r| r / 2);
        LinkView {
            id: l.id,
            state: l.health.state(),
            priority: l.cfg.priority,
            bandwidth_bps: l.cfg.bandwidth_bps,
            delivery_rate_bps: l.health.delivery_rate_bps(),
            srtt: l.health.srtt(),
            owd: base + l.health.owd_offset(),
            qdelay: l.health.qdelay(),
            loss: l.health.loss(),
        }
    }

    /// An IP packet from the TUN device, to be carried to the peer.
    pub fn send_packet(&mut self, now: Instant, packet: &[u8]) {
        if self.session.is_none() || self.links.is_empty() {
            self.drops.no_session += 1;
            return;
        }
        self.tun_rx_packets += 1;
        self.tun_rx_bytes += packet.len() as u64;
        let min_rtt_all = self.links.iter().filter_map(|l| l.health.min_rtt()).min();
        let mut views = std::mem::take(&mut self.views);
        views.clear();
        for l in &self.links {
            if l.health.state() != LinkState::Down {
                views.push(self.link_view(l, min_rtt_all));
            }
        }
        if views.is_empty() {
            for l in &self.links {
                views.push(self.link_view(l, min_rtt_all));
            }
        }
        let mut picks = std::mem::take(&mut self.picks);
        picks.clear();
        let flow = Self::flow_hash(packet);
        // Schedulers account what the packet costs on the wire (outer IPv4/UDP headers included),
        // the unit in which the peer reports delivery rates.
        self.sched
            .pick(now, packet.len() + WIRE_OVERHEAD, flow, &views, &mut picks);
        if picks.is_empty() {
            // The scheduler dropped it: every link's queue is full.
            self.drops.queue_full += 1;
            self.views = views;
            self.picks = picks;
            return;
        }
        let seq = self.next_data_seq;
        self.next_data_seq += 1;
        let flags = if self.sched.ordered() {
            0
        } else {
            FLAG_UNORDERED
        };
        for &id in &picks {
            let Some(li) = self.link_index(id) else {
                continue;
            };
            let common = self.next_common(now, li);
            let body = Body::Data(DataRepr {
                common,
                seq,
                flags,
                payload: packet,
            });
            if self.queue_sealed(li, PacketType::Data, &body) {
                let len = self.transmits.back().map_or(0, |t| t.payload.len());
                self.links[li]
                    .health
                    .on_packet_sent(now, common.link_seq, len);
            }
        }
        self.views = views;
        self.picks = picks;
    }

    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// Next IP packet for the TUN device, in order.
    pub fn poll_deliver(&mut self, now: Instant) -> Option<Vec<u8>> {
        let p = match self.direct.pop_front() {
            Some(p) => Some(p),
            None => self.reorder.pop(now),
        };
        if let Some(p) = &p {
            self.tun_tx_packets += 1;
            self.tun_tx_bytes += p.len() as u64;
        }
        p
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut t = self.next_tick;
        if let Some(h) = self.next_hello {
            t = t.min(h);
        }
        if self.session.is_some() {
            for l in &self.links {
                t = t.min(l.health.poll_timeout());
            }
        }
        if let Some(r) = self.reorder.poll_timeout() {
            t = t.min(r);
        }
        Some(t)
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        if self.cfg.role == Role::Client {
            if self.hello.is_none() {
                let silent = self
                    .last_auth_rx
                    .is_none_or(|t| now.saturating_duration_since(t) >= self.cfg.rehandshake_after);
                if self.session.is_some() && silent {
                    self.start_handshake(now);
                }
            }
            if self.next_hello.is_some_and(|t| now >= t) {
                self.send_hellos(now);
            }
        }
        if self.session.is_some() {
            for li in 0..self.links.len() {
                if let Some(state) = self.links[li].health.handle_timeout(now) {
                    self.events.push_back(Event::LinkState {
                        link: self.links[li].id,
                        state,
                    });
                }
                if now >= self.links[li].health.next_probe_at() {
                    let id = self.links[li].id;
                    self.send_probe(now, id);
                }
            }
        }
        if now >= self.next_tick {
            self.tick(now);
        }
    }

    /// Housekeeping every [`TICK`]: rate meters, the reorder hold time, stale links.
    fn tick(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last_tick);
        self.last_tick = now;
        self.next_tick = now + TICK;
        for l in &mut self.links {
            l.tx_meter.tick(l.tx_bytes, dt);
            l.rx_meter.tick(l.rx_bytes, dt);
        }
        // Hold time: the spread of the current one-way delays (queueing included) over every
        // link that is alive towards us (anything arrived lately), plus their jitter. A link that
        // carries data only now and then must be counted: leaving it out makes its packets late
        // (dropped), which the inner TCP takes for loss, so it never offers enough to use it.
        // The same links define "every link has passed this gap" (a link that carries no data
        // never passes one, so such gaps wait for the hold time).
        let alive = |t: Option<Instant>| {
            t.is_some_and(|t| now.saturating_duration_since(t) < Duration::from_secs(1))
        };
        let mut active: Vec<LinkId> = Vec::new();
        let mut owds: Vec<u32> = Vec::new();
        let mut bases: Vec<u32> = Vec::new();
        let mut jitter = Duration::ZERO;
        for l in &self.links {
            // Counted by what arrives from it, whatever our own health check says: a link we
            // declare DOWN (our probes go unanswered) may still carry the peer's packets.
            if alive(l.last_rx) {
                active.push(l.id);
                bases.extend(l.health.base_rel_owd());
                // Current one-way delay (base + queueing), as this receiver measures it: packets
                // wait for the slowest link's *current* delay, queue included.
                if let Some(o) = l.health.base_rel_owd() {
                    owds.push(o.wrapping_add(l.health.rx_qdelay().as_micros() as u32));
                }
                if let Some(v) = l.health.rttvar() {
                    jitter = jitter.max(v);
                }
            }
        }
        let spread_us = match owds.first() {
            Some(&first) => {
                let rel: Vec<i64> = owds
                    .iter()
                    .map(|&o| o.wrapping_sub(first) as i32 as i64)
                    .collect();
                let lo = rel.iter().copied().min().unwrap_or(0);
                let hi = rel.iter().copied().max().unwrap_or(0);
                (hi - lo).max(0) as u64
            }
            None => 0,
        };
        self.reorder.set_links(&active);
        (self.equalize_rel, self.equalize_add) = match self.equalize_target(&bases) {
            Some((target, add)) => (Some(target), add),
            None => (None, Duration::ZERO),
        };
        self.reorder
            .set_timeout(Duration::from_micros(spread_us) + 2 * jitter + REORDER_MARGIN);
        if self.cfg.role == Role::Server {
            let forget = self.cfg.forget_link_after;
            self.links.retain(|l| {
                l.last_rx
                    .is_none_or(|t| now.saturating_duration_since(t) < forget)
            });
        }
    }

    /// The equalisation target from the live links' base relative one-way delays: the largest,
    /// but no more than `equalize_max` above the smallest (a link slower than that is not
    /// waited for: its packets arrive late and wait in the reorder buffer as usual).
    /// Also returns how much the target adds to the smallest.
    fn equalize_target(&self, bases: &[u32]) -> Option<(u32, Duration)> {
        let max_add = self.cfg.equalize_max.as_micros().min(i32::MAX as u128) as i64;
        let &first = bases.first()?;
        if max_add == 0 || bases.len() < 2 {
            return None;
        }
        let rel: Vec<i64> = bases
            .iter()
            .map(|&o| o.wrapping_sub(first) as i32 as i64)
            .collect();
        let lo = rel.iter().copied().min().unwrap_or(0);
        let hi = rel
            .iter()
            .copied()
            .filter(|&r| r - lo <= max_add)
            .max()
            .unwrap_or(lo);
        Some((
            first.wrapping_add(hi as u32),
            Duration::from_micros((hi - lo) as u64),
        ))
    }

    /// Says goodbye (CLOSE on every link); drain `poll_transmit` afterwards.
    pub fn close(&mut self, now: Instant) {
        if self.session.is_some() {
            for li in 0..self.links.len() {
                let common = self.next_common(now, li);
                self.queue_sealed(li, PacketType::Close, &Body::Close(common));
            }
        }
        self.session = None;
        self.pending = None;
        self.hello = None;
        self.next_hello = None;
    }

    pub fn stats(&self, now: Instant) -> BundleStats {
        let _ = now;
        let us = |d: Option<Duration>| d.map(|d| d.as_micros() as u64);
        BundleStats {
            role: self.cfg.role,
            scheduler: self.cfg.scheduler.clone(),
            session: self.session.as_ref().map(|s| s.local_id),
            links: self
                .links
                .iter()
                .map(|l| LinkStats {
                    id: l.id,
                    name: l.cfg.name.clone(),
                    state: l.health.state(),
                    addr: l.addr,
                    bandwidth_bps: l.cfg.bandwidth_bps,
                    priority: l.cfg.priority,
                    srtt_us: us(l.health.srtt()),
                    rttvar_us: us(l.health.rttvar()),
                    min_rtt_us: us(l.health.min_rtt()),
                    loss: l.health.loss(),
                    delivery_rate_bps: l.health.delivery_rate_bps(),
                    sched_rate_bps: self.sched.link_rate_bps(l.id),
                    qdelay_us: l.health.qdelay().as_micros() as u64,
                    tx_packets: l.tx_packets,
                    tx_bytes: l.tx_bytes,
                    rx_packets: l.rx_packets,
                    rx_bytes: l.rx_bytes,
                    tx_rate_bps: l.tx_meter.bps,
                    rx_rate_bps: l.rx_meter.bps,
                })
                .collect(),
            tun_rx_packets: self.tun_rx_packets,
            tun_rx_bytes: self.tun_rx_bytes,
            tun_tx_packets: self.tun_tx_packets,
            tun_tx_bytes: self.tun_tx_bytes,
            reorder: self.reorder.stats().clone(),
            reorder_depth: self.reorder.depth(),
            reorder_timeout_us: self.reorder.timeout().as_micros() as u64,
            equalize_us: self.equalize_add.as_micros() as u64,
            drops: self.drops.clone(),
        }
    }

    /// Forgets the reorder buffer's wait times so far (the simulator's warm-up ends).
    pub fn clear_reorder_waits(&mut self) {
        self.reorder.clear_waits();
    }

    /// The reorder buffer's wait-time percentile (for the simulator's reports).
    pub fn reorder_wait_percentile(&self, p: f64) -> Duration {
        self.reorder.wait_percentile(p)
    }
}
