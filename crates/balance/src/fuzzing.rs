//! The body of the control-socket fuzz target, in the library so that it runs both under
//! cargo-fuzz (`fuzz/`, nightly) and on stable in `tests/fuzz_corpus.rs` (every seed of the
//! committed corpus plus random inputs).
//!
//! [`control_json`]: the input's lines, one request each, through the control socket's line
//! handling ([`braid_linux::control::reply_to_line`]) into a real [`Balancer`]'s
//! [`Balancer::handle_control`] (the commands change its backend table), then its status, the
//! human status table (`braid status`) and its metrics. Every reply must be one JSON object on
//! one line, with `"ok"` or `"error"` (or the status); nothing may panic.

use std::path::Path;

use crate::balancer::Balancer;
use crate::config::Config;

const CONFIG: &str = "[balance]\nname = \"fuzz\"\nlisten = \"198.18.0.10:80\"\ntable_size = 251\n\
[[backend]]\naddress = \"198.18.0.3:80\"\n[[backend]]\naddress = \"[2001:2::3]:80\"\nweight = 3\n";

/// At most this many request lines per input (a line per command is plenty to reach any state).
const MAX_LINES: usize = 64;

/// Runs the control requests in `data` (one per line) against a fresh balancer.
pub fn control_json(data: &[u8]) {
    let cfg = Config::parse(Path::new("fuzz.toml"), CONFIG).expect("the harness's config");
    let b = Balancer::new(cfg).expect("the harness's balancer");
    let text = String::from_utf8_lossy(data);
    for line in text.split_inclusive('\n').take(MAX_LINES) {
        let Some(reply) = braid_linux::control::reply_to_line(line, &|req| b.handle_control(&req))
        else {
            assert!(line.trim().is_empty());
            continue;
        };
        assert_eq!(reply.last(), Some(&b'\n'));
        assert_eq!(
            reply.iter().filter(|&&c| c == b'\n').count(),
            1,
            "a reply must be one line"
        );
        let v: serde_json::Value = serde_json::from_slice(&reply).expect("the reply is JSON");
        assert!(
            v["ok"] == true || v["error"].is_string() || v["backends"].is_array(),
            "{v}"
        );
    }
    let status = b.status_json();
    let _ = crate::render_status(&status);
    let metrics = b.metrics_text();
    assert!(metrics.ends_with("# EOF\n"), "{metrics}");
}

/// Named seed inputs (`(target, name, bytes)`), written to `fuzz/corpus/` by the ignored test in
/// `tests/fuzz_corpus.rs`.
pub fn seed_corpus() -> Vec<(&'static str, String, Vec<u8>)> {
    [
        ("status", "{\"cmd\":\"status\"}\n"),
        (
            "add-weight-drain-remove",
            "{\"cmd\":\"backend-add\",\"address\":\"198.18.0.4:80\",\"weight\":2}\n\
             {\"cmd\":\"backend-set-weight\",\"address\":\"198.18.0.4:80\",\"weight\":10000}\n\
             {\"cmd\":\"backend-drain\",\"address\":\"198.18.0.3:80\"}\n\
             {\"cmd\":\"backend-undrain\",\"address\":\"198.18.0.3:80\"}\n\
             {\"cmd\":\"backend-remove\",\"address\":\"[2001:2::3]:80\"}\n\
             {\"cmd\":\"status\"}\n",
        ),
        (
            "bad-arguments",
            "{\"cmd\":\"backend-add\",\"address\":\"nope\"}\n\
             {\"cmd\":\"backend-set-weight\",\"address\":\"198.18.0.3:80\",\"weight\":-1}\n\
             {\"cmd\":\"backend-add\",\"address\":\"198.18.0.5:80\",\"weight\":1e400}\n\
             {\"cmd\":7}\n[]\n\"str\"\nnull\n",
        ),
        (
            "remove-all",
            "{\"cmd\":\"backend-remove\",\"address\":\"198.18.0.3:80\"}\n\
             {\"cmd\":\"backend-remove\",\"address\":\"[2001:2::3]:80\"}\n{\"cmd\":\"status\"}\n",
        ),
        (
            "not-json",
            "{\"cmd\":\n\u{feff}{}\n\n   \n{\"cmd\":\"fly\"}",
        ),
    ]
    .into_iter()
    .map(|(n, b)| ("control_json", n.to_string(), b.as_bytes().to_vec()))
    .collect()
}
