//! Exec observation for `--allow-exec`: Landlock refuses an `execve` of an
//! unlisted file with EACCES and nobody sees it; this module makes the
//! refusal observable without becoming the enforcer.
//!
//! With an audit log, `execve` and `execveat` are sent to the seccomp
//! notifier (a few BPF instructions in front of the listener's filter, see
//! [`block`]). For each, the notifier:
//! 1. reads the path argument from the caller's memory (process_vm_readv,
//!    page by page, at most PATH_MAX bytes), then checks that the
//!    notification is still valid (SECCOMP_IOCTL_NOTIF_ID_VALID: the
//!    caller still waits in that call, so the pid and memory were its own);
//! 2. resolves it as the kernel will: an absolute path as is, a relative one
//!    against the caller's cwd (`/proc/PID/cwd/...`) or its dirfd
//!    (`/proc/PID/fd/N/...`), `execveat(fd, "", AT_EMPTY_PATH)` as the file
//!    behind the fd, `/proc/self/...`, `/proc/thread-self/...` and
//!    `/dev/fd/N` as the caller's own entries, following symlinks (unless
//!    AT_SYMLINK_NOFOLLOW; a symlink elsewhere that points into
//!    /proc/self is resolved as the notifier's: best effort);
//! 3. compares the file's inode (device, inode number: what a Landlock rule
//!    is attached to, so a hard link of a listed file counts as listed and a
//!    copy does not) and, when directories are listed, its ancestors' with
//!    the allowlist; for a listed file it also follows the `#!`
//!    interpreter (up to 4 levels, as the kernel) and the ELF interpreter
//!    (PT_INTERP), which Landlock checks too;
//! 4. when the file (or an interpreter) is not listed, writes an
//!    `exec_denied` alert {path, caller_pid, requested, syscall, reason}, deduped
//!    per path and rate-limited (a burst of 50, then 5 per second; the
//!    number suppressed in a final `exec_denied_suppressed`);
//! 5. answers SECCOMP_USER_NOTIF_FLAG_CONTINUE in every case: the kernel
//!    then runs the call, and Landlock decides.
//!
//! The alert is best effort, never the enforcement: a caller can change
//! its memory, cwd, fds or a symlink between the notifier's look and the
//! kernel's (TOCTOU), which can only make the log wrong, never let an
//! unlisted file run. A path the notifier cannot read or resolve (bad
//! pointer, missing file, non-regular file) gets no alert; the kernel
//! fails those calls with its own error.

use std::collections::{HashMap, HashSet};
use std::ffi::{CString, OsStr};
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use seccompiler::{BpfProgram, sock_filter};

use crate::notify::RateLimit;

/// x86_64 / aarch64 numbers.
pub const NR_EXECVE: u32 = libc::SYS_execve as u32;
pub const NR_EXECVEAT: u32 = libc::SYS_execveat as u32;
pub const NR_MEMFD_CREATE: u32 = libc::SYS_memfd_create as u32;

const MFD_CLOEXEC: u32 = 0x1;
const MFD_EXEC: u32 = 0x10;
const MFD_NOEXEC_SEAL: u32 = 0x8;

/// The filter that carries only the exec notification when no other
/// filter has a listener.
pub const EXEC_FILTER: &str = "5-exec-notify";

const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JMP_JEQ_K: u16 = 0x15;
const BPF_RET_K: u16 = 0x06;
const RET_ALLOW: u32 = 0x7fff_0000;

/// Most distinct paths remembered for deduplication.
const MAX_SEEN: usize = 4096;
/// Paths listed in the final count.
const TOP: usize = 20;

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// The BPF block: native-architecture execve, execveat and memfd_create
/// return USER_NOTIF; everything else falls through to the next
/// instruction. (With `memfd` false, memfd_create is not matched.)
pub fn block_for(memfd: bool) -> Vec<sock_filter> {
    let m = if memfd { NR_MEMFD_CREATE } else { NR_EXECVE };
    vec![
        insn(BPF_LD_W_ABS, 0, 0, 4),
        insn(BPF_JMP_JEQ_K, 0, 5, crate::compile::AUDIT_ARCH),
        insn(BPF_LD_W_ABS, 0, 0, 0),
        insn(BPF_JMP_JEQ_K, 2, 0, NR_EXECVE),
        insn(BPF_JMP_JEQ_K, 1, 0, NR_EXECVEAT),
        insn(BPF_JMP_JEQ_K, 0, 1, m),
        insn(BPF_RET_K, 0, 0, crate::notify::RET_USER_NOTIF),
    ]
}

/// [`block_for`] with memfd_create.
#[cfg(test)]
fn block() -> Vec<sock_filter> {
    block_for(true)
}

/// Puts [`block_for`] into `prog`: after our prelude when `prog` starts with
/// it (so foreign ABIs are still killed first), else at the front.
pub fn insert_block(prog: &mut BpfProgram, memfd: bool) {
    let pre = crate::compile::prelude();
    let at = if prog.starts_with(&pre) { pre.len() } else { 0 };
    let b = block_for(memfd);
    let tail = prog.split_off(at);
    prog.extend(b);
    prog.extend(tail);
}

/// A filter of its own: the block, then allow (the prelude in front when
/// it is the first filter installed).
pub fn standalone(first: bool, memfd: bool) -> BpfProgram {
    let mut p = if first {
        crate::compile::prelude()
    } else {
        Vec::new()
    };
    p.extend(block_for(memfd));
    p.push(insn(BPF_RET_K, 0, 0, RET_ALLOW));
    p
}

/// Whether exec can be watched at all: a filter that denies execve or
/// execveat (`--deny execve`) answers first and alerts on its own.
pub fn exec_denied_by(doc: &crate::model::Document) -> bool {
    doc.values().any(|f| {
        f.is_denylist()
            && f.rules
                .iter()
                .any(|r| r.syscall == "execve" || r.syscall == "execveat")
    })
}

/// Whether a filter denies memfd_create: then it is not intercepted (the
/// interception would create what the filter refuses).
pub fn memfd_denied_by(doc: &crate::model::Document) -> bool {
    doc.values()
        .any(|f| f.is_denylist() && f.rules.iter().any(|r| r.syscall == "memfd_create"))
}

/// How the notifier answered a memfd_create.
#[derive(Debug, PartialEq, Eq)]
pub enum MemfdAnswer {
    /// The fd was installed in the caller and returned (ADDFD + SEND).
    Sent,
    /// Fail the call with this errno.
    Errno(i32),
    /// Let the kernel carry it out unchanged.
    Continue,
}

#[repr(C)]
struct NotifAddfd {
    id: u64,
    flags: u32,
    srcfd: u32,
    newfd: u32,
    newfd_flags: u32,
}
// _IOW('!', 3, struct seccomp_notif_addfd).
const IOC_NOTIF_ADDFD: libc::c_ulong = 0x4000_0000 | ((24 << 16) as libc::c_ulong) | 0x2103;
const ADDFD_FLAG_SEND: u32 = 1 << 1;

/// The notifier's state for exec notifications.
pub struct ExecWatch {
    allowed: HashSet<(u64, u64)>,
    /// The interpreter of a file, by (dev, ino, ctime): an allowed
    /// program executed again costs an open and an fstat, not a read.
    interp: std::cell::RefCell<HashMap<FileKey, Option<Vec<u8>>>>,
    has_dirs: bool,
    limit: RateLimit,
    seen: HashMap<String, u64>,
    pub denied: u64,
    pub suppressed: u64,
}

fn stat_path(p: &Path) -> Option<libc::stat> {
    let c = CString::new(p.as_os_str().as_bytes()).ok()?;
    // SAFETY: libc::stat is plain integers: all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: c is a NUL-ended path and st a live stat, both alive for the call.
    (unsafe { libc::stat(c.as_ptr(), &mut st) } == 0).then_some(st)
}

fn fstat(fd: RawFd) -> Option<libc::stat> {
    // SAFETY: libc::stat is plain integers: all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is a live stat for the kernel to fill; a bad fd is an error, not UB.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some(st)
}

fn is_reg(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFREG
}

fn is_dir(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

/// An fd closed on drop.
struct Fd(RawFd);
impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: Fd owns the fd it was made with (from a successful open) and closes it once.
        unsafe { libc::close(self.0) };
    }
}

fn open(p: &[u8], flags: libc::c_int) -> Option<Fd> {
    let c = CString::new(p).ok()?;
    // SAFETY: c is a NUL-ended path alive for the call; the new fd is owned by the Fd returned.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
    (fd >= 0).then_some(Fd(fd))
}

fn fd_path(fd: RawFd) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()
}

/// Reads a NUL-terminated string (at most PATH_MAX bytes) at `addr` in
/// process `pid`, page by page (the string may end just before an
/// unmapped page).
pub fn read_cstr(pid: i32, addr: u64) -> Option<Vec<u8>> {
    const PAGE: u64 = 4096;
    let mut out = Vec::new();
    let mut a = addr;
    if a == 0 {
        return None;
    }
    while out.len() < libc::PATH_MAX as usize {
        let len = (PAGE - a % PAGE) as usize;
        let mut buf = vec![0u8; len];
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: len,
        };
        let remote = libc::iovec {
            iov_base: a as *mut libc::c_void,
            iov_len: len,
        };
        // SAFETY: local points at our own buffer of len bytes; the remote side is only read by
        // the kernel (a bad address is an error).
        let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        if n <= 0 {
            return None;
        }
        let chunk = &buf[..n as usize];
        if let Some(z) = chunk.iter().position(|&b| b == 0) {
            out.extend_from_slice(&chunk[..z]);
            return Some(out);
        }
        out.extend_from_slice(chunk);
        a += n as u64;
    }
    None
}

/// Where the kernel will look for `path` given `dirfd` and `flags`, as a
/// path the notifier can open (through the caller's /proc entries).
pub fn target(pid: i32, dirfd: i32, path: &[u8], flags: i32) -> Option<Vec<u8>> {
    if path.is_empty() {
        if flags & libc::AT_EMPTY_PATH != 0 && dirfd >= 0 {
            return Some(format!("/proc/{pid}/fd/{dirfd}").into_bytes());
        }
        return None;
    }
    if path[0] == b'/' {
        // The caller's own /proc entries: "self" would be the notifier.
        for (prefix, with) in [
            (&b"/proc/self/"[..], format!("/proc/{pid}/")),
            (
                &b"/proc/thread-self/"[..],
                format!("/proc/{pid}/task/{pid}/"),
            ),
            (&b"/dev/fd/"[..], format!("/proc/{pid}/fd/")),
        ] {
            if let Some(rest) = path.strip_prefix(prefix) {
                let mut t = with.into_bytes();
                t.extend_from_slice(rest);
                return Some(t);
            }
        }
        return Some(path.to_vec());
    }
    let mut base = if dirfd == libc::AT_FDCWD {
        format!("/proc/{pid}/cwd/").into_bytes()
    } else if dirfd >= 0 {
        format!("/proc/{pid}/fd/{dirfd}/").into_bytes()
    } else {
        return None;
    };
    base.extend_from_slice(path);
    Some(base)
}

/// The interpreter the kernel will execute for the file open as `fd`:
/// a `#!` line's first word, or the ELF PT_INTERP path.
fn interpreter(fd: RawFd) -> Option<Vec<u8>> {
    let f = open(
        format!("/proc/self/fd/{fd}").as_bytes(),
        libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY,
    )?;
    let mut buf = [0u8; 256];
    // SAFETY: f owns an open fd; buf is a live buffer of buf.len() bytes.
    let n = unsafe { libc::pread(f.0, buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n <= 0 {
        return None;
    }
    let b = &buf[..n as usize];
    if let Some(rest) = b.strip_prefix(b"#!") {
        let line = rest.split(|&c| c == b'\n').next()?;
        let word: Vec<u8> = line
            .iter()
            .copied()
            .skip_while(|c| *c == b' ' || *c == b'\t')
            .take_while(|c| !matches!(*c, b' ' | b'\t' | 0 | b'\r'))
            .collect();
        return (!word.is_empty()).then_some(word);
    }
    // ELF64, little endian (x86_64, aarch64).
    if b.len() < 64 || &b[..4] != b"\x7fELF" || b[4] != 2 || b[5] != 1 {
        return None;
    }
    let u16le = |o: usize| u64::from(u16::from_le_bytes([b[o], b[o + 1]]));
    let phoff = u64::from_le_bytes(b[32..40].try_into().ok()?);
    let phentsize = u16le(54);
    let phnum = u16le(56).min(64);
    if phentsize < 56 {
        return None;
    }
    let mut ph = vec![0u8; (phentsize * phnum) as usize];
    // SAFETY: f owns an open fd; ph is a live buffer of ph.len() bytes.
    let r = unsafe { libc::pread(f.0, ph.as_mut_ptr().cast(), ph.len(), phoff as libc::off_t) };
    if r != ph.len() as isize {
        return None;
    }
    for e in ph.chunks(phentsize as usize) {
        if u32::from_le_bytes(e[0..4].try_into().ok()?) == 3 {
            let off = u64::from_le_bytes(e[8..16].try_into().ok()?);
            let size = u64::from_le_bytes(e[32..40].try_into().ok()?).min(4096) as usize;
            let mut s = vec![0u8; size];
            // SAFETY: f owns an open fd; s is a live buffer of `size` bytes.
            let r = unsafe { libc::pread(f.0, s.as_mut_ptr().cast(), size, off as libc::off_t) };
            if r <= 0 {
                return None;
            }
            s.truncate(r as usize);
            if let Some(z) = s.iter().position(|&c| c == 0) {
                s.truncate(z);
            }
            return (!s.is_empty()).then_some(s);
        }
    }
    None
}

/// A file's identity and version (any write or chmod changes ctime).
type FileKey = (u64, u64, i64, i64);

/// Most files whose interpreter is remembered.
const MAX_CACHED: usize = 1024;

/// One refusal the notifier expects Landlock to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The file Landlock refuses (resolved, symlinks followed).
    pub path: String,
    /// Why: "not listed", or "interpreter of FILE not listed".
    pub reason: String,
    /// The file is on a kernel-internal mount (a memfd): Landlock lets
    /// those run, so the notifier refuses the call itself.
    pub internal: bool,
}

/// Whether the file open as `fd` lives on a kernel-internal mount (memfd,
/// hugetlbfs memfd): Landlock allows every access there (its path walk
/// ends at a disconnected MNT_INTERNAL root), so an unlisted program
/// written into a memfd would run. Seen from its /proc path (`/memfd:`)
/// or its mount id missing from our mountinfo.
fn on_internal_mount(fd: RawFd, path: &str) -> bool {
    if path.starts_with("/memfd:") {
        return true;
    }
    // SAFETY: libc::statx is plain integers: all-zero is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: the empty path is NUL-ended and static, stx a live statx for the kernel to fill.
    if unsafe {
        libc::statx(
            fd,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_MNT_ID,
            &mut stx,
        )
    } != 0
        || stx.stx_mask & libc::STATX_MNT_ID == 0
    {
        return false;
    }
    let id = stx.stx_mnt_id;
    let Ok(mi) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    !mi.lines()
        .any(|l| l.split(' ').next().and_then(|x| x.parse::<u64>().ok()) == Some(id))
}

impl ExecWatch {
    /// The allowlist as inodes; paths that do not exist are skipped (as
    /// Landlock's ruleset skips them).
    pub fn new(paths: &[PathBuf]) -> Self {
        let mut allowed = HashSet::new();
        let mut has_dirs = false;
        for p in paths {
            if let Some(st) = stat_path(p) {
                has_dirs |= is_dir(&st);
                allowed.insert((st.st_dev, st.st_ino));
            }
        }
        ExecWatch {
            allowed,
            interp: Default::default(),
            has_dirs,
            limit: RateLimit::for_event("exec_denied"),
            seen: HashMap::new(),
            denied: 0,
            suppressed: 0,
        }
    }

    fn listed(&self, fd: RawFd, st: &libc::stat) -> bool {
        if self.allowed.contains(&(st.st_dev, st.st_ino)) {
            return true;
        }
        if !self.has_dirs {
            return false;
        }
        let Some(p) = fd_path(fd) else {
            return false;
        };
        p.ancestors()
            .skip(1)
            .any(|a| stat_path(a).is_some_and(|s| self.allowed.contains(&(s.st_dev, s.st_ino))))
    }

    /// What Landlock will refuse when process `pid` executes the file at
    /// `tgt` (see [`target`]); None when it runs (or cannot be resolved).
    pub fn check(&self, pid: i32, tgt: &[u8], nofollow: bool) -> Option<Refusal> {
        let mut flags = libc::O_PATH;
        if nofollow {
            flags |= libc::O_NOFOLLOW;
        }
        let mut fd = open(tgt, flags)?;
        let mut outer: Option<PathBuf> = None;
        // The file, then its interpreters (binfmt_script allows 4 levels;
        // the ELF interpreter ends the chain).
        for _ in 0..6 {
            let st = fstat(fd.0)?;
            if !is_reg(&st) {
                return None;
            }
            if !self.listed(fd.0, &st) {
                let path = fd_path(fd.0)
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| String::from_utf8_lossy(tgt).into_owned());
                let internal = on_internal_mount(fd.0, &path);
                let mut reason = match &outer {
                    None => "not listed".to_string(),
                    Some(o) => format!("interpreter of {} not listed", o.display()),
                };
                if internal {
                    reason.push_str(" (on a kernel-internal mount such as a memfd, which Landlock does not cover: refused by the notifier)");
                }
                return Some(Refusal {
                    path,
                    reason,
                    internal,
                });
            }
            let key = (st.st_dev, st.st_ino, st.st_ctime, st.st_ctime_nsec);
            let cached = self.interp.borrow().get(&key).cloned();
            let interp = match cached {
                Some(i) => i,
                None => {
                    let i = interpreter(fd.0);
                    let mut c = self.interp.borrow_mut();
                    if c.len() >= MAX_CACHED {
                        c.clear();
                    }
                    c.insert(key, i.clone());
                    i
                }
            }?;
            let next = target(pid, libc::AT_FDCWD, &interp, 0)?;
            let nfd = open(&next, libc::O_PATH)?;
            outer = fd_path(fd.0);
            fd = nfd;
        }
        None
    }

    /// Handles one exec notification; returns the errno to answer with
    /// (EACCES for an unlisted file on an internal mount, which Landlock
    /// would let run), None for CONTINUE (Landlock decides). `valid`
    /// re-checks the notification id after the read.
    pub fn handle(
        &mut self,
        pid: u32,
        nr: u32,
        args: &[u64; 6],
        valid: impl Fn() -> bool,
    ) -> Option<i32> {
        let pid = pid as i32;
        let (dirfd, addr, flags) = if nr == NR_EXECVE {
            (libc::AT_FDCWD, args[0], 0)
        } else {
            (args[0] as i32, args[1], args[4] as i32)
        };
        let path = read_cstr(pid, addr)?;
        if !valid() {
            return None;
        }
        let tgt = target(pid, dirfd, &path, flags)?;
        let nofollow = flags & libc::AT_SYMLINK_NOFOLLOW != 0;
        let r = self.check(pid, &tgt, nofollow)?;
        let answer = r.internal.then_some(libc::EACCES);
        self.denied += 1;
        if let Some(c) = self.seen.get_mut(&r.path) {
            *c += 1;
            self.suppressed += 1;
            return answer;
        }
        if !self.limit.allow() {
            self.suppressed += 1;
            return answer;
        }
        if self.seen.len() < MAX_SEEN {
            self.seen.insert(r.path.clone(), 1);
        }
        crate::notify::record(
            "exec_denied",
            serde_json::json!({
                "path": r.path,
                "caller_pid": pid,
                "requested": OsStr::from_bytes(&path).to_string_lossy(),
                "syscall": if nr == NR_EXECVE { "execve" } else { "execveat" },
                "reason": r.reason,
                "enforced_by": if r.internal { "notifier" } else { "landlock" },
            }),
        );
        answer
    }

    /// memfd_create: Landlock lets a memfd's program run, so the notifier
    /// creates the memfd itself with MFD_NOEXEC_SEAL (Linux 6.3+: no
    /// execute bit, sealed so it cannot be added) and hands it to the caller
    /// (SECCOMP_IOCTL_NOTIF_ADDFD with SECCOMP_ADDFD_FLAG_SEND: installed and
    /// returned as the call's result in one step). MFD_EXEC is refused
    /// (EACCES, as with vm.memfd_noexec=2). The name is read from the
    /// caller's memory; a bad pointer gets EFAULT.
    pub fn memfd(
        &mut self,
        listener: RawFd,
        id: u64,
        pid: u32,
        args: &[u64; 6],
        valid: impl Fn() -> bool,
    ) -> MemfdAnswer {
        let pid = pid as i32;
        let flags = args[1] as u32;
        let Some(name) = read_cstr(pid, args[0]) else {
            return MemfdAnswer::Errno(libc::EFAULT);
        };
        if !valid() {
            return MemfdAnswer::Errno(libc::ECANCELED);
        }
        if flags & MFD_EXEC != 0 {
            self.alert_memfd(pid, &name);
            return MemfdAnswer::Errno(libc::EACCES);
        }
        let Ok(cname) = CString::new(name) else {
            return MemfdAnswer::Errno(libc::EINVAL);
        };
        let ours = (flags & !MFD_CLOEXEC) | MFD_CLOEXEC | MFD_NOEXEC_SEAL;
        // SAFETY: cname is a NUL-ended name alive for the call; the new fd is ours.
        let fd = unsafe { libc::memfd_create(cname.as_ptr(), ours) };
        if fd < 0 {
            let e = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL);
            if e == libc::EINVAL && flags & MFD_NOEXEC_SEAL == 0 {
                // A kernel before 6.3 (no MFD_NOEXEC_SEAL): the kernel's own
                // answer; memfd execs then rest on the exec check below.
                return MemfdAnswer::Continue;
            }
            return MemfdAnswer::Errno(e);
        }
        let fd = Fd(fd);
        let add = NotifAddfd {
            id,
            flags: ADDFD_FLAG_SEND,
            srcfd: fd.0 as u32,
            newfd: 0,
            newfd_flags: if flags & MFD_CLOEXEC != 0 {
                libc::O_CLOEXEC as u32
            } else {
                0
            },
        };
        // SAFETY: listener is the open notification fd; add is a live seccomp_notif_addfd.
        let r = unsafe {
            libc::ioctl(
                listener,
                IOC_NOTIF_ADDFD as _,
                std::ptr::from_ref::<NotifAddfd>(&add),
            )
        };
        if r >= 0 {
            return MemfdAnswer::Sent;
        }
        match std::io::Error::last_os_error().raw_os_error() {
            // The caller is gone or was interrupted: nothing to answer.
            Some(libc::ENOENT) => MemfdAnswer::Sent,
            // A kernel without ADDFD's SEND flag (before 5.14): the kernel
            // creates the memfd as asked (the exec check still applies).
            Some(libc::EINVAL) | Some(libc::ENOTTY) => MemfdAnswer::Continue,
            Some(e) => MemfdAnswer::Errno(e),
            None => MemfdAnswer::Errno(libc::EIO),
        }
    }

    fn alert_memfd(&mut self, pid: i32, name: &[u8]) {
        let path = format!("memfd:{}", String::from_utf8_lossy(name));
        self.denied += 1;
        if let Some(c) = self.seen.get_mut(&path) {
            *c += 1;
            self.suppressed += 1;
            return;
        }
        if !self.limit.allow() {
            self.suppressed += 1;
            return;
        }
        if self.seen.len() < MAX_SEEN {
            self.seen.insert(path.clone(), 1);
        }
        crate::notify::record(
            "exec_denied",
            serde_json::json!({
                "path": path,
                "caller_pid": pid,
                "requested": path,
                "syscall": "memfd_create",
                "reason": "an executable memfd (MFD_EXEC) was asked for: refused",
                "enforced_by": "notifier",
            }),
        );
    }

    /// The final count, when anything was suppressed.
    pub fn finish(&self) {
        if self.suppressed == 0 {
            return;
        }
        let mut top: Vec<(&String, &u64)> = self.seen.iter().filter(|(_, c)| **c > 1).collect();
        top.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        top.truncate(TOP);
        crate::notify::record(
            "exec_denied_suppressed",
            serde_json::json!({
                "suppressed": self.suppressed,
                "denied": self.denied,
                "repeated": top.into_iter().map(|(p, c)| serde_json::json!({"path": p, "count": c})).collect::<Vec<_>>(),
                "burst": crate::notify::BURST,
                "per_second": crate::notify::PER_SECOND,
            }),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_resolve_like_the_kernel() {
        assert_eq!(
            target(7, libc::AT_FDCWD, b"/bin/sh", 0).unwrap(),
            b"/bin/sh"
        );
        assert_eq!(
            target(7, libc::AT_FDCWD, b"x/y", 0).unwrap(),
            b"/proc/7/cwd/x/y"
        );
        assert_eq!(target(7, 5, b"y", 0).unwrap(), b"/proc/7/fd/5/y");
        assert_eq!(
            target(7, 5, b"", libc::AT_EMPTY_PATH).unwrap(),
            b"/proc/7/fd/5"
        );
        assert!(target(7, 5, b"", 0).is_none());
        assert!(target(7, -1, b"rel", 0).is_none());
        assert_eq!(
            target(7, libc::AT_FDCWD, b"/proc/self/fd/3", 0).unwrap(),
            b"/proc/7/fd/3"
        );
        assert_eq!(
            target(7, libc::AT_FDCWD, b"/dev/fd/3", 0).unwrap(),
            b"/proc/7/fd/3"
        );
        assert_eq!(
            target(7, libc::AT_FDCWD, b"/proc/thread-self/exe", 0).unwrap(),
            b"/proc/7/task/7/exe"
        );
    }

    #[test]
    fn block_goes_after_the_prelude() {
        let mut p = crate::compile::prelude();
        p.push(insn(BPF_RET_K, 0, 0, RET_ALLOW));
        insert_block(&mut p, true);
        let n = crate::compile::prelude().len();
        assert_eq!(p[n].k, 4);
        assert_eq!(p.len(), n + block().len() + 1);
        let mut q = vec![insn(BPF_RET_K, 0, 0, RET_ALLOW)];
        insert_block(&mut q, false);
        assert_eq!(q[0].k, 4);
        assert_eq!(q.last().unwrap().k, RET_ALLOW);
    }

    #[test]
    fn a_listed_file_and_its_interpreters() {
        let sh = Path::new("/bin/sh").canonicalize().unwrap();
        let mut list = vec![sh.clone()];
        list.extend(crate::landlock::loaders());
        let w = ExecWatch::new(&list);
        let me = std::process::id() as i32;
        assert_eq!(w.check(me, b"/bin/sh", false), None);
        let d = tempfile::tempdir().unwrap();
        let copy = d.path().join("copy");
        std::fs::copy(&sh, &copy).unwrap();
        let r = w.check(me, copy.as_os_str().as_bytes(), false).unwrap();
        assert_eq!(r.reason, "not listed");
        // A listed script whose interpreter is not listed.
        let script = d.path().join("s");
        std::fs::write(&script, format!("#!{} -e\necho\n", copy.display())).unwrap();
        let w = ExecWatch::new(std::slice::from_ref(&script));
        let r = w.check(me, script.as_os_str().as_bytes(), false).unwrap();
        assert!(r.path.ends_with("/copy"), "{r:?}");
        assert!(r.reason.starts_with("interpreter of"), "{r:?}");
        // A listed directory covers what is beneath it.
        let mut l = vec![d.path().to_path_buf(), sh];
        l.extend(crate::landlock::loaders());
        let w = ExecWatch::new(&l);
        assert_eq!(w.check(me, copy.as_os_str().as_bytes(), false), None);
    }

    #[test]
    fn reads_a_string_from_our_own_memory() {
        let s = c"/usr/bin/env";
        let me = std::process::id() as i32;
        assert_eq!(read_cstr(me, s.as_ptr() as u64).unwrap(), b"/usr/bin/env");
        assert!(read_cstr(me, 0).is_none());
    }
}
