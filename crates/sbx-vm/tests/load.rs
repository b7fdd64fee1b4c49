//! Issue 16, sbx-vm under load: `echo x | sbx-vm --backend qemu -- cat`
//! hung until killed at load average above 10. The race: the host sends
//! stdin and its EOF right behind START; under load the guest read them in
//! the same read as START, into its decoder, and then polled the channel
//! for bytes that had already arrived. Here: busy loops load both cores for
//! the duration of the test (and are killed after), the pipeline must print
//! x every time within a bound, and a boot that cannot finish within
//! `--boot-timeout` is 125 with one line, never a hang.

mod common;
use common::*;

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Busy loops, killed on drop (also when the test fails).
struct Load(Vec<Child>);

impl Load {
    fn start(n: usize) -> Load {
        Load(
            (0..n)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .spawn()
                        .unwrap()
                })
                .collect(),
        )
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs `c` with `input` on stdin, at most `limit`; (status code, stdout, stderr).
fn run_with_stdin(mut c: Command, input: &[u8], limit: Duration) -> (Option<i32>, String, String) {
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    let t0 = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("sbx-vm still running after {limit:?} (hang)");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn stdin_to_cat_under_load_never_hangs() {
    let guest = need_guest!();
    let _load = Load::start(3);
    for i in 0..3 {
        let vm = Vm::new();
        let mut c = vm.cmd(&guest);
        c.args(["--boot-timeout", "120s", "--", "cat"]);
        let (code, out, err) = run_with_stdin(c, b"x\n", Duration::from_secs(200));
        assert_eq!(code, Some(0), "run {i}: {err}");
        assert_eq!(out, "x\n", "run {i}: {err}");
        vm.assert_clean();
    }
}

#[test]
fn a_boot_that_does_not_finish_in_time_is_125_under_load() {
    let guest = need_guest!();
    let _load = Load::start(3);
    let vm = Vm::new();
    let mut c = vm.cmd(&guest);
    c.args(["--boot-timeout", "300ms", "--", "cat"]);
    let t0 = Instant::now();
    let (code, out, err) = run_with_stdin(c, b"x\n", Duration::from_secs(60));
    assert_eq!(code, Some(125), "{out} {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("boot timeout"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    vm.assert_clean();
}
