//! The narrow syscall seam: the new mount API, openat2, pidfds and the few
//! other calls libc has no safe wrapper for. Everything else in the crate
//! goes through these functions, each of which returns `io::Error` and is
//! wrapped by its caller into a typed error naming the operation and path.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

pub const OPEN_TREE_CLONE: u32 = 1;
pub const AT_RECURSIVE: u32 = 0x8000;
pub const MOVE_MOUNT_F_EMPTY_PATH: u32 = 0x4;
pub const MOVE_MOUNT_T_EMPTY_PATH: u32 = 0x40;
pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x8;
pub const RESOLVE_NO_MAGICLINKS: u64 = 0x2;
pub const RESOLVE_NO_SYMLINKS: u64 = 0x4;
pub const RESOLVE_BENEATH: u64 = 0x8;
const FSCONFIG_SET_FLAG: u32 = 0;
const FSCONFIG_SET_STRING: u32 = 1;
const FSCONFIG_CMD_CREATE: u32 = 6;
const FSOPEN_CLOEXEC: u32 = 1;
const FSMOUNT_CLOEXEC: u32 = 1;

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn fd_result(r: libc::c_long) -> io::Result<OwnedFd> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        // SAFETY: r is a new fd the syscall just returned (r >= 0), owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
    }
}

fn unit_result(r: libc::c_long) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// `openat2(dir, path, {flags, mode, resolve})`, retried on EAGAIN/EINTR
/// (a concurrent rename makes RESOLVE_* lookups fail with EAGAIN).
pub fn openat2(
    dir: RawFd,
    path: &Path,
    flags: i32,
    mode: u32,
    resolve: u64,
) -> io::Result<OwnedFd> {
    let c = cstr(path)?;
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: u64::from(mode),
        resolve,
    };
    let mut tries = 0;
    loop {
        // SAFETY: c is a NUL-ended path and how an open_how, both alive for the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir,
                c.as_ptr(),
                std::ptr::from_ref::<OpenHow>(&how),
                std::mem::size_of::<OpenHow>(),
            )
        };
        match fd_result(r) {
            Err(e)
                if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EINTR)) && tries < 64 =>
            {
                tries += 1
            }
            other => return other,
        }
    }
}

/// One component (or a relative path) beneath `dir`, never following a
/// symlink and never leaving `dir`.
pub fn open_beneath(dir: RawFd, rel: &Path, flags: i32) -> io::Result<OwnedFd> {
    openat2(
        dir,
        rel,
        flags,
        0,
        RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    )
}

pub fn open_tree(dir: RawFd, path: &Path, flags: u32) -> io::Result<OwnedFd> {
    let c = cstr(path)?;
    // SAFETY: c is a NUL-ended path alive for the call; integer flags otherwise.
    let r = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            dir,
            c.as_ptr(),
            flags | libc::O_CLOEXEC as u32,
        )
    };
    fd_result(r)
}

/// Clones the mount tree at `fd` (recursively) into a detached mount.
pub fn clone_tree(fd: RawFd, recursive: bool) -> io::Result<OwnedFd> {
    let mut flags = OPEN_TREE_CLONE | libc::AT_EMPTY_PATH as u32;
    if recursive {
        flags |= AT_RECURSIVE;
    }
    open_tree(fd, Path::new(""), flags)
}

/// Attaches the detached mount `from` on the object `to` (both fds).
pub fn move_mount_fd(from: RawFd, to: RawFd) -> io::Result<()> {
    // SAFETY: the empty path is a static NUL-ended literal; fds and flags are integers.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            from,
            c"".as_ptr(),
            to,
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    unit_result(r)
}

/// Attaches the detached mount `from` at an absolute path.
pub fn move_mount_path(from: RawFd, to: &Path) -> io::Result<()> {
    let c = cstr(to)?;
    // SAFETY: c and the empty path are NUL-ended and alive for the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            from,
            c"".as_ptr(),
            libc::AT_FDCWD,
            c.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    unit_result(r)
}

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Sets mount attributes on the mount at `fd` (and below when recursive).
pub fn mount_setattr(fd: RawFd, set: u64, recursive: bool) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let mut flags = libc::AT_EMPTY_PATH as u32;
    if recursive {
        flags |= AT_RECURSIVE;
    }
    // SAFETY: the path is NUL-ended and attr a mount_attr of the size passed, alive for the
    // call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd,
            c"".as_ptr(),
            flags,
            std::ptr::from_ref::<MountAttr>(&attr),
            std::mem::size_of::<MountAttr>(),
        )
    };
    unit_result(r)
}

/// A new file system context of type `fstype` (`fsopen`).
fn fs_context(fstype: &str) -> io::Result<OwnedFd> {
    let t = CString::new(fstype).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: t is a NUL-ended name alive for the call; the new fd goes to fd_result's OwnedFd.
    fd_result(unsafe { libc::syscall(libc::SYS_fsopen, t.as_ptr(), FSOPEN_CLOEXEC) })
}

/// Sets option `k` of the context `fs` to `v`; an empty value is a flag
/// option (FSCONFIG_SET_FLAG).
fn fs_option(fs: &OwnedFd, k: &str, v: &str) -> io::Result<()> {
    let k = CString::new(k).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let v = CString::new(v).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let (cmd, value) = if v.is_empty() {
        (FSCONFIG_SET_FLAG, std::ptr::null())
    } else {
        (FSCONFIG_SET_STRING, v.as_ptr())
    };
    // SAFETY: fs is an open fs context; k and the value are NUL-ended and alive for the
    // call.
    unit_result(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            cmd,
            k.as_ptr(),
            value,
            0,
        )
    })
}

/// A new, detached filesystem instance: `fsopen` + options + `fsmount`.
pub fn new_fs(fstype: &str, options: &[(&str, &str)], attrs: u64) -> io::Result<OwnedFd> {
    let fs = fs_context(fstype)?;
    for (k, v) in options {
        fs_option(&fs, k, v)?;
    }
    // SAFETY: fs is an open fs context; the command takes no pointer.
    unit_result(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    })?;
    // SAFETY: fs is an open fs context; integer arguments only.
    fd_result(unsafe { libc::syscall(libc::SYS_fsmount, fs.as_raw_fd(), FSMOUNT_CLOEXEC, attrs) })
}

/// Whether file system `fstype` takes the flag option `flag` (set on a
/// fresh context): tells an option this kernel lacks from an EINVAL of
/// the mount itself.
pub fn fs_takes_flag(fstype: &str, flag: &str) -> bool {
    fs_context(fstype)
        .and_then(|fs| fs_option(&fs, flag, ""))
        .is_ok()
}

pub fn mkdirat(dir: RawFd, name: &Path, mode: u32) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: c is a NUL-ended name alive for the call.
    unit_result(libc::c_long::from(unsafe {
        libc::mkdirat(dir, c.as_ptr(), mode)
    }))
}

/// Creates an empty regular file `name` in `dir` (O_EXCL, no symlink).
pub fn mkfileat(dir: RawFd, name: &Path, mode: u32) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: c is a NUL-ended name alive for the call; the new fd goes to fd_result, which
    // closes it.
    let fd = unsafe {
        libc::openat(
            dir,
            c.as_ptr(),
            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            mode,
        )
    };
    fd_result(libc::c_long::from(fd)).map(drop)
}

pub fn symlinkat(target: &Path, dir: RawFd, name: &Path) -> io::Result<()> {
    let t = cstr(target)?;
    let n = cstr(name)?;
    // SAFETY: t and n are NUL-ended and alive for the call.
    unit_result(libc::c_long::from(unsafe {
        libc::symlinkat(t.as_ptr(), dir, n.as_ptr())
    }))
}

pub fn fchmodat(dir: RawFd, name: &Path, mode: u32) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: c is a NUL-ended name alive for the call.
    unit_result(libc::c_long::from(unsafe {
        libc::fchmodat(dir, c.as_ptr(), mode, 0)
    }))
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`; an empty name stats `dir`.
pub fn lstatat(dir: RawFd, name: &Path) -> io::Result<libc::stat> {
    let c = cstr(name)?;
    // SAFETY: libc::stat is plain integers: all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let mut flags = libc::AT_SYMLINK_NOFOLLOW;
    if name.as_os_str().is_empty() {
        flags |= libc::AT_EMPTY_PATH;
    }
    // SAFETY: c is a NUL-ended name and st a live stat for the kernel to fill.
    unit_result(libc::c_long::from(unsafe {
        libc::fstatat(dir, c.as_ptr(), &mut st, flags)
    }))?;
    Ok(st)
}

pub fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    lstatat(fd, Path::new(""))
}

pub fn unlinkat(dir: RawFd, name: &Path, dir_flag: bool) -> io::Result<()> {
    let c = cstr(name)?;
    let flags = if dir_flag { libc::AT_REMOVEDIR } else { 0 };
    // SAFETY: c is a NUL-ended name alive for the call.
    unit_result(libc::c_long::from(unsafe {
        libc::unlinkat(dir, c.as_ptr(), flags)
    }))
}

pub fn pivot_root(new: &Path, old: &Path) -> io::Result<()> {
    let n = cstr(new)?;
    let o = cstr(old)?;
    // SAFETY: n and o are NUL-ended and alive for the call.
    unit_result(unsafe { libc::syscall(libc::SYS_pivot_root, n.as_ptr(), o.as_ptr()) })
}

pub fn umount_detach(p: &Path) -> io::Result<()> {
    let c = cstr(p)?;
    // SAFETY: c is a NUL-ended path alive for the call.
    unit_result(libc::c_long::from(unsafe {
        libc::umount2(c.as_ptr(), libc::MNT_DETACH)
    }))
}

/// `mount(NULL, path, NULL, flags, NULL)`: propagation changes.
pub fn mount_propagation(p: &Path, flags: libc::c_ulong) -> io::Result<()> {
    let c = cstr(p)?;
    // SAFETY: c is a NUL-ended path alive for the call; the other pointers are null, as the
    // call allows.
    unit_result(libc::c_long::from(unsafe {
        libc::mount(
            std::ptr::null(),
            c.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    }))
}

// pidfds are sbx-core's (one implementation for every supervisor); the
// seam keeps its names.
pub use sbx_core::pidfd::{
    exited as pidfd_exited, open as pidfd_open, send_signal as pidfd_send_signal,
};

/// The path the kernel reports for an fd (for messages and rule matching).
pub fn fd_path(fd: RawFd) -> io::Result<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{fd}"))
}

pub fn is_dir(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

pub fn is_reg(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFREG
}

pub fn is_symlink(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFLNK
}

/// Whether this process is in the initial user namespace (its uid_map is
/// the identity over the whole range).
pub fn in_initial_userns() -> bool {
    std::fs::read_to_string("/proc/self/uid_map")
        .is_ok_and(|m| m.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"])
}
