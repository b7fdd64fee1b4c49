//! The sandbox's DNS: the sbx-dnsproxy library, in the supervisor. Only
//! allowlisted names are forwarded upstream; its answer log tells the
//! gateway which names an address was answered for.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use sbx_dnsproxy::{AnswerLog, DnsProxy, ProxyConfig};

#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    #[error("--dns-upstream '{0}': {1}")]
    Upstream(String, String),
    #[error("no --dns-upstream given and no usable nameserver in {0}")]
    NoUpstream(String),
    #[error("DNS proxy: {0}")]
    Proxy(String),
}

pub struct Dns {
    proxy: Arc<DnsProxy>,
    answers: Arc<AnswerLog>,
}

/// The nameservers of a resolv.conf (IP literals only).
pub fn resolv_conf_upstreams(path: &Path) -> Vec<SocketAddr> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some("nameserver")).then(|| w.next()).flatten()
        })
        .filter_map(|a| {
            // A scoped IPv6 (fe80::1%eth0) is not usable from here.
            a.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, 53))
        })
        .collect()
}

/// Upstreams from the flags, else from the host's /etc/resolv.conf.
pub fn upstreams(flags: &[String]) -> Result<Vec<SocketAddr>, DnsError> {
    if flags.is_empty() {
        let p = Path::new("/etc/resolv.conf");
        let v = resolv_conf_upstreams(p);
        if v.is_empty() {
            return Err(DnsError::NoUpstream(p.display().to_string()));
        }
        return Ok(v);
    }
    flags
        .iter()
        .map(|f| sbx_dnsproxy::parse_upstream(f).map_err(|e| DnsError::Upstream(f.clone(), e)))
        .collect()
}

impl Dns {
    pub fn new(cfg: ProxyConfig) -> Result<Self, DnsError> {
        let proxy = DnsProxy::new(cfg).map_err(|e| DnsError::Proxy(e.to_string()))?;
        let answers = proxy.answers();
        Ok(Dns { proxy, answers })
    }
}

impl crate::gateway::Dns for Dns {
    fn handle<'a>(
        &'a self,
        query: &'a [u8],
        client: SocketAddr,
        udp: bool,
    ) -> Pin<Box<dyn Future<Output = Option<Vec<u8>>> + Send + 'a>> {
        if udp {
            Box::pin(self.proxy.handle_udp(query, client))
        } else {
            Box::pin(self.proxy.handle(query, client))
        }
    }

    fn names_for(&self, ip: IpAddr) -> Vec<String> {
        self.answers.names_for(ip)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("r");
        std::fs::write(
            &p,
            "# x\nsearch a\nnameserver 10.0.0.2\nnameserver fe80::1%eth0\nnameserver ::1\n",
        )
        .unwrap();
        let v = resolv_conf_upstreams(&p);
        assert_eq!(
            v,
            vec!["10.0.0.2:53".parse().unwrap(), "[::1]:53".parse().unwrap()]
        );
    }
}
