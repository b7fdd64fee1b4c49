//! A directory's entries read straight from its open fd.
//!
//! `getdents64` on the fd itself: no duplicate fd, `fdopendir`,
//! `/proc/self/fd` path or rewind, which the walks of sbx-fs and
//! sbx-gitguard would otherwise pay for every directory of a work tree.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

/// The kind of an entry, as `readdir` gives it (an `lstat` where the file
/// system does not say).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Other,
}

impl Kind {
    pub fn is_file(self) -> bool {
        self == Kind::File
    }
    pub fn is_dir(self) -> bool {
        self == Kind::Dir
    }
    pub fn is_symlink(self) -> bool {
        self == Kind::Symlink
    }
    pub fn byte(self) -> u8 {
        self as u8
    }
    pub fn from_byte(b: u8) -> Option<Kind> {
        [Kind::File, Kind::Dir, Kind::Symlink, Kind::Other]
            .into_iter()
            .find(|k| k.byte() == b)
    }
}

/// The entries of a directory fd that was never read (getdents64 goes on
/// from the fd's offset), without `.` and `..`.
pub fn read(fd: &OwnedFd) -> io::Result<Vec<(OsString, Kind)>> {
    // One buffer for every listing of the thread (not 32 KiB allocated
    // and zeroed per directory).
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0u8; 32 << 10]);
    }
    BUF.with_borrow_mut(|buf| read_into(fd, buf))
}

fn read_into(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<Vec<(OsString, Kind)>> {
    use nix::fcntl::AtFlags;
    use nix::sys::stat::{SFlag, fstatat};
    use std::os::fd::AsRawFd;
    let mut out = Vec::new();
    loop {
        // SAFETY: getdents64 writes at most `buf.len()` bytes into `buf`,
        // which is live and writable for the call; `fd` is open.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                fd.as_raw_fd(),
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            break;
        }
        // Records: inode (8), offset (8), length (2), type (1), name up to
        // a NUL; each within what the kernel returned.
        let got = &buf[..n as usize];
        let mut at = 0;
        while at + 19 <= got.len() {
            let len = usize::from(u16::from_ne_bytes([got[at + 16], got[at + 17]]));
            if len < 19 || at + len > got.len() {
                return Err(io::Error::other("getdents64: malformed record"));
            }
            let rec = &got[at..at + len];
            at += len;
            let raw = &rec[19..];
            let name = &raw[..raw.iter().position(|&b| b == 0).unwrap_or(raw.len())];
            if name == b"." || name == b".." || name.is_empty() {
                continue;
            }
            let name = std::ffi::OsStr::from_bytes(name);
            let kind = match rec[18] {
                libc::DT_REG => Kind::File,
                libc::DT_DIR => Kind::Dir,
                libc::DT_LNK => Kind::Symlink,
                libc::DT_UNKNOWN => {
                    match fstatat(fd.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
                        Ok(st) => match SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT {
                            SFlag::S_IFREG => Kind::File,
                            SFlag::S_IFDIR => Kind::Dir,
                            SFlag::S_IFLNK => Kind::Symlink,
                            _ => Kind::Other,
                        },
                        // Gone since readdir: as `read_dir` callers skip it.
                        Err(_) => continue,
                    }
                }
                _ => Kind::Other,
            };
            out.push((name.to_os_string(), kind));
        }
    }
    Ok(out)
}
