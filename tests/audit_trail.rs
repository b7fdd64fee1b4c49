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

        // A supervisor (sbx-net spawns its next command) gives it nothing.
        let mut c = sbx_testutil::tool("sbx-net");
        c.arg("--audit-log").arg(&s.log).args(["--", "./sbx-x"]);
        c.env("PATH", PATH).current_dir(&s.proj);
        run_as(&mut c, who);
        let out = c.output().unwrap();
        assert_fake_tool_got_nothing(&out, &s.log, &["sbx-net"]);
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

        // 3b. Through a host bind mount that aliases a directory inside
        // the bind (no ancestor in common; root makes the mount).
        if who == As::Root {
            let deep = s.proj.join("sub/deep");
            std::fs::create_dir_all(&deep).unwrap();
            let alias = s.base.join("alias");
            std::fs::create_dir_all(&alias).unwrap();
            let st = Command::new("mount")
                .arg("--bind")
                .arg(&deep)
                .arg(&alias)
                .status()
                .unwrap();
            assert!(st.success(), "mount --bind");
            let out = fs_with_log(&s, &alias.join("a.jsonl"), who);
            let _ = Command::new("umount").arg(&alias).status();
            sbx_testutil::assert_usage_error(&out, "is inside the writable bind");
            assert!(!s.proj.join("ran.txt").exists(), "the command ran");
        }

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

fn audit_tool(args: &[&str], log: &Path) -> Output {
    let mut c = sbx_testutil::tool("sbx-audit");
    c.args(args).arg(log);
    c.output().unwrap()
}

/// Runs a chain that leaves alerts (a denied syscall, a hidden file read).
fn chain_with_alerts(log: &Path, proj: &Path, who: As) -> Output {
    let mut c = sbx_testutil::tool("sbx-fs");
    c.arg("--audit-log")
        .arg(log)
        .arg("--rw")
        .arg(proj)
        .arg("--chdir")
        .arg(proj)
        .arg("--")
        .arg(sbx_testutil::bin("sbx-seccomp"))
        .args([
            "--profile",
            "default",
            "--",
            "sh",
            "-c",
            "unshare -U true 2>/dev/null; cat .env 2>/dev/null; echo done",
        ]);
    c.env("PATH", PATH).current_dir(proj);
    run_as(&mut c, who);
    c.output().unwrap()
}

#[test]
fn verify_proves_a_real_log_whole_and_finds_each_tampering() {
    for who in identities() {
        let s = setup(who);
        let log = s.base.join("chained.jsonl");
        std::fs::write(s.proj.join(".env"), "K=1\n").unwrap();
        if who == As::User {
            chown_r(&s.base);
        }
        // Two runs in parallel and one after: one chain across all of them.
        let (a, b) = std::thread::scope(|sc| {
            let a = sc.spawn(|| chain_with_alerts(&log, &s.proj, who));
            let b = sc.spawn(|| chain_with_alerts(&log, &s.proj, who));
            (a.join().unwrap(), b.join().unwrap())
        });
        for o in [&a, &b] {
            assert!(stdout(o).contains("done"), "{}", stderr(o));
        }
        let out = chain_with_alerts(&log, &s.proj, who);
        assert!(stdout(&out).contains("done"), "{}", stderr(&out));
        let evs = audit_events(&log);
        assert!(evs.iter().any(|e| e["severity"] == "alert"), "{evs:?}");
        let ids: std::collections::BTreeSet<_> =
            evs.iter().map(|e| e["sbx_id"].to_string()).collect();
        assert_eq!(ids.len(), 3, "three runs share the log");

        let ok = audit_tool(&["verify"], &log);
        assert_eq!(code(&ok), 0, "{}{}", stdout(&ok), stderr(&ok));
        let j = audit_tool(&["verify", "--json"], &log);
        let v: serde_json::Value = serde_json::from_str(&stdout(&j)).unwrap();
        assert_eq!(v["ok"], true);
        assert_eq!(v["lines"], evs.len() as u64);
        let anchor = v["anchor"].as_str().unwrap().to_string();

        let text = std::fs::read_to_string(&log).unwrap();
        let lines: Vec<&str> = text.split_inclusive('\n').collect();
        let broken_at = |t: String, args: &[&str]| -> u64 {
            let p = s.base.join("tampered.jsonl");
            std::fs::write(&p, t).unwrap();
            let o = audit_tool(&[&["verify", "--json"], args].concat(), &p);
            assert_eq!(code(&o), 1, "{}", stdout(&o));
            let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
            assert_eq!(v["ok"], false);
            v["broken_line"].as_u64().unwrap()
        };
        // An alert edited into an info event.
        let k = lines.iter().position(|l| l.contains("\"alert\"")).unwrap();
        let mut e = lines.clone();
        let edited = e[k].replace("\"alert\"", "\"info\"");
        e[k] = &edited;
        if k + 1 < lines.len() {
            assert_eq!(broken_at(e.concat(), &[]), k as u64 + 2);
        }
        // A removed line, a reordered pair, a cut head.
        let mut r = lines.clone();
        r.remove(1);
        assert_eq!(broken_at(r.concat(), &[]), 2);
        let mut o = lines.clone();
        o.swap(1, 2);
        assert_eq!(broken_at(o.concat(), &[]), 2);
        assert_eq!(broken_at(lines[2..].concat(), &[]), 1);
        // A forged line appended without the chain.
        let forged = format!(
            "{}{}\n",
            text,
            r#"{"ts":"x","sbx_id":"x","tool":"sbx-fs","pid":1,"event":"end","severity":"info"}"#
        );
        assert_eq!(broken_at(forged, &[]), lines.len() as u64 + 1);
        // A cut tail and an emptied log, against the anchor.
        let cut = lines[..lines.len() - 1].concat();
        assert!(broken_at(cut, &["--anchor", &anchor]) >= lines.len() as u64);
        assert_eq!(broken_at(String::new(), &["--anchor", &anchor]), 1);

        // The text form names the line; show escapes and filters.
        let p = s.base.join("tampered.jsonl");
        std::fs::write(&p, r.concat()).unwrap();
        let t = audit_tool(&["verify"], &p);
        assert!(stdout(&t).contains(":2: broken:"), "{}", stdout(&t));
        let sh = audit_tool(&["show", "--severity", "alert"], &log);
        assert_eq!(code(&sh), 0);
        let shown = stdout(&sh);
        assert!(
            !shown.is_empty() && shown.lines().all(|l| l.contains(" alert ")),
            "{shown}"
        );
        assert!(!shown.contains('\x1b'), "no colour off a terminal");
        let tl = audit_tool(&["tail", "-n", "2"], &log);
        assert_eq!(stdout(&tl).lines().count(), 2);
        let bad = audit_tool(&["verify", "--anchor", "nope"], &log);
        sbx_testutil::assert_usage_error(&bad, "--anchor");
        let missing = audit_tool(&["verify"], &s.base.join("missing.jsonl"));
        sbx_testutil::assert_usage_error(&missing, "missing.jsonl");
    }
}

#[test]
fn the_seccomp_notifier_cannot_be_killed_from_inside() {
    // The notifier names itself after the fork: look for it for up to 5 s
    // (a loaded machine may run the command first).
    let script = r#"
N=
i=0
while [ -z "$N" ] && [ $i -lt 50 ]; do
  for p in /proc/[0-9]*; do
    [ "$(cat $p/comm 2>/dev/null)" = sbx-seccomp-ntf ] && N=${p#/proc/}
  done
  [ -n "$N" ] || sleep 0.1
  i=$((i+1))
done
echo N=$N
kill -9 $N 2>/dev/null; echo k1=$?
kill -9 -$N 2>/dev/null; echo k2=$?
kill -9 -1 2>/dev/null; echo k3=$?
python3 -c "import os; os.pidfd_open($N)" 2>/dev/null; echo k4=$?
unshare -U true 2>/dev/null; echo u=$?
"#;
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
            .args(["--profile", "default", "--", "sh", "-c", script]);
        c.env("PATH", PATH).current_dir(&s.proj);
        run_as(&mut c, who);
        let out = c.output().unwrap();
        let so = stdout(&out);
        assert_eq!(code(&out), 0, "{so}{}", stderr(&out));
        let n = marker(&so, "N");
        assert!(!n.is_empty(), "notifier not found: {so}");
        for k in ["k1", "k2", "k3", "k4", "u"] {
            assert_ne!(marker(&so, k), "0", "{k} succeeded: {so}");
        }
        let evs = audit_events(&s.log);
        let attacked = evs
            .iter()
            .filter(|e| e["event"] == "notifier_attacked" && e["severity"] == "alert")
            .count();
        assert_eq!(attacked, 4, "{evs:?}");
        // Still alive afterwards: the later refusal is an alert, not a
        // silent ENOSYS.
        assert!(
            evs.iter()
                .any(|e| e["event"] == "syscall_denied" && e["syscall"] == "unshare"),
            "{evs:?}"
        );
    }
}

/// Host pid of the seccomp notifier that descends from `root_pid`.
fn notifier_under(root_pid: u32) -> Option<i32> {
    let ppid = |p: i32| -> Option<i32> {
        let st = std::fs::read_to_string(format!("/proc/{p}/status")).ok()?;
        st.lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .and_then(|v| v.trim().parse().ok())
    };
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim_end() != "sbx-seccomp-ntf" {
            continue;
        }
        let mut p = pid;
        for _ in 0..8 {
            match ppid(p) {
                Some(q) if q == root_pid as i32 => return Some(pid),
                Some(q) if q > 1 => p = q,
                _ => break,
            }
        }
    }
    None
}

#[test]
fn a_killed_notifier_and_a_dead_supervisor_are_alerts() {
    for who in identities() {
        let s = setup(who);
        let go = s.proj.join("go");
        let mut c = sbx_testutil::tool("sbx-fs");
        c.arg("--audit-log")
            .arg(&s.log)
            .arg("--rw")
            .arg(&s.proj)
            .arg("--chdir")
            .arg(&s.proj)
            .arg("--")
            .arg(sbx_testutil::bin("sbx-seccomp"))
            .args([
                "--profile",
                "default",
                "--",
                "sh",
                "-c",
                "echo ready > ready; i=0; while [ ! -e go ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; \
                 unshare -U true 2>/dev/null; echo u=$?",
            ]);
        c.env("PATH", PATH)
            .current_dir(&s.proj)
            .stdout(std::process::Stdio::piped());
        run_as(&mut c, who);
        let child = c.spawn().unwrap();
        let t0 = std::time::Instant::now();
        let mut ntf = None;
        while t0.elapsed() < std::time::Duration::from_secs(10) {
            if s.proj.join("ready").exists() {
                ntf = notifier_under(child.id());
                if ntf.is_some() {
                    break;
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        // Killed from outside (the sandbox itself cannot, see above).
        let ntf = ntf.expect("notifier found");
        // SAFETY: kill with integer arguments (the notifier's pid, found in /proc).
        assert_eq!(unsafe { libc::kill(ntf, libc::SIGKILL) }, 0);
        std::fs::write(&go, "").unwrap();
        let out = child.wait_with_output().unwrap();
        let so = stdout(&out);
        // Fail-closed: the notifier's watcher kills the command (it never
        // goes on with silent ENOSYS; tests/netgaps.rs has the details).
        assert!(!so.contains("u="), "{so}");
        assert_eq!(code(&out), 128 + libc::SIGKILL, "{so}");
        let evs = audit_events(&s.log);
        assert!(
            evs.iter().any(|e| e["event"] == "seccomp_notifier_died"
                && e["severity"] == "alert"
                && e["signal"] == libc::SIGKILL),
            "{evs:?}"
        );
        std::fs::remove_file(&go).unwrap();
        std::fs::remove_file(s.proj.join("ready")).unwrap();

        // A supervisor killed under the chain: the next tool says so.
        let mut c = sbx_testutil::tool("sbx-net");
        c.arg("--audit-log")
            .arg(&s.log)
            .arg("--")
            .arg(sbx_testutil::bin("sbx-fs"))
            .arg("--rw")
            .arg(&s.proj)
            .arg("--chdir")
            .arg(&s.proj)
            .args(["--", "sh", "-c", "echo ready > ready; sleep 20"]);
        c.env("PATH", PATH).current_dir(&s.proj);
        run_as(&mut c, who);
        let mut child = c.spawn().unwrap();
        let t0 = std::time::Instant::now();
        while !s.proj.join("ready").exists() && t0.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(s.proj.join("ready").exists());
        // sbx-fs (the supervisor of the rest of the chain) killed: sbx-net
        // above it reaps it and says so.
        let evs = audit_events(&s.log);
        let fs_pid = evs
            .iter()
            .rev()
            .find(|e| e["event"] == "net_start")
            .and_then(|e| e["child"].as_i64())
            .expect("net_start names its child") as i32;
        // SAFETY: kill with integer arguments (sbx-fs's pid, named by the audit log).
        assert_eq!(unsafe { libc::kill(fs_pid, libc::SIGKILL) }, 0);
        let _ = child.wait();
        let evs = audit_events(&s.log);
        assert!(
            evs.iter().any(|e| e["event"] == "supervisor_died"
                && e["tool"] == "sbx-net"
                && e["severity"] == "alert"
                && e["signal"] == libc::SIGKILL),
            "{evs:?}"
        );
    }
}

#[test]
fn an_exhausted_alert_budget_is_an_alert() {
    // 300 refused calls at once: the notifier's burst is 50.
    let script = "python3 -c 'import ctypes\nl = ctypes.CDLL(None)\nfor i in range(300): l.unshare(0x10000000)'; echo done";
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
            .args(["--profile", "default", "--", "sh", "-c", script]);
        c.env("PATH", PATH).current_dir(&s.proj);
        run_as(&mut c, who);
        let out = c.output().unwrap();
        assert!(stdout(&out).contains("done"), "{}", stderr(&out));
        let evs = audit_events(&s.log);
        let ex: Vec<_> = evs
            .iter()
            .filter(|e| e["event"] == "alert_budget_exhausted")
            .collect();
        assert_eq!(ex.len(), 1, "{evs:?}");
        assert_eq!(ex[0]["severity"], "alert");
        assert_eq!(ex[0]["suppressed_event"], "syscall_denied");
        assert_eq!(ex[0]["tool"], "sbx-seccomp");
    }
}

#[test]
fn refusals_are_told_to_the_caller() {
    for who in identities() {
        let s = setup(who);
        // Without a log: a program refused by --allow-exec is a line on stderr.
        let mut c = sbx_testutil::tool("sbx-seccomp");
        c.args([
            "--allow-exec",
            "/usr/bin/sh",
            "--allow-exec",
            "/usr/bin/dash",
        ])
        .args([
            "--",
            "/usr/bin/sh",
            "-c",
            "/usr/bin/id >/dev/null 2>&1; echo r=$?",
        ]);
        c.env("PATH", PATH).current_dir(&s.proj);
        run_as(&mut c, who);
        let out = c.output().unwrap();
        assert_ne!(marker(&stdout(&out), "r"), "0", "{}", stderr(&out));
        assert!(
            stderr(&out).contains("ALERT exec_denied path=/usr/bin/id"),
            "{}",
            stderr(&out)
        );

        // Without a log, syscall refusals too; and the notifier's copy of
        // stderr is closed when CMD exits, even if CMD left a process
        // behind (the reader sees EOF at once).
        let mut c = sbx_testutil::tool("sbx-seccomp");
        c.args([
            "--",
            "sh",
            "-c",
            "sleep 4 </dev/null >/dev/null 2>&1 & unshare -U true 2>/dev/null; echo r=$?",
        ]);
        c.env("PATH", PATH).current_dir(&s.proj);
        run_as(&mut c, who);
        let t0 = std::time::Instant::now();
        let out = c.output().unwrap();
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(3),
            "EOF held back"
        );
        assert_ne!(marker(&stdout(&out), "r"), "0");
        assert!(
            stderr(&out).contains("ALERT syscall_denied syscall=unshare"),
            "{}",
            stderr(&out)
        );

        // With a log: one block at the end of stderr, and the file.
        let file = s.base.join("violations.json");
        let mut c = sbx_testutil::tool("sbx-fs");
        c.arg("--audit-log")
            .arg(&s.log)
            .arg("--rw")
            .arg(&s.proj)
            .arg("--chdir")
            .arg(&s.proj)
            .arg("--")
            .arg(sbx_testutil::bin("sbx-seccomp"))
            .args([
                "--profile",
                "default",
                "--",
                "sh",
                "-c",
                "unshare -U true 2>/dev/null; unshare -U true 2>/dev/null; echo out",
            ]);
        c.env("PATH", PATH)
            .env("SBX_VIOLATIONS", &file)
            .current_dir(&s.proj);
        run_as(&mut c, who);
        let out = c.output().unwrap();
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let err = stderr(&out);
        assert_eq!(err.matches("<sandbox_violations").count(), 1, "{err}");
        let block = &err[err.find("<sandbox_violations").unwrap()..];
        assert!(block.trim_end().ends_with("</sandbox_violations>"), "{err}");
        assert!(
            block.contains("syscall_denied syscall=unshare (sbx-seccomp) x2"),
            "{err}"
        );
        assert!(
            !block.contains("earlier_alert"),
            "another run's alerts: {err}"
        );
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        assert_eq!(v["count"], 2);
        assert_eq!(v["violations"][0]["event"], "syscall_denied");

        // A run with nothing refused prints no block.
        let mut c = sbx_testutil::tool("sbx-fs");
        c.arg("--audit-log")
            .arg(&s.log)
            .arg("--rw")
            .arg(&s.proj)
            .args(["--", "true"]);
        c.env("PATH", PATH).current_dir(&s.proj);
        run_as(&mut c, who);
        let out = c.output().unwrap();
        assert!(
            !stderr(&out).contains("sandbox_violations"),
            "{}",
            stderr(&out)
        );
    }
}

#[test]
fn one_violations_block_through_sbx_run_and_sbx_policy_chain() {
    for who in identities() {
        let s = setup(who);
        let script = "unshare -U true 2>/dev/null; echo out";
        let mut c = Command::new("sh");
        c.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/sbx-run"))
            .arg("-C")
            .arg(&s.proj)
            .arg("-l")
            .arg(&s.log)
            .args(["--", "sh", "-c", script]);
        c.env("SBX_BIN", bin_dir())
            .env("PATH", PATH)
            .env_remove("SBX_ID")
            .env_remove("SBX_AUDIT_LOG")
            .current_dir(&s.base);
        run_as(&mut c, who);
        let out = c.output().unwrap();
        let err = stderr(&out);
        assert_eq!(code(&out), 0, "{err}");
        assert_eq!(err.matches("<sandbox_violations").count(), 1, "{err}");
        assert!(
            err.contains("syscall_denied syscall=unshare (sbx-seccomp)"),
            "{err}"
        );

        let home = s.base.join("home");
        std::fs::create_dir_all(&home).unwrap();
        if who == As::User {
            chown_r(&home);
        }
        let mut c = sbx_testutil::tool("sbx-policy");
        c.arg("--audit-log").arg(&s.log);
        c.args(["chain", "--managed", "/nonexistent/managed.json", "--home"])
            .arg(&home)
            .args(["--", "sh", "-c", script]);
        c.current_dir(&s.proj).env("PATH", PATH);
        run_as(&mut c, who);
        let out = c.output().unwrap();
        let err = stderr(&out);
        assert_eq!(code(&out), 0, "{err}");
        assert_eq!(err.matches("<sandbox_violations").count(), 1, "{err}");
        assert!(
            err.contains("syscall_denied syscall=unshare (sbx-seccomp)"),
            "{err}"
        );
    }
}
