//! Benchmark helper: `syscall_bench [N]` times N getppid() and N stat("/")
//! calls (raw syscalls, no libc caching) and prints one line per call:
//! `getppid NS_PER_CALL` and `stat NS_PER_CALL`. scripts/bench-seccomp runs
//! it with and without a filter. Not installed.

use std::time::Instant;

fn best_of<F: FnMut()>(n: u64, rounds: u32, mut f: F) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..rounds {
        let t = Instant::now();
        for _ in 0..n {
            f();
        }
        best = best.min(t.elapsed().as_nanos() as f64 / n as f64);
    }
    best
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000_000);
    let root = c"/";
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let g = best_of(n, 5, || unsafe {
        libc::syscall(libc::SYS_getppid);
    });
    let s = best_of(n / 4, 5, || unsafe {
        libc::syscall(
            libc::SYS_newfstatat,
            libc::AT_FDCWD,
            root.as_ptr(),
            &mut st as *mut libc::stat,
            0,
        );
    });
    println!("getppid {g:.1}");
    println!("stat {s:.1}");
}
