//! Link specifications: `RATE[/DELAY[/LOSS%[/JITTER]]]`, e.g. `50mbit/20ms/0.5%/2ms`.
//!
//! - RATE: a number with `bit`, `kbit`, `mbit` or `gbit` (decimal: 1 mbit = 1 000 000 bit/s), counted
//!   on the IP bytes of each frame (the Ethernet header is not counted).
//! - DELAY: one-way delay in each direction, with `us`, `ms` or `s` (default 0).
//! - LOSS: random loss in percent, applied independently in each direction (default 0), so a round
//!   trip (a ping) is lost with probability `1 - (1 - p)^2`.
//! - JITTER: each frame's delay is DELAY plus a uniform random offset in [-JITTER, +JITTER] (never
//!   below 0), but frames never overtake each other (the link stays FIFO).
//!
//! The lab (`braid lab --link`) and the simulator's `sim_tcp` example both read links this way;
//! [`crate::sim::LinkSpec`] converts from [`LinkSpec`].

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// One emulated link, the same in both directions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkSpec {
    /// Bits per second of IP bytes.
    pub rate_bps: u64,
    /// One-way delay.
    pub delay: Duration,
    /// Loss probability per frame and direction, in [0, 1).
    pub loss: f64,
    /// Maximum random deviation of the delay.
    pub jitter: Duration,
}

impl LinkSpec {
    pub fn new(rate_bps: u64, delay: Duration) -> Self {
        LinkSpec {
            rate_bps,
            delay,
            loss: 0.0,
            jitter: Duration::ZERO,
        }
    }
}

/// Parses a rate such as `10mbit`, `512kbit`, `1.5gbit`, `64000bit`.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let lower = s.trim().to_ascii_lowercase();
    let (num, mult) = if let Some(n) = lower.strip_suffix("gbit") {
        (n, 1e9)
    } else if let Some(n) = lower.strip_suffix("mbit") {
        (n, 1e6)
    } else if let Some(n) = lower.strip_suffix("kbit") {
        (n, 1e3)
    } else if let Some(n) = lower.strip_suffix("bit") {
        (n, 1.0)
    } else {
        return Err(format!(
            "rate '{s}' needs a unit: bit, kbit, mbit or gbit (e.g. 10mbit)"
        ));
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("rate '{s}' is not a number with a unit (e.g. 10mbit)"))?;
    let bps = v * mult;
    if !bps.is_finite() || bps < 8000.0 {
        return Err(format!("rate '{s}' is too small (at least 8kbit)"));
    }
    if bps > 10e9 {
        return Err(format!("rate '{s}' is too large (at most 10gbit)"));
    }
    Ok(bps.round() as u64)
}

/// Parses a duration such as `20ms`, `500us`, `1.5s`.
pub fn parse_delay(s: &str) -> Result<Duration, String> {
    let lower = s.trim().to_ascii_lowercase();
    let (num, mult) = if let Some(n) = lower.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = lower.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = lower.strip_suffix('s') {
        (n, 1.0)
    } else {
        return Err(format!("delay '{s}' needs a unit: us, ms or s (e.g. 20ms)"));
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("delay '{s}' is not a number with a unit (e.g. 20ms)"))?;
    let secs = v * mult;
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("delay '{s}' must not be negative"));
    }
    if secs > 10.0 {
        return Err(format!("delay '{s}' is too large (at most 10s)"));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn parse_loss(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let num = t
        .strip_suffix('%')
        .ok_or_else(|| format!("loss '{s}' must be a percentage (e.g. 0.5%)"))?;
    let v: f64 = num
        .parse()
        .map_err(|_| format!("loss '{s}' is not a percentage (e.g. 0.5%)"))?;
    if !(0.0..100.0).contains(&v) {
        return Err(format!("loss '{s}' must be in [0%, 100%)"));
    }
    Ok(v / 100.0)
}

impl FromStr for LinkSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split('/').collect();
        if parts.len() > 4 || parts.iter().any(|p| p.trim().is_empty()) {
            return Err(format!(
                "link spec '{s}' must be RATE[/DELAY[/LOSS%[/JITTER]]], e.g. 50mbit/20ms/0.5%"
            ));
        }
        let rate_bps = parse_rate(parts[0])?;
        let delay = parts
            .get(1)
            .map(|p| parse_delay(p))
            .transpose()?
            .unwrap_or(Duration::ZERO);
        let loss = parts
            .get(2)
            .map(|p| parse_loss(p))
            .transpose()?
            .unwrap_or(0.0);
        let jitter = parts
            .get(3)
            .map(|p| parse_delay(p))
            .transpose()?
            .unwrap_or(Duration::ZERO);
        Ok(LinkSpec {
            rate_bps,
            delay,
            loss,
            jitter,
        })
    }
}

/// Formats a rate the way it is parsed (`10mbit`, `1.5mbit`, `512kbit`).
pub fn format_rate(bps: u64) -> String {
    let fmt = |v: f64, unit: &str| {
        let s = format!("{v:.3}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        format!("{s}{unit}")
    };
    if bps >= 1_000_000_000 {
        fmt(bps as f64 / 1e9, "gbit")
    } else if bps >= 1_000_000 {
        fmt(bps as f64 / 1e6, "mbit")
    } else if bps >= 1000 {
        fmt(bps as f64 / 1e3, "kbit")
    } else {
        format!("{bps}bit")
    }
}

fn format_delay(d: Duration) -> String {
    let us = d.as_micros();
    if us.is_multiple_of(1000) {
        format!("{}ms", us / 1000)
    } else {
        format!("{us}us")
    }
}

impl fmt::Display for LinkSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}",
            format_rate(self.rate_bps),
            format_delay(self.delay)
        )?;
        if self.loss > 0.0 || !self.jitter.is_zero() {
            let pct = format!("{:.4}", self.loss * 100.0);
            write!(f, "/{}%", pct.trim_end_matches('0').trim_end_matches('.'))?;
        }
        if !self.jitter.is_zero() {
            write!(f, "/{}", format_delay(self.jitter))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_full_spec() {
        let s: LinkSpec = "50mbit/20ms/0.5%/2ms".parse().unwrap();
        assert_eq!(s.rate_bps, 50_000_000);
        assert_eq!(s.delay, Duration::from_millis(20));
        assert!((s.loss - 0.005).abs() < 1e-12);
        assert_eq!(s.jitter, Duration::from_millis(2));
        assert_eq!(s.to_string(), "50mbit/20ms/0.5%/2ms");
    }

    #[test]
    fn parses_short_specs_and_units() {
        let s: LinkSpec = "1mbit".parse().unwrap();
        assert_eq!(s, LinkSpec::new(1_000_000, Duration::ZERO));
        let s: LinkSpec = "512kbit/500us".parse().unwrap();
        assert_eq!(s.rate_bps, 512_000);
        assert_eq!(s.delay, Duration::from_micros(500));
        let s: LinkSpec = "1.5GBit/1s".parse().unwrap();
        assert_eq!(s.rate_bps, 1_500_000_000);
        assert_eq!(s.delay, Duration::from_secs(1));
        assert_eq!(s.to_string(), "1.5gbit/1000ms");
    }

    #[test]
    fn rejects_bad_specs_with_a_message() {
        for bad in [
            "",
            "10",
            "10xbit",
            "mbit",
            "10mbit/20",
            "10mbit/20ms/5",
            "10mbit/20ms/100%",
            "10mbit//1%",
            "10mbit/1ms/1%/1ms/x",
            "-1mbit",
            "1bit",
            "10mbit/-3ms",
            "10mbit/20ms/1%/abc",
        ] {
            let e = bad.parse::<LinkSpec>().unwrap_err();
            assert!(!e.is_empty() && !e.contains('\n'), "{bad}: {e}");
        }
    }
}
