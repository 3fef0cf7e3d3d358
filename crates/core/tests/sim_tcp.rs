//! Scenario tests of issue 10 in the simulator: one bulk TCP flow (CUBIC-like and BBR-like
//! senders, `braid_core::sim::tcp`) over the bundle, upload and download, against the best
//! single link alone (the same flow over one bare link, without braid).
//!
//! The floors sit a little under what the current scheduler measures, so that they catch
//! regressions; the measured figures are in the comments and in BENCHMARKS.md §1
//! (`cargo run --release -p braid-core --example sim_tcp`). Each run is deterministic (seeded);
//! each check takes the median of five runs, each with its own seed and start offset ([`SEEDS`]).
//! Run in release: `cargo test --release -p braid-core --test sim_tcp`.

use std::time::Duration;

use braid_core::sim::{self, CcKind, Direction, LinkSpec, TcpScenario, WIRE_OVERHEAD};

/// What a bundle can deliver at most: payload over the tunnelled packet's wire size.
const BUNDLE_CEILING: f64 = sim::tcp::MSS as f64 / (sim::tcp::DATA_LEN + WIRE_OVERHEAD) as f64;

/// One expectation: (cc, direction, goodput floor as a share of the sum of the link rates,
/// floor of goodput over the best single link's).
type Want = (CcKind, Direction, f64, Option<f64>);

use CcKind::{Bbr, Cubic};
use Direction::{Download, Upload};

/// Seeds each scenario runs with; run `s` also starts the inner flow `s - 1` ms later. Jitter
/// and random loss make one run a draw: the same scenario gave 25-72% of the sum over six seeds
/// for LTE BBR download. And a run is chaotic even without them: a flow started a millisecond
/// later, or one more control packet per probe on a link, moved cells by up to 20 points
/// (10/20/50 Mbit/s CUBIC upload: 92.8% of the sum started on time, 69.7-69.9% started 1 to 7
/// ms later; BENCHMARKS.md §4, "The simulator is chaotic"), so the seed alone, which draws
/// nothing on a clean link, ran the same run five times. The floors hold the median of five.
const SEEDS: [u64; 5] = [1, 2, 3, 4, 5];

/// Seeds of a cell whose five-run median is itself a draw ([`failover_high_delay_mix`],
/// [`failover_mid_transfer`]); a run
/// there takes about 0.1 s.
const FAILOVER_SEEDS: [u64; 15] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];

/// The runs of [`SEEDS`], each with its start offset.
fn runs(sc: &TcpScenario) -> Vec<sim::TcpReport> {
    runs_of(sc, &SEEDS)
}

/// The runs of `seeds`, run `s` started `s - 1` ms late.
fn runs_of(sc: &TcpScenario, seeds: &[u64]) -> Vec<sim::TcpReport> {
    seeds
        .iter()
        .map(|&s| {
            let mut sc = sc.clone().seed(s);
            sc.start += Duration::from_millis(s - 1);
            sim::run_tcp(&sc)
        })
        .collect()
}

/// The run with the median goodput of [`SEEDS`] (each with its start offset).
fn median_run(sc: &TcpScenario) -> sim::TcpReport {
    median_goodput_run(runs(sc))
}

/// The run of `runs` with the median goodput.
fn median_goodput_run(mut runs: Vec<sim::TcpReport>) -> sim::TcpReport {
    runs.sort_by(|a, b| a.of_sum.total_cmp(&b.of_sum));
    runs.swap_remove(runs.len() / 2)
}

/// The median run of `sc` reaches `floor` of the sum, every link carrying more than
/// `min_share` of the data.
fn median_carries(sc: &TcpScenario, floor: f64, min_share: f64) {
    let r = median_run(sc);
    eprintln!("{}\n{}", sim::TcpReport::TABLE_HEADER, r.table_row());
    let what = format!("{} {}", sc.cc.name(), sc.direction.name());
    assert!(
        r.of_sum >= floor,
        "{what}: goodput {:.1}% of the sum < {:.0}%",
        r.of_sum * 100.0,
        floor * 100.0
    );
    assert!(
        r.links.iter().all(|l| l.share > min_share),
        "{what}: shares {:?}",
        r.links.iter().map(|l| l.share).collect::<Vec<_>>()
    );
}

/// The median of `f` over `runs`.
fn median(runs: &[sim::TcpReport], f: impl Fn(&sim::TcpReport) -> f64) -> f64 {
    let mut v: Vec<f64> = runs.iter().map(f).collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn check(index: usize, wants: &[Want]) {
    let base = sim::tcp_scenarios()[index].clone();
    for cc in CcKind::ALL {
        let sc = base.clone().cc(cc);
        let best = sim::best_single_link(&sc);
        for &(_, dir, min_of_sum, min_vs_best) in wants.iter().filter(|w| w.0 == cc) {
            let all = runs(&sc.clone().direction(dir));
            // The stall's median over the runs, as the goodput's (the median-goodput run's own
            // stall is one draw: 437 ms in the 1%-loss BBR upload once the model's RTO became
            // Linux's; the median over scripts/sim-ensemble.sh's six offsets is 166). The bound
            // catches a regression, not a draw: 50/20/7 Mbit/s BBR download sits at 377-380 ms
            // over twelve offsets (with the 16- and the 14-byte DATA header alike), and five
            // runs' median drew 419 once the packets were two bytes shorter. Since held packets
            // keep their link's pace (`equalize::Spacing`) its BBR upload's median is 473 ms
            // (the median run's 354 -> 605), where the lab's same mix (ratio7) stalled no longer
            // (BBR upload 203 -> 185 ms, BENCHMARKS.md §4, "A link's own pace through the hold").
            let stall = median(&all, |r| r.longest_stall_ms);
            let mut r = median_goodput_run(all);
            r.best_single = Some(best.clone());
            eprintln!("{}\n{}", sim::TcpReport::TABLE_HEADER, r.table_row());
            let what = format!("{} {} {}", r.name, cc.name(), dir.name());
            assert!(
                r.of_sum >= min_of_sum,
                "{what}: goodput {:.1}% of the sum < {:.1}%",
                r.of_sum * 100.0,
                min_of_sum * 100.0
            );
            assert!(
                r.of_sum <= BUNDLE_CEILING,
                "{what}: goodput {:.1}% of the sum is more than the links carry",
                r.of_sum * 100.0
            );
            if let Some(min) = min_vs_best {
                let vs = r.vs_best_single().expect("best single set");
                assert!(
                    vs >= min,
                    "{what}: {:.0}% of the best single link < {:.0}%",
                    vs * 100.0,
                    min * 100.0
                );
            }
            assert!(
                stall < 500.0,
                "{what}: delivery stalled {stall:.0} ms (median)"
            );
        }
    }
}

/// Measured: CUBIC 91.2% / 91.2%, BBR 90.1% / 90.1% of 6 Mbit/s (upload / download); the best
/// single link (3 Mbit/s) 2.90 (CUBIC) and 2.84 Mbit/s (BBR): the bundle 189-190% of it.
#[test]
fn one_two_three_mbit() {
    check(
        0,
        &[
            (Cubic, Upload, 0.89, Some(1.8)),
            (Cubic, Download, 0.89, Some(1.8)),
            (Bbr, Upload, 0.88, Some(1.8)),
            (Bbr, Download, 0.88, Some(1.8)),
        ],
    );
}

/// Measured, median of the five runs (start offsets 0-4 ms): CUBIC 69.8% / 85.7%, BBR 90.0% /
/// 90.2% of 80 Mbit/s; 116-150% of the 50 Mbit/s link alone. The CUBIC upload is 92.8% started
/// on time and 69.6-69.9% started 1-4 ms later (the floor of 83% held that one lucky run; the
/// lab gives 93%): a loss in slow start leaves the model's CUBIC a window it grows back over
/// the rest of the run, as wip/README.md describes ("sim-real-tcp-acks").
#[test]
fn ten_twenty_fifty_mbit() {
    check(
        1,
        &[
            (Cubic, Upload, 0.67, Some(1.1)),
            (Cubic, Download, 0.83, Some(1.35)),
            (Bbr, Upload, 0.87, Some(1.45)),
            (Bbr, Download, 0.87, Some(1.45)),
        ],
    );
}

/// Rate ratio 7:1, delay spread 140 ms. Measured (median of the five runs): CUBIC 83.6% /
/// 77.1% of 77 Mbit/s, BBR 80.6% / 82.1% (one run each before the start offsets: 73.9% / 77.0%,
/// 81.4% / 76.6%); the 7 Mbit/s 150 ms link, beyond the 100 ms equalisation bound, is hardly
/// used.
#[test]
fn wide_rate_and_delay_spread() {
    check(
        2,
        &[
            (Cubic, Upload, 0.63, Some(1.0)),
            (Cubic, Download, 0.63, Some(1.0)),
            (Bbr, Upload, 0.75, Some(1.2)),
            (Bbr, Download, 0.74, Some(1.2)),
        ],
    );
}

/// Two 20 Mbit/s links, 10 and 40 ms, 1% loss on the 10 ms one. The receiver asks for the
/// gaps of the lossy link's random losses (`Nack::RandomLoss`, the default) and the sender
/// resends them, so the inner TCP sees few of them: CUBIC 39.4% / 28.6% of the sum with 9 / 2
/// inner retransmissions (3.8% / 3.3% with ~20 before, when every loss reached it: 1% is under
/// the loss pull-back threshold, `sched::PULLBACK_LOSS`), BBR 68.4% / 70.3% (72.3% / 72.9%
/// before, with ~200 retransmissions). CUBIC is no longer loss-bound here but still under the
/// clean link alone (48%): see docs/scheduling.md, "Random loss".
#[test]
fn equal_rates_one_lossy() {
    check(
        3,
        &[
            (Cubic, Upload, 0.25, None),
            (Cubic, Download, 0.22, None),
            (Bbr, Upload, 0.64, Some(1.35)),
            (Bbr, Download, 0.63, Some(1.3)),
        ],
    );
}

/// The same scenario under the three NACK modes (`endpoint::Config::nack`). `Off`: the inner
/// TCP sees the link's losses. `RandomLoss` (the default): the receiver asks only for gaps in
/// which a link's own sequence numbers jumped while it had no queue, and the sender resends them
/// within its repair budget, so the inner TCP sees few of the link's losses. `Every` asks for
/// every gap. Measured: see the figures printed (BENCHMARKS.md §1).
#[test]
fn nack_repairs_random_loss() {
    use braid_core::endpoint::Nack;
    for dir in [Upload, Download] {
        let sc = sim::tcp_scenarios()[3].clone().cc(Cubic).direction(dir);
        let off = median_run(&sc.clone().nack(Nack::Off));
        let random = median_run(&sc.clone().nack(Nack::RandomLoss));
        let every = median_run(&sc.nack(Nack::Every));
        eprintln!(
            "{}\n{}\n{}\n{}",
            sim::TcpReport::TABLE_HEADER,
            off.table_row(),
            random.table_row(),
            every.table_row()
        );
        eprintln!(
            "random loss: {:?}\nevery gap: {:?}",
            random.repair, every.repair
        );
        assert!(
            random.of_sum >= 0.25 && random.of_sum >= 5.0 * off.of_sum,
            "{}: {:.1}% with NACK of random loss, {:.1}% without",
            dir.name(),
            random.of_sum * 100.0,
            off.of_sum * 100.0
        );
        assert!(random.repair.repaired >= 100, "{:?}", random.repair);
        assert_eq!(
            off.repair.repaired + off.repair.resent,
            0,
            "{:?}",
            off.repair
        );
    }
}

/// Failover on the default lab (1, 2, 3 Mbit/s, 10 ms): the 3 Mbit/s link goes dark mid-transfer.
/// What was in flight on it is reinjected by the sender when the link falls silent (nothing from
/// it for twice the longest gap between its packets lately, at least half its srtt and 50 ms, see
/// `Endpoint::silence_after`) or is declared DOWN, and the link is avoided from then on. With no
/// ring and no silence rule (`repair` off) CUBIC stalled 956 ms with 709 inner retransmissions.
#[test]
fn failover_mid_transfer() {
    for (cc, dir, backpressure) in CcKind::ALL
        .into_iter()
        .flat_map(|cc| [Upload, Download].map(|d| (cc, d)))
        .flat_map(|(cc, d)| [false, true].map(|bp| (cc, d, bp)))
    {
        let sc = sim::failover_scenarios()[0]
            .clone()
            .cc(cc)
            .direction(dir)
            .backpressure(backpressure);
        let rs = runs_of(&sc, &FAILOVER_SEEDS);
        eprintln!("{}", sim::TcpReport::TABLE_HEADER);
        for r in &rs {
            eprintln!(
                "{}\nback-pressure {backpressure}: {:?}",
                r.table_row(),
                r.repair
            );
        }
        // Measured, medians of the fifteen runs (CUBIC up / down, BBR up / down; the 14-byte
        // DATA header, 2026-11-30): 140 / 139 / 154 / 163 ms, with back-pressure 104 / 101 /
        // 48 / 58 ms; five runs' median drew 240 ms for CUBIC upload without back-pressure (its
        // runs: 100-652 ms), hence fifteen. Before, medians of five runs: 128 / 126 / 114
        // / 114 ms, with back-pressure 100 / 98 / 51 / 52 ms (2026-11-29: copies spread by
        // the queue put on each link, the room after a loss a round trip larger and a floor
        // after it; before, 157 / 165 / 140 / 101, with back-pressure 150 / 151 / 142 / 157). The first run alone, before the start offsets: 157 / 165 / 90 / 107 ms, with
        // back-pressure 232 / 214 / 132 / 101 ms. Before the likely lost packets were
        // reinjected first and late ones delivered (`Endpoint::reinject`, `reorder`):
        // 183 / 164 / 129 / 164, with back-pressure 201 / 219 / 214 / 164 ms. Before the silent link left the receiver's
        // reorder set at once (`Endpoint::refresh_reorder_links`; it stayed for a second, so
        // every gap waited for the hold time, which late copies had stretched to 200 ms):
        // 264 / 195 / 222 / 164, with back-pressure 352 / 282 / 309 / 185 ms. Before a busy
        // link's silence was read from the gaps between its packets
        // (`Endpoint::silence_after`): 384 / 314 / 323 / 495.
        let bound = 200.0;
        let stall = median(&rs, |r| r.longest_stall_ms);
        assert!(
            stall < bound,
            "{} {} back-pressure {backpressure}: stalled {stall:.0} ms (median)",
            cc.name(),
            dir.name(),
        );
        let retransmits = median(&rs, |r| r.retransmits as f64);
        assert!(
            retransmits <= 250.0,
            "{}: {retransmits} retransmits (median)",
            cc.name(),
        );
        for r in &rs {
            assert!(r.repair.resent + r.repair.reinjected > 0, "{:?}", r.repair);
        }
        // The two links left carry 3 Mbit/s: over the 7 s after warm-up, 3 s on 6 Mbit/s and 4 s
        // on 3, at least half of the 4.3 Mbit/s average.
        let goodput = median(&rs, |r| r.goodput_bps);
        assert!(
            goodput > 2.2e6,
            "{}: {:.2} Mbit/s (median)",
            cc.name(),
            goodput / 1e6
        );
    }
}

/// Two 10 Mbit/s links 100 ms apart in one-way delay (20 and 120 ms), rates configured: the
/// spread sits on the default equalisation bound. Measured, medians of the five runs: CUBIC
/// 69.9% / 65.6%, BBR 79.3% / 76.4% of the sum (upload / download; the first run alone 80.7% /
/// 68.5%, 79.3% / 80.7%). When a link
/// just beyond the bound was not waited for at all, a measured spread a hair above 100 ms left
/// the 120 ms link unused on upload (46-47%, the fast link alone), and in the lab the two ends
/// flipped between holding and not, which gave BBR RTT samples of 40 and 240 ms and 21% of the
/// sum (kernel MPTCP 86%). A link up to 1.25 x the bound slower is now waited for up to the
/// bound, less and less beyond (`sched::equalize_wait`). The stalls are not bounded here: BBR v1's
/// 2 x BDP at a 240 ms round trip overflows the 100 ms buffers and its recoveries stall 250-650
/// ms (the lab shows MPTCP retransmitting as much, BENCHMARKS.md §4).
///
/// CUBIC upload here is bimodal: over 16 start offsets (`sim_tcp --scenario 6 --cc cubic --dir
/// upload --no-single --start-offset 0..15`) 10 runs give 80.6-82.1% and 6 give 59.4-69.9%,
/// before and after the queue thresholds in packets (`sched::HIGH_PACKETS`), which flipped one
/// offset each way; the median of five lands in either mode (80.7% before, 69.9% after), so
/// its floor is under the low mode and still far above the 46-47% of the fast link alone.
#[test]
fn delay_spread_on_the_equalisation_bound() {
    let base = sim::tcp_scenarios()[5].clone();
    for (cc, dir, floor) in [
        (Cubic, Upload, 0.62),
        (Cubic, Download, 0.63),
        (Bbr, Upload, 0.74),
        (Bbr, Download, 0.75),
    ] {
        // Both links carry data.
        median_carries(&base.clone().cc(cc).direction(dir), floor, 0.15);
    }
}

/// The flow begins 400 ms into the session (the lab's downloads begin about then), before the
/// sender has the peer's report of the 120 ms link's delay (its own measurement of the other
/// direction it has by 160-280 ms). Its view of the peer's hold counted that link as fast as
/// the other until the report came, its ramp took the hold without the link as the flows' round
/// trip, and the link's 100 ms hold then came in steps 11 s apart: the 120 ms link carried
/// nothing, and the flow got 26-35% of the sum with CUBIC, less than the 20 ms link alone (BBR
/// 64-87%: its own rate probing found the link). Medians of the five runs now (CUBIC up /
/// down, BBR up / down): 82.1 / 65.9 / 85.9 / 84.8% (before: 34.3 / 26.0 / 78.8 / 75.7%), both
/// links carrying a third or more (`Endpoint::new_in_hold_view`).
#[test]
fn a_flow_begun_before_the_slow_link_is_measured_still_uses_it() {
    let mut base = sim::tcp_scenarios()[5].clone();
    base.start = Duration::from_millis(400);
    for (cc, dir, floor) in [
        (Cubic, Upload, 0.70),
        (Cubic, Download, 0.58),
        (Bbr, Upload, 0.80),
        (Bbr, Download, 0.80),
    ] {
        median_carries(&base.clone().cc(cc).direction(dir), floor, 0.25);
    }
}

/// A link whose way back falls quiet for 0.4 s under a transfer (10 Mbit/s at 20 and 120 ms,
/// rates configured, braid's back-pressure and bound): the data's sender hears nothing on it
/// while the other link speaks, and takes it for silent, as it did in the lab when a BBR
/// download's PROBE_RTT stopped what the receiver sent back on the slow link. The link must
/// keep its place once it speaks again. Before, the sender's view of the peer's hold fell to
/// none and climbed back by steps, the slow link left out meanwhile (lab: 69.6% of the sum
/// over 60 s), and the bundle's queue, whose round trip took the sender's own receive hold,
/// dropped all it held at once (simulator: 20-24% of the sum, the flow standing 10 s).
#[test]
fn a_link_silent_for_a_moment_keeps_its_place() {
    let ms = Duration::from_millis;
    let links = vec![
        LinkSpec::new(10_000_000, ms(20)).configured(),
        LinkSpec::new(10_000_000, ms(120)).configured(),
    ];
    let base = TcpScenario::new("2x10 Mbit/s, 20/120 ms", links)
        .backpressure(true)
        .equalize_max(braid_core::endpoint::DEFAULT_EQUALIZE_MAX)
        .duration(Duration::from_secs(30))
        .warmup(Duration::from_secs(14));
    for cc in CcKind::ALL {
        for dir in [Upload, Download] {
            let sc = base.clone().cc(cc).direction(dir);
            // The way back: what the data's receiver sends.
            let back = match dir {
                Upload => sim::net::Side::Server,
                Download => sim::net::Side::Client,
            };
            let quiet = sc
                .clone()
                .event(Duration::from_secs(12), sim::LinkEvent::Mute(1, back))
                .event(ms(12_400), sim::LinkEvent::Light(1));
            let (calm, hushed) = (median_run(&sc), median_run(&quiet));
            eprintln!("{}\n{}", calm.table_row(), hushed.table_row());
            assert!(
                hushed.of_sum > calm.of_sum - 0.03,
                "{} {}: {:.1}% after the quiet spell, {:.1}% without",
                cc.name(),
                dir.name(),
                hushed.of_sum * 100.0,
                calm.of_sum * 100.0
            );
            assert!(hushed.links[1].share > 0.35, "{}", hushed.table_row());
        }
    }
}

/// ECN (RFC 3168) through the failover of [`failover_mid_transfer`], back-pressure on: a CUBIC
/// flow that negotiated it is told of the overshoot after the 3 Mbit/s link goes dark by marks
/// in the bundle's queue (`bqueue`: at half the limit, before the limit's drop), so it backs off
/// with no hole to wait for and nothing to send again. A BBR flow (v1 ignores ECN) meets the
/// same drops as without.
#[test]
fn ecn_failover_backs_off_without_loss() {
    let base = sim::failover_scenarios()[0].clone().backpressure(true);
    for cc in CcKind::ALL {
        for dir in [Upload, Download] {
            let sc = base.clone().cc(cc).direction(dir);
            let (off, on) = (runs(&sc), runs(&sc.clone().ecn(true)));
            for r in off.iter().chain(&on) {
                eprintln!(
                    "{} | ce reductions {} marked {} dropped {}",
                    r.table_row(),
                    r.ce_reductions,
                    r.repair.queue_marked,
                    r.repair.queue_dropped
                );
            }
            let total = |rs: &[sim::TcpReport], f: fn(&sim::TcpReport) -> u64| -> u64 {
                rs.iter().map(f).sum()
            };
            let what = format!("{} {}", cc.name(), dir.name());
            assert_eq!(
                total(&off, |r| r.repair.queue_marked),
                0,
                "{what}: marks without ECN"
            );
            assert!(
                total(&on, |r| r.repair.queue_marked) > 0,
                "{what}: no marks"
            );
            let goodput = |rs: &[sim::TcpReport]| median(rs, |r| r.of_sum);
            assert!(
                goodput(&on) > goodput(&off) - 0.02,
                "{what}: ECN cost goodput"
            );
            if cc == Cubic {
                let (re_off, re_on) = (
                    total(&off, |r| r.retransmits),
                    total(&on, |r| r.retransmits),
                );
                assert!(
                    re_on * 3 < re_off,
                    "{what}: {re_on} retransmitted with ECN, {re_off} without"
                );
                assert!(
                    total(&on, |r| r.ce_reductions) > 0,
                    "{what}: never backed off for a mark"
                );
                let (st_off, st_on) = (
                    median(&off, |r| r.longest_stall_ms),
                    median(&on, |r| r.longest_stall_ms),
                );
                assert!(
                    st_on < st_off,
                    "{what}: stall {st_on:.0} ms with ECN, {st_off:.0} without"
                );
            }
        }
    }
}

/// Failover on a high-delay mix (2 x 10 Mbit/s, 20 and 120 ms one way), either link dark, CUBIC
/// both ways, no rates configured. This cell is chaotic (one run's inner window before the
/// failure decides whether the link left overflows after it: 106 to 4624 retransmissions over
/// the start offsets of one build), so it takes the median of [`FAILOVER_SEEDS`], not of five.
/// Measured, medians of the fifteen runs, with the 14-byte DATA header (wire version 3): the 20
/// ms link dark: stall 439 / 243 ms, 105 / 137 inner retransmissions (upload / download; the
/// worst 159 / 287); the 120 ms link dark: 434 / 233 ms, 303 / 621 (the worst 552 / 1040). With
/// the 16-byte header and the same code otherwise: 425 / 332 ms, 77 / 126 (the worst 383 /
/// 350); 425 / 402 ms, 269 / 448 (the worst 2949 / 1354): two bytes fewer a packet moved the
/// cell as a start offset does, its downloads' stalls shorter, its retransmissions more. Earlier:
/// the 20 ms link dark: stall 425 / 332 ms, 77 / 126; the 120 ms link dark: 370 / 402 ms,
/// 178 / 430 (the worst 4624 / 2683). Before the queue a report gives after a silence
/// was the last packet's own (`LinkHealth::reported_qdelay`): 429 / 332 ms, 77 / 133; 429 /
/// 383 ms, 183 / 436; the medians of the first five alone moved 265 -> 493 and 474 -> 593
/// retransmissions with it, over the same fifteen 183 -> 178 and 436 -> 430 (BENCHMARKS.md §1,
/// "Failover scenarios in the simulator"). Before the likely lost packets were reinjected first
/// and late ones delivered (`Endpoint::reinject`, `reorder`), five runs: 636 / 420 ms and 445
/// / 275 ms; earlier still 718 / 744 and 483 / 490 ms. Above issue 10's 300 ms: the bounds
/// catch regressions only; the lab is in BENCHMARKS.md §4. BBR's figures are not bounded here.
#[test]
fn failover_high_delay_mix() {
    // The scenarios darken link 0 (20 ms), then link 1 (120 ms).
    for (dark, sc) in sim::failover_scenarios()[1..].iter().enumerate() {
        for dir in [Upload, Download] {
            let rs = runs_of(&sc.clone().cc(Cubic).direction(dir), &FAILOVER_SEEDS);
            eprintln!("{}", sim::TcpReport::TABLE_HEADER);
            for r in &rs {
                eprintln!("{}\n{:?}", r.table_row(), r.repair);
            }
            let what = format!("{} {}", sc.name, dir.name());
            let stall = median(&rs, |r| r.longest_stall_ms);
            assert!(stall < 700.0, "{what}: stalled {stall:.0} ms (median)");
            let retransmits = median(&rs, |r| r.retransmits as f64);
            assert!(
                retransmits <= 700.0,
                "{what}: {retransmits} retransmits (median)"
            );
            // What the dead link carried is sent again (if it carried anything: upload may
            // leave the 120 ms link all but unused: 1-3% of the packets, probes and a trickle,
            // since held packets keep their link's pace, where it carried 6-15% before, and a
            // run may then have nothing in flight on it when it goes dark).
            for r in &rs {
                assert!(
                    r.links[dark].share < 0.04 || r.repair.resent + r.repair.reinjected > 0,
                    "{what}: {:?}",
                    r.repair
                );
            }
        }
    }
}

/// LTE-like 30 Mbit/s, 30 ms +-20 ms jitter, with a 10 Mbit/s 15 ms DSL link. Median of seeds 1-5
/// (with the start offsets): CUBIC 80.7% / 80.5%, BBR 87.4% / 88.7% (upload / download),
/// 1.26-1.46x the LTE link alone (80.5% / 80.3%, 88.8% / 89.0% without the offsets).
/// Before the base one-way delay became the minimum of the *smoothed* delay (health.rs), the
/// jitter read as a standing queue of about 20 ms, the LTE link was backed off, and the medians
/// were 49.2% / 40.1% and 60.7% / 52.8%, below the LTE link alone.
#[test]
fn jittery_lte_and_dsl() {
    check(
        4,
        &[
            (Cubic, Upload, 0.77, Some(1.15)),
            (Cubic, Download, 0.77, Some(1.15)),
            (Bbr, Upload, 0.84, Some(1.15)),
            (Bbr, Download, 0.84, Some(1.15)),
        ],
    );
}

/// The model itself: over one clean link without braid, both senders fill the link (payload
/// at most 1448/1500 = 96.5% of the rate), with no timeout, whatever the link's size and delay.
#[test]
fn tcp_model_fills_a_single_link() {
    let ms = Duration::from_millis;
    for link in [
        LinkSpec::new(3_000_000, ms(10)),
        LinkSpec::new(50_000_000, ms(40)),
        LinkSpec::new(20_000_000, ms(60)),
    ] {
        for cc in CcKind::ALL {
            let sc = TcpScenario::new("single", vec![link.clone()]).cc(cc);
            let r = sim::run_tcp_single(&sc, 0);
            eprintln!("{:?} {}", link.rate_bps, r.table_row());
            assert!(
                r.of_sum >= 0.90,
                "{} over {} Mbit/s {:?}: {:.1}% of the link",
                cc.name(),
                link.rate_bps / 1_000_000,
                link.delay,
                r.of_sum * 100.0
            );
            assert!(r.of_sum <= 1448.0 / 1500.0 + 1e-3, "{r:?}");
            assert_eq!(r.rtos, 0, "{r:?}");
        }
    }
}

/// The model's BBR keeps its rate through PROBE_RTT, as Linux's does: PROBE_RTT's samples (four
/// segments a round) are marked application-limited and kept out of the bandwidth filter. Two
/// 20 Mbit/s links at 10 ms through braid, measured from 10 to 30 s (PROBE_RTT about 11 and 21 s
/// in). When the model took those samples, PROBE_RTT's 200 ms (ten rounds at that round trip)
/// aged the maximum out of the ten-round window and the flow climbed back from four segments
/// a round at 1.25 x per gain cycle: about 2 s at a fraction of the rate.
#[test]
fn tcp_model_bbr_keeps_its_rate_through_probe_rtt() {
    let ms = Duration::from_millis;
    let links = vec![
        LinkSpec::new(20_000_000, ms(10)),
        LinkSpec::new(20_000_000, ms(10)),
    ];
    let sc = TcpScenario::new("2x20 Mbit/s, 10 ms, 30 s", links)
        .cc(Bbr)
        .backpressure(true)
        .equalize_max(braid_core::endpoint::DEFAULT_EQUALIZE_MAX)
        .duration(Duration::from_secs(30))
        .warmup(Duration::from_secs(10));
    for r in runs(&sc) {
        eprintln!("{}", r.table_row());
        assert!(r.of_sum > 0.88, "{}", r.table_row());
    }
}

/// Random loss on a bare link: every loss is repaired by a retransmission (RACK, not the
/// timer), and CUBIC, being loss-based, slows down where BBR does not.
#[test]
fn tcp_model_repairs_random_loss() {
    let link = LinkSpec::new(20_000_000, Duration::from_millis(20)).loss(0.01);
    let cubic = sim::run_tcp_single(&TcpScenario::new("lossy", vec![link.clone()]), 0);
    let bbr = sim::run_tcp_single(&TcpScenario::new("lossy", vec![link]).cc(Bbr), 0);
    eprintln!("{}\n{}", cubic.table_row(), bbr.table_row());
    for r in [&cubic, &bbr] {
        // 1% of the data segments, and of the ACKs: retransmissions near 1% of what was sent.
        let sent = r.goodput_bps * 15.0 / (1448.0 * 8.0);
        let share = r.retransmits as f64 / sent;
        assert!((0.005..0.02).contains(&share), "{share:.4}: {r:?}");
        assert!(r.rtos <= 1, "{r:?}");
    }
    assert!(bbr.of_sum > 0.85, "{bbr:?}");
    assert!(cubic.of_sum < 0.8 * bbr.of_sum, "{cubic:?}");
}

#[test]
fn tcp_runs_are_deterministic() {
    let sc = sim::tcp_scenarios()[3]
        .clone()
        .cc(Bbr)
        .duration(Duration::from_secs(8))
        .warmup(Duration::from_secs(3));
    let a = sim::run_tcp(&sc);
    let b = sim::run_tcp(&sc);
    assert_eq!(a.table_row(), b.table_row());
    assert!(a.goodput_bps > 0.0);
}

/// Back-pressure (`backpressure = true`, docs/scheduling.md): with every link full the traffic
/// waits before the bundle instead of overflowing the links' buffers. On the 20/120 ms mix BBR v1
/// keeps twice a 240 ms round trip's worth in flight, which overflows the 100 ms buffers: 3415
/// inner retransmissions in the upload without, 0 with, and 79% -> 89% of the sum (CUBIC
/// download 68% -> 86%). Measured with `sim_tcp --no-single [--backpressure] --scenario 6`; the
/// medians of the five runs: BBR upload 79.3% (2469) -> 88.6% (0), CUBIC download 65.6% (15)
/// -> 85.6% (7). Since the placement counts the queue the equalisation floor hides
/// (`sched::HIDDEN_QUEUE_WEIGHT`): BBR upload 89.7% (605) -> 91.1% (1), CUBIC download 65.8%
/// (18) -> 85.4% (6). Since held packets keep their link's pace (`equalize::Spacing`): BBR
/// upload 90.1% (855) -> 90.7% (123), CUBIC download 89.5% (5) -> 94.2% (2).
#[test]
fn back_pressure_keeps_the_links_from_overflowing() {
    let base = sim::tcp_scenarios()[5].clone();
    for (cc, dir) in [(Bbr, Upload), (Cubic, Download)] {
        let sc = base.clone().cc(cc).direction(dir);
        let off = runs(&sc.clone().backpressure(false));
        let on = runs(&sc.clone().backpressure(true));
        eprintln!("{}", sim::TcpReport::TABLE_HEADER);
        for r in off.iter().chain(&on) {
            eprintln!("{}", r.table_row());
        }
        let retransmits = |rs: &[sim::TcpReport]| median(rs, |r| r.retransmits as f64);
        // The overflow to avoid: BBR's window overflows the links without back-pressure (447-972
        // inner retransmissions). The CUBIC download no longer does since held packets keep
        // their link's pace (`equalize::Spacing`): its slow start sees the bottleneck's queue
        // grow and ends before the links' buffers overflow (4-26 retransmissions, 85.5-90.3% of
        // the sum without back-pressure where it was 15-18 at 65.6-65.8%; 94.2% with it).
        if dir == Upload {
            assert!(
                retransmits(&off) > 10.0,
                "{} {}: the overflow to avoid",
                cc.name(),
                dir.name()
            );
        }
        // The links' buffers drop nothing; what the inner flow loses is the bundle queue's own
        // limit (one head drop per round trip beyond it, the signal a CUBIC flow needs: 6-8 in
        // the download since that limit works, 0 while it was switched off by a link never
        // counted as learned).
        let link_drops = median(&on, |r| {
            r.links.iter().map(|l| l.queue_drops).sum::<u64>() as f64
        });
        assert_eq!(link_drops, 0.0, "{} {}", cc.name(), dir.name());
        // Nor is much else lost: past what the queue drops on purpose, the inner flow resends
        // less than the overflow cost it. Since a standing queue's limit is cut to one round
        // trip (`bqueue::Standing`), that cut drops 290-320 packets at once in the CUBIC
        // download here and 120-135 in the BBR upload (retransmissions 6 -> about 300 and 1 ->
        // about 125; beyond the queue's drops 12 and 0), for shorter stalls (761-779 -> 512-521
        // ms and 316-518 -> 240-248 ms) at the same goodput (85.4% and 91.1% medians).
        let beyond_queue = |rs: &[sim::TcpReport]| {
            median(rs, |r| {
                r.retransmits.saturating_sub(r.repair.queue_dropped) as f64
            })
        };
        assert!(
            beyond_queue(&on) < retransmits(&off),
            "{} {}: {} -> {} inner retransmissions beyond the queue's drops (medians)",
            cc.name(),
            dir.name(),
            retransmits(&off),
            beyond_queue(&on)
        );
        // Goodput: at least what the links give without it (BBR's upload gained 10 points here
        // until the placement counted the queue the equalisation floor hides, which took the
        // run without back-pressure from 79% to 90%: the probes it lost in the 20 ms link's
        // hidden queue now reach the 120 ms link).
        let (off, on) = (median(&off, |r| r.of_sum), median(&on, |r| r.of_sum));
        assert!(
            on >= off,
            "{} {}: {:.1}% -> {:.1}% of the sum (medians)",
            cc.name(),
            dir.name(),
            off * 100.0,
            on * 100.0
        );
    }
}

/// Back-pressure on a jittery link (docs/scheduling.md, "Back-pressure"): the LTE link's +-20 ms
/// of jitter reads as 10-20 ms of queue at any load. With its rate learned from queue readings
/// it backed off once and, offered no more than that rate, never rose again: the bundle carried
/// 27-45% of the sum. A held link's rate is the most it delivered lately, probed 25% above now
/// and then (`sched::Held`): 78-83%, about as without back-pressure (80-87%), and no overflow.
/// Measured with `sim_tcp --no-single --backpressure --scenario LTE` (seeds 1-3; the medians of
/// the five runs now: CUBIC upload 80.5%, 5 retransmissions, BBR download 83.8%, 0). CUBIC keeps
/// the bundle's queue full until it loses a packet there (`crate::bqueue`: one drop per inner
/// round trip once packets wait beyond the limit; 13 in this run).
#[test]
fn back_pressure_keeps_a_jittery_link_in_use() {
    let base = sim::tcp_scenarios()[4].clone();
    for (cc, dir) in [(Cubic, Upload), (Bbr, Download)] {
        let rs = runs(&base.clone().cc(cc).direction(dir).backpressure(true));
        eprintln!("{}", sim::TcpReport::TABLE_HEADER);
        for r in &rs {
            eprintln!("{}", r.table_row());
        }
        let of_sum = median(&rs, |r| r.of_sum);
        assert!(
            of_sum >= 0.70,
            "{} {}: {:.1}% of the sum (median)",
            cc.name(),
            dir.name(),
            of_sum * 100.0
        );
        let most = if cc == Cubic { 50.0 } else { 0.0 };
        let retransmits = median(&rs, |r| r.retransmits as f64);
        assert!(
            retransmits <= most,
            "{} {}: {retransmits} retransmits (median)",
            cc.name(),
            dir.name(),
        );
    }
}

/// A slower link coming (back) up during a transfer lengthens the inner round trip by the
/// equalisation hold it calls for (`braid_core::equalize`). All at once, a flow sized for the
/// old round trip fell far below what the fast link alone gave it: 50 Mbit/s at 10 ms, then 20
/// Mbit/s at 60 ms from 1.5 s, the 3-12 s window: CUBIC 26-29 Mbit/s, BBR 0.5-8 (it spirals to
/// its 4-packet floor: its window is twice its bandwidth x its *minimum* round trip, kept 10 s).
/// With the hold growing by steps the flow keeps the fast link's rate meanwhile.
#[test]
fn a_link_coming_up_mid_transfer_does_not_drag_the_flow_down() {
    let ms = Duration::from_millis;
    let links = || {
        vec![
            LinkSpec::new(50_000_000, ms(10)).configured(),
            LinkSpec::new(20_000_000, ms(60)).configured(),
        ]
    };
    for (cc, dir) in CcKind::ALL
        .into_iter()
        .flat_map(|cc| [Upload, Download].map(|d| (cc, d)))
    {
        let sc = TcpScenario::new("50/10 ms, then 20/60 ms from 1.5 s", links())
            .cc(cc)
            .direction(dir)
            .duration(Duration::from_secs(12))
            .warmup(Duration::from_secs(3))
            .event(ms(1), sim::LinkEvent::Dark(1))
            .event(ms(1500), sim::LinkEvent::Light(1));
        let rs = runs(&sc);
        let fast = sim::run_tcp_single(&sc, 0).goodput_bps;
        let got = median(&rs, |r| r.goodput_bps);
        eprintln!(
            "{cc:?} {dir:?}: {:.1} Mbit/s (fast link alone {:.1}); runs {:?}",
            got / 1e6,
            fast / 1e6,
            rs.iter()
                .map(|r| (r.goodput_bps / 1e5).round() / 10.0)
                .collect::<Vec<_>>()
        );
        // Measured (median of the five runs, all four cells): CUBIC 46.4 Mbit/s of the fast
        // link's 48.3 alone, BBR 23.4-23.7 of 47.8. BBR keeps only half here because this
        // model's ACKs are held for equalisation as its segments are (wip/README.md,
        // `sim-real-tcp-acks.patch`): each step lengthens its round trip twice as much as a
        // real TCP's, whose pure ACKs are not held. With that patch applied: 42-46 Mbit/s, and
        // the sum (65) from about 27 s (`examples/sim_join.rs`); the lab's figure with Linux's
        // BBR is in BENCHMARKS.md §4 ("A link coming back").
        let floor = match cc {
            Cubic => 0.9,
            Bbr => 0.4,
        };
        assert!(
            got > floor * fast,
            "{cc:?} {dir:?}: {:.1} Mbit/s, the fast link alone {:.1}",
            got / 1e6,
            fast / 1e6
        );
    }
}

/// A link pulled back for its loss comes back once the loss falls: 2 x 20 Mbit/s at 10 ms, the
/// second losing 10% until 4 s and 1.5% from then on (below the pull-back's 5%, where NACK
/// repair makes it worth its capacity). Its probes alone measure it meanwhile, and it returns
/// once their loss has stayed under 5% for `sched::PULLBACK_HOLD` (5 s): every run of both
/// senders puts a fair share on it from 12 s on, with the links' rates configured (as the
/// lab's are) or not. Unconfigured, its rate is measured again on its return
/// (`sched::AdaptiveLink::explores`): before that, a BBR flow running on the first link never
/// spread onto it, its rate a guess of 1 Mbit/s (18.4 Mbit/s, 100/0, in all five runs).
#[test]
fn a_link_whose_loss_falls_comes_back() {
    let ms = Duration::from_millis;
    for configured in [true, false] {
        let link = |loss: f64| {
            let l = LinkSpec::new(20_000_000, ms(10)).loss(loss);
            if configured {
                l.configured()
            } else {
                l
            }
        };
        let sc = TcpScenario::new(
            "2x20 Mbit/s, 10 ms, one losing 10% until 4 s, 1.5% since",
            vec![link(0.0), link(0.10)],
        )
        .duration(Duration::from_secs(20))
        .warmup(Duration::from_secs(12))
        .event(Duration::from_secs(4), sim::LinkEvent::Loss(1, 0.015));
        for cc in CcKind::ALL {
            // Held back while it loses 10% (2-4 s)...
            let early = sc.clone().cc(cc).duration(Duration::from_secs(4));
            for r in runs(&early.warmup(Duration::from_secs(2))) {
                assert!(r.links[1].share < 0.05, "not held back: {}", r.table_row());
            }
            // ...and back from 12 s on.
            for r in runs(&sc.clone().cc(cc)) {
                eprintln!("configured {configured}: {}", r.table_row());
                assert!(r.links[1].share > 0.35, "not back: {}", r.table_row());
            }
        }
    }
}

/// A link down when a BBR flow began, coming up 4 s into it (2 x 20 Mbit/s at 10 ms, rates
/// not configured, braid's back-pressure and bound): its rate, never measured, is measured then
/// (`sched::AdaptiveLink::explores`), and the flow spreads onto it. Before, the flow stayed on
/// the first link (18.4 Mbit/s, 100/0, in all five runs); now 35.8-36.1 Mbit/s (89-90% of the
/// sum), the second link carrying half from 12 s on, near a flow that had both links from its
/// start (36.7, 92%). (27.6-28.0 until the simulator's BBR ignored PROBE_RTT's low rate samples
/// as Linux does: its PROBE_RTT at 16 s, inside the measured window, cost about 2 s.)
#[test]
fn a_link_that_comes_up_under_a_bbr_flow_is_measured() {
    let ms = Duration::from_millis;
    let links = vec![
        LinkSpec::new(20_000_000, ms(10)),
        LinkSpec::new(20_000_000, ms(10)),
    ];
    let sc = TcpScenario::new("2x20 Mbit/s, 10 ms, the second up at 4 s", links)
        .cc(Bbr)
        .backpressure(true)
        .equalize_max(braid_core::endpoint::DEFAULT_EQUALIZE_MAX)
        .duration(Duration::from_secs(20))
        .warmup(Duration::from_secs(12))
        .event(ms(1), sim::LinkEvent::Dark(1))
        .event(Duration::from_secs(4), sim::LinkEvent::Light(1));
    for r in runs(&sc) {
        eprintln!("{}", r.table_row());
        assert!(r.links[1].share > 0.4, "not used: {}", r.table_row());
        assert!(r.of_sum > 0.85, "{}", r.table_row());
    }
}
