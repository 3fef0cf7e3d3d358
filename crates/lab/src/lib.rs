//! `braid lab`: a private network in namespaces with emulated links, two braid endpoints, real
//! kernel TCP through them, and a report. Also the harness of the end-to-end tests and benchmarks.
//!
//! - [`hostcheck`]: the tools and the TCP congestion control the lab needs from the machine.
//! - [`spec`]: link specifications (`RATE[/DELAY[/LOSS%[/JITTER]]]`).
//! - [`netns`]: namespaces, veths and the processes the lab runs inside them (all cleaned up by Drop).
//! - [`emulator`]: the link emulator (braid's own forwarding engine through braid-core's
//!   [`braid_core::netem`] link model, the simulator's; no kernel netem here).
//! - [`traffic`]: TCP sink and source.
//! - [`report`]: the figures, the table and the JSON.
//! - [`Lab`]: the whole set-up as a value, used by `braid lab` and by the end-to-end tests.

pub mod emulator;
pub mod hostcheck;
pub mod netns;
pub mod report;
/// Link specifications, parsed where the simulator parses them too.
pub use braid_core::linkspec as spec;
pub mod traffic;

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::emulator::EmuStats;
use crate::netns::{Proc, Topology};
use crate::report::{
    BundleReport, CompareReport, EndSample, EndsSample, FailReport, LabReport, LinkReport,
    RunReport,
};
pub use crate::spec::LinkSpec;

/// Tunnel addresses (inside 198.18.0.0/15, outside the links' `198.18.<i>.0/24`).
pub const TUNNEL_A: &str = "198.19.0.1";
pub const TUNNEL_B: &str = "198.19.0.2";
/// UDP port of the server endpoint.
pub const BRAID_PORT: u16 = 5050;
/// TCP port of the sink.
pub const SINK_PORT: u16 = 5201;
/// MTU of the emulated uplinks.
pub const UNDERLAY_MTU: u32 = 1500;
/// The largest tunnel MTU whose packets still fit the uplinks: 1500 - IPv4 - UDP - braid's DATA
/// header and tag (58 bytes in all; before inner header compression shrinks them).
pub const MAX_TUNNEL_MTU: u32 = UNDERLAY_MTU - 28 - braid_core::wire::DATA_OVERHEAD as u32;
/// The largest `--mtu`: a full 1500 bytes inside the tunnel (packets that do not fit a link are
/// cut into pieces, docs/protocol.md §10.1).
pub const MAX_LAB_MTU: u32 = 1500;
/// IPv4 + TCP headers with timestamps: what each TCP segment carries besides payload.
pub const TCP_IP_HEADERS: u32 = 52;
/// How often a bundle run records both ends' view ([`report::BundleReport::timeline`]).
pub const TIMELINE_EVERY: Duration = Duration::from_millis(500);

/// `default`, or `BRAID_LAB_SAMPLE_MS` milliseconds if set (at least 10): how often a run
/// records the ends' view and the sender's TCP state. A debugging aid: a failover's stall lasts
/// a few hundred milliseconds, which the default half-second samples do not resolve. Each
/// sample asks both endpoints for their status, so finer samples cost some CPU.
pub fn sample_every(default: Duration) -> Duration {
    std::env::var("BRAID_LAB_SAMPLE_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(default, |ms| Duration::from_millis(ms.max(10)))
}

fn parse_link_spec(s: &str) -> Result<LinkSpec, String> {
    s.parse()
}

/// `--fail NAME@SECONDS`.
#[derive(Debug, Clone, PartialEq)]
pub struct FailSpec {
    /// Link index, from 1.
    pub link: usize,
    pub at: Duration,
}

fn parse_fail(s: &str) -> Result<FailSpec, String> {
    let (name, at) = s
        .split_once('@')
        .ok_or_else(|| format!("'{s}' must be NAME@SECONDS, e.g. link2@10"))?;
    let num = name.strip_prefix("link").unwrap_or(name);
    let link: usize = num
        .parse()
        .map_err(|_| format!("'{name}' is not a link name (link1, link2, ...) or index"))?;
    if link == 0 {
        return Err("links are numbered from 1".into());
    }
    let secs: f64 = at
        .trim_end_matches('s')
        .parse()
        .map_err(|_| format!("'{at}' is not a number of seconds"))?;
    if !secs.is_finite() || secs <= 0.0 {
        return Err(format!("fail time '{at}' must be positive"));
    }
    Ok(FailSpec {
        link,
        at: Duration::from_secs_f64(secs),
    })
}

/// Which way the data of a traffic run goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Host A (the client endpoint's side) sends to host B: an upload over the uplinks.
    #[default]
    Upload,
    /// Host B (the server side) sends to host A: a download.
    Download,
}

impl Direction {
    /// Index of this direction in the emulator's per-link counters (A->B, B->A).
    pub fn emu_index(self) -> usize {
        match self {
            Direction::Upload => 0,
            Direction::Download => 1,
        }
    }
}

/// What a traffic run sends, and how.
#[derive(Debug, Clone)]
pub struct Traffic {
    /// Address of the receiving host (the sink listens on it).
    pub dst: String,
    pub flows: u16,
    /// Length of the measurement window.
    pub duration: Duration,
    pub direction: Direction,
    /// Run both ends under `mptcpize run` (kernel MPTCP instead of TCP).
    pub mptcp: bool,
}

/// What to run side by side with the bundle over the same emulated links.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Compare {
    /// Kernel MPTCP: the same traffic tool under `mptcpize run`, one subflow per link.
    Mptcp,
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim_end_matches('s')
        .parse()
        .map_err(|_| format!("'{s}' is not a number of seconds"))?;
    if !(1.0..=3600.0).contains(&v) {
        return Err(format!("duration '{s}' must be between 1 and 3600 seconds"));
    }
    Ok(v)
}

/// `braid lab`: emulated uplinks between two namespaces, each link measured alone with one TCP flow,
/// then the bundle (two `braid up` endpoints) with the same traffic. Needs root.
#[derive(Debug, clap::Args)]
pub struct LabArgs {
    /// An emulated uplink, RATE[/DELAY[/LOSS%[/JITTER]]], e.g. 50mbit/20ms/0.5%/1ms (repeat for
    /// each link; default: 1mbit/10ms, 2mbit/10ms and 3mbit/10ms). Rates kbit/mbit/gbit of IP
    /// bytes; delay one way, us/ms/s; loss per direction.
    #[arg(long = "link", value_name = "SPEC", value_parser = parse_link_spec)]
    pub links: Vec<LinkSpec>,
    /// Seconds of traffic per run.
    #[arg(long, value_name = "SECONDS", default_value = "20", value_parser = parse_seconds)]
    pub duration: f64,
    /// Scheduler of the bundle (round-robin, weighted, adaptive, flow-hash, redundant, backup).
    #[arg(long, value_name = "NAME")]
    pub scheduler: Option<String>,
    /// Parallel TCP flows per run.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub flows: u16,
    /// Take a link down during the bundle run: NAME@SECONDS (NAME = link1, link2, ... or the
    /// index), e.g. link2@10. Reports how long traffic stalled and whether TCP survived.
    #[arg(long, value_name = "NAME@SECONDS", value_parser = parse_fail)]
    pub fail: Option<FailSpec>,
    /// Bring `--fail`'s link back during the run: NAME@SECONDS, the same link, later, e.g.
    /// link2@16. Shows what a link returning does to the flow (the per-second goodput).
    #[arg(long, value_name = "NAME@SECONDS", value_parser = parse_fail)]
    pub restore: Option<FailSpec>,
    /// Print one JSON object with every figure instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Skip the runs of each link alone.
    #[arg(long)]
    pub skip_single: bool,
    /// Skip the bundle run (measure the emulated links only).
    #[arg(long)]
    pub skip_bundle: bool,
    /// Queue of each emulated link, in milliseconds of its rate (at least 15 KB: ten full frames).
    #[arg(long, value_name = "MS", default_value_t = braid_core::netem::DEFAULT_QUEUE_MS)]
    pub queue_ms: u64,
    /// Run CoDel (RFC 8289: 5 ms target, 100 ms interval, the target raised to 1.5 packets'
    /// time on a slow link as OpenWrt's SQM does) on every emulated link's queue, as a router
    /// with fq_codel or CAKE in front of an uplink does: it marks ECN-capable frames
    /// Congestion Experienced and drops the others, on top of the drop-tail limit
    /// (`--queue-ms`). Default: drop-tail only. With `--ecn` the hosts' flows see marks
    /// instead of drops: MPTCP's subflows directly, braid's inner flow through the tunnel
    /// (RFC 6040).
    #[arg(long)]
    pub codel: bool,
    /// MTU of the tunnel (default: the largest whose packets fit a 1500-byte uplink uncompressed;
    /// up to 1500, where braid cuts packets that do not fit into pieces).
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u32).range(576..=MAX_LAB_MTU as i64))]
    pub mtu: Option<u32>,
    /// Do not tell the endpoints the links' rates (`bandwidth` and `download_bandwidth` in the
    /// client's config): let both ends learn them.
    #[arg(long)]
    pub no_bandwidth_hint: bool,
    /// Bound of the endpoints' delay equalisation, milliseconds (`equalize_max_ms`; 0 turns it
    /// off; default braid's, 300).
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(0..=1000))]
    pub equalize_max: Option<u64>,
    /// Turn the endpoints' back-pressure on (`backpressure = true`, braid's default): while
    /// every link is full, packets wait in the bundle's queue instead of overflowing the links'
    /// buffers.
    #[arg(long, conflicts_with = "no_backpressure")]
    pub backpressure: bool,
    /// Turn the endpoints' back-pressure off (`backpressure = false`).
    #[arg(long)]
    pub no_backpressure: bool,
    /// Turn ECN across the tunnel off in both endpoints (`ecn = false`): every datagram goes
    /// Not-ECT, so a link's CoDel (`--codel`) drops the bundle's packets where it would have
    /// marked them.
    #[arg(long)]
    pub no_tunnel_ecn: bool,
    /// Turn the receive-window clamp off in both endpoints (`clamp_window = false`): the hosts'
    /// senders are told the window their peers announce, not what the bundle carries.
    #[arg(long)]
    pub no_clamp_window: bool,
    /// Both endpoints hold the packets behind a random loss until its copy comes
    /// (`hold_random_loss = true`) instead of passing them on.
    #[arg(long)]
    pub hold_random_loss: bool,
    /// Seed of the emulator's random loss and jitter.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// TCP congestion control of the two hosts' kernel TCP (cubic, reno, bbr, ...). Default
    /// cubic, Linux's own default. If the kernel does not allow it in namespaces
    /// (net.ipv4.tcp_allowed_congestion_control), the lab allows it for the moment it takes to
    /// set the hosts, then puts the list back.
    #[arg(long, value_name = "NAME", default_value = "cubic")]
    pub cc: String,
    /// Let the two hosts' TCP negotiate ECN (`net.ipv4.tcp_ecn = 1` in their namespaces; Linux
    /// asks for it only so set, and answers a peer that asks by default): braid's bundle queue
    /// then marks their packets Congestion Experienced before it would drop them. Applies to
    /// every run.
    #[arg(long)]
    pub ecn: bool,
    /// Download: host B (behind the server endpoint) sends and host A receives. Applies to every
    /// run (links alone, bundle, comparison).
    #[arg(long)]
    pub reverse: bool,
    /// Also run this over the very same emulated links, same traffic, duration and congestion
    /// control, and report it side by side: `mptcp` is kernel MPTCP (`mptcpize run` around the
    /// lab's traffic tool, one subflow per link; needs the mptcpize package).
    #[arg(long, value_name = "WHAT", value_enum)]
    pub compare: Option<Compare>,
    /// No live view on stderr.
    #[arg(long, short)]
    pub quiet: bool,
}

/// Hidden helper processes the lab starts inside its namespaces.
#[derive(Debug, clap::Subcommand)]
pub enum LabInternal {
    /// The link emulator (namespace E).
    Emulate {
        #[arg(long = "link", value_parser = parse_link_spec)]
        links: Vec<LinkSpec>,
        #[arg(long, default_value_t = braid_core::netem::DEFAULT_QUEUE_MS)]
        queue_ms: u64,
        /// Run CoDel on every queue (marks ECN-capable frames, drops others).
        #[arg(long)]
        codel: bool,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long, default_value_t = 1000)]
        stats_ms: u64,
    },
    /// TCP sink (host B).
    Sink {
        #[arg(long)]
        listen: SocketAddr,
        #[arg(long, default_value_t = 1)]
        flows: usize,
        /// Measurement window, seconds.
        #[arg(long)]
        window: f64,
        #[arg(long, default_value_t = 20.0)]
        accept_timeout: f64,
    },
    /// TCP source (host A).
    Source {
        #[arg(long)]
        connect: SocketAddr,
        #[arg(long, default_value_t = 1)]
        flows: usize,
        /// Seconds of writing.
        #[arg(long)]
        duration: f64,
        #[arg(long, default_value_t = 15.0)]
        connect_timeout: f64,
    },
}

fn secs(v: f64, what: &str) -> anyhow::Result<Duration> {
    if !v.is_finite() || !(0.0..=86400.0).contains(&v) {
        bail!("bad {what}: {v}");
    }
    Ok(Duration::from_secs_f64(v))
}

pub fn run_internal(cmd: LabInternal) -> anyhow::Result<()> {
    match cmd {
        LabInternal::Emulate {
            links,
            queue_ms,
            codel,
            seed,
            stats_ms,
        } => emulator::run(&links, queue_ms, codel, seed, stats_ms),
        LabInternal::Sink {
            listen,
            flows,
            window,
            accept_timeout,
        } => traffic::run_sink(
            listen,
            flows,
            secs(window, "window")?,
            secs(accept_timeout, "accept timeout")?,
        ),
        LabInternal::Source {
            connect,
            flows,
            duration,
            connect_timeout,
        } => traffic::run_source(
            connect,
            flows,
            secs(duration, "duration")?,
            secs(connect_timeout, "connect timeout")?,
        ),
    }
}

static INTERRUPTED: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// Whether SIGINT or SIGTERM arrived (after [`install_signal_handlers`]).
pub fn interrupted() -> bool {
    INTERRUPTED.get().is_some_and(|f| f.load(Ordering::Relaxed))
}

/// SIGINT/SIGTERM set a flag that every wait of the lab checks, so it unwinds and cleans up.
pub fn install_signal_handlers() -> anyhow::Result<()> {
    let flag = INTERRUPTED
        .get_or_init(|| Arc::new(AtomicBool::new(false)))
        .clone();
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, flag.clone()).context("installing signal handlers")?;
    }
    Ok(())
}

/// Whether this process runs as root (the lab needs it for namespaces).
pub fn is_root() -> bool {
    braid_linux::process::is_root()
}

/// Options of a [`Lab`].
#[derive(Debug, Clone)]
pub struct LabOptions {
    /// The `braid` binary to run inside the namespaces.
    pub exe: PathBuf,
    /// Namespace prefix (`bl<pid>` by default; tests add a tag).
    pub prefix: String,
    pub queue_ms: u64,
    pub seed: u64,
    /// TCP congestion control of hosts A and B.
    pub cc: String,
    /// Hosts A and B ask for ECN (`net.ipv4.tcp_ecn = 1`).
    pub ecn: bool,
    /// The links' queues run CoDel.
    pub codel: bool,
}

impl LabOptions {
    pub fn new(exe: PathBuf) -> Self {
        LabOptions {
            exe,
            prefix: format!("bl{}", std::process::id()),
            queue_ms: braid_core::netem::DEFAULT_QUEUE_MS,
            seed: 1,
            cc: "cubic".to_string(),
            ecn: false,
            codel: false,
        }
    }
}

/// A directory removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        // BRAID_LAB_KEEP=1 keeps the configs and logs for debugging.
        if std::env::var_os("BRAID_LAB_KEEP").is_some_and(|v| v == "1") {
            eprintln!("braid lab: kept {}", self.0.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Idle round trip figures, as `ping` prints them ([`ping`]).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PingStats {
    pub sent: u32,
    pub received: u32,
    pub min_ms: f64,
    pub avg_ms: f64,
    pub max_ms: f64,
    /// Every reply's round trip, in order (not in the lab's JSON: the summary is).
    #[serde(skip)]
    pub rtts_ms: Vec<f64>,
}

impl PingStats {
    /// The summary of one round trip per request (`None`: no reply), as ping prints it.
    pub fn from_rtts(rtts: &[Option<Duration>]) -> PingStats {
        let ms: Vec<f64> = rtts
            .iter()
            .flatten()
            .map(|d| d.as_secs_f64() * 1e3)
            .collect();
        let n = ms.len();
        PingStats {
            sent: rtts.len() as u32,
            received: n as u32,
            min_ms: ms.iter().copied().reduce(f64::min).unwrap_or(0.0),
            avg_ms: ms.iter().sum::<f64>() / n.max(1) as f64,
            max_ms: ms.iter().copied().reduce(f64::max).unwrap_or(0.0),
            rtts_ms: ms,
        }
    }

    /// The `q`-quantile (0..=1) of the round trips (nearest rank); 0 without replies.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        let mut v = self.rtts_ms.clone();
        v.sort_by(f64::total_cmp);
        match v.len() {
            0 => 0.0,
            n => v[((q.clamp(0.0, 1.0) * n as f64).ceil() as usize).clamp(1, n) - 1],
        }
    }

    pub fn loss(&self) -> f64 {
        if self.sent == 0 {
            return 0.0;
        }
        1.0 - f64::from(self.received) / f64::from(self.sent)
    }
}

/// The result of one traffic run.
#[derive(Debug, Clone)]
pub struct TcpRun {
    pub sink: traffic::SinkReport,
    pub source: traffic::SourceReport,
    /// Emulator counters at the start and end of the steady part of the run.
    pub emu_start: Option<EmuStats>,
    pub emu_end: Option<EmuStats>,
    /// Host A's TCP counters (OutSegs, RetransSegs) over the run: the sender's retransmissions.
    pub tcp_out_segs: u64,
    pub tcp_retrans_segs: u64,
    /// Emulator counters just before the run and after it.
    pub emu_before: Option<EmuStats>,
    pub emu_after: Option<EmuStats>,
    /// Which way the data went.
    pub direction: Direction,
}

impl TcpRun {
    pub fn survived(&self) -> bool {
        let sent: u64 = self.source.flows.iter().map(|f| f.bytes_sent).sum();
        let got: u64 = self.sink.flows.iter().map(|f| f.bytes).sum();
        self.source.flows.iter().all(|f| f.error.is_none())
            && self
                .sink
                .flows
                .iter()
                .all(|f| f.clean_eof && f.error.is_none())
            && sent == got
            && sent > 0
    }

    /// Per link, frames of the data direction dropped by the emulator during the run: (queue
    /// full, random loss).
    pub fn link_drops(&self) -> Vec<(u64, u64)> {
        let queue = self.link_counts(|s| s.queue_drops);
        let lost = self.link_counts(|s| s.lost);
        queue.into_iter().zip(lost).collect()
    }

    /// Per link, one of the emulator's counters of the data direction over the run.
    pub fn link_counts(&self, count: impl Fn(&emulator::DirStats) -> u64) -> Vec<u64> {
        match (&self.emu_before, &self.emu_after) {
            (Some(a), Some(b)) => a
                .links
                .iter()
                .zip(&b.links)
                .map(|(x, y)| {
                    let d = self.direction.emu_index();
                    count(&y[d]).saturating_sub(count(&x[d]))
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Average rate of each link in the data direction in the steady part of the run (IP bytes,
    /// bit/s).
    pub fn link_rates(&self) -> Vec<f64> {
        match (&self.emu_start, &self.emu_end) {
            (Some(a), Some(b)) if b.t > a.t => a
                .links
                .iter()
                .zip(&b.links)
                .map(|(x, y)| {
                    let d = self.direction.emu_index();
                    (y[d].bytes - x[d].bytes) as f64 * 8.0 / (b.t - a.t)
                })
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// The lab: namespaces, the link emulator, and (after [`Lab::start_bundle`]) two endpoints.
/// Dropping it stops every process and deletes the namespaces.
pub struct Lab {
    // Field order is drop order: endpoints, then the emulator, then the namespaces, then files.
    endpoints: Vec<Proc>,
    emulator: Proc,
    pub topo: Topology,
    dir: TempDir,
    pub specs: Vec<LinkSpec>,
    exe: PathBuf,
    stats: Arc<Mutex<Vec<EmuStats>>>,
    emu_started: Instant,
    client_control: Option<PathBuf>,
    /// `equalize_max_ms` for both endpoints (`None`: braid's default).
    pub equalize_max_ms: Option<u64>,
    /// `backpressure` for both endpoints (`None`: braid's default).
    pub backpressure: Option<bool>,
    /// `ecn = false` for both endpoints (ECN across the tunnel off).
    pub no_tunnel_ecn: bool,
    /// `clamp_window = false` for both endpoints.
    pub no_clamp_window: bool,
    /// `hold_random_loss = true` for both endpoints.
    pub hold_random_loss: bool,
}

impl Lab {
    /// Builds the namespaces and links and starts the emulator.
    pub fn start(specs: &[LinkSpec], opts: &LabOptions) -> anyhow::Result<Lab> {
        if specs.is_empty() || specs.len() > 16 {
            bail!("the lab needs 1 to 16 links, not {}", specs.len());
        }
        if !is_root() {
            bail!("braid lab needs root to build network namespaces (CAP_SYS_ADMIN, CAP_NET_ADMIN): run it with sudo");
        }
        let dir = std::env::temp_dir().join(format!("braid-lab-{}", opts.prefix));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let dir = TempDir(dir);
        hostcheck::require_tools(hostcheck::LAB_TOOLS)?;
        let topo = Topology::create(&opts.prefix, specs.len())?;
        hostcheck::set_hosts_cc(&[topo.ns_a(), topo.ns_b()], &opts.cc)?;
        if opts.ecn {
            for ns in [topo.ns_a(), topo.ns_b()] {
                braid_linux::sysctl::write_in_netns(&ns, "net.ipv4.tcp_ecn", "1")
                    .with_context(|| format!("setting net.ipv4.tcp_ecn = 1 in namespace {ns}"))?;
            }
        }
        let mut args: Vec<String> = vec!["lab-internal".into(), "emulate".into()];
        for s in specs {
            args.push("--link".into());
            args.push(s.to_string());
        }
        args.extend([
            "--queue-ms".into(),
            opts.queue_ms.to_string(),
            "--seed".into(),
            opts.seed.to_string(),
        ]);
        if opts.codel {
            args.push("--codel".into());
        }
        let mut emulator = Proc::spawn(
            "emulator",
            &topo.ns_e(),
            &opts.exe,
            &args,
            dir.0.join("emulator.log"),
        )?;
        let ready = emulator.read_line(Duration::from_secs(10))?;
        if ready != "ready" {
            bail!(
                "emulator said '{ready}' instead of ready: {}",
                emulator.log_tail()
            );
        }
        let emu_started = Instant::now();
        let stats = Arc::new(Mutex::new(Vec::new()));
        let mut out = emulator.stdout.take().context("emulator stdout")?;
        let sink = stats.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            let mut line = String::new();
            while matches!(out.read_line(&mut line), Ok(n) if n > 0) {
                if let Ok(s) = serde_json::from_str::<EmuStats>(line.trim()) {
                    if let Ok(mut v) = sink.lock() {
                        v.push(s);
                    }
                }
                line.clear();
            }
        });
        Ok(Lab {
            endpoints: Vec::new(),
            emulator,
            topo,
            dir,
            specs: specs.to_vec(),
            exe: opts.exe.clone(),
            stats,
            emu_started,
            client_control: None,
            equalize_max_ms: None,
            backpressure: None,
            no_tunnel_ecn: false,
            no_clamp_window: false,
            hold_random_loss: false,
        })
    }

    /// The lab's working directory (configs, logs, control sockets).
    pub fn dir(&self) -> &Path {
        &self.dir.0
    }

    /// Control socket of the server endpoint, once started.
    pub fn server_control(&self) -> Option<PathBuf> {
        self.client_control
            .as_ref()
            .map(|_| self.dir.0.join("server.sock"))
    }

    /// Both ends' view now (`t_s` into the run), from their `status` replies.
    pub fn ends_sample(&self, t_s: f64) -> EndsSample {
        let end = |p: Option<&Path>| EndSample::from_status(&endpoint_status(p?).ok()?);
        EndsSample {
            t_s,
            client: end(self.client_control()),
            server: end(self.server_control().as_deref()),
        }
    }

    /// Control socket of the client endpoint, once started.
    pub fn client_control(&self) -> Option<&Path> {
        self.client_control.as_deref()
    }

    /// Latest emulator counters.
    pub fn emu_stats(&self) -> Option<EmuStats> {
        self.stats.lock().ok().and_then(|v| v.last().cloned())
    }

    fn emu_stats_history(&self) -> Vec<EmuStats> {
        self.stats.lock().map(|v| v.clone()).unwrap_or_default()
    }

    fn emu_command(&mut self, cmd: &str) -> anyhow::Result<()> {
        let stdin = self.emulator.stdin.as_mut().context("emulator stdin")?;
        writeln!(stdin, "{cmd}")
            .and_then(|_| stdin.flush())
            .context("emulator control")?;
        Ok(())
    }

    /// Makes link `i` (from 1) drop everything, both ways.
    pub fn fail_link(&mut self, i: usize) -> anyhow::Result<()> {
        self.emu_command(&format!("fail {i}"))
    }

    /// Brings link `i` back.
    pub fn restore_link(&mut self, i: usize) -> anyhow::Result<()> {
        self.emu_command(&format!("restore {i}"))
    }

    /// Prepares kernel MPTCP between hosts A and B: one subflow per emulated link. Each host gets
    /// a `subflow` endpoint on every link but the first, bound to that link's device, so the
    /// connecting side opens one subflow per link whichever way the data goes (a device-bound
    /// subflow to the peer's first address is routed on-link through its own link).
    pub fn enable_mptcp(&self) -> anyhow::Result<()> {
        hostcheck::require_tools(&[hostcheck::Tool {
            command: "mptcpize",
            package: "mptcpize",
        }])?;
        let n = self.specs.len().to_string();
        for (ns, host, dev) in [(self.topo.ns_a(), 'a', "a"), (self.topo.ns_b(), 'b', "b")] {
            netns::ip(&[
                "-n",
                &ns,
                "mptcp",
                "limits",
                "set",
                "subflow",
                &n,
                "add_addr_accepted",
                &n,
            ])
            .context("kernel MPTCP (ip mptcp limits)")?;
            for i in 2..=self.specs.len() {
                let addr = if host == 'a' {
                    netns::addr_a(i)
                } else {
                    netns::addr_b(i)
                };
                netns::ip(&[
                    "-n",
                    &ns,
                    "mptcp",
                    "endpoint",
                    "add",
                    &addr,
                    "dev",
                    &format!("{dev}{i}"),
                    "subflow",
                ])
                .context("kernel MPTCP (ip mptcp endpoint)")?;
            }
        }
        Ok(())
    }

    /// Pings host B over link `i` from host A.
    pub fn ping(&self, i: usize, count: u32, interval: Duration) -> anyhow::Result<PingStats> {
        ping(&self.topo.ns_a(), &netns::addr_b(i), count, interval)
    }

    /// Runs `flows` TCP flows from host A to `dst` for `duration` (measured at the sink);
    /// `tick` is called about every 100 ms with the seconds elapsed (for live views and failures).
    pub fn run_tcp(
        &mut self,
        dst: &str,
        flows: u16,
        duration: Duration,
        tick: &mut dyn FnMut(&mut Lab, f64) -> anyhow::Result<()>,
    ) -> anyhow::Result<TcpRun> {
        let traffic = Traffic {
            dst: dst.to_string(),
            flows,
            duration,
            direction: Direction::Upload,
            mptcp: false,
        };
        self.run_traffic(&traffic, tick)
    }

    /// The namespaces of a run's (sender, receiver).
    fn hosts(&self, direction: Direction) -> (String, String) {
        match direction {
            Direction::Upload => (self.topo.ns_a(), self.topo.ns_b()),
            Direction::Download => (self.topo.ns_b(), self.topo.ns_a()),
        }
    }

    /// Starts the lab's traffic tool (`braid lab-internal sink|source ...`) in `ns`, under
    /// `mptcpize run` if asked.
    fn spawn_tool(
        &self,
        name: &str,
        ns: &str,
        args: Vec<String>,
        mptcp: bool,
    ) -> anyhow::Result<Proc> {
        let log = self.dir.0.join(format!("{name}.log"));
        if mptcp {
            let mut all = vec!["run".to_string(), self.exe.display().to_string()];
            all.extend(args);
            Proc::spawn(name, ns, Path::new("mptcpize"), &all, log)
        } else {
            Proc::spawn(name, ns, &self.exe, &args, log)
        }
    }

    /// Runs `traffic` (measured at the sink); `tick` is called about every 100 ms with the
    /// seconds elapsed (for live views and failures).
    pub fn run_traffic(
        &mut self,
        traffic: &Traffic,
        tick: &mut dyn FnMut(&mut Lab, f64) -> anyhow::Result<()>,
    ) -> anyhow::Result<TcpRun> {
        let listen = format!("{}:{SINK_PORT}", traffic.dst);
        let dur = traffic.duration.as_secs_f64();
        let flows = traffic.flows.to_string();
        let (sender_ns, receiver_ns) = self.hosts(traffic.direction);
        let sink_args: Vec<String> = [
            "lab-internal",
            "sink",
            "--listen",
            &listen,
            "--flows",
            &flows,
            "--window",
            &dur.to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut sink = self.spawn_tool("sink", &receiver_ns, sink_args, traffic.mptcp)?;
        let l = sink.read_line(Duration::from_secs(10))?;
        if l != "listening" {
            bail!("sink said '{l}': {}", sink.log_tail());
        }
        // The source writes one second longer than the window so the window is full of traffic.
        let src_args: Vec<String> = [
            "lab-internal",
            "source",
            "--connect",
            &listen,
            "--flows",
            &flows,
            "--duration",
            &(dur + 1.0).to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut source = self.spawn_tool("source", &sender_ns, src_args, traffic.mptcp)?;
        // Its report (with a TCP reading every half second per flow) may outgrow the pipe.
        source.read_output()?;
        let start = Instant::now();
        let t_emu_start = start.duration_since(self.emu_started).as_secs_f64();
        let emu_before = self.emu_stats();
        let tcp_before = tcp_counters(&sender_ns);
        let deadline = start + traffic.duration + Duration::from_secs(60);
        let pause = sample_every(TIMELINE_EVERY).min(Duration::from_millis(100));
        while source.try_wait().is_none() {
            if interrupted() {
                bail!("interrupted");
            }
            if Instant::now() > deadline {
                bail!(
                    "the traffic run did not finish in time: {}",
                    source.log_tail()
                );
            }
            tick(self, start.elapsed().as_secs_f64())?;
            std::thread::sleep(pause);
        }
        let src_out = source.wait_output(Duration::from_secs(5), &interrupted)?;
        let sink_out = sink.wait_output(Duration::from_secs(30), &interrupted)?;
        let source: traffic::SourceReport = serde_json::from_str(src_out.trim())
            .with_context(|| format!("source report '{}'", src_out.trim()))?;
        let sink: traffic::SinkReport = serde_json::from_str(sink_out.trim())
            .with_context(|| format!("sink report '{}'", sink_out.trim()))?;
        // Steady part: from 1 s after the start to the end of the window.
        let hist = self.emu_stats_history();
        let emu_start = hist.iter().find(|s| s.t >= t_emu_start + 1.0).cloned();
        let emu_end = hist
            .iter()
            .rev()
            .find(|s| s.t <= t_emu_start + dur)
            .cloned();
        // Wait for a stats line from after the run.
        let t_done = self.emu_started.elapsed().as_secs_f64();
        let wait_until = Instant::now() + Duration::from_millis(1500);
        while self.emu_stats().is_none_or(|s| s.t < t_done) && Instant::now() < wait_until {
            std::thread::sleep(Duration::from_millis(20));
        }
        let emu_after = self.emu_stats();
        let tcp_after = tcp_counters(&sender_ns);
        Ok(TcpRun {
            direction: traffic.direction,
            sink,
            source,
            emu_start,
            emu_end,
            tcp_out_segs: tcp_after.0.saturating_sub(tcp_before.0),
            tcp_retrans_segs: tcp_after.1.saturating_sub(tcp_before.1),
            emu_before,
            emu_after,
        })
    }

    /// Writes the two endpoints' configs and starts `braid up` in each host; returns once every
    /// link is up and the tunnel carries a ping.
    pub fn start_bundle(
        &mut self,
        scheduler: Option<&str>,
        mtu: u32,
        bandwidth_hint: bool,
    ) -> anyhow::Result<()> {
        use base64::Engine;
        use rand::RngCore;
        let mut key = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut key);
        let key = base64::engine::general_purpose::STANDARD.encode(key);
        let mut sched = scheduler
            .map(|s| format!("scheduler = {}\n", toml_str(s)))
            .unwrap_or_default();
        if let Some(e) = self.equalize_max_ms {
            sched += &format!("equalize_max_ms = {e}\n");
        }
        if let Some(on) = self.backpressure {
            sched += &format!("backpressure = {on}\n");
        }
        if self.no_tunnel_ecn {
            sched += "ecn = false\n";
        }
        if self.no_clamp_window {
            sched += "clamp_window = false\n";
        }
        if self.hold_random_loss {
            sched += "hold_random_loss = true\n";
        }
        let dir = self.dir.0.clone();
        let server_ctl = dir.join("server.sock");
        let client_ctl = dir.join("client.sock");
        let server = format!(
            "[bundle]\nname = \"braid0\"\nrole = \"server\"\nkey = \"{key}\"\naddress = \"{TUNNEL_B}/30\"\nmtu = {mtu}\n\
             listen = \"0.0.0.0:{BRAID_PORT}\"\n{sched}control = {}\n",
            toml_str(&server_ctl.display().to_string())
        );
        let mut client = format!(
            "[bundle]\nname = \"braid0\"\nrole = \"client\"\nkey = \"{key}\"\naddress = \"{TUNNEL_A}/30\"\nmtu = {mtu}\n\
             {sched}control = {}\n",
            toml_str(&client_ctl.display().to_string())
        );
        for (i, s) in self.specs.iter().enumerate() {
            let n = i + 1;
            client += &format!(
                "\n[[link]]\nname = \"link{n}\"\nbind = \"{}\"\nremote = \"{}:{BRAID_PORT}\"\n",
                netns::addr_a(n),
                netns::addr_b(n)
            );
            if bandwidth_hint {
                // The emulated links are symmetric: the same rate both ways.
                client += &format!(
                    "bandwidth = {}\ndownload_bandwidth = {}\n",
                    s.rate_bps, s.rate_bps
                );
            }
        }
        let write = |name: &str, text: &str| -> anyhow::Result<PathBuf> {
            use std::os::unix::fs::OpenOptionsExt;
            let p = dir.join(name);
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&p)?;
            f.write_all(text.as_bytes())?;
            Ok(p)
        };
        let server_cfg = write("server.toml", &server)?;
        let client_cfg = write("client.toml", &client)?;
        // BRAID_LAB_LOG_LEVEL sets the endpoints' log filter (default "info"; "debug" adds a
        // link falling silent and speaking again), read in their logs with BRAID_LAB_KEEP=1.
        let level = std::env::var("BRAID_LAB_LOG_LEVEL").unwrap_or_else(|_| "info".into());
        let up = |cfg: &Path| {
            vec![
                "--log-level".to_string(),
                level.clone(),
                "up".into(),
                cfg.display().to_string(),
            ]
        };
        let srv = Proc::spawn(
            "braid up (server)",
            &self.topo.ns_b(),
            &self.exe,
            &up(&server_cfg),
            dir.join("server.log"),
        )?;
        self.endpoints.push(srv);
        std::thread::sleep(Duration::from_millis(100));
        let cli = Proc::spawn(
            "braid up (client)",
            &self.topo.ns_a(),
            &self.exe,
            &up(&client_cfg),
            dir.join("client.log"),
        )?;
        self.endpoints.push(cli);
        self.client_control = Some(client_ctl.clone());

        // Wait for every link to be alive at both ends, then for a ping through the tunnel.
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut last = String::from("no status yet");
        loop {
            if interrupted() {
                bail!("interrupted");
            }
            for ep in &mut self.endpoints {
                if let Some(st) = ep.try_wait() {
                    bail!("{} exited ({st}): {}", ep.name, ep.log_tail());
                }
            }
            if Instant::now() > deadline {
                bail!("the bundle did not come up within 15 s ({last})");
            }
            // Both ends: a flow started before the server knows a link's delay has its round
            // trip lengthened under it when the server's equalisation takes that link in
            // (`braid_core::equalize`), and measures the ramp, not the bundle.
            match endpoint_status(&client_ctl).and_then(|c| Ok((c, endpoint_status(&server_ctl)?)))
            {
                Ok((st, srv)) => {
                    let (up, total) = links_up(&st);
                    let (srv_up, _) = links_up(&srv);
                    last = format!("{up} of {total} links up ({srv_up} at the server)");
                    if total == self.specs.len() && up == total && srv_up == total {
                        let p = ping(&self.topo.ns_a(), TUNNEL_B, 1, Duration::from_millis(200))?;
                        if p.received == 1 {
                            return Ok(());
                        }
                        last = "links up but no ping through the tunnel".into();
                    }
                }
                Err(e) => last = format!("status: {e:#}"),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Checks that the endpoints still run.
    pub fn check_endpoints(&mut self) -> anyhow::Result<()> {
        for ep in &mut self.endpoints {
            if let Some(st) = ep.try_wait() {
                bail!("{} exited ({st}): {}", ep.name, ep.log_tail());
            }
        }
        Ok(())
    }
}

/// An endpoint's `status` reply, from its control socket.
fn endpoint_status(ctl: &Path) -> anyhow::Result<serde_json::Value> {
    braid_linux::control::request(ctl, &serde_json::json!({"cmd": "status"}))
}

fn toml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// Counts links that are alive, "up" or "degraded", in a `status` reply (tolerant of the reply's
/// exact shape), and all the links. A degraded link answers its probes and carries traffic; only
/// its loss is high. A link the run makes lossy on purpose (10% on one of two in
/// `lab_pulls_traffic_off_a_lossy_link`) reads about 10% loss from its probes alone, the
/// threshold of DEGRADED, and comes back UP only at 3%: once degraded before both ends were seen
/// up at the same poll, it stayed so, and the run gave up after 15 s (CI, 2026-11-27).
fn links_up(st: &serde_json::Value) -> (usize, usize) {
    let links = st
        .get("links")
        .and_then(|l| l.as_array())
        .cloned()
        .unwrap_or_default();
    let up = links
        .iter()
        .filter(|l| {
            l.get("state")
                .and_then(|s| s.as_str())
                .is_some_and(|s| s.eq_ignore_ascii_case("up") || s.eq_ignore_ascii_case("degraded"))
        })
        .count();
    (up, links.len())
}

/// Counters of one section (`Tcp:`, `MPTcpExt:`, ...) of `/proc/net/snmp` or
/// `/proc/net/netstat` inside namespace `ns`; empty if unreadable.
pub fn proc_counters(ns: &str, file: &str, section: &str) -> Vec<(String, u64)> {
    let Ok(out) = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "cat", file])
        .output()
    else {
        return Vec::new();
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.split_whitespace().next() == Some(section))
        .collect();
    if lines.len() < 2 {
        return Vec::new();
    }
    lines[0]
        .split_whitespace()
        .zip(lines[1].split_whitespace())
        .skip(1)
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect()
}

fn counter(counters: &[(String, u64)], key: &str) -> u64 {
    counters
        .iter()
        .find(|(k, _)| k == key)
        .map_or(0, |(_, v)| *v)
}

/// TCP OutSegs and RetransSegs of namespace `ns` (from its /proc/net/snmp); zeros if unreadable.
pub fn tcp_counters(ns: &str) -> (u64, u64) {
    let c = proc_counters(ns, "/proc/net/snmp", "Tcp:");
    (counter(&c, "OutSegs"), counter(&c, "RetransSegs"))
}

/// MPTCP connections the sender in `ns` opened as MPTCP (MP_CAPABLE answered) and subflows it
/// joined (MP_JOIN answered), from its `/proc/net/netstat`.
pub fn mptcp_counters(ns: &str) -> (u64, u64) {
    let c = proc_counters(ns, "/proc/net/netstat", "MPTcpExt:");
    (
        counter(&c, "MPCapableSYNACKRX"),
        counter(&c, "MPJoinSynAckRx"),
    )
}

/// Pings `dst` from namespace `ns` (`count` echo requests `interval` apart, each answered
/// within 2 s), as `ping -c COUNT -i INTERVAL -W 2` would, without the tool
/// ([`braid_linux::icmp`]).
pub fn ping(ns: &str, dst: &str, count: u32, interval: Duration) -> anyhow::Result<PingStats> {
    let addr: std::net::Ipv4Addr = dst
        .parse()
        .with_context(|| format!("ping: {dst:?} is not an IPv4 address"))?;
    let count = u16::try_from(count).context("ping: too many requests")?;
    let rtts = braid_linux::sysctl::in_netns(ns, || {
        braid_linux::icmp::ping(addr, count, interval, Duration::from_secs(2))
    })
    .with_context(|| format!("ping {dst} in {ns}"))?;
    Ok(PingStats::from_rtts(&rtts))
}

/// The default links: the classic Multilink PPP lab.
pub fn default_links() -> Vec<LinkSpec> {
    [1_000_000, 2_000_000, 3_000_000]
        .iter()
        .map(|&r| LinkSpec::new(r, Duration::from_millis(10)))
        .collect()
}

/// The live view: one line per second on stderr (redrawn in place on a terminal).
struct Live {
    enabled: bool,
    /// Index of the data direction in the emulator's counters.
    dir: usize,
    tty: bool,
    last_draw: f64,
    drawn: bool,
}

impl Live {
    fn new(enabled: bool, direction: Direction) -> Self {
        use std::io::IsTerminal;
        Live {
            enabled,
            dir: direction.emu_index(),
            tty: std::io::stderr().is_terminal(),
            last_draw: 0.0,
            drawn: false,
        }
    }

    fn tick(&mut self, lab: &Lab, label: &str, elapsed: f64, total: f64, only: Option<usize>) {
        if !self.enabled || elapsed - self.last_draw < 1.0 {
            return;
        }
        self.last_draw = elapsed;
        let hist = lab
            .stats
            .lock()
            .map(|v| v.iter().rev().take(2).cloned().collect::<Vec<_>>())
            .unwrap_or_default();
        if hist.len() < 2 || hist[0].t <= hist[1].t {
            return;
        }
        let (new, old) = (&hist[0], &hist[1]);
        let dt = new.t - old.t;
        let mut line = format!("{label:<7} {:>3.0}/{total:.0}s ", elapsed.min(total));
        let mut sum = 0.0;
        for (i, spec) in lab.specs.iter().enumerate() {
            if only.is_some_and(|o| o != i) {
                continue;
            }
            let d = self.dir;
            let rate = (new.links[i][d].bytes - old.links[i][d].bytes) as f64 * 8.0 / dt;
            sum += rate;
            let frac = (rate / spec.rate_bps as f64).clamp(0.0, 1.0);
            let filled = (frac * 10.0).round() as usize;
            line += &format!(
                " link{} {}{} {:>6.2}",
                i + 1,
                "█".repeat(filled),
                "·".repeat(10 - filled),
                rate / 1e6
            );
        }
        line += &format!("  = {:.2} Mbit/s", sum / 1e6);
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r\x1b[K{line}");
        } else {
            let _ = writeln!(err, "{line}");
        }
        let _ = err.flush();
        self.drawn = true;
    }

    fn end_run(&mut self) {
        if self.enabled && self.tty && self.drawn {
            eprint!("\r\x1b[K");
        }
        self.last_draw = 0.0;
        self.drawn = false;
    }
}

fn run_report(run: &TcpRun) -> RunReport {
    RunReport {
        goodput_bps: run.sink.goodput_bps,
        per_second_bps: run.sink.per_second_bps.clone(),
        longest_gap_ms: run.sink.longest_gap_ms,
        longest_gap_at_s: run.sink.longest_gap_at_s,
        longest_gap_per_second_ms: run.sink.longest_gap_per_second_ms.clone(),
        longest_gap_per_second_at_s: run.sink.longest_gap_per_second_at_s.clone(),
        survived: run.survived(),
        bytes_sent: run.source.flows.iter().map(|f| f.bytes_sent).sum(),
        bytes_received: run.sink.flows.iter().map(|f| f.bytes).sum(),
        errors: run
            .source
            .flows
            .iter()
            .filter_map(|f| f.error.clone())
            .chain(run.sink.flows.iter().filter_map(|f| f.error.clone()))
            .collect(),
        link_rates_bps: run.link_rates(),
        tcp_segments: run.tcp_out_segs,
        tcp_retransmits: run.tcp_retrans_segs,
        link_queue_drops: run.link_drops().iter().map(|d| d.0).collect(),
        link_lost: run.link_drops().iter().map(|d| d.1).collect(),
        link_ce_marks: run.link_counts(|s| s.ce_marks),
        link_aqm_drops: run.link_counts(|s| s.aqm_drops),
        sender_behind_pacing: run
            .source
            .flows
            .first()
            .and_then(|f| crate::traffic::behind_pacing(&f.tcp)),
        sender_tcp: run
            .source
            .flows
            .first()
            .map(|f| f.tcp.clone())
            .unwrap_or_default(),
        connect_ms: run.source.flows.first().and_then(|f| f.connect_ms),
    }
}

/// `braid lab`.
pub fn run_lab(args: LabArgs) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find the braid binary")?;
    install_signal_handlers()?;
    let report = run_lab_with(&args, exe).map_err(|e| {
        if interrupted() {
            anyhow::anyhow!("interrupted")
        } else {
            e
        }
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report::render(&report));
    }
    Ok(())
}

/// Runs the lab as `args` says, with `exe` as the braid binary, and returns the figures.
pub fn run_lab_with(args: &LabArgs, exe: PathBuf) -> anyhow::Result<LabReport> {
    if !is_root() {
        bail!("braid lab needs root to build network namespaces (CAP_SYS_ADMIN, CAP_NET_ADMIN): run it with sudo");
    }
    let specs = if args.links.is_empty() {
        default_links()
    } else {
        args.links.clone()
    };
    check_fail(args, specs.len())?;
    hostcheck::require_tools(hostcheck::LAB_TOOLS)?;
    if args.compare == Some(Compare::Mptcp) {
        hostcheck::require_tools(&[hostcheck::Tool {
            command: "mptcpize",
            package: "mptcpize",
        }])?;
    }
    let mut opts = LabOptions::new(exe);
    opts.queue_ms = args.queue_ms;
    opts.seed = args.seed;
    opts.cc = args.cc.clone();
    opts.ecn = args.ecn;
    opts.codel = args.codel;
    let direction = if args.reverse {
        Direction::Download
    } else {
        Direction::Upload
    };
    let mut live = Live::new(!args.quiet, direction);
    if !args.quiet {
        eprintln!(
            "braid lab: {} links ({}), {} s per run, {} flow(s), {}, {}; namespaces {}a/b/e",
            specs.len(),
            specs
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            args.duration,
            args.flows,
            match direction {
                Direction::Upload => "upload (A sends)",
                Direction::Download => "download (B sends)",
            },
            args.cc,
            opts.prefix
        );
    }
    let mut lab = Lab::start(&specs, &opts)?;
    let mut links = ping_links(&lab, &specs, args.queue_ms);
    let traffic = |dst: String, mptcp: bool| Traffic {
        dst,
        flows: args.flows,
        duration: Duration::from_secs_f64(args.duration),
        direction,
        mptcp,
    };
    let receiver = |i: usize| match direction {
        Direction::Upload => netns::addr_b(i),
        Direction::Download => netns::addr_a(i),
    };
    if !args.skip_single {
        for (i, link) in links.iter_mut().enumerate() {
            let label = format!("link{}", i + 1);
            let run = lab.run_traffic(&traffic(receiver(i + 1), false), &mut |lab, t| {
                live.tick(lab, &label, t, args.duration, Some(i));
                Ok(())
            })?;
            live.end_run();
            link.single = Some(run_report(&run));
        }
    }
    let compare = match args.compare {
        Some(Compare::Mptcp) => {
            lab.enable_mptcp()?;
            let (capable0, joined0) = mptcp_counters(&lab.hosts(direction).0);
            let (run, fail, _) = run_with_fail(
                &mut lab,
                &traffic(receiver(1), true),
                args,
                &mut live,
                "mptcp",
            )?;
            let (capable1, joined1) = mptcp_counters(&lab.hosts(direction).0);
            if capable1 <= capable0 {
                bail!(
                    "--compare mptcp: the connections fell back to plain TCP (no MP_CAPABLE \
                     answer): is net.mptcp.enabled 1 in the lab's namespaces?"
                );
            }
            if let Some(f) = &args.fail {
                lab.restore_link(f.link)?;
            }
            Some(CompareReport {
                name: "mptcp".into(),
                subflows_joined: joined1.saturating_sub(joined0),
                run: run_report(&run),
                fail,
            })
        }
        None => None,
    };
    let bundle = if args.skip_bundle {
        None
    } else {
        Some(run_bundle(
            &mut lab,
            args,
            &traffic(
                match direction {
                    Direction::Upload => TUNNEL_B.into(),
                    Direction::Download => TUNNEL_A.into(),
                },
                false,
            ),
            &mut live,
        )?)
    };
    let mut report = LabReport::new(
        opts.prefix.clone(),
        args.duration,
        args.flows,
        args.queue_ms,
        links,
        bundle,
    );
    report.tcp_congestion_control = args.cc.clone();
    report.tcp_ecn = args.ecn;
    report.codel = args.codel;
    report.direction = direction;
    report.set_compare(compare);
    Ok(report)
}

fn check_fail(args: &LabArgs, links: usize) -> anyhow::Result<()> {
    let Some(f) = &args.fail else {
        if args.restore.is_some() {
            bail!("--restore brings back the link --fail takes down: give --fail too");
        }
        return Ok(());
    };
    if f.link > links {
        bail!("--fail link{}: there are only {links} links", f.link);
    }
    if f.at.as_secs_f64() >= args.duration {
        bail!(
            "--fail at {:.1} s is not inside the {} s run",
            f.at.as_secs_f64(),
            args.duration
        );
    }
    if args.skip_bundle && args.compare.is_none() {
        bail!("--fail applies to the bundle run (and --compare's); it cannot go with --skip-bundle alone");
    }
    if let Some(r) = &args.restore {
        if r.link != f.link {
            bail!(
                "--restore link{} is not the link --fail takes down (link{})",
                r.link,
                f.link
            );
        }
        if r.at <= f.at || r.at.as_secs_f64() >= args.duration {
            bail!(
                "--restore at {:.1} s must come after --fail ({:.1} s) and inside the {} s run",
                r.at.as_secs_f64(),
                f.at.as_secs_f64(),
                args.duration
            );
        }
    }
    Ok(())
}

/// Idle round trip of every link, and the rows of the report they start.
fn ping_links(lab: &Lab, specs: &[LinkSpec], queue_ms: u64) -> Vec<LinkReport> {
    let mut links = Vec::new();
    for (i, s) in specs.iter().enumerate() {
        let n = i + 1;
        // One ping first so ARP is settled; then the idle RTT.
        let _ = lab.ping(n, 1, Duration::from_millis(50));
        let p = lab.ping(n, 5, Duration::from_millis(50)).ok();
        links.push(LinkReport {
            name: format!("link{n}"),
            spec: s.to_string(),
            rate_bps: s.rate_bps,
            delay_ms: s.delay.as_secs_f64() * 1e3,
            loss_pct: s.loss * 100.0,
            jitter_ms: s.jitter.as_secs_f64() * 1e3,
            queue_bytes: braid_core::netem::queue_limit_bytes(s.rate_bps, queue_ms),
            ping_rtt_ms: p.filter(|p| p.received > 0).map(|p| p.avg_ms),
            single: None,
        });
    }
    links
}

/// One traffic run over several links, taking `--fail`'s link down at its time (and back up at
/// `--restore`'s); with the bundle's endpoints running, their view every [`TIMELINE_EVERY`].
fn run_with_fail(
    lab: &mut Lab,
    traffic: &Traffic,
    args: &LabArgs,
    live: &mut Live,
    label: &str,
) -> anyhow::Result<(TcpRun, Option<FailReport>, Vec<EndsSample>)> {
    let (mut failed, mut restored) = (false, false);
    let (fail, restore) = (args.fail.clone(), args.restore.clone());
    let mut timeline = Vec::new();
    let every = sample_every(TIMELINE_EVERY).as_secs_f64();
    let run = lab.run_traffic(traffic, &mut |lab, t| {
        if lab.client_control().is_some() && timeline.len() as f64 * every <= t {
            timeline.push(lab.ends_sample(t));
        }
        if let Some(f) = &fail {
            if !failed && t >= f.at.as_secs_f64() {
                lab.fail_link(f.link)?;
                failed = true;
            }
        }
        if let Some(r) = &restore {
            if failed && !restored && t >= r.at.as_secs_f64() {
                lab.restore_link(r.link)?;
                restored = true;
            }
        }
        lab.check_endpoints()?;
        live.tick(lab, label, t, args.duration, None);
        Ok(())
    })?;
    live.end_run();
    let fail = args.fail.as_ref().map(|f| FailReport {
        link: format!("link{}", f.link),
        at_s: f.at.as_secs_f64(),
        restored_at_s: args.restore.as_ref().map(|r| r.at.as_secs_f64()),
        longest_gap_ms: run.sink.longest_gap_ms,
        stall_after_ms: run
            .sink
            .longest_gap_per_second_ms
            .iter()
            .skip((f.at.as_secs() as usize).saturating_sub(1))
            .fold(0.0, |a: f64, &b| a.max(b)),
        survived: run.survived(),
    });
    Ok((run, fail, timeline))
}

/// The bundle: two `braid up` endpoints, then the traffic through the tunnel.
fn run_bundle(
    lab: &mut Lab,
    args: &LabArgs,
    traffic: &Traffic,
    live: &mut Live,
) -> anyhow::Result<BundleReport> {
    let mtu = args.mtu.unwrap_or(MAX_TUNNEL_MTU);
    lab.equalize_max_ms = args.equalize_max;
    lab.backpressure = match (args.backpressure, args.no_backpressure) {
        (true, _) => Some(true),
        (_, true) => Some(false),
        _ => None,
    };
    lab.no_tunnel_ecn = args.no_tunnel_ecn;
    lab.no_clamp_window = args.no_clamp_window;
    lab.hold_random_loss = args.hold_random_loss;
    lab.start_bundle(args.scheduler.as_deref(), mtu, !args.no_bandwidth_hint)?;
    let (run, fail, timeline) = run_with_fail(lab, traffic, args, live, "bundle")?;
    let status = |p: Option<&Path>| p.and_then(|p| endpoint_status(p).ok());
    Ok(BundleReport {
        scheduler: args.scheduler.clone().unwrap_or_else(|| "default".into()),
        tunnel_mtu: mtu,
        fail,
        run: run_report(&run),
        client_status: status(lab.client_control()),
        server_status: status(lab.server_control().as_deref()),
        timeline,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_quantiles_are_nearest_rank() {
        let p = PingStats {
            rtts_ms: (1..=100).rev().map(f64::from).collect(),
            ..PingStats::default()
        };
        assert_eq!(p.quantile_ms(0.95), 95.0);
        assert_eq!(p.quantile_ms(0.0), 1.0);
        assert_eq!(p.quantile_ms(1.0), 100.0);
        assert_eq!(PingStats::default().quantile_ms(0.5), 0.0);
    }

    #[test]
    fn ping_summary_of_round_trips() {
        let ms = |v: u64| Some(Duration::from_millis(v));
        let p = PingStats::from_rtts(&[ms(30), None, ms(10), ms(20)]);
        assert_eq!((p.sent, p.received), (4, 3));
        assert_eq!((p.min_ms, p.avg_ms, p.max_ms), (10.0, 20.0, 30.0));
        assert_eq!(p.rtts_ms, vec![30.0, 10.0, 20.0]);
        let none = PingStats::from_rtts(&[None, None]);
        assert_eq!(
            (none.sent, none.received, none.min_ms, none.avg_ms),
            (2, 0, 0.0, 0.0)
        );
    }

    #[test]
    fn fail_spec() {
        assert_eq!(
            parse_fail("link2@10").unwrap(),
            FailSpec {
                link: 2,
                at: Duration::from_secs(10)
            }
        );
        assert_eq!(
            parse_fail("3@1.5s").unwrap(),
            FailSpec {
                link: 3,
                at: Duration::from_millis(1500)
            }
        );
        for bad in ["link2", "x@1", "link0@1", "link1@-1", "link1@abc"] {
            assert!(parse_fail(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn restore_must_bring_back_the_failed_link_later() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            lab: LabArgs,
        }
        let check = |args: &str| {
            let cli = <Cli as clap::Parser>::try_parse_from(
                std::iter::once("lab").chain(args.split_whitespace()),
            )
            .unwrap();
            check_fail(&cli.lab, 2).map_err(|e| e.to_string())
        };
        assert!(check("--duration 20 --fail link2@4 --restore link2@10").is_ok());
        let err = check("--duration 20 --restore link2@10").unwrap_err();
        assert!(err.contains("give --fail too"), "{err}");
        let err = check("--duration 20 --fail link2@4 --restore link1@10").unwrap_err();
        assert!(err.contains("not the link --fail takes down"), "{err}");
        for late in ["link2@4", "link2@3", "link2@20"] {
            let err = check(&format!("--duration 20 --fail link2@4 --restore {late}")).unwrap_err();
            assert!(err.contains("must come after --fail"), "{late}: {err}");
        }
    }

    #[test]
    fn tunnel_mtu_fits_the_underlay() {
        assert_eq!(MAX_TUNNEL_MTU + 58, UNDERLAY_MTU);
    }

    /// The ceiling counts one outer header per piece: up to 1480 a compressed segment fits a
    /// 1500-byte uplink in one datagram, 1481 and more are cut in two (docs/protocol.md §10.1).
    #[test]
    fn ceiling_counts_pieces() {
        let c = |m| (report::bundle_ceiling_of(m) * 10_000.0).round() / 100.0;
        assert_eq!(c(1442), 95.08); // 1390 / (1390 + 14 + 58)
        assert_eq!(c(1480), 95.2); // 1428 / 1500
        assert_eq!(c(1481), 91.66); // 1429 / (1443 + 2 x 58)
        assert_eq!(c(1500), 91.76); // 1448 / 1578
    }

    #[test]
    fn counts_links_up() {
        let st =
            serde_json::json!({"links": [{"state": "UP"}, {"state": "down"}, {"state": "up"}]});
        assert_eq!(links_up(&st), (2, 3));
        assert_eq!(links_up(&serde_json::json!({})), (0, 0));
        // A link made lossy on purpose is DEGRADED from its probes alone, and may stay so: it
        // is alive, and the run starts.
        let st = serde_json::json!({"links": [{"state": "up"}, {"state": "degraded"}]});
        assert_eq!(links_up(&st), (2, 2));
    }
}
