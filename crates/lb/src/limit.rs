//! Admission limits of a proxy listener: at most `max_total` connections (or UDP sessions) at
//! once, and at most `max_per_source` from one client address. No I/O: the runtime asks
//! [`ConnLimiter::try_admit`] before it spends descriptors on a client and calls
//! [`ConnLimiter::release`] when the client is gone.
//!
//! What happens on a refusal is the runtime's policy (proxy TCP: close the longest-idle
//! connection or stop accepting for a moment; UDP: evict the least recently used session, or drop
//! the datagram when the client is over its own limit).

use std::collections::HashMap;
use std::net::IpAddr;

/// Why a client was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The listener holds `max_total` clients.
    Full,
    /// This client address already holds `max_per_source`.
    PerSource,
}

/// Counts admitted clients, in total and per source address.
#[derive(Debug, Clone)]
pub struct ConnLimiter {
    max_total: usize,
    max_per_source: Option<u32>,
    total: usize,
    per_source: HashMap<IpAddr, u32>,
}

impl ConnLimiter {
    /// `max_total` >= 1; `max_per_source`: `None` for no per-source limit.
    pub fn new(max_total: usize, max_per_source: Option<u32>) -> Self {
        ConnLimiter {
            max_total: max_total.max(1),
            max_per_source: max_per_source.map(|n| n.max(1)),
            total: 0,
            per_source: HashMap::new(),
        }
    }

    /// Admits a client from `src` if both limits allow it.
    pub fn try_admit(&mut self, src: IpAddr) -> Result<(), Refused> {
        let mine = self.per_source.get(&src).copied().unwrap_or(0);
        if self.max_per_source.is_some_and(|m| mine >= m) {
            return Err(Refused::PerSource);
        }
        if self.total >= self.max_total {
            return Err(Refused::Full);
        }
        self.admit(src);
        Ok(())
    }

    /// Admits a client over the total limit (the runtime has just closed another one to make
    /// room; its release may come a moment later). The per-source limit still holds.
    pub fn admit_replacing(&mut self, src: IpAddr) -> Result<(), Refused> {
        let mine = self.per_source.get(&src).copied().unwrap_or(0);
        if self.max_per_source.is_some_and(|m| mine >= m) {
            return Err(Refused::PerSource);
        }
        self.admit(src);
        Ok(())
    }

    fn admit(&mut self, src: IpAddr) {
        self.total += 1;
        *self.per_source.entry(src).or_insert(0) += 1;
    }

    /// A client admitted earlier is gone.
    pub fn release(&mut self, src: IpAddr) {
        if let Some(n) = self.per_source.get_mut(&src) {
            *n -= 1;
            if *n == 0 {
                self.per_source.remove(&src);
            }
            self.total = self.total.saturating_sub(1);
        }
    }

    /// Whether a new client would be refused for [`Refused::Full`].
    pub fn is_full(&self) -> bool {
        self.total >= self.max_total
    }

    /// Clients admitted now.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Clients admitted now from `src`.
    pub fn from_source(&self, src: IpAddr) -> u32 {
        self.per_source.get(&src).copied().unwrap_or(0)
    }

    pub fn max_total(&self) -> usize {
        self.max_total
    }

    pub fn max_per_source(&self) -> Option<u32> {
        self.max_per_source
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(i: u8) -> IpAddr {
        IpAddr::from([198, 18, 0, i])
    }

    #[test]
    fn total_and_per_source_limits() {
        let mut l = ConnLimiter::new(5, Some(2));
        assert_eq!(l.try_admit(ip(1)), Ok(()));
        assert_eq!(l.try_admit(ip(1)), Ok(()));
        assert_eq!(l.try_admit(ip(1)), Err(Refused::PerSource));
        assert_eq!(l.admit_replacing(ip(1)), Err(Refused::PerSource));
        for i in 2..=4 {
            assert_eq!(l.try_admit(ip(i)), Ok(()));
        }
        assert!(l.is_full());
        assert_eq!(l.try_admit(ip(9)), Err(Refused::Full));
        // One client left: room for exactly one more.
        l.release(ip(1));
        assert_eq!(l.from_source(ip(1)), 1);
        assert_eq!(l.try_admit(ip(9)), Ok(()));
        assert_eq!(l.try_admit(ip(10)), Err(Refused::Full));
        assert_eq!(l.admit_replacing(ip(10)), Ok(()));
        assert_eq!(l.total(), 6);
    }

    #[test]
    fn release_of_an_unknown_source_changes_nothing() {
        let mut l = ConnLimiter::new(1, None);
        l.release(ip(1));
        assert_eq!(l.try_admit(ip(1)), Ok(()));
        l.release(ip(2));
        assert_eq!(l.total(), 1);
        l.release(ip(1));
        l.release(ip(1));
        assert_eq!((l.total(), l.from_source(ip(1))), (0, 0));
        // Without a per-source limit one address may take everything.
        let mut l = ConnLimiter::new(3, None);
        for _ in 0..3 {
            assert_eq!(l.try_admit(ip(1)), Ok(()));
        }
        assert_eq!(l.try_admit(ip(1)), Err(Refused::Full));
    }
}
