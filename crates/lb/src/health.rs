//! Health state machine of one backend: `fall` consecutive failed checks take an up backend down,
//! `rise` consecutive good ones bring a down backend back. Fed with results (active checks and
//! passive failures such as a refused connect); no I/O, every input carries `now`.

use std::time::{Duration, Instant};

/// Health check parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthParams {
    pub fall: u32,
    pub rise: u32,
}

impl Default for HealthParams {
    fn default() -> Self {
        HealthParams { fall: 2, rise: 2 }
    }
}

/// Health of a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    Up,
    Down,
}

/// Where a check result came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckKind {
    /// A periodic check (TCP connect or HTTP GET).
    Active,
    /// A failure seen while serving a client (connect refused or timed out).
    Passive,
}

/// The last check result, for `braid status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastCheck {
    pub at: Instant,
    pub ok: bool,
    pub kind: CheckKind,
    /// How long the check took (active checks).
    pub took: Option<Duration>,
    /// e.g. "HTTP 200", "connect: Connection refused".
    pub detail: String,
}

/// The fall/rise state machine.
#[derive(Debug, Clone)]
pub struct HealthMachine {
    params: HealthParams,
    state: Health,
    good_streak: u32,
    bad_streak: u32,
    last: Option<LastCheck>,
    changed_at: Option<Instant>,
}

impl HealthMachine {
    /// A backend starts up (it serves at once; `fall` failed checks take it down).
    pub fn new(params: HealthParams) -> Self {
        HealthMachine {
            params: HealthParams {
                fall: params.fall.max(1),
                rise: params.rise.max(1),
            },
            state: Health::Up,
            good_streak: 0,
            bad_streak: 0,
            last: None,
            changed_at: None,
        }
    }

    /// Feeds one check result; returns the new state if it changed.
    pub fn handle_result(
        &mut self,
        now: Instant,
        ok: bool,
        kind: CheckKind,
        took: Option<Duration>,
        detail: impl Into<String>,
    ) -> Option<Health> {
        self.last = Some(LastCheck {
            at: now,
            ok,
            kind,
            took,
            detail: detail.into(),
        });
        if ok {
            self.bad_streak = 0;
            self.good_streak = self.good_streak.saturating_add(1);
            if self.state == Health::Down && self.good_streak >= self.params.rise {
                self.state = Health::Up;
                self.changed_at = Some(now);
                return Some(Health::Up);
            }
        } else {
            self.good_streak = 0;
            self.bad_streak = self.bad_streak.saturating_add(1);
            if self.state == Health::Up && self.bad_streak >= self.params.fall {
                self.state = Health::Down;
                self.changed_at = Some(now);
                return Some(Health::Down);
            }
        }
        None
    }

    pub fn state(&self) -> Health {
        self.state
    }
    pub fn is_up(&self) -> bool {
        self.state == Health::Up
    }
    pub fn last(&self) -> Option<&LastCheck> {
        self.last.as_ref()
    }
    pub fn changed_at(&self) -> Option<Instant> {
        self.changed_at
    }
    pub fn params(&self) -> HealthParams {
        self.params
    }
    /// Consecutive failures so far (0 after a good result).
    pub fn bad_streak(&self) -> u32 {
        self.bad_streak
    }
}

/// The status code of an HTTP response from its first bytes (the status line,
/// `HTTP/<version> <3 digits> ...`, RFC 9112 4), or `None` if they are not one. Only what the
/// health checker reads is looked at; any bytes are safe.
pub fn http_status_code(response: &[u8]) -> Option<u16> {
    let line = response.split(|&b| b == b'\n').next()?;
    let rest = line.strip_prefix(b"HTTP/")?;
    let sp = rest.iter().position(|&b| b == b' ')?;
    let version = &rest[..sp];
    if version.is_empty() || !version.iter().all(|b| b.is_ascii_digit() || *b == b'.') {
        return None;
    }
    let code = rest[sp + 1..].get(..3)?;
    if !code.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // After the code: the end of the data, a space (then the reason), or the line's end.
    match rest.get(sp + 4) {
        None | Some(b' ') | Some(b'\r') => {}
        Some(_) => return None,
    }
    let code = code.iter().fold(0u16, |n, d| n * 10 + u16::from(d - b'0'));
    (100..=999).contains(&code).then_some(code)
}

/// Whether an HTTP health check with this status passes (2xx and 3xx do).
pub fn http_status_healthy(code: u16) -> bool {
    (200..400).contains(&code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_status_lines() {
        assert_eq!(http_status_code(b"HTTP/1.1 200 OK\r\n"), Some(200));
        assert_eq!(http_status_code(b"HTTP/1.0 302"), Some(302));
        assert_eq!(http_status_code(b"HTTP/2 503 Busy"), Some(503));
        for bad in [
            &b""[..],
            b"HTTP/1.1",
            b"HTTP/1.1 +20 OK",
            b"HTTP/1.1 2000 OK",
            b"HTTP/1.1 20",
            b"HTTP/ 200 OK",
            b"http/1.1 200 OK",
            b"SSH-2.0-OpenSSH\r\n",
            b"HTTP/1.1 099 x",
        ] {
            assert_eq!(
                http_status_code(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(http_status_healthy(204) && http_status_healthy(399));
        assert!(!http_status_healthy(404) && !http_status_healthy(199));
    }

    #[test]
    fn fall_then_rise() {
        let t0 = Instant::now();
        let mut h = HealthMachine::new(HealthParams { fall: 3, rise: 2 });
        assert!(h.is_up());
        assert_eq!(
            h.handle_result(t0, false, CheckKind::Active, None, "refused"),
            None
        );
        assert_eq!(
            h.handle_result(t0, false, CheckKind::Active, None, "refused"),
            None
        );
        // A good result resets the streak.
        assert_eq!(
            h.handle_result(t0, true, CheckKind::Active, None, "ok"),
            None
        );
        assert_eq!(
            h.handle_result(t0, false, CheckKind::Active, None, "x"),
            None
        );
        assert_eq!(
            h.handle_result(t0, false, CheckKind::Passive, None, "x"),
            None
        );
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(
            h.handle_result(t1, false, CheckKind::Active, None, "x"),
            Some(Health::Down)
        );
        assert_eq!(h.changed_at(), Some(t1));
        assert_eq!(
            h.handle_result(t1, false, CheckKind::Active, None, "x"),
            None
        );
        assert_eq!(
            h.handle_result(t1, true, CheckKind::Active, None, "ok"),
            None
        );
        assert_eq!(
            h.handle_result(
                t1,
                true,
                CheckKind::Active,
                Some(Duration::from_millis(1)),
                "HTTP 200"
            ),
            Some(Health::Up)
        );
        let last = h.last().unwrap();
        assert!(last.ok && last.detail == "HTTP 200");
    }

    #[test]
    fn zero_params_are_treated_as_one() {
        let t0 = Instant::now();
        let mut h = HealthMachine::new(HealthParams { fall: 0, rise: 0 });
        assert_eq!(
            h.handle_result(t0, false, CheckKind::Active, None, ""),
            Some(Health::Down)
        );
        assert_eq!(
            h.handle_result(t0, true, CheckKind::Active, None, ""),
            Some(Health::Up)
        );
    }
}
