//! End-to-end tests of `braid lab`: the link emulator's accuracy (rate, RTT, loss), a short bundle
//! run with real kernel TCP through two `braid up` endpoints, a link failure mid-transfer, bad
//! input, and clean-up (also after SIGINT). Every test bounds its time; every namespace is the
//! lab's own (named after the lab's PID) and removed by it.

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use braid_lab::{Lab, LabOptions, LinkSpec};
use serde_json::Value;

const BRAID: &str = env!("CARGO_BIN_EXE_braid");

fn require_root() {
    assert!(
        braid_lab::is_root(),
        "the lab tests need root (network namespaces)"
    );
}

/// One lab at a time: the tests measure rates, delays and stalls, and two labs side by side on a
/// 2-core machine measure each other (CI once saw a 20 ms link's RTT average 44 ms and a bundle
/// at 66% of the sum while the MPTCP comparison ran beside them). Taken by every test that
/// starts a lab; a test that failed while holding it does not fail the others.
fn one_lab_at_a_time() -> MutexGuard<'static, ()> {
    static LAB: Mutex<()> = Mutex::new(());
    LAB.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs `braid ARGS` with a time limit; kills it (by PID) if it overruns.
fn braid(args: &[&str], limit: Duration) -> Output {
    braid_with(args, |_| {}, limit)
}

/// [`braid`], the command first changed by `set` (its environment). Its output is read while it
/// runs: a report longer than the pipe's 64 KiB (the lab's JSON with its timelines) would
/// otherwise block it on a full pipe until the limit.
fn braid_with(args: &[&str], set: impl FnOnce(&mut Command), limit: Duration) -> Output {
    let mut cmd = Command::new(BRAID);
    set(&mut cmd);
    let mut child = cmd
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start braid");
    // Each pipe read to its end by a thread; waited for at most a few seconds after the child
    // ended (a process it left behind may hold the pipe open).
    let drain = |r: Option<Box<dyn Read + Send>>| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            let _ = tx.send(buf);
        });
        move || rx.recv_timeout(Duration::from_secs(5)).unwrap_or_default()
    };
    let out = drain(child.stdout.take().map(|s| Box::new(s) as _));
    let err = drain(child.stderr.take().map(|s| Box::new(s) as _));
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "braid {args:?} ran over {limit:?}; stderr: {}",
                String::from_utf8_lossy(&err())
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Output {
        status,
        stdout: out(),
        stderr: err(),
    }
}

fn lab_json(args: &[&str], limit: Duration) -> Value {
    let mut all = vec!["lab", "--json", "--quiet"];
    all.extend_from_slice(args);
    let out = braid(&all, limit);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "braid {all:?} failed: {stderr}");
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("bad JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)));
    assert_no_namespaces_left(v["netns_prefix"].as_str().expect("netns_prefix"));
    v
}

fn namespaces() -> Vec<String> {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect()
}

fn assert_no_namespaces_left(prefix: &str) {
    let left: Vec<String> = namespaces()
        .into_iter()
        .filter(|n| ["a", "b", "e"].iter().any(|s| *n == format!("{prefix}{s}")))
        .collect();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// What both ends of the bundle knew, for a failure's message: through the run (every half
/// second) per end the hold (in force / wanted, and counted on as the sender, ms) and per link
/// its state, learned rate / delivery rate / send rate (Mbit/s) and queueing delay measured /
/// believed by the scheduler (ms); the sender's TCP (round trip, minimum, window, in flight,
/// rates, what held it back, BBR's estimates); then at the end per end the hold and per link its
/// state, learned rate, delivery rate, reported queueing delay and loss.
fn ends(v: &Value) -> String {
    let mut out = String::new();
    let g = |x: &Value| x.as_f64().unwrap_or(f64::NAN);
    // Through the run: both ends' view and the sender's TCP.
    for e in v["bundle"]["timeline"].as_array().into_iter().flatten() {
        out += &format!("\nt={:.1}", g(&e["t_s"]));
        for side in ["client", "server"] {
            let st = &e[side];
            out += &format!(
                " | {side} hold {:.1}/{:.1} send {:.1} queued {}:",
                g(&st["hold_ms"]),
                g(&st["wanted_ms"]),
                g(&st["send_hold_ms"]),
                st["queued"]
            );
            for l in st["links"].as_array().into_iter().flatten() {
                out += &format!(
                    " [{} {:.1}/{:.1}/{:.1} q{:.0}/{:.0}]",
                    l["state"].as_str().unwrap_or("?"),
                    g(&l["sched_mbps"]),
                    g(&l["delivered_mbps"]),
                    g(&l["sent_mbps"]),
                    g(&l["qdelay_ms"]),
                    g(&l["sched_queue_ms"])
                );
            }
        }
    }
    // What the sender really sent since the sample before (bytes_sent): against its pacing
    // rate it tells a sender that fell behind its own timer (BENCHMARKS.md §4, "The
    // back-pressure BBR test's slide") from one that braid held back (window full).
    let mut prev: Option<braid_lab::traffic::TcpSample> = None;
    for s in v["bundle"]["run"]["sender_tcp"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let sample = serde_json::from_value::<braid_lab::traffic::TcpSample>(s.clone()).ok();
        let sent = match (&sample, &prev) {
            (Some(now), Some(before)) => now.sent_bps_since(before) / 1e6,
            _ => f64::NAN,
        };
        prev = sample;
        out += &format!(
            "\ntcp t={:.1} rtt {:.0} min {:.1} cwnd {} unacked {} rwnd {}K unsent {}K \
             sent {:.1} pacing {:.1} delivery {:.1} bbr {:.1} Mbit/s {:.1} ms retrans {} \
             limited rwnd/sndbuf {:.0}/{:.0} of busy {:.0} ms below-tcp {}K{}",
            g(&s["t_s"]),
            g(&s["rtt_ms"]),
            g(&s["min_rtt_ms"]),
            s["cwnd"],
            s["unacked"],
            g(&s["snd_wnd"]) / 1024.0,
            g(&s["notsent_bytes"]) / 1024.0,
            sent,
            g(&s["pacing_rate_bps"]) / 1e6,
            g(&s["delivery_rate_bps"]) / 1e6,
            s["bbr_bw_bps"].as_f64().unwrap_or(f64::NAN) / 1e6,
            s["bbr_min_rtt_ms"].as_f64().unwrap_or(f64::NAN),
            s["total_retrans"],
            g(&s["rwnd_limited_ms"]),
            g(&s["sndbuf_limited_ms"]),
            g(&s["busy_ms"]),
            g(&s["wmem_alloc"]) / 1024.0,
            if s["app_limited"] == true {
                " app-limited"
            } else {
                ""
            },
        );
    }
    if let Some(share) = v["bundle"]["run"]["sender_behind_pacing"].as_f64() {
        out += &format!(
            "\nsender behind its own pacing rate in {:.0}% of the run (the lab's sender, not braid)",
            share * 100.0
        );
    }
    for side in ["client_status", "server_status"] {
        let st = &v["bundle"][side];
        let ms = |k: &str| st[k].as_f64().unwrap_or(f64::NAN) / 1e3;
        out += &format!(
            "\n{side}: hold {:.1}/{:.1} ms, queued {}",
            ms("equalize_us"),
            ms("equalize_wanted_us"),
            st["queued"]
        );
        for l in st["links"].as_array().into_iter().flatten() {
            let mbit = |k: &str| l[k].as_f64().unwrap_or(f64::NAN) / 1e6;
            out += &format!(
                "\n  {} {}: sched {:.1} dlv {:.1} qdelay {:.1} ms loss {}",
                l["name"],
                l["state"],
                mbit("sched_rate_bps"),
                mbit("delivery_rate_bps"),
                l["qdelay_us"].as_f64().unwrap_or(f64::NAN) / 1e3,
                l["loss"]
            );
        }
    }
    out
}

/// TCP payload per IP byte on a 1500-byte link: IPv4 + TCP with timestamps take 52 bytes.
const TCP_EFFICIENCY: f64 = 1448.0 / 1500.0;

#[test]
fn emulated_link_gives_its_rate_alone() {
    require_root();
    let _one = one_lab_at_a_time();
    let v = lab_json(
        &["--skip-bundle", "--link", "10mbit/5ms", "--duration", "4"],
        Duration::from_secs(60),
    );
    let link = &v["links"][0];
    let single = &link["single"];
    let goodput = f(&single["goodput_bps"]);
    let expected = 10e6 * TCP_EFFICIENCY;
    assert!(
        goodput >= 0.95 * expected && goodput <= 1.05 * expected,
        "TCP alone over a 10 Mbit/s link: {goodput:.0} bit/s, expected {expected:.0} +- 5%"
    );
    // The wire itself (IP bytes the emulator forwarded) runs at the configured rate.
    let wire = f(&single["link_rates_bps"][0]);
    assert!(
        (wire - 10e6).abs() <= 0.05 * 10e6,
        "link carried {wire:.0} bit/s of IP"
    );
    assert!(single["survived"].as_bool().unwrap());
}

#[test]
fn emulated_link_rtt_and_loss() {
    require_root();
    let _one = one_lab_at_a_time();
    let specs: Vec<LinkSpec> = ["10mbit/20ms", "10mbit/1ms/10%", "10mbit/10ms/0%/4ms"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    let mut opts = LabOptions::new(BRAID.into());
    opts.prefix = format!("bl{}rtt", std::process::id());
    let prefix = opts.prefix.clone();
    {
        let lab = Lab::start(&specs, &opts).expect("lab");
        // Warm the ARP caches, then measure.
        let _ = lab.ping(1, 2, Duration::from_millis(50));
        // The offloads are off on every veth of the link (the emulator sees real frames).
        for (ns, dev) in [("a", "a1"), ("e", "ea1"), ("e", "eb1"), ("b", "b1")] {
            for o in braid_linux::ethtool::Offload::ALL {
                let on = braid_linux::sysctl::in_netns(&format!("{prefix}{ns}"), || {
                    braid_linux::ethtool::get(dev, o)
                })
                .unwrap();
                assert!(!on, "{o:?} on {dev} is on");
            }
        }
        let p = lab.ping(1, 30, Duration::from_millis(20)).unwrap();
        assert_eq!(p.received, 30, "{p:?}");
        // The minimum is the emulator's accuracy; the median also carries the scheduling
        // noise of the machine (CI saw replies up to 11 ms late on a busy machine).
        assert!(
            (p.min_ms - 40.0).abs() <= 1.0 && (p.quantile_ms(0.5) - 40.0).abs() <= 4.0,
            "RTT over a 20 ms link: {p:?}"
        );
        assert!(p.min_ms >= 40.0 - 0.05, "faster than light: {p:?}");

        // 10% loss each way: a round trip is lost with probability 1 - 0.9^2 = 19%.
        let _ = lab.ping(2, 2, Duration::from_millis(50));
        let p = lab.ping(2, 1000, Duration::from_millis(2)).unwrap();
        let loss = p.loss();
        assert!(
            (0.15..=0.23).contains(&loss),
            "ping loss over a 10% link: {loss} ({p:?})"
        );

        // Jitter 4 ms each way around 10 ms: RTTs spread, but stay within 20 +- 8 ms. All but
        // the slowest tenth: this is a VM whose CPUs the host preempts now and then (steal time
        // in /proc/stat), which delays a reply by up to a ping interval whatever the emulator
        // does (CI saw 9 of 100 replies 0.5-20 ms late, on a quiet machine).
        let _ = lab.ping(3, 2, Duration::from_millis(50));
        let p = lab.ping(3, 100, Duration::from_millis(20)).unwrap();
        assert_eq!(p.received, 100);
        assert_eq!(p.rtts_ms.len(), 100, "{p:?}");
        assert!(p.min_ms >= 12.0 && p.quantile_ms(0.9) <= 29.0, "{p:?}");
        assert!(p.max_ms - p.min_ms > 4.0, "no jitter: {p:?}");
        assert!((p.quantile_ms(0.5) - 20.0).abs() < 2.5, "{p:?}");
    }
    assert_no_namespaces_left(&prefix);
}

/// The default 1/2/3 lab: the bundle beats every link and nears the sum (96-97% of the links
/// alone in most runs). Known bug, open under issue 10: now and then one run falls to 66-77%
/// (seen twice in CI, not yet reproduced by hand; the bad run's JSON goes to stderr for the
/// diagnosis). Such a run is measured once more and the second must pass: two bad runs in a
/// row still fail the test.
#[test]
fn lab_bundle_beats_every_link_and_nears_the_sum() {
    require_root();
    let _one = one_lab_at_a_time();
    let first = lab_json(&["--duration", "8"], Duration::from_secs(150));
    if let Err(why) = bundle_nears_the_sum(&first) {
        eprintln!("first run: {why}; its JSON: {first}");
        let second = lab_json(&["--duration", "8"], Duration::from_secs(150));
        if let Err(again) = bundle_nears_the_sum(&second) {
            panic!("two runs in a row: {why}; then {again}");
        }
    }
}

/// What [`lab_bundle_beats_every_link_and_nears_the_sum`] asks of one run.
fn bundle_nears_the_sum(v: &Value) -> Result<(), String> {
    let links = v["links"].as_array().unwrap();
    assert_eq!(links.len(), 3);
    let best_single = links
        .iter()
        .map(|l| f(&l["single"]["goodput_bps"]))
        .fold(0.0, f64::max);
    let run = &v["bundle"]["run"];
    let bundle = f(&run["goodput_bps"]);
    let of_alone = f(&v["bundle_of_single_sum"]);
    if !run["survived"].as_bool().unwrap() {
        return Err(format!("the TCP connection broke: {run}"));
    }
    if bundle <= best_single * 1.5 {
        return Err(format!("bundle {bundle:.0} vs best link {best_single:.0}"));
    }
    if of_alone < 0.85 {
        return Err(format!(
            "bundle gave {:.1}% of the links alone",
            of_alone * 100.0
        ));
    }
    // Every link carried a real share.
    for (i, r) in run["link_rates_bps"].as_array().unwrap().iter().enumerate() {
        let rate = f(&links[i]["rate_bps"]);
        if f(r) <= 0.7 * rate {
            return Err(format!("link{} carried {} of {rate}", i + 1, f(r)));
        }
    }
    Ok(())
}

#[test]
fn lab_link_failure_mid_transfer_keeps_the_connection() {
    require_root();
    let _one = one_lab_at_a_time();
    let v = lab_json(
        &[
            "--skip-single",
            "--link",
            "4mbit/10ms",
            "--link",
            "4mbit/10ms",
            "--fail",
            "link2@2",
            "--duration",
            "5",
        ],
        Duration::from_secs(90),
    );
    let fail = &v["bundle"]["fail"];
    assert_eq!(fail["link"], "link2");
    assert!(
        fail["survived"].as_bool().unwrap(),
        "TCP connection broke: {}",
        v["bundle"]["run"]
    );
    let gap = f(&fail["longest_gap_ms"]);
    assert!(
        gap < 1000.0,
        "traffic stalled {gap} ms: {}",
        v["bundle"]["run"]
    );
    // After the failure the remaining link still carries traffic.
    let per_s = v["bundle"]["run"]["per_second_bps"].as_array().unwrap();
    assert!(
        f(&per_s[4]) > 0.5 * 4e6,
        "last second: {}",
        v["bundle"]["run"]
    );
}

#[test]
fn lab_rejects_a_bad_link_spec() {
    for (spec, words) in [
        ("10xbit", "unit"),
        ("10mbit/20", "delay"),
        ("10mbit/5ms/150%", "loss"),
    ] {
        let out = braid(&["lab", "--link", spec], Duration::from_secs(10));
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        let first = err.lines().next().unwrap_or("");
        assert!(
            first.contains(spec) && first.contains(words),
            "{spec}: {err}"
        );
    }
    let out = braid(
        &["lab", "--link", "1mbit", "--fail", "link3@1"],
        Duration::from_secs(10),
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("only 1 links"));
}

#[test]
fn lab_cleans_up_after_sigint() {
    require_root();
    let _one = one_lab_at_a_time();
    let mut child = Command::new(BRAID)
        .args(["lab", "--quiet", "--link", "2mbit/5ms", "--duration", "30"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let prefix = format!("bl{}", child.id());
    // Wait for its namespaces and emulator, then interrupt it mid-run.
    let start = Instant::now();
    while !namespaces().contains(&format!("{prefix}e")) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "lab never built its namespaces"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(2));
    let st = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(15) {
            let _ = child.kill();
            panic!("lab did not stop within 15 s of SIGINT");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("interrupted"));
    assert_no_namespaces_left(&prefix);
}

#[test]
fn lab_refuses_without_root() {
    require_root();
    let _one = one_lab_at_a_time();
    // Drop to nobody with setpriv (util-linux): the lab must refuse in one line, before any set-up.
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            BRAID,
            "lab",
            "--quiet",
        ])
        .output()
        .expect("setpriv (util-linux)");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("needs root"), "{err}");
}

const ALLOWED_CC: &str = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";

fn allowed_cc() -> String {
    std::fs::read_to_string(ALLOWED_CC)
        .unwrap()
        .trim()
        .to_string()
}

/// A stock kernel lets a namespace other than the first select only the algorithms in
/// `tcp_allowed_congestion_control`. The lab must run all the same with an algorithm taken out
/// of that list, and leave the list as it found it.
#[test]
fn lab_runs_a_congestion_control_the_kernel_does_not_allow_and_restores_the_list() {
    require_root();
    let _one = one_lab_at_a_time();
    let cc = "cubic";
    let available =
        std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control").unwrap();
    if !available.split_whitespace().any(|a| a == cc) {
        // Load it the way the lab does (autoload by socket option) so the test can go on.
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.set_tcp_congestion(cc.as_bytes())
            .expect("cubic must exist in this kernel");
    }
    // Take it out, under the lock every braid process uses for this list.
    let original;
    let without;
    {
        let _lock =
            braid_linux::sysctl::FileLock::acquire(&braid_lab::hostcheck::lock_path()).unwrap();
        original = allowed_cc();
        without = original
            .split_whitespace()
            .filter(|a| *a != cc)
            .collect::<Vec<_>>()
            .join(" ");
        std::fs::write(ALLOWED_CC, &without).unwrap();
    }
    let out = braid(
        &[
            "lab",
            "--json",
            "--quiet",
            "--link",
            "5mbit/5ms",
            "--duration",
            "3",
            "--cc",
            cc,
        ],
        Duration::from_secs(60),
    );
    let after = {
        let _lock =
            braid_linux::sysctl::FileLock::acquire(&braid_lab::hostcheck::lock_path()).unwrap();
        let after = allowed_cc();
        std::fs::write(ALLOWED_CC, &original).unwrap();
        after
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "lab --cc {cc} failed: {stderr}");
    assert_eq!(
        after, without,
        "the lab did not put the allowed list back as it was"
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["tcp_congestion_control"], cc);
    assert!(v["links"][0]["single"]["survived"].as_bool().unwrap());
    assert!(v["bundle"]["run"]["survived"].as_bool().unwrap());
    assert!(f(&v["bundle"]["run"]["goodput_bps"]) > 1e6);
    assert_no_namespaces_left(v["netns_prefix"].as_str().unwrap());
}

#[test]
fn lab_names_an_unknown_congestion_control_and_the_fix_in_one_line() {
    require_root();
    let _one = one_lab_at_a_time();
    let out = braid(
        &["lab", "--quiet", "--cc", "braidnosuchcc"],
        Duration::from_secs(30),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("\"braidnosuchcc\""), "{err}");
    assert!(err.contains("modprobe tcp_braidnosuchcc"), "{err}");
    assert!(!err.contains("needs root"), "{err}");
}

#[test]
fn lab_names_a_missing_tool_before_it_starts() {
    require_root();
    let _one = one_lab_at_a_time();
    // A PATH without `ip`.
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(BRAID)
        .args(["lab", "--quiet", "--duration", "2"])
        .env("PATH", dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let prefix = format!("bl{}", child.id());
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("`ip`") && err.contains("apt-get install iproute2"),
        "{err}"
    );
    assert_no_namespaces_left(&prefix);
}

/// The README's first command on a machine as it comes: `ip` is all the lab runs (no `ping`,
/// no `ethtool`, no traffic tool), and the links' idle round trips are still measured.
#[test]
fn lab_runs_with_nothing_but_ip_on_the_path() {
    require_root();
    let _one = one_lab_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let real = braid_lab::hostcheck::find_in_path("ip").expect("ip");
    std::os::unix::fs::symlink(real, dir.path().join("ip")).unwrap();
    let out = braid_with(
        &[
            "lab",
            "--quiet",
            "--json",
            "--skip-single",
            "--duration",
            "2",
            "--link",
            "4mbit/10ms",
            "--link",
            "4mbit/20ms",
        ],
        |c| {
            c.env("PATH", dir.path());
        },
        Duration::from_secs(90),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_no_namespaces_left(v["netns_prefix"].as_str().unwrap());
    for (i, want) in [(0, 20.0), (1, 40.0)] {
        let rtt = v["links"][i]["ping_rtt_ms"].as_f64().unwrap_or(0.0);
        assert!((want..want + 5.0).contains(&rtt), "link {i}: {rtt} ms\n{v}");
    }
    assert!(
        v["bundle"]["run"]["goodput_bps"].as_f64().unwrap() > 4e6,
        "{v}"
    );
}

/// `--compare mptcp --reverse`: kernel MPTCP and the bundle over the same links, both as a
/// download (host B sends), side by side in the JSON.
#[test]
fn lab_compares_with_mptcp_in_both_directions() {
    require_root();
    let _one = one_lab_at_a_time();
    let v = lab_json(
        &[
            "--skip-single",
            "--link",
            "4mbit/5ms",
            "--link",
            "4mbit/20ms",
            "--duration",
            "4",
            "--compare",
            "mptcp",
            "--reverse",
        ],
        Duration::from_secs(120),
    );
    assert_eq!(v["direction"], "download");
    let m = &v["compare"];
    assert_eq!(m["name"], "mptcp");
    assert!(m["subflows_joined"].as_u64().unwrap() >= 1, "{m}");
    assert!(m["run"]["survived"].as_bool().unwrap(), "{m}");
    // MPTCP used both links, in the download direction (the emulator's B->A counters).
    for r in m["run"]["link_rates_bps"].as_array().unwrap() {
        assert!(f(r) > 1e6, "an MPTCP subflow idle: {m}");
    }
    let b = &v["bundle"]["run"];
    assert!(b["survived"].as_bool().unwrap());
    for r in b["link_rates_bps"].as_array().unwrap() {
        assert!(f(r) > 1e6, "a bundle link idle in the download: {b}");
    }
    // Both delivered most of what their links carried (the link rates count the tunnel's or the
    // subflows' own bytes too). How the two compare is the benchmark's business
    // (scripts/bench-vs-mptcp.sh), not this test's: a 4 s run on a loaded machine once gave the
    // bundle 3.6 Mbit/s (a 370 ms stall; 7.3-7.4 in every run on a quiet one).
    for (name, run) in [("bundle", b), ("mptcp", &m["run"])] {
        let carried: f64 = run["link_rates_bps"]
            .as_array()
            .unwrap()
            .iter()
            .map(f)
            .sum();
        assert!(
            f(&run["goodput_bps"]) > 0.8 * carried,
            "{name} delivered less than 80% of what its links carried: {run}"
        );
    }
    let ratio = f(&v["bundle_vs_compare"]);
    assert!((ratio - f(&b["goodput_bps"]) / f(&m["run"]["goodput_bps"])).abs() < 1e-9);
}

/// Issue 10 item 3: when a link dies mid-transfer, what was in flight on it is reinjected on the
/// others (counted in the sender's status), the receiver drops the copies it already had, and
/// the connection goes on. The stall bound has margin for a loaded machine: measured 416 ms
/// (main before reinjection: 304-498 ms over runs); issue 10 asks for under 300 ms, not reached.
#[test]
fn lab_failover_reinjects_what_the_dead_link_carried() {
    require_root();
    let _one = one_lab_at_a_time();
    let v = lab_json(
        &["--skip-single", "--fail", "link3@4", "--duration", "8"],
        Duration::from_secs(60),
    );
    let fail = &v["bundle"]["fail"];
    assert!(
        fail["survived"].as_bool().unwrap(),
        "{}",
        v["bundle"]["run"]
    );
    let gap = f(&fail["longest_gap_ms"]);
    assert!(gap < 1000.0, "stalled {gap} ms: {}", v["bundle"]["run"]);
    // Upload: the client (host A's side) sends the data and reinjects.
    let repair = &v["bundle"]["client_status"]["repair"];
    assert!(
        f(&repair["reinjected"]) >= 1.0,
        "nothing reinjected: {repair}"
    );
}

/// Issue 10 item 3 on a high-delay mix: two 10 Mbit/s links at 20 and 120 ms, the 20 ms one
/// failed under a CUBIC upload. The link left is held by back-pressure as the bundle's links
/// were (`sched::Adaptive::last_link`), the dead link's copies go as it takes them
/// (`Endpoint::send_reinjections`), and the receiver waits for them
/// (`Endpoint::await_reinjection`): measured 0.17-0.34% of the segments retransmitted, no gap
/// given up. Before, the bundle's queue went onto the link left at once, its buffer dropped
/// 1100-1700 packets, and the inner TCP retransmitted 5.9-6.7%. And since a standing queue gets
/// one round trip (`bqueue::Standing`), the failure itself stalls the flow 84-122 ms in five
/// runs of six (617 in the sixth; 1.1-1.2 s before): the bound below, 900 ms, fails the old
/// queue. The failure comes at 8 s, once the queue has stood for ten round trips (at 6 s it
/// had not yet in two runs of two: 912 and 1247 ms). A second run if the first fails
/// ([`twice_if_need_be`]).
#[test]
fn lab_failover_to_a_slow_link_loses_next_to_nothing() {
    require_root();
    let _one = one_lab_at_a_time();
    let args = [
        "--skip-single",
        "--cc",
        "cubic",
        "--link",
        "10mbit/20ms",
        "--link",
        "10mbit/120ms",
        "--fail",
        "link1@8",
        "--duration",
        "14",
    ];
    twice_if_need_be(&args, |v| {
        let run = &v["bundle"]["run"];
        if !v["bundle"]["fail"]["survived"].as_bool().unwrap_or(false) {
            return Err("the connection broke".into());
        }
        let retrans = f(&run["tcp_retransmits"]);
        let segments = f(&run["tcp_segments"]);
        if retrans >= 0.02 * segments {
            return Err(format!("retransmitted {retrans} of {segments} segments"));
        }
        // Upload: the server receives. It gave no gap up in 8 runs of 14 s (60 a run before).
        let reorder = &v["bundle"]["server_status"]["reorder"];
        if f(&reorder["skipped"]) >= 10.0 {
            return Err(format!("gaps given up: {reorder}"));
        }
        let stall = f(&v["bundle"]["fail"]["stall_after_ms"]);
        if stall >= 900.0 {
            return Err(format!("the failover stalled the flow {stall} ms"));
        }
        Ok(())
    });
}

/// A slower link coming back under a BBR transfer (`--fail`, then `--restore`): the flow keeps
/// at least about the fast link's rate after the return. In the simulator a return lengthened
/// the inner round trip under BBR v1 by the whole equalisation hold and it spiralled down to its
/// 4-packet floor (`braid_core::equalize`, which now grows the hold by steps). In the lab
/// without the steps, 25 s runs (`--fail link2@2 --restore link2@5`) fell in 2 of 4 (39 -> 4
/// Mbit/s over the 8 s after the return; 66 -> 7 Mbit/s 11 s after it), while this shorter run
/// passed 4 of 4 without them. With the steps' first form it failed (11-16 Mbit/s for 6 s): the
/// slow link, not yet covered by the hold, took the fast link's overflow and stalled the reorder
/// buffer; since it carries no held packet until covered, 42-58 Mbit/s every second after the
/// return (BENCHMARKS.md §4, "A link coming back"). The bounds leave room for BBR's probe of the
/// round trip (200 ms at 4 packets) and a loaded machine; a second run if the first fails
/// ([`twice_if_need_be`]).
#[test]
fn lab_bbr_keeps_its_rate_when_a_slower_link_comes_back() {
    require_root();
    let _one = one_lab_at_a_time();
    twice_if_need_be(
        &[
            "--skip-single",
            "--cc",
            "bbr",
            "--link",
            "50mbit/10ms",
            "--link",
            "20mbit/60ms",
            "--fail",
            "link2@2",
            "--restore",
            "link2@4",
            "--duration",
            "12",
        ],
        |v| {
            let run = &v["bundle"]["run"];
            if f(&v["bundle"]["fail"]["restored_at_s"]) != 4.0 {
                return Err(format!("not restored at 4 s: {run}"));
            }
            let seconds: Vec<f64> = run["per_second_bps"]
                .as_array()
                .expect("per-second goodput")
                .iter()
                .map(f)
                .collect();
            let after = &seconds[5.min(seconds.len())..];
            if after.len() < 6 {
                return Err(format!("{} seconds after the return: {run}", after.len()));
            }
            let least = after.iter().copied().fold(f64::MAX, f64::min);
            let mean = after.iter().sum::<f64>() / after.len() as f64;
            if least <= 20e6 {
                return Err(format!("a second at {:.1} Mbit/s", least / 1e6));
            }
            if mean <= 35e6 {
                return Err(format!("{:.1} Mbit/s after the return", mean / 1e6));
            }
            Ok(())
        },
    );
}

/// The receive window clamp (`braid_core::rwnd`): on 50/20/7 Mbit/s at 10/60/150 ms (a 160 ms
/// equalised round trip) a BBR sender's window in start-up was more than its send buffer holds,
/// so Linux took it for application-limited, and it stayed in start-up for good, pacing at 2.89
/// times its estimate with its whole buffer in flight; when the 50 Mbit/s link was lost those
/// bytes were a second of queue on the links left, and every drop stalled the flow that long
/// (1.1-1.3 s). Told a window of two of the bundle's bandwidth-delay products (1.25 after a
/// link is lost), its failure stalls it 240-287 ms (BENCHMARKS.md §4, "The window the sender
/// is told"). Checked: the sender paces near its estimate at the end (without the clamp 8.6 x:
/// still in start-up), the server lowered windows, and the stall after the failure is under
/// 700 ms (without the clamp 1070-1311 ms). A second run if the first fails
/// ([`twice_if_need_be`]).
#[test]
fn lab_bbr_leaves_start_up_on_a_long_round_trip_and_fails_over_quickly() {
    require_root();
    let _one = one_lab_at_a_time();
    let args = [
        "--skip-single",
        "--cc",
        "bbr",
        "--reverse",
        "--link",
        "50mbit/10ms",
        "--link",
        "20mbit/60ms",
        "--link",
        "7mbit/150ms",
        "--fail",
        "link1@7",
        "--duration",
        "12",
    ];
    twice_if_need_be(&args, |v| {
        let b = &v["bundle"];
        if !b["fail"]["survived"].as_bool().unwrap_or(false) {
            return Err("the connection broke".into());
        }
        // Download: the server's hosts send, the server lowers the client's windows.
        let clamped = f(&b["server_status"]["window_clamped"]);
        if clamped < 100.0 {
            return Err(format!("{clamped} windows clamped"));
        }
        let last = b["run"]["sender_tcp"]
            .as_array()
            .and_then(|s| s.last())
            .ok_or("no sender samples")?;
        let (pacing, bw) = (f(&last["pacing_rate_bps"]), f(&last["bbr_bw_bps"]));
        if !(bw > 0.0 && pacing < 1.5 * bw) {
            return Err(format!(
                "BBR paces at {:.1} Mbit/s on an estimate of {:.1}: still in start-up",
                pacing / 1e6,
                bw / 1e6
            ));
        }
        let stall = f(&b["fail"]["stall_after_ms"]);
        if stall >= 700.0 {
            return Err(format!("the failover stalled the flow {stall} ms"));
        }
        Ok(())
    });
}

/// Runs the lab with `args` and judges its report with `check`; if that fails, prints why (with
/// both ends' view through the run, [`ends`]) and runs it once more, which must pass. For the
/// BBR runs at 70 Mbit/s, the lab's fastest: CI failed them three times (stops 29 and 32, one
/// of them both tests back to back: the slow link nearly unused and BBR sliding 63 -> 25 Mbit/s
/// without a loss), never reproduced here (20+ runs, with busy loops, real-time stalls of 15-80
/// ms, one core, another clock source); a fault of braid's fails both runs.
fn twice_if_need_be(args: &[&str], check: impl Fn(&Value) -> Result<(), String>) {
    let judge = || {
        let v = lab_json(args, Duration::from_secs(60));
        check(&v).map_err(|why| format!("{why}: {}{}", v["bundle"]["run"], ends(&v)))
    };
    if let Err(why) = judge() {
        eprintln!("first run: {why}");
        if let Err(again) = judge() {
            panic!("two runs in a row. First: {why}\nThen: {again}");
        }
    }
}

/// Links behind CoDel (`--codel`, as uplinks behind a router with SQM): the links' marks are
/// each link's own (LINK-CE), so the one inner CUBIC flow keeps near the sum where, with the
/// marks not read as the links' (`--no-tunnel-ecn`: every datagram Not-ECT, CoDel's drops
/// repaired as random loss), it gave 67-68% of it in 8 s runs (90-91% with LINK-CE; BENCHMARKS.md
/// §4, "Links behind CoDel"). The whole path is real: the outer ECN field set per GSO run and
/// read on arrival, the emulator's CoDel marking it, the server counting the marks, the client
/// hearing of them.
#[test]
fn lab_links_behind_codel_are_backed_off_by_their_own_marks() {
    require_root();
    let _one = one_lab_at_a_time();
    let args = [
        "--skip-single",
        "--codel",
        "--cc",
        "cubic",
        "--link",
        "10mbit/5ms",
        "--link",
        "20mbit/20ms",
        "--link",
        "50mbit/40ms",
        "--duration",
        "8",
    ];
    twice_if_need_be(&args, |v| {
        let b = &v["bundle"];
        let of_sum = f(&v["bundle_of_nominal"]);
        let marks: f64 = b["run"]["link_ce_marks"]
            .as_array()
            .unwrap()
            .iter()
            .map(f)
            .sum();
        let taken = f(&b["server_status"]["ecn"]["rx_ce_taken"]);
        let told: f64 = b["client_status"]["links"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| f(&l["tx_ce_marked"]))
            .sum();
        if marks < 1.0 || taken < 1.0 || told < 1.0 {
            return Err(format!(
                "CoDel marked {marks}, the server took {taken}, the client was told of {told}"
            ));
        }
        if of_sum < 0.82 {
            return Err(format!("{:.1}% of the links' sum", 100.0 * of_sum));
        }
        let retrans = f(&b["run"]["tcp_retransmits"]);
        let segments = f(&b["run"]["tcp_segments"]);
        if retrans >= 0.01 * segments {
            return Err(format!("retransmitted {retrans} of {segments} segments"));
        }
        Ok(())
    });
}

/// Issue 10 item 4 (loss pull-back): a link losing 10% of its packets is given no traffic (once
/// its loss shows) while a clean link is up, so the bundle is not dragged below the clean link
/// alone. Measured:
/// 80-91% of the clean link alone (raw link, no tunnel overhead; the low end on a loaded
/// machine), the lossy link carrying only its probes (10-12 kbit/s); before pull-back 83-89%,
/// with 26-64 kbit/s of data still on the lossy link. In about half the runs the inner TCP's
/// start-up queued on the lossy link, and the queue kept its loss counted as congestion for 2
/// s: 75-82% (CI failed once at 74.6%). Since the loss of the packets after a queue counts
/// (`PULLBACK_QUIET_PACKETS`): 88-99% over 16 runs; CI failed once more at 74.9%, its first
/// second at 3 Mbit/s after a 405 ms stall in the inner TCP's start-up (a loss whose copy was
/// lost or refused). Since losses are named by link seq (LINK-NACK) and copies avoid the link
/// that lost the original: 91.5-98.6% over 12 runs (the start-up still dips: 5.4-8.2 Mbit/s in
/// the first second in 9 of them). The goodput bound is loose (load). CI failed once more on
/// the lossy link's share (389 kbit/s of data); on a machine loaded by compiles 5 runs of 20
/// carried 53-212 kbit/s there: a queue on both links kept the loss counted as congestion, or
/// the link, DEGRADED from the start by its probes and so never pulled back, turned UP (at 9.5 s
/// in the 212 kbit/s run). Since, a loss the receiver names random counts under a queue too,
/// and a link DEGRADED for `PULLBACK_HOLD` is pulled back on its probes (BENCHMARKS.md §4,
/// "Loss pull-back: the receiver's word, and a long DEGRADED spell").
#[test]
fn lab_pulls_traffic_off_a_lossy_link() {
    require_root();
    let _one = one_lab_at_a_time();
    let v = lab_json(
        &[
            "--link",
            "10mbit/10ms",
            "--link",
            "10mbit/10ms/10%",
            "--duration",
            "10",
        ],
        Duration::from_secs(60),
    );
    let clean_alone = f(&v["links"][0]["single"]["goodput_bps"]);
    let run = &v["bundle"]["run"];
    let bundle = f(&run["goodput_bps"]);
    assert!(
        bundle >= 0.75 * clean_alone,
        "bundle {:.2} Mbit/s < 75% of the clean link alone ({:.2}): {run}",
        bundle / 1e6,
        clean_alone / 1e6
    );
    // Until its loss estimate (a 1 s average) reaches 5%, the lossy link takes data like the
    // other: about half a second at the start, 1-3% of what the bundle carries (95-243 kbit/s
    // of 7.7 Mbit/s). Before the pull-back hold it also came back again and again (383 kbit/s,
    // 4.5%).
    let lossy = f(&run["link_rates_bps"][1]);
    assert!(
        lossy < 0.04 * bundle,
        "the lossy link still carries {:.0} kbit/s of {:.0}: {run}",
        lossy / 1e3,
        bundle / 1e3
    );
    // The bundle's queue stays bounded (three inner round trips, docs/scheduling.md): the
    // lossy link, DEGRADED by its probes' loss and given nothing, once kept the scheduler
    // "learning" for good, its queue dropped nothing for waiting, and in the runs whose inner
    // CUBIC met no loss in its start-up the round trip grew from 22 to 530 ms in 10 s, until the
    // clean link's delivery came late enough to spill onto the lossy one (CI: 609 kbit/s on
    // it). Since: at most 83-102 ms over 10 runs on a loaded machine.
    let worst_rtt = run["sender_tcp"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| f(&s["rtt_ms"]))
        .fold(0.0, f64::max);
    assert!(
        worst_rtt < 250.0,
        "the inner round trip reached {worst_rtt:.0} ms: the bundle's queue grew: {run}"
    );
}

/// Back-pressure (`--backpressure`, docs/scheduling.md): with every link full, the traffic waits
/// in front of the bundle instead of overflowing a link's buffer. BBR over 50 Mbit/s at 10 ms and 20 Mbit/s at
/// 60 ms (a round trip of ~70 ms under equalisation, a BDP the 50 ms of queue planned on the fast
/// link leaves no room for in its 100 ms buffer): without it 7.9% of BBR's segments were
/// retransmitted in this test's 10 s (4266 tail drops on the fast link), with it 0. A second run
/// if the first fails ([`twice_if_need_be`]).
#[test]
fn lab_bbr_does_not_overflow_the_links_under_back_pressure() {
    require_root();
    let _one = one_lab_at_a_time();
    twice_if_need_be(
        &[
            "--skip-single",
            "--backpressure",
            "--cc",
            "bbr",
            "--link",
            "50mbit/10ms",
            "--link",
            "20mbit/60ms",
            "--duration",
            "10",
        ],
        |v| {
            let run = &v["bundle"]["run"];
            let segments = f(&run["tcp_segments"]);
            let retrans = f(&run["tcp_retransmits"]);
            if segments <= 10_000.0 {
                return Err("too little traffic".into());
            }
            if retrans >= 0.01 * segments {
                return Err(format!(
                    "BBR retransmitted {retrans} of {segments} segments"
                ));
            }
            // Most of the 70 Mbit/s: 63-64 Mbit/s in 10 s with or without back-pressure; the
            // bound is loose for a loaded machine and the 10 s run's start-up.
            let goodput = f(&run["goodput_bps"]);
            if goodput <= 0.6 * 70e6 {
                return Err(format!("{:.1} Mbit/s", goodput / 1e6));
            }
            // It did engage, at the sending end (the client, in an upload).
            let queued = &v["bundle"]["client_status"]["queued"];
            if queued.as_u64().unwrap_or(0) == 0 {
                return Err(format!("nothing queued: {queued}"));
            }
            Ok(())
        },
    );
}
