//! The audit log must not be reachable, writable, from inside: a log file
//! inside a writable bind could be emptied or forged by the sandbox. Checked
//! by identity on the open log fd (so a log reached through a symlink, or a
//! host bind mount aliasing its directory, is still found), before anything
//! is mounted.

use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

use sbx_core::Failure;

use crate::plan::{Plan, What};

/// (dev, ino, nlink) of an open fd or a path.
fn ids_fd(fd: RawFd) -> Option<(u64, u64, u64)> {
    // SAFETY: libc::stat is plain integers: all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat into a local buffer on an fd the audit sink owns.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino, st.st_nlink))
}

fn ids_path(p: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(f: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    PathBuf::from(std::ffi::OsString::from_vec(
        sbx_core::escape::mountinfo_field(f),
    ))
}

/// Where `p` (absolute, resolved) lies on its file system: the mount's
/// device (major:minor) and the path from the file system's own root, read
/// from /proc/self/mountinfo. A bind mount that aliases a directory gives
/// the same answer as the directory itself, whatever path reaches it.
pub(crate) fn fs_path(p: &Path, mountinfo: &str) -> Option<(String, PathBuf)> {
    let mut best: Option<(usize, &str, PathBuf, PathBuf)> = None;
    for line in mountinfo.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() < 5 {
            continue;
        }
        let mp = unescape(f[4]);
        if !p.starts_with(&mp) {
            continue;
        }
        let len = mp.as_os_str().len();
        // The last mount on the longest mount point is the one seen.
        if best.as_ref().is_none_or(|b| len >= b.0) {
            best = Some((len, f[2], unescape(f[3]), mp));
        }
    }
    let (_, dev, root, mp) = best?;
    let rel = p.strip_prefix(&mp).ok()?;
    Some((dev.to_string(), root.join(rel)))
}

/// Refuses (exit 125, one line naming the log and the bind) when the audit
/// log this tool writes to is inside a writable bind of `plan`, is itself
/// bound writable, or has a second hard link on the file system of a
/// writable bind (that link may be inside it).
pub fn refuse_log_in_writable_bind(plan: &Plan) -> Result<(), Failure> {
    let Some(fd) = sbx_core::audit::get().and_then(|a| a.raw_fd()) else {
        return Ok(());
    };
    let Some((dev, ino, nlink)) = ids_fd(fd) else {
        return Ok(());
    };
    let shown: PathBuf = std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .unwrap_or_else(|_| PathBuf::from(format!("(fd {fd})")));
    // The log's own identity and every directory above it.
    let mut chain = vec![(dev, ino)];
    let mut up = shown.parent();
    while let Some(d) = up {
        chain.extend(ids_path(d));
        up = d.parent();
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let log_at = fs_path(&shown, &mountinfo);
    for op in &plan.ops {
        let What::Bind { src, ro: false } = op.what else {
            continue;
        };
        let s = &plan.sources[src];
        // Also by place on the file system: the log reached through a bind
        // mount of a directory inside the bind (no ancestor in common).
        let aliased = match (&log_at, fs_path(&s.path, &mountinfo)) {
            (Some((ld, lp)), Some((bd, bp))) => *ld == bd && lp.starts_with(&bp),
            _ => false,
        };
        if aliased || chain.contains(&(s.dev, s.ino)) {
            return Err(Failure::new(format!(
                "audit log {} is inside the writable bind {}: the sandbox could erase or forge it; put the log outside every --rw",
                shown.display(),
                s.path.display()
            )));
        }
        if nlink > 1 && s.dev == dev {
            return Err(Failure::new(format!(
                "audit log {} has {nlink} hard links on the file system of the writable bind {}: one may be inside it; use a log file with one link",
                shown.display(),
                s.path.display()
            )));
        }
    }
    Ok(())
}
