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
