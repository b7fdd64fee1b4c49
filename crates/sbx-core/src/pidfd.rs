//! pidfds: a handle on one process that a later process reusing its pid
//! cannot be mistaken for. Every supervisor signals and watches its child
//! (and its own supervising parent) through one, never by pid.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

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

/// SIGKILLs every process that `list` names (a cgroup's members, a
/// jail's processes) without ever signalling a pid that was reused: a
/// pidfd is opened for each pid of one reading, and only those still named
/// by a second reading, made after the opens, are signalled through their
/// pidfd. A pid that is named then belongs to a process `list` selects: the
/// pidfd's own process, or one that replaced it after the pidfd's process
/// was reaped, in which case the pidfd names a dead process and the signal
/// is a no-op. Returns the pids signalled with their pidfds, for
/// [`wait_exited`].
pub fn kill_listed(mut list: impl FnMut() -> Vec<i32>) -> Vec<(i32, OwnedFd)> {
    let mut fds: Vec<(i32, OwnedFd)> = list()
        .into_iter()
        .filter_map(|p| open(p).ok().map(|f| (p, f)))
        .collect();
    if fds.is_empty() {
        return fds;
    }
    let still: std::collections::HashSet<i32> = list().into_iter().collect();
    fds.retain(|(p, _)| still.contains(p));
    for (_, f) in &fds {
        let _ = send_signal(f.as_fd(), libc::SIGKILL);
    }
    fds
}

/// Waits until every process of `fds` has exited or `limit` has passed,
/// whichever is first (woken by the exits, not by polling a list). Returns
/// whether all exited.
pub fn wait_exited(fds: &[(i32, OwnedFd)], limit: Duration) -> bool {
    let end = Instant::now() + limit;
    let mut left: Vec<libc::pollfd> = fds
        .iter()
        .map(|(_, f)| libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    loop {
        left.retain(|p| p.revents == 0);
        if left.is_empty() {
            return true;
        }
        let now = Instant::now();
        if now >= end {
            return false;
        }
        let ms = (end - now).as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: `left` is a live array of pollfds whose fds `fds` keeps open.
        let n = unsafe { libc::poll(left.as_mut_ptr(), left.len() as libc::nfds_t, ms) };
        if n < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return false;
        }
    }
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
    fn only_processes_still_listed_after_the_opens_are_killed() {
        let mut a = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        let mut b = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        let (pa, pb) = (a.id() as i32, b.id() as i32);
        // The first reading names both; the second only `a`, as when `b`'s
        // pid was reused by a process outside the set between the readings.
        let mut readings = vec![vec![pa], vec![pa, pb]];
        let killed = kill_listed(|| readings.pop().unwrap_or_default());
        assert_eq!(killed.iter().map(|(p, _)| *p).collect::<Vec<_>>(), [pa]);
        assert!(wait_exited(&killed, Duration::from_secs(10)));
        assert_eq!(a.wait().unwrap().signal(), Some(libc::SIGKILL));
        assert_eq!(
            b.try_wait().unwrap(),
            None,
            "an unlisted process was signalled"
        );
        // A process that does not exit is not waited for past the limit.
        let bf = vec![(pb, open(pb).unwrap())];
        let t = Instant::now();
        assert!(!wait_exited(&bf, Duration::from_millis(50)));
        assert!(t.elapsed() >= Duration::from_millis(50));
        b.kill().unwrap();
        b.wait().unwrap();
        assert!(wait_exited(&bf, Duration::from_secs(10)));
        // An empty set is nothing to kill or wait for.
        let none = kill_listed(Vec::new);
        assert!(none.is_empty() && wait_exited(&none, Duration::ZERO));
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
