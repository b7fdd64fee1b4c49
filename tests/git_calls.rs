//! Issue 23: git state made in one sandboxed call is there in the next,
//! each step its own `scripts/sbx-run` or `sbx-policy chain` call, as root
//! and as the unprivileged test user: `git stash` then `git stash pop`,
//! `@{1}` after an amend, `git worktree add` / commit in it / `git worktree
//! remove`. The host repository is checked after every step (`git fsck
//! --strict`, the expected refs, `git stash list`, `git worktree list`).
//! And what the sandbox forges instead (a stash reflog naming a missing
//! object or with a huge entry, a worktree admin dir pointing outside the
//! project or whose config.worktree runs programs, a `.git` file naming a
//! crafted admin dir) is refused, each with its alert in the audit log.
//! Every command is bounded in time (`sbx_testutil::output_within`).

mod common;
use common::gitproj::{self, Chain, git_ok, git_out};
use common::write;

use std::path::{Path, PathBuf};
use std::process::Output;

use sbx_testutil::{As, assert_event, identities, stderr, stdout};

const SETTINGS: &str = r#"{"permissions": {"allow": ["Edit(./**)", "Bash(sh:*)", "Bash(git:*)", "Bash(python3:*)", "Bash(rm)", "Bash(mkdir)", "Bash(printf)", "Bash(echo)", "Bash(cat)", "Bash(true)"]}}"#;

const CHAINS: [Chain; 2] = [Chain::SbxRun, Chain::Policy];

/// A project driven through one chain (`tests/common/gitproj.rs`).
struct Proj {
    p: gitproj::Proj,
    chain: Chain,
}

impl std::ops::Deref for Proj {
    type Target = gitproj::Proj;
    fn deref(&self) -> &gitproj::Proj {
        &self.p
    }
}

/// A repository with one commit on main, owned by `who`.
fn project(who: As, chain: Chain) -> Proj {
    let p = gitproj::project_with(who, SETTINGS, |root| {
        write(&root.join(".gitignore"), ".claude/\n.wt/\n");
        gitproj::commit(root, "a", "a\n", "one");
    });
    Proj { p, chain }
}

impl Proj {
    /// One sandboxed call: the chain around `sh -c SCRIPT` in the project.
    fn call(&self, script: &str) -> Output {
        self.p.run(self.chain, script)
    }

    /// The same, started in `dir` (the project is found from there).
    fn call_in(&self, dir: &Path, script: &str) -> Output {
        self.p.run_in(self.chain, dir, script)
    }

    /// A call that must succeed; returns its stdout.
    fn ok(&self, script: &str) -> String {
        let out = self.call(script);
        assert_eq!(out.status.code(), Some(0), "{}", self.ctx(&out));
        stdout(&out)
    }

    fn ctx(&self, out: &Output) -> String {
        format!(
            "{:?} {:?}\nstdout:\n{}\nstderr:\n{}",
            self.who,
            self.chain,
            stdout(out),
            stderr(out)
        )
    }

    fn rev(&self, r: &str) -> Option<String> {
        let o = git_out(&self.root, &["rev-parse", "--verify", "-q", r]);
        o.status.success().then(|| stdout(&o).trim().to_string())
    }

    fn stash_list(&self) -> Vec<String> {
        self.git(&["stash", "list", "--format=%gd %s"])
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// `git worktree list --porcelain`'s worktree paths.
    fn worktrees(&self) -> Vec<PathBuf> {
        self.git(&["worktree", "list", "--porcelain"])
            .lines()
            .filter_map(|l| l.strip_prefix("worktree "))
            .map(PathBuf::from)
            .collect()
    }
}

fn each(f: impl Fn(&Proj)) {
    for who in identities() {
        for chain in CHAINS {
            f(&project(who, chain));
        }
    }
}

#[test]
fn stash_in_one_call_pop_and_drop_in_later_calls() {
    each(|p| {
        let c = format!("{:?} {:?}", p.who, p.chain);
        let so = p.ok("set -e; echo b > a; git stash -q; echo c > a; git stash -q; git stash list");
        assert_eq!(so.lines().count(), 2, "{c}\n{so}");
        let first = p.rev("stash@{1}").expect("stash@{1} on the host");
        let second = p.rev("stash@{0}").expect("stash@{0} on the host");
        assert_ne!(first, second);
        assert_eq!(p.stash_list().len(), 2, "{c}");
        p.assert_fsck_strict(&c);
        p.assert_clean(&c);
        p.assert_reflog_event("logs/refs/stash");

        // The next call sees both, and pops the newest.
        let so = p.ok("set -e; git rev-parse stash@{0} stash@{1}; git stash pop -q; cat a");
        let mut l = so.lines();
        assert_eq!(l.next(), Some(second.as_str()), "{c}\n{so}");
        assert_eq!(l.next(), Some(first.as_str()), "{c}\n{so}");
        assert_eq!(l.next(), Some("c"), "{c}\n{so}");
        assert_eq!(p.stash_list().len(), 1, "{c}");
        assert_eq!(p.rev("refs/stash").as_deref(), Some(first.as_str()), "{c}");
        assert_eq!(std::fs::read_to_string(p.root.join("a")).unwrap(), "c\n");
        p.assert_fsck_strict(&c);

        // And the last one goes in a third call: refs/stash and its reflog.
        p.ok("set -e; git checkout -q -- a; git stash drop -q");
        assert!(p.stash_list().is_empty(), "{c}");
        assert_eq!(p.rev("refs/stash"), None, "{c}");
        assert!(!p.root.join(".git/logs/refs/stash").exists(), "{c}");
        p.assert_fsck_strict(&c);
        p.assert_clean(&c);
    });
}

impl Proj {
    fn assert_reflog_event(&self, path: &str) {
        assert_event(&self.log, "reflog_imported", "info", |e| e["path"] == path);
    }
}

#[test]
fn at_1_after_an_amend_works_in_the_next_call() {
    each(|p| {
        let c = format!("{:?} {:?}", p.who, p.chain);
        p.ok("set -e; echo x > x; git add x; git commit -qm x; git commit -q --amend -m x2");
        let before = p.rev("main@{1}").expect("main@{1} on the host");
        assert_eq!(p.git(&["log", "-1", "--format=%s", &before]).trim(), "x");
        assert_eq!(p.rev("HEAD@{1}").as_deref(), Some(before.as_str()), "{c}");
        p.assert_fsck_strict(&c);
        p.assert_clean(&c);
        p.assert_reflog_event("logs/refs/heads/main");
        p.assert_reflog_event("logs/HEAD");
        // The next call goes back to it.
        let so = p.ok("set -e; git rev-parse main@{1}; git reset -q --hard main@{1}");
        assert_eq!(so.trim(), before, "{c}");
        assert_eq!(p.rev("main").as_deref(), Some(before.as_str()), "{c}");
        p.assert_fsck_strict(&c);
        p.assert_clean(&c);
    });
}

#[test]
fn worktree_add_commit_in_it_and_remove_across_calls() {
    each(|p| {
        let c = format!("{:?} {:?}", p.who, p.chain);
        let wt = p.root.join(".wt/f2");
        p.ok("git worktree add -q .wt/f2");
        assert_eq!(p.worktrees(), vec![p.root.clone(), wt.clone()], "{c}");
        assert!(wt.join(".git").is_file(), "{c}");
        assert!(p.root.join(".git/worktrees/f2/gitdir").is_file(), "{c}");
        assert_eq!(p.rev("f2"), p.rev("main"), "{c}");
        assert_event(&p.log, "worktree_imported", "info", |e| {
            e["path"] == "worktrees/f2" && e["new"] == true
        });
        p.assert_fsck_strict(&c);
        p.assert_clean(&c);

        // Commit in it in the next call.
        let so = p.ok("set -e; cd .wt/f2; echo f > f; git add f; git commit -qm in-f2; git status --porcelain");
        assert!(so.trim().is_empty(), "{c}\n{so}");
        assert_eq!(
            p.git(&["log", "-1", "--format=%s", "f2"]).trim(),
            "in-f2",
            "{c}"
        );
        assert_eq!(
            git_ok(&wt, &["status", "--porcelain"]).trim(),
            "",
            "the worktree's index came along\n{c}"
        );
        assert_eq!(p.rev("f2@{1}"), p.rev("main"), "{c}");
        p.assert_fsck_strict(&c);

        // A call started inside the worktree (as an agent working there
        // runs): the project is the main work tree holding it.
        let out = p.call_in(
            &wt,
            "set -e; echo g > g; git add g; git commit -qm in-f2-again; git status --porcelain",
        );
        assert_eq!(out.status.code(), Some(0), "{}", p.ctx(&out));
        assert!(stdout(&out).trim().is_empty(), "{}", p.ctx(&out));
        assert_eq!(
            p.git(&["log", "-2", "--format=%s", "f2"]),
            "in-f2-again\nin-f2",
            "{c}"
        );
        assert_eq!(git_ok(&wt, &["status", "--porcelain"]).trim(), "", "{c}");
        p.assert_fsck_strict(&c);

        // Remove it in a third.
        p.ok("git worktree remove .wt/f2");
        assert_eq!(p.worktrees(), vec![p.root.clone()], "{c}");
        assert!(!wt.exists(), "{c}");
        assert!(!p.root.join(".git/worktrees/f2").exists(), "{c}");
        assert!(p.rev("f2").is_some(), "the branch stays\n{c}");
        assert_event(&p.log, "worktree_removed", "info", |e| {
            e["path"] == "worktrees/f2"
        });
        p.assert_fsck_strict(&c);
        p.assert_clean(&c);
        // Nothing in this session was taken for an attack.
        let alerts: Vec<_> = sbx_testutil::audit_events(&p.log)
            .into_iter()
            .filter(|e| e["severity"] == "alert")
            .collect();
        assert!(alerts.is_empty(), "{alerts:?}\n{c}");
    });
}

#[test]
fn a_forged_stash_reflog_is_refused() {
    each(|p| {
        let c = format!("{:?} {:?}", p.who, p.chain);
        p.ok("set -e; echo b > a; git stash -q");
        let stash = p.rev("stash@{0}").unwrap();
        let log = std::fs::read(p.root.join(".git/logs/refs/stash")).unwrap();
        let missing = "0123456789abcdef0123456789abcdef01234567";
        // An entry naming an object that does not exist.
        let out = p.call(&format!(
            "printf '{stash} {missing} a <a@b> 1700000000 +0000\\tforged\\n' >> .git/logs/refs/stash; git stash list"
        ));
        assert_eq!(out.status.code(), Some(0), "{}", p.ctx(&out));
        assert_event(&p.log, "reflog_refused", "alert", |e| {
            e["ref"] == "refs/stash" && e["reason"].as_str().unwrap_or("").contains(missing)
        });
        // An entry of 100 KB.
        let out = p.call(&format!(
            "python3 -c \"import sys; open('.git/logs/refs/stash','a').write('{stash} {stash} a <a@b> 1700000000 +0000\\t' + 'm'*100000 + '\\n')\""
        ));
        assert_eq!(out.status.code(), Some(0), "{}", p.ctx(&out));
        assert_event(&p.log, "reflog_refused", "alert", |e| {
            e["ref"] == "refs/stash"
                && e["reason"]
                    .as_str()
                    .unwrap_or("")
                    .contains("bytes (at most")
        });
        assert_eq!(
            std::fs::read(p.root.join(".git/logs/refs/stash")).unwrap(),
            log,
            "the host's reflog is kept\n{c}"
        );
        assert_eq!(p.stash_list().len(), 1, "{c}");
        assert_eq!(p.rev("refs/stash").as_deref(), Some(stash.as_str()), "{c}");
        p.assert_fsck_strict(&c);
    });
}

/// A crafted admin dir `.git/worktrees/NAME` (HEAD, commondir, and the
/// given gitdir and extra files), made by hand inside.
fn craft(name: &str, gitdir: &str, extra: &str) -> String {
    format!(
        "set -e; d=.git/worktrees/{name}; mkdir -p $d; echo 'ref: refs/heads/main' > $d/HEAD; \
         echo ../.. > $d/commondir; echo \"{gitdir}\" > $d/gitdir; {extra} echo CRAFTED"
    )
}

#[test]
fn worktree_admin_dirs_pointing_outside_or_running_programs_are_refused() {
    each(|p| {
        let c = format!("{:?} {:?}", p.who, p.chain);
        let home = p.home.display().to_string();
        let mark = p.base.join("MARK");
        let m = mark.display();
        let cases: Vec<(&str, String, &str)> = vec![
            ("etc", craft("etc", "/etc/.git", ""), "outside the project"),
            (
                "home",
                craft("home", &format!("{home}/w/.git"), ""),
                "outside the project",
            ),
            (
                "f3",
                format!(
                    "set -e; git worktree add -q .wt/f3; printf '[core]\\n\\tfsmonitor = touch {m}\\n' > .git/worktrees/f3/config.worktree; echo CRAFTED"
                ),
                "core.fsmonitor",
            ),
            (
                "f4",
                format!(
                    "set -e; git worktree add -q .wt/f4; printf '[core]\\n\\thooksPath = {m}\\n' > .git/worktrees/f4/config.worktree; echo CRAFTED"
                ),
                "core.hookspath",
            ),
            (
                "f5",
                "set -e; git worktree add -q .wt/f5; mkdir .git/worktrees/f5/hooks; echo CRAFTED"
                    .to_string(),
                "hooks",
            ),
            // Keys no denylist knew (an attacker's pass found them): only
            // the sparse-checkout keys are accepted.
            (
                "f6",
                format!(
                    "set -e; git worktree add -q .wt/f6; printf '[gpg \"ssh\"]\n\tdefaultKeyCommand = touch {m}\n[tar \"tgz\"]\n\tcommand = touch {m}\n' > .git/worktrees/f6/config.worktree; echo CRAFTED"
                ),
                "gpg.ssh.defaultkeycommand",
            ),
        ];
        for (name, script, reason) in cases {
            let out = p.call(&script);
            assert!(stdout(&out).contains("CRAFTED"), "{name}: {}", p.ctx(&out));
            assert_event(&p.log, "worktree_refused", "alert", |e| {
                e["path"] == format!("worktrees/{name}").as_str()
                    && e["reason"]
                        .as_str()
                        .unwrap_or("")
                        .to_lowercase()
                        .contains(reason)
            });
            assert!(
                !p.root.join(".git/worktrees").join(name).exists(),
                "{name}\n{c}"
            );
            // Its .git file in the project (when git made one) is gone too.
            let gitfile = p.root.join(".wt").join(name).join(".git");
            assert!(!gitfile.exists(), "{name}\n{c}");
            assert_eq!(p.worktrees(), vec![p.root.clone()], "{name}\n{c}");
        }
        // The owner's git in the project runs nothing planted.
        for d in [p.root.clone(), p.root.join(".wt/f3")] {
            let _ = git_out(&d, &["status"]);
        }
        assert!(!mark.exists(), "{c}");
        p.assert_fsck_strict(&c);
    });
}

#[test]
fn a_git_file_naming_a_crafted_admin_dir_is_removed() {
    each(|p| {
        let c = format!("{:?} {:?}", p.who, p.chain);
        let root = p.root.display().to_string();
        let mark = p.base.join("MARK");
        // An admin dir that points back at sub/ (so the link is mutual),
        // but carries an fsmonitor.
        let script = craft(
            "evil",
            &format!("{root}/sub/.git"),
            &format!(
                "mkdir -p sub; echo 'gitdir: {root}/.git/worktrees/evil' > sub/.git; \
                 printf '[core]\\n\\tfsmonitor = touch {}\\n' > $d/config.worktree;",
                mark.display()
            ),
        );
        let out = p.call(&script);
        assert!(stdout(&out).contains("CRAFTED"), "{}", p.ctx(&out));
        assert_event(&p.log, "worktree_refused", "alert", |e| {
            e["path"] == "worktrees/evil"
                && e["reason"]
                    .as_str()
                    .unwrap_or("")
                    .contains("core.fsmonitor")
        });
        let gitfile = p.root.join("sub/.git");
        assert!(!gitfile.exists(), "{c}");
        assert_event(&p.log, "git_integrity", "alert", |e| {
            e["check"] == "bare_repo" && e["path"] == gitfile.to_str().unwrap()
        });
        assert!(!p.root.join(".git/worktrees/evil").exists(), "{c}");
        let _ = git_out(&p.root.join("sub"), &["status"]);
        assert!(!mark.exists(), "{c}");
        p.assert_fsck_strict(&c);
    });
}

#[test]
fn a_worktree_outside_the_project_never_reaches_the_host() {
    each(|p| {
        let c = format!("{:?} {:?}", p.who, p.chain);
        let out = p.call("git worktree add -q ../wt-x && echo ADDED");
        let outside = p.base.join("wt-x");
        // Where the sandbox can write there (a private /tmp), git makes it
        // and the import refuses its admin dir; elsewhere git fails.
        if stdout(&out).contains("ADDED") {
            assert_event(&p.log, "worktree_refused", "alert", |e| {
                e["path"] == "worktrees/wt-x"
                    && e["reason"]
                        .as_str()
                        .unwrap_or("")
                        .contains("outside the project")
            });
        }
        assert!(!p.root.join(".git/worktrees/wt-x").exists(), "{c}");
        assert!(!outside.join(".git").exists(), "{c}");
        assert_eq!(p.worktrees(), vec![p.root.clone()], "{c}");
        p.assert_fsck_strict(&c);
    });
}

/// The sandbox may add reflog entries, never take the host's away: they
/// are how the user gets lost work back (an attacker's pass erased them
/// with a forged one-line reflog).
#[test]
fn the_hosts_reflog_history_cannot_be_erased() {
    each(|p| {
        let c = format!("{:?} {:?}", p.who, p.chain);
        p.ok("set -e; git commit -q --allow-empty -m two; git commit -q --allow-empty -m three");
        let before = p.git(&["reflog", "show", "--format=%H", "main"]);
        assert_eq!(before.lines().count(), 3, "{c}\n{before}");
        p.ok("set -e; git reflog expire --expire=now --all; git commit -q --allow-empty -m four");
        let after = p.git(&["reflog", "show", "--format=%H", "main"]);
        assert_eq!(after.lines().count(), 4, "{c}\n{after}");
        assert!(after.ends_with(&before), "{c}\n{before}\n{after}");
        assert_event(&p.log, "reflog_history_kept", "alert", |e| {
            e["ref"] == "refs/heads/main"
        });
        p.assert_fsck_strict(&c);
    });
}
