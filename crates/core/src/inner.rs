//! What the endpoint needs to know of the IP packets it carries (the "inner" packets), read
//! through bounds-checked views: never a panic on a short or odd packet.

/// IP protocol number of TCP.
const TCP: u8 = 6;
/// TCP flags.
const SYN: u8 = 0x02;
const FIN: u8 = 0x01;
const RST: u8 = 0x04;
const ACK: u8 = 0x10;
/// TCP option kinds: end of the list, padding, maximum segment size.
const OPT_END: u8 = 0;
const OPT_NOP: u8 = 1;
const OPT_MSS: u8 = 2;

/// The transport of an IP packet: protocol number and the bytes after the IP header(s), when the
/// packet is the first (or only) fragment. IPv4 or IPv6 without extension headers: an IPv6
/// packet with any is treated as "other".
fn transport(packet: &[u8]) -> Option<(u8, &[u8])> {
    let (proto, at, end) = transport_span(packet)?;
    Some((proto, packet.get(at..end)?))
}

/// [`transport`]'s protocol number, and where its bytes start and end in the packet (within
/// it; the end before any padding past the IP length).
pub(crate) fn transport_span(packet: &[u8]) -> Option<(u8, usize, usize)> {
    match packet.first()? >> 4 {
        4 => {
            let ihl = usize::from(packet.first()? & 0x0f) * 4;
            let frag = u16::from_be_bytes([*packet.get(6)?, *packet.get(7)?]) & 0x1fff;
            let total = usize::from(u16::from_be_bytes([*packet.get(2)?, *packet.get(3)?]));
            if ihl < 20 || frag != 0 || total < ihl || total > packet.len() {
                return None;
            }
            Some((*packet.get(9)?, ihl, total))
        }
        6 => {
            let payload = usize::from(u16::from_be_bytes([*packet.get(4)?, *packet.get(5)?]));
            let end = 40 + payload;
            (end <= packet.len()).then_some((*packet.get(6)?, 40, end))
        }
        _ => None,
    }
}

/// What delay equalisation needs to know of a TCP segment ([`tcp_kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpKind {
    /// Nothing but an acknowledgement ([`is_pure_tcp_ack`]).
    PureAck,
    /// A connection's first segment ([`is_tcp_syn`]).
    Syn,
    /// Any other segment.
    Other,
}

/// The kind of TCP segment the packet is; `None` if it is not TCP (first fragment, IPv4 or
/// IPv6 without extension headers). One read of the header for the receive path's every packet.
pub fn tcp_kind(packet: &[u8]) -> Option<TcpKind> {
    let Some((TCP, seg)) = transport(packet) else {
        return None;
    };
    let (Some(&off), Some(&flags)) = (seg.get(12), seg.get(13)) else {
        return Some(TcpKind::Other);
    };
    let data_offset = usize::from(off >> 4) * 4;
    Some(
        if data_offset >= 20 && seg.len() == data_offset && flags & (SYN | FIN | RST) == 0 {
            TcpKind::PureAck
        } else if flags & (SYN | ACK | FIN | RST) == SYN
            && seg.get(20..data_offset).is_some_and(has_mss)
        {
            TcpKind::Syn
        } else {
            TcpKind::Other
        },
    )
}

/// A TCP segment that carries nothing but an acknowledgement: no payload, no SYN, FIN or RST.
///
/// Delay equalisation lets these through at once: an acknowledgement is what the sender's clock
/// runs on, and it is never itself timed by the peer (no RTT sample measures its trip alone).
/// Every other TCP segment, the handshake included, is equalised: a SYN or SYN-ACK that beat the
/// data's path would hand the TCP sender a minimum RTT that its data never sees, and BBR sizes
/// its window from that minimum (and CUBIC's HyStart leaves slow start on the difference).
pub fn is_pure_tcp_ack(packet: &[u8]) -> bool {
    tcp_kind(packet) == Some(TcpKind::PureAck)
}

/// A connection's first segment: SYN without ACK (nor FIN or RST), announcing its maximum
/// segment size (every TCP stack's SYN does; the option is only allowed in a SYN). Delay
/// equalisation holds it only by what the receiver's hold exceeds the sender's
/// (`endpoint::Equalize::Opening`): the SYN and the SYN-ACK are timed together by the client, so
/// one hold in the pair gives it the round trip its data will see, as the SYN-ACK with the pure
/// ACK after it gives the server; holding both made every connection's set-up wait two holds.
pub fn is_tcp_syn(packet: &[u8]) -> bool {
    tcp_kind(packet) == Some(TcpKind::Syn)
}

/// Whether TCP options announce a maximum segment size (a well-formed MSS option before any
/// malformed one or the end of the list).
fn has_mss(options: &[u8]) -> bool {
    tcp_options(options)
        .map_while(Result::ok)
        .find(|&(kind, _)| kind == OPT_MSS)
        .is_some_and(|(_, data)| data.len() == 2)
}

/// The options of a TCP header in order, each `Ok((kind, its data))`, up to the end of the list;
/// a malformed one gives `Err(())` and ends it.
pub(crate) fn tcp_options(mut options: &[u8]) -> impl Iterator<Item = Result<(u8, &[u8]), ()>> {
    std::iter::from_fn(move || loop {
        let (&kind, rest) = options.split_first()?;
        match kind {
            OPT_END => return None,
            OPT_NOP => options = rest,
            _ => {
                let len = rest.first().map_or(0, |&l| usize::from(l));
                if len < 2 || len > options.len() {
                    options = &[];
                    return Some(Err(()));
                }
                let data = &options[2..len];
                options = &options[len..];
                return Some(Ok((kind, data)));
            }
        }
    })
}

/// Whether the packet is TCP (first fragment, IPv4 or IPv6 without extension headers).
pub fn is_tcp(packet: &[u8]) -> bool {
    tcp_kind(packet).is_some()
}

/// The 16-bit one's-complement sum (RFC 1071) of `data` added to `sum`: not folded, not
/// inverted, so sums of several pieces (a pseudo-header and a segment) add up. Sixteen bytes per
/// step as four 32-bit big-endian words (2^16 = 1 modulo 2^16 - 1, so a word's two halves need
/// not be split: [`fold16`] gives the same result), in two sums the CPU adds side by side; an
/// odd last byte counts as its high half.
pub fn sum16(data: &[u8], sum: u64) -> u64 {
    let halves = |w: u64| (w >> 32) + (w & 0xffff_ffff);
    let (mut a, mut b) = (sum, 0u64);
    let mut chunks = data.chunks_exact(16);
    for c in &mut chunks {
        a += halves(u64::from_be_bytes(c[..8].try_into().expect("8 bytes")));
        b += halves(u64::from_be_bytes(c[8..].try_into().expect("8 bytes")));
    }
    let mut rest = chunks.remainder().chunks_exact(2);
    for c in &mut rest {
        a += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = rest.remainder() {
        a += u64::from(*last) << 8;
    }
    a + b
}

/// The [`sum16`] of the pseudo-header of a transport segment of `len` bytes and protocol `proto`
/// carried in the IP packet (or header) `ip`: the addresses, the protocol and the length.
pub fn pseudo_sum(ip: &[u8], v6: bool, proto: u8, len: usize) -> u64 {
    let addrs = if v6 { &ip[8..40] } else { &ip[12..20] };
    sum16(addrs, u64::from(proto) + len as u64)
}

/// Folds a [`sum16`] into 16 bits (still not inverted).
pub fn fold16(mut sum: u64) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// The checksum of an IPv4 header: 0 for a correct header, the value to write for a header whose
/// checksum field is zero.
pub fn ipv4_checksum(header: &[u8]) -> u16 {
    !fold16(sum16(header, 0))
}

/// The packet's ECN field (RFC 3168: 0 not ECN-capable, 1 or 2 ECN-capable, 3 Congestion
/// Experienced), IPv4 or IPv6; `None` for anything else.
pub fn ecn(packet: &[u8]) -> Option<u8> {
    match packet.first()? >> 4 {
        4 if packet.len() >= 20 => Some(packet[1] & 0x03),
        6 if packet.len() >= 40 => Some((packet[1] >> 4) & 0x03),
        _ => None,
    }
}

/// Marks an ECN-capable packet Congestion Experienced (RFC 3168 section 5), as a router's
/// queue does instead of dropping it, the IPv4 header checksum mended incrementally (RFC 1624);
/// returns whether the packet now carries the mark (false: not ECN-capable, left as it was).
pub fn mark_ce(packet: &mut [u8]) -> bool {
    match ecn(packet) {
        None | Some(0) => false,
        Some(_) => set_ecn(packet, ECN_CE),
    }
}

/// ECN field values (RFC 3168): not ECN-capable ...
pub const ECN_NOT_ECT: u8 = 0;
/// ... ECN-capable, ECT(1) (L4S, RFC 9331) ...
pub const ECN_ECT1: u8 = 1;
/// ... ECN-capable, ECT(0) ...
pub const ECN_ECT0: u8 = 2;
/// ... Congestion Experienced.
pub const ECN_CE: u8 = 3;

/// Writes `value` (two bits) into the packet's ECN field, IPv4 or IPv6, the IPv4 header
/// checksum mended incrementally (RFC 1624); false (and the packet left as it was) for
/// anything else.
fn set_ecn(packet: &mut [u8], value: u8) -> bool {
    let value = value & 0x03;
    match ecn(packet) {
        None => false,
        Some(v) if v == value => true,
        Some(_) if packet[0] >> 4 == 4 => {
            let old = u16::from_be_bytes([packet[0], packet[1]]);
            packet[1] = (packet[1] & 0xfc) | value;
            let new = u16::from_be_bytes([packet[0], packet[1]]);
            let check = u16::from_be_bytes([packet[10], packet[11]]);
            // HC' = ~(~HC + ~m + m')
            let sum = u64::from(!check) + u64::from(!old) + u64::from(new);
            packet[10..12].copy_from_slice(&(!fold16(sum)).to_be_bytes());
            true
        }
        Some(_) => {
            packet[1] = (packet[1] & 0xcf) | (value << 4);
            true
        }
    }
}

/// The ECN field the outer (UDP) packet carrying `packet` gets: the inner packet's own, copied
/// (RFC 6040 section 4.1, the normal mode), but ECT(0) for an inner packet marked CE already, as
/// Linux's IP tunnels do (`INET_ECN_encapsulate`): the inner mark survives decapsulation
/// whatever the outer field, and an outer CE then always means the path marked it, which the
/// receiver counts per link (LINK-CE). A tunnel that sent every packet Not-ECT would leave the
/// queues of the links' paths only drops to signal with, and an ECN flow's sender would see
/// its marks nowhere; with the copy a path's AQM marks what it would have dropped
/// ([`decapsulate_ecn`]). Not an IP packet: not ECN-capable.
pub fn encapsulate_ecn(packet: &[u8]) -> u8 {
    match ecn(packet) {
        Some(ECN_CE) => ECN_ECT0,
        Some(e) => e,
        None => ECN_NOT_ECT,
    }
}

/// Combines the ECN field `outer` the outer packet arrived with into the inner `packet`, as RFC
/// 6040 section 4.2 asks of a decapsulator: an outer CE marks an ECN-capable inner packet CE;
/// an outer ECT(1) over an inner ECT(0) makes it ECT(1); anything else leaves the inner field
/// as it is. Returns false when the packet must be dropped: an outer CE over a Not-ECT inner
/// packet (its sender cannot hear a mark, so the congestion the path signalled becomes the
/// loss it would have been). A packet that is not IPv4 or IPv6 is left alone.
pub fn decapsulate_ecn(packet: &mut [u8], outer: u8) -> bool {
    let Some(inner) = ecn(packet) else {
        return true;
    };
    match (inner, outer & 0x03) {
        (ECN_NOT_ECT, ECN_CE) => false,
        (ECN_ECT0 | ECN_ECT1, ECN_CE) => set_ecn(packet, ECN_CE),
        (ECN_ECT0, ECN_ECT1) => set_ecn(packet, ECN_ECT1),
        _ => true,
    }
}

/// The more severe of two outer ECN fields (CE over ECT(1) over ECT(0) over Not-ECT): what the
/// pieces of one inner packet sent in several tell together.
pub fn worse_ecn(a: u8, b: u8) -> u8 {
    let rank = |e: u8| match e & 0x03 {
        ECN_NOT_ECT => 0,
        ECN_ECT0 => 1,
        ECN_ECT1 => 2,
        _ => 3,
    };
    if rank(b) > rank(a) {
        b & 0x03
    } else {
        a & 0x03
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ecn_capable_packets_are_marked_and_the_ipv4_checksum_stays_right() {
        for (tos, marked) in [
            (0x00u8, false),
            (0x01, true),
            (0x02, true),
            (0xb8 | 0x02, true),
            (0x03, true),
        ] {
            let mut p = v4_tcp(0x10, 100);
            p[1] = tos;
            p[8] = 64;
            p[12..20].copy_from_slice(&[198, 18, 0, 1, 198, 18, 0, 2]);
            let c = ipv4_checksum(&p[..20]);
            p[10..12].copy_from_slice(&c.to_be_bytes());
            let before = p.clone();
            assert_eq!(mark_ce(&mut p), marked, "tos {tos:#x}");
            assert_eq!(ipv4_checksum(&p[..20]), 0, "tos {tos:#x}: checksum");
            if marked {
                assert_eq!(ecn(&p), Some(3));
                assert_eq!(p[1] & 0xfc, tos & 0xfc, "DSCP kept");
            } else {
                assert_eq!(p, before);
            }
        }
        let mut v6 = vec![0u8; 60];
        v6[0] = 0x60 | 0x0b; // traffic class 0xb2: DSCP 0x2c, ECT(0)
        v6[1] = 0x20;
        assert_eq!(ecn(&v6), Some(2));
        assert!(mark_ce(&mut v6));
        assert_eq!((v6[0], v6[1]), (0x6b, 0x30));
        assert_eq!(ecn(&v6), Some(3));
        v6[1] = 0;
        assert!(!mark_ce(&mut v6));
        for short in [&[0x45u8; 19][..], &[0x60; 39], &[], &[0x15; 40]] {
            let mut p = short.to_vec();
            assert!(!mark_ce(&mut p));
            assert_eq!(p, short);
        }
    }

    /// RFC 6040's decapsulation table, for IPv4 (checksum kept right) and IPv6.
    #[test]
    fn the_outer_ecn_field_is_combined_as_rfc_6040_asks() {
        // (inner, outer) -> the inner field after, or None: dropped.
        let table: [(u8, u8, Option<u8>); 16] = [
            (ECN_NOT_ECT, ECN_NOT_ECT, Some(ECN_NOT_ECT)),
            (ECN_NOT_ECT, ECN_ECT0, Some(ECN_NOT_ECT)),
            (ECN_NOT_ECT, ECN_ECT1, Some(ECN_NOT_ECT)),
            (ECN_NOT_ECT, ECN_CE, None),
            (ECN_ECT0, ECN_NOT_ECT, Some(ECN_ECT0)),
            (ECN_ECT0, ECN_ECT0, Some(ECN_ECT0)),
            (ECN_ECT0, ECN_ECT1, Some(ECN_ECT1)),
            (ECN_ECT0, ECN_CE, Some(ECN_CE)),
            (ECN_ECT1, ECN_NOT_ECT, Some(ECN_ECT1)),
            (ECN_ECT1, ECN_ECT0, Some(ECN_ECT1)),
            (ECN_ECT1, ECN_ECT1, Some(ECN_ECT1)),
            (ECN_ECT1, ECN_CE, Some(ECN_CE)),
            (ECN_CE, ECN_NOT_ECT, Some(ECN_CE)),
            (ECN_CE, ECN_ECT0, Some(ECN_CE)),
            (ECN_CE, ECN_ECT1, Some(ECN_CE)),
            (ECN_CE, ECN_CE, Some(ECN_CE)),
        ];
        for (inner, outer, after) in table {
            let mut p = v4_tcp(0x10, 100);
            p[1] = 0xb8 | inner;
            p[12..20].copy_from_slice(&[198, 18, 0, 1, 198, 18, 0, 2]);
            let c = ipv4_checksum(&p[..20]);
            p[10..12].copy_from_slice(&c.to_be_bytes());
            let outer_sent = if inner == ECN_CE { ECN_ECT0 } else { inner };
            assert_eq!(encapsulate_ecn(&p), outer_sent);
            let kept = decapsulate_ecn(&mut p, outer);
            assert_eq!(kept, after.is_some(), "v4 inner {inner} outer {outer}");
            if let Some(a) = after {
                assert_eq!(ecn(&p), Some(a), "v4 inner {inner} outer {outer}");
                assert_eq!(p[1] & 0xfc, 0xb8, "DSCP kept");
                assert_eq!(ipv4_checksum(&p[..20]), 0, "v4 checksum");
            }
            let mut v6 = v6_tcp(0x10, 10);
            v6[0] = 0x6b;
            v6[1] = 0x80 | (inner << 4);
            assert_eq!(encapsulate_ecn(&v6), outer_sent);
            assert_eq!(decapsulate_ecn(&mut v6, outer), after.is_some());
            if let Some(a) = after {
                assert_eq!(ecn(&v6), Some(a), "v6 inner {inner} outer {outer}");
                assert_eq!((v6[0], v6[1] & 0xcf), (0x6b, 0x80), "traffic class kept");
            }
        }
        // Not IP: nothing to combine, nothing dropped.
        for junk in [&[][..], &[0x15; 40], &[0x45; 10]] {
            let mut p = junk.to_vec();
            assert_eq!(encapsulate_ecn(&p), ECN_NOT_ECT);
            assert!(decapsulate_ecn(&mut p, ECN_CE));
            assert_eq!(p, junk);
        }
        assert_eq!(worse_ecn(ECN_ECT0, ECN_CE), ECN_CE);
        assert_eq!(worse_ecn(ECN_ECT1, ECN_ECT0), ECN_ECT1);
        assert_eq!(worse_ecn(ECN_NOT_ECT, ECN_ECT0), ECN_ECT0);
        assert_eq!(worse_ecn(ECN_CE, ECN_NOT_ECT), ECN_CE);
    }

    fn v4_tcp(flags: u8, payload: usize) -> Vec<u8> {
        let total = 20 + 20 + payload;
        let mut p = vec![0u8; total];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[9] = TCP;
        p[20 + 12] = 5 << 4;
        p[20 + 13] = flags;
        p
    }

    fn v6_tcp(flags: u8, payload: usize) -> Vec<u8> {
        let mut p = vec![0u8; 40 + 32 + payload];
        p[0] = 0x60;
        p[4..6].copy_from_slice(&((32 + payload) as u16).to_be_bytes());
        p[6] = TCP;
        p[40 + 12] = 8 << 4; // 32-byte header: timestamps
        p[40 + 13] = flags;
        p
    }

    #[test]
    fn pure_acks_and_the_rest() {
        assert!(is_pure_tcp_ack(&v4_tcp(ACK, 0)));
        assert!(is_pure_tcp_ack(&v6_tcp(ACK, 0)));
        assert!(!is_pure_tcp_ack(&v4_tcp(ACK, 1)));
        assert!(!is_pure_tcp_ack(&v6_tcp(ACK | 0x08, 100)));
        for f in [SYN, SYN | ACK, FIN | ACK, RST] {
            assert!(!is_pure_tcp_ack(&v4_tcp(f, 0)), "{f:#x}");
            assert!(!is_pure_tcp_ack(&v6_tcp(f, 0)), "{f:#x}");
        }
        assert!(is_tcp(&v4_tcp(SYN, 0)));
        // Padding after the IPv4 total length does not count as payload.
        let mut padded = v4_tcp(ACK, 0);
        padded.extend_from_slice(&[0; 6]);
        assert!(is_pure_tcp_ack(&padded));
        // UDP is never a TCP ACK.
        let mut udp = v4_tcp(ACK, 0);
        udp[9] = 17;
        assert!(!is_pure_tcp_ack(&udp) && !is_tcp(&udp));
    }

    /// A v4 TCP segment with `options` (padded to whole words) and no payload.
    fn v4_tcp_with(flags: u8, options: &[u8]) -> Vec<u8> {
        let opt_len = options.len().div_ceil(4) * 4;
        let mut p = v4_tcp(flags, opt_len);
        p[20 + 12] = (((20 + opt_len) / 4) << 4) as u8;
        p[40..40 + options.len()].copy_from_slice(options);
        p
    }

    #[test]
    fn a_syn_is_a_syn_without_ack_that_announces_its_mss() {
        // Linux's SYN options: MSS, SACK permitted, timestamps, NOP, window scale.
        let linux = [
            2, 4, 0x05, 0xb4, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7,
        ];
        // Windows': MSS, NOP, window scale, NOP, NOP, SACK permitted.
        let windows = [2, 4, 0x05, 0xb4, 1, 3, 3, 8, 1, 1, 4, 2];
        let mss_later = [1, 1, 4, 2, 2, 4, 0x05, 0xb4];
        for options in [&linux[..], &windows, &mss_later] {
            assert!(is_tcp_syn(&v4_tcp_with(SYN, options)), "{options:?}");
            assert!(!is_tcp_syn(&v4_tcp_with(SYN | ACK, options)), "a SYN-ACK");
            assert!(!is_tcp_syn(&v4_tcp_with(ACK, options)));
            assert!(!is_tcp_syn(&v4_tcp_with(SYN | RST, options)));
        }
        let mut v6 = v6_tcp(SYN, 0);
        v6[40 + 20..40 + 24].copy_from_slice(&[2, 4, 0x05, 0xa0]);
        assert!(is_tcp_syn(&v6));
        // No MSS, a malformed option before it, the list ended before it, a bare SYN.
        assert!(!is_tcp_syn(&v4_tcp_with(SYN, &[4, 2, 1, 1])));
        assert!(!is_tcp_syn(&v4_tcp_with(SYN, &[4, 0, 2, 4, 0x05, 0xb4])));
        assert!(!is_tcp_syn(&v4_tcp_with(SYN, &[0, 0, 2, 4, 0x05, 0xb4])));
        assert!(!is_tcp_syn(&v4_tcp(SYN, 0)));
        // An MSS option cut short by the header's end.
        assert!(!is_tcp_syn(&v4_tcp_with(SYN, &[1, 1, 1, 2])));
    }

    #[test]
    fn never_panics_on_odd_packets() {
        for len in 0..80 {
            for first in [0x00, 0x45, 0x4f, 0x41, 0x60, 0xff] {
                let mut p = vec![0xffu8; len];
                if let Some(b) = p.first_mut() {
                    *b = first;
                }
                let _ = is_pure_tcp_ack(&p);
                let _ = is_tcp(&p);
                let _ = is_tcp_syn(&p);
            }
        }
        // A later IPv4 fragment is not parsed as TCP.
        let mut frag = v4_tcp(0x10, 0);
        frag[7] = 1;
        assert!(!is_tcp(&frag));
    }

    proptest::proptest! {
        /// The word-at-a-time sum folds to what RFC 1071's 16-bit loop gives, for any bytes,
        /// any length (odd included) and any running sum.
        #[test]
        fn sum16_is_rfc_1071(
            data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
            start in 0u64..1 << 40,
        ) {
            let mut naive = start;
            for c in data.chunks(2) {
                naive += u64::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
            }
            proptest::prop_assert_eq!(fold16(sum16(&data, start)), fold16(naive));
        }
    }
}
