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
//!
//! The inotify fd lives in a small forked helper that forwards the raw
//! events over a pipe: releasing an inotify instance waits for an SRCU
//! grace period, which would otherwise delay sbx-fs's own exit on every
//! run. The helper closes the event pipe before it exits, so sbx-fs does
//! not wait for that while it finishes; it reaps the helper last
//! ([`LockWatch::reap`]). Not reaped, the helper would be a zombie of
//! init's, which an enclosing sbx-cgroup waits for (init reaps when it
//! gets to it).
//!
//! At the end the helper removes its watches before it closes the
//! instance. Closing an instance that still has them frees each inode's
//! mark list and then the marks, two grace periods asked for back to
//! back, and the second was then a normal one of a few scheduler ticks:
//! 14-17 ms median at the end of sbx-fs in a chain in a repository, most
//! runs (issue 19). Removed first, and the instance closed a millisecond
//! later (a kernel worker must run meanwhile: closed at once, most runs
//! were as slow as before), the mark list's grace period has passed by
//! the close, and the close's is usually an expedited one: 4-6 ms median
//! for the whole end of sbx-fs (docs/bench-policy.md section 11).

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::guard::Alerts;

pub use sbx_spec::invariants::GIT_CONFIG_HINT;

/// The lock files that announce a replacement of a protected file.
pub const LOCKS: &[(&str, &str)] = &[("config.lock", "config"), ("HEAD.lock", "HEAD")];

const EVENT_HEADER: usize = 16;

pub struct LockWatch {
    /// The helper.
    pid: libc::pid_t,
    /// Read end of the helper's event pipe (non-blocking).
    events: Option<OwnedFd>,
    /// Dropped to tell the helper to drain and stop.
    alive: Option<OwnedFd>,
    /// watch descriptor -> the .git directory as the sandbox sees it
    dirs: HashMap<i32, PathBuf>,
    /// Bytes of an event split across reads.
    carry: Vec<u8>,
    /// The protected files (sandbox paths): a lock file beside a file that
    /// is not protected (HEAD under `--git-stage`) is git at work.
    guarded: std::collections::HashSet<PathBuf>,
    /// The inotify queue overflowed once (logged once).
    overflowed: bool,
}

impl LockWatch {
    /// Watches each (host O_PATH fd of a .git directory, sandbox path) for
    /// the lock files of the `guarded` files in it. Forks: call while
    /// single-threaded.
    pub fn start(
        dirs: &[(OwnedFd, PathBuf)],
        guarded: std::collections::HashSet<PathBuf>,
    ) -> io::Result<Option<LockWatch>> {
        if dirs.is_empty() {
            return Ok(None);
        }
        // SAFETY: inotify_init1 with integer flags; the fd is owned just below.
        let ino = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if ino < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: ino was just returned by inotify_init1 (>= 0) and is owned by no one else.
        let ino = unsafe { OwnedFd::from_raw_fd(ino) };
        let mut map = HashMap::new();
        for (dir, shown) in dirs {
            let p = std::ffi::CString::new(format!("/proc/self/fd/{}", dir.as_raw_fd()))
                .expect("no NUL");
            // SAFETY: ino is open and p a NUL-ended path alive for the call.
            let wd = unsafe {
                libc::inotify_add_watch(
                    ino.as_raw_fd(),
                    p.as_ptr(),
                    libc::IN_CREATE | libc::IN_MOVED_TO | libc::IN_ONLYDIR,
                )
            };
            if wd >= 0 {
                map.insert(wd, shown.clone());
            } else {
                // No watch (fs.inotify.max_user_watches): the rename is
                // still refused, only its alert is lost; say so.
                sbx_core::audit::emit(
                    "lockwatch_unavailable",
                    sbx_core::Severity::Warn,
                    serde_json::json!({ "path": shown.display().to_string(), "reason": io::Error::last_os_error().to_string() }),
                );
            }
        }
        if map.is_empty() {
            return Ok(None);
        }
        let (ev_r, ev_w) = sbx_core::fds::pipe()?;
        let (alive_r, alive_w) = sbx_core::fds::pipe()?;
        // SAFETY: the helper only makes raw syscalls on stack buffers (fork-safe whatever
        // threads exist) and never returns.
        match unsafe { libc::fork() } {
            -1 => Err(io::Error::last_os_error()),
            0 => helper(
                ino.as_raw_fd(),
                alive_r.as_raw_fd(),
                ev_w.as_raw_fd(),
                map.keys().copied().max().unwrap_or(0),
            ),
            pid => {
                drop(ev_w);
                drop(alive_r);
                // Our copy of the inotify fd is not the last: closing it is
                // cheap (the helper's is released when it exits).
                drop(ino);
                // SAFETY: ev_r is our open read end; only its flags change.
                unsafe { libc::fcntl(ev_r.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
                Ok(Some(LockWatch {
                    pid,
                    events: Some(ev_r),
                    alive: Some(alive_w),
                    dirs: map,
                    carry: Vec::new(),
                    guarded,
                    overflowed: false,
                }))
            }
        }
    }

    pub fn raw_fd(&self) -> RawFd {
        self.events.as_ref().map_or(-1, |f| f.as_raw_fd())
    }

    /// Reads what is pending and raises the alerts.
    pub fn drain(&mut self, alerts: &Arc<Mutex<Alerts>>) {
        let Some(ev) = &self.events else { return };
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: ev is our open read end; buf is a live buffer of buf.len() bytes.
            let n = unsafe { libc::read(ev.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n == 0 {
                self.events = None;
                break;
            }
            if n < 0 {
                break;
            }
            self.carry.extend_from_slice(&buf[..n as usize]);
        }
        self.parse(alerts);
    }

    /// The end: tells the helper to stop, and reads everything it had
    /// (it closes the pipe once it drained inotify).
    pub fn finish(&mut self, alerts: &Arc<Mutex<Alerts>>) {
        drop(self.alive.take());
        if let Some(ev) = &self.events {
            // SAFETY: ev is our open read end; only its flags change.
            unsafe { libc::fcntl(ev.as_raw_fd(), libc::F_SETFL, 0) };
        }
        while self.events.is_some() {
            self.drain(alerts);
        }
    }

    /// Waits for the helper to be gone (after [`Self::finish`]; it exits
    /// once it has drained inotify, and its exit waits for the grace
    /// period of the inotify instance).
    pub fn reap(mut self) {
        drop(self.alive.take());
        // SAFETY: pid is our own child (forked by start), reaped only here.
        unsafe { libc::waitpid(self.pid, std::ptr::null_mut(), 0) };
    }

    fn parse(&mut self, alerts: &Arc<Mutex<Alerts>>) {
        let b = &self.carry;
        let mut off = 0usize;
        // struct inotify_event: wd i32, mask u32, cookie u32, len u32, name
        while off + EVENT_HEADER <= b.len() {
            let wd = i32::from_ne_bytes(b[off..off + 4].try_into().expect("4"));
            let mask = u32::from_ne_bytes(b[off + 4..off + 8].try_into().expect("4"));
            if mask & libc::IN_Q_OVERFLOW != 0 && !self.overflowed {
                // Lock files may have gone unseen: say so (no silent budget).
                self.overflowed = true;
                sbx_core::audit::emit(
                    "lockwatch_overflow",
                    sbx_core::Severity::Warn,
                    serde_json::json!({ "lost": "config.lock/HEAD.lock replace alerts may be missing (the renames still fail)" }),
                );
            }
            let len = u32::from_ne_bytes(b[off + 12..off + 16].try_into().expect("4")) as usize;
            if off + EVENT_HEADER + len > b.len() {
                break;
            }
            let name = &b[off + EVENT_HEADER..off + EVENT_HEADER + len];
            let name = &name[..name.iter().position(|c| *c == 0).unwrap_or(name.len())];
            off += EVENT_HEADER + len;
            let Some(dir) = self.dirs.get(&wd) else {
                continue;
            };
            for (lock, target) in LOCKS {
                let file = dir.join(target);
                if name == lock.as_bytes()
                    && self.guarded.contains(&file)
                    && let Ok(mut a) = alerts.lock()
                {
                    a.replace_attempt(&file, lock);
                }
            }
        }
        self.carry.drain(..off);
    }
}

/// The helper: forwards inotify records until `alive` hangs up, then
/// forwards what is left, closes the event pipe and exits. Only raw
/// syscalls and stack buffers (it was forked).
fn helper(ino: RawFd, alive: RawFd, ev: RawFd, last_wd: i32) -> ! {
    // SAFETY: prctl with integer arguments, on this process only.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
    }
    sbx_core::fds::stdio_to_dev_null();
    sbx_core::fds::close_all_except(&[ino, alive, ev]);
    let mut buf = [0u8; 4096];
    let forward = |buf: &mut [u8; 4096]| loop {
        // SAFETY: ino is kept open by close_all_except; buf is a live 4096-byte buffer.
        let n = unsafe { libc::read(ino, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            break;
        }
        // SAFETY: ev is kept open; the first n bytes of buf were just read.
        unsafe { libc::write(ev, buf.as_ptr().cast(), n as usize) };
    };
    loop {
        let mut fds = [
            libc::pollfd {
                fd: ino,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: alive,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: fds is a live array of two pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            continue;
        }
        if fds[0].revents != 0 {
            forward(&mut buf);
        }
        if fds[1].revents != 0 {
            forward(&mut buf);
            // The watches go first, the instance after (module doc).
            for wd in 1..=last_wd {
                // SAFETY: ino is open; a wd that is not ours fails EINVAL.
                unsafe { libc::inotify_rm_watch(ino, wd) };
            }
            forward(&mut buf);
            // A millisecond for the mark lists' grace period (module doc;
            // sbx-fs's end checks take longer, it is not waited for).
            let pause = libc::timespec {
                tv_sec: 0,
                tv_nsec: 1_000_000,
            };
            // SAFETY: both fds are ours and not used after; pause is a live timespec;
            // the forked helper leaves without destructors.
            unsafe {
                libc::close(ev);
                libc::nanosleep(&pause, std::ptr::null_mut());
                libc::close(ino);
                libc::_exit(0)
            }
        }
    }
}
