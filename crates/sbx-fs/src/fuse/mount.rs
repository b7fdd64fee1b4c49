//! Opening /dev/fuse and mounting the guard file system, in the sandbox's
//! init (inside its user namespace, before the pivot).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::sys;

#[derive(Debug, thiserror::Error)]
pub enum FuseMountError {
    #[error("open /dev/fuse: {0}")]
    Open(#[source] io::Error),
    #[error("mount the guard file system: {0}")]
    Mount(#[source] io::Error),
}

const FSOPEN_CLOEXEC: u32 = 1;
const FSMOUNT_CLOEXEC: u32 = 1;
const FSCONFIG_SET_FLAG: u32 = 0;
const FSCONFIG_SET_STRING: u32 = 1;
const FSCONFIG_CMD_CREATE: u32 = 6;

fn ret(r: libc::c_long) -> io::Result<libc::c_long> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

pub fn open_dev() -> Result<OwnedFd, FuseMountError> {
    let fd = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(FuseMountError::Open(io::Error::last_os_error()));
    }
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A detached mount of a new FUSE connection served on `dev`. Without
/// `default_permissions` (every access is asked of the server), with
/// `allow_other` (any identity inside may be the caller; in a user
/// namespace the kernel limits it to that namespace's processes).
pub fn mount(dev: &OwnedFd, uid: u32, gid: u32) -> Result<OwnedFd, FuseMountError> {
    let m = FuseMountError::Mount;
    let fs = ret(unsafe { libc::syscall(libc::SYS_fsopen, c"fuse".as_ptr(), FSOPEN_CLOEXEC) })
        .map_err(m)?;
    let fs = unsafe { OwnedFd::from_raw_fd(fs as i32) };
    let set = |k: &str, v: Option<String>| -> io::Result<()> {
        let k = CString::new(k).expect("no NUL");
        let v = v.map(|v| CString::new(v).expect("no NUL"));
        ret(unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                fs.as_raw_fd(),
                if v.is_some() {
                    FSCONFIG_SET_STRING
                } else {
                    FSCONFIG_SET_FLAG
                },
                k.as_ptr(),
                v.as_ref().map_or(std::ptr::null(), |v| v.as_ptr()),
                0,
            )
        })
        .map(|_| ())
    };
    set("source", Some("sbx-fs-guard".into())).map_err(m)?;
    set("fd", Some(dev.as_raw_fd().to_string())).map_err(m)?;
    set("rootmode", Some("40555".into())).map_err(m)?;
    set("user_id", Some(uid.to_string())).map_err(m)?;
    set("group_id", Some(gid.to_string())).map_err(m)?;
    set("allow_other", None).map_err(m)?;
    ret(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    })
    .map_err(m)?;
    let mnt = ret(unsafe {
        libc::syscall(
            libc::SYS_fsmount,
            fs.as_raw_fd(),
            FSMOUNT_CLOEXEC,
            sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
        )
    })
    .map_err(m)?;
    Ok(unsafe { OwnedFd::from_raw_fd(mnt as i32) })
}
