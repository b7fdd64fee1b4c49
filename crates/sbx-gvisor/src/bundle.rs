//! The OCI bundle: sbx-fs's mount plan for the grants as runsc's mounts,
//! and config.json (the process, its rlimits, the namespaces).

use std::path::{Path, PathBuf};

use sbx_core::Failure;
use sbx_fs::plan::{Kind, Op, Plan, What};
use serde_json::{Value, json};

use crate::{Cli, os};

/// The sbx-fs plan for the grants (checks every flag; opens every source).
pub(crate) fn fs_plan(a: &Cli) -> Result<Plan, Failure> {
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
pub(crate) fn check_command(prog: &std::ffi::OsStr, plan: &Plan) -> Result<(), Failure> {
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
pub(crate) struct Bundle {
    pub(crate) dir: PathBuf,
    pub(crate) rootfs: PathBuf,
    /// Empty, mode 000: covers a hidden file.
    pub(crate) denied_file: PathBuf,
    /// Empty, mode 0444: a protected file that does not exist.
    pub(crate) empty_file: PathBuf,
    /// Where the git stage's overlay is mounted (runsc's own mount
    /// namespace), when there is a stage.
    pub(crate) gitview: Option<PathBuf>,
    /// Every mount noexec but the allowlist's files.
    pub(crate) noexec: bool,
    /// The caller's uid and gid: the owner of the tmpfs it owns.
    pub(crate) owner: (u32, u32),
}

/// The OCI mounts for the plan (sbx-fs's ops in its order, parent first).
pub(crate) fn mounts(
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
                        "symlink {} inside a mount is not supported",
                        op.dst.display()
                    )));
                }
                let at = b.rootfs.join(op.dst.strip_prefix("/").unwrap_or(&op.dst));
                if let Some(d) = at.parent() {
                    std::fs::create_dir_all(d)
                        .map_err(|e| Failure::new(format!("{}: {e}", d.display())))?;
                }
                std::os::unix::fs::symlink(target, &at)
                    .map_err(|e| Failure::new(format!("{}: {e}", at.display())))?;
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
                        "the git stage overlay at {} has no mount",
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
            .map_err(|e| Failure::new(format!("{}: {e}", dir.display())))?;
        let f = dir.join(name);
        std::fs::write(&f, text).map_err(|e| Failure::new(format!("{}: {e}", f.display())))?;
        out.push(json!({"destination": host, "type": "bind", "source": f,
                        "options": ["rbind", "ro", "noexec"]}));
    }
    Ok(out)
}

fn make_mount_point(rootfs: &Path, op: &Op) -> Result<(), Failure> {
    let at = rootfs.join(op.dst.strip_prefix("/").unwrap_or(&op.dst));
    let err = |e: std::io::Error| Failure::new(format!("{}: {e}", at.display()));
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
pub(crate) fn guest_nproc(pids: u64, under_cgroup: bool) -> u64 {
    if under_cgroup {
        (pids.saturating_sub(128) / 16).max(8)
    } else {
        pids
    }
}

/// The environment policy of the flags and SBX_PASS_ENV (the same as
/// sbx-fs's: sbx_core::envpolicy).
pub(crate) fn env_policy(a: &Cli) -> Result<sbx_core::envpolicy::Policy, Failure> {
    let mut p = sbx_core::envpolicy::Policy {
        keep_all: a.spec.keep_env,
        pass: Vec::new(),
    };
    for e in &a.spec.pass_env {
        p.pass.push(
            sbx_core::envpolicy::parse_pass("--pass-env", e)
                .map_err(|e| Failure::new(format!("{e}")))?,
        );
    }
    p.add_from_env().map_err(|e| Failure::new(format!("{e}")))?;
    Ok(p)
}

/// config.json (`owner`: the identity inside, the caller's as in the
/// other tiers).
pub(crate) fn config(a: &Cli, mounts: Vec<Value>, owner: (u32, u32)) -> Result<Value, Failure> {
    let mut env: Vec<String> = Vec::new();
    let caller = sbx_core::chain::current_env();
    let had_tmpdir = caller.iter().any(|(k, _)| k == "TMPDIR");
    let mut filtered = sbx_core::envpolicy::filter(caller, &env_policy(a)?);
    // The caller's TMPDIR is a host path; inside, /tmp is a fresh tmpfs.
    if had_tmpdir && !filtered.env.iter().any(|(k, _)| k == "TMPDIR") {
        filtered.env.push(("TMPDIR".into(), "/tmp".into()));
    }
    sbx_core::envpolicy::report(crate::TOOL, &filtered);
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
                    "the command word {w:?} is not UTF-8 (an OCI bundle cannot carry it)"
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn args(rw: &Path, deny: &[&str]) -> Cli {
        use clap::Parser;
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
        Cli::parse_from(v)
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
    fn guest_processes_leave_room_for_gvisor_under_the_cgroup() {
        assert_eq!(guest_nproc(2048, false), 2048);
        assert_eq!(guest_nproc(2048, true), 120);
        assert_eq!(guest_nproc(64, true), 8);
    }
}
