//! The lab's figures, as a table for people and one JSON object for programs.
//!
//! What "% of the sum" means: a link's RATE counts IP bytes. One TCP flow alone on a link carries
//! at most `(1500 - 52) / 1500` = 96.5% of it as payload (IPv4 + TCP headers with timestamps are
//! 52 bytes per 1500-byte packet). Through the tunnel every packet also carries 58 bytes of outer
//! IPv4, UDP and braid header and tag, and braid compresses the 52 bytes of inner headers to 14
//! (docs/protocol.md §13), so with a tunnel MTU of 1442 a full segment of 1390 payload bytes
//! takes `1390 + 14 + 58` = 1462 bytes on the uplink: a ceiling of 95.1% of the nominal rate.
//! The report therefore gives the bundle's TCP
//! goodput against the sum of the nominal rates (what a user bought), against the sum of what each
//! link gave alone with plain TCP (what the bundle could at best add up to without its own
//! overhead), and the ceilings that the headers impose, plus how full each link was (IP bytes the
//! emulator forwarded / rate): that last figure shows the scheduler's share of any shortfall.

use serde::Serialize;

use crate::spec::format_rate;
use crate::{TCP_IP_HEADERS, UNDERLAY_MTU};

/// What braid's compression leaves of a TCP/IPv4 segment's 52 bytes of headers with timestamps
/// in a one-way transfer, once the flow's reference is acknowledged (docs/protocol.md §13): a
/// delta packet of context id 2, flags 2, TCP flags 1, IP ID difference 2, sequence difference 3
/// (64 KB to 16 MB from the reference), timestamp differences 2 + 2; the acknowledgement
/// number, the window and the checksum left out (26 bytes for an absolute packet).
pub const COMPRESSED_TCP_IP_HEADERS: u32 = 14;

/// TCP payload ceiling through a tunnel of MTU `tunnel_mtu`, as a fraction of the uplinks'
/// rate: a full segment's payload over what it costs on the uplink (compressed inner headers,
/// braid's DATA header and tag, outer IPv4 and UDP, once per piece when the compressed segment
/// does not fit one datagram and is cut, docs/protocol.md §10.1).
pub fn bundle_ceiling_of(tunnel_mtu: u32) -> f64 {
    let payload = tunnel_mtu - TCP_IP_HEADERS;
    let compressed = payload + COMPRESSED_TCP_IP_HEADERS;
    let per_datagram = 28 + braid_core::wire::DATA_OVERHEAD as u32;
    let room = UNDERLAY_MTU - per_datagram;
    let pieces = compressed.div_ceil(room);
    f64::from(payload) / f64::from(compressed + pieces * per_datagram)
}

#[derive(Debug, Clone, Serialize)]
pub struct LabReport {
    pub netns_prefix: String,
    pub duration_s: f64,
    pub flows: u16,
    pub queue_ms: u64,
    /// TCP congestion control of the test hosts.
    pub tcp_congestion_control: String,
    /// The hosts negotiated ECN (`--ecn`).
    pub tcp_ecn: bool,
    /// The links' queues ran CoDel (`--codel`).
    pub codel: bool,
    /// Which way the data went: upload (host A sends) or download (host B sends).
    pub direction: crate::Direction,
    pub links: Vec<LinkReport>,
    pub nominal_sum_bps: f64,
    /// Sum of the links' goodput alone (when every link was measured).
    pub single_sum_bps: Option<f64>,
    /// TCP payload ceiling of one link alone, as a fraction of its rate.
    pub single_ceiling: f64,
    pub bundle: Option<BundleReport>,
    /// Bundle goodput / nominal sum.
    pub bundle_of_nominal: Option<f64>,
    /// Bundle goodput / sum of the links alone.
    pub bundle_of_single_sum: Option<f64>,
    /// TCP payload ceiling through the tunnel, as a fraction of the nominal sum.
    pub bundle_ceiling: Option<f64>,
    /// Bundle goodput / (nominal sum x bundle ceiling): the share of what can fit through the
    /// tunnel at this MTU that the bundle delivered.
    pub bundle_of_ceiling: Option<f64>,
    /// IP bytes the emulator forwarded in the data direction on all links during the bundle run
    /// / nominal sum.
    pub bundle_link_utilization: Option<f64>,
    /// What ran side by side with the bundle over the same links (`--compare`).
    pub compare: Option<CompareReport>,
    /// Its goodput / nominal sum.
    pub compare_of_nominal: Option<f64>,
    /// Bundle goodput / its goodput: above 1, braid is ahead.
    pub bundle_vs_compare: Option<f64>,
    /// The best link alone (its goodput), when every link was measured alone.
    pub best_single_bps: Option<f64>,
}

/// A run of another multipath transport over the same links (`--compare`).
#[derive(Debug, Clone, Serialize)]
pub struct CompareReport {
    /// `mptcp`.
    pub name: String,
    pub run: RunReport,
    /// MPTCP subflows joined (MP_JOIN answered) on top of the first.
    pub subflows_joined: u64,
    pub fail: Option<FailReport>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LinkReport {
    pub name: String,
    pub spec: String,
    pub rate_bps: u64,
    pub delay_ms: f64,
    pub loss_pct: f64,
    pub jitter_ms: f64,
    /// The emulator's drop-tail queue limit in each direction.
    pub queue_bytes: u64,
    /// Average of 5 idle pings over the link.
    pub ping_rtt_ms: Option<f64>,
    /// The link alone with plain TCP.
    pub single: Option<RunReport>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// TCP payload received per second inside the window, bit/s.
    pub goodput_bps: f64,
    pub per_second_bps: Vec<f64>,
    /// Longest time with no byte received (ms) and when it began (s into the window).
    pub longest_gap_ms: f64,
    pub longest_gap_at_s: f64,
    /// Per second of the window, the longest gap that began in it (ms), and when it began (s).
    pub longest_gap_per_second_ms: Vec<f64>,
    pub longest_gap_per_second_at_s: Vec<f64>,
    /// Every flow ended cleanly and delivered every byte it sent.
    pub survived: bool,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub errors: Vec<String>,
    /// Segments the TCP sender sent and retransmitted during the run (host A's counters).
    pub tcp_segments: u64,
    pub tcp_retransmits: u64,
    /// A->B IP bit/s the emulator forwarded on each link during the steady part of the run.
    pub link_rates_bps: Vec<f64>,
    /// A->B frames the emulator dropped on each link during the run: queue full...
    pub link_queue_drops: Vec<u64>,
    /// ...and random loss.
    pub link_lost: Vec<u64>,
    /// With `--codel`: A->B frames CoDel marked Congestion Experienced on each link
    /// (ECN-capable ones), and dropped (the others).
    pub link_ce_marks: Vec<u64>,
    pub link_aqm_drops: Vec<u64>,
    /// The (first) sender's TCP state through the run: its round trip, the minimum it sizes
    /// its window by, its window and rates (BBR's estimates when it runs BBR).
    pub sender_tcp: Vec<crate::traffic::TcpSample>,
    /// The share of the run in which that sender fell behind its own pacing rate
    /// ([`crate::traffic::behind_pacing`]): the lab's sender, not the path, held it back.
    /// `None` for a sender that does not pace (CUBIC) and for too short a run.
    pub sender_behind_pacing: Option<f64>,
    /// How long the (first) flow's `connect` took, ms: the TCP handshake's round trip.
    pub connect_ms: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct BundleReport {
    pub scheduler: String,
    pub tunnel_mtu: u32,
    pub run: RunReport,
    pub fail: Option<FailReport>,
    /// The client's `status` reply at the end of the run.
    pub client_status: Option<serde_json::Value>,
    /// The server's `status` reply at the end of the run.
    pub server_status: Option<serde_json::Value>,
    /// Both ends' view through the run, every [`crate::TIMELINE_EVERY`]: what the end-of-run
    /// status cannot show (a hold that grew by steps, a rate learned too high for a while).
    pub timeline: Vec<EndsSample>,
}

/// Both ends' view of the bundle at one moment of a run.
#[derive(Debug, Clone, Serialize)]
pub struct EndsSample {
    /// Seconds since the traffic started.
    pub t_s: f64,
    pub client: Option<EndSample>,
    pub server: Option<EndSample>,
}

/// One end's view (from its `status` reply).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EndSample {
    /// Delay equalisation as the receiver: the hold in force and the one the links call for;
    /// as the sender: the hold it counts on the peer applying (ms).
    pub hold_ms: f64,
    pub wanted_ms: f64,
    pub send_hold_ms: f64,
    /// Packets that waited in the bundle's queue so far (back-pressure), those waiting now, and
    /// those it dropped for waiting too long so far, or marked Congestion Experienced instead
    /// (ECN-capable packets).
    pub queued: u64,
    pub queue_depth: u64,
    pub queue_drops: u64,
    pub queue_marked: u64,
    /// The bundle queue's limit now (ms; 0 if the end does not say).
    pub queue_limit_ms: f64,
    /// The receive window this end's hosts' senders are held to now (`rwnd`; `None`: not
    /// clamped).
    pub window_clamp_bytes: Option<u64>,
    /// In-tunnel repair counters so far (the status reply's `repair`).
    pub repair: serde_json::Value,
    pub links: Vec<LinkSample>,
}

/// One link as one end sees it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LinkSample {
    pub state: String,
    /// The scheduler's rate, the delivery rate the peer reports, what this end sends (Mbit/s),
    /// and the queueing delay the peer measures against the one the scheduler believes (ms).
    pub sched_mbps: f64,
    pub delivered_mbps: f64,
    pub sent_mbps: f64,
    pub qdelay_ms: f64,
    pub sched_queue_ms: f64,
    /// The link's loss estimate (%) from the peer's reports, and whether the scheduler holds
    /// the link back for it (loss pull-back: up, carrying only its probes).
    pub loss_pct: f64,
    pub pulled_back: bool,
}

impl EndSample {
    /// From a `status` reply; `None` if it has no links array.
    pub fn from_status(st: &serde_json::Value) -> Option<EndSample> {
        let num = |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_f64()).unwrap_or(0.0);
        let links = st
            .get("links")?
            .as_array()?
            .iter()
            .map(|l| LinkSample {
                state: l
                    .get("state")
                    .and_then(|s| s.as_str())
                    .unwrap_or("?")
                    .to_string(),
                sched_mbps: num(l, "sched_rate_bps") / 1e6,
                delivered_mbps: num(l, "delivery_rate_bps") / 1e6,
                sent_mbps: num(l, "tx_rate_bps") / 1e6,
                qdelay_ms: num(l, "qdelay_us") / 1e3,
                sched_queue_ms: num(l, "sched_queue_us") / 1e3,
                loss_pct: num(l, "loss") * 100.0,
                pulled_back: l.get("pulled_back").and_then(|b| b.as_bool()) == Some(true),
            })
            .collect();
        Some(EndSample {
            hold_ms: num(st, "equalize_us") / 1e3,
            wanted_ms: num(st, "equalize_wanted_us") / 1e3,
            send_hold_ms: num(st, "equalize_send_us") / 1e3,
            queued: st.get("queued").and_then(|q| q.as_u64()).unwrap_or(0),
            queue_depth: st.get("queue_depth").and_then(|q| q.as_u64()).unwrap_or(0),
            queue_drops: st
                .pointer("/drops/queue_delay")
                .and_then(|q| q.as_u64())
                .unwrap_or(0),
            queue_marked: st.get("queue_marked").and_then(|q| q.as_u64()).unwrap_or(0),
            queue_limit_ms: num(st, "queue_limit_us") / 1e3,
            window_clamp_bytes: st.get("window_clamp_bytes").and_then(|w| w.as_u64()),
            repair: st.get("repair").cloned().unwrap_or_default(),
            links,
        })
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct FailReport {
    pub link: String,
    pub at_s: f64,
    /// When it came back (`--restore`), if it did.
    pub restored_at_s: Option<f64>,
    /// Longest time without a received byte during the run.
    pub longest_gap_ms: f64,
    /// Longest such time that began at most a second before the failure (the sink's seconds
    /// count from its first byte) or later: the failover's own stall, not one of the run before.
    pub stall_after_ms: f64,
    pub survived: bool,
}

impl LabReport {
    pub fn new(
        netns_prefix: String,
        duration_s: f64,
        flows: u16,
        queue_ms: u64,
        links: Vec<LinkReport>,
        bundle: Option<BundleReport>,
    ) -> LabReport {
        let nominal_sum_bps: f64 = links.iter().map(|l| l.rate_bps as f64).sum();
        let single_sum_bps = links
            .iter()
            .map(|l| l.single.as_ref().map(|s| s.goodput_bps))
            .sum::<Option<f64>>();
        let single_ceiling = f64::from(UNDERLAY_MTU - TCP_IP_HEADERS) / f64::from(UNDERLAY_MTU);
        let bundle_goodput = bundle.as_ref().map(|b| b.run.goodput_bps);
        let bundle_ceiling = bundle.as_ref().map(|b| bundle_ceiling_of(b.tunnel_mtu));
        let bundle_link_utilization = bundle
            .as_ref()
            .filter(|b| !b.run.link_rates_bps.is_empty())
            .map(|b| b.run.link_rates_bps.iter().sum::<f64>() / nominal_sum_bps);
        LabReport {
            netns_prefix,
            duration_s,
            flows,
            queue_ms,
            tcp_congestion_control: String::new(),
            tcp_ecn: false,
            codel: false,
            direction: crate::Direction::Upload,
            compare: None,
            compare_of_nominal: None,
            bundle_vs_compare: None,
            best_single_bps: links
                .iter()
                .map(|l| l.single.as_ref().map(|s| s.goodput_bps))
                .collect::<Option<Vec<f64>>>()
                .and_then(|v| v.into_iter().reduce(f64::max)),
            bundle_of_nominal: bundle_goodput.map(|g| g / nominal_sum_bps),
            bundle_of_single_sum: bundle_goodput.zip(single_sum_bps).map(|(g, s)| g / s),
            links,
            nominal_sum_bps,
            single_sum_bps,
            single_ceiling,
            bundle,
            bundle_of_ceiling: bundle_goodput
                .zip(bundle_ceiling)
                .map(|(g, c)| g / (c * nominal_sum_bps)),
            bundle_ceiling,
            bundle_link_utilization,
        }
    }
}

impl LabReport {
    /// Records the side-by-side run and the ratios that compare it with the bundle.
    pub fn set_compare(&mut self, compare: Option<CompareReport>) {
        self.compare_of_nominal = compare
            .as_ref()
            .map(|c| c.run.goodput_bps / self.nominal_sum_bps);
        self.bundle_vs_compare = compare
            .as_ref()
            .zip(self.bundle.as_ref())
            .filter(|(c, _)| c.run.goodput_bps > 0.0)
            .map(|(c, b)| b.run.goodput_bps / c.run.goodput_bps);
        self.compare = compare;
    }
}

fn mbit(bps: f64) -> String {
    format!("{:.2}", bps / 1e6)
}

/// The table `braid lab` prints.
pub fn render(r: &LabReport) -> String {
    let mut out = String::new();
    out += &format!(
        "{:<8} {:<22} {:>9} {:>12} {:>8} {:>10}\n",
        "link", "spec", "ping rtt", "TCP alone", "of rate", "link used"
    );
    for l in &r.links {
        let rtt = l
            .ping_rtt_ms
            .map(|v| format!("{v:.1} ms"))
            .unwrap_or_else(|| "-".into());
        let (alone, pct, used) = match &l.single {
            Some(s) => (
                format!("{} Mbit/s", mbit(s.goodput_bps)),
                format!("{:.1}%", 100.0 * s.goodput_bps / l.rate_bps as f64),
                s.link_rates_bps
                    .iter()
                    .copied()
                    .reduce(f64::max)
                    .map(|v| format!("{:.1}%", 100.0 * v / l.rate_bps as f64))
                    .unwrap_or_else(|| "-".into()),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        out += &format!(
            "{:<8} {:<22} {:>9} {:>12} {:>8} {:>10}\n",
            l.name, l.spec, rtt, alone, pct, used
        );
    }
    let sum_alone = r
        .single_sum_bps
        .map(|s| format!("{} Mbit/s", mbit(s)))
        .unwrap_or_else(|| "-".into());
    let sum_pct = r
        .single_sum_bps
        .map(|s| format!("{:.1}%", 100.0 * s / r.nominal_sum_bps))
        .unwrap_or_else(|| "-".into());
    out += &format!(
        "{:<8} {:<22} {:>9} {:>12} {:>8}\n",
        "sum",
        format!("{}", format_rate(r.nominal_sum_bps as u64)),
        "",
        sum_alone,
        sum_pct
    );
    if let Some(c) = &r.compare {
        let detail = format!("{} subflow(s) joined", c.subflows_joined);
        render_run(&mut out, r, &c.name, &detail, &c.run, c.fail.as_ref());
    }
    if let Some(b) = &r.bundle {
        let detail = format!("{} flow(s), {}", r.flows, b.scheduler);
        render_run(&mut out, r, "bundle", &detail, &b.run, b.fail.as_ref());
        out += &format!(
            "  tunnel MTU {}: TCP payload ceiling {:.1}% of the rates through the tunnel ({:.1}% alone); \
             the bundle reached {:.1}% of that ceiling\n",
            b.tunnel_mtu,
            100.0 * r.bundle_ceiling.unwrap_or(0.0),
            100.0 * r.single_ceiling,
            100.0 * r.bundle_of_ceiling.unwrap_or(0.0)
        );
        let of_alone = r
            .bundle_of_single_sum
            .map(|v| format!(", {:.0}% of the links alone", 100.0 * v))
            .unwrap_or_default();
        let compare = match (&r.compare, r.bundle_vs_compare) {
            (Some(c), Some(x)) => format!(
                "; {}: {} Mbit/s ({:.0}%): braid {:.2}x {}",
                c.name,
                mbit(c.run.goodput_bps),
                100.0 * c.run.goodput_bps / r.nominal_sum_bps,
                x,
                c.name
            ),
            _ => String::new(),
        };
        out += &format!(
            "bundle ({}, {}): {} Mbit/s of {} ({:.0}%{of_alone}){compare}\n",
            direction_name(r.direction),
            cc_label(r),
            mbit(b.run.goodput_bps),
            mbit(r.nominal_sum_bps),
            100.0 * b.run.goodput_bps / r.nominal_sum_bps
        );
    } else if let Some(c) = &r.compare {
        out += &format!(
            "{} ({}, {}): {} Mbit/s of {} ({:.0}%)\n",
            c.name,
            direction_name(r.direction),
            cc_label(r),
            mbit(c.run.goodput_bps),
            mbit(r.nominal_sum_bps),
            100.0 * c.run.goodput_bps / r.nominal_sum_bps
        );
    }
    out
}

/// The hosts' congestion control as the text report names it ("cubic", "cubic with ECN").
fn cc_label(r: &LabReport) -> String {
    let mut label = r.tcp_congestion_control.clone();
    if r.tcp_ecn {
        label.push_str(" with ECN");
    }
    if r.codel {
        label.push_str(", CoDel on the links");
    }
    label
}

fn direction_name(d: crate::Direction) -> &'static str {
    match d {
        crate::Direction::Upload => "upload",
        crate::Direction::Download => "download",
    }
}

/// The rows of one multi-link run: goodput, each link on the wire, the TCP sender, the failure.
fn render_run(
    out: &mut String,
    r: &LabReport,
    label: &str,
    detail: &str,
    run: &RunReport,
    fail: Option<&FailReport>,
) {
    let used = if run.link_rates_bps.is_empty() {
        "-".to_string()
    } else {
        format!(
            "{:.1}%",
            100.0 * run.link_rates_bps.iter().sum::<f64>() / r.nominal_sum_bps
        )
    };
    *out += &format!(
        "{:<8} {:<22} {:>9} {:>12} {:>8} {:>10}\n",
        label,
        detail,
        "",
        format!("{} Mbit/s", mbit(run.goodput_bps)),
        format!("{:.1}%", 100.0 * run.goodput_bps / r.nominal_sum_bps),
        used
    );
    if !run.link_rates_bps.is_empty() {
        let per: Vec<String> = run
            .link_rates_bps
            .iter()
            .zip(&r.links)
            .enumerate()
            .map(|(i, (v, l))| {
                let drops = run.link_queue_drops.get(i).copied().unwrap_or(0);
                format!(
                    "{} {} ({:.0}%, {drops} queue drops)",
                    l.name,
                    mbit(*v),
                    100.0 * v / l.rate_bps as f64
                )
            })
            .collect();
        *out += &format!(
            "  {label} per link on the wire (Mbit/s of IP): {}\n",
            per.join(", ")
        );
    }
    let connect = run
        .connect_ms
        .map_or(String::new(), |ms| format!(", connected in {ms:.0} ms"));
    *out += &format!(
        "  TCP sender ({}): {} segments, {} retransmitted ({:.2}%){connect}\n",
        cc_label(r),
        run.tcp_segments,
        run.tcp_retransmits,
        100.0 * run.tcp_retransmits as f64 / (run.tcp_segments.max(1)) as f64
    );
    if let Some(f) = fail {
        let back = f
            .restored_at_s
            .map_or(String::new(), |t| format!(", back at {t:.1} s"));
        *out += &format!(
            "  {} failed at {:.1} s{back}: longest stall {:.0} ms ({:.0} ms from the failure on), TCP connection {}\n",
            f.link,
            f.at_s,
            f.longest_gap_ms,
            f.stall_after_ms,
            if f.survived { "survived" } else { "BROKEN" }
        );
    } else if !run.survived {
        *out += &format!(
            "  the TCP connection did not finish cleanly: {}\n",
            run.errors.join("; ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_end_sample_reads_a_status_reply() {
        let st = serde_json::json!({
            "equalize_us": 12000, "equalize_wanted_us": 50000, "equalize_send_us": 11000,
            "queued": 42, "queue_depth": 7, "drops": {"queue_delay": 3},
            "window_clamp_bytes": 906809,
            "links": [
                {"state": "up", "sched_rate_bps": 50e6, "delivery_rate_bps": 45e6,
                 "tx_rate_bps": 48e6, "qdelay_us": 70000, "sched_queue_us": 25000,
                 "loss": 0.015, "pulled_back": true},
                {"state": "down"}
            ]
        });
        let e = EndSample::from_status(&st).expect("links");
        assert_eq!((e.hold_ms, e.wanted_ms, e.send_hold_ms), (12.0, 50.0, 11.0));
        assert_eq!((e.queued, e.queue_depth, e.queue_drops), (42, 7, 3));
        assert_eq!(e.window_clamp_bytes, Some(906_809));
        assert_eq!(
            e.links[0],
            LinkSample {
                state: "up".into(),
                sched_mbps: 50.0,
                delivered_mbps: 45.0,
                sent_mbps: 48.0,
                qdelay_ms: 70.0,
                sched_queue_ms: 25.0,
                loss_pct: 1.5,
                pulled_back: true,
            }
        );
        // A field missing reads as zero; no links array, no sample.
        assert_eq!(e.links[1].state, "down");
        assert_eq!(e.links[1].sched_mbps, 0.0);
        assert!(!e.links[1].pulled_back);
        assert!(EndSample::from_status(&serde_json::json!({"error": "x"})).is_none());
    }
}
