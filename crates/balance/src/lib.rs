//! `braid balance`: a layer-4 load balancer (proxy and DSR modes). Policy lives in `braid-lb`.

#[derive(Debug, clap::Args)]
pub struct BalanceArgs {
    /// The balancer's TOML configuration.
    pub config: std::path::PathBuf,
}

/// `braid backend ...`: change the backends of a running balancer.
#[derive(Debug, clap::Subcommand)]
pub enum BackendCmd {}

pub fn run_balance(_args: BalanceArgs) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}

pub fn run_backend(_control: Option<std::path::PathBuf>, _cmd: BackendCmd) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}

/// Renders a balancer's `status` reply for humans.
pub fn render_status(_status: &serde_json::Value) -> String {
    String::new()
}

pub mod dsr;
