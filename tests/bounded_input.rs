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
                c.args(["--vault-addr", "http://127.0.0.1:9", "--secret", "A=kv/x#y"]);
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
