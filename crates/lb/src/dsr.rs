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

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use etherparse::{Ipv4Slice, Ipv6Slice};

use crate::algo::PickKey;
use crate::backend::{BackendId, BackendTable};
pub use crate::flow::FlowKey;
use crate::flow::FlowTable;

/// An Ethernet MAC address.
pub type Mac = [u8; 6];

/// The broadcast MAC address.
pub const BROADCAST: Mac = [0xff; 6];

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_ARP: u16 = 0x0806;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const ETH_HEADER_LEN: usize = 14;
const ARP_LEN: usize = 28;
const IPPROTO_ICMP: u8 = 1;
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
    /// What picks a packet's backend.
    pub steer: Steer,
}

/// What the DSR balancer keys its backend choice on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Steer {
    /// The connection (5-tuple): each TCP connection or UDP flow stays on its backend.
    #[default]
    Flow,
    /// braid concentrators behind the VIP (UDP): the route id in braid's clear header
    /// (docs/protocol.md §9.2), which every packet of every link of one client carries, hashed
    /// by the consistent algorithm alone, without state. All links of a client reach the same
    /// concentrator whatever their source addresses, every balancer instance agrees, and a
    /// concentrator added or removed moves only the clients Maglev moves. Datagrams that carry no
    /// route id (not braid's) go by their flow.
    BraidRoute,
}

/// A packet for the VIP that must go to a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VipPacket {
    pub flow: FlowKey,
    /// TCP SYN without ACK: the first packet of a new connection.
    pub syn: bool,
    /// TCP FIN or RST: the connection is ending.
    pub fin_or_rst: bool,
    /// Whether this packet may create flow state: a TCP SYN, or a UDP datagram (not a later
    /// fragment, not an ICMP error). Any other packet of an unknown flow is forwarded by the
    /// consistent hash alone, without state (see [`DsrBalancer`]).
    pub starts_flow: bool,
    /// A fragment of a larger datagram. The first fragment carries the full 5-tuple in `flow`;
    /// later ones carry no ports (`flow` has ports 0, 0).
    pub fragment: Option<Fragment>,
    /// The IP packet's length in bytes (the frame without its Ethernet header).
    pub ip_len: usize,
    /// With [`Steer::BraidRoute`]: the braid route id in the datagram (a whole one, or the
    /// first fragment of one).
    pub route: Option<u16>,
}

/// The fragment facts of a packet: the IP identification (IPv4's 16 bits, or the IPv6 fragment
/// header's 32) and whether this is the first fragment (offset 0, the one with the ports).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fragment {
    pub id: u32,
    pub first: bool,
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
    /// `Some` for a fragment.
    fragment: Option<Fragment>,
    l4: &'a [u8],
    ip_len: usize,
}

fn vip_packet(cfg: &DsrConfig, dst_mac: &Mac, ip: IpFacts<'_>) -> Frame {
    let IpFacts {
        src,
        dst,
        protocol,
        fragment,
        l4,
        ip_len,
    } = ip;
    if *dst_mac != cfg.mac {
        // A multicast/broadcast frame to a unicast VIP is not meant for us to forward.
        return Frame::Ignore(Ignored::NotOurMac);
    }
    if let Some(frag) = fragment {
        // The first fragment carries the ports (when its transport header is there at all):
        // check them and key it on its 5-tuple like any packet of its flow. Later fragments
        // have no ports; the balancer sends them where the first went (by IP identification).
        let ports = if frag.first && protocol == cfg.transport.ip_number() && l4.len() >= 4 {
            Some((
                u16::from_be_bytes([l4[0], l4[1]]),
                u16::from_be_bytes([l4[2], l4[3]]),
            ))
        } else {
            None
        };
        if !service_matches(cfg, protocol, ports.map(|(_, d)| d)) {
            return Frame::Ignore(Ignored::OtherService);
        }
        let (sport, dport) = ports.unwrap_or((0, 0));
        let (syn, fin_or_rst) = match transport_info(protocol, l4) {
            Some((_, _, syn, fin)) if frag.first => (syn, fin),
            _ => (false, false),
        };
        let flow = FlowKey::new(
            protocol,
            SocketAddr::new(src, sport),
            SocketAddr::new(dst, dport),
        );
        let starts_flow = ports.is_some() && (protocol == IPPROTO_UDP || syn);
        let route = ports.and_then(|_| braid_route(cfg, protocol, l4));
        return Frame::ToVip(VipPacket {
            flow,
            syn,
            fin_or_rst,
            starts_flow,
            fragment: Some(frag),
            ip_len,
            route,
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
    let flow = FlowKey::new(
        protocol,
        SocketAddr::new(src, src_port),
        SocketAddr::new(dst, dst_port),
    );
    Frame::ToVip(VipPacket {
        flow,
        syn,
        fin_or_rst,
        starts_flow: protocol == IPPROTO_UDP || syn,
        fragment: None,
        ip_len,
        route: braid_route(cfg, protocol, l4),
    })
}

/// The braid route id of a UDP datagram's payload (`l4` starts at the UDP header), when the
/// balancer steers by it.
fn braid_route(cfg: &DsrConfig, protocol: u8, l4: &[u8]) -> Option<u16> {
    if cfg.steer != Steer::BraidRoute || protocol != IPPROTO_UDP {
        return None;
    }
    braid_core::wire::peek_route(l4.get(8..)?)
}

/// The consistent algorithm's key for a braid route id (the same on every balancer instance).
pub fn route_pick_key(route: u16) -> PickKey {
    let h = crate::hash::fmix64(u64::from(route) | 0xb4a1_d000_0000_0000);
    PickKey {
        flow_hash: h,
        client_hash: h,
    }
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
    if h.protocol().0 == IPPROTO_ICMP && !p.fragmented {
        if *dst_mac != cfg.mac {
            return Frame::Ignore(Ignored::NotOurMac);
        }
        return icmp_error(cfg, p.payload, &[3, 11], usize::from(h.total_len()));
    }
    let fragment = p.fragmented.then(|| Fragment {
        id: u32::from(h.identification()),
        first: h.fragments_offset().value() == 0,
    });
    let facts = IpFacts {
        src: IpAddr::V4(h.source_addr()),
        dst: IpAddr::V4(h.destination_addr()),
        protocol: h.protocol().0,
        fragment,
        l4: p.payload,
        ip_len: usize::from(h.total_len()),
    };
    vip_packet(cfg, dst_mac, facts)
}

/// An ICMP error sent to the VIP (e.g. "fragmentation needed" / "packet too big" from a router
/// on the path of a backend's reply): it belongs to the flow of the packet it quotes, so it goes
/// to that flow's backend (otherwise path MTU discovery breaks for DSR replies). The quoted packet
/// went VIP:port -> client:port; its flow, seen from the client, is the reverse.
fn icmp_error(cfg: &DsrConfig, icmp: &[u8], error_types: &[u8], ip_len: usize) -> Frame {
    if icmp.len() < 8 || !error_types.contains(&icmp[0]) {
        return Frame::Ignore(Ignored::OtherService);
    }
    let quoted = &icmp[8..];
    let (src, dst, protocol, l4): (IpAddr, IpAddr, u8, &[u8]) = match cfg.vip {
        IpAddr::V4(_) => {
            if quoted.len() < 20 || quoted[0] >> 4 != 4 {
                return Frame::Ignore(Ignored::Malformed);
            }
            let ihl = usize::from(quoted[0] & 0x0f) * 4;
            if ihl < 20 || quoted.len() < ihl + 4 {
                return Frame::Ignore(Ignored::Malformed);
            }
            let a =
                |o: usize| IpAddr::from([quoted[o], quoted[o + 1], quoted[o + 2], quoted[o + 3]]);
            (a(12), a(16), quoted[9], &quoted[ihl..])
        }
        IpAddr::V6(_) => {
            if quoted.len() < 44 || quoted[0] >> 4 != 6 {
                return Frame::Ignore(Ignored::Malformed);
            }
            let a = |o: usize| {
                let mut b = [0u8; 16];
                b.copy_from_slice(&quoted[o..o + 16]);
                IpAddr::from(b)
            };
            // Only a transport header right after the fixed header (the usual case).
            (a(8), a(24), quoted[6], &quoted[40..])
        }
    };
    if src != cfg.vip || protocol != cfg.transport.ip_number() || l4.len() < 4 {
        return Frame::Ignore(Ignored::OtherService);
    }
    let sport = u16::from_be_bytes([l4[0], l4[1]]);
    let dport = u16::from_be_bytes([l4[2], l4[3]]);
    if cfg.port != 0 && sport != cfg.port {
        return Frame::Ignore(Ignored::OtherService);
    }
    let flow = FlowKey::new(
        protocol,
        SocketAddr::new(dst, dport),
        SocketAddr::new(src, sport),
    );
    Frame::ToVip(VipPacket {
        flow,
        syn: false,
        fin_or_rst: false,
        starts_flow: false,
        fragment: None,
        ip_len,
        route: None,
    })
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
    if p.ip_number.0 == IPPROTO_ICMPV6 && !p.fragmented {
        if *dst_mac != cfg.mac {
            return Frame::Ignore(Ignored::NotOurMac);
        }
        // Destination unreachable, packet too big, time exceeded.
        return icmp_error(
            cfg,
            p.payload,
            &[1, 2, 3],
            40 + usize::from(h.payload_length()),
        );
    }
    // The fragment header (if any) gives the datagram's identification and whether this is its
    // first fragment (offset 0). A fragmented packet without a readable one is treated as a
    // later fragment of datagram 0.
    let fragment = p.fragmented.then(|| {
        ip.extensions()
            .clone()
            .into_iter()
            .find_map(|e| match e {
                etherparse::Ipv6ExtensionSlice::Fragment(f) => Some(Fragment {
                    id: f.identification(),
                    first: f.fragment_offset().value() == 0,
                }),
                _ => None,
            })
            .unwrap_or(Fragment {
                id: 0,
                first: false,
            })
    });
    let ip_len = 40 + usize::from(h.payload_length());
    let facts = IpFacts {
        src: IpAddr::V6(src),
        dst: IpAddr::V6(dst),
        protocol: p.ip_number.0,
        fragment,
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
pub(crate) fn arp_frame(
    op: u16,
    sha: Mac,
    spa: Ipv4Addr,
    eth_dst: Mac,
    tha: Mac,
    tpa: Ipv4Addr,
) -> Vec<u8> {
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
pub(crate) fn neighbor_advertisement_frame(
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

fn datagram_key(p: &VipPacket, frag: Fragment) -> DatagramKey {
    DatagramKey {
        src: p.flow.src.ip(),
        dst: p.flow.dst.ip(),
        proto: p.flow.proto,
        id: frag.id,
    }
}

/// An 802.1Q (or 802.1ad) tag: the TPID (0x8100, 0x88a8) and the tag control information
/// (priority, DEI, VLAN id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VlanTag {
    pub tpid: u16,
    pub tci: u16,
}

impl VlanTag {
    /// The 802.1Q TPID, used when the kernel does not say which one the tag had.
    pub const TPID_8021Q: u16 = 0x8100;

    pub fn vlan_id(self) -> u16 {
        self.tci & 0x0fff
    }
}

/// Puts a VLAN tag back into a frame whose tag the NIC (or the kernel) stripped on receive: the
/// frame occupies `buf[..len]`; the tag goes after the source MAC and everything after it moves
/// 4 bytes on. Returns the new length, or `None` (frame untouched) if `buf` has no room for the 4
/// bytes or the frame is shorter than an Ethernet header.
pub fn insert_vlan_tag(buf: &mut [u8], len: usize, tag: VlanTag) -> Option<usize> {
    if len < ETH_HEADER_LEN || len > buf.len() || buf.len() - len < 4 {
        return None;
    }
    buf.copy_within(12..len, 16);
    buf[12..14].copy_from_slice(&tag.tpid.to_be_bytes());
    buf[14..16].copy_from_slice(&tag.tci.to_be_bytes());
    Some(len + 4)
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

/// Where a flow goes: the backend and the MAC it was sent to (kept so that the flows of a removed
/// backend can finish).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowTarget {
    pub backend: BackendId,
    pub mac: Mac,
}

/// What the runtime must do with a received frame after [`DsrBalancer::handle_frame`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// The frame was rewritten in place: send it back out of the interface.
    Forward { backend: BackendId },
    /// Send this frame (an ARP reply or Neighbor Advertisement for the VIP).
    Reply(Vec<u8>),
    /// Nothing to send (a MAC was learned, or the frame is not for us).
    None,
    /// A packet for the VIP that could not be forwarded.
    Drop(DropReason),
}

/// Why a packet for the VIP was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// No backend may take new flows (all down, draining or removed).
    NoBackend,
    /// Backends are up but none's MAC is known yet.
    NoMac,
}

/// Counters of the DSR data path (for `braid status` and metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DsrStats {
    /// Packets and IP bytes forwarded to backends.
    pub forwarded_packets: u64,
    pub forwarded_bytes: u64,
    /// ARP replies / Neighbor Advertisements sent for the VIP.
    pub answered: u64,
    /// Flows that got a backend (first packet of a connection, or moved off a dead backend).
    pub new_flows: u64,
    /// Backend MACs learned (new or changed).
    pub learned: u64,
    pub dropped_no_backend: u64,
    pub dropped_no_mac: u64,
    /// Frames not for us, or malformed.
    pub ignored: u64,
    pub malformed: u64,
    /// Flows whose backend went down and that were moved to a live one.
    pub flows_moved: u64,
    /// Flows pushed out of a full flow table (the least recently used first).
    pub flows_evicted: u64,
    /// Mid-connection TCP packets of flows the table does not know (after a restart or an
    /// eviction), forwarded by hash without creating state.
    pub untracked: u64,
    /// Packets steered by their braid route id ([`Steer::BraidRoute`]), without flow state.
    pub braid_routed: u64,
}

/// Timing and sizes of the DSR data path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DsrTimers {
    /// A flow without packets for this long is forgotten (and its backend's active count drops).
    pub flow_idle: Duration,
    /// After a FIN or RST, the flow is kept this long for the last ACKs and retransmissions.
    pub closing_idle: Duration,
    /// Flow table capacity.
    pub max_flows: usize,
    /// ARP/NS retry while a backend's MAC is unknown (doubles up to `neighbor_refresh`).
    pub neighbor_retry: Duration,
    /// ARP/NS refresh of known MACs.
    pub neighbor_refresh: Duration,
}

impl Default for DsrTimers {
    fn default() -> Self {
        DsrTimers {
            flow_idle: Duration::from_secs(300),
            closing_idle: Duration::from_secs(10),
            max_flows: 1 << 20,
            neighbor_retry: Duration::from_millis(500),
            neighbor_refresh: Duration::from_secs(30),
        }
    }
}

/// How long the backend of a fragmented datagram is remembered for its later fragments (as long
/// as Linux keeps fragments for reassembly, `net.ipv4.ipfrag_time`).
pub const FRAGMENT_IDLE: Duration = Duration::from_secs(30);
/// At most this many fragmented datagrams are remembered at once.
pub const MAX_FRAGMENTED_DATAGRAMS: usize = 65_536;

/// A fragmented datagram: its addresses, protocol and IP identification (RFC 791: unique per
/// source, destination and protocol while the datagram may be alive).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct DatagramKey {
    src: IpAddr,
    dst: IpAddr,
    proto: u8,
    id: u32,
}

/// The DSR data path, sans I/O: frames in ([`DsrBalancer::handle_frame`]), frames out (in place,
/// replies, and [`DsrBalancer::poll_transmit`] for ARP/NS requests), all against a
/// [`BackendTable`] that the caller owns (it is shared with the health checker and the control
/// socket, so it is passed in rather than held).
///
/// Flow stickiness: a flow's first packet picks a backend through the table's algorithm (Maglev:
/// the same pick on every balancer with the same backends); the pick is remembered in a flow
/// table, so a flow stays on its backend when backends are added, removed, drained or
/// re-weighted. Only when its backend goes *down* (health checks) is a flow moved: its packets
/// would be lost anyway, and the new backend answers a TCP flow with a RST at once instead of the
/// client waiting for a timeout. A removed backend's flows keep going to its last known MAC until
/// they end.
///
/// What creates state (as Katran does): only a TCP SYN, or a UDP datagram. A TCP packet of a
/// flow the table does not know (the balancer restarted, or the flow was evicted) is forwarded by
/// the algorithm's pick for its 5-tuple without creating state: with Maglev that is the backend
/// its SYN went to as long as the backend set is the same, so established connections survive a
/// balancer restart, and a flood of stray ACKs cannot fill the table. A full table evicts its
/// least recently used flow (and releases that backend's connection count).
///
/// Fragments: the first fragment of a datagram carries the ports and goes with its 5-tuple's
/// flow; its backend is remembered under (addresses, protocol, IP identification) for
/// [`FRAGMENT_IDLE`], and the later fragments (no ports) follow it there, so a fragmented
/// datagram reaches the same backend as its flow's unfragmented ones. A later fragment that
/// overtakes its first is sent by the hash of addresses and protocol alone (the only stable key it
/// carries); that datagram may then be lost, as on a path that reorders fragments anyway.
pub struct DsrBalancer {
    cfg: DsrConfig,
    timers: DsrTimers,
    flows: FlowTable<FlowTarget>,
    /// Flows that saw a FIN or RST: no longer counted as active, kept a little for the last ACKs.
    closing: FlowTable<FlowTarget>,
    /// Where the first fragment of each recent fragmented datagram went.
    datagrams: FlowTable<FlowTarget, DatagramKey>,
    neighbors: Neighbors,
    seen_generation: u64,
    stats: DsrStats,
}

impl DsrBalancer {
    pub fn new(cfg: DsrConfig, timers: DsrTimers) -> Self {
        DsrBalancer {
            flows: FlowTable::new(timers.flow_idle, timers.max_flows),
            closing: FlowTable::new(timers.closing_idle, timers.max_flows),
            datagrams: FlowTable::new(
                FRAGMENT_IDLE,
                timers.max_flows.min(MAX_FRAGMENTED_DATAGRAMS),
            ),
            neighbors: Neighbors::new(timers.neighbor_retry, timers.neighbor_refresh),
            cfg,
            timers,
            seen_generation: 0,
            stats: DsrStats::default(),
        }
    }

    /// The interface's identity changed (it was re-created with another MAC or addresses): frames
    /// from now on are sent as the new one. Flows and learned MACs are kept.
    pub fn set_interface(&mut self, mac: Mac, ipv4: Option<Ipv4Addr>, ipv6: Option<Ipv6Addr>) {
        self.cfg.mac = mac;
        self.cfg.ipv4 = ipv4;
        self.cfg.ipv6 = ipv6;
    }

    pub fn config(&self) -> &DsrConfig {
        &self.cfg
    }

    pub fn timers(&self) -> &DsrTimers {
        &self.timers
    }

    pub fn stats(&self) -> DsrStats {
        self.stats
    }

    /// Flows currently tracked (active, closing).
    pub fn flow_count(&self) -> (usize, usize) {
        (self.flows.len(), self.closing.len())
    }

    /// The MAC learned for `ip`.
    pub fn neighbor(&self, ip: IpAddr) -> Option<Mac> {
        self.neighbors.mac(ip)
    }

    /// Brings the tracked backend addresses in line with the table (call after any change; cheap
    /// when nothing changed).
    pub fn sync_backends(&mut self, table: &BackendTable, now: Instant) {
        if table.generation() == self.seen_generation {
            return;
        }
        self.seen_generation = table.generation();
        let wanted: HashSet<IpAddr> = table.backends().iter().map(|b| b.addr.ip()).collect();
        let gone: Vec<IpAddr> = self
            .neighbors
            .tracked()
            .filter(|ip| !wanted.contains(ip))
            .collect();
        for ip in gone {
            self.neighbors.untrack(ip);
        }
        for ip in wanted {
            self.neighbors.track(ip, now);
        }
    }

    /// Handles one received frame. For [`Action::Forward`], `frame` has been rewritten in place.
    pub fn handle_frame(
        &mut self,
        frame: &mut [u8],
        table: &mut BackendTable,
        now: Instant,
    ) -> Action {
        match classify(frame, &self.cfg) {
            Frame::Answer(reply) => {
                self.stats.answered += 1;
                Action::Reply(reply)
            }
            Frame::Neighbor { ip, mac } => {
                if self.neighbors.handle_learned(ip, mac, now) {
                    self.stats.learned += 1;
                }
                Action::None
            }
            Frame::Ignore(why) => {
                self.stats.ignored += 1;
                if why == Ignored::Malformed {
                    self.stats.malformed += 1;
                }
                Action::None
            }
            Frame::ToVip(p) => match self.route(&p, table, now) {
                Ok(target) => {
                    set_macs(frame, target.mac, self.cfg.mac);
                    table.add_bytes(target.backend, p.ip_len as u64, 0);
                    self.stats.forwarded_packets += 1;
                    self.stats.forwarded_bytes += p.ip_len as u64;
                    Action::Forward {
                        backend: target.backend,
                    }
                }
                Err(why) => {
                    match why {
                        DropReason::NoBackend => self.stats.dropped_no_backend += 1,
                        DropReason::NoMac => self.stats.dropped_no_mac += 1,
                    }
                    Action::Drop(why)
                }
            },
        }
    }

    /// The backend (and MAC) for a packet: the flow's, or a new pick.
    fn route(
        &mut self,
        p: &VipPacket,
        table: &mut BackendTable,
        now: Instant,
    ) -> Result<FlowTarget, DropReason> {
        match p.fragment {
            Some(frag) if !frag.first => {
                let key = datagram_key(p, frag);
                match self.datagrams.get(&key, now) {
                    Some(target) => Ok(self.current_mac(target, table)),
                    // Overtook its first fragment: the 3-tuple hash is all there is.
                    None => self.pick(p.flow, table),
                }
            }
            Some(frag) => {
                let target = self.route_flow(p, table, now)?;
                self.datagrams.insert(datagram_key(p, frag), target, now);
                Ok(target)
            }
            None => self.route_flow(p, table, now),
        }
    }

    /// `target` with its backend's current MAC (it may have changed since: a NIC swap, a
    /// failed-over host).
    fn current_mac(&self, mut target: FlowTarget, table: &BackendTable) -> FlowTarget {
        if let Some(b) = table.get(target.backend) {
            if let Some(mac) = self.neighbors.mac(b.addr.ip()) {
                target.mac = mac;
            }
        }
        target
    }

    /// The backend of a packet with ports: its flow's, or a new pick (remembered only if the
    /// packet may start a flow).
    fn route_flow(
        &mut self,
        p: &VipPacket,
        table: &mut BackendTable,
        now: Instant,
    ) -> Result<FlowTarget, DropReason> {
        if let Some(route) = p.route {
            self.stats.braid_routed += 1;
            return self.pick_by(route_pick_key(route), table);
        }
        let key = p.flow;
        let known = match self.flows.get(&key, now) {
            Some(t) => Some((t, false)),
            None => self.closing.get(&key, now).map(|t| (t, true)),
        };
        if let Some((target, closing)) = known {
            match table.get(target.backend) {
                // Removed: let the flow finish on its old backend.
                None => return self.finish(key, target, closing, p, table, now),
                Some(b) if b.health.is_up() => {
                    let target = self.current_mac(target, table);
                    return self.finish(key, target, closing, p, table, now);
                }
                Some(_) => {
                    // Down: move the flow (below). It was a flow, so it stays one.
                    // Only an active entry holds a count (a closing one gave it back at its FIN).
                    if let Some(active) = self.flows.remove(&key) {
                        table.conn_closed(active.backend);
                    }
                    self.closing.remove(&key);
                    self.stats.flows_moved += 1;
                    let target = self.pick(key, table)?;
                    self.open_flow(key, target, table, now);
                    return self.finish(key, target, false, p, table, now);
                }
            }
        }
        let target = self.pick(key, table)?;
        if p.starts_flow {
            self.open_flow(key, target, table, now);
            return self.finish(key, target, false, p, table, now);
        }
        // A mid-connection packet of an unknown TCP flow: forwarded where the hash says, no state.
        self.stats.untracked += 1;
        Ok(target)
    }

    /// The algorithm's pick for `key` among backends whose MAC is known.
    fn pick(&mut self, key: FlowKey, table: &mut BackendTable) -> Result<FlowTarget, DropReason> {
        let pick = PickKey {
            flow_hash: key.hash(),
            client_hash: key.client_hash(),
        };
        self.pick_by(pick, table)
    }

    fn pick_by(
        &mut self,
        pick: PickKey,
        table: &mut BackendTable,
    ) -> Result<FlowTarget, DropReason> {
        let mut exclude: Vec<BackendId> = Vec::new();
        let mut any_backend = false;
        while let Some(id) = table.pick(pick, &exclude) {
            any_backend = true;
            let ip = table.get(id).map(|b| b.addr.ip());
            if let Some(mac) = ip.and_then(|ip| self.neighbors.mac(ip)) {
                return Ok(FlowTarget { backend: id, mac });
            }
            exclude.push(id);
        }
        Err(if any_backend {
            DropReason::NoMac
        } else {
            DropReason::NoBackend
        })
    }

    /// Remembers a new flow and counts it on its backend; a flow this pushes out of a full table
    /// (or that expired meanwhile) releases its backend's count.
    fn open_flow(
        &mut self,
        key: FlowKey,
        target: FlowTarget,
        table: &mut BackendTable,
        now: Instant,
    ) {
        table.conn_opened(target.backend);
        self.stats.new_flows += 1;
        // An entry idle past its timeout but not yet expired is replaced: release it first.
        if let Some(old) = self.flows.peek(&key) {
            table.conn_closed(old.backend);
        }
        let evicted_before = self.flows.evicted();
        for (_, gone) in self.flows.insert(key, target, now) {
            table.conn_closed(gone.backend);
        }
        self.stats.flows_evicted += self.flows.evicted() - evicted_before;
    }

    /// Moves a flow to the closing table on FIN/RST.
    fn finish(
        &mut self,
        key: FlowKey,
        target: FlowTarget,
        closing: bool,
        p: &VipPacket,
        table: &mut BackendTable,
        now: Instant,
    ) -> Result<FlowTarget, DropReason> {
        if p.fin_or_rst && !closing {
            self.flows.remove(&key);
            self.closing.insert(key, target, now);
            table.conn_closed(target.backend);
        }
        Ok(target)
    }

    /// Frames to send now: ARP requests / Neighbor Solicitations for backends whose MAC is
    /// unknown or due for a refresh. Also expires idle flows.
    pub fn poll_transmit(&mut self, table: &mut BackendTable, now: Instant) -> Vec<Vec<u8>> {
        self.sync_backends(table, now);
        for (_, target) in self.flows.expire(now) {
            table.conn_closed(target.backend);
        }
        self.closing.expire(now);
        self.datagrams.expire(now);
        self.neighbors
            .poll_requests(now)
            .into_iter()
            .filter_map(|ip| resolve_frame(&self.cfg, ip))
            .collect()
    }

    /// When [`DsrBalancer::poll_transmit`] next has work (neighbor requests; flow expiry is
    /// checked at least once a second by the caller anyway).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.neighbors.poll_timeout()
    }

    /// Frames that announce the VIP (gratuitous ARP or unsolicited NA): send at start-up.
    pub fn announce(&self) -> Vec<Vec<u8>> {
        gratuitous_arp_frame(&self.cfg)
            .into_iter()
            .chain(unsolicited_advertisement_frame(&self.cfg))
            .collect()
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
            steer: Steer::Flow,
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
        assert_eq!(p.flow.src, SocketAddr::from(([198, 18, 0, 1], 40000)));
        assert_eq!(p.flow.dst, SocketAddr::from(([198, 18, 0, 100], 80)));
        assert_eq!(
            (p.flow.src.port(), p.flow.dst.port(), p.flow.proto),
            (40000, 80, 6)
        );
        assert!(p.syn && !p.fin_or_rst && p.fragment.is_none());
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
            (p.flow.src.port(), p.flow.dst.port(), p.flow.proto),
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
    fn icmp_errors_about_our_replies_follow_their_flow() {
        let c = cfg4();
        // A router says "fragmentation needed" about a reply VIP:80 -> 198.18.0.1:40000.
        let quoted = {
            let b = etherparse::PacketBuilder::ipv4([198, 18, 0, 100], [198, 18, 0, 1], 64)
                .tcp(80, 40000, 1, 1000);
            let mut v = Vec::new();
            b.write(&mut v, &[0u8; 100]).unwrap();
            v
        };
        let mut icmp = vec![3, 4, 0, 0, 0, 0, 0x05, 0xdc];
        icmp.extend_from_slice(&quoted[..28]);
        let b = || {
            etherparse::PacketBuilder::ethernet2(CLIENT, LB).ipv4(
                [198, 18, 0, 254],
                [198, 18, 0, 100],
                64,
            )
        };
        let mut f = Vec::new();
        b().write(&mut f, etherparse::IpNumber(1), &icmp).unwrap();
        let Frame::ToVip(p) = classify(&f, &c) else {
            panic!("ICMP error not forwarded")
        };
        assert_eq!(p.flow.src, SocketAddr::from(([198, 18, 0, 1], 40000)));
        assert_eq!(p.flow.dst, SocketAddr::from(([198, 18, 0, 100], 80)));
        assert_eq!(p.flow.proto, 6);
        // The same flow key as the client's own packets: same backend.
        let client = tcp4(LB, [198, 18, 0, 1], [198, 18, 0, 100], 40000, 80, false);
        let Frame::ToVip(q) = classify(&client, &c) else {
            panic!()
        };
        assert_eq!(p.flow, q.flow);
        // An echo request to the VIP, or an error about another service, is not forwarded.
        let mut echo = Vec::new();
        b().write(
            &mut echo,
            etherparse::IpNumber(1),
            &[8, 0, 0, 0, 0, 1, 0, 1],
        )
        .unwrap();
        assert_eq!(classify(&echo, &c), Frame::Ignore(Ignored::OtherService));
        let mut other = f.clone();
        let at = f.len() - 28 + 20; // quoted source port
        other[at..at + 2].copy_from_slice(&443u16.to_be_bytes());
        assert_eq!(classify(&other, &c), Frame::Ignore(Ignored::OtherService));
    }

    /// A UDP datagram of `len` payload bytes from `198.18.0.1:sport` to the VIP, as a first
    /// fragment (`offset` 0, more fragments) or a later one (`offset` in 8-byte units, no ports),
    /// with IP identification `id`.
    fn udp4_fragment(sport: u16, id: u16, offset: u16) -> Vec<u8> {
        let b = etherparse::PacketBuilder::ethernet2(CLIENT, LB)
            .ipv4([198, 18, 0, 1], [198, 18, 0, 100], 64)
            .udp(sport, 53);
        let mut f = Vec::new();
        b.write(&mut f, &[0u8; 100]).unwrap();
        f[14 + 4..14 + 6].copy_from_slice(&id.to_be_bytes());
        // etherparse checks lengths, not the header checksum: flags and offset can be set here.
        let flags_offset = if offset == 0 { 0x2000 } else { offset };
        f[14 + 6..14 + 8].copy_from_slice(&flags_offset.to_be_bytes());
        if offset != 0 {
            // A later fragment: what follows the IP header is payload, not a UDP header.
            f[14 + 20..14 + 28].copy_from_slice(&[0xee; 8]);
        }
        f
    }

    #[test]
    fn first_fragment_has_its_ports_later_ones_the_ip_id() {
        let c = DsrConfig {
            port: 53,
            transport: Transport::Udp,
            ..cfg4()
        };
        let f = udp4_fragment(4000, 0x1234, 0);
        let Frame::ToVip(p) = classify(&f, &c) else {
            panic!()
        };
        assert_eq!(
            p.fragment,
            Some(Fragment {
                id: 0x1234,
                first: true
            })
        );
        assert_eq!((p.flow.src.port(), p.flow.dst.port()), (4000, 53));
        assert!(p.starts_flow);
        // A later fragment (offset 8 bytes) with no UDP header at all: no ports, same id.
        let f = udp4_fragment(4000, 0x1234, 1);
        let Frame::ToVip(q) = classify(&f, &c) else {
            panic!()
        };
        assert_eq!(
            q.fragment,
            Some(Fragment {
                id: 0x1234,
                first: false
            })
        );
        assert_eq!((q.flow.src.port(), q.flow.dst.port()), (0, 0));
        assert!(!q.starts_flow);
        // A first fragment for another port is not the service's.
        let other = DsrConfig { port: 54, ..c };
        assert_eq!(
            classify(&udp4_fragment(4000, 1, 0), &other),
            Frame::Ignore(Ignored::OtherService)
        );
    }

    #[test]
    fn a_stripped_vlan_tag_is_put_back_in_front_of_the_ethertype() {
        let f = tcp4(LB, [198, 18, 0, 1], [198, 18, 0, 100], 40000, 80, true);
        let mut buf = f.clone();
        buf.resize(f.len() + 4, 0xaa);
        let tag = VlanTag {
            tpid: VlanTag::TPID_8021Q,
            tci: (5 << 13) | 100,
        };
        assert_eq!(insert_vlan_tag(&mut buf, f.len(), tag), Some(f.len() + 4));
        assert_eq!(&buf[..12], &f[..12], "MACs stay");
        assert_eq!(&buf[12..16], &[0x81, 0x00, 0xa0, 100]);
        assert_eq!(&buf[16..], &f[12..], "EtherType and packet follow the tag");
        assert_eq!(tag.vlan_id(), 100);
        // What etherparse reads back: VLAN 100, then the same IPv4 packet.
        let parsed = etherparse::SlicedPacket::from_ethernet(&buf).unwrap();
        let Some(etherparse::VlanSlice::SingleVlan(v)) = parsed.vlan else {
            panic!("no VLAN: {:?}", parsed.vlan)
        };
        assert_eq!(v.vlan_identifier().value(), 100);
        // No room, or no Ethernet header: untouched.
        let mut tight = f.clone();
        assert_eq!(insert_vlan_tag(&mut tight, f.len(), tag), None);
        assert_eq!(tight, f);
        assert_eq!(insert_vlan_tag(&mut [0u8; 20], 10, tag), None);
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

    mod balancer {
        use super::*;
        use crate::algo::Algorithm;
        use crate::health::HealthParams;

        fn backend_ip(i: u8) -> Ipv4Addr {
            Ipv4Addr::new(198, 18, 0, 10 + i)
        }
        fn backend_mac(i: u8) -> Mac {
            [0x02, 0, 0, 0, 0xbb, i]
        }
        fn table(n: u8) -> BackendTable {
            let mut t =
                BackendTable::new(Algorithm::Maglev, 65537, HealthParams { fall: 2, rise: 2 })
                    .unwrap();
            for i in 1..=n {
                t.add(SocketAddr::new(IpAddr::V4(backend_ip(i)), 80), 1)
                    .unwrap();
            }
            t
        }
        fn arp_reply(i: u8) -> Vec<u8> {
            arp_frame(
                2,
                backend_mac(i),
                backend_ip(i),
                LB,
                LB,
                Ipv4Addr::new(198, 18, 0, 2),
            )
        }
        fn which(f: &[u8]) -> u8 {
            assert_eq!(&f[6..12], &LB);
            f[5]
        }
        /// Sends a packet of flow `port` and returns the backend number it went to.
        fn send(
            lb: &mut DsrBalancer,
            t: &mut BackendTable,
            port: u16,
            syn: bool,
            now: Instant,
        ) -> Result<u8, Action> {
            let mut f = tcp4(LB, [198, 18, 0, 1], [198, 18, 0, 100], port, 80, syn);
            match lb.handle_frame(&mut f, t, now) {
                Action::Forward { .. } => Ok(which(&f)),
                other => Err(other),
            }
        }

        fn ready(n: u8) -> (DsrBalancer, BackendTable, Instant) {
            let now = Instant::now();
            let mut t = table(n);
            let mut lb = DsrBalancer::new(cfg4(), DsrTimers::default());
            let reqs = lb.poll_transmit(&mut t, now);
            assert_eq!(reqs.len(), usize::from(n), "one ARP request per backend");
            for i in 1..=n {
                let mut r = arp_reply(i);
                assert_eq!(lb.handle_frame(&mut r, &mut t, now), Action::None);
            }
            assert_eq!(lb.stats().learned, u64::from(n));
            (lb, t, now)
        }

        #[test]
        fn no_mac_no_forwarding_then_arp_requests_resolve_backends() {
            let now = Instant::now();
            let mut t = table(3);
            let mut lb = DsrBalancer::new(cfg4(), DsrTimers::default());
            assert_eq!(
                send(&mut lb, &mut t, 1000, true, now),
                Err(Action::Drop(DropReason::NoMac))
            );
            let reqs = lb.poll_transmit(&mut t, now);
            let mut asked: Vec<[u8; 4]> =
                reqs.iter().map(|r| r[38..42].try_into().unwrap()).collect();
            asked.sort();
            assert_eq!(
                asked,
                vec![[198, 18, 0, 11], [198, 18, 0, 12], [198, 18, 0, 13]]
            );
            // Only backend 2 answers: every flow goes there.
            lb.handle_frame(&mut arp_reply(2), &mut t, now);
            for port in 0..50 {
                assert_eq!(send(&mut lb, &mut t, 2000 + port, true, now), Ok(2));
            }
            let empty = &mut table(0);
            let mut lb2 = DsrBalancer::new(cfg4(), DsrTimers::default());
            assert_eq!(
                send(&mut lb2, empty, 1, true, now),
                Err(Action::Drop(DropReason::NoBackend))
            );
        }

        #[test]
        fn flows_spread_and_stay_when_a_backend_is_added() {
            let (mut lb, mut t, now) = ready(3);
            let mut first = HashMap::new();
            let mut counts = [0u32; 4];
            for port in 0..600u16 {
                let b = send(&mut lb, &mut t, 10000 + port, true, now).unwrap();
                counts[usize::from(b)] += 1;
                first.insert(port, b);
            }
            assert!(counts[1..].iter().all(|&c| c > 150), "{counts:?}");
            assert_eq!(t.backends().iter().map(|b| b.active).sum::<u64>(), 600);
            // Two balancers with the same backends pick the same backend for a new flow.
            let (mut other, mut t2, _) = ready(3);
            for port in 0..600u16 {
                assert_eq!(
                    send(&mut other, &mut t2, 10000 + port, true, now),
                    Ok(first[&port])
                );
            }
            // A 4th backend: Maglev would move ~1/4 of the flows; the flow table keeps them all.
            t.add(SocketAddr::new(IpAddr::V4(backend_ip(4)), 80), 1)
                .unwrap();
            lb.poll_transmit(&mut t, now);
            lb.handle_frame(&mut arp_reply(4), &mut t, now);
            for port in 0..600u16 {
                assert_eq!(
                    send(&mut lb, &mut t, 10000 + port, false, now),
                    Ok(first[&port])
                );
            }
            // New flows do reach it.
            let new_on_4 = (0..400u16)
                .filter(|p| send(&mut lb, &mut t, 20000 + p, true, now) == Ok(4))
                .count();
            assert!(new_on_4 > 50, "{new_on_4}");
        }

        #[test]
        fn a_dead_backend_loses_its_flows_and_comes_back() {
            let (mut lb, mut t, now) = ready(3);
            let mut first = HashMap::new();
            for port in 0..300u16 {
                first.insert(
                    port,
                    send(&mut lb, &mut t, 10000 + port, true, now).unwrap(),
                );
            }
            let dead = t
                .find(SocketAddr::new(IpAddr::V4(backend_ip(2)), 80))
                .unwrap();
            for k in 0..2 {
                t.handle_check(
                    dead,
                    now + Duration::from_millis(k),
                    false,
                    None,
                    "connect: refused",
                );
            }
            assert!(!t.get(dead).unwrap().health.is_up());
            for port in 0..300u16 {
                let b = send(&mut lb, &mut t, 10000 + port, false, now).unwrap();
                if first[&port] == 2 {
                    assert_ne!(b, 2, "flow {port} still sent to the dead backend");
                } else {
                    assert_eq!(b, first[&port], "flow {port} of a live backend moved");
                }
            }
            assert!(lb.stats().flows_moved > 50);
            assert_eq!(t.get(dead).unwrap().active, 0);
            // Back up after `rise` good checks: new flows reach it again.
            for k in 0..2 {
                t.handle_check(dead, now + Duration::from_millis(10 + k), true, None, "ok");
            }
            let back = (0..300u16)
                .filter(|p| send(&mut lb, &mut t, 30000 + p, true, now) == Ok(2))
                .count();
            assert!(back > 50, "{back}");
        }

        #[test]
        fn removed_backend_flows_finish_drained_ones_too() {
            let (mut lb, mut t, now) = ready(3);
            let mut first = HashMap::new();
            for port in 0..300u16 {
                first.insert(
                    port,
                    send(&mut lb, &mut t, 10000 + port, true, now).unwrap(),
                );
            }
            t.drain(SocketAddr::new(IpAddr::V4(backend_ip(1)), 80))
                .unwrap();
            t.remove(SocketAddr::new(IpAddr::V4(backend_ip(3)), 80))
                .unwrap();
            lb.poll_transmit(&mut t, now);
            for port in 0..300u16 {
                assert_eq!(
                    send(&mut lb, &mut t, 10000 + port, false, now),
                    Ok(first[&port])
                );
            }
            for port in 0..200u16 {
                assert_eq!(send(&mut lb, &mut t, 40000 + port, true, now), Ok(2));
            }
        }

        #[test]
        fn fin_closes_and_idle_flows_expire() {
            let (mut lb, mut t, now) = ready(1);
            send(&mut lb, &mut t, 5000, true, now).unwrap();
            send(&mut lb, &mut t, 5001, true, now).unwrap();
            assert_eq!(t.backends()[0].active, 2);
            let mut fin = tcp4(LB, [198, 18, 0, 1], [198, 18, 0, 100], 5000, 80, false);
            fin[14 + 20 + 13] |= 0x01;
            assert!(matches!(
                lb.handle_frame(&mut fin, &mut t, now),
                Action::Forward { .. }
            ));
            assert_eq!(t.backends()[0].active, 1);
            assert_eq!(lb.flow_count(), (1, 1));
            // The last ACK after the FIN still goes to the same backend.
            assert_eq!(send(&mut lb, &mut t, 5000, false, now), Ok(1));
            let later = now + Duration::from_secs(301);
            lb.poll_transmit(&mut t, later);
            assert_eq!(lb.flow_count(), (0, 0));
            assert_eq!(t.backends()[0].active, 0);
            assert_eq!(t.backends()[0].total, 2);
            assert!(t.backends()[0].bytes_in > 0);
        }

        /// A balancer with `n` resolved backends, a UDP service on port 53, and `timers`.
        fn ready_udp(n: u8, timers: DsrTimers) -> (DsrBalancer, BackendTable, Instant) {
            let now = Instant::now();
            let mut t = table(n);
            let c = DsrConfig {
                port: 53,
                transport: Transport::Udp,
                ..cfg4()
            };
            let mut lb = DsrBalancer::new(c, timers);
            lb.poll_transmit(&mut t, now);
            for i in 1..=n {
                lb.handle_frame(&mut arp_reply(i), &mut t, now);
            }
            (lb, t, now)
        }

        fn forward(lb: &mut DsrBalancer, t: &mut BackendTable, mut f: Vec<u8>, now: Instant) -> u8 {
            match lb.handle_frame(&mut f, t, now) {
                Action::Forward { .. } => which(&f),
                other => panic!("not forwarded: {other:?}"),
            }
        }

        fn active_sum(t: &BackendTable) -> u64 {
            t.backends().iter().map(|b| b.active).sum()
        }

        /// A braid datagram from `src:sport` to the VIP, port 5050: a DATA packet, or (`hello`)
        /// a HELLO, for route id `route`.
        fn braid4(src: [u8; 4], sport: u16, route: u16, hello: bool) -> Vec<u8> {
            use braid_core::wire::{route_session, Header, PacketType};
            let mut payload = vec![0u8; 60];
            let sid = route_session(route, if hello { 0 } else { 0x5a5a });
            let ptype = if hello {
                PacketType::Hello
            } else {
                PacketType::Data
            };
            Header {
                ptype,
                link: 1,
                session: sid,
                counter: 0,
            }
            .emit(&mut payload);
            let b = etherparse::PacketBuilder::ethernet2(CLIENT, LB)
                .ipv4(src, [198, 18, 0, 100], 64)
                .udp(sport, 5050);
            let mut v = Vec::new();
            b.write(&mut v, &payload).unwrap();
            v
        }

        fn ready_braid(n: u8) -> (DsrBalancer, BackendTable, Instant) {
            let now = Instant::now();
            let mut t = table(n);
            let c = DsrConfig {
                port: 5050,
                transport: Transport::Udp,
                steer: Steer::BraidRoute,
                ..cfg4()
            };
            let mut lb = DsrBalancer::new(c, DsrTimers::default());
            lb.poll_transmit(&mut t, now);
            for i in 1..=n {
                lb.handle_frame(&mut arp_reply(i), &mut t, now);
            }
            (lb, t, now)
        }

        /// issue 14 item 6: every link of a braid client (each from its own source address and
        /// port), its HELLO and its DATA, reaches one concentrator, chosen by the route id with
        /// Maglev: the same on every balancer instance, and a concentrator added moves only the
        /// clients Maglev gives to it.
        #[test]
        fn braid_links_of_one_client_reach_one_concentrator_chosen_by_maglev() {
            let (mut lb, mut t, now) = ready_braid(2);
            let (mut other, mut t_other, _) = ready_braid(2);
            let links = |route: u16| {
                (0..3u8).flat_map(move |l| {
                    [true, false].map(|hello| {
                        braid4([198, 18, 1 + l, 7], 40000 + u16::from(l), route, hello)
                    })
                })
            };
            let mut home = HashMap::new();
            let mut counts = [0u32; 4];
            for route in 0..300u16 {
                let at: Vec<u8> = links(route)
                    .map(|f| forward(&mut lb, &mut t, f, now))
                    .collect();
                assert!(at.iter().all(|&b| b == at[0]), "route {route}: {at:?}");
                let elsewhere = forward(
                    &mut other,
                    &mut t_other,
                    braid4([198, 18, 9, 9], 1, route, false),
                    now,
                );
                assert_eq!(elsewhere, at[0], "another balancer agrees on route {route}");
                counts[usize::from(at[0])] += 1;
                home.insert(route, at[0]);
            }
            assert!(counts[1] > 100 && counts[2] > 100, "{counts:?}");
            assert_eq!(lb.stats().braid_routed, 300 * 6);
            assert_eq!(lb.flow_count(), (0, 0), "no flow state");
            assert_eq!(active_sum(&t), 0);
            // A third concentrator: about a third of the clients move, all of them to it.
            t.add(SocketAddr::new(IpAddr::V4(backend_ip(3)), 80), 1)
                .unwrap();
            lb.poll_transmit(&mut t, now);
            lb.handle_frame(&mut arp_reply(3), &mut t, now);
            let mut moved = 0;
            for route in 0..300u16 {
                let at: Vec<u8> = links(route)
                    .map(|f| forward(&mut lb, &mut t, f, now))
                    .collect();
                assert!(at.iter().all(|&b| b == at[0]), "route {route}: {at:?}");
                if at[0] != home[&route] {
                    assert_eq!(at[0], 3, "route {route} moved between old concentrators");
                    moved += 1;
                }
            }
            assert!((70..=130).contains(&moved), "{moved} of 300 moved");
        }

        /// Without `steer = "braid"`, or for datagrams that are not braid's, the flow decides.
        #[test]
        fn route_ids_are_read_only_when_steering_by_them() {
            let f = braid4([198, 18, 1, 7], 40000, 77, false);
            let flow_cfg = DsrConfig {
                port: 5050,
                transport: Transport::Udp,
                ..cfg4()
            };
            let braid_cfg = DsrConfig {
                steer: Steer::BraidRoute,
                ..flow_cfg.clone()
            };
            let route = |f: &[u8], c: &DsrConfig| match classify(f, c) {
                Frame::ToVip(p) => p.route,
                other => panic!("{other:?}"),
            };
            assert_eq!(route(&f, &flow_cfg), None);
            assert_eq!(route(&f, &braid_cfg), Some(77));
            let mut not_braid = f.clone();
            not_braid[42] = 9; // version byte of the payload
            assert_eq!(route(&not_braid, &braid_cfg), None);
            let (mut lb, mut t, now) = ready_braid(2);
            forward(&mut lb, &mut t, not_braid, now);
            assert_eq!(lb.flow_count().0, 1, "a non-braid datagram is a flow");
        }

        #[test]
        fn mid_connection_packets_of_unknown_flows_go_by_hash_without_state() {
            // Balancer A sees the SYNs; balancer B (A restarted) sees only the rest of each
            // connection: every packet reaches the backend its SYN went to, and B keeps no state.
            let (mut a, mut ta, now) = ready(3);
            let (mut b, mut tb, _) = ready(3);
            for port in 0..300u16 {
                let first = send(&mut a, &mut ta, 10000 + port, true, now).unwrap();
                assert_eq!(send(&mut b, &mut tb, 10000 + port, false, now), Ok(first));
            }
            assert_eq!(b.flow_count(), (0, 0), "stray ACKs created flows");
            assert_eq!(active_sum(&tb), 0);
            assert_eq!(b.stats().new_flows, 0);
            assert_eq!(b.stats().untracked, 300);
            // A SYN still creates a flow; its later packets are then tracked.
            send(&mut b, &mut tb, 50000, true, now).unwrap();
            send(&mut b, &mut tb, 50000, false, now).unwrap();
            assert_eq!(b.flow_count(), (1, 0));
            assert_eq!(b.stats().untracked, 300);
            // A FIN of an unknown flow is forwarded and creates nothing either.
            let mut fin = tcp4(LB, [198, 18, 0, 1], [198, 18, 0, 100], 60000, 80, false);
            fin[14 + 20 + 13] |= 0x01;
            assert!(matches!(
                b.handle_frame(&mut fin, &mut tb, now),
                Action::Forward { .. }
            ));
            assert_eq!(b.flow_count(), (1, 0));
        }

        #[test]
        fn a_full_table_evicts_the_least_recently_used_flow_and_releases_it() {
            let timers = DsrTimers {
                max_flows: 4,
                ..DsrTimers::default()
            };
            let now = Instant::now();
            let mut t = table(2);
            let mut lb = DsrBalancer::new(cfg4(), timers);
            lb.poll_transmit(&mut t, now);
            for i in 1..=2 {
                lb.handle_frame(&mut arp_reply(i), &mut t, now);
            }
            let ms = |k: u64| now + Duration::from_millis(k);
            for (k, port) in (1000..1004u16).enumerate() {
                send(&mut lb, &mut t, port, true, ms(k as u64)).unwrap();
            }
            assert_eq!(active_sum(&t), 4);
            // Flow 1000 is the oldest but stays in use; 1001 is then the least recently used.
            send(&mut lb, &mut t, 1000, false, ms(10)).unwrap();
            send(&mut lb, &mut t, 2000, true, ms(11)).unwrap();
            assert_eq!(lb.flow_count(), (4, 0));
            assert_eq!(
                active_sum(&t),
                4,
                "the evicted flow kept its backend's count"
            );
            assert_eq!(lb.stats().flows_evicted, 1);
            let untracked = lb.stats().untracked;
            send(&mut lb, &mut t, 1000, false, ms(12)).unwrap();
            assert_eq!(
                lb.stats().untracked,
                untracked,
                "the flow in use was evicted"
            );
            send(&mut lb, &mut t, 1001, false, ms(13)).unwrap();
            assert_eq!(lb.stats().untracked, untracked + 1, "1001 should be gone");
            // A SYN sweep through the full table never lets the counts drift.
            for port in 3000..3200u16 {
                send(&mut lb, &mut t, port, true, ms(20 + u64::from(port))).unwrap();
                assert_eq!(active_sum(&t), lb.flow_count().0 as u64);
            }
            assert_eq!(lb.stats().flows_evicted, 201);
            // Idle expiry releases the rest.
            lb.poll_transmit(&mut t, now + Duration::from_secs(400));
            assert_eq!((lb.flow_count(), active_sum(&t)), ((0, 0), 0));
        }

        #[test]
        fn fragments_of_a_udp_datagram_follow_its_flow() {
            let (mut lb, mut t, now) = ready_udp(3, DsrTimers::default());
            let mut spread = HashSet::new();
            for (i, sport) in (4000..4100u16).enumerate() {
                // An unfragmented datagram of the flow, then a fragmented one (first fragment,
                // then a later one without ports), then a later fragment that overtook its first.
                let whole = {
                    let mut f = udp4_fragment(sport, 0, 0);
                    f[14 + 6] = 0; // no "more fragments": a whole datagram
                    forward(&mut lb, &mut t, f, now)
                };
                spread.insert(whole);
                let id = 100 + i as u16;
                assert_eq!(
                    forward(&mut lb, &mut t, udp4_fragment(sport, id, 0), now),
                    whole
                );
                assert_eq!(
                    forward(&mut lb, &mut t, udp4_fragment(sport, id, 1), now),
                    whole
                );
                assert_eq!(
                    forward(&mut lb, &mut t, udp4_fragment(sport, id, 13), now),
                    whole
                );
            }
            assert_eq!(
                spread.len(),
                3,
                "flows did not spread: the test proves nothing"
            );
            assert_eq!(lb.flow_count(), (100, 0), "UDP datagrams create flows");
            // The datagrams are forgotten after FRAGMENT_IDLE; their flows stay.
            lb.poll_transmit(&mut t, now + FRAGMENT_IDLE + Duration::from_secs(1));
            assert_eq!(lb.datagrams.len(), 0);
            assert_eq!(lb.flow_count(), (100, 0));
        }

        #[test]
        fn arp_for_the_vip_is_answered_and_counted() {
            let (mut lb, mut t, now) = ready(1);
            let mut req = arp_frame(
                1,
                CLIENT,
                Ipv4Addr::new(198, 18, 0, 1),
                BROADCAST,
                [0; 6],
                Ipv4Addr::new(198, 18, 0, 100),
            );
            assert!(matches!(
                lb.handle_frame(&mut req, &mut t, now),
                Action::Reply(_)
            ));
            assert_eq!(lb.stats().answered, 1);
            let ann = lb.announce();
            assert_eq!(ann.len(), 1);
            assert_eq!(&ann[0][28..32], &[198, 18, 0, 100]);
            assert_eq!(&ann[0][38..42], &[198, 18, 0, 100]);
        }
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

        /// ICMP errors quoting a reply, mutated and cut anywhere, through the whole data path.
        #[test]
        fn mutated_icmp_errors_through_the_balancer_never_panic(idx in 0usize..120, val in any::<u8>(), cut in 0usize..120, v6 in any::<bool>()) {
            let now = Instant::now();
            let mut f = if v6 {
                let vip6: Ipv6Addr = "2001:db8::100".parse().unwrap();
                let client: Ipv6Addr = "2001:db8::1".parse().unwrap();
                let quoted = etherparse::PacketBuilder::ipv6(vip6.octets(), client.octets(), 64).tcp(80, 40000, 1, 1000);
                let mut q = Vec::new();
                quoted.write(&mut q, &[0u8; 20]).unwrap();
                let mut icmp = vec![2, 0, 0, 0, 0, 0, 0x05, 0x00];
                icmp.extend_from_slice(&q);
                let b = etherparse::PacketBuilder::ethernet2(CLIENT, LB).ipv6(client.octets(), vip6.octets(), 64);
                let mut v = Vec::new();
                b.write(&mut v, etherparse::IpNumber(58), &icmp).unwrap();
                v
            } else {
                let quoted = etherparse::PacketBuilder::ipv4([198, 18, 0, 100], [198, 18, 0, 1], 64).tcp(80, 40000, 1, 1000);
                let mut q = Vec::new();
                quoted.write(&mut q, &[0u8; 20]).unwrap();
                let mut icmp = vec![3, 4, 0, 0, 0, 0, 0x05, 0xdc];
                icmp.extend_from_slice(&q[..28]);
                let b = etherparse::PacketBuilder::ethernet2(CLIENT, LB).ipv4([198, 18, 0, 254], [198, 18, 0, 100], 64);
                let mut v = Vec::new();
                b.write(&mut v, etherparse::IpNumber(1), &icmp).unwrap();
                v
            };
            if idx < f.len() { f[idx] = val; }
            f.truncate(cut.max(1));
            let cfg = if v6 { cfg6() } else { cfg4() };
            let mut t = BackendTable::new(crate::algo::Algorithm::Maglev, 251, crate::health::HealthParams::default()).unwrap();
            t.add(SocketAddr::from(([198, 18, 0, 11], 80)), 1).unwrap();
            let mut lb = DsrBalancer::new(cfg, DsrTimers::default());
            lb.sync_backends(&t, now);
            let mut arp = arp_frame(2, BACKEND, Ipv4Addr::new(198, 18, 0, 11), LB, LB, Ipv4Addr::new(198, 18, 0, 2));
            lb.handle_frame(&mut arp, &mut t, now);
            let _ = lb.handle_frame(&mut f, &mut t, now);
        }
    }
}
