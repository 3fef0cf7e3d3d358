//! Runs one standard simulator scenario and prints its full report; with `BRAID_SIM_TRACE=1`
//! also a per-link trace (learned rate, delivery rate, reported and real queueing delay).
//!
//! `cargo run --release -p braid-core --example sim_one -- INDEX [SCHEDULER]`
fn main() {
    let mut args = std::env::args().skip(1);
    let i: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(0);
    let mut sc = braid_core::sim::standard_scenarios()[i].clone();
    if let Some(s) = args.next() {
        sc = sc.scheduler(&s);
    }
    let r = braid_core::sim::run(&sc);
    println!("{r:#?}");
}
