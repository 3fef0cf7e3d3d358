//! The body of the metrics HTTP fuzz target, in the library so that it runs both under
//! cargo-fuzz (`fuzz/`, nightly) and on stable in `tests/fuzz_corpus.rs` (every seed of the
//! committed corpus plus random inputs).
//!
//! [`metrics_http`]: any bytes as a request head through [`crate::metrics::response`]: the reply
//! is one well-formed HTTP/1.0 response whose `Content-Length` is its body's length, and the
//! metrics are rendered only for a scrape (`GET`/`HEAD /metrics`).

use std::cell::Cell;

use crate::metrics::response;

const BODY: &str = "x_total 1\n# EOF\n";

/// Runs the metrics HTTP server's request handling over `data`; panics on a malformed reply.
pub fn metrics_http(data: &[u8]) {
    let rendered = Cell::new(false);
    let render = || {
        rendered.set(true);
        BODY.to_string()
    };
    let reply = response(data, &render);
    let text = std::str::from_utf8(&reply).expect("the reply is text");
    let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
    let mut lines = head.split("\r\n");
    let status = lines.next().expect("a status line");
    assert!(status.starts_with("HTTP/1.0 "), "{status}");
    let length: usize = lines
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .expect("a Content-Length")
        .parse()
        .expect("a number");
    // A HEAD request (its method is the request line's first word) gets no body.
    let head_request = String::from_utf8_lossy(data)
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().next())
        == Some("HEAD");
    if head_request {
        assert!(body.is_empty(), "HEAD got a body");
    } else {
        assert_eq!(
            length,
            body.len(),
            "Content-Length is not the body's length"
        );
    }
    if rendered.get() {
        assert!(status.starts_with("HTTP/1.0 200"), "{status}");
        assert!(head_request || body == BODY);
    }
}

/// Named seed inputs (`(target, name, bytes)`), written to `fuzz/corpus/` by the ignored test in
/// `tests/fuzz_corpus.rs`.
pub fn seed_corpus() -> Vec<(&'static str, String, Vec<u8>)> {
    [
        (
            "scrape",
            &b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n"[..],
        ),
        ("head", b"HEAD /metrics HTTP/1.0\r\n\r\n"),
        ("query", b"GET /metrics?name[]=x HTTP/1.1\n\n"),
        ("root", b"GET / HTTP/1.0\r\n\r\n"),
        (
            "post",
            b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
        ),
        ("binary", b"\x00\xff\xfe GET /metrics"),
    ]
    .into_iter()
    .map(|(n, b)| ("metrics_http", n.to_string(), b.to_vec()))
    .collect()
}
