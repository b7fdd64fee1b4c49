//! Opening /dev/fuse and mounting the guard file system, in the sandbox's
//! init (inside its user namespace, before the pivot).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::sys;

#[derive(Debug, thiserror::Error)]
pub enum FuseMountError {
    #[error("open /dev/fuse (run `sbx-doctor --check fuse`): {0}")]
    Open(#[source] io::Error),
    #[error("mount the guard file system: {0}")]
    Mount(#[source] io::Error),
}

pub fn open_dev() -> Result<OwnedFd, FuseMountError> {
    // SAFETY: the path is a NUL-ended literal; the fd is owned just below.
    let fd = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(FuseMountError::Open(io::Error::last_os_error()));
    }
    // SAFETY: fd was just returned by open (>= 0) and is owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A detached mount of a new FUSE connection served on `dev`. Without
/// `default_permissions` (every access is asked of the server), with
/// `allow_other` (any identity inside may be the caller; in a user
/// namespace the kernel limits it to that namespace's processes).
pub fn mount(dev: &OwnedFd, uid: u32, gid: u32) -> Result<OwnedFd, FuseMountError> {
    let (fd, uid, gid) = (
        dev.as_raw_fd().to_string(),
        uid.to_string(),
        gid.to_string(),
    );
    sys::new_fs(
        "fuse",
        &[
            ("source", "sbx-fs-guard"),
            ("fd", &fd),
            ("rootmode", "40555"),
            ("user_id", &uid),
            ("group_id", &gid),
            ("allow_other", ""),
        ],
        sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
    )
    .map_err(FuseMountError::Mount)
}
