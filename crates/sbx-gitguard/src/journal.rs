//! The import is a transaction: a journal in the git dir
//! (`sbx-gitguard-import/`) makes a SIGKILL at any moment leave the
//! repository either untouched or, at the next start (`run`, `import`),
//! fully imported.
//!
//! 1. Everything is decided first, without writing to the repository (refs,
//!    HEAD, the objects they need).
//! 2. `pending.json` (the ids of the objects about to be written, all new to
//!    the store) is written and fsync'd, with its directory.
//! 3. The objects are written; the sandbox's index is rebuilt into
//!    `index.new` beside the journal.
//! 4. `journal.json` (every ref's old and new value, HEAD's, whether an
//!    index is ready) is written to a temporary name, fsync'd, renamed and
//!    the directory fsync'd: from here on the import has happened.
//! 5. Refs, HEAD and the index are applied; each step is idempotent
//!    (a ref already at its new value is done; one at its old value is
//!    moved; one at neither was changed by someone else: refused).
//! 6. The journal directory is removed.
//!
//! Recovery ([`recover`], at the start of `run` and `import`): with a
//! `journal.json`, step 5 is done again and the journal removed (`completed`);
//! with only `pending.json`, the journal is removed (`undone`: no ref,
//! HEAD or index of the import was applied; the verified objects it wrote
//! stay until `git gc`, since the user's git or another import may use them
//! by then; the stage, left in place by the dead run, can be imported
//! again). A journal whose lock is held belongs to a live import: the
//! recovery waits for it (bounded), and a run's check of the git dir
//! leaves it alone.
//!
//! Test hook: `SBX_GITGUARD_CRASH_AT=N` makes sbx-gitguard SIGKILL itself at
//! the N-th step of an import (tests/journal.rs kills it at every step).
//! An import waits up to 60 s for another import of the same repository
//! (`SBX_GITGUARD_BUSY_WAIT_MS`, a test hook, shortens it).

use std::fs;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use sbx_core::Severity;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::import::Events;
use crate::refs::Value;

/// How long an import waits for another import of the same repository.
const BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// The journal directory's name inside the git dir.
pub const DIR: &str = "sbx-gitguard-import";

/// One ref update: `old` is what the host had when it was decided.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RefOp {
    pub name: String,
    pub old: Option<String>,
    pub new: Option<String>,
    /// Fast-forward (for the event), when known.
    pub fast_forward: Option<bool>,
}

/// What a committed journal holds: enough to finish the import.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Committed {
    pub version: u32,
    pub sbx_id: String,
    pub refs: Vec<RefOp>,
    /// HEAD's (old, new) text.
    pub head: Option<(String, String)>,
    pub index: bool,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Pending {
    version: u32,
    objects: Vec<String>,
}

static STEP: AtomicU32 = AtomicU32::new(0);

/// A point where a crash is tested: the N-th one SIGKILLs the process when
/// `SBX_GITGUARD_CRASH_AT=N`.
pub fn crash_point() {
    let n = STEP.fetch_add(1, Ordering::SeqCst) + 1;
    if std::env::var("SBX_GITGUARD_CRASH_AT")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        == Some(n)
    {
        // Nothing is held that needs cleaning: that is the point of the
        // test.
        let _ = nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGKILL);
    }
}

fn fsync_dir(p: &Path) -> io::Result<()> {
    fs::File::open(p)?.sync_all()
}

/// Writes `name` in `dir` durably: temp file, fsync, rename, fsync dir.
fn write_durable(dir: &Path, name: &str, data: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let _ = fs::remove_file(&tmp);
    let mut f = fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    drop(f);
    fs::rename(&tmp, dir.join(name))?;
    fsync_dir(dir)
}

/// A live journal: its lock is held while it exists.
pub struct Journal {
    pub dir: PathBuf,
    _lock: fs::File,
}

/// The journal's lock, taken without waiting (None: held); made when
/// `create`.
fn lock_at(dir: &Path, create: bool) -> io::Result<Option<fs::File>> {
    let f = fs::OpenOptions::new()
        .create(create)
        .truncate(false)
        .write(true)
        .mode(0o600)
        // Non-blocking: a FIFO planted as `lock` hung every run.
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(dir.join("lock"))?;
    if !f.metadata()?.is_file() {
        return Err(io::Error::other(format!(
            "{}: not a regular file",
            dir.join("lock").display()
        )));
    }
    // SAFETY: flock(2) on `f`, which we opened and keep open across the
    // call; no pointers.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Ok(None);
    }
    Ok(Some(f))
}

impl Journal {
    /// Creates the journal directory (after recovering a dead one) and
    /// writes `pending.json` listing the objects about to be written.
    pub fn begin(git_dir: &Path, objects: &[git2::Oid], ev: &mut Events) -> io::Result<Journal> {
        recover(git_dir, ev)?;
        let dir = git_dir.join(DIR);
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| match e.kind() {
                // Another import made it since the recovery above.
                io::ErrorKind::AlreadyExists => io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!("{}: another import of this repository began", dir.display()),
                ),
                _ => e,
            })?;
        let Some(l) = lock_at(&dir, true)? else {
            return Err(io::Error::other("another import holds the journal"));
        };
        let p = Pending {
            version: 1,
            objects: objects.iter().map(|o| o.to_string()).collect(),
        };
        write_durable(&dir, "pending.json", &serde_json::to_vec(&p)?)?;
        // Root importing into a user's repository: a journal root's SIGKILL
        // leaves must be the owner's to recover (it stopped every run of
        // theirs with EACCES: attacker helper-52).
        own(git_dir, &["lock", "pending.json"]);
        fsync_dir(git_dir)?;
        crash_point();
        Ok(Journal { dir, _lock: l })
    }

    /// Where the rebuilt index waits until the journal is committed.
    pub fn index_new(&self) -> PathBuf {
        self.dir.join("index.new")
    }

    /// Commits: from now on the import has happened.
    pub fn commit(&self, c: &Committed) -> io::Result<()> {
        if self.index_new().exists() {
            fs::File::open(self.index_new())?.sync_all()?;
        }
        write_durable(&self.dir, "journal.json", &serde_json::to_vec(c)?)?;
        if let Some(git_dir) = self.dir.parent() {
            own(git_dir, &["index.new", "journal.json"]);
        }
        crash_point();
        Ok(())
    }

    /// Removes the journal (the import is complete, or undone).
    pub fn finish(self) -> io::Result<()> {
        let r = dismantle(&self.dir);
        crash_point();
        r
    }
}

/// Whether a ref update read from a journal is one the import could have
/// decided: a valid name in the namespaces it writes, and a new value that
/// is an object of the repository (a commit for a branch).
fn journal_op_ok(repo: &git2::Repository, name: &str, new: Option<&str>) -> Result<(), String> {
    if !(crate::import::allowed_name(name) || crate::inprogress::commit_ref(name))
        || !crate::refs::valid_refname(name)
        || !git2::Reference::is_valid_name(name)
    {
        return Err(format!("'{name}' is not a ref the import writes"));
    }
    let Some(v) = new else { return Ok(()) };
    match Value::parse(v) {
        Value::Oid(o) => journal_object_ok(repo, &o, name.starts_with("refs/heads/")),
        Value::Sym(t) => journal_op_ok(repo, &t, None),
        Value::Invalid(s) => Err(format!("invalid value '{s}'")),
    }
}

/// `o` is an object of the repository (a commit, when `commit`).
fn journal_object_ok(repo: &git2::Repository, o: &str, commit: bool) -> Result<(), String> {
    let id = git2::Oid::from_str(o).map_err(|_| format!("'{o}' is not an object id"))?;
    let kind = repo
        .find_object(id, None)
        .map_err(|_| format!("object {o} is not in the repository"))?
        .kind();
    if commit && kind != Some(git2::ObjectType::Commit) {
        return Err(format!("{o} is not a commit"));
    }
    Ok(())
}

/// Removes a journal directory whose import is complete or undone.
/// `pending.json` goes first, durably: the tree's removal order is the
/// directory's, and a journal left with its pending list but without
/// `journal.json` reads as never committed, although its refs were applied
/// (its undo once deleted the objects they named; it deletes nothing now,
/// but would report an applied import as undone).
fn dismantle(dir: &Path) -> io::Result<()> {
    match fs::remove_file(dir.join("pending.json")) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => fsync_dir(dir)?,
    }
    crash_point();
    crate::stage::remove_tree(dir)
}

/// Whether `dir` is the journal of an import that is alive now (its lock
/// is held). After a sandbox is gone nothing of it can hold one: only an
/// sbx-gitguard outside does. Never blocks, never creates anything.
pub fn live(dir: &Path) -> bool {
    let Ok(f) = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(dir.join("lock"))
    else {
        return false;
    };
    // One made by an import has one name: a hard link to a file some
    // sbx-gitguard holds locked (its own registry entry) made a planted
    // journal look alive (attacker helper-53).
    if !f.metadata().is_ok_and(|m| m.is_file() && m.nlink() == 1) {
        return false;
    }
    // SAFETY: flock(2) on `f`, open for the call; no pointers.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) != 0 }
}

/// Gives the journal directory and `names` in it to the git dir's owner
/// (only when root writes another user's repository).
fn own(git_dir: &Path, names: &[&str]) {
    let owner = crate::fsutil::owner(git_dir);
    crate::import::give_back(git_dir, DIR, owner);
    for n in names {
        crate::import::give_back(git_dir, &format!("{DIR}/{n}"), owner);
    }
}

fn text(v: &Option<String>) -> serde_json::Value {
    v.as_ref()
        .map(|s| serde_json::Value::String(s.clone()))
        .unwrap_or(serde_json::Value::Null)
}

fn current(repo: &git2::Repository, name: &str) -> Option<String> {
    let r = repo.find_reference(name).ok()?;
    match r.kind()? {
        git2::ReferenceType::Direct => r.target().map(|o| o.to_string()),
        git2::ReferenceType::Symbolic => r.symbolic_target().map(|s| format!("ref: {s}")),
    }
}

/// What applying a committed journal changed.
#[derive(Debug, Default)]
pub struct Applied {
    pub refs: Vec<(String, Option<Value>)>,
    pub head_changed: bool,
    pub index_replaced: bool,
}

/// Step 5: refs, HEAD, index; each idempotent (see the module doc).
pub fn apply(git_dir: &Path, dir: &Path, c: &Committed, ev: &mut Events) -> Applied {
    let mut out = Applied::default();
    let owner = crate::fsutil::owner(git_dir);
    let msg = format!("sbx-gitguard: from sandbox {}", c.sbx_id);
    let repo = match crate::verify::open(git_dir) {
        Ok(r) => r,
        Err(e) => {
            ev.push(
                "ref_refused",
                Severity::Alert,
                json!({ "ref": "*", "reason": format!("cannot open the repository to apply the import: {}", e.message()) }),
            );
            return out;
        }
    };
    for op in &c.refs {
        // The journal is a file in the repository: what it asks for is
        // checked again, as the import checked it (a name outside the
        // import's namespaces, or with `..`, had root chown files
        // anywhere; attacker helper-53).
        if let Err(reason) = journal_op_ok(&repo, &op.name, op.new.as_deref()) {
            ev.push(
                "ref_refused",
                Severity::Alert,
                json!({ "ref": op.name, "reason": format!("in the import journal: {reason}") }),
            );
            continue;
        }
        let cur = current(&repo, &op.name);
        let done = cur == op.new;
        let r: Result<(), String> = if done {
            Ok(())
        } else if cur != op.old {
            Err(format!(
                "changed by someone else during the import (now {})",
                cur.as_deref().unwrap_or("absent")
            ))
        } else {
            match op.new.as_deref().map(Value::parse) {
                None => repo
                    .find_reference(&op.name)
                    .and_then(|mut r| r.delete())
                    .map_err(|e| e.message().to_string()),
                Some(Value::Sym(t)) => repo
                    .reference_symbolic(&op.name, &t, true, &msg)
                    .map(|_| ())
                    .map_err(|e| e.message().to_string()),
                Some(Value::Oid(o)) => {
                    let id = git2::Oid::from_str(&o).map_err(|e| e.message().to_string());
                    id.and_then(|id| {
                        match op.old.as_deref().and_then(|p| git2::Oid::from_str(p).ok()) {
                            Some(p) => repo.reference_matching(&op.name, id, true, p, &msg),
                            None => repo.reference(&op.name, id, false, &msg),
                        }
                        .map(|_| ())
                        .map_err(|e| e.message().to_string())
                    })
                }
                Some(Value::Invalid(s)) => Err(format!("invalid value '{s}' in the journal")),
            }
        };
        match r {
            Ok(()) => {
                crate::import::give_back(git_dir, &op.name, owner);
                crate::import::give_back(git_dir, &format!("logs/{}", op.name), owner);
                match &op.new {
                    None => ev.push(
                        "ref_deleted",
                        Severity::Info,
                        json!({ "ref": op.name, "old": text(&op.old),
                                "restore": restore_command(&op.name, op.old.as_deref()) }),
                    ),
                    Some(n) => ev.push(
                        "ref_imported",
                        Severity::Info,
                        json!({ "ref": op.name, "old": text(&op.old), "new": n, "fast_forward": op.fast_forward }),
                    ),
                }
                out.refs
                    .push((op.name.clone(), op.new.as_deref().map(Value::parse)));
                if !done {
                    crash_point();
                }
            }
            Err(reason) => ev.push(
                "ref_refused",
                Severity::Alert,
                json!({ "ref": op.name, "reason": reason }),
            ),
        }
    }
    let head_ok = c.head.as_ref().map(|(_, new)| match Value::parse(new) {
        Value::Sym(t) => journal_op_ok(&repo, &t, None).and_then(|()| {
            t.starts_with("refs/heads/")
                .then_some(())
                .ok_or_else(|| format!("HEAD to '{t}', not a branch"))
        }),
        Value::Oid(o) => journal_object_ok(&repo, &o, true),
        Value::Invalid(s) => Err(format!("invalid HEAD '{s}'")),
    });
    if let Some(Err(reason)) = &head_ok {
        ev.push(
            "ref_refused",
            Severity::Alert,
            json!({ "ref": "HEAD", "reason": format!("in the import journal: {reason}") }),
        );
    }
    if let (Some((old, new)), Some(Ok(()))) = (&c.head, &head_ok) {
        let cur = fs::read(git_dir.join("HEAD"))
            .map(|b| Value::parse(&String::from_utf8_lossy(&b)).to_text())
            .unwrap_or_default();
        let r: Result<(), String> = if &cur == new {
            Ok(())
        } else {
            match Value::parse(new) {
                Value::Sym(s) => repo.reference_symbolic("HEAD", &s, true, &msg),
                Value::Oid(o) => {
                    git2::Oid::from_str(&o).and_then(|id| repo.reference("HEAD", id, true, &msg))
                }
                Value::Invalid(s) => Err(git2::Error::from_str(&s)),
            }
            .map(|_| ())
            .map_err(|e| e.message().to_string())
        };
        match r {
            Ok(()) => {
                ev.push(
                    "ref_imported",
                    Severity::Info,
                    json!({ "ref": "HEAD", "old": old, "new": new, "fast_forward": serde_json::Value::Null }),
                );
                crate::import::give_back(git_dir, "HEAD", owner);
                crate::import::give_back(git_dir, "logs/HEAD", owner);
                out.head_changed = true;
                crash_point();
            }
            Err(reason) => ev.push(
                "ref_refused",
                Severity::Alert,
                json!({ "ref": "HEAD", "reason": reason }),
            ),
        }
    }
    let idx = dir.join("index.new");
    if c.index && idx.exists() {
        match fs::rename(&idx, git_dir.join("index")) {
            Ok(()) => {
                crate::import::give_back(git_dir, "index", owner);
                out.index_replaced = true;
                crash_point();
            }
            Err(e) => ev.push(
                "index_unreadable",
                Severity::Warn,
                json!({ "path": "index", "reason": format!("the imported index could not be put in place: {e}") }),
            ),
        }
    } else if c.index && !idx.exists() {
        // Renamed already before a crash.
        out.index_replaced = true;
    }
    out
}

/// Finishes or undoes the import a dead sbx-gitguard left in `git_dir`.
/// Returns whether there was one.
pub fn recover(git_dir: &Path, ev: &mut Events) -> io::Result<bool> {
    let dir = git_dir.join(DIR);
    match fs::symlink_metadata(&dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
        Ok(m) if !m.is_dir() => {
            // Not ours to interpret: the repository check reports it.
            return Err(io::Error::other(format!(
                "{} is not a directory",
                dir.display()
            )));
        }
        Ok(_) => {}
    }
    // Another import of this repository is alive (two sandboxes that end
    // together): it is waited for, bounded; failing at once lost the
    // second one's work (attacker helper-52).
    let wait = std::env::var("SBX_GITGUARD_BUSY_WAIT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(BUSY_WAIT, std::time::Duration::from_millis);
    let deadline = std::time::Instant::now() + wait;
    let _l = loop {
        match fs::symlink_metadata(&dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            _ => {}
        }
        // The lock is never created here while it may still come: an
        // import between its mkdir and its lock, or one removing its
        // journal (a file made in it then fails its removal).
        match lock_at(&dir, false) {
            Ok(Some(l)) => break l,
            Ok(None) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if fs::symlink_metadata(&dir).is_err() {
                    return Ok(false);
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
                if fs::symlink_metadata(&dir).is_err() {
                    return Ok(false);
                }
                if fs::symlink_metadata(dir.join("lock")).is_err() {
                    // Still none: a journal whose maker died before its
                    // lock.
                    if let Some(l) = lock_at(&dir, true)? {
                        break l;
                    }
                }
            }
            Err(e) => return Err(e),
        }
        // Checked on every way round the loop: a lock that keeps coming
        // and going never holds a run past the wait.
        if std::time::Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "{}: another import of this repository is in progress (its lock is held \
                     for more than {} ms)",
                    dir.display(),
                    wait.as_millis()
                ),
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    // It may have finished meanwhile and removed the directory (our lock
    // is then on a file of a removed directory): nothing to recover.
    if fs::symlink_metadata(dir.join("lock")).is_err() {
        return Ok(false);
    }
    // A commit record that is there but cannot be read is not "never
    // committed": its refs may be half applied, and only the user can tell.
    // (It is written by rename, so it is never partial.)
    let committed = match crate::stage::read_small(&dir.join("journal.json"), 64 << 20) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        r => Some(
            r.and_then(|b| serde_json::from_slice::<Committed>(&b).map_err(io::Error::other))
                .map_err(|e| io::Error::other(format!("{}/journal.json: {e}", dir.display())))?,
        ),
    };
    match committed {
        Some(c) => {
            let a = apply(git_dir, &dir, &c, ev);
            ev.push(
                "import_recovered",
                Severity::Warn,
                json!({ "journal": dir, "state": "committed", "action": "completed",
                        "refs": a.refs.len(), "head_changed": a.head_changed, "index": a.index_replaced,
                        "reason": "an sbx-gitguard died while importing a git stage" }),
            );
        }
        None => {
            // The objects it wrote stay: each was verified (hash, git fsck
            // --strict's checks) before it was written, and nothing this
            // import decided names them. Removing them was not safe: since
            // then the user's own git may have found one present and used
            // it (a commit of the same content: git writes no object it
            // already has), or a second import counted on it, and either
            // lost it (attacker helper-52). `git gc` prunes them once
            // nothing names them.
            let listed = crate::stage::read_small(&dir.join("pending.json"), 256 << 20)
                .ok()
                .and_then(|b| serde_json::from_slice::<Pending>(&b).ok())
                .map(|p| p.objects.len());
            ev.push(
                "import_recovered",
                Severity::Warn,
                json!({ "journal": dir, "state": "pending", "action": "undone",
                        "objects_left": listed,
                        "reason": "an sbx-gitguard died before its import was committed: no ref, HEAD or index \
                                   of it was applied; the verified objects it wrote stay until git gc" }),
            );
        }
    }
    dismantle(&dir)?;
    fsync_dir(git_dir)?;
    Ok(true)
}

/// [`recover`] at the start of `run` and `import`, its events logged (and
/// printed, escaped, when not info).
pub fn recover_at_start(git_dir: &Path) -> Result<(), sbx_core::Failure> {
    let mut ev = Events::default();
    let r = recover(git_dir, &mut ev);
    ev.finish();
    for (name, sev, fields) in &ev.list {
        crate::audit(name, *sev, fields.clone());
        if *sev != Severity::Info {
            say!(
                "{}: {}: {}",
                crate::TOOL,
                name,
                sbx_core::escape::controls(&fields.to_string())
            );
        }
    }
    r.map(|_| ()).map_err(|e| {
        if e.kind() == io::ErrorKind::WouldBlock {
            return sbx_core::Failure::new(format!("{}: {e}", git_dir.display()));
        }
        sbx_core::Failure::new(format!(
            "{}: unfinished git import: {e} (the import journal {DIR}/ blocks every run \
             until it is gone: check `git status` and `git log`, then remove it by hand; \
             the objects stay either way)",
            git_dir.display()
        ))
    })
}

/// The command that brings a deleted ref back, each word shell-quoted: a
/// ref name may hold `;`, `$`, `|`, backquotes and quotes (git's rules
/// allow them), and a name like `x;curl${IFS}...|sh;#` made the command
/// the log hands the user run that instead.
fn restore_command(name: &str, old: Option<&str>) -> String {
    match old.map(Value::parse) {
        Some(Value::Sym(t)) => format!("git symbolic-ref {} {}", sh_quote(name), sh_quote(&t)),
        _ => format!(
            "git update-ref {} {}",
            sh_quote(name),
            sh_quote(old.unwrap_or(""))
        ),
    }
}

/// `w` as one word for a POSIX shell.
fn sh_quote(w: &str) -> String {
    if !w.is_empty()
        && w.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b))
    {
        w.to_string()
    } else {
        format!("'{}'", w.replace('\'', "'\\''"))
    }
}
