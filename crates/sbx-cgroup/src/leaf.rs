//! cgroup v2's "no internal processes" rule, for the default parent.
//!
//! On v2 a group that holds processes cannot hand controllers to its
//! children (writing `cgroup.subtree_control` fails with EBUSY). When
//! sbx-cgroup is started in a delegated group of its own — `systemd-run
//! --user --scope -p Delegate=yes sbx-cgroup ...`, the case the error
//! message recommends — it is itself that process. Then, and only then (the
//! default parent, controllers to enable, and no process in the group but
//! this one), the supervisor moves itself into a leaf of its own group,
//! `<own>/sbx-<SBX_ID>.supervisor` (it stays inside the tree it started
//! in), enables the controllers, and at the end undoes it all: the
//! controllers it enabled are disabled again, it moves back, and the leaf is
//! removed. The watcher, forked while the supervisor is in the leaf, does
//! the same for itself when the supervisor dies.

use std::path::{Path, PathBuf};

use crate::group::{GroupError, Target};
use crate::owner::Owner;

#[derive(Debug, Clone)]
pub struct Leaf {
    /// The caller's own group (the parent of the sandbox group).
    pub own: PathBuf,
    /// `<own>/sbx-<ID>.supervisor`.
    pub leaf: PathBuf,
    /// Controllers enabled in `own`'s subtree_control by this run.
    pub enabled: Vec<&'static str>,
    real: bool,
}

fn procs(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Writes a cgroup file (a fake cgroupfs has no kernel to make it: there
/// it is created).
fn write(p: &Path, v: &str, real: bool) -> std::io::Result<()> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .write(true)
        .create(!real)
        .truncate(!real)
        .open(p)?
        .write_all(v.as_bytes())
}

impl Leaf {
    /// Moves this process into a leaf of its own v2 group when the group's
    /// controllers must be enabled and this process is the only one in it.
    /// Returns None when nothing had to be done; Busy when other processes
    /// share the group (nothing is changed then).
    pub fn enter_if_needed(
        t: &Target,
        default_parent: bool,
        name: &str,
        owner: &Owner,
        real: bool,
    ) -> Result<Option<Leaf>, GroupError> {
        if !t.hier.v2 || !default_parent || t.enable.is_empty() {
            return Ok(None);
        }
        let me = std::process::id() as i32;
        let inside = procs(&t.parent);
        if inside.is_empty() {
            return Ok(None);
        }
        if inside != [me] {
            return Err(GroupError::Busy(t.parent.display().to_string()));
        }
        let leaf = t.parent.join(format!("{name}.supervisor"));
        // Registered until the record is written (see owner::register).
        let entry = crate::owner::register(&leaf);
        std::fs::create_dir(&leaf)
            .map_err(|e| GroupError::Create(leaf.display().to_string(), e))?;
        owner.record(&leaf);
        drop(entry);
        let l = Leaf {
            own: t.parent.clone(),
            leaf: leaf.clone(),
            enabled: t.enable.clone(),
            real,
        };
        if let Err(e) = write(&leaf.join("cgroup.procs"), "0", real) {
            let _ = crate::group::remove_tree(&leaf, real, std::time::Duration::from_secs(1));
            return Err(GroupError::Set {
                what: "cgroup.procs (moving the supervisor into its leaf)".into(),
                dir: leaf.display().to_string(),
                source: e,
            });
        }
        Ok(Some(l))
    }

    /// Undoes [`Leaf::enter_if_needed`] for the calling process: disables
    /// the controllers this run enabled, moves back to the own group and
    /// removes the leaf once it is empty (best effort, each step).
    pub fn leave(&self) -> Result<(), GroupError> {
        if !self.enabled.is_empty() {
            let what: Vec<String> = self.enabled.iter().map(|c| format!("-{c}")).collect();
            write(
                &self.own.join("cgroup.subtree_control"),
                &what.join(" "),
                self.real,
            )
            .map_err(|e| GroupError::Set {
                what: "cgroup.subtree_control".into(),
                dir: self.own.display().to_string(),
                source: e,
            })?;
        }
        write(&self.own.join("cgroup.procs"), "0", self.real).map_err(|e| GroupError::Set {
            what: "cgroup.procs (moving back)".into(),
            dir: self.own.display().to_string(),
            source: e,
        })?;
        // Another process of this run may still be in the leaf (the
        // watcher leaves it on its own); remove it only when empty.
        if self.real && !procs(&self.leaf).is_empty() {
            return Ok(());
        }
        crate::group::remove_tree(&self.leaf, self.real, std::time::Duration::from_secs(2))
    }
}
