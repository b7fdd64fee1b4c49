//! Compare a repository with its snapshot, repair what was tampered with,
//! and report every finding.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sbx_core::Severity;
use serde::Serialize;

use crate::fsutil::{self, FileSnap};
use crate::gitconfig;
use crate::layout::{self, Layout, Scan, Unit, UnitKind};
use crate::looseset::LooseSet;
use crate::objects;
use crate::refs::{self, Value};
use crate::rules;
use crate::snapshot::{self, Snapshot, UnitSnap};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Report only (the `check` command).
    Check,
    /// Report and alert, change nothing (`run --alert-only`).
    AlertOnly,
    /// Report, alert and repair.
    Repair,
}

/// One thing found, and what was done about it.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// head, refs, objects, config, hooks, extra_files, bare_repo, locks, repository
    pub check: &'static str,
    /// The git dir (or work tree) it concerns.
    pub repo: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    pub found: String,
    pub action: String,
    pub severity: Severity,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dangerous_keys: Vec<String>,
    /// The repository is still not as it must be (repair failed or is
    /// impossible).
    pub unrecoverable: bool,
}

#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub findings: Vec<Finding>,
    pub full_check: bool,
}

impl Report {
    /// Adds `other`'s findings after this one's.
    pub fn absorb(&mut self, other: Report) {
        self.full_check |= other.full_check;
        self.findings.extend(other.findings);
    }

    pub fn unrecoverable(&self) -> Option<&Finding> {
        self.findings.iter().find(|f| f.unrecoverable)
    }
    pub fn problems(&self) -> usize {
        self.findings
            .iter()
            .filter(|f| f.severity != Severity::Info)
            .count()
    }
}

pub struct Ctx {
    pub mode: Mode,
    pub report: Report,
}

fn disp(p: &Path) -> String {
    p.display().to_string()
}

#[allow(clippy::too_many_arguments)]
impl Ctx {
    pub fn new(mode: Mode) -> Self {
        Ctx {
            mode,
            report: Report::default(),
        }
    }

    /// A tampering finding (alert) with its repair.
    fn fix(
        &mut self,
        check: &'static str,
        repo: &Path,
        path: Option<&Path>,
        found: String,
        done: &str,
        keys: Vec<String>,
        f: impl FnOnce() -> Result<(), String>,
    ) {
        let (action, unrecoverable) = match self.mode {
            Mode::Check => ("reported".to_string(), false),
            Mode::AlertOnly => ("not repaired (--alert-only)".to_string(), false),
            // One repair step is short and must not be cut in half.
            Mode::Repair => {
                let r = hold_signals(f);
                crate::dirlist::Settled::changed();
                match r {
                    Ok(()) => (done.to_string(), false),
                    Err(e) => (format!("repair failed: {e}"), true),
                }
            }
        };
        self.report.findings.push(Finding {
            check,
            repo: disp(repo),
            path: path.map(disp),
            found,
            action,
            severity: Severity::Alert,
            dangerous_keys: keys,
            unrecoverable,
        });
    }

    /// A finding that is only reported (or kept).
    fn note(
        &mut self,
        check: &'static str,
        repo: &Path,
        path: Option<&Path>,
        found: String,
        severity: Severity,
        action: &str,
        unrecoverable: bool,
    ) {
        self.report.findings.push(Finding {
            check,
            repo: disp(repo),
            path: path.map(disp),
            found,
            action: action.to_string(),
            severity,
            dangerous_keys: Vec::new(),
            unrecoverable: unrecoverable && self.mode == Mode::Repair,
        });
    }
}

/// Runs one repair step with the termination signals held back.
fn hold_signals(f: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
    let _hold = crate::sig::Hold::new();
    f()
}

/// Lock files of git dirs (a concurrent git process, or one left behind).
pub fn locks(units: &[Unit]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for u in units {
        for n in [
            "index.lock",
            "HEAD.lock",
            "config.lock",
            "packed-refs.lock",
            "shallow.lock",
        ] {
            let p = u.path.join(n);
            if fs::symlink_metadata(&p).is_ok() {
                out.push(p);
            }
        }
        let mut stack = vec![u.path.join("refs")];
        while let Some(d) = stack.pop() {
            let Ok(rd) = fs::read_dir(&d) else { continue };
            for e in rd.filter_map(|e| e.ok()) {
                let p = e.path();
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(p);
                } else if rules::is_lock(&e.file_name().to_string_lossy()) {
                    out.push(p);
                }
            }
        }
    }
    out
}

/// Waits up to `timeout` for the locks to go; returns the ones still there.
pub fn wait_locks(units: &[Unit], timeout: Duration) -> Vec<PathBuf> {
    let end = Instant::now() + timeout;
    loop {
        let l = locks(units);
        if l.is_empty() || Instant::now() >= end {
            return l;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn ok_object(repo: &git2::Repository, oid: &str, commit: bool, damaged: &objects::Damaged) -> bool {
    let Ok(id) = git2::Oid::from_str(oid) else {
        return false;
    };
    if damaged.contains(&id) {
        return false;
    }
    let Ok(odb) = repo.odb() else { return false };
    match odb.read_header(id) {
        Ok((_, t)) => !commit || t == git2::ObjectType::Commit,
        Err(_) => false,
    }
}

pub fn open(p: &Path) -> Result<git2::Repository, git2::Error> {
    use git2::RepositoryOpenFlags as F;
    git2::Repository::open_ext(
        p,
        F::NO_SEARCH | F::BARE | F::NO_DOTGIT,
        std::iter::empty::<&std::ffi::OsStr>(),
    )
}

/// Whether objects the snapshot had are gone: a loose object that is no
/// longer anywhere, or a pack gone while a ref tip of the snapshot is
/// missing.
/// `loose_now`: the loose object names there now (a scan, not a stat each).
fn objects_gone(us: &UnitSnap, repo: &git2::Repository, loose_now: &LooseSet) -> bool {
    let Ok(odb) = repo.odb() else { return false };
    let objs = us.path.join("objects");
    let loose_gone = us
        .loose
        .gone(loose_now)
        .any(|id| git2::Oid::from_str(&id).is_ok_and(|o| !odb.exists(o)));
    if loose_gone {
        return true;
    }
    let pack_gone = us
        .packs
        .keys()
        .any(|n| n.ends_with(".pack") && !objs.join("pack").join(n).exists());
    pack_gone
        && us.refs.iter().flat_map(|r| r.refs.values()).any(|v| {
            Value::parse(v)
                .oid()
                .and_then(|o| git2::Oid::from_str(o).ok())
                .is_some_and(|o| !odb.exists(o))
        })
}

/// What the structural check verified (kept in a snapshot).
pub struct Verified {
    pub packs: BTreeMap<String, objects::Stat>,
    pub loose: LooseSet,
    /// The fan-out directories whose objects all verified, by stat.
    pub loose_dirs: BTreeMap<String, crate::dirlist::Seen>,
}

/// Structural check of one git dir's object store and refs, plus the full
/// check when asked or when there is any sign of damage. `lc`: the caller's
/// [`objects::check_loose`] of this store, as it is now (one scan, not
/// two). Returns the pack files that were checksummed in full.
#[allow(clippy::too_many_arguments)]
pub fn check_objects(
    ctx: &mut Ctx,
    u: &Path,
    repo: &git2::Repository,
    cached: &BTreeMap<String, objects::Stat>,
    loose_before: &LooseSet,
    lc: objects::Loose,
    sha256: bool,
    full: bool,
    extra_roots: &[(String, String)],
    cur: &BTreeMap<String, Value>,
    snap_refs: Option<&BTreeMap<String, String>>,
) -> Verified {
    let objs = u.join("objects");
    if !fsutil::is_real_dir(&objs) {
        ctx.note(
            "objects",
            u,
            Some(&objs),
            "objects/ is not a directory (replaced by a symlink or file)".into(),
            Severity::Alert,
            "cannot be restored from a snapshot",
            true,
        );
        return Verified {
            packs: BTreeMap::new(),
            loose: LooseSet::default(),
            loose_dirs: BTreeMap::new(),
        };
    }
    // A snapshot (no snapshot refs yet) does not rehash packs unless --full;
    // after a command, packs that changed are rehashed.
    let hash = if full {
        objects::Hash::All
    } else if snap_refs.is_none() {
        objects::Hash::Nothing
    } else {
        objects::Hash::Changed
    };
    let (mut problems, verified) = objects::check_packs(&objs, cached, sha256, hash);
    let damaged = objects::Damaged::new(&lc.damaged, &objs, sha256, &lc.objs, &lc.unstated);
    problems.extend(lc.problems);
    let loose_dirs = lc.dirs;
    // A fan-out directory the snapshot knew only from a damaged cache,
    // and changed since: the full check decides what is missing.
    let unknown_before = loose_before.unknown_in(&lc.objs);
    // Loose objects of the snapshot that are gone and not packed either.
    if let Ok(odb) = repo.odb() {
        for id in loose_before.gone(&lc.objs) {
            if let Ok(oid) = git2::Oid::from_str(&id)
                && !odb.exists(oid)
            {
                problems.push(objects::Problem {
                    path: None,
                    what: format!("object {id} (loose at snapshot time) is gone"),
                });
            }
        }
    }
    // Every object the snapshot had is still there when no verified pack
    // changed and no loose object of the snapshot is gone: a ref that still
    // has its snapshot value then still resolves (it did at snapshot time),
    // and only changed or new refs need their tip looked up.
    let packs_changed_early = cached.iter().any(|(n, st)| {
        n.ends_with(".pack")
            && !verified.contains_key(n)
            && objects_stat_changed(&objs.join("pack").join(n), st)
    });
    let intact = !packs_changed_early && problems.is_empty() && !full && !unknown_before;
    let mut roots = Vec::new();
    for (name, v) in cur {
        match v {
            Value::Oid(o) => {
                let unchanged = intact && snap_refs.and_then(|r| r.get(name)) == Some(o);
                if !unchanged
                    && let Some(p) =
                        objects::check_tip(repo, name, o, name.starts_with("refs/heads/"), &damaged)
                {
                    problems.push(p);
                }
                roots.push((name.clone(), o.clone()));
            }
            Value::Sym(t) if !cur.contains_key(t) => problems.push(objects::Problem {
                path: None,
                what: format!("{name} is a symbolic ref to missing {t}"),
            }),
            Value::Sym(_) => {}
            Value::Invalid(s) => problems.push(objects::Problem {
                path: None,
                what: format!("{name} is unreadable ('{s}')"),
            }),
        }
    }
    if let Ok(Some(h)) = fsutil::read_text(&u.join("HEAD"), fsutil::MAX_SMALL)
        && let Value::Oid(o) = Value::parse(&h)
    {
        if let Some(p) = objects::check_tip(repo, "HEAD", &o, true, &damaged) {
            problems.push(p);
        }
        roots.push(("HEAD".into(), o));
    }
    // A pack the snapshot verified that is gone or changed: objects may be
    // lost (or it was repacked); the full check decides.
    let packs_changed = cached.iter().any(|(n, st)| {
        n.ends_with(".pack")
            && !verified.contains_key(n)
            && objects_stat_changed(&objs.join("pack").join(n), st)
    });
    let run_full = full || !problems.is_empty() || packs_changed || unknown_before;
    for p in &problems {
        ctx.note(
            "objects",
            u,
            p.path.as_deref().map(Path::new),
            p.what.clone(),
            Severity::Alert,
            "reported (objects cannot be restored from a snapshot)",
            true,
        );
    }
    if run_full {
        ctx.report.full_check = true;
        roots.extend(extra_roots.iter().cloned());
        let fp = objects::full(repo, &roots, &damaged);
        drop(damaged);
        for p in &fp {
            ctx.note(
                "objects",
                u,
                None,
                p.what.clone(),
                Severity::Alert,
                "reported (objects cannot be restored from a snapshot)",
                true,
            );
        }
        if fp.is_empty() && problems.is_empty() && unknown_before {
            ctx.note(
                "objects",
                u,
                None,
                "a fan-out directory known only from a damaged cache changed; the full connectivity check passed"
                    .into(),
                Severity::Info,
                "none needed",
                false,
            );
        }
        if fp.is_empty() && problems.is_empty() && packs_changed {
            ctx.note(
                "objects",
                u,
                None,
                "packs changed since the snapshot (repacked); the full connectivity check passed"
                    .into(),
                Severity::Info,
                "none needed",
                false,
            );
        }
    }
    Verified {
        packs: verified,
        loose: lc.objs,
        loose_dirs,
    }
}

fn objects_stat_changed(p: &Path, st: &objects::Stat) -> bool {
    use std::os::unix::fs::MetadataExt;
    match fs::metadata(p) {
        Ok(m) => {
            m.ino() != st.ino
                || m.size() != st.size
                || (i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()))
                    != st.ctime_ns
        }
        Err(_) => true,
    }
}

/// Damage present before any command ran (for a snapshot), and the pack
/// stats verified along the way.
/// `loose_cache`: per git dir, loose objects verified in full before (by
/// stat), which are not read again.
pub fn assess(
    l: &Layout,
    units: &[Unit],
    full: bool,
    loose_cache: &BTreeMap<PathBuf, crate::loosecache::Cache>,
) -> (Report, BTreeMap<PathBuf, Verified>) {
    let mut ctx = Ctx::new(Mode::Check);
    let mut stats = BTreeMap::new();
    for u in units {
        // Nothing is opened through a FIFO, socket or device: refuse.
        let specials = fsutil::specials(&u.path, ".sbx-gitguard");
        for p in &specials {
            let kind = fs::symlink_metadata(p)
                .map(|m| fsutil::type_name(&m))
                .unwrap_or("a special file");
            ctx.note(
                "extra_files",
                &u.path,
                Some(p),
                format!("{kind} in the git dir (git makes none; opening it can block)"),
                Severity::Alert,
                "reported",
                false,
            );
        }
        // libgit2 reads the config whole when it opens the repository.
        let mut config_ok = true;
        for n in ["config", "config.worktree"] {
            let p = u.path.join(n);
            if let Err(e) = fsutil::read_text(&p, fsutil::MAX_CONFIG) {
                config_ok = false;
                ctx.note(
                    "config",
                    &u.path,
                    Some(&p),
                    format!("config unusable: {e}"),
                    Severity::Alert,
                    "reported",
                    false,
                );
            }
        }
        if !specials.is_empty() || !config_ok {
            continue;
        }
        let head = fsutil::read_bounded(&u.path.join("HEAD"), fsutil::MAX_SMALL)
            .map(|h| Value::parse(&String::from_utf8_lossy(&h)));
        match &head {
            Err(e) => ctx.note(
                "head",
                &u.path,
                None,
                format!("HEAD unreadable: {e}"),
                Severity::Alert,
                "reported",
                false,
            ),
            Ok(Value::Invalid(s)) => ctx.note(
                "head",
                &u.path,
                None,
                format!("HEAD is invalid ('{s}')"),
                Severity::Alert,
                "reported",
                false,
            ),
            _ => {}
        }
        if !u.kind.has_objects() {
            continue;
        }
        if let Err(e) = refs::read_packed(&u.path) {
            ctx.note(
                "refs",
                &u.path,
                None,
                e.to_string(),
                Severity::Alert,
                "reported",
                false,
            );
        }
        let repo = match open(&u.path) {
            Ok(r) => r,
            Err(e) => {
                ctx.note(
                    "repository",
                    &u.path,
                    None,
                    format!("cannot open: {}", e.message()),
                    Severity::Alert,
                    "reported",
                    false,
                );
                continue;
            }
        };
        let sha256 = snapshot::is_sha256(&u.path);
        let cache = loose_cache.get(&u.path);
        let v = check_objects(
            &mut ctx,
            &u.path,
            &repo,
            &BTreeMap::new(),
            &LooseSet::EMPTY,
            objects::check_loose(
                &u.path.join("objects"),
                cache.map(|c| &c.objs).unwrap_or(&LooseSet::EMPTY),
                sha256,
                cache.map(|c| &c.dirs),
            ),
            sha256,
            full,
            &[],
            &refs::read_all(&u.path).unwrap_or_default(),
            None,
        );
        stats.insert(u.path.clone(), v);
    }
    let _ = l;
    (ctx.report, stats)
}

/// Dangerous keys in `now` that `before` did not have with the same value.
fn new_dangerous(before: &str, now: &str) -> Vec<String> {
    if now.len() as u64 > fsutil::MAX_CONFIG {
        return vec![format!(
            "(config of {} bytes, too large to parse: treated as dangerous)",
            now.len()
        )];
    }
    let b = gitconfig::parse(before).unwrap_or_default();
    let n = match gitconfig::parse(now) {
        Ok(n) => n,
        Err(e) => return vec![format!("(unparseable config: {e})")],
    };
    let mut out: Vec<String> = n
        .iter()
        .filter(|e| e.is_dangerous() && !b.contains(e))
        .map(|e| format!("{}={}", e.key(), e.value.as_deref().unwrap_or("true")))
        .collect();
    out.dedup();
    out
}

fn text_of(s: Option<&FileSnap>) -> String {
    match s {
        // Never parsed: a marker over the bound (see new_dangerous).
        Some(s) if s.is_big() => " ".repeat(fsutil::MAX_CONFIG as usize + 1),
        Some(s) => String::from_utf8_lossy(&s.bytes()).into_owned(),
        None => String::new(),
    }
}

fn describe_change(before: Option<&FileSnap>, now: Option<&FileSnap>) -> &'static str {
    match (before, now) {
        (None, Some(_)) => "planted",
        (Some(_), None) => "deleted",
        _ => "changed",
    }
}

/// Brings one set of files (relative to `base`) back to `snap`.
fn revert_files(
    ctx: &mut Ctx,
    check_of: &dyn Fn(&str) -> &'static str,
    unit: &Path,
    base: &Path,
    snap: &BTreeMap<String, FileSnap>,
    now: &BTreeMap<String, FileSnap>,
) {
    // Gone or changed: restore (parents sort before children).
    for (rel, s) in snap {
        let cur = now.get(rel);
        if cur.is_some_and(|c| c.same(s)) {
            continue;
        }
        if s.kind == fsutil::Kind::Dir && cur.is_some_and(|c| c.kind == fsutil::Kind::Dir) {
            continue;
        }
        let p = base.join(rel);
        let check = check_of(rel);
        let keys = if check == "config" {
            new_dangerous(&text_of(Some(s)), &text_of(cur))
        } else {
            Vec::new()
        };
        let what = format!("{} {}", rel, describe_change(Some(s), cur));
        let s2 = s.clone();
        let p2 = p.clone();
        let (base2, rel2) = (base.to_path_buf(), rel.clone());
        // A file over the size kept in a snapshot cannot be put back: what
        // is there now goes (it is not what the snapshot saw).
        let done = if s.is_big() {
            "removed (it was too large to keep in the snapshot, so it cannot be restored)"
        } else {
            "restored from the snapshot"
        };
        ctx.fix(check, unit, Some(&p), what, done, keys, move || {
            fsutil::make_parents_safe(&base2, &rel2).map_err(|e| e.to_string())?;
            if s2.is_big() {
                return fsutil::remove(&p2).map_err(|e| e.to_string());
            }
            fsutil::restore(&p2, &s2).map_err(|e| e.to_string())
        });
        soften_generated(ctx, check, rel, cur);
    }
    // New: remove (skip what a removed parent took with it).
    let mut removed: Vec<String> = Vec::new();
    for (rel, cur) in now {
        if snap.contains_key(rel) || removed.iter().any(|r| rel.starts_with(&format!("{r}/"))) {
            continue;
        }
        let p = base.join(rel);
        let check = check_of(rel);
        let keys = if check == "config" {
            new_dangerous("", &text_of(Some(cur)))
        } else {
            Vec::new()
        };
        let p2 = p.clone();
        let (base2, rel2) = (base.to_path_buf(), rel.clone());
        ctx.fix(
            check,
            unit,
            Some(&p),
            format!("{rel} planted"),
            "removed",
            keys,
            move || {
                // Reached through a planted symlink: remove the link, never
                // what it points to.
                if fsutil::unsafe_parent(&base2, &rel2).is_some() {
                    return fsutil::make_parents_safe(&base2, &rel2).map_err(|e| e.to_string());
                }
                fsutil::remove(&p2).map_err(|e| e.to_string())
            },
        );
        soften_generated(ctx, check, rel, Some(cur));
        removed.push(rel.clone());
    }
}

/// `info/refs` is rewritten by git itself in normal work (`git gc` and
/// `git repack` run update-server-info): it is reverted like every file of
/// the clean-up list, but reported as info, not as tampering.
fn soften_generated(ctx: &mut Ctx, check: &str, rel: &str, cur: Option<&FileSnap>) {
    if check != "extra_files"
        || rel != "info/refs"
        || !cur.is_some_and(|c| c.kind == fsutil::Kind::File)
    {
        return;
    }
    if let Some(f) = ctx.report.findings.last_mut()
        && !f.unrecoverable
    {
        f.severity = Severity::Info;
        f.found
            .push_str(" (git gc/repack writes it: update-server-info)");
    }
}

fn rule_check(rel: &str) -> &'static str {
    rules::PROTECTED
        .iter()
        .find(|r| rel == r.path || rel.starts_with(&format!("{}/", r.path)))
        .map(|r| r.check)
        .unwrap_or("extra_files")
}

/// The file-level phase for one git dir: HEAD syntax, protected files,
/// includes, hooksPath, unexpected top-level entries.
fn raw_unit(ctx: &mut Ctx, us: &UnitSnap) {
    let u = &us.path;
    // HEAD: missing, unreadable or pointing outside refs/.
    let head_now = fsutil::read(&u.join("HEAD")).ok().flatten();
    if head_now.as_ref() != us.head.as_ref() && us.head.is_some() {
        let bad = match &head_now {
            None => Some("HEAD deleted".to_string()),
            Some(h) if h.kind != fsutil::Kind::File => Some("HEAD replaced by a non-file".into()),
            Some(h) => match Value::parse(&String::from_utf8_lossy(&h.bytes())) {
                Value::Invalid(s) => {
                    Some(format!("HEAD invalid or pointing outside refs/ ('{s}')"))
                }
                _ => None,
            },
        };
        if let Some(what) = bad {
            let s = us.head.clone().unwrap();
            let p = u.join("HEAD");
            let p2 = p.clone();
            ctx.fix(
                "head",
                u,
                Some(&p),
                what,
                "restored from the snapshot",
                vec![],
                move || fsutil::restore(&p2, &s).map_err(|e| e.to_string()),
            );
        }
    }
    // refs/ or objects/ removed: libgit2 cannot open a git dir without
    // them. The directory comes back here; its refs come back from the
    // snapshot (and reflogs) in the ref phase, its objects from the kept
    // links under `run` (else the object check names what is lost).
    if us.kind.has_objects() {
        for d in ["refs", "objects"] {
            let p = u.join(d);
            if us.top_level.contains(d) && fs::symlink_metadata(&p).is_err() {
                let (p2, u2) = (p.clone(), u.clone());
                ctx.fix(
                    if d == "refs" { "refs" } else { "objects" },
                    u,
                    Some(&p),
                    format!("{d}/ directory removed"),
                    "directory recreated (its contents are restored below)",
                    vec![],
                    move || fsutil::create_dirs_owned(&p2, &u2).map_err(|e| e.to_string()),
                );
            }
        }
    }
    // A core.hooksPath the command configured: its hooks go with the config.
    let planted_hp = snapshot::hooks_path(u, us.work_tree.as_deref());
    // Only inside the work tree or the git dir, through real directories,
    // and only files owned by the repository's owner: a hooksPath can name
    // any directory of the host (core.hooksPath=/usr/bin).
    let inside = |hp: &Path| {
        let Ok(c) = fs::canonicalize(hp) else {
            return false;
        };
        c == hp && (c.starts_with(u) || us.work_tree.as_ref().is_some_and(|w| c.starts_with(w)))
    };
    let repo_owner = fsutil::owner(u);
    if let Some(hp) = planted_hp
        && us.hooks_path.as_ref().map(|(p, _)| p) != Some(&hp)
        && hp != u.join("hooks")
        && inside(&hp)
    {
        for name in rules::HOOK_NAMES {
            let p = hp.join(name);
            if fsutil::owner(&p).is_some() && fsutil::owner(&p) == repo_owner {
                let p2 = p.clone();
                ctx.fix(
                    "hooks",
                    u,
                    Some(&p),
                    format!(
                        "hook {name} planted in a core.hooksPath directory the command configured"
                    ),
                    "removed",
                    vec![],
                    move || fsutil::remove(&p2).map_err(|e| e.to_string()),
                );
            }
        }
        if fs::read_dir(&hp).is_ok_and(|mut rd| rd.next().is_none()) && ctx.mode == Mode::Repair {
            let _ = fs::remove_dir(&hp);
            crate::dirlist::Settled::changed();
        }
    }
    // The clean-up list.
    match snapshot::protected_files(u) {
        Ok(now) => revert_files(ctx, &rule_check, u, u, &us.files, &now),
        Err(e) => ctx.note(
            "extra_files",
            u,
            None,
            e.to_string(),
            Severity::Alert,
            "could not be checked",
            true,
        ),
    }
    // Included config files.
    for (p, s) in &us.includes {
        let cur = fsutil::read(p).ok().flatten();
        let same = match (s, &cur) {
            (Some(a), Some(b)) => a.same(b),
            (None, None) => true,
            _ => false,
        };
        if same {
            continue;
        }
        let keys = new_dangerous(&text_of(s.as_ref()), &text_of(cur.as_ref()));
        let what = format!(
            "included config {} {}",
            p.display(),
            describe_change(s.as_ref(), cur.as_ref())
        );
        let (p2, s2) = (p.clone(), s.clone());
        ctx.fix(
            "config",
            u,
            Some(p),
            what,
            if s.is_some() {
                "restored from the snapshot"
            } else {
                "removed"
            },
            keys,
            move || match s2 {
                Some(s) => fsutil::restore(&p2, &s).map_err(|e| e.to_string()),
                None => fsutil::remove(&p2).map_err(|e| e.to_string()),
            },
        );
    }
    // core.hooksPath directory of the snapshot.
    if let Some((dir, files)) = &us.hooks_path {
        if !fsutil::is_real_dir(dir) && dir.exists() {
            // Replaced by a symlink or a file: never walk through it.
            let d2 = dir.clone();
            ctx.fix(
                "hooks",
                u,
                Some(dir),
                "core.hooksPath directory replaced by a symlink or file".into(),
                "removed",
                vec![],
                move || fsutil::remove(&d2).map_err(|e| e.to_string()),
            );
        }
        let now = if fsutil::is_real_dir(dir) {
            fsutil::read_tree(dir).unwrap_or_default()
        } else {
            BTreeMap::new()
        };
        if fsutil::is_real_dir(dir) || ctx.mode == Mode::Repair {
            if !dir.exists() && ctx.mode == Mode::Repair {
                let _ = fs::create_dir_all(dir);
            }
            revert_files(ctx, &|_| "hooks", u, dir, files, &now);
        }
    }
    // Entries git never makes in objects/, logs/, worktrees/, modules/
    // that were not there at snapshot time.
    let odd_now = match snapshot::odd_entries(u, us.kind.has_objects()) {
        Ok(o) => o,
        Err(e) => {
            ctx.note(
                "extra_files",
                u,
                None,
                format!("objects/, logs/, worktrees/ or modules/ could not be listed ({e}): entries planted there are not checked"),
                Severity::Alert,
                "reported",
                true,
            );
            us.odd.clone()
        }
    };
    let mut gone: Vec<String> = Vec::new();
    for rel in odd_now.difference(&us.odd) {
        if gone.iter().any(|g| rel.starts_with(&format!("{g}/"))) {
            continue;
        }
        let p = u.join(rel);
        let p2 = p.clone();
        ctx.fix(
            "extra_files",
            u,
            Some(&p),
            format!("{rel} planted (not a file git makes there)"),
            "removed",
            vec![],
            move || fsutil::remove(&p2).map_err(|e| e.to_string()),
        );
        gone.push(rel.clone());
    }
    // An interrupted rebase or cherry-pick whose todo runs programs (`exec`
    // lines run at the next `git rebase --continue`): a new one is removed.
    for (dir, todo) in [
        ("rebase-merge", "git-rebase-todo"),
        ("rebase-merge", "done"),
        ("sequencer", "todo"),
    ] {
        let p = u.join(dir);
        let Ok(Some(t)) = fsutil::read_text(&p.join(todo), fsutil::MAX_CONFIG) else {
            continue;
        };
        let execs: Vec<&str> = t
            .lines()
            .filter(|l| matches!(l.split_whitespace().next(), Some("exec") | Some("x")))
            .collect();
        if execs.is_empty() {
            continue;
        }
        let what = format!(
            "{dir}/{todo} has exec lines ({}) that the next git rebase --continue would run",
            execs.iter().take(3).cloned().collect::<Vec<_>>().join("; ")
        );
        if us.top_level.contains(dir) {
            ctx.note(
                "extra_files",
                u,
                Some(&p),
                what,
                Severity::Warn,
                "reported (it was there before)",
                false,
            );
        } else {
            let p2 = p.clone();
            ctx.fix(
                "extra_files",
                u,
                Some(&p),
                what,
                "removed",
                vec![],
                move || fsutil::remove(&p2).map_err(|e| e.to_string()),
            );
        }
    }
    // Unexpected top-level entries.
    let covered: BTreeSet<&str> = rules::PROTECTED
        .iter()
        .map(|r| r.path.split('/').next().unwrap())
        .collect();
    let names = match snapshot::top_level(u) {
        Ok(n) => n,
        Err(e) => {
            ctx.note(
                "extra_files",
                u,
                None,
                format!(
                    "the git dir could not be listed ({e}): entries planted in it are not checked"
                ),
                Severity::Alert,
                "reported",
                true,
            );
            BTreeSet::new()
        }
    };
    for name in names {
        if us.top_level.contains(&name)
            || rules::is_transient(&name)
            || rules::is_lock(&name)
            || covered.contains(name.as_str())
            || name.starts_with(".sbx-gitguard")
            // A concurrent import's journal (attacker helper-52: removing
            // it failed that import halfway); one nothing holds is judged
            // like any other entry.
            || (name == crate::journal::DIR && crate::journal::live(&u.join(&name)))
        {
            continue;
        }
        let p = u.join(&name);
        let p2 = p.clone();
        ctx.fix(
            "extra_files",
            u,
            Some(&p),
            format!("unexpected file {name} planted in the git dir"),
            "removed",
            vec![],
            move || fsutil::remove(&p2).map_err(|e| e.to_string()),
        );
    }
}

/// A git dir that appeared during the command (a new submodule or linked
/// worktree): kept when clean, removed when it carries code or redirections.
/// A dangerous key that git itself writes: a submodule's git dir names its
/// work tree (core.worktree) inside the superproject's work tree.
fn expected_key(u: &Unit, main_wt: Option<&Path>, e: &gitconfig::Entry) -> bool {
    u.kind == UnitKind::Submodule
        && e.section == "core"
        && e.sub.is_none()
        && e.name == "worktree"
        && e.value.as_deref().is_some_and(|v| {
            let p = u.path.join(v);
            match (fs::canonicalize(&p), main_wt) {
                (Ok(c), Some(w)) => c.starts_with(w),
                // Not checked out (yet): judge the path as written.
                (Err(_), Some(w)) => {
                    let norm = normalize(&p);
                    norm.starts_with(w)
                }
                _ => false,
            }
        })
}

/// `a/b/../c` -> `a/c`, lexically.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

fn new_unit(ctx: &mut Ctx, u: &Unit, main_wt: Option<&Path>) {
    let mut bad: Vec<String> = Vec::new();
    for (_, entries) in snapshot::config_entries(&u.path) {
        bad.extend(
            entries
                .iter()
                .filter(|e| e.is_dangerous() && !expected_key(u, main_wt, e))
                .map(|e| format!("{}={}", e.key(), e.value.as_deref().unwrap_or("true"))),
        );
    }
    let hooks: Vec<String> = fs::read_dir(u.path.join("hooks"))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.ends_with(".sample"))
                .collect()
        })
        .unwrap_or_default();
    let kind = match u.kind {
        UnitKind::Worktree => "linked worktree",
        _ => "submodule",
    };
    if bad.is_empty() && hooks.is_empty() {
        ctx.note(
            "extra_files",
            &u.path,
            None,
            format!("new {kind} git dir"),
            Severity::Warn,
            "kept (no hooks, no dangerous config)",
            false,
        );
        return;
    }
    let mut what = format!("new {kind} git dir with");
    if !bad.is_empty() {
        what.push_str(" dangerous config");
    }
    if !hooks.is_empty() {
        what.push_str(&format!(" hooks ({})", hooks.join(", ")));
    }
    let p = u.path.clone();
    ctx.fix(
        "extra_files",
        &u.path,
        Some(&u.path),
        what,
        "removed",
        bad,
        move || fsutil::remove(&p).map_err(|e| e.to_string()),
    );
}

/// Bare-repository-shaped dirs, nested repositories and `.git` files that
/// appeared in a work tree.
fn scan_tree(
    ctx: &mut Ctx,
    root: &Path,
    before: &Scan,
    known: &BTreeSet<PathBuf>,
    users: &BTreeSet<(u64, u64)>,
) {
    let now = layout::scan(root);
    for (d, why) in &now.unlisted {
        if before.unlisted.contains_key(d) {
            continue;
        }
        ctx.note(
            "bare_repo",
            root,
            Some(d),
            format!("a directory of the work tree could not be listed ({why}): repositories planted below it were not checked"),
            Severity::Alert,
            "reported",
            false,
        );
    }
    // A git dir of the snapshot found at a new path was the user's, renamed
    // away (and maybe replaced by a plant): never removed here (`plants`
    // puts it back).
    let users_own = |d: &Path| layout::ident(d).is_some_and(|i| users.contains(&i));
    for d in now.bare_shaped.difference(&before.bare_shaped) {
        if users_own(d) {
            continue;
        }
        let d2 = d.clone();
        ctx.fix(
            "bare_repo",
            root,
            Some(d),
            "bare-repository-shaped directory (HEAD, objects/, refs/) planted in the work tree"
                .into(),
            "removed",
            vec![],
            move || fsutil::remove(&d2).map_err(|e| e.to_string()),
        );
    }
    for d in now.nested.difference(&before.nested) {
        if !layout::is_git_dir_shaped(d) || users_own(d) {
            continue;
        }
        let keys: Vec<String> = snapshot::config_entries(d)
            .into_iter()
            .flat_map(|(_, e)| e.into_iter().filter(|e| e.is_dangerous()).map(|e| e.key()))
            .collect();
        let d2 = d.clone();
        ctx.fix(
            "bare_repo",
            root,
            Some(d),
            "new repository (.git directory) planted in the work tree".into(),
            "removed",
            keys,
            move || fsutil::remove(&d2).map_err(|e| e.to_string()),
        );
    }
    for (f, target) in &now.gitfiles {
        let canon = fs::canonicalize(target).unwrap_or_else(|_| target.clone());
        if before.gitfiles.get(f) == Some(target) || known.contains(&canon) {
            continue;
        }
        let f2 = f.clone();
        let old = before.gitfiles.get(f).cloned();
        let what = format!(
            ".git file pointing to {} (not a git dir of this repository)",
            target.display()
        );
        match old {
            Some(o) => ctx.fix(
                "bare_repo",
                root,
                Some(f),
                what,
                "restored",
                vec![],
                move || {
                    fsutil::write_atomic(
                        &f2,
                        format!("gitdir: {}\n", o.display()).as_bytes(),
                        0o644,
                        fsutil::owner(f2.parent().unwrap()),
                    )
                    .map_err(|e| e.to_string())
                },
            ),
            None => ctx.fix(
                "bare_repo",
                root,
                Some(f),
                what,
                "removed",
                vec![],
                move || fsutil::remove(&f2).map_err(|e| e.to_string()),
            ),
        }
    }
}

/// The ref phase of one git dir with refs.
fn refs_unit(
    ctx: &mut Ctx,
    us: &UnitSnap,
    repo: &git2::Repository,
    damaged: &objects::Damaged,
) -> BTreeMap<String, Value> {
    let u = &us.path;
    let Some(rs) = &us.refs else {
        return BTreeMap::new();
    };
    // packed-refs removed (git never removes it in normal work; a FIFO
    // planted there was removed above): back to the snapshot's, then the
    // refs are compared as usual.
    if let Some(s) = &rs.packed_refs
        && s.kind == fsutil::Kind::File
        && fs::symlink_metadata(u.join("packed-refs")).is_err()
    {
        let p = u.join("packed-refs");
        let (p2, s2) = (p.clone(), s.clone());
        ctx.fix(
            "refs",
            u,
            Some(&p),
            "packed-refs deleted".into(),
            "restored from the snapshot",
            vec![],
            move || fsutil::restore(&p2, &s2).map_err(|e| e.to_string()),
        );
    }
    let first = refs::read_all(u);
    // A packed-refs git cannot read: back to the snapshot's.
    if let Err(e) = &first
        && e.is_packed_damage()
    {
        let s = rs.packed_refs.clone();
        let p = u.join("packed-refs");
        let p2 = p.clone();
        ctx.fix(
            "refs",
            u,
            Some(&p),
            e.to_string(),
            "restored from the snapshot",
            vec![],
            move || match s {
                Some(s) => fsutil::restore(&p2, &s).map_err(|e| e.to_string()),
                None => fsutil::remove(&p2).map_err(|e| e.to_string()),
            },
        );
    }
    let now = match first {
        Ok(n) => n,
        Err(_) => match refs::read_all(u) {
            Ok(n) => n,
            Err(e) => {
                ctx.note(
                    "refs",
                    u,
                    None,
                    e.to_string(),
                    Severity::Alert,
                    "could not be checked",
                    true,
                );
                return BTreeMap::new();
            }
        },
    };
    let fixes_before = ctx.report.findings.len();
    let restore_to = |name: &str, snap_val: &str| -> Result<String, String> {
        let v = Value::parse(snap_val);
        match &v {
            Value::Oid(o) if ok_object(repo, o, false, damaged) => {
                refs::write_loose(u, name, &v).map_err(|e| e.to_string())?;
                Ok(format!("restored to {o}"))
            }
            Value::Sym(_) => {
                refs::write_loose(u, name, &v).map_err(|e| e.to_string())?;
                Ok(format!("restored to {}", v.to_text()))
            }
            _ => {
                // The snapshot's object is gone: the newest usable reflog entry.
                for o in refs::reflog(u, name) {
                    if ok_object(repo, &o, name.starts_with("refs/heads/"), damaged) {
                        refs::write_loose(u, name, &Value::Oid(o.clone()))
                            .map_err(|e| e.to_string())?;
                        return Ok(format!(
                            "restored to {o} from the reflog (the snapshot's {snap_val} is gone)"
                        ));
                    }
                }
                Err(format!(
                    "{snap_val} is gone and the reflog has nothing usable"
                ))
            }
        }
    };
    for (name, sv) in &rs.refs {
        let cur = now.get(name);
        if cur.is_some_and(|c| &c.to_text() == sv) {
            continue;
        }
        let before = Value::parse(sv);
        if let (Some(Value::Oid(new)), Value::Oid(old)) = (cur, &before)
            && let (Ok(n), Ok(o)) = (git2::Oid::from_str(new), git2::Oid::from_str(old))
            && ok_object(repo, new, name.starts_with("refs/heads/"), damaged)
            && objects::descends(repo, n, o, damaged)
        {
            let count = if damaged.is_empty() {
                repo.graph_ahead_behind(n, o).map(|(a, _)| a).unwrap_or(0)
            } else {
                0
            };
            let sev = if name.starts_with("refs/heads/") {
                Severity::Info
            } else {
                Severity::Warn
            };
            ctx.note(
                "refs",
                u,
                None,
                format!("{name} moved forward {old}..{new} ({count} new commits)"),
                sev,
                "kept (descends from the snapshot's history)",
                false,
            );
            continue;
        }
        let what = match cur {
            None => format!("{name} deleted (was {sv})"),
            Some(Value::Invalid(s)) => format!("{name} made unreadable ('{s}'), was {sv}"),
            Some(c) => format!(
                "{name} rewritten from {sv} to {} (away from the snapshot's history; that commit stays in the object store and the reflog)",
                c.to_text()
            ),
        };
        let r = if ctx.mode == Mode::Repair {
            Some(restore_to(name, sv))
        } else {
            None
        };
        let done = match &r {
            Some(Ok(d)) => d.clone(),
            _ => String::new(),
        };
        ctx.fix("refs", u, None, what, &done, vec![], move || match r {
            Some(Err(e)) => Err(e),
            _ => Ok(()),
        });
    }
    for (name, v) in &now {
        if rs.refs.contains_key(name) {
            continue;
        }
        // A new ref git cannot use (a branch on a tree, a ref to an object
        // that is not there or is damaged): removed, so the turn is not
        // failed at the agent's will and git is not left with a bad ref.
        let unusable = match v {
            Value::Oid(o) => !ok_object(repo, o, name.starts_with("refs/heads/"), damaged),
            _ => false,
        };
        // A name git's check-ref-format refuses (t1430): git skips it with
        // a warning, other tools may not.
        if !refs::valid_refname(name) {
            let n2 = name.clone();
            ctx.fix(
                "refs",
                u,
                None,
                format!("{name} added: not a valid ref name"),
                "removed",
                vec![],
                move || {
                    fs::remove_file(u.join(&n2))
                        .or_else(|e| {
                            if e.kind() == std::io::ErrorKind::NotFound {
                                Ok(())
                            } else {
                                Err(e)
                            }
                        })
                        .map_err(|e| e.to_string())
                },
            );
            continue;
        }
        if unusable {
            let n2 = name.clone();
            ctx.fix(
                "refs",
                u,
                None,
                format!(
                    "{name} added pointing to {}, which is missing, damaged or not a commit",
                    v.to_text()
                ),
                "removed",
                vec![],
                move || refs::delete(u, &n2).map_err(|e| e.to_string()),
            );
            continue;
        }
        if name.starts_with("refs/replace/") || matches!(v, Value::Invalid(_)) {
            let n2 = name.clone();
            ctx.fix(
                "refs",
                u,
                None,
                format!(
                    "{name} added ({}); replace refs change what git shows",
                    v.to_text()
                ),
                "removed",
                vec![],
                move || refs::delete(u, &n2).map_err(|e| e.to_string()),
            );
        } else {
            ctx.note(
                "refs",
                u,
                None,
                format!("{name} added ({})", v.to_text()),
                Severity::Warn,
                "kept (new refs are the command's own work)",
                false,
            );
        }
    }
    let repaired = ctx.report.findings[fixes_before..]
        .iter()
        .any(|f| f.severity == Severity::Alert);
    if repaired && ctx.mode == Mode::Repair {
        refs::read_all(u).unwrap_or(now)
    } else {
        now
    }
}

/// HEAD that is well-formed but changed: kept when it names an existing
/// branch or commit, restored when it dangles.
fn head_unit(
    ctx: &mut Ctx,
    us: &UnitSnap,
    repo: Option<&git2::Repository>,
    common_refs: &BTreeMap<String, Value>,
    damaged: &objects::Damaged,
) {
    let u = &us.path;
    let Some(snap_head) = &us.head else { return };
    let Some(now) = fsutil::read(&u.join("HEAD")).ok().flatten() else {
        return;
    };
    if now.same(snap_head) {
        return;
    }
    let before = Value::parse(&String::from_utf8_lossy(&snap_head.bytes()));
    let v = Value::parse(&String::from_utf8_lossy(&now.bytes()));
    let fine = match &v {
        Value::Sym(t) => common_refs.contains_key(t) || matches!(&before, Value::Sym(b) if b == t),
        Value::Oid(o) => repo.is_some_and(|r| ok_object(r, o, true, damaged)),
        Value::Invalid(_) => false,
    };
    if fine {
        ctx.note(
            "head",
            u,
            None,
            format!("HEAD switched from {} to {}", before.to_text(), v.to_text()),
            Severity::Warn,
            "kept (it names an existing branch or commit)",
            false,
        );
    } else {
        let p = u.join("HEAD");
        let s = snap_head.clone();
        ctx.fix(
            "head",
            u,
            Some(&p),
            format!("HEAD points to {}, which does not exist", v.to_text()),
            "restored from the snapshot",
            vec![],
            {
                let p2 = p.clone();
                move || fsutil::restore(&p2, &s).map_err(|e| e.to_string())
            },
        );
    }
}

/// Why libgit2 must not open the git dir `u` now: a FIFO, socket or device
/// is in it, or a file libgit2 reads whole on open is not a small regular
/// file.
fn libgit2_unsafe(u: &Path, with_specials: &BTreeSet<PathBuf>) -> Option<String> {
    if with_specials.contains(u) {
        return Some("a FIFO, socket or device is in the git dir".into());
    }
    for n in [
        "config",
        "config.worktree",
        "objects/info/alternates",
        "commondir",
    ] {
        if let Err(e) = fsutil::read_text(&u.join(n), fsutil::MAX_CONFIG) {
            return Some(format!("{n}: {e}"));
        }
    }
    None
}

/// Compares the repository of `l` with `snap`, repairing per `mode`.
pub fn verify(
    l: &Layout,
    snap: &Snapshot,
    mode: Mode,
    full: bool,
    lock_wait: Duration,
    keeps: &BTreeMap<PathBuf, crate::keep::Keep>,
) -> Report {
    let mut ctx = Ctx::new(mode);
    // Each directory stat'ed once, until a repair changes one.
    let _settled = crate::dirlist::Settled::begin();
    // 1. The git dir itself: still the same directory?
    if !same_git_dir(l, snap) {
        ctx.note(
            "repository",
            &snap.identity.common_dir,
            None,
            "the git dir was removed or replaced".into(),
            Severity::Alert,
            "cannot be restored from a snapshot",
            true,
        );
        return ctx.report;
    }
    // 2. FIFOs, sockets and devices first: nothing below may open one (an
    // open of a FIFO waits for a writer forever).
    let with_specials = specials(&mut ctx, snap);
    // 3. Locks left behind by the command (it has exited) or held by a
    // concurrent git process.
    stale_locks(&mut ctx, snap, lock_wait);
    // 4. File phase for every git dir of the snapshot.
    for us in &snap.units {
        if layout::ident(&us.path) != Some((us.dev, us.ino)) {
            let (sev, unrec) = match us.kind {
                UnitKind::Worktree => (Severity::Warn, false),
                _ => (Severity::Alert, true),
            };
            ctx.note(
                "repository",
                &us.path,
                None,
                format!("{:?} git dir removed or replaced", us.kind).to_lowercase(),
                sev,
                "cannot be restored from a snapshot",
                unrec,
            );
            continue;
        }
        raw_unit(&mut ctx, us);
    }
    // 5. Git dirs that appeared, and the work trees.
    work_trees(&mut ctx, l, snap);
    // 6. Refs, HEAD and objects of every git dir that has them.
    let mut common_refs: Option<BTreeMap<String, Value>> = None;
    for us in &snap.units {
        if !us.path.exists() || layout::ident(&us.path) != Some((us.dev, us.ino)) {
            continue;
        }
        if !us.kind.has_objects() {
            head_unit(
                &mut ctx,
                us,
                libgit2_unsafe(&l.common_dir, &with_specials)
                    .is_none()
                    .then(|| open(&l.common_dir).ok())
                    .flatten()
                    .as_ref(),
                common_refs
                    .get_or_insert_with(|| refs::read_all(&l.common_dir).unwrap_or_default()),
                &objects::Damaged::none(),
            );
            continue;
        }
        store_unit(&mut ctx, us, full, &with_specials, keeps.get(&us.path));
    }
    ctx.report
}

/// Whether the snapshot's git dir is still the repository's: the work
/// tree's `.git` (a directory or a gitfile) leads to it, with the same
/// device and inode.
fn same_git_dir(l: &Layout, snap: &Snapshot) -> bool {
    let dotgit_same = match &l.work_tree {
        None => true,
        Some(w) => {
            let d = w.join(".git");
            match fs::symlink_metadata(&d) {
                Ok(m) if m.is_dir() => fs::canonicalize(&d).is_ok_and(|c| c == l.git_dir),
                Ok(m) if m.is_file() => layout::read_gitfile(&d)
                    .and_then(|t| fs::canonicalize(t).ok())
                    .is_some_and(|c| c == l.git_dir),
                _ => false,
            }
        }
    };
    dotgit_same
        && layout::ident(&snap.identity.common_dir) == Some((snap.identity.dev, snap.identity.ino))
}

/// Step 2: FIFOs, sockets and devices planted in the git dirs, removed
/// (repair) or reported. Returns the git dirs that held one outside
/// repair (libgit2 must not open those).
fn specials(ctx: &mut Ctx, snap: &Snapshot) -> BTreeSet<PathBuf> {
    let mode = ctx.mode;
    let mut with_specials: BTreeSet<PathBuf> = BTreeSet::new();
    let mut seen_specials: BTreeSet<PathBuf> = BTreeSet::new();
    for us in &snap.units {
        for p in fsutil::specials(&us.path, ".sbx-gitguard") {
            if mode != Mode::Repair {
                with_specials.insert(us.path.clone());
            }
            // modules/X is walked with its superproject and on its own.
            if !seen_specials.insert(p.clone()) {
                continue;
            }
            let kind = fs::symlink_metadata(&p)
                .map(|m| fsutil::type_name(&m))
                .unwrap_or("a special file");
            let p2 = p.clone();
            ctx.fix(
                "extra_files",
                &us.path,
                Some(&p),
                format!("{kind} planted in the git dir (git makes none; opening it can block)"),
                "removed",
                vec![],
                move || fsutil::remove(&p2).map_err(|e| e.to_string()),
            );
        }
    }
    with_specials
}

/// Step 3: git lock files still held after `lock_wait`, removed.
fn stale_locks(ctx: &mut Ctx, snap: &Snapshot, lock_wait: Duration) {
    let units_now: Vec<Unit> = snap
        .units
        .iter()
        .map(|u| Unit {
            path: u.path.clone(),
            kind: u.kind,
            work_tree: u.work_tree.clone(),
        })
        .collect();
    for lock in wait_locks(&units_now, lock_wait) {
        let l2 = lock.clone();
        let unit = lock.parent().unwrap_or(Path::new("/")).to_path_buf();
        ctx.fix(
            "locks",
            &unit,
            Some(&lock),
            "a git lock file is still held".into(),
            "removed (left behind by the command)",
            vec![],
            move || fsutil::remove(&l2).map_err(|e| e.to_string()),
        );
    }
}

/// Step 5: submodule and worktree git dirs that appeared, then the work
/// trees known at snapshot time. (Without scanning work trees for git
/// dirs: worktree links the command wrote could name any directory of the
/// host; new nested repositories are found by the scan of the snapshot's
/// work trees.)
fn work_trees(ctx: &mut Ctx, l: &Layout, snap: &Snapshot) {
    let units = l.units(&BTreeSet::new());
    for u in &units {
        if snap.unit(&u.path).is_none()
            && matches!(u.kind, UnitKind::Submodule | UnitKind::Worktree)
        {
            new_unit(ctx, u, l.main_work_tree().as_deref());
        }
    }
    let known: BTreeSet<PathBuf> = units
        .iter()
        .map(|u| &u.path)
        .chain(snap.units.iter().map(|u| &u.path))
        .filter(|p| p.exists())
        .cloned()
        .collect();
    let users: BTreeSet<(u64, u64)> = snap.units.iter().map(|u| (u.dev, u.ino)).collect();
    let empty = Scan::default();
    for root in snap.scans.keys() {
        if !fsutil::is_real_dir(root) {
            continue;
        }
        let before = snap.scans.get(root).unwrap_or(&empty);
        scan_tree(ctx, root, before, &known, &users);
    }
}

/// Step 6, for a git dir with an object store: objects the command deleted
/// or replaced come back first (from the links kept before it, `keep`), so
/// refs are judged against the store as it was; then refs, HEAD and the
/// objects. Loose objects are checked before libgit2 reads any: it must
/// never read a damaged one (it loops forever on a truncated zlib stream),
/// and a damaged snapshot tip is never restored to.
fn store_unit(
    ctx: &mut Ctx,
    us: &UnitSnap,
    full: bool,
    with_specials: &BTreeSet<PathBuf>,
    keep: Option<&crate::keep::Keep>,
) {
    // libgit2 opens nothing that can block or is too large to read (a
    // FIFO left in place by check/--alert-only, a config of gigabytes).
    if let Some(why) = libgit2_unsafe(&us.path, with_specials) {
        ctx.note(
            "repository",
            &us.path,
            None,
            format!("refs and objects not checked: {why}"),
            Severity::Alert,
            "reported (repair first)",
            true,
        );
        return;
    }
    let repo = match open(&us.path) {
        Ok(r) => r,
        Err(e) => {
            ctx.note(
                "repository",
                &us.path,
                None,
                format!("cannot open: {}", e.message()),
                Severity::Alert,
                "cannot be checked",
                true,
            );
            return;
        }
    };
    let objs = us.path.join("objects");
    let mut pre = objects::check_loose(&objs, &us.loose, us.sha256, us.same_dirs.as_ref());
    let repo = match keep {
        Some(k)
            if ctx.mode == Mode::Repair
                && (!pre.damaged.is_empty()
                    || !fsutil::is_real_dir(&objs)
                    || objects_gone(us, &repo, &pre.objs)) =>
        {
            let restored = k.restore();
            let mut found = String::from("object files deleted or replaced by the command");
            if !pre.problems.is_empty() {
                let names: Vec<&str> = pre
                    .problems
                    .iter()
                    .take(5)
                    .map(|p| p.what.as_str())
                    .collect();
                found.push_str(&format!(" (damaged: {})", names.join("; ")));
            }
            ctx.report.findings.push(Finding {
                check: "objects",
                repo: disp(&us.path),
                path: None,
                found,
                action: format!(
                    "restored: {} file(s) linked back from the links kept before the command",
                    restored.len()
                ),
                severity: Severity::Alert,
                dangerous_keys: Vec::new(),
                unrecoverable: false,
            });
            pre = objects::check_loose(&objs, &pre.objs, us.sha256, None);
            // A fresh handle: libgit2 caches the pack list.
            open(&us.path).unwrap_or(repo)
        }
        _ => repo,
    };
    let damaged = pre.gate(&objs, us.sha256);
    let own = refs_unit(ctx, us, &repo, &damaged);
    head_unit(ctx, us, Some(&repo), &own, &damaged);
    drop(damaged);
    let snap_roots: Vec<(String, String)> = us
        .refs
        .iter()
        .flat_map(|r| r.refs.iter())
        .filter_map(|(n, v)| {
            Value::parse(v)
                .oid()
                .map(|o| (format!("{n} in the snapshot"), o.to_string()))
        })
        .collect();
    let run_check = |ctx: &mut Ctx, repo: &git2::Repository, full: bool, lc| {
        check_objects(
            ctx,
            &us.path,
            repo,
            &us.packs,
            &us.loose,
            lc,
            us.sha256,
            full,
            &snap_roots,
            &own,
            us.refs.as_ref().map(|r| &r.refs),
        )
    };
    let mut sub = Ctx::new(ctx.mode);
    // The loose objects as `pre` saw them (nothing changed them since),
    // for a re-check after restoring from the kept links (a clone per
    // fan-out directory, shared, not per object).
    let verified = pre.objs.clone();
    run_check(&mut sub, &repo, full, pre);
    let damaged = sub
        .report
        .findings
        .iter()
        .any(|f| f.check == "objects" && f.severity == Severity::Alert);
    if damaged
        && ctx.mode == Mode::Repair
        && let Some(k) = keep
    {
        let restored = k.restore();
        if !restored.is_empty() {
            // A fresh handle (libgit2 caches the pack list), and the full
            // check to be sure.
            let mut again = Ctx::new(Mode::Repair);
            match open(&us.path) {
                Ok(r2) => {
                    // Restored files are new inodes: read again.
                    let lc = objects::check_loose(&objs, &verified, us.sha256, None);
                    run_check(&mut again, &r2, true, lc);
                }
                Err(e) => again.note(
                    "repository",
                    &us.path,
                    None,
                    format!("cannot open: {}", e.message()),
                    Severity::Alert,
                    "cannot be checked",
                    true,
                ),
            }
            let still = again
                .report
                .findings
                .iter()
                .any(|f| f.severity == Severity::Alert);
            if still {
                sub = again;
            } else {
                let n = restored.len();
                for f in sub
                    .report
                    .findings
                    .iter_mut()
                    .filter(|f| f.check == "objects" && f.severity == Severity::Alert)
                {
                    f.action = format!(
                        "restored: {n} object file(s) linked back from the links kept before the command; the full check passed"
                    );
                    f.unrecoverable = false;
                }
                sub.report.full_check = true;
            }
        }
    }
    ctx.report.absorb(sub.report);
}

/// The standalone check (no snapshot): damage, dangerous config, hooks,
/// repository-shaped dirs in the work tree.
pub fn check_alone(l: &Layout, full: bool) -> Report {
    let (scans, units) = snapshot::discover(l);
    let (mut report, _) = assess(l, &units, full, &BTreeMap::new());
    let mut ctx = Ctx::new(Mode::Check);
    let main_wt = l.main_work_tree();
    for u in &units {
        for (file, entries) in snapshot::config_entries(&u.path) {
            let keys: Vec<String> = entries
                .iter()
                .filter(|e| e.is_dangerous() && !expected_key(u, main_wt.as_deref(), e))
                .map(|e| format!("{}={}", e.key(), e.value.as_deref().unwrap_or("true")))
                .collect();
            if !keys.is_empty() {
                ctx.report.findings.push(Finding {
                    check: "config",
                    repo: disp(&u.path),
                    path: Some(disp(&file)),
                    found: "config sets keys that make git run programs".into(),
                    action: "reported".into(),
                    severity: Severity::Warn,
                    dangerous_keys: keys,
                    unrecoverable: false,
                });
            }
        }
        if let Ok(rd) = fs::read_dir(u.path.join("hooks")) {
            for e in rd.filter_map(|e| e.ok()) {
                let n = e.file_name().to_string_lossy().into_owned();
                if !n.ends_with(".sample") {
                    ctx.note(
                        "hooks",
                        &u.path,
                        Some(&e.path()),
                        format!("hook {n} installed"),
                        Severity::Warn,
                        "reported",
                        false,
                    );
                }
            }
        }
    }
    for (root, s) in &scans {
        for d in &s.bare_shaped {
            ctx.note(
                "bare_repo",
                root,
                Some(d),
                "bare-repository-shaped directory in the work tree".into(),
                Severity::Warn,
                "reported",
                false,
            );
        }
    }
    report.findings.extend(ctx.report.findings);
    report
}
