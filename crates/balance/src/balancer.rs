//! State shared by both runtimes (proxy and DSR): the configuration, the backend table behind a
//! lock, counters, the health-checker thread, the control-socket handler (`status`,
//! `backend-*`), and the Prometheus metrics text.
//!
//! A runtime gets an `Arc<Balancer>`, picks backends with `table.lock().pick_and_open(..)`,
//! reports `conn_closed`/`add_bytes`/`handle_passive_failure`, and returns when
//! [`Balancer::stopping`] turns true.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use braid_lb::{BackendTable, HealthParams};
use serde_json::{json, Value};

use crate::config::{Config, Mode, Protocol};
use crate::dsr::DsrStatus;

/// Balancer-wide counters (per-backend ones live in the table).
#[derive(Debug, Default)]
pub struct Counters {
    /// Connections (TCP) or new flows (UDP, DSR) accepted.
    pub accepted: AtomicU64,
    /// Clients turned away because no backend could take them.
    pub no_backend: AtomicU64,
    /// Clients retried on another backend after a failed connect.
    pub retries: AtomicU64,
    /// Failed connects to backends.
    pub connect_failures: AtomicU64,
    /// Bytes client -> backends.
    pub bytes_in: AtomicU64,
    /// Bytes backends -> clients (through the balancer).
    pub bytes_out: AtomicU64,
    /// Proxy: clients refused by a limit (`max_connections_per_source`; a UDP datagram that
    /// would have opened a session over it).
    pub rejected: AtomicU64,
    /// Proxy: clients closed to make room at `max_connections` (TCP: the connection idle the
    /// longest; UDP: the least recently used session).
    pub evicted: AtomicU64,
    /// Proxy (TCP): connections closed after `tcp_idle_timeout_ms` without a byte.
    pub idle_closed: AtomicU64,
    /// Proxy (TCP): times accepting paused at `max_connections` with no idle connection to close.
    pub limit_waits: AtomicU64,
    /// Proxy (TCP): failed `accept` calls (e.g. EMFILE): the listener backs off and keeps going.
    pub accept_errors: AtomicU64,
    /// Connects, binds or sends that failed for a local reason (EMFILE, ENFILE, ENOBUFS, ENOMEM,
    /// EADDRNOTAVAIL): never counted against a backend.
    pub local_errors: AtomicU64,
    /// Active health checks that could not run for a local reason (not counted either way).
    pub health_local_errors: AtomicU64,
}

/// The shared state of a running balancer.
pub struct Balancer {
    pub config: Config,
    /// The backends and the selection algorithm.
    pub table: Arc<Mutex<BackendTable>>,
    pub counters: Counters,
    /// Set by SIGINT/SIGTERM (or [`Balancer::stop`]): runtimes return soon after.
    pub stop: Arc<AtomicBool>,
    pub started: Instant,
    /// DSR mode: the data path's figures, for `status` (`"dsr"`) and the metrics.
    dsr: OnceLock<Arc<Mutex<DsrStatus>>>,
    /// Proxy mode: the runtime's limits and open count, for `status`.
    proxy: OnceLock<Box<dyn Fn() -> Value + Send + Sync>>,
}

impl Balancer {
    /// Builds the table from the configuration (all backends start up and active).
    pub fn new(config: Config) -> anyhow::Result<Arc<Balancer>> {
        let mut table = BackendTable::new(
            config.algorithm,
            config.table_size,
            HealthParams {
                fall: config.health.fall,
                rise: config.health.rise,
            },
        )?;
        for b in &config.backends {
            table.add(b.address, b.weight)?;
        }
        Ok(Arc::new(Balancer {
            config,
            table: Arc::new(Mutex::new(table)),
            counters: Counters::default(),
            stop: Arc::new(AtomicBool::new(false)),
            started: Instant::now(),
            dsr: OnceLock::new(),
            proxy: OnceLock::new(),
        }))
    }

    /// The table, locked (a poisoned lock is recovered: the table stays consistent per call).
    pub fn table(&self) -> MutexGuard<'_, BackendTable> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Called by a runtime once its listeners (proxy) or its data path (DSR) are open: tells
    /// systemd (Type=notify) that the balancer serves.
    pub fn notify_ready(&self) {
        let c = &self.config;
        let on = match (c.listen, c.vip) {
            (Some(l), _) => l.to_string(),
            (None, Some(v)) => v.to_string(),
            (None, None) => String::new(),
        };
        braid_linux::service::ready(&format!(
            "balancer {} ({} {} {on}), {} backend(s)",
            c.name,
            c.mode.as_str(),
            c.protocol.as_str(),
            self.table().backends().len()
        ));
    }

    /// DSR mode: shows the data path's figures (refreshed by the data path) in `status` and the
    /// metrics. Once per balancer; a second call is ignored.
    pub fn attach_dsr_status(&self, status: Arc<Mutex<DsrStatus>>) {
        let _ = self.dsr.set(status);
    }

    /// Proxy mode: `f` gives the runtime's limits and open count for `status` (under
    /// `"proxy"`). Once per balancer; a second call is ignored.
    pub fn attach_proxy_status(&self, f: impl Fn() -> Value + Send + Sync + 'static) {
        let _ = self.proxy.set(Box::new(f));
    }

    fn dsr_status(&self) -> Option<DsrStatus> {
        let s = self.dsr.get()?;
        Some(s.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    /// Parses a backend address given to `braid backend ...` (DSR: a bare IP takes the VIP's port).
    pub fn parse_backend_addr(&self, s: &str) -> anyhow::Result<SocketAddr> {
        if let Ok(a) = s.parse::<SocketAddr>() {
            if self.config.mode == Mode::Proxy && a.port() == 0 {
                anyhow::bail!("backend address {s:?}: port must not be 0 in proxy mode");
            }
            return Ok(a);
        }
        if self.config.mode == Mode::Dsr {
            let ip = s
                .strip_prefix('[')
                .and_then(|x| x.strip_suffix(']'))
                .unwrap_or(s);
            if let Ok(ip) = ip.parse::<std::net::IpAddr>() {
                return Ok(SocketAddr::new(
                    ip,
                    self.config.vip.map(|v| v.port()).unwrap_or(0),
                ));
            }
        }
        anyhow::bail!("bad backend address {s:?} (expected e.g. 198.18.0.3:8080)")
    }

    /// The `status` reply.
    pub fn status_json(&self) -> Value {
        let now = Instant::now();
        let c = &self.counters;
        let (backends, active) = {
            let t = self.table();
            let mut active = 0u64;
            let list: Vec<Value> = t
                .backends()
                .iter()
                .map(|b| {
                    active += b.active;
                    let health = b.last_check().map(|h| {
                        json!({
                            "ok": h.ok,
                            "kind": match h.kind { braid_lb::CheckKind::Active => "active", braid_lb::CheckKind::Passive => "passive" },
                            "detail": h.detail,
                            "age_ms": now.saturating_duration_since(h.at).as_millis() as u64,
                            "took_us": h.took.map(|d| d.as_micros() as u64),
                        })
                    });
                    json!({
                        "address": b.addr.to_string(),
                        "state": b.state().as_str(),
                        "weight": b.weight,
                        "active": b.active,
                        "total": b.total,
                        "bytes_in": b.bytes_in,
                        "bytes_out": b.bytes_out,
                        "passive_failures": b.passive_failures,
                        "last_health": health,
                    })
                })
                .collect();
            (list, active)
        };
        let cfg = &self.config;
        let mut v = json!({
            "kind": "balance",
            "name": cfg.name,
            "mode": cfg.mode.as_str(),
            "protocol": cfg.protocol.as_str(),
            "algorithm": cfg.algorithm.name(),
            "listen": cfg.listen.map(|a| a.to_string()),
            "vip": cfg.vip.map(|a| a.to_string()),
            "interface": cfg.interface,
            "uptime_ms": now.saturating_duration_since(self.started).as_millis() as u64,
            "health_check": {
                "interval_ms": cfg.health.interval.as_millis() as u64,
                "timeout_ms": cfg.health.timeout.as_millis() as u64,
                "fall": cfg.health.fall,
                "rise": cfg.health.rise,
                "http_path": cfg.health.http_path,
            },
            "backends": backends,
            "totals": {
                "accepted": c.accepted.load(Ordering::Relaxed),
                "active": active,
                "no_backend": c.no_backend.load(Ordering::Relaxed),
                "retries": c.retries.load(Ordering::Relaxed),
                "connect_failures": c.connect_failures.load(Ordering::Relaxed),
                "bytes_in": c.bytes_in.load(Ordering::Relaxed),
                "bytes_out": c.bytes_out.load(Ordering::Relaxed),
                "rejected": c.rejected.load(Ordering::Relaxed),
                "evicted": c.evicted.load(Ordering::Relaxed),
                "idle_closed": c.idle_closed.load(Ordering::Relaxed),
                "limit_waits": c.limit_waits.load(Ordering::Relaxed),
                "accept_errors": c.accept_errors.load(Ordering::Relaxed),
                "local_errors": c.local_errors.load(Ordering::Relaxed),
                "health_local_errors": c.health_local_errors.load(Ordering::Relaxed),
            },
            "stopping": self.stopping(),
        });
        if let Some(d) = self.dsr_status() {
            v["dsr"] = d.to_json();
        }
        if let Some(p) = self.proxy.get() {
            v["proxy"] = p();
        }
        v
    }

    /// Answers one control request (`{"cmd": ...}`); errors become `{"error": "..."}`.
    pub fn handle_control(&self, req: &Value) -> Value {
        match self.control(req) {
            Ok(v) => v,
            Err(e) => json!({ "error": format!("{e:#}") }),
        }
    }

    fn control(&self, req: &Value) -> anyhow::Result<Value> {
        let cmd = req.get("cmd").and_then(Value::as_str).unwrap_or("");
        if cmd == "status" {
            return Ok(self.status_json());
        }
        let addr_arg = || -> anyhow::Result<SocketAddr> {
            let s = req
                .get("address")
                .and_then(Value::as_str)
                .ok_or_else(|| anyhow::anyhow!("{cmd}: missing \"address\""))?;
            self.parse_backend_addr(s)
        };
        let weight_arg = |default: Option<u64>| -> anyhow::Result<u32> {
            let w = match req.get("weight") {
                None | Some(Value::Null) => {
                    default.ok_or_else(|| anyhow::anyhow!("{cmd}: missing \"weight\""))?
                }
                Some(w) => w.as_u64().ok_or_else(|| {
                    anyhow::anyhow!("{cmd}: weight must be a whole number from 1 to 10000")
                })?,
            };
            if !(1..=10_000).contains(&w) {
                anyhow::bail!("weight {w}: expected 1 to 10000");
            }
            Ok(w as u32)
        };
        let msg = match cmd {
            "backend-add" => {
                let a = addr_arg()?;
                let w = weight_arg(Some(1))?;
                self.table().add(a, w)?;
                format!("added backend {a} (weight {w})")
            }
            "backend-remove" => {
                let a = addr_arg()?;
                let b = self.table().remove(a)?;
                format!("removed backend {a} ({} connections left to finish)", b.active)
            }
            "backend-drain" => {
                let a = addr_arg()?;
                self.table().drain(a)?;
                format!("draining backend {a}: no new connections, existing ones finish")
            }
            "backend-undrain" => {
                let a = addr_arg()?;
                self.table().undrain(a)?;
                format!("backend {a} takes new connections again")
            }
            "backend-set-weight" => {
                let a = addr_arg()?;
                let w = weight_arg(None)?;
                self.table().set_weight(a, w)?;
                format!("backend {a} weight {w}")
            }
            "" => anyhow::bail!("request without \"cmd\""),
            other => anyhow::bail!("unknown command {other:?} (this is a balancer: status, backend-add, backend-remove, backend-drain, backend-undrain, backend-set-weight)"),
        };
        tracing::info!("{msg}");
        Ok(json!({ "ok": true, "message": msg }))
    }

    /// Prometheus text (OpenMetrics, via prometheus-client): per-backend state, weight,
    /// connections and bytes; balancer totals; in DSR mode the data path's counters
    /// (`braid_balance_dsr_*`); `braid_build_info`. Names follow the Prometheus naming guide
    /// (`_total` counters, bytes); docs/balance.md lists them all, and a test checks that every
    /// name exported is listed there.
    pub fn metrics_text(&self) -> String {
        use prometheus_client::encoding::text::encode;
        use prometheus_client::metrics::counter::Counter;
        use prometheus_client::metrics::family::Family;
        use prometheus_client::metrics::gauge::Gauge;
        use prometheus_client::registry::Registry;
        type L = Vec<(String, String)>;
        let mut root = Registry::default();
        braid_linux::metrics::register_build_info(&mut root);
        let reg = root.sub_registry_with_prefix("braid_balance");
        let up: Family<L, Gauge> = Family::default();
        let weight: Family<L, Gauge> = Family::default();
        let active: Family<L, Gauge> = Family::default();
        let total: Family<L, Counter> = Family::default();
        let bytes: Family<L, Counter> = Family::default();
        let passive: Family<L, Counter> = Family::default();
        {
            let t = self.table();
            for b in t.backends() {
                let l = |extra: &[(&str, &str)]| -> L {
                    let mut v = vec![("backend".to_string(), b.addr.to_string())];
                    v.extend(extra.iter().map(|(k, x)| (k.to_string(), x.to_string())));
                    v
                };
                for s in ["up", "down", "draining"] {
                    up.get_or_create(&l(&[("state", s)]))
                        .set(i64::from(b.state().as_str() == s));
                }
                weight.get_or_create(&l(&[])).set(i64::from(b.weight));
                active.get_or_create(&l(&[])).set(b.active as i64);
                total.get_or_create(&l(&[])).inc_by(b.total);
                bytes
                    .get_or_create(&l(&[("direction", "to_backend")]))
                    .inc_by(b.bytes_in);
                bytes
                    .get_or_create(&l(&[("direction", "to_client")]))
                    .inc_by(b.bytes_out);
                passive.get_or_create(&l(&[])).inc_by(b.passive_failures);
            }
        }
        reg.register("backend_state", "Backend state (1 for the current one)", up);
        reg.register("backend_weight", "Backend weight", weight);
        reg.register(
            "backend_active_connections",
            "Connections (or flows) in progress",
            active,
        );
        reg.register(
            "backend_connections",
            "Connections (or flows) assigned",
            total,
        );
        reg.register("backend_bytes", "Bytes relayed", bytes);
        reg.register(
            "backend_passive_failures",
            "Failed connects while serving clients",
            passive,
        );
        let c = &self.counters;
        for (name, help, v) in [
            (
                "connections",
                "Connections (or flows) accepted",
                &c.accepted,
            ),
            (
                "no_backend",
                "Clients refused because no backend could take them",
                &c.no_backend,
            ),
            ("retries", "Clients retried on another backend", &c.retries),
            (
                "connect_failures",
                "Failed connects to backends",
                &c.connect_failures,
            ),
        ] {
            let m: Counter = Counter::default();
            m.inc_by(v.load(Ordering::Relaxed));
            reg.register(name, help, m);
        }
        // Proxy-mode overload counters (see docs/balance.md, "Limits and overload").
        for (name, help, v) in [
            ("rejected", "Clients refused by a per-source limit", &c.rejected),
            (
                "evicted",
                "Idle connections or UDP sessions closed to make room at max_connections",
                &c.evicted,
            ),
            ("idle_closed", "TCP connections closed after the idle timeout", &c.idle_closed),
            (
                "limit_waits",
                "Times accepting paused at max_connections",
                &c.limit_waits,
            ),
            ("accept_errors", "Failed accept calls (e.g. EMFILE)", &c.accept_errors),
            (
                "local_errors",
                "Backend connects or sends that failed for a local reason (not the backend's fault)",
                &c.local_errors,
            ),
            (
                "health_local_errors",
                "Health checks that could not run for a local reason",
                &c.health_local_errors,
            ),
        ] {
            let m: Counter = Counter::default();
            m.inc_by(v.load(Ordering::Relaxed));
            reg.register(name, help, m);
        }
        let tb: Family<L, Counter> = Family::default();
        tb.get_or_create(&vec![("direction".into(), "to_backend".into())])
            .inc_by(c.bytes_in.load(Ordering::Relaxed));
        tb.get_or_create(&vec![("direction".into(), "to_client".into())])
            .inc_by(c.bytes_out.load(Ordering::Relaxed));
        reg.register("bytes", "Bytes relayed, all backends", tb);
        if let Some(d) = self.dsr_status() {
            d.register_metrics(reg.sub_registry_with_prefix("dsr"));
        }
        let mut out = String::new();
        let _ = encode(&mut out, &root);
        out
    }

    /// Starts the health checker: every `interval`, each backend is checked (each check on its
    /// own short-lived thread, bounded by `timeout`); results feed the table's fall/rise machines
    /// as soon as they arrive. A slow or black-holed backend does not delay the others' checks;
    /// a backend gets its next check one interval after the previous one started, or when that
    /// one ends if it took longer.
    pub fn spawn_health_checker(self: &Arc<Self>) -> std::io::Result<std::thread::JoinHandle<()>> {
        let b = self.clone();
        std::thread::Builder::new()
            .name("braid-health".into())
            .spawn(move || {
                let interval = b.config.health.interval;
                let (tx, rx) = std::sync::mpsc::channel::<(u64, CheckOutcome)>();
                let mut inflight: std::collections::HashSet<u64> = Default::default();
                let mut next = Instant::now();
                while !b.stopping() {
                    if Instant::now() >= next {
                        let targets: Vec<(u64, SocketAddr)> = b
                            .table()
                            .backends()
                            .iter()
                            .map(|x| (x.id, x.addr))
                            .collect();
                        for (id, addr) in targets {
                            if !inflight.insert(id) {
                                continue; // the previous check is still running
                            }
                            let (b2, tx) = (b.clone(), tx.clone());
                            let spawned = std::thread::Builder::new()
                                .name("braid-check".into())
                                .spawn(move || {
                                    let _ = tx.send((id, b2.check_one(addr)));
                                });
                            if spawned.is_err() {
                                inflight.remove(&id);
                            }
                        }
                        next += interval;
                        let now = Instant::now();
                        if next < now {
                            next = now + interval;
                        }
                    }
                    let wait = next
                        .saturating_duration_since(Instant::now())
                        .min(Duration::from_millis(50));
                    match rx.recv_timeout(wait) {
                        Ok((id, r)) if r.local => {
                            // Out of descriptors (or buffers, or ports) here: says nothing about
                            // the backend. Neither a failure nor a success.
                            inflight.remove(&id);
                            let n = b
                                .counters
                                .health_local_errors
                                .fetch_add(1, Ordering::Relaxed);
                            if n.is_power_of_two() || n == 0 {
                                tracing::warn!(
                                    "health check could not run ({}): not counted against the backend ({} such so far)",
                                    r.detail,
                                    n + 1
                                );
                            }
                        }
                        Ok((id, r)) => {
                            inflight.remove(&id);
                            let now = Instant::now();
                            let mut t = b.table();
                            let addr = t.get(id).map(|x| x.addr);
                            if let Some(change) =
                                t.handle_check(id, now, r.ok, Some(r.took), r.detail.clone())
                            {
                                tracing::warn!(
                                    "backend {} is now {:?} ({})",
                                    addr.map(|a| a.to_string()).unwrap_or_default(),
                                    change,
                                    r.detail
                                );
                            }
                        }
                        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                    }
                }
            })
    }

    /// One active check of `addr` (blocking, bounded by the health timeout).
    pub fn check_one(&self, addr: SocketAddr) -> CheckOutcome {
        let h = &self.config.health;
        let target = SocketAddr::new(addr.ip(), h.port.unwrap_or(addr.port()));
        let start = Instant::now();
        let r = match (self.config.protocol, &h.http_path) {
            (_, Some(path)) => http_check(target, path, h.timeout),
            (Protocol::Tcp, None) => match TcpStream::connect_timeout(&target, h.timeout) {
                Ok(_) => Ok("TCP connect ok".to_string()),
                Err(e) => Err(Failure::io("connect", &e)),
            },
            (Protocol::Udp, None) => udp_check(target, h.timeout),
        };
        let (ok, local, detail) = match r {
            Ok(d) => (true, false, d),
            Err(f) => (false, f.local, f.detail),
        };
        CheckOutcome {
            ok,
            local,
            detail,
            took: start.elapsed(),
        }
    }
}

/// A failed check: what went wrong, and whether it was our own fault.
struct Failure {
    local: bool,
    detail: String,
}

impl Failure {
    fn io(what: &str, e: &std::io::Error) -> Failure {
        Failure {
            local: is_local_error(e),
            detail: format!("{what}: {}", short_io_error(e)),
        }
    }
    fn backend(detail: String) -> Failure {
        Failure {
            local: false,
            detail,
        }
    }
}

/// Errors that say the balancer itself is short of something (descriptors, buffers, memory,
/// local ports), not that the peer is unwell: they must never count against a backend.
pub fn is_local_error(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::EADDRNOTAVAIL)
    )
}

/// The result of one active check.
#[derive(Debug, Clone)]
pub struct CheckOutcome {
    pub ok: bool,
    /// The check could not run for a local reason ([`is_local_error`]): `ok` is false but it
    /// says nothing about the backend.
    pub local: bool,
    pub detail: String,
    pub took: Duration,
}

pub(crate) fn short_io_error(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => "timed out".to_string(),
        _ => {
            let s = e.to_string();
            s.split(" (os error").next().unwrap_or(&s).to_string()
        }
    }
}

/// HTTP/1.0 GET `path`; healthy on a 2xx or 3xx status line within `timeout`.
fn http_check(target: SocketAddr, path: &str, timeout: Duration) -> Result<String, Failure> {
    let deadline = Instant::now() + timeout;
    let mut s = match TcpStream::connect_timeout(&target, timeout) {
        Ok(s) => s,
        Err(e) => return Err(Failure::io("connect", &e)),
    };
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    let _ = s.set_read_timeout(Some(left));
    let _ = s.set_write_timeout(Some(left));
    let host = match target {
        SocketAddr::V4(a) => a.to_string(),
        SocketAddr::V6(a) => a.to_string(),
    };
    let req = format!("GET {path} HTTP/1.0\r\nHost: {host}\r\nUser-Agent: braid-health\r\nConnection: close\r\n\r\n");
    if let Err(e) = s.write_all(req.as_bytes()) {
        return Err(Failure::io("send", &e));
    }
    let mut buf = [0u8; 256];
    let mut got = 0;
    while got < 12 {
        match s.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) => return Err(Failure::io("HTTP", &e)),
        }
        if Instant::now() >= deadline {
            break;
        }
    }
    match braid_lb::health::http_status_code(&buf[..got]) {
        Some(code) if braid_lb::health::http_status_healthy(code) => Ok(format!("HTTP {code}")),
        Some(code) => Err(Failure::backend(format!("HTTP {code}"))),
        None => Err(Failure::backend("HTTP: no status line".to_string())),
    }
}

/// UDP: a probe datagram on a connected socket. An ICMP error (port or host unreachable) makes
/// the backend fail; a reply or silence counts as alive (UDP services need not answer).
fn udp_check(target: SocketAddr, timeout: Duration) -> Result<String, Failure> {
    let bind: SocketAddr = if target.is_ipv4() {
        "0.0.0.0:0".parse().expect("addr")
    } else {
        "[::]:0".parse().expect("addr")
    };
    let s = match UdpSocket::bind(bind).and_then(|s| s.connect(target).map(|_| s)) {
        Ok(s) => s,
        Err(e) => return Err(Failure::io("udp", &e)),
    };
    let _ = s.set_read_timeout(Some(timeout));
    if let Err(e) = s.send(b"braid-health\n") {
        return Err(Failure::io("udp send", &e));
    }
    let mut buf = [0u8; 64];
    match s.recv(&mut buf) {
        Ok(_) => Ok("UDP reply".to_string()),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            Ok("UDP no ICMP error".to_string())
        }
        Err(e) => Err(Failure::io("udp", &e)),
    }
}
