//! sbx-container's flags (the run form; `build` has its own).

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{Argv, is_false, osv};

pub const TOOL: &str = "sbx-container";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Net {
    /// No network interface but loopback.
    None,
    /// A network of its own, the host blocked.
    Internal,
    /// sbx-net's namespace, the one sbx-container runs in.
    Sbx,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Seccomp {
    /// The engine's default profile.
    Engine,
    /// sbx-seccomp's default profile, translated.
    Sbx,
}

impl Net {
    pub fn name(self) -> &'static str {
        match self {
            Net::None => "none",
            Net::Internal => "internal",
            Net::Sbx => "sbx",
        }
    }
}

impl Seccomp {
    pub fn name(self) -> &'static str {
        match self {
            Seccomp::Engine => "engine",
            Seccomp::Sbx => "sbx",
        }
    }
}

impl fmt::Display for Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for Seccomp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The container sbx-container runs: every flag of its run form but the
/// command.
#[derive(clap::Args, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct ContainerSpec {
    /// Engine address: unix:///PATH or tcp://HOST:PORT (default: DOCKER_HOST, else unix:///var/run/docker.sock).
    #[arg(long, value_name = "URL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,

    /// Image to run (default sbx-sandbox:latest, made by `sbx-container build`); never pulled.
    #[arg(long, value_name = "IMAGE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,

    /// Bind SRC read-only at DST (default: the same path; repeatable).
    #[arg(long, value_name = "SRC[:DST]")]
    #[serde(with = "osv", skip_serializing_if = "Vec::is_empty")]
    pub ro: Vec<OsString>,

    /// Bind SRC writable at DST (default: the same path), except deny-listed and write-protected entries (repeatable).
    #[arg(long, value_name = "SRC[:DST]")]
    #[serde(with = "osv", skip_serializing_if = "Vec::is_empty")]
    pub rw: Vec<OsString>,

    /// Do not apply sbx-fs's default deny list to the binds (the invariants still apply).
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub no_default_deny: bool,

    /// Memory limit (default 512M); no swap beyond it.
    #[arg(long, value_name = "SIZE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,

    /// CPU limit in CPUs (default 1).
    #[arg(long, value_name = "N.N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpus: Option<String>,

    /// Maximum number of processes and threads (default 512).
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pids: Option<String>,

    /// Size of the tmpfs on /tmp (default 64M).
    #[arg(long, value_name = "SIZE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tmp_size: Option<String>,

    /// Network: none (default), internal (own network; the host blocked) or sbx (join sbx-net's namespace: run under sbx-net, Podman only).
    #[arg(long, value_enum, value_name = "MODE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub net: Option<Net>,

    /// Seccomp profile: engine (the engine's default, the default) or sbx (sbx-seccomp's default profile, translated).
    #[arg(long, value_enum, value_name = "PROFILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seccomp: Option<Seccomp>,

    /// UID[:GID] inside the container (default 65534:65534; never 0).
    #[arg(long, value_name = "UID[:GID]")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,

    /// Working directory inside the container (default /). Old spelling: --workdir.
    #[arg(long, alias = "workdir", value_name = "DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chdir: Option<PathBuf>,

    /// Environment for the command: NAME=VALUE, or NAME to pass sbx-container's own (repeatable; visible in inspect). Old spelling: --env.
    #[arg(long, alias = "env", value_name = "NAME[=VALUE]")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub setenv: Vec<String>,

    /// Pass this variable of sbx-container's environment as a secret: exec-time only, never in inspect (repeatable).
    #[arg(long, value_name = "NAME")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub secret_env: Vec<String>,

    /// Fetch secrets with the sbx-creds library: FILE holds an "sbx-creds" section (sbx-creds' flags as keys); they reach the command at exec time only and are revoked at the end. VAULT_TOKEN is taken from the environment.
    #[arg(long, value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub creds_config: Option<PathBuf>,

    /// A resource limit NAME=SOFT[:HARD] (repeatable), e.g. nofile=1024. Old spelling: --ulimit.
    #[arg(long, alias = "ulimit", value_name = "NAME=SOFT[:HARD]")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rlimit: Vec<String>,

    /// Wall-clock limit (30s, 5m); then the container is killed (exit 124).
    #[arg(long, value_name = "DURATION")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,

    /// After a forwarded SIGINT/SIGTERM, SIGKILL the container when it is still running this long after (default 5s).
    #[arg(long, value_name = "DURATION")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kill_grace: Option<String>,

    /// Run the engine's init (docker-init, catatonit) as PID 1, so that forwarded signals reach a command that does not handle them.
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub init: bool,
}

impl ContainerSpec {
    /// sbx-container's flags for this spec (before `-- CMD`).
    pub fn args(&self) -> Vec<OsString> {
        Argv::default()
            .opt("--engine", self.engine.as_ref())
            .opt("--image", self.image.as_ref())
            .each("--rw", &self.rw)
            .each("--ro", &self.ro)
            .switch("--no-default-deny", self.no_default_deny)
            .opt("--memory", self.memory.as_ref())
            .opt("--cpus", self.cpus.as_ref())
            .opt("--pids", self.pids.as_ref())
            .opt("--tmp-size", self.tmp_size.as_ref())
            .opt("--timeout", self.timeout.as_ref())
            .opt("--net", self.net.map(Net::name))
            .opt("--seccomp", self.seccomp.map(Seccomp::name))
            .opt("--user", self.user.as_ref())
            .opt("--chdir", self.chdir.as_ref())
            .each("--setenv", &self.setenv)
            .each("--secret-env", &self.secret_env)
            .opt("--creds-config", self.creds_config.as_ref())
            .each("--rlimit", &self.rlimit)
            .opt("--kill-grace", self.kill_grace.as_ref())
            .switch("--init", self.init)
            .done()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_round_trips() {
        for (net, seccomp) in [
            (Net::None, Seccomp::Engine),
            (Net::Internal, Seccomp::Sbx),
            (Net::Sbx, Seccomp::Sbx),
        ] {
            let full = ContainerSpec {
                engine: Some("unix:///run/podman/podman.sock".into()),
                image: Some("sbx-sandbox:latest".into()),
                ro: vec!["/a:/a".into()],
                rw: vec!["/b".into(), "/c:/d".into()],
                no_default_deny: true,
                memory: Some("1G".into()),
                cpus: Some("0.5".into()),
                pids: Some("64".into()),
                tmp_size: Some("16M".into()),
                net: Some(net),
                seccomp: Some(seccomp),
                user: Some("1000:1000".into()),
                chdir: Some("/b".into()),
                setenv: vec!["A=b".into(), "TERM".into()],
                secret_env: vec!["TOKEN".into()],
                creds_config: Some("/c.json".into()),
                rlimit: vec!["nofile=1024".into()],
                timeout: Some("5m".into()),
                kill_grace: Some("1s".into()),
                init: true,
            };
            crate::roundtrip::check(&full, full.args());
        }
        crate::roundtrip::check(&ContainerSpec::default(), Vec::new());
    }

    #[test]
    fn enum_names_are_the_value_and_serde_names() {
        use clap::ValueEnum;
        for v in Net::value_variants() {
            assert_eq!(v.to_possible_value().unwrap().get_name(), v.name());
            assert_eq!(serde_json::to_value(v).unwrap(), v.name());
        }
        for v in Seccomp::value_variants() {
            assert_eq!(v.to_possible_value().unwrap().get_name(), v.name());
            assert_eq!(serde_json::to_value(v).unwrap(), v.name());
        }
    }
}
