//! runsc: its flags, the private directory's life, the supervision and
//! the clean-up (also after a SIGKILL, by the guardian).

use std::ffi::OsString;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sbx_core::guardian::{Ending, Guardian, Watch};
use sbx_core::supervise::{Supervisor, Wake};
use sbx_core::{Failure, Severity};
use sbx_fs::plan::Plan;
use serde_json::{Value, json};

use crate::bundle::{Bundle, config, mounts};
use crate::execlog::ExecLog;
use crate::mountns::RunscNs;
use crate::stdio::StdioRelay;
use crate::{Cli, euid, os};

/// Exit status when the wall-clock limit fired (as timeout(1), sbx-cgroup).
const TIMED_OUT: i32 = 124;

/// runsc's global flags.
fn runsc_globals(state: &Path, host_network: bool) -> Vec<OsString> {
    let mut v = Vec::new();
    if euid() != 0 {
        v.push(os("--rootless"));
    }
    v.extend([
        os("--root"),
        os(state),
        os("--platform=ptrace"),
        os(if host_network {
            "--network=host"
        } else {
            "--network=none"
        }),
        os("--ignore-cgroups"),
    ]);
    // runsc's own debug logs, for diagnosing a sandbox that does not start.
    if let Some(d) = std::env::var_os("SBX_GVISOR_DEBUG_LOG") {
        let mut dir = d;
        dir.push("/");
        v.push(os("--debug"));
        let mut f = os("--debug-log=");
        f.push(dir);
        v.push(f);
    }
    v
}

/// Deletes the container (if runsc still knows it) and the directory.
pub(crate) fn teardown(runsc: &Path, state: &Path, id: &str, dir: &Path) {
    if state.join(id).exists() || std::fs::read_dir(state).is_ok_and(|mut d| d.next().is_some()) {
        let _ = Command::new(runsc)
            .args(runsc_globals(state, false))
            .args(["delete", "--force", id])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    // The sandbox shaped parts of it: at any depth (sbx_core::rmtree).
    let _ = sbx_core::rmtree::remove_tree(dir);
}

pub(crate) fn pipe() -> Result<(OwnedFd, OwnedFd), Failure> {
    sbx_core::fds::pipe().map_err(|e| Failure::new(format!("pipe: {e}")))
}

/// The guardian (sbx_core::guardian), forked before the directory is made:
/// when this process is gone without
/// having cleaned up (SIGKILL), it deletes the container and removes the
/// directory (a supervisor_died event). It runs in a session of its own
/// (a signal to the caller's process group does not end it, and the
/// forwarded signals stay blocked in it as here), holds no fd of the
/// caller's but /dev/null and the audit log, and stays outside sbx-cgroup
/// (which only runsc is started in).
///
/// # Safety
/// The calling process must have one thread (see `Guardian::spawn`).
pub(crate) unsafe fn start_guardian(
    runsc: &Path,
    state: &Path,
    id: &str,
    dir: &Path,
) -> Result<Guardian, Failure> {
    let body = |w: Watch| {
        // SAFETY: plain syscalls on this forked process: a new session,
        // and a cwd that holds no mount point busy.
        unsafe {
            libc::setsid();
            libc::chdir(c"/".as_ptr());
        }
        let mut keep = w.fds();
        keep.extend(sbx_core::audit::get().and_then(|a| a.raw_fd()));
        sbx_core::fds::close_all_except(&keep);
        sbx_core::fds::stdio_to_dev_null();
        if w.wait() == Ending::Released {
            return 0;
        }
        // Forked before the directory was made: a path there that is not
        // a directory of ours is another's (the owner died before its
        // mkdir, or its mkdir found the name taken): left alone.
        let ours = std::fs::symlink_metadata(dir).map(|m| {
            use std::os::unix::fs::MetadataExt;
            m.is_dir() && m.uid() == crate::euid()
        });
        if matches!(ours, Ok(false)) {
            return 0;
        }
        teardown(runsc, state, id, dir);
        sbx_core::audit::emit(
            "supervisor_died",
            Severity::Warn,
            json!({"container": id, "dir": dir, "removed": !dir.exists()}),
        );
        0
    };
    // SAFETY: the caller promises a single thread.
    unsafe { Guardian::spawn(body) }
        .map_err(|e| Failure::new(format!("the clean-up guardian: fork: {e}")))
}

/// Where the private directory goes: $TMPDIR when every directory on its
/// path can be traversed by others (runsc's sandbox process, an
/// unprivileged user, makes its chroot in a subdirectory), else /tmp.
pub(crate) fn temp_base() -> PathBuf {
    let t = std::env::temp_dir();
    let ok = t.is_absolute()
        && t.ancestors().all(|a| {
            std::fs::metadata(a).is_ok_and(|m| m.is_dir() && m.permissions().mode() & 0o001 != 0)
        });
    if ok { t } else { PathBuf::from("/tmp") }
}

pub(crate) fn run_in(
    a: &Cli,
    plan: &Plan,
    dir: &Path,
    state: &Path,
    id: &str,
    tmp_size: u64,
    timeout: Option<Duration>,
) -> Result<i32, Failure> {
    let io = |what: &Path, e: std::io::Error| Failure::new(format!("{}: {e}", what.display()));
    let b = Bundle {
        dir: dir.join("bundle"),
        rootfs: dir.join("bundle/rootfs"),
        denied_file: dir.join("denied"),
        empty_file: dir.join("empty"),
        gitview: a.spec.git_stage.as_ref().map(|_| dir.join("gitview")),
        binds: dir.join("binds"),
        noexec: !a.spec.allow_exec.is_empty(),
        // uid 0 inside, as root and unprivileged: runsc --rootless shows
        // the caller's files as owned by 0 (its gofer runs in a user
        // namespace mapping the caller to 0), so uid 0 is the caller there;
        // another uid could not write them and git would call the
        // repository dubious. A user namespace in the bundle is refused by
        // rootless runsc.
        owner: (0, 0),
    };
    std::fs::create_dir_all(&b.rootfs).map_err(|e| io(&b.rootfs, e))?;
    std::fs::create_dir(state).map_err(|e| io(state, e))?;
    for (f, mode) in [(&b.denied_file, 0o000), (&b.empty_file, 0o444)] {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(f)
            .map_err(|e| io(f, e))?;
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(mode)).map_err(|e| io(f, e))?;
    }
    // Mount points missing on the host, inside the binds: sbx-fs's
    // placeholders, reaped if we are killed.
    let mut ph = sbx_fs::host_placeholders(plan, Default::default())?;
    if let Err(e) = ph.start_reaper() {
        ph.cleanup();
        return Err(e.into());
    }
    let r = (|| {
        let mounts = mounts(plan, &b, tmp_size, &a.spec.allow_exec, a.spec.host_network)?;
        let cfg = config(a, mounts, b.owner)?;
        let text = serde_json::to_string_pretty(&cfg).map_err(|e| Failure::new(e.to_string()))?;
        let cfg_path = b.dir.join("config.json");
        std::fs::write(&cfg_path, text).map_err(|e| io(&cfg_path, e))?;
        // runsc's sandbox process (an unprivileged user as root) makes its
        // chroot on $TMPDIR: an empty directory of ours it can reach; the
        // rest (bundle, state) stays private to the caller.
        let chroot = dir.join("chroot");
        std::fs::create_dir(&chroot).map_err(|e| io(&chroot, e))?;
        std::fs::set_permissions(&chroot, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| io(&chroot, e))?;
        for (d, mode) in [
            (&b.dir, 0o700),
            (&state.to_path_buf(), 0o700),
            (&dir.to_path_buf(), 0o711),
        ] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode))
                .map_err(|e| io(d, e))?;
        }
        let ns = RunscNs::new(plan, &b.binds, b.gitview.as_deref())?;
        supervise(a, &b, state, id, &cfg, timeout, &ph, ns)
    })();
    let left = ph.cleanup();
    if !left.is_empty() {
        tracing::warn!(
            ?left,
            "placeholders left (still in use by another sandbox?)"
        );
    }
    r
}

#[allow(clippy::too_many_arguments)]
fn supervise(
    a: &Cli,
    b: &Bundle,
    state: &Path,
    id: &str,
    cfg: &Value,
    timeout: Option<Duration>,
    ph: &sbx_fs::placeholder::Placeholders,
    ns: RunscNs,
) -> Result<i32, Failure> {
    let mut argv: Vec<OsString> = Vec::new();
    if let Some(c) = &a.spec.cgroup_bin {
        argv.push(os(c));
        argv.extend(
            sbx_spec::CgroupSpec {
                memory: a.spec.memory.clone(),
                pids: a.spec.pids.map(|n| n.to_string()),
                cpus: a.spec.cpus.clone(),
                timeout: a.spec.timeout.clone(),
                ..sbx_spec::CgroupSpec::default()
            }
            .args(),
        );
        argv.push(os("--"));
    }
    argv.push(os(&a.spec.runsc));
    argv.extend(runsc_globals(state, a.spec.host_network));
    let execlog = if b.noexec {
        let (log, w) = ExecLog::start(&b.dir.parent().unwrap_or(&b.dir).join("exec.log"))?;
        argv.extend(w);
        Some(log)
    } else {
        None
    };
    argv.extend([os("run"), os("--bundle"), os(&b.dir), os(id)]);
    let mut cmd = sbx_core::supervise::command(&argv, None)?;
    let report = ns.install(&mut cmd)?;
    cmd.env_remove("SBX_AUDIT_FD");
    cmd.env("TMPDIR", b.dir.parent().unwrap_or(&b.dir).join("chroot"));
    let mut keep: Vec<RawFd> = ph.fds();
    if let Some(au) = sbx_core::audit::get()
        && let Some(fd) = au.handoff(&argv[0], &mut cmd)
    {
        keep.push(fd);
    }
    sbx_core::audit::emit(
        "gvisor_start",
        Severity::Info,
        json!({
            "runsc": a.spec.runsc,
            "container": id,
            "dir": b.dir.parent(),
            "rootless": euid() != 0,
            "platform": "ptrace",
            "network": if a.spec.host_network { "sbx-net (runsc --network=host in its namespace)" } else { "none" },
            "cgroup": a.spec.cgroup_bin.is_some(),
            "mounts": cfg["mounts"].as_array().map(|m| m.len()).unwrap_or(0),
            "binds": cfg["mounts"].as_array().map(|m| m.iter()
                .filter(|x| x["type"] == "bind" && x["source"] != json!(b.denied_file) && x["source"] != json!(b.empty_file))
                .map(|x| format!("{} {}", x["options"][1].as_str().unwrap_or(""), x["destination"].as_str().unwrap_or("")))
                .collect::<Vec<_>>()).unwrap_or_default(),
            "command": sbx_core::chain::show(&a.cmd),
        }),
    );
    let relay = StdioRelay::start(&mut cmd)?;
    // Tests only: the window between the plan and runsc's start, held open
    // until the test closes the FIFO (a source swapped in it is refused).
    if let Some(f) = std::env::var_os("SBX_TEST_GVISOR_PAUSE_FIFO") {
        let _ = std::fs::read(f);
    }
    let mut child = match Supervisor::spawn(cmd, &keep) {
        Ok(c) => c,
        Err(f) => return Err(report.failure(f)),
    };
    drop(report);
    let status = wait_runsc(&mut child, a, id, timeout);
    relay.finish();
    if let Some(l) = execlog {
        l.report(id);
    }
    status
}

/// Waits for runsc (and enforces the wall clock when no sbx-cgroup does).
fn wait_runsc(
    child: &mut Supervisor,
    a: &Cli,
    id: &str,
    timeout: Option<Duration>,
) -> Result<i32, Failure> {
    // Without sbx-cgroup the wall clock is watched here.
    let deadline = match (&a.spec.cgroup_bin, timeout) {
        (None, Some(t)) => Some(Instant::now() + t),
        _ => None,
    };
    let io = |e: std::io::Error| Failure::new(format!("waiting for runsc: {e}"));
    match child.wait(deadline).map_err(io)? {
        Wake::Exited(st) => Ok(sbx_core::exit::from_status(st)),
        Wake::Deadline => {
            sbx_core::audit::emit(
                "timeout",
                Severity::Alert,
                json!({"timeout_ms": timeout.map(|t| t.as_millis() as u64), "container": id}),
            );
            child.terminate(Duration::from_secs(5)).map_err(io)?;
            Ok(TIMED_OUT)
        }
        Wake::ParentDied => {
            child.kill().map_err(io)?;
            Ok(sbx_core::exit::TOOL_FAILED)
        }
    }
}
