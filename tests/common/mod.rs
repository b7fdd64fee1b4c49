//! Helpers shared by the cross-tool end-to-end suites.
#![allow(dead_code)]

pub mod gitproj;

use std::path::Path;
use std::process::Command;

use sbx_testutil::{stderr, stdout};

pub const PY: &str = "/usr/bin/python3";
pub const PATH: &str = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin";

pub fn write(p: &Path, s: &str) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, s).unwrap();
}

/// Gives a tree to the unprivileged test user (when we are root).
pub fn chown_r(p: &Path) {
    if let (true, Some((u, g))) = (sbx_testutil::is_root(), sbx_testutil::test_user()) {
        let _ = Command::new("chown")
            .arg("-R")
            .arg(format!("{u}:{g}"))
            .arg(p)
            .status();
    }
}

/// The real git CLI in `dir` (whoever owns it), which must succeed.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.email=t@example.invalid",
            "-c",
            "user.name=t",
            "-c",
            "safe.directory=*",
        ])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", stderr(&out));
    stdout(&out)
}

/// Whether `who` can open /dev/fuse (the guard file system's alerts).
pub fn fuse_usable(who: sbx_testutil::As) -> bool {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata("/dev/fuse") {
        Ok(m) => who == sbx_testutil::As::Root || m.permissions().mode() & 0o006 == 0o006,
        Err(_) => false,
    }
}

/// A project, a home and a state directory (the quarantine's parent,
/// through XDG_STATE_HOME) in one temporary tree, for the composed chains.
pub struct ChainTree {
    pub _d: tempfile::TempDir,
    pub proj: std::path::PathBuf,
    pub home: std::path::PathBuf,
    pub state: std::path::PathBuf,
}

impl ChainTree {
    /// An empty project (not a git repository), home and state dir.
    pub fn new() -> ChainTree {
        let d = sbx_testutil::shared_tempdir();
        let base = d.path().canonicalize().unwrap();
        let t = ChainTree {
            proj: base.join("proj"),
            home: base.join("home"),
            state: base.join("state"),
            _d: d,
        };
        for p in [&t.proj, &t.home, &t.state] {
            std::fs::create_dir_all(p).unwrap();
        }
        t
    }

    /// Gives the whole tree to the test user when `who` is the user.
    pub fn own(&self, who: sbx_testutil::As) {
        if who == sbx_testutil::As::User {
            chown_r(self.proj.parent().unwrap());
        }
    }

    /// A fresh audit log path beside the tree.
    pub fn log(&self, name: &str) -> std::path::PathBuf {
        self.proj.parent().unwrap().join(format!("{name}.jsonl"))
    }
}

/// `scripts/sbx-run -C PROJ -l LOG -- sh -c SCRIPT` as `who`.
pub fn chain_sbx_run(
    t: &ChainTree,
    log: &Path,
    script: &str,
    who: sbx_testutil::As,
) -> std::process::Output {
    let mut c = Command::new("sh");
    c.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/sbx-run"))
        .arg("-C")
        .arg(&t.proj)
        .arg("-l")
        .arg(log)
        .args(["--", "sh", "-c", script]);
    c.env("SBX_BIN", sbx_testutil::bin("sbx-fs").parent().unwrap())
        .env("XDG_STATE_HOME", &t.state)
        .env("HOME", &t.home)
        .env("PATH", PATH)
        .env_remove("SBX_ID")
        .env_remove("SBX_AUDIT_LOG")
        .current_dir(&t.proj);
    sbx_testutil::run_as(&mut c, who);
    // After run_as, which points HOME at the test user's own.
    c.env("HOME", &t.home)
        .env("CLAUDE_CONFIG_DIR", t.home.join(".claude"));
    // A hang fails the test instead of holding the suite.
    sbx_testutil::output_within(&mut c, CHAIN_LIMIT)
}

/// `sbx-policy chain --home HOME -- sh -c SCRIPT` in PROJ as `who`.
pub fn chain_policy(
    t: &ChainTree,
    log: &Path,
    script: &str,
    who: sbx_testutil::As,
) -> std::process::Output {
    let mut c = sbx_testutil::tool("sbx-policy");
    c.arg("--audit-log").arg(log);
    c.args(["chain", "--managed", "/nonexistent/managed.json", "--home"])
        .arg(&t.home);
    c.args(["--", "sh", "-c", script]);
    c.current_dir(&t.proj)
        .env("PATH", PATH)
        .env("HOME", &t.home)
        .env("XDG_STATE_HOME", &t.state)
        .env_remove("SBX_ID")
        .env_remove("SBX_AUDIT_LOG");
    sbx_testutil::run_as(&mut c, who);
    c.env("HOME", &t.home)
        .env("CLAUDE_CONFIG_DIR", t.home.join(".claude"));
    // A hang fails the test instead of holding the suite.
    sbx_testutil::output_within(&mut c, CHAIN_LIMIT)
}

/// How long one chain run of a test may take (a hang is a failure).
pub const CHAIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(300);

pub type ChainRunner = fn(&ChainTree, &Path, &str, sbx_testutil::As) -> std::process::Output;

/// Both composed chains, with their names.
pub const CHAINS: &[(&str, ChainRunner)] = &[
    ("scripts/sbx-run", chain_sbx_run),
    ("sbx-policy chain", chain_policy),
];
