//! sbx-seccomp's flags.

use std::ffi::OsString;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{Argv, is_false};

pub const TOOL: &str = "sbx-seccomp";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    /// Allows normal programs, denies the kernel attack surface.
    Default,
    /// An allowlist for simple workloads, on top of `default`.
    Strict,
    /// No built-in filter.
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DenyAction {
    /// Fail with EPERM.
    Errno,
    /// Kill the process (SIGSYS; the kernel logs it).
    Kill,
    /// Allow but log (audit mode).
    Log,
}

impl Profile {
    pub fn name(self) -> &'static str {
        match self {
            Profile::Default => "default",
            Profile::Strict => "strict",
            Profile::None => "none",
        }
    }
}

impl DenyAction {
    pub fn name(self) -> &'static str {
        match self {
            DenyAction::Errno => "errno",
            DenyAction::Kill => "kill",
            DenyAction::Log => "log",
        }
    }
}

/// The filter and execute allowlist sbx-seccomp installs: every flag but
/// `--print` and the command.
#[derive(clap::Args, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct SeccompSpec {
    /// Built-in profile (default: `default`, or `none` when --policy is given).
    #[arg(long, value_enum, value_name = "PROFILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<Profile>,

    /// A policy in seccompiler's JSON format; its filters are installed after
    /// the profile's (an explicit --profile stays, otherwise none is used).
    #[arg(long, value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<PathBuf>,

    /// Deny SYSCALL too (EPERM, or per --action). Repeatable.
    #[arg(long, value_name = "SYSCALL")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,

    /// Allow SYSCALL although the profile denies it. Repeatable.
    #[arg(long, value_name = "SYSCALL")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,

    /// What a denied call gets: errno (silent EPERM), kill (SIGSYS) or log
    /// (allowed, logged: audit mode). Default: the profile's per-call
    /// choice, its EPERM denials alerted through a notifier when there is
    /// an audit log.
    #[arg(long, value_enum, value_name = "ACTION")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<DenyAction>,

    /// Deny socket() for every family but AF_UNIX (AF_INET, AF_INET6,
    /// AF_PACKET, AF_NETLINK, ...), and io_uring.
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub no_network: bool,

    /// Make rdtsc/rdtscp raise SIGSEGV (PR_SET_TSC): no precise timer for
    /// timing side channels. glibc's dynamic loader and the vDSO clock read
    /// the TSC too: suits static programs only (see LIMITS).
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub no_tsc: bool,

    /// Allow ptrace, process_vm_readv/writev, pidfd_getfd and
    /// personality(ADDR_NO_RANDOMIZE), for debuggers.
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub allow_ptrace: bool,

    /// Only this file may be executed (repeatable; a directory allows
    /// everything beneath it): a Landlock execute allowlist for CMD and
    /// everything it starts (EACCES, 126, for any other file). CMD itself,
    /// its shells and interpreters must be listed; the dynamic loaders are
    /// added. With an audit log every refused exec is an exec_denied alert.
    #[arg(long, value_name = "PATH")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allow_exec: Vec<PathBuf>,
}

impl SeccompSpec {
    /// sbx-seccomp's flags for this spec (before `-- CMD`).
    pub fn args(&self) -> Vec<OsString> {
        Argv::default()
            .opt("--profile", self.profile.map(Profile::name))
            .opt("--policy", self.policy.as_ref())
            .each("--deny", &self.deny)
            .each("--allow", &self.allow)
            .opt("--action", self.action.map(DenyAction::name))
            .switch("--no-network", self.no_network)
            .switch("--no-tsc", self.no_tsc)
            .switch("--allow-ptrace", self.allow_ptrace)
            .each("--allow-exec", &self.allow_exec)
            .done()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_round_trips() {
        for (profile, action) in [
            (Profile::Default, DenyAction::Errno),
            (Profile::Strict, DenyAction::Kill),
            (Profile::None, DenyAction::Log),
        ] {
            let full = SeccompSpec {
                profile: Some(profile),
                policy: Some("/p.json".into()),
                deny: vec!["mount".into()],
                allow: vec!["ptrace".into()],
                action: Some(action),
                no_network: true,
                no_tsc: true,
                allow_ptrace: true,
                allow_exec: vec!["/bin/sh".into(), "/usr/bin/make".into()],
            };
            crate::roundtrip::check(&full, full.args());
        }
        crate::roundtrip::check(&SeccompSpec::default(), Vec::new());
    }

    #[test]
    fn enum_names_are_the_value_names() {
        use clap::ValueEnum;
        for p in Profile::value_variants() {
            assert_eq!(p.to_possible_value().unwrap().get_name(), p.name());
        }
        for a in DenyAction::value_variants() {
            assert_eq!(a.to_possible_value().unwrap().get_name(), a.name());
        }
    }
}
