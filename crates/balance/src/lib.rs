//! `braid balance`: a layer-4 load balancer (proxy and DSR modes). Policy lives in `braid-lb`.
//!
//! - [`config`]: the TOML file, validated ([`config::Config`]).
//! - [`balancer`]: state shared by both modes ([`balancer::Balancer`]: backend table, health
//!   checker, control requests, status, metrics).
//! - [`proxy`]: proxy-mode runtime (TCP and UDP).
//! - [`dsr`]: DSR-mode runtime (`dsr::run(Arc<Balancer>)`).

use std::path::PathBuf;
use std::sync::Arc;

pub mod balancer;
pub mod config;
pub mod proxy;

pub use balancer::Balancer;
pub use config::{Config, Mode, Protocol};

#[derive(Debug, clap::Args)]
pub struct BalanceArgs {
    /// The balancer's TOML configuration.
    pub config: std::path::PathBuf,
}

/// `braid backend ...`: change the backends of a running balancer.
#[derive(Debug, clap::Subcommand)]
pub enum BackendCmd {
    /// Add a backend (it takes new connections at once; health checks follow).
    Add {
        /// ADDRESS:PORT (DSR: a bare address takes the VIP's port).
        address: String,
        #[arg(long, default_value_t = 1)]
        weight: u32,
    },
    /// Remove a backend: no new connections; established ones are left to finish.
    Remove { address: String },
    /// Drain a backend: no new connections, existing ones finish; it stays listed.
    Drain { address: String },
    /// Undo `drain`.
    Undrain { address: String },
    /// Change a backend's weight (1 to 10000).
    SetWeight { address: String, weight: u32 },
}

/// Runs a balancer in the foreground until SIGINT/SIGTERM. Proxy mode then drains: the
/// listener closes and open connections get up to `drain_timeout_ms` to finish; a second signal
/// exits at once.
pub fn run_balance(args: BalanceArgs) -> anyhow::Result<()> {
    let config = Config::load(&args.config)?;
    let b = Balancer::new(config)?;
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // Registered first, so it sees the flag as the previous signal left it: the second
        // signal exits (status 1) without waiting for the drain.
        signal_hook::flag::register_conditional_shutdown(sig, 1, b.stop.clone())?;
        signal_hook::flag::register(sig, b.stop.clone())?;
    }
    let _control = braid_linux::control::ControlServer::bind(&b.config.control, {
        let b = b.clone();
        move |req| b.handle_control(&req)
    })?;
    let _metrics = match b.config.metrics {
        Some(addr) => Some(braid_linux::metrics::MetricsServer::bind(addr, {
            let b = b.clone();
            move || b.metrics_text()
        })?),
        None => None,
    };
    let health = b.spawn_health_checker()?;
    tracing::info!(
        "balancer {} ({} mode, {}), control socket {}",
        b.config.name,
        b.config.mode.as_str(),
        b.config.protocol.as_str(),
        b.config.control.display()
    );
    let result = match b.config.mode {
        Mode::Proxy => proxy::run(b.clone()),
        Mode::Dsr => run_dsr(&b),
    };
    braid_linux::service::stopping();
    b.stop();
    let _ = health.join();
    result
}

/// DSR mode: opens the data path on the interface (errors surface before anything runs), shows
/// its figures under `"dsr"` in `status`, and runs it on the shared backend table.
fn run_dsr(b: &Arc<Balancer>) -> anyhow::Result<()> {
    use braid_lb::dsr::{DsrTimers, Transport};
    let cfg = &b.config;
    let vip = cfg
        .vip
        .ok_or_else(|| anyhow::anyhow!("dsr mode needs vip"))?;
    let interface = cfg
        .interface
        .clone()
        .ok_or_else(|| anyhow::anyhow!("dsr mode needs interface"))?;
    let defaults = DsrTimers::default();
    let settings = dsr::DsrSettings {
        interface,
        vip: vip.ip(),
        port: vip.port(),
        transport: match cfg.protocol {
            Protocol::Tcp => Transport::Tcp,
            Protocol::Udp => Transport::Udp,
        },
        steer: cfg.steer,
        timers: DsrTimers {
            flow_idle: match cfg.protocol {
                Protocol::Tcp => defaults.flow_idle,
                Protocol::Udp => cfg.udp_idle_timeout,
            },
            max_flows: cfg.max_flows,
            ..defaults
        },
    };
    let path = dsr::Dsr::open(settings)?;
    // The socket is bound: frames for the VIP queue up from now on.
    b.notify_ready();
    let status = Arc::new(std::sync::Mutex::new(dsr::DsrStatus::default()));
    b.attach_dsr_status(status.clone());
    path.run(b.table.clone(), status, b.stop.clone())
}

/// `braid backend ...` through the control socket.
pub fn run_backend(control: Option<PathBuf>, cmd: BackendCmd) -> anyhow::Result<()> {
    use serde_json::json;
    let req = match &cmd {
        BackendCmd::Add { address, weight } => {
            json!({"cmd": "backend-add", "address": address, "weight": weight})
        }
        BackendCmd::Remove { address } => json!({"cmd": "backend-remove", "address": address}),
        BackendCmd::Drain { address } => json!({"cmd": "backend-drain", "address": address}),
        BackendCmd::Undrain { address } => json!({"cmd": "backend-undrain", "address": address}),
        BackendCmd::SetWeight { address, weight } => {
            json!({"cmd": "backend-set-weight", "address": address, "weight": weight})
        }
    };
    let path = braid_linux::control::resolve(control.as_deref())?;
    let reply = braid_linux::control::request(&path, &req)?;
    if let Some(m) = reply.get("message").and_then(|m| m.as_str()) {
        println!("{m}");
    }
    Ok(())
}

fn human_bytes(n: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

fn human_age(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms ago")
    } else if ms < 120_000 {
        format!("{:.1} s ago", ms as f64 / 1000.0)
    } else {
        format!("{} min ago", ms / 60_000)
    }
}

/// Renders a balancer's `status` reply for humans: a header and an aligned table of backends.
pub fn render_status(status: &serde_json::Value) -> String {
    use serde_json::Value;
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("-").to_string();
    let u = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    let mut out = String::new();
    let svc = if s(status, "mode") == "dsr" {
        format!("vip {} on {}", s(status, "vip"), s(status, "interface"))
    } else {
        format!("listen {}", s(status, "listen"))
    };
    out.push_str(&format!(
        "balancer {}  {} {}  {}  algorithm {}  up {:.0} s\n",
        s(status, "name"),
        s(status, "mode"),
        s(status, "protocol"),
        svc,
        s(status, "algorithm"),
        u(status, "uptime_ms") as f64 / 1000.0
    ));
    if let Some(d) = status.get("dsr").filter(|d| d.is_object()) {
        // DSR: the connection counters of proxy mode do not apply; show the data path's own.
        let macs: Vec<String> = d
            .get("neighbors")
            .and_then(Value::as_array)
            .map(|n| {
                n.iter()
                    .map(|e| format!("{} at {}", s(e, "ip"), s(e, "mac")))
                    .collect()
            })
            .unwrap_or_default();
        out.push_str(&format!(
            "forwarded {} packets ({})  flows {} active  answered {} ARP/NDP  dropped: no backend {}, no MAC {}, malformed {}\nbackend MACs: {}\n\n",
            u(d, "forwarded_packets"),
            human_bytes(u(d, "forwarded_bytes")),
            u(d, "active_flows"),
            u(d, "answered"),
            u(d, "dropped_no_backend"),
            u(d, "dropped_no_mac"),
            u(d, "malformed"),
            if macs.is_empty() { "-".to_string() } else { macs.join(", ") }
        ));
        return render_backends(status, out);
    }
    let t = status.get("totals").cloned().unwrap_or(Value::Null);
    out.push_str(&format!(
        "connections {} (active {})  no backend {}  retried {}  connect failures {}  bytes in {}  out {}\n\n",
        u(&t, "accepted"),
        u(&t, "active"),
        u(&t, "no_backend"),
        u(&t, "retries"),
        u(&t, "connect_failures"),
        human_bytes(u(&t, "bytes_in")),
        human_bytes(u(&t, "bytes_out"))
    ));
    if let Some(p) = status.get("proxy").filter(|p| p.is_object()) {
        out.push_str(&format!(
            "open {} of {} max  evicted {}  rejected {}  idle-closed {}  limit waits {}  accept errors {}  local errors {}\n\n",
            u(p, "open"),
            u(p, "max_connections"),
            u(&t, "evicted"),
            u(&t, "rejected"),
            u(&t, "idle_closed"),
            u(&t, "limit_waits"),
            u(&t, "accept_errors"),
            u(&t, "local_errors") + u(&t, "health_local_errors"),
        ));
    }
    render_backends(status, out)
}

/// The backend table of a balancer's `status`, appended to `out`.
fn render_backends(status: &serde_json::Value, mut out: String) -> String {
    use serde_json::Value;
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("-").to_string();
    let u = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    let header = [
        "BACKEND",
        "STATE",
        "WEIGHT",
        "ACTIVE",
        "TOTAL",
        "BYTES IN",
        "BYTES OUT",
        "LAST HEALTH",
    ];
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    for b in status
        .get("backends")
        .and_then(Value::as_array)
        .map(|a| a.as_slice())
        .unwrap_or(&[])
    {
        let health = match b.get("last_health") {
            Some(h) if !h.is_null() => {
                let ok = h.get("ok").and_then(Value::as_bool).unwrap_or(false);
                let took = h
                    .get("took_us")
                    .and_then(Value::as_u64)
                    .map(|us| format!(", {:.1} ms", us as f64 / 1000.0))
                    .unwrap_or_default();
                format!(
                    "{} {}{}{} ({})",
                    if ok { "ok" } else { "FAIL" },
                    s(h, "detail"),
                    took,
                    if s(h, "kind") == "passive" {
                        ", passive"
                    } else {
                        ""
                    },
                    human_age(u(h, "age_ms"))
                )
            }
            _ => "-".to_string(),
        };
        rows.push(vec![
            s(b, "address"),
            s(b, "state"),
            u(b, "weight").to_string(),
            u(b, "active").to_string(),
            u(b, "total").to_string(),
            human_bytes(u(b, "bytes_in")),
            human_bytes(u(b, "bytes_out")),
            health,
        ]);
    }
    let cols = header.len();
    let widths: Vec<usize> = (0..cols)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for r in &rows {
        let mut line = String::new();
        for (c, cell) in r.iter().enumerate() {
            if c + 1 == cols {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  ", w = widths[c]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    if rows.len() == 1 {
        out.push_str("(no backends)\n");
    }
    out
}

pub mod dsr;
pub mod fuzzing;

/// Convenience for runtimes: the shared state type they receive.
pub type SharedBalancer = Arc<Balancer>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_table_is_aligned() {
        let cfg = Config::parse(
            std::path::Path::new("t"),
            "[balance]\nname = \"web\"\nlisten = \"198.18.0.10:80\"\n[[backend]]\naddress = \"198.18.0.3:80\"\n[[backend]]\naddress = \"198.18.0.44:8080\"\nweight = 3\n",
        )
        .unwrap();
        let b = Balancer::new(cfg).unwrap();
        {
            let mut t = b.table();
            let id = t.find("198.18.0.3:80".parse().unwrap()).unwrap();
            t.conn_opened(id);
            t.add_bytes(id, 100, 5 << 20);
            t.handle_check(
                id,
                std::time::Instant::now(),
                true,
                Some(std::time::Duration::from_micros(420)),
                "HTTP 200",
            );
        }
        b.handle_control(
            &serde_json::json!({"cmd": "backend-drain", "address": "198.18.0.44:8080"}),
        );
        let st = b.status_json();
        assert_eq!(st["kind"], "balance");
        let text = render_status(&st);
        let lines: Vec<&str> = text.lines().collect();
        let hdr = lines.iter().position(|l| l.starts_with("BACKEND")).unwrap();
        let col = lines[hdr].find("STATE").unwrap();
        assert_eq!(&lines[hdr + 1][col..col + 2], "up", "{text}");
        assert_eq!(&lines[hdr + 2][col..col + 8], "draining", "{text}");
        assert!(
            lines[hdr + 1].contains("5.0 MiB") && lines[hdr + 1].contains("ok HTTP 200, 0.4 ms"),
            "{text}"
        );
    }

    #[test]
    fn dsr_status_shows_the_data_path_and_backend_macs() {
        let st = serde_json::json!({
            "kind": "balance", "name": "web", "mode": "dsr", "protocol": "tcp",
            "vip": "198.18.0.100", "interface": "eth1", "algorithm": "maglev",
            "totals": {"accepted": 0},
            "dsr": {
                "forwarded_packets": 1234, "forwarded_bytes": 5 << 20, "active_flows": 7,
                "answered": 3, "dropped_no_backend": 0, "dropped_no_mac": 1, "malformed": 2,
                "neighbors": [{"ip": "198.18.0.3", "mac": "02:00:00:00:00:03"}]
            },
            "backends": [{"address": "198.18.0.3:80", "state": "up", "weight": 1}]
        });
        let text = render_status(&st);
        assert!(
            text.contains("forwarded 1234 packets (5.0 MiB)  flows 7 active"),
            "{text}"
        );
        assert!(text.contains("198.18.0.3 at 02:00:00:00:00:03"), "{text}");
        assert!(!text.contains("connections 0"), "{text}");
        assert!(
            text.lines().any(|l| l.starts_with("198.18.0.3:80")),
            "{text}"
        );
    }

    #[test]
    fn local_errors_are_not_the_backends_fault() {
        use balancer::is_local_error;
        let e = |n| std::io::Error::from_raw_os_error(n);
        for n in [
            libc::EMFILE,
            libc::ENFILE,
            libc::ENOBUFS,
            libc::ENOMEM,
            libc::EADDRNOTAVAIL,
        ] {
            assert!(is_local_error(&e(n)), "{n}");
        }
        for n in [
            libc::ECONNREFUSED,
            libc::EHOSTUNREACH,
            libc::ENETUNREACH,
            libc::ETIMEDOUT,
        ] {
            assert!(!is_local_error(&e(n)), "{n}");
        }
        assert!(!is_local_error(&std::io::Error::other("x")));
    }

    #[test]
    fn fd_budget_leaves_a_reserve() {
        use proxy::fd_budget;
        assert_eq!(fd_budget(256, Protocol::Tcp), 90);
        assert_eq!(fd_budget(256, Protocol::Udp), 180);
        assert_eq!(fd_budget(20_000, Protocol::Tcp), 9468);
        assert_eq!(fd_budget(10, Protocol::Tcp), 1);
        assert_eq!(fd_budget(u64::MAX, Protocol::Udp), 3_799_936);
    }

    #[test]
    fn control_requests() {
        let cfg = Config::parse(std::path::Path::new("t"), "[balance]\nname = \"web\"\nlisten = \"198.18.0.10:80\"\n[[backend]]\naddress = \"198.18.0.3:80\"\n").unwrap();
        let b = Balancer::new(cfg).unwrap();
        let ok = |v: serde_json::Value| assert_eq!(b.handle_control(&v)["ok"], true, "{v}");
        let err =
            |v: serde_json::Value| b.handle_control(&v)["error"].as_str().unwrap().to_string();
        ok(serde_json::json!({"cmd": "backend-add", "address": "198.18.0.4:80", "weight": 2}));
        assert!(
            err(serde_json::json!({"cmd": "backend-add", "address": "198.18.0.4:80"}))
                .contains("already exists")
        );
        assert!(
            err(serde_json::json!({"cmd": "backend-add", "address": "198.18.0.5"}))
                .contains("bad backend address")
        );
        assert!(err(serde_json::json!({"cmd": "backend-set-weight", "address": "198.18.0.4:80", "weight": 0})).contains("weight"));
        ok(
            serde_json::json!({"cmd": "backend-set-weight", "address": "198.18.0.4:80", "weight": 5}),
        );
        ok(serde_json::json!({"cmd": "backend-remove", "address": "198.18.0.3:80"}));
        assert!(
            err(serde_json::json!({"cmd": "backend-drain", "address": "198.18.0.3:80"}))
                .contains("no backend")
        );
        assert!(err(serde_json::json!({"cmd": "fly"})).contains("unknown command"));
        let st = b.status_json();
        assert_eq!(st["backends"].as_array().unwrap().len(), 1);
        assert_eq!(st["backends"][0]["weight"], 5);
        let m = b.metrics_text();
        assert!(
            m.contains("braid_balance_backend_weight{backend=\"198.18.0.4:80\"} 5"),
            "{m}"
        );
        assert!(
            m.contains("braid_balance_backend_state{backend=\"198.18.0.4:80\",state=\"up\"} 1"),
            "{m}"
        );
    }

    #[test]
    fn health_checks_take_a_dead_backend_down() {
        // A listener that accepts (alive) and a port nobody listens on (dead), on loopback.
        let alive = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dead_addr = dead.local_addr().unwrap();
        drop(dead);
        let text = format!(
            "[balance]\nname = \"hc\"\nlisten = \"127.0.0.1:1\"\nhealth = {{ interval_ms = 20, timeout_ms = 200, fall = 2, rise = 2 }}\n[[backend]]\naddress = \"{}\"\n[[backend]]\naddress = \"{dead_addr}\"\n",
            alive.local_addr().unwrap()
        );
        let b = Balancer::new(Config::parse(std::path::Path::new("t"), &text).unwrap()).unwrap();
        let h = b.spawn_health_checker().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let st = b.status_json();
            if st["backends"][1]["state"] == "down" {
                assert_eq!(st["backends"][0]["state"], "up");
                assert_eq!(st["backends"][0]["last_health"]["ok"], true);
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "dead backend never went down: {st}"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        b.stop();
        h.join().unwrap();
    }
}
