//! Tunnelling heuristics and the rate limit of refused answers.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hash};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::TunnelLimits;

/// Why a name looks like a tunnel.
#[derive(Debug, Clone, PartialEq)]
pub enum Suspicion {
    LabelTooLong {
        len: usize,
        max: usize,
    },
    NameTooLong {
        len: usize,
        max: usize,
    },
    HighEntropy {
        bits: f64,
        max: f64,
    },
    TooManySubdomains {
        seen: usize,
        max: usize,
        suffix: String,
    },
    TooManyQueries {
        seen: usize,
        max: usize,
    },
}

impl Suspicion {
    pub fn reason(&self) -> &'static str {
        match self {
            Suspicion::LabelTooLong { .. } => "tunnel_label_length",
            Suspicion::NameTooLong { .. } => "tunnel_name_length",
            Suspicion::HighEntropy { .. } => "tunnel_entropy",
            Suspicion::TooManySubdomains { .. } => "tunnel_subdomain_rate",
            Suspicion::TooManyQueries { .. } => "tunnel_query_budget",
        }
    }

    pub fn detail(&self) -> String {
        match self {
            Suspicion::LabelTooLong { len, max } => format!("label of {len} bytes (max {max})"),
            Suspicion::NameTooLong { len, max } => format!("name of {len} bytes (max {max})"),
            Suspicion::HighEntropy { bits, max } => {
                format!("subdomain entropy {bits:.2} bits/char (max {max:.2})")
            }
            Suspicion::TooManySubdomains { seen, max, suffix } => {
                format!("{seen} distinct names under {suffix} in the window (max {max})")
            }
            Suspicion::TooManyQueries { seen, max } => {
                format!("{seen} queries for allowed names in the window (max {max})")
            }
        }
    }
}

/// Shannon entropy of `s` in bits per byte.
pub fn entropy(s: &[u8]) -> f64 {
    if s.is_empty() {
        return 0.0;
    }
    let mut counts = [0u32; 256];
    for &b in s {
        counts[b as usize] += 1;
    }
    let n = s.len() as f64;
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = f64::from(c) / n;
            -p * p.log2()
        })
        .sum()
}

/// The static checks: lengths and entropy. `below` is the part of the name
/// under the allowlisted suffix (empty for an exact entry).
pub fn static_check(limits: &TunnelLimits, name: &str, below: &str) -> Option<Suspicion> {
    if limits.max_name_len > 0 && name.len() > limits.max_name_len {
        return Some(Suspicion::NameTooLong {
            len: name.len(),
            max: limits.max_name_len,
        });
    }
    if limits.max_label_len > 0
        && let Some(l) = name.split('.').map(str::len).max()
        && l > limits.max_label_len
    {
        return Some(Suspicion::LabelTooLong {
            len: l,
            max: limits.max_label_len,
        });
    }
    if limits.max_entropy > 0.0 {
        let chars: Vec<u8> = below.bytes().filter(|&b| b != b'.').collect();
        if chars.len() >= limits.entropy_min_len.max(1) {
            let bits = entropy(&chars);
            if bits > limits.max_entropy {
                return Some(Suspicion::HighEntropy {
                    bits,
                    max: limits.max_entropy,
                });
            }
        }
    }
    None
}

/// The client a query is counted against: its address masked to the
/// configured prefix (0 bits: every client is one, as inside sbx-net).
pub fn client_key(ip: IpAddr, v4_bits: u8, v6_bits: u8) -> IpAddr {
    match ip {
        IpAddr::V4(a) => {
            let bits = u32::from(v4_bits.min(32));
            let m = if bits == 0 {
                0
            } else {
                u32::MAX << (32 - bits)
            };
            if v4_bits == 0 && v6_bits == 0 {
                return IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);
            }
            IpAddr::V4((u32::from(a) & m).into())
        }
        IpAddr::V6(a) => {
            if let Some(v4) = a.to_ipv4_mapped() {
                return client_key(IpAddr::V4(v4), v4_bits, v6_bits);
            }
            if v4_bits == 0 && v6_bits == 0 {
                return IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);
            }
            let bits = u32::from(v6_bits.min(128));
            let m = if bits == 0 {
                0
            } else {
                u128::MAX << (128 - bits)
            };
            IpAddr::V6((u128::from(a) & m).into())
        }
    }
}

/// Makes room in a full map without locking anyone out: first what is
/// stale, then (still full of live entries: a flood of fresh clients)
/// every other entry. Amortised O(1) per insertion; an evicted client
/// starts over with a fresh budget, which only a flood of distinct client
/// prefixes can cause (impossible inside sbx-net: one client).
fn make_room<K, V, S>(m: &mut HashMap<K, V, S>, stale: impl FnMut(&V) -> bool) {
    let mut stale = stale;
    m.retain(|_, v| !stale(v));
    if m.len() >= MAX_TRACKED * 3 / 4 {
        let mut i = 0usize;
        m.retain(|_, _| {
            i += 1;
            i.is_multiple_of(2)
        });
    }
}

struct Window {
    start: Instant,
    names: HashSet<u64>,
}

/// Distinct names per (client, wildcard suffix) per window.
pub struct SubdomainTracker {
    map: Mutex<HashMap<(IpAddr, u64), Window, foldhash::fast::RandomState>>,
    hasher: foldhash::fast::RandomState,
}

/// Clients tracked at most; beyond it stale windows are dropped first.
const MAX_TRACKED: usize = 65_536;

impl Default for SubdomainTracker {
    fn default() -> Self {
        SubdomainTracker {
            map: Mutex::new(HashMap::default()),
            hasher: foldhash::fast::RandomState::default(),
        }
    }
}

impl SubdomainTracker {
    fn h<T: Hash + ?Sized>(&self, t: &T) -> u64 {
        self.hasher.hash_one(t)
    }

    /// Notes that `client` asked `name` under `suffix`; returns a suspicion
    /// when this is a new name beyond the limit.
    pub fn check(
        &self,
        limits: &TunnelLimits,
        client: IpAddr,
        suffix: &str,
        name: &str,
    ) -> Option<Suspicion> {
        let max = limits.max_distinct_per_window;
        if max == 0 {
            return None;
        }
        let now = Instant::now();
        let key = (client, self.h(suffix));
        let nh = self.h(name);
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() >= MAX_TRACKED && !m.contains_key(&key) {
            make_room(&mut m, |w| now.duration_since(w.start) >= limits.window);
        }
        let w = m.entry(key).or_insert_with(|| Window {
            start: now,
            names: HashSet::new(),
        });
        if now.duration_since(w.start) >= limits.window {
            w.start = now;
            w.names.clear();
        }
        if w.names.contains(&nh) {
            return None;
        }
        if w.names.len() >= max {
            return Some(Suspicion::TooManySubdomains {
                seen: w.names.len() + 1,
                max,
                suffix: suffix.to_string(),
            });
        }
        w.names.insert(nh);
        None
    }
}

/// Queries for allowed names per client per window, whatever the cache
/// answers (the choice-of-name channel).
#[derive(Default)]
pub struct QueryBudget {
    map: Mutex<HashMap<IpAddr, (Instant, usize), foldhash::fast::RandomState>>,
}

impl QueryBudget {
    /// Counts one query of `client`; a suspicion once it is over budget.
    pub fn check(&self, limits: &TunnelLimits, client: IpAddr) -> Option<Suspicion> {
        let max = limits.max_queries_per_window;
        if max == 0 {
            return None;
        }
        let now = Instant::now();
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() >= MAX_TRACKED && !m.contains_key(&client) {
            make_room(&mut m, |(start, _)| {
                now.duration_since(*start) >= limits.window
            });
        }
        let w = m.entry(client).or_insert((now, 0));
        if now.duration_since(w.0) >= limits.window {
            *w = (now, 0);
        }
        w.1 += 1;
        (w.1 > max).then_some(Suspicion::TooManyQueries { seen: w.1, max })
    }
}

struct Bucket {
    tokens: f64,
    last: Instant,
    dropped: u64,
    last_report: Option<Instant>,
}

/// What the refusal limiter says about one refused query.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Answer it (and alert).
    Answer,
    /// Drop it silently.
    Drop,
    /// Drop it, and report that `n` refused queries of this client were
    /// dropped since the last report.
    DropAndReport(u64),
}

/// A token bucket per client for refused answers (and their alerts).
pub struct RefusalLimiter {
    rate: f64,
    burst: f64,
    map: Mutex<HashMap<IpAddr, Bucket, foldhash::fast::RandomState>>,
}

impl RefusalLimiter {
    pub fn new(rate: u32, burst: u32) -> Self {
        RefusalLimiter {
            rate: f64::from(rate),
            burst: f64::from(burst.max(1)),
            map: Mutex::new(HashMap::default()),
        }
    }

    pub fn check(&self, client: IpAddr) -> Verdict {
        if self.rate <= 0.0 {
            return Verdict::Answer;
        }
        let now = Instant::now();
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() >= MAX_TRACKED && !m.contains_key(&client) {
            let (rate, burst) = (self.rate, self.burst);
            make_room(&mut m, |b| {
                b.tokens + now.duration_since(b.last).as_secs_f64() * rate >= burst
            });
        }
        let b = m.entry(client).or_insert(Bucket {
            tokens: self.burst,
            last: now,
            dropped: 0,
            last_report: None,
        });
        b.tokens =
            (b.tokens + now.duration_since(b.last).as_secs_f64() * self.rate).min(self.burst);
        b.last = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            return Verdict::Answer;
        }
        b.dropped += 1;
        let due = b
            .last_report
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1));
        if due {
            b.last_report = Some(now);
            let n = b.dropped;
            b.dropped = 0;
            Verdict::DropAndReport(n)
        } else {
            Verdict::Drop
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entropy_separates_random_from_words() {
        let limits = TunnelLimits::default();
        // base32 of random bytes, as iodine/dnscat2 send.
        let tunnel = "mzxw6ytboi4dcnrtgq2tmnzyhe3dkmbrgizdiobvgy3tqojqgeztinjw";
        assert!(matches!(
            static_check(
                &limits,
                &format!("{}.t.allowed.test", &tunnel[..40]),
                &tunnel[..40]
            ),
            Some(Suspicion::HighEntropy { .. })
        ));
        for ok in [
            "ec2-54-123-45-67.eu-west-1.compute",
            "static-content-production-eu",
            "www",
            "api",
        ] {
            assert_eq!(
                static_check(&limits, &format!("{ok}.amazonaws.com"), ok),
                None,
                "{ok}"
            );
        }
        let long_label = "a".repeat(60);
        assert!(matches!(
            static_check(&limits, &format!("{long_label}.x.com"), &long_label),
            Some(Suspicion::LabelTooLong { .. })
        ));
    }

    #[test]
    fn distinct_subdomains() {
        let limits = TunnelLimits {
            max_distinct_per_window: 3,
            ..Default::default()
        };
        let t = SubdomainTracker::default();
        let c: IpAddr = "127.0.0.1".parse().unwrap();
        for i in 0..3 {
            assert_eq!(t.check(&limits, c, "x.com", &format!("{i}.x.com")), None);
        }
        assert!(t.check(&limits, c, "x.com", "new.x.com").is_some());
        assert_eq!(
            t.check(&limits, c, "x.com", "1.x.com"),
            None,
            "seen names still resolve"
        );
        let other: IpAddr = "127.0.0.2".parse().unwrap();
        assert_eq!(t.check(&limits, other, "x.com", "new.x.com"), None);
    }

    #[test]
    fn client_keys_are_prefixes() {
        let k = |s: &str, a, b| client_key(s.parse().unwrap(), a, b).to_string();
        assert_eq!(k("127.1.2.3", 24, 56), "127.1.2.0");
        assert_eq!(k("2001:db8:1:2ff::9", 24, 56), "2001:db8:1:200::");
        assert_eq!(k("::ffff:10.1.2.3", 24, 56), "10.1.2.0");
        assert_eq!(k("127.1.2.3", 0, 0), "0.0.0.0");
        assert_eq!(k("::1", 0, 0), "0.0.0.0", "one sandbox, one client");
        assert_eq!(k("127.1.2.3", 32, 128), "127.1.2.3");
    }

    /// 65,536 live clients do not lock out the next one (or anyone).
    #[test]
    fn a_full_tracker_locks_nobody_out() {
        let limits = TunnelLimits {
            max_distinct_per_window: 1,
            ..Default::default()
        };
        let t = SubdomainTracker::default();
        for i in 0..=MAX_TRACKED as u32 + 10 {
            let c = IpAddr::V4((0x7f00_0000 | i).into());
            assert_eq!(t.check(&limits, c, "x.com", "a.x.com"), None, "client {i}");
        }
        let l = RefusalLimiter::new(1, 1);
        for i in 0..=MAX_TRACKED as u32 + 10 {
            let c = IpAddr::V4((0x7f00_0000 | i).into());
            assert_eq!(l.check(c), Verdict::Answer, "client {i}");
        }
        let b = QueryBudget::default();
        for i in 0..=MAX_TRACKED as u32 + 10 {
            let c = IpAddr::V4((0x7f00_0000 | i).into());
            assert_eq!(b.check(&limits, c), None, "client {i}");
        }
        assert!(t.map.lock().unwrap().len() <= MAX_TRACKED);
        assert!(l.map.lock().unwrap().len() <= MAX_TRACKED);
        assert!(b.map.lock().unwrap().len() <= MAX_TRACKED);
    }

    #[test]
    fn query_budget_counts_repeats() {
        let limits = TunnelLimits {
            max_queries_per_window: 3,
            ..Default::default()
        };
        let b = QueryBudget::default();
        let c: IpAddr = "127.0.0.1".parse().unwrap();
        for _ in 0..3 {
            assert_eq!(b.check(&limits, c), None);
        }
        assert!(matches!(
            b.check(&limits, c),
            Some(Suspicion::TooManyQueries { seen: 4, max: 3 })
        ));
    }

    #[test]
    fn limiter() {
        let l = RefusalLimiter::new(1, 2);
        let c: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(l.check(c), Verdict::Answer);
        assert_eq!(l.check(c), Verdict::Answer);
        assert_eq!(l.check(c), Verdict::DropAndReport(1));
        assert_eq!(l.check(c), Verdict::Drop);
    }
}
