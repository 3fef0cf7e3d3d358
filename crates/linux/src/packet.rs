//! `AF_PACKET` raw sockets bound to one interface, read and written in batches (`recvmmsg` /
//! `sendmmsg`): the DSR balancer's only door to the kernel, and the lab link emulator's wire.
//! Written once here for both (the emulator asks for a promiscuous socket without offload
//! headers; the balancer for one with them).
//!
//! With [`PacketOptions::vnet_hdr`] the socket runs with `PACKET_VNET_HDR`: every frame is preceded by a 10-byte `virtio_net_hdr`
//! that carries the kernel's checksum-offload and segmentation state. The balancer passes it back
//! unchanged with the frame, so a frame whose TCP checksum is still to be filled in by the NIC
//! (`CHECKSUM_PARTIAL`, common on veth and with TSO) or a GRO/TSO super-frame bigger than the MTU
//! leaves exactly as it came: checksummed and segmented by the kernel on the way out.
//! `PACKET_IGNORE_OUTGOING` keeps our own transmissions out of our receive queue.
//!
//! VLANs: the kernel (or the NIC) strips the outer 802.1Q tag of a received frame before a packet
//! socket sees it and reports it beside the frame (`PACKET_AUXDATA`: `tp_vlan_tci`, valid when
//! `TP_STATUS_VLAN_VALID`). The socket asks for that report, and a frame forwarded or answered on
//! behalf of a tagged one gets its tag back ([`FrameBatch::restore_vlan`]), so it leaves on the
//! VLAN it came from instead of the untagged one.

use std::io;
use std::mem::MaybeUninit;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use braid_lb::dsr::{insert_vlan_tag, Mac, VlanTag};

/// Size of `struct virtio_net_hdr` (without `num_buffers`).
pub const VNET_HDR_LEN: usize = 10;
/// Room for the largest frame the kernel can hand us (a 64 KiB GSO super-frame) plus headers.
pub const FRAME_BUF_LEN: usize = VNET_HDR_LEN + 65_536 + 256;

const ETH_P_ALL: u16 = 0x0003;
// <linux/if_packet.h>
const PACKET_ADD_MEMBERSHIP: libc::c_int = 1;
const PACKET_MR_MULTICAST: libc::c_int = 0;
const PACKET_MR_PROMISC: libc::c_int = 1;
const PACKET_VNET_HDR: libc::c_int = 15;
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
const PACKET_STATISTICS: libc::c_int = 6;
const PACKET_OUTGOING: u8 = 4;
const PACKET_AUXDATA: libc::c_int = 8;
const TP_STATUS_VLAN_VALID: u32 = 1 << 4;
const TP_STATUS_VLAN_TPID_VALID: u32 = 1 << 6;
/// `virtio_net_hdr.flags`: the checksum at `csum_start + csum_offset` is still to be filled in.
const VIRTIO_NET_HDR_F_NEEDS_CSUM: u8 = 1;
/// Room for one `PACKET_AUXDATA` control message (`CMSG_SPACE(sizeof(tpacket_auxdata))` = 40).
const CMSG_BUF_LEN: usize = 64;

/// `struct tpacket_auxdata` (<linux/if_packet.h>).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct TpacketAuxdata {
    tp_status: u32,
    tp_len: u32,
    tp_snaplen: u32,
    tp_mac: u16,
    tp_net: u16,
    tp_vlan_tci: u16,
    tp_vlan_tpid: u16,
}

/// The VLAN tag the kernel stripped from a frame, from its `PACKET_AUXDATA` report.
fn vlan_of(aux: &TpacketAuxdata) -> Option<VlanTag> {
    if aux.tp_status & TP_STATUS_VLAN_VALID == 0 {
        return None;
    }
    let tpid = if aux.tp_status & TP_STATUS_VLAN_TPID_VALID != 0 && aux.tp_vlan_tpid != 0 {
        aux.tp_vlan_tpid
    } else {
        VlanTag::TPID_8021Q
    };
    Some(VlanTag {
        tpid,
        tci: aux.tp_vlan_tci,
    })
}

/// What the balancer needs to know about its interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceInfo {
    pub name: String,
    pub index: u32,
    pub mac: Mac,
    /// The interface's first IPv4 address (sender of ARP requests).
    pub ipv4: Option<Ipv4Addr>,
    /// The interface's IPv6 link-local address, else its first IPv6 address (source of NS).
    pub ipv6: Option<Ipv6Addr>,
    /// Administratively up with a carrier (`IFF_UP` and `IFF_RUNNING`).
    pub up: bool,
}

impl InterfaceInfo {
    /// Looks the interface up: index, MAC, addresses. A clear error if it does not exist or is
    /// not Ethernet.
    pub fn lookup(name: &str) -> anyhow::Result<InterfaceInfo> {
        let index = nix::net::if_::if_nametoindex(name)
            .map_err(|_| anyhow::anyhow!("interface {name:?} does not exist"))?;
        let mut mac = None;
        let mut ipv4 = None;
        let mut v6: Vec<Ipv6Addr> = Vec::new();
        let mut up = false;
        let addrs = nix::ifaddrs::getifaddrs()
            .map_err(|e| anyhow::anyhow!("cannot list addresses of {name:?}: {e}"))?;
        for a in addrs.filter(|a| a.interface_name == name) {
            use nix::net::if_::InterfaceFlags as F;
            up |= a.flags.contains(F::IFF_UP | F::IFF_RUNNING);
            let Some(addr) = a.address else { continue };
            if let Some(link) = addr.as_link_addr() {
                if let Some(m) = link.addr() {
                    if m != [0; 6] {
                        mac = Some(m);
                    }
                }
            } else if let Some(sin) = addr.as_sockaddr_in() {
                ipv4.get_or_insert(sin.ip());
            } else if let Some(sin6) = addr.as_sockaddr_in6() {
                v6.push(sin6.ip());
            }
        }
        let mac =
            mac.ok_or_else(|| anyhow::anyhow!("interface {name:?} has no Ethernet (MAC) address"))?;
        let ipv6 = v6
            .iter()
            .copied()
            .find(|a| a.segments()[0] & 0xffc0 == 0xfe80)
            .or_else(|| v6.first().copied());
        Ok(InterfaceInfo {
            name: name.to_string(),
            index,
            mac,
            ipv4,
            ipv6,
            up,
        })
    }

    /// Whether `ip` is one of this interface's own addresses.
    pub fn owns(&self, ip: IpAddr) -> bool {
        Some(ip) == self.ipv4.map(IpAddr::V4) || Some(ip) == self.ipv6.map(IpAddr::V6)
    }
}

/// An `AF_PACKET` socket bound to one interface.
pub struct PacketSocket {
    fd: OwnedFd,
    ifindex: u32,
    /// Bytes before each frame: a `virtio_net_hdr`, or none.
    hdr_len: usize,
}

/// How a [`PacketSocket`] is opened.
#[derive(Debug, Clone, Copy, Default)]
pub struct PacketOptions {
    /// Frames carry a `virtio_net_hdr` (`PACKET_VNET_HDR`): checksum and segmentation offload
    /// state passes through unchanged.
    pub vnet_hdr: bool,
    /// Receive every frame on the wire, not only those for the interface's MACs.
    pub promiscuous: bool,
}

/// The index of interface `name` (a clear error if there is none).
pub fn ifindex(name: &str) -> io::Result<u32> {
    nix::net::if_::if_nametoindex(name).map_err(|_| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("interface {name:?} does not exist"),
        )
    })
}

fn cvt(r: libc::c_int, what: &str) -> io::Result<libc::c_int> {
    if r < 0 {
        let e = io::Error::last_os_error();
        Err(io::Error::new(e.kind(), format!("{what}: {e}")))
    } else {
        Ok(r)
    }
}

fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    opt: libc::c_int,
    val: libc::c_int,
    what: &str,
) -> io::Result<()> {
    // SAFETY: passes a pointer to a live c_int and its size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            (&val as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    cvt(r, what).map(|_| ())
}

impl PacketSocket {
    /// Opens a raw socket on interface `ifindex` (needs CAP_NET_RAW). Non-blocking; own
    /// transmissions are not received back.
    pub fn open(ifindex: u32, opts: PacketOptions) -> io::Result<PacketSocket> {
        // Protocol 0 at creation: nothing is queued until bind() names the interface, so no frame
        // of another interface ever slips in.
        // SAFETY: plain socket(2) call.
        let raw = cvt(
            unsafe {
                libc::socket(
                    libc::AF_PACKET,
                    libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                    0,
                )
            },
            "socket(AF_PACKET)",
        )?;
        // SAFETY: `raw` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        if opts.vnet_hdr {
            setsockopt_int(raw, libc::SOL_PACKET, PACKET_VNET_HDR, 1, "PACKET_VNET_HDR")?;
        }
        setsockopt_int(raw, libc::SOL_PACKET, PACKET_AUXDATA, 1, "PACKET_AUXDATA")?;
        // Linux >= 4.20; without it our own frames come back and recv_batch drops them by type.
        let _ = setsockopt_int(
            raw,
            libc::SOL_PACKET,
            PACKET_IGNORE_OUTGOING,
            1,
            "PACKET_IGNORE_OUTGOING",
        );
        // Big buffers absorb bursts (SO_RCVBUFFORCE as root, else capped by rmem_max).
        for (force, plain) in [
            (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
            (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
        ] {
            if setsockopt_int(raw, libc::SOL_SOCKET, force, 8 << 20, "SO_*BUFFORCE").is_err() {
                let _ = setsockopt_int(raw, libc::SOL_SOCKET, plain, 8 << 20, "SO_*BUF");
            }
        }
        // SAFETY: sockaddr_ll is plain old data.
        let mut sll: libc::sockaddr_ll = unsafe { MaybeUninit::zeroed().assume_init() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = ETH_P_ALL.to_be();
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: binds to a fully initialised sockaddr_ll of the declared size.
        cvt(
            unsafe {
                libc::bind(
                    raw,
                    (&sll as *const libc::sockaddr_ll).cast(),
                    std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
                )
            },
            "bind(AF_PACKET)",
        )?;
        let sock = PacketSocket {
            fd,
            ifindex,
            hdr_len: if opts.vnet_hdr { VNET_HDR_LEN } else { 0 },
        };
        if opts.promiscuous {
            sock.add_membership(PACKET_MR_PROMISC, None)
                .map_err(|e| io::Error::new(e.kind(), format!("promiscuous mode: {e}")))?;
        }
        Ok(sock)
    }

    /// Also receive frames sent to this multicast MAC (IPv6 solicited-node address of the VIP),
    /// which a NIC would otherwise filter out.
    pub fn join_multicast(&self, mac: Mac) -> io::Result<()> {
        self.add_membership(PACKET_MR_MULTICAST, Some(mac))
    }

    /// `PACKET_ADD_MEMBERSHIP` of type `kind` (multicast with an address, or promiscuous).
    fn add_membership(&self, kind: libc::c_int, mac: Option<Mac>) -> io::Result<()> {
        // SAFETY: packet_mreq is plain old data.
        let mut mr: libc::packet_mreq = unsafe { MaybeUninit::zeroed().assume_init() };
        mr.mr_ifindex = self.ifindex as i32;
        mr.mr_type = kind as u16;
        if let Some(mac) = mac {
            mr.mr_alen = 6;
            mr.mr_address[..6].copy_from_slice(&mac);
        }
        // SAFETY: pointer to a live packet_mreq and its size.
        let r = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                PACKET_ADD_MEMBERSHIP,
                (&mr as *const libc::packet_mreq).cast(),
                std::mem::size_of::<libc::packet_mreq>() as libc::socklen_t,
            )
        };
        cvt(r, "PACKET_ADD_MEMBERSHIP").map(|_| ())
    }

    /// Waits up to `timeout` (to the nanosecond: `ppoll`) for a frame. `Ok(false)` on timeout
    /// or a signal; an error if the socket failed (its interface went away).
    pub fn wait_readable(&self, timeout: Duration) -> io::Result<bool> {
        self.wait(libc::POLLIN, timeout)
    }

    /// Waits up to `timeout` for room in the socket's send queue (after [`PacketSocket::send`]
    /// found it full).
    pub fn wait_writable(&self, timeout: Duration) -> io::Result<bool> {
        self.wait(libc::POLLOUT, timeout)
    }

    fn wait(&self, events: libc::c_short, timeout: Duration) -> io::Result<bool> {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs().min(3600) as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events,
            revents: 0,
        };
        // SAFETY: one live pollfd, a valid timespec, no signal mask.
        let r = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(false);
            }
            return Err(io::Error::new(e.kind(), format!("poll: {e}")));
        }
        if pfd.revents & (libc::POLLERR | libc::POLLNVAL) != 0 {
            return Err(io::Error::other(
                "the packet socket failed (interface gone?)",
            ));
        }
        Ok(r > 0)
    }

    /// Frames the kernel dropped because our receive queue was full, since the last call
    /// (`PACKET_STATISTICS` resets on read).
    pub fn take_drops(&self) -> u64 {
        // struct tpacket_stats { unsigned int tp_packets, tp_drops; }
        let mut st = [0u32; 2];
        let mut len = std::mem::size_of_val(&st) as libc::socklen_t;
        // SAFETY: passes a live 8-byte buffer and its length.
        let r = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                PACKET_STATISTICS,
                st.as_mut_ptr().cast(),
                &mut len,
            )
        };
        if r < 0 {
            0
        } else {
            u64::from(st[1])
        }
    }

    pub fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Receives up to `batch.capacity()` frames in one `recvmmsg`. `Ok(0)`: nothing waiting.
    pub fn recv_batch(&self, batch: &mut FrameBatch) -> io::Result<usize> {
        let n = batch.bufs.len();
        batch.len = 0;
        batch.hdr_len = self.hdr_len;
        // Each buffer keeps 4 bytes spare for a VLAN tag put back on send.
        let mut iovs: Vec<libc::iovec> = batch
            .bufs
            .iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len() - 4,
            })
            .collect();
        // SAFETY: sockaddr_ll is plain old data.
        let mut names: Vec<libc::sockaddr_ll> =
            vec![unsafe { MaybeUninit::zeroed().assume_init() }; n];
        let mut msgs: Vec<libc::mmsghdr> = (0..n)
            .map(|i| {
                // SAFETY: msghdr is plain old data.
                let mut hdr: libc::msghdr = unsafe { MaybeUninit::zeroed().assume_init() };
                hdr.msg_name = (&mut names[i] as *mut libc::sockaddr_ll).cast();
                hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
                hdr.msg_iov = &mut iovs[i];
                hdr.msg_iovlen = 1;
                hdr.msg_control = batch.ctrl[i].as_mut_ptr().cast();
                hdr.msg_controllen = CMSG_BUF_LEN as _;
                libc::mmsghdr {
                    msg_hdr: hdr,
                    msg_len: 0,
                }
            })
            .collect();
        let got = loop {
            // SAFETY: every mmsghdr points at live buffers (iovs, names) sized as declared.
            let r = unsafe {
                libc::recvmmsg(
                    self.fd.as_raw_fd(),
                    msgs.as_mut_ptr(),
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
                _ => return Err(e),
            }
        };
        for i in 0..got {
            let truncated = msgs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            batch.lens[i] = if truncated || names[i].sll_pkttype == PACKET_OUTGOING {
                0 // never forward a cut frame; never re-handle our own
            } else {
                msgs[i].msg_len as usize
            };
            batch.vlans[i] = auxdata(&msgs[i].msg_hdr).as_ref().and_then(vlan_of);
        }
        batch.len = got;
        Ok(got)
    }

    /// Sends one frame (after its `virtio_net_hdr` if the socket has them). `Ok(false)`: the
    /// socket's queue is full and the frame was not sent.
    pub fn send(&self, frame: &[u8]) -> io::Result<bool> {
        loop {
            // SAFETY: sends an initialised buffer we borrow for the call on a bound socket.
            let r = unsafe {
                libc::send(
                    self.fd.as_raw_fd(),
                    frame.as_ptr().cast(),
                    frame.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if r >= 0 {
                return Ok(true);
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(false),
                _ => return Err(e),
            }
        }
    }

    /// Sends `frames` (each starting with its `virtio_net_hdr` if the socket has them) in as few `sendmmsg` calls as
    /// possible. Returns how many were sent; a frame the kernel refuses is skipped (counted by
    /// the caller as a send error), a full queue stops the batch.
    pub fn send_batch(&self, frames: &[&[u8]]) -> SendOutcome {
        let mut out = SendOutcome::default();
        let mut i = 0;
        while i < frames.len() {
            let chunk = &frames[i..frames.len().min(i + 256)];
            let mut iovs: Vec<libc::iovec> = chunk
                .iter()
                .map(|f| libc::iovec {
                    iov_base: f.as_ptr() as *mut libc::c_void,
                    iov_len: f.len(),
                })
                .collect();
            let mut hdrs: Vec<libc::mmsghdr> = (0..chunk.len())
                .map(|k| {
                    // SAFETY: msghdr is plain old data.
                    let mut hdr: libc::msghdr = unsafe { MaybeUninit::zeroed().assume_init() };
                    hdr.msg_iov = &mut iovs[k];
                    hdr.msg_iovlen = 1;
                    libc::mmsghdr {
                        msg_hdr: hdr,
                        msg_len: 0,
                    }
                })
                .collect();
            // SAFETY: headers point at live iovecs borrowed for this call; the socket is bound, so
            // no address is needed.
            let r = unsafe {
                libc::sendmmsg(
                    self.fd.as_raw_fd(),
                    hdrs.as_mut_ptr(),
                    hdrs.len() as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            if r > 0 {
                out.sent += r as usize;
                i += r as usize;
                continue;
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => {
                    out.dropped += frames.len() - i;
                    break;
                }
                _ => {
                    // The first frame of the chunk is at fault (e.g. EMSGSIZE): skip it.
                    out.dropped += 1;
                    out.last_error = Some(e);
                    i += 1;
                }
            }
        }
        out
    }
}

/// The `PACKET_AUXDATA` control message of a received message, if any.
fn auxdata(hdr: &libc::msghdr) -> Option<TpacketAuxdata> {
    // SAFETY: `hdr` was filled by recvmmsg; the CMSG_* macros stay within msg_control's
    // msg_controllen bytes, and the data is copied out unaligned.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(hdr);
        while !c.is_null() {
            let len = (*c).cmsg_len as usize;
            if (*c).cmsg_level == libc::SOL_PACKET
                && (*c).cmsg_type == PACKET_AUXDATA
                && len >= libc::CMSG_LEN(std::mem::size_of::<TpacketAuxdata>() as u32) as usize
            {
                return Some(std::ptr::read_unaligned(
                    libc::CMSG_DATA(c).cast::<TpacketAuxdata>(),
                ));
            }
            c = libc::CMSG_NXTHDR(hdr, c);
        }
    }
    None
}

/// What [`PacketSocket::send_batch`] did.
#[derive(Debug, Default)]
pub struct SendOutcome {
    pub sent: usize,
    pub dropped: usize,
    pub last_error: Option<io::Error>,
}

/// Receive buffers for [`PacketSocket::recv_batch`]. Frame `i` is `frame_mut(i)`; its
/// `virtio_net_hdr` (on a socket with them) precedes it in [`FrameBatch::sendable`].
pub struct FrameBatch {
    bufs: Vec<Vec<u8>>,
    /// Bytes before each frame (the receiving socket's `virtio_net_hdr`, or none).
    hdr_len: usize,
    lens: Vec<usize>,
    /// The VLAN tag the kernel stripped from each frame.
    vlans: Vec<Option<VlanTag>>,
    /// Control-message room of each frame (8-byte aligned, as `cmsghdr` wants).
    ctrl: Vec<[u64; CMSG_BUF_LEN / 8]>,
    len: usize,
}

impl FrameBatch {
    pub fn new(n: usize) -> Self {
        FrameBatch {
            bufs: vec![vec![0u8; FRAME_BUF_LEN]; n.max(1)],
            hdr_len: VNET_HDR_LEN,
            lens: vec![0; n.max(1)],
            vlans: vec![None; n.max(1)],
            ctrl: vec![[0; CMSG_BUF_LEN / 8]; n.max(1)],
            len: 0,
        }
    }

    /// How many frames one [`PacketSocket::recv_batch`] can take.
    pub fn capacity(&self) -> usize {
        self.bufs.len()
    }

    /// Frames received by the last [`PacketSocket::recv_batch`].
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The Ethernet frame `i` (empty if it was truncated, ours, or shorter than the header).
    pub fn frame_mut(&mut self, i: usize) -> &mut [u8] {
        let l = self.lens[i];
        if l <= self.hdr_len {
            return &mut [];
        }
        &mut self.bufs[i][self.hdr_len..l]
    }

    /// Frame `i` with its `virtio_net_hdr` (if the socket has them), as it must be sent.
    pub fn sendable(&self, i: usize) -> &[u8] {
        &self.bufs[i][..self.lens[i]]
    }

    /// The VLAN tag the kernel stripped from frame `i` (`None`: it came untagged).
    pub fn vlan(&self, i: usize) -> Option<VlanTag> {
        self.vlans[i]
    }

    /// Puts frame `i`'s stripped VLAN tag back (call after rewriting it, before sending it), so
    /// that it leaves on the VLAN it came from. False if the frame could not take it (then it
    /// must not be sent: untagged, it would land on another VLAN).
    pub fn restore_vlan(&mut self, i: usize) -> bool {
        let Some(tag) = self.vlans[i] else {
            return true;
        };
        let l = self.lens[i];
        if l <= self.hdr_len {
            return false;
        }
        let buf = &mut self.bufs[i];
        let tagged = if self.hdr_len == 0 {
            insert_vlan_tag(buf, l, tag)
        } else {
            retag(buf, l, tag)
        };
        match tagged {
            Some(n) => {
                self.lens[i] = n;
                self.vlans[i] = None;
                true
            }
            None => false,
        }
    }

    /// Sets frame `i` (a test's stand-in for a received one): `frame` after an empty
    /// `virtio_net_hdr`, with the VLAN tag the kernel would have reported.
    #[cfg(test)]
    fn set(&mut self, i: usize, vnet: [u8; VNET_HDR_LEN], frame: &[u8], vlan: Option<VlanTag>) {
        self.bufs[i][..VNET_HDR_LEN].copy_from_slice(&vnet);
        self.bufs[i][VNET_HDR_LEN..VNET_HDR_LEN + frame.len()].copy_from_slice(frame);
        self.lens[i] = VNET_HDR_LEN + frame.len();
        self.vlans[i] = vlan;
        self.len = self.len.max(i + 1);
    }
}

/// Inserts `tag` into the frame in `buf[VNET_HDR_LEN..len]` and moves the offsets of its
/// `virtio_net_hdr` (checksum start, header length) 4 bytes on with it. The new length.
fn retag(buf: &mut [u8], len: usize, tag: VlanTag) -> Option<usize> {
    let n = insert_vlan_tag(&mut buf[VNET_HDR_LEN..], len - VNET_HDR_LEN, tag)?;
    // struct virtio_net_hdr { u8 flags, gso_type; u16 hdr_len, gso_size, csum_start,
    // csum_offset; } in the host's byte order (the socket's, as the kernel wrote it).
    fn bump(buf: &mut [u8], at: usize) {
        let v = u16::from_ne_bytes([buf[at], buf[at + 1]]).saturating_add(4);
        buf[at..at + 2].copy_from_slice(&v.to_ne_bytes());
    }
    if buf[0] & VIRTIO_NET_HDR_F_NEEDS_CSUM != 0 {
        bump(buf, 6);
    }
    if buf[1] != 0 {
        bump(buf, 2); // a GSO frame: its headers got 4 bytes longer
    }
    Some(VNET_HDR_LEN + n)
}

/// [`with_empty_vnet`] with `vlan` put back (an answer to a tagged request).
pub fn with_empty_vnet_tagged(frame: &[u8], vlan: Option<VlanTag>) -> Vec<u8> {
    let mut v = with_empty_vnet(frame);
    if let Some(tag) = vlan {
        let len = v.len();
        v.resize(len + 4, 0);
        match retag(&mut v, len, tag) {
            Some(n) => v.truncate(n),
            None => v.truncate(len),
        }
    }
    v
}

/// Prefixes a frame built by the balancer (ARP, NDP) with an all-zero `virtio_net_hdr` (no
/// offload), as the socket expects on send.
pub fn with_empty_vnet(frame: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(VNET_HDR_LEN + frame.len());
    v.extend_from_slice(&[0u8; VNET_HDR_LEN]);
    v.extend_from_slice(frame);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aux(status: u32, tci: u16, tpid: u16) -> TpacketAuxdata {
        TpacketAuxdata {
            tp_status: status,
            tp_vlan_tci: tci,
            tp_vlan_tpid: tpid,
            ..TpacketAuxdata::default()
        }
    }

    #[test]
    fn auxdata_says_which_vlan_a_frame_came_on() {
        assert_eq!(vlan_of(&aux(0, 100, 0)), None, "no VLAN_VALID: untagged");
        assert_eq!(
            vlan_of(&aux(TP_STATUS_VLAN_VALID, 100, 0)),
            Some(VlanTag {
                tpid: 0x8100,
                tci: 100
            })
        );
        // Priority-tagged (VLAN 0) is still a tag; an 802.1ad TPID is kept.
        assert_eq!(
            vlan_of(&aux(
                TP_STATUS_VLAN_VALID | TP_STATUS_VLAN_TPID_VALID,
                3 << 13,
                0x88a8
            )),
            Some(VlanTag {
                tpid: 0x88a8,
                tci: 3 << 13
            })
        );
    }

    #[test]
    fn a_frame_without_offload_header_gets_its_vlan_tag_back() {
        let mut frame = vec![0u8; 60];
        frame[12..14].copy_from_slice(&[0x08, 0x00]);
        let tag = VlanTag {
            tpid: 0x8100,
            tci: 7,
        };
        let mut b = FrameBatch::new(1);
        b.hdr_len = 0;
        b.bufs[0][..60].copy_from_slice(&frame);
        b.lens[0] = 60;
        b.vlans[0] = Some(tag);
        b.len = 1;
        assert_eq!(b.frame_mut(0).len(), 60);
        assert!(b.restore_vlan(0));
        assert_eq!(b.sendable(0).len(), 64);
        assert_eq!(&b.sendable(0)[12..18], &[0x81, 0x00, 0, 7, 0x08, 0x00]);
    }

    #[test]
    fn a_forwarded_frame_gets_its_vlan_tag_back_and_its_offload_offsets_follow() {
        let mut frame = vec![0u8; 60];
        frame[12..14].copy_from_slice(&[0x08, 0x00]);
        frame[14] = 0x45;
        // NEEDS_CSUM, GSO TCPv4, hdr_len 54, gso_size 1448, csum_start 34, csum_offset 16.
        let mut vnet = [0u8; VNET_HDR_LEN];
        vnet[0] = VIRTIO_NET_HDR_F_NEEDS_CSUM;
        vnet[1] = 1;
        vnet[2..4].copy_from_slice(&54u16.to_ne_bytes());
        vnet[4..6].copy_from_slice(&1448u16.to_ne_bytes());
        vnet[6..8].copy_from_slice(&34u16.to_ne_bytes());
        vnet[8..10].copy_from_slice(&16u16.to_ne_bytes());
        let tag = VlanTag {
            tpid: 0x8100,
            tci: 100,
        };
        let mut b = FrameBatch::new(2);
        b.set(0, vnet, &frame, Some(tag));
        b.set(1, [0; VNET_HDR_LEN], &frame, None);
        assert_eq!(b.vlan(0), Some(tag));
        assert!(b.restore_vlan(0) && b.restore_vlan(1));
        let out = b.sendable(0);
        assert_eq!(out.len(), VNET_HDR_LEN + 64);
        let f = &out[VNET_HDR_LEN..];
        assert_eq!(&f[12..18], &[0x81, 0x00, 0, 100, 0x08, 0x00]);
        assert_eq!(f[18], 0x45);
        let u16_at = |at: usize| u16::from_ne_bytes([out[at], out[at + 1]]);
        assert_eq!(
            (u16_at(2), u16_at(4), u16_at(6), u16_at(8)),
            (58, 1448, 38, 16)
        );
        // Restoring twice does not tag twice; an untagged frame is left alone.
        assert!(b.restore_vlan(0));
        assert_eq!(b.sendable(0).len(), VNET_HDR_LEN + 64);
        assert_eq!(&b.sendable(1)[VNET_HDR_LEN..], &frame[..]);
        // An answer (ARP reply) to a tagged request is tagged too, with an empty vnet header.
        let r = with_empty_vnet_tagged(&frame, Some(tag));
        assert_eq!(&r[..VNET_HDR_LEN], &[0; VNET_HDR_LEN]);
        assert_eq!(&r[VNET_HDR_LEN + 12..VNET_HDR_LEN + 16], &[0x81, 0, 0, 100]);
        assert_eq!(
            with_empty_vnet_tagged(&frame, None),
            with_empty_vnet(&frame)
        );
    }
}
