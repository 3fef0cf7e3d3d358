//! Keeps the operator guides' metric lists true: the names a real endpoint exports (its
//! `# TYPE` lines) must all appear in the guide's metrics section, and every name listed there
//! must be exported. Shared by the tests that scrape a tunnel or a balancer.

use std::collections::BTreeSet;

/// The metric names a scrape exports, spelled as their samples are (counters end in `_total`).
/// Families without samples still have a `# TYPE` line, so nothing depends on traffic.
pub fn exported(scrape: &str) -> BTreeSet<String> {
    scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|rest| {
            let mut w = rest.split_whitespace();
            let (name, kind) = (w.next().unwrap_or(""), w.next().unwrap_or(""));
            match kind {
                "counter" => format!("{name}_total"),
                _ => name.to_string(),
            }
        })
        .collect()
}

/// The backquoted `braid_*` names in the section of a Markdown file whose heading ends with
/// `title` (e.g. "## 9. Metrics" for "Metrics"), up to the next heading of the same or a higher
/// level; `#` lines inside code fences are not headings.
pub fn documented(doc: &str, title: &str) -> BTreeSet<String> {
    let is_heading = |l: &str| l.starts_with('#') && l.trim_end().ends_with(&format!(" {title}"));
    let mut lines = doc.lines().skip_while(|l| !is_heading(l));
    let heading = lines
        .next()
        .unwrap_or_else(|| panic!("no heading {title:?}"));
    let level = heading.chars().take_while(|&c| c == '#').count();
    let mut names = BTreeSet::new();
    let mut fenced = false;
    for l in lines {
        if l.starts_with("```") {
            fenced = !fenced;
        }
        let hashes = l.chars().take_while(|&c| c == '#').count();
        if !fenced && hashes > 0 && hashes <= level && l[hashes..].starts_with(' ') {
            break;
        }
        let mut rest = l;
        while let Some(i) = rest.find("braid_") {
            let tail = &rest[i..];
            let end = tail
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
                .unwrap_or(tail.len());
            let name = &tail[..end];
            // `braid_` as a word of its own (e.g. inside `RUST_LOG=braid_tunnel`) is preceded
            // by a letter or `=`; metric names in the guides stand in backquotes.
            if i > 0 && rest.as_bytes()[i - 1] == b'`' && !name.ends_with('_') {
                names.insert(name.to_string());
            }
            rest = &tail[end..];
        }
    }
    names
}

/// Reads `docs/<file>` of this repository.
pub fn doc(file: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs")
        .join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Asserts that `scrape` and the section `title` of `docs/<file>` name the same metrics;
/// `applies` says which documented names this endpoint must export (e.g. not the DSR ones
/// from a proxy-mode balancer).
pub fn assert_documented(scrape: &str, file: &str, title: &str, applies: impl Fn(&str) -> bool) {
    let exported = exported(scrape);
    assert!(
        exported.len() > 5,
        "too few metrics in the scrape (not OpenMetrics text?):\n{scrape}"
    );
    let documented = documented(&doc(file), title);
    let undocumented: Vec<_> = exported.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "exported but not listed in docs/{file} ({title}): {undocumented:?}"
    );
    let missing: Vec<_> = documented
        .iter()
        .filter(|n| applies(n) && !exported.contains(*n))
        .collect();
    assert!(
        missing.is_empty(),
        "listed in docs/{file} ({title}) but not exported: {missing:?}\n{scrape}"
    );
}

#[test]
fn documented_reads_backquoted_names_of_one_section() {
    let doc = "# T\n## Metrics\nA `braid_a_total` and `braid_b{x=\"y\"}`, RUST_LOG=braid_tunnel,\n\
               the prefix `braid_balance_`.\n```\n# not a heading `braid_c`\n```\n### Sub\n`braid_d`\n\
               ## Next\n`braid_e`\n";
    let got: Vec<String> = documented(doc, "Metrics").into_iter().collect();
    assert_eq!(got, ["braid_a_total", "braid_b", "braid_c", "braid_d"]);
    let scrape = "# TYPE braid_a counter\nbraid_a_total 1\n# TYPE braid_b gauge\n# EOF\n";
    let got: Vec<String> = exported(scrape).into_iter().collect();
    assert_eq!(got, ["braid_a_total", "braid_b"]);
}
