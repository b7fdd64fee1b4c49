//! Helpers shared by the end-to-end tests: they run the built binaries as a
//! user would, as root and as the unprivileged test user.
#![allow(dead_code)]

pub mod container;
pub mod openbao;
pub mod phantom;
pub mod testnet;

use std::ffi::OsStr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// The unprivileged user the tests run tools as (scripts/setup creates it).
pub const TEST_USER: &str = "sbxtest";

/// Path of a built binary of this package (target/<profile>/<name>).
pub fn bin(name: &str) -> PathBuf {
    // scripts/test points this at a copy the unprivileged user can reach
    // when the checkout itself is not.
    if let Some(d) = std::env::var_os("SBX_TEST_BIN_DIR") {
        return Path::new(&d).join(name);
    }
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test-binary>
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let p = dir.join(name);
    assert!(p.exists(), "{} not built", p.display());
    p
}

/// A Command for a built tool.
pub fn tool(name: &str) -> Command {
    let mut c = Command::new(bin(name));
    c.env_remove("SBX_ID")
        .env_remove("SBX_AUDIT_LOG")
        .env_remove("SBX_AUDIT_FD")
        .env_remove("SBX_SUPERVISOR")
        .env_remove("SBX_LOG");
    c
}

/// Whether a missing prerequisite must fail the test (CI sets SBX_MUST_WORK=1).
pub fn must_work() -> bool {
    std::env::var("SBX_MUST_WORK").is_ok_and(|v| v == "1")
}

/// Skips the calling test with a reason, or fails it under SBX_MUST_WORK=1.
#[macro_export]
macro_rules! skip {
    ($($why:tt)*) => {{
        let why = format!($($why)*);
        if $crate::must_work() {
            panic!("prerequisite missing (SBX_MUST_WORK=1): {why}");
        }
        eprintln!("skipped: {why}");
        return;
    }};
}

pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// uid and gid of the unprivileged test user, if it exists.
pub fn test_user() -> Option<(u32, u32)> {
    let name = std::ffi::CString::new(TEST_USER).unwrap();
    // SAFETY: name is NUL-ended and alive for the call; the result is checked for null.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        return None;
    }
    // SAFETY: pw is non-null, pointing at libc's record until the next getpw* call; copied out
    // at once.
    Some(unsafe { ((*pw).pw_uid, (*pw).pw_gid) })
}

/// Makes `cmd` run as the unprivileged test user (needs root).
pub fn as_test_user(cmd: &mut Command) -> bool {
    let Some((uid, gid)) = test_user() else {
        return false;
    };
    if !is_root() {
        return false;
    }
    cmd.env("HOME", format!("/home/{TEST_USER}"))
        .env("USER", TEST_USER);
    // SAFETY: the pre_exec closure only makes raw id-changing syscalls with integers (async-
    // signal-safe).
    unsafe {
        cmd.pre_exec(move || {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(gid) != 0
                || libc::setuid(uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    true
}

/// Who a test runs a tool as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum As {
    Root,
    User,
}

/// The identities to run a test under: root (when we are root) and the
/// unprivileged test user (when it exists).
pub fn identities() -> Vec<As> {
    let mut v = Vec::new();
    if is_root() {
        v.push(As::Root);
        if test_user().is_some() {
            v.push(As::User);
        } else if must_work() {
            panic!("test user {TEST_USER} missing (run scripts/setup)");
        }
    } else {
        v.push(As::User);
    }
    v
}

/// Applies an identity to a command.
pub fn run_as(cmd: &mut Command, who: As) {
    if who == As::User && is_root() {
        assert!(as_test_user(cmd), "cannot switch to {TEST_USER}");
    }
}

/// A temp dir the test user can use too.
pub fn shared_tempdir() -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("sbx-test-")
        .tempdir()
        .unwrap();
    chown_to_test_user(d.path());
    d
}

/// Makes a FIFO at `p` (mode 0644), for the tests that plant one.
pub fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-ended path alive for the call.
    let r = unsafe { libc::mkfifo(c.as_ptr(), 0o644) };
    assert_eq!(r, 0, "mkfifo {}", p.display());
}

/// Gives `p` to the test user (when we are root and it exists).
pub fn chown_to_test_user(p: &Path) {
    if let (true, Some((uid, gid))) = (is_root(), test_user()) {
        std::os::unix::fs::chown(p, Some(uid), Some(gid)).unwrap();
    }
}

/// Runs and captures; panics if it could not start.
pub fn output(cmd: &mut Command) -> Output {
    cmd.output().expect("spawn")
}

/// Exit code (128+N for a signal, as the tools report).
pub fn code(out: &Output) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    out.status
        .code()
        .unwrap_or_else(|| 128 + out.status.signal().unwrap_or(0))
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts a bad-input failure: exit 125 and exactly one line on stderr
/// that contains `needle`.
pub fn assert_usage_error(out: &Output, needle: &str) {
    let err = stderr(out);
    assert_eq!(code(out), 125, "want exit 125, stderr: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "want one line, got: {err}"
    );
    assert!(err.contains(needle), "stderr {err:?} lacks {needle:?}");
}

/// The events of a JSON-lines audit log: its complete lines (a reader
/// racing a writer that is still running may see the start of a line the
/// writer has not finished: that fragment is not an event yet).
pub fn audit_events(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let complete = text.rfind('\n').map_or("", |i| &text[..i]);
    complete
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad audit line {l:?}: {e}")))
        .collect()
}

/// Asserts an event named `event` with `severity` exists for which `pred`
/// holds; returns it.
pub fn assert_event(
    path: &Path,
    event: &str,
    severity: &str,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    let evs = audit_events(path);
    for e in &evs {
        for k in ["ts", "sbx_id", "tool", "pid", "event", "severity"] {
            assert!(e.get(k).is_some(), "audit event lacks {k}: {e}");
        }
    }
    evs.iter()
        .find(|e| e["event"] == event && e["severity"] == severity && pred(e))
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "no {severity} event {event:?} matching in {}:\n{}",
                path.display(),
                evs.iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("\n")
            )
        })
}

/// Whether a program is on PATH.
/// Ways a tool's stderr can be gone: closed (`2>&-`: the Rust runtime
/// reopens fd 2 on /dev/null), a pipe whose reader left (EPIPE) and a full
/// device (ENOSPC). On the last two `eprintln!` panics: exit 101.
pub const STDERR_GONE: [&str; 3] = ["closed", "broken pipe", "full"];

/// Makes `c`'s stderr gone in the way `how` (one of [`STDERR_GONE`]) says.
pub fn stderr_gone(c: &mut Command, how: &str) {
    match how {
        "closed" => {
            // SAFETY: the pre_exec closure only closes fd 2 (async-signal-safe).
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(c, || {
                    libc::close(2);
                    Ok(())
                });
            }
        }
        "broken pipe" => {
            let (r, w) = std::io::pipe().unwrap();
            drop(r);
            c.stderr(w);
        }
        "full" => {
            c.stderr(
                std::fs::OpenOptions::new()
                    .write(true)
                    .open("/dev/full")
                    .unwrap(),
            );
        }
        other => panic!("stderr_gone: unknown way {other:?}"),
    }
}

pub fn have(prog: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
        .unwrap_or(false)
}

/// A unique name for resources this test creates (pid + counter).
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}{}x{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

pub fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// Runs `cmd` with stdin from /dev/null and stdout and stderr captured,
/// bounded in time: see [`wait_within`].
pub fn output_within(cmd: &mut Command, limit: std::time::Duration) -> Output {
    use std::process::Stdio;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    wait_within(cmd, limit)
}

/// Runs `cmd` (its stdio as the caller set it; what is piped is captured)
/// in a process group of its own. If it has not ended, and its captured
/// output has not been closed, within `limit`, the whole group is killed
/// (SIGKILL) and the test fails: a hang is a defect, never a wait. Output
/// still open after the command ended (a process it left behind holds it)
/// fails the test the same way.
// Every path waits: the kill closure reaps the child before it panics
// (clippy does not see through the closure).
#[allow(clippy::zombie_processes)]
pub fn wait_within(cmd: &mut Command, limit: std::time::Duration) -> Output {
    use std::io::Read;
    use std::sync::mpsc;
    use std::time::Instant;
    let what = format!("{cmd:?}");
    let what: String = what.chars().take(400).collect();
    cmd.process_group(0);
    let start = Instant::now();
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    let pgid = child.id() as i32;
    let (tx, rx) = mpsc::channel::<(u8, Vec<u8>)>();
    let mut pending = 0;
    if let Some(mut r) = child.stdout.take() {
        pending += 1;
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            let _ = tx.send((1, v));
        });
    }
    if let Some(mut r) = child.stderr.take() {
        pending += 1;
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            let _ = tx.send((2, v));
        });
    }
    drop(tx);
    let kill = |child: &mut std::process::Child, why: &str| -> ! {
        // SAFETY: kill(2) of the process group this helper created (the
        // child is its leader); nothing else is in it.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        let _ = child.wait();
        panic!("{what}: {why} after {limit:?} (a hang): killed");
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let mut status = None;
    loop {
        if status.is_none() {
            status = child.try_wait().expect("wait");
        }
        if status.is_some() && pending == 0 {
            break;
        }
        if start.elapsed() >= limit {
            if status.is_none() {
                kill(&mut child, "still running");
            }
            kill(&mut child, "its output still open (a process it left)");
        }
        match rx.recv_timeout(std::time::Duration::from_millis(20)) {
            Ok((1, v)) => {
                out = v;
                pending -= 1;
            }
            Ok((_, v)) => {
                err = v;
                pending -= 1;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                pending = 0;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }
    Output {
        status: status.unwrap(),
        stdout: out,
        stderr: err,
    }
}

#[cfg(test)]
mod within_tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn panics_fast(script: &str) -> String {
        let t0 = Instant::now();
        let r = std::panic::catch_unwind(|| {
            let mut c = Command::new("sh");
            c.args(["-c", script]);
            output_within(&mut c, Duration::from_millis(500))
        });
        assert!(t0.elapsed() < Duration::from_secs(5), "not killed in time");
        let e = r.expect_err("an overrun must fail the test");
        e.downcast_ref::<String>().cloned().unwrap_or_default()
    }

    #[test]
    fn a_command_that_overruns_is_killed_and_fails() {
        assert!(panics_fast("sleep 30").contains("still running"));
        // A process left behind holding the output: its group is killed.
        assert!(panics_fast("sleep 30 & echo started").contains("output still open"));
    }

    #[test]
    fn a_command_within_its_time_gives_its_output() {
        let mut c = Command::new("sh");
        c.args(["-c", "echo out; echo err >&2; exit 3"]);
        let o = output_within(&mut c, Duration::from_secs(30));
        assert_eq!(
            (code(&o), stdout(&o), stderr(&o)),
            (3, "out\n".into(), "err\n".into())
        );
    }
}
