//! `braid up`: the bonding tunnel endpoint on Linux (TUN + one UDP socket per uplink), its
//! configuration, control socket commands and metrics. Drives `braid_core::Endpoint`.
//!
//! - [`config`]: the TOML file, validated into [`config::Config`];
//! - [`runner`]: the event loop (mio) around the core, and the control commands it answers;
//! - [`metrics`]: Prometheus encoding of the core's statistics;
//! - [`status`]: `braid status` for humans.

pub mod config;
pub mod control;
pub mod metrics;
pub mod runner;
pub mod status;

use std::path::PathBuf;

use serde_json::json;

pub use status::render_status;

/// `braid up` arguments.
#[derive(Debug, clap::Args)]
pub struct UpArgs {
    /// The endpoint's TOML configuration.
    pub config: std::path::PathBuf,
}

/// `braid link ...`: change the links of a running endpoint.
#[derive(Debug, clap::Subcommand)]
pub enum LinkCmd {
    /// Add an uplink to a running client (a new UDP socket; the tunnel stays up).
    Add {
        /// Name of the new link (unique in the bundle).
        name: String,
        /// Send through this interface (SO_BINDTODEVICE).
        #[arg(long, required_unless_present = "bind")]
        dev: Option<String>,
        /// Send from this local address (ADDRESS or ADDRESS:PORT).
        #[arg(long)]
        bind: Option<String>,
        /// The server's address over this uplink (default: the first configured link's remote).
        #[arg(long, value_name = "HOST:PORT")]
        remote: Option<String>,
        /// Estimated bandwidth, bit/s.
        #[arg(long, value_name = "BPS")]
        bandwidth: Option<u64>,
        /// Priority (used by the `backup` scheduler; higher is preferred).
        #[arg(long, value_name = "N")]
        priority: Option<u8>,
    },
    /// Remove a link (its socket is closed; traffic moves to the other links).
    Remove {
        /// Name of the link.
        name: String,
    },
    /// Change a link's configured bandwidth or priority (give one or both).
    Set {
        /// Name of the link.
        name: String,
        /// Estimated bandwidth, bit/s (weights the `weighted` and `adaptive` schedulers).
        #[arg(long, value_name = "BPS")]
        bandwidth: Option<u64>,
        /// Priority (used by the `backup` scheduler; higher is preferred).
        #[arg(long, value_name = "N")]
        priority: Option<u8>,
    },
}

/// Runs `braid up CONFIG` in the foreground until SIGINT/SIGTERM.
pub fn run_up(args: UpArgs) -> anyhow::Result<()> {
    let cfg = config::Config::load(&args.config)?;
    for w in &cfg.warnings {
        tracing::warn!("{w}");
    }
    let mut runner = runner::Runner::new(cfg.clone())?;
    let h = runner.handle();
    let control =
        braid_linux::control::ControlServer::bind(&cfg.control, move |req| h.control(req))?;
    let metrics = match cfg.metrics {
        Some(addr) => {
            let h = runner.handle();
            Some(braid_linux::metrics::MetricsServer::bind(
                addr,
                move || h.metrics(),
            )?)
        }
        None => None,
    };
    tracing::info!(
        "braid {} up as {:?}: TUN {} {} mtu {}, scheduler {}, {} link(s), control {}{}",
        env!("CARGO_PKG_VERSION"),
        cfg.role,
        cfg.name,
        cfg.addresses_text(),
        cfg.mtu,
        cfg.scheduler,
        cfg.links.len(),
        cfg.control.display(),
        metrics
            .as_ref()
            .map(|m| format!(", metrics http://{}/metrics", m.local_addr()))
            .unwrap_or_default()
    );
    // TUN up, link sockets and control socket open: tell systemd (Type=notify) we serve.
    let what = match (cfg.role, cfg.listen) {
        (braid_core::endpoint::Role::Server, Some(l)) => format!("server on {l}"),
        (braid_core::endpoint::Role::Server, None) => "server".to_string(),
        (braid_core::endpoint::Role::Client, _) => format!("client, {} link(s)", cfg.links.len()),
    };
    braid_linux::service::ready(&format!("{} {what}", cfg.name));
    let result = runner.run();
    braid_linux::service::stopping();
    drop(metrics);
    drop(control);
    drop(runner);
    result?;
    tracing::info!("{} removed; bye", cfg.name);
    Ok(())
}

/// Sends a `braid link ...` command to a running endpoint.
pub fn run_link(control: Option<PathBuf>, cmd: LinkCmd) -> anyhow::Result<()> {
    let path = braid_linux::control::resolve(control.as_deref())?;
    let (req, what) = match cmd {
        LinkCmd::Add {
            name,
            dev,
            bind,
            remote,
            bandwidth,
            priority,
        } => (
            json!({"cmd": "link-add", "name": name, "dev": dev, "bind": bind, "remote": remote, "bandwidth": bandwidth, "priority": priority}),
            format!("link {name} added"),
        ),
        LinkCmd::Remove { name } => (
            json!({"cmd": "link-remove", "name": name}),
            format!("link {name} removed"),
        ),
        LinkCmd::Set {
            name,
            bandwidth,
            priority,
        } => {
            if bandwidth.is_none() && priority.is_none() {
                anyhow::bail!("link set {name}: give --bandwidth BPS and/or --priority N");
            }
            (
                json!({"cmd": "link-set", "name": name, "bandwidth": bandwidth, "priority": priority}),
                format!("link {name} changed"),
            )
        }
    };
    braid_linux::control::request(&path, &req)?;
    println!("{what}");
    Ok(())
}
