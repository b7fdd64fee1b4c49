//! sbx-vm's flags (the sbx-creds options it also takes are sbx-creds' own
//! definitions, flattened beside this spec in sbx-vm's Cli).

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{Argv, is_false};

pub const TOOL: &str = "sbx-vm";

/// Default of `--memory`.
pub const DEFAULT_MEMORY: &str = "512M";
/// Default of `--boot-timeout`.
pub const DEFAULT_BOOT_TIMEOUT: &str = "60s";
/// Default of `--vault-timeout`.
pub const DEFAULT_VAULT_TIMEOUT: &str = "10s";
/// Default of `--jail-base`.
pub const DEFAULT_JAIL_BASE: &str = "/srv/jailer";
/// Default of `--jail-uid` and `--jail-gid` (nobody).
pub const DEFAULT_JAIL_ID: u32 = 65534;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    #[default]
    Auto,
    Qemu,
    Firecracker,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Accel {
    #[default]
    Auto,
    Kvm,
    Tcg,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Net {
    #[default]
    None,
    SbxNet,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Auto => "auto",
            Backend::Qemu => "qemu",
            Backend::Firecracker => "firecracker",
        }
    }
}

impl Accel {
    pub fn name(self) -> &'static str {
        match self {
            Accel::Auto => "auto",
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

impl Net {
    pub fn name(self) -> &'static str {
        match self {
            Net::None => "none",
            Net::SbxNet => "sbx-net",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for Accel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The microVM sbx-vm runs: every flag of its own but the command.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct VmSpec {
    /// Which VMM: auto (Firecracker when KVM can boot a guest, else QEMU), qemu, firecracker.
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    #[serde(skip_serializing_if = "is_default")]
    pub backend: Backend,

    /// QEMU accelerator: auto (KVM when it can boot a guest, else TCG), kvm, tcg.
    #[arg(long, value_enum, default_value_t = Accel::Auto)]
    #[serde(skip_serializing_if = "is_default")]
    pub accel: Accel,

    /// Guest kernel (bzImage for QEMU, vmlinux for Firecracker).
    #[arg(long, value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<PathBuf>,

    /// Guest initramfs (holds the guest init and the virtio modules).
    #[arg(long, value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initrd: Option<PathBuf>,

    /// Guest root filesystem (a squashfs image, attached read-only).
    #[arg(long, value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<PathBuf>,

    /// The QEMU binary (default: qemu-system-x86_64 on PATH).
    #[arg(long, value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qemu: Option<PathBuf>,

    /// The Firecracker binary (default: firecracker on PATH, else /opt/sbx-firecracker/bin/firecracker).
    #[arg(long, value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub firecracker: Option<PathBuf>,

    /// The jailer binary, used when root (default: beside the Firecracker binary).
    #[arg(long, value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jailer: Option<PathBuf>,

    /// Chroot base directory of the jailer.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_JAIL_BASE)]
    #[serde(skip_serializing_if = "is_default_jail_base")]
    pub jail_base: PathBuf,

    /// uid the jailer drops to.
    #[arg(long, value_name = "UID", default_value_t = DEFAULT_JAIL_ID)]
    #[serde(skip_serializing_if = "is_default_jail_id")]
    pub jail_uid: u32,

    /// gid the jailer drops to.
    #[arg(long, value_name = "GID", default_value_t = DEFAULT_JAIL_ID)]
    #[serde(skip_serializing_if = "is_default_jail_id")]
    pub jail_gid: u32,

    /// A cgroup setting for the jailed Firecracker, FILE=VALUE (repeatable, e.g. pids.max=256); the group is created under sbx-vm's own cgroup.
    #[arg(long, value_name = "FILE=VALUE")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub jail_cgroup: Vec<String>,

    /// Start Firecracker even when KVM cannot boot a guest here (tests the API path; the guest never reports back).
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub no_kvm_check: bool,

    /// Guest memory (e.g. 512M, 1G); at least 128M. Old spelling: --mem.
    #[arg(long, alias = "mem", value_name = "SIZE", default_value = DEFAULT_MEMORY)]
    #[serde(skip_serializing_if = "is_default_memory")]
    pub memory: String,

    /// Number of virtual CPUs (1-32).
    #[arg(long, value_name = "N", default_value_t = 1)]
    #[serde(skip_serializing_if = "is_one")]
    pub vcpus: u32,

    /// Size of the tmpfs writable layer (default: half of --memory).
    #[arg(long, value_name = "SIZE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tmpfs: Option<String>,

    /// Wall-clock limit for CMD (30s, 5m); then CMD and the VM are killed (exit 124).
    #[arg(long, value_name = "DURATION")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,

    /// How long the guest may take to boot and report to the host.
    #[arg(long, value_name = "DURATION", default_value = DEFAULT_BOOT_TIMEOUT)]
    #[serde(skip_serializing_if = "is_default_boot_timeout")]
    pub boot_timeout: String,

    /// Network of the VM: none (no network device), or sbx-net (QEMU user-mode networking; sbx-vm must run under sbx-net).
    #[arg(long, value_enum, default_value_t = Net::None)]
    #[serde(skip_serializing_if = "is_default")]
    pub net: Net,

    /// Set K=V in CMD's environment (repeatable). Old spelling: --env.
    #[arg(long, alias = "env", value_name = "K=V")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub setenv: Vec<String>,

    /// JSON document {"env": {"NAME": "value"}} of secrets for CMD's environment (fw_cfg / MMDS).
    #[arg(long, value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secrets_from: Option<PathBuf>,

    /// Deliver the value of NAME in sbx-vm's own environment as a secret
    /// (repeatable): `sbx-creds ... -- sbx-vm --secret-env DB_PASSWORD -- CMD`.
    #[arg(long, value_name = "NAME")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub secret_env: Vec<String>,

    /// Bound on each request to the Vault/OpenBao server (sbx-creds'
    /// --timeout; --timeout here bounds CMD).
    #[arg(long, value_name = "DURATION", default_value = DEFAULT_VAULT_TIMEOUT)]
    #[serde(skip_serializing_if = "is_default_vault_timeout")]
    pub vault_timeout: String,

    /// Copy DIR into the guest's /work before CMD starts.
    #[arg(long, value_name = "DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub copy_in: Option<PathBuf>,

    /// Copy the guest's /work into DIR (empty or new) after CMD exits.
    #[arg(long, value_name = "DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub copy_out: Option<PathBuf>,
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

fn is_default_jail_base(p: &std::path::Path) -> bool {
    p.as_os_str() == DEFAULT_JAIL_BASE
}

fn is_default_jail_id(n: &u32) -> bool {
    *n == DEFAULT_JAIL_ID
}

fn is_default_memory(s: &str) -> bool {
    s == DEFAULT_MEMORY
}

fn is_default_boot_timeout(s: &str) -> bool {
    s == DEFAULT_BOOT_TIMEOUT
}

fn is_default_vault_timeout(s: &str) -> bool {
    s == DEFAULT_VAULT_TIMEOUT
}

impl Default for VmSpec {
    fn default() -> Self {
        VmSpec {
            backend: Backend::Auto,
            accel: Accel::Auto,
            kernel: None,
            initrd: None,
            rootfs: None,
            qemu: None,
            firecracker: None,
            jailer: None,
            jail_base: DEFAULT_JAIL_BASE.into(),
            jail_uid: DEFAULT_JAIL_ID,
            jail_gid: DEFAULT_JAIL_ID,
            jail_cgroup: Vec::new(),
            no_kvm_check: false,
            memory: DEFAULT_MEMORY.into(),
            vcpus: 1,
            tmpfs: None,
            timeout: None,
            boot_timeout: DEFAULT_BOOT_TIMEOUT.into(),
            net: Net::None,
            setenv: Vec::new(),
            secrets_from: None,
            secret_env: Vec::new(),
            vault_timeout: DEFAULT_VAULT_TIMEOUT.into(),
            copy_in: None,
            copy_out: None,
        }
    }
}

impl VmSpec {
    /// sbx-vm's flags for this spec (before `-- CMD`).
    pub fn args(&self) -> Vec<OsString> {
        let d = VmSpec::default();
        Argv::default()
            .unless_default("--backend", &self.backend, d.backend)
            .unless_default("--accel", &self.accel, d.accel)
            .opt("--kernel", self.kernel.as_ref())
            .opt("--initrd", self.initrd.as_ref())
            .opt("--rootfs", self.rootfs.as_ref())
            .opt("--qemu", self.qemu.as_ref())
            .opt("--firecracker", self.firecracker.as_ref())
            .opt("--jailer", self.jailer.as_ref())
            .opt(
                "--jail-base",
                (self.jail_base != d.jail_base).then_some(&self.jail_base),
            )
            .unless_default("--jail-uid", &self.jail_uid, d.jail_uid)
            .unless_default("--jail-gid", &self.jail_gid, d.jail_gid)
            .each("--jail-cgroup", &self.jail_cgroup)
            .switch("--no-kvm-check", self.no_kvm_check)
            .unless_default("--memory", &self.memory, d.memory)
            .unless_default("--vcpus", &self.vcpus, d.vcpus)
            .opt("--tmpfs", self.tmpfs.as_ref())
            .opt("--timeout", self.timeout.as_ref())
            .unless_default("--boot-timeout", &self.boot_timeout, d.boot_timeout)
            .unless_default("--net", &self.net, d.net)
            .each("--setenv", &self.setenv)
            .opt("--secrets-from", self.secrets_from.as_ref())
            .each("--secret-env", &self.secret_env)
            .unless_default("--vault-timeout", &self.vault_timeout, d.vault_timeout)
            .opt("--copy-in", self.copy_in.as_ref())
            .opt("--copy-out", self.copy_out.as_ref())
            .done()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_round_trips() {
        let full = VmSpec {
            backend: Backend::Firecracker,
            accel: Accel::Tcg,
            kernel: Some("/k".into()),
            initrd: Some("/i".into()),
            rootfs: Some("/r".into()),
            qemu: Some("/q".into()),
            firecracker: Some("/f".into()),
            jailer: Some("/j".into()),
            jail_base: "/jb".into(),
            jail_uid: 1000,
            jail_gid: 1001,
            jail_cgroup: vec!["pids.max=256".into()],
            no_kvm_check: true,
            memory: "1G".into(),
            vcpus: 2,
            tmpfs: Some("256M".into()),
            timeout: Some("5m".into()),
            boot_timeout: "30s".into(),
            net: Net::SbxNet,
            setenv: vec!["A=b".into()],
            secrets_from: Some("/s.json".into()),
            secret_env: vec!["TOKEN".into()],
            vault_timeout: "3s".into(),
            copy_in: Some("/in".into()),
            copy_out: Some("/out".into()),
        };
        crate::roundtrip::check(&full, full.args());
        crate::roundtrip::check(&VmSpec::default(), Vec::new());
    }

    #[test]
    fn enum_names_are_the_value_and_serde_names() {
        use clap::ValueEnum;
        for v in Backend::value_variants() {
            assert_eq!(v.to_possible_value().unwrap().get_name(), v.name());
            assert_eq!(serde_json::to_value(v).unwrap(), v.name());
        }
        for v in Accel::value_variants() {
            assert_eq!(v.to_possible_value().unwrap().get_name(), v.name());
            assert_eq!(serde_json::to_value(v).unwrap(), v.name());
        }
        for v in Net::value_variants() {
            assert_eq!(v.to_possible_value().unwrap().get_name(), v.name());
            assert_eq!(serde_json::to_value(v).unwrap(), v.name());
        }
    }
}
