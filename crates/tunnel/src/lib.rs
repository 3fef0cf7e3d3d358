//! `braid up`: the bonding tunnel endpoint on Linux (TUN + one UDP socket per uplink), its
//! configuration, control socket commands and metrics. Drives `braid_core::Endpoint`.
//!
//! - [`config`]: the TOML file, validated into [`config::Config`];
//! - [`runner`]: the event loop (mio) around the core, and the control commands it answers;
//! - [`metrics`]: Prometheus encoding of the core's statistics;
//! - [`status`]: `braid status` for humans.

pub mod config;
pub mod control;
pub mod engine;
pub mod metrics;
pub mod runner;
pub mod status;
pub mod workers;

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
        /// Estimated bandwidth towards us, bit/s (told to the server, which sends at it first).
        #[arg(long, value_name = "BPS")]
        download_bandwidth: Option<u64>,
        /// Priority (used by the `backup` scheduler; higher is preferred).
        #[arg(long, value_name = "N")]
        priority: Option<u8>,
    },
    /// Remove a link (its socket is closed; traffic moves to the other links).
    Remove {
        /// Name of the link.
        name: String,
    },
    /// Change a link's configured bandwidths or priority (give at least one).
    Set {
        /// Name of the link.
        name: String,
        /// Estimated bandwidth, bit/s (weights the `weighted` and `adaptive` schedulers).
        #[arg(long, value_name = "BPS")]
        bandwidth: Option<u64>,
        /// Estimated bandwidth towards us, bit/s (told to the server, which sends at it first;
        /// 0 withdraws it).
        #[arg(long, value_name = "BPS")]
        download_bandwidth: Option<u64>,
        /// Priority (used by the `backup` scheduler; higher is preferred).
        #[arg(long, value_name = "N")]
        priority: Option<u8>,
    },
}

/// `braid client ...`: the clients of a running concentrator (a server with `[[client]]`).
#[derive(clap::Subcommand, Debug)]
pub enum ClientCmd {
    /// Add a client (its routes are installed; the other clients are not disturbed).
    Add {
        /// Name of the client (unique).
        name: String,
        /// Its public key (`braid pubkey` of its private key).
        #[arg(long, value_name = "BASE64")]
        public_key: String,
        /// Its tunnel address (IP/PREFIX); default: the next free one of `address_pool`.
        #[arg(long, value_name = "IP/PREFIX")]
        address: Option<String>,
        /// A network behind it (repeat for several).
        #[arg(long, value_name = "PREFIX")]
        lan: Vec<String>,
        /// Another client it may send to (repeat; `*`: all).
        #[arg(long, value_name = "NAME")]
        reach: Vec<String>,
    },
    /// Remove a client: its session is closed and its routes removed.
    Remove {
        /// Name of the client.
        name: String,
    },
    /// List the clients, their prefixes and whether they are connected.
    List,
}

/// Sends a `braid client ...` command to a running concentrator.
pub fn run_client(control: Option<PathBuf>, cmd: ClientCmd) -> anyhow::Result<()> {
    let path = braid_linux::control::resolve(control.as_deref())?;
    let (req, what) = match cmd {
        ClientCmd::Add {
            name,
            public_key,
            address,
            lan,
            reach,
        } => (
            json!({"cmd": "client-add", "name": name, "public_key": public_key, "address": address, "lan": lan, "reach": reach}),
            format!("client {name} added"),
        ),
        ClientCmd::Remove { name } => (
            json!({"cmd": "client-remove", "name": name}),
            format!("client {name} removed"),
        ),
        ClientCmd::List => {
            let v = braid_linux::control::request(&path, &json!({"cmd": "status"}))?;
            let Some(clients) = v.get("clients").and_then(|c| c.as_array()) else {
                anyhow::bail!(
                    "this endpoint is not a concentrator (no [[client]] in its configuration)"
                );
            };
            for c in clients {
                let s = |k: &str| c.get(k).and_then(|x| x.as_str()).unwrap_or("-").to_string();
                let prefixes: Vec<&str> = c
                    .get("prefixes")
                    .and_then(|p| p.as_array())
                    .map(|a| a.iter().filter_map(|x| x.as_str()).collect())
                    .unwrap_or_default();
                let up = c.get("connected").and_then(|x| x.as_bool()) == Some(true);
                let links = c.get("links_up").and_then(|x| x.as_u64()).unwrap_or(0);
                println!(
                    "{}\t{}\t{} link(s) up\t{}\t{}",
                    s("name"),
                    if up { "connected" } else { "not connected" },
                    links,
                    prefixes.join(","),
                    s("public_key")
                );
            }
            return Ok(());
        }
    };
    braid_linux::control::request(&path, &req)?;
    println!("{what}");
    Ok(())
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
            download_bandwidth,
            priority,
        } => (
            json!({"cmd": "link-add", "name": name, "dev": dev, "bind": bind, "remote": remote, "bandwidth": bandwidth, "download_bandwidth": download_bandwidth, "priority": priority}),
            format!("link {name} added"),
        ),
        LinkCmd::Remove { name } => (
            json!({"cmd": "link-remove", "name": name}),
            format!("link {name} removed"),
        ),
        LinkCmd::Set {
            name,
            bandwidth,
            download_bandwidth,
            priority,
        } => {
            if bandwidth.is_none() && download_bandwidth.is_none() && priority.is_none() {
                anyhow::bail!(
                    "link set {name}: give --bandwidth BPS, --download-bandwidth BPS and/or --priority N"
                );
            }
            (
                json!({"cmd": "link-set", "name": name, "bandwidth": bandwidth, "download_bandwidth": download_bandwidth, "priority": priority}),
                format!("link {name} changed"),
            )
        }
    };
    braid_linux::control::request(&path, &req)?;
    println!("{what}");
    Ok(())
}
