//! Issue 16, broken pipes: every tool, every subcommand that prints on
//! stdout, run with stdout a pipe whose reader is gone (`sbx-policy compile
//! | true`), ends quietly as coreutils do: killed by SIGPIPE (or exit 0 when
//! the printer ignores the error, as clap's help does), nothing on stderr,
//! never a panic (exit 101 with a backtrace).
//!
//! The cases are enumerated from the clap definitions (xtask::tools): every
//! tool and every subcommand gets its `--help`, and every subcommand must be
//! named below either with an invocation that prints or with the reason it
//! prints nothing on stdout, so a new printing subcommand cannot be missed.

mod common;
use common::*;

use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Subcommands that print nothing on stdout themselves (the command's own
/// output passes through untouched, or they write to a FILE).
const SILENT: &[(&str, &str, &str)] = &[
    (
        "sbx-gitguard",
        "run",
        "the report goes to stderr; CMD's stdout is CMD's",
    ),
    ("sbx-gitguard", "snapshot", "writes --output FILE"),
    (
        "sbx-gitguard",
        "plants",
        "a supervisor like run: findings go to stderr; CMD's stdout is CMD's",
    ),
    (
        "sbx-container",
        "build",
        "needs a container engine: prints through println! like the others (the hook in run_main)",
    ),
];

/// A pipe whose read end is already closed: any write gets EPIPE.
fn broken_pipe() -> OwnedFd {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two-int array it is given.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both fds were just created and are owned here.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(r);
    w
}

/// Runs `cmd` with stdout a broken pipe, at most 30 s; asserts the quiet end.
fn assert_quiet(what: &str, mut cmd: Command) {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(broken_pipe()))
        .stderr(Stdio::piped());
    let out = sbx_testutil::wait_within(&mut cmd, Duration::from_secs(30));
    let status = out.status;
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{what}: panicked on EPIPE: {err}"
    );
    assert_ne!(status.code(), Some(101), "{what}: exit 101: {err}");
    assert!(
        status.signal() == Some(libc::SIGPIPE) || status.code() == Some(0),
        "{what}: expected death by SIGPIPE (or 0), got {status:?}: {err}"
    );
    assert!(err.trim().is_empty(), "{what}: said something: {err}");
}

struct Fixture {
    _d: tempfile::TempDir,
    repo: std::path::PathBuf,
    settings: std::path::PathBuf,
    snap: std::path::PathBuf,
    log: std::path::PathBuf,
}

fn fixture() -> Fixture {
    let d = tempfile::tempdir().unwrap();
    let base = d.path().canonicalize().unwrap();
    let repo = base.join("r");
    write(&repo.join("a.txt"), "a\n");
    git(&repo, &["init", "-q", "-b", "main"]);
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "init"]);
    let settings = base.join("settings.json");
    write(
        &settings,
        r#"{"permissions": {"allow": ["Bash(ls:*)"], "deny": ["Read(./.env)"]}}"#,
    );
    let snap = base.join("snap");
    let log = base.join("audit.jsonl");
    let out = sbx_testutil::tool("sbx-gitguard")
        .args(["snapshot", "--repo"])
        .arg(&repo)
        .arg("--output")
        .arg(&snap)
        .arg("--audit-log")
        .arg(&log)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", sbx_testutil::stderr(&out));
    assert!(
        std::fs::metadata(&log).is_ok_and(|m| m.len() > 0),
        "the snapshot logged nothing"
    );
    Fixture {
        _d: d,
        repo,
        settings,
        snap,
        log,
    }
}

/// The invocations that print on stdout, by (tool, subcommand or "").
fn printing_cases(f: &Fixture) -> Vec<(&'static str, &'static str, Command)> {
    let home = f.repo.parent().unwrap();
    let policy = |sub: &str| {
        let mut c = sbx_testutil::tool("sbx-policy");
        c.arg(sub)
            .arg("--settings")
            .arg(&f.settings)
            .arg("--managed")
            .arg("/nonexistent/managed.json")
            .arg("--chdir")
            .arg(&f.repo)
            .arg("--home")
            .arg(home);
        c
    };
    let gitguard = |args: &[&str]| {
        let mut c = sbx_testutil::tool("sbx-gitguard");
        c.args(args).arg("--repo").arg(&f.repo);
        c
    };
    let mut v = vec![
        ("sbx-policy", "compile", policy("compile")),
        ("sbx-policy", "explain", policy("explain")),
        ("sbx-policy", "explain --json", {
            let mut c = policy("explain");
            c.arg("--json");
            c
        }),
        ("sbx-policy", "chain", {
            let mut c = policy("chain");
            c.args(["--print", "--", "true"]);
            c
        }),
        ("sbx-seccomp", "", {
            let mut c = sbx_testutil::tool("sbx-seccomp");
            c.args(["--print", "--", "true"]);
            c
        }),
        ("sbx-gitguard", "check", gitguard(&["check"])),
        ("sbx-gitguard", "check", gitguard(&["check", "--json"])),
        ("sbx-gitguard", "repair", {
            let mut c = gitguard(&["repair", "--json"]);
            c.arg("--against").arg(&f.snap);
            c
        }),
        ("sbx-gitguard", "import", {
            // An empty stage (what sbx-fs leaves when nothing was
            // committed): "imported: 0 object(s), 0 ref(s)".
            let stage = f.repo.parent().unwrap().join("sbx-git-stage-broken-pipe");
            std::fs::create_dir_all(stage.join("git/upper")).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&stage, std::fs::Permissions::from_mode(0o700)).unwrap();
            std::fs::write(stage.join("gitdir"), f.repo.join(".git").to_str().unwrap()).unwrap();
            let mut c = gitguard(&["import"]);
            c.arg("--stage").arg(&stage);
            c
        }),
        ("sbx-audit", "verify", {
            let mut c = sbx_testutil::tool("sbx-audit");
            c.arg("verify").arg(&f.log);
            c
        }),
        ("sbx-audit", "show", {
            let mut c = sbx_testutil::tool("sbx-audit");
            c.arg("show").arg(&f.log);
            c
        }),
        ("sbx-audit", "tail", {
            let mut c = sbx_testutil::tool("sbx-audit");
            c.arg("tail").arg(&f.log);
            c
        }),
        ("sbx-path", "check", {
            let mut c = sbx_testutil::tool("sbx-path");
            c.args(["check", "--json", "--allow-read"])
                .arg(&f.repo)
                .arg(f.repo.join("a.txt"))
                .arg("read");
            c
        }),
        ("sbx-path", "normalise", {
            let mut c = sbx_testutil::tool("sbx-path");
            c.args(["normalise", "/a/./b", "/c//d"]);
            c
        }),
        ("sbx-dnsproxy", "", {
            // A daemon: "listening ADDR" is its first stdout line.
            let mut c = sbx_testutil::tool("sbx-dnsproxy");
            c.args([
                "--listen",
                "127.0.0.1:0",
                "--upstream",
                "127.0.0.1:9",
                "--allow",
                "example.com",
            ]);
            c
        }),
    ];
    // --help of every tool and subcommand (clap prints it on stdout).
    for (cmd, _) in xtask::tools() {
        let tool: &'static str = Box::leak(cmd.get_name().to_string().into_boxed_str());
        let mut c = sbx_testutil::tool(tool);
        c.arg("--help");
        v.push((tool, "--help", c));
        for s in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            let mut c = sbx_testutil::tool(tool);
            c.arg(s.get_name()).arg("--help");
            v.push((tool, "--help", c));
        }
    }
    v
}

#[test]
fn every_printing_subcommand_ends_quietly_on_a_broken_pipe() {
    let f = fixture();
    let cases = printing_cases(&f);
    // Every subcommand of every tool is either exercised or named silent.
    for (cmd, _) in xtask::tools() {
        let tool = cmd.get_name().to_string();
        for s in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            let sub = s.get_name();
            let covered = cases.iter().any(|(t, c, _)| *t == tool && *c == sub)
                || SILENT.iter().any(|(t, c, _)| *t == tool && *c == sub);
            assert!(
                covered,
                "{tool} {sub}: add a printing case (or name it in SILENT with why)"
            );
        }
    }
    assert!(Path::new(&f.snap).exists());
    for (tool, sub, cmd) in cases {
        let what = format!("{tool} {sub} {:?}", cmd.get_args().collect::<Vec<_>>());
        assert_quiet(&what, cmd);
    }
}

/// The shell's view of issue 16's report: `sbx-policy compile | true`.
#[test]
fn policy_compile_into_true_in_a_shell() {
    let f = fixture();
    let script = format!(
        "{} compile --settings {} --managed /nonexistent --chdir {} --home {} | true; \
         echo \"${{PIPESTATUS[0]}}\"",
        sbx_testutil::bin("sbx-policy").display(),
        f.settings.display(),
        f.repo.display(),
        f.repo.parent().unwrap().display()
    );
    // The reader may exit before or after the write: repeat a few times.
    for _ in 0..5 {
        let out = Command::new("bash")
            .arg("-c")
            .arg(&script)
            .output()
            .unwrap();
        let err = sbx_testutil::stderr(&out);
        assert!(err.trim().is_empty(), "stderr: {err}");
        let st = sbx_testutil::stdout(&out);
        assert!(
            st.trim() == "141" || st.trim() == "0",
            "status {st} (141 = SIGPIPE, as coreutils)"
        );
    }
}

/// The same invocations with stdout on a full device (`> /dev/full`): the
/// write fails with ENOSPC, not EPIPE, so it is a failed run, said in one
/// line that names stdout, status 125, never a panic, and never 0 as if
/// the output had been written (clap's help, which ignores the error,
/// aside).
#[test]
fn every_printing_subcommand_fails_in_one_line_on_a_full_device() {
    let f = fixture();
    let mut wrong = Vec::new();
    for (tool, sub, mut cmd) in printing_cases(&f) {
        let what = format!("{tool} {sub} {:?}", cmd.get_args().collect::<Vec<_>>());
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(full))
            .stderr(Stdio::piped());
        let out = sbx_testutil::wait_within(&mut cmd, Duration::from_secs(30));
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let help = sub == "--help" && out.status.code() == Some(0) && err.is_empty();
        let failed = out.status.code() == Some(125)
            && err.lines().count() == 1
            && err.starts_with(&format!("{tool}: "))
            && err.contains("stdout");
        if !(help || failed) {
            wrong.push(format!("{what}: {:?}: {err}", out.status));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
