//! Fragmentation of inner packets that do not fit a link, and their reassembly, as Multilink PPP
//! does it (RFC 1990): a packet too big for the path is cut into pieces, each piece is a DATA packet
//! of its own with its own bundle sequence number, the pieces may cross different links, and the
//! receiver's reorder buffer puts them back in order like any other packet. The first piece is
//! marked *first*, the last *last*; a packet is whole again when the pieces from a *first* to a
//! *last* arrive with consecutive sequence numbers.
//!
//! Because the reorder buffer already orders, bounds and times out what it holds, the reassembler
//! needs almost no state: one packet in progress. A gap in the sequence (a piece lost, or skipped
//! by the reorder buffer) ends the packet in progress and drops it, so pieces of two packets are
//! never glued together. Memory is bounded by [`Reassembler::new`]'s limit on a packet's size, and a
//! packet in progress is dropped if its next piece takes longer than the timeout given to
//! [`Reassembler::poll`].

use std::ops::Range;
use std::time::{Duration, Instant};

use crate::wire::{FLAG_CONT, FLAG_MORE};

/// The place of a piece in its packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece {
    /// A packet that was not cut.
    Whole,
    First,
    Middle,
    Last,
}

impl Piece {
    /// The DATA header flags that mark this piece (docs/protocol.md §2.1).
    pub const fn flags(self) -> u8 {
        match self {
            Piece::Whole => 0,
            Piece::First => FLAG_MORE,
            Piece::Middle => FLAG_MORE | FLAG_CONT,
            Piece::Last => FLAG_CONT,
        }
    }

    /// The piece a DATA packet's flags mark (other flags ignored).
    pub fn from_flags(flags: u8) -> Piece {
        match (flags & FLAG_MORE != 0, flags & FLAG_CONT != 0) {
            (false, false) => Piece::Whole,
            (true, false) => Piece::First,
            (true, true) => Piece::Middle,
            (false, true) => Piece::Last,
        }
    }
}

/// Cuts a packet of `len` bytes into pieces of at most `max` bytes, of equal size (to a byte), so
/// that no piece is a runt that costs a packet's overhead for a few bytes. One piece, `Whole`, if
/// the packet fits.
///
/// # Panics
/// If `max` is 0.
pub fn split(len: usize, max: usize) -> impl Iterator<Item = (Range<usize>, Piece)> {
    assert!(max > 0, "a piece must hold at least one byte");
    let n = len.div_ceil(max).max(1);
    let (size, rest) = (len / n, len % n);
    // The first `rest` pieces take one byte more.
    (0..n).map(move |i| {
        let start = i * size + i.min(rest);
        let end = start + size + usize::from(i < rest);
        let piece = match (i, n) {
            (_, 1) => Piece::Whole,
            (0, _) => Piece::First,
            (i, n) if i == n - 1 => Piece::Last,
            _ => Piece::Middle,
        };
        (start..end, piece)
    })
}

/// Counters, for status and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Packets put back together from pieces.
    pub reassembled: u64,
    /// Packets in progress dropped: a piece missing, the timeout, or a piece out of place.
    pub dropped_incomplete: u64,
    /// Pieces dropped because no packet was in progress to take them.
    pub dropped_orphans: u64,
    /// Packets dropped for growing past the size limit.
    pub dropped_oversize: u64,
}

/// The receiving side: fed the pieces in the order the reorder buffer delivers them.
pub struct Reassembler {
    max_packet: usize,
    /// The packet in progress: its bytes so far, the sequence number its next piece must have,
    /// and when its last piece came.
    partial: Option<(Vec<u8>, u64, Instant)>,
    stats: Stats,
}

impl Reassembler {
    /// `max_packet`: the largest packet it rebuilds (the tunnel's MTU).
    pub fn new(max_packet: usize) -> Reassembler {
        Reassembler {
            max_packet,
            partial: None,
            stats: Stats::default(),
        }
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Bytes held for the packet in progress.
    pub fn held(&self) -> usize {
        self.partial.as_ref().map_or(0, |(b, _, _)| b.len())
    }

    /// Takes the piece with bundle sequence number `seq`. Returns the packet it completes, if any
    /// (`Whole` pieces are returned as they are, and end any packet in progress).
    pub fn push(&mut self, now: Instant, seq: u64, piece: Piece, bytes: &[u8]) -> Option<Vec<u8>> {
        let continues = matches!(self.partial, Some((_, next, _)) if next == seq);
        match piece {
            Piece::Whole | Piece::First => {
                self.abandon();
                if piece == Piece::Whole {
                    return Some(bytes.to_vec());
                }
                if bytes.len() > self.max_packet {
                    self.stats.dropped_oversize += 1;
                    return None;
                }
                self.partial = Some((bytes.to_vec(), seq.wrapping_add(1), now));
                None
            }
            Piece::Middle | Piece::Last if !continues => {
                self.abandon();
                self.stats.dropped_orphans += 1;
                None
            }
            Piece::Middle | Piece::Last => {
                let (buf, next, at) = self.partial.as_mut()?;
                if buf.len() + bytes.len() > self.max_packet {
                    self.partial = None;
                    self.stats.dropped_oversize += 1;
                    return None;
                }
                buf.extend_from_slice(bytes);
                *next = seq.wrapping_add(1);
                *at = now;
                if piece == Piece::Middle {
                    return None;
                }
                self.stats.reassembled += 1;
                self.partial.take().map(|(b, _, _)| b)
            }
        }
    }

    /// Drops the packet in progress if its last piece came more than `timeout` ago.
    pub fn poll(&mut self, now: Instant, timeout: Duration) {
        if let Some((_, _, at)) = self.partial {
            if now.saturating_duration_since(at) > timeout {
                self.abandon();
            }
        }
    }

    /// Drops the packet in progress, if any (a whole packet came between its pieces, or the
    /// session changed).
    pub fn abandon(&mut self) {
        if self.partial.take().is_some() {
            self.stats.dropped_incomplete += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn piece_flags_round_trip() {
        for p in [Piece::Whole, Piece::First, Piece::Middle, Piece::Last] {
            assert_eq!(Piece::from_flags(p.flags() | 0x03), p);
        }
        assert_eq!(Piece::First.flags(), 0x04);
        assert_eq!(Piece::Last.flags(), 0x08);
    }

    #[test]
    fn split_cuts_even_pieces_and_marks_them() {
        let pieces: Vec<_> = split(3000, 1400).collect();
        assert_eq!(
            pieces,
            vec![
                (0..1000, Piece::First),
                (1000..2000, Piece::Middle),
                (2000..3000, Piece::Last)
            ]
        );
        assert_eq!(
            split(1400, 1400).collect::<Vec<_>>(),
            vec![(0..1400, Piece::Whole)]
        );
        assert_eq!(
            split(0, 1400).collect::<Vec<_>>(),
            vec![(0..0, Piece::Whole)]
        );
        let p: Vec<_> = split(1401, 1400).map(|(r, _)| r.len()).collect();
        assert_eq!(p, vec![701, 700]);
    }

    #[test]
    fn a_gap_drops_the_packet_in_progress_and_never_glues_two_packets() {
        let now = Instant::now();
        let mut r = Reassembler::new(1500);
        assert_eq!(r.push(now, 10, Piece::First, b"ab"), None);
        // Piece 11 (the last of this packet) and 12 (the first of the next) are lost.
        assert_eq!(r.push(now, 13, Piece::Last, b"yz"), None);
        assert_eq!(r.stats().dropped_incomplete, 1);
        assert_eq!(r.stats().dropped_orphans, 1);
        assert_eq!(r.push(now, 14, Piece::First, b"a"), None);
        assert_eq!(r.push(now, 15, Piece::Middle, b"b"), None);
        assert_eq!(r.push(now, 16, Piece::Last, b"c"), Some(b"abc".to_vec()));
        assert_eq!(r.push(now, 17, Piece::Whole, b"w"), Some(b"w".to_vec()));
        assert_eq!(r.held(), 0);
    }

    #[test]
    fn memory_is_bounded_and_stale_pieces_time_out() {
        let now = Instant::now();
        let mut r = Reassembler::new(100);
        r.push(now, 1, Piece::First, &[0; 60]);
        assert_eq!(r.push(now, 2, Piece::Middle, &[0; 60]), None);
        assert_eq!(r.stats().dropped_oversize, 1);
        assert_eq!(r.held(), 0);
        r.push(now, 3, Piece::First, &[0; 10]);
        r.poll(now + Duration::from_millis(100), Duration::from_millis(500));
        assert_eq!(r.held(), 10);
        r.poll(now + Duration::from_secs(1), Duration::from_millis(500));
        assert_eq!(r.held(), 0);
        assert_eq!(r.push(now, 4, Piece::Last, b"x"), None);
    }

    proptest! {
        /// Packets cut into pieces, delivered in sequence order with arbitrary pieces lost: every
        /// packet that comes out is one that went in, byte for byte, and every packet none of
        /// whose pieces was lost comes out.
        #[test]
        fn what_comes_out_went_in(
            sizes in prop::collection::vec(0usize..5000, 1..30),
            max in 1usize..1500,
            lost in prop::collection::vec(any::<bool>(), 0..400),
        ) {
            let now = Instant::now();
            let mut r = Reassembler::new(5000);
            let mut seq = 1000u64;
            let mut lost = lost.into_iter().chain(std::iter::repeat(false));
            for (k, &size) in sizes.iter().enumerate() {
                let packet: Vec<u8> = (0..size).map(|i| (i * 7 + k * 13) as u8).collect();
                let mut complete = true;
                let mut got = None;
                for (range, piece) in split(size, max) {
                    seq += 1;
                    if lost.next().unwrap() {
                        complete = false;
                        continue;
                    }
                    if let Some(p) = r.push(now, seq, piece, &packet[range]) {
                        got = Some(p);
                    }
                }
                match got {
                    Some(p) => prop_assert_eq!(&p, &packet),
                    None => prop_assert!(!complete, "packet {} lost though all pieces came", k),
                }
            }
            prop_assert!(r.held() <= 5000);
        }
    }
}
