//! The guardian: a forked helper that cleans up after its owner when the
//! owner dies without doing it (SIGKILL, crash). One place for the pattern
//! (sbx-fs's placeholder reaper, sbx-cgroup's watcher, sbx-vm's jail
//! reaper, sbx-creds' revoking guardian, sbx-seccomp's notifier watch).
//!
//! The owner keeps [`Guardian`]: the write end of a close-on-exec pipe. The
//! child keeps [`Watch`]: the read end and a pidfd of the owner. The owner
//! may [`Guardian::send`] what the guardian will need (a pid, an id), and
//! ends with [`Guardian::release`] once it cleaned up itself. [`Watch::wait`]
//! returns [`Ending::Released`], or [`Ending::OwnerGone`] with the messages
//! received when the owner exited (its pidfd: a descendant that inherited
//! the write end cannot keep the guardian waiting) or closed the pipe
//! without releasing it (dropping the [`Guardian`]).

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

const MESSAGE: u8 = b'm';
const RELEASE: u8 = b'r';

/// Whether this process has one thread, what [`Guardian::spawn`] needs
/// (false when /proc cannot tell).
pub fn single_threaded() -> bool {
    std::fs::read_dir("/proc/self/task").is_ok_and(|d| d.count() == 1)
}

/// The owner's side.
#[derive(Debug)]
pub struct Guardian {
    pid: libc::pid_t,
    tx: Option<File>,
}

/// How the owner's watch ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ending {
    /// The owner cleaned up itself: nothing to do.
    Released,
    /// The owner is gone (or gave up) without releasing: clean up. The
    /// messages it sent, in order.
    OwnerGone(Vec<Vec<u8>>),
}

/// The guardian's side. What it read is zeroed when it is dropped.
pub struct Watch {
    rx: File,
    /// What was read so far (messages, perhaps the release).
    got: Vec<u8>,
    /// None: the owner was gone before the watch began.
    owner: Option<OwnedFd>,
}

impl Guardian {
    /// Forks the guardian, which runs `body` and exits with what it
    /// returns (never returning here; a panic exits 101). `body` starts
    /// with every fd of the owner: it closes what it must not hold, keeping
    /// [`Watch::fds`].
    ///
    /// # Safety
    /// The calling process must have one thread: the child runs `body`,
    /// which may allocate or take locks another thread held at the fork.
    pub unsafe fn spawn(body: impl FnOnce(Watch) -> i32) -> io::Result<Guardian> {
        let (rx, tx) = crate::fds::pipe()?;
        // SAFETY: getpid cannot fail.
        let owner = unsafe { libc::getpid() };
        // SAFETY: the caller promises a single thread (see # Safety), so
        // the child may run any code; it never returns from here (it ends
        // with _exit below, running no destructor of the owner's state).
        match unsafe { libc::fork() } {
            -1 => Err(io::Error::last_os_error()),
            0 => {
                drop(tx);
                let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    body(Watch::new(owner, rx))
                }))
                .unwrap_or(101);
                // SAFETY: ends the forked child without running the owner's
                // atexit handlers or flushing its copied buffers.
                unsafe { libc::_exit(code) }
            }
            pid => Ok(Guardian {
                pid,
                tx: Some(File::from(tx)),
            }),
        }
    }

    pub fn pid(&self) -> libc::pid_t {
        self.pid
    }

    /// The pipe's write end, for a list of fds a forked child closes.
    pub fn fd(&self) -> Option<RawFd> {
        self.tx.as_ref().map(|f| f.as_raw_fd())
    }

    /// Sends one message (kept by the guardian for its clean-up).
    pub fn send(&self, msg: &[u8]) -> io::Result<()> {
        let Some(mut tx) = self.tx.as_ref() else {
            return Ok(());
        };
        let len = u32::try_from(msg.len()).map_err(|_| io::Error::other("message too long"))?;
        let mut b = Vec::with_capacity(5 + msg.len());
        b.push(MESSAGE);
        b.extend_from_slice(&len.to_ne_bytes());
        b.extend_from_slice(msg);
        tx.write_all(&b)
    }

    /// The owner cleaned up: the guardian exits without doing anything.
    pub fn release(mut self) {
        if let Some(mut tx) = self.tx.take() {
            let _ = tx.write_all(&[RELEASE]);
        }
    }

    /// [`Self::release`], then waits for the guardian to exit.
    pub fn release_and_reap(self) {
        let pid = self.pid;
        self.release();
        let mut st = 0;
        // SAFETY: pid is our own child (forked by spawn), reaped only here.
        unsafe { libc::waitpid(pid, &mut st, 0) };
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.got.fill(0);
        // The zeroes are written, not elided as stores to freed memory.
        std::hint::black_box(&self.got);
    }
}

impl Watch {
    fn new(owner: libc::pid_t, rx: OwnedFd) -> Watch {
        // The pidfd is taken in the child: the owner is its parent, unless
        // it died already (then the child was reparented).
        let pidfd = crate::pidfd::open(owner).ok();
        // SAFETY: getppid cannot fail.
        let alive = unsafe { libc::getppid() } == owner;
        // SAFETY: rx is the child's open read end; only its flags change.
        unsafe { libc::fcntl(rx.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
        Watch {
            rx: File::from(rx),
            got: Vec::new(),
            owner: pidfd.filter(|_| alive),
        }
    }

    /// The fds the watch needs (keep them when closing the rest).
    pub fn fds(&self) -> Vec<RawFd> {
        let mut v = vec![self.rx.as_raw_fd()];
        v.extend(self.owner.as_ref().map(|o| o.as_raw_fd()));
        v
    }

    /// Blocks until the owner releases the guardian or is gone.
    pub fn wait(mut self) -> Ending {
        loop {
            if let Some(e) = self.check() {
                return e;
            }
            self.block(&mut []);
        }
    }

    /// Blocks until the watch may have ended (then [`Self::check`]) or
    /// one of `more` is ready (their `revents` set): for a guardian that
    /// watches other fds too.
    pub fn block(&self, more: &mut [libc::pollfd]) {
        let mut p: Vec<libc::pollfd> = self
            .fds()
            .into_iter()
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        p.extend_from_slice(more);
        let n = p.len() as libc::nfds_t;
        // SAFETY: a live array of n pollfds; no timeout.
        unsafe { libc::poll(p.as_mut_ptr(), n, -1) };
        let ours = p.len() - more.len();
        for (m, r) in more.iter_mut().zip(&p[ours..]) {
            m.revents = r.revents;
        }
    }

    /// How the watch ended, if it has (never blocks): the owner released
    /// it, or is gone (exited, or closed the pipe without releasing it).
    pub fn check(&mut self) -> Option<Ending> {
        loop {
            // Everything pending first: a message may precede the end.
            let eof = self.drain();
            let (released, msgs) = self.frames();
            if released {
                return Some(Ending::Released);
            }
            let gone = |got: &[u8]| {
                Some(Ending::OwnerGone(
                    msgs.iter().map(|r| got[r.clone()].to_vec()).collect(),
                ))
            };
            let Some(owner) = &self.owner else {
                return gone(&self.got);
            };
            if eof || crate::pidfd::exited(std::os::fd::AsFd::as_fd(owner)) {
                // A last drain: what the owner wrote before it went.
                if !eof {
                    self.owner = None;
                    continue;
                }
                return gone(&self.got);
            }
            return None;
        }
    }

    /// Whether the release was read, and where the complete messages are
    /// in what was read (copied out only when the owner is gone: they may
    /// hold secrets, such as sbx-creds' tokens).
    fn frames(&self) -> (bool, Vec<std::ops::Range<usize>>) {
        let mut msgs = Vec::new();
        let mut at = 0;
        while let Some(&kind) = self.got.get(at) {
            if kind == RELEASE {
                return (true, msgs);
            }
            let Some(len) = self.got.get(at + 1..at + 5) else {
                break;
            };
            let len = u32::from_ne_bytes([len[0], len[1], len[2], len[3]]) as usize;
            let body = at + 5..at + 5 + len;
            if body.end > self.got.len() {
                break;
            }
            msgs.push(body.clone());
            at = body.end;
        }
        (false, msgs)
    }

    /// Reads what is pending (non-blocking). True at EOF.
    fn drain(&mut self) -> bool {
        let mut b = [0u8; 4096];
        loop {
            match self.rx.read(&mut b) {
                Ok(0) => return true,
                Ok(n) => self.got.extend_from_slice(&b[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(_) => return true,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The guardian's ending, reported as its exit code: 0 released, else
    /// 10 + the number of messages (each checked).
    fn spawn_reporting() -> Guardian {
        // SAFETY: the child only waits and exits; nextest runs each test in
        // its own process, and this test's thread is the one that forks
        // while the harness's main thread only waits for it.
        unsafe {
            Guardian::spawn(|w| match w.wait() {
                Ending::Released => 0,
                Ending::OwnerGone(m) if m.iter().all(|m| m == b"pid\x01\x02") => {
                    10 + m.len() as i32
                }
                Ending::OwnerGone(_) => 1,
            })
        }
        .unwrap()
    }

    fn status(pid: libc::pid_t) -> i32 {
        let mut st = 0;
        // SAFETY: our own child, reaped once.
        assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
        assert!(libc::WIFEXITED(st), "status {st}");
        libc::WEXITSTATUS(st)
    }

    #[test]
    fn released_guardian_does_nothing() {
        let g = spawn_reporting();
        g.send(b"pid\x01\x02").unwrap();
        let pid = g.pid();
        g.release();
        assert_eq!(status(pid), 0);
    }

    #[test]
    fn dropped_guardian_cleans_with_the_messages() {
        let g = spawn_reporting();
        g.send(b"pid\x01\x02").unwrap();
        g.send(b"pid\x01\x02").unwrap();
        let pid = g.pid();
        drop(g);
        assert_eq!(status(pid), 12);
    }

    /// The owner is killed (while a descendant still holds the write end):
    /// the guardian notices through the owner's pidfd.
    #[test]
    fn killed_owner_is_noticed_despite_an_inherited_write_end() {
        let (r, w) = crate::fds::pipe().unwrap();
        // SAFETY: the owner child only spawns, sends and then sleeps in
        // pause() until killed; see spawn_reporting for the threads.
        let owner = unsafe { libc::fork() };
        if owner == 0 {
            let g = spawn_reporting();
            g.send(b"pid\x01\x02").unwrap();
            // A grandchild holding a copy of the write end, outliving us.
            // SAFETY: as above; the grandchild only waits to be killed.
            let holder = unsafe { libc::fork() };
            if holder == 0 {
                // SAFETY: waits for the SIGKILL, then leaves the forked child.
                unsafe {
                    libc::pause();
                    libc::_exit(0)
                }
            }
            let mut pids = g.pid().to_ne_bytes().to_vec();
            pids.extend_from_slice(&holder.to_ne_bytes());
            // SAFETY: w is open; an 8-byte buffer (atomic on a pipe).
            unsafe { libc::write(w.as_raw_fd(), pids.as_ptr().cast(), 8) };
            std::mem::forget(g);
            // SAFETY: waits for the SIGKILL, then leaves the forked child.
            unsafe {
                libc::pause();
                libc::_exit(0)
            }
        }
        drop(w);
        let mut b = [0u8; 8];
        (&File::from(r)).read_exact(&mut b).unwrap();
        let guardian = libc::pid_t::from_ne_bytes([b[0], b[1], b[2], b[3]]);
        let holder = libc::pid_t::from_ne_bytes([b[4], b[5], b[6], b[7]]);
        let guardian_fd = crate::pidfd::open(guardian).unwrap();
        let holder_fd = crate::pidfd::open(holder).unwrap();
        // SAFETY: our own child.
        unsafe { libc::kill(owner, libc::SIGKILL) };
        status_signalled(owner);
        // Not our child: its end is seen through its pidfd (bounded).
        let mut p = libc::pollfd {
            fd: guardian_fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, 20_000) };
        // The holder still held the write end all along.
        assert!(!crate::pidfd::exited(std::os::fd::AsFd::as_fd(&holder_fd)));
        crate::pidfd::send_signal(std::os::fd::AsFd::as_fd(&holder_fd), libc::SIGKILL).unwrap();
        assert_eq!(n, 1, "the guardian did not notice its owner's death");
    }

    fn status_signalled(pid: libc::pid_t) {
        let mut st = 0;
        // SAFETY: our own child, reaped once.
        assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
        assert!(libc::WIFSIGNALED(st));
    }
}
