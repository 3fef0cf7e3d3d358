//! sysctl keys (`/proc/sys`), in this process's network namespace or in a named one.
//!
//! `/proc/sys/net` belongs to the network namespace of the task that *opens* the file, so a
//! key of another namespace is written from a short-lived thread that first joins it with
//! `setns(2)` (the thread's namespace never leaks into the rest of the process). Errors keep
//! their `io::ErrorKind`/errno, so callers can tell "not permitted" (EPERM) from "no such
//! algorithm" (ENOENT) instead of guessing from a tool's stderr.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::PathBuf;

/// `net.ipv4.tcp_congestion_control` -> `/proc/sys/net/ipv4/tcp_congestion_control`.
pub fn path(key: &str) -> PathBuf {
    PathBuf::from("/proc/sys").join(key.replace('.', "/"))
}

/// The value of `key`, trimmed.
pub fn read(key: &str) -> io::Result<String> {
    Ok(std::fs::read_to_string(path(key))?.trim().to_string())
}

/// Sets `key` to `value` in this process's namespaces.
pub fn write(key: &str, value: &str) -> io::Result<()> {
    let mut f = OpenOptions::new().write(true).open(path(key))?;
    f.write_all(value.as_bytes())
}

/// Sets `key` to `value` inside the named network namespace (`ip netns add NAME`, i.e.
/// `/run/netns/NAME`).
pub fn write_in_netns(netns: &str, key: &str, value: &str) -> io::Result<()> {
    in_netns(netns, || write(key, value))
}

/// Runs `f` on a short-lived thread that has joined the named network namespace
/// (`/run/netns/NAME`) and returns what it returns. What `f` opens there (a `/proc/sys/net`
/// file, a socket) belongs to that namespace for its whole life, wherever it is used later;
/// the calling thread's namespace never changes.
pub fn in_netns<T: Send>(netns: &str, f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
    let ns_path = PathBuf::from("/run/netns").join(netns);
    std::thread::scope(|s| {
        s.spawn(move || -> io::Result<T> {
            let ns = std::fs::File::open(&ns_path).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("network namespace {}: {e}", ns_path.display()),
                )
            })?;
            nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
            f()
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("thread in a network namespace panicked")))
    })
}

/// Asks the kernel for TCP congestion control `name` on a throw-away socket of this process.
/// As root this loads its module (`tcp_NAME`) if it is not loaded yet, as `setsockopt
/// (TCP_CONGESTION)` autoloads; nothing global changes. `NotFound` if the kernel has no such
/// algorithm.
pub fn load_tcp_congestion_control(name: &str) -> io::Result<()> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    s.set_tcp_congestion(name.as_bytes())
}

/// An exclusive lock across processes (`flock(2)` on `path`), released on drop. Used to make a
/// read-modify-write of a global key atomic between several braid processes.
pub struct FileLock(std::fs::File);

impl FileLock {
    /// Blocks until the lock on `path` (created if missing) is ours.
    pub fn acquire(path: &std::path::Path) -> io::Result<FileLock> {
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)?;
        loop {
            // SAFETY: flock on a file descriptor we own.
            let rc = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&f), libc::LOCK_EX) };
            if rc == 0 {
                return Ok(FileLock(f));
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        // SAFETY: unlock a descriptor we own (closing it would unlock too).
        unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&self.0), libc::LOCK_UN) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_to_path() {
        assert_eq!(
            path("net.ipv4.tcp_allowed_congestion_control"),
            PathBuf::from("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
        );
    }

    #[test]
    fn reads_a_key() {
        let v = read("net.ipv4.tcp_available_congestion_control").unwrap();
        assert!(v.split_whitespace().any(|a| a == "reno"), "{v}");
    }

    #[test]
    fn missing_namespace_is_an_error() {
        let e = write_in_netns("braid-no-such-ns", "net.ipv4.ip_forward", "0").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("braid-no-such-ns"), "{e}");
    }
}
