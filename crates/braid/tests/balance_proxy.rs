//! End-to-end tests of `braid balance` in proxy mode, in network namespaces made by each test:
//!
//! ```text
//!   client ns                balancer ns                         backend ns s1, s2, s3
//!   198.18.10.1/24 (+.21..) ── 198.18.10.2/24  [bridge br0 198.18.20.1/24] ── 198.18.20.11..13/24
//! ```
//!
//! Backends are small Python servers (HTTP with keep-alive on TCP 8080, answering with their
//! name in the body and an `X-Backend` header; `/big` answers 1 MiB; a UDP echo on 8080 that
//! prefixes its name). `braid balance` runs as a process in the balancer namespace; `braid status`
//! and `braid backend ...` talk to it over its control socket.
//!
//! Every test bounds its own time; a Drop guard kills the processes it started (by PID) and
//! deletes its namespaces, also when the test fails.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

const BRAID: &str = env!("CARGO_BIN_EXE_braid");
const LISTEN: &str = "198.18.10.2:8080";
const BACKENDS: [&str; 3] = [
    "198.18.20.11:8080",
    "198.18.20.12:8080",
    "198.18.20.13:8080",
];
const NAMES: [&str; 3] = ["s1", "s2", "s3"];

const SERVER_PY: &str = r#"
import sys, socket, threading
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
name, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
BIG = b"x" * (1 << 20)
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = BIG * int(self.path[5:] or 1) if self.path.startswith("/big") else (name + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Backend", name)
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
class S(ThreadingHTTPServer):
    request_queue_size = 256
    daemon_threads = True
    allow_reuse_address = True
def udp():
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind((host, port))
    while True:
        d, a = u.recvfrom(65535)
        u.sendto(name.encode() + b":" + d, a)
threading.Thread(target=udp, daemon=True).start()
S((host, port), H).serve_forever()
"#;

/// `seq HOST PORT N SRC,SRC,..`: N requests on new connections (source addresses in turn),
/// prints a JSON list of [src, backend-or-"FAIL:..."].
/// `load HOST PORT SECONDS`: one keep-alive connection (prints `KA name` at once, then asks on it
/// every 50 ms) while new-connection requests run back to back; prints a JSON summary.
/// `udp HOST PORT SOCKETS DATAGRAMS`: per socket, the backends that answered (JSON).
/// `hold HOST PORT N SECONDS`: opens N TCP connections, sends nothing, prints `HELD k`, holds them.
/// `sweep HOST PORT N [SRC]`: one UDP datagram from each of N new sockets (N source ports).
/// `slow HOST PORT MIB RATE`: GET /big/MIB read at RATE MiB/s; prints `STARTED`, then the body
/// length received (JSON).
const CLIENT_PY: &str = r#"
import sys, json, time, socket, threading, http.client
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
def get(src=None, path="/"):
    c = http.client.HTTPConnection(host, port, timeout=3, source_address=(src, 0) if src else None)
    try:
        c.request("GET", path)
        r = c.getresponse()
        r.read()
        if r.status != 200:
            return "FAIL:status %d" % r.status
        return r.getheader("X-Backend")
    finally:
        c.close()
if mode == "seq":
    n, srcs = int(sys.argv[4]), sys.argv[5].split(",")
    out = []
    for i in range(n):
        src = srcs[i % len(srcs)] or None
        try:
            out.append([src, get(src)])
        except Exception as e:
            out.append([src, "FAIL:%s" % e])
    print(json.dumps(out))
elif mode == "load":
    dur = float(sys.argv[4])
    ka = http.client.HTTPConnection(host, port, timeout=3)
    def ka_get():
        ka.request("GET", "/")
        r = ka.getresponse()
        r.read()
        return r.getheader("X-Backend")
    first = ka_get()
    print("KA", first, flush=True)
    t_end = time.time() + dur
    ka_res = []
    def ka_loop():
        while time.time() < t_end:
            try:
                ka_res.append([time.time(), ka_get()])
            except Exception as e:
                ka_res.append([time.time(), "FAIL:%s" % e])
                return
            time.sleep(0.05)
    th = threading.Thread(target=ka_loop)
    th.start()
    reqs = []
    while time.time() < t_end:
        t = time.time()
        try:
            reqs.append([t, get()])
        except Exception as e:
            reqs.append([t, "FAIL:%s" % e])
    th.join()
    print(json.dumps({"ka_first": first, "ka": ka_res, "reqs": reqs}), flush=True)
elif mode == "udp":
    nsock, ndgram = int(sys.argv[4]), int(sys.argv[5])
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(nsock)]
    out = []
    for s in socks:
        s.settimeout(2)
        s.connect((host, port))
    for s in socks:
        seen = []
        for k in range(ndgram):
            s.send(b"ping%d" % k)
            try:
                d = s.recv(65535)
                name, _, payload = d.partition(b":")
                seen.append(name.decode() if payload == b"ping%d" % k else "BAD")
            except Exception as e:
                seen.append("FAIL:%s" % e)
        out.append(seen)
    print(json.dumps(out))
elif mode == "hold":
    n, secs = int(sys.argv[4]), float(sys.argv[5])
    socks = []
    for i in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(3)
        try:
            s.connect((host, port))
            socks.append(s)
        except Exception:
            s.close()
    print("HELD %d" % len(socks), flush=True)
    time.sleep(secs)
elif mode == "sweep":
    n = int(sys.argv[4])
    src = sys.argv[5] if len(sys.argv) > 5 else ""
    for i in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        if src:
            s.bind((src, 0))
        s.sendto(b"sweep", (host, port))
        s.close()
    print("SENT %d" % n, flush=True)
elif mode == "slow":
    mib, rate = int(sys.argv[4]), float(sys.argv[5])
    want = mib << 20
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    s.settimeout(10)
    s.connect((host, port))
    s.sendall(b"GET /big/%d HTTP/1.1\r\nHost: x\r\n\r\n" % mib)
    head, body, started = b"", 0, False
    try:
        while body < want:
            d = s.recv(65536)
            if not d:
                break
            if not started:
                print("STARTED", flush=True)
                started = True
            if b"\r\n\r\n" not in head:
                head += d
                if b"\r\n\r\n" in head:
                    body = len(head.split(b"\r\n\r\n", 1)[1])
            else:
                body += len(d)
            time.sleep(len(d) / (rate * 1048576))
    except Exception as e:
        print("ERROR %s" % e, file=sys.stderr)
    print(json.dumps({"body": body}), flush=True)
"#;

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    out
}

fn must(args: &[&str]) {
    let out = run(Command::new(args[0]).args(&args[1..]));
    assert!(
        out.status.success(),
        "{args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Namespaces, processes and files of one test; cleaned up on drop.
struct Lab {
    tag: String,
    dir: PathBuf,
    netns: Vec<String>,
    children: Vec<(String, Child)>,
}

impl Lab {
    fn new(test: &str) -> Lab {
        let tag = format!("bp{}{}", std::process::id(), test);
        let dir = std::env::temp_dir().join(format!("braid-e2e-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("server.py"), SERVER_PY).unwrap();
        std::fs::write(dir.join("client.py"), CLIENT_PY).unwrap();
        let mut lab = Lab {
            tag,
            dir,
            netns: Vec::new(),
            children: Vec::new(),
        };
        let (c, b) = (lab.ns("c"), lab.ns("b"));
        for n in [c.clone(), b.clone()] {
            lab.netns.push(n.clone());
            must(&["ip", "netns", "add", &n]);
            must(&["ip", "-n", &n, "link", "set", "lo", "up"]);
        }
        must(&[
            "ip", "-n", &b, "link", "add", "vc0", "type", "veth", "peer", "name", "eth0", "netns",
            &c,
        ]);
        must(&[
            "ip",
            "-n",
            &c,
            "addr",
            "add",
            "198.18.10.1/24",
            "dev",
            "eth0",
        ]);
        for i in 21..=40 {
            must(&[
                "ip",
                "-n",
                &c,
                "addr",
                "add",
                &format!("198.18.10.{i}/24"),
                "dev",
                "eth0",
            ]);
        }
        must(&["ip", "-n", &c, "link", "set", "eth0", "up"]);
        must(&[
            "ip",
            "-n",
            &b,
            "addr",
            "add",
            "198.18.10.2/24",
            "dev",
            "vc0",
        ]);
        must(&["ip", "-n", &b, "link", "set", "vc0", "up"]);
        must(&["ip", "-n", &b, "link", "add", "br0", "type", "bridge"]);
        must(&[
            "ip",
            "-n",
            &b,
            "addr",
            "add",
            "198.18.20.1/24",
            "dev",
            "br0",
        ]);
        must(&["ip", "-n", &b, "link", "set", "br0", "up"]);
        for (i, name) in NAMES.iter().enumerate() {
            let s = lab.ns(name);
            lab.netns.push(s.clone());
            must(&["ip", "netns", "add", &s]);
            must(&["ip", "-n", &s, "link", "set", "lo", "up"]);
            let v = format!("vs{i}");
            must(&[
                "ip", "-n", &b, "link", "add", &v, "type", "veth", "peer", "name", "eth0", "netns",
                &s,
            ]);
            must(&["ip", "-n", &b, "link", "set", &v, "master", "br0", "up"]);
            must(&[
                "ip",
                "-n",
                &s,
                "addr",
                "add",
                &format!("198.18.20.1{}/24", i + 1),
                "dev",
                "eth0",
            ]);
            must(&["ip", "-n", &s, "link", "set", "eth0", "up"]);
        }
        for i in 0..3 {
            lab.start_backend(i);
        }
        lab
    }

    fn ns(&self, role: &str) -> String {
        format!("{}{role}", self.tag)
    }

    fn ctl(&self) -> String {
        self.dir.join("ctl.sock").display().to_string()
    }

    fn start_backend(&mut self, i: usize) {
        let ip = &BACKENDS[i][..BACKENDS[i].find(':').unwrap()];
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns(NAMES[i]), "python3", "-u"])
            .arg(self.dir.join("server.py"))
            .args([NAMES[i], ip, "8080"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.children.push((NAMES[i].to_string(), child));
        // Ready when it accepts.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let out = run(Command::new("ip").args([
                "netns",
                "exec",
                &self.ns(NAMES[i]),
                "python3",
                "-c",
                &format!("import socket; socket.create_connection(('{ip}', 8080), timeout=1)"),
            ]));
            if out.status.success() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "backend {} never came up",
                NAMES[i]
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn kill(&mut self, name: &str) {
        for (n, c) in self.children.iter_mut() {
            if n == name {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        self.children.retain(|(n, _)| n != name);
    }

    /// Writes the config and starts `braid balance` in the balancer namespace; waits until every
    /// configured backend has passed a health check.
    fn start_balancer(&mut self, extra: &str, backends: &[(usize, u32)]) {
        self.start_balancer_nofile(extra, backends, None)
    }

    /// [`Lab::start_balancer`] with the open-files limit (soft and hard) set to `nofile`.
    fn start_balancer_nofile(
        &mut self,
        extra: &str,
        backends: &[(usize, u32)],
        nofile: Option<u32>,
    ) {
        let mut cfg = format!(
            "[balance]\nname = \"{}\"\nlisten = \"{LISTEN}\"\ncontrol = \"{}\"\nmetrics = \"127.0.0.1:9151\"\n{extra}\n",
            self.tag,
            self.ctl()
        );
        for (i, w) in backends {
            cfg.push_str(&format!(
                "[[backend]]\naddress = \"{}\"\nweight = {w}\n",
                BACKENDS[*i]
            ));
        }
        let path = self.dir.join("balance.toml");
        std::fs::write(&path, cfg).unwrap();
        let log = std::fs::File::create(self.dir.join("balance.log")).unwrap();
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns("b")]);
        if let Some(n) = nofile {
            // prlimit execs the command: the PID we get is still the balancer's.
            cmd.arg("prlimit").arg(format!("--nofile={n}:{n}"));
        }
        let child = cmd
            .args([BRAID, "balance"])
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.children.push(("balancer".into(), child));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(st) = self.try_status() {
                let bs = st["backends"].as_array().unwrap();
                if bs.iter().all(|b| b["last_health"]["ok"] == true) {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "balancer never ready: {}",
                self.balancer_log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stop_balancer(&mut self) {
        for (n, c) in self.children.iter_mut() {
            if n == "balancer" {
                // SIGTERM: the balancer removes its control socket on the way out.
                let _ = Command::new("kill").arg(c.id().to_string()).status();
                let deadline = Instant::now() + Duration::from_secs(5);
                while c.try_wait().unwrap().is_none() {
                    if Instant::now() > deadline {
                        let _ = c.kill();
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
        self.children.retain(|(n, _)| n != "balancer");
        assert!(
            !std::path::Path::new(&self.ctl()).exists(),
            "control socket left behind"
        );
    }

    fn balancer_pid(&self) -> u32 {
        self.children
            .iter()
            .find(|(n, _)| n == "balancer")
            .map(|(_, c)| c.id())
            .expect("balancer running")
    }

    /// Waits up to `limit` for the balancer to exit; its exit status, or None if still running.
    fn wait_balancer(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            for (n, c) in self.children.iter_mut() {
                if n == "balancer" {
                    if let Some(st) = c.try_wait().unwrap() {
                        return Some(st);
                    }
                }
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts a client mode that prints one line when it is ready (e.g. `hold`) and waits for
    /// that line; the client is killed with the lab (or by `kill(name)`).
    fn start_client(&mut self, name: &str, args: &[&str]) -> (BufReader<ChildStdout>, String) {
        let mut child = self.client(args).stdout(Stdio::piped()).spawn().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        self.children.push((name.to_string(), child));
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        (out, line.trim().to_string())
    }

    fn balancer_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("balance.log")).unwrap_or_default()
    }

    fn try_status(&self) -> Option<Value> {
        let out = run(Command::new(BRAID).args(["--control", &self.ctl(), "status", "--json"]));
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    fn status(&self) -> Value {
        self.try_status()
            .unwrap_or_else(|| panic!("no status; log: {}", self.balancer_log()))
    }

    fn backend(&self, args: &[&str]) -> String {
        let out = run(Command::new(BRAID)
            .args(["--control", &self.ctl(), "backend"])
            .args(args));
        assert!(
            out.status.success(),
            "braid backend {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    fn client(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns("c"), "python3", "-u"])
            .arg(self.dir.join("client.py"))
            .args(args);
        c
    }

    /// `n` requests on new connections from the given source addresses; backend name per request.
    fn seq(&self, n: usize, srcs: &[&str]) -> Vec<(String, String)> {
        let out = run(&mut self.client(&[
            "seq",
            "198.18.10.2",
            "8080",
            &n.to_string(),
            &srcs.join(","),
        ]));
        assert!(
            out.status.success(),
            "client: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Vec<(Option<String>, String)> = serde_json::from_slice(&out.stdout).unwrap();
        v.into_iter()
            .map(|(s, b)| (s.unwrap_or_default(), b))
            .collect()
    }

    /// Starts the `load` client; returns it and the keep-alive connection's backend.
    fn start_load(&mut self, seconds: f64) -> (Child, BufReader<ChildStdout>, String) {
        let mut child = self
            .client(&["load", "198.18.10.2", "8080", &seconds.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let ka = line
            .trim()
            .strip_prefix("KA ")
            .unwrap_or_else(|| panic!("client said {line:?}"))
            .to_string();
        (child, out, ka)
    }
}

fn finish_load(mut child: Child, mut out: BufReader<ChildStdout>) -> Value {
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let _ = child.wait();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad load output {line:?}: {e}"))
}

impl Drop for Lab {
    fn drop(&mut self) {
        for (_, c) in self.children.iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for n in &self.netns {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn counts(picks: &[(String, String)]) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for (_, b) in picks {
        *m.entry(b.clone()).or_insert(0) += 1;
    }
    m
}

fn c(m: &HashMap<String, usize>, k: &str) -> usize {
    m.get(k).copied().unwrap_or(0)
}

#[test]
fn proxy_distribution_per_algorithm() {
    let mut lab = Lab::new("dist");
    let weights = [(0, 1), (1, 1), (2, 2)];
    let health =
        "health = { interval_ms = 200, timeout_ms = 1000, fall = 3, rise = 2, http_path = \"/\" }";

    lab.start_balancer(&format!("algorithm = \"round-robin\"\n{health}"), &weights);
    let m = counts(&lab.seq(60, &[""]));
    assert_eq!(
        (c(&m, "s1"), c(&m, "s2"), c(&m, "s3")),
        (20, 20, 20),
        "round-robin: {m:?}"
    );
    // The metrics endpoint reports the same figures.
    let metrics = run(Command::new("ip").args([
        "netns",
        "exec",
        &lab.ns("b"),
        "curl",
        "-s",
        "http://127.0.0.1:9151/metrics",
    ]));
    let text = String::from_utf8_lossy(&metrics.stdout);
    assert!(
        text.contains("braid_balance_backend_connections_total{backend=\"198.18.20.11:8080\"} 20"),
        "{text}"
    );
    assert!(
        text.contains("braid_balance_connections_total 60"),
        "{text}"
    );
    lab.stop_balancer();

    lab.start_balancer(&format!("algorithm = \"weighted\"\n{health}"), &weights);
    let m = counts(&lab.seq(60, &[""]));
    assert_eq!(
        (c(&m, "s1"), c(&m, "s2"), c(&m, "s3")),
        (15, 15, 30),
        "weighted: {m:?}"
    );
    lab.stop_balancer();

    // Sequential requests leave no connection open: least-connections takes turns.
    lab.start_balancer(
        &format!("algorithm = \"least-connections\"\n{health}"),
        &weights,
    );
    let m = counts(&lab.seq(60, &[""]));
    for s in NAMES {
        assert!((15..=25).contains(&c(&m, s)), "least-connections: {m:?}");
    }
    lab.stop_balancer();

    // Maglev over the 5-tuple: flows spread by weight.
    lab.start_balancer(&format!("algorithm = \"maglev\"\n{health}"), &weights);
    let m = counts(&lab.seq(160, &[""]));
    assert!(
        c(&m, "s1") >= 20 && c(&m, "s2") >= 20 && c(&m, "s3") > c(&m, "s1").max(c(&m, "s2")),
        "maglev: {m:?}"
    );
    assert_eq!(
        c(&m, "s1") + c(&m, "s2") + c(&m, "s3"),
        160,
        "maglev: {m:?}"
    );
    lab.stop_balancer();

    // Source hash: every client address sticks to one backend; 20 addresses use all three.
    lab.start_balancer(&format!("algorithm = \"source-hash\"\n{health}"), &weights);
    let srcs: Vec<String> = (21..=40).map(|i| format!("198.18.10.{i}")).collect();
    let src_refs: Vec<&str> = srcs.iter().map(|s| s.as_str()).collect();
    let picks = lab.seq(60, &src_refs);
    let mut by_src: HashMap<String, std::collections::HashSet<String>> = HashMap::new();
    for (s, b) in &picks {
        assert!(!b.starts_with("FAIL"), "{picks:?}");
        by_src.entry(s.clone()).or_default().insert(b.clone());
    }
    assert!(
        by_src.values().all(|v| v.len() == 1),
        "a client moved: {by_src:?}"
    );
    let m = counts(&picks);
    assert_eq!(m.len(), 3, "source-hash used {m:?}");
    lab.stop_balancer();
}

#[test]
fn proxy_backend_killed_mid_load() {
    let mut lab = Lab::new("kill");
    let (interval, fall) = (200.0, 2.0);
    lab.start_balancer(
        "algorithm = \"round-robin\"\nhealth = { interval_ms = 200, timeout_ms = 500, fall = 2, rise = 2 }",
        &[(0, 1), (1, 1), (2, 1)],
    );
    let (load, out, ka) = lab.start_load(4.0);
    std::thread::sleep(Duration::from_millis(800));
    let victim = NAMES.iter().find(|n| **n != ka).unwrap().to_string();
    let killed_at = now_s();
    lab.kill(&victim);
    let r = finish_load(load, out);
    // The established keep-alive connection to another backend never noticed.
    let ka_res = r["ka"].as_array().unwrap();
    assert!(ka_res.len() > 30, "{r}");
    for x in ka_res {
        assert_eq!(
            x[1].as_str().unwrap(),
            ka,
            "keep-alive connection disturbed: {x}"
        );
    }
    let reqs = r["reqs"].as_array().unwrap();
    let window = killed_at + (fall * interval + interval) / 1000.0 + 0.2;
    let mut after = 0;
    for x in reqs {
        let (t, b) = (x[0].as_f64().unwrap(), x[1].as_str().unwrap());
        if t > window {
            after += 1;
            assert!(
                !b.starts_with("FAIL"),
                "request failed {:.2} s after the kill: {b}",
                t - killed_at
            );
            assert_ne!(
                b,
                victim,
                "dead backend still served at +{:.2} s",
                t - killed_at
            );
        }
    }
    assert!(
        after > 50,
        "too few requests after the health window: {after}"
    );
    // A refused connect is retried on another backend: at most the one request that was in
    // flight on the victim when it died can fail.
    let failed: Vec<&Value> = reqs
        .iter()
        .filter(|x| x[1].as_str().unwrap().starts_with("FAIL"))
        .collect();
    assert!(failed.len() <= 1, "failed requests: {failed:?}");
    let st = lab.status();
    let vb = st["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["address"] == BACKENDS[NAMES.iter().position(|n| *n == victim).unwrap()])
        .unwrap()
        .clone();
    assert_eq!(vb["state"], "down", "{st}");
    assert_eq!(vb["last_health"]["ok"], false, "{st}");

    // It comes back after `rise` good checks.
    let i = NAMES.iter().position(|n| *n == victim).unwrap();
    lab.start_backend(i);
    std::thread::sleep(Duration::from_millis(700));
    let m = counts(&lab.seq(9, &[""]));
    assert_eq!(c(&m, &victim), 3, "recovered backend not used: {m:?}");
    // The human table shows every backend.
    let out = run(Command::new(BRAID).args(["--control", &lab.ctl(), "status"]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("BACKEND") && BACKENDS.iter().all(|b| text.contains(b)),
        "{text}"
    );
}

#[test]
fn proxy_drain_remove_add_set_weight_at_run_time() {
    let mut lab = Lab::new("ops");
    lab.start_balancer(
        "algorithm = \"weighted\"\nhealth = { interval_ms = 200, timeout_ms = 1000, fall = 3, rise = 2 }",
        &[(0, 1), (1, 1), (2, 1)],
    );
    // Drain the backend of an established connection: it keeps serving that connection, and no
    // new one.
    let (load, out, ka) = lab.start_load(2.0);
    let ka_addr = BACKENDS[NAMES.iter().position(|n| *n == ka).unwrap()];
    std::thread::sleep(Duration::from_millis(300));
    let drained_at = now_s();
    assert!(lab.backend(&["drain", ka_addr]).contains("draining"));
    let r = finish_load(load, out);
    let ka_after: Vec<&Value> = r["ka"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x[0].as_f64().unwrap() > drained_at + 0.1)
        .collect();
    assert!(ka_after.len() > 10, "{r}");
    assert!(
        ka_after.iter().all(|x| x[1] == ka.as_str()),
        "drained connection broke: {r}"
    );
    let new_after: Vec<&Value> = r["reqs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x[0].as_f64().unwrap() > drained_at + 0.1)
        .collect();
    assert!(new_after.len() > 20, "{r}");
    assert!(
        new_after
            .iter()
            .all(|x| x[1] != ka.as_str() && !x[1].as_str().unwrap().starts_with("FAIL")),
        "drained backend got new connections: {r}"
    );
    let st = lab.status();
    assert!(
        st["backends"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["address"] == ka_addr && b["state"] == "draining"),
        "{st}"
    );
    lab.backend(&["undrain", ka_addr]);

    // Remove a backend while a connection to it is open: that connection finishes normally.
    let (load, out, ka) = lab.start_load(1.5);
    let ka_addr = BACKENDS[NAMES.iter().position(|n| *n == ka).unwrap()];
    std::thread::sleep(Duration::from_millis(300));
    let removed_at = now_s();
    lab.backend(&["remove", ka_addr]);
    let r = finish_load(load, out);
    assert!(
        r["ka"]
            .as_array()
            .unwrap()
            .iter()
            .all(|x| x[1] == ka.as_str()),
        "removed backend's connection broke: {r}"
    );
    assert!(
        r["reqs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| x[0].as_f64().unwrap() > removed_at + 0.1)
            .all(|x| x[1] != ka.as_str()),
        "{r}"
    );
    assert_eq!(lab.status()["backends"].as_array().unwrap().len(), 2);

    // Add it back with weight 2 and re-weight another to 3: the weighted split follows (3:1:2 of 60).
    lab.backend(&["add", ka_addr, "--weight", "2"]);
    let other = BACKENDS.iter().find(|a| **a != ka_addr).unwrap();
    lab.backend(&["set-weight", other, "3"]);
    let m = counts(&lab.seq(60, &[""]));
    let name_of = |a: &str| NAMES[BACKENDS.iter().position(|b| *b == a).unwrap()];
    let third = BACKENDS
        .iter()
        .find(|a| **a != ka_addr && *a != other)
        .unwrap();
    assert_eq!(
        (
            c(&m, name_of(other)),
            c(&m, name_of(third)),
            c(&m, name_of(ka_addr))
        ),
        (30, 10, 20),
        "{m:?}"
    );
    // Bad requests are one-line errors with a non-zero exit.
    let out = run(Command::new(BRAID).args([
        "--control",
        &lab.ctl(),
        "backend",
        "set-weight",
        other,
        "0",
    ]));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("weight"), "{err}");
}

#[test]
fn proxy_udp_affinity_and_idle_timeout() {
    let mut lab = Lab::new("udp");
    lab.start_balancer(
        "protocol = \"udp\"\nalgorithm = \"round-robin\"\nudp_idle_timeout_ms = 600\nhealth = { interval_ms = 200, timeout_ms = 1000, fall = 3, rise = 2 }",
        &[(0, 1), (1, 1), (2, 1)],
    );
    let out = run(&mut lab.client(&["udp", "198.18.10.2", "8080", "6", "5"]));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let socks: Vec<Vec<String>> = serde_json::from_slice(&out.stdout).unwrap();
    let mut used = std::collections::HashSet::new();
    for s in &socks {
        assert!(s.iter().all(|b| NAMES.contains(&b.as_str())), "{socks:?}");
        assert!(
            s.iter().all(|b| *b == s[0]),
            "a client's datagrams went to several backends: {socks:?}"
        );
        used.insert(s[0].clone());
    }
    assert_eq!(used.len(), 3, "round-robin over 6 clients used {used:?}");
    let st = lab.status();
    assert_eq!(st["totals"]["active"], 6, "{st}");
    assert_eq!(st["totals"]["bytes_in"], 6 * 5 * 5, "{st}");
    // Idle sessions are forgotten.
    std::thread::sleep(Duration::from_millis(1300));
    let st = lab.status();
    assert_eq!(st["totals"]["active"], 0, "{st}");
}

#[test]
fn config_errors_are_one_line() {
    let dir = std::env::temp_dir().join(format!("braid-e2e-bp{}cfg", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let base = "[balance]\nname = \"x\"\nlisten = \"198.18.10.2:8080\"\n[[backend]]\naddress = \"198.18.20.11:8080\"\n";
    let missing_if = format!("nosuch{}", std::process::id() % 100000);
    let cases: Vec<(String, Vec<&str>)> = vec![
        (
            base.replace("listen", "colour = \"blue\"\nlisten"),
            vec![":3:1: balance.colour: unknown key"],
        ),
        (
            base.replace("198.18.20.11:8080", "198.18.20.300:8080"),
            vec![":5:11: backend[0].address: \"198.18.20.300\" is not an IP address"],
        ),
        (
            base.replace(
                "listen = \"198.18.10.2:8080\"",
                &format!("mode = \"dsr\"\nvip = \"198.18.10.100\"\ninterface = \"{missing_if}\""),
            ),
            vec![":5:13: balance.interface: ", &missing_if, "does not exist"],
        ),
        (
            base.replace("name = \"x\"", "name = \"x\"\nalgorithm = \"fastest\""),
            vec![":3:13: balance.algorithm: ", "fastest"],
        ),
    ];
    for (i, (text, want)) in cases.iter().enumerate() {
        let p = dir.join(format!("c{i}.toml"));
        std::fs::write(&p, text).unwrap();
        let mut child = Command::new(BRAID)
            .arg("balance")
            .arg(&p)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("braid balance did not exit on a bad config");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "not one line: {err}");
        for w in want {
            assert!(err.contains(w), "{err:?} lacks {w:?}");
        }
        assert!(!err.contains("panicked"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every backend is up and none was ever blamed for a failed connect.
fn assert_backends_unharmed(st: &Value) {
    for b in st["backends"].as_array().unwrap() {
        assert_eq!(b["state"], "up", "{st}");
        assert_eq!(b["passive_failures"], 0, "{st}");
    }
}

fn all_served(picks: &[(String, String)]) -> bool {
    picks.iter().all(|(_, b)| NAMES.contains(&b.as_str()))
}

#[test]
fn proxy_fd_exhaustion_is_not_the_backends_fault() {
    // 256 descriptors and a max_connections far above what they allow: the balancer really runs
    // out (EMFILE on accept, on backend connects and in health checks). None of it may count
    // against the backends, and clients are served again as soon as the flood ends.
    let mut lab = Lab::new("fd");
    lab.start_balancer_nofile(
        "algorithm = \"round-robin\"\nmax_connections = 5000\nhealth = { interval_ms = 100, timeout_ms = 500, fall = 2, rise = 2 }",
        &[(0, 1), (1, 1), (2, 1)],
        Some(256),
    );
    let (_out, held) = lab.start_client("hold", &["hold", "198.18.10.2", "8080", "400", "30"]);
    assert!(held.starts_with("HELD"), "{held}");
    // Let the health checker run a good number of times while descriptors are short. The
    // control socket needs a descriptor too: ask until one is free for it.
    std::thread::sleep(Duration::from_millis(1500));
    let deadline = Instant::now() + Duration::from_secs(10);
    let st = loop {
        if let Some(st) = lab.try_status() {
            break st;
        }
        if Instant::now() >= deadline {
            let out = run(Command::new(BRAID).args(["--control", &lab.ctl(), "status", "--json"]));
            panic!(
                "no status during the flood: {}\nlog: {}",
                String::from_utf8_lossy(&out.stderr),
                lab.balancer_log()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_backends_unharmed(&st);
    let t = &st["totals"];
    assert!(
        t["local_errors"].as_u64().unwrap() + t["accept_errors"].as_u64().unwrap() > 0,
        "descriptors never ran out: {st}"
    );
    assert_eq!(t["connect_failures"], 0, "{st}");
    // The flood ends: new clients are served at once.
    lab.kill("hold");
    std::thread::sleep(Duration::from_millis(300));
    let picks = lab.seq(6, &[""]);
    assert!(all_served(&picks), "{picks:?}\n{}", lab.balancer_log());
    assert_backends_unharmed(&lab.status());
}

#[test]
fn proxy_connection_limit_and_idle_timeout() {
    // 256 descriptors: max_connections defaults to 90. 150 idle connections fill it; a new
    // client closes the connection idle the longest and is served; idle ones time out.
    let mut lab = Lab::new("lim");
    lab.start_balancer_nofile(
        "algorithm = \"round-robin\"\nevict_idle_after_ms = 1000\ntcp_idle_timeout_ms = 4000\nhealth = { interval_ms = 100, timeout_ms = 500, fall = 2, rise = 2 }",
        &[(0, 1), (1, 1), (2, 1)],
        Some(256),
    );
    let (_out, held) = lab.start_client("hold", &["hold", "198.18.10.2", "8080", "150", "30"]);
    assert_eq!(held, "HELD 150");
    std::thread::sleep(Duration::from_millis(1500));
    let st = lab.status();
    assert_eq!(st["proxy"]["max_connections"], 90, "{st}");
    assert!(st["proxy"]["open"].as_u64().unwrap() <= 91, "{st}");
    assert!(st["totals"]["limit_waits"].as_u64().unwrap() >= 1, "{st}");
    let t0 = Instant::now();
    let picks = lab.seq(4, &[""]);
    assert!(all_served(&picks), "{picks:?}\n{}", lab.balancer_log());
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    let st = lab.status();
    assert!(st["totals"]["evicted"].as_u64().unwrap() >= 4, "{st}");
    assert_eq!(
        st["totals"]["local_errors"],
        0,
        "{st}\n{}",
        lab.balancer_log()
    );
    assert_backends_unharmed(&st);
    // Nothing moves on the held connections the evictions left (all 150 were accepted, about 60
    // closed to make room): they are closed after 4 s idle.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let st = lab.status();
        let t = &st["totals"];
        if st["proxy"]["open"] == 0 {
            assert_eq!(t["accepted"], 154, "{st}");
            assert_eq!(
                t["idle_closed"].as_u64().unwrap() + t["evicted"].as_u64().unwrap(),
                150,
                "{st}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "idle connections never closed: {st}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn proxy_udp_source_port_sweep() {
    // 256 descriptors: at most 180 UDP sessions. One host sweeps 2000 source ports; the least
    // recently used sessions are evicted, so other clients are still served.
    let mut lab = Lab::new("sweep");
    let health = "health = { interval_ms = 200, timeout_ms = 1000, fall = 2, rise = 2 }";
    lab.start_balancer_nofile(
        &format!("protocol = \"udp\"\nalgorithm = \"round-robin\"\n{health}"),
        &[(0, 1), (1, 1), (2, 1)],
        Some(256),
    );
    let sweep = |lab: &Lab, src: &str| {
        let out = run(&mut lab.client(&["sweep", "198.18.10.2", "8080", "2000", src]));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Wait until the balancer has seen them all (or dropped what it refused).
        std::thread::sleep(Duration::from_millis(800));
    };
    let served = |lab: &Lab| {
        let out = run(&mut lab.client(&["udp", "198.18.10.2", "8080", "6", "3"]));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let socks: Vec<Vec<String>> = serde_json::from_slice(&out.stdout).unwrap();
        assert!(
            socks.iter().flatten().all(|b| NAMES.contains(&b.as_str())),
            "{socks:?}\n{}",
            lab.balancer_log()
        );
    };
    sweep(&lab, "198.18.10.21");
    served(&lab);
    let st = lab.status();
    assert_eq!(st["proxy"]["max_connections"], 180, "{st}");
    assert!(st["proxy"]["open"].as_u64().unwrap() <= 180, "{st}");
    assert!(st["totals"]["evicted"].as_u64().unwrap() >= 1800, "{st}");
    assert_eq!(st["totals"]["local_errors"], 0, "{st}");
    assert_backends_unharmed(&st);
    lab.kill("balancer");

    // With a per-source limit the sweeping host only churns its own 50 sessions.
    lab.start_balancer_nofile(
        &format!("protocol = \"udp\"\nalgorithm = \"round-robin\"\nmax_connections_per_source = 50\n{health}"),
        &[(0, 1), (1, 1), (2, 1)],
        Some(256),
    );
    sweep(&lab, "198.18.10.21");
    served(&lab);
    let st = lab.status();
    assert_eq!(st["proxy"]["open"], 50 + 6, "{st}");
    assert!(st["totals"]["rejected"].as_u64().unwrap() >= 1900, "{st}");
    assert_eq!(st["totals"]["evicted"], 0, "{st}");
    assert_backends_unharmed(&st);
}

#[test]
fn proxy_sigterm_drains_open_connections() {
    let mut lab = Lab::new("drain");
    lab.start_balancer(
        "algorithm = \"round-robin\"\ndrain_timeout_ms = 20000\nhealth = { interval_ms = 200, timeout_ms = 1000, fall = 2, rise = 2 }",
        &[(0, 1), (1, 1), (2, 1)],
    );
    // 24 MiB read at 8 MiB/s: about 3 s, far more than the socket buffers on the way hold.
    let (mut out, started) = lab.start_client("slow", &["slow", "198.18.10.2", "8080", "24", "8"]);
    assert_eq!(started, "STARTED");
    std::thread::sleep(Duration::from_millis(300));
    let pid = lab.balancer_pid();
    let t0 = Instant::now();
    must(&["kill", "-TERM", &pid.to_string()]);
    // The listener closes at once: new clients are refused while the transfer goes on.
    std::thread::sleep(Duration::from_millis(300));
    let picks = lab.seq(1, &[""]);
    assert!(picks[0].1.starts_with("FAIL"), "{picks:?}");
    assert!(
        lab.wait_balancer(Duration::ZERO).is_none(),
        "exited before the transfer ended"
    );
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let r: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
    assert_eq!(
        r["body"],
        24 << 20,
        "transfer cut: {r}\n{}",
        lab.balancer_log()
    );
    // Then it exits by itself, cleanly, well before the drain timeout.
    let st = lab
        .wait_balancer(Duration::from_secs(5))
        .unwrap_or_else(|| panic!("still running after the drain: {}", lab.balancer_log()));
    assert!(st.success(), "{st:?}: {}", lab.balancer_log());
    assert!(t0.elapsed() < Duration::from_secs(15));
    assert!(
        lab.balancer_log().contains("draining 1 open connection"),
        "{}",
        lab.balancer_log()
    );
    assert!(
        !std::path::Path::new(&lab.ctl()).exists(),
        "control socket left behind"
    );
}
