//! The git stage's overlay, mounted by the host's kernel for runsc.

use std::path::Path;
use std::process::Command;

use sbx_core::Failure;
use sbx_fs::plan::{Plan, What};

use crate::{egid, euid};

/// The git stage inside gVisor: runsc (and everything it starts) gets a
/// mount namespace of its own in which the stage's overlay (lower: the real
/// .git, upper and work: the stage's, as sbx-fs --git-stage mounts it) is
/// mounted on an empty directory of the private directory; the bundle binds
/// .git from there. The host's kernel makes the overlay, so the stage holds
/// exactly what sbx-fs's would (whiteouts included) for sbx-gitguard's
/// import. Unprivileged, the namespace belongs to a new user namespace that
/// maps the caller to itself (the capabilities to mount end at runsc's
/// exec; runsc --rootless then works as before).
pub(crate) struct GitView {
    at: std::ffi::CString,
    opts: std::ffi::CString,
    /// uid_map and gid_map lines when a user namespace is needed.
    user: Option<(Vec<u8>, Vec<u8>)>,
}

impl GitView {
    pub(crate) fn new(plan: &Plan, at: &Path) -> Result<GitView, Failure> {
        use std::os::unix::ffi::OsStrExt;
        let Some((lower, upper, work)) = plan.ops.iter().find_map(|o| match o.what {
            What::Overlay { lower, upper, work } => Some((lower, upper, work)),
            _ => None,
        }) else {
            return Err(Failure::new(
                "--git-stage: the plan has no git stage overlay",
            ));
        };
        let p = |i: usize| plan.sources[i].path.display().to_string();
        let user = euid() != 0;
        let opts = format!(
            "{}lowerdir={},upperdir={},workdir={}",
            if user { "userxattr," } else { "" },
            p(lower),
            p(upper),
            p(work)
        );
        let cs = |b: &[u8]| {
            std::ffi::CString::new(b).map_err(|_| Failure::new("--git-stage: path with a NUL"))
        };
        Ok(GitView {
            at: cs(at.as_os_str().as_bytes())?,
            opts: cs(opts.as_bytes())?,
            user: user.then(|| {
                (
                    format!("{0} {0} 1", euid()).into_bytes(),
                    format!("{0} {0} 1", egid()).into_bytes(),
                )
            }),
        })
    }

    pub(crate) fn install(self, cmd: &mut Command) {
        use std::os::unix::process::CommandExt;
        let write = |path: &std::ffi::CStr, data: &[u8]| -> std::io::Result<()> {
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
        };
        // SAFETY: between fork and exec only syscalls on values prepared
        // before the fork (no allocation, no lock).
        unsafe {
            cmd.pre_exec(move || {
                let err = std::io::Error::last_os_error;
                let mut flags = libc::CLONE_NEWNS;
                if self.user.is_some() {
                    flags |= libc::CLONE_NEWUSER;
                }
                if libc::unshare(flags) != 0 {
                    return Err(err());
                }
                if let Some((uid, gid)) = &self.user {
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
                if libc::mount(
                    c"overlay".as_ptr(),
                    self.at.as_ptr(),
                    c"overlay".as_ptr(),
                    0,
                    self.opts.as_ptr().cast(),
                ) != 0
                {
                    return Err(err());
                }
                Ok(())
            });
        }
    }
}
