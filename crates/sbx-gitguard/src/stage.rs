//! The git stage: where commits made inside the sandbox land (sbx-fs
//! `--git-stage DIR` mounts one overlay over the repository's whole `.git`
//! whose upper layer is here), its creation, its lock, its removal, and the
//! reaping of stale stages.
//!
//! Layout (the contract sbx-fs consumes and checks; names are fixed):
//!
//! ```text
//! DIR/                 0700, owned by the user running sbx-gitguard
//! DIR/gitdir           one line: the canonical path of the repository's .git directory
//! DIR/git/             0700, the caller's
//! DIR/git/upper/       empty: overlay upperdir for the whole .git (lowerdir: the real .git)
//! DIR/git/work/        empty: overlay workdir (same file system as upper)
//! DIR/.lock            flock(LOCK_EX) held by the live `run`
//! ```
//!
//! sbx-fs refuses a stage whose DIR, DIR/git, DIR/git/upper or DIR/git/work
//! is not owned by the caller or is group/other-writable, or whose upper
//! and work are not empty. Everything git writes inside the sandbox lands in
//! DIR/git/upper; the host's .git is never written by the sandbox, and the
//! import reads only `objects/`, `refs/`, `HEAD`, `packed-refs` and `index`
//! from the upper layer.

use std::fs;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::layout::Layout;

/// Stage directories must be named with this prefix.
pub const PREFIX: &str = "sbx-git-stage-";
/// Temporary names while a stage is being built (then renamed to DIR).
const BUILDING: &str = ".sbx-git-stage-new.";
/// The registry kind of stages (sbx_core::registry): registered before
/// anything is made, so any later run finds a dead run's stage (and its
/// building name) whatever its TMPDIR; the entry's flock is the liveness.
pub const REG_KIND: &str = "gitguard-stage";

#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error(
        "--stage {0}: the name must start with '{PREFIX}' (stale stages are found by that name)"
    )]
    BadName(PathBuf),
    #[error("--stage {0}: already exists (a stage must be new)")]
    Exists(PathBuf),
    #[error("--stage {0}: the parent directory does not exist")]
    NoParent(PathBuf),
    #[error(
        "--repo {0}: a git stage needs a repository with a plain .git directory (not a bare repository, a linked worktree or a .git file)"
    )]
    NotPlain(PathBuf),
    #[error("--stage {path}: {what}")]
    Invalid { path: PathBuf, what: String },
    #[error("--stage {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "--stage {0}: inside the repository's work tree, where the sandbox can write; put it elsewhere (e.g. $XDG_RUNTIME_DIR)"
    )]
    InWorkTree(PathBuf),
    #[error("--stage {0}: in use by a running sbx-gitguard (its lock is held)")]
    InUse(PathBuf),
}

fn io_at(p: &Path) -> impl FnOnce(io::Error) -> StageError + '_ {
    move |source| StageError::Io {
        path: p.to_path_buf(),
        source,
    }
}

/// The stage's paths.
#[derive(Debug, Clone)]
pub struct Paths {
    pub dir: PathBuf,
}

impl Paths {
    pub fn new(dir: &Path) -> Paths {
        Paths {
            dir: dir.to_path_buf(),
        }
    }
    /// The upper layer of the overlay over the whole .git.
    pub fn git_upper(&self) -> PathBuf {
        self.dir.join("git/upper")
    }
    pub fn objects_upper(&self) -> PathBuf {
        self.git_upper().join("objects")
    }
    pub fn refs_upper(&self) -> PathBuf {
        self.git_upper().join("refs")
    }
    /// The sandbox's HEAD, packed-refs and index: absent when it left the
    /// host's as they were (the lower layer).
    pub fn head(&self) -> PathBuf {
        self.git_upper().join("HEAD")
    }
    pub fn packed_refs(&self) -> PathBuf {
        self.git_upper().join("packed-refs")
    }
    pub fn index(&self) -> PathBuf {
        self.git_upper().join("index")
    }
    pub fn gitdir_file(&self) -> PathBuf {
        self.dir.join("gitdir")
    }
    pub fn lock(&self) -> PathBuf {
        self.dir.join(".lock")
    }
}

/// Checks the name and makes the path absolute (the parent canonical).
pub fn resolve(dir: &Path) -> Result<PathBuf, StageError> {
    let name = dir
        .file_name()
        .ok_or_else(|| StageError::BadName(dir.to_path_buf()))?;
    if !name.as_bytes().starts_with(PREFIX.as_bytes()) || name.len() == PREFIX.len() {
        return Err(StageError::BadName(dir.to_path_buf()));
    }
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let parent = fs::canonicalize(parent).map_err(|_| StageError::NoParent(dir.to_path_buf()))?;
    if !parent.is_dir() {
        return Err(StageError::NoParent(dir.to_path_buf()));
    }
    Ok(parent.join(name))
}

/// The repository's git dir when it is a plain `.git` directory of a work
/// tree (the only shape sbx-fs stages).
pub fn plain_git_dir(l: &Layout) -> Result<PathBuf, StageError> {
    let Some(w) = &l.work_tree else {
        return Err(StageError::NotPlain(l.common_dir.clone()));
    };
    let dotgit = w.join(".git");
    let plain = fs::symlink_metadata(&dotgit).is_ok_and(|m| m.is_dir())
        && l.git_dir == dotgit
        && l.common_dir == dotgit;
    if !plain {
        return Err(StageError::NotPlain(w.clone()));
    }
    Ok(dotgit)
}

/// Refuses a stage inside the work tree (the sandbox writes there).
pub fn outside_work_tree(dir: &Path, l: &Layout) -> Result<(), StageError> {
    for w in l.work_trees() {
        if dir.starts_with(&w) {
            return Err(StageError::InWorkTree(dir.to_path_buf()));
        }
    }
    Ok(())
}

/// A live stage: the lock is held until it is dropped; `remove` deletes it.
pub struct Stage {
    pub paths: Paths,
    lock: Option<fs::File>,
    removed: bool,
    /// Left in place for a later `import` (another import held the
    /// repository too long).
    kept: std::cell::Cell<bool>,
    /// Dropped after the stage is removed (field order).
    _entry: Option<sbx_core::registry::Entry>,
}

impl Drop for Stage {
    /// Error paths remove the stage too.
    fn drop(&mut self) {
        if !self.removed && !self.kept.get() {
            let _ = remove_tree(&self.paths.dir);
        }
    }
}

fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

fn try_flock(f: &fs::File) -> bool {
    // SAFETY: flock(2) on `f`, open for the call (borrowed); no pointers.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// Opens for reading without following a symlink and without blocking:
/// a FIFO the sandbox left in the stage (as HEAD, say) opens at once and is
/// then refused by the caller's file-type check, never waited on.
fn open_nofollow(p: &Path) -> io::Result<fs::File> {
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(p)
}

impl Stage {
    /// Creates the stage for the repository's plain git dir: built under a
    /// temporary name with its lock already held, then renamed to `dir`
    /// (never over an existing entry), so no reaper can take a stage that is
    /// being made.
    pub fn create(dir: &Path, git_dir: &Path) -> Result<Stage, StageError> {
        let dir = resolve(dir)?;
        if fs::symlink_metadata(&dir).is_ok() {
            return Err(StageError::Exists(dir));
        }
        let parent = dir.parent().unwrap().to_path_buf();
        // This repository's stages that dead runs registered, whatever
        // their TMPDIR was.
        for p in sbx_core::registry::reap(REG_KIND, |p| remove_registered(p, git_dir)) {
            if let Some(a) = sbx_core::audit::get() {
                a.record(
                    "git_stage_reaped",
                    sbx_core::Severity::Warn,
                    serde_json::json!({ "stage": crate::jpath(&p), "reason": "registered by an sbx-gitguard that died (its registry lock was free)" }),
                );
            }
        }
        // Registered first: a SIGKILL from here on leaves an entry the
        // next run reaps (the stage and its building name, derived from it).
        let entry = sbx_core::registry::register(REG_KIND, &dir)
            .map_err(|e| tracing::warn!(stage = %dir.display(), "not registered: {e}"))
            .ok();
        let tmp = Building(building_path(&dir));
        let t = tmp.0.as_path();
        if fs::symlink_metadata(t).is_ok() {
            // A dead run's of the same name (the registry lock was free).
            remove_unlocked(t).map_err(io_at(t))?;
        }
        fs::DirBuilder::new()
            .mode(0o700)
            .create(t)
            .map_err(io_at(&parent))?;
        fs::set_permissions(t, fs::Permissions::from_mode(0o700)).map_err(io_at(t))?;
        let lock = fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(t.join(".lock"))
            .map_err(io_at(t))?;
        if !try_flock(&lock) {
            return Err(StageError::InUse(t.to_path_buf()));
        }
        let mut b = fs::DirBuilder::new();
        b.mode(0o700);
        for d in ["git", "git/upper", "git/work"] {
            b.create(t.join(d)).map_err(io_at(t))?;
        }
        let mut g = fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .mode(0o600)
            .open(t.join("gitdir"))
            .map_err(io_at(t))?;
        sbx_core::registry::test_kill_point("stage-gitdir");
        g.write_all(git_dir.as_os_str().as_bytes())
            .and_then(|()| g.write_all(b"\n"))
            .map_err(io_at(t))?;
        drop(g);
        rename_noreplace(t, &dir).map_err(|e| {
            if e.raw_os_error() == Some(libc::EEXIST) {
                StageError::Exists(dir.clone())
            } else {
                StageError::Io {
                    path: dir.clone(),
                    source: e,
                }
            }
        })?;
        // Renamed away: nothing to remove under the building name now.
        std::mem::forget(tmp);
        Ok(Stage {
            paths: Paths::new(&dir),
            lock: Some(lock),
            removed: false,
            kept: std::cell::Cell::new(false),
            _entry: entry,
        })
    }

    /// Opens an existing stage for a standalone import: it must be ours,
    /// 0700, of this git dir, and not held by a running sbx-gitguard.
    pub fn open(dir: &Path, git_dir: &Path) -> Result<Stage, StageError> {
        let dir = resolve(dir)?;
        let inv = |what: &str| StageError::Invalid {
            path: dir.clone(),
            what: what.to_string(),
        };
        let m = fs::symlink_metadata(&dir).map_err(io_at(&dir))?;
        if !m.is_dir() {
            return Err(inv("not a directory"));
        }
        if m.uid() != euid() {
            return Err(inv("not owned by the user running sbx-gitguard"));
        }
        if m.mode() & 0o077 != 0 {
            return Err(inv("mode is not 0700"));
        }
        let p = Paths::new(&dir);
        let named = read_small(&p.gitdir_file(), 4096).map_err(|e| inv(&format!("gitdir: {e}")))?;
        let named = String::from_utf8_lossy(&named);
        if Path::new(named.trim_end_matches('\n')) != git_dir {
            return Err(inv(&format!(
                "it is the stage of {}, not of {}",
                named.trim_end(),
                git_dir.display()
            )));
        }
        let up = p.git_upper();
        if !fs::symlink_metadata(&up).is_ok_and(|m| m.is_dir() && m.uid() == euid()) {
            return Err(inv(&format!(
                "{} is not a directory of the caller's",
                up.display()
            )));
        }
        let lock = match open_nofollow(&p.lock()) {
            Ok(f) => {
                if !try_flock(&f) {
                    return Err(StageError::InUse(dir));
                }
                Some(f)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_at(&dir)(e)),
        };
        Ok(Stage {
            paths: p,
            lock,
            removed: false,
            kept: std::cell::Cell::new(false),
            _entry: None,
        })
    }

    /// Leaves the stage in place when it is dropped or removed.
    pub fn keep(&self) {
        self.kept.set(true);
    }

    /// Removes the whole stage (overlay work dirs included), then drops
    /// the lock.
    pub fn remove(mut self) -> io::Result<()> {
        if self.kept.get() {
            return Ok(());
        }
        let r = remove_tree(&self.paths.dir);
        self.removed = true;
        self.lock.take();
        r
    }
}

/// The stage's name while it is built: derived from the stage's, so that
/// the registered stage path names both.
fn building_path(dir: &Path) -> PathBuf {
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    dir.with_file_name(format!("{BUILDING}{name}"))
}

/// Removes a building directory on the error paths of [`Stage::create`].
struct Building(PathBuf);
impl Drop for Building {
    fn drop(&mut self) {
        let _ = remove_tree(&self.0);
    }
}

/// Removes `p` (a directory of ours) unless its `.lock` is held.
fn remove_unlocked(p: &Path) -> io::Result<()> {
    let m = fs::symlink_metadata(p)?;
    if !m.is_dir() || m.uid() != euid() {
        return Err(io::Error::other("not a directory of ours"));
    }
    let _lock = match open_nofollow(&p.join(".lock")) {
        Ok(f) if !try_flock(&f) => {
            return Err(io::Error::other("in use (its lock is held)"));
        }
        Ok(f) => Some(f),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    remove_tree(p)
}

/// The registry's removal of a dead run's stage of `git_dir`: the stage
/// and its building name, each only if it is a directory of ours whose lock
/// is free (a standalone `import` may hold a dead run's stage). Another
/// repository's stage is kept (an error keeps the entry): it stays
/// importable by hand until its own repository's next staged run.
fn remove_registered(dir: &Path, git_dir: &Path) -> io::Result<()> {
    let named = dir
        .file_name()
        .is_some_and(|n| n.as_bytes().starts_with(PREFIX.as_bytes()));
    if !named {
        return Err(io::Error::other("not a stage name"));
    }
    for p in [building_path(dir), dir.to_path_buf()] {
        match fs::symlink_metadata(&p) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        }
        // An unreadable gitdir: a stage never finished, nothing to import.
        // Under the building name, a gitdir that is empty or a part of this
        // git dir's name was being written when the run died (one killed
        // there left its building directory to every later run: the
        // fault-injection test, session 15).
        if let Ok(b) = read_small(&p.join("gitdir"), 4096) {
            let named = b.strip_suffix(b"\n").unwrap_or(&b);
            let ours = git_dir.as_os_str().as_bytes();
            let unfinished = p != dir && ours.starts_with(named);
            if named != ours && !unfinished {
                return Err(io::Error::other("another repository's stage"));
            }
        }
        match remove_unlocked(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// rename(2) that fails with EEXIST instead of replacing.
fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    let f = std::ffi::CString::new(from.as_os_str().as_bytes())?;
    let t = std::ffi::CString::new(to.as_os_str().as_bytes())?;
    // SAFETY: `f` and `t` are NUL-terminated CStrings alive across the
    // call; AT_FDCWD needs no open fd.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Removes a tree without following symlinks, at any depth (the sandbox
/// shapes the stage: a chain of directories past PATH_MAX or the fd limit
/// made a path-based removal fail and the stage stay). Overlay work dirs
/// may hold a `work` subdirectory with mode 000 (made by the kernel):
/// `sbx_core::rmtree` opens such directories up before descending.
pub fn remove_tree(p: &Path) -> io::Result<()> {
    sbx_core::rmtree::remove_tree(p)
}

/// Reads at most `max` bytes of a regular file, refusing symlinks and
/// anything else.
pub fn read_small(p: &Path, max: u64) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let f = open_nofollow(p)?;
    let m = f.metadata()?;
    if !m.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    if m.len() > max {
        return Err(io::Error::other(format!("larger than {max} bytes")));
    }
    let mut v = Vec::new();
    f.take(max + 1).read_to_end(&mut v)?;
    Ok(v)
}

/// Removes stale stages beside `dir`: `sbx-git-stage-*` directories owned by
/// the caller whose lock is free (their sbx-gitguard died), and stages
/// still being built that are older than a minute. Returns what was removed.
/// (Stages of this repository that dead runs registered elsewhere are
/// reaped by [`Stage::create`].)
pub fn reap_siblings(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Some(parent) = dir.parent() else {
        return out;
    };
    let Ok(rd) = fs::read_dir(parent) else {
        return out;
    };
    let me = euid();
    for e in rd.filter_map(|e| e.ok()) {
        let name = e.file_name();
        let n = name.as_bytes();
        let staged = n.starts_with(PREFIX.as_bytes());
        let building = n.starts_with(BUILDING.as_bytes());
        if !staged && !building {
            continue;
        }
        let p = e.path();
        if p == dir {
            continue;
        }
        let Ok(m) = fs::symlink_metadata(&p) else {
            continue;
        };
        if !m.is_dir() || m.uid() != me {
            continue;
        }
        if building {
            let age = std::time::SystemTime::now()
                .duration_since(m.modified().unwrap_or(std::time::UNIX_EPOCH))
                .unwrap_or_default();
            if age < std::time::Duration::from_secs(60) {
                continue;
            }
        }
        // Held while we remove it, so a concurrent reaper skips it.
        let lock = match open_nofollow(&p.join(".lock")) {
            Ok(f) => {
                if !try_flock(&f) {
                    continue;
                }
                Some(f)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(_) => continue,
        };
        if remove_tree(&p).is_ok() {
            out.push(p);
        }
        drop(lock);
    }
    out
}
