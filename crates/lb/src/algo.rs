//! Backend selection algorithms behind one type, [`Selector`], chosen by name ([`Algorithm`]).
//!
//! - `round-robin`: eligible backends in turn, weights ignored.
//! - `weighted`: smooth weighted round robin as in nginx (each pick: every backend's `current +=
//!   weight`, pick the largest, subtract the total from it): a weight-3 backend gets 3 of every
//!   `sum(weights)` picks, interleaved rather than in bursts.
//! - `least-connections`: fewest active connections per unit of weight (`active / weight`), ties
//!   broken in turn.
//! - `source-hash`: weighted rendezvous (highest random weight) hashing over the client address, so
//!   one client always lands on the same backend and a backend change moves only its own clients.
//! - `maglev`: the Maglev table ([`crate::maglev`]) over the flow hash (5-tuple; a caller wanting
//!   client affinity passes the client hash as the flow hash).

use std::fmt;
use std::str::FromStr;

use crate::hash::{combine, fmix64, hash_bytes, SEED_RENDEZVOUS};
use crate::maglev::{Maglev, MaglevBackend, MaglevError, DEFAULT_TABLE_SIZE};

/// A selection algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    RoundRobin,
    Weighted,
    LeastConnections,
    SourceHash,
    Maglev,
}

impl Algorithm {
    /// Every algorithm, in documentation order.
    pub const ALL: [Algorithm; 5] = [
        Algorithm::RoundRobin,
        Algorithm::Weighted,
        Algorithm::LeastConnections,
        Algorithm::SourceHash,
        Algorithm::Maglev,
    ];

    /// The configuration name.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::RoundRobin => "round-robin",
            Algorithm::Weighted => "weighted",
            Algorithm::LeastConnections => "least-connections",
            Algorithm::SourceHash => "source-hash",
            Algorithm::Maglev => "maglev",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown algorithm name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown algorithm {0:?} (expected one of: round-robin, weighted, least-connections, source-hash, maglev)")]
pub struct UnknownAlgorithm(pub String);

impl FromStr for Algorithm {
    type Err = UnknownAlgorithm;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| UnknownAlgorithm(s.to_string()))
    }
}

/// What the selector knows of one backend.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    /// Stable name (the address): the key of the hashing algorithms.
    pub name: &'a [u8],
    pub weight: u32,
    /// Active connections (least-connections).
    pub active: u64,
    /// Up and not draining: may take new flows.
    pub eligible: bool,
}

/// The keys of one pick.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PickKey {
    /// Hash of the flow ([`crate::flow::FlowKey::hash`]): Maglev's key.
    pub flow_hash: u64,
    /// Hash of the client address ([`crate::flow::client_hash`]): source hashing's key.
    pub client_hash: u64,
}

/// An algorithm plus its state. Call [`Selector::rebuild`] whenever the candidates' set, weights or
/// eligibility change (indices into the candidate slice must stay the same between rebuilds).
#[derive(Debug, Clone)]
pub struct Selector {
    algorithm: Algorithm,
    table_size: usize,
    next: usize,
    current: Vec<i64>,
    maglev: Option<Maglev>,
    name_hashes: Vec<u64>,
}

impl Selector {
    /// A selector; `table_size` is Maglev's (must be prime; ignored by the other algorithms).
    pub fn new(algorithm: Algorithm, table_size: usize) -> Result<Self, MaglevError> {
        if algorithm == Algorithm::Maglev {
            // Validate now rather than at the first rebuild.
            Maglev::new(table_size, &[])?;
        }
        Ok(Selector {
            algorithm,
            table_size,
            next: 0,
            current: Vec::new(),
            maglev: None,
            name_hashes: Vec::new(),
        })
    }

    /// A selector with Maglev's default table size.
    pub fn with_algorithm(algorithm: Algorithm) -> Self {
        Selector::new(algorithm, DEFAULT_TABLE_SIZE).expect("default table size is prime")
    }

    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The Maglev table, when the algorithm is Maglev and it has been built.
    pub fn maglev(&self) -> Option<&Maglev> {
        self.maglev.as_ref()
    }

    /// Recomputes the algorithm's state for a new candidate set.
    pub fn rebuild(&mut self, cands: &[Candidate<'_>]) {
        self.current = vec![0; cands.len()];
        self.name_hashes = cands
            .iter()
            .map(|c| hash_bytes(SEED_RENDEZVOUS, c.name))
            .collect();
        if self.algorithm == Algorithm::Maglev {
            let mb: Vec<MaglevBackend> = cands
                .iter()
                .map(|c| MaglevBackend {
                    name: c.name,
                    weight: if c.eligible { c.weight } else { 0 },
                })
                .collect();
            // Cannot fail: the size was validated and is larger than any sane backend count; if
            // it is not, fall back to no table (rendezvous below still picks).
            self.maglev = Maglev::new(self.table_size, &mb).ok();
        }
    }

    /// Picks an eligible backend not in `exclude` (the backends that already failed this client),
    /// or `None` if there is none.
    pub fn pick(
        &mut self,
        cands: &[Candidate<'_>],
        key: PickKey,
        exclude: &[usize],
    ) -> Option<usize> {
        if self.current.len() != cands.len() {
            self.rebuild(cands);
        }
        let ok = |i: usize| cands[i].eligible && cands[i].weight > 0 && !exclude.contains(&i);
        let n = cands.len();
        if n == 0 {
            return None;
        }
        match self.algorithm {
            Algorithm::RoundRobin => {
                for k in 0..n {
                    let i = (self.next + k) % n;
                    if ok(i) {
                        self.next = (i + 1) % n;
                        return Some(i);
                    }
                }
                None
            }
            Algorithm::Weighted => {
                let mut total = 0i64;
                let mut best: Option<usize> = None;
                for (i, c) in cands.iter().enumerate() {
                    if !ok(i) {
                        continue;
                    }
                    let w = i64::from(c.weight);
                    self.current[i] += w;
                    total += w;
                    if best.is_none_or(|b| self.current[i] > self.current[b]) {
                        best = Some(i);
                    }
                }
                let b = best?;
                self.current[b] -= total;
                Some(b)
            }
            Algorithm::LeastConnections => {
                let mut best: Option<usize> = None;
                for k in 0..n {
                    let i = (self.next + k) % n;
                    if !ok(i) {
                        continue;
                    }
                    // active_i / w_i < active_b / w_b, compared without division.
                    let better = match best {
                        None => true,
                        Some(b) => {
                            u128::from(cands[i].active) * u128::from(cands[b].weight)
                                < u128::from(cands[b].active) * u128::from(cands[i].weight)
                        }
                    };
                    if better {
                        best = Some(i);
                    }
                }
                if let Some(b) = best {
                    self.next = (b + 1) % n;
                }
                best
            }
            Algorithm::SourceHash => self.rendezvous(cands, key.client_hash, &ok),
            Algorithm::Maglev => {
                if let Some(m) = &self.maglev {
                    // Exclusions (retries) walk the flow hash on; the table holds only eligible
                    // backends, so a few probes find another one.
                    let mut h = key.flow_hash;
                    for attempt in 0..8u64 {
                        match m.lookup(h) {
                            Some(i) if i < n && ok(i) => return Some(i),
                            None => break,
                            _ => h = combine(key.flow_hash, attempt + 1),
                        }
                    }
                }
                self.rendezvous(cands, key.flow_hash, &ok)
            }
        }
    }

    /// Weighted rendezvous hashing: score = -w / ln(u) with u uniform in (0,1) from hash(key, name).
    fn rendezvous(
        &self,
        cands: &[Candidate<'_>],
        key: u64,
        ok: &dyn Fn(usize) -> bool,
    ) -> Option<usize> {
        let mut best: Option<(usize, f64)> = None;
        for (i, c) in cands.iter().enumerate() {
            if !ok(i) {
                continue;
            }
            let nh = self
                .name_hashes
                .get(i)
                .copied()
                .unwrap_or_else(|| hash_bytes(SEED_RENDEZVOUS, c.name));
            let h = fmix64(key ^ nh);
            let u = ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            let score = f64::from(c.weight) / -u.ln();
            if best.is_none_or(|(_, s)| score > s) {
                best = Some((i, score));
            }
        }
        best.map(|(i, _)| i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::{client_hash, FlowKey, PROTO_TCP};

    struct B {
        name: String,
        weight: u32,
        active: u64,
        eligible: bool,
    }

    fn backends(weights: &[u32]) -> Vec<B> {
        weights
            .iter()
            .enumerate()
            .map(|(i, &w)| B {
                name: format!("198.18.2.{}:80", i + 1),
                weight: w,
                active: 0,
                eligible: true,
            })
            .collect()
    }

    fn cands(bs: &[B]) -> Vec<Candidate<'_>> {
        bs.iter()
            .map(|b| Candidate {
                name: b.name.as_bytes(),
                weight: b.weight,
                active: b.active,
                eligible: b.eligible,
            })
            .collect()
    }

    fn key(i: u32) -> PickKey {
        let src = std::net::SocketAddr::new(
            std::net::IpAddr::V4((0xc612_0000u32 + i / 7).into()),
            1024 + (i % 7) as u16 * 1000,
        );
        let f = FlowKey::new(PROTO_TCP, src, "198.18.0.10:80".parse().unwrap());
        PickKey {
            flow_hash: f.hash(),
            client_hash: client_hash(src.ip()),
        }
    }

    fn distribution(algo: Algorithm, bs: &[B], picks: u32) -> Vec<u32> {
        let mut s = Selector::with_algorithm(algo);
        let c = cands(bs);
        s.rebuild(&c);
        let mut counts = vec![0u32; bs.len()];
        for i in 0..picks {
            counts[s.pick(&c, key(i), &[]).unwrap()] += 1;
        }
        counts
    }

    fn assert_shares(counts: &[u32], weights: &[u32], tol: f64) {
        let total: u32 = counts.iter().sum();
        let wsum: u32 = weights.iter().sum();
        for (c, w) in counts.iter().zip(weights) {
            let want = f64::from(total) * f64::from(*w) / f64::from(wsum);
            assert!(
                (f64::from(*c) - want).abs() <= want * tol + 1.0,
                "counts {counts:?} weights {weights:?}"
            );
        }
    }

    #[test]
    fn names_parse() {
        for a in Algorithm::ALL {
            assert_eq!(a.name().parse::<Algorithm>().unwrap(), a);
        }
        assert!("fastest"
            .parse::<Algorithm>()
            .unwrap_err()
            .to_string()
            .contains("round-robin"));
    }

    #[test]
    fn round_robin_is_exact_and_ignores_weights() {
        let bs = backends(&[1, 5, 1]);
        assert_eq!(
            distribution(Algorithm::RoundRobin, &bs, 300),
            vec![100, 100, 100]
        );
    }

    #[test]
    fn weighted_is_exact_and_smooth() {
        let bs = backends(&[5, 1, 1]);
        let mut s = Selector::with_algorithm(Algorithm::Weighted);
        let c = cands(&bs);
        let seq: Vec<usize> = (0..7).map(|i| s.pick(&c, key(i), &[]).unwrap()).collect();
        // nginx's documented sequence for weights 5,1,1: a a b a c a a.
        assert_eq!(seq, vec![0, 0, 1, 0, 2, 0, 0]);
        assert_eq!(
            distribution(Algorithm::Weighted, &backends(&[1, 2, 3]), 600),
            vec![100, 200, 300]
        );
    }

    #[test]
    fn least_connections_weighted() {
        let mut bs = backends(&[1, 1, 2]);
        bs[0].active = 5;
        bs[1].active = 1;
        bs[2].active = 3; // 1.5 per weight
        let mut s = Selector::with_algorithm(Algorithm::LeastConnections);
        assert_eq!(s.pick(&cands(&bs), key(0), &[]), Some(1));
        // Simulate connections that never close: counts converge to the weights.
        let mut bs = backends(&[1, 1, 2]);
        for i in 0..400 {
            let c = cands(&bs);
            let p = s.pick(&c, key(i), &[]).unwrap();
            bs[p].active += 1;
        }
        let act: Vec<u64> = bs.iter().map(|b| b.active).collect();
        assert_eq!(act, vec![100, 100, 200]);
    }

    #[test]
    fn source_hash_spreads_by_weight_and_is_sticky() {
        let bs = backends(&[1, 1, 2]);
        let mut s = Selector::with_algorithm(Algorithm::SourceHash);
        let c = cands(&bs);
        let mut counts = [0u32; 3];
        for client in 0..6000u32 {
            let ip = std::net::IpAddr::V4((0xc612_0000 + client).into());
            let k = PickKey {
                flow_hash: client as u64,
                client_hash: client_hash(ip),
            };
            let p = s.pick(&c, k, &[]).unwrap();
            // Same client, other flow: same backend.
            assert_eq!(s.pick(&c, PickKey { flow_hash: 99, ..k }, &[]), Some(p));
            counts[p] += 1;
        }
        assert_shares(&counts, &[1, 1, 2], 0.08);
    }

    #[test]
    fn source_hash_moves_only_the_removed_backends_clients() {
        let mut bs = backends(&[1, 1, 1, 1, 1]);
        let mut s = Selector::with_algorithm(Algorithm::SourceHash);
        let keys: Vec<PickKey> = (0..5000).map(key).collect();
        let before: Vec<usize> = keys
            .iter()
            .map(|k| s.pick(&cands(&bs), *k, &[]).unwrap())
            .collect();
        bs[2].eligible = false;
        let c = cands(&bs);
        s.rebuild(&c);
        for (k, b) in keys.iter().zip(&before) {
            let now = s.pick(&c, *k, &[]).unwrap();
            if *b != 2 {
                assert_eq!(now, *b);
            } else {
                assert_ne!(now, 2);
            }
        }
    }

    #[test]
    fn maglev_spreads_flows_by_weight() {
        let counts = distribution(Algorithm::Maglev, &backends(&[1, 1, 1]), 9000);
        assert_shares(&counts, &[1, 1, 1], 0.08);
        let counts = distribution(Algorithm::Maglev, &backends(&[2, 1, 1]), 9000);
        assert_shares(&counts, &[2, 1, 1], 0.08);
    }

    #[test]
    fn ineligible_and_excluded_are_never_picked() {
        for algo in Algorithm::ALL {
            let mut bs = backends(&[1, 1, 1, 1]);
            bs[1].eligible = false;
            let mut s = Selector::with_algorithm(algo);
            let c = cands(&bs);
            s.rebuild(&c);
            for i in 0..500 {
                let p = s.pick(&c, key(i), &[3]).unwrap();
                assert!(p == 0 || p == 2, "{algo}: picked {p}");
            }
            assert_eq!(s.pick(&c, key(1), &[0, 2, 3]), None, "{algo}");
            // The retry of a flow on another backend (exclude its first pick) still succeeds.
            let first = s.pick(&c, key(7), &[]).unwrap();
            let second = s.pick(&c, key(7), &[first]).unwrap();
            assert_ne!(first, second, "{algo}");
        }
    }

    #[test]
    fn no_backends() {
        for algo in Algorithm::ALL {
            let mut s = Selector::with_algorithm(algo);
            assert_eq!(s.pick(&[], key(0), &[]), None);
        }
    }

    #[test]
    fn bad_table_size_is_an_error() {
        assert!(Selector::new(Algorithm::Maglev, 1000).is_err());
        assert!(Selector::new(Algorithm::RoundRobin, 1000).is_ok());
    }
}
