//! Reporting a seccomp kill and a file-size-limit kill.
//!
//! sbx-seccomp `execve`s in place, so it cannot see the violation; the
//! supervisor that reaps the killed process (sbx-fs's init, sbx-cgroup, any
//! sbx supervisor) reports it through [`report_child_exit`].
//!
//! The same supervisors report a death by SIGXFSZ (a write past
//! `RLIMIT_FSIZE`, sbx-cgroup's `--rlimit fsize=`: the disk-fill attack) as
//! an `fsize_exceeded` alert. A shell reports a child it forked that died of
//! SIGXFSZ as exit status 153 (128+25), which is what the supervisor then
//! sees: that status is reported too, marked `inferred`, unless the child is
//! itself an sbx tool (which propagates its own child's status: the
//! innermost supervisor already reported it). A program that ignores
//! SIGXFSZ gets EFBIG from write(2) instead and leaves no alert.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use crate::audit::{self, Severity};

/// Emits an `alert` when `status` is a death by SIGSYS (a seccomp kill) or
/// by SIGXFSZ (see the module text). Returns whether it was one.
pub fn report_child_exit(pid: i32, status: ExitStatus) -> bool {
    report_child_exit_of(pid, status, false)
}

/// Exit status of a shell whose child died of SIGXFSZ (128 + 25).
pub const XFSZ_SHELL_STATUS: i32 = 128 + libc::SIGXFSZ;

/// [`report_child_exit`] for a child that may itself be an sbx tool
/// (`child_is_sbx`): then an exit status of 153 is that tool passing on
/// what an inner supervisor already reported, not a new alert.
pub fn report_child_exit_of(pid: i32, status: ExitStatus, child_is_sbx: bool) -> bool {
    if status.signal() == Some(libc::SIGXFSZ)
        || (!child_is_sbx && status.code() == Some(XFSZ_SHELL_STATUS))
    {
        let inferred = status.signal().is_none();
        audit::emit(
            "fsize_exceeded",
            Severity::Alert,
            serde_json::json!({
                "child_pid": pid,
                "signal": "SIGXFSZ",
                "exit_code": status.code(),
                "inferred": inferred,
            }),
        );
        return true;
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigxfsz_death_and_the_shell_status_are_reported() {
        // Raw wait statuses: signal N = N, exit code C = C << 8.
        assert!(report_child_exit(1, ExitStatus::from_raw(libc::SIGXFSZ)));
        assert!(report_child_exit(1, ExitStatus::from_raw(153 << 8)));
        // An sbx tool passing on 153 was already reported inside.
        assert!(!report_child_exit_of(
            1,
            ExitStatus::from_raw(153 << 8),
            true
        ));
        assert!(report_child_exit_of(
            1,
            ExitStatus::from_raw(libc::SIGXFSZ),
            true
        ));
        assert!(!report_child_exit(1, ExitStatus::from_raw(0)));
        assert!(!report_child_exit(1, ExitStatus::from_raw(1 << 8)));
        assert!(!report_child_exit(1, ExitStatus::from_raw(libc::SIGKILL)));
    }
}
