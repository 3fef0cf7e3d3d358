//! Prints the simulator's TCP table (issue 10): one bulk TCP flow (CUBIC-like or BBR-like) over
//! each scenario's bundle, upload and download, against the best single link alone.
//!
//! `cargo run --release -p braid-core --example sim_tcp -- [OPTIONS]`
//!
//! Options (each selects; repeat `--scheduler` to compare):
//! - `--scenario N` (from 1, see `--list`) or `--scenario TEXT` (every name containing TEXT)
//! - `--link RATE/DELAY[/LOSS[/JITTER]]` (repeat; as `braid lab --link`, e.g. `20mbit/40ms/0%/30ms`):
//!   one scenario of these links instead, their rates configured (the lab's default), to carry
//!   a lab mix into the simulator
//! - `--cc cubic|bbr`, `--dir upload|download`
//! - `--scheduler NAME` (default `adaptive`; see `braid_core::sched::NAMES`)
//! - `--duration SECS`, `--warmup SECS`, `--seed N`, `--equalize-max MS` (delay equalisation
//!   bound; default 100 ms, not braid's 150: `sim::tcp::SIM_EQUALIZE_MAX`)
//! - `--backpressure` / `--no-backpressure`: both ends push back (or not) as `braid up` with
//!   `backpressure = true` (or `false`); default off (`sim::tcp::SIM_BACKPRESSURE`; braid's is on)
//! - `--no-single`: skip the single-link baseline runs (faster)
//! - `--start MS`: the inner flow starts this long after the bundle (default the scenario's,
//!   1000): earlier, it may start before either end has measured every link
//! - `--start-offset MS`: start the inner flow this much later (default 0). The runs are
//!   deterministic but chaotic: a shift of a millisecond can move a cell by 20 points, so judge
//!   a change over several offsets (`scripts/sim-ensemble.sh`), not by one run
//! - `--failover`: the failover scenarios (`sim::failover_scenarios`, a link going dark) instead
//! - `--list`: the scenarios and their links
//! - `--json`: one JSON report per line instead of the table

use std::process::ExitCode;
use std::time::Duration;

use braid_core::sim::{self, CcKind, Direction, LinkSpec, TcpReport, TcpScenario};

#[derive(Default)]
struct Opts {
    scenario: Option<String>,
    links: Vec<LinkSpec>,
    cc: Option<CcKind>,
    dir: Option<Direction>,
    schedulers: Vec<String>,
    duration: Option<Duration>,
    warmup: Option<Duration>,
    seed: Option<u64>,
    single: bool,
    list: bool,
    json: bool,
    failover: bool,
    equalize_max: Option<Duration>,
    backpressure: Option<bool>,
    start: Option<Duration>,
    start_offset: Duration,
}

fn secs(v: &str) -> Result<Duration, String> {
    v.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s > 0.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("not a positive number of seconds: {v:?}"))
}

/// A `--link` value, `RATE[/DELAY[/LOSS%[/JITTER]]]` as `braid lab` takes it
/// ([`braid_core::linkspec`]).
fn link(v: &str) -> Result<LinkSpec, String> {
    let spec: braid_core::linkspec::LinkSpec = v.parse().map_err(|e| format!("--link: {e}"))?;
    // Configured, as the lab tells braid its links' rates by default.
    Ok(LinkSpec::from(spec).configured())
}

/// `flag`'s value `v`: milliseconds from `lo` to `hi`, fractions allowed.
fn millis(flag: &str, v: &str, lo: u32, hi: u32) -> Result<Duration, String> {
    v.parse::<f64>()
        .ok()
        .filter(|ms| ms.is_finite() && (f64::from(lo)..=f64::from(hi)).contains(ms))
        .map(|ms| Duration::from_secs_f64(ms / 1e3))
        .ok_or_else(|| format!("{flag}: {v:?} (ms, {lo} to {hi})"))
}

fn parse(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        single: true,
        ..Opts::default()
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--scenario" => o.scenario = Some(value()?.clone()),
            "--link" => o.links.push(link(value()?)?),
            "--cc" => {
                let v = value()?;
                o.cc = Some(CcKind::parse(v).ok_or_else(|| format!("--cc: {v:?}: cubic or bbr"))?);
            }
            "--dir" => {
                let v = value()?;
                o.dir = Some(
                    Direction::parse(v)
                        .ok_or_else(|| format!("--dir: {v:?}: upload or download"))?,
                );
            }
            "--scheduler" => {
                let v = value()?;
                if !braid_core::sched::NAMES.contains(&v.as_str()) {
                    return Err(format!(
                        "--scheduler: {v:?}: one of {}",
                        braid_core::sched::NAMES.join(", ")
                    ));
                }
                o.schedulers.push(v.clone());
            }
            "--duration" => o.duration = Some(secs(value()?)?),
            "--warmup" => o.warmup = Some(secs(value()?)?),
            "--seed" => {
                let v = value()?;
                o.seed = Some(v.parse().map_err(|_| format!("--seed: {v:?}"))?);
            }
            "--equalize-max" => {
                let v = value()?;
                let ms: u64 = v
                    .parse()
                    .map_err(|_| format!("--equalize-max: {v:?} (ms)"))?;
                o.equalize_max = Some(Duration::from_millis(ms));
            }
            "--start" => o.start = Some(millis(a, value()?, 100, 10_000)?),
            "--start-offset" => o.start_offset = millis(a, value()?, 0, 1000)?,
            "--no-single" => o.single = false,
            "--list" => o.list = true,
            "--failover" => o.failover = true,
            "--backpressure" => o.backpressure = Some(true),
            "--no-backpressure" => o.backpressure = Some(false),
            "--json" => o.json = true,
            "-h" | "--help" => return Err(String::new()),
            _ => return Err(format!("unknown argument {a:?}")),
        }
    }
    if let (Some(d), Some(w)) = (o.duration, o.warmup) {
        if w >= d {
            return Err("--warmup must be shorter than --duration".to_string());
        }
    }
    Ok(o)
}

fn all_scenarios(o: &Opts) -> Vec<TcpScenario> {
    if o.failover {
        sim::failover_scenarios()
    } else {
        sim::tcp_scenarios()
    }
}

fn selected(o: &Opts) -> Result<Vec<TcpScenario>, String> {
    if !o.links.is_empty() {
        let name = o
            .links
            .iter()
            .map(|l| format!("{:.1}mbit/{:?}", l.rate_bps as f64 / 1e6, l.delay))
            .collect::<Vec<_>>()
            .join(" + ");
        return Ok(vec![TcpScenario::new(&name, o.links.clone())]);
    }
    let all = all_scenarios(o);
    let Some(want) = &o.scenario else {
        return Ok(all);
    };
    if let Ok(n) = want.parse::<usize>() {
        return all
            .get(n.wrapping_sub(1))
            .cloned()
            .map(|s| vec![s])
            .ok_or_else(|| format!("--scenario {n}: there are {} (from 1)", all.len()));
    }
    let picked: Vec<_> = all
        .into_iter()
        .filter(|s| s.name.contains(want.as_str()))
        .collect();
    if picked.is_empty() {
        return Err(format!(
            "--scenario {want:?}: no scenario name contains it (see --list)"
        ));
    }
    Ok(picked)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let o = match parse(&args) {
        Ok(o) => o,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("sim_tcp: {e}");
            }
            eprintln!("usage: sim_tcp [--scenario N|TEXT] [--link RATE/DELAY[/LOSS[/JITTER]]]... [--cc cubic|bbr] [--dir upload|download] [--scheduler NAME]... [--duration S] [--warmup S] [--seed N] [--equalize-max MS] [--backpressure|--no-backpressure] [--start MS] [--start-offset MS] [--no-single] [--failover] [--list] [--json]");
            return ExitCode::from(2);
        }
    };
    let scenarios = match selected(&o) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sim_tcp: {e}");
            return ExitCode::from(2);
        }
    };
    if o.list {
        for (i, s) in all_scenarios(&o).iter().enumerate() {
            println!("{}: {}: {:?}", i + 1, s.name, s.links);
        }
        return ExitCode::SUCCESS;
    }
    let schedulers = if o.schedulers.is_empty() {
        vec!["adaptive".to_string()]
    } else {
        o.schedulers.clone()
    };
    if !o.json {
        println!("{}", TcpReport::TABLE_HEADER);
    }
    for base in scenarios {
        for cc in CcKind::ALL
            .into_iter()
            .filter(|c| o.cc.is_none_or(|w| w == *c))
        {
            let mut sc = base.clone().cc(cc);
            if let Some(d) = o.duration {
                sc = sc.duration(d);
            }
            if let Some(w) = o.warmup {
                sc = sc.warmup(w);
            }
            if let Some(on) = o.backpressure {
                sc = sc.backpressure(on);
            }
            if let Some(d) = o.equalize_max {
                sc = sc.equalize_max(d);
            }
            if let Some(s) = o.seed {
                sc = sc.seed(s);
            }
            if let Some(start) = o.start {
                sc.start = start;
            }
            sc.start += o.start_offset;
            if sc.warmup >= sc.duration {
                eprintln!(
                    "sim_tcp: the warm-up ({:?}) must be shorter than the run ({:?})",
                    sc.warmup, sc.duration
                );
                return ExitCode::from(2);
            }
            // A lone link is alike both ways: one baseline per cc.
            let single = o.single.then(|| sim::best_single_link(&sc));
            for dir in Direction::ALL
                .into_iter()
                .filter(|d| o.dir.is_none_or(|w| w == *d))
            {
                for s in &schedulers {
                    let mut r = sim::run_tcp(&sc.clone().direction(dir).scheduler(s));
                    r.best_single = single.clone();
                    if o.json {
                        println!("{}", serde_json::to_string(&r).expect("report serializes"));
                    } else {
                        println!("{}", r.table_row());
                        if o.failover {
                            println!("  repair: {:?}", r.repair);
                        }
                    }
                }
            }
        }
    }
    ExitCode::SUCCESS
}
