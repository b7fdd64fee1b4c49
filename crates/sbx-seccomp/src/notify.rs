//! Observable denials: the default profile's EPERM ("probe") denials are
//! installed as SECCOMP_RET_USER_NOTIF, and a notifier process answers each
//! notification with -EPERM and writes a `syscall_denied` alert.
//!
//! Ordering (before `execve` of CMD):
//! 1. a SOCK_SEQPACKET socketpair is made;
//! 2. sbx-seccomp double-forks the notifier (so it is not a child of CMD: a
//!    shell's `wait` does not wait for it); the middle process sends the
//!    notifier's pid and exits, sbx-seccomp reaps it;
//! 3. the notifier (still WITHOUT any filter) starts a new session, sets
//!    PR_SET_DUMPABLE 0, closes every fd but its socket end and the audit
//!    log, and waits for the listener fd;
//! 4. sbx-seccomp installs its filters; the one holding the notify returns
//!    is installed with SECCOMP_FILTER_FLAG_NEW_LISTENER;
//! 5. the listener fd goes to the notifier with SCM_RIGHTS; sbx-seccomp
//!    closes its copy and its socket end, so CMD never holds the listener
//!    (it could otherwise answer its own notifications).
//!
//! The notifier answers every denial notification with error -EPERM, and
//! exits when the listener reports POLLHUP (no filtered process left).
//! With `--allow-exec`, execve/execveat are notified too: those are
//! answered SECCOMP_USER_NOTIF_FLAG_CONTINUE after the look described in
//! [`crate::execwatch`] (Landlock enforces; the notifier only reports). If it is killed, the kernel answers
//! the notify returns with ENOSYS: still denied, but the alert is lost.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{BorrowedFd, IntoRawFd, RawFd};

use sbx_core::guardian::{Ending, Guardian, Watch};
use seccompiler::BpfProgram;

/// SECCOMP_RET_USER_NOTIF.
pub const RET_USER_NOTIF: u32 = 0x7fc0_0000;
/// SECCOMP_RET_ERRNO | EPERM.
pub const RET_EPERM: u32 = 0x0005_0000 | libc::EPERM as u32;
const BPF_RET_K: u16 = 0x06;

/// The filter whose EPERM answers become notifications.
pub const NOTIFY_FILTER: &str = "0-default-eperm";

/// Alerts written at once before the rate limit applies.
pub const BURST: u32 = 50;
/// Alerts per second after the burst.
pub const PER_SECOND: u32 = 5;

const SECCOMP_FILTER_FLAG_NEW_LISTENER: libc::c_ulong = 1 << 3;
const SECCOMP_FILTER_FLAG_TSYNC_ESRCH: libc::c_ulong = 1 << 4;

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct SeccompData {
    nr: i32,
    arch: u32,
    ip: u64,
    args: [u64; 6],
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct Notif {
    id: u64,
    pid: u32,
    flags: u32,
    data: SeccompData,
}

#[repr(C)]
#[derive(Default)]
struct NotifResp {
    id: u64,
    val: i64,
    error: i32,
    flags: u32,
}

// _IOWR('!', 0, struct seccomp_notif) and _IOWR('!', 1, struct seccomp_notif_resp).
const IOC_NOTIF_RECV: libc::c_ulong = 0xc000_0000 | ((80 << 16) as libc::c_ulong) | 0x2100;
const IOC_NOTIF_SEND: libc::c_ulong = 0xc000_0000 | ((24 << 16) as libc::c_ulong) | 0x2101;
// _IOW('!', 2, __u64).
const IOC_NOTIF_ID_VALID: libc::c_ulong = 0x4000_0000 | ((8 << 16) as libc::c_ulong) | 0x2102;
// _IOW('!', 4, __u64).
const IOC_NOTIF_SET_FLAGS: libc::c_ulong = 0x4000_0000 | ((8 << 16) as libc::c_ulong) | 0x2104;
/// SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP.
const FD_SYNC_WAKE_UP: u64 = 1;
/// SECCOMP_USER_NOTIF_FLAG_CONTINUE.
const FLAG_CONTINUE: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("socketpair for the notifier")]
    Socket(#[source] io::Error),
    #[error("fork of the notifier")]
    Fork(#[source] io::Error),
    #[error("passing the listener fd to the notifier")]
    Pass(#[source] sbx_core::passfd::PassFdError),
}

/// `--deny` with the default action: its rules join the notify filter (a
/// second filter cannot have a listener of its own, and its EPERM would
/// outrank the notification), so that they are alerted too. Not when a
/// `--deny` name is answered by another ERRNO filter (e.g. clone3's
/// ENOSYS), where the merge would change the answer: `3-deny` then stays
/// a silent EPERM filter.
pub fn merge_deny(
    doc: &crate::model::Document,
    nf: &str,
    mut progs: Vec<(String, BpfProgram)>,
) -> Result<Vec<(String, BpfProgram)>, crate::compile::CompileError> {
    if !deny_mergeable(doc, nf) {
        return Ok(progs);
    }
    let (Some(deny), Some(target)) = (doc.get(DENY_FILTER), doc.get(nf)) else {
        return Ok(progs);
    };
    let mut merged = target.clone();
    merged
        .rules
        .retain(|r| !deny.rules.iter().any(|d| d.syscall == r.syscall));
    merged.rules.extend(deny.rules.iter().cloned());
    let mut bpf = crate::compile::filter_bpf(nf, &merged)?;
    if bpf.len() + crate::compile::prelude().len() > 4096 {
        return Ok(progs);
    }
    let Some(i) = progs.iter().position(|(n, _)| n == nf) else {
        return Ok(progs);
    };
    if i == 0 {
        let mut p = crate::compile::prelude();
        p.append(&mut bpf);
        bpf = p;
    }
    progs[i].1 = bpf;
    progs.retain(|(n, _)| n != DENY_FILTER);
    Ok(progs)
}

/// Whether `--deny`'s filter joins the notify filter `nf` (see
/// [`merge_deny`]).
pub fn deny_mergeable(doc: &crate::model::Document, nf: &str) -> bool {
    use crate::model::Action;
    let eperm = Action::Errno(libc::EPERM as u32);
    let (Some(deny), Some(target)) = (doc.get(DENY_FILTER), doc.get(nf)) else {
        return false;
    };
    if deny.match_action != eperm || target.match_action != eperm {
        return false;
    }
    !doc.iter().any(|(name, f)| {
        name != DENY_FILTER
            && name != nf
            && f.is_denylist()
            && f.rules
                .iter()
                .any(|r| deny.rules.iter().any(|d| d.syscall == r.syscall))
    })
}

/// The filter `--deny` makes.
pub const DENY_FILTER: &str = "3-deny";

/// Rewrites the EPERM returns of `prog` into USER_NOTIF; true if any.
pub fn rewrite(prog: &mut BpfProgram) -> bool {
    let mut any = false;
    for i in prog.iter_mut() {
        if i.code == BPF_RET_K && i.k == RET_EPERM {
            i.k = RET_USER_NOTIF;
            any = true;
        }
    }
    any
}

/// Installs `prog` with a new listener; returns the listener fd.
pub fn install_with_listener(prog: &BpfProgram) -> io::Result<RawFd> {
    #[repr(C)]
    struct SockFprog {
        len: libc::c_ushort,
        filter: *const seccompiler::sock_filter,
    }
    let fprog = SockFprog {
        len: prog.len() as libc::c_ushort,
        filter: prog.as_ptr(),
    };
    // SAFETY: fprog and the program it points at live on this frame for the whole call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_TSYNC
                | SECCOMP_FILTER_FLAG_TSYNC_ESRCH
                | SECCOMP_FILTER_FLAG_NEW_LISTENER,
            std::ptr::from_ref::<SockFprog>(&fprog),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc as RawFd)
}

/// Signals and pidfds the command could aim at the notifier (its pid is
/// in the command's PID namespace): these return USER_NOTIF when they
/// target it, and the notifier answers EPERM with a `notifier_attacked`
/// alert. kill(-1) (every process the caller may signal) is one of them.
const GUARDED_BY_PID: &[i64] = &[
    libc::SYS_tkill,
    libc::SYS_tgkill,
    libc::SYS_rt_tgsigqueueinfo,
    libc::SYS_pidfd_open,
];
const GUARDED_KILL: &[i64] = &[libc::SYS_kill, libc::SYS_rt_sigqueueinfo];

fn guarded(nr: u32) -> bool {
    GUARDED_BY_PID
        .iter()
        .chain(GUARDED_KILL)
        .any(|n| *n as u32 == nr)
}

/// pidfd_send_signal: always to the notifier, which looks at what the
/// pidfd (or /proc/PID directory fd) refers to in a copy of it
/// (pidfd_getfd), refuses it when it is the notifier or its watcher, and
/// otherwise sends the signal itself through that copy, so the caller
/// cannot swap the fd between the look and the send.
pub const NR_PIDFD_SEND_SIGNAL: u32 = libc::SYS_pidfd_send_signal as u32;

/// The BPF block that sends signals and pidfd_open aimed at one of
/// `pids` (the notifier first, the leader of its own process group: also
/// kill(-pid), and kill(-1)) and every pidfd_send_signal to the notifier;
/// anything else falls through with the accumulator holding the syscall
/// number, as after the prelude.
pub fn guard_block(pids: &[i32]) -> Vec<seccompiler::sock_filter> {
    use seccompiler::sock_filter;
    const LD: u16 = 0x20;
    const JEQ: u16 = 0x15;
    const JA: u16 = 0x05;
    let i = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    let n_kill = GUARDED_KILL.len();
    let n_pid = GUARDED_BY_PID.len();
    let np = pids.len();
    // Layout: [ld arch, jeq arch, ld nr, kill jeqs, pid jeqs,
    //  jeq pidfd_send_signal, ja END,
    //  KILLCHK: ld arg0, jeq -1, jeq -pid..., PCHK: ld arg0, jeq pid...,
    //  ja END, NOTIFY: ret notif, END: ld nr]
    let killchk = 3 + n_kill + n_pid + 2;
    let pchk = killchk + 2 + np;
    let notify = pchk + 1 + np + 1;
    let end = notify + 1;
    // Jump offsets are relative to the next instruction.
    let rel = |from: usize, to: usize| (to - from - 1) as u8;
    let mut v = vec![
        i(LD, 0, 0, 4),
        i(JEQ, 0, rel(1, end), crate::compile::AUDIT_ARCH),
        i(LD, 0, 0, 0),
    ];
    for nr in GUARDED_KILL {
        let at = v.len();
        v.push(i(JEQ, rel(at, killchk), 0, *nr as u32));
    }
    for nr in GUARDED_BY_PID {
        let at = v.len();
        v.push(i(JEQ, rel(at, pchk), 0, *nr as u32));
    }
    let at = v.len();
    v.push(i(JEQ, rel(at, notify), 0, NR_PIDFD_SEND_SIGNAL));
    let at = v.len();
    v.push(i(JA, 0, 0, u32::from(rel(at, end))));
    debug_assert_eq!(v.len(), killchk);
    v.push(i(LD, 0, 0, 16));
    let at = v.len();
    v.push(i(JEQ, rel(at, notify), 0, u32::MAX));
    for p in pids {
        let at = v.len();
        v.push(i(JEQ, rel(at, notify), 0, (*p as u32).wrapping_neg()));
    }
    debug_assert_eq!(v.len(), pchk);
    v.push(i(LD, 0, 0, 16));
    for p in pids {
        let at = v.len();
        v.push(i(JEQ, rel(at, notify), 0, *p as u32));
    }
    let at = v.len();
    v.push(i(JA, 0, 0, u32::from(rel(at, end))));
    debug_assert_eq!(v.len(), notify);
    v.push(i(BPF_RET_K, 0, 0, RET_USER_NOTIF));
    v.push(i(LD, 0, 0, 0));
    v
}

/// Puts [`guard_block`] into the listener's filter, after the prelude.
pub fn insert_guard(prog: &mut BpfProgram, pids: &[i32]) {
    let pre = crate::compile::prelude();
    let at = if prog.starts_with(&pre) { pre.len() } else { 0 };
    let tail = prog.split_off(at);
    prog.extend(guard_block(pids));
    prog.extend(tail);
}

/// The notifier, forked and waiting for its listener fd.
pub struct Notifier {
    sock: RawFd,
    pub pid: i32,
    /// The notifier's watcher (see [`watcher_main`]).
    pub watcher: i32,
}

impl Notifier {
    /// Double-forks the notifier. `names`: the syscalls the filters name,
    /// numbered by the notifier for its alerts; `audit_fd` is the only
    /// other fd it keeps.
    pub fn spawn(
        names: std::collections::BTreeSet<String>,
        audit_fd: Option<RawFd>,
        exec: Option<crate::execwatch::ExecWatch>,
    ) -> Result<Self, NotifyError> {
        let (ours, theirs) = sbx_core::passfd::seqpacket_pair().map_err(NotifyError::Socket)?;
        // Raw from here: both processes close them by hand across the forks.
        let (ours, theirs) = (ours.into_raw_fd(), theirs.into_raw_fd());
        // SAFETY: getpid cannot fail.
        let me = unsafe { libc::getpid() };
        // SAFETY: sbx-seccomp is one thread here; the middle child only forks and _exits.
        let mid = unsafe { libc::fork() };
        if mid < 0 {
            return Err(NotifyError::Fork(io::Error::last_os_error()));
        }
        if mid == 0 {
            // The middle process: fork the notifier and exit (the notifier
            // reports its pid and its watcher's itself).
            // SAFETY: the middle process has one thread (a fork of a single-threaded one); the
            // notifier never returns.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                notifier_main(me, theirs, ours, audit_fd, names, exec);
            }
            // SAFETY: ends the middle process without running the parent's destructors.
            unsafe { libc::_exit(0) }
        }
        // SAFETY: `theirs` is ours and not used after; `mid` is our own child, reaped once.
        unsafe {
            libc::close(theirs);
            libc::waitpid(mid, std::ptr::null_mut(), 0);
        }
        let mut b = [0u8; 8];
        // SAFETY: `ours` is an open socket; b is a live 8-byte buffer.
        let n = unsafe { libc::read(ours, b.as_mut_ptr().cast(), b.len()) };
        let pid = i32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
        let watcher = i32::from_ne_bytes([b[4], b[5], b[6], b[7]]);
        if n != 8 || pid <= 0 || watcher <= 0 {
            // SAFETY: `ours` is open and owned here; closed once before returning.
            unsafe { libc::close(ours) };
            return Err(NotifyError::Fork(io::Error::other(
                "the notifier did not start",
            )));
        }
        Ok(Notifier {
            sock: ours,
            pid,
            watcher,
        })
    }

    /// Hands `listener` to the notifier and closes it and the socket here.
    pub fn pass(mut self, listener: RawFd) -> Result<(), NotifyError> {
        // One zero byte with the fd: a message of the fd alone would read
        // as end of stream.
        // SAFETY: both fds are open and ours until closed just below.
        let r = unsafe {
            sbx_core::passfd::send_fds(
                BorrowedFd::borrow_raw(self.sock),
                &[0],
                &[BorrowedFd::borrow_raw(listener)],
            )
        };
        // SAFETY: both fds are ours (passed in / kept raw), closed once here and never used
        // again (sock is reset below).
        unsafe {
            libc::close(listener);
            libc::close(self.sock);
        }
        self.sock = -1;
        r.map(drop).map_err(NotifyError::Pass)
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        // Without a listener (pass not called) the notifier sees EOF and exits.
        if self.sock >= 0 {
            // SAFETY: sock is still ours (pass resets it to -1 after closing it).
            unsafe { libc::close(self.sock) };
        }
    }
}

/// Token bucket: `BURST` alerts, then `PER_SECOND`. The first refusal
/// is itself an alert (`alert_budget_exhausted`, once).
pub struct RateLimit {
    tokens: f64,
    last: std::time::Instant,
    pub suppressed: u64,
    event: &'static str,
}

impl Default for RateLimit {
    fn default() -> Self {
        Self::for_event("syscall_denied")
    }
}

impl RateLimit {
    /// A bucket for the alerts named `event`.
    pub fn for_event(event: &'static str) -> Self {
        RateLimit {
            tokens: f64::from(BURST),
            last: std::time::Instant::now(),
            suppressed: 0,
            event,
        }
    }

    pub fn allow(&mut self) -> bool {
        let now = std::time::Instant::now();
        let dt = now.duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + dt * f64::from(PER_SECOND)).min(f64::from(BURST));
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            if self.suppressed == 0 {
                sbx_core::audit::budget_exhausted(
                    self.event,
                    serde_json::json!({ "burst": BURST, "per_second": PER_SECOND }),
                );
            }
            self.suppressed += 1;
            false
        }
    }
}

/// The first argument worth logging, by syscall.
fn detail(name: &str, args: &[u64; 6]) -> serde_json::Value {
    match name {
        "clone" | "unshare" => serde_json::json!({ "flags": format!("{:#x}", args[0]) }),
        "setns" => serde_json::json!({ "nstype": format!("{:#x}", args[1]) }),
        "ioctl" => serde_json::json!({ "request": format!("{:#x}", args[1] as u32) }),
        "personality" => serde_json::json!({ "persona": format!("{:#x}", args[0] as u32) }),
        "ptrace" => serde_json::json!({ "request": args[0], "target": args[1] }),
        "bpf" | "keyctl" => serde_json::json!({ "cmd": args[0] }),
        _ => serde_json::json!({ "arg0": format!("{:#x}", args[0]) }),
    }
}

fn notifier_main(
    cmd_pid: i32,
    sock: RawFd,
    other: RawFd,
    audit_fd: Option<RawFd>,
    names: std::collections::BTreeSet<String>,
    exec: Option<crate::execwatch::ExecWatch>,
) -> ! {
    // SAFETY: `other` is our copy of the peer's socket end; the rest act on this process only
    // (NUL-ended name).
    unsafe {
        libc::close(other);
        libc::setsid();
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        libc::prctl(libc::PR_SET_NAME, c"sbx-seccomp-ntf".as_ptr(), 0, 0, 0);
    }
    // Without an audit log, alerts still reach the caller's stderr: keep a
    // copy of it (closed when the notifier exits, with the last filtered
    // process); it is closed as soon as CMD itself exits, so a reader of
    // CMD's stderr sees EOF then even when CMD left filtered processes.
    // With the in-memory log of a run without --audit-log, the tool that
    // owns it prints the summary at the end; only when that is
    // sbx-seccomp itself (run first, it becomes CMD) do alerts go to
    // stderr as they happen.
    let live = sbx_core::audit::get().is_none_or(|a| a.alerts_live());
    let (err, cmd_pidfd) = if audit_fd.is_none() || live {
        // The grandparent: sbx-seccomp, which becomes CMD. Watched from
        // before it execs (it waits for us to receive the listener).
        // SAFETY: plain syscalls; the fds are ours.
        let cmd = unsafe { libc::syscall(libc::SYS_pidfd_open, cmd_pid, 0) } as RawFd;
        // SAFETY: fcntl on fd 2 only duplicates it; no memory is involved.
        let err = unsafe { libc::fcntl(2, libc::F_DUPFD_CLOEXEC, 3) };
        if cmd < 0 {
            // Cannot tell when CMD exits: keep stderr out of it.
            // SAFETY: err was just duplicated by us and is not used after.
            unsafe { libc::close(err) };
            (-1, -1)
        } else {
            (err, cmd)
        }
    } else {
        (-1, -1)
    };
    STDERR.store(err, std::sync::atomic::Ordering::Relaxed);
    CMD_PIDFD.store(cmd_pidfd, std::sync::atomic::Ordering::Relaxed);
    // Nothing else of CMD's: stdio to /dev/null (a reader of CMD's pipes
    // must see EOF when CMD exits), every other fd closed.
    sbx_core::fds::stdio_to_dev_null();
    let keep: Vec<RawFd> = [
        Some(sock),
        audit_fd,
        (err >= 0).then_some(err),
        (cmd_pidfd >= 0).then_some(cmd_pidfd),
    ]
    .into_iter()
    .flatten()
    .collect();
    sbx_core::fds::close_all_except(&keep);
    // The watcher: a child that outlives this process when it is killed,
    // and then alerts and kills CMD (a run whose refusals would silently
    // become ENOSYS ends instead). Both pids are guarded by the filter.
    // SAFETY: plain syscalls on fds this process owns.
    let me = unsafe { libc::getpid() };
    // SAFETY: plain syscall with integer arguments; the new fd is ours.
    let kill_cmd = unsafe { libc::syscall(libc::SYS_pidfd_open, cmd_pid, 0) } as RawFd;
    KILL_CMD.store(kill_cmd, std::sync::atomic::Ordering::Relaxed);
    // SAFETY: the notifier is one thread (a fork of a forked child); in
    // the watcher, `sock` is its own copy, closed once and not used after.
    let watcher = unsafe {
        Guardian::spawn(|w| {
            // The notifier's socket is not the watcher's.
            libc::close(sock);
            watcher_main(me, w)
        })
    };
    let Ok(watcher) = watcher else {
        // No watcher, no run: sbx-seccomp reads a short message and fails.
        // SAFETY: ends the notifier without running destructors of the forked state.
        unsafe { libc::_exit(1) }
    };
    let watcher_pid = watcher.pid();
    *WATCHER_GUARD.lock().unwrap_or_else(|e| e.into_inner()) = Some(watcher);
    let watcher = watcher_pid;
    WATCHER.store(watcher, std::sync::atomic::Ordering::Relaxed);
    // SAFETY: plain syscall with integer arguments; the new fd is ours.
    let wfd = unsafe { libc::syscall(libc::SYS_pidfd_open, watcher, 0) } as RawFd;
    WATCHER_PIDFD.store(wfd, std::sync::atomic::Ordering::Relaxed);
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&me.to_ne_bytes());
    b[4..].copy_from_slice(&watcher.to_ne_bytes());
    // SAFETY: one write of a live buffer.
    unsafe { libc::write(sock, b.as_ptr().cast(), b.len()) };
    // EOF (sbx-seccomp dropped the Notifier without a listener) or any
    // error: nothing to serve.
    // SAFETY: `sock` is open until closed below.
    let got = sbx_core::passfd::recv_fds(unsafe { BorrowedFd::borrow_raw(sock) }, &mut [0u8; 1]);
    let Some(listener) = got.ok().flatten().and_then(|m| m.fds.into_iter().next()) else {
        clean_exit()
    };
    let listener = listener.into_raw_fd();
    // SAFETY: sock is ours and not used after this.
    unsafe { libc::close(sock) };
    let names: BTreeMap<u32, String> = names
        .into_iter()
        .filter_map(|n| Some((crate::compile::syscall_nr(&n)?, n)))
        .collect();
    serve(listener, &names, exec);
    clean_exit()
}

/// The notifier's side of its watcher (a guardian), released at a clean
/// exit.
static WATCHER_GUARD: std::sync::Mutex<Option<Guardian>> = std::sync::Mutex::new(None);
/// The watcher's pid and a pidfd of it.
static WATCHER: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);
static WATCHER_PIDFD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);
/// A pidfd of CMD, to kill it when the notifier or its watcher is killed.
static KILL_CMD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// The notifier ends normally: releases the watcher, then exits.
fn clean_exit() -> ! {
    if let Some(g) = WATCHER_GUARD
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
    {
        g.release();
    }
    // SAFETY: ends the notifier without running destructors of the forked state.
    unsafe { libc::_exit(0) }
}

/// Kills CMD (fail closed) and says why; `what` died.
fn fail_closed(what: &str, pid: i32) {
    let k = KILL_CMD.load(std::sync::atomic::Ordering::Relaxed);
    // CMD still running? (its pidfd is readable once it has exited)
    let alive = k >= 0 && {
        let mut p = libc::pollfd {
            fd: k,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll of one live pollfd, no wait.
        unsafe { libc::poll(&mut p, 1, 0) == 0 }
    };
    record(
        "seccomp_notifier_died",
        serde_json::json!({
            "what": what,
            "notifier_pid": pid,
            "effect": "later seccomp refusals would fail with ENOSYS, unlogged",
            "action": if alive { "command killed (SIGKILL)" } else { "command had exited" },
        }),
    );
    if alive {
        // SAFETY: a signal through our own pidfd.
        unsafe { libc::syscall(libc::SYS_pidfd_send_signal, k, libc::SIGKILL, 0, 0) };
    }
}

/// The watcher (a guardian of the notifier): when the notifier is gone
/// without releasing it (killed), alerts and kills CMD. Meanwhile, once
/// CMD exits, it lets go of CMD's stderr.
fn watcher_main(notifier: i32, mut w: Watch) -> i32 {
    // SAFETY: prctl on ourselves.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"sbx-seccomp-wd".as_ptr(), 0, 0, 0) };
    loop {
        match w.check() {
            Some(Ending::Released) => return 0,
            Some(Ending::OwnerGone(_)) => break,
            None => {}
        }
        let mut cmd = [libc::pollfd {
            fd: CMD_PIDFD.load(std::sync::atomic::Ordering::Relaxed),
            events: libc::POLLIN,
            revents: 0,
        }];
        // A negative fd is ignored by poll.
        w.block(&mut cmd);
        if cmd[0].revents != 0 {
            // CMD exited: its stderr is not held open by us either.
            let err = STDERR.swap(-1, std::sync::atomic::Ordering::Relaxed);
            let pfd = CMD_PIDFD.swap(-1, std::sync::atomic::Ordering::Relaxed);
            // SAFETY: the fds were swapped out of the statics (-1 left there), so each is
            // closed once (close(-1) is a harmless EBADF).
            unsafe {
                libc::close(err);
                libc::close(pfd);
            }
        }
    }
    fail_closed("notifier", notifier);
    0
}

/// The caller's stderr, kept by the notifier when there is no audit log.
static STDERR: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);
/// A pidfd of CMD (the process that was sbx-seccomp), when STDERR is kept.
static CMD_PIDFD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

pub(crate) fn record(event: &str, fields: serde_json::Value) {
    if let Some(a) = sbx_core::audit::get()
        && a.raw_fd().is_some()
    {
        a.record(event, sbx_core::Severity::Alert, fields.clone());
    }
    let err = STDERR.load(std::sync::atomic::Ordering::Relaxed);
    if err < 0 {
        return;
    }
    let subject = match &fields {
        serde_json::Value::Object(m) => sbx_core::violations::subject(m),
        _ => String::new(),
    };
    let line = format!("sbx-seccomp: ALERT {event} {subject}\n");
    // SAFETY: one write of a live buffer to our own fd.
    unsafe { libc::write(err, line.as_ptr().cast(), line.len()) };
}

/// The pid a pidfd or a /proc/PID directory fd (of this process) refers
/// to, as this process's /proc sees it.
fn fd_target(fd: RawFd) -> Option<i32> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
    if let Some(l) = info.lines().find_map(|l| l.strip_prefix("Pid:")) {
        return l.trim().parse().ok();
    }
    let p = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    let s = p.to_str()?;
    let rest = s.strip_prefix("/proc/")?;
    rest.parse().ok()
}

/// The caller's real, effective, saved and file-system uids and gids
/// equal ours: what the kernel checks for a signal is then what it
/// checks for the notifier sending it.
fn same_creds(pid: u32) -> bool {
    let Ok(st) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    // SAFETY: plain getters.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let all = |key: &str, want: u32| {
        st.lines()
            .find_map(|l| l.strip_prefix(key))
            .is_some_and(|v| v.split_whitespace().all(|x| x.parse() == Ok(want)))
    };
    all("Uid:", uid) && all("Gid:", gid)
}

/// pidfd_send_signal(fd, sig, info, flags) of the caller: the fd is copied
/// out of the caller (pidfd_getfd), so what is checked is what is used; a
/// signal aimed at the notifier or its watcher is refused EPERM with a
/// `notifier_attacked` alert, anything else is sent by the notifier
/// through the copy and its result returned.
fn pidfd_signal(
    listener: RawFd,
    n: &Notif,
    names: &BTreeMap<u32, String>,
    limit: &mut RateLimit,
) -> NotifResp {
    let answer = |val: i64, errno: i32| NotifResp {
        id: n.id,
        val,
        error: -errno,
        flags: 0,
    };
    let [fd, sig, info, flags, ..] = n.data.args;
    // SAFETY: plain syscalls; every fd opened here is closed below.
    let caller = unsafe { libc::syscall(libc::SYS_pidfd_open, n.pid as i32, 0) } as RawFd;
    if caller < 0 {
        return answer(0, libc::ESRCH);
    }
    // SAFETY: caller is a pidfd we opened; pidfd_getfd only copies an fd into this process.
    let copy = unsafe { libc::syscall(libc::SYS_pidfd_getfd, caller, fd as i32, 0) } as RawFd;
    let err = io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EBADF);
    // SAFETY: caller is our pidfd, not used after.
    unsafe { libc::close(caller) };
    if copy < 0 {
        return answer(
            0,
            if err == libc::EPERM {
                libc::EPERM
            } else {
                libc::EBADF
            },
        );
    }
    // SAFETY: copy is the fd pidfd_getfd gave us; each path calls close once.
    let close = || unsafe {
        libc::close(copy);
    };
    // SAFETY: getpid cannot fail.
    let me = unsafe { libc::getpid() };
    let watcher = WATCHER.load(std::sync::atomic::Ordering::Relaxed);
    let target = fd_target(copy);
    if target.is_some_and(|t| t == me || t == watcher) {
        close();
        if limit.allow() {
            let nr = NR_PIDFD_SEND_SIGNAL;
            record(
                "notifier_attacked",
                serde_json::json!({
                    "syscall": names.get(&nr).cloned().unwrap_or_else(|| "pidfd_send_signal".into()),
                    "nr": nr,
                    "target": target,
                    "signal": sig as i32,
                    "caller_pid": n.pid,
                    "errno": "EPERM",
                }),
            );
        }
        return answer(0, libc::EPERM);
    }
    if !same_creds(n.pid) {
        // The caller changed its ids: the notifier would signal with
        // other rights than the caller's. Refused.
        close();
        return answer(0, libc::EPERM);
    }
    // The siginfo, when given, from the caller's memory.
    let mut si = [0u8; 128];
    let info_ptr = if info == 0 {
        std::ptr::null()
    } else {
        let local = libc::iovec {
            iov_base: si.as_mut_ptr().cast(),
            iov_len: si.len(),
        };
        let remote = libc::iovec {
            iov_base: info as *mut libc::c_void,
            iov_len: si.len(),
        };
        // SAFETY: local is our 128-byte buffer; the remote side is only read by the kernel (a
        // bad address is EFAULT, checked).
        if unsafe { libc::process_vm_readv(n.pid as i32, &local, 1, &remote, 1, 0) } != 128 {
            close();
            return answer(0, libc::EFAULT);
        }
        si.as_ptr()
    };
    // Still the same call (the caller may have been killed meanwhile).
    let id = n.id;
    // SAFETY: listener is the open notification fd; id lives on this frame for the call.
    if unsafe {
        libc::ioctl(
            listener,
            IOC_NOTIF_ID_VALID as _,
            std::ptr::from_ref::<u64>(&id),
        )
    } != 0
    {
        close();
        return answer(0, libc::ESRCH);
    }
    // SAFETY: copy is our fd; info_ptr is null or our 128-byte siginfo buffer, alive for the
    // call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            copy,
            sig as i32,
            info_ptr,
            flags as u32,
        )
    };
    let e = io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EINVAL);
    close();
    if r < 0 { answer(0, e) } else { answer(r, 0) }
}

fn serve(
    listener: RawFd,
    names: &BTreeMap<u32, String>,
    mut exec: Option<crate::execwatch::ExecWatch>,
) {
    let mut limit = RateLimit::default();
    let mut total: u64 = 0;
    // Linux 6.6+: the caller hands the CPU straight to the notifier and
    // back (SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP), a cheaper round trip;
    // older kernels refuse it (EINVAL) and nothing changes.
    let flags: u64 = FD_SYNC_WAKE_UP;
    // SAFETY: listener is the open notification fd; flags lives on this frame for the call.
    unsafe {
        libc::ioctl(
            listener,
            IOC_NOTIF_SET_FLAGS as _,
            std::ptr::from_ref::<u64>(&flags),
        )
    };
    loop {
        let mut fds = [
            libc::pollfd {
                fd: listener,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: CMD_PIDFD.load(std::sync::atomic::Ordering::Relaxed),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: WATCHER_PIDFD.load(std::sync::atomic::Ordering::Relaxed),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: poll over a live array (a negative fd is ignored).
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 3, -1) };
        if fds[2].revents != 0 {
            // The watcher was killed (it never exits before us otherwise).
            let w = WATCHER_PIDFD.swap(-1, std::sync::atomic::Ordering::Relaxed);
            // SAFETY: swapped out of the static (-1 left there): closed once.
            unsafe { libc::close(w) };
            fail_closed(
                "watcher",
                WATCHER.load(std::sync::atomic::Ordering::Relaxed),
            );
        }
        if fds[1].revents != 0 {
            // CMD exited: give its stderr back (EOF for its reader).
            let err = STDERR.swap(-1, std::sync::atomic::Ordering::Relaxed);
            let pfd = CMD_PIDFD.swap(-1, std::sync::atomic::Ordering::Relaxed);
            // SAFETY: swapped out of the statics (-1 left there): each closed once.
            unsafe {
                libc::close(err);
                libc::close(pfd);
            }
        }
        let p = fds[0];
        if r < 0 {
            if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            break;
        }
        if p.revents & libc::POLLIN != 0 {
            let mut n = Notif::default();
            // SAFETY: listener is the open notification fd; n is a live, correctly sized
            // seccomp_notif.
            if unsafe {
                libc::ioctl(
                    listener,
                    IOC_NOTIF_RECV as _,
                    std::ptr::from_mut::<Notif>(&mut n),
                )
            } != 0
            {
                // ENOENT: the caller was interrupted; EINTR: retry.
                continue;
            }
            let nr = n.data.nr as u32;
            if let Some(w) = exec.as_mut()
                && n.data.arch == crate::compile::AUDIT_ARCH
                && nr == crate::execwatch::NR_MEMFD_CREATE
            {
                let id = n.id;
                let answer = w.memfd(listener, id, n.pid, &n.data.args, || {
                    // SAFETY: listener is the open notification fd; id lives on this frame for
                    // the call.
                    let r = unsafe {
                        libc::ioctl(
                            listener,
                            IOC_NOTIF_ID_VALID as _,
                            std::ptr::from_ref::<u64>(&id),
                        )
                    };
                    r == 0
                });
                let resp = match answer {
                    crate::execwatch::MemfdAnswer::Sent => continue,
                    crate::execwatch::MemfdAnswer::Errno(e) => NotifResp {
                        id,
                        val: 0,
                        error: -e,
                        flags: 0,
                    },
                    crate::execwatch::MemfdAnswer::Continue => NotifResp {
                        id,
                        val: 0,
                        error: 0,
                        flags: FLAG_CONTINUE,
                    },
                };
                // SAFETY: listener is the open notification fd; resp is a live
                // seccomp_notif_resp.
                unsafe {
                    libc::ioctl(
                        listener,
                        IOC_NOTIF_SEND as _,
                        std::ptr::from_ref::<NotifResp>(&resp),
                    )
                };
                continue;
            }
            if let Some(w) = exec.as_mut()
                && n.data.arch == crate::compile::AUDIT_ARCH
                && (nr == crate::execwatch::NR_EXECVE || nr == crate::execwatch::NR_EXECVEAT)
            {
                let id = n.id;
                let refuse = w.handle(n.pid, nr, &n.data.args, || {
                    // SAFETY: listener is the open notification fd; id lives on this frame for
                    // the call.
                    let r = unsafe {
                        libc::ioctl(
                            listener,
                            IOC_NOTIF_ID_VALID as _,
                            std::ptr::from_ref::<u64>(&id),
                        )
                    };
                    r == 0
                });
                // Landlock decides: the call goes on as if not filtered
                // (but for a memfd, which Landlock does not cover).
                let resp = match refuse {
                    Some(errno) => NotifResp {
                        id: n.id,
                        val: 0,
                        error: -errno,
                        flags: 0,
                    },
                    None => NotifResp {
                        id: n.id,
                        val: 0,
                        error: 0,
                        flags: FLAG_CONTINUE,
                    },
                };
                // SAFETY: listener is the open notification fd; resp is a live
                // seccomp_notif_resp.
                unsafe {
                    libc::ioctl(
                        listener,
                        IOC_NOTIF_SEND as _,
                        std::ptr::from_ref::<NotifResp>(&resp),
                    )
                };
                continue;
            }
            if n.data.arch == crate::compile::AUDIT_ARCH && nr == NR_PIDFD_SEND_SIGNAL {
                let resp = pidfd_signal(listener, &n, names, &mut limit);
                // SAFETY: listener is the open notification fd; resp is a live
                // seccomp_notif_resp.
                unsafe {
                    libc::ioctl(
                        listener,
                        IOC_NOTIF_SEND as _,
                        std::ptr::from_ref::<NotifResp>(&resp),
                    )
                };
                continue;
            }
            if n.data.arch == crate::compile::AUDIT_ARCH && guarded(nr) {
                // The command aimed a signal or a pidfd at this process:
                // refused (the BPF matched the target), always an alert.
                let name = names.get(&nr).cloned().unwrap_or_else(|| nr.to_string());
                if limit.allow() {
                    record(
                        "notifier_attacked",
                        serde_json::json!({
                            "syscall": name,
                            "nr": nr,
                            "target": n.data.args[0] as i32,
                            "caller_pid": n.pid,
                            "errno": "EPERM",
                        }),
                    );
                }
                let resp = NotifResp {
                    id: n.id,
                    val: 0,
                    error: -libc::EPERM,
                    flags: 0,
                };
                // SAFETY: listener is the open notification fd; resp is a live
                // seccomp_notif_resp.
                unsafe {
                    libc::ioctl(
                        listener,
                        IOC_NOTIF_SEND as _,
                        std::ptr::from_ref::<NotifResp>(&resp),
                    )
                };
                continue;
            }
            total += 1;
            if limit.allow() {
                let name = names.get(&nr).cloned().unwrap_or_else(|| nr.to_string());
                record(
                    "syscall_denied",
                    serde_json::json!({
                        "syscall": name,
                        "nr": nr,
                        "caller_pid": n.pid,
                        "errno": "EPERM",
                        "args": detail(&name, &n.data.args),
                    }),
                );
            }
            // The alert is written before the caller sees EPERM.
            let resp = NotifResp {
                id: n.id,
                val: 0,
                error: -libc::EPERM,
                flags: 0,
            };
            // SAFETY: listener is the open notification fd; resp is a live seccomp_notif_resp.
            unsafe {
                libc::ioctl(
                    listener,
                    IOC_NOTIF_SEND as _,
                    std::ptr::from_ref::<NotifResp>(&resp),
                )
            };
            continue;
        }
        if p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
            break;
        }
    }
    if let Some(w) = &exec {
        w.finish();
    }
    if limit.suppressed > 0 {
        record(
            "syscall_denied_suppressed",
            serde_json::json!({
                "suppressed": limit.suppressed,
                "denied": total,
                "burst": BURST,
                "per_second": PER_SECOND,
            }),
        );
    }
}
