//! sbx-gvisor: the zero-trust tier without a latency constraint, gVisor.
//!
//! `runsc do` cannot express the grants (it shows the whole host file
//! system read-only, writes go to an in-memory overlay, nothing can be
//! hidden), so sbx-gvisor writes an OCI bundle into a private temporary
//! directory and runs it with `runsc run`:
//!
//! - `bundle.rs`: the mounts are sbx-fs's own mount plan
//!   (`sbx_fs::build_plan`) for the same `--rw`/`--ro`/`--deny` flags:
//!   system directories read-only, the grants, the default deny list, name
//!   patterns, the write-protected `.git`/`.claude` invariants; hidden files
//!   are covered by an empty mode-000 file, hidden directories by an empty
//!   mode-000 read-only tmpfs; mount points missing on the host are sbx-fs
//!   placeholders (created before, removed after, reaped if this process is
//!   killed); a read-only root (an empty directory), a fresh /tmp, /dev/shm
//!   and $HOME tmpfs, gVisor's own /proc and /dev; uid 0 inside with no
//!   capability at all and no_new_privs; rlimits (file size, processes,
//!   open files);
//! - `runsc.rs`: `--platform=ptrace`; the network: with `--host-network` the
//!   namespace runsc runs in (sbx-policy's chain puts sbx-gvisor inside
//!   sbx-net, so the sandbox gets sbx-net's filtered namespace, its
//!   allowlist, DNS proxy and alerts, through gVisor's own TCP/IP over host
//!   sockets), else `--network=none`; as root (`--cgroup-bin`) the whole
//!   sandbox (the gVisor kernel, its gofer and every stub process) runs
//!   inside `sbx-cgroup` with the tier's limits; the clean-up, also by a
//!   guardian (`sbx_core::guardian`) when this process is killed;
//! - `mountns.rs`: runsc's own mount namespace, in which every bind source
//!   is re-opened without symlinks, checked to be the inode sbx-fs checked
//!   on the host, and cloned onto a private entry the bundle names; the git
//!   stage (`--git-stage`), mounted there by the host's kernel;
//! - `execlog.rs`: the execute allowlist (`--allow-exec`): every mount
//!   noexec but the listed files; refused execs are read from runsc's exec
//!   trace;
//! - `stdio.rs`: a stdout or stderr that is a regular file is relayed.

use std::ffi::OsString;
use std::os::unix::fs::DirBuilderExt;
use std::time::Duration;

use clap::Parser;
use sbx_core::Failure;
use sbx_core::cli::CommonArgs;
use sbx_spec::GvisorSpec;

mod bundle;
mod execlog;
mod mountns;
mod runsc;
mod stdio;

pub const TOOL: &str = sbx_spec::gvisor::TOOL;

pub const MAN: sbx_core::man::ManInfo = sbx_core::man::ManInfo {
    about: "Runs CMD on gVisor's kernel (runsc --platform=ptrace) with the same grants as sbx-fs: it computes \
sbx-fs's mount plan for --rw, --ro and --deny (system directories read-only, the grants, the default deny list and \
name patterns, the write-protected .git and .claude invariants; mount points missing on the host are sbx-fs \
placeholders), writes an OCI bundle from it in a private temporary directory (a read-only empty root, hidden files \
covered by an empty mode-000 file and hidden directories by an empty mode-000 read-only tmpfs, /tmp, /dev/shm and \
$HOME tmpfs of --tmp-size, gVisor's own /proc and /dev, uid 0 inside with no capability and no_new_privs, rlimits) and \
runs it with runsc run. sbx-policy chain --trust zero runs it inside sbx-net with --host-network (the sandbox's \
network is sbx-net's filtered namespace through gVisor's own TCP/IP); alone, without --host-network, the sandbox has \
only gVisor's loopback and names fail at once (hosts: files, a resolv.conf on loopback). runsc runs in a mount \
namespace of its own in which every bind source is opened again without symlinks, must be the inode sbx-fs checked \
(else a bind_source_changed alert and 125) and is cloned onto a private entry the bundle names. With --git-stage the \
stage's overlay is mounted by the host's kernel in that namespace and .git bound from it; with --allow-exec every \
mount is noexec but the listed files (memfd_create refused), and refused execs are exec_denied alerts read from \
runsc's exec trace. As root with --cgroup-bin, runsc (gVisor's kernel, its gofer, every stub) runs inside sbx-cgroup \
with --memory, --pids, --cpus and --timeout; unprivileged, runsc --rootless, memory per process through RLIMIT_AS \
(enforced by gVisor's kernel) and the wall clock. The container and the directory are removed at the end, and by a \
guardian process when sbx-gvisor is killed.",
    exit_status: "The command's exit status, unchanged; 128+N when it was killed by signal N. 124 when --timeout \
fired (a timeout alert; sbx-cgroup's own 124 as root). 125 when sbx-gvisor itself failed: bad usage, a limit or size \
that does not parse, --runsc that is not a file, a grant that does not exist or was changed after the check, a command word that is not UTF-8, a set-up \
step refused (one line on stderr naming it; nothing is left on the host). 126 when CMD is found but not executable, 127 \
when it is not found (looked up before anything starts, in the PATH directories a bind makes visible).",
    inherited_state: "The command runs on gVisor's kernel, not the host's, in the OCI bundle's world: its mounts, \
its own PID, IPC, UTS and mount namespaces (and network namespace, without --host-network), uid 0 with no capability \
and no_new_privs (as root: host root without capabilities behind gVisor; unprivileged, runsc --rootless: the caller, \
whose files appear owned by 0), the rlimits RLIMIT_FSIZE (--fsize), RLIMIT_NPROC (--pids; under sbx-cgroup \
(--pids - 128) / 16, at least 8), RLIMIT_AS (--memory, without a cgroup), RLIMIT_NOFILE (the caller's) and RLIMIT_CORE 0. \
The environment is sbx-fs's allowlist (PATH, HOME, TERM, LANG, LC_*, TZ, USER...; secret-looking names dropped with a \
warning), --pass-env names, SBX_PASS_ENV's, or the whole environment with --keep-env; TMPDIR becomes /tmp. The command \
gets no terminal: fds 0, 1 and 2 are passed through (a stdout or stderr that is a regular file through a pipe copied \
to it, which keeps its offset and O_APPEND); no other fd. The audit log stays with sbx-gvisor (and sbx-cgroup).",
    environment: "- SBX_GVISOR_DEBUG_LOG: a directory where runsc writes its debug logs (for a sandbox that does not start).\n- TMPDIR: where the private directory goes when every directory on its path can be traversed by others (runsc's sandbox process makes its chroot there); else /tmp.",
    extra: &[
        (
            "CLEAN-UP",
            "The private directory (sbx-gvisor-XXXXXX, mode 0711, the bundle and runsc's state 0700 inside) holds \
runsc's state. After the command, the container is deleted (runsc delete --force) and the directory removed. A \
guardian process (sbx_core::guardian: its own session, outside the cgroup) does the same when sbx-gvisor is gone \
without having done it (SIGKILL) and logs supervisor_died; runsc's sandbox is attached, so it dies with runsc. Signals \
are forwarded to runsc (and by it to the command).",
        ),
        (
            "AUDIT",
            "gvisor_start (info: runsc, container, dir, rootless, platform, network, cgroup, mounts, binds, command); \
exec_denied (alert: path, program, syscall, enforced_by \"gvisor noexec mounts\"; beyond 20 one event with suppressed); \
timeout (alert) when the wall clock fired without sbx-cgroup; bind_source_changed (alert: path) when a bind source is \
not the inode checked on the host; env_secret_dropped (warn); supervisor_died (warn) from \
the guardian; sbx-cgroup's events as root.",
        ),
        (
            "EXAMPLES",
            "sbx-gvisor --runsc /usr/bin/runsc --rw \"$PWD\" --chdir \"$PWD\" -- make test\n\n\
sbx-net --allow example.com -- sbx-gvisor --runsc /usr/bin/runsc --host-network --rw \"$PWD\" -- curl https://example.com/\n\n\
sbx-policy chain --print --trust zero -- make test",
        ),
    ],
};

/// sbx-gvisor's flags: the common ones, the tier's spec, the command.
#[derive(Parser, Debug)]
#[command(
    name = "sbx-gvisor",
    version,
    about = "Run a command on gVisor's kernel (runsc) with sbx-fs's grants, denies and invariants; always cleaned up"
)]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonArgs,

    /// The grants and limits (sbx-spec's GvisorSpec: one definition for
    /// these flags, `--config` and sbx-policy's chain).
    #[command(flatten)]
    pub spec: GvisorSpec,

    /// The command to run inside.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<OsString>,
}

pub(crate) fn os<S: AsRef<std::ffi::OsStr>>(s: S) -> OsString {
    s.as_ref().to_os_string()
}

pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

pub(crate) fn egid() -> u32 {
    // SAFETY: getegid cannot fail.
    unsafe { libc::getegid() }
}

/// The steps: check the flags and the command, make the private
/// directory and its guardian, run the bundle, clean up.
pub fn run(a: Cli) -> Result<i32, Failure> {
    let tmp_size = sbx_core::units::parse_size(&a.spec.tmp_size)
        .map_err(|e| Failure::new(format!("--tmp-size {}: {e}", a.spec.tmp_size)))?;
    let timeout: Option<Duration> = match &a.spec.timeout {
        Some(t) => Some(
            sbx_core::units::parse_duration(t)
                .map_err(|e| Failure::new(format!("--timeout {t}: {e}")))?,
        ),
        None => None,
    };
    if !a.spec.runsc.is_file() {
        return Err(Failure::new(format!(
            "--runsc {}: no such file",
            a.spec.runsc.display()
        )));
    }
    bundle::env_policy(&a)?;
    let plan = bundle::fs_plan(&a)?;
    bundle::check_command(&a.cmd[0], &plan)?;

    // The guardian is forked before the private directory exists, knowing
    // its name: a SIGKILL at any moment after the mkdir finds it there to
    // remove the directory (it was forked after the mkdir before, and a
    // SIGKILL in between left the directory in the temp dir for good).
    let base = runsc::temp_base();
    let mut made = None;
    for _ in 0..8 {
        let dir = base.join(format!("sbx-gvisor-{}", sbx_core::id::random_suffix()));
        let id = format!(
            "sbx-{}-{}",
            std::process::id(),
            dir.file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("x")
                .trim_start_matches("sbx-gvisor-")
        );
        let state = dir.join("state");
        // SAFETY: sbx-gvisor has one thread here: the threads (stdio relay,
        // exec log reader) start later, in run_in.
        let guardian = unsafe { runsc::start_guardian(&a.spec.runsc, &state, &id, &dir) }?;
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {
                made = Some((dir, id, state, guardian));
                break;
            }
            // Not ours: the guardian must not touch it.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                guardian.release_and_reap();
            }
            Err(e) => {
                guardian.release_and_reap();
                return Err(Failure::new(format!("temporary directory: {e}")));
            }
        }
    }
    let Some((dir, id, state, guardian)) = made else {
        return Err(Failure::new(format!(
            "temporary directory in {}: every new name was taken",
            base.display()
        )));
    };
    sbx_core::registry::test_kill_point("gvisor-dir-made");
    let r = runsc::run_in(&a, &plan, &dir, &state, &id, tmp_size, timeout);
    runsc::teardown(&a.spec.runsc, &state, &id, &dir);
    guardian.release_and_reap();
    r
}

pub fn main() -> ! {
    sbx_core::cli::run_main(TOOL, || {
        let cli: Cli = sbx_core::cli::parse(TOOL)?;
        sbx_core::cli::init(TOOL, &cli.common)?;
        run(cli)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }
}
