//! The one table of special-purpose addresses (IANA's IPv4 and IPv6
//! special-purpose registries, plus the forms that embed an IPv4 address
//! in an IPv6 one).
//!
//! sbx-dnsproxy drops answers that point a public name at one of them
//! (DNS rebinding); sbx-net judges its own host-address and
//! never-reachable checks through the same function, so an address that
//! embeds the host's loopback (`::ffff:127.0.0.1`, `2002:7f00:1::`,
//! `64:ff9b::7f00:1`, `::127.0.0.1`) is treated like the loopback itself.
//!
//! An IPv6 address that carries an IPv4 one is judged by the IPv4 one:
//! IPv4-mapped `::ffff:0:0/96`, IPv4-compatible `::/96`, NAT64
//! `64:ff9b::/96` (RFC 6052) and 6to4 `2002::/16` (RFC 3056). Teredo
//! `2001::/32` is special as a whole: a tunnel endpoint whose client
//! address (obfuscated in the low 32 bits) is whatever the tunnel says,
//! never a public web server's address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What an address is, when it is not an ordinary public unicast one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Special {
    /// The kind: `loopback`, `private`, `link_local`, `unspecified`,
    /// `shared_cgnat`, `multicast_broadcast`, `benchmarking`,
    /// `documentation`, `ietf_protocol`, `reserved`, `teredo`,
    /// `local_nat64`, `discard`.
    pub kind: &'static str,
    /// The IPv4 address it embeds, when judged by that one.
    pub embedded: Option<Ipv4Addr>,
}

/// IPv4 special-purpose blocks: (network, prefix length, kind). Order
/// matters only where blocks nest (255.255.255.255 inside 240.0.0.0/4).
const V4: &[(u32, u8, &str)] = &[
    (0x0000_0000, 8, "unspecified"),          // 0.0.0.0/8 "this network"
    (0x0a00_0000, 8, "private"),              // 10.0.0.0/8
    (0x6440_0000, 10, "shared_cgnat"),        // 100.64.0.0/10
    (0x7f00_0000, 8, "loopback"),             // 127.0.0.0/8
    (0xa9fe_0000, 16, "link_local"),          // 169.254.0.0/16
    (0xac10_0000, 12, "private"),             // 172.16.0.0/12
    (0xc000_0000, 24, "ietf_protocol"),       // 192.0.0.0/24
    (0xc000_0200, 24, "documentation"),       // 192.0.2.0/24 TEST-NET-1
    (0xc058_6300, 24, "reserved"),            // 192.88.99.0/24 6to4 relay anycast
    (0xc0a8_0000, 16, "private"),             // 192.168.0.0/16
    (0xc612_0000, 15, "benchmarking"),        // 198.18.0.0/15
    (0xc633_6400, 24, "documentation"),       // 198.51.100.0/24 TEST-NET-2
    (0xcb00_7100, 24, "documentation"),       // 203.0.113.0/24 TEST-NET-3
    (0xe000_0000, 4, "multicast_broadcast"),  // 224.0.0.0/4
    (0xffff_ffff, 32, "multicast_broadcast"), // limited broadcast
    (0xf000_0000, 4, "reserved"),             // 240.0.0.0/4
];

/// IPv6 special-purpose blocks that do not embed an IPv4 address.
const V6: &[(u128, u8, &str)] = &[
    (0, 128, "unspecified"),                     // ::
    (1, 128, "loopback"),                        // ::1
    (0x0064_ff9b_0001 << 80, 48, "local_nat64"), // 64:ff9b:1::/48
    (0x0100 << 112, 64, "discard"),              // 100::/64
    (0x2001_0000 << 96, 32, "teredo"),           // 2001::/32
    (0x2001_0002 << 96, 48, "benchmarking"),     // 2001:2::/48
    (0x2001_0010 << 96, 28, "reserved"),         // 2001:10::/28 ORCHID
    (0x2001_0020 << 96, 28, "reserved"),         // 2001:20::/28 ORCHIDv2
    (0x2001 << 112, 23, "ietf_protocol"),        // 2001::/23 (after its parts)
    (0x2001_0db8 << 96, 32, "documentation"),    // 2001:db8::/32
    (0x3fff << 112, 20, "documentation"),        // 3fff::/20
    (0x5f00 << 112, 16, "reserved"),             // 5f00::/16 SRv6 SIDs
    (0xfc00 << 112, 7, "private"),               // fc00::/7 ULA
    (0xfe80 << 112, 10, "link_local"),           // fe80::/10
    (0xfec0 << 112, 10, "link_local"),           // fec0::/10 site-local
    (0xff00 << 112, 8, "multicast_broadcast"),   // ff00::/8
];

fn in_v4(a: u32, net: u32, len: u8) -> bool {
    let m = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    a & m == net & m
}

fn in_v6(a: u128, net: u128, len: u8) -> bool {
    let m = if len == 0 {
        0
    } else {
        u128::MAX << (128 - len)
    };
    a & m == net & m
}

/// The kind of an IPv4 address, `None` for ordinary public unicast.
pub fn v4_kind(ip: Ipv4Addr) -> Option<&'static str> {
    let a = u32::from(ip);
    V4.iter()
        .find(|(net, len, _)| in_v4(a, *net, *len))
        .map(|(_, _, k)| *k)
}

/// The IPv4 address an IPv6 one carries and is to be judged by: mapped,
/// compatible (not `::` nor `::1`), NAT64 well-known prefix, 6to4.
pub fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let a = u128::from(ip);
    let low32 = Ipv4Addr::from(a as u32);
    if in_v6(a, 0xffff << 32, 96) || in_v6(a, 0x0064_ff9b << 96, 96) {
        return Some(low32);
    }
    if in_v6(a, 0, 96) && a > 1 {
        return Some(low32);
    }
    if in_v6(a, 0x2002 << 112, 16) {
        return Some(Ipv4Addr::from((a >> 80) as u32));
    }
    None
}

/// The special-purpose class of an address, `None` for ordinary public
/// unicast (the only kind a public name may point to).
pub fn classify(ip: IpAddr) -> Option<Special> {
    match ip {
        IpAddr::V4(v4) => v4_kind(v4).map(|kind| Special {
            kind,
            embedded: None,
        }),
        IpAddr::V6(v6) => {
            let a = u128::from(v6);
            if a <= 1 {
                return V6
                    .iter()
                    .find(|(net, len, _)| in_v6(a, *net, *len))
                    .map(|(_, _, kind)| Special {
                        kind,
                        embedded: None,
                    });
            }
            if let Some(v4) = embedded_v4(v6) {
                return v4_kind(v4).map(|kind| Special {
                    kind,
                    embedded: Some(v4),
                });
            }
            V6.iter()
                .find(|(net, len, _)| in_v6(a, *net, *len))
                .map(|(_, _, kind)| Special {
                    kind,
                    embedded: None,
                })
        }
    }
}

/// The address to compare with a host's own addresses and with allowlist
/// rules: the embedded IPv4 address of a mapped, compatible, NAT64 or
/// 6to4 address, else the address itself.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => embedded_v4(v6).map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(s: &str) -> Option<&'static str> {
        classify(s.parse().unwrap()).map(|s| s.kind)
    }

    #[test]
    fn ipv4_table() {
        for (a, want) in [
            ("0.1.2.3", "unspecified"),
            ("10.1.2.3", "private"),
            ("100.64.0.1", "shared_cgnat"),
            ("100.127.255.254", "shared_cgnat"),
            ("127.0.0.1", "loopback"),
            ("127.255.0.9", "loopback"),
            ("169.254.169.254", "link_local"),
            ("172.31.0.1", "private"),
            ("192.0.0.8", "ietf_protocol"),
            ("192.0.2.1", "documentation"),
            ("192.88.99.1", "reserved"),
            ("192.168.1.1", "private"),
            ("198.18.0.1", "benchmarking"),
            ("198.19.255.255", "benchmarking"),
            ("198.51.100.7", "documentation"),
            ("203.0.113.5", "documentation"),
            ("224.0.0.251", "multicast_broadcast"),
            ("240.0.0.1", "reserved"),
            ("255.255.255.254", "reserved"),
            ("255.255.255.255", "multicast_broadcast"),
        ] {
            assert_eq!(k(a), Some(want), "{a}");
        }
        for a in [
            "1.1.1.1",
            "93.184.216.34",
            "100.63.255.255",
            "100.128.0.0",
            "172.32.0.1",
            "192.0.1.255",
            "192.0.3.0",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
        ] {
            assert_eq!(k(a), None, "{a}");
        }
    }

    #[test]
    fn ipv6_table_and_embedded_forms() {
        for (a, want) in [
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:10.0.0.1", "private"),
            ("::127.0.0.1", "loopback"),
            ("::192.168.0.1", "private"),
            ("64:ff9b::a00:1", "private"),
            ("64:ff9b::7f00:1", "loopback"),
            ("64:ff9b::a9fe:a9fe", "link_local"),
            ("64:ff9b:1::1", "local_nat64"),
            ("2002:7f00:1::", "loopback"),
            ("2002:c0a8:101::1", "private"),
            ("2002:a9fe:a9fe::", "link_local"),
            ("2002:6440:1::", "shared_cgnat"),
            ("2001::1", "teredo"),
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "teredo"),
            ("2001:2::1", "benchmarking"),
            ("2001:1::1", "ietf_protocol"),
            ("2001:db8::1", "documentation"),
            ("3fff::1", "documentation"),
            ("100::1", "discard"),
            ("fd00::1", "private"),
            ("fe80::1", "link_local"),
            ("fec0::1", "link_local"),
            ("ff02::1", "multicast_broadcast"),
        ] {
            assert_eq!(k(a), Some(want), "{a}");
        }
        for a in [
            "2606:4700::1111",
            "2a00:1450:4001::200e",
            "::ffff:1.1.1.1",
            "2002:101:101::",
            "64:ff9b::101:101",
        ] {
            assert_eq!(k(a), None, "{a}");
        }
        assert_eq!(
            classify("2002:7f00:1::".parse().unwrap()).unwrap().embedded,
            Some(Ipv4Addr::LOCALHOST)
        );
        assert_eq!(
            canonical("64:ff9b::a00:1".parse().unwrap()),
            "10.0.0.1".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            canonical("2606:4700::1111".parse().unwrap()),
            "2606:4700::1111".parse::<IpAddr>().unwrap()
        );
    }
}
