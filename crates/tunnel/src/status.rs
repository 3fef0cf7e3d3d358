//! `braid status` for humans: one aligned row per link and a bundle line in the spirit of mpd5's
//! "Bundle: up 3 links, total bandwidth 6000000 bps".

use serde_json::Value;

/// Bits per second, human-readable (SI).
pub fn fmt_bps(bps: f64) -> String {
    if !bps.is_finite() || bps <= 0.0 {
        return "0".into();
    }
    let (v, unit) = if bps >= 1e9 {
        (bps / 1e9, "Gbit/s")
    } else if bps >= 1e6 {
        (bps / 1e6, "Mbit/s")
    } else if bps >= 1e3 {
        (bps / 1e3, "kbit/s")
    } else {
        (bps, "bit/s")
    };
    format!("{v:.2} {unit}")
}

/// Bytes, human-readable (binary).
pub fn fmt_bytes(b: u64) -> String {
    let f = b as f64;
    if f >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", f / (1u64 << 30) as f64)
    } else if f >= (1 << 20) as f64 {
        format!("{:.2} MiB", f / (1 << 20) as f64)
    } else if f >= 1024.0 {
        format!("{:.1} KiB", f / 1024.0)
    } else {
        format!("{b} B")
    }
}

/// Renders a tunnel's `status` reply for humans.
pub fn render_status(s: &Value) -> String {
    if let Some(clients) = s.get("clients").and_then(|c| c.as_array()) {
        return render_sites(s, clients);
    }
    render_bundle(s)
}

/// A concentrator: one line for it, then each client as a bundle (its links table).
fn render_sites(s: &Value, clients: &[Value]) -> String {
    let str_of = |v: &Value, k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string();
    let up = clients
        .iter()
        .filter(|c| c.get("connected").and_then(|x| x.as_bool()) == Some(true))
        .count();
    let mut out = format!(
        "{}: concentrator, {} of {} clients connected, address {}, listen {}\n",
        str_of(s, "name"),
        up,
        clients.len(),
        str_of(s, "address"),
        str_of(s, "listen"),
    );
    for c in clients {
        let prefixes: Vec<&str> = c
            .get("prefixes")
            .and_then(|p| p.as_array())
            .map(|a| a.iter().filter_map(|x| x.as_str()).collect())
            .unwrap_or_default();
        out.push_str(&format!(
            "\nclient {} ({})\n",
            str_of(c, "name"),
            prefixes.join(", ")
        ));
        out.push_str(&render_bundle(c));
    }
    out
}

fn render_bundle(s: &Value) -> String {
    let str_of = |v: &Value, k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string();
    let u = |v: &Value, k: &str| v.get(k).and_then(|x| x.as_u64());
    let f = |v: &Value, k: &str| v.get(k).and_then(|x| x.as_f64()).unwrap_or(0.0);
    let empty = Vec::new();
    let mut links: Vec<&Value> = s
        .get("links")
        .and_then(|l| l.as_array())
        .unwrap_or(&empty)
        .iter()
        .collect();
    links.sort_by_key(|l| l.get("id").and_then(|i| i.as_u64()).unwrap_or(0));

    let header = [
        "LINK",
        "STATE",
        "RTT",
        "LOSS",
        "TX RATE",
        "RX RATE",
        "TX BYTES",
        "RX BYTES",
        "BANDWIDTH",
        "PEER",
    ];
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    for l in &links {
        let rtt = match u(l, "srtt_us") {
            Some(us) => format!("{:.1} ms", us as f64 / 1000.0),
            None => "-".into(),
        };
        let peer = l
            .get("remote")
            .and_then(|r| r.as_str())
            .or_else(|| l.get("addr").and_then(|a| a.as_str()))
            .unwrap_or("-")
            .to_string();
        let peer = match l.get("dev").and_then(|d| d.as_str()) {
            Some(dev) => format!("{peer} dev {dev}"),
            None => peer,
        };
        rows.push(vec![
            str_of(l, "name"),
            str_of(l, "state").to_uppercase(),
            rtt,
            format!("{:.1}%", f(l, "loss") * 100.0),
            fmt_bps(f(l, "tx_rate_bps")),
            fmt_bps(f(l, "rx_rate_bps")),
            fmt_bytes(u(l, "tx_bytes").unwrap_or(0)),
            fmt_bytes(u(l, "rx_bytes").unwrap_or(0)),
            match (u(l, "bandwidth_bps"), u(l, "download_bandwidth_bps")) {
                (Some(b), Some(d)) => format!("{b} bps, down {d} bps"),
                (None, Some(d)) => format!("down {d} bps"),
                (Some(b), None) => format!("{b} bps"),
                (None, None) => "-".into(),
            },
            peer,
        ]);
    }
    let ncol = header.len();
    let widths: Vec<usize> = (0..ncol)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    let name = str_of(s, "name");
    let role = str_of(s, "role");
    let sched = str_of(s, "scheduler");
    let up = links
        .iter()
        .filter(|l| l.get("state").and_then(|x| x.as_str()) != Some("down"))
        .count();
    let connected = s.get("session").is_some_and(|x| !x.is_null());
    let total_bw: u64 = links
        .iter()
        .filter(|l| l.get("state").and_then(|x| x.as_str()) != Some("down"))
        .filter_map(|l| u(l, "bandwidth_bps"))
        .fold(0, u64::saturating_add);
    let measured: f64 = links
        .iter()
        .filter(|l| l.get("state").and_then(|x| x.as_str()) != Some("down"))
        .map(|l| f(l, "delivery_rate_bps"))
        .sum();
    let cipher = match s.get("cipher").and_then(|c| c.as_str()) {
        Some(c) => format!(", {c}"),
        None => String::new(),
    };
    out.push_str(&format!(
        "Bundle {name} ({role}, {sched}{cipher}, {}): {} {up} of {} links, total bandwidth {}\n",
        str_of(s, "address"),
        if connected { "up" } else { "down" },
        links.len(),
        if total_bw > 0 {
            format!("{total_bw} bps")
        } else {
            format!("{} measured", fmt_bps(measured))
        },
    ));
    for r in &rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(c, cell)| format!("{cell:<w$}", w = widths[c]))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    let tx_rate: f64 = links.iter().map(|l| f(l, "tx_rate_bps")).sum();
    let rx_rate: f64 = links.iter().map(|l| f(l, "rx_rate_bps")).sum();
    out.push_str(&format!(
        "Total: tx {} rx {}; tunnel {} packets in, {} out; reorder depth {}{} (timeout {:.1} ms); equalising {:.1} ms{}",
        fmt_bps(tx_rate),
        fmt_bps(rx_rate),
        u(s, "tun_rx_packets").unwrap_or(0),
        u(s, "tun_tx_packets").unwrap_or(0),
        u(s, "reorder_depth").unwrap_or(0),
        // The window, once it has grown past the one it starts with.
        s.get("reorder")
            .and_then(|r| r.get("window"))
            .and_then(|w| w.as_u64())
            .filter(|&w| w > braid_core::reorder::INITIAL_WINDOW as u64)
            .map_or(String::new(), |w| format!(" of {w}")),
        u(s, "reorder_timeout_us").unwrap_or(0) as f64 / 1000.0,
        u(s, "equalize_us").unwrap_or(0) as f64 / 1000.0,
        match (u(s, "equalize_wanted_us"), u(s, "equalize_us")) {
            (Some(w), Some(e)) if w > e => format!(
                " ({:.1} ms wanted: growing by steps)",
                w as f64 / 1000.0
            ),
            _ => String::new(),
        },
    ));
    // The receive window our hosts' TCP senders are told at most (`braid_core::rwnd`).
    if let Some(b) = u(s, "window_clamp_bytes") {
        out.push_str(&format!(
            "; TCP windows at most {:.0} kB ({} clamped)",
            b as f64 / 1000.0,
            u(s, "window_clamped").unwrap_or(0)
        ));
    }
    if let Some(d) = s.get("drops").and_then(|d| d.as_object()) {
        let nz: Vec<String> = d
            .iter()
            .filter_map(|(k, v)| v.as_u64().filter(|n| *n > 0).map(|n| format!("{k} {n}")))
            .collect();
        if !nz.is_empty() {
            out.push_str(&format!("; drops: {}", nz.join(", ")));
        }
    }
    out.push('\n');
    if let Some(r) = s.get("repair") {
        let g = |k: &str| r.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
        let reorder = |k: &str| {
            s.get("reorder")
                .and_then(|o| o.get(k))
                .and_then(|v| v.as_u64())
                .unwrap_or(0)
        };
        out.push_str(&format!(
            "Repair: resent {} (reinjected {}), NACKs {} out / {} in, holes repaired {} / passed on {} / given up {}, duplicates dropped {}; links lost {} at random, {} at a full queue\n",
            g("retransmits_sent"),
            g("reinjected"),
            g("nacks_sent"),
            g("nacks_received"),
            g("holes_repaired"),
            reorder("repair_passed"),
            reorder("repair_given_up"),
            g("duplicates_suppressed"),
            g("link_losses_random"),
            g("link_losses_queued"),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_aligned_and_totals() {
        let s = serde_json::json!({
            "kind": "tunnel", "name": "braid0", "role": "client", "scheduler": "adaptive", "address": "198.19.0.2/30",
            "session": 7,
            "links": [
                {"name": "isp1", "state": "up", "srtt_us": 1234, "loss": 0.0, "tx_rate_bps": 1.5e6, "rx_rate_bps": 2e3,
                 "tx_bytes": 123456, "rx_bytes": 10, "bandwidth_bps": 2000000, "remote": "198.18.1.2:5050", "dev": "veth1"},
                {"name": "isp-two", "state": "down", "srtt_us": null, "loss": 0.5, "tx_rate_bps": 0.0, "rx_rate_bps": 0.0,
                 "tx_bytes": 0, "rx_bytes": 0, "bandwidth_bps": 4000000, "download_bandwidth_bps": 8000000, "remote": "198.18.2.2:5050"}
            ],
            "drops": {"auth": 3, "malformed": 0}
        });
        let out = render_status(&s);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("Bundle braid0 (client, adaptive, 198.19.0.2/30): up 1 of 2 links, total bandwidth 2000000 bps"), "{out}");
        assert!(lines[1].starts_with("LINK     STATE"), "{out}");
        let col = lines[1].find("RTT").unwrap();
        assert_eq!(&lines[2][col..col + 6], "1.2 ms");
        assert_eq!(&lines[3][col..col + 1], "-");
        assert!(lines[3].contains("DOWN"));
        assert!(lines[3].contains("4000000 bps, down 8000000 bps"), "{out}");
        assert!(lines[4].contains("drops: auth 3"), "{out}");
        assert!(!out.contains("growing by steps"), "{out}");
        assert!(out.contains("reorder depth 0 (timeout"), "{out}");
    }

    /// A reorder window grown past the one it starts with is shown beside the depth.
    #[test]
    fn a_grown_reorder_window_is_shown() {
        let s = serde_json::json!({
            "kind": "tunnel", "name": "braid0", "role": "client", "links": [],
            "reorder_depth": 5200, "reorder": {"window": 8192}, "reorder_timeout_us": 31400
        });
        let out = render_status(&s);
        assert!(
            out.contains("reorder depth 5200 of 8192 (timeout 31.4 ms)"),
            "{out}"
        );
    }

    /// The window clamp in force is shown with the segments it lowered; none, nothing.
    #[test]
    fn the_window_clamp_is_shown_while_in_force() {
        let s = serde_json::json!({
            "kind": "tunnel", "name": "braid0", "role": "client", "links": [],
            "window_clamp_bytes": 2_313_216, "window_clamped": 41_000
        });
        let out = render_status(&s);
        assert!(
            out.contains("; TCP windows at most 2313 kB (41000 clamped)"),
            "{out}"
        );
        let s = serde_json::json!({
            "kind": "tunnel", "name": "braid0", "role": "client", "links": [],
            "window_clamp_bytes": null, "window_clamped": 41_000
        });
        assert!(!render_status(&s).contains("TCP windows"));
    }

    /// While the equalisation hold grows by steps, the status says so (a new link is not used
    /// in full yet, and the operator should know why).
    #[test]
    fn a_hold_growing_by_steps_is_shown() {
        let s = serde_json::json!({
            "kind": "tunnel", "name": "braid0", "role": "client", "links": [],
            "equalize_us": 12000, "equalize_wanted_us": 50000
        });
        let out = render_status(&s);
        assert!(
            out.contains("equalising 12.0 ms (50.0 ms wanted: growing by steps)"),
            "{out}"
        );
    }
}
