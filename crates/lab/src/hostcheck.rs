//! What the lab needs from the machine, checked before anything is built: the system tools it
//! drives, and the test hosts' TCP congestion control.
//!
//! ## Congestion control on a stock kernel
//! A network namespace other than the first may only select an algorithm listed in the global
//! `net.ipv4.tcp_allowed_congestion_control`, which on a stock kernel lists fewer than
//! `tcp_available_congestion_control` (Debian: "reno bbr" of "reno bbr cubic"); an algorithm
//! built as a module is not even available until loaded. So [`set_hosts_cc`]:
//! 1. loads the algorithm if the kernel does not list it yet (a `TCP_CONGESTION` socket option
//!    on a throw-away socket, which autoloads `tcp_NAME` as root and changes nothing global);
//! 2. under a lock shared by every braid process, adds it to the allowed list only if missing,
//!    sets the namespaces' default, and puts the list back exactly as it was ([`AllowedGuard`]
//!    restores on drop: on success, on error, on panic and after Ctrl-C, which only sets a
//!    flag). The list is changed for milliseconds, not for the whole run: a namespace keeps its
//!    default once set, whatever the list says later.

use std::io;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use braid_linux::sysctl;

const ALLOWED: &str = "net.ipv4.tcp_allowed_congestion_control";
const AVAILABLE: &str = "net.ipv4.tcp_available_congestion_control";
const DEFAULT: &str = "net.ipv4.tcp_congestion_control";

/// A system tool the lab runs, and the Debian package that has it.
pub struct Tool {
    pub command: &'static str,
    pub package: &'static str,
}

/// What every lab run drives (the link runs and the bundle): only `ip`, which a Debian machine
/// has as it comes. Pinging and turning offloads off are done in-process
/// ([`braid_linux::icmp`], [`braid_linux::ethtool`]): the `ping` and `ethtool` tools are not
/// on a fresh machine, and needing them made the README's first command fail there.
pub const LAB_TOOLS: &[Tool] = &[Tool {
    command: "ip",
    package: "iproute2",
}];

/// Fails with one line naming the first missing tool and its package.
pub fn require_tools(tools: &[Tool]) -> anyhow::Result<()> {
    let missing: Vec<&Tool> = tools
        .iter()
        .filter(|t| find_in_path(t.command).is_none())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = missing.iter().map(|t| t.command).collect();
    let packages: Vec<&str> = missing.iter().map(|t| t.package).collect();
    bail!(
        "braid lab needs `{}`, not installed here: apt-get install {}",
        names.join("`, `"),
        packages.join(" ")
    )
}

/// The full path of `command` on `$PATH`, if it is there and executable.
pub fn find_in_path(command: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(command))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// A congestion control name as the kernel spells them (`TCP_CA_NAME_MAX` is 16 with the NUL).
fn check_name(cc: &str) -> anyhow::Result<()> {
    let ok = !cc.is_empty()
        && cc.len() < 16
        && cc
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !ok {
        bail!("--cc {cc:?} is not a TCP congestion control name (e.g. cubic, bbr, reno)");
    }
    Ok(())
}

fn listed(list: &str, cc: &str) -> bool {
    list.split_whitespace().any(|a| a == cc)
}

/// Makes `cc` available in the kernel (loading its module if need be), or says why it cannot.
fn ensure_available(cc: &str) -> anyhow::Result<()> {
    let available = sysctl::read(AVAILABLE).with_context(|| format!("reading {AVAILABLE}"))?;
    if listed(&available, cc) {
        return Ok(());
    }
    match sysctl::load_tcp_congestion_control(cc) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => bail!(
            "TCP congestion control {cc:?} is not loaded and loading it needs root \
             (CAP_NET_ADMIN): run braid lab as root, or load it first: modprobe tcp_{cc}"
        ),
        Err(_) => bail!(
            "TCP congestion control {cc:?} is not available in this kernel (available: {}): \
             load its module (modprobe tcp_{cc}) or choose one of those with --cc",
            available
        ),
    }
}

/// The allowed list with one algorithm added, until dropped: then the list is written back as
/// it was.
pub struct AllowedGuard {
    original: Option<String>,
}

impl AllowedGuard {
    /// Adds `cc` to the allowed list if it is not there.
    pub fn ensure(cc: &str) -> anyhow::Result<AllowedGuard> {
        let current = sysctl::read(ALLOWED).with_context(|| format!("reading {ALLOWED}"))?;
        if listed(&current, cc) {
            return Ok(AllowedGuard { original: None });
        }
        let added = if current.is_empty() {
            cc.to_string()
        } else {
            format!("{current} {cc}")
        };
        sysctl::write(ALLOWED, &added).map_err(|e| {
            if e.kind() == io::ErrorKind::PermissionDenied {
                anyhow::anyhow!(
                    "TCP congestion control {cc:?} is not in {ALLOWED} ({current}), and adding it \
                     for the lab needs root (CAP_NET_ADMIN): run braid lab as root"
                )
            } else {
                anyhow::anyhow!("adding {cc:?} to {ALLOWED}: {e}")
            }
        })?;
        Ok(AllowedGuard {
            original: Some(current),
        })
    }

    /// Whether the list was changed (and will be restored).
    pub fn changed(&self) -> bool {
        self.original.is_some()
    }
}

impl Drop for AllowedGuard {
    fn drop(&mut self) {
        if let Some(orig) = self.original.take() {
            if let Err(e) = sysctl::write(ALLOWED, &orig) {
                eprintln!("braid lab: could not put {ALLOWED} back to {orig:?}: {e}");
            }
        }
    }
}

/// The lock every braid process takes around a change of the allowed list.
pub fn lock_path() -> PathBuf {
    let run = Path::new("/run");
    if run.is_dir() {
        run.join("braid-lab-cc.lock")
    } else {
        std::env::temp_dir().join("braid-lab-cc.lock")
    }
}

/// Sets the default TCP congestion control of each namespace in `namespaces` to `cc`,
/// allowing it for the moment it takes if the kernel does not (see the module's docs).
pub fn set_hosts_cc(namespaces: &[String], cc: &str) -> anyhow::Result<()> {
    check_name(cc)?;
    ensure_available(cc)?;
    let lock = lock_path();
    let _lock =
        sysctl::FileLock::acquire(&lock).with_context(|| format!("locking {}", lock.display()))?;
    let _allowed = AllowedGuard::ensure(cc)?;
    for ns in namespaces {
        sysctl::write_in_netns(ns, DEFAULT, cc).map_err(|e| {
            let why = match e.raw_os_error() {
                Some(libc::ENOENT) => "the kernel has no such algorithm".to_string(),
                Some(libc::EPERM) => format!("the kernel does not allow it ({ALLOWED})"),
                _ => e.to_string(),
            };
            anyhow::anyhow!("cannot set TCP congestion control {cc:?} in namespace {ns}: {why}")
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["cubic", "bbr", "reno", "dctcp", "bbr3", "h-tcp"] {
            check_name(ok).unwrap();
        }
        for bad in ["", "cu bic", "a/b", "waytoolongnameforcc", "bbr\n"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn listed_is_by_word() {
        assert!(listed("reno bbr cubic", "bbr"));
        assert!(!listed("reno bbr2", "bbr"));
        assert!(!listed("", "bbr"));
    }

    #[test]
    fn missing_tool_is_named_with_its_package() {
        let tools = [
            Tool {
                command: "sh",
                package: "dash",
            },
            Tool {
                command: "braid-no-such-tool",
                package: "braid-no-such-package",
            },
        ];
        let e = require_tools(&tools).unwrap_err().to_string();
        assert!(e.contains("`braid-no-such-tool`"), "{e}");
        assert!(e.contains("apt-get install braid-no-such-package"), "{e}");
        assert!(!e.contains("dash"), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
        require_tools(&tools[..1]).unwrap();
    }

    #[test]
    fn unknown_algorithm_is_one_line_naming_it_and_the_fix() {
        let e = ensure_available("braidnosuchcc").unwrap_err().to_string();
        assert!(e.contains("\"braidnosuchcc\""), "{e}");
        assert!(e.contains("modprobe tcp_braidnosuchcc"), "{e}");
        assert!(!e.contains("needs root"), "{e}");
        assert_eq!(e.lines().count(), 1);
    }
}
