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
    let r = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, CLOSE_RANGE_CLOEXEC) };
    if r != 0 {
        // Kernels before 5.11: walk the table.
        let max = unsafe { libc::sysconf(libc::_SC_OPEN_MAX) };
        let max = if max <= 0 { 65536 } else { max.min(1 << 20) } as RawFd;
        for fd in 3..max {
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        }
    }
    for &fd in keep {
        if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
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
            let f = unsafe { libc::fcntl(fd, libc::F_GETFD) };
            assert_eq!(f & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        }
        assert_eq!(
            unsafe { libc::write(w.as_raw_fd(), b"x".as_ptr().cast(), 1) },
            1
        );
        let mut b = [0u8; 1];
        assert_eq!(
            unsafe { libc::read(r.as_raw_fd(), b.as_mut_ptr().cast(), 1) },
            1
        );
        assert_eq!(&b, b"x");
    }
}
