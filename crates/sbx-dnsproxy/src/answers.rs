//! The answers the proxy gave: which allowlisted names resolved to which
//! IPs, until when. sbx-net allows a connection to an IP only for the
//! names (and so the ports) that resolved to it here.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One (name, IP) pair and when it stops being valid (TTL + grace).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub name: String,
    pub ip: IpAddr,
    /// The TTL the client was given (seconds).
    pub ttl: u32,
    pub expires: Instant,
}

/// (name, TTL given, valid until) per address.
type Entries = Vec<(Box<str>, u32, Instant)>;

#[derive(Debug, Default)]
struct Inner {
    by_ip: HashMap<IpAddr, Entries, foldhash::fast::RandomState>,
    /// Entries recorded since the last sweep (sweeps are amortised).
    since_sweep: usize,
}

/// Thread-safe log of the answers given.
#[derive(Debug)]
pub struct AnswerLog {
    inner: Mutex<Inner>,
    grace: Duration,
}

impl AnswerLog {
    pub fn new(grace: Duration) -> Self {
        AnswerLog {
            inner: Mutex::new(Inner::default()),
            grace,
        }
    }

    /// The grace period added to every TTL.
    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// Records that `name` resolved to `ip` with `ttl` seconds.
    pub fn record(&self, name: &str, ip: IpAddr, ttl: u32) {
        let expires = Instant::now() + Duration::from_secs(u64::from(ttl)) + self.grace;
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let v = g.by_ip.entry(ip).or_default();
        match v.iter_mut().find(|(n, _, _)| &**n == name) {
            Some(e) => {
                if expires > e.2 {
                    e.2 = expires;
                }
                e.1 = ttl;
            }
            None => v.push((name.into(), ttl, expires)),
        }
        g.since_sweep += 1;
        if g.since_sweep > 4096 && g.since_sweep > g.by_ip.len() {
            g.since_sweep = 0;
            let now = Instant::now();
            g.by_ip.retain(|_, v| {
                v.retain(|e| e.2 > now);
                !v.is_empty()
            });
        }
    }

    /// Allowlisted names whose answers gave `ip` and are still valid
    /// (TTL + grace).
    pub fn names_for(&self, ip: IpAddr) -> Vec<String> {
        self.lookup(ip).into_iter().map(|a| a.name).collect()
    }

    /// Same as [`AnswerLog::names_for`] with the TTL and expiry of each.
    pub fn lookup(&self, ip: IpAddr) -> Vec<Answer> {
        let now = Instant::now();
        let ip = canonical(ip);
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.by_ip
            .get(&ip)
            .map(|v| {
                v.iter()
                    .filter(|e| e.2 > now)
                    .map(|(n, ttl, exp)| Answer {
                        name: n.to_string(),
                        ip,
                        ttl: *ttl,
                        expires: *exp,
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every valid answer (for diagnostics and `--stats`).
    pub fn snapshot(&self) -> Vec<Answer> {
        let now = Instant::now();
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        for (ip, v) in &g.by_ip {
            for (n, ttl, exp) in v {
                if *exp > now {
                    out.push(Answer {
                        name: n.to_string(),
                        ip: *ip,
                        ttl: *ttl,
                        expires: *exp,
                    });
                }
            }
        }
        out
    }

    /// Number of valid (name, IP) pairs.
    pub fn len(&self) -> usize {
        self.snapshot().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An IPv4-mapped IPv6 address is looked up as the IPv4 address it is
/// (a dual-stack socket reports IPv4 peers that way).
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => ip,
        },
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_expires() {
        let log = AnswerLog::new(Duration::ZERO);
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        log.record("a.example.com", ip, 60);
        log.record("b.example.com", ip, 0);
        log.record("a.example.com", ip, 60);
        assert_eq!(log.names_for(ip), vec!["a.example.com".to_string()]);
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
        assert_eq!(log.names_for(mapped), vec!["a.example.com".to_string()]);
        assert!(log.names_for("192.0.2.2".parse().unwrap()).is_empty());
    }
}
