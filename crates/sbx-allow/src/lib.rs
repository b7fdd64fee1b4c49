//! The allowlist: names and CIDRs, each bound to ports, and the decision for
//! one connection.
//!
//! Syntax (flags and `--allow-file` lines alike):
//! - `NAME[:PORTS]`: an exact DNS name, or `*.example.com` for its
//!   subdomains (not the apex). Without PORTS a name gets 80 and 443.
//! - `CIDR[:PORTS]` / `IP[:PORTS]`: `10.0.0.0/8:443`, `192.0.2.7`,
//!   `[2001:db8::]/32:22`, `[2001:db8::1]:443`, `2001:db8::/32` (IPv6 with
//!   ports needs the brackets). Without PORTS: 80 and 443.
//! - PORTS: `443`, `80,443`, `8000-8100`, or a mix (`22,8000-8100`).

use std::net::IpAddr;
use std::path::Path;

/// Whether `label` (one wire-format label) holds only bytes a hostname
/// label may hold: ASCII letters, digits, '-' and '_', 1 to 63 of them.
pub fn is_hostname_label(label: &[u8]) -> bool {
    (1..=63).contains(&label.len())
        && label
            .iter()
            .all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
}

/// Whether `name` (dotted, no trailing dot) is made of hostname labels
/// only, so that splitting it on '.' gives exactly its wire labels.
pub fn is_hostname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| is_hostname_label(l.as_bytes()))
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AllowError {
    #[error("{flag} '{entry}': {why}")]
    Bad {
        flag: String,
        entry: String,
        why: String,
    },
    #[error("--allow-file {path}: {why}")]
    File { path: String, why: String },
}

/// Ports as inclusive ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ports(Vec<(u16, u16)>);

impl Ports {
    pub fn web() -> Self {
        Ports(vec![(80, 80), (443, 443)])
    }

    pub fn contains(&self, p: u16) -> bool {
        self.0.iter().any(|&(lo, hi)| lo <= p && p <= hi)
    }

    pub fn parse(s: &str) -> Result<Self, String> {
        if s.is_empty() {
            return Err("empty port list after ':'".into());
        }
        let port = |t: &str| -> Result<u16, String> {
            let n: u32 = t
                .parse()
                .map_err(|_| format!("port '{t}' is not a number"))?;
            if n == 0 || n > 65535 {
                return Err(format!("port {n} is out of range 1-65535"));
            }
            Ok(n as u16)
        };
        let mut v = Vec::new();
        for part in s.split(',') {
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (port(a)?, port(b)?);
                    if a > b {
                        return Err(format!("port range {a}-{b} is reversed"));
                    }
                    v.push((a, b));
                }
                None => {
                    let p = port(part)?;
                    v.push((p, p));
                }
            }
        }
        Ok(Ports(v))
    }
}

impl std::fmt::Display for Ports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|&(a, b)| {
                if a == b {
                    a.to_string()
                } else {
                    format!("{a}-{b}")
                }
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

/// `example.com` or `*.example.com`, lower case, no trailing dot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameRule {
    pub name: String,
    pub wildcard: bool,
    pub ports: Ports,
}

impl NameRule {
    /// Whether `qname` (any case, trailing dot or not) is covered.
    /// Only plain hostnames match (see [`is_hostname`]):
    /// a name whose presentation form hides a dot inside a label
    /// (`x\.example.com`) or holds any other byte a hostname cannot
    /// (an SNI can carry anything) matches nothing.
    pub fn matches(&self, qname: &str) -> bool {
        let q = qname.trim_end_matches('.').to_ascii_lowercase();
        if !is_hostname(&q) {
            return false;
        }
        if self.wildcard {
            q.len() > self.name.len() + 1
                && q.ends_with(&self.name)
                && q.as_bytes()[q.len() - self.name.len() - 1] == b'.'
        } else {
            q == self.name
        }
    }

    /// The form the DNS proxy takes.
    pub fn dns_entry(&self) -> String {
        if self.wildcard {
            format!("*.{}", self.name)
        } else {
            self.name.clone()
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CidrRule {
    pub net: IpAddr,
    pub prefix: u8,
    pub ports: Ports,
}

impl CidrRule {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = if self.prefix == 0 {
                    0
                } else {
                    u32::MAX << (32 - self.prefix)
                };
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = if self.prefix == 0 {
                    0
                } else {
                    u128::MAX << (128 - self.prefix)
                };
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl std::fmt::Display for CidrRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}:{}", self.net, self.prefix, self.ports)
    }
}

/// One parsed entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Name(NameRule),
    Cidr(CidrRule),
}

fn bad(flag: &str, entry: &str, why: impl Into<String>) -> AllowError {
    AllowError::Bad {
        flag: flag.to_string(),
        entry: entry.to_string(),
        why: why.into(),
    }
}

/// Parses `IP`, `CIDR`, `[V6]`, `[V6]/N` with optional `:PORTS`; None when
/// the text is not an address form at all (then it is a name).
fn parse_cidr(s: &str) -> Option<Result<CidrRule, String>> {
    let (addr_part, rest) = if let Some(r) = s.strip_prefix('[') {
        let (a, rest) = r.split_once(']')?;
        (a.to_string(), rest.to_string())
    } else if s.parse::<std::net::Ipv6Addr>().is_ok() {
        (s.to_string(), String::new())
    } else if let Some((a, p)) = s.split_once('/') {
        if a.parse::<std::net::Ipv6Addr>().is_ok() {
            // 2001:db8::/32 or 2001:db8::/32:443
            (a.to_string(), format!("/{p}"))
        } else if a.parse::<std::net::Ipv4Addr>().is_ok() {
            (a.to_string(), format!("/{p}"))
        } else {
            return Some(Err(format!("'{a}' is not an IP address")));
        }
    } else {
        let (a, p) = match s.split_once(':') {
            Some((a, p)) => (a, format!(":{p}")),
            None => (s, String::new()),
        };
        a.parse::<std::net::Ipv4Addr>().ok()?;
        (a.to_string(), p)
    };
    let net: IpAddr = match addr_part.parse() {
        Ok(ip) => ip,
        Err(_) => return Some(Err(format!("'{addr_part}' is not an IP address"))),
    };
    let max = if net.is_ipv4() { 32 } else { 128 };
    let (prefix, ports) = match rest.strip_prefix('/') {
        Some(r) => {
            let (p, ports) = match r.split_once(':') {
                Some((p, ports)) => (p, Some(ports)),
                None => (r, None),
            };
            let n: u8 = match p.parse() {
                Ok(n) if n <= max => n,
                _ => return Some(Err(format!("prefix length '{p}' is not 0-{max}"))),
            };
            (n, ports)
        }
        None => match rest.strip_prefix(':') {
            Some(ports) => (max, Some(ports)),
            None if rest.is_empty() => (max, None),
            None => return Some(Err(format!("unexpected '{rest}' after the address"))),
        },
    };
    let ports = match ports {
        Some(p) => match Ports::parse(p) {
            Ok(p) => p,
            Err(e) => return Some(Err(e)),
        },
        None => Ports::web(),
    };
    // Host bits set: a likely typo; refuse rather than guess.
    let rule = CidrRule { net, prefix, ports };
    let masked = CidrRule {
        net: mask(net, prefix),
        ..rule.clone()
    };
    if masked.net != net {
        return Some(Err(format!(
            "host bits set in {net}/{prefix} (did you mean {}/{prefix}?)",
            masked.net
        )));
    }
    Some(Ok(rule))
}

fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(a) => {
            let m = if prefix == 0 {
                0
            } else {
                u32::MAX << (32 - prefix)
            };
            IpAddr::V4((u32::from(a) & m).into())
        }
        IpAddr::V6(a) => {
            let m = if prefix == 0 {
                0
            } else {
                u128::MAX << (128 - prefix)
            };
            IpAddr::V6((u128::from(a) & m).into())
        }
    }
}

/// Checks a DNS name (without `*.`): labels of letters, digits, `-`, `_`,
/// 1-63 bytes each, 253 in all.
fn check_name(n: &str) -> Result<(), String> {
    if n.is_empty() {
        return Err("empty name".into());
    }
    if n.len() > 253 {
        return Err("name longer than 253 bytes".into());
    }
    for label in n.split('.') {
        if label.is_empty() {
            return Err("empty label".into());
        }
        if label.len() > 63 {
            return Err(format!("label '{label}' longer than 63 bytes"));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!("label '{label}' starts or ends with '-'"));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(format!(
                "label '{label}' has characters other than a-z, 0-9, '-', '_'"
            ));
        }
    }
    if n.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err("looks like a malformed IP address".into());
    }
    Ok(())
}

/// Parses one `--allow` entry (a name or an address form).
pub fn parse_allow(flag: &str, s: &str) -> Result<Entry, AllowError> {
    let s = s.trim();
    if let Some(r) = parse_cidr(s) {
        return r.map(Entry::Cidr).map_err(|why| bad(flag, s, why));
    }
    let (name, ports) = match s.split_once(':') {
        Some((n, p)) => (n, Ports::parse(p).map_err(|why| bad(flag, s, why))?),
        None => (s, Ports::web()),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    let (wildcard, base) = match name.strip_prefix("*.") {
        Some(b) => (true, b.to_string()),
        None => (false, name.clone()),
    };
    if base.contains('*') {
        return Err(bad(
            flag,
            s,
            "'*' is allowed only as the whole first label ('*.example.com')",
        ));
    }
    check_name(&base).map_err(|why| bad(flag, s, why))?;
    if wildcard && !base.contains('.') {
        return Err(bad(
            flag,
            s,
            format!(
                "wildcard over a top-level domain ('*.{base}') allows too much; name a domain under it"
            ),
        ));
    }
    if !wildcard && !base.contains('.') && base != "localhost" {
        // A single label is legal DNS (intranet names), keep it.
    }
    Ok(Entry::Name(NameRule {
        name: base,
        wildcard,
        ports,
    }))
}

/// Parses one `--allow-cidr` entry.
pub fn parse_allow_cidr(s: &str) -> Result<CidrRule, AllowError> {
    let s = s.trim();
    match parse_cidr(s) {
        Some(r) => r.map_err(|why| bad("--allow-cidr", s, why)),
        None => Err(bad(
            "--allow-cidr",
            s,
            "not a CIDR (like 10.0.0.0/8:443 or [2001:db8::]/32:443)",
        )),
    }
}

/// Reads an allow file: one entry per line (as `--allow` takes), `#`
/// comments, blank lines ignored.
pub fn read_allow_file(path: &Path) -> Result<Vec<Entry>, AllowError> {
    let text =
        sbx_core::input::read_regular_string(path, sbx_core::input::LIST_CAP).map_err(|e| {
            AllowError::File {
                path: path.display().to_string(),
                why: e.to_string(),
            }
        })?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let flag = format!("--allow-file {} line {}", path.display(), i + 1);
        out.push(parse_allow(&flag, line)?);
    }
    Ok(out)
}

/// Why a connection was allowed or denied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Allowed by a CIDR rule.
    Cidr(String),
    /// Allowed because the DNS proxy answered this IP for this name.
    Name(String),
    Deny(&'static str),
}

/// The whole allowlist.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    pub names: Vec<NameRule>,
    pub cidrs: Vec<CidrRule>,
}

impl Policy {
    pub fn add(&mut self, e: Entry) {
        match e {
            Entry::Name(n) => self.names.push(n),
            Entry::Cidr(c) => self.cidrs.push(c),
        }
    }

    /// The name rule covering `qname` with `port`, if any.
    pub fn name_allows(&self, qname: &str, port: u16) -> bool {
        self.names
            .iter()
            .any(|r| r.ports.contains(port) && r.matches(qname))
    }

    pub fn name_listed(&self, qname: &str) -> bool {
        self.names.iter().any(|r| r.matches(qname))
    }

    pub fn cidr_allows(&self, ip: IpAddr, port: u16) -> Option<&CidrRule> {
        self.cidrs
            .iter()
            .find(|r| r.ports.contains(port) && r.contains(ip))
    }

    /// The decision for a connection to `ip:port`, given the names the DNS
    /// proxy answered with `ip` (still within TTL + grace).
    pub fn check(&self, ip: IpAddr, port: u16, names: &[String]) -> Verdict {
        if let Some(r) = self.cidr_allows(ip, port) {
            return Verdict::Cidr(r.to_string());
        }
        if let Some(n) = names.iter().find(|n| self.name_allows(n, port)) {
            return Verdict::Name(n.trim_end_matches('.').to_ascii_lowercase());
        }
        if self.cidrs.iter().any(|r| r.contains(ip)) {
            return Verdict::Deny("port not allowed for this address");
        }
        if names.iter().any(|n| self.name_listed(n)) {
            return Verdict::Deny("port not allowed for this name");
        }
        if names.is_empty() {
            Verdict::Deny("address not allowlisted and not resolved from an allowed name")
        } else {
            Verdict::Deny("address resolved only from names not allowlisted")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> NameRule {
        match parse_allow("--allow", s).unwrap() {
            Entry::Name(n) => n,
            e => panic!("{e:?}"),
        }
    }
    fn cidr(s: &str) -> CidrRule {
        match parse_allow("--allow", s).unwrap() {
            Entry::Cidr(c) => c,
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn ports() {
        assert_eq!(Ports::parse("443").unwrap().to_string(), "443");
        assert_eq!(Ports::parse("80,443").unwrap().to_string(), "80,443");
        let p = Ports::parse("8000-8100").unwrap();
        assert!(p.contains(8000) && p.contains(8100) && !p.contains(8101));
        for b in ["0", "70000", "", "80,", "9-1", "x", "1-", "-"] {
            assert!(Ports::parse(b).is_err(), "{b}");
        }
    }

    #[test]
    fn names() {
        let n = name("Example.COM.");
        assert_eq!(n.name, "example.com");
        assert_eq!(n.ports, Ports::web());
        assert!(
            n.matches("example.com") && n.matches("EXAMPLE.com.") && !n.matches("a.example.com")
        );
        let w = name("*.example.com:443");
        assert!(w.matches("a.example.com") && w.matches("a.b.example.com"));
        assert!(!w.matches("example.com") && !w.matches("badexample.com"));
        // One label holding a dot, as a presentation form shows it, and
        // other bytes no hostname has: never under the wildcard.
        for bad in [
            "x\\.example.com",
            "a b.example.com",
            "a..example.com",
            "a\\000.example.com",
            "\u{e9}.example.com",
        ] {
            assert!(!w.matches(bad), "{bad}");
        }
        assert_eq!(w.ports.to_string(), "443");
        for b in [
            "*.com",
            "*",
            "*.*.a.com",
            "a*.b.com",
            "a..b",
            "-a.com",
            "a.com:0",
            "a.com:70000",
            "a b.com",
            "",
        ] {
            assert!(parse_allow("--allow", b).is_err(), "{b}");
        }
        let e = parse_allow("--allow", "*.com").unwrap_err().to_string();
        assert!(e.starts_with("--allow '*.com': "), "{e}");
    }

    #[test]
    fn cidrs() {
        let c = cidr("10.0.0.0/8:443");
        assert!(
            c.contains("10.1.2.3".parse().unwrap()) && !c.contains("11.0.0.1".parse().unwrap())
        );
        assert_eq!(c.ports.to_string(), "443");
        assert_eq!(cidr("192.0.2.7").prefix, 32);
        assert_eq!(cidr("192.0.2.7:22").ports.to_string(), "22");
        assert_eq!(cidr("2001:db8::1").prefix, 128);
        let c6 = cidr("[2001:db8::]/32:22");
        assert!(c6.contains("2001:db8:1::5".parse().unwrap()));
        assert_eq!(cidr("2001:db8::/32").prefix, 32);
        assert_eq!(
            cidr("2001:db8::/32:8000-8100").ports.to_string(),
            "8000-8100"
        );
        assert_eq!(cidr("[2001:db8::1]:443").prefix, 128);
        assert!(cidr("0.0.0.0/0:443").contains("1.2.3.4".parse().unwrap()));
        for b in [
            "10.0.0.0/33",
            "10.0.0.1/8",
            "300.1.1.1/8",
            "10.0.0.0/8:0",
            "[::1",
            "1.2.3.4/x",
        ] {
            assert!(parse_allow_cidr(b).is_err(), "{b}");
        }
        assert!(parse_allow_cidr("example.com").is_err());
    }

    #[test]
    fn verdicts() {
        let mut p = Policy::default();
        p.add(parse_allow("--allow", "allowed.test").unwrap());
        p.add(parse_allow("--allow", "10.9.0.0/16:22").unwrap());
        let ip: IpAddr = "10.200.1.6".parse().unwrap();
        let names = vec!["allowed.test.".to_string()];
        assert_eq!(
            p.check(ip, 80, &names),
            Verdict::Name("allowed.test".into())
        );
        assert!(matches!(p.check(ip, 8080, &names), Verdict::Deny(_)));
        assert!(matches!(p.check(ip, 80, &[]), Verdict::Deny(_)));
        assert!(matches!(
            p.check(ip, 80, &["denied.test".into()]),
            Verdict::Deny(_)
        ));
        assert!(matches!(
            p.check("10.9.3.3".parse().unwrap(), 22, &[]),
            Verdict::Cidr(_)
        ));
        assert!(matches!(
            p.check("10.9.3.3".parse().unwrap(), 23, &[]),
            Verdict::Deny(_)
        ));
    }
}
