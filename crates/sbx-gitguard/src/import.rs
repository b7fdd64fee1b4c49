//! Importing a git stage into the real repository: objects read through
//! libgit2 with hash verification and written into the real object store,
//! ref updates and HEAD checked one by one, never a file copied blindly.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use sbx_core::Severity;
use serde_json::{Value as Json, json};

use crate::refs::{self, Value};
use crate::stage::{self, Paths};

/// Bounds on what an import reads.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Files in the stage plus objects read.
    pub max_objects: u64,
    /// Bytes of object files (loose objects and packs) in the stage.
    pub max_bytes: u64,
}

/// Alerts of one kind beyond this many are counted, not logged one by one.
const ALERTS_PER_EVENT: usize = 20;
/// The same for info and warn events (a legitimate fetch can bring
/// thousands of tags).
const NOTES_PER_EVENT: usize = 1000;

/// Events of an import, rate-limited per event name.
#[derive(Debug, Default)]
pub struct Events {
    pub list: Vec<(&'static str, Severity, Json)>,
    counts: BTreeMap<(&'static str, u8), usize>,
    pub suppressed: BTreeMap<(&'static str, u8), usize>,
}

fn sev_key(s: Severity) -> u8 {
    match s {
        Severity::Info => 0,
        Severity::Warn => 1,
        Severity::Alert => 2,
    }
}

impl Events {
    pub fn push(&mut self, event: &'static str, sev: Severity, fields: Json) {
        let k = (event, sev_key(sev));
        let c = self.counts.entry(k).or_default();
        *c += 1;
        let cap = if sev == Severity::Alert {
            ALERTS_PER_EVENT
        } else {
            NOTES_PER_EVENT
        };
        if *c > cap {
            if sev == Severity::Alert {
                sbx_core::audit::budget_exhausted(event, json!({ "cap": cap }));
            }
            *self.suppressed.entry(k).or_default() += 1;
            return;
        }
        self.list.push((event, sev, fields));
    }
    /// Appends one `<event>` line per suppressed kind with its count.
    pub fn finish(&mut self) {
        for ((e, k), n) in std::mem::take(&mut self.suppressed) {
            let sev = match k {
                0 => Severity::Info,
                1 => Severity::Warn,
                _ => Severity::Alert,
            };
            self.list.push((
                e,
                sev,
                json!({ "suppressed": n, "reason": "more of the same; not logged one by one" }),
            ));
        }
    }
    pub fn alerts(&self) -> impl Iterator<Item = &(&'static str, Severity, Json)> {
        self.list.iter().filter(|e| e.1 == Severity::Alert)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_rate_limited_with_a_count() {
        let mut ev = Events::default();
        for i in 0..100 {
            ev.push("ref_refused", Severity::Alert, json!({ "i": i }));
        }
        for i in 0..1500 {
            ev.push("ref_imported", Severity::Info, json!({ "i": i }));
        }
        ev.finish();
        assert_eq!(ev.alerts().count(), 21);
        let last = ev.alerts().last().unwrap();
        assert_eq!(last.2["suppressed"], 80);
        let info: Vec<_> = ev.list.iter().filter(|e| e.1 == Severity::Info).collect();
        assert_eq!(info.len(), 1001);
        assert_eq!(info.last().unwrap().2["suppressed"], 500);
    }

    #[test]
    fn namespaces() {
        assert!(allowed_name("refs/heads/x"));
        assert!(allowed_name("refs/stash"));
        assert!(!allowed_name("refs/stashes"));
        assert!(!allowed_name("refs/replace/abc"));
        assert!(!allowed_name("HEAD"));
    }
}

/// What the import changed, for the verification that follows: refs set
/// (Some) or deleted (None), and whether HEAD changed.
#[derive(Debug, Default)]
pub struct Outcome {
    pub refs: BTreeMap<String, Option<Value>>,
    pub head_changed: bool,
    pub objects_written: u64,
    pub objects_present: u64,
    /// Inflated bytes of the new objects read.
    pub bytes_inflated: u64,
    /// The sandbox's index (whole-.git overlay) replaced the host's.
    pub index_replaced: bool,
    /// A limit was exceeded: nothing was imported.
    pub exceeded: Option<String>,
    /// Linked worktree git dirs the import wrote, and removed (worktree.rs).
    pub worktrees: crate::worktree::Applied,
}

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("cannot open the repository {0}: {1}")]
    Repo(PathBuf, String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the repository's object store refused a write: {0}")]
    Write(String),
}

impl ImportError {
    /// Another import of the repository held it too long: nothing was
    /// written, the stage can be imported later.
    pub fn busy(&self) -> bool {
        matches!(self, ImportError::Io { source, .. } if source.kind() == io::ErrorKind::WouldBlock)
    }
}

/// Namespaces the sandbox may write (and, as commit ids only, the bisect
/// marks and rebase labels of an operation in progress:
/// `inprogress::commit_ref`). Everything else (refs/replace changes what
/// git shows; refs/original, ... are not agent work) is refused.
pub const ALLOWED: &[&str] = &["refs/heads/", "refs/tags/", "refs/remotes/", "refs/notes/"];

pub fn allowed_name(name: &str) -> bool {
    name == "refs/stash" || ALLOWED.iter().any(|p| name.starts_with(p))
}

pub(crate) fn is_whiteout(m: &fs::Metadata) -> bool {
    m.file_type().is_char_device() && m.rdev() == 0
}

pub(crate) fn is_opaque(p: &Path) -> bool {
    for n in ["trusted.overlay.opaque", "user.overlay.opaque"] {
        if xattr_get(p, n).is_some_and(|v| v == b"y") {
            return true;
        }
    }
    false
}

fn xattr_get(p: &Path, name: &str) -> Option<Vec<u8>> {
    let cp = std::ffi::CString::new(p.as_os_str().as_bytes()).ok()?;
    let cn = std::ffi::CString::new(name).ok()?;
    let mut buf = [0u8; 16];
    // SAFETY: both strings are NUL-terminated and live across the call; the
    // kernel writes at most `buf.len()` bytes into `buf`.
    let n =
        unsafe { libc::lgetxattr(cp.as_ptr(), cn.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return None;
    }
    Some(buf[..n as usize].to_vec())
}

fn rel(base: &Path, p: &Path) -> String {
    p.strip_prefix(base)
        .unwrap_or(p)
        .to_string_lossy()
        .into_owned()
}

/// The object files found in the stage's upper objects dir.
#[derive(Default)]
struct Found {
    loose: Vec<(PathBuf, String)>,
    packs: Vec<(PathBuf, PathBuf)>,
    files: u64,
    bytes: u64,
    skipped: u64,
    whiteouts: u64,
}

fn hexname(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// What the sandbox left at the top of one of the upper layer's
/// directories (`objects`, `refs`). The sandbox made them (they are copies
/// up of the host's directories, or whatever it put in their place), so the
/// root is checked like every entry below it: a symlink is never followed
/// (it could name any directory the host user can read).
enum Root {
    /// Not in the upper layer: the sandbox left the host's as it was.
    Absent,
    /// Removed (`rm -rf .git/refs`): a whiteout.
    Whiteout,
    Dir,
    /// A symlink, a file, a device: refused.
    Other(&'static str),
}

fn root(p: &Path) -> Root {
    match fs::symlink_metadata(p) {
        Err(_) => Root::Absent,
        Ok(m) if is_whiteout(&m) => Root::Whiteout,
        Ok(m) if m.is_dir() => Root::Dir,
        Ok(m) if m.file_type().is_symlink() => Root::Other("symbolic link (never followed)"),
        Ok(_) => Root::Other("not a directory"),
    }
}

fn scan_objects(upper: &Path, ev: &mut Events, limits: &Limits) -> Result<Found, String> {
    let mut f = Found::default();
    match root(upper) {
        Root::Dir => {}
        Root::Absent => return Ok(f),
        // `rm -rf .git/objects`: the import never deletes an object.
        Root::Whiteout => {
            f.whiteouts += 1;
            return Ok(f);
        }
        Root::Other(why) => {
            ev.push(
                "stage_entry_refused",
                Severity::Alert,
                json!({ "path": "objects", "reason": why }),
            );
            return Ok(f);
        }
    }
    let mut stack = vec![(upper.to_path_buf(), 0usize)];
    while let Some((d, depth)) = stack.pop() {
        let rd = fs::read_dir(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        for e in rd.filter_map(|e| e.ok()) {
            f.files += 1;
            if f.files > limits.max_objects {
                return Err(format!(
                    "more than {} files in the stage's objects (--stage-max-objects)",
                    limits.max_objects
                ));
            }
            let p = e.path();
            let Ok(m) = fs::symlink_metadata(&p) else {
                continue;
            };
            let r = rel(upper, &p);
            if is_whiteout(&m) {
                f.whiteouts += 1;
                continue;
            }
            let ft = m.file_type();
            if ft.is_symlink() {
                ev.push(
                    "stage_entry_refused",
                    Severity::Alert,
                    json!({ "path": format!("objects/{r}"), "reason": "symbolic link (never followed)" }),
                );
                continue;
            }
            if ft.is_dir() {
                if depth < 3 {
                    stack.push((p, depth + 1));
                }
                continue;
            }
            if !ft.is_file() {
                ev.push(
                    "stage_entry_refused",
                    Severity::Alert,
                    json!({ "path": format!("objects/{r}"), "reason": "not a regular file" }),
                );
                continue;
            }
            let parts: Vec<&str> = r.split('/').collect();
            match parts.as_slice() {
                [dir, name] if hexname(dir, 2) && (hexname(name, 38) || hexname(name, 62)) => {
                    f.bytes += m.len();
                    f.loose.push((p.clone(), format!("{dir}{name}")));
                }
                ["pack", name] if name.starts_with("pack-") && name.ends_with(".pack") => {
                    let idx = p.with_extension("idx");
                    if fs::symlink_metadata(&idx).is_ok_and(|m| m.is_file()) {
                        f.bytes +=
                            m.len() + fs::symlink_metadata(&idx).map(|m| m.len()).unwrap_or(0);
                        f.packs.push((p.clone(), idx));
                    } else {
                        f.skipped += 1;
                    }
                }
                _ => f.skipped += 1,
            }
            if f.bytes > limits.max_bytes {
                return Err(format!(
                    "more than {} bytes of objects in the stage (--stage-max-bytes)",
                    limits.max_bytes
                ));
            }
        }
    }
    Ok(f)
}

/// Copies a regular file (never through a symlink) into `to`.
fn copy_nofollow(from: &Path, to: &Path) -> io::Result<()> {
    let mut src = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(from)?;
    if !src.metadata()?.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    if let Some(p) = to.parent() {
        fs::create_dir_all(p)?;
    }
    let mut dst = fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .open(to)?;
    io::copy(&mut src, &mut dst)?;
    Ok(())
}

/// As root for another user's repository: gives what libgit2 created
/// (owned by root) to the owner of the git dir, from `base` down to `p`.
pub(crate) fn give_back(git_dir: &Path, rel_path: &str, owner: Option<(u32, u32)>) {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let Some((u, g)) = owner else { return };
    if nix::unistd::geteuid().as_raw() != 0 || u == 0 {
        return;
    }
    // Walked by fd, never by path: the repository's owner can swap a
    // component for a symlink meanwhile, and root must not chown what it
    // names. A symlink is neither followed nor changed.
    let open = |at: libc::c_int, name: &std::ffi::CStr| -> Option<OwnedFd> {
        // SAFETY: name is NUL-ended and alive for the call; `at` is an open
        // fd or AT_FDCWD.
        let fd = unsafe {
            libc::openat(
                at,
                name.as_ptr(),
                libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        // SAFETY: a new fd that nothing else owns.
        (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
    };
    let Ok(top) = std::ffi::CString::new(git_dir.as_os_str().as_bytes()) else {
        return;
    };
    let Some(mut at) = open(libc::AT_FDCWD, &top) else {
        return;
    };
    for c in rel_path.split('/') {
        // Only names below the git dir: never up or in place.
        if c.is_empty() || c == "." || c == ".." {
            return;
        }
        let Ok(name) = std::ffi::CString::new(c) else {
            return;
        };
        let Some(fd) = open(at.as_raw_fd(), &name) else {
            return;
        };
        let Ok(m) = nix::sys::stat::fstat(&fd) else {
            return;
        };
        if m.st_mode & libc::S_IFMT == libc::S_IFLNK {
            return;
        }
        if m.st_uid == 0 {
            // SAFETY: `fd` is open; the empty path with AT_EMPTY_PATH names
            // it; no pointer is kept.
            unsafe {
                libc::fchownat(fd.as_raw_fd(), c"".as_ptr(), u, g, libc::AT_EMPTY_PATH);
            }
        }
        at = fd;
    }
}

/// New objects are first written into a quarantine (a private bare
/// repository that also sees the real store as an alternate, as git's
/// receive-pack quarantine does) and move into the real store only when an
/// accepted ref or HEAD needs them with a complete history (blobs also
/// when the sandbox's index names them at a path git fsck --strict
/// accepts). So a refused or partial history never leaves a broken link
/// behind, and no blob nothing names comes in unchecked.
struct Quarantine {
    q: git2::Repository,
    new: BTreeMap<git2::Oid, git2::ObjectType>,
    migrated: HashSet<git2::Oid>,
    /// The gate in front of libgit2's reads of the real store's loose
    /// objects (the snapshot no longer stats each one, issue 19).
    host: crate::objects::Damaged<'static>,
}

impl Quarantine {
    fn create(dir: &Path, git_dir: &Path) -> Result<Quarantine, String> {
        let q = git2::Repository::init_bare(dir).map_err(|e| e.message().to_string())?;
        q.odb()
            .and_then(|o| o.add_disk_alternate(&git_dir.join("objects").to_string_lossy()))
            .map_err(|e| e.message().to_string())?;
        Ok(Quarantine {
            q,
            new: BTreeMap::new(),
            migrated: HashSet::new(),
            host: crate::objects::Damaged::for_git_dir(git_dir),
        })
    }

    /// Type of an object in the real store or the quarantine.
    fn kind(&self, id: git2::Oid) -> Option<git2::ObjectType> {
        if !self.new.contains_key(&id) && self.host.contains(&id) {
            return None;
        }
        self.q.odb().ok()?.read_header(id).ok().map(|(_, k)| k)
    }

    /// The new objects reachable from `id`, walking only through new ones
    /// (what the real store had was checked when the snapshot was taken),
    /// or the first object that is missing.
    fn closure(&self, id: git2::Oid) -> Result<Vec<git2::Oid>, String> {
        let odb = self.q.odb().map_err(|e| e.message().to_string())?;
        let mut seen: HashSet<git2::Oid> = HashSet::new();
        let mut out = Vec::new();
        let mut todo = vec![id];
        while let Some(o) = todo.pop() {
            if !seen.insert(o) {
                continue;
            }
            if !self.new.contains_key(&o) {
                if !odb.exists(o) {
                    return Err(o.to_string());
                }
                continue;
            }
            out.push(o);
            todo.extend(self.links(o).ok_or_else(|| o.to_string())?);
        }
        Ok(out)
    }

    /// `ids` ordered so that each comes after the ones of `ids` it names
    /// (a depth-first post-order: trees after their entries, commits after
    /// their tree and parents, tags after their target).
    fn links_first(&self, ids: &[git2::Oid]) -> Vec<git2::Oid> {
        let set: HashSet<git2::Oid> = ids.iter().copied().collect();
        let mut done: HashSet<git2::Oid> = HashSet::new();
        let mut out = Vec::with_capacity(ids.len());
        for &root in ids {
            // (object, its links expanded)
            let mut stack = vec![(root, false)];
            while let Some((o, expanded)) = stack.pop() {
                if done.contains(&o) {
                    continue;
                }
                if expanded {
                    done.insert(o);
                    out.push(o);
                    continue;
                }
                stack.push((o, true));
                for l in self.links(o).unwrap_or_default() {
                    if set.contains(&l) && !done.contains(&l) {
                        stack.push((l, false));
                    }
                }
            }
        }
        out
    }

    /// The objects `id` names (a gitlink names none here: it is another
    /// repository's commit); None when it cannot be read.
    fn links(&self, id: git2::Oid) -> Option<Vec<git2::Oid>> {
        // A blob names nothing: not read again (it may be large).
        if self.new.get(&id) == Some(&git2::ObjectType::Blob) {
            return Some(Vec::new());
        }
        let obj = self.q.find_object(id, None).ok()?;
        Some(match obj.kind() {
            Some(git2::ObjectType::Commit) => {
                let c = obj.as_commit()?;
                std::iter::once(c.tree_id()).chain(c.parent_ids()).collect()
            }
            Some(git2::ObjectType::Tree) => obj
                .as_tree()?
                .iter()
                .filter(|e| e.kind() != Some(git2::ObjectType::Commit))
                .map(|e| e.id())
                .collect(),
            Some(git2::ObjectType::Tag) => vec![obj.as_tag()?.target_id()],
            _ => Vec::new(),
        })
    }

    /// Moves objects from the quarantine into the real store.
    fn migrate(
        &mut self,
        ids: &[git2::Oid],
        real: &git2::Odb,
        written: &mut Vec<String>,
    ) -> Result<(), String> {
        let qodb = self.q.odb().map_err(|e| e.message().to_string())?;
        for &id in ids {
            if self.migrated.contains(&id) || real.exists(id) {
                self.migrated.insert(id);
                continue;
            }
            let obj = qodb
                .read(id)
                .map_err(|e| format!("reading {id} back: {}", e.message()))?;
            let w = real
                .write(obj.kind(), obj.data())
                .map_err(|e| format!("writing {id}: {}", e.message()))?;
            if w != id {
                return Err(format!("object {id} hashed to {w} when written"));
            }
            self.migrated.insert(id);
            let s = id.to_string();
            written.push(format!("objects/{}/{}", &s[..2], &s[2..]));
        }
        Ok(())
    }
}

fn open_source(src_dir: &Path) -> Result<git2::Odb<'static>, git2::Error> {
    let o = git2::Odb::new()?;
    o.add_disk_alternate(&src_dir.to_string_lossy())?;
    Ok(o)
}

/// The object store as the import leaves it, for the in-progress state
/// (inprogress.rs): an object must exist and have a complete history.
struct After<'a>(&'a Quarantine);

impl crate::inprogress::Objects for After<'_> {
    fn need(&self, hex: &str, want: crate::inprogress::Want) -> Result<Vec<git2::Oid>, String> {
        let id = git2::Oid::from_str(hex).map_err(|_| format!("'{hex}' is not an object id"))?;
        let kind = self
            .0
            .kind(id)
            .ok_or_else(|| format!("object {hex} does not exist"))?;
        let k = match want {
            crate::inprogress::Want::Commit => git2::ObjectType::Commit,
            crate::inprogress::Want::Tree => git2::ObjectType::Tree,
        };
        if kind != k {
            return Err(format!("object {hex} is a {kind}, not a {k}"));
        }
        self.0
            .closure(id)
            .map_err(|m| format!("incomplete history: object {m} is missing"))
    }
    fn need_short(
        &self,
        hex: &str,
        want: crate::inprogress::Want,
    ) -> Result<Vec<git2::Oid>, String> {
        let odb = self.0.q.odb().map_err(|e| e.message().to_string())?;
        let id = git2::Oid::from_str(hex)
            .and_then(|s| odb.exists_prefix(s, hex.len()))
            .map_err(|_| format!("{hex} names no object, or more than one"))?;
        self.need(&id.to_string(), want)
    }
}

/// Phase one for one source (a private dir holding loose objects or one
/// pack): lists its objects and counts the new ones against the limits,
/// reading only headers. Nothing is written.
fn list_source(
    src_dir: &Path,
    label: &str,
    real: &git2::Odb,
    out: &mut Outcome,
    read_count: &mut u64,
    limits: &Limits,
    ev: &mut Events,
) -> Result<Vec<git2::Oid>, String> {
    let odb = match open_source(src_dir) {
        Ok(o) => o,
        Err(e) => {
            ev.push(
                "object_refused",
                Severity::Alert,
                json!({ "path": label, "reason": e.message() }),
            );
            return Ok(Vec::new());
        }
    };
    let mut ids = Vec::new();
    if let Err(e) = odb.foreach(|id| {
        ids.push(*id);
        (ids.len() as u64) <= limits.max_objects
    }) && (ids.len() as u64) <= limits.max_objects
    {
        ev.push(
            "object_refused",
            Severity::Alert,
            json!({ "path": label, "reason": format!("cannot list its objects: {}", e.message()) }),
        );
        return Ok(Vec::new());
    }
    let mut fresh = Vec::new();
    for id in ids {
        *read_count += 1;
        if *read_count > limits.max_objects {
            return Err(format!(
                "more than {} objects in the stage (--stage-max-objects)",
                limits.max_objects
            ));
        }
        if real.exists(id) {
            out.objects_present += 1;
            continue;
        }
        // Inflated size from the header: a small object file can inflate
        // to a huge object (a zlib bomb).
        if let Ok((size, _)) = odb.read_header(id) {
            out.bytes_inflated += size as u64;
            if out.bytes_inflated > limits.max_bytes {
                return Err(format!(
                    "more than {} bytes of new objects (inflated) in the stage (--stage-max-bytes)",
                    limits.max_bytes
                ));
            }
        }
        fresh.push(id);
    }
    Ok(fresh)
}

/// Phase two: reads each new object with hash verification (strict hash
/// verification is on: a read checks the content hashes to the name it is
/// read under) and writes it into the quarantine.
fn quarantine_source(
    src_dir: &Path,
    label: &str,
    ids: &[git2::Oid],
    quar: &mut Quarantine,
    ev: &mut Events,
) -> Result<(), String> {
    let Ok(odb) = open_source(src_dir) else {
        return Ok(());
    };
    let qodb = quar.q.odb().map_err(|e| e.message().to_string())?;
    for &id in ids {
        if quar.new.contains_key(&id) {
            continue;
        }
        let obj = match odb.read(id) {
            Ok(o) => o,
            Err(e) => {
                ev.push(
                    "object_refused",
                    Severity::Alert,
                    json!({ "path": label, "object": id.to_string(), "reason": e.message() }),
                );
                continue;
            }
        };
        // git fsck --strict's object checks (crate::fsck) before the store.
        if let Err(reason) = crate::fsck::check_git2(&obj, &odb, &qodb, &quar.host) {
            ev.push(
                "object_refused",
                Severity::Alert,
                json!({ "path": label, "object": id.to_string(), "reason": reason }),
            );
            continue;
        }
        let w = qodb
            .write(obj.kind(), obj.data())
            .map_err(|e| format!("quarantine {id}: {}", e.message()))?;
        if w != id {
            ev.push(
                "object_refused",
                Severity::Alert,
                json!({ "path": label, "object": id.to_string(), "reason": format!("hashes to {w}") }),
            );
            continue;
        }
        quar.new.insert(id, obj.kind());
    }
    Ok(())
}

/// A candidate ref change from the stage.
enum Change {
    Set(Vec<u8>),
    Whiteout,
}

fn scan_refs(
    upper: &Path,
    git_dir: &Path,
    ev: &mut Events,
    limits: &Limits,
) -> Result<BTreeMap<String, Change>, String> {
    let mut out = BTreeMap::new();
    match root(upper) {
        Root::Dir => {}
        Root::Absent => return Ok(out),
        // `rm -rf .git/refs`: every loose ref the host has is removed (and
        // goes through the rules like any deletion).
        Root::Whiteout => {
            for r in loose_below(git_dir, &git_dir.join("refs")) {
                out.insert(r, Change::Whiteout);
            }
            return Ok(out);
        }
        Root::Other(why) => {
            ev.push(
                "stage_entry_refused",
                Severity::Alert,
                json!({ "path": "refs", "reason": why }),
            );
            return Ok(out);
        }
    }
    let mut n = 0u64;
    let mut stack = vec![(upper.to_path_buf(), 0usize)];
    while let Some((d, depth)) = stack.pop() {
        let rd = fs::read_dir(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        for e in rd.filter_map(|e| e.ok()) {
            n += 1;
            if n > limits.max_objects {
                return Err(format!(
                    "more than {} files in the stage's refs (--stage-max-objects)",
                    limits.max_objects
                ));
            }
            let p = e.path();
            let name = format!("refs/{}", rel(upper, &p));
            let Ok(m) = fs::symlink_metadata(&p) else {
                continue;
            };
            if is_whiteout(&m) {
                // A whited-out directory deletes every loose ref below it.
                let lower = git_dir.join(&name);
                if fs::symlink_metadata(&lower).is_ok_and(|m| m.is_dir()) {
                    for r in loose_below(git_dir, &lower) {
                        out.insert(r, Change::Whiteout);
                    }
                } else {
                    out.insert(name, Change::Whiteout);
                }
                continue;
            }
            let ft = m.file_type();
            if ft.is_dir() {
                if depth < 32 {
                    stack.push((p, depth + 1));
                }
                continue;
            }
            if e.file_name().as_bytes().ends_with(b".lock") && ft.is_file() {
                // A lock left by a git process that was killed: not a ref.
                continue;
            }
            if ft.is_symlink() || !ft.is_file() {
                ev.push(
                    "ref_refused",
                    Severity::Alert,
                    json!({ "ref": name, "reason": if ft.is_symlink() { "symbolic link in the stage (never followed)" } else { "not a regular file" } }),
                );
                continue;
            }
            match stage::read_small(&p, 4096) {
                Ok(b) => {
                    out.insert(name, Change::Set(b));
                }
                Err(e) => ev.push(
                    "ref_refused",
                    Severity::Alert,
                    json!({ "ref": name, "reason": format!("unreadable: {e}") }),
                ),
            }
        }
        // An opaque directory hides every lower entry it does not list:
        // the real loose refs below it that the stage does not have were
        // deleted (refs/ itself too: `rm -rf .git/refs; mkdir .git/refs`).
        if is_opaque(&d) {
            let lower = git_dir.join("refs").join(rel(upper, &d));
            for r in loose_below(git_dir, &lower) {
                let in_upper = upper.join(r.strip_prefix("refs/").unwrap_or(&r));
                if fs::symlink_metadata(&in_upper).is_err() {
                    out.entry(r).or_insert(Change::Whiteout);
                }
            }
        }
    }
    Ok(out)
}

/// The loose refs (as `refs/...` names) in a directory of the real refs.
fn loose_below(git_dir: &Path, dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut ls = vec![(dir.to_path_buf(), 0usize)];
    while let Some((l, depth)) = ls.pop() {
        let Ok(rd) = fs::read_dir(&l) else { continue };
        for e in rd.filter_map(|e| e.ok()) {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() && depth < 32 => ls.push((p, depth + 1)),
                Ok(t) if t.is_file() => out.push(rel(git_dir, &p)),
                _ => {}
            }
        }
    }
    out
}

/// What the sandbox left at the top of the stage's git dir that is never
/// imported but would make the host's git run a command, or act on state
/// the host never had, had it been carried over: hooks, config, a
/// commondir, info/ (attributes, exclude), submodule and worktree git
/// dirs. Dropped like everything else the import does not read; logged so
/// that the attempt is seen (alert), or the dropped state known (warn).
/// (Operations in progress are carried when valid: inprogress.rs.)
const DROPPED: &[(&str, Severity)] = &[
    ("hooks", Severity::Alert),
    ("config", Severity::Alert),
    ("config.worktree", Severity::Alert),
    ("commondir", Severity::Alert),
    ("info", Severity::Warn),
    ("modules", Severity::Warn),
];

fn note_dropped(upper: &Path, ev: &mut Events) {
    for (name, sev) in DROPPED {
        match fs::symlink_metadata(upper.join(name)) {
            Ok(m) if !is_whiteout(&m) => ev.push(
                "stage_entry_dropped",
                *sev,
                json!({ "path": name, "reason": "never imported: only objects, refs, HEAD, packed-refs, index and operations in progress are" }),
            ),
            _ => {}
        }
    }
}

fn refused(ev: &mut Events, name: &str, reason: impl Into<String>) {
    ev.push(
        "ref_refused",
        Severity::Alert,
        json!({ "ref": name, "reason": reason.into() }),
    );
}

/// The current value of a ref in the real repository.
fn current(repo: &git2::Repository, name: &str) -> Option<Value> {
    let r = repo.find_reference(name).ok()?;
    match r.kind()? {
        git2::ReferenceType::Direct => r.target().map(|o| Value::Oid(o.to_string())),
        git2::ReferenceType::Symbolic => r.symbolic_target().map(|s| Value::Sym(s.to_string())),
    }
}

/// Imports the stage into the repository whose plain git dir is `git_dir`.
/// Never writes anything the rules refuse; every refusal is an alert.
///
/// The stage's upper layer holds everything git wrote in the sandbox (the
/// host's .git was its read-only lower layer): only `objects/`, `refs/`,
/// `HEAD`, `packed-refs` and `index` are read from it, each by its rules;
/// the rest (config, hooks, logs, info/, modules/, ORIG_HEAD...) never
/// reaches the host.
///
/// The steps, in order: (1) the objects, verified into a quarantine;
/// (2) the ref updates and (3) HEAD, decided; (3b) operations in progress,
/// index blobs, reflogs and linked worktrees, decided; then the
/// transaction (journal.rs): the new objects written, (4) the index
/// prepared, the decision committed and applied.
pub fn import(
    git_dir: &Path,
    stage: &Paths,
    limits: &Limits,
    sbx_id: &str,
    ev: &mut Events,
) -> Result<Outcome, ImportError> {
    let mut out = Outcome::default();
    // The usual command writes nothing in the .git it sees: an empty
    // upper layer (not even a whiteout) has nothing to import, and no
    // journal is written for it.
    let upper = stage.git_upper();
    if crate::fsutil::is_real_dir(&upper)
        && fs::read_dir(&upper).is_ok_and(|mut d| d.next().is_none())
    {
        return Ok(out);
    }
    let repo = crate::verify::open(git_dir)
        .map_err(|e| ImportError::Repo(git_dir.to_path_buf(), e.message().to_string()))?;
    let real = repo
        .odb()
        .map_err(|e| ImportError::Repo(git_dir.to_path_buf(), e.message().to_string()))?;
    let owner = crate::fsutil::owner(git_dir);
    note_dropped(&stage.git_upper(), ev);

    // 1. Objects.
    let Staged {
        found,
        private,
        quar,
    } = match stage_objects(git_dir, stage, &real, limits, &mut out, ev)? {
        Ok(s) => s,
        Err(e) => return Ok(exceeded(out, e, ev)),
    };
    // Decided first, written after the journal (journal.rs): the ref
    // updates, HEAD's, and the new objects they need.
    let mut d = Decided::default();

    // 2. Refs.
    let rc = match ref_changes(stage, git_dir, limits, ev) {
        Ok(c) => c,
        Err(e) => return Ok(exceeded(out, e, ev)),
    };
    let head_before = fs::read(git_dir.join("HEAD")).unwrap_or_default();
    // Absent from the upper layer: the sandbox left HEAD as it was. A
    // whiteout (HEAD removed), a symlink or a directory is unreadable here
    // and refused below.
    let head_stage = match fs::symlink_metadata(stage.head()) {
        Err(_) => Ok(head_before.clone()),
        Ok(_) => stage::read_small(&stage.head(), 4096),
    };
    let refs = RefRules {
        git_dir,
        repo: &repo,
        quar: &quar,
        protected: checked_out_branches(git_dir, &head_before, head_stage.as_deref().ok()),
        rc: &rc,
    };
    for (name, change) in &rc.changes {
        refs.decide(name, change, &mut d, ev);
    }

    // 3. HEAD.
    decide_head(&repo, &quar, &head_before, head_stage, &mut d, ev);

    // 3b. Operations in progress (a merge, rebase, cherry-pick, bisect the
    // sandbox left stopped), checked as data; the objects they name come in.
    let carried = crate::inprogress::plan(git_dir, &stage.git_upper(), &After(&quar), ev);
    d.objects.extend(carried.objects.iter().copied());
    index_blobs(
        &stage.index(),
        private.path(),
        index_limit(limits.max_bytes),
        &quar,
        &mut d.objects,
        ev,
    );
    // Reflogs (reflog.rs) and linked worktrees (worktree.rs) the sandbox
    // wrote, checked against the refs as this import leaves them.
    let head_after = final_head(&repo, &d.head, &d.planned);
    let after = |n: &str| match n {
        "HEAD" => head_after,
        _ => crate::reflog::value_after(&repo, &d.planned, n),
    };
    let mut need = |id: git2::Oid| quar.closure(id);
    let mut to_migrate = std::mem::take(&mut d.objects);
    let logs = crate::reflog::plan(
        &stage.git_upper(),
        git_dir,
        limits.max_objects,
        ev,
        &mut need,
        &after,
        &mut to_migrate,
    );
    let worktrees = crate::worktree::plan(
        &stage.git_upper(),
        git_dir,
        ev,
        &mut need,
        &|id| quar.kind(id) == Some(git2::ObjectType::Commit),
        &after,
        &mut to_migrate,
    );
    let mut seen = HashSet::new();
    to_migrate.retain(|id| seen.insert(*id) && !real.exists(*id));
    // Written in an order where every object comes after those it names:
    // any prefix that a SIGKILL leaves is closed under links (git fsck
    // checks the links of unreachable objects too), so an undone import
    // can leave what it wrote (journal.rs).
    let to_migrate = quar.links_first(&to_migrate);

    // The transaction (journal.rs): pending (objects listed) -> objects
    // written, index prepared -> committed -> refs, HEAD, index -> done.
    let jio = |e: io::Error| ImportError::Io {
        path: git_dir.join(crate::journal::DIR),
        source: e,
    };
    let journal = crate::journal::Journal::begin(git_dir, &to_migrate, ev).map_err(jio)?;
    let mut quar = quar;
    let written = write_objects(git_dir, owner, journal, &mut quar, &real, &to_migrate, ev)?;
    let journal = written.journal;
    out.objects_written = written.paths.len() as u64;
    if !quar.new.is_empty() || found.skipped > 0 || found.whiteouts > 0 {
        ev.push(
            "objects_imported",
            Severity::Info,
            json!({
                "written": out.objects_written,
                "present": out.objects_present,
                "not_needed": quar.new.len() as u64 - out.objects_written.min(quar.new.len() as u64),
                "skipped_files": found.skipped,
                "whiteouts_ignored": found.whiteouts,
            }),
        );
    }
    drop(quar);
    drop(private);

    // 4. The index, prepared beside the journal; HEAD as it will be.
    let head_commit = final_head(&repo, &d.head, &d.planned);
    let index = take_index(
        git_dir,
        &stage.index(),
        &journal.index_new(),
        head_commit,
        owner,
        index_limit(limits.max_bytes),
        ev,
    );
    crate::journal::crash_point();
    let c = crate::journal::Committed {
        version: 1,
        sbx_id: sbx_id.to_string(),
        refs: d.refs,
        head: d.head,
        index,
    };
    if let Err(e) = journal.commit(&c) {
        drop(journal);
        let _ = crate::journal::recover(git_dir, ev);
        return Err(jio(e));
    }
    let applied = crate::journal::apply(git_dir, &journal.dir, &c, ev);
    for (name, v) in applied.refs {
        out.refs.insert(name, v);
    }
    out.head_changed = applied.head_changed;
    out.index_replaced = applied.index_replaced;
    crate::inprogress::apply(git_dir, &carried, owner, ev);
    journal.finish().map_err(jio)?;
    crate::reflog::apply(git_dir, &logs, owner, ev);
    out.worktrees = crate::worktree::apply(
        git_dir,
        worktrees,
        &stage.dir,
        owner,
        index_limit(limits.max_bytes),
        ev,
    );
    Ok(out)
}

/// What the import decided to write (nothing is written while deciding).
#[derive(Default)]
struct Decided {
    /// The ref updates, in the journal's form.
    refs: Vec<crate::journal::RefOp>,
    /// Each updated ref's value after the import (None: deleted).
    planned: BTreeMap<String, Option<Value>>,
    /// HEAD's update (old, new text).
    head: Option<(String, String)>,
    /// The new objects the accepted updates need.
    objects: Vec<git2::Oid>,
}

/// The stage's objects, verified into the quarantine.
struct Staged {
    found: Found,
    /// The private copies (removed when dropped).
    private: tempfile::TempDir,
    quar: Quarantine,
}

/// Step 1: the objects are found and bounded, copied to a private place
/// (no symlink followed), counted (nothing written), then read through
/// libgit2 with hash verification into the quarantine. The inner error: a
/// limit was exceeded (nothing is imported).
fn stage_objects(
    git_dir: &Path,
    stage: &Paths,
    real: &git2::Odb,
    limits: &Limits,
    out: &mut Outcome,
    ev: &mut Events,
) -> Result<Result<Staged, String>, ImportError> {
    let found = match scan_objects(&stage.objects_upper(), ev, limits) {
        Ok(f) => f,
        Err(e) => return Ok(Err(e)),
    };
    let private = tempfile::Builder::new()
        .prefix(".import.")
        .tempdir_in(&stage.dir)
        .map_err(|source| ImportError::Io {
            path: stage.dir.clone(),
            source,
        })?;
    let loose_dir = private.path().join("loose");
    fs::create_dir_all(loose_dir.join("pack")).map_err(|source| ImportError::Io {
        path: loose_dir.clone(),
        source,
    })?;
    for (p, id) in &found.loose {
        let to = loose_dir.join(&id[..2]).join(&id[2..]);
        // Verified in full before libgit2 reads it (it loops forever on a
        // truncated loose object, libgit2 issue 7342).
        if let Err(e) = copy_nofollow(p, &to)
            .map_err(|e| e.to_string())
            .and_then(|()| {
                crate::objects::verify_loose(&to, id, id.len() == 64)
                    .map(|_| ())
                    .inspect_err(|_| {
                        let _ = fs::remove_file(&to);
                    })
            })
        {
            ev.push(
                "object_refused",
                Severity::Alert,
                json!({ "path": format!("objects/{}", rel(&stage.objects_upper(), p)), "object": id, "reason": e.to_string() }),
            );
        }
    }
    let mut sources = vec![(loose_dir.clone(), "loose objects".to_string())];
    for (i, (pack, idx)) in found.packs.iter().enumerate() {
        let d = private.path().join(format!("pack{i}"));
        let name = pack.file_name().unwrap().to_string_lossy().into_owned();
        let r = copy_nofollow(pack, &d.join("pack").join(&name))
            .and_then(|()| copy_nofollow(idx, &d.join("pack").join(idx.file_name().unwrap())));
        match r {
            Ok(()) => sources.push((d, format!("objects/pack/{name}"))),
            Err(e) => ev.push(
                "object_refused",
                Severity::Alert,
                json!({ "path": format!("objects/pack/{name}"), "reason": e.to_string() }),
            ),
        }
    }
    // Phase one: count and bound, nothing written.
    let mut read_count = 0u64;
    let mut listed = Vec::new();
    for (dir, label) in &sources {
        match list_source(dir, label, real, out, &mut read_count, limits, ev) {
            Ok(ids) => listed.push(ids),
            Err(e) => return Ok(Err(e)),
        }
    }
    // Phase two: verified into the quarantine.
    // (No new object, the common case: no quarantine to make; the real
    // store answers.)
    let mut quar = if listed.iter().all(Vec::is_empty) {
        Quarantine {
            q: crate::verify::open(git_dir)
                .map_err(|e| ImportError::Write(e.message().to_string()))?,
            new: BTreeMap::new(),
            migrated: HashSet::new(),
            host: crate::objects::Damaged::for_git_dir(git_dir),
        }
    } else {
        Quarantine::create(&private.path().join("quarantine"), git_dir)
            .map_err(ImportError::Write)?
    };
    for ((dir, label), ids) in sources.iter().zip(&listed) {
        quarantine_source(dir, label, ids, &mut quar, ev).map_err(ImportError::Write)?;
    }
    Ok(Ok(Staged {
        found,
        private,
        quar,
    }))
}

/// The ref changes the sandbox made, and the packed-refs values they
/// resolve against.
struct RefChanges {
    changes: BTreeMap<String, Change>,
    /// packed-refs as the sandbox left it.
    packed: BTreeMap<String, Value>,
    /// The host's packed-refs.
    host_packed: BTreeMap<String, Value>,
}

/// Step 2a: the changed loose refs of the upper layer, and the refs the
/// sandbox's packed-refs added, changed or dropped. packed-refs as the
/// sandbox left it: the upper layer's copy (git rewrote it: `git gc`,
/// `git pack-refs`, deleting a packed ref), a whiteout (all packed refs
/// removed), or absent (the host's, which the sandbox never wrote).
/// Whiteouts of loose refs resolve against it; the refs it added, changed
/// or dropped against the host's go through the rules. The host's
/// packed-refs itself is only ever changed by libgit2 applying accepted
/// updates. The error: a limit was exceeded.
fn ref_changes(
    stage: &Paths,
    git_dir: &Path,
    limits: &Limits,
    ev: &mut Events,
) -> Result<RefChanges, String> {
    let mut changes = scan_refs(&stage.refs_upper(), git_dir, ev, limits)?;
    let host_packed = refs::read_packed(git_dir).unwrap_or_default();
    let parse_packed = |bytes: &[u8]| -> Result<BTreeMap<String, Value>, String> {
        let t = tempfile::tempdir().map_err(|e| e.to_string())?;
        fs::write(t.path().join("packed-refs"), bytes).map_err(|e| e.to_string())?;
        refs::read_packed(t.path()).map_err(|e| e.to_string())
    };
    let pr = stage.packed_refs();
    let packed: BTreeMap<String, Value> = match fs::symlink_metadata(&pr) {
        Err(_) => host_packed.clone(),
        Ok(m) if is_whiteout(&m) => BTreeMap::new(),
        Ok(m) if m.is_file() => match stage::read_small(&pr, limits.max_bytes)
            .map_err(|e| e.to_string())
            .and_then(|b| parse_packed(&b))
        {
            Ok(p) => p,
            Err(e) => {
                refused(
                    ev,
                    "packed-refs",
                    format!("the sandbox's packed-refs is unreadable: {e}"),
                );
                host_packed.clone()
            }
        },
        Ok(_) => {
            ev.push(
                "stage_entry_refused",
                Severity::Alert,
                json!({ "path": "packed-refs", "reason": "not a regular file (never followed)" }),
            );
            host_packed.clone()
        }
    };
    let names: BTreeSet<&String> = host_packed.keys().chain(packed.keys()).collect();
    for name in names {
        if host_packed.get(name) == packed.get(name) || changes.contains_key(name) {
            continue;
        }
        // A real loose ref hides the packed entry (from the sandbox as
        // well: the lower layer has it).
        if fs::symlink_metadata(git_dir.join(name)).is_ok() {
            continue;
        }
        let c = match packed.get(name) {
            Some(v) => Change::Set(v.to_text().into_bytes()),
            None => Change::Whiteout,
        };
        changes.insert(name.clone(), c);
    }
    Ok(RefChanges {
        changes,
        packed,
        host_packed,
    })
}

/// The branches that are never deleted: HEAD's before and after the run,
/// and those checked out in linked worktrees.
fn checked_out_branches(
    git_dir: &Path,
    head_before: &[u8],
    head_stage: Option<&[u8]>,
) -> BTreeSet<String> {
    let head_branch = |b: &[u8]| -> Option<String> {
        match Value::parse(&String::from_utf8_lossy(b)) {
            Value::Sym(s) => Some(s),
            _ => None,
        }
    };
    [head_branch(head_before), head_stage.and_then(head_branch)]
        .into_iter()
        .flatten()
        .chain(
            crate::layout::worktree_dirs(git_dir)
                .iter()
                .filter_map(|w| fs::read(w.join("HEAD")).ok())
                .filter_map(|b| head_branch(&b)),
        )
        .collect()
}

/// What a ref change is judged against.
struct RefRules<'a> {
    git_dir: &'a Path,
    repo: &'a git2::Repository,
    /// The new objects and the real store.
    quar: &'a Quarantine,
    /// Branches never deleted ([`checked_out_branches`]).
    protected: BTreeSet<String>,
    rc: &'a RefChanges,
}

impl RefRules<'_> {
    /// Step 2b: one ref change, accepted into `d` or refused (an alert).
    fn decide(&self, name: &str, change: &Change, d: &mut Decided, ev: &mut Events) {
        let RefRules {
            git_dir,
            repo,
            quar,
            protected: protected_branches,
            rc,
        } = self;
        if !git2::Reference::is_valid_name(name) || !refs::valid_refname(name) {
            refused(ev, name, "invalid ref name (git check-ref-format rules)");
            return;
        }
        if !allowed_name(name) && !crate::inprogress::commit_ref(name) {
            refused(
                ev,
                name,
                "outside refs/heads, refs/tags, refs/remotes, refs/notes, refs/stash, refs/bisect and refs/rewritten",
            );
            return;
        }
        let old = current(repo, name);
        let want: Option<Value> = match change {
            Change::Set(b) => {
                let v = Value::parse(&String::from_utf8_lossy(b));
                if let Value::Invalid(s) = &v {
                    refused(
                        ev,
                        name,
                        format!("not an object id or 'ref: refs/...' ('{s}')"),
                    );
                    return;
                }
                Some(v)
            }
            // Deleted as a loose file: what the sandbox saw then is its
            // packed-refs entry, if any. git deletes a ref from packed-refs as
            // well, and git gc packs the value the loose file had: a
            // whited-out loose ref whose packed entry is still the host's old,
            // different value was removed by hand, and is taken as the
            // deletion it meant, never as a rewind to the stale packed value.
            Change::Whiteout => match rc.packed.get(name) {
                Some(p)
                    if Some(p) != old.as_ref()
                        && rc.host_packed.get(name) == Some(p)
                        && fs::symlink_metadata(git_dir.join(name)).is_ok() =>
                {
                    None
                }
                p => p.cloned(),
            },
        };
        if want == old {
            return;
        }
        let new = match want {
            None => {
                let Some(oldv) = &old else { return };
                if name.starts_with("refs/tags/") {
                    refused(ev, name, "deleting a tag");
                    return;
                }
                if protected_branches.contains(name) {
                    refused(ev, name, "deleting the checked-out branch");
                    return;
                }
                d.refs.push(crate::journal::RefOp {
                    name: name.to_string(),
                    old: Some(oldv.to_text()),
                    new: None,
                    fast_forward: None,
                });
                d.planned.insert(name.to_string(), None);
                return;
            }
            Some(Value::Sym(t)) => {
                if crate::inprogress::commit_ref(name) {
                    refused(
                        ev,
                        name,
                        format!(
                            "symbolic ref to '{t}': a bisect mark or rebase label names a commit"
                        ),
                    );
                    return;
                }
                if !allowed_name(&t) || !git2::Reference::is_valid_name(&t) {
                    refused(
                        ev,
                        name,
                        format!("symbolic ref to '{t}', outside the allowed namespaces"),
                    );
                    return;
                }
                if name.starts_with("refs/tags/") && old.is_some() {
                    refused(ev, name, "moving an existing tag");
                    return;
                }
                (Value::Sym(t), None)
            }
            Some(Value::Oid(o)) => {
                let Ok(id) = git2::Oid::from_str(&o) else {
                    refused(ev, name, "not an object id");
                    return;
                };
                let Some(kind) = quar.kind(id) else {
                    let why = if quar.host.contains(&id) {
                        "is damaged (its loose object file is not what it names)"
                    } else {
                        "does not exist"
                    };
                    refused(ev, name, format!("object {o} {why}"));
                    return;
                };
                if (name.starts_with("refs/heads/") || crate::inprogress::commit_ref(name))
                    && kind != git2::ObjectType::Commit
                {
                    refused(ev, name, format!("object {o} is a {kind}, not a commit"));
                    return;
                }
                if name.starts_with("refs/tags/") && old.is_some() {
                    refused(ev, name, "moving an existing tag");
                    return;
                }
                match quar.closure(id) {
                    Err(m) => {
                        refused(
                            ev,
                            name,
                            format!("incomplete history: object {m} is missing"),
                        );
                        return;
                    }
                    Ok(ids) => d.objects.extend(ids),
                }
                // The quarantine sees the new objects and the real store;
                // the real store's loose objects are read only once checked.
                let ff = match &old {
                    Some(Value::Oid(p)) => git2::Oid::from_str(p)
                        .ok()
                        .map(|p| crate::objects::descends(&quar.q, id, p, &quar.host)),
                    _ => None,
                };
                (Value::Oid(o), ff)
            }
            Some(Value::Invalid(_)) => unreachable!(),
        };
        let (nv, fast_forward) = new;
        d.refs.push(crate::journal::RefOp {
            name: name.to_string(),
            old: old.as_ref().map(Value::to_text),
            new: Some(nv.to_text()),
            fast_forward,
        });
        d.planned.insert(name.to_string(), Some(nv));
    }
}

/// Step 3: HEAD as the sandbox left it, accepted into `d` when it names an
/// existing branch (after this import's ref updates) or a commit whose
/// history is complete; else refused (an alert).
fn decide_head(
    repo: &git2::Repository,
    quar: &Quarantine,
    head_before: &[u8],
    head_stage: io::Result<Vec<u8>>,
    d: &mut Decided,
    ev: &mut Events,
) {
    let b = match head_stage {
        Err(e) => {
            ev.push(
                "ref_refused",
                Severity::Alert,
                json!({ "ref": "HEAD", "reason": format!("the stage's HEAD is unreadable: {e}") }),
            );
            return;
        }
        Ok(b) if b == head_before => return,
        Ok(b) => b,
    };
    let old = Value::parse(&String::from_utf8_lossy(head_before));
    let t = String::from_utf8_lossy(&b).into_owned();
    let v = Value::parse(&t);
    let r: Result<(), String> = match &v {
        Value::Sym(s) if s.starts_with("refs/heads/") && git2::Reference::is_valid_name(s) => {
            // Exists after the ref updates of this import.
            let exists = match d.planned.get(s) {
                Some(v) => v.is_some(),
                None => repo.find_reference(s).is_ok(),
            };
            if !exists {
                Err(format!("HEAD names {s}, which does not exist"))
            } else {
                Ok(())
            }
        }
        Value::Oid(o) => match git2::Oid::from_str(o) {
            Ok(id) if quar.kind(id) == Some(git2::ObjectType::Commit) => match quar.closure(id) {
                Err(m) => Err(format!("incomplete history: object {m} is missing")),
                Ok(ids) => {
                    d.objects.extend(ids);
                    Ok(())
                }
            },
            _ => Err(format!("HEAD names {o}, which is not an existing commit")),
        },
        _ => Err(format!(
            "not 'ref: refs/heads/NAME' or a commit id ('{}')",
            t.trim_end().chars().take(80).collect::<String>()
        )),
    };
    match r {
        Ok(()) => d.head = Some((old.to_text(), v.to_text())),
        Err(reason) => ev.push(
            "ref_refused",
            Severity::Alert,
            json!({ "ref": "HEAD", "reason": reason }),
        ),
    }
}

/// New blobs no accepted history needs come in when the sandbox's index
/// names them (content staged without a commit), and only when git fsck
/// --strict accepts the tree entry that index entry becomes on the host's
/// next commit (a `.gitmodules` is checked as such). A blob nothing names
/// is not brought in: git checks a `.gitmodules` blob only through a tree
/// naming it, so an unnamed one would be unchecked (a tree naming it later
/// is checked against the store then).
fn index_blobs(
    index: &Path,
    private: &Path,
    max_bytes: u64,
    quar: &Quarantine,
    objects: &mut Vec<git2::Oid>,
    ev: &mut Events,
) {
    let entries = stage_index_entries(index, private, max_bytes);
    let Ok(qodb) = quar.q.odb() else { return };
    for (path, mode, id) in &entries {
        if quar.new.get(id) != Some(&git2::ObjectType::Blob) {
            continue;
        }
        let blob = || qodb.read(*id).ok().map(|o| o.data().to_vec());
        match crate::fsck::check_index_entry(path, *mode, &blob) {
            Ok(()) => objects.push(*id),
            Err(reason) => ev.push(
                "object_refused",
                Severity::Alert,
                json!({ "path": format!("index: {}", String::from_utf8_lossy(path)), "object": id.to_string(), "reason": reason }),
            ),
        }
    }
}

/// The journal after the objects were written, and the files written
/// (relative to the objects directory).
struct Written {
    journal: crate::journal::Journal,
    paths: Vec<String>,
}

/// Writes the new objects from the quarantine into the real store (the
/// journal's pending step); a failure undoes them (nothing is committed).
fn write_objects(
    git_dir: &Path,
    owner: Option<(u32, u32)>,
    journal: crate::journal::Journal,
    quar: &mut Quarantine,
    real: &git2::Odb,
    ids: &[git2::Oid],
    ev: &mut Events,
) -> Result<Written, ImportError> {
    let mut paths = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let before = paths.len();
        let r = quar.migrate(std::slice::from_ref(id), real, &mut paths);
        // Given back at once: a SIGKILL after this object must not leave
        // root's fan-out directory in a user's store.
        for w in &paths[before..] {
            give_back(git_dir, w, owner);
        }
        if let Err(e) = r {
            // Not committed: undone now (the journal's lock goes first).
            drop(journal);
            let _ = crate::journal::recover(git_dir, ev);
            return Err(ImportError::Write(e));
        }
        // Crash points after the first object and after the last.
        if i == 0 || i + 1 == ids.len() {
            crate::journal::crash_point();
        }
    }
    Ok(Written { journal, paths })
}

/// The commit HEAD will name once the planned updates are applied.
fn final_head(
    repo: &git2::Repository,
    head: &Option<(String, String)>,
    planned: &BTreeMap<String, Option<Value>>,
) -> Option<git2::Oid> {
    let text = match head {
        Some((_, new)) => new.clone(),
        None => String::from_utf8_lossy(&fs::read(repo.path().join("HEAD")).ok()?).into_owned(),
    };
    let mut v = Value::parse(&text);
    for _ in 0..5 {
        match v {
            Value::Oid(o) => return git2::Oid::from_str(&o).ok(),
            Value::Sym(s) => {
                v = match planned.get(&s) {
                    Some(Some(x)) => x.clone(),
                    Some(None) => return None,
                    None => Value::Oid(repo.refname_to_id(&s).ok()?.to_string()),
                }
            }
            Value::Invalid(_) => return None,
        }
    }
    None
}

/// The entries (path, mode, id) of the index the sandbox left, read from a
/// private copy; none when it has none or libgit2 cannot read it (then it
/// is not taken either), and none when it is larger than `max_bytes` (it
/// is refused then: see [`take_index`]).
fn stage_index_entries(
    up: &Path,
    private: &Path,
    max_bytes: u64,
) -> Vec<(Vec<u8>, u32, git2::Oid)> {
    if !fs::symlink_metadata(up).is_ok_and(|m| m.is_file() && m.len() <= max_bytes) {
        return Vec::new();
    }
    let tmp = private.join("index-entries");
    if copy_nofollow(up, &tmp).is_err() {
        return Vec::new();
    }
    match git2::Index::open(&tmp) {
        Ok(idx) => idx.iter().map(|e| (e.path, e.mode, e.id)).collect(),
        Err(_) => Vec::new(),
    }
}

/// The largest index taken from the stage, whatever `--stage-max-bytes`
/// allows: libgit2 reads an index whole, at about 5.6 times its size in
/// memory (a 72 MB index of a million entries took 404 MB), so the 2 GiB
/// default let a crafted index of ordinary density hold some 11 GB of the
/// host's memory. 128 MiB is about 1.7 million entries, more than the
/// largest known work trees.
pub(crate) const INDEX_MAX_BYTES: u64 = 128 << 20;

fn index_limit(max_bytes: u64) -> u64 {
    max_bytes.min(INDEX_MAX_BYTES)
}

/// The sandbox's index (in the upper layer when git wrote it: `git add`,
/// `git commit`, `git checkout`, even `git status` refreshing it) replaces
/// the host's, so the work tree the sandbox left and HEAD agree on the host
/// as they did inside. It is copied without following symlinks, read with
/// libgit2 (its checksum verified; an index libgit2 cannot read, e.g. a
/// split index whose shared part stayed in the stage, is not taken), and
/// written anew before it replaces the host's: without cached trees (the
/// sandbox can name any tree there, and a cached tree the host does not
/// have would make the next `git commit` on the host write a broken
/// commit), without extensions libgit2 does not write (fsmonitor token,
/// untracked cache), and with every entry whose blob did not come in reset
/// to HEAD's version (the file in the work tree untouched: it shows as
/// modified) or dropped when HEAD has none. An index larger than
/// `max_bytes` (`--stage-max-bytes`) is not taken: it would be copied whole
/// into the git dir and read whole by libgit2, and a sparse file costs the
/// sandbox nothing (`truncate -s 40G .git/index` in the stage filled the
/// host's disk and memory).
#[allow(clippy::too_many_arguments)]
pub(crate) fn take_index(
    git_dir: &Path,
    up: &Path,
    dest: &Path,
    head_commit: Option<git2::Oid>,
    owner: Option<(u32, u32)>,
    max_bytes: u64,
    ev: &mut Events,
) -> bool {
    match fs::symlink_metadata(up) {
        Err(_) => return false,
        // `rm .git/index`: the host keeps its own (the work tree is
        // compared against it, nothing is lost).
        Ok(m) if is_whiteout(&m) => return false,
        Ok(m) if m.is_file() && m.len() > max_bytes => {
            ev.push(
                "stage_entry_refused",
                Severity::Alert,
                json!({ "path": "index", "size": m.len(), "max_bytes": max_bytes,
                        "reason": format!("{} bytes, over the index limit ({max_bytes}: --stage-max-bytes, at most {INDEX_MAX_BYTES}): not taken, the host keeps its own index", m.len()) }),
            );
            return false;
        }
        Ok(m) if m.is_file() => {}
        Ok(_) => {
            ev.push(
                "stage_entry_refused",
                Severity::Alert,
                json!({ "path": "index", "reason": "not a regular file (never followed)" }),
            );
            return false;
        }
    }
    let mut hidden = crate::index::Hidden::default();
    let mut refused = Vec::new();
    // Prepared beside the journal, renamed into place when it commits.
    let tmp = dest.to_path_buf();
    let _ = fs::remove_file(&tmp);
    let r = copy_nofollow(up, &tmp)
        .map_err(|e| e.to_string())
        .and_then(|()| rebuild_index(git_dir, &tmp, head_commit, owner, &mut hidden, &mut refused))
        .and_then(|counts| {
            fs::File::open(&tmp)
                .and_then(|f| f.sync_all())
                .map(|()| counts)
                .map_err(|e| e.to_string())
        });
    for (path, object, reason) in refused {
        ev.push(
            "object_refused",
            Severity::Alert,
            json!({ "path": format!("index: {path}"), "object": object, "reason": reason }),
        );
    }
    match r {
        Ok((entries, reset, dropped)) => {
            if !hidden.is_empty() {
                let few = |v: &Vec<String>| v.iter().take(20).cloned().collect::<Vec<_>>();
                ev.push(
                    "index_hidden_cleared",
                    Severity::Alert,
                    json!({ "skip_worktree": few(&hidden.skip_worktree),
                            "assume_unchanged": few(&hidden.assume_unchanged),
                            "sparse_dirs": few(&hidden.sparse_dirs),
                            "count": hidden.skip_worktree.len() + hidden.assume_unchanged.len() + hidden.sparse_dirs.len(),
                            "path": "index",
                            "reason": "the sandbox's index hid files from git status and git diff (skip-worktree, assume-unchanged, sparse directories): cleared, the host's git looks at them again" }),
                );
            }
            ev.push(
                "index_rebuilt",
                if reset + dropped > 0 {
                    Severity::Warn
                } else {
                    Severity::Info
                },
                json!({ "entries": entries, "reset_to_head": reset, "dropped": dropped,
                        "reason": "the sandbox's index, without cached trees; entries naming objects that were not imported reset to HEAD" }),
            );
            true
        }
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            ev.push(
                "index_unreadable",
                Severity::Warn,
                json!({ "path": "index", "reason": format!("the sandbox's index was not taken: {e}") }),
            );
            false
        }
    }
}

/// The entry at `path` (slash-separated) below `tree`, reading each tree
/// on the way only once `gate` passed it (libgit2's own `get_path` would
/// read them unchecked).
fn tree_path(
    repo: &git2::Repository,
    tree: &git2::Tree<'_>,
    path: &[u8],
    gate: &crate::objects::Damaged,
) -> Option<git2::TreeEntry<'static>> {
    let mut parts = path.split(|&b| b == b'/');
    let mut name = parts.next()?;
    let mut cur = tree.clone();
    for next in parts {
        let id = cur.get_name_bytes(name)?.id();
        if gate.contains(&id) {
            return None;
        }
        cur = repo.find_tree(id).ok()?;
        name = next;
    }
    cur.get_name_bytes(name).map(|e| e.to_owned())
}

/// Rewrites the index file `path` (a private copy) as `take_index` says;
/// returns (entries kept, reset to HEAD, dropped).
fn rebuild_index(
    git_dir: &Path,
    path: &Path,
    head_commit: Option<git2::Oid>,
    owner: Option<(u32, u32)>,
    hidden: &mut crate::index::Hidden,
    refused: &mut Vec<(String, String, String)>,
) -> Result<(usize, usize, usize), String> {
    let repo = crate::verify::open(git_dir).map_err(|e| e.message().to_string())?;
    let odb = repo.odb().map_err(|e| e.message().to_string())?;
    let mut idx = git2::Index::open(path).map_err(|e| e.message().to_string())?;
    // The host's loose objects are read only once checked (issue 19: the
    // snapshot no longer stats every one, see objects::Damaged).
    let gate = crate::objects::Damaged::for_git_dir(git_dir);
    // HEAD as the import leaves it (refs are applied after the index is
    // prepared; their objects are already in the store).
    let head_tree = head_commit
        .filter(|c| !gate.contains(c))
        .and_then(|c| repo.find_commit(c).ok())
        .filter(|c| !gate.contains(&c.tree_id()))
        .and_then(|c| c.tree().ok());
    // git stages intent-to-add entries (`git add -N`) and empty files as
    // the empty blob without necessarily writing it: it is written here so
    // such an entry stays valid.
    let empty =
        git2::Oid::hash_object(git2::ObjectType::Blob, b"").map_err(|e| e.message().to_string())?;
    let entries: Vec<git2::IndexEntry> = idx.iter().collect();
    let (mut reset, mut dropped) = (0usize, 0usize);
    let mut keep = Vec::with_capacity(entries.len());
    for mut e in entries {
        // Flags and stat data that hide a file from the host's git.
        if !crate::index::sanitize(&mut e, hidden) {
            dropped += 1;
            continue;
        }
        let gitlink = e.mode & 0o170000 == 0o160000;
        if e.id == empty && !odb.exists(empty) {
            odb.write(git2::ObjectType::Blob, b"")
                .map_err(|e| e.message().to_string())?;
            let s = empty.to_string();
            give_back(git_dir, &format!("objects/{}/{}", &s[..2], &s[2..]), owner);
        }
        let p = String::from_utf8_lossy(&e.path).into_owned();
        let present = gitlink || odb.exists(e.id);
        // The tree entry it becomes on the host's next commit, as git fsck
        // --strict checks it (a `.gitmodules` naming a blob the store
        // already had, a `.git` component...): refused entries are reset
        // to HEAD's version or dropped. (A new blob that failed was not
        // brought in and was refused then.)
        let blob = || {
            (!gate.contains(&e.id))
                .then(|| odb.read(e.id).ok())
                .flatten()
                .filter(|o| o.kind() == git2::ObjectType::Blob)
                .map(|o| o.data().to_vec())
        };
        let verdict = crate::fsck::check_index_entry(&e.path, e.mode, &blob);
        match verdict {
            Ok(()) if present => {
                keep.push(e);
                continue;
            }
            Err(why) if present => refused.push((p.clone(), e.id.to_string(), why)),
            _ => {}
        }
        match head_tree
            .as_ref()
            .and_then(|t| tree_path(&repo, t, &e.path, &gate))
            .filter(|te| odb.exists(te.id()))
        {
            Some(te) => {
                e.id = te.id();
                e.mode = te.filemode() as u32;
                // Stat data that cannot match: git looks at the file again.
                e.file_size = 0;
                e.mtime = git2::IndexTime::new(0, 0);
                keep.push(e);
                reset += 1;
            }
            None => dropped += 1,
        }
    }
    idx.clear().map_err(|e| e.message().to_string())?;
    let mut kept = 0usize;
    for e in &keep {
        match idx.add(e) {
            Ok(()) => kept += 1,
            Err(_) => dropped += 1,
        }
    }
    idx.write().map_err(|e| e.message().to_string())?;
    Ok((kept, reset, dropped))
}

fn exceeded(mut out: Outcome, what: String, ev: &mut Events) -> Outcome {
    ev.push(
        "stage_limit_exceeded",
        Severity::Alert,
        json!({ "reason": what, "action": "nothing imported (no ref, no HEAD)" }),
    );
    out.exceeded = Some(what);
    out
}
