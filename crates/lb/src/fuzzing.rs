//! The bodies of braid-lb's fuzz targets, in the library so that they run in two places:
//! `fuzz/` (cargo-fuzz, nightly, coverage-guided) and `tests/fuzz_corpus.rs` (stable: every seed
//! of the committed corpus plus random inputs, in the ordinary test suite).
//!
//! - [`dsr_frames`]: a [`DsrBalancer`] with three resolved backends, driven by a little program
//!   decoded from the input: raw frames up to 9 KB (jumbo), frames built around the input so that
//!   the fuzzer reaches forwarding quickly (TCP/UDP to the VIP, fragments, ICMP errors), time
//!   steps and backend health changes. Checked after every step: a forwarded frame changed only
//!   in its MAC addresses and goes to a backend's MAC; the backends' connection counts add up to
//!   the flows in the table (no leak through eviction, expiry, moves or FINs).
//! - [`health_http`]: the health checker's HTTP status-line parser.
//!
//! Both panic only on a broken invariant: that is what the fuzzer looks for.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use crate::algo::Algorithm;
use crate::backend::BackendTable;
use crate::dsr::{
    arp_frame, neighbor_advertisement_frame, Action, DsrBalancer, DsrConfig, DsrTimers, Mac, Steer,
    Transport,
};
use crate::health::{http_status_code, HealthParams};

/// The largest frame the harness feeds (a 9000-byte jumbo MTU plus headers).
pub const MAX_FRAME: usize = 9216;

const LB_MAC: Mac = [0x02, 0, 0, 0, 0, 0x01];
const CLIENT_MAC: Mac = [0x02, 0, 0, 0, 0, 0x0c];
const LB_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const VIP_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
const VIP_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 0x100);

fn backend_mac(i: u8) -> Mac {
    [0x02, 0, 0, 0, 0xbb, i]
}

fn backend_ip(i: u8, v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 0x10 + u16::from(i)))
    } else {
        IpAddr::V4(Ipv4Addr::new(198, 18, 0, 10 + i))
    }
}

/// Reads the input front to back; past the end everything is zero.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }
    fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (a, b) = self.0.split_at(n.min(self.0.len()));
        self.0 = b;
        a
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Runs the DSR program in `data` (see the module doc).
///
/// Layout: one byte of configuration (bit 0: IPv6 VIP; bit 1: UDP service; bit 2: every port
/// rather than 80; bits 3-4: flow table size 2, 8, 64 or 4096), then steps, each an opcode byte:
/// - `% 5 == 0`: a raw frame, a 2-byte length (mod 9217) and that many bytes;
/// - `% 5 == 1`: a packet to the VIP built from the next bytes (source port, TCP flags, fragment
///   fields, payload length up to 9 KB);
/// - `% 5 == 2`: time passes (next byte x 250 ms), then the balancer's housekeeping;
/// - `% 5 == 3`: a backend's health check result (next byte: backend, pass/fail);
/// - `% 5 == 4`: a backend drained or undrained.
pub fn dsr_frames(data: &[u8]) {
    let mut input = Input(data);
    let conf = input.u8();
    let v6 = conf & 1 != 0;
    let udp = conf & 2 != 0;
    let port = if conf & 4 != 0 { 0 } else { 80 };
    let max_flows = [2, 8, 64, 4096][usize::from((conf >> 3) & 3)];
    let cfg = DsrConfig {
        vip: if v6 {
            IpAddr::V6(VIP_V6)
        } else {
            IpAddr::V4(VIP_V4)
        },
        port,
        transport: if udp { Transport::Udp } else { Transport::Tcp },
        mac: LB_MAC,
        ipv4: Some(LB_V4),
        ipv6: Some("fe80::1".parse().expect("address")),
        steer: if conf & 32 != 0 {
            Steer::BraidRoute
        } else {
            Steer::Flow
        },
    };
    let timers = DsrTimers {
        max_flows,
        ..DsrTimers::default()
    };
    let mut now = Instant::now();
    let mut table = BackendTable::new(Algorithm::Maglev, 251, HealthParams { fall: 1, rise: 1 })
        .expect("table");
    for i in 1..=3 {
        table
            .add(SocketAddr::new(backend_ip(i, v6), 80), 1)
            .expect("backend");
    }
    let mut lb = DsrBalancer::new(cfg.clone(), timers);
    let _ = lb.poll_transmit(&mut table, now);
    for i in 1..=3 {
        let mut answer = match backend_ip(i, v6) {
            IpAddr::V4(ip) => arp_frame(2, backend_mac(i), ip, LB_MAC, LB_MAC, LB_V4),
            IpAddr::V6(ip) => neighbor_advertisement_frame(
                backend_mac(i),
                ip,
                LB_MAC,
                "fe80::1".parse().expect("address"),
                true,
            ),
        };
        assert_eq!(lb.handle_frame(&mut answer, &mut table, now), Action::None);
        assert_eq!(lb.neighbor(backend_ip(i, v6)), Some(backend_mac(i)));
    }

    let mut steps = 0;
    while !input.is_empty() && steps < 256 {
        steps += 1;
        match input.u8() % 5 {
            0 => {
                let len = usize::from(input.u16()) % (MAX_FRAME + 1);
                let frame = input.bytes(len).to_vec();
                check_frame(&mut lb, &mut table, frame, now);
            }
            1 => {
                let frame = vip_packet(&mut input, &cfg);
                check_frame(&mut lb, &mut table, frame, now);
            }
            2 => {
                now += Duration::from_millis(250) * u32::from(input.u8());
                let _ = lb.poll_transmit(&mut table, now);
            }
            3 => {
                let b = input.u8();
                let id = table.backends()[usize::from(b % 3)].id;
                table.handle_check(id, now, b & 0x80 != 0, None, "fuzz");
            }
            _ => {
                let b = input.u8();
                let addr = table.backends()[usize::from(b % 3)].addr;
                let _ = if b & 0x80 != 0 {
                    table.drain(addr)
                } else {
                    table.undrain(addr)
                };
            }
        }
        let counted: u64 = table.backends().iter().map(|b| b.active).sum();
        assert_eq!(
            counted,
            lb.flow_count().0 as u64,
            "backend connection counts drifted from the flow table"
        );
        assert!(lb.flow_count().0 <= max_flows && lb.flow_count().1 <= max_flows);
    }
}

/// Feeds one frame; checks what a forward did to it.
fn check_frame(lb: &mut DsrBalancer, table: &mut BackendTable, frame: Vec<u8>, now: Instant) {
    let before = frame.clone();
    let mut frame = frame;
    let _ = crate::dsr::classify(&frame, lb.config());
    if let Action::Forward { backend } = lb.handle_frame(&mut frame, table, now) {
        assert_eq!(frame.len(), before.len());
        assert_eq!(&frame[12..], &before[12..], "a forward changed the packet");
        assert_eq!(&frame[6..12], &LB_MAC);
        let macs: Vec<Mac> = (1..=3).map(backend_mac).collect();
        assert!(macs.contains(&frame[0..6].try_into().expect("6 bytes")));
        assert!(table.get(backend).is_some());
    }
}

/// A TCP or UDP packet to the VIP (or, by the input's choice, a fragment or an ICMP error about a
/// reply), from fields of the input.
fn vip_packet(input: &mut Input<'_>, cfg: &DsrConfig) -> Vec<u8> {
    let sport = input.u16();
    let flags = input.u8();
    let shape = input.u8();
    let frag_id = input.u16();
    let frag_off = input.u16() & 0x1fff;
    let payload_len = usize::from(input.u16()) % (MAX_FRAME - 80);
    let proto: u8 = if shape & 1 != 0 {
        cfg.transport.ip_number()
    } else {
        [6, 17, 1, 58][usize::from(shape >> 1) % 4]
    };
    let dport = if cfg.port == 0 { 8080 } else { cfg.port };
    let client: [u8; 4] = [198, 18, 0, 1 + (shape >> 5)];
    let mut l4 = Vec::new();
    if proto == 6 || proto == 17 {
        l4.extend_from_slice(&sport.to_be_bytes());
        l4.extend_from_slice(&dport.to_be_bytes());
        if proto == 6 {
            l4.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
        } else {
            l4.extend_from_slice(&[0, 8, 0, 0]);
        }
    } else {
        // An ICMP error quoting a reply VIP:port -> client:sport.
        l4.extend_from_slice(&[3 + (flags & 1), 4, 0, 0, 0, 0, 0x05, 0xdc]);
        l4.extend_from_slice(&[
            0x45,
            0,
            0,
            40,
            0,
            0,
            0,
            0,
            64,
            cfg.transport.ip_number(),
            0,
            0,
        ]);
        l4.extend_from_slice(&VIP_V4.octets());
        l4.extend_from_slice(&client);
        l4.extend_from_slice(&dport.to_be_bytes());
        l4.extend_from_slice(&sport.to_be_bytes());
    }
    l4.extend(input.bytes(payload_len));
    l4.resize(l4.len().max(payload_len.min(64)), 0);
    let fragmented = shape & 0x10 != 0;
    let mut f = Vec::with_capacity(14 + 48 + l4.len());
    f.extend_from_slice(&LB_MAC);
    f.extend_from_slice(&CLIENT_MAC);
    match cfg.vip {
        IpAddr::V4(vip) => {
            f.extend_from_slice(&[0x08, 0x00]);
            let total = (20 + l4.len()).min(usize::from(u16::MAX)) as u16;
            let fo = if fragmented { 0x2000 | frag_off } else { 0 };
            f.extend_from_slice(&[0x45, 0]);
            f.extend_from_slice(&total.to_be_bytes());
            f.extend_from_slice(&frag_id.to_be_bytes());
            f.extend_from_slice(&fo.to_be_bytes());
            f.extend_from_slice(&[64, proto, 0, 0]);
            f.extend_from_slice(&client);
            f.extend_from_slice(&vip.octets());
        }
        IpAddr::V6(vip) => {
            f.extend_from_slice(&[0x86, 0xdd]);
            let ext = if fragmented { 8 } else { 0 };
            let plen = (ext + l4.len()).min(usize::from(u16::MAX)) as u16;
            f.extend_from_slice(&[0x60, 0, 0, 0]);
            f.extend_from_slice(&plen.to_be_bytes());
            f.push(if fragmented { 44 } else { proto });
            f.push(64);
            let mut src = [0u8; 16];
            src[..4].copy_from_slice(&[0x20, 0x01, 0, 2]);
            src[15] = client[3];
            f.extend_from_slice(&src);
            f.extend_from_slice(&vip.octets());
            if fragmented {
                f.extend_from_slice(&[proto, 0]);
                f.extend_from_slice(&((frag_off << 3) | 1).to_be_bytes());
                f.extend_from_slice(&u32::from(frag_id).to_be_bytes());
            }
        }
    }
    f.extend_from_slice(&l4);
    f.truncate(MAX_FRAME);
    f
}

/// The health checker's HTTP status-line parser over any bytes: whatever it accepts is a status
/// line (`HTTP/`, a version, three digits).
pub fn health_http(data: &[u8]) {
    if let Some(code) = http_status_code(data) {
        assert!((100..=999).contains(&code));
        assert!(data.starts_with(b"HTTP/"));
        let digits = code.to_string();
        assert!(
            data.windows(4)
                .any(|w| w[0] == b' ' && &w[1..4] == digits.as_bytes()),
            "code {code} not in the status line"
        );
    }
}

/// Named seed inputs for each target (`(target, name, bytes)`), written to `fuzz/corpus/` by the
/// ignored test in `tests/fuzz_corpus.rs`.
pub fn seed_corpus() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut dsr = |name: &str, bytes: Vec<u8>| out.push(("dsr_frames", name.to_string(), bytes));
    // conf, then: op 1 (packet) sport, flags, shape, frag id, frag offset, payload length.
    let syn = |sport: u16, flags: u8, shape: u8| {
        let mut v = vec![1];
        v.extend_from_slice(&sport.to_be_bytes());
        v.extend_from_slice(&[flags, shape, 0, 7, 0, 0, 0, 10]);
        v
    };
    dsr("empty", vec![]);
    dsr("tcp4-syn-ack-fin", {
        let mut v = vec![0];
        v.extend(syn(1000, 0x02, 1));
        v.extend(syn(1000, 0x10, 1));
        v.extend(syn(1000, 0x11, 1));
        v
    });
    dsr("tcp4-full-table", {
        let mut v = vec![0]; // table of 2
        for p in 0..6u16 {
            v.extend(syn(2000 + p, 0x02, 1));
        }
        v.extend(syn(2000, 0x10, 1));
        v.extend([2, 200]); // 50 s
        v
    });
    dsr("udp6-fragments", {
        let mut v = vec![0b0000_1011];
        v.extend(syn(53, 0, 0x11));
        let mut later = syn(53, 0, 0x11);
        later[7] = 1; // offset
        v.extend(later);
        v
    });
    dsr("backend-down-moves-flows", {
        let mut v = vec![0b0001_1000];
        for p in 0..8u16 {
            v.extend(syn(3000 + p, 0x02, 1));
        }
        v.extend([3, 0, 3, 1, 3, 2]);
        for p in 0..8u16 {
            v.extend(syn(3000 + p, 0x10, 1));
        }
        v.extend([4, 0x80, 3, 0x80]);
        v
    });
    dsr("icmp-error-and-jumbo", {
        let mut v = vec![0];
        v.extend([1, 0x10, 0x00, 0, 0b100, 0, 0, 0, 0, 0x23, 0x00]);
        v.extend([0, 0x23, 0x28]);
        v.extend(std::iter::repeat_n(0x5a, 9000));
        v
    });
    let mut http =
        |name: &str, bytes: &[u8]| out.push(("health_http", name.to_string(), bytes.to_vec()));
    http("ok", b"HTTP/1.1 200 OK\r\n");
    http("redirect", b"HTTP/1.0 302 Found\r\nLocation: /\r\n");
    http("server-error", b"HTTP/1.1 503");
    http("short", b"HTTP/1.1 20");
    http("not-http", b"SSH-2.0-OpenSSH_9.6\r\n");
    out
}
