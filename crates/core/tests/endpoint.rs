//! Endpoint stories: handshakes, restarts, bad keys, replays, CLOSE. Two endpoints wired back
//! to back with no delay; time advances explicitly.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use braid_core::endpoint::{Config, Endpoint, Event, LinkConfig, Role};
use braid_core::LinkState;
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;

const KEY: [u8; 32] = [42; 32];

fn client_addr(link: u16) -> SocketAddr {
    format!("198.18.{link}.1:40000").parse().unwrap()
}

fn server_addr() -> SocketAddr {
    "198.18.0.2:5050".parse().unwrap()
}

struct Pair {
    base: Instant,
    now: Instant,
    client: Endpoint,
    server: Endpoint,
    /// Datagrams captured from the client (for replay tests).
    captured: Vec<(u16, Vec<u8>)>,
    client_events: Vec<Event>,
    server_events: Vec<Event>,
    delivered_to_server: Vec<Vec<u8>>,
    delivered_to_client: Vec<Vec<u8>>,
    /// Links whose datagrams are dropped (both ways).
    dark: Vec<u16>,
}

fn endpoint(role: Role, key: [u8; 32], seed: u64, now: Instant) -> Endpoint {
    Endpoint::new(
        Config::new(role, key),
        now,
        Box::new(ChaCha8Rng::seed_from_u64(seed)),
    )
    .unwrap()
}

impl Pair {
    fn new(links: u16) -> Self {
        Self::with_keys(links, KEY, KEY)
    }
    fn with_keys(links: u16, ck: [u8; 32], sk: [u8; 32]) -> Self {
        Self::with_config(links, Config::new(Role::Client, ck), sk)
    }
    fn with_config(links: u16, client_cfg: Config, sk: [u8; 32]) -> Self {
        let base = Instant::now();
        let mut client =
            Endpoint::new(client_cfg, base, Box::new(ChaCha8Rng::seed_from_u64(1))).unwrap();
        for id in 1..=links {
            client
                .add_link(
                    base,
                    id,
                    LinkConfig {
                        name: format!("l{id}"),
                        ..Default::default()
                    },
                )
                .unwrap();
        }
        Pair {
            base,
            now: base,
            client,
            server: endpoint(Role::Server, sk, 2, base),
            captured: Vec::new(),
            client_events: Vec::new(),
            server_events: Vec::new(),
            delivered_to_server: Vec::new(),
            delivered_to_client: Vec::new(),
            dark: Vec::new(),
        }
    }

    /// Moves every queued datagram across, repeatedly, until both sides are quiet.
    fn exchange(&mut self) {
        loop {
            let mut moved = false;
            while let Some(mut t) = self.client.poll_transmit() {
                moved = true;
                self.captured.push((t.link, t.payload.clone()));
                if !self.dark.contains(&t.link) {
                    self.server.handle_datagram(
                        self.now,
                        None,
                        client_addr(t.link),
                        &mut t.payload,
                    );
                }
            }
            while let Some(mut t) = self.server.poll_transmit() {
                moved = true;
                let link = (1..=8)
                    .find(|&l| Some(client_addr(l)) == t.dst)
                    .expect("server replies to a client address");
                if !self.dark.contains(&link) {
                    self.client.handle_datagram(
                        self.now,
                        Some(link),
                        server_addr(),
                        &mut t.payload,
                    );
                }
            }
            while let Some(p) = self.server.poll_deliver(self.now) {
                self.delivered_to_server.push(p);
            }
            while let Some(p) = self.client.poll_deliver(self.now) {
                self.delivered_to_client.push(p);
            }
            while let Some(e) = self.client.poll_event() {
                self.client_events.push(e);
            }
            while let Some(e) = self.server.poll_event() {
                self.server_events.push(e);
            }
            if !moved {
                break;
            }
        }
    }

    /// Runs timers and exchanges until `d` has passed, in steps of at most 10 ms.
    fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        while self.now < end {
            let next = [self.client.poll_timeout(), self.server.poll_timeout()]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(end)
                .min(self.now + Duration::from_millis(10))
                .min(end)
                .max(self.now);
            self.now = next;
            self.client.handle_timeout(self.now);
            self.server.handle_timeout(self.now);
            self.exchange();
            if next == end {
                break;
            }
        }
    }

    fn link_states(&self, ep: &Endpoint) -> Vec<LinkState> {
        ep.stats(self.now).links.iter().map(|l| l.state).collect()
    }
}

fn ip_packet(id: u8) -> Vec<u8> {
    let mut p = vec![0u8; 60];
    p[0] = 0x45;
    p[9] = 17;
    p[20] = id;
    p
}

/// An IPv6 UDP packet 2001:2::1 -> 2001:2::2, source port `port`, marked `id`.
fn ipv6_packet(port: u16, id: u8) -> Vec<u8> {
    let mut p = vec![0u8; 80];
    p[0] = 0x60;
    p[4..6].copy_from_slice(&40u16.to_be_bytes());
    p[6] = 17;
    p[7] = 64;
    let src: std::net::Ipv6Addr = "2001:2::1".parse().unwrap();
    let dst: std::net::Ipv6Addr = "2001:2::2".parse().unwrap();
    p[8..24].copy_from_slice(&src.octets());
    p[24..40].copy_from_slice(&dst.octets());
    p[40..42].copy_from_slice(&port.to_be_bytes());
    p[42..44].copy_from_slice(&5001u16.to_be_bytes());
    p[48] = id;
    p
}

#[test]
fn handshake_brings_session_and_links_up() {
    let mut p = Pair::new(3);
    p.run_for(Duration::from_secs(1));
    assert!(p.client.is_connected() && p.server.is_connected());
    assert_eq!(p.link_states(&p.client), vec![LinkState::Up; 3]);
    assert_eq!(
        p.server.stats(p.now).links.len(),
        3,
        "server learned every link"
    );
    assert_eq!(p.link_states(&p.server), vec![LinkState::Up; 3]);
    assert!(p
        .client_events
        .iter()
        .any(|e| matches!(e, Event::SessionUp { .. })));
}

#[test]
fn data_flows_both_ways_in_order() {
    let mut p = Pair::new(2);
    p.run_for(Duration::from_secs(1));
    for i in 0..50 {
        p.client.send_packet(p.now, &ip_packet(i));
        p.server.send_packet(p.now, &ip_packet(100 + i));
    }
    p.exchange();
    p.run_for(Duration::from_millis(100));
    let ids: Vec<u8> = p.delivered_to_server.iter().map(|b| b[20]).collect();
    assert_eq!(ids, (0..50).collect::<Vec<u8>>());
    let ids: Vec<u8> = p.delivered_to_client.iter().map(|b| b[20]).collect();
    assert_eq!(ids, (100..150).collect::<Vec<u8>>());
}

/// The tunnel carries IP packets of either version: IPv4 and IPv6 interleaved arrive unchanged
/// and in order, both ways.
#[test]
fn ipv4_and_ipv6_inner_packets_cross_unchanged() {
    let mut p = Pair::new(3);
    p.run_for(Duration::from_secs(1));
    let mut sent_up = Vec::new();
    let mut sent_down = Vec::new();
    for i in 0..40u8 {
        let up = if i % 2 == 0 {
            ip_packet(i)
        } else {
            ipv6_packet(4000, i)
        };
        let down = if i % 3 == 0 {
            ipv6_packet(5000, i)
        } else {
            ip_packet(i)
        };
        p.client.send_packet(p.now, &up);
        p.server.send_packet(p.now, &down);
        sent_up.push(up);
        sent_down.push(down);
    }
    p.exchange();
    p.run_for(Duration::from_millis(100));
    assert_eq!(p.delivered_to_server, sent_up);
    assert_eq!(p.delivered_to_client, sent_down);
}

/// `flow-hash` reads IPv6 headers: each IPv6 flow (addresses, next header, ports) stays on one
/// link, and different source ports spread over the links.
#[test]
fn flow_hash_keeps_each_ipv6_flow_on_one_link() {
    let mut cfg = Config::new(Role::Client, KEY);
    cfg.scheduler = "flow-hash".into();
    let mut p = Pair::with_config(4, cfg, KEY);
    p.run_for(Duration::from_secs(1));
    let mut used = std::collections::BTreeSet::new();
    for port in 40000..40032u16 {
        let before = p.captured.len();
        for i in 0..5 {
            p.client.send_packet(p.now, &ipv6_packet(port, i));
        }
        p.exchange();
        let links: std::collections::BTreeSet<u16> =
            p.captured[before..].iter().map(|(l, _)| *l).collect();
        assert_eq!(links.len(), 1, "flow from port {port} used links {links:?}");
        used.extend(links);
    }
    assert!(used.len() >= 3, "32 flows used only links {used:?}");
    assert_eq!(p.delivered_to_server.len(), 32 * 5);
}

#[test]
fn wrong_key_never_gets_a_session_and_is_counted() {
    let mut p = Pair::with_keys(2, KEY, [1; 32]);
    p.run_for(Duration::from_secs(2));
    assert!(!p.client.is_connected());
    assert!(!p.server.is_connected());
    assert!(
        p.server.stats(p.now).drops.auth > 0,
        "failed HELLOs are counted"
    );
}

#[test]
fn replayed_datagrams_are_dropped_and_counted() {
    let mut p = Pair::new(1);
    p.run_for(Duration::from_secs(1));
    p.captured.clear();
    p.client.send_packet(p.now, &ip_packet(7));
    p.exchange();
    assert_eq!(p.delivered_to_server.len(), 1);
    let replays: Vec<_> = p.captured.clone();
    for (_, mut d) in replays {
        p.server
            .handle_datagram(p.now, None, client_addr(1), &mut d);
    }
    p.exchange();
    assert_eq!(
        p.delivered_to_server.len(),
        1,
        "a replay is not delivered again"
    );
    assert!(p.server.stats(p.now).drops.replay >= 1);
}

#[test]
fn replayed_hello_does_not_disturb_the_session() {
    let mut p = Pair::new(1);
    let first_hello = {
        p.client.handle_timeout(p.now);
        let t = p.client.poll_transmit().expect("hello");
        let copy = t.payload.clone();
        let mut d = t.payload;
        p.server
            .handle_datagram(p.now, None, client_addr(1), &mut d);
        copy
    };
    p.run_for(Duration::from_secs(1));
    let session = p.server.stats(p.now).session;
    assert!(session.is_some());
    let mut d = first_hello;
    p.server
        .handle_datagram(p.now, None, client_addr(1), &mut d);
    p.run_for(Duration::from_millis(500));
    assert_eq!(
        p.server.stats(p.now).session,
        session,
        "an old HELLO must not replace the session"
    );
    p.client.send_packet(p.now, &ip_packet(9));
    p.exchange();
    assert_eq!(p.delivered_to_server.last().map(|b| b[20]), Some(9));
}

#[test]
fn restarted_client_gets_a_new_session_without_restarting_the_server() {
    let mut p = Pair::new(2);
    p.run_for(Duration::from_secs(1));
    let old = p.server.stats(p.now).session;
    let mut fresh = endpoint(Role::Client, KEY, 99, p.now);
    for id in 1..=2 {
        fresh.add_link(p.now, id, LinkConfig::default()).unwrap();
    }
    p.client = fresh;
    p.run_for(Duration::from_secs(1));
    assert!(p.client.is_connected());
    assert_ne!(p.server.stats(p.now).session, old);
    p.client.send_packet(p.now, &ip_packet(3));
    p.exchange();
    assert_eq!(p.delivered_to_server.last().map(|b| b[20]), Some(3));
}

#[test]
fn restarted_server_is_rejoined_by_the_client() {
    let mut p = Pair::new(2);
    p.run_for(Duration::from_secs(1));
    p.server = endpoint(Role::Server, KEY, 77, p.now);
    p.run_for(Duration::from_secs(4));
    assert!(p.server.is_connected(), "client re-handshook");
    p.client.send_packet(p.now, &ip_packet(5));
    p.exchange();
    assert_eq!(p.delivered_to_server.last().map(|b| b[20]), Some(5));
}

#[test]
fn dead_link_goes_down_in_under_a_second_and_comes_back() {
    let mut p = Pair::new(2);
    p.run_for(Duration::from_secs(1));
    p.client_events.clear();
    p.dark.push(2);
    let t0 = p.now;
    let mut down_at = None;
    for _ in 0..200 {
        p.run_for(Duration::from_millis(10));
        if p.link_states(&p.client)[1] == LinkState::Down {
            down_at = Some(p.now - t0);
            break;
        }
    }
    let down_at = down_at.expect("link 2 went down");
    assert!(down_at < Duration::from_secs(1), "took {down_at:?}");
    assert_eq!(p.link_states(&p.client)[0], LinkState::Up);
    p.dark.clear();
    p.run_for(Duration::from_secs(1));
    assert_eq!(
        p.link_states(&p.client),
        vec![LinkState::Up; 2],
        "came back by itself"
    );
}

#[test]
fn close_ends_the_session_on_the_peer() {
    let mut p = Pair::new(1);
    p.run_for(Duration::from_secs(1));
    p.client.close(p.now);
    p.exchange();
    assert!(!p.server.is_connected());
    assert!(p
        .server_events
        .iter()
        .any(|e| matches!(e, Event::SessionClosed)));
}

#[test]
fn garbage_never_panics() {
    let mut p = Pair::new(1);
    p.run_for(Duration::from_secs(1));
    let mut seed = 0x1234_5678_u64;
    for len in 0..400usize {
        let mut d: Vec<u8> = (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        if len > 2 {
            d[0] = 1; // right version, so parsing goes deeper
        }
        p.server
            .handle_datagram(p.now, None, client_addr(1), &mut d.clone());
        p.client
            .handle_datagram(p.now, Some(1), server_addr(), &mut d);
    }
    p.exchange();
    assert!(p.client.is_connected() && p.server.is_connected());
    let _ = p.base;
}

#[test]
fn kernel_link_error_takes_the_link_down_at_once_and_it_comes_back() {
    let mut p = Pair::new(2);
    p.run_for(Duration::from_secs(1));
    p.client.handle_link_error(p.now, 2);
    assert_eq!(
        p.link_states(&p.client),
        vec![LinkState::Up, LinkState::Down]
    );
    p.client_events.clear();
    p.exchange();
    // Nothing was wrong with it after all: its probes are answered and it rises again.
    p.run_for(Duration::from_secs(1));
    assert_eq!(p.link_states(&p.client), vec![LinkState::Up; 2]);
}

/// `handle_datagram` says which link a datagram authenticated as, and nothing for garbage,
/// a wrong key or a replay: the I/O layer learns reply addresses only from what it returns.
#[test]
fn handle_datagram_reports_only_authenticated_links() {
    use braid_core::Received;
    let mut p = Pair::new(2);
    let mut garbage = vec![0xabu8; 120];
    assert_eq!(
        p.server
            .handle_datagram(p.now, None, client_addr(1), &mut garbage),
        Received::Ignored
    );
    p.client.handle_timeout(p.now);
    let hello = p.client.poll_transmit().expect("hello");
    let mut forged = hello.payload.clone();
    let last = forged.len() - 1;
    forged[last] ^= 1;
    assert_eq!(
        p.server
            .handle_datagram(p.now, None, client_addr(1), &mut forged),
        Received::Ignored,
        "a HELLO that fails authentication"
    );
    let mut d = hello.payload;
    assert_eq!(
        p.server
            .handle_datagram(p.now, None, client_addr(hello.link), &mut d),
        Received::Hello(hello.link)
    );
    p.run_for(Duration::from_secs(1));
    assert!(p.server.is_connected());
    p.captured.clear();
    p.client.send_packet(p.now, &ip_packet(3));
    let t = p.client.poll_transmit().expect("data");
    let mut copy = t.payload.clone();
    let mut d = t.payload;
    assert_eq!(
        p.server
            .handle_datagram(p.now, None, client_addr(t.link), &mut d),
        Received::Link(t.link)
    );
    assert_eq!(
        p.server
            .handle_datagram(p.now, None, client_addr(t.link), &mut copy),
        Received::Ignored,
        "a replay"
    );
}
