//! Proxy mode: the balancer terminates the client's TCP connection and opens one to the chosen
//! backend (retrying the client on another backend when a connect fails), or relays UDP
//! datagrams with per-client affinity. Runs on tokio, one single-threaded runtime per worker.
//!
//! Limits and overload (operator's view in docs/balance.md, "Limits and overload"):
//!
//! - Every client holds descriptors (TCP: two, UDP: one connected socket per session), so the
//!   listener admits at most `max_connections` clients (default: what the open-files limit
//!   allows after a reserve, [`fd_budget`]) and optionally `max_connections_per_source` from one
//!   address ([`braid_lb::ConnLimiter`]).
//! - TCP at the limit: the connection idle the longest is closed to make room if it has been idle
//!   for `evict_idle_after_ms`; otherwise accepting pauses (clients wait in the kernel's backlog)
//!   until a connection ends. Connections idle for `tcp_idle_timeout_ms` are closed; keepalive
//!   probes run on both sides.
//! - UDP at the limit: the least recently used session is evicted ([`FlowTable`]); sessions hold
//!   no user-space buffer (replies are read into one buffer per thread).
//! - A connect, bind or send that fails for a local reason (EMFILE, ENFILE, ENOBUFS, ENOMEM,
//!   EADDRNOTAVAIL: [`is_local_error`]) never counts against a backend; `accept` errors back off.
//! - On SIGTERM/SIGINT the listener closes and open connections (UDP: sessions) get up to
//!   `drain_timeout_ms` to finish.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use braid_lb::flow::{client_hash, FlowKey};
use braid_lb::{BackendId, ConnLimiter, FlowTable, PickKey, Refused};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Notify;

use crate::balancer::{is_local_error, short_io_error, Balancer};
use crate::config::Protocol;

/// Runs the proxy until the balancer is told to stop, then drains.
///
/// TCP: one thread per core, each with its own single-threaded tokio runtime and its own
/// listening socket on the same address (`SO_REUSEPORT`: the kernel spreads new connections), so
/// a connection lives on one thread from accept to close with no cross-thread wake-ups. UDP: one
/// thread (one socket carries every client).
pub fn run(b: Arc<Balancer>) -> anyhow::Result<()> {
    let listen = b
        .config
        .listen
        .ok_or_else(|| anyhow::anyhow!("proxy mode needs listen"))?;
    let workers = match b.config.protocol {
        Protocol::Tcp => b.config.workers.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2)
        }),
        Protocol::Udp => 1,
    };
    // Each proxied TCP connection holds two descriptors.
    let nofile = braid_linux::process::raise_fd_limit();
    let budget = fd_budget(nofile, b.config.protocol);
    let mut max = b.config.max_connections.unwrap_or(budget);
    if b.config.protocol == Protocol::Udp {
        max = max.min(b.config.max_flows);
    }
    if max > budget {
        tracing::warn!(
            "max_connections = {max} needs more descriptors than the open-files limit ({nofile}) leaves: clients may be turned away with EMFILE before the limit is reached"
        );
    }
    let shared = Arc::new(Shared::new(max, b.config.max_connections_per_source));
    {
        let (shared, per_source) = (shared.clone(), b.config.max_connections_per_source);
        b.attach_proxy_status(move || {
            serde_json::json!({
                "open": shared.open.load(Ordering::Relaxed),
                "max_connections": max,
                "max_connections_per_source": per_source,
                "open_files_limit": nofile,
            })
        });
    }
    // Bind every socket before starting, so that a bad address is an error, not a log line.
    let mut sockets = Vec::new();
    for _ in 0..workers {
        sockets.push(match b.config.protocol {
            Protocol::Tcp => Listener::Tcp(tcp_listener(listen, workers > 1)?),
            Protocol::Udp => Listener::Udp(udp_socket(listen)?),
        });
    }
    tracing::info!(
        "balancer {}: proxying {} {listen} over {} backends ({}), {workers} worker thread(s), at most {max} {} (open-files limit {nofile})",
        b.config.name,
        b.config.protocol.as_str(),
        b.config.backends.len(),
        b.config.algorithm,
        match b.config.protocol {
            Protocol::Tcp => "connections",
            Protocol::Udp => "sessions",
        }
    );
    let mut threads = Vec::new();
    for (i, sock) in sockets.into_iter().enumerate() {
        let (b, shared) = (b.clone(), shared.clone());
        threads.push(
            std::thread::Builder::new()
                .name(format!("braid-proxy-{i}"))
                .spawn(move || worker(b, shared, sock, listen))?,
        );
    }
    // Every socket is bound and has its worker: clients can connect.
    b.notify_ready();
    let mut result = Ok(());
    for t in threads {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => result = Err(e),
            Err(_) => result = Err(anyhow::anyhow!("a proxy worker thread panicked")),
        }
    }
    result
}

/// The default `max_connections`: what `nofile` descriptors allow after a reserve (64 plus 5%)
/// for listeners, health checks, the control and metrics sockets and clients waiting in
/// `accept`. TCP clients cost two descriptors, UDP sessions one.
pub fn fd_budget(nofile: u64, protocol: Protocol) -> usize {
    let nofile = nofile.min(4_000_000);
    let reserve = 64 + nofile / 20;
    let per = match protocol {
        Protocol::Tcp => 2,
        Protocol::Udp => 1,
    };
    (nofile.saturating_sub(reserve) / per).max(1) as usize
}

/// State shared by the workers: admission, the open clients, and the clock of idle times.
struct Shared {
    limiter: Mutex<ConnLimiter>,
    /// Open TCP connections, for picking the one idle the longest at the limit.
    conns: Mutex<HashMap<u64, Arc<ConnState>>>,
    next_id: AtomicU64,
    /// TCP connections or UDP sessions open now (what drain waits for).
    open: AtomicUsize,
    epoch: Instant,
}

impl Shared {
    fn new(max: usize, per_source: Option<u32>) -> Shared {
        Shared {
            limiter: Mutex::new(ConnLimiter::new(max, per_source)),
            conns: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            open: AtomicUsize::new(0),
            epoch: Instant::now(),
        }
    }

    fn limiter(&self) -> MutexGuard<'_, ConnLimiter> {
        self.limiter.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn conns(&self) -> MutexGuard<'_, HashMap<u64, Arc<ConnState>>> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Asks the connection idle the longest (at least `min_idle`) to close.
    fn evict_idle(&self, min_idle: Duration) -> Eviction {
        let now = self.now_ms();
        let conns = self.conns();
        let Some(c) = conns
            .values()
            .min_by_key(|c| c.last_active.load(Ordering::Relaxed))
        else {
            return Eviction::None;
        };
        if now.saturating_sub(c.last_active.load(Ordering::Relaxed)) < min_idle.as_millis() as u64 {
            return Eviction::None;
        }
        // Its own idle timeout (or its end) may have claimed it: then its slot is coming back
        // anyway, and closing another connection too would cost a client for nothing.
        if c.claim_end() {
            c.close.notify_one();
            Eviction::Evicted
        } else {
            Eviction::Ending
        }
    }
}

/// What [`Shared::evict_idle`] did.
#[derive(Debug, PartialEq)]
enum Eviction {
    /// Asked the connection idle the longest to close.
    Evicted,
    /// The connection idle the longest is closing already.
    Ending,
    /// No connection has been idle long enough.
    None,
}

/// One open TCP connection, as the other connections see it.
struct ConnState {
    /// When a byte last moved either way (ms since [`Shared::epoch`]).
    last_active: AtomicU64,
    /// Set once, by whichever ends it first: an eviction to make room, its idle timeout, or its
    /// own end. Only the one that sets it counts the connection (`evicted`, `idle_closed`).
    ending: AtomicBool,
    close: Notify,
}

impl ConnState {
    /// Claims the connection's end; false if something else already ended it.
    fn claim_end(&self) -> bool {
        !self.ending.swap(true, Ordering::Relaxed)
    }
}

/// Holds a TCP connection's admission; releases it however the connection ends (also when the
/// runtime drops the task at the end of a drain).
struct ConnGuard {
    shared: Arc<Shared>,
    id: u64,
    src: IpAddr,
    state: Arc<ConnState>,
}

impl ConnGuard {
    fn new(shared: Arc<Shared>, src: IpAddr) -> ConnGuard {
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(ConnState {
            last_active: AtomicU64::new(shared.now_ms()),
            ending: AtomicBool::new(false),
            close: Notify::new(),
        });
        shared.conns().insert(id, state.clone());
        shared.open.fetch_add(1, Ordering::Relaxed);
        ConnGuard {
            shared,
            id,
            src,
            state,
        }
    }

    fn touch(&self) {
        self.state
            .last_active
            .store(self.shared.now_ms(), Ordering::Relaxed);
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.shared.conns().remove(&self.id);
        self.shared.limiter().release(self.src);
        self.shared.open.fetch_sub(1, Ordering::Relaxed);
    }
}

enum Listener {
    Tcp(std::net::TcpListener),
    Udp(std::net::UdpSocket),
}

fn worker(
    b: Arc<Balancer>,
    shared: Arc<Shared>,
    sock: Listener,
    listen: SocketAddr,
) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        match sock {
            Listener::Tcp(l) => {
                let l = TcpListener::from_std(l)?;
                tokio::select! {
                    _ = tcp_accept_loop(b.clone(), shared.clone(), l, listen) => {}
                    _ = until_stopping(&b) => {}
                }
                // The accept loop (and with it the listener) is gone: new clients are refused
                // while the open connections finish.
                drain(&b, &shared).await;
            }
            Listener::Udp(s) => {
                let s = UdpSocket::from_std(s)?;
                let work = udp_loop(b.clone(), shared.clone(), s, listen);
                tokio::pin!(work);
                tokio::select! {
                    r = &mut work => return r,
                    _ = until_stopping(&b) => {}
                }
                // Keep relaying for the open sessions (new clients are dropped) until they end.
                tokio::select! {
                    r = &mut work => return r,
                    _ = drain(&b, &shared) => {}
                }
            }
        }
        Ok(())
    })
    // Dropping the runtime closes whatever is still open.
}

async fn until_stopping(b: &Balancer) {
    while !b.stopping() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until every open connection has ended, or `drain_timeout`.
async fn drain(b: &Balancer, shared: &Shared) {
    let open = shared.open.load(Ordering::Relaxed);
    if open == 0 {
        return;
    }
    tracing::info!(
        "stopping: draining {open} open connection(s) for up to {} ms",
        b.config.drain_timeout.as_millis()
    );
    let deadline = Instant::now() + b.config.drain_timeout;
    while shared.open.load(Ordering::Relaxed) > 0 {
        if Instant::now() >= deadline {
            tracing::warn!(
                "drain timeout: closing {} connection(s) still open",
                shared.open.load(Ordering::Relaxed)
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn tcp_listener(addr: SocketAddr, reuse_port: bool) -> anyhow::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    if reuse_port {
        s.set_reuse_port(true)?;
    }
    s.set_nonblocking(true)?;
    s.bind(&addr.into())
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    s.listen(4096)?;
    Ok(s.into())
}

fn udp_socket(addr: SocketAddr) -> anyhow::Result<std::net::UdpSocket> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, None)?;
    s.set_reuse_address(true)?;
    s.set_nonblocking(true)?;
    let _ = s.set_recv_buffer_size(4 << 20);
    let _ = s.set_send_buffer_size(4 << 20);
    s.bind(&addr.into())
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr} (udp): {e}"))?;
    Ok(s.into())
}

/// Counts an event and logs the 1st, 2nd, 4th, 8th... of them (an attack must not flood the log).
fn count_and_log(counter: &AtomicU64, what: impl FnOnce(u64) -> String) {
    let n = counter.fetch_add(1, Ordering::Relaxed) + 1;
    if n.is_power_of_two() {
        tracing::warn!("{}", what(n));
    }
}

async fn tcp_accept_loop(
    b: Arc<Balancer>,
    shared: Arc<Shared>,
    l: TcpListener,
    listen: SocketAddr,
) {
    loop {
        let (client, peer) = match l.accept().await {
            Ok(x) => x,
            Err(e) => {
                // EMFILE and friends: the client stays in the backlog; back off instead of
                // spinning on a listener that stays readable, and never give it up.
                count_and_log(&b.counters.accept_errors, |n| {
                    format!("accept: {e} (backing off; {n} failed accepts so far)")
                });
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        if !admit(&b, &shared, peer.ip()).await {
            continue; // dropping `client` closes it
        }
        b.counters.accepted.fetch_add(1, Ordering::Relaxed);
        let conn = ConnGuard::new(shared.clone(), peer.ip());
        let b = b.clone();
        tokio::spawn(async move {
            // Both sockets are closed when `serve_tcp` returns; only then does the guard give the
            // connection's slot back (an admission waiting on it then has the descriptors).
            serve_tcp(b, &conn, client, peer, listen).await;
            drop(conn);
        });
    }
}

/// Admits a new TCP client: under the limits at once; at `max_connections` by closing the
/// connection idle the longest, or else by waiting (accepting pauses meanwhile) for one to end.
async fn admit(b: &Balancer, shared: &Shared, src: IpAddr) -> bool {
    let mut waited = false;
    loop {
        let r = shared.limiter().try_admit(src);
        match r {
            Ok(()) => return true,
            Err(Refused::PerSource) => {
                count_and_log(&b.counters.rejected, |n| {
                    format!("client {src} is over max_connections_per_source: refused ({n} so far)")
                });
                return false;
            }
            Err(Refused::Full) => {
                let eviction = shared.evict_idle(b.config.evict_idle_after);
                if eviction == Eviction::Evicted {
                    count_and_log(&b.counters.evicted, |n| {
                        format!("at max_connections: closed the connection idle the longest to make room ({n} so far)")
                    });
                }
                if eviction != Eviction::None {
                    // Wait until the evicted connection has closed its two sockets and given its
                    // slot back: connecting to a backend before would need descriptors it still
                    // holds (a burst of evictions ran into EMFILE). Not past a second.
                    for _ in 0..500 {
                        match shared.limiter().try_admit(src) {
                            Ok(()) => return true,
                            Err(Refused::PerSource) => return false,
                            Err(Refused::Full) => {}
                        }
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    return shared.limiter().admit_replacing(src).is_ok();
                }
                if !waited {
                    waited = true;
                    count_and_log(&b.counters.limit_waits, |n| {
                        format!("at max_connections with no idle connection to close: accepting paused ({n} times so far)")
                    });
                }
                if b.stopping() {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Picks a backend and connects; on failure records a passive failure and tries the next backend
/// (never the same one twice), so a client is refused only when no backend at all answers. A
/// failure for a local reason ([`is_local_error`]) ends the attempt without blaming anyone.
async fn connect_backend(b: &Balancer, key: PickKey) -> Option<(BackendId, TcpStream)> {
    let mut exclude: Vec<BackendId> = Vec::new();
    loop {
        let picked = b.table().pick_and_open(key, &exclude);
        let Some((id, addr)) = picked else {
            b.counters.no_backend.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let err = match tokio::time::timeout(b.config.connect_timeout, TcpStream::connect(addr))
            .await
        {
            Ok(Ok(s)) => return Some((id, s)),
            Ok(Err(e)) if is_local_error(&e) => {
                b.table().conn_closed(id);
                count_and_log(&b.counters.local_errors, |n| {
                    format!("connect to backend {addr}: {} (a local shortage, not counted against the backend; {n} so far)", short_io_error(&e))
                });
                return None;
            }
            Ok(Err(e)) => format!("connect: {}", short_io_error(&e)),
            Err(_) => "connect: timed out".to_string(),
        };
        b.counters.connect_failures.fetch_add(1, Ordering::Relaxed);
        {
            let mut t = b.table();
            t.conn_closed(id);
            if let Some(h) = t.handle_passive_failure(id, Instant::now(), err.clone()) {
                tracing::warn!("backend {addr} is now {h:?} ({err}, passive)");
            }
        }
        tracing::debug!("backend {addr}: {err}; retrying the client elsewhere");
        exclude.push(id);
        b.counters.retries.fetch_add(1, Ordering::Relaxed);
    }
}

/// Keepalive probes after `idle`, then every quarter of it (at least 1 s), 4 probes.
fn set_keepalive(s: &TcpStream, idle: Duration) {
    let ka = socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval((idle / 4).max(Duration::from_secs(1)))
        .with_retries(4);
    let _ = socket2::SockRef::from(s).set_tcp_keepalive(&ka);
}

async fn serve_tcp(
    b: Arc<Balancer>,
    conn: &ConnGuard,
    mut client: TcpStream,
    peer: SocketAddr,
    listen: SocketAddr,
) {
    let flow = FlowKey::new(braid_lb::flow::PROTO_TCP, peer, listen);
    let key = PickKey {
        flow_hash: flow.hash(),
        client_hash: flow.client_hash(),
    };
    let Some((id, mut upstream)) = connect_backend(&b, key).await else {
        // No backend: close (RST would be kinder to some clients, but a close is what Pen does).
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    if let Some(idle) = b.config.tcp_keepalive {
        set_keepalive(&client, idle);
        set_keepalive(&upstream, idle);
    }
    conn.touch();
    let (to_backend, to_client) = relay(&b, conn, id, &mut client, &mut upstream).await;
    let mut t = b.table();
    t.add_bytes(id, to_backend, to_client);
    t.conn_closed(id);
}

/// Bytes not yet credited to the table are flushed every this many bytes (and at the end).
const FLUSH_BYTES: u64 = 4 << 20;
/// A direction's buffer starts small (most connections are short) and doubles, up to `BUF_MAX`,
/// whenever a read fills it (a bulk transfer). A direction with nothing to read holds no buffer.
const BUF_MIN: usize = 8 * 1024;
const BUF_MAX: usize = 256 * 1024;

/// Copies both ways until both sides have finished. A read EOF on one side becomes a write
/// shutdown (FIN) on the other (half-close); an error on either side ends both, and so do
/// `tcp_idle_timeout` without a byte either way and a request to make room ([`Shared::evict_idle`]).
async fn relay(
    b: &Balancer,
    conn: &ConnGuard,
    id: BackendId,
    client: &mut TcpStream,
    upstream: &mut TcpStream,
) -> (u64, u64) {
    let (cr, mut cw) = client.split();
    let (ur, mut uw) = upstream.split();
    let mut done_in = 0u64;
    let mut done_out = 0u64;
    let first_eof = AtomicBool::new(false);
    let up = copy_half(b, conn, id, true, &first_eof, &cr, &mut uw);
    let down = copy_half(b, conn, id, false, &first_eof, &ur, &mut cw);
    tokio::pin!(up, down);
    let mut up_done = false;
    let mut down_done = false;
    let idle = b.config.tcp_idle_timeout;
    let mut check_idle = tokio::time::Instant::now() + idle;
    while !(up_done && down_done) {
        tokio::select! {
            r = &mut up, if !up_done => {
                up_done = true;
                match r { Ok(n) => done_in = n, Err(n) => { done_in = n; break; } }
            }
            r = &mut down, if !down_done => {
                down_done = true;
                match r { Ok(n) => done_out = n, Err(n) => { done_out = n; break; } }
            }
            _ = conn.state.close.notified() => break,
            _ = tokio::time::sleep_until(check_idle) => {
                let quiet = Duration::from_millis(
                    conn.shared
                        .now_ms()
                        .saturating_sub(conn.state.last_active.load(Ordering::Relaxed)),
                );
                if quiet >= idle {
                    if conn.state.claim_end() {
                        b.counters.idle_closed.fetch_add(1, Ordering::Relaxed);
                    }
                    break;
                }
                check_idle = tokio::time::Instant::now() + (idle - quiet);
            }
        }
    }
    // Ended by itself (or as claimed above): no eviction may pick it now.
    conn.state.claim_end();
    (done_in, done_out)
}

/// One direction; returns the bytes not yet credited (`Err` on an I/O error). `first_eof`: the
/// first direction to see EOF forwards it with a shutdown (half-close); the second skips the
/// syscall, since both sockets are closed right after (their FIN goes out then).
async fn copy_half<W>(
    b: &Balancer,
    conn: &ConnGuard,
    id: BackendId,
    to_backend: bool,
    first_eof: &AtomicBool,
    r: &tokio::net::tcp::ReadHalf<'_>,
    w: &mut W,
) -> Result<u64, u64>
where
    W: tokio::io::AsyncWrite + Unpin,
{
    let sock: &TcpStream = r.as_ref();
    // `try_read_buf` fills spare capacity: no zeroing of buffers per connection.
    let mut buf: Vec<u8> = Vec::new();
    let mut cap = BUF_MIN;
    let mut pending = 0u64;
    loop {
        if buf.capacity() == 0 {
            if sock.readable().await.is_err() {
                return Err(pending);
            }
            buf.reserve_exact(cap);
        }
        buf.clear();
        let n = match sock.try_read_buf(&mut buf) {
            Ok(0) => {
                if !first_eof.swap(true, Ordering::Relaxed) {
                    let _ = w.shutdown().await;
                }
                return Ok(pending);
            }
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                // Nothing to read: wait without holding a buffer (idle connections cost none).
                buf = Vec::new();
                continue;
            }
            Err(_) => return Err(pending),
        };
        conn.touch();
        if w.write_all(&buf[..n]).await.is_err() {
            return Err(pending);
        }
        conn.touch();
        if n == buf.capacity() && cap < BUF_MAX {
            cap = (2 * cap).min(BUF_MAX);
            buf.reserve_exact(cap - buf.len());
        }
        pending += n as u64;
        let c = if to_backend {
            &b.counters.bytes_in
        } else {
            &b.counters.bytes_out
        };
        c.fetch_add(n as u64, Ordering::Relaxed);
        if pending >= FLUSH_BYTES {
            let mut t = b.table();
            if to_backend {
                t.add_bytes(id, pending, 0);
            } else {
                t.add_bytes(id, 0, pending);
            }
            pending = 0;
        }
    }
}

/// One client's UDP session: a connected socket towards its backend and the task that relays
/// the backend's replies (aborted when the session ends, which closes the socket).
struct UdpSession {
    backend: BackendId,
    upstream: Arc<UdpSocket>,
    replies: tokio::task::AbortHandle,
}

/// The sessions of the UDP listener: a bounded table (least recently used evicted when full) and
/// the per-source counts.
struct UdpSessions {
    table: FlowTable<Arc<UdpSession>, SocketAddr>,
    limiter: ConnLimiter,
}

type Sessions = Arc<Mutex<UdpSessions>>;

fn lock(s: &Sessions) -> MutexGuard<'_, UdpSessions> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

/// A session left the table (expired, evicted, re-balanced): stop its reply task, close its
/// socket, free its backend slot and its client's count.
fn release_session(
    b: &Balancer,
    shared: &Shared,
    s: &mut UdpSessions,
    client: SocketAddr,
    sess: &UdpSession,
) {
    sess.replies.abort();
    s.limiter.release(client.ip());
    shared.open.fetch_sub(1, Ordering::Relaxed);
    b.table().conn_closed(sess.backend);
}

thread_local! {
    /// Replies are read here, one buffer per thread rather than 64 KiB per session.
    static REPLY_BUF: RefCell<Vec<u8>> = RefCell::new(vec![0u8; 65536]);
}

async fn udp_loop(
    b: Arc<Balancer>,
    shared: Arc<Shared>,
    sock: UdpSocket,
    listen: SocketAddr,
) -> anyhow::Result<()> {
    let sock = Arc::new(sock);
    let idle = b.config.udp_idle_timeout;
    let (max, per_source) = {
        let l = shared.limiter();
        (l.max_total(), l.max_per_source())
    };
    let sessions: Sessions = Arc::new(Mutex::new(UdpSessions {
        table: FlowTable::new(idle, max),
        // The table bounds the total (by eviction); the limiter only counts per source.
        limiter: ConnLimiter::new(usize::MAX, per_source),
    }));
    // Expiry: forget idle clients and release their sockets and backend slots.
    {
        let (b, shared, sessions) = (b.clone(), shared.clone(), sessions.clone());
        tokio::spawn(async move {
            let tick = (idle / 4).clamp(Duration::from_millis(20), Duration::from_secs(1));
            loop {
                tokio::time::sleep(tick).await;
                let mut s = lock(&sessions);
                let gone = s.table.expire(Instant::now());
                for (client, sess) in gone {
                    release_session(&b, &shared, &mut s, client, &sess);
                }
            }
        });
    }
    let mut buf = vec![0u8; 65536];
    loop {
        let (n, client) = match sock.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(e) => {
                tracing::debug!("udp recv: {e}");
                continue;
            }
        };
        let now = Instant::now();
        let existing = lock(&sessions).table.get(&client, now);
        // A session whose backend died (or was removed) is re-balanced; draining ones stay.
        let existing =
            existing.filter(|s| b.table().get(s.backend).is_some_and(|x| x.health.is_up()));
        let sess = match existing {
            Some(s) => s,
            None if b.stopping() => continue, // draining: no new sessions
            None => match new_udp_session(&b, &shared, &sock, &sessions, client, listen).await {
                Some(s) => s,
                None => continue,
            },
        };
        match sess.upstream.send(&buf[..n]).await {
            Ok(_) => {
                b.counters.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
                b.table().add_bytes(sess.backend, n as u64, 0);
            }
            Err(e) if is_local_error(&e) => {
                count_and_log(&b.counters.local_errors, |k| {
                    format!("udp send: {} (a local shortage, not counted against the backend; {k} so far)", short_io_error(&e))
                });
            }
            Err(e) => {
                let detail = format!("udp send: {}", short_io_error(&e));
                b.table().handle_passive_failure(sess.backend, now, detail);
            }
        }
    }
}

async fn new_udp_session(
    b: &Arc<Balancer>,
    shared: &Arc<Shared>,
    sock: &Arc<UdpSocket>,
    sessions: &Sessions,
    client: SocketAddr,
    listen: SocketAddr,
) -> Option<Arc<UdpSession>> {
    {
        // An idle (not yet expired) or re-balanced session of this client ends here.
        let mut s = lock(sessions);
        if let Some(old) = s.table.remove(&client) {
            release_session(b, shared, &mut s, client, &old);
        }
        if s.limiter.try_admit(client.ip()).is_err() {
            drop(s);
            count_and_log(&b.counters.rejected, |k| {
                format!("udp client {} is over max_connections_per_source: datagram dropped ({k} so far)", client.ip())
            });
            return None;
        }
        shared.open.fetch_add(1, Ordering::Relaxed);
    }
    // From here on, a failure gives the admission back.
    let give_back = || {
        lock(sessions).limiter.release(client.ip());
        shared.open.fetch_sub(1, Ordering::Relaxed);
    };
    let flow = FlowKey::new(braid_lb::flow::PROTO_UDP, client, listen);
    let key = PickKey {
        flow_hash: flow.hash(),
        client_hash: client_hash(client.ip()),
    };
    let mut exclude = Vec::new();
    let (id, upstream) = loop {
        let Some((id, addr)) = b.table().pick_and_open(key, &exclude) else {
            b.counters.no_backend.fetch_add(1, Ordering::Relaxed);
            give_back();
            return None;
        };
        let bind: SocketAddr = if addr.is_ipv4() {
            (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let e = match UdpSocket::bind(bind).await {
            Ok(u) => match u.connect(addr).await {
                Ok(()) => break (id, u),
                Err(e) => e,
            },
            Err(e) => e,
        };
        b.table().conn_closed(id);
        if is_local_error(&e) {
            count_and_log(&b.counters.local_errors, |k| {
                format!("udp socket for backend {addr}: {} (a local shortage, not counted against the backend; {k} so far)", short_io_error(&e))
            });
            give_back();
            return None;
        }
        b.table().handle_passive_failure(
            id,
            Instant::now(),
            format!("udp connect: {}", short_io_error(&e)),
        );
        exclude.push(id);
        b.counters.retries.fetch_add(1, Ordering::Relaxed);
    };
    b.counters.accepted.fetch_add(1, Ordering::Relaxed);
    let upstream = Arc::new(upstream);
    let replies = tokio::spawn(udp_replies(
        b.clone(),
        sock.clone(),
        sessions.clone(),
        upstream.clone(),
        client,
        id,
    ))
    .abort_handle();
    let sess = Arc::new(UdpSession {
        backend: id,
        upstream,
        replies,
    });
    let mut s = lock(sessions);
    let evicted_before = s.table.evicted();
    let gone = s.table.insert(client, sess.clone(), Instant::now());
    let evicted = s.table.evicted() - evicted_before;
    for (c, old) in gone {
        release_session(b, shared, &mut s, c, &old);
    }
    drop(s);
    for _ in 0..evicted {
        count_and_log(&b.counters.evicted, |k| {
            format!("udp sessions at max_connections: evicted the least recently used ({k} so far)")
        });
    }
    Some(sess)
}

/// Relays a session's replies (backend -> client) through the listening socket, so the client
/// sees the service address as the source. Holds no buffer while waiting.
async fn udp_replies(
    b: Arc<Balancer>,
    sock: Arc<UdpSocket>,
    sessions: Sessions,
    upstream: Arc<UdpSocket>,
    client: SocketAddr,
    backend: BackendId,
) {
    loop {
        if upstream.readable().await.is_err() {
            return;
        }
        loop {
            let r = REPLY_BUF.with(|buf| {
                let mut buf = buf.borrow_mut();
                upstream
                    .try_recv(&mut buf)
                    .map(|n| (n, sock.try_send_to(&buf[..n], client).is_ok()))
            });
            match r {
                Ok((n, true)) => {
                    b.counters.bytes_out.fetch_add(n as u64, Ordering::Relaxed);
                    b.table().add_bytes(backend, 0, n as u64);
                    lock(&sessions).table.get(&client, Instant::now());
                }
                // The listening socket's send buffer is full: the reply is dropped (UDP).
                Ok((_, false)) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if is_local_error(&e) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    break;
                }
                Err(e) => {
                    // ICMP port/host unreachable from the backend: a passive failure.
                    let detail = format!("udp: {}", short_io_error(&e));
                    if let Some(h) =
                        b.table()
                            .handle_passive_failure(backend, Instant::now(), detail.clone())
                    {
                        tracing::warn!("backend is now {h:?} ({detail}, passive)");
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use std::io::{Read, Write};

    /// A backend that reads the whole request (until the client's FIN), then answers with its
    /// length and closes: it only works if the proxy forwards the half-close.
    fn half_close_backend() -> (SocketAddr, std::thread::JoinHandle<()>) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let h = std::thread::spawn(move || {
            for _ in 0..2 {
                let (mut s, _) = l.accept().unwrap();
                let mut got = Vec::new();
                s.read_to_end(&mut got).unwrap();
                write!(s, "got {} bytes", got.len()).unwrap();
            }
        });
        (addr, h)
    }

    #[test]
    fn a_connection_ended_by_its_idle_timeout_is_not_evicted_too() {
        // Two idle connections; the one idle the longest has just hit its own idle timeout (it
        // claimed its end but has not left the table yet). An eviction must not count it, nor
        // close the other: its slot is coming back.
        let shared = Arc::new(Shared::new(2, None));
        let src: IpAddr = "198.18.0.1".parse().unwrap();
        let older = ConnGuard::new(shared.clone(), src);
        let newer = ConnGuard::new(shared.clone(), src);
        newer.state.last_active.store(5, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(20));
        let min_idle = Duration::from_millis(10);
        assert!(older.state.claim_end(), "nothing had ended it");
        assert_eq!(shared.evict_idle(min_idle), Eviction::Ending);
        assert!(newer.state.claim_end(), "the other one was left alone");
        // Once it has gone, the next eviction takes the one idle the longest then.
        drop(older);
        let third = ConnGuard::new(shared.clone(), src);
        third.state.last_active.store(1, Ordering::Relaxed);
        assert_eq!(shared.evict_idle(min_idle), Eviction::Evicted);
        assert!(!third.state.claim_end(), "the eviction claimed it");
        assert_eq!(shared.evict_idle(Duration::from_secs(3600)), Eviction::None);
    }

    #[test]
    fn tcp_half_close_retry_and_byte_counts() {
        let (backend, h) = half_close_backend();
        // A dead backend first in round-robin order: the client must be retried, not refused.
        let dead = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let listen = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let text = format!(
            "[balance]\nname = \"t\"\nlisten = \"{listen}\"\nalgorithm = \"round-robin\"\nhealth = {{ fall = 5 }}\n[[backend]]\naddress = \"{dead}\"\n[[backend]]\naddress = \"{backend}\"\n"
        );
        let b = Balancer::new(Config::parse(std::path::Path::new("t"), &text).unwrap()).unwrap();
        let runner = {
            let b = b.clone();
            std::thread::spawn(move || run(b))
        };
        let connect = || {
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match std::net::TcpStream::connect(listen) {
                    Ok(s) => return s,
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        };
        for _ in 0..2 {
            let mut c = connect();
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            c.write_all(&[7u8; 100_000]).unwrap();
            c.shutdown(std::net::Shutdown::Write).unwrap();
            let mut reply = String::new();
            c.read_to_string(&mut reply).unwrap();
            assert_eq!(reply, "got 100000 bytes");
        }
        h.join().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let st = b.status_json();
            let good = &st["backends"][1];
            if good["active"] == 0 {
                assert_eq!(good["total"], 2, "{st}");
                assert_eq!(good["bytes_in"], 200_000, "{st}");
                assert_eq!(good["bytes_out"], 32, "{st}");
                assert!(st["totals"]["retries"].as_u64().unwrap() >= 1, "{st}");
                assert_eq!(
                    st["backends"][0]["passive_failures"], st["totals"]["retries"],
                    "{st}"
                );
                assert_eq!(st["totals"]["no_backend"], 0, "{st}");
                break;
            }
            assert!(Instant::now() < deadline, "connections never closed: {st}");
            std::thread::sleep(Duration::from_millis(10));
        }
        b.stop();
        runner.join().unwrap().unwrap();
    }
}
