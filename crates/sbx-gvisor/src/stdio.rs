//! The caller's stdio across gVisor: a regular file goes through a pipe.

use std::io::Read;
use std::os::fd::{OwnedFd, RawFd};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sbx_core::Failure;

use crate::runsc::pipe;

/// gVisor gives a host regular file it receives as stdio its own offset,
/// starting at 0, and ignores the caller's: `{ echo a; sbx-policy chain
/// --trust zero -- echo b; } > log` wrote b over a, and with `2>&1` stdout
/// and stderr got two offsets and overwrote each other's lines. A stdout or
/// stderr that is a regular file therefore goes through a pipe that this
/// process copies to the caller's very descriptor, so the kernel applies its
/// offset and O_APPEND as in every other tier; when both name one file
/// (`> log 2>&1`) they share one pipe, which keeps their order. Pipes,
/// terminals and sockets are passed through untouched, as before.
pub(crate) struct StdioRelay {
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl StdioRelay {
    pub(crate) fn start(cmd: &mut Command) -> Result<StdioRelay, Failure> {
        let st = |fd: RawFd| {
            // SAFETY: `stat` is plain-old-data; all-zero is a valid value.
            let mut s: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: fstat(2) writes one `stat` into `s`, a live local; a
            // closed fd number only makes it fail with EBADF.
            (unsafe { libc::fstat(fd, &mut s) } == 0).then_some(s)
        };
        let reg = |s: &Option<libc::stat>| {
            s.as_ref()
                .is_some_and(|s| s.st_mode & libc::S_IFMT == libc::S_IFREG)
        };
        let (s1, s2) = (st(1), st(2));
        let mut threads = Vec::new();
        let shared = reg(&s1)
            && reg(&s2)
            && s1.as_ref().map(|s| (s.st_dev, s.st_ino))
                == s2.as_ref().map(|s| (s.st_dev, s.st_ino));
        if shared {
            let (r, w) = pipe()?;
            let w2 = w
                .try_clone()
                .map_err(|e| Failure::new(format!("dup: {e}")))?;
            cmd.stdout(Stdio::from(w)).stderr(Stdio::from(w2));
            threads.push(copy_to(r, 1));
        } else {
            if reg(&s1) {
                let (r, w) = pipe()?;
                cmd.stdout(Stdio::from(w));
                threads.push(copy_to(r, 1));
            }
            if reg(&s2) {
                let (r, w) = pipe()?;
                cmd.stderr(Stdio::from(w));
                threads.push(copy_to(r, 2));
            }
        }
        Ok(StdioRelay { threads })
    }

    /// Waits (5 s at most: a process of the sandbox that outlived runsc
    /// must not hold sbx-gvisor) until everything written was copied.
    pub(crate) fn finish(self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        for t in self.threads {
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }
}

/// Copies `from` to the caller's `fd` until EOF (a write error ends it:
/// the reader of a pipe went away).
fn copy_to(from: OwnedFd, fd: RawFd) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        use std::io::Write;
        let mut r = std::fs::File::from(from);
        // SAFETY: fd 1 or 2 stays open for the life of the process; the
        // ManuallyDrop never closes it.
        let mut out = std::mem::ManuallyDrop::new(unsafe {
            <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd)
        });
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = match r.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => return,
            };
            if out.write_all(&buf[..n]).is_err() {
                return;
            }
        }
    })
}
