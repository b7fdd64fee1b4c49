//! `--allow-exec`: a Landlock execute allowlist, applied to sbx-seccomp
//! itself before it executes CMD (and so to everything CMD starts).
//!
//! The ruleset handles only LANDLOCK_ACCESS_FS_EXECUTE: reading and writing
//! are sbx-fs's business. Each allowed file gets a path-beneath rule; the
//! kernel then refuses execve (EACCES) of every other file, also of the
//! ELF interpreter and of a script's `#!` interpreter, so the dynamic
//! loaders are always added. Landlock is the enforcer; the notifier's
//! `exec_denied` alerts (see [`crate::execwatch`]) only observe.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    #[error(
        "Landlock is not available on this kernel ({0}): the execute allowlist cannot be enforced (run `sbx-doctor --check landlock`)"
    )]
    Unavailable(std::io::Error),
    #[error("landlock_create_ruleset: {0}")]
    Create(std::io::Error),
    #[error("--allow-exec {0}: {1}")]
    Open(PathBuf, std::io::Error),
    #[error("landlock_add_rule {0}: {1}")]
    AddRule(PathBuf, std::io::Error),
    #[error("prctl(PR_SET_NO_NEW_PRIVS): {0}")]
    NoNewPrivs(std::io::Error),
    #[error("landlock_restrict_self: {0}")]
    Restrict(std::io::Error),
}

const ACCESS_FS_EXECUTE: u64 = 1;
const RULE_PATH_BENEATH: libc::c_int = 1;
const CREATE_RULESET_VERSION: libc::c_uint = 1;

#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
}

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// The Landlock ABI version of the running kernel.
pub fn abi() -> Result<i64, std::io::Error> {
    // SAFETY: the documented version query: null attr, size 0.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<RulesetAttr>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The ELF interpreters of this system (the dynamic loader must be
/// executable for any dynamically linked program to start).
pub fn loaders() -> Vec<PathBuf> {
    let mut v = Vec::new();
    for dir in [
        "/lib64",
        "/lib",
        "/usr/lib64",
        "/usr/lib",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
    ] {
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                let n = e.file_name();
                let n = n.to_string_lossy();
                if (n.starts_with("ld-linux")
                    || n.starts_with("ld64.so")
                    || n.starts_with("ld-musl"))
                    && let Ok(c) = e.path().canonicalize()
                    && !v.contains(&c)
                {
                    v.push(c);
                }
            }
        }
    }
    v
}

/// Restricts this process (and everything it executes) to executing only
/// `allowed` files (and files beneath allowed directories).
pub fn restrict_exec(allowed: &[PathBuf]) -> Result<(), LandlockError> {
    abi().map_err(LandlockError::Unavailable)?;
    let attr = RulesetAttr {
        handled_access_fs: ACCESS_FS_EXECUTE,
    };
    // SAFETY: attr is a valid struct of the size passed.
    let rs = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::from_ref::<RulesetAttr>(&attr),
            std::mem::size_of::<RulesetAttr>(),
            0u32,
        )
    };
    if rs < 0 {
        return Err(LandlockError::Create(std::io::Error::last_os_error()));
    }
    let rs = rs as libc::c_int;
    let result = (|| {
        for p in allowed {
            let c = CString::new(p.as_os_str().as_bytes()).map_err(|_| {
                LandlockError::Open(p.clone(), std::io::ErrorKind::InvalidInput.into())
            })?;
            // SAFETY: c is a NUL-terminated path.
            let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
            if fd < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::NotFound {
                    // Not in this sandbox: nothing to allow.
                    continue;
                }
                return Err(LandlockError::Open(p.clone(), e));
            }
            let rule = PathBeneathAttr {
                allowed_access: ACCESS_FS_EXECUTE,
                parent_fd: fd,
            };
            // SAFETY: rule is a valid path-beneath attribute; fd is open.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_landlock_add_rule,
                    rs,
                    RULE_PATH_BENEATH,
                    std::ptr::from_ref::<PathBeneathAttr>(&rule),
                    0u32,
                )
            };
            let err = std::io::Error::last_os_error();
            // SAFETY: fd is ours.
            unsafe { libc::close(fd) };
            if r < 0 {
                return Err(LandlockError::AddRule(p.clone(), err));
            }
        }
        // SAFETY: plain prctl.
        if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
            return Err(LandlockError::NoNewPrivs(std::io::Error::last_os_error()));
        }
        // SAFETY: rs is a ruleset fd.
        if unsafe { libc::syscall(libc::SYS_landlock_restrict_self, rs, 0u32) } != 0 {
            return Err(LandlockError::Restrict(std::io::Error::last_os_error()));
        }
        Ok(())
    })();
    // SAFETY: rs is ours.
    unsafe { libc::close(rs) };
    result
}

/// What `--allow-exec` allows: the files named and the dynamic loaders
/// (CMD itself, its shells and interpreters are the caller's to list).
pub fn allowlist(named: &[PathBuf]) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = named.to_vec();
    for l in loaders() {
        if !v.contains(&l) {
            v.push(l);
        }
    }
    v
}
