//! Proxy mode: the balancer terminates the client's TCP connection and opens one to the chosen
//! backend (retrying the client on another backend when a connect fails), or relays UDP
//! datagrams with per-client affinity. Runs on a tokio runtime with one worker per core.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use braid_lb::flow::{client_hash, FlowKey};
use braid_lb::{BackendId, FlowTable, PickKey};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

use crate::balancer::{short_io_error, Balancer};
use crate::config::Protocol;

/// Runs the proxy until the balancer is told to stop.
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
    raise_fd_limit();
    // Bind every socket before starting, so that a bad address is an error, not a log line.
    let mut sockets = Vec::new();
    for _ in 0..workers {
        sockets.push(match b.config.protocol {
            Protocol::Tcp => Listener::Tcp(tcp_listener(listen, workers > 1)?),
            Protocol::Udp => Listener::Udp(udp_socket(listen)?),
        });
    }
    tracing::info!(
        "balancer {}: proxying {} {listen} over {} backends ({}), {workers} worker thread(s)",
        b.config.name,
        b.config.protocol.as_str(),
        b.config.backends.len(),
        b.config.algorithm
    );
    let mut threads = Vec::new();
    for (i, sock) in sockets.into_iter().enumerate() {
        let b = b.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("braid-proxy-{i}"))
                .spawn(move || worker(b, sock, listen))?,
        );
    }
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

/// Each proxied TCP connection holds two descriptors: raise the soft limit to the hard one (the
/// usual soft default of 1024 would cap us at ~500 concurrent clients).
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read/write the struct we pass.
    #[allow(unsafe_code)]
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                tracing::debug!("could not raise the open-files limit");
            }
        }
    }
}

enum Listener {
    Tcp(std::net::TcpListener),
    Udp(std::net::UdpSocket),
}

fn worker(b: Arc<Balancer>, sock: Listener, listen: SocketAddr) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let stop = {
            let b = b.clone();
            async move {
                while !b.stopping() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        match sock {
            Listener::Tcp(l) => {
                let l = TcpListener::from_std(l)?;
                tokio::select! {
                    r = tcp_accept_loop(b.clone(), l, listen) => r,
                    _ = stop => Ok(()),
                }
            }
            Listener::Udp(s) => {
                let s = UdpSocket::from_std(s)?;
                tokio::select! {
                    r = udp_loop(b.clone(), s, listen) => r,
                    _ = stop => Ok(()),
                }
            }
        }
    })
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

async fn tcp_accept_loop(
    b: Arc<Balancer>,
    l: TcpListener,
    listen: SocketAddr,
) -> anyhow::Result<()> {
    loop {
        let (client, peer) = match l.accept().await {
            Ok(x) => x,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning; never give up the listener.
                tracing::warn!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        b.counters.accepted.fetch_add(1, Ordering::Relaxed);
        let b = b.clone();
        tokio::spawn(async move {
            serve_tcp(b, client, peer, listen).await;
        });
    }
}

/// Picks a backend and connects; on failure records a passive failure and tries the next backend
/// (never the same one twice), so a client is refused only when no backend at all answers.
async fn connect_backend(b: &Balancer, key: PickKey) -> Option<(BackendId, TcpStream)> {
    let mut exclude: Vec<BackendId> = Vec::new();
    loop {
        let picked = b.table().pick_and_open(key, &exclude);
        let Some((id, addr)) = picked else {
            b.counters.no_backend.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let err =
            match tokio::time::timeout(b.config.connect_timeout, TcpStream::connect(addr)).await {
                Ok(Ok(s)) => return Some((id, s)),
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

async fn serve_tcp(b: Arc<Balancer>, mut client: TcpStream, peer: SocketAddr, listen: SocketAddr) {
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
    let (to_backend, to_client) = relay(&b, id, &mut client, &mut upstream).await;
    let mut t = b.table();
    t.add_bytes(id, to_backend, to_client);
    t.conn_closed(id);
}

/// Bytes not yet credited to the table are flushed every this many bytes (and at the end).
const FLUSH_BYTES: u64 = 4 << 20;
/// A direction's buffer starts small (most connections are short) and doubles, up to `BUF_MAX`,
/// whenever a read fills it (a bulk transfer).
const BUF_MIN: usize = 8 * 1024;
const BUF_MAX: usize = 256 * 1024;

/// Copies both ways until both sides have finished. A read EOF on one side becomes a write
/// shutdown (FIN) on the other (half-close); an error on either side ends both.
async fn relay(
    b: &Balancer,
    id: BackendId,
    client: &mut TcpStream,
    upstream: &mut TcpStream,
) -> (u64, u64) {
    let (mut cr, mut cw) = client.split();
    let (mut ur, mut uw) = upstream.split();
    let mut done_in = 0u64;
    let mut done_out = 0u64;
    let first_eof = AtomicBool::new(false);
    let up = copy_half(b, id, true, &first_eof, &mut cr, &mut uw);
    let down = copy_half(b, id, false, &first_eof, &mut ur, &mut cw);
    tokio::pin!(up, down);
    let mut up_done = false;
    let mut down_done = false;
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
        }
    }
    (done_in, done_out)
}

/// One direction; returns the bytes not yet credited (`Err` on an I/O error). `first_eof`: the
/// first direction to see EOF forwards it with a shutdown (half-close); the second skips the
/// syscall, since both sockets are closed right after (their FIN goes out then).
async fn copy_half<R, W>(
    b: &Balancer,
    id: BackendId,
    to_backend: bool,
    first_eof: &AtomicBool,
    r: &mut R,
    w: &mut W,
) -> Result<u64, u64>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    // `read_buf` fills spare capacity: no zeroing of buffers per connection.
    let mut buf: Vec<u8> = Vec::with_capacity(BUF_MIN);
    let mut pending = 0u64;
    loop {
        buf.clear();
        let n = match r.read_buf(&mut buf).await {
            Ok(0) => {
                if !first_eof.swap(true, Ordering::Relaxed) {
                    let _ = w.shutdown().await;
                }
                return Ok(pending);
            }
            Ok(n) => n,
            Err(_) => return Err(pending),
        };
        if w.write_all(&buf[..n]).await.is_err() {
            return Err(pending);
        }
        if n == buf.capacity() && n < BUF_MAX {
            buf.reserve_exact((2 * n).min(BUF_MAX) - n);
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

/// One client's UDP session: a connected socket towards its backend.
struct UdpSession {
    backend: BackendId,
    upstream: Arc<UdpSocket>,
    closed: AtomicBool,
}

type Sessions = Arc<Mutex<FlowTable<Arc<UdpSession>, SocketAddr>>>;

async fn udp_loop(b: Arc<Balancer>, sock: UdpSocket, listen: SocketAddr) -> anyhow::Result<()> {
    let sock = Arc::new(sock);
    let idle = b.config.udp_idle_timeout;
    let sessions: Sessions = Arc::new(Mutex::new(FlowTable::new(idle, b.config.max_flows)));
    // Expiry: forget idle clients and release their backend slot.
    {
        let (b, sessions) = (b.clone(), sessions.clone());
        tokio::spawn(async move {
            let tick = (idle / 4).clamp(Duration::from_millis(20), Duration::from_secs(1));
            loop {
                tokio::time::sleep(tick).await;
                let gone = sessions
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .expire(Instant::now());
                if !gone.is_empty() {
                    let mut t = b.table();
                    for (_, s) in gone {
                        if !s.closed.swap(true, Ordering::Relaxed) {
                            t.conn_closed(s.backend);
                        }
                    }
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
        let existing = sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&client, now);
        // A session whose backend died (or was removed) is re-balanced; draining ones stay.
        let existing = match existing {
            Some(s) => {
                let alive = b.table().get(s.backend).is_some_and(|x| x.health.is_up());
                if alive {
                    Some(s)
                } else {
                    if let Some(old) = sessions
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&client)
                    {
                        if !old.closed.swap(true, Ordering::Relaxed) {
                            b.table().conn_closed(old.backend);
                        }
                    }
                    None
                }
            }
            None => None,
        };
        let sess = match existing {
            Some(s) => s,
            None => match new_udp_session(&b, &sock, &sessions, client, listen).await {
                Some(s) => s,
                None => continue,
            },
        };
        match sess.upstream.send(&buf[..n]).await {
            Ok(_) => {
                b.counters.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
                b.table().add_bytes(sess.backend, n as u64, 0);
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
    sock: &Arc<UdpSocket>,
    sessions: &Sessions,
    client: SocketAddr,
    listen: SocketAddr,
) -> Option<Arc<UdpSession>> {
    let flow = FlowKey::new(braid_lb::flow::PROTO_UDP, client, listen);
    let key = PickKey {
        flow_hash: flow.hash(),
        client_hash: client_hash(client.ip()),
    };
    let mut exclude = Vec::new();
    let (id, upstream) = loop {
        let Some((id, addr)) = b.table().pick_and_open(key, &exclude) else {
            b.counters.no_backend.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let bind: SocketAddr = if addr.is_ipv4() {
            "0.0.0.0:0".parse().ok()?
        } else {
            "[::]:0".parse().ok()?
        };
        match UdpSocket::bind(bind).await {
            Ok(u) => match u.connect(addr).await {
                Ok(()) => break (id, u),
                Err(e) => {
                    b.table().conn_closed(id);
                    b.table().handle_passive_failure(
                        id,
                        Instant::now(),
                        format!("udp connect: {}", short_io_error(&e)),
                    );
                    exclude.push(id);
                    b.counters.retries.fetch_add(1, Ordering::Relaxed);
                }
            },
            Err(e) => {
                b.table().conn_closed(id);
                tracing::warn!("udp bind: {e}");
                return None;
            }
        }
    };
    b.counters.accepted.fetch_add(1, Ordering::Relaxed);
    let sess = Arc::new(UdpSession {
        backend: id,
        upstream: Arc::new(upstream),
        closed: AtomicBool::new(false),
    });
    sessions
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(client, sess.clone(), Instant::now());
    // Replies: backend -> client, through the listening socket (so the client sees the service
    // address as the source).
    let (b, sock, sessions, s2) = (b.clone(), sock.clone(), sessions.clone(), sess.clone());
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65536];
        while !s2.closed.load(Ordering::Relaxed) {
            match tokio::time::timeout(Duration::from_millis(500), s2.upstream.recv(&mut buf)).await
            {
                Err(_) => {
                    // Evicted from a full table without expiry: nobody else will close it.
                    let present = sessions
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .peek(&client)
                        .is_some_and(|s| Arc::ptr_eq(s, &s2));
                    if !present && !s2.closed.swap(true, Ordering::Relaxed) {
                        b.table().conn_closed(s2.backend);
                    }
                }
                Ok(Ok(n)) => {
                    if sock.send_to(&buf[..n], client).await.is_ok() {
                        b.counters.bytes_out.fetch_add(n as u64, Ordering::Relaxed);
                        b.table().add_bytes(s2.backend, 0, n as u64);
                        sessions
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .get(&client, Instant::now());
                    }
                }
                Ok(Err(e)) => {
                    // ICMP port/host unreachable from the backend: a passive failure.
                    let detail = format!("udp: {}", short_io_error(&e));
                    if let Some(h) =
                        b.table()
                            .handle_passive_failure(s2.backend, Instant::now(), detail.clone())
                    {
                        tracing::warn!("backend is now {h:?} ({detail}, passive)");
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    });
    Some(sess)
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
