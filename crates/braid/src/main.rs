//! The `braid` command: CLI glue over the crates that do the work.
//!
//! `clap` (derive) for the command line: subcommands and their arguments are defined next to the
//! code that runs them (`braid-tunnel`, `braid-balance`, `braid-lab`) and composed here.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "braid",
    version,
    about = "Bond several network links into one; balance connections over servers"
)]
struct Cli {
    /// Log level (error, warn, info, debug, trace), or a tracing filter; RUST_LOG also works.
    #[arg(long, global = true)]
    log_level: Option<String>,
    /// Control socket of the running endpoint or balancer (default: /run/braid/<name>.sock).
    #[arg(long, global = true)]
    control: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print a new random pre-shared key (32 bytes, base64).
    Keygen,
    /// Run a bonding tunnel endpoint in the foreground.
    Up(braid_tunnel::UpArgs),
    /// Show a running endpoint's bundle and links, or a balancer's backends.
    Status {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Add, remove or change links of a running endpoint.
    #[command(subcommand)]
    Link(braid_tunnel::LinkCmd),
    /// Run the built-in network lab (needs root): emulated links, two endpoints, real TCP.
    Lab(braid_lab::LabArgs),
    /// Run a layer-4 load balancer in the foreground.
    Balance(braid_balance::BalanceArgs),
    /// Add, remove, drain or re-weight backends of a running balancer.
    #[command(subcommand)]
    Backend(braid_balance::BackendCmd),
    /// Internal: processes the lab starts in its namespaces.
    #[command(subcommand, hide = true)]
    LabInternal(braid_lab::LabInternal),
}

fn init_logging(level: Option<&str>) {
    use tracing_subscriber::EnvFilter;
    let filter = match level {
        Some(l) => EnvFilter::try_new(l).unwrap_or_else(|_| EnvFilter::new("info")),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn keygen() -> anyhow::Result<()> {
    use base64::Engine;
    use rand::RngCore;
    let mut key = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut key);
    println!("{}", base64::engine::general_purpose::STANDARD.encode(key));
    Ok(())
}

fn status(control: Option<PathBuf>, json: bool) -> anyhow::Result<()> {
    let path = braid_linux::control::resolve(control.as_deref())?;
    let reply = braid_linux::control::request(&path, &serde_json::json!({"cmd": "status"}))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&reply)?);
        return Ok(());
    }
    match reply.get("kind").and_then(|k| k.as_str()) {
        Some("balance") => print!("{}", braid_balance::render_status(&reply)),
        _ => print!("{}", braid_tunnel::render_status(&reply)),
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_level.as_deref());
    let result = match cli.cmd {
        Cmd::Keygen => keygen(),
        Cmd::Up(args) => braid_tunnel::run_up(args),
        Cmd::Status { json } => status(cli.control, json),
        Cmd::Link(cmd) => braid_tunnel::run_link(cli.control, cmd),
        Cmd::Lab(args) => braid_lab::run_lab(args),
        Cmd::Balance(args) => braid_balance::run_balance(args),
        Cmd::Backend(cmd) => braid_balance::run_backend(cli.control, cmd),
        Cmd::LabInternal(cmd) => braid_lab::run_internal(cmd),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("braid: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
