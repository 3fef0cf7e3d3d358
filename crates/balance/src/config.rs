//! `braid balance` configuration: TOML (serde + toml, unknown keys refused), validated into
//! [`Config`], one validator per section (`validate_balance`, `validate_health`,
//! `validate_backend`). Every error is one line naming the file, the line and the key
//! (`braid_config`'s format). At least one backend is required.
//!
//! ```toml
//! [balance]
//! name = "web"
//! mode = "proxy"                 # or "dsr"
//! protocol = "tcp"               # or "udp"
//! listen = "198.18.0.10:8080"    # proxy mode
//! vip = "198.18.0.100"           # dsr mode: the service address; port 0 = all ports
//! interface = "eth1"             # dsr mode: where frames for the VIP arrive
//! algorithm = "maglev"           # round-robin | weighted | least-connections | source-hash | maglev
//! steer = "flow"                 # dsr mode: or "braid" (UDP to braid concentrators, maglev only)
//! health = { interval_ms = 500, timeout_ms = 300, fall = 2, rise = 2 }   # http_path = "/x" for HTTP
//! metrics = "127.0.0.1:9151"     # optional
//! # optional: control = "/run/braid/web.sock", table_size = 65537, connect_timeout_ms = 1000,
//! #           udp_idle_timeout_ms = 30000, max_flows = 1000000,
//! #           workers = <one per core>  (proxy mode)
//! # optional, proxy mode limits (see docs/balance.md, "Limits and overload"):
//! #           max_connections = <from the open-files limit>, max_connections_per_source = <none>,
//! #           tcp_idle_timeout_ms = 300000, tcp_keepalive_ms = 60000 (0 = off),
//! #           evict_idle_after_ms = 10000, drain_timeout_ms = 30000
//!
//! [[backend]]
//! address = "198.18.0.3:8080"    # or HOST:PORT, resolved once at load;
//!                                # dsr: the backend's address on the shared segment
//! weight = 1
//! ```

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use braid_config::{in_range, Source, Spanned};
use braid_lb::dsr::Steer;
use braid_lb::Algorithm;
use serde::Deserialize;

/// Proxy (the balancer terminates TCP / relays UDP) or DSR (MAC rewrite, replies bypass us).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Proxy,
    Dsr,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Proxy => "proxy",
            Mode::Dsr => "dsr",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }
    /// The IP protocol number (braid_lb::flow::PROTO_*).
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => braid_lb::flow::PROTO_TCP,
            Protocol::Udp => braid_lb::flow::PROTO_UDP,
        }
    }
}

/// Active health checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthConfig {
    pub interval: Duration,
    pub timeout: Duration,
    pub fall: u32,
    pub rise: u32,
    /// `Some(path)`: HTTP GET expecting 2xx/3xx; `None`: TCP connect (UDP: a probe datagram that
    /// fails on an ICMP error).
    pub http_path: Option<String>,
    /// Port to check instead of the backend's (needed for DSR backends given without a port).
    pub port: Option<u16>,
}

/// One backend from the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendConfig {
    pub address: SocketAddr,
    pub weight: u32,
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub name: String,
    pub mode: Mode,
    pub protocol: Protocol,
    /// Proxy mode: where clients connect.
    pub listen: Option<SocketAddr>,
    /// DSR mode: the service address; port 0 = all ports.
    pub vip: Option<SocketAddr>,
    /// DSR mode (required, must exist): the interface where frames for the VIP arrive.
    pub interface: Option<String>,
    pub algorithm: Algorithm,
    /// DSR mode: what picks a packet's backend (the connection, or braid's route id).
    pub steer: braid_lb::dsr::Steer,
    pub health: HealthConfig,
    pub metrics: Option<SocketAddr>,
    /// Control socket (default `/run/braid/<name>.sock`).
    pub control: PathBuf,
    /// Maglev table size (prime).
    pub table_size: usize,
    /// Proxy mode: how long a connect to a backend may take before the client is retried elsewhere.
    pub connect_timeout: Duration,
    /// UDP flows (proxy affinity, DSR flow table) are forgotten after this long without traffic.
    pub udp_idle_timeout: Duration,
    /// Bound of flow tables.
    pub max_flows: usize,
    /// Proxy mode (TCP): worker threads (default: one per core).
    pub workers: Option<usize>,
    /// Proxy mode: TCP connections or UDP sessions at once (`None`: derived from the open-files
    /// limit at start, see `proxy::fd_budget`).
    pub max_connections: Option<usize>,
    /// Proxy mode: TCP connections or UDP sessions at once from one client address.
    pub max_connections_per_source: Option<u32>,
    /// Proxy mode (TCP): a connection with no byte in either direction for this long is closed.
    pub tcp_idle_timeout: Duration,
    /// Proxy mode (TCP): keepalive probes on both sides after this long idle (`None`: off).
    pub tcp_keepalive: Option<Duration>,
    /// Proxy mode (TCP): at `max_connections`, a new client closes the connection idle the
    /// longest if it has been idle at least this long (otherwise accepting pauses).
    pub evict_idle_after: Duration,
    /// Proxy mode: on SIGTERM/SIGINT, how long open connections may take to finish.
    pub drain_timeout: Duration,
    pub backends: Vec<BackendConfig>,
}

pub use braid_config::ConfigError;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    balance: Spanned<RawBalance>,
    #[serde(default)]
    backend: Vec<Spanned<RawBackend>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBalance {
    name: Spanned<String>,
    mode: Option<Spanned<String>>,
    protocol: Option<Spanned<String>>,
    listen: Option<Spanned<String>>,
    vip: Option<Spanned<String>>,
    interface: Option<Spanned<String>>,
    algorithm: Option<Spanned<String>>,
    steer: Option<Spanned<String>>,
    health: Option<Spanned<RawHealth>>,
    metrics: Option<Spanned<String>>,
    control: Option<Spanned<String>>,
    table_size: Option<Spanned<u64>>,
    connect_timeout_ms: Option<Spanned<u64>>,
    udp_idle_timeout_ms: Option<Spanned<u64>>,
    max_flows: Option<Spanned<u64>>,
    workers: Option<Spanned<u64>>,
    max_connections: Option<Spanned<u64>>,
    max_connections_per_source: Option<Spanned<u64>>,
    tcp_idle_timeout_ms: Option<Spanned<u64>>,
    tcp_keepalive_ms: Option<Spanned<u64>>,
    evict_idle_after_ms: Option<Spanned<u64>>,
    drain_timeout_ms: Option<Spanned<u64>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawHealth {
    interval_ms: Option<Spanned<u64>>,
    timeout_ms: Option<Spanned<u64>>,
    fall: Option<Spanned<u32>>,
    rise: Option<Spanned<u32>>,
    http_path: Option<Spanned<String>>,
    port: Option<Spanned<u16>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackend {
    address: Spanned<String>,
    weight: Option<Spanned<i64>>,
}

/// Parses an address with a port, or (when `default_port` is given) a bare IP.
fn parse_addr(s: &str, default_port: Option<u16>) -> Option<SocketAddr> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Some(a);
    }
    let ip = s
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .unwrap_or(s);
    match (ip.parse::<IpAddr>(), default_port) {
        (Ok(ip), Some(p)) => Some(SocketAddr::new(ip, p)),
        _ => None,
    }
}

/// An address with a port (`listen`, `metrics`).
fn addr_with_port(s: &str) -> Result<SocketAddr, String> {
    match parse_addr(s, None) {
        Some(a) if a.port() != 0 => Ok(a),
        Some(_) => Err(format!("{s:?}: port must not be 0")),
        None => Err(format!(
            "{s:?} is not an address with a port (e.g. \"198.18.0.10:8080\")"
        )),
    }
}

impl Config {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = Source::read(path)?;
        Config::parse(path, &text)
    }

    /// Validates `text` (the contents of `path`, used in messages). Looks at the host too, read
    /// only: a DSR interface must exist, a backend host name is resolved.
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let src = Source::new(path, text);
        let raw: RawFile = src.deserialize()?;
        let mut cfg = validate_balance(&src, &raw.balance)?;
        for (i, be) in raw.backend.iter().enumerate() {
            let b = validate_backend(&src, i, be, &cfg)?;
            cfg.backends.push(b);
        }
        if cfg.backends.is_empty() {
            return Err(src.at(
                &raw.balance,
                "backend",
                "missing: a balancer needs at least one [[backend]] (address, weight)",
            ));
        }
        if cfg.mode == Mode::Dsr && cfg.health.port.is_none() {
            if let Some((i, b)) = cfg
                .backends
                .iter()
                .enumerate()
                .find(|(_, b)| b.address.port() == 0)
            {
                return Err(src.at(
                    &raw.backend[i],
                    &format!("backend[{i}].address"),
                    format!("backend {} has no port: set health.port so that health checks know where to connect", b.address.ip()),
                ));
            }
        }
        Ok(cfg)
    }
}

/// `[balance]`: everything but the backends.
fn validate_balance(src: &Source, balance: &Spanned<RawBalance>) -> Result<Config, ConfigError> {
    let b = balance.get_ref();
    let name = src.value(&b.name, "balance.name", |n| {
        let ok = !n.is_empty()
            && n.len() <= 64
            && !n.starts_with('.')
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        if ok {
            Ok(n.clone())
        } else {
            Err(format!("{n:?}: use 1-64 letters, digits, '-', '_' or '.'"))
        }
    })?;
    let mode = src.optional(&b.mode, "balance.mode", |m| match m.as_str() {
        "proxy" => Ok(Mode::Proxy),
        "dsr" => Ok(Mode::Dsr),
        other => Err(format!("{other:?}: expected \"proxy\" or \"dsr\"")),
    })?;
    let mode = mode.unwrap_or(Mode::Proxy);
    let protocol = src.optional(&b.protocol, "balance.protocol", |p| match p.as_str() {
        "tcp" => Ok(Protocol::Tcp),
        "udp" => Ok(Protocol::Udp),
        other => Err(format!("{other:?}: expected \"tcp\" or \"udp\"")),
    })?;
    let protocol = protocol.unwrap_or(Protocol::Tcp);
    let algorithm = src.optional(&b.algorithm, "balance.algorithm", |a| {
        a.parse::<Algorithm>().map_err(|e| e.to_string())
    })?;
    let steer = src.optional(&b.steer, "balance.steer", |s| match s.as_str() {
        "flow" => Ok(Steer::Flow),
        "braid" => Ok(Steer::BraidRoute),
        other => Err(format!("{other:?}: expected \"flow\" or \"braid\"")),
    })?;
    if let (Some(Steer::BraidRoute), Some(v)) = (steer, &b.steer) {
        // The route id must pick the same concentrator on every balancer, whatever the link's
        // source address: a consistent hash of it, UDP, in DSR mode.
        let why = if mode != Mode::Dsr {
            Some("needs mode = \"dsr\"")
        } else if protocol != Protocol::Udp {
            Some("needs protocol = \"udp\" (braid's links are UDP)")
        } else if algorithm.is_some_and(|a| a != Algorithm::Maglev) {
            Some("needs algorithm = \"maglev\" (every balancer must pick the same concentrator)")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(src.at(v, "balance.steer", format!("\"braid\" {why}")));
        }
    }
    let listen = src.optional(&b.listen, "balance.listen", |s| addr_with_port(s))?;
    let vip = src.optional(&b.vip, "balance.vip", |s| {
        parse_addr(s, Some(0)).ok_or_else(|| {
            format!("{s:?} is not an IP address (e.g. \"198.18.0.100\" or \"198.18.0.100:80\")")
        })
    })?;
    let interface = src.optional(&b.interface, "balance.interface", |i| {
        if braid_linux::netlink::interface_exists(i) {
            Ok(i.clone())
        } else {
            Err(format!("interface {i:?} does not exist on this host"))
        }
    })?;
    let missing = |key: &str, what: &str| {
        Err(src.at(
            balance,
            key,
            format!("missing: {} mode needs {what}", mode.as_str()),
        ))
    };
    match mode {
        Mode::Proxy if listen.is_none() => {
            return missing("balance.listen", "listen = \"ADDRESS:PORT\"")
        }
        Mode::Dsr if vip.is_none() => return missing("balance.vip", "vip = \"ADDRESS\""),
        Mode::Dsr if interface.is_none() => {
            return missing(
                "balance.interface",
                "interface = \"NAME\" (where frames for the VIP arrive)",
            )
        }
        _ => {}
    }
    let health = validate_health(src, b.health.as_ref(), protocol)?;
    let metrics = src.optional(&b.metrics, "balance.metrics", |s| addr_with_port(s))?;
    let control = src.optional(&b.control, "balance.control", |c| match c.as_str() {
        "" => Err("empty path".to_string()),
        c => Ok(PathBuf::from(c)),
    })?;
    let table_size = src.optional(&b.table_size, "balance.table_size", |&n| {
        if (7..=(1 << 24)).contains(&n) && braid_lb::maglev::is_prime(n as usize) {
            Ok(n as usize)
        } else {
            Err(format!(
                "{n} must be a prime from 7 to 16777216 (default 65537)"
            ))
        }
    })?;
    let ms = |v: &Option<Spanned<u64>>, key: &str, default: u64, max: u64| {
        let v = src.optional(v, key, |&x| in_range(x, 1, max))?;
        Ok::<_, ConfigError>(Duration::from_millis(v.unwrap_or(default)))
    };
    let count = |v: &Option<Spanned<u64>>, key: &str, max: u64| {
        src.optional(v, key, |&x| in_range(x, 1, max).map(|x| x as usize))
    };
    Ok(Config {
        control: control.unwrap_or_else(|| braid_linux::control::default_path(&name)),
        name,
        mode,
        protocol,
        listen,
        vip,
        interface,
        algorithm: algorithm.unwrap_or(Algorithm::Maglev),
        steer: steer.unwrap_or_default(),
        health,
        metrics,
        table_size: table_size.unwrap_or(braid_lb::DEFAULT_TABLE_SIZE),
        connect_timeout: ms(
            &b.connect_timeout_ms,
            "balance.connect_timeout_ms",
            1000,
            60_000,
        )?,
        udp_idle_timeout: ms(
            &b.udp_idle_timeout_ms,
            "balance.udp_idle_timeout_ms",
            30_000,
            86_400_000,
        )?,
        max_flows: count(&b.max_flows, "balance.max_flows", 100_000_000)?.unwrap_or(1_000_000),
        workers: count(&b.workers, "balance.workers", 256)?,
        max_connections: count(&b.max_connections, "balance.max_connections", 100_000_000)?,
        max_connections_per_source: count(
            &b.max_connections_per_source,
            "balance.max_connections_per_source",
            100_000_000,
        )?
        .map(|n| n as u32),
        tcp_idle_timeout: ms(
            &b.tcp_idle_timeout_ms,
            "balance.tcp_idle_timeout_ms",
            300_000,
            86_400_000,
        )?,
        // 0 turns keepalive off.
        tcp_keepalive: match &b.tcp_keepalive_ms {
            Some(k) if *k.get_ref() == 0 => None,
            k => Some(ms(k, "balance.tcp_keepalive_ms", 60_000, 7_200_000)?),
        },
        evict_idle_after: ms(
            &b.evict_idle_after_ms,
            "balance.evict_idle_after_ms",
            10_000,
            86_400_000,
        )?,
        drain_timeout: ms(
            &b.drain_timeout_ms,
            "balance.drain_timeout_ms",
            30_000,
            3_600_000,
        )?,
        backends: Vec::new(),
    })
}

/// `health = { ... }` in `[balance]`.
fn validate_health(
    src: &Source,
    health: Option<&Spanned<RawHealth>>,
    protocol: Protocol,
) -> Result<HealthConfig, ConfigError> {
    let default = RawHealth::default();
    let h = health.map_or(&default, |h| h.get_ref());
    let interval_ms = src
        .optional(&h.interval_ms, "balance.health.interval_ms", |&i| {
            in_range(i, 10, 3_600_000)
        })?
        .unwrap_or(500);
    let timeout_ms = src
        .optional(&h.timeout_ms, "balance.health.timeout_ms", |&t| {
            in_range(t, 1, interval_ms.max(1000) * 10)
                .map_err(|m| format!("{m} (up to 10 x the interval)"))
        })?
        .unwrap_or(300);
    let fall = src.optional(&h.fall, "balance.health.fall", |&f| in_range(f, 1, 100))?;
    let rise = src.optional(&h.rise, "balance.health.rise", |&r| in_range(r, 1, 100))?;
    let http_path = src.optional(&h.http_path, "balance.health.http_path", |p| {
        if !p.starts_with('/') || p.chars().any(|c| c.is_whitespace() || c.is_control()) {
            Err(format!("{p:?} must start with '/' and contain no spaces"))
        } else if protocol == Protocol::Udp {
            Err("HTTP checks need protocol = \"tcp\"".to_string())
        } else {
            Ok(p.clone())
        }
    })?;
    let port = src.optional(&h.port, "balance.health.port", |&p| match p {
        0 => Err("must not be 0".to_string()),
        p => Ok(p),
    })?;
    Ok(HealthConfig {
        interval: Duration::from_millis(interval_ms),
        timeout: Duration::from_millis(timeout_ms),
        fall: fall.unwrap_or(2),
        rise: rise.unwrap_or(2),
        http_path,
        port,
    })
}

/// One `[[backend]]` (the `i`th, 0-based, as in its key path `backend[i]`). A host name is
/// resolved (the system resolver, once, at load), in the address family of the service.
fn validate_backend(
    src: &Source,
    i: usize,
    backend: &Spanned<RawBackend>,
    cfg: &Config,
) -> Result<BackendConfig, ConfigError> {
    let r = backend.get_ref();
    let service = cfg.listen.or(cfg.vip).map(|a| a.ip());
    let address = src.value(&r.address, &format!("backend[{i}].address"), |s| {
        // DSR backends may omit the port: the VIP's (0: all ports).
        let default_port = (cfg.mode == Mode::Dsr).then(|| cfg.vip.map_or(0, |v| v.port()));
        let address = match (parse_addr(s, default_port), default_port) {
            (Some(a), _) => a,
            (None, Some(p)) if !s.contains(':') => {
                braid_config::resolve_host_port(&format!("{s}:{p}"), service)?
            }
            (None, _) => braid_config::resolve_host_port(s, service).map_err(|m| {
                format!("{m} (a backend is ADDRESS:PORT or HOST:PORT, e.g. \"198.18.0.3:8080\")")
            })?,
        };
        if cfg.mode == Mode::Proxy && address.port() == 0 {
            return Err(format!("{s:?}: port must not be 0 in proxy mode"));
        }
        if cfg.backends.iter().any(|x| x.address == address) {
            return Err(format!("{address} is listed twice"));
        }
        Ok(address)
    })?;
    let weight = src.optional(&r.weight, &format!("backend[{i}].weight"), |&w| {
        in_range(w, 1, 10_000).map(|w| w as u32)
    })?;
    Ok(BackendConfig {
        address,
        weight: weight.unwrap_or(1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[balance]
name = "web"
mode = "proxy"
protocol = "tcp"
listen = "198.18.0.10:8080"
algorithm = "maglev"
health = { interval_ms = 500, timeout_ms = 300, fall = 2, rise = 2 }
metrics = "127.0.0.1:9151"

[[backend]]
address = "198.18.0.3:8080"
weight = 1

[[backend]]
address = "198.18.0.4:8080"
weight = 3
"#;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("t.toml"), text)
    }

    fn err(text: &str) -> String {
        let e = parse(text).unwrap_err().to_string();
        assert!(!e.contains('\n'), "multi-line error: {e}");
        e
    }

    #[test]
    fn the_issue_example_parses() {
        let c = parse(GOOD).unwrap();
        assert_eq!(c.name, "web");
        assert_eq!(c.mode, Mode::Proxy);
        assert_eq!(c.protocol, Protocol::Tcp);
        assert_eq!(c.listen, Some("198.18.0.10:8080".parse().unwrap()));
        assert_eq!(c.algorithm, Algorithm::Maglev);
        assert_eq!(c.health.interval, Duration::from_millis(500));
        assert_eq!(c.health.fall, 2);
        assert_eq!(c.metrics, Some("127.0.0.1:9151".parse().unwrap()));
        assert_eq!(c.control, PathBuf::from("/run/braid/web.sock"));
        assert_eq!(c.backends.len(), 2);
        assert_eq!(c.backends[1].weight, 3);
        assert_eq!(c.table_size, 65537);
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let e = err(&GOOD.replace("metrics =", "colour = \"blue\"\nmetrics ="));
        assert!(
            e.starts_with("t.toml:9:1: balance.colour: unknown key (expected one of: name, mode,"),
            "{e}"
        );
        let e = err(&GOOD.replace("weight = 3", "weight = 3\nwieght = 2"));
        assert_eq!(
            e,
            "t.toml:18:1: backend[1].wieght: unknown key, did you mean `weight`?"
        );
        let e = err(&GOOD.replace("fall = 2", "fal = 2"));
        assert!(
            e.starts_with("t.toml:8:49: balance.health.fal: unknown key, did you mean `fall`?"),
            "{e}"
        );
    }

    #[test]
    fn bad_values() {
        // (file, "LINE:COL: KEY: start of the message")
        let cases: &[(String, &str)] = &[
            (
                GOOD.replace("198.18.0.3:8080", "198.18.0.300:8080"),
                "12:11: backend[0].address: \"198.18.0.300\" is not an IP address",
            ),
            (
                GOOD.replace("198.18.0.10:8080", "nowhere"),
                "6:10: balance.listen: \"nowhere\" is not an address with a port",
            ),
            (
                GOOD.replace("\"maglev\"", "\"fastest\""),
                "7:13: balance.algorithm: unknown algorithm",
            ),
            (
                GOOD.replace("\"proxy\"", "\"tunnel\""),
                "4:8: balance.mode: \"tunnel\": expected \"proxy\" or \"dsr\"",
            ),
            (
                GOOD.replace("\"tcp\"", "\"sctp\""),
                "5:12: balance.protocol: \"sctp\"",
            ),
            (
                GOOD.replace("weight = 3", "weight = 0"),
                "17:10: backend[1].weight: 0 is out of range 1..10000",
            ),
            (
                GOOD.replace("weight = 3", "weight = -1"),
                "17:10: backend[1].weight: -1 is out of range",
            ),
            (
                GOOD.replace("weight = 3", "weight = \"3\""),
                "17:10: backend[1].weight: invalid type: string \"3\", expected i64",
            ),
            (
                GOOD.replace("fall = 2", "fall = 0"),
                "8:56: balance.health.fall: 0 is out of range 1..100",
            ),
            (
                GOOD.replace("interval_ms = 500", "interval_ms = 0"),
                "8:26: balance.health.interval_ms: 0 is out of range 10..3600000",
            ),
            (
                GOOD.replace("198.18.0.4:8080", "198.18.0.3:8080"),
                "16:11: backend[1].address: 198.18.0.3:8080 is listed twice",
            ),
            (
                GOOD.replace("listen = \"198.18.0.10:8080\"", ""),
                "2:1: balance.listen: missing: proxy mode needs listen",
            ),
            (
                format!("{GOOD}\n[balance.x]\n"),
                "19:10: balance.x: unknown key",
            ),
            (
                "[balance]\nname = \"a b\"\nlisten=\"1.2.3.4:5\"".to_string(),
                "2:8: balance.name: \"a b\": use 1-64",
            ),
            (
                GOOD.replace("algorithm", "table_size = 65536\nalgorithm"),
                "7:14: balance.table_size: 65536 must be a prime",
            ),
            (
                GOOD.replace("workers", "x")
                    .replace("metrics =", "workers = 0\nmetrics ="),
                "9:11: balance.workers: 0 is out of range 1..256",
            ),
            (String::new(), "1:1: balance: missing"),
            ("[balance\n".to_string(), "1:9: "),
            (
                GOOD.split("[[backend]]").next().unwrap().to_string(),
                "2:1: backend: missing: a balancer needs at least one [[backend]]",
            ),
            (
                GOOD.replace("198.18.0.3:8080", "web1"),
                "12:11: backend[0].address: \"web1\" is not HOST:PORT",
            ),
        ];
        for (text, want) in cases {
            let e = err(text);
            assert!(
                e.starts_with(&format!("t.toml:{want}")),
                "want {want:?}, got {e:?}"
            );
        }
    }

    /// `steer = "braid"`: DSR, UDP and Maglev only, each refusal naming what is missing.
    #[test]
    fn steer_braid_needs_dsr_udp_and_maglev() {
        let dsr_udp = GOOD
            .replace("mode = \"proxy\"", "mode = \"dsr\"\nsteer = \"braid\"")
            .replace("protocol = \"tcp\"", "protocol = \"udp\"")
            .replace(
                "listen = \"198.18.0.10:8080\"",
                "vip = \"198.18.0.100\"\ninterface = \"lo\"",
            );
        let c = parse(&dsr_udp).unwrap();
        assert_eq!(c.steer, Steer::BraidRoute);
        assert_eq!(parse(GOOD).unwrap().steer, Steer::Flow, "default");
        let cases = [
            (
                GOOD.replace("mode = \"proxy\"", "mode = \"proxy\"\nsteer = \"braid\""),
                "balance.steer: \"braid\" needs mode = \"dsr\"",
            ),
            (
                dsr_udp.replace("protocol = \"udp\"", "protocol = \"tcp\""),
                "balance.steer: \"braid\" needs protocol = \"udp\"",
            ),
            (
                dsr_udp.replace("algorithm = \"maglev\"", "algorithm = \"round-robin\""),
                "balance.steer: \"braid\" needs algorithm = \"maglev\"",
            ),
            (
                dsr_udp.replace("steer = \"braid\"", "steer = \"route\""),
                "balance.steer: \"route\": expected \"flow\" or \"braid\"",
            ),
        ];
        for (text, want) in cases {
            let e = err(&text);
            assert!(e.contains(want), "want {want:?}, got {e:?}");
        }
    }

    #[test]
    fn backend_host_names_are_resolved() {
        let c = parse(&GOOD.replace("198.18.0.3:8080", "localhost:8080")).unwrap();
        assert!(c.backends[0].address.ip().is_loopback(), "{:?}", c.backends);
        assert_eq!(c.backends[0].address.port(), 8080);
    }

    #[test]
    fn dsr_needs_vip_and_an_existing_interface() {
        let dsr = GOOD.replace("mode = \"proxy\"", "mode = \"dsr\"");
        assert!(err(&dsr).contains("vip"));
        let dsr = dsr.replace("listen =", "vip = \"198.18.0.100\"\nlisten =");
        assert!(err(&dsr).contains("interface"));
        let e = err(&dsr.replace("vip =", "interface = \"nosuchif0\"\nvip ="));
        assert_eq!(
            e,
            "t.toml:6:13: balance.interface: interface \"nosuchif0\" does not exist on this host"
        );
        let c = parse(&dsr.replace("vip =", "interface = \"lo\"\nvip =")).unwrap();
        assert_eq!(c.vip, Some("198.18.0.100:0".parse().unwrap()));
        assert_eq!(c.interface.as_deref(), Some("lo"));
        // DSR backends may omit the port (all ports), but then health checks need one.
        let noport = dsr
            .replace("vip =", "interface = \"lo\"\nvip =")
            .replace("\"198.18.0.3:8080\"", "\"198.18.0.3\"");
        assert!(err(&noport).contains("health.port"));
        let c = parse(&noport.replace("rise = 2", "rise = 2, port = 80")).unwrap();
        assert_eq!(c.backends[0].address, "198.18.0.3:0".parse().unwrap());
    }

    #[test]
    fn defaults() {
        let c = parse("[balance]\nname = \"x\"\nlisten = \"[2001:db8::1]:80\"\n[[backend]]\naddress = \"[2001:db8::2]:80\"\n").unwrap();
        assert_eq!(c.algorithm, Algorithm::Maglev);
        assert_eq!((c.health.fall, c.health.rise), (2, 2));
        assert_eq!(c.health.http_path, None);
        assert_eq!(c.backends[0].weight, 1);
        assert_eq!(c.udp_idle_timeout, Duration::from_secs(30));
        assert_eq!(c.max_connections, None);
        assert_eq!(c.max_connections_per_source, None);
        assert_eq!(c.tcp_idle_timeout, Duration::from_secs(300));
        assert_eq!(c.tcp_keepalive, Some(Duration::from_secs(60)));
        assert_eq!(c.evict_idle_after, Duration::from_secs(10));
        assert_eq!(c.drain_timeout, Duration::from_secs(30));
    }

    #[test]
    fn proxy_limits() {
        let with = |extra: &str| GOOD.replace("metrics =", &format!("{extra}\nmetrics ="));
        let c = parse(&with("max_connections = 5000\nmax_connections_per_source = 50\ntcp_idle_timeout_ms = 2000\ntcp_keepalive_ms = 0\nevict_idle_after_ms = 500\ndrain_timeout_ms = 4000"))
        .unwrap();
        assert_eq!(c.max_connections, Some(5000));
        assert_eq!(c.max_connections_per_source, Some(50));
        assert_eq!(c.tcp_idle_timeout, Duration::from_secs(2));
        assert_eq!(c.tcp_keepalive, None);
        assert_eq!(c.evict_idle_after, Duration::from_millis(500));
        assert_eq!(c.drain_timeout, Duration::from_secs(4));
        for (line, want) in [
            (
                "max_connections = 0",
                "t.toml:9:19: balance.max_connections: 0 is out of range 1..100000000",
            ),
            (
                "max_connections_per_source = 0",
                "t.toml:9:30: balance.max_connections_per_source: 0 is out of range 1..100000000",
            ),
            (
                "tcp_idle_timeout_ms = 0",
                "t.toml:9:23: balance.tcp_idle_timeout_ms: 0 is out of range 1..86400000",
            ),
            (
                "tcp_keepalive_ms = 7200001",
                "t.toml:9:20: balance.tcp_keepalive_ms: 7200001 is out of range 1..7200000",
            ),
            (
                "evict_idle_after_ms = 0",
                "t.toml:9:23: balance.evict_idle_after_ms: 0 is out of range 1..86400000",
            ),
            (
                "drain_timeout_ms = -1",
                "t.toml:9:20: balance.drain_timeout_ms: ",
            ),
        ] {
            let e = err(&with(line));
            assert!(e.starts_with(want), "want {want:?}, got {e:?}");
        }
    }
}
