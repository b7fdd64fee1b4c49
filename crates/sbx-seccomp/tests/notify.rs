//! Observable denials: with an audit log, the default profile's EPERM
//! denials go through a notifier (SECCOMP_RET_USER_NOTIF) that answers
//! EPERM and writes a `syscall_denied` alert, rate-limited. As root and as
//! the unprivileged user.

mod common;
use common::*;

use std::path::Path;
use std::time::{Duration, Instant};

use sbx_testutil::{assert_event, audit_events};

fn log_in(lab: &Lab) -> std::path::PathBuf {
    lab.path().join(sbx_testutil::unique("audit-"))
}

fn denied(log: &Path) -> Vec<serde_json::Value> {
    audit_events(log)
        .into_iter()
        .filter(|e| e["event"] == "syscall_denied")
        .collect()
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

#[test]
fn denied_calls_fail_with_eperm_and_leave_an_alert() {
    let lab = Lab::new();
    for who in identities() {
        let log = log_in(&lab);
        let names = [
            "mount",
            "unshare_newuser",
            "chroot",
            "tiocsti",
            "clone_newns",
        ];
        let (out, r) = probes(&lab, who, &["--audit-log", log.to_str().unwrap()], &names);
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        for n in names {
            assert_eq!(
                r.get(n).map(String::as_str),
                Some(EPERM),
                "{who:?} {n}: {r:?}"
            );
        }
        let applied = assert_event(&log, "seccomp_applied", "info", |e| e["notify"] == true);
        assert!(applied["notifier_pid"].as_i64().unwrap() > 0);
        let alert = |sys: &str, pred: &dyn Fn(&serde_json::Value) -> bool| {
            assert_event(&log, "syscall_denied", "alert", |e| {
                e["syscall"] == sys && e["errno"] == "EPERM" && e["nr"].is_u64() && pred(e)
            })
        };
        alert("mount", &|_| true);
        alert("chroot", &|_| true);
        alert("unshare", &|e| {
            e["args"]["flags"] == format!("{:#x}", libc::CLONE_NEWUSER)
        });
        alert("ioctl", &|e| {
            e["args"]["request"] == format!("{:#x}", libc::TIOCSTI)
        });
        alert("clone", &|e| {
            let f = e["args"]["flags"].as_str().unwrap_or("0x0");
            u64::from_str_radix(f.trim_start_matches("0x"), 16).unwrap() & libc::CLONE_NEWNS as u64
                != 0
        });
        // Allowed calls pass without a notification.
        let (_, r) = probes(
            &lab,
            who,
            &["--audit-log", log.to_str().unwrap()],
            &["getppid"],
        );
        assert!(r["getppid"].starts_with("ok "), "{r:?}");
        assert_eq!(denied(&log).len(), names.len(), "{who:?}");
    }
}

#[test]
fn without_an_audit_log_or_with_action_errno_denials_stay_plain_eperm() {
    let lab = Lab::new();
    for who in identities() {
        let (_, r) = probes(&lab, who, &[], &["mount"]);
        assert_eq!(r["mount"], EPERM);
        let log = log_in(&lab);
        let args = ["--action", "errno", "--audit-log", log.to_str().unwrap()];
        let (_, r) = probes(&lab, who, &args, &["mount"]);
        assert_eq!(r["mount"], EPERM);
        assert_event(&log, "seccomp_applied", "info", |e| e["notify"] == false);
        assert!(denied(&log).is_empty());
    }
}

#[test]
fn deny_with_the_default_action_is_alerted_too() {
    let lab = Lab::new();
    for who in identities() {
        let log = log_in(&lab);
        let args = ["--deny", "getppid", "--audit-log", log.to_str().unwrap()];
        let (out, r) = probes(&lab, who, &args, &["getppid", "getpid", "mount"]);
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert_eq!(r["getppid"], EPERM);
        assert_eq!(r["mount"], EPERM);
        assert!(r["getpid"].starts_with("ok "), "{r:?}");
        assert_event(&log, "syscall_denied", "alert", |e| {
            e["syscall"] == "getppid"
        });
        assert_event(&log, "syscall_denied", "alert", |e| e["syscall"] == "mount");
        // --deny clone3: the profile's ENOSYS filter also answers it; the
        // --deny filter stays separate and silent, the answer EPERM.
        let log = log_in(&lab);
        let args = ["--deny", "clone3", "--audit-log", log.to_str().unwrap()];
        let (_, r) = probes(&lab, who, &args, &["clone3", "mount"]);
        assert_eq!(r["clone3"], EPERM, "{r:?}");
        assert_eq!(r["mount"], EPERM);
        assert_event(&log, "syscall_denied", "alert", |e| e["syscall"] == "mount");
    }
}

#[test]
fn a_shell_waiting_after_a_denied_call_returns() {
    let lab = Lab::new();
    let probe = lab.probe();
    for who in identities() {
        let log = log_in(&lab);
        let script = format!("'{}' mount & wait; echo waited", probe.display());
        // timeout(1) kills the shell if `wait` hangs on the notifier.
        let out = seccomp(
            who,
            &["--audit-log", log.to_str().unwrap()],
            &[&"timeout", &"60", &"sh", &"-c", &script],
        );
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert_eq!(stdout(&out), "mount err 1\nwaited\n");
        assert_event(&log, "syscall_denied", "alert", |e| e["syscall"] == "mount");
    }
}

#[test]
fn a_flood_of_denied_calls_gives_bounded_alerts_and_a_count() {
    let lab = Lab::new();
    for who in identities() {
        let log = log_in(&lab);
        let (out, r) = probes(
            &lab,
            who,
            &["--audit-log", log.to_str().unwrap()],
            &["mount*10000"],
        );
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert_eq!(r["mount"], EPERM);
        let fin = wait_for_event(&log, "syscall_denied_suppressed");
        let alerts = denied(&log).len() as u64;
        assert!(alerts >= 50, "{alerts} alerts");
        assert!(alerts < 1000, "{alerts} alerts: not rate-limited");
        assert_eq!(fin["denied"], 10000);
        assert_eq!(fin["suppressed"].as_u64().unwrap() + alerts, 10000);
        assert_eq!(fin["severity"], "alert");
    }
}

#[test]
fn the_notifier_cannot_be_killed_from_inside() {
    let lab = Lab::new();
    let probe = lab.probe();
    for who in identities() {
        let log = log_in(&lab);
        // From inside: the notifier's pid is in the log CMD can read here;
        // signals aimed at it are refused (an alert each), and the denied
        // calls after it are still answered EPERM with their alert (not a
        // silent ENOSYS).
        let script = format!(
            r#"p='{p}'; "$p" mount
n=$(grep -o '"notifier_pid":[0-9]*' '{log}' | head -1 | cut -d: -f2)
kill -9 "$n" 2>/dev/null || echo kill-failed
kill -9 "-$n" 2>/dev/null || echo kill-group-failed
i=0; while [ $i -lt 3 ]; do
  "$p" mount; i=$((i+1))
done"#,
            p = probe.display(),
            log = log.display()
        );
        let out = seccomp(
            who,
            &["--audit-log", log.to_str().unwrap()],
            &[&"sh", &"-c", &script],
        );
        let s = stdout(&out);
        assert_eq!(code(&out), 0, "{who:?}: {s} {}", stderr(&out));
        assert!(
            s.contains("kill-failed") && s.contains("kill-group-failed"),
            "{s}"
        );
        let mounts: Vec<&str> = s.lines().filter(|l| l.starts_with("mount")).collect();
        assert_eq!(mounts, vec!["mount err 1"; 4], "{who:?}: {s}");
        let evs = sbx_testutil::audit_events(&log);
        assert_eq!(
            evs.iter()
                .filter(|e| e["event"] == "notifier_attacked" && e["severity"] == "alert")
                .count(),
            2,
            "{evs:?}"
        );
        assert_eq!(
            evs.iter()
                .filter(|e| e["event"] == "syscall_denied")
                .count(),
            4,
            "{evs:?}"
        );
    }
}

#[test]
fn print_shows_the_notify_action() {
    let out = seccomp(As::Root, &["--print"], &[]);
    let s = stdout(&out);
    assert!(
        s.lines()
            .any(|l| l.contains(" mount ") && l.ends_with("notify(EPERM)")),
        "{s}"
    );
    let out = seccomp(As::Root, &["--print", "--action", "errno"], &[]);
    assert!(!stdout(&out).contains("notify("));
}
