//! The `braid` command: CLI glue over the crates that do the work.
//!
//! `clap` (derive) for the command line: subcommands and their arguments are defined next to the
//! code that runs them (`braid-tunnel`, `braid-balance`, `braid-lab`) and composed here.
//! `braid completions SHELL` (`clap_complete`) and `braid man` (`clap_mangen`) are generated from
//! the same definitions, so they cannot disagree with `--help`; packaging
//! (`scripts/build-deb.sh`) runs them to ship the man pages and completion files.

mod check;

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
    /// Log level (error, warn, info, debug, trace, off), or a tracing filter of TARGET=LEVEL
    /// directives (e.g. "info,braid_tunnel=debug"); RUST_LOG also works.
    #[arg(long, global = true, value_parser = parse_log_level)]
    log_level: Option<String>,
    /// Before the command, as braid first accepted it (`braid --control PATH status`): kept
    /// for scripts, out of the help, and refused by the commands that have no use for it.
    #[arg(long, hide = true, value_name = "PATH")]
    control: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print a new random key (32 bytes, base64): a pre-shared key (`key`) or a private key
    /// (`private_key`, per-client keys).
    Keygen,
    /// Read a private key (base64) on standard input and print its public key, as `wg pubkey`.
    Pubkey,
    /// Run a bonding tunnel endpoint in the foreground.
    Up(braid_tunnel::UpArgs),
    /// Check a tunnel or balancer configuration file, touching nothing; exit 0 if it is valid.
    Check(check::CheckArgs),
    /// Show a running endpoint's bundle and links, or a balancer's backends.
    Status {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        control: ControlArg,
    },
    /// Add, remove or change links of a running endpoint.
    Link {
        #[command(flatten)]
        control: ControlArg,
        #[command(subcommand)]
        cmd: braid_tunnel::LinkCmd,
    },
    /// Add, remove or list the clients of a running concentrator (a server with [[client]]).
    Client {
        #[command(flatten)]
        control: ControlArg,
        #[command(subcommand)]
        cmd: braid_tunnel::ClientCmd,
    },
    /// Run the built-in network lab (needs root): emulated links, two endpoints, real TCP.
    Lab(braid_lab::LabArgs),
    /// Run a layer-4 load balancer in the foreground.
    Balance(braid_balance::BalanceArgs),
    /// Add, remove, drain or re-weight backends of a running balancer.
    Backend {
        #[command(flatten)]
        control: ControlArg,
        #[command(subcommand)]
        cmd: braid_balance::BackendCmd,
    },
    /// Print a shell completion script (e.g. `braid completions bash > /etc/bash_completion.d/braid`).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page braid(1) as roff (`braid man | man -l -`), or write braid.1 and one
    /// page per subcommand (braid-up.1, ...) into a directory.
    Man {
        /// Write the pages into this directory instead of printing braid(1).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Internal: processes the lab starts in its namespaces.
    #[command(subcommand, hide = true)]
    LabInternal(braid_lab::LabInternal),
}

impl Cmd {
    fn uses_control(&self) -> bool {
        matches!(
            self,
            Cmd::Status { .. } | Cmd::Link { .. } | Cmd::Client { .. } | Cmd::Backend { .. }
        )
    }
}

/// `--control`, offered only by the commands that talk to a running endpoint or balancer.
#[derive(clap::Args)]
struct ControlArg {
    /// Control socket of the running endpoint or balancer (default: the only socket in
    /// /run/braid).
    #[arg(long, global = true, value_name = "PATH")]
    control: Option<PathBuf>,
}

/// `--log-level`: a level, or directives of the form TARGET=LEVEL. A bare word that is not a
/// level is refused: tracing would read it as a target name and quietly log nothing useful.
fn parse_log_level(s: &str) -> Result<String, String> {
    const LEVELS: [&str; 6] = ["error", "warn", "info", "debug", "trace", "off"];
    for d in s.split(',').map(str::trim) {
        if !d.contains('=') && !LEVELS.contains(&d.to_ascii_lowercase().as_str()) {
            return Err(format!(
                "{d:?} is not a level ({}) nor a TARGET=LEVEL directive",
                LEVELS.join(", ")
            ));
        }
    }
    tracing_subscriber::EnvFilter::try_new(s)
        .map(|_| s.to_string())
        .map_err(|e| e.to_string())
}

/// Logs go to stderr; colours only when stderr is a terminal (not in journald or a file).
fn init_logging(level: Option<&str>) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = match level {
        Some(l) => EnvFilter::try_new(l).unwrap_or_else(|_| EnvFilter::new("info")),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
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

fn pubkey() -> anyhow::Result<()> {
    use base64::Engine;
    use std::io::Read;
    let mut text = String::new();
    std::io::stdin()
        .take(4096)
        .read_to_string(&mut text)
        .map_err(|e| anyhow::anyhow!("cannot read the private key on standard input: {e}"))?;
    let private = braid_tunnel::config::decode_key(&text).map_err(|m| {
        anyhow::anyhow!(
            "standard input: {m} (usage: braid keygen | tee private.key | braid pubkey)"
        )
    })?;
    let public = braid_core::identity::public_key(private);
    println!(
        "{}",
        base64::engine::general_purpose::STANDARD.encode(public)
    );
    Ok(())
}

fn completions(shell: clap_complete::Shell) -> anyhow::Result<()> {
    use clap::CommandFactory;
    // clap_complete offers hidden subcommands too: complete from a copy without them (args and
    // visible subcommands are all a completion needs).
    let full = Cli::command();
    let mut cmd = clap::Command::new("braid")
        .version(env!("CARGO_PKG_VERSION"))
        .args(full.get_arguments().cloned())
        .subcommands(full.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
    if let Some(about) = full.get_about() {
        cmd = cmd.about(about.clone());
    }
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "braid", &mut out);
    print_all(&out)
}

fn man(dir: Option<PathBuf>) -> anyhow::Result<()> {
    use clap::CommandFactory;
    match dir {
        None => {
            let mut out = Vec::new();
            clap_mangen::Man::new(Cli::command()).render(&mut out)?;
            print_all(&out)
        }
        Some(dir) => clap_mangen::generate_to(Cli::command(), &dir)
            .map_err(|e| anyhow::anyhow!("cannot write man pages into {}: {e}", dir.display())),
    }
}

/// Writes generated text to stdout; a reader that stops early (`| head`) is not an error.
fn print_all(text: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
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
    if let Some(commit) = option_env!("BRAID_GIT_COMMIT") {
        braid_linux::metrics::set_git_commit(commit); // for braid_build_info (see build.rs)
    }
    init_logging(cli.log_level.as_deref());
    if cli.control.is_some() && !cli.cmd.uses_control() {
        eprintln!("braid: error: --control is only for status, link and backend (braid up and braid balance take their control socket from the config file)");
        return ExitCode::from(2);
    }
    let result = match cli.cmd {
        Cmd::Keygen => keygen(),
        Cmd::Pubkey => pubkey(),
        Cmd::Up(args) => braid_tunnel::run_up(args),
        Cmd::Check(args) => check::run(args),
        Cmd::Status { json, control } => status(control.control.or(cli.control), json),
        Cmd::Link { control, cmd } => braid_tunnel::run_link(control.control.or(cli.control), cmd),
        Cmd::Client { control, cmd } => {
            braid_tunnel::run_client(control.control.or(cli.control), cmd)
        }
        Cmd::Lab(args) => braid_lab::run_lab(args),
        Cmd::Balance(args) => braid_balance::run_balance(args),
        Cmd::Backend { control, cmd } => {
            braid_balance::run_backend(control.control.or(cli.control), cmd)
        }
        Cmd::Completions { shell } => completions(shell),
        Cmd::Man { dir } => man(dir),
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
