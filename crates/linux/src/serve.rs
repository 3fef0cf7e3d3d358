//! Serving short request/reply connections (the metrics HTTP server, the control socket) with
//! bounded resources: a thread per connection up to a cap, a deadline on each request, and an
//! accept loop that backs off on errors.
//!
//! Why not one connection at a time: one slow client (or a slow-loris sending a byte a second)
//! would hold every scrape and every `braid status` behind it. Why not unbounded threads: a
//! client opening connections in a loop would exhaust threads and file descriptors. So: at most
//! [`Limits::max_conns`] connections are served at once; one more is answered at once with a
//! short "busy" reply and closed (refused, never queued behind the others); each request must
//! arrive whole within [`Limits::deadline`] ([`DeadlineReader`]), however the client trickles
//! it. Accept errors (EMFILE, ENFILE, ENOBUFS...) leave the connection in the kernel's backlog;
//! the loop then sleeps, doubling from 10 ms to 1 s, instead of spinning on the same error.
//!
//! A thread per connection (rather than a fixed pool) keeps a blocked client from holding a pool
//! slot that another connection waits for: with the cap and the deadline, the worst case is
//! `max_conns` threads for `deadline` each.

use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How many connections are served at once, and how long a request may take to arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; further ones are refused at once.
    pub max_conns: usize,
    /// A request (an HTTP head, a control line) must arrive whole within this.
    pub deadline: Duration,
}

/// A listener whose connections [`spawn_acceptor`] can serve.
pub trait Listener: Send + 'static {
    type Conn: Send + 'static;
    fn accept_conn(&self) -> io::Result<Self::Conn>;
}

impl Listener for std::net::TcpListener {
    type Conn = std::net::TcpStream;
    fn accept_conn(&self) -> io::Result<Self::Conn> {
        self.accept().map(|(c, _)| c)
    }
}

impl Listener for std::os::unix::net::UnixListener {
    type Conn = std::os::unix::net::UnixStream;
    fn accept_conn(&self) -> io::Result<Self::Conn> {
        self.accept().map(|(c, _)| c)
    }
}

/// A stream whose reads can time out (so that [`DeadlineReader`] can enforce a deadline).
pub trait TimedRead: Read {
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()>;
}

impl TimedRead for std::net::TcpStream {
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        std::net::TcpStream::set_read_timeout(self, t)
    }
}

impl TimedRead for std::os::unix::net::UnixStream {
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        std::os::unix::net::UnixStream::set_read_timeout(self, t)
    }
}

// Borrowed streams: a connection is read and written through `&stream`, with no `dup` (which
// would need a second descriptor, and fails exactly when descriptors have run out).
impl TimedRead for &std::net::TcpStream {
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        std::net::TcpStream::set_read_timeout(self, t)
    }
}

impl TimedRead for &std::os::unix::net::UnixStream {
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        std::os::unix::net::UnixStream::set_read_timeout(self, t)
    }
}

/// Reads that all end by one deadline: each read waits at most the time left, and once it has
/// passed every read fails with `TimedOut`. A client trickling bytes cannot stretch it.
pub struct DeadlineReader<S> {
    inner: S,
    deadline: Instant,
}

impl<S: TimedRead> DeadlineReader<S> {
    pub fn new(inner: S, deadline: Instant) -> Self {
        DeadlineReader { inner, deadline }
    }

    /// Moves the deadline (e.g. to give the next request on the connection its own).
    pub fn set_deadline(&mut self, deadline: Instant) {
        self.deadline = deadline;
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: TimedRead> Read for DeadlineReader<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "request deadline passed",
            ));
        }
        // A zero timeout would mean "block forever": `left` is not zero here.
        self.inner.set_read_timeout(Some(left))?;
        self.inner.read(buf)
    }
}

/// Counts a connection in service for as long as it lives.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The accept loop's back-off after an accept error: 10 ms, doubling up to 1 s.
#[derive(Debug, Default)]
pub struct Backoff {
    current: Option<Duration>,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(10);
    const MAX: Duration = Duration::from_secs(1);

    /// How long to sleep after another error.
    pub fn next_delay(&mut self) -> Duration {
        let d = match self.current {
            None => Self::FIRST,
            Some(d) => (d * 2).min(Self::MAX),
        };
        self.current = Some(d);
        d
    }

    /// A connection was accepted: start again from the shortest delay.
    pub fn reset(&mut self) {
        self.current = None;
    }
}

/// Starts a thread named `name` that accepts connections from `listener` until `stop` is set
/// (then one more connection, e.g. from the owner's `Drop`, wakes it): each gets its own thread
/// running `serve`, up to `limits.max_conns` at once; beyond that, `refuse` answers and closes
/// it on the accept thread (it must not block: a short write to a fresh socket does not).
pub fn spawn_acceptor<L, S, R>(
    name: &str,
    listener: L,
    max_conns: usize,
    stop: Arc<AtomicBool>,
    serve: S,
    refuse: R,
) -> io::Result<std::thread::JoinHandle<()>>
where
    L: Listener,
    S: Fn(L::Conn) + Send + Sync + 'static,
    R: Fn(L::Conn) + Send + 'static,
{
    let serve = Arc::new(serve);
    let active = Arc::new(AtomicUsize::new(0));
    let conn_name = format!("{name}-conn");
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let mut backoff = Backoff::default();
            loop {
                let conn = listener.accept_conn();
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let conn = match conn {
                    Ok(c) => {
                        backoff.reset();
                        c
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        let wait = backoff.next_delay();
                        tracing::debug!(error = %e, ?wait, "accept failed; backing off");
                        std::thread::sleep(wait);
                        continue;
                    }
                };
                if active.load(Ordering::Acquire) >= max_conns {
                    refuse(conn);
                    continue;
                }
                active.fetch_add(1, Ordering::AcqRel);
                let slot = Slot(active.clone());
                let serve = serve.clone();
                // If the thread cannot be started, the closure (slot and connection) is dropped:
                // the slot is given back and the connection closed.
                let _ = std::thread::Builder::new()
                    .name(conn_name.clone())
                    .spawn(move || {
                        let _slot = slot;
                        serve(conn);
                    });
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_second_and_resets() {
        let mut b = Backoff::default();
        let ms: Vec<u128> = (0..9).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(ms, vec![10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(10));
    }

    #[test]
    fn a_trickling_client_is_cut_at_the_deadline() {
        let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let start = Instant::now();
        let writer = std::thread::spawn(move || {
            use std::io::Write;
            // A byte every 50 ms, forever (until the reader hangs up).
            while b.write_all(b"x").is_ok() {
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let mut r = DeadlineReader::new(a, start + Duration::from_millis(400));
        let mut got = Vec::new();
        let mut buf = [0u8; 16];
        let err = loop {
            match r.read(&mut buf) {
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => break e,
            }
        };
        let took = start.elapsed();
        assert!(
            matches!(
                err.kind(),
                io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
            ),
            "{err}"
        );
        assert!(!got.is_empty(), "the bytes before the deadline were read");
        assert!(
            took >= Duration::from_millis(390) && took < Duration::from_secs(2),
            "{took:?}"
        );
        drop(r);
        writer.join().unwrap();
    }
}
