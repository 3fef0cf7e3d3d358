//! `braid check`: the example configurations under `examples/` are valid, and broken ones are
//! refused with an error naming the file, the line and the key. Checks run in a network
//! namespace of their own that holds the interfaces the examples name (veth pairs), as on
//! the host that would run them; the examples' `/etc/braid/key` becomes a key file in a temp
//! directory (check reads the key file, as `braid up` would).
//!
//! Also the command line around it: options a command does not use are refused, and so is an
//! invalid `--log-level`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const BRAID: &str = env!("CARGO_BIN_EXE_braid");
const EXAMPLES: [&str; 5] = [
    "tunnel-client.toml",
    "tunnel-server.toml",
    "concentrator.toml",
    "balance-proxy.toml",
    "balance-dsr.toml",
];

/// Runs `cmd`, killing it (by its PID) if it takes more than 20 s.
fn run(cmd: &mut Command) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("{cmd:?} did not finish in 20 s");
        }
    }
}

fn must(args: &[&str]) {
    let out = run(Command::new(args[0]).args(&args[1..]));
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A namespace with the examples' interfaces, and a directory with the examples and a key.
struct Host {
    ns: String,
    dir: tempfile::TempDir,
}

impl Host {
    fn new(tag: &str) -> Host {
        let ns = format!("braidchk{}{tag}", std::process::id());
        let _ = run(Command::new("ip").args(["netns", "del", &ns]));
        must(&["ip", "netns", "add", &ns]);
        let host = Host {
            ns,
            dir: tempfile::tempdir().unwrap(),
        };
        // veth pairs (the dummy module may be missing): eth0 <-> wwan0, eth1 <-> eth1p.
        for (dev, peer) in [("eth0", "wwan0"), ("eth1", "eth1p")] {
            must(&[
                "ip", "-n", &host.ns, "link", "add", dev, "type", "veth", "peer", "name", peer,
            ]);
        }
        let key = run(Command::new(BRAID).arg("keygen"));
        assert!(key.status.success());
        let key_path = host.dir.path().join("key");
        std::fs::write(&key_path, &key.stdout).unwrap();
        host.chmod_key(0o600);
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        for name in EXAMPLES {
            let text = std::fs::read_to_string(examples.join(name)).unwrap();
            assert!(
                !text.contains("198.18."),
                "examples use documentation addresses"
            );
            let text = text.replace("/etc/braid/key", key_path.to_str().unwrap());
            std::fs::write(host.dir.path().join(name), text).unwrap();
        }
        host
    }

    fn chmod_key(&self, mode: u32) {
        let p = self.dir.path().join("key");
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    fn example(&self, name: &str) -> (PathBuf, String) {
        let p = self.dir.path().join(name);
        let text = std::fs::read_to_string(&p).unwrap();
        (p, text)
    }

    /// Writes `text` as `name` in the directory.
    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// `braid check ARGS` in the namespace: (exit code, stdout, stderr).
    fn check(&self, args: &[&str]) -> (i32, String, String) {
        let out = run(Command::new("ip")
            .args(["netns", "exec", &self.ns, BRAID, "check"])
            .args(args));
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = run(Command::new("ip").args(["netns", "del", &self.ns]));
    }
}

/// The 1-based line of the first line of `text` containing `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("{needle:?} not in the file"))
        + 1
}

#[test]
fn examples_are_valid_and_nothing_is_touched() {
    let host = Host::new("a");
    let want = [
        ("tunnel-client.toml", "ok (tunnel client braid0, 2 links)"),
        (
            "tunnel-server.toml",
            "ok (tunnel server braid0, listen 0.0.0.0:5050)",
        ),
        (
            "concentrator.toml",
            "ok (tunnel server braid0, listen 0.0.0.0:5050, 2 clients)",
        ),
        (
            "balance-proxy.toml",
            "ok (balancer web, proxy mode, tcp, listen 203.0.113.10:443, 3 backends)",
        ),
        (
            "balance-dsr.toml",
            "ok (balancer vip, dsr mode, tcp, vip 203.0.113.20:80 on eth1, 2 backends)",
        ),
    ];
    for (name, ok) in want {
        let p = host.dir.path().join(name);
        let (code, out, err) = host.check(&[p.to_str().unwrap()]);
        assert_eq!(code, 0, "{name}: {err}");
        assert_eq!(out.trim_end(), format!("{}: {ok}", p.display()));
        assert_eq!(err, "", "{name}: no warning expected");
    }
    // The kind can be given; the wrong one is an error.
    let p = host.dir.path().join("balance-proxy.toml");
    let p = p.to_str().unwrap();
    assert_eq!(host.check(&["--kind", "balance", p]).0, 0);
    let (code, _, err) = host.check(&["--kind", "tunnel", p]);
    assert_eq!(code, 1);
    assert!(err.starts_with(&format!("braid: error: {p}:")), "{err}");
    // No TUN device was made, no socket left behind.
    let links = run(Command::new("ip").args(["-n", &host.ns, "-o", "link", "show"]));
    let links = String::from_utf8_lossy(&links.stdout);
    assert!(!links.contains("braid0"), "{links}");
    let socks = run(Command::new("ip").args(["netns", "exec", &host.ns, "ss", "-Huan"]));
    assert_eq!(String::from_utf8_lossy(&socks.stdout).trim(), "");
}

#[test]
fn a_key_readable_by_others_is_a_warning() {
    let host = Host::new("b");
    host.chmod_key(0o644);
    let p = host.dir.path().join("tunnel-server.toml");
    let (code, out, err) = host.check(&[p.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(": ok ("), "{out}");
    let key = host.dir.path().join("key");
    assert_eq!(
        err.trim_end(),
        format!(
            "braid: warning: `{}` holds the tunnel key and is accessible by group or others (mode 644): chmod 600 it",
            key.display()
        )
    );
}

#[test]
fn broken_configs_name_file_line_and_key() {
    let host = Host::new("c");
    let (_, client) = host.example("tunnel-client.toml");
    let (_, proxy) = host.example("balance-proxy.toml");
    let (_, dsr) = host.example("balance-dsr.toml");
    // (file text, the line of the fault, "KEY: message")
    let cases: Vec<(String, usize, String)> = vec![
        (
            client.replace("bandwidth = 20000000", "bandwith = 20000000"),
            line_of(&client, "bandwidth = 20000000"),
            "link[1].bandwith: unknown key, did you mean `bandwidth`?".into(),
        ),
        (
            client.replace("mtu = 1400", "mtu = \"big\""),
            line_of(&client, "mtu = 1400"),
            "bundle.mtu: invalid type: string \"big\", expected u32".into(),
        ),
        (
            client.replace("dev = \"wwan0\"", "dev = \"wwan1\""),
            line_of(&client, "dev = \"wwan0\""),
            "link[1].dev: link lte: interface wwan1 does not exist on this host".into(),
        ),
        (
            client.replace("scheduler = \"adaptive\"", "scheduler = \"fastest\""),
            line_of(&client, "scheduler = \"adaptive\""),
            "bundle.scheduler: unknown scheduler \"fastest\"".into(),
        ),
        (
            client.replace("[bundle]", "[bundel]"),
            line_of(&client, "[bundle]"),
            "bundel: unknown key, did you mean `bundle`?".into(),
        ),
        (
            proxy.replace("weight = 2", "weight = \"heavy\""),
            line_of(&proxy, "weight = 2"),
            "backend[2].weight: invalid type: string \"heavy\", expected i64".into(),
        ),
        (
            proxy.replace("algorithm =", "algoritm ="),
            line_of(&proxy, "algorithm ="),
            "balance.algoritm: unknown key, did you mean `algorithm`?".into(),
        ),
        (
            proxy.split("[[backend]]").next().unwrap().to_string(),
            line_of(&proxy, "[balance]"),
            "backend: missing: a balancer needs at least one [[backend]]".into(),
        ),
        (
            dsr.replace("interface = \"eth1\"", "interface = \"eth9\""),
            line_of(&dsr, "interface = \"eth1\""),
            "balance.interface: interface \"eth9\" does not exist on this host".into(),
        ),
        (
            dsr.replace("\"192.0.2.22\"", "\"192.0.2.22:80:80\""),
            line_of(&dsr, "\"192.0.2.22\""),
            "backend[1].address: \"192.0.2.22:80:80\" is not HOST:PORT".into(),
        ),
    ];
    for (i, (text, line, want)) in cases.iter().enumerate() {
        let p = host.write(&format!("broken{i}.toml"), text);
        let (code, out, err) = host.check(&[p.to_str().unwrap()]);
        assert_eq!(code, 1, "case {i} ({want}) passed: {out}");
        let prefix = format!("braid: error: {}:{line}:", p.display());
        assert!(
            err.starts_with(&prefix),
            "case {i}: want {prefix:?}, got {err:?}"
        );
        let rest = err[prefix.len()..]
            .split_once(": ")
            .map(|(_col, r)| r.trim_end());
        assert!(
            rest.is_some_and(|r| r.starts_with(want.as_str())),
            "case {i}: want {want:?} in {err:?}"
        );
        assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    }
    // A file of both kinds, or of neither, says so.
    let both = host.write("both.toml", &format!("{client}\n{proxy}"));
    let (code, _, err) = host.check(&[both.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(
        err.contains("has both tunnel tables") && err.contains("--kind"),
        "{err}"
    );
    let neither = host.write("neither.toml", "[server]\nport = 80\n");
    let (code, _, err) = host.check(&[neither.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("has neither [bundle]"), "{err}");
    let (code, _, err) = host.check(&["/nonexistent/braid.toml"]);
    assert_eq!(code, 1);
    assert!(
        err.starts_with("braid: error: /nonexistent/braid.toml: cannot read"),
        "{err}"
    );
    // Both spellings of the AES cipher.
    for cipher in ["aes-256-gcm", "aes256-gcm"] {
        let text = client.replace(
            "# cipher = \"aes-256-gcm\"",
            &format!("cipher = \"{cipher}\""),
        );
        let p = host.write("cipher.toml", &text);
        let (code, _, err) = host.check(&[p.to_str().unwrap()]);
        assert_eq!(code, 0, "{cipher}: {err}");
    }
}

#[test]
fn commands_take_only_the_options_they_use() {
    let braid = |args: &[&str]| {
        let out = run(Command::new(BRAID).args(args));
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = braid(&["--log-level", "verbose", "keygen"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("\"verbose\" is not a level"), "{err}");
    assert_eq!(
        braid(&["--log-level", "debug,braid_tunnel=trace", "keygen"]).0,
        0
    );
    for cmd in [["up", "x.toml"], ["balance", "x.toml"], ["check", "x.toml"]] {
        let (code, err) = braid(&[cmd[0], "--control", "/tmp/x.sock", cmd[1]]);
        assert_eq!(code, 2, "{cmd:?} took --control: {err}");
        let (code, err) = braid(&["--control", "/tmp/x.sock", cmd[0], cmd[1]]);
        assert_eq!(code, 2, "{cmd:?} took --control: {err}");
        assert!(
            err.contains("--control is only for status, link and backend"),
            "{err}"
        );
    }
    let (code, err) = braid(&["keygen", "--control", "/tmp/x.sock"]);
    assert_eq!(code, 2, "{err}");
    // Where it is used, both places work (the socket does not exist: a connect error).
    for args in [
        ["status", "--control", "/nonexistent/x.sock"],
        ["--control", "/nonexistent/x.sock", "status"],
    ] {
        let (code, err) = braid(&args);
        assert_eq!(code, 1);
        assert!(
            err.contains("cannot connect to control socket /nonexistent/x.sock"),
            "{err}"
        );
    }
    // `link set --help` documents each option.
    let help = run(Command::new(BRAID).args(["link", "set", "--help"]));
    let help = String::from_utf8_lossy(&help.stdout);
    for opt in ["--bandwidth <BPS>", "--priority <N>", "--control <PATH>"] {
        let line = help
            .lines()
            .find(|l| l.contains(opt))
            .unwrap_or_else(|| panic!("{help}"));
        assert!(line.len() > opt.len() + 20, "{opt} undocumented: {line:?}");
    }
}
