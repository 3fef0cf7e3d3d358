//! A device's offloads, through the `SIOCETHTOOL` ioctl (what `ethtool -K DEV tx off rx off tso
//! off gso off gro off` does).
//!
//! The lab turns the veth offloads off so that its emulator sees wire-sized frames, and used to
//! run the `ethtool` tool for it: a package a fresh machine lacks, which made the README's first
//! command fail there. These are the legacy per-feature commands (`ETHTOOL_S*`, one `u32`
//! each), which every kernel since 2.6 maps onto its feature flags; no crate of the field wraps
//! them (the `ethtool` crate speaks the generic-netlink family, far more than four switches
//! need). Run it inside a namespace with [`crate::sysctl::in_netns`].
//!
//! One difference from the tool (compared with `ethtool -k` on a lab veth, kernel of 2025):
//! the legacy TSO switch does not know `tx-tcp-accecn-segmentation`, which stays on. It applies
//! only to flows that negotiated AccECN, which the lab's hosts never initiate (`tcp_ecn` = 2),
//! and with GSO off no such super-packet is built anyway.

use std::io;
use std::os::fd::AsRawFd;

/// `ETHTOOL_S*` / `ETHTOOL_G*` command numbers (linux/ethtool.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offload {
    /// Receive checksum offload (`rx`).
    RxChecksum,
    /// Transmit checksum offload (`tx`); the kernel turns off what needs it (TSO) too.
    TxChecksum,
    /// TCP segmentation offload (`tso`).
    Tso,
    /// Generic segmentation offload (`gso`).
    Gso,
    /// Generic receive offload (`gro`).
    Gro,
}

impl Offload {
    /// Every offload the lab turns off, in the order that leaves none depending on a disabled one.
    pub const ALL: [Offload; 5] = [
        Offload::Gro,
        Offload::Gso,
        Offload::Tso,
        Offload::TxChecksum,
        Offload::RxChecksum,
    ];

    /// (get, set) command numbers.
    fn commands(self) -> (u32, u32) {
        match self {
            Offload::RxChecksum => (0x14, 0x15),
            Offload::TxChecksum => (0x16, 0x17),
            Offload::Tso => (0x1e, 0x1f),
            Offload::Gso => (0x23, 0x24),
            Offload::Gro => (0x2b, 0x2c),
        }
    }
}

/// `struct ethtool_value`.
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

fn ioctl(dev: &str, value: &mut EthtoolValue) -> io::Result<()> {
    if dev.is_empty() || dev.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("device name {dev:?}"),
        ));
    }
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
    // SAFETY: an all-zero `ifreq` is valid (a name of NULs and a null union).
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(dev.bytes()) {
        *d = s as libc::c_char;
    }
    ifr.ifr_ifru.ifru_data = (value as *mut EthtoolValue).cast();
    // SAFETY: SIOCETHTOOL reads `ifr` (a NUL-terminated name, checked above, and a pointer to
    // an `ethtool_value` that outlives the call) and writes only through that pointer.
    let r = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCETHTOOL as _, &mut ifr) };
    if r < 0 {
        // The errno as is (ENODEV, EOPNOTSUPP, EPERM): callers name the device.
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Turns one offload of `dev` on or off.
pub fn set(dev: &str, offload: Offload, on: bool) -> io::Result<()> {
    let mut v = EthtoolValue {
        cmd: offload.commands().1,
        data: u32::from(on),
    };
    ioctl(dev, &mut v)
}

/// Whether one offload of `dev` is on.
pub fn get(dev: &str, offload: Offload) -> io::Result<bool> {
    let mut v = EthtoolValue {
        cmd: offload.commands().0,
        data: 0,
    };
    ioctl(dev, &mut v)?;
    Ok(v.data != 0)
}

/// Turns every offload of [`Offload::ALL`] off on `dev`.
pub fn all_off(dev: &str) -> io::Result<()> {
    for o in Offload::ALL {
        set(dev, o, false)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_device_name_is_an_error() {
        assert_eq!(
            get("", Offload::Tso).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            get("a-name-far-too-long", Offload::Tso).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        // No such device: the kernel's answer, its errno kept.
        let e = get("braidnosuch0", Offload::Tso).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENODEV), "{e}");
    }
}
