//! Batched UDP sockets for links: bound to an address and/or an interface (`SO_BINDTODEVICE`),
//! large kernel buffers, non-blocking, and batch I/O with `recvmmsg`/`sendmmsg` (as
//! wireguard-go's `conn.Bind` and quinn-udp do): one system call moves up to [`BATCH`] messages.
//!
//! Both UDP offloads, each with a fallback where the kernel or the path refuses it:
//! - GSO on send ([`UdpSocket::send_batch`]): runs of equal datagrams to one peer go as one
//!   message with `UDP_SEGMENT`; `EIO`/`EINVAL` turns it off for the socket.
//! - GRO on receive ([`BindOptions::gro`], [`UdpSocket::recv_batch`]): the kernel may hand over
//!   a run of datagrams of one flow as one message of up to 64 KiB with a `UDP_GRO` control
//!   message giving the segment size; [`gro_split`] cuts it back into datagrams. A kernel
//!   without `UDP_GRO` (before 5.0) refuses the option and delivers one datagram per message.
//!
//! Arrival stamps ([`BindOptions::timestamps`], `SO_TIMESTAMPNS`): each message carries the
//! kernel's receive time, which [`ReadClock`] and [`Reading::arrival`] place on the monotonic clock, so
//! that one-way delays leave out how late the process came to read (quinn-udp does not read
//! them).
//!
//! Why hand-written rather than `quinn-udp` (which does recvmmsg, GSO, GRO and pktinfo too):
//! quinn-udp sends one `sendmsg` per transmit, where braid packs several GSO runs (one per link
//! peer, or cut by a short datagram) into one `sendmmsg`; it wants the caller's `IoSliceMut`s and
//! `RecvMeta`s per call, where [`RecvBatch`] keeps its buffers, headers and datagram table across
//! calls (no allocation per batch) and hands datagrams out by index, or all at once as disjoint
//! slices (to be opened on several threads), for in-place decryption; and braid needs its error
//! policy (skip queued ICMP errors on connected link sockets, report the rest per batch) and
//! `SO_BINDTODEVICE`/forced buffer sizes, which quinn-udp leaves to the caller anyway. What is left
//! here is two system calls and their control messages, tested on loopback below.

use std::io;
use std::mem::MaybeUninit;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// Messages per `recvmmsg`/`sendmmsg` call (with GSO/GRO a message may carry up to 64 datagrams).
pub const BATCH: usize = 64;
/// Largest datagram we read (a UDP payload over IPv4 with a 1500..9000-byte MTU fits).
pub const MAX_DATAGRAM: usize = 9216;
/// Socket buffers we ask for (wireguard-go measured 4.08 -> 5.27 Gbit/s from 7 MB buffers).
pub const DEFAULT_BUFFER: usize = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum UdpError {
    #[error("interface {0} does not exist")]
    NoSuchDevice(String),
    #[error("cannot bind to interface {dev}: {source}")]
    BindDevice { dev: String, source: io::Error },
    #[error("cannot bind to {addr}: {source}")]
    Bind { addr: SocketAddr, source: io::Error },
    #[error("cannot connect to {addr}: {source}")]
    Connect { addr: SocketAddr, source: io::Error },
    #[error("cannot create UDP socket: {0}")]
    Socket(io::Error),
}

/// Where a link socket lives.
#[derive(Debug, Clone, Default)]
pub struct BindOptions {
    /// `SO_BINDTODEVICE`: send and receive only through this interface.
    pub dev: Option<String>,
    /// Local address (port 0: any port).
    pub addr: Option<SocketAddr>,
    /// Whether the socket is for IPv6 (when `addr` does not say).
    pub ipv6: bool,
    /// SO_SNDBUF / SO_RCVBUF wanted (root may exceed `net.core.*mem_max`).
    pub buffer_bytes: usize,
    /// Report each datagram's local (destination) address (`IP_PKTINFO` / `IPV6_RECVPKTINFO`),
    /// so that a socket bound to a wildcard address on a multi-homed host can answer from the
    /// address it was reached at (see [`Datagram::src`]).
    pub pktinfo: bool,
    /// Ask for UDP GRO on receive (`UDP_GRO`): the kernel may hand over a run of datagrams of
    /// one flow as one message, which [`UdpSocket::recv_batch`] cuts back into datagrams.
    pub gro: bool,
    /// Set Don't Fragment on what the socket sends (`IP_MTU_DISCOVER = IP_PMTUDISC_DO`; IPv6:
    /// `IPV6_MTU_DISCOVER = IPV6_PMTUDISC_DO` and `IPV6_DONTFRAG`): a datagram bigger than the
    /// route's MTU is refused with `EMSGSIZE` instead of being fragmented, and ICMP
    /// "fragmentation needed" lowers the route's MTU ([`UdpSocket::path_mtu`]). Path MTU
    /// discovery (`braid_core::pmtu`) needs it.
    pub dont_fragment: bool,
    /// Stamp each received message with the kernel's arrival time (`SO_TIMESTAMPNS`, see
    /// [`RecvDatagram::stamp`]): one-way delays measured from it leave out how long the
    /// datagram waited for the process, whose turn may be late by milliseconds on a busy host.
    /// (The kernel switches arrival stamping on from a work queue a moment after the first
    /// socket of the host asks; datagrams before that are stamped as they are read, which is
    /// what a caller without stamps assumes anyway.)
    pub timestamps: bool,
    /// Report each datagram's ECN field (`IP_RECVTOS`, and `IPV6_RECVTCLASS` on IPv6 sockets;
    /// see [`RecvDatagram::ecn`]): a tunnel passes a path's Congestion Experienced mark on to
    /// the packet it carried (RFC 6040).
    pub ecn: bool,
}

/// One datagram to send.
#[derive(Debug, Clone, Copy)]
pub struct Datagram<'a> {
    /// Destination; ignored on a connected socket.
    pub dst: Option<SocketAddr>,
    /// Source address to send from (`IP_PKTINFO`); `None`: the kernel chooses by route.
    pub src: Option<IpAddr>,
    /// The ECN field of its IP header (RFC 3168 values; the DSCP stays 0): set per message with
    /// `IP_TOS` / `IPV6_TCLASS`, so a GSO run holds one value.
    pub ecn: u8,
    pub payload: &'a [u8],
}

/// Control-message space per received message. The most the kernel writes here is 148 bytes
/// (a dual-stack socket with packet info receiving IPv4-mapped traffic: UDP_GRO 24, the
/// arrival stamp 32, IPV6_PKTINFO 40, IP_PKTINFO 32, IP_TOS 20); more than that, so that one
/// more option never silently cuts the others (the kernel drops what does not fit).
const CMSG_SPACE: usize = 256;
/// Receive buffer per message with UDP GRO: the kernel coalesces at most one IP packet's worth
/// (64 KiB) of datagrams of one flow into one message.
const GRO_BUF: usize = 65_536;

/// A non-blocking UDP socket with batch receive and send.
pub struct UdpSocket {
    sock: Socket,
    connected: Option<SocketAddr>,
    /// UDP GSO on send, until the path refuses it.
    gso: std::sync::atomic::AtomicBool,
    /// Headers and control buffers of `send_batch`, reused across calls.
    scratch: std::sync::Mutex<SendScratch>,
    /// UDP GRO on receive: the kernel took `UDP_GRO` (a kernel that refuses it hands out one
    /// datagram per message, as before).
    gro: bool,
    /// The ECN field is set on send, until the kernel refuses the control message (`EINVAL`:
    /// some kernels refuse `IP_TOS` on an IPv6 socket sending IPv4-mapped); then everything
    /// goes Not-ECT, as a tunnel without ECN sends.
    ecn: std::sync::atomic::AtomicBool,
    /// An IPv6 socket (its IPv4-mapped traffic takes IPv4's `IP_TOS`).
    ipv6: bool,
}

/// What one `sendmmsg` call needs besides the payloads: GSO runs, iovecs, addresses, control
/// buffers, headers. Kept across calls so that sending allocates nothing once warm.
#[derive(Default)]
struct SendScratch {
    groups: Vec<Group>,
    iovs: Vec<libc::iovec>,
    names: Vec<Option<SockAddr>>,
    ctrl: Vec<[u64; GSO_CMSG_SPACE / 8]>,
    hdrs: Vec<libc::mmsghdr>,
}

// SAFETY: the raw pointers in `iovs` and `hdrs` are written and used only inside one
// `send_batch` call (under the socket's lock) and never dereferenced afterwards.
unsafe impl Send for SendScratch {}

/// Buffers for one `recvmmsg` call, reused across calls: one buffer per message, big enough
/// for a GRO-coalesced run of datagrams, and the table of datagrams cut from them. Nothing is
/// allocated per call.
pub struct RecvBatch {
    bufs: Vec<Vec<u8>>,
    /// Per message: its source, its local (destination) address.
    addrs: Vec<Option<SocketAddr>>,
    locals: Vec<Option<IpAddr>>,
    /// Per message: the kernel's arrival stamp (with [`BindOptions::timestamps`]).
    stamps: Vec<Option<SystemTime>>,
    /// Per message: its IP header's ECN field (with [`BindOptions::ecn`]; 0 otherwise).
    ecns: Vec<u8>,
    /// u64 words: control messages must be aligned like `cmsghdr`.
    ctrl: Vec<[u64; CMSG_SPACE / 8]>,
    names: Vec<libc::sockaddr_storage>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    /// Datagrams of the last receive: (message, start, length) within that message's buffer.
    datagrams: Vec<(usize, usize, usize)>,
    /// Messages the last receive filled.
    messages: usize,
    stats: RecvStats,
    /// The last transient error skipped while receiving (ICMP port/host unreachable reported
    /// on a connected socket): it says why a peer does not answer.
    last_error: Option<io::Error>,
}

// SAFETY: the raw pointers in `iovs` and `hdrs` point only into this batch's own heap buffers
// (`bufs`, `names`, `ctrl`, `iovs`), are rewritten before every `recvmmsg`, and are never
// dereferenced by Rust code; moving the batch to another thread moves those buffers with it.
unsafe impl Send for RecvBatch {}

/// Counters of the receive path, summed over every call with this batch.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RecvStats {
    /// Messages that carried several datagrams coalesced by the kernel (UDP GRO)...
    pub gro_messages: u64,
    /// ... and the datagrams cut from them.
    pub gro_datagrams: u64,
}

impl Default for RecvBatch {
    fn default() -> Self {
        Self::new(BATCH)
    }
}

impl RecvBatch {
    /// Buffers for `n` messages per call (each up to 64 KiB: a GRO run of up to 64 datagrams).
    pub fn new(n: usize) -> Self {
        // SAFETY: sockaddr_storage, iovec and mmsghdr are plain old data; zeroed is valid.
        let zero_name: libc::sockaddr_storage = unsafe { MaybeUninit::zeroed().assume_init() };
        let zero_hdr: libc::mmsghdr = unsafe { MaybeUninit::zeroed().assume_init() };
        RecvBatch {
            bufs: (0..n).map(|_| vec![0u8; GRO_BUF]).collect(),
            addrs: vec![None; n],
            locals: vec![None; n],
            stamps: vec![None; n],
            ecns: vec![0; n],
            ctrl: vec![[0u64; CMSG_SPACE / 8]; n],
            names: vec![zero_name; n],
            iovs: vec![
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0
                };
                n
            ],
            hdrs: vec![zero_hdr; n],
            datagrams: Vec::with_capacity(n * GSO_MAX_SEGMENTS),
            messages: 0,
            stats: RecvStats::default(),
            last_error: None,
        }
    }
    /// Datagrams of the last receive (GRO runs already cut into their datagrams).
    pub fn len(&self) -> usize {
        self.datagrams.len()
    }
    pub fn is_empty(&self) -> bool {
        self.datagrams.is_empty()
    }
    /// Messages one receive can take.
    pub fn capacity(&self) -> usize {
        self.bufs.len()
    }
    /// Whether the last receive filled every message: more may be waiting.
    pub fn is_full(&self) -> bool {
        self.messages == self.bufs.len()
    }
    pub fn stats(&self) -> RecvStats {
        self.stats
    }
    /// Takes the last transient receive error (e.g. "connection refused": nothing listens at the
    /// connected peer's port).
    pub fn take_error(&mut self) -> Option<io::Error> {
        self.last_error.take()
    }
    /// The local address datagram `i` was sent to (only with [`BindOptions::pktinfo`]).
    pub fn local(&self, i: usize) -> Option<IpAddr> {
        let &(m, _, _) = self.datagrams.get(i)?;
        self.locals[m]
    }
    /// The kernel's arrival stamp of datagram `i` (only with [`BindOptions::timestamps`]; the
    /// datagrams of one GRO run share their message's).
    pub fn stamp(&self, i: usize) -> Option<SystemTime> {
        let &(m, _, _) = self.datagrams.get(i)?;
        self.stamps[m]
    }
    /// The ECN field of datagram `i`'s IP header (only with [`BindOptions::ecn`]; 0 otherwise;
    /// the datagrams of one GRO run share their message's: the kernel coalesces only datagrams
    /// of one TOS).
    pub fn ecn(&self, i: usize) -> u8 {
        self.datagrams.get(i).map_or(0, |&(m, _, _)| self.ecns[m])
    }
    /// Datagram `i` of the last receive: its source and (mutable, for in-place decryption) bytes.
    pub fn get_mut(&mut self, i: usize) -> Option<(SocketAddr, &mut [u8])> {
        let &(m, start, len) = self.datagrams.get(i)?;
        let addr = self.addrs[m]?;
        Some((addr, &mut self.bufs[m][start..start + len]))
    }
    /// Every datagram of the last receive in order, as disjoint mutable slices that may all be
    /// held at once (parts of the batch can then be opened on different threads), each with
    /// its source and local address.
    pub fn datagrams_mut(&mut self) -> DatagramsMut<'_> {
        DatagramsMut {
            table: self.datagrams.iter(),
            bufs: self.bufs.iter_mut().enumerate(),
            addrs: &self.addrs,
            locals: &self.locals,
            stamps: &self.stamps,
            ecns: &self.ecns,
            rest: None,
        }
    }
}

/// One datagram of a receive, borrowed from the [`RecvBatch`] alongside all the others (see
/// [`RecvBatch::datagrams_mut`]).
#[derive(Debug)]
pub struct RecvDatagram<'a> {
    /// Its source address.
    pub from: SocketAddr,
    /// The local address it was sent to (only with [`BindOptions::pktinfo`]).
    pub local: Option<IpAddr>,
    /// When the kernel received it (only with [`BindOptions::timestamps`]; wall clock, as the
    /// kernel stamps it: [`Reading::arrival`] turns it into an [`Instant`]).
    pub stamp: Option<SystemTime>,
    /// Its IP header's ECN field (only with [`BindOptions::ecn`]; 0 otherwise).
    pub ecn: u8,
    /// Its bytes, mutable for in-place decryption.
    pub bytes: &'a mut [u8],
}

/// The iterator of [`RecvBatch::datagrams_mut`]. The batch's table lists each message's
/// datagrams in order, front to back, so each one is cut off the front of what is left of its
/// message's buffer (`split_at_mut`): the slices are disjoint by construction, with no unsafe
/// code.
pub struct DatagramsMut<'a> {
    table: std::slice::Iter<'a, (usize, usize, usize)>,
    bufs: std::iter::Enumerate<std::slice::IterMut<'a, Vec<u8>>>,
    addrs: &'a [Option<SocketAddr>],
    locals: &'a [Option<IpAddr>],
    stamps: &'a [Option<SystemTime>],
    ecns: &'a [u8],
    /// The message being cut: its index, the offset where its uncut rest starts, that rest.
    rest: Option<(usize, usize, &'a mut [u8])>,
}

impl<'a> Iterator for DatagramsMut<'a> {
    type Item = RecvDatagram<'a>;

    fn next(&mut self) -> Option<RecvDatagram<'a>> {
        loop {
            let &(m, start, len) = self.table.next()?;
            if !matches!(&self.rest, Some((i, ..)) if *i == m) {
                let (_, buf) = self.bufs.by_ref().find(|(i, _)| *i == m)?;
                self.rest = Some((m, 0, buf.as_mut_slice()));
            }
            let (_, at, rest) = self.rest.as_mut()?;
            // The table is made by `recv_batch` in order and within the buffers; were it not,
            // the iteration would end here rather than panic.
            let skip = start.checked_sub(*at)?;
            let whole = std::mem::take(rest);
            if whole.len() < skip + len {
                return None;
            }
            let (bytes, tail) = whole[skip..].split_at_mut(len);
            *rest = tail;
            *at = start + len;
            // A datagram without a source address is left out, as `get_mut` leaves it out.
            let Some(from) = self.addrs.get(m).copied().flatten() else {
                continue;
            };
            let local = self.locals.get(m).copied().flatten();
            let stamp = self.stamps.get(m).copied().flatten();
            let ecn = self.ecns.get(m).copied().unwrap_or(0);
            return Some(RecvDatagram {
                from,
                local,
                stamp,
                ecn,
                bytes,
            });
        }
    }
}

/// Where the datagrams of one received message lie: a message of `len` bytes with a GRO
/// segment size `segment` holds datagrams of `segment` bytes each, the last one possibly
/// shorter (the kernel coalesces only runs of one size, as the sender's GSO cut them). Without
/// a segment size (0), or one not smaller than `len`, the message is one datagram. An empty
/// message is one empty datagram (counted as malformed by the caller, never skipped unseen).
pub fn gro_split(len: usize, segment: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let step = if segment == 0 || segment >= len {
        len.max(1)
    } else {
        segment
    };
    let count = if len == 0 { 1 } else { len.div_ceil(step) };
    (0..count).map(move |k| {
        let start = k * step;
        start..(start + step).min(len)
    })
}

/// What a [`UdpSocket::send_batch`] did.
#[derive(Debug, Default)]
pub struct SendReport {
    /// Datagrams the kernel took.
    pub sent: usize,
    /// Datagrams dropped on an error other than "would block" (unreachable network, ...).
    pub failed: usize,
    /// The last such error.
    pub last_error: Option<io::Error>,
    /// The socket buffer is full: `sent + failed` datagrams were consumed, the rest were not.
    pub would_block: bool,
}

fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ECONNREFUSED)
            | Some(libc::ENETUNREACH)
            | Some(libc::EHOSTUNREACH)
            | Some(libc::ENETDOWN)
            | Some(libc::EHOSTDOWN)
            | Some(libc::ENOBUFS)
            | Some(libc::EPERM)
            | Some(libc::EMSGSIZE)
            | Some(libc::EADDRNOTAVAIL)
            | Some(libc::EINVAL)
            | Some(libc::ENXIO)
            | Some(libc::ENODEV)
    )
}

fn set_int(fd: RawFd, level: libc::c_int, opt: libc::c_int, v: libc::c_int) -> io::Result<()> {
    // SAFETY: setsockopt with a pointer to an int and its size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn get_int(fd: RawFd, level: libc::c_int, opt: libc::c_int) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt into an int with its size.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            level,
            opt,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        Ok(v)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The route MTU the kernel knows for `dst` (the outgoing interface's MTU, lowered by any ICMP
/// "fragmentation needed" / "packet too big" it has received for that destination), read with
/// `IP_MTU` / `IPV6_MTU` on a throwaway socket connected to it. For the server, whose listening
/// socket is not connected.
pub fn route_mtu(dst: SocketAddr) -> io::Result<usize> {
    let domain = if dst.is_ipv6() {
        Domain::IPV6
    } else {
        Domain::IPV4
    };
    let sock = Socket::new(domain, Type::DGRAM.cloexec(), Some(Protocol::UDP))?;
    sock.connect(&dst.into())?;
    mtu_of(sock.as_raw_fd(), dst.is_ipv6())
}

fn mtu_of(fd: RawFd, ipv6: bool) -> io::Result<usize> {
    let v = if ipv6 {
        get_int(fd, libc::IPPROTO_IPV6, libc::IPV6_MTU)?
    } else {
        get_int(fd, libc::IPPROTO_IP, libc::IP_MTU)?
    };
    usize::try_from(v).map_err(|_| io::Error::other("negative MTU"))
}

/// Bytes of outer IP and UDP headers before a datagram's payload: 28 over IPv4, 48 over IPv6.
pub fn ip_udp_overhead(dst: SocketAddr) -> usize {
    let v4 = match dst {
        SocketAddr::V4(_) => true,
        SocketAddr::V6(a) => a.ip().to_ipv4_mapped().is_some(),
    };
    if v4 {
        28
    } else {
        48
    }
}

fn set_buffer(sock: &Socket, opt_force: libc::c_int, bytes: usize) -> bool {
    let v: libc::c_int = bytes.min(i32::MAX as usize) as libc::c_int;
    // SAFETY: setsockopt with a pointer to an int and its size.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            opt_force,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    rc == 0
}

/// What a received message's control messages say.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct MsgInfo {
    /// The destination address in its IP_PKTINFO / IPV6_PKTINFO.
    local: Option<IpAddr>,
    /// The UDP_GRO segment size (0: one datagram).
    segment: usize,
    /// The kernel's arrival stamp (SCM_TIMESTAMPNS).
    stamp: Option<SystemTime>,
    /// The IP header's ECN field (IP_TOS / IPV6_TCLASS).
    ecn: u8,
}

/// Reads a received message's control messages (see [`MsgInfo`]).
fn parse_cmsgs(hdr: &libc::msghdr) -> MsgInfo {
    let mut info = MsgInfo::default();
    if hdr.msg_control.is_null() || hdr.msg_controllen == 0 {
        return info;
    }
    // SAFETY: the kernel wrote `msg_controllen` bytes of well-formed control messages into the
    // buffer `msg_control` points at; the CMSG_* helpers walk them within that length.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(hdr);
        while !c.is_null() {
            let h = &*c;
            if h.cmsg_level == libc::IPPROTO_IP && h.cmsg_type == libc::IP_PKTINFO {
                let pi = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::in_pktinfo);
                info.local = Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(pi.ipi_addr.s_addr))));
            } else if h.cmsg_level == libc::IPPROTO_IPV6 && h.cmsg_type == libc::IPV6_PKTINFO {
                let pi = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::in6_pktinfo);
                let a = Ipv6Addr::from(pi.ipi6_addr.s6_addr);
                info.local = Some(match a.to_ipv4_mapped() {
                    Some(v4) => IpAddr::V4(v4),
                    None => IpAddr::V6(a),
                });
            } else if h.cmsg_level == libc::SOL_UDP && h.cmsg_type == libc::UDP_GRO {
                // The kernel writes an int (udp_cmsg_recv: put_cmsg of gso_size as int).
                let seg = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::c_int);
                info.segment = usize::try_from(seg).unwrap_or(0);
            } else if h.cmsg_level == libc::IPPROTO_IP && h.cmsg_type == libc::IP_TOS {
                // One byte, the TOS (ip_cmsg_recv_tos).
                let tos = std::ptr::read_unaligned(libc::CMSG_DATA(c));
                info.ecn = tos & 0x03;
            } else if h.cmsg_level == libc::IPPROTO_IPV6 && h.cmsg_type == libc::IPV6_TCLASS {
                // An int, the traffic class (ip6_datagram_recv_specific_ctl).
                let tclass = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::c_int);
                info.ecn = (tclass & 0x03) as u8;
            } else if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == libc::SCM_TIMESTAMPNS {
                let ts = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::timespec);
                info.stamp = timespec_to_system(ts.tv_sec as i64, ts.tv_nsec as i64);
            }
            c = libc::CMSG_NXTHDR(hdr, c);
        }
    }
    info
}

/// A kernel timestamp as a [`SystemTime`]; `None` if it is not one (negative, nanoseconds out
/// of range).
fn timespec_to_system(sec: i64, nsec: i64) -> Option<SystemTime> {
    let sec = u64::try_from(sec).ok()?;
    let nsec = u32::try_from(nsec).ok().filter(|&n| n < 1_000_000_000)?;
    UNIX_EPOCH.checked_add(Duration::new(sec, nsec))
}

/// Largest difference between how far the wall clock and the monotonic clock moved from one
/// [`ReadClock::read`] to the next that is still taken for a slew rather than a step (slewing
/// moves the wall clock by at most 0.5 ms a second, and reads are at most a second apart).
pub const MAX_WALL_STEP: Duration = Duration::from_millis(2);

/// Both clocks as a socket is read, for [`Reading::arrival`]; `wall` is `None` when the wall clock
/// stepped since the previous read (stamps taken before the step would be placed wrong by the
/// step: one that made them look early would lower a link's base delay for its whole window).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    pub at: Instant,
    pub wall: Option<SystemTime>,
}

impl Reading {
    /// When a datagram with this kernel stamp arrived (the stamp less its age before the read, never later than the read); without a trusted wall
    /// clock, the read itself.
    pub fn arrival(&self, stamp: Option<SystemTime>) -> Instant {
        match self.wall {
            Some(wall) => arrival(stamp, self.at, wall),
            None => self.at,
        }
    }
}

/// Reads the monotonic and the wall clock together, and tells a step of the wall clock from
/// one reading to the next.
#[derive(Debug, Default)]
pub struct ReadClock {
    last: Option<(Instant, SystemTime)>,
}

impl ReadClock {
    /// Both clocks now (the monotonic one no earlier than `floor`).
    pub fn read(&mut self, floor: Instant) -> Reading {
        let (at, wall) = (Instant::now().max(floor), SystemTime::now());
        self.reading(at, wall)
    }

    /// [`read`](Self::read) with the clocks given.
    pub fn reading(&mut self, at: Instant, wall: SystemTime) -> Reading {
        let stepped = self.last.is_some_and(|(last_at, last_wall)| {
            let mono = at.saturating_duration_since(last_at);
            match wall.duration_since(last_wall) {
                Ok(w) => w.abs_diff(mono) > MAX_WALL_STEP,
                Err(_) => true,
            }
        });
        self.last = Some((at, wall));
        Reading {
            at,
            wall: (!stepped).then_some(wall),
        }
    }
}

/// Oldest arrival stamp [`Reading::arrival`] believes: an older one means the wall clock stepped
/// (a datagram does not wait in a socket buffer this long).
pub const MAX_STAMP_AGE: Duration = Duration::from_secs(1);

/// The instant at which a datagram arrived, from the kernel's `stamp` (wall clock) and the two
/// clocks read together after the receive (`read_at`, `read_wall`): `read_at` less the stamp's
/// age, never later than `read_at`. Without a stamp, or with one the wall clock's steps made
/// absurd (in the future, older than [`MAX_STAMP_AGE`]), `read_at`.
fn arrival(stamp: Option<SystemTime>, read_at: Instant, read_wall: SystemTime) -> Instant {
    stamp
        .and_then(|s| read_wall.duration_since(s).ok())
        .filter(|&age| age <= MAX_STAMP_AGE)
        .and_then(|age| read_at.checked_sub(age))
        .unwrap_or(read_at)
}

/// Sets an int socket option; whether the kernel took it.
/// [`set_int`] on a socket being set up, where a refusal only means "not supported here".
fn set_int_opt(sock: &Socket, level: libc::c_int, opt: libc::c_int, v: libc::c_int) -> bool {
    set_int(sock.as_raw_fd(), level, opt, v).is_ok()
}

impl UdpSocket {
    /// Creates a socket as `opts` says. Errors name the interface or address at fault.
    pub fn bind(opts: &BindOptions) -> Result<UdpSocket, UdpError> {
        let ipv6 = opts.addr.map(|a| a.is_ipv6()).unwrap_or(opts.ipv6);
        let domain = if ipv6 { Domain::IPV6 } else { Domain::IPV4 };
        let sock = Socket::new(
            domain,
            Type::DGRAM.nonblocking().cloexec(),
            Some(Protocol::UDP),
        )
        .map_err(UdpError::Socket)?;
        if let Some(dev) = &opts.dev {
            if let Err(e) = sock.bind_device(Some(dev.as_bytes())) {
                return Err(match e.raw_os_error() {
                    Some(libc::ENODEV) => UdpError::NoSuchDevice(dev.clone()),
                    _ => UdpError::BindDevice {
                        dev: dev.clone(),
                        source: e,
                    },
                });
            }
        }
        if opts.buffer_bytes > 0 {
            if !set_buffer(&sock, libc::SO_SNDBUFFORCE, opts.buffer_bytes) {
                let _ = sock.set_send_buffer_size(opts.buffer_bytes);
            }
            if !set_buffer(&sock, libc::SO_RCVBUFFORCE, opts.buffer_bytes) {
                let _ = sock.set_recv_buffer_size(opts.buffer_bytes);
            }
        }
        if opts.pktinfo {
            if ipv6 {
                set_int_opt(&sock, libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, 1);
            }
            // Also on IPv6 sockets: IPv4-mapped traffic reports IPv4 packet info.
            set_int_opt(&sock, libc::IPPROTO_IP, libc::IP_PKTINFO, 1);
        }
        // UDP GRO: runs of datagrams of one flow arrive as one message (Linux 5.0+); a kernel
        // that refuses it (ENOPROTOOPT) hands out one datagram per message.
        let gro = opts.gro && set_int_opt(&sock, libc::SOL_UDP, libc::UDP_GRO, 1);
        if opts.timestamps {
            // A kernel without it stamps nothing: the caller falls back to its own clock.
            set_int_opt(&sock, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1);
        }
        if opts.ecn {
            if ipv6 {
                set_int_opt(&sock, libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, 1);
            }
            // Also on IPv6 sockets: IPv4-mapped traffic reports the IPv4 TOS. A kernel that
            // refuses either reports no ECN field: every datagram reads Not-ECT.
            set_int_opt(&sock, libc::IPPROTO_IP, libc::IP_RECVTOS, 1);
        }
        if opts.dont_fragment {
            let fd = sock.as_raw_fd();
            let df = if ipv6 {
                set_int(
                    fd,
                    libc::IPPROTO_IPV6,
                    libc::IPV6_MTU_DISCOVER,
                    libc::IPV6_PMTUDISC_DO,
                )
                .and_then(|()| set_int(fd, libc::IPPROTO_IPV6, libc::IPV6_DONTFRAG, 1))
            } else {
                Ok(())
            };
            // Also on IPv6 sockets: IPv4-mapped traffic goes out under the IPv4 setting.
            let df = df.and_then(|()| {
                set_int(
                    fd,
                    libc::IPPROTO_IP,
                    libc::IP_MTU_DISCOVER,
                    libc::IP_PMTUDISC_DO,
                )
            });
            if let Err(e) = df {
                // IPv6-only sockets refuse the IPv4 option: harmless.
                if !ipv6 {
                    return Err(UdpError::Socket(e));
                }
            }
        }
        let addr = opts.addr.unwrap_or_else(|| {
            if ipv6 {
                SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0))
            } else {
                SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, 0))
            }
        });
        sock.bind(&addr.into())
            .map_err(|source| UdpError::Bind { addr, source })?;
        Ok(UdpSocket {
            sock,
            connected: None,
            gso: std::sync::atomic::AtomicBool::new(true),
            scratch: Default::default(),
            gro,
            ecn: std::sync::atomic::AtomicBool::new(true),
            ipv6,
        })
    }

    /// Fixes the peer: sends need no address and only its datagrams are received.
    pub fn connect(&mut self, addr: SocketAddr) -> Result<(), UdpError> {
        self.sock
            .connect(&addr.into())
            .map_err(|source| UdpError::Connect { addr, source })?;
        self.connected = Some(addr);
        Ok(())
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("not an IP socket"))
    }

    /// Connected socket: the route MTU to its peer as the kernel knows it now (`IP_MTU` /
    /// `IPV6_MTU`: the interface's MTU, lowered by ICMP "fragmentation needed" / "packet too
    /// big" from the path). The datagram room is this minus [`ip_udp_overhead`].
    pub fn path_mtu(&self) -> io::Result<usize> {
        let peer = self
            .connected
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))?;
        mtu_of(self.sock.as_raw_fd(), peer.is_ipv6())
    }

    /// Receive and send buffer sizes the kernel granted.
    pub fn buffer_sizes(&self) -> (usize, usize) {
        (
            self.sock.recv_buffer_size().unwrap_or(0),
            self.sock.send_buffer_size().unwrap_or(0),
        )
    }

    /// Receives up to `batch.capacity()` messages in one `recvmmsg` and cuts GRO-coalesced
    /// ones into their datagrams; returns the number of datagrams (`batch.len()`). `Ok(0)`:
    /// nothing waiting. Transient errors queued on the socket (ICMP unreachable on a connected
    /// socket) are skipped.
    pub fn recv_batch(&self, batch: &mut RecvBatch) -> io::Result<usize> {
        let n = batch.bufs.len();
        batch.datagrams.clear();
        batch.messages = 0;
        for i in 0..n {
            batch.iovs[i] = libc::iovec {
                iov_base: batch.bufs[i].as_mut_ptr().cast(),
                iov_len: batch.bufs[i].len(),
            };
            let hdr = &mut batch.hdrs[i].msg_hdr;
            hdr.msg_name = (&mut batch.names[i] as *mut libc::sockaddr_storage).cast();
            hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            hdr.msg_iov = &mut batch.iovs[i];
            hdr.msg_iovlen = 1;
            hdr.msg_control = batch.ctrl[i].as_mut_ptr().cast();
            hdr.msg_controllen = CMSG_SPACE as _;
            hdr.msg_flags = 0;
            batch.hdrs[i].msg_len = 0;
        }
        let mut retries = 0;
        let got = loop {
            // SAFETY: every mmsghdr points at live buffers of the batch (iovs, names, ctrl) sized
            // as declared.
            let r = unsafe {
                libc::recvmmsg(
                    self.sock.as_raw_fd(),
                    batch.hdrs.as_mut_ptr(),
                    n as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if r >= 0 {
                break r as usize;
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock => return Ok(0),
                io::ErrorKind::Interrupted => continue,
                _ if is_transient(&e) && retries < 8 => {
                    retries += 1;
                    batch.last_error = Some(e);
                    continue;
                }
                _ => return Err(e),
            }
        };
        for i in 0..got {
            let hdr = &batch.hdrs[i].msg_hdr;
            let mut len = batch.hdrs[i].msg_len as usize;
            let MsgInfo {
                local,
                segment,
                stamp,
                ecn,
            } = parse_cmsgs(hdr);
            // Larger than we accept (one datagram over MAX_DATAGRAM, or cut short): what we hold
            // would only fail authentication; an empty datagram is counted as malformed instead.
            let too_big = if segment > 0 {
                segment > MAX_DATAGRAM
            } else {
                len > MAX_DATAGRAM
            };
            if hdr.msg_flags & libc::MSG_TRUNC != 0 || too_big {
                len = 0;
            }
            // SAFETY: the kernel filled `names[i]` with `msg_namelen` bytes of a sockaddr.
            let sa = unsafe { SockAddr::new(batch.names[i], hdr.msg_namelen) };
            batch.addrs[i] = sa.as_socket().or(self.connected);
            batch.locals[i] = local;
            batch.stamps[i] = stamp;
            batch.ecns[i] = ecn;
            let before = batch.datagrams.len();
            batch
                .datagrams
                .extend(gro_split(len, segment).map(|r| (i, r.start, r.len())));
            let cut = batch.datagrams.len() - before;
            if cut > 1 {
                batch.stats.gro_messages += 1;
                batch.stats.gro_datagrams += cut as u64;
            }
        }
        batch.messages = got;
        Ok(batch.datagrams.len())
    }

    /// Sends `msgs` in order with as few `sendmmsg` calls as possible, and as few trips through
    /// the kernel's stack as UDP GSO allows: consecutive datagrams to the same destination, from
    /// the same source, of one size (the last of a run may be shorter) go as one message with a
    /// `UDP_SEGMENT` control message, which the kernel (or the NIC) cuts into datagrams (as
    /// wireguard-go and quinn-udp send). A socket whose path refuses GSO (`EIO`: a device without
    /// checksum offload; `EINVAL`) falls back to one datagram per message for good.
    /// `dst` is ignored on a connected socket. Stops at "would block" (see
    /// [`SendReport::would_block`]); other errors drop the datagrams at fault and go on (UDP is
    /// lossy anyway; the link's health sees it).
    pub fn send_batch(&self, msgs: &[Datagram<'_>]) -> SendReport {
        let mut rep = SendReport::default();
        // One caller at a time in practice (the data plane): the lock is never contended, and
        // keeps the socket `Sync`.
        let mut guard = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let SendScratch {
            groups,
            iovs,
            names,
            ctrl,
            hdrs,
        } = &mut *guard;
        let mut i = 0;
        while i < msgs.len() {
            let chunk = &msgs[i..msgs.len().min(i + 1024)];
            let gso = self.gso.load(std::sync::atomic::Ordering::Relaxed);
            let ecn_on = self.ecn.load(std::sync::atomic::Ordering::Relaxed);
            gso_groups(chunk, gso, self.connected.is_some(), groups);
            iovs.clear();
            iovs.extend(chunk.iter().map(|d| libc::iovec {
                iov_base: d.payload.as_ptr() as *mut libc::c_void,
                iov_len: d.payload.len(),
            }));
            names.clear();
            names.extend(
                groups
                    .iter()
                    .map(|g| match (self.connected, chunk[g.start].dst) {
                        (None, Some(d)) => Some(SockAddr::from(d)),
                        _ => None,
                    }),
            );
            ctrl.clear();
            ctrl.resize(groups.len(), [0u64; GSO_CMSG_SPACE / 8]);
            hdrs.clear();
            for (k, g) in groups.iter().enumerate() {
                // SAFETY: msghdr is plain old data.
                let mut hdr: libc::msghdr = unsafe { MaybeUninit::zeroed().assume_init() };
                if let Some(sa) = &names[k] {
                    hdr.msg_name = sa.as_ptr() as *mut libc::c_void;
                    hdr.msg_namelen = sa.len();
                }
                hdr.msg_iov = &mut iovs[g.start];
                hdr.msg_iovlen = g.len as _;
                let segment = (g.len > 1).then_some(g.segment);
                let first = &chunk[g.start];
                let tos = (ecn_on && first.ecn & 0x03 != 0).then(|| {
                    let dst = self.connected.or(first.dst);
                    let v4 = !self.ipv6 || dst.is_some_and(|d| is_v4(d.ip()));
                    (v4, first.ecn & 0x03)
                });
                write_cmsgs(&mut ctrl[k], (first.src, segment, tos), &mut hdr);
                hdrs.push(libc::mmsghdr {
                    msg_hdr: hdr,
                    msg_len: 0,
                });
            }
            // SAFETY: headers point at live iovecs/addresses/control buffers borrowed for this
            // call.
            let r = unsafe {
                libc::sendmmsg(
                    self.sock.as_raw_fd(),
                    hdrs.as_mut_ptr(),
                    hdrs.len() as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            if r > 0 {
                let n: usize = groups[..r as usize].iter().map(|g| g.len).sum();
                rep.sent += n;
                i += n;
                continue;
            }
            let e = if r == 0 {
                io::Error::from(io::ErrorKind::WriteZero)
            } else {
                io::Error::last_os_error()
            };
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => {
                    rep.would_block = true;
                    return rep;
                }
                _ if ecn_on
                    && chunk[groups[0].start].ecn & 0x03 != 0
                    && e.raw_os_error() == Some(libc::EINVAL) =>
                {
                    tracing::debug!("the ECN field refused ({e}); sending Not-ECT");
                    self.ecn.store(false, std::sync::atomic::Ordering::Relaxed);
                }
                _ if groups[0].len > 1
                    && matches!(e.raw_os_error(), Some(libc::EIO) | Some(libc::EINVAL)) =>
                {
                    tracing::debug!("UDP GSO refused ({e}); sending one datagram per message");
                    self.gso.store(false, std::sync::atomic::Ordering::Relaxed);
                }
                _ => {
                    // The first message of the chunk failed: drop its datagrams, go on.
                    rep.failed += groups[0].len;
                    rep.last_error = Some(e);
                    i += groups[0].len;
                }
            }
        }
        rep
    }

    /// Whether UDP GRO is on for this socket.
    pub fn gro(&self) -> bool {
        self.gro
    }

    /// Whether the ECN field is (still) set on what this socket sends.
    pub fn ecn(&self) -> bool {
        self.ecn.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether UDP GSO is (still) used on this socket.
    pub fn gso(&self) -> bool {
        self.gso.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Most datagrams in one GSO message (the kernel's `UDP_MAX_SEGMENTS` on older kernels).
const GSO_MAX_SEGMENTS: usize = 64;
/// Most bytes in one GSO message (an IP packet's limit, with room for the headers).
const GSO_MAX_BYTES: usize = 65_000;
/// Control space for a PKTINFO and a UDP_SEGMENT message.
const GSO_CMSG_SPACE: usize = 128;

/// A run of datagrams sent as one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Group {
    start: usize,
    len: usize,
    /// The segment size (the run's first datagram's size).
    segment: u16,
}

/// Cuts `msgs` into runs that can go as one GSO message: same destination (unless `connected`),
/// source and ECN field, every datagram `segment` bytes but the last (which may be shorter and ends the
/// run), at most 64 datagrams and 65,000 bytes. Without `gso`, one datagram per run.
fn gso_groups(msgs: &[Datagram<'_>], gso: bool, connected: bool, groups: &mut Vec<Group>) {
    groups.clear();
    let mut k = 0;
    while k < msgs.len() {
        let first = &msgs[k];
        let seg = first.payload.len();
        let mut len = 1;
        let mut bytes = seg;
        if gso && seg > 0 && seg <= usize::from(u16::MAX) {
            while k + len < msgs.len() && len < GSO_MAX_SEGMENTS {
                let d = &msgs[k + len];
                let n = d.payload.len();
                if (!connected && d.dst != first.dst)
                    || d.src != first.src
                    || d.ecn != first.ecn
                    || n == 0
                    || n > seg
                    || bytes + n > GSO_MAX_BYTES
                {
                    break;
                }
                len += 1;
                bytes += n;
                if n < seg {
                    break;
                }
            }
        }
        groups.push(Group {
            start: k,
            len,
            segment: seg.min(usize::from(u16::MAX)) as u16,
        });
        k += len;
    }
}

/// Writes the control messages of one outgoing message, each if given: PKTINFO (send from
/// `src`), UDP_SEGMENT (GSO segment size) and the ECN field (`tos`: whether the datagrams are
/// IPv4 or IPv4-mapped, which take `IP_TOS`, else `IPV6_TCLASS`; and the value).
fn write_cmsgs(
    buf: &mut [u64; GSO_CMSG_SPACE / 8],
    (src, segment, tos): (Option<IpAddr>, Option<u16>, Option<(bool, u8)>),
    hdr: &mut libc::msghdr,
) {
    if src.is_none() && segment.is_none() && tos.is_none() {
        return;
    }
    let pktinfo_len = match src {
        Some(IpAddr::V4(_)) => std::mem::size_of::<libc::in_pktinfo>(),
        Some(IpAddr::V6(_)) => std::mem::size_of::<libc::in6_pktinfo>(),
        None => 0,
    };
    let int_len = std::mem::size_of::<libc::c_int>() as u32;
    // SAFETY: `buf` is GSO_CMSG_SPACE bytes, aligned for cmsghdr, enough for one in6_pktinfo,
    // one u16 and one int control message (40 + 24 + 24 bytes); the CMSG_* helpers compute
    // offsets inside `msg_controllen`.
    unsafe {
        hdr.msg_control = buf.as_mut_ptr().cast();
        let mut total = 0usize;
        if src.is_some() {
            total += libc::CMSG_SPACE(pktinfo_len as u32) as usize;
        }
        if segment.is_some() {
            total += libc::CMSG_SPACE(2) as usize;
        }
        if tos.is_some() {
            total += libc::CMSG_SPACE(int_len) as usize;
        }
        hdr.msg_controllen = total as _;
        let mut c = libc::CMSG_FIRSTHDR(hdr);
        if let Some(src) = src {
            match src {
                IpAddr::V4(a) => {
                    (*c).cmsg_level = libc::IPPROTO_IP;
                    (*c).cmsg_type = libc::IP_PKTINFO;
                    (*c).cmsg_len = libc::CMSG_LEN(pktinfo_len as u32) as _;
                    let pi = libc::in_pktinfo {
                        ipi_ifindex: 0,
                        ipi_spec_dst: libc::in_addr {
                            s_addr: u32::from(a).to_be(),
                        },
                        ipi_addr: libc::in_addr { s_addr: 0 },
                    };
                    std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut libc::in_pktinfo, pi);
                }
                IpAddr::V6(a) => {
                    (*c).cmsg_level = libc::IPPROTO_IPV6;
                    (*c).cmsg_type = libc::IPV6_PKTINFO;
                    (*c).cmsg_len = libc::CMSG_LEN(pktinfo_len as u32) as _;
                    let pi = libc::in6_pktinfo {
                        ipi6_addr: libc::in6_addr {
                            s6_addr: a.octets(),
                        },
                        ipi6_ifindex: 0,
                    };
                    std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut libc::in6_pktinfo, pi);
                }
            }
            c = libc::CMSG_NXTHDR(hdr, c);
        }
        if let Some(seg) = segment {
            (*c).cmsg_level = libc::SOL_UDP;
            (*c).cmsg_type = libc::UDP_SEGMENT;
            (*c).cmsg_len = libc::CMSG_LEN(2) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, seg);
            c = libc::CMSG_NXTHDR(hdr, c);
        }
        if let Some((v4, value)) = tos {
            // Linux takes an int for both (ip_cmsg_send, ip6_datagram_send_ctl).
            (*c).cmsg_level = if v4 {
                libc::IPPROTO_IP
            } else {
                libc::IPPROTO_IPV6
            };
            (*c).cmsg_type = if v4 { libc::IP_TOS } else { libc::IPV6_TCLASS };
            (*c).cmsg_len = libc::CMSG_LEN(int_len) as _;
            std::ptr::write_unaligned(
                libc::CMSG_DATA(c) as *mut libc::c_int,
                libc::c_int::from(value),
            );
        }
    }
}

/// An IPv4 address, or an IPv4-mapped IPv6 one (which an IPv6 socket sends as IPv4).
fn is_v4(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(_) => true,
        IpAddr::V6(a) => a.to_ipv4_mapped().is_some(),
    }
}

impl AsRawFd for UdpSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ECN field set per datagram arrives with each, in GSO runs cut where it changes: IPv4,
    /// IPv6, and IPv4-mapped from an IPv6 socket to a dual-stack one.
    #[test]
    fn the_ecn_field_is_sent_and_read_per_datagram() {
        let cases: [(&str, &str, Option<SocketAddr>); 3] = [
            ("127.0.0.1:0", "127.0.0.1:0", None),
            ("[::1]:0", "[::1]:0", None),
            (
                "[::]:0",
                "[::]:0",
                Some("[::ffff:127.0.0.1]:0".parse().unwrap()),
            ),
        ];
        for (rx_at, tx_at, mapped) in cases {
            let rx = UdpSocket::bind(&BindOptions {
                addr: Some(rx_at.parse().unwrap()),
                gro: true,
                ecn: true,
                ..Default::default()
            })
            .unwrap();
            let tx = UdpSocket::bind(&BindOptions {
                addr: Some(tx_at.parse().unwrap()),
                ..Default::default()
            })
            .unwrap();
            let port = rx.local_addr().unwrap().port();
            let mut dst = mapped.unwrap_or_else(|| rx.local_addr().unwrap());
            dst.set_port(port);
            // Equal sizes throughout: only the ECN field cuts the runs.
            let ecns = [2u8, 2, 2, 3, 3, 0, 1, 1, 2, 0];
            let payloads: Vec<Vec<u8>> = (0..ecns.len() as u8).map(|i| vec![i; 300]).collect();
            let msgs: Vec<Datagram> = payloads
                .iter()
                .zip(ecns)
                .map(|(p, ecn)| Datagram {
                    dst: Some(dst),
                    src: None,
                    ecn,
                    payload: p,
                })
                .collect();
            let rep = tx.send_batch(&msgs);
            assert_eq!(rep.sent, ecns.len(), "{rx_at}: {rep:?}");
            assert!(tx.ecn(), "{rx_at}: the ECN field was refused");
            let mut batch = RecvBatch::new(BATCH);
            let mut got = Vec::new();
            for _ in 0..100 {
                let n = rx.recv_batch(&mut batch).unwrap();
                for i in 0..n {
                    let ecn = batch.ecn(i);
                    let (_, bytes) = batch.get_mut(i).unwrap();
                    got.push((bytes[0], ecn));
                }
                if got.len() == ecns.len() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            let want: Vec<(u8, u8)> = (0..).zip(ecns).collect();
            assert_eq!(got, want, "{rx_at}");
        }
    }

    #[test]
    fn loopback_batches_round_trip() {
        let lo = "127.0.0.1:0".parse().unwrap();
        let a = UdpSocket::bind(&BindOptions {
            addr: Some(lo),
            buffer_bytes: 1 << 20,
            ..Default::default()
        })
        .unwrap();
        let mut b = UdpSocket::bind(&BindOptions {
            addr: Some(lo),
            ..Default::default()
        })
        .unwrap();
        let a_addr = a.local_addr().unwrap();
        b.connect(a_addr).unwrap();
        let payloads: Vec<Vec<u8>> = (0..100u8).map(|i| vec![i; 100 + i as usize]).collect();
        let msgs: Vec<Datagram> = payloads
            .iter()
            .map(|p| Datagram {
                dst: None,
                src: None,
                ecn: 0,
                payload: p,
            })
            .collect();
        let rep = b.send_batch(&msgs);
        assert_eq!(rep.sent, 100);
        let mut batch = RecvBatch::new(BATCH);
        let mut got = Vec::new();
        for _ in 0..100 {
            let n = a.recv_batch(&mut batch).unwrap();
            for i in 0..n {
                let (from, bytes) = batch.get_mut(i).unwrap();
                assert_eq!(from, b.local_addr().unwrap());
                got.push(bytes.to_vec());
            }
            if got.len() == 100 {
                break;
            }
        }
        assert_eq!(got, payloads);
        // Unconnected socket sends to explicit addresses.
        let b_addr = b.local_addr().unwrap();
        let d = |p: &'static [u8]| Datagram {
            dst: Some(b_addr),
            src: None,
            ecn: 0,
            payload: p,
        };
        let rep = a.send_batch(&[d(b"hi"), d(b"there")]);
        assert_eq!(rep.sent, 2);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(b.recv_batch(&mut batch).unwrap(), 2);
        assert_eq!(batch.get_mut(1).unwrap().1, b"there");
        assert_eq!(a.recv_batch(&mut batch).unwrap(), 0);
    }

    /// With `timestamps`, each datagram carries the kernel's arrival stamp: after the send,
    /// before the read, and as old as the datagram waited; the datagrams iterator hands out the
    /// same. Without, none. (The kernel turns arrival stamping on a moment after the first
    /// socket asks, from a work queue; until then it stamps at the read: hence the tries.)
    #[test]
    fn timestamps_stamp_each_datagram_with_its_arrival() {
        let lo = "127.0.0.1:0".parse().unwrap();
        let open = |timestamps| {
            UdpSocket::bind(&BindOptions {
                addr: Some(lo),
                timestamps,
                ..Default::default()
            })
            .unwrap()
        };
        let (rx, plain, mut tx) = (open(true), open(false), open(false));
        tx.connect(rx.local_addr().unwrap()).unwrap();
        let d = Datagram {
            dst: None,
            src: None,
            ecn: 0,
            payload: b"stamp me",
        };
        let mut batch = RecvBatch::new(BATCH);
        let mut waited = false;
        for _ in 0..20 {
            let before = SystemTime::now();
            assert_eq!(tx.send_batch(&[d, d]).sent, 2);
            std::thread::sleep(Duration::from_millis(30));
            assert_eq!(rx.recv_batch(&mut batch).unwrap(), 2);
            let after = SystemTime::now();
            for i in 0..2 {
                let stamp = batch.stamp(i).expect("stamped");
                assert!(
                    before <= stamp && stamp <= after,
                    "{stamp:?} not in the receive"
                );
            }
            let stamps: Vec<_> = batch.datagrams_mut().map(|d| d.stamp).collect();
            assert_eq!(stamps, vec![batch.stamp(0), batch.stamp(1)]);
            // Read 30 ms after it arrived: the stamp says so.
            waited = (0..2).all(|i| {
                let age = after.duration_since(batch.stamp(i).unwrap()).unwrap();
                age >= Duration::from_millis(25)
            });
            if waited {
                break;
            }
        }
        assert!(
            waited,
            "the stamps never showed the 30 ms the datagrams waited"
        );

        tx.connect(plain.local_addr().unwrap()).unwrap();
        assert_eq!(tx.send_batch(&[d]).sent, 1);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(plain.recv_batch(&mut batch).unwrap(), 1);
        assert_eq!(batch.stamp(0), None);
    }

    /// A stamp becomes the instant its age before the read; a missing one, one in the future or
    /// one older than a datagram waits (the wall clock stepped) is the read itself.
    #[test]
    fn arrival_places_a_stamp_on_the_monotonic_clock() {
        let read_at = Instant::now() + Duration::from_secs(10);
        let wall = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let ms = Duration::from_millis;
        assert_eq!(arrival(Some(wall - ms(7)), read_at, wall), read_at - ms(7));
        assert_eq!(arrival(Some(wall), read_at, wall), read_at);
        assert_eq!(arrival(None, read_at, wall), read_at);
        assert_eq!(arrival(Some(wall + ms(1)), read_at, wall), read_at);
        assert_eq!(arrival(Some(wall - ms(1001)), read_at, wall), read_at);
        // A step of the wall clock between two reads: the stamps of that read are not used.
        let mut clock = ReadClock::default();
        let r = clock.reading(read_at, wall);
        assert_eq!(r.arrival(Some(wall - ms(7))), read_at - ms(7));
        let r = clock.reading(read_at + ms(100), wall + ms(101));
        assert_eq!(
            r.arrival(Some(wall + ms(95))),
            read_at + ms(94),
            "a 1 ms slew is kept"
        );
        let r = clock.reading(read_at + ms(200), wall + ms(301));
        assert_eq!(r.wall, None, "100 ms forward in 100 ms of time: a step");
        assert_eq!(r.arrival(Some(wall + ms(250))), read_at + ms(200));
        let r = clock.reading(read_at + ms(300), wall + ms(250));
        assert_eq!(r.wall, None, "backwards: a step");
        let r = clock.reading(read_at + ms(400), wall + ms(350));
        assert_eq!(
            r.arrival(Some(wall + ms(340))),
            read_at + ms(390),
            "in step again"
        );
        assert_eq!(timespec_to_system(-1, 0), None);
        assert_eq!(timespec_to_system(1, 1_000_000_000), None);
        assert_eq!(
            timespec_to_system(2, 5),
            Some(UNIX_EPOCH + Duration::new(2, 5))
        );
    }

    #[test]
    fn gso_groups_cut_runs_of_one_size() {
        let p = |n: usize| vec![0u8; n];
        let sizes = [100, 100, 100, 60, 100, 100, 120, 5];
        let payloads: Vec<Vec<u8>> = sizes.iter().map(|&n| p(n)).collect();
        let msgs: Vec<Datagram> = payloads
            .iter()
            .map(|p| Datagram {
                dst: None,
                src: None,
                ecn: 0,
                payload: p,
            })
            .collect();
        let groups = |msgs: &[Datagram], gso: bool, connected: bool| {
            let mut g = vec![Group {
                start: 9,
                len: 9,
                segment: 9,
            }];
            gso_groups(msgs, gso, connected, &mut g);
            g
        };
        let g: Vec<(usize, usize, u16)> = groups(&msgs, true, true)
            .iter()
            .map(|g| (g.start, g.len, g.segment))
            .collect();
        // 100x3 + 60 (short: ends the run), 100x2 (120 is bigger: a new run), 120 + 5.
        assert_eq!(g, vec![(0, 4, 100), (4, 2, 100), (6, 2, 120)]);
        assert_eq!(groups(&msgs, false, true).len(), sizes.len());
        let many: Vec<Datagram> = (0..200).map(|_| msgs[0]).collect();
        assert!(groups(&many, true, true)
            .iter()
            .all(|g| g.len <= GSO_MAX_SEGMENTS));
        // Different destinations never share a message on an unconnected socket.
        let a = "127.0.0.1:1".parse().ok();
        let b = "127.0.0.1:2".parse().ok();
        let two = [
            Datagram { dst: a, ..msgs[0] },
            Datagram { dst: b, ..msgs[0] },
        ];
        assert_eq!(groups(&two, true, false).len(), 2);
    }

    /// Runs of equal datagrams go out as GSO messages and arrive as the datagrams they were, in
    /// order, with and without a chosen source address.
    #[test]
    fn gso_sends_arrive_as_single_datagrams_in_order() {
        let lo: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let rx = UdpSocket::bind(&BindOptions {
            addr: Some(lo),
            buffer_bytes: 4 << 20,
            ..Default::default()
        })
        .unwrap();
        let tx = UdpSocket::bind(&BindOptions {
            addr: Some(lo),
            pktinfo: true,
            ..Default::default()
        })
        .unwrap();
        let dst = rx.local_addr().unwrap();
        let payloads: Vec<Vec<u8>> = (0..150u32)
            .map(|i| {
                let n = if i % 50 == 49 { 300 } else { 1200 };
                (0..n).map(|k| (k as u32 ^ i) as u8).collect()
            })
            .collect();
        for src in [None, Some("127.0.0.1".parse().unwrap())] {
            let msgs: Vec<Datagram> = payloads
                .iter()
                .map(|p| Datagram {
                    dst: Some(dst),
                    src,
                    ecn: 0,
                    payload: p,
                })
                .collect();
            let rep = tx.send_batch(&msgs);
            assert_eq!(rep.sent, payloads.len(), "{rep:?}");
            assert!(tx.gso(), "loopback takes GSO");
            let mut batch = RecvBatch::new(BATCH);
            let mut got = Vec::new();
            for _ in 0..200 {
                let n = rx.recv_batch(&mut batch).unwrap();
                for i in 0..n {
                    got.push(batch.get_mut(i).unwrap().1.to_vec());
                }
                if got.len() >= payloads.len() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            assert_eq!(got, payloads);
        }
    }

    /// A coalesced buffer of datagrams of one size (the last one shorter) is cut at the segment
    /// size into exactly the datagrams that were sent.
    #[test]
    fn gro_split_cuts_a_coalesced_buffer_into_its_datagrams() {
        let sent: Vec<Vec<u8>> = (0..5u8)
            .map(|i| vec![i; if i == 4 { 333 } else { 1200 }])
            .collect();
        let buf: Vec<u8> = sent.concat();
        let got: Vec<&[u8]> = gro_split(buf.len(), 1200).map(|r| &buf[r]).collect();
        assert_eq!(got, sent.iter().map(|d| &d[..]).collect::<Vec<_>>());
        // Exact multiple: no empty tail.
        assert_eq!(
            gro_split(2400, 1200).collect::<Vec<_>>(),
            vec![0..1200, 1200..2400]
        );
        // No segment size, or one not smaller than the message: one datagram.
        assert_eq!(gro_split(700, 0).collect::<Vec<_>>(), vec![0..700]);
        assert_eq!(gro_split(700, 700).collect::<Vec<_>>(), vec![0..700]);
        assert_eq!(gro_split(700, 9000).collect::<Vec<_>>(), vec![0..700]);
        // An empty message is one empty datagram, not none.
        assert_eq!(gro_split(0, 0).collect::<Vec<_>>(), vec![0..0]);
        assert_eq!(gro_split(0, 100).collect::<Vec<_>>(), vec![0..0]);
        // Segment size 1: every byte a datagram.
        assert_eq!(gro_split(3, 1).count(), 3);
    }

    /// A GSO send to a GRO socket on loopback arrives as coalesced messages (the kernel keeps
    /// the GSO packet whole for a socket that asked for GRO), and `recv_batch` hands out the
    /// datagrams that were sent, in order; a socket without GRO gets the same datagrams one per
    /// message.
    #[test]
    fn gro_receive_splits_coalesced_messages_in_order() {
        let lo: SocketAddr = "127.0.0.1:0".parse().unwrap();
        for gro in [true, false] {
            let rx = UdpSocket::bind(&BindOptions {
                addr: Some(lo),
                buffer_bytes: 4 << 20,
                gro,
                ..Default::default()
            })
            .unwrap();
            assert_eq!(rx.gro(), gro);
            let tx = UdpSocket::bind(&BindOptions {
                addr: Some(lo),
                ..Default::default()
            })
            .unwrap();
            let dst = rx.local_addr().unwrap();
            let payloads: Vec<Vec<u8>> = (0..200u32)
                .map(|i| {
                    let n = if i % 40 == 39 { 77 } else { 1400 };
                    (0..n).map(|k| (k as u32 ^ i) as u8).collect()
                })
                .collect();
            let msgs: Vec<Datagram> = payloads
                .iter()
                .map(|p| Datagram {
                    dst: Some(dst),
                    src: None,
                    ecn: 0,
                    payload: p,
                })
                .collect();
            assert_eq!(tx.send_batch(&msgs).sent, payloads.len());
            assert!(tx.gso());
            let mut batch = RecvBatch::new(8);
            let mut got = Vec::new();
            for _ in 0..200 {
                let n = rx.recv_batch(&mut batch).unwrap();
                assert_eq!(n, batch.len());
                // All of the batch's datagrams at once, each flipped through its own slice.
                let mut all: Vec<RecvDatagram<'_>> = batch.datagrams_mut().collect();
                assert_eq!(all.len(), n);
                for d in &mut all {
                    assert_eq!(d.from, tx.local_addr().unwrap());
                    got.push(d.bytes.to_vec());
                    d.bytes.iter_mut().for_each(|b| *b = !*b);
                }
                // Each slice was one datagram's own bytes: flipped once, none twice or missed.
                for i in 0..n {
                    let (_, bytes) = batch.get_mut(i).unwrap();
                    let sent = &got[got.len() - n + i];
                    assert_eq!(bytes.len(), sent.len());
                    assert!(
                        bytes.iter().zip(sent).all(|(b, s)| *b == !*s),
                        "datagram {i}"
                    );
                }
                if got.len() >= payloads.len() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            assert_eq!(got, payloads, "gro {gro}");
            let st = batch.stats();
            if gro {
                // 200 datagrams through 8-message batches: only coalescing gets them all.
                assert!(st.gro_messages > 0, "{st:?}");
                assert!(st.gro_datagrams > st.gro_messages, "{st:?}");
            } else {
                assert_eq!(st, RecvStats::default());
            }
        }
    }

    /// A wildcard-bound socket learns which local address each datagram came to, and answers
    /// from it.
    #[test]
    fn pktinfo_reports_and_sets_the_local_address() {
        let srv = UdpSocket::bind(&BindOptions {
            addr: Some("0.0.0.0:0".parse().unwrap()),
            pktinfo: true,
            ..Default::default()
        })
        .unwrap();
        let port = srv.local_addr().unwrap().port();
        // 127.0.0.2 is a local address too (all of 127/8 is on lo).
        let mut cli = UdpSocket::bind(&BindOptions {
            addr: Some("127.0.0.1:0".parse().unwrap()),
            ..Default::default()
        })
        .unwrap();
        cli.connect(SocketAddr::from(([127, 0, 0, 2], port)))
            .unwrap();
        assert_eq!(
            cli.send_batch(&[Datagram {
                dst: None,
                src: None,
                ecn: 0,
                payload: b"ping"
            }])
            .sent,
            1
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut batch = RecvBatch::new(4);
        assert_eq!(srv.recv_batch(&mut batch).unwrap(), 1);
        assert_eq!(batch.local(0), Some(IpAddr::from([127, 0, 0, 2])));
        let from = batch.get_mut(0).unwrap().0;
        // The connected client only accepts the reply if it comes from 127.0.0.2.
        let rep = srv.send_batch(&[Datagram {
            dst: Some(from),
            src: batch.local(0),
            ecn: 0,
            payload: b"pong",
        }]);
        assert_eq!(rep.sent, 1, "{:?}", rep.last_error);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(cli.recv_batch(&mut batch).unwrap(), 1);
        assert_eq!(batch.get_mut(0).unwrap().1, b"pong");
    }

    /// A datagram larger than the receive buffer arrives empty, not cut short.
    #[test]
    fn oversized_datagram_arrives_empty() {
        let a = UdpSocket::bind(&BindOptions {
            addr: Some("127.0.0.1:0".parse().unwrap()),
            ..Default::default()
        })
        .unwrap();
        let mut b = UdpSocket::bind(&BindOptions {
            addr: Some("127.0.0.1:0".parse().unwrap()),
            ..Default::default()
        })
        .unwrap();
        b.connect(a.local_addr().unwrap()).unwrap();
        let big = vec![7u8; MAX_DATAGRAM + 100];
        let ok = vec![8u8; 100];
        fn d(p: &[u8]) -> Datagram<'_> {
            Datagram {
                dst: None,
                src: None,
                ecn: 0,
                payload: p,
            }
        }
        assert_eq!(b.send_batch(&[d(&big), d(&ok)]).sent, 2);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut batch = RecvBatch::new(4);
        assert_eq!(a.recv_batch(&mut batch).unwrap(), 2);
        assert!(batch.get_mut(0).unwrap().1.is_empty());
        assert_eq!(batch.get_mut(1).unwrap().1, &ok[..]);
    }

    /// A socket with `dont_fragment` sends with DF (the kernel's PMTUDISC_DO) and reads its
    /// route's MTU; `route_mtu` reads the same for an address.
    #[test]
    fn dont_fragment_is_set_and_the_route_mtu_is_read() {
        let opts = BindOptions {
            addr: Some("127.0.0.1:0".parse().unwrap()),
            dont_fragment: true,
            ..Default::default()
        };
        let mut s = UdpSocket::bind(&opts).unwrap();
        let fd = s.as_raw_fd();
        assert_eq!(
            get_int(fd, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER).unwrap(),
            libc::IP_PMTUDISC_DO
        );
        assert!(s.path_mtu().is_err(), "not connected");
        let peer: SocketAddr = "127.0.0.1:9".parse().unwrap();
        s.connect(peer).unwrap();
        let lo = std::fs::read_to_string("/sys/class/net/lo/mtu").unwrap();
        // An IP packet is at most 65535 bytes, whatever the device says.
        let lo = lo.trim().parse::<usize>().unwrap().min(65_535);
        assert_eq!(s.path_mtu().unwrap(), lo);
        assert_eq!(route_mtu(peer).unwrap(), lo);
        assert_eq!(ip_udp_overhead(peer), 28);
        assert_eq!(ip_udp_overhead("[::ffff:1.2.3.4]:1".parse().unwrap()), 28);
        assert_eq!(ip_udp_overhead("[2001:2::1]:1".parse().unwrap()), 48);
    }

    #[test]
    fn missing_interface_is_named() {
        let e = UdpSocket::bind(&BindOptions {
            dev: Some("nosuchdev9".into()),
            ..Default::default()
        })
        .err()
        .unwrap();
        assert_eq!(e.to_string(), "interface nosuchdev9 does not exist");
    }
}
