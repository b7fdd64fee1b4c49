//! The import is a transaction: sbx-gitguard SIGKILLed at every step of an
//! import (SBX_GITGUARD_CRASH_AT=N) leaves a repository that the next start
//! (`run`) or `sbx-gitguard import` of the stage brings to "untouched" or
//! "fully imported", never in between: refs, HEAD and the index agree
//! (`git status` clean), `git fsck --strict` is clean. As root and as the
//! unprivileged test user, with the stage mounted as sbx-fs mounts it.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use common::Fixture;
use sbx_testutil::{As, assert_event, code, identities, stderr};

const MOUNT: &str = r#"set -e
S=$1; R=$2
o=""; [ -n "$SBX_USERNS" ] && o=",userxattr"
mount -t overlay overlay -o "nosuid,nodev,lowerdir=$R/.git,upperdir=$S/git/upper,workdir=$S/git/work$o" "$R/.git"
for p in config hooks; do
  mount --bind "$R/.git/$p" "$R/.git/$p"
  mount -o remount,bind,ro "$R/.git/$p"
done
cd "$R"
exec sh -ec "$3"
"#;

/// The agent's work: two commits on main (a new file staged too), a new
/// branch and a tag, a branch deleted.
const AGENT: &str = r#"
echo d > d; git add d; git commit -qm agent1
echo e >> a; git commit -qam agent2
git branch agentb HEAD~1
git tag agent-tag
git branch -D feat
echo staged > s; git add s
"#;

fn staged(f: &Fixture, stage: &Path, crash_at: Option<u32>) -> Output {
    let w = f.w.to_str().unwrap();
    let s = stage.to_str().unwrap();
    let mut args = vec!["run", "--repo", w, "--stage", s, "--"];
    match f.who {
        As::Root => args.extend_from_slice(&["unshare", "-m"]),
        As::User => args.extend_from_slice(&["unshare", "-Urm", "env", "SBX_USERNS=1"]),
    }
    args.extend_from_slice(&["sh", "-c", MOUNT, "sh", s, w, AGENT]);
    let mut c = sbx_testutil::tool("sbx-gitguard");
    c.arg(args[0])
        .arg("--audit-log")
        .arg(&f.audit)
        .args(&args[1..])
        .current_dir(&f.w)
        .env("GIT_CONFIG_GLOBAL", f.dir.join("gitconfig"))
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env_remove("GIT_DIR");
    if let Some(n) = crash_at {
        c.env("SBX_GITGUARD_CRASH_AT", n.to_string());
    }
    sbx_testutil::run_as(&mut c, f.who);
    common::within(common::LIMIT, c, "sbx-gitguard run --stage")
}

/// refs, HEAD, and the index as the user sees them.
#[derive(Debug, PartialEq, Eq)]
struct View {
    refs: String,
    head: String,
    staged: String,
}

fn view(f: &Fixture) -> View {
    View {
        // Names and subjects: each fixture has its own object ids.
        refs: f.git_ok(&f.w, &["for-each-ref", "--format=%(refname) %(subject)"]),
        head: f.git_ok(&f.w, &["symbolic-ref", "-q", "HEAD"])
            + &f.git_ok(&f.w, &["log", "-3", "--format=%s"]),
        staged: f.git_ok(&f.w, &["diff", "--cached", "--name-status"]),
    }
}

fn consistent(f: &Fixture, ctx: &str) {
    let o = f.git(&f.w, &["fsck", "--strict", "--no-dangling"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && !err.contains("error") && !err.contains("missing"),
        "{ctx}: fsck --strict: {err}"
    );
    // HEAD and the index agree with the work tree: nothing modified, only
    // the staged new file (when the import happened).
    let st = f.git_ok(&f.w, &["status", "--porcelain", "--untracked-files=no"]);
    assert!(
        st.lines().all(|l| l.starts_with("A ")),
        "{ctx}: git status: {st}"
    );
    assert!(
        !f.w.join(".git/sbx-gitguard-import").exists(),
        "{ctx}: journal left"
    );
}

#[test]
fn killed_at_every_step_the_import_is_all_or_nothing() {
    let deadline = Instant::now() + Duration::from_secs(600);
    for who in identities() {
        // The reference: the import without a crash.
        let f = Fixture::new(who);
        let before = view(&f);
        let stage = f.dir.join("sbx-git-stage-j");
        let out = staged(&f, &stage, None);
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        let after = view(&f);
        assert_ne!(before, after);
        consistent(&f, "reference");
        let mut steps = 0;
        let (mut undone, mut completed) = (0, 0);
        for n in 1..64u32 {
            assert!(
                Instant::now() < deadline,
                "{who:?}: out of time at step {n}"
            );
            for next_start in [true, false] {
                let f = Fixture::new(who);
                let stage: PathBuf = f.dir.join("sbx-git-stage-j");
                let out = staged(&f, &stage, Some(n));
                if code(&out) != 128 + 9 {
                    // The import finished before step n: every step is done.
                    assert_eq!(code(&out), 0, "{who:?} step {n}: {}", stderr(&out));
                    assert_eq!(view(&f), after);
                    steps = n - 1;
                    break;
                }
                let ctx = format!("{who:?} killed at step {n} (next start: {next_start})");
                let journal_left = f.w.join(".git/sbx-gitguard-import").exists();
                if next_start {
                    // The next run finishes or undoes it before anything.
                    let o = f.run(&[], "true");
                    assert_eq!(code(&o), 0, "{ctx}: {}", stderr(&o));
                    let v = view(&f);
                    assert!(
                        v == before || v == after,
                        "{ctx}: neither untouched nor imported:\n{v:?}\nbefore {before:?}\nafter {after:?}"
                    );
                    if journal_left {
                        assert_event(&f.audit, "import_recovered", "warn", |_| true);
                    }
                    if v == after {
                        completed += 1;
                    }
                    if v == before {
                        undone += 1;
                        // Undone: the stage is still there, import it by hand.
                        let o = f.guard(&[
                            "import",
                            "--repo",
                            f.w.to_str().unwrap(),
                            "--stage",
                            stage.to_str().unwrap(),
                        ]);
                        // A later run reaps stale stages; this one was
                        // not reaped (no --stage run since).
                        assert_eq!(code(&o), 0, "{ctx}: import: {}", stderr(&o));
                        assert_eq!(view(&f), after, "{ctx}");
                    }
                } else {
                    // `import` of the stage the dead run left.
                    let o = f.guard(&[
                        "import",
                        "--repo",
                        f.w.to_str().unwrap(),
                        "--stage",
                        stage.to_str().unwrap(),
                    ]);
                    assert_eq!(code(&o), 0, "{ctx}: import: {}", stderr(&o));
                    assert_eq!(view(&f), after, "{ctx}");
                }
                consistent(&f, &ctx);
            }
            if steps > 0 {
                break;
            }
        }
        assert!(
            steps >= 6,
            "{who:?}: only {steps} crash points were reached"
        );
        assert!(
            undone > 0 && completed > 0,
            "{who:?}: both outcomes are exercised (undone {undone}, completed {completed})"
        );
    }
}

/// An undone import removes nothing from the object store. It used to
/// remove the objects its pending list named, which by then the user's own
/// git could be using (git writes no object it already has: a commit of the
/// same content took the dead import's blobs) or which an applied import
/// named (a journal left with its pending list after its refs were
/// applied): the next start broke the repository (attacker helper-52; the
/// fault-injection test's damaged repository). What a killed import wrote
/// is closed under links (written links first), so `git fsck` stays clean
/// (the crash test above checks it at every step).
#[test]
fn an_undone_import_never_removes_what_is_used() {
    for who in identities() {
        // (a) Killed after its first object was written, before the
        // commit; then the user commits the same content by hand.
        let f = Fixture::new(who);
        let out = staged(&f, &stage_of(&f), Some(2));
        assert_eq!(code(&out), 128 + 9, "{who:?}: {}", stderr(&out));
        assert!(f.w.join(".git/sbx-gitguard-import/pending.json").exists());
        assert!(!f.w.join(".git/sbx-gitguard-import/journal.json").exists());
        f.git_ok(&f.w, &["add", "-A"]);
        f.git_ok(&f.w, &["commit", "-qm", "mine"]);
        let mine = view(&f);
        let o = f.run(&[], "true");
        assert_eq!(code(&o), 0, "{who:?}: {}", stderr(&o));
        let ctx = format!("{who:?}: the user's commit after an undone import");
        let fsck = f.git(&f.w, &["fsck", "--strict", "--no-dangling"]);
        assert!(
            fsck.status.success(),
            "{ctx}: {}",
            String::from_utf8_lossy(&fsck.stderr)
        );
        assert_eq!(view(&f), mine, "{ctx}");
        assert_event(&f.audit, "import_recovered", "warn", |e| {
            e["state"] == "pending" && e["action"] == "undone"
        });

        // (b) A pending list left beside refs that were applied.
        let f = Fixture::new(who);
        let out = staged(&f, &stage_of(&f), None);
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        let after = view(&f);
        let ids = f.git_ok(&f.w, &["rev-parse", "HEAD", "HEAD^{tree}", "HEAD:d", ":s"]);
        let ids: Vec<&str> = ids.split_whitespace().collect();
        assert_eq!(ids.len(), 4, "{ids:?}");
        let pending = serde_json::json!({ "version": 1, "objects": ids }).to_string();
        let mut c = std::process::Command::new("sh");
        c.args([
            "-ec",
            "umask 077; mkdir .git/sbx-gitguard-import; printf %s \"$1\" > .git/sbx-gitguard-import/pending.json",
            "sh",
            &pending,
        ])
        .current_dir(&f.w);
        sbx_testutil::run_as(&mut c, who);
        assert!(c.status().unwrap().success());
        let o = f.run(&[], "true");
        assert_eq!(code(&o), 0, "{who:?}: {}", stderr(&o));
        let ctx = format!("{who:?}: a pending list beside applied refs");
        consistent(&f, &ctx);
        assert_eq!(view(&f), after, "{ctx}");
        for id in &ids {
            let t = f.git(&f.w, &["cat-file", "-t", id]);
            assert!(t.status.success(), "{ctx}: object {id} is gone");
        }
    }
}

fn stage_of(f: &Fixture) -> PathBuf {
    f.dir.join("sbx-git-stage-j")
}

/// Root importing into a user's repository and killed halfway leaves
/// nothing of root's there: the journal and the objects written so far are
/// the owner's, so the owner's next run recovers it (it stopped every run
/// of theirs with EACCES, and a fan-out directory stayed root's: attacker
/// helper-52).
#[test]
fn a_killed_import_by_root_leaves_the_owner_in_charge() {
    if !sbx_testutil::is_root() {
        sbx_testutil::skip!("needs root");
    }
    let f = Fixture::new(As::User);
    let (w, s) = (f.w.to_str().unwrap(), stage_of(&f));
    let s = s.to_str().unwrap();
    let mut c = sbx_testutil::tool("sbx-gitguard");
    c.args(["run", "--audit-log"])
        .arg(f.dir.join("root-audit.jsonl"))
        .args(["--repo", w, "--stage", s, "--", "unshare", "-m"])
        .args(["sh", "-c", MOUNT, "sh", s, w, AGENT])
        .current_dir(&f.w)
        .env("GIT_CONFIG_GLOBAL", f.dir.join("gitconfig"))
        .env("GIT_CONFIG_NOSYSTEM", "1")
        // Root's git in the user's repository (the sandbox's, here).
        .env("GIT_CONFIG_COUNT", "1")
        .env("GIT_CONFIG_KEY_0", "safe.directory")
        .env("GIT_CONFIG_VALUE_0", "*")
        .env("SBX_GITGUARD_CRASH_AT", "3")
        .env_remove("GIT_DIR");
    let out = common::within(common::LIMIT, c, "sbx-gitguard run --stage as root");
    assert_eq!(code(&out), 128 + 9, "{}", stderr(&out));
    assert!(f.w.join(".git/sbx-gitguard-import/pending.json").exists());
    let mut root_owned = Vec::new();
    let mut todo = vec![f.w.join(".git")];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let m = e.metadata().unwrap();
            if std::os::unix::fs::MetadataExt::uid(&m) == 0 {
                root_owned.push(e.path());
            }
            if m.is_dir() {
                todo.push(e.path());
            }
        }
    }
    assert!(
        root_owned.is_empty(),
        "root's in the user's .git: {root_owned:?}"
    );
    let o = f.run(&[], "true");
    assert_eq!(code(&o), 0, "the owner's next run: {}", stderr(&o));
    // Undone: the work tree keeps what the command wrote (docs/gitguard.md
    // "Limits"), the store is whole.
    let fsck = f.git(&f.w, &["fsck", "--strict", "--no-dangling"]);
    assert!(
        fsck.status.success(),
        "{}",
        String::from_utf8_lossy(&fsck.stderr)
    );
    assert!(!f.w.join(".git/sbx-gitguard-import").exists());
    assert_event(&f.audit, "import_recovered", "warn", |e| {
        e["action"] == "undone"
    });
}

/// A FIFO planted as the journal's lock is one line and 125, never a hang
/// (opening it for writing blocked every run and import).
#[test]
fn a_fifo_as_the_journal_lock_is_refused_at_once() {
    for who in identities() {
        let f = Fixture::new(who);
        let o = f.sh(
            &f.w,
            "mkdir .git/sbx-gitguard-import && mkfifo .git/sbx-gitguard-import/lock",
        );
        assert!(o.status.success(), "{}", stderr(&o));
        let t0 = Instant::now();
        let o = f.run(&[], "true");
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{who:?}: took {:?}",
            t0.elapsed()
        );
        assert_eq!(code(&o), 125, "{who:?}: {}", stderr(&o));
        assert_eq!(stderr(&o).lines().count(), 1, "{who:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("unfinished git import"),
            "{}",
            stderr(&o)
        );
    }
}

/// A run's check of the git dir leaves alone the journal of an import that
/// is alive (its lock held outside the sandbox): removing it as a planted
/// file failed that import halfway (attacker helper-52). One nothing holds
/// is still removed as planted.
#[test]
fn a_live_imports_journal_is_not_taken_for_a_planted_file() {
    for who in identities() {
        for held in [true, false] {
            let f = Fixture::new(who);
            let j = f.w.join(".git/sbx-gitguard-import");
            let go = f.dir.join("go");
            let script = format!(
                "mkdir .git/sbx-gitguard-import && : > .git/sbx-gitguard-import/lock && \
                 while [ ! -e {} ]; do sleep 0.01; done",
                go.display()
            );
            let child = {
                let mut c = f.guard_cmd(&[
                    "run",
                    "--repo",
                    f.w.to_str().unwrap(),
                    "--",
                    "sh",
                    "-c",
                    &script,
                ]);
                c.stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::piped());
                c.spawn().unwrap()
            };
            let t0 = Instant::now();
            while !j.join("lock").exists() {
                assert!(
                    t0.elapsed() < Duration::from_secs(20),
                    "the command never made the lock"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            // The "import": this process holds the lock.
            let lock = std::fs::File::open(j.join("lock")).unwrap();
            if held {
                take_lock(&lock);
            }
            std::fs::write(&go, "").unwrap();
            let o = child.wait_with_output().unwrap();
            drop(lock);
            let ctx = format!("{who:?} held {held}: {}", stderr(&o));
            if held {
                assert_eq!(code(&o), 0, "{ctx}");
                assert!(j.exists(), "{ctx}: the live journal was removed");
            } else {
                assert_planted_journal_removed(&f, &ctx);
            }
        }
    }
}

/// An import that finds another import of the repository alive waits for
/// it (two sandboxes ending together); past the wait it is one line, 125,
/// nothing written and its stage kept for a later import (it was deleted:
/// attacker helper-52).
#[test]
fn an_import_waits_for_another_and_never_drops_its_stage() {
    for who in identities() {
        let f = Fixture::new(who);
        let stage = stage_of(&f);
        // A dead run's stage and journal (killed right after its pending
        // list), the journal's lock then taken by "another import".
        let out = staged(&f, &stage, Some(1));
        assert_eq!(code(&out), 128 + 9, "{who:?}: {}", stderr(&out));
        let before = view(&f);
        let lock = std::fs::File::open(f.w.join(".git/sbx-gitguard-import/lock")).unwrap();
        take_lock(&lock);
        let args = [
            "import",
            "--repo",
            f.w.to_str().unwrap(),
            "--stage",
            stage.to_str().unwrap(),
        ];
        let mut c = f.guard_cmd(&args);
        c.env("SBX_GITGUARD_BUSY_WAIT_MS", "300");
        let o = common::within(common::LIMIT, c, "import while another holds the journal");
        let ctx = format!("{who:?}: {}", stderr(&o));
        assert_eq!(code(&o), 125, "{ctx}");
        assert_eq!(stderr(&o).lines().count(), 1, "{ctx}");
        assert!(stderr(&o).contains("another import"), "{ctx}");
        assert!(stage.exists(), "{ctx}: the stage was dropped");
        assert_eq!(view(&f), before, "{ctx}");
        // Released while the next import waits: it goes on and imports.
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(700));
            drop(lock);
        });
        let mut c = f.guard_cmd(&args);
        c.env("SBX_GITGUARD_BUSY_WAIT_MS", "30000");
        let o = common::within(common::LIMIT, c, "import after the other one");
        t.join().unwrap();
        assert_eq!(code(&o), 0, "{who:?}: {}", stderr(&o));
        assert!(!stage.exists());
        consistent(&f, &format!("{who:?}: imported after the wait"));
    }
}

/// A journal is a file in the repository, so what it asks for is checked
/// again before it is completed: a ref name with `..` had root (recovering
/// in a user's repository) chown root's files anywhere to that user, and
/// names or values outside what the import writes are refused with an
/// alert, changing nothing (attacker helper-53).
#[test]
fn a_forged_journal_cannot_chown_or_move_refs_past_the_rules() {
    use std::os::unix::fs::MetadataExt;
    if !sbx_testutil::is_root() {
        sbx_testutil::skip!("needs root");
    }
    let mut f = Fixture::new(As::User);
    let outside = f.dir.join("rootdir");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret"), "s").unwrap();
    let before = view(&f);
    let journal = serde_json::json!({
        "version": 1, "sbx_id": "x", "index": false, "head": ["ref: refs/heads/main", "ref: refs/remotes/x"],
        "refs": [
            {"name": "../../rootdir/secret", "old": null, "new": null, "fast_forward": null},
            {"name": "refs/replace/0000000000000000000000000000000000000001", "old": null,
             "new": "0000000000000000000000000000000000000002", "fast_forward": null},
        ],
    })
    .to_string();
    let o = f.sh(
        &f.w,
        &format!(
            "mkdir -m700 .git/sbx-gitguard-import && printf %s '{journal}' > .git/sbx-gitguard-import/journal.json"
        ),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    f.who = As::Root;
    let mut c = f.guard_cmd(&["run", "--repo", f.w.to_str().unwrap(), "--", "true"]);
    c.env("GIT_CONFIG_COUNT", "1")
        .env("GIT_CONFIG_KEY_0", "safe.directory")
        .env("GIT_CONFIG_VALUE_0", "*");
    let o = common::within(common::LIMIT, c, "root's run over a forged journal");
    f.who = As::User;
    for p in [outside.clone(), outside.join("secret")] {
        assert_eq!(
            std::fs::metadata(&p).unwrap().uid(),
            0,
            "{} was given away: {}",
            p.display(),
            stderr(&o)
        );
    }
    assert_eq!(view(&f), before, "{}", stderr(&o));
    for r in ["../../rootdir/secret", "refs/replace/", "HEAD"] {
        assert_event(&f.audit, "ref_refused", "alert", |e| {
            e["ref"].as_str().unwrap_or("").starts_with(r)
        });
    }
}

/// A planted journal whose `lock` is a hard link to a file that some
/// process holds locked is not taken for a live import: the run's check
/// removes it (alert) and nothing of it is ever applied (attacker
/// helper-53: the run's own registry entry served as the lock).
#[test]
fn a_planted_journal_with_a_borrowed_lock_is_removed() {
    for who in identities() {
        let f = Fixture::new(who);
        let held = f.dir.join("held");
        let o = f.sh(&f.w, &format!(": > {}", held.display()));
        assert!(o.status.success(), "{}", stderr(&o));
        let h = std::fs::File::open(&held).unwrap();
        take_lock(&h);
        let main = f.git_ok(&f.w, &["rev-parse", "main"]);
        let first = f.git_ok(&f.w, &["rev-list", "--max-parents=0", "main"]);
        let journal = serde_json::json!({
            "version": 1, "sbx_id": "x", "index": false, "head": null,
            "refs": [{"name": "refs/heads/main", "old": main.trim(), "new": first.trim(), "fast_forward": false}],
        })
        .to_string();
        let script = format!(
            "mkdir -m700 .git/sbx-gitguard-import && printf %s '{journal}' > .git/sbx-gitguard-import/journal.json \
             && ln {} .git/sbx-gitguard-import/lock",
            held.display()
        );
        let o = f.run(&[], &script);
        let ctx = format!("{who:?}: {}", stderr(&o));
        assert_planted_journal_removed(&f, &ctx);
        drop(h);
        let o = f.run(&[], "true");
        assert_eq!(code(&o), 0, "{who:?}: {}", stderr(&o));
        assert_eq!(
            f.git_ok(&f.w, &["rev-parse", "main"]),
            main,
            "{ctx}: main moved"
        );
    }
}

/// Takes an exclusive flock on `f` (held while it stays open), as an
/// import holds its journal's lock.
fn take_lock(f: &std::fs::File) {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on an fd the caller opened and keeps open.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(r, 0, "flock: {}", std::io::Error::last_os_error());
}

/// The run's check removed a planted journal, with its alert.
fn assert_planted_journal_removed(f: &Fixture, ctx: &str) {
    assert!(
        !f.w.join(".git/sbx-gitguard-import").exists(),
        "{ctx}: the planted journal stayed"
    );
    assert_event(&f.audit, "git_integrity", "alert", |e| {
        e["check"] == "extra_files"
            && e["path"]
                .as_str()
                .unwrap_or("")
                .ends_with("sbx-gitguard-import")
    });
}
