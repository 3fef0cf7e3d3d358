//! Schedulers: which link(s) carry the next packet. One trait, selectable by name.
//! (Skeleton: signatures are the contract.)

use std::time::{Duration, Instant};

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
}

pub trait Scheduler: Send {
    fn name(&self) -> &'static str;
    /// False when the receiver need not reorder (each flow stays on one link).
    fn ordered(&self) -> bool {
        true
    }
    /// Appends to `out` the link(s) that carry one packet of `len` bytes of flow `flow`.
    /// `links` is never empty; it holds the usable links (UP or DEGRADED), or every link when none
    /// is usable. Implementations account the packet to the chosen link(s) themselves.
    fn pick(&mut self, now: Instant, len: usize, flow: u64, links: &[LinkView], out: &mut Vec<LinkId>);
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown scheduler {0:?} (expected one of: round-robin, weighted, adaptive, flow-hash, redundant, backup)")]
pub struct UnknownScheduler(pub String);

pub const NAMES: &[&str] = &["round-robin", "weighted", "adaptive", "flow-hash", "redundant", "backup"];

pub fn by_name(name: &str) -> Result<Box<dyn Scheduler>, UnknownScheduler> {
    todo!()
}
