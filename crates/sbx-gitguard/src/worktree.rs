//! Linked worktrees from the stage: `git worktree add` in one call, commits
//! in it in the next, `git worktree remove` after.
//!
//! The sandbox writes a worktree's administrative dir (`.git/worktrees/NAME`)
//! into the stage and its `.git` file into the project. The admin dir is
//! carried to the host when it is what `git worktree add` writes:
//! - `gitdir`: one line, the absolute path of `W/.git` for a directory W
//!   inside the project (not the project itself, not inside `.git`, no
//!   symbolic link on the way), and `W/.git` a regular file pointing back
//!   to this admin dir;
//! - `commondir`: `../..`;
//! - `HEAD`: a branch that exists after the import, or an existing commit
//!   (its history complete);
//! - `config.worktree` (when present): only the sparse-checkout keys git
//!   writes there (an allowlist: git keeps adding keys that run commands);
//! - `index`: rebuilt like the main index (`import::take_index`);
//! - `logs/HEAD`: checked like every reflog (reflog.rs);
//! - `locked`: a short text.
//!
//! `hooks` or `config` there are refused with an alert (git reads neither
//! from a worktree's admin dir; a planted one is a probe); rebase, merge and
//! bisect state is not carried (dropped with a warning); anything else is
//! refused. A whole admin dir that fails is not imported, with an alert,
//! and its `.git` file in the project is then removed by the check that
//! follows as a planted repository. A removal (`git worktree remove`,
//! `prune`) is carried when the worktree's `.git` file no longer points to
//! the admin dir; otherwise it is refused (the host's worktree would lose
//! its git dir).

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use sbx_core::Severity;
use serde_json::json;

use crate::import::Events;
use crate::reflog;
use crate::refs::Value;

/// Bytes of one admin file (HEAD, gitdir, commondir, locked, config.worktree).
const MAX_FILE: u64 = 64 << 10;

/// Entries git writes during a merge, rebase, cherry-pick or bisect in a
/// worktree: not carried across calls (see the in-progress state of the
/// main git dir).
const TRANSIENT: &[&str] = &[
    "FETCH_HEAD",
    "AUTO_MERGE",
    "MERGE_HEAD",
    "MERGE_MSG",
    "MERGE_MODE",
    "MERGE_RR",
    "CHERRY_PICK_HEAD",
    "REVERT_HEAD",
    "REBASE_HEAD",
    "SQUASH_MSG",
    "rebase-merge",
    "rebase-apply",
    "sequencer",
    "BISECT_LOG",
    "BISECT_START",
    "BISECT_TERMS",
    "BISECT_EXPECTED_REV",
    "BISECT_ANCESTORS_OK",
    "BISECT_NAMES",
    "BISECT_RUN",
];

/// Entries `git worktree add` itself leaves that the host's git does not
/// need (an empty per-worktree `refs/`, ORIG_HEAD): not carried, silently.
const SILENT: &[&str] = &["ORIG_HEAD", "refs", "COMMIT_EDITMSG"];

/// Whether a new `.git` file's target `t` is the admin dir of a worktree
/// the sandbox may have added: `G/worktrees/NAME` of one of the user's git
/// dirs `G`, not (yet) there. git refuses such a `.git` file (its target is
/// not a git dir), so it runs nothing; the stage import then writes the
/// admin dir only after its checks, and the check after it removes the
/// `.git` file when it did not.
pub fn pending_link(t: &Path, mut user_git_dirs: impl Iterator<Item = PathBuf>) -> bool {
    let t = normalize(t);
    let (Some(name), Some(parent)) = (t.file_name(), t.parent()) else {
        return false;
    };
    valid_name(&name.to_string_lossy())
        && fs::symlink_metadata(&t).is_err()
        && parent.file_name() == Some("worktrees".as_ref())
        && user_git_dirs.any(|g| parent.parent() == Some(g.as_path()))
}

/// Admin files written as they are (after their checks).
const FILES: &[&str] = &["HEAD", "commondir", "gitdir", "config.worktree", "locked"];

/// The keys a worktree's `config.worktree` may set (what `git
/// sparse-checkout` writes there).
const WORKTREE_CONFIG_KEYS: &[&str] = &[
    "core.sparsecheckout",
    "core.sparsecheckoutcone",
    "index.sparse",
];

#[derive(Debug)]
pub enum Op {
    Write(Box<Write>),
    Remove { name: String },
}

#[derive(Debug)]
pub struct Write {
    name: String,
    work_tree: PathBuf,
    /// The stage's admin dir replaced the host's whole (opaque: removed
    /// and made again in the sandbox), or it is new.
    fresh: bool,
    /// Files to write (Some) or remove (None).
    files: Vec<(&'static str, Option<Vec<u8>>)>,
    index: Option<PathBuf>,
    head_commit: Option<git2::Oid>,
    log: Option<reflog::Log>,
}

fn is_whiteout(m: &fs::Metadata) -> bool {
    m.file_type().is_char_device() && m.rdev() == 0
}

fn is_opaque(p: &Path) -> bool {
    ["trusted.overlay.opaque", "user.overlay.opaque"]
        .iter()
        .any(|n| xattr(p, n).as_deref() == Some(b"y"))
}

fn xattr(p: &Path, name: &str) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let cp = std::ffi::CString::new(p.as_os_str().as_bytes()).ok()?;
    let cn = std::ffi::CString::new(name).ok()?;
    let mut buf = [0u8; 16];
    // SAFETY: both strings are NUL-terminated and live across the call; the
    // buffer's length is passed with it.
    let n =
        unsafe { libc::lgetxattr(cp.as_ptr(), cn.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (n >= 0).then(|| buf[..n as usize].to_vec())
}

/// `a/b/../c` -> `a/c`, lexically.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 255
        && !n.starts_with('.')
        && n.bytes().all(|b| b > 0x20 && b != 0x7f && b != b'/')
}

fn refuse(ev: &mut Events, name: &str, reason: impl Into<String>) {
    ev.push(
        "worktree_refused",
        Severity::Alert,
        json!({ "path": format!("worktrees/{name}"), "reason": reason.into(),
                "action": "not imported (a .git file in the project naming it is then removed)" }),
    );
}

/// The worktree W whose `W/.git` the `gitdir` file names, when W lies in
/// the project and its `.git` file points back to `admin`.
pub fn check_gitdir(
    text: &[u8],
    project: &Path,
    git_dir: &Path,
    admin: &Path,
) -> Result<PathBuf, String> {
    let t = std::str::from_utf8(text).map_err(|_| "gitdir is not text".to_string())?;
    let line = t.strip_suffix('\n').unwrap_or(t);
    if line.contains('\n') || line.bytes().any(|b| b < 0x20) {
        return Err("gitdir is not one line".into());
    }
    let dotgit = Path::new(line);
    if !dotgit.is_absolute() || dotgit.file_name() != Some(".git".as_ref()) {
        return Err(format!(
            "gitdir '{line}' is not the absolute path of a worktree's .git"
        ));
    }
    let w = normalize(dotgit.parent().unwrap());
    if !w.starts_with(project) || w == project || w.starts_with(git_dir) {
        return Err(format!(
            "gitdir names {}, outside the project {} (or the project itself, or its .git)",
            w.display(),
            project.display()
        ));
    }
    // No symbolic link on the way out of the project.
    match fs::canonicalize(&w) {
        Ok(c) if c == w => {}
        Ok(c) => {
            return Err(format!(
                "the worktree {} resolves to {} (a symbolic link)",
                w.display(),
                c.display()
            ));
        }
        Err(e) => return Err(format!("the worktree {}: {e}", w.display())),
    }
    let f = w.join(".git");
    match fs::symlink_metadata(&f) {
        Ok(m) if m.is_file() => {}
        _ => return Err(format!("{} is not a .git file", f.display())),
    }
    match crate::layout::read_gitfile(&f).map(|t| normalize(&t)) {
        Some(t) if t == admin => Ok(w),
        Some(t) => Err(format!(
            "{} points to {}, not back to {}",
            f.display(),
            t.display(),
            admin.display()
        )),
        None => Err(format!("{} is not 'gitdir: PATH'", f.display())),
    }
}

/// Reads a regular file (never a symbolic link), bounded.
fn read(p: &Path) -> Result<Option<Vec<u8>>, String> {
    match fs::symlink_metadata(p) {
        Err(_) => Ok(None),
        Ok(m) if is_whiteout(&m) => Ok(None),
        Ok(m) if m.is_file() => crate::stage::read_small(p, MAX_FILE)
            .map(Some)
            .map_err(|e| format!("{}: {e}", p.display())),
        Ok(_) => Err(format!(
            "{} is not a regular file (never followed)",
            p.display()
        )),
    }
}

/// The worktree changes of the stage's upper layer (`upper/worktrees`),
/// each checked as the module doc says.
pub fn plan(
    upper: &Path,
    git_dir: &Path,
    ev: &mut Events,
    need: &mut dyn FnMut(git2::Oid) -> Result<Vec<git2::Oid>, String>,
    is_commit: &dyn Fn(git2::Oid) -> bool,
    after: &dyn Fn(&str) -> Option<git2::Oid>,
    bring: &mut Vec<git2::Oid>,
) -> Vec<Op> {
    let mut out = Vec::new();
    let up = upper.join("worktrees");
    let host = git_dir.join("worktrees");
    let host_names = || -> Vec<String> {
        fs::read_dir(&host)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut removed: Vec<String> = Vec::new();
    let mut written: Vec<(String, PathBuf, bool)> = Vec::new();
    match fs::symlink_metadata(&up) {
        Err(_) => return out,
        Ok(m) if is_whiteout(&m) => removed = host_names(),
        Ok(m) if m.is_dir() => {
            let Ok(rd) = fs::read_dir(&up) else {
                return out;
            };
            for e in rd.filter_map(|e| e.ok()) {
                let name = e.file_name().to_string_lossy().into_owned();
                let Ok(m) = fs::symlink_metadata(e.path()) else {
                    continue;
                };
                if !valid_name(&name) {
                    refuse(ev, &name, "not a worktree name git makes");
                } else if is_whiteout(&m) {
                    removed.push(name);
                } else if m.is_dir() {
                    let opaque = is_opaque(&e.path());
                    written.push((name, e.path(), opaque));
                } else {
                    refuse(ev, &name, "not a directory (never followed)");
                }
            }
            if is_opaque(&up) {
                for n in host_names() {
                    if !written.iter().any(|w| w.0 == n) && !removed.contains(&n) {
                        removed.push(n);
                    }
                }
            }
        }
        Ok(_) => {
            refuse(ev, "*", "worktrees is not a directory (never followed)");
            return out;
        }
    }
    let project = git_dir.parent().unwrap_or(Path::new("/")).to_path_buf();
    for name in removed {
        let admin = host.join(&name);
        if !fs::symlink_metadata(&admin).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        let w = read(&admin.join("gitdir"))
            .ok()
            .flatten()
            .and_then(|g| check_gitdir(&g, &project, git_dir, &admin).ok());
        match w {
            // Its work tree still links to it: removing the admin dir would
            // break the host's worktree (`rm -rf .git/worktrees/X`).
            Some(w) => refuse(
                ev,
                &name,
                format!(
                    "removed while its worktree {} still links to it",
                    w.display()
                ),
            ),
            None => out.push(Op::Remove { name: name.clone() }),
        }
    }
    for (name, dir, opaque) in written {
        let admin = host.join(&name);
        let fresh = opaque || !admin.exists();
        match plan_one(
            &name, &dir, &admin, fresh, &project, git_dir, ev, need, is_commit, after, bring,
        ) {
            Ok(Some(w)) => out.push(Op::Write(Box::new(w))),
            Ok(None) => {}
            Err(reason) => refuse(ev, &name, reason),
        }
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn plan_one(
    name: &str,
    dir: &Path,
    admin: &Path,
    fresh: bool,
    project: &Path,
    git_dir: &Path,
    ev: &mut Events,
    need: &mut dyn FnMut(git2::Oid) -> Result<Vec<git2::Oid>, String>,
    is_commit: &dyn Fn(git2::Oid) -> bool,
    after: &dyn Fn(&str) -> Option<git2::Oid>,
    bring: &mut Vec<git2::Oid>,
) -> Result<Option<Write>, String> {
    // What the sandbox left there, name by name.
    let rd = fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for e in rd.filter_map(|e| e.ok()) {
        let n = e.file_name().to_string_lossy().into_owned();
        if FILES.contains(&n.as_str()) || n == "index" || n == "logs" || n.ends_with(".lock") {
            continue;
        }
        if n == "hooks" || n == "config" {
            return Err(format!(
                "{n} in a worktree's admin dir (git reads neither there)"
            ));
        }
        if SILENT.contains(&n.as_str()) {
            continue;
        }
        if TRANSIENT.contains(&n.as_str()) || n.starts_with("BISECT_") {
            ev.push(
                "stage_entry_dropped",
                Severity::Warn,
                json!({ "path": format!("worktrees/{name}/{n}"), "reason": "a worktree's merge, rebase or bisect state is not carried across calls" }),
            );
            continue;
        }
        return Err(format!(
            "{n}: not a file git makes in a worktree's admin dir"
        ));
    }
    // The admin dir as the sandbox saw it: its files over the host's.
    let view = |f: &str| -> Result<Option<Vec<u8>>, String> {
        let p = dir.join(f);
        match fs::symlink_metadata(&p) {
            Ok(_) => read(&p),
            Err(_) if fresh => Ok(None),
            Err(_) => read(&admin.join(f)),
        }
    };
    let gitdir = view("gitdir")?.ok_or("no gitdir file")?;
    let commondir = view("commondir")?.ok_or("no commondir file")?;
    let head = view("HEAD")?.ok_or("no HEAD")?;
    // What the sandbox wrote is checked; a link of the host's own worktree
    // (anywhere: the user made it) that it left alone is the user's.
    let wrote = |f: &str| fresh || fs::symlink_metadata(dir.join(f)).is_ok();
    let w = if wrote("gitdir") {
        check_gitdir(&gitdir, project, git_dir, admin)?
    } else {
        let t = String::from_utf8_lossy(&gitdir);
        Path::new(t.trim_end())
            .parent()
            .unwrap_or(Path::new("/"))
            .to_path_buf()
    };
    if wrote("commondir") && commondir.strip_suffix(b"\n").unwrap_or(&commondir) != b"../.." {
        return Err(format!(
            "commondir is '{}', not '../..'",
            String::from_utf8_lossy(&commondir).trim_end()
        ));
    }
    let head_commit = match Value::parse(&String::from_utf8_lossy(&head)) {
        Value::Sym(s) if s.starts_with("refs/heads/") && crate::refs::valid_refname(&s) => {
            // An unborn branch (`git worktree add --orphan`) has no commit.
            after(&s)
        }
        Value::Oid(o) => {
            let id = git2::Oid::from_str(&o).map_err(|e| e.message().to_string())?;
            if !is_commit(id) {
                return Err(format!("HEAD names {o}, which is not an existing commit"));
            }
            bring.extend(
                need(id)
                    .map_err(|m| format!("HEAD's history is incomplete: object {m} is missing"))?,
            );
            Some(id)
        }
        _ => {
            return Err(format!(
                "HEAD is not 'ref: refs/heads/NAME' or a commit id ('{}')",
                String::from_utf8_lossy(&head)
                    .trim_end()
                    .chars()
                    .take(80)
                    .collect::<String>()
            ));
        }
    };
    if let Some(c) = view("config.worktree")? {
        let t = String::from_utf8(c).map_err(|_| "config.worktree is not text".to_string())?;
        let entries = crate::gitconfig::parse(&t).map_err(|e| format!("config.worktree: {e}"))?;
        // An allowlist, not the denylist: git keeps adding keys that run
        // commands (gpg.ssh.defaultKeyCommand, tar.*.command, ...), and a
        // worktree's own config only ever needs the sparse-checkout ones.
        let bad: Vec<String> = entries
            .iter()
            .map(|e| e.key())
            .filter(|k| !WORKTREE_CONFIG_KEYS.contains(&k.to_ascii_lowercase().as_str()))
            .collect();
        if !bad.is_empty() {
            return Err(format!(
                "config.worktree sets keys outside what a worktree needs ({}): {}",
                WORKTREE_CONFIG_KEYS.join(", "),
                bad.join(", ")
            ));
        }
    }
    if let Some(l) = view("locked")?
        && l.iter().any(|&b| (b < 0x20 && b != b'\n') || b == 0x7f)
    {
        return Err("locked holds control characters".into());
    }
    // What changed: files the sandbox wrote or removed.
    let mut files = Vec::new();
    for f in FILES {
        let p = dir.join(f);
        match fs::symlink_metadata(&p) {
            Ok(m) if is_whiteout(&m) => files.push((*f, None)),
            Ok(_) => files.push((*f, read(&p)?)),
            Err(_) => {}
        }
    }
    let index = fs::symlink_metadata(dir.join("index"))
        .is_ok_and(|m| m.is_file())
        .then(|| dir.join("index"));
    let mut log = None;
    let lp = dir.join("logs/HEAD");
    if fs::symlink_metadata(&lp).is_ok_and(|m| m.is_file()) {
        match crate::stage::read_small(&lp, reflog::MAX_LOG_BYTES)
            .map_err(|e| reflog::Refusal::Bad(format!("unreadable: {e}")))
            .and_then(|d| reflog::check(&d, head_commit, need).map(|(n, b)| (d, n, b)))
        {
            Ok((data, entries, b)) => {
                bring.extend(b);
                log = Some(reflog::Log {
                    rel: format!("worktrees/{name}/logs/HEAD"),
                    name: None,
                    last: head_commit,
                    data,
                    entries,
                });
            }
            Err(r) => {
                let (sev, reason) = match r {
                    reflog::Refusal::Bad(m) => (Severity::Alert, m),
                    reflog::Refusal::Stale(m) => (Severity::Warn, m),
                };
                ev.push(
                    "reflog_refused",
                    sev,
                    json!({ "ref": "HEAD", "path": format!("worktrees/{name}/logs/HEAD"), "reason": reason,
                            "action": "not imported (the host's reflog is kept)" }),
                );
            }
        }
    }
    if files.is_empty() && index.is_none() && log.is_none() && !fresh {
        return Ok(None);
    }
    Ok(Some(Write {
        name: name.to_string(),
        work_tree: w,
        fresh,
        files,
        index,
        head_commit,
        log,
    }))
}

/// Admin dirs an import wrote and removed.
#[derive(Debug, Default)]
pub struct Applied {
    pub written: Vec<PathBuf>,
    pub removed: Vec<PathBuf>,
}

/// Carries the planned worktree changes to the host (after the refs, so a
/// HEAD names a branch that exists).
pub fn apply(
    git_dir: &Path,
    ops: Vec<Op>,
    scratch: &Path,
    owner: Option<(u32, u32)>,
    max_index_bytes: u64,
    ev: &mut Events,
) -> Applied {
    let mut out = Applied::default();
    let host = git_dir.join("worktrees");
    for op in ops {
        match op {
            Op::Remove { name } => {
                let r = crate::fsutil::remove(&host.join(&name));
                if r.is_ok() {
                    out.removed.push(host.join(&name));
                }
                ev.push(
                    "worktree_removed",
                    if r.is_ok() {
                        Severity::Info
                    } else {
                        Severity::Warn
                    },
                    json!({ "path": format!("worktrees/{name}"),
                            "error": r.err().map(|e| e.to_string()) }),
                );
            }
            Op::Write(w) => {
                let admin = host.join(&w.name);
                let r = (|| -> std::io::Result<()> {
                    crate::fsutil::make_parents_safe(git_dir, &format!("worktrees/{}/x", w.name))?;
                    if w.fresh && fs::symlink_metadata(&admin).is_ok() {
                        crate::fsutil::remove(&admin)?;
                    }
                    crate::fsutil::create_dirs_owned(&admin, git_dir)?;
                    for (f, data) in &w.files {
                        match data {
                            Some(d) => {
                                crate::fsutil::write_atomic(&admin.join(f), d, 0o644, owner)?
                            }
                            None => {
                                let _ = fs::remove_file(admin.join(f));
                            }
                        }
                    }
                    Ok(())
                })();
                if let Err(e) = r {
                    refuse(ev, &w.name, format!("cannot write it: {e}"));
                    continue;
                }
                if let Some(up) = &w.index {
                    let tmp = scratch.join(format!(".worktree-index.{}", w.name));
                    if crate::import::take_index(
                        git_dir,
                        up,
                        &tmp,
                        w.head_commit,
                        owner,
                        max_index_bytes,
                        ev,
                    ) {
                        if let Err(e) = fs::rename(&tmp, admin.join("index")) {
                            ev.push(
                                "index_unreadable",
                                Severity::Warn,
                                json!({ "path": format!("worktrees/{}/index", w.name), "reason": e.to_string() }),
                            );
                        }
                        crate::import::give_back(
                            git_dir,
                            &format!("worktrees/{}/index", w.name),
                            owner,
                        );
                    }
                }
                if let Some(l) = &w.log {
                    reflog::apply(git_dir, std::slice::from_ref(l), owner, ev);
                }
                out.written.push(admin.clone());
                ev.push(
                    "worktree_imported",
                    Severity::Info,
                    json!({ "path": format!("worktrees/{}", w.name), "worktree": w.work_tree,
                            "new": w.fresh, "head": w.head_commit.map(|c| c.to_string()) }),
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gitdir_must_name_a_worktree_of_the_project_linking_back() {
        let t = tempfile::tempdir().unwrap();
        let proj = t.path().canonicalize().unwrap().join("p");
        let g = proj.join(".git");
        let admin = g.join("worktrees/f2");
        let w = proj.join(".wt/f2");
        fs::create_dir_all(&w).unwrap();
        fs::create_dir_all(&admin).unwrap();
        let line = format!("{}\n", w.join(".git").display());
        // No .git file yet, then one pointing elsewhere, then back.
        assert!(check_gitdir(line.as_bytes(), &proj, &g, &admin).is_err());
        fs::write(w.join(".git"), "gitdir: /elsewhere\n").unwrap();
        assert!(check_gitdir(line.as_bytes(), &proj, &g, &admin).is_err());
        fs::write(w.join(".git"), format!("gitdir: {}\n", admin.display())).unwrap();
        assert_eq!(check_gitdir(line.as_bytes(), &proj, &g, &admin).unwrap(), w);
        for bad in [
            "/etc/.git\n".to_string(),
            format!("{}/.git\n", proj.display()),
            format!("{}/x/.git\n", g.display()),
            format!("{}/../q/.git\n", proj.display()),
            ".wt/f2/.git\n".to_string(),
            format!(
                "{}\n{}\n",
                w.join(".git").display(),
                w.join(".git").display()
            ),
        ] {
            assert!(
                check_gitdir(bad.as_bytes(), &proj, &g, &admin).is_err(),
                "{bad}"
            );
        }
        // A symbolic link on the way.
        std::os::unix::fs::symlink("/tmp", proj.join("ln")).unwrap();
        let via = format!("{}/ln/.git\n", proj.display());
        assert!(check_gitdir(via.as_bytes(), &proj, &g, &admin).is_err());
    }

    #[test]
    fn pending_links_name_a_missing_admin_dir_of_a_user_repository() {
        let t = tempfile::tempdir().unwrap();
        let g = t.path().canonicalize().unwrap().join(".git");
        fs::create_dir_all(g.join("worktrees/there")).unwrap();
        let gs = || vec![g.clone()].into_iter();
        assert!(pending_link(&g.join("worktrees/f2"), gs()));
        assert!(pending_link(&g.join("x/../worktrees/f2"), gs()));
        assert!(!pending_link(&g.join("worktrees/there"), gs()));
        assert!(!pending_link(&g.join("worktrees/.hidden"), gs()));
        assert!(!pending_link(&g.join("modules/f2"), gs()));
        assert!(!pending_link(Path::new("/other/.git/worktrees/f2"), gs()));
    }
}
