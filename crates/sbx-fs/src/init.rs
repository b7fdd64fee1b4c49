//! The sandbox's PID 1: builds the root, starts the command, reaps every
//! zombie, forwards signals, exits with the command's status, and dies
//! with the outer sbx-fs (it polls a pidfd of it; PDEATHSIG as a second
//! line).

use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;

use nix::sys::signal::{SigSet, SigmaskHow, Signal, pthread_sigmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use sbx_core::{Failure, Severity, audit, chain, exit};

use crate::fuse::handoff;
use crate::guard::Guards;
use crate::mounts::{self, Owner};
use crate::plan::Plan;
use crate::{caps, namespaces};

pub struct InitArgs {
    pub plan: Plan,
    pub userns: bool,
    pub uid: u32,
    pub gid: u32,
    pub outer_uid: u32,
    pub outer_gid: u32,
    pub hostname: Option<String>,
    /// Where the command starts: candidates in order (the first that works).
    pub chdir: Option<PathBuf>,
    pub fallback_dirs: Vec<PathBuf>,
    pub argv: Vec<OsString>,
    pub env: Vec<(OsString, OsString)>,
    /// The next sbx tool, opened before the pivot (exec'd by fd).
    pub exec_fd: Option<OwnedFd>,
    /// pidfd of the outer sbx-fs.
    pub owner: OwnedFd,
    /// The guard nodes (which ops they replace; init drops the host fds).
    pub guards: Guards,
    /// Init's end of the socketpair to the outer sbx-fs.
    pub chan: Option<OwnedFd>,
    /// `--git-identity`: (path in $HOME, content) of ~/.gitconfig.
    pub gitconfig: Option<(PathBuf, Vec<u8>)>,
}

/// Never returns: exits with the command's status (125 on a setup failure).
pub fn run(a: InitArgs) -> ! {
    let code = match setup_and_run(a) {
        Ok(c) => c,
        Err(f) => {
            // One line on stderr: the event goes to the audit log only.
            if f.code == exit::TOOL_FAILED
                && let Some(au) = audit::get()
            {
                au.record(
                    "setup_failed",
                    Severity::Warn,
                    serde_json::json!({ "error": f.message }),
                );
            }
            sbx_core::cli::stderr_line(&format!(
                "sbx-fs: {}",
                sbx_core::escape::terminal(&f.message)
            ));
            f.code
        }
    };
    // SAFETY: init's end: leaves without running destructors of the state cloned from sbx-fs.
    unsafe { libc::_exit(code) }
}

fn setup_and_run(mut a: InitArgs) -> Result<i32, Failure> {
    // SAFETY: prctl with integer arguments, on this process only.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
    }
    if crate::sys::pidfd_exited(a.owner.as_fd()) {
        return Err(Failure::new("sbx-fs exited before the sandbox started"));
    }
    // Away from the terminal's process group: the outer sbx-fs forwards
    // what the terminal sends, once.
    // SAFETY: setsid on this process only (it cannot fail here: init is no group leader).
    unsafe { libc::setsid() };
    if a.userns {
        namespaces::write_maps(a.uid, a.outer_uid, a.gid, a.outer_gid)?;
    }
    // The command must not read init's memory or environment through /proc.
    // SAFETY: prctl with integer arguments, on this process only.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if let Some(h) = &a.hostname {
        namespaces::set_hostname(h)?;
    }
    let mut root = mounts::prepare(
        Owner {
            uid: a.uid,
            gid: a.gid,
        },
        &mut a.plan.sources,
    )?;
    // The guard file system: mounted here, inside the user namespace, and
    // served by the outer sbx-fs. When it cannot be, the ops run as plain
    // placeholders and read-only binds (the outer sbx-fs logs why).
    let chan_fd = a.chan.take();
    let chan = chan_fd.as_ref().map(|f| f.as_fd());
    let guarded = !a.guards.is_empty() && {
        match setup_guard(&mut root, a.uid, a.gid, a.userns) {
            Ok(dev) => {
                handoff::send(chan, handoff::TAG_FUSE, "", Some(dev.as_fd()))
                    .map_err(|e| Failure::new(format!("hand the guard fs to sbx-fs: {e}")))?;
                true
            }
            Err(e) => {
                let _ = handoff::send(chan, handoff::TAG_UNAVAILABLE, &e.message, None);
                false
            }
        }
    };
    // Host fds of the passthrough nodes: the server has its own.
    a.guards.nodes.clear();
    a.guards.git_dirs.clear();
    // Pins go in parent first, each before every op deeper than it.
    let mut pins = a.plan.pins.iter().peekable();
    for (i, op) in a.plan.ops.iter().enumerate() {
        let d = crate::plan::depth(&op.dst);
        while let Some(p) = pins.next_if(|p| crate::plan::depth(p) < d) {
            root.pin(p)?;
        }
        let layer = a.plan.quota.as_ref().and_then(|q| q.layer_of(op));
        match (a.guards.by_op.get(&i), layer, &a.plan.quota) {
            (Some(g), _, _) if guarded => root.apply_guard(op, *g)?,
            (_, Some(k), Some(q)) => root.apply_quota(op, &a.plan.sources, k, q)?,
            _ => root.apply(op, &a.plan.sources)?,
        }
    }
    for p in pins {
        root.pin(p)?;
    }
    // The budget's tmpfs: the outer sbx-fs watches it and applies it.
    if let Some(q) = root.quota_root() {
        handoff::send(chan, handoff::TAG_QUOTA, "", Some(q))
            .map_err(|e| Failure::new(format!("hand the write budget to sbx-fs: {e}")))?;
    }
    // /tmp, for the outer sbx-fs to notice when it fills up.
    if let Ok(Some(t)) = root.mkpath(std::path::Path::new("/tmp"), crate::plan::Kind::Dir, false) {
        let _ = handoff::send(chan, handoff::TAG_TMP, "", Some(t.as_fd()));
    }
    drop(chan_fd);
    root.pivot()?;
    // The bind sources' fds refer to the host: gone before the command runs.
    a.plan.sources.clear();
    if let Some((p, text)) = &a.gitconfig
        && let Err(e) = crate::gitident::write(p, text, a.uid, a.gid)
    {
        // The run goes on: git then says what it lacks.
        audit::emit(
            "git_identity_unavailable",
            Severity::Warn,
            serde_json::json!({ "path": p.display().to_string(), "error": e.to_string() }),
        );
    }
    enter_dir(&a)?;

    let mut mask = sbx_core::signals::forwarded_set();
    mask.add(Signal::SIGCHLD);
    pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&mask), None)
        .map_err(|e| Failure::new(format!("sigprocmask: {e}")))?;
    let sfd = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(|e| Failure::new(format!("signalfd: {e}")))?;

    // SAFETY: init is one thread (a clone of the calling thread only); the child only execs or
    // _exits.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(Failure::new(format!(
            "fork: {}",
            std::io::Error::last_os_error()
        )));
    }
    if child == 0 {
        drop(sfd);
        exec_command(&a);
    }
    drop(a.exec_fd.take());
    supervise(child, &sfd, a.owner.as_raw_fd())
}

/// Opens /dev/fuse (here: the kernel wants the opener in the mounting user
/// namespace) and mounts the guard file system in the helper.
fn setup_guard(
    root: &mut mounts::Root,
    uid: u32,
    gid: u32,
    userns: bool,
) -> Result<OwnedFd, Failure> {
    use crate::fuse::mount;
    let dev = mount::open_dev()?;
    // The mounter's ids as this user namespace sees them.
    let (u, g) = if userns {
        (uid, gid)
    } else {
        // SAFETY: geteuid/getegid cannot fail.
        unsafe { (libc::geteuid(), libc::getegid()) }
    };
    let mnt = mount::mount(&dev, u, g)?;
    root.attach_guard(mnt)?;
    Ok(dev)
}

fn enter_dir(a: &InitArgs) -> Result<(), Failure> {
    if let Some(d) = &a.chdir {
        return std::env::set_current_dir(d)
            .map_err(|e| Failure::new(format!("--chdir {}: {e}", d.display())));
    }
    for d in &a.fallback_dirs {
        if std::env::set_current_dir(d).is_ok() {
            return Ok(());
        }
    }
    std::env::set_current_dir("/").map_err(|e| Failure::new(format!("chdir /: {e}")))
}

/// The command's process: its own session (no TIOCSTI into our terminal),
/// no capabilities, no_new_privs, only fds 0-2 (and the audit fd for a next
/// sbx tool), then exec.
fn exec_command(a: &InitArgs) -> ! {
    let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
    // SAFETY: setsid and prctl with integer arguments, on this process only.
    unsafe {
        libc::setsid();
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
    }
    if let Err(e) = caps::drop_all(a.uid, a.gid, a.userns) {
        sbx_core::cli::stderr_line(&format!("sbx-fs: dropping privileges: {e}"));
        // SAFETY: the forked child leaves without running init's destructors.
        unsafe { libc::_exit(exit::TOOL_FAILED) }
    }
    let env = a.env.clone();
    // chain::exec/exec_fd hand the audit fd to a trusted sbx tool only.
    if let Err(e) = sbx_core::fds::cloexec_all_except(&[]) {
        sbx_core::cli::stderr_line(&format!("sbx-fs: fd hygiene: {e}"));
        // SAFETY: the forked child leaves without running init's destructors.
        unsafe { libc::_exit(exit::TOOL_FAILED) }
    }
    let f = match &a.exec_fd {
        Some(fd) => chain::exec_fd(fd.as_fd(), &a.argv, &env),
        None => chain::exec(&a.argv, &env),
    };
    sbx_core::cli::stderr_line(&format!(
        "sbx-fs: {}",
        sbx_core::escape::terminal(&f.message)
    ));
    // SAFETY: the forked child leaves without running init's destructors.
    unsafe { libc::_exit(f.code) }
}

fn supervise(child: libc::pid_t, sfd: &SignalFd, owner: i32) -> Result<i32, Failure> {
    loop {
        let mut fds = [
            libc::pollfd {
                fd: sfd.as_fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: owner,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: fds is a live array of two pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            continue;
        }
        if fds[1].revents != 0 {
            // The outer sbx-fs is gone: so is the sandbox (our exit kills
            // every process of the PID namespace).
            sbx_core::deathwatch::supervisor_died("sbx-fs");
            return Ok(128 + libc::SIGKILL);
        }
        if fds[0].revents == 0 {
            continue;
        }
        let mut reap = false;
        while let Ok(Some(info)) = sfd.read_signal() {
            let sig = info.ssi_signo as i32;
            if sig == libc::SIGCHLD {
                reap = true;
            } else {
                // SAFETY: kill with integer arguments; child is our own unreaped child (its pid
                // cannot be reused yet).
                unsafe { libc::kill(child, sig) };
            }
        }
        if reap && let Some(code) = reap_all(child) {
            return Ok(code);
        }
    }
}

/// Reaps every exited process; the command's status when it was one.
fn reap_all(child: libc::pid_t) -> Option<i32> {
    let mut result = None;
    loop {
        let mut st = 0;
        sbx_core::deathwatch::peek_exited();
        // SAFETY: st is a live int; WNOHANG: never blocks.
        let pid = unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG) };
        if pid <= 0 {
            break;
        }
        let status = std::os::unix::process::ExitStatusExt::from_raw(st);
        sbx_core::sigsys::report_child_exit(pid, status);
        if pid == child {
            result = Some(exit::from_raw_wait(st));
        }
    }
    result
}
