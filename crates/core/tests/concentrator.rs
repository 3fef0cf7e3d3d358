//! Concentrator stories (issue 14): several client bundles, each with its own key pair, on one
//! server; routing by inner destination, source filtering, client-to-client policy, adding and
//! removing clients, fair share of the output. Endpoints wired back to back in virtual time.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use braid_core::concentrator::{ClientSpec, Concentrator, MAX_QUEUED_PER_CLIENT};
use braid_core::endpoint::{Config, Endpoint, Identity, LinkConfig, Role};
use braid_core::identity::KeyPair;
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;

const SERVER_KEY: [u8; 32] = [200; 32];

fn server_addr() -> SocketAddr {
    "198.18.0.1:5050".parse().unwrap()
}

/// Client `i`'s link `l` comes from 198.18.<i>.<l>.
fn client_addr(i: usize, l: u16) -> SocketAddr {
    format!("198.18.{i}.{l}:40000").parse().unwrap()
}

/// Site `i`: tunnel address 198.19.0.<i+1>, LAN 198.18.<10 i>.0/24.
fn spec(i: usize, reach: &[&str]) -> ClientSpec {
    ClientSpec {
        name: format!("site{i}"),
        public_key: KeyPair::from_private([i as u8; 32]).public(),
        v4: Some((Ipv4Addr::new(198, 19, 0, i as u8 + 1), 24)),
        v6: None,
        lans: vec![format!("198.18.{}.0/24", 10 * i).parse().unwrap()],
        reach: reach.iter().map(|s| s.to_string()).collect(),
    }
}

fn client(i: usize, now: Instant) -> Endpoint {
    let mut c = Config::new(Role::Client, [0; 32]);
    c.identity = Some(Identity {
        own: KeyPair::from_private([i as u8; 32]),
        peer: KeyPair::from_private(SERVER_KEY).public(),
        v4: None,
        v6: None,
    });
    let mut ep = Endpoint::new(c, now, Box::new(ChaCha8Rng::seed_from_u64(i as u64))).unwrap();
    for l in 1..=2 {
        ep.add_link(now, l, LinkConfig::default()).unwrap();
    }
    ep
}

/// An IPv4 UDP packet from `src` to `dst` carrying `id`.
fn packet(src: &str, dst: &str, id: u8) -> Vec<u8> {
    let mut p = vec![0u8; 28 + 4];
    p[0] = 0x45;
    let len = p.len() as u16;
    p[2..4].copy_from_slice(&len.to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&src.parse::<Ipv4Addr>().unwrap().octets());
    p[16..20].copy_from_slice(&dst.parse::<Ipv4Addr>().unwrap().octets());
    p[28] = id;
    p
}

struct World {
    now: Instant,
    server: Concentrator,
    /// Client index (1-based) and its endpoint.
    clients: Vec<(usize, Endpoint)>,
    to_tun: Vec<Vec<u8>>,
    /// Per client index: what its endpoint delivered.
    at_client: Vec<(usize, Vec<u8>)>,
}

impl World {
    fn new(specs: Vec<ClientSpec>, clients: &[usize]) -> World {
        let now = Instant::now();
        let mut server = Concentrator::new(
            Config::new(Role::Server, [0; 32]),
            KeyPair::from_private(SERVER_KEY),
            Box::new(ChaCha8Rng::seed_from_u64(99)),
        );
        for s in specs {
            server.add_client(now, s).unwrap();
        }
        World {
            now,
            server,
            clients: clients.iter().map(|&i| (i, client(i, now))).collect(),
            to_tun: Vec::new(),
            at_client: Vec::new(),
        }
    }

    fn exchange(&mut self) {
        loop {
            let mut moved = false;
            for (i, c) in &mut self.clients {
                while let Some(mut t) = c.poll_transmit() {
                    moved = true;
                    self.server
                        .handle_datagram(self.now, client_addr(*i, t.link), &mut t.payload);
                }
            }
            while let Some(mut t) = self.server.poll_transmit() {
                moved = true;
                let dst = t.dst.expect("the server names the destination");
                if let Some((_, c)) = self
                    .clients
                    .iter_mut()
                    .find(|(i, _)| (1..=2).any(|l| client_addr(*i, l) == dst))
                {
                    let link = t.link & 0xff;
                    c.handle_datagram(self.now, Some(link), server_addr(), &mut t.payload);
                }
            }
            while let Some(p) = self.server.poll_deliver(self.now) {
                self.to_tun.push(p);
            }
            for (i, c) in &mut self.clients {
                while let Some(p) = c.poll_deliver(self.now) {
                    self.at_client.push((*i, p));
                }
                while c.poll_event().is_some() {}
            }
            while self.server.poll_event().is_some() {}
            if !moved {
                break;
            }
        }
    }

    fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        while self.now < end {
            self.now = (self.now + Duration::from_millis(10)).min(end);
            for (_, c) in &mut self.clients {
                c.handle_timeout(self.now);
            }
            self.server.handle_timeout(self.now);
            self.exchange();
        }
    }

    fn client_send(&mut self, i: usize, packet: &[u8]) {
        let now = self.now;
        self.client_mut(i).send_packet(now, packet);
    }

    fn client_mut(&mut self, i: usize) -> &mut Endpoint {
        &mut self.clients.iter_mut().find(|(j, _)| *j == i).unwrap().1
    }

    fn ids_at(&self, i: usize) -> Vec<u8> {
        self.at_client
            .iter()
            .filter(|(j, _)| *j == i)
            .map(|(_, p)| p[28])
            .collect()
    }
}

/// Two sites come up on one server with their own sessions; the server routes each packet
/// from its TUN device to the site whose LAN or tunnel address it is for, and counts the rest.
#[test]
fn sites_get_their_own_sessions_and_packets_by_destination() {
    let mut w = World::new(vec![spec(1, &[]), spec(2, &[])], &[1, 2]);
    w.run_for(Duration::from_secs(1));
    let stats = w.server.stats(w.now);
    assert_eq!(stats.len(), 2);
    assert!(stats.iter().all(|c| c.connected), "{stats:?}");
    assert_ne!(stats[0].stats.session, stats[1].stats.session);
    assert!(stats.iter().all(|c| c.stats.links.len() == 2));

    w.server
        .send_packet(w.now, &packet("198.19.0.1", "198.18.10.5", 1));
    w.server
        .send_packet(w.now, &packet("198.19.0.1", "198.18.20.5", 2));
    w.server
        .send_packet(w.now, &packet("198.19.0.1", "198.19.0.3", 3));
    w.server
        .send_packet(w.now, &packet("198.19.0.1", "198.18.30.5", 4));
    w.exchange();
    w.run_for(Duration::from_millis(100));
    assert_eq!(w.ids_at(1), vec![1]);
    assert_eq!(w.ids_at(2), vec![2, 3]);
    assert_eq!(w.server.drops().no_route, 1);

    // Upstream: each site's packets reach the TUN device.
    w.client_send(1, &packet("198.18.10.5", "198.19.0.1", 11));
    w.client_send(2, &packet("198.19.0.3", "198.19.0.1", 12));
    w.exchange();
    w.run_for(Duration::from_millis(100));
    let up: Vec<u8> = w.to_tun.iter().map(|p| p[28]).collect();
    assert_eq!(up, vec![11, 12]);
}

/// A site cannot speak for another: an inner source outside its own prefixes is dropped and
/// counted; client-to-client traffic passes only where the sender may reach the receiver.
#[test]
fn spoofed_sources_and_unallowed_site_to_site_traffic_are_dropped() {
    let mut w = World::new(vec![spec(1, &["site2"]), spec(2, &[])], &[1, 2]);
    w.run_for(Duration::from_secs(1));
    w.client_send(1, &packet("198.18.20.9", "198.19.0.1", 1));
    w.client_send(1, &packet("198.18.99.9", "198.19.0.1", 2));
    // Allowed: site1 -> site2, delivered to site2 directly (not to the TUN device).
    w.client_send(1, &packet("198.18.10.7", "198.18.20.7", 3));
    // Not allowed: site2 -> site1.
    w.client_send(2, &packet("198.18.20.7", "198.18.10.7", 4));
    w.exchange();
    w.run_for(Duration::from_millis(200));
    assert!(w.to_tun.is_empty(), "{:?}", w.to_tun);
    assert_eq!(w.ids_at(2), vec![3]);
    assert!(w.ids_at(1).is_empty());
    let stats = w.server.stats(w.now);
    assert_eq!(stats[0].dropped_source, 2);
    assert_eq!(stats[0].forwarded, 1);
    assert_eq!(stats[1].dropped_policy, 1);
}

/// A client whose key is not listed gets no session and is counted; adding it at run time lets
/// it in, and removing another leaves the rest untouched.
#[test]
fn clients_are_added_and_removed_at_run_time_without_disturbing_the_others() {
    let mut w = World::new(vec![spec(1, &[]), spec(2, &[])], &[1, 2, 3]);
    w.run_for(Duration::from_secs(1));
    assert!(!w.client_mut(3).is_connected());
    assert!(w.server.drops().unknown_client > 0);
    let before = w.server.stats(w.now);

    w.server.add_client(w.now, spec(3, &[])).unwrap();
    w.run_for(Duration::from_secs(1));
    assert!(w.client_mut(3).is_connected());
    w.server.remove_client(w.now, "site2").unwrap();
    w.run_for(Duration::from_millis(500));
    let after = w.server.stats(w.now);
    assert_eq!(
        after.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
        vec!["site1", "site3"]
    );
    // site1 kept its session all along.
    assert_eq!(after[0].stats.session, before[0].stats.session);
    w.server
        .send_packet(w.now, &packet("198.19.0.1", "198.18.20.5", 1));
    w.server
        .send_packet(w.now, &packet("198.19.0.1", "198.18.10.5", 2));
    w.server
        .send_packet(w.now, &packet("198.19.0.1", "198.18.30.5", 3));
    w.exchange();
    w.run_for(Duration::from_millis(100));
    assert_eq!(
        w.server.drops().no_route,
        1,
        "site2's LAN has no route any more"
    );
    assert_eq!(w.ids_at(1), vec![2]);
    assert_eq!(w.ids_at(3), vec![3]);
    // Mistakes are named.
    let e = w.server.add_client(w.now, spec(1, &[])).unwrap_err();
    assert!(e.to_string().contains("already exists"), "{e}");
    let mut dup = spec(4, &[]);
    dup.lans = vec![
        "198.18.10.128/25".parse().unwrap(),
        "198.18.10.0/24".parse().unwrap(),
    ];
    let e = w.server.add_client(w.now, dup).unwrap_err();
    assert!(
        e.to_string().contains("already routed to client \"site1\""),
        "{e}"
    );
    assert!(w.server.remove_client(w.now, "nobody").is_err());
}

/// Fair share on the server's TUN-to-links direction: a flood for one site neither delays
/// another site's packets behind it (datagrams leave round-robin) nor grows memory (each site's
/// queue is bounded; the flood loses its own packets).
#[test]
fn a_flood_for_one_site_does_not_starve_another() {
    let mut w = World::new(vec![spec(1, &[]), spec(2, &[])], &[1, 2]);
    w.run_for(Duration::from_secs(1));
    let flood = MAX_QUEUED_PER_CLIENT + 2000;
    for k in 0..flood {
        w.server
            .send_packet(w.now, &packet("198.19.0.1", "198.18.10.5", k as u8));
    }
    for k in 0..50 {
        w.server
            .send_packet(w.now, &packet("198.19.0.1", "198.18.20.5", k));
    }
    // The socket takes 200 datagrams: site2's 50 are among them.
    let mut site2 = 0;
    for _ in 0..200 {
        let t = w.server.poll_transmit().expect("datagrams");
        if t.link >> 8 == 2 {
            site2 += 1;
        }
    }
    assert_eq!(site2, 50, "site2 waited behind the flood");
    let stats = w.server.stats(w.now);
    assert!(stats[0].dropped_queue >= 2000, "{}", stats[0].dropped_queue);
    assert_eq!(stats[1].dropped_queue, 0);
}

/// `backpressure = true` on a concentrator reaches every client's endpoint, those there and
/// those added later (it was accepted and ignored: only a single bundle's endpoint got it).
#[test]
fn back_pressure_reaches_every_client_endpoint() {
    let mut w = World::new(vec![spec(1, &[])], &[1, 2]);
    let on = |w: &World| {
        w.server
            .stats(w.now)
            .iter()
            .map(|c| c.stats.backpressure)
            .collect::<Vec<_>>()
    };
    assert_eq!(on(&w), vec![false]);
    w.server.set_backpressure(true);
    w.server.add_client(w.now, spec(2, &[])).unwrap();
    assert_eq!(on(&w), vec![true, true]);
    // Both sites still come up and carry traffic.
    w.run_for(Duration::from_secs(1));
    w.server
        .send_packet(w.now, &packet("198.19.0.1", "198.18.20.5", 7));
    w.exchange();
    assert_eq!(w.ids_at(2), vec![7]);
    w.server.set_backpressure(false);
    assert_eq!(on(&w), vec![false, false]);
}
