//! The allowlist: (path, mode) rules and the longest-prefix lookup. Pure:
//! no file system access (the resolver opens what a rule allows).

use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::normalise::{common_components, is_beneath};

/// What an operation needs: `Write` implies `Read`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mode {
    Read,
    Write,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Read => "read",
            Mode::Write => "write",
        }
    }

    /// Whether a rule with mode `self` allows an operation needing `need`.
    pub fn allows(self, need: Mode) -> bool {
        self >= need
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `read`/`r`/`ro` or `write`/`w`/`rw`.
impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "read" | "r" | "ro" => Ok(Mode::Read),
            "write" | "w" | "rw" => Ok(Mode::Write),
            _ => Err(format!("mode '{s}' is not one of read, write")),
        }
    }
}

/// One allowlist entry: a normalised absolute path and what it allows there
/// and beneath.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub path: PathBuf,
    pub mode: Mode,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.path.display(), self.mode)
    }
}

/// Why the allowlist refused a path (before any file system access).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No rule covers the path; the rule sharing the most leading components
    /// with it, if any, to help whoever reads the error.
    NotAllowed { nearest: Option<Rule> },
    /// The governing rule allows reading only.
    ReadOnly { rule: Rule },
}

/// A set of rules. The governing rule of a path is the rule with the longest
/// path that the path is beneath (component-wise), so a narrower rule
/// overrides a wider one in both directions (`/a` write with `/a/b` read
/// leaves `/a/b` read-only). The same path given twice keeps the stronger
/// mode.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    rules: Vec<Rule>,
}

impl Allowlist {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a rule; `path` must already be normalised and absolute. Returns
    /// the index of the rule (an existing one when the path repeats).
    pub fn add(&mut self, path: PathBuf, mode: Mode) -> usize {
        if let Some(i) = self.rules.iter().position(|r| r.path == path) {
            self.rules[i].mode = self.rules[i].mode.max(mode);
            return i;
        }
        self.rules.push(Rule { path, mode });
        self.rules.len() - 1
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Index of the governing rule of a normalised path.
    pub fn governing(&self, path: &Path) -> Option<usize> {
        let p = path.as_os_str().as_bytes();
        self.rules
            .iter()
            .enumerate()
            .filter(|(_, r)| is_beneath(p, r.path.as_os_str().as_bytes()))
            .max_by_key(|(_, r)| r.path.as_os_str().len())
            .map(|(i, _)| i)
    }

    /// The rule that shares the most leading components with `path` (ties:
    /// the first given).
    pub fn nearest(&self, path: &Path) -> Option<&Rule> {
        let p = path.as_os_str().as_bytes();
        let mut best: Option<(usize, &Rule)> = None;
        for r in &self.rules {
            let n = common_components(p, r.path.as_os_str().as_bytes());
            if best.is_none_or(|(b, _)| n > b) {
                best = Some((n, r));
            }
        }
        best.map(|(_, r)| r)
    }

    /// The index of the rule that allows `mode` on the normalised `path`.
    pub fn check(&self, path: &Path, mode: Mode) -> Result<usize, Refusal> {
        let Some(i) = self.governing(path) else {
            return Err(Refusal::NotAllowed {
                nearest: self.nearest(path).cloned(),
            });
        };
        let rule = &self.rules[i];
        if rule.mode.allows(mode) {
            Ok(i)
        } else {
            Err(Refusal::ReadOnly { rule: rule.clone() })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(rules: &[(&str, Mode)]) -> Allowlist {
        let mut a = Allowlist::new();
        for (p, m) in rules {
            a.add(PathBuf::from(p), *m);
        }
        a
    }

    #[test]
    fn longest_prefix_component_wise() {
        let a = list(&[
            ("/a", Mode::Write),
            ("/a/b", Mode::Read),
            ("/x/y", Mode::Read),
        ]);
        assert_eq!(a.check(Path::new("/a/c"), Mode::Write), Ok(0));
        assert_eq!(a.check(Path::new("/a/bc"), Mode::Write), Ok(0));
        assert_eq!(a.check(Path::new("/a/b/c"), Mode::Read), Ok(1));
        assert_eq!(
            a.check(Path::new("/a/b/c"), Mode::Write),
            Err(Refusal::ReadOnly {
                rule: Rule {
                    path: "/a/b".into(),
                    mode: Mode::Read
                }
            })
        );
        match a.check(Path::new("/x/yz"), Mode::Read) {
            Err(Refusal::NotAllowed { nearest: Some(r) }) => assert_eq!(r.path, Path::new("/x/y")),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            list(&[]).check(Path::new("/a"), Mode::Read),
            Err(Refusal::NotAllowed { nearest: None })
        );
    }

    #[test]
    fn duplicates_keep_stronger_mode() {
        let a = list(&[("/a", Mode::Write), ("/a", Mode::Read)]);
        assert_eq!(a.rules().len(), 1);
        assert_eq!(a.rules()[0].mode, Mode::Write);
    }

    #[test]
    fn modes() {
        assert!(Mode::Write.allows(Mode::Read));
        assert!(!Mode::Read.allows(Mode::Write));
        assert_eq!("rw".parse::<Mode>(), Ok(Mode::Write));
        assert!("x".parse::<Mode>().is_err());
    }
}
