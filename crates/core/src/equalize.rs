//! How fast delay equalisation may lengthen the inner flows' round trip.
//!
//! Delay equalisation holds every bulk packet until the slowest usable link would have brought
//! it (docs/scheduling.md), so the inner flows' round trip is the fastest link's plus the hold.
//! When the hold grows while a flow runs (a slower link comes up or comes back, or is enslaved),
//! the round trip grows under a flow that sized itself for the old one:
//! - BBR (v1, Linux's) keeps at most 2 x its bandwidth estimate x its *minimum* round trip in
//!   flight, and that minimum is kept for 10 s. A round trip more than twice that minimum caps
//!   what it delivers below its estimate, the estimate follows what it delivers, and the flow
//!   spirals down to its 4-packet floor until the minimum expires. Measured in the simulator
//!   (50 Mbit/s at 10 ms, then a 20 Mbit/s, 60 ms link coming up 1.5 s into the flow): 65
//!   Mbit/s without the late link, 0.5-0.8 Mbit/s from 6 to 15 s with it; in the lab, 3 of 8
//!   runs of 25 s fell to 4-12 Mbit/s after such a return (BENCHMARKS.md §4, "A link coming
//!   back"), and CI's lab run that fell 63 -> 18 Mbit/s over 8 s was likely one (not proven).
//! - CUBIC's window, sized for the old round trip, gives 1/k of its rate when the round trip
//!   grows k-fold, and regrows in CUBIC's own time (the same simulator case: 26-29 Mbit/s for
//!   9 s, below the fast link alone).
//!
//! So while bulk traffic flows, [`Ramp`] lets the hold grow by at most [`GROWTH`] x the round
//! trip at a time, and again only after [`STEP_EVERY`], which is BBR's minimum-round-trip
//! window (10 s) and a margin: by then the flow has taken the longer round trip as its minimum.
//! A shrinking hold applies at once (a shorter round trip harms no sender), and an idle bundle
//! takes the full hold at once (a new flow measures its round trip afresh). Both ends run one:
//! the receiver for the hold, the sender for the scheduler's view of it (a link beyond the
//! allowed hold is not waited for, so the sender does not spread onto it yet); the sender's
//! steps lag the receiver's by [`SENDER_LAG`] so that it never counts on a hold not yet there.
//!
//! A hold within [`SLACK`] of the last step follows at once (the links' delays are measured and
//! wobble); small rises do not add up beyond it until the next step.
//!
//! The cost: a link that comes up during a transfer is used in full only after two or three
//! steps (10 and 60 ms links, a 20 ms round trip: 12, then 28 ms of hold, then the full 50 ms,
//! from about 25 s after it came up), not after a collapse and a 10-20 s regrowth.

use std::time::{Duration, Instant};

/// How much longer one step may make the inner round trip. BBR stays within its window up to
/// 2 x, less the 1.25 x of its bandwidth probe.
pub const GROWTH: f64 = 1.6;
/// How long the hold stays at a step before the next: BBR v1's minimum-round-trip window (10 s)
/// and a margin for its probe of the round trip (200 ms and a round trip).
pub const STEP_EVERY: Duration = Duration::from_secs(11);
/// The sender's steps come this much after the receiver's would.
pub const SENDER_LAG: Duration = Duration::from_secs(1);
/// A rise this small applies at once, whenever it comes (BBR takes 2 ms more on a 20 ms round
/// trip in its stride; the links' delays are measured, and wobble by that much).
pub const SLACK: Duration = Duration::from_millis(2);
/// No bulk packet for this long: no flow keeps a round trip from before, the full hold applies.
pub const IDLE: Duration = STEP_EVERY;

/// The hold delay equalisation may apply now (see the module docs).
#[derive(Debug, Clone)]
pub struct Ramp {
    step_every: Duration,
    /// The hold of the last step or fall (the hold follows freely up to [`SLACK`] above it),
    /// and when a step last raised it (none since it last fell).
    base: Duration,
    raised_at: Option<Instant>,
    /// The last bulk packet, and the first of the traffic it belongs to (none for [`IDLE`]
    /// between them).
    traffic_at: Option<Instant>,
    began: Option<Instant>,
    /// The next call takes the hold wanted at once ([`Self::take_next`]).
    take_next: bool,
}

impl Ramp {
    /// A receiver's ramp.
    pub fn receiver() -> Self {
        Self::with_step(STEP_EVERY)
    }
    /// A sender's ramp (steps [`SENDER_LAG`] later).
    pub fn sender() -> Self {
        Self::with_step(STEP_EVERY + SENDER_LAG)
    }
    fn with_step(step_every: Duration) -> Self {
        Ramp {
            step_every,
            base: Duration::ZERO,
            raised_at: None,
            traffic_at: None,
            began: None,
            take_next: false,
        }
    }

    /// A bulk packet (one equalisation holds) went through.
    pub fn on_traffic(&mut self, now: Instant) {
        if self.idle(now) {
            self.began = Some(now);
        }
        self.traffic_at = Some(now);
    }

    /// When the latest run of bulk traffic began (none before the first bulk packet; after an
    /// idle spell, the run before it until the next packet).
    pub fn began(&self) -> Option<Instant> {
        self.began
    }

    /// The next [`allowed`](Self::allowed) takes the hold it is given at once, as when idle:
    /// the flows going on most likely had it from their start (the sender's view of the peer's
    /// hold catching up with it, `Endpoint::new_in_hold_view`).
    pub fn take_next(&mut self) {
        self.take_next = true;
    }

    fn idle(&self, now: Instant) -> bool {
        self.traffic_at
            .is_none_or(|t| now.saturating_duration_since(t) >= IDLE)
    }

    /// The hold to apply now, given the hold the links call for (`wanted`) and the fastest
    /// link's round trip (`rtt`: the inner round trip is about `rtt` plus the hold).
    pub fn allowed(&mut self, now: Instant, wanted: Duration, rtt: Duration) -> Duration {
        // Consumed whether or not the bundle is idle: it is for the next call only.
        let take = std::mem::take(&mut self.take_next);
        let idle = self.idle(now) || take;
        if idle || wanted < self.base {
            // A fall below the last step (or a new flow) sets the flows' minimum round trip to
            // the present one: the next rise may step at once.
            self.base = wanted;
            self.raised_at = None;
        } else if wanted > self.base + SLACK {
            let due = self
                .raised_at
                .is_none_or(|t| now.saturating_duration_since(t) >= self.step_every);
            if due {
                // The hold after the step, slack included, lengthens the round trip at the last
                // step's hold (the least the flows may have seen since) GROWTH-fold.
                let step = (rtt + self.base).as_secs_f64() * GROWTH - rtt.as_secs_f64();
                let step = Duration::from_micros((step * 1e6).round().max(0.0) as u64);
                self.base = wanted.min(step).saturating_sub(SLACK).max(self.base);
                self.raised_at = Some(now);
            }
        }
        // Within SLACK of the last step the hold follows at once (the links' delays are
        // measured, and wobble).
        wanted.min(self.base + SLACK)
    }
}

/// The receiver's delay equalisation: the target its held packets are released at, grown under
/// traffic by its [`Ramp`].
#[derive(Debug, Clone)]
pub struct Hold {
    /// The bound (`Config::equalize_max`).
    max: Duration,
    /// The relative one-way delay (`local_ts - send_ts`, wrapping microseconds) a held packet
    /// waits for, once measured.
    rel: Option<u32>,
    /// What the target adds to the fastest live link's base delay now, and what the links
    /// call for (the ramp may allow less).
    add: Duration,
    wanted: Duration,
    ramp: Ramp,
}

impl Hold {
    pub fn new(max: Duration) -> Self {
        Hold {
            max,
            rel: None,
            add: Duration::ZERO,
            wanted: Duration::ZERO,
            ramp: Ramp::receiver(),
        }
    }

    /// A held packet arrived.
    pub fn on_traffic(&mut self, now: Instant) {
        self.ramp.on_traffic(now);
    }

    /// Sets the target from the base relative one-way delays of the links that bring data
    /// (`bases`), `rtt` being the fastest link's round trip.
    pub fn update(&mut self, now: Instant, bases: &[u32], rtt: Duration) {
        let target = target(bases, self.max);
        self.wanted = target.map_or(Duration::ZERO, |(_, add)| add);
        (self.rel, self.add) = match target {
            Some((target, add)) => {
                let allowed = self.ramp.allowed(now, add, rtt);
                let less = add.saturating_sub(allowed).as_micros() as u32;
                (Some(target.wrapping_sub(less)), allowed)
            }
            None => {
                self.ramp.allowed(now, Duration::ZERO, rtt);
                (None, Duration::ZERO)
            }
        };
    }

    /// When a packet sent at `send_ts` (our clock read `local_ts` when it `arrived`) on the link
    /// whose [`Spacing`] is `spacing` (the packet's time on it `tx`, when known) is released: at
    /// `send_ts + target` in our clock, counted from its arrival, not from when we read it, or
    /// later to keep its link's pace, at most the bound from now; `now` when nothing is
    /// measured yet or the packet is not timed.
    pub fn release_at(
        &self,
        now: Instant,
        arrived: Instant,
        local_ts: u32,
        send_ts: Option<u32>,
        spacing: &mut Spacing,
        tx: Option<Duration>,
    ) -> Instant {
        match (self.rel, send_ts) {
            (Some(target), Some(ts)) => {
                let rel = local_ts.wrapping_sub(ts);
                let early = target.wrapping_sub(rel) as i32;
                let early = Duration::from_micros(early.max(0) as u64);
                let due = (arrived + early).clamp(now, now + self.max);
                spacing.release(arrived, due, now + self.max, target, tx)
            }
            _ => now,
        }
    }

    /// Forgets the target until the next [`update`](Self::update): a new session's send times run
    /// on a new clock, so a target measured in the old one would hold its first packets by
    /// anything up to the bound.
    pub fn forget_target(&mut self) {
        self.rel = None;
        self.add = Duration::ZERO;
        self.wanted = Duration::ZERO;
    }

    /// What the hold adds to the fastest link's delay now.
    pub fn add(&self) -> Duration {
        self.add
    }

    /// What the links call for (the ramp may allow less for now).
    pub fn wanted(&self) -> Duration {
        self.wanted
    }
}

/// One link's held packets, let out nearly as far apart as its pace put them.
///
/// The hold releases a packet at its send time plus the target, which takes off the queueing on
/// its own link as well as the spread between the links: the packets of a burst the inner sender
/// sent at once cross the link one after the other at its rate, but would all leave the hold
/// together, at the pace braid's sender read them. The inner flow then never sees its
/// bottleneck's pace. Measured (lab, 20 Mbit/s at 20 ms + 5 Mbit/s at 300 ms, `--equalize-max
/// 300`, CUBIC download): windows of 40 segments reached the receiving host in 1.3 ms (680
/// Mbit/s); Linux's receive-buffer tuning, which compares what the application read in one
/// round trip with what waits unread, then held the window at its first 80 kB for 1-12 s of a
/// 20 s run (`rwnd_limited`), the ACKs came back in bursts, and slow start ran on to lose
/// hundreds of segments at once (BENCHMARKS.md §4, "A link's own pace through the hold").
///
/// So a held packet leaves no earlier than the last held packet of its link did plus the time
/// between their arrivals, times [`SPACING_KEPT`] and at most the packet's own time on the link
/// at the rate the link brings (the caller's `tx`): the link's own pace (its serialisation, its
/// queue's growth) passes through the hold nearly as through a plain path; only the spread
/// between the links' delays is taken off. A gap longer than the packet's time on the link is
/// not the link's pace but its jitter, which the hold keeps absorbing (the lab's LTE link, 30 ms
/// +- 20 ms: spacing by the whole gap cost its CUBIC upload 5.6 points). A packet due later than
/// the spacing asks (its link's queue shrank, or it came late) leaves when due, as before. A
/// change of the target moves the last release with it (a link lost takes its wait off at
/// once), and what the rule adds is given back by an eighth of every gap, so no drift of the
/// link's delay adds up.
#[derive(Debug, Default, Clone, Copy)]
pub struct Spacing {
    /// The last held packet's arrival, release and the target it was held for.
    last: Option<(Instant, Instant, u32)>,
}

/// The share of the time between two held packets' arrivals on a link kept between their
/// releases (see [`Spacing`]).
pub const SPACING_KEPT: f64 = 7.0 / 8.0;

impl Spacing {
    /// When a held packet that `arrived`, and is `due` by the hold's `target`, leaves: not
    /// before `due`, nor before the last one's release (moved by the change of target) plus
    /// [`SPACING_KEPT`] of the time between the two arrivals, that at most `tx` (the packet's
    /// time on its link, when known); at most `latest` (unless due later).
    pub fn release(
        &mut self,
        arrived: Instant,
        due: Instant,
        latest: Instant,
        target: u32,
        tx: Option<Duration>,
    ) -> Instant {
        let at = match self.last {
            Some((last_arrived, last_release, last_target)) => {
                let moved = target.wrapping_sub(last_target) as i32;
                let shift = Duration::from_micros(u64::from(moved.unsigned_abs()));
                let last_release = if moved >= 0 {
                    last_release + shift
                } else {
                    last_release.checked_sub(shift).unwrap_or(last_release)
                };
                let gap = arrived.saturating_duration_since(last_arrived);
                let kept = gap.mul_f64(SPACING_KEPT);
                let kept = tx.map_or(kept, |tx| kept.min(tx));
                due.max(last_release + kept).min(latest.max(due))
            }
            None => due,
        };
        self.last = Some((arrived, at, target));
        at
    }
}

/// The equalisation target from the live links' base relative one-way delays: the smallest plus
/// the longest [`crate::sched::equalize_wait`] for any of them (the largest spread up to `max`;
/// a link somewhat slower than that is waited for up to the bound, a much slower one not at
/// all: its packets arrive late and wait in the reorder buffer as usual). Also returns how much
/// the target adds to the smallest. `None` with fewer than two links or equalisation off.
fn target(bases: &[u32], max: Duration) -> Option<(u32, Duration)> {
    let max_add = max.as_micros().min(i32::MAX as u128) as i64;
    let &first = bases.first()?;
    if max_add == 0 || bases.len() < 2 {
        return None;
    }
    let rel: Vec<i64> = bases
        .iter()
        .map(|&o| o.wrapping_sub(first) as i32 as i64)
        .collect();
    let lo = rel.iter().copied().min().unwrap_or(0);
    // The same wait as the sender's placement computes (`sched::equalize_want`).
    let spreads = rel.iter().map(|&r| Duration::from_micros((r - lo) as u64));
    let (_, wait) = crate::sched::equalize_want(spreads, max)?;
    // At most `max` (clamped to i32 microseconds above).
    let add = (wait.as_micros() as i64).min(max_add);
    Some((
        first.wrapping_add((lo + add) as u32),
        Duration::from_micros(add as u64),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn an_idle_bundle_takes_the_full_hold_at_once() {
        let t0 = Instant::now();
        let mut r = Ramp::receiver();
        assert_eq!(r.allowed(t0, ms(50), ms(20)), ms(50));
        // Traffic long ago: idle again.
        r.on_traffic(t0);
        assert_eq!(r.allowed(t0 + ms(100), ms(0), ms(20)), ms(0));
        assert_eq!(r.allowed(t0 + IDLE, ms(50), ms(20)), ms(50));
    }

    #[test]
    fn a_rise_under_traffic_comes_in_steps_of_the_round_trip() {
        let t0 = Instant::now();
        let mut r = Ramp::receiver();
        assert_eq!(r.allowed(t0, ms(0), ms(20)), ms(0));
        r.on_traffic(t0);
        // A 60 ms link joins a 10 ms one (20 ms round trip): 50 ms wanted. The round trip
        // may grow 1.6 x: 20 -> 32 ms, a 12 ms hold (and the slack above it).
        let t = t0 + ms(500);
        r.on_traffic(t);
        assert_eq!(r.allowed(t, ms(50), ms(20)), ms(12));
        // Not again before a step's time, traffic or not.
        let t = t + STEP_EVERY - ms(1);
        r.on_traffic(t);
        assert_eq!(r.allowed(t, ms(50), ms(20)), ms(12));
        // Then from the 10 ms under the slack: 30 -> 48 ms, a 28 ms hold; then the 50 wanted.
        let t = t + ms(1);
        assert_eq!(r.allowed(t, ms(50), ms(20)), ms(28));
        let t = t + STEP_EVERY;
        r.on_traffic(t);
        assert_eq!(r.allowed(t, ms(50), ms(20)), ms(50));
    }

    #[test]
    fn a_fall_applies_at_once_and_small_rises_are_not_held_back() {
        let t0 = Instant::now();
        let mut r = Ramp::receiver();
        assert_eq!(r.allowed(t0, ms(50), ms(20)), ms(50));
        r.on_traffic(t0);
        // The slow link goes: no hold.
        assert_eq!(r.allowed(t0 + ms(10), ms(0), ms(20)), ms(0));
        // It comes back under traffic: a step at once (the flows' minimum is the new 20 ms).
        r.on_traffic(t0 + ms(20));
        assert_eq!(r.allowed(t0 + ms(20), ms(50), ms(20)), ms(12));
        // Small rises do not add up: at most SLACK over the step's hold until the next step.
        let t = t0 + ms(30);
        r.on_traffic(t);
        assert_eq!(r.allowed(t, ms(11), ms(20)), ms(11));
        assert_eq!(r.allowed(t + ms(1), ms(20), ms(20)), ms(12));
        // A hold that wobbles by a little is followed whole, down and up.
        assert_eq!(r.allowed(t + ms(2), ms(9), ms(20)), ms(9));
        assert_eq!(r.allowed(t + ms(3), ms(11), ms(20)), ms(11));
        assert_eq!(r.allowed(t + ms(4), ms(10), ms(20)), ms(10));
    }

    #[test]
    fn a_hold_the_flows_had_from_their_start_is_taken_at_once() {
        let t0 = Instant::now();
        let mut r = Ramp::sender();
        assert_eq!(r.began(), None);
        // Told so while idle: no effect beyond the next call.
        r.take_next();
        assert_eq!(r.allowed(t0, ms(0), ms(40)), ms(0));
        r.on_traffic(t0);
        assert_eq!(r.allowed(t0, ms(100), ms(40)), ms(24));
        assert_eq!(r.allowed(t0, ms(0), ms(40)), ms(0));
        r.on_traffic(t0 + ms(300));
        assert_eq!(r.began(), Some(t0));
        assert_eq!(r.allowed(t0 + ms(300), ms(0), ms(40)), ms(0));
        // Told so, the next call takes the whole hold under traffic, once.
        r.take_next();
        assert_eq!(r.allowed(t0 + ms(400), ms(100), ms(40)), ms(100));
        assert_eq!(r.allowed(t0 + ms(500), ms(0), ms(40)), ms(0));
        r.on_traffic(t0 + ms(500));
        assert_eq!(r.allowed(t0 + ms(600), ms(100), ms(40)), ms(24));
        // Traffic after an idle spell begins afresh.
        let t = t0 + ms(500) + IDLE;
        r.on_traffic(t);
        assert_eq!(r.began(), Some(t));
    }

    #[test]
    fn the_hold_releases_each_link_s_packets_when_the_slowest_would_have_brought_them() {
        let t0 = Instant::now();
        // A packet's release by the hold alone (a fresh spacing: the link's first held packet).
        let alone = |h: &Hold, now, arrived, local_ts, send_ts| {
            h.release_at(
                now,
                arrived,
                local_ts,
                send_ts,
                &mut Spacing::default(),
                None,
            )
        };
        let mut h = Hold::new(ms(100));
        // Nothing measured: released at once.
        assert_eq!(alone(&h, t0, t0, 0, Some(0)), t0);
        // A 10 ms and a 70 ms link (base relative delays in microseconds, any offset): the
        // idle bundle takes the whole 60 ms at once.
        let fast = 5_000_000u32;
        let slow = fast.wrapping_add(60_000);
        h.update(t0, &[fast, slow], ms(20));
        assert_eq!((h.add(), h.wanted()), (ms(60), ms(60)));
        // A packet sent at ts 1000 over the fast link, read 2 ms after it arrived: held until
        // the slow link would have brought it, from its arrival.
        let ts = 1_000u32;
        let arrived = t0 + ms(10);
        let now = arrived + ms(2);
        assert_eq!(
            alone(&h, now, arrived, ts.wrapping_add(fast), Some(ts)),
            arrived + ms(60)
        );
        // Over the slow link: due already.
        assert_eq!(
            alone(&h, now, arrived, ts.wrapping_add(slow), Some(ts)),
            now
        );
        // Untimed: at once.
        assert_eq!(alone(&h, now, arrived, ts.wrapping_add(fast), None), now);
        // A link beyond the bound is waited for up to the bound at most, and a lone link or a
        // zero bound holds nothing.
        let far = fast.wrapping_add(110_000);
        h.update(t0, &[fast, far], ms(20));
        assert!(h.add() <= ms(100), "{:?}", h.add());
        h.update(t0, &[fast], ms(20));
        assert_eq!((h.add(), h.wanted()), (ms(0), ms(0)));
        let mut off = Hold::new(ms(0));
        off.update(t0, &[fast, slow], ms(20));
        assert_eq!(off.add(), ms(0));
        // A target forgotten (a new session's clock) holds nothing until the next update.
        h.update(t0, &[fast, slow], ms(20));
        h.forget_target();
        assert_eq!((h.add(), h.wanted()), (ms(0), ms(0)));
        assert_eq!(
            alone(&h, now, arrived, ts.wrapping_add(fast), Some(ts)),
            now
        );
    }

    #[test]
    fn a_link_s_burst_leaves_the_hold_nearly_as_far_apart_as_it_came() {
        let t0 = Instant::now();
        let mut h = Hold::new(ms(300));
        // A 20 ms and a 300 ms link: the fast link's packets are held 280 ms.
        let fast = 7_000_000u32;
        h.update(t0, &[fast, fast.wrapping_add(280_000)], ms(40));
        assert_eq!(h.add(), ms(280));
        let mut spacing = Spacing::default();
        // Five packets sent at once (ts 0) cross the fast link 8 ms apart (its rate): the later
        // ones queued 8-32 ms behind the first. Each is due at send + target alike, but leaves
        // 7 ms after the one before (7/8 of the 8 it came after it).
        let released: Vec<Instant> = (0..5u32)
            .map(|k| {
                let arrived = t0 + ms(20 + 8 * u64::from(k));
                let local = fast.wrapping_add(k * 8000);
                h.release_at(arrived, arrived, local, Some(0), &mut spacing, None)
            })
            .collect();
        let due = t0 + ms(300);
        assert_eq!(
            released,
            (0..5).map(|k| due + ms(7 * k)).collect::<Vec<_>>()
        );
        // A fresh spacing (another link) lets the same packet go when due.
        let arrived = t0 + ms(52);
        let alone = h.release_at(
            arrived,
            arrived,
            fast.wrapping_add(32_000),
            Some(0),
            &mut Spacing::default(),
            None,
        );
        assert_eq!(alone, due);
    }

    #[test]
    fn spacing_adds_what_the_queue_grew_and_gives_it_back() {
        let t0 = Instant::now();
        let mut s = Spacing::default();
        let latest = t0 + ms(1000);
        assert_eq!(s.release(t0, t0 + ms(100), latest, 0, None), t0 + ms(100));
        // Came 8 ms later but due only 1 ms later (its queue grew by 7 ms): 7 ms later.
        assert_eq!(
            s.release(t0 + ms(8), t0 + ms(101), latest, 0, None),
            t0 + ms(107)
        );
        // Came 8 ms after that and due 8 ms after its release (the queue shrank): when due.
        assert_eq!(
            s.release(t0 + ms(16), t0 + ms(115), latest, 0, None),
            t0 + ms(115)
        );
        // The target 50 ms shorter (a slow link lost): the wait goes at once.
        assert_eq!(
            s.release(
                t0 + ms(24),
                t0 + ms(73),
                latest,
                50_000u32.wrapping_neg(),
                None
            ),
            t0 + ms(73)
        );
        // A link 40 ms slower for good: the delay shows, then is given back within eight times
        // its length.
        let mut s = Spacing::default();
        let mut t = t0;
        let mut extra = Vec::new();
        for k in 0..40u64 {
            let late = if k == 0 { ms(0) } else { ms(40) };
            let due = t + ms(100) - late;
            let at = s.release(t, due, t + ms(1000), 0, None);
            extra.push(at - due);
            t += ms(10);
        }
        assert_eq!(extra[1], ms(40) - ms(10).mul_f64(1.0 / 8.0));
        assert!(extra[33..].iter().all(|e| e.is_zero()), "{extra:?}");
        // A gap longer than the packet's time on the link is jitter, not the link's pace: only
        // that time is kept (1 ms here), and a packet that came 20 ms late leaves when due.
        let mut s = Spacing::default();
        s.release(t0, t0 + ms(100), latest, 0, Some(ms(1)));
        assert_eq!(
            s.release(t0 + ms(20), t0 + ms(102), latest, 0, Some(ms(1))),
            t0 + ms(102)
        );
        let mut whole = Spacing::default();
        whole.release(t0, t0 + ms(100), latest, 0, None);
        assert_eq!(
            whole.release(t0 + ms(20), t0 + ms(102), latest, 0, None),
            t0 + ms(117) + ms(1) / 2
        );
        // Never beyond the latest the caller allows, nor before due.
        let mut s = Spacing::default();
        s.release(t0, t0 + ms(990), latest, 0, None);
        assert_eq!(
            s.release(t0 + ms(50), t0 + ms(900), latest, 0, None),
            latest
        );
        assert_eq!(
            s.release(t0 + ms(60), t0 + ms(1100), latest, 0, None),
            t0 + ms(1100)
        );
    }

    #[test]
    fn the_sender_steps_after_the_receiver() {
        let t0 = Instant::now();
        let (mut rx, mut tx) = (Ramp::receiver(), Ramp::sender());
        for r in [&mut rx, &mut tx] {
            r.allowed(t0, ms(0), ms(20));
            r.on_traffic(t0);
            assert_eq!(r.allowed(t0, ms(50), ms(20)), ms(12));
        }
        let t = t0 + STEP_EVERY;
        for r in [&mut rx, &mut tx] {
            r.on_traffic(t);
        }
        assert!(rx.allowed(t, ms(50), ms(20)) > tx.allowed(t, ms(50), ms(20)));
        let t = t + SENDER_LAG;
        assert_eq!(rx.allowed(t, ms(50), ms(20)), tx.allowed(t, ms(50), ms(20)));
    }
}
