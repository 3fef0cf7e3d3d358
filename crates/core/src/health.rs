//! Link health: keepalive probes, RTT (RFC 6298), loss, delivery rate, one-way-delay signals and the
//! UP / DEGRADED / DOWN state machine with hysteresis.
//!
//! One `LinkHealth` per link per endpoint. It watches both directions of its link:
//! - as a sender: probes it sends, acks it gets back (RTT, and the peer's report of what arrived:
//!   loss, delivery rate, queueing delay, one-way-delay offset);
//! - as a receiver: sealed packets that arrive on the link (liveness, per-link counters and one-way
//!   delay samples that go into the acks this endpoint sends).
//!
//! The model, briefly:
//! - **RTT**: `now - probe send time - hold_us` of the echoed probe; RFC 6298 smoothing (alpha 1/8,
//!   beta 1/4, first sample `srtt = R`, `rttvar = R/2`), plus a windowed minimum (10 s, Kathleen
//!   Nichols' three-sample filter as in Linux `lib/minmax.c`).
//! - **Loss**: each ack carries the peer's running counters for this link (`rx_packets`, highest
//!   `rx_link_seq_max`). Between two acks, `expected = d(seq_max)` and `received = d(packets)`, so
//!   the interval's loss is `1 - received/expected`; it is smoothed by a time-based EWMA (time
//!   constant [`LOSS_TAU`]). Counters wrap (u32); a report that goes backwards or jumps absurdly is
//!   taken as a new baseline instead of a sample.
//! - **Delivery rate**: `d(rx_bytes) * 8 / d(ack.common.ts)` (the peer's own clock, so the path's
//!   jitter does not distort it), over intervals of at least [`RATE_MIN_INTERVAL`], smoothed with
//!   time constant [`RATE_TAU`].
//! - **Liveness**: a new link is DOWN; `rise` consecutive answered probes bring it UP; an UP or
//!   DEGRADED link with no ack for `max(down_after, srtt + 4*rttvar + probe_interval)` is DOWN.
//!   A probe counts as unanswered when a later probe is answered first (links are FIFO), when its
//!   slot in the ring of outstanding probes is reused, or when it is older than that timeout (at
//!   least [`PROBE_EXPIRY`]);
//!   an unanswered probe resets the "consecutive answered" count.
//! - **Receiver side**: per-link counters and the relative one-way delay
//!   `rel = local_ts - sender_ts` (wrapping; includes the unknown clock offset shared by every link
//!   of the peer), smoothed (gain 1/8). The 30 s windowed minimum ([`OWD_WINDOW`]) of the
//!   *smoothed* value is the link's base, and the smoothed value minus the base is the queueing
//!   delay reported back in acks. The minimum of the raw samples would be the fastest packet of
//!   a jittery link (LTE: 30 +- 20 ms gives 10 ms), so the jitter itself would read as a
//!   standing queue of about 20 ms, the sender would back the link off to a fraction of its
//!   capacity, and delay equalisation would wait for a delay the link's packets almost never
//!   have (simulator, LTE 30 Mbit/s 30 +- 20 ms + DSL 10 Mbit/s: 40-60% of the sum -> 80-92%).

use std::time::{Duration, Instant};

use crate::wire::{Common, ProbeAckRepr};

/// Window of the minimum RTT filter (a link queued all along keeps its minimum longer:
/// [`SENT_QUIET_QDELAY`]).
pub const MIN_WINDOW: Duration = Duration::from_secs(10);
/// Window of the base one-way delay filter. Longer than [`MIN_WINDOW`]: a loss-based inner TCP
/// keeps a standing queue on every link for as long as it runs, so no packet sees the empty
/// path; once the window forgets the last empty-queue sample the queue is taken for base delay
/// (the queueing delay reported to the peer drops to zero, the equalisation target jumps), which
/// made a dip every 10 s in long transfers. LEDBAT (RFC 6817) keeps minutes of base history for
/// the same reason. The cost is clock drift: the two ends' clocks drifting apart by `d` ppm reads
/// as up to `d * 30 s` of queue (3 ms at 100 ppm), common to every link. A busy link keeps its
/// base longer ([`OWD_KEEP_MAX`]): 30 s alone only moved the dip to 30-50 s into a transfer.
pub const OWD_WINDOW: Duration = Duration::from_secs(30);
/// A gap this long between two arrivals on a link means its queue was empty (a FIFO served at
/// its rate brings what it holds back to back; 20 ms is a full-size packet's time at 0.6
/// Mbit/s) ...
pub const QUIET_GAP: Duration = Duration::from_millis(20);
/// ... and one that comes less than this after the minimum was seen is the gap before the load
/// that followed it (the first packet of a transfer after an idle link), not a later one ...
pub const QUIET_SETTLE: Duration = Duration::from_secs(1);
/// ... and a link that had no later quiet gap was busy all along since its minimum: its base
/// one-way delay is not let rise when the window forgets that minimum, for at most this long.
/// Under a loss-based inner TCP braid keeps its planned queue on the fast links without a
/// break, and once the window forgot the empty links of the session's start the fastest
/// link's base took in its 67 ms of standing queue: the hold, the slowest link's delay above
/// the fastest's, fell from 139 to 72 ms at once, the 150 ms link's packets came 70 ms after
/// it, and the flow stalled for seconds (lab, 50/20/7 Mbit/s at 10/60/150 ms, CUBIC, 46-49 s
/// into a 60 s run: 85% of the sum against 89% over 20 s). A base that really rose while the
/// link stayed busy (a longer route) reads as queue meanwhile; this bounds how long, and is
/// long because a rise taken under a standing queue costs the flow seconds each time. Clock
/// drift reads as queue on a busy link for as long (up to `d * 300 s`, 15 ms at 50 ppm, against
/// `d * 30 s` otherwise): the scheduler then backs the link off a little, it falls quiet now
/// and then, and the base follows. A brief gap that the smoothed delay hardly follows still
/// lets the rise through.
pub const OWD_KEEP_MAX: Duration = Duration::from_secs(300);
/// A queueing delay the peer reports on our packets below this: our way of the link was
/// empty. A link whose peer reported none since its minimum RTT was seen (and 1 s more,
/// [`QUIET_SETTLE`]) has been queued all along, and that minimum is kept when the window
/// forgets it, as the base one-way delay is ([`OWD_KEEP_MAX`]). Under a loss-based flow the
/// placement keeps a queue on the faster links without a break, so after 10 s the minimum RTT
/// took it in: lab, 20 Mbit/s at 10 ms beside 20 Mbit/s at 40 ms losing 1.5%, CUBIC download,
/// the 10 ms link's minimum rose from 20 to about 65 ms at 10.2 s, the inner round trip the
/// bundle counts on from 50 to 95 ms, so its queue's limit from 150 to 286 ms and the window
/// clamp from 905 kB to 2.26 MB at once; the flow grew into them and the standing queue's cut
/// dropped 137 packets at once (stalls of 300-400 ms, 0.13-0.35% of the segments sent again;
/// kept: 72 ms, none).
pub const SENT_QUIET_QDELAY: Duration = Duration::from_millis(2);
/// Time constant of the loss EWMA.
pub const LOSS_TAU: Duration = Duration::from_secs(1);
/// Time constant of the delivery-rate EWMA.
pub const RATE_TAU: Duration = Duration::from_millis(100);
/// Shortest interval (peer clock) over which one delivery-rate sample is taken.
pub const RATE_MIN_INTERVAL: Duration = Duration::from_millis(50);
/// Longest interval (peer clock) still taken as one delivery-rate sample; longer gaps (the link
/// was idle, down, or the report is absurd) restart the measurement.
pub const RATE_MAX_INTERVAL: Duration = Duration::from_secs(5);
/// Outstanding probes remembered (id -> send instant).
pub const PROBE_RING: usize = 64;
/// A probe unanswered for `max(this, dead_after)` is given up (so that links with an RTT of
/// seconds still get their first RTT sample before their probes are given up).
pub const PROBE_EXPIRY: Duration = Duration::from_secs(3);
/// Weight of a new relative one-way-delay sample in the receiver's smoothed value.
const REL_OWD_GAIN: f64 = 1.0 / 8.0;
/// Samples averaged before the base one-way delay's minimum starts for good. Few: the first
/// packets of a link (handshake, probes) cross it before any data queues there, and a minimum
/// restarted later would take that queue for base delay for a whole window; more than one, so
/// that one early packet of a jittery link does not stand as its base. (The simulator figure
/// once quoted for it, 10/20/50 Mbit/s CUBIC upload 92.8% of the sum with 3 against 69.7% with
/// 8, was one lucky run: over six start offsets both give 69.6-69.9%, and the other cells'
/// medians move by up to 5 points either way; BENCHMARKS.md §4, "The simulator is chaotic".)
const REL_OWD_WARMUP: u32 = 3;
/// [`LinkHealth::reported_qdelay`]: a silence this long starts the link's arrivals afresh ...
const ARRIVALS_RESTART: Duration = Duration::from_secs(1);
/// ... and for this long after, a report gives the smoothed queue even after a shorter
/// silence: a flow's slow start sends bursts with gaps longer than their queue, and reading 0
/// then let one link's start-up outgrow a faster one's (simulator, 10/20/50 Mbit/s CUBIC
/// upload: 70 -> 62.5% of the sum).
const ARRIVALS_SETTLED: Duration = Duration::from_secs(2);
/// Per-report sanity bound: more than this many packets between two acks is not believed.
const MAX_REPORT_PACKETS: u32 = 1 << 30;
/// Per-report sanity bound on received bytes between two acks.
const MAX_REPORT_BYTES: u64 = 1 << 40;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkState {
    Up,
    Degraded,
    Down,
}

#[derive(Debug, Clone)]
pub struct HealthConfig {
    /// Probe every this often, idle or busy. Default 100 ms.
    pub probe_interval: Duration,
    /// A link is DOWN once no ack has come back for
    /// `max(down_after, srtt + 4 * rttvar + probe_interval)`. Default 500 ms.
    pub down_after: Duration,
    /// Consecutive answered probes that bring a DOWN link back UP. Default 3.
    pub rise: u32,
    /// Loss (0..1) at or above which an UP link becomes DEGRADED. Default 0.10.
    pub degraded_loss: f64,
    /// Loss at or below which a DEGRADED link is UP again. Default 0.03.
    pub recovered_loss: f64,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            probe_interval: Duration::from_millis(100),
            down_after: Duration::from_millis(500),
            rise: 3,
            degraded_loss: 0.10,
            recovered_loss: 0.03,
        }
    }
}

/// Whether a busy link's base one-way delay may rise ([`QUIET_GAP`], [`OWD_KEEP_MAX`]).
#[derive(Debug, Clone, Copy, Default)]
struct BusyBase {
    /// The last arrival after a [`QUIET_GAP`]: the link's queue was empty then.
    quiet_at: Option<Instant>,
    /// Since when a rise of the base has been refused.
    kept_since: Option<Instant>,
}

impl BusyBase {
    /// An arrival at `now`, `gap` after the one before.
    fn arrival(&mut self, now: Instant, gap: Duration) {
        if gap >= QUIET_GAP {
            self.quiet(now);
        }
    }

    /// The link's queue was empty at `now`.
    fn quiet(&mut self, now: Instant) {
        self.quiet_at = Some(now);
        self.kept_since = None;
    }

    /// The window moved from `before` (the minimum, seen at `seen`) to `m` at `now`: a rise is
    /// undone while the link has been busy since the minimum, for at most [`OWD_KEEP_MAX`].
    fn keep(&mut self, m: &mut WindowedMin, (before, seen): (i64, Instant), now: Instant) {
        if m.get() <= before {
            return;
        }
        let busy = self.quiet_at.is_none_or(|q| q < seen + QUIET_SETTLE);
        let since = *self.kept_since.get_or_insert(now);
        if busy && now.saturating_duration_since(since) < OWD_KEEP_MAX {
            *m = WindowedMin::new(now, before);
        } else {
            self.kept_since = None;
        }
    }
}

/// Windowed minimum over (time, value) samples: the three-sample filter of Linux `lib/minmax.c`.
#[derive(Debug, Clone, Copy)]
struct WindowedMin {
    s: [(Instant, i64); 3],
}

impl WindowedMin {
    fn new(now: Instant, v: i64) -> Self {
        WindowedMin { s: [(now, v); 3] }
    }
    fn get(&self) -> i64 {
        self.s[0].1
    }
    /// When the minimum was seen.
    fn at(&self) -> Instant {
        self.s[0].0
    }
    fn update(&mut self, win: Duration, now: Instant, v: i64) {
        let val = (now, v);
        if v <= self.s[0].1 || now.saturating_duration_since(self.s[2].0) > win {
            *self = WindowedMin::new(now, v);
            return;
        }
        if v <= self.s[1].1 {
            self.s[1] = val;
            self.s[2] = val;
        } else if v <= self.s[2].1 {
            self.s[2] = val;
        }
        let dt = now.saturating_duration_since(self.s[0].0);
        if dt > win {
            self.s[0] = self.s[1];
            self.s[1] = self.s[2];
            self.s[2] = val;
            if now.saturating_duration_since(self.s[0].0) > win {
                self.s[0] = self.s[1];
                self.s[1] = self.s[2];
                self.s[2] = val;
            }
        } else if self.s[1].0 == self.s[0].0 && dt > win / 4 {
            self.s[1] = val;
            self.s[2] = val;
        } else if self.s[2].0 == self.s[1].0 && dt > win / 2 {
            self.s[2] = val;
        }
    }
}

/// Packets counted by the peer's reports on a link since it was made (see
/// [`LinkHealth::loss_tally`]). All only grow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LossTally {
    /// Packets the reports expected (sequence numbers passed).
    pub expected: u64,
    /// Of those, packets that did not arrive.
    pub lost: u64,
    /// Packets the peer named lost at random, the link's own loss (LINK-NACK: it names none of
    /// a full queue's drops, `Endpoint::note_link_loss`).
    pub random: u64,
}

impl LossTally {
    /// The loss over the packets counted since `earlier`, if they are at least `min_packets`
    /// (`None` also when `earlier` is not earlier, e.g. another link's tally).
    pub fn loss_since(&self, earlier: LossTally, min_packets: u64) -> Option<f64> {
        let expected = self.expected.checked_sub(earlier.expected)?;
        let lost = self.lost.checked_sub(earlier.lost)?;
        (expected >= min_packets.max(1)).then(|| lost as f64 / expected as f64)
    }

    /// The share of the packets counted since `earlier` that the peer named lost at random, if
    /// they are at least `min_packets` (as [`Self::loss_since`]).
    pub fn random_loss_since(&self, earlier: LossTally, min_packets: u64) -> Option<f64> {
        let expected = self.expected.checked_sub(earlier.expected)?;
        let random = self.random.checked_sub(earlier.random)?;
        (expected >= min_packets.max(1)).then(|| random as f64 / expected as f64)
    }
}

/// The peer's counters from the previous ack (baseline of the next loss/rate sample).
#[derive(Debug, Clone, Copy)]
struct Report {
    at: Instant,
    rx_packets: u32,
    rx_seq_max: u32,
}

/// Start of the current delivery-rate measurement interval (peer clock).
#[derive(Debug, Clone, Copy)]
struct RateBase {
    ts: u32,
    bytes: u64,
}

pub struct LinkHealth {
    cfg: HealthConfig,
    state: LinkState,

    // --- probes and RTT ---
    next_probe: Instant,
    /// Outstanding probes: (id, send instant), indexed by `id % PROBE_RING`.
    probes: [Option<(u32, Instant)>; PROBE_RING],
    probes_sent: u64,
    probes_answered: u64,
    probes_unanswered: u64,
    consecutive: u32,
    /// Last ack of any kind (resets the DOWN clock).
    last_ack: Option<Instant>,
    srtt: Option<Duration>,
    rttvar: Duration,
    min_rtt: Option<WindowedMin>,

    // --- peer reports ---
    report: Option<Report>,
    loss: f64,
    /// Packets per second the loss estimate rests on (the reports' expected counts, smoothed
    /// with the same time constant).
    loss_pps: f64,
    /// Every packet the reports counted, lost or not, since the link was made (never reset).
    tally: LossTally,
    rate_base: Option<RateBase>,
    rate_bps: f64,
    qdelay: Duration,
    owd_offset: Duration,

    // --- our transmissions ---
    tx_packets: u64,
    tx_bytes: u64,
    tx_seq_max: Option<u32>,

    // --- receiver side ---
    rx_seq_max: Option<u32>,
    rx_packets: u32,
    rx_bytes: u64,
    last_rx: Option<Instant>,
    /// Last raw relative one-way delay and its unwrapped value (i64 microseconds).
    rel_last: Option<(u32, i64)>,
    rel_min: Option<WindowedMin>,
    rel_smooth: f64,
    /// How long the link was silent before the last timed packet, and since when packets have
    /// come without a silence of [`ARRIVALS_RESTART`].
    rx_gap: Duration,
    arrivals_since: Option<Instant>,
    busy_base: BusyBase,
    /// Whether the link's minimum RTT may rise: quiet when the peer reports our packets met
    /// no queue ([`SENT_QUIET_QDELAY`]).
    busy_rtt: BusyBase,
    /// When the base one-way delay was first known ([`Self::base_known_at`]).
    base_known_at: Option<Instant>,
    /// Samples in `rel_smooth` (saturating), for its warm-up.
    rel_samples: u32,
}

impl LinkHealth {
    /// A new link starts DOWN: it has to prove itself with `rise` answered probes.
    ///
    /// Out-of-range settings are clamped (probe interval 1 ms..1 h, down-after at most 1 h, rise
    /// at least 1, loss thresholds to 0..1 with `recovered <= degraded`), so that no setting can
    /// make the timers overflow.
    pub fn new(cfg: HealthConfig, now: Instant) -> Self {
        let hour = Duration::from_secs(3600);
        let degraded_loss = if cfg.degraded_loss.is_nan() {
            0.10
        } else {
            cfg.degraded_loss.clamp(0.0, 1.0)
        };
        let recovered_loss = if cfg.recovered_loss.is_nan() {
            0.03
        } else {
            cfg.recovered_loss.clamp(0.0, degraded_loss)
        };
        let cfg = HealthConfig {
            probe_interval: cfg.probe_interval.clamp(Duration::from_millis(1), hour),
            down_after: cfg.down_after.min(hour),
            rise: cfg.rise.max(1),
            degraded_loss,
            recovered_loss,
        };
        LinkHealth {
            cfg,
            state: LinkState::Down,
            next_probe: now,
            probes: [None; PROBE_RING],
            probes_sent: 0,
            probes_answered: 0,
            probes_unanswered: 0,
            consecutive: 0,
            last_ack: None,
            srtt: None,
            rttvar: Duration::ZERO,
            min_rtt: None,
            report: None,
            loss: 0.0,
            loss_pps: 0.0,
            tally: LossTally::default(),
            rate_base: None,
            rate_bps: 0.0,
            qdelay: Duration::ZERO,
            owd_offset: Duration::ZERO,
            tx_packets: 0,
            tx_bytes: 0,
            tx_seq_max: None,
            rx_seq_max: None,
            rx_packets: 0,
            rx_bytes: 0,
            last_rx: None,
            rel_last: None,
            rel_min: None,
            rel_smooth: 0.0,
            rx_gap: Duration::MAX,
            arrivals_since: None,
            busy_base: BusyBase::default(),
            busy_rtt: BusyBase::default(),
            base_known_at: None,
            rel_samples: 0,
        }
    }

    pub fn config(&self) -> &HealthConfig {
        &self.cfg
    }

    /// Time without any ack after which an UP/DEGRADED link is DOWN:
    /// `max(down_after, srtt + 4 * rttvar + probe_interval)`.
    pub fn dead_after(&self) -> Duration {
        let rto = match self.srtt {
            Some(srtt) => srtt + self.rttvar * 4 + self.cfg.probe_interval,
            None => Duration::ZERO,
        };
        rto.max(self.cfg.down_after)
    }

    // ----- sender side -----

    /// When this link's next probe is due.
    pub fn next_probe_at(&self) -> Instant {
        self.next_probe
    }
    /// Records a probe just sent (so its ack gives an RTT sample).
    pub fn on_probe_sent(&mut self, now: Instant, probe_id: u32) {
        self.expire_probes(now);
        let slot = &mut self.probes[probe_id as usize % PROBE_RING];
        if slot.is_some() {
            // Its ring slot is reused before an answer came: that probe is lost.
            self.probes_unanswered += 1;
            self.consecutive = 0;
        }
        *slot = Some((probe_id, now));
        self.probes_sent += 1;
        self.next_probe = now + self.cfg.probe_interval;
    }
    /// Records any sealed packet sent on this link (bytes = datagram length).
    pub fn on_packet_sent(&mut self, _now: Instant, link_seq: u32, bytes: usize) {
        self.tx_packets += 1;
        self.tx_bytes += bytes as u64;
        self.tx_seq_max = Some(match self.tx_seq_max {
            Some(m) if (link_seq.wrapping_sub(m) as i32) <= 0 => m,
            _ => link_seq,
        });
    }
    /// An ack for one of our probes: RTT sample (minus `hold_us`), and the peer's report.
    /// Returns the new state if it changed.
    pub fn on_probe_ack(&mut self, now: Instant, ack: &ProbeAckRepr) -> Option<LinkState> {
        self.on_probe_ack_at(now, now, ack)
    }
    /// [`on_probe_ack`](Self::on_probe_ack) for an ack that arrived at `arrived` (no later
    /// than `now`): the round trip ends there, not when the ack was read.
    pub fn on_probe_ack_at(
        &mut self,
        now: Instant,
        arrived: Instant,
        ack: &ProbeAckRepr,
    ) -> Option<LinkState> {
        self.last_ack = Some(now);
        let slot = ack.probe_id as usize % PROBE_RING;
        if let Some((id, sent)) = self.probes[slot] {
            if id == ack.probe_id {
                self.probes[slot] = None;
                self.probes_answered += 1;
                // Probes sent before this one and still unanswered were lost (a link is FIFO).
                let mut lost = 0;
                for p in self.probes.iter_mut() {
                    if matches!(p, Some((_, t)) if *t < sent) {
                        *p = None;
                        lost += 1;
                    }
                }
                if lost > 0 {
                    self.probes_unanswered += lost;
                    self.consecutive = 0;
                }
                self.consecutive = self.consecutive.saturating_add(1);
                let elapsed = arrived.min(now).saturating_duration_since(sent);
                let hold = Duration::from_micros(ack.hold_us as u64);
                if hold <= elapsed {
                    self.rtt_sample(now, elapsed - hold);
                }
            }
        }
        self.take_report(now, ack);

        let old = self.state;
        match self.state {
            LinkState::Down => {
                if self.consecutive >= self.cfg.rise {
                    self.state = LinkState::Up;
                }
            }
            LinkState::Up => {
                if self.loss >= self.cfg.degraded_loss {
                    self.state = LinkState::Degraded;
                }
            }
            LinkState::Degraded => {
                if self.loss <= self.cfg.recovered_loss {
                    self.state = LinkState::Up;
                }
            }
        }
        (self.state != old).then_some(self.state)
    }

    fn rtt_sample(&mut self, now: Instant, r: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(srtt) => {
                let diff = srtt.abs_diff(r);
                self.rttvar = (self.rttvar * 3 + diff) / 4;
                self.srtt = Some((srtt * 7 + r) / 8);
            }
        }
        let us = r.as_micros().min(i64::MAX as u128) as i64;
        match &mut self.min_rtt {
            Some(m) => {
                let before = (m.get(), m.at());
                m.update(MIN_WINDOW, now, us);
                self.busy_rtt.keep(m, before, now);
            }
            None => self.min_rtt = Some(WindowedMin::new(now, us)),
        }
    }

    /// Loss, delivery rate, qdelay and one-way-delay offset from the peer's report in an ack.
    fn take_report(&mut self, now: Instant, ack: &ProbeAckRepr) {
        self.qdelay = Duration::from_micros(ack.qdelay_us as u64);
        if self.qdelay < SENT_QUIET_QDELAY {
            self.busy_rtt.quiet(now);
        }
        self.owd_offset = Duration::from_micros(ack.owd_offset_us.max(0) as u64);

        // Loss.
        let cur = Report {
            at: now,
            rx_packets: ack.rx_packets,
            rx_seq_max: ack.rx_link_seq_max,
        };
        if let Some(prev) = self.report {
            let expected = cur.rx_seq_max.wrapping_sub(prev.rx_seq_max);
            let received = cur.rx_packets.wrapping_sub(prev.rx_packets);
            if expected as i32 >= 0 && received as i32 >= 0 && expected <= MAX_REPORT_PACKETS {
                let dt = now.saturating_duration_since(prev.at);
                let w = ewma_weight(dt, LOSS_TAU);
                if expected > 0 {
                    // Reordering can make `received` exceed `expected` for one interval.
                    self.tally.expected += u64::from(expected);
                    self.tally.lost += u64::from(expected - received.min(expected));
                    let sample = 1.0 - (received.min(expected) as f64 / expected as f64);
                    self.loss = (self.loss * (1.0 - w) + sample * w).clamp(0.0, 1.0);
                }
                if !dt.is_zero() {
                    let pps = expected as f64 / dt.as_secs_f64();
                    self.loss_pps = self.loss_pps * (1.0 - w) + pps * w;
                }
                self.report = Some(cur);
            } else {
                // Counters went backwards or jumped absurdly (peer restart, garbage): rebase.
                self.report = Some(cur);
            }
        } else {
            self.report = Some(cur);
        }

        // Delivery rate, over the peer's clock.
        match self.rate_base {
            None => {
                self.rate_base = Some(RateBase {
                    ts: ack.common.ts,
                    bytes: ack.rx_bytes,
                })
            }
            Some(base) => {
                let dt_us = ack.common.ts.wrapping_sub(base.ts) as i32;
                let dbytes = ack.rx_bytes.wrapping_sub(base.bytes);
                if dbytes > MAX_REPORT_BYTES {
                    // Garbage (or a peer restart): measure afresh from this report.
                    self.rate_base = Some(RateBase {
                        ts: ack.common.ts,
                        bytes: ack.rx_bytes,
                    });
                } else if dt_us < 0 {
                    // An ack older than the base (reordered): nothing to learn.
                } else {
                    let dt = Duration::from_micros(dt_us as u64);
                    if dt > RATE_MAX_INTERVAL {
                        self.rate_base = Some(RateBase {
                            ts: ack.common.ts,
                            bytes: ack.rx_bytes,
                        });
                    } else if dt >= RATE_MIN_INTERVAL {
                        let sample = dbytes as f64 * 8.0 / dt.as_secs_f64();
                        if self.rate_bps <= 0.0 {
                            self.rate_bps = sample;
                        } else {
                            let w = ewma_weight(dt, RATE_TAU);
                            self.rate_bps = self.rate_bps * (1.0 - w) + sample * w;
                        }
                        if !self.rate_bps.is_finite() || self.rate_bps < 0.0 {
                            self.rate_bps = 0.0;
                        }
                        self.rate_base = Some(RateBase {
                            ts: ack.common.ts,
                            bytes: ack.rx_bytes,
                        });
                    }
                }
            }
        }
    }

    /// Counts outstanding probes older than the dead-link timeout as unanswered.
    fn expire_probes(&mut self, now: Instant) {
        let limit = self.dead_after().max(PROBE_EXPIRY);
        let mut lost = 0;
        for p in self.probes.iter_mut() {
            if matches!(p, Some((_, t)) if now.saturating_duration_since(*t) > limit) {
                *p = None;
                lost += 1;
            }
        }
        if lost > 0 {
            self.probes_unanswered += lost;
            self.consecutive = 0;
        }
    }

    // ----- receiver side -----

    /// Any sealed, authenticated packet that arrived on this link. `local_ts` is this endpoint's
    /// own clock in the wire's units (microseconds, wrapping) at arrival.
    pub fn on_packet_received(
        &mut self,
        now: Instant,
        common: &Common,
        bytes: usize,
        local_ts: u32,
    ) {
        let prev = self.last_rx;
        self.on_untimed_packet_received(now, common.link_seq, bytes);
        self.rx_gap = prev.map_or(Duration::MAX, |p| now.saturating_duration_since(p));
        if self.rx_gap >= ARRIVALS_RESTART {
            self.arrivals_since = Some(now);
        }
        self.busy_base.arrival(now, self.rx_gap);

        let rel = local_ts.wrapping_sub(common.ts);
        let unwrapped = match self.rel_last {
            None => rel as i32 as i64,
            Some((last, last_unwrapped)) => last_unwrapped + rel.wrapping_sub(last) as i32 as i64,
        };
        self.rel_last = Some((rel, unwrapped));
        match &mut self.rel_min {
            None => {
                self.rel_min = Some(WindowedMin::new(now, unwrapped));
                self.rel_smooth = unwrapped as f64;
                self.rel_samples = 1;
            }
            Some(m) => {
                // The first samples are averaged (gain 1/n), and the minimum restarts once the
                // average holds REL_OWD_WARMUP of them: one early sample of a jittery link must
                // not stand as its base for a whole window.
                self.rel_samples = self.rel_samples.saturating_add(1);
                let gain = (1.0 / self.rel_samples as f64).max(REL_OWD_GAIN);
                self.rel_smooth += (unwrapped as f64 - self.rel_smooth) * gain;
                let smooth = self.rel_smooth.round() as i64;
                if self.rel_samples == REL_OWD_WARMUP {
                    *m = WindowedMin::new(now, smooth);
                } else {
                    let before = (m.get(), m.at());
                    m.update(OWD_WINDOW, now, smooth);
                    self.busy_base.keep(m, before, now);
                }
            }
        }
        if self.base_known_at.is_none() && self.rel_min.is_some() {
            self.base_known_at = Some(now);
        }
    }
    /// A packet arrived whose send time is not known (a DATA packet before the session's first
    /// full timestamp): counted for loss and rate, not for one-way delay.
    pub fn on_untimed_packet_received(&mut self, now: Instant, link_seq: u32, bytes: usize) {
        self.last_rx = Some(now);
        self.rx_packets = self.rx_packets.wrapping_add(1);
        self.rx_bytes = self.rx_bytes.wrapping_add(bytes as u64);
        self.rx_seq_max = Some(match self.rx_seq_max {
            Some(m) if (link_seq.wrapping_sub(m) as i32) <= 0 => m,
            _ => link_seq,
        });
    }
    /// Fills the receiver-report fields of an ack (`rx_link_seq_max`, `rx_packets`, `rx_bytes`,
    /// `qdelay_us`). `owd_offset_us` is left to the endpoint, which sees every link.
    pub fn fill_report(&self, now: Instant, ack: &mut ProbeAckRepr) {
        ack.rx_link_seq_max = self.rx_seq_max.unwrap_or(0);
        ack.rx_packets = self.rx_packets;
        ack.rx_bytes = self.rx_bytes;
        ack.qdelay_us = self.reported_qdelay(now).as_micros().min(u32::MAX as u128) as u32;
    }
    /// The queueing delay a report gives ([`fill_report`](Self::fill_report)): the smoothed one
    /// ([`rx_qdelay`](Self::rx_qdelay)), unless the link was silent before the last packet (the
    /// probe being answered, often) for longer than that queue: a queue that long would have
    /// brought packets back to back, so it drained, and the last packet's own wait is the queue
    /// now. The smoothed value moves only when packets arrive, so after a lull (BBR's ProbeRTT,
    /// a flow backing off) it still showed the queue from before it, beside a delivery rate
    /// that had fallen with the lull: the sender read a standing queue at a link delivering a
    /// tenth of its rate and cut its learned rate by a fifth, several times a second (lab, mixed
    /// scenario, BBR download: 8 -> 6.4 Mbit/s with 0.4 delivered and 30 ms "queued"), and a
    /// flow then sometimes slid for good (73.9% of the sum against 85-88%). (The last packet's
    /// wait taken whenever it was the lesser cost the simulator's CUBIC a third of its goodput
    /// on 10/20/50 Mbit/s: under load the smoothed value is the queue.)
    pub fn reported_qdelay(&self, now: Instant) -> Duration {
        let smoothed = self.rx_qdelay();
        let (Some((_, last)), Some(m)) = (self.rel_last, &self.rel_min) else {
            return smoothed;
        };
        let settled = self
            .arrivals_since
            .is_some_and(|t| now.saturating_duration_since(t) >= ARRIVALS_SETTLED);
        if !settled || self.rx_gap <= smoothed {
            return smoothed;
        }
        above_base(self.rel_smooth.min(last as f64), m)
    }
    /// Queueing delay seen by this receiver on this link: smoothed recent relative one-way delay
    /// minus its windowed minimum (what [`fill_report`](Self::fill_report) reports).
    pub fn rx_qdelay(&self) -> Duration {
        self.rel_min
            .as_ref()
            .map_or(Duration::ZERO, |m| above_base(self.rel_smooth, m))
    }
    /// Smoothed recent `local_ts - send_ts` (wrapping microseconds): the base one-way delay plus
    /// the current queueing delay plus the clock offset. The spread of this value over the links
    /// is how far apart packets sent at the same time arrive *now* (queues included), which is
    /// what the reorder hold time must cover; compare links with `wrapping_sub` as i32.
    pub fn recent_rel_owd(&self) -> Option<u32> {
        self.rel_min.map(|_| self.rel_smooth.round() as i64 as u32)
    }
    /// Windowed minimum of `local_ts - send_ts` (wrapping microseconds) over recent arrivals: the
    /// link's base one-way delay plus the (unknown, shared by all links) clock offset. Compare
    /// links with `wrapping_sub` as i32.
    pub fn base_rel_owd(&self) -> Option<u32> {
        self.rel_min.map(|m| m.get() as u32)
    }
    /// When [`base_rel_owd`](Self::base_rel_owd) was first known: the peer measures the other
    /// direction from our probes at about the same time.
    pub fn base_known_at(&self) -> Option<Instant> {
        self.base_known_at
    }

    // ----- timers -----

    /// Earliest instant at which `handle_timeout` has something to do (next probe or down deadline).
    pub fn poll_timeout(&self) -> Instant {
        match (self.state, self.last_ack) {
            (LinkState::Up | LinkState::Degraded, Some(t)) => {
                self.next_probe.min(t + self.dead_after())
            }
            _ => self.next_probe,
        }
    }
    /// Returns the new state if it changed (e.g. acks stopped: DOWN).
    pub fn handle_timeout(&mut self, now: Instant) -> Option<LinkState> {
        self.expire_probes(now);
        if self.state == LinkState::Down {
            return None;
        }
        let last = self.last_ack.unwrap_or(now);
        if now.saturating_duration_since(last) >= self.dead_after() {
            return self.force_down(now);
        }
        None
    }

    /// The link is known dead without waiting for the acks to stop (e.g. the kernel said its
    /// network is down). Returns the new state if it changed.
    pub fn force_down(&mut self, _now: Instant) -> Option<LinkState> {
        if self.state == LinkState::Down {
            return None;
        }
        self.state = LinkState::Down;
        self.consecutive = 0;
        // Measure loss and rate afresh once the link is back (what was lost while it was dark
        // says nothing about the link that comes back).
        self.report = None;
        self.rate_base = None;
        self.loss = 0.0;
        self.rate_bps = 0.0;
        Some(LinkState::Down)
    }

    // ----- readings -----

    pub fn state(&self) -> LinkState {
        self.state
    }
    pub fn srtt(&self) -> Option<Duration> {
        self.srtt
    }
    pub fn rttvar(&self) -> Option<Duration> {
        self.srtt.map(|_| self.rttvar)
    }
    /// Lowest RTT seen over a recent window (path delay without queueing).
    pub fn min_rtt(&self) -> Option<Duration> {
        self.min_rtt
            .map(|m| Duration::from_micros(m.get().max(0) as u64))
    }
    /// Recent loss fraction of our packets on this link, from the peer's reports (0..1).
    pub fn loss(&self) -> f64 {
        self.loss
    }
    /// Packets per second that [`loss`](Self::loss) rests on lately: with the probes alone
    /// (about ten a second) one lost packet moves the estimate by several points.
    pub fn loss_basis_pps(&self) -> f64 {
        self.loss_pps
    }
    /// Every packet of ours the peer's reports have counted on this link, and how many of them
    /// it did not receive, since the link was made: the difference of two tallies is the loss
    /// over exactly the packets between them (the scheduler's loss pull-back reads the loss
    /// since a queue cleared).
    pub fn loss_tally(&self) -> LossTally {
        self.tally
    }
    /// The peer named `count` of our packets on this link lost at random (a LINK-NACK).
    pub fn on_random_loss(&mut self, count: u16) {
        self.tally.random = self.tally.random.saturating_add(u64::from(count));
    }
    /// Recent rate at which our packets arrived at the peer on this link, bits per second
    /// (0 when unknown).
    pub fn delivery_rate_bps(&self) -> f64 {
        self.rate_bps
    }
    /// Queueing delay the peer last reported for this link.
    pub fn qdelay(&self) -> Duration {
        self.qdelay
    }
    /// This link's base one-way delay minus the peer's fastest link's, as the peer last reported.
    pub fn owd_offset(&self) -> Duration {
        self.owd_offset
    }
    /// When an authenticated packet last arrived on this link.
    pub fn last_rx(&self) -> Option<Instant> {
        self.last_rx
    }
    /// When the last probe ack arrived.
    pub fn last_ack(&self) -> Option<Instant> {
        self.last_ack
    }
    /// Probes sent / answered / given up on (never answered).
    pub fn probes_sent(&self) -> u64 {
        self.probes_sent
    }
    pub fn probes_answered(&self) -> u64 {
        self.probes_answered
    }
    pub fn probes_unanswered(&self) -> u64 {
        self.probes_unanswered
    }
    /// Sealed packets and bytes sent on this link (as recorded by `on_packet_sent`).
    pub fn tx_packets(&self) -> u64 {
        self.tx_packets
    }
    pub fn tx_bytes(&self) -> u64 {
        self.tx_bytes
    }
    /// Receiver side: sealed packets / bytes received on this link (wrapping, as reported).
    pub fn rx_packets(&self) -> u32 {
        self.rx_packets
    }
    pub fn rx_bytes(&self) -> u64 {
        self.rx_bytes
    }
}

/// How far a relative one-way delay `rel` (microseconds) lies above the link's base (its
/// windowed minimum): the queueing delay it carries, zero when at or below the base.
fn above_base(rel: f64, base: &WindowedMin) -> Duration {
    let q = rel - base.get() as f64;
    if q.is_finite() && q > 0.0 {
        Duration::from_micros(q.min(u32::MAX as f64) as u64)
    } else {
        Duration::ZERO
    }
}

/// Weight of a sample covering `dt` in an EWMA of time constant `tau`.
fn ewma_weight(dt: Duration, tau: Duration) -> f64 {
    let x = dt.as_secs_f64() / tau.as_secs_f64().max(1e-9);
    (1.0 - (-x).exp()).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// The peer as seen through its acks: counters of what arrived from us on this link.
    #[derive(Default)]
    struct Peer {
        rx_packets: u32,
        seq_max: u32,
        rx_bytes: u64,
        /// Peer clock, microseconds (wrapping).
        ts: u32,
    }

    impl Peer {
        /// `sent` of our packets of `size` bytes went out, `lost` of them did not arrive;
        /// `dt` passed on the peer's clock.
        fn traffic(&mut self, sent: u32, lost: u32, size: u64, dt: Duration) {
            self.seq_max = self.seq_max.wrapping_add(sent);
            self.rx_packets = self.rx_packets.wrapping_add(sent - lost);
            self.rx_bytes = self.rx_bytes.wrapping_add((sent - lost) as u64 * size);
            self.ts = self.ts.wrapping_add(dt.as_micros() as u32);
        }
        fn ack(&self, probe_id: u32) -> ProbeAckRepr {
            ProbeAckRepr {
                common: Common {
                    link_seq: 0,
                    ts: self.ts,
                },
                probe_id,
                echo_ts: 0,
                hold_us: 0,
                rx_link_seq_max: self.seq_max,
                rx_packets: self.rx_packets,
                rx_bytes: self.rx_bytes,
                qdelay_us: 0,
                owd_offset_us: 0,
            }
        }
    }

    /// Drives a link in virtual time: probes when due; each probe is answered after `rtt` unless
    /// `answer` says no. Returns the instant of the first state change to `want`, if any.
    struct Script {
        h: LinkHealth,
        now: Instant,
        peer: Peer,
        next_id: u32,
        /// (due, probe id) acks in flight.
        pending: Vec<(Instant, u32)>,
    }

    impl Script {
        fn new(cfg: HealthConfig) -> Self {
            let now = Instant::now();
            Script {
                h: LinkHealth::new(cfg, now),
                now,
                peer: Peer::default(),
                next_id: 0,
                pending: Vec::new(),
            }
        }
        /// Runs until `until`, answering probes after `rtt` when `answer` is true; returns every
        /// state change with its instant.
        fn run(
            &mut self,
            until: Instant,
            rtt: Duration,
            answer: bool,
        ) -> Vec<(Instant, LinkState)> {
            let mut changes = Vec::new();
            loop {
                let ack_due = self.pending.iter().map(|p| p.0).min();
                let t = ack_due.map_or(self.h.poll_timeout(), |a| a.min(self.h.poll_timeout()));
                if t > until {
                    self.now = until;
                    return changes;
                }
                self.now = self.now.max(t);
                if let Some(pos) = self.pending.iter().position(|p| p.0 <= self.now) {
                    let (_, id) = self.pending.remove(pos);
                    self.peer.traffic(1, 0, 60, ms(100));
                    if let Some(s) = self.h.on_probe_ack(self.now, &self.peer.ack(id)) {
                        changes.push((self.now, s));
                    }
                    continue;
                }
                if let Some(s) = self.h.handle_timeout(self.now) {
                    changes.push((self.now, s));
                }
                if self.now >= self.h.next_probe_at() {
                    let id = self.next_id;
                    self.next_id += 1;
                    self.h.on_probe_sent(self.now, id);
                    if answer {
                        self.pending.push((self.now + rtt, id));
                    }
                }
            }
        }
    }

    #[test]
    fn defaults() {
        let c = HealthConfig::default();
        assert_eq!(c.probe_interval, ms(100));
        assert_eq!(c.down_after, ms(500));
        assert_eq!(c.rise, 3);
        assert_eq!((c.degraded_loss, c.recovered_loss), (0.10, 0.03));
    }

    /// The round trip ends when the ack arrived, not when it was read.
    #[test]
    fn a_round_trip_ends_at_the_acks_arrival() {
        let t0 = Instant::now();
        let mut h = LinkHealth::new(HealthConfig::default(), t0);
        h.on_probe_sent(t0, 1);
        let ack = ProbeAckRepr {
            probe_id: 1,
            hold_us: 2_000,
            ..Default::default()
        };
        h.on_probe_ack_at(t0 + ms(45), t0 + ms(30), &ack);
        assert_eq!(h.srtt(), Some(ms(28)));
        // An arrival after the read counts as the read.
        h.on_probe_sent(t0 + ms(100), 2);
        let ack = ProbeAckRepr { probe_id: 2, ..ack };
        h.on_probe_ack_at(t0 + ms(120), t0 + ms(500), &ack);
        assert_eq!(h.min_rtt(), Some(ms(18)));
    }

    #[test]
    fn first_rtt_sample_and_convergence() {
        let t0 = Instant::now();
        let mut h = LinkHealth::new(HealthConfig::default(), t0);
        assert_eq!(h.srtt(), None);
        h.on_probe_sent(t0, 7);
        let mut ack = ProbeAckRepr {
            probe_id: 7,
            hold_us: 2_000,
            ..Default::default()
        };
        h.on_probe_ack(t0 + ms(42), &ack);
        // 42 ms minus 2 ms held by the peer.
        assert_eq!(h.srtt(), Some(ms(40)));
        assert_eq!(h.rttvar(), Some(ms(20)));
        assert_eq!(h.min_rtt(), Some(ms(40)));
        // Then a steady 20 ms: srtt converges to it, rttvar shrinks, min follows.
        let mut t = t0 + ms(100);
        for id in 8..60 {
            h.on_probe_sent(t, id);
            ack.probe_id = id;
            ack.hold_us = 0;
            h.on_probe_ack(t + ms(20), &ack);
            t += ms(100);
        }
        let srtt = h.srtt().unwrap();
        assert!(
            srtt >= ms(20) && srtt < Duration::from_micros(20_100),
            "{srtt:?}"
        );
        assert!(h.rttvar().unwrap() < ms(1), "{:?}", h.rttvar());
        assert_eq!(h.min_rtt(), Some(ms(20)));
        assert_eq!(h.probes_answered(), 53);
        assert_eq!(h.probes_unanswered(), 0);
    }

    #[test]
    fn a_queued_links_min_rtt_does_not_take_in_its_standing_queue() {
        // 20 ms empty, then 45 ms of standing queue on our way for 20 s (the peer reports it):
        // the window forgets the empty samples, but the minimum stays. Then the queue is gone
        // and the path itself is longer: the minimum follows once the window forgets.
        let t0 = Instant::now();
        let mut h = LinkHealth::new(HealthConfig::default(), t0);
        let mut t = t0;
        let mut id = 0;
        let mut probe = |h: &mut LinkHealth, t: &mut Instant, rtt: u64, qdelay_us: u32| {
            id += 1;
            h.on_probe_sent(*t, id);
            let ack = ProbeAckRepr {
                probe_id: id,
                qdelay_us,
                ..Default::default()
            };
            h.on_probe_ack(*t + ms(rtt), &ack);
            *t += ms(100);
        };
        for _ in 0..20 {
            probe(&mut h, &mut t, 20, 0);
        }
        for _ in 0..200 {
            probe(&mut h, &mut t, 65, 45_000);
        }
        assert_eq!(h.min_rtt(), Some(ms(20)), "the queue taken for the path");
        for _ in 0..120 {
            probe(&mut h, &mut t, 65, 0);
        }
        assert_eq!(h.min_rtt(), Some(ms(65)), "a longer path, no queue");
    }

    #[test]
    fn rfc6298_update_rule() {
        let t0 = Instant::now();
        let mut h = LinkHealth::new(HealthConfig::default(), t0);
        h.on_probe_sent(t0, 1);
        h.on_probe_ack(
            t0 + ms(100),
            &ProbeAckRepr {
                probe_id: 1,
                ..Default::default()
            },
        );
        h.on_probe_sent(t0 + ms(100), 2);
        h.on_probe_ack(
            t0 + ms(300),
            &ProbeAckRepr {
                probe_id: 2,
                ..Default::default()
            },
        );
        // rttvar = 3/4 * 50 + 1/4 * |100 - 200| = 62.5 ms; srtt = 7/8 * 100 + 1/8 * 200 = 112.5 ms.
        assert_eq!(h.rttvar(), Some(Duration::from_micros(62_500)));
        assert_eq!(h.srtt(), Some(Duration::from_micros(112_500)));
        assert_eq!(h.min_rtt(), Some(ms(100)));
    }

    #[test]
    fn unknown_or_absurd_acks_give_no_rtt() {
        let t0 = Instant::now();
        let mut h = LinkHealth::new(HealthConfig::default(), t0);
        h.on_probe_sent(t0, 1);
        // Unknown id, then a hold longer than the elapsed time.
        h.on_probe_ack(
            t0 + ms(10),
            &ProbeAckRepr {
                probe_id: 99,
                ..Default::default()
            },
        );
        h.on_probe_ack(
            t0 + ms(10),
            &ProbeAckRepr {
                probe_id: 1,
                hold_us: 50_000,
                ..Default::default()
            },
        );
        assert_eq!(h.srtt(), None);
        // The matched ack still counts as an answer.
        assert_eq!(h.probes_answered(), 1);
    }

    #[test]
    fn new_link_is_down_and_rises_after_three_answered_probes() {
        let mut s = Script::new(HealthConfig::default());
        assert_eq!(s.h.state(), LinkState::Down);
        let t0 = s.now;
        let changes = s.run(t0 + ms(1000), ms(30), true);
        // Probes at 0, 100, 200 ms, answered at 30, 130, 230 ms: UP at 230 ms.
        assert_eq!(changes, vec![(t0 + ms(230), LinkState::Up)]);
    }

    #[test]
    fn dead_link_goes_down_in_under_a_second_and_comes_back() {
        let mut s = Script::new(HealthConfig::default());
        let t0 = s.now;
        s.run(t0 + ms(2000), ms(40), true);
        assert_eq!(s.h.state(), LinkState::Up);
        // The link goes dark at 2 s (acks in flight are lost too).
        let dark = s.now;
        s.pending.clear();
        let sent_before = s.h.probes_sent();
        let changes = s.run(dark + ms(3000), ms(40), false);
        assert_eq!(changes.len(), 1, "{changes:?}");
        let (t_down, st) = changes[0];
        assert_eq!(st, LinkState::Down);
        let detect = t_down - dark;
        assert!(detect < ms(1000), "dead link detected after {detect:?}");
        assert!(detect >= ms(400), "too eager: {detect:?}");
        // Probes go on while DOWN (that is how the link comes back).
        assert!(
            s.h.probes_sent() - sent_before >= 29,
            "{}",
            s.h.probes_sent() - sent_before
        );
        // Light again: three answered probes bring it UP by itself.
        let back = s.now;
        let changes = s.run(back + ms(1000), ms(40), true);
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert_eq!(changes[0].1, LinkState::Up);
        assert!(
            changes[0].0 - back <= ms(100) + ms(300) + ms(40),
            "{:?}",
            changes[0].0 - back
        );
        // The probes sent into the dark were counted as never answered.
        assert!(s.h.probes_unanswered() >= 29, "{}", s.h.probes_unanswered());
    }

    #[test]
    fn down_deadline_follows_rtt_when_it_is_long() {
        // RTT 800 ms: the deadline is srtt + 4 rttvar + probe interval, not 500 ms.
        let mut s = Script::new(HealthConfig::default());
        let t0 = s.now;
        s.run(t0 + ms(10_000), ms(800), true);
        assert_eq!(s.h.state(), LinkState::Up);
        let dead_after = s.h.dead_after();
        assert!(dead_after >= ms(900), "{dead_after:?}");
        // Steady RTT: no false DOWN happened.
        assert_eq!(s.h.probes_unanswered(), 0);
    }

    #[test]
    fn an_unanswered_probe_restarts_the_rise_count() {
        let t0 = Instant::now();
        let mut h = LinkHealth::new(HealthConfig::default(), t0);
        let ack = |id| ProbeAckRepr {
            probe_id: id,
            ..Default::default()
        };
        for id in 0..4 {
            h.on_probe_sent(t0 + ms(100 * id as u64), id);
        }
        // Probe 0 answered, 1 lost, 2 and 3 answered: only two in a row.
        assert_eq!(h.on_probe_ack(t0 + ms(10), &ack(0)), None);
        assert_eq!(h.on_probe_ack(t0 + ms(210), &ack(2)), None);
        assert_eq!(h.on_probe_ack(t0 + ms(310), &ack(3)), None);
        assert_eq!(h.state(), LinkState::Down);
        assert_eq!(h.probes_unanswered(), 1);
        h.on_probe_sent(t0 + ms(400), 4);
        assert_eq!(h.on_probe_ack(t0 + ms(410), &ack(4)), Some(LinkState::Up));
    }

    /// Brings `h` UP with three answered probes, then feeds `n` acks 100 ms apart, each reporting
    /// `sent` packets of which `lost` were lost.
    fn feed_loss(
        h: &mut LinkHealth,
        peer: &mut Peer,
        t: &mut Instant,
        id: &mut u32,
        n: usize,
        sent: u32,
        lost: u32,
    ) -> Vec<LinkState> {
        let mut changes = Vec::new();
        for _ in 0..n {
            h.on_probe_sent(*t, *id);
            *t += ms(20);
            peer.traffic(sent, lost, 1000, ms(100));
            if let Some(s) = h.on_probe_ack(*t, &peer.ack(*id)) {
                changes.push(s);
            }
            *id += 1;
            *t += ms(80);
        }
        changes
    }

    #[test]
    fn loss_estimate_and_degraded_hysteresis() {
        let mut t = Instant::now();
        let mut h = LinkHealth::new(HealthConfig::default(), t);
        let (mut peer, mut id) = (Peer::default(), 0);
        assert_eq!(
            feed_loss(&mut h, &mut peer, &mut t, &mut id, 3, 100, 0),
            vec![LinkState::Up]
        );
        assert_eq!(h.loss(), 0.0);
        // 20% loss: DEGRADED, and the estimate converges to 0.2.
        let ch = feed_loss(&mut h, &mut peer, &mut t, &mut id, 50, 100, 20);
        assert_eq!(ch, vec![LinkState::Degraded]);
        assert!((h.loss() - 0.2).abs() < 0.01, "{}", h.loss());
        // 5% loss: between the thresholds, stays DEGRADED.
        let ch = feed_loss(&mut h, &mut peer, &mut t, &mut id, 50, 100, 5);
        assert!(ch.is_empty(), "{ch:?}");
        assert!((h.loss() - 0.05).abs() < 0.01, "{}", h.loss());
        // No loss: UP again once the estimate falls to 3%.
        let ch = feed_loss(&mut h, &mut peer, &mut t, &mut id, 50, 100, 0);
        assert_eq!(ch, vec![LinkState::Up]);
        assert!(h.loss() < 0.01);
        // 5% loss from UP: stays UP (hysteresis both ways).
        let ch = feed_loss(&mut h, &mut peer, &mut t, &mut id, 50, 100, 5);
        assert!(ch.is_empty(), "{ch:?}");
        assert_eq!(h.state(), LinkState::Up);
        // The estimate rests on a thousand packets a second here; on a link that carries
        // about ten, on about ten (scheduler: PULLBACK_MIN_PPS).
        let pps = h.loss_basis_pps();
        assert!((900.0..1100.0).contains(&pps), "{pps}");
        feed_loss(&mut h, &mut peer, &mut t, &mut id, 50, 1, 0);
        let pps = h.loss_basis_pps();
        assert!((5.0..25.0).contains(&pps), "{pps}");
    }

    #[test]
    fn loss_is_smoothed_over_about_a_second() {
        let mut t = Instant::now();
        let mut h = LinkHealth::new(HealthConfig::default(), t);
        let (mut peer, mut id) = (Peer::default(), 0);
        feed_loss(&mut h, &mut peer, &mut t, &mut id, 3, 100, 0);
        // One interval of 50% loss is not enough to degrade the link...
        feed_loss(&mut h, &mut peer, &mut t, &mut id, 1, 100, 50);
        assert!(h.loss() > 0.02 && h.loss() < 0.10, "{}", h.loss());
        assert_eq!(h.state(), LinkState::Up);
        // ...and it is forgotten within a few seconds.
        feed_loss(&mut h, &mut peer, &mut t, &mut id, 30, 100, 0);
        assert!(h.loss() < 0.01, "{}", h.loss());
    }

    #[test]
    fn loss_tally_counts_every_reported_packet() {
        let mut t = Instant::now();
        let mut h = LinkHealth::new(HealthConfig::default(), t);
        let (mut peer, mut id) = (Peer::default(), 0);
        feed_loss(&mut h, &mut peer, &mut t, &mut id, 3, 100, 0);
        let before = h.loss_tally();
        assert_eq!(before.lost, 0);
        feed_loss(&mut h, &mut peer, &mut t, &mut id, 4, 100, 10);
        let after = h.loss_tally();
        assert_eq!(after.expected - before.expected, 400);
        assert_eq!(after.lost, 40);
        assert_eq!(after.loss_since(before, 400), Some(0.1));
        // Too few packets, or a tally that is not earlier: no answer.
        assert_eq!(after.loss_since(before, 401), None);
        assert_eq!(before.loss_since(after, 1), None);
        // Down and back: the tally goes on from where it was.
        h.force_down(t);
        feed_loss(&mut h, &mut peer, &mut t, &mut id, 2, 100, 0);
        assert!(h.loss_tally().expected >= after.expected);
        assert_eq!(h.loss_tally().lost, 40);
    }

    #[test]
    fn delivery_rate_from_reports() {
        let mut t = Instant::now();
        let mut h = LinkHealth::new(HealthConfig::default(), t);
        let (mut peer, mut id) = (Peer::default(), 0);
        assert_eq!(h.delivery_rate_bps(), 0.0);
        // 1250 packets of 1000 bytes per 100 ms of peer clock: 100 Mbit/s.
        feed_loss(&mut h, &mut peer, &mut t, &mut id, 10, 1250, 0);
        let r = h.delivery_rate_bps();
        assert!((r - 100e6).abs() < 1e3, "{r}");
        // Rate drops to 10 Mbit/s: the estimate follows within about a second.
        feed_loss(&mut h, &mut peer, &mut t, &mut id, 20, 125, 0);
        let r = h.delivery_rate_bps();
        assert!((r - 10e6).abs() < 0.1e6, "{r}");
        // Lost packets are not delivered: 10% loss of 10 Mbit/s offered.
        feed_loss(&mut h, &mut peer, &mut t, &mut id, 20, 125, 12);
        let r = h.delivery_rate_bps();
        assert!((r - 9.04e6).abs() < 0.1e6, "{r}");
    }

    #[test]
    fn rate_uses_peer_clock_not_arrival_times() {
        // Acks bunch up on arrival (jitter), but the peer's timestamps are 100 ms apart.
        let mut t = Instant::now();
        let mut h = LinkHealth::new(HealthConfig::default(), t);
        let mut peer = Peer::default();
        for id in 0..20 {
            h.on_probe_sent(t, id);
            peer.traffic(125, 0, 1000, ms(100));
            t += if id % 2 == 0 { ms(1) } else { ms(199) };
            h.on_probe_ack(t, &peer.ack(id));
        }
        let r = h.delivery_rate_bps();
        assert!((r - 10e6).abs() < 1e3, "{r}");
    }

    #[test]
    fn wrapping_counters_and_timestamps() {
        let mut t = Instant::now();
        let mut h = LinkHealth::new(HealthConfig::default(), t);
        let mut peer = Peer {
            rx_packets: u32::MAX - 500,
            seq_max: u32::MAX - 300,
            rx_bytes: u64::MAX - 100_000,
            ts: u32::MAX - 250_000,
        };
        let mut id = 0;
        feed_loss(&mut h, &mut peer, &mut t, &mut id, 30, 100, 10);
        assert!(
            peer.seq_max < 10_000 && peer.ts < 10_000_000,
            "counters wrapped"
        );
        assert!((h.loss() - 0.1).abs() < 0.01, "{}", h.loss());
        let r = h.delivery_rate_bps();
        // 90 packets of 1000 bytes per 100 ms: 7.2 Mbit/s.
        assert!((r - 7.2e6).abs() < 1e3, "{r}");
    }

    #[test]
    fn backwards_report_rebases_instead_of_counting() {
        let mut t = Instant::now();
        let mut h = LinkHealth::new(HealthConfig::default(), t);
        let (mut peer, mut id) = (Peer::default(), 0);
        feed_loss(&mut h, &mut peer, &mut t, &mut id, 5, 100, 0);
        // The peer restarted: counters from zero. No loss or rate spike.
        let mut peer2 = Peer::default();
        feed_loss(&mut h, &mut peer2, &mut t, &mut id, 5, 100, 0);
        assert_eq!(h.loss(), 0.0);
        // 100 packets of 1000 bytes per 100 ms, before and after: 8 Mbit/s, no spike.
        assert!(
            (h.delivery_rate_bps() - 8e6).abs() < 1e3,
            "{}",
            h.delivery_rate_bps()
        );
    }

    #[test]
    fn qdelay_and_owd_offset_are_the_peers_last_report() {
        let t0 = Instant::now();
        let mut h = LinkHealth::new(HealthConfig::default(), t0);
        let ack = ProbeAckRepr {
            qdelay_us: 7_000,
            owd_offset_us: 15_000,
            ..Default::default()
        };
        h.on_probe_ack(t0, &ack);
        assert_eq!((h.qdelay(), h.owd_offset()), (ms(7), ms(15)));
        h.on_probe_ack(
            t0,
            &ProbeAckRepr {
                qdelay_us: 0,
                owd_offset_us: -5,
                ..Default::default()
            },
        );
        assert_eq!((h.qdelay(), h.owd_offset()), (ms(0), ms(0)));
    }

    #[test]
    fn receiver_counters_wrap_and_fill_the_report() {
        let t0 = Instant::now();
        let mut h = LinkHealth::new(HealthConfig::default(), t0);
        assert_eq!(h.last_rx(), None);
        assert_eq!(h.base_rel_owd(), None);
        let seqs = [u32::MAX - 2, u32::MAX - 1, u32::MAX, 0, 2, 1];
        for (i, &s) in seqs.iter().enumerate() {
            let c = Common {
                link_seq: s,
                ts: 1_000,
            };
            h.on_packet_received(t0 + ms(i as u64), &c, 100, 21_000);
        }
        let mut ack = ProbeAckRepr::default();
        h.fill_report(t0, &mut ack);
        assert_eq!(
            ack.rx_link_seq_max, 2,
            "highest across the wrap, not the numerically largest"
        );
        assert_eq!(ack.rx_packets, 6);
        assert_eq!(ack.rx_bytes, 600);
        assert_eq!(ack.qdelay_us, 0);
        assert_eq!(h.base_rel_owd(), Some(20_000));
        assert_eq!(h.last_rx(), Some(t0 + ms(5)));
    }

    #[test]
    fn one_way_delay_base_and_queueing_delay_across_clock_wrap() {
        let t0 = Instant::now();
        let mut h = LinkHealth::new(HealthConfig::default(), t0);
        // Sender clock near wrap, receiver clock offset so that `rel` itself wraps too.
        let mut send_ts = u32::MAX - 1_000_000;
        let offset: u32 = u32::MAX - 5_000; // receiver = sender + offset + owd
        let owd = 10_000u32;
        for i in 0..100u32 {
            let c = Common {
                link_seq: i,
                ts: send_ts,
            };
            h.on_packet_received(
                t0 + ms(i as u64),
                &c,
                1000,
                send_ts.wrapping_add(offset).wrapping_add(owd),
            );
            send_ts = send_ts.wrapping_add(20_000);
        }
        let base = h.base_rel_owd().unwrap();
        assert_eq!(base, offset.wrapping_add(owd));
        let mut ack = ProbeAckRepr::default();
        h.fill_report(t0, &mut ack);
        assert_eq!(ack.qdelay_us, 0);
        // A queue builds: one-way delay grows by 30 ms. The reported queueing delay follows.
        for i in 100..140u32 {
            let c = Common {
                link_seq: i,
                ts: send_ts,
            };
            h.on_packet_received(
                t0 + ms(i as u64),
                &c,
                1000,
                send_ts.wrapping_add(offset).wrapping_add(owd + 30_000),
            );
            send_ts = send_ts.wrapping_add(20_000);
        }
        h.fill_report(t0, &mut ack);
        assert!(
            ack.qdelay_us > 29_000 && ack.qdelay_us <= 30_000,
            "{}",
            ack.qdelay_us
        );
        assert_eq!(h.base_rel_owd(), Some(base));
        // The link falls idle; the next packet (a probe) finds the queue drained, and the
        // smoothed value has barely moved. So soon after the arrivals began (a flow's slow
        // start, bursts and gaps) the report still gives the smoothed value ...
        let mut seq = 140;
        let mut arrive = |h: &mut LinkHealth, at: u64, queue: u32| {
            let c = Common {
                link_seq: seq,
                ts: send_ts,
            };
            seq += 1;
            h.on_packet_received(
                t0 + ms(at),
                &c,
                100,
                send_ts.wrapping_add(offset).wrapping_add(owd + queue),
            );
            send_ts = send_ts.wrapping_add(20_000);
        };
        arrive(&mut h, 400, 0);
        assert!(h.rx_qdelay() > ms(25), "{:?}", h.rx_qdelay());
        h.fill_report(t0 + ms(400), &mut ack);
        assert!(ack.qdelay_us > 25_000, "{}", ack.qdelay_us);
        // ... and once they have gone on for ARRIVALS_SETTLED, what that packet saw.
        for at in [900, 1400, 1900, 2400] {
            arrive(&mut h, at, 30_000);
        }
        arrive(&mut h, 2800, 0);
        assert!(h.rx_qdelay() > ms(20), "{:?}", h.rx_qdelay());
        h.fill_report(t0 + ms(2800), &mut ack);
        assert_eq!(ack.qdelay_us, 0, "the queue drained");
        // A silence of ARRIVALS_RESTART or more starts the arrivals afresh.
        arrive(&mut h, 2900, 30_000);
        arrive(&mut h, 4000, 0);
        h.fill_report(t0 + ms(4000), &mut ack);
        assert!(ack.qdelay_us > 15_000, "{}", ack.qdelay_us);
        // Links are compared with wrapping_sub as i32: a link 25 ms slower.
        let other = base.wrapping_add(25_000);
        assert_eq!(other.wrapping_sub(base) as i32, 25_000);
    }

    /// A link busy all along (arrivals 1 ms apart) keeps its base when the window forgets the
    /// empty link's minimum, for at most OWD_KEEP_MAX; one quiet gap lets it rise.
    #[test]
    fn a_busy_links_base_does_not_take_in_its_standing_queue() {
        let t0 = Instant::now();
        // Every `every` ms from `from` to `to` ms, one packet that took `owd` us.
        let feed = |h: &mut LinkHealth, (from, to, every): (u64, u64, u64), owd: u32| {
            for at in (from..to).step_by(every as usize) {
                let ts = (at * 1_000) as u32;
                let c = Common {
                    link_seq: at as u32,
                    ts,
                };
                h.on_packet_received(t0 + ms(at), &c, 1_000, ts + owd);
            }
        };
        // Idle (probes 100 ms apart) at 5 ms, then a standing queue of 20 ms from 2 s (the
        // load's first packet comes after a gap: that one does not count) to 70 s, with a gap
        // of 30 ms at `quiet_at` ms.
        let busy = |quiet_at: Option<u64>| {
            let mut h = LinkHealth::new(HealthConfig::default(), t0);
            feed(&mut h, (0, 2_000, 100), 5_000);
            match quiet_at {
                Some(q) => {
                    feed(&mut h, (2_000, q, 1), 25_000);
                    feed(&mut h, (q + 30, 70_000, 1), 25_000);
                }
                None => feed(&mut h, (2_000, 70_000, 1), 25_000),
            }
            h
        };
        let h = busy(None);
        assert_eq!(h.base_rel_owd(), Some(5_000), "busy for 68 s");
        assert!(h.rx_qdelay() > ms(19), "{:?}", h.rx_qdelay());
        // One gap of 30 ms at 40 s: the queue was empty then, so the rise after it is taken.
        let h = busy(Some(40_000));
        assert_eq!(
            h.base_rel_owd(),
            Some(25_000),
            "a quiet gap since the minimum"
        );
        // Kept for OWD_KEEP_MAX at most.
        let mut h = busy(None);
        feed(&mut h, (70_000, 300_000, 1), 25_000);
        assert_eq!(h.base_rel_owd(), Some(5_000), "within OWD_KEEP_MAX");
        feed(&mut h, (300_000, 400_000, 1), 25_000);
        assert_eq!(h.base_rel_owd(), Some(25_000), "after OWD_KEEP_MAX");
    }

    #[test]
    fn base_owd_window_forgets_old_minimum() {
        let t0 = Instant::now();
        let mut h = LinkHealth::new(HealthConfig::default(), t0);
        for i in 0..10u64 {
            let ts = (i * 1_000) as u32;
            h.on_packet_received(
                t0 + ms(i),
                &Common {
                    link_seq: i as u32,
                    ts,
                },
                100,
                ts + 5_000,
            );
        }
        // The path becomes 20 ms longer for good (a route change): the base follows once the
        // window (OWD_WINDOW, 30 s) has forgotten the old minimum.
        for i in 1..250u64 {
            let ts = (i * 100_000) as u32;
            h.on_packet_received(
                t0 + ms(i * 100),
                &Common {
                    link_seq: i as u32,
                    ts,
                },
                100,
                ts + 25_000,
            );
        }
        assert_eq!(
            h.base_rel_owd(),
            Some(5_000),
            "25 s later the old minimum still counts"
        );
        for i in 250..350u64 {
            let ts = (i * 100_000) as u32;
            h.on_packet_received(
                t0 + ms(i * 100),
                &Common {
                    link_seq: i as u32,
                    ts,
                },
                100,
                ts + 25_000,
            );
        }
        // The base is the minimum of the smoothed delay: it follows within the smoothing's lag.
        let base = h.base_rel_owd().unwrap();
        assert!((24_900..=25_000).contains(&base), "{base}");
    }

    /// A link whose delay jitters (LTE) but carries no queue: the jitter must not read as
    /// queueing delay, or the sender backs the link off to a fraction of what it can carry. The
    /// base is the windowed minimum of the *smoothed* delay, so jitter of +-20 ms reads as a few
    /// ms; the minimum of the raw samples would read as 20 ms on average.
    #[test]
    fn jitter_does_not_read_as_queueing_delay() {
        let t0 = Instant::now();
        let mut h = LinkHealth::new(HealthConfig::default(), t0);
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut sum = 0.0;
        let mut n = 0;
        for i in 0..10_000u64 {
            // xorshift64: uniform jitter in [-20, +20] ms around 30 ms.
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let jitter = (rng % 40_001) as i64 - 20_000;
            let ts = (i * 1_000) as u32;
            let arrival = (ts as i64 + 30_000 + jitter) as u32;
            h.on_packet_received(
                t0 + Duration::from_millis(i),
                &Common {
                    link_seq: i as u32,
                    ts,
                },
                1000,
                arrival,
            );
            if i >= 5_000 {
                sum += h.rx_qdelay().as_secs_f64();
                n += 1;
            }
        }
        let mean_ms = 1000.0 * sum / n as f64;
        assert!(mean_ms < 12.0, "jitter read as {mean_ms:.1} ms of queue");
    }

    #[test]
    fn absurd_settings_are_clamped() {
        let t0 = Instant::now();
        let cfg = HealthConfig {
            probe_interval: Duration::MAX,
            down_after: Duration::MAX,
            rise: 0,
            degraded_loss: f64::NAN,
            recovered_loss: 7.0,
        };
        let mut h = LinkHealth::new(cfg, t0);
        h.on_probe_sent(t0, 1);
        assert_eq!(h.next_probe_at(), t0 + Duration::from_secs(3600));
        assert_eq!(h.config().rise, 1);
        assert_eq!(
            (h.config().degraded_loss, h.config().recovered_loss),
            (0.10, 0.10)
        );
        assert_eq!(
            h.on_probe_ack(
                t0,
                &ProbeAckRepr {
                    probe_id: 1,
                    ..Default::default()
                }
            ),
            Some(LinkState::Up)
        );
        assert!(h.poll_timeout() <= t0 + Duration::from_secs(3600));
        assert_eq!(
            h.handle_timeout(t0 + Duration::from_secs(3601)),
            Some(LinkState::Down)
        );
    }

    #[test]
    fn poll_timeout_is_next_probe_or_down_deadline() {
        let t0 = Instant::now();
        let mut h = LinkHealth::new(HealthConfig::default(), t0);
        assert_eq!(h.poll_timeout(), t0);
        assert_eq!(h.next_probe_at(), t0);
        h.on_probe_sent(t0, 0);
        assert_eq!(h.next_probe_at(), t0 + ms(100));
        assert_eq!(h.poll_timeout(), t0 + ms(100));
        assert_eq!(h.handle_timeout(t0 + ms(50)), None);
    }

    fn arb_ack() -> impl Strategy<Value = ProbeAckRepr> {
        (
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            any::<u32>(),
            any::<i32>(),
        )
            .prop_map(
                |(link_seq, ts, probe_id, hold_us, seq_max, pkts, bytes, qd, off)| ProbeAckRepr {
                    common: Common { link_seq, ts },
                    probe_id: probe_id % 64,
                    echo_ts: 0,
                    hold_us,
                    rx_link_seq_max: seq_max,
                    rx_packets: pkts,
                    rx_bytes: bytes,
                    qdelay_us: qd,
                    owd_offset_us: off,
                },
            )
    }

    #[derive(Debug, Clone)]
    enum Op {
        Advance(u32),
        Probe(u32),
        Ack(ProbeAckRepr),
        /// A plausible ack: small increments of every counter.
        Steady {
            dpkts: u16,
            dlost: u16,
            dts_us: u32,
        },
        Rx(Common, u16, u32),
        Timeout,
    }

    fn arb_op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u32..2_000_000).prop_map(Op::Advance),
            (0u32..64).prop_map(Op::Probe),
            arb_ack().prop_map(Op::Ack),
            (any::<u16>(), any::<u16>(), any::<u32>()).prop_map(|(dpkts, dlost, dts_us)| {
                Op::Steady {
                    dpkts,
                    dlost,
                    dts_us,
                }
            }),
            (any::<u32>(), any::<u32>(), any::<u16>(), any::<u32>())
                .prop_map(|(s, ts, b, l)| Op::Rx(Common { link_seq: s, ts }, b, l)),
            Just(Op::Timeout),
        ]
    }

    proptest! {
        #[test]
        fn arbitrary_reports_never_break_it(ops in proptest::collection::vec(arb_op(), 1..200)) {
            let t0 = Instant::now();
            let mut now = t0;
            let mut h = LinkHealth::new(HealthConfig::default(), t0);
            let mut peer = Peer::default();
            let mut id = 0;
            for op in ops {
                match op {
                    Op::Advance(us) => now += Duration::from_micros(us as u64),
                    Op::Probe(i) => h.on_probe_sent(now, i),
                    Op::Ack(a) => { h.on_probe_ack(now, &a); }
                    Op::Steady { dpkts, dlost, dts_us } => {
                        let lost = dlost.min(dpkts) as u32;
                        peer.traffic(dpkts as u32, lost, 1400, Duration::from_micros(dts_us as u64));
                        h.on_probe_sent(now, id);
                        h.on_probe_ack(now, &peer.ack(id));
                        id = (id + 1) % 64;
                    }
                    Op::Rx(c, b, l) => h.on_packet_received(now, &c, b as usize, l),
                    Op::Timeout => { h.handle_timeout(now); }
                }
                let loss = h.loss();
                prop_assert!((0.0..=1.0).contains(&loss), "loss {}", loss);
                let r = h.delivery_rate_bps();
                prop_assert!(r.is_finite() && r >= 0.0, "rate {}", r);
                prop_assert!(h.poll_timeout() >= t0);
                let mut ack = ProbeAckRepr::default();
                h.fill_report(now, &mut ack);
                if let Some(srtt) = h.srtt() {
                    prop_assert!(srtt <= now - t0);
                }
            }
        }
    }
}
