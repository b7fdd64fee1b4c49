//! Mount points sbx-fs must create in the user's own tree (a destination
//! nested in a bind, an invariant or denied path that does not exist yet).
//!
//! They are created on the host before the sandbox starts, walking from the
//! bind source's fd without following symlinks, and removed when it ends:
//! by sbx-fs itself, and by a small reaper process that watches sbx-fs
//! through a pidfd and removes them when sbx-fs dies without having done so
//! (SIGKILL). The reaper is forked before the first placeholder is made,
//! and each one is announced to it (its directory's fd, name, inode) before
//! it takes its final name: there is no moment at which a placeholder exists
//! in the user's tree and no reaper knows of it. A placeholder is removed
//! only when it is still the very inode that was created (and, for a
//! directory, still empty).

use sbx_core::guardian::{Ending, Guardian, Watch};
use sbx_core::passfd;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
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
    /// The temporary name it was made under (announced to the reaper
    /// before the rename into place; see `create_marked`).
    tmp: Option<PathBuf>,
    pub shown: PathBuf,
    /// A shared flock held on the placeholder while this sandbox uses it
    /// (concurrent sandboxes of one project share placeholders: the last
    /// one to finish removes it).
    lock: Option<OwnedFd>,
}

#[derive(Default)]
pub struct Placeholders {
    pub list: Vec<Placeholder>,
    reaper: Option<Reaper>,
    /// What the reaper runs when sbx-fs dies without having finished (see
    /// [`Self::new`]); taken when it is forked.
    after: Option<Box<dyn FnOnce()>>,
    /// More fds the reaper keeps open for its `after` (the write budget's
    /// apply journal).
    reaper_fds: Vec<RawFd>,
}

/// The running reaper: its guardian pipe, and the feed on which each
/// placeholder is announced with its fds.
struct Reaper {
    guardian: Guardian,
    feed: OwnedFd,
}

impl std::fmt::Debug for Placeholders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Placeholders")
            .field("list", &self.list)
            .field("reaper", &self.reaper.as_ref().map(|r| r.guardian.pid()))
            .finish_non_exhaustive()
    }
}

impl Placeholders {
    /// No placeholder yet. `after` is run by the reaper when sbx-fs dies
    /// without having finished: once the sandbox (whose init's pid
    /// [`Self::tell_sandbox`] gave) is gone, after the placeholders were
    /// removed (the end sweep; see [`crate::protect`]); `reaper_fds` are
    /// the fds it needs, kept open in the reaper.
    pub fn new(after: Option<Box<dyn FnOnce()>>, reaper_fds: Vec<RawFd>) -> Placeholders {
        Placeholders {
            after,
            reaper_fds,
            ..Placeholders::default()
        }
    }

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
                        Some((st, sys::is_dir(&st), None))
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    let dir = !last || kind == Kind::Dir;
                    let (root, parent) = dir_fds(s, dirfd).map_err(err)?;
                    self.reaper().map_err(err)?;
                    let made = create_marked(dirfd, name, dir, |tmp, st| {
                        self.announce(&root, &parent, name, Some(tmp), st, dir, &shown)
                    });
                    match made {
                        Ok(()) => {
                            let st = sys::lstatat(dirfd, name).map_err(err)?;
                            Some((st, dir, Some((root, parent))))
                        }
                        // Another sandbox (or the user) made it meanwhile.
                        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                            let st = sys::lstatat(dirfd, name).map_err(err)?;
                            if sys::is_symlink(&st) || (!last && !sys::is_dir(&st)) {
                                return Err(PlaceholderError::NotDir { path: shown });
                            }
                            is_marked(dirfd, name, sys::is_dir(&st)).then_some((
                                st,
                                sys::is_dir(&st),
                                None,
                            ))
                        }
                        Err(e) => return Err(err(e)),
                    }
                }
                Err(e) => return Err(err(e)),
            };
            if let Some((st, dir, made)) = st {
                // Made: announced already. Adopted: announced now, the
                // reaper removes it too if this sandbox is its last user.
                let (root, parent) = match made {
                    Some(fds) => fds,
                    None => {
                        let (root, parent) = dir_fds(s, dirfd).map_err(err)?;
                        self.reaper().map_err(err)?;
                        self.announce(&root, &parent, name, None, &st, dir, &shown)
                            .map_err(err)?;
                        (root, parent)
                    }
                };
                // SAFETY: flock on an fd the OwnedFd f keeps open for the call.
                let lock = open_real(dirfd, name, dir).ok().filter(|f| unsafe {
                    libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) == 0
                });
                self.list.push(Placeholder {
                    root,
                    parent,
                    name: name.to_path_buf(),
                    dir,
                    dev: st.st_dev,
                    ino: st.st_ino,
                    tmp: None,
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
        if let Some(r) = &self.reaper {
            v.extend(r.guardian.fd());
            v.push(r.feed.as_raw_fd());
        }
        v
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Makes sure the reaper runs when it has anything to do: placeholders
    /// (it was forked before the first one) or an `after`. Call after
    /// every placeholder exists and before the namespaces are made.
    pub fn start_reaper(&mut self) -> Result<(), PlaceholderError> {
        if self.after.is_some() {
            self.reaper().map_err(PlaceholderError::Reaper)?;
        }
        Ok(())
    }

    /// The reaper's feed, forking the reaper first if it does not run yet.
    fn reaper(&mut self) -> io::Result<BorrowedFd<'_>> {
        if self.reaper.is_none() {
            // Guardian::spawn's promise, checked rather than assumed: the
            // guard server's threads start later.
            if !sbx_core::guardian::single_threaded() {
                return Err(io::Error::other(
                    "sbx-fs runs more than one thread (cannot fork the reaper safely)",
                ));
            }
            let (feed, rx) = passfd::seqpacket_pair()?;
            let after = self.after.take();
            let extra = self.reaper_fds.clone();
            // SAFETY: one thread, checked just above.
            let guardian = unsafe { Guardian::spawn(move |w| reaper(w, rx, &extra, after)) }?;
            self.reaper = Some(Reaper { guardian, feed });
        }
        Ok(self
            .reaper
            .as_ref()
            .map(|r| r.feed.as_fd())
            .expect("just set"))
    }

    /// Tells the reaper about one placeholder (or the temporary name it
    /// is made under) before it takes its place, with the fds the reaper
    /// removes it through.
    #[allow(clippy::too_many_arguments)]
    fn announce(
        &self,
        root: &OwnedFd,
        parent: &OwnedFd,
        name: &Path,
        tmp: Option<&Path>,
        st: &libc::stat,
        dir: bool,
        shown: &Path,
    ) -> io::Result<()> {
        let Some(r) = &self.reaper else {
            return Err(io::Error::other("the placeholder reaper is not running"));
        };
        let rec = Record {
            dir,
            dev: st.st_dev,
            ino: st.st_ino,
            name,
            tmp,
            shown,
        };
        passfd::send_fds(
            r.feed.as_fd(),
            &rec.encode(),
            &[root.as_fd(), parent.as_fd()],
        )?;
        Ok(())
    }

    /// Tells the reaper the pid of the sandbox's init, whose end it waits
    /// for before it removes anything or runs its `after`.
    pub fn tell_sandbox(&self, pid: libc::pid_t) {
        if let Some(r) = &self.reaper {
            let _ = r.guardian.send(&pid.to_ne_bytes());
        }
    }

    /// Removes the placeholders (deepest first) and releases the reaper.
    /// Returns the paths that could not be removed.
    pub fn cleanup(&mut self) -> Vec<PathBuf> {
        // Our own shared locks go first, or they would block our removal.
        // LOCK_UN, not just close: a sandbox's init may still be closing
        // its copy of the same open file description.
        for p in &mut self.list {
            if let Some(l) = p.lock.take() {
                // SAFETY: l is an open fd, closed by its OwnedFd right after.
                unsafe { libc::flock(l.as_raw_fd(), libc::LOCK_UN) };
            }
        }
        let left = remove_all(&self.list, std::time::Duration::ZERO);
        self.list.clear();
        if let Some(r) = self.reaper.take() {
            // Reaped here: an orphaned zombie is init's to reap, and an
            // enclosing sbx-cgroup waits until it has.
            r.guardian.release_and_reap();
        }
        left
    }
}

/// The bind source's and the parent directory's fds (O_PATH), through
/// which a placeholder in `dirfd` is removed later.
fn dir_fds(s: &Source, dirfd: RawFd) -> io::Result<(OwnedFd, OwnedFd)> {
    let dot = Path::new(".");
    let root = sys::openat2(
        s.fd.as_raw_fd(),
        dot,
        libc::O_PATH | libc::O_DIRECTORY,
        0,
        0,
    )?;
    let parent = sys::openat2(dirfd, dot, libc::O_PATH | libc::O_DIRECTORY, 0, 0)?;
    Ok((root, parent))
}

/// One placeholder as announced to the reaper (its two fds travel beside
/// it): kind, inode, then name, temporary name and shown path, each ended
/// by a NUL (none of them holds one).
struct Record<'a> {
    dir: bool,
    dev: u64,
    ino: u64,
    name: &'a Path,
    tmp: Option<&'a Path>,
    shown: &'a Path,
}

impl Record<'_> {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(64 + self.shown.as_os_str().len());
        b.push(u8::from(self.dir));
        b.extend_from_slice(&self.dev.to_ne_bytes());
        b.extend_from_slice(&self.ino.to_ne_bytes());
        for p in [Some(self.name), self.tmp, Some(self.shown)] {
            b.extend_from_slice(p.map_or(&[][..], |p| p.as_os_str().as_encoded_bytes()));
            b.push(0);
        }
        b
    }

    /// The reaper's side: the placeholder to remove, from one message and
    /// its fds (root, parent). None for anything malformed.
    fn decode(b: &[u8], fds: Vec<OwnedFd>) -> Option<Placeholder> {
        use std::os::unix::ffi::OsStrExt;
        let (&dir, rest) = b.split_first()?;
        let dev = u64::from_ne_bytes(rest.get(..8)?.try_into().ok()?);
        let ino = u64::from_ne_bytes(rest.get(8..16)?.try_into().ok()?);
        let mut parts = rest.get(16..)?.split(|c| *c == 0);
        let mut path = || {
            parts
                .next()
                .map(|p| PathBuf::from(std::ffi::OsStr::from_bytes(p)))
        };
        let (name, tmp, shown) = (path()?, path()?, path().unwrap_or_default());
        let [root, parent]: [OwnedFd; 2] = fds.try_into().ok()?;
        if name.as_os_str().is_empty() || name.components().count() != 1 {
            return None;
        }
        Some(Placeholder {
            root,
            parent,
            name,
            dir: dir != 0,
            dev,
            ino,
            tmp: (!tmp.as_os_str().is_empty()).then_some(tmp),
            shown,
            lock: None,
        })
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
        // Its final name, or (sbx-fs killed before the rename) the
        // temporary one: whichever is still the inode that was made.
        let Some(name) = std::iter::once(&p.name)
            .chain(&p.tmp)
            .find(|n| sys::lstatat(fd, n).is_ok_and(|st| st.st_dev == p.dev && st.st_ino == p.ino))
        else {
            continue;
        };
        // Still used by another sandbox: it removes it.
        let free = match open_real(fd, name, p.dir) {
            Ok(f) => loop {
                // SAFETY: flock on an fd the OwnedFd f keeps open for the call.
                if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                    break true;
                }
                if std::time::Instant::now() >= deadline {
                    break false;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            },
            Err(_) => true,
        };
        if free && sys::unlinkat(fd, name, p.dir).is_err() {
            left.push(p.shown.clone());
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
fn create_marked(
    dir: RawFd,
    name: &Path,
    is_dir: bool,
    announce: impl FnOnce(&Path, &libc::stat) -> io::Result<()>,
) -> io::Result<()> {
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
    // The reaper learns of it before it has its final name (then the
    // registry entry is a second net only).
    if let Err(e) = sys::lstatat(dir, &tmp).and_then(|st| announce(&tmp, &st)) {
        let _ = sys::unlinkat(dir, &tmp, is_dir);
        return Err(e);
    }
    sbx_core::registry::test_kill_point("fs-placeholder-announced");
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
    sbx_core::registry::test_kill_point("fs-placeholder-made");
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
    mut watch: Watch,
    feed: OwnedFd,
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
    let mut keep = watch.fds();
    keep.push(feed.as_raw_fd());
    keep.extend_from_slice(extra);
    // The end sweep's alerts go to the audit log.
    keep.extend(sbx_core::audit::get().and_then(|a| a.raw_fd()));
    sbx_core::fds::close_all_except(&keep);
    // The placeholders, as sbx-fs announces them (read as they come, so
    // the feed never fills), until sbx-fs releases us or is gone.
    let mut list = Vec::new();
    let mut open = true;
    let ending = loop {
        if open {
            open = receive(&feed, &mut list);
        }
        if let Some(e) = watch.check() {
            break e;
        }
        let mut more = [libc::pollfd {
            fd: feed.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        watch.block(if open { &mut more[..] } else { &mut [] });
    };
    let Ending::OwnerGone(msgs) = ending else {
        return 0;
    };
    // What was sent before sbx-fs died is queued: take all of it.
    if open {
        receive(&feed, &mut list);
    }
    drop(feed);
    // What sbx-fs sent: init's pid after the clone.
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
    let left = remove_all(&list, REAPER_SETTLE);
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

/// Takes every announcement queued on the feed into `list`. False once
/// the feed is closed (sbx-fs closed it or is gone): poll it no more.
fn receive(feed: &OwnedFd, list: &mut Vec<Placeholder>) -> bool {
    let mut buf = [0u8; 2 * libc::PATH_MAX as usize];
    loop {
        match passfd::try_recv_fds(feed.as_fd(), &mut buf) {
            Ok(Some(r)) => list.extend(Record::decode(&buf[..r.len], r.fds)),
            Ok(None) => return false,
            Err(e) if e.would_block() => return true,
            // A message whose fds were cut short (the fd limit): skipped.
            Err(passfd::PassFdError::Truncated) => {}
            Err(_) => return false,
        }
    }
}
