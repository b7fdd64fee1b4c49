//! sbx-cgroup: runs a command in its own cgroup with limits on memory, CPU,
//! processes and I/O weight, plus rlimits and a wall-clock timeout; kills
//! everything left in the group at the end and logs the figures.
//!
//! Modules: [`limits`] and [`rlimit`] validate the options, [`discover`]
//! finds the hierarchies (v1, v2, hybrid) through a filesystem seam,
//! [`group`] creates, limits, measures, kills and removes the group,
//! [`owner`] records who owns a group and reaps stale ones, [`watch`] is the
//! process that cleans up when the supervisor is killed, [`run`] ties them
//! together.

use std::ffi::OsString;

use clap::Parser;
use sbx_core::cli::CommonArgs;

pub mod applies;
pub mod discover;
pub mod group;
pub mod leaf;
pub mod limits;
mod nocg;
pub mod owner;
mod rlimit;
mod run;
mod watch;

pub const TOOL: &str = "sbx-cgroup";

pub const MAN: sbx_core::man::ManInfo = sbx_core::man::ManInfo {
    about: "Runs CMD in a new cgroup, <parent>/sbx-<SBX_ID>, created in every cgroup hierarchy it needs \
(cgroup v1, v2 or hybrid), with the limits given: memory (the OOM killer acts inside the group only; \
no swap beyond the limit unless --memory-swap says otherwise), CPU quota and weight, number of processes, \
I/O weight, resource limits (rlimits) and a wall-clock timeout. The command joins the group before it \
executes, so nothing it starts can be outside. sbx-cgroup supervises it: signals it receives are forwarded, \
and when the command exits (or the timeout fires) every process left in the group is killed \
(cgroup.kill on v2; on v1 the group is frozen, each process gets SIGKILL, the group is thawed, until it is empty), \
the group is removed and one audit event, cgroup_summary, records peak memory, CPU time, OOM kills, \
how often the pids limit was hit and whether the timeout fired. An OOM kill, a pids-limit hit or a timeout \
make it an alert.",
    exit_status: "The command's exit status, unchanged; 128+N when it was killed by signal N (137 after an OOM kill). \
124 when --timeout fired (the group was killed). 125 when sbx-cgroup itself failed: bad usage (one line on stderr, \
nothing created), no delegated cgroup, a limit the host cannot apply (the group is removed again). \
126 when CMD was found but could not be executed, 127 when it was not found.",
    inherited_state: "The command runs in the new group in every hierarchy used (v1: memory, pids, cpuacct, freezer, \
plus cpu and blkio when their limits are asked for; v2: the one group), with the rlimits given and the rest of the \
caller's. Its environment and fds 0-2 are the caller's; other fds are closed, except the audit log's, handed on \
only to a next sbx tool (SBX_AUDIT_FD). SBX_ID is set if it was not. The command cannot write the audit log.",
    environment: "- XDG_RUNTIME_DIR: the systemd user manager's socket, for a delegated scope on pure cgroup v2 when not root.",
    extra: &[
        (
            "CGROUP PARENT",
            "By default the group is created under the caller's own cgroup in each hierarchy (read from /proc/self/cgroup), \
so the host's limits and accounting still cover the sandbox. --parent PATH names another parent: an absolute PATH is \
a cgroup path as in /proc/self/cgroup (the same path in every hierarchy), a relative PATH is taken below the caller's \
own cgroup in each hierarchy. The parent must exist and be writable by the caller (delegated); sbx-cgroup never creates \
it and never moves a process out of the tree it started in.\n\n\
On cgroup v2 the parent must be delegated (cgroup.procs and cgroup.subtree_control writable) and offer the controllers \
the limits need in cgroup.controllers; sbx-cgroup enables memory, pids (and cpu, io when asked) in its \
cgroup.subtree_control, the one write it makes to a group it did not create. cgroup v2 refuses controllers to a group \
that holds processes: when sbx-cgroup is the only process in its own delegated group (as with \
systemd-run --user --scope -p Delegate=yes sbx-cgroup ...), it moves itself into a leaf of that group, \
<own>/sbx-<SBX_ID>.supervisor, for the run, and at the end disables the controllers it enabled, moves back and removes \
the leaf. With other processes in the group it fails: pass --parent a delegated group without processes. \
On a hybrid host the controllers on v1 are used.",
        ),
        (
            "CLEAN-UP WHEN KILLED",
            "Before the command starts, sbx-cgroup forks a small watcher that stays outside the sandbox group, in its own \
session, joined by a pipe only the supervisor holds. If sbx-cgroup is killed (even by SIGKILL) the pipe reaches \
end-of-file and the watcher kills everything in the group, removes it and logs supervisor_died. The command itself \
also gets SIGKILL at once (parent-death signal). If the watcher is killed too, the next sbx-cgroup to use the same \
parent removes the stale group: every group carries an extended attribute (trusted.sbx.owner, or user.sbx.owner \
when not root) naming the supervisor's pid and start time, and an sbx-* group whose owner no longer runs is killed \
and removed (stale_group_reaped). Groups without that attribute are never touched.",
        ),
        (
            "LIMITS",
            "--memory SIZE: memory.limit_in_bytes (v1) or memory.max (v2). --memory-swap SIZE: memory plus swap \
(memory.memsw.limit_in_bytes; v2 memory.swap.max = SIZE - memory); default: equal to --memory, no swap. \
--cpus N.N: a CFS quota of N.N x 100ms per 100ms. --cpu-weight N (1-10000, default 100): cpu.weight, or \
cpu.shares = N x 1024 / 100 on v1. --pids N: pids.max. --io-weight N (1-10000): io.weight or io.bfq.weight, \
blkio.weight or blkio.bfq.weight on v1 (10-1000, 100 maps to 500); an error when the host's I/O scheduler has no weights. \
--rlimit NAME=SOFT[:HARD] for as, core, cpu, data, fsize, locks, memlock, msgqueue, nice, nofile, nproc, rss, rtprio, \
rttime, sigpending, stack; sizes take suffixes (fsize=100M), cpu takes seconds or a duration, 'unlimited' is accepted; \
checked before anything is created. --timeout DURATION: wall clock (30s, 5m, 1h30m), then SIGTERM to the command and SIGKILL after --kill-after (as timeout(1)), then the whole group is killed.",
        ),
    ],
};

/// sbx-cgroup's flags.
#[derive(Parser, Debug)]
#[command(
    name = "sbx-cgroup",
    version,
    about = "Run a command in its own cgroup with memory, CPU, process and I/O limits; kill everything left at the end"
)]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonArgs,

    /// The limits (the flags; sbx-spec).
    #[command(flatten)]
    pub spec: sbx_spec::CgroupSpec,

    /// The command to run.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<OsString>,
}

pub fn main() -> ! {
    sbx_core::cli::run_main(TOOL, || {
        let cli: Cli = sbx_core::cli::parse(TOOL)?;
        sbx_core::cli::init(TOOL, &cli.common)?;
        let prepared = run::prepare(&cli)?;
        run::run(&cli, prepared)
    })
}
