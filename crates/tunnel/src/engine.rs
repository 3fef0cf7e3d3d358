//! What the runner drives: one bundle's endpoint (a client, or a server with a PSK or one
//! client), or a concentrator of many client bundles (a server with `[[client]]` tables). Both
//! are sans-I/O cores with the same shape; this enum gives the runner one set of calls, with
//! link ids that are the concentrator's global ones in the second case.

use std::net::SocketAddr;
use std::time::Instant;

use braid_core::concentrator::{ClientStats, Concentrator, ConcentratorDrops};
use braid_core::endpoint::{BundleStats, Event, Received, RxMeta, Transmit};
use braid_core::{Endpoint, LinkId};

pub enum Engine {
    Bundle(Box<Endpoint>),
    Sites(Box<Concentrator>),
}

impl Engine {
    /// The bundle's endpoint (client-only operations: links, kernel link errors).
    pub fn endpoint_mut(&mut self) -> Option<&mut Endpoint> {
        match self {
            Engine::Bundle(ep) => Some(ep),
            Engine::Sites(_) => None,
        }
    }

    pub fn endpoint(&self) -> Option<&Endpoint> {
        match self {
            Engine::Bundle(ep) => Some(ep),
            Engine::Sites(_) => None,
        }
    }

    pub fn concentrator_mut(&mut self) -> Option<&mut Concentrator> {
        match self {
            Engine::Sites(c) => Some(c),
            Engine::Bundle(_) => None,
        }
    }

    /// A datagram that reached this host at `arrived`, with its outer ECN field (see
    /// [`Endpoint::handle_datagram_at`]).
    pub fn handle_datagram_at(
        &mut self,
        now: Instant,
        arrived: RxMeta,
        via: Option<LinkId>,
        from: SocketAddr,
        datagram: &mut [u8],
    ) -> Received {
        match self {
            Engine::Bundle(ep) => ep.handle_datagram_at(now, arrived, via, from, datagram),
            Engine::Sites(c) => c.handle_datagram_at(now, arrived, from, datagram),
        }
    }

    pub fn send_packet(&mut self, now: Instant, packet: &[u8]) {
        match self {
            Engine::Bundle(ep) => ep.send_packet(now, packet),
            Engine::Sites(c) => c.send_packet(now, packet),
        }
    }

    /// Back-pressure (`backpressure`): a bundle's endpoint, or every client's of a concentrator
    /// (each has its own queue).
    pub fn set_backpressure(&mut self, on: bool) {
        match self {
            Engine::Bundle(ep) => ep.set_backpressure(on),
            Engine::Sites(c) => c.set_backpressure(on),
        }
    }

    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        match self {
            Engine::Bundle(ep) => ep.poll_transmit(),
            Engine::Sites(c) => c.poll_transmit(),
        }
    }

    pub fn poll_deliver(&mut self, now: Instant) -> Option<Vec<u8>> {
        match self {
            Engine::Bundle(ep) => ep.poll_deliver(now),
            Engine::Sites(c) => c.poll_deliver(now),
        }
    }

    /// The next event, with the client's name in a concentrator.
    pub fn poll_event(&mut self) -> Option<(Option<String>, Event)> {
        match self {
            Engine::Bundle(ep) => ep.poll_event().map(|e| (None, e)),
            Engine::Sites(c) => c.poll_event().map(|(n, e)| (Some(n), e)),
        }
    }

    pub fn recycle(&mut self, buf: Vec<u8>) {
        match self {
            Engine::Bundle(ep) => ep.recycle(buf),
            Engine::Sites(c) => c.recycle(buf),
        }
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        match self {
            Engine::Bundle(ep) => ep.poll_timeout(),
            Engine::Sites(c) => c.poll_timeout(),
        }
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        match self {
            Engine::Bundle(ep) => ep.handle_timeout(now),
            Engine::Sites(c) => c.handle_timeout(now),
        }
    }

    pub fn close(&mut self, now: Instant) {
        match self {
            Engine::Bundle(ep) => ep.close(now),
            Engine::Sites(c) => c.close(now),
        }
    }

    pub fn is_connected(&self) -> bool {
        match self {
            Engine::Bundle(ep) => ep.is_connected(),
            Engine::Sites(c) => c.is_connected(),
        }
    }

    pub fn set_link_mtu(&mut self, id: LinkId, max: usize) {
        match self {
            Engine::Bundle(ep) => ep.set_link_mtu(id, max),
            Engine::Sites(c) => c.set_link_mtu(id, max),
        }
    }

    pub fn handle_too_big(&mut self, now: Instant, id: LinkId, size: usize) {
        match self {
            Engine::Bundle(ep) => ep.handle_too_big(now, id, size),
            Engine::Sites(c) => c.handle_too_big(now, id, size),
        }
    }

    /// Server: every learned link with the client address it answers to.
    pub fn link_addrs(&self, now: Instant) -> Vec<(LinkId, SocketAddr)> {
        let of = |s: &BundleStats| -> Vec<(LinkId, SocketAddr)> {
            s.links
                .iter()
                .filter_map(|l| Some((l.id, l.addr?)))
                .collect()
        };
        match self {
            Engine::Bundle(ep) => of(&ep.stats(now)),
            Engine::Sites(c) => c.stats(now).iter().flat_map(|s| of(&s.stats)).collect(),
        }
    }

    /// Datagrams that failed authentication (for the "not the same key" log line).
    pub fn auth_drops(&self, now: Instant) -> u64 {
        match self {
            Engine::Bundle(ep) => ep.stats(now).drops.auth,
            Engine::Sites(c) => {
                c.drops().unknown_client
                    + c.stats(now).iter().map(|s| s.stats.drops.auth).sum::<u64>()
            }
        }
    }

    /// The statistics for status and metrics: the bundle's, or the concentrator's own drops and
    /// every client's.
    pub fn stats(&self, now: Instant) -> EngineStats {
        match self {
            Engine::Bundle(ep) => EngineStats::Bundle(Box::new(ep.stats(now))),
            Engine::Sites(c) => EngineStats::Sites {
                drops: c.drops().clone(),
                clients: c.stats(now),
            },
        }
    }

    /// A link's name for logs (`site-a/link2` in a concentrator).
    pub fn link_label(&self, id: LinkId) -> Option<String> {
        match self {
            Engine::Bundle(_) => None,
            Engine::Sites(c) => Some(c.link_label(id)),
        }
    }
}

/// See [`Engine::stats`].
#[derive(Debug, Clone)]
pub enum EngineStats {
    Bundle(Box<BundleStats>),
    Sites {
        drops: ConcentratorDrops,
        clients: Vec<ClientStats>,
    },
}
