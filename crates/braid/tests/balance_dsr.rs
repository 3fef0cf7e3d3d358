//! End-to-end tests of `braid balance` in DSR mode, in network namespaces made by each test:
//!
//! ```text
//!   client 198.18.0.1 ─┐
//!   balancer 198.18.0.2 ┼─ bridge (own namespace) ── backends 198.18.0.11-13, VIP 198.18.0.100 on lo
//! ```
//!
//! All hosts share one L2 segment. The client reaches the VIP on-link: it ARPs for it, the
//! balancer answers with its own MAC, forwards every frame to a backend by rewriting the MAC, and
//! the backend (VIP on loopback, `arp_ignore=1`, `arp_announce=2`) replies straight to the client.
//! Backends are small Python HTTP servers answering with their name (`/big/N`: N bytes).
//!
//! Every test bounds its own time; a Drop guard kills the processes it started (by PID) and
//! deletes its namespaces, also when the test fails.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

#[path = "support/metrics_docs.rs"]
mod metrics_docs;

const BRAID: &str = env!("CARGO_BIN_EXE_braid");
const VIP: &str = "198.18.0.100";
const LB_IP: &str = "198.18.0.2";
const CLIENT_IP: &str = "198.18.0.1";
/// IPv6: the benchmarking prefix 2001:2::/48 (RFC 5180), the counterpart of 198.18.0.0/15;
/// host 198.18.0.N is also 2001:2::N.
const VIP6: &str = "2001:2::100";

fn v6_of(v4: &str) -> String {
    format!("2001:2::{}", v4.rsplit('.').next().unwrap())
}

/// The backends' HTTP server: `/` answers the backend's name, `/big/N` N bytes; keep-alive.
const SERVER_PY: &str = r#"
import sys, socket, socketserver, http.server
name, port = sys.argv[1], int(sys.argv[2])
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        if self.path.startswith("/big/"):
            n = int(self.path[5:])
            self.send_response(200)
            self.send_header("Content-Length", str(n))
            self.end_headers()
            chunk = b"x" * 65536
            while n > 0:
                k = min(n, 65536)
                self.wfile.write(chunk[:k])
                n -= k
        else:
            body = (name + "\n").encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    def log_message(self, *a):
        pass
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    address_family = socket.AF_INET6  # dual stack: IPv4 arrives as ::ffff:a.b.c.d
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
S(("::", port), H).serve_forever()
"#;

/// The client: `new N` makes N requests, each on a new connection, printing `ok NAME` or
/// `fail ERR`; `sticky N FLAG` opens N keep-alive connections, asks each for the name (`A i
/// NAME`), waits for the file FLAG, asks again on the same connections (`B i NAME`) and then on N
/// new ones (`C i NAME`); `load SECONDS` makes back-to-back new connections for SECONDS, printing
/// `T ok NAME` / `T fail ERR` with T the time since start; `big N BYTES` downloads BYTES N times
/// on new connections, printing the byte count received.
const CLIENT_PY: &str = r#"
import sys, socket, time, os
VIP = sys.argv[1]
def conn():
    return socket.create_connection((VIP, 80), timeout=2)
def ask(s):
    s.sendall(b"GET / HTTP/1.1\r\nHost: vip\r\n\r\n")
    f = s.makefile("rb")
    line = f.readline()
    if not line.startswith(b"HTTP/1.1 200"):
        raise Exception("bad status %r" % line)
    n = 0
    while True:
        h = f.readline()
        if h in (b"\r\n", b""):
            break
        if h.lower().startswith(b"content-length:"):
            n = int(h.split(b":")[1])
    body = f.read(n)
    if len(body) != n:
        raise Exception("short body")
    return body.decode().strip()
def once():
    s = conn()
    try:
        return ask(s)
    finally:
        s.close()
mode = sys.argv[2]
if mode == "new":
    for i in range(int(sys.argv[3])):
        try:
            print("ok", once(), flush=True)
        except Exception as e:
            print("fail", str(e).replace(" ", "_"), flush=True)
elif mode == "sticky":
    n, flag = int(sys.argv[3]), sys.argv[4]
    socks = [conn() for _ in range(n)]
    for i, s in enumerate(socks):
        print("A", i, ask(s), flush=True)
    deadline = time.time() + 20
    while not os.path.exists(flag) and time.time() < deadline:
        time.sleep(0.02)
    for i, s in enumerate(socks):
        try:
            print("B", i, ask(s), flush=True)
        except Exception as e:
            print("B", i, "fail:" + str(e).replace(" ", "_"), flush=True)
    for i in range(n):
        try:
            print("C", i, once(), flush=True)
        except Exception as e:
            print("C", i, "fail:" + str(e).replace(" ", "_"), flush=True)
elif mode == "load":
    t0 = time.time()
    while time.time() - t0 < float(sys.argv[3]):
        t = time.time() - t0
        try:
            print("%.3f ok %s" % (t, once()), flush=True)
        except Exception as e:
            print("%.3f fail %s" % (t, str(e).replace(" ", "_")), flush=True)
elif mode == "big":
    for i in range(int(sys.argv[3])):
        s = conn()
        s.settimeout(10)
        s.sendall(("GET /big/%s HTTP/1.1\r\nHost: vip\r\nConnection: close\r\n\r\n" % sys.argv[4]).encode())
        got = 0
        while True:
            b = s.recv(1 << 20)
            if not b:
                break
            got += len(b)
        s.close()
        print(got, flush=True)
"#;

/// A UDP backend: answers every datagram with its name. It binds the VIP (a DSR reply must come
/// *from* the VIP) and its real address (health probes).
const UDP_SERVER_PY: &str = r#"
import sys, socket, select
name, vip, real, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
socks = []
for a in (vip, real):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((a, port))
    socks.append(s)
while True:
    r, _, _ = select.select(socks, [], [])
    for s in r:
        data, peer = s.recvfrom(2048)
        s.sendto(name.encode(), peer)
"#;

/// UDP client: N sockets (N source ports), each sends K datagrams and prints `i NAME` per answer.
const UDP_CLIENT_PY: &str = r#"
import sys, socket
vip, port, n, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
socks = []
for i in range(n):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(2)
    s.connect((vip, port))
    socks.append(s)
for round in range(k):
    for i, s in enumerate(socks):
        s.send(b"hello %d %d" % (i, round))
        try:
            print(i, s.recv(2048).decode(), flush=True)
        except Exception as e:
            print(i, "fail:" + str(e).replace(" ", "_"), flush=True)
"#;

fn require_root() {
    let out = Command::new("id").arg("-u").output().expect("id -u");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "0",
        "the DSR tests need root (network namespaces)"
    );
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn ip(args: &[&str]) {
    run(Command::new("ip").args(args));
}

/// The real python3 (not a version-manager shim): faster start, and a PID that is the server's.
fn python() -> String {
    let out = run(Command::new("python3").args(["-c", "import sys; print(sys.executable)"]));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Waits for `child` up to `limit`; kills it (by PID) if it overruns.
fn wait_output(mut child: Child, limit: Duration) -> Output {
    // Drain the pipes while waiting: a chatty child would otherwise block on a full pipe.
    fn drain(r: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    }
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            let stdout = String::from_utf8_lossy(&out.join().unwrap()).to_string();
            let tail: Vec<&str> = stdout.lines().rev().take(10).collect();
            panic!(
                "process ran over {limit:?}; {} lines, last: {tail:?} stderr: {}",
                stdout.lines().count(),
                String::from_utf8_lossy(&err.join().unwrap())
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// The test bed: namespaces, processes, files. Dropping it cleans everything up.
struct Bed {
    prefix: String,
    namespaces: Vec<String>,
    children: Vec<(String, Child)>,
    dir: tempfile::TempDir,
    python: String,
    balancer: Option<Child>,
}

impl Drop for Bed {
    fn drop(&mut self) {
        if let Some(mut b) = self.balancer.take() {
            let _ = b.kill();
            let _ = b.wait();
        }
        for (_, c) in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in self.namespaces.iter().rev() {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

impl Bed {
    /// Builds the segment: client, balancer and three backends (`b1`..`b3`, serving on port 80).
    fn new(tag: &str) -> Bed {
        require_root();
        let prefix = format!("bdsr{}{}", std::process::id(), tag);
        let mut bed = Bed {
            prefix,
            namespaces: Vec::new(),
            children: Vec::new(),
            dir: tempfile::tempdir().expect("tempdir"),
            python: python(),
            balancer: None,
        };
        let sw = bed.add_ns("sw");
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &sw, "link", "set", "br0", "up"]);
        bed.add_host("cl", CLIENT_IP);
        bed.add_host("lb", LB_IP);
        for i in 1..=3 {
            bed.add_backend(i);
        }
        bed.write_scripts();
        bed
    }

    fn ns(&self, role: &str) -> String {
        format!("{}-{role}", self.prefix)
    }

    fn add_ns(&mut self, role: &str) -> String {
        let ns = self.ns(role);
        let _ = Command::new("ip")
            .args(["netns", "del", &ns])
            .stderr(Stdio::null())
            .status();
        ip(&["netns", "add", &ns]);
        self.namespaces.push(ns.clone());
        ip(&["-n", &ns, "link", "set", "lo", "up"]);
        // No duplicate address detection on the fresh links: while a host's link-local address
        // is tentative the kernel sends no Neighbor Solicitation at all, so its first replies
        // would wait a second (real hosts have long finished DAD).
        self.sysctl(&ns, "net.ipv6.conf.default.accept_dad=0");
        ns
    }

    /// A host on the bridge: `eth0` with `addr/24`.
    fn add_host(&mut self, role: &str, addr: &str) -> String {
        let ns = self.add_ns(role);
        let sw = self.ns("sw");
        let port = format!("p-{role}");
        ip(&[
            "-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ]);
        ip(&["-n", &sw, "link", "set", &port, "master", "br0", "up"]);
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{addr}/24"),
            "dev",
            "eth0",
        ]);
        let v6 = format!("{}/64", v6_of(addr));
        ip(&["-n", &ns, "addr", "add", &v6, "dev", "eth0", "nodad"]);
        ip(&["-n", &ns, "link", "set", "eth0", "up"]);
        ns
    }

    fn sysctl(&self, ns: &str, kv: &str) {
        run(Command::new("ip").args(["netns", "exec", ns, "sysctl", "-qw", kv]));
    }

    fn backend_ip(i: u8) -> String {
        format!("198.18.0.{}", 10 + i)
    }

    /// A DSR backend: the VIP on loopback, ARP for it kept quiet, an HTTP server named `b{i}`.
    fn add_backend(&mut self, i: u8) {
        let role = format!("b{i}");
        let ns = self.add_host(&role, &Bed::backend_ip(i));
        ip(&["-n", &ns, "addr", "add", &format!("{VIP}/32"), "dev", "lo"]);
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{VIP6}/128"),
            "dev",
            "lo",
            "nodad",
        ]);
        for kv in [
            "net.ipv4.conf.all.arp_ignore=1",
            "net.ipv4.conf.all.arp_announce=2",
            "net.ipv4.conf.eth0.arp_ignore=1",
            "net.ipv4.conf.eth0.arp_announce=2",
        ] {
            self.sysctl(&ns, kv);
        }
    }

    fn write_scripts(&self) {
        std::fs::write(self.dir.path().join("udp_server.py"), UDP_SERVER_PY).unwrap();
        std::fs::write(self.dir.path().join("udp_client.py"), UDP_CLIENT_PY).unwrap();
        std::fs::write(self.dir.path().join("server.py"), SERVER_PY).unwrap();
        std::fs::write(self.dir.path().join("client.py"), CLIENT_PY).unwrap();
    }

    fn start_server(&mut self, i: u8) {
        let role = format!("b{i}");
        let ns = self.ns(&role);
        let child = Command::new("ip")
            .args(["netns", "exec", &ns, &self.python])
            .arg(self.dir.path().join("server.py"))
            .args([&role, "80"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start backend server");
        self.children.push((role, child));
    }

    /// Kills backend `i`'s server (the process we started, by PID).
    fn kill_server(&mut self, i: u8) {
        let role = format!("b{i}");
        let pos = self
            .children
            .iter()
            .position(|(r, _)| *r == role)
            .expect("server running");
        let (_, mut c) = self.children.remove(pos);
        c.kill().expect("kill server");
        let _ = c.wait();
    }

    /// Waits until every backend's server accepts TCP on its real address (from the balancer).
    fn wait_servers(&self, which: &[u8]) {
        let deadline = Instant::now() + Duration::from_secs(10);
        for &i in which {
            loop {
                let ok = Command::new("ip")
                    .args(["netns", "exec", &self.ns("lb"), "curl", "-s", "-m", "1"])
                    .arg(format!("http://{}/", Bed::backend_ip(i)))
                    .output()
                    .map(|o| o.status.success())
                    .unwrap_or(false);
                if ok {
                    break;
                }
                assert!(Instant::now() < deadline, "backend b{i} did not start");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Waits until IPv6 is usable on each host's eth0 (the kernel installs the on-link route
    /// only once it has seen the carrier, up to a second after the link went up).
    fn wait_ipv6(&self, roles: &[&str]) {
        let deadline = Instant::now() + Duration::from_secs(10);
        for role in roles {
            loop {
                let out = run(Command::new("ip").args([
                    "-n",
                    &self.ns(role),
                    "-6",
                    "route",
                    "show",
                    "dev",
                    "eth0",
                ]));
                let routes = String::from_utf8_lossy(&out.stdout).to_string();
                if routes.contains("2001:2::/64") && !routes.contains("linkdown") {
                    break;
                }
                if Instant::now() > deadline {
                    let a = run(Command::new("ip").args(["-n", &self.ns(role), "-6", "addr"]));
                    panic!(
                        "no IPv6 route on {role}: {routes} {}",
                        String::from_utf8_lossy(&a.stdout)
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    fn control(&self) -> PathBuf {
        self.dir.path().join("ctl.sock")
    }

    /// Starts `braid balance` in DSR mode on the balancer's eth0 and waits until it has learned
    /// every backend's MAC.
    fn start_balancer(&mut self, backends: &[u8]) {
        self.start_balancer_on(backends, false)
    }

    /// `v6`: the VIP and the backends are IPv6 (NDP instead of ARP).
    fn start_balancer_on(&mut self, backends: &[u8], v6: bool) {
        self.start_balancer_with(backends, v6, "tcp", 80)
    }

    fn start_balancer_with(&mut self, backends: &[u8], v6: bool, protocol: &str, port: u16) {
        self.start_balancer_full(backends, v6, protocol, (port, port), "")
    }

    /// `ports`: the VIP's (0: all) and the backends' (where health checks go); `extra`: more
    /// `[balance]` keys.
    fn start_balancer_full(
        &mut self,
        backends: &[u8],
        v6: bool,
        protocol: &str,
        ports: (u16, u16),
        extra: &str,
    ) {
        let (vip_port, port) = ports;
        let vip = if v6 {
            format!("[{VIP6}]:{vip_port}")
        } else {
            format!("{VIP}:{vip_port}")
        };
        let mut cfg = format!(
            "[balance]\nname = \"dsrtest\"\nmode = \"dsr\"\nprotocol = \"{protocol}\"\nvip = \"{vip}\"\n\
             interface = \"eth0\"\nalgorithm = \"maglev\"\n\
             health = {{ interval_ms = 200, timeout_ms = 150, fall = 2, rise = 2 }}\ncontrol = \"{}\"\n\
             metrics = \"127.0.0.1:9151\"\n{extra}",
            self.control().display()
        );
        for i in backends {
            let addr = if v6 {
                format!("[{}]:{port}", v6_of(&Bed::backend_ip(*i)))
            } else {
                format!("{}:{port}", Bed::backend_ip(*i))
            };
            cfg.push_str(&format!(
                "\n[[backend]]\naddress = \"{addr}\"\nweight = 1\n"
            ));
        }
        let path = self.dir.path().join("dsr.toml");
        std::fs::write(&path, cfg).unwrap();
        let log = std::fs::File::create(self.dir.path().join("balancer.log")).unwrap();
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.ns("lb"),
                BRAID,
                "--log-level",
                "info",
                "balance",
            ])
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start braid balance");
        self.balancer = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(st) = self.try_status() {
                let n = st["dsr"]["neighbors"]
                    .as_array()
                    .map(|a| a.iter().filter(|n| n["mac"].is_string()).count());
                if n == Some(backends.len()) {
                    return;
                }
            }
            if let Some(Some(code)) = self.balancer.as_mut().map(|b| b.try_wait().unwrap()) {
                panic!("braid balance exited ({code}): {}", self.balancer_log());
            }
            assert!(
                Instant::now() < deadline,
                "balancer did not learn the backends' MACs: {}",
                self.balancer_log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn balancer_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("balancer.log")).unwrap_or_default()
    }

    fn try_status(&self) -> Option<Value> {
        let out = Command::new(BRAID)
            .arg("--control")
            .arg(self.control())
            .args(["status", "--json"])
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// The balancer's metrics (OpenMetrics text), scraped inside its namespace.
    fn metrics(&self) -> String {
        let o = Command::new("ip")
            .args(["netns", "exec", &self.ns("lb"), "curl", "-s", "-m", "5"])
            .arg("http://127.0.0.1:9151/metrics")
            .output()
            .expect("curl");
        assert!(o.status.success(), "metrics endpoint did not answer");
        String::from_utf8(o.stdout).unwrap()
    }

    fn status(&self) -> Value {
        self.try_status()
            .unwrap_or_else(|| panic!("braid status failed; log: {}", self.balancer_log()))
    }

    fn backend_cmd(&self, args: &[&str]) {
        let out = Command::new(BRAID)
            .arg("--control")
            .arg(self.control())
            .arg("backend")
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "braid backend {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Runs the client script in the client namespace (bounded by `limit`).
    fn client(&self, args: &[&str], limit: Duration) -> Vec<String> {
        self.client_to(VIP, args, limit)
    }

    fn client_to(&self, vip: &str, args: &[&str], limit: Duration) -> Vec<String> {
        let child = self.client_spawn_to(vip, args);
        let out = wait_output(child, limit);
        assert!(
            out.status.success(),
            "client {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(String::from)
            .collect()
    }

    fn client_spawn(&self, args: &[&str]) -> Child {
        self.client_spawn_to(VIP, args)
    }

    fn client_spawn_to(&self, vip: &str, args: &[&str]) -> Child {
        Command::new("ip")
            .args(["netns", "exec", &self.ns("cl"), &self.python])
            .arg(self.dir.path().join("client.py"))
            .arg(vip)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start client")
    }

    /// (rx_bytes, tx_bytes) of `ns`'s eth0.
    fn iface_bytes(&self, role: &str) -> (u64, u64) {
        let read = |what: &str| -> u64 {
            let out = run(Command::new("ip").args([
                "netns",
                "exec",
                &self.ns(role),
                "cat",
                &format!("/sys/class/net/eth0/statistics/{what}"),
            ]));
            String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
        };
        (read("rx_bytes"), read("tx_bytes"))
    }

    /// Everything up: servers b1..b3 and the balancer over them.
    fn ready(tag: &str) -> Bed {
        let mut bed = Bed::new(tag);
        for i in 1..=3 {
            bed.start_server(i);
        }
        bed.wait_servers(&[1, 2, 3]);
        bed.start_balancer(&[1, 2, 3]);
        bed
    }
}

fn names(lines: &[String], prefix: &str) -> Vec<String> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix(prefix))
        .map(|s| s.split_whitespace().last().unwrap_or("").to_string())
        .collect()
}

#[test]
fn dsr_spreads_new_connections_over_all_backends() {
    let bed = Bed::ready("sp");
    let lines = bed.client(&["new", "90"], Duration::from_secs(30));
    let mut count: HashMap<String, u32> = HashMap::new();
    for l in &lines {
        let mut w = l.split_whitespace();
        assert_eq!(
            w.next(),
            Some("ok"),
            "a request failed: {l}\n{}",
            bed.balancer_log()
        );
        *count.entry(w.next().unwrap().to_string()).or_default() += 1;
    }
    assert_eq!(lines.len(), 90);
    // Maglev, equal weights: about 30 each; 10 is far outside chance.
    for b in ["b1", "b2", "b3"] {
        assert!(
            count.get(b).copied().unwrap_or(0) >= 10,
            "uneven spread: {count:?}"
        );
    }
    // The balancer counts what it forwarded, per backend too (its figures refresh every 50 ms).
    let deadline = Instant::now() + Duration::from_secs(2);
    let st = loop {
        let st = bed.status();
        if st["dsr"]["forwarded_packets"].as_u64().unwrap_or(0) >= 90 * 4
            || Instant::now() > deadline
        {
            break st;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        st["dsr"]["forwarded_packets"].as_u64().unwrap() >= 90 * 4,
        "{st}"
    );
    assert!(
        st["dsr"]["answered"].as_u64().unwrap() >= 1,
        "the client's ARP for the VIP was answered: {st}"
    );
    // The metrics carry the data path's figures too (refreshed with the status), and are
    // exactly those docs/balance.md lists (DSR mode exports every one).
    let m = bed.metrics();
    let forwarded: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix("braid_balance_dsr_forwarded_packets_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no forwarded packets counter:\n{m}"));
    assert!(forwarded >= 90 * 4, "{m}");
    assert!(
        m.contains("braid_balance_dsr_flows{state=\"active\"}"),
        "{m}"
    );
    assert!(
        m.contains(&format!(
            "braid_balance_dsr_backend_mac_known{{backend=\"{}\"}} 1",
            Bed::backend_ip(1)
        )),
        "{m}"
    );
    metrics_docs::assert_documented(&m, "balance.md", "Metrics", |_| true);
    let totals: u64 = st["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["total"].as_u64().unwrap())
        .sum();
    assert_eq!(totals, 90, "one flow per connection: {st}");
    for b in st["backends"].as_array().unwrap() {
        assert_eq!(
            b["bytes_out"].as_u64(),
            Some(0),
            "DSR: no reply bytes through the balancer"
        );
        assert!(b["bytes_in"].as_u64().unwrap() > 0);
    }
}

#[test]
fn dsr_flows_stay_on_their_backend_when_backends_change() {
    let mut bed = Bed::ready("st");
    bed.add_backend(4);
    bed.start_server(4);
    bed.wait_servers(&[4]);
    let flag = bed.dir.path().join("go");
    let client = bed.client_spawn(&["sticky", "24", flag.to_str().unwrap()]);
    // Wait for the first round on every connection, then change the backend set under them:
    // a 4th backend (Maglev alone would move ~1/4 of the flows) and b1 drained.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = bed.status();
        if st["dsr"]["active_flows"].as_u64().unwrap_or(0) >= 24 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "sticky client did not connect: {st}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    bed.backend_cmd(&["add", &format!("{}:80", Bed::backend_ip(4))]);
    bed.backend_cmd(&["drain", &format!("{}:80", Bed::backend_ip(1))]);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let st = bed.status();
        let known = st["dsr"]["neighbors"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| n["mac"].is_string())
            .count();
        if known == 4 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "4th backend's MAC not learned: {st}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::write(&flag, b"go").unwrap();
    let out = wait_output(client, Duration::from_secs(30));
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect();
    let (a, b, c) = (
        names(&lines, "A "),
        names(&lines, "B "),
        names(&lines, "C "),
    );
    assert_eq!(a.len(), 24, "{lines:?}");
    assert_eq!(
        a, b,
        "established connections changed backend (or failed) after add + drain"
    );
    assert!(
        a.iter().any(|n| n == "b1"),
        "no connection on b1 before the drain (unlucky hash?): {a:?}"
    );
    // New connections: never the drained b1; the new b4 takes some.
    assert_eq!(c.len(), 24);
    assert!(
        c.iter().all(|n| n != "b1" && !n.starts_with("fail")),
        "{c:?}"
    );
    assert!(
        c.iter().any(|n| n == "b4"),
        "the added backend got no new connection: {c:?}"
    );
    let st = bed.status();
    let b1 = st["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["address"] == "198.18.0.11:80")
        .unwrap()
        .clone();
    assert_eq!(b1["state"], "draining", "{st}");
}

#[test]
fn dsr_dead_backend_is_dropped_and_comes_back() {
    let mut bed = Bed::ready("kl");
    // Established keep-alive connections: those to b1/b3 must survive b2's death.
    let flag = bed.dir.path().join("go");
    let sticky = bed.client_spawn(&["sticky", "12", flag.to_str().unwrap()]);
    let load = bed.client_spawn(&["load", "4"]);
    std::thread::sleep(Duration::from_millis(1000));
    let killed_at = Instant::now();
    let started = killed_at - Duration::from_millis(1000);
    bed.kill_server(2);
    // Health: interval 200 ms, fall 2 (+ a 150 ms timeout): down well within 1 s.
    let window = Duration::from_millis(1000);
    let out = wait_output(load, Duration::from_secs(20));
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect();
    let kill_t = (killed_at - started).as_secs_f64();
    let mut after_window = 0;
    for l in &lines {
        let mut w = l.split_whitespace();
        let t: f64 = w.next().unwrap().parse().unwrap();
        let verdict = w.next().unwrap();
        let what = w.next().unwrap_or("");
        // Load starts a bit after spawn: allow 0.3 s of process start-up in the comparison.
        if t > kill_t + window.as_secs_f64() + 0.3 {
            after_window += 1;
            assert_eq!(verdict, "ok", "request failed after the health window: {l}");
            assert_ne!(what, "b2", "the dead backend answered?");
        }
    }
    assert!(
        after_window > 20,
        "too few requests after the window: {lines:?}"
    );
    let st = bed.status();
    let b2 = st["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["address"] == "198.18.0.12:80")
        .unwrap()
        .clone();
    assert_eq!(b2["state"], "down", "{st}");
    std::fs::write(&flag, b"go").unwrap();
    let out = wait_output(sticky, Duration::from_secs(30));
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect();
    let (a, b) = (names(&lines, "A "), names(&lines, "B "));
    assert_eq!(a.len(), 12, "{lines:?}");
    for (x, y) in a.iter().zip(&b) {
        if x != "b2" {
            assert_eq!(
                x, y,
                "an established connection to a live backend was disturbed: {lines:?}"
            );
        }
    }
    // Bring b2 back: after `rise` good checks it takes new connections again.
    bed.start_server(2);
    bed.wait_servers(&[2]);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let st = bed.status();
        let state = st["backends"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["address"] == "198.18.0.12:80")
            .unwrap()["state"]
            .clone();
        if state == "up" {
            break;
        }
        assert!(Instant::now() < deadline, "b2 did not come back: {st}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let lines = bed.client(&["new", "45"], Duration::from_secs(30));
    assert!(lines.iter().all(|l| l.starts_with("ok ")), "{lines:?}");
    assert!(
        lines.iter().any(|l| l == "ok b2"),
        "b2 back up but gets nothing: {lines:?}"
    );
}

#[test]
fn dsr_reply_bytes_bypass_the_balancer() {
    let bed = Bed::ready("by");
    let (rx0, tx0) = bed.iface_bytes("lb");
    let (crx0, _) = bed.iface_bytes("cl");
    const SIZE: u64 = 8 << 20;
    let lines = bed.client(&["big", "6", &SIZE.to_string()], Duration::from_secs(60));
    let (rx1, tx1) = bed.iface_bytes("lb");
    let (crx1, _) = bed.iface_bytes("cl");
    assert_eq!(lines.len(), 6);
    let got: u64 = lines.iter().map(|l| l.parse::<u64>().unwrap()).sum();
    // Each response is SIZE bytes of body plus headers.
    assert!(got >= 6 * SIZE, "client received {got} bytes: {lines:?}");
    let through_lb = (rx1 - rx0) + (tx1 - tx0);
    let client_rx = crx1 - crx0;
    assert!(client_rx >= 6 * SIZE);
    // The balancer carries only the client's requests and ACKs (both ways: in and forwarded out),
    // a few percent of the replies; a proxy would carry every reply byte twice.
    assert!(
        (through_lb as f64) < 0.10 * client_rx as f64,
        "balancer moved {through_lb} bytes for {client_rx} received by the client"
    );
    eprintln!("client received {client_rx} bytes; balancer interface rx+tx {through_lb} bytes");
}

#[test]
fn dsr_ipv6_vip_answers_ndp_and_spreads() {
    let mut bed = Bed::new("v6");
    bed.wait_ipv6(&["cl", "lb", "b1", "b2", "b3"]);
    for i in 1..=3 {
        bed.start_server(i);
    }
    bed.wait_servers(&[1, 2, 3]);
    bed.start_balancer_on(&[1, 2, 3], true);
    let lines = bed.client_to(VIP6, &["new", "60"], Duration::from_secs(30));
    if lines.iter().any(|l| !l.starts_with("ok")) {
        let st = bed.status();
        let n = run(Command::new("ip").args(["-n", &bed.ns("cl"), "-6", "neigh"]));
        let a = run(Command::new("ip").args(["-n", &bed.ns("b1"), "-6", "addr"]));
        panic!(
            "failures: {lines:?}\n{}\n{}\n{}",
            st["dsr"],
            String::from_utf8_lossy(&n.stdout),
            String::from_utf8_lossy(&a.stdout)
        );
    }
    let mut count: HashMap<String, u32> = HashMap::new();
    for l in &lines {
        let mut w = l.split_whitespace();
        assert_eq!(
            w.next(),
            Some("ok"),
            "a request failed: {l}\n{}",
            bed.balancer_log()
        );
        *count.entry(w.next().unwrap().to_string()).or_default() += 1;
    }
    assert_eq!(lines.len(), 60);
    for b in ["b1", "b2", "b3"] {
        assert!(
            count.get(b).copied().unwrap_or(0) >= 5,
            "uneven spread: {count:?}"
        );
    }
    // The client learned the VIP's MAC from our Neighbor Advertisement: it is the balancer's.
    // The backends' MACs were learned through our Neighbor Solicitations.
    let st = bed.status();
    let nb = st["dsr"]["neighbors"].as_array().unwrap();
    assert!(
        nb.iter()
            .all(|n| n["ip"].as_str().unwrap().starts_with("2001:2::") && n["mac"].is_string()),
        "{st}"
    );
    let lb_mac = st["dsr"]["mac"].as_str().unwrap().to_string();
    let out = run(Command::new("ip").args(["-n", &bed.ns("cl"), "-6", "neigh", "show", VIP6]));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&lb_mac),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn dsr_udp_flows_spread_and_stick() {
    let mut bed = Bed::new("ud");
    for i in 1..=3u8 {
        let role = format!("b{i}");
        let child = Command::new("ip")
            .args(["netns", "exec", &bed.ns(&role), &bed.python])
            .arg(bed.dir.path().join("udp_server.py"))
            .args([role.as_str(), VIP, &Bed::backend_ip(i), "5353"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start UDP server");
        bed.children.push((role, child));
    }
    std::thread::sleep(Duration::from_millis(300));
    bed.start_balancer_with(&[1, 2, 3], false, "udp", 5353);
    let child = Command::new("ip")
        .args(["netns", "exec", &bed.ns("cl"), &bed.python])
        .arg(bed.dir.path().join("udp_client.py"))
        .args([VIP, "5353", "30", "4"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_output(child, Duration::from_secs(60));
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(lines.len(), 120, "{lines:?}");
    let mut per_socket: HashMap<String, Vec<String>> = HashMap::new();
    for l in &lines {
        let (i, name) = l.split_once(' ').unwrap();
        assert!(
            !name.starts_with("fail"),
            "a datagram got no answer: {l}\n{}",
            bed.balancer_log()
        );
        per_socket
            .entry(i.to_string())
            .or_default()
            .push(name.to_string());
    }
    let mut count: HashMap<String, u32> = HashMap::new();
    for names in per_socket.values() {
        assert!(
            names.iter().all(|n| *n == names[0]),
            "a UDP flow changed backend: {names:?}"
        );
        *count.entry(names[0].clone()).or_default() += 1;
    }
    assert!(
        count.len() == 3 && count.values().all(|&c| c >= 3),
        "uneven spread: {count:?}"
    );
}

#[test]
fn dsr_bad_interface_is_a_one_line_error() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    let mut f = std::fs::File::create(&path).unwrap();
    writeln!(
        f,
        "[balance]\nname = \"bad\"\nmode = \"dsr\"\nvip = \"{VIP}\"\ninterface = \"nosuchif0\"\ncontrol = \"{}\"\n\n[[backend]]\naddress = \"198.18.0.11:80\"",
        dir.path().join("c.sock").display()
    )
    .unwrap();
    drop(f);
    let child = Command::new(BRAID)
        .arg("balance")
        .arg(&path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_output(child, Duration::from_secs(10));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nosuchif0"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// The balancer's interface goes down and comes back (a flap, a driver reset): the balancer keeps
/// running, says so in its status, reopens its socket when the link is back, and then serves the
/// connections established before the flap (their flows were kept) and new ones.
#[test]
fn dsr_survives_an_interface_flap() {
    let bed = Bed::ready("fl");
    let flag = bed.dir.path().join("go");
    let client = bed.client_spawn(&["sticky", "12", flag.to_str().unwrap()]);
    let wait_for = |what: &str, limit: Duration, ok: &dyn Fn(&Value) -> bool| {
        let deadline = Instant::now() + limit;
        loop {
            let st = bed.try_status();
            if st.as_ref().is_some_and(ok) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: {st:?}\n{}",
                bed.balancer_log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_for(
        "sticky client did not connect",
        Duration::from_secs(10),
        &|st| st["dsr"]["active_flows"].as_u64().unwrap_or(0) >= 12,
    );
    let lb = bed.ns("lb");
    ip(&["-n", &lb, "link", "set", "dev", "eth0", "down"]);
    wait_for(
        "the balancer did not notice the flap",
        Duration::from_secs(5),
        &|st| st["dsr"]["interface_down"] == true,
    );
    std::thread::sleep(Duration::from_millis(500));
    ip(&["-n", &lb, "link", "set", "dev", "eth0", "up"]);
    // Back: the socket reopened, and the health checks (which failed while the link was down)
    // see every backend up again.
    wait_for(
        "the balancer did not come back",
        Duration::from_secs(15),
        &|st| {
            st["dsr"]["interface_down"] == false
                && st["dsr"]["interface_restarts"].as_u64().unwrap_or(0) >= 1
                && st["backends"]
                    .as_array()
                    .is_some_and(|b| b.iter().all(|b| b["state"] == "up"))
        },
    );
    std::fs::write(&flag, b"go").unwrap();
    let out = wait_output(client, Duration::from_secs(40));
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect();
    let (a, b, c) = (
        names(&lines, "A "),
        names(&lines, "B "),
        names(&lines, "C "),
    );
    assert_eq!(a.len(), 12, "{lines:?}");
    assert_eq!(
        a,
        b,
        "connections established before the flap failed or moved\n{}",
        bed.balancer_log()
    );
    assert!(
        c.len() == 12 && c.iter().all(|n| !n.starts_with("fail")),
        "new connections after the flap: {c:?}\n{}",
        bed.balancer_log()
    );
    let st = bed.status();
    assert_eq!(st["dsr"]["interface_restarts"], 1, "{st}");
    let m = bed.metrics();
    assert!(
        m.contains("braid_balance_dsr_interface_restarts_total 1\n"),
        "{m}"
    );
}

// ---------------------------------------------------------------- braid concentrators (issue 14)

/// The braid key of client `k` (the same on every concentrator's server for it): 32 bytes in
/// base64, told apart by their first byte.
fn braid_key(k: u16) -> String {
    let first = char::from(b"BCDEFGHIJK"[usize::from(k) % 10]);
    format!("{first}AECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=")
}

impl Bed {
    /// Braid client `k`: namespace `c{k}` with two uplinks on the segment, `eth0` and `eth1`
    /// (198.18.0.{40+2k} and {41+2k}), each answering ARP only for its own address.
    fn add_braid_client(&mut self, k: u16) {
        let role = format!("c{k}");
        let a = format!("198.18.0.{}", 40 + 2 * k);
        let b = format!("198.18.0.{}", 41 + 2 * k);
        let ns = self.add_host(&role, &a);
        let sw = self.ns("sw");
        let port = format!("q-{role}");
        ip(&[
            "-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", "eth1", "netns", &ns,
        ]);
        ip(&["-n", &sw, "link", "set", &port, "master", "br0", "up"]);
        ip(&["-n", &ns, "addr", "add", &format!("{b}/24"), "dev", "eth1"]);
        ip(&["-n", &ns, "link", "set", "eth1", "up"]);
        for kv in [
            "net.ipv4.conf.all.arp_ignore=1",
            "net.ipv4.conf.all.arp_announce=2",
            "net.ipv4.conf.eth0.arp_ignore=1",
            "net.ipv4.conf.eth1.arp_ignore=1",
        ] {
            self.sysctl(&ns, kv);
        }
    }

    fn braid_sock(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.sock"))
    }

    /// Starts `braid up` from `cfg` in namespace `role`, named `name` (log `name.log`).
    fn start_braid(&mut self, role: &str, name: &str, cfg: String) {
        let path = self.dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, cfg).unwrap();
        let log = std::fs::File::create(self.dir.path().join(format!("{name}.log"))).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns(role), BRAID, "up"])
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start braid up");
        self.children.push((name.to_string(), child));
    }

    /// Concentrator `i` (backend `b{i}`) serves client `k` on port 5000+k, on every address
    /// (so it answers from the VIP the client sent to).
    fn start_concentrator(&mut self, i: u8, k: u16) {
        let cfg = format!(
            "[bundle]\nname = \"brd{k}\"\nrole = \"server\"\nkey = \"{}\"\naddress = \"198.19.{k}.1/30\"\n\
             listen = \"0.0.0.0:{}\"\ncontrol = \"{}\"\n",
            braid_key(k),
            5000 + k,
            self.braid_sock(&format!("s{i}-{k}")).display()
        );
        self.start_braid(&format!("b{i}"), &format!("s{i}-{k}"), cfg);
    }

    fn start_braid_client(&mut self, k: u16, route: u16) {
        let mut cfg = format!(
            "[bundle]\nname = \"brd{k}\"\nrole = \"client\"\nkey = \"{}\"\naddress = \"198.19.{k}.2/30\"\n\
             control = \"{}\"\nroute_id = {route}\n",
            braid_key(k),
            self.braid_sock(&format!("c{k}")).display()
        );
        for (n, dev) in [(40, "eth0"), (41, "eth1")] {
            cfg.push_str(&format!(
                "\n[[link]]\nname = \"{dev}\"\ndev = \"{dev}\"\nbind = \"198.18.0.{}\"\nremote = \"{VIP}:{}\"\n",
                n + 2 * k,
                5000 + k
            ));
        }
        self.start_braid(&format!("c{k}"), &format!("c{k}"), cfg);
    }

    fn braid_status(&self, name: &str) -> Option<Value> {
        let out = Command::new(BRAID)
            .arg("--control")
            .arg(self.braid_sock(name))
            .args(["status", "--json"])
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// Per client: the concentrators that hold its session with both links up, and that
    /// session's id.
    fn homes(&self, concentrators: &[u8], clients: u16) -> Vec<Vec<(u8, u32)>> {
        (1..=clients)
            .map(|k| {
                concentrators
                    .iter()
                    .filter_map(|&i| {
                        let st = self.braid_status(&format!("s{i}-{k}"))?;
                        let up = st["links_up"].as_u64() == Some(2)
                            && st["connected"].as_bool() == Some(true);
                        up.then(|| (i, st["session"].as_u64().unwrap_or(0) as u32))
                    })
                    .collect()
            })
            .collect()
    }

    fn braid_logs(&self) -> String {
        let mut out = String::new();
        for (name, _) in &self.children {
            if let Ok(l) = std::fs::read_to_string(self.dir.path().join(format!("{name}.log"))) {
                let tail: Vec<&str> = l.lines().rev().take(6).collect();
                out.push_str(&format!(
                    "--- {name}\n{}\n",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                ));
            }
        }
        out + &self.balancer_log()
    }
}

/// Which concentrator Maglev gives `route` among `backends` (as `braid balance` builds its table).
fn maglev_home(route: u16, backends: &[u8]) -> u8 {
    use braid_lb::backend::BackendTable;
    let mut t = BackendTable::new(
        braid_lb::Algorithm::Maglev,
        braid_lb::DEFAULT_TABLE_SIZE,
        braid_lb::health::HealthParams { fall: 2, rise: 2 },
    )
    .unwrap();
    for &i in backends {
        t.add(format!("{}:5001", Bed::backend_ip(i)).parse().unwrap(), 1)
            .unwrap();
    }
    let id = t.pick(braid_lb::dsr::route_pick_key(route), &[]).unwrap();
    let addr = t.get(id).unwrap().addr.ip().to_string();
    (1..=9).find(|&i| Bed::backend_ip(i) == addr).unwrap()
}

/// issue 14 item 6: braid concentrators behind `braid balance` in DSR mode with
/// `steer = "braid"`. Several clients, each with two links from two source addresses: every
/// client's links all reach one concentrator, the one Maglev gives its route id; when a third
/// concentrator is added, a client keeps its concentrator (and its session) unless Maglev moves
/// it, and then it moves to the new one and its tunnel works there.
#[test]
fn dsr_steers_every_link_of_a_braid_client_to_one_concentrator() {
    const CLIENTS: u16 = 5;
    let mut bed = Bed::new("br");
    for k in 1..=CLIENTS {
        bed.add_braid_client(k);
    }
    for i in 1..=3 {
        for k in 1..=CLIENTS {
            bed.start_concentrator(i, k);
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    bed.start_balancer_full(&[1, 2], false, "udp", (0, 5001), "steer = \"braid\"\n");
    // Route ids chosen so that the third concentrator takes two clients and the other three
    // stay, on both old concentrators.
    let (mut on1, mut on2, mut go) = (Vec::new(), Vec::new(), Vec::new());
    for r in 1..u16::MAX {
        let (old, new) = (maglev_home(r, &[1, 2]), maglev_home(r, &[1, 2, 3]));
        match (old, new) {
            (_, 3) if go.len() < 2 => go.push(r),
            (1, 1) if on1.len() < 2 => on1.push(r),
            (2, 2) if on2.is_empty() => on2.push(r),
            _ => {}
        }
        if go.len() == 2 && on1.len() == 2 && on2.len() == 1 {
            break;
        }
    }
    let routes: Vec<u16> = on1.iter().chain(&on2).chain(&go).copied().collect();
    for k in 1..=CLIENTS {
        bed.start_braid_client(k, routes[usize::from(k - 1)]);
    }
    // Every concentrator runs; `balanced` are those in the balancer.
    let settle = |bed: &Bed, balanced: &[u8], what: &str| -> Vec<(u8, u32)> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let homes = bed.homes(&[1, 2, 3], CLIENTS);
            let all_one = homes.iter().all(|h| h.len() == 1);
            let expected = all_one
                && homes
                    .iter()
                    .all(|h| h[0].0 == maglev_home((h[0].1 >> 16) as u16, balanced));
            if expected {
                return homes.into_iter().map(|h| h[0]).collect();
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not every client on exactly its Maglev concentrator: {homes:?}\n{}",
                bed.braid_logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let before = settle(&bed, &[1, 2], "two concentrators");
    assert!(
        before.iter().all(|(i, _)| *i != 3),
        "the third is not in the balancer yet: {before:?}"
    );
    let st = bed.status();
    assert!(
        st["dsr"]["braid_routed_packets"].as_u64().unwrap_or(0) > 0,
        "{st}"
    );
    // A third concentrator joins.
    bed.backend_cmd(&["add", &format!("{}:5001", Bed::backend_ip(3))]);
    let after = settle(&bed, &[1, 2, 3], "three concentrators");
    let mut moved = 0;
    for (k, (b, a)) in before.iter().zip(&after).enumerate() {
        if a.0 == b.0 {
            assert_eq!(
                a.1,
                b.1,
                "client {} kept its concentrator but not its session",
                k + 1
            );
        } else {
            assert_eq!(a.0, 3, "client {} moved between old concentrators", k + 1);
            moved += 1;
        }
    }
    eprintln!("before {before:?}, after {after:?}: {moved} of {CLIENTS} moved");
    assert_eq!(moved, 2, "the clients Maglev moves, and only them");
    // Every tunnel carries traffic where it now is.
    for k in 1..=CLIENTS {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &bed.ns(&format!("c{k}")),
                "ping",
                "-c",
                "3",
                "-i",
                "0.2",
                "-W",
                "2",
                &format!("198.19.{k}.1"),
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ping through client {k}'s tunnel: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            bed.braid_logs()
        );
    }
}
