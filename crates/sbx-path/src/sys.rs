//! Opening a path beneath a directory fd without following any symlink:
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, or, where the kernel
//! lacks `openat2` (before Linux 5.6, or a seccomp filter that answers
//! ENOSYS), a component-by-component `openat(O_PATH | O_NOFOLLOW)` walk.
//!
//! Both keep every intermediate step as an fd, so a component swapped for a
//! symlink between two calls is refused, never followed.

use std::ffi::CString;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// How paths are resolved beneath a rule's root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// `openat2` when the kernel has it, else the walk (probed once, when the
    /// resolver is built).
    Auto,
    /// Always `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`.
    Openat2,
    /// Always the `openat(O_PATH | O_NOFOLLOW)` walk, one component at a time.
    Walk,
}

impl Resolution {
    pub fn as_str(self) -> &'static str {
        match self {
            Resolution::Auto => "auto",
            Resolution::Openat2 => "openat2",
            Resolution::Walk => "walk",
        }
    }

    /// Auto decided: `Openat2` or `Walk`.
    pub fn decide(self) -> Resolution {
        match self {
            Resolution::Auto => {
                if openat2_supported() {
                    Resolution::Openat2
                } else {
                    Resolution::Walk
                }
            }
            r => r,
        }
    }
}

impl std::str::FromStr for Resolution {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Resolution::Auto),
            "openat2" => Ok(Resolution::Openat2),
            "walk" => Ok(Resolution::Walk),
            _ => Err(format!("'{s}' is not one of auto, openat2, walk")),
        }
    }
}

/// A failed open beneath a root: the errno, and when known the index of the
/// component at which it failed (for the error message) and whether that
/// component is a symlink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFail {
    pub errno: i32,
    pub at: Option<usize>,
    pub symlink: bool,
}

impl OpenFail {
    fn errno(errno: i32) -> Self {
        Self {
            errno,
            at: None,
            symlink: false,
        }
    }
    pub fn io(&self) -> io::Error {
        io::Error::from_raw_os_error(self.errno)
    }
}

fn cstr(c: &[u8]) -> Result<CString, OpenFail> {
    CString::new(c).map_err(|_| OpenFail::errno(libc::EINVAL))
}

const RESOLVE: u64 = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS;

/// Raw `openat2`. EINTR and EAGAIN (a concurrent rename seen by the kernel)
/// are retried a bounded number of times.
pub fn openat2(
    dir: RawFd,
    path: &[u8],
    flags: i32,
    mode: u32,
    resolve: u64,
) -> Result<OwnedFd, i32> {
    let c = CString::new(path).map_err(|_| libc::EINVAL)?;
    // SAFETY: open_how is plain data; zero is a valid value for every field.
    let mut how: libc::open_how = unsafe { MaybeUninit::zeroed().assume_init() };
    how.flags = u64::from((flags | libc::O_CLOEXEC) as u32);
    how.mode = if flags & (libc::O_CREAT | libc::O_TMPFILE) != 0 {
        u64::from(mode)
    } else {
        0
    };
    how.resolve = resolve;
    for _ in 0..64 {
        // SAFETY: valid pointers, and the size of the struct we pass.
        let r = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir,
                c.as_ptr(),
                std::ptr::from_ref::<libc::open_how>(&how),
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if r >= 0 {
            // SAFETY: a new fd the kernel just gave us.
            return Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) });
        }
        let e = errno();
        if e != libc::EINTR && e != libc::EAGAIN {
            return Err(e);
        }
    }
    Err(libc::EAGAIN)
}

/// Whether this kernel (and any seccomp filter over us) lets `openat2` with
/// the resolve flags we need through.
pub fn openat2_supported() -> bool {
    // Any failure counts as missing: ENOSYS (no such call), E2BIG/EINVAL
    // (unknown struct or flags), EPERM (a filter that refuses it).
    let Ok(root) = openat(libc::AT_FDCWD, b"/", libc::O_PATH | libc::O_DIRECTORY, 0) else {
        return false;
    };
    openat2(root.as_raw_fd(), b".", libc::O_PATH, 0, RESOLVE).is_ok()
}

fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Raw `openat`, retried on EINTR.
pub fn openat(dir: RawFd, name: &[u8], flags: i32, mode: u32) -> Result<OwnedFd, i32> {
    let c = CString::new(name).map_err(|_| libc::EINVAL)?;
    loop {
        // SAFETY: a valid C string.
        let r = unsafe { libc::openat(dir, c.as_ptr(), flags | libc::O_CLOEXEC, mode) };
        if r >= 0 {
            // SAFETY: a new fd the kernel just gave us.
            return Ok(unsafe { OwnedFd::from_raw_fd(r) });
        }
        let e = errno();
        if e != libc::EINTR {
            return Err(e);
        }
    }
}

/// `fstat` of an fd.
pub fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    let mut st = MaybeUninit::<libc::stat>::uninit();
    // SAFETY: st is written by the kernel on success.
    if unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstat returned 0: it filled st.
    Ok(unsafe { st.assume_init() })
}

/// `fstatat(AT_SYMLINK_NOFOLLOW)` of a name in a directory fd.
pub fn lstatat(dir: RawFd, name: &[u8]) -> Result<libc::stat, i32> {
    let c = CString::new(name).map_err(|_| libc::EINVAL)?;
    let mut st = MaybeUninit::<libc::stat>::uninit();
    // SAFETY: st is written by the kernel on success.
    if unsafe { libc::fstatat(dir, c.as_ptr(), st.as_mut_ptr(), libc::AT_SYMLINK_NOFOLLOW) } != 0 {
        return Err(errno());
    }
    // SAFETY: fstatat returned 0: it filled st.
    Ok(unsafe { st.assume_init() })
}

fn is_type(st: &libc::stat, t: libc::mode_t) -> bool {
    st.st_mode & libc::S_IFMT == t
}

/// Opens the relative path made of `comps` beneath `root` with `flags`
/// (`mode` for O_CREAT), refusing symlinks in every component and never
/// leaving `root`. An empty `comps` opens `root` itself (as `.`).
pub fn open_beneath(
    how: Resolution,
    root: BorrowedFd<'_>,
    comps: &[&[u8]],
    flags: i32,
    mode: u32,
) -> Result<OwnedFd, OpenFail> {
    match how {
        Resolution::Walk => walk(root, comps, flags, mode),
        Resolution::Openat2 | Resolution::Auto => {
            let rel = join(comps);
            match openat2(root.as_raw_fd(), &rel, flags, mode, RESOLVE) {
                Ok(fd) => Ok(fd),
                Err(e) => Err(diagnose(root, comps, e)),
            }
        }
    }
}

fn join(comps: &[&[u8]]) -> Vec<u8> {
    if comps.is_empty() {
        return b".".to_vec();
    }
    let mut v = Vec::new();
    for (i, c) in comps.iter().enumerate() {
        if i > 0 {
            v.push(b'/');
        }
        v.extend_from_slice(c);
    }
    v
}

/// After `openat2` refused: find which component was the problem, for the
/// message only (the refusal itself already happened and stands, whatever
/// this finds: a tree changing under us cannot turn it into a success).
fn diagnose(root: BorrowedFd<'_>, comps: &[&[u8]], errno: i32) -> OpenFail {
    if !matches!(
        errno,
        libc::ELOOP | libc::ENOENT | libc::ENOTDIR | libc::EXDEV | libc::EEXIST
    ) {
        return OpenFail::errno(errno);
    }
    // Walk with O_PATH (no side effects on any file) to locate it.
    match walk(root, comps, libc::O_PATH, 0) {
        Err(f) if f.symlink || f.errno == errno => OpenFail {
            errno: if f.symlink { libc::ELOOP } else { errno },
            ..f
        },
        Err(f) => OpenFail {
            errno,
            at: f.at,
            symlink: false,
        },
        Ok(_) => OpenFail::errno(errno),
    }
}

/// The fallback: one `openat(O_PATH | O_NOFOLLOW)` per directory component,
/// each checked by `fstat` on the fd (not the name) to be a directory and
/// not a symlink; the last component opened with `O_NOFOLLOW` (and, for
/// `O_PATH`, checked not to be a symlink).
pub fn walk(
    root: BorrowedFd<'_>,
    comps: &[&[u8]],
    flags: i32,
    mode: u32,
) -> Result<OwnedFd, OpenFail> {
    let Some((last, dirs)) = comps.split_last() else {
        return openat(root.as_raw_fd(), b".", flags, mode).map_err(OpenFail::errno);
    };
    let mut cur: Option<OwnedFd> = None;
    for (i, c) in dirs.iter().enumerate() {
        let dir = cur.as_ref().map_or(root.as_raw_fd(), |f| f.as_raw_fd());
        cstr(c)?;
        let fd = openat(dir, c, libc::O_PATH | libc::O_NOFOLLOW, 0).map_err(|e| OpenFail {
            errno: e,
            at: Some(i),
            symlink: false,
        })?;
        let st = fstat(fd_ref(&fd)).map_err(|e| OpenFail {
            errno: e.raw_os_error().unwrap_or(libc::EIO),
            at: Some(i),
            symlink: false,
        })?;
        if is_type(&st, libc::S_IFLNK) {
            return Err(OpenFail {
                errno: libc::ELOOP,
                at: Some(i),
                symlink: true,
            });
        }
        if !is_type(&st, libc::S_IFDIR) {
            return Err(OpenFail {
                errno: libc::ENOTDIR,
                at: Some(i),
                symlink: false,
            });
        }
        cur = Some(fd);
    }
    let n = comps.len() - 1;
    let dir = cur.as_ref().map_or(root.as_raw_fd(), |f| f.as_raw_fd());
    match openat(dir, last, flags | libc::O_NOFOLLOW, mode) {
        Ok(fd) => {
            if flags & libc::O_PATH != 0 {
                let st = fstat(fd_ref(&fd)).map_err(|e| OpenFail {
                    errno: e.raw_os_error().unwrap_or(libc::EIO),
                    at: Some(n),
                    symlink: false,
                })?;
                if is_type(&st, libc::S_IFLNK) {
                    return Err(OpenFail {
                        errno: libc::ELOOP,
                        at: Some(n),
                        symlink: true,
                    });
                }
            }
            Ok(fd)
        }
        Err(e) => {
            // ELOOP from O_NOFOLLOW, ENOTDIR from O_DIRECTORY on a symlink,
            // EEXIST from O_CREAT|O_EXCL on a dangling symlink: say so when
            // the name is in fact a symlink.
            let symlink = matches!(e, libc::ELOOP | libc::ENOTDIR | libc::EEXIST)
                && lstatat(dir, last).is_ok_and(|st| is_type(&st, libc::S_IFLNK));
            Err(OpenFail {
                errno: if symlink { libc::ELOOP } else { e },
                at: Some(n),
                symlink,
            })
        }
    }
}

fn fd_ref(fd: &OwnedFd) -> BorrowedFd<'_> {
    use std::os::fd::AsFd;
    fd.as_fd()
}

/// Clears O_NONBLOCK (set to open a FIFO without blocking).
pub fn clear_nonblock(fd: &OwnedFd) {
    // SAFETY: fcntl on an fd we own.
    unsafe {
        let fl = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
    }
}

/// `mkdirat`.
pub fn mkdirat(dir: RawFd, name: &[u8], mode: u32) -> Result<(), i32> {
    let c = CString::new(name).map_err(|_| libc::EINVAL)?;
    // SAFETY: a valid C string.
    if unsafe { libc::mkdirat(dir, c.as_ptr(), mode as libc::mode_t) } != 0 {
        return Err(errno());
    }
    Ok(())
}

pub fn is_dir(st: &libc::stat) -> bool {
    is_type(st, libc::S_IFDIR)
}
