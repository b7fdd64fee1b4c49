//! sbx-dnsproxy: an allowlisting DNS forwarder.
//!
//! As a library ([`DnsProxy`]) it answers DNS messages for sbx-net's
//! gateway and records the answers it gave ([`AnswerLog`]); as a daemon
//! (`sbx-dnsproxy --listen ... --upstream ... --allow ...`) it serves UDP
//! and TCP on its own and can publish answers to nftables sets.

pub mod allow;
mod answers;
mod cache;
mod config;
mod guard;
mod nftset;
mod proxy;
pub mod rebind;
mod server;
mod stats;
mod upstream;
mod wire;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use sbx_core::Failure;
use sbx_core::Severity;
use sbx_core::cli::CommonArgs;
use serde_json::json;

pub use allow::{AllowEntry, AllowError, Allowlist};
pub use answers::{Answer, AnswerLog};
pub use config::{ProxyConfig, TunnelLimits};
pub use proxy::{DnsProxy, DnsProxyError};

pub const TOOL: &str = "sbx-dnsproxy";

/// Parses and validates one allowlist entry (`example.com`,
/// `*.example.com`, an IP literal); the error names the entry. sbx-net
/// uses it for its `--allow NAME[:PORTS]` after splitting off the ports.
pub fn parse_allow_entry(s: &str) -> Result<AllowEntry, DnsProxyError> {
    Ok(allow::parse_allow_entry(s)?)
}

pub const MAN: sbx_core::man::ManInfo = sbx_core::man::ManInfo {
    about: "sbx-dnsproxy is an allowlisting DNS forwarder. It answers only for names on its \
allowlist (exact names, '*.example.com' for the subdomains of a name, not the name itself), \
only for the record types it allows (A, AAAA, CNAME, HTTPS and SVCB by default), and forwards \
nothing else upstream: a name that is not allowlisted is REFUSED (or NXDOMAIN with --nxdomain) \
without any packet leaving, so no data leaks to an attacker's authoritative server. It watches \
allowlisted names too for DNS tunnelling (long labels or names, high-entropy subdomains, many \
distinct subdomains per client), drops answers that point public names at loopback, private, \
link-local or this host's own addresses (DNS rebinding), follows CNAME chains only through \
allowlisted names, caches answers for their TTL, and writes every refused or suspicious query \
as an audit alert. It serves UDP and TCP on every --listen address; SIGHUP reloads the \
allowlist without dropping queries, SIGTERM drains the queries in flight and exits. sbx-net \
uses the same code as a library for the sandbox's DNS.",
    exit_status: "0 after SIGTERM or SIGINT once the queries in flight are answered. \
125 when the tool itself fails: a bad option or allowlist entry, an unreadable allowlist \
file, a listen address that cannot be bound, an nftables set that does not exist; one \
line on stderr names the problem and nothing is served.",
    inherited_state: "sbx-dnsproxy runs no command. It needs no privilege unless it binds a \
port below 1024 (CAP_NET_BIND_SERVICE) or publishes to nftables sets (CAP_NET_ADMIN in the \
network namespace of the sets). It keeps no state on disk.",
    environment: "",
    extra: &[
        (
            "ALLOWLIST",
            "Entries come from --allow (repeated) and --allow-file (one entry per line, '#' \
starts a comment). 'example.com' allows exactly that name; '*.example.com' allows every name \
below it (a.example.com, a.b.example.com) but not example.com itself; an IP literal is kept \
for sbx-net and never matched against names. A wildcard over a top-level domain or a public \
suffix ('*.com', '*.co.uk', '*.github.io'), a bare '*', a '*' anywhere but the whole first \
label and malformed names are errors. Lookup costs one hash probe per label of the query name, \
whatever the size of the list.",
        ),
        (
            "TUNNELLING",
            "A query for an allowlisted name is still refused (reason tunnel_*) when a label is \
longer than --max-label-len, the name longer than --max-name-len, the part of the name below \
its wildcard entry at least --entropy-min-len characters long with a Shannon entropy above \
--max-entropy bits per character, or when the client asked more than --max-subdomains distinct \
names under one wildcard entry within --subdomain-window (names it already asked in the window \
still resolve), or when the client made more than --max-queries queries for allowed names in \
the window (cache hits and repeats count: the choice of name is a channel too). A client is its \
source address masked to --client-prefix4 / --client-prefix6 bits (a /24, a /56), so rotating \
source addresses changes nothing. Names are read from their wire labels: a label holding a byte \
that is not a letter, digit, '-' or '_' (a dot inside a label: x\\.allowed.test) is refused \
(bad_name). 0 disables a check.",
        ),
        (
            "AUDIT",
            "Every refused query is an alert event 'dns_refused' with name, qtype, client, reason \
(not_allowlisted, bad_name, qtype, class, tunnel_label_length, tunnel_name_length, tunnel_entropy, \
tunnel_subdomain_rate, tunnel_query_budget, tunnel_cname_target, cname_not_allowlisted, rebinding, \
malformed, opcode, question_count) and \
detail. Refused answers (and their alerts) are rate-limited per client (--refused-rate, \
--refused-burst); what is dropped beyond is summed up in an alert 'dns_rate_limited' at most \
once a second per client. An upstream failure is a warn event 'dns_upstream_failed'; the client \
gets SERVFAIL within --query-timeout.",
        ),
        (
            "NFTABLES",
            "--nftset FAMILY:TABLE:SET (repeated) adds every address answered for an allowlisted \
name to the set (ipv4_addr sets get A answers, ipv6_addr sets AAAA), before the client gets \
the answer; when the set has the timeout flag, the element expires with the answer's TTL plus \
--answer-grace. The sets must exist at start. This makes sbx-dnsproxy a DNS-driven egress \
filter for hosts and containers, like dnsmasq's --nftset.",
        ),
        (
            "SIGNALS",
            "SIGHUP re-reads --allow and --allow-file (a bad entry keeps the old list and is \
logged); queries in flight finish with the list they started with. SIGUSR1 prints the \
counters. SIGTERM and SIGINT stop accepting, wait for the queries in flight (at most \
--query-timeout) and exit 0.",
        ),
        (
            "EXAMPLES",
            "sbx-dnsproxy --listen 127.0.0.1:5353 --upstream 192.0.2.53 --allow example.com \
--allow '*.github.com' --stats\n\n\
sbx-dnsproxy --listen 127.0.0.53:53 --upstream 9.9.9.9 --allow-file /etc/sbx/allow.txt \
--nftset inet:egress:allowed4 --nftset inet:egress:allowed6",
        ),
    ],
};

#[derive(Parser, Debug)]
#[command(
    name = "sbx-dnsproxy",
    version,
    about = "Allowlisting DNS forwarder: refuses names not on the list, stops DNS tunnelling and rebinding"
)]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonArgs,

    /// Serve UDP and TCP on ADDR:PORT (repeat for several; port 0 picks a
    /// free one, printed on stdout).
    #[arg(long, value_name = "ADDR:PORT", required = true)]
    pub listen: Vec<SocketAddr>,

    /// Upstream server, asked in order (port 53 unless given).
    #[arg(long, value_name = "ADDR[:PORT]", required = true, value_parser = parse_upstream)]
    pub upstream: Vec<SocketAddr>,

    /// Allow NAME ('example.com'), its subdomains ('*.example.com') or an IP literal.
    #[arg(long, value_name = "NAME")]
    pub allow: Vec<String>,

    /// Read allowlist entries from FILE (one per line, '#' comments); re-read on SIGHUP.
    #[arg(long, value_name = "FILE")]
    pub allow_file: Vec<PathBuf>,

    /// Record types answered, comma-separated; others are refused.
    #[arg(long, value_name = "TYPES", default_value = "A,AAAA,CNAME,HTTPS,SVCB")]
    pub qtypes: String,

    /// Answer NXDOMAIN instead of REFUSED for names not on the allowlist.
    #[arg(long)]
    pub nxdomain: bool,

    /// Longest label allowed (0: no limit).
    #[arg(long, value_name = "N", default_value_t = TunnelLimits::default().max_label_len)]
    pub max_label_len: usize,

    /// Longest name allowed (0: no limit).
    #[arg(long, value_name = "N", default_value_t = TunnelLimits::default().max_name_len)]
    pub max_name_len: usize,

    /// Highest entropy (bits/char) of the part of a name below its wildcard entry (0: off).
    #[arg(long, value_name = "BITS", default_value_t = TunnelLimits::default().max_entropy)]
    pub max_entropy: f64,

    /// Shortest subdomain part the entropy check applies to.
    #[arg(long, value_name = "N", default_value_t = TunnelLimits::default().entropy_min_len)]
    pub entropy_min_len: usize,

    /// Distinct names a client may ask under one wildcard entry per window (0: no limit).
    #[arg(long, value_name = "N", default_value_t = TunnelLimits::default().max_distinct_per_window)]
    pub max_subdomains: usize,

    /// Queries for allowed names a client may make per window, cache hits and repeats
    /// included (0: no limit).
    #[arg(long, value_name = "N", default_value_t = TunnelLimits::default().max_queries_per_window)]
    pub max_queries: usize,

    /// Shortest part below a wildcard entry (dots removed) that is scored for
    /// encoded data (hex, base32, base64url: letter/digit switches, vowels,
    /// consonant runs); 0: off.
    #[arg(long, value_name = "N", default_value_t = TunnelLimits::default().encoded_min_len)]
    pub encoded_min_len: usize,

    /// Bytes of new names below wildcard entries (each distinct name once) a client may
    /// send per window, all entries together (0: no limit).
    #[arg(long, value_name = "BYTES", default_value_t = TunnelLimits::default().max_novel_bytes_per_window)]
    pub max_novel_bytes: usize,

    /// The window of --max-subdomains, --max-queries and --max-novel-bytes.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_dur)]
    pub subdomain_window: Duration,

    /// A client, for the rate limits and budgets, is its IPv4 source address masked to N bits.
    #[arg(long, value_name = "BITS", default_value_t = ProxyConfig::default().client_prefix_v4,
          value_parser = clap::value_parser!(u8).range(0..=32))]
    pub client_prefix4: u8,

    /// The same for IPv6 sources.
    #[arg(long, value_name = "BITS", default_value_t = ProxyConfig::default().client_prefix_v6,
          value_parser = clap::value_parser!(u8).range(0..=128))]
    pub client_prefix6: u8,

    /// Refused answers per client per second (0: no limit); beyond, refused queries are dropped.
    #[arg(long, value_name = "N", default_value_t = ProxyConfig::default().refused_rate)]
    pub refused_rate: u32,

    /// Burst of refused answers per client.
    #[arg(long, value_name = "N", default_value_t = ProxyConfig::default().refused_burst)]
    pub refused_burst: u32,

    /// Let DOMAIN and its subdomains resolve to internal addresses (repeat).
    #[arg(long, value_name = "DOMAIN")]
    pub rebind_allow: Vec<String>,

    /// Turn off rebinding protection altogether.
    #[arg(long)]
    pub no_rebind_protection: bool,

    /// Time one upstream gets per attempt.
    #[arg(long, value_name = "DURATION", default_value = "1500ms", value_parser = parse_dur)]
    pub upstream_timeout: Duration,

    /// Upper bound for a query; after it the client gets SERVFAIL.
    #[arg(long, value_name = "DURATION", default_value = "4s", value_parser = parse_dur)]
    pub query_timeout: Duration,

    /// Answers cached (0: no cache).
    #[arg(long, value_name = "N", default_value_t = ProxyConfig::default().cache_size)]
    pub cache_size: usize,

    /// Longest time an answer is cached.
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = parse_dur)]
    pub max_ttl: Duration,

    /// Longest time a negative answer is cached.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_dur)]
    pub max_negative_ttl: Duration,

    /// How long an answered address stays valid after its TTL (answer log, nft timeouts).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_dur)]
    pub answer_grace: Duration,

    /// Largest UDP reply to an EDNS client.
    #[arg(long, value_name = "BYTES", default_value_t = 1232)]
    pub udp_payload: u16,

    /// Publish answered addresses to this nftables set (repeat; FAMILY:TABLE:SET).
    #[arg(long, value_name = "FAMILY:TABLE:SET")]
    pub nftset: Vec<String>,

    /// Print counters (one JSON line on stdout) at exit and on SIGUSR1.
    #[arg(long)]
    pub stats: bool,

    /// Also print the counters every DURATION.
    #[arg(long, value_name = "DURATION", value_parser = parse_dur)]
    pub stats_interval: Option<Duration>,
}

fn parse_dur(s: &str) -> Result<Duration, String> {
    sbx_core::units::parse_duration(s).map_err(|e| e.to_string())
}

/// `ADDR`, `ADDR:PORT`, `[V6]:PORT`, `V6` (port 53 unless given).
pub fn parse_upstream(s: &str) -> Result<SocketAddr, String> {
    let sa = if let Ok(sa) = s.parse::<SocketAddr>() {
        sa
    } else if let Ok(ip) = s
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
    {
        SocketAddr::new(ip, 53)
    } else {
        return Err(format!(
            "'{s}' is not ADDR[:PORT] (an IP address, not a name)"
        ));
    };
    if sa.port() == 0 {
        return Err(format!("'{s}': port 0"));
    }
    Ok(sa)
}

impl Cli {
    /// The proxy configuration the flags describe.
    pub fn proxy_config(&self) -> Result<ProxyConfig, Failure> {
        let mut qtypes = Vec::new();
        for t in self
            .qtypes
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
        {
            qtypes
                .push(config::parse_qtype(t).map_err(|e| Failure::new(format!("--qtypes: {e}")))?);
        }
        if qtypes.is_empty() {
            return Err(Failure::new("--qtypes: empty"));
        }
        if !(self.max_entropy.is_finite() && self.max_entropy >= 0.0) {
            return Err(Failure::new("--max-entropy: must be a non-negative number"));
        }
        if self.subdomain_window.is_zero() {
            return Err(Failure::new("--subdomain-window: must be positive"));
        }
        if self.upstream_timeout.is_zero() || self.query_timeout.is_zero() {
            return Err(Failure::new(
                "--upstream-timeout/--query-timeout: must be positive",
            ));
        }
        if self.udp_payload < 512 {
            return Err(Failure::new("--udp-payload: at least 512"));
        }
        Ok(ProxyConfig {
            allow: self.allow.clone(),
            upstreams: self.upstream.clone(),
            qtypes,
            nxdomain_for_refused: self.nxdomain,
            tunnel: TunnelLimits {
                max_label_len: self.max_label_len,
                max_name_len: self.max_name_len,
                max_entropy: self.max_entropy,
                entropy_min_len: self.entropy_min_len,
                max_distinct_per_window: self.max_subdomains,
                max_queries_per_window: self.max_queries,
                encoded_min_len: self.encoded_min_len,
                max_novel_bytes_per_window: self.max_novel_bytes,
                window: self.subdomain_window,
            },
            client_prefix_v4: self.client_prefix4,
            client_prefix_v6: self.client_prefix6,
            refused_rate: self.refused_rate,
            refused_burst: self.refused_burst,
            rebind_allow: self.rebind_allow.clone(),
            no_rebind_protection: self.no_rebind_protection,
            upstream_timeout: self.upstream_timeout,
            query_timeout: self.query_timeout,
            cache_size: self.cache_size,
            max_ttl: self.max_ttl,
            max_negative_ttl: self.max_negative_ttl,
            answer_grace: self.answer_grace,
            udp_payload: self.udp_payload,
            fast_path: true,
        })
    }

    /// The allowlist of --allow and --allow-file.
    pub fn allowlist(&self) -> Result<Allowlist, AllowError> {
        let mut a = Allowlist::parse(&self.allow)?;
        for f in &self.allow_file {
            a.add_file(f)?;
        }
        Ok(a)
    }
}

pub fn main() -> ! {
    sbx_core::cli::run_main(TOOL, || {
        let cli: Cli = sbx_core::cli::parse(TOOL)?;
        sbx_core::cli::init(TOOL, &cli.common)?;
        run(cli)
    })
}

fn run(cli: Cli) -> Result<i32, Failure> {
    let cfg = cli.proxy_config()?;
    let allow = cli.allowlist()?;
    let nft = if cli.nftset.is_empty() {
        None
    } else {
        Some(nftset::NftSets::open(&cli.nftset)?)
    };
    let entries = allow.len();
    let proxy = DnsProxy::with_allowlist(allow, cfg.clone(), nft)?;
    let bound = server::bind(&cli.listen)?;
    let addrs = bound.addrs();
    if entries == 0 {
        tracing::warn!("the allowlist is empty: every query will be refused");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("sbx-dnsproxy")
        .build()
        .map_err(|e| Failure::new(format!("tokio runtime: {e}")))?;
    rt.block_on(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let sig = |k| signal(k).map_err(|e| Failure::new(format!("signal handler: {e}")));
        let mut hup = sig(SignalKind::hangup())?;
        let mut term = sig(SignalKind::terminate())?;
        let mut int = sig(SignalKind::interrupt())?;
        let mut usr1 = sig(SignalKind::user_defined1())?;
        // run_main blocked these in this (the main) thread; the runtime's
        // workers inherited the mask, so only this thread takes them now.
        sbx_core::signals::unblock_all().map_err(|e| Failure::new(format!("sigprocmask: {e}")))?;

        // The addresses, for callers that asked for port 0.
        for a in &addrs {
            println!("listening {a}");
        }
        use std::io::Write;
        let _ = std::io::stdout().flush();
        sbx_core::audit::emit(
            "started",
            Severity::Info,
            json!({"listen": addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
                   "upstreams": cfg.upstreams.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
                   "entries": entries}),
        );

        let stop = tokio_util::sync::CancellationToken::new();
        let drain = cfg.query_timeout + Duration::from_secs(1);
        let server = tokio::spawn(server::serve(proxy.clone(), bound, stop.clone(), drain));
        let print_stats = |p: &Arc<DnsProxy>| {
            println!("{}", json!({"stats": p.stats().to_json()}));
            let _ = std::io::stdout().flush();
        };
        let mut tick = cli.stats_interval.map(|d| tokio::time::interval_at(tokio::time::Instant::now() + d, d));
        loop {
            tokio::select! {
                _ = hup.recv() => {
                    match proxy.reload(&cli.allow, &cli.allow_file) {
                        Ok(n) => {
                            tracing::info!("allowlist reloaded: {n} entries");
                            sbx_core::audit::emit("allowlist_reloaded", Severity::Info, json!({"entries": n}));
                        }
                        Err(e) => {
                            tracing::error!("reload failed, keeping the old allowlist: {e}");
                            sbx_core::audit::emit("allowlist_reload_failed", Severity::Warn, json!({"error": e.to_string()}));
                        }
                    }
                }
                _ = usr1.recv() => print_stats(&proxy),
                _ = async { match tick.as_mut() { Some(t) => { t.tick().await; } None => std::future::pending().await } } => print_stats(&proxy),
                _ = term.recv() => break,
                _ = int.recv() => break,
            }
        }
        stop.cancel();
        let _ = server.await;
        if cli.stats {
            print_stats(&proxy);
        }
        sbx_core::audit::emit("stopped", Severity::Info, json!({"stats": proxy.stats().to_json()}));
        Ok(0)
    })
}
