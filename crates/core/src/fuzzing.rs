//! The bodies of braid's fuzz targets, in the library so that they run in two places:
//! `fuzz/` (cargo-fuzz, nightly, coverage-guided) and `tests/fuzz_corpus.rs` (stable, every seed of
//! the corpus plus random inputs, in the ordinary test suite, so the targets cannot rot).
//!
//! - [`parse_any`]: every parser over arbitrary bytes; whatever parses must re-emit to the same
//!   bytes (the encoding is canonical).
//! - [`receive_path`]: a real client and server [`Endpoint`] pair, handshaken, then driven by a
//!   little program decoded from the input: raw datagrams to either side, datagrams *sealed with
//!   the real session keys* around arbitrary plaintext (so the fuzzer reaches everything behind
//!   authentication), replays and bit flips of captured traffic, time steps, tunnelled packets and
//!   link changes. The harness learns the session keys as an observer that holds the PSK: it opens
//!   the HELLO / HELLO-ACK it carries and derives the keys as the endpoints do. Each program runs
//!   three times: as first written (one datagram at a time), then with what each side sends
//!   carried as one receive batch, handled inline and through the deferred opening
//!   ([`Endpoint::open_job`]: checked in order, opened back to front, committed in order); those
//!   two must end with the same statistics.
//!
//! - [`decompress_stream`]: the inner header decompressor over a stream of encoded packets.
//! - [`reassemble_stream`]: the fragment reassembler over arbitrary pieces, sequence numbers and
//!   time steps.
//! - [`learn_addresses`]: a server [`Endpoint`] learning its client's links from what arrives:
//!   sealed packets on any of the 65 536 link ids from many source addresses (NAT rebinding),
//!   garbage, tampered packets and replays from anywhere. A model says which link ids the server
//!   must know and at which address; every datagram the server sends must go to the address the
//!   model says for its link.
//!
//! The functions panic only on a broken invariant (a parser that accepts a non-canonical
//! encoding, an endpoint that panics on input): that is what the fuzzer looks for.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use rand_core::SeedableRng;

use crate::crypto::{self, Aead, HandshakeKey};
use crate::endpoint::{BundleStats, Config, Endpoint, LinkConfig, Role};
use crate::wire::{
    Body, CipherId, Common, DataRepr, Header, HelloAckRepr, HelloRepr, Packet, PacketType,
    DATA_HEADER_LEN, HEADER_LEN, MIN_DATAGRAM_LEN,
};
use crate::LinkId;

/// The harness's pre-shared key.
pub const PSK: [u8; 32] = [0x5a; 32];

/// The harness endpoints' wall clock at creation (fixed, so that runs are reproducible):
/// 2020-09-13, in seconds since the Unix epoch.
pub const WALL_CLOCK_SECS: u64 = 1_600_000_000;

fn config(role: Role) -> Config {
    let mut c = Config::new(role, PSK);
    c.wall_clock = std::time::UNIX_EPOCH + Duration::from_secs(WALL_CLOCK_SECS);
    c
}

/// Runs every parser over `data`. Panics if a parser accepts bytes that its `emit` does not
/// reproduce exactly, or if opening with a fixed key misbehaves on a short datagram.
pub fn parse_any(data: &[u8]) {
    // The outer header, through the view and the Repr.
    if let Ok(p) = Packet::new_checked(data) {
        let _ = (
            p.version(),
            p.packet_type(),
            p.link(),
            p.session(),
            p.counter(),
        );
        assert_eq!(p.header_bytes().len() + p.sealed().len(), data.len());
    }
    if let Ok(h) = Header::parse(data) {
        let mut canonical = h.to_bytes();
        if h.ptype == PacketType::Data {
            // seq, ts and flags are DataRepr's (reserved flag bits are not kept).
            let d = DataRepr::parse_sent(data, &[]).expect("a DATA header");
            d.emit_header(&h, &mut canonical);
        }
        let n = h.buffer_len();
        assert_eq!(&canonical[..n], &data[..n], "header not canonical");
        // Opening with a wrong key must be an error, never a panic, whatever the length.
        let mut copy = data.to_vec();
        if h.ptype.is_handshake() {
            let key = crypto::handshake_key(&[0; 32], CipherId::ChaCha20Poly1305);
            let r = crypto::open_handshake(&key, &h, &mut copy);
            if crate::wire::handshake_datagram_len(h.ptype) != Some(data.len()) || h.counter != 0 {
                assert!(matches!(r, Err(crypto::CryptoError::Wire(_))));
            } else {
                assert!(r.is_err(), "random bytes authenticated");
            }
        } else {
            let key = Aead::new(CipherId::ChaCha20Poly1305, &[0; 32]);
            let r = crypto::open(&key, &h, &mut copy);
            if data.len() < MIN_DATAGRAM_LEN {
                assert!(matches!(r, Err(crypto::CryptoError::Wire(_))));
            } else {
                assert!(r.is_err(), "random bytes authenticated");
            }
        }
    }
    // Each body parser over the whole input and over what follows a header, as after `open`.
    let tails: [&[u8]; 3] = [
        data,
        data.get(HEADER_LEN..).unwrap_or(&[]),
        data.get(DATA_HEADER_LEN..).unwrap_or(&[]),
    ];
    for bytes in tails {
        if let Ok(hello) = HelloRepr::parse(bytes) {
            let mut out = vec![0u8; hello.buffer_len()];
            hello.emit(&mut out);
            assert_eq!(out, bytes, "hello not canonical");
        }
        if let Ok(ack) = HelloAckRepr::parse(bytes) {
            let mut out = vec![0u8; ack.buffer_len()];
            ack.emit(&mut out);
            assert_eq!(out, bytes, "hello-ack not canonical");
        }
        for t in 1..=11u8 {
            let Some(ptype) = PacketType::from_u8(t) else {
                unreachable!("types 1..=11 are defined")
            };
            if let Ok(body) = Body::parse(ptype, bytes) {
                assert_eq!(body.ptype(), ptype);
                assert_eq!(body.buffer_len(), bytes.len(), "buffer_len");
                let mut out = vec![0u8; body.buffer_len()];
                body.emit(&mut out);
                assert_eq!(out, bytes, "{ptype:?} body not canonical");
            }
        }
    }
}

/// A tiny reader over the fuzz input; out of bytes reads as zeros / empty.
struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
    fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        for x in &mut b {
            *x = self.u8();
        }
        u64::from_be_bytes(b)
    }
    /// A length-prefixed (u16) slice, cut short at the end of the input.
    fn bytes(&mut self) -> &'a [u8] {
        let n = (self.u16() as usize).min(self.data.len());
        let (b, rest) = self.data.split_at(n);
        self.data = rest;
        b
    }
}

/// Operation codes of the [`receive_path`] input language (the op byte modulo 8).
pub mod op {
    /// `len:u16 bytes`: a raw datagram to the server, from link `bytes[2..4]`'s address.
    pub const RAW_TO_SERVER: u8 = 0;
    /// `link:u8 len:u16 bytes`: a raw datagram to the client on link socket `link % 4`.
    pub const RAW_TO_CLIENT: u8 = 1;
    /// `type:u8 link:u8 ctr:u64 len:u16 plaintext`: sealed with the client-to-server key.
    pub const SEALED_TO_SERVER: u8 = 2;
    /// `type:u8 link:u8 ctr:u64 len:u16 plaintext`: sealed with the server-to-client key.
    pub const SEALED_TO_CLIENT: u8 = 3;
    /// `pick:u8 pos:u16 xor:u8`: re-deliver a captured datagram, with one byte XORed.
    pub const REPLAY: u8 = 4;
    /// `ms:u8`: advance time by `ms * 10` milliseconds, run timers, carry traffic.
    pub const ADVANCE: u8 = 5;
    /// `side:u8 len:u16 bytes`: an IP packet into the tunnel at the client (even) or server.
    pub const SEND: u8 = 6;
    /// `what:u8 link:u8`: add (even) or remove (odd) client link `link % 4`.
    pub const LINK: u8 = 7;
}

/// Session keys as seen by an observer holding the PSK.
#[derive(Clone, Copy)]
struct Observed {
    client_id: u32,
    server_id: u32,
    c2s: [u8; 32],
    s2c: [u8; 32],
}

/// How the [`receive_path`] harness takes datagrams to the endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carry {
    /// One datagram at a time, the directions alternating, each handled inline (the harness's
    /// first form: the committed corpus grew with it).
    Alternating,
    /// What each side sent as one receive batch to the other, handled inline. The endpoints'
    /// datagrams are carried when time advances (not after every operation), so that what the
    /// operations in between made arrives together.
    Batches,
    /// The same batches through the deferred opening, as the tunnel's data plane runs it with
    /// helper threads: checked in order, opened back to front, committed in order (the jobs
    /// before a handshake datagram first). The fuzzer's own datagrams go as batches of one.
    DeferredBatches,
}

/// Hands `batch` (each datagram with its link) to `ep` as one receive batch, as `carry` says;
/// `server`: to the server's listening socket (else to the client's link sockets). Returns how
/// many datagrams were opened as jobs.
fn receive(
    ep: &mut Endpoint,
    now: Instant,
    server: bool,
    carry: Carry,
    batch: &mut [(LinkId, &mut [u8])],
) -> u64 {
    let via = |link: LinkId| (!server).then_some(link);
    if carry != Carry::DeferredBatches {
        for (link, d) in batch.iter_mut() {
            ep.handle_datagram(now, via(*link), link_addr(*link), d);
        }
        return 0;
    }
    let mut opened = 0;
    ep.receive_batch(
        now,
        batch
            .iter_mut()
            .map(|(link, d)| (via(*link), link_addr(*link), &mut **d, now, ())),
        &mut Vec::new(),
        |jobs| {
            opened += jobs.len() as u64;
            for j in jobs.iter_mut().rev() {
                j.open();
            }
        },
        |_, _, _| {},
    );
    opened
}

struct Harness {
    carry: Carry,
    /// Datagrams opened as jobs ([`Carry::DeferredBatches`]).
    jobs: u64,
    now: Instant,
    client: Endpoint,
    server: Endpoint,
    hs_key: HandshakeKey,
    /// Client HELLO salts by client session id.
    hellos: HashMap<u32, [u8; 32]>,
    keys: Option<Observed>,
    /// Recent datagrams, with `true` when they went client -> server.
    captured: Vec<(bool, LinkId, Vec<u8>)>,
    captured_next: usize,
}

const CAPTURE: usize = 16;
/// Bound on datagrams carried per `carry` call, so no input can make a round unbounded.
const CARRY_MAX: usize = 256;

fn link_addr(link: LinkId) -> SocketAddr {
    SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(198, 18, (link >> 8) as u8, link as u8)),
        40_000,
    )
}

impl Harness {
    fn new(carry: Carry) -> Harness {
        let now = Instant::now();
        let rng = |seed| Box::new(rand_chacha::ChaCha8Rng::seed_from_u64(seed));
        let mut client = Endpoint::new(config(Role::Client), now, rng(1))
            .expect("default client config is valid");
        let server = Endpoint::new(config(Role::Server), now, rng(2))
            .expect("default server config is valid");
        for id in 1..=2 {
            client
                .add_link(now, id, LinkConfig::default())
                .expect("fresh link ids");
        }
        let mut h = Harness {
            carry,
            jobs: 0,
            now,
            client,
            server,
            hs_key: crypto::handshake_key(&PSK, CipherId::ChaCha20Poly1305),
            hellos: HashMap::new(),
            keys: None,
            captured: Vec::with_capacity(CAPTURE),
            captured_next: 0,
        };
        // Handshake and a little traffic, so the input starts from an established bundle.
        for _ in 0..5 {
            h.advance(Duration::from_millis(10));
        }
        h
    }

    /// Learns session keys from handshake packets in transit (as an observer with the PSK).
    fn observe(&mut self, datagram: &[u8]) {
        let Ok(header) = Header::parse(datagram) else {
            return;
        };
        if !header.ptype.is_handshake() {
            return;
        }
        let mut copy = datagram.to_vec();
        let Ok(plain) = crypto::open_handshake(&self.hs_key, &header, &mut copy) else {
            return;
        };
        match header.ptype {
            PacketType::Hello => {
                if let Ok(hello) = HelloRepr::parse(plain) {
                    self.hellos.insert(hello.session, hello.salt);
                }
            }
            _ => {
                // HELLO-ACK: header.session is the client's id.
                let Ok(ack) = HelloAckRepr::parse(plain) else {
                    return;
                };
                if let Some(cs) = self.hellos.get(&header.session) {
                    let (c2s, s2c) = crypto::session_key_bytes(&PSK, cs, &ack.salt);
                    self.keys = Some(Observed {
                        client_id: header.session,
                        server_id: ack.session,
                        c2s,
                        s2c,
                    });
                }
            }
        }
    }

    fn capture(&mut self, to_server: bool, link: LinkId, d: &[u8]) {
        if self.captured.len() < CAPTURE {
            self.captured.push((to_server, link, d.to_vec()));
            self.captured_next = self.captured.len() % CAPTURE;
        } else {
            self.captured[self.captured_next] = (to_server, link, d.to_vec());
            self.captured_next = (self.captured_next + 1) % CAPTURE;
        }
    }

    fn deliver_to_server(&mut self, link: LinkId, d: &mut [u8]) {
        self.jobs += receive(
            &mut self.server,
            self.now,
            true,
            self.carry,
            &mut [(link, d)],
        );
    }

    fn deliver_to_client(&mut self, link: LinkId, d: &mut [u8]) {
        self.jobs += receive(
            &mut self.client,
            self.now,
            false,
            self.carry,
            &mut [(link, d)],
        );
    }

    /// Carries queued datagrams both ways (bounded), drains deliveries and events.
    fn carry(&mut self) {
        if self.carry == Carry::Alternating {
            self.carry_alternating();
        } else {
            self.carry_batches();
        }
        // Whatever is left after the bound is dropped (a lossy network, which is allowed).
        while self.client.poll_transmit().is_some() {}
        while self.server.poll_transmit().is_some() {}
        self.drain();
    }

    /// Carries what each side sent to the other as one receive batch, until both are quiet
    /// or [`CARRY_MAX`] datagrams went.
    fn carry_batches(&mut self) {
        let mut n = 0;
        loop {
            let mut moved = false;
            for to_server in [true, false] {
                let mut batch = Vec::new();
                while n < CARRY_MAX {
                    let sender = if to_server {
                        &mut self.client
                    } else {
                        &mut self.server
                    };
                    let Some(t) = sender.poll_transmit() else {
                        break;
                    };
                    self.observe(&t.payload);
                    self.capture(to_server, t.link, &t.payload);
                    batch.push((t.link, t.payload));
                    n += 1;
                }
                moved |= !batch.is_empty();
                let mut views: Vec<(LinkId, &mut [u8])> = batch
                    .iter_mut()
                    .map(|(l, d)| (*l, d.as_mut_slice()))
                    .collect();
                let (receiver, sender) = if to_server {
                    (&mut self.server, &mut self.client)
                } else {
                    (&mut self.client, &mut self.server)
                };
                self.jobs += receive(receiver, self.now, to_server, self.carry, &mut views);
                for (_, d) in batch {
                    sender.recycle(d);
                }
            }
            if !moved {
                return;
            }
        }
    }

    /// Carries one datagram each way in turn, until both sides are quiet or [`CARRY_MAX`]
    /// datagrams went.
    fn carry_alternating(&mut self) {
        let mut n = 0;
        while n < CARRY_MAX {
            let mut moved = false;
            if let Some(t) = self.client.poll_transmit() {
                let mut d = t.payload;
                self.observe(&d);
                self.capture(true, t.link, &d);
                self.deliver_to_server(t.link, &mut d);
                self.client.recycle(d);
                moved = true;
                n += 1;
            }
            if let Some(t) = self.server.poll_transmit() {
                let mut d = t.payload;
                self.observe(&d);
                self.capture(false, t.link, &d);
                self.deliver_to_client(t.link, &mut d);
                self.server.recycle(d);
                moved = true;
                n += 1;
            }
            if !moved {
                break;
            }
        }
    }

    fn drain(&mut self) {
        let now = self.now;
        for ep in [&mut self.client, &mut self.server] {
            while let Some(p) = ep.poll_deliver(now) {
                ep.recycle(p);
            }
            while ep.poll_event().is_some() {}
            let _ = ep.poll_timeout();
        }
    }

    fn advance(&mut self, dt: Duration) {
        self.now += dt;
        self.client.handle_timeout(self.now);
        self.server.handle_timeout(self.now);
        self.carry();
    }

    fn sealed(&mut self, to_server: bool, input: &mut Input<'_>) {
        let ptype = PacketType::from_u8(input.u8() % 11 + 1).unwrap_or(PacketType::Data);
        let link = LinkId::from(input.u8() % 4);
        let counter = input.u64();
        // DATA's seq and flags travel in its header: the fuzzer picks them too.
        let data_fields = (ptype == PacketType::Data).then(|| (input.u8(), input.u64()));
        let plaintext = input.bytes();
        let Some(k) = self.keys else {
            return;
        };
        let (key, session) = if to_server {
            (&k.c2s, k.server_id)
        } else {
            (&k.s2c, k.client_id)
        };
        let header = Header {
            ptype,
            link,
            // A HELLO carries 0 here, as the spec says (anything else is dropped unopened).
            session: if ptype == PacketType::Hello {
                0
            } else {
                session
            },
            // Mostly far above the endpoints' own counters (fresh, but within the 2^23 that
            // DATA's 24-bit counter is extended over), sometimes anywhere.
            counter: if counter & 1 == 0 {
                (1 << 20) + (counter >> 1) % 1_000_000
            } else {
                counter
            },
        };
        let mut d = Vec::new();
        // Handshake types are sealed under a handshake key, everything else under the session.
        if ptype.is_handshake() {
            let packet_salt = [counter as u8; 32];
            crypto::seal_handshake_plaintext(
                &self.hs_key,
                &header,
                &packet_salt,
                plaintext,
                &mut d,
            );
        } else if let Some((flags, seq)) = data_fields {
            let aead = Aead::new(CipherId::ChaCha20Poly1305, key);
            let body = Body::Data(DataRepr {
                common: Common {
                    link_seq: header.counter as u32,
                    ts: (counter as u32) & !63,
                },
                seq,
                flags,
                payload: plaintext,
            });
            crypto::seal(&aead, &header, &body, &mut d);
        } else {
            let aead = Aead::new(CipherId::ChaCha20Poly1305, key);
            crypto::seal_plaintext(&aead, &header, plaintext, &mut d);
        }
        // A well-formed HELLO from the fuzzer starts a session the harness can then speak in.
        self.observe(&d);
        if to_server {
            self.deliver_to_server(link, &mut d);
        } else {
            self.deliver_to_client(link, &mut d);
        }
    }
}

/// What a [`receive_path`] run did (so tests can check that the harness reaches what it claims).
#[derive(Debug, Clone)]
pub struct ReceiveReport {
    /// The harness learned the session keys from the handshake it carried.
    pub keys_observed: bool,
    pub client: BundleStats,
    pub server: BundleStats,
    /// Datagrams opened as jobs ([`Carry::DeferredBatches`]).
    pub jobs: u64,
}

/// Drives a handshaken client/server pair with the program encoded in `data` (see [`op`]), as
/// each [`Carry`] says. Panics if an endpoint does, or if the deferred opening ends with other
/// statistics than inline opening of the same batches.
pub fn receive_path(data: &[u8]) {
    receive_path_report(data);
    let inline = receive_path_carried(data, Carry::Batches);
    let deferred = receive_path_carried(data, Carry::DeferredBatches);
    assert_eq!(
        format!("{:?}", (&inline.client, &inline.server)),
        format!("{:?}", (&deferred.client, &deferred.server)),
        "deferred opening disagrees with inline opening"
    );
}

/// The first run of [`receive_path`] ([`Carry::Alternating`]), returning what happened.
pub fn receive_path_report(data: &[u8]) -> ReceiveReport {
    receive_path_carried(data, Carry::Alternating)
}

/// One run of [`receive_path`], carried as `carry` says, returning what happened.
pub fn receive_path_carried(data: &[u8], carry: Carry) -> ReceiveReport {
    let mut h = Harness::new(carry);
    let keys_observed = h.keys.is_some();
    let mut input = Input { data };
    let mut steps = 0;
    while !input.is_empty() && steps < 512 {
        steps += 1;
        match input.u8() % 8 {
            op::RAW_TO_SERVER => {
                let mut d = input.bytes().to_vec();
                let link = d.get(2..4).map_or(1, |b| u16::from_be_bytes([b[0], b[1]]));
                h.deliver_to_server(link, &mut d);
            }
            op::RAW_TO_CLIENT => {
                let link = LinkId::from(input.u8() % 4);
                let mut d = input.bytes().to_vec();
                h.deliver_to_client(link, &mut d);
            }
            op::SEALED_TO_SERVER => h.sealed(true, &mut input),
            op::SEALED_TO_CLIENT => h.sealed(false, &mut input),
            op::REPLAY => {
                let pick = input.u8() as usize;
                let pos = input.u16() as usize;
                let xor = input.u8();
                if !h.captured.is_empty() {
                    // pick 0 is the most recent datagram, 1 the one before, ...
                    let n = h.captured.len();
                    let i = (h.captured_next + n - 1 - pick % n) % n;
                    let (to_server, link, mut d) = h.captured[i].clone();
                    if !d.is_empty() {
                        let i = pos % d.len();
                        d[i] ^= xor;
                    }
                    if to_server {
                        h.deliver_to_server(link, &mut d);
                    } else {
                        h.deliver_to_client(link, &mut d);
                    }
                }
            }
            op::ADVANCE => {
                let ms = u64::from(input.u8()) * 10;
                h.advance(Duration::from_millis(ms));
            }
            op::SEND => {
                let side = input.u8();
                let p = input.bytes();
                if side & 1 == 0 {
                    h.client.send_packet(h.now, p);
                } else {
                    h.server.send_packet(h.now, p);
                }
            }
            _ => {
                let what = input.u8();
                let link = LinkId::from(input.u8() % 4);
                if what & 1 == 0 {
                    let _ = h.client.add_link(h.now, link, LinkConfig::default());
                } else {
                    let _ = h.client.remove_link(h.now, link);
                }
            }
        }
        // Batched: the endpoints' own datagrams wait for the next time step (`ADVANCE`), so
        // that they arrive in batches.
        if carry == Carry::Alternating {
            h.carry();
        }
    }
    // Let every timer run once more: reorder timeouts, link health, re-handshakes.
    h.advance(Duration::from_millis(600));
    h.advance(Duration::from_secs(3));
    ReceiveReport {
        keys_observed,
        client: h.client.stats(h.now),
        server: h.server.stats(h.now),
        jobs: h.jobs,
    }
}

/// Operation codes of the [`learn_addresses`] input language (the op byte modulo 6).
pub mod learn_op {
    /// `link:u16 src:u8 jump:u8 kind:u8`: a fresh packet sealed with the session key on `link`
    /// (counter `jump` above the link's next), from source `src` (see `learn_src`); `kind` even:
    /// PROBE, odd: DATA.
    pub const SEALED: u8 = 0;
    /// `src:u8 len:u16 bytes`: raw bytes from `src`.
    pub const RAW: u8 = 1;
    /// `pick:u8 src:u8 xor:u8 pos:u8`: one of the last sealed datagrams again, from `src`, with
    /// byte `pos` XORed with `xor` (0: unchanged).
    pub const REPLAY: u8 = 2;
    /// `n:u8`: advance time by `(n + 1) * 100` ms and run the server's timers.
    pub const ADVANCE: u8 = 3;
    /// `len:u8`: an IP packet into the tunnel at the server.
    pub const SEND: u8 = 4;
    /// `link:u16 src:u8 pos:u8`: a fresh sealed packet with one byte flipped (fails
    /// authentication), from `src`.
    pub const TAMPERED: u8 = 5;
}

/// Source address number `x`: 198.18.{x>>4 & 3}.{x & 15}, port 40000 + (x >> 6): 64 hosts,
/// several ports each (a NAT rebinding changes either).
pub fn learn_src(x: u8) -> SocketAddr {
    SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(198, 18, (x >> 4) & 3, x & 15)),
        40_000 + u16::from(x >> 6),
    )
}

/// What a [`learn_addresses`] run ended with.
#[derive(Debug, Clone)]
pub struct LearnReport {
    /// Link ids the server knows, with their addresses (sorted by id).
    pub links: Vec<(LinkId, SocketAddr)>,
    /// Fresh sealed packets the server took (model), and link ids it has a window for.
    pub accepted: usize,
    pub windows: usize,
    pub server: BundleStats,
}

/// Everything the server sends goes to its link's learned address.
fn check_sent(server: &mut Endpoint, model: &HashMap<LinkId, (SocketAddr, Instant)>) {
    while let Some(t) = server.poll_transmit() {
        let want = model.get(&t.link).map(|(a, _)| *a);
        assert_eq!(
            t.dst, want,
            "datagram on link {} to the wrong address",
            t.link
        );
        server.recycle(t.payload);
    }
}

/// Runs [`learn_addresses_report`]; panics on a broken invariant.
pub fn learn_addresses(data: &[u8]) {
    learn_addresses_report(data);
}

/// A server learning links and addresses under the program in `data` (see [`learn_op`]),
/// checked against a model after every step:
/// - it knows exactly the links the model knows, each at the source of the last *fresh,
///   authenticated* packet on it (garbage, tampered packets and replays from any address change
///   nothing);
/// - a session keeps windows for at most [`crate::replay::MAX_LINKS`] link ids, so a packet on a
///   further id is not taken;
/// - a link silent for `forget_link_after` is forgotten;
/// - every datagram the server sends goes to its link's learned address.
pub fn learn_addresses_report(data: &[u8]) -> LearnReport {
    use crate::replay::MAX_LINKS;
    use crate::wire::{Common, DataRepr, ProbeRepr};

    let mut now = Instant::now();
    let cfg = config(Role::Server);
    let forget = cfg.forget_link_after;
    let mut server = Endpoint::new(
        cfg,
        now,
        Box::new(rand_chacha::ChaCha8Rng::seed_from_u64(3)),
    )
    .expect("default server config is valid");
    let hs = crypto::handshake_key(&PSK, CipherId::ChaCha20Poly1305);

    // Handshake by hand, as a client holding the PSK: HELLO on link 0, open the HELLO-ACK.
    let hello = HelloRepr {
        session: 1,
        salt: [1; 32],
        cipher: CipherId::ChaCha20Poly1305,
        timestamp: WALL_CLOCK_SECS * 1_000_000_000,
    };
    let hh = Header {
        ptype: PacketType::Hello,
        link: 0,
        session: 0,
        counter: 0,
    };
    let mut d = Vec::new();
    crypto::seal_hello(&hs, &hh, &[9; 32], &hello, &mut d);
    server.handle_datagram(now, None, learn_src(0), &mut d);
    let mut ack = server.poll_transmit().expect("a HELLO is answered").payload;
    let ah = Header::parse(&ack).expect("a HELLO-ACK header");
    let ack = HelloAckRepr::parse(crypto::open_handshake(&hs, &ah, &mut ack).expect("opens"))
        .expect("a HELLO-ACK body");
    let keys = crypto::session_keys(
        &PSK,
        CipherId::ChaCha20Poly1305,
        &hello.salt,
        &ack.salt,
        true,
    );
    let server_id = ack.session;

    let mut model: HashMap<LinkId, (SocketAddr, Instant)> = HashMap::new();
    let mut windows: HashSet<LinkId> = HashSet::new();
    let mut next: HashMap<LinkId, u64> = HashMap::new();
    let mut sent: Vec<Vec<u8>> = Vec::new();
    let mut accepted = 0;
    let mut seq = 0u64;

    let seal = |link: LinkId, counter: u64, data: bool, seq: u64, out: &mut Vec<u8>| {
        let common = Common {
            link_seq: counter as u32,
            ts: counter as u32,
        };
        let payload = [0x45u8; 40];
        let body = if data {
            Body::Data(DataRepr {
                common,
                seq,
                flags: crate::wire::FLAG_UNORDERED,
                payload: &payload,
            })
        } else {
            Body::Probe(ProbeRepr {
                common,
                probe_id: counter as u32,
                padding: 0,
            })
        };
        let header = Header {
            ptype: body.ptype(),
            link,
            session: server_id,
            counter,
        };
        crypto::seal(&keys.send, &header, &body, out);
    };

    // The first packet under the new keys confirms the session (link 0, from source 0).
    let mut program = vec![learn_op::SEALED, 0, 0, 0, 0, 0];
    program.extend_from_slice(data);
    let mut input = Input { data: &program };
    let mut steps = 0;
    while !input.is_empty() && steps < 512 {
        steps += 1;
        match input.u8() % 6 {
            learn_op::SEALED => {
                // Link ids are 0..=255 (DATA has one byte for them).
                let link = input.u16() & 0xff;
                let src = learn_src(input.u8());
                let jump = u64::from(input.u8());
                let is_data = input.u8() & 1 == 1;
                let counter = next.get(&link).copied().unwrap_or(0) + jump;
                next.insert(link, counter + 1);
                let mut d = Vec::new();
                seal(link, counter, is_data, seq, &mut d);
                seq += 1;
                sent.push(d.clone());
                if sent.len() > 32 {
                    sent.remove(0);
                }
                server.handle_datagram(now, None, src, &mut d);
                if windows.contains(&link) || windows.len() < MAX_LINKS {
                    windows.insert(link);
                    model.insert(link, (src, now));
                    accepted += 1;
                }
            }
            learn_op::RAW => {
                let src = learn_src(input.u8());
                let mut d = input.bytes().to_vec();
                server.handle_datagram(now, None, src, &mut d);
            }
            learn_op::REPLAY => {
                let pick = input.u8() as usize;
                let src = learn_src(input.u8());
                let xor = input.u8();
                let pos = input.u8() as usize;
                if !sent.is_empty() {
                    let mut d = sent[sent.len() - 1 - pick % sent.len()].clone();
                    let i = pos % d.len();
                    d[i] ^= xor;
                    server.handle_datagram(now, None, src, &mut d);
                }
            }
            learn_op::ADVANCE => {
                now += Duration::from_millis((u64::from(input.u8()) + 1) * 100);
                server.handle_timeout(now);
                // Timers probe every link, then forget the silent ones: what was sent went to
                // the addresses known before forgetting.
                check_sent(&mut server, &model);
                model.retain(|_, (_, t)| now.saturating_duration_since(*t) < forget);
            }
            learn_op::SEND => {
                let n = usize::from(input.u8());
                let mut p = vec![0u8; n.max(20)];
                p[0] = 0x45;
                server.send_packet(now, &p);
            }
            _ => {
                // Link ids are 0..=255 (DATA has one byte for them).
                let link = input.u16() & 0xff;
                let src = learn_src(input.u8());
                let pos = input.u8() as usize;
                let counter = next.get(&link).copied().unwrap_or(0);
                let mut d = Vec::new();
                seal(link, counter, false, seq, &mut d);
                let i = DATA_HEADER_LEN + pos % (d.len() - DATA_HEADER_LEN);
                d[i] ^= 0x20;
                server.handle_datagram(now, None, src, &mut d);
            }
        }
        check_sent(&mut server, &model);
        while let Some(p) = server.poll_deliver(now) {
            server.recycle(p);
        }
        while server.poll_event().is_some() {}
        let mut have: Vec<(LinkId, SocketAddr)> = server
            .stats(now)
            .links
            .iter()
            .map(|l| (l.id, l.addr.expect("a learned link has an address")))
            .collect();
        have.sort();
        let mut want: Vec<(LinkId, SocketAddr)> =
            model.iter().map(|(l, (a, _))| (*l, *a)).collect();
        want.sort();
        assert_eq!(have, want, "links learned");
        assert!(have.len() <= MAX_LINKS);
    }
    let stats = server.stats(now);
    LearnReport {
        links: stats
            .links
            .iter()
            .filter_map(|l| Some((l.id, l.addr?)))
            .collect(),
        accepted,
        windows: windows.len(),
        server: stats,
    }
}

/// Seed inputs for every target: valid and invalid, written to `fuzz/corpus/<target>/` by
/// `cargo test -p braid-core --test fuzz_corpus -- --ignored write_seed_corpus`.
pub fn seed_corpus() -> Vec<(&'static str, String, Vec<u8>)> {
    use crate::wire::{Common, DataRepr, NackRepr, ProbeAckRepr, ProbeRepr, SeqRange};
    let mut out = Vec::new();
    let key = crypto::session_keys(&PSK, CipherId::ChaCha20Poly1305, &[1; 32], &[2; 32], true);
    let common = Common {
        link_seq: 7,
        ts: 1_000_000,
    };
    // Starts as an IPv4 packet does: a plain DATA payload (braid passes it on as it is).
    let payload: Vec<u8> = (0x45..0x45 + 100u8).collect();
    let mut nack_buf = Vec::new();
    let bodies: Vec<(&str, Body<'_>)> = vec![
        (
            "data",
            Body::Data(DataRepr {
                common,
                seq: 42,
                flags: 0,
                payload: &payload,
            }),
        ),
        (
            "data-unordered",
            Body::Data(DataRepr {
                common,
                seq: u64::MAX,
                flags: crate::wire::FLAG_UNORDERED,
                payload: &payload[..20],
            }),
        ),
        (
            "probe",
            Body::Probe(ProbeRepr {
                common,
                probe_id: 3,
                padding: 32,
            }),
        ),
        (
            "probe-ack",
            Body::ProbeAck(ProbeAckRepr {
                common,
                probe_id: 3,
                echo_ts: 999_000,
                hold_us: 50,
                rx_link_seq_max: 100,
                rx_packets: 98,
                rx_bytes: 140_000,
                qdelay_us: 1200,
                owd_offset_us: -5000,
            }),
        ),
        ("close", Body::Close(common)),
        (
            "link-info",
            Body::LinkInfo(crate::wire::LinkInfoRepr {
                common,
                rate_to_you_bps: 50_000_000,
            }),
        ),
        (
            "link-nack",
            Body::LinkNack(crate::wire::LinkNackRepr {
                common,
                link: 1,
                count: 2,
                first: 90,
            }),
        ),
        (
            "link-ce",
            Body::LinkCe(crate::wire::LinkCeRepr {
                common,
                link: 1,
                marks: 17,
            }),
        ),
        (
            "nack",
            Body::Nack(
                NackRepr::encode(
                    common,
                    &[
                        SeqRange { first: 7, count: 2 },
                        SeqRange {
                            first: 100,
                            count: 1,
                        },
                    ],
                    &mut nack_buf,
                )
                .expect("two non-empty ranges"),
            ),
        ),
    ];
    for (name, body) in &bodies {
        // parse: the plaintext body alone, and a whole sealed datagram.
        let mut plain = vec![0u8; body.buffer_len()];
        body.emit(&mut plain);
        out.push(("parse", format!("body-{name}"), plain.clone()));
        let header = Header {
            ptype: body.ptype(),
            link: 1,
            session: 0x0102_0304,
            counter: 5,
        };
        let mut sealed = Vec::new();
        crypto::seal(&key.send, &header, body, &mut sealed);
        out.push(("parse", format!("datagram-{name}"), sealed));
        // receive: the same body sealed to the server with the real session keys.
        let mut prog = vec![op::SEALED_TO_SERVER, body.ptype() as u8 - 1, 1];
        prog.extend_from_slice(&0u64.to_be_bytes());
        if let Body::Data(d) = body {
            prog.push(d.flags);
            prog.extend_from_slice(&d.seq.to_be_bytes());
        }
        prog.extend_from_slice(&(plain.len() as u16).to_be_bytes());
        prog.extend_from_slice(&plain);
        out.push(("receive", format!("sealed-{name}"), prog));
    }
    let hello = HelloRepr {
        session: 9,
        salt: [3; 32],
        cipher: CipherId::ChaCha20Poly1305,
        // Newer than the harness client's first HELLO (its clock starts at `WALL_CLOCK_SECS`),
        // older than those it makes a second or more later.
        timestamp: (WALL_CLOCK_SECS + 1) * 1_000_000_000,
    };
    let mut hb = vec![0u8; hello.buffer_len()];
    hello.emit(&mut hb);
    out.push(("parse", "body-hello".into(), hb.clone()));
    let mut hd = Vec::new();
    let hh = Header {
        ptype: PacketType::Hello,
        link: 1,
        session: 0,
        counter: 0,
    };
    crypto::seal_hello(
        &crypto::handshake_key(&PSK, CipherId::ChaCha20Poly1305),
        &hh,
        &[0x77; 32],
        &hello,
        &mut hd,
    );
    out.push(("parse", "datagram-hello".into(), hd.clone()));
    // receive: the fuzzer as a second client: HELLO, then a DATA under the session it set up
    // (which makes the server switch sessions).
    let mut prog = vec![op::SEALED_TO_SERVER, PacketType::Hello as u8 - 1, 1];
    prog.extend_from_slice(&0u64.to_be_bytes());
    prog.extend_from_slice(&(hb.len() as u16).to_be_bytes());
    prog.extend_from_slice(&hb);
    let data = Body::Data(DataRepr {
        common,
        seq: 0,
        flags: 0,
        payload: &payload,
    });
    let mut plain = vec![0u8; data.buffer_len()];
    data.emit(&mut plain);
    prog.extend_from_slice(&[op::SEALED_TO_SERVER, PacketType::Data as u8 - 1, 1]);
    prog.extend_from_slice(&0u64.to_be_bytes());
    prog.extend_from_slice(&(plain.len() as u16).to_be_bytes());
    prog.extend_from_slice(&plain);
    out.push(("receive", "second-client-takes-over".into(), prog));
    // Invalid parse seeds.
    out.push(("parse", "empty".into(), Vec::new()));
    out.push(("parse", "short-header".into(), vec![1, 3, 0, 1, 0, 0]));
    out.push((
        "parse",
        "bad-version".into(),
        [&[2u8, 3][..], &[0; 30]].concat(),
    ));
    out.push((
        "parse",
        "bad-type".into(),
        [&[1u8, 99][..], &[0; 30]].concat(),
    ));
    out.push((
        "parse",
        "probe-nonzero-padding".into(),
        [&[0u8; 12][..], &[0, 1]].concat(),
    ));

    // receive programs.
    let raw = |to_client: bool, d: &[u8]| {
        let mut p = if to_client {
            vec![op::RAW_TO_CLIENT, 1]
        } else {
            vec![op::RAW_TO_SERVER]
        };
        p.extend_from_slice(&(d.len() as u16).to_be_bytes());
        p.extend_from_slice(d);
        p
    };
    out.push(("receive", "raw-hello-to-server".into(), raw(false, &hd)));
    out.push(("receive", "raw-hello-to-client".into(), raw(true, &hd)));
    out.push((
        "receive",
        "raw-garbage".into(),
        raw(false, &[1, 3, 0, 1, 0xff, 0xff]),
    ));
    let mut tunnel = vec![op::SEND, 0, 0, 60];
    tunnel.extend_from_slice(&[0x45; 60]);
    tunnel.extend_from_slice(&[op::ADVANCE, 5, op::SEND, 1, 0, 3, 1, 2, 3, op::ADVANCE, 1]);
    out.push(("receive", "tunnel-both-ways".into(), tunnel));
    out.push((
        "receive",
        "replay-and-tamper".into(),
        vec![
            op::REPLAY,
            0,
            0,
            0,
            0,
            op::REPLAY,
            3,
            0,
            20,
            0x40,
            op::REPLAY,
            7,
            0,
            0,
            0x80,
        ],
    ));
    out.push((
        "receive",
        "links-change-and-silence".into(),
        vec![
            op::LINK,
            0,
            3,
            op::ADVANCE,
            30,
            op::LINK,
            1,
            1,
            op::ADVANCE,
            255,
            op::ADVANCE,
            255,
        ],
    ));

    // learn: NAT rebinding (link 1 moves host, then port), replays from elsewhere, 100 link ids
    // (more than a session keeps windows for), garbage, silence past forget_link_after.
    use learn_op as l;
    let sealed = |link: u16, src: u8, jump: u8, kind: u8| {
        let [a, b] = link.to_be_bytes();
        vec![l::SEALED, a, b, src, jump, kind]
    };
    let mut rebind = Vec::new();
    for src in [1u8, 1, 0x22, 0x62, 0x62] {
        rebind.extend(sealed(1, src, 0, 0));
    }
    rebind.extend([l::REPLAY, 0, 0x33, 0, 0, l::REPLAY, 2, 0x05, 0x80, 20]);
    rebind.extend([l::SEND, 60, l::ADVANCE, 3]);
    out.push(("learn", "nat-rebinding-and-replays".into(), rebind));
    let mut many = Vec::new();
    for i in 0..100u16 {
        many.extend(sealed(i * 655, i as u8, (i % 3) as u8, (i % 2) as u8));
    }
    many.extend([l::SEND, 100, l::ADVANCE, 9]);
    out.push(("learn", "many-link-ids".into(), many));
    let mut junk = vec![l::RAW, 7, 0, 32];
    junk.extend([2u8, 3, 0, 9, 0, 0, 0, 1]);
    junk.extend([0u8; 24]);
    junk.extend([l::TAMPERED, 0, 9, 7, 30]);
    junk.extend(sealed(9, 8, 0, 1));
    out.push(("learn", "garbage-and-tampered".into(), junk));
    let mut silence = sealed(2, 3, 0, 0);
    silence.extend([
        l::ADVANCE,
        255,
        l::ADVANCE,
        255,
        l::ADVANCE,
        255,
        l::ADVANCE,
        255,
        l::ADVANCE,
        255,
    ]);
    silence.extend(sealed(2, 4, 0, 1));
    out.push(("learn", "forgotten-then-back".into(), silence));
    out.push(("learn", "empty".into(), Vec::new()));
    out
}

/// Length-prefixed records (one length byte, then that many bytes) fed to one inner header
/// [`Decompressor`](crate::compress::Decompressor) in turn. Panics if it panics, if a dropped packet
/// leaves output behind, if a rebuilt packet is not one the compressor could have sent, if output
/// outgrows its input by more than a header can, or if pending feedback grows past its bound.
pub fn decompress_stream(data: &[u8]) {
    use crate::compress::{describes, Decompressor, Encoding, Limits};
    let mut d = Decompressor::new(Limits {
        contexts: 8,
        reuse_idle: Duration::from_secs(3),
    });
    let mut out = Vec::new();
    let mut rest = data;
    while let Some((&len, tail)) = rest.split_first() {
        let (record, tail) = tail.split_at(usize::from(len).min(tail.len()));
        rest = tail;
        out.clear();
        match d.decompress(record, &mut out) {
            // The shortest delta packet with timestamps (10 bytes: id, flags, differences)
            // becomes 72 bytes of IPv6 and TCP headers.
            Ok(Encoding::Compressed) => {
                assert!(
                    describes(&out),
                    "rebuilt a packet the compressor cannot send"
                );
                assert!(out.len() <= record.len() + 62);
            }
            Ok(_) => assert!(out.len() <= record.len()),
            Err(_) => assert!(out.is_empty(), "a dropped packet left output"),
        }
        assert!(d.pending_feedback() <= 256);
    }
}

/// Seeds for [`decompress_stream`]: real encoder output (whole and compressed packets of IPv4 and
/// IPv6 flows), a plain packet, and damaged copies.
pub fn decompress_seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    use crate::compress::{Compressor, Decompressor, Limits};
    let limits = Limits {
        contexts: 8,
        reuse_idle: Duration::from_secs(3),
    };
    let now = Instant::now();
    let mut c = Compressor::new(limits);
    let mut d = Decompressor::new(limits);
    let mut stream = |packets: &[Vec<u8>]| {
        let mut input = Vec::new();
        for p in packets {
            let mut wire = Vec::new();
            c.compress(now, p, &mut wire);
            let mut sink = Vec::new();
            let _ = d.decompress(&wire, &mut sink);
            d.take_feedback().into_iter().for_each(|f| c.on_feedback(f));
            input.push(wire.len() as u8);
            input.extend_from_slice(&wire);
        }
        input
    };
    let v4: Vec<Vec<u8>> = (0..3).map(|n| tcp_segment(false, n)).collect();
    let v6: Vec<Vec<u8>> = (0..3).map(|n| tcp_segment(true, n)).collect();
    let s4 = stream(&v4);
    let s6 = stream(&v6);
    let mut flipped = s4.clone();
    if let Some(b) = flipped.last_mut() {
        *b ^= 0x55;
    }
    let mut truncated = s6.clone();
    truncated.truncate(truncated.len() - 10);
    let mut plain = vec![v4[0].len() as u8];
    plain.extend_from_slice(&v4[0]);
    vec![
        ("decompress", "ipv4-flow".into(), s4),
        ("decompress", "ipv6-flow".into(), s6),
        ("decompress", "flipped".into(), flipped),
        ("decompress", "truncated".into(), truncated),
        ("decompress", "plain".into(), plain),
    ]
}

/// A TCP segment with timestamps and 20 bytes of payload, `n` varying its dynamic fields.
fn tcp_segment(v6: bool, n: u8) -> Vec<u8> {
    let mut p = Vec::new();
    if v6 {
        p.extend_from_slice(&[0x60, 0, 0, 0, 0, 52, 6, 64]);
        p.extend_from_slice(&[0x20, 0x01, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        p.extend_from_slice(&[0x20, 0x01, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    } else {
        p.extend_from_slice(&[0x45, 0, 0, 72, 0x12, n, 0x40, 0, 64, 6, 0, 0]);
        p.extend_from_slice(&[198, 18, 0, 1, 198, 18, 0, 2]);
        let mut sum: u32 = p
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        p[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    }
    p.extend_from_slice(&[0x9c, 0x40, 0x14, 0x51, 0, 0, n, 1, 0, 0, 0, 1, 0x80, 0x18]);
    p.extend_from_slice(&[
        0xfa, 0xf0, 0x12, n, 0, 0, 1, 1, 8, 10, 0, 0, 0, n, 0, 0, 0, 2,
    ]);
    p.extend((0..20).map(|i| i ^ n));
    p
}

/// Records of (sequence step, piece kind, length, time step) fed to a fragment
/// [`Reassembler`](crate::frag::Reassembler) with a 1500-byte limit. Panics if it panics, holds
/// more than its limit, or returns a packet larger than the limit from pieces.
pub fn reassemble_stream(data: &[u8]) {
    use crate::frag::{Piece, Reassembler};
    const MAX: usize = 1500;
    let mut r = Reassembler::new(MAX);
    let mut now = Instant::now();
    let mut seq = u64::MAX - 300; // crosses the wrap-around
    let piece_bytes = [0x5au8; 4096];
    for rec in data.chunks_exact(4) {
        seq = seq.wrapping_add(u64::from(rec[0] % 4));
        let piece =
            [Piece::Whole, Piece::First, Piece::Middle, Piece::Last][usize::from(rec[1] % 4)];
        let len = usize::from(u16::from_be_bytes([rec[2], rec[3]])) % piece_bytes.len();
        now += Duration::from_millis(u64::from(rec[1] >> 2));
        r.poll(now, Duration::from_millis(30));
        if let Some(p) = r.push(now, seq, piece, &piece_bytes[..len]) {
            assert!(piece == Piece::Whole || p.len() <= MAX);
        }
        assert!(r.held() <= MAX);
    }
}

/// Seeds for [`reassemble_stream`]: a packet in three pieces, one with a gap, an oversize one.
pub fn reassemble_seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let rec = |step: u8, kind: u8, len: u16| {
        let l = len.to_be_bytes();
        [step, kind, l[0], l[1]]
    };
    let three = [rec(1, 1, 500), rec(1, 2, 500), rec(1, 3, 500)].concat();
    let gap = [rec(1, 1, 500), rec(2, 3, 500), rec(1, 0, 60)].concat();
    let oversize = [rec(1, 1, 1000), rec(1, 2, 1000), rec(1, 3, 10)].concat();
    vec![
        ("reassemble", "three-pieces".into(), three),
        ("reassemble", "gap".into(), gap),
        ("reassemble", "oversize".into(), oversize),
        (
            "reassemble",
            "timeout".into(),
            [rec(1, 1, 9), rec(1, 0xff, 9)].concat(),
        ),
        ("reassemble", "empty".into(), Vec::new()),
    ]
}
