//! The control plane of `braid up`: what the control socket and the metrics server ask of the
//! data plane, and what they make of its answers.
//!
//! The data plane ([`crate::runner`]) owns the endpoint, the TUN device and the link sockets, and
//! runs alone on its thread. Other threads talk to it only through a [`Handle`]: a typed
//! [`Command`] goes over a channel with a waker, and a typed [`Reply`] comes back. The data plane
//! does only what needs its state (copy the statistics, open or close a link socket); everything
//! slow happens here, on the asking thread: parsing the JSON request, resolving a host name,
//! rendering the status JSON and encoding the Prometheus text.

use std::net::SocketAddr;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use braid_core::{LinkId, LinkState};
use mio::Waker;
use serde_json::{json, Value};

use crate::config::Config;
use crate::engine::EngineStats;
use crate::metrics::Extra;

/// How long a command waits for the data plane's answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// A request to the data plane.
#[derive(Debug)]
pub enum Command {
    /// A copy of the statistics (for `status` and for a metrics scrape).
    Snapshot,
    /// A link to add, with its `remote` already resolved (see [`Handle::control`]).
    LinkAdd(LinkAddReq, Option<SocketAddr>),
    LinkRemove {
        name: String,
    },
    LinkSet {
        name: String,
        bandwidth: Option<u64>,
        download_bandwidth: Option<u64>,
        priority: Option<u8>,
    },
    /// Concentrator: a client to add (checked here; its address from the pool if it has none).
    ClientAdd(ClientAddReq),
    ClientRemove {
        name: String,
    },
}

/// `client-add`: what `braid client add` sends.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct ClientAddReq {
    pub name: String,
    pub public_key: String,
    #[serde(default)]
    pub address: Option<String>,
    #[serde(default)]
    pub lan: Vec<String>,
    #[serde(default)]
    pub reach: Vec<String>,
}

/// The data plane's answer to a [`Command`].
#[derive(Debug)]
pub enum Reply {
    Snapshot(Box<Snapshot>),
    Done,
    Failed(String),
}

impl From<anyhow::Result<()>> for Reply {
    fn from(r: anyhow::Result<()>) -> Reply {
        match r {
            Ok(()) => Reply::Done,
            Err(e) => Reply::Failed(format!("{e:#}")),
        }
    }
}

/// The arguments of `link add`.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkAddReq {
    pub name: String,
    pub dev: Option<String>,
    pub bind: Option<String>,
    pub remote: Option<String>,
    pub bandwidth: Option<u64>,
    #[serde(default)]
    pub download_bandwidth: Option<u64>,
    pub priority: Option<u8>,
}

/// What the data plane knows at one instant, beyond the configuration.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub stats: crate::engine::EngineStats,
    /// The runner's own counters.
    pub extra: Extra,
    pub connected: bool,
    pub uptime: Duration,
    /// The client's links as configured or added at run time.
    pub links: Vec<LinkInfo>,
}

/// A client link's settings that the core does not know.
#[derive(Debug, Clone)]
pub struct LinkInfo {
    pub id: LinkId,
    pub dev: Option<String>,
    pub bind: Option<SocketAddr>,
    pub remote: SocketAddr,
}

/// Hands commands to the data plane and waits for its answer. Cheap to clone, one per thread.
#[derive(Clone)]
pub struct Handle {
    tx: mpsc::Sender<(Command, mpsc::Sender<Reply>)>,
    waker: Arc<Waker>,
    cfg: Arc<Config>,
}

/// The data plane's end of the command channel.
pub type Commands = mpsc::Receiver<(Command, mpsc::Sender<Reply>)>;

impl Handle {
    /// A handle and the receiving end the data plane polls after `waker` wakes it.
    pub fn new(cfg: Arc<Config>, waker: Arc<Waker>) -> (Handle, Commands) {
        let (tx, rx) = mpsc::channel();
        (Handle { tx, waker, cfg }, rx)
    }

    /// Sends `cmd` and waits (up to 5 s) for the answer.
    pub fn call(&self, cmd: Command) -> Reply {
        let (rtx, rrx) = mpsc::channel();
        if self.tx.send((cmd, rtx)).is_err() || self.waker.wake().is_err() {
            return Reply::Failed("braid is shutting down".into());
        }
        rrx.recv_timeout(ANSWER_TIMEOUT)
            .unwrap_or_else(|_| Reply::Failed("braid did not answer in time".into()))
    }

    fn snapshot(&self) -> Result<Snapshot, String> {
        match self.call(Command::Snapshot) {
            Reply::Snapshot(s) => Ok(*s),
            Reply::Failed(e) => Err(e),
            Reply::Done => Err("no statistics in the answer".into()),
        }
    }

    /// One Prometheus scrape (OpenMetrics text; a comment line on failure).
    pub fn metrics(&self) -> String {
        match self.snapshot() {
            Ok(s) => match &s.stats {
                EngineStats::Bundle(b) => crate::metrics::encode(&self.cfg, b, s.extra),
                EngineStats::Sites { drops, clients } => {
                    crate::metrics::encode_sites(&self.cfg, drops, clients, s.extra)
                }
            },
            Err(e) => format!("# error: {e}\n"),
        }
    }

    /// Runs one control request (a JSON object with `cmd`) and gives the JSON answer.
    pub fn control(&self, req: Value) -> Value {
        let cmd = req.get("cmd").and_then(|c| c.as_str()).unwrap_or("");
        let name = || req.get("name").and_then(|n| n.as_str()).map(str::to_string);
        let reply = match cmd {
            "status" => {
                return match self.snapshot() {
                    Ok(s) => status_json(&self.cfg, &s),
                    Err(e) => json!({ "error": e }),
                }
            }
            "metrics" => return Value::String(self.metrics()),
            "link-add" => match link_add_request(&req) {
                Ok((r, remote)) => self.call(Command::LinkAdd(r, remote)),
                Err(e) => return json!({ "error": e }),
            },
            "link-remove" => match name() {
                Some(name) => self.call(Command::LinkRemove { name }),
                None => return json!({"error": "link-remove needs a name"}),
            },
            "link-set" => match (name(), priority(&req)) {
                (Some(name), Ok(priority)) => self.call(Command::LinkSet {
                    name,
                    bandwidth: req.get("bandwidth").and_then(|b| b.as_u64()),
                    download_bandwidth: req.get("download_bandwidth").and_then(|b| b.as_u64()),
                    priority,
                }),
                (None, _) => return json!({"error": "link-set needs a name"}),
                (_, Err(e)) => return json!({ "error": e }),
            },
            "client-add" => {
                let mut body = req.clone();
                if let Some(o) = body.as_object_mut() {
                    o.remove("cmd");
                }
                match serde_json::from_value::<ClientAddReq>(body) {
                    Ok(r) => self.call(Command::ClientAdd(r)),
                    Err(e) => return json!({"error": format!("client-add: {e}")}),
                }
            }
            "client-remove" => match name() {
                Some(name) => self.call(Command::ClientRemove { name }),
                None => return json!({"error": "client-remove needs a name"}),
            },
            other => {
                return json!({"error": format!("unknown command {other:?} (status, metrics, link-add, link-remove, link-set, client-add, client-remove)")})
            }
        };
        match reply {
            Reply::Done => json!({"ok": true}),
            Reply::Failed(e) => json!({ "error": e }),
            Reply::Snapshot(_) => json!({"error": "unexpected answer"}),
        }
    }
}

/// `link-set`'s optional priority, 0..255.
fn priority(req: &Value) -> Result<Option<u8>, String> {
    match req.get("priority").and_then(|p| p.as_u64()) {
        Some(p) => u8::try_from(p)
            .map(Some)
            .map_err(|_| "priority must be 0..255".to_string()),
        None => Ok(None),
    }
}

/// Parses a `link-add` request and resolves its remote. A host name is resolved here, on the
/// asking thread: a DNS lookup can take seconds, and the data plane must not wait for it.
fn link_add_request(req: &Value) -> Result<(LinkAddReq, Option<SocketAddr>), String> {
    let mut body = req.clone();
    if let Some(o) = body.as_object_mut() {
        o.remove("cmd");
    }
    let r: LinkAddReq = serde_json::from_value(body).map_err(|e| format!("link-add: {e}"))?;
    let remote = match &r.remote {
        Some(t) => {
            let hint = r
                .bind
                .as_deref()
                .and_then(|b| crate::config::parse_bind(b).ok())
                .map(|b| b.ip());
            let a = crate::config::resolve_remote(t, hint)
                .map_err(|m| format!("link {}: remote: {m}", r.name))?;
            Some(a)
        }
        None => None,
    };
    Ok((r, remote))
}

/// The `status` answer: the core's statistics plus what the runner and the configuration know
/// (kind, name, addresses, link devices and remotes, totals).
pub fn status_json(cfg: &Config, snap: &Snapshot) -> Value {
    let stats = match &snap.stats {
        EngineStats::Bundle(b) => b,
        EngineStats::Sites { drops, clients } => return sites_json(cfg, snap, drops, clients),
    };
    let mut v = serde_json::to_value(stats).unwrap_or_else(|e| json!({"error": e.to_string()}));
    let live = || stats.links.iter().filter(|l| l.state != LinkState::Down);
    let up = live().count();
    let total_bw: u64 = live()
        .filter_map(|l| l.bandwidth_bps)
        .fold(0, u64::saturating_add);
    let Some(o) = v.as_object_mut() else {
        return v;
    };
    o.insert("kind".into(), json!("tunnel"));
    o.insert("name".into(), json!(cfg.name));
    // "address": all of them in one line (what `braid status` prints); "addresses": a list.
    o.insert("address".into(), json!(cfg.addresses_text()));
    let all: Vec<String> = cfg.addresses.iter().map(|a| a.to_string()).collect();
    o.insert("addresses".into(), json!(all));
    o.insert("mtu".into(), json!(cfg.mtu));
    o.insert("listen".into(), json!(cfg.listen.map(|l| l.to_string())));
    o.insert("connected".into(), json!(snap.connected));
    let extra = &snap.extra;
    if let Some(Value::Object(d)) = o.get_mut("drops") {
        d.insert("udp_send".into(), json!(extra.udp_send_drops));
        d.insert("tun_write".into(), json!(extra.tun_write_errors));
        d.insert("tun_full".into(), json!(extra.tun_full_drops));
    }
    o.insert("links_up".into(), json!(up));
    o.insert("total_bandwidth_bps".into(), json!(total_bw));
    o.insert("uptime_s".into(), json!(snap.uptime.as_secs_f64()));
    // Whether the helper threads take part in receiving (`workers`, docs/guide.md).
    o.insert(
        "udp_opened_in_parallel".into(),
        json!(extra.udp_opened_in_parallel),
    );
    if let Some(Value::Array(links)) = o.get_mut("links") {
        for l in links.iter_mut() {
            let id = l.get("id").and_then(|i| i.as_u64()).unwrap_or(0);
            let rtt_ms = l
                .get("srtt_us")
                .and_then(|r| r.as_f64())
                .map(|r| r / 1000.0);
            let Some(lo) = l.as_object_mut() else {
                continue;
            };
            lo.insert("rtt_ms".into(), json!(rtt_ms));
            if let Some(info) = snap.links.iter().find(|i| u64::from(i.id) == id) {
                lo.insert("dev".into(), json!(info.dev));
                lo.insert("bind".into(), json!(info.bind.map(|b| b.to_string())));
                lo.insert("remote".into(), json!(info.remote.to_string()));
            }
        }
    }
    v
}

/// The `status` answer of a concentrator: its own counters, and each client with its links as
/// a bundle's status shows them.
fn sites_json(
    cfg: &Config,
    snap: &Snapshot,
    drops: &braid_core::concentrator::ConcentratorDrops,
    clients: &[braid_core::concentrator::ClientStats],
) -> Value {
    use base64::Engine as _;
    let b64 = |k: &[u8; 32]| base64::engine::general_purpose::STANDARD.encode(k);
    let all: Vec<String> = cfg.addresses.iter().map(|a| a.to_string()).collect();
    let extra = &snap.extra;
    let list: Vec<Value> = clients
        .iter()
        .map(|c| {
            let mut v =
                serde_json::to_value(&c.stats).unwrap_or_else(|e| json!({"error": e.to_string()}));
            if let Some(o) = v.as_object_mut() {
                o.insert("name".into(), json!(c.name));
                o.insert("public_key".into(), json!(b64(&c.public_key)));
                o.insert("connected".into(), json!(c.connected));
                let p: Vec<String> = c.prefixes.iter().map(|p| p.to_string()).collect();
                o.insert("prefixes".into(), json!(p));
                o.insert(
                    "links_up".into(),
                    json!(c
                        .stats
                        .links
                        .iter()
                        .filter(|l| l.state != LinkState::Down)
                        .count()),
                );
                o.insert("forwarded".into(), json!(c.forwarded));
                if let Some(Value::Object(d)) = o.get_mut("drops") {
                    d.insert("source".into(), json!(c.dropped_source));
                    d.insert("policy".into(), json!(c.dropped_policy));
                    d.insert("queue".into(), json!(c.dropped_queue));
                }
            }
            v
        })
        .collect();
    json!({
        "kind": "tunnel",
        "role": "server",
        "concentrator": true,
        "name": cfg.name,
        "address": cfg.addresses_text(),
        "addresses": all,
        "mtu": cfg.mtu,
        "listen": cfg.listen.map(|l| l.to_string()),
        "connected": snap.connected,
        "uptime_s": snap.uptime.as_secs_f64(),
        "drops": {
            "unknown_client": drops.unknown_client,
            "unknown_session": drops.unknown_session,
            "malformed": drops.malformed,
            "no_route": drops.no_route,
            "udp_send": extra.udp_send_drops,
            "tun_write": extra.tun_write_errors,
            "tun_full": extra.tun_full_drops,
        },
        "clients": list,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use braid_core::endpoint::{Config as EpConfig, Role};
    use braid_core::{Endpoint, LinkConfig};
    use mio::{Poll, Token};
    use std::time::Instant;

    fn config() -> Config {
        let text = r#"
[bundle]
name = "braid0"
role = "client"
key = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
address = "198.19.0.2/30"
mtu = 1400

[[link]]
name = "isp1"
bind = "198.18.1.1"
remote = "198.18.1.2:5050"
"#;
        Config::parse(std::path::Path::new("/etc/braid/t.toml"), text).unwrap()
    }

    fn snapshot() -> Snapshot {
        let now = Instant::now();
        use rand::SeedableRng;
        let rng = Box::new(rand::rngs::StdRng::seed_from_u64(1));
        let mut ep = Endpoint::new(EpConfig::new(Role::Client, [1; 32]), now, rng).unwrap();
        let link = LinkConfig {
            name: "isp1".into(),
            bandwidth_bps: Some(5_000_000),
            priority: 0,
            download_bps: None,
        };
        ep.add_link(now, 1, link).unwrap();
        Snapshot {
            stats: EngineStats::Bundle(Box::new(ep.stats(now))),
            extra: Extra {
                udp_send_drops: 3,
                tun_full_drops: 5,
                udp_opened_in_parallel: 64,
                ..Extra::default()
            },
            connected: false,
            uptime: Duration::from_millis(2500),
            links: vec![LinkInfo {
                id: 1,
                dev: Some("eth1".into()),
                bind: Some("198.18.1.1:0".parse().unwrap()),
                remote: "198.18.1.2:5050".parse().unwrap(),
            }],
        }
    }

    #[test]
    fn status_joins_the_core_stats_the_runner_counters_and_the_config() {
        let v = status_json(&config(), &snapshot());
        assert_eq!(v["kind"], "tunnel");
        assert_eq!(v["name"], "braid0");
        assert_eq!(v["address"], "198.19.0.2/30");
        assert_eq!(v["mtu"], 1400);
        assert_eq!(v["connected"], false);
        assert_eq!(v["uptime_s"], 2.5);
        assert_eq!(v["drops"]["udp_send"], 3);
        assert_eq!(v["drops"]["tun_full"], 5);
        assert_eq!(v["udp_opened_in_parallel"], 64);
        assert_eq!(v["queued"], 0);
        // The link starts DOWN: no bandwidth counted as up.
        assert_eq!(
            (v["links_up"].as_u64(), v["total_bandwidth_bps"].as_u64()),
            (Some(0), Some(0))
        );
        let l = &v["links"][0];
        assert_eq!(l["name"], "isp1");
        assert_eq!(l["dev"], "eth1");
        assert_eq!(l["bind"], "198.18.1.1:0");
        assert_eq!(l["remote"], "198.18.1.2:5050");
    }

    /// A handle whose data plane answers every command with `answer` (and records it).
    fn handle_answering(
        answer: fn(&Command) -> Reply,
    ) -> (Handle, std::thread::JoinHandle<Vec<String>>) {
        let poll = Poll::new().unwrap();
        let waker = Arc::new(Waker::new(poll.registry(), Token(0)).unwrap());
        let (h, rx) = Handle::new(Arc::new(config()), waker);
        let t = std::thread::spawn(move || {
            let _poll = poll;
            let mut seen = Vec::new();
            while let Ok((cmd, reply)) = rx.recv() {
                seen.push(format!("{cmd:?}"));
                let _ = reply.send(answer(&cmd));
            }
            seen
        });
        (h, t)
    }

    #[test]
    fn requests_are_checked_before_they_reach_the_data_plane() {
        let (h, t) = handle_answering(|_| Reply::Done);
        let bad = [
            (json!({"cmd": "nope"}), "unknown command \"nope\""),
            (json!({"cmd": "link-remove"}), "link-remove needs a name"),
            (
                json!({"cmd": "link-set", "name": "a", "priority": 300}),
                "priority must be 0..255",
            ),
            (
                json!({"cmd": "link-add", "name": "a", "colour": 1}),
                "link-add: unknown field `colour`",
            ),
            (
                json!({"cmd": "link-add", "name": "a", "remote": "no-port"}),
                "link a: remote:",
            ),
        ];
        for (req, want) in bad {
            let v = h.control(req.clone());
            let e = v["error"].as_str().unwrap_or_default();
            assert!(e.starts_with(want), "{req}: want {want:?}, got {v}");
        }
        let ok = h.control(json!({"cmd": "link-set", "name": "a", "bandwidth": 9, "priority": 2}));
        assert_eq!(ok, json!({"ok": true}));
        let ok = h.control(json!({"cmd": "link-add", "name": "b", "bind": "198.18.2.1", "remote": "198.18.2.2:5050"}));
        assert_eq!(ok, json!({"ok": true}));
        drop(h);
        let seen = t.join().unwrap();
        assert_eq!(
            seen.len(),
            2,
            "only the two valid requests reach it: {seen:?}"
        );
        assert!(
            seen[0].contains("LinkSet") && seen[0].contains("Some(2)"),
            "{seen:?}"
        );
        assert!(
            seen[1].contains("198.18.2.2:5050"),
            "resolved before: {seen:?}"
        );
    }

    #[test]
    fn status_and_metrics_are_rendered_from_one_snapshot_and_failures_named() {
        let (h, t) = handle_answering(|c| match c {
            Command::Snapshot => Reply::Snapshot(Box::new(snapshot())),
            _ => Reply::Failed("no link named x".into()),
        });
        assert_eq!(
            h.control(json!({"cmd": "status"}))["links"][0]["remote"],
            "198.18.1.2:5050"
        );
        let text = h.metrics();
        assert!(
            text.contains("braid_drops_total{bundle=\"braid0\",reason=\"udp_send\"} 3"),
            "{text}"
        );
        assert_eq!(
            h.control(json!({"cmd": "link-remove", "name": "x"})),
            json!({"error": "no link named x"})
        );
        drop(h);
        t.join().unwrap();
    }
}
