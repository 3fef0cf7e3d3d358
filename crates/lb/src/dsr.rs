//! DSR frame logic (sans-I/O): ARP/NDP answers for the VIP, MAC rewrite towards the chosen backend,
//! and the learning of backends' MAC addresses.
//!
//! Direct Server Return as in IPVS "DR" and Pen's DSR mode: a frame for the virtual IP (the VIP)
//! arrives at the balancer because the balancer answers ARP (IPv4) or Neighbor Solicitations (IPv6)
//! for the VIP. The balancer leaves the IP packet untouched and only rewrites the Ethernet header:
//! destination = the chosen backend's MAC, source = the balancer's own MAC; the frame goes back out
//! of the same interface. Each backend carries the VIP on its loopback, accepts the packet as its
//! own and replies straight to the client.
//!
//! This module never touches a socket or a clock: [`classify`] says what an incoming frame is,
//! [`set_macs`] rewrites a frame in place, the `*_frame` functions build the frames the balancer
//! sends on its own, and [`Neighbors`] decides (with the caller's `now`) when a backend's MAC must
//! be asked for again. Every function takes untrusted bytes and never panics on them.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use etherparse::{Ipv4Slice, Ipv6Slice};

/// An Ethernet MAC address.
pub type Mac = [u8; 6];

/// The broadcast MAC address.
pub const BROADCAST: Mac = [0xff; 6];

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_ARP: u16 = 0x0806;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const ETH_HEADER_LEN: usize = 14;
const ARP_LEN: usize = 28;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const IPPROTO_ICMPV6: u8 = 58;
const ICMPV6_NEIGHBOR_SOLICITATION: u8 = 135;
const ICMPV6_NEIGHBOR_ADVERTISEMENT: u8 = 136;
const NDP_OPT_SOURCE_LL: u8 = 1;
const NDP_OPT_TARGET_LL: u8 = 2;

/// The transport protocol the VIP serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    Tcp,
    Udp,
}

impl Transport {
    /// The IP protocol number.
    pub fn ip_number(self) -> u8 {
        match self {
            Transport::Tcp => IPPROTO_TCP,
            Transport::Udp => IPPROTO_UDP,
        }
    }
}

/// What the DSR balancer serves and who it is on the segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DsrConfig {
    /// The virtual IP (IPv4 or IPv6).
    pub vip: IpAddr,
    /// The service port; 0 = every port.
    pub port: u16,
    pub transport: Transport,
    /// The balancer's MAC on the DSR interface: the source MAC of every frame it sends.
    pub mac: Mac,
    /// The balancer's own IPv4 address on the interface: sender of its ARP requests
    /// (`None`: requests are sent as ARP probes, sender 0.0.0.0, which hosts answer too).
    pub ipv4: Option<Ipv4Addr>,
    /// The balancer's own IPv6 address on the interface (link-local is best): source of its
    /// Neighbor Solicitations. Without one, IPv6 backends cannot be resolved.
    pub ipv6: Option<Ipv6Addr>,
}

/// The 5-tuple of a packet for the VIP. Fragments of a datagram carry no ports (see [`classify`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub src_port: u16,
    pub dst_port: u16,
    /// The IP protocol number (6 = TCP, 17 = UDP).
    pub protocol: u8,
}

impl FlowKey {
    /// A stable 64-bit hash of the 5-tuple (FNV-1a then a 64-bit finalizer). Stable across
    /// processes and versions, so two balancers with the same backends pick the same one.
    pub fn hash64(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |bytes: &[u8]| {
            for &b in bytes {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        };
        match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                eat(&s.octets());
                eat(&d.octets());
            }
            (s, d) => {
                eat(&to_v6(s).octets());
                eat(&to_v6(d).octets());
            }
        }
        eat(&self.src_port.to_be_bytes());
        eat(&self.dst_port.to_be_bytes());
        eat(&[self.protocol]);
        // splitmix64 finalizer: FNV alone leaves the high bits weak for short inputs.
        let mut z = h;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

fn to_v6(a: IpAddr) -> Ipv6Addr {
    match a {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

/// A packet for the VIP that must go to a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VipPacket {
    pub flow: FlowKey,
    /// TCP SYN without ACK: the first packet of a new connection.
    pub syn: bool,
    /// TCP FIN or RST: the connection is ending.
    pub fin_or_rst: bool,
    /// A fragment of a larger datagram: `flow` carries no ports (0, 0).
    pub fragment: bool,
    /// The IP packet's length in bytes (the frame without its Ethernet header).
    pub ip_len: usize,
}

/// Why a frame is not for the balancer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ignored {
    /// Too short, bad header, bad length: never trusted.
    Malformed,
    /// Unicast to another MAC (flooded by a switch, or seen in promiscuous mode).
    NotOurMac,
    /// An EtherType the balancer does not handle (VLAN tags included).
    OtherEtherType,
    /// IP, but not to the VIP (traffic for the balancer's own address: the kernel's business).
    NotVip,
    /// To the VIP, but another protocol or port than the service's.
    OtherService,
    /// ARP/NDP that asks for someone else and teaches nothing.
    OtherNeighbor,
}

/// What an incoming frame means for the balancer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// A packet for the service: pick a backend, [`set_macs`], send it back out.
    ToVip(VipPacket),
    /// An ARP request or Neighbor Solicitation for the VIP: send this reply frame.
    Answer(Vec<u8>),
    /// Somebody's MAC, learned from an ARP packet or a Neighbor Advertisement/Solicitation.
    Neighbor {
        ip: IpAddr,
        mac: Mac,
    },
    Ignore(Ignored),
}

fn is_multicast(mac: &Mac) -> bool {
    mac[0] & 1 == 1
}

fn read_mac(b: &[u8]) -> Mac {
    let mut m = [0u8; 6];
    m.copy_from_slice(&b[..6]);
    m
}

/// Says what `frame` (a full Ethernet frame, starting with the destination MAC) is.
///
/// IP fragments of a datagram for the VIP are keyed on addresses and protocol only (ports 0), so
/// all fragments of one datagram reach the same backend; with a port filter, fragments are
/// accepted on the protocol alone (later fragments carry no port).
pub fn classify(frame: &[u8], cfg: &DsrConfig) -> Frame {
    if frame.len() < ETH_HEADER_LEN {
        return Frame::Ignore(Ignored::Malformed);
    }
    let dst_mac = read_mac(&frame[0..6]);
    if dst_mac != cfg.mac && !is_multicast(&dst_mac) {
        return Frame::Ignore(Ignored::NotOurMac);
    }
    let ethertype = u16::from_be_bytes([frame[12], frame[13]]);
    let payload = &frame[ETH_HEADER_LEN..];
    match ethertype {
        ETHERTYPE_ARP => classify_arp(payload, cfg),
        ETHERTYPE_IPV4 => classify_ipv4(&dst_mac, payload, cfg),
        ETHERTYPE_IPV6 => classify_ipv6(frame, &dst_mac, payload, cfg),
        _ => Frame::Ignore(Ignored::OtherEtherType),
    }
}

fn service_matches(cfg: &DsrConfig, protocol: u8, dst_port: Option<u16>) -> bool {
    protocol == cfg.transport.ip_number()
        && match dst_port {
            Some(p) => cfg.port == 0 || cfg.port == p,
            None => true, // a later fragment: no port to look at
        }
}

/// Reads the ports (and TCP flags) at the start of a TCP/UDP header.
fn transport_info(protocol: u8, l4: &[u8]) -> Option<(u16, u16, bool, bool)> {
    if l4.len() < 4 {
        return None;
    }
    let sport = u16::from_be_bytes([l4[0], l4[1]]);
    let dport = u16::from_be_bytes([l4[2], l4[3]]);
    if protocol == IPPROTO_TCP {
        if l4.len() < 20 {
            return None;
        }
        let flags = l4[13];
        let syn = flags & 0x02 != 0 && flags & 0x10 == 0;
        let fin_or_rst = flags & 0x05 != 0;
        Some((sport, dport, syn, fin_or_rst))
    } else {
        if l4.len() < 8 {
            return None;
        }
        Some((sport, dport, false, false))
    }
}

/// The IP-level facts of a packet, as [`vip_packet`] needs them.
struct IpFacts<'a> {
    src: IpAddr,
    dst: IpAddr,
    protocol: u8,
    fragmented: bool,
    first_fragment: bool,
    l4: &'a [u8],
    ip_len: usize,
}

fn vip_packet(cfg: &DsrConfig, dst_mac: &Mac, ip: IpFacts<'_>) -> Frame {
    let IpFacts {
        src,
        dst,
        protocol,
        fragmented,
        first_fragment,
        l4,
        ip_len,
    } = ip;
    if *dst_mac != cfg.mac {
        // A multicast/broadcast frame to a unicast VIP is not meant for us to forward.
        return Frame::Ignore(Ignored::NotOurMac);
    }
    if fragmented {
        // The first fragment carries the ports: check them when we can.
        let port = if first_fragment
            && (protocol == IPPROTO_TCP || protocol == IPPROTO_UDP)
            && l4.len() >= 4
        {
            Some(u16::from_be_bytes([l4[2], l4[3]]))
        } else {
            None
        };
        if !service_matches(cfg, protocol, port) {
            return Frame::Ignore(Ignored::OtherService);
        }
        let flow = FlowKey {
            src,
            dst,
            src_port: 0,
            dst_port: 0,
            protocol,
        };
        return Frame::ToVip(VipPacket {
            flow,
            syn: false,
            fin_or_rst: false,
            fragment: true,
            ip_len,
        });
    }
    if protocol != cfg.transport.ip_number() {
        return Frame::Ignore(Ignored::OtherService);
    }
    let Some((src_port, dst_port, syn, fin_or_rst)) = transport_info(protocol, l4) else {
        return Frame::Ignore(Ignored::Malformed);
    };
    if !service_matches(cfg, protocol, Some(dst_port)) {
        return Frame::Ignore(Ignored::OtherService);
    }
    let flow = FlowKey {
        src,
        dst,
        src_port,
        dst_port,
        protocol,
    };
    Frame::ToVip(VipPacket {
        flow,
        syn,
        fin_or_rst,
        fragment: false,
        ip_len,
    })
}

fn classify_ipv4(dst_mac: &Mac, payload: &[u8], cfg: &DsrConfig) -> Frame {
    let IpAddr::V4(vip) = cfg.vip else {
        return Frame::Ignore(Ignored::NotVip);
    };
    // Cheap pre-check before the full parse: most traffic on a shared segment is not for the VIP.
    if payload.len() < 20 || payload[16..20] != vip.octets() {
        return if payload.len() < 20 {
            Frame::Ignore(Ignored::Malformed)
        } else {
            Frame::Ignore(Ignored::NotVip)
        };
    }
    let Ok(ip) = Ipv4Slice::from_slice(payload) else {
        return Frame::Ignore(Ignored::Malformed);
    };
    let h = ip.header();
    let p = ip.payload();
    let first = h.fragments_offset().value() == 0;
    let facts = IpFacts {
        src: IpAddr::V4(h.source_addr()),
        dst: IpAddr::V4(h.destination_addr()),
        protocol: h.protocol().0,
        fragmented: p.fragmented,
        first_fragment: first,
        l4: p.payload,
        ip_len: usize::from(h.total_len()),
    };
    vip_packet(cfg, dst_mac, facts)
}

fn classify_ipv6(frame: &[u8], dst_mac: &Mac, payload: &[u8], cfg: &DsrConfig) -> Frame {
    let Ok(ip) = Ipv6Slice::from_slice(payload) else {
        return Frame::Ignore(Ignored::Malformed);
    };
    let h = ip.header();
    let p = ip.payload();
    let src = h.source_addr();
    let dst = h.destination_addr();
    if p.ip_number.0 == IPPROTO_ICMPV6 && !p.fragmented {
        if let Some(f) = classify_ndp(frame, src, h.hop_limit(), p.payload, cfg) {
            return f;
        }
    }
    if cfg.vip != IpAddr::V6(dst) {
        return Frame::Ignore(Ignored::NotVip);
    }
    // A packet is a "first fragment" when its fragment header says offset 0.
    let first = !p.fragmented
        || ip
            .extensions()
            .clone()
            .into_iter()
            .find_map(|e| match e {
                etherparse::Ipv6ExtensionSlice::Fragment(f) => {
                    Some(f.fragment_offset().value() == 0)
                }
                _ => None,
            })
            .unwrap_or(false);
    let ip_len = 40 + usize::from(h.payload_length());
    let facts = IpFacts {
        src: IpAddr::V6(src),
        dst: IpAddr::V6(dst),
        protocol: p.ip_number.0,
        fragmented: p.fragmented,
        first_fragment: first,
        l4: p.payload,
        ip_len,
    };
    vip_packet(cfg, dst_mac, facts)
}

/// Neighbor Solicitation for the VIP -> Answer; NS/NA that carries a MAC -> Neighbor.
/// `None`: not NDP, handle as ordinary IPv6.
fn classify_ndp(
    frame: &[u8],
    src: Ipv6Addr,
    hop_limit: u8,
    icmp: &[u8],
    cfg: &DsrConfig,
) -> Option<Frame> {
    let ty = *icmp.first()?;
    if ty != ICMPV6_NEIGHBOR_SOLICITATION && ty != ICMPV6_NEIGHBOR_ADVERTISEMENT {
        return None;
    }
    // RFC 4861 7.1.1/7.1.2: hop limit 255, code 0, at least 24 bytes.
    if hop_limit != 255 || icmp.len() < 24 || icmp[1] != 0 {
        return Some(Frame::Ignore(Ignored::Malformed));
    }
    let mut t = [0u8; 16];
    t.copy_from_slice(&icmp[8..24]);
    let target = Ipv6Addr::from(t);
    let Some(options) = ndp_options(&icmp[24..]) else {
        return Some(Frame::Ignore(Ignored::Malformed));
    };
    let eth_src = read_mac(&frame[6..12]);
    if ty == ICMPV6_NEIGHBOR_SOLICITATION {
        let sll = options.source_ll;
        if cfg.vip == IpAddr::V6(target) {
            // Duplicate address detection (source ::) gets an unsolicited answer to all nodes.
            let dad = src.is_unspecified();
            if dad && sll.is_some() {
                return Some(Frame::Ignore(Ignored::Malformed)); // RFC 4861: DAD NS has no SLLA
            }
            let (to_mac, to_ip) = if dad {
                (
                    [0x33, 0x33, 0, 0, 0, 1],
                    Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1),
                )
            } else {
                (sll.unwrap_or(eth_src), src)
            };
            return Some(Frame::Answer(neighbor_advertisement_frame(
                cfg.mac, target, to_mac, to_ip, !dad,
            )));
        }
        return Some(match sll {
            Some(mac) if !src.is_unspecified() && !is_multicast(&mac) => Frame::Neighbor {
                ip: IpAddr::V6(src),
                mac,
            },
            _ => Frame::Ignore(Ignored::OtherNeighbor),
        });
    }
    // Neighbor Advertisement: the target's MAC is in the TLLA option (or, lacking it, the sender).
    if target.is_multicast() {
        return Some(Frame::Ignore(Ignored::Malformed));
    }
    let mac = options.target_ll.unwrap_or(eth_src);
    if is_multicast(&mac) {
        return Some(Frame::Ignore(Ignored::Malformed));
    }
    Some(Frame::Neighbor {
        ip: IpAddr::V6(target),
        mac,
    })
}

struct NdpOptions {
    source_ll: Option<Mac>,
    target_ll: Option<Mac>,
}

fn ndp_options(mut b: &[u8]) -> Option<NdpOptions> {
    let mut o = NdpOptions {
        source_ll: None,
        target_ll: None,
    };
    while !b.is_empty() {
        if b.len() < 2 {
            return None;
        }
        let len = usize::from(b[1]) * 8;
        if len == 0 || len > b.len() {
            return None; // RFC 4861 4.6: a zero length option invalidates the packet
        }
        if (b[0] == NDP_OPT_SOURCE_LL || b[0] == NDP_OPT_TARGET_LL) && len >= 8 {
            let mac = read_mac(&b[2..8]);
            if b[0] == NDP_OPT_SOURCE_LL {
                o.source_ll = Some(mac);
            } else {
                o.target_ll = Some(mac);
            }
        }
        b = &b[len..];
    }
    Some(o)
}

fn classify_arp(arp: &[u8], cfg: &DsrConfig) -> Frame {
    // htype 1 (Ethernet), ptype IPv4, hlen 6, plen 4.
    if arp.len() < ARP_LEN || arp[0..6] != [0, 1, 8, 0, 6, 4] {
        return Frame::Ignore(Ignored::Malformed);
    }
    let op = u16::from_be_bytes([arp[6], arp[7]]);
    let sha = read_mac(&arp[8..14]);
    let spa = Ipv4Addr::new(arp[14], arp[15], arp[16], arp[17]);
    let tpa = Ipv4Addr::new(arp[24], arp[25], arp[26], arp[27]);
    if is_multicast(&sha) || sha == [0; 6] {
        return Frame::Ignore(Ignored::Malformed);
    }
    if op == 1 && cfg.vip == IpAddr::V4(tpa) && spa != tpa {
        // A request (or a probe, sender 0.0.0.0) for the VIP: we are the VIP on this segment.
        return Frame::Answer(arp_frame(2, cfg.mac, tpa, sha, sha, spa));
    }
    if (op == 1 || op == 2) && !spa.is_unspecified() && IpAddr::V4(spa) != cfg.vip {
        return Frame::Neighbor {
            ip: IpAddr::V4(spa),
            mac: sha,
        };
    }
    Frame::Ignore(Ignored::OtherNeighbor)
}

fn ethernet(dst: Mac, src: Mac, ethertype: u16, payload_len: usize) -> Vec<u8> {
    let mut f = Vec::with_capacity(ETH_HEADER_LEN + payload_len.max(46));
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f
}

/// An ARP frame: `op` 1 = request, 2 = reply. Padded to the 60-byte Ethernet minimum.
fn arp_frame(op: u16, sha: Mac, spa: Ipv4Addr, eth_dst: Mac, tha: Mac, tpa: Ipv4Addr) -> Vec<u8> {
    let mut f = ethernet(eth_dst, sha, ETHERTYPE_ARP, ARP_LEN);
    f.extend_from_slice(&[0, 1, 8, 0, 6, 4]);
    f.extend_from_slice(&op.to_be_bytes());
    f.extend_from_slice(&sha);
    f.extend_from_slice(&spa.octets());
    f.extend_from_slice(&tha);
    f.extend_from_slice(&tpa.octets());
    f.resize(60, 0);
    f
}

/// A broadcast ARP request from the balancer for `target` (to learn a backend's MAC).
pub fn arp_request_frame(cfg: &DsrConfig, target: Ipv4Addr) -> Vec<u8> {
    let spa = cfg.ipv4.unwrap_or(Ipv4Addr::UNSPECIFIED);
    arp_frame(1, cfg.mac, spa, BROADCAST, [0; 6], target)
}

/// A gratuitous ARP for the VIP (sender = target = VIP): clients and switches learn at once that
/// the VIP lives behind the balancer's MAC, e.g. after a fail-over.
pub fn gratuitous_arp_frame(cfg: &DsrConfig) -> Option<Vec<u8>> {
    let IpAddr::V4(vip) = cfg.vip else {
        return None;
    };
    Some(arp_frame(1, cfg.mac, vip, BROADCAST, [0; 6], vip))
}

fn solicited_node(target: Ipv6Addr) -> (Ipv6Addr, Mac) {
    let t = target.octets();
    let ip = Ipv6Addr::from([
        0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, t[13], t[14], t[15],
    ]);
    (ip, [0x33, 0x33, 0xff, t[13], t[14], t[15]])
}

/// The Ethernet multicast address that Neighbor Solicitations for `ip` are sent to (the
/// balancer's interface must accept it for the VIP).
pub fn solicited_node_mac(ip: Ipv6Addr) -> Mac {
    solicited_node(ip).1
}

/// The Internet checksum of an ICMPv6 message with its pseudo-header.
fn icmpv6_checksum(src: Ipv6Addr, dst: Ipv6Addr, msg: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut add = |b: &[u8]| {
        for c in b.chunks(2) {
            let w = if c.len() == 2 {
                u16::from_be_bytes([c[0], c[1]])
            } else {
                u16::from_be_bytes([c[0], 0])
            };
            sum = sum.wrapping_add(u32::from(w));
        }
    };
    add(&src.octets());
    add(&dst.octets());
    add(&(msg.len() as u32).to_be_bytes());
    add(&[0, 0, 0, IPPROTO_ICMPV6]);
    add(msg);
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn ipv6_icmp_frame(
    eth_dst: Mac,
    eth_src: Mac,
    src: Ipv6Addr,
    dst: Ipv6Addr,
    mut msg: Vec<u8>,
) -> Vec<u8> {
    let c = icmpv6_checksum(src, dst, &msg);
    msg[2..4].copy_from_slice(&c.to_be_bytes());
    let mut f = ethernet(eth_dst, eth_src, ETHERTYPE_IPV6, 40 + msg.len());
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    f.push(IPPROTO_ICMPV6);
    f.push(255); // hop limit: NDP demands 255
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    f.extend_from_slice(&msg);
    f
}

/// A Neighbor Advertisement for `target` (the VIP) from the balancer (override set, router unset).
fn neighbor_advertisement_frame(
    mac: Mac,
    target: Ipv6Addr,
    to_mac: Mac,
    to_ip: Ipv6Addr,
    solicited: bool,
) -> Vec<u8> {
    let flags = if solicited { 0x60 } else { 0x20 }; // S|O or O
    let mut msg = vec![ICMPV6_NEIGHBOR_ADVERTISEMENT, 0, 0, 0, flags, 0, 0, 0];
    msg.extend_from_slice(&target.octets());
    msg.extend_from_slice(&[NDP_OPT_TARGET_LL, 1]);
    msg.extend_from_slice(&mac);
    ipv6_icmp_frame(to_mac, mac, target, to_ip, msg)
}

/// An unsolicited Neighbor Advertisement for the VIP to all nodes (the IPv6 gratuitous ARP).
pub fn unsolicited_advertisement_frame(cfg: &DsrConfig) -> Option<Vec<u8>> {
    let IpAddr::V6(vip) = cfg.vip else {
        return None;
    };
    let all_nodes = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
    Some(neighbor_advertisement_frame(
        cfg.mac,
        vip,
        [0x33, 0x33, 0, 0, 0, 1],
        all_nodes,
        false,
    ))
}

/// A Neighbor Solicitation from the balancer for `target` (to learn an IPv6 backend's MAC).
/// `None` when the balancer has no IPv6 address to send it from.
pub fn neighbor_solicitation_frame(cfg: &DsrConfig, target: Ipv6Addr) -> Option<Vec<u8>> {
    let src = cfg.ipv6?;
    let (dst_ip, dst_mac) = solicited_node(target);
    let mut msg = vec![ICMPV6_NEIGHBOR_SOLICITATION, 0, 0, 0, 0, 0, 0, 0];
    msg.extend_from_slice(&target.octets());
    msg.extend_from_slice(&[NDP_OPT_SOURCE_LL, 1]);
    msg.extend_from_slice(&cfg.mac);
    Some(ipv6_icmp_frame(dst_mac, cfg.mac, src, dst_ip, msg))
}

/// A request frame that asks for `ip`'s MAC (ARP for IPv4, NS for IPv6).
pub fn resolve_frame(cfg: &DsrConfig, ip: IpAddr) -> Option<Vec<u8>> {
    match ip {
        IpAddr::V4(v4) => Some(arp_request_frame(cfg, v4)),
        IpAddr::V6(v6) => neighbor_solicitation_frame(cfg, v6),
    }
}

/// Rewrites a frame in place for a backend: destination MAC = `dst`, source MAC = `src`. The IP
/// packet is untouched (so are its checksums). Returns false if the frame is too short.
pub fn set_macs(frame: &mut [u8], dst: Mac, src: Mac) -> bool {
    if frame.len() < ETH_HEADER_LEN {
        return false;
    }
    frame[0..6].copy_from_slice(&dst);
    frame[6..12].copy_from_slice(&src);
    true
}

/// What the balancer knows of one backend's MAC.
#[derive(Clone, Copy, Debug)]
struct NeighborEntry {
    mac: Option<Mac>,
    learned_at: Option<Instant>,
    /// When the next request is due.
    next_request: Instant,
    /// Requests sent since the last answer (for the back-off while unresolved).
    unanswered: u32,
}

/// The backends' MAC addresses, learned from ARP replies / Neighbor Advertisements, and when to
/// ask again. Only tracked addresses (the backends) are stored: a flood of ARP from the segment
/// cannot grow the table.
///
/// Timing: an unresolved address is asked for at once, then after `retry`, doubling up to
/// `refresh`; a resolved one is asked again every `refresh` (a backend whose NIC was swapped is
/// picked up). A known MAC is kept until a different one is learned: whether a backend is alive
/// is the health checker's call, not ARP's.
#[derive(Clone, Debug)]
pub struct Neighbors {
    entries: HashMap<IpAddr, NeighborEntry>,
    retry: Duration,
    refresh: Duration,
}

impl Neighbors {
    pub fn new(retry: Duration, refresh: Duration) -> Self {
        Neighbors {
            entries: HashMap::new(),
            retry,
            refresh: refresh.max(retry),
        }
    }

    /// Starts tracking `ip` (a backend); its first request is due at `now`.
    pub fn track(&mut self, ip: IpAddr, now: Instant) {
        self.entries.entry(ip).or_insert(NeighborEntry {
            mac: None,
            learned_at: None,
            next_request: now,
            unanswered: 0,
        });
    }

    /// Stops tracking `ip` (the backend was removed).
    pub fn untrack(&mut self, ip: IpAddr) {
        self.entries.remove(&ip);
    }

    /// Tracked addresses.
    pub fn tracked(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.entries.keys().copied()
    }

    /// Records that `ip` is at `mac`. Returns true if this is new or changed information
    /// (false for untracked addresses and unchanged confirmations).
    pub fn handle_learned(&mut self, ip: IpAddr, mac: Mac, now: Instant) -> bool {
        let refresh = self.refresh;
        let Some(e) = self.entries.get_mut(&ip) else {
            return false;
        };
        let changed = e.mac != Some(mac);
        e.mac = Some(mac);
        e.learned_at = Some(now);
        e.unanswered = 0;
        e.next_request = now + refresh;
        changed
    }

    /// The MAC of `ip`, if known.
    pub fn mac(&self, ip: IpAddr) -> Option<Mac> {
        self.entries.get(&ip).and_then(|e| e.mac)
    }

    /// When `ip`'s MAC was last confirmed.
    pub fn learned_at(&self, ip: IpAddr) -> Option<Instant> {
        self.entries.get(&ip).and_then(|e| e.learned_at)
    }

    /// The addresses to ask for now; each is then scheduled for its next request.
    pub fn poll_requests(&mut self, now: Instant) -> Vec<IpAddr> {
        let mut due = Vec::new();
        for (ip, e) in self.entries.iter_mut() {
            if e.next_request > now {
                continue;
            }
            due.push(*ip);
            e.unanswered = e.unanswered.saturating_add(1);
            let wait = if e.mac.is_some() && e.unanswered <= 1 {
                self.refresh
            } else {
                // Unresolved, or a refresh went unanswered: retry, backing off up to `refresh`.
                let factor = 1u32 << (e.unanswered.saturating_sub(1)).min(16);
                (self.retry * factor).min(self.refresh)
            };
            e.next_request = now + wait;
        }
        due.sort();
        due
    }

    /// When [`Neighbors::poll_requests`] next has something to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.entries.values().map(|e| e.next_request).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LB: Mac = [0x02, 0, 0, 0, 0, 0x01];
    const CLIENT: Mac = [0x02, 0, 0, 0, 0, 0x0c];
    const BACKEND: Mac = [0x02, 0, 0, 0, 0, 0x0b];

    fn cfg4() -> DsrConfig {
        DsrConfig {
            vip: "198.18.0.100".parse().unwrap(),
            port: 80,
            transport: Transport::Tcp,
            mac: LB,
            ipv4: Some("198.18.0.2".parse().unwrap()),
            ipv6: Some("fe80::1".parse().unwrap()),
        }
    }

    fn cfg6() -> DsrConfig {
        DsrConfig {
            vip: "2001:db8::100".parse().unwrap(),
            ..cfg4()
        }
    }

    fn tcp4(
        dst_mac: Mac,
        src: [u8; 4],
        dst: [u8; 4],
        sport: u16,
        dport: u16,
        syn: bool,
    ) -> Vec<u8> {
        let b = etherparse::PacketBuilder::ethernet2(CLIENT, dst_mac)
            .ipv4(src, dst, 64)
            .tcp(sport, dport, 1, 1000);
        let b = if syn { b.syn() } else { b.ack(5) };
        let payload = b"GET / HTTP/1.1\r\n\r\n";
        let mut v = Vec::with_capacity(b.size(payload.len()));
        b.write(&mut v, payload).unwrap();
        v
    }

    fn udp6(dst_mac: Mac, src: [u8; 16], dst: [u8; 16], sport: u16, dport: u16) -> Vec<u8> {
        let b = etherparse::PacketBuilder::ethernet2(CLIENT, dst_mac)
            .ipv6(src, dst, 64)
            .udp(sport, dport);
        let mut v = Vec::new();
        b.write(&mut v, b"hello").unwrap();
        v
    }

    #[test]
    fn tcp_syn_for_vip_is_forwarded_with_its_5_tuple() {
        let f = tcp4(LB, [198, 18, 0, 1], [198, 18, 0, 100], 40000, 80, true);
        let Frame::ToVip(p) = classify(&f, &cfg4()) else {
            panic!("not for VIP")
        };
        assert_eq!(p.flow.src, IpAddr::from([198, 18, 0, 1]));
        assert_eq!(p.flow.dst, IpAddr::from([198, 18, 0, 100]));
        assert_eq!(
            (p.flow.src_port, p.flow.dst_port, p.flow.protocol),
            (40000, 80, 6)
        );
        assert!(p.syn && !p.fin_or_rst && !p.fragment);
        assert_eq!(p.ip_len, f.len() - 14);
    }

    #[test]
    fn other_port_protocol_address_or_mac_is_ignored() {
        let c = cfg4();
        let f = tcp4(LB, [198, 18, 0, 1], [198, 18, 0, 100], 40000, 81, false);
        assert_eq!(classify(&f, &c), Frame::Ignore(Ignored::OtherService));
        let f = tcp4(LB, [198, 18, 0, 1], [198, 18, 0, 2], 40000, 80, false);
        assert_eq!(classify(&f, &c), Frame::Ignore(Ignored::NotVip));
        let f = tcp4(
            BACKEND,
            [198, 18, 0, 1],
            [198, 18, 0, 100],
            40000,
            80,
            false,
        );
        assert_eq!(classify(&f, &c), Frame::Ignore(Ignored::NotOurMac));
        let udp = DsrConfig {
            transport: Transport::Udp,
            ..cfg4()
        };
        let f = tcp4(LB, [198, 18, 0, 1], [198, 18, 0, 100], 40000, 80, false);
        assert_eq!(classify(&f, &udp), Frame::Ignore(Ignored::OtherService));
        // Port 0 = all ports.
        let all = DsrConfig { port: 0, ..cfg4() };
        let f = tcp4(LB, [198, 18, 0, 1], [198, 18, 0, 100], 40000, 8443, false);
        assert!(matches!(classify(&f, &all), Frame::ToVip(_)));
    }

    #[test]
    fn arp_request_for_vip_is_answered_with_our_mac() {
        let c = cfg4();
        let req = arp_frame(
            1,
            CLIENT,
            Ipv4Addr::new(198, 18, 0, 1),
            BROADCAST,
            [0; 6],
            Ipv4Addr::new(198, 18, 0, 100),
        );
        let Frame::Answer(reply) = classify(&req, &c) else {
            panic!("no answer")
        };
        assert_eq!(&reply[0..6], &CLIENT); // unicast back to the asker
        assert_eq!(&reply[6..12], &LB);
        assert_eq!(&reply[12..14], &[8, 6]);
        assert_eq!(&reply[20..22], &[0, 2]); // reply
        assert_eq!(&reply[22..28], &LB); // sender MAC: us
        assert_eq!(&reply[28..32], &[198, 18, 0, 100]); // sender IP: the VIP
        assert_eq!(&reply[32..38], &CLIENT);
        assert_eq!(&reply[38..42], &[198, 18, 0, 1]);
        assert_eq!(reply.len(), 60);
    }

    #[test]
    fn arp_reply_from_a_backend_teaches_its_mac() {
        let c = cfg4();
        let rep = arp_frame(
            2,
            BACKEND,
            Ipv4Addr::new(198, 18, 0, 11),
            LB,
            LB,
            Ipv4Addr::new(198, 18, 0, 2),
        );
        assert_eq!(
            classify(&rep, &c),
            Frame::Neighbor {
                ip: IpAddr::from([198, 18, 0, 11]),
                mac: BACKEND
            }
        );
        // Our own request, parsed back: asks for the backend, from our address.
        let req = arp_request_frame(&c, Ipv4Addr::new(198, 18, 0, 11));
        assert_eq!(&req[0..6], &BROADCAST);
        assert_eq!(&req[28..32], &[198, 18, 0, 2]);
        assert_eq!(&req[38..42], &[198, 18, 0, 11]);
        // A reply that claims the VIP (somebody else owns it?) teaches nothing.
        let bad = arp_frame(
            2,
            BACKEND,
            Ipv4Addr::new(198, 18, 0, 100),
            LB,
            LB,
            Ipv4Addr::new(198, 18, 0, 2),
        );
        assert_eq!(classify(&bad, &c), Frame::Ignore(Ignored::OtherNeighbor));
    }

    #[test]
    fn set_macs_rewrites_only_the_ethernet_addresses() {
        let mut f = tcp4(LB, [198, 18, 0, 1], [198, 18, 0, 100], 40000, 80, true);
        let before = f.clone();
        assert!(set_macs(&mut f, BACKEND, LB));
        assert_eq!(&f[0..6], &BACKEND);
        assert_eq!(&f[6..12], &LB);
        assert_eq!(&f[12..], &before[12..]);
        assert!(!set_macs(&mut [0u8; 10], BACKEND, LB));
    }

    #[test]
    fn ipv6_udp_for_vip_is_forwarded() {
        let mut c = cfg6();
        c.transport = Transport::Udp;
        c.port = 53;
        let vip = c.vip.to_string().parse::<Ipv6Addr>().unwrap().octets();
        let src = "2001:db8::1".parse::<Ipv6Addr>().unwrap().octets();
        let f = udp6(LB, src, vip, 5353, 53);
        let Frame::ToVip(p) = classify(&f, &c) else {
            panic!("not for VIP")
        };
        assert_eq!(
            (p.flow.src_port, p.flow.dst_port, p.flow.protocol),
            (5353, 53, 17)
        );
        assert_eq!(p.ip_len, f.len() - 14);
    }

    fn ns_frame(src: Ipv6Addr, target: Ipv6Addr, sll: Option<Mac>) -> Vec<u8> {
        let (dst_ip, dst_mac) = solicited_node(target);
        let mut msg = vec![ICMPV6_NEIGHBOR_SOLICITATION, 0, 0, 0, 0, 0, 0, 0];
        msg.extend_from_slice(&target.octets());
        if let Some(m) = sll {
            msg.extend_from_slice(&[1, 1]);
            msg.extend_from_slice(&m);
        }
        ipv6_icmp_frame(dst_mac, CLIENT, src, dst_ip, msg)
    }

    #[test]
    fn neighbor_solicitation_for_vip_is_answered() {
        let c = cfg6();
        let vip: Ipv6Addr = "2001:db8::100".parse().unwrap();
        let client: Ipv6Addr = "2001:db8::1".parse().unwrap();
        let Frame::Answer(na) = classify(&ns_frame(client, vip, Some(CLIENT)), &c) else {
            panic!("no answer")
        };
        assert_eq!(&na[0..6], &CLIENT);
        let ip = Ipv6Slice::from_slice(&na[14..]).unwrap();
        assert_eq!(ip.header().source_addr(), vip);
        assert_eq!(ip.header().destination_addr(), client);
        assert_eq!(ip.header().hop_limit(), 255);
        let icmp = ip.payload().payload;
        assert_eq!(icmp[0], ICMPV6_NEIGHBOR_ADVERTISEMENT);
        assert_eq!(icmp[4], 0x60);
        assert_eq!(&icmp[8..24], &vip.octets());
        assert_eq!(
            &icmp[24..32],
            &[2, 1, LB[0], LB[1], LB[2], LB[3], LB[4], LB[5]]
        );
        // The checksum verifies: summing the message with its checksum in gives 0.
        assert_eq!(icmpv6_checksum(vip, client, icmp), 0);
        // Our answer, parsed back by another balancer, teaches our MAC for the VIP... but the VIP
        // is ours, so a balancer would not learn it; a plain NA for a backend is learned:
        let backend: Ipv6Addr = "2001:db8::11".parse().unwrap();
        let na_b =
            neighbor_advertisement_frame(BACKEND, backend, LB, "fe80::1".parse().unwrap(), true);
        assert_eq!(
            classify(&na_b, &c),
            Frame::Neighbor {
                ip: IpAddr::V6(backend),
                mac: BACKEND
            }
        );
    }

    #[test]
    fn dad_probe_for_vip_gets_an_unsolicited_answer_to_all_nodes() {
        let c = cfg6();
        let vip: Ipv6Addr = "2001:db8::100".parse().unwrap();
        let Frame::Answer(na) = classify(&ns_frame(Ipv6Addr::UNSPECIFIED, vip, None), &c) else {
            panic!()
        };
        assert_eq!(&na[0..6], &[0x33, 0x33, 0, 0, 0, 1]);
        assert_eq!(na[14 + 40 + 4], 0x20); // override, not solicited
    }

    #[test]
    fn our_neighbor_solicitation_is_well_formed() {
        let c = cfg6();
        let target: Ipv6Addr = "2001:db8::11".parse().unwrap();
        let ns = neighbor_solicitation_frame(&c, target).unwrap();
        assert_eq!(&ns[0..6], &[0x33, 0x33, 0xff, 0, 0, 0x11]);
        let ip = Ipv6Slice::from_slice(&ns[14..]).unwrap();
        assert_eq!(
            ip.header().destination_addr(),
            "ff02::1:ff00:11".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!(
            icmpv6_checksum(
                ip.header().source_addr(),
                ip.header().destination_addr(),
                ip.payload().payload
            ),
            0
        );
        // Parsed by another host's logic: a solicitation with SLLA teaches the sender's MAC.
        assert_eq!(
            classify(
                &ns,
                &DsrConfig {
                    mac: BACKEND,
                    ..c.clone()
                }
            ),
            Frame::Neighbor {
                ip: "fe80::1".parse().unwrap(),
                mac: LB
            }
        );
        let no_v6 = DsrConfig { ipv6: None, ..c };
        assert!(neighbor_solicitation_frame(&no_v6, target).is_none());
    }

    #[test]
    fn ndp_with_bad_hop_limit_or_zero_length_option_is_rejected() {
        let c = cfg6();
        let vip: Ipv6Addr = "2001:db8::100".parse().unwrap();
        let mut f = ns_frame("2001:db8::1".parse().unwrap(), vip, Some(CLIENT));
        f[14 + 7] = 64;
        assert_eq!(classify(&f, &c), Frame::Ignore(Ignored::Malformed));
        let mut f = ns_frame("2001:db8::1".parse().unwrap(), vip, Some(CLIENT));
        f[14 + 40 + 25] = 0; // option length 0
        assert_eq!(classify(&f, &c), Frame::Ignore(Ignored::Malformed));
    }

    #[test]
    fn fragments_are_keyed_without_ports() {
        let c = DsrConfig {
            port: 0,
            transport: Transport::Udp,
            ..cfg4()
        };
        let b = etherparse::PacketBuilder::ethernet2(CLIENT, LB)
            .ipv4([198, 18, 0, 1], [198, 18, 0, 100], 64)
            .udp(1, 2);
        let mut f = Vec::new();
        b.write(&mut f, &[0u8; 100]).unwrap();
        // Set "more fragments" and fix the header checksum (etherparse checks only lengths).
        f[14 + 6] |= 0x20;
        let Frame::ToVip(p) = classify(&f, &c) else {
            panic!()
        };
        assert!(p.fragment);
        assert_eq!((p.flow.src_port, p.flow.dst_port), (0, 0));
        // A later fragment (offset 8 bytes) with no UDP header at all still goes the same way.
        f[14 + 6] = 0x20;
        f[14 + 7] = 1;
        let Frame::ToVip(q) = classify(&f, &c) else {
            panic!()
        };
        assert_eq!(p.flow, q.flow);
    }

    #[test]
    fn hash_is_stable_and_spreads() {
        let k = FlowKey {
            src: "198.18.0.1".parse().unwrap(),
            dst: "198.18.0.100".parse().unwrap(),
            src_port: 40000,
            dst_port: 80,
            protocol: 6,
        };
        assert_eq!(k.hash64(), k.hash64());
        let mut buckets = [0u32; 4];
        for p in 0..4000u16 {
            let h = FlowKey {
                src_port: 30000 + p,
                ..k
            }
            .hash64();
            buckets[(h % 4) as usize] += 1;
        }
        assert!(buckets.iter().all(|&b| b > 800), "{buckets:?}");
    }

    #[test]
    fn neighbors_ask_retry_with_backoff_and_refresh() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let ip: IpAddr = "198.18.0.11".parse().unwrap();
        let mut n = Neighbors::new(s, 30 * s);
        n.track(ip, t0);
        assert_eq!(n.poll_requests(t0), vec![ip]);
        assert!(n.poll_requests(t0).is_empty());
        assert_eq!(n.poll_timeout(), Some(t0 + s));
        assert_eq!(n.poll_requests(t0 + s), vec![ip]);
        assert_eq!(n.poll_timeout(), Some(t0 + 3 * s)); // backed off: 2 s
                                                        // An answer from an untracked address is not stored.
        assert!(!n.handle_learned("198.18.0.99".parse().unwrap(), BACKEND, t0));
        assert_eq!(n.mac("198.18.0.99".parse().unwrap()), None);
        assert!(n.handle_learned(ip, BACKEND, t0 + 2 * s));
        assert!(!n.handle_learned(ip, BACKEND, t0 + 2 * s));
        assert_eq!(n.mac(ip), Some(BACKEND));
        assert_eq!(n.poll_timeout(), Some(t0 + 32 * s));
        assert_eq!(n.poll_requests(t0 + 32 * s), vec![ip]);
        // An unanswered refresh: keep the MAC, retry sooner.
        assert_eq!(n.poll_requests(t0 + 62 * s), vec![ip]);
        assert_eq!(n.poll_timeout(), Some(t0 + 64 * s));
        assert_eq!(n.mac(ip), Some(BACKEND));
        n.untrack(ip);
        assert_eq!(n.mac(ip), None);
        assert_eq!(n.poll_timeout(), None);
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = classify(&bytes, &cfg4());
            let _ = classify(&bytes, &cfg6());
        }

        #[test]
        fn mutated_valid_frames_never_panic(idx in 0usize..200, val in any::<u8>(), cut in 0usize..200, which in 0usize..4) {
            let c4 = cfg4();
            let c6 = cfg6();
            let vip6: Ipv6Addr = "2001:db8::100".parse().unwrap();
            let mut f = match which {
                0 => tcp4(LB, [198, 18, 0, 1], [198, 18, 0, 100], 40000, 80, true),
                1 => arp_frame(1, CLIENT, Ipv4Addr::new(198, 18, 0, 1), BROADCAST, [0; 6], Ipv4Addr::new(198, 18, 0, 100)),
                2 => ns_frame("2001:db8::1".parse().unwrap(), vip6, Some(CLIENT)),
                _ => udp6(LB, [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], vip6.octets(), 1, 80),
            };
            if idx < f.len() { f[idx] = val; }
            f.truncate(cut.max(1));
            let _ = classify(&f, &c4);
            let _ = classify(&f, &c6);
        }
    }
}
