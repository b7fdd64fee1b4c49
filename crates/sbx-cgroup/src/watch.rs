//! The watcher: a small process outside the sandbox group that removes the
//! group if the supervisor dies without doing it (SIGKILL, crash).
//!
//! It is a [`sbx_core::guardian`], forked right after the group is created,
//! before the command starts. When the supervisor has cleaned up it
//! releases the watcher, which exits; when the supervisor is gone instead,
//! the watcher kills everything in the group, removes it and logs
//! `supervisor_died`. The watcher starts its own session (a signal to the
//! supervisor's process group does not reach it), keeps the supervisor's
//! blocked signal mask (SIGTERM, SIGINT, SIGHUP... stay pending), and stays
//! in the caller's own cgroups, outside the sandbox.

use std::os::fd::RawFd;
use std::time::Duration;

use sbx_core::guardian::{Ending, Guardian, Watch};

use crate::group::SandboxGroup;
use crate::leaf::Leaf;

pub struct Watcher(Guardian);

impl Watcher {
    /// Forks the watcher for `group`.
    ///
    /// # Safety
    /// The calling process must have one thread (see [`Guardian::spawn`]).
    pub unsafe fn start(group: &SandboxGroup, leaf: Option<Leaf>) -> std::io::Result<Self> {
        // SAFETY: the caller promises a single thread.
        unsafe { Guardian::spawn(|w| run(group, leaf, w)) }.map(Watcher)
    }

    pub fn pid(&self) -> i32 {
        self.0.pid()
    }

    /// Tells the watcher the group is gone and reaps it.
    pub fn finish(self) {
        self.0.release_and_reap();
    }
}

/// The watcher's life: its exit code.
fn run(group: &SandboxGroup, leaf: Option<Leaf>, watch: Watch) -> i32 {
    // SAFETY: plain syscalls on this (forked) process: a new session, its
    // name, and fds 0 and 1 pointed at /dev/null; the name is NUL-ended.
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
    let mut keep = watch.fds();
    keep.extend(audit_fd);
    sbx_core::fds::close_all_except(&keep);
    let mut group = group.without_fds();
    if watch.wait() == Ending::Released {
        return 0;
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
    if res.is_ok() { 0 } else { 1 }
}
