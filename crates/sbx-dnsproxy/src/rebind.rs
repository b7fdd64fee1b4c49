//! DNS rebinding protection: which answer addresses a public name may not
//! point to.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why an address is not acceptable for a public name, if it is not.
pub fn internal_kind(ip: IpAddr, own: &HashSet<IpAddr>) -> Option<&'static str> {
    let ip = match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => ip,
        },
        v4 => v4,
    };
    if own.contains(&ip) {
        return Some("host_address");
    }
    match ip {
        IpAddr::V4(v4) => v4_kind(v4),
        IpAddr::V6(v6) => v6_kind(v6),
    }
}

fn v4_kind(ip: Ipv4Addr) -> Option<&'static str> {
    let o = ip.octets();
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_private() {
        Some("private")
    } else if ip.is_link_local() {
        Some("link_local")
    } else if ip.is_unspecified() || o[0] == 0 {
        Some("unspecified")
    } else if o[0] == 100 && (o[1] & 0xc0) == 64 {
        Some("shared_cgnat")
    } else if ip.is_broadcast() || ip.is_multicast() {
        Some("multicast_broadcast")
    } else {
        None
    }
}

fn v6_kind(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_unspecified() {
        Some("unspecified")
    } else if (s[0] & 0xfe00) == 0xfc00 {
        Some("private")
    } else if (s[0] & 0xffc0) == 0xfe80 || (s[0] & 0xffc0) == 0xfec0 {
        Some("link_local")
    } else if ip.is_multicast() {
        Some("multicast_broadcast")
    } else if s[0] == 0x64 && s[1] == 0xff9b {
        // NAT64: judge the embedded IPv4 address.
        let v4 = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
        v4_kind(v4)
    } else if let Some(v4) = ip.to_ipv4() {
        // IPv4-compatible (deprecated) forms.
        if s[0..5].iter().all(|&x| x == 0) {
            v4_kind(v4)
        } else {
            None
        }
    } else {
        None
    }
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
        let own: HashSet<IpAddr> = ["198.51.100.7".parse().unwrap()].into();
        let k = |s: &str| internal_kind(s.parse().unwrap(), &own);
        assert_eq!(k("127.0.0.1"), Some("loopback"));
        assert_eq!(k("10.1.2.3"), Some("private"));
        assert_eq!(k("172.16.0.1"), Some("private"));
        assert_eq!(k("192.168.1.1"), Some("private"));
        assert_eq!(k("169.254.169.254"), Some("link_local"));
        assert_eq!(k("0.0.0.0"), Some("unspecified"));
        assert_eq!(k("100.64.0.1"), Some("shared_cgnat"));
        assert_eq!(k("198.51.100.7"), Some("host_address"));
        assert_eq!(k("::1"), Some("loopback"));
        assert_eq!(k("::ffff:127.0.0.1"), Some("loopback"));
        assert_eq!(k("fd00::1"), Some("private"));
        assert_eq!(k("fe80::1"), Some("link_local"));
        assert_eq!(k("64:ff9b::a00:1"), Some("private"));
        assert_eq!(k("192.0.2.1"), None);
        assert_eq!(k("203.0.113.5"), None);
        assert_eq!(k("2001:db8::1"), None);
        assert_eq!(k("93.184.216.34"), None);
    }
}
