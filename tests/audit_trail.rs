//! The audit log cannot be erased, rewritten or forged by the sandbox
//! (issue 15, section 1). Each attack is tried as root and as the test user,
//! directly (sbx-fs -- sbx-seccomp -- CMD), through scripts/sbx-run and
//! through `sbx-policy chain`.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sbx_testutil::{As, audit_events, identities, run_as, stderr, stdout};

/// A program named like a tool, in the writable project: it reports whether
/// it holds the audit fd and tries to truncate every fd it has.
const FAKE_TOOL: &str = r#"#!/usr/bin/python3
import os
print("fdenv=" + os.environ.get("SBX_AUDIT_FD", "none"))
print("ids=" + os.environ.get("SBX_TOOL_IDS", "none"))
n = 0
for name in os.listdir("/proc/self/fd"):
    fd = int(name)
    try:
        os.ftruncate(fd, 0)
        n += 1
    except OSError:
        pass
print("truncated=%d" % n)
"#;

/// A line of an earlier run, with an alert that must survive.
const EARLIER: &str = r#"{"ts":"2026-01-01T00:00:00.000Z","sbx_id":"earlier","tool":"sbx-fs","pid":1,"event":"earlier_alert","severity":"alert"}"#;

struct Setup {
    _d: tempfile::TempDir,
    base: PathBuf,
    proj: PathBuf,
    log: PathBuf,
}

fn setup(who: As) -> Setup {
    let d = sbx_testutil::shared_tempdir();
    let base = d.path().canonicalize().unwrap();
    let proj = base.join("proj");
    write(&proj.join("sbx-x"), FAKE_TOOL);
    std::fs::set_permissions(
        proj.join("sbx-x"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let log = base.join("audit.jsonl");
    std::fs::write(&log, format!("{EARLIER}\n")).unwrap();
    if who == As::User {
        chown_r(&base);
    }
    Setup {
        _d: d,
        base,
        proj,
        log,
    }
}

fn bin_dir() -> PathBuf {
    sbx_testutil::bin("sbx-fs").parent().unwrap().to_path_buf()
}

fn marker(out: &str, key: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in:\n{out}"))
        .to_string()
}

/// The fake tool got nothing, the earlier alert is still in the log, and the
/// real tools of this run logged.
fn assert_fake_tool_got_nothing(out: &Output, log: &Path, tools: &[&str]) {
    let so = stdout(out);
    assert_eq!(code(out), 0, "stdout: {so}\nstderr: {}", stderr(out));
    assert_eq!(marker(&so, "fdenv"), "none", "{so}");
    assert_eq!(marker(&so, "ids"), "none", "{so}");
    assert_eq!(marker(&so, "truncated"), "0", "{so}");
    let evs = audit_events(log);
    assert_eq!(
        evs.first().map(|e| e["event"].clone()),
        Some("earlier_alert".into())
    );
    for t in tools {
        assert!(
            evs.iter().any(|e| e["tool"] == *t),
            "no event from {t}: {evs:?}"
        );
    }
}

fn code(out: &Output) -> i32 {
    sbx_testutil::code(out)
}

#[test]
fn a_program_named_sbx_x_does_not_get_the_audit_fd() {
    for who in identities() {
        let s = setup(who);
        let mut c = sbx_testutil::tool("sbx-fs");
        c.arg("--audit-log")
            .arg(&s.log)
            .arg("--rw")
            .arg(&s.proj)
            .arg("--chdir")
            .arg(&s.proj)
            .arg("--")
            .arg(sbx_testutil::bin("sbx-seccomp"))
            .args(["--profile", "default", "--", "./sbx-x"]);
        c.env("PATH", PATH).current_dir(&s.proj);
        run_as(&mut c, who);
        let out = c.output().unwrap();
        assert_fake_tool_got_nothing(&out, &s.log, &["sbx-fs", "sbx-seccomp"]);

        // The fake tool directly after sbx-fs, by a PATH lookup, also gets
        // nothing (sbx-fs used to open any sbx-* on the host).
        let mut c = sbx_testutil::tool("sbx-fs");
        c.arg("--audit-log")
            .arg(&s.log)
            .arg("--rw")
            .arg(&s.proj)
            .arg("--chdir")
            .arg(&s.proj)
            .args(["--", "sbx-x"]);
        c.env("PATH", format!("{}:{PATH}", s.proj.display()))
            .current_dir(&s.proj);
        run_as(&mut c, who);
        let out = c.output().unwrap();
        assert_fake_tool_got_nothing(&out, &s.log, &["sbx-fs"]);
    }
}

#[test]
fn a_copy_of_a_real_tool_is_not_trusted_either() {
    // Same name, same bytes, another inode: not one of the installed tools.
    for who in identities() {
        let s = setup(who);
        std::fs::copy(sbx_testutil::bin("sbx-seccomp"), s.proj.join("sbx-seccomp")).unwrap();
        if who == As::User {
            chown_r(&s.proj);
        }
        let mut c = sbx_testutil::tool("sbx-fs");
        c.arg("--audit-log")
            .arg(&s.log)
            .arg("--rw")
            .arg(&s.proj)
            .arg("--chdir")
            .arg(&s.proj)
            .args([
                "--",
                "./sbx-seccomp",
                "--profile",
                "default",
                "--",
                "./sbx-x",
            ]);
        c.env("PATH", PATH).current_dir(&s.proj);
        run_as(&mut c, who);
        let out = c.output().unwrap();
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert_eq!(marker(&stdout(&out), "truncated"), "0");
        let evs = audit_events(&s.log);
        assert_eq!(evs[0]["event"], "earlier_alert");
        assert!(
            !evs.iter().any(|e| e["tool"] == "sbx-seccomp"),
            "the copy must not have received the log: {evs:?}"
        );
    }
}

#[test]
fn sbx_run_does_not_hand_the_log_to_sbx_x() {
    for who in identities() {
        let s = setup(who);
        let mut c = Command::new("sh");
        c.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/sbx-run"))
            .arg("-C")
            .arg(&s.proj)
            .arg("-l")
            .arg(&s.log)
            .args(["--", "./sbx-x"]);
        c.env("SBX_BIN", bin_dir())
            .env("PATH", PATH)
            .env_remove("SBX_ID")
            .env_remove("SBX_AUDIT_LOG")
            .current_dir(&s.base);
        run_as(&mut c, who);
        let out = c.output().unwrap();
        assert_fake_tool_got_nothing(&out, &s.log, &["sbx-net", "sbx-fs", "sbx-seccomp"]);
    }
}

#[test]
fn sbx_policy_chain_does_not_hand_the_log_to_sbx_x() {
    for who in identities() {
        let s = setup(who);
        let home = s.base.join("home");
        std::fs::create_dir_all(&home).unwrap();
        if who == As::User {
            chown_r(&home);
        }
        let mut c = sbx_testutil::tool("sbx-policy");
        c.arg("--audit-log").arg(&s.log);
        c.args(["chain", "--managed", "/nonexistent/managed.json", "--home"])
            .arg(&home)
            .args(["--", "./sbx-x"]);
        c.current_dir(&s.proj).env("PATH", PATH);
        run_as(&mut c, who);
        let out = c.output().unwrap();
        assert_fake_tool_got_nothing(&out, &s.log, &["sbx-fs", "sbx-seccomp"]);
    }
}

/// sbx-fs with the log at `log` and `proj` writable; the command would
/// leave a marker file if it ran.
fn fs_with_log(s: &Setup, log: &Path, who: As) -> Output {
    let mut c = sbx_testutil::tool("sbx-fs");
    c.arg("--audit-log")
        .arg(log)
        .arg("--rw")
        .arg(&s.proj)
        .arg("--chdir")
        .arg(&s.proj)
        .args(["--", "sh", "-c", "echo ran > ran.txt"]);
    c.env("PATH", PATH).current_dir(&s.proj);
    run_as(&mut c, who);
    c.output().unwrap()
}

#[test]
fn a_log_the_sandbox_could_write_is_refused() {
    for who in identities() {
        let s = setup(who);
        // 1. Inside the writable project (the README's old Makefile).
        let inside = s.proj.join(".sbx-audit.jsonl");
        let out = fs_with_log(&s, &inside, who);
        sbx_testutil::assert_usage_error(&out, &inside.display().to_string());
        assert!(stderr(&out).contains(&format!("writable bind {}", s.proj.display())));
        assert!(!s.proj.join("ran.txt").exists(), "the command ran");

        // 2. Reached through a symlink outside the bind.
        let link = s.base.join("log-link.jsonl");
        std::os::unix::fs::symlink(&inside, &link).unwrap();
        let out = fs_with_log(&s, &link, who);
        sbx_testutil::assert_usage_error(&out, &inside.display().to_string());
        assert!(!s.proj.join("ran.txt").exists(), "the command ran");

        // 3. Outside, but with a hard link inside the bind.
        let outside = s.base.join("hard.jsonl");
        std::fs::write(&outside, "").unwrap();
        std::fs::hard_link(&outside, s.proj.join("hard-link.jsonl")).unwrap();
        if who == As::User {
            chown_r(&s.base);
        }
        let out = fs_with_log(&s, &outside, who);
        sbx_testutil::assert_usage_error(&out, "hard links");
        assert!(!s.proj.join("ran.txt").exists(), "the command ran");

        // 4. The same through scripts/sbx-run.
        let mut c = Command::new("sh");
        c.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/sbx-run"))
            .arg("-C")
            .arg(&s.proj)
            .arg("-l")
            .arg(&inside)
            .args(["--", "sh", "-c", "echo ran > ran.txt"]);
        c.env("SBX_BIN", bin_dir())
            .env("PATH", PATH)
            .env_remove("SBX_ID")
            .env_remove("SBX_AUDIT_LOG")
            .current_dir(&s.base);
        run_as(&mut c, who);
        let out = c.output().unwrap();
        assert_eq!(code(&out), 125, "{}", stderr(&out));
        assert!(
            stderr(&out).contains("is inside the writable bind"),
            "{}",
            stderr(&out)
        );
        assert!(!s.proj.join("ran.txt").exists(), "the command ran");

        // A log outside every writable bind is accepted.
        let out = fs_with_log(&s, &s.log, who);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(s.proj.join("ran.txt").exists());
    }
}
