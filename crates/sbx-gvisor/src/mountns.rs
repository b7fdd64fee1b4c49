//! runsc's own mount namespace: the bind sources, re-opened and checked in
//! it, and the git stage's overlay, mounted by the host's kernel.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use sbx_core::{Failure, Severity};
use sbx_fs::plan::{Kind, Plan, What};

use crate::{egid, euid};

// linux/mount.h (not in the libc crate).
const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;

/// struct mount_attr (linux/mount.h).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// struct open_how (linux/openat2.h; libc's cannot be built literally).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// One bind source as sbx-fs opened and checked it on the host, and the
/// private entry it is mounted on for runsc.
struct Bind {
    /// The canonical host path (sbx-fs's `Source::path`).
    src: CString,
    dev: u64,
    ino: u64,
    /// The empty file or directory of the private directory.
    at: CString,
    attrs: u64,
}

/// runsc (and everything it starts) runs in a mount namespace of its own,
/// always. In it, before runsc's exec:
///
/// - every bind source of the bundle is opened again by its canonical path
///   without following any symlink, must be the very inode (device and
///   inode number) sbx-fs opened and checked on the host, and is cloned
///   (open_tree) onto its empty entry of the private directory: the bundle
///   names that entry, never the caller's path, so a path swapped for a
///   symlink after the plan is refused (bind_source_changed, 125), and one
///   swapped after the check is not seen (runsc reads the clone);
/// - with a git stage, the stage's overlay (lower: the real .git, upper
///   and work: the stage's, as sbx-fs --git-stage mounts it) is mounted on
///   an empty directory of the private directory; the bundle binds .git
///   from there. The host's kernel makes the overlay, so the stage holds
///   exactly what sbx-fs's would (whiteouts included) for sbx-gitguard.
///
/// Unprivileged, the namespace belongs to a new user namespace that maps
/// the caller to itself (the capabilities to mount end at runsc's exec;
/// runsc --rootless then works as before).
pub(crate) struct RunscNs {
    binds: Vec<Bind>,
    /// Where the overlay goes and its options.
    overlay: Option<(CString, CString)>,
    /// uid_map and gid_map lines when a user namespace is needed.
    user: Option<(Vec<u8>, Vec<u8>)>,
    /// The canonical paths of the binds, for the alert.
    paths: Vec<std::path::PathBuf>,
}

fn cs(b: &[u8]) -> Result<CString, Failure> {
    CString::new(b).map_err(|_| Failure::new("a bind source path with a NUL"))
}

/// The private entry of bind source `i` under `binds` (the bundle names it).
pub(crate) fn entry(binds: &Path, i: usize) -> std::path::PathBuf {
    binds.join(i.to_string())
}

impl RunscNs {
    /// Makes the private entries (`binds`: a new directory, 0700, the
    /// caller's) and prepares every value the child needs (no allocation
    /// after the fork).
    pub(crate) fn new(
        plan: &Plan,
        binds: &Path,
        gitview: Option<&Path>,
    ) -> Result<RunscNs, Failure> {
        let io = |p: &Path, e: std::io::Error| Failure::new(format!("{}: {e}", p.display()));
        std::fs::create_dir(binds).map_err(|e| io(binds, e))?;
        std::fs::set_permissions(binds, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| io(binds, e))?;
        let mut out = Vec::new();
        let mut paths = Vec::new();
        for (i, s) in plan.sources.iter().enumerate() {
            let ops: Vec<bool> = plan
                .ops
                .iter()
                .filter_map(|o| match o.what {
                    What::Bind { src, ro } if src == i => Some(ro),
                    _ => None,
                })
                .collect();
            if ops.is_empty() {
                continue;
            }
            let at = entry(binds, i);
            let mut attrs = MOUNT_ATTR_NOSUID;
            match s.kind {
                Kind::Dir => {
                    std::fs::create_dir(&at).map_err(|e| io(&at, e))?;
                    attrs |= MOUNT_ATTR_NODEV;
                }
                Kind::File => {
                    std::fs::write(&at, b"").map_err(|e| io(&at, e))?;
                }
            }
            if ops.iter().all(|ro| *ro) {
                attrs |= MOUNT_ATTR_RDONLY;
            }
            out.push(Bind {
                src: cs(s.path.as_os_str().as_bytes())?,
                dev: s.dev,
                ino: s.ino,
                at: cs(at.as_os_str().as_bytes())?,
                attrs,
            });
            paths.push(s.path.clone());
        }
        let user = euid() != 0;
        let overlay = match gitview {
            Some(at) => {
                std::fs::create_dir(at).map_err(|e| io(at, e))?;
                Some((
                    cs(at.as_os_str().as_bytes())?,
                    cs(overlay_opts(plan, user)?.as_bytes())?,
                ))
            }
            None => None,
        };
        Ok(RunscNs {
            binds: out,
            overlay,
            user: user.then(|| {
                (
                    format!("{0} {0} 1", euid()).into_bytes(),
                    format!("{0} {0} 1", egid()).into_bytes(),
                )
            }),
            paths,
        })
    }

    /// Sets the steps up as `cmd`'s pre_exec; the `Report` maps a spawn
    /// failure to bind_source_changed when a source did not match.
    pub(crate) fn install(self, cmd: &mut Command) -> Result<Report, Failure> {
        use std::os::unix::process::CommandExt;
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills the two ints.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(Failure::new(format!(
                "pipe: {}",
                std::io::Error::last_os_error()
            )));
        }
        // SAFETY: both fds were just made and are owned here only.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let wfd = w.as_raw_fd();
        let RunscNs {
            binds,
            overlay,
            user,
            paths,
        } = self;
        // SAFETY: between fork and exec only syscalls on values prepared
        // before the fork (no allocation, no lock).
        unsafe {
            cmd.pre_exec(move || {
                let err = std::io::Error::last_os_error;
                let mut flags = libc::CLONE_NEWNS;
                if user.is_some() {
                    flags |= libc::CLONE_NEWUSER;
                }
                if libc::unshare(flags) != 0 {
                    return Err(err());
                }
                if let Some((uid, gid)) = &user {
                    write(c"/proc/self/setgroups", b"deny")?;
                    write(c"/proc/self/uid_map", uid)?;
                    write(c"/proc/self/gid_map", gid)?;
                }
                let none = std::ptr::null();
                if libc::mount(
                    none,
                    c"/".as_ptr(),
                    none,
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) != 0
                {
                    return Err(err());
                }
                for (i, b) in binds.iter().enumerate() {
                    bind(b).map_err(|e| {
                        if e.is_none() {
                            // Which source: its index, for the parent.
                            let n = (i as u32).to_ne_bytes();
                            libc::write(wfd, n.as_ptr().cast(), n.len());
                        }
                        e.unwrap_or_else(|| std::io::Error::from_raw_os_error(libc::ESTALE))
                    })?;
                }
                if let Some((at, opts)) = &overlay
                    && libc::mount(
                        c"overlay".as_ptr(),
                        at.as_ptr(),
                        c"overlay".as_ptr(),
                        0,
                        opts.as_ptr().cast(),
                    ) != 0
                {
                    return Err(err());
                }
                Ok(())
            });
        }
        Ok(Report {
            read: r,
            write: w,
            paths,
        })
    }
}

/// The overlay's mount options (the stage's directories from the plan).
fn overlay_opts(plan: &Plan, user: bool) -> Result<String, Failure> {
    let Some((lower, upper, work)) = plan.ops.iter().find_map(|o| match o.what {
        What::Overlay { lower, upper, work } => Some((lower, upper, work)),
        _ => None,
    }) else {
        return Err(Failure::new(
            "--git-stage: the plan has no git stage overlay",
        ));
    };
    let p = |i: usize| plan.sources[i].path.display().to_string();
    Ok(format!(
        "{}lowerdir={},upperdir={},workdir={}",
        if user { "userxattr," } else { "" },
        p(lower),
        p(upper),
        p(work)
    ))
}

/// Writes `data` to the file `path` (the child: raw syscalls only).
fn write(path: &std::ffi::CStr, data: &[u8]) -> std::io::Result<()> {
    // SAFETY: open/write/close on a valid C string and buffer.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let n = libc::write(fd, data.as_ptr().cast(), data.len());
        let e = std::io::Error::last_os_error();
        libc::close(fd);
        if n != data.len() as isize {
            return Err(e);
        }
    }
    Ok(())
}

/// In the child's namespace: re-opens the source without symlinks, checks
/// it is the inode checked on the host, clones it onto its entry. `None`:
/// the source changed.
fn bind(b: &Bind) -> Result<(), Option<std::io::Error>> {
    let err = || Some(std::io::Error::last_os_error());
    let how = OpenHow {
        flags: (libc::O_PATH | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS,
    };
    let mut fd;
    let mut tries = 0;
    loop {
        // SAFETY: a NUL-ended path and an open_how alive for the call.
        fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                libc::AT_FDCWD,
                b.src.as_ptr(),
                std::ptr::from_ref(&how),
                std::mem::size_of::<OpenHow>(),
            )
        } as libc::c_int;
        // A concurrent rename makes RESOLVE_* lookups fail with EAGAIN.
        let again = fd < 0
            && matches!(
                std::io::Error::last_os_error().raw_os_error(),
                Some(libc::EAGAIN | libc::EINTR)
            );
        if !again || tries >= 64 {
            break;
        }
        tries += 1;
    }
    if fd < 0 {
        return Err(None);
    }
    // SAFETY: fd was just opened; closed once, below.
    let src = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: a zeroed stat is a valid out-buffer for fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid fd and buffer.
    if unsafe { libc::fstat(src.as_raw_fd(), &mut st) } != 0
        || st.st_dev != b.dev
        || st.st_ino != b.ino
    {
        return Err(None);
    }
    // SAFETY: open_tree on a valid fd with an empty path.
    let tree = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            src.as_raw_fd(),
            c"".as_ptr(),
            OPEN_TREE_CLONE
                | AT_RECURSIVE
                | libc::AT_EMPTY_PATH as libc::c_uint
                | libc::O_CLOEXEC as libc::c_uint,
        )
    } as libc::c_int;
    if tree < 0 {
        return Err(err());
    }
    // SAFETY: tree was just opened; closed once, below.
    let tree = unsafe { OwnedFd::from_raw_fd(tree) };
    let attr = MountAttr {
        attr_set: b.attrs,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: mount_setattr on a valid fd with an empty path and a
    // mount_attr alive for the call.
    if unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint | AT_RECURSIVE,
            std::ptr::from_ref(&attr),
            std::mem::size_of::<MountAttr>(),
        )
    } != 0
    {
        return Err(err());
    }
    // SAFETY: move_mount of a valid detached tree onto a NUL-ended path.
    if unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            b.at.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    } != 0
    {
        return Err(err());
    }
    Ok(())
}

/// Which source (if any) did not match in the child.
pub(crate) struct Report {
    read: OwnedFd,
    write: OwnedFd,
    paths: Vec<std::path::PathBuf>,
}

impl Report {
    /// A spawn failure: bind_source_changed (an alert) and 125 when a
    /// source did not match, else the failure itself.
    pub(crate) fn failure(self, f: Failure) -> Failure {
        // The child's write end is closed (it exited): nothing blocks.
        drop(self.write);
        let mut n = [0u8; 4];
        // SAFETY: read into a 4-byte buffer from our own fd.
        let got = unsafe { libc::read(self.read.as_raw_fd(), n.as_mut_ptr().cast(), 4) };
        if got != 4 {
            return f;
        }
        let Some(path) = self.paths.get(u32::from_ne_bytes(n) as usize) else {
            return f;
        };
        sbx_core::audit::emit(
            "bind_source_changed",
            Severity::Alert,
            serde_json::json!({ "path": path.display().to_string() }),
        );
        Failure::new(format!(
            "bind source {} changed between the check and the mount (refused)",
            path.display()
        ))
    }
}
