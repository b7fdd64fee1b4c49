//! `--allow-exec`: the Landlock execute allowlist refuses every file not
//! listed (EACCES, 126) and the notifier makes each refusal observable
//! (`exec_denied` alert with the resolved path), deduped and rate-limited.
//! As root and as the unprivileged user.

mod common;
use common::*;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sbx_testutil::{assert_event, audit_events};

fn log_in(lab: &Lab) -> PathBuf {
    lab.path().join(sbx_testutil::unique("audit-"))
}

fn canon(p: &str) -> String {
    Path::new(p).canonicalize().unwrap().display().to_string()
}

/// A fresh copy of `src` in the lab: a binary the sandbox "built".
fn copy(lab: &Lab, src: &str, name: &str) -> PathBuf {
    let dst = lab.path().join(name);
    std::fs::copy(src, &dst).unwrap();
    std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o755)).unwrap();
    dst
}

fn denials(log: &Path) -> Vec<serde_json::Value> {
    audit_events(log)
        .into_iter()
        .filter(|e| e["event"] == "exec_denied")
        .collect()
}

fn assert_denied(log: &Path, path: &Path, syscall: &str) -> serde_json::Value {
    let want = path.canonicalize().unwrap().display().to_string();
    assert_event(log, "exec_denied", "alert", |e| {
        e["path"] == want.as_str()
            && e["syscall"] == syscall
            && e["caller_pid"].as_i64() > Some(0)
            && e["enforced_by"] == "landlock"
    })
}

/// The notifier writes its final event once CMD is gone: bounded wait.
fn wait_for_event(log: &Path, event: &str) -> serde_json::Value {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(e) = audit_events(log).into_iter().find(|e| e["event"] == event) {
            return e;
        }
        assert!(Instant::now() < end, "no {event} in {}", log.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn sh(lab: &Lab, who: As, log: &Path, extra: &[&str], script: &str) -> std::process::Output {
    let mut args = vec![
        "--audit-log",
        log.to_str().unwrap(),
        "--allow-exec",
        "/bin/sh",
        "--allow-exec",
        "/usr/bin/true",
    ];
    args.extend_from_slice(extra);
    let _ = lab;
    seccomp(who, &args, &[&"/bin/sh", &"-c", &script])
}

#[test]
fn listed_runs_unlisted_and_copied_are_refused_and_alerted() {
    let lab = Lab::new();
    let mine = copy(&lab, "/usr/bin/true", "mytrue");
    for who in identities() {
        let log = log_in(&lab);
        let script = format!(
            "/usr/bin/true; echo a=$?; /usr/bin/id; echo b=$?; '{}'; echo c=$?",
            mine.display()
        );
        let out = sh(&lab, who, &log, &[], &script);
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert_eq!(stdout(&out), "a=0\nb=126\nc=126\n", "{who:?}");
        assert_denied(&log, Path::new("/usr/bin/id"), "execve");
        let e = assert_denied(&log, &mine, "execve");
        assert_eq!(e["requested"], mine.display().to_string());
        assert_eq!(e["reason"], "not listed");
        // The listed programs (sh itself, true) leave no alert.
        let all = denials(&log);
        assert_eq!(all.len(), 2, "{who:?}: {all:?}");
        assert_event(&log, "exec_allowlist", "info", |e| {
            e["observed"] == true
                && e["allowed"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|p| p == "/usr/bin/true"))
        });
    }
}

#[test]
fn cmd_itself_must_be_listed() {
    let lab = Lab::new();
    for who in identities() {
        let log = log_in(&lab);
        let args = [
            "--audit-log",
            log.to_str().unwrap(),
            "--allow-exec",
            "/bin/sh",
        ];
        let out = seccomp(who, &args, &[&"/usr/bin/true"]);
        assert_eq!(code(&out), 126, "{who:?}: {}", stderr(&out));
        assert_denied(&log, Path::new("/usr/bin/true"), "execve");
    }
}

#[test]
fn relative_symlink_fd_and_dirfd_execs_resolve_to_the_file() {
    let lab = Lab::new();
    let helper = lab.helper("sbx_seccomp_exec");
    let rel = copy(&lab, "/usr/bin/true", "rel");
    let tgt = copy(&lab, "/usr/bin/true", "tgt");
    let lnk = lab.path().join("lnk");
    std::os::unix::fs::symlink("tgt", &lnk).unwrap();
    let fdf = copy(&lab, "/usr/bin/true", "fdcopy");
    let atf = copy(&lab, "/usr/bin/true", "atcopy");
    let h = helper.display().to_string();
    for who in identities() {
        for profile in ["default", "none"] {
            let log = log_in(&lab);
            let script = format!(
                "cd '{d}' && ./rel; echo rel=$?; ./lnk; echo lnk=$?; \
                 '{h}' fexec '{fdf}'; echo fd=$?; '{h}' atexec '{d}' atcopy; echo at=$?; \
                 '{h}' fexec /usr/bin/true; echo fdok=$?",
                d = lab.path().display(),
                fdf = fdf.display(),
            );
            let out = sh(
                &lab,
                who,
                &log,
                &["--profile", profile, "--allow-exec", &h],
                &script,
            );
            let ctx = format!("{who:?} {profile}: {}", stderr(&out));
            assert_eq!(code(&out), 0, "{ctx}");
            assert_eq!(
                stdout(&out),
                "rel=126\nlnk=126\nerr 13\nfd=126\nerr 13\nat=126\nfdok=0\n",
                "{ctx}"
            );
            let e = assert_denied(&log, &rel, "execve");
            assert_eq!(e["requested"], "./rel");
            let e = assert_denied(&log, &tgt, "execve");
            assert_eq!(e["requested"], "./lnk", "the symlink is followed");
            let e = assert_denied(&log, &fdf, "execveat");
            assert_eq!(e["requested"], "", "AT_EMPTY_PATH: the fd's file");
            let e = assert_denied(&log, &atf, "execveat");
            assert_eq!(e["requested"], "atcopy");
            assert_eq!(denials(&log).len(), 4, "{ctx}");
        }
    }
}

#[test]
fn a_script_whose_interpreter_is_not_listed() {
    let lab = Lab::new();
    let interp = copy(&lab, "/bin/sh", "interp");
    let bad = lab.path().join("bad.sh");
    std::fs::write(&bad, format!("#!{}\necho ran\n", interp.display())).unwrap();
    let good = lab.path().join("good.sh");
    std::fs::write(&good, "#!/bin/sh\necho good\n").unwrap();
    for f in [&bad, &good] {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    for who in identities() {
        let log = log_in(&lab);
        let script = format!("'{}'; echo bad=$?; '{}'", bad.display(), good.display());
        let (b, g) = (bad.display().to_string(), good.display().to_string());
        let out = sh(
            &lab,
            who,
            &log,
            &["--allow-exec", &b, "--allow-exec", &g],
            &script,
        );
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert_eq!(stdout(&out), "bad=126\ngood\n", "{who:?}");
        let e = assert_denied(&log, &interp, "execve");
        assert_eq!(e["requested"], b);
        assert_eq!(
            e["reason"],
            format!("interpreter of {} not listed", canon(&b))
        );
        assert_eq!(denials(&log).len(), 1, "{who:?}");
    }
}

#[test]
fn a_flood_of_refused_execs_gives_bounded_alerts_and_a_count() {
    let lab = Lab::new();
    let helper = lab.helper("sbx_seccomp_exec");
    let mine = copy(&lab, "/usr/bin/true", "flood");
    for who in identities() {
        let log = log_in(&lab);
        let h = helper.display().to_string();
        let args = ["--audit-log", log.to_str().unwrap(), "--allow-exec", &h];
        let out = seccomp(
            who,
            &args,
            &[&helper, &"flood", &mine.display().to_string(), &"10000"],
        );
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert_eq!(stdout(&out), "failed 10000\n");
        let fin = wait_for_event(&log, "exec_denied_suppressed");
        let alerts = denials(&log).len() as u64;
        assert!((1..100).contains(&alerts), "{who:?}: {alerts} alerts");
        assert_eq!(fin["denied"], 10000);
        assert_eq!(fin["suppressed"].as_u64().unwrap() + alerts, 10000);
        assert_eq!(fin["severity"], "alert");
        assert_eq!(fin["repeated"][0]["path"], canon(mine.to_str().unwrap()));
    }
}

#[test]
fn without_an_audit_log_the_allowlist_still_holds() {
    let lab = Lab::new();
    let mine = copy(&lab, "/usr/bin/true", "quiet");
    for who in identities() {
        let script = format!("/usr/bin/true; echo a=$?; '{}'; echo b=$?", mine.display());
        let out = seccomp(
            who,
            &["--allow-exec", "/bin/sh", "--allow-exec", "/usr/bin/true"],
            &[&"/bin/sh", &"-c", &script],
        );
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert_eq!(stdout(&out), "a=0\nb=126\n");
        // The memfd refusal does not depend on the audit log.
        let helper = lab.helper("sbx_seccomp_exec");
        let h = helper.display().to_string();
        let out = seccomp(
            who,
            &["--allow-exec", &h],
            &[&helper, &"memfd", &"/usr/bin/id"],
        );
        assert_eq!(stdout(&out), "err 13\n", "{who:?}: {}", stderr(&out));
    }
}

#[test]
fn a_relative_allow_exec_is_a_usage_error() {
    let out = seccomp(As::Root, &["--allow-exec", "bin/sh"], &[&"/bin/true"]);
    sbx_testutil::assert_usage_error(&out, "--allow-exec bin/sh: must be an absolute path");
}

#[test]
fn a_program_written_into_a_memfd_is_refused_by_the_notifier() {
    // Landlock lets files on kernel-internal mounts (memfd) run: the
    // notifier refuses those itself (EACCES) and says so.
    let lab = Lab::new();
    let helper = lab.helper("sbx_seccomp_exec");
    let h = helper.display().to_string();
    for who in identities() {
        let log = log_in(&lab);
        let args = ["--audit-log", log.to_str().unwrap(), "--allow-exec", &h];
        let out = seccomp(who, &args, &[&helper, &"memfd", &"/usr/bin/id"]);
        assert_eq!(code(&out), 126, "{who:?}: {}", stderr(&out));
        assert_eq!(stdout(&out), "err 13\n", "{who:?}: id must not run");
        let e = assert_event(&log, "exec_denied", "alert", |e| {
            e["path"]
                .as_str()
                .is_some_and(|p| p.starts_with("/memfd:sbx-built"))
                && e["enforced_by"] == "notifier"
                && e["syscall"] == "execveat"
        });
        assert!(e["reason"].as_str().unwrap().contains("memfd"), "{e}");
        // By path, through the caller's own /proc/self/fd and /dev/fd.
        for prefix in ["/proc/self/fd/", "/dev/fd/"] {
            let log = log_in(&lab);
            let args = ["--audit-log", log.to_str().unwrap(), "--allow-exec", &h];
            let out = seccomp(
                who,
                &args,
                &[&helper, &"memfdpath", &"/usr/bin/id", &prefix],
            );
            assert_eq!(
                stdout(&out),
                "err 13\n",
                "{who:?} {prefix}: {}",
                stderr(&out)
            );
            assert_event(&log, "exec_denied", "alert", |e| {
                e["enforced_by"] == "notifier" && e["syscall"] == "execve"
            });
        }
    }
}

#[test]
fn print_shows_the_exec_watch() {
    let out = seccomp(As::Root, &["--print", "--allow-exec", "/bin/sh"], &[]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let s = stdout(&out);
    assert!(
        s.lines()
            .any(|l| l.starts_with("execve, execveat: notify(CONTINUE)") && l.contains("/bin/sh")),
        "{s}"
    );
}

#[test]
fn memfds_are_created_without_execute_permission() {
    // memfd_create goes through the notifier, which creates the memfd with
    // MFD_NOEXEC_SEAL and hands it over: no execute bit, and none can be
    // added; MFD_EXEC is refused. Reading and writing work as usual.
    let lab = Lab::new();
    let helper = lab.helper("sbx_seccomp_exec");
    let h = helper.display().to_string();
    for who in identities() {
        let log = log_in(&lab);
        let args = ["--audit-log", log.to_str().unwrap(), "--allow-exec", &h];
        let out = seccomp(who, &args, &[&helper, &"memfdmode"]);
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert_eq!(
            stdout(&out),
            "mode 666\nchmod err 1\nrw ok\nexec_flag err 13\n",
            "{who:?}"
        );
        assert_event(&log, "exec_denied", "alert", |e| {
            e["syscall"] == "memfd_create" && e["path"] == "memfd:sbx-mode"
        });
        // Without --allow-exec nothing changes.
        let out = seccomp(who, &[], &[&helper, &"memfdmode"]);
        assert_eq!(
            stdout(&out),
            "mode 777\nchmod ok\nrw ok\nexec_flag ok\n",
            "{who:?}"
        );
    }
}
