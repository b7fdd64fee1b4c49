//! No-cgroup mode (issue 16): an unprivileged caller without a delegated
//! cgroup still gets the limits that need no cgroup. `--timeout` and
//! `--rlimit` work as always; `--pids N` becomes RLIMIT_NPROC = N in a user
//! namespace of the command's own (since Linux 5.14 the count is per user
//! namespace, so only the sandbox's processes count, not the user's others;
//! verified by `tests/limits.rs`). sbx-cgroup is a child subreaper here, so
//! a double-forked escapee is reparented to it and killed at the end and at
//! the timeout. Memory, CPU and I/O limits need a cgroup and stay refused
//! (memory per process: `--rlimit data=SIZE` or `as=SIZE`).

use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use sbx_core::supervise::{Supervisor, Wake};
use sbx_core::{Failure, Severity, audit, exit};

use crate::Cli;
use crate::limits::Limits;
use crate::rlimit::Rlimit;
use crate::run::TIMED_OUT;

/// Whether every limit asked for works without a cgroup.
pub fn possible(l: &Limits) -> bool {
    l.memory.is_none()
        && l.memory_swap.is_none()
        && l.cpu_quota_us.is_none()
        && l.cpu_weight.is_none()
        && l.io_weight.is_none()
}

pub fn run(cli: &Cli, mut cmd: std::process::Command, limits: &Limits) -> Result<i32, Failure> {
    // SAFETY: prctl on this process; no pointers.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let mut keep = Vec::new();
    if let Some(fd) = audit::get().and_then(|a| a.handoff(cli.cmd[0].as_os_str(), &mut cmd)) {
        keep.push(fd);
    }
    install_pre_exec(&mut cmd, limits.rlimits.clone(), limits.pids);
    let started = Instant::now();
    let mut child = Supervisor::spawn(cmd, &keep)?;
    let deadline = limits.timeout.map(|t| started + t);
    let mut timed_out = false;
    let code = match child.wait(deadline) {
        Ok(Wake::Exited(st)) => exit::from_status(st),
        Ok(Wake::Deadline) => {
            timed_out = true;
            let _ = child.kill();
            TIMED_OUT
        }
        Ok(Wake::ParentDied) => child
            .kill()
            .ok()
            .map(exit::from_status)
            .unwrap_or(exit::TOOL_FAILED),
        Err(e) => {
            let _ = child.kill();
            tracing::warn!("wait: {e}");
            exit::TOOL_FAILED
        }
    };
    let wall = started.elapsed();
    let killed = kill_descendants(Duration::from_secs(10));
    let mut applied = vec!["rlimits", "timeout"];
    if limits.pids.is_some() {
        applied.push("pids (RLIMIT_NPROC in an own user namespace)");
    }
    audit::emit(
        "cgroup_summary",
        if timed_out {
            Severity::Alert
        } else {
            Severity::Info
        },
        serde_json::json!({
            "mode": "none",
            "note": "no delegated cgroup: limits that need none only; pids-limit hits and OOM kills are not observable",
            "applied": applied,
            "not_applied": ["memory", "memory_swap", "cpus", "cpu_weight", "io_weight"],
            "exit_code": code,
            "timed_out": timed_out,
            "wall_ms": wall.as_millis() as u64,
            "processes_killed": killed,
            "limits": crate::run::limits_json(limits),
        }),
    );
    Ok(code)
}

/// SIGKILLs and reaps every child left (orphans come to us: subreaper),
/// until none is left or `limit` passes. Returns how many were killed.
fn kill_descendants(limit: Duration) -> u64 {
    let me = std::process::id() as i32;
    let start = Instant::now();
    let mut killed = std::collections::HashSet::new();
    loop {
        // Reap whatever has exited, then list: a listed child is not reaped
        // before its signal below, so its pid cannot have been reused.
        // SAFETY: waitpid with a valid status pointer.
        while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
        let kids = children_of(me);
        if kids.is_empty() || start.elapsed() > limit {
            return killed.len() as u64;
        }
        for k in kids {
            // SAFETY: kill of a child of ours, listed after the last reaping
            // (its pid cannot be reused before we reap it).
            if unsafe { libc::kill(k, libc::SIGKILL) } == 0 {
                killed.insert(k);
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn children_of(me: i32) -> Vec<i32> {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{me}/task/{me}/children")) else {
        return Vec::new();
    };
    s.split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Between fork and exec (async-signal-safe only): with `--pids`, a user
/// namespace of the command's own (its uid and gid mapped to themselves)
/// and RLIMIT_NPROC = N in it; then the rlimits. A failure is one line on
/// stderr and exit 125 before the command runs.
fn install_pre_exec(cmd: &mut std::process::Command, rlimits: Vec<Rlimit>, pids: Option<u64>) {
    // SAFETY: plain getters.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let uid_map = format!("{uid} {uid} 1\n").into_bytes();
    let gid_map = format!("{gid} {gid} 1\n").into_bytes();
    let userns_msg = format!(
        "{}: --pids without a cgroup: cannot create a user namespace for RLIMIT_NPROC\n",
        crate::TOOL
    )
    .into_bytes();
    let rl_msgs: Vec<Vec<u8>> = rlimits
        .iter()
        .map(|r| format!("{}: cannot set --rlimit {}\n", crate::TOOL, r.describe()).into_bytes())
        .collect();
    // SAFETY: the hook runs in the forked child before exec and only calls
    // async-signal-safe functions on memory prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let fail = |msg: &[u8]| -> ! {
                libc::write(2, msg.as_ptr().cast(), msg.len());
                libc::_exit(exit::TOOL_FAILED)
            };
            if let Some(n) = pids {
                if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                    fail(&userns_msg);
                }
                for (path, data) in [
                    (c"/proc/self/setgroups", &b"deny"[..]),
                    (c"/proc/self/uid_map", &uid_map[..]),
                    (c"/proc/self/gid_map", &gid_map[..]),
                ] {
                    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 || libc::write(fd, data.as_ptr().cast(), data.len()) < 0 {
                        fail(&userns_msg);
                    }
                    libc::close(fd);
                }
                let r = libc::rlimit {
                    rlim_cur: n,
                    rlim_max: n,
                };
                if libc::setrlimit(libc::RLIMIT_NPROC, &r) != 0 {
                    fail(&userns_msg);
                }
            }
            for (r, msg) in rlimits.iter().zip(&rl_msgs) {
                if r.apply().is_err() {
                    fail(msg);
                }
            }
            Ok(())
        });
    }
}
