//! Prints the simulator's scenario table (the one in BENCHMARKS.md).
//!
//! `cargo run --release -p braid-core --example sim_table [SCHEDULER...]`: with no argument, the
//! standard scenarios with their own schedulers; with names, every standard scenario under each.

use braid_core::sim;

fn main() {
    let scheds: Vec<String> = std::env::args().skip(1).collect();
    println!("{}", sim::Report::TABLE_HEADER);
    for sc in sim::standard_scenarios() {
        if scheds.is_empty() {
            println!("{}", sim::run(&sc).table_row());
        } else {
            for s in &scheds {
                println!("{}", sim::run(&sc.clone().scheduler(s)).table_row());
            }
        }
    }
}
