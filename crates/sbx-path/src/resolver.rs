//! `PathResolver`: the allowlist plus one pinned fd per rule, and
//! `validate`, which checks a path against the rules and opens it beneath the
//! governing rule's fd without following any symlink. The caller then works
//! on the returned fd, never on the path again: there is no window between
//! the check and the use.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use crate::error::PathError;
use crate::normalise::{self, NormaliseError, components, os, rest_after};
use crate::rules::{Allowlist, Mode, Refusal, Rule};
use crate::sys::{self, OpenFail, Resolution};

/// What kind of fd `validate_with` hands back for an existing path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// A data fd: `O_RDONLY` for a read, `O_WRONLY` for a write of a file,
    /// `O_RDONLY | O_DIRECTORY` for a directory in either mode.
    Data,
    /// An `O_PATH` fd (no read or write on the file itself; for `fstat`,
    /// `*at` calls, `fchdir`).
    Path,
}

/// Where a rule is pinned: an `O_PATH` fd of the rule's directory, or, when
/// the rule names a file or a path that does not exist yet, of its parent
/// directory plus the rule's last component.
#[derive(Debug)]
struct Anchor {
    fd: OwnedFd,
    path: Vec<u8>,
    prefix: Option<Vec<u8>>,
}

/// Builds a [`PathResolver`].
#[derive(Debug, Clone)]
pub struct Builder {
    rules: Vec<(PathBuf, Mode)>,
    base: Option<PathBuf>,
    how: Resolution,
}

impl Builder {
    /// Allows `mode` on `path` and everything beneath it.
    pub fn allow(mut self, path: impl AsRef<Path>, mode: Mode) -> Self {
        self.rules.push((path.as_ref().to_path_buf(), mode));
        self
    }

    pub fn allow_read(self, path: impl AsRef<Path>) -> Self {
        self.allow(path, Mode::Read)
    }

    pub fn allow_write(self, path: impl AsRef<Path>) -> Self {
        self.allow(path, Mode::Write)
    }

    /// Relative paths (given to `validate`, and rule paths) are taken
    /// relative to `dir` (an absolute path). Without a base, relative paths
    /// are refused.
    pub fn base(mut self, dir: impl AsRef<Path>) -> Self {
        self.base = Some(dir.as_ref().to_path_buf());
        self
    }

    /// How paths are resolved (default: `openat2`, the walk where the kernel
    /// lacks it). Tests use this seam to run everything over both.
    pub fn resolution(mut self, how: Resolution) -> Self {
        self.how = how;
        self
    }

    /// Normalises the rules and opens each rule's root once, from `/`,
    /// without following any symlink.
    pub fn build(self) -> Result<PathResolver, PathError> {
        let base = match &self.base {
            None => None,
            Some(b) => {
                if !b.is_absolute() {
                    return Err(PathError::BadBase {
                        path: b.clone(),
                        reason: "must be an absolute path".into(),
                    });
                }
                Some(
                    normalise::normalise(b, None).map_err(|e| PathError::BadBase {
                        path: b.clone(),
                        reason: e.to_string(),
                    })?,
                )
            }
        };
        let how = self.how.decide();
        if self.how == Resolution::Openat2 && !sys::openat2_supported() {
            return Err(PathError::Io {
                path: "/".into(),
                op: "openat2",
                source: std::io::Error::from_raw_os_error(libc::ENOSYS),
            });
        }
        let mut list = Allowlist::new();
        for (p, m) in &self.rules {
            let n = normalise::normalise(p, base.as_deref()).map_err(|e| PathError::BadRule {
                path: p.clone(),
                mode: *m,
                reason: e.to_string(),
            })?;
            list.add(n, *m);
        }
        let root = sys::openat(libc::AT_FDCWD, b"/", libc::O_PATH | libc::O_DIRECTORY, 0).map_err(
            |e| PathError::Io {
                path: "/".into(),
                op: "open",
                source: std::io::Error::from_raw_os_error(e),
            },
        )?;
        let mut anchors = Vec::with_capacity(list.rules().len());
        for r in list.rules() {
            anchors.push(anchor(how, root.as_fd(), r)?);
        }
        Ok(PathResolver {
            list,
            anchors,
            base,
            how,
        })
    }
}

fn anchor(how: Resolution, root: BorrowedFd<'_>, rule: &Rule) -> Result<Anchor, PathError> {
    let rp = rule.path.as_os_str().as_bytes();
    let comps: Vec<&[u8]> = components(rp).collect();
    let bad = |reason: String| PathError::BadRule {
        path: rule.path.clone(),
        mode: rule.mode,
        reason,
    };
    let comp_path = |at: Option<usize>| match at {
        Some(i) => join_path(b"/", &comps[..=i]),
        None => rule.path.clone(),
    };
    // A directory is pinned itself; a file, or a name that does not exist
    // yet, through its parent.
    match sys::open_beneath(how, root, &comps, libc::O_PATH, 0) {
        Ok(fd) => {
            let st = sys::fstat(fd.as_fd()).map_err(|e| bad(e.to_string()))?;
            if sys::is_dir(&st) {
                return Ok(Anchor {
                    fd,
                    path: rp.to_vec(),
                    prefix: None,
                });
            }
        }
        Err(f) if f.symlink || f.errno == libc::ELOOP => {
            return Err(bad(format!(
                "{} is a symlink: name the real path (symlinks are never followed)",
                comp_path(f.at).display()
            )));
        }
        Err(f) if f.errno == libc::ENOENT && f.at == Some(comps.len().saturating_sub(1)) => {}
        Err(f) => {
            return Err(bad(format!("{}: {}", comp_path(f.at).display(), f.io())));
        }
    }
    let (last, dirs) = comps.split_last().expect("/ is a directory");
    let fd =
        sys::open_beneath(how, root, dirs, libc::O_PATH | libc::O_DIRECTORY, 0).map_err(|f| {
            if f.symlink || f.errno == libc::ELOOP {
                bad(format!(
                    "{} is a symlink: name the real path (symlinks are never followed)",
                    comp_path(f.at).display()
                ))
            } else {
                bad(format!("parent {}: {}", comp_path(f.at).display(), f.io()))
            }
        })?;
    Ok(Anchor {
        fd,
        path: join_path(b"/", dirs).into_os_string().into_vec(),
        prefix: Some(last.to_vec()),
    })
}

fn join_path(base: &[u8], comps: &[&[u8]]) -> PathBuf {
    let mut v = base.to_vec();
    for c in comps {
        if v.last() != Some(&b'/') {
            v.push(b'/');
        }
        v.extend_from_slice(c);
    }
    PathBuf::from(os(&v))
}

/// The allowlist and one pinned fd per rule. Immutable once built; `Send`
/// and `Sync`, so one resolver can serve every thread of an agent.
#[derive(Debug)]
pub struct PathResolver {
    list: Allowlist,
    anchors: Vec<Anchor>,
    base: Option<PathBuf>,
    how: Resolution,
}

/// The target of a validated path.
#[derive(Debug)]
pub enum Target {
    /// The path exists: its fd.
    Existing(OwnedFd),
    /// A write of a name that does not exist yet: the parent directory
    /// (`O_PATH`, opened beneath the rule) and the name, for
    /// [`Validated::create`] / [`Validated::mkdir`].
    Missing { parent: OwnedFd, name: Vec<u8> },
}

/// A path the rules allow, already opened.
#[derive(Debug)]
pub struct Validated {
    path: PathBuf,
    mode: Mode,
    rule: Rule,
    target: Target,
    how: Resolution,
    dir_hint: bool,
}

impl PathResolver {
    pub fn builder() -> Builder {
        Builder {
            rules: Vec::new(),
            base: None,
            how: Resolution::Auto,
        }
    }

    /// A resolver over `(path, mode)` rules, absolute paths, default
    /// resolution.
    pub fn new<P: AsRef<Path>>(
        rules: impl IntoIterator<Item = (P, Mode)>,
    ) -> Result<Self, PathError> {
        rules
            .into_iter()
            .fold(Self::builder(), |b, (p, m)| b.allow(p, m))
            .build()
    }

    /// The rules, normalised, duplicates merged.
    pub fn rules(&self) -> &[Rule] {
        self.list.rules()
    }

    /// The resolution in use (`Openat2` or `Walk`).
    pub fn resolution(&self) -> Resolution {
        self.how
    }

    pub fn base(&self) -> Option<&Path> {
        self.base.as_deref()
    }

    /// The lexical part of `validate`, without touching the file system:
    /// the normalised path and the rule that allows `mode` on it.
    pub fn permits(
        &self,
        path: impl AsRef<Path>,
        mode: Mode,
    ) -> Result<(PathBuf, &Rule), PathError> {
        let path = path.as_ref();
        let norm =
            normalise::normalise(path, self.base.as_deref()).map_err(|e| norm_error(e, path))?;
        match self.list.check(&norm, mode) {
            Ok(i) => Ok((norm, &self.list.rules()[i])),
            Err(Refusal::NotAllowed { nearest }) => Err(PathError::NotAllowed {
                path: norm,
                mode,
                nearest_rule: nearest,
            }),
            Err(Refusal::ReadOnly { rule }) => Err(PathError::ReadOnly { path: norm, rule }),
        }
    }

    /// Checks `path` for `mode` and opens it: a data fd (`O_RDONLY` for a
    /// read, `O_WRONLY` for a write; directories `O_RDONLY|O_DIRECTORY`), or
    /// for a write of a name that does not exist yet, its parent directory,
    /// ready for [`Validated::create`].
    pub fn validate(&self, path: impl AsRef<Path>, mode: Mode) -> Result<Validated, PathError> {
        self.validate_with(path, mode, Access::Data)
    }

    /// [`PathResolver::validate`] choosing the kind of fd.
    pub fn validate_with(
        &self,
        path: impl AsRef<Path>,
        mode: Mode,
        access: Access,
    ) -> Result<Validated, PathError> {
        let path = path.as_ref();
        let raw = path.as_os_str().as_bytes();
        let dir_hint = raw.len() > 1 && raw.ends_with(b"/");
        let (norm, rule) = self.permits(path, mode)?;
        let idx = self.list.governing(&norm).expect("permits found a rule");
        let anchor = &self.anchors[idx];
        let rule = rule.clone();
        let np = norm.as_os_str().as_bytes();
        let mut comps: Vec<&[u8]> = anchor.prefix.iter().map(Vec::as_slice).collect();
        comps.extend(rest_after(np, rule.path.as_os_str().as_bytes()));

        let dir = if dir_hint { libc::O_DIRECTORY } else { 0 };
        let first = match (access, mode) {
            (Access::Path, _) => libc::O_PATH | dir,
            (Access::Data, Mode::Read) => libc::O_RDONLY | libc::O_NOCTTY | libc::O_NONBLOCK | dir,
            (Access::Data, Mode::Write) if dir_hint => {
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NONBLOCK
            }
            (Access::Data, Mode::Write) => libc::O_WRONLY | libc::O_NOCTTY | libc::O_NONBLOCK,
        };
        let mut res = sys::open_beneath(self.how, anchor.fd.as_fd(), &comps, first, 0);
        if let Err(f) = res
            && f.errno == libc::EISDIR
        {
            // A write of a directory: hand back a directory fd.
            res = sys::open_beneath(
                self.how,
                anchor.fd.as_fd(),
                &comps,
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NONBLOCK,
                0,
            );
        }
        let mk = |target| Validated {
            path: norm.clone(),
            mode,
            rule: rule.clone(),
            target,
            how: self.how,
            dir_hint,
        };
        match res {
            Ok(fd) => {
                if first & libc::O_NONBLOCK != 0 {
                    sys::clear_nonblock(&fd);
                }
                Ok(mk(Target::Existing(fd)))
            }
            Err(f)
                if mode == Mode::Write
                    && f.errno == libc::ENOENT
                    && !f.symlink
                    && !comps.is_empty()
                    && f.at == Some(comps.len() - 1) =>
            {
                let (last, dirs) = comps.split_last().expect("not empty");
                let parent = sys::open_beneath(
                    self.how,
                    anchor.fd.as_fd(),
                    dirs,
                    libc::O_PATH | libc::O_DIRECTORY,
                    0,
                )
                .map_err(|f| fail_error(f, &norm, anchor, dirs, &rule, "open parent"))?;
                Ok(mk(Target::Missing {
                    parent,
                    name: last.to_vec(),
                }))
            }
            Err(f) => Err(fail_error(f, &norm, anchor, &comps, &rule, "open")),
        }
    }
}

fn norm_error(e: NormaliseError, path: &Path) -> PathError {
    let path = path.to_path_buf();
    match e {
        NormaliseError::Empty => PathError::Empty,
        NormaliseError::Nul => PathError::Nul { path },
        NormaliseError::Traversal => PathError::Traversal { path },
        NormaliseError::Relative => PathError::Relative { path },
    }
}

/// Turns a failed open beneath `anchor` into the error that names the path
/// and the component.
fn fail_error(
    f: OpenFail,
    path: &Path,
    anchor: &Anchor,
    comps: &[&[u8]],
    rule: &Rule,
    op: &'static str,
) -> PathError {
    let component = match f.at {
        Some(i) if i < comps.len() => join_path(&anchor.path, &comps[..=i]),
        _ => path.to_path_buf(),
    };
    let path = path.to_path_buf();
    if f.symlink || f.errno == libc::ELOOP {
        return PathError::Symlink { path, component };
    }
    match f.errno {
        libc::EXDEV => PathError::Escape {
            path,
            rule: rule.clone(),
        },
        libc::ENOENT => PathError::NotFound { path, component },
        libc::ENOTDIR => PathError::NotADirectory { path, component },
        libc::EEXIST => PathError::Exists { path },
        libc::EACCES | libc::EPERM => PathError::PermissionDenied {
            path,
            source: f.io(),
        },
        _ => PathError::Io {
            path,
            op,
            source: f.io(),
        },
    }
}

impl Validated {
    /// The normalised path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The rule that allowed it.
    pub fn rule(&self) -> &Rule {
        &self.rule
    }

    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Whether the path existed (and `fd` is its fd).
    pub fn exists(&self) -> bool {
        matches!(self.target, Target::Existing(_))
    }

    /// The fd of the path, when it exists.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        match &self.target {
            Target::Existing(fd) => Some(fd.as_fd()),
            Target::Missing { .. } => None,
        }
    }

    /// The fd of the path, when it exists.
    pub fn into_fd(self) -> Option<OwnedFd> {
        match self.target {
            Target::Existing(fd) => Some(fd),
            Target::Missing { .. } => None,
        }
    }

    /// The path as an open `File` (for a data fd), when it exists.
    pub fn into_file(self) -> Option<File> {
        self.into_fd().map(File::from)
    }

    /// Creates the file that did not exist at validation time:
    /// `O_CREAT | O_EXCL | O_NOFOLLOW | O_WRONLY` beneath the parent fd, so
    /// a file or symlink planted there since is refused, never followed or
    /// truncated.
    pub fn create(&self, perm: u32) -> Result<File, PathError> {
        let (parent, name) = self.missing()?;
        if self.dir_hint {
            return Err(PathError::Io {
                path: self.path.clone(),
                op: "create",
                source: std::io::Error::from_raw_os_error(libc::EISDIR),
            });
        }
        let flags =
            libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_WRONLY | libc::O_NOCTTY;
        sys::open_beneath(self.how, parent.as_fd(), &[name], flags, perm)
            .map(File::from)
            .map_err(|f| self.missing_error(f, name, "create"))
    }

    /// Creates the directory that did not exist at validation time and
    /// returns it opened (`O_RDONLY | O_DIRECTORY`, beneath the parent fd).
    pub fn mkdir(&self, perm: u32) -> Result<OwnedFd, PathError> {
        let (parent, name) = self.missing()?;
        sys::mkdirat(parent.as_raw_fd(), name, perm).map_err(|e| {
            self.missing_error(
                OpenFail {
                    errno: e,
                    at: Some(0),
                    symlink: false,
                },
                name,
                "mkdir",
            )
        })?;
        sys::open_beneath(
            self.how,
            parent.as_fd(),
            &[name],
            libc::O_RDONLY | libc::O_DIRECTORY,
            0,
        )
        .map_err(|f| self.missing_error(f, name, "open new directory"))
    }

    fn missing(&self) -> Result<(&OwnedFd, &[u8]), PathError> {
        match &self.target {
            Target::Missing { parent, name } => Ok((parent, name)),
            Target::Existing(_) => Err(PathError::Exists {
                path: self.path.clone(),
            }),
        }
    }

    fn missing_error(&self, f: OpenFail, _name: &[u8], op: &'static str) -> PathError {
        let path = self.path.clone();
        if f.symlink || f.errno == libc::ELOOP {
            return PathError::Symlink {
                component: path.clone(),
                path,
            };
        }
        if f.errno == libc::EEXIST {
            // A symlink planted there is reported as such.
            if let Target::Missing { parent, name } = &self.target
                && sys::lstatat(parent.as_raw_fd(), name)
                    .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFLNK)
            {
                return PathError::Symlink {
                    component: path.clone(),
                    path,
                };
            }
            return PathError::Exists { path };
        }
        match f.errno {
            libc::EACCES | libc::EPERM => PathError::PermissionDenied {
                path,
                source: f.io(),
            },
            libc::ENOENT => PathError::NotFound {
                component: path.clone(),
                path,
            },
            _ => PathError::Io {
                path,
                op,
                source: f.io(),
            },
        }
    }
}
