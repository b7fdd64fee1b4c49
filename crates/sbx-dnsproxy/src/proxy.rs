//! The request path: one DNS message in, the reply (or nothing) out.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use hickory_proto::op::{Edns, Message, MessageType, Metadata, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::SVCB;
use hickory_proto::rr::rdata::svcb::SvcParamValue;
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use sbx_core::Severity;
use serde_json::json;

use crate::allow::{AllowError, Allowlist, DomainSet, Match};
use crate::answers::AnswerLog;
use crate::cache::{Cache, Outcome};
use crate::config::ProxyConfig;
use crate::guard::{self, QueryBudget, RefusalLimiter, SubdomainTracker, Verdict};
use crate::nftset::{NftError, NftSets};
use crate::rebind;
use crate::stats::Stats;
use crate::upstream::{self, UpstreamError};
use crate::wire;

#[derive(Debug, thiserror::Error)]
pub enum DnsProxyError {
    #[error(transparent)]
    Allow(#[from] AllowError),
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    NftSet(#[from] NftError),
}

/// CNAME hops followed at most.
const MAX_CHAIN: usize = 8;

/// SVCB/HTTPS records kept in one answer (more would be a channel into
/// the sandbox; services publish one to three).
const MAX_SVCB_RECORDS: usize = 8;
/// ALPN ids kept in an SVCB/HTTPS record, and their longest length.
const MAX_ALPN: usize = 8;
const MAX_ALPN_LEN: usize = 32;
/// Address hints kept per family in an SVCB/HTTPS record.
const MAX_HINTS: usize = 8;

/// The allowlisting DNS proxy (thread-safe; share it in an `Arc`).
pub struct DnsProxy {
    allow: ArcSwap<Allowlist>,
    cfg: ProxyConfig,
    rebind_allow: DomainSet,
    own_addrs: ArcSwap<HashSet<IpAddr>>,
    answers: Arc<AnswerLog>,
    cache: Cache,
    tracker: SubdomainTracker,
    budget: QueryBudget,
    novel: guard::NovelBytes,
    limiter: RefusalLimiter,
    /// Rate limit of the `dns_upstream_failed` events.
    fail_limiter: RefusalLimiter,
    fail_suppressed: std::sync::atomic::AtomicU64,
    stats: Stats,
    nft: Option<NftSets>,
    inflight: std::sync::Mutex<HashMap<InflightKey, Arc<Inflight>>>,
}

/// (name, type) of an exchange in flight.
type InflightKey = (Box<str>, u16);

/// The shared result of one upstream exchange.
type Inflight = tokio::sync::OnceCell<Result<Arc<Outcome>, String>>;

/// Why a query is refused (before any upstream traffic).
struct Refusal {
    reason: &'static str,
    detail: String,
    rcode: ResponseCode,
}

impl DnsProxy {
    /// Builds a proxy: every allowlist entry, rebinding exception and
    /// setting is validated (a bad one is an error naming it).
    pub fn new(cfg: ProxyConfig) -> Result<Arc<DnsProxy>, DnsProxyError> {
        Self::with_allowlist(Allowlist::parse(&cfg.allow)?, cfg, None)
    }

    /// [`DnsProxy::new`] with an allowlist already compiled (the daemon
    /// adds `--allow-file`) and, optionally, nftables sets to publish
    /// answers to.
    pub fn with_allowlist(
        allow: Allowlist,
        cfg: ProxyConfig,
        nft: Option<NftSets>,
    ) -> Result<Arc<DnsProxy>, DnsProxyError> {
        let rebind_allow = DomainSet::parse(&cfg.rebind_allow, "rebinding exception")?;
        if cfg
            .qtypes
            .iter()
            .any(|t| matches!(t, RecordType::ANY | RecordType::AXFR | RecordType::IXFR))
        {
            return Err(DnsProxyError::Config(
                "qtypes: ANY, AXFR and IXFR cannot be allowed".into(),
            ));
        }
        if cfg.upstream_timeout.is_zero() || cfg.query_timeout.is_zero() {
            return Err(DnsProxyError::Config("timeouts must be positive".into()));
        }
        if cfg.udp_payload < 512 {
            return Err(DnsProxyError::Config(
                "udp payload must be at least 512".into(),
            ));
        }
        for u in &cfg.upstreams {
            if u.port() == 0 {
                return Err(DnsProxyError::Config(format!("upstream {u}: port 0")));
            }
        }
        Ok(Arc::new(DnsProxy {
            allow: ArcSwap::from_pointee(allow),
            rebind_allow,
            own_addrs: ArcSwap::from_pointee(rebind::host_addresses()),
            answers: Arc::new(AnswerLog::new(cfg.answer_grace)),
            cache: Cache::new(cfg.cache_size),
            tracker: SubdomainTracker::default(),
            budget: QueryBudget::default(),
            novel: guard::NovelBytes::default(),
            limiter: RefusalLimiter::new(cfg.refused_rate, cfg.refused_burst),
            fail_limiter: RefusalLimiter::new(5, 20),
            fail_suppressed: Default::default(),
            stats: Stats::default(),
            nft,
            inflight: std::sync::Mutex::new(HashMap::new()),
            cfg,
        }))
    }

    /// The answers given so far (for sbx-net's gateway).
    pub fn answers(&self) -> Arc<AnswerLog> {
        self.answers.clone()
    }

    /// The allowlist in force.
    pub fn allowlist(&self) -> Arc<Allowlist> {
        self.allow.load_full()
    }

    /// Whether `name` is allowlisted (any case, with or without the dot).
    pub fn is_allowed(&self, name: &str) -> bool {
        let n = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
        self.allow.load().contains_name(&n)
    }

    /// Replaces the allowlist atomically (queries in flight finish with
    /// the old one) and empties the cache.
    pub fn set_allowlist(&self, allow: Allowlist) {
        self.allow.store(Arc::new(allow));
        self.cache.clear();
        self.own_addrs.store(Arc::new(rebind::host_addresses()));
    }

    /// Parses entries and files into a new allowlist and puts it in force;
    /// on error nothing changes. Returns the number of name entries.
    pub fn reload(&self, entries: &[String], files: &[PathBuf]) -> Result<usize, DnsProxyError> {
        let mut a = Allowlist::parse(entries)?;
        for f in files {
            a.add_file(f)?;
        }
        let n = a.len();
        self.set_allowlist(a);
        Ok(n)
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    pub fn config(&self) -> &ProxyConfig {
        &self.cfg
    }

    /// One DNS message in (wire format, without the TCP length prefix),
    /// the reply out, whatever its size (for TCP, or a caller that
    /// truncates itself); `None` = drop.
    pub async fn handle(&self, query: &[u8], client: SocketAddr) -> Option<Vec<u8>> {
        self.handle_limited(query, client, None).await
    }

    /// [`DnsProxy::handle`] for a UDP reply: one larger than the client
    /// can take (512 bytes, or its EDNS size up to `udp_payload`) is sent
    /// truncated (TC set) so the client retries over TCP.
    pub async fn handle_udp(&self, query: &[u8], client: SocketAddr) -> Option<Vec<u8>> {
        self.handle_limited(query, client, Some(())).await
    }

    async fn handle_limited(
        &self,
        query: &[u8],
        client: SocketAddr,
        udp: Option<()>,
    ) -> Option<Vec<u8>> {
        Stats::inc(&self.stats.queries);
        if query.len() < 12 || query[2] & 0x80 != 0 {
            // Not a query (too short for a header, or a response): drop.
            Stats::inc(&self.stats.malformed);
            return None;
        }
        if self.cfg.fast_path
            && let Some(fq) = wire::parse_query(query)
            && let Some(r) = self.handle_fast(query, &fq, client, udp.is_some()).await
        {
            return r;
        }
        self.handle_slow(query, client, udp.is_some()).await
    }

    /// The common query shape, answered without building messages.
    /// `None`: let the slow path answer (no template for this outcome).
    async fn handle_fast(
        &self,
        query: &[u8],
        fq: &wire::FastQuery,
        client: SocketAddr,
        udp: bool,
    ) -> Option<Option<Vec<u8>>> {
        let qtype = RecordType::from(fq.qtype);
        if let Some(r) = self.check(&fq.name, qtype, DNSClass::from(fq.qclass), client.ip()) {
            return Some(self.fast_refuse(query, fq, client, udp, r));
        }
        let (outcome, age) = match self.lookup_or_fetch(&fq.name, qtype, client, false).await {
            Ok(x) => x,
            Err(()) => {
                let payload = self.cfg.udp_payload;
                return Some(Some(wire::reply(
                    query,
                    fq,
                    None,
                    2,
                    0,
                    payload,
                    self.udp_limit(fq, udp),
                )));
            }
        };
        self.fast_outcome(query, fq, client, udp, &outcome, age)
    }

    /// What the receiving thread can answer at once, without a task: a
    /// fast-path query whose (name, type) is in the cache with a template
    /// (or a cached refusal), or one refused before any budget counts it
    /// (class, type, not on the list). `None` (nothing done, nothing
    /// counted): take
    /// [`DnsProxy::handle_udp`]. The same answers as that path, in the
    /// same order of checks (the checks, then the cache).
    pub fn answer_udp_now(&self, query: &[u8], client: SocketAddr) -> Option<Option<Vec<u8>>> {
        if !self.cfg.fast_path || query.len() < 12 || query[2] & 0x80 != 0 {
            return None;
        }
        let fq = wire::parse_query(query)?;
        let qtype = RecordType::from(fq.qtype);
        let class = DNSClass::from(fq.qclass);
        let cached = self.cache.get(&fq.name, fq.qtype);
        match &cached {
            Some((o, _)) if matches!(&**o, Outcome::Answer { template: None, .. }) => return None,
            Some(_) => {}
            // Not cached: answered here only when refused before any budget
            // counts it (class, type, not on the list).
            None => {
                if class == DNSClass::IN
                    && self.cfg.qtypes.contains(&qtype)
                    && self.allow.load().matches(&fq.name).is_some()
                {
                    return None;
                }
            }
        }
        // From here on the query is answered here.
        Stats::inc(&self.stats.queries);
        if let Some(r) = self.check(&fq.name, qtype, class, client.ip()) {
            return Some(self.fast_refuse(query, &fq, client, true, r));
        }
        let (outcome, age) = cached?;
        Stats::inc(&self.stats.cache_hits);
        self.fast_outcome(query, &fq, client, true, &outcome, age)
    }

    /// The largest UDP reply the client takes (None over TCP).
    fn udp_limit(&self, fq: &wire::FastQuery, udp: bool) -> Option<usize> {
        let payload = self.cfg.udp_payload;
        udp.then(|| match fq.edns {
            Some(p) => usize::from(p.clamp(512, payload)),
            None => 512,
        })
    }

    fn fast_refuse(
        &self,
        query: &[u8],
        fq: &wire::FastQuery,
        client: SocketAddr,
        udp: bool,
        r: Refusal,
    ) -> Option<Vec<u8>> {
        let payload = self.cfg.udp_payload;
        let limit = self.udp_limit(fq, udp);
        self.refuse_with(client, &fq.name, RecordType::from(fq.qtype), &r, || {
            Some(wire::reply(
                query,
                fq,
                None,
                u16::from(r.rcode) as u8,
                0,
                payload,
                limit,
            ))
        })
    }

    fn fast_outcome(
        &self,
        query: &[u8],
        fq: &wire::FastQuery,
        client: SocketAddr,
        udp: bool,
        outcome: &Outcome,
        age: u32,
    ) -> Option<Option<Vec<u8>>> {
        let payload = self.cfg.udp_payload;
        let limit = self.udp_limit(fq, udp);
        match outcome {
            Outcome::Answer {
                template: Some(t), ..
            } => {
                Stats::inc(&self.stats.answered);
                if limit.is_some_and(|l| fq.question_end + t.sections.len() + 11 > l) {
                    Stats::inc(&self.stats.truncated);
                }
                Some(Some(wire::reply(
                    query,
                    fq,
                    Some(t),
                    0,
                    age,
                    payload,
                    limit,
                )))
            }
            Outcome::Answer { template: None, .. } => None,
            Outcome::Refused { reason, detail, .. } => Some(self.fast_refuse(
                query,
                fq,
                client,
                udp,
                Refusal {
                    reason,
                    detail: detail.clone(),
                    rcode: ResponseCode::Refused,
                },
            )),
        }
    }

    /// The cached outcome for (name, type) and its age, or a fresh one
    /// from upstream (`Err`: upstream failed, already reported).
    async fn lookup_or_fetch(
        &self,
        name: &str,
        qtype: RecordType,
        client: SocketAddr,
        dnssec: bool,
    ) -> Result<(Arc<Outcome>, u32), ()> {
        // Answers with signatures (DO) are kept apart from those without;
        // "+do " cannot start a hostname.
        let do_key;
        let key_name = if dnssec {
            do_key = format!("+do {name}");
            do_key.as_str()
        } else {
            name
        };
        if let Some(hit) = self.cache.get(key_name, u16::from(qtype)) {
            Stats::inc(&self.stats.cache_hits);
            return Ok(hit);
        }
        Stats::inc(&self.stats.cache_misses);
        // Identical questions in flight share one upstream exchange.
        let key = (Box::<str>::from(key_name), u16::from(qtype));
        let (cell, _leader) = {
            let mut m = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
            match m.get(&key) {
                Some(c) => (c.clone(), false),
                None => {
                    let c = Arc::new(tokio::sync::OnceCell::new());
                    m.insert(key.clone(), c.clone());
                    (c, true)
                }
            }
        };
        // Whoever finishes (or gives up: a dropped query) takes the entry
        // out, so a finished exchange is never served again from here.
        struct Done<'a>(&'a DnsProxy, &'a InflightKey, &'a Arc<Inflight>);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                let mut m = self.0.inflight.lock().unwrap_or_else(|p| p.into_inner());
                if m.get(self.1).is_some_and(|c| Arc::ptr_eq(c, self.2)) {
                    m.remove(self.1);
                }
            }
        }
        let _done = Done(self, &key, &cell);
        let res = cell
            .get_or_init(|| async {
                let deadline = Instant::now() + self.cfg.query_timeout;
                match self.fetch(name, qtype, client, dnssec, deadline).await {
                    Ok(o) => {
                        let o = Arc::new(o);
                        self.cache.put(key_name, u16::from(qtype), o.clone());
                        Ok(o)
                    }
                    Err(e) => Err(e.to_string()),
                }
            })
            .await
            .clone();
        match res {
            Ok(o) => Ok((o, 0)),
            Err(e) => {
                Stats::inc(&self.stats.servfail);
                // A silent upstream under load fails thousands of queries
                // a second: the events are rate-limited per client too,
                // the excess summed up in the next one.
                match self.fail_limiter.check(self.client_key(client.ip())) {
                    Verdict::Answer | Verdict::DropAndReport(_) => {
                        let more = self
                            .fail_suppressed
                            .swap(0, std::sync::atomic::Ordering::Relaxed);
                        tracing::warn!(%name, ?qtype, %client, "SERVFAIL: {e}");
                        sbx_core::audit::emit(
                            "dns_upstream_failed",
                            Severity::Warn,
                            json!({"name": name, "qtype": qtype.to_string(),
                                   "client": client.to_string(), "error": e.to_string(),
                                   "suppressed": more}),
                        );
                    }
                    Verdict::Drop => {
                        self.fail_suppressed
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
                Err(())
            }
        }
    }

    /// Everything else, through hickory-proto's message types.
    async fn handle_slow(&self, query: &[u8], client: SocketAddr, udp: bool) -> Option<Vec<u8>> {
        let req = match Message::from_vec(query) {
            Ok(m) => m,
            Err(_) => {
                Stats::inc(&self.stats.malformed);
                return self.refuse_raw(query, client, "malformed", ResponseCode::FormErr);
            }
        };
        if req.metadata.message_type != MessageType::Query {
            Stats::inc(&self.stats.malformed);
            return None;
        }
        if req.metadata.op_code != OpCode::Query {
            Stats::inc(&self.stats.refused_other);
            return self.refuse_raw(query, client, "opcode", ResponseCode::NotImp);
        }
        if req.queries.len() != 1 {
            Stats::inc(&self.stats.malformed);
            return self.refuse_raw(query, client, "question_count", ResponseCode::FormErr);
        }
        let limit = udp.then(|| match &req.edns {
            Some(e) => usize::from(e.max_payload().clamp(512, self.cfg.udp_payload)),
            None => 512,
        });
        // EDNS versions above 0 are not known here: BADVERS (RFC 6891
        // 6.1.3), with our OPT (version 0) in the reply.
        if req.edns.as_ref().is_some_and(|e| e.version() > 0) {
            return self.reply(&req, ResponseCode::BADVERS, &[], &[], 0, 0, limit);
        }
        let dnssec = req.edns.as_ref().is_some_and(|e| e.flags().dnssec_ok);
        let q = &req.queries[0];
        let qtype = q.query_type();
        // The name from its wire labels: one whose labels hold a byte that
        // is not a hostname character (`x\.allowed.test` is ONE label with
        // a dot in it) is refused before anything else looks at it.
        let Some(name) = crate::allow::name_from_wire(q.name()) else {
            Stats::inc(&self.stats.refused_not_allowlisted);
            let shown = crate::allow::name_shown(q.name());
            let shown = shown.as_str();
            let r = Refusal {
                reason: "bad_name",
                detail: "a label holds a byte that is not a hostname character".into(),
                rcode: ResponseCode::Refused,
            };
            return self.refuse(&req, client, shown, qtype, r, limit);
        };

        if let Some(r) = self.check(&name, qtype, q.query_class(), client.ip()) {
            return self.refuse(&req, client, &name, qtype, r, limit);
        }

        let (outcome, age) = match self.lookup_or_fetch(&name, qtype, client, dnssec).await {
            Ok(x) => x,
            Err(()) => return self.reply(&req, ResponseCode::ServFail, &[], &[], 0, 0, limit),
        };
        match &*outcome {
            Outcome::Answer {
                rcode,
                answers,
                authority,
                ttl,
                ..
            } => {
                Stats::inc(&self.stats.answered);
                self.reply(&req, *rcode, answers, authority, *ttl, age, limit)
            }
            Outcome::Refused { reason, detail, .. } => {
                let r = Refusal {
                    reason,
                    detail: detail.clone(),
                    rcode: ResponseCode::Refused,
                };
                self.refuse(&req, client, &name, qtype, r, limit)
            }
        }
    }

    /// The checks made before anything is sent upstream.
    fn check(
        &self,
        name: &str,
        qtype: RecordType,
        class: DNSClass,
        client: IpAddr,
    ) -> Option<Refusal> {
        let refused = |reason, detail: String| {
            Some(Refusal {
                reason,
                detail,
                rcode: ResponseCode::Refused,
            })
        };
        if class != DNSClass::IN {
            Stats::inc(&self.stats.refused_class);
            return refused("class", format!("class {class} is not IN"));
        }
        if !self.cfg.qtypes.contains(&qtype) {
            Stats::inc(&self.stats.refused_qtype);
            return refused("qtype", format!("record type {qtype} is not allowed"));
        }
        let allow = self.allow.load();
        let Some(m) = allow.matches(name) else {
            Stats::inc(&self.stats.refused_not_allowlisted);
            return Some(Refusal {
                reason: "not_allowlisted",
                detail: "name is not on the allowlist".into(),
                rcode: if self.cfg.nxdomain_for_refused {
                    ResponseCode::NXDomain
                } else {
                    ResponseCode::Refused
                },
            });
        };
        let below = match m {
            Match::Exact => "",
            Match::Wildcard(sfx) => &name[..name.len() - sfx.len() - 1],
        };
        let who = self.client_key(client);
        // Every query for an allowed name counts, whatever the cache
        // answers or the other checks decide: repeats and TTL-0 names
        // carry data by their choice.
        let over = self.budget.check(&self.cfg.tunnel, who);
        let sus = guard::static_check(&self.cfg.tunnel, name, below)
            .or_else(|| match m {
                Match::Wildcard(sfx) => match self.tracker.note(&self.cfg.tunnel, who, sfx, name) {
                    Err(s) => Some(s),
                    // A repeat in the window carries no new bytes.
                    Ok(true) => None,
                    Ok(false) => self.novel.check(&self.cfg.tunnel, who, name, below),
                },
                Match::Exact => None,
            })
            .or(over);
        if let Some(s) = sus {
            Stats::inc(&self.stats.refused_tunnel);
            return refused(s.reason(), s.detail());
        }
        None
    }

    fn refuse(
        &self,
        req: &Message,
        client: SocketAddr,
        name: &str,
        qtype: RecordType,
        r: Refusal,
        limit: Option<usize>,
    ) -> Option<Vec<u8>> {
        self.refuse_with(client, name, qtype, &r, || {
            self.reply(req, r.rcode, &[], &[], 0, 0, limit)
        })
    }

    /// The client a query counts against (its address masked to the
    /// configured prefix; inside sbx-net every client is the sandbox).
    pub fn client_key(&self, ip: IpAddr) -> IpAddr {
        guard::client_key(ip, self.cfg.client_prefix_v4, self.cfg.client_prefix_v6)
    }

    /// Whether a TCP connection refused over the per-client cap is to be
    /// alerted (the refusal limiter's budget: a flood is summed up).
    pub fn note_tcp_refused(&self, client: SocketAddr) -> bool {
        matches!(
            self.limiter.check(self.client_key(client.ip())),
            Verdict::Answer | Verdict::DropAndReport(_)
        )
    }

    /// Rate limit, alert, and the reply `build` makes (when not dropped).
    fn refuse_with(
        &self,
        client: SocketAddr,
        name: &str,
        qtype: RecordType,
        r: &Refusal,
        build: impl FnOnce() -> Option<Vec<u8>>,
    ) -> Option<Vec<u8>> {
        match self.limiter.check(self.client_key(client.ip())) {
            Verdict::Answer => {
                alert_refused(name, &qtype.to_string(), client, r.reason, &r.detail);
                build()
            }
            Verdict::Drop => {
                Stats::inc(&self.stats.dropped_rate_limited);
                None
            }
            Verdict::DropAndReport(n) => {
                Stats::inc(&self.stats.dropped_rate_limited);
                alert_rate_limited(client, n, name, r.reason);
                None
            }
        }
    }

    /// A refusal for a message that did not parse far enough for a normal
    /// reply: the header echoed with the rcode, no sections.
    fn refuse_raw(
        &self,
        query: &[u8],
        client: SocketAddr,
        reason: &'static str,
        rcode: ResponseCode,
    ) -> Option<Vec<u8>> {
        match self.limiter.check(self.client_key(client.ip())) {
            Verdict::Answer => {
                alert_refused("", "", client, reason, &format!("{} bytes", query.len()));
                let mut out = query[..12].to_vec();
                out[2] = 0x80 | (query[2] & 0x79); // QR, opcode, RD
                out[3] = u16::from(rcode) as u8 & 0x0f;
                out[4..12].fill(0);
                Some(out)
            }
            Verdict::Drop => {
                Stats::inc(&self.stats.dropped_rate_limited);
                None
            }
            Verdict::DropAndReport(n) => {
                Stats::inc(&self.stats.dropped_rate_limited);
                alert_rate_limited(client, n, "", reason);
                None
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn reply(
        &self,
        req: &Message,
        rcode: ResponseCode,
        answers: &[Record],
        authority: &[Record],
        ttl: u32,
        age: u32,
        limit: Option<usize>,
    ) -> Option<Vec<u8>> {
        let mut m = Message::new(req.metadata.id, MessageType::Response, req.metadata.op_code);
        m.metadata = Metadata::response_from_request(&req.metadata);
        m.metadata.recursion_available = true;
        m.metadata.response_code = rcode;
        m.add_query(req.queries[0].clone());
        let fix = |r: &Record| {
            let mut r = r.clone();
            r.ttl = r.ttl.min(ttl).saturating_sub(age);
            r
        };
        m.add_answers(answers.iter().map(fix));
        m.add_authorities(authority.iter().map(fix));
        if let Some(asked) = &req.edns {
            let mut e = Edns::new();
            e.set_max_payload(self.cfg.udp_payload);
            e.flags_mut().dnssec_ok = asked.flags().dnssec_ok;
            m.set_edns(e);
        }
        let bytes = m.to_vec().ok()?;
        match limit {
            Some(l) if bytes.len() > l => {
                Stats::inc(&self.stats.truncated);
                m.answers.clear();
                m.authorities.clear();
                m.metadata.truncation = true;
                m.to_vec().ok()
            }
            _ => Some(bytes),
        }
    }

    /// Asks upstream for `name`/`qtype` and filters the answer: the CNAME
    /// chain only through allowlisted names, rebinding protection, TTLs.
    async fn fetch(
        &self,
        name: &str,
        qtype: RecordType,
        client: SocketAddr,
        dnssec: bool,
        deadline: Instant,
    ) -> Result<Outcome, UpstreamError> {
        let mut chain: Vec<String> = vec![name.to_string()];
        let mut records: Vec<Record> = Vec::new();
        // With DO: the RRSIGs over the chain's CNAMEs and the final RRset.
        let mut sigs: Vec<Record> = Vec::new();
        let mut current = name.to_string();
        for _ in 0..MAX_CHAIN {
            let qname = Name::from_ascii(format!("{current}."))
                .map_err(|e| UpstreamError::Encode(e.to_string()))?;
            Stats::inc(&self.stats.upstream_queries);
            let resp = match upstream::exchange(
                &self.cfg.upstreams,
                &qname,
                qtype,
                dnssec,
                self.cfg.upstream_timeout,
                deadline,
            )
            .await
            {
                Ok(r) => r,
                Err(e) => {
                    Stats::inc(&self.stats.upstream_failures);
                    return Err(e);
                }
            };
            // Walk the CNAMEs from `current`.
            let mut followed = false;
            if qtype != RecordType::CNAME {
                for _ in 0..MAX_CHAIN {
                    let Some(c) = resp
                        .answers
                        .iter()
                        .find(|r| r.record_type() == RecordType::CNAME && lc(&r.name) == current)
                    else {
                        break;
                    };
                    let RData::CNAME(target) = &c.data else { break };
                    let t = lc(&target.0);
                    if !self.allow.load().contains_name(&t) {
                        Stats::inc(&self.stats.refused_cname);
                        return Ok(Outcome::Refused {
                            reason: "cname_not_allowlisted",
                            detail: format!(
                                "{current} is an alias of {t}, which is not allowlisted"
                            ),
                            ttl: c.ttl.min(self.cfg.max_negative_ttl.as_secs() as u32),
                        });
                    }
                    if chain.contains(&t) {
                        return Ok(self.servfail(
                            name,
                            qtype,
                            client,
                            format!("CNAME loop at {t}"),
                        ));
                    }
                    if chain.len() > MAX_CHAIN {
                        return Ok(self.servfail(
                            name,
                            qtype,
                            client,
                            format!("more than {MAX_CHAIN} CNAME hops"),
                        ));
                    }
                    // An alias target is content the upstream chose: it
                    // passes the same tunnelling checks as a question.
                    if let Some(sus) = self.target_suspicion(&t) {
                        Stats::inc(&self.stats.refused_tunnel);
                        return Ok(Outcome::Refused {
                            reason: "tunnel_cname_target",
                            detail: format!("{current} is an alias of {t}: {}", sus.detail()),
                            ttl: c.ttl.min(self.cfg.max_negative_ttl.as_secs() as u32),
                        });
                    }
                    records.push(c.clone());
                    chain.push(t.clone());
                    current = t;
                    followed = true;
                }
            }
            let finals: Vec<Record> = resp
                .answers
                .iter()
                .filter(|r| r.record_type() == qtype && lc(&r.name) == current)
                .cloned()
                .collect();
            // Asked for the CNAME itself: its target must be allowlisted too.
            for r in &finals {
                if let RData::CNAME(target) = &r.data {
                    let t = lc(&target.0);
                    if !self.allow.load().contains_name(&t) {
                        Stats::inc(&self.stats.refused_cname);
                        return Ok(Outcome::Refused {
                            reason: "cname_not_allowlisted",
                            detail: format!(
                                "{current} is an alias of {t}, which is not allowlisted"
                            ),
                            ttl: r.ttl.min(self.cfg.max_negative_ttl.as_secs() as u32),
                        });
                    }
                }
            }
            if dnssec {
                sigs.extend(
                    resp.answers
                        .iter()
                        .filter(|r| {
                            r.record_type() == RecordType::RRSIG
                                && chain.contains(&lc(&r.name))
                                && rrsig_covers(r)
                                    .is_some_and(|t| t == qtype || t == RecordType::CNAME)
                        })
                        .cloned(),
                );
            }
            let rcode = resp.metadata.response_code;
            if finals.is_empty() && followed && rcode == ResponseCode::NoError {
                // The upstream gave the alias but not the target's data:
                // ask for the (allowlisted) target itself.
                continue;
            }
            return Ok(self
                .finish(name, qtype, client, &chain, records, finals, sigs, &resp)
                .await);
        }
        Ok(self.servfail(
            name,
            qtype,
            client,
            format!("more than {MAX_CHAIN} CNAME hops"),
        ))
    }

    /// The static tunnelling checks applied to a CNAME target.
    fn target_suspicion(&self, t: &str) -> Option<guard::Suspicion> {
        let allow = self.allow.load();
        let below = match allow.matches(t) {
            Some(Match::Wildcard(sfx)) => &t[..t.len() - sfx.len() - 1],
            _ => "",
        };
        guard::static_check(&self.cfg.tunnel, t, below)
    }

    /// SERVFAIL for a chain no resolver could finish (a CNAME loop, too
    /// many hops), as recursive resolvers answer it; cached briefly.
    fn servfail(&self, name: &str, qtype: RecordType, client: SocketAddr, why: String) -> Outcome {
        Stats::inc(&self.stats.refused_cname);
        sbx_core::audit::emit(
            "dns_upstream_failed",
            Severity::Warn,
            json!({"name": name, "qtype": qtype.to_string(),
                   "client": client.to_string(), "error": why}),
        );
        let ttl = 5;
        Outcome::Answer {
            rcode: ResponseCode::ServFail,
            answers: Vec::new(),
            authority: Vec::new(),
            ttl,
            template: build_template(name, qtype, ResponseCode::ServFail, &[], &[], ttl),
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn finish(
        &self,
        name: &str,
        qtype: RecordType,
        client: SocketAddr,
        chain: &[String],
        mut records: Vec<Record>,
        finals: Vec<Record>,
        sigs: Vec<Record>,
        resp: &Message,
    ) -> Outcome {
        let dnssec = resp.edns.as_ref().is_some_and(|e| e.flags().dnssec_ok) || !sigs.is_empty();
        let rcode = resp.metadata.response_code;
        let exempt =
            self.cfg.no_rebind_protection || chain.iter().any(|n| self.rebind_allow.covers(n));
        let own = self.own_addrs.load();
        let had_finals = !finals.is_empty();
        let mut kept = Vec::new();
        let mut dropped: Vec<(IpAddr, &'static str)> = Vec::new();
        for r in finals {
            let bad = if exempt {
                None
            } else {
                record_ips(&r)
                    .into_iter()
                    .find_map(|ip| rebind::internal_kind(ip, &own).map(|k| (ip, k)))
            };
            match bad {
                Some(b) => dropped.push(b),
                None => kept.push(r),
            }
        }
        for _ in &dropped {
            Stats::inc(&self.stats.rebinding_records_dropped);
        }
        // Downstream content that can carry data is capped (see
        // `cap_record`); an SVCB/HTTPS record pointing at a name off the
        // list is dropped.
        let allow = self.allow.load();
        let mut capped = Vec::with_capacity(kept.len());
        for r in kept {
            match cap_record(r, &allow) {
                Ok(r) => capped.push(r),
                Err(why) => sbx_core::audit::emit(
                    "dns_answer_dropped",
                    Severity::Alert,
                    json!({"name": name, "qtype": qtype.to_string(), "client": client.to_string(),
                           "reason": "svcb_target", "detail": why}),
                ),
            }
        }
        // Only SVCB records off the list: an answer without data, not a
        // rebinding refusal.
        let had_finals = had_finals && !(capped.is_empty() && dropped.is_empty());
        let mut kept = capped;
        if matches!(qtype, RecordType::SVCB | RecordType::HTTPS) {
            kept.truncate(MAX_SVCB_RECORDS);
        }
        if !kept.is_empty() {
            // Some answers kept: the dropped ones are reported here (when
            // none is left, the refusal itself is the alert).
            for (ip, kind) in &dropped {
                sbx_core::audit::emit(
                    "dns_answer_dropped",
                    Severity::Alert,
                    json!({"name": name, "qtype": qtype.to_string(), "client": client.to_string(),
                           "reason": "rebinding", "detail": format!("answer {ip} is a {kind} address")}),
                );
            }
        }
        if had_finals && kept.is_empty() {
            Stats::inc(&self.stats.refused_rebinding);
            let (ip, kind) = dropped[0];
            return Outcome::Refused {
                reason: "rebinding",
                detail: format!("every answer is internal ({ip}: {kind})"),
                ttl: 30,
            };
        }
        let max_ttl = self.cfg.max_ttl.as_secs() as u32;
        let authority: Vec<Record> = if kept.is_empty() {
            resp.authorities
                .iter()
                .filter(|r| r.record_type() == RecordType::SOA)
                .take(1)
                .cloned()
                .collect()
        } else {
            Vec::new()
        };
        records.extend(kept);
        let ttl = if records.iter().any(|r| r.record_type() == qtype) {
            records
                .iter()
                .map(|r| r.ttl)
                .min()
                .unwrap_or(0)
                .min(max_ttl)
        } else {
            // NXDOMAIN or no data: the SOA's negative TTL, clamped.
            let neg = authority
                .iter()
                .find_map(|r| match &r.data {
                    RData::SOA(soa) => Some(r.ttl.min(soa.minimum)),
                    _ => None,
                })
                .unwrap_or(0);
            neg.min(self.cfg.max_negative_ttl.as_secs() as u32)
                .min(records.iter().map(|r| r.ttl).min().unwrap_or(u32::MAX))
        };
        // Publish the addresses before the client can use them.
        let mut ips = Vec::new();
        for r in &records {
            if let RData::A(a) = &r.data {
                ips.push(IpAddr::V4(a.0));
            } else if let RData::AAAA(a) = &r.data {
                ips.push(IpAddr::V6(a.0));
            }
        }
        if !ips.is_empty() {
            for ip in &ips {
                for n in chain {
                    self.answers.record(n, *ip, ttl);
                }
            }
            if let Some(nft) = &self.nft {
                let timeout = Duration::from_secs(u64::from(ttl)) + self.cfg.answer_grace;
                if let Err(e) = nft.add(&ips, timeout).await {
                    tracing::warn!("nftables set update failed: {e}");
                    sbx_core::audit::emit(
                        "nftset_failed",
                        Severity::Warn,
                        json!({"name": name, "error": e.to_string()}),
                    );
                }
            }
        }
        // Signatures go with the records they sign (a client validates
        // them; a record dropped above makes its RRset fail validation,
        // as it should). DO answers never take the fast path.
        let template = if dnssec {
            records.extend(sigs);
            None
        } else {
            build_template(name, qtype, rcode, &records, &authority, ttl)
        };
        Outcome::Answer {
            rcode,
            answers: records,
            authority,
            ttl,
            template,
        }
    }
}

/// The wire template of an answer (for the fast path).
fn build_template(
    name: &str,
    qtype: RecordType,
    rcode: ResponseCode,
    answers: &[Record],
    authority: &[Record],
    ttl: u32,
) -> Option<wire::Template> {
    let mut m = Message::new(0, MessageType::Response, OpCode::Query);
    m.metadata.response_code = rcode;
    m.add_query(Query::query(
        Name::from_ascii(format!("{name}.")).ok()?,
        qtype,
    ));
    m.add_answers(answers.iter().cloned());
    m.add_authorities(authority.iter().cloned());
    let bytes = m.to_vec().ok()?;
    wire::Template::from_response(&bytes, ttl)
}

/// Caps what an SVCB/HTTPS record can carry into the sandbox: only the
/// parameters a client needs to connect are kept (alpn, at most 8 ids of
/// at most 32 bytes; no-default-alpn; port; ipv4hint/ipv6hint, at most 8
/// each); `ech` (opaque bytes, and it would hide the SNI from
/// `--sni-check`), `mandatory` and unknown keys are removed. Its target
/// must be "." (the owner) or an allowlisted name, else the record is
/// dropped (`Err`, why). Other records pass unchanged.
fn cap_record(mut r: Record, allow: &Allowlist) -> Result<Record, String> {
    let cap = |s: &mut SVCB| -> Result<(), String> {
        if !s.target_name.is_root() {
            let t = lc(&s.target_name);
            if !allow.contains_name(&t) {
                return Err(format!("target {t} is not allowlisted"));
            }
        }
        s.svc_params.retain_mut(|(_, v)| match v {
            SvcParamValue::Alpn(a) => {
                a.0.retain(|id| id.len() <= MAX_ALPN_LEN);
                a.0.truncate(MAX_ALPN);
                !a.0.is_empty()
            }
            SvcParamValue::Ipv4Hint(h) => {
                h.0.truncate(MAX_HINTS);
                true
            }
            SvcParamValue::Ipv6Hint(h) => {
                h.0.truncate(MAX_HINTS);
                true
            }
            SvcParamValue::NoDefaultAlpn | SvcParamValue::Port(_) => true,
            _ => false,
        });
        Ok(())
    };
    match &mut r.data {
        RData::SVCB(s) => cap(s)?,
        RData::HTTPS(h) => cap(&mut h.0)?,
        _ => {}
    }
    Ok(r)
}

/// The type an RRSIG record covers (its first two rdata bytes).
fn rrsig_covers(r: &Record) -> Option<RecordType> {
    match &r.data {
        RData::Unknown { rdata, .. } => {
            let b = &rdata.anything;
            Some(RecordType::from(u16::from_be_bytes([
                *b.first()?,
                *b.get(1)?,
            ])))
        }
        _ => None,
    }
}

/// The addresses a record hands out: A/AAAA data, SVCB/HTTPS hints.
fn record_ips(r: &Record) -> Vec<IpAddr> {
    let svcb_ips = |s: &SVCB| {
        let mut v = Vec::new();
        for (_, p) in &s.svc_params {
            match p {
                SvcParamValue::Ipv4Hint(h) => v.extend(h.0.iter().map(|a| IpAddr::V4(a.0))),
                SvcParamValue::Ipv6Hint(h) => v.extend(h.0.iter().map(|a| IpAddr::V6(a.0))),
                _ => {}
            }
        }
        v
    };
    match &r.data {
        RData::A(a) => vec![IpAddr::V4(a.0)],
        RData::AAAA(a) => vec![IpAddr::V6(a.0)],
        RData::SVCB(s) => svcb_ips(s),
        RData::HTTPS(h) => svcb_ips(&h.0),
        _ => Vec::new(),
    }
}

/// A name of an upstream answer as the allowlist sees it; one that is not
/// a hostname becomes a string no allowlist entry or chain name equals.
fn lc(n: &Name) -> String {
    crate::allow::name_from_wire(n)
        .unwrap_or_else(|| format!("\\bad:{}", crate::allow::name_shown(n)))
}

fn alert_refused(name: &str, qtype: &str, client: SocketAddr, reason: &str, detail: &str) {
    sbx_core::audit::emit(
        "dns_refused",
        Severity::Alert,
        json!({
            "name": name,
            "qtype": qtype,
            "client": client.to_string(),
            "reason": reason,
            "detail": detail,
        }),
    );
}

fn alert_rate_limited(client: SocketAddr, dropped: u64, last_name: &str, last_reason: &str) {
    sbx_core::audit::emit(
        "dns_rate_limited",
        Severity::Alert,
        json!({
            "client": client.to_string(),
            "dropped": dropped,
            "name": last_name,
            "reason": last_reason,
        }),
    );
}
