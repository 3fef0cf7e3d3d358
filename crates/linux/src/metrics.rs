//! A tiny HTTP/1.0 server for Prometheus scrapes: `GET /metrics` answers with whatever the
//! `render` callback returns (OpenMetrics text, as `prometheus-client` encodes it). One thread,
//! one short connection at a time: a scrape every few seconds needs no more.
//!
//! [`register_build_info`] adds the `braid_build_info` gauge every braid endpoint exports.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

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
    /// Listens on `addr` (TCP) and serves `render()` on `GET /metrics`.
    pub fn bind<R>(addr: SocketAddr, render: R) -> anyhow::Result<MetricsServer>
    where
        R: Fn() -> String + Send + 'static,
    {
        let listener = TcpListener::bind(addr)
            .map_err(|e| anyhow::anyhow!("cannot listen for metrics on {addr}: {e}"))?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("braid-metrics".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if stop2.load(Ordering::Relaxed) {
                        break;
                    }
                    if let Ok(conn) = conn {
                        let _ = serve_one(conn, &render);
                    }
                }
            })?;
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

fn serve_one(mut conn: TcpStream, render: &dyn Fn() -> String) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(2)))?;
    conn.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let n = conn.read(&mut buf)?;
        if n == 0 || head.len() > 16 * 1024 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&head);
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
    conn.write_all(&resp)
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

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
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
