//! Repositories planted in writable directories, found the way git finds
//! them, and quarantined.
//!
//! git runs `core.fsmonitor`, hooks and filters of any repository it
//! discovers walking up from its current directory, so a repository the
//! sandbox leaves in the work tree runs code on the host as soon as the
//! owner's shell prompt runs `git status` there. Discovery (git's setup.c)
//! looks, in each directory D from the current one upwards, at `D/.git`
//! (`stat`, so a symlink is followed: a directory must pass
//! `is_git_directory`, a regular file must read `gitdir: X` with X passing
//! it, anything else makes git stop with an error) and then at D itself as a
//! bare repository (`is_git_directory(D)`). `is_git_directory(X)`: `X/HEAD`
//! is a symlink into `refs/` or a file starting with `ref: refs/` or a hex
//! object id; then the common dir is `$GIT_COMMON_DIR`, else the target of
//! `X/commondir` (relative to X) when that file exists, else X; and
//! `COMMON/objects` (or `$GIT_OBJECT_DIRECTORY`) and `COMMON/refs` pass
//! `access(X_OK)`, which a directory and an *executable file* both do.
//!
//! [`is_git_directory`] answers that question with every alternative git
//! could take counted as a yes (the common dir from the file and X itself,
//! and the environment variables when set here; any execute bit, as root's
//! `access` sees it), so it is a superset of what git accepts for any user
//! and environment.
//!
//! `plants` snapshots every repository-like entry of the writable
//! directories before the command (the user's: identified by device, inode
//! and content, never by path), and afterwards moves every new one into a
//! quarantine outside the project; a repository of the user's that was
//! renamed away is put back, one whose HEAD, config or commondir changed is
//! restored, and hooks that appeared in it are quarantined. The walk has a
//! budget of entries: over it, nothing is silently skipped (an alert, and
//! exit 125).

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use clap::Args;
use sbx_core::escape;
use sbx_core::{Failure, Severity};
use serde_json::json;

/// Largest config/HEAD/commondir/.git file kept in the snapshot.
const MAX_FILE: u64 = 1 << 20;

/// What git could take for a repository.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A `.git` directory that passes `is_git_directory`.
    GitDir,
    /// A `.git` that is not a directory (a `gitdir:` file, a symlink, or
    /// anything else: git follows or fails on it).
    GitFile,
    /// A directory that passes `is_git_directory` itself (bare-shaped).
    Bare,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::GitDir => ".git directory",
            Kind::GitFile => ".git file or symlink",
            Kind::Bare => "bare-repository-shaped directory",
        }
    }
}

/// The files of a repository that decide what git runs there.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Content {
    // HEAD is not compared: switching branches is normal work, and HEAD
    // makes git run nothing.
    config: Option<Vec<u8>>,
    /// `config.worktree`: git reads it when the common config sets
    /// `extensions.worktreeConfig`.
    config_worktree: Option<Vec<u8>>,
    commondir: Option<Vec<u8>>,
    /// A `.git` file's bytes or a `.git` symlink's target.
    gitfile: Option<Vec<u8>>,
    /// hooks/: name -> (ino, size, mtime); None when hooks is not a
    /// directory.
    /// Each hook's (inode, size, ctime s, ctime ns): an in-place rewrite
    /// with the mtime put back still moves the ctime, which no user call
    /// can set.
    hooks: Option<BTreeMap<OsString, (u64, u64, i64, i64)>>,
    hooks_ident: Option<(u64, u64)>,
}

#[derive(Debug, Clone)]
pub struct Entry {
    pub path: PathBuf,
    pub kind: Kind,
    pub dev: u64,
    pub ino: u64,
    content: Content,
}

/// Every repository-like entry of the scanned directories.
#[derive(Debug, Default)]
pub struct Inventory {
    pub entries: Vec<Entry>,
    pub scanned: u64,
    /// Entries whose path is too long for a system call (PATH_MAX): not
    /// looked at, counted and alerted (`plant_scan_too_deep`), never
    /// skipped silently. git cannot run there (its `getcwd` fails beyond
    /// PATH_MAX) and discovers repositories upwards only, so nothing there
    /// is a repository for git unless a `.git` file or `GIT_DIR` points at
    /// it, and such a pointer is itself found.
    pub too_deep: u64,
    pub first_too_deep: Option<PathBuf>,
}

/// PATH_MAX, counted with the terminating NUL.
const PATH_MAX: usize = libc::PATH_MAX as usize;

#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error("{dir}: more than {max} entries to scan for planted repositories (--max-entries)")]
    Budget { dir: PathBuf, max: u64 },
    #[error("{0}: not a directory")]
    NotDir(PathBuf),
    #[error("{dir}: cannot be listed ({err}); a repository below it would go unseen")]
    Unreadable { dir: PathBuf, err: std::io::Error },
}

/// Lists `d`. A directory the command made unreadable (`chmod 111`: git
/// still finds `.git` below it) is made listable again when it is ours;
/// otherwise the scan fails closed rather than skip it.
///
/// Through [`crate::dirlist`]: the scan after the command lists again only
/// the directories whose stat changed (one `stat` for each of the others).
fn list(d: &Path) -> Result<crate::dirlist::Entries, ScanError> {
    match crate::dirlist::list(d) {
        Ok(l) => Ok(l.entries),
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
            let m = fs::symlink_metadata(d).map_err(|err| ScanError::Unreadable {
                dir: d.to_path_buf(),
                err,
            })?;
            let mine = m.uid() == nix::unistd::geteuid().as_raw();
            if mine && m.is_dir() {
                use std::os::unix::fs::PermissionsExt;
                let _ =
                    fs::set_permissions(d, fs::Permissions::from_mode((m.mode() | 0o700) & 0o7777));
                crate::audit(
                    "plant_scan_unreadable",
                    Severity::Alert,
                    json!({ "path": crate::jpath(d), "mode": format!("{:o}", m.mode() & 0o7777), "action": "made listable (u+rwx)" }),
                );
            }
            crate::dirlist::list(d)
                .map(|l| l.entries)
                .map_err(|err| ScanError::Unreadable {
                    dir: d.to_path_buf(),
                    err,
                })
        }
        Err(err) => Err(ScanError::Unreadable {
            dir: d.to_path_buf(),
            err,
        }),
    }
}

fn read_limited(p: &Path) -> Option<Vec<u8>> {
    let m = fs::symlink_metadata(p).ok()?;
    if m.file_type().is_symlink() {
        return fs::read_link(p).ok().map(|t| t.into_os_string().into_vec());
    }
    if !m.is_file() || m.len() > MAX_FILE {
        return None;
    }
    crate::stage::read_small(p, MAX_FILE).ok()
}

use std::os::unix::ffi::OsStringExt;

/// git's validate_headref, as a superset: HEAD is a symlink into `refs/`,
/// or a file (followed) starting with `ref:` + spaces + `refs/`, or with a
/// SHA-1 or SHA-256 hex id.
pub fn valid_head(p: &Path) -> bool {
    let Ok(m) = fs::symlink_metadata(p) else {
        return false;
    };
    if m.file_type().is_symlink()
        && fs::read_link(p).is_ok_and(|t| t.as_os_str().as_bytes().starts_with(b"refs/"))
    {
        return true;
    }
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    // Never blocks: a FIFO (or another special file) as HEAD is opened
    // non-blocking and never read; it counts as a repository (a plant: git
    // would hang on it), a directory does not (git's read fails).
    let Ok(f) = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(p)
    else {
        return false;
    };
    match f.metadata() {
        Ok(m) if m.is_file() => {}
        Ok(m) => return !m.is_dir(),
        Err(_) => return false,
    }
    let mut buf = Vec::new();
    if f.take(255).read_to_end(&mut buf).is_err() {
        return false;
    }
    if let Some(rest) = buf.strip_prefix(b"ref:") {
        let r: &[u8] = {
            let n = rest.iter().take_while(|b| b.is_ascii_whitespace()).count();
            &rest[n..]
        };
        if r.starts_with(b"refs/") {
            return true;
        }
    }
    let hex = buf.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    hex >= 40
}

/// `access(X_OK)` as any user could see it: a directory, or a file with an
/// execute bit (followed through symlinks, as access does).
fn enterable(p: &Path) -> bool {
    // A symlink counts whatever it names now: a dangling one becomes a
    // directory as soon as its target is made (`mkdir target`, a build).
    if fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink()) {
        return true;
    }
    match fs::metadata(p) {
        Ok(m) if m.is_dir() => true,
        Ok(m) => m.mode() & 0o111 != 0,
        Err(_) => false,
    }
}

/// The common dirs git could use for `x`: the target of `x/commondir`
/// (relative to x) when that file exists, x itself, and `$GIT_COMMON_DIR`.
fn common_dirs(x: &Path) -> Vec<PathBuf> {
    let mut v = vec![x.to_path_buf()];
    let cd = x.join("commondir");
    if fs::symlink_metadata(&cd).is_ok()
        && let Ok(b) = crate::stage::read_small(&cd, MAX_FILE)
            .or_else(|_| sbx_core::input::read_regular(&cd, MAX_FILE))
    {
        let mut b: &[u8] = &b;
        while let Some(s) = b.strip_suffix(b"\n").or_else(|| b.strip_suffix(b"\r")) {
            b = s;
        }
        let t = Path::new(OsStr::from_bytes(b));
        v.push(if t.is_absolute() {
            t.to_path_buf()
        } else {
            x.join(t)
        });
    }
    if let Some(e) = std::env::var_os("GIT_COMMON_DIR") {
        v.push(PathBuf::from(e));
    }
    v
}

/// Whether git could take `x` for a git directory (see the module doc).
pub fn is_git_directory(x: &Path) -> bool {
    if !valid_head(&x.join("HEAD")) {
        return false;
    }
    let env_objects = std::env::var_os("GIT_OBJECT_DIRECTORY").map(PathBuf::from);
    common_dirs(x).iter().any(|c| {
        (enterable(&c.join("objects")) || env_objects.as_deref().is_some_and(enterable))
            && enterable(&c.join("refs"))
    })
}

fn content(p: &Path, kind: Kind) -> Content {
    if kind == Kind::GitFile {
        return Content {
            gitfile: read_limited(p),
            ..Default::default()
        };
    }
    let hooks_p = p.join("hooks");
    let hm = fs::symlink_metadata(&hooks_p).ok();
    let hooks = hm.as_ref().filter(|m| m.is_dir()).map(|_| {
        fs::read_dir(&hooks_p)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .take(10_000)
                    .filter_map(|e| {
                        let m = e.metadata().ok()?;
                        Some((e.file_name(), (m.ino(), m.len(), m.ctime(), m.ctime_nsec())))
                    })
                    .collect()
            })
            .unwrap_or_default()
    });
    Content {
        config: read_limited(&p.join("config")),
        config_worktree: read_limited(&p.join("config.worktree")),
        commondir: read_limited(&p.join("commondir")),
        gitfile: None,
        hooks,
        hooks_ident: hm.map(|m| (m.dev(), m.ino())),
    }
}

/// Walks `roots` (never following symlinks, never entering a git dir it
/// found) and lists every repository-like entry. `descend_planted` says
/// whether to enter a bare-shaped directory anyway (after the fact: it may
/// hold more plants).
pub fn scan(roots: &[PathBuf], max_entries: u64) -> Result<Inventory, ScanError> {
    let mut inv = Inventory::default();
    for root in roots {
        let m = fs::symlink_metadata(root).map_err(|_| ScanError::NotDir(root.clone()))?;
        if !m.is_dir() {
            return Err(ScanError::NotDir(root.clone()));
        }
        // (directory, whether it lies inside a git dir)
        let mut stack = vec![(root.clone(), false)];
        while let Some((d, mut in_git)) = stack.pop() {
            if d.file_name() != Some(OsStr::new(".git")) && is_git_directory(&d) {
                if let Ok(m) = fs::symlink_metadata(&d) {
                    inv.entries.push(Entry {
                        content: content(&d, Kind::Bare),
                        path: d.clone(),
                        kind: Kind::Bare,
                        dev: m.dev(),
                        ino: m.ino(),
                    });
                }
                // Walked too: git dirs hold git dirs (`modules/NAME` of a
                // submodule, `worktrees/NAME`), each with its own config
                // and hooks, and a plant can hide in a user's repository.
                in_git = true;
            }
            let entries = match list(&d) {
                Ok(l) => l,
                // Gone meanwhile (the command may still run): nothing below.
                Err(ScanError::Unreadable { err, .. })
                    if err.kind() == std::io::ErrorKind::NotFound =>
                {
                    continue;
                }
                Err(e) => return Err(e),
            };
            for (name, ft) in entries.iter() {
                inv.scanned += 1;
                if inv.scanned > max_entries {
                    return Err(ScanError::Budget {
                        dir: d.clone(),
                        max: max_entries,
                    });
                }
                let p = d.join(name);
                if p.as_os_str().len() >= PATH_MAX {
                    inv.too_deep += 1;
                    inv.first_too_deep.get_or_insert_with(|| d.clone());
                    continue;
                }
                // The object store is large and runs nothing; a git dir
                // planted in it is reachable only through a pointer (a
                // `.git` file, found as such).
                if in_git && (name == "objects" || name == "lfs") {
                    continue;
                }
                if name == ".git" {
                    let Ok(m) = fs::symlink_metadata(&p) else {
                        continue;
                    };
                    let kind = if m.is_dir() {
                        if !is_git_directory(&p) {
                            // Not a repository for git (it moves on up):
                            // walked like any directory.
                            stack.push((p, in_git));
                            continue;
                        }
                        Kind::GitDir
                    } else {
                        Kind::GitFile
                    };
                    inv.entries.push(Entry {
                        content: content(&p, kind),
                        path: p.clone(),
                        kind,
                        dev: m.dev(),
                        ino: m.ino(),
                    });
                    if kind == Kind::GitDir {
                        stack.push((p, true));
                    }
                    continue;
                }
                // The type readdir gave (no stat per entry of the work
                // tree; an lstat where the file system does not say).
                if ft.is_dir() {
                    stack.push((p, in_git));
                }
            }
        }
    }
    Ok(inv)
}

/// Where planted entries go: `DIR/<run>/<n>/<name>`, each `<n>` made
/// unenterable (mode 000) once filled, so no git of a non-root user can
/// discover what it holds.
pub struct Quarantine {
    /// Candidate bases, first that works wins.
    bases: Vec<PathBuf>,
    run: Option<PathBuf>,
    n: u32,
}

impl Quarantine {
    pub fn new(bases: Vec<PathBuf>) -> Quarantine {
        Quarantine {
            bases,
            run: None,
            n: 0,
        }
    }

    fn run_dir(&mut self) -> io::Result<PathBuf> {
        if let Some(r) = &self.run {
            return Ok(r.clone());
        }
        let id = sbx_core::id::get().unwrap_or("run").replace('/', "_");
        let mut last = io::Error::other("no quarantine directory");
        for base in &self.bases {
            let made = fs::create_dir_all(base).and_then(|()| {
                // Ours and not a symlink someone else put there.
                let m = fs::symlink_metadata(base)?;
                if !m.is_dir() || m.uid() != nix::unistd::geteuid().as_raw() {
                    return Err(io::Error::other("not a directory of the caller's"));
                }
                fs::set_permissions(base, fs::Permissions::from_mode(0o700))?;
                let r = base.join(format!("{id}-{}", std::process::id()));
                fs::create_dir_all(&r)?;
                fs::set_permissions(&r, fs::Permissions::from_mode(0o700))?;
                Ok(r)
            });
            match made {
                Ok(r) => {
                    self.run = Some(r.clone());
                    return Ok(r);
                }
                Err(e) => last = io::Error::other(format!("{}: {e}", base.display())),
            }
        }
        Err(last)
    }

    /// Moves `p` into the quarantine; returns where it went. On another
    /// file system (rename fails with EXDEV) it is removed instead and
    /// None is returned.
    pub fn take(&mut self, p: &Path) -> io::Result<Option<PathBuf>> {
        let run = self.run_dir()?;
        self.n += 1;
        let slot = run.join(self.n.to_string());
        fs::create_dir(&slot)?;
        let to = slot.join(p.file_name().unwrap_or(OsStr::new("entry")));
        match fs::rename(p, &to) {
            Ok(()) => {
                fs::set_permissions(&slot, fs::Permissions::from_mode(0o000))?;
                Ok(Some(to))
            }
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
                let _ = fs::remove_dir(&slot);
                crate::stage::remove_tree(p)?;
                Ok(None)
            }
            Err(e) => {
                let _ = fs::remove_dir(&slot);
                Err(e)
            }
        }
    }
}

/// The root of `roots` (canonical) that the quarantine `q` lies in: by
/// path, by the identity of `q` (as far as it exists) and the directories
/// above it, and by place on its file system (a bind mount aliasing a
/// directory inside a root reaches it with no ancestor in common:
/// mountinfo gives the same device and path within the file system).
fn quarantine_inside<'a>(q: &Path, roots: &'a [PathBuf]) -> Option<&'a PathBuf> {
    let mut have = q.to_path_buf();
    let mut tail = Vec::new();
    while fs::symlink_metadata(&have).is_err() {
        let (Some(p), Some(n)) = (have.parent(), have.file_name()) else {
            break;
        };
        tail.push(n.to_os_string());
        have = p.to_path_buf();
    }
    let mut qc = fs::canonicalize(&have).unwrap_or(have);
    qc.extend(tail.iter().rev());
    if let Some(r) = roots.iter().find(|r| qc.starts_with(r)) {
        return Some(r);
    }
    let mut chain = Vec::new();
    let mut cur = Some(qc.as_path());
    while let Some(c) = cur {
        if let Ok(m) = fs::metadata(c) {
            chain.push((m.dev(), m.ino()));
        }
        cur = c.parent();
    }
    let mi = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let q_at = fs_place(&qc, &mi);
    roots.iter().find(|r| {
        fs::metadata(r).is_ok_and(|m| chain.contains(&(m.dev(), m.ino())))
            || matches!((&q_at, fs_place(r, &mi)), (Some((qd, qp)), Some((rd, rp))) if *qd == rd && qp.starts_with(&rp))
    })
}

/// (device, path within its file system) of the absolute path `p`, from
/// mountinfo: the last mount on the longest mount point above it.
fn fs_place(p: &Path, mountinfo: &str) -> Option<(String, PathBuf)> {
    fn unescape(f: &str) -> PathBuf {
        PathBuf::from(OsString::from_vec(sbx_core::escape::mountinfo_field(f)))
    }
    let mut best: Option<(usize, String, PathBuf, PathBuf)> = None;
    for line in mountinfo.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() < 5 {
            continue;
        }
        let mp = unescape(f[4]);
        if !p.starts_with(&mp) {
            continue;
        }
        let len = mp.as_os_str().len();
        if best.as_ref().is_none_or(|b| len >= b.0) {
            best = Some((len, f[2].to_string(), unescape(f[3]), mp));
        }
    }
    let (_, dev, root, mp) = best?;
    Some((dev, root.join(p.strip_prefix(&mp).ok()?)))
}

/// One thing found after the command.
#[derive(Debug, Clone)]
pub struct Finding {
    pub event: &'static str,
    pub severity: Severity,
    pub fields: serde_json::Value,
    /// One readable line (names escaped for a terminal).
    pub line: String,
}

/// Outcome of [`check_after`].
#[derive(Debug, Default)]
pub struct After {
    pub findings: Vec<Finding>,
    /// Something could not be brought back (a quarantine that failed).
    pub failed: Option<String>,
}

fn user_git_dirs(before: &[Entry]) -> impl Iterator<Item = PathBuf> + '_ {
    before
        .iter()
        .filter(|e| e.kind == Kind::GitDir)
        .filter_map(|e| fs::canonicalize(&e.path).ok())
}

fn is_under_user_git_dir(target: &Path, before: &[Entry]) -> bool {
    user_git_dirs(before)
        .any(|g| target.starts_with(g.join("modules")) || target.starts_with(g.join("worktrees")))
}

/// A new `.git` file naming a git dir under a user's `.git/modules` or
/// `.git/worktrees` (a submodule or worktree git itself made, which the
/// repository's own check has vetted).
fn benign_gitfile(e: &Entry, before: &[Entry]) -> bool {
    let Ok(m) = fs::symlink_metadata(&e.path) else {
        return false;
    };
    if !m.is_file() {
        return false;
    }
    let Some(t) = crate::layout::read_gitfile(&e.path) else {
        return false;
    };
    let Ok(c) = fs::canonicalize(&t) else {
        // A worktree the sandbox added: its admin dir is still in the git
        // stage (worktree.rs decides on it after this check).
        return crate::worktree::pending_link(&t, user_git_dirs(before));
    };
    is_git_directory(&c) && is_under_user_git_dir(&c, before)
}

/// Compares what is there now with `before`, quarantining what was planted
/// and bringing back what was the user's. Loops while a pass finds
/// something (a neutralised bare-shaped directory is walked on the next
/// pass), at most a few passes.
pub fn check_after(
    roots: &[PathBuf],
    before: &Inventory,
    max_entries: u64,
    q: &mut Quarantine,
) -> After {
    let mut out = After::default();
    let by_id: HashMap<(u64, u64), &Entry> =
        before.entries.iter().map(|e| ((e.dev, e.ino), e)).collect();
    for pass in 0..8 {
        let now = match scan(roots, max_entries) {
            Ok(n) => n,
            Err(e) => {
                let reason = e.to_string();
                out.findings.push(Finding {
                    event: "plant_scan_budget",
                    severity: Severity::Alert,
                    fields: json!({ "reason": reason, "max_entries": max_entries,
                        "action": "not fully checked: do not run git in these directories before checking them" }),
                    line: format!(
                        "alert: planted repositories: {} -> not fully checked",
                        escape::terminal(&reason)
                    ),
                });
                out.failed = Some(reason);
                return out;
            }
        };
        if pass == 0 && now.too_deep > 0 {
            out.findings.push(too_deep_finding(&now));
        }
        let mut acted = false;
        let mut moved_back = Vec::new();
        // Planted first: a planted entry may sit where a moved user's
        // repository must go back.
        for e in &now.entries {
            match by_id.get(&(e.dev, e.ino)) {
                Some(b) => {
                    if b.path != e.path {
                        moved_back.push((e.clone(), (*b).clone()));
                    } else if b.content != e.content {
                        acted |= restore_content(e, b, q, &mut out);
                    }
                }
                None if e.kind == Kind::GitFile && benign_gitfile(e, &before.entries) => {}
                None => {
                    acted = true;
                    plant(e, q, &mut out);
                }
            }
        }
        for (e, b) in moved_back {
            acted = true;
            let r = if fs::symlink_metadata(&b.path).is_ok() {
                Err("its place is taken".to_string())
            } else {
                fs::rename(&e.path, &b.path).map_err(|x| x.to_string())
            };
            let (action, sev) = match &r {
                Ok(()) => (
                    format!("moved back to {}", b.path.display()),
                    Severity::Alert,
                ),
                Err(why) => {
                    out.failed = Some(format!(
                        "{}: cannot move the user's repository back: {why}",
                        b.path.display()
                    ));
                    (
                        format!("left at {} ({why})", e.path.display()),
                        Severity::Alert,
                    )
                }
            };
            out.findings.push(Finding {
                event: "git_repo_moved",
                severity: sev,
                fields: json!({ "path": crate::jpath(&b.path), "found_at": crate::jpath(&e.path), "kind": e.kind.name(), "action": action }),
                line: format!(
                    "alert: the user's repository {} was moved to {} -> {}",
                    escape::path(&b.path),
                    escape::path(&e.path),
                    escape::terminal(&action)
                ),
            });
            if r.is_ok() && b.content != e.content {
                let mut moved = e.clone();
                moved.path = b.path.clone();
                restore_content(&moved, &b, q, &mut out);
            }
        }
        if !acted {
            return out;
        }
        if pass == 7 {
            out.failed = Some("planted repositories keep appearing".into());
        }
    }
    out
}

/// The alert for entries beyond PATH_MAX (see [`Inventory::too_deep`]).
fn too_deep_finding(inv: &Inventory) -> Finding {
    let first = inv.first_too_deep.clone().unwrap_or_default();
    let head: String = first.to_string_lossy().chars().take(120).collect();
    Finding {
        event: "plant_scan_too_deep",
        severity: Severity::Alert,
        fields: json!({ "entries": inv.too_deep, "first_dir": head, "path_max": PATH_MAX,
                        "action": "not looked at: git cannot run there (getcwd fails) and finds repositories upwards only" }),
        line: format!(
            "alert: planted repositories: {} entries below {}… lie beyond PATH_MAX -> not looked at (git cannot run there)",
            inv.too_deep,
            escape::terminal(&head)
        ),
    }
}

fn plant(e: &Entry, q: &mut Quarantine, out: &mut After) {
    // A bare-shaped directory may be one of the user's directories that
    // the sandbox filled: only HEAD goes (without it git does not take the
    // directory for a repository); a .git entry goes whole.
    let (what, target) = match e.kind {
        Kind::Bare => (
            format!("{} (HEAD moved out)", e.kind.name()),
            e.path.join("HEAD"),
        ),
        k => (k.name().to_string(), e.path.clone()),
    };
    let keys: Vec<String> = if e.kind == Kind::GitFile {
        Vec::new()
    } else {
        crate::snapshot::config_entries(&e.path)
            .into_iter()
            .flat_map(|(_, es)| es.into_iter().filter(|x| x.is_dangerous()).map(|x| x.key()))
            .collect()
    };
    let (action, qpath) = match q.take(&target) {
        Ok(Some(to)) => (format!("quarantined in {}", to.display()), Some(to)),
        Ok(None) => (
            "removed (the quarantine is on another file system)".to_string(),
            None,
        ),
        Err(err) => {
            out.failed = Some(format!("{}: cannot quarantine: {err}", e.path.display()));
            (format!("quarantine failed: {err}"), None)
        }
    };
    out.findings.push(Finding {
        event: "git_repo_planted",
        severity: Severity::Alert,
        fields: json!({ "path": crate::jpath(&e.path), "kind": e.kind.name(), "found": what,
                        "dangerous_keys": keys, "action": action, "quarantine": qpath.as_deref().map(crate::jpath) }),
        line: format!(
            "alert: planted repository: {}: {} -> {}",
            escape::path(&e.path),
            escape::terminal(&what),
            escape::terminal(&action)
        ),
    });
}

/// A repository of the user's (same device and inode) whose deciding files
/// changed: HEAD, config, commondir and a .git file are written back as they
/// were (removed when they did not exist), hooks that appeared or changed
/// are quarantined. Returns whether something was done.
fn restore_content(e: &Entry, b: &Entry, q: &mut Quarantine, out: &mut After) -> bool {
    let mut restored = Vec::new();
    let mut quarantined = Vec::new();
    let mut errors = Vec::new();
    let owner = crate::fsutil::owner(&e.path);
    let mut put = |rel: &str, p: PathBuf, old: &Option<Vec<u8>>, new: &Option<Vec<u8>>| {
        if old == new {
            return;
        }
        let r = match old {
            Some(bytes) => {
                let _ = fs::remove_file(&p);
                crate::fsutil::write_atomic(&p, bytes, 0o644, owner)
            }
            None => crate::fsutil::remove(&p),
        };
        match r {
            Ok(()) => restored.push(rel.to_string()),
            Err(x) => errors.push(format!("{rel}: {x}")),
        }
    };
    if e.kind == Kind::GitFile {
        // A .git symlink rewritten in place cannot be (a symlink has no
        // content to rewrite); a file can.
        put(
            ".git",
            e.path.clone(),
            &b.content.gitfile,
            &e.content.gitfile,
        );
    } else {
        put(
            "config",
            e.path.join("config"),
            &b.content.config,
            &e.content.config,
        );
        put(
            "commondir",
            e.path.join("commondir"),
            &b.content.commondir,
            &e.content.commondir,
        );
        put(
            "config.worktree",
            e.path.join("config.worktree"),
            &b.content.config_worktree,
            &e.content.config_worktree,
        );
        if e.content.hooks_ident != b.content.hooks_ident && e.content.hooks_ident.is_some() {
            // hooks/ itself replaced (or a symlink now): all of it goes.
            match q.take(&e.path.join("hooks")) {
                Ok(_) => quarantined.push("hooks".to_string()),
                Err(x) => errors.push(format!("hooks: {x}")),
            }
        } else if let Some(now) = &e.content.hooks {
            let was = b.content.hooks.clone().unwrap_or_default();
            for (name, id) in now {
                if was.get(name) != Some(id) {
                    let p = e.path.join("hooks").join(name);
                    match q.take(&p) {
                        Ok(_) => quarantined.push(format!("hooks/{}", name.to_string_lossy())),
                        Err(x) => errors.push(format!("hooks/{}: {x}", name.to_string_lossy())),
                    }
                }
            }
        }
    }
    if restored.is_empty() && quarantined.is_empty() && errors.is_empty() {
        return false;
    }
    if !errors.is_empty() {
        out.failed = Some(format!("{}: {}", e.path.display(), errors.join("; ")));
    }
    let action = if errors.is_empty() {
        "restored".to_string()
    } else {
        format!("restore failed: {}", errors.join("; "))
    };
    out.findings.push(Finding {
        event: "git_repo_changed",
        severity: Severity::Alert,
        fields: json!({ "path": crate::jpath(&e.path), "kind": e.kind.name(), "restored": restored,
                        "quarantined": quarantined, "action": action,
                        "quarantine": q.run.as_deref().map(crate::jpath) }),
        line: format!(
            "alert: the user's repository {} was changed ({}) -> {}",
            escape::path(&e.path),
            escape::terminal(&[restored.clone(), quarantined.clone()].concat().join(", ")),
            escape::terminal(&action)
        ),
    });
    true
}

#[derive(Args, Debug)]
pub struct PlantsArgs {
    /// The directories and the scan limit (the flags; sbx-spec).
    #[command(flatten)]
    pub spec: sbx_spec::PlantsSpec,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<OsString>,
}

/// `sbx-gitguard plants --dir DIR... -- CMD`: snapshot the repositories of
/// the writable directories, run the command, quarantine what was planted.
pub fn cmd_plants(args: PlantsArgs) -> Result<i32, Failure> {
    let plants = Plants::start(&args.spec)?;
    // From here to the end, termination signals are held back: while the
    // command runs the supervisor forwards them (the command decides when
    // to end), and the check afterwards is the protection, so a SIGTERM
    // must not skip it (sbx-gitguard lets them in elsewhere: see sig.rs).
    let _hold = crate::sig::Hold::new();
    let mut cmd = sbx_core::supervise::command(&args.cmd, None)?;
    let keep: Vec<i32> = sbx_core::audit::get()
        .and_then(|au| au.handoff(&args.cmd[0], &mut cmd))
        .into_iter()
        .collect();
    let code = {
        let mut sup = sbx_core::supervise::Supervisor::spawn(cmd, &keep)?;
        sup.run_to_end()
            .map_err(|e| Failure::new(format!("waiting for the command: {e}")))?
    };
    match plants.finish() {
        Some(f) => Err(f),
        None => Ok(code),
    }
}

/// The plant check around one command: [`Plants::start`] before it,
/// [`Plants::finish`] after it (`plants`, and `run --plants` in the same
/// process as the repository's own check).
pub struct Plants {
    roots: Vec<PathBuf>,
    qbases: Vec<PathBuf>,
    max_entries: u64,
    before: Inventory,
}

impl Plants {
    /// Checks the flags and the quarantine, and takes the inventory of the
    /// directories (refused, with a `plant_scan_budget` alert, over
    /// `--max-entries`: nothing is run then).
    pub fn start(a: &sbx_spec::PlantsSpec) -> Result<Plants, Failure> {
        let mut roots = Vec::new();
        for d in &a.dirs {
            let c = fs::canonicalize(d)
                .map_err(|e| Failure::new(format!("--dir {}: {e}", d.display())))?;
            if !c.is_dir() {
                return Err(Failure::new(format!(
                    "--dir {}: not a directory",
                    d.display()
                )));
            }
            roots.push(c);
        }
        let qbases = match &a.quarantine {
            Some(q) => vec![q.clone()],
            None => sbx_core::registry::default_quarantines(),
        };
        let qbases: Vec<PathBuf> = if a.quarantine.is_some() {
            qbases
        } else {
            // A default inside a writable directory (by path, identity or a
            // bind mount aliasing it) is skipped, not refused.
            qbases
                .into_iter()
                .filter(|q| quarantine_inside(q, &roots).is_none())
                .collect()
        };
        for q in &qbases {
            if !q.is_absolute() {
                return Err(Failure::new(format!(
                    "--quarantine {}: must be an absolute path",
                    q.display()
                )));
            }
            if let Some(r) = quarantine_inside(q, &roots) {
                return Err(Failure::new(format!(
                    "--quarantine {}: inside {}, where the command can write",
                    q.display(),
                    r.display()
                )));
            }
        }
        let before = match scan(&roots, a.max_entries) {
            Ok(b) => b,
            Err(e) => {
                crate::audit(
                    "plant_scan_budget",
                    Severity::Alert,
                    json!({ "reason": e.to_string(), "max_entries": a.max_entries, "action": "refused: the command did not run" }),
                );
                return Err(Failure::new(format!(
                    "{}; nothing was run (raise --max-entries or narrow the writable directories)",
                    e
                )));
            }
        };
        if before.too_deep > 0 {
            let f = too_deep_finding(&before);
            crate::audit(f.event, f.severity, f.fields.clone());
            say!("{}: {}", crate::TOOL, f.line);
        }
        crate::audit(
            "git_plant_snapshot",
            Severity::Info,
            json!({ "dirs": roots.iter().map(|r| crate::jpath(r)).collect::<Vec<_>>(), "repositories": before.entries.len(), "entries": before.scanned }),
        );
        Ok(Plants {
            roots,
            qbases,
            max_entries: a.max_entries,
            before,
        })
    }

    /// After the command: quarantines what was planted, puts back and
    /// restores the user's repositories, and reports. Some(failure) when
    /// the check could not be completed (exit 125).
    pub fn finish(self) -> Option<Failure> {
        let mut q = Quarantine::new(self.qbases);
        let after = check_after(&self.roots, &self.before, self.max_entries, &mut q);
        for f in &after.findings {
            crate::audit(f.event, f.severity, f.fields.clone());
            say!("{}: {}", crate::TOOL, f.line);
        }
        crate::audit(
            "git_plants_checked",
            if after.findings.is_empty() {
                Severity::Info
            } else {
                Severity::Alert
            },
            json!({ "dirs": self.roots.iter().map(|r| crate::jpath(r)).collect::<Vec<_>>(), "findings": after.findings.len(), "failed": after.failed }),
        );
        after
            .failed
            .map(|f| Failure::new(format!("planted repositories: {}", f)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_forms_git_accepts() {
        let t = tempfile::tempdir().unwrap();
        let h = t.path().join("HEAD");
        for (text, ok) in [
            ("ref: refs/heads/main\n", true),
            ("ref:   refs/x", true),
            ("ref: HEAD", false),
            ("0123456789012345678901234567890123456789", true),
            ("0123456789", false),
            ("garbage", false),
        ] {
            fs::write(&h, text).unwrap();
            assert_eq!(valid_head(&h), ok, "{text:?}");
        }
        fs::remove_file(&h).unwrap();
        std::os::unix::fs::symlink("refs/heads/main", &h).unwrap();
        assert!(valid_head(&h));
    }

    #[test]
    fn executable_files_count_as_enterable_and_commondir_is_followed() {
        let t = tempfile::tempdir().unwrap();
        let g = t.path().join("g");
        fs::create_dir(&g).unwrap();
        fs::write(g.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        fs::write(g.join("objects"), "").unwrap();
        fs::write(g.join("refs"), "").unwrap();
        assert!(!is_git_directory(&g));
        for n in ["objects", "refs"] {
            fs::set_permissions(g.join(n), fs::Permissions::from_mode(0o755)).unwrap();
        }
        assert!(is_git_directory(&g));
        let h = t.path().join("h");
        fs::create_dir_all(h.join("x")).unwrap();
        fs::write(h.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        assert!(!is_git_directory(&h));
        fs::write(h.join("commondir"), "../g\n").unwrap();
        assert!(is_git_directory(&h));
    }
}
