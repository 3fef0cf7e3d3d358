//! `braid up`: the bonding tunnel endpoint on Linux (TUN + one UDP socket per uplink), its
//! configuration, control socket commands and metrics. Drives `braid_core::Endpoint`.

/// `braid up` arguments.
#[derive(Debug, clap::Args)]
pub struct UpArgs {
    /// The endpoint's TOML configuration.
    pub config: std::path::PathBuf,
}

/// `braid link ...`: change the links of a running endpoint.
#[derive(Debug, clap::Subcommand)]
pub enum LinkCmd {}

pub fn run_up(_args: UpArgs) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}

pub fn run_link(_control: Option<std::path::PathBuf>, _cmd: LinkCmd) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}

/// Renders a tunnel's `status` reply for humans.
pub fn render_status(_status: &serde_json::Value) -> String {
    String::new()
}
