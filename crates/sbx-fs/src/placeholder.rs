//! Mount points sbx-fs must create in the user's own tree (a destination
//! nested in a bind, an invariant or denied path that does not exist yet).
//!
//! They are created on the host before the sandbox starts, walking from the
//! bind source's fd without following symlinks, and removed when it ends:
//! by sbx-fs itself, and by a small reaper process, forked right after they
//! were created, that watches sbx-fs through a pidfd and removes them when
//! sbx-fs dies without having done so (SIGKILL). A placeholder is removed
//! only when it is still the very inode that was created (and, for a
//! directory, still empty).

use sbx_core::guardian::{Ending, Guardian, Watch};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Component, Path, PathBuf};

use crate::plan::{Kind, Source};
use crate::sys;

#[derive(Debug, thiserror::Error)]
pub enum PlaceholderError {
    #[error("create mount point {path} on the host")]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("mount point {path} on the host is not a directory or is a symlink (refused)")]
    NotDir { path: PathBuf },
    #[error("start the placeholder reaper")]
    Reaper(#[source] io::Error),
}

#[derive(Debug)]
pub struct Placeholder {
    /// The bind source the placeholder lies in (its lock serialises
    /// sandboxes creating, adopting and removing placeholders there).
    root: OwnedFd,
    parent: OwnedFd,
    name: PathBuf,
    dir: bool,
    dev: u64,
    ino: u64,
    pub shown: PathBuf,
    /// A shared flock held on the placeholder while this sandbox uses it
    /// (concurrent sandboxes of one project share placeholders: the last
    /// one to finish removes it).
    lock: Option<OwnedFd>,
}

#[derive(Debug, Default)]
pub struct Placeholders {
    pub list: Vec<Placeholder>,
    reaper: Option<Guardian>,
    /// More fds the reaper keeps open for its `after` (the write budget's
    /// apply journal).
    pub reaper_fds: Vec<RawFd>,
}

impl Placeholders {
    /// Makes sure `rel` exists beneath the bind source `s`, creating (and
    /// recording) every missing component; the last one as `kind`.
    pub fn ensure(&mut self, s: &Source, rel: &Path, kind: Kind) -> Result<(), PlaceholderError> {
        static REAPED: std::sync::Once = std::sync::Once::new();
        REAPED.call_once(|| {
            reap_temporaries();
        });
        let comps: Vec<&std::ffi::OsStr> = rel
            .components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n),
                _ => None,
            })
            .collect();
        // One sandbox at a time creates, adopts or removes the placeholders
        // of a bind source (best effort: see DirLock).
        let _guard = DirLock::exclusive(s.fd.as_raw_fd());
        let mut cur: Option<OwnedFd> = None;
        let mut shown = s.path.clone();
        for (i, c) in comps.iter().enumerate() {
            let last = i + 1 == comps.len();
            let dirfd = cur.as_ref().map_or(s.fd.as_raw_fd(), |f| f.as_raw_fd());
            shown.push(c);
            let name = Path::new(c);
            let err = |source| PlaceholderError::Create {
                path: shown.clone(),
                source,
            };
            let st = match sys::lstatat(dirfd, name) {
                Ok(st) => {
                    if sys::is_symlink(&st) || (!last && !sys::is_dir(&st)) {
                        return Err(PlaceholderError::NotDir { path: shown });
                    }
                    if !is_marked(dirfd, name, sys::is_dir(&st)) {
                        None
                    } else {
                        // Another sandbox's placeholder: use it too.
                        Some((st, sys::is_dir(&st)))
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    let dir = !last || kind == Kind::Dir;
                    match create_marked(dirfd, name, dir) {
                        Ok(()) => Some((sys::lstatat(dirfd, name).map_err(err)?, dir)),
                        // Another sandbox (or the user) made it meanwhile.
                        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                            let st = sys::lstatat(dirfd, name).map_err(err)?;
                            if sys::is_symlink(&st) || (!last && !sys::is_dir(&st)) {
                                return Err(PlaceholderError::NotDir { path: shown });
                            }
                            is_marked(dirfd, name, sys::is_dir(&st))
                                .then_some((st, sys::is_dir(&st)))
                        }
                        Err(e) => return Err(err(e)),
                    }
                }
                Err(e) => return Err(err(e)),
            };
            if let Some((st, dir)) = st {
                let parent = sys::openat2(
                    dirfd,
                    Path::new("."),
                    libc::O_PATH | libc::O_DIRECTORY,
                    0,
                    0,
                )
                .map_err(err)?;
                // SAFETY: flock on an fd the OwnedFd f keeps open for the call.
                let lock = open_real(dirfd, name, dir).ok().filter(|f| unsafe {
                    libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) == 0
                });
                let root = sys::openat2(
                    s.fd.as_raw_fd(),
                    Path::new("."),
                    libc::O_PATH | libc::O_DIRECTORY,
                    0,
                    0,
                )
                .map_err(err)?;
                self.list.push(Placeholder {
                    root,
                    parent,
                    name: name.to_path_buf(),
                    dir,
                    dev: st.st_dev,
                    ino: st.st_ino,
                    shown: shown.clone(),
                    lock,
                });
            }
            if !last {
                cur = Some(
                    sys::open_beneath(dirfd, name, libc::O_PATH | libc::O_DIRECTORY)
                        .map_err(err)?,
                );
            }
        }
        Ok(())
    }

    /// Every fd the placeholders hold (the sandbox's init closes its
    /// copies at once, or a placeholder lock would outlive sbx-fs).
    pub fn fds(&self) -> Vec<RawFd> {
        let mut v = Vec::new();
        for p in &self.list {
            v.push(p.root.as_raw_fd());
            v.push(p.parent.as_raw_fd());
            if let Some(l) = &p.lock {
                v.push(l.as_raw_fd());
            }
        }
        v.extend(self.reaper.as_ref().and_then(|g| g.fd()));
        v
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Forks the reaper (when there is anything to reap). Call after every
    /// placeholder exists and before the namespaces are made.
    pub fn start_reaper(&mut self) -> Result<(), PlaceholderError> {
        self.start_reaper_with(None)
    }

    /// [`Self::start_reaper`], with `after` run by the reaper when sbx-fs
    /// dies without having finished: once the sandbox (whose init's pid
    /// [`Self::tell_sandbox`] gave) is gone, after the placeholders were
    /// removed (the end sweep; see [`crate::protect`]).
    pub fn start_reaper_with(
        &mut self,
        after: Option<Box<dyn FnOnce()>>,
    ) -> Result<(), PlaceholderError> {
        if self.list.is_empty() && after.is_none() {
            return Ok(());
        }
        // SAFETY: no thread runs yet (the guard server starts later).
        let g = unsafe { Guardian::spawn(|w| reaper(w, &self.list, &self.reaper_fds, after)) };
        self.reaper = Some(g.map_err(PlaceholderError::Reaper)?);
        Ok(())
    }

    /// Tells the reaper the pid of the sandbox's init, whose end it waits
    /// for before running its `after`.
    pub fn tell_sandbox(&self, pid: libc::pid_t) {
        if let Some(g) = &self.reaper {
            let _ = g.send(&pid.to_ne_bytes());
        }
    }

    /// Removes the placeholders (deepest first) and releases the reaper.
    /// Returns the paths that could not be removed.
    pub fn cleanup(&mut self) -> Vec<PathBuf> {
        // Our own shared locks go first, or they would block our removal.
        // LOCK_UN, not just close: the reaper may still hold a copy of the
        // same open file description.
        for p in &mut self.list {
            if let Some(l) = p.lock.take() {
                // SAFETY: l is an open fd, closed by its OwnedFd right after.
                unsafe { libc::flock(l.as_raw_fd(), libc::LOCK_UN) };
            }
        }
        let left = remove_all(&self.list, std::time::Duration::ZERO);
        self.list.clear();
        if let Some(g) = self.reaper.take() {
            g.release();
        }
        left
    }
}

/// Removes each placeholder that is still the inode created, still
/// marked, and that no other sandbox holds (deepest first). Returns those
/// that could not be removed (in use elsewhere is not a failure).
/// `settle`: how long a placeholder whose lock is still shared may take to
/// be released. The reaper runs right after sbx-fs was killed, while the
/// sandbox's own processes (which hold the shared lock too) are still
/// dying: it waits for them, boundedly, rather than taking them for another
/// live sandbox. sbx-fs's own clean-up runs after the sandbox ended: zero.
fn remove_all(list: &[Placeholder], settle: std::time::Duration) -> Vec<PathBuf> {
    let deadline = std::time::Instant::now() + settle;
    let mut left = Vec::new();
    for p in list.iter().rev() {
        let fd = p.parent.as_raw_fd();
        let _guard = DirLock::exclusive(p.root.as_raw_fd());
        match sys::lstatat(fd, &p.name) {
            Ok(st) if st.st_dev == p.dev && st.st_ino == p.ino => {
                // Still used by another sandbox: it removes it.
                let free = match open_real(fd, &p.name, p.dir) {
                    Ok(f) => loop {
                        // SAFETY: flock on an fd the OwnedFd f keeps open for the call.
                        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0
                        {
                            break true;
                        }
                        if std::time::Instant::now() >= deadline {
                            break false;
                        }
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    },
                    Err(_) => true,
                };
                if free && sys::unlinkat(fd, &p.name, p.dir).is_err() {
                    left.push(p.shown.clone());
                }
            }
            _ => {}
        }
    }
    left
}

const MARK: &std::ffi::CStr = c"user.sbx-fs.placeholder";

/// Opens a placeholder for flock/xattr (not O_PATH), without following a
/// symlink.
fn open_real(dir: RawFd, name: &Path, is_dir: bool) -> io::Result<OwnedFd> {
    let mut flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
    if is_dir {
        flags |= libc::O_DIRECTORY;
    }
    sys::openat2(
        dir,
        name,
        flags,
        0,
        sys::RESOLVE_BENEATH | sys::RESOLVE_NO_SYMLINKS,
    )
}

/// Creates the placeholder `name` already marked: made and marked under a
/// temporary name, then renamed into place (RENAME_NOREPLACE). Another
/// sandbox planning meanwhile never sees it unmarked (it would take it for
/// the user's own entry and plan mount points inside it).
fn create_marked(dir: RawFd, name: &Path, is_dir: bool) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let mut tmp = std::ffi::OsString::from(".sbx-fs-new-");
    tmp.push(std::process::id().to_string());
    tmp.push("-");
    tmp.push(name.as_os_str());
    let tmp = PathBuf::from(tmp);
    // Registered (sbx_core::registry) while it exists under the temporary
    // name: sbx-fs killed before the rename leaves it to the next run,
    // whatever its TMPDIR, instead of in the user's project for ever.
    let _entry = std::fs::read_link(format!("/proc/self/fd/{dir}"))
        .ok()
        .and_then(|d| sbx_core::registry::register(NEW_KIND, &d.join(&tmp)).ok());
    if is_dir {
        sys::mkdirat(dir, &tmp, 0o755)?;
    } else {
        sys::mkfileat(dir, &tmp, 0o644)?;
    }
    mark(dir, &tmp, is_dir);
    sbx_core::registry::test_kill_point("fs-placeholder-tmp");
    let from = std::ffi::CString::new(tmp.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let to = std::ffi::CString::new(name.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: from and to are NUL-ended and alive for the call; dir is open.
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            dir,
            from.as_ptr(),
            dir,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        let _ = sys::unlinkat(dir, &tmp, is_dir);
        return Err(e);
    }
    Ok(())
}

/// The registry kind of placeholders under their temporary name.
const NEW_KIND: &str = "sbx-fs-new";

/// Removes the temporary placeholders of sbx-fs runs that died between
/// creating one and renaming it: only an empty directory or an empty file
/// whose name is `.sbx-fs-new-*`, never through a symlink.
pub fn reap_temporaries() -> Vec<PathBuf> {
    sbx_core::registry::reap(NEW_KIND, |p| {
        let ours = p
            .file_name()
            .is_some_and(|n| n.as_encoded_bytes().starts_with(b".sbx-fs-new-"));
        if !ours {
            return Ok(());
        }
        let m = std::fs::symlink_metadata(p)?;
        if m.is_dir() {
            std::fs::remove_dir(p)
        } else if m.is_file() && m.len() == 0 {
            std::fs::remove_file(p)
        } else {
            Ok(())
        }
    })
}

/// Marks a new placeholder (best effort: a filesystem without user
/// xattrs leaves it unmarked, so another sandbox would not share it).
fn mark(dir: RawFd, name: &Path, is_dir: bool) {
    if let Ok(f) = open_real(dir, name, is_dir) {
        // SAFETY: f keeps the fd open; MARK is NUL-ended; the value is a live 1-byte buffer.
        unsafe { libc::fsetxattr(f.as_raw_fd(), MARK.as_ptr(), b"1".as_ptr().cast(), 1, 0) };
    }
}

/// Whether `path` is a placeholder of some sandbox (for planning: a
/// placeholder is treated as missing).
pub fn is_placeholder(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    let mut b = [0u8; 4];
    // SAFETY: c and MARK are NUL-ended; b is a live 4-byte buffer.
    let n = unsafe { libc::lgetxattr(c.as_ptr(), MARK.as_ptr(), b.as_mut_ptr().cast(), b.len()) };
    n == 1 && b[0] == b'1'
}

fn is_marked(dir: RawFd, name: &Path, is_dir: bool) -> bool {
    let Ok(f) = open_real(dir, name, is_dir) else {
        return false;
    };
    let mut b = [0u8; 4];
    let n =
        // SAFETY: f keeps the fd open; MARK is NUL-ended; b is a live 4-byte buffer.
        unsafe { libc::fgetxattr(f.as_raw_fd(), MARK.as_ptr(), b.as_mut_ptr().cast(), b.len()) };
    n == 1 && b[0] == b'1'
}

/// An exclusive flock on a bind source directory, released on drop. Best
/// effort: a directory that cannot be opened, or that stays locked for a
/// second (it is itself another sandbox's placeholder, held while that
/// sandbox runs), is used unlocked rather than waited for.
struct DirLock(Option<OwnedFd>);

impl DirLock {
    fn exclusive(dir: RawFd) -> DirLock {
        let Ok(f) = sys::openat2(
            dir,
            Path::new("."),
            libc::O_RDONLY | libc::O_DIRECTORY,
            0,
            0,
        ) else {
            return DirLock(None);
        };
        for _ in 0..1000 {
            // SAFETY: flock on an fd the OwnedFd f keeps open for the call.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return DirLock(Some(f));
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        DirLock(None)
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        if let Some(f) = &self.0 {
            // SAFETY: flock on an fd the OwnedFd keeps open for the call.
            unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_UN) };
        }
    }
}

/// How long the reaper waits for a dying sandbox to release the shared lock.
const REAPER_SETTLE: std::time::Duration = std::time::Duration::from_secs(20);

/// The reaper (a [`Guardian`]): detached from the terminal, holding only
/// what it needs, it waits for sbx-fs to exit and removes what is left.
/// Its exit code.
fn reaper(
    watch: Watch,
    list: &[Placeholder],
    extra: &[RawFd],
    after: Option<Box<dyn FnOnce()>>,
) -> i32 {
    // SAFETY: plain syscalls on our own process: a new session, and "/"
    // (a NUL-ended literal) as its working directory.
    unsafe {
        libc::setsid();
        libc::chdir(c"/".as_ptr());
    }
    sbx_core::fds::stdio_to_dev_null();
    let mut keep: Vec<RawFd> = list
        .iter()
        .flat_map(|p| [p.parent.as_raw_fd(), p.root.as_raw_fd()])
        .collect();
    keep.extend(watch.fds());
    keep.extend_from_slice(extra);
    // The end sweep's alerts go to the audit log.
    keep.extend(sbx_core::audit::get().and_then(|a| a.raw_fd()));
    sbx_core::fds::close_all_except(&keep);
    // What sbx-fs sent: init's pid after the clone.
    let Ending::OwnerGone(msgs) = watch.wait() else {
        return 0;
    };
    let sandbox = msgs
        .iter()
        .rev()
        .find_map(|m| <[u8; 4]>::try_from(&m[..]).ok().map(i32::from_ne_bytes));
    // The sandbox's init ends after every process of its PID namespace
    // (the kernel kills them, then reaps them, before init's exit is
    // seen): wait for it, boundedly, so nothing of it runs meanwhile.
    if let Some(pid) = sandbox
        && let Ok(fd) = sys::pidfd_open(pid)
    {
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd on the stack, for the call only.
        unsafe { libc::poll(&mut p, 1, REAPER_SETTLE.as_millis() as i32) };
    } else if sandbox.is_none() && after.is_some() {
        // sbx-fs died before it named the sandbox: init dies of
        // PDEATHSIG; give it time to go.
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
    let left = remove_all(list, REAPER_SETTLE);
    if !left.is_empty() {
        // Said, not swallowed: the user's tree keeps an entry sbx made.
        sbx_core::audit::emit(
            "cleanup_incomplete",
            sbx_core::audit::Severity::Warn,
            serde_json::json!({
                "by": "reaper",
                "left": left.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            }),
        );
    }
    if let Some(f) = after {
        f();
    }
    0
}
