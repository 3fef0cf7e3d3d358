//! TUN device: open by name (`IFF_TUN | IFF_NO_PI`), non-blocking, read and write IP packets in
//! batches.
//!
//! Why our own ~60 lines of ioctl instead of the `tun-rs` crate: braid needs exactly one ioctl
//! (`TUNSETIFF`) and plain `read`/`write` on a non-blocking fd that it registers in its own `mio`
//! loop; the crate brings async runtimes, platform layers and offload paths we do not use yet.
//! The device is not persistent: closing the fd (dropping [`Tun`]) removes it.
//! Addresses, MTU and link state are set through [`crate::netlink`].

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// Longest interface name the kernel accepts (IFNAMSIZ - 1).
pub const MAX_NAME_LEN: usize = libc::IFNAMSIZ - 1;

const TUNSETIFF: libc::c_ulong = 0x4004_54ca; // _IOW('T', 202, int)

#[derive(Debug, thiserror::Error)]
pub enum TunError {
    #[error("cannot create TUN device {name}: {source} (needs root or CAP_NET_ADMIN)")]
    Permission { name: String, source: io::Error },
    #[error("cannot create TUN device {name}: {source}")]
    Other { name: String, source: io::Error },
    #[error("bad TUN device name {0:?}: 1 to 15 characters, no '/', ':' or whitespace")]
    BadName(String),
}

/// A TUN device (layer 3, no packet-info header). Reads and writes never block.
#[derive(Debug)]
pub struct Tun {
    fd: OwnedFd,
    name: String,
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
            flags: (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short,
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
        Ok(Tun {
            fd,
            name: name.to_string(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Reads up to `bufs.len()` packets (one per buffer, each buffer should hold the MTU), stops at
    /// the first `EAGAIN`. Returns the packets' lengths in `lens` and how many were read; `Ok(0)`
    /// means nothing is waiting.
    pub fn recv_batch(&self, bufs: &mut [Vec<u8>], lens: &mut [usize]) -> io::Result<usize> {
        let mut n = 0;
        while n < bufs.len() && n < lens.len() {
            let buf = &mut bufs[n];
            // SAFETY: reading into a buffer we own, up to its length.
            let r = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if r < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => break,
                    io::ErrorKind::Interrupted => continue,
                    _ if n > 0 => break,
                    _ => return Err(e),
                }
            }
            lens[n] = r as usize;
            n += 1;
        }
        Ok(n)
    }

    /// Writes one IP packet. A full device queue (`EAGAIN`) drops the packet and reports `Ok(false)`.
    pub fn send(&self, packet: &[u8]) -> io::Result<bool> {
        loop {
            // SAFETY: writing from a slice we borrow.
            let r =
                unsafe { libc::write(self.fd.as_raw_fd(), packet.as_ptr().cast(), packet.len()) };
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

    /// Writes a batch of packets; returns how many the kernel took. Errors on single packets
    /// (e.g. a malformed IP header the kernel refuses) drop that packet only.
    pub fn send_batch<'a>(&self, packets: impl IntoIterator<Item = &'a [u8]>) -> usize {
        let mut sent = 0;
        for p in packets {
            match self.send(p) {
                Ok(true) => sent += 1,
                Ok(false) => {}
                Err(e) => {
                    tracing::debug!("TUN {}: write of {} bytes failed: {e}", self.name, p.len())
                }
            }
        }
        sent
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
