//! The per-run private directory (0700): the control socket, the fw_cfg
//! secrets file, the console log, Firecracker's sockets. It is named after
//! the owning sbx-vm (pid and start time) so that a later run can tell a
//! stale one (its owner was SIGKILLed) from a live one and remove it.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum RunDirError {
    #[error("run directory {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("run directory {0} is not owned by us or not private (0700)")]
    NotPrivate(PathBuf),
}

/// The start time (clock ticks since boot) of a process, from /proc.
pub fn start_time(pid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the process `pid` that started at `start` still runs.
pub fn alive(pid: i32, start: u64) -> bool {
    start_time(pid) == Some(start)
}

/// `<base>/run-<pid>-<start>` -> (pid, start).
pub fn parse_owner(name: &str, prefix: &str) -> Option<(i32, u64)> {
    let rest = name.strip_prefix(prefix)?;
    let (p, s) = rest.split_once('-')?;
    Some((p.parse().ok()?, s.parse().ok()?))
}

/// The base directory of this user's run directories.
pub fn base() -> PathBuf {
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    std::env::temp_dir().join(format!("sbx-vm-{uid}"))
}

pub struct RunDir {
    pub path: PathBuf,
    removed: bool,
    /// The run directory in the per-user registry (sbx_core::registry):
    /// a run with another TMPDIR reaps it when this one was SIGKILLed.
    entry: Option<sbx_core::registry::Entry>,
}

/// The registry kind of run directories.
const KIND: &str = "sbx-vm-run";

impl RunDir {
    /// Creates this run's directory (reaping stale ones first); returns it
    /// and the names of the stale directories removed.
    pub fn create() -> Result<(RunDir, Vec<String>), RunDirError> {
        let base = base();
        // Run directories (under any TMPDIR) whose owner is gone; first,
        // as their removal also removes a base left empty.
        let registered: Vec<String> = sbx_core::registry::reap(KIND, remove_run_dir)
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        let io_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| RunDirError::Io { path, source }
        };
        match std::fs::DirBuilder::new().mode(0o700).create(&base) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err(&base)(e)),
        }
        let m = std::fs::symlink_metadata(&base).map_err(io_err(&base))?;
        // SAFETY: geteuid cannot fail.
        if !m.is_dir() || m.uid() != unsafe { libc::geteuid() } || m.mode() & 0o077 != 0 {
            return Err(RunDirError::NotPrivate(base));
        }
        let mut reaped = registered;
        reaped.extend(reap_stale(&base));
        let me = std::process::id() as i32;
        let start = start_time(me).unwrap_or(0);
        let path = base.join(format!("run-{me}-{start}"));
        // Registered before it exists: a SIGKILL between the two leaves an
        // entry whose path is missing, which the reaper accepts.
        let entry = sbx_core::registry::register(KIND, &path).map_err(io_err(&path))?;
        // A concurrent run that reaped the last other directory removes
        // the base it left empty: make it again then (once).
        let mk = || std::fs::DirBuilder::new().mode(0o700).create(&path);
        match mk() {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::DirBuilder::new()
                    .mode(0o700)
                    .create(&base)
                    .map_err(io_err(&base))?;
                mk().map_err(io_err(&path))?;
            }
            r => r.map_err(io_err(&path))?,
        }
        Ok((
            RunDir {
                path,
                removed: false,
                entry: Some(entry),
            },
            reaped,
        ))
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    pub fn remove(&mut self) -> io::Result<()> {
        if self.removed {
            return Ok(());
        }
        self.removed = true;
        let r = remove_run_dir(&self.path);
        if r.is_ok() {
            drop(self.entry.take());
        }
        r
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = self.remove();
    }
}

/// Removes a run directory, then its base (`$TMPDIR/sbx-vm-UID`) when that
/// is left empty (another run may be using it: ENOTEMPTY is fine).
fn remove_run_dir(p: &Path) -> io::Result<()> {
    // At any depth (sbx_core::rmtree); a missing one is not an error.
    sbx_core::rmtree::remove_tree(p)?;
    if let Some(base) = p.parent()
        && base
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("sbx-vm-"))
    {
        let _ = std::fs::remove_dir(base);
    }
    Ok(())
}

/// Removes run directories whose owner no longer runs.
fn reap_stale(base: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(base) else {
        return out;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some((pid, start)) = parse_owner(&name, "run-") else {
            continue;
        };
        if !alive(pid, start) && sbx_core::rmtree::remove_tree(&e.path()).is_ok() {
            out.push(name);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_names() {
        assert_eq!(parse_owner("run-12-345", "run-"), Some((12, 345)));
        assert_eq!(parse_owner("other", "run-"), None);
        let me = std::process::id() as i32;
        assert!(alive(me, start_time(me).unwrap()));
        assert!(!alive(me, start_time(me).unwrap() + 1));
    }
}
