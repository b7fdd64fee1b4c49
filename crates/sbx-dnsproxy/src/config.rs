//! What a [`crate::DnsProxy`] is built from.

use std::net::SocketAddr;
use std::time::Duration;

use hickory_proto::rr::RecordType;

/// Tunnelling heuristics (applied to allowlisted names too: a tunnel can
/// hide under `*.allowed.com`). A zero disables a limit.
#[derive(Debug, Clone, PartialEq)]
pub struct TunnelLimits {
    /// Longest label allowed (bytes).
    pub max_label_len: usize,
    /// Longest name allowed (bytes, without the trailing dot).
    pub max_name_len: usize,
    /// Shannon entropy (bits per character) above which the part of a name
    /// below its allowlisted suffix is suspicious...
    pub max_entropy: f64,
    /// ...when that part is at least this long (entropy of short strings
    /// says nothing).
    pub entropy_min_len: usize,
    /// Distinct names one client may ask under one wildcard entry per
    /// window; names already seen in the window still resolve.
    pub max_distinct_per_window: usize,
    /// Queries for allowlisted names one client may make per window, cache
    /// hits, repeats and TTL-0 answers included: the choice of which
    /// allowed (name, type) to ask, and when, is a channel of its own.
    pub max_queries_per_window: usize,
    /// Shortest part below the wildcard entry (dots removed) that the
    /// encoding score ([`crate::guard::encoded_check`]) judges: hex,
    /// base32 and base64url data look alike to it whatever the alphabet.
    pub encoded_min_len: usize,
    /// Bytes of new names (the part below the wildcard entry, each
    /// distinct name counted once) one client may send per window, over
    /// every wildcard entry together: the ceiling of any encoding.
    pub max_novel_bytes_per_window: usize,
    pub window: Duration,
}

impl Default for TunnelLimits {
    fn default() -> Self {
        TunnelLimits {
            max_label_len: 48,
            max_name_len: 160,
            max_entropy: 4.0,
            entropy_min_len: 24,
            max_distinct_per_window: 100,
            max_queries_per_window: 1000,
            encoded_min_len: 20,
            max_novel_bytes_per_window: 2048,
            window: Duration::from_secs(60),
        }
    }
}

/// Configuration of a proxy. `Default` gives the documented defaults
/// with an empty allowlist and no upstream.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Allowlist entries: `example.com`, `*.example.com`, IP literals.
    pub allow: Vec<String>,
    /// Upstream servers, asked in order.
    pub upstreams: Vec<SocketAddr>,
    /// Query types answered; everything else is refused.
    pub qtypes: Vec<RecordType>,
    /// Answer NXDOMAIN instead of REFUSED for names not allowlisted.
    pub nxdomain_for_refused: bool,
    pub tunnel: TunnelLimits,
    /// What a "client" is for the rate limits and the tunnelling budgets:
    /// the source address masked to this many bits (IPv4; 24 = a /24), so
    /// a host rotating over many source addresses is still one client.
    /// sbx-net sets both to 0: every client is the sandbox.
    pub client_prefix_v4: u8,
    /// The same for IPv6 (56 = a /56).
    pub client_prefix_v6: u8,
    /// Refused queries answered per client per second (then dropped).
    pub refused_rate: u32,
    /// Burst of refused answers per client.
    pub refused_burst: u32,
    /// Domains (and their subdomains) whose answers may point to private,
    /// loopback or link-local addresses or to this host's own.
    pub rebind_allow: Vec<String>,
    /// Turn rebinding protection off entirely (not recommended).
    pub no_rebind_protection: bool,
    /// Time one upstream gets to answer one attempt.
    pub upstream_timeout: Duration,
    /// Upper bound for a whole query (all upstreams, CNAME following);
    /// after it the client gets SERVFAIL.
    pub query_timeout: Duration,
    /// Cache entries kept (0 disables the cache).
    pub cache_size: usize,
    /// Longest time an answer is cached (TTLs above are clamped).
    pub max_ttl: Duration,
    /// Longest time a negative answer (NXDOMAIN, no data) is cached.
    pub max_negative_ttl: Duration,
    /// How long an answered IP stays valid in the [`crate::AnswerLog`]
    /// after its TTL ran out.
    pub answer_grace: Duration,
    /// Largest UDP reply sent to an EDNS client (the reply to a client
    /// without EDNS is at most 512 bytes).
    pub udp_payload: u16,
    /// Answer common queries from prebuilt wire templates (same answers,
    /// less work); off sends everything through hickory-proto.
    pub fast_path: bool,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            allow: Vec::new(),
            upstreams: Vec::new(),
            qtypes: default_qtypes(),
            nxdomain_for_refused: false,
            tunnel: TunnelLimits::default(),
            client_prefix_v4: 24,
            client_prefix_v6: 56,
            refused_rate: 20,
            refused_burst: 40,
            rebind_allow: Vec::new(),
            no_rebind_protection: false,
            upstream_timeout: Duration::from_millis(1500),
            query_timeout: Duration::from_secs(4),
            cache_size: 10_000,
            max_ttl: Duration::from_secs(3600),
            max_negative_ttl: Duration::from_secs(300),
            answer_grace: Duration::from_secs(30),
            udp_payload: 1232,
            fast_path: true,
        }
    }
}

/// A, AAAA, CNAME, HTTPS, SVCB.
pub fn default_qtypes() -> Vec<RecordType> {
    vec![
        RecordType::A,
        RecordType::AAAA,
        RecordType::CNAME,
        RecordType::HTTPS,
        RecordType::SVCB,
    ]
}

/// Parses a record type name (`A`, `aaaa`, `HTTPS`, `TYPE65`).
pub fn parse_qtype(s: &str) -> Result<RecordType, String> {
    let up = s.trim().to_ascii_uppercase();
    if let Some(n) = up.strip_prefix("TYPE")
        && let Ok(v) = n.parse::<u16>()
    {
        return Ok(RecordType::from(v));
    }
    let t: RecordType = up
        .parse()
        .map_err(|_| format!("unknown record type '{s}'"))?;
    match t {
        RecordType::AXFR | RecordType::IXFR | RecordType::ANY | RecordType::OPT => {
            Err(format!("record type '{s}' cannot be allowed"))
        }
        t => Ok(t),
    }
}
