//! Prometheus metrics of a running endpoint, encoded with `prometheus-client` (OpenMetrics text)
//! from one snapshot of the core's statistics per scrape. Served by `braid_linux::metrics`.
//!
//! Names follow the Prometheus naming guide: base units (seconds, bytes), `_total` on counters,
//! rates in `_bytes_per_second`. A rate that a `_bytes_total` counter already gives
//! (`rate(braid_link_tx_bytes_total[1m])`) is not exported twice. The full list, with labels,
//! is in docs/guide.md ("Metrics"); a test scrapes a real endpoint and checks that every name
//! exported is listed there.
//!
//! Per link (labels `bundle`, `link`): `braid_link_{tx,rx}_{bytes,packets}_total`,
//! `braid_link_{rtt,rttvar,min_rtt,queue_delay}_seconds`, `braid_link_loss_ratio`,
//! `braid_link_up` / `braid_link_state` (label `state`),
//! `braid_link_{delivery_rate,sched_rate,bandwidth}_bytes_per_second`, `braid_link_priority`.
//! Bundle: `braid_session_up`, `braid_links`, `braid_links_up`, `braid_reorder_depth`,
//! `braid_reorder_max_depth`, `braid_reorder_window`, `braid_reorder_timeout_seconds`,
//! `braid_equalize_{,wanted_,send_}seconds`, `braid_reorder_*_total`, `braid_repair_*_total`
//! and `braid_repair_ring_bytes` (in-tunnel loss repair), `braid_drops_total` (label `reason`),
//! `braid_tun_{rx,tx}_{packets,bytes}_total`. And `braid_build_info`.

use std::sync::atomic::AtomicU64;

use braid_core::endpoint::BundleStats;
use braid_core::LinkState;
use prometheus_client::encoding::text::encode as encode_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::config::Config;

type Labels = Vec<(String, String)>;
type CounterFam = Family<Labels, Counter>;
type GaugeFam = Family<Labels, Gauge<f64, AtomicU64>>;

/// Counters the runner keeps itself (outside the core).
#[derive(Debug, Default, Clone, Copy)]
pub struct Extra {
    pub udp_send_drops: u64,
    pub tun_write_errors: u64,
    /// Packets dropped at a full TUN queue, either way: writes the device refused, and packets
    /// the kernel dropped because braid did not read them in time.
    pub tun_full_drops: u64,
    /// The TUN's offload path (super-packets cut, segments glued).
    pub tun: braid_linux::tun::TunStats,
    /// The link sockets' receive path (UDP GRO).
    pub udp_rx: braid_linux::udp::RecvStats,
    /// Datagrams from the link sockets opened on the helper threads, in parallel parts.
    pub udp_opened_in_parallel: u64,
}

struct Reg<'a> {
    r: &'a mut Registry,
}

impl Reg<'_> {
    fn counter(&mut self, name: &str, help: &str, rows: &[(Labels, u64)]) {
        let f = CounterFam::default();
        for (l, v) in rows {
            f.get_or_create(l).inc_by(*v);
        }
        self.r.register(name, help, f);
    }
    fn gauge(&mut self, name: &str, help: &str, rows: &[(Labels, f64)]) {
        let f = GaugeFam::default();
        for (l, v) in rows {
            f.get_or_create(l).set(*v);
        }
        self.r.register(name, help, f);
    }
}

fn bundle(name: &str) -> Labels {
    vec![("bundle".into(), name.into())]
}

fn link(name: &str, l: &str) -> Labels {
    vec![("bundle".into(), name.into()), ("link".into(), l.into())]
}

/// Encodes one snapshot.
pub fn encode(cfg: &Config, s: &BundleStats, extra: Extra) -> String {
    let n = cfg.name.as_str();
    let mut root = Registry::default();
    braid_linux::metrics::register_build_info(&mut root);
    let mut r = Reg {
        r: root.sub_registry_with_prefix("braid"),
    };
    let per_link = |f: &dyn Fn(&braid_core::endpoint::LinkStats) -> u64| -> Vec<(Labels, u64)> {
        s.links.iter().map(|l| (link(n, &l.name), f(l))).collect()
    };
    let per_link_f =
        |f: &dyn Fn(&braid_core::endpoint::LinkStats) -> Option<f64>| -> Vec<(Labels, f64)> {
            s.links
                .iter()
                .filter_map(|l| f(l).map(|v| (link(n, &l.name), v)))
                .collect()
        };
    r.counter(
        "link_tx_bytes",
        "Bytes sent on the link (UDP payload)",
        &per_link(&|l| l.tx_bytes),
    );
    r.counter(
        "link_rx_bytes",
        "Bytes received on the link (UDP payload)",
        &per_link(&|l| l.rx_bytes),
    );
    r.counter(
        "link_tx_packets",
        "Datagrams sent on the link",
        &per_link(&|l| l.tx_packets),
    );
    r.counter(
        "link_rx_packets",
        "Datagrams received on the link",
        &per_link(&|l| l.rx_packets),
    );
    r.gauge(
        "link_tx_ce_marked",
        "This session, packets of ours the link's path marked Congestion Experienced, as the peer counts them (LINK-CE)",
        &per_link_f(&|l| Some(f64::from(l.tx_ce_marked))),
    );
    r.gauge(
        "link_rx_ce_marked",
        "This session, packets of the peer's the link's path marked Congestion Experienced",
        &per_link_f(&|l| Some(f64::from(l.rx_ce_marked))),
    );
    r.gauge(
        "link_path_mtu_bytes",
        "Largest datagram (UDP payload) the link sends now, from path MTU discovery",
        &per_link_f(&|l| l.pmtu.map(|m| m as f64)),
    );
    r.gauge(
        "link_rtt_seconds",
        "Smoothed round-trip time (RFC 6298)",
        &per_link_f(&|l| l.srtt_us.map(|u| u as f64 / 1e6)),
    );
    r.gauge(
        "link_rttvar_seconds",
        "Round-trip time variation (RFC 6298)",
        &per_link_f(&|l| l.rttvar_us.map(|u| u as f64 / 1e6)),
    );
    r.gauge(
        "link_min_rtt_seconds",
        "Smallest round-trip time seen",
        &per_link_f(&|l| l.min_rtt_us.map(|u| u as f64 / 1e6)),
    );
    r.gauge(
        "link_loss_ratio",
        "Recent loss rate of the link (0..1)",
        &per_link_f(&|l| Some(l.loss)),
    );
    // The core counts in bit/s (as links are sold); Prometheus wants bytes.
    r.gauge(
        "link_delivery_rate_bytes_per_second",
        "Rate at which the peer received our data on the link",
        &per_link_f(&|l| Some(l.delivery_rate_bps / 8.0)),
    );
    r.gauge(
        "link_sched_rate_bytes_per_second",
        "Rate the scheduler currently assumes for the link (learned by adaptive)",
        &per_link_f(&|l| l.sched_rate_bps.map(|b| b / 8.0)),
    );
    r.gauge(
        "link_sched_queue_seconds",
        "Queue the scheduler believes the link holds (adaptive's virtual queue)",
        &per_link_f(&|l| l.sched_queue_us.map(|us| us as f64 / 1e6)),
    );
    r.gauge(
        "link_pulled_back",
        "1 while the scheduler holds the link back for its loss (adaptive): up, carrying only probes",
        &per_link_f(&|l| l.pulled_back.map(|b| f64::from(u8::from(b)))),
    );
    r.gauge(
        "link_queue_delay_seconds",
        "Queueing delay the peer reports on the link",
        &per_link_f(&|l| Some(l.qdelay_us as f64 / 1e6)),
    );
    r.gauge(
        "link_bandwidth_bytes_per_second",
        "Configured bandwidth",
        &per_link_f(&|l| l.bandwidth_bps.map(|b| b as f64 / 8.0)),
    );
    r.gauge(
        "link_priority",
        "Configured priority",
        &per_link_f(&|l| Some(l.priority as f64)),
    );
    r.gauge(
        "link_up",
        "1 if the link is UP or DEGRADED, 0 if DOWN",
        &per_link_f(&|l| Some(if l.state == LinkState::Down { 0.0 } else { 1.0 })),
    );
    let states: Vec<(Labels, f64)> = s
        .links
        .iter()
        .flat_map(|l| {
            [
                (LinkState::Up, "up"),
                (LinkState::Degraded, "degraded"),
                (LinkState::Down, "down"),
            ]
            .into_iter()
            .map(move |(st, name)| {
                let mut lab = link(n, &l.name);
                lab.push(("state".into(), name.into()));
                (lab, if l.state == st { 1.0 } else { 0.0 })
            })
        })
        .collect();
    r.gauge(
        "link_state",
        "1 for the link's current state (label state)",
        &states,
    );

    let b = bundle(n);
    r.gauge(
        "session_up",
        "1 while a session with the peer is established",
        &[(b.clone(), if s.session.is_some() { 1.0 } else { 0.0 })],
    );
    r.gauge(
        "links",
        "Links of the bundle",
        &[(b.clone(), s.links.len() as f64)],
    );
    r.gauge(
        "links_up",
        "Links that are UP or DEGRADED",
        &[(
            b.clone(),
            s.links
                .iter()
                .filter(|l| l.state != LinkState::Down)
                .count() as f64,
        )],
    );
    r.gauge(
        "reorder_depth",
        "Packets held in the reorder buffer now",
        &[(b.clone(), s.reorder_depth as f64)],
    );
    r.gauge(
        "reorder_max_depth",
        "Largest reorder buffer depth seen",
        &[(b.clone(), s.reorder.max_depth as f64)],
    );
    r.gauge(
        "reorder_window",
        "Packets the reorder buffer may hold ahead of its delivery point now (grows with what is held)",
        &[(b.clone(), s.reorder.window as f64)],
    );
    r.gauge(
        "reorder_timeout_seconds",
        "Current reorder hold timeout",
        &[(b.clone(), s.reorder_timeout_us as f64 / 1e6)],
    );
    r.gauge(
        "equalize_seconds",
        "How long bulk-size packets of the fastest live link are held (delay equalisation)",
        &[(b.clone(), s.equalize_us as f64 / 1e6)],
    );
    r.gauge(
        "equalize_wanted_seconds",
        "The hold the links call for (above equalize_seconds while it grows by steps)",
        &[(b.clone(), s.equalize_wanted_us as f64 / 1e6)],
    );
    r.gauge(
        "equalize_send_seconds",
        "The hold this end counts on the peer applying as it sends (links needing more carry no held packet)",
        &[(b.clone(), s.equalize_send_us as f64 / 1e6)],
    );
    r.counter(
        "reorder_delivered",
        "Packets delivered in order by the reorder buffer",
        &[(b.clone(), s.reorder.delivered)],
    );
    r.counter(
        "reorder_duplicates",
        "Duplicate packets discarded by the reorder buffer",
        &[(b.clone(), s.reorder.duplicates)],
    );
    r.counter(
        "reorder_late",
        "Packets that arrived after their slot was given up",
        &[(b.clone(), s.reorder.late)],
    );
    r.counter(
        "reorder_late_delivered",
        "Late packets delivered all the same, out of order (never delivered before)",
        &[(b.clone(), s.reorder.late_delivered)],
    );
    r.counter(
        "reorder_skipped",
        "Sequence numbers given up as lost",
        &[(b.clone(), s.reorder.skipped)],
    );
    r.counter(
        "reorder_timeouts",
        "Times the reorder buffer stopped waiting for a gap",
        &[(b.clone(), s.reorder.timeouts)],
    );
    let rp = &s.repair;
    for (name, help, v) in [
        (
            "repair_retransmits_sent",
            "DATA packets sent again in answer to a NACK",
            rp.retransmits_sent,
        ),
        (
            "repair_reinjected",
            "DATA packets sent again off a link that went DOWN",
            rp.reinjected,
        ),
        (
            "repair_nacks_sent",
            "NACK and LINK-NACK packets sent (holes asked for again)",
            rp.nacks_sent,
        ),
        (
            "repair_nacks_received",
            "NACK and LINK-NACK packets received",
            rp.nacks_received,
        ),
        (
            "repair_retransmits_received",
            "Retransmitted DATA packets received",
            rp.retransmits_received,
        ),
        (
            "repair_holes_repaired",
            "Reorder holes filled by a retransmission",
            rp.holes_repaired,
        ),
        (
            "repair_holes_given_up",
            "Holes asked for again and given up after all",
            s.reorder.repair_given_up,
        ),
        (
            "repair_holes_passed",
            "Holes of random loss asked for again and not waited for (the copy delivered out of order)",
            s.reorder.repair_passed,
        ),
        (
            "repair_link_losses_random",
            "Packets a link lost, read as random loss (asked for again)",
            rp.link_losses_random,
        ),
        (
            "repair_link_losses_queued",
            "Packets a link lost, read as a full queue's drops (left to the inner flows)",
            rp.link_losses_queued,
        ),
        (
            "repair_duplicates_suppressed",
            "DATA packets dropped as already held or delivered",
            rp.duplicates_suppressed,
        ),
    ] {
        r.counter(name, help, &[(b.clone(), v)]);
    }
    r.gauge(
        "repair_ring_bytes",
        "Bytes of sent packets kept for retransmission",
        &[(b.clone(), rp.ring_bytes as f64)],
    );
    let reason = |r: &str, v: u64| {
        let mut l = bundle(n);
        l.push(("reason".into(), r.into()));
        (l, v)
    };
    // Every reason the core counts (by its serialized field name, so new reasons show up
    // without a change here), plus the runner's own.
    let mut drops: Vec<(Labels, u64)> = match serde_json::to_value(&s.drops) {
        Ok(serde_json::Value::Object(m)) => m
            .iter()
            .filter_map(|(k, v)| v.as_u64().map(|v| reason(k, v)))
            .collect(),
        _ => Vec::new(),
    };
    drops.push(reason("udp_send", extra.udp_send_drops));
    drops.push(reason("tun_write", extra.tun_write_errors));
    drops.push(reason("tun_full", extra.tun_full_drops));
    drops.push(reason("tun_read", extra.tun.rx_dropped));
    r.counter("drops", "Datagrams or packets dropped, by reason", &drops);
    let t = extra.tun;
    r.counter(
        "tun_super_packets",
        "TCP super-packets (TSO) read from the TUN device",
        &[(b.clone(), t.super_packets)],
    );
    r.counter(
        "tun_segments",
        "Segments cut from TSO super-packets",
        &[(b.clone(), t.segments)],
    );
    r.counter(
        "tun_glued_writes",
        "TUN writes that carried several in-order TCP segments glued together",
        &[(b.clone(), t.glued_writes)],
    );
    r.counter(
        "tun_glued_packets",
        "TCP segments written to the TUN glued into larger writes",
        &[(b.clone(), t.glued_packets)],
    );
    r.counter(
        "udp_gro_messages",
        "Messages from the link sockets that carried several datagrams coalesced by the kernel (UDP GRO)",
        &[(b.clone(), extra.udp_rx.gro_messages)],
    );
    r.counter(
        "udp_gro_datagrams",
        "Datagrams cut from UDP GRO messages",
        &[(b.clone(), extra.udp_rx.gro_datagrams)],
    );
    r.counter(
        "udp_opened_in_parallel",
        "Datagrams from the link sockets opened (decrypted) in parallel parts on the data plane's helper threads",
        &[(b.clone(), extra.udp_opened_in_parallel)],
    );
    r.counter(
        "bundle_queued",
        "IP packets that waited in the bundle's queue under back-pressure because every link was full",
        &[(b.clone(), s.queued)],
    );
    r.counter(
        "bundle_queue_ce_marked",
        "ECN-capable IP packets the bundle's queue marked Congestion Experienced instead of dropping them",
        &[(b.clone(), s.queue_marked)],
    );
    r.counter(
        "window_clamped",
        "TCP segments from the peer's hosts whose receive window was lowered to what the bundle carries in two round trips",
        &[(b.clone(), s.window_clamped)],
    );
    r.gauge(
        "window_clamp_bytes",
        "The receive window our hosts' TCP senders are told at most now, bytes (0: not clamped now)",
        &[(b.clone(), f64::from(s.window_clamp_bytes.unwrap_or(0)))],
    );
    r.gauge(
        "bundle_queue_depth",
        "IP packets waiting in the bundle's queue under back-pressure now",
        &[(b.clone(), s.queue_depth as f64)],
    );
    r.gauge(
        "bundle_queue_limit_seconds",
        "How long a packet may wait in the bundle's queue now: three inner round trips, one while the queue stands",
        &[(b.clone(), s.queue_limit_us as f64 / 1e6)],
    );
    r.counter(
        "bundle_queue_stood",
        "Times the bundle's queue was found standing (a loss-based sender's) and its limit cut to one round trip",
        &[(b.clone(), s.queue_stood)],
    );
    let c = &s.compression;
    let labelled = |pairs: &[(&str, &str)], v: u64| {
        let mut l = bundle(n);
        l.extend(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        (l, v)
    };
    r.counter(
        "compression_packets",
        "DATA payloads by direction and encoding (inner header compression)",
        &[
            labelled(&[("direction", "tx"), ("encoding", "plain")], c.tx_plain),
            labelled(&[("direction", "tx"), ("encoding", "full")], c.tx_full),
            labelled(
                &[("direction", "tx"), ("encoding", "compressed")],
                c.tx_compressed,
            ),
            labelled(&[("direction", "rx"), ("encoding", "plain")], c.rx_plain),
            labelled(&[("direction", "rx"), ("encoding", "full")], c.rx_full),
            labelled(
                &[("direction", "rx"), ("encoding", "compressed")],
                c.rx_compressed,
            ),
        ],
    );
    r.counter(
        "compression_saved_bytes",
        "Inner header bytes not sent (tx) or rebuilt (rx)",
        &[
            labelled(&[("direction", "tx")], c.tx_bytes_saved),
            labelled(&[("direction", "rx")], c.rx_bytes_saved),
        ],
    );
    r.counter(
        "compression_drops",
        "Received DATA payloads that did not decompress, by reason",
        &[
            labelled(&[("reason", "no_context")], c.rx_dropped_no_context),
            labelled(&[("reason", "malformed")], c.rx_dropped_malformed),
        ],
    );
    let f = &s.frag;
    r.counter(
        "frag_packets",
        "Packets cut into pieces to fit a link's path (tx), and put back together (rx)",
        &[
            labelled(&[("direction", "tx")], f.tx_split),
            labelled(&[("direction", "rx")], f.rx_reassembled),
        ],
    );
    r.counter(
        "frag_pieces",
        "Pieces sent of packets cut to fit a link's path",
        &[(b.clone(), f.tx_pieces)],
    );
    r.counter(
        "frag_drops",
        "Packets or pieces dropped in reassembly, by reason",
        &[
            labelled(&[("reason", "incomplete")], f.rx_dropped_incomplete),
            labelled(&[("reason", "orphan")], f.rx_dropped_orphans),
            labelled(&[("reason", "oversize")], f.rx_dropped_oversize),
        ],
    );
    let e = &s.ecn;
    r.counter(
        "ecn_packets",
        "DATA packets sent ECN-capable (ect), delivered after an outer CE mark (ce), dropped for an outer CE over a Not-ECT packet (ce_dropped)",
        &[
            labelled(&[("what", "ect")], e.tx_ect),
            labelled(&[("what", "ce")], e.rx_ce),
            labelled(&[("what", "ce_dropped")], e.rx_ce_dropped),
        ],
    );
    r.counter(
        "tun_rx_packets",
        "IP packets read from the TUN device",
        &[(b.clone(), s.tun_rx_packets)],
    );
    r.counter(
        "tun_rx_bytes",
        "Bytes read from the TUN device",
        &[(b.clone(), s.tun_rx_bytes)],
    );
    r.counter(
        "tun_tx_packets",
        "IP packets written to the TUN device",
        &[(b.clone(), s.tun_tx_packets)],
    );
    r.counter(
        "tun_tx_bytes",
        "Bytes written to the TUN device",
        &[(b, s.tun_tx_bytes)],
    );

    let mut out = String::new();
    if encode_text(&mut out, &root).is_err() {
        return "# encoding failed\n".into();
    }
    out
}

/// Encodes a concentrator's snapshot: per client (labels `bundle`, `client`, and `link` for its
/// links) and the concentrator's own counters. The names are listed in docs/guide.md
/// ("Concentrator metrics").
pub fn encode_sites(
    cfg: &Config,
    drops: &braid_core::concentrator::ConcentratorDrops,
    clients: &[braid_core::concentrator::ClientStats],
    extra: Extra,
) -> String {
    let n = cfg.name.as_str();
    let mut root = Registry::default();
    braid_linux::metrics::register_build_info(&mut root);
    let mut r = Reg {
        r: root.sub_registry_with_prefix("braid"),
    };
    let client =
        |c: &str| -> Labels { vec![("bundle".into(), n.into()), ("client".into(), c.into())] };
    let per_client =
        |f: &dyn Fn(&braid_core::concentrator::ClientStats) -> u64| -> Vec<(Labels, u64)> {
            clients.iter().map(|c| (client(&c.name), f(c))).collect()
        };
    let per_client_f =
        |f: &dyn Fn(&braid_core::concentrator::ClientStats) -> f64| -> Vec<(Labels, f64)> {
            clients.iter().map(|c| (client(&c.name), f(c))).collect()
        };
    let per_link =
        |f: &dyn Fn(&braid_core::endpoint::LinkStats) -> Option<f64>| -> Vec<(Labels, f64)> {
            clients
                .iter()
                .flat_map(|c| {
                    c.stats.links.iter().filter_map(move |l| {
                        let mut lab = client(&c.name);
                        lab.push(("link".into(), l.name.clone()));
                        f(l).map(|v| (lab, v))
                    })
                })
                .collect()
        };
    r.gauge(
        "clients",
        "Clients configured",
        &[(bundle(n), clients.len() as f64)],
    );
    r.gauge(
        "client_up",
        "1 while the client has a session",
        &per_client_f(&|c| if c.connected { 1.0 } else { 0.0 }),
    );
    r.gauge(
        "client_links_up",
        "The client's links that are UP or DEGRADED",
        &per_client_f(&|c| {
            c.stats
                .links
                .iter()
                .filter(|l| l.state != LinkState::Down)
                .count() as f64
        }),
    );
    let per_link_count =
        |f: &dyn Fn(&braid_core::endpoint::LinkStats) -> u64| -> Vec<(Labels, u64)> {
            per_link(&|l| Some(f(l) as f64))
                .into_iter()
                .map(|(lab, v)| (lab, v as u64))
                .collect()
        };
    r.counter(
        "client_link_tx_bytes",
        "Bytes sent on the client's link (UDP payload)",
        &per_link_count(&|l| l.tx_bytes),
    );
    r.counter(
        "client_link_rx_bytes",
        "Bytes received on the client's link (UDP payload)",
        &per_link_count(&|l| l.rx_bytes),
    );
    r.gauge(
        "client_link_rtt_seconds",
        "Smoothed round-trip time of the client's link",
        &per_link(&|l| l.srtt_us.map(|u| u as f64 / 1e6)),
    );
    r.counter(
        "client_tun_rx_packets",
        "IP packets from the TUN device sent to the client",
        &per_client(&|c| c.stats.tun_rx_packets),
    );
    r.counter(
        "client_tun_tx_packets",
        "IP packets from the client written to the TUN device or passed to another client",
        &per_client(&|c| c.stats.tun_tx_packets),
    );
    r.counter(
        "client_forwarded_packets",
        "Packets from the client passed directly to another client",
        &per_client(&|c| c.forwarded),
    );
    let mut by_reason: Vec<(Labels, u64)> = Vec::new();
    for c in clients {
        let mut push = |reason: &str, v: u64| {
            let mut l = client(&c.name);
            l.push(("reason".into(), reason.into()));
            by_reason.push((l, v));
        };
        if let Ok(serde_json::Value::Object(m)) = serde_json::to_value(&c.stats.drops) {
            for (k, v) in &m {
                if let Some(v) = v.as_u64() {
                    push(k, v);
                }
            }
        }
        push("source", c.dropped_source);
        push("policy", c.dropped_policy);
        push("queue", c.dropped_queue);
    }
    r.counter(
        "client_drops",
        "The client's datagrams or packets dropped, by reason (source: an inner source not its own; policy: to a client it may not reach; queue: its output queue was full)",
        &by_reason,
    );
    let reason = |r: &str, v: u64| {
        let mut l = bundle(n);
        l.push(("reason".into(), r.into()));
        (l, v)
    };
    r.counter(
        "concentrator_drops",
        "Datagrams or packets the concentrator dropped, by reason",
        &[
            reason("unknown_client", drops.unknown_client),
            reason("unknown_session", drops.unknown_session),
            reason("malformed", drops.malformed),
            reason("no_route", drops.no_route),
            reason("udp_send", extra.udp_send_drops),
            reason("tun_write", extra.tun_write_errors),
            reason("tun_full", extra.tun_full_drops),
            reason("tun_read", extra.tun.rx_dropped),
        ],
    );
    let mut out = String::new();
    if encode_text(&mut out, &root).is_err() {
        return "# encoding failed\n".into();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use braid_core::endpoint::{Config as EpConfig, Role};
    use braid_core::{Endpoint, LinkConfig};
    use std::time::Instant;

    #[test]
    fn encodes_per_link_and_bundle_series() {
        let text = "[bundle]\nname = \"b0\"\nrole = \"client\"\nkey = \"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\"\naddress = \"198.19.0.2/30\"\n\n[[link]]\nname = \"isp1\"\nbind = \"198.18.1.1\"\nremote = \"198.18.1.2:5050\"\n";
        let cfg = Config::parse(std::path::Path::new("t.toml"), text).unwrap();
        let now = Instant::now();
        use rand::SeedableRng;
        let mut ep = Endpoint::new(
            EpConfig::new(Role::Client, cfg.psk),
            now,
            Box::new(rand::rngs::StdRng::seed_from_u64(1)),
        )
        .unwrap();
        ep.add_link(
            now,
            1,
            LinkConfig {
                name: "isp1".into(),
                bandwidth_bps: Some(28800),
                priority: 0,
                download_bps: None,
            },
        )
        .unwrap();
        ep.send_packet(now, &[0x45; 60]); // no session yet: counted as a drop
        let out = encode(
            &cfg,
            &ep.stats(now),
            Extra {
                udp_send_drops: 3,
                tun_write_errors: 0,
                tun_full_drops: 0,
                tun: Default::default(),
                udp_rx: Default::default(),
                udp_opened_in_parallel: 7,
            },
        );
        for want in [
            "braid_link_tx_bytes_total{bundle=\"b0\",link=\"isp1\"} 0",
            "braid_link_bandwidth_bytes_per_second{bundle=\"b0\",link=\"isp1\"} 3600",
            "braid_link_state{bundle=\"b0\",link=\"isp1\",state=\"down\"}",
            "braid_drops_total{bundle=\"b0\",reason=\"no_session\"} 1",
            "braid_drops_total{bundle=\"b0\",reason=\"udp_send\"} 3",
            "braid_udp_opened_in_parallel_total{bundle=\"b0\"} 7",
            "braid_bundle_queued_total{bundle=\"b0\"} 0",
            "braid_bundle_queue_ce_marked_total{bundle=\"b0\"} 0",
            "braid_bundle_queue_depth{bundle=\"b0\"} 0",
            "braid_window_clamped_total{bundle=\"b0\"} 0",
            "braid_window_clamp_bytes{bundle=\"b0\"} 0",
            "braid_session_up{bundle=\"b0\"} 0",
            "braid_reorder_depth{bundle=\"b0\"} 0",
            "# TYPE braid_link_rtt_seconds gauge",
            "braid_build_info{version=",
            "# EOF",
        ] {
            assert!(out.contains(want), "missing {want:?} in\n{out}");
        }
    }
}
