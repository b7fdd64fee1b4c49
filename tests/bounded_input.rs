//! Issue 16, bounded inputs: every flag that names a file sbx reads (the
//! `--config` of every tool, sbx-policy's `--settings`, `--managed` and
//! `--layers`, sbx-seccomp's `--policy`, the `--allow-file` of sbx-net and
//! sbx-dnsproxy, sbx-creds' `--token-file`/`--ca-cert`/`--role-id-file`/
//! `--secret-id-file`, sbx-vm's `--secrets-from`, sbx-container's
//! `--creds-config`) given /dev/zero, a FIFO (no writer), a directory or a
//! file over the size cap (sbx_core::input: 4 MiB for JSON and credential
//! files, 16 MiB for allow lists) is refused: exit 125 within a few seconds,
//! one line on stderr naming the flag, nothing run.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CONFIG_CAP: u64 = 4 << 20;
const LIST_CAP: u64 = 16 << 20;

struct Inputs {
    _d: tempfile::TempDir,
    ok_json: PathBuf,
    repo: PathBuf,
    fifo: PathBuf,
    dir: PathBuf,
    big_config: PathBuf,
    big_list: PathBuf,
}

fn inputs() -> Inputs {
    let d = tempfile::tempdir().unwrap();
    let base = d.path().canonicalize().unwrap();
    let ok_json = base.join("ok.json");
    std::fs::write(&ok_json, "{}").unwrap();
    let repo = base.join("repo");
    std::fs::create_dir(&repo).unwrap();
    let fifo = base.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads the NUL-terminated path it is given.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let dir = base.join("dir");
    std::fs::create_dir(&dir).unwrap();
    // Sparse: over the cap without writing megabytes.
    let big = |name: &str, len: u64| {
        let p = base.join(name);
        std::fs::File::create(&p).unwrap().set_len(len).unwrap();
        p
    };
    Inputs {
        big_config: big("big.json", CONFIG_CAP + 1),
        big_list: big("big.list", LIST_CAP + 1),
        _d: d,
        ok_json,
        repo,
        fifo,
        dir,
    }
}

/// (flag, whether its cap is the list cap, builder of the command for FILE).
type Case = (String, bool, Box<dyn Fn(&Path) -> Command>);

fn cases(i: &Inputs) -> Vec<Case> {
    let mut v: Vec<Case> = Vec::new();
    // --config of every tool (read before anything else is parsed).
    for (cmd, _) in xtask::tools() {
        let tool = cmd.get_name().to_string();
        v.push((
            "--config".into(),
            false,
            Box::new(move |p| {
                let mut c = sbx_testutil::tool(&tool);
                c.arg("--config").arg(p).args(["--", "true"]);
                c
            }),
        ));
    }
    let ok = i.ok_json.clone();
    let repo = i.repo.clone();
    let policy = move |sub: &str| {
        let mut c = sbx_testutil::tool("sbx-policy");
        c.arg(sub)
            .arg("--chdir")
            .arg(&repo)
            .arg("--home")
            .arg(repo.parent().unwrap());
        c
    };
    let p1 = policy.clone();
    v.push((
        "--settings".into(),
        false,
        Box::new(move |p| {
            let mut c = p1("compile");
            c.arg("--managed")
                .arg("/nonexistent")
                .arg("--settings")
                .arg(p);
            c
        }),
    ));
    let (p2, ok2) = (policy.clone(), ok.clone());
    v.push((
        "--managed".into(),
        false,
        Box::new(move |p| {
            let mut c = p2("compile");
            c.arg("--settings").arg(&ok2).arg("--managed").arg(p);
            c
        }),
    ));
    let (p3, ok3) = (policy, ok.clone());
    v.push((
        "--layers".into(),
        false,
        Box::new(move |p| {
            let mut c = p3("chain");
            c.arg("--settings")
                .arg(&ok3)
                .args(["--managed", "/nonexistent", "--print", "--layers"])
                .arg(p)
                .args(["--", "true"]);
            c
        }),
    ));
    v.push((
        "--policy".into(),
        false,
        Box::new(|p| {
            let mut c = sbx_testutil::tool("sbx-seccomp");
            c.arg("--policy").arg(p).args(["--", "true"]);
            c
        }),
    ));
    v.push((
        "--allow-file".into(),
        true,
        Box::new(|p| {
            let mut c = sbx_testutil::tool("sbx-net");
            c.arg("--allow-file").arg(p).args(["--", "true"]);
            c
        }),
    ));
    v.push((
        "--allow-file".into(),
        true,
        Box::new(|p| {
            let mut c = sbx_testutil::tool("sbx-dnsproxy");
            c.args(["--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9"])
                .arg("--allow-file")
                .arg(p);
            c
        }),
    ));
    for flag in ["--token-file", "--ca-cert"] {
        let ok = ok.clone();
        v.push((
            flag.into(),
            false,
            Box::new(move |p| {
                let mut c = sbx_testutil::tool("sbx-creds");
                // A CA file for an http:// address is refused unread.
                let addr = if flag == "--ca-cert" {
                    "https://127.0.0.1:9"
                } else {
                    "http://127.0.0.1:9"
                };
                c.args(["--vault-addr", addr, "--secret", "A=kv/x#y"]);
                if flag == "--ca-cert" {
                    c.arg("--token-file").arg(&ok);
                }
                c.arg(flag).arg(p).args(["--", "true"]);
                c
            }),
        ));
    }
    for flag in ["--role-id-file", "--secret-id-file"] {
        let ok = ok.clone();
        v.push((
            flag.into(),
            false,
            Box::new(move |p| {
                let mut c = sbx_testutil::tool("sbx-creds");
                c.args([
                    "--vault-addr",
                    "http://127.0.0.1:9",
                    "--secret",
                    "A=kv/x#y",
                    "--auth",
                    "approle",
                ]);
                let other = if flag == "--role-id-file" {
                    "--secret-id-file"
                } else {
                    "--role-id-file"
                };
                c.arg(other).arg(&ok);
                c.arg(flag).arg(p).args(["--", "true"]);
                c
            }),
        ));
    }
    v.push((
        "--secrets-from".into(),
        false,
        Box::new(|p| {
            let mut c = sbx_testutil::tool("sbx-vm");
            c.arg("--secrets-from").arg(p).args(["--", "true"]);
            c
        }),
    ));
    v.push((
        "--creds-config".into(),
        false,
        Box::new(|p| {
            let mut c = sbx_testutil::tool("sbx-container");
            c.arg("--creds-config").arg(p).args(["--", "true"]);
            c
        }),
    ));
    v
}

/// Runs with a 10 s bound; returns (status code, stderr, elapsed).
fn run_bounded(mut c: Command) -> (Option<i32>, String, Duration) {
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let t0 = Instant::now();
    let mut child = c.spawn().unwrap();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{c:?}: still running after 10 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut err = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (status.code(), err, t0.elapsed())
}

#[test]
fn every_input_flag_refuses_what_is_not_a_bounded_regular_file() {
    let i = inputs();
    let all = cases(&i);
    assert!(all.len() > 20, "every tool's --config and the file flags");
    for (flag, list, build) in &all {
        let big = if *list { &i.big_list } else { &i.big_config };
        for (input, want) in [
            (
                Path::new("/dev/zero"),
                "not a regular file (a character device)",
            ),
            (i.fifo.as_path(), "not a regular file (a FIFO)"),
            (i.dir.as_path(), "not a regular file (a directory)"),
            (big.as_path(), "larger than the cap of"),
        ] {
            let cmd = build(input);
            let what = format!("{:?} {:?}", cmd.get_program(), cmd.get_args());
            let (code, err, took) = run_bounded(cmd);
            assert_eq!(code, Some(125), "{what}: {err}");
            assert_eq!(err.trim_end().lines().count(), 1, "{what}: one line: {err}");
            assert!(err.contains(flag.as_str()), "{what}: names {flag}: {err}");
            assert!(err.contains(want), "{what}: says {want}: {err}");
            assert!(
                err.contains(&input.display().to_string()),
                "{what}: names the path: {err}"
            );
            assert!(took < Duration::from_secs(5), "{what}: took {took:?}");
        }
    }
}

/// `--config /dev/zero` used to read forever (0.5 GB/s) with SIGTERM
/// ignored (blocked for forwarding): now every tool refuses it at once.
#[test]
fn config_dev_zero_is_refused_at_once_for_every_tool() {
    for (cmd, _) in xtask::tools() {
        let mut c = sbx_testutil::tool(cmd.get_name());
        c.args(["--config", "/dev/zero", "--", "true"]);
        let (code, err, took) = run_bounded(c);
        assert_eq!(code, Some(125), "{}: {err}", cmd.get_name());
        assert!(err.contains("--config /dev/zero"), "{err}");
        assert!(took < Duration::from_secs(3), "{took:?}");
    }
}

/// The audit log is appended to, never read from a FIFO, a device or a
/// directory (a FIFO blocked the run once its pipe filled, with SIGTERM
/// blocked for forwarding; /dev/full made every event a second stderr
/// line), and a new one is never created through a dangling symlink: one
/// line naming the log, 125, nothing run.
#[test]
fn the_audit_log_is_a_regular_file_or_the_run_does_not_start() {
    let i = inputs();
    let base = i.dir.parent().unwrap().to_path_buf();
    let dangling = base.join("dangling");
    let target = base.join("made-through-the-link");
    std::os::unix::fs::symlink(&target, &dangling).unwrap();
    for tool in ["sbx-seccomp", "sbx-cgroup", "sbx-net", "sbx-fs"] {
        for (input, want) in [
            (i.fifo.as_path(), "not a regular file (a FIFO)"),
            (
                Path::new("/dev/full"),
                "not a regular file (a character device)",
            ),
            (i.dir.as_path(), "Is a directory"),
            (dangling.as_path(), "a dangling symlink"),
        ] {
            let mut c = sbx_testutil::tool(tool);
            c.arg("--audit-log")
                .arg(input)
                .args(["--", "sh", "-c", "echo RAN >&2"]);
            let what = format!("{tool} --audit-log {}", input.display());
            let (code, err, took) = run_bounded(c);
            assert_eq!(code, Some(125), "{what}: {err}");
            assert_eq!(err.trim_end().lines().count(), 1, "{what}: one line: {err}");
            assert!(
                err.contains("audit log") && err.contains(want),
                "{what}: {err}"
            );
            assert!(!err.contains("RAN"), "{what}: the command ran");
            assert!(took < Duration::from_secs(5), "{what}: took {took:?}");
            assert!(
                !target.exists(),
                "{what}: created through the dangling link"
            );
        }
    }
}

/// sbx-audit reads the log it is given as every input is read: a FIFO,
/// /dev/zero (it grew by a gigabyte a second), a directory or a log over
/// 1 GiB is one line and 125 at once.
#[test]
fn sbx_audit_refuses_what_is_not_a_bounded_regular_log() {
    let i = inputs();
    let huge = i.dir.parent().unwrap().join("huge.jsonl");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len((1 << 30) + 1)
        .unwrap();
    for sub in ["verify", "show", "tail"] {
        for (input, want) in [
            (i.fifo.as_path(), "not a regular file (a FIFO)"),
            (
                Path::new("/dev/zero"),
                "not a regular file (a character device)",
            ),
            (i.dir.as_path(), "not a regular file (a directory)"),
            (huge.as_path(), "larger than the cap of"),
        ] {
            let mut c = sbx_testutil::tool("sbx-audit");
            c.arg(sub).arg(input);
            let what = format!("sbx-audit {sub} {}", input.display());
            let (code, err, took) = run_bounded(c);
            assert_eq!(code, Some(125), "{what}: {err}");
            assert_eq!(err.trim_end().lines().count(), 1, "{what}: one line: {err}");
            assert!(err.contains(want), "{what}: {err}");
            assert!(took < Duration::from_secs(5), "{what}: took {took:?}");
        }
    }
}

/// A settings file sbx-policy cannot tell is there (a directory the user
/// cannot search, a symlink loop) is an error naming the flag, never
/// skipped as absent: skipped, the managed file's denials were dropped.
#[test]
fn settings_that_cannot_be_told_absent_are_refused_not_skipped() {
    let i = inputs();
    let base = i.dir.parent().unwrap().to_path_buf();
    let looped = base.join("loop1");
    std::os::unix::fs::symlink(base.join("loop2"), &looped).unwrap();
    std::os::unix::fs::symlink(&looped, base.join("loop2")).unwrap();
    let mut cases = vec![(looped.clone(), "Too many levels of symbolic links")];
    let closed = base.join("closed");
    if sbx_testutil::is_root() && sbx_testutil::test_user().is_some() {
        std::fs::create_dir(&closed).unwrap();
        std::fs::write(
            closed.join("managed.json"),
            r#"{"permissions": {"deny": ["Read(./.env)"]}}"#,
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
        cases.push((closed.join("managed.json"), "Permission denied"));
    }
    for who in sbx_testutil::identities() {
        for (p, want) in &cases {
            if who == sbx_testutil::As::Root && want.contains("Permission") {
                continue;
            }
            for flag in ["--managed", "--settings"] {
                let mut c = sbx_testutil::tool("sbx-policy");
                c.arg("compile")
                    .arg("--chdir")
                    .arg(&i.repo)
                    .arg(flag)
                    .arg(p);
                if flag == "--settings" {
                    c.args(["--managed", "/nonexistent"]);
                }
                sbx_testutil::run_as(&mut c, who);
                let what = format!("{who:?} {flag} {}", p.display());
                let (code, err, _) = run_bounded(c);
                assert_eq!(code, Some(125), "{what}: {err}");
                assert_eq!(err.trim_end().lines().count(), 1, "{what}: one line: {err}");
                assert!(err.contains(flag) && err.contains(want), "{what}: {err}");
            }
        }
    }
}

/// `sbx-container build` reads what it puts into the image as every input
/// is read: `--busybox` and `--ca-certs` given a FIFO or /dev/zero hung
/// (memory growing for /dev/zero) with SIGTERM blocked.
#[test]
fn image_inputs_are_regular_files_or_one_line() {
    let i = inputs();
    for flag in ["--busybox", "--ca-certs"] {
        for (input, want) in [
            (i.fifo.as_path(), "not a regular file (a FIFO)"),
            (
                Path::new("/dev/zero"),
                "not a regular file (a character device)",
            ),
            (i.dir.as_path(), "not a regular file (a directory)"),
        ] {
            let mut c = sbx_testutil::tool("sbx-container");
            c.arg("build")
                .arg("--tools")
                .arg(&i.dir)
                .arg(flag)
                .arg(input);
            let what = format!("build {flag} {}", input.display());
            let (code, err, took) = run_bounded(c);
            assert_eq!(code, Some(125), "{what}: {err}");
            assert_eq!(err.trim_end().lines().count(), 1, "{what}: one line: {err}");
            assert!(err.contains(flag) && err.contains(want), "{what}: {err}");
            assert!(took < Duration::from_secs(5), "{what}: took {took:?}");
        }
    }
}

/// A failure's line quotes the input that was wrong, at most 4 KiB of it:
/// a one-megabyte allow-file entry made a two-megabyte stderr line.
#[test]
fn a_failure_line_quotes_at_most_4_kib_of_the_input() {
    let i = inputs();
    let long = i.dir.parent().unwrap().join("long.list");
    std::fs::write(&long, format!("{}\n", "a".repeat(1 << 20))).unwrap();
    for tool in ["sbx-net", "sbx-dnsproxy"] {
        let mut c = sbx_testutil::tool(tool);
        c.arg("--allow-file").arg(&long);
        if tool == "sbx-net" {
            c.args(["--", "true"]);
        } else {
            c.args(["--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9"]);
        }
        let (code, err, _) = run_bounded(c);
        assert_eq!(code, Some(125), "{tool}: {}", &err[..err.len().min(300)]);
        assert_eq!(err.trim_end().lines().count(), 1, "{tool}: one line");
        assert!(err.len() < 4096 + 200, "{tool}: {} bytes", err.len());
        assert!(
            err.trim_end().ends_with("bytes more)"),
            "{tool}: {}",
            &err[err.len().saturating_sub(200)..]
        );
    }
}

/// The attacker's string: a newline, a carriage return, ESC and another C0
/// control (no NUL: argv cannot hold one).
const NASTY: &str = "a\nb\rc\x1bd\x01e";
/// How every stderr line shows [`NASTY`]: escaped once
/// (`sbx_core::escape::terminal`), never a space, never `\\e`.
const NASTY_SHOWN: &str = "a\\nb\\rc\\ed\\x01e";

/// Asserts one line, exit 125, no raw control character and no sign of a
/// second escaping.
fn assert_one_escaped_line(what: &str, code: Option<i32>, err: &str) {
    assert_eq!(code, Some(125), "{what}: {err:?}");
    assert!(err.ends_with('\n'), "{what}: {err:?}");
    let body = &err[..err.len() - 1];
    assert!(
        !body.chars().any(char::is_control),
        "{what}: one line, no control character: {err:?}"
    );
    for twice in ["\\\\n", "\\\\e", "\\\\x01", "\\\\u{"] {
        assert!(!body.contains(twice), "{what}: escaped twice: {err:?}");
    }
}

/// Attack 1: a reader's lock on the audit log cannot hang a tool: anyone who can
/// open the log for reading can hold an F_RDLCK on it (the sandbox too: a
/// log outside its writable binds is still readable), and appends waited
/// in F_SETLKW with no bound. Now a tool waits at most 2 s, writes its
/// line anyway (no event lost), says so in one stderr line naming the log
/// and the holder, and logs an `audit_lock_timeout` alert. Cases: root's
/// 0644 log locked by sbxtest, root's log locked by another root process,
/// sbxtest's own 0600 log locked by an sbxtest process (the sandboxed
/// program's case).
#[test]
fn a_read_lock_on_the_audit_log_never_hangs_a_tool() {
    use sbx_testutil::As;
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let mut cases = vec![];
    if sbx_testutil::is_root() {
        cases.push((As::Root, As::Root));
        if sbx_testutil::test_user().is_some() {
            cases.push((As::Root, As::User));
            cases.push((As::User, As::User));
        } else if sbx_testutil::must_work() {
            panic!("test user missing");
        }
    } else {
        cases.push((As::User, As::User));
    }
    for (tool_as, locker_as) in cases {
        let d = sbx_testutil::shared_tempdir();
        let log = d.path().canonicalize().unwrap().join("audit.jsonl");
        std::fs::write(&log, "").unwrap();
        if tool_as == As::User {
            sbx_testutil::chown_to_test_user(&log);
            std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o600)).unwrap();
        } else {
            std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        let what = format!("tool as {tool_as:?}, read lock held as {locker_as:?}");
        // The locker: `sleep` holding a read lock it took (as its user,
        // after the switch) just before exec; the fd survives exec, so
        // does the lock.
        let mut locker = Command::new("sleep");
        locker.arg("60");
        sbx_testutil::run_as(&mut locker, locker_as);
        let c = std::ffi::CString::new(log.to_str().unwrap()).unwrap();
        // SAFETY: open and fcntl on a path prepared before the fork are
        // async-signal-safe; an error fails the spawn.
        unsafe {
            locker.pre_exec(move || {
                let fd = libc::open(c.as_ptr(), libc::O_RDONLY);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let mut fl: libc::flock = std::mem::zeroed();
                fl.l_type = libc::F_RDLCK as libc::c_short;
                fl.l_whence = libc::SEEK_SET as libc::c_short;
                if libc::fcntl(fd, libc::F_SETLK, &fl) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut locker = locker.spawn().unwrap();
        let holder = locker.id() as i32;
        // The lock is there before the tool starts.
        let probe = std::fs::File::open(&log).unwrap();
        let t0 = Instant::now();
        loop {
            // SAFETY: plain integers: all-zero is a valid flock.
            let mut fl: libc::flock = unsafe { std::mem::zeroed() };
            fl.l_type = libc::F_WRLCK as libc::c_short;
            // SAFETY: F_GETLK on an open fd with a live struct.
            let r = unsafe {
                libc::fcntl(
                    std::os::fd::AsRawFd::as_raw_fd(&probe),
                    libc::F_GETLK,
                    &mut fl,
                )
            };
            if r == 0 && fl.l_pid == holder {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(5), "{what}: no lock");
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut c = sbx_testutil::tool("sbx-seccomp");
        c.arg("--audit-log")
            .arg(&log)
            .args(["--", "sh", "-c", "echo RAN"]);
        sbx_testutil::run_as(&mut c, tool_as);
        let t0 = Instant::now();
        let out = sbx_testutil::output_within(&mut c, Duration::from_secs(20));
        let took = t0.elapsed();
        let _ = locker.kill();
        let _ = locker.wait();
        let err = sbx_testutil::stderr(&out);
        assert_eq!(sbx_testutil::code(&out), 0, "{what}: {err}");
        assert!(sbx_testutil::stdout(&out).contains("RAN"), "{what}: {err}");
        assert!(took < Duration::from_secs(8), "{what}: took {took:?}");
        assert!(took >= Duration::from_secs(2), "{what}: no wait? {took:?}");
        assert_eq!(err.trim_end().lines().count(), 1, "{what}: one line: {err}");
        let want = format!(
            "sbx-seccomp: audit log {}: a lock on it held by pid {holder} for over 2s",
            log.display()
        );
        assert!(err.contains(&want), "{what}: {err}");
        // No event lost, and the lock holder is an alert in the log.
        sbx_testutil::assert_event(&log, "seccomp_applied", "info", |_| true);
        sbx_testutil::assert_event(&log, "audit_lock_timeout", "alert", |e| {
            e["holder_pid"] == holder && e["path"] == log.to_str().unwrap()
        });
        // One writer: the chain holds.
        let mut v = sbx_testutil::tool("sbx-audit");
        v.arg("verify").arg(&log);
        let o = sbx_testutil::output_within(&mut v, Duration::from_secs(10));
        assert_eq!(
            sbx_testutil::code(&o),
            0,
            "{what}: {}",
            sbx_testutil::stdout(&o)
        );
    }
}

/// Attack 2: a file of /proc (or /sys, or another kernel interface) is "regular"
/// by type and passed the audit log's check: `--audit-log /proc/self/comm`
/// renamed the tool at each event. Given as --audit-log, SBX_AUDIT_LOG or
/// an SBX_AUDIT_FD open on it: one line naming the log and the file
/// system, 125, nothing run.
#[test]
fn the_audit_log_is_no_file_of_proc_or_sys() {
    let mut logs = vec![(PathBuf::from("/proc/self/comm"), "procfs")];
    if sbx_testutil::is_root() {
        for (p, fs) in [
            ("/sys/kernel/mm/transparent_hugepage/enabled", "sysfs"),
            ("/sys/fs/cgroup/unified/cgroup.max.depth", "cgroup2fs"),
            ("/sys/fs/cgroup/pids/notify_on_release", "cgroupfs"),
        ] {
            if std::fs::OpenOptions::new().append(true).open(p).is_ok() {
                logs.push((PathBuf::from(p), fs));
            }
        }
    }
    for who in sbx_testutil::identities() {
        for tool in ["sbx-seccomp", "sbx-cgroup", "sbx-net", "sbx-fs"] {
            for (log, fs) in &logs {
                if who == sbx_testutil::As::User && log.starts_with("/sys") {
                    continue;
                }
                for how in ["flag", "env", "fd"] {
                    let mut c = match how {
                        "fd" => {
                            let mut c = Command::new("sh");
                            c.arg("-c")
                                .arg(r#"exec 7>>"$1"; SBX_AUDIT_FD=7 exec "$2" -- sh -c 'echo RAN >&2'"#)
                                .arg("sh")
                                .arg(log)
                                .arg(sbx_testutil::bin(tool));
                            c.env_remove("SBX_AUDIT_LOG").env_remove("SBX_ID");
                            c
                        }
                        _ => {
                            let mut c = sbx_testutil::tool(tool);
                            if how == "flag" {
                                c.arg("--audit-log").arg(log);
                            } else {
                                c.env("SBX_AUDIT_LOG", log);
                            }
                            c.args(["--", "sh", "-c", "echo RAN >&2"]);
                            c
                        }
                    };
                    sbx_testutil::run_as(&mut c, who);
                    let what = format!("{who:?} {tool} {how} {}", log.display());
                    let (code, err, took) = run_bounded(c);
                    assert_eq!(code, Some(125), "{what}: {err}");
                    assert_eq!(err.trim_end().lines().count(), 1, "{what}: one line: {err}");
                    let want = format!("a file of {fs} (a kernel interface, not a log)");
                    assert!(err.contains(&want), "{what}: {err}");
                    if how == "fd" {
                        assert!(err.contains("SBX_AUDIT_FD '7'"), "{what}: {err}");
                    } else {
                        assert!(
                            err.contains(&format!("audit log {}", log.display())),
                            "{what}: {err}"
                        );
                    }
                    assert!(!err.contains("RAN"), "{what}: the command ran");
                    assert!(took < Duration::from_secs(5), "{what}: took {took:?}");
                }
            }
        }
    }
}

/// Attack 3: clap's message for a flag value holding a newline was cut at it
/// (and clap's rendering drops ESC sequences): the value is now quoted
/// whole, escaped, on the one line. For every tool (an unknown flag) and
/// for values clap parses (sbx-dnsproxy's --listen, --upstream).
#[test]
fn a_flag_value_with_control_characters_is_quoted_whole_on_one_line() {
    let mut cmds: Vec<(String, Command)> = Vec::new();
    for (cmd, _) in xtask::tools() {
        let tool = cmd.get_name().to_string();
        let mut c = sbx_testutil::tool(&tool);
        c.arg(format!("--x{NASTY}")).args(["--", "true"]);
        cmds.push((format!("{tool} --x..."), c));
    }
    for flag in ["--listen", "--upstream"] {
        let mut c = sbx_testutil::tool("sbx-dnsproxy");
        c.args(["--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9"])
            .arg(flag)
            .arg(NASTY);
        cmds.push((format!("sbx-dnsproxy {flag}"), c));
    }
    for (what, c) in cmds {
        let (code, err, _) = run_bounded(c);
        assert_one_escaped_line(&what, code, &err);
        assert!(
            err.contains(NASTY_SHOWN),
            "{what}: the whole value: {err:?}"
        );
    }
}

/// Attack 4: SBX_LOG and SBX_KILL_AFTER that are not what they must be (a
/// diagnostics filter, a duration) were ignored or a warning (a mistyped
/// grace meant 10 s): one line naming the variable and the value, 125,
/// before anything is set up (no audit log created, nothing run), for
/// every tool. Empty is unset; good values still work.
#[test]
fn bad_sbx_log_and_sbx_kill_after_are_one_line_before_anything_runs() {
    let d = tempfile::tempdir().unwrap();
    for (cmd, _) in xtask::tools() {
        let tool = cmd.get_name().to_string();
        for (var, val, want) in [
            ("SBX_LOG", "sbx=verbose", "not a diagnostics filter"),
            ("SBX_LOG", "debug\n", "a control character"),
            ("SBX_KILL_AFTER", "10x", "invalid duration"),
            ("SBX_KILL_AFTER", "-1s", "invalid duration"),
            // Past a century: it overflowed (a panic, exit 101) in the
            // check or at the first SIGTERM (attacker helper-52).
            (
                "SBX_KILL_AFTER",
                "10000000000000000000s10000000000000000000s",
                "invalid duration",
            ),
            ("SBX_KILL_AFTER", "18446744073709551615", "invalid duration"),
        ] {
            let log = d.path().join(format!("{tool}.jsonl"));
            let mut c = sbx_testutil::tool(&tool);
            c.env(var, val)
                .arg("--audit-log")
                .arg(&log)
                .args(["--", "sh", "-c", "echo RAN >&2"]);
            let what = format!("{tool} {var}={val:?}");
            let (code, err, took) = run_bounded(c);
            assert_one_escaped_line(&what, code, &err);
            let shown = val.replace('\n', "\\n");
            assert!(
                err.contains(&format!("{tool}: {var} '{shown}': {want}")),
                "{what}: {err}"
            );
            assert!(!err.contains("RAN"), "{what}: the command ran");
            assert!(!log.exists(), "{what}: the audit log was set up");
            assert!(took < Duration::from_secs(5), "{what}: took {took:?}");
        }
    }
    for (var, val) in [
        ("SBX_LOG", "debug"),
        ("SBX_LOG", ""),
        ("SBX_KILL_AFTER", "1500ms"),
        ("SBX_KILL_AFTER", ""),
    ] {
        let mut c = sbx_testutil::tool("sbx-seccomp");
        c.env(var, val).args(["--", "true"]);
        let (code, err, _) = run_bounded(c);
        assert_eq!(code, Some(0), "{var}={val:?}: {err}");
    }
}

/// Attack 5: one escaping for every untrusted string: a name holding a newline, a
/// carriage return, ESC and a C0 control reads the same in each tool's
/// line (sbx-creds made the newline a space, sbx-dnsproxy escaped the
/// character twice, `'\\u{1b}'`).
#[test]
fn a_nasty_name_reads_the_same_in_every_tools_line() {
    let mut cmds: Vec<(&str, Command)> = Vec::new();
    let mut c = sbx_testutil::tool("sbx-creds");
    c.args(["--vault-addr", "http://127.0.0.1:9", "--secret"])
        .arg(format!("{NASTY}=kv/x#y"))
        .args(["--", "true"]);
    cmds.push(("sbx-creds --secret", c));
    let mut c = sbx_testutil::tool("sbx-dnsproxy");
    c.args([
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        "127.0.0.1:9",
        "--allow",
    ])
    .arg(NASTY);
    cmds.push(("sbx-dnsproxy --allow", c));
    let mut c = sbx_testutil::tool("sbx-fs");
    c.arg("--hostname").arg(NASTY).args(["--", "true"]);
    cmds.push(("sbx-fs --hostname", c));
    let mut c = sbx_testutil::tool("sbx-gitguard");
    c.arg("check")
        .arg("--repo")
        .arg(format!("/nonexistent/{NASTY}"));
    cmds.push(("sbx-gitguard check --repo", c));
    let mut c = sbx_testutil::tool("sbx-gitguard");
    c.arg("plants")
        .arg("--dir")
        .arg(format!("/nonexistent/{NASTY}"))
        .args(["--", "true"]);
    cmds.push(("sbx-gitguard plants --dir", c));
    for (what, c) in cmds {
        let (code, err, _) = run_bounded(c);
        assert_one_escaped_line(what, code, &err);
        assert!(err.contains(NASTY_SHOWN), "{what}: {err:?}");
    }
    // sbx-dnsproxy's quoted character: escaped once too.
    let mut c = sbx_testutil::tool("sbx-dnsproxy");
    c.args([
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        "127.0.0.1:9",
        "--allow",
    ])
    .arg("a\x1bb");
    let (code, err, _) = run_bounded(c);
    assert_one_escaped_line("sbx-dnsproxy ESC", code, &err);
    assert!(err.contains("character '\\e' not allowed"), "{err:?}");
}

/// Attack 5b: a query name whose label holds control bytes is logged as it is (the
/// log's JSON escapes it; `sbx-audit show` escapes it once), not as
/// hickory's `\033`, which every reader then escaped a second time.
#[test]
fn a_bad_wire_name_is_logged_as_it_is() {
    use std::io::BufRead;
    let d = tempfile::tempdir().unwrap();
    let log = d.path().join("dns.jsonl");
    let mut c = sbx_testutil::tool("sbx-dnsproxy");
    c.arg("--audit-log")
        .arg(&log)
        .args(["--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9"])
        .args(["--allow", "example.com"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut p = c.spawn().unwrap();
    let mut line = String::new();
    std::io::BufReader::new(p.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line.trim().strip_prefix("listening ").unwrap().to_string();
    // A query: id 0x1234, RD, one question: "a<ESC>b<CR>c.test" A IN.
    let mut q = vec![0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    for l in [&b"a\x1bb\rc"[..], b"test"] {
        q.push(l.len() as u8);
        q.extend_from_slice(l);
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.send_to(&q, &addr).unwrap();
    let mut buf = [0u8; 512];
    let n = s.recv(&mut buf);
    let _ = p.kill();
    let _ = p.wait();
    let n = n.unwrap();
    assert!(n >= 12 && buf[3] & 0xf == 5, "REFUSED: {:?}", &buf[..n]);
    sbx_testutil::assert_event(&log, "dns_refused", "alert", |e| {
        e["reason"] == "bad_name" && e["name"] == "a\u{1b}b\rc.test"
    });
    let mut show = sbx_testutil::tool("sbx-audit");
    show.args(["show", "--color", "never"]).arg(&log);
    let o = sbx_testutil::output_within(&mut show, Duration::from_secs(10));
    let out = sbx_testutil::stdout(&o);
    assert!(out.contains("a\\eb\\rc.test"), "{out}");
    assert!(!out.contains("\\\\"), "escaped twice: {out}");
}

/// A variable name is the caller's text too: the warning that names the
/// secrets sbx-fs did not pass shows a name with control characters
/// escaped once, on one line (it printed them raw).
#[test]
fn a_dropped_variable_name_is_shown_escaped() {
    let name = format!("{NASTY}_TOKEN");
    let mut c = sbx_testutil::tool("sbx-fs");
    c.env(&name, "x").args(["--", "true"]);
    let (code, err, _) = run_bounded(c);
    assert_eq!(code, Some(0), "{err:?}");
    let line = err
        .lines()
        .find(|l| l.contains("look like secrets"))
        .unwrap_or_else(|| panic!("no warning: {err:?}"));
    assert!(line.contains(&format!("{NASTY_SHOWN}_TOKEN")), "{err:?}");
    assert!(!line.chars().any(char::is_control), "{err:?}");
}
