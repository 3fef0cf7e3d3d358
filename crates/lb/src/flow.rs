//! Flows: the 5-tuple key, its hash (shared by every algorithm and by DSR), and a bounded flow
//! table with idle timeouts that keeps a flow on the backend it started on.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::hash::{hash_bytes, SEED_CLIENT, SEED_FLOW};

/// IP protocol numbers used in [`FlowKey::proto`].
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;

/// A flow's 5-tuple, as seen by the balancer (`src` = client, `dst` = service address).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub proto: u8,
    pub src: SocketAddr,
    pub dst: SocketAddr,
}

fn push_ip(buf: &mut [u8; 40], at: usize, ip: IpAddr) -> usize {
    match ip {
        IpAddr::V4(a) => {
            buf[at..at + 4].copy_from_slice(&a.octets());
            at + 4
        }
        IpAddr::V6(a) => {
            buf[at..at + 16].copy_from_slice(&a.octets());
            at + 16
        }
    }
}

impl FlowKey {
    pub fn new(proto: u8, src: SocketAddr, dst: SocketAddr) -> FlowKey {
        FlowKey { proto, src, dst }
    }

    /// The flow hash: [`crate::hash::hash_bytes`] (seed [`SEED_FLOW`]) over
    /// `proto | src ip | src port (BE) | dst ip | dst port (BE)`. Every balancer instance computes
    /// the same value for the same flow.
    pub fn hash(&self) -> u64 {
        let mut buf = [0u8; 40];
        buf[0] = self.proto;
        let mut at = push_ip(&mut buf, 1, self.src.ip());
        buf[at..at + 2].copy_from_slice(&self.src.port().to_be_bytes());
        at = push_ip(&mut buf, at + 2, self.dst.ip());
        buf[at..at + 2].copy_from_slice(&self.dst.port().to_be_bytes());
        hash_bytes(SEED_FLOW, &buf[..at + 2])
    }

    /// Hash of the client address alone (source hashing: all of a client's flows together).
    pub fn client_hash(&self) -> u64 {
        client_hash(self.src.ip())
    }
}

/// Hash of a client address ([`SEED_CLIENT`]), the key of source hashing.
pub fn client_hash(ip: IpAddr) -> u64 {
    let mut buf = [0u8; 40];
    let n = push_ip(&mut buf, 0, ip);
    hash_bytes(SEED_CLIENT, &buf[..n])
}

struct Entry<V> {
    value: V,
    last_seen: Instant,
}

/// Flow table: key -> value (usually a [`crate::backend::BackendId`]), forgotten after `idle`
/// without traffic, holding at most `capacity` entries (when full, the least recently used entry is
/// evicted). All operations are O(1) amortised: a queue of expiry candidates is checked lazily and
/// entries refreshed since they were queued are re-queued at their last use.
pub struct FlowTable<V, K = FlowKey> {
    map: HashMap<K, Entry<V>>,
    queue: VecDeque<(K, Instant)>,
    idle: Duration,
    capacity: usize,
    evicted: u64,
    expired: u64,
}

impl<V: Clone, K: Eq + Hash + Clone> FlowTable<V, K> {
    /// A table that forgets flows idle for `idle` and holds at most `capacity` (>= 1) flows.
    pub fn new(idle: Duration, capacity: usize) -> Self {
        FlowTable {
            map: HashMap::new(),
            queue: VecDeque::new(),
            idle,
            capacity: capacity.max(1),
            evicted: 0,
            expired: 0,
        }
    }

    /// The value of a live flow, refreshing its idle timer.
    pub fn get(&mut self, key: &K, now: Instant) -> Option<V> {
        let idle = self.idle;
        match self.map.get_mut(key) {
            Some(e) if now.saturating_duration_since(e.last_seen) < idle => {
                e.last_seen = now;
                Some(e.value.clone())
            }
            _ => None,
        }
    }

    /// The value without refreshing the timer (and even if idle but not yet expired).
    pub fn peek(&self, key: &K) -> Option<&V> {
        self.map.get(key).map(|e| &e.value)
    }

    /// Inserts or replaces a flow. Expires idle flows first; if still full, evicts the least
    /// recently used flow. Returns every flow this removed (expired or evicted, in that order) so
    /// that the caller can release what they hold (a backend slot, a socket).
    pub fn insert(&mut self, key: K, value: V, now: Instant) -> Vec<(K, V)> {
        if let Some(e) = self.map.get_mut(&key) {
            e.value = value;
            e.last_seen = now;
            return Vec::new();
        }
        let mut gone = self.expire(now);
        while self.map.len() >= self.capacity {
            let Some((k, queued)) = self.queue.pop_front() else {
                break;
            };
            let Some(e) = self.map.get(&k) else { continue };
            if e.last_seen > queued {
                // Used since it was queued: not the least recently used; queue it at its last use.
                let at = e.last_seen;
                self.queue.push_back((k, at));
                continue;
            }
            let e = self.map.remove(&k).expect("present");
            self.evicted += 1;
            gone.push((k, e.value));
        }
        self.map.insert(
            key.clone(),
            Entry {
                value,
                last_seen: now,
            },
        );
        self.queue.push_back((key, now));
        gone
    }

    /// Removes a flow (e.g. TCP FIN/RST seen, or its UDP session closed), returning its value.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        // Its queue record is dropped lazily by `expire`.
        self.map.remove(key).map(|e| e.value)
    }

    /// Drops flows idle for at least `idle`; returns them so the caller can release resources.
    pub fn expire(&mut self, now: Instant) -> Vec<(K, V)> {
        let mut out = Vec::new();
        while let Some((_, queued)) = self.queue.front() {
            if now.saturating_duration_since(*queued) < self.idle {
                break;
            }
            let (k, _) = self.queue.pop_front().expect("front exists");
            let Some(e) = self.map.get(&k) else { continue };
            if now.saturating_duration_since(e.last_seen) >= self.idle {
                let e = self.map.remove(&k).expect("present");
                self.expired += 1;
                out.push((k, e.value));
            } else {
                // Refreshed since it was queued: check it again one idle period after its last use.
                let at = e.last_seen;
                self.queue.push_back((k, at));
            }
        }
        // Records of removed keys can pile up under churn: compact when the queue gets large.
        if self.queue.len() > 2 * self.map.len() + 1024 {
            let map = &self.map;
            self.queue.retain(|(k, _)| map.contains_key(k));
        }
        out
    }

    /// Removes every flow whose value matches `pred` (e.g. a backend that was removed).
    pub fn remove_where(&mut self, mut pred: impl FnMut(&V) -> bool) -> usize {
        let before = self.map.len();
        self.map.retain(|_, e| !pred(&e.value));
        before - self.map.len()
    }

    /// Iterates the live flows (key, value, last seen).
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V, Instant)> {
        self.map.iter().map(|(k, e)| (k, &e.value, e.last_seen))
    }

    /// The earliest instant at which [`FlowTable::expire`] may have work (`None` when empty).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.queue.front().map(|(_, q)| *q + self.idle)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    pub fn idle_timeout(&self) -> Duration {
        self.idle
    }
    /// Flows dropped because the table was full.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }
    /// Flows dropped because they were idle.
    pub fn expired(&self) -> u64 {
        self.expired
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(port: u16) -> FlowKey {
        FlowKey::new(
            PROTO_UDP,
            format!("198.18.0.1:{port}").parse().unwrap(),
            "198.18.0.100:53".parse().unwrap(),
        )
    }

    #[test]
    fn hash_is_stable_and_sensitive() {
        let a = key(1000);
        assert_eq!(a.hash(), key(1000).hash());
        assert_ne!(a.hash(), key(1001).hash());
        assert_eq!(a.client_hash(), key(1001).client_hash());
        let v6 = FlowKey::new(
            PROTO_TCP,
            "[2001:db8::1]:1".parse().unwrap(),
            "[2001:db8::2]:80".parse().unwrap(),
        );
        assert_ne!(v6.hash(), 0);
        let mut t = key(1000);
        t.proto = PROTO_TCP;
        assert_ne!(t.hash(), a.hash());
    }

    #[test]
    fn idle_flows_expire_and_used_ones_stay() {
        let t0 = Instant::now();
        let idle = Duration::from_secs(10);
        let mut t: FlowTable<u64> = FlowTable::new(idle, 100);
        t.insert(key(1), 1, t0);
        t.insert(key(2), 2, t0);
        assert_eq!(t.get(&key(1), t0 + Duration::from_secs(8)), Some(1));
        let gone = t.expire(t0 + Duration::from_secs(11));
        assert_eq!(gone, vec![(key(2), 2)]);
        assert_eq!(t.get(&key(1), t0 + Duration::from_secs(17)), Some(1));
        assert_eq!(
            t.get(&key(1), t0 + Duration::from_secs(28)),
            None,
            "idle too long"
        );
        t.expire(t0 + Duration::from_secs(30));
        assert!(t.is_empty());
        assert_eq!(t.expired(), 2);
    }

    #[test]
    fn bounded_size_evicts_oldest() {
        let t0 = Instant::now();
        let mut t: FlowTable<u64> = FlowTable::new(Duration::from_secs(60), 3);
        for p in 0..10u16 {
            t.insert(
                key(p),
                u64::from(p),
                t0 + Duration::from_millis(u64::from(p)),
            );
            assert!(t.len() <= 3);
        }
        assert_eq!(t.len(), 3);
        assert_eq!(t.evicted(), 7);
        assert!(t.peek(&key(9)).is_some() && t.peek(&key(0)).is_none());
    }

    #[test]
    fn eviction_spares_a_flow_in_use() {
        // One client keeps talking while another sweeps source ports through a full table: the
        // sweep evicts its own stale flows, never the one in use, and every eviction is returned.
        let t0 = Instant::now();
        let mut t: FlowTable<u64> = FlowTable::new(Duration::from_secs(60), 4);
        assert!(t.insert(key(1), 1, t0).is_empty());
        let mut evicted = Vec::new();
        for p in 100..200u16 {
            let now = t0 + Duration::from_millis(u64::from(p));
            assert_eq!(t.get(&key(1), now), Some(1));
            evicted.extend(t.insert(key(p), u64::from(p), now));
            assert!(t.len() <= 4);
        }
        assert_eq!(t.peek(&key(1)), Some(&1), "the flow in use was evicted");
        assert_eq!(evicted.len(), 97);
        assert!(evicted.iter().all(|(k, v)| *k != key(1) && *v >= 100));
        assert_eq!(t.evicted(), 97);
    }

    proptest::proptest! {
        #[test]
        fn never_exceeds_capacity(ops in proptest::collection::vec((0u16..50, 0u64..5000, proptest::bool::ANY), 1..400)) {
            let t0 = Instant::now();
            let mut t: FlowTable<u16> = FlowTable::new(Duration::from_millis(700), 16);
            let mut now = t0;
            for (p, dt, rm) in ops {
                now += Duration::from_micros(dt * 100);
                if rm { t.remove(&key(p)); } else { t.insert(key(p), p, now); }
                proptest::prop_assert!(t.len() <= 16);
                if let Some(v) = t.get(&key(p), now) { proptest::prop_assert_eq!(v, p); }
            }
            t.expire(now + Duration::from_secs(1));
            proptest::prop_assert!(t.is_empty());
        }
    }
}
