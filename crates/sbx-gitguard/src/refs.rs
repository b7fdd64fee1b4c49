//! Refs as files: loose refs under refs/, packed-refs, reflogs.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// A ref's value as read from disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Oid(String),
    Sym(String),
    /// Unparseable contents (shown as read).
    Invalid(String),
}

impl Value {
    pub fn parse(text: &str) -> Value {
        let t = text.trim_end_matches(['\n', '\r']);
        if let Some(s) = t.strip_prefix("ref:") {
            let s = s.trim();
            if valid_refname(s) || s == "HEAD" {
                return Value::Sym(s.to_string());
            }
        } else if is_hex_oid(t) {
            return Value::Oid(t.to_ascii_lowercase());
        }
        Value::Invalid(t.chars().take(80).collect())
    }

    /// The text stored in a snapshot: the oid, or `ref: NAME`.
    pub fn to_text(&self) -> String {
        match self {
            Value::Oid(o) => o.clone(),
            Value::Sym(s) => format!("ref: {s}"),
            Value::Invalid(s) => format!("invalid: {s}"),
        }
    }

    pub fn oid(&self) -> Option<&str> {
        match self {
            Value::Oid(o) => Some(o),
            _ => None,
        }
    }
}

pub fn is_hex_oid(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// git's refname rules, as far as they matter for safety: under refs/, no
/// `..`, no control characters or specials, no component starting with '.'
/// or ending in `.lock`.
pub fn valid_refname(s: &str) -> bool {
    s.starts_with("refs/")
        && !s.ends_with('/')
        && !s.ends_with('.')
        && !s.contains("..")
        && !s.contains("@{")
        && !s.contains("//")
        && s.bytes()
            .all(|b| b > 0x20 && b != 0x7f && !b"~^:?*[\\".contains(&b))
        && s.split('/')
            .all(|c| !c.is_empty() && !c.starts_with('.') && !c.ends_with(".lock"))
}

#[derive(Debug, thiserror::Error)]
pub enum RefsError {
    #[error("read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: unexpected line {line} in packed-refs")]
    Packed { path: PathBuf, line: usize },
    #[error(
        "{path}: line {line} ({name}) is out of order under a 'sorted' header (git would not see it)"
    )]
    Unsorted {
        path: PathBuf,
        line: usize,
        name: String,
    },
    #[error("{path}: unusable packed-refs: {reason}")]
    PackedFile { path: PathBuf, reason: String },
    #[error("{0}: locked by a concurrent git process (the .lock file exists)")]
    Locked(PathBuf),
}

/// Most bytes of packed-refs read (about 3 million refs).
pub const MAX_PACKED: u64 = 256 << 20;

impl RefsError {
    /// packed-refs git cannot use as it is: restored whole.
    pub fn is_packed_damage(&self) -> bool {
        matches!(
            self,
            RefsError::Packed { .. } | RefsError::Unsorted { .. } | RefsError::PackedFile { .. }
        )
    }
}

/// Every ref of a git dir: loose refs override packed ones.
pub fn read_all(git_dir: &Path) -> Result<BTreeMap<String, Value>, RefsError> {
    let mut out = read_packed(git_dir)?;
    let base = git_dir.join("refs");
    let mut stack = vec![base.clone()];
    while let Some(d) = stack.pop() {
        let rd = match fs::read_dir(&d) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(source) => return Err(RefsError::Io { path: d, source }),
        };
        for e in rd.filter_map(|e| e.ok()) {
            let p = e.path();
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                stack.push(p);
                continue;
            }
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".lock") {
                continue;
            }
            let rel = format!(
                "refs/{}",
                p.strip_prefix(&base).unwrap_or(&p).to_string_lossy()
            );
            // Never followed (a symlink to a file outside the repository is
            // not a ref), never waited on (a FIFO), bounded.
            let v = match crate::fsutil::read_bounded(&p, crate::fsutil::MAX_SMALL) {
                Ok(b) => Value::parse(&String::from_utf8_lossy(&b)),
                // Out of file descriptors or memory says nothing of the
                // ref: never recorded as its value (a snapshot with it
                // let the command's rewrite of the ref stand, helper-54).
                Err(e) if crate::fsutil::exhausted(&e) => {
                    return Err(RefsError::Io { path: p, source: e });
                }
                Err(e) => Value::Invalid(e.to_string()),
            };
            out.insert(rel, v);
        }
    }
    Ok(out)
}

/// Refs in packed-refs (peeled lines skipped).
pub fn read_packed(git_dir: &Path) -> Result<BTreeMap<String, Value>, RefsError> {
    let path = git_dir.join("packed-refs");
    let text = match crate::fsutil::read_bounded(&path, MAX_PACKED) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            return Err(RefsError::Io { path, source: e });
        }
        // A FIFO, a symlink, a directory, a file over the bound: git
        // cannot use it either.
        Err(e) => {
            return Err(RefsError::PackedFile {
                path,
                reason: e.to_string(),
            });
        }
    };
    let text = String::from_utf8_lossy(&text);
    let mut out = BTreeMap::new();
    let mut last_was_ref = false;
    let mut sorted = false;
    let mut prev: Option<String> = None;
    for (i, l) in text.lines().enumerate() {
        if l.starts_with('#') && i == 0 {
            // git trusts a "sorted" trait and bisects: an entry out of
            // order is then invisible to git (a hidden branch).
            sorted = l
                .strip_prefix("# pack-refs with:")
                .is_some_and(|t| t.split_whitespace().any(|w| w == "sorted"));
            continue;
        }
        if let Some(p) = l.strip_prefix('^') {
            if !last_was_ref || !is_hex_oid(p) {
                return Err(RefsError::Packed { path, line: i + 1 });
            }
            last_was_ref = false;
            continue;
        }
        match l.split_once(' ') {
            Some((oid, name)) if is_hex_oid(oid) && valid_refname(name) => {
                if sorted
                    && prev
                        .as_deref()
                        .is_some_and(|p| p.as_bytes() >= name.as_bytes())
                {
                    return Err(RefsError::Unsorted {
                        path,
                        line: i + 1,
                        name: name.to_string(),
                    });
                }
                prev = Some(name.to_string());
                out.insert(name.to_string(), Value::Oid(oid.to_ascii_lowercase()));
                last_was_ref = true;
            }
            _ => return Err(RefsError::Packed { path, line: i + 1 }),
        }
    }
    Ok(out)
}

/// Writes a loose ref the way git does: `NAME.lock` created exclusively,
/// then renamed over. Fails when the lock exists (a concurrent git).
pub fn write_loose(git_dir: &Path, name: &str, value: &Value) -> Result<(), RefsError> {
    let path = git_dir.join(name);
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| RefsError::Io { path: p, source }
    };
    if let Some(parent) = path.parent() {
        // A file where a directory of the ref's path must be (planted).
        let mut a = parent.to_path_buf();
        while a.starts_with(git_dir) && a != git_dir {
            if fs::symlink_metadata(&a).is_ok_and(|m| !m.is_dir()) {
                crate::fsutil::remove(&a).map_err(io(&a))?;
            }
            a.pop();
        }
        crate::fsutil::create_dirs_owned(parent, git_dir).map_err(io(parent))?;
    }
    if fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
        crate::fsutil::remove(&path).map_err(io(&path))?;
    }
    let lock = PathBuf::from(format!("{}.lock", path.display()));
    let mut f = match fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&lock)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Err(RefsError::Locked(lock)),
        Err(source) => return Err(RefsError::Io { path: lock, source }),
    };
    let text = format!("{}\n", value.to_text());
    let r = f.write_all(text.as_bytes()).and_then(|()| f.sync_all());
    if let Err(source) = r {
        let _ = fs::remove_file(&lock);
        return Err(RefsError::Io { path: lock, source });
    }
    if let Some((u, g)) = crate::fsutil::owner(git_dir)
        && nix::unistd::geteuid().as_raw() == 0
    {
        let _ = std::os::unix::fs::chown(&lock, Some(u), Some(g));
    }
    fs::rename(&lock, &path).map_err(io(&path))
}

/// Deletes a loose ref (an added ref that must go); a packed entry of the
/// same name is dropped by rewriting packed-refs.
pub fn delete(git_dir: &Path, name: &str) -> Result<(), RefsError> {
    let path = git_dir.join(name);
    match fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(source) => return Err(RefsError::Io { path, source }),
    }
    let pr = git_dir.join("packed-refs");
    if let Ok(Some(text)) = crate::fsutil::read_text(&pr, MAX_PACKED) {
        let mut out = String::new();
        let mut drop_peeled = false;
        let mut changed = false;
        for l in text.lines() {
            if l.starts_with('^') && drop_peeled {
                continue;
            }
            drop_peeled = false;
            if l.split_once(' ').is_some_and(|(_, n)| n == name) {
                drop_peeled = true;
                changed = true;
                continue;
            }
            out.push_str(l);
            out.push('\n');
        }
        if changed {
            let (mode, owner) = fs::metadata(&pr)
                .map(|m| {
                    use std::os::unix::fs::MetadataExt;
                    (m.mode() & 0o777, Some((m.uid(), m.gid())))
                })
                .unwrap_or((0o644, None));
            crate::fsutil::write_atomic(&pr, out.as_bytes(), mode, owner)
                .map_err(|source| RefsError::Io { path: pr, source })?;
        }
    }
    Ok(())
}

/// New values of a ref in its reflog, newest first.
pub fn reflog(git_dir: &Path, name: &str) -> Vec<String> {
    let Ok(Some(text)) = crate::fsutil::read_text(&git_dir.join("logs").join(name), 64 << 20)
    else {
        return Vec::new();
    };
    let mut v: Vec<String> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(1))
        .filter(|o| is_hex_oid(o) && !o.bytes().all(|b| b == b'0'))
        .map(str::to_string)
        .collect();
    v.reverse();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_and_names() {
        assert_eq!(
            Value::parse("ref: refs/heads/main\n"),
            Value::Sym("refs/heads/main".into())
        );
        assert!(matches!(
            Value::parse("ref: /etc/passwd\n"),
            Value::Invalid(_)
        ));
        assert!(matches!(
            Value::parse("ref: refs/../../x\n"),
            Value::Invalid(_)
        ));
        assert_eq!(Value::parse(&"a".repeat(40)), Value::Oid("a".repeat(40)));
        assert!(!valid_refname("refs/heads/x.lock"));
        assert!(!valid_refname("refs/heads/.x"));
        assert!(valid_refname("refs/heads/feature/x-1"));
    }
}
