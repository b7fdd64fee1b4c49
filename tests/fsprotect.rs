//! Issue 13 (sections 1, 2, 3, 6) through the composed chains:
//! `scripts/sbx-run` and `sbx-policy chain`, as root and as the
//! unprivileged test user. A rename of an ancestor does not lift a
//! protection, control files created at any depth are taken out at the end
//! (quarantine outside the project, alert), a secret created in one run is
//! hidden in the next; the host is unchanged and the alerts are in the one
//! audit log.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sbx_testutil::{As, assert_event, identities, run_as, stderr, stdout};
use serde_json::Value;

fn fuse_usable(who: As) -> bool {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata("/dev/fuse") {
        Ok(m) => who == As::Root || m.permissions().mode() & 0o006 == 0o006,
        Err(_) => false,
    }
}

fn bin_dir() -> PathBuf {
    sbx_testutil::bin("sbx-fs").parent().unwrap().to_path_buf()
}

struct Tree {
    _d: tempfile::TempDir,
    proj: PathBuf,
    home: PathBuf,
    state: PathBuf,
}

/// A git project with a secret, a monorepo package with its own .claude,
/// a nested repository; a home; a state dir (the quarantine's parent).
fn tree(who: As) -> Tree {
    let d = sbx_testutil::shared_tempdir();
    let base = d.path().canonicalize().unwrap();
    let proj = base.join("proj");
    let home = base.join("home");
    let state = base.join("state");
    write(&proj.join("README"), "hello\n");
    write(&proj.join(".gitignore"), ".env\n.env.*\n");
    git(&proj, &["init", "-q", "-b", "main"]);
    git(&proj, &["add", "-A"]);
    git(&proj, &["commit", "-qm", "init"]);
    write(&proj.join("app/.env"), "APP-SECRET\n");
    write(&proj.join("packages/web/.claude/settings.json"), "{}\n");
    write(&proj.join("packages/web/index.js"), "1\n");
    write(&home.join(".keep"), "\n");
    std::fs::create_dir_all(&state).unwrap();
    if who == As::User {
        chown_r(&base);
    }
    Tree {
        _d: d,
        proj,
        home,
        state,
    }
}

/// The attack: rename the ancestors of protections and write where they
/// were; create control files at depth; create a secret for the next run.
const ATTACK: &str = "try() { if \"$@\" 2>/dev/null; then echo ESCAPED \"$*\"; else echo refused; fi; }; \
    try mv app app.orig; if echo X=1 > app/.env; then echo ESCAPED env; fi; \
    try mv packages/web packages/web.orig; \
    if echo '{}' > packages/web/.claude/settings.json; then echo ESCAPED settings; fi; \
    try mv .git .git.orig; \
    mkdir -p packages/api/.claude/agents && echo evil > packages/api/.claude/agents/a.md; \
    mkdir -p x/y/z/.vscode && echo '{}' > x/y/z/.vscode/tasks.json; \
    echo '{\"mcpServers\":{}}' > .mcp.json; \
    echo LOCAL-SECRET > app/.env.local; echo attacked";

fn check_after(t: &Tree, out: &Output, log: &Path) {
    let so = stdout(out);
    let ctx = format!("{so}\n{}", stderr(out));
    assert_eq!(out.status.code(), Some(0), "{ctx}");
    assert!(so.contains("attacked"), "{ctx}");
    assert!(!so.contains("ESCAPED"), "{ctx}");
    assert_eq!(so.matches("refused").count(), 3, "{ctx}");
    // The host: originals where they were, unchanged.
    assert_eq!(
        std::fs::read_to_string(t.proj.join("app/.env")).unwrap(),
        "APP-SECRET\n"
    );
    assert_eq!(
        std::fs::read_to_string(t.proj.join("packages/web/.claude/settings.json")).unwrap(),
        "{}\n"
    );
    for gone in ["app.orig", "packages/web.orig", ".git.orig"] {
        assert!(!t.proj.join(gone).exists(), "{gone}");
    }
    // Control files created in the run: taken out, alerted.
    for rel in ["packages/api/.claude", "x/y/z/.vscode", ".mcp.json"] {
        let p = t.proj.join(rel);
        assert!(std::fs::symlink_metadata(&p).is_err(), "{rel} left: {ctx}");
        assert_event(log, "fs_protected_created", "alert", |e: &Value| {
            e["path"] == p.to_str().unwrap()
                && e["quarantined"]
                    .as_str()
                    .is_some_and(|q| q.starts_with(t.state.to_str().unwrap()))
        });
    }
    assert_event(log, "fs_denied", "alert", |e: &Value| {
        e["path"]
            .as_str()
            .is_some_and(|p| p.ends_with("/proj/app/.env"))
    });
    assert_event(log, "fs_write_denied", "alert", |e: &Value| {
        e["path"]
            .as_str()
            .is_some_and(|p| p.ends_with("/packages/web/.claude/settings.json"))
    });
    git(&t.proj, &["fsck", "--strict", "--no-progress"]);
}

fn sbx_run(t: &Tree, log: &Path, script: &str, who: As) -> Output {
    let mut c = Command::new("sh");
    c.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/sbx-run"))
        .arg("-C")
        .arg(&t.proj)
        .arg("-l")
        .arg(log)
        .args(["--", "sh", "-c", script]);
    c.env("SBX_BIN", bin_dir())
        .env("XDG_STATE_HOME", &t.state)
        .env("HOME", &t.home)
        .env("PATH", PATH)
        .env_remove("SBX_ID")
        .env_remove("SBX_AUDIT_LOG")
        .current_dir(&t.proj);
    run_as(&mut c, who);
    c.output().unwrap()
}

fn policy_chain(t: &Tree, log: &Path, script: &str, who: As) -> Output {
    let mut c = sbx_testutil::tool("sbx-policy");
    c.arg("--audit-log").arg(log);
    c.args(["chain", "--managed", "/nonexistent/managed.json", "--home"])
        .arg(&t.home);
    c.args(["--", "sh", "-c", script]);
    c.current_dir(&t.proj)
        .env("PATH", PATH)
        .env("XDG_STATE_HOME", &t.state)
        .env_remove("SBX_ID")
        .env_remove("SBX_AUDIT_LOG");
    run_as(&mut c, who);
    c.output().unwrap()
}

type Runner = fn(&Tree, &Path, &str, As) -> Output;

fn attack_through(run: Runner) {
    for who in identities() {
        if !fuse_usable(who) {
            sbx_testutil::skip!("/dev/fuse is not usable as {who:?} (run scripts/setup)");
        }
        let t = tree(who);
        let log = t.state.parent().unwrap().join("audit-1.jsonl");
        let out = run(&t, &log, ATTACK, who);
        check_after(&t, &out, &log);
        // The next run: the secret created in the first is hidden.
        let log2 = t.state.parent().unwrap().join("audit-2.jsonl");
        let out = run(
            &t,
            &log2,
            "cat app/.env.local && echo ESCAPED; echo second",
            who,
        );
        let so = stdout(&out);
        assert!(so.contains("second"), "{so}\n{}", stderr(&out));
        assert!(
            !so.contains("LOCAL-SECRET") && !so.contains("ESCAPED"),
            "{so}"
        );
        assert_event(&log2, "fs_denied", "alert", |e: &Value| {
            e["path"]
                .as_str()
                .is_some_and(|p| p.ends_with("/proj/app/.env.local"))
        });
    }
}

#[test]
fn sbx_run_protections_hold_against_renames_and_new_control_files() {
    attack_through(sbx_run);
}

#[test]
fn policy_chain_protections_hold_against_renames_and_new_control_files() {
    attack_through(policy_chain);
}
