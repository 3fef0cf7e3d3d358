//! Delta coding of a compressed packet's dynamic fields against a *reference*: values the
//! decompressor is known to hold because it acknowledged them.
//!
//! The absolute encoding (`11`) carries every changing field in full: 26 bytes for a TCP/IPv4
//! segment with timestamps. Most of those bytes repeat what the previous packets said (the
//! upper bytes of the sequence number and of both timestamps, an acknowledgement number and a
//! window that do not move in a one-way transfer). Coding them against the previous *packet*
//! (Van Jacobson, ROHC's W-LSB) would break on a bundle, whose packets cross several links and
//! arrive reordered or not at all. So, as ROHC-TCP does with acknowledged references:
//!
//! - The compressor chooses a reference (the values of one packet) and sends it in a 21-byte
//!   reference block behind the absolute fields of a packet (flag [`super::F_REF`]), in one of
//!   two *epochs*, again on one packet per [`super::REF_REPEAT`] until the decompressor
//!   acknowledges it (a FEEDBACK entry with the reference bit and the epoch). Every copy of the
//!   block carries the same values. The packets between copies are coded against the
//!   acknowledged reference of the other epoch, if there is one, else absolute.
//! - From then on a packet may be coded as a *delta* packet (`00`): each field as its
//!   difference from the reference of the epoch it names, in as few bytes as that difference
//!   needs; an acknowledgement number and a window equal to the reference's are left out; the
//!   TCP checksum is left out when the receiver's recomputation gives the same two bytes (the
//!   compressor checks it; the AEAD already authenticates the packet). A delta packet depends
//!   on the acknowledged reference only, never on another packet.
//! - Before the differences outgrow their short forms the compressor starts a new reference in
//!   the other epoch. An epoch's reference is replaced only after nothing has been coded against
//!   it for `reuse_idle` (longer than any packet stays in flight), the rule that already guards
//!   context ids, so a late packet is never decoded against a newer reference.
//! - A decompressor that lacks the reference answers as for a missing context: the compressor
//!   forgets its references and the context, and the flow starts over with a whole packet.
//!
//! A TCP/IPv4 segment with timestamps of a one-way transfer then takes 14 bytes instead of 26.

use super::{Reader, F_IP_ID, F_OPTIONS, F_TCP_RES, F_TS, F_URGENT, TS_OPTIONS};

/// The reference block: epoch (1), seq (4), ack (4), window (2), IP ID (2), TSval (4), TSecr (4).
pub(super) const REF_BLOCK_LEN: usize = 21;

/// The dynamic values a delta packet is coded against.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct RefValues {
    pub seq: u32,
    pub ack: u32,
    pub window: u16,
    pub ip_id: u16,
    pub tsval: u32,
    pub tsecr: u32,
}

impl RefValues {
    pub fn emit(&self, epoch: u8, out: &mut Vec<u8>) {
        out.push(epoch & 1);
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.extend_from_slice(&self.ack.to_be_bytes());
        out.extend_from_slice(&self.window.to_be_bytes());
        out.extend_from_slice(&self.ip_id.to_be_bytes());
        out.extend_from_slice(&self.tsval.to_be_bytes());
        out.extend_from_slice(&self.tsecr.to_be_bytes());
    }

    /// Reads a reference block; `None` if short or the epoch byte is not 0 or 1.
    pub fn parse(r: &mut Reader<'_>) -> Option<(u8, RefValues)> {
        let epoch = r.byte()?;
        if epoch > 1 {
            return None;
        }
        let v = RefValues {
            seq: r.u32()?,
            ack: r.u32()?,
            window: r.u16()?,
            ip_id: r.u16()?,
            tsval: r.u32()?,
            tsecr: r.u32()?,
        };
        Some((epoch, v))
    }

    /// Whether a packet with values `v` is far enough from this reference that a new one should
    /// be started (its differences are about to need their longest forms).
    pub fn worn(&self, v: &RefValues) -> bool {
        v.seq.wrapping_sub(self.seq) >= 1 << 23
            || v.ack.wrapping_sub(self.ack) >= 1 << 15
            || v.tsval.wrapping_sub(self.tsval) >= 1 << 15
            || v.tsecr.wrapping_sub(self.tsecr) >= 1 << 15
    }
}

// The second flags byte of a delta packet.
const D_SEQ: u8 = 0xc0; // seq difference in 1 + n bytes
const D_ACK: u8 = 0x30; // ack difference: 0, 1, 2 or 4 bytes
const D_WINDOW: u8 = 0x08; // window present (else the reference's)
const D_CSUM: u8 = 0x04; // TCP checksum present (else recomputed)
const D_TSVAL4: u8 = 0x02; // TSval difference in 4 bytes (else 2)
const D_TSECR4: u8 = 0x01; // TSecr difference in 4 bytes (else 2)

const ACK_LENS: [usize; 4] = [0, 1, 2, 4];

/// Bytes an unsigned difference needs, 1..=4.
fn seq_len(d: u32) -> usize {
    match d {
        0..=0xff => 1,
        0x100..=0xffff => 2,
        0x1_0000..=0xff_ffff => 3,
        _ => 4,
    }
}

fn push_be(out: &mut Vec<u8>, v: u32, n: usize) {
    out.extend_from_slice(&v.to_be_bytes()[4 - n..]);
}

/// What a delta packet says beyond the context and the reference: the fields of
/// `super::emit_dynamic`, each as a difference where it has one.
pub(super) struct Fields<'a> {
    /// The absolute encoding's flags byte (IP ID, reserved bits, urgent, timestamps, options,
    /// ECN); bit 2 is the epoch here.
    pub flags: u8,
    pub tcp_flags: u8,
    pub values: RefValues,
    pub res: u8,
    pub urgent: [u8; 2],
    /// `None`: the receiver's recomputation gives it.
    pub csum: Option<[u8; 2]>,
    pub options: &'a [u8],
}

/// Writes a delta packet's fields (after its context id) against `reference`.
pub(super) fn emit(f: &Fields<'_>, reference: &RefValues, out: &mut Vec<u8>) {
    let v = &f.values;
    let dseq = v.seq.wrapping_sub(reference.seq);
    let dack = v.ack.wrapping_sub(reference.ack);
    let seq_n = seq_len(dseq);
    let ack_code = match dack {
        0 => 0,
        1..=0xff => 1,
        0x100..=0xffff => 2,
        _ => 3,
    };
    let mut d = ((seq_n - 1) as u8) << 6 | (ack_code as u8) << 4;
    if v.window != reference.window {
        d |= D_WINDOW;
    }
    if f.csum.is_some() {
        d |= D_CSUM;
    }
    let dtsval = v.tsval.wrapping_sub(reference.tsval);
    let dtsecr = v.tsecr.wrapping_sub(reference.tsecr);
    if f.flags & F_TS != 0 {
        if dtsval > 0xffff {
            d |= D_TSVAL4;
        }
        if dtsecr > 0xffff {
            d |= D_TSECR4;
        }
    }
    out.push(f.flags);
    out.push(d);
    out.push(f.tcp_flags);
    if f.flags & F_IP_ID != 0 {
        out.extend_from_slice(&v.ip_id.wrapping_sub(reference.ip_id).to_be_bytes());
    }
    if f.flags & F_TCP_RES != 0 {
        out.push(f.res);
    }
    push_be(out, dseq, seq_n);
    push_be(out, dack, ACK_LENS[ack_code]);
    if d & D_WINDOW != 0 {
        out.extend_from_slice(&v.window.to_be_bytes());
    }
    if let Some(c) = f.csum {
        out.extend_from_slice(&c);
    }
    if f.flags & F_URGENT != 0 {
        out.extend_from_slice(&f.urgent);
    }
    if f.flags & F_TS != 0 {
        push_be(out, dtsval, if d & D_TSVAL4 != 0 { 4 } else { 2 });
        push_be(out, dtsecr, if d & D_TSECR4 != 0 { 4 } else { 2 });
    } else if f.flags & F_OPTIONS != 0 {
        out.push(f.options.len() as u8);
        out.extend_from_slice(f.options);
    }
}

fn take_be(r: &mut Reader<'_>, n: usize) -> Option<u32> {
    let b = r.take(n)?;
    Some(b.iter().fold(0u32, |acc, &x| (acc << 8) | u32::from(x)))
}

/// Reads a delta packet's fields (after its context id) against the reference the caller
/// looked up for the epoch in `flags` (bit 2, read by the caller from the first byte).
/// `None` if malformed.
pub(super) fn parse<'a>(r: &mut Reader<'a>, reference: &RefValues) -> Option<Fields<'a>> {
    let flags = r.byte()?;
    let d = r.byte()?;
    let tcp_flags = r.byte()?;
    if flags & F_TS != 0 && flags & F_OPTIONS != 0 {
        return None;
    }
    if flags & F_TS == 0 && d & (D_TSVAL4 | D_TSECR4) != 0 {
        return None;
    }
    let mut values = *reference;
    if flags & F_IP_ID != 0 {
        values.ip_id = reference.ip_id.wrapping_add(r.u16()?);
        if values.ip_id == 0 {
            return None;
        }
    } else {
        values.ip_id = 0;
    }
    let res = if flags & F_TCP_RES != 0 {
        match r.byte()? {
            v @ 1..=0x0f => v,
            _ => return None,
        }
    } else {
        0
    };
    values.seq = reference
        .seq
        .wrapping_add(take_be(r, usize::from((d & D_SEQ) >> 6) + 1)?);
    values.ack = reference
        .ack
        .wrapping_add(take_be(r, ACK_LENS[usize::from((d & D_ACK) >> 4)])?);
    if d & D_WINDOW != 0 {
        values.window = r.u16()?;
    }
    let csum = if d & D_CSUM != 0 {
        let c = r.take(2)?;
        Some([c[0], c[1]])
    } else {
        None
    };
    let urgent = match flags & F_URGENT {
        0 => [0, 0],
        _ => match r.take(2)? {
            [0, 0] => return None,
            u => [u[0], u[1]],
        },
    };
    let mut options: &[u8] = &[];
    if flags & F_TS != 0 {
        let n = if d & D_TSVAL4 != 0 { 4 } else { 2 };
        values.tsval = reference.tsval.wrapping_add(take_be(r, n)?);
        let n = if d & D_TSECR4 != 0 { 4 } else { 2 };
        values.tsecr = reference.tsecr.wrapping_add(take_be(r, n)?);
    } else {
        values.tsval = 0;
        values.tsecr = 0;
        if flags & F_OPTIONS != 0 {
            let n = usize::from(r.byte()?);
            if n == 0 || n > 40 || !n.is_multiple_of(4) {
                return None;
            }
            options = r.take(n)?;
        }
    }
    Some(Fields {
        flags,
        tcp_flags,
        values,
        res,
        urgent,
        csum,
        options,
    })
}

/// Length of a delta packet's fields (after the context id) and its TCP flags, read without a
/// reference (for `is_pure_tcp_ack`); `None` if they run past the end.
pub(super) fn fields_len(data: &[u8]) -> Option<(usize, u8)> {
    let (&flags, &d, &tcp_flags) = (data.first()?, data.get(1)?, data.get(2)?);
    let mut n = 3 + usize::from((d & D_SEQ) >> 6) + 1 + ACK_LENS[usize::from((d & D_ACK) >> 4)];
    n += if flags & F_IP_ID != 0 { 2 } else { 0 };
    n += if flags & F_TCP_RES != 0 { 1 } else { 0 };
    n += if d & D_WINDOW != 0 { 2 } else { 0 };
    n += if d & D_CSUM != 0 { 2 } else { 0 };
    n += if flags & F_URGENT != 0 { 2 } else { 0 };
    if flags & F_TS != 0 {
        n += if d & D_TSVAL4 != 0 { 4 } else { 2 };
        n += if d & D_TSECR4 != 0 { 4 } else { 2 };
    } else if flags & F_OPTIONS != 0 {
        n += 1 + usize::from(*data.get(n)?);
    }
    (n <= data.len()).then_some((n, tcp_flags))
}

/// The TS option's two values, when the options are exactly NOP, NOP, TIMESTAMP.
pub(super) fn timestamps(options: &[u8]) -> Option<(u32, u32)> {
    if options.len() == 12 && options[..4] == TS_OPTIONS {
        let v = |i: usize| {
            u32::from_be_bytes([options[i], options[i + 1], options[i + 2], options[i + 3]])
        };
        Some((v(4), v(8)))
    } else {
        None
    }
}
