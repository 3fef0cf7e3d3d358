//! Control socket: one JSON request per line, one JSON reply per line, over a Unix socket
//! (default `/run/braid/<name>.sock`, mode 0600).

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
    stream.write_all(&line)?;
    let mut reply = String::new();
    BufReader::new(&stream).read_line(&mut reply)?;
    if reply.is_empty() {
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
        let handler = std::sync::Arc::new(handler);
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("braid-control".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if stop2.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    let Ok(conn) = conn else {
                        // EMFILE and friends: the client waits in the backlog; do not spin.
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        continue;
                    };
                    let handler = handler.clone();
                    let _ = std::thread::Builder::new()
                        .name("braid-control-conn".into())
                        .spawn(move || serve_conn(conn, &*handler));
                }
            })?;
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

fn serve_conn(
    conn: std::os::unix::net::UnixStream,
    handler: &dyn Fn(serde_json::Value) -> serde_json::Value,
) {
    use std::io::{BufRead, BufReader, Write};
    let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(30)));
    let _ = conn.set_write_timeout(Some(std::time::Duration::from_secs(10)));
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(std::io::Read::take(conn, 1 << 20));
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if line.trim().is_empty() {
            continue;
        }
        let reply = match serde_json::from_str::<serde_json::Value>(&line) {
            Ok(req) => handler(req),
            Err(e) => {
                serde_json::json!({ "error": format!("bad request (one JSON object per line): {e}") })
            }
        };
        let mut bytes =
            serde_json::to_vec(&reply).unwrap_or_else(|_| b"{\"error\":\"internal\"}".to_vec());
        bytes.push(b'\n');
        if out.write_all(&bytes).is_err() {
            return;
        }
    }
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
