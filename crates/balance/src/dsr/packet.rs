//! The DSR balancer's only door to the kernel: one `AF_PACKET` raw socket bound to the DSR
//! interface, read and written in batches (`recvmmsg` / `sendmmsg`).
//!
//! The socket runs with `PACKET_VNET_HDR`: every frame is preceded by a 10-byte `virtio_net_hdr`
//! that carries the kernel's checksum-offload and segmentation state. The balancer passes it back
//! unchanged with the frame, so a frame whose TCP checksum is still to be filled in by the NIC
//! (`CHECKSUM_PARTIAL`, common on veth and with TSO) or a GRO/TSO super-frame bigger than the MTU
//! leaves exactly as it came: checksummed and segmented by the kernel on the way out.
//! `PACKET_IGNORE_OUTGOING` keeps our own transmissions out of our receive queue.

use std::io;
use std::mem::MaybeUninit;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use braid_lb::dsr::Mac;

/// Size of `struct virtio_net_hdr` (without `num_buffers`).
pub const VNET_HDR_LEN: usize = 10;
/// Room for the largest frame the kernel can hand us (a 64 KiB GSO super-frame) plus headers.
pub const FRAME_BUF_LEN: usize = VNET_HDR_LEN + 65_536 + 256;

const ETH_P_ALL: u16 = 0x0003;
// <linux/if_packet.h>
const PACKET_ADD_MEMBERSHIP: libc::c_int = 1;
const PACKET_MR_MULTICAST: libc::c_int = 0;
const PACKET_VNET_HDR: libc::c_int = 15;
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
const PACKET_STATISTICS: libc::c_int = 6;
const PACKET_OUTGOING: u8 = 4;

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
        let addrs = nix::ifaddrs::getifaddrs()
            .map_err(|e| anyhow::anyhow!("cannot list addresses of {name:?}: {e}"))?;
        for a in addrs.filter(|a| a.interface_name == name) {
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
    /// Opens a raw socket on interface `ifindex` (needs CAP_NET_RAW).
    pub fn open(ifindex: u32) -> io::Result<PacketSocket> {
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
        setsockopt_int(raw, libc::SOL_PACKET, PACKET_VNET_HDR, 1, "PACKET_VNET_HDR")?;
        // Linux >= 4.20; without it our own frames come back and are ignored by MAC anyway.
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
        Ok(PacketSocket { fd, ifindex })
    }

    /// Also receive frames sent to this multicast MAC (IPv6 solicited-node address of the VIP),
    /// which a NIC would otherwise filter out.
    pub fn join_multicast(&self, mac: Mac) -> io::Result<()> {
        // SAFETY: packet_mreq is plain old data.
        let mut mr: libc::packet_mreq = unsafe { MaybeUninit::zeroed().assume_init() };
        mr.mr_ifindex = self.ifindex as i32;
        mr.mr_type = PACKET_MR_MULTICAST as u16;
        mr.mr_alen = 6;
        mr.mr_address[..6].copy_from_slice(&mac);
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
        let mut iovs: Vec<libc::iovec> = batch
            .bufs
            .iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
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
        }
        batch.len = got;
        Ok(got)
    }

    /// Sends `frames` (each starting with its `virtio_net_hdr`) in as few `sendmmsg` calls as
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

/// What [`PacketSocket::send_batch`] did.
#[derive(Debug, Default)]
pub struct SendOutcome {
    pub sent: usize,
    pub dropped: usize,
    pub last_error: Option<io::Error>,
}

/// Receive buffers for [`PacketSocket::recv_batch`]. Frame `i` is `frame(i)`; its
/// `virtio_net_hdr` precedes it in `with_vnet(i)`.
pub struct FrameBatch {
    bufs: Vec<Vec<u8>>,
    lens: Vec<usize>,
    len: usize,
}

impl FrameBatch {
    pub fn new(n: usize) -> Self {
        FrameBatch {
            bufs: vec![vec![0u8; FRAME_BUF_LEN]; n.max(1)],
            lens: vec![0; n.max(1)],
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
        if l <= VNET_HDR_LEN {
            return &mut [];
        }
        &mut self.bufs[i][VNET_HDR_LEN..l]
    }

    /// Frame `i` with its `virtio_net_hdr`, as it must be sent.
    pub fn with_vnet(&self, i: usize) -> &[u8] {
        &self.bufs[i][..self.lens[i]]
    }
}

/// Prefixes a frame built by the balancer (ARP, NDP) with an all-zero `virtio_net_hdr` (no
/// offload), as the socket expects on send.
pub fn with_empty_vnet(frame: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(VNET_HDR_LEN + frame.len());
    v.extend_from_slice(&[0u8; VNET_HDR_LEN]);
    v.extend_from_slice(frame);
    v
}
