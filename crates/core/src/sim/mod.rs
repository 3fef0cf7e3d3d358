//! A deterministic network simulator: virtual time, seeded randomness, N links between two
//! [`crate::Endpoint`]s (smoltcp's `tests/netsim.rs` and quinn's `Pair` in spirit). Each
//! direction of each link is a [`crate::netem::LinkModel`], the model the lab's emulator uses:
//! rate, drop-tail queue, one-way delay, jitter in [-J, +J] (FIFO), loss.
//!
//! Parts: [`net`] holds the paths ([`Bundle`]: two endpoints over the links; [`DirectPath`]: one
//! bare link) and [`drive`], the loop that steps a path and a [`Traffic`] source through time.
//! Two sources run on them:
//! - [`run`]: one ordered stream of IP-sized packets from the client's "TUN" to the server's at a
//!   constant offered rate (open loop), reporting what the scheduler and reorder buffer made of
//!   it: delivered rate against the sum of the link rates, reorder wait, added latency, loss,
//!   duplicates, and how fast a link that goes dark is detected and avoided;
//! - [`run_tcp`] ([`tcp`]): one closed-loop bulk TCP flow (CUBIC-like or BBR-like, [`cc`]),
//!   upload or download, reporting goodput against the sum of the link rates and against the
//!   best single link alone ([`best_single_link`]).
//!
//! Link rates count every byte braid puts on the wire for a packet, the outer IPv4 and UDP
//! headers included ([`WIRE_OVERHEAD`] per tunnelled packet). "Offered load = sum of the link
//! rates" means the stream, once wrapped, exactly fills the links.

use std::time::Duration;

use crate::netem::{queue_limit_bytes, LinkParams, DEFAULT_QUEUE_MS};

pub mod cc;
pub mod net;
pub mod tcp;

pub use crate::endpoint::{IP_UDP_OVERHEAD, WIRE_OVERHEAD};
pub use cc::CcKind;
pub use net::{drive, Bundle, BundleOptions, DirCounters, DirectPath, Path, Side, Traffic};
pub use tcp::{
    best_single_link, failover_scenarios, run_tcp, run_tcp_single, tcp_scenarios,
    with_best_single_link, Direction, TcpReport, TcpScenario,
};

/// One simulated link (both directions alike).
#[derive(Debug, Clone)]
pub struct LinkSpec {
    pub rate_bps: u64,
    pub delay: Duration,
    /// Random deviation of the delay, uniform in `[-jitter, +jitter]`; a link never reorders its
    /// own packets.
    pub jitter: Duration,
    /// Random loss probability (0..1).
    pub loss: f64,
    /// Bottleneck queue limit in bytes (drop-tail).
    pub queue_bytes: usize,
    /// Tell the endpoint this rate as the link's configured bandwidth.
    pub configure_bandwidth: bool,
}

impl LinkSpec {
    /// A link of `rate_bps` and `delay` with the lab's default queue: 100 ms at its rate, at
    /// least [`crate::netem::MIN_QUEUE_BYTES`].
    pub fn new(rate_bps: u64, delay: Duration) -> Self {
        LinkSpec {
            rate_bps,
            delay,
            jitter: Duration::ZERO,
            loss: 0.0,
            queue_bytes: queue_limit_bytes(rate_bps, DEFAULT_QUEUE_MS) as usize,
            configure_bandwidth: false,
        }
    }
    /// The link model's view of this link.
    pub fn params(&self) -> LinkParams {
        LinkParams {
            rate_bps: self.rate_bps,
            delay: self.delay,
            jitter: self.jitter,
            loss: self.loss,
        }
    }
    pub fn loss(mut self, loss: f64) -> Self {
        self.loss = loss;
        self
    }
    pub fn jitter(mut self, jitter: Duration) -> Self {
        self.jitter = jitter;
        self
    }
    pub fn configured(mut self) -> Self {
        self.configure_bandwidth = true;
        self
    }
}

/// A link as the lab's `--link` reads it, with the lab's default queue.
impl From<crate::linkspec::LinkSpec> for LinkSpec {
    fn from(s: crate::linkspec::LinkSpec) -> Self {
        LinkSpec::new(s.rate_bps, s.delay)
            .loss(s.loss)
            .jitter(s.jitter)
    }
}

/// Something that happens to a link during a scenario.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LinkEvent {
    /// The link stops carrying anything, both ways.
    Dark(usize),
    /// What one end sends on the link is lost (the other way still carries), until
    /// [`LinkEvent::Light`].
    Mute(usize, net::Side),
    /// The link carries traffic again (both ways).
    Light(usize),
    /// The link's random loss (both ways) becomes this, in [0, 1).
    Loss(usize, f64),
}

#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: String,
    pub links: Vec<LinkSpec>,
    pub scheduler: String,
    pub duration: Duration,
    /// Offered load as a fraction of the sum of link rates (on the wire). 1.0 = full.
    pub load: f64,
    /// Size of each tunnelled IP packet.
    pub packet_size: usize,
    pub seed: u64,
    /// Packets sent before this are not counted (set-up, learning).
    pub warmup: Duration,
    pub events: Vec<(Duration, LinkEvent)>,
    /// Probe interval (default 100 ms); very slow links want it longer.
    pub probe_interval: Option<Duration>,
    /// Bound of delay equalisation at both ends (default [`crate::endpoint::DEFAULT_EQUALIZE_MAX`];
    /// zero turns it off).
    pub equalize_max: Option<Duration>,
    /// Back-pressure at both ends (off by default: these scenarios measure placement,
    /// reordering and failover at a fixed offered load that never backs off, and back-pressure
    /// would only move its excess from the links' buffers into the bundle's queue).
    pub backpressure: bool,
    /// A ping (a 64-byte packet of its own, which equalisation does not hold) this often beside
    /// the stream, its latency reported apart ([`Report::ping_latency_p99_ms`]).
    pub ping_every: Option<Duration>,
}

impl Scenario {
    pub fn new(name: &str, links: Vec<LinkSpec>) -> Self {
        Scenario {
            name: name.to_string(),
            links,
            scheduler: "adaptive".to_string(),
            duration: Duration::from_secs(20),
            load: 1.0,
            packet_size: 1400,
            seed: 1,
            warmup: Duration::from_secs(2),
            events: Vec::new(),
            probe_interval: None,
            equalize_max: None,
            backpressure: false,
            ping_every: None,
        }
    }
    pub fn backpressure(mut self, on: bool) -> Self {
        self.backpressure = on;
        self
    }
    pub fn pings(mut self, every: Duration) -> Self {
        self.ping_every = Some(every);
        self
    }
    pub fn scheduler(mut self, s: &str) -> Self {
        self.scheduler = s.to_string();
        self
    }
    pub fn duration(mut self, d: Duration) -> Self {
        self.duration = d;
        self
    }
    pub fn load(mut self, l: f64) -> Self {
        self.load = l;
        self
    }
    pub fn packet_size(mut self, n: usize) -> Self {
        self.packet_size = n;
        self
    }
    pub fn event(mut self, at: Duration, e: LinkEvent) -> Self {
        self.events.push((at, e));
        self
    }
    pub fn probe_interval(mut self, d: Duration) -> Self {
        self.probe_interval = Some(d);
        self
    }
    pub fn seed(mut self, s: u64) -> Self {
        self.seed = s;
        self
    }
    pub fn equalize_max(mut self, d: Duration) -> Self {
        self.equalize_max = Some(d);
        self
    }
    pub fn sum_rate_bps(&self) -> f64 {
        self.links.iter().map(|l| l.rate_bps as f64).sum()
    }
    /// Packets per second of the stream: `load` times what fills the links once wrapped.
    fn offered_pps(&self) -> f64 {
        self.sum_rate_bps() * self.load / ((self.packet_size + WIRE_OVERHEAD) as f64 * 8.0)
    }
    /// Offered rate in IP-packet bits per second.
    fn offered_bps(&self) -> f64 {
        self.offered_pps() * self.packet_size as f64 * 8.0
    }
    fn bundle_options(&self) -> BundleOptions {
        BundleOptions {
            scheduler: self.scheduler.clone(),
            seed: self.seed,
            probe_interval: self.probe_interval,
            equalize_max: self.equalize_max,
            warmup: self.warmup,
            nack: None,
            backpressure: self.backpressure,
        }
    }
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct LinkReport {
    /// Share of the stream's packets the sender put on this link (measured window).
    pub share: f64,
    pub sent_packets: u64,
    /// Packets dropped by this link's bottleneck queue (client to server).
    pub queue_drops: u64,
    /// Packets lost at random on this link (client to server).
    pub random_losses: u64,
    /// Client: when this link was declared DOWN after going dark.
    pub detected_down_after_ms: Option<f64>,
    /// Client: when the scheduler stopped using this link after it went dark.
    pub avoided_after_ms: Option<f64>,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Report {
    pub name: String,
    pub scheduler: String,
    pub sum_rate_bps: f64,
    /// Offered rate of the stream (IP packets).
    pub offered_bps: f64,
    /// Rate of unique packets delivered in the measured window (IP packets).
    pub delivered_bps: f64,
    /// `delivered_bps / offered_bps`: the share of the offered stream the bundle delivered.
    pub delivered_ratio: f64,
    /// Delivered rate counted on the wire (with braid's overhead) over the sum of link rates.
    pub wire_utilisation: f64,
    pub sent: u64,
    pub delivered: u64,
    pub lost: u64,
    pub duplicates: u64,
    /// Deliveries whose id was lower than an earlier delivery's (for ordered schedulers, only
    /// late packets: see `late_delivered`).
    pub out_of_order: u64,
    /// Packets the receiver's reorder buffer delivered late, out of order, after giving their
    /// gap up (`reorder::Pushed::OutOfOrder`).
    pub late_delivered: u64,
    pub reorder_max_depth: usize,
    pub reorder_wait_p50_ms: f64,
    pub reorder_wait_p99_ms: f64,
    /// End-to-end latency minus the fastest link's one-way delay.
    pub added_latency_p50_ms: f64,
    pub added_latency_p99_ms: f64,
    /// The pings' ([`Scenario::pings`]) added latency, 99th percentile, ms (0 without pings);
    /// a lost ping counts as 2 s.
    pub ping_latency_p99_ms: f64,
    /// Longest time without any delivery inside the measured window.
    pub longest_stall_ms: f64,
    pub links: Vec<LinkReport>,
}

impl Report {
    /// One row of the markdown table in BENCHMARKS.md.
    pub fn table_row(&self) -> String {
        let failover = self
            .links
            .iter()
            .filter_map(|l| l.detected_down_after_ms.map(|d| (d, l.avoided_after_ms)))
            .map(|(d, a)| match a {
                Some(a) => format!("down {d:.0} ms, avoided {a:.0} ms"),
                None => format!("down {d:.0} ms"),
            })
            .collect::<Vec<_>>()
            .join("; ");
        let shares = self
            .links
            .iter()
            .map(|l| format!("{:.0}", l.share * 100.0))
            .collect::<Vec<_>>()
            .join("/");
        format!(
            "| {} | {} | {:.2} | {:.2} | {:.1}% | {:.1}% | {} | {:.1} / {:.1} | {:.1} / {:.1} | {} | {} | {} |",
            self.name,
            self.scheduler,
            self.sum_rate_bps / 1e6,
            self.delivered_bps / 1e6,
            self.delivered_ratio * 100.0,
            self.wire_utilisation * 100.0,
            shares,
            self.reorder_wait_p50_ms,
            self.reorder_wait_p99_ms,
            self.added_latency_p50_ms,
            self.added_latency_p99_ms,
            self.lost,
            self.duplicates,
            if failover.is_empty() { "-".to_string() } else { failover },
        )
    }

    pub const TABLE_HEADER: &'static str = "| scenario | scheduler | sum Mbit/s | delivered Mbit/s | of offered | wire use | share % per link | reorder wait p50/p99 ms | added latency p50/p99 ms | lost | dup | failover |\n|---|---|---|---|---|---|---|---|---|---|---|---|";
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The open-loop stream: IP packets from the client's TUN at a constant rate, each carrying its
/// id and send time, and what the server's TUN made of them.
struct Stream {
    packet: Vec<u8>,
    gap: Duration,
    warmup: Duration,
    min_delay: Duration,
    next_send: Duration,
    next_id: u64,
    sent_measured: u64,
    first_measured_id: Option<u64>,
    seen: Vec<bool>,
    delivered: u64,
    duplicates: u64,
    out_of_order: u64,
    highest: Option<u64>,
    /// Added latency of each measured delivery, ms.
    added: Vec<f64>,
    last_delivery: Option<Duration>,
    longest_stall: Duration,
    pings: Pings,
}

/// The pings beside the stream, counted apart: a measured ping's id is [`PING_ID`] and its
/// index in `added`, an unmeasured one's [`PING_ID`] and [`PING_UNMEASURED`].
struct Pings {
    packet: Vec<u8>,
    every: Option<Duration>,
    next: Duration,
    /// Pings sent from the warm-up to a second before the end are measured.
    window: (Duration, Duration),
    /// Added latency of each measured ping, ms (`None`: not delivered yet).
    added: Vec<Option<f64>>,
}

const PING_ID: u64 = 1 << 63;
const PING_UNMEASURED: u64 = 1 << 62;

impl Pings {
    /// The id of a ping sent `now`.
    fn next_id(&mut self, now: Duration) -> u64 {
        if now >= self.window.0 && now < self.window.1 {
            self.added.push(None);
            PING_ID | (self.added.len() as u64 - 1)
        } else {
            PING_ID | PING_UNMEASURED
        }
    }

    /// A ping arrived (its first copy counts).
    fn delivered(&mut self, id: u64, added_ms: f64) {
        if id & PING_UNMEASURED == 0 {
            if let Some(slot @ None) = self.added.get_mut((id & !PING_ID) as usize) {
                *slot = Some(added_ms);
            }
        }
    }

    /// The measured pings' added latencies, sorted, a lost one as 2 s.
    fn sorted(&self) -> Vec<f64> {
        let mut v: Vec<f64> = self.added.iter().map(|a| a.unwrap_or(2000.0)).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        v
    }
}

impl Stream {
    fn new(sc: &Scenario) -> Self {
        // A plausible IPv4 header (one UDP flow), then id and send time.
        let mut packet = vec![0u8; sc.packet_size.max(36)];
        packet[0] = 0x45;
        packet[9] = 17;
        packet[12..16].copy_from_slice(&[198, 19, 0, 2]);
        packet[16..20].copy_from_slice(&[198, 19, 0, 1]);
        // A ping is the same header in 64 bytes: too small for equalisation to hold.
        let ping = packet[..64.min(packet.len())].to_vec();
        Stream {
            packet,
            gap: Duration::from_secs_f64(1.0 / sc.offered_pps()),
            warmup: sc.warmup,
            min_delay: sc.links.iter().map(|l| l.delay).min().unwrap_or_default(),
            next_send: Duration::from_millis(500),
            next_id: 0,
            sent_measured: 0,
            first_measured_id: None,
            seen: Vec::new(),
            delivered: 0,
            duplicates: 0,
            out_of_order: 0,
            highest: None,
            added: Vec::new(),
            last_delivery: None,
            longest_stall: Duration::ZERO,
            pings: Pings {
                packet: ping,
                every: sc.ping_every,
                next: Duration::from_millis(500),
                window: (
                    sc.warmup,
                    sc.duration.saturating_sub(Duration::from_secs(1)),
                ),
                added: Vec::new(),
            },
        }
    }

    /// Marks `id` delivered; false if it was already.
    fn first_delivery(&mut self, id: u64) -> bool {
        let idx = id as usize;
        if self.seen.len() <= idx {
            self.seen.resize(idx + 1, false);
        }
        !std::mem::replace(&mut self.seen[idx], true)
    }

    /// Packets still in flight at the end are not lost: `(counted, delivered of those)` over
    /// the packets sent early enough to have arrived.
    fn counted(&self, sc: &Scenario) -> (u64, u64) {
        let max_delay = sc
            .links
            .iter()
            .map(|l| l.delay + l.jitter)
            .max()
            .unwrap_or_default();
        let tail = Duration::from_millis(600) + max_delay * 2;
        let tail_packets = (tail.as_secs_f64() * sc.offered_pps()) as u64;
        let counted = self.sent_measured.saturating_sub(tail_packets);
        let first = self.first_measured_id.unwrap_or(0);
        let delivered = (first..first + counted)
            .filter(|&i| self.seen.get(i as usize).copied().unwrap_or(false))
            .count() as u64;
        (counted, delivered)
    }

    fn report(mut self, sc: &Scenario, bundle: &Bundle, end: Duration) -> Report {
        let (counted, delivered_counted) = self.counted(sc);
        let server = bundle.endpoint(Side::Server);
        let stats = server.stats(bundle.instant(end));
        if std::env::var_os("BRAID_SIM_DEBUG").is_some() {
            let client = bundle.endpoint(Side::Client).stats(bundle.instant(end));
            eprintln!("client: {client:#?}\nserver: {stats:#?}");
        }
        self.added.sort_by(|a, b| a.total_cmp(b));
        let pings = self.pings.sorted();
        let measured_window = sc.duration.saturating_sub(sc.warmup).as_secs_f64();
        let sum_rate = sc.sum_rate_bps();
        let delivered_bps = self.delivered as f64 * sc.packet_size as f64 * 8.0 / measured_window;
        let wire_size = sc.packet_size + WIRE_OVERHEAD;
        Report {
            name: sc.name.clone(),
            scheduler: sc.scheduler.clone(),
            sum_rate_bps: sum_rate,
            offered_bps: sc.offered_bps(),
            delivered_bps,
            delivered_ratio: delivered_bps / sc.offered_bps(),
            wire_utilisation: self.delivered as f64 * wire_size as f64 * 8.0
                / measured_window
                / sum_rate,
            sent: counted,
            delivered: delivered_counted,
            lost: counted.saturating_sub(delivered_counted),
            duplicates: self.duplicates,
            out_of_order: self.out_of_order,
            late_delivered: stats.reorder.late_delivered,
            reorder_max_depth: stats.reorder.max_depth,
            reorder_wait_p50_ms: server.reorder_wait_percentile(50.0).as_secs_f64() * 1e3,
            reorder_wait_p99_ms: server.reorder_wait_percentile(99.0).as_secs_f64() * 1e3,
            added_latency_p50_ms: percentile(&self.added, 50.0),
            added_latency_p99_ms: percentile(&self.added, 99.0),
            ping_latency_p99_ms: if pings.is_empty() {
                0.0
            } else {
                percentile(&pings, 99.0)
            },
            longest_stall_ms: self.longest_stall.as_secs_f64() * 1e3,
            links: bundle.link_reports(Side::Client),
        }
    }
}

impl Traffic for Stream {
    fn next_wakeup(&self) -> Option<Duration> {
        let ping = self.pings.every.map(|_| self.pings.next);
        Some(ping.map_or(self.next_send, |p| p.min(self.next_send)))
    }

    fn on_timer<P: Path>(&mut self, now: Duration, path: &mut P) {
        if let Some(every) = self.pings.every.filter(|_| self.pings.next <= now) {
            let id = self.pings.next_id(now);
            let p = &mut self.pings.packet;
            p[20..28].copy_from_slice(&id.to_be_bytes());
            p[28..36].copy_from_slice(&(now.as_nanos() as u64).to_be_bytes());
            path.send(now, Side::Client, &self.pings.packet);
            self.pings.next += every;
        }
        if self.next_send > now {
            return;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.packet[20..28].copy_from_slice(&id.to_be_bytes());
        self.packet[28..36].copy_from_slice(&(now.as_nanos() as u64).to_be_bytes());
        if now >= self.warmup {
            self.sent_measured += 1;
            self.first_measured_id.get_or_insert(id);
        }
        path.send(now, Side::Client, &self.packet);
        self.next_send += self.gap;
    }

    fn on_deliver<P: Path>(&mut self, now: Duration, to: Side, p: &[u8], _path: &mut P) {
        if to != Side::Server || p.len() < 36 {
            return;
        }
        let id = u64::from_be_bytes(p[20..28].try_into().expect("8 bytes"));
        let sent_ns = u64::from_be_bytes(p[28..36].try_into().expect("8 bytes"));
        let sent = Duration::from_nanos(sent_ns);
        if id & PING_ID != 0 {
            let lat = now.saturating_sub(sent).saturating_sub(self.min_delay);
            self.pings.delivered(id, lat.as_secs_f64() * 1e3);
            return;
        }
        if !self.first_delivery(id) {
            self.duplicates += 1;
        } else if self.first_measured_id.is_some_and(|f| id >= f) {
            self.delivered += 1;
            let lat = now
                .saturating_sub(Duration::from_nanos(sent_ns))
                .saturating_sub(self.min_delay);
            self.added.push(lat.as_secs_f64() * 1e3);
        }
        if self.highest.is_some_and(|h| id < h) {
            self.out_of_order += 1;
        }
        self.highest = Some(self.highest.map_or(id, |h| h.max(id)));
        if now >= self.warmup {
            if let Some(l) = self.last_delivery {
                self.longest_stall = self.longest_stall.max(now - l);
            }
        }
        self.last_delivery = Some(now);
    }
}

/// Runs a scenario to the end and reports.
pub fn run(sc: &Scenario) -> Report {
    let mut bundle = Bundle::new(&sc.links, &sc.bundle_options());
    for &(at, e) in &sc.events {
        bundle.schedule(at, e);
    }
    let mut stream = Stream::new(sc);
    let end = drive(&mut bundle, &mut stream, sc.duration);
    stream.report(sc, &bundle, end)
}

/// The lab's default links: 1, 2 and 3 Mbit/s, 10 ms each.
pub fn links_1_2_3() -> Vec<LinkSpec> {
    let ms = Duration::from_millis;
    vec![
        LinkSpec::new(1_000_000, ms(10)),
        LinkSpec::new(2_000_000, ms(10)),
        LinkSpec::new(3_000_000, ms(10)),
    ]
}

/// 10, 20 and 50 Mbit/s at one-way delays of 5, 20 and 40 ms.
pub fn links_10_20_50() -> Vec<LinkSpec> {
    let ms = Duration::from_millis;
    vec![
        LinkSpec::new(10_000_000, ms(5)),
        LinkSpec::new(20_000_000, ms(20)),
        LinkSpec::new(50_000_000, ms(40)),
    ]
}

/// The scenarios of issue 2, as run by the table in BENCHMARKS.md and by the scenario tests.
pub fn standard_scenarios() -> Vec<Scenario> {
    let ms = Duration::from_millis;
    vec![
        Scenario::new("1+2+3 Mbit/s, 10 ms", links_1_2_3()),
        Scenario::new("10/20/50 Mbit/s, 5/20/40 ms", links_10_20_50()),
        Scenario::new(
            "EQL 57600 + 14400 bit/s",
            vec![
                LinkSpec::new(57_600, ms(20)).configured(),
                LinkSpec::new(14_400, ms(20)).configured(),
            ],
        )
        .scheduler("weighted")
        .packet_size(200)
        .probe_interval(Duration::from_secs(1))
        .load(0.9)
        .duration(Duration::from_secs(120))
        .warmup(Duration::from_secs(10)),
        Scenario::new(
            "link 2 of 3 dark at 8 s",
            vec![
                LinkSpec::new(10_000_000, ms(10)),
                LinkSpec::new(10_000_000, ms(15)),
                LinkSpec::new(10_000_000, ms(20)),
            ],
        )
        .load(0.6)
        .event(Duration::from_secs(8), LinkEvent::Dark(1)),
        Scenario::new(
            "5% loss on one of 3 links",
            vec![
                LinkSpec::new(10_000_000, ms(10)).loss(0.05),
                LinkSpec::new(10_000_000, ms(10)),
                LinkSpec::new(10_000_000, ms(10)),
            ],
        ),
    ]
}

impl Scenario {
    pub fn warmup(mut self, d: Duration) -> Self {
        self.warmup = d;
        self
    }
}
