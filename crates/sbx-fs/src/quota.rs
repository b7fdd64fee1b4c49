//! `--write-quota SIZE` / `--write-inodes N`: a budget for what a run may
//! add to its writable directory binds, together.
//!
//! Mode "overlay" (the only one implemented; see docs/fs.md "WRITE
//! BUDGET"): every writable directory bind is shown through an overlay
//! whose lower layer is the host directory and whose upper layer is a
//! directory of ONE tmpfs of `size=SIZE,nr_inodes=N` shared by all binds.
//! A write past the budget fails with ENOSPC inside the sandbox; the outer
//! sbx-fs watches the tmpfs ([`Watch`], `write_quota_exceeded`) and, once
//! the sandbox is gone, applies each upper layer to its host directory
//! ([`apply`]). The tmpfs exists only in the sandbox's mount namespace and
//! through fds; nothing of it is left on the host.
//!
//! The apply treats the upper layer as hostile: every host path is reached
//! from the bind's directory fd one component at a time with O_NOFOLLOW (a
//! symlink is never followed, nothing is written outside the bind), files
//! land under a temporary name and are renamed into place (one file is
//! either old or new), FIFOs, sockets and device nodes are never created,
//! set-user/group-ID bits never applied (alerts), and the paths the plan
//! protects (mount points inside the bind and their ancestors) are never
//! removed or replaced. The temporary names are noted in a [`Journal`]
//! (a memfd shared with the placeholder reaper) before they exist: if
//! sbx-fs is killed mid-apply, the reaper removes them ([`recover`]).

use std::collections::{HashMap, HashSet};
use std::ffi::{CString, OsStr, OsString};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use sbx_core::{Severity, audit};

/// Default `--write-inodes` when only `--write-quota` is given.
pub const DEFAULT_INODES: u64 = 1_000_000;
/// Inodes of the machinery itself (the tmpfs root, one upper and one work
/// directory per bind, overlay's work entries), added to the budget.
pub const INODE_SLACK: u64 = 4;
/// Prefix of the temporary names the apply creates beside the target.
pub const TEMP_PREFIX: &str = ".sbx-apply.";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub bytes: u64,
    pub inodes: u64,
}

impl Budget {
    /// The tmpfs options for `binds` writable binds.
    pub fn tmpfs_inodes(&self, binds: usize) -> u64 {
        self.inodes + INODE_SLACK + 2 * binds as u64
    }
}

/// What the apply must not touch inside one bind (paths relative to it).
#[derive(Debug, Clone, Default)]
pub struct Rules {
    /// Mount points inside the bind (protected, denied, nested binds, the
    /// git stage): nothing at or below them is applied, they are never
    /// removed.
    pub skip: Vec<PathBuf>,
    /// Pinned directories: applied into, never removed or replaced.
    pub pins: Vec<PathBuf>,
}

impl Rules {
    fn skipped(&self, rel: &Path) -> bool {
        self.skip.iter().any(|s| rel.starts_with(s))
    }
    /// `rel` is, or holds, something that must stay.
    fn holds_kept(&self, rel: &Path) -> bool {
        self.skip
            .iter()
            .chain(&self.pins)
            .any(|s| s.starts_with(rel))
    }
}

/// One writable bind under the budget.
#[derive(Debug, Clone)]
pub struct Layer {
    /// Index of its upper (`u<k>`) and work (`w<k>`) directories.
    pub k: usize,
    /// The host directory (canonical), its device and inode.
    pub host: PathBuf,
    pub dev: u64,
    pub ino: u64,
    pub rules: Rules,
}

pub fn upper_name(k: usize) -> String {
    format!("u{k}")
}
pub fn work_name(k: usize) -> String {
    format!("w{k}")
}

/// Counts of one bind's apply (the `write_quota_applied` event).
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Report {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub links: u64,
    pub removed: u64,
    pub bytes: u64,
    pub refused: u64,
    pub errors: u64,
}

// ---- small syscalls ----------------------------------------------------

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn openat(dir: RawFd, name: &Path, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let c = cstr(name)?;
    // SAFETY: a valid C string; the fd returned is owned here.
    let fd = cvt(unsafe { libc::openat(dir, c.as_ptr(), flags | libc::O_CLOEXEC, mode) })?;
    // SAFETY: fd was just returned by openat and is not owned elsewhere.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn lstatat(dir: RawFd, name: &Path) -> io::Result<libc::stat> {
    crate::sys::lstatat(dir, name)
}

fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    crate::sys::fstat(fd)
}

fn unlinkat(dir: RawFd, name: &Path, is_dir: bool) -> io::Result<()> {
    crate::sys::unlinkat(dir, name, is_dir)
}

fn renameat(dir: RawFd, from: &Path, to: &Path) -> io::Result<()> {
    let (a, b) = (cstr(from)?, cstr(to)?);
    // SAFETY: valid C strings.
    cvt(unsafe { libc::renameat(dir, a.as_ptr(), dir, b.as_ptr()) }).map(|_| ())
}

fn readlinkat(dir: RawFd, name: &Path) -> io::Result<OsString> {
    let c = cstr(name)?;
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: buf is writable for its length.
    let n = unsafe { libc::readlinkat(dir, c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(OsString::from_vec(buf))
}

/// The names in directory `fd` (not `.`/`..`).
fn names(fd: RawFd) -> io::Result<Vec<OsString>> {
    // A fresh open description of the same directory: readdir's position
    // is per description.
    let d = openat(fd, Path::new("."), libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
    let mut out = Vec::new();
    for e in std::fs::read_dir(format!("/proc/self/fd/{}", d.as_raw_fd()))? {
        out.push(e?.file_name());
    }
    Ok(out)
}

fn getxattr(fd: RawFd, name: &str) -> Option<Vec<u8>> {
    let n = CString::new(name).ok()?;
    let mut buf = vec![0u8; 256];
    // SAFETY: buf is writable for its length.
    let r = unsafe { libc::fgetxattr(fd, n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return None;
    }
    buf.truncate(r as usize);
    Some(buf)
}

/// An opaque directory of the upper layer hides everything of the lower.
fn opaque(fd: RawFd) -> bool {
    ["user.overlay.opaque", "trusted.overlay.opaque"]
        .iter()
        .any(|n| getxattr(fd, n).is_some_and(|v| v == b"y"))
}

/// Copies the user.* extended attributes (not overlayfs' own).
fn copy_xattrs(from: RawFd, to: RawFd) {
    let mut list = vec![0u8; 4096];
    // SAFETY: list is writable for its length.
    let n = unsafe { libc::flistxattr(from, list.as_mut_ptr().cast(), list.len()) };
    if n <= 0 {
        return;
    }
    list.truncate(n as usize);
    for name in list.split(|c| *c == 0).filter(|n| !n.is_empty()) {
        if !name.starts_with(b"user.") || name.starts_with(b"user.overlay.") {
            continue;
        }
        let Ok(s) = std::str::from_utf8(name) else {
            continue;
        };
        let mut val = vec![0u8; 65536];
        let Ok(c) = CString::new(s) else { continue };
        // SAFETY: val is writable for its length.
        let r = unsafe { libc::fgetxattr(from, c.as_ptr(), val.as_mut_ptr().cast(), val.len()) };
        if r < 0 {
            continue;
        }
        // SAFETY: val holds r bytes.
        unsafe { libc::fsetxattr(to, c.as_ptr(), val.as_ptr().cast(), r as usize, 0) };
    }
}

/// Mode, owner (as root: the sandbox's identity), times of `st` on `fd`.
fn set_attrs(fd: RawFd, st: &libc::stat, mode: u32) {
    // SAFETY: plain syscalls on an fd we own.
    unsafe {
        if libc::geteuid() == 0 {
            libc::fchown(fd, st.st_uid, st.st_gid);
        }
        libc::fchmod(fd, mode);
        let ts = [
            libc::timespec {
                tv_sec: st.st_atime,
                tv_nsec: st.st_atime_nsec,
            },
            libc::timespec {
                tv_sec: st.st_mtime,
                tv_nsec: st.st_mtime_nsec,
            },
        ];
        libc::futimens(fd, ts.as_ptr());
    }
}

fn kind_of(st: &libc::stat) -> &'static str {
    match st.st_mode & libc::S_IFMT {
        libc::S_IFIFO => "fifo",
        libc::S_IFSOCK => "socket",
        libc::S_IFCHR => "character device",
        libc::S_IFBLK => "block device",
        libc::S_IFDIR => "directory",
        libc::S_IFLNK => "symlink",
        _ => "file",
    }
}

fn is_whiteout(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFCHR && st.st_rdev == 0
}

// ---- the journal -------------------------------------------------------

/// Where the apply is about to create temporaries: NUL-separated entries
/// `DIR/.sbx-apply.PID.` (a directory and the prefix of every temporary it
/// makes there), each written once, before the first temporary in that
/// directory exists, in a memfd shared with the reaper (no file on disk;
/// its size grows with the directories touched, not the files).
pub struct Journal {
    file: std::fs::File,
}

impl Journal {
    /// A new journal and a second handle on it (for the reaper).
    pub fn new() -> io::Result<(Journal, Journal)> {
        // SAFETY: a valid C string; the fd returned is owned here.
        let fd = unsafe { libc::memfd_create(c"sbx-fs-apply".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just created and is owned by nothing else.
        let file = unsafe { std::fs::File::from_raw_fd(fd) };
        let dup = file.try_clone()?;
        Ok((Journal { file }, Journal { file: dup }))
    }

    pub fn raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    fn note(&self, p: &Path) -> io::Result<()> {
        let mut b = p.as_os_str().as_bytes().to_vec();
        b.push(0);
        (&self.file).write_all(&b)
    }
}

/// After sbx-fs died: in every directory the journal names, removes the
/// temporaries with the noted prefix that still exist (regular files and
/// symlinks only; the directory reached without following symlinks).
/// Returns the paths removed.
pub fn recover(j: &Journal) -> Vec<PathBuf> {
    let mut data = Vec::new();
    let mut f = &j.file;
    use std::io::Seek;
    if f.seek(io::SeekFrom::Start(0)).is_err() || f.read_to_end(&mut data).is_err() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for p in data.split(|c| *c == 0).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(OsStr::from_bytes(p));
        let (Some(dir), Some(name)) = (p.parent(), p.file_name()) else {
            continue;
        };
        let prefix = name.as_bytes();
        // The prefix must be ours: ".sbx-apply.PID." exactly.
        let ours = prefix
            .strip_prefix(TEMP_PREFIX.as_bytes())
            .and_then(|r| r.strip_suffix(b"."))
            .is_some_and(|pid| !pid.is_empty() && pid.iter().all(u8::is_ascii_digit));
        if !ours {
            continue;
        }
        let Ok(d) = crate::sys::openat2(
            libc::AT_FDCWD,
            dir,
            libc::O_RDONLY | libc::O_DIRECTORY,
            0,
            crate::sys::RESOLVE_NO_SYMLINKS | crate::sys::RESOLVE_NO_MAGICLINKS,
        ) else {
            continue;
        };
        let Ok(entries) = names(d.as_raw_fd()) else {
            continue;
        };
        for n in entries {
            if !n.as_bytes().starts_with(prefix) {
                continue;
            }
            let n = Path::new(&n);
            if let Ok(st) = lstatat(d.as_raw_fd(), n)
                && (crate::sys::is_reg(&st) || crate::sys::is_symlink(&st))
                && unlinkat(d.as_raw_fd(), n, false).is_ok()
            {
                out.push(dir.join(n));
            }
        }
    }
    out
}

// ---- the apply ---------------------------------------------------------

struct Ctx<'a> {
    layer: &'a Layer,
    journal: Option<&'a Journal>,
    report: Report,
    /// Upper inode -> (host dir fd, name) of its first name: hard links.
    links: HashMap<u64, (std::rc::Rc<OwnedFd>, OsString)>,
    counter: u64,
    pid: u32,
    /// Directories already in the journal.
    noted: HashSet<PathBuf>,
}

impl Ctx<'_> {
    fn refuse(&mut self, rel: &Path, what: &str, why: &str) {
        self.report.refused += 1;
        audit::emit(
            "write_apply_refused",
            Severity::Alert,
            serde_json::json!({
                "bind": self.layer.host.display().to_string(),
                "path": rel.display().to_string(),
                "kind": what,
                "why": why,
            }),
        );
    }

    fn error(&mut self, rel: &Path, op: &str, e: &io::Error) {
        self.report.errors += 1;
        audit::emit(
            "write_apply_failed",
            Severity::Warn,
            serde_json::json!({
                "bind": self.layer.host.display().to_string(),
                "path": rel.display().to_string(),
                "op": op,
                "error": e.to_string(),
            }),
        );
    }

    fn temp(&mut self, hdir: RawFd, rel_dir: &Path) -> io::Result<PathBuf> {
        self.counter += 1;
        let name = PathBuf::from(format!("{TEMP_PREFIX}{}.{}", self.pid, self.counter));
        if let Some(j) = self.journal
            && self.noted.insert(rel_dir.to_path_buf())
        {
            let prefix = format!("{TEMP_PREFIX}{}.", self.pid);
            j.note(&self.layer.host.join(rel_dir).join(prefix))?;
        }
        // Whatever is there (a stale name of a killed run with a reused
        // pid) is not ours to follow: it goes.
        if let Ok(st) = lstatat(hdir, &name)
            && !crate::sys::is_dir(&st)
        {
            let _ = unlinkat(hdir, &name, false);
        }
        Ok(name)
    }
}

/// Applies one bind's upper layer (`upper`: a directory fd) to its host
/// directory. The host directory is opened again by path without
/// following symlinks and must be the inode the bind was made of.
pub fn apply(upper: RawFd, layer: &Layer, journal: Option<&Journal>) -> io::Result<Report> {
    let host = crate::sys::openat2(
        libc::AT_FDCWD,
        &layer.host,
        libc::O_RDONLY | libc::O_DIRECTORY,
        0,
        crate::sys::RESOLVE_NO_SYMLINKS | crate::sys::RESOLVE_NO_MAGICLINKS,
    )?;
    let st = fstat(host.as_raw_fd())?;
    if st.st_dev != layer.dev || st.st_ino != layer.ino {
        return Err(io::Error::other(format!(
            "{} is no longer the directory that was bound",
            layer.host.display()
        )));
    }
    let mut cx = Ctx {
        layer,
        journal,
        report: Report::default(),
        links: HashMap::new(),
        counter: 0,
        pid: std::process::id(),
        noted: HashSet::new(),
    };
    let host = std::rc::Rc::new(host);
    apply_dir(&mut cx, upper, &host, Path::new(""))?;
    // The bind's own root: mode and times as the upper shows them.
    if let Ok(ust) = fstat(upper) {
        set_attrs(host.as_raw_fd(), &ust, ust.st_mode & 0o3777);
    }
    Ok(cx.report)
}

fn open_upper_dir(udir: RawFd, name: &Path, st: &libc::stat) -> io::Result<OwnedFd> {
    // Unprivileged, a directory the sandbox made unreadable is still ours
    // (the same uid): readable again in the upper, which is thrown away.
    if st.st_mode & 0o500 != 0o500 {
        let _ = crate::sys::fchmodat(udir, name, (st.st_mode & 0o7777) | 0o700);
    }
    openat(
        udir,
        name,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
    )
}

fn apply_dir(cx: &mut Ctx, udir: RawFd, hdir: &std::rc::Rc<OwnedFd>, rel: &Path) -> io::Result<()> {
    let mut entries = names(udir)?;
    entries.sort();
    for name in entries {
        let n = Path::new(&name);
        let r = rel.join(n);
        let st = match lstatat(udir, n) {
            Ok(s) => s,
            Err(e) => {
                cx.error(&r, "stat upper", &e);
                continue;
            }
        };
        if cx.layer.rules.skipped(&r) {
            // Mount points: writes below them never reached this upper.
            if !is_whiteout(&st) && !crate::sys::is_dir(&st) {
                cx.refuse(&r, kind_of(&st), "protected path");
            }
            if is_whiteout(&st) {
                cx.refuse(&r, "whiteout", "protected path");
            }
            continue;
        }
        let h = hdir.as_raw_fd();
        match st.st_mode & libc::S_IFMT {
            _ if is_whiteout(&st) => {
                if cx.layer.rules.holds_kept(&r) {
                    cx.refuse(&r, "whiteout", "protected path");
                } else {
                    remove_host(cx, h, n, &r);
                }
            }
            libc::S_IFDIR => {
                let u = match open_upper_dir(udir, n, &st) {
                    Ok(u) => u,
                    Err(e) => {
                        cx.error(&r, "open upper", &e);
                        continue;
                    }
                };
                let hc = match host_dir(cx, h, n, &r) {
                    Some(f) => std::rc::Rc::new(f),
                    None => continue,
                };
                apply_dir(cx, u.as_raw_fd(), &hc, &r)?;
                if opaque(u.as_raw_fd()) {
                    // Everything of the host not in the upper was removed
                    // inside (rm -rf dir; mkdir dir).
                    let keep: HashSet<OsString> = names(u.as_raw_fd())?.into_iter().collect();
                    for hn in names(hc.as_raw_fd())? {
                        if keep.contains(&hn) || hn.as_bytes().starts_with(TEMP_PREFIX.as_bytes()) {
                            continue;
                        }
                        let hr = r.join(&hn);
                        if cx.layer.rules.holds_kept(&hr) {
                            continue;
                        }
                        remove_host(cx, hc.as_raw_fd(), Path::new(&hn), &hr);
                    }
                }
                copy_xattrs(u.as_raw_fd(), hc.as_raw_fd());
                // Set-group-ID on a directory only steers group
                // inheritance; set-user-ID never.
                set_attrs(hc.as_raw_fd(), &st, st.st_mode & 0o3777);
            }
            libc::S_IFREG => apply_file(cx, udir, hdir, n, rel, &st),
            libc::S_IFLNK => {
                let target = match readlinkat(udir, n) {
                    Ok(t) => t,
                    Err(e) => {
                        cx.error(&r, "readlink upper", &e);
                        continue;
                    }
                };
                if cx.layer.rules.holds_kept(&r) {
                    cx.refuse(&r, "symlink", "protected path");
                    continue;
                }
                let res = (|| {
                    let t = cx.temp(h, rel)?;
                    crate::sys::symlinkat(Path::new(&target), h, &t)?;
                    place(cx, h, &t, n, &r)
                })();
                match res {
                    Ok(()) => cx.report.symlinks += 1,
                    Err(e) => cx.error(&r, "symlink", &e),
                }
            }
            _ => cx.refuse(&r, kind_of(&st), "special files are never applied"),
        }
    }
    Ok(())
}

/// The host directory `name` in `h`: opened without following a symlink,
/// made when missing, and what else is there (a file, a symlink) removed.
fn host_dir(cx: &mut Ctx, h: RawFd, name: &Path, r: &Path) -> Option<OwnedFd> {
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
    match openat(h, name, flags, 0) {
        Ok(f) => return Some(f),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTDIR | libc::ELOOP)) => {
            if cx.layer.rules.holds_kept(r) {
                cx.refuse(r, "directory", "protected path");
                return None;
            }
            if let Err(e) = unlinkat(h, name, false) {
                cx.error(r, "remove", &e);
                return None;
            }
            cx.report.removed += 1;
        }
        Err(e) => {
            cx.error(r, "open", &e);
            return None;
        }
    }
    if let Err(e) = crate::sys::mkdirat(h, name, 0o700) {
        cx.error(r, "mkdir", &e);
        return None;
    }
    cx.report.dirs += 1;
    match openat(h, name, flags, 0) {
        Ok(f) => Some(f),
        Err(e) => {
            cx.error(r, "open", &e);
            None
        }
    }
}

/// Renames temporary `t` onto `name`; a directory in the way is removed
/// first (it was removed inside).
fn place(cx: &mut Ctx, h: RawFd, t: &Path, name: &Path, r: &Path) -> io::Result<()> {
    match renameat(h, t, name) {
        Ok(()) => Ok(()),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EISDIR | libc::ENOTEMPTY | libc::EEXIST)
            ) =>
        {
            remove_host(cx, h, name, r);
            renameat(h, t, name).inspect_err(|_| {
                let _ = unlinkat(h, t, false);
            })
        }
        Err(e) => {
            let _ = unlinkat(h, t, false);
            Err(e)
        }
    }
}

fn apply_file(
    cx: &mut Ctx,
    udir: RawFd,
    hdir: &std::rc::Rc<OwnedFd>,
    name: &Path,
    rel: &Path,
    st: &libc::stat,
) {
    let r = rel.join(name);
    let h = hdir.as_raw_fd();
    if cx.layer.rules.holds_kept(&r) {
        cx.refuse(&r, "file", "protected path");
        return;
    }
    let mut mode = st.st_mode & 0o1777;
    if st.st_mode & (libc::S_ISUID | libc::S_ISGID) != 0 {
        cx.refuse(
            &r,
            "setuid file",
            "set-user/group-ID bits are never applied",
        );
        mode &= 0o1777;
    }
    // A second name of an inode already applied: a hard link there too.
    if st.st_nlink > 1
        && let Some((d, first)) = cx.links.get(&st.st_ino).cloned()
    {
        let res = (|| {
            let t = cx.temp(h, rel)?;
            let (a, b) = (cstr(Path::new(&first))?, cstr(&t)?);
            // SAFETY: valid C strings; no AT_SYMLINK_FOLLOW.
            cvt(unsafe { libc::linkat(d.as_raw_fd(), a.as_ptr(), h, b.as_ptr(), 0) })?;
            place(cx, h, &t, name, &r)
        })();
        match res {
            Ok(()) => cx.report.links += 1,
            Err(e) => cx.error(&r, "link", &e),
        }
        return;
    }
    let res = (|| -> io::Result<u64> {
        if st.st_mode & 0o400 == 0 {
            let _ = crate::sys::fchmodat(udir, name, (st.st_mode & 0o7777) | 0o400);
        }
        let src = openat(udir, name, libc::O_RDONLY | libc::O_NOFOLLOW, 0)?;
        let t = cx.temp(h, rel)?;
        let dst = openat(
            h,
            &t,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            0o600,
        )?;
        let from = std::fs::File::from(src);
        let to = std::fs::File::from(dst);
        let mut unlimited = u64::MAX;
        let res = crate::quarantine::copy_sparse_fds(&from, &to, &mut unlimited)
            .and_then(|_| Ok(from.metadata()?.len()))
            .inspect(|_| {
                copy_xattrs(from.as_raw_fd(), to.as_raw_fd());
                set_attrs(to.as_raw_fd(), st, mode);
            });
        let n = match res {
            Ok(n) => n,
            Err(e) => {
                let _ = unlinkat(h, &t, false);
                return Err(e);
            }
        };
        drop(to);
        place(cx, h, &t, name, &r)?;
        Ok(n)
    })();
    match res {
        Ok(n) => {
            cx.report.files += 1;
            cx.report.bytes += n;
            if st.st_nlink > 1 {
                cx.links
                    .insert(st.st_ino, (hdir.clone(), name.as_os_str().to_owned()));
            }
        }
        Err(e) => cx.error(&r, "write", &e),
    }
}

/// Removes `name` in `h` (a directory recursively), never following a
/// symlink and never removing what the rules keep.
fn remove_host(cx: &mut Ctx, h: RawFd, name: &Path, r: &Path) {
    let st = match lstatat(h, name) {
        Ok(s) => s,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return,
        Err(e) => return cx.error(r, "stat", &e),
    };
    if cx.layer.rules.holds_kept(r) {
        return cx.refuse(r, kind_of(&st), "protected path");
    }
    if crate::sys::is_dir(&st) {
        let d = match openat(
            h,
            name,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        ) {
            Ok(d) => d,
            Err(e) => return cx.error(r, "open", &e),
        };
        match names(d.as_raw_fd()) {
            Ok(ns) => {
                for c in ns {
                    remove_host(cx, d.as_raw_fd(), Path::new(&c), &r.join(&c));
                }
            }
            Err(e) => return cx.error(r, "list", &e),
        }
        match unlinkat(h, name, true) {
            Ok(()) => cx.report.removed += 1,
            Err(e) => cx.error(r, "rmdir", &e),
        }
    } else {
        match unlinkat(h, name, false) {
            Ok(()) => cx.report.removed += 1,
            Err(e) => cx.error(r, "unlink", &e),
        }
    }
}

// ---- watching the budget -----------------------------------------------

/// "Full": less free space than this, or no free inode.
pub const FULL_BELOW: u64 = 64 * 1024;

/// Bytes and inodes under one upper directory (best effort).
pub fn usage(dir: RawFd) -> (u64, u64) {
    let (mut bytes, mut inodes) = (0u64, 0u64);
    let Ok(ns) = names(dir) else {
        return (0, 0);
    };
    for n in ns {
        let p = Path::new(&n);
        let Ok(st) = lstatat(dir, p) else { continue };
        inodes += 1;
        bytes += st.st_blocks as u64 * 512;
        if crate::sys::is_dir(&st)
            && let Ok(d) = openat(
                dir,
                p,
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                0,
            )
        {
            let (b, i) = usage(d.as_raw_fd());
            bytes += b;
            inodes += i;
        }
    }
    (bytes, inodes)
}

/// Watches the budget's tmpfs from the outer sbx-fs.
pub struct Watch {
    pub fd: OwnedFd,
    pub budget: Budget,
    pub layers: Vec<Layer>,
    alerted: Vec<bool>,
    last: Vec<(u64, u64)>,
}

impl Watch {
    pub fn new(fd: OwnedFd, budget: Budget, layers: Vec<Layer>) -> Watch {
        let n = layers.len();
        Watch {
            fd,
            budget,
            layers,
            alerted: vec![false; n],
            last: vec![(0, 0); n],
        }
    }

    /// Checks once: when the budget is used up, the bind that grew most
    /// since the last time gets `write_quota_exceeded` (once per bind).
    pub fn check(&mut self) {
        // SAFETY: st is a plain struct filled by the kernel.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: a valid fd and a pointer to st.
        if unsafe { libc::fstatfs(self.fd.as_raw_fd(), &mut st) } != 0 {
            return;
        }
        let free = st.f_bavail * st.f_bsize as u64;
        let bytes_full = free < FULL_BELOW.min(self.budget.bytes / 2) || st.f_bavail == 0;
        let inodes_full = st.f_ffree == 0;
        if !bytes_full && !inodes_full {
            return;
        }
        let mut best: Option<(usize, u64, u64, i128)> = None;
        for (i, l) in self.layers.iter().enumerate() {
            let Ok(u) = openat(
                self.fd.as_raw_fd(),
                Path::new(&upper_name(l.k)),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                0,
            ) else {
                continue;
            };
            let (b, n) = usage(u.as_raw_fd());
            let grew = if bytes_full {
                i128::from(b) - i128::from(self.last[i].0)
            } else {
                i128::from(n) - i128::from(self.last[i].1)
            };
            self.last[i] = (b, n);
            if best.is_none_or(|x| grew > x.3) {
                best = Some((i, b, n, grew));
            }
        }
        let Some((i, b, n, _)) = best else { return };
        if self.alerted[i] {
            return;
        }
        self.alerted[i] = true;
        audit::emit(
            "write_quota_exceeded",
            Severity::Alert,
            serde_json::json!({
                "bind": self.layers[i].host.display().to_string(),
                "resource": if bytes_full { "bytes" } else { "inodes" },
                "used_bytes": b,
                "used_inodes": n,
                "quota_bytes": self.budget.bytes,
                "quota_inodes": self.budget.inodes,
            }),
        );
    }

    /// After the sandbox: applies every layer, one event per bind.
    pub fn apply_all(&mut self, journal: Option<&Journal>) {
        self.check();
        for l in &self.layers {
            // A bind root the sandbox made unreadable is still the caller's.
            let un = PathBuf::from(upper_name(l.k));
            if let Ok(st) = lstatat(self.fd.as_raw_fd(), &un)
                && st.st_mode & 0o500 != 0o500
            {
                let _ =
                    crate::sys::fchmodat(self.fd.as_raw_fd(), &un, (st.st_mode & 0o7777) | 0o700);
            }
            let u = match openat(
                self.fd.as_raw_fd(),
                Path::new(&upper_name(l.k)),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                0,
            ) {
                Ok(u) => u,
                Err(e) => {
                    audit::emit(
                        "write_apply_failed",
                        Severity::Warn,
                        serde_json::json!({ "bind": l.host.display().to_string(), "op": "open upper", "error": e.to_string() }),
                    );
                    continue;
                }
            };
            match apply(u.as_raw_fd(), l, journal) {
                Ok(rep) => audit::emit(
                    "write_quota_applied",
                    Severity::Info,
                    serde_json::json!({ "bind": l.host.display().to_string(), "report": rep }),
                ),
                Err(e) => audit::emit(
                    "write_apply_failed",
                    Severity::Warn,
                    serde_json::json!({ "bind": l.host.display().to_string(), "op": "apply", "error": e.to_string() }),
                ),
            }
        }
    }
}

// ---- project quotas: detection only --------------------------------------

/// Whether the file system holding `path` offers project quotas that sbx-fs
/// could use (ext4 or XFS mounted with prjquota/pquota, and root). The
/// text says why not.
pub fn prjquota(path: &Path) -> Result<(), String> {
    let Ok(mi) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Err("no /proc/self/mountinfo".into());
    };
    let mut best: Option<(usize, String, String, String)> = None;
    for line in mi.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let Some(dash) = f.iter().position(|x| *x == "-") else {
            continue;
        };
        if f.len() < dash + 4 || f.len() < 5 {
            continue;
        }
        let mp = f[4].replace("\\040", " ");
        if !path.starts_with(&mp) {
            continue;
        }
        let len = mp.len();
        if best.as_ref().is_none_or(|b| len >= b.0) {
            best = Some((len, mp, f[dash + 1].to_string(), f[dash + 3].to_string()));
        }
    }
    let Some((_, mp, fstype, opts)) = best else {
        return Err(format!("no mount holds {}", path.display()));
    };
    let has = opts
        .split(',')
        .any(|o| matches!(o, "prjquota" | "pquota" | "prjjquota" | "pqnoenforce"));
    if !matches!(fstype.as_str(), "ext4" | "xfs") {
        return Err(format!("{mp} is {fstype} (no project quotas)"));
    }
    if !has {
        return Err(format!("{mp} ({fstype}) is mounted without prjquota"));
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(format!(
            "{mp} ({fstype}) has prjquota, but setting project ids needs root"
        ));
    }
    Err(format!(
        "{mp} ({fstype}) has prjquota; the project-quota mode is not implemented yet"
    ))
}

#[cfg(test)]
mod tests;
