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
                unsafe { libc::setxattr(c.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), 0) };
            if r == 0 {
                return;
            }
        }
        tracing::debug!(dir = %dir.display(), "no owner record (xattrs unsupported)");
    }
}

/// The owner record of `dir`, if it has one. As root only the `trusted.`
/// record counts: a `user.` one could have been forged by the user a
/// delegated parent belongs to.
pub fn read_owner(dir: &Path) -> Option<Owner> {
    let c = CString::new(dir.as_os_str().as_bytes()).ok()?;
    let names: &[&str] = if unsafe { libc::geteuid() } == 0 {
        &XATTRS[..1]
    } else {
        &XATTRS
    };
    for &name in names {
        let n = CString::new(name).unwrap();
        let mut buf = [0u8; 256];
        let r =
            unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if r > 0 {
            return Owner::decode(std::str::from_utf8(&buf[..r as usize]).ok()?);
        }
    }
    None
}

/// Kills and removes `dir` if it is a group of ours whose owner is gone.
/// Returns whether it did.
pub fn reap_if_stale(dir: &Path, real: bool) -> bool {
    let is_ours = dir
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("sbx-"));
    if !is_ours {
        return false;
    }
    let Some(owner) = read_owner(dir) else {
        return false;
    };
    if owner.alive() {
        return false;
    }
    let mut pids = Vec::new();
    collect(dir, &mut pids);
    // Freeze-less kill loop: SIGKILL until empty (bounded).
    for _ in 0..200 {
        let mut pids = Vec::new();
        collect(dir, &mut pids);
        if pids.is_empty() {
            break;
        }
        for p in pids {
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let ok = crate::group::remove_tree(dir, real, Duration::from_secs(2)).is_ok();
    sbx_core::audit::emit(
        "stale_group_reaped",
        sbx_core::Severity::Warn,
        serde_json::json!({
            "cgroup": dir.display().to_string(),
            "owner_pid": owner.pid,
            "owner_sbx_id": owner.id,
            "processes_killed": pids.len(),
            "removed": ok,
        }),
    );
    ok
}

fn collect(dir: &Path, out: &mut Vec<i32>) {
    if let Ok(s) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(s.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect(&e.path(), out);
            }
        }
    }
}

/// Reaps the stale `sbx-*` groups directly under `parent`.
pub fn reap_stale(parent: &Path, real: bool) -> usize {
    let Ok(rd) = std::fs::read_dir(parent) else {
        return 0;
    };
    let mut n = 0;
    for e in rd.flatten() {
        let p = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) && reap_if_stale(&p, real) {
            n += 1;
        }
    }
    n
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
