//! The bundle's one queue, under back-pressure (`backpressure = true`, docs/scheduling.md
//! "Back-pressure").
//!
//! While every link is full (`Scheduler::ready_in`), the endpoint keeps the bulk packets it is
//! given (those delay equalisation holds: `endpoint::equalized`) here instead of overfilling the
//! links' own buffers, and hands them on, oldest first, as the links take them. Pings, DNS and
//! pure TCP ACKs pass at once, as fq_codel lets sparse flows pass. The inner flows then see one
//! bottleneck at the bundle's rate with one bounded buffer in front of it, as if the bundle were
//! one link:
//!
//! - a packet that has waited longer than the limit ([`QUEUE_ROUND_TRIPS`] inner round trips)
//!   is dropped at the head (a loss-based sender learns of it a queue sooner than from a tail
//!   drop), one per inner round trip of the packets' arrivals: a CUBIC flow backs off once per
//!   round trip whatever it loses, so more drops would only cost retransmissions (the
//!   simulator's 1+2+3 Mbit/s failover, CUBIC download: 299 inner retransmissions dropping
//!   every late packet, 40 one per round trip), and a packet that came within a round trip of
//!   the last drop left its sender before it could hear of it. A packet that waited a round
//!   trip beyond the limit it came under is dropped in any case: traffic that never backs off
//!   meets a hard bound;
//! - a packet whose sender said it reacts to ECN (ECT(0) or ECT(1), RFC 3168) is *marked*
//!   Congestion Experienced once it waited half the limit, one mark per round trip: well
//!   before the limit's drop. A mark costs the flow nothing
//!   but the backing off it asks for: no hole, so no stall while a retransmission crosses the
//!   queue, and no segment sent again (RFC 7567 asks an AQM to mark rather than drop;
//!   fq_codel and CAKE do). The drops stay as they were, marked packet or not: a sender that
//!   ignores marks (Linux's BBR v1 does, even with ECN negotiated) meets the same limit as
//!   before;
//! - while some link's capacity is still being learned (`Scheduler::learning`) nothing is
//!   dropped for waiting: the bundle is full by the scheduler's ignorance, not the path's
//!   limit, and a drop then would end the inner flow's slow start at the learned rates, after
//!   which the bundle is rarely full and the links' held rates, which climb by probes in full
//!   adjustments only, stay low (simulator, LTE mix, CUBIC upload: 37-65% against 79-89%).
//!   A packet that waited [`QUEUE_MAX_DELAY`] goes even then;
//! - at most [`BUNDLE_QUEUE_PACKETS`] packets wait: a packet beyond that pushes the oldest out,
//!   so the memory is bounded whatever a local sender does;
//! - a queue that *stands* gets a limit of one round trip instead of three ([`Standing`]):
//!   a paced, rate-based sender (BBR) drains what it queued every eight of its round trips, a
//!   loss-based one (CUBIC) keeps the queue full until it loses. Three round trips are what
//!   BBR needs; under CUBIC they are only delay, and every loss then stalls the flow for the
//!   whole queue (its retransmission joins the tail, and must: a retransmission that passes the
//!   queue makes Linux's RACK take everything queued before it for lost, wip/README.md);
//! - after a link is lost, every sender overshoots the capacity left for a while, and a BBR
//!   flow's window lets it queue more than three round trips: the queue makes room for that
//!   overshoot for ten of its rounds ([`Roomy`]), unless it was found standing lately, and
//!   from then until every lost link is back its limit is at least a round trip plus
//!   [`STANDING_ALLOWANCE`] (`BundleQueue::normal_limit`). What was sent into the room meets
//!   the room's hard bound until its senders can have heard of the room's end
//!   (`BundleQueue::hard_limit`): it drains one drop per round trip, not all at once.
//!
//! Why not leave the excess in the TUN device, as the first back-pressure did: the kernel's TUN
//! ring has no clock and drops only at its tail once full (`txqueuelen`, 2000 packets, each up
//! to a 64 KB super-packet). A CUBIC flow that never lost a packet filled it: pings through a
//! 6 Mbit/s bundle grew from 285 to 475 ms in four seconds, 878 ms after a link failed, and the
//! flow's longest stall after the failure was 650-930 ms instead of about 200 (BENCHMARKS.md §4,
//! "Back-pressure: the TUN ring filled").

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::inner;

/// The longest a packet waits in the bundle's queue: [`QUEUE_ROUND_TRIPS`] of the inner flows'
/// round trip through the bundle, within these bounds. Below one round trip a BBR flow, whose
/// window is two of its measured bandwidth-delay products, loses packets at every turn
/// (lab, 50/20/7 Mbit/s equalised to a 160 ms round trip: 28000-39000 of 130000 segments with
/// 50-100 ms); at 250 ms it still lost 1500-2100 (its start-up) ...
pub const QUEUE_MIN_DELAY: Duration = Duration::from_millis(50);
/// ... and at most ...
pub const QUEUE_MAX_DELAY: Duration = Duration::from_secs(1);
/// ... round trips (two: the lossy mix's BBR download lost 859 segments, three: 87; lab). A
/// CUBIC flow, which keeps the queue full until a packet is lost, sees about this much delay
/// added (1+2+3 Mbit/s at 10 ms: 60 ms).
pub const QUEUE_ROUND_TRIPS: u32 = 3;
/// A queue stands when no packet left it (or passed it) sooner than its standing wait over
/// this many inner round trips: more than BBR's cycle of eight, in which it drains once.
pub const STANDING_ROUND_TRIPS: u32 = 10;
/// The standing wait: a round trip and a half, and at least a round trip plus this much. A BBR
/// sender that its window limits keeps at most a round trip queued (its window is two
/// bandwidth-delay products), plus what Linux allows it for ACK aggregation (at most 100 ms of
/// its rate, `bbr_extra_acked_max_us`); a CUBIC flow under three round trips keeps about two
/// even after it lost (it backs off to 0.7 of its window).
pub const STANDING_ALLOWANCE: Duration = Duration::from_millis(100);
/// How long after a link is lost a queue is not found standing, in the inner round trips
/// before the loss: BBR's bandwidth filter spans ten of its rounds, up to four round trips each
/// ([`Standing`]).
pub const STANDING_AFTER_LOSS_ROUND_TRIPS: u32 = 40;
/// After a link is lost, unless the queue was found standing within this many round trips
/// before (a loss-based sender's), the queue makes room for a rate-based sender's overshoot
/// ([`Roomy`]).
pub const ROOMY_UNLESS_STOOD_ROUND_TRIPS: u32 = 100;
/// The room lasts this many of the senders' rounds after the loss, each its round trip plus
/// the room: BBR's bandwidth filter, which holds the old rate that long.
pub const ROOMY_SENDER_ROUNDS: u32 = 10;
/// The share of the bundle's capacity at or above which a lost link is taken to have carried
/// nothing: no overshoot follows.
pub const ROOMY_KEPT_ALL: f64 = 0.95;
/// The limit, in round trips, while the queue stands: CUBIC keeps 0.4 of one after a loss
/// (enough to keep the bundle full: it needs 0.43 of a bandwidth-delay product of buffer).
pub const STANDING_LIMIT_ROUND_TRIPS: u32 = 1;

/// An ECN-capable packet is marked once it waited this share of the limit. Half the standing
/// limit is still half a round trip of queue, more than the 0.43 of a bandwidth-delay product
/// a CUBIC flow needs to keep the bundle full after it backed off to 0.7 of its window; half
/// the normal limit leaves it a round trip and a half to answer in before the first drop. At
/// one round trip under the normal limit the simulator's CUBIC over 1+2 Mbit/s left of 1+2+3
/// (10 ms) backed off three times as often and carried 4% less (`sim_tcp`).
pub const ECN_MARK_SHARE: u32 = 2;

/// The most packets the bundle's queue holds (about 100 ms at 1 Gbit/s of full-size packets;
/// 16 MB of buffers at most).
pub const BUNDLE_QUEUE_PACKETS: usize = 8192;

/// Packets waiting for room on the links, each with the instant it came.
#[derive(Debug, Default)]
pub struct BundleQueue {
    /// Back-pressure is on: packets may wait here.
    pub on: bool,
    packets: VecDeque<(Instant, Vec<u8>)>,
    /// The inner flows' round trip (`None`: not measured): one drop per round trip is signal
    /// enough; the limit is counted in them.
    rtt: Option<Duration>,
    /// Whether the queue stands, judged over windows of round trips.
    pub standing: Standing,
    /// Only a packet that came at or after then is dropped for waiting below the hard bound:
    /// a round trip after the last drop, when its sender can have heard of it
    /// ([`Self::pop_stale`]).
    next_drop: Option<Instant>,
    /// No Congestion Experienced mark before then.
    next_mark: Option<Instant>,
    /// The room made after a link was lost (`None`: none).
    roomy: Option<Roomy>,
    /// When the links are predicted to take the head packet (set while it waits).
    pub resume: Option<Instant>,
    /// Packets that waited here (not those sent on at once).
    pub queued: u64,
    /// Packets marked Congestion Experienced here.
    pub marked: u64,
    /// The least wait of a bulk packet that left the queue or passed it since the last
    /// [`Self::take_least_wait`] (`None`: none did): the window clamp follows it
    /// (`rwnd::WindowClamp::follow`).
    least_wait: Option<Duration>,
}

impl BundleQueue {
    /// The inner flows' round trip through the bundle (`None`: not measured).
    pub fn set_round_trip(&mut self, rtt: Option<Duration>) {
        self.rtt = rtt;
    }

    /// The inner round trip as the queue counts it: measured, or [`QUEUE_MIN_DELAY`].
    fn round_trip(&self) -> Duration {
        self.rtt.unwrap_or(QUEUE_MIN_DELAY)
    }

    /// How long a packet may wait at `now`: [`QUEUE_ROUND_TRIPS`] round trips, one while the
    /// queue stands, more for a while after a link is lost ([`Roomy`]), within
    /// [`QUEUE_MIN_DELAY`] and [`QUEUE_MAX_DELAY`].
    pub fn max_delay(&self, now: Instant) -> Duration {
        if self.standing.on {
            return self.limit(STANDING_LIMIT_ROUND_TRIPS);
        }
        let limit = self.normal_limit();
        match self.roomy {
            Some(r) if now < r.until => r.limit.max(limit),
            _ => limit,
        }
    }

    /// [`QUEUE_ROUND_TRIPS`] round trips; after a link is lost, from the room made for the
    /// overshoot ([`Roomy`]) until every lost link is back, at least one plus
    /// [`STANDING_ALLOWANCE`]. A BBR flow that its window limits keeps up to a round trip queued
    /// and what Linux allows it for ACK aggregation, at most 100 ms of its rate, which three
    /// round trips under 50 ms do not hold, and a failure's bursts (the copies, the holes they
    /// fill) raise that allowance: on the links left the queue dropped such a flow's packets one
    /// per round trip for seconds after the room (lab, 1+2 Mbit/s left of 1+2+3 at 10 ms, a 24
    /// ms round trip: its window 28 packets, 83 ms of queue against a 72 ms limit, 24-67 drops
    /// a run, stalls of 100-130 ms each; with the floor 0-2). Not before a loss: a loss-based
    /// sender fills the limit, and the window it grows there is what overshoots when a link
    /// is lost (with the floor always, CUBIC's queue stood at 270 ms right after the failure
    /// and its stalls there reached 354-378 ms in five runs of twelve; in the simulator, 371
    /// ms median against 150).
    fn normal_limit(&self) -> Duration {
        let floor = self
            .rtt
            .filter(|_| self.roomy.is_some())
            .map_or(Duration::ZERO, |r| {
                (r + STANDING_ALLOWANCE).min(QUEUE_MAX_DELAY)
            });
        self.limit(QUEUE_ROUND_TRIPS).max(floor)
    }

    /// `rounds` inner round trips, within [`QUEUE_MIN_DELAY`] and [`QUEUE_MAX_DELAY`].
    fn limit(&self, rounds: u32) -> Duration {
        self.rtt
            .map_or(QUEUE_MIN_DELAY, |r| r * rounds)
            .clamp(QUEUE_MIN_DELAY, QUEUE_MAX_DELAY)
    }

    /// The bundle lost a link at `now`, the links left carrying the share `kept` of what the
    /// bundle carried: its senders overshoot for a while. The queue is not found standing
    /// meanwhile ([`Standing`]), and unless a loss-based sender stood in it lately it makes
    /// room for a rate-based one's overshoot ([`Roomy`]).
    pub fn link_lost(&mut self, now: Instant, kept: f64) {
        let rtt = self.round_trip();
        let mut until = now + rtt * STANDING_AFTER_LOSS_ROUND_TRIPS;
        let stood_lately = self.standing.found_at.is_some_and(|t| {
            now.saturating_duration_since(t) < rtt * ROOMY_UNLESS_STOOD_ROUND_TRIPS
        });
        if !stood_lately && kept < ROOMY_KEPT_ALL {
            let room = Roomy::after(now, rtt, kept);
            // A loss within another's room keeps the larger.
            let room = match self.roomy {
                Some(r) if now < r.until && r.limit > room.limit => Roomy {
                    until: room.until.max(r.until),
                    ..r
                },
                _ => room,
            };
            // What was queued in the room drains only once its senders heard of the first
            // drop after it, a round trip and the room's wait later: the standing count
            // starts afresh from then.
            until = until.max(room.drained_from(rtt));
            self.roomy = Some(room);
        }
        self.standing.not_before = Some(self.standing.not_before.map_or(until, |t| t.max(until)));
    }

    /// Every link lost is back: no more room for an overshoot ([`Roomy`]).
    pub fn links_back(&mut self) {
        self.roomy = None;
    }

    /// A bulk packet went on at `now` without waiting here (the links had room).
    pub fn passed(&mut self, now: Instant) {
        let rtt = self.round_trip();
        self.standing.left(now, Duration::ZERO, rtt);
        self.least_wait = Some(Duration::ZERO);
    }

    /// The least wait of a bulk packet that left the queue or passed it since the last call
    /// (`None`: none did), and starts counting afresh.
    pub fn take_least_wait(&mut self) -> Option<Duration> {
        self.least_wait.take()
    }

    pub fn is_empty(&self) -> bool {
        self.packets.is_empty()
    }

    pub fn len(&self) -> usize {
        self.packets.len()
    }

    /// Adds `packet`, come at `now`; gives back the oldest one if the queue was full.
    pub fn push(&mut self, now: Instant, packet: Vec<u8>) -> Option<Vec<u8>> {
        let pushed_out = (self.packets.len() >= BUNDLE_QUEUE_PACKETS)
            .then(|| self.packets.pop_front().map(|(_, p)| p))
            .flatten();
        self.packets.push_back((now, packet));
        self.queued += 1;
        pushed_out
    }

    /// The head packet if it has waited longer than [`Self::max_delay`] at `now` (to drop).
    /// An ECN-capable head that waited half that is marked Congestion Experienced first, and
    /// stays ([`ECN_MARK_SHARE`]).
    ///
    /// One drop per round trip, counted in the packets' own time: after a drop, only a packet
    /// that came a round trip later, when its sender can have heard of the drop, is dropped
    /// for waiting. Those that came before left their sender before it could back off: a
    /// loss-based sender backs off once for all of them, so dropping them would tell it
    /// nothing more, and one of them may be the retransmission that fills the first hole,
    /// which then costs another round trip and a queue (lab, 1+2+3 Mbit/s losing its 3
    /// Mbit/s link: a CUBIC flow's queue at 165 ms when the room after the loss ended, one
    /// drop per round trip of the moment dropped 14 packets in 400 ms where the flow answered
    /// the first about 200 ms later, each a hole of its own, a stall of 337 ms; with this
    /// rule no stall over 285 ms in sixteen runs). Traffic that does not back off meets the hard
    /// bound, a round trip past the limit it came under (`BundleQueue::hard_limit`).
    pub fn pop_stale(&mut self, now: Instant) -> Option<Vec<u8>> {
        let (limit, rtt) = (self.max_delay(now), self.round_trip());
        let &(came, _) = self.packets.front()?;
        let waited = now.saturating_duration_since(came);
        // The hard bound is never under the limit: under it nothing is dropped.
        if waited > limit
            && (waited > self.hard_limit(came, limit) + rtt
                || self.next_drop.is_none_or(|t| came >= t))
        {
            self.next_drop = Some(now + rtt);
            return self.packets.pop_front().map(|(_, p)| p);
        }
        let mark_at = limit / ECN_MARK_SHARE;
        if waited > mark_at && self.next_mark.is_none_or(|t| now >= t) {
            let head = &mut self.packets.front_mut()?.1;
            if matches!(inner::ecn(head), Some(1 | 2)) && inner::mark_ce(head) {
                self.next_mark = Some(now + rtt);
                self.marked += 1;
            }
        }
        None
    }

    /// The limit a packet that came at `came` is held to, `limit` holding now: the room's, for
    /// one sent into the room after a lost link, up to when its senders can have heard of the
    /// room's end ([`Roomy::drained_from`]). When the room ends, what a sender queued in it is
    /// over the normal limit's hard bound at once: dropped there, it went all together (lab,
    /// the same CUBIC flow: 13-25 packets at once, their retransmissions 84-100 ms on the wire
    /// behind the rest of the queue, stalls of 313-364 ms); it goes one drop per round trip of
    /// arrivals instead. A queue found standing is cut to its limit's hard bound at once, as
    /// meant ([`Standing`]).
    fn hard_limit(&self, came: Instant, limit: Duration) -> Duration {
        match self.roomy {
            Some(r) if !self.standing.on && came < r.drained_from(self.round_trip()) => {
                r.limit.max(limit)
            }
            _ => limit,
        }
    }

    /// The head packet if it has waited longer than [`QUEUE_MAX_DELAY`] at `now` (to drop): the
    /// bound that holds even while the links' capacity is being learned, when
    /// [`Self::pop_stale`] is not asked. A packet that late is of no use to any sender, and a
    /// scheduler that never ends its learning must not let the queue grow to
    /// [`BUNDLE_QUEUE_PACKETS`] (at 10 Mbit/s, ten seconds of full-size packets).
    pub fn pop_expired(&mut self, now: Instant) -> Option<Vec<u8>> {
        let &(came, _) = self.packets.front()?;
        (now.saturating_duration_since(came) > QUEUE_MAX_DELAY)
            .then(|| self.packets.pop_front().map(|(_, p)| p))
            .flatten()
    }

    /// The head packet, to send at `now`.
    pub fn pop(&mut self, now: Instant) -> Option<Vec<u8>> {
        let (came, p) = self.packets.pop_front()?;
        let rtt = self.round_trip();
        let waited = now.saturating_duration_since(came);
        self.standing.left(now, waited, rtt);
        self.least_wait = Some(self.least_wait.map_or(waited, |w| w.min(waited)));
        Some(p)
    }

    /// The head packet, to drop (the bundle has no session to send it on).
    pub fn discard(&mut self) -> Option<Vec<u8>> {
        self.packets.pop_front().map(|(_, p)| p)
    }
}

/// The room the queue makes after a link is lost, for a rate-based sender's overshoot. BBR's
/// bandwidth filter holds the old rate for ten of its rounds ([`ROOMY_SENDER_ROUNDS`]), and
/// its window lets it keep two of its old bandwidth-delay products in flight plus what Linux
/// allows it for ACK aggregation (at most 100 ms of its rate, [`STANDING_ALLOWANCE`]) and for
/// its pacing's quantum (three bursts of two segments at these rates, `bbr_quantization_budget`):
/// at the share `kept` of the old rate that is up to `(2 x RTT + 100 ms) / kept` of queue and a
/// few packets more. The room is a round trip more, `(3 x RTT + 100 ms) / kept`: any drop in
/// it stalls the flow for the whole queue (the retransmission waits behind it), and a room cut
/// to the window's measure did (lab, 1+2+3 Mbit/s at 10 ms, the 3 Mbit/s link lost: BBR's
/// window 80 packets, its queue 74 of them, 296 ms, against a room of 297 ms; one drop, a stall
/// of 318 ms). Three round
/// trips hold far less (lab, 1+2+3 Mbit/s at 10 ms, the 3 Mbit/s link lost: 44 packets, 176
/// ms, queued against a 66 ms limit, 112-213 of BBR's packets dropped a run, 2.2-3.0%
/// retransmitted, stalls of 150-380 ms). A loss-based sender meets the same limit, one drop
/// per round trip beyond it: CUBIC's window too was sized for the old rate. But a queue found
/// standing lately (a CUBIC flow's) keeps the limit it has: with more room after the loss such
/// a flow's recovery stalled 1075 ms against 431 (20/120 ms mix).
#[derive(Debug, Clone, Copy)]
pub struct Roomy {
    /// The limit meanwhile.
    limit: Duration,
    /// Until then.
    until: Instant,
}

impl Roomy {
    /// When what was queued in the room can drain, the inner round trip `rtt`: its senders
    /// hear of the first drop after the room a round trip and the room's wait after it ends,
    /// and what they sent before then was sent as into the room.
    fn drained_from(&self, rtt: Duration) -> Instant {
        self.until + self.limit + rtt
    }

    /// The room after a loss at `now`, the inner round trip `rtt`, the capacity's share `kept`.
    fn after(now: Instant, rtt: Duration, kept: f64) -> Self {
        let kept = kept.clamp(0.1, 1.0);
        let limit = (rtt * QUEUE_ROUND_TRIPS + STANDING_ALLOWANCE)
            .div_f64(kept)
            .min(QUEUE_MAX_DELAY);
        Roomy {
            limit,
            until: now + (rtt + limit) * ROOMY_SENDER_ROUNDS,
        }
    }
}

/// CoDel's standing-queue test at the scale of round trips, to tell a loss-based sender's
/// queue: the queue stands once no bulk packet left it (or passed it) within its standing wait
/// for [`STANDING_ROUND_TRIPS`] inner round trips; it has drained as soon as one left within a
/// quarter of a round trip. The two thresholds apart keep a CUBIC flow, which keeps about 0.4 of
/// a round trip under a one-round-trip limit, from flipping back at once; a BBR flow's drain
/// ends the state as soon as it comes. When the queue is found standing, what waited more than
/// a round trip past the new limit goes at once: one loss event for a CUBIC flow, which backs
/// off once for it (lab, 20/120 ms mix: about 100 packets, a stall of 420 ms; a failure of the
/// 20 ms link then stalls the flow 84-122 ms in five runs of six, 617 in the sixth, against
/// 1.1-1.2 s without the rule).
///
/// After the bundle lost a link, every sender overshoots for a while, whatever its kind: a BBR
/// flow keeps the rate its bandwidth filter holds for ten of its rounds, each up to four round
/// trips long while the queue holds three, so its queue stands too. Judged standing then, the
/// queue dropped 400 of its packets at once (its longest stall 240 -> 540 ms); so for
/// [`STANDING_AFTER_LOSS_ROUND_TRIPS`] after a link is lost (and for the room, [`Roomy`]) the
/// test does not find a queue standing, and its count of ten round trips starts where that
/// pause ends.
#[derive(Debug, Default)]
pub struct Standing {
    /// The queue stands now (its limit is [`STANDING_LIMIT_ROUND_TRIPS`]).
    pub on: bool,
    /// Times it was found standing.
    pub found: u64,
    /// The last time a packet left within the standing wait (`None`: none left yet).
    short_at: Option<Instant>,
    /// Not found standing before then (a link was lost).
    not_before: Option<Instant>,
    /// When it was last found standing.
    found_at: Option<Instant>,
}

impl Standing {
    /// A packet left the queue (or passed it) at `now` after `waited`; `rtt` the inner round
    /// trip.
    fn left(&mut self, now: Instant, waited: Duration, rtt: Duration) {
        let short_at = *self.short_at.get_or_insert(now);
        // The count starts afresh where the pause after a loss ends: the senders' overshoot
        // is no sign of a standing queue, and counted, it had the queue found standing the
        // moment the room ended and cut at once (lab, 1+2+3 Mbit/s losing the 3 Mbit/s link,
        // CUBIC: 21-25 packets, stalls of 313-324 ms).
        let short_at = self.not_before.map_or(short_at, |t| short_at.max(t));
        if waited < rtt / 4 {
            self.on = false;
        }
        if waited <= Self::wait(rtt) {
            self.short_at = Some(now);
        } else if !self.on
            && self.not_before.is_none_or(|t| now >= t)
            && now.saturating_duration_since(short_at) >= rtt * STANDING_ROUND_TRIPS
        {
            self.on = true;
            self.found += 1;
            self.found_at = Some(now);
        }
    }

    /// The least wait above which a queue stands.
    fn wait(rtt: Duration) -> Duration {
        (rtt * 3 / 2).max(rtt + STANDING_ALLOWANCE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packet_older_than_the_hard_bound_expires_whatever_the_round_trip() {
        let t0 = Instant::now();
        let mut q = BundleQueue::default();
        q.set_round_trip(Some(Duration::from_millis(500))); // limit 1 s
        assert!(q.push(t0, vec![1]).is_none());
        assert!(q.push(t0 + Duration::from_millis(10), vec![2]).is_none());
        assert!(
            q.pop_expired(t0 + QUEUE_MAX_DELAY).is_none(),
            "not older yet"
        );
        let late = t0 + QUEUE_MAX_DELAY + Duration::from_millis(1);
        assert_eq!(q.pop_expired(late), Some(vec![1]));
        assert!(q.pop_expired(late).is_none(), "the second came 10 ms later");
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn packets_leave_in_order_and_stale_ones_from_the_head() {
        let t0 = Instant::now();
        let mut q = BundleQueue::default();
        assert!(q.push(t0, vec![1]).is_none());
        assert!(q.push(t0 + Duration::from_millis(60), vec![2]).is_none());
        assert!(q.pop_stale(t0 + QUEUE_MIN_DELAY).is_none(), "not older yet");
        let late = t0 + QUEUE_MIN_DELAY + Duration::from_millis(1);
        assert_eq!(q.pop_stale(late), Some(vec![1]));
        assert!(q.pop_stale(late).is_none(), "the second came 60 ms later");
        assert_eq!(q.pop(late), Some(vec![2]));
        assert!(q.is_empty());
        assert_eq!(q.queued, 2);
    }

    /// The least wait of what left or passed since the last look; dropped packets do not count.
    #[test]
    fn the_least_wait_is_what_left_soonest_since_the_last_look() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut q = BundleQueue::default();
        assert_eq!(q.take_least_wait(), None);
        q.push(t0, vec![1]);
        q.push(t0 + ms(10), vec![2]);
        q.push(t0 + ms(20), vec![3]);
        assert_eq!(q.pop_stale(t0 + ms(51)), Some(vec![1]), "dropped");
        assert_eq!(q.take_least_wait(), None);
        q.pop(t0 + ms(52));
        q.pop(t0 + ms(60));
        assert_eq!(q.take_least_wait(), Some(ms(40)));
        assert_eq!(q.take_least_wait(), None, "counted afresh");
        q.passed(t0 + ms(70));
        assert_eq!(q.take_least_wait(), Some(Duration::ZERO));
    }

    /// A 40-byte IPv4 packet with the ECN field `ecn` and packet number `n` (in the ID).
    fn v4(ecn: u8, n: u8) -> Vec<u8> {
        let mut p = vec![0u8; 40];
        p[0] = 0x45;
        p[1] = ecn;
        p[5] = n;
        let c = inner::ipv4_checksum(&p[..20]);
        p[10..12].copy_from_slice(&c.to_be_bytes());
        p
    }

    #[test]
    fn an_ecn_capable_packet_is_marked_a_round_trip_in_and_dropped_only_at_the_limit() {
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let mut q = BundleQueue::default();
        q.set_round_trip(Some(ms(20))); // limit 60 ms, marks from 30
        for i in 0..4 {
            assert!(q.push(t0 + ms(i), v4(0x02, i as u8)).is_none());
        }
        assert!(q.pop_stale(t0 + ms(30)).is_none());
        assert_eq!(q.marked, 0, "not half the limit yet");
        assert!(q.pop_stale(t0 + ms(31)).is_none(), "marked, not dropped");
        assert_eq!((q.marked, q.len()), (1, 4));
        assert!(q.pop_stale(t0 + ms(45)).is_none());
        assert_eq!(q.marked, 1, "one mark per round trip");
        // The marked head goes on as it is; the next is marked a round trip after the first.
        let head = q.pop(t0 + ms(45)).expect("head");
        assert_eq!((inner::ecn(&head), head[5]), (Some(3), 0));
        assert_eq!(inner::ipv4_checksum(&head[..20]), 0, "checksum mended");
        assert!(q.pop_stale(t0 + ms(50)).is_none());
        assert_eq!(q.marked, 1);
        assert!(q.pop_stale(t0 + ms(51)).is_none());
        assert_eq!(q.marked, 2);
        // A sender that ignores the marks meets the limit's drop as before.
        assert!(
            q.pop_stale(t0 + ms(61)).is_none(),
            "60 ms: within the limit"
        );
        assert_eq!(q.pop_stale(t0 + ms(62)).map(|p| p[5]), Some(1));
        // A packet that is not ECN-capable is never marked.
        let mut q = BundleQueue::default();
        q.set_round_trip(Some(ms(20)));
        assert!(q.push(t0, v4(0x00, 9)).is_none());
        assert!(q.pop_stale(t0 + ms(59)).is_none());
        assert_eq!(q.marked, 0);
        assert_eq!(q.pop_stale(t0 + ms(61)).map(|p| p[5]), Some(9));
        // No round trip measured yet (counted as 50 ms, the limit 50 ms): marks at 25 ms.
        let mut q = BundleQueue::default();
        q.set_round_trip(None);
        assert!(q.push(t0, v4(0x01, 7)).is_none());
        assert!(q.pop_stale(t0 + ms(26)).is_none());
        assert_eq!(q.marked, 1);
    }

    #[test]
    fn one_drop_per_round_trip_of_arrivals_then_all_a_round_trip_beyond_the_limit() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut q = BundleQueue::default();
        q.set_round_trip(Some(Duration::from_millis(20))); // limit 60 ms, hard bound 80
        assert_eq!(q.max_delay(t0), Duration::from_millis(60));
        for (i, ms) in [0, 5, 89, 90, 95].into_iter().enumerate() {
            q.push(at(ms), vec![i as u8]);
        }
        assert_eq!(q.pop_stale(at(70)), Some(vec![0]), "waited 70 ms");
        assert!(q.pop_stale(at(70)).is_none(), "one per round trip");
        assert!(
            q.pop_stale(at(75)).is_none(),
            "packet 1 waited 70 ms, but left its sender before it could hear of the drop"
        );
        assert_eq!(q.pop(at(75)), Some(vec![1]));
        assert!(
            q.pop_stale(at(152)).is_none(),
            "packet 2 came 19 ms after the drop"
        );
        assert_eq!(q.pop(at(152)), Some(vec![2]));
        assert_eq!(
            q.pop_stale(at(152)),
            Some(vec![3]),
            "came a round trip after the drop, waited 62 ms"
        );
        assert!(
            q.pop_stale(at(175)).is_none(),
            "packet 4 waited 80 ms, came within a round trip of the last drop"
        );
        assert_eq!(
            q.pop_stale(at(176)),
            Some(vec![4]),
            "a round trip beyond the limit, whatever came when"
        );
        assert!(q.is_empty());
    }

    #[test]
    fn what_came_in_the_room_meets_the_rooms_hard_bound_after_it() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let ms = Duration::from_millis;
        let mut q = BundleQueue::default();
        q.set_round_trip(Some(ms(20)));
        q.link_lost(t0, 0.5); // a limit of 320 ms until 3400 ms, then 120
        for (i, ms) in [3300, 3301, 3650, 3745].into_iter().enumerate() {
            q.push(at(ms), vec![i as u8]);
        }
        assert_eq!(q.max_delay(at(3450)), ms(120));
        assert_eq!(q.pop_stale(at(3450)), Some(vec![0]), "over the limit now");
        assert!(
            q.pop_stale(at(3450)).is_none(),
            "149 ms, past the normal limit's hard bound, but queued under the room's"
        );
        assert!(q.pop_stale(at(3641)).is_none());
        assert_eq!(q.pop_stale(at(3642)), Some(vec![1]), "past 340 ms");
        assert!(
            q.pop_stale(at(3800)).is_none(),
            "sent before its sender could hear of the room's end (3740 ms): the room's bound"
        );
        assert_eq!(q.pop(at(3800)), Some(vec![2]));
        assert!(q.pop_stale(at(3865)).is_none());
        assert_eq!(
            q.pop_stale(at(3866)),
            Some(vec![3]),
            "came after: the normal limit"
        );
    }

    #[test]
    fn a_lost_link_makes_room_for_the_overshoot_unless_a_queue_stood_lately() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut q = BundleQueue::default();
        q.set_round_trip(Some(Duration::from_millis(20)));
        let ms = Duration::from_millis;
        assert_eq!(q.max_delay(t0), ms(60));
        // A link that carried nothing: no overshoot to make room for.
        q.link_lost(t0, 1.0);
        assert_eq!(q.max_delay(t0), ms(60));
        // Half the capacity lost: (3 x 20 + 100) / 0.5 ms for ten rounds of 20 + 320 ms, then
        // a round trip and 100 ms until the link is back.
        q.link_lost(t0, 0.5);
        assert_eq!(q.max_delay(at(3399)), ms(320));
        assert_eq!(q.max_delay(at(3400)), ms(120));
        // The link is back: no more room.
        q.link_lost(at(4000), 0.5);
        assert_eq!(q.max_delay(at(4000)), ms(320));
        q.links_back();
        assert_eq!(q.max_delay(at(4000)), ms(60));
        // A queue that stood (a CUBIC flow's, once the pause after the loss is over) keeps its
        // limit after a loss...
        leave(&mut q, t0, (8000, 8300, 10), 130);
        assert!(q.standing.on);
        q.link_lost(at(8300), 0.5);
        assert_eq!(q.max_delay(at(8300)), QUEUE_MIN_DELAY, "one round trip");
        // ...and, drained, its three round trips while it stood within a hundred.
        q.passed(at(8310));
        assert_eq!(q.max_delay(at(8310)), ms(60));
        // A hundred round trips after it stood, a lost link makes room again.
        q.link_lost(at(10300), 0.5);
        assert_eq!(q.max_delay(at(10300)), ms(320));
    }

    #[test]
    fn a_full_queue_pushes_its_oldest_packet_out() {
        let t0 = Instant::now();
        let mut q = BundleQueue::default();
        for i in 0..BUNDLE_QUEUE_PACKETS {
            assert!(q.push(t0, (i as u32).to_be_bytes().to_vec()).is_none());
        }
        assert_eq!(q.push(t0, vec![9]), Some(0u32.to_be_bytes().to_vec()));
        assert_eq!(q.len(), BUNDLE_QUEUE_PACKETS);
        assert_eq!(q.pop(t0), Some(1u32.to_be_bytes().to_vec()));
    }

    /// Packets leave every `every` ms from `from` to `to` ms after `t0`, each after `wait` ms.
    fn leave(q: &mut BundleQueue, t0: Instant, (from, to, every): (u64, u64, u64), wait: u64) {
        for ms in (from..to).step_by(every as usize) {
            let now = t0 + Duration::from_millis(ms);
            q.push(now - Duration::from_millis(wait), vec![0]);
            assert!(q.pop(now).is_some());
        }
    }

    #[test]
    fn a_queue_that_never_drains_stands_and_gets_a_shorter_limit() {
        let t0 = Instant::now();
        let mut q = BundleQueue::default();
        q.set_round_trip(Some(Duration::from_millis(100))); // window 1 s, standing wait 200 ms
        assert_eq!(q.max_delay(t0), Duration::from_millis(300));
        // A CUBIC flow's queue: never within 200 ms for ten round trips.
        leave(&mut q, t0, (0, 10, 10), 150);
        leave(&mut q, t0, (10, 1000, 10), 210);
        assert!(!q.standing.on, "990 ms");
        leave(&mut q, t0, (1000, 1010, 10), 210);
        assert!(q.standing.on);
        assert_eq!(q.standing.found, 1);
        assert_eq!(q.max_delay(t0), Duration::from_millis(100));
        // Under the one-round-trip limit it keeps 40 ms: still standing.
        leave(&mut q, t0, (1010, 2030, 10), 40);
        assert!(q.standing.on, "40 ms is not drained");
        // It drains: back to three round trips.
        q.passed(t0 + Duration::from_millis(2050));
        assert!(!q.standing.on, "a packet passed the queue");
        assert_eq!(q.max_delay(t0), Duration::from_millis(300));
        assert_eq!(q.standing.found, 1);
    }

    #[test]
    fn a_queue_that_drains_once_a_cycle_does_not_stand() {
        let t0 = Instant::now();
        let mut q = BundleQueue::default();
        q.set_round_trip(Some(Duration::from_millis(100)));
        // BBR's cycle of eight round trips: 250 ms of queue but once under 20 ms in each.
        for cycle in 0..5 {
            let start = cycle * 800;
            leave(&mut q, t0, (start, start + 700, 10), 250);
            leave(&mut q, t0, (start + 700, start + 800, 10), 20);
        }
        assert!(!q.standing.on);
        assert_eq!(q.standing.found, 0);
        // And a window-limited BBR's round trip plus 100 ms of ACK aggregation does not either.
        leave(&mut q, t0, (4000, 8000, 10), 195);
        assert_eq!(q.standing.found, 0);
        // After a link is lost, a queue that stands for forty round trips is left alone, and
        // found standing only ten round trips after that.
        q.link_lost(t0 + Duration::from_millis(8000), 1.0);
        leave(&mut q, t0, (8000, 12990, 10), 400);
        assert_eq!(q.standing.found, 0);
        leave(&mut q, t0, (12990, 13010, 10), 400);
        assert_eq!(q.standing.found, 1, "but not longer");
    }
}
