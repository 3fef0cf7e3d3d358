//! The link emulator: braid's own forwarding engine, run as `braid lab-internal emulate` in the
//! lab's emulator namespace (this kernel has no netem).
//!
//! Link i is a pair of veths in that namespace, `ea<i>` (towards host A) and `eb<i>` (towards host B).
//! An `AF_PACKET` raw socket on each (promiscuous, own transmissions ignored) receives every Ethernet
//! frame; one thread per direction passes the frames through a [`LinkModel`] (braid-core's link
//! model, the one the simulator uses: rate, drop-tail queue, delay, jitter, loss) and sends them out of the other veth when they are due. It is an L2 wire:
//! ARP and everything else cross it unchanged.
//!
//! The sockets are braid-linux's [`PacketSocket`]s, read in batches (`recvmmsg`); a VLAN tag the
//! kernel stripped on receive is put back on send.
//!
//! Timing: the thread sleeps in `ppoll` with a nanosecond timeout until the next frame is due or a
//! frame arrives, with the thread's timer slack set to 1 ns (`PR_SET_TIMERSLACK`), so frames leave
//! within some tens of microseconds of their due time.
//!
//! With `BRAID_LAB_EMU_TRACE=<prefix>` in its environment (the lab passes its own on), each
//! direction writes one line per frame to `<prefix>.link<i>.<ab|ba>` (`FrameTrace`): what
//! the link's queue held when the frame came, which is what the endpoints' reports of queueing
//! delay estimate (`scripts/lab-link-trace.sh` sets it with `EMU_TRACE=1`).
//!
//! Control on stdin, one command per line: `fail I` (link I, from 1, drops every frame in both
//! directions: a dead uplink), `restore I`. EOF on stdin ends the emulator. On stdout: `ready`, then
//! one JSON line of cumulative counters every `stats_ms` (see [`EmuStats`]).

use std::collections::VecDeque;
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::spec::LinkSpec;
use braid_core::netem::{queue_limit_bytes, Codel, LinkModel, LinkParams, Verdict};
use braid_linux::packet::{self, FrameBatch, PacketOptions, PacketSocket};
use braid_linux::process;

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
    /// With CoDel on the queue (`--codel`): ECN-capable frames it marked Congestion
    /// Experienced, and other frames it dropped.
    #[serde(default)]
    pub ce_marks: u64,
    #[serde(default)]
    pub aqm_drops: u64,
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
    ce_marks: AtomicU64,
    aqm_drops: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> DirStats {
        DirStats {
            bytes: self.bytes.load(Ordering::Relaxed),
            frames: self.frames.load(Ordering::Relaxed),
            lost: self.lost.load(Ordering::Relaxed),
            queue_drops: self.queue_drops.load(Ordering::Relaxed),
            fail_drops: self.fail_drops.load(Ordering::Relaxed),
            ce_marks: self.ce_marks.load(Ordering::Relaxed),
            aqm_drops: self.aqm_drops.load(Ordering::Relaxed),
        }
    }
}

/// Opens the emulator's promiscuous `AF_PACKET` socket on `ifname` (own transmissions ignored).
fn packet_socket(ifname: &str) -> anyhow::Result<PacketSocket> {
    let index = packet::ifindex(ifname).context("in the emulator namespace")?;
    let opts = PacketOptions {
        vnet_hdr: false,
        promiscuous: true,
    };
    PacketSocket::open(index, opts).with_context(|| format!("raw socket on {ifname}"))
}

/// The environment variable that turns `FrameTrace` on: the files' path prefix.
pub const TRACE_ENV: &str = "BRAID_LAB_EMU_TRACE";

/// One direction's trace of the frames it took, for reading the links' true queues beside what
/// the endpoints make of them. The first line is `# t0 CLOCK_MONOTONIC <seconds>` (when the
/// emulator started, to line the trace up with other clocks); then per frame of an IP packet
/// `<µs since t0> <µs its queue held before it> <IP bytes> <µs until it is delivered, or
/// -1: dropped>`. Buffered writes, so memory stays bounded; the end of a run killed
/// mid-buffer is lost.
struct FrameTrace {
    out: std::io::BufWriter<std::fs::File>,
    t0: Instant,
    rate_bps: u64,
}

impl FrameTrace {
    /// The trace of link `n` (from 1), direction `dir` (0: A to B), if [`TRACE_ENV`] asks.
    fn open(n: usize, dir: usize, t0: Instant, t0_mono: f64, rate_bps: u64) -> Option<Self> {
        let prefix = std::env::var(TRACE_ENV).ok()?;
        let path = format!("{prefix}.link{n}.{}", if dir == 0 { "ab" } else { "ba" });
        Self::create(&path, t0, t0_mono, rate_bps)
            .map_err(|e| eprintln!("emulator: no frame trace: {path}: {e}"))
            .ok()
    }

    fn create(path: &str, t0: Instant, t0_mono: f64, rate_bps: u64) -> std::io::Result<Self> {
        let file = std::fs::File::create(path)?;
        let mut out = std::io::BufWriter::with_capacity(1 << 16, file);
        writeln!(out, "# t0 CLOCK_MONOTONIC {t0_mono:.6}")?;
        Ok(FrameTrace { out, t0, rate_bps })
    }

    fn frame(&mut self, now: Instant, backlog_bytes: u64, len: usize, verdict: Verdict) {
        let waited_us = backlog_bytes.saturating_mul(8_000_000) / self.rate_bps.max(1);
        let due_us = match verdict {
            Verdict::Deliver(at) | Verdict::Marked(at) => {
                at.saturating_duration_since(now).as_micros() as i64
            }
            _ => -1,
        };
        let _ = writeln!(
            self.out,
            "{} {waited_us} {len} {due_us}",
            now.saturating_duration_since(self.t0).as_micros()
        );
    }
}

/// CLOCK_MONOTONIC now, in seconds (what `Instant` counts on Linux, and Python's
/// `time.monotonic()`).
fn monotonic_secs() -> f64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map_or(0.0, |t| t.tv_sec() as f64 + t.tv_nsec() as f64 * 1e-9)
}

/// Frames taken from the socket per `recvmmsg`.
const RX_BATCH: usize = 16;

/// Frames due this close to now are sent rather than slept for.
const EARLY: Duration = Duration::from_micros(20);

struct Direction {
    rx: Arc<PacketSocket>,
    tx: Arc<PacketSocket>,
    link: LinkModel,
    counters: Arc<Counters>,
    failed: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    /// The record of every frame, if asked for.
    trace: Option<FrameTrace>,
}

impl Direction {
    fn run(mut self) {
        process::precise_timers();
        let mut queue: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
        let mut spare: Vec<Vec<u8>> = Vec::new();
        let mut batch = FrameBatch::new(RX_BATCH);
        while !self.stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            while let Some((at, _)) = queue.front() {
                if *at > now + EARLY {
                    break;
                }
                let (_, frame) = queue.pop_front().expect("front exists");
                self.send(&frame);
                spare.push(frame);
            }
            let timeout = match queue.front() {
                Some((at, _)) => at
                    .saturating_duration_since(Instant::now())
                    .min(Duration::from_millis(100)),
                None => Duration::from_millis(100),
            };
            // An error (the veth went away) ends nothing here: the lab tears the links down.
            let _ = self.rx.wait_readable(timeout);
            // Drain what arrived (bounded, so due frames are not held back by a burst).
            for _ in 0..256 / RX_BATCH {
                let n = self.rx.recv_batch(&mut batch).unwrap_or(0);
                let now = Instant::now();
                for i in 0..n {
                    self.take(now, &mut batch, i, &mut queue, &mut spare);
                }
                if n < RX_BATCH {
                    break;
                }
            }
        }
    }

    /// Frame `i` of `batch` enters the link model: queued until due, or dropped.
    fn take(
        &mut self,
        now: Instant,
        batch: &mut FrameBatch,
        i: usize,
        queue: &mut VecDeque<(Instant, Vec<u8>)>,
        spare: &mut Vec<Vec<u8>>,
    ) {
        // A wire passes a VLAN tag on: put back the one the kernel stripped.
        if batch.frame_mut(i).is_empty() || !batch.restore_vlan(i) {
            return;
        }
        if self.failed.load(Ordering::Relaxed) {
            self.counters.fail_drops.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let frame = batch.sendable(i);
        // Where the IP packet starts: read for its ECN field, written for a mark.
        let ip_at = ip_offset(frame);
        let ect = ip_at
            .and_then(|at| braid_core::inner::ecn(&frame[at..]))
            .is_some_and(|e| e != braid_core::inner::ECN_NOT_ECT);
        let len = frame.len().saturating_sub(ETH_HLEN);
        // What the queue held as the frame came, read only for the record.
        let backlog = self.trace.as_ref().map(|_| self.link.backlog(now));
        let verdict = self.link.on_frame_ecn(now, len, ect);
        if let (Some(t), Some(backlog), Some(_)) = (self.trace.as_mut(), backlog, ip_at) {
            t.frame(now, backlog, len, verdict);
        }
        match verdict {
            Verdict::Deliver(at) | Verdict::Marked(at) => {
                let mut buf = spare.pop().unwrap_or_default();
                buf.clear();
                buf.extend_from_slice(frame);
                if let (Verdict::Marked(_), Some(at)) = (verdict, ip_at) {
                    if braid_core::inner::mark_ce(&mut buf[at..]) {
                        self.counters.ce_marks.fetch_add(1, Ordering::Relaxed);
                    }
                }
                queue.push_back((at, buf));
            }
            Verdict::Lost => {
                self.counters.lost.fetch_add(1, Ordering::Relaxed);
            }
            Verdict::QueueFull => {
                self.counters.queue_drops.fetch_add(1, Ordering::Relaxed);
            }
            Verdict::AqmDrop => {
                self.counters.aqm_drops.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Sends a due frame out of the far veth; a full socket queue is waited for (briefly), as a
    /// wire would hold the frame rather than lose it.
    fn send(&self, frame: &[u8]) {
        let mut sent = self.tx.send(frame);
        if matches!(sent, Ok(false)) && self.tx.wait_writable(Duration::from_millis(10)).is_ok() {
            sent = self.tx.send(frame);
        }
        match sent {
            Ok(true) => {
                let bytes = frame.len().saturating_sub(ETH_HLEN) as u64;
                self.counters.bytes.fetch_add(bytes, Ordering::Relaxed);
                self.counters.frames.fetch_add(1, Ordering::Relaxed);
            }
            Ok(false) => {
                self.counters.queue_drops.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {}
        }
    }
}

/// Where the IP packet an Ethernet frame carries starts (after one VLAN tag, if any); `None` for
/// anything else (ARP...).
fn ip_offset(frame: &[u8]) -> Option<usize> {
    match u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]) {
        0x8100 => match u16::from_be_bytes([*frame.get(16)?, *frame.get(17)?]) {
            0x0800 | 0x86dd => Some(18),
            _ => None,
        },
        0x0800 | 0x86dd => Some(ETH_HLEN),
        _ => None,
    }
}

/// Runs the emulator for `links` (link i on veths `ea<i>`/`eb<i>`, i from 1) until stdin closes.
/// `codel`: the queues run CoDel ([`LinkModel::set_codel`]) on top of their drop-tail limit.
pub fn run(
    links: &[LinkSpec],
    queue_ms: u64,
    codel: bool,
    seed: u64,
    stats_ms: u64,
) -> anyhow::Result<()> {
    let (t0, t0_mono) = (Instant::now(), monotonic_secs());
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
            let mut dir = Direction {
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
                trace: FrameTrace::open(n, d, t0, t0_mono, spec.rate_bps),
            };
            dir.link
                .set_codel(codel.then(|| Codel::for_rate(spec.rate_bps)));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_frame_trace_gives_each_frames_wait_and_fate() {
        let path = std::env::temp_dir().join(format!("braid-frame-trace-{}", std::process::id()));
        let path = path.to_str().unwrap().to_string();
        let t0 = Instant::now();
        let mut t = FrameTrace::create(&path, t0, 12.5, 8_000_000).unwrap();
        let now = t0 + Duration::from_millis(3);
        // 10 000 bytes queued at 8 Mbit/s: 10 ms.
        t.frame(
            now,
            10_000,
            1400,
            Verdict::Deliver(now + Duration::from_millis(21)),
        );
        t.frame(now, 0, 60, Verdict::QueueFull);
        drop(t);
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "# t0 CLOCK_MONOTONIC 12.500000",
                "3000 10000 1400 21000",
                "3000 0 60 -1"
            ]
        );
    }
}
