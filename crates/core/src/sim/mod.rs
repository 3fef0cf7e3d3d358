//! A deterministic network simulator: virtual time, seeded randomness, N links between two
//! [`Endpoint`]s, each direction of each link with a rate, a drop-tail bottleneck queue, a
//! one-way delay, jitter and loss (smoltcp's `tests/netsim.rs` and quinn's `Pair` in spirit).
//!
//! A scenario pushes one ordered stream of IP-sized packets from the client's "TUN" to the
//! server's at a constant offered rate and reports what the scheduler and reorder buffer made of
//! it: delivered rate against the sum of the link rates, reorder wait, added latency, loss,
//! duplicates, and how fast a link that goes dark is detected and avoided.
//!
//! Link rates count every byte braid puts on the wire for a packet, the outer IPv4 and UDP
//! headers included ([`WIRE_OVERHEAD`] per tunnelled packet). "Offered load = sum of the link
//! rates" means the stream, once wrapped, exactly fills the links.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::endpoint::{Config, Endpoint, Event, LinkConfig, Role};
use crate::health::LinkState;
use crate::LinkId;

pub use crate::endpoint::{IP_UDP_OVERHEAD, WIRE_OVERHEAD};

/// One simulated link (both directions alike).
#[derive(Debug, Clone)]
pub struct LinkSpec {
    pub rate_bps: u64,
    pub delay: Duration,
    /// Extra random delay, uniform in `[0, jitter]`; a link never reorders its own packets.
    pub jitter: Duration,
    /// Random loss probability (0..1).
    pub loss: f64,
    /// Bottleneck queue limit in bytes (drop-tail).
    pub queue_bytes: usize,
    /// Tell the endpoint this rate as the link's configured bandwidth.
    pub configure_bandwidth: bool,
}

impl LinkSpec {
    /// A link of `rate_bps` and `delay` with a queue of 100 ms at its rate (at least two
    /// full-size packets).
    pub fn new(rate_bps: u64, delay: Duration) -> Self {
        LinkSpec {
            rate_bps,
            delay,
            jitter: Duration::ZERO,
            loss: 0.0,
            queue_bytes: ((rate_bps / 8) as usize / 10).max(3000),
            configure_bandwidth: false,
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

/// Something that happens to a link during a scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkEvent {
    /// The link stops carrying anything, both ways.
    Dark(usize),
    /// The link carries traffic again.
    Light(usize),
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
        }
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
    /// Deliveries whose id was lower than an earlier delivery's (must be 0 for ordered schedulers).
    pub out_of_order: u64,
    pub reorder_max_depth: usize,
    pub reorder_wait_p50_ms: f64,
    pub reorder_wait_p99_ms: f64,
    /// End-to-end latency minus the fastest link's one-way delay.
    pub added_latency_p50_ms: f64,
    pub added_latency_p99_ms: f64,
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

/// One direction of one link: a serialization clock and a queue limit.
#[derive(Debug, Clone, Copy, Default)]
struct Pipe {
    busy_until: Duration,
    last_arrival: Duration,
}

#[derive(Debug)]
enum Ev {
    /// A datagram reaches the endpoint at the other end of `link`.
    Arrive {
        link: usize,
        to_server: bool,
        payload: Vec<u8>,
    },
    Link(LinkEvent),
}

struct Queued {
    at: Duration,
    order: u64,
    ev: Ev,
}

impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.order) == (o.at, o.order)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Queued {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.order).cmp(&(o.at, o.order))
    }
}

fn client_addr(i: usize) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 18, (i + 1) as u8, 1)), 40000)
}

const SERVER_ADDR: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2)), 5050);

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Runs a scenario to the end and reports.
pub fn run(sc: &Scenario) -> Report {
    let base = Instant::now();
    let mut rng = ChaCha8Rng::seed_from_u64(sc.seed);
    let psk = [7u8; 32];
    let mut ccfg = Config::new(Role::Client, psk);
    ccfg.scheduler = sc.scheduler.clone();
    let mut scfg = Config::new(Role::Server, psk);
    scfg.scheduler = sc.scheduler.clone();
    if let Some(e) = sc.equalize_max {
        ccfg.equalize_max = e;
        scfg.equalize_max = e;
    }
    if let Some(p) = sc.probe_interval {
        ccfg.health.probe_interval = p;
        scfg.health.probe_interval = p;
        ccfg.health.down_after = ccfg.health.down_after.max(p * 3);
        scfg.health.down_after = scfg.health.down_after.max(p * 3);
    }
    let mut client = Endpoint::new(
        ccfg,
        base,
        Box::new(ChaCha8Rng::seed_from_u64(sc.seed ^ 0xc1)),
    )
    .expect("scheduler");
    let mut server = Endpoint::new(
        scfg,
        base,
        Box::new(ChaCha8Rng::seed_from_u64(sc.seed ^ 0x5e)),
    )
    .expect("scheduler");
    for (i, l) in sc.links.iter().enumerate() {
        let cfg = LinkConfig {
            name: format!("link{}", i + 1),
            bandwidth_bps: l.configure_bandwidth.then_some(l.rate_bps),
            priority: 0,
        };
        client.add_link(base, (i + 1) as LinkId, cfg).expect("link");
    }

    let n = sc.links.len();
    let sum_rate: f64 = sc.links.iter().map(|l| l.rate_bps as f64).sum();
    let wire_size = sc.packet_size + WIRE_OVERHEAD;
    let offered_pps = sum_rate * sc.load / (wire_size as f64 * 8.0);
    let offered_bps = offered_pps * sc.packet_size as f64 * 8.0;
    let gap = Duration::from_secs_f64(1.0 / offered_pps);
    let min_delay = sc.links.iter().map(|l| l.delay).min().unwrap_or_default();

    let mut up = [Pipe::default(); 64].to_vec();
    let mut down = [Pipe::default(); 64].to_vec();
    up.truncate(n);
    down.truncate(n);
    let mut dark = vec![false; n];
    let mut dark_since: Vec<Option<Duration>> = vec![None; n];
    let mut reports: Vec<LinkReport> = vec![LinkReport::default(); n];
    let mut last_use: Vec<Option<Duration>> = vec![None; n];

    let mut heap: BinaryHeap<Reverse<Queued>> = BinaryHeap::new();
    let mut order = 0u64;
    for &(at, e) in &sc.events {
        order += 1;
        heap.push(Reverse(Queued {
            at,
            order,
            ev: Ev::Link(e),
        }));
    }

    // Stream state. Each packet: a plausible IPv4 header (one flow), then id and send time.
    let mut next_send = Duration::from_millis(500);
    let mut next_id: u64 = 0;
    let mut sent_measured = 0u64;
    let mut first_measured_id: Option<u64> = None;
    let mut seen = vec![false; 0];
    let mut delivered = 0u64;
    let mut duplicates = 0u64;
    let mut out_of_order = 0u64;
    let mut highest: Option<u64> = None;
    let mut added: Vec<f64> = Vec::new();
    let mut last_delivery: Option<Duration> = None;
    let mut longest_stall = Duration::ZERO;
    let mut packet = vec![0u8; sc.packet_size.max(36)];
    packet[0] = 0x45;
    packet[9] = 17;
    packet[12..16].copy_from_slice(&[198, 19, 0, 2]);
    packet[16..20].copy_from_slice(&[198, 19, 0, 1]);

    let end = sc.duration;
    let mut now = Duration::ZERO;
    let unif = |rng: &mut ChaCha8Rng| (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    let trace = std::env::var_os("BRAID_SIM_TRACE").is_some();
    let mut next_trace = Duration::ZERO;
    let mut warm = false;

    loop {
        // Next thing to happen.
        let mut t = next_send;
        if let Some(Reverse(q)) = heap.peek() {
            t = t.min(q.at);
        }
        for ep in [&client, &server] {
            if let Some(to) = ep.poll_timeout() {
                t = t.min(to.saturating_duration_since(base));
            }
        }
        if t > end {
            break;
        }
        now = t.max(now);
        let inst = base + now;

        if trace && now >= next_trace {
            next_trace += Duration::from_millis(250);
            let st = client.stats(inst);
            let mut line = format!("t={:6.2}", now.as_secs_f64());
            for (i, l) in st.links.iter().enumerate() {
                let q = up[i].busy_until.saturating_sub(now);
                line += &format!(
                    " | {} {:?} sched {:6.2} dlv {:6.2} qd {:5.1}ms realq {:5.1}ms",
                    l.name,
                    l.state,
                    l.sched_rate_bps.unwrap_or(0.0) / 1e6,
                    l.delivery_rate_bps / 1e6,
                    l.qdelay_us as f64 / 1e3,
                    q.as_secs_f64() * 1e3
                );
            }
            eprintln!("{line}");
        }
        if !warm && now >= sc.warmup {
            warm = true;
            server.clear_reorder_waits();
        }
        if next_send <= now {
            let id = next_id;
            next_id += 1;
            packet[20..28].copy_from_slice(&id.to_be_bytes());
            packet[28..36].copy_from_slice(&(now.as_nanos() as u64).to_be_bytes());
            if now >= sc.warmup {
                sent_measured += 1;
                first_measured_id.get_or_insert(id);
            }
            client.send_packet(inst, &packet);
            next_send += gap;
        }
        while heap.peek().is_some_and(|Reverse(q)| q.at <= now) {
            let Reverse(q) = heap.pop().expect("peeked");
            match q.ev {
                Ev::Arrive {
                    link,
                    to_server,
                    mut payload,
                } => {
                    if to_server {
                        server.handle_datagram(inst, None, client_addr(link), &mut payload);
                        server.recycle(payload);
                    } else {
                        client.handle_datagram(
                            inst,
                            Some((link + 1) as LinkId),
                            SERVER_ADDR,
                            &mut payload,
                        );
                        client.recycle(payload);
                    }
                }
                Ev::Link(LinkEvent::Dark(i)) if i < n => {
                    dark[i] = true;
                    dark_since[i] = Some(now);
                }
                Ev::Link(LinkEvent::Light(i)) if i < n => dark[i] = false,
                Ev::Link(_) => {}
            }
        }
        for ep in [&mut client, &mut server] {
            if ep.poll_timeout().is_some_and(|to| to <= inst) {
                ep.handle_timeout(inst);
            }
        }

        // Datagrams onto the links.
        for (is_client, ep) in [(true, &mut client), (false, &mut server)] {
            while let Some(tx) = ep.poll_transmit() {
                let link = if is_client {
                    (tx.link as usize).wrapping_sub(1)
                } else {
                    match tx.dst.and_then(|d| (0..n).find(|&i| client_addr(i) == d)) {
                        Some(i) => i,
                        None => {
                            ep.recycle(tx.payload);
                            continue;
                        }
                    }
                };
                if link >= n {
                    ep.recycle(tx.payload);
                    continue;
                }
                let spec = &sc.links[link];
                let is_data = tx.payload.get(1) == Some(&(crate::wire::PacketType::Data as u8));
                if is_client && is_data {
                    if now >= sc.warmup {
                        reports[link].sent_packets += 1;
                    }
                    last_use[link] = Some(now);
                }
                let pipe = if is_client {
                    &mut up[link]
                } else {
                    &mut down[link]
                };
                if dark[link] {
                    ep.recycle(tx.payload);
                    continue;
                }
                if spec.loss > 0.0 && unif(&mut rng) < spec.loss {
                    if is_client && is_data && now >= sc.warmup {
                        reports[link].random_losses += 1;
                    }
                    ep.recycle(tx.payload);
                    continue;
                }
                let bytes = tx.payload.len() + IP_UDP_OVERHEAD;
                let backlog = pipe.busy_until.saturating_sub(now);
                let queued = backlog.as_secs_f64() * spec.rate_bps as f64 / 8.0;
                if queued + bytes as f64 > spec.queue_bytes as f64 {
                    if is_client && is_data && now >= sc.warmup {
                        reports[link].queue_drops += 1;
                    }
                    ep.recycle(tx.payload);
                    continue;
                }
                let ser = Duration::from_secs_f64(bytes as f64 * 8.0 / spec.rate_bps as f64);
                pipe.busy_until = pipe.busy_until.max(now) + ser;
                let jitter = if spec.jitter.is_zero() {
                    Duration::ZERO
                } else {
                    spec.jitter.mul_f64(unif(&mut rng))
                };
                let arrive = (pipe.busy_until + spec.delay + jitter).max(pipe.last_arrival);
                pipe.last_arrival = arrive;
                order += 1;
                heap.push(Reverse(Queued {
                    at: arrive,
                    order,
                    ev: Ev::Arrive {
                        link,
                        to_server: is_client,
                        payload: tx.payload,
                    },
                }));
            }
        }

        // Deliveries at the server's "TUN".
        while let Some(p) = server.poll_deliver(inst) {
            if p.len() >= 36 {
                let id = u64::from_be_bytes(p[20..28].try_into().expect("8 bytes"));
                let sent_ns = u64::from_be_bytes(p[28..36].try_into().expect("8 bytes"));
                let idx = id as usize;
                if seen.len() <= idx {
                    seen.resize(idx + 1, false);
                }
                if seen[idx] {
                    duplicates += 1;
                } else {
                    seen[idx] = true;
                    if first_measured_id.is_some_and(|f| id >= f) {
                        delivered += 1;
                        let lat = now
                            .saturating_sub(Duration::from_nanos(sent_ns))
                            .saturating_sub(min_delay);
                        added.push(lat.as_secs_f64() * 1e3);
                    }
                }
                if highest.is_some_and(|h| id < h) {
                    out_of_order += 1;
                }
                highest = Some(highest.map_or(id, |h| h.max(id)));
                if now >= sc.warmup {
                    if let Some(l) = last_delivery {
                        longest_stall = longest_stall.max(now - l);
                    }
                }
                last_delivery = Some(now);
            }
            server.recycle(p);
        }
        while let Some(ev) = client.poll_event() {
            if let Event::LinkState {
                link,
                state: LinkState::Down,
            } = ev
            {
                let i = (link as usize).wrapping_sub(1);
                if let Some(since) = dark_since.get(i).copied().flatten() {
                    if reports[i].detected_down_after_ms.is_none() {
                        reports[i].detected_down_after_ms = Some((now - since).as_secs_f64() * 1e3);
                    }
                }
            }
        }
        while server.poll_event().is_some() {}
        while client.poll_deliver(inst).is_some() {}
    }

    // Packets still in flight at the end are not lost: count only those sent early enough.
    let measured_window = end.saturating_sub(sc.warmup).as_secs_f64();
    let max_delay = sc
        .links
        .iter()
        .map(|l| l.delay + l.jitter)
        .max()
        .unwrap_or_default();
    let tail = Duration::from_millis(600) + max_delay * 2;
    let tail_packets = (tail.as_secs_f64() * offered_pps) as u64;
    let counted = sent_measured.saturating_sub(tail_packets);
    let first = first_measured_id.unwrap_or(0);
    let delivered_counted = (first..first + counted)
        .filter(|&i| seen.get(i as usize).copied().unwrap_or(false))
        .count() as u64;
    let lost = counted.saturating_sub(delivered_counted);

    let stats = server.stats(base + now);
    if std::env::var_os("BRAID_SIM_DEBUG").is_some() {
        eprintln!(
            "client: {:#?}\nserver: {:#?}",
            client.stats(base + now),
            stats
        );
    }
    added.sort_by(|a, b| a.total_cmp(b));
    let total_sent: u64 = reports.iter().map(|r| r.sent_packets).sum();
    for (i, r) in reports.iter_mut().enumerate() {
        r.share = if total_sent > 0 {
            r.sent_packets as f64 / total_sent as f64
        } else {
            0.0
        };
        if let (Some(since), Some(last)) = (dark_since[i], last_use[i]) {
            r.avoided_after_ms = Some(last.saturating_sub(since).as_secs_f64() * 1e3);
        }
    }
    let delivered_bps = delivered as f64 * sc.packet_size as f64 * 8.0 / measured_window;
    Report {
        name: sc.name.clone(),
        scheduler: sc.scheduler.clone(),
        sum_rate_bps: sum_rate,
        offered_bps,
        delivered_bps,
        delivered_ratio: delivered_bps / offered_bps,
        wire_utilisation: delivered as f64 * wire_size as f64 * 8.0 / measured_window / sum_rate,
        sent: counted,
        delivered: delivered_counted,
        lost,
        duplicates,
        out_of_order,
        reorder_max_depth: stats.reorder.max_depth,
        reorder_wait_p50_ms: server.reorder_wait_percentile(50.0).as_secs_f64() * 1e3,
        reorder_wait_p99_ms: server.reorder_wait_percentile(99.0).as_secs_f64() * 1e3,
        added_latency_p50_ms: percentile(&added, 50.0),
        added_latency_p99_ms: percentile(&added, 99.0),
        longest_stall_ms: longest_stall.as_secs_f64() * 1e3,
        links: reports,
    }
}

/// The scenarios of issue 2, as run by the table in BENCHMARKS.md and by the scenario tests.
pub fn standard_scenarios() -> Vec<Scenario> {
    let ms = Duration::from_millis;
    vec![
        Scenario::new(
            "1+2+3 Mbit/s, 10 ms",
            vec![
                LinkSpec::new(1_000_000, ms(10)),
                LinkSpec::new(2_000_000, ms(10)),
                LinkSpec::new(3_000_000, ms(10)),
            ],
        ),
        Scenario::new(
            "10/20/50 Mbit/s, 5/20/40 ms",
            vec![
                LinkSpec::new(10_000_000, ms(5)),
                LinkSpec::new(20_000_000, ms(20)),
                LinkSpec::new(50_000_000, ms(40)),
            ],
        ),
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
