//! Issue 16: stopping a command that ignores SIGTERM (every supervisor
//! escalates to SIGKILL after --kill-after) and limits without root (run
//! time, rlimits, processes and memory bounded for an unprivileged caller).
//! As root and as the unprivileged test user where the issue says so.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sbx_testutil::{As, assert_event, code, identities, run_as, stderr, tool};

/// A command that ignores SIGTERM (SIG_IGN is inherited by the `sleep` it
/// execs), says it is ready, and would run for 1000 s.
const TERM_PROOF: &str = "trap '' TERM; echo ready; exec sleep 1000";

/// Starts `cmd` (stdout piped), waits for "ready", sends SIGTERM to the
/// tool, and returns its exit code and how long it took to end after the
/// signal. Bounded: the tool is SIGKILLed after 30 s.
fn term_and_time(mut cmd: Command) -> (i32, Duration, String) {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready", "the command did not start");
    let t0 = Instant::now();
    // SAFETY: kill with integer arguments; the child is ours and not yet reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let limit = Duration::from_secs(30);
    let st = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = t0.elapsed();
    let mut err = String::new();
    let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err);
    use std::os::unix::process::ExitStatusExt;
    let c = st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0));
    (c, took, err)
}

fn log_in(d: &Path) -> std::path::PathBuf {
    d.join("audit.jsonl")
}

/// The escalation is asserted: SIGKILL came after the grace (not before,
/// not 1000 s later), status 137, `kill_after` (warn) logged.
fn assert_escalated(c: i32, took: Duration, err: &str, grace: Duration, log: &Path, tool: &str) {
    assert_eq!(c, 137, "{tool}: status {c}; stderr: {err}");
    assert!(
        took >= grace && took < grace + Duration::from_secs(5),
        "{tool}: ended {took:?} after SIGTERM (grace {grace:?})"
    );
    let ev = assert_event(log, "kill_after", "warn", |e| e["tool"] == tool);
    assert_eq!(ev["signal"], libc::SIGTERM, "{ev}");
    assert_eq!(ev["grace_ms"], grace.as_millis() as u64, "{ev}");
}

#[test]
fn sbx_cgroup_kills_a_command_that_ignores_sigterm_after_kill_after() {
    if !sbx_testutil::is_root() {
        sbx_testutil::skip!("sbx-cgroup needs a cgroup: root");
    }
    let d = sbx_testutil::shared_tempdir();
    let mut c = tool("sbx-cgroup");
    c.args(["--kill-after", "1s", "--audit-log"])
        .arg(log_in(d.path()))
        .args(["--", "sh", "-c", TERM_PROOF]);
    let (code, took, err) = term_and_time(c);
    assert_escalated(
        code,
        took,
        &err,
        Duration::from_secs(1),
        &log_in(d.path()),
        "sbx-cgroup",
    );
}

/// The documented default: 10 s.
#[test]
fn the_default_grace_is_ten_seconds() {
    for who in identities() {
        let d = sbx_testutil::shared_tempdir();
        let mut c = tool("sbx-fs");
        run_as(&mut c, who);
        c.arg("--audit-log")
            .arg(log_in(d.path()))
            .args(["--", "sh", "-c", TERM_PROOF]);
        let (code, took, err) = term_and_time(c);
        assert_escalated(
            code,
            took,
            &err,
            Duration::from_secs(10),
            &log_in(d.path()),
            "sbx-fs",
        );
    }
}

/// sbx-fs (its own PID-namespace supervisor) and sbx-gitguard (the shared
/// Supervisor) take the grace from SBX_KILL_AFTER; root and user.
#[test]
fn sbx_fs_and_sbx_gitguard_escalate_too() {
    for who in identities() {
        let d = sbx_testutil::shared_tempdir();
        let mut c = tool("sbx-fs");
        run_as(&mut c, who);
        c.env("SBX_KILL_AFTER", "1500ms")
            .arg("--audit-log")
            .arg(log_in(d.path()))
            .args(["--", "sh", "-c", TERM_PROOF]);
        let (code, took, err) = term_and_time(c);
        assert_escalated(
            code,
            took,
            &err,
            Duration::from_millis(1500),
            &log_in(d.path()),
            "sbx-fs",
        );

        let repo = d.path().join("repo");
        std::fs::create_dir(&repo).unwrap();
        let ok = Command::new("git")
            .args(["init", "-q"])
            .arg(&repo)
            .status()
            .unwrap();
        assert!(ok.success());
        common::chown_r(d.path());
        let log = d.path().join("gg.jsonl");
        let mut c = tool("sbx-gitguard");
        run_as(&mut c, who);
        c.env("SBX_KILL_AFTER", "1s")
            .args(["--audit-log"])
            .arg(&log)
            .args(["run", "--repo"])
            .arg(&repo)
            .args(["--", "sh", "-c", TERM_PROOF]);
        let (code, took, err) = term_and_time(c);
        assert_escalated(
            code,
            took,
            &err,
            Duration::from_secs(1),
            &log,
            "sbx-gitguard",
        );
    }
}

#[test]
fn kill_after_bad_value_is_one_line_125() {
    let out = tool("sbx-cgroup")
        .args(["--kill-after", "soon", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    let e = stderr(&out);
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert!(e.contains("--kill-after"), "{e}");
    let _ = As::Root;
}

/// Processes of the test user (all of them, to see that nothing is left).
fn user_procs(uid: u32) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| {
            std::fs::read_to_string(e.path().join("status")).is_ok_and(|s| {
                s.lines().any(|l| {
                    l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some(&uid.to_string())
                })
            })
        })
        .count()
}

/// Processes whose command line holds `marker`.
fn procs_named(marker: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
        })
        .count()
}

/// sbx-cgroup as the unprivileged test user, without a delegated cgroup,
/// with an outer safety cap: RLIMIT_NPROC for the whole user at what it
/// has now + 400, so a failure of the inner bound cannot endanger the host.
fn unprivileged_cgroup(uid: u32, log: &Path) -> Command {
    let cap = user_procs(uid) as u64 + 400;
    let mut c = tool("sbx-cgroup");
    // SAFETY: setrlimit in the forked child before exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut c, move || {
            let r = libc::rlimit {
                rlim_cur: cap,
                rlim_max: cap,
            };
            libc::setrlimit(libc::RLIMIT_NPROC, &r);
            Ok(())
        });
    }
    run_as(&mut c, As::User);
    c.arg("--audit-log").arg(log);
    c
}

#[test]
fn without_root_timeout_rlimits_and_pids_still_bound_the_command() {
    let Some((uid, _)) = sbx_testutil::test_user() else {
        sbx_testutil::skip!("test user missing");
    };
    if !sbx_testutil::is_root() {
        sbx_testutil::skip!("needs root to switch to the test user");
    }
    let d = sbx_testutil::shared_tempdir();
    let log = d.path().join("a.jsonl");

    // A fork bomb: held by --pids (RLIMIT_NPROC in its own user namespace),
    // ended by --timeout; nothing left after.
    // Every process of the bomb carries this name as its $0 (other tests
    // run as the test user at the same time: count only ours).
    let marker = sbx_testutil::unique("sbx-bomb");
    let t0 = Instant::now();
    let out = unprivileged_cgroup(uid, &log)
        .args(["--pids", "40", "--timeout", "4s", "--"])
        // Every process forks until the cap and keeps trying: the bomb
        // neither burns out by itself (a shell's `b | b &` can, when every
        // fork fails at once) nor stops at the first failed fork (a
        // shell exits 2 on one).
        .args([
            common::PY,
            "-c",
            "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.05)",
        ])
        .arg(&marker)
        .output()
        .unwrap();
    assert_eq!(code(&out), 124, "{}", stderr(&out));
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    let ev = assert_event(&log, "cgroup_summary", "alert", |e| e["timed_out"] == true);
    assert_eq!(ev["mode"], "none", "{ev}");
    assert!(ev["processes_killed"].as_u64() >= Some(1), "{ev}");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(procs_named(&marker), 0, "processes of the bomb left");

    // The bound itself: of 200 background processes at most 40 start,
    // whatever else the user runs (per-userns accounting).
    let out = unprivileged_cgroup(uid, &log)
        .args(["--pids", "40", "--timeout", "30s", "--"])
        .args([
            common::PY,
            "-c",
            "import os, time\nn = 0\nfor i in range(200):\n    try:\n        pid = os.fork()\n    except OSError:\n        break\n    if pid == 0:\n        time.sleep(5)\n        os._exit(0)\n    n += 1\nprint(n, flush=True)\nos._exit(0)",
        ])
        .output()
        .unwrap();
    let started: usize = sbx_testutil::stdout(&out)
        .trim()
        .parse()
        .unwrap_or(usize::MAX);
    assert!(
        (5..40).contains(&started),
        "{started} started; {}",
        stderr(&out)
    );

    // A memory bomb: --rlimit data caps each process.
    let out = unprivileged_cgroup(uid, &log)
        .args(["--rlimit", "data=64M", "--"])
        .args([common::PY, "-c", "bytearray(512 << 20)"])
        .output()
        .unwrap();
    assert_ne!(code(&out), 0);
    assert!(stderr(&out).contains("MemoryError"), "{}", stderr(&out));

    // Limits that need a cgroup are still refused, one line.
    let out = unprivileged_cgroup(uid, &log)
        .args(["--memory", "64M", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 125);
    assert!(stderr(&out).contains("not delegated"), "{}", stderr(&out));
}

/// `sbx-policy explain` and `chain` say exactly which limits apply in this
/// run, and `chain --cgroup` passes sbx-cgroup only those: as root, every
/// cgroup limit (memory, pids, CPUs) applies; as the test user (no cgroup
/// delegation here, no systemd user manager: XDG_RUNTIME_DIR unset), the
/// total memory and CPU limits are NOT APPLIED (said so, and --memory /
/// --cpus are not passed, so the run starts instead of failing), memory is
/// bounded per process (RLIMIT_DATA) and processes by RLIMIT_NPROC in the
/// command's own user namespace; the run shows those rlimits in force.
#[test]
fn policy_explain_and_chain_say_which_limits_apply() {
    let d = sbx_testutil::shared_tempdir();
    let dir = d.path().canonicalize().unwrap();
    let bin = sbx_testutil::bin("sbx-policy");
    let bindir = bin.parent().unwrap().to_path_buf();
    for who in identities() {
        if who == As::User {
            common::chown_r(&dir);
        }
        let policy = |args: &[&str]| {
            let mut c = Command::new(&bin);
            c.args(args)
                .current_dir(&dir)
                .env("PATH", format!("{}:{}", bindir.display(), common::PATH))
                .env("HOME", &dir)
                .env_remove("XDG_RUNTIME_DIR")
                .env_remove("SBX_KILL_AFTER")
                .env_remove("SBX_AUDIT_LOG")
                .stdin(Stdio::null());
            run_as(&mut c, who);
            c.output().unwrap()
        };
        let out = policy(&["explain", "--memory", "3G", "--pids", "77"]);
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        let ex = String::from_utf8_lossy(&out.stdout).to_string();
        let row = |name: &str| -> String {
            ex.lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_else(|| panic!("{who:?}: no row {name}: {ex}"))
                .to_string()
        };
        assert!(row("wall clock").contains("applies"), "{ex}");
        assert!(row("kill-after").contains("10s") && row("kill-after").contains("applies"));
        assert!(row("largest file").contains("applies"), "{ex}");
        let out = policy(&[
            "chain", "--print", "--cgroup", "--memory", "3G", "--pids", "77", "--", "true",
        ]);
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        let pr = String::from_utf8_lossy(&out.stdout).to_string();
        let cg = pr
            .lines()
            .find(|l| !l.starts_with('#') && l.contains("sbx-cgroup "))
            .unwrap_or_else(|| panic!("{who:?}: no sbx-cgroup layer: {pr}"))
            .to_string();
        match who {
            As::Root => {
                assert!(ex.contains("root: cgroups"), "{ex}");
                for r in ["memory ", "processes+threads", "CPUs"] {
                    assert!(
                        row(r).contains("applies") && row(r).contains("cgroup"),
                        "{ex}"
                    );
                }
                assert!(!ex.contains("NOT APPLIED"), "{ex}");
                assert!(
                    cg.contains("--memory 3G") && cg.contains("--pids 77") && cg.contains("--cpus"),
                    "{cg}"
                );
                assert!(pr.contains("NOT applied: none"), "{pr}");
            }
            As::User => {
                assert!(ex.contains("no cgroup delegation"), "{ex}");
                assert!(ex.contains("no systemd user manager"), "{ex}");
                assert!(row("memory (total)").contains("NOT APPLIED"), "{ex}");
                assert!(row("CPUs").contains("NOT APPLIED"), "{ex}");
                assert!(row("memory (per process)").contains("RLIMIT_DATA"), "{ex}");
                assert!(row("processes+threads").contains("RLIMIT_NPROC"), "{ex}");
                assert!(
                    !cg.contains("--memory") && !cg.contains("--cpus"),
                    "flags that cannot apply: {cg}"
                );
                assert!(
                    cg.contains("--rlimit data=3G") && cg.contains("--pids 77"),
                    "{cg}"
                );
                assert!(pr.contains("# CPUs") && pr.contains("NOT applied"), "{pr}");
            }
        }
        // The run itself: the limits said to apply are in force.
        let out = policy(&[
            "chain",
            "--cgroup",
            "--memory",
            "3G",
            "--pids",
            "77",
            "--",
            "cat",
            "/proc/self/limits",
        ]);
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        let lim = String::from_utf8_lossy(&out.stdout).to_string();
        let line = |n: &str| {
            lim.lines()
                .find(|l| l.starts_with(n))
                .unwrap_or_else(|| panic!("{n}: {lim}"))
                .to_string()
        };
        assert!(line("Max file size").contains("8589934592"), "{lim}");
        if who == As::User {
            assert!(line("Max data size").contains("3221225472"), "{lim}");
            assert!(
                line("Max processes").split_whitespace().any(|w| w == "77"),
                "{lim}"
            );
        }
    }
}

/// The systemd user manager, through the binary: as the test user with
/// `XDG_RUNTIME_DIR` naming a directory whose `systemd/private` is a real
/// socket the test binds, `explain` finds the manager; on a pure cgroup v2
/// host `chain --print` then starts sbx-cgroup under `systemd-run --user
/// --scope -p Delegate=yes` with every cgroup limit, on a v1/hybrid host
/// (this one) it says why the scope is not used. Without the socket: "no
/// systemd user manager".
#[test]
fn policy_detects_a_systemd_user_manager_by_its_socket() {
    if !sbx_testutil::is_root() {
        sbx_testutil::skip!("needs root to run as the test user");
    }
    let d = sbx_testutil::shared_tempdir();
    let dir = d.path().canonicalize().unwrap();
    let rt = dir.join("run");
    std::fs::create_dir_all(rt.join("systemd")).unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(rt.join("systemd/private")).unwrap();
    common::chown_r(&dir);
    let bin = sbx_testutil::bin("sbx-policy");
    let bindir = bin.parent().unwrap().to_path_buf();
    let policy = |args: &[&str], xdg: Option<&Path>| {
        let mut c = Command::new(&bin);
        c.args(args)
            .current_dir(&dir)
            .env("PATH", format!("{}:{}", bindir.display(), common::PATH))
            .env("HOME", &dir)
            .env_remove("SBX_AUDIT_LOG")
            .stdin(Stdio::null());
        match xdg {
            Some(x) => c.env("XDG_RUNTIME_DIR", x),
            None => c.env_remove("XDG_RUNTIME_DIR"),
        };
        run_as(&mut c, As::User);
        c.output().unwrap()
    };
    let v2 = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.contains(" /sys/fs/cgroup ") && l.contains(" - cgroup2 "));
    let have_run = common::PATH
        .split(':')
        .any(|p| Path::new(p).join("systemd-run").is_file());
    let out = policy(&["explain"], Some(&rt));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let ex = String::from_utf8_lossy(&out.stdout).to_string();
    let out = policy(&["chain", "--print", "--", "true"], Some(&rt));
    // The layers only (the notes quote the delegation hint).
    let pr: String = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    if v2 && have_run {
        assert!(ex.contains("systemd user manager (systemd-run"), "{ex}");
        assert!(
            pr.contains("systemd-run --user --scope") && pr.contains("--memory"),
            "{pr}"
        );
    } else if have_run {
        assert!(
            ex.contains("a systemd user manager, but the host's cgroups are"),
            "{ex}"
        );
        assert!(!pr.contains("systemd-run --user"), "{pr}");
    } else {
        assert!(ex.contains("systemd-run is not on PATH"), "{ex}");
    }
    assert!(!ex.contains("no systemd user manager"), "{ex}");
    let out = policy(&["explain"], None);
    let ex = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        ex.contains("no systemd user manager: XDG_RUNTIME_DIR is not set"),
        "{ex}"
    );
    let out = policy(&["explain"], Some(&dir.join("nowhere")));
    let ex = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(ex.contains("no systemd user manager ("), "{ex}");
}
