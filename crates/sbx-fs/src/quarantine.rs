//! The quarantine directory: where the end sweep moves what it takes out
//! of the writable binds. It must lie outside every writable bind, also
//! when reached through a host bind mount that aliases a directory inside
//! one (the sandbox could plant symlinks there otherwise, or read and
//! change what was taken out), and a copy into it across file systems must
//! not expand sparse files or fill its disk.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use sbx_core::{Failure, Severity, audit};
use serde_json::json;

use crate::spec::Spec;

/// Data bytes one move into the quarantine copies across file systems (a
/// control directory and all it holds). Beyond it the rest of the data is
/// not copied (holes stay holes, whatever the size): the copy is marked
/// truncated, and the original still goes.
pub const COPY_CAP: u64 = 64 << 20;

/// Data bytes all the moves of one sbx-fs process copy across file
/// systems together (many entries of [`COPY_CAP`] each must not fill the
/// disk either).
pub const COPY_TOTAL: u64 = 256 << 20;

static COPIED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The data budget for one move into `quarantine`: [`COPY_CAP`], less
/// what the process copied already beyond [`COPY_TOTAL`], and at most
/// half of what is free on the quarantine's file system.
pub fn budget(quarantine: &Path) -> u64 {
    let used = COPIED.load(std::sync::atomic::Ordering::Relaxed);
    let mut b = COPY_CAP.min(COPY_TOTAL.saturating_sub(used));
    if let Ok(st) = nix::sys::statvfs::statvfs(quarantine) {
        let free = st.blocks_available().saturating_mul(st.fragment_size());
        b = b.min(free / 2);
    }
    b
}

/// Counts `n` copied data bytes against [`COPY_TOTAL`].
pub fn spent(n: u64) {
    COPIED.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
}

/// The writable bind of `rw` (canonical host sources) that `q` lies in:
/// by path, by the identity of `q` and every directory above it, and by
/// place on the file system (mountinfo: a bind mount aliasing a directory
/// inside the bind, with no ancestor in common).
pub fn inside(q: &Path, rw: &[PathBuf]) -> Option<PathBuf> {
    let qc = crate::protect::canonical_prefix(q);
    if let Some(b) = rw.iter().find(|b| qc.starts_with(b)) {
        return Some(b.clone());
    }
    let mut chain = Vec::new();
    let mut cur = Some(qc.as_path());
    while let Some(c) = cur {
        if let Ok(m) = std::fs::metadata(c) {
            chain.push((m.dev(), m.ino()));
        }
        cur = c.parent();
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let q_at = crate::auditlog::fs_path(&qc, &mountinfo);
    for b in rw {
        if let Ok(m) = std::fs::metadata(b)
            && chain.contains(&(m.dev(), m.ino()))
        {
            return Some(b.clone());
        }
        if let (Some((qd, qp)), Some((bd, bp))) = (&q_at, crate::auditlog::fs_path(b, &mountinfo))
            && *qd == bd
            && qp.starts_with(&bp)
        {
            return Some(b.clone());
        }
    }
    None
}

/// The canonical sources of the writable binds of `spec` (those that
/// exist; the plan refuses the others).
pub fn rw_sources(spec: &Spec) -> Vec<PathBuf> {
    spec.binds
        .iter()
        .filter(|b| b.rw)
        .filter_map(|b| std::fs::canonicalize(&b.src).ok())
        .collect()
}

/// Checks `--quarantine DIR` before anything else is done: it exists, is
/// a directory of the caller's that nobody else can write, and lies
/// outside every writable bind (by path, identity or mount alias). One
/// line and the alert `fs_quarantine_refused` otherwise.
pub fn check_flag(spec: &Spec) -> Result<(), Failure> {
    let Some(q) = &spec.quarantine else {
        return Ok(());
    };
    let refuse = |why: String| {
        // Into the audit log only: on stderr, the one line says it all.
        if let Some(a) = audit::get() {
            a.record(
                "fs_quarantine_refused",
                Severity::Alert,
                json!({ "path": q.display().to_string(), "reason": why }),
            );
        }
        Err(Failure::new(format!("--quarantine {}: {why}", q.display())))
    };
    let m = match std::fs::metadata(q) {
        Ok(m) => m,
        Err(e) => {
            return refuse(format!(
                "cannot use it ({e}); it must be an existing directory"
            ));
        }
    };
    if !m.is_dir() {
        return refuse("not a directory".into());
    }
    // SAFETY: geteuid cannot fail.
    if m.uid() != unsafe { libc::geteuid() } || m.mode() & 0o022 != 0 {
        return refuse(format!(
            "must be a directory of the caller's that nobody else can write (owner {}, mode {:o})",
            m.uid(),
            m.mode() & 0o7777
        ));
    }
    if let Some(b) = inside(q, &rw_sources(spec)) {
        return refuse(format!(
            "inside the writable bind {} (by path, identity or a bind mount aliasing it): it must lie outside every writable bind",
            b.display()
        ));
    }
    Ok(())
}

/// Copies the regular file `from` to the new file `to` keeping its holes
/// (SEEK_DATA/SEEK_HOLE; `copy_file_range`, else read/write), copying at
/// most `*budget` data bytes (decreased). Returns whether data was left
/// out. The copy has the original's length (a hole where data was left
/// out) and mode 0600.
pub fn copy_sparse(from: &Path, to: &Path, budget: &mut u64) -> io::Result<bool> {
    use std::os::unix::fs::OpenOptionsExt;
    let src = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(from)?;
    let dst = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)?;
    copy_sparse_fds(&src, &dst, budget)
}

/// Copies the open regular file `src` into the empty file `dst` keeping its
/// holes, at most `*budget` data bytes (decreased); `dst` gets `src`'s
/// length. Returns whether data was left out. The write budget's apply uses
/// it too: a sparse file made inside must not become a full one on the host.
pub fn copy_sparse_fds(
    src: &std::fs::File,
    dst: &std::fs::File,
    budget: &mut u64,
) -> io::Result<bool> {
    let len = src.metadata()?.len();
    let (s, d) = (src.as_raw_fd(), dst.as_raw_fd());
    let mut off: i64 = 0;
    let mut truncated = false;
    while (off as u64) < len {
        // SAFETY: lseek on an fd we own.
        let data = unsafe { libc::lseek(s, off, libc::SEEK_DATA) };
        let (data, end) = if data < 0 {
            match io::Error::last_os_error().raw_os_error() {
                Some(libc::ENXIO) => break,
                // No SEEK_DATA on this file system: all of it is data.
                _ => (off, len as i64),
            }
        } else {
            // SAFETY: as above.
            let hole = unsafe { libc::lseek(s, data, libc::SEEK_HOLE) };
            (data, if hole < 0 { len as i64 } else { hole })
        };
        let want = (end - data) as u64;
        let n = want.min(*budget);
        copy_range(s, d, data, n)?;
        *budget -= n;
        if n < want {
            truncated = true;
            break;
        }
        off = end;
    }
    dst.set_len(len)?;
    Ok(truncated)
}

/// Copies `n` bytes at offset `at` of `s` to the same offset of `d`.
fn copy_range(s: i32, d: i32, at: i64, n: u64) -> io::Result<()> {
    let (mut i, mut o) = (at, at);
    let mut left = n;
    while left > 0 {
        let chunk = left.min(1 << 20) as usize;
        // SAFETY: both fds are ours; the offsets are locals.
        let r = unsafe { libc::copy_file_range(s, &mut i, d, &mut o, chunk, 0) };
        if r > 0 {
            left -= r as u64;
            continue;
        }
        if r == 0 {
            // The file shrank meanwhile: what is left is a hole.
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if !matches!(
            e.raw_os_error(),
            Some(libc::EXDEV | libc::ENOSYS | libc::EINVAL | libc::EOPNOTSUPP)
        ) {
            return Err(e);
        }
        // Fallback: pread/pwrite through a bounded buffer.
        let mut buf = vec![0u8; chunk];
        // SAFETY: buf is valid for chunk bytes.
        let got = unsafe { libc::pread(s, buf.as_mut_ptr().cast(), chunk, i) };
        if got < 0 {
            return Err(io::Error::last_os_error());
        }
        if got == 0 {
            return Ok(());
        }
        let mut done = 0usize;
        while done < got as usize {
            // SAFETY: the slice is within buf.
            let w = unsafe {
                libc::pwrite(
                    d,
                    buf[done..].as_ptr().cast(),
                    got as usize - done,
                    o + done as i64,
                )
            };
            if w < 0 {
                return Err(io::Error::last_os_error());
            }
            done += w as usize;
        }
        i += got as i64;
        o += got as i64;
        left -= got as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sparse_copy_keeps_holes_and_stops_at_the_budget() {
        let d = tempfile::tempdir().unwrap();
        let (a, b, c) = (d.path().join("a"), d.path().join("b"), d.path().join("c"));
        let f = std::fs::File::create(&a).unwrap();
        f.set_len(8 << 30).unwrap();
        use std::os::unix::fs::FileExt;
        f.write_all_at(b"head", 0).unwrap();
        f.write_all_at(b"tail", (8 << 30) - 4).unwrap();
        let mut budget = COPY_CAP;
        assert!(!copy_sparse(&a, &b, &mut budget).unwrap());
        let m = std::fs::metadata(&b).unwrap();
        assert_eq!(m.len(), 8 << 30);
        assert!(m.blocks() * 512 < 1 << 20, "{} blocks", m.blocks());
        let mut buf = [0u8; 4];
        std::fs::File::open(&b)
            .unwrap()
            .read_exact_at(&mut buf, (8 << 30) - 4)
            .unwrap();
        assert_eq!(&buf, b"tail");
        let mut small = 2;
        assert!(copy_sparse(&a, &c, &mut small).unwrap());
        assert_eq!(small, 0);
    }
}
