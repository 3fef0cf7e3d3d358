//! A slower link coming up during a transfer (`braid_core::equalize`): one bulk TCP flow over
//! 50 Mbit/s at 10 ms, with 20 Mbit/s at 60 ms dark from the start and lit at `--join MS` (0:
//! both from the start); prints the goodput of 3-second windows over 42 s, each window its own
//! run of the simulator.
//!
//! `cargo run --release -p braid-core --example sim_join -- [--join MS] [--cc cubic|bbr]
//! [--dir upload|download] [--backpressure]`
use std::time::Duration;

use braid_core::sim::{CcKind, Direction, LinkEvent, LinkSpec, TcpScenario};

fn main() -> Result<(), String> {
    let mut join = 1500u64;
    let (mut cc, mut dir, mut bp) = (CcKind::Bbr, Direction::Upload, false);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--join" => join = value()?.parse().map_err(|e| format!("--join: {e}"))?,
            "--cc" => cc = CcKind::parse(&value()?).ok_or("--cc: cubic or bbr")?,
            "--dir" => dir = Direction::parse(&value()?).ok_or("--dir: upload or download")?,
            "--backpressure" => bp = true,
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    let ms = Duration::from_millis;
    for from in (3..=39).step_by(6) {
        let links = vec![
            LinkSpec::new(50_000_000, ms(10)).configured(),
            LinkSpec::new(20_000_000, ms(60)).configured(),
        ];
        let mut sc = TcpScenario::new("join", links)
            .cc(cc)
            .direction(dir)
            .backpressure(bp)
            .duration(Duration::from_secs(from + 3))
            .warmup(Duration::from_secs(from));
        if join > 0 {
            sc = sc
                .event(ms(1), LinkEvent::Dark(1))
                .event(ms(join), LinkEvent::Light(1));
        }
        let r = braid_core::sim::run_tcp(&sc);
        println!(
            "{from:2}-{:2} s: {:5.1} Mbit/s, {} retransmitted",
            from + 3,
            r.goodput_bps / 1e6,
            r.retransmits
        );
    }
    Ok(())
}
