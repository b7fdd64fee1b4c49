//! Who owns a sandbox group, and reaping the groups whose owner is gone.
//!
//! Right after `mkdir`, sbx-cgroup writes an extended attribute on the group
//! directory (`trusted.sbx.owner` as root, `user.sbx.owner` otherwise; both
//! are supported by cgroupfs): `sbx-cgroup pid=P start=T id=ID`, where T is
//! the supervisor's start time in clock ticks since boot (field 22 of
//! /proc/P/stat), so a recycled pid is not mistaken for the owner. A
//! directory is reaped only when its name starts with `sbx-`, it carries
//! that attribute with the `sbx-cgroup ` tag, and the owner process is gone:
//! a group anyone else made (no attribute) is never touched.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use crate::discover::Hierarchy;
use crate::group::{GroupDir, SandboxGroup, Target};

const XATTRS: [&str; 2] = ["trusted.sbx.owner", "user.sbx.owner"];
const TAG: &str = "sbx-cgroup ";

/// The supervisor that owns a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub pid: i32,
    pub start: u64,
    pub id: String,
}

/// Start time (clock ticks since boot) of `pid`, from /proc.
pub fn start_time(pid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // comm may hold spaces and parens: split after the last ')'.
    let rest = &s[s.rfind(')')? + 2..];
    // Fields from 3 on; starttime is field 22.
    rest.split_whitespace().nth(19)?.parse().ok()
}

impl Owner {
    /// This process.
    pub fn me(id: &str) -> Self {
        let pid = std::process::id() as i32;
        Owner {
            pid,
            start: start_time(pid).unwrap_or(0),
            id: id.to_string(),
        }
    }

    pub fn encode(&self) -> String {
        format!("{TAG}pid={} start={} id={}", self.pid, self.start, self.id)
    }

    pub fn decode(s: &str) -> Option<Self> {
        let rest = s.strip_prefix(TAG)?;
        let mut pid = None;
        let mut start = None;
        let mut id = None;
        for kv in rest.split_whitespace() {
            match kv.split_once('=')? {
                ("pid", v) => pid = v.parse().ok(),
                ("start", v) => start = v.parse().ok(),
                ("id", v) => id = Some(v.to_string()),
                _ => {}
            }
        }
        Some(Owner {
            pid: pid?,
            start: start?,
            id: id?,
        })
    }

    /// Whether the owner process still runs (same pid, same start time).
    pub fn alive(&self) -> bool {
        start_time(self.pid) == Some(self.start)
    }

    /// Writes the record on `dir` (best effort: without it the group cannot
    /// be reaped later, the watcher still removes it).
    pub fn record(&self, dir: &Path) {
        let Ok(c) = CString::new(dir.as_os_str().as_bytes()) else {
            return;
        };
        let v = self.encode();
        for name in XATTRS {
            let n = CString::new(name).unwrap();
            let r =
                // SAFETY: c and n are NUL-ended and v a live buffer of v.len() bytes, alive for
                // the call.
                unsafe { libc::setxattr(c.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), 0) };
            if r == 0 {
                return;
            }
        }
        tracing::debug!(dir = %dir.display(), "no owner record (xattrs unsupported)");
    }
}

/// The registry kind of a group directory between its `mkdir` and its
/// owner record (`sbx_core::registry`).
pub const REG_KIND: &str = "cgroup";

/// Registers `dir` before it is made: a SIGKILL between the `mkdir` and
/// [`Owner::record`] leaves a group without a record, which
/// [`reap_stale`] never touches; the next sbx-cgroup reaps it from the
/// registry ([`reap_registered`]). Dropped once the record is written
/// (the record's reaping takes over). None when there is no registry (a
/// warning says so).
pub fn register(dir: &Path) -> Option<sbx_core::registry::Entry> {
    sbx_core::registry::register(REG_KIND, dir)
        .map_err(|e| tracing::warn!(dir = %dir.display(), "group not registered: {e}"))
        .ok()
}

/// Removes the group directories dead runs registered and left without
/// an owner record (they were killed between the `mkdir` and the record:
/// no process was in them yet), whatever their parent. A directory with a
/// record is left to [`reap_stale`]. Returns the directories removed.
pub fn reap_registered() -> Vec<std::path::PathBuf> {
    sbx_core::registry::reap(REG_KIND, |p| {
        let ours = p
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("sbx-"));
        if !ours || read_owner(p).is_some() {
            return Ok(());
        }
        std::fs::remove_dir(p)
    })
}

/// The owner record of `dir`, if it has one. As root only the `trusted.`
/// record counts: a `user.` one could have been forged by the user a
/// delegated parent belongs to.
pub fn read_owner(dir: &Path) -> Option<Owner> {
    let c = CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: geteuid cannot fail.
    let names: &[&str] = if unsafe { libc::geteuid() } == 0 {
        &XATTRS[..1]
    } else {
        &XATTRS
    };
    for &name in names {
        let n = CString::new(name).unwrap();
        let mut buf = [0u8; 256];
        let r =
            // SAFETY: c and n are NUL-ended; buf is a live buffer of buf.len() bytes.
            unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if r > 0 {
            return Owner::decode(std::str::from_utf8(&buf[..r as usize]).ok()?);
        }
    }
    None
}

/// The owner of `dir` when it is a group of ours (`sbx-*`, with the
/// record) whose owner is gone; None otherwise.
fn stale_owner(dir: &Path) -> Option<Owner> {
    let is_ours = dir
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("sbx-"));
    if !is_ours {
        return None;
    }
    read_owner(dir).filter(|o| !o.alive())
}

/// How long the kill loop may take on a stale group before it is reported.
const STALE_KILL_LIMIT: Duration = Duration::from_secs(10);

/// Kills and removes a stale group given as its dirs (one per hierarchy,
/// the same name): all at once, so that a v1 group left FROZEN in the
/// freezer hierarchy is thawed while its processes are killed (a frozen
/// task does not die of SIGKILL until it is thawed), and a v2 group is
/// emptied with `cgroup.kill`. Returns whether every dir is gone.
fn reap_group(name: &str, dirs: Vec<GroupDir>, owner: &Owner, real: bool) -> bool {
    let started = std::time::Instant::now();
    let was_frozen = dirs.iter().any(|d| {
        std::fs::read_to_string(d.path.join("freezer.state")).is_ok_and(|s| s.trim() != "THAWED")
            || std::fs::read_to_string(d.path.join("cgroup.freeze")).is_ok_and(|s| s.trim() == "1")
    });
    // A v2 group frozen through cgroup.freeze is thawed first (v1 freezer
    // groups are thawed by the kill loop itself).
    for d in dirs.iter().filter(|d| d.hier.v2) {
        let f = d.path.join("cgroup.freeze");
        if std::fs::read_to_string(&f).is_ok_and(|s| s.trim() == "1") {
            let _ = std::fs::write(&f, "0");
        }
    }
    let mut g = SandboxGroup::adopt(name, dirs, real);
    let res = g.destroy(STALE_KILL_LIMIT);
    sbx_core::audit::emit(
        "stale_group_reaped",
        sbx_core::Severity::Warn,
        serde_json::json!({
            "cgroup": g.dirs.iter().map(|d| d.path.display().to_string()).collect::<Vec<_>>(),
            "owner_pid": owner.pid,
            "owner_sbx_id": owner.id,
            "was_frozen": was_frozen,
            "processes_killed": g.killed,
            "removed": res.is_ok(),
            "reap_ms": started.elapsed().as_millis() as u64,
        }),
    );
    if let Err(e) = &res {
        tracing::warn!("stale group {name}: {}", sbx_core::exit::error_chain(e));
    }
    res.is_ok()
}

/// Kills and removes `dir` (in hierarchy `hier`) if it is a group of ours
/// whose owner is gone. Returns whether it did.
pub fn reap_if_stale(hier: &Hierarchy, dir: &Path, real: bool) -> bool {
    let Some(owner) = stale_owner(dir) else {
        return false;
    };
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let d = GroupDir {
        hier: hier.clone(),
        path: dir.to_path_buf(),
    };
    reap_group(&name, vec![d], &owner, real)
}

/// Reaps the stale `sbx-*` groups directly under every target's parent:
/// the dirs of one group in all hierarchies are killed and removed
/// together (see [`reap_group`]). Returns how many groups were reaped.
pub fn reap_stale(targets: &[Target], real: bool) -> usize {
    let mut found: Vec<(String, Owner, Vec<GroupDir>)> = Vec::new();
    for t in targets {
        let Ok(rd) = std::fs::read_dir(&t.parent) else {
            continue;
        };
        for e in rd.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let p = e.path();
            let Some(owner) = stale_owner(&p) else {
                continue;
            };
            let name = e.file_name().to_string_lossy().into_owned();
            let d = GroupDir {
                hier: t.hier.clone(),
                path: p,
            };
            match found.iter_mut().find(|f| f.0 == name) {
                Some(f) => f.2.push(d),
                None => found.push((name, owner, vec![d])),
            }
        }
    }
    found
        .into_iter()
        .filter(|(name, owner, dirs)| reap_group(name, dirs.clone(), owner, real))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trip() {
        let o = Owner::me("abc");
        assert!(o.alive());
        assert_eq!(Owner::decode(&o.encode()), Some(o.clone()));
        assert_eq!(Owner::decode("someone else pid=1"), None);
        let dead = Owner {
            start: o.start + 1,
            ..o
        };
        assert!(!dead.alive());
    }
}
