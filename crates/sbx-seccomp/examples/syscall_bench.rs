//! Benchmark helper: `syscall_bench [N]` times N getppid(), N/4 stat("/")
//! calls (raw syscalls, no libc caching), and N personality(0xffffffff)
//! queries, and prints `NAME NS_PER_CALL` for each. scripts/bench-seccomp runs
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
    // SAFETY: libc::stat is plain integers: all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: getppid takes no argument and cannot fail.
    let g = best_of(n, 10, || unsafe {
        libc::syscall(libc::SYS_getppid);
    });
    // SAFETY: root is a static NUL-ended path, st a live stat for the kernel to fill.
    let s = best_of(n / 4, 10, || unsafe {
        libc::syscall(
            libc::SYS_newfstatat,
            libc::AT_FDCWD,
            root.as_ptr(),
            std::ptr::from_mut::<libc::stat>(&mut st),
            0,
        );
    });
    // personality(0xffffffff) (a query) is argument-checked by the default
    // profile: the filter really runs for it.
    // SAFETY: personality with an integer query argument changes nothing.
    let p = best_of(n, 10, || unsafe {
        libc::syscall(libc::SYS_personality, libc::c_long::from(0xffff_ffffu32));
    });
    println!("getppid {g:.1}");
    println!("stat {s:.1}");
    println!("personality {p:.1}");
}
