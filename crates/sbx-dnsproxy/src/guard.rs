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
    /// The part below the wildcard entry reads as encoded data.
    Encoded {
        len: usize,
        why: &'static str,
    },
    /// The client's new names in the window carry more bytes than allowed.
    TooManyNovelBytes {
        bytes: usize,
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
            Suspicion::Encoded { .. } => "tunnel_encoded",
            Suspicion::TooManyNovelBytes { .. } => "tunnel_novel_bytes",
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
            Suspicion::Encoded { len, why } => {
                format!("{len} characters below the allowed entry read as encoded data ({why})")
            }
            Suspicion::TooManyNovelBytes { bytes, max } => {
                format!("{bytes} bytes of new names in the window (max {max})")
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
    if limits.max_label_len > 0 && name.len() > limits.max_label_len {
        // Longest label, without splitting (this runs for every query).
        let (mut cur, mut l) = (0usize, 0usize);
        for &b in name.as_bytes() {
            if b == b'.' {
                cur = 0;
            } else {
                cur += 1;
                l = l.max(cur);
            }
        }
        if l > limits.max_label_len {
            return Some(Suspicion::LabelTooLong {
                len: l,
                max: limits.max_label_len,
            });
        }
    }
    // The part below the entry is short for almost every real name: the
    // scores below are not computed at all then.
    if limits.max_entropy > 0.0 && below.len() >= limits.entropy_min_len.max(1) {
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
    encoded_check(limits, below)
}

/// Letter/digit statistics of the part of a name below its wildcard
/// entry, by label (a pair of characters is counted only within a label;
/// `-` and `_` break pairs and runs). Punycode labels (`xn--`) are left
/// out: they encode Unicode words, not data.
#[derive(Debug, Default, PartialEq)]
pub struct LabelStats {
    /// Letters and digits counted.
    pub chars: usize,
    pub letters: usize,
    pub digits: usize,
    pub vowels: usize,
    /// Adjacent letter-or-digit pairs, and those that switch between a
    /// letter and a digit.
    pub pairs: usize,
    pub switches: usize,
    /// Longest run of consonants (letters but a, e, i, o, u, y).
    pub consonant_run: usize,
}

pub fn label_stats(below: &str) -> LabelStats {
    let mut st = LabelStats::default();
    for label in below.split('.') {
        if label.starts_with("xn--") {
            continue;
        }
        let mut prev: Option<u8> = None;
        let mut run = 0usize;
        for &b in label.as_bytes() {
            let c = b.to_ascii_lowercase();
            if !c.is_ascii_alphanumeric() {
                prev = None;
                run = 0;
                continue;
            }
            st.chars += 1;
            if c.is_ascii_digit() {
                st.digits += 1;
                run = 0;
            } else {
                st.letters += 1;
                if b"aeiouy".contains(&c) {
                    st.vowels += 1;
                    run = 0;
                } else {
                    run += 1;
                    st.consonant_run = st.consonant_run.max(run);
                }
            }
            if let Some(p) = prev {
                st.pairs += 1;
                if p.is_ascii_digit() != c.is_ascii_digit() {
                    st.switches += 1;
                }
            }
            prev = Some(c);
        }
    }
    st
}

/// Whether the part below the wildcard entry reads as encoded data,
/// whatever the alphabet: hex, base32 and base64url spread digits among
/// letters (a letter/digit switch in a quarter of the pairs or more, with
/// an eighth of the characters digits), and their letters are chosen
/// without regard to pronunciation (six consonants in a row, or under
/// 18% vowels over a dozen letters). Words and the names people and
/// CDNs make (`static-content-eu`, `ec2-54-1-2-3`, `d1a2b3c4`: shorter
/// than `encoded_min_len`) do neither.
pub fn encoded_check(limits: &TunnelLimits, below: &str) -> Option<Suspicion> {
    if limits.encoded_min_len == 0 || below.len() < limits.encoded_min_len {
        return None;
    }
    let st = label_stats(below);
    if st.chars < limits.encoded_min_len {
        return None;
    }
    let why = if st.digits >= 2
        && st.letters >= 2
        && st.switches * 4 >= st.pairs
        && st.digits * 8 >= st.chars
    {
        "letters and digits interleaved"
    } else if st.consonant_run >= 6 {
        "a run of six or more consonants"
    } else if st.letters >= 12 && st.vowels * 100 < st.letters * 18 {
        "too few vowels"
    } else {
        return None;
    };
    Some(Suspicion::Encoded { len: st.chars, why })
}

/// The parent a distinct-name budget is kept for: the last two labels of
/// the wildcard entry (`*.s3.amazonaws.com` and `*.amazonaws.com` share
/// `amazonaws.com`), so several wildcard entries under one registered
/// domain do not add up to several budgets. Without the public suffix
/// list, `*.a.co.uk` and `*.b.co.uk` share `co.uk`: stricter, not looser.
pub fn registered_parent(suffix: &str) -> &str {
    let mut dots = suffix.rmatch_indices('.');
    let _ = dots.next();
    match dots.next() {
        Some((i, _)) => &suffix[i + 1..],
        None => suffix,
    }
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
    /// when this is a new name beyond the limit (the tests' shorthand of
    /// [`SubdomainTracker::note`]).
    #[cfg(test)]
    pub fn check(
        &self,
        limits: &TunnelLimits,
        client: IpAddr,
        suffix: &str,
        name: &str,
    ) -> Option<Suspicion> {
        self.note(limits, client, suffix, name).err()
    }

    /// [`SubdomainTracker::check`], telling also whether the name was
    /// already seen in the window (`Ok(true)`: a repeat carries no new
    /// data, the novel-bytes budget need not look at it). With the limit
    /// off every name is new.
    pub fn note(
        &self,
        limits: &TunnelLimits,
        client: IpAddr,
        suffix: &str,
        name: &str,
    ) -> Result<bool, Suspicion> {
        let max = limits.max_distinct_per_window;
        if max == 0 {
            return Ok(false);
        }
        let now = Instant::now();
        let key = (client, self.h(registered_parent(suffix)));
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
            return Ok(true);
        }
        if w.names.len() >= max {
            return Err(Suspicion::TooManySubdomains {
                seen: w.names.len() + 1,
                max,
                suffix: suffix.to_string(),
            });
        }
        w.names.insert(nh);
        Ok(false)
    }
}

struct Novel {
    start: Instant,
    names: HashSet<u64>,
    bytes: usize,
}

/// Bytes of distinct new names below wildcard entries per client per
/// window, every entry together: whatever the encoding, a tunnel has to
/// send its data as new names, and this caps how much.
#[derive(Default)]
pub struct NovelBytes {
    map: Mutex<HashMap<IpAddr, Novel, foldhash::fast::RandomState>>,
    hasher: foldhash::fast::RandomState,
}

impl NovelBytes {
    /// Notes `below` (the part of `name` under its wildcard entry) asked by
    /// `client`; a suspicion when it is new and over the budget.
    pub fn check(
        &self,
        limits: &TunnelLimits,
        client: IpAddr,
        name: &str,
        below: &str,
    ) -> Option<Suspicion> {
        let max = limits.max_novel_bytes_per_window;
        if max == 0 || below.is_empty() {
            return None;
        }
        let now = Instant::now();
        let nh = self.hasher.hash_one(name);
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() >= MAX_TRACKED && !m.contains_key(&client) {
            make_room(&mut m, |w| now.duration_since(w.start) >= limits.window);
        }
        let w = m.entry(client).or_insert_with(|| Novel {
            start: now,
            names: HashSet::new(),
            bytes: 0,
        });
        if now.duration_since(w.start) >= limits.window {
            w.start = now;
            w.names.clear();
            w.bytes = 0;
        }
        if w.names.contains(&nh) {
            return None;
        }
        let bytes = w.bytes + below.len();
        if bytes > max {
            return Some(Suspicion::TooManyNovelBytes { bytes, max });
        }
        w.names.insert(nh);
        w.bytes = bytes;
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

    /// A tiny xorshift, so the samples are the same on every run.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn base_n(b: &[u8], alphabet: &[u8], bits: u32) -> String {
        let (mut acc, mut have, mut out) = (0u32, 0u32, String::new());
        for &x in b {
            acc = (acc << 8) | u32::from(x);
            have += 8;
            while have >= bits {
                have -= bits;
                out.push(alphabet[((acc >> have) & ((1 << bits) - 1)) as usize] as char);
            }
        }
        out
    }

    fn base32(b: &[u8]) -> String {
        base_n(b, b"abcdefghijklmnopqrstuvwxyz234567", 5)
    }

    fn base64url(b: &[u8]) -> String {
        // Lower-cased, as the proxy sees every name.
        base_n(
            b,
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_",
            6,
        )
        .to_ascii_lowercase()
    }

    /// Data split into labels of at most `per` characters.
    fn labels(s: &str, per: usize) -> String {
        s.as_bytes()
            .chunks(per)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect::<Vec<_>>()
            .join(".")
    }

    /// Hex, base32 and base64url tunnel names, of every length from the
    /// threshold up, in labels short enough for the length checks and
    /// (hex) within the entropy limit: the static checks (entropy and the
    /// encoding score) catch at least 95% of them on the first query,
    /// whatever the alphabet; the budgets catch the rest within a window.
    #[test]
    fn encoded_data_is_caught_whatever_the_alphabet() {
        let limits = TunnelLimits::default();
        let mut rng = Rng(0x5eed_1234_abcd_ef01);
        for (enc, f) in [
            ("hex", hex as fn(&[u8]) -> String),
            ("base32", base32),
            ("base64url", base64url),
        ] {
            let (mut caught, mut total) = (0, 0);
            for len in 20..=60 {
                for _ in 0..25 {
                    let mut data = f(&rng.bytes(len));
                    data.truncate(len);
                    let below = labels(&data, 30);
                    total += 1;
                    let name = format!("{below}.t.allowed.test");
                    if static_check(&limits, &name, &below).is_some() {
                        caught += 1;
                    }
                }
            }
            let rate = f64::from(caught) / f64::from(total);
            eprintln!("{enc}: {caught}/{total} caught");
            assert!(rate >= 0.95, "{enc}: only {caught}/{total} caught");
        }
        // Hex stays under the entropy limit (4 bits/char at most): the
        // encoding score is what catches it.
        let h = hex(&rng.bytes(20));
        assert!(entropy(h.as_bytes()) <= 4.0);
        assert!(matches!(
            static_check(&limits, &format!("{h}.t.allowed.test"), &h),
            Some(Suspicion::Encoded { .. })
        ));
    }

    /// Names people and services make are not scored as data. CDN hashes
    /// (`d1a2b3c4.cloudfront.net`, `r2---sn-4g5e6nsz.googlevideo.com`)
    /// are shorter than the threshold: they pass the score and count only
    /// toward the distinct-name and novel-bytes budgets.
    #[test]
    fn ordinary_names_are_not_encoded() {
        let limits = TunnelLimits::default();
        for below in [
            "d1a2b3c4",
            "d111111abcdef8",
            "r2---sn-4g5e6nsz",
            "ec2-54-123-45-67.eu-west-1.compute",
            "static-content-production-eu",
            "my-loadbalancer-1234567890.us-west-2.elb",
            "ip-10-0-0-1.ec2.internal",
            "registry-1.docker",
            "production.cloudflare.docker",
            "objects.githubusercontent",
            "raw.githubusercontent",
            "pipelines.actions.githubusercontent",
            "storage.googleapis",
            "fonts.gstatic",
            "xn--80akhbyknj4f.xn--p1ai-mirror",
            "api.anthropic",
            "login.microsoftonline",
            "prod-useast-b.online.tableau",
            "content-autofill.googleapis",
            "safebrowsing.googleapis",
            "update.googleapis",
            "cdn.jsdelivr",
            "mirrors.kernel.org.debian",
            "deb.debian.org.security",
            "us-east-1.console.aws",
            "bucket-name-2024-logs.s3",
            "abcdefghijklmnop",
            "documentation-website",
            "strengths-and-rhythms",
            "authentication-service-v2",
        ] {
            assert_eq!(encoded_check(&limits, below), None, "{below}");
        }
    }

    #[test]
    fn novel_bytes_budget_counts_new_names_once() {
        let limits = TunnelLimits {
            max_novel_bytes_per_window: 10,
            ..Default::default()
        };
        let n = NovelBytes::default();
        let c: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(n.check(&limits, c, "abcd.x.com", "abcd"), None);
        assert_eq!(n.check(&limits, c, "efgh.y.com", "efgh"), None);
        assert_eq!(n.check(&limits, c, "abcd.x.com", "abcd"), None, "a repeat");
        assert!(matches!(
            n.check(&limits, c, "ijkl.x.com", "ijkl"),
            Some(Suspicion::TooManyNovelBytes { bytes: 12, max: 10 })
        ));
        assert_eq!(n.check(&limits, c, "ij.x.com", "ij"), None, "still room");
    }

    #[test]
    fn parents_share_a_budget() {
        assert_eq!(registered_parent("s3.amazonaws.com"), "amazonaws.com");
        assert_eq!(registered_parent("amazonaws.com"), "amazonaws.com");
        assert_eq!(registered_parent("test"), "test");
        let limits = TunnelLimits {
            max_distinct_per_window: 2,
            ..Default::default()
        };
        let t = SubdomainTracker::default();
        let c: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(t.check(&limits, c, "a.x.com", "1.a.x.com"), None);
        assert_eq!(t.check(&limits, c, "x.com", "2.x.com"), None);
        assert!(t.check(&limits, c, "b.x.com", "3.b.x.com").is_some());
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
