//! The sender's side of in-tunnel loss repair: a bounded ring of recently sent ordered DATA
//! packets, from which a NACKed sequence number is sent again (on another link), and from which
//! what was in flight on a link that died is reinjected on the others.
//!
//! The ring is ordered by bundle sequence number (packets enter in the order they are
//! numbered) and bounded twice: by bytes ([`RingConfig::max_bytes`]) and by age (a packet older
//! than [`SentRing::set_max_age`] is of no use: the receiver gave up on it long ago). Buffers of
//! evicted packets are kept for reuse, so a steady flow allocates nothing per packet.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::frag::Piece;
use crate::LinkId;

/// Bounds of the ring.
#[derive(Debug, Clone)]
pub struct RingConfig {
    /// Inner packet bytes held at most. Default 8 MiB.
    pub max_bytes: usize,
    /// Age bound before the endpoint sets one from the links' round trips. Default 1 s.
    pub max_age: Duration,
}

impl Default for RingConfig {
    fn default() -> Self {
        RingConfig {
            max_bytes: 8 << 20,
            max_age: Duration::from_secs(1),
        }
    }
}

/// One packet sent.
#[derive(Debug)]
pub struct Sent {
    pub seq: u64,
    /// The link it went out on first.
    pub link: LinkId,
    /// Its link seq there (the low 32 bits of that link's counter), which a LINK-NACK names.
    pub link_seq: u32,
    pub at: Instant,
    /// When it was last sent again (answers to NACKs are rate-limited by it).
    pub resent_at: Option<Instant>,
    /// Copies sent so far (answers to NACKs and reinjections).
    pub resends: u32,
    /// The inner IP packet (its DATA payload), or a piece of it.
    pub packet: Vec<u8>,
    /// Its piece flags ([`crate::frag::Piece::flags`]), sent again with it.
    pub flags: u8,
    /// The outer ECN field it went with (its inner packet's), which its copies take too.
    pub ecn: u8,
}

/// Spare buffers kept at most.
const SPARE_MAX: usize = 1024;

pub struct SentRing {
    cfg: RingConfig,
    max_age: Duration,
    entries: VecDeque<Sent>,
    bytes: usize,
    spare: Vec<Vec<u8>>,
}

impl SentRing {
    pub fn new(cfg: RingConfig) -> Self {
        SentRing {
            max_age: cfg.max_age,
            cfg,
            entries: VecDeque::new(),
            bytes: 0,
            spare: Vec::new(),
        }
    }

    /// Packets older than `age` are dropped (on the next `push` or `expire`).
    pub fn set_max_age(&mut self, age: Duration) {
        self.max_age = age;
    }
    pub fn max_age(&self) -> Duration {
        self.max_age
    }

    /// Remembers `packet`, sent at `now` as `seq` on `link`, and returns its entry. Sequence
    /// numbers must grow (a lower or equal one is ignored). A packet larger than the byte bound
    /// is not kept.
    pub fn push(
        &mut self,
        now: Instant,
        seq: u64,
        link: LinkId,
        packet: &[u8],
    ) -> Option<&mut Sent> {
        if self.entries.back().is_some_and(|e| e.seq >= seq) || packet.len() > self.cfg.max_bytes {
            return None;
        }
        self.expire(now);
        while self.bytes + packet.len() > self.cfg.max_bytes {
            self.evict_front();
        }
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(packet);
        self.bytes += buf.len();
        self.entries.push_back(Sent {
            seq,
            link,
            link_seq: 0,
            at: now,
            resent_at: None,
            resends: 0,
            packet: buf,
            ecn: 0,
            flags: 0,
        });
        self.entries.back_mut()
    }

    /// Appends to `out`, in sequence order, the packets first sent on `link` with a link seq in
    /// `first .. first + count` (modulo 2^32). Scans from the newest back to the first packet
    /// of `link` sent before `first`: a loss is named soon after it, so only the last round
    /// trip's packets are looked at.
    pub fn lost_on(&self, link: LinkId, first: u32, count: u16, out: &mut Vec<u64>) {
        let start = out.len();
        for e in self.entries.iter().rev().filter(|e| e.link == link) {
            let past = e.link_seq.wrapping_sub(first);
            if past < u32::from(count) {
                out.push(e.seq);
            } else if past > u32::MAX / 2 {
                // Before `first`: so is everything older on this link.
                break;
            }
        }
        out[start..].reverse();
    }

    /// Drops packets older than the age bound.
    pub fn expire(&mut self, now: Instant) {
        while self
            .entries
            .front()
            .is_some_and(|e| now.saturating_duration_since(e.at) > self.max_age)
        {
            self.evict_front();
        }
    }

    /// Forgets every packet (a new session: its sequence numbers and link seqs start over, and
    /// the old session's packets must neither answer its NACKs nor keep its packets out, since
    /// [`push`](Self::push) takes only growing sequence numbers).
    pub fn clear(&mut self) {
        while !self.entries.is_empty() {
            self.evict_front();
        }
    }

    fn evict_front(&mut self) {
        if let Some(e) = self.entries.pop_front() {
            self.bytes -= e.packet.len();
            if self.spare.len() < SPARE_MAX {
                self.spare.push(e.packet);
            }
        }
    }

    /// The packet sent as `seq`, if still held. Sequence numbers are usually consecutive: the
    /// entry is then found at its offset from the oldest, else by binary search.
    pub fn get_mut(&mut self, seq: u64) -> Option<&mut Sent> {
        let first = self.entries.front()?.seq;
        let guess = usize::try_from(seq.checked_sub(first)?).ok();
        let i = match guess.filter(|&g| self.entries.get(g).is_some_and(|e| e.seq == seq)) {
            Some(g) => g,
            None => self.entries.binary_search_by_key(&seq, |e| e.seq).ok()?,
        };
        self.entries.get_mut(i)
    }

    /// Sequence numbers first sent on `link` at or after `since` (appended to `out`): those
    /// sent at or after `first` first, then the older ones, each part oldest first (a
    /// reinjection's order: see `Endpoint::reinject`).
    pub fn sent_on(&self, link: LinkId, since: Instant, first: Instant, out: &mut Vec<u64>) {
        let start = self.entries.partition_point(|e| e.at < since);
        let mut cut = self.entries.partition_point(|e| e.at < first).max(start);
        // A packet cut in pieces stays whole in one part: its first piece sent after a later
        // one would arrive after the receiver gave it up, and the whole packet would be lost.
        while cut > start
            && self
                .entries
                .get(cut)
                .is_some_and(|e| matches!(Piece::from_flags(e.flags), Piece::Middle | Piece::Last))
        {
            cut -= 1;
        }
        let on = |e: &Sent| (e.link == link).then_some(e.seq);
        out.extend(self.entries.range(cut..).filter_map(on));
        out.extend(self.entries.range(start..cut).filter_map(on));
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    /// Inner packet bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn finds_packets_by_seq_and_link() {
        let t0 = Instant::now();
        let mut r = SentRing::new(RingConfig::default());
        for seq in 0..10u64 {
            r.push(
                t0 + ms(seq),
                seq * 2,
                (seq % 2) as LinkId,
                &[seq as u8; 100],
            );
        }
        assert_eq!(r.len(), 10);
        assert_eq!(r.get_mut(6).unwrap().packet, vec![3u8; 100]);
        assert!(r.get_mut(7).is_none());
        // A sequence number that does not grow is ignored.
        r.push(t0 + ms(20), 18, 0, &[1]);
        assert_eq!(r.len(), 10);
        let mut on1 = Vec::new();
        r.sent_on(1, t0 + ms(4), t0 + ms(4), &mut on1);
        assert_eq!(on1, vec![10, 14, 18]);
        // Those sent from 7 ms on first, then the older ones, each part in order.
        on1.clear();
        r.sent_on(1, t0 + ms(2), t0 + ms(7), &mut on1);
        assert_eq!(on1, vec![14, 18, 6, 10]);
        // A `first` before `since` changes nothing.
        on1.clear();
        r.sent_on(1, t0 + ms(4), t0, &mut on1);
        assert_eq!(on1, vec![10, 14, 18]);
    }

    /// A cleared ring holds nothing and takes sequence numbers from 0 again.
    #[test]
    fn clear_forgets_everything_and_takes_low_numbers_again() {
        let t0 = Instant::now();
        let mut r = SentRing::new(RingConfig::default());
        for seq in 100..110u64 {
            r.push(t0, seq, 1, &[7; 50]);
        }
        assert!(r.push(t0, 3, 1, &[0]).is_none(), "lower numbers refused");
        r.clear();
        assert_eq!((r.len(), r.bytes()), (0, 0));
        assert!(r.get_mut(105).is_none());
        assert!(
            r.push(t0, 3, 1, &[0]).is_some(),
            "a new session's numbers kept"
        );
    }

    /// A LINK-NACK's run of link seqs names the packets of that link only, across the wrap of
    /// the 32-bit link seq; older packets of the link end the scan.
    #[test]
    fn lost_on_finds_a_links_packets_by_link_seq() {
        let t0 = Instant::now();
        let mut r = SentRing::new(RingConfig::default());
        // Link 1 numbered from u32::MAX - 2 on, link 2 interleaved with its own numbers.
        let mut next = [u32::MAX - 2, 100];
        for seq in 0..12u64 {
            let link = 1 + (seq % 2) as LinkId;
            let e = r.push(t0 + ms(seq), seq, link, &[0]).unwrap();
            e.link_seq = next[seq as usize % 2];
            next[seq as usize % 2] = next[seq as usize % 2].wrapping_add(1);
        }
        // Link 1's seqs 0, 2, 4, ... carry link seqs MAX-2, MAX-1, MAX, 0, 1, 2.
        let mut out = Vec::new();
        r.lost_on(1, u32::MAX - 1, 3, &mut out);
        assert_eq!(out, vec![2, 4, 6]);
        out.clear();
        r.lost_on(2, 103, 64, &mut out);
        assert_eq!(out, vec![7, 9, 11]);
        out.clear();
        r.lost_on(2, 200, 5, &mut out);
        assert!(out.is_empty(), "beyond what was sent");
        r.lost_on(3, 0, 64, &mut out);
        assert!(out.is_empty(), "no such link");
    }

    /// The two parts of a reinjection never split a packet cut in pieces.
    #[test]
    fn sent_on_keeps_the_pieces_of_a_packet_together() {
        let t0 = Instant::now();
        let mut r = SentRing::new(RingConfig::default());
        let pieces = [
            Piece::Whole,
            Piece::First,
            Piece::Middle,
            Piece::Last,
            Piece::Whole,
        ];
        for (seq, piece) in pieces.into_iter().enumerate() {
            let e = r.push(t0 + ms(seq as u64), seq as u64, 1, &[0]).unwrap();
            e.flags = piece.flags();
        }
        let mut out = Vec::new();
        // `first` falls on the middle piece (sent at 2 ms): the cut moves to the first (1 ms).
        r.sent_on(1, t0, t0 + ms(2), &mut out);
        assert_eq!(out, vec![1, 2, 3, 4, 0]);
        out.clear();
        r.sent_on(1, t0, t0 + ms(4), &mut out);
        assert_eq!(out, vec![4, 0, 1, 2, 3]);
    }

    /// Consecutive sequence numbers are found at their offset, the ones after a gap by search;
    /// `push` hands back the entry it made.
    #[test]
    fn finds_packets_across_a_gap_in_the_numbers() {
        let t0 = Instant::now();
        let mut r = SentRing::new(RingConfig::default());
        for seq in (3..8u64).chain(20..25) {
            let e = r.push(t0, seq, 1, &[seq as u8]).expect("kept");
            e.flags = seq as u8;
        }
        for seq in (3..8u64).chain(20..25) {
            let e = r.get_mut(seq).expect("held");
            assert_eq!((e.seq, e.flags, e.packet[0]), (seq, seq as u8, seq as u8));
        }
        for seq in [0, 2, 8, 12, 19, 25, u64::MAX] {
            assert!(r.get_mut(seq).is_none(), "{seq}");
        }
        assert!(r.push(t0, 24, 1, &[0]).is_none(), "not growing");
    }

    #[test]
    fn bounded_by_bytes_and_age() {
        let t0 = Instant::now();
        let mut r = SentRing::new(RingConfig {
            max_bytes: 1000,
            max_age: ms(50),
        });
        for seq in 0..100u64 {
            r.push(t0, seq, 0, &[0; 300]);
            assert!(r.bytes() <= 1000);
        }
        assert_eq!(r.len(), 3);
        assert!(r.get_mut(99).is_some() && r.get_mut(96).is_none());
        r.push(t0 + ms(40), 100, 0, &[0; 10]);
        r.expire(t0 + ms(51));
        assert_eq!(r.len(), 1);
        assert_eq!(r.bytes(), 10);
        // Too big for the ring: not kept.
        r.push(t0 + ms(52), 101, 0, &[0; 1001]);
        assert!(r.get_mut(101).is_none());
        // Buffers are reused: the spare list never exceeds its bound.
        assert!(r.spare.len() <= SPARE_MAX);
    }
}
