//! Schedulers: which link(s) carry the next packet. One trait, selectable by name.
//!
//! | name          | rule                                                                          |
//! |---------------|-------------------------------------------------------------------------------|
//! | `round-robin` | one packet per link in turn, by link id (bonding balance-rr)                   |
//! | `weighted`    | EQL leaky bucket per link at its configured bandwidth, in virtual time         |
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
//! arrival_i = now + backlog_i * 8 / (rate_i * (1 - loss_i)) + owd_i
//!             (+ DEGRADED_PENALTY when the link is DEGRADED)
//! ```
//!
//! - `backlog_i` is a virtual queue in bytes: a pick adds the packet's length, time drains it at
//!   `rate_i`. It models the link's bottleneck queue as fed by us, and is pulled towards the real
//!   one at every adjustment ([`RECONCILE_GAIN`] of the difference between the peer's `qdelay`
//!   and the virtual queue's delay one interval earlier). When even the best link's
//!   queue would exceed the bundle's queue limit (about one RTT, see [`MIN_QUEUE_LIMIT`]) and
//!   the peer measures a standing queue of at least half that limit on every link, the packet
//!   is dropped at the sender, so that the real queues stay short and equal to the virtual
//!   ones. (Without the second condition a rate learned too low, e.g. by a back-off while the
//!   inner TCP's slow start made the delivery rate lag, dropped packets the links could carry
//!   and left the inner TCP with a window below the path's capacity.)
//! - `qdelay_i` is the queueing delay the peer measured on the link (from one-way delays). It
//!   corrects the virtual queue and the rate (below) rather than entering the prediction
//!   directly: it is one trip old, and steering by it made the queues swing.
//! - `owd_i` is the endpoint's estimate of the path's one-way delay without queueing.
//! - `rate_i` is learned, every [`ADJUST_INTERVAL`] (or srtt, if longer):
//!   - it starts from the configured `bandwidth_bps`, else from the delivery rate if one is known,
//!     else [`INITIAL_RATE_BPS`] (never below that guess when unconfigured);
//!   - **start-up**: until the link's first congestion signal, a link kept busy by us (virtual
//!     backlog > 0 for at least [`BUSY_FRACTION`] of the interval) whose `qdelay` is below
//!     [`QDELAY_LOW`] gets `rate = max(rate, STARTUP_GAIN * delivery_rate)`: the rate grows by
//!     about that factor per round trip from a guess that may be far too low, and never exceeds
//!     the capacity by more than that factor (BBR's start-up, in spirit); start-up also ends,
//!     with `rate = delivery_rate`, once the delivery rate has stopped growing (by
//!     [`PLATEAU_GROWTH`]) over [`PLATEAU_ROUNDS`] adjustments in a row in which the link was
//!     kept busy and showed a *standing queue*: at least [`STANDING_QDELAY`] and
//!     [`STANDING_PACKETS`] packets' time at its delivery rate (BBR's full-pipe test; a fast link
//!     with a shallow buffer never shows [`QDELAY_HIGH`]);
//!   - **hold**: a link kept busy with such a standing queue that delivers less than the
//!     assumed rate gets `rate = delivery_rate` (at most [`MAX_DECREASE`] lower per adjustment);
//!   - **probe up**: after start-up, the same conditions plus evidence (the link delivered at
//!     least [`RAISE_EVIDENCE`] of the assumed rate) and no standing queue give
//!     `rate = max(rate, delivery_rate) * INCREASE_GAIN`; the evidence condition keeps a link fed
//!     with stale or partial signals from being inflated without bound;
//!   - **floor**: otherwise a link that delivered more than the assumed rate gets
//!     `rate = delivery_rate` (it can carry at least that: this lifts a rate stuck with `qdelay`
//!     between the thresholds, e.g. because of jitter on a slow link);
//!   - **back off**: `qdelay` above [`QDELAY_HIGH`] means a standing queue at the real
//!     bottleneck, which therefore delivers at its capacity: `rate = DECREASE_TO *
//!     delivery_rate` (glorytun's auto rate does the same with 0.875). This also corrects a rate
//!     guessed too low. Earliest-arrival placement deliberately keeps a standing queue on fast
//!     links (up to the delay difference to the slower links in use); there the rate is thus
//!     pinned to what the link delivers, which is its capacity as long as that queue exists;
//!   - never below [`RATE_FLOOR_BPS`], so a usable link is never starved and keeps being measured;
//!   - after start-up the thresholds of these rules are at least [`LOW_PACKETS`] and
//!     [`HIGH_PACKETS`] full-size packets' time at the link's rate: on a slow link a few packets
//!     sent back to back read as several milliseconds of queue, a burst's, not a standing one.
//!
//!   With back-pressure on (`ready_in` asked), a link past its start-up learns by delivery rate
//!   alone instead (`Held`): back-pressure offers it no more than its rate, so nothing else
//!   would lift it.
//! - A held link (and its virtual queue's reconcile) reads `qdelay` less the part of it that
//!   braid's own queue does not explain (`DelayFloor`): what the peer read above the virtual
//!   queue at each of the last [`FLOOR_ROUNDS`] adjustments, a jittery link's delay under load
//!   rather than a queue.
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

use crate::health::LossTally;
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
    /// Packets per second `loss` rests on lately (`None`: unknown, the estimate is trusted).
    pub loss_basis_pps: Option<f64>,
    /// The link's packets counted by the peer's reports so far, lost or not (`None`: unknown;
    /// loss pull-back then waits out [`PULLBACK_QUIET`] after a queue).
    pub loss_tally: Option<LossTally>,
    /// How many of our DATA datagrams the link's path marked Congestion Experienced this
    /// session, as the peer counts them (LINK-CE; wrapping): a rise is the path's AQM saying
    /// the link's queue stood too long, `adaptive`'s signal to back the link off.
    pub ce_marks: u32,
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
            loss_basis_pps: None,
            loss_tally: None,
            ce_marks: 0,
        }
    }
}

pub trait Scheduler: Send {
    fn name(&self) -> &'static str;
    /// False when the receiver need not reorder (each flow stays on one link).
    fn ordered(&self) -> bool {
        true
    }
    /// Appends to `out` the link(s) that carry one packet of `len` bytes of flow `flow`, or
    /// nothing: the packet is dropped at the sender (`adaptive` and `backup` when even the best
    /// link's queue is over the bundle's queue limit).
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
    /// The queue the scheduler believes `link` holds (its virtual queue at the assumed rate),
    /// if it models one. Set against the queueing delay the peer measures, it shows a placement
    /// working from a wrong picture (a rate learned too high drains the model faster than the
    /// link).
    fn link_queue(&self, _now: Instant, _link: LinkId) -> Option<Duration> {
        None
    }
    /// Whether `link` is held back for its loss (see [`PULLBACK_LOSS`]), if the scheduler
    /// pulls links back: a link that is up but carries only its probes.
    fn link_pulled_back(&self, _link: LinkId) -> Option<bool> {
        None
    }
    /// Back-pressure: how long until a packet of `len` bytes could be placed on some link
    /// without being later than [`BACKPRESSURE_LATE`] behind the links' queues (`None`: now).
    /// The endpoint keeps the traffic waiting in the bundle's queue ([`crate::bqueue`], bounded
    /// in time and size) instead of handing it on to overfill the links' own buffers. Schedulers without a model of the links' queues
    /// never push back.
    fn ready_in(&mut self, _now: Instant, _len: usize, _links: &[LinkView]) -> Option<Duration> {
        None
    }
    /// Back-pressure, for a packet that must go on a link of the endpoint's choosing (a dead
    /// link's copy): whether one of `len` bytes placed on `link` now would come no later than
    /// [`BACKPRESSURE_LATE`] behind the best the `links` give empty, as
    /// [`ready_in`](Self::ready_in) asks of the best link. Schedulers that never push back
    /// have room on every link.
    fn has_room(&mut self, _now: Instant, _len: usize, _links: &[LinkView], _link: LinkId) -> bool {
        true
    }
    /// A copy of `len` bytes (as [`Scheduler::pick`] counts them) went on `link` outside the
    /// placement (a dead link's packet reinjected, or one a NACK asked for): its queue holds it
    /// too.
    fn sent_copy(&mut self, _now: Instant, _len: usize, _link: LinkId) {}
    /// The peer holds every received packet of at least `min_len` bytes (as `pick` counts them)
    /// until the slowest link within `max` of the fastest would have brought it: such packets
    /// reach the peer's TUN no sooner on a faster link. Zero `max` turns this off.
    fn set_equalization(&mut self, _max: Duration, _min_len: usize) {}
    /// For now the peer holds at most `cap` beyond the fastest link (none: what the links
    /// call for): equalisation grows under traffic only step by step
    /// ([`crate::equalize::Ramp`]), and a link slower than that is not waited for yet.
    fn cap_equalization(&mut self, _cap: Option<Duration>) {}
    /// Back-pressure: some link's capacity is still being found (in start-up, or its last
    /// probe was carried or none was judged yet), so a full bundle may be the scheduler's
    /// ignorance rather than the path's limit.
    fn learning(&self) -> bool {
        false
    }
    /// Every usable link's rate is known at least roughly: none is in its start-up (still
    /// doubling from a first guess), though a probe may still be finding more. What the
    /// receive window clamp sizes itself by ([`crate::rwnd`]); `false` for schedulers that
    /// learn no rates.
    fn rates_known(&self) -> bool {
        false
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
        self.touch(id, now, init).0
    }
    /// [`Self::get_or_insert`], also telling when `id` was looked up before (`None`: new).
    fn touch(
        &mut self,
        id: LinkId,
        now: Instant,
        init: impl FnOnce() -> T,
    ) -> (usize, Option<Instant>) {
        if let Some(i) = self.entries.iter().position(|e| e.0 == id) {
            let before = std::mem::replace(&mut self.entries[i].1, now);
            (i, Some(before))
        } else {
            self.entries.push((id, now, init()));
            (self.entries.len() - 1, None)
        }
    }
    fn get(&self, id: LinkId) -> Option<&T> {
        self.entries.iter().find(|e| e.0 == id).map(|e| &e.2)
    }
    /// The latest any link was looked up.
    fn newest(&self) -> Option<Instant> {
        self.entries.iter().map(|e| e.1).max()
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
            if first.is_none_or(|f| l.id < f) {
                first = Some(l.id);
            }
            if self.last.is_some_and(|last| l.id > last) && next.is_none_or(|n| l.id < n) {
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

/// EQL's leaky bucket per link, drained in virtual time: each link's bucket holds the bits given
/// to it, draining at its configured bandwidth; a packet goes to the link whose bucket would be
/// empty soonest with the packet added (least `finish + len * 8 / bps`), as in weighted fair
/// queueing where every link is always backlogged. A link that joins (or comes back) starts at
/// the virtual time `V`, the least `finish` of the links present before it. Draining in
/// virtual rather than real time keeps the shares proportional to the bandwidths at any offered
/// load (real-time draining empties every bucket at light load, and then the fastest link takes
/// nearly everything: 89/11 instead of 80/20 at 90% load in the simulator), and a link that was
/// idle or away gets no burst credit. Whatever the ratio (57600 vs 14400), the slow link gets its
/// turn every `1 + fast/slow` packets or so: it is never starved.
#[derive(Debug, Default)]
pub struct Weighted {
    table: LinkTable<Bucket>,
    /// Virtual time (seconds of "service"): the least `finish` of the links present at the last
    /// pick.
    vtime: f64,
    /// Counts picks (tells a link present at the previous pick from one that joins).
    serial: u64,
}

#[derive(Debug)]
struct Bucket {
    /// Virtual time at which this link's bucket is empty.
    finish: f64,
    bps: f64,
    /// `serial` of the last pick this link was present at.
    seen: u64,
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
        let (vtime, prev) = (self.vtime, self.serial);
        self.serial += 1;
        let serial = self.serial;
        let mut best: Option<(usize, f64)> = None;
        for l in links {
            let bps = Self::bps_of(links, l);
            let i = self.table.get_or_insert(l.id, now, || Bucket {
                finish: vtime,
                bps,
                seen: prev,
            });
            let b = &mut self.table.entries[i].2;
            b.bps = bps;
            if b.seen != prev {
                // Joins or comes back: no credit for the time away.
                b.finish = b.finish.max(vtime);
            }
            b.seen = serial;
            let finish = b.finish + bits / bps;
            if best.is_none_or(|(_, f)| finish < f) {
                best = Some((i, finish));
            }
        }
        if let Some((i, finish)) = best {
            let e = &mut self.table.entries[i];
            e.2.finish = finish;
            out.push(e.0);
            self.vtime = self
                .table
                .entries
                .iter()
                .filter(|e| e.2.seen == serial)
                .map(|e| e.2.finish)
                .fold(f64::INFINITY, f64::min);
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
/// A queue of a few packets is a burst's, not a standing one: on a slow link [`QDELAY_LOW`] is
/// at least this many full-size packets' time at its rate ...
pub const LOW_PACKETS: f64 = 3.0;
/// ... and [`QDELAY_HIGH`] this many.
pub const HIGH_PACKETS: f64 = 6.0;
/// Probing up needs evidence: the link delivered at least this fraction of the assumed rate
/// (so a link whose delivery rate is known to be lower, but shows no queue, is not inflated).
pub const RAISE_EVIDENCE: f64 = 0.95;
/// Rate multiplier per interval when probing upwards.
pub const INCREASE_GAIN: f64 = 1.03;
/// Until the link's first congestion signal, a busy link without queue is given this multiple of
/// its delivery rate.
pub const STARTUP_GAIN: f64 = 1.5;
/// Start-up also ends without a congestion signal once the link's delivery rate has stopped
/// growing (by [`PLATEAU_GROWTH`] over [`PLATEAU_ROUNDS`] adjustments in a row in which we kept
/// it busy; others neither count nor reset the run) while the peer
/// measures a queue of at least [`STANDING_QDELAY`]: the link is full, and what it delivers is its
/// capacity (BBR's "full pipe" test). Without it a fast link whose buffer the traffic never
/// filled to [`QDELAY_HIGH`] kept start-up's 1.5 x its delivery rate for good: two veth links
/// shaped to 1 Gbit/s (tbf, 20 ms of buffer) were assumed to carry 1.4-1.5 Gbit/s each, the
/// virtual queue drained faster than the real one, and the server placed 970 Mbit/s on one link
/// (2.6 ms of real queue) and 150-530 Mbit/s on the other (download 53-84% of the sum).
pub const PLATEAU_GROWTH: f64 = 1.25;
/// See [`PLATEAU_GROWTH`].
pub const PLATEAU_ROUNDS: u8 = 3;
/// See [`PLATEAU_GROWTH`]: a queue this deep is the link's, not a timing artefact (a delivery
/// rate that stops growing without a queue is the traffic's limit, not the link's) ...
pub const STANDING_QDELAY: Duration = Duration::from_millis(1);
/// ... nor a few packets' serialisation: at least this many full-size (1500-byte) packets at the
/// delivery rate (at 3 Mbit/s one packet alone is 4 ms of "queue": a link carrying 60% of its
/// capacity ended its start-up at that 60% in the simulator). With 64, links slower than about
/// 77 Mbit/s (64 packets = 10 ms, [`QDELAY_HIGH`]) keep the thresholds in time alone: at 8, the
/// 50 Mbit/s link of 50/20/7 Mbit/s, which delay equalisation queues on purpose, was held at
/// its delivery rate and BBR's download stalled 445 ms in the simulator. The test is for fast
/// links with shallow buffers.
pub const STANDING_PACKETS: f64 = 64.0;
/// On congestion the rate drops to this fraction of the measured delivery rate. While the
/// bottleneck queue is non-empty the delivery rate is the link's capacity, so 1.0 is exact.
pub const DECREASE_TO: f64 = 1.0;
/// Fraction of the gap between the peer-measured queueing delay and the virtual queue's delay
/// (one interval earlier, when the packets the peer just measured were placed) closed at each
/// adjustment.
pub const RECONCILE_GAIN: f64 = 0.5;
/// The learned rate falls by at most this factor per adjustment.
pub const MAX_DECREASE: f64 = 0.8;
/// A link whose path marked our DATA Congestion Experienced (LINK-CE) is given this share of
/// what it delivered: an AQM marks once its queue has stood above its target (CoDel: 5 ms) for
/// an interval, so the link carries all it can and a little less drains that queue. A tenth,
/// not a congestion window's half: only this link backs off, and the bundle's queue tells the
/// inner flows when the bundle as a whole is full.
pub const CE_DECREASE_TO: f64 = 0.9;
/// Placement under the peer's equalisation: a link whose one-way delay is below the floor (the
/// delivery time the peer holds bulk packets to) hides its queue up to the difference, and
/// counted for nothing that queue took every packet until it reached the difference when the
/// links' rates were equal (two 20 Mbit/s links at 10 and 40 ms: 30 ms of queue on the first
/// before the second carried anything). A paced sender's probe above its rate (BBR's 1.25 x
/// for one round trip) then only lengthened that queue and delivered nothing more, and the flow
/// stayed near one link's rate: lab, that pair with 1.5% loss on the 40 ms link, BBR upload,
/// 25.3 Mbit/s with the 40 ms link carrying 1-3 Mbit/s for ten seconds, where kernel MPTCP gave
/// 36.5. So the hidden wait counts at this weight, as so much time on the wire: links of about
/// the same rate share the load once the faster-delay one holds a few ms, while a slower-rate
/// link still waits until the queue ahead of it outweighs its longer time on the wire (32 x the
/// difference). An eighth was tried first: the 8 Mbit/s link of the lab's `mixed` scenario then
/// queued beside the 40 Mbit/s one from the inner CUBIC's slow start on, its 1% random loss came
/// at a rising queue, read as congestion and was not repaired, and the flow left slow start at a
/// third of its window (two of four runs at 42-48% of the sum against 71-77%).
pub const HIDDEN_QUEUE_WEIGHT: f64 = 1.0 / 32.0;
/// Added to the predicted arrival on a DEGRADED link (used only when the others are that late).
pub const DEGRADED_PENALTY: Duration = Duration::from_millis(50);
/// Loss pull-back: a link whose loss estimate reaches this, without a standing queue (at least
/// [`QDELAY_HIGH`]) seen on it for [`PULLBACK_QUIET`], is given no traffic while another link
/// is not pulled back (only its probes keep measuring it) ...
pub const PULLBACK_LOSS: f64 = 0.05;
/// ... until its loss falls back under this, and has not reached [`PULLBACK_LOSS`] for
/// [`PULLBACK_HOLD`].
pub const PULLBACK_RECOVER: f64 = 0.02;
/// A pulled-back link carries only its probes (10 a second by default), so its loss estimate
/// rests on few packets: a run of 16 probes without a loss (18% likely at 10% loss) brought it
/// under [`PULLBACK_RECOVER`], the link took data again, lost 10% of it and was pulled back a
/// second later (lab: 383 kbit/s of data on a 10%-loss link over 10 s, the inner TCP's losses
/// with it). Each lost probe lifts the estimate above [`PULLBACK_LOSS`] again, so this hold,
/// restarted by each, keeps a link losing 10% back (50 probes in a row without a loss: 0.5%)
/// and lets a link that really recovered return in seconds.
pub const PULLBACK_HOLD: Duration = Duration::from_secs(5);
/// Loss on a link that queued this recently is a full queue's (congestion: the inner TCP must
/// see it, and the link is not at fault), not the link's own ...
pub const PULLBACK_QUIET: Duration = Duration::from_secs(2);
/// ... unless the packets sent since the queue was last reported, at least this many, lost
/// [`PULLBACK_LOSS`] or more themselves: a queue that has cleared drops nothing, so that loss
/// is the link's. The inner TCP's start-up queued 13-17 ms on both links of the lab's 10 + 10
/// Mbit/s with 10% loss on one in about half the runs; [`PULLBACK_QUIET`] alone then kept
/// the lossy link in use for 2.5 s, the inner CUBIC fell to 2 Mbit/s, and the bundle to
/// 75-82% of the clean link alone (94-99% in the runs without the queue). At 2% loss, 100
/// packets lose 5 or more in about 5% of tries, and a link is pulled back only if its
/// smoothed estimate also reads [`PULLBACK_LOSS`].
pub const PULLBACK_QUIET_PACKETS: u64 = 100;
/// ... or unless the peer named [`PULLBACK_LOSS`] or more of the link's last this many packets
/// (to twice as many) lost at random (LINK-NACK): it names no full queue's drop, so that loss
/// is the link's even while a queue stands. The inner TCP's start-up can keep a queue on both
/// links for a second or more, each report of it restarting the count above: a CI run's
/// 10%-loss link (the lab's 10 + 10 Mbit/s) carried 389 kbit/s of data against about 15 in other
/// runs, most likely half the bundle's traffic until 1.7 s. As above, a 2%-loss link names 5
/// of 100 in about 5% of windows, and is pulled back only if its smoothed estimate also reads
/// [`PULLBACK_LOSS`].
///
/// The smoothed estimate must in turn be borne out by the loss over the same last packets: it
/// averages each report's share alike, so a report of few packets moves it by points. A
/// 1.5%-loss link carrying hundreds of packets a second was pulled back twice so (lab, 2 x 20
/// Mbit/s with 1.5% loss on one, BBR download): a probe lost just before the inner flow spread
/// onto it (one lost probe lifts the estimate by about 9 points, which fade over a second
/// while the data comes in at 1.5%), and, most likely, the inner BBR's ProbeRTT (200 ms with
/// 4 packets in flight: a report of two packets, one lost, adds 5 points), each time held
/// back for 5 s or more (63% and 77% of the sum, against 91-92%). A report of few packets
/// still lowers the estimate as much as many do: weighing reports by their packets (tried)
/// kept a link that lost bursts under overload high for seconds after it fell quiet, and
/// pulled back two links of a flood the simulator's back-pressure test sends (61 against 76
/// Mbit/s delivered). Until a link has counted this many packets the estimate alone decides.
pub const PULLBACK_RECENT_PACKETS: u64 = 100;
/// A link is pulled back only by a loss estimate that rests on at least this many packets a
/// second: a link that carries only its probes (ten a second) has its estimate lifted by about
/// 9 points by one lost probe, which pulled a 1.5%-loss link back before it carried any data
/// and held it back while its probes lost now and then (lab, 2 x 20 Mbit/s with 1.5% loss on
/// one, BBR: 48.6% of the sum in one run of three, 88-90% in the others). A link that carries
/// data rests its estimate on hundreds of packets a second and is pulled back as before; a
/// link already pulled back keeps its hold on its probes' estimate, and so does a link whose
/// probes kept it DEGRADED (their loss at 10% or more, and never back under 3%) for
/// [`PULLBACK_HOLD`]: such a link, avoided as DEGRADED from the start and so never pulled back,
/// turned UP after a lucky run of probes and took half the bundle's traffic until its loss showed
/// again (lab, 10 + 10 Mbit/s with 10% loss on one, loaded: 1.4 Mbit/s in the last half second,
/// 212 kbit/s over the run against about 15). The price: a link slower than about 600 kbit/s
/// (50 full-size packets a second) is pulled back for loss only once it is DEGRADED for that long.
pub const PULLBACK_MIN_PPS: f64 = 50.0;

/// The bundle's own queue limit, in time. When even the best link would hold a packet longer
/// than `clamp(largest srtt, MIN_QUEUE_LIMIT, MAX_VIRTUAL_QUEUE)`, `adaptive` drops it at the
/// sender (it picks no link), as a router at the bottleneck would. Offered load above the links'
/// capacity then costs a drop here instead of a full queue there: the real bottleneck queues stay
/// short (no bufferbloat), they stay equal to the virtual ones, and arrival predictions stay
/// right, which is what keeps the receiver's reordering small. One RTT of queue is what a TCP
/// flow needs to keep the links busy.
pub const MIN_QUEUE_LIMIT: Duration = Duration::from_millis(50);
/// A link never measured that comes up, or back from this long away (down or silent) while
/// the others were in use, once the bundle has carried traffic for as long, is measured: in
/// start-up again, it takes held packets while idle until a queue shows its capacity. The
/// links there from the session's start are left to the
/// inner flows' own start-up, which pushes every link: exploring one it did not need (a slow
/// link under light traffic) only made packets late while its start-up ran into a queue (the
/// simulator's 10 + 10 + 5 Mbit/s at 10/20/60 ms under 70% load, the 60 ms link explored from
/// 2 s on: p99 reorder wait 39 -> 70 ms).
pub const RETURN_GAP: Duration = Duration::from_secs(1);
/// How far past the peer's hold for now a link in use (given a packet the peer holds within
/// [`RETURN_GAP`]) may go and still take such packets: a base delay that moves with its window, or a jittery link's
/// wobble, not a new route (a link 100 ms slower at once is left for the hold's steps, as one
/// coming back is).
pub const TAKEN_IN_MARGIN: Duration = Duration::from_millis(20);
/// Upper bound of the queue limit (and so of the virtual queues).
pub const MAX_VIRTUAL_QUEUE: Duration = Duration::from_millis(250);
/// The most queue the delivery-time placement plans on a link as free (a packet waiting there
/// still arrives by the equalisation floor): beyond it, the wait counts as lateness. A link much
/// faster than the slowest would otherwise be planned a queue of the whole delay difference
/// (140 ms with 10 ms and 150 ms links), more than its real buffer holds (lab: 100 ms; 3300
/// drops in 20 s on the 50 Mbit/s link of 50/20/7 Mbit/s with BBR), while the slow link, which
/// takes traffic only once the fast ones are that full, carried almost nothing.
pub const PLANNED_QUEUE_MAX: Duration = Duration::from_millis(50);
/// Back-pressure ([`Scheduler::ready_in`]): traffic is left waiting before the bundle once even
/// the best link would deliver a packet this late (beyond the equalisation floor and the
/// planned queue).
pub const BACKPRESSURE_LATE: Duration = Duration::from_millis(20);
/// Links held by back-pressure (see `Held`): the probe's gain ...
pub const PROBE_GAIN: f64 = 1.25;
/// ... the drain's after a probe the link did not deliver ...
pub const DRAIN_GAIN: f64 = 0.75;
/// ... what counts as delivered: this multiple of the rate before it (the delivery rate is
/// smoothed over about an adjustment, so a probe delivered whole shows as about 1.16 x) ...
pub const PROBE_SUCCESS: f64 = 1.08;
/// ... full adjustments between probes (the simulator's LTE mix, seeds 1-3: every 8, 62-75% of
/// the sum; every 4, 79-83%) ...
pub const PROBE_EVERY: u8 = 4;
/// ... no probe while the peer measures at least this much queue: the link is full, and a
/// probe would only deepen a queue the placement already keeps there (50/20/7 Mbit/s, where
/// the 50 Mbit/s link holds the planned queue: 450-480 inner retransmissions with BBR, none
/// without). A link's jitter reads as 10-20 ms (LTE, +- 20 ms) ...
pub const PROBE_MAX_QDELAY: Duration = Duration::from_millis(30);
/// ... nor while the placement keeps at least this much queue on the link beyond
/// [`BACKPRESSURE_LATE`] (equalisation's queue on a link faster than the slowest in use), the peer
/// measures at least half of the link's virtual queue, and the last probe found the rate to be the
/// capacity: the link is kept full by design, and its full adjustments sample its capacity already.
/// A probe there only swung the queue: LTE's steady 10 Mbit/s link, planned 10 ms beyond the 20 in
/// a CUBIC download and read at 20-30 ms (under the 30 above), was probed every 0.7 s, and the
/// probe and its drain moved its real queue between 10 and 56 ms (the lab emulator's own record),
/// while the peer's readings, a trip late, pulled the virtual queue the other way; unprobed, it
/// stays at 17-31 ms (10th to 90th percentile; BENCHMARKS.md §4, "No probe on a queue the placement
/// keeps"). Not counted from zero: every link under back-pressure holds up to
/// [`BACKPRESSURE_LATE`], so a link planned nothing (the slowest, or a jittery one, whose jitter
/// reads as 10-20 ms of queue) would never be probed again, and one whose capacity rose would never
/// show it. An unsettled link probes whatever its queue: a rate learned far too low is planned a
/// queue it does not have.
pub const PROBE_PLANNED_QUEUE: Duration = Duration::from_millis(5);
/// ... the cruise doubles after each probe in a row the link did not carry, up to this many times
/// (4, 8, 16 full adjustments between probes), and is back to [`PROBE_EVERY`] once one is carried.
/// A probe that is not carried, and its drain, cost a link with a short queue its capacity for a
/// while (likely: the drain empties the real queue on top of what the virtual queue, pulled up by
/// the peer's late readings of the probe, already holds back), and LTE's jittery 30 Mbit/s link,
/// probed every 0.7 s, ran dry at times. Probed once in 19 adjustments (1.9 s) once settled: LTE
/// +0.6 (CUBIC both ways) and +1.0 point (BBR download), 2% loss on the faster of two 10 Mbit/s
/// links +5.6 (BBR download, the stalls halved), level elsewhere (BENCHMARKS.md §4, "Fewer probes
/// once they fail"). A capacity that rises waits at most 16 adjustments for its probe ...
pub const PROBE_BACKOFF_DOUBLINGS: u8 = 2;
/// ... and the adjustments over which the most delivered is the rate.
const MAXF_ROUNDS: usize = 10;
/// The longest pause [`Scheduler::ready_in`] asks for at once: links may have room sooner than
/// predicted (a rate corrected, a link back), so the question is asked again after this.
pub const BACKPRESSURE_MAX_PAUSE: Duration = Duration::from_millis(5);

#[derive(Debug)]
struct AdaptiveLink {
    /// Learned rate, bit/s.
    rate: f64,
    /// Virtual queue, bytes.
    backlog: f64,
    /// Instant up to which the virtual queue has been drained.
    last: Instant,
    interval_start: Instant,
    /// Seconds of the current interval during which the virtual queue was not empty.
    busy: f64,
    /// The virtual queue's delay (s) at the previous adjustment.
    vq_prev: f64,
    /// Until the first congestion signal, probe up faster.
    startup: bool,
    /// It came up, or back into use, under traffic: while in start-up it is given held packets
    /// to learn its rate ([`Self::explores`]).
    relearning: bool,
    /// Start-up's full-pipe test (see [`PLATEAU_GROWTH`]).
    plateau: Plateau,
    /// Packets were dropped at the sender during this interval because every link was full:
    /// the traffic wanted more than the rates we assume.
    demand: bool,
    /// The configured bandwidth last seen (a change resets the rate to it).
    configured: Option<u64>,
    /// Loss pull-back (see [`PULLBACK_LOSS`]): too lossy to carry traffic while a cleaner
    /// link is present.
    pulled_back: bool,
    /// Since when its health has been DEGRADED, as last seen (`None`: it was not): placed on
    /// only when the others are [`DEGRADED_PENALTY`] late.
    degraded_since: Option<Instant>,
    /// Last time the peer reported a standing queue on the link, and its loss tally then.
    queued_at: Option<Instant>,
    queued_tally: Option<LossTally>,
    /// The link's loss tally [`PULLBACK_RECENT_PACKETS`] or more packets ago, and since then:
    /// its recent loss, and the share of it named random, are read over the packets from the
    /// first on.
    recent_window: [Option<LossTally>; 2],
    /// Last time its loss estimate was at [`PULLBACK_LOSS`] or more without a queue.
    lossy_at: Option<Instant>,
    /// Back-pressure asks about this link: once start-up is over its rate is learned as
    /// [`Held`] says.
    held: bool,
    hold: Held,
    /// When it was last given a packet the peer holds: within [`RETURN_GAP`], it is in use,
    /// and stays taken in whatever the peer's hold for now ([`Adaptive::taken_in_bound`]).
    held_packet_at: Option<Instant>,
    /// The peer's count of CE marks on this link at the last adjustment ([`LinkView::ce_marks`]).
    ce_seen: u32,
    /// The part of the peer's queueing delay that is no queue of ours.
    floor: DelayFloor,
}

/// Adjustments over which `DelayFloor` looks for a reading of the peer's queueing delay at or
/// below the virtual queue.
pub const FLOOR_ROUNDS: usize = 10;

/// The part of a link's queueing delay, as the peer reads it, that braid's own queue on the link
/// does not explain: the least excess of the reading over the virtual queue (as it was one
/// adjustment before, [`AdaptiveLink`]'s `vq_prev`) over the last [`FLOOR_ROUNDS`] adjustments,
/// or nothing while any of them read no excess. A queue braid built drains when the placement
/// feeds the link less (the reconcile of [`AdaptiveLink::adjust`] makes it do so), so the excess
/// falls to nothing within a few adjustments, and one that grows is read in full beyond its
/// least; a delay the link has at any load does neither. That is a jittery link's: the lab and
/// the simulator deliver each frame after its own random delay in [-J, +J] but never before the
/// frame ahead of it (links do not reorder), so under load nearly every frame waits for the
/// slowest of those just ahead and the link's delay is nearly +J above the one it has when idle,
/// which sets its base (`health::OWD_WINDOW`): 30-50 ms of "queue" on a 20 Mbit/s link at
/// 40 +- 30 ms, whatever it was given. Read as a queue, that stopped every probe of the link
/// ([`PROBE_MAX_QDELAY`]) and made each lull of the inner flow (BBR's PROBE_RTT) look like a
/// full link delivering little: its rate slid from 19.5 to 17.2 Mbit/s in one lab run and never
/// came back (20 + 5 Mbit/s, BBR upload: 82% of the sum against MPTCP's 87%).
#[derive(Debug, Default)]
struct DelayFloor {
    /// The last adjustments' excess of the reading over the virtual queue, seconds (a ring).
    excess: [f64; FLOOR_ROUNDS],
    n: usize,
}

impl DelayFloor {
    /// One adjustment's reading `qdelay` against the virtual queue `vq` (seconds): the queue that
    /// is ours, the reading less the floor.
    fn ours(&mut self, qdelay: Duration, vq: f64) -> Duration {
        self.excess[self.n % FLOOR_ROUNDS] = qdelay.as_secs_f64() - vq;
        self.n += 1;
        // (Until FLOOR_ROUNDS readings, the ring's empty slots read no excess.)
        let floor = self.excess.iter().copied().fold(f64::INFINITY, f64::min);
        // (The reading is the peer's: a floor past what a Duration holds takes it all.)
        match Duration::try_from_secs_f64(floor) {
            Ok(f) => qdelay.saturating_sub(f),
            Err(_) if floor > 0.0 => Duration::ZERO,
            Err(_) => qdelay,
        }
    }
}

/// A link's loss over its last packets ([`AdaptiveLink::recent_loss`]): all of it, and what
/// the peer named lost at random.
#[derive(Debug, Clone, Copy)]
struct RecentLoss {
    lost: f64,
    random: f64,
}

/// How a link held by back-pressure learns its rate. Back-pressure offers a link no more than
/// its learned rate, so the rules of [`AdaptiveLink::adjust`], which lift a rate by what a link
/// delivers beyond it, never do, and the rate must be probed. Those rules also read the peer's
/// queueing delay as congestion, and a link whose delay jitters (LTE, 30 Mbit/s +- 20 ms) reads
/// 10-20 ms of it at any load: its rate backed off once and stayed there (3 Mbit/s of 30 in the
/// simulator, the bundle at 27-45% of the sum). So, once its start-up is over, a held link
/// learns as BBR does, by delivery rate alone: its rate is the most it delivered over the last
/// [`MAXF_ROUNDS`] adjustments in which back-pressure held traffic back (the bundle was full),
/// and every [`PROBE_EVERY`] such adjustments it is given [`PROBE_GAIN`] x that for one
/// adjustment (less when the adjustment, an srtt, is longer than [`ADJUST_INTERVAL`]). A probe
/// the link delivers lifts the maximum and is repeated at once; one it does not is drained at
/// [`DRAIN_GAIN`] for an adjustment, and the probes come less often while they fail
/// ([`PROBE_BACKOFF_DOUBLINGS`]). A link full by its queue is not probed
/// ([`PROBE_MAX_QDELAY`]; [`PROBE_PLANNED_QUEUE`] once settled). The queue stays bounded by
/// back-pressure and by the virtual queue, which still follows the peer's readings.
#[derive(Debug, Default)]
struct Held {
    /// The delivery rates of the last full adjustments (a ring).
    delivered: [f64; MAXF_ROUNDS],
    /// Samples taken so far.
    n: usize,
    probe: Probe,
    /// The last probe judged was not carried: the rate is the link's capacity, as far as known.
    settled: bool,
    /// Probes in a row that were not carried (the cruise between probes doubles with each,
    /// [`PROBE_BACKOFF_DOUBLINGS`]).
    misses: u8,
    /// The previous adjustment was full too: a delivery rate is a sample of the link's capacity
    /// only after a whole full adjustment (it is smoothed and lags: a link busy again after a
    /// pause read a tenth of its rate, which as the only sample starved it).
    was_full: bool,
}

/// The probe cycle of a held link (see [`Held`]).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Probe {
    /// Full adjustments since the last probe ended.
    Cruise(u8),
    /// Given `gain` x the rate this adjustment; the rate before.
    Up { base: f64, gain: f64 },
    /// The probe's packets arrive during this adjustment: judged at its end.
    Check { base: f64 },
    /// Given DRAIN_GAIN x the rate this adjustment.
    Drain,
}

impl Default for Probe {
    fn default() -> Self {
        Probe::Cruise(0)
    }
}

impl Held {
    /// The multiple of the rate the link is given now.
    fn gain(&self) -> f64 {
        match self.probe {
            Probe::Up { gain, .. } => gain,
            Probe::Drain => DRAIN_GAIN,
            _ => 1.0,
        }
    }
    fn max(&self) -> f64 {
        self.delivered.iter().copied().fold(0.0, f64::max)
    }
    /// Full adjustments between probes now.
    fn cruise(&self) -> u8 {
        PROBE_EVERY << self.misses.min(PROBE_BACKOFF_DOUBLINGS)
    }
    fn push(&mut self, delivered: f64) {
        self.delivered[self.n % MAXF_ROUNDS] = delivered;
        self.n += 1;
    }
    /// The link's path signalled congestion at `rate`: no sample above it stands, and the
    /// probe cycle starts over from a cruise.
    fn cap(&mut self, rate: f64) {
        if self.n == 0 {
            self.push(rate);
        }
        for d in &mut self.delivered {
            *d = d.min(rate);
        }
        self.probe = Probe::Cruise(0);
        self.settled = true;
    }

    /// One adjustment of a held link past its start-up; the rate learned.
    /// `full`: back-pressure held traffic back during this adjustment (every link was full);
    /// `planned`: the placement keeps [`PROBE_PLANNED_QUEUE`] or more on the link beyond
    /// back-pressure's allowance and the peer's `qdelay` confirms at least half its virtual
    /// queue; `interval`: the adjustment's length.
    fn adjust(
        &mut self,
        rate: f64,
        full: bool,
        delivered: f64,
        qdelay: Duration,
        planned: bool,
        interval: Duration,
    ) -> f64 {
        if self.n == 0 {
            // Held from now on: what start-up or the other rules learned is the first sample.
            self.push(rate);
        }
        // A delivery rate measures the link's capacity only when the bundle was full; else it
        // measures what the inner flow sent (BBR's "application-limited" samples), and counts
        // only if it beats the maximum. (Sampling every busy adjustment let a CUBIC download's
        // lull after a loss pull a 20 Mbit/s link's rate down to 12: lab 50/20/7 Mbit/s, 67%.)
        // Not while a queue stands on the link: it carries all it can, and a reading above
        // the maximum then is the delivery rate's own noise (56 Mbit/s read on a 50 Mbit/s link
        // kept the 20 Mbit/s link beside it idle for a second at a time, BBR at 50-57 of 70).
        let queued = qdelay >= PROBE_MAX_QDELAY || (planned && self.settled);
        let beats = delivered > self.max() && !queued;
        if (full && self.was_full) || beats {
            self.push(delivered);
        }
        self.was_full = full;
        // The probe's excess stays within a quarter of ADJUST_INTERVAL of queue: an adjustment
        // lasts an srtt when that is longer, and a 20 Mbit/s link with a 190 ms srtt probed at
        // 1.25x for all of it queued 47 ms more on top of the planned queue and overflowed its
        // 100 ms buffer (lab 50/20/7 Mbit/s: 600-2800 drops in 20 s).
        let gain = 1.0
            + (PROBE_GAIN - 1.0)
                * (ADJUST_INTERVAL.as_secs_f64() / interval.as_secs_f64()).min(1.0);
        self.probe = match self.probe {
            Probe::Cruise(n) if !full => Probe::Cruise(n),
            // Full with a queue standing at it: the link carries all it can, as a probe that is
            // not carried would show (and a probe would only deepen the queue). Settled: else a
            // link the placement keeps queued (the faster links under equalisation) was never
            // probed, never settled, and kept the bundle "learning" for good, so its queue never
            // dropped a packet for waiting (a CUBIC flow over 10 Mbit/s at 20 and 120 ms: pings
            // through the bundle at 600-940 ms).
            Probe::Cruise(n) if queued => {
                self.settled = true;
                Probe::Cruise(n)
            }
            Probe::Cruise(n) if n + 1 < self.cruise() => Probe::Cruise(n + 1),
            Probe::Cruise(_) => Probe::Up {
                base: self.max(),
                gain,
            },
            Probe::Up { base, .. } => Probe::Check { base },
            Probe::Check { base } if delivered >= PROBE_SUCCESS * base => {
                self.settled = false;
                self.misses = 0;
                Probe::Up {
                    base: self.max(),
                    gain,
                }
            }
            Probe::Check { .. } => {
                self.settled = true;
                self.misses = self.misses.saturating_add(1);
                Probe::Drain
            }
            Probe::Drain => Probe::Cruise(0),
        };
        self.max()
    }
}

/// Start-up's full-pipe test: the best delivery rate seen, and how many adjustments in a row
/// found a queue without beating it by [`PLATEAU_GROWTH`].
#[derive(Debug, Default)]
struct Plateau {
    best: f64,
    flat: u8,
}

/// Seconds `packets` full-size (1500-byte) packets take on a wire of `bps` bit/s.
fn packets_time(packets: f64, bps: f64) -> f64 {
    packets * 1500.0 * 8.0 / bps
}

/// [`QDELAY_LOW`] and [`QDELAY_HIGH`] for a link learned at `rate` bit/s, raised to
/// [`LOW_PACKETS`] and [`HIGH_PACKETS`] full-size packets' time at that rate.
fn queue_thresholds(rate: f64) -> (Duration, Duration) {
    let rate = rate.max(RATE_FLOOR_BPS);
    (
        QDELAY_LOW.max(Duration::from_secs_f64(packets_time(LOW_PACKETS, rate))),
        QDELAY_HIGH.max(Duration::from_secs_f64(packets_time(HIGH_PACKETS, rate))),
    )
}

/// Whether the peer's queueing delay shows a queue standing at the bottleneck of a link that
/// delivers `delivered` bit/s: at least [`STANDING_QDELAY`] and [`STANDING_PACKETS`] packets'
/// time on the wire. Thresholds in time alone ([`QDELAY_LOW`], [`QDELAY_HIGH`]) are a WAN's: at
/// 1 Gbit/s 2.6 ms of queue is 325 kB, yet "no queue" for them.
fn standing_queue(delivered: f64, qdelay: Duration) -> bool {
    delivered > 0.0
        && qdelay >= STANDING_QDELAY
        && qdelay.as_secs_f64() >= packets_time(STANDING_PACKETS, delivered)
}

impl Plateau {
    /// One adjustment's delivery rate and queue: true once the pipe is full.
    fn full(&mut self, delivered: f64, qdelay: Duration) -> bool {
        if delivered >= self.best * PLATEAU_GROWTH {
            self.best = delivered;
            self.flat = 0;
        } else if standing_queue(delivered, qdelay) {
            self.flat += 1;
        } else {
            self.flat = 0;
        }
        self.flat >= PLATEAU_ROUNDS
    }
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
            busy: 0.0,
            vq_prev: 0.0,
            startup: v.bandwidth_bps.is_none(),
            relearning: false,
            plateau: Plateau::default(),
            demand: false,
            configured: v.bandwidth_bps,
            pulled_back: false,
            degraded_since: None,
            queued_at: None,
            queued_tally: None,
            recent_window: [None; 2],
            lossy_at: None,
            held: false,
            hold: Held::default(),
            held_packet_at: None,
            ce_seen: v.ce_marks,
            floor: DelayFloor::default(),
        }
    }

    /// Whether a held packet (the peer delivers it no sooner than `floor`) goes on this link to
    /// learn its rate, whatever the placement prefers: it came up, or back into use, under
    /// traffic ([`Self::relearn`]) and has not been measured since (still in start-up, its rate
    /// a guess or an old figure), it is UP, its virtual queue is empty, and it brings the packet
    /// by the floor. A link's rate is learned from what it carries, so one that could not carry
    /// traffic when the flow began (dark, or pulled back for loss) stayed at its first guess (1
    /// Mbit/s) for good under a BBR flow, which, paced at what it delivers, never offers enough
    /// beyond the links it has for the placement to spill onto it: in the simulator 18.4 Mbit/s
    /// over two 20 Mbit/s links, the second unused for the 16 s after it came up (CUBIC grows
    /// until it meets loss, and took it). Kept busy at its assumed rate, the link's start-up
    /// lifts that rate 1.5 x per interval as at a session's start, until a queue shows its
    /// capacity; the flow finds the room and grows. With configured rates nothing changes.
    fn explores(&self, v: &LinkView, floor: f64) -> bool {
        self.startup
            && self.relearning
            && floor > 0.0
            && v.state == LinkState::Up
            && self.backlog <= 0.0
            && v.owd.as_secs_f64() <= floor
    }

    /// The link came up, or back into use, under traffic: unless its rate is configured, it is
    /// measured again from the rate it had, in start-up, and given held packets to that end
    /// ([`Self::explores`]). As at a session's start, back-pressure holds nothing back and the
    /// sender drops nothing for waiting meanwhile (a guessed rate must not throttle the traffic
    /// that would reveal the real one).
    fn relearn(&mut self) {
        if self.configured.is_none() {
            self.startup = true;
            self.plateau = Plateau::default();
            self.relearning = true;
        }
    }

    /// The multiple of its rate the link is given now.
    fn gain(&self) -> f64 {
        if self.held {
            self.hold.gain()
        } else {
            1.0
        }
    }

    /// Updates the loss pull-back state from the link's loss estimate (with hysteresis).
    fn update_pullback(&mut self, now: Instant, v: &LinkView) {
        self.degraded_since =
            (v.state == LinkState::Degraded).then(|| self.degraded_since.unwrap_or(now));
        let loss = sane(v.loss);
        if v.qdelay >= QDELAY_HIGH {
            self.queued_at = Some(now);
            self.queued_tally = v.loss_tally;
        }
        let lossy_since_queue = v
            .loss_tally
            .zip(self.queued_tally)
            .and_then(|(cur, then)| cur.loss_since(then, PULLBACK_QUIET_PACKETS))
            .is_some_and(|l| l >= PULLBACK_LOSS);
        let recent = v.loss_tally.and_then(|cur| self.recent_loss(cur));
        let lossy_at_random = recent.is_some_and(|r| r.random >= PULLBACK_LOSS);
        // The smoothed estimate weighs each report alike, and a report of a few packets with
        // one lost moves it by points: it must be borne out by the link's last packets, when
        // there have been enough of them.
        let lossy_lately = recent.is_none_or(|r| r.lost >= PULLBACK_LOSS);
        let congested = !lossy_since_queue
            && !lossy_at_random
            && self
                .queued_at
                .is_some_and(|t| now.saturating_duration_since(t) < PULLBACK_QUIET);
        // A link DEGRADED by its probes' loss for PULLBACK_HOLD lost probes all along: evidence
        // enough ([`PULLBACK_MIN_PPS`]).
        let degraded_long = self
            .degraded_since
            .is_some_and(|t| now.saturating_duration_since(t) >= PULLBACK_HOLD);
        let evidence = self.pulled_back
            || degraded_long
            || v.loss_basis_pps.is_none_or(|p| p >= PULLBACK_MIN_PPS);
        if loss >= PULLBACK_LOSS && lossy_lately && !congested && evidence {
            self.pulled_back = true;
            self.lossy_at = Some(now);
        } else if loss < PULLBACK_RECOVER
            && self
                .lossy_at
                .is_none_or(|t| now.saturating_duration_since(t) >= PULLBACK_HOLD)
        {
            if self.pulled_back {
                self.relearn();
            }
            self.pulled_back = false;
        }
    }

    /// The loss over the link's last [`PULLBACK_RECENT_PACKETS`] (to twice that) counted
    /// packets, given its tally now `cur` (`None` until there were that many); moves the window
    /// on.
    fn recent_loss(&mut self, cur: LossTally) -> Option<RecentLoss> {
        let newer = self.recent_window[1];
        match newer.map(|then| cur.expected.checked_sub(then.expected)) {
            // The first tally, or one that is not later (a new count): start again.
            None | Some(None) => self.recent_window = [None, Some(cur)],
            Some(Some(n)) if n >= PULLBACK_RECENT_PACKETS => {
                self.recent_window = [newer, Some(cur)]
            }
            Some(Some(_)) => {}
        }
        let then = self.recent_window[0]?;
        Some(RecentLoss {
            lost: cur.loss_since(then, PULLBACK_RECENT_PACKETS)?,
            random: cur.random_loss_since(then, PULLBACK_RECENT_PACKETS)?,
        })
    }

    /// Drains the virtual queue up to `now`, accounting busy time.
    fn drain(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last);
        self.last = now;
        if self.backlog > 0.0 && !dt.is_zero() {
            let bytes_per_s = self.rate * self.gain() / 8.0;
            let dt = dt.as_secs_f64();
            let q0 = self.backlog / bytes_per_s; // queue delay now, seconds
            if q0 <= dt {
                self.busy += q0;
                self.backlog = 0.0;
            } else {
                self.busy += dt;
                self.backlog -= bytes_per_s * dt;
            }
        }
    }

    /// Learns the rate from what the peer reports (see the module docs).
    /// `full_at`: the last time back-pressure found every link full (see [`Held`]).
    fn adjust(&mut self, now: Instant, v: &LinkView, full_at: Option<Instant>) {
        if v.bandwidth_bps != self.configured {
            self.configured = v.bandwidth_bps;
            if let Some(b) = v.bandwidth_bps.filter(|&b| b > 0) {
                // As in `new`: a configured rate is the start-up's answer (and a held link's
                // first sample: what it delivered before is another capacity's).
                self.rate = b as f64;
                self.startup = false;
                self.hold = Held::default();
            }
        }
        let interval = ADJUST_INTERVAL.max(v.srtt.unwrap_or(Duration::ZERO));
        let elapsed = now.saturating_duration_since(self.interval_start);
        if elapsed < interval {
            return;
        }
        // A held link reads the queue that is ours; the queue rules, which learn a link that
        // back-pressure does not hold, read it all (through the floor the simulator's 1+2+3
        // Mbit/s BBR download fell below its test's floor, 88%, to 81% of the sum: a slow
        // link's readings lag its virtual queue, and that lag became a floor).
        let ours = self.floor.ours(v.qdelay, self.vq_prev);
        let qdelay = if self.held && !self.startup {
            ours
        } else {
            v.qdelay
        };
        let busy = self.busy / elapsed.as_secs_f64();
        // Kept busy by us, or wanted more than we gave (sender drops): either way the link was
        // offered at least the rate we assume.
        let pushed = busy >= BUSY_FRACTION || self.demand;
        let delivered = sane(v.delivery_rate_bps);
        // Pull the virtual queue towards the real one: the peer's queueing delay measures the
        // queue that packets placed about one interval ago found. Without this the two drift
        // apart for good (a real queue is bounded by its buffer, drops, and never drains while
        // the offered load equals the capacity) and arrival predictions go wrong. Towards the
        // part of it that is ours: a delay the link has at any load is no queue to drain.
        let err = qdelay.as_secs_f64() - self.vq_prev;
        self.backlog = (self.backlog + RECONCILE_GAIN * err * self.rate / 8.0).max(0.0);
        // The path's AQM marked our packets since the last adjustment (a new session's count
        // starts again from 0: not a mark).
        let marked = v.ce_marks.wrapping_sub(self.ce_seen) as i32 > 0;
        self.ce_seen = v.ce_marks;
        if marked && delivered > 0.0 {
            // What it delivered is its capacity (its queue stood); a little less drains it.
            self.startup = false;
            self.rate = (CE_DECREASE_TO * delivered).max(self.rate * MAX_DECREASE);
            self.hold.cap(self.rate);
        } else if self.held && !self.startup {
            // (Start-up works as without back-pressure, which does not push back on a link in
            // start-up.)
            // Full for this link too only if it was kept busy: one avoided meanwhile (DEGRADED,
            // pulled back) delivers next to nothing, and as a sample of its capacity that
            // nothing starved it for good.
            let full = self.queued_too_high(qdelay, delivered)
                || (pushed && full_at.is_some_and(|t| t >= self.interval_start));
            let planned = self.vq_prev >= (BACKPRESSURE_LATE + PROBE_PLANNED_QUEUE).as_secs_f64()
                && qdelay.as_secs_f64() >= self.vq_prev / 2.0;
            self.rate = self
                .hold
                .adjust(self.rate, full, delivered, qdelay, planned, interval);
        } else {
            self.adjust_rate(pushed, delivered, qdelay);
        }
        self.rate = sane(self.rate).max(RATE_FLOOR_BPS);
        self.interval_start = now;
        self.busy = 0.0;
        self.demand = false;
        self.vq_prev = self.backlog * 8.0 / self.rate;
    }

    /// A held link full by reality, whatever back-pressure's model says: a queue stands on it
    /// (`qdelay`), so what it `delivered` is its capacity, and its rate is further above that
    /// than a carried probe lifts it ([`PROBE_SUCCESS`]). Without this a rate learned too high
    /// stayed for good: one delivery sample above the capacity lifts the maximum, the model
    /// then drains the link faster than it does and no longer finds the bundle full, so no
    /// sample came to replace it, and the placement kept the slower links idle behind the fast
    /// link's real queue (lab, 50 Mbit/s at 10 ms and 20 at 60 ms under BBR with back-pressure:
    /// 58.5 learned on the 50 Mbit/s link, 60-90 ms queued on it, the other link carrying 0-7:
    /// 52.9 Mbit/s of 70). Within the margin it is not: a jittery link reads queues of 30-60 ms
    /// that are not there (LTE, 30 Mbit/s +- 20 ms), and sampled under them its rate slid 5%
    /// below its capacity (lab, LTE BBR upload -3.4 points).
    fn queued_too_high(&self, qdelay: Duration, delivered: f64) -> bool {
        qdelay >= PROBE_MAX_QDELAY && delivered > 0.0 && delivered * PROBE_SUCCESS < self.rate
    }

    /// The rules of [`adjust`](Self::adjust) for links not held by back-pressure, or still in
    /// start-up; `qdelay`: the peer's reading (not less its [`DelayFloor`], which these rules
    /// do not take).
    fn adjust_rate(&mut self, pushed: bool, delivered: f64, qdelay: Duration) {
        let (qlow, qhigh) = if self.startup {
            (QDELAY_LOW, QDELAY_HIGH)
        } else {
            queue_thresholds(self.rate.max(delivered))
        };
        if self.startup && pushed && self.plateau.full(delivered, qdelay) {
            // Full without a congestion signal: what it delivers is what it carries.
            self.startup = false;
            self.rate = delivered;
        }
        if qdelay > qhigh && delivered > 0.0 && pushed {
            // A standing queue at the bottleneck: the link was busy the whole time, so what
            // arrived is its capacity, whether we had guessed lower or higher.
            // At most MAX_DECREASE per interval: the report is a trip old and the delivery rate
            // a smoothed one, and a link that just took over a failed link's traffic shows a
            // queue while TCP backs off; one stale reading must not collapse the rate.
            self.startup = false;
            self.rate = (DECREASE_TO * delivered).max(self.rate * MAX_DECREASE);
        } else if !self.startup
            && pushed
            && delivered < self.rate
            && standing_queue(delivered, qdelay)
        {
            // A queue stands at the bottleneck and the link delivers less than we assume: what
            // it delivers is its capacity. (Else the rate of a fast link with a shallow buffer,
            // probed up below QDELAY_LOW, stayed 5-8% above its capacity: the virtual queue
            // drained faster than the real one, which stood at 2-3 ms, and the other 1 Gbit/s
            // link was given 80-200 Mbit/s.)
            self.rate = delivered.max(self.rate * MAX_DECREASE);
        } else if delivered > self.rate && !(self.startup && pushed && qdelay < qlow) {
            // The link carried more than we assumed: that much it can carry at least (this is
            // what lifts a rate stuck between the thresholds, e.g. by jitter on a slow link).
            self.rate = delivered;
        } else if self.startup && pushed && qdelay < qlow {
            // Start-up: no queue although we kept the link busy; aim at a multiple of what it
            // delivered (BBR's start-up, in spirit): the rate doubles or so per round trip
            // without overshooting the capacity by more than STARTUP_GAIN.
            self.rate = self.rate.max(delivered * STARTUP_GAIN);
        } else if pushed
            && qdelay < qlow
            && !standing_queue(delivered, qdelay)
            && delivered >= RAISE_EVIDENCE * self.rate
        {
            // No queue although we kept the link busy: it can carry at least what it delivered,
            // and maybe more: probe.
            // Sender drops with no queue at the bottleneck: we are far below what the link
            // takes (e.g. its rate was measured while it carried little): climb fast.
            let gain = if self.demand {
                STARTUP_GAIN
            } else {
                INCREASE_GAIN
            };
            self.rate = self.rate.max(delivered) * gain;
        }
    }

    /// Predicted delivery of a packet of `len` bytes placed here now, seconds from now: when
    /// the peer equalises, no sooner than `floor` whichever link brings it; the wait behind the
    /// link's queue matters only beyond that (up to [`PLANNED_QUEUE_MAX`] of it), and among the
    /// links that make it, the one that puts the packet on the wire soonest wins.
    fn delivery(&self, len: usize, v: &LinkView, floor: f64) -> f64 {
        self.delivery_behind(self.queue_time(0, v), len, v, floor)
    }

    /// [`delivery`](Self::delivery) behind a queue of `wait` seconds (`queue_time(0, v)`).
    fn delivery_behind(&self, wait: f64, len: usize, v: &LinkView, floor: f64) -> f64 {
        let tx = self.queue_time(len, v) - wait;
        let cap = PLANNED_QUEUE_MAX.as_secs_f64();
        let over = (wait - cap).max(0.0);
        (wait.min(cap) + v.owd.as_secs_f64()).max(floor) + over + tx + degraded_penalty(v)
    }

    /// Placement's key for a packet of `len` bytes, lowest wins: the predicted
    /// [`delivery`](Self::delivery) plus, under the peer's equalisation (`floor` > 0), the wait
    /// behind this link's queue that the floor hides from it, weighed by
    /// [`HIDDEN_QUEUE_WEIGHT`]. The queue's wait is computed once for both.
    fn placement_key(&self, len: usize, v: &LinkView, floor: f64) -> f64 {
        let wait = self.queue_time(0, v);
        let delivery = self.delivery_behind(wait, len, v, floor);
        if floor <= 0.0 {
            return delivery;
        }
        let hidden = wait
            .min(PLANNED_QUEUE_MAX.as_secs_f64())
            .min((floor - v.owd.as_secs_f64()).max(0.0));
        delivery + HIDDEN_QUEUE_WEIGHT * hidden
    }

    /// The delivery [`delivery`](Self::delivery) predicts behind an empty queue.
    fn unloaded_delivery(&self, v: &LinkView, floor: f64) -> f64 {
        v.owd.as_secs_f64().max(floor) + degraded_penalty(v)
    }

    /// Predicted queueing time of a packet of `len` bytes placed here now.
    fn queue_time(&self, len: usize, v: &LinkView) -> f64 {
        let keep = (1.0 - sane(v.loss)).clamp(0.05, 1.0);
        // The virtual queue alone: the peer's queueing-delay report is one trip old, and steering
        // by it makes the links' queues swing (seen in the simulator); it corrects the rate
        // instead (see `adjust`).
        let _ = v.qdelay;
        (self.backlog + len as f64) * 8.0 / (self.rate * self.gain() * keep)
    }
}

/// How long delay equalisation waits for a link `spread` slower than the fastest, under the
/// bound `bound` (`equalize_max`): all of it up to the bound; the bound for a link up to 1.25 x
/// the bound slower (its packets then come a little late); then less and less, to nothing at
/// 1.5 x the bound. No measured spread makes the wait jump: when it jumped from the bound to
/// nothing at the bound itself, two links 100 ms apart (20 and 120 ms) were measured a hair
/// above or below it by turns, the receiver held bulk packets 100 ms or not at all, and the
/// inner BBR, seeing round trips of 40 and 240 ms mixed, ran at 21% of the sum in the lab
/// (86-88% now; kernel MPTCP 83-86%). Both ends use it: the receiver for its hold
/// (`Endpoint`'s equalisation target), the sender for the floor of its placement.
pub fn equalize_wait(spread: Duration, bound: Duration) -> Duration {
    let full = bound.saturating_mul(5) / 4;
    let none = bound.saturating_mul(3) / 2;
    if spread <= bound {
        spread
    } else if spread <= full {
        bound
    } else if spread >= none {
        Duration::ZERO
    } else {
        // full < spread < none, so none > full.
        bound.mul_f64((none - spread).as_secs_f64() / (none - full).as_secs_f64())
    }
}

/// The least of some links' one-way delays (`owds`) and how long equalisation under `bound`
/// waits beyond it for the slowest ([`equalize_wait`]); none without a link.
pub fn equalize_want(
    owds: impl Iterator<Item = Duration> + Clone,
    bound: Duration,
) -> Option<(Duration, Duration)> {
    let lo = owds.clone().min()?;
    let wait = owds
        .map(|owd| equalize_wait(owd - lo, bound))
        .max()
        .unwrap_or(Duration::ZERO);
    Some((lo, wait))
}

/// What a DEGRADED link adds to a predicted delivery, seconds.
fn degraded_penalty(v: &LinkView) -> f64 {
    if v.state == LinkState::Degraded {
        DEGRADED_PENALTY.as_secs_f64()
    } else {
        0.0
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
    /// The peer's delay equalisation: bound, and the smallest packet it holds ...
    equalize: Option<(Duration, usize)>,
    /// ... and the most it holds for now (see `Scheduler::cap_equalization`).
    equalize_cap: Option<Duration>,
    /// The last time back-pressure found every link full (see `Held`).
    full_at: Option<Instant>,
    /// Back-pressure has held two or more equalised links at once: a bundle, whose inner flows
    /// sized their windows for more than one link (see [`Adaptive::last_link`]).
    bundled: bool,
    /// The first packet placed or asked about: links coming up [`RETURN_GAP`] later came up
    /// under traffic.
    first_pick: Option<Instant>,
}

impl Adaptive {
    /// The links whose capacity counts in [`Scheduler::learning`] and
    /// [`Scheduler::rates_known`]. Only the links `ready_in` last saw (the usable ones): a link
    /// that died keeps its entry for `FORGET_AFTER`, and must not keep the bundle "learning"
    /// that long. Nor a link the placement avoids (pulled back for loss, or DEGRADED) while
    /// another carries the traffic: it is given nothing, so its hold never settles, and it kept
    /// the bundle "learning" for good (lab, 10 Mbit/s + 10 Mbit/s with 10% loss, CUBIC: the
    /// lossy link DEGRADED by its probes' loss and never pulled back, since it carried too
    /// little to show it; nothing dropped for waiting, the inner round trip grew from 22 to 530
    /// ms in 10 s and the clean link's delivery fell late enough to spill onto the lossy one).
    fn counted_links(&self) -> impl Iterator<Item = &AdaptiveLink> + '_ {
        let entries = &self.table.entries;
        let latest = entries.iter().map(|e| e.1).max();
        let seen = move || entries.iter().filter(move |e| Some(e.1) == latest);
        let avoided = |st: &AdaptiveLink| st.pulled_back || st.degraded_since.is_some();
        let preferred = seen().any(|e| !avoided(&e.2));
        seen()
            .filter(move |e| !(preferred && avoided(&e.2)))
            .map(|e| &e.2)
    }

    /// The rate (bit/s) currently assumed for `link`.
    pub fn rate_bps(&self, link: LinkId) -> Option<f64> {
        self.table.get(link).map(|l| l.rate)
    }
    /// The virtual queue of `link`, bytes.
    pub fn backlog_bytes(&self, link: LinkId) -> Option<f64> {
        self.table.get(link).map(|l| l.backlog)
    }
    /// The virtual queue of `link` in time at its assumed rate, drained to `now`.
    pub fn queue(&self, now: Instant, link: LinkId) -> Option<Duration> {
        let l = self.table.get(link)?;
        let at_last = Duration::from_secs_f64(sane(l.backlog * 8.0 / (l.rate * l.gain())));
        Some(at_last.saturating_sub(now.saturating_duration_since(l.last)))
    }
    /// Whether `link` is pulled back for its loss (see [`PULLBACK_LOSS`]).
    pub fn pulled_back(&self, link: LinkId) -> Option<bool> {
        self.table.get(link).map(|l| l.pulled_back)
    }
    /// The index of `v`'s entry, made if new. A link never measured that comes up, or back
    /// after [`RETURN_GAP`] away, once the bundle has carried traffic for as long, is measured
    /// ([`AdaptiveLink::relearn`]). `newest`: the latest any link was seen before this call
    /// ([`LinkTable::newest`]).
    fn entry(&mut self, now: Instant, v: &LinkView, newest: Option<Instant>) -> usize {
        if self.table.entries.is_empty() {
            // The first traffic, or the first after every link was forgotten (an idle spell of
            // FORGET_AFTER): a session's start again.
            self.first_pick = None;
        }
        let under_traffic = self
            .first_pick
            .get_or_insert(now)
            .checked_add(RETURN_GAP)
            .is_some_and(|t| now >= t);
        // Away while the others were seen (before this call): an idle spell ages every link
        // alike.
        let (i, seen) = self.table.touch(v.id, now, || AdaptiveLink::new(now, v));
        let away = match (seen, newest) {
            (Some(t), Some(n)) => n.saturating_duration_since(t) >= RETURN_GAP,
            _ => true,
        };
        let st = &mut self.table.entries[i].2;
        if away && under_traffic && st.startup {
            // Never measured (it was down when the flows began): it is now. One measured
            // before keeps its rate (dark for 2 s under a BBR flow, it took its half back at
            // once; measured again, one run of five fell to 80% of the sum).
            st.relearn();
        }
        i
    }
    /// The earliest the peer delivers a packet of `len` bytes whatever the link (its delay
    /// equalisation target, in our one-way-delay estimates), in seconds; 0 when it does not hold
    /// such packets.
    fn delivery_floor(&self, len: usize, links: &[LinkView]) -> f64 {
        let Some((max, min_len)) = self.equalize else {
            return 0.0;
        };
        if len < min_len || links.len() < 2 {
            return 0.0;
        }
        let up = links.iter().filter(|v| v.state == LinkState::Up);
        match equalize_want(up.map(|v| v.owd), max) {
            Some((lo, wait)) => lo
                .saturating_add(wait.min(self.equalize_cap.unwrap_or(Duration::MAX)))
                .as_secs_f64(),
            None => 0.0,
        }
    }

    /// While the peer's hold grows by steps (`Scheduler::cap_equalization`), the one-way delay
    /// beyond which a link is not taken in yet for packets the peer holds (of `len` bytes): its
    /// packets would come after the hold and stall the ones behind them in the peer's reorder
    /// buffer, lengthening the round trip the steps keep short (lab, 50 Mbit/s at 10 ms and 20
    /// at 60 ms coming back under BBR: a 12 ms hold with the 60 ms link carrying the fast
    /// link's overflow fell to 21-28 Mbit/s for 5 s). A link in use (given such a packet within
    /// [`RETURN_GAP`]) stays taken in when its delay rises past the bound by up to
    /// [`TAKEN_IN_MARGIN`]: its packets come a few ms late, where leaving it out put the whole
    /// flow on the others (lab, LTE 30 Mbit/s at 30 +- 20 ms and DSL 10 Mbit/s at 15 ms under
    /// BBR, 60 s: at 59.5 s, most likely as the 30 s window of the LTE link's base delay moved
    /// it past the 18 ms hold, the 10 Mbit/s link was given 228 ms of queue, lost 9% and was
    /// pulled back, and the flow stalled 508 ms).
    fn taken_in_bound(&self, len: usize, links: &[LinkView]) -> Option<Duration> {
        let cap = self.equalize_cap?;
        let (_, min_len) = self.equalize?;
        if len < min_len || links.len() < 2 {
            return None;
        }
        let lo = links
            .iter()
            .filter(|v| v.state == LinkState::Up)
            .map(|v| v.owd)
            .min()?;
        Some(lo + cap + crate::equalize::SLACK)
    }

    /// A bundle left with one usable link (the others dead, silent or gone): its one-way delay,
    /// in seconds, as the floor against which back-pressure judges lateness, so that the link
    /// left is held as the bundle's links were. Without it the bundle's queue, which a loss-based
    /// flow keeps three of its round trips deep, went onto that link at once when a failure left
    /// it alone, and its buffer overflowed: lab, 10 Mbit/s links at 20 and 120 ms, the 20 ms link
    /// failed under CUBIC, 700 packets poured onto the 120 ms link, 1716 dropped at its tail and
    /// 1679 inner retransmissions. Held, the excess waits in the bundle's queue, whose time limit
    /// drops one packet per round trip (and, past its hard bound, what waited longer): the inner
    /// flow backs off as it would behind one link (6 to 84 retransmissions there). Only once the
    /// bundle has been one (`bundled`): a link that has always been alone keeps its own queue.
    fn last_link(&self, links: &[LinkView]) -> Option<f64> {
        match links {
            [v] if self.bundled && v.state != LinkState::Down => {
                Some(v.owd.as_secs_f64().max(1e-6))
            }
            _ => None,
        }
    }

    /// These links were offered more than their assumed rates let us place on them.
    fn mark_demand<'a>(&mut self, links: impl Iterator<Item = &'a LinkView>) {
        for v in links {
            if let Some(e) = self.table.entries.iter_mut().find(|e| e.0 == v.id) {
                e.2.demand = true;
            }
        }
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
        let newest = self.table.newest();
        let floor = self.delivery_floor(len, links);
        // Loss pull-back: a lossy link carries nothing while a clean one is present. Random
        // loss on one link reaches the inner TCP as loss of the whole flow: CUBIC halves its
        // window for it, and the bundle fell below what the clean links carry alone (lab, 10
        // Mbit/s + 10 Mbit/s with 10% loss: 83% of the clean link alone).
        let mut clean = false;
        for v in links {
            let i = self.entry(now, v, newest);
            let st = &mut self.table.entries[i].2;
            st.update_pullback(now, v);
            clean |= !st.pulled_back;
        }
        // A link not taken in yet carries no held packet, as long as another link may.
        let table = &self.table;
        let usable = |v: &LinkView| table.get(v.id).is_some_and(|st| !clean || !st.pulled_back);
        let beyond = self
            .taken_in_bound(len, links)
            .filter(|&t| links.iter().any(|v| v.owd <= t && usable(v)));
        let full_at = self.full_at;
        let mut best: Option<(usize, f64, f64)> = None;
        // A link never measured, idle, that a held packet may take without coming late (see
        // [`AdaptiveLink::explores`]).
        let mut unmeasured: Option<(usize, f64)> = None;
        let mut limit = MIN_QUEUE_LIMIT;
        for v in links {
            // Every link was looked up (and measured if due) above.
            let i = self
                .table
                .get_or_insert(v.id, now, || AdaptiveLink::new(now, v));
            let st = &mut self.table.entries[i].2;
            let in_use = st
                .held_packet_at
                .is_some_and(|t| now.saturating_duration_since(t) < RETURN_GAP);
            let not_taken_in =
                beyond.is_some_and(|t| v.owd > t && !(in_use && v.owd <= t + TAKEN_IN_MARGIN));
            if (clean && st.pulled_back) || not_taken_in {
                // Its virtual queue drains; its rate is kept for when it comes back.
                st.drain(now);
                continue;
            }
            st.drain(now);
            st.adjust(now, v, full_at);
            limit = limit.max(v.srtt.unwrap_or(Duration::ZERO));
            let queue = st.queue_time(len, v);
            // When the peer equalises, a packet is delivered no sooner than `floor` whichever
            // link brings it: the wait behind the link's queue matters only beyond that, and
            // among the links that make it, the one that puts the packet on the wire soonest
            // (least queued relative to its rate) wins. The bundle then fills its links in
            // proportion to their rates, as one link of their summed rate would, instead of
            // queueing on the fastest ones first.
            let key = st.placement_key(len, v, floor);
            if best.is_none_or(|(_, k, _)| key < k) {
                best = Some((i, key, queue));
            }
            if unmeasured.is_none() && st.explores(v, floor) {
                unmeasured = Some((i, queue));
            }
        }
        let Some((i, _, queue)) = best else { return };
        let (i, queue) = unmeasured.unwrap_or((i, queue));
        // The links in use: not pulled back (unless all are).
        let table = &self.table;
        let in_use = |v: &&LinkView| !clean || table.get(v.id).is_some_and(|st| !st.pulled_back);
        // Drop at the sender only once every link's rate has been measured (its start-up ended
        // with a standing queue): a guessed rate must not throttle the traffic that would reveal
        // the real one.
        let measured = links
            .iter()
            .filter(in_use)
            .all(|v| table.get(v.id).is_some_and(|st| !st.startup));
        // ...and only when the peer measures a real standing queue on every link too: a virtual
        // queue inflated by a rate learned too low (a back-off during the inner TCP's start-up
        // reads a delivery rate that lags) must not drop packets the links could carry, which
        // would leave the inner TCP with a window below the path's capacity.
        let real_limit = limit.min(MAX_VIRTUAL_QUEUE) / 2;
        let really_full = links.iter().filter(in_use).all(|v| v.qdelay >= real_limit);
        if measured && really_full && queue > limit.min(MAX_VIRTUAL_QUEUE).as_secs_f64() {
            // Every link is full: drop at the sender (see MIN_QUEUE_LIMIT).
            self.mark_demand(links.iter());
            return;
        }
        if measured && queue > limit.min(MAX_VIRTUAL_QUEUE).as_secs_f64() {
            // Full by our model, not in reality: the rates of the links without a real queue are
            // too low; let them climb fast.
            self.mark_demand(links.iter().filter(|v| v.qdelay < real_limit));
        }
        let e = &mut self.table.entries[i];
        e.2.backlog += len as f64;
        if floor > 0.0 {
            e.2.held_packet_at = Some(now);
        }
        out.push(e.0);
    }
    fn link_rate_bps(&self, link: LinkId) -> Option<f64> {
        self.rate_bps(link)
    }
    fn link_queue(&self, now: Instant, link: LinkId) -> Option<Duration> {
        self.queue(now, link)
    }
    fn link_pulled_back(&self, link: LinkId) -> Option<bool> {
        self.pulled_back(link)
    }
    fn set_equalization(&mut self, max: Duration, min_len: usize) {
        self.equalize = (!max.is_zero()).then_some((max, min_len));
    }
    fn cap_equalization(&mut self, cap: Option<Duration>) {
        self.equalize_cap = cap;
    }
    fn sent_copy(&mut self, now: Instant, len: usize, link: LinkId) {
        if let Some(e) = self.table.entries.iter_mut().find(|e| e.0 == link) {
            e.2.drain(now);
            e.2.backlog += len as f64;
        }
    }
    fn learning(&self) -> bool {
        self.counted_links()
            .any(|l| l.held && (l.startup || !l.hold.settled))
    }
    fn rates_known(&self) -> bool {
        // A link avoided while another carries the traffic is given nothing and keeps its
        // start-up: it does not count ([`Adaptive::counted_links`]).
        !self.table.entries.is_empty() && !self.counted_links().any(|l| l.startup)
    }
    fn ready_in(&mut self, now: Instant, len: usize, links: &[LinkView]) -> Option<Duration> {
        let mut best = f64::INFINITY;
        let unloaded = self.pushback(now, len, links, |_, delivery| best = best.min(delivery))?;
        let excess = best - unloaded - BACKPRESSURE_LATE.as_secs_f64();
        let full = excess.is_finite() && excess > 0.0;
        if full {
            // What the links deliver now is their capacity (see `Held`).
            self.full_at = Some(now);
        }
        // At least a microsecond: a wait that rounds to nothing would have the caller ask again
        // at the same instant, forever (the simulator's clock does not move by itself). At most
        // BACKPRESSURE_MAX_PAUSE: the answer is a prediction, asked again after that.
        full.then(|| {
            Duration::from_secs_f64(excess.min(BACKPRESSURE_MAX_PAUSE.as_secs_f64()))
                .max(Duration::from_micros(1))
        })
    }
    fn has_room(&mut self, now: Instant, len: usize, links: &[LinkView], link: LinkId) -> bool {
        let mut on_link = None;
        let Some(unloaded) = self.pushback(now, len, links, |id, delivery| {
            if id == link {
                on_link = Some(delivery);
            }
        }) else {
            return true;
        };
        // A link back-pressure leaves out (pulled back, or too slow to be on time) has none.
        on_link.is_some_and(|d| d - unloaded <= BACKPRESSURE_LATE.as_secs_f64())
    }
}

impl Adaptive {
    /// Back-pressure's reading of the links for a packet of `len` bytes placed now: calls
    /// `each` with every link it may take and its predicted delivery, and returns the best
    /// delivery the links give empty, against which lateness is judged. `None`: no push-back
    /// now (no equalisation, or a link still in start-up that could deliver on time).
    fn pushback(
        &mut self,
        now: Instant,
        len: usize,
        links: &[LinkView],
        mut each: impl FnMut(LinkId, f64),
    ) -> Option<f64> {
        let mut floor = self.delivery_floor(len, links);
        if floor > 0.0 {
            self.bundled = true;
        } else if let Some(owd) = self.last_link(links) {
            floor = owd;
        }
        if floor <= 0.0 {
            // No equalisation (off, or one link that was never part of a bundle): the
            // placement spills onto a slower link only behind the faster ones' queues, which a
            // push-back at 20 ms would never let build, leaving the slower links unused. One
            // link's queue is its own business. Its rate is learned by the rules that need no
            // push-back again.
            // (Asked every few packets: only a link still held is touched.)
            for e in self.table.entries.iter_mut().filter(|e| e.2.held) {
                e.2.held = false;
                e.2.hold = Held::default();
            }
            return None;
        }
        let table = &self.table;
        let clean = links
            .iter()
            .any(|v| table.get(v.id).is_some_and(|st| !st.pulled_back));
        // Each link's delivery of a packet placed now, against the best the links give empty:
        // the lateness that queues add (a single 60 ms link, or no equalisation, is no
        // lateness).
        let mut unloaded = f64::INFINITY;
        let newest = self.table.newest();
        for v in links {
            let i = self.entry(now, v, newest);
            let st = &mut self.table.entries[i].2;
            st.held = true;
            if clean && st.pulled_back {
                continue;
            }
            let empty = st.unloaded_delivery(v, floor);
            if st.startup {
                if empty - floor >= BACKPRESSURE_LATE.as_secs_f64() {
                    // Too slow to deliver on time even empty (a link beyond the equalisation
                    // bound): it takes nothing from the others, whatever its rate.
                    continue;
                }
                // A guessed rate must not hold back the traffic that would reveal the real one.
                return None;
            }
            st.drain(now);
            each(v.id, st.delivery(len, v, floor));
            unloaded = unloaded.min(empty);
        }
        Some(unloaded)
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

impl Backup {
    /// Keeps in `scratch` the links of the highest priority present; false when there are none.
    fn keep_top(&mut self, links: &[LinkView]) -> bool {
        let Some(top) = links.iter().map(|l| l.priority).max() else {
            return false;
        };
        self.scratch.clear();
        self.scratch
            .extend(links.iter().filter(|l| l.priority == top).cloned());
        true
    }
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
        if self.keep_top(links) {
            self.inner.pick(now, len, flow, &self.scratch, out);
        }
    }
    fn link_rate_bps(&self, link: LinkId) -> Option<f64> {
        self.inner.rate_bps(link)
    }
    fn link_queue(&self, now: Instant, link: LinkId) -> Option<Duration> {
        self.inner.queue(now, link)
    }
    fn link_pulled_back(&self, link: LinkId) -> Option<bool> {
        self.inner.pulled_back(link)
    }
    fn learning(&self) -> bool {
        self.inner.learning()
    }
    fn rates_known(&self) -> bool {
        self.inner.rates_known()
    }
    fn sent_copy(&mut self, now: Instant, len: usize, link: LinkId) {
        self.inner.sent_copy(now, len, link);
    }
    fn ready_in(&mut self, now: Instant, len: usize, links: &[LinkView]) -> Option<Duration> {
        if !self.keep_top(links) {
            return None;
        }
        self.inner.ready_in(now, len, &self.scratch)
    }
    fn has_room(&mut self, now: Instant, len: usize, links: &[LinkView], link: LinkId) -> bool {
        if !self.keep_top(links) {
            return true;
        }
        self.inner.has_room(now, len, &self.scratch, link)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn view(id: LinkId, bw: Option<u64>, owd_ms: u64) -> LinkView {
        LinkView {
            bandwidth_bps: bw,
            owd: ms(owd_ms),
            ..LinkView::new(id)
        }
    }

    /// Links of `(id, bit/s, one-way delay in ms)`, rates configured and delivered, round
    /// trips twice the one-way delays.
    fn known(links: &[(LinkId, u64, u64)]) -> Vec<LinkView> {
        links
            .iter()
            .map(|&(id, bw, owd)| LinkView {
                delivery_rate_bps: bw as f64,
                srtt: Some(ms(2 * owd)),
                ..view(id, Some(bw), owd)
            })
            .collect()
    }

    /// Offers `n` packets of `len` bytes at `rate_bps` (evenly spaced) and returns the bytes
    /// each link got, in the order of `links`.
    fn offer(
        s: &mut dyn Scheduler,
        t0: Instant,
        links: &[LinkView],
        n: usize,
        len: usize,
        rate_bps: f64,
    ) -> Vec<u64> {
        let gap = Duration::from_secs_f64(len as f64 * 8.0 / rate_bps);
        let mut bytes = vec![0u64; links.len()];
        let mut out = Vec::new();
        for k in 0..n {
            out.clear();
            s.pick(t0 + gap * k as u32, len, 0, links, &mut out);
            assert!(out.len() <= 1);
            if out.is_empty() {
                // `adaptive` dropped it at the sender: every link was full.
                continue;
            }
            let i = links.iter().position(|l| l.id == out[0]).unwrap();
            bytes[i] += len as u64;
        }
        bytes
    }

    /// Offers `offered` bit/s to the one link `v` for `steps` steps of 105 ms, 110 ms apart from
    /// `t0` (one adjustment each), and returns the rate assumed after each.
    fn rates_per_adjustment(
        s: &mut Adaptive,
        t0: Instant,
        v: &LinkView,
        offered: f64,
        steps: u32,
    ) -> Vec<f64> {
        let n = (0.105 * offered / 8.0 / 1250.0) as usize;
        (0..steps)
            .map(|k| {
                let at = t0 + ms(110) * k;
                offer(s, at, std::slice::from_ref(v), n, 1250, offered);
                s.rate_bps(v.id).unwrap()
            })
            .collect()
    }

    /// `n` picks of 1250 bytes, 100 us apart from `from`: every link picked, in order.
    fn picks_over(s: &mut Adaptive, from: Instant, links: &[LinkView], n: u64) -> Vec<LinkId> {
        let mut out = Vec::new();
        for k in 0..n {
            s.pick(
                from + Duration::from_micros(100 * k),
                1250,
                0,
                links,
                &mut out,
            );
        }
        out
    }

    fn shares(bytes: &[u64]) -> Vec<f64> {
        let sum: u64 = bytes.iter().sum();
        bytes.iter().map(|&b| b as f64 / sum as f64).collect()
    }

    #[test]
    fn by_name_knows_every_name() {
        for &n in NAMES {
            let s = by_name(n).unwrap();
            assert_eq!(s.name(), n);
            assert_eq!(s.ordered(), n != "flow-hash");
        }
        let e = by_name("fastest").err().unwrap();
        assert_eq!(e, UnknownScheduler("fastest".into()));
        assert!(e.to_string().contains("round-robin, weighted, adaptive"));
    }

    #[test]
    fn round_robin_takes_turns_and_survives_link_changes() {
        let t = Instant::now();
        let mut s = RoundRobin::default();
        let mut out = Vec::new();
        let links = [view(3, None, 0), view(1, None, 0), view(2, None, 0)];
        for _ in 0..6 {
            s.pick(t, 100, 0, &links, &mut out);
        }
        assert_eq!(out, vec![1, 2, 3, 1, 2, 3]);
        // Link 2 leaves, 7 joins: the turn goes on from where it was.
        out.clear();
        s.pick(t, 100, 0, &links[..2], &mut out);
        let links2 = [view(1, None, 0), view(7, None, 0), view(3, None, 0)];
        for _ in 0..4 {
            s.pick(t, 100, 0, &links2, &mut out);
        }
        assert_eq!(out, vec![1, 3, 7, 1, 3]);
    }

    #[test]
    fn weighted_eql_case_is_proportional_and_starves_nobody() {
        let t0 = Instant::now();
        let links = [view(1, Some(57_600), 0), view(2, Some(14_400), 0)];
        // Offered at a tenth of the sum of the rates, at 90% of it, at the sum, at twice the sum.
        for load in [7_200.0, 64_800.0, 72_000.0, 144_000.0] {
            let mut s = Weighted::default();
            let mut out = Vec::new();
            let mut last_slow = 0;
            let mut worst_gap = 0;
            let gap = Duration::from_secs_f64(100.0 * 8.0 / load);
            let mut bytes = [0u64; 2];
            for k in 0..10_000 {
                out.clear();
                s.pick(t0 + gap * k, 100, 0, &links, &mut out);
                bytes[(out[0] - 1) as usize] += 100;
                if out[0] == 2 {
                    worst_gap = worst_gap.max(k - last_slow);
                    last_slow = k;
                }
            }
            let sh = shares(&bytes);
            assert!(
                (sh[0] - 0.8).abs() < 0.05 * 0.8 && (sh[1] - 0.2).abs() < 0.05 * 0.2,
                "{sh:?} at {load}"
            );
            // The slow link gets one packet in five (give or take a rounding), never a drought.
            assert!(worst_gap <= 6, "slow link waited {worst_gap} packets");
        }
    }

    #[test]
    fn weighted_burst_at_one_instant_is_proportional() {
        let t = Instant::now();
        let links = [
            view(1, Some(57_600), 0),
            view(2, Some(14_400), 0),
            view(3, Some(28_800), 0),
        ];
        let mut s = Weighted::default();
        let mut out = Vec::new();
        for _ in 0..7_000 {
            s.pick(t, 100, 0, &links, &mut out);
        }
        let n = |id| out.iter().filter(|&&l| l == id).count();
        assert_eq!((n(1), n(2), n(3)), (4_000, 1_000, 2_000));
        assert_eq!(s.link_rate_bps(2), Some(14_400.0));
    }

    #[test]
    fn weighted_substitutes_missing_bandwidths() {
        let t = Instant::now();
        let mut s = Weighted::default();
        let mut out = Vec::new();
        let links = [
            view(1, Some(10_000_000), 0),
            view(2, Some(30_000_000), 0),
            view(3, None, 0),
        ];
        s.pick(t, 100, 0, &links, &mut out);
        assert_eq!(
            s.link_rate_bps(3),
            Some(20_000_000.0),
            "average of the others"
        );
        let none = [view(1, None, 0), view(2, None, 0)];
        let mut s = Weighted::default();
        s.pick(t, 100, 0, &none, &mut out);
        assert_eq!(s.link_rate_bps(1), Some(DEFAULT_BANDWIDTH_BPS));
        // Equal assumed rates: equal shares.
        let b = offer(&mut s, t, &none, 1000, 100, 1e9);
        assert_eq!(b, vec![50_000, 50_000]);
    }

    #[test]
    fn weighted_is_proportional_at_light_load_too() {
        let t = Instant::now();
        let links = [view(1, Some(14_400), 0), view(2, Some(57_600), 0)];
        let mut s = Weighted::default();
        // One 100-byte packet a second, far below either link's rate: still 20/80.
        let b = offer(&mut s, t, &links, 1000, 100, 800.0);
        assert_eq!(b, vec![20_000, 80_000]);
    }

    #[test]
    fn weighted_gives_no_burst_credit_to_a_returning_link() {
        let t = Instant::now();
        let both = [view(1, Some(1_000_000), 0), view(2, Some(1_000_000), 0)];
        let mut s = Weighted::default();
        let mut out = Vec::new();
        s.pick(t, 100, 0, &both, &mut out);
        // Link 2 away for 1000 packets, then back: it alternates at once, no catching up.
        for _ in 0..1000 {
            s.pick(t, 100, 0, &both[..1], &mut out);
        }
        out.clear();
        for _ in 0..10 {
            s.pick(t, 100, 0, &both, &mut out);
        }
        let on2 = out.iter().filter(|&&l| l == 2).count();
        assert_eq!(on2, 5, "{out:?}");
    }

    /// 10/20/50 Mbit/s links with one-way delays 5/20/40 ms, rates known.
    fn three_links() -> Vec<LinkView> {
        known(&[(1, 10_000_000, 5), (2, 20_000_000, 20), (3, 50_000_000, 40)])
    }

    #[test]
    fn adaptive_measures_a_link_that_comes_up_under_traffic_not_one_an_idle_spell_aged() {
        let t0 = Instant::now();
        // Two links, rates not configured: both in start-up.
        let links: Vec<LinkView> = [(1, 10), (2, 10)]
            .iter()
            .map(|&(id, owd)| LinkView {
                srtt: Some(ms(2 * owd)),
                ..view(id, None, owd)
            })
            .collect();
        let relearning = |s: &Adaptive, id| s.table.get(id).map(|l| l.relearning);
        // Both from the start, traffic for 2 s, then an idle spell of 5 s, then traffic again:
        // neither came up under traffic.
        let mut s = Adaptive::default();
        picks_over(&mut s, t0, &links, 10);
        picks_over(&mut s, t0 + ms(2000), &links, 10);
        picks_over(&mut s, t0 + ms(7000), &links, 10);
        assert_eq!(relearning(&s, 1), Some(false));
        assert_eq!(relearning(&s, 2), Some(false));
        // Link 2 absent (down) for the first 3 s of the traffic, then up: it is measured.
        let mut s = Adaptive::default();
        for k in 0..30 {
            picks_over(&mut s, t0 + ms(100 * k), &links[..1], 10);
        }
        assert_eq!(relearning(&s, 2), None);
        picks_over(&mut s, t0 + ms(3000), &links, 10);
        assert_eq!(relearning(&s, 1), Some(false));
        assert_eq!(relearning(&s, 2), Some(true));
        // Gone 1 s or more while link 1 carried the traffic, it is measured again only if it
        // never was (its rate configured: never).
        let configured: Vec<LinkView> = links
            .iter()
            .map(|v| LinkView {
                bandwidth_bps: Some(10_000_000),
                ..v.clone()
            })
            .collect();
        let mut s = Adaptive::default();
        picks_over(&mut s, t0, &configured, 10);
        for k in 1..30 {
            picks_over(&mut s, t0 + ms(100 * k), &configured[..1], 10);
        }
        picks_over(&mut s, t0 + ms(3000), &configured, 10);
        assert_eq!(relearning(&s, 2), Some(false));
        // An idle spell long enough that every link is forgotten: traffic after it starts as a
        // session does, its links left to the inner flows' start-up.
        let mut s = Adaptive::default();
        picks_over(&mut s, t0, &links, 10);
        picks_over(&mut s, t0 + FORGET_AFTER + ms(5000), &links, 10);
        assert_eq!(relearning(&s, 1), Some(false));
        assert_eq!(relearning(&s, 2), Some(false));
    }

    #[test]
    fn adaptive_keeps_a_link_in_use_when_its_delay_rises_past_the_peers_hold_for_now() {
        let t0 = Instant::now();
        let mut s = Adaptive::default();
        s.set_equalization(ms(150), 1000);
        // The peer holds 18 ms for now; link 2 (30 Mbit/s) 18 ms slower than link 1.
        s.cap_equalization(Some(ms(18)));
        let mut links = known(&[(1, 10_000_000, 15), (2, 30_000_000, 33)]);
        assert!(picks_over(&mut s, t0, &links, 200).contains(&2));
        // Its delay rises 6 ms past the hold: in use, it keeps its share.
        links[1].owd = ms(15 + 18 + 2 + 6);
        let got = picks_over(&mut s, t0 + ms(100), &links, 400);
        let on_2 = got.iter().filter(|&&l| l == 2).count();
        assert!(on_2 > 200, "{on_2} of 400 on the 30 Mbit/s link");
        // 50 ms past the hold, a new route rather than a wobble: left out, in use or not.
        links[1].owd = ms(15 + 18 + 2 + 50);
        let got = picks_over(&mut s, t0 + ms(200), &links, 400);
        assert!(!got.contains(&2), "taken in 50 ms past the hold");
        links[1].owd = ms(15 + 18 + 2 + 6);
        // A link not in use that far (back after 1 s away, say) is not taken in yet.
        let mut fresh = Adaptive::default();
        fresh.set_equalization(ms(150), 1000);
        fresh.cap_equalization(Some(ms(18)));
        assert!(!picks_over(&mut fresh, t0, &links, 200).contains(&2));
    }

    #[test]
    fn adaptive_shares_are_rate_proportional_at_full_load() {
        let t0 = Instant::now();
        let mut links = three_links();
        let caps = [10e6, 20e6, 50e6];
        let mut s = Adaptive::default();
        let mut out = Vec::new();
        let mut bytes = [0u64; 3];
        // 5 s at 80 Mbit/s of 1250-byte packets. Every 100 ms the links report what links of
        // exactly the configured rates would: that rate delivered, and as queueing delay the
        // queue the scheduler itself put there.
        let gap = Duration::from_secs_f64(1250.0 * 8.0 / 80e6);
        for k in 0..40_000u32 {
            let now = t0 + gap * k;
            if k % 800 == 0 {
                for (l, cap) in links.iter_mut().zip(caps) {
                    let q = s.backlog_bytes(l.id).unwrap_or(0.0) * 8.0 / cap;
                    l.qdelay = Duration::from_secs_f64(q);
                }
            }
            out.clear();
            s.pick(now, 1250, 0, &links, &mut out);
            if let Some(&id) = out.first() {
                bytes[(id - 1) as usize] += 1250;
            }
        }
        let sh = shares(&bytes);
        for (got, want) in sh.iter().zip([0.125, 0.25, 0.625]) {
            assert!((got - want).abs() < 0.05 * want, "shares {sh:?}");
        }
        // Nothing dropped at the sender: the load fits.
        assert_eq!(bytes.iter().sum::<u64>(), 40_000 * 1250);
        // The rates stay close to the truth.
        for (l, cap) in links.iter().zip(caps) {
            let r = s.rate_bps(l.id).unwrap();
            assert!(r >= cap && r <= 1.25 * cap, "link {}: {r}", l.id);
        }
    }

    #[test]
    fn adaptive_light_load_goes_to_the_low_delay_link() {
        let t0 = Instant::now();
        let links = three_links();
        let mut s = Adaptive::default();
        // 2 Mbit/s: the 5 ms link never queues 15 ms worth, so it takes everything.
        let b = offer(&mut s, t0, &links, 2_000, 1250, 2e6);
        assert_eq!(b, vec![2_000 * 1250, 0, 0]);
    }

    #[test]
    fn adaptive_under_equalisation_spills_before_the_floor_hides_a_queue() {
        // Two 20 Mbit/s links at 10 and 40 ms, equalised: the 10 ms link could hold 30 ms of
        // queue before a packet on it came later than the floor. Offered 10% above one link's
        // rate (a paced sender probing), the second link takes the excess while the first holds
        // a few ms, not 30: the probe is delivered, not queued.
        let t0 = Instant::now();
        let links: Vec<LinkView> = [(1, 10), (2, 40)]
            .iter()
            .map(|&(id, owd)| LinkView {
                delivery_rate_bps: 20e6,
                srtt: Some(ms(2 * owd)),
                ..view(id, Some(20_000_000), owd)
            })
            .collect();
        let mut s = Adaptive::default();
        s.set_equalization(ms(100), 300);
        // 0.5 s at 22 Mbit/s of 1250-byte packets.
        let b = offer(&mut s, t0, &links, 1100, 1250, 22e6);
        assert_eq!(b.iter().sum::<u64>(), 1100 * 1250, "nothing dropped: {b:?}");
        let (q1, q2) = (queue_ms(&s, 1), queue_ms(&s, 2));
        assert!(q1 < 8.0, "the 10 ms link queued {q1:.1} ms");
        assert!(q2 < 2.0, "the 40 ms link queued {q2:.1} ms");
        // The second link carried the excess: about 2 of the 22 Mbit/s.
        assert!(b[1] > 1100 * 1250 / 20, "{b:?}");
    }

    #[test]
    fn adaptive_under_equalisation_fills_links_by_rate_at_light_load() {
        let t0 = Instant::now();
        let links = three_links();
        let mut s = Adaptive::default();
        s.set_equalization(Duration::from_millis(100), 300);
        // The peer holds bulk packets until the 40 ms link would have brought them, so every
        // link delivers at the same time: at light load the packet goes where it is on the wire
        // soonest (the fastest rate, here never queued), not to the lowest delay...
        let b = offer(&mut s, t0, &links, 2_000, 1250, 8e6);
        assert_eq!(b, vec![0, 0, 2_000 * 1250]);
        // ...and a load above two links' rates takes the third at once, with no link queueing
        // ahead of the others (earliest arrival without equalisation fills the 5 ms link up to
        // 15 ms of queue first).
        let b = offer(
            &mut s,
            t0 + Duration::from_secs(1),
            &links,
            20_000,
            1250,
            72e6,
        );
        assert_eq!(b.iter().sum::<u64>(), 20_000 * 1250, "{b:?}");
        assert!(b.iter().all(|&x| x > 0), "{b:?}");
        for l in &links {
            let q = s.backlog_bytes(l.id).unwrap() * 8.0 / s.rate_bps(l.id).unwrap();
            assert!(q < 0.002, "link {} queues {:.1} ms", l.id, q * 1e3);
        }
        // Small packets (acks), which the peer does not hold, still take the earliest link.
        let b = offer(&mut s, t0 + Duration::from_secs(2), &links, 100, 100, 1e5);
        assert_eq!(b, vec![100 * 100, 0, 0]);
        // A link 1.5 x the bound slower is not waited for: the floor is the 20 ms link's, and
        // the 200 ms link is used only once the others queue that much.
        let mut far = three_links();
        far[2].owd = Duration::from_millis(200);
        let mut s = Adaptive::default();
        s.set_equalization(Duration::from_millis(100), 300);
        let b = offer(&mut s, t0, &far, 2_000, 1250, 2e6);
        assert_eq!(b, vec![0, 2_000 * 1250, 0]);
    }

    #[test]
    fn equalisation_waits_for_a_link_a_little_beyond_the_bound_and_never_jumps() {
        let b = ms(100);
        assert_eq!(equalize_wait(ms(40), b), ms(40));
        assert_eq!(equalize_wait(ms(100), b), ms(100));
        // 20 and 121 ms: held to the bound (it was 0, a jump of 100 ms at the bound).
        assert_eq!(equalize_wait(ms(101), b), ms(100));
        assert_eq!(equalize_wait(ms(125), b), ms(100));
        assert!((equalize_wait(ms(140), b).as_secs_f64() - 0.040).abs() < 1e-9);
        assert_eq!(equalize_wait(ms(150), b), Duration::ZERO);
        assert_eq!(equalize_wait(ms(600), b), Duration::ZERO);
        assert_eq!(equalize_wait(ms(10), Duration::ZERO), Duration::ZERO);
        assert_eq!(equalize_wait(ms(10), Duration::MAX), ms(10));
        // No step anywhere: 1 ms more spread changes the wait by 4 ms at most.
        let mut prev = Duration::ZERO;
        for s in 0..400 {
            let w = equalize_wait(ms(s), b);
            assert!(w.abs_diff(prev) <= ms(4), "at {s} ms: {prev:?} -> {w:?}");
            prev = w;
        }
        // The sender plans with it: 20 and 121 ms under a 100 ms bound put the floor at 120.
        let mut s = Adaptive::default();
        s.set_equalization(b, 300);
        let links = [
            view(1, Some(10_000_000), 20),
            view(2, Some(10_000_000), 121),
        ];
        assert!((s.delivery_floor(1250, &links) - 0.120).abs() < 1e-9);
    }

    #[test]
    fn adaptive_plans_no_deeper_queue_than_a_buffer_holds() {
        // 50 Mbit/s at 10 ms and 7 Mbit/s at 150 ms, equalised up to 160 ms: a packet on the
        // fast link arrives by the floor even behind 140 ms of queue, more than real buffers
        // hold (drops); the plan stops at PLANNED_QUEUE_MAX and the slow link takes the rest.
        let t0 = Instant::now();
        let links = known(&[(1, 50_000_000, 10), (2, 7_000_000, 150)]);
        let mut s = Adaptive::default();
        s.set_equalization(Duration::from_millis(160), 300);
        // A burst at 1 Gbit/s: 300 packets of 1250 bytes, 60 ms of the fast link. Without the
        // bound all of it went to the fast link.
        let b = offer(&mut s, t0, &links, 300, 1250, 1e9);
        assert!(b[1] > 0, "the slow link takes part: {b:?}");
        let q = s.backlog_bytes(1).unwrap() * 8.0 / s.rate_bps(1).unwrap();
        // (All of it there would be 60 ms; the bound leaves it a few packets above 50.)
        assert!(
            q <= PLANNED_QUEUE_MAX.as_secs_f64() + 0.008,
            "fast link planned {:.0} ms of queue",
            q * 1e3
        );
    }

    #[test]
    fn a_copy_has_room_only_where_it_comes_on_time() {
        // 50/20/7 Mbit/s at 10/60/150 ms equalised to 150 ms, rates configured, kept full by
        // back-pressure; then the 50 Mbit/s link dies and its copies go where they arrive
        // soonest (the endpoint's choice), as long as that link has room.
        let t0 = Instant::now();
        let links = known(&[
            (1, 50_000_000, 10),
            (2, 20_000_000, 60),
            (3, 7_000_000, 150),
        ]);
        let mut s = Adaptive::default();
        s.set_equalization(ms(150), 300);
        let mut now = t0;
        let mut out = Vec::new();
        for _ in 0..20_000 {
            now += Duration::from_micros(100);
            if s.ready_in(now, 1500, &links).is_none() {
                out.clear();
                s.pick(now, 1442, 0, &links, &mut out);
            }
        }
        let left = &links[1..];
        let queue_ms = |s: &Adaptive, now, id| s.queue(now, id).unwrap().as_secs_f64() * 1e3;
        let mut copies = [0; 2];
        let mut most = [0.0f64; 2];
        // 400 copies (the lab's count) as the links left drain, a millisecond at a time.
        for _ in 0..300 {
            now += ms(1);
            while copies.iter().sum::<u32>() < 400 {
                // Soonest by base delay and queue, among the links with room.
                let room: Vec<&LinkView> = left
                    .iter()
                    .filter(|v| s.has_room(now, 1500, left, v.id))
                    .collect();
                let at = |v: &LinkView| v.owd.as_secs_f64() * 1e3 + queue_ms(&s, now, v.id);
                let Some(v) = room.into_iter().min_by(|a, b| at(a).total_cmp(&at(b))) else {
                    // Full for copies is full for everything.
                    assert!(s.ready_in(now, 1500, left).is_some());
                    break;
                };
                s.sent_copy(now, 1442, v.id);
                let k = v.id as usize - 2;
                copies[k] += 1;
                most[k] = most[k].max(queue_ms(&s, now, v.id));
            }
        }
        assert_eq!(copies.iter().sum::<u32>(), 400, "all sent within 300 ms");
        assert!(copies[1] > 0, "the 150 ms link takes its part: {copies:?}");
        // The 60 ms link stops at what the placement plans plus the lateness allowed, short of
        // the 90 ms the 150 ms link's delay would leave it by arrival time alone.
        let late = BACKPRESSURE_LATE.as_secs_f64() * 1e3;
        let planned = PLANNED_QUEUE_MAX.as_secs_f64() * 1e3;
        assert!(
            most[0] <= planned + late + 1.0,
            "60 ms link queued {:.0} ms",
            most[0]
        );
        // The 150 ms link comes late behind its own queue only by what is allowed.
        assert!(
            most[1] <= late + 2.0,
            "150 ms link queued {:.0} ms",
            most[1]
        );
    }

    /// 50 Mbit/s at 10 ms and 20 Mbit/s at 60 ms, rates configured (no start-up).
    fn fast_and_slow() -> Vec<LinkView> {
        known(&[(1, 50_000_000, 10), (2, 20_000_000, 60)])
    }

    fn queue_ms(s: &Adaptive, link: LinkId) -> f64 {
        s.backlog_bytes(link).unwrap() * 8.0 / s.rate_bps(link).unwrap() * 1e3
    }

    #[test]
    fn adaptive_pushes_back_once_even_the_best_link_would_deliver_late() {
        // Equalised, the fast link's queue up to the planned 50 ms costs no lateness: the push
        // back starts once even the best link would deliver BACKPRESSURE_LATE beyond the floor
        // (the fast one behind ~70 ms; the slow one, at the floor, behind ~21.6: its lateness
        // weighed against HIDDEN_QUEUE_WEIGHT of the fast one's hidden 50 ms), and lifts once
        // they drained.
        let t0 = Instant::now();
        let links = fast_and_slow();
        let mut s = Adaptive::default();
        s.set_equalization(ms(100), 300);
        assert_eq!(s.ready_in(t0, 1500, &links), None, "empty links");
        let mut out = Vec::new();
        let mut placed = 0;
        while s.ready_in(t0, 1500, &links).is_none() {
            out.clear();
            s.pick(t0, 1250, 0, &links, &mut out);
            assert_eq!(out.len(), 1, "nothing is dropped before the push back");
            placed += 1;
            assert!(placed < 10_000, "no push back after {placed} packets");
        }
        let late = BACKPRESSURE_LATE.as_secs_f64() * 1e3;
        let (q1, q2) = (queue_ms(&s, 1), queue_ms(&s, 2));
        let hidden = 50.0 * HIDDEN_QUEUE_WEIGHT;
        assert!(
            (q2 - late - hidden).abs() < 1.5,
            "slow link queued {q2:.1} ms"
        );
        assert!(
            (q1 - 50.0 - late).abs() < 1.5,
            "fast link queued {q1:.1} ms"
        );
        let d = s.ready_in(t0, 1500, &links).unwrap();
        assert!(
            d < ms(1),
            "{d:?}: the push back lasts until the next packet fits"
        );
        assert_eq!(
            s.ready_in(t0 + d + Duration::from_micros(20), 1500, &links),
            None
        );
        // A long way over: one pause of at most BACKPRESSURE_MAX_PAUSE, then asked again.
        for _ in 0..2000 {
            out.clear();
            s.pick(t0, 1250, 0, &links, &mut out);
        }
        assert_eq!(s.ready_in(t0, 1500, &links), Some(BACKPRESSURE_MAX_PAUSE));
    }

    #[test]
    fn adaptive_pushes_back_only_under_equalisation() {
        // Without an equalisation floor (off, one link that was never part of a bundle, or no
        // link UP) no push back at all: a slower link takes traffic only behind the faster
        // one's queue, which a push back at 20 ms would never let build (and before this rule a
        // single 60 ms link read as 40 ms late and paused the TUN for good).
        let t0 = Instant::now();
        let mut degraded = fast_and_slow();
        for v in &mut degraded {
            v.state = LinkState::Degraded;
        }
        let slow = fast_and_slow()[1].clone();
        let mut out = Vec::new();
        for (what, links, equalise) in [
            ("one 60 ms link", vec![slow], true),
            ("no equalisation", fast_and_slow(), false),
            ("no link up", degraded, true),
        ] {
            let mut s = Adaptive::default();
            if equalise {
                s.set_equalization(ms(100), 300);
            }
            for _ in 0..5000 {
                out.clear();
                s.pick(t0, 1250, 0, &links, &mut out);
            }
            assert!(queue_ms(&s, links[0].id) > 100.0, "{what}");
            assert_eq!(s.ready_in(t0, 1500, &links), None, "{what}");
        }
    }

    #[test]
    fn adaptive_holds_the_link_a_bundle_is_left_with() {
        // Two equalised links, then the fast one gone: the slow one is held as the bundle's
        // links were (the excess waits in the bundle's queue instead of its buffer), once its
        // queue is BACKPRESSURE_LATE deep, and free again once that drained.
        let t0 = Instant::now();
        let links = fast_and_slow();
        let mut s = Adaptive::default();
        s.set_equalization(ms(100), 300);
        assert_eq!(s.ready_in(t0, 1500, &links), None, "the bundle, empty");
        let slow = &links[1..];
        let mut out = Vec::new();
        let mut placed = 0;
        while s.ready_in(t0, 1500, slow).is_none() {
            out.clear();
            s.pick(t0, 1250, 0, slow, &mut out);
            assert_eq!(out.len(), 1);
            placed += 1;
            assert!(placed < 10_000, "no push back after {placed} packets");
        }
        let late = BACKPRESSURE_LATE.as_secs_f64() * 1e3;
        let q = queue_ms(&s, 2);
        assert!((q - late).abs() < 1.5, "the link left queued {q:.1} ms");
        let d = s.ready_in(t0, 1500, slow).unwrap();
        assert_eq!(s.ready_in(t0 + d + ms(1), 1500, slow), None, "drained");
    }

    #[test]
    fn adaptive_never_pushes_back_on_a_guessed_rate() {
        // Unconfigured links in start-up: a rate still being learned must not hold back the
        // traffic that would reveal the real one.
        let t0 = Instant::now();
        let links: Vec<LinkView> = fast_and_slow()
            .into_iter()
            .map(|v| LinkView {
                bandwidth_bps: None,
                delivery_rate_bps: 0.0,
                ..v
            })
            .collect();
        let mut s = Adaptive::default();
        let mut out = Vec::new();
        for _ in 0..1000 {
            out.clear();
            s.pick(t0, 1250, 0, &links, &mut out);
        }
        assert!(
            queue_ms(&s, 1) > 1000.0,
            "the guessed 1 Mbit/s is far behind"
        );
        assert_eq!(s.ready_in(t0, 1500, &links), None);
    }

    /// Runs `rounds` adjustments of a held link that carries at most `capacity` and whose
    /// peer reads `qdelay`, the bundle full, the delivery rate lagging one adjustment behind
    /// what it was given; `planned`: the placement keeps a queue there that `qdelay` confirms.
    /// Returns the rates learned and whether a probe was seen.
    fn held_rounds(
        rate: f64,
        capacity: f64,
        qdelay: Duration,
        planned: bool,
        rounds: usize,
    ) -> (Vec<f64>, bool) {
        let mut h = Held::default();
        let (mut rate, mut given, mut probed) = (rate, rate, false);
        let mut rates = Vec::new();
        for _ in 0..rounds {
            let delivered = given.min(capacity);
            rate = h.adjust(rate, true, delivered, qdelay, planned, ms(100));
            probed |= matches!(h.probe, Probe::Up { .. });
            given = rate * h.gain();
            rates.push(rate);
        }
        (rates, probed)
    }

    #[test]
    fn held_link_that_jitters_is_probed_up_to_its_capacity() {
        // LTE: 30 Mbit/s, its jitter read as 20 ms of queue, its rate learned at 3 Mbit/s;
        // planned a queue it does not have or not, the jitter confirming it.
        for planned in [false, true] {
            let (rates, _) = held_rounds(3e6, 30e6, ms(20), planned, 60);
            let last = *rates.last().unwrap();
            assert!((0.9 * 30e6..=30e6).contains(&last), "{planned}: {rates:?}");
            // Probes that are delivered are repeated at once: there in under 40 adjustments.
            assert!(rates[40] >= 0.9 * 30e6, "{planned}: {rates:?}");
        }
    }

    #[test]
    fn held_link_at_its_capacity_under_its_planned_queue_is_probed_once() {
        // LTE's steady 10 Mbit/s link, queued 30 ms by the placement and read at 25: one probe
        // finds the rate is the capacity; no more while that queue stands, and again once it
        // no longer does.
        let mut h = Held::default();
        let mut probes = 0;
        for _ in 0..60 {
            h.adjust(10e6, true, 10e6, ms(25), true, ms(100));
            probes += usize::from(matches!(h.probe, Probe::Up { .. }));
        }
        assert_eq!((probes, h.max()), (1, 10e6));
        for _ in 0..h.cruise() {
            h.adjust(10e6, true, 10e6, ms(5), false, ms(100));
        }
        assert!(matches!(h.probe, Probe::Up { .. }), "{:?}", h.probe);
        // Without the planned queue the same link probes every few adjustments.
        let (_, probed) = held_rounds(10e6, 10e6, ms(25), false, 10);
        assert!(probed);
    }

    #[test]
    fn learning_while_a_usable_held_link_is_unsettled() {
        // The bundle's queue drops nothing for waiting while `learning`; a link that died must
        // not keep it so (its entry stays for FORGET_AFTER).
        let t0 = Instant::now();
        let mut links = fast_and_slow();
        links.insert(0, view(3, Some(20_000_000), 30));
        let mut s = Adaptive::default();
        s.set_equalization(ms(100), 300);
        s.ready_in(t0, 1500, &links);
        for e in &mut s.table.entries {
            e.2.startup = false;
            e.2.hold.settled = e.0 != 2;
        }
        assert!(s.learning(), "link 2 has not found its capacity");
        s.ready_in(t0 + ms(10), 1500, &links[..2]);
        assert!(!s.learning(), "link 2 is no longer usable");
        s.ready_in(t0 + ms(20), 1500, &links);
        assert!(s.learning(), "link 2 is back");
        for e in &mut s.table.entries {
            e.2.hold.settled = true;
        }
        assert!(!s.learning());
        // A link pulled back for loss, or DEGRADED, is given no data and never settles: it
        // must not keep the bundle learning while another link carries the traffic ...
        for e in &mut s.table.entries {
            e.2.hold.settled = e.0 != 2;
            e.2.pulled_back = e.0 == 2;
        }
        assert!(!s.learning(), "link 2 is pulled back");
        links[2].state = LinkState::Degraded;
        for e in &mut s.table.entries {
            e.2.pulled_back = false;
        }
        s.pick(t0 + ms(30), 1500, 0, &links, &mut Vec::new());
        s.ready_in(t0 + ms(30), 1500, &links);
        assert!(!s.learning(), "link 2 is DEGRADED");
        // ... but when every link is avoided, they all carry the traffic again.
        for e in &mut s.table.entries {
            e.2.pulled_back = true;
        }
        assert!(s.learning(), "every link is avoided: link 2 is in use");
    }

    #[test]
    fn held_link_is_settled_once_a_probe_is_not_carried() {
        // The bundle's queue drops nothing for waiting while a link is still learning
        // (`Scheduler::learning`): climbing from 3 to 30 Mbit/s every probe is carried; at 30
        // the next one is not, and the link is settled.
        let mut h = Held::default();
        let (mut rate, mut given): (f64, f64) = (3e6, 3e6);
        let mut settled_at = None;
        for i in 0..80 {
            rate = h.adjust(rate, true, given.min(30e6), ms(10), false, ms(100));
            given = rate * h.gain();
            if h.settled && settled_at.is_none() {
                settled_at = Some((i, rate));
            }
        }
        let (i, r) = settled_at.expect("settled");
        assert!(r >= 0.9 * 30e6, "settled at {r} after {i} adjustments");
        assert!(h.settled);
    }

    #[test]
    fn held_link_probes_less_often_while_its_probes_are_not_carried() {
        // At its capacity: 4, 8, then 16 full adjustments between probes (the cruise counted
        // from the drain's end; the first from the first adjustment, which is its second).
        // Once the capacity doubles, the next probe is carried, repeated at once, and the rate
        // is there within a cruise and a few probes.
        let mut h = Held::default();
        let (mut rate, mut given, mut capacity): (f64, f64, f64) = (10e6, 10e6, 10e6);
        let mut cruises = Vec::new();
        let mut cruising = 0;
        let mut rates = Vec::new();
        for i in 0..140 {
            if i == 100 {
                capacity = 20e6;
            }
            rate = h.adjust(rate, true, given.min(capacity), ms(10), false, ms(100));
            given = rate * h.gain();
            rates.push(rate);
            match h.probe {
                Probe::Cruise(_) => cruising += 1,
                Probe::Up { .. } if cruising > 0 => {
                    cruises.push(cruising);
                    cruising = 0;
                }
                _ => {}
            }
        }
        assert_eq!(cruises[..5], [3, 8, 16, 16, 16], "{cruises:?}");
        assert!(rates[99] == 10e6 && rates[130] >= 0.9 * 20e6, "{rates:?}");
    }

    #[test]
    fn held_link_that_is_full_keeps_its_rate() {
        let (rates, probed) = held_rounds(10e6, 10e6, ms(20), false, 60);
        assert!(probed, "a full link is probed now and then");
        assert!(rates.iter().all(|&r| r == 10e6), "{rates:?}");
        // Deeply queued: no probe at all (it would only deepen the queue).
        let (rates, probed) = held_rounds(10e6, 10e6, PROBE_MAX_QDELAY, false, 60);
        assert!(!probed);
        assert!(rates.iter().all(|&r| r == 10e6), "{rates:?}");
    }

    #[test]
    fn held_link_full_behind_a_deep_queue_is_settled() {
        // The placement keeps the faster links queued under equalisation, so they are never
        // probed; full with that queue they carry all they can, and must not keep the bundle
        // "learning" (its queue then never dropped a packet for waiting).
        let mut h = Held::default();
        h.adjust(10e6, true, 10e6, PROBE_MAX_QDELAY, false, ms(100));
        assert!(h.settled);
        // Not full, or with less queue than that: nothing is known yet.
        for qdelay in [ms(0), PROBE_MAX_QDELAY - ms(1)] {
            let mut h = Held::default();
            h.adjust(10e6, false, 10e6, PROBE_MAX_QDELAY, false, ms(100));
            h.adjust(10e6, true, 10e6, qdelay, false, ms(100));
            assert!(!h.settled);
        }
    }

    #[test]
    fn held_link_left_idle_while_the_bundle_is_full_keeps_its_rate() {
        // The placement avoids a link (DEGRADED after lost probes, or pulled back) while the
        // others keep the bundle full: what it delivers then, next to nothing, is not its
        // capacity. Taken as such, a 10 Mbit/s link of the simulator's 20/120 ms mix fell to
        // 60 kbit/s within a second and was starved for good (the 10/20/50 BBR upload with
        // back-pressure: 79-83% of the sum, 91% once fixed).
        let t0 = Instant::now();
        let v = LinkView {
            delivery_rate_bps: 10_000.0,
            srtt: Some(ms(40)),
            ..view(1, None, 20)
        };
        // 30 adjustments of 100 ms, each found full, the link busy `busy` seconds of each.
        let rate_after = |busy: f64| {
            let mut st = AdaptiveLink::new(t0, &v);
            (st.startup, st.held, st.rate) = (false, true, 10e6);
            for k in 1..=30 {
                let now = t0 + ms(100 * k);
                st.busy = busy;
                st.adjust(now, &v, Some(now));
            }
            st.rate
        };
        assert_eq!(rate_after(0.0), 10e6);
        // Kept busy, the same delivery is its capacity: the rate follows it down.
        let busy = rate_after(0.1);
        assert!(busy < 1e6, "{busy}");
    }

    #[test]
    fn delay_floor_is_the_excess_every_recent_adjustment_read() {
        let near = |a: Duration, b: Duration| a.abs_diff(b) < Duration::from_micros(1);
        let mut f = DelayFloor::default();
        // Fewer than FLOOR_ROUNDS readings: all of it is ours.
        for _ in 1..FLOOR_ROUNDS {
            assert_eq!(f.ours(ms(35), 0.020), ms(35));
        }
        // Each of the last FLOOR_ROUNDS 15 ms above the virtual queue: that is the floor.
        assert!(near(f.ours(ms(35), 0.020), ms(20)));
        // One reading at the virtual queue: no floor while it is among the last ones.
        assert_eq!(f.ours(ms(20), 0.020), ms(20));
        for _ in 1..FLOOR_ROUNDS {
            assert_eq!(f.ours(ms(35), 0.020), ms(35));
        }
        assert!(near(f.ours(ms(35), 0.020), ms(20)));
        // A growing reading is read beyond its least excess.
        assert!(near(f.ours(ms(80), 0.020), ms(65)));
        // Garbage from the peer: no panic, and never more than the reading.
        let mut f = DelayFloor::default();
        for _ in 0..FLOOR_ROUNDS {
            assert!(f.ours(Duration::MAX, 0.0) <= Duration::MAX);
        }
        assert!(f.ours(ms(5), 0.0) <= ms(5));
    }

    #[test]
    fn held_link_keeps_its_rate_under_a_delay_it_has_at_any_load() {
        // A jittery link under load: the peer reads 35 ms of queueing delay, more than the
        // 19 ms the placement keeps queued on it, and the reading stays whatever it is given
        // (`DelayFloor`). The inner flow lulls (BBR's PROBE_RTT): 15 Mbit/s delivered of 20.
        // That is no capacity, and the rate stays; read as a queue, the lull was a full link
        // delivering 15 and the rate slid to it. A reading that grows is a queue of ours: under
        // it the lull is the link's capacity, and the rate comes down to it.
        let t0 = Instant::now();
        let rates = |reading: &dyn Fn(u64) -> Duration| {
            let v = view(1, None, 40);
            let mut st = AdaptiveLink::new(t0, &v);
            (st.startup, st.held, st.rate) = (false, true, 20e6);
            let planned = 0.019;
            st.vq_prev = planned;
            let mut rates = Vec::new();
            for k in 1..=30 {
                let now = t0 + ms(100 * k);
                let v = LinkView {
                    delivery_rate_bps: 15e6,
                    srtt: Some(ms(100)),
                    qdelay: reading(k),
                    ..view(1, None, 40)
                };
                // The placement refills the link to its planned queue; never found full.
                st.backlog = planned * st.rate / 8.0;
                st.busy = 0.1;
                st.adjust(now, &v, None);
                rates.push(st.rate);
            }
            rates
        };
        let steady = rates(&|_| ms(35));
        assert!(steady.iter().all(|&r| r == 20e6), "{steady:?}");
        let growing = rates(&|k| ms(35 + 10 * k));
        assert_eq!(*growing.last().unwrap(), 15e6, "{growing:?}");
    }

    #[test]
    fn held_link_learned_too_high_comes_down_under_its_own_queue() {
        // A 50 Mbit/s link learned at 58.5 (one delivery sample above its capacity lifted the
        // maximum): the model drains it faster than it does, so back-pressure never finds the
        // bundle full, while the peer measures a queue standing on it. That queue is the link
        // full: its delivery, 50, is its capacity, and the rate comes down to it once the
        // sample from above has left the filter.
        let t0 = Instant::now();
        let rates_from = |rate: f64, qdelay: Duration| {
            let v = LinkView {
                delivery_rate_bps: 50e6,
                srtt: Some(ms(80)),
                qdelay,
                ..view(1, None, 10)
            };
            let mut st = AdaptiveLink::new(t0, &v);
            (st.startup, st.held, st.rate) = (false, true, rate);
            let mut rates = Vec::new();
            for k in 1..=30 {
                let now = t0 + ms(100 * k);
                st.busy = 0.1;
                // Never found full by back-pressure.
                st.adjust(now, &v, None);
                rates.push(st.rate);
            }
            rates
        };
        let rates = rates_from(58.5e6, ms(60));
        assert_eq!(*rates.last().unwrap(), 50e6, "{rates:?}");
        assert!(rates[..5].iter().all(|&r| r == 58.5e6), "{rates:?}");
        // No queue on it: the flow sends less than the link carries, which says nothing of its
        // capacity, and the rate stays (as `held_link_keeps_its_rate_while_the_flow_sends_less`).
        for qdelay in [ms(0), PROBE_MAX_QDELAY - ms(1)] {
            let rates = rates_from(58.5e6, qdelay);
            assert!(rates.iter().all(|&r| r == 58.5e6), "{qdelay:?}: {rates:?}");
        }
        // Nor is a reading above the rate while the queue stands: noise, not capacity.
        let v = LinkView {
            delivery_rate_bps: 56e6,
            srtt: Some(ms(80)),
            qdelay: ms(60),
            ..view(1, None, 10)
        };
        let mut st = AdaptiveLink::new(t0, &v);
        (st.startup, st.held, st.rate) = (false, true, 50e6);
        st.busy = 0.1;
        st.adjust(t0 + ms(100), &v, None);
        assert_eq!(st.rate, 50e6);
        // Within what a carried probe adds (PROBE_SUCCESS): a queue reading may be jitter, and
        // the rate stays.
        let rates = rates_from(53e6, ms(60));
        assert!(rates.iter().all(|&r| r == 53e6), "{rates:?}");
    }

    /// The link's path marks our packets (LINK-CE): held or not, the link is given a little
    /// less than it delivered (at most MAX_DECREASE a step), at each rise of the count, and a
    /// held link's samples above that are forgotten; a new session's count from 0 is no mark.
    #[test]
    fn a_link_whose_path_marks_congestion_backs_off_below_what_it_delivers() {
        let t0 = Instant::now();
        for held in [false, true] {
            let mut v = LinkView {
                delivery_rate_bps: 20e6,
                srtt: Some(ms(40)),
                qdelay: ms(4),
                ..view(1, Some(25_000_000), 10)
            };
            let mut st = AdaptiveLink::new(t0, &v);
            (st.startup, st.held) = (false, held);
            st.busy = 0.1;
            st.adjust(t0 + ms(100), &v, None);
            assert_eq!(st.rate, 25e6, "held {held}: no mark, the rate stays");
            v.ce_marks = 3;
            st.busy = 0.1;
            st.adjust(t0 + ms(200), &v, None);
            // (No lower than MAX_DECREASE of the rate in one step.)
            assert_eq!(
                st.rate,
                (CE_DECREASE_TO * 20e6).max(25e6 * MAX_DECREASE),
                "held {held}"
            );
            v.ce_marks = 5;
            st.busy = 0.1;
            st.adjust(t0 + ms(300), &v, None);
            assert_eq!(st.rate, CE_DECREASE_TO * 20e6, "held {held}");
            // The count did not rise: no cut (the rules without marks go on: a link not held
            // takes what it delivered, a held one keeps its capped samples).
            st.busy = 0.1;
            st.adjust(t0 + ms(400), &v, None);
            assert!(st.rate >= CE_DECREASE_TO * 20e6, "held {held}: {}", st.rate);
            assert!(!held || st.rate <= 20e6, "held: {}", st.rate);
            // A new session counts from 0 again: no mark.
            v.ce_marks = 0;
            let before = st.rate;
            st.busy = 0.1;
            st.adjust(t0 + ms(700), &v, None);
            assert!(
                st.rate >= before * 0.999,
                "held {held}: {} -> {}",
                before,
                st.rate
            );
        }
    }

    #[test]
    fn held_link_keeps_its_rate_while_the_flow_sends_less() {
        // The bundle not full (the inner flow in a lull): what the link delivers is the flow's
        // rate, not the link's, and does not pull the rate down; nor is the link probed.
        let mut h = Held::default();
        for _ in 0..30 {
            assert_eq!(h.adjust(20e6, false, 12e6, ms(5), false, ms(100)), 20e6);
            assert_eq!(h.probe, Probe::Cruise(0));
        }
        // A flow's rate above the maximum still counts: the link carried that much.
        assert_eq!(h.adjust(20e6, false, 22e6, ms(5), false, ms(100)), 22e6);
    }

    #[test]
    fn held_link_probes_less_above_its_queue_when_its_srtt_is_long() {
        let mut h = Held::default();
        for _ in 0..PROBE_EVERY {
            h.adjust(20e6, true, 20e6, ms(5), false, ms(200));
        }
        // Half the gain for twice the interval: the same 25 ms of excess queue.
        assert_eq!(
            h.probe,
            Probe::Up {
                base: 20e6,
                gain: 1.125
            }
        );
    }

    #[test]
    fn adaptive_holds_links_only_while_it_may_push_back() {
        let t0 = Instant::now();
        let links = fast_and_slow();
        let mut s = Adaptive::default();
        s.set_equalization(ms(100), 256);
        let mut out = Vec::new();
        s.pick(t0, 1250, 0, &links, &mut out);
        let _ = s.ready_in(t0, 1500, &links);
        assert!(s.table.get(1).unwrap().held);
        // Equalisation off (or one link left): no push-back, so the rate is learned by the
        // rules that need none, from the rate held so far.
        s.set_equalization(Duration::ZERO, 256);
        assert_eq!(s.ready_in(t0, 1500, &links), None);
        let st = s.table.get(1).unwrap();
        assert!(!st.held);
        assert_eq!(st.hold.n, 0);
    }

    #[test]
    fn held_link_forgets_a_capacity_it_lost() {
        // The link now carries 5 of the 10 Mbit/s learned: the most it delivered lately.
        let (rates, _) = held_rounds(10e6, 5e6, ms(20), false, 30);
        assert_eq!(*rates.last().unwrap(), 5e6, "{rates:?}");
    }

    #[test]
    fn adaptive_spills_over_in_delay_order() {
        let t0 = Instant::now();
        let links = three_links();
        let mut s = Adaptive::default();
        // A burst of 100 packets at one instant: the 5 ms link takes packets until its queue
        // reaches 15 ms (then the 20 ms link is as early), and so on.
        let mut out = Vec::new();
        for _ in 0..100 {
            s.pick(t0, 1250, 0, &links, &mut out);
        }
        assert_eq!(out[..15], [1; 15], "{out:?}");
        let first2 = out.iter().position(|&l| l == 2).unwrap();
        let first3 = out.iter().position(|&l| l == 3).unwrap();
        assert!(first2 < first3);
        // When link 3 starts, link 1 holds about 35 ms of queue: 35 ms * 10 Mbit/s / 1250 B = 35.
        let on1 = out[..first3].iter().filter(|&&l| l == 1).count();
        assert!(
            (34..=37).contains(&on1),
            "{on1} on link 1 before link 3 starts"
        );
    }

    #[test]
    fn adaptive_starts_from_configured_or_delivery_rate_or_guess() {
        let t = Instant::now();
        let mut s = Adaptive::default();
        let mut out = Vec::new();
        let links = [
            view(1, Some(5_000_000), 0),
            LinkView {
                delivery_rate_bps: 3e6,
                ..view(2, None, 0)
            },
            view(3, None, 0),
            LinkView {
                delivery_rate_bps: f64::NAN,
                ..view(4, None, 0)
            },
        ];
        s.pick(t, 100, 0, &links, &mut out);
        assert_eq!(s.rate_bps(1), Some(5e6));
        assert_eq!(s.rate_bps(2), Some(3e6));
        assert_eq!(s.rate_bps(3), Some(INITIAL_RATE_BPS));
        assert_eq!(s.rate_bps(4), Some(INITIAL_RATE_BPS));
    }

    #[test]
    fn adaptive_backs_off_to_the_delivery_rate_when_a_queue_builds() {
        let t0 = Instant::now();
        let mut s = Adaptive::default();
        let mut out = Vec::new();
        let mut v = LinkView {
            delivery_rate_bps: 4e6,
            qdelay: ms(30),
            ..view(1, Some(10_000_000), 10)
        };
        // A queue that builds while we do not push the link (someone else's traffic, jitter)
        // says nothing of its capacity: the rate holds.
        s.pick(t0, 1000, 0, std::slice::from_ref(&v), &mut out);
        s.pick(t0 + ms(150), 1000, 0, std::slice::from_ref(&v), &mut out);
        assert_eq!(s.rate_bps(1), Some(10e6));
        // We push it (20 Mbit/s offered for 160 ms: two adjustments) and it queues: it delivers
        // its capacity. Each step falls by at most MAX_DECREASE...
        offer(
            &mut s,
            t0 + ms(200),
            std::slice::from_ref(&v),
            400,
            1000,
            20e6,
        );
        let r = s.rate_bps(1).unwrap();
        assert!(
            (10e6 * MAX_DECREASE * MAX_DECREASE..10e6).contains(&r),
            "{r}"
        );
        // ...and a few steps later it is there.
        offer(
            &mut s,
            t0 + ms(400),
            std::slice::from_ref(&v),
            2500,
            1000,
            20e6,
        );
        assert_eq!(s.rate_bps(1), Some(DECREASE_TO * 4e6));
        // Never below the floor (a link that delivers next to nothing reads a queue that grows
        // and grows; 30 ms is only a few packets' time once the rate is down to about 2 Mbit/s,
        // and at the floor a packet is 190 ms: see `HIGH_PACKETS`).
        v.delivery_rate_bps = 1.0;
        v.qdelay = ms(2000);
        offer(
            &mut s,
            t0 + ms(1500),
            std::slice::from_ref(&v),
            10000,
            1000,
            20e6,
        );
        assert_eq!(s.rate_bps(1), Some(RATE_FLOOR_BPS));
    }

    #[test]
    fn adaptive_probes_up_only_when_busy_and_not_queueing() {
        let t0 = Instant::now();
        let mut out = Vec::new();
        // The link delivers the 2 Mbit/s we offer it, with a 1 Mbit/s configured guess.
        let v = LinkView {
            delivery_rate_bps: 2e6,
            ..view(1, Some(1_000_000), 10)
        };
        // Idle link (it delivers only the probes): no increase.
        let idle = LinkView {
            delivery_rate_bps: 8e3,
            ..v.clone()
        };
        let mut s = Adaptive::default();
        for k in 0..10 {
            s.pick(
                t0 + ms(100 * k),
                100,
                0,
                std::slice::from_ref(&idle),
                &mut out,
            );
        }
        assert_eq!(s.rate_bps(1), Some(1e6));
        // Kept busy (2 Mbit/s offered to a 1 Mbit/s guess) without queueing delay: it jumps to
        // what was delivered, then probes above it.
        let mut s = Adaptive::default();
        offer(&mut s, t0, std::slice::from_ref(&v), 1_000, 1000, 2e6);
        let r = s.rate_bps(1).unwrap();
        assert!(r >= 2e6 * INCREASE_GAIN, "{r}");
        // ...but not without bound: the link must deliver what we assume before we assume more.
        assert!(
            r <= 2e6 * STARTUP_GAIN.max(INCREASE_GAIN) / RAISE_EVIDENCE,
            "{r}"
        );
        // Same, but the peer sees 25 ms of queueing (between the thresholds, which at 2 Mbit/s
        // are 3 and 6 packets' time: 18 and 36 ms): no probing, but the rate is at least what
        // the link delivered.
        let held = LinkView {
            qdelay: ms(25),
            ..v.clone()
        };
        let mut s = Adaptive::default();
        offer(&mut s, t0, std::slice::from_ref(&held), 1_000, 1000, 2e6);
        assert_eq!(s.rate_bps(1), Some(2e6));
        // No evidence: the link delivers only half the assumed rate (without a queue, e.g. its
        // reports are stale): it holds too.
        let weak = LinkView {
            delivery_rate_bps: 0.5e6,
            ..v.clone()
        };
        let mut s = Adaptive::default();
        offer(&mut s, t0, std::slice::from_ref(&weak), 1_000, 1000, 2e6);
        assert_eq!(s.rate_bps(1), Some(1e6));
    }

    #[test]
    fn adaptive_start_up_aims_at_a_multiple_of_the_delivery_rate() {
        // An unconfigured link (guess: 1 Mbit/s), offered 100 Mbit/s, delivering 3 Mbit/s so far
        // without queue: next interval it is given STARTUP_GAIN times that, no more.
        let t0 = Instant::now();
        let v = LinkView {
            delivery_rate_bps: 3e6,
            ..view(1, None, 10)
        };
        let mut s = Adaptive::default();
        offer(&mut s, t0, std::slice::from_ref(&v), 1_100, 1250, 100e6);
        let r = s.rate_bps(1).unwrap();
        assert_eq!(r, STARTUP_GAIN * 3e6);
        // A queue shows up (capacity reached at 4 Mbit/s): start-up is over, the rate is what
        // the link delivers, and it is probed up slowly from there.
        let v = LinkView {
            delivery_rate_bps: 4e6,
            qdelay: ms(20),
            ..v
        };
        offer(
            &mut s,
            t0 + ms(200),
            std::slice::from_ref(&v),
            1_100,
            1250,
            100e6,
        );
        assert_eq!(s.rate_bps(1), Some(DECREASE_TO * 4e6));
        let v = LinkView { qdelay: ms(1), ..v };
        // (50 ms of traffic: one adjustment.)
        offer(
            &mut s,
            t0 + ms(400),
            std::slice::from_ref(&v),
            500,
            1250,
            100e6,
        );
        // (Offered 100 Mbit/s to a 4 Mbit/s link: dropped at the sender with no queue at the
        // bottleneck, the fast climb.)
        assert_eq!(s.rate_bps(1), Some(4e6 * STARTUP_GAIN));
    }

    #[test]
    fn adaptive_start_up_ends_when_a_fast_link_is_full_below_the_queue_thresholds() {
        // A 1 Gbit/s link with a shallow queue: the peer measures 2.6 ms of it (under
        // QDELAY_LOW) and a delivery rate that no longer grows. After PLATEAU_ROUNDS flat
        // adjustments start-up is over and the rate is about what the link delivers, not 1.5 x.
        let run = |delivered: f64, qdelay: Duration, offered: f64| {
            let t0 = Instant::now();
            let v = LinkView {
                delivery_rate_bps: delivered,
                qdelay,
                ..view(1, None, 1)
            };
            rates_per_adjustment(&mut Adaptive::default(), t0, &v, offered, 6)
        };
        let fast = run(0.99e9, Duration::from_micros(2600), 1.5e9);
        assert_eq!(fast[0], STARTUP_GAIN * 0.99e9, "{fast:?}");
        // (From there it is probed up, a few % at a time, only while it delivers 95% of it.)
        let last = *fast.last().unwrap();
        assert!(
            (0.99e9..=0.99e9 / RAISE_EVIDENCE * INCREASE_GAIN).contains(&last),
            "{fast:?}"
        );
        // Without a queue a flat delivery rate is the traffic's limit: start-up goes on.
        let idle = run(0.99e9, Duration::ZERO, 1.5e9);
        assert!(idle.iter().all(|&r| r >= STARTUP_GAIN * 0.99e9), "{idle:?}");
        // At 3 Mbit/s 2.6 ms is less than one packet's time on the wire: no evidence either.
        let slow = run(3e6, Duration::from_micros(2600), 6e6);
        assert!(slow.iter().all(|&r| r >= STARTUP_GAIN * 3e6), "{slow:?}");
    }

    #[test]
    fn adaptive_a_standing_queue_on_a_fast_link_holds_the_rate_at_what_it_delivers() {
        // Out of start-up (a configured 1.07 Gbit/s, 7% above what the link carries), pushed,
        // the peer measuring 2.6 ms of queue (under QDELAY_LOW) and 0.99 Gbit/s delivered: the
        // rate comes down to that and is not probed up while the queue stands.
        let t0 = Instant::now();
        let v = LinkView {
            delivery_rate_bps: 0.99e9,
            qdelay: Duration::from_micros(2600),
            ..view(1, Some(1_070_000_000), 1)
        };
        let mut s = Adaptive::default();
        let offered = 1.2e9;
        let rates = rates_per_adjustment(&mut s, t0, &v, offered, 4);
        assert!(rates[1..].iter().all(|&r| r == 0.99e9), "{rates:?}");
        // Without the queue the same link is probed up again.
        let v = LinkView {
            qdelay: Duration::ZERO,
            ..v
        };
        let after = rates_per_adjustment(&mut s, t0 + ms(440), &v, offered, 1);
        assert!(after[0] > 0.99e9, "{after:?}");
    }

    #[test]
    fn adaptive_reads_a_few_packets_of_queue_on_a_slow_link_as_a_burst() {
        // A 2 Mbit/s link (a full-size packet is 6 ms on its wire), pushed, delivering all it
        // is given, its peer reading 15 ms of queue: two or three packets behind each other, a
        // burst's, not a standing queue. It is probed up, not cut.
        let t0 = Instant::now();
        let v = LinkView {
            delivery_rate_bps: 2e6,
            qdelay: ms(15),
            ..view(1, Some(2_000_000), 30)
        };
        let mut s = Adaptive::default();
        let rates = rates_per_adjustment(&mut s, t0, &v, 4e6, 4);
        assert!(rates[3] > 2e6, "{rates:?}");
        // The same reading on a 20 Mbit/s link is a dozen packets: a standing queue, and the
        // rate comes down to what it delivers.
        let v = LinkView {
            delivery_rate_bps: 16e6,
            qdelay: ms(15),
            ..view(1, Some(20_000_000), 30)
        };
        let mut s = Adaptive::default();
        let rates = rates_per_adjustment(&mut s, t0, &v, 40e6, 4);
        assert!(rates[3] < 20e6, "{rates:?}");
        // And on the slow link, a queue of many packets is one too.
        let v = LinkView {
            delivery_rate_bps: 1.5e6,
            qdelay: ms(60),
            ..view(1, Some(2_000_000), 30)
        };
        let mut s = Adaptive::default();
        let rates = rates_per_adjustment(&mut s, t0, &v, 4e6, 4);
        assert!(rates[3] < 2e6, "{rates:?}");
    }

    #[test]
    fn adaptive_backs_off_also_raises_a_low_guess_to_the_delivery_rate() {
        // A standing queue means the link delivers at capacity: that is the rate, even if the
        // guess was lower.
        let t0 = Instant::now();
        let mut s = Adaptive::default();
        let mut out = Vec::new();
        let v = LinkView {
            delivery_rate_bps: 8e6,
            qdelay: ms(40),
            ..view(1, None, 10)
        };
        s.pick(t0, 1000, 0, std::slice::from_ref(&v), &mut out);
        assert_eq!(s.rate_bps(1), Some(8e6), "starts from the delivery rate");
        let v = LinkView {
            delivery_rate_bps: 9e6,
            ..v
        };
        s.pick(t0 + ms(100), 1000, 0, std::slice::from_ref(&v), &mut out);
        assert_eq!(s.rate_bps(1), Some(DECREASE_TO * 9e6));
    }

    #[test]
    fn adaptive_pulls_traffic_off_a_lossy_link_but_not_off_a_congested_one() {
        let t0 = Instant::now();
        let count = |links: &[LinkView], id| {
            picks_over(&mut Adaptive::default(), t0, links, 2000)
                .iter()
                .filter(|&&l| l == id)
                .count()
        };
        // Full load on three links; link 3 (50 Mbit/s) loses 10% with no queue: its own loss.
        let mut links = three_links();
        assert!(count(&links, 3) > 500);
        links[2].loss = 0.10;
        assert_eq!(count(&links, 3), 0, "pulled back");
        // The same loss with a standing queue is congestion: the link keeps its share.
        links[2].qdelay = ms(30);
        assert!(count(&links, 3) > 500);
        // Every link lossy: none is pulled back.
        let mut all = three_links();
        for v in &mut all {
            v.loss = 0.10;
        }
        assert!(count(&all, 3) > 500);
        // Hysteresis: back under PULLBACK_RECOVER only.
        let mut s = Adaptive::default();
        let mut out = Vec::new();
        let mut links = three_links();
        links[2].loss = 0.10;
        s.pick(t0, 1250, 0, &links, &mut out);
        links[2].loss = 0.03;
        assert!(
            !picks_over(&mut s, t0, &links, 2000).contains(&3),
            "3% is above PULLBACK_RECOVER"
        );
        // Under it, but within PULLBACK_HOLD of the last lossy estimate: still back.
        links[2].loss = 0.01;
        let picks =
            |s: &mut Adaptive, from: Instant, links: &[LinkView]| picks_over(s, from, links, 2000);
        assert!(
            !picks(&mut s, t0 + ms(300), &links).contains(&3),
            "held back"
        );
        // A lossy estimate that rests on the probes alone does not pull a link back...
        let mut s = Adaptive::default();
        let mut few = three_links();
        few[2].loss = 0.10;
        few[2].loss_basis_pps = Some(10.0);
        assert!(picks(&mut s, t0, &few).contains(&3), "ten packets a second");
        // ...one that rests on its data does, and the probes then keep it back.
        few[2].loss_basis_pps = Some(2000.0);
        assert!(!picks(&mut s, t0 + ms(300), &few).contains(&3));
        few[2].loss_basis_pps = Some(10.0);
        assert!(!picks(&mut s, t0 + ms(600), &few).contains(&3), "held");
        // A link DEGRADED by its probes' loss is avoided, not pulled back: turned UP by a lucky
        // run of probes, it takes data at once...
        let flaky = |s: &mut Adaptive, at: Instant, state: LinkState, loss: f64| {
            let mut links = three_links();
            links[2].state = state;
            links[2].loss = loss;
            links[2].loss_basis_pps = Some(10.0);
            picks(s, at, &links).contains(&3)
        };
        let mut s = Adaptive::default();
        flaky(&mut s, t0, LinkState::Degraded, 0.10);
        let up = t0 + PULLBACK_HOLD - ms(100);
        assert!(flaky(&mut s, up, LinkState::Up, 0.025), "DEGRADED briefly");
        // ...but DEGRADED for PULLBACK_HOLD it is pulled back, and stays back.
        let mut s = Adaptive::default();
        flaky(&mut s, t0, LinkState::Degraded, 0.10);
        flaky(&mut s, t0 + PULLBACK_HOLD, LinkState::Degraded, 0.10);
        let up = t0 + PULLBACK_HOLD + ms(100);
        assert!(!flaky(&mut s, up, LinkState::Up, 0.025), "DEGRADED long");
        // One more lossy estimate restarts the hold.
        links[2].loss = 0.10;
        s.pick(t0 + ms(4000), 1250, 0, &links, &mut out);
        links[2].loss = 0.01;
        let at = t0 + ms(4000) + PULLBACK_HOLD - ms(500);
        assert!(!picks(&mut s, at, &links).contains(&3), "hold restarted");
        let at = t0 + ms(4000) + PULLBACK_HOLD;
        assert!(picks(&mut s, at, &links).contains(&3), "recovered");
    }

    /// Whether link 3 takes any of 200 packets from `from` on.
    fn picks_link_3(s: &mut Adaptive, from: Instant, links: &[LinkView]) -> bool {
        picks_over(s, from, links, 200).contains(&3)
    }

    /// A loss tally of `lost` of `expected` packets, none named random.
    fn lost_of(expected: u64, lost: u64) -> Option<LossTally> {
        Some(LossTally {
            expected,
            lost,
            ..LossTally::default()
        })
    }

    #[test]
    fn adaptive_pulls_a_link_back_once_the_packets_after_its_queue_lose_too() {
        let t0 = Instant::now();
        let picks = picks_link_3;
        let tally = lost_of;
        let mut s = Adaptive::default();
        let mut links = three_links();
        // Link 3 queues (the inner TCP's start-up) and loses 10%: congestion, it stays in use.
        links[2].loss = 0.10;
        links[2].qdelay = ms(15);
        links[2].loss_tally = tally(1000, 100);
        assert!(picks(&mut s, t0, &links));
        // The queue clears; the packets after it lose nothing: still congestion's loss.
        links[2].qdelay = ms(2);
        links[2].loss_tally = tally(1200, 100);
        assert!(
            picks(&mut s, t0 + ms(300), &links),
            "a cleared queue lost nothing"
        );
        // Fewer than PULLBACK_QUIET_PACKETS since the queue, lossy or not: not yet evidence.
        let mut s = Adaptive::default();
        links[2].qdelay = ms(15);
        links[2].loss_tally = tally(1000, 100);
        picks(&mut s, t0, &links);
        links[2].qdelay = ms(2);
        links[2].loss_tally = tally(1000 + PULLBACK_QUIET_PACKETS - 1, 110);
        assert!(picks(&mut s, t0 + ms(300), &links), "too few packets");
        // Enough packets after the queue, 10% of them lost: the link's own loss, well within
        // PULLBACK_QUIET.
        links[2].loss_tally = tally(1000 + PULLBACK_QUIET_PACKETS, 110);
        assert!(!picks(&mut s, t0 + ms(400), &links), "pulled back");
        // A new queue starts the count again.
        let mut s = Adaptive::default();
        links[2].qdelay = ms(15);
        picks(&mut s, t0, &links);
        links[2].qdelay = ms(2);
        assert!(
            picks(&mut s, t0 + ms(300), &links),
            "counted from the new queue"
        );
        // Without a tally the quiet period alone decides, as before.
        links[2].loss_tally = None;
        assert!(picks(&mut s, t0 + ms(600), &links));
        assert!(!picks(&mut s, t0 + PULLBACK_QUIET + ms(100), &links));
    }

    #[test]
    fn adaptive_pulls_a_link_back_only_if_its_last_packets_bear_the_estimate_out() {
        let t0 = Instant::now();
        let picks = picks_link_3;
        let tally = lost_of;
        let window = PULLBACK_RECENT_PACKETS;
        // Link 3 carries data at 2% loss, hundreds of packets a second and no queue; then its
        // smoothed estimate reads 6% (a report of two packets, one lost): it stays in use.
        let mut s = Adaptive::default();
        let mut links = three_links();
        links[2].loss = 0.02;
        links[2].loss_basis_pps = Some(300.0);
        for (i, at) in (0..6u64).zip((0..).step_by(300)) {
            if i == 3 {
                links[2].loss = 0.06;
            }
            links[2].loss_tally = tally(1000 + window * i, 20 + (window / 50) * i);
            assert!(picks(&mut s, t0 + ms(at), &links), "2% lately, at {at} ms");
        }
        // The same, its last packets losing 6%: pulled back.
        let mut s = Adaptive::default();
        links[2].loss = 0.02;
        for (i, at) in (0..4u64).zip((0..).step_by(300)) {
            if i == 3 {
                links[2].loss = 0.06;
            }
            links[2].loss_tally = tally(1000 + window * i, 20 + (window * 6 / 100) * i);
            picks(&mut s, t0 + ms(at), &links);
        }
        assert!(!picks(&mut s, t0 + ms(1200), &links), "6% lately");
    }

    #[test]
    fn adaptive_pulls_a_link_back_under_a_queue_once_the_peer_names_its_losses_random() {
        let t0 = Instant::now();
        let picks = |s: &mut Adaptive, at: u64, links: &[LinkView]| {
            picks_over(s, t0 + ms(at), links, 200).contains(&3)
        };
        let tally = |expected, lost, random| {
            Some(LossTally {
                expected,
                lost,
                random,
            })
        };
        // Link 3 loses 10% and reports a queue at every turn (the inner TCP's start-up on both
        // links): the loss since each report is never counted, and none of it is named random
        // (a full queue's drops): congestion, the link stays in use.
        let mut s = Adaptive::default();
        let mut links = three_links();
        links[2].loss = 0.10;
        links[2].qdelay = ms(15);
        for (i, at) in (0..8).zip((0..).step_by(100)) {
            links[2].loss_tally = tally(1000 + 100 * i, 100 + 10 * i, 0);
            assert!(picks(&mut s, at, &links), "queue drops, at {at} ms");
        }
        // The same, the peer naming the losses random: pulled back once the window holds
        // PULLBACK_RECENT_PACKETS, though the queue never cleared.
        let mut s = Adaptive::default();
        let window = PULLBACK_RECENT_PACKETS;
        links[2].loss_tally = tally(1000, 100, 100);
        assert!(picks(&mut s, 0, &links), "no window yet");
        links[2].loss_tally = tally(1000 + window - 1, 120, 100);
        assert!(picks(&mut s, 100, &links), "one packet short of a window");
        links[2].loss_tally = tally(1000 + window, 120, 100);
        assert!(picks(&mut s, 200, &links), "a window, none named");
        links[2].loss_tally = tally(1000 + 2 * window, 120 + window / 20, 100 + window / 20);
        assert!(
            !picks(&mut s, 300, &links),
            "5% named at random: pulled back"
        );
        // Named random but rarer than PULLBACK_LOSS: congestion still.
        let mut s = Adaptive::default();
        for (i, at) in (0..6).zip((0..).step_by(100)) {
            links[2].loss_tally = tally(1000 + window * i, 100 + window / 10 * i, 100 + 2 * i);
            assert!(picks(&mut s, at, &links), "1% named at random, at {at} ms");
        }
    }

    #[test]
    fn adaptive_uses_degraded_links_only_when_others_are_much_later() {
        let t0 = Instant::now();
        let mut s = Adaptive::default();
        let mut links = three_links();
        links[0].state = LinkState::Degraded;
        // Degraded by loss, but under the pull-back threshold (which would leave it unused).
        links[0].loss = 0.04;
        let mut out = Vec::new();
        for _ in 0..300 {
            s.pick(t0, 1250, 0, &links, &mut out);
        }
        // Link 1 (5 ms, but DEGRADED) looks like a 55 ms link: links 2 and 3 start first, and
        // link 1 is used once their queues make them that late.
        let first = |id| out.iter().position(|&l| l == id).unwrap();
        assert_eq!(out[0], 2);
        assert!(first(3) < first(1), "{out:?}");
        // Link 2 then holds about 55 - 20 = 35 ms of queue: 35 ms * 20 Mbit/s / 1250 B = 70.
        let on2 = out[..first(1)].iter().filter(|&&l| l == 2).count();
        assert!((68..=72).contains(&on2), "{on2}");
    }

    #[test]
    fn adaptive_does_not_drop_when_only_its_model_says_full() {
        let t0 = Instant::now();
        // Rates assumed at half the truth: the virtual queues fill at a load the links carry
        // without queueing (the peer reports none). Nothing is dropped at the sender; the rates
        // climb instead.
        let links: Vec<LinkView> = three_links()
            .into_iter()
            .map(|v| LinkView {
                bandwidth_bps: v.bandwidth_bps.map(|b| b / 2),
                ..v
            })
            .collect();
        let mut s = Adaptive::default();
        let b = offer(&mut s, t0, &links, 8_000, 1250, 80e6);
        assert_eq!(b.iter().sum::<u64>(), 8_000 * 1250, "{b:?}");
        for l in &links {
            let assumed = l.bandwidth_bps.unwrap() as f64;
            assert!(
                s.rate_bps(l.id).unwrap() > assumed,
                "link {} not raised",
                l.id
            );
        }
    }

    #[test]
    fn adaptive_drops_at_the_sender_beyond_the_queue_limit() {
        let t0 = Instant::now();
        // The peer measures a standing queue of 45 ms on every link (at least half the limit):
        // the links are really full.
        let links: Vec<LinkView> = three_links()
            .into_iter()
            .map(|v| LinkView {
                qdelay: ms(45),
                ..v
            })
            .collect();
        let mut s = Adaptive::default();
        // 1 s offered at 4x the sum: about three quarters are dropped at the sender, and no
        // link's queue exceeds the limit (the largest srtt, 80 ms, within the bounds).
        let b = offer(&mut s, t0, &links, 32_000, 1250, 320e6);
        let carried: u64 = b.iter().sum();
        let offered = 32_000.0 * 1250.0;
        assert!(
            carried as f64 > 0.2 * offered && (carried as f64) < 0.3 * offered,
            "{b:?}"
        );
        let limit = Duration::from_millis(80).clamp(MIN_QUEUE_LIMIT, MAX_VIRTUAL_QUEUE);
        for l in &links {
            let q = s.backlog_bytes(l.id).unwrap() * 8.0 / s.rate_bps(l.id).unwrap();
            assert!(q <= limit.as_secs_f64() + 0.002, "link {} queue {q}", l.id);
        }
        // Every link carried its share, in rate order.
        assert!(b[0] > 0 && b[0] < b[1] && b[1] < b[2], "{b:?}");
    }

    #[test]
    fn adaptive_virtual_queue_follows_the_measured_queue() {
        // A 10 Mbit/s link whose bottleneck still holds 50 ms of packets from a start-up burst
        // the model knows nothing of, fed at exactly its rate (so that queue never drains). The
        // peer reports the real queue every 100 ms; the virtual queue must come to match it.
        let t0 = Instant::now();
        let cap = 10e6;
        let mut s = Adaptive::default();
        let mut out = Vec::new();
        let mut v = LinkView {
            delivery_rate_bps: cap,
            qdelay: ms(7),
            ..view(1, Some(10_000_000), 5)
        };
        let mut real_q = 0.050 * cap; // bits
        let gap = ms(1); // 1250 bytes per ms = 10 Mbit/s
        for k in 0..3000u32 {
            let now = t0 + gap * k;
            real_q = (real_q - cap * 0.001).max(0.0);
            if k % 100 == 0 {
                v.qdelay = Duration::from_secs_f64(real_q / cap);
            }
            out.clear();
            s.pick(now, 1250, 0, std::slice::from_ref(&v), &mut out);
            if !out.is_empty() {
                real_q += 1250.0 * 8.0;
            }
        }
        let vq = s.backlog_bytes(1).unwrap() * 8.0 / s.rate_bps(1).unwrap();
        let rq = real_q / cap;
        assert!(rq > 0.045, "the real queue stayed: {rq}");
        assert!((vq - rq).abs() < 0.005, "virtual {vq} vs real {rq}");
    }

    /// A tiny closed loop: each link a bottleneck of `cap` bit/s with a FIFO queue; the feedback
    /// (delivery rate, queueing delay) reaches the scheduler every 100 ms, as acks would.
    #[test]
    fn adaptive_learns_unknown_rates_in_a_closed_loop() {
        let t0 = Instant::now();
        let caps = [10e6, 20e6, 50e6];
        let owds = [5u64, 20, 40];
        let mut links: Vec<LinkView> = (0..3)
            .map(|i| LinkView {
                srtt: Some(ms(2 * owds[i])),
                ..view(i as LinkId + 1, None, owds[i])
            })
            .collect();
        let mut s = Adaptive::default();
        let len = 1250usize;
        let offered = 80e6;
        let gap = Duration::from_secs_f64(len as f64 * 8.0 / offered);
        let mut queue = [0f64; 3]; // bits
        let mut delivered = [0f64; 3]; // bits this interval
        let mut total = [0f64; 3]; // bits delivered in the last 5 s
        let mut dropped = 0u64;
        let mut out = Vec::new();
        let mut t = t0;
        let mut next_report = t0 + ms(100);
        let steps = (10.0 / gap.as_secs_f64()) as u64; // 10 s
        for k in 0..steps {
            // Drain the real queues.
            for i in 0..3 {
                let d = (caps[i] * gap.as_secs_f64()).min(queue[i]);
                queue[i] -= d;
                delivered[i] += d;
                if t >= t0 + ms(5000) {
                    total[i] += d;
                }
            }
            if t >= next_report {
                for i in 0..3 {
                    links[i].delivery_rate_bps = delivered[i] / 0.1;
                    links[i].qdelay = Duration::from_secs_f64(queue[i] / caps[i]);
                    delivered[i] = 0.0;
                }
                next_report += ms(100);
            }
            out.clear();
            s.pick(t, len, 0, &links, &mut out);
            let Some(&id) = out.first() else {
                // Dropped at the sender (every link full).
                if t >= t0 + ms(3000) {
                    dropped += 1;
                }
                t = t0 + gap * (k + 1) as u32;
                continue;
            };
            let i = (id - 1) as usize;
            // A 100 ms bottleneck buffer; beyond, the packet is lost.
            if queue[i] + len as f64 * 8.0 <= caps[i] * 0.1 {
                queue[i] += len as f64 * 8.0;
            } else if t >= t0 + ms(3000) {
                // Drops while learning (from a 1 Mbit/s guess on every link) are not counted.
                dropped += 1;
            }
            t = t0 + gap * (k + 1) as u32;
        }
        let goodput: f64 = total.iter().sum::<f64>() / 5.0;
        assert!(
            goodput > 0.95 * 80e6,
            "goodput {goodput} rates {:?}",
            (1..=3).map(|l| s.rate_bps(l)).collect::<Vec<_>>()
        );
        for (i, l) in (1..=3).enumerate() {
            let r = s.rate_bps(l).unwrap();
            assert!(
                r > 0.7 * caps[i] && r < 1.5 * caps[i],
                "link {l}: learned {r} for {}",
                caps[i]
            );
        }
        assert!(
            dropped < steps / 100,
            "{dropped} of {steps} dropped after learning"
        );
    }

    #[test]
    fn flow_hash_sticks_and_moves_little_when_links_change() {
        let t = Instant::now();
        let mut s = FlowHash;
        assert!(!s.ordered());
        let links: Vec<LinkView> = (1..=4).map(|id| view(id, None, 0)).collect();
        let pick = |s: &mut FlowHash, flow, links: &[LinkView]| {
            let mut out = Vec::new();
            s.pick(t, 100, flow, links, &mut out);
            assert_eq!(out.len(), 1);
            out[0]
        };
        let before: Vec<LinkId> = (0..4000u64).map(|f| pick(&mut s, f, &links)).collect();
        // Stable.
        assert!((0..4000u64).all(|f| pick(&mut s, f, &links) == before[f as usize]));
        // Spread evenly.
        for id in 1..=4 {
            let n = before.iter().filter(|&&l| l == id).count();
            assert!((850..1150).contains(&n), "link {id}: {n} flows");
        }
        // Link 3 leaves: only its flows move.
        let without: Vec<LinkView> = links.iter().filter(|l| l.id != 3).cloned().collect();
        for f in 0..4000u64 {
            let now = pick(&mut s, f, &without);
            if before[f as usize] != 3 {
                assert_eq!(now, before[f as usize]);
            }
        }
        // Link 5 joins: only about a fifth of the flows move, all to it.
        let mut with5 = links.clone();
        with5.push(view(5, None, 0));
        let moved: Vec<u64> = (0..4000u64)
            .filter(|&f| pick(&mut s, f, &with5) != before[f as usize])
            .collect();
        assert!((600..1000).contains(&moved.len()), "{} moved", moved.len());
        assert!(moved.iter().all(|&f| pick(&mut s, f, &with5) == 5));
    }

    #[test]
    fn redundant_uses_every_link() {
        let t = Instant::now();
        let mut s = Redundant;
        let mut out = Vec::new();
        s.pick(
            t,
            100,
            0,
            &[view(2, None, 0), view(5, None, 0), view(9, None, 0)],
            &mut out,
        );
        assert_eq!(out, vec![2, 5, 9]);
    }

    #[test]
    fn backup_uses_the_highest_priority_present() {
        let t = Instant::now();
        let mut s = Backup::default();
        let mk = |id, prio, owd| LinkView {
            priority: prio,
            ..view(id, Some(10_000_000), owd)
        };
        let all = [mk(1, 10, 5), mk(2, 10, 5), mk(3, 1, 1)];
        let b = offer(&mut s, t, &all, 1000, 1250, 40e6);
        assert_eq!(b[2], 0, "backup link idle while primaries are up");
        assert!(b[0] > 0 && b[1] > 0, "primaries share: {b:?}");
        // Primaries gone (DOWN: the caller no longer passes them): the backup carries.
        let b = offer(&mut s, t + ms(1000), &all[2..], 10, 1250, 1e6);
        assert_eq!(b, vec![12_500]);
        assert!(s.link_rate_bps(3).is_some());
    }

    #[test]
    fn per_link_state_follows_links_coming_and_going() {
        let t0 = Instant::now();
        let mut s = Adaptive::default();
        let mut out = Vec::new();
        let a = view(1, Some(1_000_000), 0);
        let b = view(2, Some(2_000_000), 0);
        s.pick(t0, 100, 0, &[a.clone(), b.clone()], &mut out);
        assert!(s.rate_bps(2).is_some());
        // Link 2 absent for a while: remembered; absent for long: forgotten.
        s.pick(t0 + ms(5000), 100, 0, std::slice::from_ref(&a), &mut out);
        assert!(s.rate_bps(2).is_some());
        s.pick(
            t0 + FORGET_AFTER + ms(2000),
            100,
            0,
            std::slice::from_ref(&a),
            &mut out,
        );
        assert!(s.rate_bps(2).is_none());
        // A new configured bandwidth is taken at once.
        let a2 = view(1, Some(7_000_000), 0);
        s.pick(
            t0 + FORGET_AFTER + ms(2001),
            100,
            0,
            std::slice::from_ref(&a2),
            &mut out,
        );
        assert_eq!(s.rate_bps(1), Some(7e6));
    }
}
