//! The deny list: which host paths are hidden inside the sandbox.
//!
//! A rule is a path (hidden in every bind that contains it; when it does
//! not exist and the bind is writable, a placeholder keeps it from being
//! created), a name pattern in one directory (`/etc/ssh/*_key`), or a name
//! pattern matched in every user bind (`.env.*`) or in every bind under a
//! home (`credentials*`), at any depth; the search reads at most
//! `--scan-limit` entries per bind and refuses to start beyond that
//! ([`crate::protect::walk`]): never a silent stop.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::plan::{Kind, Op, Source, What};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every bind except the system directories.
    UserBinds,
    /// Binds under a home directory.
    Homes,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// A path; `kind` is what a placeholder is when it does not exist.
    Path { path: PathBuf, kind: Kind },
    /// Names matching `pat` directly in `dir`.
    InDir { dir: PathBuf, pat: String },
    /// Names matching `pat` anywhere in the binds of `scope`.
    Name { pat: String, scope: Scope },
}

/// The default deny list (`--no-default-deny` drops it).
pub fn defaults(home: Option<&Path>) -> Vec<Rule> {
    let mut v = Vec::new();
    for p in [
        "/etc/shadow",
        "/etc/shadow-",
        "/etc/gshadow",
        "/etc/gshadow-",
        "/etc/sudoers",
        "/etc/sudoers.d",
        "/etc/security/opasswd",
        "/etc/ssl/private",
        "/etc/krb5.keytab",
    ] {
        v.push(Rule::Path {
            path: p.into(),
            kind: Kind::File,
        });
    }
    v.push(Rule::InDir {
        dir: "/etc/ssh".into(),
        pat: "*_key".into(),
    });
    if let Some(h) = home {
        for (rel, kind) in [
            (".ssh", Kind::Dir),
            (".aws", Kind::Dir),
            (".gnupg", Kind::Dir),
            (".kube", Kind::Dir),
            (".docker/config.json", Kind::File),
            (".netrc", Kind::File),
            (".config/gcloud", Kind::Dir),
            (".git-credentials", Kind::File),
            // Tokens of CLIs that live in the home (issue 15): they matter
            // when the project is the home or contains it.
            (".vault-token", Kind::File),
            (".config/gh/hosts.yml", Kind::File),
            (".config/hub", Kind::File),
            (".npmrc", Kind::File),
            (".pypirc", Kind::File),
            (".cargo/credentials", Kind::File),
            (".cargo/credentials.toml", Kind::File),
            (".gem/credentials", Kind::File),
            (".azure", Kind::Dir),
            (".terraform.d/credentials.tfrc.json", Kind::File),
            (".config/doctl", Kind::Dir),
        ] {
            v.push(Rule::Path {
                path: h.join(rel),
                kind,
            });
        }
        // Claude Code's login. Only when it exists: a missing one needs no
        // placeholder (the .claude invariant already keeps a .claude at the
        // top of a writable bind from being written), and a placeholder
        // inside the guarded .claude could not be mounted.
        let claude = h.join(".claude/.credentials.json");
        if std::fs::symlink_metadata(&claude).is_ok_and(|m| m.is_file()) {
            v.push(Rule::Path {
                path: claude,
                kind: Kind::File,
            });
        }
    }
    for pat in [".env", ".env.*"] {
        v.push(Rule::Name {
            pat: pat.into(),
            scope: Scope::UserBinds,
        });
    }
    v.push(Rule::Name {
        pat: "credentials*".into(),
        scope: Scope::Homes,
    });
    v
}

fn has_glob(s: &[u8]) -> bool {
    s.iter().any(|c| matches!(c, b'*' | b'?' | b'['))
}

/// A `--deny` value: `~/x`, an absolute or relative path, a pattern in a
/// directory (`/etc/ssh/*_key`) or a bare name pattern (`.env.*`).
pub fn parse_rule(raw: &OsStr, home: Option<&Path>, cwd: &Path) -> Rule {
    let b = raw.as_bytes();
    let path = if let Some(rest) = b.strip_prefix(b"~/") {
        match home {
            Some(h) => h.join(OsStr::from_bytes(rest)),
            None => PathBuf::from(OsStr::from_bytes(rest)),
        }
    } else if !b.contains(&b'/') {
        return Rule::Name {
            pat: String::from_utf8_lossy(b).into_owned(),
            scope: Scope::UserBinds,
        };
    } else {
        cwd.join(raw)
    };
    let name = path
        .file_name()
        .map(|n| n.as_bytes().to_vec())
        .unwrap_or_default();
    if has_glob(&name) {
        return Rule::InDir {
            dir: path.parent().unwrap_or(Path::new("/")).to_path_buf(),
            pat: String::from_utf8_lossy(&name).into_owned(),
        };
    }
    Rule::Path {
        path,
        kind: Kind::File,
    }
}

/// Shell-style match of `*`, `?` and `[...]` against a file name.
pub fn glob_match(pat: &[u8], name: &[u8]) -> bool {
    match (pat.first(), name.first()) {
        (None, None) => true,
        (Some(b'*'), _) => {
            glob_match(&pat[1..], name) || (!name.is_empty() && glob_match(pat, &name[1..]))
        }
        (Some(b'?'), Some(_)) => glob_match(&pat[1..], &name[1..]),
        (Some(b'['), Some(c)) => match pat.iter().position(|x| *x == b']') {
            Some(end) if end > 1 => {
                let set = &pat[1..end];
                let (neg, set) = match set.first() {
                    Some(b'!') | Some(b'^') => (true, &set[1..]),
                    _ => (false, set),
                };
                let mut hit = false;
                let mut i = 0;
                while i < set.len() {
                    if i + 2 < set.len() && set[i + 1] == b'-' {
                        hit |= set[i] <= *c && *c <= set[i + 2];
                        i += 3;
                    } else {
                        hit |= set[i] == *c;
                        i += 1;
                    }
                }
                hit != neg && glob_match(&pat[end + 1..], &name[1..])
            }
            _ => *c == b'[' && glob_match(&pat[1..], &name[1..]),
        },
        (Some(p), Some(c)) => p == c && glob_match(&pat[1..], &name[1..]),
        _ => false,
    }
}

fn is_home_path(p: &Path, home: Option<&Path>) -> bool {
    p.starts_with("/home") || p.starts_with("/root") || home.is_some_and(|h| p.starts_with(h))
}

/// What the rules hide inside one bind (`s` mounted at `dst`). Fails
/// closed: when the bind holds more than
/// [`crate::protect::DEFAULT_SCAN_LIMIT`] entries the whole bind is hidden
/// (sbx-fs itself calls [`apply_limited`] and refuses to start).
pub fn apply(rules: &[Rule], s: &Source, dst: &Path, home: Option<&Path>) -> Vec<Op> {
    match apply_limited(rules, s, dst, home, crate::protect::DEFAULT_SCAN_LIMIT) {
        Ok(ops) => ops,
        Err(e) => {
            e.alert();
            vec![Op::new(dst, s.kind, What::Deny, "deny")]
        }
    }
}

/// [`apply`] with the name search bounded by `limit` entries: an error
/// beyond it.
pub fn apply_limited(
    rules: &[Rule],
    s: &Source,
    dst: &Path,
    home: Option<&Path>,
    limit: usize,
) -> Result<Vec<Op>, crate::protect::ScanError> {
    let mut ops = Vec::new();
    let mut names: Vec<&str> = Vec::new();
    for r in rules {
        match r {
            Rule::Path { path, kind } => {
                if s.path.starts_with(path) {
                    // The whole bind lies inside a denied path.
                    ops.push(Op::new(dst, s.kind, What::Deny, "deny"));
                    continue;
                }
                let Ok(rel) = path.strip_prefix(&s.path) else {
                    continue;
                };
                if s.kind != Kind::Dir {
                    continue;
                }
                match std::fs::symlink_metadata(path) {
                    // A symlink resolves inside the sandbox, where its
                    // target is subject to the rules: nothing to hide.
                    Ok(m) if m.file_type().is_symlink() => {}
                    Ok(m) => ops.push(Op::new(
                        dst.join(rel),
                        if m.is_dir() { Kind::Dir } else { Kind::File },
                        What::Deny,
                        "deny",
                    )),
                    // Missing: only a writable bind could let it be created.
                    Err(_) if s.rw => {
                        // The first missing component becomes the placeholder
                        // when a parent is missing too, unless that parent is
                        // the bind itself.
                        ops.push(Op::new(dst.join(rel), *kind, What::Deny, "deny"));
                    }
                    Err(_) => {}
                }
            }
            Rule::InDir { dir, pat } => {
                let Ok(rel) = dir.strip_prefix(&s.path) else {
                    continue;
                };
                let Ok(rd) = std::fs::read_dir(dir) else {
                    continue;
                };
                for e in rd.flatten() {
                    let n = e.file_name();
                    if !glob_match(pat.as_bytes(), n.as_bytes()) {
                        continue;
                    }
                    let Ok(ft) = e.file_type() else { continue };
                    if ft.is_symlink() {
                        continue;
                    }
                    let kind = if ft.is_dir() { Kind::Dir } else { Kind::File };
                    ops.push(Op::new(dst.join(rel).join(&n), kind, What::Deny, "deny"));
                }
            }
            Rule::Name { pat, scope } => {
                let applies = !s.system
                    && match scope {
                        Scope::UserBinds => true,
                        Scope::Homes => is_home_path(&s.path, home),
                    };
                if applies {
                    names.push(pat);
                }
            }
        }
    }
    if !names.is_empty() && s.kind == Kind::Dir {
        crate::protect::walk(&s.path, limit, &mut |rel, n, dir| {
            if names.iter().any(|p| glob_match(p.as_bytes(), n.as_bytes())) {
                let kind = if dir { Kind::Dir } else { Kind::File };
                ops.push(Op::new(
                    dst.join(rel).join(n),
                    kind,
                    What::Deny,
                    "deny pattern",
                ));
                return crate::protect::Step::Skip;
            }
            crate::protect::Step::Descend
        })?;
    }
    Ok(dedupe(ops))
}

/// Drops duplicates and ops below a denied directory.
pub fn dedupe(mut ops: Vec<Op>) -> Vec<Op> {
    ops.sort_by(|a, b| a.dst.cmp(&b.dst));
    ops.dedup_by(|a, b| a.dst == b.dst);
    let dirs: Vec<PathBuf> = ops
        .iter()
        .filter(|o| o.kind == Kind::Dir)
        .map(|o| o.dst.clone())
        .collect();
    ops.retain(|o| !dirs.iter().any(|d| o.dst.starts_with(d) && &o.dst != d));
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globbing() {
        assert!(glob_match(b".env.*", b".env.local"));
        assert!(!glob_match(b".env.*", b".env"));
        assert!(glob_match(b".env", b".env"));
        assert!(glob_match(b"*_key", b"ssh_host_rsa_key"));
        assert!(!glob_match(b"*_key", b"ssh_host_rsa_key.pub"));
        assert!(glob_match(b"credentials*", b"credentials.json"));
        assert!(glob_match(b"a?[0-9]", b"ab7"));
        assert!(!glob_match(b"a?[!0-9]", b"ab7"));
    }

    #[test]
    fn parsing_rules() {
        let h = Path::new("/home/u");
        let cwd = Path::new("/w");
        assert_eq!(
            parse_rule(OsStr::new("~/.ssh"), Some(h), cwd),
            Rule::Path {
                path: "/home/u/.ssh".into(),
                kind: Kind::File
            }
        );
        assert_eq!(
            parse_rule(OsStr::new(".env.*"), Some(h), cwd),
            Rule::Name {
                pat: ".env.*".into(),
                scope: Scope::UserBinds
            }
        );
        assert_eq!(
            parse_rule(OsStr::new("/etc/ssh/*_key"), Some(h), cwd),
            Rule::InDir {
                dir: "/etc/ssh".into(),
                pat: "*_key".into()
            }
        );
        assert_eq!(
            parse_rule(OsStr::new("sec/x"), Some(h), cwd),
            Rule::Path {
                path: "/w/sec/x".into(),
                kind: Kind::File
            }
        );
    }

    #[test]
    fn apply_to_a_bind() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join(".env"), "S=1").unwrap();
        std::fs::write(root.join("a/b/.env.prod"), "S=1").unwrap();
        std::fs::write(root.join("a/keep"), "").unwrap();
        std::os::unix::fs::symlink("/etc/shadow", root.join(".env.link")).unwrap();
        let s = crate::plan::open_source("--rw", &root, true, false).unwrap();
        let rules = vec![
            Rule::Name {
                pat: ".env".into(),
                scope: Scope::UserBinds,
            },
            Rule::Name {
                pat: ".env.*".into(),
                scope: Scope::UserBinds,
            },
            Rule::Path {
                path: root.join("missing"),
                kind: Kind::File,
            },
        ];
        let ops = apply(&rules, &s, Path::new("/w"), None);
        let dsts: Vec<_> = ops
            .iter()
            .map(|o| o.dst.to_str().unwrap().to_string())
            .collect();
        assert_eq!(dsts, ["/w/.env", "/w/a/b/.env.prod", "/w/missing"]);
        // Read-only: a missing path cannot be created, nothing to do.
        let mut s2 = crate::plan::open_source("--ro", &root, false, false).unwrap();
        s2.rw = false;
        let ops = apply(&rules, &s2, Path::new("/w"), None);
        assert_eq!(ops.len(), 2);
    }
}
