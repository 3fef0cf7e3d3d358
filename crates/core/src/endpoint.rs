//! The bundle state machine: one endpoint of a braid tunnel.
//!
//! Grammar (as quinn-proto): `handle_*` feeds events in, `poll_*` takes work out, every call carries
//! `now`. The caller owns sockets, the TUN device and the clock:
//! - a datagram arrived on a link socket: [`Endpoint::handle_datagram`] (or, to open a batch of
//!   them on other threads, [`Endpoint::open_job`], [`OpenJob::open`] and
//!   [`Endpoint::handle_opened`]: check in order, open anywhere, commit in order);
//! - an IP packet was read from the TUN device: [`Endpoint::send_packet`];
//! - then drain [`Endpoint::poll_transmit`] (datagrams to send), [`Endpoint::poll_deliver`]
//!   (IP packets for the TUN device) and [`Endpoint::poll_event`];
//! - sleep until [`Endpoint::poll_timeout`], then call [`Endpoint::handle_timeout`].
//!
//! Copies on the data path: a packet from the TUN is written once, by the compressor (or as it
//! is), into a pool buffer behind room for the DATA header, and sealed there in place
//! ([`crypto::seal_data_in_place`]); the repair ring keeps its own copy of the plaintext
//! (retransmissions go on another link under another nonce). A datagram is opened in place in
//! the caller's receive buffer; its payload is copied once into a pool buffer, which the reorder
//! buffer holds until delivery (the receive buffer is reused by the next batch).

//!
//! Session set-up: the client sends HELLO (sealed under a key derived from the pre-shared key and
//! the packet's own random salt) on every link until a HELLO-ACK comes back; both sides then
//! derive one key per direction from the PSK and both random salts. The server keeps its previous
//! session until the first packet authenticated under the new keys arrives, and a restarted
//! client simply gets a new one. A client that has had no answer from the server for
//! [`Config::rehandshake_after`] (no PROBE-ACK: the server's own packets only show that we hear
//! it, not that it hears us) starts a new handshake while still sending under the old keys: how
//! a restarted server is re-joined, and how a client whose packets a balancer now sends to
//! another server (docs/protocol.md §9.2) gets a session there.
//!
//! Replayed HELLOs: each HELLO carries the client's wall-clock timestamp, strictly increasing
//! from one handshake to the next. The server remembers the newest it accepted and drops any
//! HELLO that is not newer (unless it is the very HELLO of its pending or current session,
//! repeated on another link, which gets the same answer again); only a newer HELLO displaces a
//! pending session. A restarted server has forgotten the newest timestamp, so one replayed old
//! HELLO may set up a pending session nobody can confirm, but the genuine client's next HELLO is
//! newer and replaces it, and from then on the replay is stale. HELLO-ACKs for repeats are
//! rate-limited ([`crate::ratelimit`]) and are smaller than the HELLO that asked for them.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::arq::{RingConfig, SentRing};
use crate::bqueue::BundleQueue;
use crate::compress::{Compressor, Decompressor, Feedback, Limits as CompressLimits};
use crate::crypto::{self, HandshakeKey, SessionKeys};
use crate::frag::{self, Piece, Reassembler};
use crate::health::{HealthConfig, LinkHealth, LinkState};
use crate::inner;
use crate::pmtu::{self, PathMtu};
use crate::ratelimit::AckLimiter;
use crate::reorder::{Arrival, Pushed, ReorderBuffer, ReorderConfig};
use crate::replay::{LinkCounters, LinkReplay};
use crate::rwnd::WindowClamp;
use crate::sched::{LinkView, Scheduler};
use crate::wire::{
    self, Body, CipherId, Common, DataRepr, Header, HelloAckRepr, HelloRepr, IdAckRepr,
    LinkNackRepr, NackRepr, PacketType, ProbeAckRepr, ProbeRepr, SeqRange, DATA_OVERHEAD,
    FLAG_RETRANSMIT, FLAG_UNORDERED, MAX_NACK_RANGES, PACKET_SALT_LEN,
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
    /// The cipher this end proposes (client) or insists on (server), unless `cipher_auto`.
    pub cipher: CipherId,
    /// Negotiate: the client proposes `cipher` and takes what the server answers; the server
    /// takes the client's proposal, except AES-256-GCM when it lacks fast AES (then
    /// ChaCha20-Poly1305). The session's cipher is in [`BundleStats::cipher`].
    pub cipher_auto: bool,
    /// Whether this machine runs AES-GCM in hardware ([`crypto::aes_is_fast`]); read once by
    /// [`Config::new`] and used by `cipher_auto`.
    pub local_fast_aes: bool,
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
    /// segment but a pure ACK, other packets of [`EQUALIZE_MIN_LEN`] bytes or more; a SYN
    /// less, [`Equalize::Opening`]) until the slowest live link's base one-way delay has passed
    /// since it was sent,
    /// adding at most this much (`ZERO`: off). The inner
    /// TCP then sees one steady RTT whatever links the scheduler uses (see [`Endpoint`]'s
    /// receive path).
    pub equalize_max: Duration,
    /// Failover without loss: a ring of sent packets, from which what was in flight on a link
    /// that died (or fell silent) is reinjected on the others, and answers to the peer's NACKs
    /// (see [`crate::arq`]). Default on.
    pub repair: bool,
    /// Which lost gaps the receiver asks the peer for again (NACK) and waits for; see [`Nack`].
    /// Default [`Nack::RandomLoss`].
    pub nack: Nack,
    /// With [`Nack::RandomLoss`]: the packets behind a random loss's gap wait for its copy
    /// (`true`), or go on as soon as the gap counts as lost and the copy is delivered out of
    /// order when it comes (`false`, the default; [`ReorderBuffer::suspect_loss`]). A copy comes
    /// a round trip of the fastest link after the loss, behind that link's queue (40-70 ms in
    /// the lab's `lossy-fast`, 2% loss on the faster of two 10 Mbit/s links); held, the packets
    /// of every link wait that long, 17 times a second, and the inner TCP's acknowledgements
    /// stop with them: a rate-based sender (BBR) then misreads both its round trip and its
    /// bandwidth. Passed on, the inner TCP sees a reordering, which its SACKs carry on through
    /// (BBR +4.5 to +7.7 points there; BENCHMARKS.md §4, "Random loss passed on"). A loss-based
    /// sender sometimes retransmits before the copy comes and backs off (CUBIC level on average
    /// there, but wider spread). Failover's gaps always wait ([`Self::repair`]).
    pub hold_random_loss: bool,
    /// Bounds of the ring of sent packets kept for repair.
    pub ring: RingConfig,
    /// Compress the inner TCP/IP headers of the DATA we send (docs/protocol.md §13). Default on.
    /// The receiving side always decompresses, so the two ends need not agree.
    pub compression: bool,
    /// ECN across the tunnel (docs/protocol.md §1 and §5.11): DATA's outer ECN field copies the
    /// inner packet's and a path's CE reaches the inner packet (RFC 6040), until the peer says
    /// it takes its links' marks (LINK-CE); then every DATA goes ECN-capable and each link's
    /// marks back that link off. Off: every datagram goes Not-ECT, arriving fields are not read
    /// and no LINK-CE is sent (RFC 6040's compatibility mode), for a path that drops
    /// ECN-capable UDP. Default on.
    pub ecn: bool,
    /// Under back-pressure, the receive window the peer's TCP hosts announce to ours is lowered
    /// to what the bundle carries in two of its inner round trips ([`crate::rwnd`]): a sender on
    /// a long equalised round trip is then limited by that window rather than by its send
    /// buffer, which kept Linux's BBR in start-up for good. Default on.
    pub clamp_window: bool,
    /// The largest DATA payload the receiver rebuilds from pieces (the tunnel's MTU plus the
    /// 2 bytes of a *full* compression header): bounds the reassembly memory ([`crate::frag`]).
    pub max_packet: usize,
    /// A packet in reassembly is dropped when its next piece takes longer than this.
    pub reassembly_timeout: Duration,
    /// The wall-clock time at the `now` given to [`Endpoint::new`]. Client: HELLO timestamps are
    /// this plus the time since (so they keep increasing across restarts of the client, as long
    /// as its clock does not go back). [`Config::new`] reads the system clock for it, the one
    /// place the core looks at a clock: simulations and tests that run in virtual time set it.
    pub wall_clock: SystemTime,
    /// Client: the route id its HELLOs carry (docs/protocol.md §9.2): the server's session id
    /// for this client starts with it, so every packet of every link names it, and a balancer
    /// in front of several servers steers the whole bundle to one of them by it. `None`: a
    /// random one per endpoint.
    pub route_id: Option<u16>,
    /// Per-client keys (docs/protocol.md §9.3) instead of the PSK alone: the handshake is the
    /// identity handshake, and `psk` (zeros when none is configured) is mixed into its keys.
    pub identity: Option<Identity>,
}

/// Which lost gaps a receiver asks for again (docs/scheduling.md, "Random loss").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nack {
    /// None: every loss reaches the inner TCP (reinjection on failover is separate).
    Off,
    /// Gaps in which a link lost packets while it had no queue: its own sequence numbers jumped
    /// with its queueing delay under [`RANDOM_LOSS_QDELAY`] or well under its recent peak
    /// ([`QUEUE_PEAK_SHARE`]), or the link lost so lately ([`LOSSY_LINK_QUIET_LOSSES`]).
    /// Random loss is repaired, and the inner TCP sees at most a reordering (or nothing, with
    /// [`Config::hold_random_loss`]); a full queue's drops are not repaired, so a loss-based
    /// sender still sees the congestion it causes, and no other gap waits for a copy.
    RandomLoss,
    /// Every gap the reorder buffer would give up (repairs congestion drops too: a loss-based
    /// inner TCP then fills the links' queues; kept for comparison).
    Every,
}

/// A link's own packets lost while its queueing delay (as this receiver sees it) is under this
/// share of the highest it reached lately ([`QUEUE_PEAK_WINDOW`]) are taken for random loss
/// ([`Nack::RandomLoss`]): a queue drops for congestion when it is full, i.e. at its peak (the
/// simulator's 50 Mbit/s link overflowing at 98 ms of its 100), while a link that loses at
/// random does so at whatever queue it has (15-80 ms on the simulator's lossy link, whose queue
/// delay equalisation and the inner TCP move up and down). A single delay threshold cannot tell
/// the two: both cases above lie around 100 ms.
pub const QUEUE_PEAK_SHARE: f64 = 0.8;
/// Losses under this queueing delay are random whatever the peak (a link that never queues).
pub const RANDOM_LOSS_QDELAY: Duration = Duration::from_millis(5);
/// The peak queueing delay of a link is the highest seen over the last one or two of these.
pub const QUEUE_PEAK_WINDOW: Duration = Duration::from_secs(5);
/// A link that lost packets this many times at an empty queue (under [`RANDOM_LOSS_QDELAY`];
/// under back-pressure, well under its peak) within the last one or two [`QUEUE_PEAK_WINDOW`]s
/// loses at random: its losses at the peak
/// are taken for random too.
/// Under back-pressure the sender keeps a link's queue near its plan, so the peak is the plan,
/// not a full buffer, and a lossy link's losses at it were read as a full queue's: they reached
/// the inner CUBIC, 4-25 a run, each a 30% cut (lab, 2 x 20 Mbit/s at 10/40 ms with 1.5% loss
/// on one: 6-17 of ~400; 40/8/4 Mbit/s at 20/50/80 ms with 1% on the 8 Mbit/s link: 5-23 of
/// ~100, the holes given up exactly those). With this rule the first's CUBIC upload gained
/// 11.3 points over two seeds, its losses read as a queue's 2-6 (BENCHMARKS.md §4, "A lossy
/// link's losses at its queue's peak"); the second's 8 Mbit/s link seldom has an empty queue,
/// and is unchanged. Counting the losses well under the peak instead reached it too (CUBIC +3.9
/// / +7.8 points) but broke the simulator's 1+2+3 Mbit/s failover (the links left overflowed
/// under a stale peak, their drops were repaired, CUBIC stalled 335 ms). A link that never
/// loses at an empty queue still has its peak losses left to the inner flows (a full queue),
/// whatever the others do.
pub const LOSSY_LINK_QUIET_LOSSES: u64 = 3;
/// A range of sequence numbers named for repair after a non-DATA packet showed a link's loss
/// reaches this far beyond the highest sequence number received (the lost packet may have a
/// higher number than any other link has brought yet).
const SUSPECT_SLACK: u64 = 64;
/// A received DATA payload carries one byte after it to delivery: its piece flags
/// ([`Piece::flags`], bits 2-3) and, from this bit up, the outer ECN field it arrived with.
const MARK_ECN_SHIFT: u8 = 6;
/// A receiver sends a link's LINK-CE at most this often while marks come (and at its next
/// PROBE-ACK otherwise): CoDel marks a standing queue at most once per its interval at first.
const LINK_CE_GAP: Duration = Duration::from_millis(20);
/// A receiver's first LINK-CEs on a link in a session, one with each of its first PROBE-ACKs
/// there, say it takes its links' marks: one lost of these many leaves the peer the others.
/// (Three or four alike over fifteen seeds of the simulator's returning-link test, each drawing
/// its own low runs, chaos; with three one of its five runs drew a 0.33 share: BENCHMARKS.md
/// §4, "Links behind CoDel".)
const LINK_CE_ANNOUNCE: u8 = 4;
const _: () = assert!(Piece::Middle.flags() >> MARK_ECN_SHIFT == 0);
/// While the peer asks for repairs, the window clamp ([`crate::rwnd`]) counts this many round
/// trips of the fastest link in the flows' round trip beyond its base: a hole holds deliveries
/// for the NACK's way back and the copy's way out, each behind what waits before it, and holes
/// overlap. With one, 2 x 10 Mbit/s with 2% loss on the faster link gave a BBR download 82.6% of
/// the sum where the unclamped flow had 85.2; with two, 85.4 against 82.6. A CUBIC download over
/// 2 x 20 Mbit/s with 1.5% loss on one sat at its window (906 kB, 24-30 Mbit/s) for ten seconds
/// of one run of four (78.3% against 92.4-92.9); four round trips were level there and on the
/// 2% mix in four runs each, but one of ratio7's CUBIC failovers stalled 735 ms against 405
/// (BENCHMARKS.md §4, "The window the sender is told"): two, until more runs tell.
const REPAIR_ROUND_TRIPS: u32 = 2;
/// Receiver: a link that fell silent may have carried DATA numbered up to this far beyond the
/// highest received when the silence was seen (what the peer sent on it before it saw the
/// silence itself: at 10 Mbit/s, 100 ms of its packets interleaved with another link's).
const SILENT_LINK_SLACK: u64 = 512;

/// This end's static key pair and the one peer it accepts (client: the server's public key;
/// server: the client's), for the identity handshake.
#[derive(Debug, Clone)]
pub struct Identity {
    pub own: crate::identity::KeyPair,
    pub peer: [u8; 32],
    /// Server: the tunnel addresses given to the client in the HELLO-ACK.
    pub v4: Option<(std::net::Ipv4Addr, u8)>,
    pub v6: Option<(std::net::Ipv6Addr, u8)>,
}

impl Config {
    /// A configuration with the defaults: ChaCha20-Poly1305, `adaptive`, 100 ms probes.
    pub fn new(role: Role, psk: [u8; 32]) -> Self {
        Config {
            role,
            psk,
            cipher: CipherId::ChaCha20Poly1305,
            cipher_auto: false,
            local_fast_aes: crypto::aes_is_fast(),
            scheduler: "adaptive".to_string(),
            health: HealthConfig::default(),
            reorder: ReorderConfig::default(),
            hello_interval: Duration::from_millis(250),
            rehandshake_after: Duration::from_secs(2),
            forget_link_after: Duration::from_secs(120),
            equalize_max: DEFAULT_EQUALIZE_MAX,
            repair: true,
            nack: Nack::RandomLoss,
            hold_random_loss: false,
            ring: RingConfig::default(),
            compression: true,
            ecn: true,
            clamp_window: true,
            max_packet: DEFAULT_MAX_PACKET,
            reassembly_timeout: DEFAULT_REASSEMBLY_TIMEOUT,
            wall_clock: SystemTime::now(),
            route_id: None,
            identity: None,
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
    /// Client: the link's estimated bandwidth towards us (download), bit/s. The server is told
    /// (LINK-INFO, docs/protocol.md §5.9) and takes it as its `bandwidth_bps` for the link, so
    /// that it does not have to learn the rate from nothing while the inner TCP starts up.
    pub download_bps: Option<u64>,
}

/// The largest rate hint a LINK-INFO may carry (1 Tbit/s); a larger one is ignored.
pub const MAX_RATE_HINT_BPS: u64 = 1_000_000_000_000;
/// A client sends a link's LINK-INFO this many times, [`LINK_INFO_REPEAT`] apart, for each new
/// session or hint: all of them lost costs the server only the learning it would do anyway.
/// Not periodically: each one delays the packets behind it on a slow link (76 bytes are 42 ms
/// at 14.4 kbit/s), which the receiver's reorder hold, tuned to the steady spread of the links'
/// delays, can take for reordering (simulator, EQL 57.6 + 14.4 kbit/s at 90% load: one every
/// 5 s cost 11% of the packets to reorder timeouts).
const LINK_INFO_COPIES: u8 = 3;
/// See [`LINK_INFO_COPIES`].
const LINK_INFO_REPEAT: Duration = Duration::from_secs(1);

/// A datagram to send on `link`. Client: on that link's socket to its configured remote
/// (`dst` is `None`). Server: on the listening socket to `dst`.
#[derive(Debug)]
pub struct Transmit {
    pub link: LinkId,
    pub dst: Option<SocketAddr>,
    pub payload: Vec<u8>,
    /// With deferred sealing ([`Endpoint::set_deferred_sealing`]): `payload` is laid out but not
    /// sealed yet; [`Transmit::finish`] (on any thread) seals it. Always `None` otherwise.
    pub seal: Option<crypto::Seal>,
    /// The ECN field of the outer IP header (RFC 3168 values, [`inner::ECN_CE`]...): a DATA
    /// packet's follows its inner packet's (`Endpoint::outer_ecn`), every other datagram's is
    /// Not-ECT (0).
    pub ecn: u8,
}

impl Transmit {
    /// Seals the payload if its sealing was deferred; then it is the datagram to send.
    pub fn finish(&mut self) {
        if let Some(s) = self.seal.take() {
            s.apply(&mut self.payload);
        }
    }

    /// The datagram's length on the wire (sealed or not yet).
    pub fn wire_len(&self) -> usize {
        self.payload.len()
            + if self.seal.is_some() {
                wire::TAG_LEN
            } else {
                0
            }
    }
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
    /// A link fell silent (nothing from it for `after` while another link delivers: it is
    /// avoided, what it carried lately was sent again, and the receiver stops waiting for it),
    /// or spoke again (`after` is zero; from its first packet on). Not always a failure: a busy
    /// link whose traffic ends is silent until its next probe (a few duplicates sent; a packet
    /// of it still in flight then may arrive after its gap was given up, and is dropped).
    LinkSilent {
        link: LinkId,
        silent: bool,
        after: Duration,
    },
    /// Server: a link appeared, or moved to a new address (NAT rebinding).
    LinkLearned {
        link: LinkId,
        addr: SocketAddr,
    },
    /// A datagram of another protocol version arrived (dropped): the peer runs a braid that
    /// does not speak ours. Reported once per version seen.
    VersionMismatch {
        theirs: u8,
        ours: u8,
    },
    /// Client, identity handshake: the tunnel addresses the server gives this client (sent
    /// with every new session; the runner configures the TUN device with them).
    Addresses {
        v4: Option<(std::net::Ipv4Addr, u8)>,
        v6: Option<(std::net::Ipv6Addr, u8)>,
    },
}

/// What [`Endpoint::handle_datagram`] (or [`Endpoint::handle_opened`]) made of a datagram, for
/// the I/O layer: which link, if any, it authenticated as. Only such datagrams may teach the
/// I/O layer anything about the peer (e.g. which local address a wildcard listener answers that
/// link from): anyone can send a datagram from any address, only the peer can make one
/// authenticate.
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

/// One datagram of a receive batch handed to [`Endpoint::receive_batch`], between its check and
/// its commit: its job, where it came from, its bytes (opened in place), and what the caller
/// keeps with it (`tag`: the runner's local address, nothing in the tests).
pub struct BatchJob<'a, T> {
    pub job: OpenJob,
    pub from: SocketAddr,
    pub bytes: &'a mut [u8],
    pub tag: T,
}

impl<T> BatchJob<'_, T> {
    /// Opens the datagram in place ([`OpenJob::open`]); any thread, any order.
    pub fn open(&mut self) {
        self.job.open(self.bytes);
    }
}

/// What [`Endpoint::open_job`] made of a received datagram.
#[derive(Debug)]
pub enum Opening {
    /// A session datagram that passed the checks: open it ([`OpenJob::open`], on any thread),
    /// then give it back with [`Endpoint::handle_opened`], in arrival order.
    Job(OpenJob),
    /// A HELLO or HELLO-ACK, left alone: it may set up or replace a session, so the jobs of
    /// the datagrams before it are committed first, then it goes to
    /// [`Endpoint::handle_datagram`].
    Handshake,
    /// Dropped and counted (malformed header, wrong link socket, unknown session, replayed):
    /// nothing more to do ([`Received::Ignored`]).
    Dropped,
}

/// A received session datagram that [`Endpoint::open_job`] checked, waiting to be opened: its
/// header with the full counter (the nonce), and the receiving key of the session it is for. It
/// borrows nothing from the endpoint, so any thread may open it; the endpoint takes it back with
/// [`Endpoint::handle_opened`] (and, by the key's identity, sees whether its session is still
/// the one it was checked against).
pub struct OpenJob {
    header: Header,
    key: Arc<crypto::Aead>,
    /// After [`OpenJob::open`]: the plaintext's length (it follows the header), or why the
    /// datagram did not open.
    opened: Option<Result<usize, crypto::CryptoError>>,
    /// When the datagram reached this host, if known better than the `now` it is handled at
    /// (see [`Endpoint::handle_datagram_at`]), and its outer ECN field.
    rx: Option<RxMeta>,
}

// Jobs cross to the helper threads.
const _: fn() = || {
    fn is_send<T: Send>() {}
    is_send::<OpenJob>();
};

impl std::fmt::Debug for OpenJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenJob")
            .field("header", &self.header)
            .field("opened", &self.opened)
            .finish_non_exhaustive()
    }
}

impl OpenJob {
    /// Opens `datagram`, the bytes the job was checked on, in place (the plaintext replaces the
    /// ciphertext), and records the outcome for [`Endpoint::handle_opened`]. A second call does
    /// nothing: opening the plaintext again would only fail.
    pub fn open(&mut self, datagram: &mut [u8]) {
        if self.opened.is_none() {
            let opened = crypto::open(&self.key, &self.header, datagram);
            self.opened = Some(opened.map(|plaintext| plaintext.len()));
        }
    }

    /// The plaintext in the opened `datagram`.
    fn plaintext<'a>(&self, datagram: &'a [u8]) -> Result<&'a [u8], crypto::CryptoError> {
        match self.opened {
            Some(Ok(len)) => datagram
                .get(self.header.buffer_len()..self.header.buffer_len() + len)
                .ok_or(wire::WireError::Truncated.into()),
            Some(Err(e)) => Err(e),
            // Not opened: nothing authenticated it.
            None => Err(crypto::CryptoError::Auth),
        }
    }
}

/// What the checks before any cryptography made of a datagram.
enum Checked {
    Sealed(OpenJob),
    Handshake(Header),
    Dropped,
}

/// What the I/O layer knows of a received datagram besides its bytes and its source (see
/// [`Endpoint::handle_datagram_at`]); an `Instant` alone converts into one whose ECN field is not
/// known (Not-ECT).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxMeta {
    /// When it reached this host (e.g. the kernel's receive stamp).
    pub arrived: Instant,
    /// The ECN field of its outer IP header (RFC 3168 values): a DATA packet's is combined into
    /// its inner packet at delivery ([`inner::decapsulate_ecn`]).
    pub ecn: u8,
}

impl From<Instant> for RxMeta {
    fn from(arrived: Instant) -> Self {
        RxMeta {
            arrived,
            ecn: inner::ECN_NOT_ECT,
        }
    }
}

/// When a packet on the receive path was sent and arrived, in the wire's clock (microseconds),
/// and the outer ECN field it came with.
#[derive(Debug, Clone, Copy)]
struct RxTiming {
    /// When it arrived (no later than the `now` it is handled at).
    arrived: Instant,
    /// Its outer IP header's ECN field ([`RxMeta::ecn`]).
    ecn: u8,
    /// Our clock at its arrival.
    local_ts: u32,
    /// DATA: its full send `ts`, `None` before the session's first full `ts` arrived.
    data_ts: Option<u32>,
    /// Whether its send time is known: DATA with a `data_ts`, and every other type (they carry
    /// a full `ts`).
    timed: bool,
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum EndpointError {
    #[error("link {0} already exists")]
    LinkExists(LinkId),
    #[error("no link {0}")]
    NoSuchLink(LinkId),
    #[error("link id {0} is above {max}, the largest DATA's header can carry", max = wire::MAX_LINK_ID)]
    LinkIdTooLarge(LinkId),
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
    /// Addressed to a session this endpoint does not have (or, opened on another thread, no
    /// longer had when it was taken back).
    pub unknown_session: u64,
    /// Client: arrived on a socket whose link does not match the header.
    pub wrong_link: u64,
    /// IP packets from the TUN device dropped because no session is up.
    pub no_session: u64,
    /// IP packets from the TUN device dropped because every link's queue was full (offered load
    /// above the bundle's capacity).
    pub queue_full: u64,
    /// IP packets from the TUN device dropped from the bundle's queue under back-pressure:
    /// waited beyond its limit, or pushed out of a full queue (see [`crate::bqueue`]).
    pub queue_delay: u64,
}

/// In-tunnel loss repair counters (see [`crate::arq`]).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RepairStats {
    /// Sender: DATA packets sent again in answer to a NACK.
    pub retransmits_sent: u64,
    /// Sender: DATA packets sent again because the link that carried them went DOWN.
    pub reinjected: u64,
    /// Sender: NACKed sequence numbers no longer (or never) in the ring, or resent too
    /// recently to send again.
    pub nack_unserved: u64,
    /// NACK and LINK-NACK packets sent (receiver) and received (sender).
    pub nacks_sent: u64,
    pub nacks_received: u64,
    /// Receiver: retransmitted DATA packets that arrived.
    pub retransmits_received: u64,
    /// Receiver: retransmissions that filled a hole.
    pub holes_repaired: u64,
    /// Receiver: DATA packets dropped because their sequence number was already held or
    /// delivered.
    pub duplicates_suppressed: u64,
    /// Receiver: a link's own packets found lost (its sequence numbers jumped), read as random
    /// loss (under [`RANDOM_LOSS_QDELAY`] of queue, or well under its recent peak: asked for
    /// again with [`Nack::RandomLoss`]) and as a full queue's drops (left to the inner flows).
    pub link_losses_random: u64,
    pub link_losses_queued: u64,
    /// Sender: packets in the ring now, and their bytes.
    pub ring_packets: usize,
    pub ring_bytes: usize,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct LinkStats {
    pub id: LinkId,
    pub name: String,
    pub state: LinkState,
    pub addr: Option<SocketAddr>,
    pub bandwidth_bps: Option<u64>,
    /// Client: the download bandwidth hint told to the server.
    pub download_bandwidth_bps: Option<u64>,
    pub priority: u8,
    pub srtt_us: Option<u64>,
    pub rttvar_us: Option<u64>,
    pub min_rtt_us: Option<u64>,
    pub loss: f64,
    pub delivery_rate_bps: f64,
    /// The rate the scheduler currently assumes for this link (learned by `adaptive`).
    pub sched_rate_bps: Option<f64>,
    /// The queue the scheduler believes the link holds, µs (its virtual queue; `adaptive`).
    pub sched_queue_us: Option<u64>,
    /// Held back for its loss by the scheduler (`adaptive`): up, but carrying only its probes.
    pub pulled_back: Option<bool>,
    pub qdelay_us: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    /// Recent send and receive rates on this link, bit/s.
    pub tx_rate_bps: f64,
    pub rx_rate_bps: f64,
    /// The largest datagram (UDP payload) this link sends now, from path MTU discovery
    /// (`None`: the I/O layer gave no first-hop size, nothing is cut for this link).
    pub pmtu: Option<usize>,
    /// This session, the session packets the link's path marked Congestion Experienced: ours,
    /// as the peer counted them (LINK-CE), and the peer's, as we did.
    pub tx_ce_marked: u32,
    pub rx_ce_marked: u32,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct BundleStats {
    pub role: Role,
    pub scheduler: String,
    pub session: Option<u32>,
    /// The session's cipher (canonical name), once a session is up.
    pub cipher: Option<&'static str>,
    pub links: Vec<LinkStats>,
    /// IP packets taken from the TUN device / delivered to it.
    pub tun_rx_packets: u64,
    pub tun_rx_bytes: u64,
    pub tun_tx_packets: u64,
    pub tun_tx_bytes: u64,
    pub reorder: crate::reorder::ReorderStats,
    pub reorder_depth: usize,
    pub reorder_timeout_us: u64,
    /// Back-pressure ([`Endpoint::set_backpressure`]): on or off; packets waiting in the
    /// bundle's queue now, and that waited there so far (drops in `drops.queue_delay`), and
    /// those it marked Congestion Experienced instead of dropping (ECN-capable).
    pub backpressure: bool,
    pub queue_depth: usize,
    pub queued: u64,
    pub queue_marked: u64,
    /// How long a packet may wait in the bundle's queue now, and how many times the queue was
    /// found standing (its limit cut to one round trip: [`crate::bqueue::Standing`]).
    pub queue_limit_us: u64,
    pub queue_stood: u64,
    /// The receive window our hosts' TCP senders are told at most now, bytes (`None`: not
    /// clamped now; [`crate::rwnd`]), the segments whose window was lowered, and the
    /// handshakes whose window scale was learned.
    pub window_clamp_bytes: Option<u32>,
    pub window_clamped: u64,
    pub window_flows_learned: u64,
    /// Delay equalisation: how long bulk-size packets from the fastest live link are held now
    /// (the spread of the live links' base one-way delays, within `equalize_max`); 0 when off.
    pub equalize_us: u64,
    /// The hold the links call for: more than `equalize_us` while the hold grows by steps
    /// under traffic after a slower link came up ([`crate::equalize`]).
    pub equalize_wanted_us: u64,
    /// As the sender: the hold this end counts on the peer applying (its own view of the
    /// links' delays, grown by the same steps a little later); a link that needs more carries
    /// no held packet. Equal to the wanted hold of that view when no step holds it back.
    pub equalize_send_us: u64,
    pub drops: DropStats,
    /// Loss repair; holes given up after repair are in `reorder.repair_given_up`.
    pub repair: RepairStats,
    /// Inner header compression, all sessions so far.
    pub compression: CompressionStats,
    /// Packets cut into pieces to fit the path, and their reassembly.
    pub frag: FragStats,
    /// ECN across the tunnel (RFC 6040): what went ECN-capable, what came marked.
    pub ecn: EcnStats,
}

/// ECN counters (RFC 6040 in the tunnel: [`inner::encapsulate_ecn`], [`inner::decapsulate_ecn`]).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct EcnStats {
    /// Sender: DATA packets sent with an ECN-capable outer header (their inner packet was, or
    /// the peer takes its links' marks).
    pub tx_ect: u64,
    /// Receiver: inner packets delivered marked Congestion Experienced because a link's path
    /// marked their outer packet (RFC 6040, with a peer that does not take the marks).
    pub rx_ce: u64,
    /// Receiver: inner packets dropped because their outer packet came marked CE while they
    /// were not ECN-capable (RFC 6040 section 4.2).
    pub rx_ce_dropped: u64,
    /// Receiver: DATA that came marked CE by a link's path and was left to the peer's link
    /// control (LINK-CE) rather than passed on to its inner packet.
    pub rx_ce_taken: u64,
}

/// Fragmentation counters (docs/protocol.md §2.1, [`crate::frag`]), both directions.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct FragStats {
    /// Sender: packets too big for the path, cut; the pieces they made.
    pub tx_split: u64,
    pub tx_pieces: u64,
    /// Receiver: packets put back together.
    pub rx_reassembled: u64,
    /// Receiver: packets in progress dropped (a piece lost, out of place or too late).
    pub rx_dropped_incomplete: u64,
    /// Receiver: pieces that continued no packet in progress.
    pub rx_dropped_orphans: u64,
    /// Receiver: packets dropped for growing past [`Config::max_packet`].
    pub rx_dropped_oversize: u64,
    /// Receiver: pieces that came late (after the reorder buffer gave their gap up), dropped:
    /// the pieces around them went long ago.
    pub rx_late_pieces: u64,
}

/// Inner header compression counters (docs/protocol.md §13), both directions.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CompressionStats {
    /// Sender: DATA payloads sent plain (not compressible, or compression off), whole (setting
    /// up a context) and compressed; header bytes not sent.
    pub tx_plain: u64,
    pub tx_full: u64,
    pub tx_compressed: u64,
    pub tx_bytes_saved: u64,
    /// Receiver: the same for what arrived, and the packets dropped: compressed against a
    /// context it lacks, or malformed.
    pub rx_plain: u64,
    pub rx_full: u64,
    pub rx_compressed: u64,
    pub rx_bytes_saved: u64,
    pub rx_dropped_no_context: u64,
    pub rx_dropped_malformed: u64,
}

impl CompressionStats {
    fn add(&mut self, tx: &crate::compress::Stats, rx: &crate::compress::Stats) {
        self.tx_plain += tx.plain;
        self.tx_full += tx.full;
        self.tx_compressed += tx.compressed;
        self.tx_bytes_saved += tx.bytes_saved;
        self.rx_plain += rx.plain;
        self.rx_full += rx.full;
        self.rx_compressed += rx.compressed;
        self.rx_bytes_saved += rx.bytes_saved;
        self.rx_dropped_no_context += rx.dropped_no_context;
        self.rx_dropped_malformed += rx.dropped_malformed;
    }
}

/// Outer IPv4 (20) + UDP (8) headers: counted in per-link byte rates so that they measure what
/// the uplink carries.
pub const IP_UDP_OVERHEAD: usize = 28;
/// Bytes on the wire per tunnelled packet beyond the packet itself.
pub const WIRE_OVERHEAD: usize = IP_UDP_OVERHEAD + crate::wire::DATA_OVERHEAD;

/// How long a link counts in the receiver's delay equalisation after the last packet it
/// brought (unless it fell silent: `Link::brings_data`), and in the sender's view of the
/// peer's hold after the last packet *we* heard on it, DOWN meanwhile
/// (`Endpoint::cap_sender_equalization`): our DOWN is about the way back, which pauses
/// whenever the inner flow does (a BBR flow's PROBE_RTT stops what the peer sends back on the
/// slow link), while the peer counts the link by what we send it.
pub const HOLD_KEEPS_LINK: Duration = Duration::from_secs(1);

/// How often rates, the reorder timeout and link expiry are refreshed.
const TICK: Duration = Duration::from_millis(100);
/// Extra hold time on top of the measured delay spread, for jitter.
const REORDER_MARGIN: Duration = Duration::from_millis(3);
/// Loss repair: what a NACKed hole waits beyond the fastest link's round trip (the NACK goes
/// out on it, the copy comes back on it).
const REPAIR_MARGIN: Duration = Duration::from_millis(5);
/// Answers to NACKs are budgeted (a token bucket): each ordered DATA packet sent adds
/// `REPAIR_SHARE` of a resend, up to `REPAIR_BURST`. Random loss (a link losing 1-2% of what
/// it carries, or a few packets late beyond the hold) stays inside the budget and is repaired;
/// the bursts of drops of a full queue (congestion) soon exceed it, and what is not repaired
/// reaches the inner TCP as the loss signal it must see. Repairing every congestion drop hid
/// it from CUBIC, which then filled the links' queues (10/20/50 Mbit/s in the simulator: 1943
/// queue drops repaired, goodput 91.8% -> 82.7% of the sum).
const REPAIR_SHARE: f64 = 0.02;
const REPAIR_BURST: f64 = 8.0;
/// A link that has brought nothing for a while (see [`Endpoint::silence_after`]) while another
/// one delivers is avoided at once (its packets would be lost), well before its probes time out
/// and it is declared DOWN. At most `max(3 x srtt, probe interval + SILENCE_SLACK)`.
const SILENCE_SLACK: Duration = Duration::from_millis(50);
/// A busy link is silent sooner: after `2 x` the longest gap between two of its packets over
/// the last one to two `SILENCE_GAP_WINDOW`s, plus `SILENCE_GAP_SLACK`, but never before half
/// its srtt nor `SILENCE_MIN`: a paused inner flow pauses its ACKs too (a 30 ms floor alone
/// called a 50 Mbit/s link silent in the simulator's steady state, 77% -> 70% of the sum; the
/// whole srtt as floor held a failover in the lab 95 ms, where the srtt is mostly queue).
const SILENCE_GAP_SLACK: Duration = Duration::from_millis(10);
/// See [`SILENCE_GAP_SLACK`].
const SILENCE_MIN: Duration = Duration::from_millis(50);
/// See [`SILENCE_GAP_SLACK`].
const SILENCE_GAP_WINDOW: Duration = Duration::from_secs(1);
/// Feedback entries the receiver collects before it sends them without waiting for the end of a
/// batch of deliveries.
const MAX_FEEDBACK_BATCH: usize = 64;
/// A copy goes on another link than the one that lost the original if that brings it at most
/// this much later (see [`Endpoint::copy_link`]).
const COPY_SLACK: Duration = Duration::from_millis(5);
/// A ring entry is not sent again sooner than this after its last copy (a NACK repeated).
const MIN_RESEND_GAP: Duration = Duration::from_millis(5);
/// Sequence numbers resent per NACK at most (a range may name up to 65535).
const MAX_RESEND_PER_NACK: usize = 4096;
/// Packets shorter than this are not held for delay equalisation: pure TCP acks, DNS, keystrokes
/// and game updates keep the lowest latency the links give, while bulk-size packets get a delay
/// that does not depend on which link carried them. For a bulk TCP flow that makes the RTT the
/// slowest link's one-way delay plus the fastest's (acks take the fastest link), steady from
/// the first packet to the last.
pub const EQUALIZE_MIN_LEN: usize = 256;

/// How delay equalisation treats an inner packet ([`equalization`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Equalize {
    /// Delivered as it comes: pure TCP ACKs, packets under [`EQUALIZE_MIN_LEN`] bytes.
    No,
    /// Held until the slowest live link would have brought it: bulk, the sender's queue may
    /// keep it.
    Held,
    /// A connection's SYN ([`crate::inner::is_tcp_syn`]): held only by what our hold exceeds
    /// the peer's (`Endpoint::equalize_send`), sent at once like a pure ACK. The client times
    /// the SYN and the SYN-ACK together, the SYN-ACK is held in full, and the server times the
    /// SYN-ACK and the pure ACK after it: so both ends' first round trip is the one their data
    /// will see (at least), and a connection is set up in one hold, not two (lab, 50/20/7
    /// Mbit/s at 10/60/150 ms: `connect` 302 ms with the SYN held as well, 162 ms now).
    Opening,
}

/// How delay equalisation treats this inner packet: every TCP segment but a pure ACK (see
/// [`crate::inner::is_pure_tcp_ack`]) and a SYN is held, and other packets of
/// [`EQUALIZE_MIN_LEN`] bytes or more. `packet` is a DATA payload in any of its encodings (an IP
/// packet is its own plain encoding).
pub fn equalization(packet: &[u8]) -> Equalize {
    use crate::inner::TcpKind;
    match crate::compress::tcp_kind(packet) {
        Some(TcpKind::Syn) => Equalize::Opening,
        Some(TcpKind::PureAck) => Equalize::No,
        Some(TcpKind::Other) => Equalize::Held,
        None if packet.len() >= EQUALIZE_MIN_LEN => Equalize::Held,
        None => Equalize::No,
    }
}

/// Whether delay equalisation holds this inner packet in full ([`equalization`]).
pub fn equalized(packet: &[u8]) -> bool {
    equalization(packet) == Equalize::Held
}
/// A link known to bring less than this (bit/s: no rate configured or hinted, and idle or a
/// flow starting) times a held packet's spacing by its arrival gap alone (`equalize::Spacing`).
const MIN_PACE_BPS: f64 = 64_000.0;

/// Default bound of delay equalisation ([`Config::equalize_max`]): 300 ms, so that a link up to
/// 300 ms slower than the fastest (one-way: a satellite uplink beside DSL) is waited for in full,
/// and up to 450 ms in part (`sched::equalize_wait`). At 100 ms, a 7 Mbit/s link at 150 ms
/// beside 50 at 10 and 20 at 60 carried nothing and braid stayed at 0.92-0.96x kernel MPTCP
/// there; at 150 ms, 20 + 10 Mbit/s 200 ms apart gave braid the fast link alone (0.78-0.85x
/// MPTCP) and 20 Mbit/s at 20 ms beside 5 at 300 ms BBR 0.91-0.92x. At 300 ms: 1.08-1.25x and
/// 1.00-1.01x once a fast link's moment of silence no longer dropped the hold
/// (`Endpoint::keep_faster_silent`; CUBIC 1.65-2.06x), links within 150 ms of each other as
/// before; the longer hold
/// became the default once held packets kept their link's pace (`equalize::Spacing`: before,
/// the far mix's CUBIC download stalled at the receiver's first window; BENCHMARKS.md §4, "A
/// link's own pace through the hold"). It pays only with back-pressure on
/// ([`DEFAULT_BACKPRESSURE`]), which gives BBR's excess room (without it: 20-32% of BBR's
/// segments retransmitted at 150 ms; "Back-pressure and the 150 ms bound by default").
pub const DEFAULT_EQUALIZE_MAX: Duration = Duration::from_millis(300);
/// Whether a bundle pushes back by default ([`Endpoint::set_backpressure`], `[bundle]
/// backpressure`): on. The bundle's excess then waits in the bundle's queue (bounded in time:
/// `bqueue`) instead of the links' buffers (docs/scheduling.md, "Back-pressure"). A BBR flow
/// keeps one equalised round trip more than the path in flight: without the queue it overflowed
/// 100 ms link buffers, 2-9% of its segments retransmitted and 3-5 points of goodput lost on
/// the lossy and mixed scenarios; a loss-based flow gains on the lossy mixes (lab, BENCHMARKS.md
/// §4). The cost is the queue's delay under a loss-based flow (up to three inner round trips)
/// and, with one usable link left, no push-back at all (the window it let grow then overflows
/// that link).
pub const DEFAULT_BACKPRESSURE: bool = true;
/// Default [`Config::max_packet`]: the largest IP packet plus a full compression header.
pub const DEFAULT_MAX_PACKET: usize = 65_535 + 2;
/// Default [`Config::reassembly_timeout`]: pieces come through the reorder buffer, which waits
/// far less than this for a gap.
pub const DEFAULT_REASSEMBLY_TIMEOUT: Duration = Duration::from_secs(1);

struct Session {
    /// The id the peer puts in packets for us.
    local_id: u32,
    /// The id we put in packets for the peer.
    remote_id: u32,
    keys: SessionKeys,
    cipher: CipherId,
    /// Per-link send counters (with the link id, the AEAD nonce).
    send_counters: LinkCounters,
    /// Per-link anti-replay windows.
    replay: LinkReplay,
    /// Server: the client's HELLO that made this session (answered again if repeated).
    client_salt: [u8; 32],
    hello_ts: u64,
    /// Server: our HELLO-ACK body, kept to answer repeated HELLOs identically.
    ack: Option<HelloAckRepr>,
    /// Server, identity handshake: the pending session's ephemeral key and secrets, and its
    /// HELLO-ACK body, kept for the same reason.
    id_answer: Option<Box<(crate::identity::ServerAnswer, IdAckRepr)>>,
    /// The peer's clock as last seen in a full `ts` (any packet but DATA), with our clock at
    /// that arrival: DATA carries only bits 6..22 of its `ts`, extended against this.
    peer_clock: Option<(u32, u32)>,
    /// One more than the highest bundle seq received: DATA carries its low 24 bits.
    rx_seq_next: u64,
    /// Inner header compression, each direction (docs/protocol.md §13).
    compressor: Compressor,
    decompressor: Decompressor,
}

impl Session {
    fn new(
        local_id: u32,
        remote_id: u32,
        (keys, cipher): (SessionKeys, CipherId),
        hello: &HelloRepr,
    ) -> Session {
        Session {
            local_id,
            remote_id,
            keys,
            cipher,
            send_counters: LinkCounters::default(),
            replay: LinkReplay::new(),
            client_salt: hello.salt,
            hello_ts: hello.timestamp,
            ack: None,
            id_answer: None,
            peer_clock: None,
            rx_seq_next: 0,
            compressor: Compressor::new(CompressLimits::default()),
            decompressor: Decompressor::new(CompressLimits::default()),
        }
    }

    /// The full `ts` of a DATA packet that carried bits 6..22 of it (`sent`), or `None` before
    /// any full `ts` of this session arrived.
    fn data_ts(&self, local_ts: u32, sent: u32) -> Option<u32> {
        let (peer, at) = self.peer_clock?;
        Some(wire::extend_ts(
            peer.wrapping_add(local_ts.wrapping_sub(at)),
            sent,
        ))
    }

    /// Server: whether `hello` is the HELLO this session was made from (repeated by the client
    /// on another link, or replayed).
    fn made_by(&self, hello: &HelloRepr) -> bool {
        self.remote_id == hello.session
            && self.client_salt == hello.salt
            && self.hello_ts == hello.timestamp
    }
}

/// Server: what an authenticated HELLO calls for.
enum HelloVerdict {
    /// Stale, or a repeat over the rate limit: no answer.
    Drop,
    /// The HELLO of the pending or current session again: the same answer.
    Repeat,
    /// Newer than any accepted: a new pending session.
    New,
}

/// Link `l`'s one-way delay as the views count it: half the least minimum RTT of all links
/// (`min_rtt_all`) plus the link's delay offset above the fastest.
fn one_way_delay(l: &Link, min_rtt_all: Option<Duration>) -> Duration {
    min_rtt_all.map_or(Duration::ZERO, |r| r / 2) + l.health.owd_offset()
}

/// The header of the HELLO-ACK answering `hello` that came in with `header`.
fn id_ack_header(header: &Header, hello: &HelloRepr) -> Header {
    Header {
        ptype: PacketType::IdHelloAck,
        link: header.link,
        session: hello.session,
        counter: 0,
    }
}

/// Client: a handshake in progress.
struct Hello {
    local_id: u32,
    salt: [u8; 32],
    timestamp: u64,
    /// Identity handshake: this handshake's ephemeral key and secrets.
    id: Option<crate::identity::ClientHandshake>,
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

/// Client: what a link last told the server in LINK-INFO.
#[derive(Debug, Clone, Copy)]
struct InfoSent {
    session: u32,
    hint: u64,
    at: Instant,
    copies: u8,
}

struct Link {
    id: LinkId,
    cfg: LinkConfig,
    /// Server: where the client's packets for this link come from (replies go there).
    addr: Option<SocketAddr>,
    health: LinkHealth,
    next_probe_id: u32,
    tx_packets: u64,
    tx_bytes: u64,
    rx_packets: u64,
    rx_bytes: u64,
    tx_meter: Meter,
    rx_meter: Meter,
    /// Last time a DATA packet arrived on this link.
    last_data_rx: Option<Instant>,
    /// The link sequence number of the last packet received on it, and the bundle sequence
    /// number of the last ordered DATA: a jump in the first names the range of the second in
    /// which something was lost ([`Nack::RandomLoss`]).
    rx_link_seq: Option<u32>,
    rx_data_seq: Option<u64>,
    /// The last DATA on it was a piece of a cut packet (receiver): a loss next to it likely took
    /// a piece, whose packet is whole only if the pieces behind it wait for the copy.
    rx_cut: bool,
    /// The highest queueing delay seen on it lately (receiver).
    rx_qpeak: PeakHold,
    /// Its losses lately at an empty queue (receiver): random for sure.
    rx_quiet_losses: WindowCount,
    last_rx: Option<Instant>,
    /// The longest time between two packets received on it lately (see
    /// [`Endpoint::silence_after`]).
    rx_gap_peak: PeakHold,
    /// Silent (see [`Endpoint::is_silent`]) at the last look: avoided, and what it carried
    /// lately was reinjected.
    silent: bool,
    /// `last_rx` when the silence check last ran past its deadline (no wake-up for it again).
    silence_checked: Option<Instant>,
    /// Path MTU discovery, once the I/O layer has said how big a datagram the first hop takes
    /// ([`Endpoint::set_link_mtu`]).
    pmtu: Option<PathMtu>,
    /// The path MTU probe in flight: its probe id and datagram size.
    pmtu_probe: Option<(u32, usize)>,
    /// Client: the last LINK-INFO sent on it; reset when the link goes DOWN.
    info_sent: Option<InfoSent>,
    /// Server: the client's hint of the link's rate towards it (LINK-INFO), for this session;
    /// the link's bandwidth unless one is configured here.
    peer_hint_bps: Option<u64>,
    /// Whether our view of the peer's hold has counted the link yet this session
    /// ([`Endpoint::new_in_hold_view`]).
    in_hold_view: bool,
    /// Congestion Experienced marks the link's path put on session packets, both ways (LINK-CE).
    ce: CeTally,
    /// Receiver: its held packets' spacing through delay equalisation.
    hold_spacing: crate::equalize::Spacing,
}

impl Link {
    /// The rate the link brings our peer's packets at, as best known (bit/s, 0 for none): what
    /// it brought lately or any rate configured or hinted for it, whichever is higher (a rate
    /// too high only spaces held packets less, `equalize::Spacing`). The hints may be for the
    /// other direction (a server knows the client's download hint, not its upload): the lab's
    /// links and most lines are alike both ways or faster down, where a server receives.
    fn rx_pace_bps(&self) -> f64 {
        [
            self.cfg.bandwidth_bps,
            self.cfg.download_bps,
            self.peer_hint_bps,
        ]
        .into_iter()
        .flatten()
        .map(|b| b as f64)
        .fold(self.rx_meter.bps, f64::max)
    }
}

/// A link's count of the Congestion Experienced marks its path put on our session packets this
/// session, both ways (LINK-CE, docs/protocol.md §5.11).
#[derive(Debug, Clone, Copy, Default)]
struct CeTally {
    /// Receiver: the peer's packets that arrived on it marked CE.
    rx_marks: u32,
    /// Receiver: the count the last LINK-CE on it said, and when it went (`None`: none yet).
    sent: Option<(u32, Instant)>,
    /// Receiver: LINK-CEs sent on it this session, up to [`LINK_CE_ANNOUNCE`].
    announced: u8,
    /// Sender: the peer's count of our DATA it got marked on this link (its latest LINK-CE).
    peer_marks: u32,
}

/// A value folded over the last one to two windows: two buckets, the window's and the one
/// before; the window is the caller's (e.g. [`QUEUE_PEAK_WINDOW`]). The fold is a maximum
/// ([`PeakHold`]) or a sum ([`WindowCount`]).
#[derive(Debug, Default)]
struct Windowed<T> {
    current: T,
    previous: T,
    since: Option<Instant>,
}

impl<T: Copy + Default> Windowed<T> {
    /// Folds `v` in at `now`; returns the fold over the last one or two windows (a sample after
    /// two windows without any starts afresh). The buckets keep to whole windows from the first
    /// sample, so a value folded in only now and then (a count of rare events) is as exact as
    /// one folded in at every packet.
    fn fold_in(&mut self, now: Instant, v: T, window: Duration, fold: fn(T, T) -> T) -> T {
        let since = *self.since.get_or_insert(now);
        let age = now.saturating_duration_since(since);
        if age >= window {
            let windows = age.as_nanos() / window.as_nanos().max(1);
            (self.previous, self.current) = if windows == 1 {
                (self.current, T::default())
            } else {
                (T::default(), T::default())
            };
            let start = window.as_nanos() * windows;
            self.since = Some(since + Duration::from_nanos(u64::try_from(start).unwrap_or(0)));
        }
        self.current = fold(self.current, v);
        fold(self.current, self.previous)
    }
}

/// The maximum of a duration over the last one to two windows.
type PeakHold = Windowed<Duration>;

impl PeakHold {
    /// The peak, once a whole window of samples is behind it (`None` before).
    fn settled_peak(&self) -> Option<Duration> {
        (!self.previous.is_zero()).then(|| self.current.max(self.previous))
    }

    /// Adds a sample at `now`; returns the peak.
    fn update(&mut self, now: Instant, v: Duration, window: Duration) -> Duration {
        self.fold_in(now, v, window, Duration::max)
    }
}

/// Events over the last one or two windows.
type WindowCount = Windowed<u64>;

impl WindowCount {
    /// Adds `n` events at `now`; returns the count over the last one or two windows.
    fn add(&mut self, now: Instant, n: u64, window: Duration) -> u64 {
        self.fold_in(now, n, window, u64::saturating_add)
    }
}

impl Link {
    /// The receiver counts this link among those that may still bring data: something arrived
    /// on it within [`HOLD_KEEPS_LINK`], and it has not fallen silent since
    /// ([`Endpoint::is_silent`]: quiet while the others speak, most likely dead).
    fn brings_data(&self, now: Instant) -> bool {
        !self.silent && self.heard_lately(now)
    }

    /// Something arrived on this link within [`HOLD_KEEPS_LINK`].
    fn heard_lately(&self, now: Instant) -> bool {
        self.last_rx
            .is_some_and(|t| now.saturating_duration_since(t) < HOLD_KEEPS_LINK)
    }

    /// The largest DATA payload this link carries in one datagram now (`usize::MAX`: no limit
    /// known).
    fn payload_room(&self) -> usize {
        self.pmtu
            .as_ref()
            .map_or(usize::MAX, |p| p.mtu().saturating_sub(DATA_OVERHEAD).max(1))
    }
}

pub struct Endpoint {
    cfg: Config,
    epoch: Instant,
    rng: Box<dyn rand_core::RngCore + Send>,
    /// Handshake keys: this end's cipher first, then (with `cipher_auto`) the other one, which
    /// a peer may have sealed its HELLO or HELLO-ACK with.
    hs_keys: Vec<(CipherId, HandshakeKey)>,
    /// Server: the newest HELLO timestamp accepted (HELLOs not newer are stale).
    newest_hello: Option<u64>,
    /// Client: the timestamp of the last HELLO made (the next is at least one more).
    last_hello_ts: u64,
    /// Client: the route id in its HELLOs (see [`Config::route_id`]).
    route_id: u16,
    /// Bit `v % 64`: a datagram of protocol version `v` was reported ([`Event::VersionMismatch`]).
    versions_seen: u64,
    /// Compression counters of the sessions that ended.
    compression: CompressionStats,
    /// Server: the budget of HELLO-ACKs answering repeated HELLOs.
    ack_limiter: AckLimiter,
    sched: Box<dyn Scheduler>,
    links: Vec<Link>,
    session: Option<Session>,
    /// Server: a session set up by a HELLO but not yet confirmed by the client.
    pending: Option<Session>,
    /// Client: handshake in progress.
    hello: Option<Hello>,
    next_hello: Option<Instant>,
    /// Client: when the server last showed that it hears us (the session's start, or a
    /// PROBE-ACK on any link).
    last_answer_rx: Option<Instant>,
    next_tick: Instant,
    last_tick: Instant,
    reorder: ReorderBuffer,
    /// Packets cut into pieces, put back together after the reorder buffer.
    reassembler: Reassembler,
    frag: FragStats,
    ecn: EcnStats,
    /// The peer sent a LINK-CE this session: it takes the CE marks of its DATA's paths as its
    /// links' congestion signals, so they are not passed on to the inner packets.
    peer_takes_ce: bool,
    /// The outer ECN field of the pieces of the packet being put back together so far
    /// ([`inner::worse_ecn`] of them).
    pieces_ecn: u8,
    /// Delay equalisation ([`crate::equalize`]): our hold as receiver, and as sender the
    /// scheduler's view of the peer's hold (how far it may have grown under traffic) and the
    /// hold we count on ([`BundleStats::equalize_send_us`]).
    hold: crate::equalize::Hold,
    equalize_tx: crate::equalize::Ramp,
    equalize_send: Duration,
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
    /// Sender side of loss repair: recently sent ordered DATA.
    ring: SentRing,
    /// Resends that NACKs may still ask for (see [`REPAIR_SHARE`]).
    repair_budget: f64,
    repair: RepairStats,
    /// Scratch: ranges to NACK, sequence numbers to reinject, NACK body bytes.
    nack_ranges: Vec<SeqRange>,
    resend_seqs: Vec<u64>,
    /// Under back-pressure, the ring entries a dead link carried lately, waiting to be sent again
    /// as the links left take them ([`Endpoint::send_reinjections`]), most likely lost first.
    reinjections: VecDeque<u64>,
    nack_buf: Vec<u8>,
    /// What the datagram being handled authenticated as (returned by `handle_datagram`).
    received: Received,
    /// Session datagrams are laid out and handed out with their [`crypto::Seal`] job instead
    /// of sealed here (see [`Endpoint::set_deferred_sealing`]).
    defer_seal: bool,
    /// Back-pressure: on, and the packets waiting for room on the links
    /// ([`Endpoint::set_backpressure`]).
    queue: BundleQueue,
    /// The receive window the peer's hosts announce to ours, clamped ([`Config::clamp_window`]).
    window: WindowClamp,
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
        let mut hs_keys = vec![(
            config.cipher,
            crypto::handshake_key(&config.psk, config.cipher),
        )];
        if config.cipher_auto {
            hs_keys.extend(
                [CipherId::ChaCha20Poly1305, CipherId::Aes256Gcm]
                    .into_iter()
                    .filter(|&c| c != config.cipher)
                    .map(|c| (c, crypto::handshake_key(&config.psk, c))),
            );
        }
        let reorder = ReorderBuffer::new(config.reorder.clone());
        let mut rng = rng;
        let ack_limiter = AckLimiter::new((rng.next_u64(), rng.next_u64()));
        let route_id = config.route_id.unwrap_or_else(|| rng.next_u32() as u16);
        let mut ep = Endpoint {
            route_id,
            epoch: now,
            rng,
            hs_keys,
            newest_hello: None,
            last_hello_ts: 0,
            versions_seen: 0,
            compression: CompressionStats::default(),
            ack_limiter,
            sched,
            links: Vec::new(),
            session: None,
            pending: None,
            hello: None,
            next_hello: None,
            last_answer_rx: None,
            next_tick: now + TICK,
            last_tick: now,
            reorder,
            reassembler: Reassembler::new(config.max_packet),
            frag: FragStats::default(),
            ecn: EcnStats::default(),
            peer_takes_ce: false,
            pieces_ecn: inner::ECN_NOT_ECT,
            hold: crate::equalize::Hold::new(config.equalize_max),
            equalize_tx: crate::equalize::Ramp::sender(),
            equalize_send: Duration::ZERO,
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
            ring: SentRing::new(config.ring.clone()),
            repair_budget: REPAIR_BURST,
            repair: RepairStats::default(),
            nack_ranges: Vec::new(),
            resend_seqs: Vec::new(),
            reinjections: VecDeque::new(),
            nack_buf: Vec::new(),
            received: Received::Ignored,
            defer_seal: false,
            queue: BundleQueue::default(),
            window: WindowClamp::default(),
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
        if id > wire::MAX_LINK_ID {
            return Err(EndpointError::LinkIdTooLarge(id));
        }
        self.links.push(Link {
            id,
            cfg,
            addr: None,
            health: LinkHealth::new(self.cfg.health.clone(), now),
            next_probe_id: 0,
            tx_packets: 0,
            tx_bytes: 0,
            rx_packets: 0,
            rx_bytes: 0,
            tx_meter: Meter::default(),
            rx_meter: Meter::default(),
            last_data_rx: None,
            rx_link_seq: None,
            rx_data_seq: None,
            rx_cut: false,
            rx_qpeak: PeakHold::default(),
            rx_quiet_losses: WindowCount::default(),
            last_rx: None,
            rx_gap_peak: PeakHold::default(),
            silent: false,
            silence_checked: None,
            pmtu: None,
            pmtu_probe: None,
            info_sent: None,
            peer_hint_bps: None,
            in_hold_view: false,
            ce: CeTally::default(),
            hold_spacing: crate::equalize::Spacing::default(),
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

    /// Client: sets (or, with `None`, withdraws) link `id`'s download bandwidth hint; the
    /// server hears of it within a tick.
    pub fn set_link_download(&mut self, id: LinkId, bps: Option<u64>) -> Result<(), EndpointError> {
        let i = self.link_index(id).ok_or(EndpointError::NoSuchLink(id))?;
        self.links[i].cfg.download_bps = bps;
        Ok(())
    }

    /// The I/O layer could not send on `link` because the kernel says its network is gone
    /// (ENETDOWN, ENETUNREACH...): the link is DOWN now, without waiting for probes to go
    /// unanswered. Probing goes on, so it comes back by itself once its acks do.
    pub fn handle_link_error(&mut self, now: Instant, link: LinkId) {
        if let Some(i) = self.link_index(link) {
            let rate = self.links[i].health.delivery_rate_bps();
            if let Some(state) = self.links[i].health.force_down(now) {
                self.events.push_back(Event::LinkState { link, state });
                self.link_lost(now, i, rate);
                self.links[i].info_sent = None;
            }
        }
    }

    /// The I/O layer: link `id`'s first hop takes datagrams (UDP payloads) of up to `max` bytes
    /// (its route's MTU less the outer IP and UDP headers). Path MTU discovery starts, or starts
    /// again if `max` changed, from [`pmtu::Config::for_max`]'s base: PROBEs padded to the sizes
    /// searched go out with DF set, and DATA payloads that do not fit the size found are cut into
    /// pieces ([`crate::frag`]). Without a call nothing is cut for this link.
    pub fn set_link_mtu(&mut self, id: LinkId, max: usize) {
        let Some(li) = self.link_index(id) else {
            return;
        };
        let link = &mut self.links[li];
        if link.pmtu.as_ref().is_some_and(|p| p.config().max == max) {
            return;
        }
        link.pmtu = Some(PathMtu::new(pmtu::Config::for_max(max)));
        link.pmtu_probe = None;
    }

    /// The I/O layer: link `id`'s path carries datagrams of at most `size` bytes (the kernel
    /// reported ICMP "fragmentation needed" / "packet too big", or refused a send with
    /// EMSGSIZE). Lowers the link's path MTU at once, never raises it (RFC 8899 §4.6.2).
    pub fn handle_too_big(&mut self, now: Instant, id: LinkId, size: usize) {
        if let Some(p) = self
            .link_index(id)
            .and_then(|li| self.links[li].pmtu.as_mut())
        {
            p.on_too_big(now, size);
        }
    }

    pub fn link_ids(&self) -> Vec<LinkId> {
        self.links.iter().map(|l| l.id).collect()
    }

    /// True once a session with the peer is established.
    /// The ids the peer puts in packets for us: the current session's and the pending one's
    /// (server); a concentrator routes packets to this endpoint by them.
    pub fn session_ids(&self) -> [Option<u32>; 2] {
        [
            self.session.as_ref().map(|s| s.local_id),
            self.pending.as_ref().map(|s| s.local_id),
        ]
    }

    pub fn is_connected(&self) -> bool {
        self.session.is_some()
    }

    fn link_index(&self, id: LinkId) -> Option<usize> {
        self.links.iter().position(|l| l.id == id)
    }

    /// This endpoint's clock in the wire's units: microseconds since creation, wrapping, in
    /// steps of [`wire::TS_UNIT_US`] (so that DATA's 16 bits of it are exact, and a DATA `ts`
    /// compares with a PROBE's without rounding).
    fn wire_ts(&self, now: Instant) -> u32 {
        let us = now.saturating_duration_since(self.epoch).as_micros() as u32;
        us - us % wire::TS_UNIT_US
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

    /// The wall-clock time at `now`, in nanoseconds since the Unix epoch.
    fn wall_ns(&self, now: Instant) -> u64 {
        let wall = self.cfg.wall_clock + now.saturating_duration_since(self.epoch);
        wall.duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos().min(u64::MAX as u128) as u64)
    }

    fn start_handshake(&mut self, now: Instant) {
        let local_id = self.random_id();
        let mut salt = [0u8; 32];
        self.rng.fill_bytes(&mut salt);
        // Strictly newer than any HELLO this endpoint made before, even if the clock stalls.
        let timestamp = self.wall_ns(now).max(self.last_hello_ts.saturating_add(1));
        self.last_hello_ts = timestamp;
        let id = self.cfg.identity.as_ref().and_then(|i| {
            crate::identity::ClientHandshake::start(&i.own, &i.peer, &self.cfg.psk, &mut *self.rng)
        });
        self.hello = Some(Hello {
            local_id,
            salt,
            timestamp,
            id,
        });
        self.next_hello = Some(now);
    }

    fn packet_salt(&mut self) -> [u8; PACKET_SALT_LEN] {
        let mut s = [0u8; PACKET_SALT_LEN];
        self.rng.fill_bytes(&mut s);
        s
    }

    fn send_hellos(&mut self, now: Instant) {
        let Some(hello) = self.hello.as_ref() else {
            return;
        };
        let repr = HelloRepr {
            session: hello.local_id,
            salt: hello.salt,
            cipher: self.cfg.cipher,
            timestamp: hello.timestamp,
        };
        let ids: Vec<LinkId> = self.links.iter().map(|l| l.id).collect();
        for id in ids {
            let mut header = Header {
                ptype: PacketType::Hello,
                link: id,
                session: wire::route_session(self.route_id, 0),
                counter: 0,
            };
            let packet_salt = self.packet_salt();
            let mut out = self.take_buf();
            let hs = self.hello.as_ref().and_then(|h| h.id.as_ref());
            match (hs, self.cfg.identity.as_ref()) {
                (Some(hs), Some(me)) => {
                    header.ptype = PacketType::IdHello;
                    hs.seal_hello(&me.own, &header, &packet_salt, &repr, &mut out);
                }
                _ => crypto::seal_hello(&self.hs_keys[0].1, &header, &packet_salt, &repr, &mut out),
            }
            self.transmits.push_back(Transmit {
                link: id,
                dst: None,
                payload: out,
                seal: None,
                ecn: inner::ECN_NOT_ECT,
            });
        }
        self.next_hello = Some(now + self.cfg.hello_interval);
    }

    // ------------------------------------------------------------------ receive

    /// A datagram arrived. `via`: the client's link socket it came in on (`None` on the server's
    /// shared listening socket). `from`: its source address. Never panics, whatever the bytes.
    /// Returns which link, if any, the datagram authenticated as (see [`Received`]).
    ///
    /// A session datagram takes the three steps of the deferred path ([`Endpoint::open_job`],
    /// [`OpenJob::open`], [`Endpoint::handle_opened`]) one after the other: both paths are the
    /// same code.
    pub fn handle_datagram(
        &mut self,
        now: Instant,
        via: Option<LinkId>,
        from: SocketAddr,
        datagram: &mut [u8],
    ) -> Received {
        self.handle_datagram_at(now, now, via, from, datagram)
    }

    /// [`handle_datagram`](Self::handle_datagram) for a datagram that reached this host at
    /// `arrived` (e.g. the kernel's receive stamp), before the `now` it is handled at. Its
    /// one-way delay, from which the links' queueing delays and the delay equalisation are
    /// reckoned, runs to `arrived`: how late the process came to read it is not the link's
    /// queue. (A turn of the data plane reads the clock once, then reads its sockets; a
    /// datagram that arrived meanwhile would look early by the turn's length, and the link's
    /// base delay, a minimum, would keep that error for its whole window.) An `arrived` later
    /// than `now` counts as `now`. `arrived` may carry the datagram's outer ECN field too
    /// ([`RxMeta`]): a DATA packet's inner packet takes it in ([`inner::decapsulate_ecn`]).
    pub fn handle_datagram_at(
        &mut self,
        now: Instant,
        arrived: impl Into<RxMeta>,
        via: Option<LinkId>,
        from: SocketAddr,
        datagram: &mut [u8],
    ) -> Received {
        match self.check_datagram(via, datagram) {
            Checked::Sealed(mut job) => {
                job.rx = Some(arrived.into());
                job.open(datagram);
                self.handle_opened(now, from, job, datagram)
            }
            Checked::Handshake(header) => self.handle_handshake(now, &header, from, datagram),
            Checked::Dropped => Received::Ignored,
        }
    }

    /// Receive with the opening done elsewhere, step 1: checks a datagram's header, session and
    /// replay window without any cryptography. A session datagram that passes becomes an
    /// [`OpenJob`], which any thread may open ([`OpenJob::open`]); the endpoint takes it back
    /// with [`Endpoint::handle_opened`]. A receive batch goes:
    ///
    /// 1. `open_job` on each datagram in arrival order, keeping the jobs;
    /// 2. at [`Opening::Handshake`]: steps 3 and 4 for the jobs kept so far, then
    ///    [`Endpoint::handle_datagram`] on the handshake datagram;
    /// 3. [`OpenJob::open`] on every job, on any threads, in any order;
    /// 4. [`Endpoint::handle_opened`] on every job in arrival order.
    ///
    /// [`Endpoint::receive_batch`] runs these steps with the opening the caller gives it (the
    /// tunnel's helper threads, the fuzz harness, the tests).
    ///
    /// That gives what [`Endpoint::handle_datagram`] on each datagram in turn gives, although
    /// jobs are checked against a state up to one batch old: the commit makes good what the
    /// check could not see. Two copies of a datagram in one batch both pass the check, and the
    /// second is dropped as a replay at its commit (the window's `update`). A DATA counter's 32
    /// wire bits are extended against the link's next counter as of the check, at most a batch
    /// (a few thousand datagrams) behind, where only an error of 2^31 would matter. A job
    /// checked against the pending session is committed after an earlier one made that session
    /// current: the commit looks the session up by key, not by slot. A job whose session ended
    /// before its commit (a CLOSE earlier in the batch) is dropped as `unknown_session`, what
    /// the inline path counts it as.
    pub fn open_job(&mut self, via: Option<LinkId>, datagram: &[u8]) -> Opening {
        match self.check_datagram(via, datagram) {
            Checked::Sealed(job) => Opening::Job(job),
            Checked::Handshake(_) => Opening::Handshake,
            Checked::Dropped => Opening::Dropped,
        }
    }

    /// Receives a batch of datagrams `(via, from, bytes, arrived, tag)` (`arrived` as for
    /// [`Endpoint::handle_datagram_at`]) with the opening done by
    /// `open_all` (on helper threads, in any order: it should call [`BatchJob::open`] on every
    /// job it is given; any it leaves are opened at the commit, here), following the protocol of
    /// [`Endpoint::open_job`]: each datagram checked in arrival order, the jobs opened, then
    /// committed in arrival order; a handshake datagram commits the jobs before it and is then
    /// handled inline. `received` hears the outcome of every datagram that got that far, in
    /// arrival order. `jobs` is empty before and after (the caller keeps it for its allocation).
    /// Gives what [`Endpoint::handle_datagram`] on each datagram in turn gives.
    pub fn receive_batch<'a, T, A: Into<RxMeta>>(
        &mut self,
        now: Instant,
        datagrams: impl IntoIterator<Item = (Option<LinkId>, SocketAddr, &'a mut [u8], A, T)>,
        jobs: &mut Vec<BatchJob<'a, T>>,
        mut open_all: impl FnMut(&mut [BatchJob<'a, T>]),
        mut received: impl FnMut(Received, SocketAddr, &T),
    ) {
        jobs.clear();
        for (via, from, bytes, arrived, tag) in datagrams {
            match self.open_job(via, bytes) {
                Opening::Job(mut job) => {
                    job.rx = Some(arrived.into());
                    jobs.push(BatchJob {
                        job,
                        from,
                        bytes,
                        tag,
                    })
                }
                Opening::Handshake => {
                    self.commit_batch(now, jobs, &mut open_all, &mut received);
                    let got = self.handle_datagram_at(now, arrived, via, from, bytes);
                    received(got, from, &tag);
                }
                Opening::Dropped => {}
            }
        }
        self.commit_batch(now, jobs, &mut open_all, &mut received);
    }

    /// [`receive_batch`](Self::receive_batch): opens the jobs kept so far and commits them in
    /// order, emptying `jobs`.
    fn commit_batch<'a, T>(
        &mut self,
        now: Instant,
        jobs: &mut Vec<BatchJob<'a, T>>,
        open_all: &mut impl FnMut(&mut [BatchJob<'a, T>]),
        received: &mut impl FnMut(Received, SocketAddr, &T),
    ) {
        if jobs.is_empty() {
            return;
        }
        open_all(jobs);
        for j in jobs.drain(..) {
            let got = self.handle_opened(now, j.from, j.job, j.bytes);
            received(got, j.from, &j.tag);
        }
    }

    /// Receive with the opening done elsewhere, last step (see [`Endpoint::open_job`]): takes
    /// back a job, opened or not (then it is opened here), with its datagram, and does with it
    /// what [`Endpoint::handle_datagram`] does. Call it in the order the datagrams arrived.
    /// `datagram` must be the bytes the job was checked and opened on (other bytes are a bug of
    /// the caller: dropped or parsed as they are, never a panic).
    pub fn handle_opened(
        &mut self,
        now: Instant,
        from: SocketAddr,
        mut job: OpenJob,
        datagram: &mut [u8],
    ) -> Received {
        self.received = Received::Ignored;
        job.open(datagram);
        let _ = self.commit_sealed(now, from, &job, datagram);
        self.received
    }

    /// The checks before any cryptography: the header, the link socket, and for a session
    /// datagram its session and replay window. Counts what it drops.
    fn check_datagram(&mut self, via: Option<LinkId>, datagram: &[u8]) -> Checked {
        let header = match Header::parse(datagram) {
            Ok(h) => h,
            Err(e) => {
                self.drops.malformed += 1;
                if let wire::WireError::Version(theirs) = e {
                    self.version_mismatch(theirs);
                }
                return Checked::Dropped;
            }
        };
        if via.is_some_and(|v| v != header.link) {
            self.drops.wrong_link += 1;
            return Checked::Dropped;
        }
        if header.ptype.is_handshake() {
            return Checked::Handshake(header);
        }
        match self.check_sealed(header) {
            Some(job) => Checked::Sealed(job),
            None => Checked::Dropped,
        }
    }

    /// A session datagram's checks: the session it is for (the current one, or (server) the
    /// one a HELLO just set up), its full counter (DATA carries the low 32 bits, extended
    /// against the link's window), and whether that counter is fresh.
    fn check_sealed(&mut self, mut header: Header) -> Option<OpenJob> {
        let session = [&self.session, &self.pending]
            .into_iter()
            .flatten()
            .find(|s| s.local_id == header.session);
        let Some(session) = session else {
            self.drops.unknown_session += 1;
            return None;
        };
        if header.ptype == PacketType::Data {
            let expected = session.replay.expected(header.link);
            header.counter = wire::extend(expected, header.counter, wire::DATA_COUNTER_BITS);
        }
        if !session.replay.check(header.link, header.counter) {
            self.drops.replay += 1;
            return None;
        }
        Some(OpenJob {
            header,
            key: Arc::clone(&session.keys.recv),
            opened: None,
            rx: None,
        })
    }

    /// A HELLO or HELLO-ACK: opened under its own handshake key by the handler of its type.
    fn handle_handshake(
        &mut self,
        now: Instant,
        header: &Header,
        from: SocketAddr,
        datagram: &mut [u8],
    ) -> Received {
        self.received = Received::Ignored;
        match header.ptype {
            PacketType::Hello | PacketType::HelloAck if self.cfg.identity.is_some() => {
                // A PSK handshake to an end that has per-client keys: not our key.
                self.drops.auth += 1;
            }
            PacketType::IdHello | PacketType::IdHelloAck if self.cfg.identity.is_none() => {
                self.drops.auth += 1;
            }
            PacketType::Hello => self.handle_hello(now, header, from, datagram),
            PacketType::HelloAck => self.handle_hello_ack(now, header, datagram),
            PacketType::IdHello => self.handle_id_hello(now, header, from, datagram),
            PacketType::IdHelloAck => self.handle_id_hello_ack(now, header, datagram),
            // `check_datagram` hands over the four handshake types only.
            _ => self.drops.malformed += 1,
        }
        self.received
    }

    /// A datagram of protocol version `theirs` arrived: said once per version (as an event the
    /// runtime logs), so that a peer running another braid gets a clear error, not silence.
    fn version_mismatch(&mut self, theirs: u8) {
        let bit = 1u64 << (theirs % 64);
        if self.versions_seen & bit == 0 {
            self.versions_seen |= bit;
            self.events.push_back(Event::VersionMismatch {
                theirs,
                ours: wire::VERSION,
            });
        }
    }

    /// Opens a HELLO or HELLO-ACK (sealed under its own handshake key) and returns its
    /// plaintext, counting why it was dropped if it was. A wrong length costs no cryptography.
    /// Opens a HELLO or HELLO-ACK with this end's handshake key, or (with `cipher_auto`) the
    /// other cipher's. Returns the cipher that opened it and the plaintext.
    fn open_handshake<'a>(
        &mut self,
        header: &Header,
        datagram: &'a mut [u8],
    ) -> Option<(CipherId, &'a [u8])> {
        // A failed open may leave the buffer altered: try the other keys on a copy (a HELLO is
        // 112 bytes).
        let original = (self.hs_keys.len() > 1).then(|| datagram.to_vec());
        let mut opened = None;
        let mut malformed = false;
        for (i, (cipher, key)) in self.hs_keys.iter().enumerate() {
            if let (true, Some(o)) = (i > 0, &original) {
                datagram.copy_from_slice(o);
            }
            match crypto::open_handshake(key, header, datagram) {
                Ok(pt) => {
                    opened = Some((*cipher, pt.len()));
                    break;
                }
                // A wrong length is wrong for every key.
                Err(crypto::CryptoError::Wire(_)) => {
                    malformed = true;
                    break;
                }
                Err(crypto::CryptoError::Auth) => {}
            }
        }
        match opened {
            Some((cipher, len)) => {
                // The plaintext sits right after the header and the packet salt.
                let start = crate::wire::HEADER_LEN + PACKET_SALT_LEN;
                Some((cipher, &datagram[start..start + len]))
            }
            None => {
                if malformed {
                    self.drops.malformed += 1;
                } else {
                    self.drops.auth += 1;
                }
                None
            }
        }
    }

    fn hs_key(&self, cipher: CipherId) -> &HandshakeKey {
        &self
            .hs_keys
            .iter()
            .find(|(c, _)| *c == cipher)
            .unwrap_or(&self.hs_keys[0])
            .1
    }

    /// Server: the session cipher for a client's proposal, or `None` if this end cannot accept
    /// it.
    fn session_cipher(&self, proposed: CipherId) -> Option<CipherId> {
        if !self.cfg.cipher_auto {
            return (proposed == self.cfg.cipher).then_some(proposed);
        }
        Some(match proposed {
            CipherId::Aes256Gcm if !self.cfg.local_fast_aes => CipherId::ChaCha20Poly1305,
            c => c,
        })
    }

    /// Server: a HELLO. New (its timestamp newer than any accepted): a new pending session,
    /// answered at once. The HELLO of the pending or current session again (the client repeats
    /// it on every link; or a replay): the same answer, within the rate limits. Anything else is
    /// stale (a replay of an older HELLO) and dropped.
    fn handle_hello(
        &mut self,
        now: Instant,
        header: &Header,
        from: SocketAddr,
        datagram: &mut [u8],
    ) {
        // A HELLO names only a route id (top 16 bits); the rest is the server's to choose.
        if self.cfg.role != Role::Server || header.session & 0xffff != 0 {
            self.drops.malformed += 1;
            return;
        }
        let Some((hs_cipher, pt)) = self.open_handshake(header, datagram) else {
            return;
        };
        let (hello, cipher) = match HelloRepr::parse(pt) {
            Ok(h) if h.cipher == hs_cipher && h.session != 0 => match self.session_cipher(h.cipher)
            {
                Some(c) => (h, c),
                None => {
                    self.drops.malformed += 1;
                    return;
                }
            },
            _ => {
                self.drops.malformed += 1;
                return;
            }
        };
        let ack = match self.hello_verdict(now, from, &hello) {
            HelloVerdict::Drop => return,
            HelloVerdict::Repeat => match self.made_by(&hello).and_then(|s| s.ack) {
                Some(ack) => ack,
                None => return,
            },
            HelloVerdict::New => {
                let psk = self.cfg.psk;
                let keys =
                    |salt: &[u8; 32]| crypto::session_keys(&psk, cipher, &hello.salt, salt, false);
                let (session, ack) = self.new_session(&hello, cipher, header.session, keys);
                self.pending = Some(session);
                ack
            }
        };
        let reply = Header {
            ptype: PacketType::HelloAck,
            link: header.link,
            session: hello.session,
            counter: 0,
        };
        let packet_salt = self.packet_salt();
        let mut out = self.take_buf();
        crypto::seal_hello_ack(self.hs_key(hs_cipher), &reply, &packet_salt, &ack, &mut out);
        self.queue_hello_ack(header.link, from, out);
    }

    /// Server: the pending or current session `hello` made (a repeat), if any.
    fn made_by(&self, hello: &HelloRepr) -> Option<&Session> {
        match (&self.pending, &self.session) {
            (Some(p), _) if p.made_by(hello) => Some(p),
            (_, Some(s)) if s.made_by(hello) => Some(s),
            _ => None,
        }
    }

    /// Server: what to do with an authenticated HELLO (§9): answer a repeat of the HELLO of
    /// the pending or current session again (rate-limited per source), drop a stale one, or
    /// make a new pending session for a newer one (then `newest` moves).
    fn hello_verdict(&mut self, now: Instant, from: SocketAddr, hello: &HelloRepr) -> HelloVerdict {
        if self.made_by(hello).is_some() {
            return if self.ack_limiter.allow(now, from) {
                HelloVerdict::Repeat
            } else {
                HelloVerdict::Drop
            };
        }
        if self.newest_hello.is_some_and(|n| hello.timestamp <= n) {
            // A replayed HELLO (or one from a client whose clock went back).
            self.drops.replay += 1;
            return HelloVerdict::Drop;
        }
        // Not rate-limited: an attacker cannot make newer HELLOs without the key, so these are
        // at most one per HELLO the client ever sent.
        self.newest_hello = Some(hello.timestamp);
        HelloVerdict::New
    }

    /// Server: a new session for a new HELLO (to become the pending one, replacing any older).
    /// Its id starts with the HELLO's route id (§9.2, from the HELLO header's session field);
    /// the low 16 bits are random, not zero, and not those of the current session (packets to
    /// either must tell them apart). `keys` derives the session keys from our salt.
    fn new_session(
        &mut self,
        hello: &HelloRepr,
        cipher: CipherId,
        hello_rsid: u32,
        keys: impl FnOnce(&[u8; 32]) -> crypto::SessionKeys,
    ) -> (Session, HelloAckRepr) {
        let current = self.session.as_ref().map(|s| s.local_id);
        let route = wire::route_of(hello_rsid);
        let local_id = loop {
            let id = wire::route_session(route, self.rng.next_u32() as u16);
            if id & 0xffff != 0 && Some(id) != current {
                break id;
            }
        };
        let mut salt = [0u8; 32];
        self.rng.fill_bytes(&mut salt);
        let keys = keys(&salt);
        let ack = HelloAckRepr {
            session: local_id,
            salt,
            cipher,
        };
        let mut session = Session::new(local_id, hello.session, (keys, cipher), hello);
        session.ack = Some(ack);
        (session, ack)
    }

    /// Server, identity handshake: a HELLO sealed for our static key. Only the configured
    /// client's is accepted (a concentrator hands each HELLO to the endpoint of the client it
    /// names); then as [`handle_hello`](Self::handle_hello).
    fn handle_id_hello(
        &mut self,
        now: Instant,
        header: &Header,
        from: SocketAddr,
        datagram: &mut [u8],
    ) {
        if self.cfg.role != Role::Server || header.session & 0xffff != 0 {
            self.drops.malformed += 1;
            return;
        }
        let Some(me) = self.cfg.identity.clone() else {
            return;
        };
        let psk = self.cfg.psk;
        let opened = crate::identity::peek_client(&me.own, &psk, datagram).and_then(|(who, es)| {
            if who != me.peer {
                return Err(crypto::CryptoError::Auth);
            }
            let ss = me.own.dh(&who).ok_or(crypto::CryptoError::Auth)?;
            crate::identity::open_hello(&psk, es, ss, datagram)
        });
        let opened = match opened {
            Ok(o) if o.hello.session != 0 => o,
            Ok(_) | Err(crypto::CryptoError::Wire(_)) => {
                self.drops.malformed += 1;
                return;
            }
            Err(crypto::CryptoError::Auth) => {
                self.drops.auth += 1;
                return;
            }
        };
        let hello = opened.hello;
        let Some(cipher) = self.session_cipher(hello.cipher) else {
            self.drops.malformed += 1;
            return;
        };
        let answer = match self.hello_verdict(now, from, &hello) {
            HelloVerdict::Drop => return,
            HelloVerdict::Repeat => {
                let mut out = self.take_buf();
                let packet_salt = self.packet_salt();
                let Some(a) = self.made_by(&hello).and_then(|s| s.id_answer.as_ref()) else {
                    self.recycle(out);
                    return;
                };
                a.0.seal_ack(&id_ack_header(header, &hello), &packet_salt, &a.1, &mut out);
                self.queue_hello_ack(header.link, from, out);
                return;
            }
            HelloVerdict::New => {
                let Some(answer) =
                    crate::identity::ServerAnswer::new(&psk, &me.peer, &opened, &mut *self.rng)
                else {
                    self.drops.malformed += 1;
                    return;
                };
                answer
            }
        };
        let (mut session, ack) = self.new_session(&hello, cipher, header.session, |salt| {
            answer
                .secrets
                .session_keys(cipher, &hello.salt, salt, false)
        });
        let id_ack = IdAckRepr {
            ack,
            v4: me.v4,
            v6: me.v6,
        };
        let mut out = self.take_buf();
        let packet_salt = self.packet_salt();
        answer.seal_ack(
            &id_ack_header(header, &hello),
            &packet_salt,
            &id_ack,
            &mut out,
        );
        session.id_answer = Some(Box::new((answer, id_ack)));
        self.pending = Some(session);
        self.queue_hello_ack(header.link, from, out);
    }

    /// Server: queues a sealed HELLO-ACK to `from` on `link` (the link its HELLO came in on).
    fn queue_hello_ack(&mut self, link: LinkId, from: SocketAddr, out: Vec<u8>) {
        self.received = Received::Hello(link);
        self.transmits.push_back(Transmit {
            link,
            dst: Some(from),
            payload: out,
            seal: None,
            ecn: inner::ECN_NOT_ECT,
        });
    }

    /// Client, identity handshake: the server's answer to our current HELLO.
    fn handle_id_hello_ack(&mut self, now: Instant, header: &Header, datagram: &mut [u8]) {
        if self.cfg.role != Role::Client {
            self.drops.malformed += 1;
            return;
        }
        let (Some(hello), Some(me)) = (self.hello.as_ref(), self.cfg.identity.as_ref()) else {
            self.drops.unknown_session += 1;
            return;
        };
        if header.session != hello.local_id {
            self.drops.unknown_session += 1;
            return;
        }
        let Some(hs) = hello.id.as_ref() else {
            return;
        };
        let (ack, secrets) = match hs.open_ack(&me.own, &self.cfg.psk, &hello.salt, datagram) {
            Ok(x) => x,
            Err(crypto::CryptoError::Auth) => {
                self.drops.auth += 1;
                return;
            }
            Err(crypto::CryptoError::Wire(_)) => {
                self.drops.malformed += 1;
                return;
            }
        };
        let a = ack.ack;
        if !(a.cipher == self.cfg.cipher || self.cfg.cipher_auto) || a.session == 0 {
            self.drops.malformed += 1;
            return;
        }
        let keys = secrets.session_keys(a.cipher, &hello.salt, &a.salt, true);
        let repr = HelloRepr {
            session: hello.local_id,
            salt: hello.salt,
            cipher: self.cfg.cipher,
            timestamp: hello.timestamp,
        };
        let session = Session::new(repr.session, a.session, (keys, a.cipher), &repr);
        self.hello = None;
        self.next_hello = None;
        self.install_session(now, session);
        self.events.push_back(Event::Addresses {
            v4: ack.v4,
            v6: ack.v6,
        });
        let ids: Vec<LinkId> = self.links.iter().map(|l| l.id).collect();
        for id in ids {
            self.send_probe(now, id);
        }
    }

    fn handle_hello_ack(&mut self, now: Instant, header: &Header, datagram: &mut [u8]) {
        if self.cfg.role != Role::Client {
            self.drops.malformed += 1;
            return;
        }
        let Some((local_id, salt, timestamp)) = self
            .hello
            .as_ref()
            .map(|h| (h.local_id, h.salt, h.timestamp))
        else {
            // Late duplicate of an ack we already used.
            self.drops.unknown_session += 1;
            return;
        };
        if header.session != local_id {
            self.drops.unknown_session += 1;
            return;
        }
        let Some((_, pt)) = self.open_handshake(header, datagram) else {
            return;
        };
        let ack = match HelloAckRepr::parse(pt) {
            Ok(a) if (a.cipher == self.cfg.cipher || self.cfg.cipher_auto) && a.session != 0 => a,
            _ => {
                self.drops.malformed += 1;
                return;
            }
        };
        let keys = crypto::session_keys(&self.cfg.psk, ack.cipher, &salt, &ack.salt, true);
        let hello = HelloRepr {
            session: local_id,
            salt,
            cipher: self.cfg.cipher,
            timestamp,
        };
        let session = Session::new(local_id, ack.session, (keys, ack.cipher), &hello);
        self.hello = None;
        self.next_hello = None;
        self.install_session(now, session);
        // Confirm at once on every link (the server switches on the first authenticated packet).
        let ids: Vec<LinkId> = self.links.iter().map(|l| l.id).collect();
        for id in ids {
            self.send_probe(now, id);
        }
    }

    /// Drops the current session, keeping its compression counters in the totals.
    fn end_session(&mut self) {
        if let Some(s) = self.session.take() {
            self.compression
                .add(&s.compressor.stats(), &s.decompressor.stats());
        }
    }

    fn install_session(&mut self, now: Instant, session: Session) {
        let id = session.local_id;
        if self.session.is_some() {
            self.events.push_back(Event::SessionClosed);
        }
        self.end_session();
        self.session = Some(session);
        self.last_answer_rx = Some(now);
        // A new session may be a new peer process: what each link learned of the old one
        // (its clock, delivery feedback; the link counters live in the session) would make the peer's fresh
        // counters look like total loss and stall its sending window. Measure afresh.
        for link in &mut self.links {
            link.health = LinkHealth::new(self.cfg.health.clone(), now);
            // Link and bundle sequence numbers start over with the session.
            link.rx_link_seq = None;
            link.rx_data_seq = None;
            link.rx_qpeak = PeakHold::default();
            link.rx_quiet_losses = WindowCount::default();
            // A hint lasts one session: the client tells each new one.
            link.peer_hint_bps = None;
            link.in_hold_view = false;
            link.ce = CeTally::default();
            link.hold_spacing = crate::equalize::Spacing::default();
        }
        // The hold's target is in the old session's clock: nothing is held until the links'
        // delays are measured afresh.
        self.hold.forget_target();
        // A new session may be an older peer: marks go to the inner packets until it says it
        // takes them (its first LINK-CE).
        self.peer_takes_ce = false;
        self.next_data_seq = 0;
        // The old session's packets: its numbers would match the new session's NACKs and
        // LINK-NACKs (stale data sent again), and would keep the new packets out of the ring
        // until they aged out.
        self.ring.clear();
        self.reinjections.clear();
        self.reorder.reset(0);
        self.reassembler.abandon();
        self.direct.clear();
        self.events.push_back(Event::SessionUp { session: id });
    }

    /// The commit of an opened session datagram: its session must still hold the job's key;
    /// then the body is parsed, the replay window updated, and the packet goes where its type
    /// says. `None`: dropped (and counted).
    fn commit_sealed(
        &mut self,
        now: Instant,
        from: SocketAddr,
        job: &OpenJob,
        datagram: &[u8],
    ) -> Option<()> {
        let Some(pending) = self.key_holder(&job.key) else {
            // Its session ended since the check (a CLOSE, a new session): the inline path
            // would have found no session for it either.
            self.drops.unknown_session += 1;
            return None;
        };
        let mut body = self.opened_body(job, datagram)?;
        let rx = job.rx.map_or(RxMeta::from(now), |r| RxMeta {
            arrived: r.arrived.min(now),
            ..r
        });
        let timing = self.accept(now, rx, pending, &job.header, &mut body)?;
        let li = self.rx_link(now, job.header.link, from)?;
        self.note_rx(now, li, &body, datagram.len(), timing);
        self.dispatch(now, li, body, timing);
        Some(())
    }

    /// Whether `key` is the receiving key of the pending session (`Some(true)`), of the current
    /// one (`Some(false)`), or of neither any more. By key, not by slot: a job checked against
    /// the pending session may be committed after an earlier one made that session current.
    fn key_holder(&self, key: &Arc<crypto::Aead>) -> Option<bool> {
        let holds =
            |s: &Option<Session>| s.as_ref().is_some_and(|s| Arc::ptr_eq(&s.keys.recv, key));
        if holds(&self.session) {
            Some(false)
        } else if holds(&self.pending) {
            Some(true)
        } else {
            None
        }
    }

    /// The opened job's plaintext, parsed; counts why it was dropped if it was: not authentic
    /// (`auth`), too short or not a body of its type (`malformed`).
    fn opened_body<'a>(&mut self, job: &OpenJob, datagram: &'a [u8]) -> Option<Body<'a>> {
        let plaintext = match job.plaintext(datagram) {
            Ok(p) => p,
            Err(crypto::CryptoError::Auth) => {
                self.drops.auth += 1;
                return None;
            }
            Err(_) => {
                self.drops.malformed += 1;
                return None;
            }
        };
        let parsed = match job.header.ptype {
            // DATA's seq, ts and flags ride in its header (authenticated as the AAD).
            PacketType::Data => {
                let header = datagram.get(..wire::DATA_HEADER_LEN).unwrap_or_default();
                DataRepr::parse_sent(header, plaintext).map(Body::Data)
            }
            t => Body::parse(t, plaintext),
        };
        if parsed.is_err() {
            self.drops.malformed += 1;
        }
        parsed.ok()
    }

    /// Marks the packet's counter as seen (a replay is dropped here: two copies in one batch
    /// both pass the check), extends DATA's short fields against the session, and switches to
    /// the pending session on its first packet (the client has the new keys).
    fn accept(
        &mut self,
        now: Instant,
        rx: RxMeta,
        pending: bool,
        header: &Header,
        body: &mut Body<'_>,
    ) -> Option<RxTiming> {
        let arrived = rx.arrived;
        // With ECN off the field is not read.
        let ecn = if self.cfg.ecn {
            rx.ecn
        } else {
            inner::ECN_NOT_ECT
        };
        let local_ts = self.wire_ts(arrived);
        let session = if pending {
            self.pending.as_mut()
        } else {
            self.session.as_mut()
        }?;
        if !session.replay.update(header.link, header.counter) {
            self.drops.replay += 1;
            return None;
        }
        let timing = match body {
            Body::Data(d) => {
                d.common.link_seq = header.counter as u32;
                d.seq = wire::extend(session.rx_seq_next, d.seq, wire::DATA_SEQ_BITS);
                session.rx_seq_next = session.rx_seq_next.max(d.seq.saturating_add(1));
                let data_ts = session.data_ts(local_ts, d.common.ts);
                d.common.ts = data_ts.unwrap_or(0);
                RxTiming {
                    arrived,
                    ecn,
                    local_ts,
                    data_ts,
                    timed: data_ts.is_some(),
                }
            }
            other => {
                // Every type but DATA carries a full `ts`: it sets the peer's clock.
                session.peer_clock = Some((other.common().ts, local_ts));
                RxTiming {
                    arrived,
                    ecn,
                    local_ts,
                    data_ts: None,
                    timed: true,
                }
            }
        };
        if pending {
            if let Some(p) = self.pending.take() {
                self.install_session(now, p);
            }
        }
        Some(timing)
    }

    /// The index of the link an authenticated, fresh packet came on: known, or (server) learned
    /// now; a server follows the client's address on it (NAT rebinding). `None`: a client has
    /// no such link (counted).
    fn rx_link(&mut self, now: Instant, link: LinkId, from: SocketAddr) -> Option<usize> {
        let li = match self.link_index(link) {
            Some(i) => i,
            None if self.cfg.role == Role::Client => {
                self.drops.wrong_link += 1;
                return None;
            }
            None => {
                let cfg = LinkConfig {
                    name: format!("link{link}"),
                    ..Default::default()
                };
                self.add_link(now, link, cfg).ok()?;
                self.links.len() - 1
            }
        };
        self.received = Received::Link(link);
        if self.cfg.role == Role::Server && self.links[li].addr != Some(from) {
            self.links[li].addr = Some(from);
            self.events
                .push_back(Event::LinkLearned { link, addr: from });
        }
        Some(li)
    }

    /// What a packet tells about its link: loss in its sequence numbers, counters, the gap
    /// since the one before (silence), health, and when it was sent (reorder rule (b)).
    fn note_rx(&mut self, now: Instant, li: usize, body: &Body<'_>, len: usize, t: RxTiming) {
        let (data_seq, cut) = match body {
            Body::Data(d) if d.flags & FLAG_UNORDERED == 0 => {
                (Some(d.seq), Piece::from_flags(d.flags) != Piece::Whole)
            }
            _ => (None, false),
        };
        let common = body.common();
        self.note_link_loss(now, li, common.link_seq, (data_seq, cut));
        let link = &mut self.links[li];
        link.rx_packets += 1;
        link.rx_bytes += len as u64;
        if let Some(last) = link.last_rx {
            link.rx_gap_peak
                .update(now, now.saturating_duration_since(last), SILENCE_GAP_WINDOW);
        }
        link.last_rx = Some(now);
        let was_silent = link.silent;
        if t.timed {
            link.health
                .on_packet_received(now, &common, len + IP_UDP_OVERHEAD, t.local_ts);
        } else {
            link.health
                .on_untimed_packet_received(now, common.link_seq, len + IP_UDP_OVERHEAD);
        }
        if was_silent {
            // Back in the reorder set before its packet is pushed (not at the next timer).
            self.speaks_again(now, li);
        }
        let link = &self.links[li];
        // Ordered DATA tells the reorder buffer itself when it is pushed.
        if data_seq.is_none() && t.timed {
            self.reorder.link_progress(now, link.id, common.ts);
        }
    }

    /// Acts on an accepted packet by its type.
    fn dispatch(&mut self, now: Instant, li: usize, body: Body<'_>, t: RxTiming) {
        if t.ecn == inner::ECN_CE {
            // The link's path marked it (a sender never sends CE): the link's signal, whatever
            // the packet's type.
            self.links[li].ce.rx_marks = self.links[li].ce.rx_marks.wrapping_add(1);
            self.send_link_ce(now, li);
        }
        match body {
            Body::Data(d) => self.receive_data(now, li, &d, t),
            Body::Nack(n) => self.handle_nack(now, &n),
            Body::LinkNack(n) => self.handle_link_nack(now, &n),
            Body::LinkCe(c) => self.handle_link_ce(&c),
            Body::Feedback(f) => {
                if let (Some(session), Some(entries)) =
                    (self.session.as_mut(), Feedback::parse_list(f.entries))
                {
                    for fb in entries {
                        session.compressor.on_feedback(fb);
                    }
                }
            }
            Body::LinkInfo(i) => {
                // A server takes the client's hint as the link's bandwidth (its first guess
                // of the rate it can send at); a client has its own configuration.
                if self.cfg.role == Role::Server && i.rate_to_you_bps <= MAX_RATE_HINT_BPS {
                    self.links[li].peer_hint_bps =
                        (i.rate_to_you_bps > 0).then_some(i.rate_to_you_bps);
                }
            }
            Body::Probe(p) => self.send_probe_ack(now, li, &p, t.arrived),
            Body::ProbeAck(a) => self.receive_probe_ack(now, li, &a, t.arrived),
            Body::Close(_) => {
                self.end_session();
                self.pending = None;
                self.events.push_back(Event::SessionClosed);
                if self.cfg.role == Role::Client {
                    self.start_handshake(now);
                }
            }
        }
    }

    /// DATA: the payload into the reorder buffer (unordered and whole: straight out), held for
    /// delay equalisation when [`equalized`] names it.
    fn receive_data(&mut self, now: Instant, li: usize, d: &DataRepr<'_>, t: RxTiming) {
        self.links[li].last_data_rx = Some(now);
        let mut buf = self.take_buf();
        buf.extend_from_slice(d.payload);
        let retransmit = d.flags & FLAG_RETRANSMIT != 0;
        if retransmit {
            self.repair.retransmits_received += 1;
        }
        let piece = Piece::from_flags(d.flags);
        // The piece mark and the outer ECN field ride at the end of the buffer to delivery (read
        // back in `poll_deliver`).
        buf.push(piece.flags() | (t.ecn & 0x03) << MARK_ECN_SHIFT);
        if d.flags & FLAG_UNORDERED != 0 && piece == Piece::Whole {
            self.direct.push_back(buf);
            return;
        }
        // A copy sent again is late already: delivered as soon as its turn comes.
        let kind = match piece {
            _ if retransmit => Equalize::No,
            Piece::Whole => equalization(d.payload),
            _ => Equalize::Held,
        };
        if kind == Equalize::Held {
            self.hold.on_traffic(now);
        }
        let release = match kind {
            Equalize::No => now,
            Equalize::Held => self.release_at(now, t, d.payload.len(), Some(li)),
            Equalize::Opening => self
                .release_at(now, t, d.payload.len(), None)
                .checked_sub(self.equalize_send)
                .map_or(now, |r| r.max(now)),
        };
        let arrival = Arrival {
            seq: d.seq,
            link: self.links[li].id,
            ts: t.data_ts,
            release,
        };
        match self.reorder.push_arrival(now, arrival, buf) {
            Pushed::Queued | Pushed::OutOfOrder if retransmit => self.repair.holes_repaired += 1,
            Pushed::Duplicate => self.repair.duplicates_suppressed += 1,
            _ => {}
        }
        self.send_nacks(now);
    }

    /// Equalised delivery: when the hold releases a packet of `len` bytes with this timing, at
    /// the pace link `li` brought it (`equalize::Spacing`, timed at the rate the link brings
    /// lately; a SYN's release moves no link's spacing).
    fn release_at(&mut self, now: Instant, t: RxTiming, len: usize, li: Option<usize>) -> Instant {
        let mut alone = crate::equalize::Spacing::default();
        let (spacing, tx) = match li {
            Some(li) => {
                let link = &mut self.links[li];
                let bps = link.rx_pace_bps();
                let tx = (bps >= MIN_PACE_BPS)
                    .then(|| Duration::from_secs_f64((len + WIRE_OVERHEAD) as f64 * 8.0 / bps));
                (&mut link.hold_spacing, tx)
            }
            None => (&mut alone, None),
        };
        self.hold
            .release_at(now, t.arrived, t.local_ts, t.data_ts, spacing, tx)
    }

    /// PROBE-ACK: the peer hears us; a path MTU probe may be answered; the link's health
    /// takes the round trip.
    fn receive_probe_ack(&mut self, now: Instant, li: usize, a: &ProbeAckRepr, arrived: Instant) {
        self.last_answer_rx = Some(now);
        let link = &mut self.links[li];
        if let Some((_, size)) = link.pmtu_probe.filter(|&(id, _)| id == a.probe_id) {
            link.pmtu_probe = None;
            if let Some(p) = link.pmtu.as_mut() {
                p.on_probe_acked(now, size);
            }
        }
        if let Some(state) = link.health.on_probe_ack_at(now, arrived, a) {
            self.events.push_back(Event::LinkState {
                link: link.id,
                state,
            });
            if state == LinkState::Up {
                self.link_back();
            }
        }
    }

    // ------------------------------------------------------------------ compression

    /// Receiver: sends the decompressor's feedback (which contexts it installed or lacks) in
    /// FEEDBACK packets on the link with the lowest one-way delay. A lost FEEDBACK costs
    /// nothing but time: the compressor keeps sending whole packets, each asking again.
    fn send_feedback(&mut self, now: Instant) {
        let Some(session) = self.session.as_mut() else {
            return;
        };
        if session.decompressor.pending_feedback() == 0 {
            return;
        }
        let entries = session.decompressor.take_feedback();
        let Some(li) = self.fastest_link(now, None) else {
            return;
        };
        let mut buf = Vec::with_capacity(entries.len().min(wire::MAX_FEEDBACK_ENTRIES) * 2);
        for chunk in entries.chunks(wire::MAX_FEEDBACK_ENTRIES) {
            buf.clear();
            chunk.iter().for_each(|fb| fb.emit(&mut buf));
            let common = self.next_common(now, li);
            let body = Body::Feedback(wire::FeedbackRepr {
                common,
                entries: &buf,
            });
            self.send_sealed(now, li, PacketType::Feedback, &body);
        }
    }

    // ------------------------------------------------------------------ loss repair

    /// Receiver: a packet with link sequence number `link_seq` (and bundle sequence number
    /// `data_seq` when it is ordered DATA, and whether it is a piece of a cut packet) arrived on
    /// link `li`. When the link's numbers jumped while it had no queue, the bundle range in which
    /// its lost packets lie is named to the reorder buffer for repair ([`Nack::RandomLoss`]).
    fn note_link_loss(
        &mut self,
        now: Instant,
        li: usize,
        link_seq: u32,
        (data_seq, cut): (Option<u64>, bool),
    ) {
        let link = &mut self.links[li];
        // A lost piece: the pieces around it are glued back only in sequence, so they wait.
        let near_piece = link.rx_cut || cut;
        if data_seq.is_some() {
            link.rx_cut = cut;
        }
        // How far this packet's link sequence number is past the last one (1: the next).
        let step = link
            .rx_link_seq
            .map_or(1, |last| link_seq.wrapping_sub(last) as i32);
        if step > 0 {
            link.rx_link_seq = Some(link_seq);
        }
        let qdelay = link.health.rx_qdelay();
        let peak = link.rx_qpeak.update(now, qdelay, QUEUE_PEAK_WINDOW);
        let from = link.rx_data_seq.map(|s| s.wrapping_add(1));
        if let Some(seq) = data_seq {
            // A copy sent again carries an old number: the highest stands.
            link.rx_data_seq = Some(link.rx_data_seq.map_or(seq, |s| s.max(seq)));
        }
        if step <= 1 {
            return;
        }
        let lost = u64::from(step.unsigned_abs() - 1);
        let empty = qdelay < RANDOM_LOSS_QDELAY;
        let under_peak = qdelay.as_secs_f64() < QUEUE_PEAK_SHARE * peak.as_secs_f64();
        // Without back-pressure only losses at an empty queue count: one well under a stale
        // peak may still be a queue's drop (the simulator's 1+2+3 Mbit/s failover, where the
        // links left overflow: CUBIC stalled 335 ms). Under it (this end's setting, which the
        // ends of a bundle share by default) the sender keeps the links' queues near its plan,
        // and a loss well under the peak counts too: the lab's mixed scenario's 1% link is
        // seldom empty (CUBIC +5.5 / +11.2 points up / down over 2 seeds). Counted as events,
        // not packets: one blip that loses a run of packets is not a lossy link.
        let quiet_event = empty || (under_peak && self.queue.on);
        let quiet_lately = link
            .rx_quiet_losses
            .add(now, u64::from(quiet_event), QUEUE_PEAK_WINDOW);
        // A link that loses at random does so at its queue's peak too; only a link that does
        // not is taken to drop there for a full queue.
        let random = empty || under_peak || quiet_lately >= LOSSY_LINK_QUIET_LOSSES;
        let count = if random {
            &mut self.repair.link_losses_random
        } else {
            &mut self.repair.link_losses_queued
        };
        *count = count.saturating_add(lost);
        if !random || self.cfg.nack != Nack::RandomLoss {
            return;
        }
        let link_id = link.id;
        self.send_link_nack(now, link_id, link_seq, step);
        let Some(from) = from else { return };
        let to = match data_seq {
            Some(seq) => seq,
            None => self.reorder.high_seq().saturating_add(SUSPECT_SLACK),
        };
        self.reorder
            .suspect_loss(from, to, self.cfg.hold_random_loss || near_piece);
    }

    /// Receiver: the packet with link seq `link_seq` came `step` (> 1) after the last one of
    /// link `link`, so the `step - 1` before it were lost there: the peer is told at once, by
    /// link seq, on the fastest link (a LINK-NACK), and sends again what DATA it put in them.
    /// The bundle's gap need not be passed by every link first (rule (b) waits for the slowest
    /// one), which made a random loss on a fast link cost the delay spread to the slowest on
    /// top of the copy's round trip. Longer runs are no random loss: the gap's NACK handles
    /// them.
    fn send_link_nack(&mut self, now: Instant, link: LinkId, link_seq: u32, step: i32) {
        let Ok(count) = u16::try_from(step - 1) else {
            return;
        };
        if count == 0 || count > wire::MAX_LINK_NACK_COUNT || !self.cfg.repair {
            return;
        }
        let Some(li) = self.fastest_link(now, None) else {
            return;
        };
        let body = Body::LinkNack(LinkNackRepr {
            common: self.next_common(now, li),
            link,
            count,
            first: link_seq.wrapping_sub(u32::from(count)),
        });
        if self.send_sealed(now, li, PacketType::LinkNack, &body) {
            self.repair.nacks_sent += 1;
        }
    }

    /// Sets the repair wait (receiver) and the ring's age bound (sender) from the links' RTTs.
    fn tick_repair(&mut self, now: Instant) {
        if !self.cfg.repair || self.cfg.nack == Nack::Off {
            self.reorder.set_repair_wait(Duration::ZERO);
            return;
        }
        self.reorder.set_repair_all(self.cfg.nack == Nack::Every);
        // The NACK goes out on our fastest link and the copy comes back on the peer's fastest:
        // about the lowest round trip, its variation, and a margin.
        let live = || {
            self.links
                .iter()
                .filter(|l| l.health.state() != LinkState::Down)
        };
        let fastest = live()
            .filter_map(|l| Some(l.health.srtt()? + 4 * l.health.rttvar()?))
            .min();
        let wait = fastest.unwrap_or(crate::reorder::INITIAL_TIMEOUT) + REPAIR_MARGIN;
        self.reorder.set_repair_wait(wait);
        // A NACK can come up to the reorder buffer's maximum wait after the packet behind the
        // hole arrived, plus a round trip: older packets are of no use.
        let slowest = live().filter_map(|l| l.health.srtt()).max();
        let age = slowest.unwrap_or(Duration::from_millis(500)) * 2 + self.cfg.reorder.max_timeout;
        self.ring.set_max_age(age.min(Duration::from_secs(3)));
        self.ring.expire(now);
    }

    /// Receiver: sends what the reorder buffer wants asked for again, in NACKs of up to
    /// [`MAX_NACK_RANGES`] ranges on the link with the lowest one-way delay.
    fn send_nacks(&mut self, now: Instant) {
        if !self.cfg.repair || self.session.is_none() {
            return;
        }
        self.reorder.scan_losses(now);
        let mut ranges = std::mem::take(&mut self.nack_ranges);
        ranges.clear();
        self.reorder.take_nacks(&mut ranges);
        if !ranges.is_empty() {
            if let Some(li) = self.fastest_link(now, None) {
                let mut buf = std::mem::take(&mut self.nack_buf);
                for chunk in ranges.chunks(MAX_NACK_RANGES) {
                    let common = self.next_common(now, li);
                    let Some(nack) = NackRepr::encode(common, chunk, &mut buf) else {
                        continue;
                    };
                    if self.send_sealed(now, li, PacketType::Nack, &Body::Nack(nack)) {
                        self.repair.nacks_sent += 1;
                    }
                }
                self.nack_buf = buf;
            }
        }
        self.nack_ranges = ranges;
    }

    /// The live link (not DOWN, and not `avoid` unless it is the only one) whose packets
    /// arrive soonest: lowest base one-way delay plus queueing, then lowest srtt.
    fn fastest_link(&self, now: Instant, avoid: Option<LinkId>) -> Option<usize> {
        let key = |&li: &usize| self.arrival_key(now, li);
        self.live_links(now, avoid).min_by_key(key).or_else(|| {
            (0..self.links.len())
                .filter(|&li| self.links[li].health.state() != LinkState::Down)
                .min_by_key(key)
        })
    }

    /// The links a copy may take: not DOWN, not silent (flagged or by the clock), not `avoid`.
    fn live_links(&self, now: Instant, avoid: Option<LinkId>) -> impl Iterator<Item = usize> + '_ {
        (0..self.links.len()).filter(move |&li| {
            let link = &self.links[li];
            link.health.state() != LinkState::Down
                && Some(link.id) != avoid
                && !link.silent
                && !self.is_silent(now, li)
        })
    }

    /// What [`fastest_link`](Self::fastest_link) orders links by, soonest first: the arrival
    /// delay, then the srtt.
    fn arrival_key(&self, now: Instant, li: usize) -> (Duration, Duration) {
        let srtt = self.links[li].health.srtt();
        (self.arrival_delay(now, li), srtt.unwrap_or(Duration::MAX))
    }

    /// How long after it is sent a packet on link index `li` reaches the peer: its base one-way
    /// delay and the queueing delay the peer last reported (as [`LinkView`] has them), or the
    /// queue the scheduler has put on the link since if that is longer. The peer's report is a
    /// round trip old: a burst of copies (a dead link's reinjections, a NACK's repairs) all took
    /// the one link that looked fastest and overflowed it (lab, 1+2+3 Mbit/s at 10 ms, the 3
    /// Mbit/s link lost: 32 copies, 116 ms queued on the 2 Mbit/s link while the 1 Mbit/s one had
    /// room, 13 dropped at its tail, and the inner TCP's stall 309 ms).
    fn arrival_delay(&self, now: Instant, li: usize) -> Duration {
        let min_rtt_all = self.links.iter().filter_map(|l| l.health.min_rtt()).min();
        let v = self.link_view(&self.links[li], min_rtt_all);
        let queued = self.sched.link_queue(now, v.id).unwrap_or(Duration::ZERO);
        v.owd + v.qdelay.max(queued)
    }

    /// How long a link may bring nothing before [`is_silent`](Self::is_silent) calls it silent:
    /// `max(3 x srtt, probe interval + 50 ms)`, or sooner for a busy link: twice the longest
    /// gap between its packets lately plus 10 ms, at least half its srtt and 50 ms (see
    /// [`SILENCE_GAP_SLACK`]). A link carrying the peer's ACKs every few ms is left within
    /// about one srtt after it died instead of three (lab, 1+2+3 Mbit/s with link 3 failed:
    /// stalls 293-1044 -> 196-336 ms), while one that brings only probes keeps the probe-based
    /// bound.
    fn silence_after(&self, li: usize) -> Duration {
        let link = &self.links[li];
        let floor = self.cfg.health.probe_interval + SILENCE_SLACK;
        let srtt = link.health.srtt();
        let slow = srtt.map_or(floor, |s| (3 * s).max(floor));
        // Only from gaps over a whole window (a link's first packets come in a burst).
        let Some(peak) = link.rx_gap_peak.settled_peak() else {
            return slow;
        };
        (2 * peak + SILENCE_GAP_SLACK)
            .max(SILENCE_MIN)
            .max(srtt.unwrap_or(floor) / 2)
            .min(slow)
    }

    /// Link index `li` has brought nothing (not even the peer's probes) for
    /// [`silence_after`](Self::silence_after): that bound, else `None`.
    fn quiet_after(&self, now: Instant, li: usize) -> Option<Duration> {
        let last = self.links[li].last_rx?;
        let after = self.silence_after(li);
        (now.saturating_duration_since(last) >= after).then_some(after)
    }

    /// Link index `li` has been quiet for `after` while another link brought something (within
    /// that link's own bound: a link that brings only probes must not make a busy one look
    /// alive and dead by turns).
    fn others_speak(&self, now: Instant, li: usize, after: Duration) -> bool {
        self.links.iter().enumerate().any(|(j, l)| {
            j != li
                && l.last_rx.is_some_and(|t| {
                    now.saturating_duration_since(t) < after.max(self.silence_after(j))
                })
        })
    }

    /// Link index `li` is quiet ([`quiet_after`](Self::quiet_after)) while the others speak
    /// ([`others_speak`](Self::others_speak)): it is most likely dead, and is avoided before
    /// its probes time out.
    fn is_silent(&self, now: Instant, li: usize) -> bool {
        self.cfg.repair
            && self
                .quiet_after(now, li)
                .is_some_and(|after| self.others_speak(now, li, after))
    }

    /// Marks links that fell silent (reinjecting what they carried lately) or spoke again.
    fn check_silence(&mut self, now: Instant) {
        for li in 0..self.links.len() {
            let quiet = self.quiet_after(now, li);
            if quiet.is_some() {
                self.links[li].silence_checked = self.links[li].last_rx;
            }
            let silent_after =
                quiet.filter(|&after| self.cfg.repair && self.others_speak(now, li, after));
            let link = self.links[li].id;
            if let (Some(after), false) = (silent_after, self.links[li].silent) {
                self.links[li].silent = true;
                self.events.push_back(Event::LinkSilent {
                    link,
                    silent: true,
                    after,
                });
                let rate = self.links[li].health.delivery_rate_bps();
                self.link_lost(now, li, rate);
                self.refresh_reorder_links(now);
            } else if quiet.is_none() && self.links[li].silent {
                self.speaks_again(now, li);
            }
        }
    }

    /// Link index `li`, silent, brought something: it is silent no more (only then, not when
    /// the others fall quiet too), and the reorder buffer waits for it again.
    fn speaks_again(&mut self, now: Instant, li: usize) {
        self.links[li].silent = false;
        // Its copies not sent yet are not needed: it delivers what it carried (lab, 50/20/7
        // Mbit/s at 10/60/150 ms, whose slow link falls silent now and then under CUBIC: 1434
        // copies sent in 20 s when they all went, 582 when they went at once).
        let id = self.links[li].id;
        let ring = &mut self.ring;
        self.reinjections
            .retain(|&seq| ring.get_mut(seq).is_some_and(|s| s.link != id));
        self.events.push_back(Event::LinkSilent {
            link: self.links[li].id,
            silent: false,
            after: Duration::ZERO,
        });
        self.refresh_reorder_links(now);
        self.link_back();
    }

    /// A link came back (UP, or speaking again): once every link is, the capacity lost is
    /// back, and the bundle's queue makes no more room for the senders' overshoot
    /// ([`BundleQueue::links_back`]; a busy link's false silence ends its room at once).
    fn link_back(&mut self) {
        let all = self
            .links
            .iter()
            .all(|l| !l.silent && l.health.state() != LinkState::Down);
        if all {
            self.queue.links_back();
            self.window.links_back();
        }
    }

    /// The reorder buffer's links ([`ReorderBuffer::set_links`]) again, at once rather than
    /// at the next tick: a link that fell silent no longer holds every gap for the hold time
    /// (rule (b) waits for every listed link to pass a gap, and a dead one never does), and
    /// one that spoke again is waited for again.
    fn refresh_reorder_links(&mut self, now: Instant) {
        let active: Vec<LinkId> = self
            .links
            .iter()
            .filter(|l| l.brings_data(now))
            .map(|l| l.id)
            .collect();
        self.reorder.set_links(&active);
    }

    /// Sender: a NACK: send the named sequence numbers again from the ring.
    fn handle_nack(&mut self, now: Instant, nack: &NackRepr<'_>) {
        if !self.cfg.repair {
            return;
        }
        self.repair.nacks_received += 1;
        let mut seqs = std::mem::take(&mut self.resend_seqs);
        seqs.clear();
        'ranges: for r in nack.ranges() {
            for k in 0..r.count as u64 {
                if seqs.len() >= MAX_RESEND_PER_NACK {
                    break 'ranges;
                }
                seqs.push(r.first.wrapping_add(k));
            }
        }
        self.serve_nacked(now, &seqs);
        self.resend_seqs = seqs;
    }

    /// Sender: a LINK-NACK: the DATA first sent in the named link seqs of that link, sent again.
    fn handle_link_nack(&mut self, now: Instant, nack: &LinkNackRepr) {
        // A link we do not have sent nothing to find (and would cost a scan of the whole ring).
        let Some(li) = self.link_index(nack.link).filter(|_| self.cfg.repair) else {
            return;
        };
        // The loss pull-back reads the link's own loss from these (`sched::PULLBACK_RECENT_PACKETS`),
        // under back-pressure only: without it the links left after a failure overflow while
        // their queue's peak is stale, and the peer names some of those drops random too (the
        // simulator's 1+2+3 Mbit/s failover, CUBIC upload: one of the two links left pulled
        // back, the flow stalled 335 ms against 157).
        if self.queue.on {
            self.links[li].health.on_random_loss(nack.count);
        }
        self.repair.nacks_received += 1;
        let mut seqs = std::mem::take(&mut self.resend_seqs);
        seqs.clear();
        self.ring
            .lost_on(nack.link, nack.first, nack.count, &mut seqs);
        self.serve_nacked(now, &seqs);
        self.resend_seqs = seqs;
    }

    /// Sends again the ring's packets `seqs` that a NACK or LINK-NACK asked for.
    fn serve_nacked(&mut self, now: Instant, seqs: &[u64]) {
        // A copy sent less than the least base round trip ago cannot have been missed yet: a
        // NACK for it left the peer before it could arrive (a LINK-NACK's copy, then the
        // gap's own NACK once every link passed it). The peer's repair wait is at least a
        // smoothed round trip, so a NACK repeated after the wait is always served.
        let min_rtt = self
            .links
            .iter()
            .filter(|l| l.health.state() != LinkState::Down)
            .filter_map(|l| l.health.min_rtt())
            .min()
            .unwrap_or(Duration::ZERO);
        let recent = min_rtt.max(MIN_RESEND_GAP);
        for &seq in seqs {
            // A sequence number is sent again as often as the receiver asks at most (its gap's
            // NACK up to `REPAIR_TRIES` times, and one LINK-NACK; it waits for each copy only
            // while it asks: a copy refused would leave it waiting for nothing), never while
            // its last copy may still be on its way (`recent`), and within the budget, which a
            // congestion burst soon exceeds.
            let allowed = self.ring.get_mut(seq).is_some_and(|s| {
                s.resends < crate::reorder::REPAIR_TRIES + 1
                    && s.resent_at
                        .is_none_or(|t| now.saturating_duration_since(t) >= recent)
            });
            if allowed && self.repair_budget >= 1.0 && self.resend(now, seq) {
                self.repair_budget -= 1.0;
                self.repair.retransmits_sent += 1;
            } else {
                self.repair.nack_unserved += 1;
            }
        }
    }

    /// The link a copy of a packet first sent on `original` goes on: the fastest live one
    /// ([`fastest_link`](Self::fastest_link), never `avoid` unless it is the only one), but
    /// another than `original` if that brings it at most [`COPY_SLACK`] later: a link that just
    /// lost a packet is the likeliest to lose the next (loss comes in bursts, and the loss
    /// estimate lags a second behind), and a second loss costs a whole repair round. Of two
    /// links of equal delay (the lab's pull-back test: 10 Mbit/s at 10 ms, one losing 10%), the
    /// fastest alone is whichever estimate is a hair lower at the moment.
    fn copy_link(&self, now: Instant, original: LinkId, avoid: Option<LinkId>) -> Option<usize> {
        let best = self.fastest_link(now, avoid)?;
        if self.links[best].id != original {
            return Some(best);
        }
        let other = self.fastest_link(now, Some(original))?;
        Some(
            if self.arrival_delay(now, other) <= self.arrival_delay(now, best) + COPY_SLACK {
                other
            } else {
                best
            },
        )
    }

    /// Under back-pressure, the link a dead link's copy goes on: of the `views` whose queue
    /// leaves room ([`Scheduler::has_room`]), the one it reaches the peer soonest on
    /// ([`fastest_link`](Self::fastest_link)'s order; that link when none is live). `None`:
    /// none has room. The soonest alone is not enough: the links' queues, as the placement
    /// plans them, bring their packets together at the peer's equalisation floor, so the
    /// fastest link left took every copy while a slower one had room (lab, 50/20/7 Mbit/s at
    /// 10/60/150 ms, the 50 Mbit/s link failed under CUBIC: 400 copies queued 108 ms on the 20
    /// Mbit/s link, past its 100 ms buffer, while the 7 Mbit/s link kept 18 ms; 55 dropped at
    /// its tail, their repairs and the inner TCP's own retransmissions behind the queues).
    fn copy_link_with_room(&mut self, now: Instant, views: &[LinkView]) -> Option<usize> {
        let mut live: Vec<(usize, (Duration, Duration))> = self
            .live_links(now, None)
            .map(|li| (li, self.arrival_key(now, li)))
            .collect();
        if live.is_empty() {
            return self.fastest_link(now, None);
        }
        // Stable: of equal keys the first link, as `fastest_link` takes.
        live.sort_by_key(|&(_, key)| key);
        live.into_iter()
            .map(|(li, _)| li)
            .find(|&li| self.sched.has_room(now, 1500, views, self.links[li].id))
    }

    /// Sends ring entry `seq` again, marked as a retransmission, on [`copy_link`](Self::copy_link)
    /// (from the second copy on, never the one it first went on while another is up), and
    /// counts it in that link's queue as the scheduler models it (so the next copy of a burst
    /// sees it there, [`Self::arrival_delay`]). False when it is not in the ring or was sent
    /// again lately.
    fn resend(&mut self, now: Instant, seq: u64) -> bool {
        let Some((li, len)) = self.resend_on(now, seq, None) else {
            return false;
        };
        self.sched.sent_copy(now, len, self.links[li].id);
        true
    }

    /// [`resend`](Self::resend): the link index the copy went on (link index `on`, else
    /// [`copy_link`](Self::copy_link)'s), and its length as the scheduler counts packets.
    fn resend_on(&mut self, now: Instant, seq: u64, on: Option<usize>) -> Option<(usize, usize)> {
        let sent = self.ring.get_mut(seq)?;
        // The first copy goes on the fastest link (the shortest stall), on the one that lost
        // the original only if no other is nearly as fast; a later one avoids that link, in
        // case it is dying.
        let avoid = sent.resent_at.map(|_| sent.link);
        let original = sent.link;
        sent.resent_at = Some(now);
        sent.resends += 1;
        let (piece_flags, ecn) = (sent.flags, sent.ecn);
        let packet = std::mem::take(&mut sent.packet);
        let mut sent_on = None;
        if let Some(li) = on.or_else(|| self.copy_link(now, original, avoid)) {
            let common = self.next_common(now, li);
            let body = Body::Data(DataRepr {
                common,
                seq,
                flags: FLAG_RETRANSMIT | piece_flags,
                payload: &packet,
            });
            if self.send_sealed_ecn(now, li, PacketType::Data, &body, ecn) {
                sent_on = Some(li);
            }
        }
        let len = packet.len() + WIRE_OVERHEAD;
        if let Some(sent) = self.ring.get_mut(seq) {
            sent.packet = packet;
        }
        sent_on.map(|li| (li, len))
    }

    /// Sender: link index `li` went DOWN or silent: what it carried lately that has not been sent again
    /// yet goes out on the other links (MPTCP's reinjection). "Lately": within its smoothed RTT
    /// and the time it took to declare it dead; what reached the peer before is dropped there
    /// as a duplicate.
    ///
    /// Most likely lost first: what was sent on it after the peer's last word came (less a
    /// one-way delay: when that word set out), then the older rest, each part in sequence
    /// order. The older packets may have reached the peer before the link died (the failure
    /// took only what was sent after it) or died in its queue; the newer ones are lost either
    /// way. Oldest first, the lost ones came last in the burst on the link left, behind up to
    /// a hundred copies the peer already had (simulator, 2 x 10 Mbit/s 20/120 ms losing the
    /// 20 ms link: 105 copies, 80 of them duplicates at the peer, the 25 others dropped by the
    /// full queue of the link left; the inner TCP stalled 636 ms until it sent them itself).
    /// Lost ones first, and delivered by the peer even when they come after it gave their gap
    /// up (`reorder`'s late packets): 445 ms.
    fn reinject(&mut self, now: Instant, li: usize) {
        if !self.cfg.repair || self.session.is_none() {
            return;
        }
        let link = &self.links[li];
        let detection = if link.silent {
            self.silence_after(li)
        } else {
            link.health.dead_after()
        };
        let window = link.health.srtt().unwrap_or(Duration::ZERO) + detection;
        let since = now.checked_sub(window).unwrap_or(self.epoch);
        let id = link.id;
        let owd = link.health.min_rtt().unwrap_or(Duration::ZERO) / 2;
        let first = link
            .last_rx
            .and_then(|t| t.checked_sub(owd))
            .unwrap_or(since);
        let mut seqs = std::mem::take(&mut self.resend_seqs);
        seqs.clear();
        self.ring.sent_on(id, since, first, &mut seqs);
        if self.queue.on {
            // Another link's copies may still wait (two failures within a round trip): no seq
            // twice. Else the list is empty, and a scan per seq would be quadratic at 1 Gbit/s.
            if self.reinjections.is_empty() {
                self.reinjections.extend(seqs.iter().copied());
            } else {
                for &seq in &seqs {
                    if !self.reinjections.contains(&seq) {
                        self.reinjections.push_back(seq);
                    }
                }
            }
            self.resend_seqs = seqs;
            self.drain_backlog(now);
            return;
        }
        for &seq in &seqs {
            // The link is DOWN, so `resend` does not pick it.
            if self.fresh_in_ring(seq) && self.resend(now, seq) {
                self.repair.reinjected += 1;
            }
        }
        self.resend_seqs = seqs;
    }

    /// Ring entry `seq` is there and has not been sent again yet.
    fn fresh_in_ring(&mut self, seq: u64) -> bool {
        self.ring
            .get_mut(seq)
            .is_some_and(|s| s.resent_at.is_none())
    }

    /// Under back-pressure, sends the reinjected copies waiting ([`Self::reinject`]) while the
    /// links have room, each accounted to its link's queue by the scheduler; false when they
    /// are full (the time to try again is set). Sent all at once, the copies of a dead link's
    /// last round trip overflowed the link left: lab, 10 Mbit/s links at 20 and 120 ms, the 20 ms
    /// link failed, 128 copies into the 120 ms link's 100 ms buffer with about 60 packets free,
    /// 53-64 dropped at its tail in every run, among them copies of packets the peer lacked,
    /// which the inner TCP then sent itself behind the bundle's queue (CUBIC stalled 1.1 s).
    fn send_reinjections(&mut self, now: Instant, views: &[LinkView]) -> bool {
        while let Some(&seq) = self.reinjections.front() {
            if self.session.is_none() {
                self.reinjections.clear();
                break;
            }
            let mut on = None;
            if self.queue.on {
                // Room on some link, but maybe not on one a copy may take: asked again soon.
                let wait = match self.links_full(now, views) {
                    Some(d) => Some(d),
                    None => {
                        on = self.copy_link_with_room(now, views);
                        on.is_none().then_some(Duration::from_millis(1))
                    }
                };
                if let Some(d) = wait {
                    self.queue.resume = Some(now + d);
                    return false;
                }
            }
            self.reinjections.pop_front();
            if !self.fresh_in_ring(seq) {
                continue;
            }
            if let Some((li, len)) = self.resend_on(now, seq, on) {
                self.sched.sent_copy(now, len, self.links[li].id);
                self.repair.reinjected += 1;
            }
        }
        true
    }

    /// Packets wait before the links: in the bundle's queue, or copies to reinject.
    fn backlog_waits(&self) -> bool {
        !self.queue.is_empty() || !self.reinjections.is_empty()
    }

    /// When to try the links again for what waits: never when nothing does. Every read of
    /// `queue.resume` goes through here. A time to try again left behind by a backlog that
    /// emptied some other way (a link that speaks again takes its copies back, a new session
    /// forgets them) was due forever and never cleared, since `handle_timeout` drains only a
    /// backlog: a runner asking `poll_timeout` spun (the simulator did, at one instant, from a
    /// 2-byte change in packet sizes on its LTE mix).
    fn queue_resume(&self) -> Option<Instant> {
        self.queue.resume.filter(|_| self.backlog_waits())
    }

    /// [`Self::drain_queue`] over the usable links as they are now.
    fn drain_backlog(&mut self, now: Instant) {
        let mut views = std::mem::take(&mut self.views);
        self.usable_views(&mut views);
        self.drain_queue(now, &views);
        self.views = views;
    }

    /// Link `li` died (down or silent) at `now`: what it carried is sent again on the others
    /// ([`Self::reinject`]), the receiver waits for those copies ([`Self::await_reinjection`]),
    /// and the bundle's queue expects its senders to overshoot for a while
    /// ([`BundleQueue::link_lost`]).
    /// `lost_bps`: what it delivered lately (its health forgets it when it goes DOWN).
    fn link_lost(&mut self, now: Instant, li: usize, lost_bps: f64) {
        self.await_reinjection(li);
        self.reinject(now, li);
        // The share of what the bundle delivered lately that the links left carry.
        let left: f64 = self
            .links
            .iter()
            .filter(|l| !l.silent && l.health.state() != LinkState::Down)
            .map(|l| l.health.delivery_rate_bps())
            .sum();
        let kept = if left + lost_bps > 0.0 {
            left / (left + lost_bps)
        } else {
            1.0
        };
        self.queue.link_lost(now, kept);
        self.window.link_lost(now);
    }

    /// Receiver: link index `li` fell silent or went DOWN. What it carried after its last DATA
    /// that arrived is most likely lost with it, and the peer sends it again on the links left
    /// ([`Self::reinject`], paced by back-pressure): those gaps are named for repair, so that they
    /// wait for the copies (NACKed, [`ReorderBuffer::set_repair_wait`] at a time) rather than
    /// being given up as soon as the links left have passed them. Given up, they reached the
    /// inner TCP as losses and the copies came late: lab, 10 Mbit/s links at 20 and 120 ms, the
    /// 20 ms link failed under CUBIC, the receiver skipped 60 gaps and delivered their copies
    /// out of order after the inner TCP had sent them again itself, behind the bundle's queue
    /// (a stall of 1.1 s). Only under back-pressure (this end's setting, which the ends of a
    /// bundle share by default): without it the copies go at once, the links left overflow,
    /// and what they drop, copies and new packets alike, would wait for repair too instead of
    /// reaching the inner TCP as the congestion it is (simulator, 1+2+3 Mbit/s losing the 3
    /// Mbit/s link, CUBIC upload: median longest stall 157 -> 283 ms).
    fn await_reinjection(&mut self, li: usize) {
        if !self.queue.on {
            return;
        }
        let Some(last) = self.links[li].rx_data_seq else {
            return;
        };
        let to = self.reorder.high_seq().saturating_add(SILENT_LINK_SLACK);
        let from = last
            .wrapping_add(1)
            .max(to.saturating_sub(self.reorder.capacity()));
        self.reorder.suspect_loss(from, to, true);
    }

    // ------------------------------------------------------------------ send

    /// Seals `body` for link index `li` under the current session and queues it.
    /// `ecn`: the outer ECN field ([`Transmit::ecn`]).
    fn queue_sealed(&mut self, li: usize, ptype: PacketType, body: &Body<'_>, ecn: u8) -> bool {
        let Some(session) = self.session.as_mut() else {
            return false;
        };
        let link = &self.links[li];
        let header = Header {
            ptype,
            link: link.id,
            session: session.remote_id,
            counter: session.send_counters.next(link.id),
        };
        let mut out = self
            .pool
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(BUF_CAPACITY));
        out.clear();
        let seal = if self.defer_seal {
            crypto::lay_out(&header, body, &mut out);
            Some(crypto::Seal::new(session.keys.send.clone(), &header))
        } else {
            crypto::seal(&session.keys.send, &header, body, &mut out);
            None
        };
        if self.cfg.role == Role::Server && self.links[li].addr.is_none() {
            self.recycle(out);
            return false;
        }
        self.push_transmit(li, out, seal, ecn);
        true
    }

    /// [`queue_sealed`](Self::queue_sealed) a control packet, then counts the datagram as sent
    /// on the link (its health sees the link sequence number and size, for loss and delivery
    /// rate). ECN-capable once the peer takes its links' marks (LINK-CE): a link's CoDel then
    /// marks its probes and acks rather than dropping them, and the marks count as the link's.
    fn send_sealed(&mut self, now: Instant, li: usize, ptype: PacketType, body: &Body<'_>) -> bool {
        let ecn = if self.cfg.ecn && self.peer_takes_ce {
            inner::ECN_ECT0
        } else {
            inner::ECN_NOT_ECT
        };
        self.send_sealed_ecn(now, li, ptype, body, ecn)
    }

    /// [`send_sealed`](Self::send_sealed) with the outer ECN field `ecn`.
    fn send_sealed_ecn(
        &mut self,
        now: Instant,
        li: usize,
        ptype: PacketType,
        body: &Body<'_>,
        ecn: u8,
    ) -> bool {
        if !self.queue_sealed(li, ptype, body, ecn) {
            return false;
        }
        self.count_sent(now, li, body.common().link_seq);
        true
    }

    /// The datagram just queued for link index `li` (the last transmit) goes into the link's
    /// health as sent with `link_seq`.
    fn count_sent(&mut self, now: Instant, li: usize, link_seq: u32) {
        let len = self.transmits.back().map_or(0, Transmit::wire_len);
        self.links[li].health.on_packet_sent(now, link_seq, len);
    }

    /// Queues a sealed datagram for link index `li`, counting it on the link.
    fn push_transmit(&mut self, li: usize, payload: Vec<u8>, seal: Option<crypto::Seal>, ecn: u8) {
        let link = &mut self.links[li];
        let t = Transmit {
            link: link.id,
            dst: link.addr,
            payload,
            seal,
            ecn,
        };
        link.tx_packets += 1;
        link.tx_bytes += t.wire_len() as u64;
        self.transmits.push_back(t);
    }

    fn next_common(&mut self, now: Instant, li: usize) -> Common {
        // The link seq is the counter the packet is about to be sealed with (low 32 bits).
        let counter = self
            .session
            .as_ref()
            .map_or(0, |s| s.send_counters.peek(self.links[li].id));
        Common {
            link_seq: counter as u32,
            ts: self.wire_ts(now),
        }
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
        if self.send_sealed(now, li, PacketType::Probe, &body) {
            self.links[li].health.on_probe_sent(now, probe_id);
        }
    }

    /// Client: tells the server each link's download bandwidth hint (LINK-INFO) when the
    /// session or the hint is new, [`LINK_INFO_COPIES`] times.
    fn send_link_infos(&mut self, now: Instant) {
        if self.cfg.role != Role::Client {
            return;
        }
        let Some(sid) = self.session.as_ref().map(|s| s.local_id) else {
            return;
        };
        for li in 0..self.links.len() {
            let link = &self.links[li];
            let hint = link.cfg.download_bps.unwrap_or(0).min(MAX_RATE_HINT_BPS);
            let copies = match link.info_sent {
                // Told this session: the remaining copies, a second apart.
                Some(s) if s.session == sid && s.hint == hint => (s.copies < LINK_INFO_COPIES
                    && now.saturating_duration_since(s.at) >= LINK_INFO_REPEAT)
                    .then_some(s.copies),
                // A new hint (or none any more) this session.
                Some(s) if s.session == sid => Some(0),
                // Not told this session: only a hint is worth telling.
                _ => (hint != 0).then_some(0),
            };
            let Some(copies) = copies else {
                continue;
            };
            if link.health.state() == LinkState::Down {
                continue;
            }
            let common = self.next_common(now, li);
            let body = Body::LinkInfo(wire::LinkInfoRepr {
                common,
                rate_to_you_bps: hint,
            });
            if self.send_sealed(now, li, PacketType::LinkInfo, &body) {
                self.links[li].info_sent = Some(InfoSent {
                    session: sid,
                    hint,
                    at: now,
                    copies: copies + 1,
                });
            }
        }
    }

    /// A PROBE padded to a datagram of `size` bytes, for path MTU discovery: its ack confirms
    /// the size. It is not a health probe (a lost one says nothing of the link's health).
    fn send_pmtu_probe(&mut self, now: Instant, li: usize, size: usize) {
        let fixed = wire::HEADER_LEN + wire::PROBE_LEN + wire::TAG_LEN;
        let padding = size.saturating_sub(fixed).min(wire::MAX_PROBE_PADDING) as u16;
        let common = self.next_common(now, li);
        let probe_id = self.links[li].next_probe_id;
        self.links[li].next_probe_id = probe_id.wrapping_add(1);
        let body = Body::Probe(ProbeRepr {
            common,
            probe_id,
            padding,
        });
        if self.send_sealed(now, li, PacketType::Probe, &body) {
            self.links[li].pmtu_probe = Some((probe_id, size));
        }
    }

    /// Answers a probe that arrived at `arrived`: the time it waited for us to read it is held
    /// (`hold_us`), so that the peer's round trip leaves out our late turns.
    fn send_probe_ack(&mut self, now: Instant, li: usize, probe: &ProbeRepr, arrived: Instant) {
        let common = self.next_common(now, li);
        let held = now.saturating_duration_since(arrived).as_micros();
        let mut ack = ProbeAckRepr {
            common,
            probe_id: probe.probe_id,
            echo_ts: probe.common.ts,
            hold_us: held.min(u32::MAX as u128) as u32,
            ..Default::default()
        };
        self.links[li].health.fill_report(now, &mut ack);
        ack.owd_offset_us = self.owd_offset_us(li);
        self.send_sealed(now, li, PacketType::ProbeAck, &Body::ProbeAck(ack));
        self.send_link_ce(now, li);
    }

    /// Receiver: a LINK-CE on link index `li` if its count of marks moved since the last one
    /// (at most one per [`LINK_CE_GAP`]; the count is cumulative, so a lost one is made good
    /// by the next), or if none went yet this session: the first says this end takes its own
    /// links' marks (`Endpoint::handle_link_ce`). Not with ECN off: no mark is read.
    fn send_link_ce(&mut self, now: Instant, li: usize) {
        if !self.cfg.ecn {
            return;
        }
        let ce = self.links[li].ce;
        // (None sent yet means none announced either.)
        let due = ce.announced < LINK_CE_ANNOUNCE
            || ce.sent.is_some_and(|(marks, at)| {
                marks != ce.rx_marks && now.saturating_duration_since(at) >= LINK_CE_GAP
            });
        if !due {
            return;
        }
        let body = Body::LinkCe(wire::LinkCeRepr {
            common: self.next_common(now, li),
            link: self.links[li].id,
            marks: ce.rx_marks,
        });
        if self.send_sealed(now, li, PacketType::LinkCe, &body) {
            let ce = &mut self.links[li].ce;
            ce.sent = Some((ce.rx_marks, now));
            ce.announced = ce.announced.saturating_add(1);
        }
    }

    /// Sender: the peer's count of our DATA marked CE on a link: the link's congestion signal
    /// for the scheduler ([`LinkView::ce_marks`]). Any LINK-CE says the peer takes the marks on
    /// what we receive too.
    fn handle_link_ce(&mut self, c: &wire::LinkCeRepr) {
        self.peer_takes_ce = true;
        if let Some(lj) = self.link_index(c.link) {
            let ce = &mut self.links[lj].ce;
            // Reordered reports: only a newer count counts.
            if c.marks.wrapping_sub(ce.peer_marks) as i32 > 0 {
                ce.peer_marks = c.marks;
            }
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
        LinkView {
            id: l.id,
            state: l.health.state(),
            priority: l.cfg.priority,
            bandwidth_bps: l.cfg.bandwidth_bps.or(l.peer_hint_bps),
            delivery_rate_bps: l.health.delivery_rate_bps(),
            srtt: l.health.srtt(),
            owd: one_way_delay(l, min_rtt_all),
            qdelay: l.health.qdelay(),
            loss: l.health.loss(),
            loss_basis_pps: Some(l.health.loss_basis_pps()),
            loss_tally: Some(l.health.loss_tally()),
            ce_marks: l.ce.peer_marks,
        }
    }

    /// An IP packet from the TUN device, to be carried to the peer. Under back-pressure a bulk
    /// packet (one equalisation holds, [`equalized`]) may wait in the bundle's queue first
    /// ([`Self::set_backpressure`]); the others never do.
    pub fn send_packet(&mut self, now: Instant, packet: &[u8]) {
        if self.session.is_none() || self.links.is_empty() {
            self.drops.no_session += 1;
            return;
        }
        self.tun_rx_packets += 1;
        self.tun_rx_bytes += packet.len() as u64;
        self.window.outbound(packet);
        let bulk = equalized(packet);
        if bulk {
            self.equalize_tx.on_traffic(now);
        }
        // The links as the scheduler sees them, once per packet (nothing here changes them).
        let mut views = std::mem::take(&mut self.views);
        self.usable_views(&mut views);
        // What equalisation does not hold (pure TCP ACKs, DNS, keystrokes, pings) does not wait
        // behind the bulk either: a loss-based flow keeps the queue full, up to three of its
        // round trips, and a ping or the ACKs of the other direction's flow would wait that
        // long (fq_codel's sparse flows, by packet kind). It goes on the links at once, as
        // without back-pressure; bulk that floods in small packets meets the links' buffers.
        if self.queue.on && bulk {
            if self.backlog_waits() {
                self.drain_queue(now, &views);
            }
            let resume = self.queue_resume();
            let full = if !self.backlog_waits() {
                self.links_full(now, &views)
            } else {
                resume.map(|t| t.saturating_duration_since(now))
            };
            if let Some(d) = full {
                let mut b = self.take_buf();
                b.extend_from_slice(packet);
                if let Some(old) = self.queue.push(now, b) {
                    self.drops.queue_delay += 1;
                    self.recycle(old);
                }
                self.queue.resume = Some(resume.unwrap_or(now + d));
                self.views = views;
                return;
            }
            self.queue.passed(now);
        }
        self.send_now(now, packet, &views);
        self.views = views;
    }

    /// Back-pressure (docs/scheduling.md, "Back-pressure"): while every link is full enough
    /// that a packet placed now would arrive late (see [`crate::sched::Scheduler::ready_in`]),
    /// the packets given to [`Self::send_packet`] wait in one queue before the bundle
    /// ([`crate::bqueue`]: bounded in time and size) rather than overfill the links' buffers.
    /// A new endpoint starts without it; a configured bundle has it unless told otherwise
    /// ([`DEFAULT_BACKPRESSURE`]). Turned off, what waits goes at the next
    /// [`Self::handle_timeout`].
    pub fn set_backpressure(&mut self, on: bool) {
        self.queue.on = on;
        if !on && self.backlog_waits() {
            self.queue.resume = Some(self.last_tick);
        }
    }

    /// Hands the bundle's queue on to the links (`views`) while they have room, oldest first,
    /// dropping packets that waited too long; when they are full, notes when to try again.
    fn drain_queue(&mut self, now: Instant, views: &[LinkView]) {
        self.queue.resume = None;
        // The copies of what a dead link carried are older than anything queued here.
        if !self.send_reinjections(now, views) {
            return;
        }
        // While a link's capacity is still being found, a full bundle is the scheduler's
        // ignorance, not the path's limit: nothing is dropped for waiting short of the hard
        // bound (`QUEUE_MAX_DELAY`; the size bound holds too).
        let learning = self.sched.learning();
        loop {
            while let Some(p) = if learning {
                self.queue.pop_expired(now)
            } else {
                self.queue.pop_stale(now)
            } {
                self.drops.queue_delay += 1;
                self.recycle(p);
            }
            if self.queue.is_empty() {
                return;
            }
            if self.session.is_none() || self.links.is_empty() {
                while let Some(p) = self.queue.discard() {
                    self.drops.no_session += 1;
                    self.recycle(p);
                }
                return;
            }
            if self.queue.on {
                if let Some(d) = self.links_full(now, views) {
                    self.queue.resume = Some(now + d);
                    return;
                }
            }
            if let Some(p) = self.queue.pop(now) {
                self.send_now(now, &p, views);
                self.recycle(p);
            }
        }
    }

    /// The outer ECN field of the DATA carrying `packet`. With a peer that takes its links'
    /// marks (LINK-CE) every DATA goes ECN-capable, as a QUIC tunnel's datagrams do for QUIC's
    /// own congestion control: a link's AQM then marks rather than drops even the packets of
    /// flows that did not negotiate ECN (most do not), the peer counts the marks, and this end
    /// backs that link off; ECT(1) stays ECT(1) (L4S). Else RFC 6040's copy
    /// ([`inner::encapsulate_ecn`]), or Not-ECT with ECN off.
    fn outer_ecn(&self, packet: &[u8]) -> u8 {
        if !self.cfg.ecn {
            inner::ECN_NOT_ECT
        } else if self.peer_takes_ce {
            match inner::ecn(packet) {
                Some(inner::ECN_ECT1) => inner::ECN_ECT1,
                _ => inner::ECN_ECT0,
            }
        } else {
            inner::encapsulate_ecn(packet)
        }
    }

    /// Schedules `packet` on the links now (`views`: [`Self::usable_views`]).
    fn send_now(&mut self, now: Instant, packet: &[u8], views: &[LinkView]) {
        let mut picks = std::mem::take(&mut self.picks);
        let flow = Self::flow_hash(packet);
        let ecn = self.outer_ecn(packet);
        // The payload as it crosses the tunnel (the packet, or its compressed encoding), written
        // once, after room for the DATA header: the last link it goes on seals it in place.
        let mut sealing = self.take_buf();
        sealing.extend_from_slice(&[0; wire::DATA_HEADER_LEN]);
        match self.session.as_mut() {
            Some(session) if self.cfg.compression => {
                session.compressor.compress(now, packet, &mut sealing);
            }
            _ => {
                self.compression.tx_plain += 1;
                sealing.extend_from_slice(packet);
            }
        }
        let payload_len = sealing.len() - wire::DATA_HEADER_LEN;
        // A payload too big for a link's path is cut to fit every link the scheduler may pick,
        // so that each piece goes wherever a packet would.
        let room = views
            .iter()
            .filter_map(|v| self.link_index(v.id))
            .map(|li| self.links[li].payload_room())
            .min()
            .unwrap_or(usize::MAX);
        if payload_len <= room {
            self.send_piece(now, sealing, (Piece::Whole, ecn), flow, views, &mut picks);
        } else {
            self.frag.tx_split += 1;
            for (range, piece) in frag::split(payload_len, room) {
                self.frag.tx_pieces += 1;
                let mut buf = self.take_buf();
                buf.extend_from_slice(&[0; wire::DATA_HEADER_LEN]);
                buf.extend_from_slice(
                    &sealing
                        [wire::DATA_HEADER_LEN + range.start..wire::DATA_HEADER_LEN + range.end],
                );
                // A piece the links cannot take dooms the packet: the rest need not go.
                if !self.send_piece(now, buf, (piece, ecn), flow, views, &mut picks) {
                    break;
                }
            }
            self.recycle(sealing);
        }
        self.picks = picks;
    }

    /// The scheduler's views of the links a packet may take: the usable ones (neither DOWN nor
    /// silent), or every link when none is.
    fn usable_views(&self, views: &mut Vec<LinkView>) {
        let min_rtt_all = self.links.iter().filter_map(|l| l.health.min_rtt()).min();
        views.clear();
        for l in &self.links {
            if l.health.state() != LinkState::Down && !l.silent {
                views.push(self.link_view(l, min_rtt_all));
            }
        }
        if views.is_empty() {
            for l in &self.links {
                views.push(self.link_view(l, min_rtt_all));
            }
        }
    }

    /// `Some(d)` when every link is full enough that a packet placed now would arrive late (see
    /// [`crate::sched::Scheduler::ready_in`]): room is expected in `d`.
    fn links_full(&mut self, now: Instant, views: &[LinkView]) -> Option<Duration> {
        if self.session.is_none() || self.links.is_empty() {
            return None;
        }
        // A full-size packet: what the device most likely holds next while the links are full.
        self.sched.ready_in(now, 1500, views)
    }

    /// Schedules and sends one DATA payload (a whole packet or a piece of one) under the next
    /// bundle sequence number. `sealing` holds the payload after [`wire::DATA_HEADER_LEN`] bytes of
    /// room: the last link it goes on seals it there, in place; its copies' outer ECN field is
    /// `ecn` ([`Self::outer_ecn`]). False if the scheduler dropped it (every link's queue full).
    fn send_piece(
        &mut self,
        now: Instant,
        sealing: Vec<u8>,
        (piece, ecn): (Piece, u8),
        flow: u64,
        views: &[LinkView],
        picks: &mut Vec<LinkId>,
    ) -> bool {
        picks.clear();
        let payload_len = sealing.len() - wire::DATA_HEADER_LEN;
        // Schedulers account what the packet costs on the wire (outer IPv4/UDP headers included),
        // the unit in which the peer reports delivery rates.
        self.sched
            .pick(now, payload_len + WIRE_OVERHEAD, flow, views, picks);
        if picks.is_empty() {
            // The scheduler dropped it: every link's queue is full.
            self.drops.queue_full += 1;
            self.recycle(sealing);
            return false;
        }
        let seq = self.next_data_seq;
        self.next_data_seq += 1;
        // Pieces are always ordered: the receiver glues them back in sequence order.
        let flags = if self.sched.ordered() || piece != Piece::Whole {
            piece.flags()
        } else {
            FLAG_UNORDERED
        };
        // A packet sent on several links at once (`redundant`, `backup` while probing) has its
        // copies already: reinjecting it when one of them dies only adds a burst on the others.
        if self.cfg.repair && flags & FLAG_UNORDERED == 0 && picks.len() == 1 {
            let held = self
                .ring
                .push(now, seq, picks[0], &sealing[wire::DATA_HEADER_LEN..]);
            if let Some(sent) = held {
                sent.flags = piece.flags();
                sent.ecn = ecn;
                // The counter `queue_data_in_place` seals it with below.
                if let Some(session) = &self.session {
                    sent.link_seq = session.send_counters.peek(picks[0]) as u32;
                }
            }
            self.repair_budget = (self.repair_budget + REPAIR_SHARE).min(REPAIR_BURST);
        }
        let mut sealing = Some(sealing);
        for (k, &id) in picks.iter().enumerate() {
            let Some(li) = self.link_index(id) else {
                continue;
            };
            let Some(buf) = sealing.take() else { break };
            // Every copy but the last is sealed from a copy of the plaintext.
            let buf = if k + 1 < picks.len() {
                let mut copy = self.take_buf();
                copy.extend_from_slice(&buf);
                sealing = Some(buf);
                copy
            } else {
                buf
            };
            let common = self.next_common(now, li);
            if self.queue_data_in_place(li, common, (seq, flags, ecn), buf) {
                self.count_sent(now, li, common.link_seq);
            }
        }
        if let Some(buf) = sealing {
            self.recycle(buf);
        }
        true
    }

    /// Seals DATA whose payload `buf` holds after [`wire::DATA_HEADER_LEN`] bytes of headroom, in
    /// place, for link index `li`, and queues it (as [`Self::queue_sealed`] does for a body).
    /// `(seq, flags, ecn)`: the DATA's sequence number and flags, the outer ECN field.
    fn queue_data_in_place(
        &mut self,
        li: usize,
        common: Common,
        (seq, flags, ecn): (u64, u8, u8),
        mut buf: Vec<u8>,
    ) -> bool {
        let link = &self.links[li];
        let Some(session) = self.session.as_mut() else {
            self.recycle(buf);
            return false;
        };
        if self.cfg.role == Role::Server && link.addr.is_none() {
            self.recycle(buf);
            return false;
        }
        let header = Header {
            ptype: PacketType::Data,
            link: link.id,
            session: session.remote_id,
            counter: session.send_counters.next(link.id),
        };
        let data = DataRepr {
            common,
            seq,
            flags,
            payload: &[],
        };
        let seal = if self.defer_seal {
            crypto::lay_out_data_in_place(&header, &data, &mut buf);
            Some(crypto::Seal::new(session.keys.send.clone(), &header))
        } else {
            crypto::seal_data_in_place(&session.keys.send, &header, &data, &mut buf);
            None
        };
        if ecn != inner::ECN_NOT_ECT {
            self.ecn.tx_ect += 1;
        }
        self.push_transmit(li, buf, seal, ecn);
        true
    }

    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// Deferred sealing: from now on, session datagrams come out of [`Self::poll_transmit`]
    /// laid out but not sealed, each with its [`crypto::Seal`] (key, link, counter assigned here,
    /// in order), so that a data plane can seal a batch on several cores and send each link's
    /// datagrams in order ([`Transmit::finish`] before sending). Handshake datagrams are sealed
    /// here as before. Off by default: then every datagram comes out sealed.
    pub fn set_deferred_sealing(&mut self, on: bool) {
        self.defer_seal = on;
    }

    /// Next IP packet for the TUN device, in order.
    /// DATA payloads are decompressed here, in delivery order; one that does not decompress is
    /// dropped (counted in the decompressor's stats) and the next one is tried.
    pub fn poll_deliver(&mut self, now: Instant) -> Option<Vec<u8>> {
        let p = loop {
            let (encoded, ecn) = if let Some(mut b) = self.direct.pop_front() {
                let mark = b.pop().unwrap_or(0);
                (b, mark >> MARK_ECN_SHIFT)
            } else if let Some(d) = self.reorder.pop_seq(now) {
                let (seq, late, mut b) = (d.seq, d.late, d.packet);
                let mark = b.pop().unwrap_or(0);
                let (piece, ecn) = (Piece::from_flags(mark), mark >> MARK_ECN_SHIFT);
                // A late packet (delivered out of order after its gap was given up) comes from
                // before whatever is being rebuilt: it must neither end that packet nor join it.
                if piece == Piece::Whole {
                    if !late {
                        // A whole packet ends any packet in progress (its pieces never came).
                        self.reassembler.abandon();
                        self.pieces_ecn = inner::ECN_NOT_ECT;
                    }
                    (b, ecn)
                } else if late {
                    // A piece of a packet given up: the pieces around it went long ago.
                    self.frag.rx_late_pieces += 1;
                    self.recycle(b);
                    continue;
                } else {
                    if piece == Piece::First {
                        self.pieces_ecn = inner::ECN_NOT_ECT;
                    }
                    self.pieces_ecn = inner::worse_ecn(self.pieces_ecn, ecn);
                    let whole = self.reassembler.push(now, seq, piece, &b);
                    self.recycle(b);
                    match whole {
                        Some(w) => (w, std::mem::take(&mut self.pieces_ecn)),
                        None => continue,
                    }
                }
            } else {
                break None;
            };
            let mut out = self.take_buf();
            // No session (the peer closed it): what is left cannot be decompressed.
            let (ok, feedback) = match self.session.as_mut() {
                Some(s) => (
                    s.decompressor.decompress(&encoded, &mut out).is_ok(),
                    s.decompressor.pending_feedback(),
                ),
                None => (false, 0),
            };
            self.recycle(encoded);
            if feedback >= MAX_FEEDBACK_BATCH {
                self.send_feedback(now);
            }
            // A peer that takes its links' marks (LINK-CE) has been told of this one: it
            // backs the link off, and the bundle's own queue tells the inner flows if the
            // bundle as a whole is full.
            let ecn = if ecn == inner::ECN_CE && self.peer_takes_ce {
                self.ecn.rx_ce_taken += 1;
                inner::ECN_NOT_ECT
            } else {
                ecn
            };
            if ok && inner::decapsulate_ecn(&mut out, ecn) {
                if ecn == inner::ECN_CE {
                    self.ecn.rx_ce += 1;
                }
                self.window.delivered(&mut out);
                break Some(out);
            }
            if ok {
                // RFC 6040: an outer CE over a Not-ECT inner packet is dropped (the loss the
                // path's queue would have made).
                self.ecn.rx_ce_dropped += 1;
            }
            self.recycle(out);
        };
        if p.is_none() {
            // Giving up the head gap may have asked for it again instead.
            self.send_nacks(now);
            // The end of a batch of deliveries: what the decompressor has to say goes now.
            self.send_feedback(now);
        }
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
            for (li, l) in self.links.iter().enumerate() {
                t = t.min(l.health.poll_timeout());
                if let (false, Some(last), true) = (l.silent, l.last_rx, self.cfg.repair) {
                    if l.silence_checked != Some(last) {
                        t = t.min(last + self.silence_after(li));
                    }
                }
            }
        }
        if let Some(r) = self.reorder.poll_timeout() {
            t = t.min(r);
        }
        if let Some(r) = self.queue_resume() {
            t = t.min(r);
        }
        Some(t)
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        if self.cfg.role == Role::Client {
            if self.hello.is_none() {
                let silent = self
                    .last_answer_rx
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
                let rate = self.links[li].health.delivery_rate_bps();
                if let Some(state) = self.links[li].health.handle_timeout(now) {
                    self.events.push_back(Event::LinkState {
                        link: self.links[li].id,
                        state,
                    });
                    if state == LinkState::Down {
                        self.link_lost(now, li, rate);
                        // The server forgets a link silent long enough: tell it again.
                        self.links[li].info_sent = None;
                    }
                }
                if now >= self.links[li].health.next_probe_at() {
                    let id = self.links[li].id;
                    self.send_probe(now, id);
                }
                if let Some(size) = self.links[li].pmtu.as_mut().and_then(|p| p.poll_probe(now)) {
                    self.send_pmtu_probe(now, li, size);
                }
            }
        }
        if now >= self.next_tick {
            self.tick(now);
        }
        if self.session.is_some() {
            self.check_silence(now);
        }
        if self.backlog_waits() {
            self.drain_backlog(now);
        }
        self.send_nacks(now);
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
        // link that is alive towards us (anything arrived lately, and not silent since), plus
        // their jitter. A link that carries data only now and then must be counted: leaving it
        // out makes its packets late (dropped), which the inner TCP takes for loss, so it never
        // offers enough to use it.
        // The same links define "every link has passed this gap" (a link that carries no data
        // never passes one, so such gaps wait for the hold time).
        let mut active: Vec<LinkId> = Vec::new();
        let mut owds: Vec<u32> = Vec::new();
        let mut bases: Vec<u32> = Vec::new();
        let mut jitter = Duration::ZERO;
        for l in &self.links {
            // Counted by what arrives from it, whatever our own health check says: a link we
            // declare DOWN (our probes go unanswered) may still carry the peer's packets.
            if l.brings_data(now) {
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
        self.keep_faster_silent(now, &mut bases);
        let min_rtt_all = self.links.iter().filter_map(|l| l.health.min_rtt()).min();
        let fastest = self
            .links
            .iter()
            .filter(|l| l.health.state() != LinkState::Down && !l.silent)
            .filter_map(|l| {
                l.health
                    .min_rtt()
                    .map(|r| (r, one_way_delay(l, min_rtt_all)))
            })
            .min_by_key(|&(r, _)| r);
        let rtt = fastest.map_or(Duration::ZERO, |(r, _)| r);
        self.hold.update(now, &bases, rtt);
        let lo = self.cap_sender_equalization(now, rtt, min_rtt_all);
        let inner_rtt = fastest.map(|(r, owd)| self.sent_round_trip(r, owd, lo));
        self.queue.set_round_trip(inner_rtt);
        let repairing = self.window.repairing(now, self.repair.nacks_received);
        // While the peer asks for repairs, its holes hold deliveries beyond the base
        // ([`REPAIR_ROUND_TRIPS`]). Not the links' jitter, nor the queue the placement keeps on
        // them: counted, they lifted the clamp past what a trapped sender's buffer holds
        // (ratio7: 4.5 MB, BBR never left its start-up; BENCHMARKS.md §4, "The window the
        // sender is told").
        let swing = if repairing {
            REPAIR_ROUND_TRIPS * rtt
        } else {
            Duration::ZERO
        };
        let clamp_rtt = inner_rtt.map(|r| r + swing);
        if let Some(r) = clamp_rtt {
            let queue = &mut self.queue;
            self.window.follow(now, r, || queue.take_least_wait());
        }
        self.window.cap = self.window_clamp(now, clamp_rtt);
        self.reorder
            .set_timeout(Duration::from_micros(spread_us) + 2 * jitter + REORDER_MARGIN);
        self.reorder.fit_window(now);
        self.tick_repair(now);
        self.send_link_infos(now);
        self.reassembler.poll(now, self.cfg.reassembly_timeout);
        if self.cfg.role == Role::Server {
            let forget = self.cfg.forget_link_after;
            self.links.retain(|l| {
                l.last_rx
                    .is_none_or(|t| now.saturating_duration_since(t) < forget)
            });
        }
    }

    /// The receive window to announce to our hosts' TCP senders ([`crate::rwnd`]): under
    /// back-pressure, once the scheduler knows every usable link's rate at least roughly, what
    /// the links' rates carry in [`crate::rwnd::CLAMP_BDPS`] inner round trips `rtt` (its
    /// base and its swing; [`crate::rwnd::AFTER_LOSS_BDPS`] for a while after a link was
    /// lost); `None` otherwise. Not while a link is in its start-up: its rate is
    /// a first guess (1 Mbit/s unless configured), and a window sized by it would hold the flow
    /// to it.
    fn window_clamp(&self, now: Instant, rtt: Option<Duration>) -> Option<u32> {
        if !self.cfg.clamp_window || !self.queue.on || !self.sched.rates_known() {
            return None;
        }
        let rtt = rtt?;
        let rate: f64 = self
            .links
            .iter()
            .filter(|l| l.health.state() != LinkState::Down && !l.silent)
            .filter_map(|l| self.sched.link_rate_bps(l.id))
            .sum();
        let products = self.window.products(now, rtt);
        crate::rwnd::clamp_bytes(rate, rtt.as_secs_f64(), products)
    }

    /// The inner flows' round trip for what we send, given the fastest usable link's minimum
    /// RTT `rtt` and one-way delay `owd`: there on that link held to the slowest's delay, back
    /// on it (the bundle's queue counts its limit in these).
    ///
    /// The bundle's queue holds what we send, so the hold is the peer's as we count on it,
    /// not ours: ours counts the links that bring us data,
    /// and falls when one falls silent towards us, which says nothing of the way we send
    /// (simulator: the way back of the 120 ms link of 20/120 ms lost for 0.4 s under a BBR
    /// download, our hold fell to 0, the queue's limit to 120 ms, and the 203 packets
    /// queued were dropped at once: the flow stood 10 s). That hold counts from the
    /// lowest delay of the links in our view, which may be a link just lost and still
    /// counted (`HOLD_KEEPS_LINK`): from the fastest usable link, it is that much less.
    /// `lo`: the lowest one-way delay of the links in our view of the peer's hold, which the
    /// hold counts from ([`Self::cap_sender_equalization`]).
    fn sent_round_trip(&self, rtt: Duration, owd: Duration, lo: Duration) -> Duration {
        rtt + self.equalize_send.saturating_sub(owd.saturating_sub(lo))
    }

    /// The hold the peer applies for now, as we send: what our view of the links calls for,
    /// grown under traffic only step by step ([`crate::equalize`]); the scheduler's to know.
    /// Over the links the peer's hold counts, as far as we can tell: every link not DOWN (a
    /// DEGRADED link too: leaving it out here made a link's flaps restart the ramp), silent or
    /// not, and one DOWN that we heard within [`HOLD_KEEPS_LINK`]. Silence and DOWN are what
    /// we hear on a link, the peer's traffic towards us, and a busy link falls silent or even
    /// DOWN whenever what comes back on it pauses; the peer's hold counts the link by what it
    /// gets from us there, which neither tells. A link truly lost leaves the scheduler's links
    /// at once all the same (`usable_views`), and a view above the peer's hold for a moment
    /// costs nothing then: the links left are placed by their own spread, which the peer's
    /// hold covers. Leaving such a link out made our view fall to no
    /// hold and climb back by steps, the link given nothing meanwhile (lab, 10 Mbit/s at 20 and
    /// 120 ms, BBR download, a PROBE_RTT at 33 s: the 120 ms link idle to the run's end, 69.6%
    /// of the sum over 60 s against 89-90%; simulator,
    /// `a_link_silent_for_a_moment_keeps_its_place`).
    ///
    /// A link counted for the first time this session whose delay we knew before our bulk
    /// traffic began is taken at once, not step by step ([`Self::new_in_hold_view`]).
    ///
    /// Returns the lowest one-way delay of the links in the view: the hold counts from it.
    /// `min_rtt_all`: the least minimum RTT of all links, which one-way delays count from
    /// ([`one_way_delay`]).
    fn cap_sender_equalization(
        &mut self,
        now: Instant,
        rtt: Duration,
        min_rtt_all: Option<Duration>,
    ) -> Duration {
        let mut views = std::mem::take(&mut self.views);
        views.clear();
        views.extend(
            self.links
                .iter()
                .filter(|l| l.health.state() != LinkState::Down || l.heard_lately(now))
                .map(|l| self.link_view(l, min_rtt_all)),
        );
        let counted = views.iter();
        let (lo, wanted) =
            crate::sched::equalize_want(counted.clone().map(|v| v.owd), self.cfg.equalize_max)
                .unwrap_or_default();
        let mut known_before_traffic = false;
        for v in counted {
            known_before_traffic |= self.new_in_hold_view(v.id);
        }
        self.views = views;
        if known_before_traffic {
            self.equalize_tx.take_next();
        }
        let cap = self.equalize_tx.allowed(now, wanted, rtt);
        self.equalize_send = cap;
        self.sched.cap_equalization((cap < wanted).then_some(cap));
        lo
    }

    /// Our view of the peer's hold counts link `id` (UP or DEGRADED, its delay offset reported
    /// by the peer) for the first time this session: true if we measured the link's delay
    /// before the bulk traffic going on began. Until the peer reports an offset the link counts
    /// as one as fast as the fastest, so a flow that began before that report made our ramp
    /// take the hold without the link as the flows' round trip, and the link's hold would then
    /// come step by step, 11 s apart: the sender kept off the link for 10-30 s. But the peer
    /// measured the link's delay from our probes at about the time we measured the other
    /// direction from its probes, and its own ramp took the whole hold at once if no bulk
    /// traffic had reached it by then: the flows going on most likely had that hold from their
    /// start. (Simulator, 2 x 10 Mbit/s at 20 and 120 ms, a CUBIC download started 150-700 ms
    /// into the session: the 120 ms link carried nothing and the flow got 22-45% of the sum,
    /// below the 20 ms link alone; now 59-67% from 200 ms on, the server having measured the
    /// link at 160 ms. The lab's spread100 CUBIC download fell to a third of the sum in 3 of
    /// 26 runs the same way.) A link the peer reports 0 for is as fast as the fastest or not
    /// measured yet: it does not count here until its offset comes.
    fn new_in_hold_view(&mut self, id: LinkId) -> bool {
        let began = self.equalize_tx.began();
        let Some(link) = self.link_index(id).map(|li| &mut self.links[li]) else {
            return false;
        };
        if link.in_hold_view || link.health.owd_offset().is_zero() {
            return false;
        }
        link.in_hold_view = true;
        link.health
            .base_known_at()
            .is_some_and(|k| began.is_none_or(|b| k <= b))
    }

    /// Adds to the hold's `bases` (those of the links that bring data) the base of a link
    /// fallen silent lately, while heard within [`HOLD_KEEPS_LINK`], if it is faster than every
    /// link that still speaks. The hold only delays packets that arrive before the target, so
    /// keeping a faster link's base changes nothing for the others' packets (the slower link's
    /// come at about the target anyway); leaving it out drops the target's reference and, with
    /// two links, the target itself, and a busy fast link falls silent for a moment whenever
    /// the inner flow pauses (a BBR flow's PROBE_RTT: 4 packets in flight for 200 ms and a
    /// round trip). Measured in the lab (20 Mbit/s at 20 ms + 5 Mbit/s at 300 ms, BBR upload):
    /// the 20 ms link silent for 85 ms in PROBE_RTT, the server's hold fell from 280 ms to
    /// nothing for a tick, its packets went through unheld, BBR took 65 ms for its minimum
    /// round trip where it had 320, and the hold came back by the ramp's first step (24 ms,
    /// 11 s to the next): the slow link carried 0.1-1.3 Mbit/s of its 5 from then on, the flow
    /// 13-20 Mbit/s where it had 23.5. A slower link fallen silent still leaves at once: its
    /// wait is what a failover takes off.
    fn keep_faster_silent(&self, now: Instant, bases: &mut Vec<u32>) {
        let Some(&first) = bases.first() else {
            return;
        };
        let rel = |b: u32| b.wrapping_sub(first) as i32;
        let lo = bases.iter().map(|&b| rel(b)).min().unwrap_or(0);
        bases.extend(
            self.links
                .iter()
                .filter(|l| l.silent && l.heard_lately(now))
                .filter_map(|l| l.health.base_rel_owd())
                .filter(|&b| rel(b) < lo),
        );
    }

    /// Says goodbye (CLOSE on every link); drain `poll_transmit` afterwards.
    pub fn close(&mut self, now: Instant) {
        if self.session.is_some() {
            for li in 0..self.links.len() {
                let common = self.next_common(now, li);
                self.queue_sealed(
                    li,
                    PacketType::Close,
                    &Body::Close(common),
                    inner::ECN_NOT_ECT,
                );
            }
        }
        self.end_session();
        self.pending = None;
        self.hello = None;
        self.next_hello = None;
    }

    pub fn stats(&self, now: Instant) -> BundleStats {
        let us = |d: Option<Duration>| d.map(|d| d.as_micros() as u64);
        BundleStats {
            role: self.cfg.role,
            scheduler: self.cfg.scheduler.clone(),
            session: self.session.as_ref().map(|s| s.local_id),
            cipher: self.session.as_ref().map(|s| s.cipher.name()),
            links: self
                .links
                .iter()
                .map(|l| LinkStats {
                    id: l.id,
                    name: l.cfg.name.clone(),
                    state: l.health.state(),
                    addr: l.addr,
                    bandwidth_bps: l.cfg.bandwidth_bps.or(l.peer_hint_bps),
                    download_bandwidth_bps: l.cfg.download_bps,
                    priority: l.cfg.priority,
                    srtt_us: us(l.health.srtt()),
                    rttvar_us: us(l.health.rttvar()),
                    min_rtt_us: us(l.health.min_rtt()),
                    loss: l.health.loss(),
                    delivery_rate_bps: l.health.delivery_rate_bps(),
                    sched_rate_bps: self.sched.link_rate_bps(l.id),
                    sched_queue_us: us(self.sched.link_queue(now, l.id)),
                    pulled_back: self.sched.link_pulled_back(l.id),
                    qdelay_us: l.health.qdelay().as_micros() as u64,
                    tx_packets: l.tx_packets,
                    tx_bytes: l.tx_bytes,
                    rx_packets: l.rx_packets,
                    rx_bytes: l.rx_bytes,
                    tx_rate_bps: l.tx_meter.bps,
                    rx_rate_bps: l.rx_meter.bps,
                    pmtu: l.pmtu.as_ref().map(|p| p.mtu()),
                    tx_ce_marked: l.ce.peer_marks,
                    rx_ce_marked: l.ce.rx_marks,
                })
                .collect(),
            tun_rx_packets: self.tun_rx_packets,
            tun_rx_bytes: self.tun_rx_bytes,
            tun_tx_packets: self.tun_tx_packets,
            tun_tx_bytes: self.tun_tx_bytes,
            reorder: self.reorder.stats().clone(),
            reorder_depth: self.reorder.depth(),
            reorder_timeout_us: self.reorder.timeout().as_micros() as u64,
            backpressure: self.queue.on,
            queue_depth: self.queue.len(),
            queued: self.queue.queued,
            queue_marked: self.queue.marked,
            queue_limit_us: self.queue.max_delay(now).as_micros() as u64,
            queue_stood: self.queue.standing.found,
            window_clamp_bytes: self.window.cap,
            window_clamped: self.window.clamped,
            window_flows_learned: self.window.flows_learned,
            equalize_us: self.hold.add().as_micros() as u64,
            equalize_wanted_us: self.hold.wanted().as_micros() as u64,
            equalize_send_us: self.equalize_send.as_micros() as u64,
            drops: self.drops.clone(),
            repair: RepairStats {
                ring_packets: self.ring.len(),
                ring_bytes: self.ring.bytes(),
                ..self.repair.clone()
            },
            compression: {
                let mut c = self.compression.clone();
                if let Some(s) = &self.session {
                    c.add(&s.compressor.stats(), &s.decompressor.stats());
                }
                c
            },
            frag: {
                let r = self.reassembler.stats();
                FragStats {
                    rx_reassembled: r.reassembled,
                    rx_dropped_incomplete: r.dropped_incomplete,
                    rx_dropped_orphans: r.dropped_orphans,
                    rx_dropped_oversize: r.dropped_oversize,
                    ..self.frag.clone()
                }
            },
            ecn: self.ecn.clone(),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The copies waiting for a link that speaks again are taken back (`speaks_again`); if
    /// nothing else waits, the time to try again goes with them. Left behind, it was due
    /// forever: `handle_timeout` drains only a backlog, so nothing cleared it and the
    /// simulator spun at one instant (LTE mix, BBR download, back-pressure, seed 4).
    #[test]
    fn copies_taken_back_leave_no_time_to_try_again() {
        let now = Instant::now();
        let rng = Box::new(<rand_chacha::ChaCha8Rng as rand_core::SeedableRng>::seed_from_u64(1));
        let mut ep = Endpoint::new(Config::new(Role::Client, [7; 32]), now, rng).unwrap();
        ep.set_backpressure(true);
        for id in [1, 2] {
            let cfg = LinkConfig {
                name: format!("l{id}"),
                ..Default::default()
            };
            ep.add_link(now, id, cfg).unwrap();
        }
        let li = ep.link_index(2).unwrap();
        ep.links[li].silent = true;
        ep.ring.push(now, 5, 2, &[0x45; 40]);
        ep.reinjections.push_back(5);
        let soon = now + Duration::from_millis(3);
        ep.queue.resume = Some(soon);
        assert_eq!(ep.queue_resume(), Some(soon), "a copy waits");
        assert!(ep.poll_timeout().is_some_and(|t| t <= soon));
        ep.speaks_again(now, li);
        assert!(!ep.backlog_waits(), "its only copy was link 2's");
        assert_eq!(ep.queue_resume(), None);
        // Handled past the old time, nothing of it is due again.
        let later = soon + Duration::from_millis(1);
        ep.handle_timeout(later);
        assert!(
            ep.poll_timeout().is_none_or(|t| t > later),
            "{:?}",
            ep.poll_timeout().map(|t| t - now)
        );
    }

    #[test]
    fn a_window_count_covers_one_or_two_windows_then_forgets() {
        let t0 = Instant::now();
        let w = Duration::from_secs(5);
        let s = Duration::from_secs;
        let mut c = WindowCount::default();
        assert_eq!(c.add(t0, 2, w), 2);
        assert_eq!(c.add(t0 + s(4), 1, w), 3, "the same window");
        // A new window: the last one's count still adds.
        assert_eq!(c.add(t0 + s(6), 0, w), 3);
        assert_eq!(c.add(t0 + s(7), 1, w), 4);
        // The window after: only the last one's count (1) is left.
        assert_eq!(c.add(t0 + s(12), 0, w), 1);
        // Two whole windows without an event: nothing is left.
        assert_eq!(c.add(t0 + s(30), 0, w), 0);
    }

    #[test]
    fn a_window_count_added_to_now_and_then_keeps_to_whole_windows() {
        let t0 = Instant::now();
        let w = Duration::from_secs(5);
        let s = Duration::from_secs;
        let mut c = WindowCount::default();
        assert_eq!(c.add(t0, 1, w), 1);
        // Windows [0, 5), [5, 10): the first event is still in the one before.
        assert_eq!(c.add(t0 + s(9), 1, w), 2);
        // [10, 15): the event at 0 is out, the one at 9 in.
        assert_eq!(c.add(t0 + s(13), 1, w), 2);
        // [15, 20): the one at 13 is in the window before; 9 is out.
        assert_eq!(c.add(t0 + s(17), 0, w), 1);
        // [25, 30): nothing in the last two windows.
        assert_eq!(c.add(t0 + s(26), 0, w), 0);
        // A peak the same way.
        let mut p = PeakHold::default();
        let ms = Duration::from_millis;
        assert_eq!(p.update(t0, ms(30), w), ms(30));
        assert_eq!(p.settled_peak(), None, "no whole window behind it yet");
        assert_eq!(p.update(t0 + s(6), ms(10), w), ms(30));
        assert_eq!(p.settled_peak(), Some(ms(30)));
        assert_eq!(p.update(t0 + s(11), ms(5), w), ms(10));
    }
}
