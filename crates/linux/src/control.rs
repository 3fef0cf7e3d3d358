//! Control socket: one JSON request per line, one JSON reply per line, over a Unix socket
//! (default `/run/braid/<name>.sock`, mode 0600).
//!
//! The server serves connections concurrently with bounded resources ([`crate::serve`]): at most
//! [`DEFAULT_LIMITS`]`.max_conns` at once (one more gets `{"error": "busy..."}` and is closed),
//! and each request line must arrive whole within the deadline, counted from when the server
//! starts waiting for it (an idle or trickling client is cut). [`reply_to_line`] is the
//! line-to-reply step, free of I/O.

use crate::serve::{spawn_acceptor, DeadlineReader, Limits};

/// Control connections served at once, and how long one request line may take to arrive.
pub const DEFAULT_LIMITS: Limits = Limits {
    max_conns: 32,
    deadline: std::time::Duration::from_secs(30),
};

/// The most a connection may send in all (its requests are a few hundred bytes each).
pub const MAX_CONN_BYTES: u64 = 1 << 20;

use std::path::{Path, PathBuf};

pub const RUN_DIR: &str = "/run/braid";

/// Default control socket of the bundle or balancer `name`.
pub fn default_path(name: &str) -> PathBuf {
    Path::new(RUN_DIR).join(format!("{name}.sock"))
}

/// The control socket to talk to: `explicit` if given; otherwise the only socket in
/// [`RUN_DIR`]. Errors say what was found.
pub fn resolve(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    let mut socks: Vec<PathBuf> = match std::fs::read_dir(RUN_DIR) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "sock"))
            .collect(),
        Err(_) => Vec::new(),
    };
    socks.sort();
    match socks.len() {
        0 => anyhow::bail!(
            "no braid control socket in {RUN_DIR} (is braid running? use --control PATH)"
        ),
        1 => Ok(socks.remove(0)),
        _ => anyhow::bail!(
            "several braid control sockets in {RUN_DIR}: {}; choose one with --control PATH",
            socks
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Sends one request and reads one reply. A reply `{"error": "..."}` becomes an `Err`.
pub fn request(path: &Path, req: &serde_json::Value) -> anyhow::Result<serde_json::Value> {
    use std::io::{BufRead, BufReader, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(path)
        .map_err(|e| anyhow::anyhow!("cannot connect to control socket {}: {e}", path.display()))?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    let mut line = serde_json::to_vec(req)?;
    line.push(b'\n');
    // A server at its connection cap answers "busy" and closes without reading: the write may
    // then fail (EPIPE) while the reply is already waiting to be read. Read it before reporting.
    let written = stream.write_all(&line);
    let mut reply = String::new();
    let read = BufReader::new(&stream).read_line(&mut reply);
    if reply.is_empty() {
        written?;
        read?;
        anyhow::bail!("control socket {} closed without a reply", path.display());
    }
    let v: serde_json::Value = serde_json::from_str(&reply)
        .map_err(|e| anyhow::anyhow!("bad reply from control socket {}: {e}", path.display()))?;
    if let Some(err) = v.get("error").and_then(|e| e.as_str()) {
        anyhow::bail!("{err}");
    }
    Ok(v)
}

/// The server side of a control socket: a thread that accepts connections and answers each
/// request line with `handler`'s reply line. Dropping it stops accepting and removes the socket.
pub struct ControlServer {
    path: PathBuf,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ControlServer {
    /// Listens at `path` (mode 0600; the parent directory is created; a stale socket left by a
    /// dead process is replaced, a live one is an error).
    pub fn bind<H>(path: &Path, handler: H) -> anyhow::Result<ControlServer>
    where
        H: Fn(serde_json::Value) -> serde_json::Value + Send + Sync + 'static,
    {
        Self::bind_with(path, DEFAULT_LIMITS, handler)
    }

    /// [`ControlServer::bind`] with other limits.
    pub fn bind_with<H>(path: &Path, limits: Limits, handler: H) -> anyhow::Result<ControlServer>
    where
        H: Fn(serde_json::Value) -> serde_json::Value + Send + Sync + 'static,
    {
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::net::{UnixListener, UnixStream};
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir).map_err(|e| {
                    anyhow::anyhow!(
                        "cannot create directory {} for the control socket: {e}",
                        dir.display()
                    )
                })?;
            }
        }
        if path.exists() {
            if UnixStream::connect(path).is_ok() {
                anyhow::bail!(
                    "control socket {} is in use by another running braid",
                    path.display()
                );
            }
            std::fs::remove_file(path).map_err(|e| {
                anyhow::anyhow!("cannot remove stale control socket {}: {e}", path.display())
            })?;
        }
        let listener = UnixListener::bind(path).map_err(|e| {
            anyhow::anyhow!("cannot listen on control socket {}: {e}", path.display())
        })?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|e| {
            anyhow::anyhow!("cannot set mode of control socket {}: {e}", path.display())
        })?;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = spawn_acceptor(
            "braid-control",
            listener,
            limits.max_conns,
            stop.clone(),
            move |conn| serve_conn(conn, limits.deadline, &handler),
            refuse,
        )?;
        Ok(ControlServer {
            path: path.to_path_buf(),
            stop,
            thread: Some(thread),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Too many connections: say so and close (never blocks: non-blocking, a short write).
fn refuse(mut conn: std::os::unix::net::UnixStream) {
    use std::io::Write;
    let _ = conn.set_nonblocking(true);
    let _ = conn.write_all(b"{\"error\":\"busy: too many control connections; retry\"}\n");
}

fn serve_conn(
    conn: std::os::unix::net::UnixStream,
    deadline: std::time::Duration,
    handler: &dyn Fn(serde_json::Value) -> serde_json::Value,
) {
    use std::io::{BufRead, BufReader, Write};
    use std::time::Instant;
    let _ = conn.set_write_timeout(Some(std::time::Duration::from_secs(10)));
    // Read and write through borrows of the one descriptor: a `try_clone` would need a second
    // one, and fail (dropping the request unanswered) when the process is out of them.
    let mut out = &conn;
    let mut reader = BufReader::new(std::io::Read::take(
        DeadlineReader::new(&conn, Instant::now() + deadline),
        MAX_CONN_BYTES,
    ));
    let mut line = String::new();
    loop {
        line.clear();
        // Each request line gets its own deadline, from when we start waiting for it.
        reader
            .get_mut()
            .get_mut()
            .set_deadline(Instant::now() + deadline);
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let Some(reply) = reply_to_line(&line, handler) else {
            continue;
        };
        if out.write_all(&reply).is_err() {
            return;
        }
    }
}

/// The reply line (with its newline) to one request line: `handler`'s answer to the JSON value,
/// or an error object for a line that is not JSON. `None` for a blank line (no reply).
pub fn reply_to_line(
    line: &str,
    handler: &dyn Fn(serde_json::Value) -> serde_json::Value,
) -> Option<Vec<u8>> {
    if line.trim().is_empty() {
        return None;
    }
    let reply = match serde_json::from_str::<serde_json::Value>(line) {
        Ok(req) => handler(req),
        Err(e) => {
            serde_json::json!({ "error": format!("bad request (one JSON object per line): {e}") })
        }
    };
    let mut bytes =
        serde_json::to_vec(&reply).unwrap_or_else(|_| b"{\"error\":\"internal\"}".to_vec());
    bytes.push(b'\n');
    Some(bytes)
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        // Wake the accept loop so that it sees `stop`.
        let _ = std::os::unix::net::UnixStream::connect(&self.path);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::os::unix::net::UnixStream;
    use std::time::{Duration, Instant};

    fn temp_sock(tag: &str) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("braid-ctl-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        (dir.join("c.sock"), dir)
    }

    #[test]
    fn slow_clients_do_not_block_others_and_too_many_are_refused() {
        let (path, dir) = temp_sock("cap");
        let limits = Limits {
            max_conns: 3,
            deadline: Duration::from_millis(700),
        };
        let srv = ControlServer::bind_with(&path, limits, |req| serde_json::json!({"echo": req}))
            .unwrap();
        // Two clients hold connections: one silent, one mid-line.
        let _silent = UnixStream::connect(&path).unwrap();
        let mut slow = UnixStream::connect(&path).unwrap();
        slow.write_all(b"{\"cmd\":").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        // A third is served at once.
        let start = Instant::now();
        let r = request(&path, &serde_json::json!({"cmd": "status"})).unwrap();
        assert_eq!(r["echo"]["cmd"], "status");
        assert!(
            start.elapsed() < Duration::from_millis(500),
            "{:?}",
            start.elapsed()
        );
        // With three held, a fourth is refused at once, not queued. (The served request's thread
        // ends when it sees the client hang up: give it a moment to free its slot.)
        std::thread::sleep(Duration::from_millis(150));
        let _third = UnixStream::connect(&path).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let start = Instant::now();
        let e = request(&path, &serde_json::json!({"cmd": "status"})).unwrap_err();
        assert!(e.to_string().contains("busy"), "{e}");
        assert!(start.elapsed() < Duration::from_secs(1));
        // The deadline cuts the held connections: the slow one gets no reply, only EOF; then
        // there is room again.
        slow.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut rest = Vec::new();
        let _ = slow.read_to_end(&mut rest);
        assert!(rest.is_empty(), "{rest:?}");
        // (The third one's deadline is a little later.)
        std::thread::sleep(Duration::from_millis(300));
        let deadline = Instant::now() + Duration::from_secs(3);
        while request(&path, &serde_json::json!({"cmd": "x"})).is_err() {
            assert!(Instant::now() < deadline, "never served again");
            std::thread::sleep(Duration::from_millis(20));
        }
        // A connection that keeps sending requests in time is served for as long as it likes.
        let mut c = UnixStream::connect(&path).unwrap();
        let mut r = BufReader::new(c.try_clone().unwrap());
        for i in 0..4 {
            c.write_all(format!("{{\"n\":{i}}}\n").as_bytes()).unwrap();
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            assert!(line.contains(&format!("\"n\":{i}")), "{line}");
            std::thread::sleep(Duration::from_millis(300));
        }
        drop(srv);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn reply_to_line_answers_json_and_garbage() {
        let h = |v: serde_json::Value| serde_json::json!({"got": v});
        assert_eq!(reply_to_line("  \n", &h), None);
        let r = reply_to_line("{\"cmd\":\"status\"}\n", &h).unwrap();
        assert_eq!(r, b"{\"got\":{\"cmd\":\"status\"}}\n");
        let r = String::from_utf8(reply_to_line("{nope", &h).unwrap()).unwrap();
        assert!(
            r.starts_with("{\"error\":\"bad request") && r.ends_with("}\n"),
            "{r}"
        );
    }

    #[test]
    fn serve_and_request() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("braid-ctl-test-{}", std::process::id()));
        let path = dir.join("sub/x.sock");
        // A stale socket file is replaced.
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let srv = ControlServer::bind(&path, |req| {
            if req["cmd"] == "boom" {
                serde_json::json!({"error": "no such command: boom"})
            } else {
                serde_json::json!({"echo": req})
            }
        })
        .unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let r = request(&path, &serde_json::json!({"cmd": "status"})).unwrap();
        assert_eq!(r["echo"]["cmd"], "status");
        let e = request(&path, &serde_json::json!({"cmd": "boom"})).unwrap_err();
        assert_eq!(e.to_string(), "no such command: boom");
        // A live socket is not stolen.
        assert!(ControlServer::bind(&path, |_| serde_json::json!({})).is_err());
        drop(srv);
        assert!(!path.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
