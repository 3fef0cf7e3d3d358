//! The link emulator: braid's own forwarding engine, run as `braid lab-internal emulate` in the
//! lab's emulator namespace (this kernel has no netem).
//!
//! Link i is a pair of veths in that namespace, `ea<i>` (towards host A) and `eb<i>` (towards host B).
//! An `AF_PACKET` raw socket on each (promiscuous, own transmissions ignored) receives every Ethernet
//! frame; one thread per direction passes the frames through a [`LinkModel`] (braid-core's link
//! model, the one the simulator uses: rate, drop-tail queue, delay, jitter, loss) and sends them out of the other veth when they are due. It is an L2 wire:
//! ARP and everything else cross it unchanged.
//!
//! Timing: the thread sleeps in `ppoll` with a nanosecond timeout until the next frame is due or a
//! frame arrives, with the thread's timer slack set to 1 ns (`PR_SET_TIMERSLACK`), so frames leave
//! within some tens of microseconds of their due time.
//!
//! Control on stdin, one command per line: `fail I` (link I, from 1, drops every frame in both
//! directions: a dead uplink), `restore I`. EOF on stdin ends the emulator. On stdout: `ready`, then
//! one JSON line of cumulative counters every `stats_ms` (see [`EmuStats`]).

use std::collections::VecDeque;
use std::io::{BufRead, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use crate::spec::LinkSpec;
use braid_core::netem::{queue_limit_bytes, LinkModel, LinkParams, Verdict};

/// Ethernet header length: the rate counts the bytes after it (the IP packet).
const ETH_HLEN: usize = 14;

/// Cumulative counters of one direction of one link.
#[derive(Debug, Default, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct DirStats {
    /// IP bytes delivered (sent out of the far veth).
    pub bytes: u64,
    pub frames: u64,
    /// Frames dropped by random loss.
    pub lost: u64,
    /// Frames dropped because the queue was full.
    pub queue_drops: u64,
    /// Frames dropped because the link was failed.
    pub fail_drops: u64,
}

/// One stats line of the emulator.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct EmuStats {
    /// Seconds since the emulator started.
    pub t: f64,
    /// Per link: A->B and B->A.
    pub links: Vec<[DirStats; 2]>,
}

#[derive(Default)]
struct Counters {
    bytes: AtomicU64,
    frames: AtomicU64,
    lost: AtomicU64,
    queue_drops: AtomicU64,
    fail_drops: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> DirStats {
        DirStats {
            bytes: self.bytes.load(Ordering::Relaxed),
            frames: self.frames.load(Ordering::Relaxed),
            lost: self.lost.load(Ordering::Relaxed),
            queue_drops: self.queue_drops.load(Ordering::Relaxed),
            fail_drops: self.fail_drops.load(Ordering::Relaxed),
        }
    }
}

fn errno_err(what: &str) -> anyhow::Error {
    anyhow::anyhow!("{what}: {}", std::io::Error::last_os_error())
}

/// Opens a promiscuous AF_PACKET socket on `ifname` that ignores its own transmissions.
fn packet_socket(ifname: &str) -> anyhow::Result<OwnedFd> {
    let cname = std::ffi::CString::new(ifname)?;
    // SAFETY: plain libc calls on a fresh fd and properly initialized C structs.
    unsafe {
        let ifindex = libc::if_nametoindex(cname.as_ptr());
        if ifindex == 0 {
            bail!("no interface {ifname} in the emulator namespace");
        }
        // Protocol 0: receive nothing until bound to the interface below.
        let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(errno_err("socket(AF_PACKET)"));
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let mut sll: libc::sockaddr_ll = std::mem::zeroed();
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        sll.sll_ifindex = ifindex as i32;
        if libc::bind(
            fd.as_raw_fd(),
            &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        ) < 0
        {
            return Err(errno_err(&format!("bind AF_PACKET to {ifname}")));
        }
        let mut mreq: libc::packet_mreq = std::mem::zeroed();
        mreq.mr_ifindex = ifindex as i32;
        mreq.mr_type = libc::PACKET_MR_PROMISC as u16;
        if libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_ADD_MEMBERSHIP,
            &mreq as *const libc::packet_mreq as *const libc::c_void,
            std::mem::size_of::<libc::packet_mreq>() as u32,
        ) < 0
        {
            return Err(errno_err(&format!("promiscuous mode on {ifname}")));
        }
        let one: libc::c_int = 1;
        if libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_IGNORE_OUTGOING,
            &one as *const libc::c_int as *const libc::c_void,
            4,
        ) < 0
        {
            return Err(errno_err("PACKET_IGNORE_OUTGOING"));
        }
        let size: libc::c_int = 8 << 20;
        for opt in [libc::SO_RCVBUFFORCE, libc::SO_SNDBUFFORCE] {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                &size as *const libc::c_int as *const libc::c_void,
                4,
            );
        }
        Ok(fd)
    }
}

/// Sets this thread's timer slack to 1 ns so that `ppoll` wakes up on time, and gives it a
/// real-time priority (SCHED_FIFO; best effort) so that a busy machine (a build, other tests on two
/// cores) does not delay frames by milliseconds. The threads sleep in `ppoll` between frames, so
/// they cannot starve the machine.
fn precise_timers() {
    // SAFETY: prctl with integer arguments; pthread_setschedparam on this thread with a valid param.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
        let param = libc::sched_param { sched_priority: 20 };
        libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param);
    }
}

/// Waits until `fd` is readable or `timeout` passes.
fn wait_readable(fd: i32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a valid timespec, no signal mask.
    unsafe {
        libc::ppoll(&mut pfd, 1, &ts, std::ptr::null());
    }
}

/// Frames due this close to now are sent rather than slept for.
const EARLY: Duration = Duration::from_micros(20);

struct Direction {
    rx: Arc<OwnedFd>,
    tx: Arc<OwnedFd>,
    link: LinkModel,
    counters: Arc<Counters>,
    failed: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Direction {
    fn run(mut self) {
        precise_timers();
        let mut queue: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
        let mut spare: Vec<Vec<u8>> = Vec::new();
        let rx = self.rx.as_raw_fd();
        let tx = self.tx.as_raw_fd();
        while !self.stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            while let Some((at, _)) = queue.front() {
                if *at > now + EARLY {
                    break;
                }
                let (_, frame) = queue.pop_front().expect("front exists");
                // SAFETY: sending an initialized buffer on a bound packet socket.
                let n = unsafe {
                    libc::send(tx, frame.as_ptr() as *const libc::c_void, frame.len(), 0)
                };
                if n >= 0 {
                    self.counters.bytes.fetch_add(
                        frame.len().saturating_sub(ETH_HLEN) as u64,
                        Ordering::Relaxed,
                    );
                    self.counters.frames.fetch_add(1, Ordering::Relaxed);
                }
                spare.push(frame);
            }
            let timeout = match queue.front() {
                Some((at, _)) => at
                    .saturating_duration_since(Instant::now())
                    .min(Duration::from_millis(100)),
                None => Duration::from_millis(100),
            };
            wait_readable(rx, timeout);
            // Drain what arrived (bounded, so due frames are not held back by a burst).
            for _ in 0..256 {
                let mut buf = spare.pop().unwrap_or_default();
                buf.resize(65536, 0);
                // SAFETY: receiving into a buffer of the given length.
                let n = unsafe {
                    libc::recv(
                        rx,
                        buf.as_mut_ptr() as *mut libc::c_void,
                        buf.len(),
                        libc::MSG_DONTWAIT,
                    )
                };
                if n <= 0 {
                    spare.push(buf);
                    break;
                }
                let now = Instant::now();
                buf.truncate(n as usize);
                if self.failed.load(Ordering::Relaxed) {
                    self.counters.fail_drops.fetch_add(1, Ordering::Relaxed);
                    spare.push(buf);
                    continue;
                }
                match self.link.on_frame(now, buf.len().saturating_sub(ETH_HLEN)) {
                    Verdict::Deliver(at) => queue.push_back((at, buf)),
                    Verdict::Lost => {
                        self.counters.lost.fetch_add(1, Ordering::Relaxed);
                        spare.push(buf);
                    }
                    Verdict::QueueFull => {
                        self.counters.queue_drops.fetch_add(1, Ordering::Relaxed);
                        spare.push(buf);
                    }
                }
            }
        }
    }
}

/// Runs the emulator for `links` (link i on veths `ea<i>`/`eb<i>`, i from 1) until stdin closes.
pub fn run(links: &[LinkSpec], queue_ms: u64, seed: u64, stats_ms: u64) -> anyhow::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut failed = Vec::new();
    let mut counters = Vec::new();
    let mut threads = Vec::new();
    for (i, spec) in links.iter().enumerate() {
        let n = i + 1;
        let ea = Arc::new(packet_socket(&format!("ea{n}")).with_context(|| format!("link {n}"))?);
        let eb = Arc::new(packet_socket(&format!("eb{n}")).with_context(|| format!("link {n}"))?);
        let fail = Arc::new(AtomicBool::new(false));
        let limit = queue_limit_bytes(spec.rate_bps, queue_ms);
        let pair = [Arc::new(Counters::default()), Arc::new(Counters::default())];
        for (d, (rx, tx)) in [(ea.clone(), eb.clone()), (eb.clone(), ea.clone())]
            .into_iter()
            .enumerate()
        {
            let dir = Direction {
                rx,
                tx,
                link: LinkModel::new(
                    LinkParams {
                        rate_bps: spec.rate_bps,
                        delay: spec.delay,
                        jitter: spec.jitter,
                        loss: spec.loss,
                    },
                    limit,
                    seed.wrapping_mul(1_000_003)
                        .wrapping_add((2 * i + d) as u64),
                ),
                counters: pair[d].clone(),
                failed: fail.clone(),
                stop: stop.clone(),
            };
            threads.push(
                std::thread::Builder::new()
                    .name(format!("link{n}-{}", if d == 0 { "ab" } else { "ba" }))
                    .spawn(move || dir.run())?,
            );
        }
        failed.push(fail);
        counters.push(pair);
    }

    let start = Instant::now();
    let stats_counters = counters.clone();
    let stats_stop = stop.clone();
    let stats = std::thread::spawn(move || {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "ready");
        let _ = out.flush();
        let period = Duration::from_millis(stats_ms.max(10));
        let mut next = Instant::now() + period;
        while !stats_stop.load(Ordering::Relaxed) {
            std::thread::sleep(
                next.saturating_duration_since(Instant::now())
                    .min(Duration::from_millis(50)),
            );
            if Instant::now() < next {
                continue;
            }
            next += period;
            let line = EmuStats {
                t: start.elapsed().as_secs_f64(),
                links: stats_counters
                    .iter()
                    .map(|[ab, ba]| [ab.snapshot(), ba.snapshot()])
                    .collect(),
            };
            if writeln!(out, "{}", serde_json::to_string(&line).unwrap_or_default()).is_err()
                || out.flush().is_err()
            {
                break;
            }
        }
    });

    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let mut words = line.split_whitespace();
        let (cmd, arg) = (
            words.next(),
            words.next().and_then(|w| w.parse::<usize>().ok()),
        );
        match (cmd, arg) {
            (Some("fail"), Some(n)) if (1..=failed.len()).contains(&n) => {
                failed[n - 1].store(true, Ordering::Relaxed)
            }
            (Some("restore"), Some(n)) if (1..=failed.len()).contains(&n) => {
                failed[n - 1].store(false, Ordering::Relaxed)
            }
            (Some("quit"), _) => break,
            _ => eprintln!("emulator: ignoring command '{line}'"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let _ = stats.join();
    Ok(())
}
