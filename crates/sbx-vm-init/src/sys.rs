//! Raw syscalls the guest init needs (libc only: the binary is static).

use std::ffi::CString;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

fn cstr(s: &str) -> CString {
    CString::new(s).expect("no NUL in a path")
}

fn check(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

pub fn mount(
    src: &str,
    target: &str,
    fstype: &str,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let _ = std::fs::create_dir_all(target);
    let (s, t, f) = (cstr(src), cstr(target), cstr(fstype));
    let d = data.map(cstr);
    // SAFETY: the strings are NUL-ended and alive for the call; data is null or NUL-ended.
    let r = unsafe {
        libc::mount(
            s.as_ptr(),
            t.as_ptr(),
            f.as_ptr(),
            flags,
            d.as_ref().map_or(std::ptr::null(), |d| d.as_ptr().cast()),
        )
    };
    check(r).map_err(|e| io::Error::new(e.kind(), format!("mount {fstype} on {target}: {e}")))
}

pub fn move_mount(from: &str, to: &str) -> io::Result<()> {
    let (f, t) = (cstr(from), cstr(to));
    // SAFETY: f and t are NUL-ended and alive for the call; the null pointers are allowed for
    // MS_MOVE.
    let r = unsafe {
        libc::mount(
            f.as_ptr(),
            t.as_ptr(),
            std::ptr::null(),
            libc::MS_MOVE,
            std::ptr::null(),
        )
    };
    check(r).map_err(|e| io::Error::new(e.kind(), format!("move mount {from} to {to}: {e}")))
}

pub fn load_module(path: &Path) -> io::Result<()> {
    let f = std::fs::File::open(path)?;
    let params = cstr("");
    // SAFETY: f keeps the module file open; params is NUL-ended, both alive for the call.
    let r = unsafe { libc::syscall(libc::SYS_finit_module, f.as_raw_fd(), params.as_ptr(), 0) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EEXIST) {
            return Ok(());
        }
        return Err(e);
    }
    Ok(())
}

pub fn unload_module(name: &str) -> io::Result<()> {
    let n = cstr(name);
    // SAFETY: n is NUL-ended and alive for the call.
    let r = unsafe { libc::syscall(libc::SYS_delete_module, n.as_ptr(), libc::O_NONBLOCK) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub fn chroot_here() -> io::Result<()> {
    let dot = cstr(".");
    // SAFETY: dot is NUL-ended and alive for the call.
    check(unsafe { libc::chroot(dot.as_ptr()) })?;
    std::env::set_current_dir("/")
}

pub fn set_clock_ms(unix_ms: u64) {
    let ts = libc::timespec {
        tv_sec: (unix_ms / 1000) as libc::time_t,
        tv_nsec: ((unix_ms % 1000) * 1_000_000) as libc::c_long,
    };
    // SAFETY: ts is a live timespec read by the kernel.
    unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) };
}

pub fn uptime_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a live timespec for the kernel to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// Syncs and restarts the machine: the VMMs are run so that a guest reboot
/// ends them (QEMU `-no-reboot`, Firecracker exits on the i8042 reset).
pub fn power_off() -> ! {
    // SAFETY: sync and reboot take integers only; this is the guest's PID 1 ending the machine.
    unsafe {
        libc::sync();
        // QEMU microvm powers off through ACPI; Firecracker exits on the
        // reset (and the host runs QEMU with -no-reboot too).
        libc::reboot(libc::RB_POWER_OFF);
        libc::reboot(libc::RB_AUTOBOOT);
        libc::reboot(libc::RB_HALT_SYSTEM);
    }
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

/// Blocks `sigs` in this thread and returns a signalfd for them.
pub fn signalfd(sigs: &[libc::c_int]) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: set is a live sigset (all-zero is valid, then emptied); the signalfd is owned
    // just below.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in sigs {
            libc::sigaddset(&mut set, *s);
        }
        check(libc::pthread_sigmask(
            libc::SIG_BLOCK,
            &set,
            std::ptr::null_mut(),
        ))?;
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(std::os::fd::OwnedFd::from_raw_fd(fd))
    }
}

pub fn set_nonblocking(fd: libc::c_int) {
    // SAFETY: fcntl on an fd number only reads and sets its flags.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
}

/// read(2) that reports EAGAIN as `Ok(None)`.
pub fn read_nb(fd: libc::c_int, buf: &mut [u8]) -> io::Result<Option<usize>> {
    loop {
        // SAFETY: buf is a live buffer of buf.len() bytes.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Ok(None),
            _ => return Err(e),
        }
    }
}

pub fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
    loop {
        // SAFETY: fds is a live slice of fds.len() pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
