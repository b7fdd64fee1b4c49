//! Executing a plan inside the new mount namespace: a fresh tmpfs root,
//! every mount made from an fd onto an fd (the destination opened beneath
//! the new root without following any symlink), then `pivot_root`.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Component, Path, PathBuf};

use crate::plan::{Kind, Op, Source, What};
use crate::sys;

const HELPER: &str = ".sbx-helper";
/// Where the guard file system is attached inside the helper.
const GUARD_DIR: &str = "fuse";
/// Where the write budget's tmpfs is attached inside the helper (its
/// layers are cloned from there; detached at the pivot).
const QUOTA_DIR: &str = "quota";
const HELPER_ENTRIES: &[(&str, bool)] = &[
    ("deny-file", false),
    ("deny-dir", true),
    ("empty-file", false),
    ("empty-dir", true),
];

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("{op} {path}")]
    Sys {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("bind source {path} changed between the check and the mount (refused)")]
    SourceChanged { path: PathBuf },
    #[error("destination {path} crosses a symlink or a non-directory (refused)")]
    Symlink { path: PathBuf },
    #[error(
        "destination {path} is missing and would have to be created outside the sandbox's own tmpfs (refused)"
    )]
    WouldCreateOnHost { path: PathBuf },
}

fn e<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> MountError + 'a {
    move |source| MountError::Sys {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// The identity that owns the $HOME tmpfs.
#[derive(Debug, Clone, Copy)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

pub struct Root {
    root: OwnedFd,
    helper: OwnedFd,
    /// st_dev of every tmpfs this sandbox made: the only places where a
    /// missing mount point may be created.
    ours: Vec<u64>,
    owner: Owner,
    /// Mounts made read-only once everything below them is mounted (/dev).
    seal: Vec<PathBuf>,
    /// The guard file system's root (attached at the helper's `fuse`),
    /// when it could be mounted.
    guard: Option<OwnedFd>,
    /// The write budget's tmpfs (attached at the helper's `quota`).
    quota: Option<OwnedFd>,
}

/// Makes the mount namespace private-ish (slave: nothing propagates back
/// to the host), mounts the new root tmpfs (attached at /tmp of this
/// namespace only) and the helper holding the empty deny/placeholder files.
pub fn prepare(owner: Owner, sources: &mut [Source]) -> Result<Root, MountError> {
    let slash = Path::new("/");
    sys::mount_propagation(slash, libc::MS_REC | libc::MS_SLAVE)
        .map_err(e("make mounts slave", slash))?;
    reopen_sources(sources)?;
    let at = Path::new("/tmp");
    let fs = sys::new_fs(
        "tmpfs",
        &[("mode", "0755"), ("size", "1M")],
        sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
    )
    .map_err(e("create root tmpfs", at))?;
    sys::move_mount_path(fs.as_raw_fd(), at).map_err(e("attach root tmpfs", at))?;
    let root = sys::openat2(
        libc::AT_FDCWD,
        at,
        libc::O_PATH | libc::O_DIRECTORY,
        0,
        sys::RESOLVE_NO_SYMLINKS,
    )
    .map_err(e("open root", at))?;
    let ours = vec![
        sys::fstat(root.as_raw_fd())
            .map_err(e("stat root", at))?
            .st_dev,
    ];
    let hp = Path::new(HELPER);
    sys::mkdirat(root.as_raw_fd(), hp, 0o755).map_err(e("mkdir", hp))?;
    // The empty files and directories that hide denied paths live in the
    // root tmpfs itself; every mount of one is a read-only clone, and the
    // names are unlinked after the pivot (the mounts keep the inodes).
    let helper = sys::open_beneath(root.as_raw_fd(), hp, libc::O_PATH | libc::O_DIRECTORY)
        .map_err(e("open", hp))?;
    let h = helper.as_raw_fd();
    for (name, dir, mode) in [
        ("deny-file", false, 0o000),
        ("deny-dir", true, 0o000),
        ("empty-file", false, 0o444),
        ("empty-dir", true, 0o555),
    ] {
        let n = Path::new(name);
        if dir {
            sys::mkdirat(h, n, mode).map_err(e("mkdir", n))?;
        } else {
            sys::mkfileat(h, n, mode).map_err(e("create", n))?;
        }
        sys::fchmodat(h, n, mode).map_err(e("chmod", n))?;
    }
    Ok(Root {
        root,
        helper,
        ours,
        owner,
        seal: Vec::new(),
        guard: None,
        quota: None,
    })
}

/// open_tree(OPEN_TREE_CLONE) only clones mounts of the caller's own mount
/// namespace, and the sources were opened on the host, before it existed.
/// So each is opened again here, by its canonical path, without following
/// any symlink, and must be the very same inode (device and inode number)
/// that was opened on the host: a path swapped in between is refused.
fn reopen_sources(sources: &mut [Source]) -> Result<(), MountError> {
    for s in sources.iter_mut() {
        let fd = sys::openat2(
            libc::AT_FDCWD,
            &s.path,
            libc::O_PATH,
            0,
            sys::RESOLVE_NO_SYMLINKS | sys::RESOLVE_NO_MAGICLINKS,
        );
        let same = match &fd {
            Ok(f) => {
                sys::fstat(f.as_raw_fd()).is_ok_and(|st| st.st_dev == s.dev && st.st_ino == s.ino)
            }
            Err(_) => false,
        };
        if !same {
            sbx_core::audit::emit(
                "bind_source_changed",
                sbx_core::Severity::Alert,
                serde_json::json!({ "path": s.path.display().to_string() }),
            );
            return Err(MountError::SourceChanged {
                path: s.path.clone(),
            });
        }
        if let Ok(f) = fd {
            s.fd = f;
        }
    }
    Ok(())
}

fn components(dst: &Path) -> Vec<&Path> {
    dst.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(Path::new(n)),
            _ => None,
        })
        .collect()
}

impl Root {
    /// Opens `dst` (absolute in the sandbox) beneath the new root without
    /// following symlinks, creating missing components (directories, the
    /// last one as `kind`) only on the sandbox's own tmpfs. None when it is
    /// missing and `create` is false.
    pub fn mkpath(
        &self,
        dst: &Path,
        kind: Kind,
        create: bool,
    ) -> Result<Option<OwnedFd>, MountError> {
        let comps = components(dst);
        // Fast path: one openat2 for the whole path (it crosses mounts and
        // refuses symlinks just like the walk below); the walk only runs
        // when something is missing.
        let rel: PathBuf = comps.iter().collect();
        match sys::open_beneath(self.root.as_raw_fd(), &rel, libc::O_PATH) {
            Ok(fd) => return Ok(Some(fd)),
            Err(err) if matches!(err.raw_os_error(), Some(libc::ELOOP | libc::EXDEV)) => {
                return Err(MountError::Symlink {
                    path: dst.to_path_buf(),
                });
            }
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) && !create => return Ok(None),
            Err(_) => {}
        }
        let mut cur: Option<OwnedFd> = None;
        for (i, c) in comps.iter().enumerate() {
            let last = i + 1 == comps.len();
            let dirfd: RawFd = cur
                .as_ref()
                .map_or(self.root.as_raw_fd(), |f| f.as_raw_fd());
            let flags = if last {
                libc::O_PATH
            } else {
                libc::O_PATH | libc::O_DIRECTORY
            };
            let next = match sys::open_beneath(dirfd, c, flags) {
                Ok(fd) => fd,
                Err(err) if err.raw_os_error() == Some(libc::ENOENT) => {
                    if !create {
                        return Ok(None);
                    }
                    let st = sys::fstat(dirfd).map_err(e("stat", dst))?;
                    if !self.ours.contains(&st.st_dev) {
                        return Err(MountError::WouldCreateOnHost {
                            path: dst.to_path_buf(),
                        });
                    }
                    if last && kind == Kind::File {
                        sys::mkfileat(dirfd, c, 0o644).map_err(e("create mount point", dst))?;
                    } else {
                        sys::mkdirat(dirfd, c, 0o755).map_err(e("create mount point", dst))?;
                    }
                    sys::open_beneath(dirfd, c, flags).map_err(e("open", dst))?
                }
                Err(err)
                    if matches!(
                        err.raw_os_error(),
                        Some(libc::ELOOP | libc::ENOTDIR | libc::EXDEV)
                    ) =>
                {
                    return Err(MountError::Symlink {
                        path: dst.to_path_buf(),
                    });
                }
                Err(err) => return Err(e("open", dst)(err)),
            };
            cur = Some(next);
        }
        Ok(cur)
    }

    /// Runs one op.
    pub fn apply(&mut self, op: &Op, sources: &[Source]) -> Result<(), MountError> {
        let dst = op.dst.as_path();
        match &op.what {
            What::Bind { src, ro } => {
                let s = &sources[*src];
                let tree = sys::clone_tree(s.fd.as_raw_fd(), true)
                    .map_err(e("clone bind source", &s.path))?;
                let mut attrs = sys::MOUNT_ATTR_NOSUID;
                if s.kind == Kind::Dir {
                    attrs |= sys::MOUNT_ATTR_NODEV;
                }
                if *ro {
                    attrs |= sys::MOUNT_ATTR_RDONLY;
                }
                sys::mount_setattr(tree.as_raw_fd(), attrs, true)
                    .map_err(e("set bind attributes", dst))?;
                let target = self.target(op, s.kind)?;
                if let Some(t) = target {
                    sys::move_mount_fd(tree.as_raw_fd(), t.as_raw_fd()).map_err(e("bind", dst))?;
                }
            }
            What::Tmpfs { size, mode, owned } => {
                let size = size.to_string();
                let mode = format!("{mode:o}");
                let uid = self.owner.uid.to_string();
                let gid = self.owner.gid.to_string();
                let mut opts = vec![("size", size.as_str()), ("mode", mode.as_str())];
                if *owned {
                    opts.push(("uid", uid.as_str()));
                    opts.push(("gid", gid.as_str()));
                }
                let fs = sys::new_fs(
                    "tmpfs",
                    &opts,
                    sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
                )
                .map_err(e("create tmpfs", dst))?;
                if let Some(t) = self.target(op, Kind::Dir)? {
                    sys::move_mount_fd(fs.as_raw_fd(), t.as_raw_fd())
                        .map_err(e("mount tmpfs", dst))?;
                    self.note_ours(dst)?;
                    if op.why == "dev" && dst == Path::new("/dev") {
                        self.seal.push(dst.to_path_buf());
                    }
                }
            }
            What::Proc => {
                let fs = sys::new_fs(
                    "proc",
                    &[],
                    sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV | sys::MOUNT_ATTR_NOEXEC,
                )
                .map_err(e("create proc", dst))?;
                if let Some(t) = self.target(op, Kind::Dir)? {
                    sys::move_mount_fd(fs.as_raw_fd(), t.as_raw_fd())
                        .map_err(e("mount proc", dst))?;
                }
            }
            What::Devpts => {
                let fs = sys::new_fs(
                    "devpts",
                    &[("ptmxmode", "0666"), ("mode", "0620")],
                    sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NOEXEC,
                )
                .map_err(e("create devpts", dst))?;
                if let Some(t) = self.target(op, Kind::Dir)? {
                    sys::move_mount_fd(fs.as_raw_fd(), t.as_raw_fd())
                        .map_err(e("mount devpts", dst))?;
                }
            }
            What::Symlink { target } => {
                let parent = dst.parent().unwrap_or(Path::new("/"));
                let name = Path::new(dst.file_name().unwrap_or_default());
                let pfd = if parent == Path::new("/") {
                    None
                } else {
                    self.mkpath(parent, Kind::Dir, true)?
                };
                let pfd_raw = pfd
                    .as_ref()
                    .map_or(self.root.as_raw_fd(), |f| f.as_raw_fd());
                let st = sys::fstat(pfd_raw).map_err(e("stat", dst))?;
                if !self.ours.contains(&st.st_dev) {
                    return Err(MountError::WouldCreateOnHost {
                        path: dst.to_path_buf(),
                    });
                }
                sys::symlinkat(target, pfd_raw, name).map_err(e("symlink", dst))?;
            }
            What::Deny | What::Empty => {
                let Some(t) = self.target(op, op.kind)? else {
                    return Ok(());
                };
                let st = sys::fstat(t.as_raw_fd()).map_err(e("stat", dst))?;
                let name = match (&op.what, sys::is_dir(&st)) {
                    (What::Deny, false) => "deny-file",
                    (What::Deny, true) => "deny-dir",
                    (_, false) => "empty-file",
                    (_, true) => "empty-dir",
                };
                let tree = sys::open_tree(
                    self.helper.as_raw_fd(),
                    Path::new(name),
                    sys::OPEN_TREE_CLONE,
                )
                .map_err(e("clone placeholder", dst))?;
                sys::mount_setattr(
                    tree.as_raw_fd(),
                    sys::MOUNT_ATTR_RDONLY
                        | sys::MOUNT_ATTR_NOSUID
                        | sys::MOUNT_ATTR_NODEV
                        | sys::MOUNT_ATTR_NOEXEC,
                    false,
                )
                .map_err(e("set placeholder attributes", dst))?;
                sys::move_mount_fd(tree.as_raw_fd(), t.as_raw_fd()).map_err(e("hide", dst))?;
            }
            What::Overlay { lower, upper, work } => {
                // The layers by fd (the host's /tmp may be covered here):
                // overlayfs resolves /proc/self/fd/N to the very inodes
                // checked on the host.
                let fd = |i: &usize| format!("/proc/self/fd/{}", sources[*i].fd.as_raw_fd());
                let (l, u, w) = (fd(lower), fd(upper), fd(work));
                let fs = new_overlay(vec![
                    ("lowerdir", l.as_str()),
                    ("upperdir", u.as_str()),
                    ("workdir", w.as_str()),
                ])
                .map_err(e("create git stage overlay", dst))?;
                if let Some(t) = self.target(op, Kind::Dir)? {
                    sys::move_mount_fd(fs.as_raw_fd(), t.as_raw_fd())
                        .map_err(e("mount git stage overlay", dst))?;
                    // Mount points made in it (a missing .git/hooks) land in
                    // the stage, never on the host.
                    self.note_ours(dst)?;
                }
            }
            What::ReadOnly => {
                let Some(t) = self.mkpath(dst, op.kind, false)? else {
                    if op.optional {
                        return Ok(());
                    }
                    return Err(MountError::Sys {
                        op: "protect",
                        path: dst.to_path_buf(),
                        source: io::Error::from_raw_os_error(libc::ENOENT),
                    });
                };
                let tree = sys::clone_tree(t.as_raw_fd(), true).map_err(e("clone", dst))?;
                sys::mount_setattr(
                    tree.as_raw_fd(),
                    sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
                    true,
                )
                .map_err(e("make read-only", dst))?;
                sys::move_mount_fd(tree.as_raw_fd(), t.as_raw_fd()).map_err(e("protect", dst))?;
            }
        }
        Ok(())
    }

    /// Runs the user bind `op` (a writable directory under the budget) as
    /// an overlay: lower the host directory, upper and work directories
    /// `u<k>`/`w<k>` of the budget's tmpfs (made on first use, attached in
    /// the helper, so it is never visible to the sandbox).
    pub fn apply_quota(
        &mut self,
        op: &Op,
        sources: &[Source],
        k: usize,
        q: &crate::plan::QuotaPlan,
    ) -> Result<(), MountError> {
        let dst = op.dst.as_path();
        let What::Bind { src, .. } = op.what else {
            return self.apply(op, sources);
        };
        let s = &sources[src];
        if self.quota.is_none() {
            let n = Path::new(QUOTA_DIR);
            let size = q.budget.bytes.to_string();
            let inodes = q.budget.tmpfs_inodes(q.srcs.len()).to_string();
            let fs = sys::new_fs(
                "tmpfs",
                &[
                    ("size", size.as_str()),
                    ("nr_inodes", inodes.as_str()),
                    ("mode", "0700"),
                ],
                sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
            )
            .map_err(e("create write budget tmpfs", n))?;
            let h = self.helper.as_raw_fd();
            sys::mkdirat(h, n, 0o700).map_err(e("mkdir", n))?;
            let at =
                sys::open_beneath(h, n, libc::O_PATH | libc::O_DIRECTORY).map_err(e("open", n))?;
            sys::move_mount_fd(fs.as_raw_fd(), at.as_raw_fd())
                .map_err(e("attach write budget tmpfs", n))?;
            let root =
                sys::open_beneath(h, n, libc::O_PATH | libc::O_DIRECTORY).map_err(e("open", n))?;
            self.quota = Some(root);
        }
        let qfd = self.quota.as_ref().map_or(-1, |f| f.as_raw_fd());
        let (un, wn) = (
            PathBuf::from(crate::quota::upper_name(k)),
            PathBuf::from(crate::quota::work_name(k)),
        );
        let lst = sys::fstat(s.fd.as_raw_fd()).map_err(e("stat", &s.path))?;
        sys::mkdirat(qfd, &un, 0o700).map_err(e("mkdir upper", dst))?;
        sys::mkdirat(qfd, &wn, 0o700).map_err(e("mkdir work", dst))?;
        // The bind's root shows the upper's root: the host directory's mode.
        sys::fchmodat(qfd, &un, lst.st_mode & 0o7777).map_err(e("chmod upper", dst))?;
        let u = sys::open_beneath(qfd, &un, libc::O_PATH | libc::O_DIRECTORY)
            .map_err(e("open upper", dst))?;
        let w = sys::open_beneath(qfd, &wn, libc::O_PATH | libc::O_DIRECTORY)
            .map_err(e("open work", dst))?;
        if sys::in_initial_userns() {
            // SAFETY: fchownat on an O_PATH fd with AT_EMPTY_PATH.
            unsafe {
                libc::fchownat(
                    u.as_raw_fd(),
                    c"".as_ptr(),
                    lst.st_uid,
                    lst.st_gid,
                    libc::AT_EMPTY_PATH,
                )
            };
        }
        let fd = |f: RawFd| format!("/proc/self/fd/{f}");
        let (l, up, wk) = (fd(s.fd.as_raw_fd()), fd(u.as_raw_fd()), fd(w.as_raw_fd()));
        // No redirects, metacopy or index: the upper holds whole files,
        // whiteouts and opaque directories only, which is all the apply
        // understands (a directory rename becomes copy + delete, EXDEV).
        let fs = new_overlay(vec![
            ("lowerdir", l.as_str()),
            ("upperdir", up.as_str()),
            ("workdir", wk.as_str()),
            ("redirect_dir", "nofollow"),
            ("metacopy", "off"),
            ("index", "off"),
            ("xino", "off"),
        ])
        .map_err(e("create write budget overlay", dst))?;
        if let Some(t) = self.target(op, Kind::Dir)? {
            sys::move_mount_fd(fs.as_raw_fd(), t.as_raw_fd())
                .map_err(e("mount write budget overlay", dst))?;
        }
        Ok(())
    }

    /// The write budget's tmpfs root, when one was made.
    pub fn quota_root(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.quota.as_ref().map(|f| f.as_fd())
    }

    /// Pins the directory at `dst` (an ancestor of a protected path): binds
    /// it onto itself, attributes unchanged, so that the kernel refuses to
    /// rename or remove it (EBUSY: a mount point of this namespace). A
    /// directory that does not exist needs no pin.
    pub fn pin(&mut self, dst: &Path) -> Result<(), MountError> {
        let Some(t) = self.mkpath(dst, Kind::Dir, false)? else {
            return Ok(());
        };
        let st = sys::fstat(t.as_raw_fd()).map_err(e("stat", dst))?;
        if !sys::is_dir(&st) {
            return Ok(());
        }
        let tree = sys::clone_tree(t.as_raw_fd(), true).map_err(e("clone", dst))?;
        sys::move_mount_fd(tree.as_raw_fd(), t.as_raw_fd()).map_err(e("pin", dst))?;
        Ok(())
    }

    /// Attaches the (detached) guard file system mount `mnt` inside the
    /// helper, where each guard node is cloned from (open_tree clones only
    /// mounts of the caller's own namespace). Detached again at the pivot.
    pub fn attach_guard(&mut self, mnt: OwnedFd) -> Result<(), MountError> {
        let h = self.helper.as_raw_fd();
        let n = Path::new(GUARD_DIR);
        sys::mkdirat(h, n, 0o755).map_err(e("mkdir", n))?;
        let at = sys::open_beneath(h, n, libc::O_PATH | libc::O_DIRECTORY).map_err(e("open", n))?;
        sys::move_mount_fd(mnt.as_raw_fd(), at.as_raw_fd()).map_err(e("attach guard fs", n))?;
        let root =
            sys::open_beneath(h, n, libc::O_PATH | libc::O_DIRECTORY).map_err(e("open", n))?;
        self.guard = Some(root);
        Ok(())
    }

    /// Mounts guard node `g` over `op.dst` instead of running `op`: the
    /// node of the mount point's kind (file or directory). Not read-only
    /// at the mount level: the server refuses writes, and sees them.
    pub fn apply_guard(&mut self, op: &Op, g: usize) -> Result<(), MountError> {
        let Some(groot) = &self.guard else {
            return Ok(());
        };
        let dst = op.dst.as_path();
        let Some(t) = self.target(op, op.kind)? else {
            return Ok(());
        };
        let st = sys::fstat(t.as_raw_fd()).map_err(e("stat", dst))?;
        let name = crate::guard::node_name(g, sys::is_dir(&st));
        let tree = sys::open_tree(groot.as_raw_fd(), Path::new(&name), sys::OPEN_TREE_CLONE)
            .map_err(e("clone guard node", dst))?;
        sys::mount_setattr(
            tree.as_raw_fd(),
            sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
            false,
        )
        .map_err(e("set guard node attributes", dst))?;
        sys::move_mount_fd(tree.as_raw_fd(), t.as_raw_fd()).map_err(e("guard", dst))?;
        Ok(())
    }

    fn target(&self, op: &Op, kind: Kind) -> Result<Option<OwnedFd>, MountError> {
        self.mkpath(&op.dst, kind, !op.optional)
    }

    fn note_ours(&mut self, dst: &Path) -> Result<(), MountError> {
        if let Some(fd) = self.mkpath(dst, Kind::Dir, false)? {
            let st = sys::fstat(fd.as_raw_fd()).map_err(e("stat", dst))?;
            self.ours.push(st.st_dev);
        }
        Ok(())
    }

    /// `pivot_root` into the new root, detach the old one and the helper,
    /// and make the root itself read-only.
    pub fn pivot(self) -> Result<(), MountError> {
        let slash = Path::new("/");
        let dot = Path::new(".");
        // SAFETY: root is an open directory fd owned by self.
        if unsafe { libc::fchdir(self.root.as_raw_fd()) } != 0 {
            return Err(e("chdir", Path::new("new root"))(io::Error::last_os_error()));
        }
        sys::pivot_root(dot, dot).map_err(e("pivot_root", slash))?;
        sys::umount_detach(dot).map_err(e("detach old root", slash))?;
        // SAFETY: the path is a NUL-ended literal.
        if unsafe { libc::chdir(c"/".as_ptr()) } != 0 {
            return Err(e("chdir", slash)(io::Error::last_os_error()));
        }
        drop(self.helper);
        let hp = Path::new("/").join(HELPER);
        if let Some(g) = self.guard {
            // The guard nodes are clones: the attach point itself goes.
            drop(g);
            let p = hp.join(GUARD_DIR);
            sys::umount_detach(&p).map_err(e("detach guard fs", &p))?;
            sys::unlinkat(libc::AT_FDCWD, &p, true).map_err(e("remove", &p))?;
        }
        if let Some(q) = self.quota {
            // The overlays hold their own clones of the layers.
            drop(q);
            let p = hp.join(QUOTA_DIR);
            sys::umount_detach(&p).map_err(e("detach write budget tmpfs", &p))?;
            sys::unlinkat(libc::AT_FDCWD, &p, true).map_err(e("remove", &p))?;
        }
        for (name, dir) in HELPER_ENTRIES {
            let p = hp.join(name);
            sys::unlinkat(libc::AT_FDCWD, &p, *dir).map_err(e("remove", &p))?;
        }
        sys::unlinkat(libc::AT_FDCWD, &hp, true).map_err(e("remove", &hp))?;
        let r = sys::openat2(
            libc::AT_FDCWD,
            slash,
            libc::O_PATH | libc::O_DIRECTORY,
            0,
            0,
        )
        .map_err(e("open", slash))?;
        sys::mount_setattr(r.as_raw_fd(), sys::MOUNT_ATTR_RDONLY, false)
            .map_err(e("make root read-only", slash))?;
        for p in &self.seal {
            let fd = sys::openat2(
                libc::AT_FDCWD,
                p,
                libc::O_PATH | libc::O_DIRECTORY,
                0,
                sys::RESOLVE_NO_SYMLINKS,
            )
            .map_err(e("open", p))?;
            sys::mount_setattr(fd.as_raw_fd(), sys::MOUNT_ATTR_RDONLY, false)
                .map_err(e("make read-only", p))?;
        }
        Ok(())
    }
}

/// A detached nosuid, nodev overlay with `opts`. trusted.overlay.* needs
/// CAP_SYS_ADMIN of the initial user namespace; inside one of our own,
/// user.overlay.* is used (`userxattr`).
///
/// `volatile` (Linux 5.10+; a kernel without the option mounts without it): the upper layer is
/// not synced when the overlay goes with the sandbox's mount namespace.
/// On the git stage's ext4 that sync was a disk cache flush at the end of
/// every run (issue 19). Nothing needs it: each upper layer serves one run,
/// is read afterwards through the page cache (the write budget's apply,
/// sbx-gitguard's import, which verifies every object and writes the
/// repository with its own fsyncs) and is then removed; after a crash the
/// run's writes were never applied anyway.
fn new_overlay(mut opts: Vec<(&str, &str)>) -> std::io::Result<OwnedFd> {
    if !sys::in_initial_userns() {
        opts.push(("userxattr", ""));
    }
    let attrs = sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV;
    let mut fast = opts.clone();
    fast.push(("volatile", ""));
    match sys::new_fs("overlay", &fast, attrs) {
        // Only when the kernel lacks the option: any other EINVAL is the
        // mount's own, and a retry would fail on the work directory the
        // first attempt marked instead (attacker helper-54).
        Err(e)
            if e.raw_os_error() == Some(libc::EINVAL)
                && !sys::fs_takes_flag("overlay", "volatile") =>
        {
            sys::new_fs("overlay", &opts, attrs)
        }
        made => made,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check between the host open and the mount: a source swapped for
    /// another directory, or for a symlink, is refused.
    #[test]
    fn swapped_sources_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        std::fs::create_dir(&src).unwrap();
        let mut sources = vec![crate::plan::open_source("--ro", &src, false, false).unwrap()];
        reopen_sources(&mut sources).unwrap();

        // Swapped for another directory at the same path.
        std::fs::rename(&src, d.path().join("old")).unwrap();
        std::fs::create_dir(&src).unwrap();
        let err = reopen_sources(&mut sources).unwrap_err();
        assert!(matches!(err, MountError::SourceChanged { .. }), "{err}");

        // Swapped for a symlink to the original.
        std::fs::remove_dir(&src).unwrap();
        std::os::unix::fs::symlink(d.path().join("old"), &src).unwrap();
        let err = reopen_sources(&mut sources).unwrap_err();
        assert!(matches!(err, MountError::SourceChanged { .. }), "{err}");
    }
}
