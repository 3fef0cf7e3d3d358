//! Path MTU discovery for one link, the datagram way (RFC 8899, DPLPMTUD): the link sends probes of
//! a chosen size with the Don't Fragment bit set (braid's PROBE carries padding for this) and a
//! size counts as working only once a probe of that size is acknowledged. ICMP "fragmentation
//! needed" / "packet too big" messages, which the kernel reports on the link's socket, lower the
//! size at once but never raise it (RFC 8899 §4.6.2: a forged message must not make the link send
//! what the path drops).
//!
//! Sizes here are braid datagram sizes: the UDP payload one link can carry unfragmented.
//!
//! The search: first the largest size the first hop allows (most paths are as wide as their first
//! hop, so one probe usually settles it), then a binary search between the largest acknowledged size
//! and the smallest size known to fail, down to [`Config::granularity`]. A size fails when
//! [`Config::max_probes`] probes of it go unanswered. Once settled, the search starts again every
//! [`Config::raise_interval`] (a path may have grown), after first confirming the current size: if
//! that fails too, the path has become a black hole at this size and the link falls back to
//! [`Config::base`] and searches from there.

use std::time::{Duration, Instant};

/// Parameters of the search.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// A size every path is assumed to carry (the search never goes below it).
    pub base: usize,
    /// The largest size the first hop allows (interface MTU minus IP and UDP headers).
    pub max: usize,
    /// Search until the window between working and failing sizes is this small.
    pub granularity: usize,
    /// Unanswered probes of one size before that size counts as failing.
    pub max_probes: u8,
    /// How long to wait for a probe's answer.
    pub probe_timeout: Duration,
    /// How often to search again once settled.
    pub raise_interval: Duration,
}

impl Config {
    /// Defaults for a link whose first hop allows `max` bytes: base 1252 (an IPv6 minimum MTU of
    /// 1280 minus 28 bytes of IPv4 and UDP headers, what any sane path carries), granularity 8,
    /// 3 probes, 1 s timeout, 10 minutes between searches (RFC 8899's suggestion).
    pub fn for_max(max: usize) -> Config {
        Config {
            base: 1252.min(max),
            max,
            granularity: 8,
            max_probes: 3,
            probe_timeout: Duration::from_secs(1),
            raise_interval: Duration::from_secs(600),
        }
    }
}

/// Where the search stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Looking for a bigger size.
    Searching,
    /// Settled; the next search at the given time.
    Settled { next: Instant },
    /// Probing the current size again before a new search (black-hole check).
    Confirming,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Probe {
    size: usize,
    sent: Instant,
    tries: u8,
}

/// The path MTU state of one link.
#[derive(Clone, Debug)]
pub struct PathMtu {
    cfg: Config,
    /// The largest size known to work.
    mtu: usize,
    /// The smallest size known (or told by ICMP) not to work; `cfg.max + 1` when none is.
    fails: usize,
    phase: Phase,
    probe: Option<Probe>,
}

impl PathMtu {
    /// Starts searching at once, from `cfg.base`.
    pub fn new(cfg: Config) -> PathMtu {
        PathMtu {
            cfg,
            mtu: cfg.base,
            fails: cfg.max + 1,
            phase: Phase::Searching,
            probe: None,
        }
    }

    /// The largest datagram this link can send now.
    pub fn mtu(&self) -> usize {
        self.mtu
    }

    /// The parameters it searches with.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The size of a probe to send now, if one is due (a first probe, a retry after a timeout, or
    /// the next step of the search). The caller sends a PROBE padded to this size with DF set.
    pub fn poll_probe(&mut self, now: Instant) -> Option<usize> {
        if let Phase::Settled { next } = self.phase {
            if now < next {
                return None;
            }
            self.phase = Phase::Confirming;
        }
        match self.probe {
            Some(p) if now.saturating_duration_since(p.sent) < self.cfg.probe_timeout => None,
            Some(p) if p.tries < self.cfg.max_probes => {
                self.probe = Some(Probe {
                    sent: now,
                    tries: p.tries + 1,
                    ..p
                });
                Some(p.size)
            }
            Some(p) => {
                self.failed(now, p.size);
                self.next_probe(now)
            }
            None => self.next_probe(now),
        }
    }

    /// A probe of `size` was acknowledged.
    pub fn on_probe_acked(&mut self, now: Instant, size: usize) {
        if self.probe.map(|p| p.size) != Some(size) {
            return;
        }
        self.probe = None;
        if self.phase == Phase::Confirming {
            // The current size still works: look for more.
            self.fails = self.cfg.max + 1;
            self.phase = Phase::Searching;
        }
        if size > self.mtu && size < self.fails {
            self.mtu = size;
        }
        self.settle_if_done(now);
    }

    /// The path reported (ICMP) that it carries at most `size` bytes of datagram. Lowers the MTU
    /// at once if needed; never raises it.
    pub fn on_too_big(&mut self, now: Instant, size: usize) {
        let size = size.max(self.cfg.base);
        if size >= self.fails {
            return;
        }
        self.fails = size + 1;
        if self.mtu > size {
            self.mtu = size;
        }
        if self.probe.is_some_and(|p| p.size > size) {
            self.probe = None;
        }
        self.settle_if_done(now);
    }

    fn failed(&mut self, now: Instant, size: usize) {
        self.probe = None;
        if self.phase == Phase::Confirming || size <= self.mtu {
            // Even the current size is dropped: a black hole. Start over from the base.
            self.mtu = self.cfg.base;
            self.fails = size.max(self.cfg.base + 1);
            self.phase = Phase::Searching;
        } else {
            self.fails = self.fails.min(size);
        }
        self.settle_if_done(now);
    }

    fn next_probe(&mut self, now: Instant) -> Option<usize> {
        let size = match self.phase {
            Phase::Confirming => self.mtu,
            Phase::Settled { .. } => return None,
            // The first hop's size first, then halves.
            Phase::Searching if self.fails == self.cfg.max + 1 => self.cfg.max,
            Phase::Searching => self.mtu + (self.fails - self.mtu) / 2,
        };
        self.probe = Some(Probe {
            size,
            sent: now,
            tries: 1,
        });
        Some(size)
    }

    fn settle_if_done(&mut self, now: Instant) {
        if self.phase == Phase::Searching
            && (self.mtu >= self.cfg.max || self.fails - self.mtu <= self.cfg.granularity)
        {
            self.probe = None;
            self.phase = Phase::Settled {
                next: now + self.cfg.raise_interval,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the search against a path that carries `path` bytes (and answers every probe that
    /// fits at once). Returns the settled MTU and the time it took.
    fn search(pm: &mut PathMtu, mut now: Instant, path: usize) -> (usize, Duration) {
        let start = now;
        for _ in 0..1000 {
            if let Some(size) = pm.poll_probe(now) {
                if size <= path {
                    pm.on_probe_acked(now, size);
                }
            }
            if let Phase::Settled { .. } = pm.phase() {
                return (pm.mtu(), now - start);
            }
            now += Duration::from_millis(100);
        }
        panic!("search did not settle: {pm:?}");
    }

    #[test]
    fn a_path_as_wide_as_its_first_hop_settles_with_one_probe() {
        let now = Instant::now();
        let mut pm = PathMtu::new(Config::for_max(1472));
        let (mtu, took) = search(&mut pm, now, 1472);
        assert_eq!(mtu, 1472);
        assert!(took < Duration::from_millis(200), "{took:?}");
    }

    #[test]
    fn a_narrower_path_is_found_to_the_granularity() {
        let now = Instant::now();
        for path in [1252, 1300, 1400, 1452, 1464, 9000] {
            let mut pm = PathMtu::new(Config::for_max(9188));
            let (mtu, _) = search(&mut pm, now, path);
            assert!(mtu <= path && path - mtu < 8, "path {path}: found {mtu}");
        }
    }

    #[test]
    fn icmp_lowers_at_once_and_never_raises() {
        let now = Instant::now();
        let mut pm = PathMtu::new(Config::for_max(1472));
        search(&mut pm, now, 1472);
        pm.on_too_big(now, 9000);
        assert_eq!(pm.mtu(), 1472);
        pm.on_too_big(now, 1400);
        assert_eq!(pm.mtu(), 1400);
        pm.on_too_big(now, 100); // never below the base
        assert_eq!(pm.mtu(), 1252);
    }

    #[test]
    fn the_search_runs_again_and_a_black_hole_falls_back_to_base() {
        let now = Instant::now();
        let cfg = Config::for_max(1472);
        let mut pm = PathMtu::new(cfg);
        let (_, took) = search(&mut pm, now, 1472);
        let later = now + took + cfg.raise_interval;
        // The path narrowed to 1400 without telling: the 1472 confirmation goes unanswered.
        let (mtu, _) = search(&mut pm, later, 1400);
        assert!(mtu <= 1400 && 1400 - mtu < 8, "{mtu}");
        // And it widened again: the next search finds it.
        let next = match pm.phase() {
            Phase::Settled { next } => next,
            p => panic!("{p:?}"),
        };
        let (mtu, _) = search(&mut pm, next, 1472);
        assert_eq!(mtu, 1472);
    }

    #[test]
    fn stale_acks_change_nothing() {
        let now = Instant::now();
        let mut pm = PathMtu::new(Config::for_max(1472));
        assert_eq!(pm.poll_probe(now), Some(1472));
        pm.on_probe_acked(now, 1400);
        assert_eq!(pm.mtu(), 1252);
    }
}
