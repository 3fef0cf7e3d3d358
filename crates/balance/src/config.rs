//! `braid balance` configuration: TOML (serde + toml, unknown keys refused), validated into
//! [`Config`]. Every error is one line naming the file, the line and the key or value at fault.
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
//! address = "198.18.0.3:8080"    # dsr: the backend's address on the shared segment
//! weight = 1
//! ```

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use braid_lb::Algorithm;
use serde::Deserialize;
use toml::Spanned;

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

/// A configuration error: one line, with the file and (when known) the line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHealth {
    interval_ms: Option<u64>,
    timeout_ms: Option<u64>,
    fall: Option<u32>,
    rise: Option<u32>,
    http_path: Option<String>,
    port: Option<u16>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackend {
    address: Spanned<String>,
    weight: Option<Spanned<i64>>,
}

/// Turns byte offsets into line numbers.
struct Lines<'a> {
    origin: &'a str,
    text: &'a str,
}

impl Lines<'_> {
    fn line(&self, offset: usize) -> usize {
        self.text[..offset.min(self.text.len())]
            .bytes()
            .filter(|&b| b == b'\n')
            .count()
            + 1
    }
    fn err<T>(
        &self,
        span: std::ops::Range<usize>,
        msg: impl std::fmt::Display,
    ) -> Result<T, ConfigError> {
        Err(ConfigError(format!(
            "{}: line {}: {msg}",
            self.origin,
            self.line(span.start)
        )))
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
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

/// Whether a network interface exists (checked in `/sys/class/net`).
pub fn interface_exists(name: &str) -> bool {
    !name.is_empty()
        && !name.contains('/')
        && name != "."
        && name != ".."
        && Path::new("/sys/class/net").join(name).exists()
}

impl Config {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("cannot read config {}: {e}", path.display())))?;
        Config::parse(&text, &path.display().to_string())
    }

    /// Parses and validates `text`; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let l = Lines { origin, text };
        let raw: RawFile = match toml::from_str(text) {
            Ok(r) => r,
            Err(e) => {
                let msg = one_line(e.message());
                return match e.span() {
                    Some(span) => l.err(span, msg),
                    None => Err(ConfigError(format!("{origin}: {msg}"))),
                };
            }
        };
        let bspan = raw.balance.span();
        let b = raw.balance.into_inner();

        let name = b.name.get_ref().trim().to_string();
        if name.is_empty()
            || name.len() > 64
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
            || name.starts_with('.')
        {
            return l.err(
                b.name.span(),
                format!(
                    "name {:?}: use 1-64 letters, digits, '-', '_' or '.'",
                    b.name.get_ref()
                ),
            );
        }
        let mode = match b.mode.as_ref().map(|m| m.get_ref().as_str()) {
            None | Some("proxy") => Mode::Proxy,
            Some("dsr") => Mode::Dsr,
            Some(other) => {
                return l.err(
                    b.mode.as_ref().expect("some").span(),
                    format!("mode {other:?}: expected \"proxy\" or \"dsr\""),
                )
            }
        };
        let protocol = match b.protocol.as_ref().map(|m| m.get_ref().as_str()) {
            None | Some("tcp") => Protocol::Tcp,
            Some("udp") => Protocol::Udp,
            Some(other) => {
                return l.err(
                    b.protocol.as_ref().expect("some").span(),
                    format!("protocol {other:?}: expected \"tcp\" or \"udp\""),
                )
            }
        };
        let algorithm = match &b.algorithm {
            None => Algorithm::Maglev,
            Some(a) => match a.get_ref().parse::<Algorithm>() {
                Ok(x) => x,
                Err(e) => return l.err(a.span(), e),
            },
        };
        let listen = match &b.listen {
            None => None,
            Some(s) => match parse_addr(s.get_ref(), None) {
                Some(a) if a.port() != 0 => Some(a),
                Some(_) => {
                    return l.err(
                        s.span(),
                        format!("listen {:?}: port must not be 0", s.get_ref()),
                    )
                }
                None => {
                    return l.err(
                        s.span(),
                        format!(
                            "listen {:?}: not an address with a port (e.g. \"198.18.0.10:8080\")",
                            s.get_ref()
                        ),
                    )
                }
            },
        };
        let vip = match &b.vip {
            None => None,
            Some(s) => match parse_addr(s.get_ref(), Some(0)) {
                Some(a) => Some(a),
                None => return l.err(s.span(), format!("vip {:?}: not an IP address (e.g. \"198.18.0.100\" or \"198.18.0.100:80\")", s.get_ref())),
            },
        };
        let interface = b.interface.as_ref().map(|i| i.get_ref().clone());
        if let Some(i) = &b.interface {
            if !interface_exists(i.get_ref()) {
                return l.err(
                    i.span(),
                    format!(
                        "interface {:?} does not exist (no /sys/class/net/{})",
                        i.get_ref(),
                        i.get_ref()
                    ),
                );
            }
        }
        match mode {
            Mode::Proxy => {
                if listen.is_none() {
                    return l.err(
                        bspan,
                        "proxy mode needs listen = \"ADDRESS:PORT\" in [balance]",
                    );
                }
            }
            Mode::Dsr => {
                if vip.is_none() {
                    return l.err(bspan, "dsr mode needs vip = \"ADDRESS\" in [balance]");
                }
                if interface.is_none() {
                    return l.err(bspan, "dsr mode needs interface = \"NAME\" in [balance]");
                }
            }
        }

        let (health, hspan) = match b.health {
            Some(h) => {
                let span = h.span();
                (h.into_inner(), span)
            }
            None => (
                RawHealth {
                    interval_ms: None,
                    timeout_ms: None,
                    fall: None,
                    rise: None,
                    http_path: None,
                    port: None,
                },
                bspan.clone(),
            ),
        };
        let interval_ms = health.interval_ms.unwrap_or(500);
        let timeout_ms = health.timeout_ms.unwrap_or(300);
        let fall = health.fall.unwrap_or(2);
        let rise = health.rise.unwrap_or(2);
        if !(10..=3_600_000).contains(&interval_ms) {
            return l.err(
                hspan,
                format!("health.interval_ms = {interval_ms}: expected 10 to 3600000"),
            );
        }
        if timeout_ms == 0 || timeout_ms > interval_ms.max(1000) * 10 {
            return l.err(
                hspan,
                format!("health.timeout_ms = {timeout_ms}: expected 1 to 10 x interval"),
            );
        }
        if !(1..=100).contains(&fall) || !(1..=100).contains(&rise) {
            return l.err(
                hspan,
                format!("health.fall = {fall}, health.rise = {rise}: each must be 1 to 100"),
            );
        }
        if let Some(p) = &health.http_path {
            if !p.starts_with('/') || p.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return l.err(
                    hspan,
                    format!("health.http_path {p:?}: must start with '/' and contain no spaces"),
                );
            }
            if protocol == Protocol::Udp {
                return l.err(hspan, "health.http_path needs protocol = \"tcp\"");
            }
        }
        if health.port == Some(0) {
            return l.err(hspan, "health.port must not be 0");
        }

        let metrics = match &b.metrics {
            None => None,
            Some(s) => match parse_addr(s.get_ref(), None) {
                Some(a) => Some(a),
                None => {
                    return l.err(
                        s.span(),
                        format!(
                            "metrics {:?}: not an address with a port (e.g. \"127.0.0.1:9151\")",
                            s.get_ref()
                        ),
                    )
                }
            },
        };
        let control = match &b.control {
            Some(c) if c.get_ref().is_empty() => return l.err(c.span(), "control: empty path"),
            Some(c) => PathBuf::from(c.get_ref()),
            None => braid_linux::control::default_path(&name),
        };
        let table_size = match &b.table_size {
            None => braid_lb::DEFAULT_TABLE_SIZE,
            Some(t) => {
                let n = *t.get_ref();
                if !(7..=(1 << 24)).contains(&n) || !braid_lb::maglev::is_prime(n as usize) {
                    return l.err(
                        t.span(),
                        format!(
                            "table_size = {n}: must be a prime from 7 to 16777216 (default 65537)"
                        ),
                    );
                }
                n as usize
            }
        };
        let ms = |v: &Option<Spanned<u64>>,
                  key: &str,
                  default: u64,
                  max: u64|
         -> Result<Duration, ConfigError> {
            match v {
                None => Ok(Duration::from_millis(default)),
                Some(s) if (1..=max).contains(s.get_ref()) => {
                    Ok(Duration::from_millis(*s.get_ref()))
                }
                Some(s) => l.err(
                    s.span(),
                    format!("{key} = {}: expected 1 to {max}", s.get_ref()),
                ),
            }
        };
        let connect_timeout = ms(&b.connect_timeout_ms, "connect_timeout_ms", 1000, 60_000)?;
        let udp_idle_timeout = ms(
            &b.udp_idle_timeout_ms,
            "udp_idle_timeout_ms",
            30_000,
            86_400_000,
        )?;
        let max_flows = match &b.max_flows {
            None => 1_000_000,
            Some(s) if (1..=100_000_000).contains(s.get_ref()) => *s.get_ref() as usize,
            Some(s) => {
                return l.err(
                    s.span(),
                    format!("max_flows = {}: expected 1 to 100000000", s.get_ref()),
                )
            }
        };

        let workers = match &b.workers {
            None => None,
            Some(s) if (1..=256).contains(s.get_ref()) => Some(*s.get_ref() as usize),
            Some(s) => {
                return l.err(
                    s.span(),
                    format!("workers = {}: expected 1 to 256", s.get_ref()),
                )
            }
        };
        let count = |v: &Option<Spanned<u64>>, key: &str| -> Result<Option<u64>, ConfigError> {
            match v {
                None => Ok(None),
                Some(s) if (1..=100_000_000).contains(s.get_ref()) => Ok(Some(*s.get_ref())),
                Some(s) => l.err(
                    s.span(),
                    format!("{key} = {}: expected 1 to 100000000", s.get_ref()),
                ),
            }
        };
        let max_connections = count(&b.max_connections, "max_connections")?.map(|n| n as usize);
        let max_connections_per_source =
            count(&b.max_connections_per_source, "max_connections_per_source")?
                .map(|n| n.min(u64::from(u32::MAX)) as u32);
        let tcp_idle_timeout = ms(
            &b.tcp_idle_timeout_ms,
            "tcp_idle_timeout_ms",
            300_000,
            86_400_000,
        )?;
        let tcp_keepalive = match &b.tcp_keepalive_ms {
            Some(s) if *s.get_ref() == 0 => None,
            v => Some(ms(v, "tcp_keepalive_ms", 60_000, 7_200_000)?),
        };
        let evict_idle_after = ms(
            &b.evict_idle_after_ms,
            "evict_idle_after_ms",
            10_000,
            86_400_000,
        )?;
        let drain_timeout = ms(&b.drain_timeout_ms, "drain_timeout_ms", 30_000, 3_600_000)?;
        let mut backends: Vec<BackendConfig> = Vec::new();
        for be in &raw.backend {
            let r = be.get_ref();
            let default_port = match mode {
                Mode::Dsr => Some(vip.map(|v| v.port()).unwrap_or(0)),
                Mode::Proxy => None,
            };
            let address = match parse_addr(r.address.get_ref(), default_port) {
                Some(a) => a,
                None => return l.err(r.address.span(), format!("backend address {:?}: not an address with a port (e.g. \"198.18.0.3:8080\")", r.address.get_ref())),
            };
            if mode == Mode::Proxy && address.port() == 0 {
                return l.err(
                    r.address.span(),
                    format!(
                        "backend address {:?}: port must not be 0 in proxy mode",
                        r.address.get_ref()
                    ),
                );
            }
            let weight = match &r.weight {
                None => 1,
                Some(w) if (1..=10_000).contains(w.get_ref()) => *w.get_ref() as u32,
                Some(w) => {
                    return l.err(
                        w.span(),
                        format!("backend weight {}: expected 1 to 10000", w.get_ref()),
                    )
                }
            };
            if backends.iter().any(|x| x.address == address) {
                return l.err(
                    r.address.span(),
                    format!("backend {address} is listed twice"),
                );
            }
            backends.push(BackendConfig { address, weight });
        }
        if mode == Mode::Dsr && health.port.is_none() {
            if let Some(b0) = backends.iter().find(|b| b.address.port() == 0) {
                return l.err(hspan, format!("backend {} has no port: set health.port so that health checks know where to connect", b0.address.ip()));
            }
        }

        Ok(Config {
            name,
            mode,
            protocol,
            listen,
            vip,
            interface,
            algorithm,
            health: HealthConfig {
                interval: Duration::from_millis(interval_ms),
                timeout: Duration::from_millis(timeout_ms),
                fall,
                rise,
                http_path: health.http_path,
                port: health.port,
            },
            metrics,
            control,
            table_size,
            connect_timeout,
            udp_idle_timeout,
            max_flows,
            workers,
            max_connections,
            max_connections_per_source,
            tcp_idle_timeout,
            tcp_keepalive,
            evict_idle_after,
            drain_timeout,
            backends,
        })
    }
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

    fn err(text: &str) -> String {
        let e = Config::parse(text, "t.toml").unwrap_err().0;
        assert!(!e.contains('\n'), "multi-line error: {e}");
        e
    }

    #[test]
    fn the_issue_example_parses() {
        let c = Config::parse(GOOD, "t.toml").unwrap();
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
        assert!(e.contains("line 9") && e.contains("colour"), "{e}");
        let e = err(&GOOD.replace("weight = 3", "weight = 3\nwieght = 2"));
        assert!(e.contains("wieght") && e.contains("line 18"), "{e}");
        let e = err(&GOOD.replace("fall = 2", "fal = 2"));
        assert!(e.contains("fal"), "{e}");
    }

    #[test]
    fn bad_values() {
        let e = err(&GOOD.replace("198.18.0.3:8080", "198.18.0.300:8080"));
        assert!(e.contains("line 12") && e.contains("198.18.0.300"), "{e}");
        assert!(err(&GOOD.replace("198.18.0.10:8080", "nowhere")).contains("listen"));
        assert!(err(&GOOD.replace("\"maglev\"", "\"fastest\"")).contains("unknown algorithm"));
        assert!(err(&GOOD.replace("\"proxy\"", "\"tunnel\"")).contains("mode"));
        assert!(err(&GOOD.replace("\"tcp\"", "\"sctp\"")).contains("protocol"));
        assert!(err(&GOOD.replace("weight = 3", "weight = 0")).contains("weight"));
        assert!(err(&GOOD.replace("weight = 3", "weight = -1")).contains("weight"));
        assert!(err(&GOOD.replace("fall = 2", "fall = 0")).contains("fall"));
        assert!(err(&GOOD.replace("interval_ms = 500", "interval_ms = 0")).contains("interval_ms"));
        assert!(err(&GOOD.replace("198.18.0.4:8080", "198.18.0.3:8080")).contains("twice"));
        assert!(err(&GOOD.replace("listen = \"198.18.0.10:8080\"", "")).contains("listen"));
        assert!(err(&format!("{GOOD}\n[balance.x]\n")).contains("line"));
        assert!(err("[balance]\nname = \"a b\"\nlisten=\"1.2.3.4:5\"").contains("name"));
        assert!(err(&GOOD.replace("algorithm", "table_size = 65536\nalgorithm")).contains("prime"));
        assert!(err("").contains("balance"));
        assert!(err("[balance\n").contains("line"));
    }

    #[test]
    fn dsr_needs_vip_and_an_existing_interface() {
        let dsr = GOOD.replace("mode = \"proxy\"", "mode = \"dsr\"");
        assert!(err(&dsr).contains("vip"));
        let dsr = dsr.replace("listen =", "vip = \"198.18.0.100\"\nlisten =");
        assert!(err(&dsr).contains("interface"));
        let e = err(&dsr.replace("vip =", "interface = \"nosuchif0\"\nvip ="));
        assert!(
            e.contains("nosuchif0") && e.contains("does not exist") && e.contains("line 6"),
            "{e}"
        );
        let c = Config::parse(&dsr.replace("vip =", "interface = \"lo\"\nvip ="), "t").unwrap();
        assert_eq!(c.vip, Some("198.18.0.100:0".parse().unwrap()));
        assert_eq!(c.interface.as_deref(), Some("lo"));
        // DSR backends may omit the port (all ports), but then health checks need one.
        let noport = dsr
            .replace("vip =", "interface = \"lo\"\nvip =")
            .replace("\"198.18.0.3:8080\"", "\"198.18.0.3\"");
        assert!(err(&noport).contains("health.port"));
        let c = Config::parse(&noport.replace("rise = 2", "rise = 2, port = 80"), "t").unwrap();
        assert_eq!(c.backends[0].address, "198.18.0.3:0".parse().unwrap());
    }

    #[test]
    fn defaults() {
        let c = Config::parse("[balance]\nname = \"x\"\nlisten = \"[2001:db8::1]:80\"\n[[backend]]\naddress = \"[2001:db8::2]:80\"\n", "t").unwrap();
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
        let c = Config::parse(
            &with("max_connections = 5000\nmax_connections_per_source = 50\ntcp_idle_timeout_ms = 2000\ntcp_keepalive_ms = 0\nevict_idle_after_ms = 500\ndrain_timeout_ms = 4000"),
            "t",
        )
        .unwrap();
        assert_eq!(c.max_connections, Some(5000));
        assert_eq!(c.max_connections_per_source, Some(50));
        assert_eq!(c.tcp_idle_timeout, Duration::from_secs(2));
        assert_eq!(c.tcp_keepalive, None);
        assert_eq!(c.evict_idle_after, Duration::from_millis(500));
        assert_eq!(c.drain_timeout, Duration::from_secs(4));
        let e = err(&with("max_connections = 0"));
        assert!(e.contains("max_connections") && e.contains("line 9"), "{e}");
        assert!(err(&with("tcp_idle_timeout_ms = 0")).contains("tcp_idle_timeout_ms"));
        assert!(err(&with("drain_timeout_ms = -1")).contains("line 9"));
    }
}
