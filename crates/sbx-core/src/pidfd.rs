//! pidfds: a handle on one process that a later process reusing its pid
//! cannot be mistaken for. Every supervisor signals and watches its child
//! (and its own supervising parent) through one, never by pid.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// `pidfd_open(pid, 0)`: close-on-exec (the kernel always sets it).
pub fn open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; on success the fd is new and ours alone.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by pidfd_open (>= 0) and is owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Sends `sig` to the process. A process that already exited (ESRCH) is
/// not an error: the caller wanted it gone or told, and it is past both.
pub fn send_signal(pidfd: BorrowedFd<'_>, sig: i32) -> io::Result<()> {
    // SAFETY: plain syscall; no siginfo (the kernel fills a SI_USER one).
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ESRCH) {
            return Err(e);
        }
    }
    Ok(())
}

/// Whether the process has exited, now (a pidfd polls readable from the
/// moment its process exits, reaped or not). Never waits.
pub fn exited(pidfd: BorrowedFd<'_>) -> bool {
    let mut p = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd; timeout 0.
    unsafe { libc::poll(&mut p, 1, 0) > 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn a_child_is_watched_and_signalled_through_its_pidfd() {
        let mut child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        let fd = open(child.id() as i32).unwrap();
        assert!(!exited(fd.as_fd()));
        send_signal(fd.as_fd(), libc::SIGKILL).unwrap();
        let st = child.wait().unwrap();
        assert_eq!(st.signal(), Some(libc::SIGKILL));
        assert!(exited(fd.as_fd()));
        // Reaped: the pid may already name another process; the pidfd
        // still names the dead one, and signalling it is a no-op.
        send_signal(fd.as_fd(), libc::SIGKILL).unwrap();
    }

    #[test]
    fn bad_pids_and_signals_are_errors() {
        assert_eq!(open(-1).unwrap_err().raw_os_error(), Some(libc::EINVAL));
        let me = open(std::process::id() as i32).unwrap();
        assert!(!exited(me.as_fd()));
        let e = send_signal(me.as_fd(), -5).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    }
}
