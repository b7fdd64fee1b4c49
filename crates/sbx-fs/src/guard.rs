//! The guard policy: which mounts of the plan become nodes of sbx-fs's own
//! FUSE file system (so that a refused access is seen, and logged, by
//! sbx-fs), and the alerts those refusals raise.
//!
//! - Denied paths (`--deny`, the default deny list) become *deny nodes*:
//!   stat shows what the old placeholder showed (empty, mode 000), every
//!   other access is refused with EACCES and raises `fs_denied`.
//! - The invariants that are read by git and Claude Code (.git/config,
//!   .git/HEAD, .git/hooks/, .claude, .claude/settings*.json, skills/,
//!   commands/) become *guarded nodes*: a read-only passthrough to the real
//!   files (opened by sbx-fs on the host before the sandbox existed); any
//!   write-class operation is refused with EROFS and raises
//!   `fs_write_denied`. A missing one is an empty guarded node.
//! - .git/objects and .git/refs stay plain read-only binds: git reads them
//!   heavily, a FUSE hop would slow it down, and writing there is not one
//!   of the named attacks. /proc masks stay plain placeholders too.
//!
//! Alerts are deduplicated (one line per path and access) and capped, so a
//! flood of denied opens cannot flood the audit log; the counts are in the
//! final `fs_guard` event.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use sbx_core::{Severity, audit};
use serde_json::json;

use crate::plan::{self, Plan, What};
use crate::sys;

/// What a guard node does.
#[derive(Debug)]
pub enum NodeKind {
    /// Hidden: nothing but stat works.
    Deny,
    /// A protected entry that does not exist: empty, read-only.
    Empty,
    /// A protected entry that exists: read-only passthrough to this O_PATH
    /// fd (opened on the host, without following symlinks).
    Pass(OwnedFd),
}

#[derive(Debug)]
pub struct GuardNode {
    /// Where it is mounted, as the sandbox sees it (for the alerts).
    pub path: PathBuf,
    pub kind: NodeKind,
}

/// The guard nodes of a plan, and which op each one replaces.
#[derive(Debug, Default)]
pub struct Guards {
    pub nodes: Vec<GuardNode>,
    /// op index -> node index
    pub by_op: HashMap<usize, usize>,
    /// Protected .git directories (host O_PATH fd, sandbox path) whose
    /// config/HEAD lock files are watched (see [`crate::lockwatch`]).
    pub git_dirs: Vec<(OwnedFd, PathBuf)>,
}

impl Guards {
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The fds the nodes hold (the sandbox's init closes its copies).
    pub fn fds(&self) -> Vec<i32> {
        self.nodes
            .iter()
            .filter_map(|n| match &n.kind {
                NodeKind::Pass(fd) => Some(fd.as_raw_fd()),
                _ => None,
            })
            .collect()
    }
}

/// Invariant entries that stay plain read-only binds (see the module doc).
fn plain_readonly(dst: &Path) -> bool {
    let name = dst.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let parent_git = dst
        .parent()
        .and_then(|p| p.file_name())
        .is_some_and(|n| n == ".git");
    (parent_git && (name == "objects" || name == "refs")) || name == ".git"
}

/// Chooses the guard nodes of `plan`. Call after the host placeholders
/// exist. An existing invariant that cannot be opened stays a plain
/// read-only bind.
pub fn select(plan: &Plan) -> Guards {
    let mut g = Guards::default();
    for (i, op) in plan.ops.iter().enumerate() {
        let kind = match (&op.what, op.why) {
            (What::Deny, "deny" | "deny pattern") => NodeKind::Deny,
            (What::Empty, "invariant") if !plain_readonly(&op.dst) => NodeKind::Empty,
            (What::ReadOnly, "invariant") if !plain_readonly(&op.dst) => match open_host(plan, i) {
                Some(fd) => NodeKind::Pass(fd),
                None => continue,
            },
            _ => continue,
        };
        let name = op.dst.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if let (Some(parent), true) = (op.dst.parent(), name == "config" || name == "HEAD")
            && parent.file_name().is_some_and(|n| n == ".git")
            && !g.git_dirs.iter().any(|(_, p)| p == parent)
            && let Some(fd) = open_host_dir(plan, i)
        {
            g.git_dirs.push((fd, parent.to_path_buf()));
        }
        g.by_op.insert(i, g.nodes.len());
        g.nodes.push(GuardNode {
            path: op.dst.clone(),
            kind,
        });
    }
    g
}

/// The host directory beneath which op `i`'s object lies and its path
/// there: the enclosing bind's source, or under a `--git-stage` overlay,
/// its lower layer (the real .git, what is read) or, for `watch`, its upper
/// layer (where git's lock files appear).
fn host_base(plan: &Plan, i: usize, watch: bool) -> Option<(i32, &Path)> {
    let j = plan::enclosing(&plan.ops, i)?;
    let src = match plan.ops[j].what {
        What::Bind { src, .. } => src,
        What::Overlay { upper, .. } if watch => upper,
        What::Overlay { lower, .. } => lower,
        _ => return None,
    };
    let rel = plan.ops[i].dst.strip_prefix(&plan.ops[j].dst).ok()?;
    Some((plan.sources[src].fd.as_raw_fd(), rel))
}

/// Opens the host object that op `i` protects, beneath its bind source,
/// without following any symlink.
fn open_host(plan: &Plan, i: usize) -> Option<OwnedFd> {
    let (base, rel) = host_base(plan, i, false)?;
    sys::openat2(
        base,
        rel,
        libc::O_PATH | libc::O_NOFOLLOW,
        0,
        sys::RESOLVE_BENEATH | sys::RESOLVE_NO_SYMLINKS,
    )
    .ok()
}

/// Opens the host directory holding what op `i` protects (where git
/// creates its lock files).
fn open_host_dir(plan: &Plan, i: usize) -> Option<OwnedFd> {
    let (base, rel) = host_base(plan, i, true)?;
    let rel = rel.parent()?;
    sys::openat2(
        base,
        if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        },
        libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
        sys::RESOLVE_BENEATH | sys::RESOLVE_NO_SYMLINKS,
    )
    .ok()
}

/// The name of node `g` in the FUSE root: the sandbox's init looks it up
/// with the kind of the mount point it covers ("3.d" / "3.f").
pub fn node_name(g: usize, dir: bool) -> String {
    format!("{g}.{}", if dir { "d" } else { "f" })
}

pub fn parse_node_name(name: &[u8]) -> Option<(usize, bool)> {
    let s = std::str::from_utf8(name).ok()?;
    let (n, k) = s.split_once('.')?;
    let dir = match k {
        "d" => true,
        "f" => false,
        _ => return None,
    };
    Some((n.parse().ok()?, dir))
}

/// At most this many further alerts per sandbox beyond the first one of
/// each protected path; the rest are counted.
pub const MAX_ALERTS: u64 = 200;

/// The alert sink, deduplicating by (event, path, access). The first alert
/// of each event about each protected path (a guard node: a denied or
/// protected path of the plan, a finite list) is always logged, whatever
/// came before: a flood of harmless denials cannot hide the one that
/// matters. Only further alerts (other accesses, names below a node) are
/// capped at [`MAX_ALERTS`].
#[derive(Debug, Default)]
pub struct Alerts {
    seen: HashSet<(&'static str, PathBuf, &'static str)>,
    /// The guard nodes' paths.
    roots: Vec<PathBuf>,
    /// (event, node) pairs already alerted.
    first: HashSet<(&'static str, PathBuf)>,
    capped: u64,
    pub emitted: u64,
    pub suppressed: u64,
}

impl Alerts {
    /// A sink for the protected paths `roots` (the guard nodes).
    pub fn for_nodes(roots: impl IntoIterator<Item = PathBuf>) -> Alerts {
        Alerts {
            roots: roots.into_iter().collect(),
            ..Alerts::default()
        }
    }

    /// The protected path `path` is, or lies below.
    fn root_of(&self, path: &Path) -> PathBuf {
        self.roots
            .iter()
            .filter(|r| path.starts_with(r))
            .max_by_key(|r| r.as_os_str().len())
            .cloned()
            .unwrap_or_else(|| path.to_path_buf())
    }

    /// `fs_denied`: a denied path was read, listed, looked into, created...
    pub fn denied(&mut self, path: &Path, access: &'static str, pid: u32) {
        self.alert("fs_denied", "access", path, access, pid);
    }

    /// `fs_write_denied`: a protected path was written, created, removed...
    pub fn write_denied(&mut self, path: &Path, op: &'static str, pid: u32) {
        self.alert("fs_write_denied", "op", path, op, pid);
    }

    /// `fs_write_denied` with `op: "replace"`: a lock file announcing a
    /// rename over a protected file (the caller is not known).
    pub fn replace_attempt(&mut self, path: &Path, via: &str) {
        if let Some(mut f) = self.admit("fs_write_denied", path, "replace") {
            f["op"] = json!("replace");
            f["caller_pid"] = serde_json::Value::Null;
            f["via"] = json!(via);
            if via == "config.lock" {
                f["hint"] = json!(crate::lockwatch::GIT_CONFIG_HINT);
            }
            audit::emit("fs_write_denied", Severity::Alert, f);
        }
    }

    fn alert(&mut self, event: &'static str, key: &str, path: &Path, what: &'static str, pid: u32) {
        if let Some(mut f) = self.admit(event, path, what) {
            f["caller_pid"] = json!(pid);
            f[key] = json!(what);
            audit::emit(event, Severity::Alert, f);
        }
    }

    /// Dedup and cap: the alert's fields when it is to be emitted.
    fn admit(
        &mut self,
        event: &'static str,
        path: &Path,
        what: &'static str,
    ) -> Option<serde_json::Value> {
        if !self.seen.insert((event, path.to_path_buf(), what)) {
            self.suppressed += 1;
            return None;
        }
        let root = self.root_of(path);
        // The first of this protected path: always.
        if !self.first.insert((event, root)) {
            if self.capped >= MAX_ALERTS {
                sbx_core::audit::budget_exhausted(event, json!({ "cap": MAX_ALERTS }));
                self.suppressed += 1;
                return None;
            }
            self.capped += 1;
        }
        self.emitted += 1;
        Some(json!({ "path": path.display().to_string() }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Harmless denials first cannot use up the cap: the first alert of a
    /// protected path that was not alerted yet is always logged.
    #[test]
    fn a_flood_never_hides_the_first_alert_of_another_protected_path() {
        let mut a = Alerts::for_nodes([PathBuf::from("/h/.ssh"), PathBuf::from("/w/.env")]);
        for i in 0..(MAX_ALERTS + 50) {
            let p = PathBuf::from(format!("/h/.ssh/missing-{i}"));
            let _ = a.admit("fs_denied", &p, "lookup");
        }
        assert!(a.suppressed >= 49, "{a:?}");
        assert!(a.admit("fs_denied", Path::new("/w/.env"), "read").is_some());
        // Repeats of one path stay one line.
        assert!(a.admit("fs_denied", Path::new("/w/.env"), "read").is_none());
        // A path outside every node counts as its own protected path.
        assert!(
            a.admit("fs_write_denied", Path::new("/w/x"), "create")
                .is_some()
        );
    }
}
