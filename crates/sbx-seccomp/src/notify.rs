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
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_TSYNC
                | SECCOMP_FILTER_FLAG_TSYNC_ESRCH
                | SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &fprog as *const SockFprog,
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

/// The BPF block that sends signals and pidfd_open aimed at `pid` (also
/// kill(-pid), its process group, and kill(-1)) to the notifier; anything
/// else falls through with the accumulator holding the syscall number, as
/// after the prelude.
pub fn guard_block(pid: i32) -> Vec<seccompiler::sock_filter> {
    use seccompiler::sock_filter;
    const LD: u16 = 0x20;
    const JEQ: u16 = 0x15;
    const JA: u16 = 0x05;
    let i = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    let n_kill = GUARDED_KILL.len();
    let n_pid = GUARDED_BY_PID.len();
    // Layout: [ld arch, jeq arch, ld nr, kill jeqs, pid jeqs, ja END,
    //  KILLCHK: ld arg0, jeq -1, jeq -pid, PCHK: ld arg0, jeq pid, ja END,
    //  NOTIFY: ret notif, END: ld nr]
    let killchk = 3 + n_kill + n_pid + 1;
    let pchk = killchk + 3;
    let notify = pchk + 3;
    let end = notify + 1;
    let mut v = vec![
        i(LD, 0, 0, 4),
        i(JEQ, 0, (end - 2) as u8, crate::compile::AUDIT_ARCH),
        i(LD, 0, 0, 0),
    ];
    for nr in GUARDED_KILL {
        let at = v.len();
        v.push(i(JEQ, (killchk - at - 1) as u8, 0, *nr as u32));
    }
    for nr in GUARDED_BY_PID {
        let at = v.len();
        v.push(i(JEQ, (pchk - at - 1) as u8, 0, *nr as u32));
    }
    let at = v.len();
    v.push(i(JA, 0, 0, (end - at - 1) as u32));
    debug_assert_eq!(v.len(), killchk);
    v.push(i(LD, 0, 0, 16));
    v.push(i(JEQ, (notify - killchk - 2) as u8, 0, u32::MAX));
    v.push(i(
        JEQ,
        (notify - killchk - 3) as u8,
        0,
        (pid as u32).wrapping_neg(),
    ));
    debug_assert_eq!(v.len(), pchk);
    v.push(i(LD, 0, 0, 16));
    v.push(i(JEQ, (notify - pchk - 2) as u8, 0, pid as u32));
    v.push(i(JA, 0, 0, (end - pchk - 3) as u32));
    debug_assert_eq!(v.len(), notify);
    v.push(i(BPF_RET_K, 0, 0, RET_USER_NOTIF));
    v.push(i(LD, 0, 0, 0));
    v
}

/// Puts [`guard_block`] into the listener's filter, after the prelude.
pub fn insert_guard(prog: &mut BpfProgram, pid: i32) {
    let pre = crate::compile::prelude();
    let at = if prog.starts_with(&pre) { pre.len() } else { 0 };
    let tail = prog.split_off(at);
    prog.extend(guard_block(pid));
    prog.extend(tail);
}

/// The notifier, forked and waiting for its listener fd.
pub struct Notifier {
    sock: RawFd,
    pub pid: i32,
}

impl Notifier {
    /// Double-forks the notifier. `names` maps syscall numbers to names for
    /// the alerts; `audit_fd` is the only other fd it keeps.
    pub fn spawn(
        names: BTreeMap<u32, String>,
        audit_fd: Option<RawFd>,
        exec: Option<crate::execwatch::ExecWatch>,
    ) -> Result<Self, NotifyError> {
        let (ours, theirs) = sbx_core::passfd::seqpacket_pair().map_err(NotifyError::Socket)?;
        // Raw from here: both processes close them by hand across the forks.
        let (ours, theirs) = (ours.into_raw_fd(), theirs.into_raw_fd());
        let mid = unsafe { libc::fork() };
        if mid < 0 {
            return Err(NotifyError::Fork(io::Error::last_os_error()));
        }
        if mid == 0 {
            // The middle process: fork the notifier, report its pid, exit.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                notifier_main(theirs, ours, audit_fd, names, exec);
            }
            let b = pid.to_ne_bytes();
            unsafe {
                libc::write(theirs, b.as_ptr().cast(), b.len());
                libc::_exit(0);
            }
        }
        unsafe {
            libc::close(theirs);
            libc::waitpid(mid, std::ptr::null_mut(), 0);
        }
        let mut b = [0u8; 4];
        let n = unsafe { libc::read(ours, b.as_mut_ptr().cast(), b.len()) };
        let pid = i32::from_ne_bytes(b);
        if n != 4 || pid <= 0 {
            unsafe { libc::close(ours) };
            return Err(NotifyError::Fork(io::Error::other(
                "the notifier did not start",
            )));
        }
        Ok(Notifier { sock: ours, pid })
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
            tokens: BURST as f64,
            last: std::time::Instant::now(),
            suppressed: 0,
            event,
        }
    }

    pub fn allow(&mut self) -> bool {
        let now = std::time::Instant::now();
        let dt = now.duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + dt * PER_SECOND as f64).min(BURST as f64);
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
    sock: RawFd,
    other: RawFd,
    audit_fd: Option<RawFd>,
    names: BTreeMap<u32, String>,
    exec: Option<crate::execwatch::ExecWatch>,
) -> ! {
    unsafe {
        libc::close(other);
        libc::setsid();
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        libc::prctl(libc::PR_SET_NAME, c"sbx-seccomp-ntf".as_ptr(), 0, 0, 0);
    }
    // Without an audit log, alerts still reach the caller's stderr: keep a
    // copy of it (closed when the notifier exits, with the last filtered
    // process).
    let err = if audit_fd.is_none() {
        // SAFETY: dup of our stderr, close-on-exec.
        unsafe { libc::fcntl(2, libc::F_DUPFD_CLOEXEC, 3) }
    } else {
        -1
    };
    STDERR.store(err, std::sync::atomic::Ordering::Relaxed);
    // Nothing else of CMD's: stdio to /dev/null (a reader of CMD's pipes
    // must see EOF when CMD exits), every other fd closed.
    sbx_core::fds::stdio_to_dev_null();
    let keep: Vec<RawFd> = [Some(sock), audit_fd, (err >= 0).then_some(err)]
        .into_iter()
        .flatten()
        .collect();
    sbx_core::fds::close_all_except(&keep);
    // EOF (sbx-seccomp dropped the Notifier without a listener) or any
    // error: nothing to serve.
    // SAFETY: `sock` is open until closed below.
    let got = sbx_core::passfd::recv_fds(unsafe { BorrowedFd::borrow_raw(sock) }, &mut [0u8; 1]);
    let Some(listener) = got.ok().flatten().and_then(|m| m.fds.into_iter().next()) else {
        unsafe { libc::_exit(0) }
    };
    let listener = listener.into_raw_fd();
    unsafe { libc::close(sock) };
    serve(listener, &names, exec);
    unsafe { libc::_exit(0) }
}

/// The caller's stderr, kept by the notifier when there is no audit log.
static STDERR: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

pub(crate) fn record(event: &str, fields: serde_json::Value) {
    if let Some(a) = sbx_core::audit::get()
        && a.raw_fd().is_some()
    {
        a.record(event, sbx_core::Severity::Alert, fields);
        return;
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
    unsafe { libc::ioctl(listener, IOC_NOTIF_SET_FLAGS as _, &flags as *const u64) };
    loop {
        let mut p = libc::pollfd {
            fd: listener,
            events: libc::POLLIN,
            revents: 0,
        };
        let r = unsafe { libc::poll(&mut p, 1, -1) };
        if r < 0 {
            if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            break;
        }
        if p.revents & libc::POLLIN != 0 {
            let mut n = Notif::default();
            if unsafe { libc::ioctl(listener, IOC_NOTIF_RECV as _, &mut n as *mut Notif) } != 0 {
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
                    let r = unsafe {
                        libc::ioctl(listener, IOC_NOTIF_ID_VALID as _, &id as *const u64)
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
                unsafe { libc::ioctl(listener, IOC_NOTIF_SEND as _, &resp as *const NotifResp) };
                continue;
            }
            if let Some(w) = exec.as_mut()
                && n.data.arch == crate::compile::AUDIT_ARCH
                && (nr == crate::execwatch::NR_EXECVE || nr == crate::execwatch::NR_EXECVEAT)
            {
                let id = n.id;
                let refuse = w.handle(n.pid, nr, &n.data.args, || {
                    let r = unsafe {
                        libc::ioctl(listener, IOC_NOTIF_ID_VALID as _, &id as *const u64)
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
                unsafe { libc::ioctl(listener, IOC_NOTIF_SEND as _, &resp as *const NotifResp) };
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
                unsafe { libc::ioctl(listener, IOC_NOTIF_SEND as _, &resp as *const NotifResp) };
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
            unsafe { libc::ioctl(listener, IOC_NOTIF_SEND as _, &resp as *const NotifResp) };
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
