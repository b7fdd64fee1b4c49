//! Parsers for the sizes and durations every tool takes.

use std::time::Duration;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UnitError {
    #[error("invalid size '{0}' (expected e.g. 512M, 1G, 4096, 64KiB)")]
    Size(String),
    #[error("invalid duration '{0}' (expected e.g. 30s, 5m, 1h30m, 1500ms, 2d)")]
    Duration(String),
}

/// `4096`, `64k`, `64K`, `64KiB`, `512M`, `1.5G`, `2T`: powers of 1024.
pub fn parse_size(s: &str) -> Result<u64, UnitError> {
    let err = || UnitError::Size(s.to_string());
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(err());
    }
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(err()),
    };
    if num.contains('.') {
        let v: f64 = num.parse().map_err(|_| err())?;
        let bytes = v * mult as f64;
        if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
            return Err(err());
        }
        Ok(bytes as u64)
    } else {
        let v: u64 = num.parse().map_err(|_| err())?;
        v.checked_mul(mult).ok_or_else(err)
    }
}

/// `n` bytes for a message: "2.0 GiB", "128 MiB", "1.5 KiB", "100 bytes"
/// (a whole number of MiB or KiB without a fraction).
pub fn human_bytes(n: u64) -> String {
    const K: u64 = 1 << 10;
    const M: u64 = 1 << 20;
    const G: u64 = 1 << 30;
    if n >= G {
        format!("{:.1} GiB", n as f64 / G as f64)
    } else if n >= M && n.is_multiple_of(M) {
        format!("{} MiB", n / M)
    } else if n >= M {
        format!("{:.1} MiB", n as f64 / M as f64)
    } else if n >= K && n.is_multiple_of(K) {
        format!("{} KiB", n / K)
    } else if n >= K {
        format!("{:.1} KiB", n as f64 / K as f64)
    } else {
        format!("{n} bytes")
    }
}

/// `30` (seconds), `30s`, `1500ms`, `5m`, `1h30m`, `2d`.
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    let err = || UnitError::Duration(s.to_string());
    let t = s.trim();
    if t.is_empty() {
        return Err(err());
    }
    if let Ok(secs) = t.parse::<u64>() {
        return bounded(Duration::from_secs(secs)).ok_or_else(err);
    }
    let mut total = Duration::ZERO;
    let mut rest = t;
    while !rest.is_empty() {
        let n_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        if n_end == 0 {
            return Err(err());
        }
        let num: f64 = rest[..n_end].parse().map_err(|_| err())?;
        rest = &rest[n_end..];
        let u_end = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = &rest[..u_end];
        rest = &rest[u_end..];
        let secs = match unit {
            "ms" => num / 1000.0,
            "s" => num,
            "m" => num * 60.0,
            "h" => num * 3600.0,
            "d" => num * 86400.0,
            _ => return Err(err()),
        };
        total = Duration::try_from_secs_f64(secs)
            .ok()
            .and_then(|d| total.checked_add(d))
            .and_then(bounded)
            .ok_or_else(err)?;
    }
    Ok(total)
}

/// The longest duration taken: a hundred years. Longer ones are typos, and
/// `Instant::now() + d` would overflow (a panic) for the largest.
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 86400);

fn bounded(d: Duration) -> Option<Duration> {
    (d <= MAX_DURATION).then_some(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_past_a_century_are_refused_not_overflowed() {
        for v in [
            "18446744073709551615",
            "10000000000000000000s10000000000000000000s",
            "101y",
            "36600d",
            "1e300s",
        ] {
            assert!(parse_duration(v).is_err(), "{v}");
        }
        assert_eq!(parse_duration("36500d").unwrap(), MAX_DURATION);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64k"), Ok(65536));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert!(parse_size("").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999999T").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("m5").is_err());
    }
}
