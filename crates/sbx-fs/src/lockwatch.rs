//! `git config` and `git update-ref`/`checkout` do not write .git/config
//! or .git/HEAD in place: they create `config.lock` (`HEAD.lock`) beside
//! it in .git, which is writable, and rename it over the file. The rename
//! onto the guard node's mount point fails with EBUSY in the VFS, before
//! any file system (and so sbx-fs's server) is asked. To still see the
//! attempt, the outer sbx-fs watches each protected .git directory on the
//! host with inotify for those lock files being created: that is an
//! attempt to replace a protected file, logged as `fs_write_denied` with
//! `op: "replace"`. inotify does not say which process did it
//! (`caller_pid` is null), and a git process on the host writing the same
//! repository while the sandbox runs is reported too.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::guard::Alerts;

/// The lock files that announce a replacement of a protected file.
pub const LOCKS: &[(&str, &str)] = &[("config.lock", "config"), ("HEAD.lock", "HEAD")];

pub struct LockWatch {
    fd: OwnedFd,
    /// watch descriptor -> the .git directory as the sandbox sees it
    dirs: HashMap<i32, PathBuf>,
}

impl LockWatch {
    /// Watches each (host O_PATH fd of a .git directory, sandbox path).
    pub fn new(dirs: &[(OwnedFd, PathBuf)]) -> io::Result<Option<LockWatch>> {
        if dirs.is_empty() {
            return Ok(None);
        }
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut map = HashMap::new();
        for (dir, shown) in dirs {
            let p = std::ffi::CString::new(format!("/proc/self/fd/{}", dir.as_raw_fd()))
                .expect("no NUL");
            let wd = unsafe {
                libc::inotify_add_watch(
                    fd.as_raw_fd(),
                    p.as_ptr(),
                    libc::IN_CREATE | libc::IN_MOVED_TO | libc::IN_ONLYDIR,
                )
            };
            if wd >= 0 {
                map.insert(wd, shown.clone());
            }
        }
        Ok(Some(LockWatch { fd, dirs: map }))
    }

    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Reads what is pending and raises the alerts.
    pub fn drain(&mut self, alerts: &Arc<Mutex<Alerts>>) {
        let mut buf = [0u8; 4096];
        loop {
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return;
            }
            let mut off = 0usize;
            let n = n as usize;
            // struct inotify_event: wd i32, mask u32, cookie u32, len u32, name
            while off + 16 <= n {
                let wd = i32::from_ne_bytes(buf[off..off + 4].try_into().expect("4"));
                let len =
                    u32::from_ne_bytes(buf[off + 12..off + 16].try_into().expect("4")) as usize;
                let name = &buf[off + 16..(off + 16 + len).min(n)];
                let name = &name[..name.iter().position(|b| *b == 0).unwrap_or(name.len())];
                off += 16 + len;
                let Some(dir) = self.dirs.get(&wd) else {
                    continue;
                };
                for (lock, target) in LOCKS {
                    if name == lock.as_bytes()
                        && let Ok(mut a) = alerts.lock()
                    {
                        a.replace_attempt(&dir.join(target), lock);
                    }
                }
            }
        }
    }
}
