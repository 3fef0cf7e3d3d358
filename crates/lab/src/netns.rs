//! The lab's private network: three namespaces and two veth pairs per link, built with `ip`, and the
//! processes the lab runs inside them. Everything is removed by `Drop` (also on error and panic).
//!
//! ```text
//!  bl<pid>a (host A)            bl<pid>e (emulator)             bl<pid>b (host B)
//!  a<i> 198.18.<i>.1/24 ==veth== ea<i>  [link model]  eb<i> ==veth== b<i> 198.18.<i>.2/24
//! ```

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// Host A's address on link `i` (from 1).
pub fn addr_a(i: usize) -> String {
    format!("198.18.{i}.1")
}

/// Host B's address on link `i` (from 1).
pub fn addr_b(i: usize) -> String {
    format!("198.18.{i}.2")
}

/// Runs `ip ARGS`, mapping failures (EPERM in particular) to one-line errors.
pub fn ip(args: &[&str]) -> anyhow::Result<()> {
    run_tool("ip", args)
}

fn run_tool(tool: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(tool)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run '{tool}' (is it installed?)"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr)
            .trim()
            .replace('\n', "; ");
        let denied = err.contains("Operation not permitted") || err.contains("Permission denied");
        // As root, EPERM is the kernel refusing the change itself, not a lack of privilege.
        if denied && !crate::is_root() {
            bail!("braid lab needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) to build its network namespaces: '{tool} {}' failed: {err}", args.join(" "));
        }
        bail!("'{tool} {}' failed: {err}", args.join(" "));
    }
    Ok(())
}

/// Runs `CMD` inside namespace `ns`.
pub fn in_ns(ns: &str, cmd: &str, args: &[&str]) -> anyhow::Result<()> {
    let mut all = vec!["netns", "exec", ns, cmd];
    all.extend_from_slice(args);
    ip(&all)
}

/// The lab's namespaces and veths. Dropping it deletes the namespaces (and with them every veth).
pub struct Topology {
    pub prefix: String,
    pub links: usize,
    created: Vec<String>,
}

impl Topology {
    /// Host A (client side).
    pub fn ns_a(&self) -> String {
        format!("{}a", self.prefix)
    }
    /// Host B (server side).
    pub fn ns_b(&self) -> String {
        format!("{}b", self.prefix)
    }
    /// The emulator.
    pub fn ns_e(&self) -> String {
        format!("{}e", self.prefix)
    }

    /// Builds the namespaces and `links` links, interfaces up, offloads off (the emulator must see
    /// real frames of at most the MTU, with finished checksums), IPv6 off (no stray traffic).
    pub fn create(prefix: &str, links: usize) -> anyhow::Result<Topology> {
        let mut topo = Topology {
            prefix: prefix.to_string(),
            links,
            created: Vec::new(),
        };
        for ns in [topo.ns_a(), topo.ns_b(), topo.ns_e()] {
            ip(&["netns", "add", &ns])?;
            topo.created.push(ns.clone());
            for key in [
                "net.ipv6.conf.all.disable_ipv6",
                "net.ipv6.conf.default.disable_ipv6",
            ] {
                braid_linux::sysctl::write_in_netns(&ns, key, "1")
                    .with_context(|| format!("{key}=1 in namespace {ns}"))?;
            }
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        let (a, b, e) = (topo.ns_a(), topo.ns_b(), topo.ns_e());
        for i in 1..=links {
            let (ai, eai, ebi, bi) = (
                format!("a{i}"),
                format!("ea{i}"),
                format!("eb{i}"),
                format!("b{i}"),
            );
            ip(&[
                "link", "add", &ai, "netns", &a, "type", "veth", "peer", "name", &eai, "netns", &e,
            ])?;
            ip(&[
                "link", "add", &ebi, "netns", &e, "type", "veth", "peer", "name", &bi, "netns", &b,
            ])?;
            ip(&[
                "-n",
                &a,
                "addr",
                "add",
                &format!("{}/24", addr_a(i)),
                "dev",
                &ai,
            ])?;
            ip(&[
                "-n",
                &b,
                "addr",
                "add",
                &format!("{}/24", addr_b(i)),
                "dev",
                &bi,
            ])?;
            for (ns, dev) in [(&a, &ai), (&e, &eai), (&e, &ebi), (&b, &bi)] {
                // `ethtool -K DEV tx off rx off tso off gso off gro off`, without the tool.
                braid_linux::sysctl::in_netns(ns, || braid_linux::ethtool::all_off(dev))
                    .with_context(|| format!("turning the offloads of {dev} in {ns} off"))?;
                ip(&["-n", ns, "link", "set", dev, "up"])?;
            }
        }
        Ok(topo)
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for ns in self.created.drain(..).rev() {
            let _ = Command::new("ip")
                .args(["netns", "delete", &ns])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Names of the namespaces that currently exist.
pub fn list_namespaces() -> Vec<String> {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect()
}

/// A process the lab started inside a namespace. Dropping it stops it (SIGTERM, then SIGKILL).
pub struct Proc {
    pub name: String,
    child: Child,
    pub stdout: Option<BufReader<ChildStdout>>,
    pub stdin: Option<ChildStdin>,
    log: PathBuf,
    /// All of stdout, read by a thread since [`Proc::read_output`].
    reader: Option<std::thread::JoinHandle<String>>,
}

impl Proc {
    /// Starts `exe ARGS` in namespace `ns` with stdin and stdout piped and stderr to `log`. The
    /// child gets SIGTERM if the lab dies (`PR_SET_PDEATHSIG`), so nothing outlives a killed lab.
    pub fn spawn(
        name: &str,
        ns: &str,
        exe: &Path,
        args: &[String],
        log: PathBuf,
    ) -> anyhow::Result<Proc> {
        let logf =
            std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns]).arg(exe).args(args);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(logf);
        // SAFETY: the closure only makes one prctl call (async-signal-safe); nothing else runs
        // between fork and exec.
        unsafe {
            cmd.pre_exec(braid_linux::process::terminate_with_parent);
        }
        let mut child = cmd.spawn().with_context(|| format!("start {name}"))?;
        let stdout = child.stdout.take().map(BufReader::new);
        let stdin = child.stdin.take();
        Ok(Proc {
            name: name.to_string(),
            child,
            stdout,
            stdin,
            log,
            reader: None,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The last lines of the process's stderr, for error messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }

    /// Whether it has exited (and how).
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Reads one line of stdout, waiting at most `timeout`. Runs the read on a helper thread so
    /// the wait is bounded whatever the child does.
    pub fn read_line(&mut self, timeout: Duration) -> anyhow::Result<String> {
        let mut out = self.stdout.take().context("stdout already taken")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let r = out.read_line(&mut line);
            let _ = tx.send((r.map(|_| line), out));
        });
        match rx.recv_timeout(timeout) {
            Ok((Ok(line), out)) => {
                self.stdout = Some(out);
                if line.is_empty() {
                    bail!("{} exited: {}", self.name, self.log_tail());
                }
                Ok(line.trim_end().to_string())
            }
            Ok((Err(e), _)) => bail!("{}: reading its output: {e}", self.name),
            Err(_) => bail!(
                "{} did not answer within {timeout:?}: {}",
                self.name,
                self.log_tail()
            ),
        }
    }

    /// Reads all of stdout from now on, on a thread ([`Proc::wait_output`] returns it): a
    /// process that prints more than a pipe holds (64 KiB) before it exits would otherwise
    /// block on its write while the lab waits for it to exit.
    pub fn read_output(&mut self) -> anyhow::Result<()> {
        if self.reader.is_none() {
            let mut out = self.stdout.take().context("stdout already taken")?;
            self.reader = Some(std::thread::spawn(move || {
                let mut s = String::new();
                let _ = out.read_to_string(&mut s);
                s
            }));
        }
        Ok(())
    }

    /// Waits for the process to exit by itself (at most `timeout`) and returns all of its stdout.
    pub fn wait_output(
        &mut self,
        timeout: Duration,
        stop: &dyn Fn() -> bool,
    ) -> anyhow::Result<String> {
        self.read_output()?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.try_wait() {
                let text = self
                    .reader
                    .take()
                    .and_then(|r| r.join().ok())
                    .unwrap_or_default();
                if !st.success() {
                    bail!("{} failed ({st}): {}", self.name, self.log_tail());
                }
                return Ok(text);
            }
            if stop() {
                bail!("interrupted");
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not finish within {timeout:?}: {}",
                    self.name,
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the process: SIGTERM, up to 3 s to exit, then SIGKILL.
    pub fn stop(&mut self) {
        if self.try_wait().is_some() {
            return;
        }
        // Our own child, not reaped yet: the PID is still its.
        let _ = braid_linux::process::terminate(self.child.id());
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if self.try_wait().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        drop(self.stdin.take());
        self.stop();
    }
}
