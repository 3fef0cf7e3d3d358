//! The link model, one direction of one link, as pure logic (time comes in). The simulator
//! ([`crate::sim`]) and the lab's emulator (`braid-lab`, which forwards real frames through it)
//! both use it, so that both measure the same link.
//!
//! A frame of `len` IP bytes arriving at `now`:
//! 1. is lost with probability `loss` (seeded RNG), before it takes any capacity;
//! 2. is dropped if the bytes still waiting for the wire plus `len` exceed the queue limit
//!    (drop-tail);
//! 3. otherwise it is serialized after every earlier frame:
//!    `wire_done = max(now, last_wire_done) + len * 8 / rate`;
//! 4. and delivered at `wire_done + delay + jitter`, where jitter is uniform in [-J, +J] (never a
//!    negative delay), but never before the previous frame's delivery (the link stays FIFO).
//!
//! The backlog in step 2 is derived from the serialization clock: `(last_wire_done - now) * rate`.
//!
//! A queue may also run CoDel (RFC 8289, [`LinkModel::set_codel`]), as a router with fq_codel
//! or CAKE in front of an uplink does (OpenWrt's SQM, many cable and fibre boxes): between
//! steps 2 and 3, CoDel judges the frame as it will leave the queue (its sojourn is known on
//! arrival: the wire ahead of it is the queue) and, when it signals, marks an ECN-capable frame
//! Congestion Experienced and drops any other (RFC 3168; a dropped frame takes no wire time).

use std::time::{Duration, Instant};

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Default queue: this many milliseconds of the link's rate...
pub const DEFAULT_QUEUE_MS: u64 = 100;
/// ...but at least this many bytes (ten full-size frames), so that even a slow link holds a
/// few packets.
pub const MIN_QUEUE_BYTES: u64 = 15_000;

/// Queue limit in bytes for a link of `rate_bps` with a queue of `queue_ms` milliseconds.
pub fn queue_limit_bytes(rate_bps: u64, queue_ms: u64) -> u64 {
    (rate_bps.saturating_mul(queue_ms) / 8000).max(MIN_QUEUE_BYTES)
}

/// What a link is: rate, one-way delay, jitter and loss (the same both ways).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkParams {
    /// Bits per second of IP bytes.
    pub rate_bps: u64,
    /// One-way delay.
    pub delay: Duration,
    /// Maximum random deviation of the delay (uniform in [-jitter, +jitter]).
    pub jitter: Duration,
    /// Loss probability per frame, in [0, 1).
    pub loss: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The frame reaches the far end at this instant.
    Deliver(Instant),
    /// Random loss.
    Lost,
    /// Queue full.
    QueueFull,
    /// Reaches the far end at this instant, marked Congestion Experienced by CoDel (the caller
    /// writes the mark into the frame).
    Marked(Instant),
    /// Dropped by CoDel (a frame that is not ECN-capable).
    AqmDrop,
}

/// CoDel's state (RFC 8289 section 5): the queue signals once its packets' sojourn has stayed
/// above `target` for an `interval`, then ever more often (`interval / sqrt(count)` apart) while
/// it stays above.
#[derive(Debug, Clone, Copy)]
pub struct Codel {
    target: Duration,
    interval: Duration,
    /// When the sojourn went above target (plus an interval), `None`: below.
    first_above: Option<Instant>,
    dropping: bool,
    drop_next: Option<Instant>,
    count: u32,
    lastcount: u32,
}

impl Codel {
    /// fq_codel's defaults: 5 ms target, 100 ms interval.
    pub const TARGET: Duration = Duration::from_millis(5);
    pub const INTERVAL: Duration = Duration::from_millis(100);

    /// CoDel as a router shaping a link of `rate_bps` sets it up: fq_codel's defaults, the
    /// target raised to one and a half full-size packets' time on the wire on a slow link and
    /// the interval by as much (as OpenWrt's SQM and CAKE do: at 1 Mbit/s one packet takes 12
    /// ms, so a 5 ms target would signal on any queue at all).
    pub fn for_rate(rate_bps: u64) -> Self {
        let mtu_time = Duration::from_secs_f64(1500.0 * 8.0 * 1.5 / rate_bps.max(1) as f64);
        let target = Self::TARGET.max(mtu_time);
        Self::new(target, Self::INTERVAL + (target - Self::TARGET))
    }

    pub fn new(target: Duration, interval: Duration) -> Self {
        Codel {
            target,
            interval,
            first_above: None,
            dropping: false,
            drop_next: None,
            count: 0,
            lastcount: 0,
        }
    }

    fn control_law(&self, t: Instant) -> Instant {
        t + self.interval.div_f64(f64::from(self.count.max(1)).sqrt())
    }

    /// A frame leaves the queue at `now` after `sojourn`, `backlog` bytes still queued behind
    /// it: whether CoDel signals congestion on it (mark or drop).
    fn signals(&mut self, now: Instant, sojourn: Duration, backlog: u64) -> bool {
        let ok_to_drop = if sojourn < self.target || backlog <= 1514 {
            self.first_above = None;
            false
        } else {
            match self.first_above {
                None => {
                    self.first_above = Some(now + self.interval);
                    false
                }
                Some(t) => now >= t,
            }
        };
        if self.dropping {
            if !ok_to_drop {
                self.dropping = false;
                return false;
            }
            match self.drop_next {
                Some(t) if now >= t => {
                    self.count = self.count.saturating_add(1);
                    self.drop_next = Some(self.control_law(t));
                    true
                }
                _ => false,
            }
        } else if ok_to_drop {
            self.dropping = true;
            // Back in the dropping state soon after leaving it: start near the old rate.
            let delta = self.count.saturating_sub(self.lastcount);
            let recent = self
                .drop_next
                .is_some_and(|t| now.saturating_duration_since(t) < self.interval * 16);
            self.count = if delta > 1 && recent { delta } else { 1 };
            self.lastcount = self.count;
            self.drop_next = Some(self.control_law(now));
            true
        } else {
            false
        }
    }
}

/// One direction of one link.
#[derive(Debug, Clone)]
pub struct LinkModel {
    params: LinkParams,
    queue_limit: u64,
    wire_free_at: Option<Instant>,
    last_delivery: Option<Instant>,
    rng: ChaCha8Rng,
    codel: Option<Codel>,
}

impl LinkModel {
    /// A link direction with a drop-tail queue of `queue_limit` bytes and its own seeded RNG.
    pub fn new(params: LinkParams, queue_limit: u64, seed: u64) -> Self {
        LinkModel {
            params,
            queue_limit,
            wire_free_at: None,
            last_delivery: None,
            rng: ChaCha8Rng::seed_from_u64(seed),
            codel: None,
        }
    }

    /// Runs CoDel on the queue from now on (`None`: drop-tail alone).
    pub fn set_codel(&mut self, codel: Option<Codel>) {
        self.codel = codel;
    }

    pub fn params(&self) -> &LinkParams {
        &self.params
    }

    /// The link's random loss from now on (a line that gets worse or better).
    pub fn set_loss(&mut self, loss: f64) {
        self.params.loss = loss;
    }

    /// Bytes waiting to be serialized at `now`.
    pub fn backlog(&self, now: Instant) -> u64 {
        match self.wire_free_at {
            Some(t) if t > now => {
                ((t - now).as_secs_f64() * self.params.rate_bps as f64 / 8.0) as u64
            }
            _ => 0,
        }
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Decides the fate of a frame of `len` IP bytes arriving at `now` that is not
    /// ECN-capable.
    pub fn on_frame(&mut self, now: Instant, len: usize) -> Verdict {
        self.on_frame_ecn(now, len, false)
    }

    /// Decides the fate of a frame of `len` IP bytes arriving at `now`; `ect`: it is
    /// ECN-capable (CoDel marks it rather than dropping it).
    pub fn on_frame_ecn(&mut self, now: Instant, len: usize, ect: bool) -> Verdict {
        if self.params.loss > 0.0 && self.unit() < self.params.loss {
            return Verdict::Lost;
        }
        let backlog = self.backlog(now);
        if backlog + len as u64 > self.queue_limit {
            return Verdict::QueueFull;
        }
        let start = match self.wire_free_at {
            Some(t) if t > now => t,
            _ => now,
        };
        let signal = self
            .codel
            .as_mut()
            .is_some_and(|c| c.signals(start, start - now, backlog));
        if signal && !ect {
            return Verdict::AqmDrop;
        }
        let wire = Duration::from_secs_f64(len as f64 * 8.0 / self.params.rate_bps as f64);
        let wire_done = start + wire;
        self.wire_free_at = Some(wire_done);
        let mut at = wire_done + self.params.delay;
        if !self.params.jitter.is_zero() {
            let j = self.params.jitter.as_secs_f64();
            let off = (2.0 * self.unit() - 1.0) * j;
            at = if off >= 0.0 {
                at + Duration::from_secs_f64(off)
            } else {
                at.checked_sub(Duration::from_secs_f64(-off))
                    .unwrap_or(wire_done)
                    .max(wire_done)
            };
        }
        if let Some(prev) = self.last_delivery {
            at = at.max(prev);
        }
        self.last_delivery = Some(at);
        if signal {
            Verdict::Marked(at)
        } else {
            Verdict::Deliver(at)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(rate_bps: u64, delay_ms: u64) -> LinkParams {
        LinkParams {
            rate_bps,
            delay: Duration::from_millis(delay_ms),
            jitter: Duration::ZERO,
            loss: 0.0,
        }
    }

    #[test]
    fn serializes_at_rate_then_delays() {
        let t0 = Instant::now();
        let mut s = LinkModel::new(params(1_000_000, 10), 1_000_000, 1);
        // 1250 bytes at 1 Mbit/s = 10 ms on the wire.
        assert_eq!(
            s.on_frame(t0, 1250),
            Verdict::Deliver(t0 + Duration::from_millis(20))
        );
        assert_eq!(
            s.on_frame(t0, 1250),
            Verdict::Deliver(t0 + Duration::from_millis(30))
        );
        assert_eq!(s.backlog(t0), 2500);
        // After the wire is idle again, a frame goes straight out.
        let t1 = t0 + Duration::from_millis(100);
        assert_eq!(s.backlog(t1), 0);
        assert_eq!(
            s.on_frame(t1, 1250),
            Verdict::Deliver(t1 + Duration::from_millis(20))
        );
    }

    #[test]
    fn long_run_rate_is_exact() {
        let t0 = Instant::now();
        let mut s = LinkModel::new(params(10_000_000, 0), u64::MAX, 1);
        let mut last = t0;
        for _ in 0..10_000 {
            if let Verdict::Deliver(at) = s.on_frame(t0, 1500) {
                last = at;
            }
        }
        // 10 000 * 1500 * 8 bit at 10 Mbit/s = 12 s.
        let secs = (last - t0).as_secs_f64();
        assert!((secs - 12.0).abs() < 1e-3, "{secs}");
    }

    #[test]
    fn drop_tail_at_queue_limit() {
        let t0 = Instant::now();
        let mut s = LinkModel::new(params(1_000_000, 0), 3000, 1);
        assert!(matches!(s.on_frame(t0, 1500), Verdict::Deliver(_)));
        assert!(matches!(s.on_frame(t0, 1500), Verdict::Deliver(_)));
        assert_eq!(s.on_frame(t0, 1500), Verdict::QueueFull);
        // 12 ms later one frame has left the queue.
        let t1 = t0 + Duration::from_millis(12);
        assert!(matches!(s.on_frame(t1, 1500), Verdict::Deliver(_)));
        assert_eq!(s.on_frame(t1, 1500), Verdict::QueueFull);
    }

    #[test]
    fn loss_rate_matches_and_jitter_keeps_fifo() {
        let t0 = Instant::now();
        let mut sp = params(100_000_000, 20);
        sp.loss = 0.1;
        sp.jitter = Duration::from_millis(5);
        // Dense frames: loss near 10%, never reordered.
        let mut s = LinkModel::new(sp, u64::MAX, 7);
        let mut lost = 0;
        let mut prev = t0;
        for i in 0..20_000u32 {
            let now = t0 + Duration::from_micros(u64::from(i) * 200);
            match s.on_frame(now, 100) {
                Verdict::Lost => lost += 1,
                Verdict::Deliver(at) => {
                    assert!(at >= prev, "reordered");
                    prev = at;
                }
                v => panic!("{v:?}: unbounded queue, no CoDel"),
            }
        }
        assert!((1800..2200).contains(&lost), "{lost}");
        // Sparse frames (10 ms apart, more than the jitter range): delays spread over 20 +- 5 ms.
        sp.loss = 0.0;
        let mut s = LinkModel::new(sp, u64::MAX, 7);
        let (mut min, mut max, mut sum) = (Duration::MAX, Duration::ZERO, 0.0);
        for i in 0..2000u32 {
            let now = t0 + Duration::from_millis(u64::from(i) * 10);
            let Verdict::Deliver(at) = s.on_frame(now, 100) else {
                panic!("dropped")
            };
            min = min.min(at - now);
            max = max.max(at - now);
            sum += (at - now).as_secs_f64();
        }
        assert!(
            min < Duration::from_millis(16) && min >= Duration::from_millis(15),
            "{min:?}"
        );
        assert!(
            max > Duration::from_millis(24) && max <= Duration::from_micros(25_010),
            "{max:?}"
        );
        let mean = sum / 2000.0;
        assert!((mean - 0.020).abs() < 0.0005, "{mean}");
    }

    #[test]
    fn codel_on_a_slow_link_waits_for_one_and_a_half_packets() {
        let c = Codel::for_rate(1_000_000);
        assert_eq!(c.target, Duration::from_millis(18));
        assert_eq!(c.interval, Duration::from_millis(113));
        let c = Codel::for_rate(100_000_000);
        assert_eq!((c.target, c.interval), (Codel::TARGET, Codel::INTERVAL));
    }

    /// CoDel leaves a queue that stays under its target alone, and signals on one that stays
    /// above it for an interval, then more and more often: marks for ECN-capable frames, drops
    /// for the others (which take no wire time).
    #[test]
    fn codel_signals_a_standing_queue_by_mark_or_drop() {
        for ect in [true, false] {
            let t0 = Instant::now();
            // 10 Mbit/s, 1250-byte frames: 1 ms each on the wire.
            let mut s = LinkModel::new(params(10_000_000, 0), u64::MAX, 1);
            s.set_codel(Some(Codel::new(Codel::TARGET, Codel::INTERVAL)));
            // At the link's rate: no queue, no signal.
            let mut t = t0;
            for _ in 0..500 {
                assert!(matches!(s.on_frame_ecn(t, 1250, ect), Verdict::Deliver(_)));
                t += Duration::from_millis(1);
            }
            // 20% faster than the rate for 2 s: the queue grows past the target for good.
            let (mut signals, mut first) = (0, None);
            for k in 0..2400u32 {
                let now = t + Duration::from_micros(u64::from(k) * 833);
                match s.on_frame_ecn(now, 1250, ect) {
                    Verdict::Marked(_) if ect => {}
                    Verdict::AqmDrop if !ect => {}
                    Verdict::Deliver(_) => continue,
                    v => panic!("{v:?} (ect {ect})"),
                }
                signals += 1;
                first.get_or_insert(now - t);
            }
            // The sojourn passes 5 ms about 30 ms in, then an interval must pass, counted at
            // the frames' departures: the first signalled frame left about 130 ms in, and came
            // its sojourn (about 20 ms) before.
            let first = first.expect("signalled");
            assert!(
                first > Duration::from_millis(95) && first < Duration::from_millis(125),
                "{first:?}"
            );
            // Then interval / sqrt(count) apart, closer and closer: dozens in the 1.9 s left,
            // far fewer than the frames.
            assert!((20..300).contains(&signals), "{signals} (ect {ect})");
        }
    }

    #[test]
    fn queue_limits() {
        assert_eq!(
            queue_limit_bytes(1_000_000, 100),
            12_500.max(MIN_QUEUE_BYTES)
        );
        assert_eq!(queue_limit_bytes(1_000_000, 20), MIN_QUEUE_BYTES);
        assert_eq!(queue_limit_bytes(50_000_000, 100), 625_000);
    }
}
