//! ICMP echo (what `ping -c COUNT -i INTERVAL -W TIMEOUT DST` measures), from a raw socket.
//!
//! The lab measures each emulated link's idle round trip and checks the tunnel with it; it used
//! to run the `ping` tool, a package a fresh machine lacks (the README's first command failed
//! there). A raw socket needs root, which the lab needs anyway; the unprivileged "ping socket"
//! (`SOCK_DGRAM`, `IPPROTO_ICMP`) would not do, since `net.ipv4.ping_group_range` is empty in a
//! new network namespace. Not `surge-ping`, the field's crate: it is built on a tokio runtime,
//! and the lab's few pings are synchronous calls on a thread inside a namespace. IPv4 only: the
//! lab's hosts are IPv4. Run it inside a namespace with [`crate::sysctl::in_netns`].

use std::io::{self, IoSliceMut};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use braid_core::inner::{fold16, sum16};
use nix::errno::Errno;
use nix::poll::{ppoll, PollFd, PollFlags};
use nix::sys::socket::{recvmsg, setsockopt, sockopt, ControlMessageOwned, MsgFlags};
use nix::sys::time::TimeSpec;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

const ECHO_REQUEST: u8 = 8;
const ECHO_REPLY: u8 = 0;
/// ICMP header (8) and payload (56): ping's default 64-byte message.
const MESSAGE_LEN: usize = 64;

/// The internet checksum (RFC 1071) of `data`: the project's one sum ([`braid_core::inner::sum16`]).
pub fn checksum(data: &[u8]) -> u16 {
    !fold16(sum16(data, 0))
}

/// An echo request: identifier `id`, sequence number `seq`.
pub fn echo_request(id: u16, seq: u16) -> [u8; MESSAGE_LEN] {
    let mut m = [0u8; MESSAGE_LEN];
    m[0] = ECHO_REQUEST;
    m[4..6].copy_from_slice(&id.to_be_bytes());
    m[6..8].copy_from_slice(&seq.to_be_bytes());
    for (i, b) in m[8..].iter_mut().enumerate() {
        *b = i as u8;
    }
    let c = checksum(&m);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    m
}

/// The sequence number of an echo reply to identifier `id` from `src`, read from what a raw
/// IPv4 socket receives (the IP header, then the ICMP message); `None` for anything else.
pub fn parse_reply(packet: &[u8], src: Ipv4Addr, id: u16) -> Option<u16> {
    let ihl = usize::from(*packet.first()? & 0x0f) * 4;
    if packet.first()? >> 4 != 4 || ihl < 20 || packet.len() < ihl + 8 {
        return None;
    }
    let from = Ipv4Addr::new(packet[12], packet[13], packet[14], packet[15]);
    let icmp = &packet[ihl..];
    let ok = from == src
        && icmp[0] == ECHO_REPLY
        && icmp[1] == 0
        && u16::from_be_bytes([icmp[4], icmp[5]]) == id
        && checksum(icmp) == 0;
    ok.then(|| u16::from_be_bytes([icmp[6], icmp[7]]))
}

/// When each request went: for the round trip, the monotonic clock (deadlines) and the wall
/// clock (the kernel stamps a reply's arrival on it, as `ping` reads it: `SO_TIMESTAMPNS`).
type Sent = Option<(Instant, SystemTime)>;

/// Sends `count` echo requests to `dst`, `interval` apart, and waits for each reply up to
/// `timeout` after its request. Returns each request's round trip (`None`: no reply in time),
/// in order. A round trip runs from the send to the kernel's arrival stamp of the reply, so a
/// late wake-up of this thread does not lengthen it.
pub fn ping(
    dst: Ipv4Addr,
    count: u16,
    interval: Duration,
    timeout: Duration,
) -> io::Result<Vec<Option<Duration>>> {
    let start = Instant::now();
    interval
        .checked_mul(u32::from(count))
        .and_then(|d| d.checked_add(timeout))
        .and_then(|d| start.checked_add(d))
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "ping: too long a run"))?;
    static NEXT: AtomicU16 = AtomicU16::new(0);
    // Every ICMP message of the namespace reaches a raw socket: the identifier tells ours.
    let id = (std::process::id() as u16).wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed));
    let sock = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4))?;
    setsockopt(&sock, sockopt::ReceiveTimestampns, &true)?;
    let to = SockAddr::from(SocketAddrV4::new(dst, 0));
    let mut sent: Vec<Sent> = vec![None; usize::from(count)];
    let mut rtts: Vec<Option<Duration>> = vec![None; usize::from(count)];
    let mut next = 0u16;
    loop {
        let now = Instant::now();
        let send_at = (next < count).then(|| start + interval * u32::from(next));
        if send_at.is_some_and(|t| now >= t) {
            sent[usize::from(next)] = Some((now, SystemTime::now()));
            // A request the kernel refuses (no route yet) simply gets no reply.
            let _ = sock.send_to(&echo_request(id, next), &to);
            next += 1;
            continue;
        }
        // The earliest deadline of a request still waiting for its reply.
        let waiting = sent
            .iter()
            .zip(&rtts)
            .filter_map(|(s, r)| s.filter(|_| r.is_none()).map(|(at, _)| at + timeout))
            .filter(|&deadline| deadline > now)
            .min();
        let Some(wake) = [send_at, waiting].into_iter().flatten().min() else {
            break; // all sent, none waiting
        };
        let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLIN)];
        match ppoll(&mut fds, Some(TimeSpec::from_duration(wake - now)), None) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
        receive(&sock, dst, id, timeout, &sent, &mut rtts)?;
    }
    Ok(rtts)
}

/// Reads every message waiting on `sock`, noting the round trip of each reply of ours.
fn receive(
    sock: &Socket,
    dst: Ipv4Addr,
    id: u16,
    timeout: Duration,
    sent: &[Sent],
    rtts: &mut [Option<Duration>],
) -> io::Result<()> {
    let mut buf = [0u8; 1500];
    let mut cmsg = nix::cmsg_space!(TimeSpec);
    loop {
        let (n, stamp) = {
            let mut iov = [IoSliceMut::new(&mut buf)];
            let msg = match recvmsg::<()>(
                sock.as_raw_fd(),
                &mut iov,
                Some(&mut cmsg),
                MsgFlags::MSG_DONTWAIT,
            ) {
                Ok(m) => m,
                Err(Errno::EAGAIN) => return Ok(()),
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            };
            let stamp = msg.cmsgs().ok().and_then(|mut c| {
                c.find_map(|m| match m {
                    ControlMessageOwned::ScmTimestampns(ts) => {
                        let ns = u32::try_from(ts.tv_nsec()).ok()?;
                        Some(UNIX_EPOCH + Duration::new(u64::try_from(ts.tv_sec()).ok()?, ns))
                    }
                    _ => None,
                })
            });
            (msg.bytes, stamp)
        };
        let Some(seq) = parse_reply(&buf[..n], dst, id) else {
            continue;
        };
        let (Some(Some((at, wall))), Some(r)) =
            (sent.get(usize::from(seq)), rtts.get_mut(usize::from(seq)))
        else {
            continue;
        };
        let by_clock = at.elapsed();
        // The kernel's stamp, unless the wall clock stepped meanwhile.
        let rtt = stamp
            .and_then(|s| s.duration_since(*wall).ok())
            .filter(|&d| d <= by_clock)
            .unwrap_or(by_clock);
        if r.is_none() && rtt <= timeout {
            *r = Some(rtt);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_of_a_known_message() {
        // RFC 1071's example words 0x0001 0xf203 0xf4f5 0xf6f7: sum 0xddf2, checksum 0x220d.
        assert_eq!(
            checksum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
            0x220d
        );
        // A message carrying its checksum sums to zero; an odd byte is padded with a zero.
        let m = echo_request(0x1234, 7);
        assert_eq!(checksum(&m), 0);
        assert_eq!(checksum(&[0xff]), !0xff00);
        // Long input: the carries fold, nothing overflows.
        assert_eq!(checksum(&[0xff; 300_000]), 0);
    }

    /// An IPv4 header from `src`, then `icmp`.
    fn ip(src: Ipv4Addr, icmp: &[u8]) -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, 1, 0, 0];
        p.extend_from_slice(&src.octets());
        p.extend_from_slice(&[198, 18, 0, 1]);
        p.extend_from_slice(icmp);
        p
    }

    fn reply(id: u16, seq: u16) -> Vec<u8> {
        let mut m = echo_request(id, seq).to_vec();
        m[0] = ECHO_REPLY;
        m[2..4].copy_from_slice(&[0, 0]);
        let c = checksum(&m);
        m[2..4].copy_from_slice(&c.to_be_bytes());
        m
    }

    #[test]
    fn only_our_replies_from_the_destination_count() {
        let dst = Ipv4Addr::new(198, 18, 0, 2);
        assert_eq!(parse_reply(&ip(dst, &reply(9, 3)), dst, 9), Some(3));
        // Another pinger's identifier, another source, our own request, a bad checksum.
        assert_eq!(parse_reply(&ip(dst, &reply(8, 3)), dst, 9), None);
        assert_eq!(
            parse_reply(&ip(Ipv4Addr::new(198, 18, 0, 3), &reply(9, 3)), dst, 9),
            None
        );
        assert_eq!(parse_reply(&ip(dst, &echo_request(9, 3)), dst, 9), None);
        let mut bad = reply(9, 3);
        bad[10] ^= 1;
        assert_eq!(parse_reply(&ip(dst, &bad), dst, 9), None);
        // Truncated or not IPv4: nothing, no panic.
        let p = ip(dst, &reply(9, 3));
        for n in 0..p.len() {
            let _ = parse_reply(&p[..n], dst, 9);
        }
        assert_eq!(parse_reply(&[0x60; 40], dst, 9), None);
        assert_eq!(parse_reply(&[0x4f; 30], dst, 9), None);
    }

    #[test]
    fn loopback_answers_every_request() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: a raw socket needs root");
            return;
        }
        let rtts = ping(
            Ipv4Addr::LOCALHOST,
            3,
            Duration::from_millis(10),
            Duration::from_secs(2),
        )
        .unwrap();
        assert_eq!(rtts.len(), 3);
        assert!(
            rtts.iter()
                .all(|r| r.is_some_and(|d| d < Duration::from_secs(1))),
            "{rtts:?}"
        );
    }
}
