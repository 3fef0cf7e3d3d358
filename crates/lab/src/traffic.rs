//! Traffic: real kernel TCP between the lab's hosts. `braid lab-internal sink` (in host B) accepts
//! the flows, counts what arrives and reports JSON on stdout; `braid lab-internal source` (in host A)
//! opens the flows and writes as fast as TCP lets it.
//!
//! Goodput is measured at the sink over a window of the run's duration that starts at the first
//! byte received; the source writes a little longer than that so the window is always full. After
//! the window the sink keeps reading until every flow closes cleanly (EOF) and the source checks
//! that the sink saw every byte: that is "the TCP connection survived".

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// What the sink reports.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct SinkReport {
    /// Length of the measurement window (seconds).
    pub window_s: f64,
    /// Bytes received inside the window, all flows.
    pub window_bytes: u64,
    /// TCP goodput inside the window, bit/s.
    pub goodput_bps: f64,
    /// Goodput of each whole second of the window, bit/s.
    pub per_second_bps: Vec<f64>,
    /// The longest time inside the window with no byte received on any flow (milliseconds).
    pub longest_gap_ms: f64,
    /// When the longest gap started, seconds into the window.
    pub longest_gap_at_s: f64,
    /// Per second of the window, the longest gap that began in it (milliseconds), and when it
    /// began (seconds into the window).
    #[serde(default)]
    pub longest_gap_per_second_ms: Vec<f64>,
    #[serde(default)]
    pub longest_gap_per_second_at_s: Vec<f64>,
    /// Per flow: total bytes received and whether it ended with a clean EOF.
    pub flows: Vec<SinkFlow>,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct SinkFlow {
    pub bytes: u64,
    pub clean_eof: bool,
    pub error: Option<String>,
}

/// What the source reports.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct SourceReport {
    pub flows: Vec<SourceFlow>,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct SourceFlow {
    pub bytes_sent: u64,
    pub error: Option<String>,
    /// The sender's TCP state every [`TCP_SAMPLE_EVERY`] (empty if the kernel does not say,
    /// as for an MPTCP socket on some kernels).
    #[serde(default)]
    pub tcp: Vec<TcpSample>,
    /// How long the `connect` that succeeded took, ms.
    #[serde(default)]
    pub connect_ms: Option<f64>,
}

/// How often the source reads its connection's TCP state.
pub const TCP_SAMPLE_EVERY: Duration = Duration::from_millis(500);

/// One reading of the sender's TCP state, seconds after the connection was made.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct TcpSample {
    pub t_s: f64,
    #[serde(flatten)]
    pub info: braid_linux::tcp_info::TcpInfo,
}

impl TcpSample {
    /// What the sender sent between `earlier` and this reading, bit/s (NaN when they are not
    /// apart in time).
    pub fn sent_bps_since(&self, earlier: &TcpSample) -> f64 {
        let dt = self.t_s - earlier.t_s;
        if dt > 0.0 {
            self.info.bytes_sent.saturating_sub(earlier.info.bytes_sent) as f64 * 8.0 / dt
        } else {
            f64::NAN
        }
    }
}

/// A reading is paced, not window-limited, while fewer than this share of the sender's window
/// is in flight (and it is not application-limited) ...
pub const PACED_IN_FLIGHT: f64 = 0.8;
/// ... and behind its pacing when it sent less than this share of its pacing rate since the
/// reading before.
pub const PACING_SHORTFALL: f64 = 0.8;

/// The share of the run's readings after its first second in which the sender, paced (see
/// [`PACED_IN_FLIGHT`]), sent less than [`PACING_SHORTFALL`] of its own pacing rate (`None`:
/// fewer than two such readings). Linux paces TCP by its own timer where no `fq` qdisc does
/// it, and on a loaded machine that timer falls behind: a BBR flow then delivers less than it
/// paces for, its bandwidth estimate follows what it managed to send, and it spirals down
/// whatever the path (BENCHMARKS.md §4: 20-27% short with braid, and with no braid on one
/// emulated link). A high share tells a slide of the lab's own sender from one braid caused.
/// Only a BBR sender (one whose readings carry BBR's state) is paced at all: Linux paces by its
/// timer only for a congestion control that asks for it, and CUBIC's pacing rate is advisory
/// without `fq` (a CUBIC flow whose window ran far ahead of what it had to send read 0.41
/// "behind" in the lab): `None` for the others.
pub fn behind_pacing(samples: &[TcpSample]) -> Option<f64> {
    if !samples.iter().any(|s| s.info.bbr_bw_bps.is_some()) {
        return None;
    }
    let readings: Vec<_> = samples
        .windows(2)
        .filter(|w| w[0].t_s >= 1.0 && w[1].t_s > w[0].t_s)
        .collect();
    if readings.len() < 2 {
        return None;
    }
    let behind = readings
        .iter()
        .filter(|w| {
            let (a, b) = (&w[0].info, &w[1].info);
            let paced =
                !b.app_limited && f64::from(b.unacked) < PACED_IN_FLIGHT * f64::from(b.cwnd);
            let sent = w[1].sent_bps_since(&w[0]);
            let pacing = (a.pacing_rate_bps + b.pacing_rate_bps) / 2.0;
            paced && pacing > 0.0 && sent < PACING_SHORTFALL * pacing
        })
        .count();
    Some(behind as f64 / readings.len() as f64)
}

/// One flow's reads: (nanoseconds since the sink's start, bytes).
type Reads = Vec<(u64, u32)>;

fn read_flow(mut s: TcpStream, t0: Instant, deadline: Instant) -> (Reads, SinkFlow) {
    let mut reads = Vec::with_capacity(1 << 16);
    let mut flow = SinkFlow::default();
    let mut buf = vec![0u8; 256 * 1024];
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    loop {
        if Instant::now() > deadline {
            flow.error = Some("no EOF before the sink's deadline".into());
            break;
        }
        match s.read(&mut buf) {
            Ok(0) => {
                flow.clean_eof = true;
                break;
            }
            Ok(n) => {
                reads.push((t0.elapsed().as_nanos() as u64, n as u32));
                flow.bytes += n as u64;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                flow.error = Some(e.to_string());
                break;
            }
        }
    }
    // Tell the source we are done: it waits for this close.
    let _ = s.shutdown(Shutdown::Both);
    (reads, flow)
}

/// What the reads of a window add up to ([`summarize`]).
#[derive(Debug, Default, PartialEq)]
pub struct Summary {
    pub bytes: u64,
    pub per_second_bps: Vec<f64>,
    /// The longest time without a read (ms) and when it began (s into the window).
    pub gap_ms: f64,
    pub gap_at_s: f64,
    /// Per second of the window, the longest gap that began in it (ms), and when it began (s).
    pub gap_per_second_ms: Vec<f64>,
    pub gap_per_second_at_s: Vec<f64>,
}

/// Summarizes the reads of all flows over a window of `window` from the first byte.
pub fn summarize(mut reads: Reads, window: Duration) -> Summary {
    reads.sort_unstable_by_key(|r| r.0);
    let Some(&(first, _)) = reads.first() else {
        return Summary {
            gap_ms: window.as_secs_f64() * 1e3,
            ..Summary::default()
        };
    };
    let end = first + window.as_nanos() as u64;
    let secs = window.as_secs_f64().ceil() as usize;
    let mut per_second = vec![0u64; secs.max(1)];
    let mut gaps = vec![0u64; secs.max(1)];
    let mut gaps_at = vec![0u64; secs.max(1)];
    let second = |t: u64| (((t - first) / 1_000_000_000) as usize).min(secs.max(1) - 1);
    let mut total = 0u64;
    let mut prev = first;
    let (mut gap, mut gap_at) = (0u64, 0u64);
    let mut note_gap = |from: u64, to: u64| {
        let i = second(from);
        if to - from > gaps[i] {
            gaps[i] = to - from;
            gaps_at[i] = from - first;
        }
        if to - from > gap {
            gap = to - from;
            gap_at = from - first;
        }
    };
    for &(t, n) in reads.iter().take_while(|r| r.0 < end) {
        total += u64::from(n);
        per_second[second(t)] += u64::from(n);
        note_gap(prev, t);
        prev = t;
    }
    // A transfer that stopped before the window ended stalled until the end.
    if reads.last().is_some_and(|r| r.0 < end) {
        note_gap(prev, end);
    }
    let scaled = |v: &[u64], by: f64| v.iter().map(|x| *x as f64 * by).collect();
    Summary {
        bytes: total,
        per_second_bps: scaled(&per_second, 8.0),
        gap_ms: gap as f64 / 1e6,
        gap_at_s: gap_at as f64 / 1e9,
        gap_per_second_ms: scaled(&gaps, 1e-6),
        gap_per_second_at_s: scaled(&gaps_at, 1e-9),
    }
}

/// Runs the sink: accepts `flows` connections on `listen`, measures for `window`, reads until
/// every flow has closed (or `drain` after the window), prints a [`SinkReport`] as JSON.
pub fn run_sink(
    listen: SocketAddr,
    flows: usize,
    window: Duration,
    accept_timeout: Duration,
) -> anyhow::Result<()> {
    let listener =
        TcpListener::bind(listen).with_context(|| format!("sink: listen on {listen}"))?;
    println!("listening");
    std::io::stdout().flush()?;
    listener.set_nonblocking(true)?;
    let t0 = Instant::now();
    let accept_deadline = t0 + accept_timeout;
    // Flows must end (clean EOF) by then: the window, plus generous time to drain and close.
    let mut handles = Vec::new();
    while handles.len() < flows {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                let deadline = Instant::now() + window + Duration::from_secs(20);
                handles.push(std::thread::spawn(move || read_flow(s, t0, deadline)));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > accept_deadline {
                    anyhow::bail!(
                        "sink: only {} of {flows} flows connected within {accept_timeout:?}",
                        handles.len()
                    );
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e).context("sink: accept"),
        }
    }
    let mut all = Vec::new();
    let mut report = SinkReport {
        window_s: window.as_secs_f64(),
        ..Default::default()
    };
    for h in handles {
        let (reads, flow) = h
            .join()
            .map_err(|_| anyhow::anyhow!("sink: flow thread panicked"))?;
        all.extend(reads);
        report.flows.push(flow);
    }
    let sum = summarize(all, window);
    report.window_bytes = sum.bytes;
    report.goodput_bps = sum.bytes as f64 * 8.0 / window.as_secs_f64();
    report.per_second_bps = sum.per_second_bps;
    report.longest_gap_ms = sum.gap_ms;
    report.longest_gap_at_s = sum.gap_at_s;
    report.longest_gap_per_second_ms = sum.gap_per_second_ms;
    report.longest_gap_per_second_at_s = sum.gap_per_second_at_s;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

fn write_flow(addr: SocketAddr, duration: Duration, connect_timeout: Duration) -> SourceFlow {
    let mut flow = SourceFlow::default();
    let start = Instant::now();
    let mut s = loop {
        let attempt = Instant::now();
        match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Ok(s) => {
                flow.connect_ms = Some(attempt.elapsed().as_secs_f64() * 1e3);
                break s;
            }
            Err(e) if start.elapsed() < connect_timeout => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => {
                flow.error = Some(format!("connect {addr}: {e}"));
                return flow;
            }
        }
    };
    let _ = s.set_write_timeout(Some(Duration::from_millis(100)));
    let buf = vec![0x5au8; 64 * 1024];
    let connected = Instant::now();
    let end = connected + duration;
    let mut next_sample = connected;
    let sample_every = crate::sample_every(TCP_SAMPLE_EVERY);
    while Instant::now() < end {
        if Instant::now() >= next_sample {
            next_sample += sample_every;
            if let Some(info) = braid_linux::tcp_info::read(&s) {
                let t_s = connected.elapsed().as_secs_f64();
                flow.tcp.push(TcpSample { t_s, info });
            }
        }
        match s.write(&buf) {
            Ok(n) => flow.bytes_sent += n as u64,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                flow.error = Some(format!("write: {e}"));
                return flow;
            }
        }
    }
    if let Err(e) = s.shutdown(Shutdown::Write) {
        flow.error = Some(format!("shutdown: {e}"));
        return flow;
    }
    // Wait for the sink to close its side: then it has read everything.
    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
    let mut b = [0u8; 64];
    match s.read(&mut b) {
        Ok(0) => {}
        Ok(_) => flow.error = Some("unexpected data from the sink".into()),
        Err(e) => flow.error = Some(format!("waiting for the sink to close: {e}")),
    }
    flow
}

/// Runs the source: `flows` TCP connections to `addr`, each writing for `duration`; prints a
/// [`SourceReport`] as JSON.
pub fn run_source(
    addr: SocketAddr,
    flows: usize,
    duration: Duration,
    connect_timeout: Duration,
) -> anyhow::Result<()> {
    let handles: Vec<_> = (0..flows)
        .map(|_| std::thread::spawn(move || write_flow(addr, duration, connect_timeout)))
        .collect();
    let mut report = SourceReport::default();
    for h in handles {
        report.flows.push(
            h.join()
                .map_err(|_| anyhow::anyhow!("source: flow thread panicked"))?,
        );
    }
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(t_s: f64, sent_mbit: f64, pacing_mbps: f64, in_flight: u32) -> TcpSample {
        TcpSample {
            t_s,
            info: braid_linux::tcp_info::TcpInfo {
                cwnd: 100,
                unacked: in_flight,
                pacing_rate_bps: pacing_mbps * 1e6,
                bytes_sent: (sent_mbit * 1e6 / 8.0) as u64,
                bbr_bw_bps: Some(pacing_mbps * 1e6 / 1.25),
                ..Default::default()
            },
        }
    }

    #[test]
    fn behind_pacing_counts_paced_readings_that_sent_short() {
        // Half-second readings; Mbit sent so far, pacing in Mbit/s, packets in flight.
        let on_pace = [0.0, 1.0, 1.5, 2.0, 2.5]
            .iter()
            .enumerate()
            .map(|(i, &t)| reading(t, 10.0 * t, 10.0, 40 + i as u32))
            .collect::<Vec<_>>();
        assert_eq!(behind_pacing(&on_pace), Some(0.0));
        // Sending 6 Mbit/s at a pacing rate of 10 with a fifth of the window in flight: behind.
        let short: Vec<_> = [0.0, 1.0, 1.5, 2.0, 2.5]
            .iter()
            .map(|&t| reading(t, 6.0 * t, 10.0, 20))
            .collect();
        assert_eq!(behind_pacing(&short), Some(1.0));
        // The same rates with the window full: the window, not the pacing, held it.
        let window: Vec<_> = [0.0, 1.0, 1.5, 2.0, 2.5]
            .iter()
            .map(|&t| reading(t, 6.0 * t, 10.0, 95))
            .collect();
        assert_eq!(behind_pacing(&window), Some(0.0));
        // Before the first second (start-up) nothing counts; too few readings: unknown.
        assert_eq!(behind_pacing(&short[..3]), None);
        // A sender that does not pace (CUBIC: no BBR state in its readings): unknown.
        let unpaced: Vec<_> = short
            .iter()
            .map(|r| {
                let mut r = r.clone();
                r.info.bbr_bw_bps = None;
                r
            })
            .collect();
        assert_eq!(behind_pacing(&unpaced), None);
    }

    #[test]
    fn summary_counts_window_and_longest_gap() {
        let s = 1_000_000_000u64;
        // First byte at 1 s; reads every 10 ms, a hole from 2.5 s to 3.2 s, window 3 s.
        let mut reads = Vec::new();
        let mut t = s;
        while t < 5 * s {
            if !(t > 2 * s + s / 2 && t < 3 * s + s / 5) {
                reads.push((t, 1000));
            }
            t += s / 100;
        }
        let sum = summarize(reads, Duration::from_secs(3));
        let (bytes, per_sec, gap, at) = (sum.bytes, &sum.per_second_bps, sum.gap_ms, sum.gap_at_s);
        assert_eq!(per_sec.len(), 3);
        assert_eq!(per_sec[0], 100.0 * 1000.0 * 8.0);
        assert!(bytes < 300 * 1000 && bytes > 220 * 1000, "{bytes}");
        assert!((gap - 700.0).abs() < 15.0, "{gap}");
        assert!((at - 1.5).abs() < 0.02, "{at}");
        // The hole began in the second second; the others had reads every 10 ms.
        let per_gap = &sum.gap_per_second_ms;
        assert_eq!(per_gap.len(), 3);
        assert!((per_gap[0] - 10.0).abs() < 0.1, "{per_gap:?}");
        assert!((per_gap[1] - gap).abs() < 1e-9, "{per_gap:?}");
        assert!((per_gap[2] - 10.0).abs() < 0.1, "{per_gap:?}");
        // Each second's longest gap, from when it began.
        let per_at = &sum.gap_per_second_at_s;
        assert_eq!(per_at.len(), 3);
        assert!((per_at[1] - at).abs() < 1e-9, "{per_at:?}");
        assert!(per_at[0] < 1.0 && (1.0..2.0).contains(&per_at[1]) && per_at[2] >= 2.0);
    }

    #[test]
    fn summary_of_a_transfer_that_stops_early() {
        let s = 1_000_000_000u64;
        let reads = vec![(0, 10), (s / 2, 10)];
        let sum = summarize(reads, Duration::from_secs(2));
        assert!((sum.gap_ms - 1500.0).abs() < 1.0, "{sum:?}");
        assert!((sum.gap_at_s - 0.5).abs() < 1e-6);
        assert_eq!(sum.gap_per_second_ms.len(), 2);
        assert!((sum.gap_per_second_ms[0] - 1500.0).abs() < 1.0, "{sum:?}");
    }

    #[test]
    fn sink_and_source_over_loopback() {
        // Loopback only: this test needs no namespace.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let sink = std::thread::spawn(move || {
            let l = TcpListener::bind(addr).unwrap();
            let (s, _) = l.accept().unwrap();
            read_flow(s, Instant::now(), Instant::now() + Duration::from_secs(10))
        });
        std::thread::sleep(Duration::from_millis(50));
        let f = write_flow(addr, Duration::from_millis(200), Duration::from_secs(2));
        let (reads, flow) = sink.join().unwrap();
        assert!(f.error.is_none(), "{:?}", f.error);
        assert!(flow.clean_eof);
        assert_eq!(flow.bytes, f.bytes_sent);
        assert!(!reads.is_empty());
    }
}
