//! The receiver's reorder buffer. (Skeleton: signatures are the contract.)

use std::time::{Duration, Instant};

use crate::LinkId;

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
        todo!()
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
}

pub struct ReorderBuffer {}

impl ReorderBuffer {
    pub fn new(cfg: ReorderConfig) -> Self {
        todo!()
    }
    /// A packet with bundle sequence `seq` arrived on `link`.
    pub fn push(&mut self, now: Instant, seq: u64, link: LinkId, packet: Vec<u8>) -> Pushed {
        todo!()
    }
    /// Sets the hold timeout (clamped to the configured bounds).
    pub fn set_timeout(&mut self, timeout: Duration) {
        todo!()
    }
    /// The links that currently carry data; a gap that every one of them has passed is lost.
    pub fn set_links(&mut self, links: &[LinkId]) {
        todo!()
    }
    /// Next packet to deliver, in order.
    pub fn pop(&mut self, now: Instant) -> Option<Vec<u8>> {
        todo!()
    }
    /// When the head-of-line gap's wait runs out (call `pop` then).
    pub fn poll_timeout(&self) -> Option<Instant> {
        todo!()
    }
    /// Starts over (new session): the next sequence expected is `next`.
    pub fn reset(&mut self, next: u64) {
        todo!()
    }
    pub fn depth(&self) -> usize {
        todo!()
    }
    pub fn stats(&self) -> &ReorderStats {
        todo!()
    }
    /// Percentile (0..=100) of the time packets waited in the buffer, over all delivered so far.
    pub fn wait_percentile(&self, p: f64) -> Duration {
        todo!()
    }
}
