//! Namespaces: deciding whether a user namespace is needed, the clone that
//! makes the sandbox's PID 1, the uid/gid maps and the hostname.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum NsError {
    #[error("clone into new namespaces ({what}; run `sbx-doctor --check userns`)")]
    Clone {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("write {file}")]
    Map {
        file: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("sethostname {name}")]
    Hostname {
        name: String,
        #[source]
        source: io::Error,
    },
}

/// Whether this process holds CAP_SYS_ADMIN in its user namespace (then
/// no user namespace is made: the host's root stays the sandbox's root).
pub fn have_cap_sys_admin() -> bool {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Default, Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut h = Header {
        version: 0x2008_0522,
        pid: 0,
    };
    let mut d = [Data::default(); 2];
    // SAFETY: h and d are a live capability header and a two-element data array for capget to
    // fill.
    let r = unsafe {
        libc::syscall(
            libc::SYS_capget,
            std::ptr::from_mut::<Header>(&mut h),
            d.as_mut_ptr(),
        )
    };
    r == 0 && d[0].effective & (1 << 21) != 0
}

/// The namespaces the sandbox gets.
pub fn flags(user: bool) -> libc::c_int {
    let mut f = libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS;
    if user {
        f |= libc::CLONE_NEWUSER;
    }
    f
}

pub fn describe(flags: libc::c_int) -> String {
    let mut v = Vec::new();
    for (f, n) in [
        (libc::CLONE_NEWUSER, "user"),
        (libc::CLONE_NEWNS, "mount"),
        (libc::CLONE_NEWPID, "pid"),
        (libc::CLONE_NEWIPC, "ipc"),
        (libc::CLONE_NEWUTS, "uts"),
    ] {
        if flags & f != 0 {
            v.push(n);
        }
    }
    v.join(",")
}

/// fork(2) into new namespaces: returns 0 in the child (PID 1 of the new
/// PID namespace), the child's pid in the parent. The caller must be
/// single-threaded.
pub fn clone_into(flags: libc::c_int) -> Result<libc::pid_t, NsError> {
    // SAFETY: clone with a null stack and no CLONE_VM: the child gets its own copy of memory,
    // as after fork; the caller is single-threaded (documented above).
    let r = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_ulong,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_int>(),
            std::ptr::null_mut::<libc::c_int>(),
            0 as libc::c_ulong,
        )
    };
    if r < 0 {
        return Err(NsError::Clone {
            what: describe(flags),
            source: io::Error::last_os_error(),
        });
    }
    Ok(r as libc::pid_t)
}

fn write(file: &'static str, data: &str) -> Result<(), NsError> {
    std::fs::write(file, data).map_err(|source| NsError::Map { file, source })
}

/// Maps the caller (outside) to `inner` ids inside a fresh user namespace.
/// Called by the namespace's first process itself.
pub fn write_maps(
    inner_uid: u32,
    outer_uid: u32,
    inner_gid: u32,
    outer_gid: u32,
) -> Result<(), NsError> {
    write("/proc/self/setgroups", "deny")?;
    write(
        "/proc/self/uid_map",
        &format!("{inner_uid} {outer_uid} 1\n"),
    )?;
    write(
        "/proc/self/gid_map",
        &format!("{inner_gid} {outer_gid} 1\n"),
    )?;
    Ok(())
}

pub fn set_hostname(name: &str) -> Result<(), NsError> {
    // SAFETY: name is a live buffer of name.len() bytes (no NUL needed).
    let r = unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) };
    if r != 0 {
        return Err(NsError::Hostname {
            name: name.to_string(),
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}
