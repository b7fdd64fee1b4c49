//! Permission rule syntax: `Kind` or `Kind(specifier)`, Claude Code's path
//! prefixes, and the shapes a path pattern can take.
//!
//! Paths (Read, Edit and the sandbox.filesystem lists):
//! - `//abs/path`: absolute;
//! - `~/path`: the home directory;
//! - `/path`: relative to the settings file (the directory that holds its
//!   `.claude` directory);
//! - `./path` or `path`: relative to the working directory (the project).
//!
//! Patterns follow gitignore: `*` and `?` stay within one component, `**`
//! spans any number; a pattern with no `/` (other than a trailing one)
//! matches a name at any depth. The shape of a pattern is decided from its
//! text alone: no file system walk.

use std::path::{Component, Path, PathBuf};

/// The tools whose rules name a file path to read.
pub const READ_KINDS: &[&str] = &["Read", "Glob", "Grep", "LS", "NotebookRead"];
/// The tools whose rules name a file path to write.
pub const EDIT_KINDS: &[&str] = &["Edit", "Write", "MultiEdit", "NotebookEdit"];
/// Rule kinds Claude Code knows that no kernel layer can see (they are
/// decisions inside the agent): listed by explain, never enforced by sbx.
pub const AGENT_KINDS: &[&str] = &[
    "Task",
    "Agent",
    "TodoWrite",
    "TodoRead",
    "Skill",
    "SlashCommand",
    "ExitPlanMode",
    "KillShell",
    "KillBash",
    "BashOutput",
];

/// A parsed rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub kind: String,
    pub spec: Option<String>,
}

/// Parses `Kind` or `Kind(spec)`; the error says what is wrong.
pub fn parse(text: &str) -> Result<Rule, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("empty rule".into());
    }
    let (kind, spec) = match t.find('(') {
        None => {
            if t.contains(')') {
                return Err("')' without '('".into());
            }
            (t, None)
        }
        Some(open) => {
            if !t.ends_with(')') {
                return Err("'(' without a closing ')' at the end".into());
            }
            let inner = &t[open + 1..t.len() - 1];
            if inner.trim().is_empty() {
                return Err("empty specifier '()'".into());
            }
            (&t[..open], Some(inner.to_string()))
        }
    };
    if !is_known(kind) {
        // A tool sbx does not know (ListMcpResourcesTool, tools Claude Code
        // adds later) is not enforced, with a warning: not an error. A
        // known tool in the wrong case is a typo that would drop a rule.
        if let Some(k) = known_kinds().find(|k| k.eq_ignore_ascii_case(kind)) {
            return Err(format!("unknown rule kind '{kind}' (did you mean '{k}'?)"));
        }
        let ident = kind.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && kind
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !ident {
            return Err(format!("unknown rule kind '{kind}' (not a tool name)"));
        }
    }
    if kind == "WebSearch" && spec.is_some() {
        return Err("WebSearch takes no specifier".into());
    }
    if kind == "WebFetch"
        && let Some(s) = &spec
    {
        let Some(d) = s.strip_prefix("domain:") else {
            return Err("WebFetch takes 'domain:NAME'".into());
        };
        check_domain(d)?;
    }
    Ok(Rule {
        kind: kind.to_string(),
        spec,
    })
}

fn known_kinds() -> impl Iterator<Item = &'static str> {
    READ_KINDS
        .iter()
        .chain(EDIT_KINDS)
        .chain(AGENT_KINDS)
        .chain(&["Bash", "WebFetch", "WebSearch"])
        .copied()
}

/// Whether sbx knows the tool a rule names (MCP tools are agent-side).
pub fn is_known(kind: &str) -> bool {
    known_kinds().any(|k| k == kind) || (kind.starts_with("mcp__") && kind.len() > 5)
}

/// A domain as Claude Code writes it: `name.tld` or `*.name.tld`.
pub fn check_domain(d: &str) -> Result<(), String> {
    let name = d.strip_prefix("*.").unwrap_or(d);
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if ok {
        Ok(())
    } else {
        Err(format!("'{d}' is not a domain name (NAME or *.NAME)"))
    }
}

/// What paths are resolved against.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub cwd: PathBuf,
    pub home: Option<PathBuf>,
}

/// The shape of a resolved path pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shape {
    /// One path.
    Exact(PathBuf),
    /// A directory and everything beneath it (`dir/**`, `dir/*`, `dir/`).
    Tree(PathBuf),
    /// Names matching a pattern directly in a directory (`dir/*.pem`).
    DirGlob(PathBuf, String),
    /// Names matching a pattern at any depth beneath a directory
    /// (`*.pem`, `**/.env`, `dir/**/id_*`).
    Name(PathBuf, String),
    /// A glob in a middle component (`src/*/gen/x`): only approximated.
    Deep(PathBuf, String),
}

pub fn has_glob(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// Resolves a path specifier to its shape.
pub fn resolve(spec: &str, base: &Path, ctx: &Ctx) -> Result<Shape, String> {
    let trailing = spec.ends_with('/') && spec.len() > 1;
    let (root, rest, anchored): (PathBuf, &str, bool) = if let Some(r) = spec.strip_prefix("//") {
        (PathBuf::from("/"), r, true)
    } else if spec == "~" || spec.starts_with("~/") {
        let Some(h) = &ctx.home else {
            return Err("'~/' does not resolve: no home directory (HOME is unset)".into());
        };
        (
            h.clone(),
            spec.trim_start_matches('~').trim_start_matches('/'),
            true,
        )
    } else if spec.starts_with('~') {
        return Err("'~user/' paths do not resolve: write '~/' or '//absolute'".into());
    } else if spec.starts_with('$') || spec.contains("${") {
        return Err("environment variables are not expanded in paths".into());
    } else if let Some(r) = spec.strip_prefix('/') {
        (base.to_path_buf(), r, true)
    } else if let Some(r) = spec.strip_prefix("./") {
        (ctx.cwd.clone(), r, true)
    } else {
        let body = spec.trim_end_matches('/');
        (ctx.cwd.clone(), spec, body.contains('/'))
    };
    if spec.contains('\0') {
        return Err("NUL byte in path".into());
    }
    let rest = rest.trim_end_matches('/');
    // Lexical normalisation; `..` may not climb above /.
    let mut comps: Vec<String> = Vec::new();
    for c in root.components() {
        if let Component::Normal(n) = c {
            comps.push(n.to_string_lossy().into_owned());
        }
    }
    for c in rest.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                if comps.pop().is_none() {
                    return Err("'..' climbs above /: the path does not resolve".into());
                }
            }
            n => comps.push(n.to_string()),
        }
    }
    let join = |cs: &[String]| -> PathBuf {
        let mut p = PathBuf::from("/");
        for c in cs {
            p.push(c);
        }
        p
    };
    let nroot = root
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .count();
    // A gitignore name pattern: no slash inside, relative.
    if !anchored {
        let name = comps.pop().unwrap_or_default();
        let dir = join(&comps);
        if name == "**" || name == "*" {
            return Ok(Shape::Tree(dir));
        }
        return Ok(Shape::Name(dir, name));
    }
    let first_glob = comps.iter().position(|c| has_glob(c));
    let Some(g) = first_glob else {
        let p = join(&comps);
        return Ok(if trailing {
            Shape::Tree(p)
        } else {
            Shape::Exact(p)
        });
    };
    if g < nroot {
        // A glob in the base itself (a cwd named `a*b`): take it literally.
        return Ok(Shape::Exact(join(&comps)));
    }
    let prefix = join(&comps[..g]);
    let last = comps.len() - 1;
    if g == last {
        let c = &comps[g];
        return Ok(if c == "**" || c == "*" {
            Shape::Tree(prefix)
        } else {
            Shape::DirGlob(prefix, c.clone())
        });
    }
    if comps[g] == "**" {
        let tail = &comps[g + 1..];
        if tail.iter().all(|c| c == "**") {
            return Ok(Shape::Tree(prefix));
        }
        if tail.len() == 1 || tail[1..].iter().all(|c| c == "**") {
            // `dir/**/name` (or `dir/**/name/**`: the name and its contents).
            return Ok(Shape::Name(prefix, tail[0].clone()));
        }
    }
    let rest: Vec<&str> = comps[g..].iter().map(String::as_str).collect();
    Ok(Shape::Deep(prefix, rest.join("/")))
}

/// gitignore-style match of one name against one component pattern
/// (`*`, `?`, `[...]`, `[!...]`).
pub fn glob_match(pat: &str, name: &str) -> bool {
    let p: Vec<char> = pat.chars().collect();
    let n: Vec<char> = name.chars().collect();
    fn go(p: &[char], n: &[char]) -> bool {
        match p.first() {
            None => n.is_empty(),
            Some('*') => (0..=n.len()).any(|k| go(&p[1..], &n[k..])),
            Some('?') => !n.is_empty() && go(&p[1..], &n[1..]),
            Some('[') => {
                let Some(close) = p.iter().skip(1).position(|&c| c == ']').map(|i| i + 1) else {
                    return n.first() == Some(&'[') && go(&p[1..], &n[1..]);
                };
                let Some(&c) = n.first() else { return false };
                let mut set = &p[1..close];
                let neg = matches!(set.first(), Some('!') | Some('^'));
                if neg {
                    set = &set[1..];
                }
                let mut hit = false;
                let mut i = 0;
                while i < set.len() {
                    if i + 2 < set.len() && set[i + 1] == '-' {
                        hit |= set[i] <= c && c <= set[i + 2];
                        i += 3;
                    } else {
                        hit |= set[i] == c;
                        i += 1;
                    }
                }
                hit != neg && go(&p[close + 1..], &n[1..])
            }
            Some(&c) => n.first() == Some(&c) && go(&p[1..], &n[1..]),
        }
    }
    go(&p, &n)
}

/// Whether a domain pattern (`x.y` or `*.x.y`) covers a name or a narrower
/// pattern. `*.x.y` covers subdomains of x.y, not x.y itself (Claude Code).
pub fn domain_covers(pat: &str, name: &str) -> bool {
    let pat = pat.to_ascii_lowercase();
    let name = name.to_ascii_lowercase();
    if pat == name {
        return true;
    }
    match pat.strip_prefix("*.") {
        Some(suffix) => {
            let n = name.strip_prefix("*.").unwrap_or(&name);
            n.ends_with(&format!(".{suffix}"))
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> Ctx {
        Ctx {
            cwd: "/proj".into(),
            home: Some("/home/u".into()),
        }
    }

    #[test]
    fn parsing() {
        assert_eq!(parse("Bash").unwrap().spec, None);
        assert_eq!(parse("Read(./x)").unwrap().spec.as_deref(), Some("./x"));
        assert!(parse("Read(").unwrap_err().contains("')'"));
        // An unknown tool parses (mapped to a NOT ENFORCED row with a
        // warning); a known one in the wrong case, or garbage, does not.
        assert_eq!(parse("Frobnicate(x)").unwrap().kind, "Frobnicate");
        assert!(parse("ListMcpResourcesTool").is_ok());
        assert!(!is_known("ListMcpResourcesTool"));
        assert!(
            parse("read(./x)")
                .unwrap_err()
                .contains("did you mean 'Read'")
        );
        assert!(parse("Re ad(./x)").unwrap_err().contains("not a tool name"));
        assert!(parse("WebFetch(http://x)").unwrap_err().contains("domain:"));
        assert!(parse("WebFetch(domain:*.ex-ample.com)").is_ok());
        assert!(parse("mcp__github__create_issue").is_ok());
        assert!(parse("Read()").is_err());
    }

    #[test]
    fn prefixes() {
        let c = ctx();
        let b = Path::new("/settings");
        assert_eq!(
            resolve("//etc/x", b, &c).unwrap(),
            Shape::Exact("/etc/x".into())
        );
        assert_eq!(
            resolve("~/.ssh/**", b, &c).unwrap(),
            Shape::Tree("/home/u/.ssh".into())
        );
        assert_eq!(
            resolve("/docs/**", b, &c).unwrap(),
            Shape::Tree("/settings/docs".into())
        );
        assert_eq!(
            resolve("./src/**", b, &c).unwrap(),
            Shape::Tree("/proj/src".into())
        );
        assert_eq!(
            resolve("src/x.rs", b, &c).unwrap(),
            Shape::Exact("/proj/src/x.rs".into())
        );
        assert_eq!(
            resolve(".env", b, &c).unwrap(),
            Shape::Name("/proj".into(), ".env".into())
        );
        assert_eq!(
            resolve("*.pem", b, &c).unwrap(),
            Shape::Name("/proj".into(), "*.pem".into())
        );
        assert_eq!(
            resolve("**/.env", b, &c).unwrap(),
            Shape::Name("/proj".into(), ".env".into())
        );
        assert_eq!(
            resolve("//etc/ssh/*_key", b, &c).unwrap(),
            Shape::DirGlob("/etc/ssh".into(), "*_key".into())
        );
        assert!(matches!(
            resolve("./a/*/b/c", b, &c).unwrap(),
            Shape::Deep(..)
        ));
        assert!(resolve("~bob/x", b, &c).is_err());
        assert!(resolve("//../..", b, &c).is_err());
        assert!(resolve("$HOME/x", b, &c).is_err());
        let nohome = Ctx { home: None, ..c };
        assert!(resolve("~/x", b, &nohome).is_err());
    }

    #[test]
    fn globs_and_domains() {
        assert!(glob_match("*.pem", "a.pem"));
        assert!(!glob_match("*.pem", "a.pem.bak"));
        assert!(glob_match("id_[rd]sa", "id_rsa"));
        assert!(glob_match("?x", "ax"));
        assert!(domain_covers("*.example.com", "api.example.com"));
        assert!(!domain_covers("*.example.com", "example.com"));
        assert!(domain_covers("*.example.com", "*.a.example.com"));
        assert!(domain_covers("Example.com", "example.com"));
    }
}
