//! The run's private host directory: the empty, unreadable file bound
//! read-only over hidden files (`.env`, ...), a host file of mode 000, and
//! Podman's seccomp profile. One directory per run, made with a fresh
//! unpredictable name (`<tmp>/sbx-container-XXXXXX`, never an existing
//! path: nothing planted in advance is used), named in the container's
//! label [`crate::owner::L_HIDE`], removed at clean-up, or by the reaper
//! once it removed the stale container of a dead run.

use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

const PREFIX: &str = "sbx-container-";

/// The registry kind of run directories (`sbx_core::registry`): each is
/// registered before it is made, and the entry is released once the
/// container that names it in its label exists (the label's reaping takes
/// over); a run SIGKILLed in between leaves an entry the next run reaps.
pub const KIND: &str = "container-hide";

/// A new directory for this run (mode 0711: the engine's runtime, perhaps
/// another user in its user namespace, passes through it to the files).
/// In `$TMPDIR` when that is an absolute path, else `/tmp` (the engine
/// binds by absolute path). Registered before it is made (the entry is
/// returned; without a registry a warning says so).
pub fn new_dir() -> io::Result<(PathBuf, Option<sbx_core::registry::Entry>)> {
    use std::os::unix::fs::DirBuilderExt;
    let base = Some(std::env::temp_dir())
        .filter(|t| t.is_absolute())
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    let mut last = None;
    for _ in 0..8 {
        let d = base.join(format!("{PREFIX}{}", sbx_core::id::random_suffix()));
        let entry = sbx_core::registry::register(KIND, &d)
            .map_err(|e| tracing::warn!(dir = %d.display(), "not registered: {e}"))
            .ok();
        match std::fs::DirBuilder::new().mode(0o700).create(&d) {
            Ok(()) => {
                sbx_core::registry::test_kill_point("container-hide-made");
                std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o711))?;
                return Ok((d, entry));
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no new name")))
}

/// Removes the run directories of dead runs that never got their
/// container (SIGKILLed between making the directory and the container's
/// creation), whatever their TMPDIR was.
pub fn reap_registered() -> Vec<PathBuf> {
    sbx_core::registry::reap(KIND, |p| {
        remove_stale(&p.to_string_lossy());
        Ok(())
    })
}

/// Creates the empty file in `dir`; returns it.
pub fn hidden_file(dir: &Path) -> io::Result<PathBuf> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = dir.join("hidden");
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o000)
        .open(&f)?;
    Ok(f)
}

/// Removes the directory a stale container's label names: only an
/// absolute path whose last component is ours, a real directory (never
/// through a symlink) owned by this user.
pub fn remove_stale(dir: &str) {
    let d = Path::new(dir);
    let ours = d.is_absolute()
        && d.file_name()
            .is_some_and(|n| n.as_encoded_bytes().starts_with(PREFIX.as_bytes()));
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if ours && std::fs::symlink_metadata(d).is_ok_and(|m| m.is_dir() && m.uid() == me) {
        let _ = sbx_core::rmtree::remove_tree(d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_run_gets_a_new_directory_and_only_ours_are_reaped() {
        let a = new_dir().unwrap().0;
        let b = new_dir().unwrap().0;
        assert_ne!(a, b);
        assert_eq!(
            std::fs::metadata(&a).unwrap().permissions().mode() & 0o777,
            0o711
        );
        let f = hidden_file(&a).unwrap();
        assert_eq!(
            std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
            0
        );
        // Not ours by name, or a symlink to ours: left alone.
        let other = tempfile::tempdir().unwrap();
        remove_stale(other.path().to_str().unwrap());
        assert!(other.path().exists());
        let link = other.path().join("sbx-container-link");
        std::os::unix::fs::symlink(&b, &link).unwrap();
        remove_stale(link.to_str().unwrap());
        assert!(b.exists() && link.exists());
        remove_stale("sbx-container-relative");
        remove_stale(a.to_str().unwrap());
        remove_stale(b.to_str().unwrap());
        assert!(!a.exists() && !b.exists());
    }
}
