//! What a run creates on the host, registered where any later run finds it,
//! whatever its TMPDIR was.
//!
//! A run that creates a temporary thing (a run directory, a placeholder
//! before its rename, a git stage) registers it: a small file in the
//! per-user registry directory holding the thing's path, with an exclusive
//! flock held by the run for as long as the thing is its own. The lock is
//! the liveness test: the kernel drops it when the owner dies, however it
//! dies, so a later run that obtains it knows the owner is gone (no
//! `kill(pid, 0)`, which zombies and reused pids fool). It then removes the
//! thing with the kind's own removal and the entry with it.
//!
//! The registry directory: `$XDG_RUNTIME_DIR/sbx` when that is an absolute
//! directory of ours, else `/run/sbx-$UID` (root), else `/tmp/sbx-registry-$UID`
//! (a fixed name, not $TMPDIR). It must be ours and 0700 or nothing is used.
//! Tests set `SBX_REGISTRY_DIR=D` (an existing directory): the registry is
//! then `D/UID`.

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

fn euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// Makes `p` (a directory 0700 of ours, not a symlink) exist.
fn private_dir(p: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(p) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let m = std::fs::symlink_metadata(p)?;
    if !m.is_dir() || m.uid() != euid() || m.mode() & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} is not a private directory of ours", p.display()),
        ));
    }
    Ok(())
}

/// Where sbx-fs and sbx-gitguard move what the sandbox planted, in order
/// of preference: `$XDG_STATE_HOME/sbx/quarantine`,
/// `~/.local/state/sbx/quarantine`, `/var/tmp/sbx-quarantine-<uid>` (each
/// tool takes the first one outside every writable bind).
pub fn default_quarantines() -> Vec<PathBuf> {
    let abs = |k: &str| {
        std::env::var_os(k)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    let mut v = Vec::new();
    if let Some(x) = abs("XDG_STATE_HOME") {
        v.push(x.join("sbx/quarantine"));
    }
    if let Some(h) = abs("HOME") {
        v.push(h.join(".local/state/sbx/quarantine"));
    }
    v.push(PathBuf::from(format!("/var/tmp/sbx-quarantine-{}", euid())));
    v
}

/// The registry directory of this user (created when missing).
pub fn dir() -> io::Result<PathBuf> {
    if let Some(x) = std::env::var_os("SBX_REGISTRY_DIR") {
        // Tests give each run its own registry: one directory per user
        // beneath the one named.
        let p = PathBuf::from(x).join(euid().to_string());
        private_dir(&p)?;
        return Ok(p);
    }
    if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from)
        && x.is_absolute()
        && std::fs::symlink_metadata(&x).is_ok_and(|m| m.is_dir() && m.uid() == euid())
    {
        let p = x.join("sbx");
        if private_dir(&p).is_ok() {
            return Ok(p);
        }
    }
    let uid = euid();
    if uid == 0 {
        let p = PathBuf::from("/run/sbx-0");
        if private_dir(&p).is_ok() {
            return Ok(p);
        }
    }
    let p = PathBuf::from(format!("/tmp/sbx-registry-{uid}"));
    private_dir(&p)?;
    Ok(p)
}

/// A registered thing: removing the entry (drop, [`Entry::release`]) says
/// the run has removed or handed over the thing itself.
#[derive(Debug)]
pub struct Entry {
    file: PathBuf,
    _lock: File,
}

impl Entry {
    /// The thing was removed (or became permanent): forget it.
    pub fn release(self) {}
}

impl Drop for Entry {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

fn flock(f: &File, nb: bool) -> bool {
    let op = libc::LOCK_EX | if nb { libc::LOCK_NB } else { 0 };
    // SAFETY: flock on an fd this File owns.
    unsafe { libc::flock(f.as_raw_fd(), op) == 0 }
}

/// Registers `path` (absolute) as a thing of `kind` this run owns.
pub fn register(kind: &str, path: &Path) -> io::Result<Entry> {
    let d = dir()?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|t| t.as_nanos())
        .unwrap_or(0);
    let name = format!("{kind}-{}-{now}", std::process::id());
    // Written under a temporary name, locked, then renamed: a reaper never
    // sees a named entry without its path or without its lock.
    let tmp = d.join(format!(".new-{name}"));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(&tmp)?;
    if !flock(&f, true) {
        let _ = std::fs::remove_file(&tmp);
        return Err(io::Error::other("cannot lock a new registry entry"));
    }
    let res = f
        .write_all(path.as_os_str().as_bytes())
        .and_then(|()| std::fs::rename(&tmp, d.join(&name)));
    if let Err(e) = res {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(Entry {
        file: d.join(name),
        _lock: f,
    })
}

/// Removes the things of `kind` whose owner is gone (their lock is free),
/// with `remove` (a thing already gone is fine), and their entries; returns
/// the paths reaped. Entries of live runs are left alone.
pub fn reap(kind: &str, remove: impl Fn(&Path) -> io::Result<()>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(d) = dir() else {
        return out;
    };
    let Ok(rd) = std::fs::read_dir(&d) else {
        return out;
    };
    let prefix = format!("{kind}-");
    for e in rd.flatten() {
        let name = e.file_name();
        let n = name.as_bytes();
        let stale_new = n.starts_with(format!(".new-{prefix}").as_bytes());
        if !n.starts_with(prefix.as_bytes()) && !stale_new {
            continue;
        }
        let p = e.path();
        let Ok(mut f) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&p)
        else {
            continue;
        };
        if !flock(&f, true) {
            continue; // its owner runs
        }
        if stale_new {
            // The owner died before the entry was complete: it created
            // nothing yet.
            let _ = std::fs::remove_file(&p);
            continue;
        }
        let mut buf = Vec::new();
        if Read::by_ref(&mut f)
            .take(4096)
            .read_to_end(&mut buf)
            .is_err()
        {
            continue;
        }
        let thing = PathBuf::from(OsString::from_vec(buf));
        if !thing.is_absolute() {
            let _ = std::fs::remove_file(&p);
            continue;
        }
        match remove(&thing) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(_) => continue, // kept: a later run tries again
        }
        let _ = std::fs::remove_file(&p);
        out.push(thing);
    }
    out
}

/// A named moment at which the fault-injection tests kill the process:
/// with `SBX_TEST_KILL_AT=NAME[,NAME...]` in the environment, SIGKILL here.
/// (Anyone who sets a tool's environment can kill it anyway.)
pub fn test_kill_point(name: &str) {
    let hit = std::env::var_os("SBX_TEST_KILL_AT").is_some_and(|v| {
        v.as_bytes()
            .split(|b| *b == b',')
            .any(|n| n == name.as_bytes())
    });
    if hit {
        // SAFETY: raising a signal on this process.
        unsafe { libc::raise(libc::SIGKILL) };
    }
}

/// Whether a thing of `kind` at `path` is registered by a live run.
pub fn is_live(kind: &str, path: &Path) -> bool {
    let Ok(d) = dir() else { return false };
    let Ok(rd) = std::fs::read_dir(&d) else {
        return false;
    };
    let prefix = format!("{kind}-");
    rd.flatten().any(|e| {
        e.file_name().as_bytes().starts_with(prefix.as_bytes())
            && std::fs::read(e.path()).is_ok_and(|b| b == path.as_os_str().as_bytes())
            && std::fs::File::open(e.path()).is_ok_and(|f| !flock(&f, true))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dead owner's thing is reaped by the next run; a live one's is not.
    #[test]
    fn dead_owners_things_are_reaped_live_ones_kept() {
        let d = tempfile::tempdir().unwrap();
        let reg = d.path().join("reg");
        std::fs::create_dir(&reg).unwrap();
        // SAFETY: the test sets its own registry before anything reads it
        // (only this test in this crate uses the registry).
        unsafe { std::env::set_var("SBX_REGISTRY_DIR", &reg) };
        let thing = d.path().join("thing");
        std::fs::create_dir(&thing).unwrap();
        let live = register("t", &thing).unwrap();
        assert!(is_live("t", &thing));
        assert!(reap("t", |p| std::fs::remove_dir_all(p)).is_empty());
        assert!(thing.exists());
        // A child registers a second thing and dies holding it.
        let other = d.path().join("other");
        std::fs::create_dir(&other).unwrap();
        // SAFETY: the child only registers and _exits.
        match unsafe { libc::fork() } {
            0 => {
                let e = register("t", &other);
                std::mem::forget(e);
                // SAFETY: the forked child leaves without running the test harness's
                // destructors.
                unsafe { libc::_exit(0) }
            }
            pid => {
                let mut st = 0;
                // SAFETY: pid is our own child, reaped once; st is a live int.
                unsafe { libc::waitpid(pid, &mut st, 0) };
            }
        }
        let reaped = reap("t", |p| std::fs::remove_dir_all(p));
        assert_eq!(reaped, vec![other.clone()]);
        assert!(!other.exists() && thing.exists());
        drop(live);
        let mine = reg.join(euid().to_string());
        assert!(std::fs::read_dir(&mine).unwrap().next().is_none());
    }
}
