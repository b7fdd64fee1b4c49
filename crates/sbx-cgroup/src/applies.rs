//! Which limits sbx-cgroup can apply for this caller on this host (issue
//! 16): what `sbx-policy explain` and `chain` report, and what `chain`
//! passes. Decided with the same checks sbx-cgroup makes before it creates
//! anything ([`group::plan`] under the default parent), so the report and
//! the run agree.
//!
//! - root, or a delegated cgroup: memory, pids and CPU through the cgroup;
//! - no delegation: processes through RLIMIT_NPROC in the command's own
//!   user namespace (when unprivileged user namespaces can be made), memory
//!   per process through RLIMIT_DATA, no CPU limit, no total memory limit;
//! - a systemd user manager on a cgroup v2 host can give a delegated cgroup
//!   (`systemd-run --user --scope -p Delegate=yes`): found through its
//!   private socket `$XDG_RUNTIME_DIR/systemd/private` and `systemd-run` on
//!   PATH.
//!
//! Wall clock, rlimits and the SIGTERM → SIGKILL escalation need nothing.

use std::path::{Path, PathBuf};

use crate::discover::{self, Host, Mode};
use crate::group;
use crate::limits::Limits;

/// What can apply.
#[derive(Debug, Clone)]
pub struct Applicable {
    pub root: bool,
    /// The host's cgroup mode, when discovery worked.
    pub mode: Option<Mode>,
    /// Limits sbx-cgroup can set through a cgroup under its default parent.
    pub memory: bool,
    pub pids: bool,
    pub cpu: bool,
    /// Why the cgroup limits cannot apply (the first refusal), if they cannot.
    pub why_not: Option<String>,
    /// Unprivileged user namespaces can be made: `--pids` becomes
    /// RLIMIT_NPROC in the command's own one (no-cgroup mode).
    pub userns: bool,
    /// A systemd user manager that can give a delegated cgroup v2 scope,
    /// or why there is none.
    pub systemd_user: Result<(), String>,
}

impl Applicable {
    /// Every cgroup limit applies.
    pub fn full(&self) -> bool {
        self.memory && self.pids && self.cpu
    }
}

fn probe(layout: &discover::Layout, set: impl FnOnce(&mut Limits)) -> Result<(), String> {
    let mut l = Limits::default();
    set(&mut l);
    group::plan(layout, None, &l)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// What applies for this process on this host (sbx-policy's one entry
/// into sbx-cgroup: the same checks the tool makes, so report and run
/// agree).
pub fn here() -> Applicable {
    detect(&Host::default())
}

/// Detects what applies for this process on `host`.
pub fn detect(host: &Host) -> Applicable {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let layout = discover::discover(host);
    let (mode, memory, pids, cpu, why_not) = match &layout {
        Ok(l) => {
            let m = probe(l, |x| x.memory = Some(1 << 30));
            let p = probe(l, |x| x.pids = Some(1024));
            let c = probe(l, |x| x.cpu_quota_us = Some(100_000));
            let why = [&m, &p, &c]
                .into_iter()
                .find_map(|r| r.as_ref().err().cloned());
            (Some(l.mode()), m.is_ok(), p.is_ok(), c.is_ok(), why)
        }
        Err(e) => (None, false, false, false, Some(e.to_string())),
    };
    Applicable {
        root,
        mode,
        memory,
        pids,
        cpu,
        why_not,
        userns: userns_possible(host),
        systemd_user: systemd_user(root, mode, std::env::var_os("XDG_RUNTIME_DIR")),
    }
}

fn read(host: &Host, p: &str) -> Option<String> {
    std::fs::read_to_string(host.path(Path::new(p)))
        .ok()
        .map(|s| s.trim().to_string())
}

/// Whether an unprivileged process can make a user namespace here.
fn userns_possible(host: &Host) -> bool {
    let max = read(host, "/proc/sys/user/max_user_namespaces")
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0);
    let debian_knob = read(host, "/proc/sys/kernel/unprivileged_userns_clone");
    let apparmor = read(
        host,
        "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
    );
    max > 0 && debian_knob.is_none_or(|v| v == "1") && apparmor.is_none_or(|v| v == "0")
}

fn on_path(prog: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(prog))
            .find(|f| f.is_file())
    })
}

/// A systemd user manager that can delegate a cgroup v2 scope, or why not.
pub fn systemd_user(
    root: bool,
    mode: Option<Mode>,
    runtime_dir: Option<std::ffi::OsString>,
) -> Result<(), String> {
    use std::os::unix::fs::FileTypeExt;
    if root {
        return Err("not needed as root".into());
    }
    let Some(rt) = runtime_dir.map(PathBuf::from).filter(|p| p.is_absolute()) else {
        return Err("no systemd user manager: XDG_RUNTIME_DIR is not set".into());
    };
    let sock = rt.join("systemd/private");
    if !std::fs::symlink_metadata(&sock).is_ok_and(|m| m.file_type().is_socket()) {
        return Err(format!(
            "no systemd user manager ({} does not exist)",
            sock.display()
        ));
    }
    if on_path("systemd-run").is_none() {
        return Err("a systemd user manager, but systemd-run is not on PATH".into());
    }
    match mode {
        Some(Mode::V2) => Ok(()),
        Some(m) => Err(format!(
            "a systemd user manager, but the host's cgroups are {}: a delegated scope gets controllers only on a pure cgroup v2 host",
            serde_json::to_value(m)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default()
        )),
        None => Err("a systemd user manager, but no cgroup hierarchy was found".into()),
    }
}

/// The command prefix that runs the rest in a delegated systemd user scope.
pub const SYSTEMD_SCOPE: &[&str] = &[
    "systemd-run",
    "--user",
    "--scope",
    "--quiet",
    "--collect",
    "-p",
    "Delegate=yes",
    "--",
];

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake pure-v2 host whose own cgroup offers `controllers`.
    fn v2_host(d: &Path, controllers: &str) -> Host {
        let cg = d.join("sys/fs/cgroup/user.slice/me");
        std::fs::create_dir_all(&cg).unwrap();
        std::fs::create_dir_all(d.join("proc/self")).unwrap();
        std::fs::create_dir_all(d.join("proc/sys/user")).unwrap();
        std::fs::write(d.join("proc/self/cgroup"), "0::/user.slice/me\n").unwrap();
        std::fs::write(
            d.join("proc/self/mountinfo"),
            "41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n",
        )
        .unwrap();
        std::fs::write(d.join("proc/sys/user/max_user_namespaces"), "100\n").unwrap();
        for f in ["cgroup.procs", "cgroup.subtree_control"] {
            std::fs::write(cg.join(f), "").unwrap();
        }
        std::fs::write(cg.join("cgroup.controllers"), controllers).unwrap();
        Host::new(d)
    }

    /// A test-made cgroup v2 tree (a directory the test owns, read through
    /// discovery's filesystem seam): the controllers it offers are what
    /// applies; user namespaces are read from its /proc/sys.
    #[test]
    fn delegated_v2_controllers_decide_what_applies() {
        // Root passes the write checks: the controllers decide.
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let a = detect(&v2_host(d.path(), "memory pids cpu"));
        assert!(a.full() && a.why_not.is_none() && a.userns, "{a:?}");
        assert_eq!(a.mode, Some(Mode::V2));
        let d = tempfile::tempdir().unwrap();
        let h = v2_host(d.path(), "pids");
        std::fs::write(d.path().join("proc/sys/user/max_user_namespaces"), "0").unwrap();
        let a = detect(&h);
        assert!(a.pids && !a.memory && !a.cpu && !a.userns, "{a:?}");
        assert!(a.why_not.as_deref().unwrap().contains("cgroup.controllers"));
    }

    /// The systemd user manager is found by its private socket (a real
    /// socket the test binds) and only counts on a pure v2 host; absent
    /// without XDG_RUNTIME_DIR, without the socket, on hybrid, or as root.
    #[test]
    fn systemd_user_manager_detection() {
        let d = tempfile::tempdir().unwrap();
        let rt = d.path().to_path_buf();
        let none = systemd_user(false, Some(Mode::V2), None).unwrap_err();
        assert!(none.contains("XDG_RUNTIME_DIR"), "{none}");
        let no_sock = systemd_user(false, Some(Mode::V2), Some(rt.clone().into())).unwrap_err();
        assert!(no_sock.contains("systemd/private"), "{no_sock}");
        std::fs::create_dir(rt.join("systemd")).unwrap();
        let _l = std::os::unix::net::UnixListener::bind(rt.join("systemd/private")).unwrap();
        let have_run = on_path("systemd-run").is_some();
        let r = systemd_user(false, Some(Mode::V2), Some(rt.clone().into()));
        if have_run {
            assert!(r.is_ok(), "{r:?}");
            let hy = systemd_user(false, Some(Mode::Hybrid), Some(rt.clone().into()));
            assert!(hy.unwrap_err().contains("hybrid"));
        } else {
            assert!(r.unwrap_err().contains("systemd-run"));
        }
        assert!(systemd_user(true, Some(Mode::V2), Some(rt.into())).is_err());
    }
}
