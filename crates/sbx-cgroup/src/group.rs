//! The per-sandbox group `<parent>/sbx-<SBX_ID>`: choosing the parent in
//! each hierarchy, creating the group, setting the limits (through
//! cgroups-rs's controllers), joining it, reading its figures, killing
//! everything in it and removing it.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cgroups_rs::fs::MaxValue;
use cgroups_rs::fs::cpu::CpuController;
use cgroups_rs::fs::freezer::FreezerController;
use cgroups_rs::fs::memory::MemController;
use cgroups_rs::fs::pid::PidController;

use crate::discover::{Hierarchy, Host, Layout, Mode};
use crate::limits::{CPU_PERIOD_US, Limits};
use crate::owner::Owner;

/// How to get a delegated cgroup, for the one-line error.
pub const DELEGATE_HINT: &str = "run as root, or from a delegated cgroup: systemd-run --user --scope -p Delegate=yes sbx-cgroup ... (cgroup v2), or pass --parent a group chowned to you (`sbx-doctor --check cgroup` tells)";

#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    #[error("--parent '{0}': {1}")]
    BadParent(String, &'static str),
    #[error("--parent {path}: no such cgroup in the {hier} hierarchy ({dir})")]
    ParentMissing {
        path: String,
        hier: String,
        dir: String,
    },
    #[error("cannot create cgroups under {dir} ({hier}): not delegated to uid {uid}; {hint}", hint = DELEGATE_HINT)]
    NotDelegated { dir: String, hier: String, uid: u32 },
    #[error("{flag} needs the {ctrl} controller, which {where_}")]
    NoController {
        flag: &'static str,
        ctrl: &'static str,
        where_: String,
    },
    #[error(
        "no cgroup hierarchy can track the sandbox (none of memory, pids, freezer, cpuacct is mounted)"
    )]
    NothingToTrack,
    #[error(
        "cgroup {0} already exists and is not a stale sbx-cgroup group (another sandbox with the same SBX_ID?)"
    )]
    Exists(String),
    #[error("create cgroup {0}")]
    Create(String, #[source] io::Error),
    #[error("enable controllers '{what}' in {dir}/cgroup.subtree_control")]
    Enable {
        what: String,
        dir: String,
        #[source]
        source: io::Error,
    },
    #[error(
        "cannot enable controllers in {0}: other processes are in it and cgroup v2 gives controllers only to groups without processes; start sbx-cgroup in a delegated group of its own (systemd-run --user --scope -p Delegate=yes sbx-cgroup ...) or pass --parent a delegated group without processes"
    )]
    Busy(String),
    #[error("set {what} in {dir}")]
    Set {
        what: String,
        dir: String,
        #[source]
        source: io::Error,
    },
    #[error("{0}")]
    Unsupported(String),
    #[error("open {0}")]
    Open(String, #[source] io::Error),
    #[error("processes still alive in {0} after killing for {1:?}")]
    Unkillable(String, Duration),
    #[error("remove cgroup {0}")]
    Remove(String, #[source] io::Error),
}

fn cg_err(
    what: impl Into<String>,
    dir: &Path,
) -> impl FnOnce(cgroups_rs::fs::error::Error) -> GroupError {
    let what = what.into();
    let dir = dir.display().to_string();
    move |e| GroupError::Set {
        what,
        dir,
        source: io::Error::other(sbx_core::exit::error_chain(&e)),
    }
}

fn io_set(what: impl Into<String>, dir: &Path) -> impl FnOnce(io::Error) -> GroupError {
    let what = what.into();
    let dir = dir.display().to_string();
    move |source| GroupError::Set { what, dir, source }
}

/// Where the group goes in one hierarchy.
#[derive(Debug, Clone)]
pub struct Target {
    pub hier: Hierarchy,
    /// The parent group's directory.
    pub parent: PathBuf,
    /// v2: controllers to enable in the parent's subtree_control.
    pub enable: Vec<&'static str>,
}

fn check_component(p: &str, raw: &str) -> Result<(), GroupError> {
    for c in p.split('/') {
        if c == ".." || c == "." {
            return Err(GroupError::BadParent(
                raw.into(),
                "'.' and '..' are not allowed",
            ));
        }
    }
    Ok(())
}

/// The cgroup path of the parent in `h`: `--parent /abs` as is, `--parent
/// rel` below the caller's own group, none: the caller's own group.
fn parent_path(h: &Hierarchy, parent: Option<&str>) -> Result<String, GroupError> {
    let Some(p) = parent else {
        return Ok(h.own.clone());
    };
    if p.is_empty() || p.contains('\0') {
        return Err(GroupError::BadParent(p.into(), "empty"));
    }
    check_component(p, p)?;
    let joined = if p.starts_with('/') {
        p.to_string()
    } else {
        format!("{}/{}", h.own.trim_end_matches('/'), p)
    };
    // Normalise repeated slashes.
    let mut out = String::new();
    for c in joined.split('/').filter(|c| !c.is_empty()) {
        out.push('/');
        out.push_str(c);
    }
    if out.is_empty() {
        out.push('/');
    }
    Ok(out)
}

fn writable(p: &Path) -> bool {
    let Ok(c) = CString::new(p.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: c is NUL-ended and alive for the call.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}

fn read_trim(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

/// Picks the hierarchies and parent groups for `limits`. Checks everything
/// it can without creating anything.
pub fn plan(
    layout: &Layout,
    parent: Option<&str>,
    limits: &Limits,
) -> Result<Vec<Target>, GroupError> {
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    let needs: Vec<(&'static str, &'static str)> = [
        (limits.memory.is_some(), "--memory", "memory"),
        (limits.pids.is_some(), "--pids", "pids"),
        (limits.cpu_quota_us.is_some(), "--cpus", "cpu"),
        (limits.cpu_weight.is_some(), "--cpu-weight", "cpu"),
        (limits.io_weight.is_some(), "--io-weight", "io"),
    ]
    .into_iter()
    .filter(|n| n.0)
    .map(|n| (n.1, n.2))
    .collect();

    let mut targets = Vec::new();
    match layout.mode() {
        Mode::V1 | Mode::Hybrid => {
            for (flag, ctrl) in &needs {
                let c = if *ctrl == "io" { "blkio" } else { ctrl };
                if layout.v1_with(c).is_none() {
                    return Err(GroupError::NoController {
                        flag,
                        ctrl: c_static(c),
                        where_: "is not mounted (cgroup v1)".into(),
                    });
                }
            }
            let mut wanted: Vec<&str> = vec!["memory", "pids", "cpuacct", "freezer"];
            for (_, c) in &needs {
                wanted.push(if *c == "io" { "blkio" } else { c });
            }
            for h in &layout.v1 {
                if !wanted.iter().any(|w| h.has(w)) {
                    continue;
                }
                targets.push(target_for(h, parent, euid, Vec::new())?);
            }
            if targets.is_empty() {
                return Err(GroupError::NothingToTrack);
            }
        }
        Mode::V2 => {
            let h = layout.v2.as_ref().expect("v2 mode has a v2 hierarchy");
            let probe = target_for(h, parent, euid, Vec::new())?;
            let avail = read_trim(&probe.parent.join("cgroup.controllers")).unwrap_or_default();
            let avail: Vec<&str> = avail.split_whitespace().collect();
            let enabled =
                read_trim(&probe.parent.join("cgroup.subtree_control")).unwrap_or_default();
            let enabled: Vec<&str> = enabled.split_whitespace().collect();
            for (flag, ctrl) in &needs {
                if !avail.contains(ctrl) {
                    return Err(GroupError::NoController {
                        flag,
                        ctrl,
                        where_: format!(
                            "is not available in {} (cgroup.controllers: '{}'); the parent must delegate it",
                            probe.parent.display(),
                            avail.join(" ")
                        ),
                    });
                }
            }
            // Memory and pids are wanted for the figures even without limits.
            let mut enable = Vec::new();
            for c in ["memory", "pids", "cpu", "io"] {
                let needed = needs.iter().any(|n| n.1 == c)
                    || ((c == "memory" || c == "pids") && avail.contains(&c));
                if needed && !enabled.contains(&c) {
                    enable.push(c);
                }
            }
            targets.push(Target { enable, ..probe });
        }
    }
    Ok(targets)
}

fn c_static(c: &str) -> &'static str {
    match c {
        "memory" => "memory",
        "pids" => "pids",
        "cpu" => "cpu",
        "blkio" => "blkio",
        _ => "io",
    }
}

fn target_for(
    h: &Hierarchy,
    parent: Option<&str>,
    euid: u32,
    enable: Vec<&'static str>,
) -> Result<Target, GroupError> {
    let path = parent_path(h, parent)?;
    let dir = h.dir_of(&path).ok_or_else(|| GroupError::ParentMissing {
        path: path.clone(),
        hier: h.name(),
        dir: format!("outside {}", h.mount.display()),
    })?;
    if !dir.is_dir() {
        return Err(GroupError::ParentMissing {
            path,
            hier: h.name(),
            dir: dir.display().to_string(),
        });
    }
    let mut ok = writable(&dir) && writable(&dir.join("cgroup.procs"));
    if h.v2 {
        ok = ok && writable(&dir.join("cgroup.subtree_control"));
    }
    if !ok {
        return Err(GroupError::NotDelegated {
            dir: dir.display().to_string(),
            hier: h.name(),
            uid: euid,
        });
    }
    Ok(Target {
        hier: h.clone(),
        parent: dir,
        enable,
    })
}

/// One directory of the sandbox group.
#[derive(Debug, Clone)]
pub struct GroupDir {
    pub hier: Hierarchy,
    pub path: PathBuf,
}

impl GroupDir {
    fn has(&self, c: &str) -> bool {
        self.hier.v2 || self.hier.has(c)
    }
    fn mem(&self) -> MemController {
        MemController::new(self.path.clone(), self.hier.mount.clone(), self.hier.v2)
    }
    fn pids(&self) -> PidController {
        PidController::new(self.path.clone(), self.hier.mount.clone(), self.hier.v2)
    }
    fn cpu(&self) -> CpuController {
        CpuController::new(self.path.clone(), self.hier.mount.clone(), self.hier.v2)
    }
    fn freezer(&self) -> FreezerController {
        FreezerController::new(self.path.clone(), self.hier.mount.clone(), self.hier.v2)
    }
}

/// The figures written to the audit log at the end.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Stats {
    pub peak_memory_bytes: Option<u64>,
    pub cpu_time_ns: Option<u64>,
    pub oom_kills: u64,
    pub pids_limit_hits: u64,
}

/// The file the command writes `0` to, between fork and exec, to join a
/// group. On v1 it is `tasks`, which moves only the writing thread: the
/// child is single-threaded there, so that is the whole process, and the
/// kernel then skips the global `cgroup_threadgroup_rwsem` whose first
/// write-lock waits an RCU grace period (10 to 15 ms per run on this
/// project's hosts; see docs/bench-policy.md). v2's `cgroup.threads` only
/// moves threads within one domain, so v2 keeps `cgroup.procs`.
fn join_file(h: &Hierarchy) -> &'static str {
    if h.v2 { "cgroup.procs" } else { "tasks" }
}

/// The sandbox group, in every hierarchy used.
#[derive(Debug)]
pub struct SandboxGroup {
    pub name: String,
    pub dirs: Vec<GroupDir>,
    /// The join file of each dir ([`join_file`]), opened before the fork
    /// so the child joins with one write each.
    procs: Vec<OwnedFd>,
    /// Processes this group's kill loop signalled (distinct pids).
    pub killed: u64,
    signalled: std::collections::HashSet<i32>,
    /// Whether the host is the real one (a fake cgroupfs in tests holds
    /// regular files that rmdir cannot remove).
    real: bool,
}

impl SandboxGroup {
    /// Creates `<parent>/<name>` in each target and applies `limits`. On
    /// failure removes whatever it created.
    pub fn create(
        host: &Host,
        targets: &[Target],
        name: &str,
        limits: &Limits,
        owner: &Owner,
    ) -> Result<Self, GroupError> {
        let mut g = SandboxGroup {
            name: name.to_string(),
            dirs: Vec::new(),
            procs: Vec::new(),
            killed: 0,
            signalled: Default::default(),
            real: host.root == Path::new("/"),
        };
        match g.build(targets, limits, owner) {
            Ok(()) => Ok(g),
            Err(e) => {
                let _ = g.destroy(Duration::from_secs(2));
                Err(e)
            }
        }
    }

    fn build(
        &mut self,
        targets: &[Target],
        limits: &Limits,
        owner: &Owner,
    ) -> Result<(), GroupError> {
        for t in targets {
            if !t.enable.is_empty() {
                enable_controllers(&t.parent, &t.enable)?;
            }
            let path = t.parent.join(&self.name);
            // Registered until the record is written (see owner::register).
            let entry = crate::owner::register(&path);
            match std::fs::create_dir(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    // A stale group of ours (owner gone) is reaped and made again.
                    if crate::owner::reap_if_stale(&t.hier, &path, self.real) {
                        std::fs::create_dir(&path)
                            .map_err(|e| GroupError::Create(path.display().to_string(), e))?;
                    } else {
                        return Err(GroupError::Exists(path.display().to_string()));
                    }
                }
                Err(e) => return Err(GroupError::Create(path.display().to_string(), e)),
            }
            sbx_core::registry::test_kill_point("cgroup-made");
            self.dirs.push(GroupDir {
                hier: t.hier.clone(),
                path: path.clone(),
            });
            owner.record(&path);
            drop(entry);
        }
        for d in self.dirs.clone() {
            self.apply(&d, limits)?;
        }
        for d in &self.dirs {
            let p = d.path.join(join_file(&d.hier));
            // (A fake cgroupfs has no kernel to make the file.)
            let f = std::fs::OpenOptions::new()
                .write(true)
                .create(!self.real)
                .truncate(false)
                .open(&p)
                .map_err(|e| GroupError::Open(p.display().to_string(), e))?;
            self.procs.push(f.into());
        }
        Ok(())
    }

    fn apply(&self, d: &GroupDir, l: &Limits) -> Result<(), GroupError> {
        let p = &d.path;
        let v2 = d.hier.v2;
        if let (Some(m), true) = (l.memory, d.has("memory")) {
            let mem = d.mem();
            mem.set_limit(m as i64).map_err(cg_err("memory limit", p))?;
            // Memory + swap: the given total, else no swap beyond the limit.
            let total = l.memory_swap.unwrap_or(m);
            if v2 {
                if p.join("memory.swap.max").exists() || !self.real {
                    mem.set_memswap_limit((total - m) as i64)
                        .map_err(cg_err("memory.swap.max", p))?;
                } else if l.memory_swap.is_some() {
                    return Err(GroupError::Unsupported(format!(
                        "--memory-swap: {} has no memory.swap.max (swap accounting is off)",
                        p.display()
                    )));
                }
            } else if p.join("memory.memsw.limit_in_bytes").exists() || !self.real {
                mem.set_memswap_limit(total as i64)
                    .map_err(cg_err("memory.memsw.limit_in_bytes", p))?;
            } else if l.memory_swap.is_some() {
                return Err(GroupError::Unsupported(format!(
                    "--memory-swap: {} has no memory.memsw.limit_in_bytes (swap accounting is off: boot with swapaccount=1)",
                    p.display()
                )));
            } else {
                // No swap accounting: keep the group from swapping at all.
                let _ = std::fs::write(p.join("memory.swappiness"), "0");
            }
        }
        if let (Some(n), true) = (l.pids, d.has("pids")) {
            d.pids()
                .set_pid_max(MaxValue::Value(n as i64))
                .map_err(cg_err("pids.max", p))?;
        }
        if let (Some(q), true) = (l.cpu_quota_us, d.has("cpu")) {
            if v2 {
                std::fs::write(p.join("cpu.max"), format!("{q} {CPU_PERIOD_US}"))
                    .map_err(io_set("cpu.max", p))?;
            } else {
                let cpu = d.cpu();
                cpu.set_cfs_period(CPU_PERIOD_US)
                    .map_err(cg_err("cpu.cfs_period_us", p))?;
                cpu.set_cfs_quota(q as i64)
                    .map_err(cg_err("cpu.cfs_quota_us", p))?;
            }
        }
        if let (Some(w), true) = (l.cpu_weight, d.has("cpu")) {
            let v = if v2 { w } else { Limits::v1_shares(w) };
            d.cpu().set_shares(v).map_err(cg_err("cpu weight", p))?;
        }
        if let (Some(w), true) = (l.io_weight, v2 || d.hier.has("blkio")) {
            // The file depends on the I/O scheduler: the generic weight
            // first, then BFQ's.
            let (files, v): (&[&str], u64) = if v2 {
                (&["io.weight", "io.bfq.weight"], w)
            } else {
                (
                    &["blkio.weight", "blkio.bfq.weight"],
                    Limits::v1_blkio_weight(w),
                )
            };
            let file = files
                .iter()
                .find(|f| p.join(f).exists())
                .copied()
                .or(if self.real { None } else { Some(files[0]) });
            let Some(file) = file else {
                return Err(GroupError::Unsupported(format!(
                    "--io-weight: {} has none of {} (no I/O scheduler with weights on this host)",
                    p.display(),
                    files.join(", ")
                )));
            };
            // io.weight takes 1-10000; BFQ's weights take 1-1000 (mapped
            // as for v1, default 100 -> 500).
            let val = match file {
                "io.weight" => format!("default {v}"),
                "io.bfq.weight" => Limits::v1_blkio_weight(w).to_string(),
                _ => v.to_string(),
            };
            std::fs::write(p.join(file), val).map_err(io_set(file, p))?;
        }
        Ok(())
    }

    /// A group found on the host (a stale one), to kill and remove.
    pub fn adopt(name: &str, dirs: Vec<GroupDir>, real: bool) -> Self {
        SandboxGroup {
            name: name.to_string(),
            dirs,
            procs: Vec::new(),
            killed: 0,
            signalled: Default::default(),
            real,
        }
    }

    /// A copy without the join fds (for the watcher).
    pub fn without_fds(&self) -> Self {
        SandboxGroup {
            name: self.name.clone(),
            dirs: self.dirs.clone(),
            procs: Vec::new(),
            killed: 0,
            signalled: Default::default(),
            real: self.real,
        }
    }

    /// Raw fds of the join files, for the child's join.
    pub fn procs_fds(&self) -> Vec<i32> {
        self.procs.iter().map(|f| f.as_raw_fd()).collect()
    }

    /// Closes the join fds (the watcher does not need them).
    pub fn close_procs(&mut self) {
        self.procs.clear();
    }

    /// The pids in every dir of the group (and any nested group).
    pub fn pids(&self) -> Vec<i32> {
        let mut v = Vec::new();
        for d in &self.dirs {
            collect_pids(&d.path, &mut v, 0);
        }
        v.sort_unstable();
        v.dedup();
        // A pid that no longer exists is not waited for (a fake cgroupfs
        // keeps listing it; the kernel never lists a reaped task).
        // SAFETY: kill with signal 0 only checks that the pid exists.
        v.retain(|&p| unsafe { libc::kill(p, 0) == 0 } || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH));
        v
    }

    /// The figures, read before the group is removed.
    pub fn stats(&self) -> Stats {
        // The few files the end event needs, read directly (the crate's
        // whole-controller readers open some thirty files per run).
        let num = |p: PathBuf| read_trim(&p).and_then(|s| s.parse::<u64>().ok());
        let mut s = Stats::default();
        for d in &self.dirs {
            if d.has("memory") {
                let (peak, oom) = if d.hier.v2 {
                    ("memory.peak", "memory.events")
                } else {
                    ("memory.max_usage_in_bytes", "memory.oom_control")
                };
                if let Some(p) = num(d.path.join(peak)) {
                    s.peak_memory_bytes = Some(p);
                    s.oom_kills = events_value(&d.path.join(oom), "oom_kill");
                }
            }
            if d.has("pids") && d.path.join("pids.events").exists() {
                s.pids_limit_hits = d.pids().get_pid_events().unwrap_or(0);
            }
            if d.hier.v2 {
                if let Some(us) = events_opt(&d.path.join("cpu.stat"), "usage_usec") {
                    s.cpu_time_ns = Some(us * 1000);
                }
            } else if d.hier.has("cpuacct") {
                s.cpu_time_ns = Some(num(d.path.join("cpuacct.usage")).unwrap_or(0));
            }
        }
        s
    }

    /// Kills every process in the group and waits until it is empty: v2
    /// `cgroup.kill`; v1 freeze, SIGKILL every pid, thaw, until empty.
    pub fn kill_all(&mut self, limit: Duration) -> Result<(), GroupError> {
        let start = Instant::now();
        let freezer = self
            .dirs
            .iter()
            .find(|d| !d.hier.v2 && d.hier.has("freezer"))
            .cloned();
        let v2 = self.dirs.iter().find(|d| d.hier.v2).cloned();
        let mut pause = Duration::from_micros(200);
        loop {
            let pids = self.pids();
            if pids.is_empty() {
                return Ok(());
            }
            if start.elapsed() > limit {
                return Err(GroupError::Unkillable(
                    self.dirs[0].path.display().to_string(),
                    limit,
                ));
            }
            if let Some(d) = &v2 {
                if d.path.join("cgroup.kill").exists() {
                    let _ = std::fs::write(d.path.join("cgroup.kill"), "1");
                } else {
                    let _ = d.freezer().freeze();
                }
            } else if let Some(d) = &freezer {
                let _ = d.freezer().freeze();
            }
            // Through pidfds, re-checked against the group after they are
            // open: a member reaped between the reading and the signal
            // whose pid went to a process outside is never signalled.
            let members = sbx_core::pidfd::kill_listed(|| self.pids());
            for (pid, _) in &members {
                if self.signalled.insert(*pid) {
                    self.killed += 1;
                }
            }
            if let Some(d) = &freezer {
                let _ = d.freezer().thaw();
            }
            if let Some(d) = v2.as_ref().filter(|d| !d.path.join("cgroup.kill").exists()) {
                let _ = d.freezer().thaw();
            }
            // Woken by their exits; the pause bounds the wait for members
            // that joined after the reading (the loop reads again) and
            // the loop when no pidfd could be opened.
            if members.is_empty() {
                std::thread::sleep(pause);
            } else {
                sbx_core::pidfd::wait_exited(&members, pause);
            }
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    /// Kills what is left and removes every dir (nested groups first).
    pub fn destroy(&mut self, limit: Duration) -> Result<(), GroupError> {
        let kill = self.kill_all(limit);
        let mut first_err = kill.err();
        for d in self.dirs.clone() {
            if let Err(e) = remove_tree(&d.path, self.real, limit) {
                first_err.get_or_insert(e);
            }
        }
        self.procs.clear();
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

fn enable_controllers(parent: &Path, enable: &[&str]) -> Result<(), GroupError> {
    let what: Vec<String> = enable.iter().map(|c| format!("+{c}")).collect();
    let what = what.join(" ");
    let f = parent.join("cgroup.subtree_control");
    let r = if f.exists() {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&f)
            .and_then(|mut fh| io::Write::write_all(&mut fh, what.as_bytes()))
    } else {
        Err(io::Error::from_raw_os_error(libc::ENOENT))
    };
    match r {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            Err(GroupError::Busy(parent.display().to_string()))
        }
        Err(source) => Err(GroupError::Enable {
            what,
            dir: parent.display().to_string(),
            source,
        }),
    }
}

fn collect_pids(dir: &Path, out: &mut Vec<i32>, depth: u32) {
    if let Ok(s) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(
            s.lines()
                .filter_map(|l| l.trim().parse::<i32>().ok())
                .filter(|p| *p > 0),
        );
    }
    if depth > 32 {
        return;
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_pids(&e.path(), out, depth + 1);
            }
        }
    }
}

/// Removes a group dir and any group nested in it (deepest first), retrying
/// while the kernel still counts dying tasks.
pub fn remove_tree(dir: &Path, real: bool, limit: Duration) -> Result<(), GroupError> {
    if !real {
        return match std::fs::remove_dir_all(dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(GroupError::Remove(dir.display().to_string(), e)),
        };
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path(), real, limit)?;
            }
        }
    }
    let start = Instant::now();
    let mut pause = Duration::from_micros(500);
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && start.elapsed() < limit => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(e) => return Err(GroupError::Remove(dir.display().to_string(), e)),
        }
    }
}

/// `key N` from a flat-keyed file (memory.events, cpu.stat), 0 if absent.
fn events_value(p: &Path, key: &str) -> u64 {
    events_opt(p, key).unwrap_or(0)
}

fn events_opt(p: &Path, key: &str) -> Option<u64> {
    let s = std::fs::read_to_string(p).ok()?;
    s.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next() == Some(key))
            .then(|| it.next()?.parse().ok())
            .flatten()
    })
}
