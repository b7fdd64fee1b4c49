//! The checks. Files are read through [`Sys`] (the one test seam,
//! `SBX_DOCTOR_ROOT`); the live probes (namespaces, syscalls, sockets,
//! programs) run for real.

use std::ffi::{CStr, CString};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::CheckId;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Works.
    Ok,
    /// Reduced, or an optional backend is missing: exit status unaffected.
    Warn,
    /// A core layer cannot work here: exit 1.
    Fail,
    /// Not configured (Vault without VAULT_ADDR).
    Skip,
}

impl Status {
    pub fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
            Status::Skip => "skip",
        }
    }
}

/// One check's result; every warn and fail carries a one-line fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub id: &'static str,
    pub status: Status,
    pub summary: String,
    pub fix: Option<String>,
}

impl Finding {
    fn ok(id: &'static str, summary: impl Into<String>) -> Self {
        Self {
            id,
            status: Status::Ok,
            summary: summary.into(),
            fix: None,
        }
    }
    fn warn(id: &'static str, summary: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            id,
            status: Status::Warn,
            summary: summary.into(),
            fix: Some(fix.into()),
        }
    }
    fn fail(id: &'static str, summary: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            id,
            status: Status::Fail,
            summary: summary.into(),
            fix: Some(fix.into()),
        }
    }
    fn skip(id: &'static str, summary: impl Into<String>) -> Self {
        Self {
            id,
            status: Status::Skip,
            summary: summary.into(),
            fix: None,
        }
    }
}

/// Where the checks read files, and who asks. `SBX_DOCTOR_ROOT` (tests
/// only) is prefixed to every file path read; nothing else changes.
#[derive(Debug, Clone)]
pub struct Sys {
    root: Option<PathBuf>,
    euid: u32,
    egid: u32,
}

impl Sys {
    pub const ENV: &'static str = "SBX_DOCTOR_ROOT";

    pub fn from_env() -> Self {
        Self::with_root(std::env::var_os(Self::ENV).map(PathBuf::from))
    }

    pub fn with_root(root: Option<PathBuf>) -> Self {
        // SAFETY: geteuid/getegid only read this process's credentials.
        let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Self { root, euid, egid }
    }

    /// The same view for another caller (unit tests of the root/user split).
    pub fn with_identity(mut self, euid: u32, egid: u32) -> Self {
        self.euid = euid;
        self.egid = egid;
        self
    }

    pub fn fake_root(&self) -> Option<&Path> {
        self.root.as_deref()
    }

    pub fn euid(&self) -> u32 {
        self.euid
    }

    /// `abs` (an absolute path on the host) as the checks see it.
    pub fn path(&self, abs: impl AsRef<Path>) -> PathBuf {
        let abs = abs.as_ref();
        match &self.root {
            None => abs.to_path_buf(),
            Some(r) => r.join(abs.strip_prefix("/").unwrap_or(abs)),
        }
    }

    fn read(&self, abs: impl AsRef<Path>) -> Option<String> {
        std::fs::read_to_string(self.path(abs)).ok()
    }

    /// A sysctl by its dotted name, as an integer; None when absent.
    fn sysctl(&self, name: &str) -> Option<i64> {
        let p = format!("/proc/sys/{}", name.replace('.', "/"));
        self.read(p)?.trim().parse().ok()
    }
}

pub fn run_one(sys: &Sys, id: CheckId) -> Finding {
    match id {
        CheckId::Userns => userns(sys, probe_userns(sys.euid, sys.egid)),
        CheckId::Fuse => device(sys, "fuse", "/dev/fuse"),
        CheckId::Cgroup => cgroup(sys),
        CheckId::Landlock => landlock(landlock_abi()),
        CheckId::Seccomp => seccomp(
            sys.read("/proc/sys/kernel/seccomp/actions_avail"),
            user_notif_live(),
        ),
        CheckId::Nftables => nftables(sys),
        CheckId::Runsc => program(
            "runsc",
            &["runsc"],
            "gVisor (sbx-gvisor) cannot run",
            "sudo apt install runsc",
        ),
        CheckId::Qemu => {
            let bin = format!("qemu-system-{}", std::env::consts::ARCH);
            program(
                "qemu",
                &[bin.as_str()],
                "sbx-vm --backend qemu cannot run",
                &format!(
                    "sudo apt install qemu-system-{}",
                    if std::env::consts::ARCH == "x86_64" {
                        "x86"
                    } else {
                        "arm"
                    }
                ),
            )
        }
        CheckId::Kvm => kvm(sys),
        CheckId::Firecracker => program(
            "firecracker",
            &["firecracker", "/opt/sbx-firecracker/bin/firecracker"],
            "sbx-vm --backend firecracker cannot run",
            "put a firecracker binary on PATH or in /opt/sbx-firecracker/bin (sudo scripts/setup installs one)",
        ),
        CheckId::Engine => engine(),
        CheckId::Vault => vault(
            std::env::var("BAO_ADDR")
                .ok()
                .or_else(|| std::env::var("VAULT_ADDR").ok()),
        ),
    }
}

// ---------------------------------------------------------------- userns

/// The sysctls that block unprivileged user namespaces: (what, fix).
fn userns_blockers(sys: &Sys) -> Vec<(String, String)> {
    let mut v = Vec::new();
    if sys.sysctl("kernel.unprivileged_userns_clone") == Some(0) {
        v.push((
            "kernel.unprivileged_userns_clone is 0".to_string(),
            "sudo sysctl -w kernel.unprivileged_userns_clone=1 (persist it in /etc/sysctl.d/)"
                .to_string(),
        ));
    }
    if sys.sysctl("user.max_user_namespaces") == Some(0) {
        v.push((
            "user.max_user_namespaces is 0".to_string(),
            "sudo sysctl -w user.max_user_namespaces=15000 (persist it in /etc/sysctl.d/)"
                .to_string(),
        ));
    }
    if sys.sysctl("kernel.apparmor_restrict_unprivileged_userns") == Some(1) {
        v.push((
            "kernel.apparmor_restrict_unprivileged_userns is 1 (Ubuntu's AppArmor takes every capability in a new user namespace)".to_string(),
            "sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0, or an AppArmor profile with `userns,` for the sbx binaries".to_string(),
        ));
    }
    v
}

/// `probe`: what creating a user namespace (and a mount namespace inside
/// it, which needs the capabilities AppArmor may withhold) did.
pub fn userns(sys: &Sys, probe: Result<(), String>) -> Finding {
    let blockers = userns_blockers(sys);
    let why = blockers
        .iter()
        .map(|b| b.0.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    let fix = blockers
        .iter()
        .map(|b| b.1.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    if sys.euid == 0 {
        // Root holds CAP_SYS_ADMIN: the tools make no user namespace.
        return if !blockers.is_empty() {
            Finding::warn(
                "userns",
                format!("root needs none, but unprivileged users cannot sandbox: {why}"),
                fix,
            )
        } else {
            match probe {
                Ok(()) => Finding::ok(
                    "userns",
                    "user namespaces work (root needs none; unprivileged users can make them)",
                ),
                Err(e) => Finding::warn(
                    "userns",
                    format!("root needs none, but creating one failed: {e}"),
                    "look for an LSM denial (AppArmor, SELinux) in `dmesg`, and check user.max_user_namespaces",
                ),
            }
        };
    }
    if !blockers.is_empty() {
        return Finding::fail(
            "userns",
            format!(
                "unprivileged user namespaces are blocked: {why}: sbx-fs and sbx-net cannot run as uid {}",
                sys.euid
            ),
            fix,
        );
    }
    match probe {
        Ok(()) => Finding::ok("userns", "unprivileged user namespaces work"),
        Err(e) if e.starts_with(PROC_STEP) => Finding::fail(
            "userns",
            format!(
                "{e}: this /proc has masked paths (a container's default): sbx-fs cannot mount the sandbox's /proc as uid {}",
                sys.euid
            ),
            "run the container with an unmasked /proc: Kubernetes securityContext.procMount: Unmasked (with hostUsers: false), Podman --security-opt unmask=ALL, Docker --security-opt systempaths=unconfined (docs/k8s.md)",
        ),
        Err(e) => Finding::fail(
            "userns",
            format!(
                "creating a user namespace failed: {e}: sbx-fs and sbx-net cannot run as uid {}",
                sys.euid
            ),
            "look for an LSM denial (AppArmor, SELinux) in `dmesg`; or run the chain as root",
        ),
    }
}

/// Writes `data` to `path` with raw syscalls (safe after fork): the errno.
fn write_raw(path: &CStr, data: &[u8]) -> Result<(), i32> {
    // SAFETY: a plain open/write/close on a NUL-terminated path and a
    // byte slice that outlive the calls.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(*libc::__errno_location());
        }
        let n = libc::write(fd, data.as_ptr().cast(), data.len());
        let e = *libc::__errno_location();
        libc::close(fd);
        if n != data.len() as isize {
            return Err(if n < 0 { e } else { libc::EIO });
        }
    }
    Ok(())
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Runs `f` in a forked child (single-threaded, so unshare(CLONE_NEWUSER)
/// is allowed there, and nothing it changes touches this process). `f`
/// reports the index of the step that failed and its errno.
fn in_child(steps: &[&str], f: impl FnOnce() -> Result<(), (u32, i32)>) -> Result<(), String> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two-int array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe2: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: the child runs only `f` (raw syscalls on data prepared
    // before the fork) and _exit; the parent only reads and reaps.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: closing the fds pipe2 just made.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        return Err(format!("fork: {e}"));
    }
    if pid == 0 {
        // SAFETY: in the child: the result goes through the pipe, then _exit.
        unsafe {
            libc::close(fds[0]);
            let buf: [u8; 8] = match f() {
                Ok(()) => [0xff; 8],
                Err((step, e)) => {
                    let mut b = [0u8; 8];
                    b[..4].copy_from_slice(&step.to_ne_bytes());
                    b[4..].copy_from_slice(&e.to_ne_bytes());
                    b
                }
            };
            libc::write(fds[1], buf.as_ptr().cast(), 8);
            libc::_exit(0);
        }
    }
    let mut buf = [0u8; 8];
    // SAFETY: the write end belongs to the child now; reading into a local
    // buffer; waitpid reaps the child this call forked.
    let n = unsafe {
        libc::close(fds[1]);
        let n = libc::read(fds[0], buf.as_mut_ptr().cast(), 8);
        libc::close(fds[0]);
        let mut st = 0;
        libc::waitpid(pid, &mut st, 0);
        n
    };
    if n != 8 {
        return Err("the probe child died without a word".into());
    }
    if buf == [0xff; 8] {
        return Ok(());
    }
    let step = u32::from_ne_bytes(buf[..4].try_into().unwrap()) as usize;
    let e = i32::from_ne_bytes(buf[4..].try_into().unwrap());
    Err(format!(
        "{}: {}",
        steps.get(step).copied().unwrap_or("?"),
        std::io::Error::from_raw_os_error(e)
    ))
}

/// The uid/gid maps of a user namespace in which the caller is root.
fn maps(uid: u32, gid: u32) -> (Vec<u8>, Vec<u8>) {
    (
        format!("0 {uid} 1").into_bytes(),
        format!("0 {gid} 1").into_bytes(),
    )
}

/// Enters a new user namespace (mapped to root inside) plus `extra`
/// namespaces; safe after fork (no allocation). Steps 0-3.
fn enter_userns(uid_map: &[u8], gid_map: &[u8], extra: libc::c_int) -> Result<(), (u32, i32)> {
    // SAFETY: unshare changes only the calling (child) process.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER | extra) } != 0 {
        return Err((0, errno()));
    }
    write_raw(c"/proc/self/setgroups", b"deny").map_err(|e| (1, e))?;
    write_raw(c"/proc/self/uid_map", uid_map).map_err(|e| (2, e))?;
    write_raw(c"/proc/self/gid_map", gid_map).map_err(|e| (3, e))?;
    Ok(())
}

const USERNS_STEPS: &[&str] = &[
    "unshare(CLONE_NEWUSER)",
    "write /proc/self/setgroups",
    "write /proc/self/uid_map",
    "write /proc/self/gid_map",
    "unshare(CLONE_NEWNS|CLONE_NEWPID) inside the new user namespace",
    "fork into the new PID namespace",
    PROC_STEP,
];

/// The step a masked /proc (a container's default) fails: sbx-fs mounts a
/// new /proc for the sandbox's PID namespace, which the kernel refuses
/// (EPERM) while any /proc mount of the namespace has paths covered.
const PROC_STEP: &str = "mount a new /proc for the new PID namespace";

pub fn probe_userns(uid: u32, gid: u32) -> Result<(), String> {
    let (u, g) = maps(uid, gid);
    in_child(USERNS_STEPS, || {
        enter_userns(&u, &g, 0)?;
        // SAFETY: as above, the child only.
        if unsafe { libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWPID) } != 0 {
            return Err((4, errno()));
        }
        // The new PID namespace is its children's: its first process
        // mounts the new /proc, as sbx-fs's init does. The mount lives in
        // this throwaway mount namespace (a less privileged one: nothing
        // propagates back).
        // SAFETY: fork in the single-threaded probe child; the grandchild
        // makes one mount(2) and _exits with its errno.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err((5, errno()));
        }
        if pid == 0 {
            // SAFETY: NUL-terminated constants; _exit ends the grandchild.
            unsafe {
                let r = libc::mount(
                    c"proc".as_ptr(),
                    c"/proc".as_ptr(),
                    c"proc".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    std::ptr::null(),
                );
                libc::_exit(if r == 0 { 0 } else { errno() & 0xff });
            }
        }
        let mut st = 0;
        // SAFETY: reaps the grandchild forked above.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        match (libc::WIFEXITED(st), libc::WEXITSTATUS(st)) {
            (true, 0) => Ok(()),
            (true, e) => Err((6, e)),
            _ => Err((6, libc::EINTR)),
        }
    })
}

// ---------------------------------------------------------------- devices

/// /dev/fuse: a character device this user can open read-write, and a
/// FUSE mount works in a throwaway mount namespace (in a user namespace
/// when unprivileged), the way sbx-fs mounts its guard file system.
fn device(sys: &Sys, id: &'static str, abs: &str) -> Finding {
    let p = sys.path(abs);
    let what = "sbx-fs falls back to placeholders (reads of denied paths are not alerted; fs_guard_unavailable)";
    let md = match std::fs::metadata(&p) {
        Ok(m) => m,
        Err(_) => {
            return Finding::warn(
                id,
                format!("no {abs}: {what}"),
                "sudo modprobe fuse (and sudo apt install fuse3)",
            );
        }
    };
    if !md.file_type().is_char_device() {
        return Finding::warn(
            id,
            format!("{abs} is not a character device: {what}"),
            "sudo rm /dev/fuse && sudo modprobe -r fuse && sudo modprobe fuse",
        );
    }
    if let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open(&p) {
        return Finding::warn(
            id,
            format!("{abs}: open for uid {}: {e}: {what}", sys.euid),
            "sudo chmod 0666 /dev/fuse (Debian's fuse3 package makes it so)",
        );
    }
    if sys.fake_root().is_some() {
        // The live mount probe needs the real device.
        return Finding::ok(
            id,
            format!("{abs} opens read-write (mount not probed: SBX_DOCTOR_ROOT)"),
        );
    }
    match probe_fuse(sys.euid, sys.egid) {
        Ok(()) => Finding::ok(
            id,
            "/dev/fuse opens read-write and a FUSE mount works in a throwaway namespace",
        ),
        Err(e) => Finding::warn(
            id,
            format!("a FUSE mount in a throwaway namespace failed: {e}: {what}"),
            if sys.euid == 0 {
                "sudo modprobe fuse"
            } else {
                "fix the userns check first; FUSE in a user namespace needs Linux >= 4.18"
            },
        ),
    }
}

const FUSE_STEPS: &[&str] = &[
    "unshare(CLONE_NEWUSER|CLONE_NEWNS)",
    "write /proc/self/setgroups",
    "write /proc/self/uid_map",
    "write /proc/self/gid_map",
    "make / private in the new mount namespace",
    "open /dev/fuse",
    "mount -t fuse",
    "unshare(CLONE_NEWNS)",
];

pub fn probe_fuse(uid: u32, gid: u32) -> Result<(), String> {
    let (u, g) = maps(uid, gid);
    // The connection fd is moved to 100, so the options are fixed here.
    const FD: libc::c_int = 100;
    // uid 0: real root, or the caller mapped to root in its namespace.
    let opts = c"fd=100,rootmode=40000,user_id=0,group_id=0";
    in_child(FUSE_STEPS, || {
        if uid == 0 {
            // SAFETY: unshare changes only this (child) process.
            if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
                return Err((7, errno()));
            }
        } else {
            enter_userns(&u, &g, libc::CLONE_NEWNS)?;
        }
        // SAFETY: mount/open/dup3 in the child's own mount namespace; the
        // propagation is cut first, so nothing reaches the host's mounts.
        unsafe {
            if libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            {
                return Err((4, errno()));
            }
            let fd = libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
            if fd < 0 || libc::dup3(fd, FD, libc::O_CLOEXEC) < 0 {
                return Err((5, errno()));
            }
            if libc::mount(
                c"sbx-doctor".as_ptr(),
                c"/tmp".as_ptr(),
                c"fuse".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                opts.as_ptr().cast(),
            ) != 0
            {
                return Err((6, errno()));
            }
        }
        Ok(())
    })
}

/// /dev/kvm: opened, and it speaks KVM API 12.
fn kvm(sys: &Sys) -> Finding {
    let p = sys.path("/dev/kvm");
    let md = match std::fs::metadata(&p) {
        Ok(m) => m,
        Err(_) => {
            return Finding::warn(
                "kvm",
                "no /dev/kvm: sbx-vm runs QEMU under TCG (about 10x slower), Firecracker cannot run",
                "enable virtualisation in the firmware (or nested virtualisation) and sudo modprobe kvm_intel (or kvm_amd)",
            );
        }
    };
    if !md.file_type().is_char_device() {
        return Finding::warn(
            "kvm",
            "/dev/kvm is not a character device: sbx-vm cannot use KVM",
            "sudo rm /dev/kvm && sudo modprobe -r kvm_intel kvm_amd; sudo modprobe kvm_intel (or kvm_amd)",
        );
    }
    let f = match std::fs::OpenOptions::new().read(true).write(true).open(&p) {
        Ok(f) => f,
        Err(e) => {
            return Finding::warn(
                "kvm",
                format!(
                    "/dev/kvm: open for uid {}: {e}: sbx-vm falls back to TCG",
                    sys.euid
                ),
                "sudo usermod -aG kvm $USER (then log in again)",
            );
        }
    };
    use std::os::fd::AsRawFd;
    const KVM_GET_API_VERSION: libc::c_ulong = 0xAE00;
    // SAFETY: KVM_GET_API_VERSION takes no argument and returns an int.
    let v = unsafe { libc::ioctl(f.as_raw_fd(), KVM_GET_API_VERSION, 0) };
    if v != 12 {
        return Finding::warn(
            "kvm",
            format!("/dev/kvm: KVM_GET_API_VERSION gave {v}, not 12: sbx-vm falls back to TCG"),
            "reload the kvm module (sudo modprobe -r kvm_intel kvm_amd; sudo modprobe kvm_intel)",
        );
    }
    // The same test as sbx-vm's (sbx_vm::kvm): kvm_pvm starts VMMs but
    // boots no Linux guest.
    let module = |m: &str| sys.path(format!("/sys/module/{m}")).exists();
    if module("kvm_pvm") {
        return Finding::warn(
            "kvm",
            "/dev/kvm is kvm_pvm (a software hypervisor that boots no Linux guest): sbx-vm uses QEMU under TCG, Firecracker cannot boot",
            "run on bare metal or in a VM with nested virtualisation, with kvm_intel or kvm_amd loaded",
        );
    }
    match ["kvm_intel", "kvm_amd"].into_iter().find(|m| module(m)) {
        Some(m) => Finding::ok(
            "kvm",
            format!("/dev/kvm opens read-write (KVM API 12, {m})"),
        ),
        None => Finding::warn(
            "kvm",
            "/dev/kvm opens, but neither kvm_intel nor kvm_amd is loaded: sbx-vm falls back to TCG",
            "sudo modprobe kvm_intel (or kvm_amd)",
        ),
    }
}

// ---------------------------------------------------------------- cgroup

#[derive(Debug, Clone)]
pub struct Mount {
    pub root: String,
    pub point: String,
    pub fstype: String,
    pub superopts: Vec<String>,
}

pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let lf: Vec<&str> = left.split(' ').collect();
            let rf: Vec<&str> = right.split(' ').collect();
            Some(Mount {
                root: lf.get(3)?.to_string(),
                point: lf.get(4)?.replace("\\040", " "),
                fstype: rf.first()?.to_string(),
                superopts: rf.get(2)?.split(',').map(str::to_string).collect(),
            })
        })
        .collect()
}

/// The controllers sbx-cgroup sets limits with.
const WANT: [&str; 3] = ["memory", "pids", "cpu"];

const DELEGATE_FIX: &str = "run the chain as root, or in a delegated scope: systemd-run --user --scope -p Delegate=yes sbx-cgroup ... (cgroup v2), or give sbx-cgroup --parent a group chowned to you";

fn writable(p: &Path) -> bool {
    let Ok(c) = CString::new(p.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: access on a NUL-terminated path.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}

/// The directory of this process's group below mount `m`.
fn group_dir(m: &Mount, path: &str) -> PathBuf {
    let rel = if m.root == "/" {
        path
    } else {
        path.strip_prefix(m.root.as_str()).unwrap_or(path)
    };
    Path::new(&m.point).join(rel.trim_start_matches('/'))
}

pub fn cgroup(sys: &Sys) -> Finding {
    let Some(mi) = sys.read("/proc/self/mountinfo") else {
        return Finding::fail(
            "cgroup",
            "cannot read /proc/self/mountinfo",
            "mount /proc (mount -t proc proc /proc)",
        );
    };
    let mounts = parse_mountinfo(&mi);
    let v1: Vec<&Mount> = mounts
        .iter()
        .filter(|m| m.fstype == "cgroup" && m.superopts.iter().any(|o| is_controller(o)))
        .collect();
    let v2 = mounts.iter().find(|m| m.fstype == "cgroup2");
    let version = match (v1.is_empty(), v2.is_some()) {
        (false, true) => "hybrid (v1 controllers, v2 unified)",
        (false, false) => "v1",
        (true, true) => "v2",
        (true, false) => {
            return Finding::fail(
                "cgroup",
                "no cgroup hierarchy is mounted: sbx-cgroup cannot set limits",
                "sudo mount -t cgroup2 none /sys/fs/cgroup",
            );
        }
    };
    let own = sys.read("/proc/self/cgroup").unwrap_or_default();
    let line_for = |pred: &dyn Fn(&str, &str) -> bool| {
        own.lines().find_map(|l| {
            let mut it = l.splitn(3, ':');
            let (h, c, p) = (it.next()?, it.next()?, it.next()?);
            pred(h, c).then(|| p.to_string())
        })
    };
    // (controller, its group's directory) for each controller wanted.
    let mut dirs: Vec<(&str, Option<PathBuf>)> = Vec::new();
    if !v1.is_empty() {
        for c in WANT {
            let m = v1.iter().find(|m| m.superopts.iter().any(|o| o == c));
            let path = line_for(&|h, cs| h != "0" && cs.split(',').any(|x| x == c));
            dirs.push((c, m.zip(path).map(|(m, p)| group_dir(m, &p))));
        }
    } else if let Some(m) = v2 {
        let dir = line_for(&|h, _| h == "0").map(|p| group_dir(m, &p));
        let avail = dir
            .as_ref()
            .and_then(|d| sys.read(d.join("cgroup.controllers")))
            .unwrap_or_default();
        for c in WANT {
            let has = avail.split_whitespace().any(|x| x == c);
            dirs.push((c, dir.clone().filter(|_| has)));
        }
    }
    let missing: Vec<&str> = dirs
        .iter()
        .filter(|(_, d)| d.is_none())
        .map(|(c, _)| *c)
        .collect();
    if !missing.is_empty() {
        return Finding::warn(
            "cgroup",
            format!(
                "cgroup {version}: no {} controller for this process: sbx-cgroup cannot set those limits",
                missing.join(", ")
            ),
            "enable the controllers (cgroup v2: echo +memory +pids +cpu > the parent's cgroup.subtree_control; v1: mount them)",
        );
    }
    let not_w: Vec<String> = dirs
        .iter()
        .filter_map(|(_, d)| d.as_ref())
        .filter(|d| !writable(&sys.path(d)))
        .map(|d| d.display().to_string())
        .collect();
    if !not_w.is_empty() {
        return Finding::warn(
            "cgroup",
            format!(
                "cgroup {version}: not delegated to uid {} ({} not writable): memory, CPU and pids limits will not apply (rlimits and the wall clock still do)",
                sys.euid,
                not_w.join(", ")
            ),
            DELEGATE_FIX,
        );
    }
    Finding::ok(
        "cgroup",
        format!(
            "cgroup {version}: memory, pids and cpu groups writable (delegated) for uid {}",
            sys.euid
        ),
    )
}

fn is_controller(o: &str) -> bool {
    matches!(
        o,
        "cpu"
            | "cpuacct"
            | "cpuset"
            | "memory"
            | "devices"
            | "freezer"
            | "net_cls"
            | "net_prio"
            | "blkio"
            | "perf_event"
            | "hugetlb"
            | "pids"
            | "rdma"
            | "misc"
    )
}

// ---------------------------------------------------------------- landlock

/// landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION): the
/// ABI version, or the errno.
pub fn landlock_abi() -> Result<i64, i32> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a NULL attr and size 0 this flag only asks for the ABI.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if r < 0 { Err(errno()) } else { Ok(r) }
}

pub fn landlock(abi: Result<i64, i32>) -> Finding {
    match abi {
        Ok(v) => Finding::ok("landlock", format!("Landlock ABI {v}")),
        Err(libc::EOPNOTSUPP) => Finding::warn(
            "landlock",
            "Landlock is built in but not enabled: sbx-seccomp --allow-exec cannot be enforced",
            "add landlock to the lsm= kernel parameter (e.g. lsm=landlock,lockdown,yama,apparmor,bpf) and reboot",
        ),
        Err(libc::ENOSYS) => Finding::warn(
            "landlock",
            "this kernel has no Landlock (Linux >= 5.13 with CONFIG_SECURITY_LANDLOCK): sbx-seccomp --allow-exec cannot be enforced",
            "boot a kernel with CONFIG_SECURITY_LANDLOCK=y (Debian 12's kernels have it)",
        ),
        Err(libc::EPERM) => Finding::warn(
            "landlock",
            "landlock_create_ruleset was refused (EPERM): a seccomp filter of a container or sandbox around sbx-doctor: sbx-seccomp --allow-exec cannot be enforced here",
            "run the chain outside that container, or let its seccomp profile allow landlock_create_ruleset, landlock_add_rule and landlock_restrict_self",
        ),
        Err(e) => Finding::warn(
            "landlock",
            format!(
                "landlock_create_ruleset: {}",
                std::io::Error::from_raw_os_error(e)
            ),
            "check the kernel's Landlock support (dmesg | grep -i landlock)",
        ),
    }
}

// ---------------------------------------------------------------- seccomp

/// SECCOMP_GET_ACTION_AVAIL for SECCOMP_RET_USER_NOTIF, asked live.
pub fn user_notif_live() -> bool {
    const SECCOMP_GET_ACTION_AVAIL: libc::c_uint = 2;
    const SECCOMP_RET_USER_NOTIF: u32 = 0x7fc0_0000;
    let action = SECCOMP_RET_USER_NOTIF;
    // SAFETY: the operation reads one u32 through the pointer.
    unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            SECCOMP_GET_ACTION_AVAIL,
            0u32,
            std::ptr::from_ref::<u32>(&action),
        ) == 0
    }
}

pub fn seccomp(actions_avail: Option<String>, notif_live: bool) -> Finding {
    let Some(a) = actions_avail else {
        return Finding::fail(
            "seccomp",
            "no /proc/sys/kernel/seccomp/actions_avail: this kernel has no seccomp filters; sbx-seccomp cannot run",
            "boot a kernel with CONFIG_SECCOMP_FILTER=y",
        );
    };
    let has = |x: &str| a.split_whitespace().any(|w| w == x);
    if !has("errno") || !has("kill_process") {
        return Finding::fail(
            "seccomp",
            format!(
                "seccomp actions are only '{}': sbx-seccomp needs errno and kill_process",
                a.trim()
            ),
            "boot a kernel >= 4.14 with CONFIG_SECCOMP_FILTER=y",
        );
    }
    if !has("user_notif") || !notif_live {
        return Finding::fail(
            "seccomp",
            "seccomp user notification is not available: sbx-seccomp's notifier (alerts for denied calls, the exec check) cannot run",
            "boot a kernel >= 5.0 (SECCOMP_RET_USER_NOTIF)",
        );
    }
    Finding::ok("seccomp", "seccomp filters and user notification work")
}

// ---------------------------------------------------------------- programs

/// The first of `names` that is an executable file (a name without a
/// slash is looked for on PATH).
pub fn find_program(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for n in names {
        if n.contains('/') {
            if is_exe(Path::new(n)) {
                return Some(PathBuf::from(n));
            }
            continue;
        }
        for d in std::env::split_paths(&path) {
            let p = d.join(n);
            if is_exe(&p) {
                return Some(p);
            }
        }
    }
    None
}

fn is_exe(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Runs `cmd` for at most `limit`: (success, stdout + stderr).
fn run_bounded(mut cmd: Command, limit: Duration) -> Result<(bool, String), String> {
    use sbx_core::child::{Overrun, output_within};
    let f = output_within(&mut cmd, limit, 1 << 20).map_err(|e| match e {
        Overrun::Spawn(e) => format!("spawn (or enter its namespaces): {e}"),
        e => e.to_string(),
    })?;
    let mut out = String::from_utf8_lossy(&f.stdout).into_owned();
    out.push_str(&String::from_utf8_lossy(&f.stderr));
    Ok((f.status.success(), out))
}

fn program(id: &'static str, names: &[&str], without: &str, fix: &str) -> Finding {
    let Some(p) = find_program(names) else {
        return Finding::warn(id, format!("no {} on PATH: {without}", names[0]), fix);
    };
    let mut c = Command::new(&p);
    c.arg("--version");
    match run_bounded(c, Duration::from_secs(5)) {
        Ok((_, out)) => {
            let v = out
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .trim();
            Finding::ok(id, format!("{} ({v})", p.display()))
        }
        Err(e) => Finding::warn(
            id,
            format!("{} --version: {e}", p.display()),
            format!("reinstall it ({fix})"),
        ),
    }
}

// ---------------------------------------------------------------- nftables

/// The kernel's nf_tables, probed with the nft program (sbx-net itself
/// sends its rules over netlink and needs no nftables package).
fn nftables(sys: &Sys) -> Finding {
    let Some(nft) = find_program(&["nft", "/usr/sbin/nft", "/sbin/nft"]) else {
        return Finding::warn(
            "nftables",
            "no nft program to probe the kernel's nf_tables with (sbx-net itself needs none)",
            "sudo apt install nftables",
        );
    };
    let how = if sys.euid == 0 {
        "a throwaway network namespace"
    } else {
        "a throwaway user and network namespace"
    };
    match probe_nft(&nft, sys.euid, sys.egid) {
        Ok(()) => Finding::ok(
            "nftables",
            format!("{} adds a table in {how}", nft.display()),
        ),
        Err(e) => Finding::fail(
            "nftables",
            format!(
                "{} in {how}: {e}: sbx-net cannot set its rules",
                nft.display()
            ),
            if sys.euid == 0 {
                "sudo modprobe nf_tables (and check the kernel has CONFIG_NF_TABLES)"
            } else {
                "fix the userns check first, then: sudo modprobe nf_tables"
            },
        ),
    }
}

/// `nft add table` in a new network namespace that dies with the child.
fn probe_nft(nft: &Path, euid: u32, egid: u32) -> Result<(), String> {
    let (u, g) = maps(euid, egid);
    let mut c = Command::new(nft);
    c.args(["add", "table", "inet", "sbx_doctor_probe"]);
    // SAFETY: runs in the forked child before exec: raw syscalls on data
    // prepared before the fork.
    unsafe {
        c.pre_exec(move || {
            let r = if euid == 0 {
                if libc::unshare(libc::CLONE_NEWNET) != 0 {
                    Err((0, errno()))
                } else {
                    Ok(())
                }
            } else {
                enter_userns(&u, &g, libc::CLONE_NEWNET)
            };
            // No allocation after fork: the errno alone.
            r.map_err(|(_, e)| std::io::Error::from_raw_os_error(e))
        });
    }
    match run_bounded(c, Duration::from_secs(10)) {
        Ok((true, _)) => Ok(()),
        Ok((false, out)) => Err(out.lines().next().unwrap_or("failed").to_string()),
        Err(e) => Err(e),
    }
}

// ---------------------------------------------------------------- sockets

/// The engine sockets to try: DOCKER_HOST (unix:// only), else the usual.
fn engine_sockets() -> Vec<PathBuf> {
    if let Ok(h) = std::env::var("DOCKER_HOST")
        && !h.is_empty()
    {
        return h
            .strip_prefix("unix://")
            .map(|p| vec![PathBuf::from(p)])
            .unwrap_or_default();
    }
    let mut v = vec![PathBuf::from("/var/run/docker.sock")];
    if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR") {
        v.push(Path::new(&x).join("podman/podman.sock"));
    }
    v.push(PathBuf::from("/run/podman/podman.sock"));
    v
}

/// Sends an HTTP/1.0 GET and returns the status code and the whole answer.
fn http_get(mut s: impl Read + Write, host: &str, path: &str) -> std::io::Result<(u16, String)> {
    // One write: a server may read the request in one go.
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())?;
    let mut buf = Vec::new();
    s.take(64 * 1024).read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf).to_string();
    let code = text
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other("not an HTTP answer"))?;
    Ok((code, text))
}

fn engine() -> Finding {
    let socks = engine_sockets();
    if socks.is_empty() {
        return Finding::warn(
            "engine",
            "DOCKER_HOST is not a unix:// socket: sbx-doctor checks only local sockets",
            "export DOCKER_HOST=unix:///var/run/docker.sock (or the Podman socket)",
        );
    }
    let mut tried = Vec::new();
    for p in &socks {
        if !p.exists() {
            tried.push(p.display().to_string());
            continue;
        }
        let r = std::os::unix::net::UnixStream::connect(p).and_then(|s| {
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            s.set_write_timeout(Some(Duration::from_secs(5)))?;
            http_get(s, "docker", "/_ping")
        });
        return match r {
            Ok((200, text)) => {
                let kind = if text.to_ascii_lowercase().contains("libpod") {
                    "Podman"
                } else {
                    "Docker"
                };
                Finding::ok(
                    "engine",
                    format!("{kind} API at unix://{} answers /_ping", p.display()),
                )
            }
            Ok((code, _)) => Finding::warn(
                "engine",
                format!("unix://{}: /_ping answered HTTP {code}", p.display()),
                "restart the engine (sudo systemctl restart docker, or podman system service)",
            ),
            Err(e) => Finding::warn(
                "engine",
                format!("unix://{}: {e}: sbx-container cannot run", p.display()),
                "start the engine, or join its group (sudo usermod -aG docker $USER)",
            ),
        };
    }
    Finding::warn(
        "engine",
        format!(
            "no Docker/Podman API socket ({}): sbx-container cannot run",
            tried.join(", ")
        ),
        "sudo systemctl start docker, or: podman system service --time=0 unix:///run/podman/podman.sock & export DOCKER_HOST=unix:///run/podman/podman.sock",
    )
}

/// (scheme, host, port) of an http(s) URL.
pub fn parse_url(u: &str) -> Option<(&str, String, u16)> {
    let (scheme, rest) = u.split_once("://")?;
    let hostport = rest.split('/').next()?;
    let default = match scheme {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let (host, port) = if let Some(h) = hostport.strip_prefix('[') {
        let (h, after) = h.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None => default,
        };
        (h.to_string(), port)
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p.parse().ok()?),
            None => (hostport.to_string(), default),
        }
    };
    (!host.is_empty()).then_some((scheme, host, port))
}

pub fn vault(addr: Option<String>) -> Finding {
    let Some(addr) = addr.filter(|a| !a.is_empty()) else {
        return Finding::skip(
            "vault",
            "VAULT_ADDR/BAO_ADDR not set: sbx-creds is not configured here",
        );
    };
    let Some((scheme, host, port)) = parse_url(&addr) else {
        return Finding::fail(
            "vault",
            format!("'{addr}' is not an http:// or https:// URL"),
            "export VAULT_ADDR=http://127.0.0.1:8200 (the server's address)",
        );
    };
    use std::net::ToSocketAddrs;
    let addrs: Vec<_> = match (host.as_str(), port).to_socket_addrs() {
        Ok(a) => a.collect(),
        Err(e) => {
            return Finding::fail(
                "vault",
                format!("{addr}: resolve {host}: {e}"),
                "correct VAULT_ADDR/BAO_ADDR",
            );
        }
    };
    let mut last = String::from("no address");
    for a in addrs {
        let s = match std::net::TcpStream::connect_timeout(&a, Duration::from_secs(3)) {
            Ok(s) => s,
            Err(e) => {
                last = format!("connect {a}: {e}");
                continue;
            }
        };
        if scheme == "https" {
            return Finding::ok(
                "vault",
                format!(
                    "{addr} accepts TCP connections (TLS and health not checked by sbx-doctor)"
                ),
            );
        }
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
        return match http_get(s, &host, "/v1/sys/health") {
            Ok((200, _)) => Finding::ok("vault", format!("{addr} is up, initialised and unsealed")),
            Ok((429 | 472 | 473, _)) => {
                Finding::ok("vault", format!("{addr} answers (a standby node)"))
            }
            Ok((501, _)) => Finding::fail(
                "vault",
                format!("{addr} is not initialised: sbx-creds cannot fetch secrets"),
                "bao operator init (or vault operator init), then unseal",
            ),
            Ok((503, _)) => Finding::fail(
                "vault",
                format!("{addr} is sealed: sbx-creds cannot fetch secrets"),
                "bao operator unseal (or vault operator unseal)",
            ),
            Ok((code, _)) => Finding::fail(
                "vault",
                format!("{addr}/v1/sys/health answered HTTP {code}: not a Vault/OpenBao server?"),
                "point VAULT_ADDR/BAO_ADDR at the server's API address",
            ),
            Err(e) => Finding::fail(
                "vault",
                format!("{addr}/v1/sys/health: {e}"),
                "point VAULT_ADDR/BAO_ADDR at the server's API address",
            ),
        };
    }
    Finding::fail(
        "vault",
        format!("{addr} is unreachable ({last}): sbx-creds cannot fetch secrets"),
        "start the server (bao server ...), or correct VAULT_ADDR/BAO_ADDR",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(files: &[(&str, &str)]) -> (tempfile::TempDir, Sys) {
        let d = tempfile::tempdir().unwrap();
        for (p, text) in files {
            let f = d.path().join(p.trim_start_matches('/'));
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(f, text).unwrap();
        }
        let sys = Sys::with_root(Some(d.path().to_path_buf()));
        (d, sys)
    }

    #[test]
    fn each_userns_blocker_fails_for_a_user_with_its_fix_and_warns_for_root() {
        for (file, value, fix) in [
            (
                "/proc/sys/user/max_user_namespaces",
                "0\n",
                "sudo sysctl -w user.max_user_namespaces=15000",
            ),
            (
                "/proc/sys/kernel/unprivileged_userns_clone",
                "0\n",
                "sudo sysctl -w kernel.unprivileged_userns_clone=1",
            ),
            (
                "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
                "1\n",
                "sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0",
            ),
        ] {
            let (_d, sys) = fake(&[(file, value)]);
            // The live probe succeeds here: the sysctl alone decides.
            let user = userns(&sys.clone().with_identity(1000, 1000), Ok(()));
            assert_eq!(user.status, Status::Fail, "{file}: {user:?}");
            assert!(user.fix.as_deref().unwrap().starts_with(fix), "{user:?}");
            let root = userns(&sys.with_identity(0, 0), Ok(()));
            assert_eq!(root.status, Status::Warn, "{file}: {root:?}");
            assert!(root.summary.contains("unprivileged users cannot"));
        }
        // Permissive values and absent files: the probe decides.
        let (_d, sys) = fake(&[
            ("/proc/sys/user/max_user_namespaces", "15000\n"),
            (
                "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
                "0\n",
            ),
        ]);
        let u = sys.with_identity(1000, 1000);
        assert_eq!(userns(&u, Ok(())).status, Status::Ok);
        let f = userns(
            &u,
            Err("unshare(CLONE_NEWUSER): Operation not permitted".into()),
        );
        assert_eq!(f.status, Status::Fail);
        assert!(f.summary.contains("Operation not permitted") && f.fix.is_some());
    }

    #[test]
    fn landlock_and_seccomp_classify_each_kernel_answer() {
        assert_eq!(landlock(Ok(7)).status, Status::Ok);
        for e in [libc::ENOSYS, libc::EOPNOTSUPP, libc::EPERM, libc::EINVAL] {
            let f = landlock(Err(e));
            assert_eq!(f.status, Status::Warn);
            assert!(f.fix.is_some());
        }
        assert!(
            landlock(Err(libc::EOPNOTSUPP))
                .fix
                .unwrap()
                .contains("lsm=")
        );
        assert!(landlock(Err(libc::EPERM)).summary.contains("refused"));
        let all = "kill_process kill_thread trap errno user_notif trace log allow";
        assert_eq!(seccomp(Some(all.into()), true).status, Status::Ok);
        assert_eq!(seccomp(None, true).status, Status::Fail);
        let no_notif = seccomp(Some("kill_process errno allow".into()), true);
        assert_eq!(no_notif.status, Status::Fail);
        assert!(no_notif.summary.contains("user notification"));
        assert_eq!(seccomp(Some(all.into()), false).status, Status::Fail);
        assert_eq!(seccomp(Some("allow".into()), true).status, Status::Fail);
    }

    const V1: &str = "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n\
        32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n\
        35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
        39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n\
        40 31 0:37 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd\n";

    #[test]
    fn cgroup_version_and_delegation_from_mountinfo() {
        // v2, delegated (the group's directory is ours), all controllers.
        let (d, sys) = fake(&[
            (
                "/proc/self/mountinfo",
                "30 23 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
            ),
            ("/proc/self/cgroup", "0::/user.slice/me\n"),
            (
                "/sys/fs/cgroup/user.slice/me/cgroup.controllers",
                "cpuset cpu io memory pids\n",
            ),
        ]);
        let f = cgroup(&sys);
        assert_eq!(f.status, Status::Ok, "{f:?}");
        assert!(f.summary.starts_with("cgroup v2"), "{f:?}");
        // v2 without the memory controller delegated.
        std::fs::write(
            d.path()
                .join("sys/fs/cgroup/user.slice/me/cgroup.controllers"),
            "cpu pids\n",
        )
        .unwrap();
        let f = cgroup(&sys);
        assert_eq!(f.status, Status::Warn, "{f:?}");
        assert!(f.summary.contains("no memory controller"), "{f:?}");
        // v1 (and hybrid with a cgroup2 mount).
        let mut files = [
            ("/proc/self/mountinfo", V1.to_string()),
            (
                "/proc/self/cgroup",
                "4:memory:/a\n9:pids:/a\n1:cpu:/a\n0::/\n".to_string(),
            ),
        ];
        let fs: Vec<(&str, &str)> = files.iter().map(|(a, b)| (*a, b.as_str())).collect();
        let (d, sys) = fake(&fs);
        for c in ["cpu", "memory", "pids"] {
            std::fs::create_dir_all(d.path().join("sys/fs/cgroup").join(c).join("a")).unwrap();
        }
        let f = cgroup(&sys);
        assert_eq!(f.status, Status::Ok, "{f:?}");
        assert!(f.summary.starts_with("cgroup v1"), "{f:?}");
        files[0]
            .1
            .push_str("41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n");
        std::fs::write(d.path().join("proc/self/mountinfo"), &files[0].1).unwrap();
        assert!(cgroup(&sys).summary.starts_with("cgroup hybrid"));
        // Nothing mounted.
        let (_d, sys) = fake(&[(
            "/proc/self/mountinfo",
            "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n",
        )]);
        let f = cgroup(&sys);
        assert_eq!(f.status, Status::Fail);
        assert!(f.fix.unwrap().contains("mount -t cgroup2"));
    }

    #[test]
    fn mount_roots_are_stripped_from_the_group_path() {
        let m = &parse_mountinfo("1 0 0:1 /outer /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")[0];
        assert_eq!(
            group_dir(m, "/outer/inner"),
            PathBuf::from("/sys/fs/cgroup/inner")
        );
    }

    #[test]
    fn urls_and_an_unset_vault() {
        assert_eq!(
            parse_url("http://127.0.0.1:8200"),
            Some(("http", "127.0.0.1".into(), 8200))
        );
        assert_eq!(
            parse_url("https://[::1]/x"),
            Some(("https", "::1".into(), 443))
        );
        assert_eq!(parse_url("ftp://x"), None);
        assert_eq!(parse_url("127.0.0.1:8200"), None);
        assert_eq!(vault(None).status, Status::Skip);
        let f = vault(Some("nonsense".into()));
        assert_eq!(f.status, Status::Fail);
        assert!(f.fix.is_some());
    }

    /// A one-shot HTTP server on 127.0.0.1 answering `status`.
    fn server(status: &'static str) -> String {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        std::thread::spawn(move || {
            if let Ok((mut s, _)) = l.accept() {
                let mut b = [0u8; 1024];
                let _ = s.read(&mut b);
                let _ = write!(s, "HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n");
            }
        });
        format!("http://{a}")
    }

    #[test]
    fn vault_health_answers_are_read() {
        assert_eq!(vault(Some(server("200 OK"))).status, Status::Ok);
        assert_eq!(
            vault(Some(server("429 Too Many Requests"))).status,
            Status::Ok
        );
        let sealed = vault(Some(server("503 Service Unavailable")));
        assert_eq!(sealed.status, Status::Fail);
        assert!(sealed.fix.unwrap().contains("unseal"));
        let uninit = vault(Some(server("501 Not Implemented")));
        assert!(uninit.summary.contains("not initialised"));
        // A port nobody listens on.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        drop(l);
        let f = vault(Some(format!("http://{a}")));
        assert_eq!(f.status, Status::Fail);
        assert!(f.summary.contains("unreachable"), "{f:?}");
    }

    #[test]
    fn devices_that_are_missing_or_not_devices_warn_with_a_fix() {
        let (_d, sys) = fake(&[("/dev/kvm", "not a device")]);
        let f = kvm(&sys);
        assert_eq!(f.status, Status::Warn);
        assert!(f.summary.contains("not a character device"));
        let f = device(&sys, "fuse", "/dev/fuse");
        assert_eq!(f.status, Status::Warn);
        assert!(f.fix.unwrap().contains("modprobe fuse"));
    }
}
