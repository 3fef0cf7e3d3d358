//! Schedulers: which link(s) carry the next packet. One trait, selectable by name.
//!
//! | name          | rule                                                                          |
//! |---------------|-------------------------------------------------------------------------------|
//! | `round-robin` | one packet per link in turn, by link id (bonding balance-rr)                   |
//! | `weighted`    | EQL leaky bucket per link at its configured bandwidth: least time to drain     |
//! | `adaptive`    | earliest predicted arrival; learns each link's rate (the default, see below)   |
//! | `flow-hash`   | each flow sticks to one link (rendezvous hashing); no reordering needed       |
//! | `redundant`   | every packet on every link given                                               |
//! | `backup`      | only the highest priority present; `adaptive` among those                     |
//!
//! Every scheduler keeps its per-link state keyed by [`LinkId`]: a link seen for the first time is
//! initialised, a link absent from the views for [`FORGET_AFTER`] is forgotten (a link that is
//! briefly DOWN keeps what was learned about it).
//!
//! # The `adaptive` model
//!
//! Each packet goes to the link where it is predicted to ARRIVE first (the lesson of Multilink
//! PPP and MPTCP: placing by arrival time keeps the receiver's reordering small):
//!
//! ```text
//! arrival_i = now + max(backlog_i * 8 / (rate_i * (1 - loss_i)), qdelay_i) + owd_i
//!             (+ DEGRADED_PENALTY when the link is DEGRADED)
//! ```
//!
//! - `backlog_i` is a virtual queue in bytes: a pick adds the packet's length, time drains it at
//!   `rate_i`. It models the link's bottleneck queue as fed by us. (When every link's virtual
//!   queue is longer than [`MAX_VIRTUAL_QUEUE`], they are all shortened by the same time so that
//!   their order is kept and the numbers stay bounded.)
//! - `qdelay_i` is the queueing delay the peer measured on the link (from one-way delays). It is
//!   a floor on the predicted queueing time: it reveals a queue the virtual one does not know
//!   about (the rate was overestimated, or someone else's traffic shares the bottleneck).
//! - `owd_i` is the endpoint's estimate of the path's one-way delay without queueing.
//! - `rate_i` is learned, every [`ADJUST_INTERVAL`] (or srtt, if longer):
//!   - it starts from the configured `bandwidth_bps`, else from the delivery rate if one is known,
//!     else [`INITIAL_RATE_BPS`] (never below that guess when unconfigured);
//!   - **probe up**: the link was kept busy by us (virtual backlog > 0 for at least
//!     [`BUSY_FRACTION`] of the interval) and the peer's `qdelay` is below [`QDELAY_LOW`]: the
//!     link could take more than we assumed: `rate *= INCREASE_GAIN` ([`STARTUP_GAIN`] until the
//!     first congestion signal, to find a fast link's rate in a few hundred milliseconds);
//!   - **back off**: `qdelay` above [`QDELAY_HIGH`] means a queue is building at the real
//!     bottleneck, which therefore delivers at its capacity: `rate = min(rate,
//!     DECREASE_TO * delivery_rate)` (glorytun's auto rate does the same with 0.875);
//!   - never below [`RATE_FLOOR_BPS`], so a usable link is never starved and keeps being measured.
//!
//! With offered load above the links' sum every virtual queue grows and the shares are
//! proportional to `rate_i`; a link given more than it can carry shows `qdelay` and is cut to
//! what it delivered, a link given less is busy without queueing and probes upwards. With light
//! load the virtual queues are empty and the packet goes to the lowest `owd` link; the next link
//! takes over only once the first one's queue makes it later than the second's one-way delay.
//!
//! Feeding it: the endpoint must fill `LinkView::owd` (base one-way delay, e.g. from the peer's
//! `owd_offset` plus half the minimum RTT), `qdelay`, `delivery_rate_bps`, `loss`, `srtt` from
//! [`crate::health::LinkHealth`], and call `pick` for every packet (the scheduler accounts the
//! bytes itself).

use std::time::{Duration, Instant};

use crate::{LinkId, LinkState};

/// What a scheduler knows about a link at the moment of a pick.
#[derive(Debug, Clone)]
pub struct LinkView {
    pub id: LinkId,
    pub state: LinkState,
    /// Configured priority (higher is preferred by `backup`).
    pub priority: u8,
    /// Configured bandwidth, bits per second.
    pub bandwidth_bps: Option<u64>,
    /// Rate at which the peer received our packets on this link recently, bit/s (0 = unknown).
    pub delivery_rate_bps: f64,
    pub srtt: Option<Duration>,
    /// Estimated one-way delay of the path without queueing.
    pub owd: Duration,
    /// Queueing delay the peer last reported on this link.
    pub qdelay: Duration,
    pub loss: f64,
}

impl LinkView {
    /// A view of an UP link with nothing known but its id (handy for tests and benches).
    pub fn new(id: LinkId) -> Self {
        LinkView {
            id,
            state: LinkState::Up,
            priority: 0,
            bandwidth_bps: None,
            delivery_rate_bps: 0.0,
            srtt: None,
            owd: Duration::ZERO,
            qdelay: Duration::ZERO,
            loss: 0.0,
        }
    }
}

pub trait Scheduler: Send {
    fn name(&self) -> &'static str;
    /// False when the receiver need not reorder (each flow stays on one link).
    fn ordered(&self) -> bool {
        true
    }
    /// Appends to `out` the link(s) that carry one packet of `len` bytes of flow `flow`.
    /// `links` is never empty; it holds the usable links (UP or DEGRADED), or every link when none
    /// is usable. Implementations account the packet to the chosen link(s) themselves.
    fn pick(
        &mut self,
        now: Instant,
        len: usize,
        flow: u64,
        links: &[LinkView],
        out: &mut Vec<LinkId>,
    );
    /// The rate (bit/s) the scheduler currently assumes for `link`, if it models one
    /// (`weighted`: the configured or substituted bandwidth; `adaptive`/`backup`: the learned rate).
    fn link_rate_bps(&self, _link: LinkId) -> Option<f64> {
        None
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown scheduler {0:?} (expected one of: round-robin, weighted, adaptive, flow-hash, redundant, backup)")]
pub struct UnknownScheduler(pub String);

pub const NAMES: &[&str] = &[
    "round-robin",
    "weighted",
    "adaptive",
    "flow-hash",
    "redundant",
    "backup",
];

pub fn by_name(name: &str) -> Result<Box<dyn Scheduler>, UnknownScheduler> {
    Ok(match name {
        "round-robin" => Box::new(RoundRobin::default()),
        "weighted" => Box::new(Weighted::default()),
        "adaptive" => Box::new(Adaptive::default()),
        "flow-hash" => Box::new(FlowHash),
        "redundant" => Box::new(Redundant),
        "backup" => Box::new(Backup::default()),
        other => return Err(UnknownScheduler(other.to_string())),
    })
}

/// Per-link state not seen in the views for this long is forgotten.
pub const FORGET_AFTER: Duration = Duration::from_secs(30);

/// Per-link state keyed by link id. A small vector: bundles have a handful of links, and a linear
/// scan over them beats hashing.
#[derive(Debug)]
struct LinkTable<T> {
    entries: Vec<(LinkId, Instant, T)>,
    last_prune: Option<Instant>,
}

impl<T> Default for LinkTable<T> {
    fn default() -> Self {
        LinkTable {
            entries: Vec::new(),
            last_prune: None,
        }
    }
}

impl<T> LinkTable<T> {
    /// The state of `id` (created by `init` if new), marked as seen at `now`.
    fn get_or_insert(&mut self, id: LinkId, now: Instant, init: impl FnOnce() -> T) -> usize {
        if let Some(i) = self.entries.iter().position(|e| e.0 == id) {
            self.entries[i].1 = now;
            i
        } else {
            self.entries.push((id, now, init()));
            self.entries.len() - 1
        }
    }
    fn get(&self, id: LinkId) -> Option<&T> {
        self.entries.iter().find(|e| e.0 == id).map(|e| &e.2)
    }
    /// Forgets links unseen for [`FORGET_AFTER`] (checked at most once a second).
    fn prune(&mut self, now: Instant) {
        match self.last_prune {
            Some(t) if now.saturating_duration_since(t) < Duration::from_secs(1) => {}
            _ => {
                self.last_prune = Some(now);
                self.entries
                    .retain(|e| now.saturating_duration_since(e.1) < FORGET_AFTER);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// round-robin

/// One packet per link in turn, in link-id order (so a link joining or leaving does not disturb
/// the others' turns).
#[derive(Debug, Default)]
pub struct RoundRobin {
    last: Option<LinkId>,
}

impl Scheduler for RoundRobin {
    fn name(&self) -> &'static str {
        "round-robin"
    }
    fn pick(
        &mut self,
        _now: Instant,
        _len: usize,
        _flow: u64,
        links: &[LinkView],
        out: &mut Vec<LinkId>,
    ) {
        // The smallest id above the last one picked, else the smallest id.
        let mut next: Option<LinkId> = None;
        let mut first: Option<LinkId> = None;
        for l in links {
            if first.map_or(true, |f| l.id < f) {
                first = Some(l.id);
            }
            if self.last.is_some_and(|last| l.id > last) && next.map_or(true, |n| l.id < n) {
                next = Some(l.id);
            }
        }
        if let Some(id) = next.or(first) {
            self.last = Some(id);
            out.push(id);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// weighted

/// Bandwidth assumed for links when no link of the bundle has one configured.
pub const DEFAULT_BANDWIDTH_BPS: f64 = 1_000_000.0;

/// EQL's leaky bucket: each link has a virtual queue drained at its configured bandwidth; a packet
/// goes where it would be sent out soonest (`(queued + len) * 8 / bps`, the least time to drain).
/// Shares are proportional to the bandwidths whatever their ratio, and at light load the fastest
/// link is used first.
#[derive(Debug, Default)]
pub struct Weighted {
    table: LinkTable<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    queued_bits: f64,
    last: Instant,
    bps: f64,
}

impl Weighted {
    /// Configured bandwidth of each link; links without one get the average of the others.
    fn bps_of(links: &[LinkView], l: &LinkView) -> f64 {
        if let Some(b) = l.bandwidth_bps.filter(|&b| b > 0) {
            return b as f64;
        }
        let (sum, n) = links
            .iter()
            .filter_map(|l| l.bandwidth_bps.filter(|&b| b > 0))
            .fold((0.0, 0u32), |(s, n), b| (s + b as f64, n + 1));
        if n > 0 {
            sum / n as f64
        } else {
            DEFAULT_BANDWIDTH_BPS
        }
    }
}

impl Scheduler for Weighted {
    fn name(&self) -> &'static str {
        "weighted"
    }
    fn pick(
        &mut self,
        now: Instant,
        len: usize,
        _flow: u64,
        links: &[LinkView],
        out: &mut Vec<LinkId>,
    ) {
        self.table.prune(now);
        let bits = len as f64 * 8.0;
        let mut best: Option<(usize, f64)> = None;
        for l in links {
            let bps = Self::bps_of(links, l);
            let i = self.table.get_or_insert(l.id, now, || Bucket {
                queued_bits: 0.0,
                last: now,
                bps,
            });
            let b = &mut self.table.entries[i].2;
            b.bps = bps;
            let dt = now.saturating_duration_since(b.last).as_secs_f64();
            b.last = now;
            b.queued_bits = (b.queued_bits - bps * dt).max(0.0);
            let drain = (b.queued_bits + bits) / bps;
            if best.map_or(true, |(_, d)| drain < d) {
                best = Some((i, drain));
            }
        }
        if let Some((i, _)) = best {
            let e = &mut self.table.entries[i];
            e.2.queued_bits += bits;
            out.push(e.0);
        }
    }
    fn link_rate_bps(&self, link: LinkId) -> Option<f64> {
        self.table.get(link).map(|b| b.bps)
    }
}

// ---------------------------------------------------------------------------------------------
// adaptive

/// First guess of a link's rate when neither a bandwidth nor a delivery rate is known.
pub const INITIAL_RATE_BPS: f64 = 1_000_000.0;
/// A usable link's learned rate never falls below this.
pub const RATE_FLOOR_BPS: f64 = 64_000.0;
/// How often the learned rate is adjusted (or every srtt, if longer).
pub const ADJUST_INTERVAL: Duration = Duration::from_millis(100);
/// Fraction of an interval the virtual queue must have been non-empty for the link to count as
/// kept busy by us.
pub const BUSY_FRACTION: f64 = 0.5;
/// Peer-reported queueing delay under which a busy link may carry more.
pub const QDELAY_LOW: Duration = Duration::from_millis(5);
/// Peer-reported queueing delay over which the link is overdriven.
pub const QDELAY_HIGH: Duration = Duration::from_millis(10);
/// Rate multiplier per interval when probing upwards.
pub const INCREASE_GAIN: f64 = 1.10;
/// Rate multiplier per interval until the link's first congestion signal.
pub const STARTUP_GAIN: f64 = 1.25;
/// On congestion the rate drops to this fraction of the measured delivery rate.
pub const DECREASE_TO: f64 = 0.9;
/// Added to the predicted arrival on a DEGRADED link (used only when the others are that late).
pub const DEGRADED_PENALTY: Duration = Duration::from_millis(50);
/// Bound on the (common part of the) virtual queues, in time.
pub const MAX_VIRTUAL_QUEUE: Duration = Duration::from_millis(500);

#[derive(Debug)]
struct AdaptiveLink {
    /// Learned rate, bit/s.
    rate: f64,
    /// Virtual queue, bytes.
    backlog: f64,
    /// Instant up to which the virtual queue has been drained.
    last: Instant,
    interval_start: Instant,
    busy: Duration,
    /// Until the first congestion signal, probe up faster.
    startup: bool,
    /// The configured bandwidth last seen (a change resets the rate to it).
    configured: Option<u64>,
}

impl AdaptiveLink {
    fn new(now: Instant, v: &LinkView) -> Self {
        let rate = match v.bandwidth_bps.filter(|&b| b > 0) {
            Some(b) => b as f64,
            None => sane(v.delivery_rate_bps).max(INITIAL_RATE_BPS),
        };
        AdaptiveLink {
            rate,
            backlog: 0.0,
            last: now,
            interval_start: now,
            busy: Duration::ZERO,
            startup: v.bandwidth_bps.is_none(),
            configured: v.bandwidth_bps,
        }
    }

    /// Drains the virtual queue up to `now`, accounting busy time.
    fn drain(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last);
        self.last = now;
        if self.backlog > 0.0 && !dt.is_zero() {
            let can = self.rate / 8.0 * dt.as_secs_f64();
            if can >= self.backlog {
                self.busy += Duration::from_secs_f64(
                    (self.backlog / (self.rate / 8.0)).min(dt.as_secs_f64()),
                );
                self.backlog = 0.0;
            } else {
                self.busy += dt;
                self.backlog -= can;
            }
        }
    }

    /// Learns the rate from what the peer reports (see the module docs).
    fn adjust(&mut self, now: Instant, v: &LinkView) {
        if v.bandwidth_bps != self.configured {
            self.configured = v.bandwidth_bps;
            if let Some(b) = v.bandwidth_bps.filter(|&b| b > 0) {
                self.rate = b as f64;
            }
        }
        let interval = ADJUST_INTERVAL.max(v.srtt.unwrap_or(Duration::ZERO));
        let elapsed = now.saturating_duration_since(self.interval_start);
        if elapsed < interval {
            return;
        }
        let busy = self.busy.as_secs_f64() / elapsed.as_secs_f64();
        let delivered = sane(v.delivery_rate_bps);
        if v.qdelay > QDELAY_HIGH && delivered > 0.0 {
            self.startup = false;
            self.rate = self.rate.min(DECREASE_TO * delivered);
        } else if busy >= BUSY_FRACTION && v.qdelay < QDELAY_LOW {
            self.rate *= if self.startup {
                STARTUP_GAIN
            } else {
                INCREASE_GAIN
            };
        }
        self.rate = sane(self.rate).max(RATE_FLOOR_BPS);
        self.interval_start = now;
        self.busy = Duration::ZERO;
    }

    /// Predicted queueing time of a packet of `len` bytes placed here now.
    fn queue_time(&self, len: usize, v: &LinkView) -> f64 {
        let keep = (1.0 - sane(v.loss)).clamp(0.05, 1.0);
        let vq = (self.backlog + len as f64) * 8.0 / (self.rate * keep);
        vq.max(v.qdelay.as_secs_f64())
    }
}

/// Finite and non-negative, else 0.
fn sane(x: f64) -> f64 {
    if x.is_finite() && x > 0.0 {
        x
    } else {
        0.0
    }
}

/// Earliest predicted arrival (the default scheduler); see the module docs.
#[derive(Debug, Default)]
pub struct Adaptive {
    table: LinkTable<AdaptiveLink>,
}

impl Adaptive {
    /// The rate (bit/s) currently assumed for `link`.
    pub fn rate_bps(&self, link: LinkId) -> Option<f64> {
        self.table.get(link).map(|l| l.rate)
    }
    /// The virtual queue of `link`, bytes.
    pub fn backlog_bytes(&self, link: LinkId) -> Option<f64> {
        self.table.get(link).map(|l| l.backlog)
    }
}

impl Scheduler for Adaptive {
    fn name(&self) -> &'static str {
        "adaptive"
    }
    fn pick(
        &mut self,
        now: Instant,
        len: usize,
        _flow: u64,
        links: &[LinkView],
        out: &mut Vec<LinkId>,
    ) {
        self.table.prune(now);
        let mut best: Option<(usize, f64)> = None;
        let mut min_queue = f64::INFINITY;
        for v in links {
            let i = self
                .table
                .get_or_insert(v.id, now, || AdaptiveLink::new(now, v));
            let st = &mut self.table.entries[i].2;
            st.drain(now);
            st.adjust(now, v);
            min_queue = min_queue.min(st.backlog * 8.0 / st.rate);
            let mut arrival = st.queue_time(len, v) + v.owd.as_secs_f64();
            if v.state == LinkState::Degraded {
                arrival += DEGRADED_PENALTY.as_secs_f64();
            }
            if best.map_or(true, |(_, a)| arrival < a) {
                best = Some((i, arrival));
            }
        }
        let Some((i, _)) = best else { return };
        let e = &mut self.table.entries[i];
        e.2.backlog += len as f64;
        out.push(e.0);
        // Keep the virtual queues bounded without changing their order.
        let excess = min_queue - MAX_VIRTUAL_QUEUE.as_secs_f64();
        if excess > 0.0 {
            for v in links {
                if let Some(e) = self.table.entries.iter_mut().find(|e| e.0 == v.id) {
                    e.2.backlog = (e.2.backlog - excess * e.2.rate / 8.0).max(0.0);
                }
            }
        }
    }
    fn link_rate_bps(&self, link: LinkId) -> Option<f64> {
        self.rate_bps(link)
    }
}

// ---------------------------------------------------------------------------------------------
// flow-hash

/// Each flow on one link, chosen by rendezvous (highest random weight) hashing over link ids: when
/// a link leaves only its flows move, when one joins it takes only its fair share of flows.
#[derive(Debug, Default)]
pub struct FlowHash;

/// splitmix64's finaliser: a fast, well-mixed 64-bit hash.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Scheduler for FlowHash {
    fn name(&self) -> &'static str {
        "flow-hash"
    }
    fn ordered(&self) -> bool {
        false
    }
    fn pick(
        &mut self,
        _now: Instant,
        _len: usize,
        flow: u64,
        links: &[LinkView],
        out: &mut Vec<LinkId>,
    ) {
        let f = mix64(flow);
        let best = links
            .iter()
            .map(|l| {
                (
                    mix64(f ^ (l.id as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
                    l.id,
                )
            })
            .max();
        if let Some((_, id)) = best {
            out.push(id);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// redundant

/// Every packet on every link given (the receiver keeps the first copy).
#[derive(Debug, Default)]
pub struct Redundant;

impl Scheduler for Redundant {
    fn name(&self) -> &'static str {
        "redundant"
    }
    fn pick(
        &mut self,
        _now: Instant,
        _len: usize,
        _flow: u64,
        links: &[LinkView],
        out: &mut Vec<LinkId>,
    ) {
        out.extend(links.iter().map(|l| l.id));
    }
}

// ---------------------------------------------------------------------------------------------
// backup

/// Only the links of the highest priority present carry traffic (`adaptive` among them); a lower
/// priority link is used only while no higher one is usable (the caller passes usable links only).
#[derive(Debug, Default)]
pub struct Backup {
    inner: Adaptive,
    scratch: Vec<LinkView>,
}

impl Scheduler for Backup {
    fn name(&self) -> &'static str {
        "backup"
    }
    fn pick(
        &mut self,
        now: Instant,
        len: usize,
        flow: u64,
        links: &[LinkView],
        out: &mut Vec<LinkId>,
    ) {
        let Some(top) = links.iter().map(|l| l.priority).max() else {
            return;
        };
        self.scratch.clear();
        self.scratch
            .extend(links.iter().filter(|l| l.priority == top).cloned());
        self.inner.pick(now, len, flow, &self.scratch, out);
    }
    fn link_rate_bps(&self, link: LinkId) -> Option<f64> {
        self.inner.rate_bps(link)
    }
}
