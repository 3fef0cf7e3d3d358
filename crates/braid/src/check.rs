//! `braid check CONFIG`, as `haproxy -c`: validates a tunnel (`braid up`) or balancer
//! (`braid balance`) file exactly as those commands load it, and touches nothing: no TUN
//! device, no socket bound, no netlink change. It does read what the file refers to, read-only,
//! so that "ok" means the command would get past its configuration on this host: the key file
//! (and its permissions), whether the interfaces named exist, host names through the resolver.
//! Run it on the host that will run the file.

use std::path::{Path, PathBuf};

use braid_config::{ConfigError, Source};

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// The configuration file to check.
    pub config: PathBuf,
    /// What the file configures. Default: told by its tables, [bundle] and [[link]] for a
    /// tunnel, [balance] and [[backend]] for a balancer.
    #[arg(long, value_enum)]
    pub kind: Option<Kind>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// A bonding tunnel endpoint (`braid up`).
    Tunnel,
    /// A load balancer (`braid balance`).
    Balance,
}

const TUNNEL_TABLES: [&str; 2] = ["bundle", "link"];
const BALANCE_TABLES: [&str; 2] = ["balance", "backend"];

/// Checks the file; prints `FILE: ok (what it configures)` on stdout and warnings on stderr.
pub fn run(args: CheckArgs) -> anyhow::Result<()> {
    let path = &args.config;
    let text = Source::read(path)?;
    let kind = match args.kind {
        Some(k) => k,
        None => detect(path, &text)?,
    };
    let (summary, warnings) = match kind {
        Kind::Tunnel => tunnel_summary(path, &text)?,
        Kind::Balance => balance_summary(path, &text)?,
    };
    for w in warnings {
        eprintln!("braid: warning: {w}");
    }
    println!("{}: ok ({summary})", path.display());
    Ok(())
}

/// The kind of a file from its top-level tables. A file with none of them but a near miss
/// (`[bundel]`) is given to the kind it nearly names, whose parser then says "did you mean".
fn detect(path: &Path, text: &str) -> Result<Kind, ConfigError> {
    let src = Source::new(path, text);
    let table: toml::Table = src.deserialize()?;
    let has = |names: [&str; 2]| names.iter().any(|n| table.contains_key(*n));
    match (has(TUNNEL_TABLES), has(BALANCE_TABLES)) {
        (true, false) => Ok(Kind::Tunnel),
        (false, true) => Ok(Kind::Balance),
        (true, true) => Err(src.error(
            None,
            "",
            "has both tunnel tables ([bundle], [[link]]) and balancer tables ([balance], \
             [[backend]]); a file configures one or the other (or say --kind tunnel|balance)",
        )),
        (false, false) => {
            let all = [TUNNEL_TABLES, BALANCE_TABLES].concat();
            let near = table
                .keys()
                .find_map(|k| braid_config::did_you_mean(k, &all));
            match near {
                Some(n) if TUNNEL_TABLES.contains(&n) => Ok(Kind::Tunnel),
                Some(_) => Ok(Kind::Balance),
                None => Err(src.error(
                    None,
                    "",
                    "has neither [bundle] (a tunnel, `braid up`) nor [balance] (a balancer, \
                     `braid balance`): cannot tell what it configures (or say --kind tunnel|balance)",
                )),
            }
        }
    }
}

fn plural(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

fn tunnel_summary(path: &Path, text: &str) -> anyhow::Result<(String, Vec<String>)> {
    use braid_core::endpoint::Role;
    let c = braid_tunnel::config::Config::parse(path, text)?;
    let summary = match (c.role, c.listen) {
        (Role::Server, Some(listen)) => match c.identity.as_ref().map(|i| i.clients.len()) {
            Some(n) if n > 0 => format!(
                "tunnel server {}, listen {listen}, {n} client{}",
                c.name,
                if n == 1 { "" } else { "s" }
            ),
            _ => format!("tunnel server {}, listen {listen}", c.name),
        },
        _ => format!(
            "tunnel client {}, {}",
            c.name,
            plural(c.links.len(), "link")
        ),
    };
    Ok((summary, c.warnings))
}

fn balance_summary(path: &Path, text: &str) -> anyhow::Result<(String, Vec<String>)> {
    let c = braid_balance::Config::parse(path, text)?;
    let front = match (c.listen, c.vip) {
        (Some(l), _) => format!("listen {l}"),
        (None, Some(v)) => format!("vip {} on {}", v, c.interface.as_deref().unwrap_or("?")),
        (None, None) => String::new(),
    };
    let summary = format!(
        "balancer {}, {} mode, {}, {front}, {}",
        c.name,
        c.mode.as_str(),
        c.protocol.as_str(),
        plural(c.backends.len(), "backend")
    );
    Ok((summary, Vec::new()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(text: &str) -> Result<Kind, String> {
        detect(Path::new("t.toml"), text).map_err(|e| e.to_string())
    }

    #[test]
    fn kind_is_told_by_the_tables() {
        assert_eq!(kind("[bundle]\nname = \"x\"\n"), Ok(Kind::Tunnel));
        assert_eq!(kind("[[link]]\nname = \"x\"\n"), Ok(Kind::Tunnel));
        assert_eq!(kind("[balance]\nname = \"x\"\n"), Ok(Kind::Balance));
        assert_eq!(kind("[bundel]\n[[link]]\n"), Ok(Kind::Tunnel));
        assert_eq!(
            kind("[balanse]\n"),
            Ok(Kind::Balance),
            "near miss: the parser says more"
        );
        let e = kind("[bundle]\n[balance]\n").unwrap_err();
        assert!(e.starts_with("t.toml: has both tunnel tables"), "{e}");
        let e = kind("x = 1\n").unwrap_err();
        assert!(
            e.starts_with("t.toml: has neither [bundle]") && e.contains("--kind"),
            "{e}"
        );
        let e = kind("[bundle\n").unwrap_err();
        assert!(e.starts_with("t.toml:1:8: "), "{e}");
    }
}
