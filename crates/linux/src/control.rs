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
        0 => anyhow::bail!("no braid control socket in {RUN_DIR} (is braid running? use --control PATH)"),
        1 => Ok(socks.remove(0)),
        _ => anyhow::bail!(
            "several braid control sockets in {RUN_DIR}: {}; choose one with --control PATH",
            socks.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
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
