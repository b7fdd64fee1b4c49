//! Issue 25: git operations in progress go on across calls. Each step is
//! its own `scripts/sbx-run` or `sbx-policy chain` call (as an agent's tool
//! calls are), as root and as the unprivileged test user: a conflicted
//! merge completed in a later call has two parents on the host, `git merge
//! --abort` works in a later call, a conflicted rebase continues and
//! finishes, cherry-pick and revert sequences continue, a bisect takes its
//! steps.
//! The stage's in-progress state comes over as checked data
//! (crates/sbx-gitguard/src/inprogress.rs); planted variants are refused
//! with their alert and nothing of them reaches the host. After every step
//! the host repository passes `git fsck --full --strict`. Every command is
//! bounded in time (`sbx_testutil::output_within`).

mod common;
use common::gitproj::*;
use common::{chown_r, write};

use std::path::Path;
use std::process::Command;

use sbx_testutil::{As, assert_event, audit_events, identities, output_within, stdout};

/// main: f=1, then f=main; c1 (from the first): f=c1. HEAD main.
fn conflicting(root: &Path) -> (String, String) {
    commit(root, "f", "1\n", "one");
    git_ok(root, &["checkout", "-qb", "c1"]);
    let c1 = commit(root, "f", "c1\n", "c1");
    git_ok(root, &["checkout", "-q", "main"]);
    let main = commit(root, "f", "main\n", "main");
    (main, c1)
}

#[test]
fn a_conflicted_merge_completed_in_a_later_call_has_two_parents() {
    for who in identities() {
        for chain in CHAINS {
            let mut ids = (String::new(), String::new());
            let p = project(who, |r| ids = conflicting(r));
            let (main, c1) = ids;
            let (_, c) = p.step(chain, "git merge c1; echo RC=$?", "RC=1");
            // The merge in progress is on the host, the conflict in its index.
            let mh = std::fs::read_to_string(p.gitfile("MERGE_HEAD")).unwrap();
            assert_eq!(mh.trim(), c1, "{c}");
            assert!(p.gitfile("MERGE_MSG").is_file(), "{c}");
            assert_eq!(
                std::fs::read_to_string(p.gitfile("ORIG_HEAD"))
                    .unwrap()
                    .trim(),
                main,
                "{c}"
            );
            assert!(
                !p.git(&["ls-files", "-u"]).is_empty(),
                "the conflict is not in the index: {c}"
            );
            assert_event(&p.log, "inprogress_carried", "info", |e| {
                e["path"] == "MERGE_HEAD"
            });
            let (_, c) = p.step(
                chain,
                "printf 'resolved\\n' > f && git add f && git commit -q --no-edit && echo DONE",
                "DONE",
            );
            let parents = p.git(&["rev-list", "--parents", "-1", "HEAD"]);
            let parents: Vec<&str> = parents.split(' ').skip(1).collect();
            assert_eq!(parents, [main.as_str(), c1.as_str()], "two parents: {c}");
            assert_eq!(p.git(&["symbolic-ref", "HEAD"]), "refs/heads/main", "{c}");
            p.assert_nothing_in_progress(&c);
            assert!(!p.gitfile("MERGE_MSG").exists(), "{c}");
            p.assert_clean(&c);
        }
    }
}

#[test]
fn git_merge_abort_in_a_later_call_works() {
    for who in identities() {
        for chain in CHAINS {
            let mut ids = (String::new(), String::new());
            let p = project(who, |r| ids = conflicting(r));
            let (main, _) = ids;
            p.step(chain, "git merge c1; echo RC=$?", "RC=1");
            let (_, c) = p.step(chain, "git merge --abort && echo ABORTED", "ABORTED");
            assert_eq!(p.git(&["rev-parse", "HEAD"]), main, "{c}");
            p.assert_nothing_in_progress(&c);
            p.assert_clean(&c);
            assert_eq!(
                std::fs::read_to_string(p.root.join("f")).unwrap(),
                "main\n",
                "{c}"
            );
        }
    }
}

#[test]
fn a_conflicted_rebase_continues_and_finishes_in_a_later_call() {
    for who in identities() {
        for chain in CHAINS {
            let p = project(who, |r| {
                commit(r, "f", "1\n", "one");
                git_ok(r, &["checkout", "-qb", "topic"]);
                commit(r, "f", "topic\n", "t1");
                commit(r, "g", "g\n", "t2");
                git_ok(r, &["checkout", "-q", "main"]);
                commit(r, "f", "main\n", "m2");
                git_ok(r, &["checkout", "-q", "topic"]);
            });
            let (_, c) = p.step(chain, "git rebase main; echo RC=$?", "RC=1");
            assert!(p.gitfile("rebase-merge/git-rebase-todo").is_file(), "{c}");
            assert!(p.gitfile("REBASE_HEAD").is_file(), "{c}");
            // In the next call git knows the rebase.
            p.step(
                chain,
                "git status | head -3; echo STATUS",
                "rebase in progress",
            );
            let (_, c) = p.step(
                chain,
                "printf 'resolved\\n' > f && git add f && git rebase --continue && echo DONE",
                "DONE",
            );
            assert_eq!(p.git(&["symbolic-ref", "HEAD"]), "refs/heads/topic", "{c}");
            assert!(
                git_out(&p.root, &["merge-base", "--is-ancestor", "main", "topic"])
                    .status
                    .success(),
                "topic is not on main: {c}"
            );
            assert_eq!(p.git(&["rev-list", "--count", "main..topic"]), "2", "{c}");
            assert_eq!(
                std::fs::read_to_string(p.root.join("f")).unwrap(),
                "resolved\n",
                "{c}"
            );
            p.assert_nothing_in_progress(&c);
            p.assert_clean(&c);
        }
    }
}

#[test]
fn a_cherry_pick_sequence_continues_in_a_later_call() {
    for who in identities() {
        for chain in CHAINS {
            let mut m2 = String::new();
            let p = project(who, |r| {
                commit(r, "f", "1\n", "one");
                git_ok(r, &["checkout", "-qb", "side"]);
                commit(r, "g", "s1\n", "s1");
                commit(r, "f", "side\n", "s2");
                commit(r, "h", "s3\n", "s3");
                git_ok(r, &["checkout", "-q", "main"]);
                m2 = commit(r, "f", "main\n", "m2");
            });
            let (_, c) = p.step(
                chain,
                "git cherry-pick side~2 side~1 side; echo RC=$?",
                "RC=1",
            );
            assert!(p.gitfile("sequencer/todo").is_file(), "{c}");
            let s2 = p.git(&["rev-parse", "side~1"]);
            assert_eq!(
                std::fs::read_to_string(p.gitfile("CHERRY_PICK_HEAD"))
                    .unwrap()
                    .trim(),
                s2,
                "{c}"
            );
            let (_, c) = p.step(
                chain,
                "printf 'resolved\\n' > f && git add f && git cherry-pick --continue && echo DONE",
                "DONE",
            );
            assert_eq!(
                p.git(&["rev-list", "--count", &format!("{m2}..main")]),
                "3",
                "{c}"
            );
            assert_eq!(p.git(&["log", "--format=%s", "-3"]), "s3\ns2\ns1", "{c}");
            p.assert_nothing_in_progress(&c);
            p.assert_clean(&c);
        }
    }
}

#[test]
fn a_revert_sequence_continues_in_a_later_call() {
    for who in identities() {
        for chain in CHAINS {
            let mut four = String::new();
            let p = project(who, |r| {
                commit(r, "f", "1\n", "one");
                commit(r, "h", "h\n", "two");
                commit(r, "f", "3\n", "three");
                four = commit(r, "f", "4\n", "four");
            });
            // Reverting "two" is clean, "three" conflicts with "four".
            let (_, c) = p.step(
                chain,
                "git revert --no-edit HEAD~2 HEAD~1; echo RC=$?",
                "RC=1",
            );
            let three = p.git(&["rev-parse", "HEAD~2"]);
            assert_eq!(
                std::fs::read_to_string(p.gitfile("REVERT_HEAD"))
                    .unwrap()
                    .trim(),
                three,
                "{c}"
            );
            assert!(p.gitfile("sequencer/todo").is_file(), "{c}");
            let (_, c) = p.step(
                chain,
                "printf 'resolved\\n' > f && git add f && git revert --continue && echo DONE",
                "DONE",
            );
            assert_eq!(
                p.git(&["rev-list", "--count", &format!("{four}..main")]),
                "2",
                "{c}"
            );
            assert_eq!(
                p.git(&["log", "--format=%s", "-2"]),
                "Revert \"three\"\nRevert \"two\"",
                "{c}"
            );
            p.assert_nothing_in_progress(&c);
            p.assert_clean(&c);
        }
    }
}

#[test]
fn a_bisect_takes_its_steps_across_calls() {
    for who in identities() {
        for chain in CHAINS {
            let mut ids = Vec::new();
            let p = project(who, |r| {
                for i in 0..7 {
                    if i == 3 {
                        write(&r.join("bug"), "bug\n");
                    }
                    ids.push(commit(r, "n", &format!("{i}\n"), &format!("c{i}")));
                }
            });
            let (_, c) = p.step(
                chain,
                &format!(
                    "git bisect start && git bisect bad HEAD && git bisect good {} && echo STARTED",
                    ids[0]
                ),
                "STARTED",
            );
            assert!(p.gitfile("BISECT_LOG").is_file(), "{c}");
            assert!(p.gitfile("refs/bisect/bad").is_file(), "{c}");
            let mut found = None;
            for _ in 0..6 {
                let (out, _) = p.step(
                    chain,
                    "if [ -e bug ]; then git bisect bad; else git bisect good; fi; echo STEP",
                    "STEP",
                );
                let so = stdout(&out);
                if let Some(l) = so.lines().find(|l| l.contains("is the first bad commit")) {
                    found = l.split(' ').next().map(str::to_string);
                    break;
                }
            }
            assert_eq!(
                found.as_deref(),
                Some(ids[3].as_str()),
                "bisect did not find c3"
            );
            let (_, c) = p.step(chain, "git bisect reset && echo RESET", "RESET");
            assert_eq!(p.git(&["symbolic-ref", "HEAD"]), "refs/heads/main", "{c}");
            assert_eq!(p.git(&["rev-parse", "HEAD"]), ids[6], "{c}");
            p.assert_nothing_in_progress(&c);
            p.assert_clean(&c);
            assert_event(&p.log, "ref_imported", "info", |e| {
                e["ref"] == "refs/bisect/bad"
            });
        }
    }
}

/// A rebase-merge/ as git writes it, whose only defect is `extra`.
fn planted_rebase(extra: &str) -> String {
    format!(
        "set -e; mkdir .git/rebase-merge; h=$(git rev-parse HEAD)
         echo $h > .git/rebase-merge/onto; echo $h > .git/rebase-merge/orig-head
         echo refs/heads/main > .git/rebase-merge/head-name; : > .git/rebase-merge/interactive
         echo \"pick $h one\" > .git/rebase-merge/git-rebase-todo
         {extra}
         echo PLANTED"
    )
}

#[test]
fn planted_in_progress_state_is_refused_with_alerts() {
    for who in identities() {
        for chain in CHAINS {
            let p = project(who, |r| {
                commit(r, "f", "1\n", "one");
            });
            let before = p.git(&["for-each-ref"]);
            let mark = p.base.join("MARK");
            let m = mark.display();
            // A host file an attacker would have a symlink read.
            let outside = p.base.join("outside-id");
            write(&outside, &format!("{}\n", p.git(&["rev-parse", "HEAD"])));
            if who == As::User {
                chown_r(&p.base);
            }
            let o = outside.display();
            // MERGE_HEAD naming a missing object, an oversized MERGE_MSG,
            // refs/bisect/* as a symlink outside and as a symbolic ref, a
            // todo list with an exec line.
            let (_, c) = p.step(
                chain,
                &planted_rebase(&format!(
                    "echo 0123456789abcdef0123456789abcdef01234567 > .git/MERGE_HEAD
                     head -c 2000000 /dev/zero | tr '\\0' a > .git/MERGE_MSG
                     mkdir -p .git/refs/bisect; ln -s {o} .git/refs/bisect/bad
                     echo 'ref: refs/heads/main' > .git/refs/bisect/good-x
                     echo 'exec touch {m}' >> .git/rebase-merge/git-rebase-todo"
                )),
                "PLANTED",
            );
            for n in ["MERGE_HEAD", "MERGE_MSG", "rebase-merge", "refs/bisect"] {
                assert!(!p.gitfile(n).exists(), "{n} reached the host: {c}");
            }
            assert_eq!(p.git(&["for-each-ref"]), before, "{c}");
            p.dropped("MERGE_HEAD", "does not exist");
            p.dropped("MERGE_MSG", "larger than");
            p.dropped("rebase-merge", "exec");
            assert_event(&p.log, "ref_refused", "alert", |e| {
                e["ref"] == "refs/bisect/bad"
                    && e["reason"].as_str().unwrap_or("").contains("symbolic link")
            });
            assert_event(&p.log, "ref_refused", "alert", |e| {
                e["ref"] == "refs/bisect/good-x"
                    && e["reason"]
                        .as_str()
                        .unwrap_or("")
                        .contains("names a commit")
            });
            // Said once each, on stderr too.
            let n = audit_events(&p.log)
                .iter()
                .filter(|e| e["event"] == "stage_entry_dropped" && e["path"] == "rebase-merge")
                .count();
            assert_eq!(n, 1, "{c}");
            assert!(c.contains("stage_entry_dropped"), "not on stderr: {c}");
            // The owner's git runs nothing of it.
            let mut g = Command::new("git");
            g.args(["-c", "safe.directory=*", "rebase", "--continue"])
                .current_dir(&p.root)
                .env("GIT_EDITOR", "true");
            let _ = output_within(&mut g, T);
            assert!(!mark.exists(), "the planted exec ran: {c}");

            // A file of rebase-merge/ that is a symlink (to a host file
            // holding a valid id), then one that is a FIFO.
            let (_, c) = p.step(
                chain,
                &planted_rebase(&format!(
                    "rm .git/rebase-merge/onto; ln -s {o} .git/rebase-merge/onto"
                )),
                "PLANTED",
            );
            assert!(!p.gitfile("rebase-merge").exists(), "{c}");
            p.dropped("rebase-merge", "symlink");
            let (_, c) = p.step(
                chain,
                &planted_rebase("rm .git/rebase-merge/git-rebase-todo; mkfifo .git/rebase-merge/git-rebase-todo"),
                "PLANTED",
            );
            assert!(!p.gitfile("rebase-merge").exists(), "{c}");
            p.dropped("rebase-merge", "FIFO");
            p.assert_clean(&c);
        }
    }
}
