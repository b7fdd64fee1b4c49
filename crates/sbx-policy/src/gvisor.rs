//! The zero-trust tier without a latency constraint: gVisor.
//!
//! `runsc do` cannot express the grants (it shows the whole host file
//! system read-only, writes go to an in-memory overlay, nothing can be
//! hidden), so `sbx-policy gvisor` (a hidden step of the chain) writes an
//! OCI bundle into a private temporary directory and runs it with
//! `runsc run`:
//!
//! - the mounts are sbx-fs's own mount plan (`sbx_fs::build_plan`) for the
//!   same `--rw`/`--ro`/`--deny` flags: system directories read-only, the
//!   grants, the default deny list, name patterns, the write-protected
//!   `.git`/`.claude` invariants; hidden files are covered by an empty
//!   mode-000 file, hidden directories by an empty mode-000 read-only tmpfs;
//!   mount points missing on the host are sbx-fs placeholders (created
//!   before, removed after, reaped if this process is killed);
//! - a read-only root (an empty directory), a fresh /tmp, /dev/shm and
//!   $HOME tmpfs, gVisor's own /proc and /dev;
//! - uid 0 inside with no capability at all and no_new_privs (as root: host
//!   root without capabilities behind the gVisor kernel; unprivileged:
//!   `runsc --rootless`, uid 0 inside is the caller);
//! - `--platform=ptrace`; the network: with `--host-network` the namespace
//!   runsc runs in (the chain puts this step inside sbx-net, so the
//!   sandbox gets sbx-net's filtered namespace, its allowlist, DNS proxy
//!   and alerts, through gVisor's own TCP/IP over host sockets), else
//!   `--network=none` (only a loopback interface inside) where names fail
//!   at once (`hosts: files`, a resolv.conf on loopback);
//! - the git stage (`--git-stage`): the stage's overlay is mounted by the
//!   host's kernel in runsc's own mount namespace and `.git` bound from it;
//! - the execute allowlist (`--allow-exec`): every mount noexec but the
//!   listed files; refused execs are read from runsc's exec trace;
//! - rlimits (file size, processes, open files); as root the whole sandbox
//!   (the gVisor kernel, its gofer and every stub process) runs inside
//!   `sbx-cgroup` with the tier's memory, pids, CPU and wall-clock limits.
//!
//! Cleanup: runsc's state directory lives in the private temporary
//! directory. At the end the container is deleted and the directory
//! removed; a guardian process (double-forked, its own session, outside the
//! cgroup) does the same when this process dies without having done it
//! (SIGKILL).

use std::ffi::OsString;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sbx_core::Failure;
use sbx_core::Severity;
use sbx_core::supervise::{Supervisor, Wake};
use sbx_fs::plan::{Kind, Op, Plan, What};
use serde_json::{Value, json};

use crate::map::Policy;
use sbx_spec::GvisorSpec;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The grants and limits (the flags; sbx-spec).
    #[command(flatten)]
    pub spec: GvisorSpec,
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<OsString>,
}

/// Exit status when the wall-clock limit fired (as timeout(1), sbx-cgroup).
const TIMED_OUT: i32 = 124;

fn os<S: AsRef<std::ffi::OsStr>>(s: S) -> OsString {
    s.as_ref().to_os_string()
}

/// The chain layer `sbx-policy gvisor ...` for a policy (`cgroup`:
/// sbx-cgroup when the limits are to be applied, `stage` the git stage,
/// `exec` the execute allowlist).
pub fn spec(
    p: &Policy,
    runsc: &Path,
    cgroup: Option<&Path>,
    stage: Option<&Path>,
    exec: &[PathBuf],
    host_network: bool,
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
        host_network,
    }
}

/// The sbx-fs plan for the grants (checks every flag; opens every source).
fn fs_plan(a: &Args) -> Result<Plan, Failure> {
    let spec = sbx_fs::build_spec(&sbx_spec::FsSpec {
        ro: a.spec.ro.clone(),
        rw: a.spec.rw.clone(),
        deny: a.spec.deny.clone(),
        git_stage: a.spec.git_stage.clone(),
        tmp_size: a.spec.tmp_size.clone(),
        ..sbx_spec::FsSpec::default()
    })?;
    let env = sbx_core::chain::current_env();
    sbx_fs::build_plan(&spec, &env)
}

/// CMD as the sandbox will look it up (PATH's directories that a bind
/// makes visible): not found 127, not executable 126, before anything is
/// started (runsc itself would only fail with a message).
fn check_command(prog: &std::ffi::OsStr, plan: &Plan) -> Result<(), Failure> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| os("/usr/bin:/bin"));
    let visible: Vec<PathBuf> = std::env::split_paths(&path)
        .filter(|d| {
            d.is_absolute()
                && plan.ops.iter().any(|o| {
                    (matches!(o.what, What::Bind { .. } | What::Symlink { .. }))
                        && d.starts_with(&o.dst)
                })
        })
        .collect();
    let joined = std::env::join_paths(&visible).unwrap_or_default();
    let p = sbx_core::chain::resolve(prog, Some(&joined))?;
    // A path given with a slash: resolve does not look at it.
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| Failure::with_code(sbx_core::exit::NOT_FOUND, "command name with a NUL"))?;
    let shown = p.display();
    // SAFETY: a valid C string.
    if unsafe { libc::access(c.as_ptr(), libc::F_OK) } != 0 {
        return Err(Failure::with_code(
            sbx_core::exit::NOT_FOUND,
            format!("{shown}: command not found"),
        ));
    }
    // SAFETY: as above.
    if p.is_dir() || unsafe { libc::access(c.as_ptr(), libc::X_OK) } != 0 {
        return Err(Failure::with_code(
            sbx_core::exit::NOT_EXECUTABLE,
            format!("{shown}: permission denied"),
        ));
    }
    Ok(())
}

/// Files the bundle needs besides config.json.
struct Bundle {
    dir: PathBuf,
    rootfs: PathBuf,
    /// Empty, mode 000: covers a hidden file.
    denied_file: PathBuf,
    /// Empty, mode 0444: a protected file that does not exist.
    empty_file: PathBuf,
    /// Where the git stage's overlay is mounted (runsc's own mount
    /// namespace), when there is a stage.
    gitview: Option<PathBuf>,
    /// Every mount noexec but the allowlist's files.
    noexec: bool,
    /// The caller's uid and gid: the owner of the tmpfs it owns.
    owner: (u32, u32),
}

/// The OCI mounts for the plan (sbx-fs's ops in its order, parent first).
fn mounts(
    plan: &Plan,
    b: &Bundle,
    tmp_size: u64,
    exec: &[PathBuf],
    host_network: bool,
) -> Result<Vec<Value>, Failure> {
    let mut out = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc"}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "noexec", "mode=755", "size=65536"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts",
               "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]}),
        json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
               "options": ["nosuid", "nodev", "noexec", "mode=1777", format!("size={tmp_size}")]}),
    ];
    let noexec = b.noexec;
    let bind_x = |dst: &Path, src: &Path, ro: bool, exec: bool| {
        let mut o = vec!["rbind", if ro { "ro" } else { "rw" }];
        if !exec {
            o.push("noexec");
        }
        json!({"destination": dst, "type": "bind", "source": src, "options": o})
    };
    let bind = |dst: &Path, src: &Path, ro: bool| bind_x(dst, src, ro, !noexec);
    let tmpfs = |dst: &Path, size: u64, mode: u32, ro: bool, owned: bool| {
        let mut o = vec![
            "nosuid".to_string(),
            "nodev".to_string(),
            format!("mode={mode:o}"),
            format!("size={size}"),
        ];
        if ro {
            o.push("ro".into());
        }
        if noexec {
            o.push("noexec".into());
        }
        if owned {
            o.push(format!("uid={}", b.owner.0));
            o.push(format!("gid={}", b.owner.1));
        }
        json!({"destination": dst, "type": "tmpfs", "source": "tmpfs", "options": o})
    };
    for (i, op) in plan.ops.iter().enumerate() {
        // gVisor's own /proc (its kernel's: no host process is there) and
        // /dev (null, zero, full, random, urandom, tty, pts, shm).
        if op.dst.starts_with("/proc") || op.dst.starts_with("/dev") {
            continue;
        }
        let enclosing = sbx_fs::plan::enclosing(&plan.ops, i);
        // The host object at the destination, when it lies in a bind.
        let host = enclosing.and_then(|j| host_path(plan, b, j, &op.dst));
        // A hidden or protected object the caller itself cannot open is
        // hidden already (runsc's gofer opens files as the caller; rootless,
        // a mount over it would fail): /etc/gshadow for a user.
        if matches!(op.what, What::Deny | What::ReadOnly)
            && let Some(h) = &host
            && std::fs::File::open(h)
                .is_err_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied)
        {
            continue;
        }
        match &op.what {
            What::Bind { src, ro } => {
                out.push(bind(&op.dst, &plan.sources[*src].path, *ro));
            }
            What::Tmpfs { size, mode, owned } => {
                out.push(tmpfs(&op.dst, *size, *mode, false, *owned))
            }
            What::Symlink { target } => {
                if enclosing.is_some() {
                    return Err(Failure::new(format!(
                        "gvisor: symlink {} inside a mount is not supported",
                        op.dst.display()
                    )));
                }
                let at = b.rootfs.join(op.dst.strip_prefix("/").unwrap_or(&op.dst));
                if let Some(d) = at.parent() {
                    std::fs::create_dir_all(d)
                        .map_err(|e| Failure::new(format!("gvisor: {}: {e}", d.display())))?;
                }
                std::os::unix::fs::symlink(target, &at)
                    .map_err(|e| Failure::new(format!("gvisor: {}: {e}", at.display())))?;
            }
            What::Deny => match op.kind {
                Kind::Dir => out.push(tmpfs(&op.dst, 4096, 0, true, false)),
                Kind::File => out.push(bind(&op.dst, &b.denied_file, true)),
            },
            What::Empty => match op.kind {
                Kind::Dir => out.push(tmpfs(&op.dst, 4096, 0o555, true, false)),
                Kind::File => out.push(bind(&op.dst, &b.empty_file, true)),
            },
            What::ReadOnly => {
                let Some(h) = host else {
                    tracing::debug!(dst = %op.dst.display(), "read-only op outside a bind: nothing to protect");
                    continue;
                };
                out.push(bind(&op.dst, &h, true));
            }
            What::Proc | What::Devpts => {}
            // The overlay itself is mounted on the host side, in runsc's
            // own mount namespace (see `GitView`): bound from there.
            What::Overlay { .. } => match &b.gitview {
                Some(v) => out.push(bind(&op.dst, v, false)),
                None => {
                    return Err(Failure::new(format!(
                        "gvisor: the git stage overlay at {} has no mount",
                        op.dst.display()
                    )));
                }
            },
        }
        // Mount points at the top level are made in the (read-only) root.
        if enclosing.is_none() && !matches!(op.what, What::Symlink { .. }) {
            make_mount_point(&b.rootfs, op)?;
        }
    }
    if noexec {
        out.extend(exec_binds(plan, b, exec));
    }
    if !host_network {
        out.extend(dns_binds(plan, b)?);
    }
    Ok(out)
}

/// The host object shown at `dst` by op `j` (a bind, or the git stage's
/// overlay), when `dst` lies in it.
fn host_path(plan: &Plan, b: &Bundle, j: usize, dst: &Path) -> Option<PathBuf> {
    let o = &plan.ops[j];
    let rel = dst.strip_prefix(&o.dst).ok()?;
    match o.what {
        What::Bind { src, .. } => Some(plan.sources[src].path.join(rel)),
        What::Overlay { .. } => b.gitview.as_ref().map(|v| v.join(rel)),
        _ => None,
    }
}

/// The execute allowlist: every other mount is noexec, so gVisor's kernel
/// refuses any other execve (EACCES); each listed file (and directory) is
/// bound onto itself without noexec, read-only or writable as the grant it
/// lies in. What the plan hides or does not show stays so.
fn exec_binds(plan: &Plan, b: &Bundle, exec: &[PathBuf]) -> Vec<Value> {
    let mut out = Vec::new();
    for x in sbx_seccomp::landlock::allowlist(exec) {
        // The innermost op at or above x (the ops are parent first).
        let Some(j) = plan.ops.iter().rposition(|o| x.starts_with(&o.dst)) else {
            continue;
        };
        let ro = match plan.ops[j].what {
            What::Bind { ro, .. } => ro,
            What::ReadOnly => true,
            _ => continue,
        };
        // A hidden path below x (a denied file in a listed directory) is
        // mounted after x by the plan: keep it hidden, list no directory
        // that contains one (nor one with a nested grant).
        if plan.ops.iter().any(|o| o.dst != x && o.dst.starts_with(&x)) {
            tracing::warn!(path = %x.display(), "allow-exec directory with hidden or protected entries: not executable");
            continue;
        }
        if let Some(h) = host_path(plan, b, j, &x)
            && h.exists()
        {
            out.push(json!({"destination": x, "type": "bind", "source": h,
                            "options": ["rbind", if ro { "ro" } else { "rw" }]}));
        }
    }
    out
}

/// Names fail at once inside (there is no network, so no resolver can be
/// reached): the hosts file only (`hosts: files` in nsswitch.conf, so
/// getaddrinfo answers EAI_NONAME without a query) and a resolv.conf naming
/// gVisor's loopback, where nothing listens (a program with its own
/// resolver gets "connection refused" at once), instead of the host's
/// resolver, which is unreachable: 70-90 s of retries for each name.
fn dns_binds(plan: &Plan, b: &Bundle) -> Result<Vec<Value>, Failure> {
    let mut out = Vec::new();
    let dir = b.dir.parent().unwrap_or(&b.dir).join("etc");
    for (name, host) in [
        ("nsswitch.conf", Path::new("/etc/nsswitch.conf")),
        ("resolv.conf", Path::new("/etc/resolv.conf")),
    ] {
        // Shown through a bind of the host's /etc, as a regular file (a
        // symlink would lead the mount elsewhere; without the file glibc
        // asks 127.0.0.1, which fails at once too).
        let shown = plan.ops.iter().rposition(|o| host.starts_with(&o.dst));
        if !shown.is_some_and(|j| matches!(plan.ops[j].what, What::Bind { .. }))
            || !host.symlink_metadata().is_ok_and(|m| m.is_file())
        {
            continue;
        }
        let text = if name == "resolv.conf" {
            "# sbx gVisor tier: no network; names fail at once\nnameserver 127.0.0.1\noptions timeout:1 attempts:1\n".to_string()
        } else {
            let host_text = std::fs::read_to_string(host).unwrap_or_default();
            let mut t: String = host_text
                .lines()
                .filter(|l| !l.trim_start().starts_with("hosts:"))
                .map(|l| format!("{l}\n"))
                .collect();
            t.push_str("hosts: files\n");
            t
        };
        std::fs::create_dir_all(&dir)
            .map_err(|e| Failure::new(format!("gvisor: {}: {e}", dir.display())))?;
        let f = dir.join(name);
        std::fs::write(&f, text)
            .map_err(|e| Failure::new(format!("gvisor: {}: {e}", f.display())))?;
        out.push(json!({"destination": host, "type": "bind", "source": f,
                        "options": ["rbind", "ro", "noexec"]}));
    }
    Ok(out)
}

fn make_mount_point(rootfs: &Path, op: &Op) -> Result<(), Failure> {
    let at = rootfs.join(op.dst.strip_prefix("/").unwrap_or(&op.dst));
    let err = |e: std::io::Error| Failure::new(format!("gvisor: {}: {e}", at.display()));
    if at.symlink_metadata().is_ok() {
        return Ok(());
    }
    match op.kind {
        Kind::Dir => std::fs::create_dir_all(&at).map_err(err),
        Kind::File => {
            if let Some(d) = at.parent() {
                std::fs::create_dir_all(d).map_err(err)?;
            }
            std::fs::write(&at, b"").map_err(err)
        }
    }
}

fn rlimit(kind: &str, n: u64) -> Value {
    json!({"type": kind, "hard": n, "soft": n})
}

fn nofile() -> (u64, u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscall on a local struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return (1024, 1024);
    }
    (r.rlim_cur, r.rlim_max)
}

/// RLIMIT_NPROC inside gVisor (which enforces it: a fork fails with
/// EAGAIN). Under sbx-cgroup the host-side pids limit also counts gVisor's
/// own threads, its gofer and a ptrace stub thread per task, so the guest
/// gets less than half of it: a fork bomb then meets EAGAIN inside instead
/// of taking the whole sandbox down at the host limit.
pub fn guest_nproc(pids: u64, under_cgroup: bool) -> u64 {
    if under_cgroup {
        (pids.saturating_sub(128) / 16).max(8)
    } else {
        pids
    }
}

/// The environment policy of the flags and SBX_PASS_ENV (the same as
/// sbx-fs's: sbx_core::envpolicy).
fn env_policy(a: &Args) -> Result<sbx_core::envpolicy::Policy, Failure> {
    let mut p = sbx_core::envpolicy::Policy {
        keep_all: a.spec.keep_env,
        pass: Vec::new(),
    };
    for e in &a.spec.pass_env {
        p.pass.push(
            sbx_core::envpolicy::parse_pass("--pass-env", e)
                .map_err(|e| Failure::new(format!("gvisor: {e}")))?,
        );
    }
    p.add_from_env()
        .map_err(|e| Failure::new(format!("gvisor: {e}")))?;
    Ok(p)
}

/// config.json (`owner`: the identity inside, the caller's as in the
/// other tiers).
fn config(a: &Args, mounts: Vec<Value>, owner: (u32, u32)) -> Result<Value, Failure> {
    let mut env: Vec<String> = Vec::new();
    let caller = sbx_core::chain::current_env();
    let had_tmpdir = caller.iter().any(|(k, _)| k == "TMPDIR");
    let mut filtered = sbx_core::envpolicy::filter(caller, &env_policy(a)?);
    // The caller's TMPDIR is a host path; inside, /tmp is a fresh tmpfs.
    if had_tmpdir && !filtered.env.iter().any(|(k, _)| k == "TMPDIR") {
        filtered.env.push(("TMPDIR".into(), "/tmp".into()));
    }
    sbx_core::envpolicy::report("sbx-policy gvisor", &filtered);
    for (k, v) in std::mem::take(&mut filtered.env) {
        if k == "SBX_AUDIT_FD" || k == sbx_core::supervise::ENV_SUPERVISOR {
            continue;
        }
        match (k.to_str(), v.to_str()) {
            (Some(k), Some(v)) => env.push(format!("{k}={v}")),
            _ => tracing::warn!(?k, "environment variable that is not UTF-8 left out"),
        }
    }
    let args: Vec<String> = a
        .cmd
        .iter()
        .map(|w| {
            w.to_str().map(str::to_string).ok_or_else(|| {
                Failure::new(format!(
                    "gvisor: the command word {w:?} is not UTF-8 (an OCI bundle cannot carry it)"
                ))
            })
        })
        .collect::<Result<_, _>>()?;
    let mut rl = Vec::new();
    if let Some(f) = &a.spec.fsize {
        let n = sbx_core::units::parse_size(f)
            .map_err(|e| Failure::new(format!("--fsize {f}: {e}")))?;
        rl.push(rlimit("RLIMIT_FSIZE", n));
    }
    if let Some(n) = a.spec.pids {
        rl.push(rlimit(
            "RLIMIT_NPROC",
            guest_nproc(n, a.spec.cgroup_bin.is_some()),
        ));
    }
    // Without a cgroup (rootless runsc), memory is bounded per process by
    // gVisor's kernel (RLIMIT_DATA, as the namespace chain does without
    // root): no total, but no single process can take more.
    if a.spec.cgroup_bin.is_none()
        && let Some(m) = &a.spec.memory
    {
        let n = sbx_core::units::parse_size(m)
            .map_err(|e| Failure::new(format!("--memory {m}: {e}")))?;
        rl.push(rlimit("RLIMIT_AS", n));
    }
    let (soft, hard) = nofile();
    rl.push(json!({"type": "RLIMIT_NOFILE", "soft": soft, "hard": hard}));
    rl.push(rlimit("RLIMIT_CORE", 0));
    let cwd = a
        .spec
        .chdir
        .as_ref()
        .map(|c| c.display().to_string())
        .unwrap_or_else(|| "/".into());
    let none: [&str; 0] = [];
    let mut namespaces = vec![
        json!({"type": "pid"}),
        json!({"type": "ipc"}),
        json!({"type": "uts"}),
        json!({"type": "mount"}),
    ];
    // runsc --network=host uses the namespace it runs in only when the spec
    // asks for no new one (with one, the sandbox sees a bare loopback).
    if !a.spec.host_network {
        namespaces.push(json!({"type": "network"}));
    }
    let mut linux = json!({ "namespaces": namespaces });
    // With an execute allowlist: a memfd is on no mount of ours, and gVisor
    // runs one (execveat, /proc/self/fd/N) whatever the noexec mounts say,
    // so memfd_create is refused (gVisor answers EPERM; runsc --oci-seccomp).
    // (This runsc answers EPERM for every SCMP_ACT_ERRNO whatever errnoRet
    // says, and ignores SCMP_ACT_TRACE: a rule cannot turn statx into
    // ENOSYS to make glibc fall back from the statx flag it rejects.)
    if !a.spec.allow_exec.is_empty() {
        let arch = if cfg!(target_arch = "aarch64") {
            "SCMP_ARCH_AARCH64"
        } else {
            "SCMP_ARCH_X86_64"
        };
        linux["seccomp"] = json!({
            "defaultAction": "SCMP_ACT_ALLOW",
            "architectures": [arch],
            "syscalls": [{"names": ["memfd_create"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1}],
        });
    }
    Ok(json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": owner.0, "gid": owner.1},
            "args": args,
            "env": env,
            "cwd": cwd,
            "capabilities": {"bounding": none, "effective": none, "inheritable": none,
                             "permitted": none, "ambient": none},
            "noNewPrivileges": true,
            "rlimits": rl,
        },
        "root": {"path": "rootfs", "readonly": true},
        "hostname": "sbx",
        "mounts": mounts,
        "linux": linux,
    }))
}

fn euid() -> u32 {
    // SAFETY: cannot fail.
    unsafe { libc::geteuid() }
}

fn egid() -> u32 {
    // SAFETY: cannot fail.
    unsafe { libc::getegid() }
}

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
fn teardown(runsc: &Path, state: &Path, id: &str, dir: &Path) {
    if state.join(id).exists() || std::fs::read_dir(state).is_ok_and(|mut d| d.next().is_some()) {
        let _ = Command::new(runsc)
            .args(runsc_globals(state, false))
            .args(["delete", "--force", id])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    let _ = std::fs::remove_dir_all(dir);
}

fn pipe() -> Result<(OwnedFd, OwnedFd), Failure> {
    sbx_core::fds::pipe().map_err(|e| Failure::new(format!("gvisor: pipe: {e}")))
}

/// The guardian: cleans up when `trigger` reaches EOF (this process gone or
/// done), then closes `done`.
struct Guardian {
    trigger: Option<OwnedFd>,
    done: Option<OwnedFd>,
}

impl Guardian {
    fn start(runsc: &Path, state: &Path, id: &str, dir: &Path) -> Result<Guardian, Failure> {
        let (tr, tw) = pipe()?;
        let (dr, dw) = pipe()?;
        // SAFETY: sbx-policy is single-threaded here; the child only uses
        // what it needs and ends with _exit.
        match unsafe { libc::fork() } {
            -1 => Err(Failure::new(format!(
                "gvisor: fork: {}",
                std::io::Error::last_os_error()
            ))),
            0 => {
                drop(tw);
                drop(dr);
                // SAFETY: the forked child of a single-threaded process:
                // setsid and fork take no arguments, chdir a NUL-terminated
                // literal; the intermediate child leaves by _exit at once,
                // running none of sbx-policy's destructors or atexit hooks.
                unsafe {
                    libc::setsid();
                    if libc::fork() != 0 {
                        libc::_exit(0);
                    }
                    libc::chdir(c"/".as_ptr());
                }
                sbx_core::fds::close_all_except(&[tr.as_raw_fd(), dw.as_raw_fd()]);
                sbx_core::fds::stdio_to_dev_null();
                let mut f = std::fs::File::from(tr);
                let mut buf = [0u8; 16];
                loop {
                    match f.read(&mut buf) {
                        Ok(0) => break,
                        Ok(_) => continue,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(_) => break,
                    }
                }
                teardown(runsc, state, id, dir);
                drop(dw);
                // SAFETY: the guardian ends without running sbx-policy's
                // destructors or atexit hooks (they are the parent's).
                unsafe { libc::_exit(0) }
            }
            child => {
                drop(tr);
                drop(dw);
                let mut st = 0;
                // SAFETY: reaping the intermediate child we forked.
                unsafe { libc::waitpid(child, &mut st, 0) };
                Ok(Guardian {
                    trigger: Some(tw),
                    done: Some(dr),
                })
            }
        }
    }

    /// Lets the guardian run its (idempotent) cleanup and waits for it,
    /// ten seconds at most.
    fn finish(&mut self) {
        drop(self.trigger.take());
        if let Some(d) = self.done.take() {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                let mut pfd = libc::pollfd {
                    fd: d.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                let n = unsafe { libc::poll(&mut pfd, 1, left.as_millis() as i32 + 1) };
                if n < 0
                    && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
                {
                    continue;
                }
                if n <= 0 {
                    break;
                }
                let mut b = [0u8; 1];
                // SAFETY: reading into a local buffer.
                let r = unsafe { libc::read(d.as_raw_fd(), b.as_mut_ptr().cast(), 1) };
                if r <= 0 {
                    break;
                }
            }
        }
    }
}

/// Where the private directory goes: $TMPDIR when every directory on its
/// path can be traversed by others (runsc's sandbox process, an
/// unprivileged user, makes its chroot in a subdirectory), else /tmp.
fn temp_base() -> PathBuf {
    let t = std::env::temp_dir();
    let ok = t.is_absolute()
        && t.ancestors().all(|a| {
            std::fs::metadata(a).is_ok_and(|m| m.is_dir() && m.permissions().mode() & 0o001 != 0)
        });
    if ok { t } else { PathBuf::from("/tmp") }
}

/// `sbx-policy gvisor`: builds the bundle, runs it, cleans up.
pub fn run(a: Args) -> Result<i32, Failure> {
    let tmp_size = sbx_core::units::parse_size(&a.spec.tmp_size)
        .map_err(|e| Failure::new(format!("--tmp-size {}: {e}", a.spec.tmp_size)))?;
    let timeout = match &a.spec.timeout {
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
    env_policy(&a)?;
    let plan = fs_plan(&a)?;
    check_command(&a.cmd[0], &plan)?;

    let dir = tempfile::Builder::new()
        .prefix("sbx-gvisor-")
        .tempdir_in(temp_base())
        .map_err(|e| Failure::new(format!("gvisor: temporary directory: {e}")))?
        .keep();
    let id = format!(
        "sbx-{}-{}",
        std::process::id(),
        dir.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("x")
            .trim_start_matches("sbx-gvisor-")
    );
    let state = dir.join("state");
    let mut guardian = match Guardian::start(&a.spec.runsc, &state, &id, &dir) {
        Ok(g) => g,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
    };
    let r = run_in(&a, &plan, &dir, &state, &id, tmp_size, timeout);
    teardown(&a.spec.runsc, &state, &id, &dir);
    guardian.finish();
    r
}

fn run_in(
    a: &Args,
    plan: &Plan,
    dir: &Path,
    state: &Path,
    id: &str,
    tmp_size: u64,
    timeout: Option<Duration>,
) -> Result<i32, Failure> {
    let io =
        |what: &Path, e: std::io::Error| Failure::new(format!("gvisor: {}: {e}", what.display()));
    let b = Bundle {
        dir: dir.join("bundle"),
        rootfs: dir.join("bundle/rootfs"),
        denied_file: dir.join("denied"),
        empty_file: dir.join("empty"),
        gitview: a.spec.git_stage.as_ref().map(|_| dir.join("gitview")),
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
    let mut ph = sbx_fs::host_placeholders(plan)?;
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
        let view = match &b.gitview {
            Some(at) => {
                std::fs::create_dir(at).map_err(|e| io(at, e))?;
                Some(GitView::new(plan, at)?)
            }
            None => None,
        };
        supervise(a, &b, state, id, &cfg, timeout, &ph, view)
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
    a: &Args,
    b: &Bundle,
    state: &Path,
    id: &str,
    cfg: &Value,
    timeout: Option<Duration>,
    ph: &sbx_fs::placeholder::Placeholders,
    view: Option<GitView>,
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
    if let Some(v) = view {
        v.install(&mut cmd);
    }
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
    let mut child = Supervisor::spawn(cmd, &keep)?;
    let status = wait_runsc(&mut child, a, id, timeout);
    relay.finish();
    if let Some(l) = execlog {
        l.report(id);
    }
    status
}

/// The git stage inside gVisor: runsc (and everything it starts) gets a
/// mount namespace of its own in which the stage's overlay (lower: the real
/// .git, upper and work: the stage's, as sbx-fs --git-stage mounts it) is
/// mounted on an empty directory of the private directory; the bundle binds
/// .git from there. The host's kernel makes the overlay, so the stage holds
/// exactly what sbx-fs's would (whiteouts included) for sbx-gitguard's
/// import. Unprivileged, the namespace belongs to a new user namespace that
/// maps the caller to itself (the capabilities to mount end at runsc's
/// exec; runsc --rootless then works as before).
struct GitView {
    at: std::ffi::CString,
    opts: std::ffi::CString,
    /// uid_map and gid_map lines when a user namespace is needed.
    user: Option<(Vec<u8>, Vec<u8>)>,
}

impl GitView {
    fn new(plan: &Plan, at: &Path) -> Result<GitView, Failure> {
        use std::os::unix::ffi::OsStrExt;
        let Some((lower, upper, work)) = plan.ops.iter().find_map(|o| match o.what {
            What::Overlay { lower, upper, work } => Some((lower, upper, work)),
            _ => None,
        }) else {
            return Err(Failure::new(
                "gvisor: --git-stage: the plan has no git stage overlay",
            ));
        };
        let p = |i: usize| plan.sources[i].path.display().to_string();
        let user = euid() != 0;
        let opts = format!(
            "{}lowerdir={},upperdir={},workdir={}",
            if user { "userxattr," } else { "" },
            p(lower),
            p(upper),
            p(work)
        );
        let cs = |b: &[u8]| {
            std::ffi::CString::new(b)
                .map_err(|_| Failure::new("gvisor: --git-stage: path with a NUL"))
        };
        Ok(GitView {
            at: cs(at.as_os_str().as_bytes())?,
            opts: cs(opts.as_bytes())?,
            user: user.then(|| {
                (
                    format!("{0} {0} 1", euid()).into_bytes(),
                    format!("{0} {0} 1", egid()).into_bytes(),
                )
            }),
        })
    }

    fn install(self, cmd: &mut Command) {
        use std::os::unix::process::CommandExt;
        let write = |path: &std::ffi::CStr, data: &[u8]| -> std::io::Result<()> {
            // SAFETY: open/write/close on a valid C string and buffer.
            unsafe {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let n = libc::write(fd, data.as_ptr().cast(), data.len());
                let e = std::io::Error::last_os_error();
                libc::close(fd);
                if n != data.len() as isize {
                    return Err(e);
                }
            }
            Ok(())
        };
        // SAFETY: between fork and exec only syscalls on values prepared
        // before the fork (no allocation, no lock).
        unsafe {
            cmd.pre_exec(move || {
                let err = std::io::Error::last_os_error;
                let mut flags = libc::CLONE_NEWNS;
                if self.user.is_some() {
                    flags |= libc::CLONE_NEWUSER;
                }
                if libc::unshare(flags) != 0 {
                    return Err(err());
                }
                if let Some((uid, gid)) = &self.user {
                    write(c"/proc/self/setgroups", b"deny")?;
                    write(c"/proc/self/uid_map", uid)?;
                    write(c"/proc/self/gid_map", gid)?;
                }
                let none = std::ptr::null();
                if libc::mount(
                    none,
                    c"/".as_ptr(),
                    none,
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) != 0
                {
                    return Err(err());
                }
                if libc::mount(
                    c"overlay".as_ptr(),
                    self.at.as_ptr(),
                    c"overlay".as_ptr(),
                    0,
                    self.opts.as_ptr().cast(),
                ) != 0
                {
                    return Err(err());
                }
                Ok(())
            });
        }
    }
}

/// Refused execs inside gVisor: runsc's strace of execve/execveat goes to
/// a FIFO this process reads, and every exec that failed with EACCES (a
/// noexec mount: not on the allowlist) becomes an exec_denied alert. No
/// file grows with the run; only those lines are kept.
struct ExecLog {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<(String, String, String)>>,
}

/// Alerts of exec_denied beyond this many become one event with a count.
const EXEC_ALERTS: usize = 20;

impl ExecLog {
    /// Makes the FIFO at `path`, starts the reader; returns runsc's flags.
    fn start(path: &Path) -> Result<(ExecLog, Vec<OsString>), Failure> {
        use std::os::unix::ffi::OsStrExt;
        let err = |e: std::io::Error| Failure::new(format!("gvisor: {}: {e}", path.display()));
        let c = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|_| Failure::new("gvisor: exec log path with a NUL"))?;
        // SAFETY: a valid C string.
        if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
            return Err(err(std::io::Error::last_os_error()));
        }
        // Read and write: never blocks on open, never an early EOF.
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
            .map_err(err)?;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let st = stop.clone();
        let thread = std::thread::spawn(move || read_exec_log(f, &st));
        let mut log = os("--debug-log=");
        log.push(path);
        Ok((
            ExecLog { stop, thread },
            vec![
                os("--oci-seccomp"),
                os("--strace"),
                os("--strace-syscalls=execve,execveat"),
                os("--strace-log-size=256"),
                log,
            ],
        ))
    }

    fn report(self, id: &str) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let denied = self.thread.join().unwrap_or_default();
        for (program, path, syscall) in denied.iter().take(EXEC_ALERTS) {
            sbx_core::audit::emit(
                "exec_denied",
                Severity::Alert,
                json!({"path": path, "program": program, "syscall": syscall,
                       "enforced_by": "gvisor noexec mounts", "container": id}),
            );
        }
        if denied.len() > EXEC_ALERTS {
            sbx_core::audit::emit(
                "exec_denied",
                Severity::Alert,
                json!({"suppressed": denied.len() - EXEC_ALERTS, "container": id}),
            );
        }
    }
}

fn read_exec_log(
    mut f: std::fs::File,
    stop: &std::sync::atomic::AtomicBool,
) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut line: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        // Read after looking: what runsc wrote before it ended is read.
        let stopping = stop.load(std::sync::atomic::Ordering::Relaxed);
        match f.read(&mut buf) {
            Ok(n) if n > 0 => {
                for &c in &buf[..n] {
                    if c == b'\n' {
                        if let Some(d) = denied_exec(&String::from_utf8_lossy(&line)) {
                            out.push(d);
                        }
                        line.clear();
                    } else if line.len() < 8192 {
                        line.push(c);
                    }
                }
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            _ => {}
        }
        // Nothing to read: once runsc has ended, everything is read.
        if stopping {
            return out;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// (program, path, syscall) of a strace exit line of runsc for an exec that
/// failed with EACCES: `[ 2: 2] sh X execve(0x5616 /usr/bin/id, ...) = 0
/// (0x0) errno=13 (permission denied)`.
fn denied_exec(l: &str) -> Option<(String, String, String)> {
    let (head, rest) = l.split_once(" X execve")?;
    if !rest.contains("errno=13 ") {
        return None;
    }
    let program = head.rsplit(' ').next().unwrap_or("").to_string();
    let (syscall, args) = if let Some(r) = rest.strip_prefix("at(") {
        // execveat(dirfd, 0xADDR path, ...)
        ("execveat", r.split_once(", ").map(|x| x.1).unwrap_or(r))
    } else {
        ("execve", rest.strip_prefix('(')?)
    };
    let path = args.split_once(' ')?.1.split(", ").next()?.to_string();
    Some((program, path, syscall.to_string()))
}

/// gVisor gives a host regular file it receives as stdio its own offset,
/// starting at 0, and ignores the caller's: `{ echo a; sbx-policy chain
/// --trust zero -- echo b; } > log` wrote b over a, and with `2>&1` stdout
/// and stderr got two offsets and overwrote each other's lines. A stdout or
/// stderr that is a regular file therefore goes through a pipe that this
/// process copies to the caller's very descriptor, so the kernel applies its
/// offset and O_APPEND as in every other tier; when both name one file
/// (`> log 2>&1`) they share one pipe, which keeps their order. Pipes,
/// terminals and sockets are passed through untouched, as before.
struct StdioRelay {
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl StdioRelay {
    fn start(cmd: &mut Command) -> Result<StdioRelay, Failure> {
        let st = |fd: RawFd| {
            // SAFETY: `stat` is plain-old-data; all-zero is a valid value.
            let mut s: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: fstat(2) writes one `stat` into `s`, a live local; a
            // closed fd number only makes it fail with EBADF.
            (unsafe { libc::fstat(fd, &mut s) } == 0).then_some(s)
        };
        let reg = |s: &Option<libc::stat>| {
            s.as_ref()
                .is_some_and(|s| s.st_mode & libc::S_IFMT == libc::S_IFREG)
        };
        let (s1, s2) = (st(1), st(2));
        let mut threads = Vec::new();
        let shared = reg(&s1)
            && reg(&s2)
            && s1.as_ref().map(|s| (s.st_dev, s.st_ino))
                == s2.as_ref().map(|s| (s.st_dev, s.st_ino));
        if shared {
            let (r, w) = pipe()?;
            let w2 = w
                .try_clone()
                .map_err(|e| Failure::new(format!("gvisor: dup: {e}")))?;
            cmd.stdout(Stdio::from(w)).stderr(Stdio::from(w2));
            threads.push(copy_to(r, 1));
        } else {
            if reg(&s1) {
                let (r, w) = pipe()?;
                cmd.stdout(Stdio::from(w));
                threads.push(copy_to(r, 1));
            }
            if reg(&s2) {
                let (r, w) = pipe()?;
                cmd.stderr(Stdio::from(w));
                threads.push(copy_to(r, 2));
            }
        }
        Ok(StdioRelay { threads })
    }

    /// Waits (5 s at most: a process of the sandbox that outlived runsc
    /// must not hold sbx-policy) until everything written was copied.
    fn finish(self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        for t in self.threads {
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }
}

/// Copies `from` to the caller's `fd` until EOF (a write error ends it:
/// the reader of a pipe went away).
fn copy_to(from: OwnedFd, fd: RawFd) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        use std::io::Write;
        let mut r = std::fs::File::from(from);
        // SAFETY: fd 1 or 2 stays open for the life of the process; the
        // ManuallyDrop never closes it.
        let mut out = std::mem::ManuallyDrop::new(unsafe {
            <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd)
        });
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = match r.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => return,
            };
            if out.write_all(&buf[..n]).is_err() {
                return;
            }
        }
    })
}

/// Waits for runsc (and enforces the wall clock when no sbx-cgroup does).
fn wait_runsc(
    child: &mut Supervisor,
    a: &Args,
    id: &str,
    timeout: Option<Duration>,
) -> Result<i32, Failure> {
    // Without sbx-cgroup the wall clock is watched here.
    let deadline = match (&a.spec.cgroup_bin, timeout) {
        (None, Some(t)) => Some(Instant::now() + t),
        _ => None,
    };
    let io = |e: std::io::Error| Failure::new(format!("gvisor: waiting for runsc: {e}"));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn args(rw: &Path, deny: &[&str]) -> Args {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct W {
            #[command(flatten)]
            a: Args,
        }
        let mut v: Vec<OsString> =
            vec![os("t"), os("--runsc"), os("/bin/true"), os("--rw"), os(rw)];
        for d in deny {
            v.extend([os("--deny"), os(d)]);
        }
        v.extend([
            os("--pids"),
            os("2048"),
            os("--fsize"),
            os("1M"),
            os("--"),
            os("sh"),
        ]);
        W::parse_from(v).a
    }

    #[test]
    fn the_plan_becomes_oci_mounts() {
        let d = tempfile::tempdir().unwrap();
        let proj = d.path().canonicalize().unwrap().join("p");
        std::fs::create_dir_all(proj.join("secret")).unwrap();
        std::fs::create_dir_all(proj.join(".git/hooks")).unwrap();
        std::fs::write(proj.join("key.pem"), "k").unwrap();
        let a = args(&proj, &[&format!("{}/secret", proj.display()), "*.pem"]);
        let plan = fs_plan(&a).unwrap();
        let b = Bundle {
            dir: d.path().join("b"),
            rootfs: d.path().join("b/rootfs"),
            denied_file: d.path().join("denied"),
            empty_file: d.path().join("empty"),
            gitview: None,
            noexec: false,
            owner: (1001, 1002),
        };
        std::fs::create_dir_all(&b.rootfs).unwrap();
        let m = mounts(&plan, &b, 1 << 20, &[], false).unwrap();
        let find = |dst: &Path| {
            m.iter()
                .find(|x| x["destination"] == json!(dst))
                .unwrap_or_else(|| panic!("no mount at {}: {m:?}", dst.display()))
                .clone()
        };
        assert_eq!(find(&proj)["options"], json!(["rbind", "rw"]));
        assert_eq!(find(Path::new("/usr"))["options"], json!(["rbind", "ro"]));
        let s = find(&proj.join("secret"));
        assert_eq!(s["type"], "tmpfs");
        assert!(s["options"].as_array().unwrap().contains(&json!("mode=0")));
        assert!(s["options"].as_array().unwrap().contains(&json!("ro")));
        let k = find(&proj.join("key.pem"));
        assert_eq!(k["source"], json!(b.denied_file));
        assert_eq!(
            find(&proj.join(".git/hooks"))["options"],
            json!(["rbind", "ro"])
        );
        // A missing .claude is a placeholder mount (an empty read-only dir).
        let c = find(&proj.join(".claude"));
        assert!(
            c["options"]
                .as_array()
                .unwrap()
                .contains(&json!("mode=555"))
        );
        // Nothing of the host's /proc or /dev: gVisor's own.
        assert!(m.iter().all(|x| {
            let d = x["destination"].as_str().unwrap();
            d == "/proc"
                || d == "/dev"
                || d == "/dev/pts"
                || d == "/dev/shm"
                || !(d.starts_with("/proc") || d.starts_with("/dev"))
        }));
        // Symlinked system directories are symlinks in the root.
        for l in ["bin", "lib", "sbin"] {
            if Path::new("/").join(l).is_symlink() {
                assert!(b.rootfs.join(l).is_symlink(), "{l}");
            }
        }
        // Names fail at once: the hosts file only.
        if Path::new("/etc/nsswitch.conf").is_file() {
            let n = find(Path::new("/etc/nsswitch.conf"));
            let text = std::fs::read_to_string(n["source"].as_str().unwrap()).unwrap();
            assert!(text.lines().any(|l| l == "hosts: files"), "{text}");
            assert_eq!(text.matches("hosts:").count(), 1, "{text}");
        }
        // The home tmpfs is the caller's.
        let home = m.iter().find(|x| {
            x["options"]
                .as_array()
                .is_some_and(|o| o.contains(&json!("uid=1001")))
        });
        assert!(home.is_none_or(|h| {
            h["options"]
                .as_array()
                .unwrap()
                .contains(&json!("gid=1002"))
        }));
        // With an execute allowlist every mount is noexec but the files listed.
        let bx = Bundle {
            noexec: true,
            rootfs: d.path().join("b2/rootfs"),
            ..b
        };
        std::fs::create_dir_all(&bx.rootfs).unwrap();
        let sh = Path::new("/bin/sh").canonicalize().unwrap();
        let mx = mounts(&plan, &bx, 1 << 20, std::slice::from_ref(&sh), false).unwrap();
        for x in &mx {
            let d = x["destination"].as_str().unwrap();
            let o = x["options"].as_array().cloned().unwrap_or_default();
            let exec = x["destination"] == json!(sh) || d.contains("ld-linux");
            if x["type"] == "bind" || x["type"] == "tmpfs" {
                assert_eq!(!o.contains(&json!("noexec")), exec, "{x}");
            }
        }
        assert!(mx.iter().any(|x| x["destination"] == json!(sh)));
        let cfg = config(&a, m, (1001, 1002)).unwrap();
        assert_eq!(cfg["process"]["user"], json!({"uid": 1001, "gid": 1002}));
        assert_eq!(cfg["root"]["readonly"], true);
        assert_eq!(cfg["process"]["noNewPrivileges"], true);
        assert_eq!(cfg["process"]["capabilities"]["bounding"], json!([]));
        let rl = cfg["process"]["rlimits"].as_array().unwrap();
        assert!(
            rl.contains(&json!({"type": "RLIMIT_FSIZE", "hard": 1u64 << 20, "soft": 1u64 << 20}))
        );
        assert!(rl.contains(&json!({"type": "RLIMIT_NPROC", "hard": 2048, "soft": 2048})));
    }

    #[test]
    fn refused_execs_are_read_from_runsc_strace() {
        let l = "I1203 14:02:05.064511    1951 strace.go:605] [   2:   2] sh X execve(0x56162c13c568 /usr/bin/id, 0x56162c13c538 [\"id\"], 0x56162c13c548 [\"HOME=/root\"]) = 0 (0x0) errno=13 (permission denied) (10.05004ms)";
        assert_eq!(
            denied_exec(l),
            Some(("sh".into(), "/usr/bin/id".into(), "execve".into()))
        );
        assert_eq!(
            denied_exec(&l.replace("errno=13 (permission denied) ", "")),
            None
        );
        assert_eq!(denied_exec(&l.replace(" X ", " E ")), None);
    }

    #[test]
    fn guest_processes_leave_room_for_gvisor_under_the_cgroup() {
        assert_eq!(guest_nproc(2048, false), 2048);
        assert_eq!(guest_nproc(2048, true), 120);
        assert_eq!(guest_nproc(64, true), 8);
    }
}
