//! The receive window a TCP sender behind this end is told, clamped to what the bundle can
//! carry: a number of bandwidth-delay products of the bundle (its links' rates summed, times the
//! inner flows' round trip through it), [`CLAMP_BDPS`] at first, then as the bundle's queue
//! says ([`WindowClamp::follow`]: more while the queue drains, less while it stands), never
//! below [`CLAMP_MIN_BYTES`].
//!
//! Why. Delay equalisation gives every inner flow the slowest waited-for link's round trip, so
//! its bandwidth-delay product is large (50/20/7 Mbit/s at 10/60/150 ms: 1.5 MB at a 160 ms round
//! trip). Linux's BBR (v1) leaves its start-up only on rounds whose delivery samples are not
//! application-limited, and Linux takes a sender whose whole send buffer is in flight for
//! application-limited (`tcp_rate_check_app_limited`: nothing unsent, fewer packets in flight
//! than the window). Start-up's window, 2.89 products, is more than the default send buffer
//! (`tcp_wmem`, 4 MB of buffer) holds there, so the sender stays in start-up for good, pacing
//! at 2.89 times its estimate, with as much in flight as its buffer holds: 230 ms of standing
//! queue in the bundle's queue before any failure, and when the fastest link is lost the same
//! bytes are a second of queue on the links left, where every drop stalls the flow for that
//! second (lab, ratio7, BBR download, the 50 Mbit/s link lost: stalls of 1.1-1.3 s every 2.5 s;
//! BENCHMARKS.md §4, "The window the sender is told"). A window clamped below what the buffer
//! holds makes the sender window-limited instead, with data still unsent, which Linux does not
//! call application-limited: BBR sees its bandwidth stop growing and leaves start-up as over
//! any other path. A loss-based sender (CUBIC) limited by the window keeps at most the window
//! less a product queued, and no longer fills the queue until it drops.
//!
//! How. The window field of every segment the peer's hosts send towards ours (acknowledgements
//! of the data we carry) is lowered to the clamp, the TCP checksum updated in place (RFC 1624);
//! a larger window is never announced, and a segment with SYN is never touched (its window is
//! not scaled). The field is in units of the window scale the *peer's* host announced in its SYN
//! or SYN-ACK (RFC 7323); scaling holds only if both SYNs carried the option, so a flow is
//! clamped only once its scale is known for sure: the peer's SYN-ACK carries it (sent only in
//! answer to a SYN that did), or the peer's SYN did and our host's SYN-ACK, which passes through
//! this end the other way, did too. A flow whose handshake this end did not see (begun before
//! the session) is left alone. The flows' scales live in a table of [`FLOW_SLOTS`] entries of
//! 16 bytes (64 KiB, made at the first handshake seen: a concentrator's idle clients pay
//! nothing), indexed by a keyed hash of the flow and tagged with the rest of the hash: memory
//! is fixed whatever the peer sends, and a collision only forgets a flow (left alone from then
//! on), since a flow is clamped only by an entry whose 64-bit tag is its own.
//!
//! Written here rather than taken from a crate: no maintained crate rewrites TCP windows in
//! flight (`etherparse` and `pnet` parse and build headers, but the change is two bytes and an
//! incremental checksum, and the parse is `inner`'s bounds-checked reading already).
//!
//! A window lowered below what the peer's host had announced shrinks its right edge now and
//! then (the clamp falls when a link is lost); RFC 9293 (3.8.6) asks senders to cope, and
//! Linux's does: it sends nothing beyond the new edge until the acknowledgements pass it.

use std::hash::{BuildHasher, RandomState};
use std::time::{Duration, Instant};

use crate::inner::{self, tcp_options};

/// The clamp at first, in bandwidth-delay products of the bundle at the flows' round trip (its
/// base, and two round trips of the fastest link more while the peer asks for repairs; from
/// there it follows the bundle's queue, [`WindowClamp::follow`]): BBR's own
/// window in steady state is two products (it keeps about 1.25 in flight), so the clamp binds
/// only on a sender beyond that, BBR in start-up (2.89) above all, and when a link is lost: the
/// clamp falls with the rates at once. It must stay below what the sender's buffer keeps in
/// flight, or it changes nothing: about 3.3 MB in ratio7, 2.15 of its products. At 1.5 products
/// of the base round trip alone the flows starved whenever the round trip swung (lab, BBR
/// download over 2 x 20 Mbit/s with 1.5% loss on one: 92.4 -> 81.6% of the sum; 2 x 10 Mbit/s
/// with 2% on the faster: 84.8 -> 71.3%; LTE 91.6 -> 89.7%).
pub const CLAMP_BDPS: f64 = 2.0;
/// The clamp after a link was lost, for [`AFTER_LOSS_ROUND_TRIPS`]: every sender overshoots the
/// capacity left for a while (BBR keeps the old rate in its filter for ten rounds), so what it
/// keeps in flight is the window, and two products of the links left queued a round trip in
/// the bundle: losing ratio7's 50 Mbit/s link stalled the flows 486-511 ms (BBR) and 505-506
/// (CUBIC); at 1.25 products, what BBR keeps in flight when it probes, 240-287 and 403-405 ms
/// (lab; 1.1-1.3 s without the clamp).
pub const AFTER_LOSS_BDPS: f64 = 1.25;
/// How long after a link was lost the clamp is [`AFTER_LOSS_BDPS`], in inner round trips: BBR's
/// bandwidth filter spans ten of its rounds, up to four round trips each while it overshoots
/// (as `bqueue::STANDING_AFTER_LOSS_ROUND_TRIPS`).
pub const AFTER_LOSS_ROUND_TRIPS: u32 = 40;
/// The least window the clamp announces, so that a slow bundle or a short round trip never makes
/// a flow wait on its acknowledgements: on 1+2+3 Mbit/s at 10 ms the base round trip is 22 ms
/// but the 1 Mbit/s link's packets take 12 ms each and cross its planned queue, and a CUBIC
/// upload held to 64 KiB carried 93.0% of the sum against 93.9 unclamped.
pub const CLAMP_MIN_BYTES: u32 = 128 * 1024;
/// The clamp follows the bundle's queue between these many products ([`WindowClamp::follow`]),
/// from [`CLAMP_BDPS`]: ...
pub const FOLLOW_MIN_BDPS: f64 = 1.25;
/// ... and these (about 6 MB at ratio7's 50+20+7 Mbit/s and 160 ms; a sender in start-up
/// fills the queue, which brings the clamp down within a few round trips).
pub const FOLLOW_MAX_BDPS: f64 = 4.0;
/// A look at the queue spans at least a round trip; when no bulk packet left the queue or
/// passed it sooner than this share of the round trip while the clamp lowered windows, the
/// clamp grows by [`FOLLOW_GROW_BDPS`] ...
pub const FOLLOW_DRAINED_SHARE: u32 = 8;
pub const FOLLOW_GROW_BDPS: f64 = 0.125;
/// ... and when every bulk packet waited more than this share of a round trip, it shrinks
/// to [`FOLLOW_SHRINK`] of itself.
pub const FOLLOW_STOOD_SHARE: u32 = 2;
pub const FOLLOW_SHRINK: f64 = 0.875;
/// After the peer's last NACK, the flows' round trip is taken to include a repair's for this
/// long (a link losing at random NACKs many times a second).
pub const REPAIRING_FOR: Duration = Duration::from_secs(2);
/// Flows whose window scale is known at once (a power of two).
pub const FLOW_SLOTS: usize = 4096;

const TCP: u8 = 6;
const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const RST: u8 = 0x04;
/// TCP option kind: window scale.
const OPT_WSCALE: u8 = 3;
/// TCP options that sign the header, window included (RFC 2385's MD5 signature, RFC 5925's
/// TCP-AO: BGP sessions carry them): a segment with either is never changed.
const OPT_MD5SIG: u8 = 19;
const OPT_TCP_AO: u8 = 29;
/// RFC 7323: a larger shift is taken as 14.
const MAX_SHIFT: u8 = 14;

/// A TCP flow as the peer's hosts send it: their address and port first.
#[derive(Debug, Clone, Copy, Hash)]
struct FlowKey {
    peer_addr: [u8; 16],
    local_addr: [u8; 16],
    peer_port: u16,
    local_port: u16,
}

/// A flow's entry: its hash (0: none), its peer host's window scale, and whether scaling is
/// known to be on (or known off: `shift` 0).
#[derive(Debug, Clone, Copy, Default)]
struct Flow {
    tag: u64,
    shift: u8,
    known: bool,
}

/// A TCP segment's place in its IP packet.
struct Segment {
    /// The flow, addresses and ports in the order the packet carries them (source first).
    src: [u8; 16],
    dst: [u8; 16],
    sport: u16,
    dport: u16,
    /// Where the TCP header starts, and its length.
    at: usize,
    header_len: usize,
    flags: u8,
}

/// Reads the TCP header of an IPv4 or IPv6 (no extension headers) first fragment
/// ([`inner::transport_span`]).
fn segment(packet: &[u8]) -> Option<Segment> {
    let (TCP, at, end) = inner::transport_span(packet)? else {
        return None;
    };
    let mut src = [0u8; 16];
    let mut dst = [0u8; 16];
    if packet[0] >> 4 == 6 {
        src.copy_from_slice(&packet[8..24]);
        dst.copy_from_slice(&packet[24..40]);
    } else {
        src[..4].copy_from_slice(&packet[12..16]);
        dst[..4].copy_from_slice(&packet[16..20]);
    }
    let tcp = &packet[at..end];
    let header_len = usize::from(tcp.get(12)? >> 4) * 4;
    if header_len < 20 || header_len > tcp.len() {
        return None;
    }
    Some(Segment {
        src,
        dst,
        sport: u16::from_be_bytes([tcp[0], tcp[1]]),
        dport: u16::from_be_bytes([tcp[2], tcp[3]]),
        at,
        header_len,
        flags: tcp[13],
    })
}

/// The window scale a SYN's options announce (`None`: no option, or a malformed list).
fn window_scale(options: &[u8]) -> Option<u8> {
    for option in tcp_options(options) {
        match option {
            Ok((OPT_WSCALE, &[shift])) => return Some(shift.min(MAX_SHIFT)),
            Ok((OPT_WSCALE, _)) | Err(()) => return None,
            Ok(_) => {}
        }
    }
    None
}

/// Whether TCP options carry a signature of the header ([`OPT_MD5SIG`], [`OPT_TCP_AO`]); a
/// malformed list counts as signed (left alone).
fn signed(options: &[u8]) -> bool {
    tcp_options(options).any(|o| matches!(o, Err(()) | Ok((OPT_MD5SIG | OPT_TCP_AO, _))))
}

/// RFC 1624's update of a one's-complement checksum `sum` when a 16-bit word of what it covers
/// changes from `old` to `new`: HC' = ~(~HC + ~m + m').
fn checksum_update(sum: u16, old: u16, new: u16) -> u16 {
    let mut s = u32::from(!sum) + u32::from(!old) + u32::from(new);
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// The window clamp's state: the flows' window scales and counters (see the module's docs).
#[derive(Debug)]
pub struct WindowClamp {
    /// [`FLOW_SLOTS`] entries once a handshake was seen, none before.
    flows: Vec<Flow>,
    hasher: RandomState,
    /// The clamp in force, bytes (`None`: none now; [`clamp_bytes`]).
    pub cap: Option<u32>,
    /// Segments whose window was lowered.
    pub clamped: u64,
    /// Handshakes whose scale was learned.
    pub flows_learned: u64,
    /// The peer's NACKs counted at the last look, and until when it is taken to be repairing.
    nacks_seen: u64,
    repairing_until: Option<Instant>,
    /// When a link was last lost ([`AFTER_LOSS_BDPS`]).
    lost_at: Option<Instant>,
    /// The clamp's size in products as it follows the bundle's queue ([`Self::follow`]).
    follow_bdps: f64,
    /// When the current look at the queue began, and [`Self::clamped`] then.
    look_from: Option<(Instant, u64)>,
}

impl Default for WindowClamp {
    fn default() -> Self {
        WindowClamp {
            flows: Vec::new(),
            hasher: RandomState::new(),
            cap: None,
            clamped: 0,
            flows_learned: 0,
            nacks_seen: 0,
            repairing_until: None,
            lost_at: None,
            follow_bdps: CLAMP_BDPS,
            look_from: None,
        }
    }
}

impl WindowClamp {
    /// The flow's tag (never 0) and its slot.
    fn place(&self, key: &FlowKey) -> (u64, usize) {
        let tag = self.hasher.hash_one(key).max(1);
        (tag, (tag >> 32) as usize & (FLOW_SLOTS - 1))
    }

    /// The entry of `key`'s flow, if the table has it.
    fn flow_mut(&mut self, key: &FlowKey) -> Option<&mut Flow> {
        let (tag, i) = self.place(key);
        self.flows.get_mut(i).filter(|f| f.tag == tag)
    }

    /// A segment our host sends to the peer's (read from the TUN device): its SYN-ACK tells
    /// whether scaling is on for a flow the peer's host opened.
    pub fn outbound(&mut self, packet: &[u8]) {
        // The flags first: every packet comes here, few are SYN-ACKs.
        let Some(s) = segment(packet) else {
            return;
        };
        if s.flags & (SYN | ACK | RST) != SYN | ACK {
            return;
        }
        let key = FlowKey {
            peer_addr: s.dst,
            local_addr: s.src,
            peer_port: s.dport,
            local_port: s.sport,
        };
        let declined = window_scale(&packet[s.at + 20..s.at + s.header_len]).is_none();
        if let Some(f) = self.flow_mut(&key).filter(|f| !f.known) {
            if declined {
                // Our host declined scaling: the peer's windows are unscaled.
                f.shift = 0;
            }
            f.known = true;
            self.flows_learned += 1;
        }
    }

    /// Whether the peer asks for repairs lately (its NACKs, `nacks` so far, came within the
    /// last [`REPAIRING_FOR`]): its holes then hold deliveries a repair's round trip, which
    /// the flows' window must cover.
    pub fn repairing(&mut self, now: Instant, nacks: u64) -> bool {
        if nacks != self.nacks_seen {
            self.nacks_seen = nacks;
            self.repairing_until = Some(now + REPAIRING_FOR);
        }
        self.repairing_until.is_some_and(|t| now < t)
    }

    /// A link was lost at `now`: the clamp is [`AFTER_LOSS_BDPS`] products for a while.
    pub fn link_lost(&mut self, now: Instant) {
        self.lost_at = Some(now);
    }

    /// Every link lost is back (a busy link's false silence, a jittery link's among them, ends
    /// at its next packet): the clamp is [`CLAMP_BDPS`] again. Kept tight after such a silence,
    /// LTE's mix (30 Mbit/s at 30 ms with 20 ms of jitter beside 10 at 15 ms) lost 1.1 points
    /// of a BBR download.
    pub fn links_back(&mut self) {
        self.lost_at = None;
    }

    /// The clamp's size in bandwidth-delay products at `now`, the inner round trip `rtt`:
    /// [`AFTER_LOSS_BDPS`] within [`AFTER_LOSS_ROUND_TRIPS`] of a link's loss, else as it
    /// follows the bundle's queue ([`Self::follow`]; [`CLAMP_BDPS`] at first).
    pub fn products(&self, now: Instant, rtt: Duration) -> f64 {
        if self.after_loss(now, rtt) {
            AFTER_LOSS_BDPS
        } else {
            self.follow_bdps
        }
    }

    /// Within [`AFTER_LOSS_ROUND_TRIPS`] of a link's loss.
    fn after_loss(&self, now: Instant, rtt: Duration) -> bool {
        let tight = rtt * AFTER_LOSS_ROUND_TRIPS;
        self.lost_at.is_some_and(|t| now < t + tight)
    }

    /// The clamp follows the bundle's queue, looked at once a round trip `rtt` or more at `now`;
    /// `least_wait` gives the least wait of a bulk packet that left the queue or passed it since
    /// the last look (`None`: none did) and starts its count afresh.
    ///
    /// Two products of the base round trip bind a sender whose round trip swings beyond it
    /// (lab, LTE's 30 Mbit/s at 30 ms with 20 ms of jitter beside 10 at 15 ms, a CUBIC upload:
    /// held to 280 kB, 34.6 of the 40 Mbit/s, the bundle's queue empty), and they sit just under
    /// what a BBR sender in start-up keeps in flight where the base is long (ratio7: 3.08 MB
    /// against its 3.3 MB buffer), so that the bundle's queue stands a round trip and BBR left
    /// its start-up in some runs only. The bundle's queue tells which: while the clamp lowers
    /// windows and the queue drains within a look, the flows want more than the window lets
    /// them send and the links take it, so the clamp grows ([`FOLLOW_GROW_BDPS`]); while every
    /// packet of a look waits more than half a round trip, what the window lets the flows send
    /// only queues, so it shrinks ([`FOLLOW_SHRINK`]). A sender the window limits then lets the
    /// queue fall below half a round trip at least once a look, whatever its kind (ratio7: a
    /// median of 0.6-0.7 round trips queued under CUBIC, 1.1-1.3 before; 0.3 under BBR, 0.6-0.8
    /// before; BENCHMARKS.md §4, "The window follows the bundle's queue"). Not within a link's
    /// loss ([`AFTER_LOSS_BDPS`] holds, and the senders' overshoot fills the queue whatever the
    /// window).
    pub fn follow(
        &mut self,
        now: Instant,
        rtt: Duration,
        least_wait: impl FnOnce() -> Option<Duration>,
    ) {
        let (from, clamped_then) = *self.look_from.get_or_insert((now, self.clamped));
        if now.saturating_duration_since(from) < rtt {
            return;
        }
        self.look_from = Some((now, self.clamped));
        let Some(least) = least_wait() else {
            return;
        };
        if self.cap.is_none() || self.after_loss(now, rtt) {
            return;
        }
        if least > rtt / FOLLOW_STOOD_SHARE {
            self.follow_bdps = (self.follow_bdps * FOLLOW_SHRINK).max(FOLLOW_MIN_BDPS);
        } else if least <= rtt / FOLLOW_DRAINED_SHARE && self.clamped > clamped_then {
            self.follow_bdps = (self.follow_bdps + FOLLOW_GROW_BDPS).min(FOLLOW_MAX_BDPS);
        }
    }

    /// [`Self::inbound`] with the clamp in force ([`Self::cap`]).
    pub fn delivered(&mut self, packet: &mut [u8]) -> bool {
        self.inbound(packet, self.cap)
    }

    /// A segment the peer's host sends to ours (about to be written to the TUN device): a SYN
    /// teaches the flow's scale; any other segment with ACK has its window lowered to `cap`
    /// bytes (`None`: no clamp now) if its flow's scale is known. True if the packet changed.
    pub fn inbound(&mut self, packet: &mut [u8], cap: Option<u32>) -> bool {
        let Some(s) = segment(packet) else {
            return false;
        };
        let key = FlowKey {
            peer_addr: s.src,
            local_addr: s.dst,
            peer_port: s.sport,
            local_port: s.dport,
        };
        if s.flags & RST != 0 {
            return false;
        }
        let options = &packet[s.at + 20..s.at + s.header_len];
        if signed(options) {
            // A signed connection (BGP's): never changed, so its scale need not be kept.
            return false;
        }
        if s.flags & SYN != 0 {
            let scale = window_scale(options);
            let syn_ack = s.flags & ACK != 0;
            let (tag, i) = self.place(&key);
            let flow = Flow {
                tag,
                shift: scale.unwrap_or(0),
                // A SYN-ACK with the option answers a SYN with it; one without it (or a SYN
                // without it) turns scaling off. A SYN with it waits for our host's answer.
                known: syn_ack || scale.is_none(),
            };
            if flow.known {
                self.flows_learned += 1;
            }
            if self.flows.is_empty() {
                self.flows = vec![Flow::default(); FLOW_SLOTS];
            }
            self.flows[i] = flow;
            return false;
        }
        let Some(cap) = cap else {
            return false;
        };
        if s.flags & ACK == 0 {
            return false;
        }
        let Some(&mut flow) = self.flow_mut(&key).filter(|f| f.known) else {
            return false;
        };
        let field = (cap.max(CLAMP_MIN_BYTES) >> flow.shift).clamp(1, 0xffff) as u16;
        let w = s.at + 14;
        let old = u16::from_be_bytes([packet[w], packet[w + 1]]);
        if old <= field {
            return false;
        }
        packet[w..w + 2].copy_from_slice(&field.to_be_bytes());
        let c = s.at + 16;
        let sum = u16::from_be_bytes([packet[c], packet[c + 1]]);
        packet[c..c + 2].copy_from_slice(&checksum_update(sum, old, field).to_be_bytes());
        self.clamped += 1;
        true
    }
}

/// The clamp for a bundle carrying `rate_bps` at an inner round trip of `rtt_s` seconds:
/// `products` bandwidth-delay products ([`WindowClamp::products`]), at least
/// [`CLAMP_MIN_BYTES`]; `None` when the rate or the round trip is unknown.
pub fn clamp_bytes(rate_bps: f64, rtt_s: f64, products: f64) -> Option<u32> {
    if !(rate_bps > 0.0 && rtt_s > 0.0 && rate_bps.is_finite() && rtt_s.is_finite()) {
        return None;
    }
    let bytes = rate_bps / 8.0 * rtt_s * products;
    Some(bytes.clamp(f64::from(CLAMP_MIN_BYTES), f64::from(u32::MAX)) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An IPv4 TCP segment from 198.18.0.2:5201 to 198.18.1.2:40000 with a valid checksum.
    fn tcp4(flags: u8, window: u16, options: &[u8], payload: &[u8]) -> Vec<u8> {
        tcp4_from(
            [198, 18, 0, 2],
            5201,
            [198, 18, 1, 2],
            40000,
            flags,
            window,
            options,
            payload,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn tcp4_from(
        src: [u8; 4],
        sport: u16,
        dst: [u8; 4],
        dport: u16,
        flags: u8,
        window: u16,
        options: &[u8],
        payload: &[u8],
    ) -> Vec<u8> {
        assert_eq!(options.len() % 4, 0);
        let tcp_len = 20 + options.len() + payload.len();
        let total = 20 + tcp_len;
        let mut p = vec![0u8; total];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[8] = 64;
        p[9] = TCP;
        p[12..16].copy_from_slice(&src);
        p[16..20].copy_from_slice(&dst);
        let c = inner::ipv4_checksum(&p[..20]);
        p[10..12].copy_from_slice(&c.to_be_bytes());
        let t = &mut p[20..];
        t[0..2].copy_from_slice(&sport.to_be_bytes());
        t[2..4].copy_from_slice(&dport.to_be_bytes());
        t[12] = (((20 + options.len()) / 4) << 4) as u8;
        t[13] = flags;
        t[14..16].copy_from_slice(&window.to_be_bytes());
        t[20..20 + options.len()].copy_from_slice(options);
        t[20 + options.len()..].copy_from_slice(payload);
        let sum = inner::sum16(&p[20..], inner::pseudo_sum(&p, false, TCP, tcp_len));
        let c = !inner::fold16(sum);
        p[36..38].copy_from_slice(&c.to_be_bytes());
        p
    }

    /// The same flow's segment as our host sends it (addresses and ports swapped).
    fn tcp4_back(flags: u8, options: &[u8]) -> Vec<u8> {
        tcp4_from(
            [198, 18, 1, 2],
            40000,
            [198, 18, 0, 2],
            5201,
            flags,
            64240,
            options,
            &[],
        )
    }

    fn checksum_ok(p: &[u8]) -> bool {
        let tcp_len = p.len() - 20;
        inner::fold16(inner::sum16(
            &p[20..],
            inner::pseudo_sum(p, false, TCP, tcp_len),
        )) == 0xffff
    }

    fn window(p: &[u8]) -> u16 {
        u16::from_be_bytes([p[34], p[35]])
    }

    /// MSS 1460, NOP, window scale `shift`.
    fn syn_options(shift: u8) -> [u8; 8] {
        [2, 4, 0x05, 0xb4, 1, 3, 3, shift]
    }

    #[test]
    fn the_peers_syn_ack_teaches_the_scale_and_acks_are_clamped_with_the_checksum_kept() {
        let mut c = WindowClamp::default();
        let mut syn_ack = tcp4(SYN | ACK, 65160, &syn_options(7), &[]);
        assert!(
            !c.inbound(&mut syn_ack, Some(100_000)),
            "a SYN is never changed"
        );
        // 3000 x 128 = 384000 bytes announced; the clamp 256000 -> field 2000.
        let mut ack = tcp4(ACK, 3000, &[], &[]);
        assert!(c.inbound(&mut ack, Some(256_000)));
        assert_eq!(window(&ack), 2000);
        assert!(checksum_ok(&ack));
        assert_eq!(c.clamped, 1);
        // A segment with data and ACK too; a window under the clamp stays.
        let mut data = tcp4(ACK, 3000, &[], b"hello, world");
        assert!(c.inbound(&mut data, Some(256_000)));
        assert!(checksum_ok(&data));
        let mut small = tcp4(ACK, 1000, &[], &[]);
        let before = small.clone();
        assert!(!c.inbound(&mut small, Some(256_000)));
        assert_eq!(small, before);
        // No clamp now: nothing changes.
        let mut ack = tcp4(ACK, 3000, &[], &[]);
        assert!(!c.inbound(&mut ack, None));
        assert_eq!(window(&ack), 3000);
    }

    #[test]
    fn a_peers_syn_waits_for_our_syn_ack_to_know_the_scale() {
        let mut c = WindowClamp::default();
        let mut syn = tcp4(SYN, 64240, &syn_options(9), &[]);
        c.inbound(&mut syn, Some(100_000));
        let mut ack = tcp4(ACK, 5000, &[], &[]);
        assert!(!c.inbound(&mut ack, Some(100_000)), "scale not known yet");
        c.outbound(&tcp4_back(SYN | ACK, &syn_options(7)));
        assert!(c.inbound(&mut ack, Some(100_000 << 1)));
        assert_eq!(window(&ack), (200_000u32 >> 9) as u16);
        assert!(checksum_ok(&ack));

        // Our host declined scaling: the peer's windows are unscaled.
        let mut c = WindowClamp::default();
        let mut syn = tcp4(SYN, 64240, &syn_options(9), &[]);
        c.inbound(&mut syn, None);
        c.outbound(&tcp4_back(SYN | ACK, &[2, 4, 0x05, 0xb4]));
        let mut ack = tcp4(ACK, 65535, &[], &[]);
        assert!(
            !c.inbound(&mut ack, Some(100_000)),
            "the least clamp, 128 KiB, is more than any unscaled window"
        );
        assert_eq!(window(&ack), 65535);
    }

    /// A segment signed with TCP-MD5 or TCP-AO (BGP sessions) would fail its signature if
    /// changed: it is left alone, and so is a SYN carrying either (its flow is not learned).
    #[test]
    fn signed_segments_are_never_changed() {
        let mut c = WindowClamp::default();
        let mut syn_ack = tcp4(SYN | ACK, 65160, &syn_options(7), &[]);
        c.inbound(&mut syn_ack, None);
        // MD5 signature option: kind 19, length 18, padded with two NOPs to 20 bytes.
        let mut md5 = vec![1, 1, 19, 18];
        md5.extend_from_slice(&[0xab; 16]);
        let mut ack = tcp4(ACK, 3000, &md5, &[]);
        let before = ack.clone();
        assert!(!c.inbound(&mut ack, Some(100_000)));
        assert_eq!(ack, before);
        // TCP-AO: kind 29, length 16, key ids and a 12-byte MAC.
        let mut ao = vec![29, 16, 1, 1];
        ao.extend_from_slice(&[0xcd; 12]);
        let mut ack = tcp4(ACK, 3000, &ao, &[]);
        assert!(!c.inbound(&mut ack, Some(100_000)));
        // A signed SYN-ACK teaches nothing: the plain ACKs after it stay untouched too.
        let mut c = WindowClamp::default();
        let mut opts = syn_options(7).to_vec();
        opts.extend_from_slice(&md5);
        let mut syn_ack = tcp4(SYN | ACK, 65160, &opts, &[]);
        c.inbound(&mut syn_ack, None);
        let mut ack = tcp4(ACK, 3000, &[], &[]);
        assert!(!c.inbound(&mut ack, Some(100_000)));
        assert!(signed(&[8, 1]), "a malformed list counts as signed");
        assert!(!signed(&[1, 1, 8, 10, 0, 0, 0, 0, 0, 0, 0, 0]));
    }

    #[test]
    fn the_least_clamp_is_128_kib_and_a_flow_not_seen_opening_is_left_alone() {
        let mut c = WindowClamp::default();
        let mut syn_ack = tcp4(SYN | ACK, 65160, &syn_options(2), &[]);
        c.inbound(&mut syn_ack, None);
        let mut ack = tcp4(ACK, 60000, &[], &[]);
        assert!(c.inbound(&mut ack, Some(1000)));
        assert_eq!(u32::from(window(&ack)) << 2, CLAMP_MIN_BYTES);
        // Another flow (another port), never seen opening.
        let mut other = tcp4_from(
            [198, 18, 0, 2],
            5202,
            [198, 18, 1, 2],
            40000,
            ACK,
            60000,
            &[],
            &[],
        );
        assert!(!c.inbound(&mut other, Some(1000)));
    }

    #[test]
    fn odd_packets_are_left_alone_and_never_panic() {
        let mut c = WindowClamp::default();
        let mut syn_ack = tcp4(SYN | ACK, 65160, &syn_options(7), &[]);
        c.inbound(&mut syn_ack, None);
        let good = tcp4(ACK, 3000, &[], &[]);
        for cut in 0..good.len() {
            let mut p = good[..cut].to_vec();
            c.inbound(&mut p, Some(1));
            c.outbound(&p);
        }
        // A header length past the segment, a fragment, a bad option list.
        let mut p = good.clone();
        p[32] = 0xf0;
        assert!(!c.inbound(&mut p, Some(1)));
        let mut p = good.clone();
        p[7] = 1;
        assert!(!c.inbound(&mut p, Some(1)));
        let mut bad_syn = tcp4(SYN | ACK, 1, &[3, 0, 0, 0], &[]);
        c.inbound(&mut bad_syn, None);
        assert_eq!(window_scale(&[1, 1, 3, 3, 20]), Some(MAX_SHIFT));
        assert_eq!(window_scale(&[3, 9, 1]), None);
        assert_eq!(window_scale(&[0, 3, 3, 7]), None);
    }

    /// An IPv6 segment (2001:2::2 -> 2001:2:1::2) with a valid checksum.
    fn tcp6(flags: u8, window: u16, options: &[u8]) -> Vec<u8> {
        let tcp_len = 20 + options.len();
        let mut p = vec![0u8; 40 + tcp_len];
        p[0] = 0x60;
        p[4..6].copy_from_slice(&(tcp_len as u16).to_be_bytes());
        p[6] = TCP;
        p[7] = 64;
        p[8..12].copy_from_slice(&[0x20, 0x01, 0x00, 0x02]);
        p[23] = 2;
        p[24..28].copy_from_slice(&[0x20, 0x01, 0x00, 0x02]);
        p[29] = 1;
        p[39] = 2;
        let t = &mut p[40..];
        t[0..2].copy_from_slice(&443u16.to_be_bytes());
        t[2..4].copy_from_slice(&50000u16.to_be_bytes());
        t[12] = ((tcp_len / 4) << 4) as u8;
        t[13] = flags;
        t[14..16].copy_from_slice(&window.to_be_bytes());
        t[20..].copy_from_slice(options);
        let sum = inner::sum16(&p[40..], inner::pseudo_sum(&p, true, TCP, tcp_len));
        let c = !inner::fold16(sum);
        p[56..58].copy_from_slice(&c.to_be_bytes());
        p
    }

    #[test]
    fn ipv6_segments_are_clamped_too() {
        let mut c = WindowClamp::default();
        let mut syn_ack = tcp6(SYN | ACK, 65160, &syn_options(8));
        c.inbound(&mut syn_ack, None);
        let mut ack = tcp6(ACK, 4000, &[]);
        assert!(c.inbound(&mut ack, Some(512_000)));
        assert_eq!(u16::from_be_bytes([ack[54], ack[55]]), 2000);
        let sum = inner::sum16(&ack[40..], inner::pseudo_sum(&ack, true, TCP, 20));
        assert_eq!(inner::fold16(sum), 0xffff, "checksum still valid");
    }

    #[test]
    fn the_clamp_is_two_products_at_least_128_kib() {
        assert_eq!(clamp_bytes(80e6, 0.1, CLAMP_BDPS), Some(2_000_000));
        assert_eq!(clamp_bytes(80e6, 0.1, AFTER_LOSS_BDPS), Some(1_250_000));
        assert_eq!(clamp_bytes(1e6, 0.01, CLAMP_BDPS), Some(CLAMP_MIN_BYTES));
        assert_eq!(CLAMP_MIN_BYTES, 131_072);
        assert_eq!(clamp_bytes(0.0, 0.1, CLAMP_BDPS), None);
        assert_eq!(clamp_bytes(1e6, f64::NAN, CLAMP_BDPS), None);
        assert_eq!(clamp_bytes(1e15, 100.0, CLAMP_BDPS), Some(u32::MAX));
    }

    #[test]
    fn a_lost_link_tightens_the_clamp_for_forty_round_trips() {
        let t0 = Instant::now();
        let rtt = Duration::from_millis(100);
        let mut c = WindowClamp::default();
        assert_eq!(c.products(t0, rtt), CLAMP_BDPS);
        c.link_lost(t0);
        assert_eq!(
            c.products(t0 + Duration::from_millis(3999), rtt),
            AFTER_LOSS_BDPS
        );
        assert_eq!(c.products(t0 + Duration::from_secs(4), rtt), CLAMP_BDPS);
        c.link_lost(t0);
        c.links_back();
        assert_eq!(c.products(t0, rtt), CLAMP_BDPS, "the link is back");
    }

    /// One look at the queue each round trip: the clamp grows while windows are lowered and the
    /// queue drains, shrinks while the queue stands, and holds between, bounded both ways.
    #[test]
    fn the_clamp_follows_the_bundles_queue() {
        let t0 = Instant::now();
        let rtt = Duration::from_millis(100);
        let mut c = WindowClamp {
            cap: Some(1_000_000),
            ..WindowClamp::default()
        };
        let ms = Duration::from_millis;
        let mut t = t0;
        // The next look, a round trip on, `clamped` segments lowered since the last.
        let look = |c: &mut WindowClamp, t: &mut Instant, clamped: u64, least: Option<Duration>| {
            c.clamped += clamped;
            *t += rtt;
            c.follow(*t, rtt, || least);
            c.products(*t, rtt)
        };
        c.follow(t0, rtt, || panic!("the first look only starts"));
        let grown = CLAMP_BDPS + FOLLOW_GROW_BDPS;
        assert_eq!(
            look(&mut c, &mut t, 5, Some(ms(0))),
            grown,
            "bound and drained"
        );
        assert_eq!(
            look(&mut c, &mut t, 0, Some(ms(0))),
            grown,
            "drained, not bound"
        );
        assert_eq!(
            look(&mut c, &mut t, 5, Some(ms(13))),
            grown,
            "bound, waited over an eighth"
        );
        assert_eq!(look(&mut c, &mut t, 5, None), grown, "nothing sent");
        assert_eq!(look(&mut c, &mut t, 5, Some(ms(50))), grown, "waited half");
        assert_eq!(
            look(&mut c, &mut t, 5, Some(ms(51))),
            grown * FOLLOW_SHRINK,
            "stood"
        );
        for _ in 0..40 {
            look(&mut c, &mut t, 5, Some(ms(0)));
        }
        assert_eq!(c.products(t, rtt), FOLLOW_MAX_BDPS);
        for _ in 0..40 {
            look(&mut c, &mut t, 5, Some(ms(200)));
        }
        assert_eq!(c.products(t, rtt), FOLLOW_MIN_BDPS);
        // Less than a round trip after the last look: no look.
        let before = c.products(t, rtt);
        c.follow(t + ms(99), rtt, || panic!("no look"));
        // Within a link's loss the queue is not followed ...
        c.link_lost(t);
        assert_eq!(look(&mut c, &mut t, 5, Some(ms(0))), AFTER_LOSS_BDPS);
        t += rtt * AFTER_LOSS_ROUND_TRIPS;
        assert_eq!(
            c.products(t, rtt),
            before,
            "... and the clamp is back where it was"
        );
        // Nor without a clamp in force.
        c.cap = None;
        assert_eq!(look(&mut c, &mut t, 5, Some(ms(0))), before);
    }

    /// The table is made at the first handshake, and an ACK alone makes nothing.
    #[test]
    fn the_table_costs_nothing_until_a_handshake() {
        let mut c = WindowClamp::default();
        let mut ack = tcp4(ACK, 3000, &[], &[]);
        c.inbound(&mut ack, Some(100_000));
        c.outbound(&tcp4_back(SYN | ACK, &syn_options(7)));
        assert!(c.flows.is_empty());
        let mut syn = tcp4(SYN, 64240, &syn_options(9), &[]);
        c.inbound(&mut syn, None);
        assert_eq!(c.flows.len(), FLOW_SLOTS);
    }

    #[test]
    fn the_peers_nacks_count_as_repairs_for_two_seconds() {
        let t0 = Instant::now();
        let mut c = WindowClamp::default();
        assert!(!c.repairing(t0, 0));
        assert!(c.repairing(t0, 3));
        assert!(c.repairing(t0 + Duration::from_millis(1999), 3));
        assert!(!c.repairing(t0 + REPAIRING_FOR, 3));
        assert!(c.repairing(t0 + REPAIRING_FOR, 4), "a new NACK");
    }

    #[test]
    fn the_incremental_checksum_matches_a_full_one() {
        for (w0, w1) in [(65535u16, 1u16), (1, 65535), (0x8000, 0x7fff), (1234, 1234)] {
            let a = tcp4(ACK, w0, &[], b"xyz");
            let b = tcp4(ACK, w1, &[], b"xyz");
            let sum = u16::from_be_bytes([a[36], a[37]]);
            let want = u16::from_be_bytes([b[36], b[37]]);
            let got = checksum_update(sum, w0, w1);
            // 0x0000 and 0xffff are the same one's-complement value.
            assert!(got == want || (got ^ want) == 0xffff && (got == 0 || got == 0xffff));
        }
    }
}
