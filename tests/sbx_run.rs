//! scripts/sbx-run, the chain composed by hand (as the README teaches):
//! the project is writable, the rest of the host is not visible, egress is
//! allowlist-only, bad usage is one line and 125. As root and as the
//! unprivileged test user.

use std::path::{Path, PathBuf};
use std::process::Command;

use sbx_testutil::{As, audit_events, identities, run_as, stderr, stdout};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/sbx-run")
}

fn bin_dir() -> PathBuf {
    sbx_testutil::bin("sbx-fs").parent().unwrap().to_path_buf()
}

#[test]
fn sbx_run_confines_a_command_to_its_project() {
    for who in identities() {
        let d = sbx_testutil::shared_tempdir();
        let base = d.path().canonicalize().unwrap();
        let proj = base.join("proj");
        let other = base.join("other");
        std::fs::create_dir_all(&proj).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join("secret"), "s\n").unwrap();
        std::fs::write(proj.join(".env"), "KEY=1\n").unwrap();
        let git = |args: &[&str]| {
            // The tree may belong to the test user: root's git must still look.
            let out = Command::new("git")
                .current_dir(&proj)
                .args(["-c", "safe.directory=*"])
                .args(args)
                .output()
                .unwrap();
            assert!(out.status.success(), "git {args:?}: {}", stderr(&out));
            stdout(&out)
        };
        git(&["init", "-q", "-b", "main"]);
        std::fs::write(proj.join(".gitignore"), ".env\n").unwrap();
        git(&["add", ".gitignore"]);
        git(&[
            "-c",
            "user.email=t@t",
            "-c",
            "user.name=t",
            "commit",
            "-qm",
            "init",
        ]);
        if who == As::User {
            let _ = Command::new("chown")
                .arg("-R")
                .arg(format!(
                    "{}:{}",
                    sbx_testutil::test_user().unwrap().0,
                    sbx_testutil::test_user().unwrap().1
                ))
                .arg(&base)
                .status();
        }
        let log = base.join("audit.jsonl");
        let mut c = Command::new("sh");
        c.arg(script()).arg("-C").arg(&proj).arg("-l").arg(&log).args([
            "--",
            "sh",
            "-c",
            "echo built > out.txt; echo W=$?; cat \"$OTHER/secret\" 2>/dev/null; echo R=$?; \
             cat .env 2>/dev/null; echo E=$?; \
             getent hosts example.com >/dev/null 2>&1; echo N=$?; \
             git add out.txt && git -c user.email=a@b.invalid -c user.name=agent commit -qm built; echo C=$?",
        ]);
        c.env("SBX_BIN", bin_dir())
            .env("OTHER", &other)
            // Only an allowlist of the caller's variables reaches the sandbox.
            .env("SBX_PASS_ENV", "OTHER")
            .env_remove("SBX_ID")
            .env_remove("SBX_AUDIT_LOG");
        c.env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .current_dir(&base);
        run_as(&mut c, who);
        let out = c.output().unwrap();
        let so = stdout(&out);
        let ctx = format!("{who:?}: {so}\n{}", stderr(&out));
        assert_eq!(out.status.code(), Some(0), "{ctx}");
        assert!(so.contains("W=0"), "{ctx}");
        assert_eq!(
            std::fs::read_to_string(proj.join("out.txt")).unwrap(),
            "built\n"
        );
        assert!(
            !so.contains("R=0"),
            "another directory of the host is not visible: {ctx}"
        );
        assert!(!so.contains("E=0"), ".env is hidden: {ctx}");
        assert!(
            !so.contains("N=0"),
            "no name resolves without an allowlist: {ctx}"
        );
        // git commits inside; sbx-gitguard imports the commit after.
        assert!(so.contains("C=0"), "{ctx}");
        assert_eq!(git(&["log", "-1", "--format=%s"]).trim(), "built", "{ctx}");
        git(&["fsck", "--strict", "--no-progress"]);
        let evs = audit_events(&log);
        let ids: std::collections::BTreeSet<_> =
            evs.iter().map(|e| e["sbx_id"].to_string()).collect();
        assert_eq!(ids.len(), 1, "one sandbox id: {ids:?}");
        for t in ["sbx-gitguard", "sbx-net", "sbx-fs", "sbx-seccomp"] {
            assert!(evs.iter().any(|e| e["tool"] == t), "{t} logged: {ctx}");
        }
    }
}

#[test]
fn sbx_run_bad_usage_is_one_line_125() {
    for args in [&["-x", "--", "true"][..], &["-C", "/tmp"][..]] {
        let out = Command::new("sh")
            .arg(script())
            .args(args)
            .env("SBX_BIN", bin_dir())
            .output()
            .unwrap();
        sbx_testutil::assert_usage_error(&out, "sbx-run");
    }
}
