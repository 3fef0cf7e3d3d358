//! Interface configuration through rtnetlink (the `rtnetlink` crate), not by running `ip`:
//! address with prefix (IPv4 or IPv6), MTU, UP, and deletion.
//!
//! `rtnetlink` is async (tokio); each call here runs on a small current-thread runtime made for
//! it, so the rest of braid stays a plain poll loop.

use std::net::IpAddr;

use futures::TryStreamExt;

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

/// Sets `name`'s MTU, adds `addr/prefix` (replacing the same address if present) and brings it up.
pub fn configure(name: &str, addr: IpAddr, prefix: u8, mtu: u32) -> Result<(), NetlinkError> {
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
        h.address()
            .add(idx, addr, prefix)
            .replace()
            .execute()
            .await
            .map_err(|e| req("add address", e))?;
        h.link()
            .set(idx)
            .up()
            .execute()
            .await
            .map_err(|e| req("set up", e))?;
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// In a private network namespace (this thread only): create a TUN, configure it through
    /// netlink, see it up with its MTU, delete it. Skipped without CAP_SYS_ADMIN.
    #[test]
    fn tun_configure_delete_in_private_netns() {
        std::thread::spawn(|| {
            if nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).is_err() {
                eprintln!("skipped: cannot unshare a network namespace (not root)");
                return;
            }
            let tun = crate::tun::Tun::open("braidt0").unwrap();
            configure("braidt0", "198.18.99.1".parse().unwrap(), 30, 1380).unwrap();
            let info = link_info("braidt0").unwrap();
            assert_eq!((info.mtu, info.up), (Some(1380), true));
            assert_eq!(if_index("braidt0").unwrap(), info.index);
            drop(tun);
            assert!(matches!(
                if_index("braidt0"),
                Err(NetlinkError::NoSuchInterface(_))
            ));
            assert!(matches!(
                configure("nosuch0", "198.18.99.1".parse().unwrap(), 30, 1400),
                Err(NetlinkError::NoSuchInterface(_))
            ));
            delete("nosuch0").unwrap();
        })
        .join()
        .unwrap();
    }
}
