//! Test helper for `--allow-exec`: executes a file the ways a program can
//! and prints what the kernel answered. Used by the sbx-seccomp tests; not
//! installed.
//!
//! - `fexec PATH`: open PATH, then `execveat(fd, "", AT_EMPTY_PATH)`
//!   (fexecve); on failure prints `err ERRNO`, exits 126.
//! - `atexec DIR NAME`: `execveat(open(DIR), NAME, 0)`; same output.
//! - `flood PATH N`: N times `execve(PATH)` (each expected to fail);
//!   prints `failed K` and exits 0 (exits 0 too if one succeeds: then the
//!   file ran instead, which the test sees from its output).
//! - `memfd SRC`: copies SRC into a memfd (memfd_create, no flags) and
//!   executes it with `execveat(fd, "", AT_EMPTY_PATH)`; same output as
//!   fexec.
//! - `memfdpath SRC PREFIX`: the same memfd, executed by path:
//!   `execve(PREFIX + fd)` (PREFIX `/proc/self/fd/` or `/dev/fd/`).
//! - `memfdmode`: creates a memfd (MFD_CLOEXEC), prints `mode OCTAL`,
//!   tries fchmod 0755 (`chmod ok|err N`), writes and reads back 5 bytes
//!   (`rw ok`), then asks for MFD_EXEC (`exec_flag ok|err N`).
//! - `spawn PATH N`: N times fork + execve(PATH) + wait; prints
//!   `ns_per_exec X` (scripts/bench-seccomp).

use std::ffi::CString;

fn c(s: &str) -> CString {
    CString::new(s).unwrap()
}

fn fail() -> ! {
    let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    println!("err {e}");
    std::process::exit(126);
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let empty = c("");
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    match a.get(1).map(String::as_str) {
        Some("fexec") => {
            let p = c(&a[2]);
            let argv = [p.as_ptr(), std::ptr::null()];
            // SAFETY: p and argv (null-ended) live on this frame for the calls; exec replaces
            // the process or fails.
            unsafe {
                let fd = libc::open(p.as_ptr(), libc::O_RDONLY);
                if fd < 0 {
                    fail();
                }
                libc::syscall(
                    libc::SYS_execveat,
                    fd,
                    empty.as_ptr(),
                    argv.as_ptr(),
                    envp.as_ptr(),
                    libc::AT_EMPTY_PATH,
                );
            }
            fail();
        }
        Some("atexec") => {
            let d = c(&a[2]);
            let n = c(&a[3]);
            let argv = [n.as_ptr(), std::ptr::null()];
            // SAFETY: d, n and argv (null-ended) live on this frame for the calls; the fd is
            // ours.
            unsafe {
                let fd = libc::open(d.as_ptr(), libc::O_PATH | libc::O_DIRECTORY);
                if fd < 0 {
                    fail();
                }
                libc::syscall(
                    libc::SYS_execveat,
                    fd,
                    n.as_ptr(),
                    argv.as_ptr(),
                    envp.as_ptr(),
                    0,
                );
            }
            fail();
        }
        Some("flood") => {
            let p = c(&a[2]);
            let n: u32 = a[3].parse().unwrap();
            let argv = [p.as_ptr(), std::ptr::null()];
            let mut failed = 0;
            for _ in 0..n {
                // SAFETY: p, argv and envp (null-ended) live on this frame for the call.
                if unsafe { libc::execve(p.as_ptr(), argv.as_ptr(), envp.as_ptr()) } < 0 {
                    failed += 1;
                }
            }
            println!("failed {failed}");
        }
        Some("memfd") => {
            let data = std::fs::read(&a[2]).unwrap();
            let name = c("sbx-built");
            let argv = [name.as_ptr(), std::ptr::null()];
            // SAFETY: name, data and argv (null-ended) live on this frame for the calls; the
            // memfd is ours.
            unsafe {
                let fd = libc::memfd_create(name.as_ptr(), 0);
                if fd < 0 {
                    fail();
                }
                if libc::write(fd, data.as_ptr().cast(), data.len()) != data.len() as isize {
                    fail();
                }
                libc::syscall(
                    libc::SYS_execveat,
                    fd,
                    empty.as_ptr(),
                    argv.as_ptr(),
                    envp.as_ptr(),
                    libc::AT_EMPTY_PATH,
                );
            }
            fail();
        }
        Some("memfdpath") => {
            let data = std::fs::read(&a[2]).unwrap();
            let name = c("sbx-built");
            // SAFETY: name and data live on this frame for the calls; the memfd is ours.
            unsafe {
                let fd = libc::memfd_create(name.as_ptr(), 0);
                if fd < 0 {
                    fail();
                }
                if libc::write(fd, data.as_ptr().cast(), data.len()) != data.len() as isize {
                    fail();
                }
                let p = c(&format!("{}{fd}", a[3]));
                let argv = [p.as_ptr(), std::ptr::null()];
                libc::execve(p.as_ptr(), argv.as_ptr(), envp.as_ptr());
            }
            fail();
        }
        // SAFETY: name lives on this frame for the calls; the memfd is ours.
        Some("memfdmode") => unsafe {
            let name = c("sbx-mode");
            let fd = libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC);
            if fd < 0 {
                fail();
            }
            let mut st: libc::stat = std::mem::zeroed();
            libc::fstat(fd, &mut st);
            println!("mode {:o}", st.st_mode & 0o7777);
            if libc::fchmod(fd, 0o755) == 0 {
                println!("chmod ok");
            } else {
                println!(
                    "chmod err {}",
                    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
                );
            }
            let w = libc::write(fd, b"hello".as_ptr().cast(), 5);
            let mut buf = [0u8; 5];
            let r = libc::pread(fd, buf.as_mut_ptr().cast(), 5, 0);
            println!(
                "rw {}",
                if w == 5 && r == 5 && &buf == b"hello" {
                    "ok"
                } else {
                    "bad"
                }
            );
            let fd2 = libc::memfd_create(name.as_ptr(), 0x10);
            if fd2 >= 0 {
                println!("exec_flag ok");
            } else {
                println!(
                    "exec_flag err {}",
                    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
                );
            }
        },
        Some("spawn") => {
            let p = c(&a[2]);
            let n: u32 = a[3].parse().unwrap();
            let argv = [p.as_ptr(), std::ptr::null()];
            let t = std::time::Instant::now();
            for _ in 0..n {
                // SAFETY: the probe is one thread; the child only execs or _exits; argv and
                // envp live on this frame.
                unsafe {
                    let pid = libc::fork();
                    if pid == 0 {
                        libc::execve(p.as_ptr(), argv.as_ptr(), envp.as_ptr());
                        libc::_exit(127);
                    }
                    let mut st = 0;
                    libc::waitpid(pid, &mut st, 0);
                    if st != 0 {
                        eprintln!("{} failed: status {st}", a[2]);
                        std::process::exit(1);
                    }
                }
            }
            println!(
                "ns_per_exec {}",
                t.elapsed().as_nanos() / u128::from(n.max(1))
            );
        }
        _ => {
            eprintln!(
                "usage: sbx_seccomp_exec fexec PATH | atexec DIR NAME | flood PATH N | spawn PATH N"
            );
            std::process::exit(2);
        }
    }
}
