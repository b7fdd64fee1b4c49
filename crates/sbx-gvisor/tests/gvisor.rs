//! sbx-gvisor on its own (sbx-policy's chain runs it too: tests/policy_gvisor.rs):
//! bad input is one line and 125 with nothing made; a command runs on
//! gVisor's kernel with the grants (a read-only grant, a hidden file and a
//! denied `.env` refuse it; the wall clock and the execute allowlist are
//! alerts); a SIGKILL of sbx-gvisor leaves nothing behind (the guardian).
//! As root and as the unprivileged test user (runsc --rootless).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sbx_testutil::{
    As, assert_event, assert_usage_error, audit_events, code, identities, run_as, stderr, stdout,
};

const PATH: &str = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin";

fn runsc() -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")])
        .map(|d| d.join("runsc"))
        .find(|p| p.is_file())
}

struct Project {
    _d: tempfile::TempDir,
    root: PathBuf,
    log: PathBuf,
}

fn write(p: &Path, text: &str) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

fn chown_r(p: &Path) {
    sbx_testutil::chown_to_test_user(p);
    if p.is_dir() && !p.is_symlink() {
        for e in std::fs::read_dir(p).unwrap().flatten() {
            chown_r(&e.path());
        }
    }
}

/// A project with a writable `src`, a read-only `docs`, a hidden file and
/// a `.env` (sbx-fs's default deny list).
fn project(who: As) -> Project {
    let d = sbx_testutil::shared_tempdir();
    let base = d.path().canonicalize().unwrap();
    let root = base.join("proj");
    write(&root.join("src/a.txt"), "a\n");
    write(&root.join("docs/readme.txt"), "docs\n");
    write(&root.join("secret.txt"), "top-secret-gv18\n");
    write(&root.join(".env"), "API_KEY=sk-live-gv18\n");
    if who == As::User {
        chown_r(&base);
    }
    Project {
        _d: d,
        log: base.join("audit.jsonl"),
        root,
    }
}

/// `sbx-gvisor` with the project's grants, then EXTRA, then `-- ARGV`.
fn gvisor(p: &Project, runsc: &Path, extra: &[&str], argv: &[&str], who: As) -> Command {
    let mut c = sbx_testutil::tool("sbx-gvisor");
    c.arg("--audit-log").arg(&p.log);
    c.arg("--runsc").arg(runsc);
    c.arg("--rw").arg(&p.root);
    c.arg("--ro").arg(p.root.join("docs"));
    c.arg("--deny").arg(p.root.join("secret.txt"));
    c.arg("--chdir").arg(&p.root);
    c.args(["--tmp-size", "32M", "--pids", "256", "--memory", "1G"]);
    c.args(extra).arg("--").args(argv);
    c.current_dir(&p.root).env("PATH", PATH);
    run_as(&mut c, who);
    c
}

fn marker(out: &str, key: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in:\n{out}"))
        .to_string()
}

/// Processes whose command line mentions `needle` (runsc's name the
/// private directory in their --root and --bundle).
fn procs_with(needle: &str) -> Vec<String> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            let c = String::from_utf8_lossy(&c).replace('\0', " ");
            if c.contains(needle) {
                v.push(format!("{name}: {c}"));
            }
        }
    }
    v
}

/// The private directory of the run (its gvisor_start event).
fn private_dir(log: &Path) -> PathBuf {
    let evs = audit_events(log);
    let e = evs
        .iter()
        .find(|e| e["event"] == "gvisor_start")
        .unwrap_or_else(|| panic!("no gvisor_start event: {evs:?}"));
    PathBuf::from(e["dir"].as_str().unwrap())
}

/// Nothing of the run is left (bounded wait for the guardian): no private
/// directory (runsc's state is in it), no runsc process of it, no sbx-fs
/// placeholder (`.claude` and `.git` did not exist) in the project.
fn assert_nothing_left(p: &Project, within: Duration) {
    let dir = private_dir(&p.log);
    let needle = dir.display().to_string();
    assert!(needle.contains("sbx-gvisor-"), "{needle}");
    let deadline = Instant::now() + within;
    loop {
        let exists = dir.exists();
        let procs = procs_with(&needle);
        if !exists && procs.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left behind: {needle} exists={exists}, processes {procs:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for name in [".claude", ".git"] {
        assert!(
            !p.root.join(name).exists(),
            "placeholder {name} left in the project"
        );
    }
}

#[test]
fn bad_input_is_one_line_125_and_nothing_is_made() {
    for who in identities() {
        let p = project(who);
        // Where a private directory would go: it must stay empty.
        let tmp = p.root.parent().unwrap().join("tmp");
        std::fs::create_dir(&tmp).unwrap();
        if who == As::User {
            chown_r(&tmp);
        }
        let cfg = p.root.parent().unwrap().join("bad.json");
        write(&cfg, r#"{"sbx-gvisor": {"no-such-key": 1}}"#);
        if who == As::User {
            chown_r(&cfg);
        }
        let missing = p.root.join("missing");
        let cases: Vec<(Vec<String>, &str)> = vec![
            (vec!["--bogus".into()], "--bogus"),
            (vec!["--rw".into(), "/tmp".into()], "--runsc"),
            (
                vec!["--runsc".into(), "/nonexistent/runsc".into()],
                "--runsc /nonexistent/runsc",
            ),
            (
                vec![
                    "--runsc".into(),
                    "/bin/true".into(),
                    "--tmp-size".into(),
                    "lots".into(),
                ],
                "--tmp-size lots",
            ),
            (
                vec![
                    "--runsc".into(),
                    "/bin/true".into(),
                    "--timeout".into(),
                    "soon".into(),
                ],
                "--timeout soon",
            ),
            (
                vec![
                    "--runsc".into(),
                    "/bin/true".into(),
                    "--pids".into(),
                    "many".into(),
                ],
                "--pids",
            ),
            (
                vec![
                    "--runsc".into(),
                    "/bin/true".into(),
                    "--rw".into(),
                    missing.display().to_string(),
                ],
                "missing",
            ),
            (
                vec![
                    "--runsc".into(),
                    "/bin/true".into(),
                    "--config".into(),
                    cfg.display().to_string(),
                ],
                "no-such-key",
            ),
        ];
        for (args, needle) in cases {
            let mut c = sbx_testutil::tool("sbx-gvisor");
            c.args(&args).args(["--", "true"]).env("TMPDIR", &tmp);
            run_as(&mut c, who);
            let out = sbx_testutil::output_within(&mut c, Duration::from_secs(30));
            assert_usage_error(&out, needle);
            assert!(
                stderr(&out).starts_with("sbx-gvisor: "),
                "{who:?} {args:?}: {}",
                stderr(&out)
            );
        }
        // No command at all: the usage says where it goes.
        let mut c = sbx_testutil::tool("sbx-gvisor");
        c.args(["--runsc", "/bin/true"]).env("TMPDIR", &tmp);
        run_as(&mut c, who);
        let out = sbx_testutil::output_within(&mut c, Duration::from_secs(30));
        assert_usage_error(&out, "CMD");
        assert_eq!(
            std::fs::read_dir(&tmp).unwrap().count(),
            0,
            "{who:?}: bad input left something in TMPDIR"
        );
    }
}

#[test]
fn runs_true_and_refuses_what_the_grants_refuse() {
    let Some(runsc) = runsc() else {
        sbx_testutil::skip!("runsc not installed (scripts/setup installs Debian's runsc)");
    };
    for who in identities() {
        let p = project(who);
        // `true`: 0, on gVisor's kernel, cleaned up.
        let out = sbx_testutil::output_within(
            &mut gvisor(&p, &runsc, &[], &["true"], who),
            Duration::from_secs(120),
        );
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert_event(&p.log, "gvisor_start", "info", |e| {
            e["tool"] == "sbx-gvisor"
                && e["platform"] == "ptrace"
                && e["network"] == "none"
                && e["rootless"] == (who == As::User)
        });
        assert_nothing_left(&p, Duration::from_secs(5));

        // Writes where the grants allow them only; the status passes through.
        std::fs::remove_file(&p.log).unwrap();
        let script = r#"
echo KERNEL=$(uname -r)
echo new > src/new.txt; echo RW=$?
echo x >> docs/readme.txt 2>/dev/null; echo RO=$?
cat secret.txt 2>/dev/null; echo DENY=$?
cat .env 2>/dev/null; echo DOTENV=$?
echo x > secret.txt 2>/dev/null; echo DENYWRITE=$?
exit 3
"#;
        let out = sbx_testutil::output_within(
            &mut gvisor(&p, &runsc, &[], &["sh", "-c", script], who),
            Duration::from_secs(120),
        );
        let so = stdout(&out);
        let ctx = format!("{who:?}\nstdout:\n{so}\nstderr:\n{}", stderr(&out));
        assert_eq!(code(&out), 3, "{ctx}");
        let host_release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        assert_ne!(marker(&so, "KERNEL"), host_release.trim(), "{ctx}");
        assert_eq!(marker(&so, "RW"), "0", "{ctx}");
        for k in ["RO", "DENY", "DOTENV", "DENYWRITE"] {
            assert_ne!(marker(&so, k), "0", "{k} must fail: {ctx}");
        }
        assert!(!so.contains("top-secret-gv18") && !so.contains("sk-live-gv18"));
        assert_eq!(
            std::fs::read_to_string(p.root.join("src/new.txt")).unwrap(),
            "new\n"
        );
        assert_eq!(
            std::fs::read_to_string(p.root.join("docs/readme.txt")).unwrap(),
            "docs\n"
        );
        assert_eq!(
            std::fs::read_to_string(p.root.join("secret.txt")).unwrap(),
            "top-secret-gv18\n"
        );
        assert_nothing_left(&p, Duration::from_secs(5));

        // The execute allowlist: sh may run, id may not (126 inside, an
        // exec_denied alert from runsc's exec trace).
        std::fs::remove_file(&p.log).unwrap();
        let sh = Path::new("/bin/sh").canonicalize().unwrap();
        let out = sbx_testutil::output_within(
            &mut gvisor(
                &p,
                &runsc,
                &["--allow-exec", sh.to_str().unwrap()],
                &["sh", "-c", "id; echo ID=$?"],
                who,
            ),
            Duration::from_secs(120),
        );
        let so = stdout(&out);
        let ctx = format!("{who:?}\nstdout:\n{so}\nstderr:\n{}", stderr(&out));
        assert_eq!(code(&out), 0, "{ctx}");
        assert_eq!(marker(&so, "ID"), "126", "{ctx}");
        assert_event(&p.log, "exec_denied", "alert", |e| {
            e["tool"] == "sbx-gvisor"
                && e["path"].as_str().unwrap_or("").ends_with("/id")
                && e["enforced_by"] == "gvisor noexec mounts"
        });
        assert_nothing_left(&p, Duration::from_secs(5));

        // The wall clock (no sbx-cgroup here): 124 and a timeout alert.
        std::fs::remove_file(&p.log).unwrap();
        let out = sbx_testutil::output_within(
            &mut gvisor(&p, &runsc, &["--timeout", "2s"], &["sleep", "60"], who),
            Duration::from_secs(120),
        );
        assert_eq!(code(&out), 124, "{who:?}: {}", stderr(&out));
        assert_event(&p.log, "timeout", "alert", |e| {
            e["tool"] == "sbx-gvisor" && e["timeout_ms"] == 2000
        });
        assert_nothing_left(&p, Duration::from_secs(5));
    }
}

#[test]
fn sigkill_of_sbx_gvisor_leaves_nothing_behind() {
    let Some(runsc) = runsc() else {
        sbx_testutil::skip!("runsc not installed (scripts/setup installs Debian's runsc)");
    };
    for who in identities() {
        let p = project(who);
        let mut c = gvisor(
            &p,
            &runsc,
            &[],
            &["sh", "-c", "echo READY; exec sleep 600"],
            who,
        );
        c.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = c.spawn().unwrap();
        // Bounded: a sandbox that never says READY is killed, not waited for.
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(out).lines();
            let _ = tx.send(lines.next().and_then(Result::ok));
            // Keep the pipe open (a closed one would end the sleep early).
            for _ in lines {}
        });
        let first = rx.recv_timeout(Duration::from_secs(120));
        if first.as_ref().ok().and_then(|l| l.as_deref()) != Some("READY") {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{who:?}: no READY line: {first:?}");
        }
        let dir = private_dir(&p.log);
        assert!(
            !procs_with(&dir.display().to_string()).is_empty(),
            "{who:?}: runsc is not running"
        );
        assert!(
            p.root.join(".claude").exists(),
            "the .claude placeholder is there while it runs"
        );
        // SIGKILL: none of sbx-gvisor's own clean-up code runs.
        child.kill().unwrap();
        child.wait().unwrap();
        assert_nothing_left(&p, Duration::from_secs(30));
        // The guardian says what it did (the log gets its line after the
        // directory is gone: bounded wait).
        let deadline = Instant::now() + Duration::from_secs(10);
        while !audit_events(&p.log)
            .iter()
            .any(|e| e["event"] == "supervisor_died")
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_event(&p.log, "supervisor_died", "warn", |e| {
            e["tool"] == "sbx-gvisor"
                && e["dir"] == dir.display().to_string()
                && e["removed"] == true
        });
    }
}

/// SIGKILLed right after its private directory is made, before anything
/// else (fault injection, `SBX_TEST_KILL_AT=gvisor-dir-made`): the
/// guardian, forked before the mkdir, removes the directory. The temp dir
/// is the test's own (traversable by others, as sbx-gvisor wants it).
#[test]
fn sigkill_right_after_the_private_directory_is_made_leaves_nothing() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::ExitStatusExt;
    let Some(runsc) = runsc() else {
        sbx_testutil::skip!("runsc not installed (scripts/setup installs Debian's runsc)");
    };
    for who in identities() {
        let p = project(who);
        let tmp = p.root.parent().unwrap().join("tmp");
        std::fs::create_dir(&tmp).unwrap();
        sbx_testutil::chown_to_test_user(&tmp);
        // Every ancestor traversable: sbx-gvisor uses it, not /tmp.
        for d in tmp.ancestors().take(3) {
            let m = std::fs::metadata(d).unwrap().permissions().mode();
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(m | 0o711)).unwrap();
        }
        let ours = || {
            std::fs::read_dir(&tmp)
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("sbx-gvisor-"))
                .collect::<Vec<_>>()
        };
        let mut c = gvisor(&p, &runsc, &[], &["true"], who);
        c.env("TMPDIR", &tmp)
            .env("SBX_TEST_KILL_AT", "gvisor-dir-made");
        let out = sbx_testutil::output_within(&mut c, Duration::from_secs(60));
        assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{who:?}: {out:?}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ours().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            ours().is_empty(),
            "{who:?}: left {:?} in {}",
            ours(),
            tmp.display()
        );
    }
}

/// Runs sbx-gvisor paused after its plan (SBX_TEST_GVISOR_PAUSE_FIFO: it
/// reads the FIFO to its end before starting runsc), does `swap` in that
/// window, lets it go on and returns its output (all bounded).
fn run_with_window(mut c: Command, fifo: &Path, swap: impl FnOnce()) -> std::process::Output {
    c.env("SBX_TEST_GVISOR_PAUSE_FIFO", fifo)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let pid = child.id() as i32;
    // The FIFO opens for writing once sbx-gvisor opened it to read: after
    // the plan.
    let c_fifo = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let fd = loop {
        // SAFETY: a valid C string; a non-blocking open.
        let fd = unsafe { libc::open(c_fifo.as_ptr(), libc::O_WRONLY | libc::O_NONBLOCK) };
        if fd >= 0 {
            break fd;
        }
        if Instant::now() > deadline || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("sbx-gvisor never paused: {}", stderr(&out));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    swap();
    // SAFETY: our fd, closed once: sbx-gvisor reads its end and goes on.
    unsafe { libc::close(fd) };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            // SAFETY: kills the child we started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("sbx-gvisor did not end");
        }
    }
}

/// A grant swapped for a symlink to a secret directory between sbx-fs's
/// plan (which opened and checked it) and runsc's start is refused: runsc's
/// mount namespace re-opens each source without symlinks and compares it
/// with the checked one (bind_source_changed, 125); the secret is never
/// shown. The same window without a swap runs.
#[test]
fn a_bind_source_swapped_after_the_plan_is_refused() {
    let Some(runsc) = runsc() else {
        sbx_testutil::skip!("runsc not installed (scripts/setup installs Debian's runsc)");
    };
    for who in identities() {
        let p = project(who);
        let base = p.root.parent().unwrap().to_path_buf();
        let grant = base.join("grant");
        write(&grant.join("s.txt"), "grant-ok-gv20\n");
        write(&base.join("secretdir/s.txt"), "swapped-secret-gv20\n");
        let fifo = base.join("pause.fifo");
        let st = Command::new("mkfifo")
            .args(["-m", "0666"])
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(st.success());
        if who == As::User {
            chown_r(&base);
        }
        let g = grant.to_str().unwrap().to_string();
        let argv = ["cat", &format!("{g}/s.txt")];
        let extra = ["--ro", g.as_str()];

        // The window, nothing swapped: the grant is shown.
        let out = run_with_window(gvisor(&p, &runsc, &extra, &argv, who), &fifo, || {});
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert_eq!(stdout(&out), "grant-ok-gv20\n");
        assert_nothing_left(&p, Duration::from_secs(5));

        // Swapped for a symlink to the secret directory: refused.
        std::fs::remove_file(&p.log).unwrap();
        let out = run_with_window(gvisor(&p, &runsc, &extra, &argv, who), &fifo, || {
            std::fs::rename(&grant, base.join("grant.old")).unwrap();
            std::os::unix::fs::symlink(base.join("secretdir"), &grant).unwrap();
        });
        let ctx = format!(
            "{who:?}\nstdout:\n{}\nstderr:\n{}",
            stdout(&out),
            stderr(&out)
        );
        assert_eq!(code(&out), 125, "{ctx}");
        assert!(!stdout(&out).contains("swapped-secret-gv20"), "{ctx}");
        assert!(!stderr(&out).contains("swapped-secret-gv20"), "{ctx}");
        assert!(
            stderr(&out).contains(&format!("bind source {g} changed")),
            "{ctx}"
        );
        assert_event(&p.log, "bind_source_changed", "alert", |e| {
            e["tool"] == "sbx-gvisor" && e["path"] == g.as_str()
        });
        assert_nothing_left(&p, Duration::from_secs(5));
        std::fs::remove_file(&grant).unwrap();
        std::fs::rename(base.join("grant.old"), &grant).unwrap();
    }
}
