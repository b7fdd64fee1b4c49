//! The supervisor: validate, create the group, start the watcher, run the
//! command inside the group, wait, kill what is left, remove the group, log.

use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use sbx_core::supervise::{self, Supervisor, Wake};
use sbx_core::{Failure, Severity, audit, exit};

use crate::Cli;
use crate::discover::{self, Host};
use crate::group::{self, SandboxGroup};
use crate::leaf::Leaf;
use crate::limits::{Limits, Raw};
use crate::owner::{self, Owner};
use crate::rlimit::{self, Rlimit};
use crate::watch::Watcher;

/// Exit status when --timeout fired (as timeout(1)).
pub const TIMED_OUT: i32 = 124;

/// How long the kill loop may take before the group is reported unkillable.
const KILL_LIMIT: Duration = Duration::from_secs(10);

/// What is checked before anything is created on the host: a failure
/// here is one line on stderr, `setup_failed` in the audit log, exit 125.
pub struct Prepared {
    limits: Limits,
    layout: discover::Layout,
    targets: Vec<group::Target>,
    host: Host,
}

/// 1. Everything that can be checked without touching the host.
pub fn prepare(cli: &Cli) -> Result<Prepared, Failure> {
    let limits = Limits::parse(&Raw {
        memory: cli.spec.memory.as_deref(),
        memory_swap: cli.spec.memory_swap.as_deref(),
        cpus: cli.spec.cpus.as_deref(),
        cpu_weight: cli.spec.cpu_weight.as_deref(),
        pids: cli.spec.pids.as_deref(),
        io_weight: cli.spec.io_weight.as_deref(),
        rlimits: &cli.spec.rlimit,
        timeout: cli.spec.timeout.as_deref(),
    })?;
    rlimit::preflight(&limits.rlimits)?;
    if let Some(v) = &cli.spec.kill_after {
        sbx_core::supervise::parse_kill_after(v)?;
    }
    let host = Host::default();
    let layout = discover::discover(&host)?;
    let targets = match group::plan(&layout, cli.spec.parent.as_deref(), &limits) {
        Ok(t) => t,
        // Unprivileged without a delegated cgroup: --timeout, --rlimit and
        // --pids (RLIMIT_NPROC in a user namespace of the command's own)
        // need no cgroup; they run in no-cgroup mode. Limits that do need
        // one (memory, CPU, I/O) keep the error.
        Err(e @ group::GroupError::NotDelegated { .. }) => {
            if cli.spec.parent.is_some() || !crate::nocg::possible(&limits) {
                return Err(e.into());
            }
            Vec::new()
        }
        Err(e) => return Err(e.into()),
    };
    Ok(Prepared {
        limits,
        layout,
        targets,
        host,
    })
}

pub fn run(cli: &Cli, p: Prepared) -> Result<i32, Failure> {
    let Prepared {
        limits,
        layout,
        targets,
        host,
    } = p;
    let mut cmd = supervise::command(&cli.cmd, None)?;
    if targets.is_empty() {
        return crate::nocg::run(cli, cmd, &limits);
    }

    // 2. Stale groups of dead supervisors under the same parents, and
    // groups dead runs left without an owner record, wherever they are.
    if host.root == std::path::Path::new("/") {
        for d in owner::reap_registered() {
            audit::emit(
                "stale_group_reaped",
                Severity::Warn,
                serde_json::json!({
                    "cgroup": [d.display().to_string()],
                    "owner_record": false,
                    "removed": true,
                }),
            );
        }
    }
    owner::reap_stale(&targets, host.root == std::path::Path::new("/"));

    // 3. The group, then the watcher that removes it if we die.
    let id = sbx_core::id::get().unwrap_or("unknown").to_string();
    let name = format!("sbx-{id}");
    let me = Owner::me(&id);
    // v2: a supervisor alone in its delegated group steps into a leaf of it.
    let leaf = match targets.first() {
        Some(t) => Leaf::enter_if_needed(t, cli.spec.parent.is_none(), &name, &me, true)?,
        None => None,
    };
    let mut group = match SandboxGroup::create(&host, &targets, &name, &limits, &me) {
        Ok(g) => g,
        Err(e) => {
            leave(leaf.as_ref());
            return Err(e.into());
        }
    };
    // SAFETY: sbx-cgroup starts no thread: the supervisor is one thread.
    let watcher = match unsafe { Watcher::start(&group, leaf.clone()) } {
        Ok(w) => w,
        Err(e) => {
            let _ = group.destroy(KILL_LIMIT);
            leave(leaf.as_ref());
            return Err(Failure::new(format!("fork watcher: {e}")));
        }
    };
    tracing::info!(group = %name, watcher = watcher.pid(), mode = ?layout.mode(), "group created");

    // 4. The command joins the group and takes its rlimits before it execs.
    let mut keep = Vec::new();
    if let Some(fd) = audit::get().and_then(|a| a.handoff(cli.cmd[0].as_os_str(), &mut cmd)) {
        keep.push(fd);
    }
    install_pre_exec(&mut cmd, &group, limits.rlimits.clone());
    let started = Instant::now();
    let mut child = match Supervisor::spawn(cmd, &keep) {
        Ok(c) => c,
        Err(f) => {
            finish(group, watcher);
            leave(leaf.as_ref());
            return Err(f);
        }
    };
    group.close_procs();

    // 5. Wait for the command, the timeout or our own supervisor's death.
    let deadline = limits.timeout.map(|t| started + t);
    let mut timed_out = false;
    let code = {
        match child.wait(deadline) {
            Ok(Wake::Exited(st)) => exit::from_status(st),
            Ok(Wake::Deadline) => {
                // As timeout(1): SIGTERM first, so the layers inside unwind
                // and do their end-of-run work (sbx-fs's sweep, gitguard's
                // check), SIGKILL after the grace; then the group.
                timed_out = true;
                let _ = child.terminate(sbx_core::supervise::kill_after());
                let _ = group.kill_all(KILL_LIMIT);
                TIMED_OUT
            }
            Ok(Wake::ParentDied) => {
                let _ = group.kill_all(KILL_LIMIT);
                let st = child.kill().ok();
                st.map(exit::from_status).unwrap_or(exit::TOOL_FAILED)
            }
            Err(e) => {
                let _ = group.kill_all(KILL_LIMIT);
                let _ = child.kill();
                tracing::warn!("wait: {e}");
                exit::TOOL_FAILED
            }
        }
    };
    let wall = started.elapsed();

    // 6. Kill what is left (escapees), read the figures, remove the group.
    let left_before = group.pids().len();
    let kill_res = group.kill_all(KILL_LIMIT);
    let stats = group.stats();
    let cgroups: Vec<String> = group
        .dirs
        .iter()
        .map(|d| d.path.display().to_string())
        .collect();
    let killed = group.killed;
    let destroy_res = group.destroy(KILL_LIMIT);
    watcher.finish();
    leave(leaf.as_ref());

    let alert = stats.oom_kills > 0 || stats.pids_limit_hits > 0 || timed_out;
    let mut fields = serde_json::json!({
        "cgroup": cgroups,
        "mode": layout.mode(),
        "exit_code": code,
        "timed_out": timed_out,
        "wall_ms": wall.as_millis() as u64,
        "peak_memory_bytes": stats.peak_memory_bytes,
        "cpu_time_ns": stats.cpu_time_ns,
        "oom_kills": stats.oom_kills,
        "pids_limit_hits": stats.pids_limit_hits,
        "left_at_exit": left_before,
        "processes_killed": killed,
        "removed": destroy_res.is_ok(),
        "limits": limits_json(&limits),
    });
    if let Err(e) = kill_res.as_ref().and(destroy_res.as_ref()) {
        fields["cleanup_error"] = serde_json::Value::String(sbx_core::exit::error_chain(e));
    }
    audit::emit(
        "cgroup_summary",
        if alert {
            Severity::Alert
        } else {
            Severity::Info
        },
        fields,
    );
    if let Err(e) = destroy_res {
        sbx_core::cli::stderr_line(&format!(
            "{}: {}",
            crate::TOOL,
            sbx_core::escape::terminal(&sbx_core::exit::error_chain(&e))
        ));
    }
    Ok(code)
}

fn leave(leaf: Option<&Leaf>) {
    if let Some(Err(e)) = leaf.map(Leaf::leave) {
        sbx_core::cli::stderr_line(&format!(
            "{}: {}",
            crate::TOOL,
            sbx_core::escape::terminal(&sbx_core::exit::error_chain(&e))
        ));
    }
}

fn finish(mut group: SandboxGroup, watcher: Watcher) {
    let _ = group.destroy(KILL_LIMIT);
    watcher.finish();
}

pub(crate) fn limits_json(l: &Limits) -> serde_json::Value {
    serde_json::json!({
        "memory": l.memory,
        "memory_swap": l.memory_swap.or(l.memory),
        "cpu_quota_us": l.cpu_quota_us,
        "cpu_weight": l.cpu_weight,
        "pids": l.pids,
        "io_weight": l.io_weight,
        "rlimits": l.rlimits.iter().map(Rlimit::describe).collect::<Vec<_>>(),
        "timeout_ms": l.timeout.map(|t| t.as_millis() as u64),
    })
}

/// Between fork and exec (async-signal-safe only; Supervisor::spawn's own
/// hook then clears the signal mask, sets the parent-death signal and closes
/// fds): write "0" (= this
/// process) to each group's join file (`tasks` on v1, `cgroup.procs` on
/// v2: `group::join_file`), then set the rlimits. A failure is
/// reported on stderr and the child exits 125 before the command runs.
fn install_pre_exec(cmd: &mut std::process::Command, group: &SandboxGroup, rlimits: Vec<Rlimit>) {
    let fds = group.procs_fds();
    let join_msgs: Vec<Vec<u8>> = group
        .dirs
        .iter()
        .map(|d| format!("{}: cannot join cgroup {}\n", crate::TOOL, d.path.display()).into_bytes())
        .collect();
    let rl_msgs: Vec<Vec<u8>> = rlimits
        .iter()
        .map(|r| format!("{}: cannot set --rlimit {}\n", crate::TOOL, r.describe()).into_bytes())
        .collect();
    // SAFETY: the pre_exec closure only writes prepared buffers to open fds and calls setrlimit
    // (async-signal-safe).
    unsafe {
        cmd.pre_exec(move || {
            for (fd, msg) in fds.iter().zip(&join_msgs) {
                let r = libc::write(*fd, b"0".as_ptr().cast(), 1);
                if r != 1 {
                    libc::write(2, msg.as_ptr().cast(), msg.len());
                    libc::_exit(exit::TOOL_FAILED);
                }
            }
            for (r, msg) in rlimits.iter().zip(&rl_msgs) {
                if r.apply().is_err() {
                    libc::write(2, msg.as_ptr().cast(), msg.len());
                    libc::_exit(exit::TOOL_FAILED);
                }
            }
            Ok(())
        });
    }
}
