//! sbx-cgroup's flags.

use std::ffi::OsString;

use serde::{Deserialize, Serialize};

use crate::Argv;

pub const TOOL: &str = "sbx-cgroup";

/// The limits sbx-cgroup applies: every flag but the command.
#[derive(clap::Args, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct CgroupSpec {
    /// Hard memory limit (e.g. 512M, 2G); the OOM killer acts inside the group only.
    #[arg(long, value_name = "SIZE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,

    /// Memory + swap total (at least --memory). Default: no swap beyond --memory.
    #[arg(long, value_name = "SIZE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_swap: Option<String>,

    /// CPU quota in CPUs (e.g. 0.5, 2).
    #[arg(long, value_name = "N.N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpus: Option<String>,

    /// Relative CPU weight, 1-10000 (default 100).
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_weight: Option<String>,

    /// Maximum number of processes and threads in the group (fork-bomb limit).
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pids: Option<String>,

    /// Relative I/O weight, 1-10000, where the hierarchy has it.
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io_weight: Option<String>,

    /// A resource limit for the command, NAME=SOFT[:HARD] (repeatable), e.g. nofile=1024, fsize=100M, core=0.
    #[arg(long = "rlimit", value_name = "NAME=SOFT[:HARD]")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rlimit: Vec<String>,

    /// Wall-clock limit (30s, 5m, 1h30m); then the whole group is killed (exit 124).
    #[arg(long, value_name = "DURATION")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,

    /// After a forwarded SIGTERM/SIGINT/SIGHUP/SIGQUIT, SIGKILL the command if it still runs this long after (default 10s, or SBX_KILL_AFTER; 0 = at once).
    #[arg(long, value_name = "DURATION")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kill_after: Option<String>,

    /// Parent cgroup: absolute cgroup path, or relative to the caller's own cgroup. Default: the caller's own.
    #[arg(long, value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

impl CgroupSpec {
    /// sbx-cgroup's flags for this spec (before `-- CMD`).
    pub fn args(&self) -> Vec<OsString> {
        Argv::default()
            .opt("--memory", self.memory.as_ref())
            .opt("--memory-swap", self.memory_swap.as_ref())
            .opt("--pids", self.pids.as_ref())
            .opt("--cpus", self.cpus.as_ref())
            .opt("--cpu-weight", self.cpu_weight.as_ref())
            .opt("--io-weight", self.io_weight.as_ref())
            .opt("--timeout", self.timeout.as_ref())
            .opt("--kill-after", self.kill_after.as_ref())
            .each("--rlimit", &self.rlimit)
            .opt("--parent", self.parent.as_ref())
            .done()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_round_trips() {
        let full = CgroupSpec {
            memory: Some("1G".into()),
            memory_swap: Some("2G".into()),
            cpus: Some("1.5".into()),
            cpu_weight: Some("50".into()),
            pids: Some("100".into()),
            io_weight: Some("10".into()),
            rlimit: vec!["fsize=8G".into(), "data=1G".into()],
            timeout: Some("1h".into()),
            kill_after: Some("0".into()),
            parent: Some("/x".into()),
        };
        crate::roundtrip::check(&full, full.args());
        crate::roundtrip::check(&CgroupSpec::default(), Vec::new());
    }
}
