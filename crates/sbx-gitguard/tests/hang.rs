//! Never hang, always stoppable (issue 14): FIFOs and devices where git
//! keeps files, a truncated loose object (libgit2 issue 7342 loops forever
//! on one), a signal during a long check, files of gigabytes (sparse, never
//! allocated) in hooks/, info/ and config. Every run is bounded in time
//! (`guard_within` kills the tool and fails the test).

mod common;

use std::time::{Duration, Instant};

use common::Fixture;
use sbx_testutil::{As, assert_event, assert_usage_error, code, identities, stderr, stdout};

fn user_first() -> As {
    *identities().last().unwrap()
}

const T: u64 = 60;

fn snap(f: &Fixture) -> String {
    let s = f.dir.join("snap.json").to_str().unwrap().to_string();
    let out = f.guard_within(T, &["snapshot", "--repo", f.w.to_str().unwrap(), "-o", &s]);
    assert_eq!(code(&out), 0, "snapshot: {}", stderr(&out));
    s
}

fn w(f: &Fixture) -> &str {
    f.w.to_str().unwrap()
}

#[test]
fn a_fifo_as_packed_refs_under_run_is_removed_and_restored() {
    for who in identities() {
        let f = Fixture::new(who);
        let before = f.state();
        let out = f.run_within(T, &[], "rm .git/packed-refs && mkfifo .git/packed-refs");
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(f.w.join(".git/packed-refs").is_file());
        assert_eq!(f.state(), before);
        f.assert_fsck_clean();
        assert_event(&f.audit, "git_integrity", "alert", |e| {
            e["found"].as_str().unwrap_or("").contains("a FIFO planted")
                && e["path"].as_str().unwrap_or("").ends_with("packed-refs")
        });
    }
}

#[test]
fn fifos_as_a_loose_ref_head_and_config_between_turns_are_repaired() {
    for who in identities() {
        let f = Fixture::new(who);
        let s = snap(&f);
        let before = f.state();
        let o = f.sh(
            &f.w,
            "rm .git/refs/heads/main && mkfifo .git/refs/heads/main && rm .git/config && mkfifo .git/config && mkfifo .git/info/fifo && mkfifo .git/hooks/pre-commit && mkfifo .git/modules/sub/fifo2",
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let out = f.guard_within(T, &["check", "--repo", w(&f), "--against", &s]);
        assert_eq!(code(&out), 1, "{}{}", stdout(&out), stderr(&out));
        assert!(stdout(&out).contains("a FIFO planted"), "{}", stdout(&out));
        // The submodule's git dir is walked with its superproject and on
        // its own: reported once.
        assert_eq!(
            stdout(&out)
                .lines()
                .filter(|l| l.contains("a FIFO") && l.contains("fifo2"))
                .count(),
            1,
            "{}",
            stdout(&out)
        );
        // check changed nothing.
        assert!(!f.w.join(".git/config").is_file());
        let out = f.guard_within(T, &["repair", "--repo", w(&f), "--against", &s]);
        assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
        for p in ["config", "refs/heads/main"] {
            assert!(f.w.join(".git").join(p).is_file(), "{p}");
        }
        assert!(!f.w.join(".git/info/fifo").exists());
        assert!(std::fs::symlink_metadata(f.w.join(".git/modules/sub/fifo2")).is_err());
        assert!(!f.w.join(".git/hooks/pre-commit").exists());
        assert_eq!(f.state(), before);
        f.assert_fsck_clean();
        assert_event(&f.audit, "git_integrity", "alert", |e| {
            e["path"]
                .as_str()
                .unwrap_or("")
                .ends_with("refs/heads/main")
                && e["action"] == "removed"
        });
    }
}

#[test]
fn a_fifo_in_the_git_dir_before_the_snapshot_is_refused_and_nothing_changes() {
    let f = Fixture::new(user_first());
    let o = f.sh(&f.w, "mkfifo .git/logs/refs/heads/fifo");
    assert!(o.status.success());
    let out = f.guard_within(
        T,
        &[
            "snapshot",
            "--repo",
            w(&f),
            "-o",
            f.dir.join("s.json").to_str().unwrap(),
        ],
    );
    assert_usage_error(&out, "a FIFO");
    assert!(!f.dir.join("s.json").exists());
    // Not removed: a refusal changes nothing.
    assert!(std::fs::symlink_metadata(f.w.join(".git/logs/refs/heads/fifo")).is_ok());
    let out = f.run_within(T, &[], "touch ran");
    assert_eq!(code(&out), 125);
    assert!(!f.w.join("ran").exists(), "the command ran");
    assert_event(&f.audit, "git_damaged_before", "alert", |e| {
        e["found"].as_str().unwrap_or("").contains("a FIFO")
    });
}

#[test]
fn against_a_fifo_dev_zero_a_directory_or_a_huge_file_is_one_line_not_a_hang() {
    let f = Fixture::new(user_first());
    let fifo = f.dir.join("snap.fifo");
    let huge = f.dir.join("snap.huge");
    let o = f.sh(
        &f.dir,
        &format!(
            "mkfifo {} && truncate -s 2G {}",
            fifo.display(),
            huge.display()
        ),
    );
    assert!(o.status.success());
    let dir = f.dir.to_str().unwrap();
    for (against, why) in [
        (fifo.to_str().unwrap(), "not a regular file (a FIFO)"),
        ("/dev/zero", "not a regular file (a character device)"),
        (dir, "not a regular file (a directory)"),
        (huge.to_str().unwrap(), "larger than the cap"),
    ] {
        for cmd in ["check", "repair"] {
            let t0 = Instant::now();
            // sbx-core's bounded reader of files named on the command line.
            let out = f.guard_within(T, &[cmd, "--repo", w(&f), "--against", against]);
            assert_usage_error(&out, why);
            assert!(stderr(&out).contains(against), "{}", stderr(&out));
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "{cmd} --against {against} took {:?}",
                t0.elapsed()
            );
        }
    }
    // Nothing was repaired from them: the repository is as it was.
    f.assert_fsck_clean();
}

/// The newest commit on main (a loose object in the fixture) as a path.
fn loose_tip(f: &Fixture) -> (String, std::path::PathBuf) {
    let id = f.git_ok(&f.w, &["rev-parse", "main"]).trim().to_string();
    let p = f.w.join(".git/objects").join(&id[..2]).join(&id[2..]);
    assert!(p.is_file(), "the tip is not loose: {}", p.display());
    (id, p)
}

#[test]
fn a_truncated_loose_object_is_reported_not_a_hang() {
    for who in identities() {
        let f = Fixture::new(who);
        let s = snap(&f);
        let (id, p) = loose_tip(&f);
        let len = std::fs::metadata(&p).unwrap().len();
        // A new file (objects are read-only): what a disk error or an agent
        // leaves.
        let o = f.sh(
            &f.w,
            &format!(
                "head -c {} {p} > t && chmod 444 t && mv -f t {p}",
                len / 2,
                p = p.display()
            ),
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        for full in [false, true] {
            let mut args = vec!["check", "--repo", w(&f), "--against", &s];
            if full {
                args.push("--full");
            }
            let out = f.guard_within(T, &args);
            assert_eq!(code(&out), 1, "{}{}", stdout(&out), stderr(&out));
            assert!(stdout(&out).contains(&id), "{}", stdout(&out));
            assert!(stdout(&out).contains("truncated"), "{}", stdout(&out));
        }
        // Standalone check (no snapshot) too.
        let out = f.guard_within(T, &["check", "--repo", w(&f), "--full"]);
        assert_eq!(code(&out), 1, "{}", stdout(&out));
        assert!(stdout(&out).contains("truncated"), "{}", stdout(&out));
        // Between turns the object cannot be brought back: refused, named.
        let out = f.guard_within(T, &["repair", "--repo", w(&f), "--against", &s]);
        assert_eq!(code(&out), 125, "{}", stdout(&out));
        assert!(stderr(&out).contains(&id), "{}", stderr(&out));
        assert_event(&f.audit, "git_integrity", "alert", |e| {
            e["found"].as_str().unwrap_or("").contains("truncated")
        });
    }
}

#[test]
fn a_truncated_loose_object_under_run_is_linked_back() {
    let f = Fixture::new(user_first());
    let before = f.state();
    let (id, p) = loose_tip(&f);
    let out = f.run_within(
        T,
        &[],
        &format!(
            "head -c 20 {p} > t && chmod 444 t && mv -f t {p}",
            p = p.display()
        ),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(f.state(), before);
    f.assert_fsck_clean();
    assert_event(&f.audit, "git_integrity", "alert", |e| {
        e["found"].as_str().unwrap_or("").contains(&id)
            && e["action"].as_str().unwrap_or("").starts_with("restored")
    });
}

#[test]
fn sigint_and_sigterm_stop_a_long_check_promptly() {
    let f = Fixture::new(user_first());
    // A loose blob of 768 MiB of zeros (under 1 MiB on disk): reading it
    // in full takes seconds.
    let o = f.sh(
        &f.w,
        "head -c 805306368 /dev/zero > big && git add big && git commit -qm big && rm big && git rm -q --cached big 2>/dev/null; true",
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for sig in [libc::SIGINT, libc::SIGTERM] {
        let mut c = f.guard_cmd(&["check", "--repo", w(&f), "--full"]);
        c.stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let mut child = c.spawn().unwrap();
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            child.try_wait().unwrap().is_none(),
            "the check ended before the signal: the test proves nothing"
        );
        let t0 = Instant::now();
        // SAFETY: kill(2) of the child this test started.
        unsafe { libc::kill(child.id() as i32, sig) };
        let st = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if t0.elapsed() > Duration::from_secs(5) {
                let _ = child.kill();
                let _ = child.wait();
                panic!("signal {sig} did not stop check --full within 5s");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(st.signal(), Some(sig), "{st:?}");
    }
}

#[test]
fn files_of_gigabytes_in_hooks_and_info_are_never_read_whole() {
    for who in identities() {
        let f = Fixture::new(who);
        // 2 GiB sparse files before the snapshot: kept by identity.
        let o = f.sh(
            &f.w,
            "truncate -s 2G .git/hooks/big-before && truncate -s 2G .git/info/big-before",
        );
        assert!(o.status.success());
        let before = f.state();
        // The command plants new ones and changes the old ones.
        let out = f.run_within(
            T,
            &[],
            "truncate -s 2G .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit && truncate -s 2G .git/info/attributes && echo x >> .git/hooks/big-before",
        );
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(!f.w.join(".git/hooks/pre-commit").exists());
        assert!(!f.w.join(".git/info/attributes").exists());
        // Changed and too large to have been kept: removed, alerted.
        assert!(!f.w.join(".git/hooks/big-before").exists());
        assert!(f.w.join(".git/info/big-before").exists());
        assert_eq!(f.state(), before);
        f.assert_fsck_clean();
        assert_event(&f.audit, "git_integrity", "alert", |e| {
            e["path"]
                .as_str()
                .unwrap_or("")
                .ends_with("hooks/big-before")
                && e["action"].as_str().unwrap_or("").contains("too large")
        });
        assert_event(&f.audit, "git_integrity", "alert", |e| {
            e["path"]
                .as_str()
                .unwrap_or("")
                .ends_with("hooks/pre-commit")
                && e["action"] == "removed"
        });
    }
}

#[test]
fn a_config_of_gigabytes_with_a_planted_fsmonitor_is_reverted() {
    for who in identities() {
        let f = Fixture::new(who);
        let s = snap(&f);
        let before = f.state();
        let cfg_before = std::fs::read(f.w.join(".git/config")).unwrap();
        let o = f.sh(
            &f.w,
            "truncate -s 1500M .git/config && printf '\\n[core]\\n\\tfsmonitor = \"touch $MARK; false\"\\n' >> .git/config",
        );
        assert!(o.status.success());
        let out = f.guard_within(T, &["repair", "--repo", w(&f), "--against", &s]);
        assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
        assert_eq!(std::fs::read(f.w.join(".git/config")).unwrap(), cfg_before);
        assert_eq!(f.state(), before);
        f.assert_nothing_runs();
        f.assert_fsck_clean();
        let e = assert_event(&f.audit, "git_integrity", "alert", |e| {
            e["check"] == "config"
        });
        assert!(e.to_string().contains("too large to parse"), "{e}");
        // Under run too.
        let out = f.run_within(
            T,
            &[],
            "truncate -s 1G .git/config && printf '\\n[core]\\n\\tfsmonitor = \"touch $MARK; false\"\\n' >> .git/config",
        );
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert_eq!(std::fs::read(f.w.join(".git/config")).unwrap(), cfg_before);
        f.assert_nothing_runs();
    }
}

/// The documented chain: `sbx-gitguard run -- sbx-fs --rw ... -- CMD`; the
/// FIFO is made inside sbx-fs (packed-refs is writable there), gitguard
/// outside still never waits on it.
#[test]
fn a_fifo_as_packed_refs_in_the_chain_with_sbx_fs_is_no_hang() {
    let fs_bin = sbx_testutil::bin("sbx-gitguard").with_file_name("sbx-fs");
    if !fs_bin.exists() {
        if sbx_testutil::must_work() {
            panic!("sbx-fs is not built ({})", fs_bin.display());
        }
        eprintln!("skipped: sbx-fs is not built ({})", fs_bin.display());
        return;
    }
    for who in identities() {
        let f = Fixture::new(who);
        let before = f.state();
        // The work tree only: sbx-fs refuses an audit log (beside it)
        // inside a writable bind.
        let out = f.guard_within(
            T,
            &[
                "run",
                "--repo",
                w(&f),
                "--",
                fs_bin.to_str().unwrap(),
                "--rw",
                w(&f),
                "--chdir",
                w(&f),
                "--",
                "sh",
                "-c",
                "rm -f .git/packed-refs; mkfifo .git/packed-refs; mkfifo .git/config; exit 3",
            ],
        );
        assert_eq!(code(&out), 3, "{}", stderr(&out));
        assert!(f.w.join(".git/packed-refs").is_file());
        assert_eq!(f.state(), before);
        f.assert_fsck_clean();
        // The FIFO was made (the test proves something) and removed.
        assert_event(&f.audit, "git_integrity", "alert", |e| {
            e["found"].as_str().unwrap_or("").contains("a FIFO planted")
                && e["path"].as_str().unwrap_or("").ends_with("packed-refs")
        });
    }
}
