//! `--rw SRC[:DST]` / `--ro SRC[:DST]` volume mounts, with the deny list and the
//! write-protected invariants of sbx-fs translated into engine mounts.
//!
//! The rules come from the sbx-fs library itself ([`sbx_fs::deny::defaults`],
//! [`sbx_fs::deny::apply`], [`sbx_fs::plan::invariants`]), so both tiers hide
//! and protect the same paths. A rule becomes, in the container:
//! - a hidden file: an empty host file of mode 000 bound read-only over it
//!   (see [`crate::hide`]);
//! - a hidden directory: an empty read-only tmpfs (mode 000) over it;
//! - a write-protected entry (`.git/HEAD`, `.git/hooks`, `.claude`, ...): the
//!   same host path bound again, read-only, over the writable bind.
//!
//! sbx-fs also places empty placeholders where a protected entry does not
//! exist yet, so it cannot be created. An engine would create such a mount
//! point in the host directory itself (runc makes missing mount points
//! through the bind), so sbx-container leaves missing entries alone: see
//! LIMITATIONS in the man page.

use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use sbx_fs::plan::{Kind, Op, Source, What};

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("{flag} {raw}: expected SRC[:DST] with an absolute DST")]
    Syntax { flag: &'static str, raw: String },
    #[error("{flag} {path}: mount source does not exist or cannot be opened ({source})")]
    Missing {
        flag: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{flag} {path}: only directories and regular files can be mounted")]
    Type { flag: &'static str, path: PathBuf },
    #[error("--rw {path}: inside {protected}, which is always kept read-only")]
    RwProtected { path: PathBuf, protected: String },
    #[error(
        "{flag} {dst}: the destination must be absolute, without '..', and not the root or a system path"
    )]
    BadDst { flag: &'static str, dst: PathBuf },
}

/// One engine mount, in the order the engine must apply it (parents first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mount {
    Bind {
        src: PathBuf,
        dst: PathBuf,
        ro: bool,
    },
    /// An empty read-only tmpfs (hides a directory).
    HideDir { dst: PathBuf },
    /// An empty mode-000 file over a file (hides its content).
    HideFile { dst: PathBuf },
}

impl Mount {
    pub fn dst(&self) -> &Path {
        match self {
            Mount::Bind { dst, .. } | Mount::HideDir { dst } | Mount::HideFile { dst } => dst,
        }
    }
}

/// What a user's binds become, with what was hidden or protected (for the
/// audit log).
#[derive(Debug, Default)]
pub struct Plan {
    pub mounts: Vec<Mount>,
    pub hidden: Vec<PathBuf>,
    pub protected: Vec<PathBuf>,
}

/// `SRC[:DST]`, as sbx-fs reads it: the last `:` followed by `/` separates
/// a destination; without one the destination is SRC's absolute path.
fn split(flag: &'static str, raw: &OsStr) -> Result<(PathBuf, PathBuf), MountError> {
    let b = raw.as_bytes();
    let bad = || MountError::Syntax {
        flag,
        raw: raw.to_string_lossy().into_owned(),
    };
    let at = b
        .iter()
        .rposition(|c| *c == b':')
        .filter(|&i| b.get(i + 1) == Some(&b'/'));
    let (src, dst) = match at {
        Some(i) => (&b[..i], Some(&b[i + 1..])),
        None => (b, None),
    };
    if src.is_empty() {
        return Err(bad());
    }
    let src = PathBuf::from(OsStr::from_bytes(src));
    let dst = match dst {
        Some(d) => PathBuf::from(OsStr::from_bytes(d)),
        None => std::path::absolute(&src).map_err(|_| bad())?,
    };
    Ok((src, dst))
}

fn check_dst(flag: &'static str, dst: &Path) -> Result<PathBuf, MountError> {
    let bad = || MountError::BadDst {
        flag,
        dst: dst.to_path_buf(),
    };
    let mut out = PathBuf::from("/");
    for c in dst.components() {
        match c {
            std::path::Component::RootDir | std::path::Component::CurDir => {}
            std::path::Component::Normal(n) => out.push(n),
            _ => return Err(bad()),
        }
    }
    // The image's own tree stays the image's: a bind may not replace the
    // root, its tools, /proc, /dev or /sys.
    let reserved = ["/", "/proc", "/dev", "/sys", "/bin", "/sbx", "/etc"];
    if reserved.iter().any(|r| out == Path::new(r))
        || out.starts_with("/proc")
        || out.starts_with("/sys")
        || out.starts_with("/dev")
    {
        return Err(bad());
    }
    Ok(out)
}

fn open_source(flag: &'static str, path: &Path, rw: bool) -> Result<Source, MountError> {
    let canon = std::fs::canonicalize(path).map_err(|source| MountError::Missing {
        flag,
        path: path.to_path_buf(),
        source,
    })?;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags_path()
        .open(&canon)
        .map_err(|source| MountError::Missing {
            flag,
            path: path.to_path_buf(),
            source,
        })?;
    let md = f.metadata().map_err(|source| MountError::Missing {
        flag,
        path: path.to_path_buf(),
        source,
    })?;
    let kind = if md.is_dir() {
        Kind::Dir
    } else if md.is_file() {
        Kind::File
    } else {
        return Err(MountError::Type {
            flag,
            path: path.to_path_buf(),
        });
    };
    use std::os::unix::fs::MetadataExt;
    Ok(Source {
        fd: OwnedFd::from(f),
        path: canon,
        kind,
        dev: md.dev(),
        ino: md.ino(),
        rw,
        system: false,
    })
}

trait PathOpen {
    fn custom_flags_path(&mut self) -> &mut Self;
}
impl PathOpen for std::fs::OpenOptions {
    fn custom_flags_path(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_PATH | libc::O_CLOEXEC)
    }
}

/// Builds the mount plan for the binds given (in order: `--ro`, then
/// `--rw`, each in command-line order). Checks every source on the host
/// before anything is created on the engine.
pub fn plan(
    ro: &[std::ffi::OsString],
    rw: &[std::ffi::OsString],
    deny: bool,
) -> Result<Plan, MountError> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let rules = if deny {
        sbx_fs::deny::defaults(home.as_deref())
    } else {
        Vec::new()
    };
    let mut out = Plan::default();
    let mut extra: Vec<Mount> = Vec::new();
    for (flag, list, writable) in [("--ro", ro, false), ("--rw", rw, true)] {
        for raw in list {
            let (src, dst) = split(flag, raw)?;
            let dst = check_dst(flag, &dst)?;
            let s = open_source(flag, &src, writable)?;
            if writable && let Some(p) = sbx_fs::plan::rw_inside_invariant(&s.path) {
                return Err(MountError::RwProtected {
                    path: s.path.clone(),
                    protected: p,
                });
            }
            out.mounts.push(Mount::Bind {
                src: s.path.clone(),
                dst: dst.clone(),
                ro: !writable,
            });
            let mut ops: Vec<Op> = sbx_fs::deny::apply(&rules, &s, &dst, home.as_deref());
            if writable {
                ops.extend(sbx_fs::plan::invariants(&s, &dst, None));
            }
            for op in ops {
                let host = match op.dst.strip_prefix(&dst) {
                    Ok(rel) if rel.as_os_str().is_empty() => s.path.clone(),
                    Ok(rel) => s.path.join(rel),
                    Err(_) => continue,
                };
                let exists =
                    std::fs::symlink_metadata(&host).is_ok_and(|m| !m.file_type().is_symlink());
                match op.what {
                    What::Deny if exists => {
                        out.hidden.push(op.dst.clone());
                        extra.push(match op.kind {
                            Kind::Dir => Mount::HideDir { dst: op.dst },
                            Kind::File => Mount::HideFile { dst: op.dst },
                        });
                    }
                    What::ReadOnly if exists => {
                        out.protected.push(op.dst.clone());
                        extra.push(Mount::Bind {
                            src: host,
                            dst: op.dst,
                            ro: true,
                        });
                    }
                    // Placeholders for missing entries: see the module doc.
                    _ => {}
                }
            }
        }
    }
    // Parents before children; a hide after a protect of the same path wins.
    out.mounts.extend(extra);
    out.mounts.sort_by_key(|m| m.dst().components().count());
    dedupe(&mut out.mounts);
    Ok(out)
}

/// Keeps the last mount for each destination, in order (hides come after
/// protects, so a hidden path stays hidden).
fn dedupe(v: &mut Vec<Mount>) {
    let mut seen = std::collections::HashSet::new();
    let mut keep = vec![false; v.len()];
    for (i, m) in v.iter().enumerate().rev() {
        if seen.insert(m.dst().to_path_buf()) {
            keep[i] = true;
        }
    }
    let mut i = 0;
    v.retain(|_| {
        i += 1;
        keep[i - 1]
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syntax() {
        // SRC[:DST] as in sbx-fs: without a destination, the same path.
        assert_eq!(
            split("--ro", OsStr::new("/a")).unwrap(),
            (PathBuf::from("/a"), PathBuf::from("/a"))
        );
        assert_eq!(
            split("--ro", OsStr::new("/a:rel")).unwrap(),
            (PathBuf::from("/a:rel"), PathBuf::from("/a:rel"))
        );
        let (src, dst) = split("--rw", OsStr::new("rel")).unwrap();
        assert_eq!(src, PathBuf::from("rel"));
        assert!(dst.is_absolute() && dst.ends_with("rel"), "{dst:?}");
        assert!(split("--ro", OsStr::new("")).is_err());
        assert!(split("--ro", OsStr::new(":/x")).is_err());
        assert_eq!(
            split("--ro", OsStr::new("/a:b:/c")).unwrap(),
            (PathBuf::from("/a:b"), PathBuf::from("/c"))
        );
        assert!(check_dst("--ro", Path::new("/a/../etc")).is_err());
        assert!(check_dst("--ro", Path::new("/")).is_err());
        assert!(check_dst("--ro", Path::new("/proc/x")).is_err());
        assert_eq!(
            check_dst("--ro", Path::new("/w/./x")).unwrap(),
            PathBuf::from("/w/x")
        );
    }

    #[test]
    fn env_hidden_git_protected() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(".env"), "SECRET=1").unwrap();
        std::fs::create_dir_all(d.path().join(".git/hooks")).unwrap();
        std::fs::write(d.path().join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
        std::fs::create_dir_all(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("sub/.env.local"), "X=1").unwrap();
        let arg = format!("{}:/w", d.path().display());
        let p = plan(&[], &[arg.into()], true).unwrap();
        assert!(
            p.mounts.contains(&Mount::HideFile {
                dst: "/w/.env".into()
            }),
            "{p:?}"
        );
        assert!(
            p.mounts.contains(&Mount::HideFile {
                dst: "/w/sub/.env.local".into()
            }),
            "{p:?}"
        );
        let canon = std::fs::canonicalize(d.path()).unwrap();
        assert!(
            p.mounts.contains(&Mount::Bind {
                src: canon.join(".git/HEAD"),
                dst: "/w/.git/HEAD".into(),
                ro: true
            }),
            "{p:?}"
        );
        assert!(
            p.mounts
                .iter()
                .any(|m| m.dst() == Path::new("/w/.git/hooks"))
        );
        // The bind itself comes first.
        assert_eq!(p.mounts[0].dst(), Path::new("/w"));
    }

    #[test]
    fn rw_inside_git_refused() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join(".git/hooks")).unwrap();
        let arg = format!("{}/.git/hooks:/h", d.path().display());
        assert!(matches!(
            plan(&[], &[arg.into()], true),
            Err(MountError::RwProtected { .. })
        ));
    }

    #[test]
    fn missing_source() {
        let e = plan(&["/nonexistent/sbx-x:/x".into()], &[], true).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/sbx-x"), "{e}");
    }
}
