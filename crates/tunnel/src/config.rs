//! `braid up`'s TOML configuration: parsing (serde + toml, unknown keys rejected everywhere) and
//! validation, one validator per section (`validate_bundle`, `validate_link`). Every error is
//! one line that names the file, the line and the key (`braid_config`'s format).
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
//! dev = "eth1"                 # SO_BINDTODEVICE (must exist), and/or
//! bind = "198.18.1.1"          # this source address (optionally with :port)
//! remote = "198.18.1.2:5050"
//! bandwidth = 28800            # optional, bit/s: the uplink's rate (what braid sends at first)
//! download_bandwidth = 56000   # optional, bit/s: the downlink's; told to the server, which
//!                              # sends at it first (MLVPN's bandwidth_download)
//! priority = 0                 # optional
//! ```

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use braid_config::{in_range, Source, Spanned};
use braid_core::endpoint::Role;
use braid_core::wire::CipherId;
use braid_core::LinkId;
use serde::Deserialize;

/// Default MTU of the TUN device: leaves room for braid's 58 bytes of overhead (IPv4 + UDP +
/// header + tag) on a 1500-byte uplink, with margin for PPPoE and similar. Larger MTUs (1500 on
/// 1500-byte uplinks) work: packets that do not fit a link's path MTU are cut into pieces
/// (docs/protocol.md §10.1).
pub const DEFAULT_MTU: u32 = 1400;
/// The largest `mtu`: a tunnel packet plus braid's per-packet overhead must fit the link
/// sockets' receive buffer, or it arrives cut short (and fails authentication).
pub const MAX_MTU: u32 = (braid_linux::udp::MAX_DATAGRAM - braid_core::wire::DATA_OVERHEAD) as u32;
/// Default transmit queue of the TUN device (packets). The kernel's 500 for TUN drops bursts
/// once braid is CPU-bound: one TCP flow over one veth link, 8 s, 2-core VM: 500 -> ~1.5 Gbit/s
/// with 19201 retransmits; 1000 -> 1.27-1.35 Gbit/s, 1541-2683 retransmits; 2000 -> 1.39-1.54
/// Gbit/s, 0 retransmits. The queue only fills while braid is the bottleneck, where 2000
/// packets add at most ~16 ms.
pub const DEFAULT_TXQUEUELEN: u32 = 2000;
/// `batch_wait_us` when not set (chosen from scripts/bench-napi.sh, docs/guide.md).
pub const DEFAULT_BATCH_WAIT_US: u64 = 50;
/// Longest `batch_wait_us` accepted: beyond a millisecond the wait is latency, not batching.
pub const MAX_BATCH_WAIT_US: u64 = 1000;
/// Most threads `workers` accepts (the data plane's sealing, sending and opening; docs/guide.md).
pub const MAX_WORKERS: usize = 64;
/// Default time the client waits for a first session before it gives up.
pub const DEFAULT_CONNECT_TIMEOUT_S: u64 = 10;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRepr {
    bundle: Spanned<BundleRepr>,
    #[serde(default)]
    link: Vec<Spanned<LinkRepr>>,
    /// Server with per-client keys: the client it serves.
    #[serde(default)]
    client: Vec<Spanned<ClientRepr>>,
}

/// `[[client]]` of a server with per-client keys (docs/guide.md §12).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientRepr {
    name: Spanned<String>,
    public_key: Spanned<String>,
    /// The client's tunnel address(es), given to it in the handshake; from `address_pool` if
    /// left out.
    address: Option<Spanned<toml::Value>>,
    /// The networks behind the client (its site's LANs): routed to it.
    #[serde(default)]
    lan: Vec<Spanned<String>>,
    /// The other clients it may send to, by name ("*": all). Default: none.
    #[serde(default)]
    reach: Vec<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BundleRepr {
    name: Spanned<String>,
    role: Spanned<String>,
    key: Option<Spanned<String>>,
    key_file: Option<Spanned<String>>,
    /// This end's X25519 private key (per-client keys, docs/protocol.md §9.3).
    private_key: Option<Spanned<String>>,
    private_key_file: Option<Spanned<String>>,
    /// Client with a private key: the server's public key.
    server_public_key: Option<Spanned<String>>,
    /// Server with per-client keys: the prefix clients without an `address` get theirs from.
    address_pool: Option<Spanned<String>>,
    /// A string ("IP/PREFIX", or several separated by commas as in wg-quick) or an array of them.
    /// Optional for a client with a private key: then the server gives the addresses.
    address: Option<Spanned<toml::Value>>,
    mtu: Option<Spanned<u32>>,
    listen: Option<Spanned<String>>,
    scheduler: Option<Spanned<String>>,
    control: Option<Spanned<String>>,
    metrics: Option<Spanned<String>>,
    // Optional knobs beyond the contract.
    /// "chacha20-poly1305" (default) or "aes-256-gcm" ("aes256-gcm" is accepted too).
    cipher: Option<Spanned<String>>,
    /// Keepalive/probe period per link, milliseconds (default: the core's, 100 ms).
    probe_interval_ms: Option<Spanned<u64>>,
    /// A link is DOWN after this long without an answer, milliseconds (default: the core's).
    down_after_ms: Option<Spanned<u64>>,
    /// Upper bound of the reorder buffer's hold time, milliseconds.
    reorder_max_ms: Option<Spanned<u64>>,
    /// The most packets the reorder buffer's window grows to (default the core's, 65536).
    reorder_window_max: Option<Spanned<u64>>,
    /// Bound of delay equalisation, milliseconds (0: off; default the core's, 300).
    equalize_max_ms: Option<Spanned<u64>>,
    /// Inner header compression of the DATA this end sends (default on).
    compression: Option<bool>,
    /// ECN across the tunnel, RFC 6040 (default on).
    ecn: Option<bool>,
    /// Hold the packets behind a random loss until its copy comes (default off: passed on).
    hold_random_loss: Option<bool>,
    /// Leave the TUN device's packets waiting while every link is full (default the core's,
    /// off).
    backpressure: Option<bool>,
    /// Lower the receive window our hosts' TCP senders are told to what the bundle carries in
    /// two round trips (default on; only under back-pressure).
    clamp_window: Option<bool>,
    /// Transmit queue of the TUN device, packets (default 2000).
    txqueuelen: Option<Spanned<u32>>,
    /// Data plane: wait up to this many microseconds after a wake-up to fill a batch (NAPI's
    /// trade: latency for CPU at high packet rates); 0: process at once.
    batch_wait_us: Option<Spanned<u64>>,
    /// Threads that seal, send and open, the data-plane thread included (0: one per two cores the
    /// process may run on, 1 to 4; 1: all on the data-plane thread).
    workers: Option<Spanned<usize>>,
    /// Client: give up (exit non-zero) when no session comes up within this many seconds of
    /// start (0: keep trying forever). Default 10.
    connect_timeout: Option<Spanned<u64>>,
    /// Client: the route id its packets name (docs/protocol.md §9.2), 0..65535; random if unset.
    route_id: Option<Spanned<u64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LinkRepr {
    name: Spanned<String>,
    dev: Option<Spanned<String>>,
    bind: Option<Spanned<String>>,
    remote: Option<Spanned<String>>,
    bandwidth: Option<Spanned<u64>>,
    download_bandwidth: Option<Spanned<u64>>,
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
    /// `None` (`auto`, the default): AES-256-GCM where both ends run AES in hardware,
    /// ChaCha20-Poly1305 otherwise, negotiated in the handshake.
    pub cipher: Option<CipherId>,
    pub probe_interval: Option<Duration>,
    pub down_after: Option<Duration>,
    pub reorder_max: Option<Duration>,
    /// The largest reorder window, packets (`None`: the core's default).
    pub reorder_window_max: Option<usize>,
    /// Bound of delay equalisation (`Some(ZERO)`: off; `None`: the core's default).
    pub equalize_max: Option<Duration>,
    /// Compress the inner TCP/IP headers of what this end sends (docs/protocol.md §13).
    pub compression: bool,
    /// ECN across the tunnel (RFC 6040; `braid_core::endpoint::Config::ecn`).
    pub ecn: bool,
    /// What this end, receiving, does with the packets behind a random loss's gap
    /// (`braid_core::endpoint::Config::hold_random_loss`).
    pub hold_random_loss: bool,
    /// Back-pressure: while every link is full, packets wait in the bundle's queue instead of
    /// overfilling the links' buffers (`braid_core::Endpoint::set_backpressure`).
    pub backpressure: bool,
    /// Clamp the receive window our hosts' TCP senders are told (`braid_core::rwnd`;
    /// `braid_core::endpoint::Config::clamp_window`).
    pub clamp_window: bool,
    pub connect_timeout: Option<Duration>,
    /// Client: the route id a balancer steers this bundle's links by (`None`: random).
    pub route_id: Option<u16>,
    pub txqueuelen: u32,
    /// How long the data plane waits after a wake-up to fill a batch (docs/guide.md).
    pub batch_wait: Duration,
    /// Threads that seal, send and open (0: automatic; see [`crate::workers::Workers::new`]).
    pub workers: usize,
    pub links: Vec<LinkSpec>,
    /// Per-client keys (`private_key`): this end's key pair, and the peer it accepts.
    pub identity: Option<IdentityConfig>,
    /// Things that do not stop the endpoint but should be fixed (a key readable by others).
    pub warnings: Vec<String>,
}

/// Per-client keys (docs/protocol.md §9.3).
#[derive(Debug, Clone)]
pub struct IdentityConfig {
    pub own: braid_core::identity::KeyPair,
    /// Client: the server's public key.
    pub server: Option<[u8; 32]>,
    /// Server: its clients (a concentrator), with their addresses resolved (pool included).
    pub clients: Vec<braid_core::concentrator::ClientSpec>,
    /// Server: where clients added at run time without an address get theirs.
    pub address_pool: Option<ipnet::IpNet>,
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
    /// The link's rate towards us, told to the server (its first guess for sending on it).
    pub download_bps: Option<u64>,
    pub priority: u8,
}

pub use braid_config::ConfigError;

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
    braid_config::resolve_host_port(s, family_hint)
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
        let text = Source::read(path)?;
        Self::parse(path, &text)
    }

    /// Validates `text` (the contents of `path`, used in messages). Looks at the host too, read
    /// only: a `key_file` is read, a link's `dev` must exist, a remote host name is resolved.
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let src = Source::new(path, text);
        let file: FileRepr = src.deserialize()?;
        let mut cfg = validate_bundle(&src, &file.bundle)?;
        match cfg.role {
            Role::Client if file.link.is_empty() => {
                return Err(src.at(
                    &file.bundle,
                    "link",
                    "missing: a client needs at least one [[link]] (name, dev and/or bind, remote)",
                ))
            }
            Role::Client => {
                for (i, link) in file.link.iter().enumerate() {
                    let spec = validate_link(&src, i, link, &cfg.links)?;
                    cfg.links.push(spec);
                }
            }
            Role::Server if !file.link.is_empty() => cfg.warnings.push(format!(
                "{}: [[link]] tables are ignored by a server (it learns its links from the client)",
                path.display()
            )),
            Role::Server => {}
        }
        cfg.identity = validate_identity(&src, &file, cfg.role, &cfg.addresses)?;
        if cfg.addresses.is_empty() && cfg.identity.is_none() {
            return Err(src.at(
                &file.bundle,
                "bundle.address",
                "missing: give the tunnel address (\"IP/PREFIX\"); only a client with a private_key may leave it to the server",
            ));
        }
        if cfg.role == Role::Server && cfg.addresses.is_empty() {
            return Err(src.at(
                &file.bundle,
                "bundle.address",
                "missing: a server needs its tunnel address (\"IP/PREFIX\")",
            ));
        }
        Ok(cfg)
    }
}

/// `[bundle]`: everything but the links.
fn validate_bundle(src: &Source, bundle: &Spanned<BundleRepr>) -> Result<Config, ConfigError> {
    let b = bundle.get_ref();
    let name = src.value(&b.name, "bundle.name", |n| {
        if braid_linux::tun::valid_ifname(n) {
            Ok(n.clone())
        } else {
            Err(format!(
                "{n:?} is not a valid interface name (1 to 15 characters, no '/', ':' or spaces)"
            ))
        }
    })?;
    let role = src.value(&b.role, "bundle.role", |r| match r.as_str() {
        "client" => Ok(Role::Client),
        "server" => Ok(Role::Server),
        other => Err(format!("{other:?} is neither \"client\" nor \"server\"")),
    })?;
    let identity = b.private_key.is_some() || b.private_key_file.is_some();
    let (psk, warnings) = bundle_key(src, bundle, identity)?;
    let addresses = match &b.address {
        Some(a) => validate_address(src, a)?,
        None => Vec::new(),
    };
    let ipv6 = addresses.iter().find(|a| a.ip.is_ipv6());
    let mtu = src.optional(&b.mtu, "bundle.mtu", |&m| {
        let m = in_range(m, 576, 65535)?;
        if m > MAX_MTU {
            return Err(format!(
                "{m} is above {MAX_MTU}: a packet plus braid's {} bytes of overhead must fit in a {}-byte datagram",
                braid_core::wire::DATA_OVERHEAD,
                braid_linux::udp::MAX_DATAGRAM
            ));
        }
        match ipv6 {
            Some(v6) if m < 1280 => Err(format!(
                "{m} is below 1280, the least IPv6 allows, and address has {v6} (raise mtu or drop the IPv6 address)"
            )),
            _ => Ok(m),
        }
    })?;
    let listen = src.optional(&b.listen, "bundle.listen", |l| parse_socket_addr(l))?;
    if role == Role::Server && listen.is_none() {
        return Err(src.at(
            bundle,
            "bundle.listen",
            "missing: a server needs listen = \"ADDRESS:PORT\" (where its links arrive)",
        ));
    }
    let scheduler = src.optional(&b.scheduler, "bundle.scheduler", |s| {
        let names = braid_core::sched::NAMES;
        if names.contains(&s.as_str()) {
            Ok(s.clone())
        } else {
            Err(format!(
                "unknown scheduler {s:?} (expected one of: {})",
                names.join(", ")
            ))
        }
    })?;
    let control = src.optional(&b.control, "bundle.control", |c| match c.as_str() {
        "" => Err("empty path".to_string()),
        c => Ok(PathBuf::from(c)),
    })?;
    let metrics = src.optional(&b.metrics, "bundle.metrics", |m| parse_socket_addr(m))?;
    let cipher = src.optional(&b.cipher, "bundle.cipher", |c| match c.as_str() {
        "auto" => Ok(None),
        c => CipherId::from_name(c).map(Some).ok_or_else(|| {
            format!("unknown cipher {c:?} (expected auto, chacha20-poly1305 or aes-256-gcm)")
        }),
    })?;
    let ms = |v: &Option<Spanned<u64>>, key: &str, lo: u64, hi: u64| {
        src.optional(v, key, |&x| in_range(x, lo, hi).map(Duration::from_millis))
    };
    let connect_timeout =
        match src.optional(&b.connect_timeout, "bundle.connect_timeout", |&s| Ok(s))? {
            Some(0) => None,
            Some(s) => Some(Duration::from_secs(s)),
            None => Some(Duration::from_secs(DEFAULT_CONNECT_TIMEOUT_S)),
        };
    Ok(Config {
        path: src.path().to_path_buf(),
        control: control.unwrap_or_else(|| braid_linux::control::default_path(&name)),
        name,
        role,
        psk,
        addresses,
        mtu: mtu.unwrap_or(DEFAULT_MTU),
        listen,
        scheduler: scheduler.unwrap_or_else(|| "adaptive".to_string()),
        metrics,
        cipher: cipher.flatten(),
        probe_interval: ms(&b.probe_interval_ms, "bundle.probe_interval_ms", 1, 600_000)?,
        down_after: ms(&b.down_after_ms, "bundle.down_after_ms", 1, 600_000)?,
        reorder_max: ms(&b.reorder_max_ms, "bundle.reorder_max_ms", 1, 600_000)?,
        reorder_window_max: src
            .optional(&b.reorder_window_max, "bundle.reorder_window_max", |&w| {
                in_range(w, 64, braid_core::reorder::MAX_CAPACITY as u64)
            })?
            .map(|w| w as usize),
        equalize_max: ms(&b.equalize_max_ms, "bundle.equalize_max_ms", 0, 1000)?,
        compression: b.compression.unwrap_or(true),
        ecn: b.ecn.unwrap_or(true),
        hold_random_loss: b.hold_random_loss.unwrap_or(false),
        backpressure: b
            .backpressure
            .unwrap_or(braid_core::endpoint::DEFAULT_BACKPRESSURE),
        clamp_window: b.clamp_window.unwrap_or(true),
        connect_timeout,
        route_id: src
            .optional(&b.route_id, "bundle.route_id", |&r| in_range(r, 0, 65_535))?
            .map(|r| r as u16),
        txqueuelen: src
            .optional(&b.txqueuelen, "bundle.txqueuelen", |&q| {
                in_range(q, 1, 100_000)
            })?
            .unwrap_or(DEFAULT_TXQUEUELEN),
        batch_wait: src
            .optional(&b.batch_wait_us, "bundle.batch_wait_us", |&w| {
                in_range(w, 0, MAX_BATCH_WAIT_US).map(Duration::from_micros)
            })?
            .unwrap_or(Duration::from_micros(DEFAULT_BATCH_WAIT_US)),
        workers: src
            .optional(&b.workers, "bundle.workers", |&w| {
                in_range(w, 0, MAX_WORKERS)
            })?
            .unwrap_or(0),
        links: Vec::new(),
        identity: None,
        warnings,
    })
}

/// Reads a 32-byte base64 key given inline (`key`) or in a file (`key_file`), naming the keys
/// in errors; a file readable by others is a warning. `None` when neither is given.
fn secret_key(
    src: &Source,
    inline: &Option<Spanned<String>>,
    file: &Option<Spanned<String>>,
    names: (&str, &str),
    warnings: &mut Vec<String>,
) -> Result<Option<[u8; 32]>, ConfigError> {
    match (inline, file) {
        (Some(_), Some(f)) => Err(src.at(
            f,
            names.1,
            format!("give either {} or {}, not both", names.0, names.1),
        )),
        (Some(k), None) => Ok(Some(src.value(k, names.0, |k| decode_key(k))?)),
        (None, Some(f)) => {
            let kp = src.relative_path(f.get_ref());
            let key = src.value(f, names.1, |_| {
                let text = std::fs::read_to_string(&kp)
                    .map_err(|e| format!("cannot read {}: {e}", kp.display()))?;
                decode_key(&text).map_err(|m| format!("{}: {m}", kp.display()))
            })?;
            warnings.extend(secret_file_warning(&kp));
            Ok(Some(key))
        }
        (None, None) => Ok(None),
    }
}

/// A public key: base64 of 32 bytes, not of low order (X25519 with it must not give zeros).
pub fn public_key(text: &str) -> Result<[u8; 32], String> {
    let k = decode_key(text).map_err(|m| m.replace("`braid keygen`", "`braid pubkey`"))?;
    let probe = braid_core::identity::KeyPair::from_private([7; 32]);
    probe
        .dh(&k)
        .map(|_| k)
        .ok_or_else(|| "not a usable X25519 public key (low order)".to_string())
}

/// Per-client keys: `private_key` (or `_file`), then on a client `server_public_key`, on a
/// server its `[[client]]` tables.
fn validate_identity(
    src: &Source,
    file: &FileRepr,
    role: Role,
    own_addresses: &[TunAddress],
) -> Result<Option<IdentityConfig>, ConfigError> {
    let b = file.bundle.get_ref();
    let mut warnings = Vec::new();
    let private = secret_key(
        src,
        &b.private_key,
        &b.private_key_file,
        ("bundle.private_key", "bundle.private_key_file"),
        &mut warnings,
    )?;
    let Some(private) = private else {
        return no_identity(src, file).map(|()| None);
    };
    let own = braid_core::identity::KeyPair::from_private(private);
    match role {
        Role::Client => {
            let Some(k) = &b.server_public_key else {
                return Err(src.at(
                    &file.bundle,
                    "bundle.server_public_key",
                    "missing: a client with a private_key needs the server's public key (`braid pubkey` of the server's private key)",
                ));
            };
            let peer = src.value(k, "bundle.server_public_key", |k| public_key(k))?;
            Ok(Some(IdentityConfig {
                own,
                server: Some(peer),
                clients: Vec::new(),
                address_pool: None,
            }))
        }
        Role::Server => {
            let (clients, pool) = validate_clients(src, file, &own, own_addresses)?;
            Ok(Some(IdentityConfig {
                own,
                server: None,
                clients,
                address_pool: pool,
            }))
        }
    }
}

/// Without a private key: nothing of the identity handshake may be configured.
fn no_identity(src: &Source, file: &FileRepr) -> Result<(), ConfigError> {
    let b = file.bundle.get_ref();
    if let Some(k) = &b.server_public_key {
        return Err(src.at(
            k,
            "bundle.server_public_key",
            "needs this end's private_key (make one with `braid keygen`)",
        ));
    }
    if let Some(c) = file.client.first() {
        return Err(src.at(
            c,
            "client",
            "[[client]] needs the server's private_key in [bundle] (make one with `braid keygen`)",
        ));
    }
    if let Some(p) = &b.address_pool {
        return Err(src.at(
            p,
            "bundle.address_pool",
            "needs the server's private_key and [[client]] tables",
        ));
    }
    Ok(())
}

/// A server's `[[client]]` tables (and `bundle.address_pool`): each client's name, key,
/// addresses (given, or taken from the pool) and LANs; then what concerns them together (reach
/// lists name clients, no prefix routed to two clients). Returns the clients and the pool's
/// prefix.
fn validate_clients(
    src: &Source,
    file: &FileRepr,
    own: &braid_core::identity::KeyPair,
    own_addresses: &[TunAddress],
) -> Result<
    (
        Vec<braid_core::concentrator::ClientSpec>,
        Option<ipnet::IpNet>,
    ),
    ConfigError,
> {
    let b = file.bundle.get_ref();
    if file.client.is_empty() {
        return Err(src.at(
            &file.bundle,
            "client",
            "missing: a server with a private_key needs a [[client]] (name, public_key, address) for each client",
        ));
    }
    let mut pool = match &b.address_pool {
        Some(p) => Some(src.value(p, "bundle.address_pool", |t| {
            let net: ipnet::IpNet = t
                .parse()
                .map_err(|_| format!("{t:?} is not a prefix (\"198.19.0.0/24\")"))?;
            Ok(braid_core::routes::AddressPool::new(
                net.trunc(),
                own_addresses.iter().map(|a| a.ip),
            ))
        })?),
        None => None,
    };
    let fixed = fixed_client_addresses(src, file, pool.as_mut())?;
    let mut clients: Vec<braid_core::concentrator::ClientSpec> = Vec::new();
    for (c, addrs) in file.client.iter().zip(fixed) {
        let spec = validate_client(src, c, addrs, own, &clients, pool.as_mut())?;
        clients.push(spec);
    }
    check_client_routes(src, file, &clients)?;
    Ok((clients, pool.map(|p| p.prefix())))
}

/// Each client's `address` as given, claimed from the pool when within it (fixed addresses
/// first, so that the pool never hands one of them out).
fn fixed_client_addresses(
    src: &Source,
    file: &FileRepr,
    mut pool: Option<&mut braid_core::routes::AddressPool>,
) -> Result<Vec<Vec<TunAddress>>, ConfigError> {
    let mut fixed = Vec::new();
    for c in &file.client {
        let r = c.get_ref();
        let addrs = match &r.address {
            Some(a) => src.value(a, "client.address", parse_addresses)?,
            None => Vec::new(),
        };
        if let Some(pool) = pool.as_deref_mut() {
            for a in &addrs {
                if pool.prefix().contains(&a.ip) && pool.claim(a.ip).is_err() {
                    return Err(src.at(
                        r.address.as_ref().expect("addresses came from it"),
                        "client.address",
                        format!("{} is given twice (or is the server's own)", a.ip),
                    ));
                }
            }
        }
        fixed.push(addrs);
    }
    Ok(fixed)
}

/// One `[[client]]`: its name and key (each unlike the others' so far, `clients`, and the key
/// unlike the server's own), its addresses (`addrs`, given; else one from the pool) and LANs.
fn validate_client(
    src: &Source,
    c: &Spanned<ClientRepr>,
    mut addrs: Vec<TunAddress>,
    own: &braid_core::identity::KeyPair,
    clients: &[braid_core::concentrator::ClientSpec],
    pool: Option<&mut braid_core::routes::AddressPool>,
) -> Result<braid_core::concentrator::ClientSpec, ConfigError> {
    let r = c.get_ref();
    let name = src.value(&r.name, "client.name", |n| {
        if n.is_empty() || n.len() > 32 || n.contains(|ch: char| ch.is_whitespace() || ch == '/') {
            Err(format!("{n:?}: 1 to 32 characters, no spaces or '/'"))
        } else if clients.iter().any(|c| &c.name == n) {
            Err(format!("{n:?} is the name of another [[client]]"))
        } else {
            Ok(n.clone())
        }
    })?;
    let key = src.value(&r.public_key, "client.public_key", |k| {
        let k = public_key(k)?;
        if k == own.public() {
            return Err("is the server's own public key: give the client's (`braid pubkey` of the client's private key)".to_string());
        }
        match clients.iter().find(|c| c.public_key == k) {
            Some(o) => Err(format!("is also client {:?}'s key: each client needs its own", o.name)),
            None => Ok(k),
        }
    })?;
    if addrs.is_empty() {
        let Some(pool) = pool else {
            return Err(src.at(
                c,
                "client.address",
                format!("missing: client {name:?} needs an address, or [bundle] an address_pool to take one from"),
            ));
        };
        let ip = pool
            .allocate()
            .map_err(|e| src.at(c, "client.address", e.to_string()))?;
        addrs.push(TunAddress {
            ip,
            prefix: pool.prefix().prefix_len(),
        });
    }
    let mut lans = Vec::new();
    for l in &r.lan {
        lans.push(src.value(l, "client.lan", |t| {
            t.parse::<ipnet::IpNet>()
                .map(|n| n.trunc())
                .map_err(|_| format!("{t:?} is not a prefix (\"198.18.10.0/24\")"))
        })?);
    }
    let v4 = addrs.iter().find_map(|a| match a.ip {
        IpAddr::V4(ip) => Some((ip, a.prefix)),
        _ => None,
    });
    let v6 = addrs.iter().find_map(|a| match a.ip {
        IpAddr::V6(ip) => Some((ip, a.prefix)),
        _ => None,
    });
    Ok(braid_core::concentrator::ClientSpec {
        name,
        public_key: key,
        v4,
        v6,
        lans,
        reach: r.reach.iter().map(|x| x.get_ref().clone()).collect(),
    })
}

/// What the clients' routes must satisfy together: every name in a reach list is a client (or
/// "*"), and no prefix is routed to two clients.
fn check_client_routes(
    src: &Source,
    file: &FileRepr,
    clients: &[braid_core::concentrator::ClientSpec],
) -> Result<(), ConfigError> {
    for (c, spec) in file.client.iter().zip(clients) {
        for (x, name) in c.get_ref().reach.iter().zip(&spec.reach) {
            if name != "*" && !clients.iter().any(|o| &o.name == name) {
                return Err(src.at(
                    x,
                    "client.reach",
                    format!("no [[client]] is named {name:?}"),
                ));
            }
        }
    }
    let mut seen: Vec<(ipnet::IpNet, &str)> = Vec::new();
    for (c, spec) in file.client.iter().zip(clients) {
        for p in spec.prefixes() {
            if let Some((_, other)) = seen.iter().find(|(q, _)| *q == p) {
                return Err(src.at(c, "client.lan", format!("{p} is also client {other:?}'s")));
            }
            seen.push((p, &spec.name));
        }
    }
    Ok(())
}

/// `bundle.address`: one "IP/PREFIX", several separated by commas, or an array of them (see
/// `parse_addresses`); every error points at the value.
fn validate_address(
    src: &Source,
    address: &Spanned<toml::Value>,
) -> Result<Vec<TunAddress>, ConfigError> {
    src.value(address, "bundle.address", parse_addresses)
}

/// `key` or `key_file`: the pre-shared key, and a warning (as `wg` gives) when the key file is
/// readable by group or others.
fn bundle_key(
    src: &Source,
    bundle: &Spanned<BundleRepr>,
    identity: bool,
) -> Result<([u8; 32], Vec<String>), ConfigError> {
    let b = bundle.get_ref();
    let (psk, key_file) = match (&b.key, &b.key_file) {
        // Per-client keys: a PSK is optional (mixed into the handshake when given).
        (None, None) if identity => return Ok(([0; 32], Vec::new())),
        (Some(_), Some(f)) => {
            return Err(src.at(
                f,
                "bundle.key_file",
                "give either key or key_file, not both",
            ))
        }
        (Some(k), None) => (src.value(k, "bundle.key", |k| decode_key(k))?, None),
        (None, Some(f)) => {
            let kp = src.relative_path(f.get_ref());
            let psk = src.value(f, "bundle.key_file", |_| {
                let text = std::fs::read_to_string(&kp)
                    .map_err(|e| format!("cannot read {}: {e}", kp.display()))?;
                decode_key(&text).map_err(|m| format!("{}: {m}", kp.display()))
            })?;
            (psk, Some(kp))
        }
        (None, None) => return Err(src.at(
            bundle,
            "bundle.key",
            "missing: give key = \"...\" or key_file = \"...\" (make a key with `braid keygen`)",
        )),
    };
    let warning = key_file.and_then(|f| secret_file_warning(&f));
    Ok((psk, warning.into_iter().collect()))
}

/// `wg`'s "Warning: `/etc/braid/key' is world accessible", for group too.
fn secret_file_warning(path: &Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
    (mode & 0o077 != 0).then(|| {
        format!(
            "`{}` holds the tunnel key and is accessible by group or others (mode {mode:03o}): chmod 600 it",
            path.display()
        )
    })
}

/// One `[[link]]` of a client (the `i`th, 0-based, as in its key path `link[i]`).
fn validate_link(
    src: &Source,
    i: usize,
    link: &Spanned<LinkRepr>,
    earlier: &[LinkSpec],
) -> Result<LinkSpec, ConfigError> {
    let l = link.get_ref();
    let key = |k: &str| format!("link[{i}].{k}");
    let name = src.value(&l.name, &key("name"), |n| {
        if n.is_empty() || n.len() > 32 || n.contains(char::is_whitespace) {
            Err(format!("{n:?}: use 1 to 32 characters, no spaces"))
        } else if earlier.iter().any(|x| &x.name == n) {
            Err(format!("{n:?} is used by an earlier link"))
        } else {
            Ok(n.clone())
        }
    })?;
    if l.dev.is_none() && l.bind.is_none() {
        return Err(src.at(
            link,
            &key("dev"),
            format!("missing: link {name} needs dev = \"IFACE\" and/or bind = \"ADDRESS\""),
        ));
    }
    let dev = src.optional(&l.dev, &key("dev"), |d| {
        if !braid_linux::tun::valid_ifname(d) {
            Err(format!("link {name}: {d:?} is not a valid interface name"))
        } else if !braid_linux::netlink::interface_exists(d) {
            Err(format!(
                "link {name}: interface {d} does not exist on this host"
            ))
        } else {
            Ok(d.clone())
        }
    })?;
    let bind = src.optional(&l.bind, &key("bind"), |b| {
        parse_bind(b).map_err(|m| format!("link {name}: {m}"))
    })?;
    let Some(remote_v) = &l.remote else {
        return Err(src.at(
            link,
            &key("remote"),
            format!("missing: link {name} needs remote = \"HOST:PORT\" (the server's address over this uplink)"),
        ));
    };
    let remote = src.value(remote_v, &key("remote"), |r| {
        let remote =
            resolve_remote(r, bind.map(|b| b.ip())).map_err(|m| format!("link {name}: {m}"))?;
        match bind {
            Some(b) if b.is_ipv4() != remote.is_ipv4() && !b.ip().is_unspecified() => Err(format!(
                "link {name}: {remote} and bind {} are of different IP families",
                b.ip()
            )),
            _ => Ok(remote),
        }
    })?;
    let bandwidth_bps = src.optional(&l.bandwidth, &key("bandwidth"), |&b| match b {
        0 => Err(format!("link {name}: must be > 0 bit/s (or left out)")),
        b => Ok(b),
    })?;
    let download_bps = src.optional(&l.download_bandwidth, &key("download_bandwidth"), |&b| {
        check_download_bandwidth(b).map_err(|m| format!("link {name}: {m}"))
    })?;
    Ok(LinkSpec {
        id: (i + 1) as LinkId,
        name,
        dev,
        bind,
        remote_text: remote_v.get_ref().clone(),
        remote,
        bandwidth_bps,
        download_bps,
        priority: l.priority.as_ref().map_or(0, |p| *p.get_ref()),
    })
}

/// A download bandwidth hint goes to the server on the wire, where more than
/// [`braid_core::endpoint::MAX_RATE_HINT_BPS`] is ignored: refuse it here instead.
pub fn check_download_bandwidth(b: u64) -> Result<u64, String> {
    match b {
        0 => Err("must be > 0 bit/s (or left out)".into()),
        b if b > braid_core::endpoint::MAX_RATE_HINT_BPS => Err(format!(
            "{b} bit/s is more than the largest hint, {} (1 Tbit/s)",
            braid_core::endpoint::MAX_RATE_HINT_BPS
        )),
        b => Ok(b),
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
    const LINKS: &str = "[[link]]\nname = \"isp1\"\ndev = \"lo\"\nremote = \"198.18.1.2:5050\"\nbandwidth = 28800\ndownload_bandwidth = 56000\n\n[[link]]\nname = \"isp2\"\nbind = \"198.18.2.1\"\nremote = \"198.18.2.2:5050\"\npriority = 1\n";

    fn parse(t: &str) -> Result<Config, String> {
        Config::parse(Path::new("/etc/braid/t.toml"), t).map_err(|e| e.to_string())
    }

    /// Per-client keys: what each end needs, each mistake named with its key.
    #[test]
    fn per_client_keys() {
        let pubkey = "hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo=";
        let server = |clients: &str| {
            format!(
                "[bundle]\nname = \"braid0\"\nrole = \"server\"\nprivate_key = \"{KEY}\"\naddress = \"198.19.0.1/30\"\nlisten = \"0.0.0.0:5050\"\n{clients}"
            )
        };
        let one = format!(
            "[[client]]\nname = \"a\"\npublic_key = \"{pubkey}\"\naddress = \"198.19.0.2/30\"\n"
        );
        let c = parse(&server(&one)).unwrap();
        let id = c.identity.expect("identity");
        assert_eq!(id.clients.len(), 1);
        assert_eq!(id.clients[0].name, "a");
        assert_eq!(id.clients[0].v4, Some(("198.19.0.2".parse().unwrap(), 30)));
        assert_eq!(c.psk, [0; 32], "no PSK needed");
        let e = parse(&server("")).unwrap_err();
        assert!(e.contains("needs a [[client]]"), "{e}");
        let e = parse(&server(&format!("{one}{}", one.replace("\"a\"", "\"b\"")))).unwrap_err();
        assert!(e.contains("also client \"a\"'s key"), "{e}");
        let e = parse(&server(&one.replace(pubkey, "AAAA"))).unwrap_err();
        assert!(e.contains("client.public_key"), "{e}");
        // A low-order point is no key.
        let zero = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
        let e = parse(&server(&one.replace(pubkey, zero))).unwrap_err();
        assert!(e.contains("low order"), "{e}");

        // A concentrator: the pool gives addresses in order, skipping the fixed ones and the
        // server's; LANs, reach lists and keys are checked across clients.
        let other = "OyABeVObZCBYOB4IYbWUUjBsYXMAEmN+JVeTBFPIcA0=";
        let third = "aXvM0XmxWkMFzbiqmCVYypLfX5KQuCenFwLiXMTVVBc=";
        let pooled = |extra_a: &str, extra_b: &str| {
            format!(
                "[bundle]\nname = \"braid0\"\nrole = \"server\"\nprivate_key = \"{KEY}\"\naddress = \"198.19.0.1/24\"\naddress_pool = \"198.19.0.0/24\"\nlisten = \"0.0.0.0:5050\"\n\n[[client]]\nname = \"a\"\npublic_key = \"{pubkey}\"\nlan = [\"198.18.10.0/24\"]\n{extra_a}\n\n[[client]]\nname = \"b\"\npublic_key = \"{other}\"\naddress = \"198.19.0.2/24\"\n{extra_b}\n\n[[client]]\nname = \"c\"\npublic_key = \"{third}\"\n"
            )
        };
        let c = parse(&pooled("reach = [\"b\"]", "")).unwrap();
        let cl = &c.identity.unwrap().clients;
        assert_eq!(
            cl[0].v4,
            Some(("198.19.0.3".parse().unwrap(), 24)),
            "the pool skips .1 and .2"
        );
        assert_eq!(cl[1].v4, Some(("198.19.0.2".parse().unwrap(), 24)));
        assert_eq!(cl[2].v4, Some(("198.19.0.4".parse().unwrap(), 24)));
        assert_eq!(
            cl[0].lans,
            vec!["198.18.10.0/24".parse::<ipnet::IpNet>().unwrap()]
        );
        let e = parse(&pooled("reach = [\"z\"]", "")).unwrap_err();
        assert!(e.contains("no [[client]] is named \"z\""), "{e}");
        let e = parse(&pooled("", "lan = [\"198.18.10.0/24\"]")).unwrap_err();
        assert!(e.contains("198.18.10.0/24 is also client \"a\"'s"), "{e}");
        let e =
            parse(&pooled("", "").replace("address_pool = \"198.19.0.0/24\"\n", "")).unwrap_err();
        assert!(
            e.contains("needs an address, or [bundle] an address_pool"),
            "{e}"
        );

        let client = |extra: &str| {
            format!("[bundle]\nname = \"braid0\"\nrole = \"client\"\nprivate_key = \"{KEY}\"\n{extra}\n{LINKS}")
        };
        let c = parse(&client(&format!("server_public_key = \"{pubkey}\""))).unwrap();
        assert!(
            c.addresses.is_empty(),
            "the address may come from the server"
        );
        assert!(c.identity.is_some());
        let e = parse(&client("")).unwrap_err();
        assert!(e.contains("server_public_key"), "{e}");
        // Without a private key: the address and the key stay required.
        let e = parse(&format!(
            "[bundle]\nname = \"braid0\"\nrole = \"client\"\nkey = \"{KEY}\"\n{LINKS}"
        ))
        .unwrap_err();
        assert!(e.contains("bundle.address"), "{e}");
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
        assert_eq!(c.links[0].dev.as_deref(), Some("lo"));
        assert_eq!(c.links[0].bandwidth_bps, Some(28800));
        assert_eq!(c.links[0].download_bps, Some(56000));
        assert_eq!(c.links[1].download_bps, None);
        assert_eq!(c.links[1].bind, Some("198.18.2.1:0".parse().unwrap()));
        assert_eq!(c.links[1].priority, 1);
        assert_eq!(c.connect_timeout, Some(Duration::from_secs(10)));
    }

    #[test]
    fn equalisation_bound() {
        let c = parse(&client("", LINKS)).unwrap();
        assert_eq!(c.equalize_max, None, "the core's default");
        assert!(c.compression, "on by default");
        assert!(c.ecn, "on by default");
        assert!(!parse(&client("ecn = false", LINKS)).unwrap().ecn);
        assert!(parse(&client("ecn = 1", LINKS)).is_err());
        assert!(!c.hold_random_loss, "passed on by default");
        assert!(
            parse(&client("hold_random_loss = true", LINKS))
                .unwrap()
                .hold_random_loss
        );
        assert!(parse(&client("hold_random_loss = \"yes\"", LINKS)).is_err());
        assert!(
            !parse(&client("compression = false", LINKS))
                .unwrap()
                .compression
        );
        assert!(parse(&client("compression = \"no\"", LINKS)).is_err());
        assert!(
            parse(&client("", LINKS)).unwrap().backpressure,
            "on by default"
        );
        assert!(
            !parse(&client("backpressure = false", LINKS))
                .unwrap()
                .backpressure
        );
        let e = parse(&client("backpressure = 1", LINKS)).unwrap_err();
        assert!(e.contains("bundle.backpressure"), "{e}");
        assert!(
            parse(&client("", LINKS)).unwrap().clamp_window,
            "on by default"
        );
        assert!(
            !parse(&client("clamp_window = false", LINKS))
                .unwrap()
                .clamp_window
        );
        let e = parse(&client("clamp_window = \"yes\"", LINKS)).unwrap_err();
        assert!(e.contains("clamp_window"), "{e}");
        assert_eq!(parse(&client("", LINKS)).unwrap().route_id, None, "random");
        assert_eq!(
            parse(&client("route_id = 4660", LINKS)).unwrap().route_id,
            Some(0x1234)
        );
        let e = parse(&client("route_id = 65536", LINKS)).unwrap_err();
        assert!(
            e.contains("bundle.route_id: 65536 is out of range 0..65535"),
            "{e}"
        );
        let c = parse(&client("equalize_max_ms = 0", LINKS)).unwrap();
        assert_eq!(c.equalize_max, Some(Duration::ZERO), "off");
        let c = parse(&client("equalize_max_ms = 250", LINKS)).unwrap();
        assert_eq!(c.equalize_max, Some(Duration::from_millis(250)));
        let e = parse(&client("equalize_max_ms = 5000", LINKS)).unwrap_err();
        assert!(
            e.starts_with(
                "/etc/braid/t.toml:7:19: bundle.equalize_max_ms: 5000 is out of range 0..1000"
            ),
            "{e}"
        );
    }

    #[test]
    fn workers_are_automatic_by_default_and_bounded() {
        assert_eq!(parse(&client("", LINKS)).unwrap().workers, 0);
        assert_eq!(parse(&client("workers = 1", LINKS)).unwrap().workers, 1);
        let e = parse(&client("workers = 65", LINKS)).unwrap_err();
        assert!(
            e.contains("bundle.workers: 65 is out of range 0..64"),
            "{e}"
        );
        assert!(parse(&client("workers = -1", LINKS)).is_err());
    }

    #[test]
    fn batch_wait_is_microseconds_and_bounded() {
        let c = parse(&client("", LINKS)).unwrap();
        assert_eq!(c.batch_wait, Duration::from_micros(DEFAULT_BATCH_WAIT_US));
        let c = parse(&client("batch_wait_us = 50", LINKS)).unwrap();
        assert_eq!(c.batch_wait, Duration::from_micros(50));
        let c = parse(&client("batch_wait_us = 0", LINKS)).unwrap();
        assert_eq!(c.batch_wait, Duration::ZERO);
        let e = parse(&client("batch_wait_us = 5000", LINKS)).unwrap_err();
        assert!(
            e.contains("bundle.batch_wait_us: 5000 is out of range 0..1000"),
            "{e}"
        );
        assert!(parse(&client("batch_wait_us = \"50us\"", LINKS)).is_err());
    }

    #[test]
    fn reorder_window_max_is_packets_and_bounded() {
        assert_eq!(parse(&client("", LINKS)).unwrap().reorder_window_max, None);
        let c = parse(&client("reorder_window_max = 262144", LINKS)).unwrap();
        assert_eq!(c.reorder_window_max, Some(262_144));
        for bad in ["reorder_window_max = 10", "reorder_window_max = 2000000"] {
            let e = parse(&client(bad, LINKS)).unwrap_err();
            assert!(
                e.contains("bundle.reorder_window_max") && e.contains("out of range 64..1048576"),
                "{e}"
            );
        }
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
                e.starts_with("/etc/braid/t.toml:5:11: bundle.address: ") && e.contains(want),
                "{form}: want {want:?} in {e:?}"
            );
            assert!(!e.contains('\n'), "{e}");
        }
    }

    /// A full 1500 bytes inside the tunnel on 1500-byte uplinks is allowed (packets that do not
    /// fit a link's path are cut into pieces), as is a jumbo MTU up to [`MAX_MTU`].
    #[test]
    fn mtu_1500_inside_is_accepted() {
        for m in [1500, 1466, MAX_MTU] {
            let c = parse(&client("", LINKS).replace("mtu = 1400", &format!("mtu = {m}"))).unwrap();
            assert_eq!(c.mtu, m);
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
            e.starts_with("/etc/braid/t.toml:6:7: bundle.mtu: 1200 is below 1280")
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
        assert!(e.contains("prio") && e.contains(":19:"), "{e}");
    }

    #[test]
    fn each_error_says_what_and_where() {
        let no_key = |t: String| t.replace(&format!("key = \"{KEY}\"\n"), "");
        // (file, "LINE:COL: KEY: start of the message")
        let cases: &[(String, &str)] = &[
            (client("", LINKS).replace(KEY, "bm90IGEga2V5"), "4:7: bundle.key: key is 9 bytes"),
            (client("", LINKS).replace(KEY, "!!!"), "4:7: bundle.key: key is not base64"),
            (
                client("", LINKS).replace("198.19.0.2/30", "198.19.0.2"),
                "5:11: bundle.address: \"198.19.0.2\" is not ADDRESS/PREFIX",
            ),
            (
                client("", LINKS).replace("198.19.0.2/30", "198.19.0.2/33"),
                "5:11: bundle.address: \"33\" is not a prefix length",
            ),
            (
                client("scheduler = \"fastest\"", LINKS),
                "7:13: bundle.scheduler: unknown scheduler \"fastest\"",
            ),
            (client("cipher = \"rot13\"", LINKS), "7:10: bundle.cipher: unknown cipher"),
            (client("", ""), "1:1: link: missing: a client needs at least one [[link]]"),
            (
                client("", &LINKS.replace("isp2", "isp1")),
                "16:8: link[1].name: \"isp1\" is used by an earlier link",
            ),
            (
                client("", &LINKS.replace("bind = \"198.18.2.1\"\n", "")),
                "15:1: link[1].dev: missing: link isp2 needs dev",
            ),
            (
                client("", &LINKS.replace("dev = \"lo\"", "dev = \"nosuchdev9\"")),
                "10:7: link[0].dev: link isp1: interface nosuchdev9 does not exist",
            ),
            (
                client("", &LINKS.replace("remote = \"198.18.1.2:5050\"\n", "")),
                "8:1: link[0].remote: missing: link isp1 needs remote",
            ),
            (
                client("", &LINKS.replace("198.18.2.2:5050", "nowhere")),
                "18:10: link[1].remote: link isp2: \"nowhere\" is not HOST:PORT",
            ),
            (
                client("", &LINKS.replace("198.18.2.2:5050", "[fd00::2]:5050")),
                "link[1].remote: link isp2: [fd00::2]:5050 and bind 198.18.2.1 are of different IP families",
            ),
            (
                client("", &LINKS.replace("bandwidth = 28800", "bandwidth = 0")),
                "12:13: link[0].bandwidth: link isp1: must be > 0",
            ),
            (
                client("", &LINKS.replace("bandwidth = 28800", "bandwidth = \"big\"")),
                "12:13: link[0].bandwidth: invalid type: string \"big\", expected u64",
            ),
            (
                client("", &LINKS.replace("download_bandwidth = 56000", "download_bandwidth = 0")),
                "13:22: link[0].download_bandwidth: link isp1: must be > 0",
            ),
            (
                client(
                    "",
                    &LINKS.replace("download_bandwidth = 56000", "download_bandwidth = 2000000000000"),
                ),
                "13:22: link[0].download_bandwidth: link isp1: 2000000000000 bit/s is more than the largest hint",
            ),
            (
                client("", &LINKS.replace("priority", "priorty")),
                "19:1: link[1].priorty: unknown key, did you mean `priority`?",
            ),
            (
                client("", LINKS).replace("role = \"client\"", "role = \"boss\""),
                "3:8: bundle.role: \"boss\" is neither \"client\" nor \"server\"",
            ),
            (
                client("", LINKS).replace("name = \"braid0\"", "name = \"a/b\""),
                "2:8: bundle.name: \"a/b\" is not a valid interface name",
            ),
            (
                client("", LINKS).replace("mtu = 1400", "mtu = 10"),
                "6:7: bundle.mtu: 10 is out of range 576..65535",
            ),
            (
                client("", LINKS).replace("mtu = 1400", "mtu = 9187"),
                "6:7: bundle.mtu: 9187 is above 9186: a packet plus braid's 30 bytes of overhead must fit in a 9216-byte datagram",
            ),
            (
                client("", LINKS).replace("mtu = 1400", "mtu = \"big\""),
                "6:7: bundle.mtu: invalid type: string \"big\", expected u32",
            ),
            (
                client("probe_interval_ms = 0", LINKS),
                "7:21: bundle.probe_interval_ms: 0 is out of range 1..600000",
            ),
            (
                no_key(client("key_file = \"/nonexistent/k\"", LINKS)),
                "6:12: bundle.key_file: cannot read /nonexistent/k",
            ),
            (
                client("key_file = \"/nonexistent/k\"", LINKS),
                "7:12: bundle.key_file: give either key or key_file, not both",
            ),
            (no_key(client("", LINKS)), "1:1: bundle.key: missing: give key"),
            (
                client("", LINKS).replace("role = \"client\"", "role = \"server\""),
                "1:1: bundle.listen: missing: a server needs listen",
            ),
            (
                client("", LINKS).replace("role = ", "rol = "),
                "3:1: bundle.rol: unknown key, did you mean `role`?",
            ),
            (
                client("", LINKS).replace("role = \"client\"\n", ""),
                "1:1: bundle.role: missing",
            ),
            (
                client("", LINKS).replace("[bundle]", "[bundel]"),
                "1:2: bundel: unknown key, did you mean `bundle`?",
            ),
            (client("", LINKS).replace("mtu = 1400", "mtu = 1400 1400"), "6:12: "),
        ];
        for (t, want) in cases {
            let e = parse(t).unwrap_err();
            let want = format!("/etc/braid/t.toml:{want}");
            if !want.ends_with("IP families") {
                assert!(e.starts_with(&want), "want {want:?}, got {e:?}");
            } else {
                assert!(
                    e.contains(want.trim_start_matches("/etc/braid/t.toml:")),
                    "{e}"
                );
            }
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn warnings_and_cipher_names() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key");
        std::fs::write(&key, KEY).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let t = client("key_file = \"key\"", LINKS).replace(&format!("key = \"{KEY}\"\n"), "");
        let cfg_path = dir.path().join("c.toml");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let c = Config::parse(&cfg_path, &t).unwrap();
        assert_eq!(
            c.psk[31], 31,
            "key_file is relative to the config's directory"
        );
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        assert!(
            c.warnings[0].contains("accessible by group or others (mode 644)"),
            "{:?}",
            c.warnings
        );
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(Config::parse(&cfg_path, &t).unwrap().warnings.is_empty());

        for (name, want) in [
            ("aes-256-gcm", Some(CipherId::Aes256Gcm)),
            ("aes256-gcm", Some(CipherId::Aes256Gcm)),
            ("chacha20-poly1305", Some(CipherId::ChaCha20Poly1305)),
            ("auto", None),
        ] {
            let c = parse(&client(&format!("cipher = \"{name}\""), LINKS)).unwrap();
            assert_eq!(c.cipher, want);
        }
        assert_eq!(
            parse(&client("", LINKS)).unwrap().cipher,
            None,
            "auto by default"
        );
        assert_eq!(CipherId::Aes256Gcm.name(), "aes-256-gcm");
        let server = format!("[bundle]\nname = \"b1\"\nrole = \"server\"\nkey = \"{KEY}\"\naddress = \"198.19.0.1/30\"\nlisten = \"0.0.0.0:5050\"\n{LINKS}");
        let c = parse(&server).unwrap();
        assert!(
            c.warnings.iter().any(|w| w.contains("ignored by a server")),
            "{:?}",
            c.warnings
        );
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
