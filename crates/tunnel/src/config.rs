//! `braid up`'s TOML configuration: parsing (serde + toml, unknown keys rejected everywhere) and
//! validation. Every error is one line that says what is wrong and where (file, line, column).
//!
//! ```toml
//! [bundle]
//! name = "braid0"              # TUN device name
//! role = "client"              # or "server"
//! key = "base64..."            # or key_file = "/etc/braid/key"
//! address = "198.19.0.2/30"    # tunnel address (IPv4 or IPv6) with prefix; dual stack:
//!                              # ["198.19.0.2/30", "2001:2:0:1::2/64"] or "a/p, b/p"
//! mtu = 1400
//! listen = "0.0.0.0:5050"      # server: where links arrive
//! scheduler = "adaptive"
//! control = "/run/braid/braid0.sock"   # optional
//! metrics = "127.0.0.1:9150"           # optional
//!
//! [[link]]
//! name = "isp1"
//! dev = "veth1"                # SO_BINDTODEVICE, and/or
//! bind = "198.18.1.1"          # this source address (optionally with :port)
//! remote = "198.18.1.2:5050"
//! bandwidth = 28800            # optional, bit/s
//! priority = 0                 # optional
//! ```

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use braid_core::endpoint::Role;
use braid_core::wire::CipherId;
use braid_core::LinkId;
use serde::Deserialize;
use toml::Spanned;

/// Default MTU of the TUN device: leaves room for braid's 77 bytes of overhead (IPv4 + UDP +
/// header + tag) on a 1500-byte uplink, with margin for PPPoE and similar.
pub const DEFAULT_MTU: u32 = 1400;
/// Default transmit queue of the TUN device (packets). The kernel's 500 for TUN drops bursts
/// once braid is CPU-bound: one TCP flow over one veth link, 8 s, 2-core VM: 500 -> ~1.5 Gbit/s
/// with 19201 retransmits; 1000 -> 1.27-1.35 Gbit/s, 1541-2683 retransmits; 2000 -> 1.39-1.54
/// Gbit/s, 0 retransmits. The queue only fills while braid is the bottleneck, where 2000
/// packets add at most ~16 ms.
pub const DEFAULT_TXQUEUELEN: u32 = 2000;
/// Default time the client waits for a first session before it gives up.
pub const DEFAULT_CONNECT_TIMEOUT_S: u64 = 10;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRepr {
    bundle: BundleRepr,
    #[serde(default)]
    link: Vec<Spanned<LinkRepr>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BundleRepr {
    name: Spanned<String>,
    role: Spanned<String>,
    key: Option<Spanned<String>>,
    key_file: Option<Spanned<String>>,
    /// A string ("IP/PREFIX", or several separated by commas as in wg-quick) or an array of them.
    address: Spanned<toml::Value>,
    mtu: Option<Spanned<u32>>,
    listen: Option<Spanned<String>>,
    scheduler: Option<Spanned<String>>,
    control: Option<Spanned<String>>,
    metrics: Option<Spanned<String>>,
    // Optional knobs beyond the contract.
    /// "chacha20-poly1305" (default) or "aes256-gcm".
    cipher: Option<Spanned<String>>,
    /// Keepalive/probe period per link, milliseconds (default: the core's, 100 ms).
    probe_interval_ms: Option<Spanned<u64>>,
    /// A link is DOWN after this long without an answer, milliseconds (default: the core's).
    down_after_ms: Option<Spanned<u64>>,
    /// Upper bound of the reorder buffer's hold time, milliseconds.
    reorder_max_ms: Option<Spanned<u64>>,
    /// Bound of delay equalisation, milliseconds (0: off; default the core's, 100).
    equalize_max_ms: Option<Spanned<u64>>,
    /// Transmit queue of the TUN device, packets (default 2000).
    txqueuelen: Option<Spanned<u32>>,
    /// Client: give up (exit non-zero) when no session comes up within this many seconds of
    /// start (0: keep trying forever). Default 10.
    connect_timeout: Option<Spanned<u64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LinkRepr {
    name: Spanned<String>,
    dev: Option<Spanned<String>>,
    bind: Option<Spanned<String>>,
    remote: Option<Spanned<String>>,
    bandwidth: Option<Spanned<u64>>,
    priority: Option<Spanned<u8>>,
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub path: PathBuf,
    pub name: String,
    pub role: Role,
    pub psk: [u8; 32],
    /// The TUN device's addresses, in the order written (at least one; IPv4 and IPv6 mixed).
    pub addresses: Vec<TunAddress>,
    pub mtu: u32,
    pub listen: Option<SocketAddr>,
    pub scheduler: String,
    pub control: PathBuf,
    pub metrics: Option<SocketAddr>,
    pub cipher: CipherId,
    pub probe_interval: Option<Duration>,
    pub down_after: Option<Duration>,
    pub reorder_max: Option<Duration>,
    /// Bound of delay equalisation (`Some(ZERO)`: off; `None`: the core's default).
    pub equalize_max: Option<Duration>,
    pub connect_timeout: Option<Duration>,
    pub txqueuelen: u32,
    pub links: Vec<LinkSpec>,
}

/// One address of the TUN device with its prefix length, shown as `198.19.0.2/30`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TunAddress {
    pub ip: IpAddr,
    pub prefix: u8,
}

impl std::fmt::Display for TunAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.ip, self.prefix)
    }
}

/// One uplink of a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkSpec {
    pub id: LinkId,
    pub name: String,
    pub dev: Option<String>,
    pub bind: Option<SocketAddr>,
    /// The server's address over this uplink, as written (host:port).
    pub remote_text: String,
    pub remote: SocketAddr,
    pub bandwidth_bps: Option<u64>,
    pub priority: u8,
}

/// A configuration error: one line.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Line and column (1-based) of byte offset `pos` in `text`.
fn line_col(text: &str, pos: usize) -> (usize, usize) {
    let pos = pos.min(text.len());
    let before = &text[..pos];
    let line = before.matches('\n').count() + 1;
    let col = before.rfind('\n').map(|i| pos - i).unwrap_or(pos + 1);
    (line, col)
}

struct Ctx<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Ctx<'_> {
    fn at<T>(&self, v: &Spanned<T>, msg: impl std::fmt::Display) -> ConfigError {
        let (l, c) = line_col(self.text, v.span().start);
        ConfigError(format!("{}:{l}:{c}: {msg}", self.path.display()))
    }
    fn whole(&self, msg: impl std::fmt::Display) -> ConfigError {
        ConfigError(format!("{}: {msg}", self.path.display()))
    }
}

/// Parses "IP/PREFIX" (IPv4 or IPv6).
pub fn parse_cidr(s: &str) -> Result<(IpAddr, u8), String> {
    let (ip, prefix) = s
        .split_once('/')
        .ok_or_else(|| format!("{s:?} is not ADDRESS/PREFIX (e.g. 198.19.0.1/30)"))?;
    let ip: IpAddr = ip
        .trim()
        .parse()
        .map_err(|_| format!("{ip:?} is not an IP address"))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let prefix: u8 = prefix
        .trim()
        .parse()
        .ok()
        .filter(|p| *p <= max)
        .ok_or_else(|| format!("{prefix:?} is not a prefix length 0..{max}"))?;
    Ok((ip, prefix))
}

/// Parses `[bundle] address`: a string with one "IP/PREFIX" or several separated by commas
/// (wg-quick's `Address = 10.0.0.2/24, fd00::2/64`), or an array of such strings. Any number of
/// IPv4 and IPv6 addresses, each IP once.
pub fn parse_addresses(v: &toml::Value) -> Result<Vec<TunAddress>, String> {
    const WANT: &str =
        "a string (\"198.19.0.2/30\") or an array of them ([\"198.19.0.2/30\", \"2001:2:0:1::2/64\"])";
    let texts: Vec<&str> = match v {
        toml::Value::String(s) => vec![s.as_str()],
        toml::Value::Array(a) => a
            .iter()
            .map(|x| {
                x.as_str()
                    .ok_or_else(|| format!("{x} is not a string; expected {WANT}"))
            })
            .collect::<Result<_, _>>()?,
        other => return Err(format!("{other} is not {WANT}")),
    };
    let mut out: Vec<TunAddress> = Vec::new();
    for part in texts.iter().flat_map(|t| t.split(',')) {
        let part = part.trim();
        if part.is_empty() {
            return Err(format!("empty entry in {v}; expected {WANT}"));
        }
        let (ip, prefix) = parse_cidr(part)?;
        if out.iter().any(|a| a.ip == ip) {
            return Err(format!("{ip} is listed twice"));
        }
        out.push(TunAddress { ip, prefix });
    }
    if out.is_empty() {
        return Err(format!("no address given; expected {WANT}"));
    }
    Ok(out)
}

/// Decodes a base64 32-byte key.
pub fn decode_key(s: &str) -> Result<[u8; 32], String> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(s.trim())
        .map_err(|e| format!("key is not base64 ({e}); make one with `braid keygen`"))?;
    <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| {
        format!(
            "key is {} bytes, expected 32; make one with `braid keygen`",
            bytes.len()
        )
    })
}

/// Parses "ADDRESS" or "ADDRESS:PORT" (IPv6 as "[::1]:5050").
pub fn parse_bind(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    if let Ok(ip) = s
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
    {
        return Ok(SocketAddr::new(ip, 0));
    }
    Err(format!("{s:?} is not an IP address (or ADDRESS:PORT)"))
}

/// Resolves "HOST:PORT", preferring the address family of `family_hint`.
pub fn resolve_remote(s: &str, family_hint: Option<IpAddr>) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    if !s.contains(':') {
        return Err(format!("{s:?} is not HOST:PORT"));
    }
    let addrs: Vec<SocketAddr> = s
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {s:?}: {e}"))?
        .collect();
    let pick = match family_hint {
        Some(h) => addrs
            .iter()
            .find(|a| a.is_ipv4() == h.is_ipv4())
            .or(addrs.first()),
        None => addrs.iter().find(|a| a.is_ipv4()).or(addrs.first()),
    };
    pick.copied()
        .ok_or_else(|| format!("{s:?} resolves to no address"))
}

fn parse_socket_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse::<SocketAddr>()
        .map_err(|_| format!("{s:?} is not ADDRESS:PORT"))
}

impl Config {
    /// The TUN device's addresses as one line: `198.19.0.2/30, 2001:2:0:1::2/64`.
    pub fn addresses_text(&self) -> String {
        let all: Vec<String> = self.addresses.iter().map(|a| a.to_string()).collect();
        all.join(", ")
    }

    /// Reads and validates the file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("cannot read config {}: {e}", path.display())))?;
        Self::parse(path, &text)
    }

    /// Validates `text` (the contents of `path`, used in messages).
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let cx = Ctx { path, text };
        let file: FileRepr = toml::from_str(text).map_err(|e| {
            let msg = e.message().replace('\n', " ");
            match e.span() {
                Some(sp) => {
                    let (l, c) = line_col(text, sp.start);
                    ConfigError(format!("{}:{l}:{c}: {msg}", path.display()))
                }
                None => ConfigError(format!("{}: {msg}", path.display())),
            }
        })?;
        let b = file.bundle;

        let name = b.name.get_ref().clone();
        if !braid_linux::tun::valid_ifname(&name) {
            return Err(cx.at(&b.name, format_args!("name {name:?} is not a valid interface name (1 to 15 characters, no '/', ':' or spaces)")));
        }
        let role = match b.role.get_ref().as_str() {
            "client" => Role::Client,
            "server" => Role::Server,
            other => {
                return Err(cx.at(
                    &b.role,
                    format_args!("role {other:?} is neither \"client\" nor \"server\""),
                ))
            }
        };
        let psk = match (&b.key, &b.key_file) {
            (Some(_), Some(f)) => return Err(cx.at(f, "give either key or key_file, not both")),
            (Some(k), None) => decode_key(k.get_ref()).map_err(|m| cx.at(k, m))?,
            (None, Some(f)) => {
                let kp = Path::new(f.get_ref());
                let kp = if kp.is_relative() { path.parent().unwrap_or(Path::new(".")).join(kp) } else { kp.to_path_buf() };
                let t = std::fs::read_to_string(&kp)
                    .map_err(|e| cx.at(f, format_args!("key_file {}: cannot read: {e}", kp.display())))?;
                decode_key(&t).map_err(|m| cx.at(f, format_args!("key_file {}: {m}", kp.display())))?
            }
            (None, None) => return Err(cx.whole("[bundle] needs key = \"...\" or key_file = \"...\" (make a key with `braid keygen`)")),
        };
        let addresses = parse_addresses(b.address.get_ref())
            .map_err(|m| cx.at(&b.address, format_args!("address: {m}")))?;
        let ipv6 = addresses.iter().find(|a| a.ip.is_ipv6());
        let mtu = match &b.mtu {
            Some(m) if !(576..=65535).contains(m.get_ref()) => {
                return Err(cx.at(
                    m,
                    format_args!("mtu {} out of range 576..65535", m.get_ref()),
                ))
            }
            Some(m) if *m.get_ref() < 1280 && ipv6.is_some() => {
                return Err(cx.at(
                    m,
                    format_args!(
                        "mtu {} is below 1280, the least IPv6 allows, and address has {} (raise mtu or drop the IPv6 address)",
                        m.get_ref(),
                        ipv6.map(|a| a.to_string()).unwrap_or_default()
                    ),
                ))
            }
            Some(m) => *m.get_ref(),
            None => DEFAULT_MTU,
        };
        let listen = match &b.listen {
            Some(l) => Some(
                parse_socket_addr(l.get_ref())
                    .map_err(|m| cx.at(l, format_args!("listen: {m}")))?,
            ),
            None => None,
        };
        if role == Role::Server && listen.is_none() {
            return Err(cx.whole(
                "[bundle] a server needs listen = \"ADDRESS:PORT\" (where its links arrive)",
            ));
        }
        let scheduler = match &b.scheduler {
            Some(s) if braid_core::sched::NAMES.contains(&s.get_ref().as_str()) => {
                s.get_ref().clone()
            }
            Some(s) => {
                return Err(cx.at(
                    s,
                    format_args!(
                        "unknown scheduler {:?} (expected one of: {})",
                        s.get_ref(),
                        braid_core::sched::NAMES.join(", ")
                    ),
                ))
            }
            None => "adaptive".to_string(),
        };
        let control = match &b.control {
            Some(c) if c.get_ref().is_empty() => return Err(cx.at(c, "control: empty path")),
            Some(c) => PathBuf::from(c.get_ref()),
            None => braid_linux::control::default_path(&name),
        };
        let metrics = match &b.metrics {
            Some(m) => Some(
                parse_socket_addr(m.get_ref())
                    .map_err(|e| cx.at(m, format_args!("metrics: {e}")))?,
            ),
            None => None,
        };
        let cipher = match &b.cipher {
            None => CipherId::ChaCha20Poly1305,
            Some(c) => match c.get_ref().as_str() {
                "chacha20-poly1305" => CipherId::ChaCha20Poly1305,
                "aes256-gcm" => CipherId::Aes256Gcm,
                other => {
                    return Err(cx.at(
                        c,
                        format_args!(
                            "unknown cipher {other:?} (expected chacha20-poly1305 or aes256-gcm)"
                        ),
                    ))
                }
            },
        };
        let ms = |v: &Option<Spanned<u64>>, what: &str| -> Result<Option<Duration>, ConfigError> {
            match v {
                Some(x) if *x.get_ref() == 0 || *x.get_ref() > 600_000 => {
                    Err(cx.at(x, format_args!("{what} must be 1..600000 ms")))
                }
                Some(x) => Ok(Some(Duration::from_millis(*x.get_ref()))),
                None => Ok(None),
            }
        };
        let probe_interval = ms(&b.probe_interval_ms, "probe_interval_ms")?;
        let down_after = ms(&b.down_after_ms, "down_after_ms")?;
        let reorder_max = ms(&b.reorder_max_ms, "reorder_max_ms")?;
        let equalize_max = match &b.equalize_max_ms {
            Some(x) if *x.get_ref() > 1_000 => {
                return Err(cx.at(
                    x,
                    format_args!("equalize_max_ms must be 0..1000 ms (0 turns it off)"),
                ))
            }
            Some(x) => Some(Duration::from_millis(*x.get_ref())),
            None => None,
        };
        let connect_timeout = match b
            .connect_timeout
            .as_ref()
            .map(|c| *c.get_ref())
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT_S)
        {
            0 => None,
            s => Some(Duration::from_secs(s)),
        };

        let txqueuelen = match &b.txqueuelen {
            Some(q) if !(1..=100_000).contains(q.get_ref()) => {
                return Err(cx.at(q, "txqueuelen must be 1..100000 packets"))
            }
            Some(q) => *q.get_ref(),
            None => DEFAULT_TXQUEUELEN,
        };
        let mut links = Vec::new();
        if role == Role::Client && file.link.is_empty() {
            return Err(
                cx.whole("a client needs at least one [[link]] (name, dev and/or bind, remote)")
            );
        }
        for (i, l) in file.link.iter().enumerate() {
            let sp = l.span();
            let l = l.get_ref();
            let lname = l.name.get_ref().clone();
            if lname.is_empty() || lname.len() > 32 || lname.contains(char::is_whitespace) {
                return Err(cx.at(
                    &l.name,
                    format_args!("link name {lname:?}: 1 to 32 characters, no spaces"),
                ));
            }
            if links.iter().any(|x: &LinkSpec| x.name == lname) {
                return Err(cx.at(&l.name, format_args!("link name {lname:?} is used twice")));
            }
            let at_link = |msg: String| {
                let (ln, c) = line_col(text, sp.start);
                ConfigError(format!("{}:{ln}:{c}: link {lname}: {msg}", path.display()))
            };
            if role == Role::Server {
                // The server learns its links from the client; [[link]] tables are not used.
                continue;
            }
            if l.dev.is_none() && l.bind.is_none() {
                return Err(at_link(
                    "needs dev = \"IFACE\" and/or bind = \"ADDRESS\"".into(),
                ));
            }
            if let Some(d) = &l.dev {
                if !braid_linux::tun::valid_ifname(d.get_ref()) {
                    return Err(cx.at(
                        d,
                        format_args!(
                            "link {lname}: dev {:?} is not a valid interface name",
                            d.get_ref()
                        ),
                    ));
                }
            }
            let bind = match &l.bind {
                Some(bv) => Some(
                    parse_bind(bv.get_ref())
                        .map_err(|m| cx.at(bv, format_args!("link {lname}: bind: {m}")))?,
                ),
                None => None,
            };
            let remote_v = l.remote.as_ref().ok_or_else(|| {
                at_link(
                    "needs remote = \"HOST:PORT\" (the server's address over this uplink)".into(),
                )
            })?;
            let remote = resolve_remote(remote_v.get_ref(), bind.map(|b| b.ip()))
                .map_err(|m| cx.at(remote_v, format_args!("link {lname}: remote: {m}")))?;
            if let Some(bind) = bind {
                if bind.is_ipv4() != remote.is_ipv4() && !bind.ip().is_unspecified() {
                    return Err(cx.at(remote_v, format_args!("link {lname}: remote {remote} and bind {} are of different IP families", bind.ip())));
                }
            }
            if let Some(bw) = &l.bandwidth {
                if *bw.get_ref() == 0 {
                    return Err(cx.at(
                        bw,
                        format_args!("link {lname}: bandwidth must be > 0 bit/s (or left out)"),
                    ));
                }
            }
            links.push(LinkSpec {
                id: (i + 1) as LinkId,
                name: lname,
                dev: l.dev.as_ref().map(|d| d.get_ref().clone()),
                bind,
                remote_text: remote_v.get_ref().clone(),
                remote,
                bandwidth_bps: l.bandwidth.as_ref().map(|b| *b.get_ref()),
                priority: l.priority.as_ref().map(|p| *p.get_ref()).unwrap_or(0),
            });
        }
        Ok(Config {
            path: path.to_path_buf(),
            name,
            role,
            psk,
            addresses,
            mtu,
            listen,
            scheduler,
            control,
            metrics,
            cipher,
            probe_interval,
            down_after,
            reorder_max,
            equalize_max,
            connect_timeout,
            txqueuelen,
            links,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

    fn client(extra_bundle: &str, links: &str) -> String {
        format!(
            "[bundle]\nname = \"braid0\"\nrole = \"client\"\nkey = \"{KEY}\"\naddress = \"198.19.0.2/30\"\nmtu = 1400\n{extra_bundle}\n{links}"
        )
    }
    const LINKS: &str = "[[link]]\nname = \"isp1\"\ndev = \"veth1\"\nremote = \"198.18.1.2:5050\"\nbandwidth = 28800\n\n[[link]]\nname = \"isp2\"\nbind = \"198.18.2.1\"\nremote = \"198.18.2.2:5050\"\npriority = 1\n";

    fn parse(t: &str) -> Result<Config, String> {
        Config::parse(Path::new("/etc/braid/t.toml"), t).map_err(|e| e.0)
    }

    #[test]
    fn full_client() {
        let c = parse(&client(
            "scheduler = \"weighted\"\nmetrics = \"127.0.0.1:9150\"",
            LINKS,
        ))
        .unwrap();
        assert_eq!(c.role, Role::Client);
        assert_eq!(c.psk[31], 31);
        assert_eq!(c.addresses.len(), 1);
        assert_eq!(
            (c.addresses[0].to_string(), c.mtu),
            ("198.19.0.2/30".to_string(), 1400)
        );
        assert_eq!(c.scheduler, "weighted");
        assert_eq!(c.control, PathBuf::from("/run/braid/braid0.sock"));
        assert_eq!(c.links.len(), 2);
        assert_eq!((c.links[0].id, c.links[1].id), (1, 2));
        assert_eq!(c.links[0].dev.as_deref(), Some("veth1"));
        assert_eq!(c.links[0].bandwidth_bps, Some(28800));
        assert_eq!(c.links[1].bind, Some("198.18.2.1:0".parse().unwrap()));
        assert_eq!(c.links[1].priority, 1);
        assert_eq!(c.connect_timeout, Some(Duration::from_secs(10)));
    }

    #[test]
    fn equalisation_bound() {
        let c = parse(&client("", LINKS)).unwrap();
        assert_eq!(c.equalize_max, None, "the core's default");
        let c = parse(&client("equalize_max_ms = 0", LINKS)).unwrap();
        assert_eq!(c.equalize_max, Some(Duration::ZERO), "off");
        let c = parse(&client("equalize_max_ms = 250", LINKS)).unwrap();
        assert_eq!(c.equalize_max, Some(Duration::from_millis(250)));
        let e = parse(&client("equalize_max_ms = 5000", LINKS)).unwrap_err();
        assert!(
            e.starts_with("/etc/braid/t.toml:7:") && e.contains("equalize_max_ms must be 0..1000"),
            "{e}"
        );
    }

    #[test]
    fn server_and_ipv6() {
        let t = format!("[bundle]\nname = \"b1\"\nrole = \"server\"\nkey = \"{KEY}\"\naddress = \"fd00::1/64\"\nlisten = \"[::]:5050\"\ncontrol = \"/tmp/x.sock\"\n");
        let c = parse(&t).unwrap();
        assert_eq!(c.role, Role::Server);
        assert_eq!(
            c.addresses,
            [TunAddress {
                ip: "fd00::1".parse().unwrap(),
                prefix: 64
            }]
        );
        assert_eq!(c.listen, Some("[::]:5050".parse().unwrap()));
        assert_eq!(c.mtu, DEFAULT_MTU);
    }

    /// `address` as an array, as a wg-quick style comma list, or both; every address kept in order.
    #[test]
    fn dual_stack_addresses() {
        let want = ["198.19.0.2/30", "2001:2:0:1::2/64"];
        for form in [
            r#"["198.19.0.2/30", "2001:2:0:1::2/64"]"#,
            r#""198.19.0.2/30, 2001:2:0:1::2/64""#,
            r#""198.19.0.2/30,2001:2:0:1::2/64""#,
            r#"[ "198.19.0.2/30", " 2001:2:0:1::2/64 " ]"#,
        ] {
            let t = client("", LINKS).replace(r#""198.19.0.2/30""#, form);
            let c = parse(&t).unwrap_or_else(|e| panic!("{form}: {e}"));
            let got: Vec<String> = c.addresses.iter().map(|a| a.to_string()).collect();
            assert_eq!(got, want, "{form}");
        }
        // Several of one family, as wg-quick allows.
        let t = client("", LINKS).replace(
            r#""198.19.0.2/30""#,
            r#"["198.19.0.2/30", "198.19.1.2/24", "2001:2::2/64", "2001:2:0:1::2/64"]"#,
        );
        assert_eq!(parse(&t).unwrap().addresses.len(), 4);
    }

    #[test]
    fn address_errors_point_at_address() {
        let cases = [
            (r#"[]"#, "no address given"),
            (r#""""#, "empty entry"),
            (r#""198.19.0.2/30,""#, "empty entry"),
            (r#"["198.19.0.2/30", 7]"#, "7 is not a string"),
            (r#"42"#, "42 is not a string"),
            (r#"["198.19.0.2/30", "2001:2::1"]"#, "not ADDRESS/PREFIX"),
            (r#""198.19.0.2/30, 2001:2::1/129""#, "prefix length"),
            (
                r#""198.19.0.2/30, 198.19.0.2/24""#,
                "198.19.0.2 is listed twice",
            ),
        ];
        for (form, want) in cases {
            let t = client("", LINKS).replace(r#""198.19.0.2/30""#, form);
            let e = parse(&t).unwrap_err();
            assert!(
                e.starts_with("/etc/braid/t.toml:5:")
                    && e.contains("address: ")
                    && e.contains(want),
                "{form}: want {want:?} in {e:?}"
            );
            assert!(!e.contains('\n'), "{e}");
        }
    }

    /// IPv6 needs an MTU of at least 1280: a lower `mtu` with any IPv6 address is refused, and
    /// says why; IPv4 alone may go lower.
    #[test]
    fn ipv6_needs_mtu_1280() {
        let dual = client("", LINKS).replace(
            r#""198.19.0.2/30""#,
            r#"["198.19.0.2/30", "2001:2:0:1::2/64"]"#,
        );
        let e = parse(&dual.replace("mtu = 1400", "mtu = 1200")).unwrap_err();
        assert!(
            e.starts_with("/etc/braid/t.toml:6:")
                && e.contains("mtu 1200 is below 1280")
                && e.contains("2001:2:0:1::2/64"),
            "{e}"
        );
        assert_eq!(
            parse(&dual.replace("mtu = 1400", "mtu = 1280"))
                .unwrap()
                .mtu,
            1280
        );
        let v4 = client("", LINKS).replace("mtu = 1400", "mtu = 1200");
        assert_eq!(parse(&v4).unwrap().mtu, 1200);
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let e = parse(&client("colour = \"blue\"", LINKS)).unwrap_err();
        assert!(e.starts_with("/etc/braid/t.toml:7:"), "{e}");
        assert!(e.contains("colour"), "{e}");
        assert!(!e.contains('\n'));
        let e = parse(&client("", &LINKS.replace("priority", "prio"))).unwrap_err();
        assert!(e.contains("prio") && e.contains(":18:"), "{e}");
    }

    #[test]
    fn each_error_says_what_and_where() {
        let cases: &[(String, &str)] = &[
            (
                client("", LINKS).replace(KEY, "bm90IGEga2V5"),
                "key is 9 bytes",
            ),
            (client("", LINKS).replace(KEY, "!!!"), "not base64"),
            (
                client("", LINKS).replace("198.19.0.2/30", "198.19.0.2"),
                "address",
            ),
            (
                client("", LINKS).replace("198.19.0.2/30", "198.19.0.2/33"),
                "prefix",
            ),
            (
                client("scheduler = \"fastest\"", LINKS),
                "unknown scheduler \"fastest\"",
            ),
            (client("", ""), "at least one [[link]]"),
            (client("", &LINKS.replace("isp2", "isp1")), "used twice"),
            (
                client("", &LINKS.replace("bind = \"198.18.2.1\"\n", "")),
                "link isp2: needs dev",
            ),
            (
                client("", &LINKS.replace("remote = \"198.18.1.2:5050\"\n", "")),
                "link isp1: needs remote",
            ),
            (
                client("", &LINKS.replace("198.18.2.2:5050", "nowhere")),
                "not HOST:PORT",
            ),
            (
                client("", LINKS).replace("role = \"client\"", "role = \"boss\""),
                "role",
            ),
            (
                client("", LINKS).replace("name = \"braid0\"", "name = \"a/b\""),
                "interface name",
            ),
            (client("", LINKS).replace("mtu = 1400", "mtu = 10"), "mtu"),
            (
                client("", LINKS).replace("mtu = 1400", "mtu = \"big\""),
                "invalid type",
            ),
            (
                client("key_file = \"/nonexistent/k\"", LINKS)
                    .replace(&format!("key = \"{KEY}\"\n"), ""),
                "cannot read",
            ),
            (
                client("", LINKS).replace(&format!("key = \"{KEY}\"\n"), ""),
                "needs key",
            ),
            (
                client("", LINKS).replace("role = \"client\"", "role = \"server\""),
                "needs listen",
            ),
            (client("", LINKS).replace("[bundle]", "[bundel]"), "bundel"),
        ];
        for (t, want) in cases {
            let e = parse(t).unwrap_err();
            assert!(e.contains(want), "want {want:?} in {e:?}");
            assert!(e.starts_with("/etc/braid/t.toml"), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn cidr_and_bind() {
        assert_eq!(parse_cidr("10.0.0.1/8").unwrap().1, 8);
        assert!(parse_cidr("fd00::1/129").is_err());
        assert_eq!(parse_bind("198.18.1.1:7000").unwrap().port(), 7000);
        assert_eq!(parse_bind("fd00::1").unwrap().port(), 0);
        assert!(parse_bind("eth0").is_err());
        assert_eq!(resolve_remote("localhost:5050", None).unwrap().port(), 5050);
    }
}
