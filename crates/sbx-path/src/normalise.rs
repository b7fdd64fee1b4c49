//! The lexical normaliser: pure byte manipulation, no file system access.
//!
//! A path is normalised by collapsing repeated slashes, dropping `.`
//! components and a trailing slash. A `..` component is never resolved
//! lexically (that would be wrong across symlinks and is exactly the
//! traversal this crate exists to refuse): a path that contains one is an
//! error, whatever it would have resolved to.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// Why a path could not be normalised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NormaliseError {
    /// The path is empty.
    Empty,
    /// The path contains a NUL byte (no system call can take it).
    Nul,
    /// The path has a `..` component.
    Traversal,
    /// The path is relative and no base directory was given.
    Relative,
}

impl NormaliseError {
    /// Stable, audit-friendly name of the error.
    pub fn kind(&self) -> &'static str {
        match self {
            NormaliseError::Empty => "empty",
            NormaliseError::Nul => "nul_byte",
            NormaliseError::Traversal => "traversal",
            NormaliseError::Relative => "relative",
        }
    }
}

impl fmt::Display for NormaliseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NormaliseError::Empty => "empty path",
            NormaliseError::Nul => "path contains a NUL byte",
            NormaliseError::Traversal => "path contains a '..' component",
            NormaliseError::Relative => "path is relative and no base directory is set",
        })
    }
}

impl std::error::Error for NormaliseError {}

/// The components of `path` (split on `/`, empty and `.` components dropped).
/// Does not check for `..`.
pub fn components(path: &[u8]) -> impl Iterator<Item = &[u8]> {
    path.split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
}

/// Whether `path` has a `..` component.
pub fn has_dotdot(path: &[u8]) -> bool {
    path.split(|&b| b == b'/').any(|c| c == b"..")
}

/// Normalises `path` (bytes): absolute result, no `//`, no `.`, no trailing
/// slash (except the root itself, `/`). A relative path is joined to `base`
/// first (which must itself be absolute; it is normalised too); without a
/// base it is an error. Any `..` component, in the path or in the base, is an
/// error. Idempotent: `normalise(normalise(p)) == normalise(p)`.
pub fn normalise_bytes(path: &[u8], base: Option<&[u8]>) -> Result<Vec<u8>, NormaliseError> {
    if path.is_empty() {
        return Err(NormaliseError::Empty);
    }
    if path.contains(&0) {
        return Err(NormaliseError::Nul);
    }
    if has_dotdot(path) {
        return Err(NormaliseError::Traversal);
    }
    let mut out = Vec::with_capacity(path.len() + base.map_or(0, <[u8]>::len) + 1);
    if path[0] != b'/' {
        let Some(base) = base else {
            return Err(NormaliseError::Relative);
        };
        if base.first() != Some(&b'/') {
            return Err(NormaliseError::Relative);
        }
        if base.contains(&0) {
            return Err(NormaliseError::Nul);
        }
        if has_dotdot(base) {
            return Err(NormaliseError::Traversal);
        }
        push_components(&mut out, base);
    }
    push_components(&mut out, path);
    if out.is_empty() {
        out.push(b'/');
    }
    Ok(out)
}

fn push_components(out: &mut Vec<u8>, path: &[u8]) {
    for c in components(path) {
        out.push(b'/');
        out.extend_from_slice(c);
    }
}

/// [`normalise_bytes`] over paths.
pub fn normalise(path: &Path, base: Option<&Path>) -> Result<PathBuf, NormaliseError> {
    normalise_bytes(
        path.as_os_str().as_bytes(),
        base.map(|b| b.as_os_str().as_bytes()),
    )
    .map(|v| PathBuf::from(OsString::from_vec(v)))
}

/// Whether the normalised path `path` is `rule` or lies beneath it, compared
/// component-wise: `/a/bc` is not beneath `/a/b`; everything is beneath `/`.
pub fn is_beneath(path: &[u8], rule: &[u8]) -> bool {
    if rule == b"/" {
        return path.first() == Some(&b'/');
    }
    path == rule || (path.starts_with(rule) && path.get(rule.len()) == Some(&b'/'))
}

/// The components of `path` after the prefix `rule` (which it must be
/// beneath, see [`is_beneath`]).
pub fn rest_after<'a>(path: &'a [u8], rule: &[u8]) -> impl Iterator<Item = &'a [u8]> {
    let rest = if rule == b"/" {
        path
    } else {
        &path[rule.len().min(path.len())..]
    };
    components(rest)
}

/// Number of leading components two normalised paths share.
pub fn common_components(a: &[u8], b: &[u8]) -> usize {
    components(a)
        .zip(components(b))
        .take_while(|(x, y)| x == y)
        .count()
}

pub(crate) fn os(b: &[u8]) -> &OsStr {
    OsStr::from_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(p: &str) -> Result<String, NormaliseError> {
        normalise_bytes(p.as_bytes(), None).map(|v| String::from_utf8(v).unwrap())
    }

    #[test]
    fn examples() {
        assert_eq!(n("/").unwrap(), "/");
        assert_eq!(n("//").unwrap(), "/");
        assert_eq!(n("/./.").unwrap(), "/");
        assert_eq!(n("/a//b/./c/").unwrap(), "/a/b/c");
        assert_eq!(n("/a/.../b").unwrap(), "/a/.../b");
        assert_eq!(n("/a/..b/c..").unwrap(), "/a/..b/c..");
        assert_eq!(n("/a/../b"), Err(NormaliseError::Traversal));
        assert_eq!(n("/a/.."), Err(NormaliseError::Traversal));
        assert_eq!(n("../etc/passwd"), Err(NormaliseError::Traversal));
        assert_eq!(n("a/b"), Err(NormaliseError::Relative));
        assert_eq!(n(""), Err(NormaliseError::Empty));
        assert_eq!(n("/a\0b"), Err(NormaliseError::Nul));
    }

    #[test]
    fn base() {
        let b = Some(&b"/work//x/"[..]);
        assert_eq!(normalise_bytes(b"y/./z", b).unwrap(), b"/work/x/y/z");
        assert_eq!(normalise_bytes(b".", b).unwrap(), b"/work/x");
        assert_eq!(normalise_bytes(b"/abs", b).unwrap(), b"/abs");
        assert_eq!(normalise_bytes(b"../y", b), Err(NormaliseError::Traversal));
        assert_eq!(
            normalise_bytes(b"y", Some(b"rel")),
            Err(NormaliseError::Relative)
        );
        assert_eq!(
            normalise_bytes(b"y", Some(b"/a/../b")),
            Err(NormaliseError::Traversal)
        );
    }

    #[test]
    fn beneath() {
        assert!(is_beneath(b"/a/b", b"/a/b"));
        assert!(is_beneath(b"/a/b/c", b"/a/b"));
        assert!(!is_beneath(b"/a/bc", b"/a/b"));
        assert!(!is_beneath(b"/a", b"/a/b"));
        assert!(is_beneath(b"/x", b"/"));
        assert!(is_beneath(b"/", b"/"));
        assert_eq!(
            rest_after(b"/a/b/c/d", b"/a/b").collect::<Vec<_>>(),
            vec![&b"c"[..], b"d"]
        );
        assert_eq!(rest_after(b"/a/b", b"/a/b").count(), 0);
        assert_eq!(rest_after(b"/a", b"/").collect::<Vec<_>>(), vec![&b"a"[..]]);
        assert_eq!(common_components(b"/a/b/c", b"/a/b/d"), 2);
        assert_eq!(common_components(b"/a/bc", b"/a/b"), 1);
    }
}
