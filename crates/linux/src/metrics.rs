//! A tiny HTTP/1.0 server for Prometheus scrapes: `GET /metrics` answers with whatever the
//! `render` callback returns (OpenMetrics text, as `prometheus-client` encodes it). Connections
//! are served concurrently with bounded resources ([`crate::serve`]): at most
//! [`DEFAULT_LIMITS`]`.max_conns` at once (one more gets a `503` at once), and a request head
//! must arrive whole within the deadline, so a slow or stuck client never holds up a scrape.
//! [`response`] is the whole HTTP side (parse the head, build the reply), free of I/O.
//!
//! [`register_build_info`] adds the `braid_build_info` gauge every braid endpoint exports.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::serve::{spawn_acceptor, DeadlineReader, Limits};

/// Scrapes served at once, and how long a request head may take to arrive.
pub const DEFAULT_LIMITS: Limits = Limits {
    max_conns: 16,
    deadline: Duration::from_secs(5),
};

/// The longest request head read (a scrape's is a few hundred bytes).
pub const MAX_HEAD: usize = 16 * 1024;

static GIT_COMMIT: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// Sets the git commit `braid_build_info` reports (the binary knows it from its build script);
/// once, at start-up. Without it the commit is "unknown".
pub fn set_git_commit(commit: &'static str) {
    let _ = GIT_COMMIT.set(commit);
}

fn git_commit() -> &'static str {
    GIT_COMMIT.get().copied().unwrap_or("unknown")
}

/// Registers `braid_build_info{version="...",commit="..."} 1` (the Prometheus convention for
/// build facts: a constant gauge whose labels carry them, to join on or alert about mixed
/// versions). `registry` must be the root registry (no prefix), so the name is the same for the
/// tunnel and the balancer.
pub fn register_build_info(registry: &mut prometheus_client::registry::Registry) {
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;
    let info: Family<Vec<(&'static str, &'static str)>, Gauge> = Family::default();
    info.get_or_create(&vec![
        ("version", env!("CARGO_PKG_VERSION")),
        ("commit", git_commit()),
    ])
    .set(1);
    registry.register("braid_build_info", "braid's version and git commit", info);
}

pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MetricsServer {
    /// Listens on `addr` (TCP) and serves `render()` on `GET /metrics`, within [`DEFAULT_LIMITS`].
    pub fn bind<R>(addr: SocketAddr, render: R) -> anyhow::Result<MetricsServer>
    where
        R: Fn() -> String + Send + 'static,
    {
        Self::bind_with(addr, DEFAULT_LIMITS, render)
    }

    /// [`MetricsServer::bind`] with other limits.
    pub fn bind_with<R>(
        addr: SocketAddr,
        limits: Limits,
        render: R,
    ) -> anyhow::Result<MetricsServer>
    where
        R: Fn() -> String + Send + 'static,
    {
        let listener = TcpListener::bind(addr)
            .map_err(|e| anyhow::anyhow!("cannot listen for metrics on {addr}: {e}"))?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        // One render at a time (it walks shared state; scrapes are rare), each connection in its
        // own thread so that a slow client waits alone.
        let render = Mutex::new(render);
        let thread = spawn_acceptor(
            "braid-metrics",
            listener,
            limits.max_conns,
            stop.clone(),
            move |conn| {
                let _ = serve_one(conn, limits.deadline, &|| {
                    (render.lock().unwrap_or_else(|p| p.into_inner()))()
                });
            },
            refuse,
        )?;
        Ok(MetricsServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Too many connections: a `503` at once, without reading the request (never blocks: a short
/// write to a fresh socket fits its buffer; non-blocking in case it does not).
fn refuse(mut conn: TcpStream) {
    let _ = conn.set_nonblocking(true);
    // Read what already came, so that closing does not reset the connection (and lose the 503).
    let _ = conn.read(&mut [0u8; 4096]);
    let body = "too many connections; retry\n";
    let _ = conn.write_all(format!(
        "HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ).as_bytes());
    let _ = conn.shutdown(std::net::Shutdown::Write);
}

fn serve_one(
    conn: TcpStream,
    deadline: Duration,
    render: &dyn Fn() -> String,
) -> std::io::Result<()> {
    conn.set_write_timeout(Some(Duration::from_secs(5)))?;
    // Borrows of the one descriptor (a `try_clone` fails when descriptors run out).
    let mut out = &conn;
    let mut reader = DeadlineReader::new(&conn, Instant::now() + deadline);
    let head = read_head(&mut reader)?;
    out.write_all(&response(&head, render))
}

/// Reads up to the end of the request head (an empty line), at most [`MAX_HEAD`] bytes.
fn read_head(r: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head_complete(&head) && head.len() <= MAX_HEAD {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    Ok(head)
}

fn head_complete(head: &[u8]) -> bool {
    head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n")
}

/// The whole reply to the request head `head` (any bytes; only the request line is read):
/// `GET`/`HEAD /metrics` gets `render()`, other paths 404, other methods 405. `render` is called
/// only for a metrics request.
pub fn response(head: &[u8], render: &dyn Fn() -> String) -> Vec<u8> {
    let text = String::from_utf8_lossy(head);
    let mut parts = text.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, ctype, body) = match (method, path) {
        ("GET", "/metrics") | ("HEAD", "/metrics") => ("200 OK", CONTENT_TYPE, render()),
        ("GET", "/") => (
            "200 OK",
            "text/plain; charset=utf-8",
            "braid: metrics at /metrics\n".to_string(),
        ),
        ("GET", _) | ("HEAD", _) => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "not found; try /metrics\n".to_string(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "only GET\n".to_string(),
        ),
    };
    let mut resp = format!(
        "HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if method != "HEAD" {
        resp.extend_from_slice(body.as_bytes());
    }
    resp
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scrape: the reply as text (whatever arrived before the server closed).
    fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = connect(addr);
        // One write: a refused connection is closed at once, a second write would fail.
        let _ = s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes());
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).to_string()
    }

    #[test]
    fn serves_metrics_and_404() {
        let srv = MetricsServer::bind("127.0.0.1:0".parse().unwrap(), || {
            "x_total 1\n# EOF\n".to_string()
        })
        .unwrap();
        let r = get(srv.local_addr(), "/metrics");
        assert!(r.starts_with("HTTP/1.0 200 OK"), "{r}");
        assert!(r.ends_with("x_total 1\n# EOF\n"));
        assert!(get(srv.local_addr(), "/nope").starts_with("HTTP/1.0 404"));
    }

    fn connect(addr: SocketAddr) -> TcpStream {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s
    }

    #[test]
    fn a_slow_client_does_not_block_a_scrape() {
        let srv = MetricsServer::bind("127.0.0.1:0".parse().unwrap(), || {
            "x_total 1\n# EOF\n".to_string()
        })
        .unwrap();
        // Two clients that connected and then trickle (or send nothing at all).
        let mut slow = connect(srv.local_addr());
        slow.write_all(b"GET /met").unwrap();
        let _silent = connect(srv.local_addr());
        std::thread::sleep(Duration::from_millis(100));
        let start = Instant::now();
        let r = get(srv.local_addr(), "/metrics");
        assert!(r.ends_with("x_total 1\n# EOF\n"), "{r}");
        assert!(
            start.elapsed() < Duration::from_millis(500),
            "the scrape waited {:?} behind the slow clients",
            start.elapsed()
        );
    }

    #[test]
    fn a_slow_loris_is_cut_at_the_deadline() {
        let limits = Limits {
            max_conns: 4,
            deadline: Duration::from_millis(300),
        };
        let srv = MetricsServer::bind_with("127.0.0.1:0".parse().unwrap(), limits, || {
            "x 1\n".to_string()
        })
        .unwrap();
        let mut s = connect(srv.local_addr());
        let start = Instant::now();
        // A byte every 50 ms never completes the head; the server hangs up at its deadline.
        let mut cut = false;
        for b in b"GET /metrics HTTP/1.0\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" {
            if s.write_all(&[*b]).is_err() {
                cut = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
            if start.elapsed() > Duration::from_secs(3) {
                break;
            }
        }
        let mut rest = Vec::new();
        let r = s.read_to_end(&mut rest);
        assert!(
            cut || matches!(r, Ok(0)) || r.is_err(),
            "not cut: {r:?} {rest:?}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn too_many_connections_are_refused_not_queued() {
        let limits = Limits {
            max_conns: 2,
            deadline: Duration::from_secs(10),
        };
        let srv = MetricsServer::bind_with("127.0.0.1:0".parse().unwrap(), limits, || {
            "x 1\n".to_string()
        })
        .unwrap();
        let _held: Vec<TcpStream> = (0..2).map(|_| connect(srv.local_addr())).collect();
        std::thread::sleep(Duration::from_millis(100));
        let start = Instant::now();
        let r = get(srv.local_addr(), "/metrics");
        assert!(r.starts_with("HTTP/1.0 503"), "{r}");
        assert!(start.elapsed() < Duration::from_secs(1));
        // Once a slot is free, scrapes are served again.
        drop(_held);
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let r = get(srv.local_addr(), "/metrics");
            if r.starts_with("HTTP/1.0 200") {
                break;
            }
            assert!(Instant::now() < deadline, "{r}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn response_answers_any_head() {
        let render = || "m 1\n".to_string();
        let ok =
            String::from_utf8(response(b"GET /metrics?x=1 HTTP/1.1\r\n\r\n", &render)).unwrap();
        assert!(
            ok.starts_with("HTTP/1.0 200 OK\r\n") && ok.ends_with("\r\n\r\nm 1\n"),
            "{ok}"
        );
        let head = String::from_utf8(response(b"HEAD /metrics HTTP/1.0\n\n", &render)).unwrap();
        assert!(
            head.contains("Content-Length: 4\r\n") && head.ends_with("\r\n\r\n"),
            "{head}"
        );
        let called = std::cell::Cell::new(false);
        let spy = || {
            called.set(true);
            String::new()
        };
        for (req, want) in [
            (&b"POST /metrics HTTP/1.0\r\n\r\n"[..], "HTTP/1.0 405"),
            (b"GET /nope HTTP/1.0\r\n\r\n", "HTTP/1.0 404"),
            (b"", "HTTP/1.0 405"),
            (b"\xff\xfe GET", "HTTP/1.0 405"),
        ] {
            let r = String::from_utf8_lossy(&response(req, &spy)).to_string();
            assert!(r.starts_with(want), "{req:?} -> {r}");
        }
        assert!(
            !called.get(),
            "render ran for a request that is not a scrape"
        );
    }

    #[test]
    fn build_info_names_version_and_commit() {
        let mut reg = prometheus_client::registry::Registry::default();
        register_build_info(&mut reg);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &reg).unwrap();
        let want = format!(
            "braid_build_info{{version=\"{}\",commit=\"{}\"}} 1\n",
            env!("CARGO_PKG_VERSION"),
            git_commit()
        );
        assert!(out.contains(&want), "{out}");
        assert!(out.contains("# TYPE braid_build_info gauge"), "{out}");
    }
}
