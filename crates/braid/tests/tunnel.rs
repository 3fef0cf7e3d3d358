//! End-to-end tests of `braid up`: two network namespaces joined by veth links (198.18.x.0/24),
//! real `braid up` processes with real TUN devices, kernel ping and TCP (iperf3) through the
//! tunnel, `braid status --json`, `braid link ...` at run time, metrics, and the one-line error
//! of each failure case.
//!
//! Every test builds its own namespaces (names carry the process id and a tag, so tests run in
//! parallel), bounds its time, and a Drop guard kills the braid processes it started (by PID) and
//! deletes its namespaces, also when an assertion fails. Needs root (CI runs as root); without
//! it the tests fail rather than skip, since a skipped end-to-end test cannot fail.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

#[path = "support/keys.rs"]
mod keys;
#[path = "support/metrics_docs.rs"]
mod metrics_docs;
use keys::{keygen, pubkey_of};

const BRAID: &str = env!("CARGO_BIN_EXE_braid");

/// `scheduler = ...` line for both ends: the default (adaptive) unless
/// `BRAID_TEST_SCHEDULER` names another (to tell an I/O problem from a scheduler problem).
fn scheduler_line() -> String {
    match std::env::var("BRAID_TEST_SCHEDULER") {
        Ok(s) if !s.is_empty() => format!("scheduler = \"{s}\"\n"),
        _ => String::new(),
    }
}

fn run(cmd: &str, args: &[&str]) -> Output {
    Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd}: {e}"))
}

fn ip(args: &[&str]) {
    let o = run("ip", args);
    assert!(
        o.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Waits until `f` returns `Some`, at most `limit`.
fn wait_for<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A client namespace and a server namespace joined by `n` veth pairs: client `c<i>`
/// 198.18.<i>.1/24 <-> server `s<i>` 198.18.<i>.2/24.
struct Net {
    client: String,
    server: String,
    dir: tempfile::TempDir,
    procs: Vec<(String, Child)>,
    key: String,
    /// More namespaces a test made (deleted with the others).
    extra_ns: Vec<String>,
}

impl Net {
    fn new(tag: &str, n: usize) -> Net {
        let id = std::process::id();
        let client = format!("brt{id}{tag}c");
        let server = format!("brt{id}{tag}s");
        let net = Net {
            client,
            server,
            dir: tempfile::tempdir().unwrap(),
            procs: Vec::new(),
            key: keygen(),
            extra_ns: Vec::new(),
        };
        ip(&["netns", "add", &net.client]);
        ip(&["netns", "add", &net.server]);
        for ns in [&net.client, &net.server] {
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        for i in 1..=n {
            let (c, s) = (format!("c{i}"), format!("s{i}"));
            ip(&[
                "link",
                "add",
                &c,
                "netns",
                &net.client,
                "type",
                "veth",
                "peer",
                "name",
                &s,
                "netns",
                &net.server,
            ]);
            ip(&[
                "-n",
                &net.client,
                "addr",
                "add",
                &format!("198.18.{i}.1/24"),
                "dev",
                &c,
            ]);
            ip(&[
                "-n",
                &net.server,
                "addr",
                "add",
                &format!("198.18.{i}.2/24"),
                "dev",
                &s,
            ]);
            ip(&["-n", &net.client, "link", "set", &c, "up"]);
            ip(&["-n", &net.server, "link", "set", &s, "up"]);
        }
        net
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    fn server_config(&self, extra: &str) -> PathBuf {
        let t = format!(
            "[bundle]\nname = \"braid0\"\nrole = \"server\"\nkey = \"{}\"\naddress = \"198.19.0.1/30\"\nmtu = 1400\nlisten = \"0.0.0.0:5050\"\ncontrol = \"{}\"\n{}{extra}\n",
            self.key,
            self.path("s.sock").display(),
            scheduler_line()
        );
        self.write("s.toml", &t)
    }

    /// A client with links 1..=n (link 1 bound by `dev`, the others by `bind`).
    fn client_config(&self, n: usize, key: &str, extra: &str) -> PathBuf {
        let mut t = format!(
            "[bundle]\nname = \"braid0\"\nrole = \"client\"\nkey = \"{key}\"\naddress = \"198.19.0.2/30\"\nmtu = 1400\ncontrol = \"{}\"\n{}{extra}\n",
            self.path("c.sock").display(),
            scheduler_line()
        );
        for i in 1..=n {
            let how = if i == 1 {
                format!("dev = \"c{i}\"")
            } else {
                format!("bind = \"198.18.{i}.1\"")
            };
            t.push_str(&format!(
                "\n[[link]]\nname = \"isp{i}\"\n{how}\nremote = \"198.18.{i}.2:5050\"\n"
            ));
        }
        self.write("c.toml", &t)
    }

    /// Starts `braid up CONFIG` in namespace `ns`; its stderr goes to `<label>.log`.
    fn up(&mut self, label: &str, ns: &str, config: &Path) {
        self.up_with_env(label, ns, config, &[]);
    }

    fn up_with_env(&mut self, label: &str, ns: &str, config: &Path, env: &[(&str, &Path)]) {
        let log = std::fs::File::create(self.path(&format!("{label}.log"))).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", ns, BRAID, "--log-level", "info", "up"])
            .arg(config)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.procs.push((label.to_string(), child));
    }

    /// Starts `python3 support/udp_attack.py ARGS` in namespace `ns` (stdout to `<label>.out`,
    /// stderr to `<label>.log`); stopped by PID like the braid processes.
    fn attack_tool(&mut self, label: &str, ns: &str, args: &[&str]) {
        let out = std::fs::File::create(self.path(&format!("{label}.out"))).unwrap();
        let log = std::fs::File::create(self.path(&format!("{label}.log"))).unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/udp_attack.py");
        let child = Command::new("ip")
            .args(["netns", "exec", ns, "python3"])
            .arg(script)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(log)
            .spawn()
            .unwrap();
        self.procs.push((label.to_string(), child));
    }

    /// Waits (at most `limit`) for the process `label` to exit by itself.
    fn wait_exit(&mut self, label: &str, limit: Duration) -> Option<ExitStatus> {
        let i = self.procs.iter().position(|(l, _)| l == label)?;
        let st = wait_for(limit, || self.procs[i].1.try_wait().ok().flatten());
        if st.is_some() {
            self.procs.remove(i);
        }
        st
    }

    fn log(&self, label: &str) -> String {
        std::fs::read_to_string(self.path(&format!("{label}.log"))).unwrap_or_default()
    }

    fn status(&self, sock: &str) -> Option<Value> {
        let o = Command::new(BRAID)
            .arg("--control")
            .arg(self.path(sock))
            .args(["status", "--json"])
            .output()
            .ok()?;
        if !o.status.success() {
            return None;
        }
        serde_json::from_slice(&o.stdout).ok()
    }

    fn braid(&self, sock: &str, args: &[&str]) -> Output {
        Command::new(BRAID)
            .arg("--control")
            .arg(self.path(sock))
            .args(args)
            .output()
            .unwrap()
    }

    /// Starts a server and an `n`-link client and waits until every link is UP on both sides.
    fn start_pair(&mut self, n: usize) {
        let s = self.server_config("metrics = \"127.0.0.1:9150\"");
        let c = self.client_config(n, &self.key.clone(), "");
        self.start_pair_with(n, &s, &c);
    }

    /// As [`Net::start_pair`], with the given configuration files.
    fn start_pair_with(&mut self, n: usize, s: &Path, c: &Path) {
        let server = self.server.clone();
        self.up("server", &server, s);
        wait_for(Duration::from_secs(5), || self.status("s.sock"))
            .expect("server control socket never answered");
        let client = self.client.clone();
        self.up("client", &client, c);
        let ok = wait_for(Duration::from_secs(8), || {
            let c = self.status("c.sock")?;
            let s = self.status("s.sock")?;
            (links_up(&c) == n && links_up(&s) == n).then_some(())
        });
        assert!(
            ok.is_some(),
            "links did not all come up.\nclient: {}\nserver: {}",
            self.log("client"),
            self.log("server")
        );
    }

    /// What the client's status says about drops and links, for failure messages.
    fn why(&self) -> String {
        match self.status("c.sock") {
            Some(st) => {
                let ls: Vec<String> = links(&st)
                    .iter()
                    .map(|l| {
                        format!(
                            "{} {} srtt {}us rate {:.0}",
                            l["name"],
                            l["state"],
                            l["srtt_us"],
                            l["delivery_rate_bps"].as_f64().unwrap_or(0.0)
                        )
                    })
                    .collect();
                format!("client drops {} links [{}]", st["drops"], ls.join(", "))
            }
            None => "client status unavailable".into(),
        }
    }

    fn ping(&self, count: u32) -> bool {
        ping_from(&self.client, "198.19.0.1", count)
    }

    /// Stops the process `label` with SIGTERM and returns its exit status.
    fn stop(&mut self, label: &str) -> Option<ExitStatus> {
        let i = self.procs.iter().position(|(l, _)| l == label)?;
        let (_, mut child) = self.procs.remove(i);
        let _ = run("kill", &["-TERM", &child.id().to_string()]);
        let st = wait_for(Duration::from_secs(5), || child.try_wait().ok().flatten());
        if st.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        st
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for (_, c) in &mut self.procs {
            let _ = run("kill", &["-TERM", &c.id().to_string()]);
        }
        for (_, c) in &mut self.procs {
            if wait_for(Duration::from_secs(2), || c.try_wait().ok().flatten()).is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        let _ = run("ip", &["netns", "del", &self.client]);
        let _ = run("ip", &["netns", "del", &self.server]);
        for ns in &self.extra_ns {
            let _ = run("ip", &["netns", "del", ns]);
        }
    }
}

/// `count` pings from namespace `ns` to `addr` (IPv4 or IPv6: `ping -4` or `-6` by its form),
/// 100 ms apart, at most 2 s for the last answer; whether any was answered.
fn ping_from(ns: &str, addr: &str, count: u32) -> bool {
    let family = if addr.contains(':') { "-6" } else { "-4" };
    let o = run(
        "ip",
        &[
            "netns",
            "exec",
            ns,
            "ping",
            family,
            "-c",
            &count.to_string(),
            "-i",
            "0.1",
            "-W",
            "2",
            "-q",
            addr,
        ],
    );
    o.status.success()
}

fn links(status: &Value) -> Vec<Value> {
    status["links"].as_array().cloned().unwrap_or_default()
}

fn links_up(status: &Value) -> usize {
    links(status).iter().filter(|l| l["state"] == "up").count()
}

fn link_state(status: &Value, name: &str) -> Option<String> {
    links(status)
        .iter()
        .find(|l| l["name"] == name)
        .and_then(|l| l["state"].as_str().map(str::to_string))
}

/// A TCP transfer through the tunnel with iperf3 (client namespace -> server namespace), with
/// per-interval byte counts.
struct Transfer {
    server: Child,
    client: Child,
    out: PathBuf,
}

impl Transfer {
    fn start(net: &Net, port: u16, secs: u32, interval: f64) -> Transfer {
        let p = port.to_string();
        let server = Command::new("ip")
            .args([
                "netns",
                "exec",
                &net.server,
                "iperf3",
                "-s",
                "-1",
                "-p",
                &p,
                "-B",
                "198.19.0.1",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let out = net.path(&format!("iperf-{port}.json"));
        let client = Command::new("ip")
            .args([
                "netns",
                "exec",
                &net.client,
                "iperf3",
                "-c",
                "198.19.0.1",
                "-p",
                &p,
                "-J",
                "-t",
                &secs.to_string(),
            ])
            .args([
                "-i",
                &interval.to_string(),
                "--connect-timeout",
                "3000",
                "--snd-timeout",
                "8000",
            ])
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Transfer {
            server,
            client,
            out,
        }
    }

    /// Waits for the client (bounded) and returns (exit ok, interval byte counts, total bytes).
    fn finish(mut self, limit: Duration) -> (bool, Vec<f64>, f64) {
        let st = wait_for(limit, || self.client.try_wait().ok().flatten());
        let ok = st.is_some_and(|s| s.success());
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let intervals: Vec<f64> = v["intervals"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|i| i["sum"]["bytes"].as_f64().unwrap_or(0.0))
                    .collect()
            })
            .unwrap_or_default();
        let total = v["end"]["sum_received"]["bytes"].as_f64().unwrap_or(0.0);
        (ok, intervals, total)
    }
}

impl Drop for Transfer {
    fn drop(&mut self) {
        for c in [&mut self.client, &mut self.server] {
            if c.try_wait().ok().flatten().is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// Ping and a TCP transfer through a 3-link bundle; `status --json` on both sides lists every
/// link UP with a sane RTT; the metrics endpoint serves per-link and bundle series; SIGTERM
/// removes the TUN device and the control socket and exits 0.
#[test]
fn ping_tcp_status_metrics_and_clean_shutdown() {
    let mut net = Net::new("a", 3);
    net.start_pair(3);
    assert!(net.ping(5), "ping through the tunnel failed");

    let t = Transfer::start(&net, 5201, 3, 1.0);
    let (ok, _, total) = t.finish(Duration::from_secs(15));
    assert!(ok, "iperf3 through the tunnel failed; {}", net.why());
    assert!(
        total > 1e6,
        "only {total} bytes through the tunnel in 3 s; {}",
        net.why()
    );

    for (sock, role) in [("c.sock", "client"), ("s.sock", "server")] {
        let st = net.status(sock).unwrap();
        assert_eq!(st["kind"], "tunnel");
        assert_eq!(st["role"], role);
        assert!(!st["session"].is_null(), "{role}: no session: {st}");
        let ls = links(&st);
        assert_eq!(ls.len(), 3, "{role}: {st}");
        for l in &ls {
            assert_eq!(l["state"], "up", "{role}: {l}");
            let rtt = l["srtt_us"].as_u64().expect("RTT measured");
            assert!(
                rtt > 0 && rtt < 50_000,
                "{role}: RTT {rtt} us is not sane over veth"
            );
            assert!(
                l["tx_bytes"].as_u64().unwrap() > 0 && l["rx_bytes"].as_u64().unwrap() > 0,
                "{role}: {l}"
            );
        }
        assert!(st["tun_rx_packets"].as_u64().unwrap() > 100, "{role}: {st}");
    }
    // The human table: a bundle line and one aligned row per link.
    let o = net.braid("c.sock", &["status"]);
    let text = String::from_utf8_lossy(&o.stdout);
    let sched = std::env::var("BRAID_TEST_SCHEDULER")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or("adaptive".into());
    // The cipher is `auto`: AES-256-GCM where this CPU has AES instructions (both ends run here).
    let cipher = if braid_core::crypto::aes_is_fast() {
        "aes-256-gcm"
    } else {
        "chacha20-poly1305"
    };
    let want = format!(
        "Bundle braid0 (client, {sched}, {cipher}, 198.19.0.2/30): up 3 of 3 links, total bandwidth "
    );
    assert!(text.starts_with(&want), "{text}");
    assert_eq!(
        text.lines().filter(|l| l.starts_with("isp")).count(),
        3,
        "{text}"
    );

    // Metrics, scraped from inside the server's namespace.
    let o = run(
        "ip",
        &[
            "netns",
            "exec",
            &net.server,
            "curl",
            "-sf",
            "--max-time",
            "5",
            "http://127.0.0.1:9150/metrics",
        ],
    );
    assert!(o.status.success(), "metrics endpoint did not answer");
    let m = String::from_utf8_lossy(&o.stdout);
    for want in [
        "braid_link_tx_bytes_total{bundle=\"braid0\",link=\"link1\"}",
        "braid_link_rx_packets_total{",
        "braid_link_rtt_seconds{",
        "braid_link_loss_ratio{",
        "braid_link_state{bundle=\"braid0\",link=\"link2\",state=\"up\"} 1",
        "braid_link_delivery_rate_bytes_per_second{",
        "braid_build_info{version=",
        "braid_reorder_depth{",
        "braid_drops_total{bundle=\"braid0\",reason=\"auth\"} 0",
        "braid_tun_rx_packets_total{",
        "braid_session_up{bundle=\"braid0\"} 1",
        "# EOF",
    ] {
        assert!(m.contains(want), "metrics lack {want:?}:\n{m}");
    }
    // Every name exported is in the guide's list, and every listed name is exported.
    metrics_docs::assert_documented(&m, "guide.md", "Metrics", |_| true);
    // UDP GRO on the link sockets: the client sends runs of equal datagrams with GSO, and veth
    // keeps such a run whole up to the server's GRO socket, which braid cuts back into datagrams.
    let counter = |name: &str| -> u64 {
        let key = format!("{name}{{bundle=\"braid0\"}} ");
        m.lines()
            .find_map(|l| l.strip_prefix(&key))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {key} in the metrics:\n{m}"))
    };
    let (gro_msgs, gro_dgrams) = (
        counter("braid_udp_gro_messages_total"),
        counter("braid_udp_gro_datagrams_total"),
    );
    // A kernel without UDP_GRO (before 5.0) refuses it and braid falls back to one datagram
    // per message: then there is nothing to see.
    let kernel_has_gro = braid_linux::udp::UdpSocket::bind(&braid_linux::udp::BindOptions {
        addr: Some("127.0.0.1:0".parse().unwrap()),
        gro: true,
        ..Default::default()
    })
    .is_ok_and(|s| s.gro());
    if kernel_has_gro {
        assert!(
            gro_msgs > 0 && gro_dgrams >= 2 * gro_msgs,
            "no GRO-coalesced datagrams at the server ({gro_msgs} messages, {gro_dgrams} datagrams)"
        );
    } else {
        assert_eq!((gro_msgs, gro_dgrams), (0, 0), "GRO counted without GRO");
    }

    // Clean shutdown: exit 0, TUN gone, control socket gone.
    let st = net.stop("client").expect("client did not exit on SIGTERM");
    assert!(st.success(), "client exit status {st:?}");
    assert!(!net.path("c.sock").exists(), "control socket left behind");
    let o = run("ip", &["-n", &net.client, "link", "show", "braid0"]);
    assert!(!o.status.success(), "TUN device braid0 left behind");
    assert!(!net.log("client").contains("panicked"));
}

/// Dual stack: both ends get an IPv4 and an IPv6 tunnel address (the server as a TOML array, the
/// client as a wg-quick style comma list), in namespaces where new devices start with IPv6 off
/// (as the lab's do). braid turns IPv6 on for its own TUN only, and ping -4 and ping -6 cross
/// the tunnel both ways; `braid status` shows both addresses.
#[test]
fn dual_stack_pings_ipv4_and_ipv6() {
    let mut net = Net::new("d", 2);
    for ns in [&net.client, &net.server] {
        for kv in [
            "net.ipv6.conf.all.disable_ipv6=1",
            "net.ipv6.conf.default.disable_ipv6=1",
        ] {
            ip(&["netns", "exec", ns, "sysctl", "-qw", kv]);
        }
    }
    let s = std::fs::read_to_string(net.server_config(""))
        .unwrap()
        .replace(
            "address = \"198.19.0.1/30\"",
            "address = [\"198.19.0.1/30\", \"2001:2:0:1::1/64\"]",
        );
    let s = net.write("s.toml", &s);
    let c = std::fs::read_to_string(net.client_config(2, &net.key, ""))
        .unwrap()
        .replace(
            "address = \"198.19.0.2/30\"",
            "address = \"198.19.0.2/30, 2001:2:0:1::2/64\"",
        );
    let c = net.write("c.toml", &c);
    net.start_pair_with(2, &s, &c);

    let (client, server) = (net.client.clone(), net.server.clone());
    for (from, to) in [
        (&client, "198.19.0.1"),
        (&client, "2001:2:0:1::1"),
        (&server, "198.19.0.2"),
        (&server, "2001:2:0:1::2"),
    ] {
        assert!(
            ping_from(from, to, 3),
            "ping {from} -> {to} through the tunnel failed; {}\nclient: {}\nserver: {}",
            net.why(),
            net.log("client"),
            net.log("server")
        );
    }

    // IPv6 was turned on for braid0 alone.
    for (ns, veth) in [(&client, "c1"), (&server, "s1")] {
        let disabled = |dev: &str| {
            let o = run(
                "ip",
                &[
                    "netns",
                    "exec",
                    ns,
                    "cat",
                    &format!("/proc/sys/net/ipv6/conf/{dev}/disable_ipv6"),
                ],
            );
            String::from_utf8_lossy(&o.stdout).trim().to_string()
        };
        assert_eq!(disabled("braid0"), "0", "{ns}: IPv6 is off on braid0");
        for other in ["default", "all", veth] {
            assert_eq!(disabled(other), "1", "{ns}: braid changed {other}");
        }
    }

    let st = net.status("c.sock").unwrap();
    assert_eq!(
        st["addresses"],
        serde_json::json!(["198.19.0.2/30", "2001:2:0:1::2/64"]),
        "{st}"
    );
    assert!(
        st["tun_rx_packets"].as_u64().unwrap() >= 6,
        "pings did not go through braid: {st}"
    );
    let o = net.braid("s.sock", &["status"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.lines()
            .next()
            .is_some_and(|l| l.contains("198.19.0.1/30, 2001:2:0:1::1/64")),
        "{text}"
    );
}

/// One veth goes down in the middle of a TCP transfer: the connection survives, the link shows
/// DOWN within about a second, and comes back UP by itself once the veth is up again.
#[test]
fn link_down_mid_transfer_keeps_tcp_and_recovers() {
    let mut net = Net::new("b", 2);
    // Both ends seal, send and open on two threads (`workers = 2`; the other tests run the
    // default, one on a 2-core machine): the client's two link sockets each on its own, the
    // server's one socket sealed in parts; a link's send errors are read back on the data-plane
    // thread; the server's receive batches of the upload are opened in parts.
    let s = net.server_config("workers = 2");
    let c = net.client_config(2, &net.key.clone(), "workers = 2");
    net.start_pair_with(2, &s, &c);
    let t = Transfer::start(&net, 5202, 6, 0.2);
    std::thread::sleep(Duration::from_secs(2));

    let down_at = Instant::now();
    ip(&["-n", &net.client, "link", "set", "c1", "down"]);
    let seen = wait_for(Duration::from_secs(3), || {
        let st = net.status("c.sock")?;
        (link_state(&st, "isp1").as_deref() == Some("down")).then(Instant::now)
    });
    let detect = seen.expect("isp1 never shown DOWN").duration_since(down_at);
    assert!(
        detect < Duration::from_millis(1500),
        "isp1 shown DOWN only after {detect:?}"
    );
    let st = net.status("c.sock").unwrap();
    assert_eq!(link_state(&st, "isp2").as_deref(), Some("up"), "{st}");

    std::thread::sleep(Duration::from_millis(800));
    ip(&["-n", &net.client, "link", "set", "c1", "up"]);
    let back = wait_for(Duration::from_secs(5), || {
        let st = net.status("c.sock")?;
        (link_state(&st, "isp1").as_deref() == Some("up")).then_some(())
    });
    assert!(
        back.is_some(),
        "isp1 did not come back UP by itself: {}",
        net.log("client")
    );

    let (ok, intervals, total) = t.finish(Duration::from_secs(15));
    assert!(
        ok,
        "the TCP transfer broke when a link went down; {}\nclient log:\n{}\nserver log:\n{}",
        net.why(),
        net.log("client"),
        net.log("server")
    );
    assert!(total > 1e6, "{total} bytes; {}", net.why());
    // The longest stretch without progress (0.2 s intervals).
    let mut longest = 0;
    let mut run_len = 0;
    for b in &intervals {
        run_len = if *b < 1.0 { run_len + 1 } else { 0 };
        longest = longest.max(run_len);
    }
    let stall = longest as f64 * 0.2;
    assert!(
        stall <= 1.0,
        "TCP stalled {stall:.1} s: {intervals:?}; {}",
        net.why()
    );
    // The upload reached the server in batches big enough to open on both threads.
    let st = net.status("s.sock").unwrap();
    let opened = st["udp_opened_in_parallel"].as_u64().unwrap_or(0);
    assert!(opened > 0, "no datagram opened in parallel: {st}");
    eprintln!(
        "failover: DOWN shown after {detect:?}, longest stall {stall:.1} s, {total} bytes moved, \
         {opened} datagrams opened in parallel at the server"
    );
}

/// `braid link remove` and `link add` on a running client, with traffic flowing: the tunnel
/// stays up, the removed link disappears, the added one comes UP; `link set` changes the
/// configured bandwidth; bad requests get one-line errors.
#[test]
fn runtime_link_remove_add_set() {
    let mut net = Net::new("c", 2);
    net.start_pair(2);
    let t = Transfer::start(&net, 5203, 5, 0.5);
    std::thread::sleep(Duration::from_secs(1));

    let o = net.braid("c.sock", &["link", "remove", "isp1"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "link isp1 removed"
    );
    let st = net.status("c.sock").unwrap();
    assert_eq!(links(&st).len(), 1, "{st}");
    // The server learns that link1 is gone when its probes go unanswered (DOWN within ~1 s);
    // until then some of its packets still take link1.
    let gone = wait_for(Duration::from_secs(3), || {
        let st = net.status("s.sock")?;
        (link_state(&st, "link1").as_deref() != Some("up")).then_some(())
    });
    assert!(gone.is_some(), "server still uses the removed link");
    assert!(net.ping(3), "tunnel down after link remove; {}", net.why());

    std::thread::sleep(Duration::from_millis(500));
    let o = net.braid(
        "c.sock",
        &[
            "link",
            "add",
            "isp1b",
            "--dev",
            "c1",
            "--remote",
            "198.18.1.2:5050",
            "--bandwidth",
            "5000000",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let up = wait_for(Duration::from_secs(3), || {
        let st = net.status("c.sock")?;
        (link_state(&st, "isp1b").as_deref() == Some("up")).then_some(st)
    });
    let st = up.expect("added link never came UP");
    assert_eq!(links(&st).len(), 2);

    let o = net.braid(
        "c.sock",
        &[
            "link",
            "set",
            "isp1b",
            "--bandwidth",
            "7000000",
            "--priority",
            "2",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let st = net.status("c.sock").unwrap();
    let l = links(&st)
        .into_iter()
        .find(|l| l["name"] == "isp1b")
        .unwrap();
    assert_eq!(
        (l["bandwidth_bps"].as_u64(), l["priority"].as_u64()),
        (Some(7_000_000), Some(2))
    );

    // Errors: one line each, non-zero exit.
    for (args, want) in [
        (
            vec!["link", "add", "isp2", "--bind", "198.18.2.1"],
            "link isp2 already exists",
        ),
        (
            vec!["link", "add", "isp9", "--dev", "veth9"],
            "link isp9: interface veth9 does not exist",
        ),
        (vec!["link", "remove", "nope"], "no link named nope"),
        (vec!["link", "set", "isp2"], "give --bandwidth"),
    ] {
        let o = net.braid("c.sock", &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(want), "{args:?}: want {want:?}, got {err}");
    }

    let (ok, _, total) = t.finish(Duration::from_secs(15));
    assert!(
        ok && total > 1e6,
        "TCP transfer did not survive link changes ({total} bytes)"
    );
    assert!(net.ping(3));
}

/// Runs `braid up CONFIG` (in `ns`, optionally as an unprivileged user) to its exit, bounded.
fn up_to_exit(
    ns: &str,
    config: &Path,
    unprivileged: bool,
    limit: Duration,
) -> (ExitStatus, String) {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns]);
    if unprivileged {
        cmd.args([
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
        ]);
    }
    let mut child = cmd
        .arg(BRAID)
        .arg("up")
        .arg(config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let st = wait_for(limit, || child.try_wait().ok().flatten());
    if st.is_none() {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "braid up {} did not exit within {limit:?}",
            config.display()
        );
    }
    let mut err = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (st.unwrap(), err)
}

/// The last stderr line is the error: one line, `braid: error: ...`, no panic anywhere.
fn assert_one_line_error(st: ExitStatus, err: &str, want: &[&str]) -> String {
    assert!(!st.success(), "exit status 0; stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    let last = err.lines().last().unwrap_or("").to_string();
    assert!(last.starts_with("braid: error: "), "{err}");
    for w in want {
        assert!(last.contains(w), "want {w:?} in {last:?}");
    }
    last
}

/// A client whose key differs from the server's: no session; the server logs that
/// authentication fails, the client gives up after `connect_timeout` with a one-line error.
#[test]
fn error_wrong_key() {
    let mut net = Net::new("d", 1);
    let s = net.server_config("");
    let server = net.server.clone();
    net.up("server", &server, &s);
    wait_for(Duration::from_secs(5), || net.status("s.sock")).unwrap();
    let c = net.client_config(1, &keygen(), "connect_timeout = 3");
    let (st, err) = up_to_exit(&net.client, &c, false, Duration::from_secs(10));
    assert_one_line_error(
        st,
        &err,
        &["no session with the server after 3s", "same key"],
    );
    let logged = wait_for(Duration::from_secs(3), || {
        net.log("server")
            .contains("authentication fails")
            .then_some(())
    });
    assert!(
        logged.is_some(),
        "server did not log the authentication failure: {}",
        net.log("server")
    );
    let s = net.status("s.sock").unwrap();
    assert!(s["drops"]["auth"].as_u64().unwrap() > 0, "{s}");
    assert!(s["session"].is_null());
}

/// No server: the client says which links got no answer and why, and exits non-zero.
#[test]
fn error_unreachable_server() {
    let net = Net::new("e", 2);
    let c = net.client_config(2, &net.key, "connect_timeout = 2");
    let (st, err) = up_to_exit(&net.client, &c, false, Duration::from_secs(10));
    assert_one_line_error(
        st,
        &err,
        &[
            "no link answers",
            "isp1 -> 198.18.1.2:5050: Connection refused",
            "isp2 -> 198.18.2.2:5050",
        ],
    );
    // And the TUN device is gone.
    assert!(!run("ip", &["-n", &net.client, "link", "show", "braid0"])
        .status
        .success());
}

/// systemd `Type=notify` (see dist/systemd/braid@.service): with `NOTIFY_SOCKET` set, `braid up`
/// sends READY=1 once the TUN device is up and the control socket answers, and STOPPING=1 on
/// SIGTERM, then exits 0.
#[test]
fn up_notifies_ready_and_stopping() {
    use std::os::unix::net::UnixDatagram;
    let mut net = Net::new("n", 1);
    let notify_path = net.path("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let recv = |sock: &UnixDatagram| -> Option<String> {
        let mut buf = [0u8; 4096];
        let n = sock.recv(&mut buf).ok()?;
        Some(String::from_utf8_lossy(&buf[..n]).into_owned())
    };
    let cfg = net.server_config("");
    let ns = net.server.clone();
    net.up_with_env("server", &ns, &cfg, &[("NOTIFY_SOCKET", &notify_path)]);
    let ready =
        recv(&notify).unwrap_or_else(|| panic!("no READY=1 within 10 s:\n{}", net.log("server")));
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    assert!(
        ready.contains("STATUS=braid0 server on 0.0.0.0:5050"),
        "{ready:?}"
    );
    // Ready means: the TUN device is up with its address, and the control socket answers.
    let o = run("ip", &["-n", &ns, "-o", "addr", "show", "dev", "braid0"]);
    let addr = String::from_utf8_lossy(&o.stdout);
    assert!(
        addr.contains("198.19.0.1/30"),
        "TUN not ready at READY=1: {addr}"
    );
    assert!(
        net.status("s.sock").is_some(),
        "control socket not answering at READY=1"
    );

    let st = net
        .stop("server")
        .expect("braid up did not exit on SIGTERM");
    assert!(st.success(), "exit {st:?}: {}", net.log("server"));
    notify
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    assert_eq!(recv(&notify).as_deref(), Some("STOPPING=1\n"));
    assert!(
        !net.log("server").contains('\u{1b}'),
        "colour codes in a log that is not a terminal"
    );
}

/// As an unprivileged user: the TUN device cannot be created; one line says so and why.
#[test]
fn error_missing_tun_permission() {
    use std::os::unix::fs::PermissionsExt;
    let net = Net::new("f", 1);
    let s = net.server_config("");
    std::fs::set_permissions(net.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&s, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (st, err) = up_to_exit(&net.server, &s, true, Duration::from_secs(10));
    let last = assert_one_line_error(
        st,
        &err,
        &[
            "cannot create TUN device braid0",
            "(needs root or CAP_NET_ADMIN)",
        ],
    );
    assert_eq!(err.trim_end(), last, "more than one line on stderr");
}

/// A link bound to an interface that does not exist.
#[test]
fn error_nonexistent_interface() {
    let net = Net::new("g", 1);
    let t = format!(
        "[bundle]\nname = \"braid0\"\nrole = \"client\"\nkey = \"{}\"\naddress = \"198.19.0.2/30\"\ncontrol = \"{}\"\n\n[[link]]\nname = \"isp1\"\ndev = \"veth9\"\nremote = \"198.18.1.2:5050\"\n",
        net.key,
        net.path("c.sock").display()
    );
    let c = net.write("c.toml", &t);
    let (st, err) = up_to_exit(&net.client, &c, false, Duration::from_secs(10));
    let last = assert_one_line_error(
        st,
        &err,
        &["c.toml:10:7: link[0].dev: link isp1: interface veth9 does not exist"],
    );
    assert_eq!(err.trim_end(), last);
    assert!(!run("ip", &["-n", &net.client, "link", "show", "braid0"])
        .status
        .success());
}

/// Malformed configurations: the error names the key (or value) and its line.
#[test]
fn error_malformed_config() {
    let net = Net::new("h", 1);
    let good = std::fs::read_to_string(net.client_config(1, &net.key, "")).unwrap();
    let cases = [
        (
            good.replace("mtu = 1400\n", "mtu = 1400\ncolour = \"blue\"\n"),
            vec!["c.toml:7:1: bundle.colour: unknown key"],
        ),
        (
            good.replace("remote =", "remot ="),
            vec!["link[0].remot: unknown key, did you mean `remote`?"],
        ),
        (
            good.replace("198.19.0.2/30", "198.19.0.2"),
            vec!["c.toml:5:11: bundle.address: "],
        ),
        (
            good.replace(&net.key, "c2hvcnQ="),
            vec!["c.toml:4:7: bundle.key: key is 5 bytes, expected 32"],
        ),
        (
            good.replace("[bundle]\n", "[bundle]\ncipher = \"rot13\"\n"),
            vec!["c.toml:2:10: bundle.cipher: unknown cipher \"rot13\""],
        ),
        (
            good.replace("mtu = 1400", "mtu = 1400 1400"),
            vec!["c.toml:6:"],
        ),
        (
            good.replace("198.19.0.2/30", "198.19.0.2/30, 2001:2:0:1::2/64")
                .replace("mtu = 1400", "mtu = 1200"),
            vec![
                "c.toml:6:7: bundle.mtu: 1200 is below 1280",
                "2001:2:0:1::2/64",
            ],
        ),
        (
            good.replace("\"198.19.0.2/30\"", "[\"198.19.0.2/30\", 5]"),
            vec!["c.toml:5:11: bundle.address: 5 is not a string"],
        ),
        (
            good.replace("mtu = 1400", "mtu = \"big\""),
            vec!["c.toml:6:7: bundle.mtu: invalid type: string \"big\", expected u32"],
        ),
    ];
    for (text, want) in cases {
        let c = net.write("c.toml", &text);
        let (st, err) = up_to_exit(&net.client, &c, false, Duration::from_secs(10));
        let last = assert_one_line_error(st, &err, &want);
        assert_eq!(err.trim_end(), last, "more than one line on stderr");
    }
}

/// The server dies (SIGKILL: its control socket is left behind) and is started again: the new
/// server replaces the stale socket, and the client, never restarted, gets a new session.
#[test]
fn server_restart_replaces_stale_socket_and_client_reconnects() {
    let mut net = Net::new("i", 2);
    net.start_pair(2);
    let old = net.status("c.sock").unwrap()["session"].clone();
    let i = net.procs.iter().position(|(l, _)| l == "server").unwrap();
    let (_, mut server) = net.procs.remove(i);
    server.kill().unwrap();
    server.wait().unwrap();
    assert!(
        net.path("s.sock").exists(),
        "a killed server cannot remove its socket"
    );
    let s = net.path("s.toml");
    let ns = net.server.clone();
    net.up("server2", &ns, &s);
    let back = wait_for(Duration::from_secs(10), || {
        let c = net.status("c.sock")?;
        (links_up(&c) == 2 && c["session"] != old && !c["session"].is_null()).then_some(())
    });
    assert!(
        back.is_some(),
        "client did not get a new session: {}\n{}",
        net.log("client"),
        net.log("server2")
    );
    assert!(
        net.ping(3),
        "no ping after the server restart; {}",
        net.why()
    );
}

/// Issue 13, item 1, end to end: a HELLO captured from the client (here: the first one it sends,
/// caught by a plain UDP socket standing in for the server) is replayed from another address
/// every half millisecond while the server is killed and started again. The server-to-client
/// direction is a 1 Mbit/s link (tbf; this kernel has no netem). Before HELLO timestamps each
/// replay replaced the pending session and was answered with a HELLO-ACK of its own size: the
/// answers filled that link, the genuine HELLO-ACK waited behind them, and meanwhile the replays
/// replaced the client's pending session; the tunnel never re-formed. Now the restarted server
/// takes the replay once (its answers to repeats are rate-limited), the client's next HELLO is
/// newer and wins.
#[test]
fn replayed_hello_while_the_server_restarts_does_not_stop_the_tunnel() {
    let started = Instant::now();
    let mut net = Net::new("h", 1);
    let (cns, sns) = (net.client.clone(), net.server.clone());
    let tc = |ns: &str, args: &[&str]| {
        let o = run("ip", &[&["netns", "exec", ns, "tc"], args].concat());
        assert!(o.status.success(), "tc {args:?}: {o:?}");
    };
    tc(
        &sns,
        &[
            "qdisc", "add", "dev", "s1", "root", "tbf", "rate", "1mbit", "burst", "4kb", "latency",
            "50ms",
        ],
    );
    let hello = net.path("hello.bin");
    let hello_s = hello.to_str().unwrap().to_string();
    net.attack_tool(
        "capture",
        &sns,
        &["listen", "198.18.1.2", "5050", &hello_s, "1"],
    );
    std::thread::sleep(Duration::from_millis(300));
    let s = net.server_config("");
    let c = net.client_config(1, &net.key.clone(), "");
    net.up("client0", &cns, &c);
    assert!(
        net.wait_exit("capture", Duration::from_secs(5)).is_some(),
        "no HELLO captured: {}",
        net.log("capture")
    );
    net.stop("client0");
    assert_eq!(
        std::fs::metadata(&hello).unwrap().len(),
        2 + 112,
        "one 112-byte HELLO"
    );

    net.start_pair_with(1, &s, &c);
    let old = net.status("c.sock").unwrap()["session"].clone();
    ip(&["-n", &cns, "addr", "add", "198.18.1.100/24", "dev", "c1"]);
    net.attack_tool(
        "replay",
        &cns,
        &[
            "replay",
            &hello_s,
            "198.18.1.2",
            "5050",
            "198.18.1.100",
            "500",
            "40",
        ],
    );
    std::thread::sleep(Duration::from_secs(1));
    let i = net.procs.iter().position(|(l, _)| l == "server").unwrap();
    let (_, mut server) = net.procs.remove(i);
    server.kill().unwrap();
    server.wait().unwrap();
    let restart = Instant::now();
    net.up("server2", &sns, &s);
    let back = wait_for(Duration::from_secs(10), || {
        let c = net.status("c.sock")?;
        let s = net.status("s.sock")?;
        (links_up(&c) == 1 && links_up(&s) == 1 && c["session"] != old && !c["session"].is_null())
            .then(|| restart.elapsed())
    });
    let Some(took) = back else {
        panic!(
            "no new session in 10 s while the HELLO is replayed; server drops {}\n{}",
            net.status("s.sock")
                .map_or(Value::Null, |s| s["drops"].clone()),
            net.log("server2")
        );
    };
    eprintln!("tunnel re-formed {took:?} after the server restart, under replay");
    // The client notices the restart after `rehandshake_after` (2 s) of silence.
    assert!(
        took < Duration::from_secs(4),
        "re-formed only after {took:?}"
    );
    assert!(net.ping(3), "no ping after the restart; {}", net.why());
    let drops = net.status("s.sock").unwrap()["drops"].clone();
    assert!(
        drops["replay"].as_u64().unwrap_or(0) > 100,
        "replayed HELLOs not counted as replays: {drops}"
    );
    assert!(started.elapsed() < Duration::from_secs(60));
}

/// `VmRSS` and `VmHWM` of process `pid`, KiB.
fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Mean rate of an iperf3 run after its first second (slow start), Mbit/s.
fn steady_mbps(intervals: &[f64], interval_s: f64) -> f64 {
    let skip = (1.0 / interval_s).round() as usize;
    let rest = intervals.get(skip..).unwrap_or(&[]);
    if rest.is_empty() {
        return 0.0;
    }
    rest.iter().sum::<f64>() * 8.0 / (rest.len() as f64 * interval_s) / 1e6
}

/// Issue 13, the hostile peer: while a genuine 3-link client runs one TCP transfer, an attacker
/// with its own link to the server sends garbage (random bytes, some with braid-looking headers),
/// truncated copies, exact replays and shuffled replays of captured genuine datagrams (HELLOs
/// included) from 200 source addresses, at full rate. The machine has 2 cores, so the genuine
/// client's links are shaped (tbf, 8 Mbit/s each: the tunnel is link-bound, not CPU-bound) and
/// "full rate" means the attacker saturates its own link: 20 Mbit/s (tbf), offered above that
/// (12 000 datagrams/s averaging ~250 bytes: ~24 Mbit/s offered). The server's memory must stay bounded and the
/// transfer must lose less than 10 % of its throughput. `scripts/bench-hostile.sh` runs this
/// test and prints the figures (BENCHMARKS.md).
#[test]
fn hostile_peer_flood_leaves_memory_bounded_and_throughput_intact() {
    let started = Instant::now();
    let mut net = Net::new("x", 3);
    let (cns, sns) = (net.client.clone(), net.server.clone());
    let tc = |ns: &str, dev: &str, rate: &str| {
        let o = run(
            "ip",
            &[
                "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
                "burst", "16kb", "latency", "50ms",
            ],
        );
        assert!(o.status.success(), "tc on {dev}: {o:?}");
    };
    for i in 1..=3 {
        tc(&cns, &format!("c{i}"), "8mbit");
    }
    // The attacker: its own namespace and link to the server, 200 addresses.
    let ans = format!("brt{}xa", std::process::id());
    ip(&["netns", "add", &ans]);
    net.extra_ns.push(ans.clone());
    ip(&[
        "link", "add", "a1", "netns", &ans, "type", "veth", "peer", "name", "sa1", "netns", &sns,
    ]);
    let batch: String = (1..=200)
        .map(|i| format!("addr add 198.18.100.{i}/24 dev a1\n"))
        .collect();
    let batch_file = net.write("attacker-addrs", &batch);
    ip(&["-n", &ans, "-batch", batch_file.to_str().unwrap()]);
    ip(&["-n", &sns, "addr", "add", "198.18.100.254/24", "dev", "sa1"]);
    ip(&["-n", &ans, "link", "set", "a1", "up"]);
    ip(&["-n", &ans, "link", "set", "lo", "up"]);
    ip(&["-n", &sns, "link", "set", "sa1", "up"]);
    tc(&ans, "a1", "20mbit");

    // Capture genuine traffic (HELLOs, then session packets) on one of the server's links.
    let cap = net.path("captured.bin");
    let cap_s = cap.to_str().unwrap().to_string();
    net.attack_tool("sniff", &sns, &["sniff", "s1", "5050", &cap_s, "4"]);
    std::thread::sleep(Duration::from_millis(300));
    // Round-robin over the three equal links unless the suite is told otherwise: the subject here
    // is the flood, and a scheduler that learns link rates makes the two transfers differ by
    // more than the 10 % to judge when other tests share the CPU.
    let sched = if scheduler_line().is_empty() {
        "scheduler = \"round-robin\""
    } else {
        ""
    };
    let s = net.server_config(sched);
    let c = net.client_config(3, &net.key.clone(), sched);
    net.start_pair_with(3, &s, &c);
    assert!(net.ping(3), "no ping; {}", net.why());
    assert!(
        net.wait_exit("sniff", Duration::from_secs(8)).is_some(),
        "sniffer did not finish: {}",
        net.log("sniff")
    );
    assert!(
        std::fs::metadata(&cap).map_or(0, |m| m.len()) > 500,
        "too little captured"
    );
    let server_pid = net
        .procs
        .iter()
        .find(|(l, _)| l == "server")
        .unwrap()
        .1
        .id();
    let session = net.status("c.sock").unwrap()["session"].clone();

    const SECS: u32 = 8;
    const IV: f64 = 0.5;
    let t = Transfer::start(&net, 5301, SECS, IV);
    let (ok, iv, _) = t.finish(Duration::from_secs(SECS as u64 + 10));
    assert!(ok, "baseline transfer failed; {}", net.why());
    let base = steady_mbps(&iv, IV);
    let (rss_before, hwm_before) = memory_kib(server_pid);

    net.attack_tool(
        "flood",
        &ans,
        &[
            "flood",
            &cap_s,
            "198.18.100.254",
            "5050",
            "198.18.100",
            "200",
            "12000",
            &(SECS + 2).to_string(),
        ],
    );
    std::thread::sleep(Duration::from_secs(1));
    let t = Transfer::start(&net, 5302, SECS, IV);
    let (ok, iv, _) = t.finish(Duration::from_secs(SECS as u64 + 10));
    let attacked = steady_mbps(&iv, IV);
    let (rss_after, hwm_after) = memory_kib(server_pid);
    assert!(
        net.wait_exit("flood", Duration::from_secs(5)).is_some(),
        "flood did not end: {}",
        net.log("flood")
    );
    let flood = std::fs::read_to_string(net.path("flood.out")).unwrap_or_default();
    let st = net.status("s.sock").unwrap();
    let drop_pct = (1.0 - attacked / base) * 100.0;
    eprintln!(
        "hostile: baseline {base:.1} Mbit/s, under attack {attacked:.1} Mbit/s ({drop_pct:+.1} % lost); \
         server VmRSS {rss_before} -> {rss_after} KiB, VmHWM {hwm_before} -> {hwm_after} KiB; \
         attacker {}; server drops {}",
        flood.trim(),
        st["drops"]
    );
    assert!(ok, "transfer under attack failed; {}", net.why());
    assert!(base > 10.0, "baseline too low to judge: {base:.1} Mbit/s");
    assert!(
        attacked > base * 0.9,
        "throughput fell from {base:.1} to {attacked:.1} Mbit/s under attack"
    );
    assert!(
        hwm_after < hwm_before + 16 * 1024,
        "server memory grew under attack: VmHWM {hwm_before} -> {hwm_after} KiB"
    );
    let fl: Value = serde_json::from_str(flood.trim()).unwrap_or(Value::Null);
    assert!(
        fl["mbps"].as_f64().unwrap_or(0.0) > 20.0,
        "the attacker did not offer more than its link: {flood}"
    );
    let c = net.status("c.sock").unwrap();
    assert_eq!(c["session"], session, "the genuine session was replaced");
    assert_eq!(links_up(&c), 3, "{}", net.why());
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
}

/// The MAC address of `dev` in namespace `ns`.
fn mac_of(ns: &str, dev: &str) -> String {
    let o = run("ip", &["-n", ns, "-j", "link", "show", dev]);
    let v: Value = serde_json::from_slice(&o.stdout).expect("ip -j link show");
    v[0]["address"].as_str().expect("a MAC address").to_string()
}

/// Sends forged UDP datagrams (random bytes) as raw Ethernet frames on `dev` in namespace `ns`
/// to the host at `dst_mac`, for `secs` seconds as fast as Python goes: each round, one from
/// every `spoof` source to every `dst`, plus 64 from random 198.18.0.0/15 sources and ports.
/// Frames, not routed packets: forged sources pass no reverse-path check on the way out.
fn spawn_spoofer(
    ns: &str,
    dev: &str,
    dst_mac: &str,
    spoof: &[String],
    dsts: &[String],
    secs: f64,
) -> Child {
    const SCRIPT: &str = r#"
import os, random, socket, struct, sys, time
dev, dst_mac, spoof, dsts, secs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])
def ep(s):
    a, p = s.rsplit(":", 1)
    return socket.inet_aton(a), int(p)
spoof = [ep(x) for x in spoof.split(",") if x]
dsts = [ep(x) for x in dsts.split(",") if x]
mac = bytes.fromhex(dst_mac.replace(":", ""))
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((dev, 0))
src_mac = s.getsockname()[4]
def csum(h):
    t = sum(struct.unpack("!10H", h))
    t = (t >> 16) + (t & 0xffff)
    t += t >> 16
    return (~t) & 0xffff
def frame(src, sport, dst, dport):
    body = os.urandom(random.choice((20, 60, 120, 1000)))
    udp = struct.pack("!HHHH", sport, dport, 8 + len(body), 0) + body
    h = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0, src, dst)
    h = h[:10] + struct.pack("!H", csum(h)) + h[12:]
    return mac + src_mac + b"\x08\x00" + h + udp
end = time.time() + secs
sent = 0
while time.time() < end:
    for d, dp in dsts:
        for a, p in spoof:
            s.send(frame(a, p, d, dp)); sent += 1
        for _ in range(64):
            a = bytes([198, 18 + random.randrange(2), random.randrange(256), random.randrange(1, 255)])
            s.send(frame(a, random.randrange(1024, 65535), d, dp)); sent += 1
print(sent)
"#;
    Command::new("ip")
        .args(["netns", "exec", ns, "python3", "-c", SCRIPT, dev, dst_mac])
        .arg(spoof.join(","))
        .arg(dsts.join(","))
        .arg(secs.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// How many of `count` pings (100 ms apart) from namespace `ns` to `addr` were answered.
fn pings_answered(ns: &str, addr: &str, count: u32) -> u32 {
    let o = run(
        "ip",
        &[
            "netns",
            "exec",
            ns,
            "ping",
            "-c",
            &count.to_string(),
            "-i",
            "0.1",
            "-W",
            "1",
            addr,
        ],
    );
    let text = String::from_utf8_lossy(&o.stdout);
    text.lines()
        .find_map(|l| {
            let (_, rest) = l.split_once(" transmitted, ")?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .unwrap_or(0)
}

/// Issue 13 item 4: a server listening on a wildcard address answers each link from the local
/// address that link's authenticated packets come to. A flood of forged datagrams (garbage from
/// the client's own link addresses and ports to the server's other addresses, and from thousands
/// of random sources) must not move that address: pings through the tunnel go on, every link
/// stays UP.
#[test]
fn spoofed_flood_does_not_move_reply_addresses() {
    let mut net = Net::new("sp", 3);
    net.start_pair(3);
    let st = net.status("s.sock").unwrap();
    let spoof: Vec<String> = links(&st)
        .iter()
        .filter_map(|l| l["addr"].as_str().map(str::to_string))
        .collect();
    assert_eq!(
        spoof.len(),
        3,
        "the server knows every link's address: {st}"
    );
    let dsts: Vec<String> = (1..=3).map(|i| format!("198.18.{i}.2:5050")).collect();
    let mac = mac_of(&net.server, "s1");
    let mut flood = spawn_spoofer(&net.client, "c1", &mac, &spoof, &dsts, 6.0);
    std::thread::sleep(Duration::from_millis(1000));
    let answered = pings_answered(&net.client, "198.19.0.1", 30);
    let c = net.status("c.sock").unwrap();
    let s = net.status("s.sock").unwrap();
    let _ = flood.kill();
    let out = flood.wait_with_output().unwrap();
    let malformed = s["drops"]["malformed"].as_u64().unwrap_or(0)
        + s["drops"]["unknown_session"].as_u64().unwrap_or(0)
        + s["drops"]["auth"].as_u64().unwrap_or(0);
    assert!(
        malformed > 10_000,
        "the flood did not reach the server (drops {}); spoofer: {}",
        s["drops"],
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        answered >= 27,
        "{answered} of 30 pings answered under the flood; {}; server drops {}",
        net.why(),
        s["drops"]
    );
    assert_eq!(links_up(&c), 3, "client links under the flood: {c}");
    assert!(
        !net.log("client").contains(": down"),
        "a link went down under the flood:\n{}",
        net.log("client")
    );
}

/// Where the server sees link `name` (`link1`...) come from.
fn server_link_addr(net: &Net, name: &str) -> Option<String> {
    let st = net.status("s.sock")?;
    links(&st)
        .iter()
        .find(|l| l["name"] == name)
        .and_then(|l| l["addr"].as_str().map(str::to_string))
}

/// Waits (at most `limit`) until the client's link `name` is UP and the server sees it from an
/// address starting with `from`; the time it took.
fn link_back(
    net: &Net,
    name: &str,
    server_name: &str,
    from: &str,
    limit: Duration,
) -> Option<Duration> {
    let t0 = Instant::now();
    wait_for(limit, || {
        let c = net.status("c.sock")?;
        let at = server_link_addr(net, server_name)?;
        (link_state(&c, name).as_deref() == Some("up") && at.starts_with(from)).then_some(())
    })?;
    Some(t0.elapsed())
}

/// Issue 13 item 5: an uplink that changes its address (an LTE modem reconnecting), goes down
/// and up, or is unplugged and plugged back (the device deleted and created again, with a new
/// index) comes back UP within seconds: the client reopens the link's socket on the netlink
/// notice, and the server follows the new source address.
#[test]
fn link_socket_follows_address_change_and_replug() {
    let mut net = Net::new("re", 2);
    net.start_pair(2);
    let c = net.client.clone();
    let s = net.server.clone();
    let limit = Duration::from_secs(5);

    // 1. New address on c1 (link isp1 is bound by device): 198.18.1.1 -> 198.18.1.77.
    ip(&["-n", &c, "addr", "del", "198.18.1.1/24", "dev", "c1"]);
    ip(&["-n", &c, "addr", "add", "198.18.1.77/24", "dev", "c1"]);
    let took = link_back(&net, "isp1", "link1", "198.18.1.77:", limit);
    assert!(
        took.is_some(),
        "isp1 did not come back after an address change (server sees it at {:?}); {}\n{}",
        server_link_addr(&net, "link1"),
        net.why(),
        net.log("client")
    );
    eprintln!("address change: back in {:?}", took.unwrap());

    // 2. Interface down for 1.5 s (the link goes DOWN), then up.
    ip(&["-n", &c, "link", "set", "c1", "down"]);
    let down = wait_for(Duration::from_secs(3), || {
        let st = net.status("c.sock")?;
        (link_state(&st, "isp1").as_deref() == Some("down")).then_some(())
    });
    assert!(down.is_some(), "isp1 not DOWN with its interface down");
    std::thread::sleep(Duration::from_millis(1500));
    ip(&["-n", &c, "link", "set", "c1", "up"]);
    let took = link_back(&net, "isp1", "link1", "198.18.1.77:", limit);
    assert!(
        took.is_some(),
        "isp1 did not come back after down/up; {}\n{}",
        net.why(),
        net.log("client")
    );
    eprintln!("down/up: back in {:?}", took.unwrap());

    // 3. Unplugged and plugged back: the veth pair deleted and created again (same names and
    //    addresses, new interface index), as a USB modem re-enumerates.
    ip(&["-n", &c, "link", "del", "c1"]);
    std::thread::sleep(Duration::from_millis(1000));
    ip(&[
        "link", "add", "c1", "netns", &c, "type", "veth", "peer", "name", "s1", "netns", &s,
    ]);
    ip(&["-n", &c, "addr", "add", "198.18.1.1/24", "dev", "c1"]);
    ip(&["-n", &s, "addr", "add", "198.18.1.2/24", "dev", "s1"]);
    ip(&["-n", &c, "link", "set", "c1", "up"]);
    ip(&["-n", &s, "link", "set", "s1", "up"]);
    let took = link_back(&net, "isp1", "link1", "198.18.1.1:", limit);
    assert!(
        took.is_some(),
        "isp1 did not come back after a re-plug; {}\n{}",
        net.why(),
        net.log("client")
    );
    eprintln!("re-plug: back in {:?}", took.unwrap());
    assert!(net.ping(3), "no ping at the end; {}", net.why());
}

/// Issue 13 item 9: a full TUN queue is a drop reason. With a 2-packet queue on the client's TUN,
/// a UDP blast into the tunnel overflows it; `status --json` and the metrics count the packets
/// the kernel dropped there as `tun_full`.
#[test]
fn full_tun_queue_drops_are_counted() {
    let mut net = Net::new("tq", 1);
    let s = net.server_config("");
    let c = net.client_config(1, &net.key.clone(), "txqueuelen = 2");
    net.start_pair_with(1, &s, &c);
    let srv = Command::new("ip")
        .args([
            "netns",
            "exec",
            &net.server,
            "iperf3",
            "-s",
            "-1",
            "-p",
            "5209",
        ])
        .args(["-B", "198.19.0.1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let srv = ChildGuard(srv);
    std::thread::sleep(Duration::from_millis(300));
    let o = run(
        "ip",
        &[
            "netns",
            "exec",
            &net.client,
            "iperf3",
            "-c",
            "198.19.0.1",
            "-p",
            "5209",
            "-u",
            "-b",
            "5G",
            "-l",
            "1300",
            "-t",
            "2",
            "--connect-timeout",
            "3000",
        ],
    );
    assert!(
        o.status.success(),
        "iperf3 -u: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let st = net.status("c.sock").unwrap();
    let dropped = st["drops"]["tun_full"].as_u64();
    assert!(
        dropped.is_some_and(|d| d > 0),
        "no tun_full drops counted after a UDP blast into a 2-packet TUN queue: {}",
        st["drops"]
    );
    drop(srv);
}

/// Kills the child (by its PID, through `Child`) when dropped.
struct ChildGuard(Child);
impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Removes `/etc/netns/<ns>` (the per-namespace files `ip netns exec` mounts over /etc).
struct NetnsEtc(PathBuf);
impl Drop for NetnsEtc {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Issue 13 item 9: `braid link add --remote HOST:PORT` resolves HOST off the data plane. The
/// client's namespace gets a resolver that never answers (a name server on the link's subnet
/// that does not exist, 3 s timeout): while `link add` waits for it, pings through the tunnel
/// go on.
#[test]
fn link_add_dns_lookup_does_not_block_the_data_plane() {
    let mut net = Net::new("dn", 2);
    let etc = NetnsEtc(PathBuf::from(format!("/etc/netns/{}", net.client)));
    std::fs::create_dir_all(&etc.0).unwrap();
    std::fs::write(
        etc.0.join("resolv.conf"),
        "nameserver 198.18.1.99\noptions timeout:3 attempts:1\n",
    )
    .unwrap();
    std::fs::write(etc.0.join("hosts"), "127.0.0.1 localhost\n").unwrap();
    let s = net.server_config("");
    let c = net.client_config(1, &net.key.clone(), "");
    net.start_pair_with(1, &s, &c);
    let sock = net.path("c.sock");
    let t0 = Instant::now();
    let add = Command::new(BRAID)
        .arg("--control")
        .arg(&sock)
        .args(["link", "add", "isp2", "--bind", "198.18.2.1"])
        .args(["--remote", "braid-test-server.example:5050"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut add = ChildGuard(add);
    std::thread::sleep(Duration::from_millis(300));
    let answered = pings_answered(&net.client, "198.19.0.1", 15);
    let done = wait_for(Duration::from_secs(15), || add.0.try_wait().ok().flatten());
    let took = t0.elapsed();
    assert!(done.is_some(), "link add did not finish");
    assert!(
        took >= Duration::from_millis(2500),
        "the lookup took only {took:?}: the resolver did not stall, the test proves nothing"
    );
    assert!(
        answered >= 14,
        "{answered} of 15 pings answered while link add waited for DNS ({took:?})"
    );
    drop(etc);
}

/// A link's `pmtu` in a status, by name.
fn link_pmtu(status: &Value, name: &str) -> Option<u64> {
    links(status)
        .iter()
        .find(|l| l["name"] == name)
        .and_then(|l| l["pmtu"].as_u64())
}

/// 1500 bytes inside on 1500-byte links (issue 11): two veth links of MTU 1500, tunnel MTU
/// 1500. Each link's path MTU is found (1472-byte datagrams); a 1500-byte ping with DF
/// (`ping -M do -s 1472`) crosses both ways, cut in pieces and rebuilt, and so does a TCP
/// transfer with full-sized segments. Then link 2's MTU drops to 1400 at both ends in the middle
/// of a transfer: the link follows (its path MTU goes down to 1372) and the transfer goes on.
#[test]
fn mtu_1500_inside_on_1500_byte_links() {
    let mut net = Net::new("m", 2);
    let with_mtu = |p: PathBuf| {
        let t = std::fs::read_to_string(&p)
            .unwrap()
            .replace("mtu = 1400", "mtu = 1500");
        std::fs::write(&p, t).unwrap();
        p
    };
    let s = with_mtu(net.server_config(""));
    let c = with_mtu(net.client_config(2, &net.key.clone(), ""));
    net.start_pair_with(2, &s, &c);
    let found = wait_for(Duration::from_secs(5), || {
        let st = net.status("c.sock")?;
        let ss = net.status("s.sock")?;
        let all = ["isp1", "isp2"]
            .iter()
            .all(|n| link_pmtu(&st, n) == Some(1472))
            && links(&ss).iter().all(|l| l["pmtu"].as_u64() == Some(1472));
        all.then_some(())
    });
    assert!(
        found.is_some(),
        "path MTUs not found: client {:?}, server {:?}",
        net.status("c.sock").map(|s| links(&s)
            .iter()
            .map(|l| l["pmtu"].clone())
            .collect::<Vec<_>>()),
        net.status("s.sock").map(|s| links(&s)
            .iter()
            .map(|l| l["pmtu"].clone())
            .collect::<Vec<_>>())
    );

    // A full 1500-byte packet with DF, both ways.
    let o = run(
        "ip",
        &[
            "netns",
            "exec",
            &net.client,
            "ping",
            "-4",
            "-M",
            "do",
            "-s",
            "1472",
            "-c",
            "5",
            "-i",
            "0.2",
            "-W",
            "2",
            "-q",
            "198.19.0.1",
        ],
    );
    assert!(
        o.status.success(),
        "1500-byte ping with DF failed: {}; {}",
        String::from_utf8_lossy(&o.stdout),
        net.why()
    );
    let st = net.status("c.sock").unwrap();
    let ss = net.status("s.sock").unwrap();
    assert!(
        st["frag"]["tx_split"].as_u64().unwrap() >= 5,
        "{}",
        st["frag"]
    );
    assert!(
        ss["frag"]["rx_reassembled"].as_u64().unwrap() >= 5,
        "{}",
        ss["frag"]
    );
    assert!(
        ss["frag"]["tx_split"].as_u64().unwrap() >= 5,
        "replies: {}",
        ss["frag"]
    );

    // TCP with full-sized segments (MSS 1460).
    let t = Transfer::start(&net, 5215, 3, 0.5);
    let (ok, _, total) = t.finish(Duration::from_secs(15));
    assert!(
        ok && total > 1e6,
        "TCP through a 1500 tunnel: {total} bytes; {}",
        net.why()
    );
    let ss = net.status("s.sock").unwrap();
    let rebuilt = ss["frag"]["rx_reassembled"].as_u64().unwrap();
    assert!(rebuilt > 500, "{}", ss["frag"]);

    // Link 2 narrows in the middle of a transfer.
    let t = Transfer::start(&net, 5216, 6, 0.5);
    std::thread::sleep(Duration::from_secs(2));
    ip(&["-n", &net.client, "link", "set", "c2", "mtu", "1400"]);
    ip(&["-n", &net.server, "link", "set", "s2", "mtu", "1400"]);
    let lowered = wait_for(Duration::from_secs(3), || {
        let st = net.status("c.sock")?;
        (link_pmtu(&st, "isp2")? <= 1372 && link_pmtu(&st, "isp1")? == 1472).then_some(())
    });
    assert!(
        lowered.is_some(),
        "isp2's path MTU did not follow: {:?}",
        net.status("c.sock").map(|s| link_pmtu(&s, "isp2"))
    );
    let (ok, intervals, total) = t.finish(Duration::from_secs(20));
    assert!(
        ok && total > 1e6,
        "TCP broke when a link's MTU dropped: {total} bytes, {intervals:?}; {}\nclient log:\n{}",
        net.why(),
        net.log("client")
    );
    // The last second moved data: the tunnel still works with the narrower link.
    let tail: f64 = intervals.iter().rev().take(2).sum();
    assert!(tail > 1e5, "{intervals:?}");
    assert!(ping_from(&net.client, "198.19.0.1", 3));
    let st = net.status("c.sock").unwrap();
    assert_eq!(links_up(&st), 2, "{}", net.why());
}

/// Issue 14 item 1: per-client keys. `braid keygen` / `braid pubkey` make the key pairs; the
/// server lists its client's public key and gives it its tunnel address in the handshake; the
/// client has no `address` of its own and no PSK. The tunnel carries pings; a client with
/// another key pair never gets a session and the server counts it as authentication failures.
#[test]
fn per_client_keys_bring_the_tunnel_up_and_refuse_other_keys() {
    let mut net = Net::new("id", 2);
    let (server_key, client_key) = (keygen(), keygen());
    let (server_pub, client_pub) = (pubkey_of(&server_key), pubkey_of(&client_key));
    assert_ne!(server_pub, client_pub);
    let s = net.write(
        "s.toml",
        &format!(
            "[bundle]\nname = \"braid0\"\nrole = \"server\"\nprivate_key = \"{server_key}\"\naddress = \"198.19.0.1/30\"\nmtu = 1400\nlisten = \"0.0.0.0:5050\"\ncontrol = \"{}\"\n\n[[client]]\nname = \"site-a\"\npublic_key = \"{client_pub}\"\naddress = \"198.19.0.2/30\"\n",
            net.path("s.sock").display()
        ),
    );
    let csock = net.path("c.sock");
    let client_conf = |key: &str| {
        let mut t = format!(
            "[bundle]\nname = \"braid0\"\nrole = \"client\"\nprivate_key = \"{key}\"\nserver_public_key = \"{server_pub}\"\nmtu = 1400\nconnect_timeout = 3\ncontrol = \"{}\"\n",
            csock.display()
        );
        for i in 1..=2 {
            t.push_str(&format!(
                "\n[[link]]\nname = \"isp{i}\"\nbind = \"198.18.{i}.1\"\nremote = \"198.18.{i}.2:5050\"\n"
            ));
        }
        t
    };
    // A stranger first: refused, counted, and the client says why.
    let stranger = net.write("x.toml", &client_conf(&keygen()));
    let server = net.server.clone();
    net.up("server", &server, &s);
    wait_for(Duration::from_secs(5), || net.status("s.sock")).expect("server status");
    let (st, err) = up_to_exit(&net.client, &stranger, false, Duration::from_secs(10));
    assert!(!st.success(), "a stranger got in: {err}");
    // The server is a concentrator of one client: a key it does not list is an unknown client.
    let st = net.status("s.sock").unwrap();
    let unknown = st["drops"]["unknown_client"].as_u64().unwrap();
    assert!(unknown > 0, "the stranger's HELLOs were not counted: {st}");
    // The real client.
    let c = net.write("c.toml", &client_conf(&client_key));
    let client = net.client.clone();
    net.up("client", &client, &c);
    let ok = wait_for(Duration::from_secs(8), || {
        let c = net.status("c.sock")?;
        let s = net.status("s.sock")?;
        (links_up(&c) == 2 && s["clients"][0]["links_up"] == 2).then_some(())
    });
    assert!(
        ok.is_some(),
        "links did not come up.\nclient: {}\nserver: {}",
        net.log("client"),
        net.log("server")
    );
    // The address came from the server.
    let addrs = run("ip", &["-n", &net.client, "-br", "addr", "show", "braid0"]);
    let addrs = String::from_utf8_lossy(&addrs.stdout).to_string();
    assert!(addrs.contains("198.19.0.2/30"), "client TUN: {addrs}");
    assert!(
        net.log("client").contains("from the server"),
        "{}",
        net.log("client")
    );
    assert!(net.ping(3), "no ping through the tunnel: {}", net.why());
    assert!(ping_from(&net.server, "198.19.0.2", 3));
}

/// `ping -c COUNT -I SRC DST` in namespace `ns`: whether any reply came.
fn ping_src(ns: &str, src: &str, dst: &str, count: u32) -> bool {
    let c = count.to_string();
    let o = run(
        "ip",
        &[
            "netns", "exec", ns, "ping", "-n", "-q", "-c", &c, "-i", "0.2", "-W", "2", "-I", src,
            dst,
        ],
    );
    o.status.success()
}

/// Issue 14 items 2-4: one server (a concentrator) for two sites, each with its own key pair,
/// two links and a LAN. Addresses come from the pool, the LANs are routed into the server's
/// TUN device, site-to-site traffic passes where allowed, a spoofed source is dropped and
/// counted, and `braid client remove|add|list` changes one site at run time without touching
/// the other. The concentrator's metrics are the ones the guide lists.
#[test]
fn concentrator_serves_two_sites_routes_their_lans_and_filters_sources() {
    let mut net = Net::new("cc", 2);
    let site2 = format!("brt{}ccx", std::process::id());
    ip(&["netns", "add", &site2]);
    net.extra_ns.push(site2.clone());
    ip(&["-n", &site2, "link", "set", "lo", "up"]);
    for (i, (d, t)) in [(3, ("d3", "t3")), (4, ("d4", "t4"))] {
        ip(&[
            "link",
            "add",
            d,
            "netns",
            &site2,
            "type",
            "veth",
            "peer",
            "name",
            t,
            "netns",
            &net.server,
        ]);
        ip(&[
            "-n",
            &site2,
            "addr",
            "add",
            &format!("198.18.{i}.1/24"),
            "dev",
            d,
        ]);
        ip(&[
            "-n",
            &net.server,
            "addr",
            "add",
            &format!("198.18.{i}.2/24"),
            "dev",
            t,
        ]);
        ip(&["-n", &site2, "link", "set", d, "up"]);
        ip(&["-n", &net.server, "link", "set", t, "up"]);
    }
    // The sites' LANs: one address each, on loopback.
    let site1 = net.client.clone();
    ip(&["-n", &site1, "addr", "add", "198.18.110.1/32", "dev", "lo"]);
    ip(&["-n", &site2, "addr", "add", "198.18.120.1/32", "dev", "lo"]);
    ip(&["-n", &site1, "addr", "add", "198.18.99.1/32", "dev", "lo"]);

    let (server_key, k1, k2) = (keygen(), keygen(), keygen());
    let (server_pub, p1, p2) = (pubkey_of(&server_key), pubkey_of(&k1), pubkey_of(&k2));
    let site_table = |name: &str, key: &str, lan: &str, reach: &str| {
        format!("\n[[client]]\nname = \"{name}\"\npublic_key = \"{key}\"\nlan = [\"{lan}\"]\nreach = [\"{reach}\"]\n")
    };
    let s = net.write(
        "s.toml",
        &format!(
            "[bundle]\nname = \"braid0\"\nrole = \"server\"\nprivate_key = \"{server_key}\"\naddress = \"198.19.0.1/24\"\naddress_pool = \"198.19.0.0/24\"\nmtu = 1400\nlisten = \"0.0.0.0:5050\"\nmetrics = \"127.0.0.1:9151\"\ncontrol = \"{}\"\n{}{}",
            net.path("s.sock").display(),
            site_table("site1", &p1, "198.18.110.0/24", "site2"),
            site_table("site2", &p2, "198.18.120.0/24", "site1"),
        ),
    );
    let client_conf = |key: &str, sock: &str, nets: [u32; 2]| {
        let mut t = format!(
            "[bundle]\nname = \"braid0\"\nrole = \"client\"\nprivate_key = \"{key}\"\nserver_public_key = \"{server_pub}\"\nmtu = 1400\ncontrol = \"{}\"\n",
            net.path(sock).display()
        );
        for (i, n) in nets.iter().enumerate() {
            t.push_str(&format!(
                "\n[[link]]\nname = \"isp{}\"\nbind = \"198.18.{n}.1\"\nremote = \"198.18.{n}.2:5050\"\n",
                i + 1
            ));
        }
        t
    };
    let c1 = net.write("c1.toml", &client_conf(&k1, "c.sock", [1, 2]));
    let c2 = net.write("c2.toml", &client_conf(&k2, "c2.sock", [3, 4]));
    let server = net.server.clone();
    net.up("server", &server, &s);
    wait_for(Duration::from_secs(5), || net.status("s.sock")).expect("server status");
    net.up("site1", &site1, &c1);
    net.up("site2", &site2, &c2);
    let both_up = |net: &Net| {
        let st = net.status("s.sock")?;
        let clients = st["clients"].as_array()?.clone();
        (clients.len() == 2
            && clients
                .iter()
                .all(|c| c["connected"] == true && c["links_up"] == 2))
        .then_some(st)
    };
    let st = wait_for(Duration::from_secs(10), || both_up(&net)).unwrap_or_else(|| {
        panic!(
            "sites did not come up: {:?}\nserver: {}\nsite1: {}\nsite2: {}",
            net.status("s.sock"),
            net.log("server"),
            net.log("site1"),
            net.log("site2")
        )
    });
    // Each site got the next pool address and the server routes its LAN.
    let addr_of = |ns: &str| {
        String::from_utf8_lossy(&run("ip", &["-n", ns, "-br", "addr", "show", "braid0"]).stdout)
            .to_string()
    };
    let (a1, a2) = (addr_of(&site1), addr_of(&site2));
    assert!(
        a1.contains("198.19.0.2/24") && a2.contains("198.19.0.3/24"),
        "{a1} / {a2}"
    );
    let routes = String::from_utf8_lossy(
        &run("ip", &["-n", &server, "route", "show", "dev", "braid0"]).stdout,
    )
    .to_string();
    assert!(
        routes.contains("198.18.110.0/24") && routes.contains("198.18.120.0/24"),
        "{routes}"
    );
    assert_eq!(st["clients"][0]["prefixes"][1], "198.18.110.0/24", "{st}");

    // The sites route each other's LAN through their tunnel (the operator's part).
    ip(&[
        "-n",
        &site1,
        "route",
        "add",
        "198.18.120.0/24",
        "dev",
        "braid0",
    ]);
    ip(&[
        "-n",
        &site2,
        "route",
        "add",
        "198.18.110.0/24",
        "dev",
        "braid0",
    ]);
    ip(&["-n", &site1, "route", "add", "198.18.99.0/24", "dev", "lo"]);
    assert!(
        ping_src(&site1, "198.18.110.1", "198.18.120.1", 3),
        "site to site"
    );
    assert!(
        ping_src(&site1, "198.19.0.2", "198.19.0.1", 2),
        "site1 to the server"
    );
    assert!(
        ping_src(&site2, "198.18.120.1", "198.19.0.1", 2),
        "site2's LAN to the server"
    );
    // A source site1 does not own: dropped at the server, counted.
    assert!(!ping_src(&site1, "198.18.99.1", "198.19.0.1", 2));
    let st = net.status("s.sock").unwrap();
    assert!(
        st["clients"][0]["drops"]["source"].as_u64().unwrap() >= 2,
        "{st}"
    );
    assert!(st["clients"][0]["forwarded"].as_u64().unwrap() >= 3, "{st}");

    // Metrics: a client label, and exactly the names the guide lists.
    let o = run(
        "ip",
        &[
            "netns",
            "exec",
            &server,
            "curl",
            "-sf",
            "--max-time",
            "5",
            "http://127.0.0.1:9151/metrics",
        ],
    );
    assert!(o.status.success(), "no metrics");
    let m = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        m.contains("braid_client_up{bundle=\"braid0\",client=\"site1\"} 1"),
        "{m}"
    );
    assert!(
        m.contains(
            "braid_client_drops_total{bundle=\"braid0\",client=\"site1\",reason=\"source\"}"
        ),
        "{m}"
    );
    metrics_docs::assert_documented(&m, "guide.md", "Concentrator metrics", |_| true);

    // `braid client list`, then remove site2: its LAN is gone, site1 goes on.
    let list = net.braid("s.sock", &["client", "list"]);
    let text = String::from_utf8_lossy(&list.stdout).to_string();
    assert!(
        text.contains("site1\tconnected") && text.contains("site2\tconnected"),
        "{text}"
    );
    let session1 = st["clients"][0]["session"].clone();
    let o = net.braid("s.sock", &["client", "remove", "site2"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let routes = String::from_utf8_lossy(
        &run("ip", &["-n", &server, "route", "show", "dev", "braid0"]).stdout,
    )
    .to_string();
    assert!(!routes.contains("198.18.120.0/24"), "{routes}");
    assert!(!ping_src(&site1, "198.18.110.1", "198.18.120.1", 2));
    assert!(
        ping_src(&site1, "198.19.0.2", "198.19.0.1", 2),
        "site1 disturbed"
    );
    // Back at run time, with its key and LAN; its client re-handshakes on its own.
    let o = net.braid(
        "s.sock",
        &[
            "client",
            "add",
            "site2",
            "--public-key",
            &p2,
            "--lan",
            "198.18.120.0/24",
            "--reach",
            "site1",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let st = wait_for(Duration::from_secs(10), || both_up(&net)).expect("site2 back");
    assert_eq!(
        st["clients"][0]["session"], session1,
        "site1 kept its session"
    );
    assert!(
        ping_src(&site1, "198.18.110.1", "198.18.120.1", 3),
        "site to site again"
    );
    let o = net.braid("s.sock", &["client", "add", "site2", "--public-key", &p2]);
    assert!(!o.status.success(), "a second site2 was accepted");
}
