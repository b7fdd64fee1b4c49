//! Never revert good work, never keep bad state (issue 14): scenarios of
//! git's corruption tests (t1450-fsck, t1060-object-corruption,
//! t1400-update-ref, t1410-reflog, t1430-bad-ref-name) and the seed's repair
//! demands, between turns (`snapshot` / `check` / `repair`) and under `run`.
//! Each ends repaired to what `git fsck --full --strict` accepts with the
//! snapshot's refs plus the legitimate new work, or refused with a clear
//! reason; and each asserts its alert. Every run is bounded in time.

mod common;

use std::path::PathBuf;

use common::Fixture;
use sbx_testutil::{As, assert_event, code, identities, stderr, stdout};

fn user_first() -> As {
    *identities().last().unwrap()
}

const T: u64 = 60;

fn w(f: &Fixture) -> &str {
    f.w.to_str().unwrap()
}

fn snap(f: &Fixture) -> String {
    let s = f.dir.join("snap.json").to_str().unwrap().to_string();
    let out = f.guard_within(T, &["snapshot", "--repo", w(f), "-o", &s]);
    assert_eq!(code(&out), 0, "snapshot: {}", stderr(&out));
    s
}

fn repair(f: &Fixture, s: &str) -> std::process::Output {
    f.guard_within(T, &["repair", "--repo", w(f), "--against", s])
}

fn sh_ok(f: &Fixture, script: &str) -> String {
    let o = f.sh(&f.w, script);
    assert!(
        o.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `git fsck --full --strict` accepts the repository.
fn assert_strict_fsck(f: &Fixture) {
    let o = f.git(&f.w, &["fsck", "--full", "--strict", "--no-dangling"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && !err.contains("error") && !err.contains("missing"),
        "fsck --strict: {err}"
    );
    f.assert_fsck_clean();
}

fn loose_path(f: &Fixture, id: &str) -> PathBuf {
    f.w.join(".git/objects").join(&id[..2]).join(&id[2..])
}

fn rev(f: &Fixture, r: &str) -> String {
    f.git_ok(&f.w, &["rev-parse", r]).trim().to_string()
}

fn found(e: &serde_json::Value) -> &str {
    e["found"].as_str().unwrap_or("")
}

/// The four kinds of loose-object damage of t1060/t1450, each written as a
/// new file (objects are read-only): a flipped byte, a truncation, bytes
/// after the zlib stream, another object's file under this name.
fn damage_script(kind: &str, p: &std::path::Path, other: &std::path::Path) -> String {
    let p = p.display();
    match kind {
        "bit" => format!(
            "python3 -c 'import sys;b=bytearray(open(sys.argv[1],\"rb\").read());b[len(b)//2]^=0x10;open(\"t\",\"wb\").write(b)' {p} && chmod 444 t && mv -f t {p}"
        ),
        "truncate" => format!("head -c 30 {p} > t && chmod 444 t && mv -f t {p}"),
        "trailing" => format!("cat {p} > t && printf garbage >> t && chmod 444 t && mv -f t {p}"),
        "swap" => format!("cp {} t && chmod 444 t && mv -f t {p}", other.display()),
        _ => unreachable!(),
    }
}

#[test]
fn loose_object_damage_is_detected_between_turns_and_linked_back_under_run() {
    let f = Fixture::new(user_first());
    let tip = rev(&f, "main");
    let tree = rev(&f, "main^{tree}");
    let (pt, ptree) = (loose_path(&f, &tip), loose_path(&f, &tree));
    assert!(pt.is_file() && ptree.is_file());
    let pristine = f.dir.join("pristine");
    std::fs::copy(&pt, &pristine).unwrap();
    let before = f.state();
    for kind in ["bit", "truncate", "trailing", "swap"] {
        // Between turns: check names the object; repair cannot make one up
        // and says so (exit 125) without moving any ref.
        let s = snap(&f);
        sh_ok(&f, &damage_script(kind, &pt, &ptree));
        let out = f.guard_within(T, &["check", "--repo", w(&f), "--against", &s]);
        assert_eq!(code(&out), 1, "{kind}: {}", stdout(&out));
        assert!(stdout(&out).contains(&tip), "{kind}: {}", stdout(&out));
        let out = repair(&f, &s);
        assert_eq!(code(&out), 125, "{kind}: {}", stdout(&out));
        assert!(stderr(&out).contains(&tip), "{kind}: {}", stderr(&out));
        assert_eq!(rev(&f, "main"), tip, "{kind}: a ref moved");
        sh_ok(
            &f,
            &format!(
                "cp {} t && chmod 444 t && mv -f t {}",
                pristine.display(),
                pt.display()
            ),
        );
        assert_strict_fsck(&f);
        // Under run: the replaced file comes back from the kept links.
        let out = f.run_within(T, &[], &damage_script(kind, &pt, &ptree));
        assert_eq!(code(&out), 0, "{kind}: {}", stderr(&out));
        assert_eq!(f.state(), before, "{kind}");
        assert_strict_fsck(&f);
        assert_event(&f.audit, "git_integrity", "alert", |e| {
            found(e).contains(&tip) && e["action"].as_str().unwrap_or("").starts_with("restored")
        });
    }
}

#[test]
fn a_damaged_snapshot_tip_never_makes_a_legitimate_commit_a_rewrite() {
    for who in identities() {
        let f = Fixture::new(who);
        let tip = rev(&f, "main");
        let pt = loose_path(&f, &tip);
        let s = snap(&f);
        // The agent's legitimate commit, then the old tip damaged.
        sh_ok(&f, "echo d > d && git add d && git commit -qm legit");
        let legit = rev(&f, "main");
        sh_ok(
            &f,
            &format!(
                "head -c 30 {p} > t && chmod 444 t && mv -f t {p}",
                p = pt.display()
            ),
        );
        let out = repair(&f, &s);
        // The lost object cannot be made up: refused, named; and main stays
        // on the legitimate commit (never put back onto the corrupt one).
        assert_eq!(code(&out), 125, "{}", stdout(&out));
        assert!(stderr(&out).contains(&tip), "{}", stderr(&out));
        assert_eq!(rev(&f, "main"), legit);
        assert_event(&f.audit, "git_integrity", "info", |e| {
            found(e).contains("refs/heads/main moved forward")
        });
        // Under run, the damaged file is linked back and the work kept.
        let f = Fixture::new(who);
        let tip = rev(&f, "main");
        let pt = loose_path(&f, &tip);
        let out = f.run_within(
            T,
            &[],
            &format!(
                "echo d > d && git add d && git commit -qm legit && head -c 30 {p} > t && chmod 444 t && mv -f t {p}",
                p = pt.display()
            ),
        );
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let log = f.git_ok(&f.w, &["log", "--format=%s", "-2", "main"]);
        assert_eq!(log, "legit\nthree\n");
        assert_strict_fsck(&f);
        assert_event(&f.audit, "git_integrity", "alert", |e| {
            found(e).contains(&tip) && e["action"].as_str().unwrap_or("").starts_with("restored")
        });
    }
}

#[test]
fn head_deleted_or_made_a_directory_between_turns_is_restored() {
    for who in identities() {
        let f = Fixture::new(who);
        let before = f.state();
        for script in [
            "rm .git/HEAD",
            "rm .git/HEAD && mkdir .git/HEAD && touch .git/HEAD/x",
        ] {
            let s = snap(&f);
            sh_ok(&f, script);
            let out = f.guard_within(T, &["check", "--repo", w(&f), "--against", &s]);
            assert_eq!(code(&out), 1, "{script}: {}{}", stdout(&out), stderr(&out));
            let out = repair(&f, &s);
            assert_eq!(code(&out), 0, "{script}: {}{}", stdout(&out), stderr(&out));
            assert!(f.w.join(".git/HEAD").is_file());
            assert_eq!(f.state(), before, "{script}");
            assert_strict_fsck(&f);
            assert_event(&f.audit, "git_integrity", "alert", |e| e["check"] == "head");
        }
    }
}

#[test]
fn refs_directory_removed_is_restored_between_turns_and_under_run() {
    for who in identities() {
        let f = Fixture::new(who);
        let before = f.state();
        let refs_before = f.git_ok(&f.w, &["show-ref"]);
        let s = snap(&f);
        sh_ok(&f, "rm -rf .git/refs");
        let out = repair(&f, &s);
        assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
        assert_eq!(f.git_ok(&f.w, &["show-ref"]), refs_before);
        assert_eq!(f.state(), before);
        assert_strict_fsck(&f);
        assert_event(&f.audit, "git_integrity", "alert", |e| {
            found(e).contains("refs/ directory removed")
        });
        let out = f.run_within(T, &[], "rm -rf .git/refs");
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert_eq!(f.git_ok(&f.w, &["show-ref"]), refs_before);
        assert_eq!(f.state(), before);
        assert_strict_fsck(&f);
    }
}

#[test]
fn objects_directory_removed_under_run_is_linked_back_and_refused_between_turns() {
    for who in identities() {
        let f = Fixture::new(who);
        let before = f.state();
        let out = f.run_within(T, &[], "rm -rf .git/objects");
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert_eq!(f.state(), before);
        assert_strict_fsck(&f);
        assert_event(&f.audit, "git_integrity", "alert", |e| {
            found(e).contains("objects/ directory removed")
        });
        // Between turns nothing holds the objects: refused, with the reason.
        let s = snap(&f);
        sh_ok(
            &f,
            "cp -a .git/objects ../objects-copy && rm -rf .git/objects",
        );
        let out = repair(&f, &s);
        assert_eq!(code(&out), 125, "{}", stdout(&out));
        let err = stderr(&out);
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains("gone") || err.contains("missing"), "{err}");
        sh_ok(&f, "rm -rf .git/objects && mv ../objects-copy .git/objects");
    }
}

#[test]
fn a_new_ref_to_a_tree_or_a_missing_object_is_removed() {
    for who in identities() {
        let f = Fixture::new(who);
        let before = f.state();
        let script = "git rev-parse HEAD^{tree} > .git/refs/heads/treeish && echo 1234567890123456789012345678901234567890 > .git/refs/heads/ghost && echo 1234567890123456789012345678901234567891 > .git/refs/tags/ghost";
        let out = f.run_within(T, &[], script);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert_eq!(f.state(), before);
        assert_strict_fsck(&f);
        for r in ["refs/heads/treeish", "refs/heads/ghost", "refs/tags/ghost"] {
            assert_event(&f.audit, "git_integrity", "alert", |e| {
                found(e).contains(r) && e["action"] == "removed"
            });
        }
        // Between turns too.
        let s = snap(&f);
        sh_ok(&f, script);
        let out = repair(&f, &s);
        assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
        assert_eq!(f.state(), before);
        assert_strict_fsck(&f);
    }
}

#[test]
fn a_planted_index_lock_does_not_save_the_hook_beside_it() {
    for who in identities() {
        let f = Fixture::new(who);
        let s = snap(&f);
        sh_ok(
            &f,
            "touch .git/index.lock && printf '#!/bin/sh\\ntouch $MARK\\n' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit",
        );
        let out = f.guard_within(
            T,
            &[
                "repair",
                "--repo",
                w(&f),
                "--against",
                &s,
                "--lock-wait",
                "200ms",
            ],
        );
        assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
        assert!(!f.w.join(".git/hooks/pre-commit").exists());
        assert!(!f.w.join(".git/index.lock").exists());
        f.assert_nothing_runs();
        sh_ok(&f, "git commit -q --allow-empty -m after");
        assert!(!f.mark.exists());
        assert_event(&f.audit, "git_integrity", "alert", |e| {
            e["check"] == "locks"
        });
        assert_event(&f.audit, "git_integrity", "alert", |e| {
            e["check"] == "hooks" && e["action"] == "removed"
        });
    }
}

#[test]
fn a_loose_ref_made_a_symlink_outside_is_refused_and_the_link_removed() {
    for who in identities() {
        let f = Fixture::new(who);
        let before = f.state();
        // A real descendant of main, named through a file outside the
        // repository.
        let out = f.run_within(
            T,
            &[],
            "c=$(git commit-tree -p main -m fwd main^{tree}) && echo $c > ../outside && ln -sfn ../../../../outside .git/refs/heads/main && git rev-parse main",
        );
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let m = std::fs::symlink_metadata(f.w.join(".git/refs/heads/main")).unwrap();
        assert!(m.is_file(), "the symlink stayed");
        assert_eq!(f.state(), before);
        assert_strict_fsck(&f);
        assert_event(&f.audit, "git_integrity", "alert", |e| {
            found(e).contains("refs/heads/main") && found(e).contains("symlink")
        });
    }
}

#[test]
fn an_unsorted_packed_refs_under_a_sorted_header_is_repaired() {
    for who in identities() {
        let f = Fixture::new(who);
        let before = f.state();
        let s = snap(&f);
        // Swap two entries (git would bisect past one of them).
        sh_ok(
            &f,
            "{ head -1 .git/packed-refs; tail -n +2 .git/packed-refs | grep -v '^\\^' | sort -r; } > t && mv t .git/packed-refs",
        );
        let out = f.guard_within(T, &["check", "--repo", w(&f), "--against", &s]);
        assert_eq!(code(&out), 1, "{}", stdout(&out));
        assert!(stdout(&out).contains("out of order"), "{}", stdout(&out));
        let out = repair(&f, &s);
        assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
        assert_eq!(f.state(), before);
        assert_strict_fsck(&f);
        assert_event(&f.audit, "git_integrity", "alert", |e| {
            found(e).contains("out of order")
        });
        // A snapshot of such a repository is refused (git would not see a
        // branch).
        sh_ok(
            &f,
            "{ head -1 .git/packed-refs; tail -n +2 .git/packed-refs | grep -v '^\\^' | sort -r; } > t && mv t .git/packed-refs",
        );
        let out = f.guard_within(
            T,
            &[
                "snapshot",
                "--repo",
                w(&f),
                "-o",
                f.dir.join("s2").to_str().unwrap(),
            ],
        );
        assert_eq!(code(&out), 125);
        assert!(stderr(&out).contains("out of order"), "{}", stderr(&out));
    }
}

#[test]
fn files_planted_in_objects_logs_worktrees_and_modules_are_removed() {
    for who in identities() {
        let f = Fixture::new(who);
        let before = f.state();
        let planted = [
            ".git/objects/evil.sh",
            ".git/objects/pack/evil",
            ".git/objects/info/evil",
            ".git/logs/evil",
            ".git/worktrees/wt/evil",
            ".git/worktrees/evil",
            ".git/modules/evil",
            ".git/modules/sub/evil",
        ];
        let script: String = planted
            .iter()
            .map(|p| format!("printf '#!/bin/sh\\ntouch $MARK\\n' > {p} && chmod +x {p} && "))
            .collect::<String>()
            + "true";
        let out = f.run_within(T, &[], &script);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        for p in planted {
            assert!(!f.w.join(p).exists(), "{p} stayed");
            assert_event(&f.audit, "git_integrity", "alert", |e| {
                e["path"]
                    .as_str()
                    .unwrap_or("")
                    .ends_with(p.trim_start_matches(".git/"))
            });
        }
        assert_eq!(f.state(), before);
        assert_strict_fsck(&f);
    }
}

#[test]
fn a_planted_rebase_with_an_exec_line_is_removed() {
    for who in identities() {
        let f = Fixture::new(who);
        let before = f.state();
        let out = f.run_within(
            T,
            &[],
            "mkdir -p .git/rebase-merge && echo 'exec touch $MARK' > .git/rebase-merge/git-rebase-todo && git rev-parse HEAD > .git/rebase-merge/orig-head && echo refs/heads/main > .git/rebase-merge/head-name && git rev-parse HEAD > .git/rebase-merge/onto && touch .git/rebase-merge/interactive",
        );
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(!f.w.join(".git/rebase-merge").exists());
        let _ = f.git(&f.w, &["rebase", "--continue"]);
        assert!(!f.mark.exists(), "the exec line ran");
        assert_eq!(f.state(), before);
        assert_event(&f.audit, "git_integrity", "alert", |e| {
            found(e).contains("exec")
        });
    }
}

#[test]
fn a_linked_worktrees_git_file_pointed_at_another_repository_is_reported_and_restored() {
    for who in identities() {
        let f = Fixture::new(who);
        let before = f.state();
        let wt = f.dir.join("wt");
        let gitfile_before = std::fs::read_to_string(wt.join(".git")).unwrap();
        let out = f.run_within(
            T,
            &[],
            "git init -q ../other && git -C ../other config alias.st '!touch $MARK' && echo \"gitdir: $D/other/.git\" > ../wt/.git",
        );
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert_eq!(
            std::fs::read_to_string(wt.join(".git")).unwrap(),
            gitfile_before
        );
        let _ = f.git(&wt, &["st"]);
        assert!(!f.mark.exists(), "the other repository's alias ran");
        assert_eq!(f.state(), before);
        assert_event(&f.audit, "git_integrity", "alert", |e| {
            e["path"].as_str().unwrap_or("").ends_with("wt/.git")
        });
    }
}

#[test]
fn refs_with_names_git_refuses_are_removed() {
    for who in identities() {
        let f = Fixture::new(who);
        let before = f.state();
        let main = rev(&f, "main");
        // t1430-bad-ref-name: names check-ref-format refuses, written as
        // files the way a tool that does not check would.
        let names = [
            "refs/heads/.hidden",
            "refs/heads/a..b",
            "refs/heads/x@{1}",
            "refs/heads/sp ace",
            "refs/tags/trail.",
        ];
        let script: String = names
            .iter()
            .map(|n| format!("printf '{main}\\n' > '.git/{n}' && "))
            .collect::<String>()
            + "true";
        let out = f.run_within(T, &[], &script);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        for n in names {
            assert!(!f.w.join(".git").join(n).exists(), "{n} stayed");
            assert_event(&f.audit, "git_integrity", "alert", |e| {
                found(e).contains(n) && found(e).contains("not a valid ref name")
            });
        }
        assert_eq!(f.state(), before);
        assert_strict_fsck(&f);
    }
}

#[test]
fn pack_files_replaced_truncated_or_deleted_under_run_are_linked_back() {
    // t5303-pack-corruption-resilience: a pack truncated, its index gone.
    for who in identities() {
        let f = Fixture::new(who);
        let before = f.state();
        let out = f.run_within(
            T,
            &[],
            "p=$(ls .git/objects/pack/*.pack | head -1) && head -c 100 $p > t && chmod 444 t && mv -f t $p && rm -f .git/objects/pack/*.idx",
        );
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert_eq!(f.state(), before);
        assert_strict_fsck(&f);
        assert_event(&f.audit, "git_integrity", "alert", |e| {
            e["check"] == "objects" && e["action"].as_str().unwrap_or("").starts_with("restored")
        });
    }
}
