//! Operations in progress carried from the stage to the host (issue 25): a
//! merge, rebase, cherry-pick/revert sequence or bisect the sandbox left
//! stopped goes on in the next call (`git commit` records both parents,
//! `git rebase --continue`, `git bisect good` work) because its state files
//! come over, each checked as inert data against what git writes there:
//! object ids that exist after the import (new ones come in with a complete
//! history), refs inside the repository, todo lists of git's own commands
//! (an `exec` line is code: refused, as `run` removes a planted
//! `rebase-merge/` whose todo has one), bounded sizes, no control characters
//! where git writes none, regular files only. What is not carried is said
//! once (`stage_entry_dropped`, alert, also on stderr): silence would turn
//! a dropped file into lost work.
//!
//! Only what the sandbox changed is looked at (an entry absent from the
//! upper layer is the host's, untouched); the result of each entry is the
//! overlay's view (upper files over the host's, whiteouts removing, an
//! opaque directory replacing), judged whole: a directory is carried or
//! dropped as one.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use sbx_core::Severity;
use serde_json::json;

use crate::import::Events;

/// Most bytes of one state file (a message, a todo list).
pub const MAX_FILE: u64 = 1 << 20;
/// Most bytes of one patch (`rebase-merge/patch`, `rebase-apply/0001`...).
pub const MAX_PATCH: u64 = 16 << 20;
/// Most bytes of one directory, and most files in it.
pub const MAX_DIR_BYTES: u64 = 256 << 20;
pub const MAX_DIR_FILES: usize = 20_000;

/// The kind of object a file names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    Commit,
    Tree,
}

/// The object store as the import will leave it.
pub trait Objects {
    /// A full object id of kind `want` that exists after the import with a
    /// complete history: Ok with the new objects that must come in for it.
    fn need(&self, hex: &str, want: Want) -> Result<Vec<git2::Oid>, String>;
    /// An abbreviated id (todo lists write them so): the one object it
    /// names, then as [`Objects::need`].
    fn need_short(&self, hex: &str, want: Want) -> Result<Vec<git2::Oid>, String>;
}

/// What a file holds, as git writes it.
#[derive(Debug, Clone, Copy)]
enum Rule {
    /// One full object id.
    Oid(Want),
    /// One full id, or nothing (`abort-safety` without a HEAD).
    OidOrEmpty,
    /// One or more commit ids, one a line (MERGE_HEAD: an octopus).
    Oids,
    /// Commit ids one a line, full or abbreviated (may be empty).
    IdLines,
    /// A flag file: empty.
    Empty,
    /// One of these values (trailing newline aside).
    Choice(&'static [&'static str]),
    /// A commit message: any text, the only control characters tab, CR, LF.
    Msg,
    /// A decimal number.
    Number,
    /// `refs/heads/NAME` or `detached HEAD`.
    HeadName,
    /// A todo list (git-rebase-todo, done, sequencer/todo).
    Todo,
    /// `rebase-merge/current-fixups`: `fixup ID` / `squash ID` lines.
    Fixups,
    /// `GIT_AUTHOR_NAME='...'` etc., sq-quoted, as git writes it.
    AuthorScript,
    /// A merge strategy built into git.
    Strategy,
    /// Options: printable ASCII only.
    Words,
    /// `rebase-merge/rewritten-list`: `OLD NEW` lines.
    Rewritten,
    /// `rebase-merge/update-refs`: ref, before, after, per branch.
    UpdateRefs,
    /// `rebase-merge/refs-to-delete`: refs/rewritten/* names.
    RefsToDelete,
    /// `sequencer/opts`: git-config syntax, `options.*` keys git writes.
    SeqOpts,
    BisectLog,
    BisectStart,
    BisectTerms,
    /// A patch or mail: data, bounded.
    Patch,
    /// A scratch file git rewrites before reading it: not carried.
    Scratch,
}

use Rule::*;

/// Files at the top of the git dir.
const FILES: &[(&str, Rule)] = &[
    ("MERGE_HEAD", Oids),
    ("MERGE_MSG", Msg),
    ("MERGE_MODE", Choice(&["", "no-ff"])),
    ("ORIG_HEAD", Oid(Want::Commit)),
    ("CHERRY_PICK_HEAD", Oid(Want::Commit)),
    ("REVERT_HEAD", Oid(Want::Commit)),
    ("REBASE_HEAD", Oid(Want::Commit)),
    ("AUTO_MERGE", Oid(Want::Tree)),
    ("SQUASH_MSG", Msg),
    ("BISECT_LOG", BisectLog),
    ("BISECT_START", BisectStart),
    ("BISECT_TERMS", BisectTerms),
    ("BISECT_EXPECTED_REV", Oid(Want::Commit)),
    ("BISECT_ANCESTORS_OK", Empty),
    ("BISECT_NAMES", Words),
    ("BISECT_HEAD", Oid(Want::Commit)),
    ("BISECT_FIRST_PARENT", Empty),
];

/// The state `git rebase` writes for both backends (builtin/rebase.c).
const REBASE_BASIC: &[(&str, Rule)] = &[
    ("head-name", HeadName),
    ("onto", Oid(Want::Commit)),
    ("orig-head", Oid(Want::Commit)),
    ("quiet", Choice(&["", "t", "f"])),
    ("verbose", Empty),
    ("strategy", Strategy),
    ("strategy_opts", Words),
    (
        "allow_rerere_autoupdate",
        Choice(&["--rerere-autoupdate", "--no-rerere-autoupdate"]),
    ),
    // The default key or none: a key the sandbox names would have the
    // user's `git rebase --continue` sign with a key the sandbox chose.
    ("gpg_sign_opt", Choice(&["", "-S", "--no-gpg-sign"])),
    ("signoff", Choice(&["--signoff"])),
    ("reschedule-failed-exec", Empty),
    ("no-reschedule-failed-exec", Empty),
    ("drop_redundant_commits", Empty),
    ("keep_redundant_commits", Empty),
    ("cdate_is_adate", Empty),
    ("ignore_date", Empty),
    ("autostash", Oid(Want::Commit)),
    ("author-script", AuthorScript),
];

/// `rebase-merge/` (sequencer.c).
const REBASE_MERGE: &[(&str, Rule)] = &[
    ("interactive", Empty),
    ("git-rebase-todo", Todo),
    ("git-rebase-todo.backup", Todo),
    ("done", Todo),
    ("dropped", IdLines),
    ("msgnum", Number),
    ("end", Number),
    ("message", Msg),
    ("message-squash", Msg),
    ("message-fixup", Msg),
    ("current-fixups", Fixups),
    ("amend", Oid(Want::Commit)),
    ("stopped-sha", IdLines),
    ("rewritten-list", Rewritten),
    ("rewritten-pending", IdLines),
    ("squash-onto", Oid(Want::Commit)),
    ("refs-to-delete", RefsToDelete),
    ("update-refs", UpdateRefs),
    ("patch", Patch),
];

/// `rebase-apply/` (builtin/am.c; `git rebase --apply` uses it too).
const REBASE_APPLY: &[(&str, Rule)] = &[
    ("next", Number),
    ("last", Number),
    ("final-commit", Msg),
    ("msg", Msg),
    ("msg-clean", Msg),
    ("info", Msg),
    ("original-commit", Oid(Want::Commit)),
    ("abort-safety", OidOrEmpty),
    ("keep", Choice(&["t", "f", "b"])),
    ("messageid", Choice(&["t", "f"])),
    ("scissors", Choice(&["", "t", "f"])),
    ("quoted-cr", Choice(&["", "nowarn", "warn", "strip"])),
    ("utf8", Choice(&["t", "f"])),
    ("threeway", Choice(&["t", "f"])),
    ("sign", Choice(&["t", "f"])),
    ("apply-opt", Words),
    ("patch", Patch),
    ("patch-merge-index", Scratch),
    ("dirtyindex", Empty),
    ("rebasing", Empty),
    ("applying", Empty),
];

/// `sequencer/` (cherry-pick and revert of several commits).
const SEQUENCER: &[(&str, Rule)] = &[
    ("head", Oid(Want::Commit)),
    ("todo", Todo),
    ("done", Todo),
    ("opts", SeqOpts),
    ("abort-safety", OidOrEmpty),
];

const DIRS: &[&str] = &["rebase-merge", "rebase-apply", "sequencer"];

fn rule_in(dir: &str, name: &str) -> Option<Rule> {
    let tables: &[&[(&str, Rule)]] = match dir {
        "rebase-merge" => &[REBASE_MERGE, REBASE_BASIC],
        "rebase-apply" => &[REBASE_APPLY, REBASE_BASIC],
        _ => &[SEQUENCER],
    };
    if dir == "rebase-apply" && name.len() >= 4 && name.bytes().all(|b| b.is_ascii_digit()) {
        // One mail per commit: 0001, 0002...
        return Some(Patch);
    }
    tables
        .iter()
        .flat_map(|t| t.iter())
        .find(|(n, _)| *n == name)
        .map(|(_, r)| *r)
}

/// Refs the in-progress state owns besides the agent's namespaces: the
/// bisect's good/bad marks and the rebase's labels. Direct commit ids
/// only (never a symbolic ref).
pub fn commit_ref(name: &str) -> bool {
    name.starts_with("refs/bisect/") || name.starts_with("refs/rewritten/")
}

/// An entry as the sandbox left it (the overlay's view).
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Absent,
    File(Vec<u8>),
    Dir(BTreeMap<String, Vec<u8>>),
}

/// What to write into the git dir once the import is committed.
#[derive(Debug, Default)]
pub struct Carried {
    ops: Vec<(String, State)>,
    /// New objects the carried files need (with a complete history).
    pub objects: Vec<git2::Oid>,
}

fn max_for(rule: Rule) -> u64 {
    match rule {
        Patch | Scratch => MAX_PATCH,
        _ => MAX_FILE,
    }
}

fn read_file(p: &Path, max: u64) -> Result<Vec<u8>, String> {
    crate::fsutil::read_bounded(p, max).map_err(|e| match e.kind() {
        std::io::ErrorKind::FileTooLarge => format!("larger than {max} bytes"),
        // open_regular's message names the path; the caller names it too.
        _ => {
            let m = e.to_string();
            m.rsplit_once(": ").map(|(_, t)| t.to_string()).unwrap_or(m)
        }
    })
}

/// The files of a directory (regular files only; `*.lock` of a git that
/// was killed skipped); `upper` also reports whiteouts as None.
fn read_dir(d: &Path, dir: &str, upper: bool) -> Result<BTreeMap<String, Option<Vec<u8>>>, String> {
    let mut out = BTreeMap::new();
    let mut total = 0u64;
    let rd = fs::read_dir(d).map_err(|e| format!("{dir}/: {e}"))?;
    for e in rd {
        let e = e.map_err(|e| format!("{dir}/: {e}"))?;
        let name = e.file_name().to_string_lossy().into_owned();
        let p = e.path();
        let m = fs::symlink_metadata(&p).map_err(|e| format!("{dir}/{name}: {e}"))?;
        if upper && crate::import::is_whiteout(&m) {
            out.insert(name, None);
            continue;
        }
        if name.ends_with(".lock") && m.is_file() {
            continue;
        }
        if out.len() >= MAX_DIR_FILES {
            return Err(format!("more than {MAX_DIR_FILES} files"));
        }
        if !m.is_file() {
            return Err(format!(
                "{dir}/{name} is {} (git writes regular files there)",
                crate::fsutil::type_name(&m)
            ));
        }
        let Some(rule) = rule_in(dir, &name) else {
            return Err(format!("{dir}/{name}: not a file git writes there"));
        };
        let b = read_file(&p, max_for(rule)).map_err(|e| format!("{dir}/{name}: {e}"))?;
        total += b.len() as u64;
        if total > MAX_DIR_BYTES {
            return Err(format!("more than {MAX_DIR_BYTES} bytes"));
        }
        out.insert(name, Some(b));
    }
    Ok(out)
}

fn host_state(git_dir: &Path, name: &str, is_dir: bool) -> Result<State, String> {
    let p = git_dir.join(name);
    match fs::symlink_metadata(&p) {
        Err(_) => Ok(State::Absent),
        Ok(m) if is_dir && m.is_dir() => Ok(State::Dir(
            read_dir(&p, name, false)?
                .into_iter()
                .filter_map(|(k, v)| Some((k, v?)))
                .collect(),
        )),
        Ok(m) if !is_dir && m.is_file() => {
            let rule = FILES.iter().find(|(n, _)| *n == name).map(|(_, r)| *r);
            Ok(State::File(read_file(&p, max_for(rule.unwrap_or(Msg)))?))
        }
        Ok(m) => Err(format!("{name} is {}", crate::fsutil::type_name(&m))),
    }
}

/// The entry as the sandbox left it: None when it did not touch it.
fn stage_state(
    git_dir: &Path,
    upper: &Path,
    name: &str,
    is_dir: bool,
) -> Option<Result<State, String>> {
    let up = upper.join(name);
    let m = fs::symlink_metadata(&up).ok()?;
    if crate::import::is_whiteout(&m) {
        return Some(Ok(State::Absent));
    }
    let ft = m.file_type();
    if is_dir != m.is_dir() || ft.is_symlink() {
        return Some(Err(format!(
            "{name} is {} (git writes {} there)",
            crate::fsutil::type_name(&m),
            if is_dir {
                "a directory"
            } else {
                "a regular file"
            }
        )));
    }
    if !is_dir {
        let rule = FILES.iter().find(|(n, _)| *n == name).map(|(_, r)| *r)?;
        return Some(read_file(&up, max_for(rule)).map(State::File));
    }
    Some((|| {
        let mine = read_dir(&up, name, true)?;
        // Not opaque: the host's files the sandbox did not touch are
        // still there in its view.
        let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        if !crate::import::is_opaque(&up)
            && let State::Dir(h) = host_state(git_dir, name, true)?
        {
            files = h;
        }
        for (k, v) in mine {
            match v {
                Some(b) => {
                    files.insert(k, b);
                }
                None => {
                    files.remove(&k);
                }
            }
        }
        Ok(if files.is_empty() {
            State::Absent
        } else {
            State::Dir(files)
        })
    })())
}

/// Decides what of the in-progress state the sandbox left comes over.
/// Nothing is written here.
pub fn plan(git_dir: &Path, upper: &Path, objs: &dyn Objects, ev: &mut Events) -> Carried {
    let mut c = Carried::default();
    let entries = FILES
        .iter()
        .map(|(n, _)| (*n, false))
        .chain(DIRS.iter().map(|d| (*d, true)));
    for (name, is_dir) in entries {
        let Some(st) = stage_state(git_dir, upper, name, is_dir) else {
            continue;
        };
        let host = host_state(git_dir, name, is_dir).unwrap_or(State::File(Vec::new()));
        let verdict = st.and_then(|s| {
            if s == host || s == State::Absent {
                return Ok((s, Vec::new()));
            }
            let needs = match &s {
                State::File(b) => {
                    let rule = FILES.iter().find(|(n, _)| *n == name).map(|(_, r)| *r);
                    check(rule.unwrap_or(Scratch), b, objs).map_err(|e| format!("{name}: {e}"))?
                }
                State::Dir(files) => {
                    let mut needs = Vec::new();
                    for (f, b) in files {
                        let rule = rule_in(name, f).unwrap_or(Scratch);
                        needs.extend(check(rule, b, objs).map_err(|e| format!("{name}/{f}: {e}"))?);
                    }
                    needs
                }
                State::Absent => Vec::new(),
            };
            Ok((s, needs))
        });
        match verdict {
            Ok((s, _)) if s == host => {}
            Ok((s, needs)) => {
                ev.push(
                    "inprogress_carried",
                    Severity::Info,
                    json!({ "path": name, "action": if s == State::Absent { "removed" } else { "written" } }),
                );
                c.objects.extend(needs);
                c.ops.push((name.to_string(), s));
            }
            Err(reason) => {
                let had = host != State::Absent;
                ev.push(
                    "stage_entry_dropped",
                    Severity::Alert,
                    json!({ "path": name, "reason": reason,
                            "action": if had { "not carried; the host's copy removed (the sandbox replaced it)" } else { "not carried" } }),
                );
                if had {
                    c.ops.push((name.to_string(), State::Absent));
                }
            }
        }
    }
    c
}

/// Writes what [`plan`] accepted (after the refs, HEAD and the index are
/// in): files through a temporary name and a rename, a directory built
/// beside its place then swapped in; owned like the git dir.
pub fn apply(git_dir: &Path, c: &Carried, owner: Option<(u32, u32)>, ev: &mut Events) {
    for (name, st) in &c.ops {
        let p = git_dir.join(name);
        let r = match st {
            State::Absent => crate::fsutil::remove(&p),
            State::File(b) => {
                let r = match fs::symlink_metadata(&p) {
                    Ok(m) if !m.is_file() => crate::fsutil::remove(&p),
                    _ => Ok(()),
                };
                r.and_then(|()| crate::fsutil::write_atomic(&p, b, 0o644, owner))
            }
            State::Dir(files) => write_dir(git_dir, name, files, owner),
        };
        if let Err(e) = r {
            ev.push(
                "stage_entry_dropped",
                Severity::Alert,
                json!({ "path": name, "reason": format!("could not be written: {e}"), "action": "not carried" }),
            );
        }
    }
}

fn write_dir(
    git_dir: &Path,
    name: &str,
    files: &BTreeMap<String, Vec<u8>>,
    owner: Option<(u32, u32)>,
) -> std::io::Result<()> {
    let chown = |p: &Path| {
        if let Some((u, g)) = owner
            && nix::unistd::geteuid().as_raw() == 0
        {
            let _ = std::os::unix::fs::lchown(p, Some(u), Some(g));
        }
    };
    let new = git_dir.join(format!(".sbx-gitguard-inprogress.{name}.new"));
    let old = git_dir.join(format!(".sbx-gitguard-inprogress.{name}.old"));
    crate::fsutil::remove(&new)?;
    crate::fsutil::remove(&old)?;
    fs::create_dir(&new)?;
    fs::set_permissions(&new, fs::Permissions::from_mode(0o755))?;
    chown(&new);
    for (f, b) in files {
        let fp = new.join(f);
        let mut w = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&fp)?;
        w.write_all(b)?;
        w.sync_all()?;
        chown(&fp);
    }
    let dst = git_dir.join(name);
    if fs::symlink_metadata(&dst).is_ok() {
        fs::rename(&dst, &old)?;
    }
    fs::rename(&new, &dst)?;
    crate::fsutil::remove(&old)
}

// ---- the checks, one per rule ----

fn lines(b: &[u8]) -> Result<Vec<&str>, String> {
    let t = std::str::from_utf8(b).map_err(|_| "not UTF-8 text".to_string())?;
    Ok(t.strip_suffix('\n').unwrap_or(t).split('\n').collect())
}

/// One line: trailing newline (and CR, as git's read_oneliner) aside.
fn one_line(b: &[u8]) -> Result<&str, String> {
    let l = lines(b)?;
    match l.as_slice() {
        [one] => Ok(one.strip_suffix('\r').unwrap_or(one)),
        _ => Err("more than one line".into()),
    }
}

fn no_controls(b: &[u8], allowed: &[u8]) -> Result<(), String> {
    match b
        .iter()
        .position(|&c| (c < 0x20 || c == 0x7f) && !allowed.contains(&c))
    {
        Some(i) => Err(format!(
            "control character 0x{:02x} at byte {i} (git writes none there)",
            b[i]
        )),
        None => Ok(()),
    }
}

fn full_id(s: &str, want: Want, objs: &dyn Objects) -> Result<Vec<git2::Oid>, String> {
    if !crate::refs::is_hex_oid(s) {
        return Err(format!("'{}' is not an object id", shorten(s)));
    }
    objs.need(s, want)
}

fn any_id(s: &str, want: Want, objs: &dyn Objects) -> Result<Vec<git2::Oid>, String> {
    if crate::refs::is_hex_oid(s) {
        return objs.need(s, want);
    }
    if (4..40).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return objs.need_short(s, want);
    }
    Err(format!("'{}' is not an object id", shorten(s)))
}

/// At most 60 characters of `s`, raw: the line that shows it escapes it.
fn shorten(s: &str) -> String {
    s.chars().take(60).collect()
}

fn branch_ref(s: &str) -> bool {
    s.starts_with("refs/heads/")
        && crate::refs::valid_refname(s)
        && git2::Reference::is_valid_name(s)
}

/// A label of `label`/`reset`/`merge` (refs/rewritten/<label>).
fn label(s: &str) -> bool {
    let r = format!("refs/rewritten/{s}");
    crate::refs::valid_refname(&r) && git2::Reference::is_valid_name(&r)
}

const STRATEGIES: &[&str] = &["ort", "recursive", "resolve", "octopus", "ours", "subtree"];

fn check(rule: Rule, b: &[u8], objs: &dyn Objects) -> Result<Vec<git2::Oid>, String> {
    let mut needs = Vec::new();
    match rule {
        Oid(w) => needs = full_id(one_line(b)?, w, objs)?,
        OidOrEmpty => {
            if !b.iter().all(|c| *c == b'\n') {
                needs = full_id(one_line(b)?, Want::Commit, objs)?;
            }
        }
        Oids | IdLines => {
            for l in lines(b)? {
                if l.is_empty() && matches!(rule, IdLines) {
                    continue;
                }
                if matches!(rule, Oids) {
                    needs.extend(full_id(l, Want::Commit, objs)?);
                } else {
                    needs.extend(any_id(l, Want::Commit, objs)?);
                }
            }
        }
        Empty => {
            if !b.iter().all(|c| *c == b'\n') {
                return Err("a flag file git leaves empty has content".into());
            }
        }
        Choice(vals) => {
            let v = if b.is_empty() { "" } else { one_line(b)? };
            if !vals.contains(&v) {
                return Err(format!("'{}' is not one of {vals:?}", shorten(v)));
            }
        }
        Msg => no_controls(b, b"\t\r\n")?,
        Number => {
            let v = one_line(b)?;
            if v.is_empty() || v.len() > 9 || !v.bytes().all(|c| c.is_ascii_digit()) {
                return Err(format!("'{}' is not a number", shorten(v)));
            }
        }
        HeadName => {
            let v = one_line(b)?;
            if v != "detached HEAD" && !branch_ref(v) {
                return Err(format!("'{}' is not refs/heads/NAME", shorten(v)));
            }
        }
        Todo => {
            no_controls(b, b"\t\r\n")?;
            for l in lines(b)? {
                needs.extend(todo_line(l, objs)?);
            }
        }
        Fixups => {
            for l in lines(b)? {
                let mut w = l.split_whitespace();
                match (w.next(), w.next()) {
                    (None, _) => {}
                    (Some("fixup" | "squash"), Some(id)) => {
                        needs.extend(any_id(id, Want::Commit, objs)?)
                    }
                    _ => return Err(format!("unexpected line '{}'", shorten(l))),
                }
            }
        }
        AuthorScript => author_script(b)?,
        Strategy => {
            let v = one_line(b)?;
            if !STRATEGIES.contains(&v) {
                return Err(format!(
                    "strategy '{}' is not one built into git (another is a program git would run)",
                    shorten(v)
                ));
            }
        }
        Words => {
            no_controls(b, b"\n")?;
            if b.iter().any(|c| *c >= 0x80) {
                return Err("not printable ASCII".into());
            }
        }
        Rewritten => {
            for l in lines(b)? {
                if l.is_empty() {
                    continue;
                }
                let mut w = l.split(' ');
                let (Some(a), Some(n)) = (w.next(), w.next()) else {
                    return Err(format!("unexpected line '{}'", shorten(l)));
                };
                needs.extend(full_id(a, Want::Commit, objs)?);
                needs.extend(full_id(n, Want::Commit, objs)?);
            }
        }
        UpdateRefs => {
            let l = lines(b)?;
            let l: Vec<&str> = l.into_iter().filter(|x| !x.is_empty()).collect();
            if !l.len().is_multiple_of(3) {
                return Err("not ref/before/after triples".into());
            }
            for t in l.chunks(3) {
                if !branch_ref(t[0]) {
                    return Err(format!("'{}' is not refs/heads/NAME", shorten(t[0])));
                }
                for id in &t[1..] {
                    // The null id: a branch git has not moved yet.
                    if !(crate::refs::is_hex_oid(id) && id.bytes().all(|c| c == b'0')) {
                        needs.extend(full_id(id, Want::Commit, objs)?);
                    }
                }
            }
        }
        RefsToDelete => {
            for l in lines(b)? {
                let ok = l.is_empty() || l.strip_prefix("refs/rewritten/").is_some_and(label);
                if !ok {
                    return Err(format!(
                        "'{}' is not a refs/rewritten/ label (git deletes each at the end)",
                        shorten(l)
                    ));
                }
            }
        }
        SeqOpts => seq_opts(b)?,
        BisectLog => bisect_log(b)?,
        BisectStart => {
            let v = one_line(b)?;
            if crate::refs::is_hex_oid(v) {
                needs = objs.need(v, Want::Commit)?;
            } else if !branch_ref(&format!("refs/heads/{v}")) {
                return Err(format!("'{}' is not a branch or a commit id", shorten(v)));
            }
        }
        BisectTerms => {
            let l = lines(b)?;
            if l.len() != 2 || !l.iter().all(|t| bisect_term(t)) {
                return Err("not two bisect terms".into());
            }
        }
        Patch => {}
        Scratch => {}
    }
    Ok(needs)
}

fn bisect_term(t: &str) -> bool {
    const RESERVED: &[&str] = &[
        "help",
        "start",
        "skip",
        "next",
        "reset",
        "visualize",
        "view",
        "replay",
        "log",
        "run",
        "terms",
    ];
    !t.is_empty() && !t.contains('/') && !RESERVED.contains(&t) && {
        let r = format!("refs/bisect/{t}");
        crate::refs::valid_refname(&r) && git2::Reference::is_valid_name(&r)
    }
}

/// A todo line as sequencer.c's parse_insn_line reads it.
fn todo_line(l: &str, objs: &dyn Objects) -> Result<Vec<git2::Oid>, String> {
    let l = l.trim_start();
    let l = l.strip_suffix('\r').unwrap_or(l);
    if l.is_empty() || l.starts_with('#') {
        return Ok(Vec::new());
    }
    // What follows a '#' after the arguments is a comment (the subject).
    let (args, _) = l.split_once(" #").unwrap_or((l, ""));
    let mut w = args.split_whitespace();
    let cmd = w.next().unwrap_or_default();
    let rest: Vec<&str> = w.collect();
    let bad = || format!("unexpected todo line '{}'", shorten(l));
    let id = |s: Option<&&str>| -> Result<Vec<git2::Oid>, String> {
        any_id(s.ok_or_else(bad)?, Want::Commit, objs)
    };
    match cmd {
        "exec" | "x" => Err(format!(
            "todo line '{}' runs a command (exec: code, never carried to the host)",
            shorten(l)
        )),
        "noop" | "break" | "b" => Ok(Vec::new()),
        "pick" | "p" | "reword" | "r" | "edit" | "e" | "squash" | "s" | "drop" | "d" | "revert" => {
            id(rest.first())
        }
        "fixup" | "f" => match rest.first() {
            Some(&"-C" | &"-c") => id(rest.get(1)),
            _ => id(rest.first()),
        },
        "label" | "l" => match rest.first() {
            Some(s) if label(s) => Ok(Vec::new()),
            _ => Err(bad()),
        },
        "reset" | "t" => match rest.first() {
            _ if args.contains("[new root]") => Ok(Vec::new()),
            Some(s) if label(s) => Ok(Vec::new()),
            _ => Err(bad()),
        },
        "update-ref" | "u" => match rest.first() {
            Some(s) if branch_ref(s) => Ok(Vec::new()),
            _ => Err(bad()),
        },
        "merge" | "m" => {
            let mut needs = Vec::new();
            let mut i = 0;
            if matches!(rest.first(), Some(&"-C" | &"-c")) {
                needs = id(rest.get(1))?;
                i = 2;
            }
            if rest.len() <= i {
                return Err(bad());
            }
            for s in &rest[i..] {
                if !label(s) {
                    return Err(bad());
                }
            }
            Ok(needs)
        }
        _ => Err(format!("'{}' is not a todo command of git's", shorten(cmd))),
    }
}

/// `GIT_AUTHOR_NAME='...'` lines as sequencer.c's read_author_script
/// accepts them (sq-quoted, `'\''` for a quote).
fn author_script(b: &[u8]) -> Result<(), String> {
    no_controls(b, b"\n")?;
    for l in lines(b)? {
        if l.is_empty() {
            continue;
        }
        let Some((k, v)) = l.split_once('=') else {
            return Err(format!("unexpected line '{}'", shorten(l)));
        };
        if !matches!(
            k,
            "GIT_AUTHOR_NAME" | "GIT_AUTHOR_EMAIL" | "GIT_AUTHOR_DATE"
        ) {
            return Err(format!("unexpected variable '{}'", shorten(k)));
        }
        let inner = v
            .strip_prefix('\'')
            .and_then(|v| v.strip_suffix('\''))
            .ok_or_else(|| format!("'{}' is not sq-quoted", shorten(v)))?;
        if inner.split("'\\''").any(|p| p.contains('\'')) {
            return Err(format!("'{}' is not sq-quoted", shorten(v)));
        }
    }
    Ok(())
}

/// `sequencer/opts`: the `[options]` keys sequencer.c's save_opts writes.
fn seq_opts(b: &[u8]) -> Result<(), String> {
    no_controls(b, b"\t\n")?;
    let t = std::str::from_utf8(b).map_err(|_| "not UTF-8 text".to_string())?;
    let entries = crate::gitconfig::parse(t).map_err(|e| e.to_string())?;
    const BOOLS: &[&str] = &[
        "no-commit",
        "edit",
        "allow-empty",
        "allow-empty-message",
        "drop-redundant-commits",
        "keep-redundant-commits",
        "signoff",
        "record-origin",
        "allow-ff",
        "allow-rerere-auto",
        "reference",
    ];
    for e in &entries {
        let v = e.value.as_deref().unwrap_or("true");
        let ok = e.section == "options"
            && e.sub.is_none()
            && match e.name.as_str() {
                n if BOOLS.contains(&n) => matches!(v, "true" | "false"),
                "mainline" => !v.is_empty() && v.len() < 6 && v.bytes().all(|c| c.is_ascii_digit()),
                "strategy" => STRATEGIES.contains(&v),
                // The default key only (see gpg_sign_opt).
                "gpg-sign" => v.is_empty(),
                "strategy-option" => v.bytes().all(|c| (0x20..0x7f).contains(&c)),
                "default-msg-cleanup" => {
                    matches!(
                        v,
                        "verbatim" | "whitespace" | "strip" | "scissors" | "default"
                    )
                }
                _ => false,
            };
        if !ok {
            return Err(format!(
                "'{}' = '{}' is not an option git writes there",
                shorten(&e.key()),
                shorten(v)
            ));
        }
    }
    Ok(())
}

/// BISECT_LOG: comments and `git bisect CMD ARGS` lines (`git bisect
/// replay` reads them as commands of its own, never through a shell).
fn bisect_log(b: &[u8]) -> Result<(), String> {
    no_controls(b, b"\t\n")?;
    for l in lines(b)? {
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let cmd = l
            .strip_prefix("git bisect ")
            .map(|r| r.split(' ').next().unwrap_or_default())
            .ok_or_else(|| format!("unexpected line '{}'", shorten(l)))?;
        if !(matches!(
            cmd,
            "start" | "good" | "bad" | "new" | "old" | "skip" | "terms"
        ) || bisect_term(cmd))
        {
            return Err(format!("unexpected line '{}'", shorten(l)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct All;
    impl Objects for All {
        fn need(&self, _: &str, _: Want) -> Result<Vec<git2::Oid>, String> {
            Ok(Vec::new())
        }
        fn need_short(&self, _: &str, _: Want) -> Result<Vec<git2::Oid>, String> {
            Ok(Vec::new())
        }
    }
    const ID: &str = "5db741b36c5a2dbee2ee51cbcf685353e692d004";

    #[test]
    fn todo_lists_take_gits_commands_only() {
        let ok = format!(
            "pick {ID} c1\np a6d1e65 x\n# comment\n\nlabel onto\nreset onto\nmerge -C {ID} topic # Merge\nupdate-ref refs/heads/x\nfixup -C a6d1e65\nbreak\nnoop\nreset [new root]\n"
        );
        assert!(check(Todo, ok.as_bytes(), &All).is_ok());
        for bad in [
            "exec touch /tmp/x\n".to_string(),
            format!("pick {ID}\nx make\n"),
            "run it\n".into(),
            format!("pick {ID} \x1b]52;c;x\x07\n"),
            "label ../../x\n".into(),
            "update-ref HEAD\n".into(),
            "pick nothex\n".into(),
        ] {
            assert!(check(Todo, bad.as_bytes(), &All).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn files_are_checked_as_git_writes_them() {
        assert!(check(Oids, format!("{ID}\n{ID}\n").as_bytes(), &All).is_ok());
        assert!(check(Oids, b"abc\n", &All).is_err());
        assert!(check(Choice(&["", "no-ff"]), b"", &All).is_ok());
        assert!(check(Choice(&["", "no-ff"]), b"ff\n", &All).is_err());
        // The default signing key or none, never a key the sandbox names.
        let gpg = REBASE_BASIC
            .iter()
            .find(|(n, _)| *n == "gpg_sign_opt")
            .unwrap()
            .1;
        assert!(check(gpg, b"-S\n", &All).is_ok());
        assert!(check(gpg, b"--no-gpg-sign\n", &All).is_ok());
        assert!(check(gpg, b"-SDEADBEEF0001\n", &All).is_err());
        assert!(check(Strategy, b"ort\n", &All).is_ok());
        assert!(check(Strategy, b"evil\n", &All).is_err());
        assert!(
            check(
                AuthorScript,
                b"GIT_AUTHOR_NAME='a'\\''b'\nGIT_AUTHOR_DATE='@1 +0000'\n",
                &All
            )
            .is_ok()
        );
        assert!(check(AuthorScript, b"GIT_AUTHOR_NAME='a'; touch x\n", &All).is_err());
        assert!(check(AuthorScript, b"PATH='x'\n", &All).is_err());
        assert!(check(Msg, b"Merge\n\n# Conflicts:\n#\tf\n", &All).is_ok());
        assert!(check(Msg, b"\x1b[2Jx\n", &All).is_err());
        assert!(
            check(
                SeqOpts,
                b"[options]\n\tallow-ff = true\n\tstrategy = ort\n",
                &All
            )
            .is_ok()
        );
        assert!(check(SeqOpts, b"[options]\n\tstrategy = evil\n", &All).is_err());
        assert!(check(SeqOpts, b"[core]\n\tfsmonitor = x\n", &All).is_err());
        assert!(check(RefsToDelete, b"refs/rewritten/onto\n", &All).is_ok());
        assert!(check(RefsToDelete, b"refs/heads/main\n", &All).is_err());
        assert!(
            check(
                BisectLog,
                format!("git bisect start\n# bad: [{ID}] x\ngit bisect bad {ID}\n").as_bytes(),
                &All
            )
            .is_ok()
        );
        assert!(check(BisectLog, b"rm -rf /\n", &All).is_err());
        assert!(check(BisectStart, b"main\n", &All).is_ok());
        assert!(check(BisectStart, b"../x\n", &All).is_err());
        assert!(check(BisectTerms, b"bad\ngood\n", &All).is_ok());
        assert!(check(BisectTerms, b"run\ngood\n", &All).is_err());
        assert!(check(HeadName, b"refs/heads/c1\n", &All).is_ok());
        assert!(check(HeadName, b"refs/remotes/x\n", &All).is_err());
        assert!(check(Empty, b"x", &All).is_err());
    }
}
