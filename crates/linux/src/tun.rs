//! TUN device: open by name (`IFF_TUN | IFF_NO_PI | IFF_VNET_HDR`), non-blocking, read and write IP
//! packets in batches, with the kernel's TCP offloads.
//!
//! Offloads (`TUNSETOFFLOAD`: checksum, TSO for IPv4 and IPv6): the kernel hands braid TCP
//! super-packets of up to 64 KiB behind a `virtio_net_hdr`, one `read` for what was dozens; braid
//! cuts them into segments itself ([`crate::offload::split`]) so the scheduler still places each
//! segment on a link of its own. On the way out, in-order segments of one flow delivered in the same
//! batch are glued into one super-packet and one `write` ([`Tun::queue`], [`Tun::flush`]). A kernel
//! that refuses `TUNSETOFFLOAD` leaves plain packets behind a zero header; nothing else changes.
//!
//! Why our own ioctls instead of the `tun-rs` crate: braid needs three ioctls and plain `read` /
//! `writev` on a non-blocking fd that it registers in its own `mio` loop; the crate brings async
//! runtimes and platform layers, and its offload path would hand us its own buffers where braid
//! reuses its batch buffers.
//! The device is not persistent: closing the fd (dropping [`Tun`]) removes it.
//! Addresses, MTU and link state are set through [`crate::netlink`].

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use crate::offload::{self, Coalescer, Segments, VirtioNetHdr, VIRTIO_NET_HDR_LEN};

/// Longest interface name the kernel accepts (IFNAMSIZ - 1).
pub const MAX_NAME_LEN: usize = libc::IFNAMSIZ - 1;

const TUNSETIFF: libc::c_ulong = 0x4004_54ca; // _IOW('T', 202, int)
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0; // _IOW('T', 208, unsigned int)
const IFF_VNET_HDR: libc::c_int = 0x4000;
const TUN_F_CSUM: libc::c_ulong = 0x01;
const TUN_F_TSO4: libc::c_ulong = 0x02;
const TUN_F_TSO6: libc::c_ulong = 0x04;
/// The largest read: a 64 KiB super-packet behind its header.
const RX_LEN: usize = VIRTIO_NET_HDR_LEN + 65_535;

#[derive(Debug, thiserror::Error)]
pub enum TunError {
    #[error("cannot create TUN device {name}: {source} (needs root or CAP_NET_ADMIN)")]
    Permission { name: String, source: io::Error },
    #[error("cannot create TUN device {name}: {source}")]
    Other { name: String, source: io::Error },
    #[error("bad TUN device name {0:?}: 1 to 15 characters, no '/', ':' or whitespace")]
    BadName(String),
}

/// A TUN device (layer 3, no packet-info header, a `virtio_net_hdr` on every packet). Reads and
/// writes never block.
#[derive(Debug)]
pub struct Tun {
    fd: OwnedFd,
    name: String,
    /// Whether the kernel took the TSO offloads (super-packets in, glued packets out).
    offload: bool,
    /// The read buffer for one super-packet, and the segments cut from the last one not yet
    /// handed out.
    rx: Vec<u8>,
    pending: Segments,
    next: usize,
    /// Packets queued for the next [`Tun::flush`].
    tx: Coalescer,
    stats: TunStats,
}

/// Counters of the offload path.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TunStats {
    /// Super-packets read, and the segments cut from them.
    pub super_packets: u64,
    pub segments: u64,
    /// Packets read that could not be cut (a header the kernel should never write) or whose
    /// segments do not fit a batch buffer: dropped.
    pub rx_dropped: u64,
    /// Writes that carried several packets glued together, and those packets.
    pub glued_writes: u64,
    pub glued_packets: u64,
}

/// What one [`Tun::flush`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Flushed {
    /// Packets the kernel took.
    pub sent: usize,
    /// Packets dropped because the device queue was full.
    pub queue_full: usize,
    /// Packets the kernel refused (a malformed IP header, say).
    pub errors: usize,
}

#[repr(C)]
struct IfReq {
    name: [libc::c_char; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Whether `name` is a valid interface name.
pub fn valid_ifname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name != "."
        && name != ".."
        && !name
            .bytes()
            .any(|b| b == b'/' || b == b':' || b.is_ascii_whitespace() || b == 0)
}

impl Tun {
    /// Creates (or attaches to) the TUN device `name`.
    pub fn open(name: &str) -> Result<Tun, TunError> {
        if !valid_ifname(name) {
            return Err(TunError::BadName(name.to_string()));
        }
        let err = |source: io::Error| match source.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => TunError::Permission {
                name: name.to_string(),
                source,
            },
            _ => TunError::Other {
                name: name.to_string(),
                source,
            },
        };
        // SAFETY: plain open(2) of a constant NUL-terminated path.
        let raw = unsafe {
            libc::open(
                c"/dev/net/tun".as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(err(io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            flags: (libc::IFF_TUN | libc::IFF_NO_PI | IFF_VNET_HDR) as libc::c_short,
            _pad: [0; 22],
        };
        for (d, s) in req.name.iter_mut().zip(name.bytes()) {
            *d = s as libc::c_char;
        }
        // SAFETY: TUNSETIFF reads/writes a `struct ifreq`, which `IfReq` lays out (40 bytes).
        let rc = unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF as _, &mut req as *mut IfReq) };
        if rc < 0 {
            return Err(err(io::Error::last_os_error()));
        }
        let flags = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6;
        // SAFETY: TUNSETOFFLOAD takes the flags by value.
        let offload = unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETOFFLOAD as _, flags) } == 0;
        if !offload {
            tracing::info!(
                "TUN {name}: the kernel refused TSO offloads ({}); one packet per read and write",
                io::Error::last_os_error()
            );
        }
        Ok(Tun {
            fd,
            name: name.to_string(),
            offload,
            rx: vec![0; RX_LEN],
            pending: Segments::default(),
            next: 0,
            tx: if offload {
                Coalescer::new()
            } else {
                Coalescer::without_glue()
            },
            stats: TunStats::default(),
        })
    }

    /// Whether TSO offloads are on.
    pub fn offload(&self) -> bool {
        self.offload
    }

    pub fn stats(&self) -> TunStats {
        self.stats
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Hands up to `max` IP packets to `f`, each as a slice of the device's own read buffer
    /// (segments left from the last super-packet first, then new reads, until `EAGAIN`): the
    /// caller seals straight from it, with no copy into a batch buffer. Returns how many were
    /// handed out; fewer than `max` means the device has nothing more (`Ok(0)`: nothing was
    /// waiting).
    pub fn recv_each(&mut self, max: usize, mut f: impl FnMut(&[u8])) -> io::Result<usize> {
        let mut n = 0;
        while n < max {
            if let Some(seg) = self.pending.get(self.next) {
                self.next += 1;
                f(seg);
                n += 1;
                continue;
            }
            // SAFETY: reading into a buffer we own, up to its length.
            let r = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    self.rx.as_mut_ptr().cast(),
                    self.rx.len(),
                )
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => break,
                    io::ErrorKind::Interrupted => continue,
                    _ if n > 0 => break,
                    _ => return Err(e),
                }
            }
            let r = r as usize;
            let Some(hdr) = VirtioNetHdr::decode(&self.rx[..r]) else {
                self.stats.rx_dropped += 1;
                continue;
            };
            self.pending.clear();
            self.next = 0;
            match offload::split(&hdr, &self.rx[VIRTIO_NET_HDR_LEN..r], &mut self.pending) {
                Ok(()) if self.pending.len() > 1 => {
                    self.stats.super_packets += 1;
                    self.stats.segments += self.pending.len() as u64;
                }
                Ok(()) => {}
                Err(e) => {
                    self.stats.rx_dropped += 1;
                    tracing::debug!("TUN {}: dropped a packet from the kernel: {e}", self.name);
                }
            }
        }
        Ok(n)
    }

    /// Queues one IP packet for the next [`Tun::flush`] (which glues in-order TCP segments of a
    /// flow into one write).
    pub fn queue(&mut self, packet: &[u8]) {
        self.tx.push(packet);
    }

    /// Writes what [`Tun::queue`] took, in order, and forgets it.
    pub fn flush(&mut self) -> Flushed {
        let mut f = Flushed::default();
        if self.tx.is_empty() {
            return f;
        }
        let fd = self.fd.as_raw_fd();
        let mut glued = (0, 0);
        for (buf, packets) in self.tx.finish() {
            match write_all(fd, buf) {
                Ok(true) => {
                    f.sent += packets;
                    if packets > 1 {
                        glued.0 += 1;
                        glued.1 += packets as u64;
                    }
                }
                Ok(false) => f.queue_full += packets,
                Err(e) => {
                    f.errors += packets;
                    tracing::debug!(
                        "TUN {}: write of {} bytes failed: {e}",
                        self.name,
                        buf.len()
                    );
                }
            }
        }
        self.stats.glued_writes += glued.0;
        self.stats.glued_packets += glued.1;
        self.tx.clear();
        f
    }

    /// Writes one IP packet at once (behind a zero `virtio_net_hdr`). A full device queue
    /// (`EAGAIN`) drops the packet and reports `Ok(false)`.
    pub fn send(&self, packet: &[u8]) -> io::Result<bool> {
        let hdr = [0u8; VIRTIO_NET_HDR_LEN];
        let iov = [
            libc::iovec {
                iov_base: hdr.as_ptr() as *mut _,
                iov_len: hdr.len(),
            },
            libc::iovec {
                iov_base: packet.as_ptr() as *mut _,
                iov_len: packet.len(),
            },
        ];
        loop {
            // SAFETY: writev from two slices we borrow for the call.
            let r = unsafe { libc::writev(self.fd.as_raw_fd(), iov.as_ptr(), 2) };
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
}

/// Writes one buffer (header and packet) to the TUN: `Ok(false)` if the queue is full.
fn write_all(fd: RawFd, buf: &[u8]) -> io::Result<bool> {
    loop {
        // SAFETY: writing from a slice we borrow.
        let r = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
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

/// Packets the kernel dropped because the device `name`'s queue towards its reader (braid) was
/// full: its `tx_dropped`, read from `/proc/self/net/dev` (this process's network namespace).
pub fn queue_drops(name: &str) -> io::Result<u64> {
    let text = std::fs::read_to_string("/proc/self/net/dev")?;
    tx_dropped(&text, name).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("{name} not in /proc/net/dev"),
        )
    })
}

/// The transmit `drop` column of `name`'s line in `/proc/net/dev` text.
fn tx_dropped(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (dev, counters) = l.split_once(':')?;
        if dev.trim() != name {
            return None;
        }
        // 8 receive columns, then transmit bytes, packets, errs, drop.
        counters.split_whitespace().nth(11)?.parse().ok()
    })
}

impl AsRawFd for Tun {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for Tun {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ifreq_layout_matches_kernel() {
        assert_eq!(std::mem::size_of::<IfReq>(), 40);
    }

    #[test]
    fn tx_dropped_is_read_from_proc_net_dev() {
        let text = "Inter-|   Receive |  Transmit\n face |bytes packets errs drop fifo frame compressed multicast|bytes packets errs drop fifo colls carrier compressed\n    lo: 10 1 0 0 0 0 0 0 10 1 0 0 0 0 0 0\nbraid0: 500 5 0 2 0 0 0 0 900 9 1 37 0 0 0 0\n";
        assert_eq!(tx_dropped(text, "braid0"), Some(37));
        assert_eq!(tx_dropped(text, "lo"), Some(0));
        assert_eq!(tx_dropped(text, "braid"), None);
    }

    #[test]
    fn names() {
        assert!(valid_ifname("braid0"));
        assert!(!valid_ifname(""));
        assert!(!valid_ifname("a-very-long-interface-name"));
        assert!(!valid_ifname("a/b"));
        assert!(!valid_ifname("a b"));
    }
}
