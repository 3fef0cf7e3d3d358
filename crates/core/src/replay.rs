//! Anti-replay window (RFC 6479 style). (Skeleton: signatures are the contract.)

/// Packets whose counter is this far or more behind the highest seen are rejected.
pub const WINDOW: u64 = 8192;

pub struct ReplayWindow {}

impl ReplayWindow {
    pub fn new() -> Self {
        todo!()
    }
    /// Cheap pre-check before decrypting: would `counter` be accepted?
    pub fn check(&self, counter: u64) -> bool {
        todo!()
    }
    /// Marks `counter` as seen (call only after authentication). Returns false if it was a replay
    /// or too old.
    pub fn update(&mut self, counter: u64) -> bool {
        todo!()
    }
}
