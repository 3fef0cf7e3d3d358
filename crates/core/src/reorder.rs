//! The receiver's reorder buffer: delivers the bundle's packets in sequence order (but for late
//! ones, below), never twice, and never holds one for long.
//!
//! - Storage is a ring of slots indexed by `seq % window`, covering the window
//!   `[next, next + window)` where `next` is the delivery point. Nothing is allocated in
//!   proportion to sequence values: a far-future `seq` (beyond the window) slides the window
//!   forward, giving up on (counting as skipped) the oldest gaps and handing what was held to the
//!   output, so memory stays bounded whatever the peer sends.
//! - The window starts at [`INITIAL_WINDOW`] packets and grows (in powers of two) to hold a
//!   packet that lands past it, up to the configured `capacity` (beyond, the window slides as
//!   above); [`ReorderBuffer::fit_window`] halves it back while a quarter of it has held
//!   everything for a while. A window too small for the delay equalisation's hold slides past
//!   held packets at every push and, the buffer full, drops them: at 4096 packets a 300 ms
//!   hold covered about 157 Mbit/s of full-size packets, and 230 Mbit/s lost 86% of them.
//! - A missing sequence number is given up when
//!   (a) every link in [`ReorderBuffer::set_links`] has already delivered a higher sequence number
//!   (links are FIFO, so it was lost: Multilink PPP's rule), or
//!   (b) every such link has delivered some packet, of any kind, that was sent after the first
//!   held packet behind the gap (the same rule in time rather than in sequence numbers: keepalive
//!   probes carry the sender's clock too, so a link that carries no data still tells, within one
//!   probe interval, that a gap is not on it), or
//!   (c) it has waited the hold timeout since the first packet behind it arrived. The timeout is
//!   set by the endpoint from the links' delay spread; when a packet turns up after its gap timed
//!   out, the buffer adds how late it was (and a quarter) to the timeout, as RACK widens its
//!   reordering window, and forgets that extra by halves every 10 s. All clamped to the
//!   configured bounds. Rules (a) and (b) are exact on FIFO links; (c) is what catches a link
//!   that went silent.
//! - Each packet may carry a release instant before which it is not delivered (delay
//!   equalisation, see the endpoint).
//! - A bitmap over the last `capacity` sequence numbers behind the delivery point tells a
//!   duplicate of a delivered packet from a late packet whose gap was skipped. A late packet
//!   is delivered when it comes, out of order (once: a second copy is a duplicate): to an
//!   inner TCP a late segment is a reordering, a dropped one a loss it must send again a round
//!   trip later. Below the bitmap's window nothing is known, and late packets are dropped.
//! - Every delivered packet's wait (arrival to pop) goes into a log-bucket histogram
//!   ([`ReorderBuffer::wait_percentile`]).
//!
//! - Loss repair (when [`ReorderBuffer::set_repair_wait`] is not zero): a gap that rule (a), (b)
//!   or (c) would give up is asked for again instead ([`ReorderBuffer::take_nacks`]: the endpoint
//!   sends a NACK, the peer resends from its ring of sent packets) and waited for `repair_wait`
//!   more (about one round trip on the fastest link), asked again up to [`REPAIR_TRIES`] times
//!   in all, and given up at the latest `max_timeout` after the first packet behind it arrived.
//!   [`ReorderBuffer::scan_losses`] finds such gaps anywhere in the window, not only at the
//!   head, so that several losses are repaired in parallel. With
//!   [`ReorderBuffer::set_repair_all`] off (the endpoint's default), only gaps inside a range
//!   the endpoint named a likely random loss ([`ReorderBuffer::suspect_loss`]: a link's own
//!   sequence numbers jumped while it had no queue) are asked for; the others are given up at
//!   once as without repair, so that a queue's drops still reach the inner TCP as the
//!   congestion signal they are, and no other gap waits a round trip for a copy. A suspect
//!   range may also be named not to wait: its gaps are asked for as above, but the packets
//!   behind them go on as soon as rule (a), (b) or (c) gives them up, the copies are delivered
//!   out of order when they come, and what has not come by the repair wait is asked for again
//!   (up to [`REPAIR_TRIES`] in all) while the bitmap can still tell it was never delivered.
//!
//! Call [`ReorderBuffer::pop`] until `None` after every `push` and `set_links`, and at
//! [`ReorderBuffer::poll_timeout`].

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::wire::SeqRange;
use crate::LinkId;

/// Times a lost gap is asked for (NACKed) before it is given up.
pub const REPAIR_TRIES: u32 = 3;
/// Gaps under repair remembered at most (more losses than this at once are given up as without
/// repair).
pub const MAX_REPAIRS: usize = 1024;
/// Suspect ranges ([`ReorderBuffer::suspect_loss`]) remembered at most.
pub const MAX_SUSPECTS: usize = 256;
/// [`ReorderBuffer::scan_losses`] looks at the window at most this often.
pub const SCAN_INTERVAL: Duration = Duration::from_millis(1);

/// Largest `capacity` honoured (a slot costs about 80 bytes: 80 MB at this size).
pub const MAX_CAPACITY: usize = 1 << 20;
/// The window a buffer starts with, and shrinks back to when little arrives (or `capacity`, if
/// smaller): about 330 kB of slots.
pub const INITIAL_WINDOW: usize = 4096;
/// [`ReorderBuffer::fit_window`] shrinks the window when a quarter of it held everything over
/// the last one to two of these.
pub const WINDOW_FIT_EVERY: Duration = Duration::from_secs(5);
/// Hold timeout before the endpoint sets one (clamped to the configured bounds).
pub const INITIAL_TIMEOUT: Duration = Duration::from_millis(100);

#[derive(Debug, Clone)]
pub struct ReorderConfig {
    /// The largest window (packets the buffer may hold ahead of the delivery point) it grows
    /// to. Default 65536: 300 ms of about 2.5 Gbit/s of full-size
    /// packets, about 5 MB of slots when reached (and the packets held).
    pub capacity: usize,
    /// Bounds for the adaptive hold timeout. Defaults 2 ms and 500 ms.
    pub min_timeout: Duration,
    pub max_timeout: Duration,
}

impl Default for ReorderConfig {
    fn default() -> Self {
        ReorderConfig {
            capacity: 65536,
            min_timeout: Duration::from_millis(2),
            max_timeout: Duration::from_millis(500),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// Held (or immediately deliverable).
    Queued,
    /// Already held or already delivered.
    Duplicate,
    /// Behind the delivery point (its gap was already skipped), and dropped: below the bitmap's
    /// window, whether it was delivered is not known (or the buffer is full).
    Late,
    /// Behind the delivery point (its gap was already skipped) but never delivered (the bitmap
    /// tells): delivered now, out of order.
    OutOfOrder,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ReorderStats {
    pub delivered: u64,
    pub duplicates: u64,
    pub late: u64,
    /// Late packets delivered all the same (their gap was given up, and they were never
    /// delivered): out of order.
    pub late_delivered: u64,
    /// Sequence numbers given up on (lost, or skipped to make room).
    pub skipped: u64,
    /// Times the head-of-line wait ran out.
    pub timeouts: u64,
    pub max_depth: usize,
    /// The window now, in packets (it grows with what is held, see the module docs).
    pub window: u64,
    /// Packets that had been received but were dropped to keep memory bounded (only when the
    /// caller lets more than `capacity` packets pile up without popping).
    pub overflow: u64,
    /// Sequence numbers asked for again (NACKed), first requests only.
    pub repair_requested: u64,
    /// NACK retries (a sequence number asked for once more).
    pub repair_retried: u64,
    /// Gaps under repair that were given up after all.
    pub repair_given_up: u64,
    /// Gaps asked for but not waited for ([`ReorderBuffer::suspect_loss`] with `wait` false):
    /// the packets behind them went on, their copies are delivered out of order.
    pub repair_passed: u64,
}

/// A run of missing sequence numbers asked for again.
#[derive(Debug, Clone, Copy)]
struct Repair {
    first: u64,
    /// One past the last.
    end: u64,
    /// Asked again (or given up) at this instant.
    deadline: Instant,
    tries: u32,
}

impl Repair {
    fn covers(&self, seq: u64) -> bool {
        self.first <= seq && seq < self.end
    }
    fn exhausted(&self, now: Instant) -> bool {
        self.tries >= REPAIR_TRIES && now >= self.deadline
    }
}

struct Slot {
    seq: u64,
    arrival: Instant,
    /// Not delivered before this instant (delay equalisation; `arrival` when there is none).
    release: Instant,
    /// The sender's clock when it sealed the packet (wire `ts`), when known.
    ts: Option<u32>,
    link: LinkId,
    packet: Vec<u8>,
    /// Came after its gap was given up: delivered out of order ([`Pushed::OutOfOrder`]).
    late: bool,
}

/// A packet [`ReorderBuffer::pop_seq`] hands out.
#[derive(Debug)]
pub struct Delivered {
    pub seq: u64,
    pub packet: Vec<u8>,
    /// Out of order: it came after its gap was given up ([`Pushed::OutOfOrder`]), so it is
    /// older than packets delivered before it.
    pub late: bool,
}

/// What the receiver knows of an arriving packet besides its sequence number.
#[derive(Debug, Clone, Copy)]
pub struct Arrival {
    pub seq: u64,
    pub link: LinkId,
    /// The sender's wire `ts` (microseconds, wrapping): enables the time rule (b) of the module
    /// docs.
    pub ts: Option<u32>,
    /// Not delivered before this instant (delay equalisation).
    pub release: Instant,
}

/// A run of sequence numbers given up by timeout, remembered to measure how late their packets
/// turn up (which lengthens the hold time, see [`ReorderBuffer::timeout`]).
struct TimeoutSkip {
    from: u128,
    to: u128,
    at: Instant,
}
/// Timeout skips remembered.
const SKIP_LOG: usize = 64;
/// A link that delivered a packet this recently is "flowing": a gap that it has not passed yet
/// is not timed out (up to the configured maximum), because its packets keep coming and one of
/// them may be the missing one, queued behind the others. A link carrying data delivers far more
/// often than this; one carrying only keepalives (every 100 ms by default) far less often.
pub const FLOWING: Duration = Duration::from_millis(20);
/// The learned extra hold time halves after this long without a late packet.
const EXTRA_HALF_LIFE: Duration = Duration::from_secs(10);

/// Log-bucket histogram of microsecond values: 8 linear buckets, then 8 per power of two
/// (relative resolution 12.5%).
struct Histogram {
    buckets: Vec<u64>,
    count: u64,
}

const HIST_SUB: u32 = 8;
const HIST_BUCKETS: usize = (HIST_SUB + (64 - 3) * HIST_SUB) as usize;

impl Histogram {
    fn new() -> Self {
        Histogram {
            buckets: vec![0; HIST_BUCKETS],
            count: 0,
        }
    }
    fn index(v: u64) -> usize {
        if v < HIST_SUB as u64 {
            return v as usize;
        }
        let e = 63 - v.leading_zeros(); // >= 3
        let sub = (v >> (e - 3)) & (HIST_SUB as u64 - 1);
        (HIST_SUB + (e - 3) * HIST_SUB) as usize + sub as usize
    }
    /// Midpoint of bucket `i`.
    fn value(i: usize) -> u64 {
        if i < HIST_SUB as usize {
            return i as u64;
        }
        let e = (i as u32 - HIST_SUB) / HIST_SUB + 3;
        let sub = (i as u32 - HIST_SUB) % HIST_SUB;
        let lo = (HIST_SUB as u64 + sub as u64) << (e - 3);
        let width = 1u64 << (e - 3);
        lo.saturating_add(width / 2)
    }
    fn record(&mut self, v: u64) {
        self.buckets[Self::index(v)] += 1;
        self.count += 1;
    }
    fn percentile(&self, p: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let p = if p.is_finite() {
            p.clamp(0.0, 100.0)
        } else {
            100.0
        };
        let rank = ((p / 100.0) * self.count as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Self::value(i);
            }
        }
        Self::value(HIST_BUCKETS - 1)
    }
    fn clear(&mut self) {
        self.buckets.iter_mut().for_each(|b| *b = 0);
        self.count = 0;
    }
}

pub struct ReorderBuffer {
    cfg: ReorderConfig,
    cap: u64,
    slots: Vec<Option<Slot>>,
    /// Packets in the ring.
    held: usize,
    /// Delivery point: the next sequence number to deliver. Meaningless until `started`.
    /// Wider than a sequence number so that delivering `u64::MAX` cannot overflow it.
    next: u128,
    started: bool,
    /// Bit `s % cap` set: `s` (in `[next - cap, next)`, and not below `known_from`) was
    /// delivered (not skipped).
    delivered_bits: Vec<u64>,
    /// The bitmap knows nothing below this (a grown window's older part).
    known_from: u128,
    /// The window it started with, and shrinks back to.
    min_window: u64,
    /// Held packets in arrival order (seq, arrival); entries of packets no longer held are
    /// dropped lazily from the front.
    arrivals: VecDeque<(u64, Instant)>,
    /// Packets taken out of the ring when the window slid, waiting for `pop` (in order), and
    /// late packets delivered out of order (`Pushed::OutOfOrder`).
    ready: VecDeque<Slot>,
    /// Highest sequence number received per link.
    link_max: Vec<(LinkId, u64)>,
    /// Latest sender `ts` received per link, from any packet ([`ReorderBuffer::link_progress`]),
    /// and when it arrived.
    link_ts: Vec<(LinkId, u32, Instant)>,
    links: Vec<LinkId>,
    timeout: Duration,
    /// Hold time added to `timeout` because packets turned up after their gap timed out.
    extra: Duration,
    extra_at: Instant,
    skips: VecDeque<TimeoutSkip>,
    stats: ReorderStats,
    waits: Histogram,
    /// Loss repair: how long to wait for a NACKed gap (`ZERO`: repair off).
    repair_wait: Duration,
    /// Gaps under repair, by sequence number.
    repairs: VecDeque<Repair>,
    /// Repairs of gaps passed on without waiting ([`ReorderBuffer::suspect_loss`]): behind the
    /// delivery point, asked for again while their copies have not come (a copy can be lost
    /// too), up to [`REPAIR_TRIES`] in all; at most [`MAX_REPAIRS`].
    passed: VecDeque<Repair>,
    /// Ranges to NACK, drained by the endpoint.
    nacks: Vec<SeqRange>,
    /// Ask for every lost gap (true), or only for those inside `suspects`.
    repair_all: bool,
    /// Sequence ranges `[first, end)` in which a link lost something likely at random
    /// (sorted by `first`, at most [`MAX_SUSPECTS`], pruned behind the delivery point), and
    /// whether the packets behind a gap there wait for its copy.
    suspects: VecDeque<(u64, u64, bool)>,
    /// Highest sequence number pushed (+1): the end of the window worth scanning.
    high: u128,
    next_scan: Option<Instant>,
    /// The most of the window in use (`high - next`) since the current fitting period began
    /// (at the instant kept), and over the period before ([`ReorderBuffer::fit_window`]).
    in_use: u64,
    in_use_before: u64,
    fit_from: Option<Instant>,
}

impl ReorderBuffer {
    /// `capacity` is clamped to `1..=MAX_CAPACITY`; the window starts at [`INITIAL_WINDOW`]
    /// (or `capacity`, if smaller).
    pub fn new(cfg: ReorderConfig) -> Self {
        Self::with_window(cfg, INITIAL_WINDOW)
    }

    /// Like [`new`](Self::new), the window starting at (and shrinking back to) `window`.
    fn with_window(cfg: ReorderConfig, window: usize) -> Self {
        let cap = cfg.capacity.clamp(1, MAX_CAPACITY).min(window.max(1));
        let timeout = INITIAL_TIMEOUT.clamp(cfg.min_timeout.min(cfg.max_timeout), cfg.max_timeout);
        ReorderBuffer {
            slots: (0..cap).map(|_| None).collect(),
            delivered_bits: vec![0; cap.div_ceil(64)],
            known_from: 0,
            min_window: cap as u64,
            cap: cap as u64,
            stats: ReorderStats {
                window: cap as u64,
                ..Default::default()
            },
            cfg,
            held: 0,
            next: 0,
            started: false,
            arrivals: VecDeque::new(),
            ready: VecDeque::new(),
            link_max: Vec::new(),
            link_ts: Vec::new(),
            links: Vec::new(),
            timeout,
            extra: Duration::ZERO,
            extra_at: Instant::now(),
            skips: VecDeque::new(),
            waits: Histogram::new(),
            repair_wait: Duration::ZERO,
            repairs: VecDeque::new(),
            passed: VecDeque::new(),
            nacks: Vec::new(),
            repair_all: true,
            suspects: VecDeque::new(),
            high: 0,
            next_scan: None,
            in_use: 0,
            in_use_before: 0,
            fit_from: None,
        }
    }

    fn idx(&self, seq: u64) -> usize {
        (seq % self.cap) as usize
    }
    fn bit(&self, seq: u64) -> bool {
        let i = self.idx(seq);
        self.delivered_bits[i / 64] & (1 << (i % 64)) != 0
    }
    /// Whether the bitmap tells for `pos`, behind the delivery point, if it was delivered.
    fn known(&self, pos: u128) -> bool {
        self.next - pos <= self.cap as u128 && pos >= self.known_from
    }
    fn set_bit(&mut self, seq: u64, on: bool) {
        let i = self.idx(seq);
        if on {
            self.delivered_bits[i / 64] |= 1 << (i % 64);
        } else {
            self.delivered_bits[i / 64] &= !(1 << (i % 64));
        }
    }

    /// A packet with bundle sequence `seq` arrived on `link`.
    pub fn push(&mut self, now: Instant, seq: u64, link: LinkId, packet: Vec<u8>) -> Pushed {
        let arrival = Arrival {
            seq,
            link,
            ts: None,
            release: now,
        };
        self.push_arrival(now, arrival, packet)
    }

    /// Like [`push`](Self::push), with the sender's timestamp (for rule (b)) and a release
    /// instant before which the packet is not delivered (delay equalisation: the endpoint holds
    /// packets of fast links until the slowest link's delay has passed). Release instants should
    /// grow with `seq`; a packet is never delivered before the one ahead of it.
    pub fn push_arrival(&mut self, now: Instant, arrival: Arrival, packet: Vec<u8>) -> Pushed {
        let Arrival {
            seq,
            link,
            ts,
            release,
        } = arrival;
        if let Some(ts) = ts {
            self.link_progress(now, link, ts);
        }
        if !self.started {
            self.started = true;
            self.next = seq as u128;
        }
        match self.link_max.iter_mut().find(|e| e.0 == link) {
            Some(e) => e.1 = e.1.max(seq),
            None => self.link_max.push((link, seq)),
        }
        let pos = seq as u128;
        self.high = self.high.max(pos + 1);
        if pos < self.next {
            let known = self.known(pos);
            if known && self.bit(seq) {
                self.stats.duplicates += 1;
                return Pushed::Duplicate;
            }
            self.stats.late += 1;
            self.learn_lateness(now, pos);
            // (Delivered only with room for it: the buffer's memory bound holds.)
            if known && self.depth() < self.cap as usize {
                // Its gap was given up, and it was never delivered: delivered now, out of
                // order, rather than lost (a copy reinjected off a link that died often comes
                // after the gap was given up; dropped, it cost the inner TCP a retransmission
                // a round trip later). Once: a second copy is a duplicate.
                self.set_bit(seq, true);
                self.ready.push_back(Slot {
                    seq,
                    arrival: now,
                    release: now,
                    ts,
                    link,
                    packet,
                    late: true,
                });
                self.stats.late_delivered += 1;
                self.stats.max_depth = self.stats.max_depth.max(self.depth());
                return Pushed::OutOfOrder;
            }
            return Pushed::Late;
        }
        let max = self.cfg.capacity.clamp(1, MAX_CAPACITY) as u128;
        let ahead = pos - self.next;
        if ahead >= self.cap as u128 && ahead < max {
            // Past the window, within the largest: it grows to hold the packet.
            self.resize((ahead as u64 + 1).next_power_of_two().min(max as u64));
        }
        if ahead >= self.cap as u128 {
            // Far future: slide the window so that `seq` is its last slot.
            self.advance_to(pos - self.cap as u128 + 1);
        }
        self.in_use = self
            .in_use
            .max((pos + 1 - self.next).min(u64::MAX as u128) as u64);
        let i = self.idx(seq);
        if self.slots[i].is_some() {
            self.stats.duplicates += 1;
            return Pushed::Duplicate;
        }
        self.slots[i] = Some(Slot {
            seq,
            arrival: now,
            release: release.max(now),
            ts,
            link,
            packet,
            late: false,
        });
        self.held += 1;
        // A gap's wait runs from the release of the first packet behind it: until then that
        // packet is held anyway (delay equalisation), so waiting costs nothing.
        self.arrivals.push_back((seq, release.max(now)));
        // Bound memory when the caller does not pop: drop the oldest slid-out packets.
        while self.depth() > self.cap as usize {
            match self.ready.pop_front() {
                Some(s) => {
                    if self.next - s.seq as u128 <= self.cap as u128 {
                        self.set_bit(s.seq, false);
                    }
                    self.stats.overflow += 1;
                    self.stats.skipped = self.stats.skipped.saturating_add(1);
                }
                None => break,
            }
        }
        self.stats.max_depth = self.stats.max_depth.max(self.depth());
        Pushed::Queued
    }

    /// Halves the window (down to the one it started with) while a quarter of it held everything
    /// over the last one to two [`WINDOW_FIT_EVERY`] periods, so that memory follows the
    /// traffic back down. Call it now and then (the endpoint's tick: 100 ms).
    pub fn fit_window(&mut self, now: Instant) {
        let from = *self.fit_from.get_or_insert(now);
        if now.saturating_duration_since(from) < WINDOW_FIT_EVERY {
            return;
        }
        let used = self.in_use.max(self.in_use_before);
        self.in_use_before = self.in_use;
        self.in_use = (self.high.saturating_sub(self.next)).min(u64::MAX as u128) as u64;
        self.fit_from = Some(now);
        let floor = self.min_window;
        let fits = self.high <= self.next + (self.cap / 2) as u128
            && self.depth() <= (self.cap / 2) as usize;
        if self.cap > floor && used.saturating_mul(4) <= self.cap && fits {
            self.resize((self.cap / 2).max(floor));
        }
    }

    /// Rebuilds the ring `window` slots wide: the held packets (all inside
    /// `[next, next + window)`) in their new slots, the delivered bits of the last
    /// `min(old, new)` sequence numbers kept.
    fn resize(&mut self, window: u64) {
        let mut slots: Vec<Option<Slot>> = (0..window).map(|_| None).collect();
        let mut bits = vec![0u64; (window as usize).div_ceil(64)];
        for slot in self.slots.drain(..).flatten() {
            let i = (slot.seq % window) as usize;
            slots[i] = Some(slot);
        }
        let kept = self.cap.min(window) as u128;
        self.known_from = self.known_from.max(self.next.saturating_sub(kept));
        for s in self.next.saturating_sub(kept)..self.next {
            let s = s as u64;
            if self.bit(s) {
                let i = (s % window) as usize;
                bits[i / 64] |= 1 << (i % 64);
            }
        }
        self.slots = slots;
        self.delivered_bits = bits;
        self.cap = window;
        self.stats.window = window;
    }

    /// Moves the delivery point to `to` (> next): held packets below it go to `ready`, missing
    /// ones are skipped. Costs O(min(to - next, capacity)).
    fn advance_to(&mut self, to: u128) {
        let span = to - self.next;
        if span >= self.cap as u128 {
            // Every slot is below `to`: walk the whole ring in sequence order.
            // The bitmap then covers `[to - cap, to)`: only moved packets in that range are set.
            self.delivered_bits.iter_mut().for_each(|w| *w = 0);
            let mut moved = 0u64;
            for k in 0..self.cap {
                let Ok(s) = u64::try_from(self.next + k as u128) else {
                    break;
                };
                let i = self.idx(s);
                if let Some(slot) = self.slots[i].take() {
                    self.ready.push_back(slot);
                    moved += 1;
                    if to - s as u128 <= self.cap as u128 {
                        self.set_bit(s, true);
                    }
                }
            }
            self.held = 0;
            let skipped = (span - moved as u128).min(u64::MAX as u128) as u64;
            self.stats.skipped = self.stats.skipped.saturating_add(skipped);
        } else {
            // Here `to - next < cap` and `to <= u64::MAX + 1`.
            for s in self.next..to {
                let s = s as u64;
                let i = self.idx(s);
                match self.slots[i].take() {
                    Some(slot) => {
                        self.held -= 1;
                        self.ready.push_back(slot);
                        self.set_bit(s, true);
                    }
                    None => {
                        // Saturating: a far jump already added up to u64::MAX (found by fuzzing).
                        self.stats.skipped = self.stats.skipped.saturating_add(1);
                        self.set_bit(s, false);
                    }
                }
            }
        }
        self.next = to;
        self.prune_arrivals();
        while self
            .repairs
            .front()
            .is_some_and(|r| r.end as u128 <= self.next)
        {
            self.repairs.pop_front();
        }
    }

    fn prune_arrivals(&mut self) {
        while let Some(&(seq, _)) = self.arrivals.front() {
            let still_held = seq as u128 >= self.next
                && self.slots[self.idx(seq)]
                    .as_ref()
                    .is_some_and(|s| s.seq == seq);
            if still_held {
                break;
            }
            self.arrivals.pop_front();
        }
    }

    /// Sets the hold timeout (clamped to the configured bounds).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout.clamp(
            self.cfg.min_timeout.min(self.cfg.max_timeout),
            self.cfg.max_timeout,
        );
    }
    /// The current hold timeout: the one set, plus what late packets taught (RACK's reordering
    /// window grows the same way), within the configured bounds.
    pub fn timeout(&self) -> Duration {
        (self.timeout + self.extra).min(self.cfg.max_timeout)
    }

    /// A packet late by `lateness` behind a timeout: wait that much longer (and a quarter more)
    /// from now on. The extra halves every [`EXTRA_HALF_LIFE`] without such a packet.
    fn learn_lateness(&mut self, now: Instant, pos: u128) {
        let Some(skip) = self.skips.iter().find(|k| k.from <= pos && pos < k.to) else {
            return;
        };
        let late = now.saturating_duration_since(skip.at);
        self.decay_extra(now);
        self.extra = self.extra.max(late + late / 4).min(self.cfg.max_timeout);
        self.extra_at = now;
    }
    fn decay_extra(&mut self, now: Instant) {
        let since = now.saturating_duration_since(self.extra_at);
        if since >= EXTRA_HALF_LIFE {
            let halvings = (since.as_secs_f64() / EXTRA_HALF_LIFE.as_secs_f64()).min(64.0) as u32;
            self.extra = self
                .extra
                .checked_div(1 << halvings.min(31))
                .unwrap_or_default();
            self.extra_at = now;
        }
    }

    /// Some packet (of any kind) sent at `ts` (the sender's clock, wrapping microseconds)
    /// arrived on `link`. Links are FIFO, so a gap whose successor was sent before `ts` is no
    /// longer in flight on this link (rule (b)).
    pub fn link_progress(&mut self, now: Instant, link: LinkId, ts: u32) {
        match self.link_ts.iter_mut().find(|e| e.0 == link) {
            Some(e) => {
                if ts.wrapping_sub(e.1) as i32 > 0 {
                    e.1 = ts;
                    e.2 = now;
                }
            }
            None => self.link_ts.push((link, ts, now)),
        }
    }

    /// Some link that has not yet passed the held packet `behind` is still delivering (a packet
    /// arrived on it within [`FLOWING`]): the missing packet may well be in its queue.
    fn awaited_link_flowing(&self, now: Instant, behind: (u32, LinkId)) -> bool {
        self.links
            .iter()
            .any(|l| match self.link_ts.iter().find(|e| e.0 == *l) {
                Some(e) => {
                    !Self::has_passed(e, behind) && now.saturating_duration_since(e.2) < FLOWING
                }
                None => false,
            })
    }

    /// Link entry `e` has passed the missing packets before the held packet `(ts, link)`: it
    /// delivered something sent after that packet, or it is the link that delivered it (FIFO:
    /// anything sent earlier on it arrived earlier).
    fn has_passed(e: &(LinkId, u32, Instant), (ts, link): (u32, LinkId)) -> bool {
        let d = e.1.wrapping_sub(ts) as i32;
        d > 0 || (d == 0 && e.0 == link)
    }

    /// Rule (b): every link that carries data has passed the held packet `behind`.
    fn passed_in_time_by_all_links(&self, behind: (u32, LinkId)) -> bool {
        !self.links.is_empty()
            && self.links.iter().all(|l| {
                self.link_ts
                    .iter()
                    .any(|e| e.0 == *l && Self::has_passed(e, behind))
            })
    }
    /// The links that currently carry data; a gap that every one of them has passed is lost.
    pub fn set_links(&mut self, links: &[LinkId]) {
        self.links.clear();
        self.links.extend_from_slice(links);
    }

    /// Rule (a): every link that carries data has delivered something beyond `seq`.
    fn passed_by_all_links(&self, seq: u128) -> bool {
        !self.links.is_empty()
            && self
                .links
                .iter()
                .all(|l| self.link_max.iter().any(|e| e.0 == *l && e.1 as u128 > seq))
    }

    fn deliver(&mut self, now: Instant, slot: Slot) -> Delivered {
        self.stats.delivered += 1;
        let wait = now.saturating_duration_since(slot.arrival);
        self.waits
            .record(wait.as_micros().min(u64::MAX as u128) as u64);
        Delivered {
            seq: slot.seq,
            packet: slot.packet,
            late: slot.late,
        }
    }

    /// Next packet to deliver, in order (a late one out of order, see [`Pushed::OutOfOrder`]).
    pub fn pop(&mut self, now: Instant) -> Option<Vec<u8>> {
        self.pop_seq(now).map(|d| d.packet)
    }

    /// Next packet to deliver, in order (a late one out of order), with its sequence number
    /// (pieces of a cut packet are glued back only when their numbers follow each other,
    /// [`crate::frag`]; a late piece is the endpoint's to drop).
    pub fn pop_seq(&mut self, now: Instant) -> Option<Delivered> {
        if let Some(slot) = self.ready.pop_front() {
            return Some(self.deliver(now, slot));
        }
        if !self.started || self.held == 0 {
            return None;
        }
        // A packet is held, so `next <= its seq <= u64::MAX`.
        let head = self.next as u64;
        let i = self.idx(head);
        if self.slots[i].as_ref().is_some_and(|s| now < s.release) {
            return None;
        }
        if let Some(slot) = self.slots[i].take() {
            self.held -= 1;
            self.set_bit(head, true);
            self.next += 1;
            self.prune_arrivals();
            return Some(self.deliver(now, slot));
        }
        // The head is a gap with packets behind it: give it up?
        self.decay_extra(now);
        let timeout = self.timeout();
        let timed_out = self
            .arrivals
            .front()
            .is_some_and(|&(_, t)| now >= t + timeout);
        // Rule (b) looks at the first held packet behind the gap: every missing packet before it
        // was sent before it.
        let behind = self.first_held_ts();
        let passed_in_time = behind.is_some_and(|b| self.passed_in_time_by_all_links(b));
        // A timeout does not give up on a packet that a still-delivering link may yet bring,
        // short of the configured maximum wait.
        let timed_out = timed_out
            && !behind.is_some_and(|b| {
                self.awaited_link_flowing(now, b)
                    && self
                        .arrivals
                        .front()
                        .is_some_and(|&(_, t)| now < t + self.cfg.max_timeout)
            });
        if !timed_out && !passed_in_time && !self.passed_by_all_links(self.next) {
            return None;
        }
        // Skip the run of missing sequence numbers up to the next held packet (by timeout or
        // rule (b): all of them; by rule (a): only those every link has passed).
        let mut s = self.next;
        while self.slots[self.idx(s as u64)].is_none()
            && (timed_out || passed_in_time || self.passed_by_all_links(s))
        {
            s += 1;
        }
        // Loss repair: ask for the run again and wait, unless asked enough already or the first
        // packet behind it has waited the configured maximum.
        let mut passed = false;
        if !self.repair_wait.is_zero() && s > self.next {
            let waited_max = self
                .arrivals
                .front()
                .is_some_and(|&(_, t)| now >= t + self.cfg.max_timeout);
            let head = self.next as u64;
            let exhausted = self
                .repairs
                .iter()
                .find(|r| r.covers(head))
                .is_some_and(|r| r.exhausted(now));
            let under_repair = self.repairs.iter().any(|r| r.covers(head));
            let run_end = s.min(u64::MAX as u128) as u64;
            let want = if under_repair {
                Some((head, run_end))
            } else {
                self.wanted(head, run_end)
            };
            match want {
                Some((first, end))
                    if first == head
                        && !waited_max
                        && !exhausted
                        && self.request_repair(now, head, end as u128) =>
                {
                    if self.awaits_copy(head) {
                        return None;
                    }
                    passed = true;
                }
                Some((first, _)) if first == head => {}
                // Only the part before the piece worth asking for is given up now.
                Some((first, _)) => s = first as u128,
                None => {}
            }
            if passed {
                self.stats.repair_passed += 1;
                if let Some(&r) = self.repairs.iter().find(|r| r.covers(head)) {
                    // Only the repair's own run goes on now: a gap behind it is judged on its own
                    // (it may be one that waits, a failover's).
                    s = s.min(r.end as u128);
                    if self.passed.len() >= MAX_REPAIRS {
                        self.passed.pop_front();
                    }
                    self.passed.push_back(Repair {
                        first: head,
                        end: s as u64,
                        ..r
                    });
                }
            } else if self.repairs.iter().any(|r| r.covers(head)) {
                self.stats.repair_given_up += 1;
            }
        }
        // A passed gap's copy comes late by design: its lateness is the repair's round trip, not
        // the links' reordering, and must not lengthen the hold.
        if timed_out && !passed_in_time && !passed {
            self.stats.timeouts += 1;
            if self.skips.len() == SKIP_LOG {
                self.skips.pop_front();
            }
            self.skips.push_back(TimeoutSkip {
                from: self.next,
                to: s,
                at: now,
            });
        }
        if s > self.next {
            self.advance_to(s);
        }
        self.pop_seq(now)
    }
    /// Loss repair: wait this long for a NACKed gap before asking again (about one round trip
    /// on the fastest link, plus margin). `ZERO` turns repair off.
    pub fn set_repair_wait(&mut self, wait: Duration) {
        self.repair_wait = wait.min(self.cfg.max_timeout);
        if wait.is_zero() {
            self.repairs.clear();
            self.passed.clear();
        }
    }

    /// Loss repair asks for every lost gap (`true`, the default here), or only for the parts of
    /// lost gaps inside ranges named by [`suspect_loss`](Self::suspect_loss).
    pub fn set_repair_all(&mut self, all: bool) {
        self.repair_all = all;
    }

    /// A link lost something among sequence numbers `[first, end)`: a lost gap there is worth
    /// asking for (when repair is on and not asking for every gap). `wait`: the packets behind
    /// such a gap wait for its copy (as every gap does with [`set_repair_all`](Self::set_repair_all)),
    /// up to [`REPAIR_TRIES`] repair waits; else they go on as soon as the gap counts as lost,
    /// and the copy is delivered out of order when it comes ([`Pushed::OutOfOrder`]): the inner
    /// TCP sees a reordering, and its acknowledgements keep coming meanwhile. Ranges longer
    /// than the window are ignored; the oldest range goes when [`MAX_SUSPECTS`] are held.
    pub fn suspect_loss(&mut self, first: u64, end: u64, wait: bool) {
        if end <= first || end - first > self.cap || (end as u128) <= self.next {
            return;
        }
        while self
            .suspects
            .front()
            .is_some_and(|&(_, e, _)| (e as u128) <= self.next)
        {
            self.suspects.pop_front();
        }
        if self.suspects.len() >= MAX_SUSPECTS {
            self.suspects.pop_front();
        }
        let at = self.suspects.partition_point(|&(f, _, _)| f < first);
        self.suspects.insert(at, (first, end, wait));
    }

    /// The part of `[first, end)` worth asking for, from `first` on: the whole run when every
    /// gap is, else the first piece inside a suspect range (`None`: nothing).
    fn wanted(&self, first: u64, end: u64) -> Option<(u64, u64)> {
        if self.repair_all {
            return Some((first, end));
        }
        self.suspects
            .iter()
            .filter(|&&(f, e, _)| f < end && first < e)
            .map(|&(f, e, _)| (f.max(first), e.min(end)))
            .min_by_key(|&(f, _)| f)
    }

    /// Whether the packets behind a lost `seq` wait for its copy: with every gap asked for, or
    /// inside a suspect range named to wait ([`suspect_loss`](Self::suspect_loss)).
    fn awaits_copy(&self, seq: u64) -> bool {
        self.repair_all
            || self
                .suspects
                .iter()
                .any(|&(f, e, wait)| wait && f <= seq && seq < e)
    }

    /// The ranges to NACK since the last call (appended to `out`).
    pub fn take_nacks(&mut self, out: &mut Vec<SeqRange>) {
        out.append(&mut self.nacks);
    }

    /// Asks for the missing run `[first, end)` (`end` > `first`, both in the window): a new
    /// repair, or one more try of a repair whose wait ran out. Returns whether the run is
    /// (still) under repair, i.e. worth waiting for.
    fn request_repair(&mut self, now: Instant, first: u64, end: u128) -> bool {
        let end = end.min(u64::MAX as u128) as u64;
        if let Some(r) = self.repairs.iter_mut().find(|r| r.covers(first)) {
            if now < r.deadline {
                return true;
            }
            if r.tries >= REPAIR_TRIES {
                return false;
            }
            r.tries += 1;
            r.deadline = now + self.repair_wait;
            // Only what is still missing is asked for again.
            let (lo, hi) = (first.max(r.first), end.min(r.end));
            self.stats.repair_retried += hi.saturating_sub(lo);
            push_ranges(&mut self.nacks, lo, hi);
            return true;
        }
        if self.repairs.len() >= MAX_REPAIRS {
            return false;
        }
        // Keep `repairs` sorted by sequence number (new gaps are usually the highest).
        let at = self.repairs.partition_point(|r| r.first < first);
        // A run never overlaps an existing repair: stop at the next one.
        let end = match self.repairs.get(at) {
            Some(r) => end.min(r.first),
            None => end,
        };
        if end <= first {
            return true;
        }
        self.repairs.insert(
            at,
            Repair {
                first,
                end,
                deadline: now + self.repair_wait,
                tries: 1,
            },
        );
        self.stats.repair_requested += end - first;
        push_ranges(&mut self.nacks, first, end);
        true
    }

    /// Loss repair: finds the gaps in the window (not only the head one) that rule (a) or (b)
    /// says are lost, or that have waited the hold timeout, and asks for them
    /// ([`take_nacks`](Self::take_nacks)); retries those whose wait ran out. At most every
    /// [`SCAN_INTERVAL`]; costs O(window).
    pub fn scan_losses(&mut self, now: Instant) {
        self.retry_passed(now);
        if self.repair_wait.is_zero() || !self.started || self.held == 0 {
            return;
        }
        if self.next_scan.is_some_and(|t| now < t) {
            return;
        }
        self.next_scan = Some(now + SCAN_INTERVAL);
        let timeout = self.timeout();
        let end = self.high.min(self.next + self.cap as u128);
        let mut s = self.next;
        while s < end {
            if self.slots[self.idx(s as u64)].is_some() {
                s += 1;
                continue;
            }
            // A gap [s, e) and the held packet at e.
            let mut e = s;
            while e < end && self.slots[self.idx(e as u64)].is_none() {
                e += 1;
            }
            let Some(slot) = (e < end)
                .then(|| self.slots[self.idx(e as u64)].as_ref())
                .flatten()
            else {
                break;
            };
            let behind = slot.ts.map(|ts| (ts, slot.link));
            let lost = now >= slot.arrival + timeout
                || behind.is_some_and(|b| self.passed_in_time_by_all_links(b))
                || self.passed_by_all_links(e - 1);
            let gap = (s as u64, e.min(u64::MAX as u128) as u64);
            let under_repair = self
                .repairs
                .iter()
                .any(|r| r.first < gap.1 && gap.0 < r.end);
            if lost || under_repair {
                // The gap, piece by piece where it meets repairs already asked for (and, when
                // not every gap is wanted, only the suspect pieces of what is not).
                let mut x = gap.0;
                while x < gap.1 {
                    // A repair already asked for is retried over its own range.
                    let end = if self.repairs.iter().any(|r| r.covers(x)) {
                        e
                    } else {
                        match self.wanted(x, gap.1) {
                            Some((f, end)) if f == x => end as u128,
                            Some((f, _)) => {
                                x = f;
                                continue;
                            }
                            None => break,
                        }
                    };
                    self.request_repair(now, x, end);
                    x = match self.repairs.iter().find(|r| r.covers(x)) {
                        Some(r) => r.end,
                        None => self
                            .repairs
                            .iter()
                            .map(|r| r.first)
                            .find(|&f| f > x)
                            .unwrap_or(gap.1),
                    }
                    .min(gap.1);
                }
            }
            s = e;
        }
        // Repairs whose wait ran out and that no gap met were filled: nothing more to ask.
        for r in &mut self.repairs {
            if now >= r.deadline {
                r.tries = REPAIR_TRIES;
            }
        }
    }

    /// Asks again for what is still missing of the passed gaps whose wait ran out; forgets
    /// those whose copies all came, that were asked for [`REPAIR_TRIES`] times, or that fell
    /// behind what the bitmap knows.
    fn retry_passed(&mut self, now: Instant) {
        let mut i = 0;
        while i < self.passed.len() {
            let r = self.passed[i];
            if now < r.deadline {
                i += 1;
                continue;
            }
            if r.tries >= REPAIR_TRIES {
                self.passed.remove(i);
                continue;
            }
            let missing =
                |b: &Self, s: u64| (s as u128) < b.next && b.known(s as u128) && !b.bit(s);
            let mut asked = false;
            let mut s = r.first;
            while s < r.end {
                if !missing(self, s) {
                    s += 1;
                    continue;
                }
                let mut e = s + 1;
                while e < r.end && missing(self, e) {
                    e += 1;
                }
                self.stats.repair_retried += e - s;
                push_ranges(&mut self.nacks, s, e);
                asked = true;
                s = e;
            }
            if !asked {
                self.passed.remove(i);
                continue;
            }
            let p = &mut self.passed[i];
            p.tries += 1;
            p.deadline = now + self.repair_wait;
            i += 1;
        }
    }

    /// When the head-of-line gap's wait runs out (call `pop` then), or a passed gap's repair
    /// wait (call [`scan_losses`](Self::scan_losses) then). An instant in the past when a
    /// packet is deliverable now; `None` when nothing is held or awaited.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let repair = self.poll_repair();
        match (self.poll_hold(), repair) {
            (Some(h), Some(r)) => Some(h.min(r)),
            (h, r) => h.or(r),
        }
    }

    /// The next repair deadline (ask again, or give up), of a gap still in the window or passed.
    fn poll_repair(&self) -> Option<Instant> {
        let passed = self.passed.iter().map(|r| r.deadline).min();
        if self.held == 0 {
            return passed;
        }
        let Some(next_scan) = self.next_scan else {
            return passed;
        };
        self.repairs
            .iter()
            .filter(|r| r.tries < REPAIR_TRIES)
            .map(|r| r.deadline.max(next_scan))
            .chain(passed)
            .min()
    }

    fn poll_hold(&self) -> Option<Instant> {
        if let Some(s) = self.ready.front() {
            return Some(s.arrival);
        }
        if self.held == 0 {
            return None;
        }
        if let Some(s) = &self.slots[self.idx(self.next as u64)] {
            return Some(s.release);
        }
        let &(_, first) = self.arrivals.front()?;
        let mut due = first + self.timeout();
        // A head gap under repair is given up at its repair deadline (see `poll_repair`), not
        // before, and at the latest at the maximum wait.
        if let Some(r) = self.repairs.iter().find(|r| r.covers(self.next as u64)) {
            due = due.max(r.deadline).min(first + self.cfg.max_timeout);
        }
        // While a link that may bring the missing packet keeps delivering, the gap is not given
        // up (see `pop`): the next look is when it stops counting as flowing.
        let flowing_until = self.first_held_ts().and_then(|behind| {
            self.links
                .iter()
                .filter_map(|l| self.link_ts.iter().find(|e| e.0 == *l))
                .filter(|e| !Self::has_passed(e, behind))
                .map(|e| e.2 + FLOWING)
                .max()
        });
        Some(match flowing_until {
            Some(f) if f > due => f.min(first + self.cfg.max_timeout),
            _ => due,
        })
    }

    /// The sender `ts` and link of the first held packet at or after the delivery point.
    fn first_held_ts(&self) -> Option<(u32, LinkId)> {
        let mut s = self.next;
        loop {
            if let Some(slot) = &self.slots[self.idx(s as u64)] {
                return slot.ts.map(|ts| (ts, slot.link));
            }
            s += 1;
            if s - self.next >= self.cap as u128 {
                return None;
            }
        }
    }
    /// Starts over (new session): the next sequence expected is `next`.
    pub fn reset(&mut self, next: u64) {
        self.slots.iter_mut().for_each(|s| *s = None);
        self.delivered_bits.iter_mut().for_each(|w| *w = 0);
        self.known_from = 0;
        self.in_use = 0;
        self.held = 0;
        self.arrivals.clear();
        self.ready.clear();
        self.link_max.clear();
        self.link_ts.clear();
        self.skips.clear();
        self.repairs.clear();
        self.passed.clear();
        self.nacks.clear();
        self.suspects.clear();
        self.next = next as u128;
        self.high = self.next;
        self.started = true;
    }
    /// The sequence numbers the buffer holds ahead of the delivery point at most now (the
    /// window: it grows with what is held, see the module docs).
    pub fn capacity(&self) -> u64 {
        self.cap
    }

    pub fn depth(&self) -> usize {
        self.held + self.ready.len()
    }
    pub fn stats(&self) -> &ReorderStats {
        &self.stats
    }
    /// One past the highest sequence number pushed (the delivery point before any).
    pub fn high_seq(&self) -> u64 {
        self.high.min(u64::MAX as u128) as u64
    }
    /// The delivery point (next sequence number expected), once known.
    pub fn next_seq(&self) -> Option<u64> {
        self.started
            .then_some(self.next.min(u64::MAX as u128) as u64)
    }
    /// Percentile (0..=100) of the time packets waited in the buffer, over all delivered so far.
    pub fn wait_percentile(&self, p: f64) -> Duration {
        Duration::from_micros(self.waits.percentile(p))
    }
    /// Forgets the wait histogram (e.g. between measurement phases).
    pub fn clear_waits(&mut self) {
        self.waits.clear();
    }
}

/// Appends `[first, end)` as ranges of at most `u16::MAX` sequence numbers.
fn push_ranges(out: &mut Vec<SeqRange>, mut first: u64, end: u64) {
    while first < end {
        let count = (end - first).min(u16::MAX as u64) as u16;
        out.push(SeqRange { first, count });
        first += count as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }
    fn pkt(seq: u64) -> Vec<u8> {
        seq.to_be_bytes().to_vec()
    }
    fn seq_of(p: &[u8]) -> u64 {
        u64::from_be_bytes(p.try_into().unwrap())
    }
    fn buf(cap: usize) -> ReorderBuffer {
        ReorderBuffer::new(ReorderConfig {
            capacity: cap,
            ..Default::default()
        })
    }
    fn drain(b: &mut ReorderBuffer, now: Instant) -> Vec<u64> {
        std::iter::from_fn(|| b.pop(now))
            .map(|p| seq_of(&p))
            .collect()
    }

    #[test]
    fn defaults() {
        let c = ReorderConfig::default();
        assert_eq!(
            (c.capacity, c.min_timeout, c.max_timeout),
            (65536, ms(2), ms(500))
        );
        let b = ReorderBuffer::new(c);
        assert_eq!(b.timeout(), INITIAL_TIMEOUT);
        assert_eq!(b.next_seq(), None);
        assert_eq!(b.poll_timeout(), None);
    }

    /// A buffer from 0 over one link, repairing the gaps of suspect ranges (a 20 ms wait).
    fn suspects_only() -> ReorderBuffer {
        let mut b = buf(64);
        b.reset(0);
        b.set_links(&[1]);
        b.set_repair_wait(ms(20));
        b.set_repair_all(false);
        b
    }

    /// With repair on but not for every gap, only the gaps in a suspect range are asked for
    /// and waited for; the others are given up at once, as without repair.
    #[test]
    fn only_suspect_gaps_are_asked_for() {
        let t = Instant::now();
        let mut b = suspects_only();
        // 1 lost where the link jumped at random; 4 lost without a suspect (a full queue's).
        b.suspect_loss(1, 2, true);
        for s in [0, 2, 3, 5] {
            b.push(t, s, 1, pkt(s));
        }
        // Rule (a): the only link has passed both gaps. 1 is held and asked for; 4 is not.
        assert_eq!(drain(&mut b, t), vec![0]);
        let mut nacks = Vec::new();
        b.take_nacks(&mut nacks);
        assert_eq!(
            nacks.iter().map(|r| (r.first, r.count)).collect::<Vec<_>>(),
            vec![(1, 1)]
        );
        // The copy of 1 comes: 1, 2, 3 go, and 4 is given up at once.
        assert_eq!(b.push(t + ms(5), 1, 1, pkt(1)), Pushed::Queued);
        assert_eq!(drain(&mut b, t + ms(5)), vec![1, 2, 3, 5]);
        b.take_nacks(&mut nacks);
        assert_eq!(nacks.len(), 1, "4 was never asked for");
        assert_eq!(b.stats().repair_requested, 1);
        // Ranges too long for the window, or behind the delivery point, are ignored.
        b.suspect_loss(0, 1000, true);
        b.suspect_loss(2, 4, true);
        assert!(
            b.suspects
                .iter()
                .all(|&(f, e, _)| (f, e) != (0, 1000) && (f, e) != (2, 4)),
            "{:?}",
            b.suspects
        );
    }

    /// A suspect gap not to be waited for is asked for, the packets behind it go on as soon as
    /// it counts as lost, and its copy is delivered out of order when it comes (once).
    #[test]
    fn a_gap_not_waited_for_is_asked_for_and_its_copy_delivered_late() {
        let t = Instant::now();
        let mut b = suspects_only();
        b.suspect_loss(1, 2, false);
        for s in [0, 2, 3] {
            b.push(t, s, 1, pkt(s));
        }
        // Rule (a): lost; asked for, and 2, 3 go on without it.
        assert_eq!(drain(&mut b, t), vec![0, 2, 3]);
        let mut nacks = Vec::new();
        b.take_nacks(&mut nacks);
        assert_eq!(
            nacks.iter().map(|r| (r.first, r.count)).collect::<Vec<_>>(),
            vec![(1, 1)]
        );
        assert_eq!((b.stats().repair_passed, b.stats().repair_given_up), (1, 0));
        // The copy does not come within the repair wait (lost too): asked for again, though
        // nothing is held (the buffer's next wake-up is that wait's end).
        assert_eq!(b.poll_timeout(), Some(t + ms(20)));
        b.scan_losses(t + ms(25));
        nacks.clear();
        b.take_nacks(&mut nacks);
        assert_eq!(
            nacks.iter().map(|r| (r.first, r.count)).collect::<Vec<_>>(),
            vec![(1, 1)]
        );
        assert_eq!(b.stats().repair_retried, 1);
        assert_eq!(b.push(t + ms(40), 1, 1, pkt(1)), Pushed::OutOfOrder);
        assert_eq!(drain(&mut b, t + ms(40)), vec![1]);
        assert_eq!(b.push(t + ms(41), 1, 1, pkt(1)), Pushed::Duplicate);
        // Come: never asked for again, and nothing left to wake up for.
        b.scan_losses(t + ms(100));
        nacks.clear();
        b.take_nacks(&mut nacks);
        assert!(nacks.is_empty(), "{nacks:?}");
        assert_eq!(b.poll_timeout(), None);
        // The same loss named to wait holds 2 and 3 until the copy comes.
        let mut w = suspects_only();
        w.suspect_loss(1, 2, true);
        for s in [0, 2, 3] {
            w.push(t, s, 1, pkt(s));
        }
        assert_eq!(drain(&mut w, t), vec![0]);
        assert_eq!(w.push(t + ms(40), 1, 1, pkt(1)), Pushed::Queued);
        assert_eq!(drain(&mut w, t + ms(40)), vec![1, 2, 3]);
    }

    /// A passed gap right before one that waits (a failover's, say): only the passed one goes
    /// on; the packets behind the second still wait for its copy.
    #[test]
    fn a_passed_gap_does_not_pass_a_waiting_one_behind_it() {
        let t = Instant::now();
        let mut b = suspects_only();
        b.suspect_loss(1, 2, false);
        b.suspect_loss(2, 3, true);
        b.push(t, 0, 1, pkt(0));
        b.push(t, 3, 1, pkt(3));
        // Rule (a): 1 and 2 lost; 1 passed on, 2 held for its copy.
        assert_eq!(drain(&mut b, t), vec![0]);
        assert_eq!(b.stats().repair_passed, 1);
        assert_eq!(b.push(t + ms(10), 2, 1, pkt(2)), Pushed::Queued);
        assert_eq!(drain(&mut b, t + ms(10)), vec![2, 3]);
        assert_eq!(b.push(t + ms(15), 1, 1, pkt(1)), Pushed::OutOfOrder);
        assert_eq!(drain(&mut b, t + ms(15)), vec![1]);
    }

    /// A passed gap given up by the hold timeout (rule (c)): its copy, late by design, does not
    /// lengthen the hold as a late packet of a timed-out gap does.
    #[test]
    fn a_passed_gaps_copy_does_not_lengthen_the_hold() {
        let t = Instant::now();
        let mut b = suspects_only();
        // Link 2 has delivered nothing: only the timeout gives the gap up.
        b.set_links(&[1, 2]);
        b.suspect_loss(1, 2, false);
        for s in [0, 2, 3] {
            b.push(t, s, 1, pkt(s));
        }
        assert_eq!(drain(&mut b, t), vec![0]);
        let hold = b.timeout();
        let given_up = t + hold;
        assert_eq!(drain(&mut b, given_up), vec![2, 3]);
        assert_eq!(b.stats().repair_passed, 1);
        assert_eq!(b.push(given_up + ms(50), 1, 1, pkt(1)), Pushed::OutOfOrder);
        assert_eq!(b.timeout(), hold);
        // The same gap not named for repair, given up and then late, does lengthen it.
        let mut c = suspects_only();
        c.set_links(&[1, 2]);
        for s in [0, 2, 3] {
            c.push(t, s, 1, pkt(s));
        }
        assert_eq!(drain(&mut c, given_up), vec![0, 2, 3]);
        assert_eq!(c.push(given_up + ms(50), 1, 1, pkt(1)), Pushed::OutOfOrder);
        assert!(c.timeout() > hold, "{:?}", c.timeout());
    }

    #[test]
    fn in_order_passes_straight_through() {
        let t = Instant::now();
        let mut b = buf(64);
        for s in 1000..1100 {
            assert_eq!(b.push(t, s, 1, pkt(s)), Pushed::Queued);
            assert_eq!(b.poll_timeout(), Some(t), "deliverable now");
            assert_eq!(drain(&mut b, t), vec![s]);
            assert_eq!(b.depth(), 0);
        }
        assert_eq!(b.stats().delivered, 100);
        assert_eq!(b.stats().max_depth, 1);
        assert_eq!(b.wait_percentile(99.0), Duration::ZERO);
    }

    #[test]
    fn reorders_and_rejects_duplicates() {
        let t = Instant::now();
        let mut b = buf(64);
        b.reset(10);
        assert_eq!(b.push(t, 12, 1, pkt(12)), Pushed::Queued);
        assert_eq!(b.push(t, 11, 1, pkt(11)), Pushed::Queued);
        assert_eq!(b.push(t, 12, 2, pkt(12)), Pushed::Duplicate, "held twice");
        assert!(drain(&mut b, t).is_empty(), "10 still missing");
        assert_eq!(b.depth(), 2);
        assert_eq!(b.push(t, 10, 2, pkt(10)), Pushed::Queued);
        assert_eq!(drain(&mut b, t), vec![10, 11, 12]);
        assert_eq!(
            b.push(t, 11, 2, pkt(11)),
            Pushed::Duplicate,
            "already delivered"
        );
        assert_eq!(
            b.push(t, 9, 2, pkt(9)),
            Pushed::OutOfOrder,
            "before the session start: never delivered"
        );
        assert_eq!(drain(&mut b, t), vec![9]);
        assert_eq!(b.stats().duplicates, 2);
        assert_eq!(b.stats().late, 1);
        assert_eq!(b.stats().max_depth, 3);
    }

    #[test]
    fn gap_passed_by_every_link_is_lost_at_once() {
        let t = Instant::now();
        let mut b = buf(64);
        b.set_links(&[1, 2]);
        b.push(t, 0, 1, pkt(0));
        b.push(t, 2, 1, pkt(2));
        // Link 1 has passed 1, link 2 has said nothing yet: wait.
        assert_eq!(drain(&mut b, t), vec![0]);
        b.push(t, 3, 2, pkt(3));
        // Now both links have delivered something beyond 1: it is lost, no need to wait.
        assert_eq!(drain(&mut b, t), vec![2, 3]);
        assert_eq!((b.stats().skipped, b.stats().timeouts), (1, 0));
        // Late arrival of the skipped one: delivered out of order, once.
        assert_eq!(b.push(t, 1, 2, pkt(1)), Pushed::OutOfOrder);
        assert_eq!(drain(&mut b, t), vec![1]);
        assert_eq!(b.push(t, 1, 1, pkt(1)), Pushed::Duplicate);
        assert!(drain(&mut b, t).is_empty());
        assert_eq!((b.stats().late, b.stats().late_delivered), (1, 1));
    }

    fn arrival(seq: u64, link: LinkId, ts: u32, release: Instant) -> Arrival {
        Arrival {
            seq,
            link,
            ts: Some(ts),
            release,
        }
    }

    #[test]
    fn gap_passed_in_time_by_a_link_without_data_is_lost_at_once() {
        let t = Instant::now();
        let mut b = buf(64);
        b.set_links(&[1, 2]);
        // Packets 0 and 2 (sent at 0 and 200 us) on link 1; 1 (sent at 100 us) is missing.
        b.push_arrival(t, arrival(0, 1, 0, t), pkt(0));
        b.push_arrival(t, arrival(2, 1, 200, t), pkt(2));
        assert_eq!(drain(&mut b, t), vec![0], "link 2 may still bring 1");
        // Link 2 carries no data, only a keepalive sent at 150 us: sent before 2, so 1 may still
        // be behind it.
        b.link_progress(t, 2, 150);
        assert_eq!(drain(&mut b, t), Vec::<u64>::new());
        // A keepalive sent after 2 (at 250 us): link 2 is FIFO, so 1 is not on it. Lost.
        b.link_progress(t + ms(1), 2, 250);
        assert_eq!(drain(&mut b, t + ms(1)), vec![2]);
        assert_eq!((b.stats().skipped, b.stats().timeouts), (1, 0));
        // Timestamps wrap: "after" is modular.
        let mut b = buf(64);
        b.set_links(&[1, 2]);
        b.push_arrival(t, arrival(0, 1, u32::MAX - 10, t), pkt(0));
        b.push_arrival(t, arrival(2, 1, 5, t), pkt(2));
        b.link_progress(t, 2, 20);
        assert_eq!(drain(&mut b, t), vec![0, 2]);
    }

    #[test]
    fn no_timeout_while_the_awaited_link_still_delivers() {
        let t = Instant::now();
        let mut b = buf(64);
        b.set_links(&[1, 2]);
        b.set_timeout(ms(10));
        b.push_arrival(t, arrival(0, 1, 0, t), pkt(0));
        b.push_arrival(t, arrival(2, 1, 2_000, t), pkt(2));
        assert_eq!(drain(&mut b, t), vec![0]);
        // Link 2 keeps delivering packets sent before 2 (a long queue): 1 may be among them, so
        // the 10 ms timeout does not give it up...
        for k in 1..=30u64 {
            let now = t + ms(k);
            b.link_progress(now, 2, 1_000 + k as u32);
            assert_eq!(drain(&mut b, now), Vec::<u64>::new(), "{k} ms");
        }
        let due = b.poll_timeout().unwrap();
        assert_eq!(
            due,
            t + ms(30) + FLOWING,
            "next look: when link 2 stops flowing"
        );
        // ...and 1 turns up on link 2 after 30 ms.
        b.push_arrival(t + ms(31), arrival(1, 2, 1_000, t), pkt(1));
        assert_eq!(drain(&mut b, t + ms(31)), vec![1, 2]);
        assert_eq!(b.stats().timeouts, 0);
        // A link that stops delivering is waited for only the timeout.
        b.push_arrival(t + ms(40), arrival(4, 1, 4_000, t), pkt(4));
        assert_eq!(drain(&mut b, t + ms(40)), Vec::<u64>::new());
        let due = b.poll_timeout().unwrap();
        assert_eq!(due, t + ms(30) + FLOWING, "link 2 silent since 30 ms");
        assert_eq!(drain(&mut b, due), vec![4]);
        assert_eq!(b.stats().timeouts, 1);
        // Never past the configured maximum, however long a link keeps flowing.
        let mut b = buf(64);
        b.set_links(&[1, 2]);
        b.push_arrival(t, arrival(0, 1, 0, t), pkt(0));
        b.push_arrival(t, arrival(2, 1, 2_000, t), pkt(2));
        assert_eq!(drain(&mut b, t), vec![0]);
        let max = ReorderConfig::default().max_timeout;
        let mut now = t;
        let mut sent = 1_000;
        while now + ms(5) < t + max {
            now += ms(5);
            sent += 1;
            b.link_progress(now, 2, sent);
            assert_eq!(drain(&mut b, now), Vec::<u64>::new());
        }
        assert_eq!(drain(&mut b, t + max), vec![2], "given up at the maximum");
    }

    #[test]
    fn late_packets_lengthen_the_hold_and_it_decays() {
        let t = Instant::now();
        let mut b = buf(64);
        b.set_timeout(ms(10));
        b.push(t, 0, 1, pkt(0));
        b.push(t, 2, 1, pkt(2));
        assert_eq!(drain(&mut b, t + ms(10)), vec![0, 2], "1 timed out");
        // 1 turns up 30 ms after it was given up: the hold grows by that and a quarter.
        assert_eq!(b.push(t + ms(40), 1, 1, pkt(1)), Pushed::OutOfOrder);
        assert_eq!(b.timeout(), ms(10) + ms(30) + ms(30) / 4);
        // A late packet whose gap was not given up by timeout teaches nothing.
        assert_eq!(b.push(t + ms(41), 0, 1, pkt(0)), Pushed::Duplicate);
        assert_eq!(b.timeout(), ms(10) + ms(30) + ms(30) / 4);
        // Without late packets the extra halves every EXTRA_HALF_LIFE.
        b.push(t + ms(40) + EXTRA_HALF_LIFE, 4, 1, pkt(4));
        let _ = drain(&mut b, t + ms(40) + EXTRA_HALF_LIFE);
        assert_eq!(b.timeout(), ms(10) + (ms(30) + ms(30) / 4) / 2);
        // Bounded by the configured maximum.
        b.learn_lateness(t, 0);
        b.skips.push_back(TimeoutSkip {
            from: 100,
            to: 101,
            at: t,
        });
        b.learn_lateness(t + Duration::from_secs(60), 100);
        assert_eq!(b.timeout(), ReorderConfig::default().max_timeout);
    }

    #[test]
    fn release_instants_hold_packets_in_order() {
        let t = Instant::now();
        let mut b = buf(64);
        b.reset(0);
        // Equalisation: 0 may leave at 30 ms, 1 at 31 ms; 2 carries no release.
        b.push_arrival(t, arrival(0, 1, 0, t + ms(30)), pkt(0));
        b.push_arrival(t + ms(1), arrival(1, 1, 1_000, t + ms(31)), pkt(1));
        b.push_arrival(t + ms(2), arrival(2, 2, 2_000, t + ms(2)), pkt(2));
        assert_eq!(b.poll_timeout(), Some(t + ms(30)));
        assert_eq!(drain(&mut b, t + ms(29)), Vec::<u64>::new());
        assert_eq!(drain(&mut b, t + ms(30)), vec![0]);
        assert_eq!(b.poll_timeout(), Some(t + ms(31)));
        assert_eq!(
            drain(&mut b, t + ms(31)),
            vec![1, 2],
            "never before the one ahead"
        );
        // A gap's wait runs from the release of the packet behind it.
        let mut b = buf(64);
        b.reset(0);
        b.set_timeout(ms(10));
        b.push_arrival(t, arrival(1, 1, 1_000, t + ms(30)), pkt(1));
        assert_eq!(b.poll_timeout(), Some(t + ms(40)));
        assert_eq!(drain(&mut b, t + ms(39)), Vec::<u64>::new());
        assert_eq!(drain(&mut b, t + ms(40)), vec![1]);
    }

    /// 20 000 packets a second (about 230 Mbit/s of full-size packets), each held 300 ms
    /// (delay equalisation), popped every millisecond, the window fitted every 100 ms: how
    /// many came out before their release, how many were lost, and the largest window.
    fn held_stream(capacity: usize) -> (usize, u64, u64) {
        let t0 = Instant::now();
        let mut b = ReorderBuffer::new(ReorderConfig {
            capacity,
            ..Default::default()
        });
        let hold = ms(300);
        let (mut seq, mut early, mut largest, mut out) = (0u64, 0, 0, 0);
        let mut released = std::collections::HashMap::new();
        for step in 0..2000u64 {
            let now = t0 + ms(step);
            if step % 100 == 0 {
                b.fit_window(now);
            }
            if step < 1500 {
                for k in 0..20u32 {
                    let at = now + Duration::from_micros(u64::from(k) * 50);
                    let ts = (step * 1000) as u32 + k * 50;
                    b.push_arrival(at, arrival(seq, 1, ts, at + hold), pkt(seq));
                    released.insert(seq, at + hold);
                    seq += 1;
                }
            }
            largest = largest.max(b.capacity());
            while let Some(p) = b.pop(now) {
                early += usize::from(now < released[&seq_of(&p)]);
                out += 1;
            }
        }
        assert_eq!(b.depth(), 0);
        (early, seq - out, largest)
    }

    #[test]
    fn the_window_grows_to_hold_what_arrives_in_the_hold() {
        // 6000 packets arrive in one hold: a window kept at 4096 slides past the oldest held
        // packet at every push, and with the buffer full of held ones it is dropped for
        // memory: 25904 of the 30000 lost.
        let (early, lost, window) = held_stream(INITIAL_WINDOW);
        assert_eq!(window, INITIAL_WINDOW as u64);
        assert!(early + lost as usize > 20_000, "{early} early, {lost} lost");
        // Grown to 8192, none is early or lost.
        assert_eq!(held_stream(65536), (0, 0, 8192));
    }

    #[test]
    fn a_grown_window_shrinks_when_traffic_falls_and_keeps_what_it_knew() {
        let t0 = Instant::now();
        let mut b = buf(65536);
        b.reset(0);
        b.fit_window(t0);
        // 10 000 packets behind a gap at 0: the window grows to 16384.
        for s in 1..=10_000u64 {
            assert_eq!(b.push(t0, s, 1, pkt(s)), Pushed::Queued);
        }
        assert_eq!((b.capacity(), b.stats().window), (16384, 16384));
        assert_eq!(b.stats().skipped, 0, "nothing slid out");
        b.push(t0, 0, 1, pkt(0));
        assert_eq!(drain(&mut b, t0).len(), 10_001);
        // What was delivered is known as delivered.
        assert_eq!(b.push(t0, 9_000, 1, pkt(9_000)), Pushed::Duplicate);
        // A packet now and then: halved every 5 s back to the initial window, the last
        // sequence numbers still known, none skipped.
        let mut now = t0;
        for s in 10_001..10_300u64 {
            now += ms(100);
            b.push(now, s, 1, pkt(s));
            drain(&mut b, now);
            b.fit_window(now);
        }
        assert_eq!(b.capacity(), INITIAL_WINDOW as u64);
        assert_eq!(b.push(now, 10_299, 1, pkt(10_299)), Pushed::Duplicate);
        assert_eq!(
            b.push(now, 5_000, 1, pkt(5_000)),
            Pushed::Late,
            "below what it knows"
        );
        assert_eq!(b.stats().skipped, 0);
        // A packet held when the window grows comes out where it belongs.
        b.push(now, 10_301, 1, pkt(10_301));
        for s in 10_302..10_302 + 5000u64 {
            b.push(now, s, 1, pkt(s));
        }
        assert_eq!(b.capacity(), 8192);
        b.push(now, 10_300, 1, pkt(10_300));
        let out = drain(&mut b, now);
        assert_eq!(out.len(), 5002);
        assert!(out.windows(2).all(|w| w[0] + 1 == w[1]), "in order");
        // A grown window knows no more than it did: a packet below the old window is late,
        // not delivered again.
        let mut b = buf(65536);
        b.reset(0);
        for s in 0..5000u64 {
            b.push(t0, s, 1, pkt(s));
            drain(&mut b, t0);
        }
        assert_eq!(b.capacity(), INITIAL_WINDOW as u64);
        b.push(t0, 5001 + 8000, 1, pkt(13_001));
        assert_eq!(b.capacity(), 8192);
        assert_eq!(b.push(t0, 100, 1, pkt(100)), Pushed::Late);
        assert_eq!(b.push(t0, 4000, 1, pkt(4000)), Pushed::Duplicate);
    }

    #[test]
    fn rule_of_links_only_skips_what_every_link_passed() {
        let t = Instant::now();
        let mut b = buf(64);
        b.set_links(&[1, 2]);
        b.push(t, 0, 1, pkt(0));
        b.push(t, 5, 1, pkt(5));
        b.push(t, 2, 2, pkt(2));
        // Link 2 is at 2: 1 is lost, but 3 and 4 may still come on link 2.
        assert_eq!(drain(&mut b, t), vec![0, 2]);
        assert_eq!(b.stats().skipped, 1);
        b.push(t, 4, 2, pkt(4));
        // Link 2 passed 3 now.
        assert_eq!(drain(&mut b, t), vec![4, 5]);
        assert_eq!(b.stats().skipped, 2);
        // A link that stops carrying data is removed from the set: its silence no longer holds
        // the bundle.
        b.push(t, 7, 1, pkt(7));
        assert!(drain(&mut b, t).is_empty());
        b.set_links(&[1]);
        assert_eq!(drain(&mut b, t), vec![7]);
    }

    #[test]
    fn head_gap_times_out_at_the_right_virtual_time() {
        let t0 = Instant::now();
        let mut b = buf(64);
        b.set_timeout(ms(10));
        b.push(t0, 0, 1, pkt(0));
        assert_eq!(drain(&mut b, t0), vec![0]);
        // 1 is lost; 2 arrives at 1 ms, 3 at 4 ms.
        b.push(t0 + ms(1), 2, 1, pkt(2));
        b.push(t0 + ms(4), 3, 1, pkt(3));
        assert_eq!(
            b.poll_timeout(),
            Some(t0 + ms(11)),
            "first packet behind the gap + timeout"
        );
        assert!(drain(&mut b, t0 + ms(11) - Duration::from_micros(1)).is_empty());
        assert_eq!(drain(&mut b, t0 + ms(11)), vec![2, 3]);
        assert_eq!((b.stats().skipped, b.stats().timeouts), (1, 1));
        assert_eq!(b.poll_timeout(), None);
        // Waits: 0 (seq 0), 10 ms (seq 2), 7 ms (seq 3).
        let p100 = b.wait_percentile(100.0);
        assert!(p100 >= ms(9) && p100 <= ms(11), "{p100:?}");
        let p50 = b.wait_percentile(50.0);
        assert!(
            p50 >= Duration::from_micros(6500) && p50 <= Duration::from_micros(7500),
            "{p50:?}"
        );
        assert_eq!(b.wait_percentile(0.0), Duration::ZERO);
    }

    #[test]
    fn second_gap_waits_from_its_own_first_packet() {
        let t0 = Instant::now();
        let mut b = buf(64);
        b.set_timeout(ms(10));
        b.reset(0);
        b.push(t0, 1, 1, pkt(1));
        b.push(t0 + ms(8), 3, 1, pkt(3));
        assert_eq!(drain(&mut b, t0 + ms(10)), vec![1]);
        // 2 is missing; 3 arrived at 8 ms: its wait ends at 18 ms.
        assert_eq!(b.poll_timeout(), Some(t0 + ms(18)));
        assert!(drain(&mut b, t0 + ms(17)).is_empty());
        assert_eq!(drain(&mut b, t0 + ms(18)), vec![3]);
        assert_eq!(b.stats().timeouts, 2);
    }

    #[test]
    fn capacity_is_clamped() {
        let t = Instant::now();
        let mut b = ReorderBuffer::new(ReorderConfig {
            capacity: usize::MAX,
            ..Default::default()
        });
        b.reset(0);
        b.push(t, MAX_CAPACITY as u64 + 5, 1, pkt(1));
        // Past the largest window: it slides, and allocates nothing.
        assert_eq!(b.capacity(), INITIAL_WINDOW as u64);
        assert_eq!(
            b.stats().skipped,
            MAX_CAPACITY as u64 + 6 - INITIAL_WINDOW as u64
        );
        // Capacity 0 means 1: in order works, and holding two packets is one too many.
        let mut b = buf(0);
        b.push(t, 3, 1, pkt(3));
        assert_eq!(drain(&mut b, t), vec![3]);
        b.push(t, 5, 1, pkt(5));
        b.push(t, 6, 1, pkt(6));
        assert_eq!(drain(&mut b, t), vec![6]);
        assert_eq!((b.stats().overflow, b.stats().skipped), (1, 2));
    }

    #[test]
    fn timeout_is_clamped() {
        let mut b = buf(8);
        b.set_timeout(Duration::ZERO);
        assert_eq!(b.timeout(), ms(2));
        b.set_timeout(ms(10_000));
        assert_eq!(b.timeout(), ms(500));
        b.set_timeout(ms(35));
        assert_eq!(b.timeout(), ms(35));
    }

    #[test]
    fn far_future_seq_slides_the_window_without_allocating() {
        let t = Instant::now();
        let mut b = buf(16);
        b.reset(0);
        for s in [1, 2, 5] {
            b.push(t, s, 1, pkt(s));
        }
        let huge = u64::MAX - 3;
        assert_eq!(b.push(t, huge, 1, pkt(huge)), Pushed::Queued);
        assert!(b.depth() <= 16);
        // What was held comes out in order; the gaps just below the far packet, inside the new
        // window, get their normal wait.
        assert_eq!(drain(&mut b, t), vec![1, 2, 5]);
        assert_eq!(b.stats().skipped, huge - 15 - 3);
        assert_eq!(drain(&mut b, t + INITIAL_TIMEOUT), vec![huge]);
        // Everything between was given up (counted, not iterated).
        assert_eq!(b.stats().skipped, huge - 3);
        // Below the bitmap's window: whether it was delivered is not known, so it is not.
        assert_eq!(b.push(t, 3, 1, pkt(3)), Pushed::Late);
        assert!(drain(&mut b, t).is_empty());
        assert_eq!(b.stats().late_delivered, 0);
        assert_eq!(b.push(t, huge, 1, pkt(huge)), Pushed::Duplicate);
        // And the window goes on up to the very last sequence number.
        for s in huge + 1..=u64::MAX {
            assert_eq!(b.push(t, s, 1, pkt(s)), Pushed::Queued);
        }
        assert_eq!(drain(&mut b, t), vec![u64::MAX - 2, u64::MAX - 1, u64::MAX]);
    }

    #[test]
    fn slide_within_the_window_skips_only_the_oldest_gaps() {
        let t = Instant::now();
        let mut b = buf(8);
        b.reset(0);
        b.push(t, 1, 1, pkt(1));
        b.push(t, 3, 1, pkt(3));
        // 9 needs the window [2, 10): 0 is skipped, 1 is delivered, 3 stays held behind gap 2.
        b.push(t, 9, 1, pkt(9));
        assert_eq!(b.stats().skipped, 1);
        assert_eq!(drain(&mut b, t), vec![1]);
        b.push(t, 2, 1, pkt(2));
        assert_eq!(drain(&mut b, t), vec![2, 3]);
    }

    #[test]
    fn depth_is_bounded_when_nobody_pops() {
        let t = Instant::now();
        let mut b = buf(32);
        b.reset(0);
        let mut s = 1u64;
        for i in 0..10_000u64 {
            b.push(t, s, 1, pkt(s));
            assert!(b.depth() <= 32);
            s += 1 + (i % 7) * 5;
        }
        assert!(b.stats().overflow > 0);
        let out = drain(&mut b, t + ms(1000));
        assert!(out.windows(2).all(|w| w[0] < w[1]));
        assert!(out.len() <= 32);
    }

    #[test]
    fn reset_starts_a_new_session() {
        let t = Instant::now();
        let mut b = buf(16);
        b.push(t, 100, 1, pkt(100));
        b.push(t, 102, 1, pkt(102));
        assert_eq!(drain(&mut b, t), vec![100]);
        b.reset(0);
        assert_eq!(b.depth(), 0);
        assert_eq!(b.next_seq(), Some(0));
        b.push(t, 0, 1, pkt(0));
        assert_eq!(drain(&mut b, t), vec![0]);
        // A grown window's limit of what it knows goes with the old session.
        let mut b = buf(65536);
        b.reset(100_000);
        b.push(t, 100_000 + 5000, 1, pkt(105_000));
        assert_eq!(b.capacity(), 8192);
        b.reset(0);
        b.push(t, 1, 1, pkt(1));
        b.push(t, 2, 1, pkt(2));
        assert_eq!(drain(&mut b, t + ms(500)), vec![1, 2]);
        assert_eq!(b.push(t, 1, 1, pkt(1)), Pushed::Duplicate);
    }

    #[test]
    fn histogram_buckets_are_monotone_and_close() {
        let mut last = 0;
        for v in (0..2_000_000u64)
            .step_by(997)
            .chain([u64::MAX / 2, u64::MAX])
        {
            let i = Histogram::index(v);
            assert!(i < HIST_BUCKETS);
            assert!(i >= last);
            last = i;
            let mid = Histogram::value(i) as f64;
            assert!(
                (mid - v as f64).abs() <= 0.07 * v as f64 + 1.0,
                "{v} -> {mid}"
            );
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// Push `base + off` (base: near the delivery point) on link.
        Near(u16, u16),
        Far(u64, u16),
        Advance(u16),
        Pop,
        Links(Vec<u16>),
        Timeout(u16),
        /// `fit_window` after that many seconds more.
        Fit(u8),
    }

    fn arb_op() -> impl Strategy<Value = Op> {
        prop_oneof![
            8 => (0u16..200, 0u16..3).prop_map(|(o, l)| Op::Near(o, l)),
            1 => (any::<u64>(), 0u16..3).prop_map(|(s, l)| Op::Far(s, l)),
            1 => (u64::MAX - 100..=u64::MAX, 0u16..3).prop_map(|(s, l)| Op::Far(s, l)),
            3 => (0u16..20_000).prop_map(Op::Advance),
            4 => Just(Op::Pop),
            1 => proptest::collection::vec(0u16..3, 0..3).prop_map(Op::Links),
            1 => (0u16..1000).prop_map(Op::Timeout),
            1 => (0u8..8).prop_map(Op::Fit),
        ]
    }

    proptest! {
        /// Driven as the endpoint drives it (pop after every push and at `poll_timeout`), no
        /// packet waits longer than the hold timeout, whatever the loss and reordering, and
        /// everything that arrives before its gap was given up is delivered in order.
        #[test]
        fn no_packet_waits_longer_than_the_timeout(
            delays in proptest::collection::vec((0u64..60_000, 0u8..20), 1..400),
            timeout_ms in 2u64..40,
        ) {
            let t0 = Instant::now();
            let timeout = ms(timeout_ms);
            let mut b = buf(64);
            b.set_timeout(timeout);
            b.reset(0);
            // Packet k is sent at k ms and arrives after its delay; 1 in 20 is lost.
            let mut arrivals: Vec<(Instant, u64)> = delays
                .iter()
                .enumerate()
                .filter(|(_, &(_, lost))| lost != 0)
                .map(|(k, &(d, _))| (t0 + ms(k as u64) + Duration::from_micros(d), k as u64))
                .collect();
            arrivals.sort();
            let mut arrived_at = std::collections::HashMap::new();
            let mut out: Vec<u64> = Vec::new();
            let mut now = t0;
            let mut ooo = std::collections::HashSet::new();
            let mut in_order: Option<u64> = None;
            let pop_all = |b: &mut ReorderBuffer, now: Instant, arrived_at: &std::collections::HashMap<u64, Instant>, out: &mut Vec<u64>, ooo: &std::collections::HashSet<u64>, in_order: &mut Option<u64>| -> Result<(), TestCaseError> {
                while let Some(p) = b.pop(now) {
                    let s = seq_of(&p);
                    let waited = now - arrived_at[&s];
                    // The hold timeout, plus what late packets taught it (never past the maximum).
                    let limit = b.timeout();
                    prop_assert!(limit >= timeout && limit <= b.cfg.max_timeout);
                    prop_assert!(waited <= limit, "{} waited {:?} > {:?}", s, waited, limit);
                    // In order, but for late packets (delivered at once, out of order).
                    if !ooo.contains(&s) {
                        prop_assert!(in_order.is_none_or(|l| s > l), "{} after {:?}", s, in_order);
                        *in_order = Some(s);
                    }
                    prop_assert!(!out.contains(&s), "{} delivered twice", s);
                    out.push(s);
                }
                Ok(())
            };
            let mut i = 0;
            while i < arrivals.len() || b.depth() > 0 {
                let next_arrival = arrivals.get(i).map(|a| a.0);
                let next_timeout = b.poll_timeout();
                let t = match (next_arrival, next_timeout) {
                    (Some(a), Some(d)) => a.min(d),
                    (Some(a), None) => a,
                    (None, Some(d)) => d,
                    (None, None) => break,
                };
                now = now.max(t);
                if next_arrival == Some(t) {
                    let (_, seq) = arrivals[i];
                    i += 1;
                    arrived_at.insert(seq, now);
                    if b.push(now, seq, 1, pkt(seq)) == Pushed::OutOfOrder {
                        ooo.insert(seq);
                    }
                }
                pop_all(&mut b, now, &arrived_at, &mut out, &ooo, &mut in_order)?;
            }
            // Everything arrived is delivered, but late packets below the bitmap's window.
            let dropped = (b.stats().late - b.stats().late_delivered) as usize;
            prop_assert_eq!(out.len() + dropped, arrivals.len());
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
        #[test]
        fn invariants_hold_for_arbitrary_sequences(
            window in 1usize..64,
            grows in 1usize..5,
            first in prop_oneof![0u64..10, any::<u64>()],
            ops in proptest::collection::vec(arb_op(), 1..300),
        ) {
            let t0 = Instant::now();
            let mut now = t0;
            // The window starts at `window` and may grow to `cap`.
            let cap = window * grows;
            let mut b = ReorderBuffer::with_window(
                ReorderConfig { capacity: cap, ..Default::default() },
                window,
            );
            let mut queued = BTreeSet::new();
            // Pushes that took a packet (a seq dropped for memory may be taken again, late).
            let mut accepted = 0u64;
            let mut out: Vec<u64> = Vec::new();
            let base = |b: &ReorderBuffer| b.next_seq().unwrap_or(first);
            // Late packets delivered out of order (`Pushed::OutOfOrder`).
            let mut out_of_order = BTreeSet::new();
            let check = |b: &mut ReorderBuffer, now: Instant, out: &mut Vec<u64>, ooo: &BTreeSet<u64>| -> Result<(), TestCaseError> {
                while let Some(p) = b.pop(now) {
                    let s = seq_of(&p);
                    let last = out.iter().rev().find(|l| !ooo.contains(l));
                    prop_assert!(ooo.contains(&s) || last.is_none_or(|&l| s > l), "not increasing: {:?} then {}", last, s);
                    out.push(s);
                }
                prop_assert!(b.depth() <= cap, "depth {} > {}", b.depth(), cap);
                Ok(())
            };
            for op in ops {
                match op {
                    Op::Near(off, l) => {
                        let s = base(&b).saturating_add(off as u64).saturating_sub(50);
                        let next = b.next_seq();
                        let r = b.push(now, s, l, pkt(s));
                        if r == Pushed::Queued {
                            accepted += 1;
                            prop_assert!(queued.insert(s), "{} queued twice", s);
                            prop_assert!(next.is_none_or(|n| s >= n));
                        } else if r == Pushed::OutOfOrder {
                            // Never delivered (it may have been accepted before and dropped
                            // for memory: counted in `overflow`).
                            prop_assert!(next.is_some_and(|n| s < n));
                            prop_assert!(!out.contains(&s), "{} delivered, then taken again", s);
                            accepted += 1;
                            queued.insert(s);
                            out_of_order.insert(s);
                        } else {
                            prop_assert!(next.is_some_and(|n| s < n) || queued.contains(&s));
                        }
                    }
                    Op::Far(s, l) => {
                        let r = b.push(now, s, l, pkt(s));
                        if r == Pushed::Queued {
                            accepted += 1;
                            prop_assert!(queued.insert(s), "{} queued twice", s);
                        }
                        if r == Pushed::OutOfOrder {
                            prop_assert!(!out.contains(&s), "{} delivered, then taken again", s);
                            accepted += 1;
                            queued.insert(s);
                            out_of_order.insert(s);
                        }
                    }
                    Op::Advance(us) => now += Duration::from_micros(us as u64),
                    Op::Pop => check(&mut b, now, &mut out, &out_of_order)?,
                    Op::Links(ls) => b.set_links(&ls),
                    Op::Timeout(ms_) => b.set_timeout(Duration::from_millis(ms_ as u64)),
                    Op::Fit(s) => {
                        now += Duration::from_secs(s as u64);
                        b.fit_window(now);
                    }
                }
                prop_assert!(b.depth() <= b.capacity() as usize);
                prop_assert!((window as u64..=cap as u64).contains(&b.capacity()));
                if let Some(t) = b.poll_timeout() {
                    prop_assert!(t <= now + ms(500));
                }
            }
            // Flush: after the longest timeout everything held comes out.
            now += ms(501);
            check(&mut b, now, &mut out, &out_of_order)?;
            prop_assert_eq!(b.depth(), 0);
            prop_assert_eq!(b.poll_timeout(), None);
            // Every packet accepted was delivered exactly once, or dropped for memory (counted).
            let delivered: BTreeSet<u64> = out.iter().copied().collect();
            prop_assert_eq!(delivered.len(), out.len());
            prop_assert!(delivered.is_subset(&queued));
            prop_assert_eq!(accepted, out.len() as u64 + b.stats().overflow);
            prop_assert_eq!(b.stats().delivered, out.len() as u64);
        }
    }
}
