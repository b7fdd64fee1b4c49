//! sbx-gvisor's flags: the gVisor tier's grants and limits.

use std::ffi::OsString;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{Argv, is_false, osv};

/// The binary that runs the gVisor tier.
pub const TOOL: &str = "sbx-gvisor";

/// Default of `--tmp-size`.
pub const DEFAULT_TMP_SIZE: &str = "1G";

/// sbx-gvisor: every flag but the command.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct GvisorSpec {
    /// The runsc binary.
    #[arg(long, value_name = "PATH")]
    pub runsc: PathBuf,
    /// Run runsc inside sbx-cgroup (this binary) with the limits below.
    #[arg(long, value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup_bin: Option<PathBuf>,
    /// Bind SRC read-only (as sbx-fs --ro).
    #[arg(long, value_name = "SRC")]
    #[serde(with = "osv", skip_serializing_if = "Vec::is_empty")]
    pub ro: Vec<OsString>,
    /// Bind SRC writable (as sbx-fs --rw).
    #[arg(long, value_name = "SRC")]
    #[serde(with = "osv", skip_serializing_if = "Vec::is_empty")]
    pub rw: Vec<OsString>,
    /// Hide PATH (as sbx-fs --deny).
    #[arg(long, value_name = "PATH")]
    #[serde(with = "osv", skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<OsString>,
    /// Working directory inside.
    #[arg(long, value_name = "DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chdir: Option<PathBuf>,
    /// Size of the /tmp, /dev/shm and $HOME tmpfs inside.
    #[arg(long, value_name = "SIZE", default_value = DEFAULT_TMP_SIZE)]
    #[serde(skip_serializing_if = "is_default_tmp_size")]
    pub tmp_size: String,
    /// Memory limit: of the whole sandbox under --cgroup-bin, else per
    /// process (RLIMIT_AS, enforced by gVisor's kernel).
    #[arg(long, value_name = "SIZE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    /// Processes and threads: sbx-cgroup's pids limit under --cgroup-bin;
    /// RLIMIT_NPROC inside ((N - 128) / 16 under --cgroup-bin, at least 8).
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
    /// CPU limit in CPUs (under --cgroup-bin).
    #[arg(long, value_name = "N.N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpus: Option<String>,
    /// Wall-clock limit: the run ends with 124 (a timeout alert).
    #[arg(long, value_name = "DURATION")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// The execute allowlist (as sbx-seccomp --allow-exec): every mount is
    /// noexec but these files (and the dynamic loaders).
    #[arg(long, value_name = "PATH")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allow_exec: Vec<PathBuf>,
    /// A git stage made by sbx-gitguard run --stage (as sbx-fs --git-stage).
    #[arg(long, value_name = "DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub git_stage: Option<PathBuf>,
    /// Largest file the command may write (RLIMIT_FSIZE).
    #[arg(long, value_name = "SIZE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fsize: Option<String>,
    /// Pass the caller's variable NAME (or PREFIX*) too (as sbx-fs --pass-env).
    #[arg(long, value_name = "NAME|PREFIX*")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pass_env: Vec<String>,
    /// Pass the caller's whole environment (as sbx-fs --keep-env).
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub keep_env: bool,
    /// Give the sandbox the network namespace runsc runs in, through
    /// gVisor's own network stack over host sockets (runsc --network=host),
    /// instead of none. The chain runs this step inside sbx-net, so what
    /// the sandbox reaches is sbx-net's filtered namespace: its allowlist,
    /// DNS proxy and alerts.
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub host_network: bool,
}

fn is_default_tmp_size(s: &str) -> bool {
    s == DEFAULT_TMP_SIZE
}

impl Default for GvisorSpec {
    fn default() -> Self {
        GvisorSpec {
            runsc: PathBuf::new(),
            cgroup_bin: None,
            ro: Vec::new(),
            rw: Vec::new(),
            deny: Vec::new(),
            chdir: None,
            tmp_size: DEFAULT_TMP_SIZE.into(),
            memory: None,
            pids: None,
            cpus: None,
            timeout: None,
            allow_exec: Vec::new(),
            git_stage: None,
            fsize: None,
            pass_env: Vec::new(),
            keep_env: false,
            host_network: false,
        }
    }
}

impl GvisorSpec {
    /// The flags (before `-- CMD`).
    pub fn args(&self) -> Vec<OsString> {
        Argv::default()
            .val("--runsc", &self.runsc)
            .switch("--host-network", self.host_network)
            .opt("--cgroup-bin", self.cgroup_bin.as_ref())
            .opt("--git-stage", self.git_stage.as_ref())
            .each("--allow-exec", &self.allow_exec)
            .each("--rw", &self.rw)
            .each("--ro", &self.ro)
            .each("--deny", &self.deny)
            .each("--pass-env", &self.pass_env)
            .switch("--keep-env", self.keep_env)
            .opt("--chdir", self.chdir.as_ref())
            .unless_default("--tmp-size", &self.tmp_size, DEFAULT_TMP_SIZE.into())
            .opt("--memory", self.memory.as_ref())
            .opt("--pids", self.pids.map(|n| n.to_string()))
            .opt("--cpus", self.cpus.as_ref())
            .opt("--timeout", self.timeout.as_ref())
            .opt("--fsize", self.fsize.as_ref())
            .done()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_round_trips() {
        let full = GvisorSpec {
            runsc: "/usr/bin/runsc".into(),
            cgroup_bin: Some("/b/sbx-cgroup".into()),
            ro: vec!["/a".into()],
            rw: vec!["/w".into()],
            deny: vec!["/w/.env".into()],
            chdir: Some("/w".into()),
            tmp_size: "2G".into(),
            memory: Some("1G".into()),
            pids: Some(64),
            cpus: Some("1".into()),
            timeout: Some("1h".into()),
            allow_exec: vec!["/bin/sh".into()],
            git_stage: Some("/tmp/s".into()),
            fsize: Some("8G".into()),
            pass_env: vec!["A".into()],
            keep_env: true,
            host_network: true,
        };
        crate::roundtrip::check(&full, full.args());
    }
}
