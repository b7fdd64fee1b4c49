//! The empty, unreadable file bound read-only over hidden files (`.env`,
//! ...): a host file of mode 000 in a directory of its own per run
//! (<tmp>/sbx-container-<container name>), removed at clean-up, or by the
//! reaper with the stale container of a dead run.

use std::io;
use std::path::PathBuf;

fn dir_for(container_name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("sbx-container-{container_name}"))
}

/// The run's directory (created when missing).
pub fn run_dir(container_name: &str) -> io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let d = dir_for(container_name);
    match std::fs::DirBuilder::new().mode(0o711).create(&d) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(d),
    }
}

/// Creates the directory and the empty file; returns both.
pub fn create(container_name: &str) -> io::Result<(PathBuf, PathBuf)> {
    use std::os::unix::fs::OpenOptionsExt;
    let d = run_dir(container_name)?;
    let f = d.join("hidden");
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o000)
        .open(&f)?;
    Ok((d, f))
}

/// Removes the directory of a stale container (name as the engine lists it).
pub fn remove_dir_for(container_name: &str) {
    if container_name.starts_with("sbx-") && !container_name.contains('/') {
        let _ = std::fs::remove_dir_all(dir_for(container_name));
    }
}
