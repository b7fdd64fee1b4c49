//! The watcher: a small process outside the sandbox group that removes the
//! group if the supervisor dies without doing it (SIGKILL, crash).
//!
//! It is forked right after the group is created, before the command starts,
//! and joined to the supervisor by a pipe whose write end only the
//! supervisor holds (close-on-exec, so the sandboxed command never gets it).
//! When the supervisor has cleaned up it writes one byte and the watcher
//! exits; when the read returns end-of-file instead, the supervisor is gone:
//! the watcher kills everything in the group, removes it and logs
//! `supervisor_died`. The watcher starts its own session (a signal to the
//! supervisor's process group does not reach it), keeps the supervisor's
//! blocked signal mask (SIGTERM, SIGINT, SIGHUP... stay pending), and stays
//! in the caller's own cgroups, outside the sandbox.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::group::SandboxGroup;
use crate::leaf::Leaf;

const DONE: u8 = b'D';

pub struct Watcher {
    pid: i32,
    tx: Option<OwnedFd>,
}

impl Watcher {
    /// Forks the watcher for `group`. Call while single-threaded.
    pub fn start(group: &SandboxGroup, leaf: Option<Leaf>) -> std::io::Result<Self> {
        let (rx, tx) = sbx_core::fds::pipe()?;
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if pid == 0 {
            drop(tx);
            run(group, leaf, rx);
        }
        drop(rx);
        Ok(Watcher { pid, tx: Some(tx) })
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Tells the watcher the group is gone and reaps it.
    pub fn finish(mut self) {
        if let Some(tx) = self.tx.take() {
            let b = [DONE];
            unsafe { libc::write(tx.as_raw_fd(), b.as_ptr().cast(), 1) };
        }
        let mut st = 0;
        unsafe { libc::waitpid(self.pid, &mut st, 0) };
    }
}

/// The watcher's life (never returns).
fn run(group: &SandboxGroup, leaf: Option<Leaf>, rx: OwnedFd) -> ! {
    unsafe {
        libc::setsid();
        let name = b"sbx-cg-watch\0";
        libc::prctl(libc::PR_SET_NAME, name.as_ptr());
        // Nothing of the caller's stdin/stdout is held open by the watcher.
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::dup2(null, 1);
        }
    }
    let audit_fd: Option<RawFd> = sbx_core::audit::get().and_then(|a| a.raw_fd());
    let mut keep = vec![rx.as_raw_fd()];
    keep.extend(audit_fd);
    sbx_core::fds::close_all_except(&keep);
    let mut group = group.without_fds();
    let mut b = [0u8; 1];
    let n = loop {
        let n = unsafe { libc::read(rx.as_raw_fd(), b.as_mut_ptr().cast(), 1) };
        if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        break n;
    };
    if n == 1 && b[0] == DONE {
        unsafe { libc::_exit(0) };
    }
    // The supervisor died: the sandbox goes too.
    let _ = group.kill_all(Duration::from_secs(10));
    let stats = group.stats();
    let mut res = group.destroy(Duration::from_secs(10));
    if let Some(l) = &leaf {
        let r = l.leave();
        if res.is_ok() {
            res = r;
        }
    }
    sbx_core::audit::emit(
        "supervisor_died",
        sbx_core::Severity::Warn,
        serde_json::json!({
            "cgroup": group.dirs.iter().map(|d| d.path.display().to_string()).collect::<Vec<_>>(),
            "processes_killed": group.killed,
            "removed": res.is_ok(),
            "peak_memory_bytes": stats.peak_memory_bytes,
            "cpu_time_ns": stats.cpu_time_ns,
            "oom_kills": stats.oom_kills,
            "pids_limit_hits": stats.pids_limit_hits,
        }),
    );
    unsafe { libc::_exit(if res.is_ok() { 0 } else { 1 }) };
}
