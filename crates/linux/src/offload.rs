//! TUN offloads without the kernel doing the work for us twice: a TUN opened with `IFF_VNET_HDR`
//! and `TUNSETOFFLOAD` (TSO, checksum) hands braid TCP *super-packets* of up to 64 KiB, each behind a
//! `virtio_net_hdr`, and accepts them back. This module is the pure packet logic of that, no
//! syscalls (the way wireguard-go's `tun/offload_linux.go` does it, rewritten on slices):
//!
//! - [`split`]: cuts a super-packet read from the TUN into the segments it stands for (IPv4 ID,
//!   lengths, sequence numbers, FIN/PSH on the last segment only, CWR on the first, both checksums
//!   completed), so the scheduler still places each segment on a link of its own.
//! - [`Coalescer`]: on the way out, glues in-order TCP segments of one flow that arrive in the same
//!   batch into one super-packet for one TUN write (GRO). It never waits for more: whatever the batch
//!   holds is written at the end of the batch.
//!
//! Both keep their output in caller-owned buffers that are reused from batch to batch: no
//! allocation per packet once warm.

use std::ops::Range;

use braid_core::inner::{fold16 as fold, pseudo_sum, sum16};

/// `struct virtio_net_hdr` (include/uapi/linux/virtio_net.h), in host byte order as the TUN uses
/// it by default (no `TUNSETVNETBE`/`LE`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VirtioNetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

pub const VIRTIO_NET_HDR_LEN: usize = 10;
/// `flags`: the transport checksum is to be completed from `csum_start`, stored at `csum_offset`.
pub const F_NEEDS_CSUM: u8 = 1;
pub const GSO_NONE: u8 = 0;
pub const GSO_TCPV4: u8 = 1;
pub const GSO_TCPV6: u8 = 4;
/// `gso_type` bit: the segments carry ECN (CWR set on the first only).
pub const GSO_ECN: u8 = 0x80;

const TCP: u8 = 6;
const FIN: u8 = 0x01;
const PSH: u8 = 0x08;
const ACK: u8 = 0x10;
const CWR: u8 = 0x80;

impl VirtioNetHdr {
    pub fn decode(b: &[u8]) -> Option<VirtioNetHdr> {
        let b = b.get(..VIRTIO_NET_HDR_LEN)?;
        let u = |i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
        Some(VirtioNetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u(2),
            gso_size: u(4),
            csum_start: u(6),
            csum_offset: u(8),
        })
    }

    pub fn encode(&self) -> [u8; VIRTIO_NET_HDR_LEN] {
        let mut b = [0u8; VIRTIO_NET_HDR_LEN];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_ne_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_ne_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_ne_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_ne_bytes());
        b
    }
}

/// Writes the IPv4 header checksum of `ip` (20+ bytes, IHL honoured).
fn set_ipv4_checksum(ip: &mut [u8]) {
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    ip[10..12].fill(0);
    let c = braid_core::inner::ipv4_checksum(&ip[..ihl]);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
}

/// Why a packet from the TUN cannot be split (it is dropped and counted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SplitError {
    #[error("virtio_net_hdr offsets outside the packet")]
    BadOffsets,
    #[error("GSO type {0} not supported")]
    UnsupportedGso(u8),
    #[error("GSO packet is not TCP over IPv4/IPv6 as its header says")]
    NotTcp,
    #[error("GSO packet of {0} segments (at most 1024)")]
    TooManySegments(usize),
}

/// Most segments one super-packet may stand for (64 KiB at an MSS of 64 bytes).
const MAX_SEGMENTS: usize = 1024;

/// Segments cut from super-packets, in one reused buffer.
#[derive(Default, Debug)]
pub struct Segments {
    buf: Vec<u8>,
    ranges: Vec<Range<usize>>,
}

impl Segments {
    pub fn clear(&mut self) {
        self.buf.clear();
        self.ranges.clear();
    }

    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        self.ranges.iter().map(|r| &self.buf[r.clone()])
    }

    /// The `i`-th segment.
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        self.ranges.get(i).map(|r| &self.buf[r.clone()])
    }

    fn push(&mut self, bytes: &[u8]) -> usize {
        let start = self.buf.len();
        self.buf.extend_from_slice(bytes);
        self.ranges.push(start..self.buf.len());
        start
    }
}

/// Appends to `out` the packets `packet` (read from the TUN behind `hdr`) stands for: itself with
/// its checksum completed if it is not a super-packet, else one TCP segment per `gso_size` bytes of
/// payload. Errors leave `out` as it was.
pub fn split(hdr: &VirtioNetHdr, packet: &[u8], out: &mut Segments) -> Result<(), SplitError> {
    let gso = hdr.gso_type & !GSO_ECN;
    if gso == GSO_NONE {
        let start = out.push(packet);
        if hdr.flags & F_NEEDS_CSUM != 0 {
            let end = out.buf.len();
            if let Err(e) = complete_checksum(hdr, &mut out.buf[start..end]) {
                out.buf.truncate(start);
                out.ranges.pop();
                return Err(e);
            }
        }
        return Ok(());
    }
    let v6 = match gso {
        GSO_TCPV4 => false,
        GSO_TCPV6 => true,
        other => return Err(SplitError::UnsupportedGso(other)),
    };
    let ip_len = usize::from(hdr.csum_start);
    let ip = packet.get(..ip_len).ok_or(SplitError::BadOffsets)?;
    let version_ok = match ip.first() {
        Some(b) if v6 => b >> 4 == 6 && ip_len == 40 && ip.get(6) == Some(&TCP),
        Some(b) => {
            b >> 4 == 4 && ip_len == usize::from(b & 0x0f) * 4 && ip_len >= 20 && ip[9] == TCP
        }
        None => false,
    };
    if !version_ok {
        return Err(SplitError::NotTcp);
    }
    let tcp_len = usize::from(*packet.get(ip_len + 12).ok_or(SplitError::BadOffsets)? >> 4) * 4;
    let headers = ip_len + tcp_len;
    if tcp_len < 20 || packet.len() < headers || hdr.gso_size == 0 {
        return Err(SplitError::BadOffsets);
    }
    let payload = &packet[headers..];
    let mss = usize::from(hdr.gso_size);
    let seq0 = u32::from_be_bytes(packet[ip_len + 4..ip_len + 8].try_into().expect("4 bytes"));
    let id0 = u16::from_be_bytes([packet[4], packet[5]]);
    let flags = packet[ip_len + 13];
    let n = payload.len().div_ceil(mss).max(1);
    if n > MAX_SEGMENTS {
        return Err(SplitError::TooManySegments(n));
    }
    for i in 0..n {
        let chunk = &payload[(i * mss).min(payload.len())..((i + 1) * mss).min(payload.len())];
        let start = out.buf.len();
        out.buf.extend_from_slice(&packet[..headers]);
        out.buf.extend_from_slice(chunk);
        let seg = &mut out.buf[start..];
        let total = seg.len();
        if v6 {
            seg[4..6].copy_from_slice(&((total - 40) as u16).to_be_bytes());
        } else {
            seg[2..4].copy_from_slice(&(total as u16).to_be_bytes());
            seg[4..6].copy_from_slice(&id0.wrapping_add(i as u16).to_be_bytes());
            set_ipv4_checksum(seg);
        }
        let tcp = &mut seg[ip_len..];
        let seq = seq0.wrapping_add((i * mss) as u32);
        tcp[4..8].copy_from_slice(&seq.to_be_bytes());
        let mut f = flags;
        if i + 1 < n {
            f &= !(FIN | PSH);
        }
        if i > 0 {
            f &= !CWR;
        }
        tcp[13] = f;
        tcp[16..18].fill(0);
        let c = !fold(sum16(
            &seg[ip_len..],
            pseudo_sum(seg, v6, TCP, total - ip_len),
        ));
        seg[ip_len + 16..ip_len + 18].copy_from_slice(&c.to_be_bytes());
        out.ranges.push(start..out.buf.len());
    }
    Ok(())
}

/// Completes a partial transport checksum (`F_NEEDS_CSUM`): the field holds the pseudo-header sum,
/// the sum of everything from `csum_start` on is folded in.
fn complete_checksum(hdr: &VirtioNetHdr, packet: &mut [u8]) -> Result<(), SplitError> {
    let start = usize::from(hdr.csum_start);
    let at = start + usize::from(hdr.csum_offset);
    if at + 2 > packet.len() || start > packet.len() {
        return Err(SplitError::BadOffsets);
    }
    let c = !fold(sum16(&packet[start..], 0));
    // A computed 0 is sent as 0xffff for UDP; for TCP both are the same number.
    let c = if c == 0 { 0xffff } else { c };
    packet[at..at + 2].copy_from_slice(&c.to_be_bytes());
    Ok(())
}

/// A flow's segment being grown in the batch.
#[derive(Debug)]
struct Item {
    /// Where its bytes are in the output buffer (the vnet header first).
    range: Range<usize>,
    ip_len: usize,
    tcp_len: usize,
    /// Payload size of the first segment: the `gso_size` of the super-packet.
    mss: usize,
    next_seq: u32,
    merged: u16,
    /// A segment smaller than `mss` or with PSH ended it: nothing may follow.
    closed: bool,
    v6: bool,
}

/// Glues in-order TCP segments of one flow, within one batch, into super-packets for the TUN.
///
/// Feed each outgoing IP packet to [`Coalescer::push`], then write every buffer of
/// [`Coalescer::finish`] to the TUN (each starts with its `virtio_net_hdr`), then
/// [`Coalescer::clear`] for the next batch. A segment is appended to the flow's packet only when it
/// continues it exactly: same addresses, ports, ACK number, IP header fields and TCP options;
/// sequence number where the last one ended; flags ACK or ACK|PSH (PSH closes the packet); no
/// bigger than the first segment. Everything else is written as it is, in its place in the batch.
#[derive(Default, Debug)]
pub struct Coalescer {
    /// Whether to glue at all (off: every packet is written as it is, behind a zero header).
    glue: bool,
    buf: Vec<u8>,
    items: Vec<Item>,
    /// The latest item per flow (index into `items`), for the flows of this batch. A batch has a
    /// few dozen packets: a linear scan of the open items is faster than hashing.
    open: Vec<(FlowKey, usize)>,
    /// Most bytes of one super-packet (64 KiB minus headroom).
    max_len: usize,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct FlowKey {
    addrs: [u8; 32],
    ports: [u8; 4],
    ack: [u8; 4],
    v6: bool,
}

/// Stats of one batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CoalesceStats {
    pub packets_in: usize,
    pub writes: usize,
}

impl Coalescer {
    pub fn new() -> Coalescer {
        Coalescer {
            glue: true,
            max_len: 65535,
            ..Coalescer::default()
        }
    }

    /// A coalescer that glues nothing (for a TUN without offloads): every packet is written alone.
    pub fn without_glue() -> Coalescer {
        Coalescer {
            glue: false,
            ..Coalescer::new()
        }
    }

    /// Packets taken since the last [`Coalescer::clear`].
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn clear(&mut self) {
        self.buf.clear();
        self.items.clear();
        self.open.clear();
    }

    /// Takes one IP packet for the TUN.
    pub fn push(&mut self, packet: &[u8]) {
        if let Some((key, ip_len, tcp_len)) = candidate(packet).filter(|_| self.glue) {
            if let Some(slot) = self.open.iter().position(|(k, _)| *k == key) {
                let i = self.open[slot].1;
                if self.try_append(i, packet, ip_len, tcp_len) {
                    return;
                }
                self.open.swap_remove(slot);
            }
            let i = self.start(packet, Some((ip_len, tcp_len)));
            self.open.push((key, i));
        } else {
            self.start(packet, None);
        }
    }

    fn start(&mut self, packet: &[u8], tcp: Option<(usize, usize)>) -> usize {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0; VIRTIO_NET_HDR_LEN]);
        self.buf.extend_from_slice(packet);
        let (ip_len, tcp_len) = tcp.unwrap_or((0, 0));
        let mss = packet.len().saturating_sub(ip_len + tcp_len);
        let (seq, flags) = match tcp {
            Some(_) => (
                u32::from_be_bytes(packet[ip_len + 4..ip_len + 8].try_into().expect("4 bytes")),
                packet[ip_len + 13],
            ),
            None => (0, 0),
        };
        self.items.push(Item {
            range: start..self.buf.len(),
            ip_len,
            tcp_len,
            mss,
            next_seq: seq.wrapping_add(mss as u32),
            merged: 0,
            closed: tcp.is_none() || flags & PSH != 0,
            v6: packet.first().is_some_and(|b| b >> 4 == 6),
        });
        self.items.len() - 1
    }

    fn try_append(&mut self, i: usize, packet: &[u8], ip_len: usize, tcp_len: usize) -> bool {
        let item = &self.items[i];
        let payload = packet.len() - ip_len - tcp_len;
        // Only the newest item can grow: its bytes are at the end of the buffer.
        if i + 1 != self.items.len()
            || item.closed
            || item.ip_len != ip_len
            || item.tcp_len != tcp_len
            || payload > item.mss
            || item.range.len() - VIRTIO_NET_HDR_LEN + payload > self.max_len
        {
            return false;
        }
        let head = &self.buf[item.range.start + VIRTIO_NET_HDR_LEN..];
        let seq = u32::from_be_bytes(packet[ip_len + 4..ip_len + 8].try_into().expect("4 bytes"));
        let same_ip = if item.v6 {
            head[..4] == packet[..4] && head[7] == packet[7]
        } else {
            head[1] == packet[1] && head[6] >> 5 == packet[6] >> 5 && head[8] == packet[8]
        };
        let same_opts =
            head[ip_len + 20..ip_len + tcp_len] == packet[ip_len + 20..ip_len + tcp_len];
        let same_window = head[ip_len + 14..ip_len + 16] == packet[ip_len + 14..ip_len + 16];
        if seq != item.next_seq
            || !same_ip
            || !same_opts
            || !same_window
            || !checksum_ok(packet, ip_len, item.v6)
        {
            return false;
        }
        if item.merged == 0 && !checksum_ok(head, ip_len, item.v6) {
            return false;
        }
        let psh = packet[ip_len + 13] & PSH != 0;
        let start = item.range.start;
        self.buf.extend_from_slice(&packet[ip_len + tcp_len..]);
        if psh {
            self.buf[start + VIRTIO_NET_HDR_LEN + ip_len + 13] |= PSH;
        }
        let end = self.buf.len();
        let item = &mut self.items[i];
        item.range.end = end;
        item.merged += 1;
        item.next_seq = seq.wrapping_add(payload as u32);
        item.closed = psh || payload < item.mss;
        true
    }

    /// Finishes the batch: fixes lengths, headers and checksums of the glued packets. Returns the
    /// buffers to write, in order, each with its `virtio_net_hdr` in front, and how many packets
    /// each stands for.
    pub fn finish(&mut self) -> impl Iterator<Item = (&[u8], usize)> {
        for item in &self.items {
            let bytes = &mut self.buf[item.range.clone()];
            let (vnet, pkt) = bytes.split_at_mut(VIRTIO_NET_HDR_LEN);
            if item.merged == 0 {
                vnet.copy_from_slice(&VirtioNetHdr::default().encode());
                continue;
            }
            let total = pkt.len();
            if item.v6 {
                pkt[4..6].copy_from_slice(&((total - 40) as u16).to_be_bytes());
            } else {
                pkt[2..4].copy_from_slice(&(total as u16).to_be_bytes());
                set_ipv4_checksum(pkt);
            }
            // The TCP checksum field holds the pseudo-header sum: the kernel completes it
            // (CHECKSUM_PARTIAL), or segments the packet again if it forwards it.
            let partial = fold(pseudo_sum(pkt, item.v6, TCP, total - item.ip_len));
            pkt[item.ip_len + 16..item.ip_len + 18].copy_from_slice(&partial.to_be_bytes());
            let hdr = VirtioNetHdr {
                flags: F_NEEDS_CSUM,
                gso_type: if item.v6 { GSO_TCPV6 } else { GSO_TCPV4 },
                hdr_len: (item.ip_len + item.tcp_len) as u16,
                gso_size: item.mss as u16,
                csum_start: item.ip_len as u16,
                csum_offset: 16,
            };
            vnet.copy_from_slice(&hdr.encode());
        }
        self.items
            .iter()
            .map(|i| (&self.buf[i.range.clone()], usize::from(i.merged) + 1))
    }
}

/// Whether a TCP segment's checksum is right (coalescing must not hide a corrupt segment behind a
/// checksum the kernel recomputes).
fn checksum_ok(packet: &[u8], ip_len: usize, v6: bool) -> bool {
    let len = packet.len() - ip_len;
    fold(sum16(&packet[ip_len..], pseudo_sum(packet, v6, TCP, len))) == 0xffff
}

/// A TCP segment that may be glued: flow key, IP and TCP header lengths.
fn candidate(packet: &[u8]) -> Option<(FlowKey, usize, usize)> {
    let v6 = match packet.first()? >> 4 {
        4 => false,
        6 => true,
        _ => return None,
    };
    let ip_len = if v6 { 40 } else { 20 };
    let ip = packet.get(..ip_len)?;
    if v6 {
        if ip[6] != TCP || usize::from(u16::from_be_bytes([ip[4], ip[5]])) != packet.len() - 40 {
            return None;
        }
    } else if ip[0] != 0x45
        || ip[9] != TCP
        || usize::from(u16::from_be_bytes([ip[2], ip[3]])) != packet.len()
        || u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0
    {
        return None;
    }
    let tcp_len = usize::from(*packet.get(ip_len + 12)? >> 4) * 4;
    if tcp_len < 20 || packet.len() <= ip_len + tcp_len {
        return None; // no payload: nothing to glue
    }
    let flags = packet[ip_len + 13];
    if flags != ACK && flags != ACK | PSH {
        return None;
    }
    let mut addrs = [0u8; 32];
    let a = if v6 { &ip[8..40] } else { &ip[12..20] };
    addrs[..a.len()].copy_from_slice(a);
    let t = &packet[ip_len..];
    Some((
        FlowKey {
            addrs,
            ports: t[..4].try_into().expect("4 bytes"),
            ack: t[8..12].try_into().expect("4 bytes"),
            v6,
        },
        ip_len,
        tcp_len,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A TCP segment with a correct checksum.
    fn segment(v6: bool, seq: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
        let tcp_len = 32 + payload.len();
        let mut p = Vec::new();
        if v6 {
            p.extend_from_slice(&[0x60, 0, 0, 0]);
            p.extend_from_slice(&(tcp_len as u16).to_be_bytes());
            p.extend_from_slice(&[TCP, 64]);
            p.extend_from_slice(&[0x20, 0x01, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
            p.extend_from_slice(&[0x20, 0x01, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        } else {
            p.extend_from_slice(&[0x45, 0]);
            p.extend_from_slice(&((20 + tcp_len) as u16).to_be_bytes());
            p.extend_from_slice(&[
                0x12, 0x34, 0x40, 0, 64, TCP, 0, 0, 198, 18, 0, 1, 198, 18, 0, 2,
            ]);
            set_ipv4_checksum(&mut p);
        }
        let ip_len = p.len();
        p.extend_from_slice(&[0x9c, 0x40, 0x14, 0x51]);
        p.extend_from_slice(&seq.to_be_bytes());
        p.extend_from_slice(&[0, 0, 0, 1, 0x80, flags, 0xfa, 0xf0, 0, 0, 0, 0]);
        p.extend_from_slice(&[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2]);
        p.extend_from_slice(payload);
        let c = !fold(sum16(&p[ip_len..], pseudo_sum(&p, v6, TCP, tcp_len)));
        p[ip_len + 16..ip_len + 18].copy_from_slice(&c.to_be_bytes());
        p
    }

    fn ip_ok(p: &[u8]) -> bool {
        p[0] >> 4 == 6 || fold(sum16(&p[..20], 0)) == 0xffff
    }

    /// What a TSO super-packet from the TUN looks like: one header, all payloads, the TCP checksum
    /// field holding the pseudo-header sum of the first segment's length.
    fn super_packet(
        v6: bool,
        seq: u32,
        flags: u8,
        payload: &[u8],
        mss: u16,
    ) -> (VirtioNetHdr, Vec<u8>) {
        let mut p = segment(v6, seq, flags, payload);
        let ip_len = if v6 { 40 } else { 20 };
        p[ip_len + 16..ip_len + 18].fill(0);
        let hdr = VirtioNetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: if v6 { GSO_TCPV6 } else { GSO_TCPV4 },
            hdr_len: (ip_len + 32) as u16,
            gso_size: mss,
            csum_start: ip_len as u16,
            csum_offset: 16,
        };
        (hdr, p)
    }

    #[test]
    fn vnet_header_round_trips() {
        let h = VirtioNetHdr {
            flags: 1,
            gso_type: GSO_TCPV6 | GSO_ECN,
            hdr_len: 72,
            gso_size: 1448,
            csum_start: 40,
            csum_offset: 16,
        };
        assert_eq!(VirtioNetHdr::decode(&h.encode()), Some(h));
        assert_eq!(VirtioNetHdr::decode(&[0; 9]), None);
    }

    #[test]
    fn a_super_packet_splits_into_valid_segments_with_flags_in_place() {
        for v6 in [false, true] {
            let payload: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
            let (hdr, p) = super_packet(v6, 1000, ACK | PSH | FIN | CWR, &payload, 1448);
            let mut out = Segments::default();
            split(&hdr, &p, &mut out).unwrap();
            let segs: Vec<&[u8]> = out.iter().collect();
            assert_eq!(segs.len(), 3);
            let ip_len = if v6 { 40 } else { 20 };
            let mut joined = Vec::new();
            for (i, s) in segs.iter().enumerate() {
                assert!(ip_ok(s), "ip checksum of segment {i}");
                assert!(checksum_ok(s, ip_len, v6), "tcp checksum of segment {i}");
                let seq = u32::from_be_bytes(s[ip_len + 4..ip_len + 8].try_into().unwrap());
                assert_eq!(seq, 1000 + 1448 * i as u32);
                let f = s[ip_len + 13];
                assert_eq!(f & (FIN | PSH) != 0, i == 2, "FIN/PSH only on the last");
                assert_eq!(f & CWR != 0, i == 0, "CWR only on the first");
                if !v6 {
                    assert_eq!(u16::from_be_bytes([s[4], s[5]]), 0x1234 + i as u16);
                }
                joined.extend_from_slice(&s[ip_len + 32..]);
            }
            assert_eq!(joined, payload);
        }
    }

    #[test]
    fn a_plain_packet_with_a_partial_checksum_is_completed() {
        let (mut hdr, p) = super_packet(false, 1, ACK, b"hello", 1448);
        hdr.gso_type = GSO_NONE;
        // The partial checksum: the pseudo-header sum, as the kernel leaves it.
        let mut p = p;
        let partial = fold(pseudo_sum(&p, false, TCP, p.len() - 20));
        p[36..38].copy_from_slice(&partial.to_be_bytes());
        let mut out = Segments::default();
        split(&hdr, &p, &mut out).unwrap();
        let s = out.iter().next().unwrap();
        assert!(checksum_ok(s, 20, false));
        assert_eq!(s, &segment(false, 1, ACK, b"hello")[..]);
    }

    #[test]
    fn bad_headers_are_errors_not_panics() {
        let (hdr, p) = super_packet(false, 1, ACK, &[0; 3000], 1448);
        let mut out = Segments::default();
        for h in [
            VirtioNetHdr {
                csum_start: 5000,
                ..hdr
            },
            VirtioNetHdr {
                csum_start: 40,
                ..hdr
            },
            VirtioNetHdr { gso_size: 0, ..hdr },
            VirtioNetHdr { gso_size: 2, ..hdr },
            VirtioNetHdr { gso_type: 3, ..hdr },
            VirtioNetHdr {
                gso_type: GSO_TCPV6,
                ..hdr
            },
            VirtioNetHdr {
                gso_type: GSO_NONE,
                csum_offset: 9000,
                ..hdr
            },
        ] {
            assert!(split(&h, &p, &mut out).is_err(), "{h:?}");
            assert!(out.is_empty());
        }
        assert!(split(&hdr, &p[..30], &mut out).is_err());
    }

    #[test]
    fn in_order_segments_glue_and_split_back_to_the_same_bytes() {
        for v6 in [false, true] {
            let mut c = Coalescer::new();
            let segs: Vec<Vec<u8>> = (0..4u32)
                .map(|i| {
                    segment(
                        v6,
                        1000 + i * 1000,
                        if i == 3 { ACK | PSH } else { ACK },
                        &[i as u8; 1000],
                    )
                })
                .collect();
            for s in &segs {
                c.push(s);
            }
            let out: Vec<Vec<u8>> = c.finish().map(|(b, _)| b.to_vec()).collect();
            assert_eq!(out.len(), 1, "one write for four segments");
            let hdr = VirtioNetHdr::decode(&out[0]).unwrap();
            assert_eq!(hdr.gso_size, 1000);
            let mut back = Segments::default();
            split(&hdr, &out[0][VIRTIO_NET_HDR_LEN..], &mut back).unwrap();
            let back: Vec<&[u8]> = back.iter().collect();
            // IPv4 IDs of the originals were all 0x1234; a split numbers them up, as the kernel
            // does: compare everything else.
            for (a, b) in segs.iter().zip(&back) {
                let mut a = a.clone();
                let mut b = b.to_vec();
                if !v6 {
                    a[4..6].fill(0);
                    a[10..12].fill(0);
                    b[4..6].fill(0);
                    b[10..12].fill(0);
                }
                assert_eq!(a, b);
            }
        }
    }

    #[test]
    fn what_does_not_continue_a_flow_is_written_as_it_is_in_its_place() {
        let mut c = Coalescer::new();
        let a1 = segment(false, 1000, ACK, &[1; 100]);
        let gap = segment(false, 1200, ACK, &[2; 100]); // 1100..1200 missing
        let syn = segment(false, 5, 0x02, &[]);
        let mut bad = segment(false, 1300, ACK, &[3; 100]);
        bad[60] ^= 1; // corrupt payload: checksum wrong
        let other_flow = {
            let mut p = segment(true, 1, ACK, &[4; 10]);
            p[39] = 9;
            p
        };
        for p in [&a1, &gap, &syn, &bad, &other_flow] {
            c.push(p);
        }
        let out: Vec<Vec<u8>> = c.finish().map(|(b, _)| b.to_vec()).collect();
        assert_eq!(out.len(), 5);
        for (o, p) in out.iter().zip([&a1, &gap, &syn, &bad, &other_flow]) {
            assert_eq!(VirtioNetHdr::decode(o), Some(VirtioNetHdr::default()));
            assert_eq!(&o[VIRTIO_NET_HDR_LEN..], &p[..]);
        }
        c.clear();
        assert_eq!(c.finish().count(), 0);
    }

    proptest! {
        /// Any batch of segments from a few flows, in any order: what the coalescer writes, split
        /// again, is the same TCP byte stream per flow, in the same order, nothing lost or doubled.
        #[test]
        fn coalescing_keeps_every_byte_in_order(
            order in prop::collection::vec((0u8..3, 1usize..1500, any::<bool>()), 1..40),
        ) {
            let mut c = Coalescer::new();
            let mut next_seq = [0u32; 3];
            let mut sent: Vec<Vec<u8>> = Vec::new();
            for &(flow, len, psh) in &order {
                let payload: Vec<u8> = (0..len).map(|i| (i as u8) ^ flow).collect();
                let mut s = segment(flow == 2, next_seq[usize::from(flow)], if psh { ACK | PSH } else { ACK }, &payload);
                // Flow 1 differs from flow 0 by its source port.
                if flow == 1 {
                    s[20] = 0x11;
                    s[36..38].fill(0);
                    let c = !fold(sum16(&s[20..], pseudo_sum(&s, false, TCP, s.len() - 20)));
                    s[36..38].copy_from_slice(&c.to_be_bytes());
                }
                next_seq[usize::from(flow)] = next_seq[usize::from(flow)].wrapping_add(len as u32);
                c.push(&s);
                sent.push(s);
            }
            let written: Vec<Vec<u8>> = c.finish().map(|(b, _)| b.to_vec()).collect();
            prop_assert!(written.len() <= sent.len());
            let mut got: Vec<Vec<u8>> = Vec::new();
            for w in &written {
                let hdr = VirtioNetHdr::decode(w).unwrap();
                let mut segs = Segments::default();
                split(&hdr, &w[VIRTIO_NET_HDR_LEN..], &mut segs).unwrap();
                got.extend(segs.iter().map(|s| s.to_vec()));
            }
            prop_assert_eq!(got.len(), sent.len());
            for (g, s) in got.iter().zip(&sent) {
                let ip_len = if s[0] >> 4 == 6 { 40 } else { 20 };
                prop_assert!(ip_ok(g));
                prop_assert!(checksum_ok(g, ip_len, s[0] >> 4 == 6));
                // Same TCP header and payload (IPv4 IDs renumbered by the split).
                prop_assert_eq!(&g[ip_len..], &s[ip_len..]);
            }
        }
    }
}
