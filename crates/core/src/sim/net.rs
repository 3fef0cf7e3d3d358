//! The paths a simulated flow can take between the client's and the server's "TUN": a
//! [`Bundle`] (two braid endpoints over N links) or a [`DirectPath`] (one bare link, no braid),
//! behind one small trait, [`Path`], so that a traffic source runs unchanged over either; and
//! [`drive`], the loop that steps a path and a [`Traffic`] source through virtual time.
//!
//! Every link direction is a [`LinkModel`], the model the lab's emulator forwards real frames
//! through. Link rates count every byte of the IP packets on the link: for a bundle the outer
//! IPv4 and UDP headers of the tunnel included.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::{LinkEvent, LinkReport, LinkSpec};
use crate::endpoint::{BundleStats, Config, Endpoint, Event, LinkConfig, Role, IP_UDP_OVERHEAD};
use crate::health::LinkState;
use crate::netem::{LinkModel, Verdict};
use crate::LinkId;

/// One end of a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    Client,
    Server,
}

impl Side {
    pub fn other(self) -> Side {
        match self {
            Side::Client => Side::Server,
            Side::Server => Side::Client,
        }
    }
    /// 0 for client to server, 1 for server to client: the direction `self` sends in.
    fn dir(self) -> usize {
        self as usize
    }
}

/// A two-ended network carrying IP packets, in virtual time (time since the start of the run).
pub trait Path {
    /// An IP packet from `from`'s TUN at `now`.
    fn send(&mut self, now: Duration, from: Side, packet: &[u8]);
    /// When something is next due (an arrival, a timer).
    fn next_wakeup(&self) -> Option<Duration>;
    /// Handles everything due at `now`.
    fn advance(&mut self, now: Duration);
    /// The next IP packet for `to`'s TUN.
    fn poll_deliver(&mut self, now: Duration, to: Side) -> Option<Vec<u8>>;
    /// Gives a delivered buffer back.
    fn recycle(&mut self, _to: Side, _buf: Vec<u8>) {}
}

/// A source and sink of packets at both ends of a [`Path`].
pub trait Traffic {
    /// When the source next wants [`Traffic::on_timer`].
    fn next_wakeup(&self) -> Option<Duration>;
    fn on_timer<P: Path>(&mut self, now: Duration, path: &mut P);
    /// `packet` reached `to`'s TUN.
    fn on_deliver<P: Path>(&mut self, now: Duration, to: Side, packet: &[u8], path: &mut P);
}

/// Steps `path` and `traffic` from time zero to `end`; returns the last instant handled.
pub fn drive<P: Path, T: Traffic>(path: &mut P, traffic: &mut T, end: Duration) -> Duration {
    let mut now = Duration::ZERO;
    loop {
        let next = [path.next_wakeup(), traffic.next_wakeup()]
            .into_iter()
            .flatten()
            .min();
        match next {
            Some(t) if t <= end => now = now.max(t),
            _ => return now,
        }
        traffic.on_timer(now, path);
        path.advance(now);
        for to in [Side::Server, Side::Client] {
            while let Some(p) = path.poll_deliver(now, to) {
                traffic.on_deliver(now, to, &p, path);
                path.recycle(to, p);
            }
        }
    }
}

/// Time-ordered events, ties in insertion order.
#[derive(Debug)]
pub(crate) struct Timeline<T> {
    heap: BinaryHeap<Reverse<Entry<T>>>,
    order: u64,
}

#[derive(Debug)]
struct Entry<T> {
    at: Duration,
    order: u64,
    ev: T,
}

impl<T> PartialEq for Entry<T> {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.order) == (o.at, o.order)
    }
}
impl<T> Eq for Entry<T> {}
impl<T> PartialOrd for Entry<T> {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl<T> Ord for Entry<T> {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.order).cmp(&(o.at, o.order))
    }
}

impl<T> Timeline<T> {
    pub(crate) fn new() -> Self {
        Timeline {
            heap: BinaryHeap::new(),
            order: 0,
        }
    }
    pub(crate) fn push(&mut self, at: Duration, ev: T) {
        self.order += 1;
        self.heap.push(Reverse(Entry {
            at,
            order: self.order,
            ev,
        }));
    }
    pub(crate) fn next_at(&self) -> Option<Duration> {
        self.heap.peek().map(|Reverse(e)| e.at)
    }
    /// The earliest event due at or before `now`.
    pub(crate) fn pop_due(&mut self, now: Duration) -> Option<T> {
        if self.next_at()? > now {
            return None;
        }
        self.heap.pop().map(|Reverse(e)| e.ev)
    }
}

/// Both directions of one link, with a seed per direction as the lab's emulator seeds them.
fn link_pair(spec: &LinkSpec, seed: u64, i: usize) -> [LinkModel; 2] {
    [0, 1].map(|d| {
        LinkModel::new(
            spec.params(),
            spec.queue_bytes as u64,
            seed.wrapping_mul(1_000_003)
                .wrapping_add((2 * i + d) as u64),
        )
    })
}

/// One bare link between the two TUNs: what a flow gets without braid.
#[derive(Debug)]
pub struct DirectPath {
    base: Instant,
    /// Client to server, server to client.
    dirs: [LinkModel; 2],
    arrivals: Timeline<(Side, Vec<u8>)>,
    ready: [VecDeque<Vec<u8>>; 2],
}

impl DirectPath {
    pub fn new(spec: &LinkSpec, seed: u64) -> Self {
        DirectPath {
            base: Instant::now(),
            dirs: link_pair(spec, seed, 0),
            arrivals: Timeline::new(),
            ready: [VecDeque::new(), VecDeque::new()],
        }
    }
}

impl Path for DirectPath {
    fn send(&mut self, now: Duration, from: Side, packet: &[u8]) {
        if let Verdict::Deliver(at) = self.dirs[from.dir()].on_frame(self.base + now, packet.len())
        {
            let at = at.saturating_duration_since(self.base);
            self.arrivals.push(at, (from.other(), packet.to_vec()));
        }
    }
    fn next_wakeup(&self) -> Option<Duration> {
        self.arrivals.next_at()
    }
    fn advance(&mut self, now: Duration) {
        while let Some((to, p)) = self.arrivals.pop_due(now) {
            self.ready[to as usize].push_back(p);
        }
    }
    fn poll_deliver(&mut self, _now: Duration, to: Side) -> Option<Vec<u8>> {
        self.ready[to as usize].pop_front()
    }
}

/// How the two endpoints of a [`Bundle`] are set up.
#[derive(Debug, Clone)]
pub struct BundleOptions {
    pub scheduler: String,
    pub seed: u64,
    /// Probe interval (default 100 ms); very slow links want it longer.
    pub probe_interval: Option<Duration>,
    /// Bound of delay equalisation at both ends (default
    /// [`crate::endpoint::DEFAULT_EQUALIZE_MAX`]; zero turns it off).
    pub equalize_max: Option<Duration>,
    /// Counters start here (set-up, learning before).
    pub warmup: Duration,
    /// Which lost gaps receivers ask for again (`endpoint::Config::nack`; `None`: its default).
    pub nack: Option<crate::endpoint::Nack>,
    /// Back-pressure at both ends ([`Endpoint::set_backpressure`]): while the links are full,
    /// packets wait in each endpoint's bundle queue.
    pub backpressure: bool,
}

/// Per-direction counters of one link, from the end of the warm-up.
#[derive(Debug, Clone, Copy, Default)]
pub struct DirCounters {
    /// braid DATA packets the sending endpoint put on the link.
    pub data_packets: u64,
    pub queue_drops: u64,
    pub random_losses: u64,
}

#[derive(Debug)]
struct SimLink {
    spec: LinkSpec,
    dirs: [LinkModel; 2],
    dark: bool,
    dark_since: Option<Duration>,
    /// Per direction ([`Side::dir`]): what that side sends is lost.
    muted: [bool; 2],
    /// Per direction: when the sending endpoint last put DATA on this link.
    last_use: [Option<Duration>; 2],
    counters: [DirCounters; 2],
    detected_down_after: Option<Duration>,
}

#[derive(Debug)]
enum Ev {
    /// A datagram reaches the endpoint at `to` over `link`.
    Arrive {
        link: usize,
        to: Side,
        payload: Vec<u8>,
    },
    Link(LinkEvent),
}

fn client_addr(i: usize) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 18, (i + 1) as u8, 1)), 40000)
}

const SERVER_ADDR: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2)), 5050);

/// Two braid endpoints (client and server) over N simulated links.
pub struct Bundle {
    base: Instant,
    client: Endpoint,
    server: Endpoint,
    links: Vec<SimLink>,
    events: Timeline<Ev>,
    warmup: Duration,
    warm: bool,
    /// With `BRAID_SIM_TRACE` set: when the next trace line is due.
    next_trace: Option<Duration>,
}

impl Bundle {
    pub fn new(links: &[LinkSpec], opts: &BundleOptions) -> Self {
        let base = Instant::now();
        let endpoint = |role, salt: u64| {
            let mut cfg = Config::new(role, [7u8; 32]);
            cfg.scheduler = opts.scheduler.clone();
            if let Some(n) = opts.nack {
                cfg.nack = n;
            }
            if let Some(e) = opts.equalize_max {
                cfg.equalize_max = e;
            }
            if let Some(p) = opts.probe_interval {
                cfg.health.probe_interval = p;
                cfg.health.down_after = cfg.health.down_after.max(p * 3);
            }
            let rng = ChaCha8Rng::seed_from_u64(opts.seed ^ salt);
            let mut ep = Endpoint::new(cfg, base, Box::new(rng)).expect("scheduler");
            ep.set_backpressure(opts.backpressure);
            ep
        };
        let mut client = endpoint(Role::Client, 0xc1);
        let server = endpoint(Role::Server, 0x5e);
        for (i, l) in links.iter().enumerate() {
            let cfg = LinkConfig {
                name: format!("link{}", i + 1),
                bandwidth_bps: l.configure_bandwidth.then_some(l.rate_bps),
                priority: 0,
                download_bps: l.configure_bandwidth.then_some(l.rate_bps),
            };
            client.add_link(base, (i + 1) as LinkId, cfg).expect("link");
        }
        let links = links
            .iter()
            .enumerate()
            .map(|(i, spec)| SimLink {
                spec: spec.clone(),
                dirs: link_pair(spec, opts.seed, i),
                dark: false,
                dark_since: None,
                muted: [false; 2],
                last_use: [None; 2],
                counters: [DirCounters::default(); 2],
                detected_down_after: None,
            })
            .collect();
        Bundle {
            base,
            client,
            server,
            links,
            events: Timeline::new(),
            warmup: opts.warmup,
            warm: false,
            next_trace: std::env::var_os("BRAID_SIM_TRACE").map(|_| Duration::ZERO),
        }
    }

    /// `event` happens at `at`.
    pub fn schedule(&mut self, at: Duration, event: LinkEvent) {
        self.events.push(at, Ev::Link(event));
    }

    pub fn endpoint(&self, side: Side) -> &Endpoint {
        match side {
            Side::Client => &self.client,
            Side::Server => &self.server,
        }
    }

    fn endpoint_mut(&mut self, side: Side) -> &mut Endpoint {
        match side {
            Side::Client => &mut self.client,
            Side::Server => &mut self.server,
        }
    }

    pub fn instant(&self, now: Duration) -> Instant {
        self.base + now
    }

    /// Per link, for the packets `from` sends: its share of the DATA packets, drops, and (for
    /// a link that went dark) when the client declared it down and when `from` last used it.
    pub fn link_reports(&self, from: Side) -> Vec<LinkReport> {
        let d = from.dir();
        let total: u64 = self.links.iter().map(|l| l.counters[d].data_packets).sum();
        self.links
            .iter()
            .map(|l| {
                let c = l.counters[d];
                LinkReport {
                    share: if total > 0 {
                        c.data_packets as f64 / total as f64
                    } else {
                        0.0
                    },
                    sent_packets: c.data_packets,
                    queue_drops: c.queue_drops,
                    random_losses: c.random_losses,
                    detected_down_after_ms: l.detected_down_after.map(ms),
                    avoided_after_ms: match (l.dark_since, l.last_use[d]) {
                        (Some(since), Some(last)) => Some(ms(last.saturating_sub(since))),
                        _ => None,
                    },
                }
            })
            .collect()
    }

    /// Puts every datagram both endpoints have queued onto its link.
    fn transmit_all(&mut self, now: Duration) {
        for side in [Side::Client, Side::Server] {
            while let Some(tx) = self.endpoint_mut(side).poll_transmit() {
                let link = match side {
                    Side::Client => Some((tx.link as usize).wrapping_sub(1)),
                    Side::Server => tx
                        .dst
                        .and_then(|d| (0..self.links.len()).find(|&i| client_addr(i) == d)),
                };
                let payload = match link.filter(|&l| l < self.links.len()) {
                    Some(l) => self.put_on_link(now, side, l, tx.payload),
                    None => Some(tx.payload),
                };
                if let Some(p) = payload {
                    self.endpoint_mut(side).recycle(p);
                }
            }
        }
    }

    /// Offers one datagram to a link; gives it back if the link drops it.
    fn put_on_link(
        &mut self,
        now: Duration,
        from: Side,
        link: usize,
        payload: Vec<u8>,
    ) -> Option<Vec<u8>> {
        let inst = self.base + now;
        let warm = self.warm;
        let l = &mut self.links[link];
        let d = from.dir();
        // A whole DATA packet sent for the first time (no flags: not a copy, not a piece).
        let is_data = payload.first() == Some(&crate::wire::DATA_MARK);
        if is_data {
            l.last_use[d] = Some(now);
            if warm {
                l.counters[d].data_packets += 1;
            }
        }
        if l.dark || l.muted[d] {
            return Some(payload);
        }
        match l.dirs[d].on_frame(inst, payload.len() + IP_UDP_OVERHEAD) {
            // The simulator's links run no CoDel and its datagrams are not ECN-capable: no
            // marks; a drop by the queue is a drop by the queue whichever rule made it.
            Verdict::Deliver(at) | Verdict::Marked(at) => {
                let at = at.saturating_duration_since(self.base);
                let to = from.other();
                self.events.push(at, Ev::Arrive { link, to, payload });
                None
            }
            Verdict::Lost => {
                if is_data && warm {
                    l.counters[d].random_losses += 1;
                }
                Some(payload)
            }
            Verdict::QueueFull | Verdict::AqmDrop => {
                if is_data && warm {
                    l.counters[d].queue_drops += 1;
                }
                Some(payload)
            }
        }
    }

    fn handle_event(&mut self, now: Duration, ev: Ev) {
        let inst = self.base + now;
        match ev {
            Ev::Arrive {
                link,
                to: Side::Server,
                mut payload,
            } => {
                let from = client_addr(link);
                self.server.handle_datagram(inst, None, from, &mut payload);
                self.server.recycle(payload);
            }
            Ev::Arrive {
                link,
                to: Side::Client,
                mut payload,
            } => {
                let id = Some((link + 1) as LinkId);
                self.client
                    .handle_datagram(inst, id, SERVER_ADDR, &mut payload);
                self.client.recycle(payload);
            }
            Ev::Link(LinkEvent::Dark(i)) => {
                if let Some(l) = self.links.get_mut(i) {
                    l.dark = true;
                    l.dark_since = Some(now);
                }
            }
            Ev::Link(LinkEvent::Mute(i, side)) => {
                if let Some(l) = self.links.get_mut(i) {
                    l.muted[side.dir()] = true;
                }
            }
            Ev::Link(LinkEvent::Light(i)) => {
                if let Some(l) = self.links.get_mut(i) {
                    l.dark = false;
                    l.muted = [false; 2];
                }
            }
            Ev::Link(LinkEvent::Loss(i, loss)) => {
                if let Some(l) = self.links.get_mut(i) {
                    for d in &mut l.dirs {
                        d.set_loss(loss);
                    }
                }
            }
        }
    }

    /// The client's view of its links: when a dark link is declared down.
    fn handle_endpoint_events(&mut self, now: Duration) {
        while let Some(ev) = self.client.poll_event() {
            if let Event::LinkState {
                link,
                state: LinkState::Down,
            } = ev
            {
                let Some(l) = self.links.get_mut((link as usize).wrapping_sub(1)) else {
                    continue;
                };
                if let (Some(since), None) = (l.dark_since, l.detected_down_after) {
                    l.detected_down_after = Some(now - since);
                }
            }
        }
        while self.server.poll_event().is_some() {}
    }

    /// With `BRAID_SIM_TRACE`: every 250 ms, what each end knows of each link it sends on.
    fn trace(&mut self, now: Duration) {
        let Some(next) = self.next_trace.filter(|&t| now >= t) else {
            return;
        };
        self.next_trace = Some(next + Duration::from_millis(250));
        let inst = self.base + now;
        for (side, dir) in [("client", 0), ("server", 1)] {
            let st = if dir == 0 {
                self.client.stats(inst)
            } else {
                self.server.stats(inst)
            };
            self.trace_side(now, side, dir, &st);
        }
    }

    fn trace_side(&self, now: Duration, side: &str, dir: usize, st: &BundleStats) {
        let inst = self.base + now;
        let mut line = format!(
            "t={:6.2} {side} bq {:4} drop {:4} queued {:6} eq {:5.1}ms send {:5.1}ms",
            now.as_secs_f64(),
            st.queue_depth,
            st.drops.queue_delay,
            st.queued,
            st.equalize_us as f64 / 1e3,
            st.equalize_send_us as f64 / 1e3
        );
        for l in &st.links {
            // Link ids are 1-based indices into the simulated links (the server lists its links
            // in the order it learned them).
            let Some(sim) = self.links.get((l.id as usize).wrapping_sub(1)) else {
                continue;
            };
            let real_q = sim.dirs[dir].backlog(inst) as f64 * 8.0 / sim.spec.rate_bps as f64;
            line += &format!(
                " | {} {:?} sched {:6.2} dlv {:6.2} qd {:5.1}ms realq {:5.1}ms",
                l.name,
                l.state,
                l.sched_rate_bps.unwrap_or(0.0) / 1e6,
                l.delivery_rate_bps / 1e6,
                l.qdelay_us as f64 / 1e3,
                real_q * 1e3
            );
        }
        eprintln!("{line}");
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Path for Bundle {
    fn send(&mut self, now: Duration, from: Side, packet: &[u8]) {
        let inst = self.base + now;
        self.endpoint_mut(from).send_packet(inst, packet);
        self.transmit_all(now);
    }

    fn next_wakeup(&self) -> Option<Duration> {
        [
            self.events.next_at(),
            self.client
                .poll_timeout()
                .map(|t| t.saturating_duration_since(self.base)),
            self.server
                .poll_timeout()
                .map(|t| t.saturating_duration_since(self.base)),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn advance(&mut self, now: Duration) {
        self.trace(now);
        if !self.warm && now >= self.warmup {
            self.warm = true;
            self.server.clear_reorder_waits();
            self.client.clear_reorder_waits();
        }
        while let Some(ev) = self.events.pop_due(now) {
            self.handle_event(now, ev);
        }
        let inst = self.base + now;
        for side in [Side::Client, Side::Server] {
            let ep = self.endpoint_mut(side);
            if ep.poll_timeout().is_some_and(|t| t <= inst) {
                ep.handle_timeout(inst);
            }
        }
        self.transmit_all(now);
        self.handle_endpoint_events(now);
    }

    fn poll_deliver(&mut self, now: Duration, to: Side) -> Option<Vec<u8>> {
        let inst = self.base + now;
        self.endpoint_mut(to).poll_deliver(inst)
    }

    fn recycle(&mut self, to: Side, buf: Vec<u8>) {
        self.endpoint_mut(to).recycle(buf);
    }
}
