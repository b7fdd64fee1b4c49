//! Removing a tree a sandbox could shape: at any depth, with a bounded
//! number of open fds, never following a symlink.
//!
//! `std::fs::remove_dir_all` holds one fd per level (a tree deeper than
//! the fd limit fails with EMFILE) and a path-based walk fails past
//! PATH_MAX (ENAMETOOLONG). Either way a directory the sandbox nested a
//! few thousand levels deep (`mkdir d && cd d`, repeated) stayed on the
//! host for good. Here the walk goes down with `openat` and back up with
//! `openat(..)`, holding two fds at a time; each step up is checked
//! against the (device, inode) recorded on the way down, so a directory
//! moved meanwhile stops the removal instead of leading it elsewhere.
//! Directories without owner rwx (an overlay's `work/work`, mode 000, or
//! one the sandbox made so) are opened up first.

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Removes `path` and everything beneath it; a missing `path` is not an
/// error. A symlink at `path` is removed itself, never followed.
pub fn remove_tree(path: &Path) -> io::Result<()> {
    let m = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !m.is_dir() {
        return not_found_ok(std::fs::remove_file(path));
    }
    let c = cstr(path.as_os_str())?;
    let top = open_listable(libc::AT_FDCWD, &c)?;
    empty(top)?;
    not_found_ok(std::fs::remove_dir(path))
}

fn not_found_ok(r: io::Result<()>) -> io::Result<()> {
    match r {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

fn cstr(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn open_dir(at: libc::c_int, name: &CStr) -> io::Result<OwnedFd> {
    open_flags(at, name, libc::O_RDONLY)
}

fn open_flags(at: libc::c_int, name: &CStr, how: libc::c_int) -> io::Result<OwnedFd> {
    let flags = how | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: name is NUL-ended and alive for the call; `at` is AT_FDCWD or an open fd.
    let fd = unsafe { libc::openat(at, name.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openat returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens a directory to list it, giving it owner rwx first when it has no
/// read permission (mode 000): through an O_PATH fd, so no symlink is
/// followed on the way.
fn open_listable(at: libc::c_int, name: &CStr) -> io::Result<OwnedFd> {
    let d = match open_dir(at, name) {
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
            let p = open_flags(at, name, libc::O_PATH)?;
            let st = nix::sys::stat::fstat(&p).map_err(io::Error::from)?;
            let mode = (st.st_mode & 0o7777) | 0o700;
            let proc = format!("/proc/self/fd/{}", p.as_raw_fd());
            std::fs::set_permissions(&proc, std::fs::Permissions::from_mode(mode))?;
            open_dir(p.as_raw_fd(), c".")?
        }
        r => r?,
    };
    open_up(&d);
    Ok(d)
}

fn id(fd: &OwnedFd) -> io::Result<(u64, u64)> {
    let st = nix::sys::stat::fstat(fd).map_err(io::Error::from)?;
    Ok((st.st_dev, st.st_ino))
}

/// Owner rwx on a directory we are about to list and empty.
fn open_up(fd: &OwnedFd) {
    if let Ok(st) = nix::sys::stat::fstat(fd)
        && st.st_mode & 0o700 != 0o700
    {
        // SAFETY: fchmod on an open fd with an integer mode.
        unsafe { libc::fchmod(fd.as_raw_fd(), (st.st_mode & 0o7777) | 0o700) };
    }
}

/// Unlinks every entry of `dir` that is not a directory and returns the
/// first directory found (None: `dir` is empty). Lists from the start each
/// time: entries removed meanwhile are simply gone.
fn next_dir(dir: &OwnedFd) -> io::Result<Option<CString>> {
    let dup = dir.try_clone()?;
    // SAFETY: lseek on an open fd (the dup shares the offset: rewound).
    unsafe { libc::lseek(dup.as_raw_fd(), 0, libc::SEEK_SET) };
    let mut d = nix::dir::Dir::from_fd(dup).map_err(io::Error::from)?;
    for e in d.iter() {
        let e = e.map_err(io::Error::from)?;
        let name = e.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        // SAFETY: name is NUL-ended; dir is an open directory fd.
        if unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) } == 0 {
            continue;
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::ENOENT) => {}
            Some(libc::EISDIR) => return Ok(Some(name.to_owned())),
            _ => return Err(err),
        }
    }
    Ok(None)
}

/// Empties the directory `top`, depth first, two fds open at a time.
fn empty(top: OwnedFd) -> io::Result<()> {
    // The ancestors of `cur` below `top`: their ids, and `cur`'s name in
    // each (to remove it once it is empty).
    let mut up: Vec<((u64, u64), CString)> = Vec::new();
    let mut cur = top;
    loop {
        // Unlink what is not a directory; go down into the first directory.
        let down = next_dir(&cur)?;
        if let Some(name) = down {
            let child = open_listable(cur.as_raw_fd(), &name)?;
            up.push((id(&cur)?, name));
            cur = child;
            continue;
        }
        // `cur` is empty: back up, checking it is still where it was.
        let Some((parent_id, name)) = up.pop() else {
            return Ok(());
        };
        let parent = open_dir(cur.as_raw_fd(), c"..")?;
        if id(&parent)? != parent_id {
            return Err(io::Error::other(
                "a directory was moved while its tree was being removed",
            ));
        }
        drop(cur);
        // SAFETY: name is NUL-ended; parent is an open directory fd.
        if unsafe { libc::unlinkat(parent.as_raw_fd(), name.as_ptr(), libc::AT_REMOVEDIR) } != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ENOENT) {
                return Err(e);
            }
        }
        cur = parent;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_deeper_than_path_max_and_the_fd_limit_is_removed() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("t");
        std::fs::create_dir(&root).unwrap();
        // 5,000 levels of 8-byte names: 45,000 bytes of path, five times
        // PATH_MAX, and more levels than the default fd limit (1024).
        let mut fd = open_dir(libc::AT_FDCWD, &cstr(root.as_os_str()).unwrap()).unwrap();
        for i in 0..5000 {
            let n = CString::new(format!("d{i:07}")).unwrap();
            // SAFETY: n is NUL-ended; fd is an open directory.
            let r = unsafe { libc::mkdirat(fd.as_raw_fd(), n.as_ptr(), 0o755) };
            assert_eq!(r, 0);
            let f = CString::new(format!("f{i}")).unwrap();
            // SAFETY: as above; a new empty file.
            let ff = unsafe {
                libc::openat(
                    fd.as_raw_fd(),
                    f.as_ptr(),
                    libc::O_CREAT | libc::O_WRONLY,
                    0o600,
                )
            };
            assert!(ff >= 0);
            // SAFETY: ff was just opened.
            unsafe { libc::close(ff) };
            fd = open_dir(fd.as_raw_fd(), &n).unwrap();
        }
        drop(fd);
        remove_tree(&root).unwrap();
        assert!(!root.exists());
    }

    #[test]
    fn symlinks_are_removed_not_followed_and_closed_directories_opened() {
        let d = tempfile::tempdir().unwrap();
        let outside = d.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "x").unwrap();
        let root = d.path().join("t");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/b/f"), "x").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("a/link")).unwrap();
        std::fs::set_permissions(root.join("a/b"), std::fs::Permissions::from_mode(0o000)).unwrap();
        std::fs::set_permissions(root.join("a"), std::fs::Permissions::from_mode(0o500)).unwrap();
        remove_tree(&root).unwrap();
        assert!(!root.exists());
        assert!(outside.join("keep").exists());
        // A symlink at the top is removed itself.
        std::os::unix::fs::symlink(&outside, d.path().join("l")).unwrap();
        remove_tree(&d.path().join("l")).unwrap();
        assert!(outside.join("keep").exists());
        remove_tree(&d.path().join("missing")).unwrap();
    }
}
