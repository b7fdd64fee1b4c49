//! Reporting a seccomp kill.
//!
//! sbx-seccomp `execve`s in place, so it cannot see the violation; the
//! supervisor that reaps the killed process (sbx-fs's init, sbx-cgroup, any
//! sbx supervisor) reports it through [`report_child_exit`].

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use crate::audit::{self, Severity};

/// Emits an `alert` when `status` is a death by SIGSYS (a seccomp kill).
/// Returns whether it was one.
pub fn report_child_exit(pid: i32, status: ExitStatus) -> bool {
    if status.signal() != Some(libc::SIGSYS) {
        return false;
    }
    let syscall = syscall_from_kmsg(pid);
    audit::emit(
        "seccomp_kill",
        Severity::Alert,
        serde_json::json!({ "child_pid": pid, "signal": "SIGSYS", "syscall": syscall }),
    );
    true
}

/// The syscall number of the kernel's seccomp audit record for `pid`
/// (`type=1326 ... pid=N ... syscall=M`), when /dev/kmsg is readable (root)
/// and the record is there. Best effort: None otherwise.
pub fn syscall_from_kmsg(pid: i32) -> Option<i64> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")
        .ok()?;
    let needle = format!(" pid={pid} ");
    let mut found = None;
    let mut buf = vec![0u8; 8192];
    // Each read returns one record; stop at EAGAIN (end of the buffer).
    for _ in 0..100_000 {
        let n = match f.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let rec = String::from_utf8_lossy(&buf[..n]);
        if rec.contains("type=1326") && rec.contains(&needle) {
            found = rec
                .split_whitespace()
                .find_map(|w| w.strip_prefix("syscall="))
                .and_then(|v| v.parse().ok());
        }
    }
    found
}
