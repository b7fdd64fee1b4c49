//! Issue 16, debris: what a run creates is registered (sbx_core::registry,
//! liveness by flock) where a later run finds it whatever TMPDIR was, so a
//! run killed at the bad moment leaves nothing for good:
//! - sbx-fs killed between creating a placeholder under its temporary name
//!   (`.sbx-fs-new-*`, in the user's project) and renaming it;
//! - sbx-vm killed while its run directory exists (under its TMPDIR), and
//!   the empty `$TMPDIR/sbx-vm-UID` a finished run used to leave.
//!
//! Each test gives the tools its own registry (SBX_REGISTRY_DIR) so runs in
//! parallel do not reap each other's entries.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn eventually(mut f: impl FnMut() -> bool, secs: u64) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(secs) {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

fn temporaries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".sbx-fs-new-"))
        .map(|e| e.path())
        .collect()
}

#[test]
fn fs_placeholder_temporary_of_a_killed_run_is_reaped_by_the_next() {
    let d = tempfile::tempdir().unwrap();
    let base = d.path().canonicalize().unwrap();
    let proj = base.join("proj");
    write(&proj.join("a.txt"), "a\n");
    let registry = base.join("registry");
    std::fs::create_dir(&registry).unwrap();
    let fs = |tmpdir: &Path| {
        let t = base.join(tmpdir);
        std::fs::create_dir_all(&t).unwrap();
        let mut c = sbx_testutil::tool("sbx-fs");
        c.env("SBX_REGISTRY_DIR", &registry)
            .env("TMPDIR", &t)
            .arg("--rw")
            .arg(&proj)
            .arg("--chdir")
            .arg(&proj)
            .args(["--", "true"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        c
    };
    // Killed right after the temporary placeholder exists (no .git in the
    // project: sbx-fs makes a mount point for its invariants).
    let out = fs(Path::new("t1"))
        .env("SBX_TEST_KILL_AT", "fs-placeholder-tmp")
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{out:?}");
    let left = temporaries(&proj);
    assert!(!left.is_empty(), "the kill point left no temporary");
    // The next run, with another TMPDIR, reaps it.
    let out = fs(Path::new("t2")).output().unwrap();
    assert!(out.status.success(), "{}", sbx_testutil::stderr(&out));
    assert!(
        temporaries(&proj).is_empty(),
        "left: {:?}",
        temporaries(&proj)
    );
    assert!(
        eventually(|| !proj.join(".git").exists(), 10),
        "placeholders of the second run survived"
    );
    assert_eq!(
        // SAFETY: geteuid cannot fail.
        std::fs::read_dir(registry.join(unsafe { libc::geteuid() }.to_string()))
            .unwrap()
            .count(),
        0,
        "registry entries left"
    );
}

#[test]
fn vm_run_dir_of_a_killed_run_is_reaped_under_another_tmpdir() {
    if !sbx_testutil::have("qemu-system-x86_64") {
        sbx_testutil::skip!("qemu-system-x86_64 not installed (scripts/setup)");
    }
    let guest = std::env::var_os("SBX_VM_GUEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/local/share/sbx/guest"));
    if !guest.join("vmlinux").is_file() {
        sbx_testutil::skip!("guest not built (scripts/build-guest)");
    }
    let d = tempfile::tempdir().unwrap();
    let base = d.path().canonicalize().unwrap();
    let registry = base.join("registry");
    std::fs::create_dir(&registry).unwrap();
    let vm = |t: &str| {
        let t = base.join(t);
        std::fs::create_dir_all(&t).unwrap();
        let mut c = sbx_testutil::tool("sbx-vm");
        c.env("SBX_REGISTRY_DIR", &registry)
            .env("TMPDIR", &t)
            .env("SBX_VM_GUEST_DIR", &guest)
            .args(["--backend", "qemu", "--memory", "256M"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    };
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    let vm_base = |t: &str| base.join(t).join(format!("sbx-vm-{uid}"));
    // Killed while its run directory exists.
    let mut c = vm("t1");
    c.args(["--", "sleep", "600"]);
    let mut child = c.spawn().unwrap();
    let has_run_dir = || std::fs::read_dir(vm_base("t1")).is_ok_and(|mut r| r.next().is_some());
    assert!(eventually(has_run_dir, 60), "no run directory appeared");
    // SAFETY: kill with integer arguments; the child is ours and not yet reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    assert!(has_run_dir(), "the killed run's directory should be there");
    // A run with another TMPDIR reaps it, and leaves no empty base behind.
    let st = {
        let mut c = vm("t2");
        c.args(["--", "true"]);
        c.status().unwrap()
    };
    assert!(st.success(), "{st:?}");
    assert!(
        !vm_base("t1").exists(),
        "the killed run's directory (and its base) survived"
    );
    assert!(
        !vm_base("t2").exists(),
        "a finished run left {}",
        vm_base("t2").display()
    );
    assert_eq!(
        // SAFETY: geteuid cannot fail.
        std::fs::read_dir(registry.join(unsafe { libc::geteuid() }.to_string()))
            .unwrap()
            .count(),
        0
    );
    // The killed run's VMM died with it (die-with-parent).
    assert!(
        eventually(
            || {
                let o = Command::new("pgrep")
                    .args(["-f", base.to_str().unwrap()])
                    .output()
                    .unwrap();
                o.stdout.is_empty()
            },
            10
        ),
        "processes of the killed run survived"
    );
}

/// sbx-gitguard SIGKILLed while its stage (in one TMPDIR) and its keep
/// directory (`.git/.sbx-gitguard-keep.PID`) exist: both are registered
/// (sbx_core::registry, liveness by the entry's flock), so the next run,
/// with another TMPDIR, reaps them (a `git_stage_reaped` warning names the
/// stage) and nothing is left in the registry. Root and the test user.
#[test]
fn gitguard_stage_and_keep_of_a_killed_run_are_reaped_under_another_tmpdir() {
    for who in sbx_testutil::identities() {
        let d = sbx_testutil::shared_tempdir();
        let base = d.path().canonicalize().unwrap();
        let proj = base.join("proj");
        let other = base.join("other");
        for p in [&proj, &other] {
            write(&p.join("a.txt"), "a\n");
            git(p, &["init", "-q", "-b", "main"]);
            git(p, &["add", "-A"]);
            git(p, &["commit", "-qm", "init"]);
        }
        let registry = base.join("registry");
        std::fs::create_dir(&registry).unwrap();
        for t in ["t1", "t2", "t3", "t4"] {
            std::fs::create_dir(base.join(t)).unwrap();
        }
        let audit = base.join("audit.log");
        if who == sbx_testutil::As::User {
            chown_r(&base);
        }
        let ggr = |repo: &Path, t: &str, cmd: &[&str]| {
            let mut c = sbx_testutil::tool("sbx-gitguard");
            c.env("SBX_REGISTRY_DIR", &registry)
                .env("TMPDIR", base.join(t))
                .env("SBX_AUDIT_LOG", &audit)
                .env("PATH", PATH)
                .arg("run")
                .arg("--repo")
                .arg(repo)
                .arg("--stage")
                .arg(base.join(t).join(format!("sbx-git-stage-{t}")))
                .arg("--")
                .args(cmd)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            sbx_testutil::run_as(&mut c, who);
            c
        };
        let gg = |t: &str, cmd: &[&str]| ggr(&proj, t, cmd);
        let keeps = || -> Vec<PathBuf> {
            std::fs::read_dir(proj.join(".git"))
                .unwrap()
                .flatten()
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with(".sbx-gitguard-keep.")
                })
                .map(|e| e.path())
                .collect()
        };
        let stage1 = base.join("t1/sbx-git-stage-t1");
        let mut child = gg("t1", &["sleep", "60"]).spawn().unwrap();
        // A staged run keeps no object links (the stage covers the whole
        // .git: issue 19), so only the stage is there to reap.
        assert!(
            eventually(|| stage1.exists(), 30),
            "{who:?}: no stage appeared"
        );
        // SAFETY: the test's own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        child.wait().unwrap();
        assert!(stage1.exists());
        // A killed run of another repository: its stage stays importable
        // by hand until that repository's next staged run.
        let stage3 = base.join("t3/sbx-git-stage-t3");
        let mut child = ggr(&other, "t3", &["sleep", "60"]).spawn().unwrap();
        assert!(eventually(|| stage3.exists(), 30), "{who:?}: no stage");
        // SAFETY: the test's own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        child.wait().unwrap();
        let out = gg("t2", &["true"]).output().unwrap();
        assert!(
            out.status.success(),
            "{who:?}: {}",
            sbx_testutil::stderr(&out)
        );
        assert!(!stage1.exists(), "{who:?}: the killed run's stage survived");
        assert!(keeps().is_empty(), "{who:?}: keep dirs left: {:?}", keeps());
        assert!(
            stage3.exists(),
            "{who:?}: another repository's stage was reaped"
        );
        let out = ggr(&other, "t4", &["true"]).output().unwrap();
        assert!(out.status.success(), "{}", sbx_testutil::stderr(&out));
        assert!(
            !stage3.exists(),
            "{who:?}: its own repository's run kept it"
        );
        // Without a stage the run keeps links to the objects: a killed
        // run's keep dir is reaped by the repository's next run.
        let unstaged = |cmd: &[&str]| {
            let mut c = sbx_testutil::tool("sbx-gitguard");
            c.env("SBX_REGISTRY_DIR", &registry)
                .env("TMPDIR", base.join("t2"))
                .env("SBX_AUDIT_LOG", &audit)
                .env("PATH", PATH)
                .args(["run", "--repo"])
                .arg(&proj)
                .arg("--")
                .args(cmd)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            sbx_testutil::run_as(&mut c, who);
            c
        };
        let mut child = unstaged(&["sleep", "60"]).spawn().unwrap();
        assert!(
            eventually(|| !keeps().is_empty(), 30),
            "{who:?}: no keep dir appeared"
        );
        // SAFETY: the test's own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        child.wait().unwrap();
        let out = unstaged(&["true"]).output().unwrap();
        assert!(out.status.success(), "{}", sbx_testutil::stderr(&out));
        assert!(keeps().is_empty(), "{who:?}: keep dirs left: {:?}", keeps());
        for t in ["t1", "t2", "t3", "t4"] {
            let left: Vec<_> = std::fs::read_dir(base.join(t)).unwrap().flatten().collect();
            assert!(left.is_empty(), "{who:?}: {t}: {left:?}");
        }
        // (sbx-gitguard's verified-objects caches stay by design.)
        let uid_dirs: Vec<_> = std::fs::read_dir(&registry).unwrap().flatten().collect();
        for u in uid_dirs {
            let left: Vec<_> = std::fs::read_dir(u.path())
                .unwrap()
                .flatten()
                .filter(|e| {
                    !e.file_name()
                        .to_string_lossy()
                        .starts_with("gitguard-loose-")
                })
                .collect();
            assert!(left.is_empty(), "{who:?}: registry entries left: {left:?}");
        }
        let log = std::fs::read_to_string(&audit).unwrap_or_default();
        assert!(
            log.lines().any(|l| l.contains("\"git_stage_reaped\"")
                && l.contains(stage1.to_str().unwrap())),
            "{who:?}: no git_stage_reaped event for {}: {log}",
            stage1.display()
        );
        // The sleep died with its sbx-gitguard.
        assert!(
            eventually(
                || {
                    let o = Command::new("pgrep")
                        .args(["-f", "sleep 60"])
                        .output()
                        .unwrap();
                    String::from_utf8_lossy(&o.stdout)
                        .split_whitespace()
                        .all(|p| {
                            std::fs::read_to_string(format!("/proc/{p}/environ"))
                                .map(|e| !e.contains(base.to_str().unwrap()))
                                .unwrap_or(true)
                        })
                },
                10
            ),
            "{who:?}: the killed run's command survived"
        );
    }
}
