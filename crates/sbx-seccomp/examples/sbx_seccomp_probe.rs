//! Test helper: makes one named system call directly (raw `syscall(2)`,
//! `int 0x80`, an x32 number, `rdtsc`) with harmless arguments and prints
//! `ok RET` or `err ERRNO`. Used by the sbx-seccomp tests; not installed.
//!
//! The arguments are chosen so that, without a filter, each call fails
//! with an error of its own (EINVAL, EFAULT, EBADF, ENOENT...) or succeeds
//! without effect: only a filter turns the answer into EPERM, ENOSYS or a
//! SIGSYS kill.

use std::ffi::CString;
use std::ptr::null;

use libc::{c_long, syscall};

fn raw(r: c_long) -> Result<c_long, i32> {
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(r)
    }
}

fn c(s: &str) -> CString {
    CString::new(s).unwrap()
}

/// clone(flags|SIGCHLD) like fork: the child exits at once.
unsafe fn clone_flags(flags: c_long) -> c_long {
    // SAFETY: clone without CLONE_VM: the child has its own copy of memory and _exits at once.
    unsafe {
        let r = syscall(
            libc::SYS_clone,
            flags | c_long::from(libc::SIGCHLD),
            0,
            0,
            0,
            0,
        );
        if r == 0 {
            libc::_exit(0);
        }
        if r > 0 {
            libc::waitpid(r as i32, std::ptr::null_mut(), 0);
        }
        r
    }
}

/// A pty pair's follower fd, for the terminal ioctls.
unsafe fn pty() -> i32 {
    // SAFETY: the fds are ours; the names ptsname returns are used before any other pty call.
    unsafe {
        let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        assert!(m >= 0, "posix_openpt");
        libc::grantpt(m);
        libc::unlockpt(m);
        let name = libc::ptsname(m);
        let s = libc::open(name, libc::O_RDWR | libc::O_NOCTTY);
        assert!(s >= 0, "open pts");
        s
    }
}

#[cfg(target_arch = "x86_64")]
unsafe fn int80_getpid() -> c_long {
    let mut ret: c_long = 20; // __NR_getpid on i386
    // SAFETY: int 0x80 with eax=getpid reads and writes rax only, touches no memory or stack.
    unsafe {
        std::arch::asm!("int 0x80", inout("rax") ret, options(nostack));
    }
    if ret < 0 {
        // The i386 entry returns -errno directly.
        // SAFETY: __errno_location returns this thread's errno, always valid.
        unsafe { *libc::__errno_location() = -ret as i32 };
        return -1;
    }
    ret
}

#[cfg(target_arch = "x86_64")]
fn rdtsc() -> c_long {
    // SAFETY: rdtsc only reads the time stamp counter.
    unsafe { std::arch::x86_64::_rdtsc() as c_long & 0x7fff_ffff }
}

fn call(name: &str) -> Result<c_long, i32> {
    use libc::*;
    let none = null::<c_void>();
    let nonexist = c("/nonexistent-sbx-probe");
    let empty = c("");
    // SAFETY: each probe passes integers, null, or NUL-ended strings that live on this frame.
    unsafe {
        let r: c_long = match name {
            "getpid" => syscall(SYS_getpid),
            "getppid" => syscall(SYS_getppid),
            "mount" => syscall(SYS_mount, none, nonexist.as_ptr(), none, 0, none),
            "umount2" => syscall(SYS_umount2, nonexist.as_ptr(), 0),
            "pivot_root" => syscall(SYS_pivot_root, nonexist.as_ptr(), nonexist.as_ptr()),
            "chroot" => syscall(SYS_chroot, nonexist.as_ptr()),
            "swapon" => syscall(SYS_swapon, nonexist.as_ptr(), 0),
            "swapoff" => syscall(SYS_swapoff, nonexist.as_ptr()),
            // Wrong magic: the kernel answers EINVAL.
            "reboot" => syscall(SYS_reboot, 0, 0, 0, none),
            // Invalid flags: EINVAL before anything is loaded.
            "kexec_load" => syscall(SYS_kexec_load, 0, 0, none, 0xdead_0000 as c_long),
            "kexec_file_load" => {
                syscall(SYS_kexec_file_load, -1, -1, 0, none, 0xdead_0000 as c_long)
            }
            "init_module" => syscall(SYS_init_module, none, 0, empty.as_ptr()),
            "finit_module" => syscall(SYS_finit_module, -1, empty.as_ptr(), 0),
            "delete_module" => syscall(
                SYS_delete_module,
                c("sbx_no_such_module").as_ptr(),
                O_NONBLOCK,
            ),
            "bpf" => syscall(SYS_bpf, -1, none, 0),
            "perf_event_open" => syscall(SYS_perf_event_open, none, 0, -1, -1, 0),
            "keyctl" => syscall(SYS_keyctl, -1, 0, 0, 0, 0),
            "add_key" => syscall(SYS_add_key, none, none, none, 0, 0),
            "request_key" => syscall(SYS_request_key, none, none, none, 0),
            "userfaultfd" => syscall(SYS_userfaultfd, 0xffff_ffff as c_long),
            "unshare" => syscall(SYS_unshare, 0),
            "unshare_newuser" => syscall(SYS_unshare, c_long::from(CLONE_NEWUSER)),
            "setns" => syscall(SYS_setns, -1, 0),
            "clone_newuser" => clone_flags(c_long::from(CLONE_NEWUSER)),
            "clone_newns" => clone_flags(c_long::from(CLONE_NEWNS)),
            "clone_newnet" => clone_flags(c_long::from(CLONE_NEWNET)),
            "clone_newpid" => clone_flags(c_long::from(CLONE_NEWPID)),
            "clone_plain" => clone_flags(0),
            "clone3" => syscall(SYS_clone3, none, 0),
            "fsopen" => syscall(SYS_fsopen, c("sbx_no_such_fs").as_ptr(), 0),
            "fsconfig" => syscall(SYS_fsconfig, -1, 0, none, none, 0),
            "fsmount" => syscall(SYS_fsmount, -1, 0, 0),
            "fspick" => syscall(SYS_fspick, -1, nonexist.as_ptr(), 0),
            "move_mount" => syscall(
                SYS_move_mount,
                -1,
                nonexist.as_ptr(),
                -1,
                nonexist.as_ptr(),
                0,
            ),
            "open_tree" => syscall(SYS_open_tree, -1, nonexist.as_ptr(), 0),
            "mount_setattr" => syscall(SYS_mount_setattr, -1, nonexist.as_ptr(), 0, none, 0),
            "open_by_handle_at" => syscall(SYS_open_by_handle_at, -1, none, 0),
            "name_to_handle_at" => {
                syscall(SYS_name_to_handle_at, -1, nonexist.as_ptr(), none, none, 0)
            }
            "ptrace" => syscall(SYS_ptrace, PTRACE_PEEKDATA, 0x7fff_fff0, 0, 0),
            "process_vm_readv" => syscall(SYS_process_vm_readv, 0x7fff_fff0, none, 0, none, 0, 0),
            "process_vm_writev" => syscall(SYS_process_vm_writev, 0x7fff_fff0, none, 0, none, 0, 0),
            "io_uring_setup" => syscall(SYS_io_uring_setup, 0, none),
            "io_uring_enter" => syscall(SYS_io_uring_enter, -1, 0, 0, 0, none, 0),
            "io_uring_register" => syscall(SYS_io_uring_register, -1, 0, none, 0),
            #[cfg(target_arch = "x86_64")]
            "iopl" => syscall(SYS_iopl, 4),
            #[cfg(target_arch = "x86_64")]
            "ioperm" => syscall(SYS_ioperm, 0x10000, 1, 0),
            #[cfg(target_arch = "x86_64")]
            "modify_ldt" => syscall(SYS_modify_ldt, 0xff, none, 0),
            "acct" => syscall(SYS_acct, nonexist.as_ptr()),
            "quotactl" => syscall(SYS_quotactl, 0, nonexist.as_ptr(), 0, none),
            // SYSLOG_ACTION_SIZE_BUFFER: reads a number.
            "syslog" => syscall(SYS_syslog, 10, none, 0),
            // Both NULL: a no-op.
            "settimeofday" => syscall(SYS_settimeofday, none, none),
            "clock_settime" => syscall(SYS_clock_settime, CLOCK_MONOTONIC, none),
            "clock_adjtime" => syscall(SYS_clock_adjtime, CLOCK_REALTIME, none),
            "adjtimex" => syscall(SYS_adjtimex, none),
            // PER_BSD: the call returns the old persona; the probe exits next.
            "personality_bsd" => syscall(SYS_personality, 0x0006),
            "personality_query" => syscall(SYS_personality, 0xffff_ffff as c_long),
            "personality_linux" => syscall(SYS_personality, 0),
            "personality_no_aslr" => syscall(SYS_personality, 0x0040000),
            "tiocsti" => {
                let fd = pty();
                let ch = b'x';
                syscall(SYS_ioctl, fd, TIOCSTI, std::ptr::from_ref::<u8>(&ch))
            }
            "tioclinux" => {
                let fd = pty();
                let sub = 0u8;
                syscall(SYS_ioctl, fd, TIOCLINUX, std::ptr::from_ref::<u8>(&sub))
            }
            "tiocgwinsz" => {
                let fd = pty();
                let mut ws: winsize = std::mem::zeroed();
                syscall(
                    SYS_ioctl,
                    fd,
                    TIOCGWINSZ,
                    std::ptr::from_mut::<winsize>(&mut ws),
                )
            }
            #[cfg(target_arch = "x86_64")]
            "x32_getpid" => syscall(0x4000_0000 | SYS_getpid),
            #[cfg(target_arch = "x86_64")]
            "i386_getpid" => int80_getpid(),
            // Above seccompiler's table (open_tree_attr on 6.15+).
            "unknown_467" => syscall(467, -1, nonexist.as_ptr(), 0, none, 0),
            #[cfg(target_arch = "x86_64")]
            "rdtsc" => rdtsc(),
            "socket_inet" => syscall(SYS_socket, AF_INET, SOCK_STREAM, 0),
            "socket_inet6" => syscall(SYS_socket, AF_INET6, SOCK_DGRAM, 0),
            "socket_packet" => syscall(SYS_socket, AF_PACKET, SOCK_RAW, 0),
            "socket_netlink" => syscall(SYS_socket, AF_NETLINK, SOCK_RAW, 0),
            "socket_unix" => syscall(SYS_socket, AF_UNIX, SOCK_STREAM, 0),
            "socketpair" => {
                let mut sv = [0i32; 2];
                syscall(SYS_socketpair, AF_UNIX, SOCK_STREAM, 0, sv.as_mut_ptr())
            }
            "mknod" => syscall(
                SYS_mknodat,
                AT_FDCWD,
                c("/nonexistent-sbx-probe/fifo").as_ptr(),
                S_IFIFO | 0o600,
                0,
            ),
            other => {
                eprintln!("sbx_seccomp_probe: unknown probe {other}");
                std::process::exit(2);
            }
        };
        raw(r)
    }
}

fn main() {
    let names: Vec<String> = std::env::args().skip(1).collect();
    if names.is_empty() {
        eprintln!("usage: sbx_seccomp_probe NAME...");
        std::process::exit(2);
    }
    for n in names {
        // `NAME*N`: the call N times (a flood); the last answer is printed.
        let (n, times) = match n.split_once('*') {
            Some((a, b)) => (a.to_string(), b.parse::<u32>().expect("NAME*N")),
            None => (n, 1),
        };
        let mut r = call(&n);
        for _ in 1..times {
            r = call(&n);
        }
        match r {
            Ok(v) => println!("{n} ok {v}"),
            Err(e) => println!("{n} err {e}"),
        }
    }
}
