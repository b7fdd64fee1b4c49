//! fd hygiene: only 0, 1, 2 and the fds a tool names reach the next command.

use std::os::fd::{OwnedFd, RawFd};

/// A pipe (read end, write end), both close-on-exec.
pub fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = std::io::pipe()?;
    Ok((r.into(), w.into()))
}

/// Marks every fd >= 3 close-on-exec, except `keep` (whose CLOEXEC flag is
/// cleared). Async-signal-safe: usable between fork and exec.
pub fn cloexec_all_except(keep: &[RawFd]) -> std::io::Result<()> {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: close_range with integer arguments only changes fd flags of this process.
    let r = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, CLOSE_RANGE_CLOEXEC) };
    if r != 0 {
        // Kernels before 5.11: walk the table.
        // SAFETY: sysconf with an integer name.
        let max = unsafe { libc::sysconf(libc::_SC_OPEN_MAX) };
        let max = if max <= 0 { 65536 } else { max.min(1 << 20) } as RawFd;
        for fd in 3..max {
            // SAFETY: fcntl on an fd number only sets a flag (EBADF for a closed one).
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        }
    }
    for &fd in keep {
        // SAFETY: fcntl on an fd number only clears a flag (an error is returned).
        if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Closes every fd >= 3 not in `keep`: what a forked helper does first, so
/// it holds nothing of its parent's open. No allocation, only
/// close_range(2) over the gaps between the kept fds (in ascending order):
/// usable between fork and exec.
pub fn close_all_except(keep: &[RawFd]) {
    let mut from: u32 = 3;
    loop {
        // The smallest kept fd at or above `from`.
        let next = keep
            .iter()
            .filter_map(|&f| u32::try_from(f).ok())
            .filter(|&f| f >= from)
            .min();
        let Some(fd) = next else { break };
        if fd > from {
            // SAFETY: closes a range holding none of the kept fds; the caller owns the rest
            // (this is its purpose).
            unsafe { libc::syscall(libc::SYS_close_range, from, fd - 1, 0) };
        }
        from = fd + 1;
    }
    // SAFETY: closes the range past the last kept fd; the caller owns the rest (this is its
    // purpose).
    unsafe { libc::syscall(libc::SYS_close_range, from, u32::MAX, 0) };
}

/// Points fds 0, 1 and 2 at /dev/null, so that a helper process holds
/// none of its parent's terminal or pipes (a reader of them sees EOF when
/// the parent is done). Async-signal-safe.
pub fn stdio_to_dev_null() {
    // SAFETY: raw syscalls only (async-signal-safe); the path is a NUL-ended literal; null is
    // ours and closed once.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            for fd in 0..3 {
                libc::dup2(null, fd);
            }
            if null > 2 {
                libc::close(null);
            }
        }
    }
}

/// The open fds of this process (for tests and diagnostics).
pub fn open_fds() -> Vec<RawFd> {
    let mut v: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort_unstable();
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn pipe_is_cloexec_and_carries_bytes() {
        let (r, w) = pipe().unwrap();
        for fd in [r.as_raw_fd(), w.as_raw_fd()] {
            // SAFETY: fcntl F_GETFD on our open fd only reads its flags.
            let f = unsafe { libc::fcntl(fd, libc::F_GETFD) };
            assert_eq!(f & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        }
        assert_eq!(
            // SAFETY: w is our open write end; the literal is a live 1-byte buffer.
            unsafe { libc::write(w.as_raw_fd(), b"x".as_ptr().cast(), 1) },
            1
        );
        let mut b = [0u8; 1];
        assert_eq!(
            // SAFETY: r is our open read end; b is a live 1-byte buffer.
            unsafe { libc::read(r.as_raw_fd(), b.as_mut_ptr().cast(), 1) },
            1
        );
        assert_eq!(&b, b"x");
    }

    /// In a forked child: only the kept fds (and 0-2) survive.
    #[test]
    fn close_all_except_keeps_only_what_is_named() {
        let (a, b) = pipe().unwrap();
        let (c, d) = pipe().unwrap();
        let (keep1, keep2) = (a.as_raw_fd(), d.as_raw_fd());
        // SAFETY: nextest runs this test alone in its process; the child only checks fds and
        // _exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            close_all_except(&[keep2, keep1]);
            // SAFETY: fcntl F_GETFD on an fd number only reads its flags (EBADF if closed).
            let open = |fd| unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0;
            let ok = open(keep1) && open(keep2) && !open(b.as_raw_fd()) && !open(c.as_raw_fd());
            // SAFETY: the forked child leaves without running the test harness's destructors.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut st = 0;
        // SAFETY: pid is our own child, reaped once; st is a live int.
        assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
        assert!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
            "status {st}"
        );
    }
}
