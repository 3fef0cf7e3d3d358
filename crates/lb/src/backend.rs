//! The backend table: every backend's address, weight, administrative state (active or draining),
//! health state machine and counters, plus the selection algorithm over them. Both balancer modes
//! (proxy and DSR) keep one of these behind a lock and feed it events; it does no I/O.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::algo::{Algorithm, Candidate, PickKey, Selector};
use crate::health::{CheckKind, Health, HealthMachine, HealthParams, LastCheck};
use crate::maglev::MaglevError;

/// A backend's identity, stable for its lifetime (indices shift when backends are removed; ids do
/// not, and are never reused).
pub type BackendId = u64;

/// Administrative state, set by the operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminState {
    /// Takes new flows (if healthy).
    Active,
    /// Takes no new flows; existing ones finish.
    Draining,
}

/// What `braid status` shows: draining wins over health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendState {
    Up,
    Down,
    Draining,
}

impl BackendState {
    pub fn as_str(self) -> &'static str {
        match self {
            BackendState::Up => "up",
            BackendState::Down => "down",
            BackendState::Draining => "draining",
        }
    }
}

/// One backend.
#[derive(Debug, Clone)]
pub struct Backend {
    pub id: BackendId,
    pub addr: SocketAddr,
    /// The address as text: the key of the hashing algorithms (so every instance agrees).
    pub name: String,
    pub weight: u32,
    pub admin: AdminState,
    pub health: HealthMachine,
    /// Connections (proxy) or flows (DSR) currently assigned.
    pub active: u64,
    /// Connections or flows ever assigned.
    pub total: u64,
    /// Bytes client -> backend.
    pub bytes_in: u64,
    /// Bytes backend -> client (zero in DSR mode: replies bypass the balancer).
    pub bytes_out: u64,
    /// Failed connects seen while serving clients.
    pub passive_failures: u64,
}

impl Backend {
    pub fn state(&self) -> BackendState {
        match (self.admin, self.health.state()) {
            (AdminState::Draining, _) => BackendState::Draining,
            (AdminState::Active, Health::Up) => BackendState::Up,
            (AdminState::Active, Health::Down) => BackendState::Down,
        }
    }

    /// May take new flows.
    pub fn eligible(&self) -> bool {
        self.admin == AdminState::Active && self.health.is_up() && self.weight > 0
    }

    pub fn last_check(&self) -> Option<&LastCheck> {
        self.health.last()
    }
}

/// Errors of table changes (shown to the operator as one line).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    #[error("backend {0} already exists")]
    Exists(SocketAddr),
    #[error("no backend {0}")]
    NoSuchBackend(SocketAddr),
    #[error("weight must be at least 1 (got {0})")]
    BadWeight(u32),
}

/// The backend table plus the selection algorithm.
#[derive(Debug, Clone)]
pub struct BackendTable {
    backends: Vec<Backend>,
    selector: Selector,
    health_params: HealthParams,
    next_id: BackendId,
    generation: u64,
    built_generation: u64,
}

/// What the selection algorithms see of each backend, in table order.
fn candidates(backends: &[Backend]) -> Vec<Candidate<'_>> {
    backends
        .iter()
        .map(|b| Candidate {
            name: b.name.as_bytes(),
            weight: b.weight,
            active: b.active,
            eligible: b.eligible(),
        })
        .collect()
}

impl BackendTable {
    /// An empty table. `table_size` is Maglev's (validated: must be prime).
    pub fn new(
        algorithm: Algorithm,
        table_size: usize,
        health: HealthParams,
    ) -> Result<Self, MaglevError> {
        Ok(BackendTable {
            backends: Vec::new(),
            selector: Selector::new(algorithm, table_size)?,
            health_params: health,
            next_id: 1,
            generation: 1,
            built_generation: 0,
        })
    }

    pub fn algorithm(&self) -> Algorithm {
        self.selector.algorithm()
    }

    /// Increases whenever the set of backends, a weight, or who may take new flows changes: a
    /// runtime that caches anything per backend (e.g. DSR's learned MACs) re-reads when it moves.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    fn changed(&mut self) {
        self.generation += 1;
    }

    pub fn backends(&self) -> &[Backend] {
        &self.backends
    }

    pub fn get(&self, id: BackendId) -> Option<&Backend> {
        self.backends.iter().find(|b| b.id == id)
    }

    fn get_mut(&mut self, id: BackendId) -> Option<&mut Backend> {
        self.backends.iter_mut().find(|b| b.id == id)
    }

    /// The id of the backend at `addr`.
    pub fn find(&self, addr: SocketAddr) -> Option<BackendId> {
        self.backends.iter().find(|b| b.addr == addr).map(|b| b.id)
    }

    /// Adds a backend (up, active).
    pub fn add(&mut self, addr: SocketAddr, weight: u32) -> Result<BackendId, TableError> {
        if weight == 0 {
            return Err(TableError::BadWeight(weight));
        }
        if self.find(addr).is_some() {
            return Err(TableError::Exists(addr));
        }
        let id = self.next_id;
        self.next_id += 1;
        self.backends.push(Backend {
            id,
            addr,
            name: addr.to_string(),
            weight,
            admin: AdminState::Active,
            health: HealthMachine::new(self.health_params),
            active: 0,
            total: 0,
            bytes_in: 0,
            bytes_out: 0,
            passive_failures: 0,
        });
        self.changed();
        Ok(id)
    }

    /// Removes a backend. Its established connections are not touched by the table (the runtime
    /// lets them finish); later counter updates for its id are ignored.
    pub fn remove(&mut self, addr: SocketAddr) -> Result<Backend, TableError> {
        let pos = self
            .backends
            .iter()
            .position(|b| b.addr == addr)
            .ok_or(TableError::NoSuchBackend(addr))?;
        let b = self.backends.remove(pos);
        self.changed();
        Ok(b)
    }

    /// Stops giving new flows to a backend; existing ones finish.
    pub fn drain(&mut self, addr: SocketAddr) -> Result<(), TableError> {
        let id = self.find(addr).ok_or(TableError::NoSuchBackend(addr))?;
        let b = self.get_mut(id).expect("found");
        if b.admin != AdminState::Draining {
            b.admin = AdminState::Draining;
            self.changed();
        }
        Ok(())
    }

    /// Lets a drained backend take new flows again.
    pub fn undrain(&mut self, addr: SocketAddr) -> Result<(), TableError> {
        let id = self.find(addr).ok_or(TableError::NoSuchBackend(addr))?;
        let b = self.get_mut(id).expect("found");
        if b.admin != AdminState::Active {
            b.admin = AdminState::Active;
            self.changed();
        }
        Ok(())
    }

    pub fn set_weight(&mut self, addr: SocketAddr, weight: u32) -> Result<(), TableError> {
        if weight == 0 {
            return Err(TableError::BadWeight(weight));
        }
        let id = self.find(addr).ok_or(TableError::NoSuchBackend(addr))?;
        let b = self.get_mut(id).expect("found");
        if b.weight != weight {
            b.weight = weight;
            self.changed();
        }
        Ok(())
    }

    fn rebuild_if_needed(&mut self) {
        if self.built_generation != self.generation {
            let cands = candidates(&self.backends);
            self.selector.rebuild(&cands);
            self.built_generation = self.generation;
        }
    }

    /// Picks a backend for a new flow, skipping `exclude` (backends that already failed this
    /// client). Does not count the connection: call [`BackendTable::conn_opened`].
    pub fn pick(&mut self, key: PickKey, exclude: &[BackendId]) -> Option<BackendId> {
        self.rebuild_if_needed();
        let excl: Vec<usize> = exclude
            .iter()
            .filter_map(|id| self.backends.iter().position(|b| b.id == *id))
            .collect();
        let cands = candidates(&self.backends);
        let i = self.selector.pick(&cands, key, &excl)?;
        Some(self.backends[i].id)
    }

    /// [`BackendTable::pick`] and [`BackendTable::conn_opened`] in one step, returning the address too.
    pub fn pick_and_open(
        &mut self,
        key: PickKey,
        exclude: &[BackendId],
    ) -> Option<(BackendId, SocketAddr)> {
        let id = self.pick(key, exclude)?;
        self.conn_opened(id);
        self.get(id).map(|b| (id, b.addr))
    }

    /// A connection/flow was assigned to `id`.
    pub fn conn_opened(&mut self, id: BackendId) {
        if let Some(b) = self.get_mut(id) {
            b.active += 1;
            b.total += 1;
        }
    }

    /// A connection/flow of `id` ended (or its connect failed).
    pub fn conn_closed(&mut self, id: BackendId) {
        if let Some(b) = self.get_mut(id) {
            b.active = b.active.saturating_sub(1);
        }
    }

    /// Bytes relayed for `id` (`to_backend` = client -> backend).
    pub fn add_bytes(&mut self, id: BackendId, to_backend: u64, to_client: u64) {
        if let Some(b) = self.get_mut(id) {
            b.bytes_in += to_backend;
            b.bytes_out += to_client;
        }
    }

    /// An active check result. Returns the new health if it changed.
    pub fn handle_check(
        &mut self,
        id: BackendId,
        now: Instant,
        ok: bool,
        took: Option<Duration>,
        detail: impl Into<String>,
    ) -> Option<Health> {
        let b = self.get_mut(id)?;
        let t = b
            .health
            .handle_result(now, ok, CheckKind::Active, took, detail);
        if t.is_some() {
            self.changed();
        }
        t
    }

    /// A connect to `id` failed while serving a client: counts as a failed check.
    pub fn handle_passive_failure(
        &mut self,
        id: BackendId,
        now: Instant,
        detail: impl Into<String>,
    ) -> Option<Health> {
        let b = self.get_mut(id)?;
        b.passive_failures += 1;
        let t = b
            .health
            .handle_result(now, false, CheckKind::Passive, None, detail);
        if t.is_some() {
            self.changed();
        }
        t
    }

    /// Number of backends that may take new flows.
    pub fn eligible_count(&self) -> usize {
        self.backends.iter().filter(|b| b.eligible()).count()
    }

    /// The Maglev table (when the algorithm is Maglev), rebuilt first if the backends changed. Its
    /// entries index [`BackendTable::backends`].
    pub fn maglev(&mut self) -> Option<&crate::maglev::Maglev> {
        self.rebuild_if_needed();
        self.selector.maglev()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::{client_hash, FlowKey, PROTO_TCP};

    fn addr(i: u8) -> SocketAddr {
        SocketAddr::from(([198, 18, 3, i], 80))
    }

    fn key(i: u32) -> PickKey {
        let src = SocketAddr::from(([198, 18, 9, (i % 200) as u8], 1000 + (i / 200) as u16));
        let f = FlowKey::new(PROTO_TCP, src, "198.18.0.10:80".parse().unwrap());
        PickKey {
            flow_hash: f.hash(),
            client_hash: client_hash(src.ip()),
        }
    }

    fn table(algo: Algorithm, n: u8) -> BackendTable {
        let mut t = BackendTable::new(algo, 65537, HealthParams { fall: 2, rise: 2 }).unwrap();
        for i in 1..=n {
            t.add(addr(i), 1).unwrap();
        }
        t
    }

    #[test]
    fn add_remove_drain_weight() {
        let mut t = table(Algorithm::RoundRobin, 3);
        assert_eq!(t.add(addr(1), 1), Err(TableError::Exists(addr(1))));
        assert_eq!(t.add(addr(9), 0), Err(TableError::BadWeight(0)));
        let g = t.generation();
        t.drain(addr(2)).unwrap();
        assert!(t.generation() > g);
        assert_eq!(
            t.get(t.find(addr(2)).unwrap()).unwrap().state(),
            BackendState::Draining
        );
        for i in 0..30 {
            let id = t.pick(key(i), &[]).unwrap();
            assert_ne!(t.get(id).unwrap().addr, addr(2));
        }
        t.undrain(addr(2)).unwrap();
        let two = t.find(addr(2));
        assert!((0..30).any(|i| t.pick(key(i), &[]) == two));
        let removed = t.remove(addr(3)).unwrap();
        assert_eq!(removed.addr, addr(3));
        assert_eq!(
            t.remove(addr(3)).unwrap_err(),
            TableError::NoSuchBackend(addr(3))
        );
        // Counters for a removed backend are ignored, not a panic.
        t.conn_closed(removed.id);
        t.add_bytes(removed.id, 1, 1);
        t.set_weight(addr(1), 4).unwrap();
        assert_eq!(t.set_weight(addr(1), 0), Err(TableError::BadWeight(0)));
        // Ids are not reused.
        let id = t.add(addr(3), 1).unwrap();
        assert_ne!(id, removed.id);
    }

    #[test]
    fn dead_backend_gets_no_new_flows_after_fall_and_returns_after_rise() {
        for algo in Algorithm::ALL {
            let mut t = table(algo, 3);
            let now = Instant::now();
            let dead = t.find(addr(2)).unwrap();
            assert_eq!(t.handle_check(dead, now, false, None, "refused"), None);
            assert_eq!(
                t.handle_passive_failure(dead, now, "refused"),
                Some(Health::Down)
            );
            for i in 0..300 {
                assert_ne!(t.pick(key(i), &[]), Some(dead), "{algo}");
            }
            t.handle_check(dead, now, true, None, "ok");
            assert!(
                (0..300).all(|i| t.pick(key(i), &[]) != Some(dead)),
                "{algo}: back after one good check"
            );
            assert_eq!(
                t.handle_check(dead, now, true, None, "ok"),
                Some(Health::Up)
            );
            assert!(
                (0..300).any(|i| t.pick(key(i), &[]) == Some(dead)),
                "{algo}: never back"
            );
        }
    }

    #[test]
    fn maglev_keeps_flows_of_surviving_backends() {
        let mut t = table(Algorithm::Maglev, 5);
        let before: Vec<BackendId> = (0..2000).map(|i| t.pick(key(i), &[]).unwrap()).collect();
        let dead = t.find(addr(4)).unwrap();
        t.handle_check(dead, Instant::now(), false, None, "x");
        t.handle_check(dead, Instant::now(), false, None, "x");
        let mut moved = 0;
        for (i, b) in before.iter().enumerate() {
            let now = t.pick(key(i as u32), &[]).unwrap();
            if *b != dead && now != *b {
                moved += 1;
            }
        }
        // Maglev moves a few slots of survivors too; far fewer than mod-N would.
        assert!(moved < 2000 / 20, "moved {moved}");
    }

    #[test]
    fn counters() {
        let mut t = table(Algorithm::LeastConnections, 2);
        let (a, _) = t.pick_and_open(key(0), &[]).unwrap();
        let (b, _) = t.pick_and_open(key(1), &[]).unwrap();
        assert_ne!(a, b);
        t.add_bytes(a, 10, 1000);
        t.conn_closed(a);
        let ba = t.get(a).unwrap();
        assert_eq!(
            (ba.active, ba.total, ba.bytes_in, ba.bytes_out),
            (0, 1, 10, 1000)
        );
        // a now has fewer active connections: least-connections picks it.
        assert_eq!(t.pick(key(2), &[]), Some(a));
        assert_eq!(t.pick(key(2), &[a]), Some(b));
        assert_eq!(t.pick(key(2), &[a, b]), None);
    }
}
