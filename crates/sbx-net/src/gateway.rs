//! The egress gateway, in the supervisor (host namespace): accepts the
//! connections redirected inside the sandbox, reads where they were going,
//! decides, connects out itself and relays. DNS (UDP and TCP 53) goes to the
//! allowlisting DNS proxy.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

use sbx_core::Severity;
use sbx_core::audit;

use crate::allow::{Policy, Verdict};
use crate::sniff::{self, Sniff};

/// The DNS side the gateway needs: answer a query, and say which names were
/// answered with an address.
pub trait Dns: Send + Sync + 'static {
    fn handle<'a>(
        &'a self,
        query: &'a [u8],
        client: SocketAddr,
        udp: bool,
    ) -> Pin<Box<dyn Future<Output = Option<Vec<u8>>> + Send + 'a>>;
    fn names_for(&self, ip: IpAddr) -> Vec<String>;
}

/// Counters for the end event.
#[derive(Debug, Default)]
pub struct Stats {
    pub allowed: AtomicU64,
    pub denied: AtomicU64,
    pub failed: AtomicU64,
    pub bytes_out: AtomicU64,
    pub bytes_in: AtomicU64,
    pub dns_queries: AtomicU64,
    pub dns_unanswered: AtomicU64,
    pub alerts_suppressed: AtomicU64,
}

impl Stats {
    pub fn json(&self) -> serde_json::Value {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        json!({
            "connections_allowed": g(&self.allowed),
            "connections_denied": g(&self.denied),
            "connections_failed": g(&self.failed),
            "bytes_out": g(&self.bytes_out),
            "bytes_in": g(&self.bytes_in),
            "dns_queries": g(&self.dns_queries),
            "dns_unanswered": g(&self.dns_unanswered),
            "alerts_suppressed": g(&self.alerts_suppressed),
        })
    }
}

pub struct Gateway {
    pub policy: Policy,
    pub dns: Option<Arc<dyn Dns>>,
    pub sni_check: bool,
    pub connect_timeout: Duration,
    pub sniff_timeout: Duration,
    pub stats: Stats,
    /// Alerts per second cap (a flood of denied connections must not fill
    /// the disk); the rest are counted in `alerts_suppressed`.
    pub alert_budget: AlertBudget,
    /// How connections are relayed (SBX_NET_RELAY=hybrid|threads|async;
    /// the default hybrid; the others for benchmarks).
    pub relay: RelayMode,
    /// Relays currently counted against THREADED_MAX.
    pub threaded: std::sync::atomic::AtomicUsize,
    /// DNS-over-TCP connections open (the sandbox is one client: at most
    /// [`DNS_TCP_MAX`]).
    pub dns_tcp_conns: std::sync::atomic::AtomicUsize,
    /// Host addresses the sandbox may reach (`--allow-host-address`).
    pub host_allow: Vec<IpAddr>,
    /// This host's own addresses, re-read at most every second.
    pub host_addrs: HostAddrs,
    /// Phantom credentials (`--secret`): interception of their hosts and
    /// the placeholder checks everywhere else; None without secrets.
    pub intercept: Option<Arc<crate::http::Intercept>>,
}

/// This host's own addresses (interfaces in the supervisor's network
/// namespace), cached for a second: services bound to them are the host's,
/// and an allowed CIDR that happens to contain one must not reach them.
#[derive(Default)]
pub struct HostAddrs(
    std::sync::Mutex<Option<(std::time::Instant, Arc<std::collections::HashSet<IpAddr>>)>>,
);

impl HostAddrs {
    pub fn contains(&self, ip: IpAddr) -> bool {
        let set = {
            let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
            match &*g {
                Some((at, set)) if at.elapsed() < Duration::from_secs(1) => set.clone(),
                _ => {
                    let set = Arc::new(
                        sbx_dnsproxy::rebind::host_addresses()
                            .into_iter()
                            .map(|a| a.to_canonical())
                            .collect(),
                    );
                    *g = Some((std::time::Instant::now(), Arc::clone(&set)));
                    set
                }
            }
        };
        set.contains(&ip)
    }
}

/// DNS-over-TCP connections the sandbox may hold open at once; beyond, a
/// new one is reset (and alerted) at once.
pub const DNS_TCP_MAX: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayMode {
    /// Readiness-driven splicing; a connection that moves more than
    /// [`crate::relay::ESCALATE_AFTER`] bytes one way goes to two threads.
    Hybrid,
    /// Two blocking threads per connection from the start.
    Threads,
    /// Readiness-driven splicing only.
    Async,
}

impl RelayMode {
    pub fn from_env() -> Self {
        match std::env::var("SBX_NET_RELAY").as_deref() {
            Ok("threads") => RelayMode::Threads,
            Ok("async") => RelayMode::Async,
            _ => RelayMode::Hybrid,
        }
    }
}

/// Concurrent connections relayed on threads of their own (two each; the
/// blocking pool holds 512 threads).
pub const THREADED_MAX: usize = 128;

/// UDP DNS queries being answered at once (per socket).
pub const DNS_INFLIGHT: usize = 512;

/// A token bucket for alerts: `burst` at once, `per_sec` refill.
#[derive(Debug)]
pub struct AlertBudget {
    state: std::sync::Mutex<(f64, std::time::Instant)>,
    burst: f64,
    per_sec: f64,
}

impl AlertBudget {
    pub fn new(burst: u32, per_sec: u32) -> Self {
        AlertBudget {
            state: std::sync::Mutex::new((burst as f64, std::time::Instant::now())),
            burst: burst as f64,
            per_sec: per_sec as f64,
        }
    }
    fn take(&self) -> bool {
        let mut s = self.state.lock().unwrap();
        let now = std::time::Instant::now();
        let add = now.duration_since(s.1).as_secs_f64() * self.per_sec;
        s.0 = (s.0 + add).min(self.burst);
        s.1 = now;
        if s.0 >= 1.0 {
            s.0 -= 1.0;
            true
        } else {
            false
        }
    }
}

/// SO_ORIGINAL_DST / IP6T_SO_ORIGINAL_DST of a redirected connection.
pub fn original_dst(s: &TcpStream, v6: bool) -> io::Result<SocketAddr> {
    const SO_ORIGINAL_DST: libc::c_int = 80;
    // SAFETY: sockaddr_in/sockaddr_in6 are plain-old-data, so all-zero is a
    // valid value; getsockopt writes at most `len` bytes (the struct's own
    // size) into it; the socket is borrowed from `s` for the call.
    unsafe {
        if v6 {
            let mut sa: libc::sockaddr_in6 = std::mem::zeroed();
            let mut len = std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t;
            if libc::getsockopt(
                s.as_raw_fd(),
                libc::SOL_IPV6,
                SO_ORIGINAL_DST,
                (&mut sa as *mut libc::sockaddr_in6).cast(),
                &mut len,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            let ip = std::net::Ipv6Addr::from(sa.sin6_addr.s6_addr);
            Ok(SocketAddr::new(IpAddr::V6(ip), u16::from_be(sa.sin6_port)))
        } else {
            let mut sa: libc::sockaddr_in = std::mem::zeroed();
            let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            if libc::getsockopt(
                s.as_raw_fd(),
                libc::SOL_IP,
                SO_ORIGINAL_DST,
                (&mut sa as *mut libc::sockaddr_in).cast(),
                &mut len,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            let ip = std::net::Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr));
            Ok(SocketAddr::new(IpAddr::V4(ip), u16::from_be(sa.sin_port)))
        }
    }
}

/// Resets a connection (RST rather than FIN: the program sees a refusal).
fn reset(s: TcpStream) {
    let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
    drop(s);
}

/// Addresses the gateway never connects to whatever the allowlist says:
/// the host's loopback (reachable only through an IPv6 form that embeds
/// it: mapped, compatible, NAT64, 6to4), unspecified, multicast and
/// broadcast; judged through the shared table ([`sbx_core::addrclass`]),
/// so an embedded form is the address it embeds.
fn forbidden(ip: IpAddr) -> Option<&'static str> {
    match sbx_core::addrclass::classify(ip).map(|s| s.kind) {
        Some("loopback") => Some("host loopback is never reachable"),
        Some("unspecified") => Some("unspecified address"),
        Some("multicast_broadcast") => Some("multicast or broadcast address"),
        _ => None,
    }
}

impl Gateway {
    fn deny(&self, dst: SocketAddr, reason: &str, names: &[String], extra: serde_json::Value) {
        self.stats.denied.fetch_add(1, Ordering::Relaxed);
        if !self.alert_budget.take() {
            sbx_core::audit::budget_exhausted("net_denied", json!({}));
            self.stats.alerts_suppressed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut f = json!({
            "proto": "tcp",
            "dst": dst.ip().to_string(),
            "port": dst.port(),
            "reason": reason,
            "names": names,
        });
        if let (Some(m), serde_json::Value::Object(x)) = (f.as_object_mut(), extra) {
            m.extend(x);
        }
        audit::emit("net_denied", Severity::Alert, f);
    }

    /// The allow decision for a TCP destination (canonical address), with
    /// the alert when denied: how it is allowed and the names the address
    /// was answered for. Used at SYN time ([`crate::synq`]) and again when
    /// the gateway accepts the connection.
    pub fn decide(&self, dst: SocketAddr) -> Option<(String, Vec<String>)> {
        let ip = dst.ip();
        if let Some(why) = forbidden(ip) {
            self.deny(dst, why, &[], json!({}));
            return None;
        }
        // The host's own addresses: only when named by --allow-host-address,
        // whatever CIDR or answer covers them.
        let canon = sbx_core::addrclass::canonical(ip);
        if !self.host_allow.contains(&ip)
            && !self.host_allow.contains(&canon)
            && (self.host_addrs.contains(ip) || self.host_addrs.contains(canon))
        {
            self.deny(
                dst,
                "a host address (only reachable with --allow-host-address)",
                &[],
                json!({}),
            );
            return None;
        }
        let names = self
            .dns
            .as_ref()
            .map(|d| d.names_for(ip))
            .unwrap_or_default();
        match self.policy.check(ip, dst.port(), &names) {
            Verdict::Deny(why) => {
                self.deny(dst, why, &names, json!({}));
                None
            }
            Verdict::Cidr(r) => Some((format!("cidr {r}"), names)),
            Verdict::Name(n) => Some((format!("name {n}"), names)),
        }
    }

    /// A queued SYN: allowed, or denied with its alert. A packet that is
    /// not a TCP segment we can read is refused and alerted too.
    pub fn syn_allowed(&self, dst: Option<SocketAddr>) -> bool {
        match dst {
            Some(d) => self.decide(d).is_some(),
            None => {
                let unspecified = SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 0);
                self.deny(unspecified, "unparseable SYN", &[], json!({}));
                false
            }
        }
    }

    pub async fn serve_tcp(self: Arc<Self>, fd: OwnedFd, v6: bool) {
        let std_l = std::net::TcpListener::from(fd);
        let l = match TcpListener::from_std(std_l) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("gateway listener: {e}");
                return;
            }
        };
        loop {
            match l.accept().await {
                Ok((s, peer)) => {
                    let g = self.clone();
                    tokio::spawn(async move { g.conn(s, peer, v6).await });
                }
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    async fn conn(self: Arc<Self>, s: TcpStream, peer: SocketAddr, v6: bool) {
        let dst = match original_dst(&s, v6) {
            Ok(d) => d,
            Err(e) => {
                tracing::debug!("no original destination from {peer}: {e}");
                return reset(s);
            }
        };
        let ip = dst.ip().to_canonical();
        let dst = SocketAddr::new(ip, dst.port());
        if dst.port() == 53 {
            return self.dns_tcp(s, peer).await;
        }
        let Some((via, names)) = self.decide(dst) else {
            return reset(s);
        };
        let mut s = s;
        let mut head = Vec::new();
        if self.sni_check && via.starts_with("name ") {
            match self.check_name(&mut s, &mut head, dst, &names).await {
                Ok(()) => {}
                Err((why, claimed)) => {
                    self.deny(dst, &why, &names, json!({ "claimed_name": claimed }));
                    return reset(s);
                }
            }
        }
        // Phantom credentials: a connection to port 443, or to an address
        // answered for a declared host, shows its ClientHello first; one
        // naming a declared host is intercepted (whatever the address: the
        // real server must then prove it is that host).
        let mut intercept_as = None;
        if let Some(ic) = &self.intercept
            && (dst.port() == 443 || names.iter().any(|n| ic.declared(n)))
        {
            if head.is_empty() {
                self.read_head(&mut s, &mut head).await;
            }
            if let Sniff::Tls(Some(sni)) = sniff::sniff(&head)
                && ic.declared(&sni)
            {
                intercept_as = Some(sni);
            }
        }
        if intercept_as.is_none()
            && let Some(ic) = &self.intercept
            && let Some(sec) = crate::phantom::find(&ic.secrets, &head, false)
        {
            self.leak(&sec.name, &names.join(","), dst, "connection");
            return reset(s);
        }
        let out = match tokio::time::timeout(self.connect_timeout, TcpStream::connect(dst)).await {
            Ok(Ok(o)) => o,
            Ok(Err(e)) => {
                self.fail(dst, &e.to_string());
                return reset(s);
            }
            Err(_) => {
                self.fail(dst, "connect timed out");
                return reset(s);
            }
        };
        self.stats.allowed.fetch_add(1, Ordering::Relaxed);
        let mut ev =
            json!({ "proto": "tcp", "dst": ip.to_string(), "port": dst.port(), "via": via });
        if let Some(h) = &intercept_as {
            ev["intercepted"] = json!(h);
        }
        audit::emit("net_allowed", Severity::Info, ev);
        if let (Some(host), Some(ic)) = (intercept_as, &self.intercept) {
            let inside = crate::http::Prefixed::new(head, s);
            return crate::http::serve(self.clone(), ic.clone(), inside, out, dst, host).await;
        }
        let _ = out.set_nodelay(true);
        let _ = s.set_nodelay(true);
        let mut out = out;
        if !head.is_empty() {
            if out.write_all(&head).await.is_err() {
                return reset(s);
            }
            self.stats
                .bytes_out
                .fetch_add(head.len() as u64, Ordering::Relaxed);
        }
        // With secrets declared, what the sandbox sends is looked at (a
        // placeholder in plain text, or in a TLS ClientHello, is cut).
        if let Some(ic) = self.intercept.clone() {
            let keep = crate::phantom::longest(&ic.secrets);
            let g = self.clone();
            let names = names.join(",");
            crate::relay::relay_scanned(
                s,
                out,
                &self.stats.bytes_out,
                &self.stats.bytes_in,
                keep,
                |w| match crate::phantom::find(&ic.secrets, w, false) {
                    Some(sec) => {
                        g.leak(&sec.name, &names, dst, "connection");
                        false
                    }
                    None => true,
                },
            )
            .await;
            return;
        }
        // Threads (two per connection) only while few connections hold
        // them: past THREADED_MAX concurrent relays, readiness-driven
        // splicing only, so thousands of idle connections cost no threads.
        let may_thread = self.threaded.fetch_add(1, Ordering::Relaxed) < THREADED_MAX;
        match (self.relay, may_thread) {
            (RelayMode::Threads, true) => crate::relay::relay_threads(s, out, self.clone()).await,
            (RelayMode::Hybrid, _) => {
                crate::relay::relay_hybrid(s, out, self.clone(), may_thread).await
            }
            _ => crate::relay::relay(s, out, &self.stats.bytes_out, &self.stats.bytes_in).await,
        }
        self.threaded.fetch_sub(1, Ordering::Relaxed);
    }

    /// A placeholder on its way somewhere it does not belong: an alert
    /// naming the secret and the destination (never the value).
    pub fn leak(&self, name: &str, host: &str, dst: SocketAddr, place: &str) {
        self.stats.denied.fetch_add(1, Ordering::Relaxed);
        if !self.alert_budget.take() {
            sbx_core::audit::budget_exhausted("secret_leak_blocked", json!({}));
            self.stats.alerts_suppressed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        audit::emit(
            "secret_leak_blocked",
            Severity::Alert,
            json!({
                "secret": name,
                "host": host,
                "dst": dst.ip().to_string(),
                "port": dst.port(),
                "where": place,
            }),
        );
    }

    /// The real server of a declared host did not prove who it is.
    pub fn upstream_refused(&self, dst: SocketAddr, host: &str, why: &str) {
        self.stats.failed.fetch_add(1, Ordering::Relaxed);
        audit::emit(
            "net_upstream_refused",
            Severity::Alert,
            json!({ "proto": "tcp", "dst": dst.ip().to_string(), "port": dst.port(), "host": host, "error": why }),
        );
    }

    pub fn upstream_failed(&self, dst: SocketAddr, why: &str) {
        self.fail(dst, why);
    }

    /// Reads the first bytes of a connection into `head` until they say
    /// what they are (or [`Self::sniff_timeout`]).
    async fn read_head(&self, s: &mut TcpStream, head: &mut Vec<u8>) {
        let deadline = tokio::time::Instant::now() + self.sniff_timeout;
        let mut buf = vec![0u8; 4096];
        loop {
            match sniff::sniff(head) {
                Sniff::NeedMore if head.len() < sniff::MAX => {}
                _ => return,
            }
            match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => head.extend_from_slice(&buf[..n]),
                _ => return,
            }
        }
    }

    /// A DNS query whose name carries a placeholder: alerted, and answered
    /// REFUSED here (never forwarded).
    fn dns_leak(&self, q: &[u8], client: SocketAddr) -> Option<Vec<u8>> {
        let ic = self.intercept.as_ref()?;
        let name = dns_qname(q);
        let sec = crate::phantom::find(&ic.secrets, &name, true)?;
        let shown = String::from_utf8_lossy(&name).to_string();
        if self.alert_budget.take() {
            audit::emit(
                "secret_leak_blocked",
                Severity::Alert,
                json!({
                    "secret": sec.name,
                    "host": "dns",
                    "dst": client.ip().to_string(),
                    "port": 53,
                    "where": "dns",
                    "labels": shown.split('.').filter(|l| !l.is_empty()).count(),
                }),
            );
        } else {
            self.stats.alerts_suppressed.fetch_add(1, Ordering::Relaxed);
        }
        Some(refused(q))
    }

    fn fail(&self, dst: SocketAddr, why: &str) {
        self.stats.failed.fetch_add(1, Ordering::Relaxed);
        audit::emit(
            "net_connect_failed",
            Severity::Warn,
            json!({ "proto": "tcp", "dst": dst.ip().to_string(), "port": dst.port(), "error": why }),
        );
    }

    /// `--sni-check`: reads the connection's first bytes (kept in `head`
    /// for the outside) and checks the TLS SNI or HTTP Host.
    async fn check_name(
        &self,
        s: &mut TcpStream,
        head: &mut Vec<u8>,
        dst: SocketAddr,
        names: &[String],
    ) -> Result<(), (String, Option<String>)> {
        let deadline = tokio::time::Instant::now() + self.sniff_timeout;
        let mut buf = vec![0u8; 4096];
        let verdict = loop {
            match sniff::sniff(head) {
                Sniff::NeedMore if head.len() < sniff::MAX => {}
                other => break other,
            }
            let r = tokio::time::timeout_at(deadline, s.read(&mut buf)).await;
            match r {
                Ok(Ok(0)) | Ok(Err(_)) => break Sniff::Other,
                Ok(Ok(n)) => head.extend_from_slice(&buf[..n]),
                Err(_) => break Sniff::NeedMore,
            }
        };
        let claimed = match verdict {
            Sniff::Tls(Some(n)) | Sniff::Http(Some(n)) => n,
            Sniff::Tls(None) => return Err(("TLS ClientHello without SNI".into(), None)),
            Sniff::Http(None) => return Err(("HTTP request without a single Host".into(), None)),
            Sniff::NeedMore => return Err(("no TLS SNI or HTTP Host in time".into(), None)),
            Sniff::Other => return Err(("neither TLS with SNI nor HTTP with Host".into(), None)),
        };
        let claimed = claimed.trim_end_matches('.').to_string();
        if !self.policy.name_allows(&claimed, dst.port()) {
            return Err((
                "SNI/Host names a host not allowlisted for this port".into(),
                Some(claimed),
            ));
        }
        let resolved = names
            .iter()
            .any(|n| n.trim_end_matches('.').eq_ignore_ascii_case(&claimed));
        if !resolved {
            return Err((
                "SNI/Host names a host that did not resolve to this address".into(),
                Some(claimed),
            ));
        }
        Ok(())
    }

    /// DNS over TCP (RFC 1035 length-prefixed), query after query.
    async fn dns_tcp(&self, mut s: TcpStream, peer: SocketAddr) {
        let Some(dns) = self.dns.clone() else {
            return reset(s);
        };
        struct Slot<'a>(&'a std::sync::atomic::AtomicUsize);
        impl Drop for Slot<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::Relaxed);
            }
        }
        let open = self.dns_tcp_conns.fetch_add(1, Ordering::Relaxed) + 1;
        let _slot = Slot(&self.dns_tcp_conns);
        if open > DNS_TCP_MAX {
            self.deny(
                SocketAddr::new(s.local_addr().map_or(peer.ip(), |a| a.ip()), 53),
                "too many DNS-over-TCP connections",
                &[],
                json!({}),
            );
            return reset(s);
        }
        loop {
            let mut lb = [0u8; 2];
            let r = tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut lb)).await;
            if !matches!(r, Ok(Ok(_))) {
                return;
            }
            let len = u16::from_be_bytes(lb) as usize;
            let mut q = vec![0u8; len];
            let r = tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut q)).await;
            if !matches!(r, Ok(Ok(_))) {
                return;
            }
            self.stats.dns_queries.fetch_add(1, Ordering::Relaxed);
            let ans = match self.dns_leak(&q, peer) {
                Some(r) => Some(r),
                None => dns.handle(&q, peer, false).await,
            };
            let Some(ans) = ans else {
                self.stats.dns_unanswered.fetch_add(1, Ordering::Relaxed);
                return;
            };
            let mut out = Vec::with_capacity(ans.len() + 2);
            out.extend_from_slice(&(ans.len() as u16).to_be_bytes());
            out.extend_from_slice(&ans);
            if s.write_all(&out).await.is_err() {
                return;
            }
        }
    }

    pub async fn serve_udp(self: Arc<Self>, fd: OwnedFd) {
        let sock = match UdpSocket::from_std(std::net::UdpSocket::from(fd)) {
            Ok(s) => Arc::new(s),
            Err(e) => {
                tracing::error!("dns socket: {e}");
                return;
            }
        };
        let mut buf = vec![0u8; 65535];
        let inflight = Arc::new(tokio::sync::Semaphore::new(DNS_INFLIGHT));
        loop {
            let (n, peer) = match sock.recv_from(&mut buf).await {
                Ok(x) => x,
                Err(e) => {
                    tracing::debug!("dns recv: {e}");
                    continue;
                }
            };
            self.stats.dns_queries.fetch_add(1, Ordering::Relaxed);
            let Some(dns) = self.dns.clone() else {
                self.stats.dns_unanswered.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            // Bounded work: a query flood beyond DNS_INFLIGHT is dropped
            // (the client retries), not queued without limit.
            let Ok(permit) = inflight.clone().try_acquire_owned() else {
                self.stats.dns_unanswered.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let q = buf[..n].to_vec();
            if let Some(r) = self.dns_leak(&q, peer) {
                let _ = sock.send_to(&r, peer).await;
                continue;
            }
            let sock = sock.clone();
            let g = self.clone();
            tokio::spawn(async move {
                let _permit = permit;
                match dns.handle(&q, peer, true).await {
                    Some(ans) => {
                        let _ = sock.send_to(&ans, peer).await;
                    }
                    None => {
                        g.stats.dns_unanswered.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    }
}

/// The question name of a DNS query, dotted (empty when unreadable).
fn dns_qname(q: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut i = 12;
    while let Some(&l) = q.get(i) {
        let l = l as usize;
        if l == 0 || l & 0xc0 != 0 {
            break;
        }
        let Some(label) = q.get(i + 1..i + 1 + l) else {
            break;
        };
        out.extend_from_slice(label);
        out.push(b'.');
        i += 1 + l;
    }
    out
}

/// A REFUSED answer to `q`: its header and question, nothing else.
fn refused(q: &[u8]) -> Vec<u8> {
    let mut end = 12;
    while let Some(&l) = q.get(end) {
        if l == 0 || l & 0xc0 != 0 {
            break;
        }
        end += 1 + l as usize;
    }
    let end = (end + 5).min(q.len());
    let mut r = q[..end.max(12.min(q.len()))].to_vec();
    if r.len() >= 12 {
        r[2] = 0x80 | (r[2] & 0x79); // QR, opcode and RD kept
        r[3] = 5; // REFUSED
        r[6..12].fill(0);
        if end > 12 {
            r[4] = 0;
            r[5] = 1;
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every IPv6 form that embeds the host's loopback is the loopback;
    /// public addresses and private ones (allowed by a CIDR on purpose)
    /// are not refused here.
    #[test]
    fn embedded_loopback_is_never_reachable() {
        for a in [
            "127.0.0.1",
            "127.1.2.3",
            "::1",
            "::ffff:127.0.0.1",
            "::127.0.0.1",
            "64:ff9b::7f00:1",
            "2002:7f00:1::",
        ] {
            assert_eq!(
                forbidden(a.parse().unwrap()),
                Some("host loopback is never reachable"),
                "{a}"
            );
        }
        for a in ["0.0.0.0", "::", "224.0.0.1", "255.255.255.255", "ff02::1"] {
            assert!(forbidden(a.parse().unwrap()).is_some(), "{a}");
        }
        for a in ["93.184.216.34", "10.1.2.3", "2606:4700::1111", "fd00::1"] {
            assert_eq!(forbidden(a.parse().unwrap()), None, "{a}");
        }
    }
}
