//! Token buckets for the server's HELLO-ACKs: one global, and one per source address (hashed
//! into a fixed table), so a flood of replayed HELLOs from forged addresses cannot make the
//! server spend its CPU sealing answers or reflect more than a trickle at any victim.
//!
//! The per-source table has a fixed number of slots indexed by a keyed hash of the source IP
//! address (not the port: one host, one budget). Two addresses that share a slot share a budget;
//! memory is constant whatever the number of sources, and the key (random per endpoint) keeps an
//! attacker from choosing addresses that land on a genuine client's slot.

use std::hash::{Hash, Hasher};
use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

/// A token bucket: `burst` tokens at most, refilled at `rate` tokens per second.
#[derive(Debug, Clone, Copy)]
pub struct TokenBucket {
    tokens: f64,
    last: Option<Instant>,
}

impl TokenBucket {
    pub const fn new() -> Self {
        TokenBucket {
            tokens: 0.0,
            last: None,
        }
    }

    /// Takes one token if there is one (a fresh bucket is full).
    pub fn take(&mut self, now: Instant, rate: f64, burst: f64) -> bool {
        self.tokens = match self.last {
            None => burst,
            Some(t) => {
                let dt = now.saturating_duration_since(t).as_secs_f64();
                (self.tokens + dt * rate).min(burst)
            }
        };
        self.last = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

impl Default for TokenBucket {
    fn default() -> Self {
        Self::new()
    }
}

/// HELLO-ACKs per second the server sends at most, all sources together.
pub const GLOBAL_RATE: f64 = 200.0;
/// ... and in one burst.
pub const GLOBAL_BURST: f64 = 200.0;
/// HELLO-ACKs per second to one source IP address. A client repeats its HELLO on every link
/// every `hello_interval` (250 ms) until answered: 16 covers 4 links behind one address.
pub const SOURCE_RATE: f64 = 16.0;
pub const SOURCE_BURST: f64 = 16.0;
/// Slots of the per-source table (24 bytes each).
pub const SOURCE_SLOTS: usize = 1024;

/// The HELLO-ACK budget: global and per source.
pub struct AckLimiter {
    global: TokenBucket,
    sources: Box<[TokenBucket]>,
    key: (u64, u64),
}

impl std::fmt::Debug for AckLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AckLimiter").finish_non_exhaustive()
    }
}

impl AckLimiter {
    /// `key`: random bytes for the slot hash.
    pub fn new(key: (u64, u64)) -> Self {
        AckLimiter {
            global: TokenBucket::new(),
            sources: vec![TokenBucket::new(); SOURCE_SLOTS].into_boxed_slice(),
            key,
        }
    }

    fn slot(&self, ip: IpAddr) -> usize {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.key.0.hash(&mut h);
        ip.hash(&mut h);
        self.key.1.hash(&mut h);
        (h.finish() % SOURCE_SLOTS as u64) as usize
    }

    /// May a HELLO-ACK go to `to` now? Takes a token from its source's bucket, then (only if
    /// that one had one) from the global bucket, so a single noisy source cannot drain the global
    /// budget beyond its own share.
    pub fn allow(&mut self, now: Instant, to: SocketAddr) -> bool {
        let i = self.slot(to.ip());
        self.sources[i].take(now, SOURCE_RATE, SOURCE_BURST)
            && self.global.take(now, GLOBAL_RATE, GLOBAL_BURST)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn addr(i: u32) -> SocketAddr {
        SocketAddr::new(
            IpAddr::V4(std::net::Ipv4Addr::from(0xc612_0000 | i)),
            40_000,
        )
    }

    #[test]
    fn bucket_bursts_then_refills() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new();
        for _ in 0..5 {
            assert!(b.take(t0, 10.0, 5.0));
        }
        assert!(!b.take(t0, 10.0, 5.0));
        assert!(b.take(t0 + Duration::from_millis(100), 10.0, 5.0));
        assert!(!b.take(t0 + Duration::from_millis(100), 10.0, 5.0));
        // Never above the burst, however long the pause.
        let later = t0 + Duration::from_secs(3600);
        for _ in 0..5 {
            assert!(b.take(later, 10.0, 5.0));
        }
        assert!(!b.take(later, 10.0, 5.0));
    }

    #[test]
    fn one_source_gets_its_share_many_get_the_global_budget() {
        let t0 = Instant::now();
        let mut l = AckLimiter::new((1, 2));
        let one = (0..1000).filter(|_| l.allow(t0, addr(1))).count();
        assert_eq!(one, SOURCE_BURST as usize);
        // The same host on another port shares the budget.
        assert!(!l.allow(t0, SocketAddr::new(addr(1).ip(), 1)));
        // Many sources together: the global bucket caps them.
        let mut l = AckLimiter::new((1, 2));
        let many = (0..100_000).filter(|&i| l.allow(t0, addr(i))).count();
        assert_eq!(many, GLOBAL_BURST as usize);
        // One second later, at most a second's worth again.
        let t1 = t0 + Duration::from_secs(1);
        let again = (100_000..200_000).filter(|&i| l.allow(t1, addr(i))).count();
        assert!(again <= GLOBAL_RATE as usize, "{again}");
    }
}
