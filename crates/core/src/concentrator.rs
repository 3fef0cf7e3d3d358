//! A concentrator: one server serving many client bundles (issue 14), sans I/O.
//!
//! Each client (a site with its own X25519 key pair, [`ClientSpec`]) gets a server
//! [`Endpoint`] of its own: its own session, links, scheduler, reorder buffer and statistics.
//! The concentrator sits between them and the I/O layer, which still sees one listening socket
//! and one TUN device:
//!
//! - **Datagrams in.** An ID-HELLO is opened as far as the client's static key (one X25519,
//!   [`crate::identity::peek_client`]) and handed to that client's endpoint; every other packet
//!   goes to the endpoint whose session id it names (a map kept as sessions come and go). A
//!   datagram for nobody is counted, never answered.
//! - **TUN to clients.** The inner destination picks the client, by longest prefix over every
//!   client's tunnel address and LAN prefixes ([`PrefixMap`], WireGuard's "cryptokey routing").
//! - **Clients to TUN.** An inner source that is neither the client's tunnel address nor in its
//!   LAN prefixes is dropped and counted (a site cannot speak for another). A packet for another
//!   client goes straight to it if the sender may reach it (`reach`), else it is dropped and
//!   counted; everything else goes to the TUN device.
//! - **Fair share.** Datagrams leave round-robin over the clients, a run of at most
//!   [`TX_QUANTUM`] datagrams to one link at a time (so the I/O layer can still send a run as one
//!   UDP GSO super-datagram), so that when the socket's queue is full the drops fall on every
//!   client alike, not on whoever came last; and each client's queue of datagrams not yet taken
//!   is bounded ([`MAX_QUEUED_PER_CLIENT`]):
//!   a client receiving a flood loses its own packets, not the others'.
//!
//! The I/O layer keeps per-link state (the reply address of a wildcard listener, path MTUs)
//! keyed by link id; link ids of different clients collide, so the concentrator presents
//! *global* link ids: `(slot + 1) << 8 | link` ([`global_link`]). Link ids are at most 255
//! (docs/protocol.md §2), so 255 clients fit in a 16-bit id: the limit of one concentrator
//! ([`MAX_CLIENTS`]); more sites go to more concentrators behind `braid balance` (§9.2).

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Instant;

use ipnet::IpNet;

use crate::endpoint::{
    BundleStats, Config, Endpoint, EndpointError, Event, Identity, Received, Role, Transmit,
};
use crate::identity::KeyPair;
use crate::routes::PrefixMap;
use crate::wire::{Header, PacketType};
use crate::LinkId;

/// Clients one concentrator serves at most (see the module docs).
pub const MAX_CLIENTS: usize = 255;

/// Datagrams one client may have waiting for the I/O layer at most; more are dropped (its own).
pub const MAX_QUEUED_PER_CLIENT: usize = 4096;
/// Datagrams to one link one client sends in a row at most before the next client's turn.
pub const TX_QUANTUM: usize = 16;

/// The global link id of link `link` of the client in `slot`.
pub fn global_link(slot: usize, link: LinkId) -> LinkId {
    (((slot + 1) as LinkId) << 8) | (link & 0xff)
}

/// The client slot and link of a global link id.
pub fn split_link(global: LinkId) -> Option<(usize, LinkId)> {
    let hi = (global >> 8) as usize;
    (hi >= 1).then(|| (hi - 1, global & 0xff))
}

/// One client as configured.
#[derive(Debug, Clone)]
pub struct ClientSpec {
    pub name: String,
    pub public_key: [u8; 32],
    /// Its tunnel addresses (given to it in the handshake).
    pub v4: Option<(Ipv4Addr, u8)>,
    pub v6: Option<(Ipv6Addr, u8)>,
    /// The networks behind it (its site's LANs).
    pub lans: Vec<IpNet>,
    /// The other clients it may send to, by name; `"*"`: all.
    pub reach: Vec<String>,
}

impl ClientSpec {
    /// The prefixes routed to this client: its tunnel addresses (as host routes) and its LANs.
    pub fn prefixes(&self) -> Vec<IpNet> {
        let mut v = Vec::new();
        if let Some((a, _)) = self.v4 {
            v.push(IpNet::from(IpAddr::V4(a)));
        }
        if let Some((a, _)) = self.v6 {
            v.push(IpNet::from(IpAddr::V6(a)));
        }
        v.extend(self.lans.iter().map(|n| n.trunc()));
        v
    }

    fn may_reach(&self, other: &str) -> bool {
        self.reach.iter().any(|r| r == "*" || r == other)
    }
}

/// Why a client cannot be added.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    #[error("a client named {0:?} already exists")]
    NameTaken(String),
    #[error("client {0:?} has the same public key as client {1:?}")]
    KeyTaken(String, String),
    #[error("prefix {prefix} of client {name:?} is already routed to client {owner:?}")]
    PrefixTaken {
        name: String,
        prefix: IpNet,
        owner: String,
    },
    #[error("this concentrator serves {MAX_CLIENTS} clients at most")]
    Full,
    #[error("no client named {0:?}")]
    NoSuchClient(String),
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
}

/// Counters of what the concentrator itself dropped (each client's endpoint counts the rest).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ConcentratorDrops {
    /// An ID-HELLO whose static key is no configured client's.
    pub unknown_client: u64,
    /// A packet naming no client's session.
    pub unknown_session: u64,
    /// Not a braid packet of ours at all (too short, another version, a PSK HELLO).
    pub malformed: u64,
    /// From the TUN device, for a destination no client routes.
    pub no_route: u64,
}

/// One client's statistics.
#[derive(Debug, Clone)]
pub struct ClientStats {
    pub name: String,
    pub public_key: [u8; 32],
    pub prefixes: Vec<IpNet>,
    pub connected: bool,
    pub stats: BundleStats,
    /// Packets from the client with an inner source not its own (dropped).
    pub dropped_source: u64,
    /// Packets from the client for another client it may not reach (dropped).
    pub dropped_policy: u64,
    /// Datagrams dropped because its queue was full (fair share).
    pub dropped_queue: u64,
    /// Packets it sent to other clients directly.
    pub forwarded: u64,
}

struct Client {
    spec: ClientSpec,
    ep: Endpoint,
    /// The session ids in the map for it (current, pending).
    sids: [Option<u32>; 2],
    queued: VecDeque<Transmit>,
    dropped_source: u64,
    dropped_policy: u64,
    dropped_queue: u64,
    forwarded: u64,
}

/// See the module docs.
pub struct Concentrator {
    /// The template of every client endpoint (role server, PSK, timers...).
    base: Config,
    own: KeyPair,
    slots: Vec<Option<Client>>,
    by_key: HashMap<[u8; 32], usize>,
    by_sid: HashMap<u32, usize>,
    routes: PrefixMap<usize>,
    rng: Box<dyn rand_core::RngCore + Send>,
    /// Clients with datagrams queued, in turn order (the first is sending its run).
    sending: Touched,
    /// Datagrams of the current run.
    run: usize,
    delivered: VecDeque<Vec<u8>>,
    events: VecDeque<(usize, Event)>,
    drops: ConcentratorDrops,
    /// A removed client's last datagrams (its CLOSE): no slot is theirs any more.
    orphans: VecDeque<Transmit>,
    /// Slots whose endpoint was handed something (a datagram, a TUN packet, a timeout) since
    /// the output, the deliveries and the events last looked at it: only those can have
    /// something new, so a turn costs the clients it touched, not every client.
    to_send: Touched,
    to_deliver: Touched,
    to_report: Touched,
    /// Each slot's endpoint's next timer, refreshed whenever the slot is touched.
    deadlines: Vec<Option<Instant>>,
    /// Back-pressure for every client's endpoint (see [`Concentrator::set_backpressure`]).
    backpressure: bool,
}

/// A set of slots in the order they were first added (a list and a membership flag).
#[derive(Default)]
struct Touched {
    list: VecDeque<usize>,
    flag: Vec<bool>,
}

impl Touched {
    fn mark(&mut self, slot: usize) {
        if self.flag.len() <= slot {
            self.flag.resize(slot + 1, false);
        }
        if !self.flag[slot] {
            self.flag[slot] = true;
            self.list.push_back(slot);
        }
    }
    fn front(&self) -> Option<usize> {
        self.list.front().copied()
    }
    fn pop(&mut self) -> Option<usize> {
        let slot = self.list.pop_front()?;
        self.flag[slot] = false;
        Some(slot)
    }
    fn remove(&mut self, slot: usize) {
        if self.flag.get(slot).copied().unwrap_or(false) {
            self.flag[slot] = false;
            self.list.retain(|&s| s != slot);
        }
    }
}

impl Concentrator {
    /// A concentrator with the server key `own` and no client yet. `base` is the server
    /// endpoint configuration every client gets (its `identity` is set per client).
    pub fn new(base: Config, own: KeyPair, rng: Box<dyn rand_core::RngCore + Send>) -> Self {
        Concentrator {
            base: Config {
                role: Role::Server,
                ..base
            },
            own,
            slots: Vec::new(),
            by_key: HashMap::new(),
            by_sid: HashMap::new(),
            routes: PrefixMap::new(),
            rng,
            sending: Touched::default(),
            run: 0,
            delivered: VecDeque::new(),
            events: VecDeque::new(),
            drops: ConcentratorDrops::default(),
            orphans: VecDeque::new(),
            to_send: Touched::default(),
            to_deliver: Touched::default(),
            to_report: Touched::default(),
            deadlines: Vec::new(),
            backpressure: false,
        }
    }

    /// Back-pressure ([`Endpoint::set_backpressure`]) for every client's endpoint, now and for
    /// the clients added later. Each client has its own bundle queue: one client whose links
    /// are full holds back its own traffic only.
    pub fn set_backpressure(&mut self, on: bool) {
        self.backpressure = on;
        for slot in 0..self.slots.len() {
            if let Some(c) = self.slots[slot].as_mut() {
                c.ep.set_backpressure(on);
                self.touch(slot);
            }
        }
    }

    /// Adds a client (at run time too: the others are not disturbed). Its prefixes must not be
    /// another client's.
    pub fn add_client(&mut self, now: Instant, spec: ClientSpec) -> Result<(), ClientError> {
        if let Some(c) = self.clients().find(|c| c.spec.name == spec.name) {
            return Err(ClientError::NameTaken(c.spec.name.clone()));
        }
        if let Some(&s) = self.by_key.get(&spec.public_key) {
            let other = self.slots[s]
                .as_ref()
                .map(|c| c.spec.name.clone())
                .unwrap_or_default();
            return Err(ClientError::KeyTaken(spec.name.clone(), other));
        }
        for p in spec.prefixes() {
            if let Some(&s) = self.routes.get(p) {
                let owner = self.slots[s]
                    .as_ref()
                    .map(|c| c.spec.name.clone())
                    .unwrap_or_default();
                return Err(ClientError::PrefixTaken {
                    name: spec.name.clone(),
                    prefix: p,
                    owner,
                });
            }
        }
        let slot = match self.slots.iter().position(Option::is_none) {
            Some(s) => s,
            None if self.slots.len() < MAX_CLIENTS => {
                self.slots.push(None);
                self.slots.len() - 1
            }
            None => return Err(ClientError::Full),
        };
        let mut cfg = self.base.clone();
        cfg.identity = Some(Identity {
            own: self.own.clone(),
            peer: spec.public_key,
            v4: spec.v4,
            v6: spec.v6,
        });
        let mut seed = [0u8; 32];
        self.rng.fill_bytes(&mut seed);
        let rng: Box<dyn rand_core::RngCore + Send> =
            Box::new(<rand_chacha::ChaCha20Rng as rand_core::SeedableRng>::from_seed(seed));
        let mut ep = Endpoint::new(cfg, now, rng)?;
        ep.set_backpressure(self.backpressure);
        for p in spec.prefixes() {
            self.routes.insert(p, slot);
        }
        self.by_key.insert(spec.public_key, slot);
        self.slots[slot] = Some(Client {
            spec,
            ep,
            sids: [None, None],
            queued: VecDeque::new(),
            dropped_source: 0,
            dropped_policy: 0,
            dropped_queue: 0,
            forwarded: 0,
        });
        self.touch(slot);
        Ok(())
    }

    /// Slot `slot`'s endpoint was handed something: its output, deliveries and events are
    /// worth a look, and its next timer is read again.
    fn touch(&mut self, slot: usize) {
        self.to_send.mark(slot);
        self.to_deliver.mark(slot);
        self.to_report.mark(slot);
        self.refresh_deadline(slot);
    }

    fn refresh_deadline(&mut self, slot: usize) {
        if self.deadlines.len() <= slot {
            self.deadlines.resize(slot + 1, None);
        }
        self.deadlines[slot] = self.slots[slot].as_ref().and_then(|c| c.ep.poll_timeout());
    }

    /// Removes a client: its session ends (CLOSE sent on its links), its routes go. The
    /// others are not disturbed.
    pub fn remove_client(&mut self, now: Instant, name: &str) -> Result<ClientSpec, ClientError> {
        let slot = self
            .slot_of(name)
            .ok_or_else(|| ClientError::NoSuchClient(name.to_string()))?;
        let Some(mut c) = self.slots[slot].take() else {
            return Err(ClientError::NoSuchClient(name.to_string()));
        };
        c.ep.close(now);
        // The CLOSE datagrams still go out.
        while let Some(mut t) = c.ep.poll_transmit() {
            t.link = global_link(slot, t.link);
            self.orphans.push_back(t);
        }
        self.routes.retain(|_, &s| s != slot);
        self.by_key.remove(&c.spec.public_key);
        self.by_sid.retain(|_, &mut s| s != slot);
        self.events.retain(|(s, _)| *s != slot);
        self.to_send.remove(slot);
        self.to_deliver.remove(slot);
        self.to_report.remove(slot);
        if self.sending.front() == Some(slot) {
            self.run = 0;
        }
        self.sending.remove(slot);
        self.deadlines[slot] = None;
        Ok(c.spec)
    }

    fn slot_of(&self, name: &str) -> Option<usize> {
        self.slots
            .iter()
            .position(|c| c.as_ref().is_some_and(|c| c.spec.name == name))
    }

    fn clients(&self) -> impl Iterator<Item = &Client> {
        self.slots.iter().flatten()
    }

    /// The clients as configured, in slot order.
    pub fn client_specs(&self) -> impl Iterator<Item = &ClientSpec> {
        self.clients().map(|c| &c.spec)
    }

    /// The client names, in slot order.
    pub fn client_names(&self) -> Vec<String> {
        self.clients().map(|c| c.spec.name.clone()).collect()
    }

    pub fn client_count(&self) -> usize {
        self.clients().count()
    }

    // -------------------------------------------------------------- datagrams from the network

    /// A datagram arrived on the listening socket from `from`. Returns which (global) link it
    /// authenticated as, as [`Endpoint::handle_datagram`]. Never panics, whatever the bytes.
    pub fn handle_datagram(
        &mut self,
        now: Instant,
        from: SocketAddr,
        datagram: &mut [u8],
    ) -> Received {
        self.handle_datagram_at(now, now, from, datagram)
    }

    /// [`handle_datagram`](Self::handle_datagram) for a datagram that reached this host at
    /// `arrived` (with its outer ECN field, if known), as [`Endpoint::handle_datagram_at`].
    pub fn handle_datagram_at(
        &mut self,
        now: Instant,
        arrived: impl Into<crate::endpoint::RxMeta>,
        from: SocketAddr,
        datagram: &mut [u8],
    ) -> Received {
        let Ok(header) = Header::parse(datagram) else {
            self.drops.malformed += 1;
            return Received::Ignored;
        };
        let slot = match header.ptype {
            PacketType::IdHello => {
                if header.session & 0xffff != 0 {
                    self.drops.malformed += 1;
                    return Received::Ignored;
                }
                match crate::identity::peek_client(&self.own, &self.base.psk, datagram) {
                    Ok((key, _)) => match self.by_key.get(&key) {
                        Some(&s) => s,
                        None => {
                            self.drops.unknown_client += 1;
                            return Received::Ignored;
                        }
                    },
                    Err(_) => {
                        self.drops.unknown_client += 1;
                        return Received::Ignored;
                    }
                }
            }
            PacketType::Hello | PacketType::HelloAck | PacketType::IdHelloAck => {
                self.drops.malformed += 1;
                return Received::Ignored;
            }
            _ => match self.by_sid.get(&header.session) {
                Some(&s) => s,
                None => {
                    self.drops.unknown_session += 1;
                    return Received::Ignored;
                }
            },
        };
        let Some(c) = self.slots[slot].as_mut() else {
            self.drops.unknown_session += 1;
            return Received::Ignored;
        };
        let got = c.ep.handle_datagram_at(now, arrived, None, from, datagram);
        self.touch(slot);
        self.refresh_sids(slot);
        match got {
            Received::Link(l) => Received::Link(global_link(slot, l)),
            Received::Hello(l) => Received::Hello(global_link(slot, l)),
            Received::Ignored => Received::Ignored,
        }
    }

    /// Keeps the session-id map in step with the client's endpoint (a HELLO makes a pending
    /// session, the first packet under it makes it current, a new one drops the old).
    fn refresh_sids(&mut self, slot: usize) {
        let Some(c) = self.slots[slot].as_mut() else {
            return;
        };
        let now_ids = c.ep.session_ids();
        if now_ids == c.sids {
            return;
        }
        for old in c.sids.into_iter().flatten() {
            if self.by_sid.get(&old) == Some(&slot) {
                self.by_sid.remove(&old);
            }
        }
        for id in now_ids.into_iter().flatten() {
            self.by_sid.insert(id, slot);
        }
        c.sids = now_ids;
    }

    // -------------------------------------------------------------- packets from the TUN device

    /// An IP packet from the TUN device: to the client that routes its destination.
    pub fn send_packet(&mut self, now: Instant, packet: &[u8]) {
        let slot =
            inner_addrs(packet).and_then(|(_, dst)| self.routes.lookup(dst).map(|(_, &s)| s));
        match slot.filter(|&s| self.slots[s].is_some()) {
            Some(s) => {
                if let Some(c) = self.slots[s].as_mut() {
                    c.ep.send_packet(now, packet);
                }
                self.touch(s);
            }
            None => self.drops.no_route += 1,
        }
    }

    // -------------------------------------------------------------- output

    /// Moves the touched endpoints' datagrams into their clients' bounded queues.
    fn pull_transmits(&mut self) {
        while let Some(slot) = self.to_send.pop() {
            let Some(c) = self.slots[slot].as_mut() else {
                continue;
            };
            while let Some(mut t) = c.ep.poll_transmit() {
                if c.queued.len() >= MAX_QUEUED_PER_CLIENT {
                    c.dropped_queue += 1;
                    c.ep.recycle(t.payload);
                    continue;
                }
                t.link = global_link(slot, t.link);
                c.queued.push_back(t);
            }
            if !c.queued.is_empty() {
                self.sending.mark(slot);
            }
        }
    }

    /// The next datagram to send (its `link` a global link id): round-robin over the clients
    /// with datagrams queued, a run to one link of up to [`TX_QUANTUM`] each.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        if let Some(t) = self.orphans.pop_front() {
            return Some(t);
        }
        self.pull_transmits();
        loop {
            let slot = self.sending.front()?;
            let Some(c) = self.slots[slot].as_mut() else {
                self.sending.pop();
                continue;
            };
            let Some(t) = c.queued.pop_front() else {
                self.sending.pop();
                self.run = 0;
                continue;
            };
            self.run += 1;
            let same_run = c
                .queued
                .front()
                .is_some_and(|n| n.link == t.link && n.dst == t.dst);
            if !same_run || self.run >= TX_QUANTUM {
                // The next client's turn; this one goes last if it has more.
                self.sending.pop();
                self.run = 0;
                if !c.queued.is_empty() {
                    self.sending.mark(slot);
                }
            }
            return Some(t);
        }
    }

    /// The next packet for the TUN device, one client after the other (of those touched).
    /// Packets from a client with a source that is not its own are dropped; packets for
    /// another client go to it directly, if allowed.
    pub fn poll_deliver(&mut self, now: Instant) -> Option<Vec<u8>> {
        if let Some(p) = self.delivered.pop_front() {
            return Some(p);
        }
        while let Some(slot) = self.to_deliver.pop() {
            let got = self.deliver_from(now, slot);
            // Delivering moves the client's reorder timers.
            self.refresh_deadline(slot);
            if let Some(p) = got {
                // Round robin: the others first, then this one again.
                self.to_deliver.mark(slot);
                return Some(p);
            }
        }
        None
    }

    /// The next packet of client `slot` for the TUN device, after the source and
    /// client-to-client checks (`None`: it has nothing more now).
    fn deliver_from(&mut self, now: Instant, slot: usize) -> Option<Vec<u8>> {
        while let Some(p) = self.slots[slot]
            .as_mut()
            .and_then(|c| c.ep.poll_deliver(now))
        {
            let addrs = inner_addrs(&p);
            let from_ok = addrs
                .is_some_and(|(src, _)| self.routes.lookup(src).map(|(_, &s)| s) == Some(slot));
            if !from_ok {
                if let Some(c) = self.slots[slot].as_mut() {
                    c.dropped_source += 1;
                    c.ep.recycle(p);
                }
                continue;
            }
            let to = addrs.and_then(|(_, dst)| self.routes.lookup(dst).map(|(_, &s)| s));
            let Some(other) = to.filter(|&o| o != slot) else {
                return Some(p);
            };
            let allowed = match (&self.slots[slot], &self.slots[other]) {
                (Some(c), Some(o)) => c.spec.may_reach(&o.spec.name),
                _ => false,
            };
            if allowed {
                if let Some(o) = self.slots[other].as_mut() {
                    o.ep.send_packet(now, &p);
                }
                self.touch(other);
            }
            if let Some(c) = self.slots[slot].as_mut() {
                if allowed {
                    c.forwarded += 1;
                } else {
                    c.dropped_policy += 1;
                }
                c.ep.recycle(p);
            }
        }
        None
    }

    /// The next event, with the client's name; link ids are global.
    pub fn poll_event(&mut self) -> Option<(String, Event)> {
        loop {
            if let Some((slot, ev)) = self.events.pop_front() {
                let name = self.slots[slot].as_ref()?.spec.name.clone();
                return Some((name, ev));
            }
            let mut any = false;
            while let Some(slot) = self.to_report.pop() {
                let Some(c) = self.slots[slot].as_mut() else {
                    continue;
                };
                while let Some(ev) = c.ep.poll_event() {
                    any = true;
                    let ev = match ev {
                        Event::LinkState { link, state } => Event::LinkState {
                            link: global_link(slot, link),
                            state,
                        },
                        Event::LinkLearned { link, addr } => Event::LinkLearned {
                            link: global_link(slot, link),
                            addr,
                        },
                        Event::LinkSilent {
                            link,
                            silent,
                            after,
                        } => Event::LinkSilent {
                            link: global_link(slot, link),
                            silent,
                            after,
                        },
                        other => other,
                    };
                    self.events.push_back((slot, ev));
                }
            }
            if !any {
                return None;
            }
        }
    }

    /// Gives a buffer back (to any endpoint: they are all alike).
    pub fn recycle(&mut self, buf: Vec<u8>) {
        if let Some(c) = self.slots.iter_mut().flatten().next() {
            c.ep.recycle(buf);
        }
    }

    // -------------------------------------------------------------- time

    /// The earliest of the clients' timers (kept per slot, read again whenever a slot is
    /// touched: no endpoint is asked here).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadlines.iter().flatten().min().copied()
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        for slot in 0..self.deadlines.len() {
            if self.deadlines[slot].is_none_or(|t| t > now) {
                continue;
            }
            if let Some(c) = self.slots[slot].as_mut() {
                c.ep.handle_timeout(now);
            }
            self.touch(slot);
            self.refresh_sids(slot);
        }
    }

    /// Ends every client's session (CLOSE on its links).
    pub fn close(&mut self, now: Instant) {
        for slot in 0..self.slots.len() {
            if let Some(c) = self.slots[slot].as_mut() {
                c.ep.close(now);
                self.touch(slot);
            }
        }
    }

    // -------------------------------------------------------------- links (global ids)

    pub fn set_link_mtu(&mut self, global: LinkId, max: usize) {
        if let Some((slot, link)) = split_link(global) {
            if let Some(c) = self.slots.get_mut(slot).and_then(Option::as_mut) {
                c.ep.set_link_mtu(link, max);
                self.touch(slot);
            }
        }
    }

    pub fn handle_too_big(&mut self, now: Instant, global: LinkId, size: usize) {
        if let Some((slot, link)) = split_link(global) {
            if let Some(c) = self.slots.get_mut(slot).and_then(Option::as_mut) {
                c.ep.handle_too_big(now, link, size);
                self.touch(slot);
            }
        }
    }

    /// `client/link` for a global link id (for logs).
    pub fn link_label(&self, global: LinkId) -> String {
        match split_link(global).and_then(|(s, l)| Some((self.slots.get(s)?.as_ref()?, l))) {
            Some((c, l)) => format!("{}/link{l}", c.spec.name),
            None => format!("link{global}"),
        }
    }

    // -------------------------------------------------------------- state

    pub fn is_connected(&self) -> bool {
        self.clients().any(|c| c.ep.is_connected())
    }

    pub fn drops(&self) -> &ConcentratorDrops {
        &self.drops
    }

    /// Every client's statistics, in slot order; link ids in them are global.
    pub fn stats(&self, now: Instant) -> Vec<ClientStats> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(slot, c)| {
                let c = c.as_ref()?;
                let mut stats = c.ep.stats(now);
                for l in &mut stats.links {
                    l.id = global_link(slot, l.id);
                }
                Some(ClientStats {
                    name: c.spec.name.clone(),
                    public_key: c.spec.public_key,
                    prefixes: c.spec.prefixes(),
                    connected: c.ep.is_connected(),
                    stats,
                    dropped_source: c.dropped_source,
                    dropped_policy: c.dropped_policy,
                    dropped_queue: c.dropped_queue,
                    forwarded: c.forwarded,
                })
            })
            .collect()
    }
}

/// The source and destination addresses of an IPv4 or IPv6 packet.
pub fn inner_addrs(p: &[u8]) -> Option<(IpAddr, IpAddr)> {
    match p.first()? >> 4 {
        4 if p.len() >= 20 => {
            let src = <[u8; 4]>::try_from(&p[12..16]).ok()?;
            let dst = <[u8; 4]>::try_from(&p[16..20]).ok()?;
            Some((IpAddr::from(src), IpAddr::from(dst)))
        }
        6 if p.len() >= 40 => {
            let src = <[u8; 16]>::try_from(&p[8..24]).ok()?;
            let dst = <[u8; 16]>::try_from(&p[24..40]).ok()?;
            Some((IpAddr::from(src), IpAddr::from(dst)))
        }
        _ => None,
    }
}
