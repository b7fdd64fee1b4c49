//! The limits asked for on the command line, validated before anything is
//! created on the host.

use std::time::Duration;

use sbx_core::units;

use crate::rlimit::{Rlimit, RlimitError};

/// CFS period used for `--cpus` (the kernel default).
pub const CPU_PERIOD_US: u64 = 100_000;

#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    #[error("--memory: {0}")]
    Memory(units::UnitError),
    #[error("--memory: must be at least 1M")]
    MemoryTooSmall,
    #[error("--memory-swap: {0}")]
    Swap(units::UnitError),
    #[error("--memory-swap needs --memory (it is the memory+swap total)")]
    SwapWithoutMemory,
    #[error("--memory-swap {0} is below --memory {1}")]
    SwapBelowMemory(String, String),
    #[error("--cpus '{0}': expected a number of CPUs above 0.01, e.g. 0.5 or 2")]
    Cpus(String),
    #[error("--cpu-weight '{0}': expected a whole number from 1 to 10000")]
    CpuWeight(String),
    #[error("--io-weight '{0}': expected a whole number from 1 to 10000")]
    IoWeight(String),
    #[error("--pids '{0}': expected a whole number of at least 1")]
    Pids(String),
    #[error("--timeout: {0}")]
    Timeout(units::UnitError),
    #[error("--timeout: must be above zero")]
    TimeoutZero,
    #[error(transparent)]
    Rlimit(#[from] RlimitError),
}

/// Everything sbx-cgroup sets, in the units the kernel takes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Limits {
    /// Hard memory limit in bytes.
    pub memory: Option<u64>,
    /// Memory + swap in bytes (None with `memory`: no swap beyond it).
    pub memory_swap: Option<u64>,
    /// CFS quota in microseconds per [`CPU_PERIOD_US`].
    pub cpu_quota_us: Option<u64>,
    /// cgroup v2 weight (1-10000, default 100).
    pub cpu_weight: Option<u64>,
    pub pids: Option<u64>,
    /// cgroup v2 io weight (1-10000, default 100).
    pub io_weight: Option<u64>,
    pub rlimits: Vec<Rlimit>,
    pub timeout: Option<Duration>,
}

/// The raw option strings.
#[derive(Debug, Default, Clone)]
pub struct Raw<'a> {
    pub memory: Option<&'a str>,
    pub memory_swap: Option<&'a str>,
    pub cpus: Option<&'a str>,
    pub cpu_weight: Option<&'a str>,
    pub pids: Option<&'a str>,
    pub io_weight: Option<&'a str>,
    pub rlimits: &'a [String],
    pub timeout: Option<&'a str>,
}

fn weight(s: &str) -> Option<u64> {
    s.trim()
        .parse::<u64>()
        .ok()
        .filter(|w| (1..=10_000).contains(w))
}

impl Limits {
    pub fn parse(raw: &Raw<'_>) -> Result<Self, LimitError> {
        let mut l = Limits::default();
        if let Some(m) = raw.memory {
            let v = units::parse_size(m).map_err(LimitError::Memory)?;
            if v < (1 << 20) {
                return Err(LimitError::MemoryTooSmall);
            }
            l.memory = Some(v);
        }
        if let Some(s) = raw.memory_swap {
            let v = units::parse_size(s).map_err(LimitError::Swap)?;
            let Some(m) = l.memory else {
                return Err(LimitError::SwapWithoutMemory);
            };
            if v < m {
                return Err(LimitError::SwapBelowMemory(
                    s.into(),
                    raw.memory.unwrap_or("").into(),
                ));
            }
            l.memory_swap = Some(v);
        }
        if let Some(c) = raw.cpus {
            let v: f64 = c.trim().parse().map_err(|_| LimitError::Cpus(c.into()))?;
            if !(0.01..=1_000_000.0).contains(&v) {
                return Err(LimitError::Cpus(c.into()));
            }
            l.cpu_quota_us = Some((v * CPU_PERIOD_US as f64).round() as u64);
        }
        if let Some(w) = raw.cpu_weight {
            l.cpu_weight = Some(weight(w).ok_or_else(|| LimitError::CpuWeight(w.into()))?);
        }
        if let Some(w) = raw.io_weight {
            l.io_weight = Some(weight(w).ok_or_else(|| LimitError::IoWeight(w.into()))?);
        }
        if let Some(p) = raw.pids {
            let v = p
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|v| *v >= 1 && *v <= i64::MAX as u64)
                .ok_or_else(|| LimitError::Pids(p.into()))?;
            l.pids = Some(v);
        }
        for r in raw.rlimits {
            let r = Rlimit::parse(r)?;
            // A later --rlimit for the same name wins.
            l.rlimits.retain(|o| o.resource != r.resource);
            l.rlimits.push(r);
        }
        if let Some(t) = raw.timeout {
            let d = units::parse_duration(t).map_err(LimitError::Timeout)?;
            if d.is_zero() {
                return Err(LimitError::TimeoutZero);
            }
            l.timeout = Some(d);
        }
        Ok(l)
    }

    /// cgroup v1 `cpu.shares` for a v2 weight (100 -> 1024, as systemd maps).
    pub fn v1_shares(weight: u64) -> u64 {
        (weight * 1024 / 100).clamp(2, 262_144)
    }

    /// cgroup v1 `blkio.weight` (10-1000, default 500) for a v2 io weight
    /// (1-10000, default 100): linear on both sides of the defaults.
    pub fn v1_blkio_weight(weight: u64) -> u64 {
        if weight <= 100 {
            10 + (weight - 1) * 490 / 99
        } else {
            500 + (weight - 100) * 500 / 9_900
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_everything() {
        let rl = vec![
            "fsize=1M".to_string(),
            "nofile=64".to_string(),
            "fsize=2M".to_string(),
        ];
        let l = Limits::parse(&Raw {
            memory: Some("256M"),
            memory_swap: Some("512M"),
            cpus: Some("0.5"),
            cpu_weight: Some("50"),
            pids: Some("64"),
            io_weight: Some("200"),
            rlimits: &rl,
            timeout: Some("1m"),
        })
        .unwrap();
        assert_eq!(l.memory, Some(256 << 20));
        assert_eq!(l.memory_swap, Some(512 << 20));
        assert_eq!(l.cpu_quota_us, Some(50_000));
        assert_eq!(l.pids, Some(64));
        assert_eq!(l.rlimits.len(), 2);
        assert_eq!(l.rlimits[1].soft, 2 << 20);
        assert_eq!(l.timeout, Some(Duration::from_secs(60)));
    }

    #[test]
    fn rejects_bad_input() {
        let bad = [
            Raw {
                memory: Some("12Q"),
                ..Default::default()
            },
            Raw {
                memory: Some("10"),
                ..Default::default()
            },
            Raw {
                memory_swap: Some("1G"),
                ..Default::default()
            },
            Raw {
                memory: Some("1G"),
                memory_swap: Some("512M"),
                ..Default::default()
            },
            Raw {
                cpus: Some("0"),
                ..Default::default()
            },
            Raw {
                cpus: Some("-1"),
                ..Default::default()
            },
            Raw {
                cpus: Some("NaN"),
                ..Default::default()
            },
            Raw {
                cpu_weight: Some("0"),
                ..Default::default()
            },
            Raw {
                io_weight: Some("10001"),
                ..Default::default()
            },
            Raw {
                pids: Some("0"),
                ..Default::default()
            },
            Raw {
                timeout: Some("5x"),
                ..Default::default()
            },
            Raw {
                timeout: Some("0"),
                ..Default::default()
            },
        ];
        for r in bad {
            assert!(Limits::parse(&r).is_err(), "{r:?}");
        }
    }

    #[test]
    fn weight_maps() {
        assert_eq!(Limits::v1_shares(100), 1024);
        assert_eq!(Limits::v1_shares(1), 10);
        assert_eq!(Limits::v1_blkio_weight(100), 500);
        assert_eq!(Limits::v1_blkio_weight(1), 10);
        assert_eq!(Limits::v1_blkio_weight(10_000), 1000);
    }
}
