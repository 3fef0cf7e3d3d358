//! braid-config: how braid reads a TOML configuration file and says what is wrong with it.
//!
//! `braid up` (braid-tunnel), `braid balance` (braid-balance) and `braid check` load their files
//! through [`Source`], so every error has one shape, the compiler's:
//!
//! ```text
//! FILE:LINE:COLUMN: KEY: MESSAGE
//! /etc/braid/client.toml:17:13: link[1].bandwidth: invalid type: string "big", expected u64
//! /etc/braid/client.toml:9:1: link[0].bandwith: unknown key, did you mean `bandwidth`?
//! ```
//!
//! (`FILE: MESSAGE` when no line applies, e.g. a file that cannot be read.) The pieces:
//!
//! - [`Source::deserialize`]: `toml` parses and gives the byte span of what failed;
//!   `serde_path_to_error` gives the key path (serde alone names only the value: `invalid type:
//!   string "big", expected u32`); every struct of a file is `#[serde(deny_unknown_fields)]`, and
//!   an unknown key gets the closest known one (`strsim`, as clap does) as a suggestion.
//! - Validators (one per section, in each runtime crate) take the values as [`toml::Spanned`]
//!   and report with [`Source::at`], or [`Source::value`] / [`Source::optional`], which run a
//!   check on a value and place its error at that value.
//!
//! A crate of its own because both runtime crates need it and neither depends on the other, and
//! because it is plain text handling: braid-linux is the kernel layer.

use std::fmt;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::ops::Range;
use std::path::{Path, PathBuf};

pub use toml::Spanned;

/// What is wrong in a configuration file, and where. Displayed on one line as
/// `FILE:LINE:COLUMN: KEY: MESSAGE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    /// Line and column (1-based), when the error belongs to a place in the file.
    pub position: Option<(usize, usize)>,
    /// The key path (`bundle.mtu`, `link[1].remote`), when the error belongs to a key.
    pub key: Option<String>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some((line, col)) = self.position {
            write!(f, ":{line}:{col}")?;
        }
        if let Some(key) = &self.key {
            write!(f, ": {key}")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

/// A configuration file's text and where it came from.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    path: &'a Path,
    text: &'a str,
}

impl<'a> Source<'a> {
    pub fn new(path: &'a Path, text: &'a str) -> Source<'a> {
        Source { path, text }
    }

    /// Reads a file's text; the error names the file.
    pub fn read(path: &Path) -> Result<String, ConfigError> {
        std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: path.to_path_buf(),
            position: None,
            key: None,
            message: format!("cannot read: {e}"),
        })
    }

    pub fn path(&self) -> &'a Path {
        self.path
    }

    /// Resolves `p` (as written in the file) against the file's directory.
    pub fn relative_path(&self, p: &str) -> PathBuf {
        let p = Path::new(p);
        match self.path.parent() {
            Some(dir) if p.is_relative() => dir.join(p),
            _ => p.to_path_buf(),
        }
    }

    /// Parses the file into `T`. Syntax errors, type errors, missing and unknown keys come back
    /// with their line and key path.
    pub fn deserialize<T: serde::de::DeserializeOwned>(&self) -> Result<T, ConfigError> {
        let de = toml::Deserializer::new(self.text);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let path = render_path(e.path());
            let inner = e.into_inner();
            let message = one_line(inner.message());
            let (key, message) = match classify(&message) {
                Some(Problem::Unknown { key, expected }) => {
                    (join(&path, &key), unknown_key_message(&key, &expected))
                }
                Some(Problem::Missing { key }) => (join(&path, &key), "missing".to_string()),
                None => (path, message),
            };
            self.error(inner.span(), &key, message)
        })
    }

    /// An error at byte range `span` of the file (none: the whole file) about `key` (empty: no
    /// key).
    pub fn error(
        &self,
        span: Option<Range<usize>>,
        key: &str,
        message: impl fmt::Display,
    ) -> ConfigError {
        ConfigError {
            file: self.path.to_path_buf(),
            position: span.map(|s| line_col(self.text, s.start)),
            key: (!key.is_empty()).then(|| key.to_string()),
            message: message.to_string(),
        }
    }

    /// An error at value `v`, about `key`.
    pub fn at<T>(&self, v: &Spanned<T>, key: &str, message: impl fmt::Display) -> ConfigError {
        self.error(Some(v.span()), key, message)
    }

    /// Checks value `v` of `key` with `check`; its error is placed at the value.
    pub fn value<T, U>(
        &self,
        v: &Spanned<T>,
        key: &str,
        check: impl FnOnce(&T) -> Result<U, String>,
    ) -> Result<U, ConfigError> {
        check(v.get_ref()).map_err(|m| self.at(v, key, m))
    }

    /// [`Source::value`] for an optional key: `None` when the key is absent.
    pub fn optional<T, U>(
        &self,
        v: &Option<Spanned<T>>,
        key: &str,
        check: impl FnOnce(&T) -> Result<U, String>,
    ) -> Result<Option<U>, ConfigError> {
        v.as_ref().map(|v| self.value(v, key, check)).transpose()
    }
}

/// `Ok(v)` when `lo <= v <= hi`, else a message naming the range.
pub fn in_range<T: PartialOrd + fmt::Display + Copy>(v: T, lo: T, hi: T) -> Result<T, String> {
    if v >= lo && v <= hi {
        Ok(v)
    } else {
        Err(format!("{v} is out of range {lo}..{hi}"))
    }
}

/// Resolves "HOST:PORT" (a literal address, or a host name through the system resolver),
/// preferring the address family of `family_hint` (IPv4 without a hint).
pub fn resolve_host_port(s: &str, family_hint: Option<IpAddr>) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let Some((host, port)) = s.rsplit_once(':') else {
        return Err(format!("{s:?} is not HOST:PORT"));
    };
    if host.bytes().all(|b| b.is_ascii_digit() || b == b'.') || host.starts_with('[') {
        return Err(format!("{host:?} is not an IP address"));
    }
    let name_ok = |h: &str| {
        !h.is_empty()
            && h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
    };
    if !name_ok(host) || port.parse::<u16>().is_err() {
        return Err(format!("{s:?} is not HOST:PORT"));
    }
    let addrs: Vec<SocketAddr> = s
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {s:?}: {e}"))?
        .collect();
    let want_v4 = !matches!(family_hint, Some(h) if h.is_ipv6());
    addrs
        .iter()
        .find(|a| a.is_ipv4() == want_v4)
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("{s:?} resolves to no address"))
}

/// The entry of `candidates` closest to `word`, if one is close enough to be a likely typo.
pub fn did_you_mean<'c>(word: &str, candidates: &[&'c str]) -> Option<&'c str> {
    candidates
        .iter()
        .map(|c| (strsim::jaro_winkler(word, c), *c))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

/// Line and column (1-based) of byte offset `pos` in `text`.
pub fn line_col(text: &str, pos: usize) -> (usize, usize) {
    let pos = pos.min(text.len());
    let before = &text.as_bytes()[..pos];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    (line, pos - line_start + 1)
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `path.key`, unless `path` already ends with `key` (serde_path_to_error includes an unknown key
/// in the path, not a missing one).
fn join(path: &str, key: &str) -> String {
    if path == key || path.ends_with(&format!(".{key}")) {
        path.to_string()
    } else if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// `bundle.mtu`, `link[1].remote`; `toml::Spanned`'s private wrapper keys are left out.
fn render_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for seg in path.iter() {
        match seg {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if key.starts_with("$__") {
                    continue;
                }
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Unknown => {}
        }
    }
    out
}

enum Problem {
    Unknown { key: String, expected: Vec<String> },
    Missing { key: String },
}

/// Recognises serde's own messages for unknown and missing fields (`serde::de::Error`'s default
/// `unknown_field` and `missing_field`, which toml does not override): "unknown field `x`,
/// expected one of `a`, `b`" and "missing field `x`". A test below pins the wording.
fn classify(message: &str) -> Option<Problem> {
    let quoted = |s: &str| -> Vec<String> {
        s.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    };
    if let Some(rest) = message.strip_prefix("unknown field ") {
        let (field, expected) = rest.split_once(", expected").unwrap_or((rest, ""));
        let key = quoted(field).into_iter().next()?;
        return Some(Problem::Unknown {
            key,
            expected: quoted(expected),
        });
    }
    if let Some(rest) = message.strip_prefix("missing field ") {
        return Some(Problem::Missing {
            key: quoted(rest).into_iter().next()?,
        });
    }
    None
}

fn unknown_key_message(key: &str, expected: &[String]) -> String {
    let names: Vec<&str> = expected.iter().map(String::as_str).collect();
    match did_you_mean(key, &names) {
        Some(s) => format!("unknown key, did you mean `{s}`?"),
        None if names.is_empty() => "unknown key (none is expected here)".to_string(),
        None => format!("unknown key (expected one of: {})", names.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct File {
        bundle: Bundle,
        #[serde(default)]
        link: Vec<Spanned<Link>>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Bundle {
        name: Spanned<String>,
        mtu: Option<Spanned<u32>>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Link {
        #[allow(dead_code)]
        name: String,
        bandwidth: Option<Spanned<u64>>,
    }

    fn parse(text: &str) -> Result<File, String> {
        Source::new(Path::new("/etc/braid/t.toml"), text)
            .deserialize()
            .map_err(|e| e.to_string())
    }

    const GOOD: &str = "[bundle]\nname = \"b\"\nmtu = 1400\n\n[[link]]\nname = \"a\"\n\n[[link]]\nname = \"b\"\nbandwidth = 5\n";

    #[test]
    fn good_file_keeps_spans() {
        let f = parse(GOOD).unwrap();
        let src = Source::new(Path::new("t.toml"), GOOD);
        let e = src.at(
            f.link[1].get_ref().bandwidth.as_ref().unwrap(),
            "link[1].bandwidth",
            "too small",
        );
        assert_eq!(e.to_string(), "t.toml:10:13: link[1].bandwidth: too small");
    }

    #[test]
    fn type_error_names_the_key_and_line() {
        let e = parse(&GOOD.replace("mtu = 1400", "mtu = \"big\"")).unwrap_err();
        assert!(
            e.starts_with("/etc/braid/t.toml:3:7: bundle.mtu: invalid type: string \"big\""),
            "{e}"
        );
        let e = parse(&GOOD.replace("bandwidth = 5", "bandwidth = -5")).unwrap_err();
        assert!(
            e.starts_with("/etc/braid/t.toml:10:13: link[1].bandwidth: invalid value"),
            "{e}"
        );
    }

    #[test]
    fn unknown_keys_get_a_suggestion() {
        let e = parse(&GOOD.replace("bandwidth", "bandwith")).unwrap_err();
        assert!(
            e.starts_with(
                "/etc/braid/t.toml:10:1: link[1].bandwith: unknown key, did you mean `bandwidth`?"
            ),
            "{e}"
        );
        let e = parse(&GOOD.replace("[bundle]", "[bundel]")).unwrap_err();
        assert!(
            e.contains(":1:") && e.contains("bundel: unknown key, did you mean `bundle`?"),
            "{e}"
        );
        let e = parse(&GOOD.replace("mtu = 1400", "colour = 1")).unwrap_err();
        assert!(
            e.contains("bundle.colour: unknown key (expected one of: name, mtu)"),
            "{e}"
        );
    }

    #[test]
    fn missing_keys_and_syntax_errors() {
        let e = parse(&GOOD.replace("name = \"b\"\nmtu", "mtu")).unwrap_err();
        assert!(
            e.starts_with("/etc/braid/t.toml:1:1: bundle.name: missing"),
            "{e}"
        );
        let e = parse("[bundle\n").unwrap_err();
        assert!(e.starts_with("/etc/braid/t.toml:1:8: "), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }

    /// The messages [`classify`] recognises are serde's; this fails if their wording changes.
    #[test]
    fn serde_wording_is_recognised() {
        use serde::de::Error;
        let e = toml::de::Error::unknown_field("x", &["a", "b", "c"]);
        assert!(
            matches!(classify(e.message()), Some(Problem::Unknown { key, expected }) if key == "x" && expected == ["a", "b", "c"])
        );
        let e = toml::de::Error::unknown_field("x", &["a"]);
        assert!(
            matches!(classify(e.message()), Some(Problem::Unknown { expected, .. }) if expected == ["a"])
        );
        let e = toml::de::Error::missing_field("y");
        assert!(matches!(classify(e.message()), Some(Problem::Missing { key }) if key == "y"));
    }

    #[test]
    fn helpers() {
        assert_eq!(line_col("ab\ncd", 4), (2, 2));
        assert_eq!(line_col("ab", 99), (1, 3));
        assert_eq!(in_range(5u32, 1, 10), Ok(5));
        assert_eq!(
            in_range(0u32, 1, 10).unwrap_err(),
            "0 is out of range 1..10"
        );
        assert_eq!(
            did_you_mean("prio", &["priority", "name"]),
            Some("priority")
        );
        assert_eq!(did_you_mean("zzz", &["priority", "name"]), None);
        let src = Source::new(Path::new("/etc/braid/c.toml"), "");
        assert_eq!(src.relative_path("key"), PathBuf::from("/etc/braid/key"));
        assert_eq!(src.relative_path("/k"), PathBuf::from("/k"));
        assert_eq!(resolve_host_port("198.18.0.1:80", None).unwrap().port(), 80);
        let v6 = resolve_host_port("localhost:80", Some("::1".parse().unwrap())).unwrap();
        assert_eq!(v6.port(), 80);
        assert!(resolve_host_port("localhost", None)
            .unwrap_err()
            .contains("HOST:PORT"));
        assert!(resolve_host_port("local host:80", None)
            .unwrap_err()
            .contains("HOST:PORT"));
        assert!(resolve_host_port("localhost:http", None)
            .unwrap_err()
            .contains("HOST:PORT"));
        let e = resolve_host_port("198.18.0.300:80", None).unwrap_err();
        assert_eq!(e, "\"198.18.0.300\" is not an IP address");
    }
}
