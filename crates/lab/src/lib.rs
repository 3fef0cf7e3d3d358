//! `braid lab`: a private network in namespaces with emulated links, two braid endpoints, real
//! kernel TCP through them, and a report. Also the harness of the end-to-end tests and benchmarks.

#[derive(Debug, clap::Args)]
pub struct LabArgs {}

/// Hidden helper processes the lab starts inside its namespaces.
#[derive(Debug, clap::Subcommand)]
pub enum LabInternal {}

pub fn run_lab(_args: LabArgs) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}

pub fn run_internal(_cmd: LabInternal) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}
