//! DNS rebinding protection: which answer addresses a public name may not
//! point to.

use std::collections::HashSet;
use std::net::IpAddr;

/// Why an address is not acceptable for a public name, if it is not: a
/// host address (also when embedded in an IPv6 form), or any block of
/// the special-purpose table ([`sbx_core::addrclass`], shared with
/// sbx-net).
pub fn internal_kind(ip: IpAddr, own: &HashSet<IpAddr>) -> Option<&'static str> {
    if let Some(s) = sbx_core::addrclass::classify(ip) {
        return Some(s.kind);
    }
    let canon = sbx_core::addrclass::canonical(ip);
    (own.contains(&ip) || own.contains(&canon)).then_some("host_address")
}

/// The addresses of this host's interfaces (in the current network
/// namespace).
pub fn host_addresses() -> HashSet<IpAddr> {
    let mut out = HashSet::new();
    if let Ok(addrs) = nix::ifaddrs::getifaddrs() {
        for a in addrs {
            let Some(sa) = a.address else { continue };
            if let Some(v4) = sa.as_sockaddr_in() {
                out.insert(IpAddr::V4(v4.ip()));
            } else if let Some(v6) = sa.as_sockaddr_in6() {
                out.insert(IpAddr::V6(v6.ip()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds() {
        let own: HashSet<IpAddr> = ["93.184.216.7".parse().unwrap()].into();
        let k = |s: &str| internal_kind(s.parse().unwrap(), &own);
        assert_eq!(k("127.0.0.1"), Some("loopback"));
        assert_eq!(k("10.1.2.3"), Some("private"));
        assert_eq!(k("172.16.0.1"), Some("private"));
        assert_eq!(k("192.168.1.1"), Some("private"));
        assert_eq!(k("169.254.169.254"), Some("link_local"));
        assert_eq!(k("0.0.0.0"), Some("unspecified"));
        assert_eq!(k("100.64.0.1"), Some("shared_cgnat"));
        assert_eq!(k("93.184.216.7"), Some("host_address"));
        assert_eq!(k("::ffff:93.184.216.7"), Some("host_address"));
        assert_eq!(k("2002:5db8:d807::1"), Some("host_address"));
        assert_eq!(k("::1"), Some("loopback"));
        assert_eq!(k("::ffff:127.0.0.1"), Some("loopback"));
        assert_eq!(k("fd00::1"), Some("private"));
        assert_eq!(k("fe80::1"), Some("link_local"));
        assert_eq!(k("64:ff9b::a00:1"), Some("private"));
        assert_eq!(k("2002:a00:1::"), Some("private"));
        assert_eq!(k("2001:0:4136:e378:8000:63bf:3fff:fdd2"), Some("teredo"));
        assert_eq!(k("192.0.2.1"), Some("documentation"));
        assert_eq!(k("198.18.0.1"), Some("benchmarking"));
        assert_eq!(k("240.0.0.1"), Some("reserved"));
        assert_eq!(k("192.0.0.1"), Some("ietf_protocol"));
        assert_eq!(k("203.0.113.5"), Some("documentation"));
        assert_eq!(k("2001:db8::1"), Some("documentation"));
        assert_eq!(k("93.184.216.34"), None);
        assert_eq!(k("2606:4700::1111"), None);
    }
}
