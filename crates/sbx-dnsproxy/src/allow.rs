//! Allowlist entries and the allowlist itself.
//!
//! An entry is an exact name (`example.com`), a wildcard over the
//! subdomains of a name (`*.example.com`: `a.example.com`,
//! `a.b.example.com`, but not `example.com` itself), or an IP literal
//! (`192.0.2.1`, `2001:db8::1`, `[2001:db8::1]`), which the DNS proxy keeps
//! but never matches a name against (sbx-net lets such addresses through
//! directly).
//!
//! Matching costs one hash lookup for the exact set and one per label of
//! the query name for the wildcard set: it does not grow with the list.

use std::collections::HashSet;
use std::fmt;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// The hasher of every name set: fast, and seeded per process so an
/// attacker cannot pick query names that collide.
pub type NameHasher = foldhash::fast::RandomState;
pub type NameSet = HashSet<Box<str>, NameHasher>;

/// One parsed allowlist entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AllowEntry {
    /// Exactly this name (lower case, no trailing dot).
    Exact(String),
    /// Every name strictly below this one (`*.` stripped, lower case).
    Subdomains(String),
    /// An IP literal: passes through untouched (not a DNS name).
    Ip(IpAddr),
}

impl fmt::Display for AllowEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllowEntry::Exact(n) => f.write_str(n),
            AllowEntry::Subdomains(n) => write!(f, "*.{n}"),
            AllowEntry::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum AllowError {
    #[error("allowlist entry '{entry}': {why}")]
    Entry { entry: String, why: String },
    #[error("{path}:{line}: allowlist entry '{entry}': {why}")]
    FileEntry {
        path: PathBuf,
        line: usize,
        entry: String,
        why: String,
    },
    #[error("--allow-file {path}: {why}")]
    File { path: PathBuf, why: String },
}

fn bad(entry: &str, why: impl Into<String>) -> AllowError {
    AllowError::Entry {
        entry: entry.to_string(),
        why: why.into(),
    }
}

/// Parses and validates one allowlist entry (shared with sbx-net, which
/// strips its `:PORTS` suffix first).
pub fn parse_allow_entry(s: &str) -> Result<AllowEntry, AllowError> {
    let t = s.trim();
    if t.is_empty() {
        return Err(bad(s, "empty"));
    }
    // IP literals, with or without brackets.
    let unbracketed = t
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .unwrap_or(t);
    if let Ok(ip) = unbracketed.parse::<IpAddr>() {
        return Ok(AllowEntry::Ip(ip));
    }
    if t.contains('/') {
        return Err(bad(
            s,
            "a CIDR is not a name (sbx-net takes it with --allow-cidr)",
        ));
    }
    if t == "*" || t == "*." {
        return Err(bad(s, "a bare '*' would allow every name"));
    }
    let (wild, rest) = match t.strip_prefix("*.") {
        Some(r) => (true, r),
        None => (false, t),
    };
    if rest.contains('*') {
        return Err(bad(
            s,
            "'*' is only allowed as the whole first label ('*.example.com')",
        ));
    }
    if rest.starts_with('.') {
        return Err(bad(
            s,
            "a name cannot start with '.' (for subdomains write '*.example.com')",
        ));
    }
    let name = normalize_name(rest).map_err(|why| bad(s, why))?;
    if wild {
        if !name.contains('.') {
            return Err(bad(
                s,
                "a wildcard over a top-level domain would allow a whole TLD",
            ));
        }
        if is_public_suffix(&name) {
            return Err(bad(
                s,
                format!(
                    "'{name}' is a public suffix: a wildcard over it allows unrelated registrants"
                ),
            ));
        }
        Ok(AllowEntry::Subdomains(name))
    } else {
        Ok(AllowEntry::Exact(name))
    }
}

/// Lower-cases, strips one trailing dot and validates a DNS name
/// (letters, digits, '-' and '_' in labels of 1..=63 bytes, 253 in all;
/// internationalised names are converted to their A-label form).
pub fn normalize_name(s: &str) -> Result<String, String> {
    let s = s.strip_suffix('.').unwrap_or(s);
    if s.is_empty() {
        return Err("empty name".into());
    }
    let ascii = if s.is_ascii() {
        s.to_ascii_lowercase()
    } else {
        let n =
            hickory_proto::rr::Name::from_utf8(s).map_err(|e| format!("not a valid name: {e}"))?;
        let a = n.to_ascii();
        a.strip_suffix('.').unwrap_or(&a).to_ascii_lowercase()
    };
    if ascii.len() > 253 {
        return Err("name longer than 253 bytes".into());
    }
    for label in ascii.split('.') {
        if label.is_empty() {
            return Err("empty label".into());
        }
        if label.len() > 63 {
            return Err(format!("label '{label}' longer than 63 bytes"));
        }
        if let Some(c) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
        {
            // The character itself: the one stderr line escapes it
            // (sbx_core::escape), `{c:?}` escaped it a first time.
            return Err(format!("character '{c}' not allowed in a name"));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!("label '{label}' starts or ends with '-'"));
        }
    }
    Ok(ascii)
}

// The hostname rules are sbx-allow's (the allowlist matcher uses them too).
pub use sbx_allow::{is_hostname, is_hostname_label};

/// The lower-case dotted form of a parsed name, built from its wire
/// labels; `None` when a label holds a byte that is not a hostname
/// character (a dot, a backslash, a space, a control or 8-bit byte...):
/// such a name is refused, never matched or forwarded. The root is "".
pub fn name_from_wire(name: &hickory_proto::rr::Name) -> Option<String> {
    let mut out = String::with_capacity(name.len());
    for label in name.iter() {
        if !is_hostname_label(label) {
            return None;
        }
        if !out.is_empty() {
            out.push('.');
        }
        out.extend(label.iter().map(|c| c.to_ascii_lowercase() as char));
    }
    Some(out)
}

/// A wire name as an audit field or a message: the DNS presentation form
/// (labels joined by '.', a '.' or '\\' inside a label as `\.` and `\\`,
/// so `x\.allowed.test` is one label), every other byte as it is. A
/// control byte is not pre-escaped (hickory's `to_ascii` made ESC `\033`,
/// shown `\\033` once a reader escaped the field): whatever shows the field
/// escapes it, once (`sbx_core::escape`). Bytes that are not UTF-8 are
/// `\DDD` (decimal), as in a zone file.
pub fn name_shown(name: &hickory_proto::rr::Name) -> String {
    let mut b: Vec<u8> = Vec::with_capacity(name.len());
    for (i, label) in name.iter().enumerate() {
        if i > 0 {
            b.push(b'.');
        }
        for &c in label {
            if c == b'.' || c == b'\\' {
                b.push(b'\\');
            }
            b.push(c);
        }
    }
    let mut out = String::with_capacity(b.len());
    let mut rest = b.as_slice();
    loop {
        match std::str::from_utf8(rest) {
            Ok(s) => {
                out.push_str(s);
                return out;
            }
            Err(e) => {
                let (good, bad) = rest.split_at(e.valid_up_to());
                out.push_str(std::str::from_utf8(good).unwrap_or(""));
                let n = e.error_len().unwrap_or(bad.len()).max(1);
                for x in &bad[..n] {
                    out.push_str(&format!("\\{x:03}"));
                }
                rest = &bad[n..];
            }
        }
    }
}

/// Whether `name` (normalised) is itself a public suffix (`com`, `co.uk`,
/// `github.io`, ...), from the Public Suffix List.
pub fn is_public_suffix(name: &str) -> bool {
    match psl::suffix(name.as_bytes()) {
        Some(sfx) => sfx.is_known() && sfx.as_bytes() == name.as_bytes(),
        None => false,
    }
}

/// What a name matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Match<'a> {
    /// An exact entry.
    Exact,
    /// A wildcard entry: the suffix (without `*.`) it matched under.
    Wildcard(&'a str),
}

/// The compiled allowlist: a hash set of exact names and one of wildcard
/// suffixes. Lookup is O(labels of the query name).
#[derive(Debug, Clone, Default)]
pub struct Allowlist {
    exact: NameSet,
    wild: NameSet,
    ips: Vec<IpAddr>,
}

impl Allowlist {
    pub fn new(entries: impl IntoIterator<Item = AllowEntry>) -> Self {
        let mut a = Allowlist::default();
        for e in entries {
            a.insert(e);
        }
        a
    }

    pub fn insert(&mut self, e: AllowEntry) {
        match e {
            AllowEntry::Exact(n) => {
                self.exact.insert(n.into_boxed_str());
            }
            AllowEntry::Subdomains(n) => {
                self.wild.insert(n.into_boxed_str());
            }
            AllowEntry::Ip(ip) => {
                if !self.ips.contains(&ip) {
                    self.ips.push(ip)
                }
            }
        }
    }

    /// Parses every string (errors name the entry).
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, AllowError> {
        let mut a = Allowlist::default();
        a.reserve(entries.len());
        for e in entries {
            a.insert(parse_allow_entry(e.as_ref())?);
        }
        Ok(a)
    }

    pub fn reserve(&mut self, n: usize) {
        self.exact.reserve(n);
    }

    /// Adds the entries of a file: one per line, `#` starts a comment.
    pub fn add_file(&mut self, path: &Path) -> Result<(), AllowError> {
        let text =
            sbx_core::input::read_regular_string(path, sbx_core::input::LIST_CAP).map_err(|e| {
                AllowError::File {
                    path: path.to_path_buf(),
                    why: e.to_string(),
                }
            })?;
        for (i, line) in text.lines().enumerate() {
            let l = line.split('#').next().unwrap_or("").trim();
            if l.is_empty() {
                continue;
            }
            let e = parse_allow_entry(l).map_err(|e| match e {
                AllowError::Entry { entry, why } => AllowError::FileEntry {
                    path: path.to_path_buf(),
                    line: i + 1,
                    entry,
                    why,
                },
                other => other,
            })?;
            self.insert(e);
        }
        Ok(())
    }

    /// Whether `name` (lower case, no trailing dot) is allowed, and how.
    /// A name that is not a plain hostname (a byte other than letters,
    /// digits, '-', '_' and the dots between labels, or an empty label)
    /// matches nothing: its presentation form could hide a dot inside a
    /// label (`x\.allowed.test`), and splitting it on '.' would put it
    /// under `*.allowed.test`.
    pub fn matches<'a>(&'a self, name: &str) -> Option<Match<'a>> {
        if !is_hostname(name) {
            return None;
        }
        if self.exact.contains(name) {
            return Some(Match::Exact);
        }
        self.wildcard_suffix(name).map(Match::Wildcard)
    }

    /// The wildcard entry `name` falls under, if any (the longest one).
    pub fn wildcard_suffix<'a>(&'a self, name: &str) -> Option<&'a str> {
        if self.wild.is_empty() {
            return None;
        }
        let mut rest = name;
        while let Some(i) = rest.find('.') {
            rest = &rest[i + 1..];
            if let Some(s) = self.wild.get(rest) {
                return Some(s);
            }
        }
        None
    }

    pub fn contains_name(&self, name: &str) -> bool {
        self.matches(name).is_some()
    }

    /// The IP literals of the list.
    pub fn ips(&self) -> &[IpAddr] {
        &self.ips
    }

    /// Number of name entries (exact + wildcard).
    pub fn len(&self) -> usize {
        self.exact.len() + self.wild.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0 && self.ips.is_empty()
    }

    /// The hash-builder of the sets (for callers that pre-hash).
    pub fn hasher(&self) -> &impl BuildHasher {
        self.exact.hasher()
    }
}

/// A set of domains given as "this name and everything under it" (the
/// rebinding exceptions).
#[derive(Debug, Clone, Default)]
pub struct DomainSet(NameSet);

impl DomainSet {
    pub fn parse<S: AsRef<str>>(names: &[S], what: &str) -> Result<Self, AllowError> {
        let mut set = NameSet::default();
        for n in names {
            let raw = n.as_ref();
            let t = raw.trim().strip_prefix("*.").unwrap_or(raw.trim());
            let norm = normalize_name(t).map_err(|why| bad(raw, format!("{what}: {why}")))?;
            set.insert(norm.into_boxed_str());
        }
        Ok(DomainSet(set))
    }

    /// Whether `name` is one of the domains or below one.
    pub fn covers(&self, name: &str) -> bool {
        if self.0.is_empty() {
            return false;
        }
        let mut rest = name;
        loop {
            if self.0.contains(rest) {
                return true;
            }
            match rest.find('.') {
                Some(i) => rest = &rest[i + 1..],
                None => return false,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wire name's control bytes reach the audit field as they are (the
    /// reader escapes them once), a dot inside a label stays `\.`, and a
    /// byte that is not UTF-8 is `\DDD`; the allowlist error quotes the
    /// character itself (escaped once, by the stderr line).
    #[test]
    fn wire_names_are_shown_unescaped_but_unambiguous() {
        let n = hickory_proto::rr::Name::from_labels(vec![
            b"a\x1bb\nc".to_vec(),
            b"x.y".to_vec(),
            b"\xff\x01".to_vec(),
            b"test".to_vec(),
        ])
        .unwrap();
        assert_eq!(name_shown(&n), "a\u{1b}b\nc.x\\.y.\\255\u{1}.test");
        assert_eq!(
            normalize_name("a\u{1b}b").unwrap_err(),
            "character '\u{1b}' not allowed in a name"
        );
    }

    #[test]
    fn entries_parse() {
        assert_eq!(
            parse_allow_entry("Example.COM."),
            Ok(AllowEntry::Exact("example.com".into()))
        );
        assert_eq!(
            parse_allow_entry("*.example.com"),
            Ok(AllowEntry::Subdomains("example.com".into()))
        );
        assert_eq!(
            parse_allow_entry("192.0.2.1"),
            Ok(AllowEntry::Ip("192.0.2.1".parse().unwrap()))
        );
        assert_eq!(
            parse_allow_entry("[2001:db8::1]"),
            Ok(AllowEntry::Ip("2001:db8::1".parse().unwrap()))
        );
        assert_eq!(
            parse_allow_entry("_dmarc.example.com"),
            Ok(AllowEntry::Exact("_dmarc.example.com".into()))
        );
        assert_eq!(
            parse_allow_entry("bücher.example"),
            Ok(AllowEntry::Exact("xn--bcher-kva.example".into()))
        );
    }

    #[test]
    fn bad_entries_name_themselves() {
        for (e, why) in [
            ("*.com", "top-level"),
            ("*", "bare"),
            ("*.", "bare"),
            ("*.co.uk", "public suffix"),
            ("*.github.io", "public suffix"),
            ("a.*.com", "first label"),
            ("*foo.com", "first label"),
            ("", "empty"),
            ("exa mple.com", "not allowed"),
            ("a..b", "empty label"),
            (".example.com", "start with"),
            ("-a.com", "'-'"),
            ("10.0.0.0/8", "CIDR"),
        ] {
            let err = parse_allow_entry(e).unwrap_err().to_string();
            assert!(err.contains(why), "{e}: {err}");
            assert!(err.contains(&format!("'{e}'")), "{e}: {err}");
        }
        let long = format!("{}.com", "a".repeat(64));
        assert!(parse_allow_entry(&long).is_err());
    }

    #[test]
    fn matching() {
        let a = Allowlist::parse(&["example.com", "*.allowed.test", "192.0.2.9"]).unwrap();
        assert_eq!(a.matches("example.com"), Some(Match::Exact));
        assert_eq!(a.matches("www.example.com"), None);
        assert_eq!(a.matches("allowed.test"), None, "apex not included");
        assert_eq!(
            a.matches("a.allowed.test"),
            Some(Match::Wildcard("allowed.test"))
        );
        assert_eq!(
            a.matches("x.y.allowed.test"),
            Some(Match::Wildcard("allowed.test"))
        );
        assert_eq!(a.matches("notallowed.test"), None);
        assert_eq!(a.matches("allowed.test.evil.com"), None);
        assert_eq!(a.ips(), &["192.0.2.9".parse::<IpAddr>().unwrap()]);
    }

    #[test]
    fn domain_set() {
        let d = DomainSet::parse(&["corp.internal"], "--rebind-allow").unwrap();
        assert!(d.covers("corp.internal"));
        assert!(d.covers("a.b.corp.internal"));
        assert!(!d.covers("xcorp.internal"));
        assert!(!d.covers("internal"));
    }
}
