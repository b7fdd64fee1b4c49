//! Applying the layer to this process: no_new_privs, the TSC trap, the
//! filters. Everything is inherited across `execve`.

use std::io;

use seccompiler::{BpfProgram, sock_filter};

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("prctl(PR_SET_NO_NEW_PRIVS)")]
    NoNewPrivs(#[source] io::Error),
    #[error("prctl(PR_SET_TSC, PR_TSC_SIGSEGV) (--no-tsc; x86 only)")]
    Tsc(#[source] io::Error),
    #[error("seccomp(SECCOMP_SET_MODE_FILTER) for filter '{name}'")]
    Seccomp {
        name: String,
        #[source]
        source: io::Error,
    },
}

#[repr(C)]
struct SockFprog {
    len: libc::c_ushort,
    filter: *const sock_filter,
}

/// Sets no_new_privs: no setuid/file-capability gain through exec, and
/// what lets an unprivileged process install a filter.
pub fn no_new_privs() -> Result<(), InstallError> {
    // SAFETY: prctl with integer arguments, on this process only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(InstallError::NoNewPrivs(io::Error::last_os_error()));
    }
    Ok(())
}

/// Makes `rdtsc`/`rdtscp` trap with SIGSEGV (survives exec).
pub fn no_tsc() -> Result<(), InstallError> {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: prctl with integer arguments, on this process only.
        if unsafe { libc::prctl(libc::PR_SET_TSC, libc::PR_TSC_SIGSEGV, 0, 0, 0) } != 0 {
            return Err(InstallError::Tsc(io::Error::last_os_error()));
        }
        Ok(())
    }
    #[cfg(not(target_arch = "x86_64"))]
    Err(InstallError::Tsc(io::Error::from_raw_os_error(
        libc::EINVAL,
    )))
}

/// Installs the filters in order. The kernel runs them all and keeps the
/// most restrictive answer; of equally restrictive ones, the last
/// installed. KILL_PROCESS results are logged by the kernel (audit record
/// type 1326, on the console log when no audit daemon runs).
pub fn filters(progs: &[(String, BpfProgram)]) -> Result<(), InstallError> {
    for (name, prog) in progs {
        let fprog = SockFprog {
            len: prog.len() as libc::c_ushort,
            filter: prog.as_ptr(),
        };
        // SAFETY: fprog and the program it points at live on this frame for the whole call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                libc::SECCOMP_FILTER_FLAG_TSYNC,
                std::ptr::from_ref::<SockFprog>(&fprog),
            )
        };
        if rc != 0 {
            let source = if rc < 0 {
                io::Error::last_os_error()
            } else {
                io::Error::other(format!("thread {rc} could not be synchronised"))
            };
            return Err(InstallError::Seccomp {
                name: name.clone(),
                source,
            });
        }
    }
    Ok(())
}
