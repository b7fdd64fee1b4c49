//! The decision matrix and the canonical chain for a policy.
//!
//! | trust | latency-sensitive | plugin | tier |
//! |---|---|---|---|
//! | plugin (or any, with --plugin) | - | yes | sbx-wasm (WebAssembly/WASI) |
//! | full | - | no | path allowlist only (sbx-path rules handed to the agent) |
//! | low | - | no | creds?, gitguard, cgroup, net, fs, seccomp (+ --allow-exec) |
//! | low, --container | - | no | sbx-container (one container per run) |
//! | zero | yes | no | sbx-vm --backend firecracker |
//! | zero | no | no | gVisor (runsc --platform=ptrace) when installed, else sbx-vm |

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use sbx_spec::{
    ChainSpec, ContainerSpec, FsSpec, GitguardRunSpec, GvisorSpec, Layer, NetSpec, PlantsSpec,
    Profile, RepoSpec, SeccompSpec, VmSpec, container, vm,
};

use crate::map::Policy;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Trust {
    /// Path allowlist only (sbx-path): for agents you trust.
    Full,
    /// The Linux namespace chain.
    Low,
    /// A separate kernel: gVisor or a microVM.
    Zero,
    /// A WebAssembly/WASI module (sbx-wasm): the plugin tier.
    Plugin,
}

#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    #[error("{0}")]
    TierUnavailable(String),
    #[error("--layers {0}: {1}")]
    Layers(PathBuf, String),
}

pub struct Options {
    pub trust: Trust,
    pub latency_sensitive: bool,
    pub plugin: bool,
    /// A `--config` file whose sections go to each layer.
    pub layers: Option<PathBuf>,
    pub bin_dir: Option<PathBuf>,
    /// Include sbx-cgroup: None = when root.
    pub cgroup: Option<bool>,
    /// Low trust as one container per run (sbx-container) instead of the
    /// namespace chain.
    pub container: bool,
    /// Phantom credentials for sbx-net (`--secret NAME@HOST...`).
    pub secrets: Vec<String>,
}

/// What `chain` decided.
pub struct Plan {
    pub tier: &'static str,
    /// One entry per layer (the command last), for --print.
    pub layers: Vec<Vec<OsString>>,
    pub env: Vec<(OsString, OsString)>,
    pub notes: Vec<String>,
}

impl Plan {
    pub fn argv(&self) -> Vec<OsString> {
        let mut v = Vec::new();
        let n = self.layers.len();
        for (i, l) in self.layers.iter().enumerate() {
            v.extend(l.iter().cloned());
            if i + 1 < n {
                v.push("--".into());
            }
        }
        v
    }

    /// One layer per line, shell-quoted, ready to paste.
    pub fn render(&self) -> String {
        let mut s = String::new();
        s.push_str(&format!("# tier: {}\n", self.tier));
        for n in &self.notes {
            s.push_str(&format!("# {n}\n"));
        }
        let mut first = true;
        for (k, v) in &self.env {
            if first {
                s.push_str("env ");
                first = false;
            }
            s.push_str(&quote(&format!(
                "{}={}",
                k.to_string_lossy(),
                v.to_string_lossy()
            )));
            s.push_str(" \\\n    ");
        }
        let n = self.layers.len();
        for (i, l) in self.layers.iter().enumerate() {
            let words: Vec<String> = l.iter().map(|w| quote(&w.to_string_lossy())).collect();
            s.push_str(&words.join(" "));
            if i + 1 < n {
                s.push_str(" -- \\\n    ");
            }
        }
        s.push('\n');
        s
    }
}

pub(crate) fn quote(w: &str) -> String {
    if !w.is_empty()
        && w.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b))
    {
        w.to_string()
    } else {
        format!("'{}'", w.replace('\'', "'\\''"))
    }
}

/// Where the sbx binaries are: --bin-dir, $SBX_BIN, this program's own
/// directory, then PATH.
pub fn find_tool(name: &str, bin_dir: Option<&Path>) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(d) = bin_dir {
        dirs.push(d.to_path_buf());
    }
    if let Some(d) = std::env::var_os("SBX_BIN") {
        dirs.push(PathBuf::from(d));
    }
    if let Ok(me) = std::env::current_exe()
        && let Some(d) = me.parent()
    {
        dirs.push(d.to_path_buf());
    }
    if let Some(p) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&p));
    }
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

fn os<S: AsRef<std::ffi::OsStr>>(s: S) -> OsString {
    s.as_ref().to_os_string()
}

fn need(name: &str, what: &str, o: &Options) -> Result<PathBuf, ChainError> {
    find_tool(name, o.bin_dir.as_deref()).ok_or_else(|| {
        ChainError::TierUnavailable(format!(
            "{what} is not available: {name} is not installed (looked in --bin-dir, $SBX_BIN, beside sbx-policy and on PATH)"
        ))
    })
}

/// Sections of the --layers file (checked to be JSON with known sections).
fn layer_sections(path: &Path) -> Result<Vec<String>, ChainError> {
    let text = sbx_core::input::read_regular_string(path, sbx_core::input::CONFIG_CAP)
        .map_err(|e| ChainError::Layers(path.into(), e.to_string()))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| ChainError::Layers(path.into(), format!("not valid JSON: {e}")))?;
    let serde_json::Value::Object(m) = v else {
        return Err(ChainError::Layers(
            path.into(),
            "top level must be an object of tool sections".into(),
        ));
    };
    for k in m.keys() {
        if !sbx_core::cli::TOOLS.contains(&k.as_str()) {
            return Err(ChainError::Layers(
                path.into(),
                format!("unknown section '{k}'"),
            ));
        }
    }
    Ok(m.keys().cloned().collect())
}

pub fn plan(p: &Policy, o: &Options, cmd: &[OsString]) -> Result<Plan, ChainError> {
    if o.plugin || o.trust == Trust::Plugin {
        return plugin(p, o, cmd);
    }
    let sections = match &o.layers {
        Some(l) => layer_sections(l)?,
        None => Vec::new(),
    };
    let mut notes = Vec::new();
    if !o.secrets.is_empty() && (o.trust != Trust::Low || o.container) {
        return Err(ChainError::TierUnavailable(
            "--secret: phantom credentials are applied by sbx-net in the namespace chain only: use --trust low without --container".into(),
        ));
    }
    if let Some(x) = &p.exec_allow {
        let low_chain = o.trust == Trust::Low && !o.container;
        // The gVisor tier applies it with noexec mounts (sbx-gvisor).
        let gvisor =
            o.trust == Trust::Zero && !o.latency_sensitive && find_tool("runsc", None).is_some();
        if x.kernel_enforced() && !low_chain && !gvisor {
            return Err(ChainError::TierUnavailable(
                "--exec-allowlist strict: the kernel execute allowlist is applied by the namespace chain (sbx-seccomp --allow-exec) and the gVisor tier only; this tier cannot enforce it: use --trust low without --container, --trust zero with runsc installed, or --exec-allowlist invoke".into(),
            ));
        }
        notes.push(format!(
            "exec allowlist: {}: {}",
            x.mode.name(),
            x.mode.consequences()
        ));
    }
    match o.trust {
        Trust::Full => {
            let join = |v: &[PathBuf]| std::env::join_paths(v).unwrap_or_default();
            notes.push("no kernel isolation: the agent checks each path with sbx-path (library) against these lists".into());
            Ok(Plan {
                tier: "full trust: path allowlist only (sbx-path)",
                layers: vec![cmd.to_vec()],
                env: vec![
                    (os("SBX_PATH_ALLOW_READ"), join(&p.ro)),
                    (os("SBX_PATH_ALLOW_WRITE"), join(&p.rw)),
                ],
                notes,
            })
        }
        Trust::Zero if o.latency_sensitive => {
            let spec = ChainSpec {
                layers: vec![Layer::Vm(VmSpec {
                    backend: vm::Backend::Firecracker,
                    ..vm_spec(p)
                })],
                cmd: cmd.to_vec(),
            };
            Ok(Plan {
                tier: "zero trust, latency-sensitive: sbx-vm with Firecracker",
                layers: render(
                    &spec,
                    o,
                    &sections,
                    "zero trust, latency-sensitive: the Firecracker microVM tier (sbx-vm)",
                )?,
                env: Vec::new(),
                notes,
            })
        }
        Trust::Zero => {
            if let Some(runsc) = find_tool("runsc", None) {
                // As root the whole gVisor sandbox runs inside sbx-cgroup
                // (memory, pids, CPU, wall clock); unprivileged, rlimits and
                // the wall clock only.
                let cgroup = if o.cgroup.unwrap_or_else(|| nix_euid() == 0) {
                    Some(need("sbx-cgroup", "zero trust: gVisor with limits", o)?)
                } else {
                    notes.push(if o.cgroup == Some(false) {
                        "sbx-cgroup left out (--no-cgroup): no total memory, pids or CPU limit on the gVisor sandbox (memory per process through RLIMIT_AS, the other rlimits and the wall clock still apply)".into()
                    } else {
                        "sbx-cgroup left out: not root; runsc --rootless; memory per process (RLIMIT_AS, enforced by gVisor's kernel: no total), processes (RLIMIT_NPROC), file size and the wall clock apply; no total memory or CPU limit".into()
                    });
                    None
                };
                notes.push("gVisor: an OCI bundle from the sbx-fs mount plan (grants, denies, invariants), read-only root; the network is sbx-net's filtered namespace (the same domain allowlist, DNS proxy and alerts as the namespace chain) through gVisor's own TCP/IP (runsc --network=host inside it); uid 0 inside without capabilities is the caller (unprivileged: runsc --rootless shows the caller's files as owned by 0)".into());
                // The same git stage and checks as the namespace chain.
                let stage = git_stage(p);
                let mut spec = ChainSpec {
                    layers: gitguard_layers(p, stage.as_deref()),
                    cmd: cmd.to_vec(),
                };
                let exec = exec_files(p, cmd);
                if let Some(x) = &exec {
                    notes.push(format!("gVisor tier: the execute allowlist ({} files) is enforced by gVisor's kernel: every mount noexec but those files (and the dynamic loaders); refused execs are exec_denied alerts from runsc's exec trace", x.len()));
                }
                if stage.is_none() && p.git_repo {
                    notes.push("gVisor tier: .git is not writable by the grants: git commits fail inside (read-only)".into());
                }
                spec.layers.push(Layer::Net(net_spec(p)));
                spec.layers.push(Layer::Gvisor(gvisor_spec(
                    p,
                    &runsc,
                    cgroup.as_deref(),
                    stage.as_deref(),
                    exec.as_deref().unwrap_or_default(),
                )));
                let layers = render(&spec, o, &sections, "zero trust: gVisor")?;
                return Ok(Plan {
                    tier: "zero trust: gVisor (runsc --platform=ptrace)",
                    layers,
                    env: Vec::new(),
                    notes,
                });
            }
            let spec = ChainSpec {
                layers: vec![Layer::Vm(vm_spec(p))],
                cmd: cmd.to_vec(),
            };
            Ok(Plan {
                tier: "zero trust: sbx-vm (gVisor not installed)",
                layers: render(
                    &spec,
                    o,
                    &sections,
                    "zero trust: gVisor (runsc) is not installed and the microVM tier (sbx-vm)",
                )?,
                env: Vec::new(),
                notes,
            })
        }
        Trust::Low if o.container => {
            let spec = ChainSpec {
                layers: vec![Layer::Container(container_spec(p))],
                cmd: cmd.to_vec(),
            };
            if !p.deny.is_empty() {
                notes.push(format!(
                    "container tier: the rules' own denies ({}) are not applied inside the binds (sbx-container applies the sbx-fs default deny list and invariants)",
                    p.deny.join(", ")
                ));
            }
            if !p.net_allow.is_empty() {
                notes.push("container tier: no network (--net none); the domain allowlist needs the namespace chain".into());
            }
            Ok(Plan {
                tier: "low trust: one container per run (sbx-container)",
                layers: render(
                    &spec,
                    o,
                    &sections,
                    "low trust, container: the container tier (sbx-container)",
                )?,
                env: Vec::new(),
                notes,
            })
        }
        Trust::Plugin => plugin(p, o, cmd),
        Trust::Low => low(p, o, cmd, &sections, notes),
    }
}

/// sbx-fs `--write-quota` of the low-trust chain: what a run may add to the
/// writable binds together (the overlay's upper layer is a tmpfs: it counts
/// in the memory limit).
pub const WRITE_QUOTA: &str = "2G";
/// sbx-fs `--write-inodes` of the low-trust chain.
pub const WRITE_INODES: &str = "500000";

/// The plugin tier: sbx-wasm with the directory grants as preopens (at
/// their own paths), the policy's domains as its wasi:http allowlist, the
/// memory limit and the wall clock.
fn plugin(p: &Policy, o: &Options, cmd: &[OsString]) -> Result<Plan, ChainError> {
    let sections = match &o.layers {
        Some(l) => layer_sections(l)?,
        None => Vec::new(),
    };
    let (wasm, skipped) = wasm_spec(p);
    let spec = ChainSpec {
        layers: vec![Layer::Wasm(wasm)],
        cmd: cmd.to_vec(),
    };
    let layers = render(&spec, o, &sections, "the plugin tier (sbx-wasm)")?;
    let mut notes = vec![
        "CMD is a WebAssembly module (WASI preview 1) or component (preview 2): directory grants are its preopens, inside sbx-fs (deny list and invariants hold); no processes, so the Bash rules have nothing to run".into(),
        if p.net_allow.is_empty() {
            "no network: no domain is allowed".into()
        } else {
            format!(
                "network: a component's outgoing HTTP (wasi:http) to the allowed domains only ({}), checked with sbx-net's allowlist; no sockets",
                p.net_allow.join(", ")
            )
        },
    ];
    if !skipped.is_empty() {
        notes.push(format!(
            "grants that are not directories are not preopens (WASI preopens directories): {}",
            skipped.join(", ")
        ));
    }
    Ok(Plan {
        tier: "plugin: WebAssembly/WASI (sbx-wasm)",
        layers,
        env: Vec::new(),
        notes,
    })
}

/// sbx-vm's part of the zero-trust tiers without gVisor: the limits, the
/// tmpfs layer the size of /tmp, the project copied in (the VM shares no
/// host filesystem).
pub fn vm_spec(p: &Policy) -> VmSpec {
    VmSpec {
        memory: p.limits.memory.clone(),
        timeout: Some(p.limits.timeout.clone()),
        tmpfs: Some(p.limits.tmp_size.clone()),
        copy_in: Some(p.cwd.clone()),
        ..VmSpec::default()
    }
}

/// sbx-container's part of the low-trust container tier: the grants as
/// binds at their own paths, the limits, no network.
pub fn container_spec(p: &Policy) -> ContainerSpec {
    let same = |r: &PathBuf| os(format!("{0}:{0}", r.display()));
    ContainerSpec {
        rw: p.rw.iter().map(same).collect(),
        ro: p.ro.iter().map(same).collect(),
        memory: Some(p.limits.memory.clone()),
        cpus: Some(p.limits.cpus.clone()),
        pids: Some(p.limits.pids.clone()),
        tmp_size: Some(p.limits.tmp_size.clone()),
        timeout: Some(p.limits.timeout.clone()),
        net: Some(container::Net::None),
        chdir: Some(p.start.clone()),
        ..ContainerSpec::default()
    }
}

/// The low-trust chain's layers for a policy (no side effect: `explain`
/// reads the same spec `chain` renders). `run_id` names the per-run git
/// stage (None: this run's sandbox id); `sections`: the tools that have a
/// `--layers` section; the limit plan says which limits apply and how.
pub fn low_spec(
    p: &Policy,
    run_id: Option<&str>,
    cgroup: bool,
    secrets: &[String],
    sections: &[String],
    cmd: &[OsString],
) -> (ChainSpec, crate::limitplan::LimitPlan) {
    let mut spec = ChainSpec {
        layers: Vec::new(),
        cmd: cmd.to_vec(),
    };
    // sbx-creds is given its --layers section only.
    if sections.iter().any(|s| s == "sbx-creds") {
        spec.layers.push(Layer::Tool {
            tool: "sbx-creds".into(),
        });
    }
    let stage = match run_id {
        Some(id) => git_stage_named(p, id),
        None => git_stage(p),
    };
    spec.layers.extend(gitguard_layers(p, stage.as_deref()));
    // sbx-cgroup is in the chain unless --no-cgroup: without root or a
    // delegated cgroup it still applies the limits that need none (and
    // is given only those; the notes say which do not apply).
    let lp = crate::limitplan::plan(&p.limits, &crate::limitplan::detect(), cgroup);
    if let Some(c) = &lp.cgroup {
        if let Some(prefix) = &lp.prefix {
            spec.layers.push(Layer::Argv(prefix.clone()));
        }
        spec.layers.push(Layer::Cgroup(c.clone()));
    }
    spec.layers.push(Layer::Net(NetSpec {
        // Phantom credentials: the namespace chain only (checked in plan()).
        secret: secrets.to_vec(),
        ..net_spec(p)
    }));
    spec.layers.push(Layer::Fs(fs_spec(p, stage.as_deref())));
    spec.layers.push(Layer::Seccomp(seccomp_spec(p, cmd)));
    (spec, lp)
}

fn low(
    p: &Policy,
    o: &Options,
    cmd: &[OsString],
    sections: &[String],
    mut notes: Vec<String>,
) -> Result<Plan, ChainError> {
    let (spec, lp) = low_spec(p, None, o.cgroup.unwrap_or(true), &o.secrets, sections, cmd);
    notes.extend(lp.notes());
    sbx_core::audit::emit(
        "limits",
        sbx_core::Severity::Info,
        serde_json::json!({
            "source": lp.source,
            "applied": lp.rows.iter().filter(|r| r.applies)
                .map(|r| serde_json::json!({"limit": r.limit, "value": r.value, "how": r.how}))
                .collect::<Vec<_>>(),
            "not_applied": lp.rows.iter().filter(|r| !r.applies)
                .map(|r| serde_json::json!({"limit": r.limit, "value": r.value, "why": r.how}))
                .collect::<Vec<_>>(),
        }),
    );
    Ok(Plan {
        tier: "low trust: the namespace chain",
        layers: render(&spec, o, sections, "low trust: the namespace chain")?,
        env: Vec::new(),
        notes,
    })
}

/// Each layer as the argv of its tool (found as [`need`] finds it), with
/// `--config` where the --layers file has the tool's section; the
/// command last.
fn render(
    spec: &ChainSpec,
    o: &Options,
    sections: &[String],
    tier: &str,
) -> Result<Vec<Vec<OsString>>, ChainError> {
    let mut out = Vec::new();
    for l in &spec.layers {
        let Some(tool) = l.tool() else {
            if let Layer::Argv(v) = l {
                out.push(v.iter().map(os).collect());
            }
            continue;
        };
        let mut v = vec![os(need(tool, tier, o)?)];
        v.extend(l.args());
        if let Some(f) = &o.layers
            && l.takes_config()
            && sections.iter().any(|s| s == tool)
        {
            v.extend(sbx_core::cli::config_args(f));
        }
        out.push(v);
    }
    out.push(spec.cmd.clone());
    Ok(out)
}

/// sbx-fs's part of the namespace chain; `compile` has it without a git
/// stage (one is made per run).
pub fn fs_spec(p: &Policy, stage: Option<&Path>) -> FsSpec {
    // The writable binds' budget (docs/policy.md, default limits); "off":
    // none, the writes reach the host live.
    let budget = p.limits.write_quota != "off";
    FsSpec {
        rw: p.rw.iter().map(os).collect(),
        ro: p.ro.iter().map(os).collect(),
        deny: p.deny.iter().map(os).collect(),
        pass_env: p.pass_env.clone(),
        chdir: p.project_visible().then(|| p.start.clone()),
        tmp_size: p.limits.tmp_size.clone(),
        write_quota: budget.then(|| p.limits.write_quota.clone()),
        write_inodes: budget.then(|| p.limits.write_inodes.parse().ok()).flatten(),
        git_stage: stage.map(Path::to_path_buf),
        setenv: safe_directory_env(p).into_iter().map(os).collect(),
        git_identity: p.git_identity,
        ..FsSpec::default()
    }
}

/// sbx-seccomp's part: the default profile and, in strict mode, the
/// execute allowlist (sbx-seccomp applies it with Landlock and reports
/// refused execs, exec_denied). sbx-fs opens sbx-seccomp (an sbx tool) on
/// the host and executes it by fd: its directory need not be visible.
pub fn seccomp_spec(p: &Policy, cmd: &[OsString]) -> SeccompSpec {
    SeccompSpec {
        profile: Some(Profile::Default),
        allow_exec: exec_files(p, cmd).unwrap_or_default(),
        ..SeccompSpec::default()
    }
}

/// sbx-wasm for the plugin tier: the directory grants as preopens at
/// their own paths (grants that are not directories are returned apart:
/// WASI preopens directories), the environment names, the policy's
/// domains as the wasi:http allowlist, memory and the wall clock.
pub fn wasm_spec(p: &Policy) -> (sbx_spec::WasmSpec, Vec<String>) {
    let mut spec = sbx_spec::WasmSpec {
        pass_env: p.pass_env.clone(),
        allow: p.net_allow.clone(),
        memory: p.limits.memory.clone(),
        timeout: Some(p.limits.timeout.clone()),
        ..sbx_spec::WasmSpec::default()
    };
    let mut skipped = Vec::new();
    for (list, to) in [(&p.rw, &mut spec.rw), (&p.ro, &mut spec.ro)] {
        for r in list {
            if r.is_dir() {
                to.push(os(format!("{0}:{0}", r.display())));
            } else {
                skipped.push(r.display().to_string());
            }
        }
    }
    (spec, skipped)
}

/// sbx-net with the policy's allowed domains (the low-trust chain and the
/// gVisor tier: the same egress policy).
pub fn net_spec(p: &Policy) -> NetSpec {
    NetSpec {
        allow: p.net_allow.clone(),
        ..NetSpec::default()
    }
}

/// sbx-gvisor's part of the zero-trust tier (`cgroup`: sbx-cgroup when
/// the limits are to be applied, `stage` the git stage, `exec` the execute
/// allowlist); it runs inside sbx-net, whose namespace it gives the
/// sandbox (`host_network`).
pub fn gvisor_spec(
    p: &Policy,
    runsc: &Path,
    cgroup: Option<&Path>,
    stage: Option<&Path>,
    exec: &[PathBuf],
) -> GvisorSpec {
    GvisorSpec {
        runsc: runsc.to_path_buf(),
        cgroup_bin: cgroup.map(Path::to_path_buf),
        ro: p.ro.iter().map(os).collect(),
        rw: p.rw.iter().map(os).collect(),
        deny: p.deny.iter().map(os).collect(),
        chdir: p.project_visible().then(|| p.start.clone()),
        tmp_size: p.limits.tmp_size.clone(),
        memory: Some(p.limits.memory.clone()),
        pids: p.limits.pids.parse().ok(),
        cpus: Some(p.limits.cpus.clone()),
        timeout: Some(p.limits.timeout.clone()),
        allow_exec: exec.to_vec(),
        git_stage: stage.map(Path::to_path_buf),
        fsize: Some(p.limits.fsize.clone()),
        pass_env: p.pass_env.clone(),
        keep_env: false,
        host_network: true,
    }
}

/// `sbx-gitguard run` when the project is a repository (with the git
/// stage when there is one), with the plant check of every writable
/// directory in the same process (`--plants`).
pub fn gitguard_spec(p: &Policy, stage: Option<&Path>) -> Option<GitguardRunSpec> {
    p.git_repo.then(|| GitguardRunSpec {
        repo: RepoSpec {
            repo: p.cwd.clone(),
            ..RepoSpec::default()
        },
        stage: stage.map(Path::to_path_buf),
        plants: writable_dirs(p),
        ..GitguardRunSpec::default()
    })
}

/// Where the command can plant a repository: every writable directory
/// (git runs a planted repository's fsmonitor and hooks on the host
/// later), git project or not.
fn writable_dirs(p: &Policy) -> Vec<PathBuf> {
    p.rw.iter().filter(|r| r.is_dir()).cloned().collect()
}

/// sbx-gitguard's layer, in front of the sandbox: `run` when the project
/// is a repository (its plant check included), else `plants` when
/// something is writable. Either checks the plants right after the
/// command, before the repository's own check.
fn gitguard_layers(p: &Policy, stage: Option<&Path>) -> Vec<Layer> {
    if let Some(run) = gitguard_spec(p, stage) {
        return vec![Layer::Gitguard(run)];
    }
    let dirs = writable_dirs(p);
    if dirs.is_empty() {
        return Vec::new();
    }
    vec![Layer::Plants(PlantsSpec {
        dirs,
        ..PlantsSpec::default()
    })]
}

/// The kernel execute allowlist's files for a command (None: none, the
/// invoke mode or no Bash rules): the namespace chain gives them to
/// sbx-seccomp, the gVisor tier to sbx-gvisor.
pub fn exec_files(p: &Policy, cmd: &[OsString]) -> Option<Vec<PathBuf>> {
    p.exec_allow
        .as_ref()
        .filter(|x| x.kernel_enforced())
        .map(|x| x.strict_files(cmd, &p.start))
}

/// Where this turn's git commits are staged: when the project is a
/// repository whose .git directory is writable by the grants, sbx-fs shows
/// it through an overlay onto this directory and sbx-gitguard imports what
/// it verifies after the command (the host's .git/HEAD, objects and refs
/// stay invariants). Named after the sandbox id: one stage per turn.
fn git_stage(p: &Policy) -> Option<PathBuf> {
    let id = sbx_core::id::get().map_or_else(|| std::process::id().to_string(), str::to_string);
    git_stage_named(p, &id)
}

fn git_stage_named(p: &Policy, id: &str) -> Option<PathBuf> {
    let git = p.cwd.join(".git");
    let writable = p.rw.iter().any(|r| git.starts_with(r));
    if !p.git_repo || !writable || !git.is_dir() {
        return None;
    }
    Some(std::env::temp_dir().join(format!("sbx-git-stage-{id}")))
}

/// In another user's repository (root in a user's checkout) git refuses
/// to work ("dubious ownership"), inside the sandbox too: the sandboxed
/// command's git alone is told that this one top level is safe
/// (command-line scope, as `git -c safe.directory=TOP`; never the host's
/// config). Its config is read-only inside and sbx-gitguard checks the
/// repository afterwards, so nothing of it runs outside the sandbox.
pub fn safe_directory_env(p: &Policy) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    if !p.git_repo {
        return Vec::new();
    }
    let euid = nix_euid();
    let foreign = [p.cwd.clone(), p.cwd.join(".git")]
        .iter()
        .any(|d| std::fs::symlink_metadata(d).is_ok_and(|m| m.uid() != euid));
    if !foreign {
        return Vec::new();
    }
    vec![
        "GIT_CONFIG_COUNT=1".into(),
        "GIT_CONFIG_KEY_0=safe.directory".into(),
        format!("GIT_CONFIG_VALUE_0={}", p.cwd.display()),
    ]
}

fn nix_euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}
