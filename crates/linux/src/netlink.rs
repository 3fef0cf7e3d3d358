//! Interface configuration through rtnetlink (the `rtnetlink` crate), not by running `ip`:
//! addresses with prefix (IPv4 and/or IPv6), MTU, UP, and deletion. The one setting netlink cannot
//! change, a device's `disable_ipv6`, is written to its sysctl file under /proc.
//!
//! `rtnetlink` is async (tokio); each call here runs on a small current-thread runtime made for
//! it, so the rest of braid stays a plain poll loop.

use std::net::IpAddr;

use futures::TryStreamExt;
use netlink_packet_route::address::{AddressAttribute, AddressFlag};

#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("netlink: {0}")]
    Io(#[from] std::io::Error),
    #[error("interface {0} does not exist")]
    NoSuchInterface(String),
    #[error("interface {name}: {what}: {source}")]
    Request {
        name: String,
        what: &'static str,
        source: Box<rtnetlink::Error>,
    },
    #[error("interface {name}: {path}: {source}")]
    Sysctl {
        name: String,
        path: String,
        source: std::io::Error,
    },
    #[error("interface {0}: cannot add an IPv6 address: IPv6 is not available in this kernel (booted with ipv6.disable=1?)")]
    NoIpv6(String),
}

fn run<F: std::future::Future<Output = Result<T, NetlinkError>>, T>(
    f: impl FnOnce(rtnetlink::Handle) -> F,
) -> Result<T, NetlinkError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    rt.block_on(async move {
        let (conn, handle, _) = rtnetlink::new_connection()?;
        let task = tokio::spawn(conn);
        let r = f(handle).await;
        task.abort();
        r
    })
}

async fn index_of(_handle: &rtnetlink::Handle, name: &str) -> Result<u32, NetlinkError> {
    // if_nametoindex rather than a link dump: netlink-packet-route logs warnings on attributes
    // newer kernels add to the dump (IFLA_INET6_CONF), and we only need the index.
    match nix::net::if_::if_nametoindex(name) {
        Ok(i) => Ok(i),
        Err(nix::errno::Errno::ENODEV) => Err(NetlinkError::NoSuchInterface(name.to_string())),
        Err(e) => Err(NetlinkError::Io(e.into())),
    }
}

/// Whether interface `name` exists in this network namespace. A read-only query
/// (`if_nametoindex`, not `/sys/class/net`, which shows the namespace sysfs was mounted in), so
/// `braid check` can use it.
pub fn interface_exists(name: &str) -> bool {
    crate::tun::valid_ifname(name) && nix::net::if_::if_nametoindex(name).is_ok()
}

/// The interface index of `name`.
pub fn if_index(name: &str) -> Result<u32, NetlinkError> {
    run(|h| async move { index_of(&h, name).await })
}

/// What the kernel says about an interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkInfo {
    pub index: u32,
    pub mtu: Option<u32>,
    /// Administratively up (IFF_UP).
    pub up: bool,
}

/// Looks `name` up.
pub fn link_info(name: &str) -> Result<LinkInfo, NetlinkError> {
    use netlink_packet_route::link::{LinkAttribute, LinkFlag};
    run(|h| async move {
        let mut links = h.link().get().match_name(name.to_string()).execute();
        let msg = match links.try_next().await {
            Ok(Some(msg)) => msg,
            Ok(None) => return Err(NetlinkError::NoSuchInterface(name.to_string())),
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => {
                return Err(NetlinkError::NoSuchInterface(name.to_string()))
            }
            Err(source) => {
                return Err(NetlinkError::Request {
                    name: name.to_string(),
                    what: "lookup",
                    source: Box::new(source),
                })
            }
        };
        let mtu = msg.attributes.iter().find_map(|a| {
            if let LinkAttribute::Mtu(m) = a {
                Some(*m)
            } else {
                None
            }
        });
        Ok(LinkInfo {
            index: msg.header.index,
            mtu,
            up: msg.header.flags.contains(&LinkFlag::Up),
        })
    })
}

/// Sets `name`'s MTU, adds every `(address, prefix)` of `addrs` (replacing the same address if
/// present) and brings it up. With an IPv6 address, IPv6 is first turned on for this device alone
/// (see [`enable_ipv6`]), and the IPv6 addresses skip duplicate address detection (`nodad`): the
/// tunnel's far end is the only neighbour, and DAD would hold the address back for a second.
pub fn configure(name: &str, addrs: &[(IpAddr, u8)], mtu: u32) -> Result<(), NetlinkError> {
    if addrs.iter().any(|(a, _)| a.is_ipv6()) {
        enable_ipv6(name)?;
    }
    run(|h| async move {
        let idx = index_of(&h, name).await?;
        let req = |what, source| NetlinkError::Request {
            name: name.to_string(),
            what,
            source: Box::new(source),
        };
        h.link()
            .set(idx)
            .mtu(mtu)
            .execute()
            .await
            .map_err(|e| req("set MTU", e))?;
        for &(addr, prefix) in addrs {
            let mut add = h.address().add(idx, addr, prefix).replace();
            if addr.is_ipv6() {
                add.message_mut()
                    .attributes
                    .push(AddressAttribute::Flags(vec![AddressFlag::Nodad]));
            }
            add.execute().await.map_err(|e| req("add address", e))?;
        }
        h.link()
            .set(idx)
            .up()
            .execute()
            .await
            .map_err(|e| req("set up", e))?;
        Ok(())
    })
}

/// Turns IPv6 on for the device `name` if its `disable_ipv6` sysctl is set (as a namespace's
/// `net.ipv6.conf.default.disable_ipv6=1` leaves every new device); returns whether it changed
/// anything. Only this device's setting is touched, and it goes away with the device.
pub fn enable_ipv6(name: &str) -> Result<bool, NetlinkError> {
    if !crate::tun::valid_ifname(name) {
        return Err(NetlinkError::NoSuchInterface(name.to_string()));
    }
    if !std::path::Path::new("/proc/sys/net/ipv6").exists() {
        return Err(NetlinkError::NoIpv6(name.to_string()));
    }
    let path = format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6");
    let err = |source| NetlinkError::Sysctl {
        name: name.to_string(),
        path: path.clone(),
        source,
    };
    let now = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(NetlinkError::NoSuchInterface(name.to_string()))
        }
        Err(e) => return Err(err(e)),
    };
    if now.trim() == "0" {
        return Ok(false);
    }
    std::fs::write(&path, "0").map_err(err)?;
    Ok(true)
}

/// The addresses of interface `name` (IPv4 and IPv6, link-local ones included) with prefixes.
pub fn addresses(name: &str) -> Result<Vec<(IpAddr, u8)>, NetlinkError> {
    run(|h| async move {
        let idx = index_of(&h, name).await?;
        let mut dump = h.address().get().set_link_index_filter(idx).execute();
        let mut out = Vec::new();
        loop {
            match dump.try_next().await {
                Ok(Some(msg)) => {
                    // IFA_LOCAL is the device's own address (IFA_ADDRESS may be the peer's on
                    // point-to-point links); IPv6 messages carry only IFA_ADDRESS.
                    let get = |want_local: bool| {
                        msg.attributes.iter().find_map(|a| match a {
                            AddressAttribute::Local(ip) if want_local => Some(*ip),
                            AddressAttribute::Address(ip) if !want_local => Some(*ip),
                            _ => None,
                        })
                    };
                    if let Some(ip) = get(true).or_else(|| get(false)) {
                        out.push((ip, msg.header.prefix_len));
                    }
                }
                Ok(None) => return Ok(out),
                Err(source) => {
                    return Err(NetlinkError::Request {
                        name: name.to_string(),
                        what: "list addresses",
                        source: Box::new(source),
                    })
                }
            }
        }
    })
}

/// Sets `name`'s transmit queue length (packets). For a TUN device this is the queue between the
/// kernel and the process reading it: too short and a CPU-bound tunnel drops bursts (TCP
/// retransmits), too long and it adds delay.
pub fn set_txqueuelen(name: &str, len: u32) -> Result<(), NetlinkError> {
    use netlink_packet_route::link::LinkAttribute;
    run(|h| async move {
        let idx = index_of(&h, name).await?;
        let mut req = h.link().set(idx);
        req.message_mut()
            .attributes
            .push(LinkAttribute::TxQueueLen(len));
        req.execute().await.map_err(|source| NetlinkError::Request {
            name: name.to_string(),
            what: "set txqueuelen",
            source: Box::new(source),
        })
    })
}

/// Routes `prefix` (address, length) through the interface `name` (replacing such a route if
/// one exists): a concentrator routes each client's LANs into its TUN device.
pub fn add_route(name: &str, prefix: (IpAddr, u8)) -> Result<(), NetlinkError> {
    route(name, prefix, true)
}

/// Removes the route of `prefix` through `name` (no error if it is gone).
pub fn del_route(name: &str, prefix: (IpAddr, u8)) -> Result<(), NetlinkError> {
    route(name, prefix, false)
}

fn route(name: &str, (addr, len): (IpAddr, u8), add: bool) -> Result<(), NetlinkError> {
    run(|h| async move {
        let idx = index_of(&h, name).await?;
        let msg = match addr {
            IpAddr::V4(a) => {
                let mut r = h
                    .route()
                    .add()
                    .v4()
                    .destination_prefix(a, len)
                    .output_interface(idx)
                    .replace();
                r.message_mut().clone()
            }
            IpAddr::V6(a) => {
                let mut r = h
                    .route()
                    .add()
                    .v6()
                    .destination_prefix(a, len)
                    .output_interface(idx)
                    .replace();
                r.message_mut().clone()
            }
        };
        let err = |source| NetlinkError::Request {
            name: name.to_string(),
            what: if add { "add route" } else { "delete route" },
            source: Box::new(source),
        };
        if add {
            let mut r = h.route().add().replace();
            *r.message_mut() = msg;
            r.execute().await.map_err(err)
        } else {
            match h.route().del(msg).execute().await {
                Ok(()) => Ok(()),
                // ESRCH: no such route (already gone with the device, or never added).
                Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ESRCH => Ok(()),
                Err(e) => Err(err(e)),
            }
        }
    })
}

/// Deletes the interface `name` (no error if it is already gone).
pub fn delete(name: &str) -> Result<(), NetlinkError> {
    run(|h| async move {
        let idx = match index_of(&h, name).await {
            Ok(i) => i,
            Err(NetlinkError::NoSuchInterface(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        h.link()
            .del(idx)
            .execute()
            .await
            .map_err(|source| NetlinkError::Request {
                name: name.to_string(),
                what: "delete",
                source: Box::new(source),
            })
    })
}

/// A non-blocking rtnetlink socket subscribed to interface and address changes
/// (`RTMGRP_LINK`, `RTMGRP_IPV4_IFADDR`, `RTMGRP_IPV6_IFADDR`), for a poll loop: register
/// [`AsRawFd::as_raw_fd`](std::os::fd::AsRawFd::as_raw_fd) for readability, then call [`Monitor::drain`]. A plain socket rather than
/// `rtnetlink`'s async stream: the event loop is `mio`, and all it needs is "something changed".
pub struct Monitor {
    fd: std::os::fd::OwnedFd,
}

impl Monitor {
    pub fn open() -> std::io::Result<Monitor> {
        use std::os::fd::FromRawFd;
        // SAFETY: plain socket(2); the descriptor is owned at once.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        // SAFETY: sockaddr_nl is plain old data; zeroed is valid.
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        sa.nl_groups =
            (libc::RTMGRP_LINK | libc::RTMGRP_IPV4_IFADDR | libc::RTMGRP_IPV6_IFADDR) as u32;
        // SAFETY: bind with a pointer to a sockaddr_nl and its size.
        let rc = unsafe {
            libc::bind(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                (&sa as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Monitor { fd })
    }

    /// Reads every queued notification; whether any said that a link or an address appeared,
    /// changed or went away. An overrun (`ENOBUFS`: the kernel dropped notifications) counts
    /// as a change, since what was lost is unknown.
    pub fn drain(&self) -> std::io::Result<bool> {
        let mut changed = false;
        let mut buf = vec![0u8; 16384];
        loop {
            // SAFETY: reading into a buffer we own, up to its length.
            let r = unsafe {
                libc::recv(
                    std::os::fd::AsRawFd::as_raw_fd(&self.fd),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EAGAIN) => return Ok(changed),
                    Some(libc::EINTR) => continue,
                    Some(libc::ENOBUFS) => {
                        changed = true;
                        continue;
                    }
                    _ => return Err(e),
                }
            }
            changed |= has_change(&buf[..r as usize]);
        }
    }
}

impl std::os::fd::AsRawFd for Monitor {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.fd)
    }
}

/// Whether a buffer of netlink messages holds an RTM_{NEW,DEL}{LINK,ADDR}. Walks the
/// `nlmsghdr` lengths only; a truncated or malformed message ends the walk.
fn has_change(mut buf: &[u8]) -> bool {
    const HDR: usize = 16;
    while buf.len() >= HDR {
        let len = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        let ty = u16::from_ne_bytes([buf[4], buf[5]]);
        if matches!(
            ty,
            libc::RTM_NEWLINK | libc::RTM_DELLINK | libc::RTM_NEWADDR | libc::RTM_DELADDR
        ) {
            return true;
        }
        let step = (len + 3) & !3;
        if len < HDR || step > buf.len() {
            return false;
        }
        buf = &buf[step..];
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(ty: u16, len: u32) -> Vec<u8> {
        let mut m = len.to_ne_bytes().to_vec();
        m.extend_from_slice(&ty.to_ne_bytes());
        m.resize(len as usize, 0);
        m
    }

    #[test]
    fn change_messages_are_recognised() {
        assert!(!has_change(&[]));
        assert!(!has_change(&msg(libc::RTM_NEWROUTE, 28)));
        let mut two = msg(libc::RTM_NEWROUTE, 28);
        two.extend(msg(libc::RTM_DELADDR, 24));
        assert!(has_change(&two));
        assert!(has_change(&msg(libc::RTM_NEWLINK, 32)));
        // A length that runs past the buffer, or is shorter than a header, ends the walk.
        let mut bad = msg(libc::RTM_NEWROUTE, 28);
        bad[0] = 200;
        bad.extend(msg(libc::RTM_NEWADDR, 24));
        assert!(!has_change(&bad));
        let mut zero = msg(libc::RTM_NEWROUTE, 28);
        zero[..4].copy_from_slice(&0u32.to_ne_bytes());
        assert!(!has_change(&zero));
    }

    /// In a private network namespace: the monitor sees an address added to a device.
    #[test]
    fn monitor_sees_address_changes_in_private_netns() {
        std::thread::spawn(|| {
            if nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).is_err() {
                eprintln!("skipped: cannot unshare a network namespace (not root)");
                return;
            }
            let m = Monitor::open().unwrap();
            assert!(!m.drain().unwrap(), "nothing changed yet");
            let tun = crate::tun::Tun::open("braidm0").unwrap();
            configure("braidm0", &[("198.18.98.1".parse().unwrap(), 30)], 1400).unwrap();
            assert!(m.drain().unwrap(), "link and address changes seen");
            assert!(!m.drain().unwrap(), "drained");
            drop(tun);
        })
        .join()
        .unwrap();
    }

    /// In a private network namespace (this thread only): create a TUN, configure it through
    /// netlink with an IPv4 and an IPv6 address, see it up with its MTU and both addresses, delete
    /// it. Skipped without CAP_SYS_ADMIN.
    #[test]
    fn tun_configure_delete_in_private_netns() {
        std::thread::spawn(|| {
            if nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).is_err() {
                eprintln!("skipped: cannot unshare a network namespace (not root)");
                return;
            }
            // As the lab's namespaces do: new devices start with IPv6 off.
            let default = "/proc/sys/net/ipv6/conf/default/disable_ipv6";
            std::fs::write(default, "1").unwrap();
            let tun = crate::tun::Tun::open("braidt0").unwrap();
            let v4: (IpAddr, u8) = ("198.18.99.1".parse().unwrap(), 30);
            let v6: (IpAddr, u8) = ("2001:2:0:99::1".parse().unwrap(), 64);
            configure("braidt0", &[v4, v6], 1380).unwrap();
            let info = link_info("braidt0").unwrap();
            assert_eq!((info.mtu, info.up), (Some(1380), true));
            let have = addresses("braidt0").unwrap();
            assert!(have.contains(&v4) && have.contains(&v6), "{have:?}");
            let dis = std::fs::read_to_string("/proc/sys/net/ipv6/conf/braidt0/disable_ipv6");
            assert_eq!(dis.unwrap().trim(), "0");
            // Configuring again (same addresses) replaces rather than fails; IPv6 stays on.
            configure("braidt0", &[v4, v6], 1380).unwrap();
            assert!(!enable_ipv6("braidt0").unwrap());
            assert_eq!(if_index("braidt0").unwrap(), info.index);
            drop(tun);
            assert!(matches!(
                if_index("braidt0"),
                Err(NetlinkError::NoSuchInterface(_))
            ));
            assert!(matches!(
                configure("nosuch0", &[v4], 1400),
                Err(NetlinkError::NoSuchInterface(_))
            ));
            delete("nosuch0").unwrap();
        })
        .join()
        .unwrap();
    }
}
