//! braid as a system service: the systemd readiness protocol (`Type=notify`), the generated shell
//! completions and man pages, plain (colourless) logs off a terminal, and the balancer's metrics
//! against docs/balance.md.
//!
//! The notify test runs `braid balance` in proxy mode on loopback, with one backend the test
//! serves itself, and `NOTIFY_SOCKET` pointing at a Unix datagram socket the test binds: what
//! systemd does for a `Type=notify` unit. Every wait is bounded; a guard kills the balancer (by
//! its PID) if the test fails half-way.

#[path = "support/metrics_docs.rs"]
mod metrics_docs;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixDatagram;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const BRAID: &str = env!("CARGO_BIN_EXE_braid");

/// The subcommands an operator uses (the hidden `lab-internal` is not among them).
const SUBCOMMANDS: [&str; 10] = [
    "keygen",
    "up",
    "status",
    "link",
    "lab",
    "balance",
    "backend",
    "completions",
    "man",
    "help",
];

fn braid(args: &[&str]) -> String {
    let o = Command::new(BRAID).args(args).output().unwrap();
    assert!(
        o.status.success(),
        "braid {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn completions_name_every_subcommand() {
    let bash = braid(&["completions", "bash"]);
    assert!(bash.contains("complete -F _braid"), "{bash}");
    // The top-level word list offered after `braid `.
    let top = bash
        .lines()
        .find(|l| l.contains("opts=\"") && l.contains("keygen"))
        .unwrap_or_else(|| panic!("no top-level word list in\n{bash}"));
    for sub in SUBCOMMANDS {
        assert!(
            top.split(|c: char| c == '"' || c.is_whitespace())
                .any(|w| w == sub),
            "bash completion lacks {sub}: {top}"
        );
    }
    assert!(!top.contains("lab-internal"), "{top}");
    // Nested subcommands too (`braid backend drain`).
    assert!(
        bash.contains("set-weight") && bash.contains("drain"),
        "{bash}"
    );
    let zsh = braid(&["completions", "zsh"]);
    assert!(zsh.starts_with("#compdef braid"), "{zsh}");
    let fish = braid(&["completions", "fish"]);
    assert!(fish.contains("complete -c braid"), "{fish}");
    // An unknown shell is a one-line usage error, not a panic.
    let o = Command::new(BRAID)
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("invalid value 'tcsh'"));
}

#[test]
fn man_page_is_roff_listing_the_subcommands() {
    let page = braid(&["man"]);
    assert!(page.contains(".TH braid 1"), "{page}");
    assert!(page.contains(".SH SYNOPSIS"), "{page}");
    let subs = page
        .split(".SH SUBCOMMANDS")
        .nth(1)
        .unwrap_or_else(|| panic!("no SUBCOMMANDS section:\n{page}"));
    assert!(!subs.contains("lab\\-internal"), "{page}");
    for sub in SUBCOMMANDS.iter().filter(|s| **s != "help") {
        // roff escapes the dash: braid\-up(1).
        assert!(
            subs.contains(&format!("braid\\-{sub}(1)")),
            "man page lacks {sub}:\n{page}"
        );
    }
    // `--dir` writes braid.1 and one page per subcommand, as packaging installs them.
    let dir = tempfile::tempdir().unwrap();
    braid(&["man", "--dir", dir.path().to_str().unwrap()]);
    for f in [
        "braid.1",
        "braid-up.1",
        "braid-balance.1",
        "braid-backend-drain.1",
    ] {
        let text = std::fs::read_to_string(dir.path().join(f))
            .unwrap_or_else(|e| panic!("{f} not written: {e}"));
        assert!(text.contains(".TH "), "{f}: {text}");
    }
    let up = std::fs::read_to_string(dir.path().join("braid-up.1")).unwrap();
    assert!(up.contains("CONFIG"), "{up}");
    let o = Command::new(BRAID)
        .args(["man", "--dir", "/nonexistent/braid-man"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("cannot write man pages into /nonexistent/braid-man"),
        "{err}"
    );
}

/// A loopback TCP port free right now (the balancer binds it a moment later).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A backend that echoes each line it gets, prefixed with "echo ".
fn echo_backend() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            std::thread::spawn(move || {
                let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
                let mut w = c.try_clone().unwrap();
                for line in BufReader::new(c).lines() {
                    let Ok(line) = line else { break };
                    if writeln!(w, "echo {line}").is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// Kills the balancer by PID if the test ends early.
struct Guard(Option<Child>);

impl Guard {
    fn pid(&self) -> u32 {
        self.0.as_ref().unwrap().id()
    }

    fn wait(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        let child = self.0.as_mut()?;
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                self.0 = None;
                return Some(st);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn next_notice(sock: &UnixDatagram) -> Option<String> {
    let mut buf = [0u8; 4096];
    let n = sock.recv(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// `Type=notify`: READY=1 arrives once the listener takes connections (a client connecting right
/// after it is served), nothing else is said while it runs, STOPPING=1 follows SIGTERM, and the
/// process exits 0. Its log (stderr to a file, as under systemd) carries no colour codes; its
/// metrics are exactly those docs/balance.md lists for proxy mode.
#[test]
fn balance_notifies_ready_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let notify_path = dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let backend = echo_backend();
    let listen: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let config = dir.path().join("svc.toml");
    std::fs::write(
        &config,
        format!(
            "[balance]\nname = \"svc\"\nlisten = \"{listen}\"\ncontrol = \"{}\"\nmetrics = \"{metrics}\"\n\
             health = {{ interval_ms = 200, timeout_ms = 500 }}\n\n[[backend]]\naddress = \"{backend}\"\n",
            dir.path().join("svc.sock").display()
        ),
    )
    .unwrap();
    let log_path = dir.path().join("balance.log");
    let mut child = Guard(Some(
        Command::new(BRAID)
            .args(["balance"])
            .arg(&config)
            .env("NOTIFY_SOCKET", &notify_path)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .unwrap(),
    ));
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();

    let ready =
        next_notice(&notify).unwrap_or_else(|| panic!("no READY=1 within 10 s; log:\n{}", log()));
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    assert!(
        ready.contains("STATUS=balancer svc (proxy tcp 127.0.0.1:"),
        "{ready:?}"
    );
    // Ready means serving: a client connecting now goes through to the backend.
    let mut c = TcpStream::connect_timeout(&listen, Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("READY=1 sent but {listen} refuses: {e}; log:\n{}", log()));
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    writeln!(c, "hello").unwrap();
    let mut line = String::new();
    BufReader::new(&c).read_line(&mut line).unwrap();
    assert_eq!(line, "echo hello\n", "log:\n{}", log());
    drop(c);

    // The metrics endpoint is up too, and says exactly what the guide lists.
    let reply = http_get(metrics, "/metrics");
    assert!(reply.starts_with("HTTP/1.0 200"), "{reply}");
    let body = reply.split("\r\n\r\n").nth(1).unwrap_or("");
    assert!(
        body.contains("braid_balance_connections_total 1\n"),
        "{body}"
    );
    assert!(
        body.contains(&format!(
            "braid_build_info{{version=\"{}\",commit=\"{}\"}} 1\n",
            env!("CARGO_PKG_VERSION"),
            // build.rs gives the binary and this test the same value.
            option_env!("BRAID_GIT_COMMIT").unwrap_or("unknown")
        )),
        "{body}"
    );
    metrics_docs::assert_documented(body, "balance.md", "Metrics", |name| {
        !name.starts_with("braid_balance_dsr_")
    });

    // Nothing more until told to stop.
    notify
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    assert_eq!(
        next_notice(&notify),
        None,
        "unexpected notice while running"
    );
    notify
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let st = Command::new("kill")
        .args(["-TERM", &child.pid().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let stopping = next_notice(&notify)
        .unwrap_or_else(|| panic!("no STOPPING=1 within 10 s of SIGTERM; log:\n{}", log()));
    assert_eq!(stopping, "STOPPING=1\n");
    let st = child
        .wait(Duration::from_secs(10))
        .unwrap_or_else(|| panic!("balancer still running 10 s after SIGTERM; log:\n{}", log()));
    assert!(st.success(), "exit {st:?}; log:\n{}", log());

    let text = log();
    assert!(text.contains("balancer svc"), "{text}");
    assert!(
        !text.contains('\u{1b}'),
        "colour codes in a log that is not a terminal:\n{text}"
    );
}
