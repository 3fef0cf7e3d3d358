//! The `braid up` event loop: one thread, one `mio` poll over the TUN device, the link sockets,
//! a waker for control commands and a signal pipe, with the endpoint's `poll_timeout` as the
//! poll timeout. Everything moves in batches:
//!
//! 1. TUN readable: read up to [`BATCH`] packets -> `Endpoint::send_packet` each;
//! 2. socket readable: one `recvmmsg` of up to [`BATCH`] messages -> `handle_datagram` each
//!    (with helper threads and a batch of [`crate::workers::PARALLEL_MIN`] datagrams or more:
//!    checked in order, opened in parallel parts, committed in order; see `receive_shared`);
//! 3. `poll_transmit` drained into per-socket queues -> one `sendmmsg` per socket;
//! 4. `poll_deliver` drained -> TUN writes; `poll_event` -> log lines.
//!
//! Link sockets follow their uplink: a netlink notice (address or interface change) or send
//! errors make the runner open a fresh socket per link and keep it if it is tied to a new address
//! or device (see `Runner::relink`).
//!
//! Readiness is edge-triggered: a source that filled a whole batch stays "ready" and is served
//! again on the next turn (after the others), so one busy source cannot starve the rest. A link
//! socket is watched for writability only while datagrams wait for room in it.
//!
//! This is the data plane. The control plane ([`crate::control`]: control socket, metrics
//! server) runs on other threads and reaches it only through typed commands; it renders status
//! and metrics itself from a snapshot the loop hands over.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::Read;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use braid_core::endpoint::RxMeta;
use braid_core::endpoint::{BundleStats, Config as EpConfig, EndpointError, Event, Role};
use braid_core::wire::CipherId;
use braid_core::{BatchJob, Endpoint, LinkConfig, LinkId, LinkState, Received, Transmit};

use crate::engine::Engine;
use braid_linux::tun::Tun;
use braid_linux::udp::{
    self as udp, BindOptions, Datagram, RecvBatch, RecvDatagram, UdpSocket, BATCH, DEFAULT_BUFFER,
};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};

use crate::config::{Config, LinkSpec};
use crate::control::{Command, Commands, Handle, LinkAddReq, LinkInfo, Reply, Snapshot};
use crate::workers::Workers;

const TUN: Token = Token(0);
const WAKER: Token = Token(1);
const SIGNAL: Token = Token(2);
const NETLINK: Token = Token(3);
const FIRST_SOCKET: usize = 16;
/// Datagrams a socket may hold waiting for buffer space before new ones are dropped.
const MAX_PENDING: usize = 4096;
/// After a netlink notice, how long to let a burst of them (address deleted, added, routes) settle
/// before the link sockets are checked.
const RELINK_SETTLE: Duration = Duration::from_millis(100);
/// Backoff between attempts to reopen a link socket that fails to send or to open.
const RETRY_MIN: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(4);

struct Sock {
    sock: UdpSocket,
    /// The client link this socket carries (`None`: the server's listening socket).
    link: Option<LinkId>,
    readable: bool,
    /// Datagrams waiting for buffer space, each with the local address to send it from.
    pending: VecDeque<(Transmit, Option<IpAddr>)>,
    /// Server on a wildcard address: per link, the peer address and the local address (IP_PKTINFO)
    /// of its last authenticated packet; that link's replies go from there. Learned only from
    /// what the core authenticated ([`Received::Link`]), so spoofed datagrams cannot move it.
    reply_from: HashMap<LinkId, (SocketAddr, IpAddr)>,
    /// HELLOs of this turn that authenticated: their HELLO-ACK goes from the local address the
    /// HELLO came to. Emptied at every flush (a replayed HELLO teaches nothing lasting).
    hello_from: HashMap<SocketAddr, IpAddr>,
    /// The last receive error (ICMP unreachable on a connected client socket).
    last_recv_error: Option<String>,
    /// Send errors since the last log line about them.
    send_errors: u64,
    last_send_error: Option<String>,
    /// Client link: what the socket is tied to; a change means it must be reopened.
    binding: Binding,
    /// Client link: when to try reopening it (after send errors or a failed reopen), and the
    /// backoff that led there (doubles up to [`RETRY_MAX`], reset when the link is UP).
    retry_at: Option<Instant>,
    backoff: Duration,
    /// Registered for writability (while `pending` is not empty).
    writable_watched: bool,
    /// Scratch: the datagrams of one `send_batch` (empty between uses; no allocation per batch).
    scratch: Vec<Datagram<'static>>,
    /// What the last [`Sock::send_pending`] did, for the data-plane thread to act on.
    outcome: SendOutcome,
    /// How many datagrams `pending` held when this flush began.
    queued_before: usize,
}

/// What one socket's flush did: how many datagrams from the front of `pending` left or failed
/// for good (their buffers go back to the core), and the last error.
#[derive(Default)]
struct SendOutcome {
    done: usize,
    failed: usize,
    last_error: Option<std::io::Error>,
}

/// What a connected link socket is tied to: the local address the kernel chose (or the one it
/// was bound to) and the index of its device. An uplink that gets a new address, or a modem
/// unplugged and plugged back (same name, new index), changes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Binding {
    local: Option<IpAddr>,
    ifindex: Option<u32>,
}

impl Binding {
    fn of(sock: &UdpSocket, spec: &LinkSpec) -> Binding {
        Binding {
            local: sock.local_addr().ok().map(|a| a.ip()),
            ifindex: spec
                .dev
                .as_deref()
                .and_then(|d| nix::net::if_::if_nametoindex(d).ok()),
        }
    }
}

/// The sockets polled, by token.
type Sockets = HashMap<Token, Sock>;
/// A client's links by id: the token of each one's socket, and its configuration.
type LinkTable = BTreeMap<LinkId, (Token, LinkSpec)>;

/// A running endpoint: its I/O and the sans-I/O core.
pub struct Runner {
    cfg: Config,
    ep: Engine,
    poll: Poll,
    tun: Tun,
    socks: Sockets,
    /// Client: link id -> its socket's token and its spec.
    links: LinkTable,
    next_token: usize,
    next_link_id: LinkId,
    cmd_rx: Commands,
    handle: Handle,
    signal_rx: UnixStream,
    tun_ready: bool,
    recv: RecvBatch,
    /// The clocks as each socket is read, to place the kernel's arrival stamps on ours.
    read_clock: udp::ReadClock,
    started: Instant,
    session_seen: bool,
    tun_write_errors: u64,
    tun_full_drops: u64,
    udp_drops: u64,
    last_auth_warn: (Instant, u64),
    /// Client: interface and address changes (`None` if netlink refused; then only send
    /// errors lead to a reopen).
    monitor: Option<braid_linux::netlink::Monitor>,
    /// Client: when to check every link socket's binding (set by a netlink notice).
    relink_at: Option<Instant>,
    /// Scratch list kept across turns (no allocation per batch): the readable sockets of this
    /// turn.
    ready_tokens: Vec<Token>,
    /// Helper threads that seal, send and open alongside this one (see [`crate::workers`]).
    workers: Workers,
    /// Scratch list kept across turns: a receive batch's datagrams waiting to be opened and
    /// committed (empty between uses).
    opening: Vec<RxJob<'static>>,
    /// Datagrams opened in parallel parts on the helper threads (metrics).
    opened_in_parallel: u64,
    /// Per link: the datagram room the kernel last reported for its route (route MTU less the
    /// outer headers), told to the endpoint's path MTU discovery.
    path_mtus: HashMap<LinkId, usize>,
    /// Read the route MTUs now (a send was refused as too big, a link was learned).
    mtu_check_due: bool,
}

/// A client's prefixes as one line, for logs.
fn prefixes_text(spec: &braid_core::concentrator::ClientSpec) -> String {
    let all: Vec<String> = spec.prefixes().iter().map(|p| p.to_string()).collect();
    all.join(", ")
}

/// Why the loop stopped.
pub enum Exit {
    Signal,
}

fn open_link_socket(spec: &LinkSpec) -> anyhow::Result<UdpSocket> {
    let opts = BindOptions {
        dev: spec.dev.clone(),
        addr: spec.bind,
        ipv6: spec.remote.is_ipv6(),
        buffer_bytes: DEFAULT_BUFFER,
        pktinfo: false,
        gro: true,
        dont_fragment: true,
        timestamps: true,
        ecn: true,
    };
    let mut s = UdpSocket::bind(&opts).map_err(|e| anyhow::anyhow!("link {}: {e}", spec.name))?;
    s.connect(spec.remote)
        .map_err(|e| anyhow::anyhow!("link {}: {e}", spec.name))?;
    Ok(s)
}

/// The core endpoint's configuration from the file's.
fn endpoint_config(cfg: &Config) -> EpConfig {
    let mut ep_cfg = EpConfig::new(cfg.role, cfg.psk);
    // `auto`: propose AES-256-GCM if this CPU runs it in hardware, and take the server's
    // answer; a fixed cipher is insisted on.
    ep_cfg.cipher_auto = cfg.cipher.is_none();
    ep_cfg.cipher = cfg.cipher.unwrap_or(if ep_cfg.local_fast_aes {
        CipherId::Aes256Gcm
    } else {
        CipherId::ChaCha20Poly1305
    });
    ep_cfg.scheduler = cfg.scheduler.clone();
    if let Some(p) = cfg.probe_interval {
        ep_cfg.health.probe_interval = p;
    }
    if let Some(d) = cfg.down_after {
        ep_cfg.health.down_after = d;
    }
    if let Some(e) = cfg.equalize_max {
        ep_cfg.equalize_max = e;
    }
    ep_cfg.compression = cfg.compression;
    ep_cfg.ecn = cfg.ecn;
    ep_cfg.hold_random_loss = cfg.hold_random_loss;
    ep_cfg.clamp_window = cfg.clamp_window;
    ep_cfg.route_id = cfg.route_id;
    // Client with per-client keys: the server's key is the one peer.
    ep_cfg.identity = cfg.identity.as_ref().and_then(|i| {
        Some(braid_core::endpoint::Identity {
            own: i.own.clone(),
            peer: i.server?,
            v4: None,
            v6: None,
        })
    });
    if let Some(w) = cfg.reorder_window_max {
        ep_cfg.reorder.capacity = w;
    }
    if let Some(m) = cfg.reorder_max {
        ep_cfg.reorder.max_timeout = m;
        ep_cfg.reorder.min_timeout = ep_cfg.reorder.min_timeout.min(m);
    }
    ep_cfg
}

/// The sans-I/O engine: one endpoint, or a concentrator with one per `[[client]]`.
fn build_engine(cfg: &Config, now: Instant) -> anyhow::Result<Engine> {
    use rand::SeedableRng;
    let ep_cfg = endpoint_config(cfg);
    let rng = Box::new(rand::rngs::StdRng::from_entropy());
    let sites = cfg
        .identity
        .as_ref()
        .filter(|i| cfg.role == Role::Server && !i.clients.is_empty());
    let in_file = |e: &dyn std::fmt::Display| anyhow::anyhow!("{}: {e}", cfg.path.display());
    Ok(match sites {
        Some(id) => {
            let mut c = braid_core::concentrator::Concentrator::new(ep_cfg, id.own.clone(), rng);
            for spec in &id.clients {
                c.add_client(now, spec.clone()).map_err(|e| in_file(&e))?;
            }
            Engine::Sites(Box::new(c))
        }
        None => Engine::Bundle(Box::new(
            Endpoint::new(ep_cfg, now, rng).map_err(|e| in_file(&e))?,
        )),
    })
}

/// A client's link sockets, keyed by poll token from [`FIRST_SOCKET`] on, and its links by id
/// (with their tokens); a server's one listening socket.
fn open_sockets(cfg: &Config) -> anyhow::Result<(Sockets, LinkTable)> {
    let mut socks = HashMap::new();
    let mut links = BTreeMap::new();
    match cfg.role {
        Role::Server => {
            let listen = cfg.listen.expect("validated: server has listen");
            // A wildcard listener on a multi-homed server must answer each link from the
            // address the client sent to, or the client's connected socket drops the reply.
            let opts = BindOptions {
                addr: Some(listen),
                buffer_bytes: DEFAULT_BUFFER,
                pktinfo: listen.ip().is_unspecified(),
                gro: true,
                dont_fragment: true,
                timestamps: true,
                ecn: true,
                ..Default::default()
            };
            let s = UdpSocket::bind(&opts)
                .map_err(|e| anyhow::anyhow!("{}: listen {listen}: {e}", cfg.path.display()))?;
            socks.insert(Token(FIRST_SOCKET), Sock::new(s, None));
        }
        Role::Client => {
            for (token, spec) in (FIRST_SOCKET..).map(Token).zip(&cfg.links) {
                // Errors found only now (an address not on this host) name the file too.
                let s = open_link_socket(spec)
                    .map_err(|e| anyhow::anyhow!("{}: {e:#}", cfg.path.display()))?;
                let mut sock = Sock::new(s, Some(spec.id));
                sock.binding = Binding::of(&sock.sock, spec);
                socks.insert(token, sock);
                links.insert(spec.id, (token, spec.clone()));
            }
        }
    }
    Ok((socks, links))
}

/// The TUN device, up with its addresses, MTU and queue length.
fn open_tun(cfg: &Config) -> anyhow::Result<Tun> {
    let tun = Tun::open(&cfg.name)?;
    let addrs: Vec<_> = cfg.addresses.iter().map(|a| (a.ip, a.prefix)).collect();
    let failed = |e| anyhow::anyhow!("cannot configure TUN device {}: {e}", cfg.name);
    braid_linux::netlink::configure(&cfg.name, &addrs, cfg.mtu).map_err(failed)?;
    braid_linux::netlink::set_txqueuelen(&cfg.name, cfg.txqueuelen).map_err(failed)?;
    Ok(tun)
}

/// A client's netlink monitor of address changes, registered with `poll`; none (with a
/// warning) where the kernel refuses one.
fn open_monitor(poll: &Poll) -> anyhow::Result<Option<braid_linux::netlink::Monitor>> {
    match braid_linux::netlink::Monitor::open() {
        Ok(m) => {
            poll.registry()
                .register(&mut SourceFd(&m.as_raw_fd()), NETLINK, Interest::READABLE)?;
            Ok(Some(m))
        }
        Err(e) => {
            tracing::warn!("no netlink notices of address changes ({e}): link sockets are reopened after send errors only");
            Ok(None)
        }
    }
}

/// SIGINT and SIGTERM as bytes on a pipe registered with `poll` (its reading end).
fn signal_pipe(poll: &Poll) -> anyhow::Result<UnixStream> {
    let (signal_tx, signal_rx) = UnixStream::pair()?;
    signal_rx.set_nonblocking(true)?;
    signal_tx.set_nonblocking(true)?;
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::low_level::pipe::register(sig, signal_tx.try_clone()?)?;
    }
    poll.registry().register(
        &mut SourceFd(&signal_rx.as_raw_fd()),
        SIGNAL,
        Interest::READABLE,
    )?;
    Ok(signal_rx)
}

impl Runner {
    /// Opens sockets, the TUN device (configured through netlink) and the core endpoint.
    pub fn new(cfg: Config) -> anyhow::Result<Runner> {
        let now = Instant::now();
        let mut ep = build_engine(&cfg, now)?;
        // A concentrator's endpoints seal as they go (no deferred sealing there yet): helper
        // threads would only be woken for nothing.
        let threads = if matches!(ep, Engine::Sites(_)) {
            1
        } else {
            cfg.workers
        };
        let workers = Workers::new(threads)?;
        if workers.threads() > 1 {
            // Sealing happens at the flush, in parallel (see `crate::workers`).
            if let Some(ep) = ep.endpoint_mut() {
                ep.set_deferred_sealing(true);
            }
        }
        ep.set_backpressure(cfg.backpressure);
        tracing::debug!(
            "data plane: {} thread(s) seal, send and open",
            workers.threads()
        );
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let (handle, cmd_rx) = Handle::new(Arc::new(cfg.clone()), waker);

        // Sockets first: a bad interface or address fails before the TUN device exists.
        let (socks, links) = open_sockets(&cfg)?;
        let next_token = FIRST_SOCKET + socks.len();
        let tun = open_tun(&cfg)?;
        poll.registry()
            .register(&mut SourceFd(&tun.as_raw_fd()), TUN, Interest::READABLE)?;
        for (t, s) in &socks {
            poll.registry()
                .register(&mut SourceFd(&s.sock.as_raw_fd()), *t, Interest::READABLE)?;
        }
        for (id, (_, spec)) in &links {
            ep.endpoint_mut()
                .expect("a client drives one endpoint")
                .add_link(now, *id, link_config(spec))
                .map_err(|e| anyhow::anyhow!("link {}: {e}", spec.name))?;
        }
        let monitor = match cfg.role {
            Role::Client => open_monitor(&poll)?,
            Role::Server => None,
        };
        let signal_rx = signal_pipe(&poll)?;

        let next_link_id = cfg.links.iter().map(|l| l.id).max().unwrap_or(0) + 1;
        let runner = Runner {
            handle,
            cfg,
            ep,
            poll,
            tun,
            socks,
            links,
            next_token,
            next_link_id,
            cmd_rx,
            signal_rx,
            tun_ready: true,
            recv: RecvBatch::new(BATCH),
            read_clock: udp::ReadClock::default(),
            started: now,
            session_seen: false,
            tun_write_errors: 0,
            tun_full_drops: 0,
            udp_drops: 0,
            last_auth_warn: (now, 0),
            monitor,
            relink_at: None,
            ready_tokens: Vec::with_capacity(16),
            workers,
            opening: Vec::with_capacity(BATCH),
            opened_in_parallel: 0,
            path_mtus: HashMap::new(),
            mtu_check_due: true,
        };
        // A concentrator routes its clients' prefixes into the TUN device.
        let specs: Vec<_> = match &runner.ep {
            Engine::Sites(c) => c.client_specs().cloned().collect(),
            Engine::Bundle(_) => Vec::new(),
        };
        for spec in &specs {
            runner.install_routes(spec);
        }
        Ok(runner)
    }

    pub fn handle(&self) -> Handle {
        self.handle.clone()
    }

    /// Runs until SIGINT/SIGTERM (`Ok`) or a fatal condition (`Err`, e.g. no session in time).
    ///
    /// The clock is read right after the poll, and again as each socket is read (see
    /// [`read_sockets`](Self::read_sockets)); the steps after that go on from the last
    /// reading, so time never runs backwards for the core. The next poll's timeout is reckoned
    /// from it (late by at most the turn's own work, which is zero-timeout polling anyway
    /// while a source is busy).
    pub fn run(&mut self) -> anyhow::Result<Exit> {
        if !self.cfg.batch_wait.is_zero() {
            // Short sleeps must end on time: the default slack (50 us) is as long as the wait.
            if let Err(e) = braid_linux::process::set_timer_slack(1_000) {
                tracing::debug!("cannot set the timer slack: {e}");
            }
        }
        let mut events = Events::with_capacity(256);
        let mut now = Instant::now();
        let mut next_check = now + Duration::from_secs(1);
        loop {
            let busy = self.tun_ready || self.socks.values().any(|s| s.readable);
            let timeout = self.poll_timeout(now, next_check, busy);
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e.into());
                }
            }
            let mut signalled = false;
            let mut woke_for_data = false;
            let mut netlink = false;
            for ev in events.iter() {
                match ev.token() {
                    TUN => {
                        self.tun_ready = true;
                        woke_for_data = true;
                    }
                    WAKER => {}
                    NETLINK => netlink = true,
                    SIGNAL => {
                        let mut b = [0u8; 16];
                        while matches!((&self.signal_rx).read(&mut b), Ok(n) if n > 0) {}
                        signalled = true;
                    }
                    t => {
                        if let Some(s) = self.socks.get_mut(&t) {
                            // A writable event needs nothing here: what waits in `pending` is
                            // sent below.
                            if ev.is_readable() || ev.is_error() {
                                s.readable = true;
                                woke_for_data = true;
                            }
                        }
                    }
                }
            }
            if !signalled && !busy && woke_for_data {
                self.wait_for_batch();
            }
            now = Instant::now();
            if signalled {
                tracing::info!(
                    "signal received: closing the session and removing {}",
                    self.cfg.name
                );
                self.shutdown(now);
                return Ok(Exit::Signal);
            }
            if netlink {
                self.on_netlink(now);
            }
            self.serve_commands(now);
            self.relink(now);
            self.read_tun(now);
            self.flush_transmits(now);
            // The clock as the last socket was read: the rest of the turn goes on from it.
            now = self.read_sockets(now);
            if self.ep.poll_timeout().is_some_and(|t| t <= now) {
                self.ep.handle_timeout(now);
            }
            self.flush_transmits(now);
            if self.mtu_check_due {
                self.check_path_mtus(now);
            }
            self.deliver(now);
            self.log_events();
            if now >= next_check {
                next_check = now + Duration::from_secs(1);
                self.check_path_mtus(now);
                self.check(now)?;
            }
        }
    }

    /// How long the next poll may sleep: not at all while a source has more to give (`busy`),
    /// else until the core's next timer, the next once-a-second check or the next link socket
    /// check.
    fn poll_timeout(&self, now: Instant, next_check: Instant, busy: bool) -> Duration {
        if busy {
            return Duration::ZERO;
        }
        let mut until = self
            .ep
            .poll_timeout()
            .unwrap_or(now + Duration::from_secs(1))
            .min(next_check);
        if let Some(t) = self.next_relink() {
            until = until.min(t);
        }
        until.saturating_duration_since(now)
    }

    /// Netlink says an interface or address changed: check the link sockets once the burst of
    /// notices has settled.
    fn on_netlink(&mut self, now: Instant) {
        match self.monitor.as_ref().map(|m| m.drain()) {
            Some(Ok(true)) => {
                self.relink_at.get_or_insert(now + RELINK_SETTLE);
            }
            Some(Err(e)) => tracing::debug!("netlink notices: {e}"),
            _ => {}
        }
    }

    /// NAPI's trade as a setting (`batch_wait_us`): woken from idle by a packet, the data plane
    /// sleeps up to `batch_wait` (never past its next timer) so that more packets wait in the
    /// TUN and the sockets and go in one batch: fewer wake-ups and system calls per packet at
    /// high packet rates, for up to `batch_wait` more latency per hop. Not after a turn that
    /// filled a whole batch (`busy`): then a full batch is ready anyway. (The one turn in which
    /// the clock is read twice: once for the wait, once after it.)
    fn wait_for_batch(&self) {
        if self.cfg.batch_wait.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut until = now + self.cfg.batch_wait;
        if let Some(t) = self.ep.poll_timeout() {
            until = until.min(t);
        }
        let d = until.saturating_duration_since(now);
        if !d.is_zero() {
            std::thread::sleep(d);
        }
    }

    /// The earliest time a link socket is due for a check or a reopen attempt.
    fn next_relink(&self) -> Option<Instant> {
        let retries = self.socks.values().filter_map(|s| s.retry_at);
        retries.chain(self.relink_at).min()
    }

    /// Reopens the client link sockets that need it. After a netlink notice every link is
    /// checked: a fresh socket is opened as the configuration says and replaces the old one if
    /// its [`Binding`] differs (new address, device re-created), else it is dropped. A link due
    /// for a retry (send errors) is reopened whatever its binding. A socket that cannot be
    /// opened now (device or address missing) keeps the old one and retries with backoff.
    /// The server learns the new source address from the next authenticated packet.
    fn relink(&mut self, now: Instant) {
        let all = self.relink_at.is_some_and(|t| t <= now);
        if all {
            self.relink_at = None;
        }
        let due: Vec<(LinkId, Token, LinkSpec)> = self
            .links
            .iter()
            .filter(|(_, (tok, _))| {
                all || self
                    .socks
                    .get(tok)
                    .and_then(|s| s.retry_at)
                    .is_some_and(|t| t <= now)
            })
            .map(|(id, (tok, spec))| (*id, *tok, spec.clone()))
            .collect();
        for (_, tok, spec) in due {
            let Some(s) = self.socks.get_mut(&tok) else {
                continue;
            };
            let forced = s.retry_at.is_some_and(|t| t <= now);
            s.retry_at = None;
            let fresh = match open_link_socket(&spec) {
                Ok(f) => f,
                Err(e) => {
                    s.schedule_retry(now);
                    tracing::debug!("link {}: cannot reopen yet: {e:#}", spec.name);
                    continue;
                }
            };
            let binding = Binding::of(&fresh, &spec);
            if !forced && binding == s.binding {
                continue;
            }
            let registry = self.poll.registry();
            let _ = registry.deregister(&mut SourceFd(&s.sock.as_raw_fd()));
            if let Err(e) =
                registry.register(&mut SourceFd(&fresh.as_raw_fd()), tok, Interest::READABLE)
            {
                tracing::warn!("link {}: cannot poll its new socket: {e}", spec.name);
                let _ =
                    registry.register(&mut SourceFd(&s.sock.as_raw_fd()), tok, Interest::READABLE);
                s.writable_watched = false;
                s.schedule_retry(now);
                continue;
            }
            let show = |b: Binding| b.local.map_or("no address".to_string(), |a| a.to_string());
            tracing::info!(
                "link {}: socket reopened ({} -> {})",
                spec.name,
                show(s.binding),
                show(binding)
            );
            s.sock = fresh;
            s.binding = binding;
            s.readable = true;
            s.writable_watched = false; // registered afresh, for reading only
            s.last_recv_error = None;
        }
    }

    fn read_tun(&mut self, now: Instant) {
        if !self.tun_ready {
            return;
        }
        // Each packet goes from the device's read buffer straight into the endpoint, which
        // compresses it into the buffer it seals in place (or, under back-pressure, may keep it
        // in the bundle's queue while every link is full).
        let ep = &mut self.ep;
        match self.tun.recv_each(BATCH, |p| ep.send_packet(now, p)) {
            Ok(n) if n < BATCH => self.tun_ready = false,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!("TUN {}: read failed: {e}", self.cfg.name);
                self.tun_ready = false;
            }
        }
    }

    /// Reads every readable socket once; returns the clock as the last one was read (each
    /// batch is handled at the time it was read, its datagrams stamped with their arrival).
    fn read_sockets(&mut self, mut now: Instant) -> Instant {
        let mut tokens = std::mem::take(&mut self.ready_tokens);
        tokens.clear();
        tokens.extend(
            self.socks
                .iter()
                .filter(|(_, s)| s.readable)
                .map(|(t, _)| *t),
        );
        for &t in &tokens {
            let Some(s) = self.socks.get_mut(&t) else {
                continue;
            };
            let r = s.sock.recv_batch(&mut self.recv);
            // The clocks as the datagrams are read, to place the kernel's arrival stamps (wall
            // clock) on ours: `now` was read before this turn's other work, and a datagram
            // that arrived since would look early by that much.
            let reading = self.read_clock.read(now);
            now = reading.at;
            if let Some(e) = self.recv.take_error() {
                s.last_recv_error = Some(e.to_string());
            }
            match r {
                Ok(n) => {
                    if !self.recv.is_full() {
                        s.readable = false;
                    }
                    let via = s.link;
                    // A concentrator has no endpoint of its own here: it stays inline.
                    match self.ep.endpoint_mut() {
                        Some(ep) if self.workers.parts(n) > 1 => {
                            let mut opening = reuse(std::mem::take(&mut self.opening));
                            let batch = self.recv.datagrams_mut();
                            let shared = receive_shared(
                                now,
                                ep,
                                &self.workers,
                                &mut opening,
                                s,
                                batch.map(|d| {
                                    let rx = RxMeta {
                                        arrived: reading.arrival(d.stamp),
                                        ecn: d.ecn,
                                    };
                                    (rx, d)
                                }),
                            );
                            self.opened_in_parallel += shared;
                            self.opening = reuse(opening);
                        }
                        _ => {
                            for i in 0..n {
                                let local = self.recv.local(i);
                                let rx = RxMeta {
                                    arrived: reading.arrival(self.recv.stamp(i)),
                                    ecn: self.recv.ecn(i),
                                };
                                let Some((from, bytes)) = self.recv.get_mut(i) else {
                                    continue;
                                };
                                let got = self.ep.handle_datagram_at(now, rx, via, from, bytes);
                                s.note_received(got, from, local);
                            }
                        }
                    }
                }
                Err(e) => {
                    s.readable = false;
                    tracing::debug!("receive on {}: {e}", self.sock_name(t));
                }
            }
        }
        self.ready_tokens = tokens;
        now
    }

    fn sock_name(&self, t: Token) -> String {
        match self.socks.get(&t).and_then(|s| s.link) {
            Some(id) => format!("link {}", self.link_name(id)),
            None => "the listening socket".to_string(),
        }
    }

    fn link_name(&self, id: LinkId) -> String {
        if let Some(label) = self.ep.link_label(id) {
            return label;
        }
        match self.links.get(&id) {
            Some((_, spec)) => spec.name.clone(),
            None => format!("link{id}"),
        }
    }

    /// Moves the endpoint's datagrams into per-socket queues and sends each queue in batches. A
    /// socket whose queue the kernel could not take whole is watched for writability until it
    /// is empty again (and only then: a writable socket would wake every poll).
    fn flush_transmits(&mut self, now: Instant) {
        let listen = if self.cfg.role == Role::Server {
            self.socks.keys().next().copied()
        } else {
            None
        };
        // What each socket still held from earlier flushes (oldest first, left as it is).
        for s in self.socks.values_mut() {
            s.queued_before = s.pending.len();
        }
        while let Some(t) = self.ep.poll_transmit() {
            let tok = match self.cfg.role {
                Role::Server => listen,
                Role::Client => self.links.get(&t.link).map(|(tok, _)| *tok),
            };
            match tok.and_then(|tok| self.socks.get_mut(&tok)) {
                Some(s) if s.pending.len() < MAX_PENDING => {
                    let src = s.reply_src(&t);
                    s.pending.push_back((t, src));
                }
                _ => {
                    self.udp_drops += 1;
                    self.ep.recycle(t.payload);
                }
            }
        }
        for s in self.socks.values_mut() {
            s.hello_from.clear();
            if s.link.is_none() {
                let old = s.queued_before;
                group_by_destination(&mut s.pending.make_contiguous()[old..]);
            }
        }
        // Seal (if deferred) and send, on the helper threads too when there are any.
        if self.workers.threads() == 1 {
            // One thread (the default on 2 cores): no deferred sealing, nothing to share.
            for s in self.socks.values_mut().filter(|s| !s.pending.is_empty()) {
                s.outcome = s.send_pending();
            }
        } else {
            self.seal_and_send_shared();
        }
        // Back on this thread alone: buffers return to the core, send errors are acted on.
        let mut dead_socks = Vec::new();
        for (tok, s) in self.socks.iter_mut() {
            let o = std::mem::take(&mut s.outcome);
            for (t, _) in s.pending.drain(..o.done) {
                self.ep.recycle(t.payload);
            }
            if o.failed > 0 {
                s.send_errors += o.failed as u64;
                let code = o.last_error.as_ref().and_then(|e| e.raw_os_error());
                // The route's MTU went down (ICMP from the path, or a smaller interface): read
                // it at once.
                self.mtu_check_due |= code == Some(libc::EMSGSIZE);
                let gone = code.is_some_and(|c| {
                    matches!(
                        c,
                        libc::ENETDOWN | libc::ENETUNREACH | libc::ENODEV | libc::ENXIO
                    )
                });
                if gone {
                    dead_socks.push(*tok);
                }
                // The socket may be tied to an address or device that is gone: try a new one
                // (with backoff) until sends succeed again.
                let stale = code.is_some_and(|c| matches!(c, libc::EADDRNOTAVAIL | libc::EINVAL));
                if s.link.is_some() && (gone || stale) && s.retry_at.is_none() {
                    s.schedule_retry(now);
                }
                s.last_send_error = o.last_error.map(|e| e.to_string());
            }
            s.watch_writable(&self.poll, *tok);
        }
        if !dead_socks.is_empty() {
            // The kernel says the uplink's network is gone: take the link out of the bundle now
            // rather than after its probes go unanswered.
            let ids: Vec<LinkId> = self
                .links
                .iter()
                .filter(|(_, (t, _))| dead_socks.contains(t))
                .map(|(id, _)| *id)
                .collect();
            for id in ids {
                if let Some(ep) = self.ep.endpoint_mut() {
                    ep.handle_link_error(now, id);
                }
            }
        }
    }

    /// The flush's sealing and sending with helper threads: one busy queue (the server's socket,
    /// a one-link client) is sealed in parts and then sent; several are sealed and sent one per
    /// thread.
    fn seal_and_send_shared(&mut self) {
        let workers = &self.workers;
        let mut busy: Vec<&mut Sock> = self
            .socks
            .values_mut()
            .filter(|s| !s.pending.is_empty())
            .collect();
        if let [s] = busy.as_mut_slice() {
            seal_all(workers, s.pending.make_contiguous());
            s.outcome = s.send_pending();
        } else {
            workers.for_each(busy, |s| {
                s.pending.iter_mut().for_each(|(t, _)| t.finish());
                s.outcome = s.send_pending();
            });
        }
    }

    fn deliver(&mut self, now: Instant) {
        while let Some(p) = self.ep.poll_deliver(now) {
            self.tun.queue(&p);
            self.ep.recycle(p);
        }
        let f = self.tun.flush();
        self.tun_write_errors += f.errors as u64;
        self.tun_full_drops += f.queue_full as u64;
    }

    fn log_events(&mut self) {
        while let Some((client, ev)) = self.ep.poll_event() {
            match ev {
                Event::SessionUp { session } => {
                    self.session_seen = true;
                    match &client {
                        Some(c) => tracing::info!("client {c}: session {session:08x} up"),
                        None => tracing::info!(
                            "session {session:08x} up: tunnel {} ({}) is ready",
                            self.cfg.name,
                            self.cfg.addresses_text()
                        ),
                    }
                }
                Event::SessionClosed => match &client {
                    Some(c) => {
                        tracing::warn!("client {c}: session closed by the client (or replaced)")
                    }
                    None => tracing::warn!("session closed by the peer (or replaced)"),
                },
                Event::LinkState { link, state } => {
                    let name = self.link_name(link);
                    match state {
                        LinkState::Up => {
                            if let Some((tok, _)) = self.links.get(&link) {
                                if let Some(s) = self.socks.get_mut(tok) {
                                    s.backoff = Duration::ZERO;
                                }
                            }
                            tracing::info!("link {name}: up")
                        }
                        LinkState::Degraded => tracing::warn!("link {name}: degraded (loss)"),
                        LinkState::Down => tracing::warn!("link {name}: down"),
                    }
                }
                // Debug, not info: a busy link also falls quiet for a moment when the peer's
                // transfer on it ends (the gaps lately were short), which is no news.
                Event::LinkSilent {
                    link,
                    silent: true,
                    after,
                } => tracing::debug!(
                    "link {}: nothing from it for {} ms while the others deliver: left until it speaks again",
                    self.link_name(link),
                    after.as_millis()
                ),
                Event::LinkSilent { link, .. } => {
                    tracing::debug!("link {}: speaks again", self.link_name(link))
                }
                Event::LinkLearned { link, addr } => {
                    tracing::info!("link {} learned: client at {addr}", self.link_name(link));
                    self.mtu_check_due = true;
                }
                Event::Addresses { v4, v6 } => self.take_addresses(v4, v6),
                Event::VersionMismatch { theirs, ours } => tracing::error!(
                    "the peer speaks braid wire protocol version {theirs}, this braid speaks \
                     version {ours}: run the same braid release at both ends"
                ),
            }
        }
    }

    /// Client with per-client keys and no `address` of its own: the server gave the tunnel
    /// addresses in the handshake; the TUN device takes them (again after a new session, in
    /// case the server's configuration changed).
    fn take_addresses(
        &mut self,
        v4: Option<(std::net::Ipv4Addr, u8)>,
        v6: Option<(std::net::Ipv6Addr, u8)>,
    ) {
        if !self.cfg.addresses.is_empty() {
            return;
        }
        let given: Vec<(std::net::IpAddr, u8)> = v4
            .map(|(a, l)| (a.into(), l))
            .into_iter()
            .chain(v6.map(|(a, l)| (a.into(), l)))
            .collect();
        if given.is_empty() {
            tracing::warn!("the server gave this client no tunnel address (set address in its [[client]], or here)");
            return;
        }
        match braid_linux::netlink::configure(&self.cfg.name, &given, self.cfg.mtu) {
            Ok(()) => {
                let text: Vec<String> = given.iter().map(|(a, l)| format!("{a}/{l}")).collect();
                tracing::info!(
                    "tunnel {}: address {} from the server",
                    self.cfg.name,
                    text.join(", ")
                );
            }
            Err(e) => tracing::error!("cannot give {} the server's addresses: {e}", self.cfg.name),
        }
    }

    /// Reads each link's route MTU from the kernel (client: its connected socket; server: the
    /// route to the client's address) and tells the endpoint: a first value or a higher one
    /// (a wider interface, an expired ICMP report) starts path MTU discovery from it; a lower one
    /// (ICMP "fragmentation needed", a narrower interface) lowers the link's path MTU at once.
    fn check_path_mtus(&mut self, now: Instant) {
        self.mtu_check_due = false;
        let mut routes: Vec<(LinkId, std::io::Result<usize>, usize)> = Vec::new();
        match self.cfg.role {
            Role::Client => {
                for (id, (tok, spec)) in &self.links {
                    if let Some(s) = self.socks.get(tok) {
                        let hdr = braid_linux::udp::ip_udp_overhead(spec.remote);
                        routes.push((*id, s.sock.path_mtu(), hdr));
                    }
                }
            }
            Role::Server => {
                for (id, addr) in self.ep.link_addrs(now) {
                    let hdr = braid_linux::udp::ip_udp_overhead(addr);
                    routes.push((id, braid_linux::udp::route_mtu(addr), hdr));
                }
            }
        }
        self.path_mtus
            .retain(|id, _| routes.iter().any(|r| r.0 == *id));
        for (id, mtu, hdr) in routes {
            let Ok(mtu) = mtu else { continue };
            let room = mtu.saturating_sub(hdr);
            match self.path_mtus.insert(id, room) {
                Some(old) if room < old => {
                    tracing::info!(
                        "link {}: route MTU down to {mtu}, datagrams of {room} bytes at most",
                        self.link_name(id)
                    );
                    self.ep.handle_too_big(now, id, room);
                }
                Some(old) if room == old => {}
                _ => self.ep.set_link_mtu(id, room),
            }
        }
    }

    /// Once a second: failures that deserve a log line (or an exit).
    fn check(&mut self, now: Instant) -> anyhow::Result<()> {
        for (t, s) in self.socks.iter_mut() {
            if s.send_errors > 0 {
                let name = match s.link {
                    Some(id) => self
                        .links
                        .get(&id)
                        .map(|(_, sp)| format!("link {}", sp.name))
                        .unwrap_or_default(),
                    None => "listening socket".into(),
                };
                tracing::debug!(
                    token = t.0,
                    "{name}: {} datagrams not sent: {}",
                    s.send_errors,
                    s.last_send_error.as_deref().unwrap_or("?")
                );
                s.send_errors = 0;
            }
        }
        if self.ep.is_connected() {
            return Ok(());
        }
        let auth = self.ep.auth_drops(now);
        let waited = now.saturating_duration_since(self.started);
        if auth > self.last_auth_warn.1
            && now.saturating_duration_since(self.last_auth_warn.0) >= Duration::from_secs(3)
        {
            tracing::error!(
                "authentication fails: {auth} datagrams from the peer did not authenticate (the two ends do not use the same key)"
            );
            self.last_auth_warn = (now, auth);
        }
        if self.cfg.role == Role::Client && !self.session_seen {
            if let Some(limit) = self.cfg.connect_timeout {
                if waited >= limit {
                    if auth > 0 {
                        anyhow::bail!(
                            "no session with the server after {}s: authentication fails ({auth} datagrams did not authenticate: the two ends do not use the same key)",
                            limit.as_secs()
                        );
                    }
                    let tried: Vec<String> = self
                        .links
                        .values()
                        .map(|(tok, spec)| {
                            let why = self
                                .socks
                                .get(tok)
                                .and_then(|s| {
                                    s.last_recv_error
                                        .clone()
                                        .or_else(|| s.last_send_error.clone())
                                })
                                .unwrap_or_else(|| "no reply".into());
                            format!("{} -> {}: {why}", spec.name, spec.remote)
                        })
                        .collect();
                    anyhow::bail!(
                        "no session with the server after {}s: no link answers ({}); if the server runs, check that both ends use the same key (the server drops datagrams that fail authentication and logs \"authentication fails\")",
                        limit.as_secs(),
                        tried.join("; ")
                    );
                }
            }
            if waited >= Duration::from_secs(3) && waited < Duration::from_secs(4) && auth == 0 {
                tracing::warn!("no answer from the server yet on any link; still trying");
            }
        }
        Ok(())
    }

    /// Answers what the control plane asked (see [`crate::control`]): only what needs this
    /// thread's state; the asking thread renders the answer.
    fn serve_commands(&mut self, now: Instant) {
        while let Ok((cmd, reply)) = self.cmd_rx.try_recv() {
            let r = match cmd {
                Command::Snapshot => Reply::Snapshot(Box::new(self.snapshot(now))),
                Command::LinkAdd(r, remote) => self.link_add(now, r, remote).into(),
                Command::LinkRemove { name } => self.link_remove(now, &name).into(),
                Command::LinkSet {
                    name,
                    bandwidth,
                    download_bandwidth,
                    priority,
                } => self
                    .link_set(now, &name, bandwidth, download_bandwidth, priority)
                    .into(),
                Command::ClientAdd(r) => self.client_add(now, r).into(),
                Command::ClientRemove { name } => self.client_remove(now, &name).into(),
            };
            let _ = reply.send(r);
        }
    }

    fn snapshot(&self, now: Instant) -> Snapshot {
        Snapshot {
            stats: self.ep.stats(now),
            extra: self.extra_counters(),
            connected: self.ep.is_connected(),
            uptime: now.saturating_duration_since(self.started),
            links: self
                .links
                .iter()
                .map(|(id, (_, spec))| LinkInfo {
                    id: *id,
                    dev: spec.dev.clone(),
                    bind: spec.bind,
                    remote: spec.remote,
                })
                .collect(),
        }
    }

    fn extra_counters(&self) -> crate::metrics::Extra {
        // Both ways through the TUN device: writes the kernel refused, and packets the kernel
        // dropped because braid did not read them fast enough (the device's tx_dropped).
        let kernel = braid_linux::tun::queue_drops(&self.cfg.name).unwrap_or(0);
        crate::metrics::Extra {
            udp_send_drops: self.udp_drops,
            tun_write_errors: self.tun_write_errors,
            tun_full_drops: self.tun_full_drops + kernel,
            tun: self.tun.stats(),
            udp_rx: self.recv.stats(),
            udp_opened_in_parallel: self.opened_in_parallel,
        }
    }

    /// Concentrator: adds a client at run time (routes for its prefixes installed).
    fn client_add(&mut self, now: Instant, r: crate::control::ClientAddReq) -> anyhow::Result<()> {
        use braid_core::concentrator::ClientSpec;
        let pool_net = self.cfg.identity.as_ref().and_then(|i| i.address_pool);
        let own: Vec<IpAddr> = self.cfg.addresses.iter().map(|a| a.ip).collect();
        let Some(c) = self.ep.concentrator_mut() else {
            anyhow::bail!("this endpoint serves no [[client]] (a server with private_key and [[client]] tables does)");
        };
        if r.name.is_empty()
            || r.name.len() > 32
            || r.name.contains(|ch: char| ch.is_whitespace() || ch == '/')
        {
            anyhow::bail!(
                "client name {:?}: 1 to 32 characters, no spaces or '/'",
                r.name
            );
        }
        let key = crate::config::public_key(&r.public_key)
            .map_err(|m| anyhow::anyhow!("client {}: public key: {m}", r.name))?;
        let mut addrs = match &r.address {
            Some(a) => crate::config::parse_addresses(&toml::Value::String(a.clone()))
                .map_err(|m| anyhow::anyhow!("client {}: address: {m}", r.name))?,
            None => Vec::new(),
        };
        if addrs.is_empty() {
            let Some(net) = pool_net else {
                anyhow::bail!(
                    "client {}: give --address (there is no address_pool)",
                    r.name
                );
            };
            let mut pool = braid_core::routes::AddressPool::new(net, own);
            for spec in c.client_specs() {
                for a in [
                    spec.v4.map(|(a, _)| IpAddr::V4(a)),
                    spec.v6.map(|(a, _)| IpAddr::V6(a)),
                ]
                .into_iter()
                .flatten()
                {
                    let _ = pool.claim(a);
                }
            }
            let ip = pool.allocate()?;
            addrs.push(crate::config::TunAddress {
                ip,
                prefix: net.prefix_len(),
            });
        }
        let mut lans = Vec::new();
        for l in &r.lan {
            let n: ipnet::IpNet = l
                .parse()
                .map_err(|_| anyhow::anyhow!("client {}: lan {l:?} is not a prefix", r.name))?;
            lans.push(n.trunc());
        }
        let names: Vec<String> = c.client_names();
        if let Some(bad) = r.reach.iter().find(|x| *x != "*" && !names.contains(x)) {
            anyhow::bail!("client {}: reach: no client is named {bad:?}", r.name);
        }
        let spec = ClientSpec {
            name: r.name.clone(),
            public_key: key,
            v4: addrs.iter().find_map(|a| match a.ip {
                IpAddr::V4(ip) => Some((ip, a.prefix)),
                _ => None,
            }),
            v6: addrs.iter().find_map(|a| match a.ip {
                IpAddr::V6(ip) => Some((ip, a.prefix)),
                _ => None,
            }),
            lans,
            reach: r.reach.clone(),
        };
        c.add_client(now, spec.clone())?;
        self.install_routes(&spec);
        tracing::info!("client {} added ({})", spec.name, prefixes_text(&spec));
        Ok(())
    }

    /// Concentrator: removes a client (its session closed, its routes removed).
    fn client_remove(&mut self, now: Instant, name: &str) -> anyhow::Result<()> {
        let Some(c) = self.ep.concentrator_mut() else {
            anyhow::bail!("this endpoint serves no [[client]]");
        };
        let spec = c.remove_client(now, name)?;
        for p in self.routed_prefixes(&spec) {
            if let Err(e) = braid_linux::netlink::del_route(&self.cfg.name, p) {
                tracing::warn!("client {name}: {e}");
            }
        }
        self.flush_transmits(now);
        tracing::info!("client {name} removed");
        Ok(())
    }

    /// The prefixes to route into the TUN device for a client: its LANs, and its tunnel
    /// addresses unless the TUN device's own prefix already covers them.
    fn routed_prefixes(&self, spec: &braid_core::concentrator::ClientSpec) -> Vec<(IpAddr, u8)> {
        let covered = |ip: IpAddr| {
            self.cfg
                .addresses
                .iter()
                .any(|a| ipnet::IpNet::new(a.ip, a.prefix).is_ok_and(|n| n.contains(&ip)))
        };
        spec.prefixes()
            .into_iter()
            .filter(|p| !(p.prefix_len() == p.max_prefix_len() && covered(p.addr())))
            .map(|p| (p.network(), p.prefix_len()))
            .collect()
    }

    fn install_routes(&self, spec: &braid_core::concentrator::ClientSpec) {
        for p in self.routed_prefixes(spec) {
            if let Err(e) = braid_linux::netlink::add_route(&self.cfg.name, p) {
                tracing::error!(
                    "client {}: cannot route {}/{} into {}: {e}",
                    spec.name,
                    p.0,
                    p.1,
                    self.cfg.name
                );
            }
        }
    }

    /// The bundle's statistics; a concentrator's links belong to its clients, not to it.
    fn bundle_stats(&self, now: Instant) -> anyhow::Result<BundleStats> {
        match self.ep.endpoint() {
            Some(ep) => Ok(ep.stats(now)),
            None => {
                anyhow::bail!("a concentrator's links are its clients': change them on the client")
            }
        }
    }

    fn find_link(&self, name: &str, stats: &BundleStats) -> Option<LinkId> {
        if let Some((id, _)) = self.links.iter().find(|(_, (_, s))| s.name == name) {
            return Some(*id);
        }
        stats.links.iter().find(|l| l.name == name).map(|l| l.id)
    }

    /// Adds a client link; `resolved` is `r.remote` resolved (on the control thread).
    fn link_add(
        &mut self,
        now: Instant,
        r: LinkAddReq,
        resolved: Option<SocketAddr>,
    ) -> anyhow::Result<()> {
        if self.cfg.role == Role::Server {
            anyhow::bail!("links are added on the client; the server learns them as they arrive");
        }
        if r.name.is_empty() || r.name.len() > 32 || r.name.contains(char::is_whitespace) {
            anyhow::bail!("link name {:?}: 1 to 32 characters, no spaces", r.name);
        }
        if self.links.values().any(|(_, s)| s.name == r.name) {
            anyhow::bail!("link {} already exists", r.name);
        }
        if r.dev.is_none() && r.bind.is_none() {
            anyhow::bail!("link {}: needs --dev IFACE and/or --bind ADDRESS", r.name);
        }
        let bind = match &r.bind {
            Some(b) => Some(
                crate::config::parse_bind(b)
                    .map_err(|m| anyhow::anyhow!("link {}: bind: {m}", r.name))?,
            ),
            None => None,
        };
        let (remote_text, remote) = match (&r.remote, resolved) {
            (Some(t), Some(a)) => (t.clone(), a),
            (Some(_), None) => anyhow::bail!("link {}: remote was not resolved", r.name),
            (None, _) => match self.cfg.links.first() {
                Some(first) => (first.remote_text.clone(), first.remote),
                None => anyhow::bail!("link {}: needs --remote HOST:PORT", r.name),
            },
        };
        if r.bandwidth == Some(0) {
            anyhow::bail!("link {}: bandwidth must be > 0", r.name);
        }
        let download_bps = r
            .download_bandwidth
            .map(crate::config::check_download_bandwidth)
            .transpose()
            .map_err(|m| anyhow::anyhow!("link {}: download bandwidth {m}", r.name))?;
        let id = self.next_link_id;
        let spec = LinkSpec {
            id,
            name: r.name.clone(),
            dev: r.dev.clone(),
            bind,
            remote_text,
            remote,
            bandwidth_bps: r.bandwidth,
            download_bps,
            priority: r.priority.unwrap_or(0),
        };
        let sock = open_link_socket(&spec)?;
        let tok = Token(self.next_token);
        self.poll
            .registry()
            .register(&mut SourceFd(&sock.as_raw_fd()), tok, Interest::READABLE)?;
        self.ep
            .endpoint_mut()
            .ok_or(EndpointError::NoSuchLink(id))
            .and_then(|ep| ep.add_link(now, id, link_config(&spec)))
            .map_err(|e: EndpointError| {
                let _ = self
                    .poll
                    .registry()
                    .deregister(&mut SourceFd(&sock.as_raw_fd()));
                anyhow::anyhow!("link {}: {e}", spec.name)
            })?;
        self.next_token += 1;
        self.next_link_id += 1;
        tracing::info!(
            "link {} added (id {id}, dev {:?}, bind {:?}, remote {})",
            spec.name,
            spec.dev,
            spec.bind,
            spec.remote
        );
        let mut s = Sock::new(sock, Some(id));
        s.binding = Binding::of(&s.sock, &spec);
        s.readable = true;
        self.socks.insert(tok, s);
        self.links.insert(id, (tok, spec));
        Ok(())
    }

    fn link_remove(&mut self, now: Instant, name: &str) -> anyhow::Result<()> {
        let stats = self.bundle_stats(now)?;
        let id = self
            .find_link(name, &stats)
            .ok_or_else(|| anyhow::anyhow!("no link named {name}"))?;
        if let Some(ep) = self.ep.endpoint_mut() {
            ep.remove_link(now, id)?;
        }
        // Datagrams queued for it are sent if they can be, then the socket goes.
        self.flush_transmits(now);
        if let Some((tok, _)) = self.links.remove(&id) {
            if let Some(mut s) = self.socks.remove(&tok) {
                let _ = self
                    .poll
                    .registry()
                    .deregister(&mut SourceFd(&s.sock.as_raw_fd()));
                for (t, _) in s.pending.drain(..) {
                    self.ep.recycle(t.payload);
                }
            }
        }
        tracing::info!("link {name} removed");
        Ok(())
    }

    fn link_set(
        &mut self,
        now: Instant,
        name: &str,
        bandwidth: Option<u64>,
        download_bandwidth: Option<u64>,
        priority: Option<u8>,
    ) -> anyhow::Result<()> {
        let stats = self.bundle_stats(now)?;
        let id = self
            .find_link(name, &stats)
            .ok_or_else(|| anyhow::anyhow!("no link named {name}"))?;
        if bandwidth == Some(0) {
            anyhow::bail!("bandwidth must be > 0");
        }
        // 0 withdraws the hint; a server has none to give (its clients tell it theirs).
        let download = match download_bandwidth {
            Some(_) if self.cfg.role == Role::Server => {
                anyhow::bail!("a download bandwidth is the client's to tell: set it there")
            }
            Some(0) => Some(None),
            Some(b) => Some(Some(
                crate::config::check_download_bandwidth(b)
                    .map_err(|m| anyhow::anyhow!("download bandwidth {m}"))?,
            )),
            None => None,
        };
        if let Some(ep) = self.ep.endpoint_mut() {
            ep.set_link(id, bandwidth.map(Some), priority)?;
            if let Some(d) = download {
                ep.set_link_download(id, d)?;
            }
        }
        if let Some((_, spec)) = self.links.get_mut(&id) {
            if let Some(b) = bandwidth {
                spec.bandwidth_bps = Some(b);
            }
            if let Some(d) = download {
                spec.download_bps = d;
            }
            if let Some(p) = priority {
                spec.priority = p;
            }
        }
        tracing::info!(
            "link {name}: bandwidth {bandwidth:?} download bandwidth {download_bandwidth:?} priority {priority:?}"
        );
        Ok(())
    }

    /// Says goodbye on every link, sends what can be sent, and releases the TUN device.
    fn shutdown(&mut self, now: Instant) {
        self.ep.close(now);
        self.flush_transmits(now);
    }
}

impl Sock {
    /// The local address to send `t` from: where its link's last authenticated packet came to
    /// (if it goes to the same peer address), or where the HELLO it answers came to; `None`
    /// (the kernel chooses by route) on a socket without IP_PKTINFO or before anything authenticated.
    fn reply_src(&self, t: &Transmit) -> Option<IpAddr> {
        let dst = t.dst?;
        match self.reply_from.get(&t.link) {
            Some(&(peer, local)) if peer == dst => Some(local),
            _ => self.hello_from.get(&dst).copied(),
        }
    }

    /// What a datagram that authenticated teaches this socket (with IP_PKTINFO): the local
    /// address its link's replies go from, or (a HELLO) the one its HELLO-ACK goes from.
    fn note_received(&mut self, got: Received, from: SocketAddr, local: Option<IpAddr>) {
        let Some(local) = local else { return };
        match got {
            Received::Link(link) => {
                self.reply_from.insert(link, (from, local));
            }
            Received::Hello(_) => {
                self.hello_from.insert(from, local);
            }
            Received::Ignored => {}
        }
    }

    fn new(sock: UdpSocket, link: Option<LinkId>) -> Sock {
        Sock {
            sock,
            link,
            readable: true,
            pending: VecDeque::new(),
            reply_from: HashMap::new(),
            hello_from: HashMap::new(),
            last_recv_error: None,
            send_errors: 0,
            last_send_error: None,
            binding: Binding::default(),
            retry_at: None,
            backoff: Duration::ZERO,
            writable_watched: false,
            scratch: Vec::with_capacity(BATCH),
            outcome: SendOutcome::default(),
            queued_before: 0,
        }
    }

    /// Sends the queue (sealed) in batches until it is empty or the kernel takes no more, and
    /// says how far it got. Touches only this socket: it may run on a helper thread.
    fn send_pending(&mut self) -> SendOutcome {
        let mut out = SendOutcome::default();
        let items = self.pending.make_contiguous();
        debug_assert!(items.iter().all(|(t, _)| t.seal.is_none()), "unsealed");
        while out.done < items.len() {
            let mut msgs = reuse(std::mem::take(&mut self.scratch));
            msgs.extend(items[out.done..].iter().map(|(t, src)| Datagram {
                dst: t.dst,
                src: *src,
                ecn: t.ecn,
                payload: t.payload.as_slice(),
            }));
            let rep = self.sock.send_batch(&msgs);
            self.scratch = reuse(msgs);
            let consumed = rep.sent + rep.failed;
            if rep.failed > 0 {
                out.failed += rep.failed;
                out.last_error = rep.last_error;
            }
            out.done += consumed;
            if rep.would_block || consumed == 0 {
                break;
            }
        }
        out
    }

    /// Registers for writability while datagrams wait in `pending`, and drops it once they are
    /// gone.
    fn watch_writable(&mut self, poll: &Poll, tok: Token) {
        let want = !self.pending.is_empty();
        if want == self.writable_watched {
            return;
        }
        let interest = if want {
            Interest::READABLE | Interest::WRITABLE
        } else {
            Interest::READABLE
        };
        let fd = self.sock.as_raw_fd();
        match poll
            .registry()
            .reregister(&mut SourceFd(&fd), tok, interest)
        {
            Ok(()) => self.writable_watched = want,
            Err(e) => tracing::debug!("poll interest of a link socket: {e}"),
        }
    }

    fn schedule_retry(&mut self, now: Instant) {
        self.backoff = (self.backoff * 2).clamp(RETRY_MIN, RETRY_MAX);
        self.retry_at = Some(now + self.backoff);
    }
}

/// Seals what the core handed out unsealed (deferred sealing), in parts on the helper threads
/// when there are enough of them; datagrams sealed already (queued at an earlier flush) cost
/// nothing.
fn seal_all(workers: &Workers, items: &mut [(Transmit, Option<IpAddr>)]) {
    workers.for_each_in_parts(items, |(t, _)| t.finish());
}

/// A received datagram between its check and its commit, with the local address it came to
/// (see [`receive_shared`]).
type RxJob<'a> = BatchJob<'a, Option<IpAddr>>;

/// Receives one socket's batch with the opening shared by the helper threads
/// ([`Endpoint::receive_batch`]: each datagram checked in arrival order, the jobs opened in
/// parallel parts, then committed in order on this thread; a handshake datagram commits what
/// is before it and is handled inline). Returns how many datagrams were opened in parallel.
/// `jobs` is empty before and after (kept for its allocation).
fn receive_shared<'a>(
    now: Instant,
    ep: &mut Endpoint,
    workers: &Workers,
    jobs: &mut Vec<RxJob<'a>>,
    s: &mut Sock,
    batch: impl Iterator<Item = (RxMeta, RecvDatagram<'a>)>,
) -> u64 {
    let mut shared = 0;
    let via = s.link;
    ep.receive_batch(
        now,
        batch.map(|(arrived, d)| (via, d.from, d.bytes, arrived, d.local)),
        jobs,
        |jobs| {
            if workers.parts(jobs.len()) > 1 {
                shared += jobs.len() as u64;
            }
            workers.for_each_in_parts(jobs, |j| j.open());
        },
        |got, from, local| s.note_received(got, from, *local),
    );
    shared
}

/// Puts one flush's new datagrams for a socket in runs by destination (and source address). The
/// server's one socket carries every link, and the scheduler stripes: in arrival order no two
/// neighbours share a destination, so none could leave with another as one GSO message (the
/// server sent one system-call segment per datagram and spent twice the client's CPU). A stable
/// sort: each link's order is kept; across links order means nothing within one flush. Only
/// the new ones: what waits from earlier flushes stays ahead (else a concentrator's clients at
/// low addresses would overtake the others' older datagrams flush after flush).
fn group_by_destination(new: &mut [(Transmit, Option<IpAddr>)]) {
    if new.len() > 1 {
        new.sort_by_key(|(t, src)| (t.dst, *src));
    }
}

fn link_config(spec: &LinkSpec) -> LinkConfig {
    LinkConfig {
        name: spec.name.clone(),
        bandwidth_bps: spec.bandwidth_bps,
        priority: spec.priority,
        download_bps: spec.download_bps,
    }
}

/// An emptied list of borrowed items with another lifetime (`T` and `U` differ by lifetimes
/// only), in the same allocation (the standard library collects a `vec::IntoIter` into a `Vec`
/// of a same-sized type in place): lets one list of borrowed datagrams be reused across turns.
fn reuse<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter().map(|_| unreachable!("emptied")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The server's queue goes out in runs by destination, each link's datagrams in order.
    #[test]
    fn datagrams_go_in_runs_by_destination_in_each_links_order() {
        let a: SocketAddr = "198.18.1.1:1000".parse().unwrap();
        let b: SocketAddr = "198.18.2.1:1000".parse().unwrap();
        let t = |link: LinkId, dst: SocketAddr, n: u8| {
            (
                Transmit {
                    link,
                    dst: Some(dst),
                    payload: vec![n],
                    seal: None,
                    ecn: 0,
                },
                None,
            )
        };
        let mut q = vec![t(2, b, 0), t(1, a, 1), t(2, b, 2), t(1, a, 3), t(2, b, 4)];
        group_by_destination(&mut q);
        let got: Vec<(LinkId, u8)> = q.iter().map(|(t, _)| (t.link, t.payload[0])).collect();
        assert_eq!(got, vec![(1, 1), (1, 3), (2, 0), (2, 2), (2, 4)]);
    }

    /// The scratch list of datagrams keeps its allocation from one turn to the next.
    #[test]
    fn reuse_keeps_the_allocation() {
        let payload = vec![1u8; 10];
        let mut v: Vec<Datagram<'_>> = Vec::with_capacity(BATCH);
        let ptr = v.as_ptr() as usize;
        v.push(Datagram {
            dst: None,
            src: None,
            ecn: 0,
            payload: &payload,
        });
        let back: Vec<Datagram<'static>> = reuse(v);
        assert!(back.is_empty());
        assert_eq!(back.capacity(), BATCH);
        assert_eq!(back.as_ptr() as usize, ptr);
    }
}
