//! Link health: keepalive probes, RTT (RFC 6298), loss, delivery rate, one-way-delay signals and the
//! UP / DEGRADED / DOWN state machine with hysteresis. (Skeleton: signatures are the contract.)
//!
//! One `LinkHealth` per link per endpoint. It watches both directions of its link:
//! - as a sender: probes it sends, acks it gets back (RTT, and the peer's report of what arrived:
//!   loss, delivery rate, queueing delay, one-way-delay offset);
//! - as a receiver: sealed packets that arrive on the link (liveness, per-link counters and one-way
//!   delay samples that go into the acks this endpoint sends).

use std::time::{Duration, Instant};

use crate::wire::{Common, ProbeAckRepr};

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
        todo!()
    }
}

pub struct LinkHealth {}

impl LinkHealth {
    /// A new link starts DOWN: it has to prove itself with `rise` answered probes.
    pub fn new(cfg: HealthConfig, now: Instant) -> Self {
        todo!()
    }

    // ----- sender side -----

    /// When this link's next probe is due.
    pub fn next_probe_at(&self) -> Instant {
        todo!()
    }
    /// Records a probe just sent (so its ack gives an RTT sample).
    pub fn on_probe_sent(&mut self, now: Instant, probe_id: u32) {
        todo!()
    }
    /// Records any sealed packet sent on this link (bytes = datagram length).
    pub fn on_packet_sent(&mut self, now: Instant, link_seq: u32, bytes: usize) {
        todo!()
    }
    /// An ack for one of our probes: RTT sample (minus `hold_us`), and the peer's report.
    /// Returns the new state if it changed.
    pub fn on_probe_ack(&mut self, now: Instant, ack: &ProbeAckRepr) -> Option<LinkState> {
        todo!()
    }

    // ----- receiver side -----

    /// Any sealed, authenticated packet that arrived on this link. `local_ts` is this endpoint's
    /// own clock in the wire's units (microseconds, wrapping) at arrival.
    pub fn on_packet_received(&mut self, now: Instant, common: &Common, bytes: usize, local_ts: u32) {
        todo!()
    }
    /// Fills the receiver-report fields of an ack (`rx_link_seq_max`, `rx_packets`, `rx_bytes`,
    /// `qdelay_us`). `owd_offset_us` is left to the endpoint, which sees every link.
    pub fn fill_report(&self, now: Instant, ack: &mut ProbeAckRepr) {
        todo!()
    }
    /// Windowed minimum of `local_ts - send_ts` (wrapping microseconds) over recent arrivals: the
    /// link's base one-way delay plus the (unknown, shared by all links) clock offset. Compare
    /// links with `wrapping_sub` as i32.
    pub fn base_rel_owd(&self) -> Option<u32> {
        todo!()
    }

    // ----- timers -----

    /// Earliest instant at which `handle_timeout` has something to do (next probe or down deadline).
    pub fn poll_timeout(&self) -> Instant {
        todo!()
    }
    /// Returns the new state if it changed (e.g. acks stopped: DOWN).
    pub fn handle_timeout(&mut self, now: Instant) -> Option<LinkState> {
        todo!()
    }

    // ----- readings -----

    pub fn state(&self) -> LinkState {
        todo!()
    }
    pub fn srtt(&self) -> Option<Duration> {
        todo!()
    }
    pub fn rttvar(&self) -> Option<Duration> {
        todo!()
    }
    /// Lowest RTT seen over a recent window (path delay without queueing).
    pub fn min_rtt(&self) -> Option<Duration> {
        todo!()
    }
    /// Recent loss fraction of our packets on this link, from the peer's reports (0..1).
    pub fn loss(&self) -> f64 {
        todo!()
    }
    /// Recent rate at which our packets arrived at the peer on this link, bits per second
    /// (0 when unknown).
    pub fn delivery_rate_bps(&self) -> f64 {
        todo!()
    }
    /// Queueing delay the peer last reported for this link.
    pub fn qdelay(&self) -> Duration {
        todo!()
    }
    /// This link's base one-way delay minus the peer's fastest link's, as the peer last reported.
    pub fn owd_offset(&self) -> Duration {
        todo!()
    }
    /// When an authenticated packet last arrived on this link.
    pub fn last_rx(&self) -> Option<Instant> {
        todo!()
    }
}
