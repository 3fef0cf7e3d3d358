//! The receiver's reorder buffer: delivers the bundle's packets in sequence order, never twice,
//! and never holds one for long.
//!
//! - Storage is a ring of `capacity` slots indexed by `seq % capacity`, covering the window
//!   `[next, next + capacity)` where `next` is the delivery point. Nothing is allocated in
//!   proportion to sequence values: a far-future `seq` (beyond the window) slides the window
//!   forward, giving up on (counting as skipped) the oldest gaps and handing what was held to the
//!   output, so memory stays bounded whatever the peer sends.
//! - A missing sequence number is given up when
//!   (a) every link in [`ReorderBuffer::set_links`] has already delivered a higher sequence number
//!   (links are FIFO, so it was lost: Multilink PPP's rule), or
//!   (b) it has waited the hold timeout since the first packet behind it arrived (the timeout is
//!   set by the endpoint from the links' delay spread, clamped to the configured bounds).
//! - A bitmap over the last `capacity` sequence numbers behind the delivery point tells a
//!   duplicate of a delivered packet from a late packet whose gap was skipped.
//! - Every delivered packet's wait (arrival to pop) goes into a log-bucket histogram
//!   ([`ReorderBuffer::wait_percentile`]).
//!
//! Call [`ReorderBuffer::pop`] until `None` after every `push` and `set_links`, and at
//! [`ReorderBuffer::poll_timeout`].

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::LinkId;

/// Hold timeout before the endpoint sets one (clamped to the configured bounds).
pub const INITIAL_TIMEOUT: Duration = Duration::from_millis(100);

#[derive(Debug, Clone)]
pub struct ReorderConfig {
    /// Slots (packets) the buffer may hold ahead of the delivery point. Default 4096.
    pub capacity: usize,
    /// Bounds for the adaptive hold timeout. Defaults 2 ms and 500 ms.
    pub min_timeout: Duration,
    pub max_timeout: Duration,
}

impl Default for ReorderConfig {
    fn default() -> Self {
        ReorderConfig {
            capacity: 4096,
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
    /// Behind the delivery point (its gap was already skipped).
    Late,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ReorderStats {
    pub delivered: u64,
    pub duplicates: u64,
    pub late: u64,
    /// Sequence numbers given up on (lost, or skipped to make room).
    pub skipped: u64,
    /// Times the head-of-line wait ran out.
    pub timeouts: u64,
    pub max_depth: usize,
    /// Packets that had been received but were dropped to keep memory bounded (only when the
    /// caller lets more than `capacity` packets pile up without popping).
    pub overflow: u64,
}

struct Slot {
    seq: u64,
    arrival: Instant,
    packet: Vec<u8>,
}

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
    next: u64,
    started: bool,
    /// Bit `s % cap` set: `s` (in `[next - cap, next)`) was delivered (not skipped).
    delivered_bits: Vec<u64>,
    /// Held packets in arrival order (seq, arrival); entries of packets no longer held are
    /// dropped lazily from the front.
    arrivals: VecDeque<(u64, Instant)>,
    /// Packets taken out of the ring when the window slid, waiting for `pop` (in order).
    ready: VecDeque<Slot>,
    /// Highest sequence number received per link.
    link_max: Vec<(LinkId, u64)>,
    links: Vec<LinkId>,
    timeout: Duration,
    stats: ReorderStats,
    waits: Histogram,
}

impl ReorderBuffer {
    pub fn new(cfg: ReorderConfig) -> Self {
        let cap = cfg.capacity.max(1);
        let timeout = INITIAL_TIMEOUT.clamp(cfg.min_timeout.min(cfg.max_timeout), cfg.max_timeout);
        ReorderBuffer {
            slots: (0..cap).map(|_| None).collect(),
            delivered_bits: vec![0; cap.div_ceil(64)],
            cap: cap as u64,
            cfg,
            held: 0,
            next: 0,
            started: false,
            arrivals: VecDeque::new(),
            ready: VecDeque::new(),
            link_max: Vec::new(),
            links: Vec::new(),
            timeout,
            stats: ReorderStats::default(),
            waits: Histogram::new(),
        }
    }

    fn idx(&self, seq: u64) -> usize {
        (seq % self.cap) as usize
    }
    fn bit(&self, seq: u64) -> bool {
        let i = self.idx(seq);
        self.delivered_bits[i / 64] & (1 << (i % 64)) != 0
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
        if !self.started {
            self.started = true;
            self.next = seq;
        }
        match self.link_max.iter_mut().find(|e| e.0 == link) {
            Some(e) => e.1 = e.1.max(seq),
            None => self.link_max.push((link, seq)),
        }
        if seq < self.next {
            return if self.next - seq <= self.cap && self.bit(seq) {
                self.stats.duplicates += 1;
                Pushed::Duplicate
            } else {
                self.stats.late += 1;
                Pushed::Late
            };
        }
        if seq - self.next >= self.cap {
            // Far future: slide the window so that `seq` is its last slot.
            self.advance_to(seq - self.cap + 1);
        }
        let i = self.idx(seq);
        if self.slots[i].is_some() {
            self.stats.duplicates += 1;
            return Pushed::Duplicate;
        }
        self.slots[i] = Some(Slot {
            seq,
            arrival: now,
            packet,
        });
        self.held += 1;
        self.arrivals.push_back((seq, now));
        // Bound memory when the caller does not pop: drop the oldest slid-out packets.
        while self.depth() > self.cap as usize {
            match self.ready.pop_front() {
                Some(s) => {
                    if self.next - s.seq <= self.cap {
                        self.set_bit(s.seq, false);
                    }
                    self.stats.overflow += 1;
                    self.stats.skipped += 1;
                }
                None => break,
            }
        }
        self.stats.max_depth = self.stats.max_depth.max(self.depth());
        Pushed::Queued
    }

    /// Moves the delivery point to `to` (> next): held packets below it go to `ready`, missing
    /// ones are skipped. Costs O(min(to - next, capacity)).
    fn advance_to(&mut self, to: u64) {
        let span = to - self.next;
        if span >= self.cap {
            // Every slot is below `to`: walk the whole ring in sequence order.
            // The bitmap then covers `[to - cap, to)`: only moved packets in that range are set.
            self.delivered_bits.iter_mut().for_each(|w| *w = 0);
            let mut moved = 0u64;
            for k in 0..self.cap {
                let s = self.next + k;
                let i = self.idx(s);
                if let Some(slot) = self.slots[i].take() {
                    self.ready.push_back(slot);
                    moved += 1;
                    if to - s <= self.cap {
                        self.set_bit(s, true);
                    }
                }
            }
            self.held = 0;
            self.stats.skipped = self.stats.skipped.saturating_add(span - moved);
        } else {
            for s in self.next..to {
                let i = self.idx(s);
                match self.slots[i].take() {
                    Some(slot) => {
                        self.held -= 1;
                        self.ready.push_back(slot);
                        self.set_bit(s, true);
                    }
                    None => {
                        self.stats.skipped += 1;
                        self.set_bit(s, false);
                    }
                }
            }
        }
        self.next = to;
        self.prune_arrivals();
    }

    fn prune_arrivals(&mut self) {
        while let Some(&(seq, _)) = self.arrivals.front() {
            let still_held = seq >= self.next
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
    /// The current hold timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
    /// The links that currently carry data; a gap that every one of them has passed is lost.
    pub fn set_links(&mut self, links: &[LinkId]) {
        self.links.clear();
        self.links.extend_from_slice(links);
    }

    /// Rule (a): every link that carries data has delivered something beyond `seq`.
    fn passed_by_all_links(&self, seq: u64) -> bool {
        !self.links.is_empty()
            && self
                .links
                .iter()
                .all(|l| self.link_max.iter().any(|e| e.0 == *l && e.1 > seq))
    }

    fn deliver(&mut self, now: Instant, slot: Slot) -> Vec<u8> {
        self.stats.delivered += 1;
        let wait = now.saturating_duration_since(slot.arrival);
        self.waits
            .record(wait.as_micros().min(u64::MAX as u128) as u64);
        slot.packet
    }

    /// Next packet to deliver, in order.
    pub fn pop(&mut self, now: Instant) -> Option<Vec<u8>> {
        if let Some(slot) = self.ready.pop_front() {
            return Some(self.deliver(now, slot));
        }
        if !self.started || self.held == 0 {
            return None;
        }
        let i = self.idx(self.next);
        if let Some(slot) = self.slots[i].take() {
            self.held -= 1;
            self.set_bit(self.next, true);
            self.next += 1;
            self.prune_arrivals();
            return Some(self.deliver(now, slot));
        }
        // The head is a gap with packets behind it: give it up?
        let timed_out = self
            .arrivals
            .front()
            .is_some_and(|&(_, t)| now >= t + self.timeout);
        if !timed_out && !self.passed_by_all_links(self.next) {
            return None;
        }
        // Skip the run of missing sequence numbers up to the next held packet (by timeout: all of
        // them; by rule (a): only those every link has passed).
        let mut s = self.next;
        while self.slots[self.idx(s)].is_none() && (timed_out || self.passed_by_all_links(s)) {
            s += 1;
        }
        if timed_out {
            self.stats.timeouts += 1;
        }
        if s > self.next {
            self.advance_to(s);
        }
        self.pop(now)
    }
    /// When the head-of-line gap's wait runs out (call `pop` then). An instant in the past when
    /// a packet is deliverable now; `None` when nothing is held.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if let Some(s) = self.ready.front() {
            return Some(s.arrival);
        }
        if self.held == 0 {
            return None;
        }
        if let Some(s) = &self.slots[self.idx(self.next)] {
            return Some(s.arrival);
        }
        self.arrivals.front().map(|&(_, t)| t + self.timeout)
    }
    /// Starts over (new session): the next sequence expected is `next`.
    pub fn reset(&mut self, next: u64) {
        self.slots.iter_mut().for_each(|s| *s = None);
        self.delivered_bits.iter_mut().for_each(|w| *w = 0);
        self.held = 0;
        self.arrivals.clear();
        self.ready.clear();
        self.link_max.clear();
        self.next = next;
        self.started = true;
    }
    pub fn depth(&self) -> usize {
        self.held + self.ready.len()
    }
    pub fn stats(&self) -> &ReorderStats {
        &self.stats
    }
    /// The delivery point (next sequence number expected), once known.
    pub fn next_seq(&self) -> Option<u64> {
        self.started.then_some(self.next)
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
