//! Deaths that are alerts: the seccomp notifier killed (every later refusal
//! becomes a silent ENOSYS), a supervising sbx parent gone.

/// The notifier's process name (sbx-seccomp sets it with PR_SET_NAME).
pub const NOTIFIER_COMM: &str = "sbx-seccomp-ntf";

/// For a reaper (a PID-namespace init) before it reaps: when the next
/// exited child is the seccomp notifier and it died of a signal, logs a
/// `seccomp_notifier_died` alert (once per pid). Reaps nothing.
pub fn peek_exited() {
    static SAID: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());
    // SAFETY: a zeroed siginfo filled by waitid; WNOWAIT leaves the child
    // for the caller to reap.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: info is a live siginfo for the kernel to fill.
    let r = unsafe {
        libc::waitid(
            libc::P_ALL,
            0,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    if r != 0 {
        return;
    }
    // SAFETY: waitid filled a SIGCHLD siginfo.
    let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
    if pid <= 0 || !(info.si_code == libc::CLD_KILLED || info.si_code == libc::CLD_DUMPED) {
        return;
    }
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    if comm.trim_end() != NOTIFIER_COMM {
        return;
    }
    {
        let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
        if said.contains(&pid) {
            return;
        }
        said.push(pid);
    }
    crate::audit::emit(
        "seccomp_notifier_died",
        crate::Severity::Alert,
        serde_json::json!({
            "notifier_pid": pid,
            "signal": status,
            "effect": "later seccomp refusals fail with ENOSYS and are no longer logged",
        }),
    );
}

/// A supervising sbx parent died under us: the sandbox is being torn down.
pub fn supervisor_died(what: &str) {
    crate::audit::emit(
        "supervisor_died",
        crate::Severity::Alert,
        serde_json::json!({ "supervisor": what }),
    );
}

/// For a supervisor that reaped its child: a next sbx tool (a supervisor of
/// the rest of the chain) killed by a signal is an alert; the tools
/// themselves never die of a signal (they exit 128+N).
pub fn child_tool_exited(pid: i32, status: std::process::ExitStatus, child_is_sbx: bool) {
    use std::os::unix::process::ExitStatusExt;
    if !child_is_sbx {
        return;
    }
    if let Some(sig) = status.signal() {
        crate::audit::emit(
            "supervisor_died",
            crate::Severity::Alert,
            serde_json::json!({ "supervisor": "next sbx tool", "child_pid": pid, "signal": sig }),
        );
    }
}
