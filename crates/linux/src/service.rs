//! Telling the service manager where a `braid up` or `braid balance` is in its life: `READY=1`
//! once it serves (systemd `Type=notify`: units ordered after it start only then, and
//! `systemctl start` returns only then, or fails if braid exits first), `STOPPING=1` when it
//! begins to shut down.
//!
//! The protocol is one datagram to the Unix socket named by `$NOTIFY_SOCKET` (see
//! sd_notify(3)); without the variable (run by hand, in tests, under another supervisor) nothing
//! is sent. We use the `sd-notify` crate for it rather than libsystemd: it is small, pure Rust
//! (libc only), maintained, and handles the details we would otherwise get wrong (abstract
//! socket names starting with `@`, one connected datagram per notice).
//!
//! A failed notice is logged and otherwise ignored: a service manager that cannot be told is not
//! a reason to stop forwarding traffic (systemd then reports a start timeout on its own).

use sd_notify::NotifyState;

/// The process serves: TUN device up, link sockets and control socket open (`braid up`), or
/// listeners bound / data path open (`braid balance`). `status` is a one-line summary that
/// `systemctl status` shows.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// The process has been told to stop (or hit a fatal error) and is cleaning up.
pub fn stopping() {
    send(&[NotifyState::Stopping]);
}

fn send(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(
            "cannot notify the service manager (NOTIFY_SOCKET={:?}): {e}",
            std::env::var_os("NOTIFY_SOCKET").unwrap_or_default()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixDatagram;

    /// Both notices reach a socket named by NOTIFY_SOCKET, in the sd_notify(3) format.
    #[test]
    fn sends_ready_then_stopping() {
        let dir = tempfile_dir();
        let path = dir.join("notify.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        // The only test in this crate that touches NOTIFY_SOCKET.
        std::env::set_var("NOTIFY_SOCKET", &path);
        ready("serving 2 links");
        stopping();
        std::env::remove_var("NOTIFY_SOCKET");
        let mut buf = [0u8; 256];
        let n = sock.recv(&mut buf).unwrap();
        assert_eq!(
            std::str::from_utf8(&buf[..n]).unwrap(),
            "READY=1\nSTATUS=serving 2 links\n"
        );
        let n = sock.recv(&mut buf).unwrap();
        assert_eq!(std::str::from_utf8(&buf[..n]).unwrap(), "STOPPING=1\n");
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("braid-notify-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
