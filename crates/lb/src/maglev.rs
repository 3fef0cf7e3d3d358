//! Maglev consistent hashing (Eisenbud et al., NSDI 2016, section 3.4).
//!
//! A lookup table of prime size `M` (65537 by default) maps a flow hash to a backend. Backend `i`
//! (identified by its name, e.g. its address) prefers the slots of the permutation
//! `perm[i][j] = (offset + j * skip) mod M` with `offset = h1(name) mod M` and
//! `skip = h2(name) mod (M - 1) + 1` (`h1`, `h2`: [`crate::hash::hash_bytes`] with two fixed seeds).
//! The table is filled in rounds: in each round every backend, in turn, claims its next preferred
//! slot that is still empty; a backend of weight `w` takes `w` turns per round, so it ends up with
//! about `w` times the slots of a weight-1 backend.
//!
//! Backends are visited in the order of their names (not the order they were given in), so two
//! balancer instances with the same backend set build the same table and pick the same backend for
//! a flow without talking to each other. Removing 1 of N backends moves about 1/N of the slots.

use crate::hash::{hash_bytes, SEED_MAGLEV_OFFSET, SEED_MAGLEV_SKIP};

/// The paper's default table size (a prime).
pub const DEFAULT_TABLE_SIZE: usize = 65537;

/// Why a table cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MaglevError {
    #[error("maglev table size {0} is not a prime")]
    NotPrime(usize),
    #[error("maglev table size {size} is too small for {backends} backends (need a prime larger than the number of backends)")]
    TooSmall { size: usize, backends: usize },
    #[error("maglev table size {0} is too large (at most 2^31)")]
    TooLarge(usize),
}

/// Whether `n` is prime (trial division; table sizes are small).
pub fn is_prime(n: usize) -> bool {
    if n < 2 {
        return false;
    }
    if n.is_multiple_of(2) {
        return n == 2;
    }
    let mut d = 3usize;
    while d.saturating_mul(d) <= n {
        if n.is_multiple_of(d) {
            return false;
        }
        d += 2;
    }
    true
}

/// One backend as Maglev sees it: a stable name and a weight.
#[derive(Debug, Clone, Copy)]
pub struct MaglevBackend<'a> {
    pub name: &'a [u8],
    pub weight: u32,
}

/// A filled Maglev lookup table. Entries are indices into the backend slice given to [`Maglev::new`].
#[derive(Debug, Clone)]
pub struct Maglev {
    table: Vec<u32>,
    size: usize,
}

impl Maglev {
    /// Builds the table for `backends` (index order is what [`Maglev::lookup`] returns). Backends of
    /// weight 0 get no slot. With no backend of positive weight, every lookup returns `None`.
    pub fn new(size: usize, backends: &[MaglevBackend<'_>]) -> Result<Maglev, MaglevError> {
        if size > (1 << 31) {
            return Err(MaglevError::TooLarge(size));
        }
        if !is_prime(size) {
            return Err(MaglevError::NotPrime(size));
        }
        if size <= backends.len() {
            return Err(MaglevError::TooSmall {
                size,
                backends: backends.len(),
            });
        }
        let m = size as u64;
        // Visit backends in name order so the table does not depend on configuration order.
        let mut order: Vec<usize> = (0..backends.len())
            .filter(|&i| backends[i].weight > 0)
            .collect();
        order.sort_by(|&a, &b| backends[a].name.cmp(backends[b].name).then(a.cmp(&b)));
        if order.is_empty() {
            return Ok(Maglev {
                table: Vec::new(),
                size,
            });
        }
        struct Perm {
            index: u32,
            weight: u32,
            offset: u64,
            skip: u64,
            next: u64,
        }
        let mut perms: Vec<Perm> = order
            .iter()
            .map(|&i| {
                let b = &backends[i];
                Perm {
                    index: i as u32,
                    weight: b.weight,
                    offset: hash_bytes(SEED_MAGLEV_OFFSET, b.name) % m,
                    skip: hash_bytes(SEED_MAGLEV_SKIP, b.name) % (m - 1) + 1,
                    next: 0,
                }
            })
            .collect();
        const EMPTY: u32 = u32::MAX;
        let mut table = vec![EMPTY; size];
        let mut filled = 0usize;
        'fill: loop {
            for p in perms.iter_mut() {
                for _ in 0..p.weight {
                    // Next preferred slot that is still empty. `skip` < M and M prime, so the
                    // permutation visits every slot: this terminates while a slot is empty.
                    let slot = loop {
                        let c = ((p.offset + p.next * p.skip) % m) as usize;
                        p.next += 1;
                        if table[c] == EMPTY {
                            break c;
                        }
                    };
                    table[slot] = p.index;
                    filled += 1;
                    if filled == size {
                        break 'fill;
                    }
                }
            }
        }
        Ok(Maglev { table, size })
    }

    /// The backend index for a flow hash, or `None` if the table has no backend.
    pub fn lookup(&self, hash: u64) -> Option<usize> {
        if self.table.is_empty() {
            return None;
        }
        Some(self.table[(hash % self.size as u64) as usize] as usize)
    }

    /// The raw table (empty when there is no backend).
    pub fn table(&self) -> &[u32] {
        &self.table
    }

    /// The table size `M`.
    pub fn size(&self) -> usize {
        self.size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("198.18.1.{}:8080", i + 10))
            .collect()
    }

    fn build(size: usize, names: &[String], weights: &[u32]) -> Maglev {
        let b: Vec<MaglevBackend> = names
            .iter()
            .zip(weights)
            .map(|(n, &w)| MaglevBackend {
                name: n.as_bytes(),
                weight: w,
            })
            .collect();
        Maglev::new(size, &b).unwrap()
    }

    fn counts(m: &Maglev, n: usize) -> Vec<usize> {
        let mut c = vec![0; n];
        for &e in m.table() {
            c[e as usize] += 1;
        }
        c
    }

    #[test]
    fn primes() {
        assert!(is_prime(65537));
        assert!(is_prime(251));
        assert!(is_prime(2));
        assert!(!is_prime(65536));
        assert!(!is_prime(1));
        assert!(!is_prime(0));
        assert!(!is_prime(65539 * 3));
        assert_eq!(
            Maglev::new(65536, &[]).unwrap_err(),
            MaglevError::NotPrime(65536)
        );
    }

    #[test]
    fn table_is_full_and_balanced() {
        for n in [1, 2, 3, 5, 10, 33] {
            let ns = names(n);
            let m = build(DEFAULT_TABLE_SIZE, &ns, &vec![1; n]);
            assert_eq!(m.table().len(), DEFAULT_TABLE_SIZE);
            let c = counts(&m, n);
            let ideal = DEFAULT_TABLE_SIZE as f64 / n as f64;
            for &x in &c {
                // Maglev's fill is near-perfectly balanced (each round gives everyone one slot).
                assert!(
                    (x as f64 - ideal).abs() <= 1.0 + ideal * 0.01,
                    "n={n} counts {c:?}"
                );
            }
        }
    }

    #[test]
    fn two_instances_agree_whatever_the_order() {
        let ns = names(7);
        let a = build(DEFAULT_TABLE_SIZE, &ns, &[1; 7]);
        let mut rev = ns.clone();
        rev.reverse();
        let b = build(DEFAULT_TABLE_SIZE, &rev, &[1; 7]);
        for h in (0..1_000_000u64).step_by(97) {
            let x = crate::hash::fmix64(h);
            assert_eq!(ns[a.lookup(x).unwrap()], rev[b.lookup(x).unwrap()]);
        }
    }

    #[test]
    fn removing_one_of_n_moves_about_one_nth() {
        for n in 5..=10 {
            let ns = names(n);
            let full = build(DEFAULT_TABLE_SIZE, &ns, &vec![1; n]);
            for removed in [0, n / 2, n - 1] {
                let rest: Vec<String> = ns
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| i != removed)
                    .map(|(_, s)| s.clone())
                    .collect();
                let less = build(DEFAULT_TABLE_SIZE, &rest, &vec![1; n - 1]);
                let moved = full
                    .table()
                    .iter()
                    .zip(less.table())
                    .filter(|(&a, &b)| ns[a as usize] != rest[b as usize])
                    .count();
                let frac = moved as f64 / DEFAULT_TABLE_SIZE as f64;
                let ideal = 1.0 / n as f64;
                // The removed backend's slots must move (exactly 1/N); Maglev moves a few more.
                assert!(
                    frac >= ideal * 0.99 && frac <= ideal * 1.35,
                    "n={n} removed {removed}: moved {frac:.4}, 1/N = {ideal:.4}"
                );
                // Plain `hash mod N` moves most of the keys.
                let mod_moved = (0..DEFAULT_TABLE_SIZE as u64)
                    .filter(|&h| {
                        let x = crate::hash::fmix64(h);
                        ns[(x % n as u64) as usize] != rest[(x % (n as u64 - 1)) as usize]
                    })
                    .count() as f64
                    / DEFAULT_TABLE_SIZE as f64;
                assert!(mod_moved > 0.7, "mod-N moved only {mod_moved}");
            }
        }
    }

    #[test]
    fn weights_are_honoured() {
        let ns = names(3);
        let m = build(DEFAULT_TABLE_SIZE, &ns, &[1, 2, 3]);
        let c = counts(&m, 3);
        let unit = DEFAULT_TABLE_SIZE as f64 / 6.0;
        for (i, w) in [1.0, 2.0, 3.0].iter().enumerate() {
            assert!(
                (c[i] as f64 / (unit * w) - 1.0).abs() < 0.01,
                "counts {c:?}"
            );
        }
        let m = build(DEFAULT_TABLE_SIZE, &ns, &[1, 0, 1]);
        assert_eq!(counts(&m, 3)[1], 0);
    }

    #[test]
    fn empty_and_small_tables() {
        let m = Maglev::new(13, &[]).unwrap();
        assert_eq!(m.lookup(5), None);
        let ns = names(3);
        let m = build(13, &ns, &[1, 1, 1]);
        assert!(m.lookup(12345).unwrap() < 3);
        let b: Vec<MaglevBackend> = ns
            .iter()
            .map(|n| MaglevBackend {
                name: n.as_bytes(),
                weight: 1,
            })
            .collect();
        assert!(matches!(
            Maglev::new(3, &b),
            Err(MaglevError::TooSmall { .. })
        ));
    }

    proptest::proptest! {
        #[test]
        fn every_slot_names_a_positive_weight_backend(weights in proptest::collection::vec(0u32..4, 1..12)) {
            let ns = names(weights.len());
            let m = build(251, &ns, &weights);
            if weights.iter().all(|&w| w == 0) {
                proptest::prop_assert!(m.lookup(1).is_none());
            } else {
                for &e in m.table() {
                    proptest::prop_assert!(weights[e as usize] > 0);
                }
                proptest::prop_assert_eq!(m.table().len(), 251);
            }
        }
    }
}
