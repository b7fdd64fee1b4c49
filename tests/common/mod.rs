//! Helpers shared by the cross-tool end-to-end suites.
#![allow(dead_code)]

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
