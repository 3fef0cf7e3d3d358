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
//!   drop), one per inner round trip: a CUBIC flow backs off once per round trip whatever it
//!   loses, so more drops would only cost retransmissions (the simulator's 1+2+3 Mbit/s failover,
//!   CUBIC download: 299 inner retransmissions dropping every late packet, 40 one per round
//!   trip). A packet that waited a round trip beyond the limit is dropped in any case: traffic
//!   that never backs off meets a hard bound;
//! - while some link's capacity is still being learned (`Scheduler::learning`) nothing is
//!   dropped for waiting: the bundle is full by the scheduler's ignorance, not the path's
//!   limit, and a drop then would end the inner flow's slow start at the learned rates, after
//!   which the bundle is rarely full and the links' held rates, which climb by probes in full
//!   adjustments only, stay low (simulator, LTE mix, CUBIC upload: 37-65% against 79-89%).
//!   A packet that waited [`QUEUE_MAX_DELAY`] goes even then;
//! - at most [`BUNDLE_QUEUE_PACKETS`] packets wait: a packet beyond that pushes the oldest out,
//!   so the memory is bounded whatever a local sender does.
//!
//! Why not leave the excess in the TUN device, as the first back-pressure did: the kernel's TUN
//! ring has no clock and drops only at its tail once full (`txqueuelen`, 2000 packets, each up
//! to a 64 KB super-packet). A CUBIC flow that never lost a packet filled it: pings through a
//! 6 Mbit/s bundle grew from 285 to 475 ms in four seconds, 878 ms after a link failed, and the
//! flow's longest stall after the failure was 650-930 ms instead of about 200 (BENCHMARKS.md §4,
//! "Back-pressure: the TUN ring filled").

use std::collections::VecDeque;
use std::time::{Duration, Instant};

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
/// The most packets the bundle's queue holds (about 100 ms at 1 Gbit/s of full-size packets;
/// 16 MB of buffers at most).
pub const BUNDLE_QUEUE_PACKETS: usize = 8192;

/// Packets waiting for room on the links, each with the instant it came.
#[derive(Debug)]
pub struct BundleQueue {
    /// Back-pressure is on: packets may wait here.
    pub on: bool,
    packets: VecDeque<(Instant, Vec<u8>)>,
    /// The longest a packet waits (see [`QUEUE_ROUND_TRIPS`]).
    max_delay: Duration,
    /// The inner flows' round trip: one drop per round trip is signal enough.
    rtt: Duration,
    /// No drop for waiting before then.
    next_drop: Option<Instant>,
    /// When the links are predicted to take the head packet (set while it waits).
    pub resume: Option<Instant>,
    /// Packets that waited here (not those sent on at once).
    pub queued: u64,
}

impl Default for BundleQueue {
    fn default() -> Self {
        BundleQueue {
            on: false,
            packets: VecDeque::new(),
            max_delay: QUEUE_MIN_DELAY,
            rtt: QUEUE_MIN_DELAY,
            next_drop: None,
            resume: None,
            queued: 0,
        }
    }
}

impl BundleQueue {
    /// The inner flows' round trip through the bundle (`None`: not measured).
    pub fn set_round_trip(&mut self, rtt: Option<Duration>) {
        self.rtt = rtt.unwrap_or(QUEUE_MIN_DELAY);
        self.max_delay = rtt
            .map_or(QUEUE_MIN_DELAY, |r| r * QUEUE_ROUND_TRIPS)
            .clamp(QUEUE_MIN_DELAY, QUEUE_MAX_DELAY);
    }

    /// How long a packet may wait now.
    pub fn max_delay(&self) -> Duration {
        self.max_delay
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
    pub fn pop_stale(&mut self, now: Instant) -> Option<Vec<u8>> {
        let &(came, _) = self.packets.front()?;
        let waited = now.saturating_duration_since(came);
        // One drop per round trip tells a loss-based sender (it backs off once per round trip
        // anyway); traffic that does not back off meets the hard bound, a round trip later.
        if waited <= self.max_delay
            || (self.next_drop.is_some_and(|t| now < t) && waited <= self.max_delay + self.rtt)
        {
            return None;
        }
        self.next_drop = Some(now + self.rtt);
        self.packets.pop_front().map(|(_, p)| p)
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

    /// The head packet, to send.
    pub fn pop(&mut self) -> Option<Vec<u8>> {
        self.packets.pop_front().map(|(_, p)| p)
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
        assert_eq!(q.pop(), Some(vec![2]));
        assert!(q.is_empty());
        assert_eq!(q.queued, 2);
    }

    #[test]
    fn one_drop_per_round_trip_then_all_a_round_trip_beyond_the_limit() {
        let t0 = Instant::now();
        let mut q = BundleQueue::default();
        q.set_round_trip(Some(Duration::from_millis(20))); // limit 60 ms
        assert_eq!(q.max_delay(), Duration::from_millis(60));
        for i in 0..10 {
            q.push(t0 + Duration::from_millis(5 * i), vec![i as u8]);
        }
        let at = |ms| t0 + Duration::from_millis(ms);
        assert_eq!(q.pop_stale(at(70)), Some(vec![0]), "waited 70 ms");
        assert!(q.pop_stale(at(70)).is_none(), "one per round trip");
        assert!(
            q.pop_stale(at(75)).is_none(),
            "packet 1 waited 70 ms, 5 after the drop"
        );
        assert_eq!(
            q.pop_stale(at(90)),
            Some(vec![1]),
            "a round trip after the drop"
        );
        assert!(q.pop_stale(at(90)).is_none(), "packet 2 waited 80 ms");
        // A round trip beyond the limit (80 ms), whatever the pace.
        assert_eq!(q.pop_stale(at(100)), Some(vec![2]));
        assert_eq!(q.pop_stale(at(100)), Some(vec![3]));
        assert!(
            q.pop_stale(at(100)).is_none(),
            "packet 4 waited 80 ms: paced again"
        );
        assert_eq!(q.len(), 6);
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
        assert_eq!(q.pop(), Some(1u32.to_be_bytes().to_vec()));
    }
}
