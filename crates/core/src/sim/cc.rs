//! Congestion controls of the simulated TCP sender ([`super::tcp`]): a loss-based one (CUBIC,
//! RFC 9438, with HyStart's delay test) and a paced rate-based one (BBR v1, as in Linux's
//! `tcp_bbr.c` and draft-cardwell-iccrg-bbr-congestion-control-00).
//!
//! Units: windows and in-flight counts in segments, rates in segments per second, so that
//! `bdp = bw * min_rtt` is a window.

use std::collections::VecDeque;
use std::time::Duration;

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Which congestion control a simulated sender runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum CcKind {
    Cubic,
    Bbr,
}

impl CcKind {
    pub const ALL: [CcKind; 2] = [CcKind::Cubic, CcKind::Bbr];

    pub fn name(self) -> &'static str {
        match self {
            CcKind::Cubic => "cubic",
            CcKind::Bbr => "bbr",
        }
    }

    pub fn parse(s: &str) -> Option<CcKind> {
        CcKind::ALL.into_iter().find(|c| c.name() == s)
    }

    pub(crate) fn build(self, seed: u64) -> Box<dyn CongestionControl> {
        match self {
            CcKind::Cubic => Box::new(Cubic::new()),
            CcKind::Bbr => Box::new(Bbr::new(seed)),
        }
    }
}

/// A delivery-rate sample (draft-cheng-iccrg-delivery-rate-estimation).
#[derive(Debug, Clone, Copy)]
pub struct RateSample {
    /// Segments delivered over `interval`.
    pub delivered: u64,
    pub interval: Duration,
    /// `C.delivered` when the newest acknowledged segment was sent.
    pub prior_delivered: u64,
    /// That segment was sent while the connection was marked application-limited (the draft's
    /// `P.is_app_limited`): here only in BBR's PROBE_RTT, which marks it so (below).
    pub is_app_limited: bool,
}

impl RateSample {
    pub fn rate(&self) -> f64 {
        self.delivered as f64 / self.interval.as_secs_f64()
    }
}

/// What one ACK told the sender.
#[derive(Debug, Clone, Copy)]
pub struct Ack {
    /// Segments newly delivered (cumulatively or selectively acknowledged).
    pub acked: u64,
    /// Segments newly marked lost.
    pub lost: u64,
    /// RTT of the newest segment this ACK delivered, if it was not retransmitted.
    pub rtt: Option<Duration>,
    /// Segments in flight before this ACK was processed...
    pub prior_in_flight: u64,
    /// ...and after.
    pub in_flight: u64,
    /// Segments delivered since the start.
    pub delivered: u64,
    pub rate: Option<RateSample>,
    /// The sender is in loss recovery (after this ACK).
    pub in_recovery: bool,
}

pub trait CongestionControl {
    fn on_ack(&mut self, now: Duration, ack: &Ack);
    /// Loss detected outside recovery: the sender enters fast recovery.
    fn on_recovery_start(&mut self, now: Duration, in_flight: u64);
    fn on_recovery_end(&mut self, now: Duration);
    /// An ACK echoed a Congestion Experienced mark (ECE) outside a reduction: the sender
    /// enters CWR (RFC 3168). Linux reduces the window as for a loss, with nothing to send
    /// again; BBR v1 ignores ECN (its window is set by its model), hence the default.
    fn on_ce_echo(&mut self, _now: Duration, _in_flight: u64) {}
    /// The retransmission timer fired.
    fn on_rto(&mut self, now: Duration);
    /// Congestion window, segments.
    fn cwnd(&self) -> u64;
    /// Pacing rate in segments per second, or `None` to send as the window allows.
    fn pacing_rate(&self) -> Option<f64>;
    /// True after an ACK on which the sender should mark the connection application-limited,
    /// so that the rate samples of what it sends next are known for what they are. Linux's BBR
    /// does so on every ACK in PROBE_RTT (`bbr_update_min_rtt`: "Ignore low rate samples during
    /// this mode").
    fn marks_app_limited(&self) -> bool {
        false
    }
}

/// Initial window (RFC 6928).
const INIT_CWND: f64 = 10.0;

/// CUBIC (RFC 9438) with the Reno-friendly region, fast convergence and HyStart's delay test.
#[derive(Debug)]
pub struct Cubic {
    cwnd: f64,
    ssthresh: f64,
    w_max: f64,
    /// Start of the current congestion-avoidance epoch.
    epoch: Option<Duration>,
    k: f64,
    origin: f64,
    w_est: f64,
    min_rtt: Duration,
    hystart: HyStart,
}

/// HyStart delay test: leave slow start when a round's minimum RTT (over its first 8 samples)
/// exceeds the previous round's by an eighth (clamped to 4..16 ms), as Linux does.
#[derive(Debug, Default)]
struct HyStart {
    round_end: u64,
    samples: u32,
    round_min: Option<Duration>,
    last_round_min: Option<Duration>,
}

impl HyStart {
    /// True when slow start should end.
    fn on_ack(&mut self, ack: &Ack) -> bool {
        if ack.delivered >= self.round_end {
            self.round_end = ack.delivered + ack.in_flight;
            self.last_round_min = self.round_min.or(self.last_round_min);
            self.round_min = None;
            self.samples = 0;
        }
        let Some(rtt) = ack.rtt else {
            return false;
        };
        if self.samples >= 8 {
            return false;
        }
        self.samples += 1;
        self.round_min = Some(self.round_min.map_or(rtt, |m| m.min(rtt)));
        let (Some(cur), Some(last)) = (self.round_min, self.last_round_min) else {
            return false;
        };
        let thresh = (last / 8).clamp(Duration::from_millis(4), Duration::from_millis(16));
        self.samples == 8 && cur >= last + thresh
    }
}

const CUBIC_C: f64 = 0.4;
const CUBIC_BETA: f64 = 0.7;

impl Cubic {
    pub fn new() -> Self {
        Cubic {
            cwnd: INIT_CWND,
            ssthresh: f64::INFINITY,
            w_max: 0.0,
            epoch: None,
            k: 0.0,
            origin: 0.0,
            w_est: 0.0,
            min_rtt: Duration::MAX,
            hystart: HyStart::default(),
        }
    }

    fn reduce(&mut self) {
        self.epoch = None;
        self.w_max = if self.cwnd < self.w_max {
            self.cwnd * (1.0 + CUBIC_BETA) / 2.0
        } else {
            self.cwnd
        };
        self.ssthresh = (self.cwnd * CUBIC_BETA).max(2.0);
    }

    fn congestion_avoidance(&mut self, now: Duration, acked: f64) {
        let epoch = *self.epoch.get_or_insert_with(|| {
            if self.cwnd < self.w_max {
                self.k = ((self.w_max - self.cwnd) / CUBIC_C).cbrt();
                self.origin = self.w_max;
            } else {
                self.k = 0.0;
                self.origin = self.cwnd;
            }
            self.w_est = self.cwnd;
            now
        });
        let rtt = if self.min_rtt == Duration::MAX {
            0.0
        } else {
            self.min_rtt.as_secs_f64()
        };
        let t = (now - epoch).as_secs_f64() + rtt;
        let target = self.origin + CUBIC_C * (t - self.k).powi(3);
        let mut cnt = if target > self.cwnd {
            self.cwnd / (target - self.cwnd)
        } else {
            100.0 * self.cwnd
        };
        let alpha = 3.0 * (1.0 - CUBIC_BETA) / (1.0 + CUBIC_BETA);
        self.w_est += alpha * acked / self.cwnd;
        if self.w_est > self.cwnd {
            cnt = cnt.min(self.cwnd / (self.w_est - self.cwnd));
        }
        self.cwnd += acked / cnt.max(1e-9);
    }
}

impl Default for Cubic {
    fn default() -> Self {
        Self::new()
    }
}

impl CongestionControl for Cubic {
    fn on_ack(&mut self, now: Duration, ack: &Ack) {
        if let Some(r) = ack.rtt {
            self.min_rtt = self.min_rtt.min(r);
        }
        if ack.in_recovery || ack.acked == 0 {
            return;
        }
        let mut acked = ack.acked as f64;
        if self.cwnd < self.ssthresh {
            if self.cwnd >= 16.0 && self.hystart.on_ack(ack) {
                self.ssthresh = self.cwnd;
            }
            let room = (self.ssthresh - self.cwnd).max(0.0);
            let grow = acked.min(room);
            self.cwnd += grow;
            acked -= grow;
            if acked <= 0.0 {
                return;
            }
        }
        self.congestion_avoidance(now, acked);
    }

    fn on_recovery_start(&mut self, _now: Duration, _in_flight: u64) {
        self.reduce();
        self.cwnd = self.ssthresh;
    }

    fn on_recovery_end(&mut self, _now: Duration) {}

    fn on_ce_echo(&mut self, now: Duration, in_flight: u64) {
        self.on_recovery_start(now, in_flight);
    }

    fn on_rto(&mut self, _now: Duration) {
        self.reduce();
        self.cwnd = 1.0;
    }

    fn cwnd(&self) -> u64 {
        self.cwnd as u64
    }

    fn pacing_rate(&self) -> Option<f64> {
        None
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BbrMode {
    Startup,
    Drain,
    ProbeBw,
    ProbeRtt,
}

/// 2 / ln 2: the smallest gain that doubles the sending rate each round.
const BBR_HIGH_GAIN: f64 = 2.885;
const BBR_CYCLE: [f64; 8] = [1.25, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0];
const BBR_BW_ROUNDS: u64 = 10;
const BBR_MIN_RTT_WIN: Duration = Duration::from_secs(10);
const BBR_PROBE_RTT_TIME: Duration = Duration::from_millis(200);
const BBR_MIN_CWND: u64 = 4;
/// Linux paces 1% below the estimate, to drain queues the estimate's error leaves.
const BBR_PACING_MARGIN: f64 = 0.99;

/// BBR v1.
#[derive(Debug)]
pub struct Bbr {
    mode: BbrMode,
    /// Windowed max of delivery-rate samples: (round, rate), rates decreasing.
    bw_filter: VecDeque<(u64, f64)>,
    min_rtt: Option<Duration>,
    min_rtt_stamp: Duration,
    round: u64,
    next_round_delivered: u64,
    round_start: bool,
    full_bw: f64,
    full_bw_count: u32,
    filled_pipe: bool,
    pacing_gain: f64,
    cwnd_gain: f64,
    cycle_index: usize,
    cycle_stamp: Duration,
    probe_rtt_done: Option<Duration>,
    probe_rtt_round_done: bool,
    prior_cwnd: u64,
    packet_conservation: bool,
    cwnd: u64,
    pacing_rate: Option<f64>,
    /// This ACK found BBR in PROBE_RTT ([`CongestionControl::marks_app_limited`]).
    in_probe_rtt: bool,
    rng: ChaCha8Rng,
}

impl Bbr {
    pub fn new(seed: u64) -> Self {
        Bbr {
            mode: BbrMode::Startup,
            bw_filter: VecDeque::new(),
            min_rtt: None,
            min_rtt_stamp: Duration::ZERO,
            round: 0,
            next_round_delivered: 0,
            round_start: false,
            full_bw: 0.0,
            full_bw_count: 0,
            filled_pipe: false,
            pacing_gain: BBR_HIGH_GAIN,
            cwnd_gain: BBR_HIGH_GAIN,
            cycle_index: 0,
            cycle_stamp: Duration::ZERO,
            probe_rtt_done: None,
            probe_rtt_round_done: false,
            prior_cwnd: 0,
            packet_conservation: false,
            cwnd: INIT_CWND as u64,
            pacing_rate: None,
            in_probe_rtt: false,
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0xbb),
        }
    }

    fn btl_bw(&self) -> f64 {
        self.bw_filter.front().map_or(0.0, |&(_, b)| b)
    }

    /// `gain` times the estimated bandwidth-delay product, segments.
    fn inflight(&self, gain: f64) -> f64 {
        match self.min_rtt {
            Some(rtt) if self.btl_bw() > 0.0 => gain * self.btl_bw() * rtt.as_secs_f64(),
            _ => INIT_CWND,
        }
    }

    fn update_round(&mut self, ack: &Ack) {
        self.round_start = false;
        if let Some(rs) = ack.rate {
            if rs.prior_delivered >= self.next_round_delivered {
                self.next_round_delivered = ack.delivered;
                self.round += 1;
                self.round_start = true;
                self.packet_conservation = false;
            }
        }
    }

    fn update_bw(&mut self, ack: &Ack) {
        let Some(rs) = ack.rate else {
            return;
        };
        let bw = rs.rate();
        // As Linux: an application-limited sample (PROBE_RTT's) counts only if it is a new
        // maximum. Taking PROBE_RTT's samples let the pre-PROBE_RTT maximum age out of the
        // 10-round window during PROBE_RTT's 200 ms (ten rounds at a 20 ms round trip), and the
        // flow climbed back from PROBE_RTT's four segments by 1.25x per gain cycle: about 2 s
        // at a fraction of the rate after every PROBE_RTT.
        if rs.is_app_limited && bw < self.btl_bw() {
            return;
        }
        while self.bw_filter.back().is_some_and(|&(_, b)| b <= bw) {
            self.bw_filter.pop_back();
        }
        self.bw_filter.push_back((self.round, bw));
        while self
            .bw_filter
            .front()
            .is_some_and(|&(r, _)| r + BBR_BW_ROUNDS <= self.round)
        {
            self.bw_filter.pop_front();
        }
    }

    fn update_gain_cycle(&mut self, now: Duration, ack: &Ack) {
        if self.mode != BbrMode::ProbeBw {
            return;
        }
        let full_length = self
            .min_rtt
            .is_some_and(|rtt| now.saturating_sub(self.cycle_stamp) > rtt);
        let next = if self.pacing_gain > 1.0 {
            full_length
                && (ack.lost > 0 || ack.prior_in_flight as f64 >= self.inflight(self.pacing_gain))
        } else if self.pacing_gain < 1.0 {
            full_length || ack.prior_in_flight as f64 <= self.inflight(1.0)
        } else {
            full_length
        };
        if next {
            self.cycle_index = (self.cycle_index + 1) % BBR_CYCLE.len();
            self.cycle_stamp = now;
            self.pacing_gain = BBR_CYCLE[self.cycle_index];
        }
    }

    fn enter_probe_bw(&mut self, now: Duration) {
        self.mode = BbrMode::ProbeBw;
        self.cwnd_gain = 2.0;
        // A random phase, never the draining one.
        let r = (self.rng.next_u32() as usize) % (BBR_CYCLE.len() - 1);
        self.cycle_index = if r >= 1 { r + 1 } else { r };
        self.cycle_stamp = now;
        self.pacing_gain = BBR_CYCLE[self.cycle_index];
    }

    fn check_full_pipe(&mut self) {
        if self.filled_pipe || !self.round_start {
            return;
        }
        let bw = self.btl_bw();
        if bw >= self.full_bw * 1.25 {
            self.full_bw = bw;
            self.full_bw_count = 0;
            return;
        }
        self.full_bw_count += 1;
        self.filled_pipe = self.full_bw_count >= 3;
    }

    fn check_drain(&mut self, now: Duration, ack: &Ack) {
        if self.mode == BbrMode::Startup && self.filled_pipe {
            self.mode = BbrMode::Drain;
            self.pacing_gain = 1.0 / BBR_HIGH_GAIN;
            self.cwnd_gain = BBR_HIGH_GAIN;
        }
        if self.mode == BbrMode::Drain && ack.in_flight as f64 <= self.inflight(1.0) {
            self.enter_probe_bw(now);
        }
    }

    fn update_min_rtt(&mut self, now: Duration, ack: &Ack) {
        let expired = now > self.min_rtt_stamp + BBR_MIN_RTT_WIN;
        if let Some(rtt) = ack.rtt {
            if self.min_rtt.is_none_or(|m| rtt <= m) || expired {
                self.min_rtt = Some(rtt);
                self.min_rtt_stamp = now;
            }
        }
        if expired && self.mode != BbrMode::ProbeRtt {
            self.mode = BbrMode::ProbeRtt;
            self.pacing_gain = 1.0;
            self.cwnd_gain = 1.0;
            self.prior_cwnd = self.prior_cwnd.max(self.cwnd);
            self.probe_rtt_done = None;
        }
        if self.mode != BbrMode::ProbeRtt {
            return;
        }
        self.in_probe_rtt = true;
        match self.probe_rtt_done {
            None if ack.in_flight <= BBR_MIN_CWND => {
                self.probe_rtt_done = Some(now + BBR_PROBE_RTT_TIME);
                self.probe_rtt_round_done = false;
                self.next_round_delivered = ack.delivered;
            }
            None => {}
            Some(done) => {
                if self.round_start {
                    self.probe_rtt_round_done = true;
                }
                if self.probe_rtt_round_done && now >= done {
                    self.min_rtt_stamp = now;
                    self.cwnd = self.cwnd.max(self.prior_cwnd);
                    self.prior_cwnd = 0;
                    if self.filled_pipe {
                        self.enter_probe_bw(now);
                    } else {
                        self.mode = BbrMode::Startup;
                        self.pacing_gain = BBR_HIGH_GAIN;
                        self.cwnd_gain = BBR_HIGH_GAIN;
                    }
                }
            }
        }
    }

    fn set_pacing_rate(&mut self) {
        let bw = self.btl_bw();
        if bw <= 0.0 {
            // No sample yet: the initial window over the first RTT, at high gain.
            if let Some(rtt) = self.min_rtt {
                self.pacing_rate = Some(BBR_HIGH_GAIN * INIT_CWND / rtt.as_secs_f64());
            }
            return;
        }
        let rate = self.pacing_gain * bw * BBR_PACING_MARGIN;
        if self.filled_pipe || self.pacing_rate.is_none_or(|r| rate > r) {
            self.pacing_rate = Some(rate);
        }
    }

    fn set_cwnd(&mut self, ack: &Ack) {
        // Quantisation budget: three segments, two more while probing up.
        let mut target = self.inflight(self.cwnd_gain).ceil() as u64 + 3;
        if self.mode == BbrMode::ProbeBw && self.pacing_gain > 1.0 {
            target += 2;
        }
        if self.packet_conservation {
            self.cwnd = self.cwnd.max(ack.in_flight + ack.acked);
        } else if self.filled_pipe {
            self.cwnd = (self.cwnd + ack.acked).min(target);
        } else if self.cwnd < target || ack.delivered < INIT_CWND as u64 {
            self.cwnd += ack.acked;
        }
        self.cwnd = self.cwnd.max(BBR_MIN_CWND);
        if self.mode == BbrMode::ProbeRtt {
            self.cwnd = self.cwnd.min(BBR_MIN_CWND);
        }
    }
}

impl CongestionControl for Bbr {
    fn on_ack(&mut self, now: Duration, ack: &Ack) {
        self.in_probe_rtt = false;
        self.update_round(ack);
        self.update_bw(ack);
        self.update_gain_cycle(now, ack);
        self.check_full_pipe();
        self.check_drain(now, ack);
        self.update_min_rtt(now, ack);
        self.set_pacing_rate();
        self.set_cwnd(ack);
    }

    fn on_recovery_start(&mut self, _now: Duration, in_flight: u64) {
        self.prior_cwnd = self.cwnd;
        self.cwnd = in_flight.max(1);
        self.packet_conservation = true;
    }

    fn on_recovery_end(&mut self, _now: Duration) {
        self.cwnd = self.cwnd.max(self.prior_cwnd);
        self.prior_cwnd = 0;
        self.packet_conservation = false;
    }

    fn on_rto(&mut self, _now: Duration) {
        self.prior_cwnd = self.prior_cwnd.max(self.cwnd);
        self.cwnd = 1;
        self.packet_conservation = false;
    }

    fn cwnd(&self) -> u64 {
        self.cwnd
    }

    fn pacing_rate(&self) -> Option<f64> {
        self.pacing_rate
    }

    fn marks_app_limited(&self) -> bool {
        self.in_probe_rtt
    }
}
