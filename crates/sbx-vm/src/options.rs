//! Flags -> a checked [`Plan`]. Everything that can be wrong with the input
//! is found here, before anything is created on the host.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sbx_core::exit::Failure;
use secrecy::SecretString;
use zeroize::Zeroizing;

use crate::guestfiles::{self, GuestFiles};
use crate::kvm::{self, KvmState};
use crate::limits;
use crate::{Accel, Backend, Cli, Net};

/// Smallest guest memory the guest kernel + init + tmpfs are run with.
pub const MIN_MEM: u64 = 128 << 20;
pub const MAX_VCPUS: u32 = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vmm {
    Qemu { kvm: bool },
    Firecracker,
}

#[derive(Debug)]
pub struct Plan {
    pub vmm: Vmm,
    pub vmm_bin: PathBuf,
    pub jailer: Option<PathBuf>,
    /// Why this backend (for the audit log).
    pub reason: String,
    pub kvm: KvmState,
    pub files: GuestFiles,
    pub mem: u64,
    pub vcpus: u32,
    pub tmpfs: u64,
    pub timeout: Option<Duration>,
    pub boot_timeout: Duration,
    pub env: Vec<(String, String)>,
    /// The secrets document (JSON text), already checked; with the
    /// sbx-creds options, completed with the session's secrets by
    /// [`crate::run::run`] after the fetch.
    pub secrets: Option<Zeroizing<String>>,
    pub secret_names: Vec<String>,
    pub copy_in: Option<PathBuf>,
    /// The most bytes of tar archive --copy-in may send (what the tree
    /// checked before boot makes, and some slack).
    pub copy_in_cap: u64,
    pub copy_out: Option<PathBuf>,
    pub argv: Vec<String>,
    pub jail_base: PathBuf,
    pub jail_uid: u32,
    pub jail_gid: u32,
    pub jail_cgroups: Option<crate::jailcg::JailCgroups>,
    /// The VM has a network (QEMU user-mode networking inside sbx-net's namespace).
    pub net: bool,
    /// Secrets to fetch through the sbx-creds library before boot.
    pub creds: Option<crate::creds::CredsPlan>,
}

fn size(flag: &str, s: &str) -> Result<u64, Failure> {
    sbx_core::units::parse_size(s).map_err(|e| Failure::new(format!("--{flag} {s}: {e}")))
}

fn duration(flag: &str, s: &str) -> Result<Duration, Failure> {
    let d = sbx_core::units::parse_duration(s)
        .map_err(|e| Failure::new(format!("--{flag} {s}: {e}")))?;
    if d.is_zero() {
        return Err(Failure::new(format!("--{flag} {s}: must be more than 0")));
    }
    Ok(d)
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Default Firecracker location when not on PATH (scripts/deps/setup-vm.sh installs it there).
pub const FIRECRACKER_DIR: &str = "/opt/sbx-firecracker/bin";

fn find_firecracker(flag: Option<&Path>) -> Result<Option<PathBuf>, Failure> {
    if let Some(p) = flag {
        if !is_executable(p) {
            return Err(Failure::new(format!(
                "--firecracker {}: not an executable file",
                p.display()
            )));
        }
        return Ok(Some(p.to_path_buf()));
    }
    Ok(on_path("firecracker").or_else(|| {
        let p = Path::new(FIRECRACKER_DIR).join("firecracker");
        is_executable(&p).then_some(p)
    }))
}

pub fn plan(cli: &Cli, env_token: Option<SecretString>) -> Result<Plan, Failure> {
    let mem = size("memory", &cli.spec.memory)?;
    if mem < MIN_MEM {
        return Err(Failure::new(format!(
            "--memory {}: below what the guest needs ({} MiB at least)",
            cli.spec.memory,
            MIN_MEM >> 20
        )));
    }
    if cli.spec.vcpus == 0 || cli.spec.vcpus > MAX_VCPUS {
        return Err(Failure::new(format!(
            "--vcpus {}: must be 1-{MAX_VCPUS}",
            cli.spec.vcpus
        )));
    }
    let tmpfs = match &cli.spec.tmpfs {
        Some(s) => {
            let t = size("tmpfs", s)?;
            if t < (1 << 20) || t >= mem {
                return Err(Failure::new(format!(
                    "--tmpfs {s}: must be at least 1M and below --memory"
                )));
            }
            t
        }
        None => mem / 2,
    };
    let timeout = cli
        .spec
        .timeout
        .as_deref()
        .map(|s| duration("timeout", s))
        .transpose()?;
    let boot_timeout = duration("boot-timeout", &cli.spec.boot_timeout)?;
    if cli.spec.net == Net::SbxNet && !sbx_core::sbxnet::in_sbx_net_namespace() {
        return Err(Failure::new(
            "--net sbx-net: not inside sbx-net's network namespace (run sbx-net ... -- sbx-vm --net sbx-net ...)",
        ));
    }
    let mut env = vec![
        (
            "PATH".to_string(),
            "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin".to_string(),
        ),
        ("HOME".to_string(), "/root".to_string()),
    ];
    if let Ok(t) = std::env::var("TERM") {
        env.push(("TERM".into(), t));
    }
    for kv in &cli.spec.setenv {
        let Some((k, v)) = kv.split_once('=') else {
            return Err(Failure::new(format!("--setenv {kv}: expected K=V")));
        };
        if k.is_empty() || k.contains('\0') || v.contains('\0') {
            return Err(Failure::new(format!(
                "--setenv {kv}: invalid name or value"
            )));
        }
        env.retain(|(ek, _)| ek != k);
        env.push((k.to_string(), v.to_string()));
    }
    if crate::creds::wanted(&cli.creds)
        && let Some(n) = cli
            .spec
            .secret_env
            .iter()
            .find(|n| crate::creds::TOKEN_VARS.contains(&n.as_str()))
    {
        return Err(Failure::new(format!(
            "--secret-env {n}: with the sbx-creds options sbx-vm logs in with it; it is never passed on (use --child-token {n} for a token of the command's own)"
        )));
    }
    let (secrets, secret_names) = collect_secrets(cli)?;
    let creds = crate::creds::plan(
        &cli.creds,
        &cli.spec.vault_timeout,
        &secret_names,
        env_token,
    )?;
    if let Some(d) = &cli.spec.copy_in
        && !d.is_dir()
    {
        return Err(Failure::new(format!(
            "--copy-in {}: not a directory",
            d.display()
        )));
    }
    // What the guest's tmpfs cannot take is refused now, not after the
    // boot and a copy that fills it.
    let copy_in_cap = match &cli.spec.copy_in {
        Some(d) => {
            let lim =
                limits::CopyInLimits::new(mem, tmpfs, &cli.spec.memory, cli.spec.tmpfs.is_some());
            limits::scan_copy_in(d, &lim)?.archive + (1 << 20)
        }
        None => 0,
    };
    if let Some(d) = &cli.spec.copy_out {
        match std::fs::read_dir(d) {
            Ok(mut rd) => {
                if rd.next().is_some() {
                    return Err(Failure::new(format!(
                        "--copy-out {}: directory is not empty",
                        d.display()
                    )));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let parent = d
                    .parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .unwrap_or(Path::new("."));
                if !parent.is_dir() {
                    return Err(Failure::new(format!(
                        "--copy-out {}: parent directory does not exist",
                        d.display()
                    )));
                }
            }
            Err(e) => return Err(Failure::new(format!("--copy-out {}: {e}", d.display()))),
        }
    }
    let mut argv = Vec::new();
    for a in &cli.cmd {
        match a.to_str() {
            Some(s) => argv.push(s.to_string()),
            None => {
                return Err(Failure::new(format!(
                    "CMD argument {a:?} is not UTF-8 (not supported in the guest spec)"
                )));
            }
        }
    }
    limits::check_spec_frame(&argv, &env)?;
    let origin = match (&cli.spec.secrets_from, cli.spec.secret_env.is_empty()) {
        (Some(f), true) => format!("--secrets-from {}", f.display()),
        (Some(f), false) => format!("--secrets-from {} and --secret-env", f.display()),
        (None, _) => "--secret-env".to_string(),
    };
    limits::check_exec(&argv, &env, secrets.as_deref().map(String::as_str), &origin)?;

    // The backend.
    let kvm = kvm::probe();
    let fc = find_firecracker(cli.spec.firecracker.as_deref())?;
    let (vmm, reason) = match cli.spec.backend {
        Backend::Firecracker => {
            if fc.is_none() {
                return Err(Failure::new(format!(
                    "--backend firecracker: no Firecracker binary (give --firecracker PATH, put firecracker on PATH or install it in {FIRECRACKER_DIR})"
                )));
            }
            if !kvm.usable && !cli.spec.no_kvm_check {
                return Err(Failure::new(format!(
                    "--backend firecracker: KVM cannot boot a guest here ({}); use --backend qemu",
                    kvm.reason
                )));
            }
            (
                Vmm::Firecracker,
                "requested with --backend firecracker".to_string(),
            )
        }
        Backend::Qemu => (
            Vmm::Qemu { kvm: false },
            "requested with --backend qemu".to_string(),
        ),
        Backend::Auto => match (&fc, kvm.usable) {
            (Some(_), true) => (
                Vmm::Firecracker,
                format!("firecracker found and KVM usable ({})", kvm.reason),
            ),
            (None, _) => (
                Vmm::Qemu { kvm: false },
                "no firecracker binary".to_string(),
            ),
            (Some(_), false) => (
                Vmm::Qemu { kvm: false },
                format!("KVM cannot boot a guest ({})", kvm.reason),
            ),
        },
    };
    let (vmm, vmm_bin, jailer) = match vmm {
        Vmm::Qemu { .. } => {
            let use_kvm = match cli.spec.accel {
                Accel::Kvm => {
                    if !kvm.usable {
                        return Err(Failure::new(format!(
                            "--accel kvm: KVM cannot boot a guest here ({})",
                            kvm.reason
                        )));
                    }
                    true
                }
                Accel::Tcg => false,
                Accel::Auto => kvm.usable,
            };
            let bin = match &cli.spec.qemu {
                Some(p) if is_executable(p) => p.clone(),
                Some(p) => return Err(Failure::new(format!("--qemu {}: not an executable file", p.display()))),
                None => on_path("qemu-system-x86_64").ok_or_else(|| {
                    Failure::new("no VMM binary: qemu-system-x86_64 is not on PATH (install qemu-system-x86 or give --qemu PATH)")
                })?,
            };
            (Vmm::Qemu { kvm: use_kvm }, bin, None)
        }
        Vmm::Firecracker => {
            let bin = fc.expect("checked");
            // SAFETY: geteuid cannot fail.
            let jailer = if unsafe { libc::geteuid() } == 0 {
                let j = match &cli.spec.jailer {
                    Some(p) => p.clone(),
                    None => bin.with_file_name("jailer"),
                };
                if !is_executable(&j) {
                    return Err(Failure::new(format!(
                        "--jailer {}: not an executable file (the jailer is required when running as root)",
                        j.display()
                    )));
                }
                Some(j)
            } else {
                None
            };
            if cli.spec.net == Net::SbxNet {
                return Err(Failure::new(
                    "--net sbx-net: only with --backend qemu (the Firecracker tap path is not implemented)",
                ));
            }
            // SAFETY: geteuid cannot fail.
            if creds.is_some() && unsafe { libc::geteuid() } != 0 {
                return Err(Failure::new(
                    "the sbx-creds options with --backend firecracker need root (MMDS needs a tap device)",
                ));
            }
            (Vmm::Firecracker, bin, jailer)
        }
    };
    let files = guestfiles::locate(
        matches!(vmm, Vmm::Firecracker),
        cli.spec.kernel.as_deref(),
        cli.spec.initrd.as_deref(),
        cli.spec.rootfs.as_deref(),
    )?;
    Ok(Plan {
        vmm,
        vmm_bin,
        jailer,
        reason,
        kvm,
        files,
        mem,
        vcpus: cli.spec.vcpus,
        tmpfs,
        timeout,
        boot_timeout,
        env,
        secrets,
        secret_names,
        copy_in: cli.spec.copy_in.clone(),
        copy_in_cap,
        copy_out: cli.spec.copy_out.clone(),
        argv,
        jail_base: cli.spec.jail_base.clone(),
        jail_uid: cli.spec.jail_uid,
        jail_gid: cli.spec.jail_gid,
        jail_cgroups: crate::jailcg::plan(&cli.spec.jail_cgroup)?,
        net: cli.spec.net == Net::SbxNet,
        creds,
    })
}

/// Reads and checks a secrets document; returns it (re-serialised: only
/// the `env` object of strings) and the names.
pub fn read_secrets(p: &Path) -> Result<(String, Vec<String>), Failure> {
    let text = sbx_core::input::read_regular_string(p, sbx_core::input::CONFIG_CAP)
        .map_err(|e| Failure::new(format!("--secrets-from {}: {e}", p.display())))?;
    // Never quote the document in an error: it holds secrets.
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        Failure::new(format!(
            "--secrets-from {}: not valid JSON (line {}, column {})",
            p.display(),
            e.line(),
            e.column()
        ))
    })?;
    let Some(env) = v.get("env").and_then(|e| e.as_object()) else {
        return Err(Failure::new(format!(
            "--secrets-from {}: expected an object with \"env\": {{\"NAME\": \"value\", ...}}",
            p.display()
        )));
    };
    let mut names = Vec::new();
    for (k, val) in env {
        let ok_name = !k.is_empty() && !k.contains('=') && !k.contains('\0');
        if !ok_name || !val.is_string() {
            return Err(Failure::new(format!(
                "--secrets-from {}: env.{k}: names must be non-empty without '=', values strings",
                p.display()
            )));
        }
        // What the guest cannot put into an environment variable fails
        // now, not as an exec error in the guest (the value is never shown).
        if let Some(why) = val.as_str().and_then(|v| limits::env_value_problem(k, v)) {
            return Err(Failure::new(format!(
                "--secrets-from {}: env.{k}: {why}",
                p.display()
            )));
        }
        names.push(k.clone());
    }
    let doc = serde_json::json!({ "env": env }).to_string();
    Ok((doc, names))
}

/// The secrets document from --secrets-from and --secret-env (later wins).
fn collect_secrets(cli: &Cli) -> Result<(Option<Zeroizing<String>>, Vec<String>), Failure> {
    let mut env = serde_json::Map::new();
    if let Some(p) = &cli.spec.secrets_from {
        let (doc, _) = read_secrets(p)?;
        let v: serde_json::Value = serde_json::from_str(&doc).unwrap_or_default();
        if let Some(m) = v.get("env").and_then(|e| e.as_object()) {
            env.extend(m.clone());
        }
    }
    for name in &cli.spec.secret_env {
        if name.is_empty() || name.contains('=') {
            return Err(Failure::new(format!(
                "--secret-env {name}: not a variable name"
            )));
        }
        match std::env::var(name) {
            Ok(v) => {
                if let Some(why) = limits::env_value_problem(name, &v) {
                    return Err(Failure::new(format!("--secret-env {name}: {why}")));
                }
                env.insert(name.clone(), serde_json::Value::String(v));
            }
            Err(_) => {
                return Err(Failure::new(format!(
                    "--secret-env {name}: not set in sbx-vm's environment (or not UTF-8)"
                )));
            }
        }
    }
    if env.is_empty() && cli.spec.secrets_from.is_none() {
        return Ok((None, Vec::new()));
    }
    let names = env.keys().cloned().collect();
    Ok((
        Some(Zeroizing::new(
            serde_json::json!({ "env": env }).to_string(),
        )),
        names,
    ))
}
