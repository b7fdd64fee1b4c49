//! Reflogs from the stage: `refs/stash`'s (where `stash@{N}` lives), and
//! those of the branches, remote-tracking refs and HEAD the sandbox moved,
//! so `stash@{1}`, `@{1}` and `git stash pop` work in the next call.
//!
//! A reflog the sandbox wrote (the overlay's copy of it: git appends to the
//! host's file, or rewrites it on `git stash drop`/`pop`) replaces the
//! host's when every line is one git writes: `OLD NEW NAME <EMAIL> TIME
//! TZ[\tMESSAGE]\n`, both ids existing after the import (zero for "none"),
//! no control character, a bounded line and line count, and the last line
//! naming the ref's value after the import. The objects its entries name
//! that nothing else brings in (an older stash, a commit before an amend)
//! come in with their complete history, checked like every other object.
//! Anything else is refused with an alert and the host's reflog kept. The
//! sandbox may add entries but not take the host's away
//! ([`keep_history`]; `reflog_history_kept` alert).

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use sbx_core::Severity;
use serde_json::json;

use crate::import::Events;
use crate::refs::Value;

/// Bytes of one reflog file.
pub const MAX_LOG_BYTES: u64 = 16 << 20;
/// Entries of one reflog file.
pub const MAX_LINES: usize = 100_000;
/// Bytes of one entry (git keeps the message to one line: a subject).
pub const MAX_LINE: usize = 4096;

/// A reflog to write: where below the git dir, its bytes, and the value
/// its ref must still have when it is written.
#[derive(Debug, Clone)]
pub struct Log {
    pub rel: String,
    /// The ref it belongs to (`HEAD`, `refs/...`), for the events and the
    /// final check; `None` for a linked worktree's HEAD (checked by
    /// worktree.rs).
    pub name: Option<String>,
    pub last: Option<git2::Oid>,
    pub data: Vec<u8>,
    pub entries: usize,
}

/// Why a reflog is not taken.
#[derive(Debug)]
pub enum Refusal {
    /// Not what git writes, or naming a missing object: an alert.
    Bad(String),
    /// Well formed, but its last entry is not the ref's value after the
    /// import (the ref itself was refused, with its own alert): a warning.
    Stale(String),
}

/// An id of a reflog line: hex of SHA-1 or SHA-256 length.
fn id(s: &[u8]) -> Option<git2::Oid> {
    if !(s.len() == 40 || s.len() == 64) || !s.iter().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    git2::Oid::from_str(std::str::from_utf8(s).ok()?).ok()
}

/// One line without its newline: (old, new), or what is wrong with it.
pub fn parse_line(line: &[u8]) -> Result<(git2::Oid, git2::Oid), String> {
    if line.len() > MAX_LINE {
        return Err(format!(
            "an entry of {} bytes (at most {MAX_LINE})",
            line.len()
        ));
    }
    // git collapses the message's whitespace: one tab, before the message.
    let (head, msg) = match line.iter().position(|&b| b == b'\t') {
        Some(i) => (&line[..i], &line[i + 1..]),
        None => (line, &b""[..]),
    };
    if let Some(b) = head.iter().chain(msg).find(|&&b| b < 0x20 || b == 0x7f) {
        return Err(format!("control character 0x{b:02x} in an entry"));
    }
    let mut it = head.splitn(3, |&b| b == b' ');
    let (Some(o), Some(n), Some(ident)) = (it.next(), it.next(), it.next()) else {
        return Err("not 'OLD NEW IDENTITY'".into());
    };
    let (Some(o), Some(n)) = (id(o), id(n)) else {
        return Err("an old or new value that is not an object id".into());
    };
    // NAME <EMAIL> TIME TZ: one '<' and one '>' around the email.
    let ident = String::from_utf8_lossy(ident);
    let bad = || {
        format!(
            "identity '{}' is not 'NAME <EMAIL> TIME TZ'",
            ident.chars().take(80).collect::<String>()
        )
    };
    let (who, when) = ident.rsplit_once("> ").ok_or_else(bad)?;
    let (name, email) = who.split_once('<').ok_or_else(bad)?;
    if name.contains('>') || email.contains('<') || email.contains('>') {
        return Err(bad());
    }
    let (time, tz) = when.split_once(' ').ok_or_else(bad)?;
    let tz_ok = tz.len() == 5
        && matches!(tz.as_bytes()[0], b'+' | b'-')
        && tz[1..].bytes().all(|b| b.is_ascii_digit());
    if time.is_empty() || time.len() > 20 || !time.bytes().all(|b| b.is_ascii_digit()) || !tz_ok {
        return Err(bad());
    }
    Ok((o, n))
}

/// Checks a whole reflog; `need` says whether an object exists after the
/// import (with its complete history) and returns the new objects to bring
/// in for it. Returns the entries and the objects to bring in.
pub fn check(
    data: &[u8],
    last: Option<git2::Oid>,
    need: &mut dyn FnMut(git2::Oid) -> Result<Vec<git2::Oid>, String>,
) -> Result<(usize, Vec<git2::Oid>), Refusal> {
    if data.is_empty() {
        return Ok((0, Vec::new()));
    }
    if !data.ends_with(b"\n") {
        return Err(Refusal::Bad("the last entry has no newline".into()));
    }
    let lines: Vec<&[u8]> = data[..data.len() - 1].split(|&b| b == b'\n').collect();
    if lines.len() > MAX_LINES {
        return Err(Refusal::Bad(format!(
            "{} entries (at most {MAX_LINES})",
            lines.len()
        )));
    }
    let mut ids = BTreeSet::new();
    let mut newest = None;
    for (i, l) in lines.iter().enumerate() {
        let (o, n) = parse_line(l).map_err(|e| Refusal::Bad(format!("entry {}: {e}", i + 1)))?;
        ids.insert(o);
        ids.insert(n);
        newest = Some(n);
    }
    let mut bring = Vec::new();
    for o in ids.into_iter().filter(|o| !o.is_zero()) {
        match need(o) {
            Ok(v) => bring.extend(v),
            Err(m) => {
                return Err(Refusal::Bad(format!(
                    "an entry names {o}, which does not exist with its history (object {m} is missing)"
                )));
            }
        }
    }
    if let (Some(want), Some(got)) = (last, newest)
        && want != got
    {
        return Err(Refusal::Stale(format!(
            "its newest entry ({got}) is not the value the import left ({want})"
        )));
    }
    Ok((lines.len(), bring))
}

/// The object a ref names once the planned updates are applied (symbolic
/// refs followed a few levels).
pub fn value_after(
    repo: &git2::Repository,
    planned: &BTreeMap<String, Option<Value>>,
    name: &str,
) -> Option<git2::Oid> {
    let mut n = name.to_string();
    for _ in 0..5 {
        let v = match planned.get(&n) {
            Some(Some(v)) => v.clone(),
            Some(None) => return None,
            None => {
                let r = repo.find_reference(&n).ok()?;
                match r.symbolic_target() {
                    Some(t) => Value::Sym(t.to_string()),
                    None => Value::Oid(r.target()?.to_string()),
                }
            }
        };
        match v {
            Value::Oid(o) => return git2::Oid::from_str(&o).ok(),
            Value::Sym(s) => n = s,
            Value::Invalid(_) => return None,
        }
    }
    None
}

fn refuse(ev: &mut Events, name: &str, r: Refusal) {
    let (sev, reason) = match r {
        Refusal::Bad(m) => (Severity::Alert, m),
        Refusal::Stale(m) => (Severity::Warn, m),
    };
    ev.push(
        "reflog_refused",
        sev,
        json!({ "ref": name, "path": format!("logs/{name}"), "reason": reason,
                "action": "not imported (the host's reflog is kept)" }),
    );
}

/// The reflogs the sandbox wrote under `upper/logs` (HEAD and refs in the
/// namespaces the import accepts) that pass [`check`]; `after(name)` is the
/// ref's value after the import (`None`: it has none, nothing to log).
pub fn plan(
    upper: &Path,
    git_dir: &Path,
    max_files: u64,
    ev: &mut Events,
    need: &mut dyn FnMut(git2::Oid) -> Result<Vec<git2::Oid>, String>,
    after: &dyn Fn(&str) -> Option<git2::Oid>,
    bring: &mut Vec<git2::Oid>,
) -> Vec<Log> {
    let mut out = Vec::new();
    let logs = upper.join("logs");
    match fs::symlink_metadata(&logs) {
        Ok(m) if m.is_dir() => {}
        Ok(m) if m.file_type().is_symlink() => {
            refuse(
                ev,
                "*",
                Refusal::Bad("logs is a symbolic link (never followed)".into()),
            );
            return out;
        }
        _ => return out,
    }
    let mut files = Vec::new();
    let mut stack = vec![(logs.clone(), 0usize)];
    let mut n = 0u64;
    while let Some((d, depth)) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.filter_map(|e| e.ok()) {
            n += 1;
            if n > max_files {
                refuse(
                    ev,
                    "*",
                    Refusal::Bad(format!(
                        "more than {max_files} files in the stage's logs (--stage-max-objects)"
                    )),
                );
                return Vec::new();
            }
            let p = e.path();
            let Ok(m) = fs::symlink_metadata(&p) else {
                continue;
            };
            let name = p
                .strip_prefix(&logs)
                .unwrap_or(&p)
                .to_string_lossy()
                .into_owned();
            if m.is_dir() {
                if depth < 32 {
                    stack.push((p, depth + 1));
                }
                continue;
            }
            // Whiteouts (a deleted ref's log goes with the ref) and locks.
            if !m.file_type().is_symlink() && !m.is_file() || name.ends_with(".lock") {
                continue;
            }
            let ours = name == "HEAD"
                || (crate::refs::valid_refname(&name) && crate::import::allowed_name(&name));
            if !ours {
                continue;
            }
            if m.file_type().is_symlink() {
                refuse(
                    ev,
                    &name,
                    Refusal::Bad("symbolic link in the stage (never followed)".into()),
                );
                continue;
            }
            files.push((name, p));
        }
    }
    files.sort();
    for (name, p) in files {
        let Some(last) = after(&name) else { continue };
        let data = match crate::stage::read_small(&p, MAX_LOG_BYTES) {
            Ok(d) => d,
            Err(e) => {
                refuse(ev, &name, Refusal::Bad(format!("unreadable: {e}")));
                continue;
            }
        };
        let host = fs::read(git_dir.join("logs").join(&name)).unwrap_or_default();
        if host == data {
            continue;
        }
        let (data, restored) = keep_history(&host, &data, name == "refs/stash");
        if restored > 0 {
            ev.push(
                "reflog_history_kept",
                Severity::Alert,
                json!({ "ref": name, "restored": restored,
                        "reason": "the sandbox's reflog dropped or rewrote entries of the host's",
                        "action": "the host's entries kept, the sandbox's new ones after them" }),
            );
        }
        match check(&data, Some(last), need) {
            Ok((entries, b)) => {
                bring.extend(b);
                out.push(Log {
                    rel: format!("logs/{name}"),
                    name: Some(name),
                    last: Some(last),
                    data,
                    entries,
                });
            }
            Err(r) => refuse(ev, &name, r),
        }
    }
    out
}

/// The reflog to write from the host's and the sandbox's: the sandbox may
/// add entries, never take the host's history away (its entries are how
/// the user gets lost work back). The sandbox's file must read as host
/// entries in order, some left out, then new ones; what it left out comes
/// back, except in `refs/stash`, where leaving an entry out is `git stash
/// drop`/`pop`. Returns the file and how many host entries came back.
fn keep_history(host: &[u8], ours: &[u8], stash: bool) -> (Vec<u8>, usize) {
    let h: Vec<&[u8]> = host.split_inclusive(|&b| b == b'\n').collect();
    let o: Vec<&[u8]> = ours.split_inclusive(|&b| b == b'\n').collect();
    let (mut j, mut k) = (0, 0);
    while k < o.len() {
        match h[j..].iter().position(|l| *l == o[k]) {
            Some(p) => {
                j += p + 1;
                k += 1;
            }
            None => break,
        }
    }
    // Host entries the sandbox's file does not have in order.
    let missing = h.len() - k;
    if stash && o[k..].iter().all(|l| !h.contains(l)) {
        return (ours.to_vec(), 0);
    }
    if missing == 0 {
        return (ours.to_vec(), 0);
    }
    let mut out = host.to_vec();
    if !out.is_empty() && !out.ends_with(b"\n") {
        out.push(b'\n');
    }
    for l in &o[k..] {
        if !h.contains(l) {
            out.extend_from_slice(l);
        }
    }
    (out, missing)
}

/// Writes the planned reflogs (after the refs: a ref that did not end at
/// the value its reflog names keeps the host's reflog).
pub fn apply(git_dir: &Path, logs: &[Log], owner: Option<(u32, u32)>, ev: &mut Events) {
    let repo = crate::verify::open(git_dir).ok();
    for l in logs {
        if let (Some(name), Some(repo)) = (&l.name, &repo) {
            let now = repo
                .find_reference(name)
                .ok()
                .and_then(|r| r.resolve().ok())
                .and_then(|r| r.target());
            if now != l.last {
                refuse(
                    ev,
                    name,
                    Refusal::Stale("its ref was not imported as planned".into()),
                );
                continue;
            }
        }
        let p = git_dir.join(&l.rel);
        let r = crate::fsutil::make_parents_safe(git_dir, &l.rel)
            .and_then(|()| crate::fsutil::create_dirs_owned(p.parent().unwrap(), git_dir))
            .and_then(|()| crate::fsutil::write_atomic(&p, &l.data, 0o644, owner));
        match r {
            Ok(()) => ev.push(
                "reflog_imported",
                Severity::Info,
                json!({ "path": l.rel, "ref": l.name, "entries": l.entries }),
            ),
            Err(e) => ev.push(
                "reflog_refused",
                Severity::Warn,
                json!({ "path": l.rel, "ref": l.name, "reason": format!("cannot write it: {e}") }),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "1111111111111111111111111111111111111111";
    const B: &str = "2222222222222222222222222222222222222222";

    #[test]
    fn lines_git_writes_are_accepted() {
        let l = format!("{A} {B} A U Thor <a@example.com> 1700000000 +0100\tcommit: x y");
        assert!(parse_line(l.as_bytes()).is_ok());
        let l = format!("{A} {B} <> 1 -0000");
        assert!(parse_line(l.as_bytes()).is_ok());
    }

    #[test]
    fn anything_else_is_refused() {
        for l in [
            format!("{A} {B} a <a> 1 +0100\tx\ty"),
            format!("{A} {B} a <a> 1 +0100\tx\x1b[2Jy"),
            format!("{A} zz a <a> 1 +0100"),
            format!("{A} {B} a a 1 +0100"),
            format!("{A} {B} a <a> x +0100"),
            format!("{A} {B} a <a> 1 0100"),
            format!("{A} {B} a <a<b> 1 +0100"),
            format!("{A} {B} a <a> 1 +0100\t{}", "m".repeat(MAX_LINE)),
        ] {
            assert!(parse_line(l.as_bytes()).is_err(), "{l}");
        }
    }

    #[test]
    fn the_hosts_history_is_kept() {
        let l = |a: &str, b: &str, m: &str| format!("{a} {b} a <a@x> 1 +0000\t{m}\n");
        let (h1, h2) = (l(A, B, "one"), l(B, A, "two"));
        let host = format!("{h1}{h2}");
        // Appending: the sandbox's file as it is.
        let new = l(A, B, "three");
        let ours = format!("{host}{new}");
        assert_eq!(
            keep_history(host.as_bytes(), ours.as_bytes(), false),
            (ours.clone().into_bytes(), 0)
        );
        // Erased and forged: the host's entries come back, the new one after.
        let forged = l(A, B, "clone");
        let (out, n) = keep_history(host.as_bytes(), forged.as_bytes(), false);
        assert_eq!(
            (String::from_utf8(out).unwrap(), n),
            (format!("{host}{forged}"), 2)
        );
        // A stash drop leaves an entry out: that is the point.
        let (out, n) = keep_history(host.as_bytes(), h2.as_bytes(), true);
        assert_eq!((String::from_utf8(out).unwrap(), n), (h2.clone(), 0));
        // Reordered stash entries are not a drop: the host's come back.
        let swapped = format!("{h2}{h1}");
        let (_, n) = keep_history(host.as_bytes(), swapped.as_bytes(), true);
        assert_eq!(n, 1);
    }

    #[test]
    fn whole_logs() {
        let ok = |_| Ok(Vec::new());
        let b = git2::Oid::from_str(B).unwrap();
        let data = format!("{A} {B} a <a> 1 +0100\tx\n");
        assert!(check(data.as_bytes(), Some(b), &mut { ok }).is_ok());
        assert!(matches!(
            check(
                data.as_bytes(),
                Some(git2::Oid::from_str(A).unwrap()),
                &mut { ok }
            ),
            Err(Refusal::Stale(_))
        ));
        assert!(matches!(
            check(data.trim_end().as_bytes(), Some(b), &mut { ok }),
            Err(Refusal::Bad(_))
        ));
        let mut missing = |o: git2::Oid| Err(o.to_string());
        assert!(matches!(
            check(data.as_bytes(), Some(b), &mut missing),
            Err(Refusal::Bad(_))
        ));
    }
}
