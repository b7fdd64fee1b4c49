//! Dropping privilege before the command runs: the identity inside, every
//! capability (bounding, ambient, effective, permitted, inheritable) and
//! no_new_privs. Runs in the forked command process, after fork and before
//! exec: only async-signal-safe calls.
//!
//! Nothing is kept for the next program, sbx tool or not: sbx-fs is the
//! innermost namespace layer of the chain, and the only tool after it,
//! sbx-seccomp, needs no capability (it sets no_new_privs itself and
//! installs its filter unprivileged), so every command starts with none.

use std::io;

fn last_cap() -> u32 {
    // CAP_LAST_CAP of this kernel (bounded, so a bad read cannot loop long).
    let mut buf = [0u8; 16];
    // SAFETY: the path is a NUL-ended literal; the fd is closed below.
    let fd = unsafe {
        libc::open(
            c"/proc/sys/kernel/cap_last_cap".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return 63;
    }
    // SAFETY: fd is open; buf is a live 16-byte buffer.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    // SAFETY: fd is ours and not used after.
    unsafe { libc::close(fd) };
    let mut v: u32 = 0;
    for &c in buf.iter().take(n.max(0) as usize) {
        if c.is_ascii_digit() {
            v = v * 10 + u32::from(c - b'0');
        } else {
            break;
        }
    }
    if v == 0 || v > 63 { 63 } else { v }
}

fn check(r: libc::c_int) -> io::Result<()> {
    if r != 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Switches to `uid`/`gid` (only when not already them: inside a user
/// namespace the mapping already made them ours), then drops everything.
pub fn drop_all(uid: u32, gid: u32, in_userns: bool) -> io::Result<()> {
    let last = last_cap();
    // /proc/sys may not be readable after the pivot: probe every cap.
    for cap in 0..=last {
        // SAFETY: prctl with integer arguments, on this process only.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) };
        if r != 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
            return Err(io::Error::last_os_error());
        }
    }
    // SAFETY: id and securebits changes on this process only; the null list with size 0 is what
    // setgroups allows.
    unsafe {
        if !in_userns {
            check(libc::setgroups(0, std::ptr::null()))?;
        }
        if libc::getegid() != gid || libc::getgid() != gid {
            check(libc::setresgid(gid, gid, gid))?;
        }
        if libc::geteuid() != uid || libc::getuid() != uid {
            check(libc::setresuid(uid, uid, uid))?;
        }
        check(libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        ))?;
    }
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut h = Header {
        version: 0x2008_0522,
        pid: 0,
    };
    let d = [
        Data {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        },
        Data {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        },
    ];
    // SAFETY: h and d are a live capability header and a two-element data array, as capset
    // reads.
    let r = unsafe {
        libc::syscall(
            libc::SYS_capset,
            std::ptr::from_mut::<Header>(&mut h),
            d.as_ptr(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: prctl with integer arguments, on this process only.
    check(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) })?;
    Ok(())
}
