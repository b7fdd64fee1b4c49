//! sbx-seccomp as the innermost tool of a chain:
//! `sbx-cgroup ... -- sbx-fs ... -- sbx-seccomp -- CMD` as root, and
//! `sbx-fs ... -- sbx-seccomp -- CMD` as the unprivileged user. The
//! denials hold inside, and the kill is reported by the supervisor that
//! reaps it (sbx-fs's init). Skipped (failed under SBX_MUST_WORK=1) when
//! the other tools are not built or cannot run a plain command here.

mod common;
use common::*;

use std::path::PathBuf;
use std::process::Command;

fn sibling(name: &str) -> Option<PathBuf> {
    let p = sbx_testutil::bin("sbx-seccomp").with_file_name(name);
    p.exists().then_some(p)
}

fn chain(
    who: As,
    lab: &Lab,
    log: &std::path::Path,
    inner: &[&dyn AsRef<std::ffi::OsStr>],
) -> std::process::Output {
    let fs = sibling("sbx-fs").expect("sbx-fs");
    let cg = sibling("sbx-cgroup").expect("sbx-cgroup");
    let sec = sbx_testutil::bin("sbx-seccomp");
    let bindir = sec.parent().unwrap().to_path_buf();
    // The outermost tool opens the audit log and hands it down the chain.
    let mut c = if who == As::Root {
        let mut c = Command::new(cg);
        c.arg("--audit-log").arg(log);
        c.args(["--memory", "256M", "--pids", "64", "--"]).arg(fs);
        c
    } else {
        let mut c = Command::new(fs);
        c.arg("--audit-log").arg(log);
        c
    };
    c.arg("--ro")
        .arg(lab.path())
        .arg("--ro")
        .arg(&bindir)
        .arg("--")
        .arg(&sec);
    for a in inner {
        c.arg(a);
    }
    c.env_remove("SBX_ID")
        .env_remove("SBX_AUDIT_LOG")
        .env_remove("SBX_AUDIT_FD")
        .env_remove("SBX_SUPERVISOR")
        .env("PATH", "/usr/local/bin:/usr/bin:/bin");
    run_as(&mut c, who);
    sbx_testutil::output(&mut c)
}

#[test]
fn chained_after_sbx_fs_and_sbx_cgroup() {
    if sibling("sbx-fs").is_none() || sibling("sbx-cgroup").is_none() {
        sbx_testutil::skip!("sbx-fs / sbx-cgroup not built");
    }
    let lab = Lab::new();
    let probe = lab.probe();
    for who in identities() {
        let log = lab.path().join(sbx_testutil::unique("audit-"));
        // The chain must work without sbx-seccomp's filter doing anything.
        let out = chain(who, &lab, &log, &[&"--profile", &"none", &"--", &"true"]);
        if code(&out) != 0 {
            sbx_testutil::skip!("the sbx-fs chain does not run here: {}", stderr(&out));
        }
        let log = lab.path().join(sbx_testutil::unique("audit-"));
        let out = chain(
            who,
            &lab,
            &log,
            &[
                &"--",
                &probe,
                &"getpid",
                &"mount",
                &"clone_newuser",
                &"clone3",
                &"iopl",
            ],
        );
        let s = stdout(&out);
        assert!(s.contains("mount err 1"), "{who:?}: {s} {}", stderr(&out));
        assert!(s.contains("clone_newuser err 1"), "{s}");
        assert!(s.contains("clone3 err 38"), "{s}");
        assert!(!s.contains("iopl"), "{s}");
        assert_eq!(code(&out), SIGSYS_EXIT, "{who:?}: {}", stderr(&out));
        let ev = sbx_testutil::assert_event(&log, "seccomp_kill", "alert", |_| true);
        assert_eq!(ev["signal"], "SIGSYS");
        let applied = sbx_testutil::assert_event(&log, "seccomp_applied", "info", |_| true);
        assert_eq!(
            applied["sbx_id"], ev["sbx_id"],
            "one sandbox id across the chain"
        );
    }
}

#[test]
fn allow_exec_inside_the_chain_refuses_and_alerts() {
    if sibling("sbx-fs").is_none() || sibling("sbx-cgroup").is_none() {
        sbx_testutil::skip!("sbx-fs / sbx-cgroup not built");
    }
    let lab = Lab::new();
    let own = lab.path().join("own");
    std::fs::copy("/usr/bin/true", &own).unwrap();
    for who in identities() {
        let log = lab.path().join(sbx_testutil::unique("audit-"));
        let script = format!(
            "/usr/bin/true; echo a=$?; cd '{}' && ./own; echo b=$?",
            lab.path().display()
        );
        let out = chain(
            who,
            &lab,
            &log,
            &[
                &"--allow-exec",
                &"/bin/sh",
                &"--allow-exec",
                &"/usr/bin/true",
                &"--",
                &"sh",
                &"-c",
                &script,
            ],
        );
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert_eq!(stdout(&out), "a=0\nb=126\n", "{who:?}: {}", stderr(&out));
        let want = own.canonicalize().unwrap().display().to_string();
        let ev = sbx_testutil::assert_event(&log, "exec_denied", "alert", |e| {
            e["path"] == want.as_str() && e["requested"] == "./own"
        });
        let applied = sbx_testutil::assert_event(&log, "seccomp_applied", "info", |_| true);
        assert_eq!(applied["sbx_id"], ev["sbx_id"], "one sandbox id");
    }
}
