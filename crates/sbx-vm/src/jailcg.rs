//! cgroups for the jailed Firecracker (`--jail-cgroup FILE=VALUE`): the
//! jailer creates `<own cgroup>/sbx-vm/<jail id>` (nested under sbx-vm's own
//! cgroup, never beside it), writes the values and puts Firecracker in it;
//! sbx-vm removes the group at the end (and stale ones at the next start).

use std::path::{Path, PathBuf};

use sbx_core::exit::Failure;

const MOUNT: &str = "/sys/fs/cgroup";
const SUBDIR: &str = "sbx-vm";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JailCgroups {
    pub version: u8,
    /// Relative to the hierarchy's root, as the jailer's --parent-cgroup wants.
    pub parent: String,
    pub settings: Vec<String>,
}

fn is_v2() -> bool {
    Path::new(MOUNT).join("cgroup.controllers").exists()
}

/// Our own cgroup path for `controller` (v1) or the v2 path.
fn own_path(controller: Option<&str>) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    for l in text.lines() {
        let mut parts = l.splitn(3, ':');
        let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        match controller {
            None if ctrls.is_empty() => return Some(path.to_string()),
            Some(c) if ctrls.split(',').any(|x| x == c) => return Some(path.to_string()),
            _ => {}
        }
    }
    None
}

/// Checks `--jail-cgroup` settings and finds the parent.
pub fn plan(settings: &[String]) -> Result<Option<JailCgroups>, Failure> {
    if settings.is_empty() {
        return Ok(None);
    }
    let v2 = is_v2();
    let mut own: Option<String> = None;
    for s in settings {
        let Some((file, value)) = s.split_once('=') else {
            return Err(Failure::new(format!(
                "--jail-cgroup {s}: expected FILE=VALUE (e.g. pids.max=256)"
            )));
        };
        let Some((ctrl, _)) = file.split_once('.') else {
            return Err(Failure::new(format!(
                "--jail-cgroup {s}: FILE must be CONTROLLER.KEY"
            )));
        };
        if value.is_empty() || file.contains('/') {
            return Err(Failure::new(format!(
                "--jail-cgroup {s}: invalid file or value"
            )));
        }
        let p = if v2 {
            own_path(None)
        } else {
            if !Path::new(MOUNT).join(ctrl).is_dir() {
                return Err(Failure::new(format!(
                    "--jail-cgroup {s}: no cgroup v1 hierarchy for controller '{ctrl}'"
                )));
            }
            own_path(Some(ctrl))
        };
        let Some(p) = p else {
            return Err(Failure::new(format!(
                "--jail-cgroup {s}: cannot find our own cgroup for '{ctrl}'"
            )));
        };
        match &own {
            None => own = Some(p),
            Some(o) if *o == p => {}
            Some(o) => {
                return Err(Failure::new(format!(
                    "--jail-cgroup {s}: this process is in '{p}' for '{ctrl}' but in '{o}' for an earlier setting (the jailer takes one parent)"
                )));
            }
        }
    }
    let own = own.unwrap_or_default();
    let trimmed = own.trim_matches('/');
    let parent = if trimmed.is_empty() {
        SUBDIR.to_string()
    } else {
        format!("{trimmed}/{SUBDIR}")
    };
    Ok(Some(JailCgroups {
        version: if v2 { 2 } else { 1 },
        parent,
        settings: settings.to_vec(),
    }))
}

/// The group directories of jail `id` under `parent`, in every hierarchy.
pub fn dirs(parent: &str, id: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if is_v2() {
        out.push(Path::new(MOUNT).join(parent).join(id));
        return out;
    }
    if let Ok(rd) = std::fs::read_dir(MOUNT) {
        for e in rd.flatten() {
            let d = e.path().join(parent).join(id);
            if d.is_dir() {
                out.push(d);
            }
        }
    }
    out
}

/// Removes the groups of jail `id` (their processes must be dead), then the
/// `sbx-vm` parents when empty.
pub fn remove(parent: &str, id: &str) {
    for d in dirs(parent, id) {
        for _ in 0..50 {
            if std::fs::remove_dir(&d).is_ok() || !d.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        if let Some(p) = d.parent() {
            let _ = std::fs::remove_dir(p);
        }
    }
}

/// Every parent a jail group of ours can have (one per distinct own path).
pub fn all_parents() -> Vec<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let mut out: Vec<String> = Vec::new();
    for l in text.lines() {
        let Some(path) = l.splitn(3, ':').nth(2) else {
            continue;
        };
        let t = path.trim_matches('/');
        let p = if t.is_empty() {
            SUBDIR.to_string()
        } else {
            format!("{t}/{SUBDIR}")
        };
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}
