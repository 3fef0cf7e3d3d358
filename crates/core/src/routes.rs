//! Which client a concentrator's inner packet belongs to, and from which clients an inner source
//! address may come: a longest-prefix-match table of IP prefixes (WireGuard calls its equivalent
//! "cryptokey routing": the same table routes outgoing packets and checks incoming sources), and
//! the address pool that hands clients their tunnel addresses (as the seed's `set ippool`).
//!
//! [`PrefixMap`] keeps one hash map per prefix length in use and looks a destination up from the
//! longest length down: a lookup costs one hash probe per distinct length present (a handful in
//! practice: /32 tunnel addresses, the sites' /24s and /64s), whatever the number of clients.
//!
//! `ipnet` provides the prefix type: parsing, masking and containment, the way every Rust network
//! tool spells them; we do not hand-roll CIDR arithmetic.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use ipnet::IpNet;

/// A map from IP prefixes to values, answering longest-prefix-match lookups.
#[derive(Clone, Debug)]
pub struct PrefixMap<T> {
    /// Per (is IPv6, prefix length), from the masked network address to the value. A BTreeMap so
    /// that lookups walk the lengths from longest to shortest.
    by_len: BTreeMap<(bool, u8), HashMap<IpAddr, (IpNet, T)>>,
}

impl<T> Default for PrefixMap<T> {
    fn default() -> Self {
        PrefixMap {
            by_len: BTreeMap::new(),
        }
    }
}

impl<T> PrefixMap<T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Inserts `prefix` (host bits ignored: 198.18.1.7/24 is 198.18.1.0/24). Returns the value it
    /// replaces, if the same prefix was there.
    pub fn insert(&mut self, prefix: IpNet, value: T) -> Option<T> {
        let prefix = prefix.trunc();
        let key = (prefix.network().is_ipv6(), prefix.prefix_len());
        self.by_len
            .entry(key)
            .or_default()
            .insert(prefix.network(), (prefix, value))
            .map(|(_, v)| v)
    }

    /// Removes exactly `prefix`.
    pub fn remove(&mut self, prefix: IpNet) -> Option<T> {
        let prefix = prefix.trunc();
        let key = (prefix.network().is_ipv6(), prefix.prefix_len());
        let table = self.by_len.get_mut(&key)?;
        let v = table.remove(&prefix.network()).map(|(_, v)| v);
        if table.is_empty() {
            self.by_len.remove(&key);
        }
        v
    }

    /// Removes every prefix whose value matches `pred` (a client going away).
    pub fn retain(&mut self, mut keep: impl FnMut(&IpNet, &T) -> bool) {
        for table in self.by_len.values_mut() {
            table.retain(|_, (p, v)| keep(p, v));
        }
        self.by_len.retain(|_, t| !t.is_empty());
    }

    /// The value of the longest prefix containing `addr`, with that prefix.
    pub fn lookup(&self, addr: IpAddr) -> Option<(&IpNet, &T)> {
        let v6 = addr.is_ipv6();
        self.by_len
            .iter()
            .rev()
            .filter(|((is_v6, _), _)| *is_v6 == v6)
            .find_map(|((_, len), table)| {
                let net = IpNet::new(addr, *len).ok()?.trunc();
                table.get(&net.network()).map(|(p, v)| (p, v))
            })
    }

    /// The prefix equal to `prefix`, if present.
    pub fn get(&self, prefix: IpNet) -> Option<&T> {
        let prefix = prefix.trunc();
        let key = (prefix.network().is_ipv6(), prefix.prefix_len());
        self.by_len
            .get(&key)?
            .get(&prefix.network())
            .map(|(_, v)| v)
    }

    pub fn len(&self) -> usize {
        self.by_len.values().map(HashMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.by_len.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&IpNet, &T)> {
        self.by_len
            .values()
            .flat_map(|t| t.values().map(|(p, v)| (p, v)))
    }
}

/// Why an address cannot be given out.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error("address pool {0} is exhausted")]
    Exhausted(IpNet),
    #[error("{addr} is not in address pool {pool}")]
    Outside { addr: IpAddr, pool: IpNet },
    #[error("{0} is already given out")]
    Taken(IpAddr),
}

/// Tunnel addresses handed to clients from one prefix: the lowest free host address first, never
/// the network or broadcast address of an IPv4 pool, never an address reserved (the server's own).
#[derive(Clone, Debug)]
pub struct AddressPool {
    net: IpNet,
    used: BTreeSet<IpAddr>,
}

impl AddressPool {
    /// A pool over `net`; `reserved` addresses (the server's) are never given out.
    pub fn new(net: IpNet, reserved: impl IntoIterator<Item = IpAddr>) -> AddressPool {
        let net = net.trunc();
        AddressPool {
            net,
            used: reserved.into_iter().filter(|a| net.contains(a)).collect(),
        }
    }

    pub fn prefix(&self) -> IpNet {
        self.net
    }

    /// Takes a specific address (a client configured with a fixed one).
    pub fn claim(&mut self, addr: IpAddr) -> Result<(), PoolError> {
        if !self.net.contains(&addr) || !self.is_host(addr) {
            return Err(PoolError::Outside {
                addr,
                pool: self.net,
            });
        }
        if !self.used.insert(addr) {
            return Err(PoolError::Taken(addr));
        }
        Ok(())
    }

    /// Gives out the lowest free address.
    pub fn allocate(&mut self) -> Result<IpAddr, PoolError> {
        // Walk the used set in order alongside the hosts: the first host not in it is free. The
        // walk is bounded by the number of addresses in use, not the size of the pool.
        let mut candidate = self.first_host();
        for &u in self.used.range(candidate..) {
            if u != candidate {
                break;
            }
            candidate = match next(candidate) {
                Some(n) => n,
                None => return Err(PoolError::Exhausted(self.net)),
            };
        }
        if !self.net.contains(&candidate) || !self.is_host(candidate) {
            return Err(PoolError::Exhausted(self.net));
        }
        self.used.insert(candidate);
        Ok(candidate)
    }

    /// Gives an address back.
    pub fn release(&mut self, addr: IpAddr) -> bool {
        self.used.remove(&addr)
    }

    pub fn in_use(&self) -> usize {
        self.used.len()
    }

    fn first_host(&self) -> IpAddr {
        match self.net {
            IpNet::V4(n) if n.prefix_len() < 31 => {
                next(n.network().into()).expect("a /30 or wider has hosts")
            }
            IpNet::V6(n) if n.prefix_len() < 127 => {
                next(n.network().into()).expect("a /126 or wider has hosts")
            }
            n => n.network(),
        }
    }

    /// Not the network or (IPv4) broadcast address, for pools wider than a point-to-point /31.
    fn is_host(&self, addr: IpAddr) -> bool {
        match self.net {
            IpNet::V4(n) if n.prefix_len() < 31 => {
                addr != IpAddr::from(n.network()) && addr != IpAddr::from(n.broadcast())
            }
            IpNet::V6(n) if n.prefix_len() < 127 => addr != IpAddr::from(n.network()),
            _ => true,
        }
    }
}

/// The address after `a`, if any.
fn next(a: IpAddr) -> Option<IpAddr> {
    match a {
        IpAddr::V4(v) => u32::from(v)
            .checked_add(1)
            .map(|n| IpAddr::from(std::net::Ipv4Addr::from(n))),
        IpAddr::V6(v) => u128::from(v)
            .checked_add(1)
            .map(|n| IpAddr::from(std::net::Ipv6Addr::from(n))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }
    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_longest_prefix_wins_per_family() {
        let mut m = PrefixMap::new();
        m.insert(net("198.18.0.0/16"), "region");
        m.insert(net("198.18.5.0/24"), "site-a");
        m.insert(net("198.18.5.7/32"), "host");
        m.insert(net("2001:2::/48"), "v6");
        m.insert(net("0.0.0.0/0"), "default");
        assert_eq!(m.lookup(ip("198.18.5.7")).unwrap().1, &"host");
        assert_eq!(m.lookup(ip("198.18.5.8")).unwrap().1, &"site-a");
        assert_eq!(m.lookup(ip("198.18.6.1")).unwrap().1, &"region");
        assert_eq!(m.lookup(ip("203.0.113.1")).unwrap().1, &"default");
        assert_eq!(m.lookup(ip("2001:2::1")).unwrap().1, &"v6");
        assert!(m.lookup(ip("2001:3::1")).is_none());
        assert_eq!(m.remove(net("198.18.5.0/24")), Some("site-a"));
        assert_eq!(m.lookup(ip("198.18.5.8")).unwrap().1, &"region");
        // Host bits are ignored.
        assert_eq!(m.insert(net("198.18.0.9/16"), "region2"), Some("region"));
        m.retain(|_, v| !v.starts_with("region"));
        assert_eq!(m.lookup(ip("198.18.6.1")).unwrap().1, &"default");
        assert_eq!(m.len(), 3);
    }

    #[test]
    fn the_pool_hands_out_the_lowest_free_host_and_takes_it_back() {
        let mut p = AddressPool::new(net("198.19.0.0/29"), [ip("198.19.0.1")]);
        let got: Vec<IpAddr> = (0..5).map(|_| p.allocate().unwrap()).collect();
        let want: Vec<IpAddr> = (2..=6).map(|i| ip(&format!("198.19.0.{i}"))).collect();
        assert_eq!(got, want);
        assert_eq!(
            p.allocate(),
            Err(PoolError::Exhausted(net("198.19.0.0/29")))
        );
        assert!(p.release(ip("198.19.0.4")));
        assert_eq!(p.allocate().unwrap(), ip("198.19.0.4"));
        assert_eq!(
            p.claim(ip("198.19.0.7")),
            Err(PoolError::Outside {
                addr: ip("198.19.0.7"),
                pool: net("198.19.0.0/29")
            })
        );
        assert_eq!(
            p.claim(ip("198.19.0.2")),
            Err(PoolError::Taken(ip("198.19.0.2")))
        );
        let mut p6 = AddressPool::new(net("2001:2::/126"), []);
        assert_eq!(p6.allocate().unwrap(), ip("2001:2::1"));
        assert_eq!(p6.allocate().unwrap(), ip("2001:2::2"));
        assert_eq!(p6.allocate().unwrap(), ip("2001:2::3"));
        assert!(p6.allocate().is_err());
        let mut p31 = AddressPool::new(net("198.19.0.0/31"), []);
        assert_eq!(p31.allocate().unwrap(), ip("198.19.0.0"));
        assert_eq!(p31.allocate().unwrap(), ip("198.19.0.1"));
        assert!(p31.allocate().is_err());
    }

    proptest! {
        /// Against a brute-force model: the map's answer is the longest inserted prefix that
        /// contains the address.
        #[test]
        fn lookup_matches_a_linear_scan(
            prefixes in prop::collection::vec((any::<u32>(), 0u8..=32), 0..40),
            probes in prop::collection::vec(any::<u32>(), 1..50),
        ) {
            let mut m = PrefixMap::new();
            let mut model: Vec<(IpNet, usize)> = Vec::new();
            for (i, (a, len)) in prefixes.iter().enumerate() {
                let p = IpNet::new(IpAddr::from(std::net::Ipv4Addr::from(*a)), *len).unwrap().trunc();
                m.insert(p, i);
                model.retain(|(q, _)| *q != p);
                model.push((p, i));
            }
            for a in probes.iter().chain(prefixes.iter().map(|(a, _)| a)) {
                let addr = IpAddr::from(std::net::Ipv4Addr::from(*a));
                let want = model
                    .iter()
                    .filter(|(p, _)| p.contains(&addr))
                    .max_by_key(|(p, _)| p.prefix_len())
                    .map(|(_, v)| *v);
                prop_assert_eq!(m.lookup(addr).map(|(_, v)| *v), want);
            }
        }

        /// Allocations never repeat an address in use, never leave the pool, never give the
        /// network, broadcast or a reserved address.
        #[test]
        fn the_pool_never_gives_an_address_twice(ops in prop::collection::vec(any::<bool>(), 0..200)) {
            let mut p = AddressPool::new(net("198.19.0.0/26"), [ip("198.19.0.1")]);
            let mut held: Vec<IpAddr> = Vec::new();
            for (i, alloc) in ops.into_iter().enumerate() {
                if alloc || held.is_empty() {
                    match p.allocate() {
                        Ok(a) => {
                            prop_assert!(!held.contains(&a));
                            prop_assert!(a != ip("198.19.0.0") && a != ip("198.19.0.63") && a != ip("198.19.0.1"));
                            prop_assert!(net("198.19.0.0/26").contains(&a));
                            held.push(a);
                        }
                        Err(_) => prop_assert_eq!(held.len(), 61),
                    }
                } else {
                    let a = held.swap_remove(i % held.len());
                    prop_assert!(p.release(a));
                }
            }
        }
    }
}
