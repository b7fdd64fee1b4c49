//! Legitimate work is kept, damage is reported, bad input is one line and
//! exit 125, and the snapshot/check/repair commands work on their own.

mod common;

use std::os::unix::fs::PermissionsExt;

use common::Fixture;
use sbx_testutil::{As, assert_event, assert_usage_error, code, identities, stderr, stdout};

fn user_first() -> As {
    *identities().last().unwrap()
}

#[test]
fn legitimate_commits_and_branches_are_kept() {
    for who in identities() {
        let f = Fixture::new(who);
        let old_main = f.git_ok(&f.w, &["rev-parse", "main"]);
        let out = f.run(&[], "echo d > d && git add d && git commit -qm four && git checkout -qb topic && git commit -q --allow-empty -m five && git checkout -q main && git tag v3 && mkdir newdir && echo x > newdir/file");
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let log = f.git_ok(&f.w, &["log", "--oneline", "--all"]);
        assert!(log.contains("four") && log.contains("five"), "{log}");
        let new_main = f.git_ok(&f.w, &["rev-parse", "main"]);
        assert_ne!(old_main, new_main);
        assert_eq!(f.git_ok(&f.w, &["status", "--porcelain"]), "?? newdir/\n");
        assert_eq!(
            std::fs::read_to_string(f.w.join("newdir/file")).unwrap(),
            "x\n"
        );
        f.assert_fsck_clean();
        assert_event(&f.audit, "git_integrity", "info", |e| {
            e["check"] == "refs"
                && e["found"]
                    .as_str()
                    .unwrap()
                    .contains("refs/heads/main moved forward")
                && e["action"].as_str().unwrap().starts_with("kept")
        });
        assert_event(&f.audit, "git_integrity", "warn", |e| {
            e["found"]
                .as_str()
                .unwrap()
                .contains("refs/heads/topic added")
        });
        // Nothing was alerted.
        let alerts = sbx_testutil::audit_events(&f.audit)
            .into_iter()
            .filter(|e| e["event"] == "git_integrity" && e["severity"] == "alert")
            .count();
        assert_eq!(alerts, 0);
    }
}

#[test]
fn rewritten_branch_is_restored_and_the_rewrite_named() {
    let f = Fixture::new(user_first());
    let old = f.git_ok(&f.w, &["rev-parse", "main"]);
    let out = f.run(
        &[],
        "git reset -q --soft HEAD~1 && git commit -qm 'three amended'",
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(f.git_ok(&f.w, &["rev-parse", "main"]), old);
    let e = assert_event(&f.audit, "git_integrity", "alert", |e| e["check"] == "refs");
    assert!(e["found"].as_str().unwrap().contains("rewritten"), "{e}");
}

#[test]
fn exit_status_passes_through() {
    let f = Fixture::new(user_first());
    assert_eq!(code(&f.run(&[], "exit 7")), 7);
    assert_eq!(code(&f.run(&[], "kill -TERM $$")), 128 + 15);
    let out = f.guard(&[
        "run",
        "--repo",
        f.w.to_str().unwrap(),
        "--",
        "/nonexistent/cmd",
    ]);
    assert_eq!(code(&out), 127);
}

#[test]
fn alert_only_reports_and_changes_nothing() {
    let f = Fixture::new(user_first());
    let out = f.run(
        &["--alert-only"],
        "git config core.fsmonitor \"touch $MARK\"; exit 3",
    );
    assert_eq!(code(&out), 3);
    assert!(
        f.git_ok(&f.w, &["config", "core.fsmonitor"])
            .contains("touch")
    );
    let e = assert_event(&f.audit, "git_integrity", "alert", |e| {
        e["check"] == "config"
    });
    assert!(e["action"].as_str().unwrap().contains("alert-only"));
}

#[test]
fn objects_deleted_by_the_command_are_linked_back() {
    for who in identities() {
        let f = Fixture::new(who);
        let before = f.state();
        let (blob, _) = loose_path(&f, "HEAD:c");
        // Every object of the repository, loose and packed.
        let out = f.run(
            &[],
            "chmod -R u+w .git/objects && rm -rf .git/objects/pack .git/objects/[0-9a-f][0-9a-f]",
        );
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert_eq!(f.state(), before);
        f.assert_fsck_clean();
        let e = assert_event(&f.audit, "git_integrity", "alert", |e| {
            e["check"] == "objects"
        });
        assert!(e["action"].as_str().unwrap().starts_with("restored"), "{e}");
        assert_eq!(e["unrecoverable"], false);
        f.git_ok(&f.w, &["cat-file", "-e", &blob]);
        // The links are gone with the run.
        let left = f
            .sh(&f.w, "ls -a .git | grep -c sbx-gitguard || true")
            .stdout;
        assert_eq!(String::from_utf8_lossy(&left).trim(), "0");
    }
}

#[test]
fn objects_lost_without_kept_links_are_reported_precisely() {
    // `repair` between turns has no links to the objects: a deleted object
    // is reported with what needed it, and the repair fails.
    let f = Fixture::new(user_first());
    let w = f.w.to_str().unwrap();
    let snap = f.dir.join("s.json");
    assert_eq!(
        code(&f.guard(&["snapshot", "--repo", w, "-o", snap.to_str().unwrap()])),
        0
    );
    let (blob, path) = loose_path(&f, "HEAD:c");
    std::fs::remove_file(path).unwrap();
    let out = f.guard(&["repair", "--repo", w, "--against", snap.to_str().unwrap()]);
    assert_usage_error(&out, "could not be brought back");
    let e = assert_event(&f.audit, "git_integrity", "alert", |e| {
        let t = e["found"].as_str().unwrap();
        e["check"] == "objects" && t.contains(&blob) && t.contains("missing")
    });
    // Precisely: which blob, in which tree entry, from which ref.
    let t = e["found"].as_str().unwrap();
    assert!(
        t.contains("entry 'c'") && t.contains("refs/heads/main"),
        "{e}"
    );
    assert_eq!(e["unrecoverable"], true);
}

#[test]
fn corrupted_pack_is_detected() {
    let f = Fixture::new(user_first());
    let out = f.run(&[], "p=$(ls .git/objects/pack/*.pack | head -1) && chmod u+w $p && printf 'XXXX' | dd of=$p bs=1 seek=40 conv=notrunc 2>/dev/null");
    assert_usage_error(&out, "could not be brought back");
    assert_event(&f.audit, "git_integrity", "alert", |e| {
        e["check"] == "objects" && e["found"].as_str().unwrap().contains("checksum")
    });
}

fn loose_path(f: &Fixture, rev: &str) -> (String, std::path::PathBuf) {
    let oid = f.git_ok(&f.w, &["rev-parse", rev]).trim().to_string();
    let p =
        f.w.join(format!(".git/objects/{}/{}", &oid[..2], &oid[2..]));
    assert!(p.exists(), "fixture: {rev} should be a loose object");
    (oid, p)
}

fn damaged_before(who: As, rev: &str, extra: &[&str]) {
    let f = Fixture::new(who);
    let (oid, p) = loose_path(&f, rev);
    std::fs::remove_file(p).unwrap();
    let listing = |f: &Fixture| f.sh(&f.w, "find .git -printf '%p %s %m\\n' | sort").stdout;
    let before = listing(&f);
    let out = f.run(extra, "touch \"$MARK\"");
    assert_usage_error(&out, "already damaged");
    assert!(!f.mark.exists(), "the command ran on a damaged repository");
    assert_eq!(listing(&f), before, "the damaged repository was changed");
    assert_event(&f.audit, "git_damaged_before", "alert", |e| {
        e["found"].as_str().unwrap().contains(&oid)
    });
    let mut args = vec!["check", "--repo", f.w.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = f.guard(&args);
    assert_eq!(code(&out), 1);
    assert!(stdout(&out).contains(&oid));
}

#[test]
fn damaged_before_is_reported_not_repaired() {
    for who in identities() {
        // The branch tip is gone: the structural check sees it.
        damaged_before(who, "HEAD", &[]);
        // A blob is gone: the full check (--full) sees it.
        damaged_before(who, "HEAD:c", &["--full"]);
    }
}

#[test]
fn not_a_repository() {
    let f = Fixture::new(user_first());
    let d = f.dir.join("plain");
    std::fs::create_dir(&d).unwrap();
    sbx_testutil::chown_to_test_user(&d);
    let out = f.guard(&["run", "--repo", d.to_str().unwrap(), "--", "true"]);
    assert_usage_error(&out, "not a git repository");
    let out = f.guard(&["check", "--repo", "/nonexistent/x"]);
    assert_usage_error(&out, "no such directory");
}

#[test]
fn snapshot_check_repair_between_turns() {
    for who in identities() {
        let f = Fixture::new(who);
        let w = f.w.to_str().unwrap();
        let snap = f.dir.join("snap.json");
        let s = snap.to_str().unwrap();
        let out = f.guard(&["snapshot", "--repo", w, "-o", s]);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert_eq!(
            std::fs::metadata(&snap).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let before = f.state();
        // A clean check.
        let out = f.guard(&["check", "--repo", w, "--against", s, "--full", "--json"]);
        assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
        let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
        assert_eq!(v["ok"], true);
        assert_eq!(v["full_check"], true);
        // The agent's turn.
        let o = f.sh(&f.w, "git config core.fsmonitor \"touch $MARK\" && printf '#!/bin/sh\\ntouch %s\\n' \"$MARK\" > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit && git branch -D feat >/dev/null");
        assert!(o.status.success());
        let out = f.guard(&["check", "--repo", w, "--against", s, "--json"]);
        assert_eq!(code(&out), 1);
        let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
        assert_eq!(v["ok"], false);
        let checks: Vec<&str> = v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["check"].as_str().unwrap())
            .collect();
        for c in ["config", "hooks", "refs"] {
            assert!(checks.contains(&c), "{c} missing in {v}");
        }
        // check changed nothing.
        assert!(
            f.git_ok(&f.w, &["config", "core.fsmonitor"])
                .contains("touch")
        );
        std::fs::remove_file(&f.mark).ok();
        let out = f.guard(&["repair", "--repo", w, "--against", s]);
        assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
        assert_eq!(f.state(), before);
        f.assert_fsck_clean();
        f.assert_nothing_runs();
        let out = f.guard(&["check", "--repo", w, "--against", s]);
        assert_eq!(code(&out), 0, "{}", stdout(&out));
    }
}

#[test]
fn bad_snapshots_are_refused() {
    let f = Fixture::new(user_first());
    let w = f.w.to_str().unwrap();
    let out = f.guard(&[
        "repair",
        "--repo",
        w,
        "--against",
        f.dir.join("none.json").to_str().unwrap(),
    ]);
    assert_usage_error(&out, "cannot read snapshot");
    let junk = f.dir.join("junk.json");
    std::fs::write(&junk, "{\"hello\": 1}").unwrap();
    let out = f.guard(&["repair", "--repo", w, "--against", junk.to_str().unwrap()]);
    assert_usage_error(&out, "not an sbx-gitguard snapshot");
    // A snapshot of another repository.
    let other = f.dir.join("lib");
    let snap = f.dir.join("lib.json");
    let out = f.guard(&[
        "snapshot",
        "--repo",
        other.to_str().unwrap(),
        "-o",
        snap.to_str().unwrap(),
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let listing = f.sh(&f.w, "find . -printf '%p %s\\n' | sort").stdout;
    let out = f.guard(&["repair", "--repo", w, "--against", snap.to_str().unwrap()]);
    assert_usage_error(&out, "another repository");
    let out = f.guard(&["check", "--repo", w, "--against", snap.to_str().unwrap()]);
    assert_usage_error(&out, "another repository");
    assert_eq!(
        f.sh(&f.w, "find . -printf '%p %s\\n' | sort").stdout,
        listing,
        "a refused repair changed files"
    );
}

/// A snapshot file is believed only with its MAC (snapmac.rs): one that
/// names paths outside the repository (`../`, absolute, an included
/// config anywhere) was made to write or remove files there as the caller.
/// Each forgery is one line, 125, a `setup_failed` event, and nothing is
/// written; the sealed original still repairs.
#[test]
fn a_forged_snapshot_is_refused_before_any_path_in_it_is_used() {
    for who in sbx_testutil::identities() {
        let f = Fixture::new(who);
        let w = f.w.to_str().unwrap();
        let snap = f.dir.join("s.json");
        let out = f.guard(&["snapshot", "--repo", w, "-o", snap.to_str().unwrap()]);
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        let sealed = std::fs::read_to_string(&snap).unwrap();
        let (body, mac) = sealed.trim_end().rsplit_once('\n').unwrap();
        assert!(mac.starts_with("{\"mac\":\""), "{who:?}: {mac}");
        let mut v: serde_json::Value = serde_json::from_str(body).unwrap();
        let outside = f.dir.join("PWNED");
        let file =
            serde_json::json!({"kind": "file", "mode": 420, "uid": 0, "gid": 0, "text": "x"});
        v["units"][0]["files"]["../../PWNED"] = file.clone();
        v["units"][0]["files"][outside.to_str().unwrap()] = file;
        let forged = serde_json::to_string(&v).unwrap();
        let cases = [
            ("the old MAC kept", format!("{forged}\n{mac}\n")),
            ("no MAC", forged.clone()),
            (
                "a MAC made up",
                format!("{forged}\n{{\"mac\":\"{}\"}}\n", "0".repeat(64)),
            ),
        ];
        for (what, text) in cases {
            let bad = f.dir.join("forged.json");
            std::fs::write(&bad, text).unwrap();
            sbx_testutil::chown_to_test_user(&bad);
            let listing = f.sh(&f.w, "find . -printf '%p %s\\n' | sort").stdout;
            for sub in ["repair", "check"] {
                let out = f.guard(&[sub, "--repo", w, "--against", bad.to_str().unwrap()]);
                assert_usage_error(&out, "not an sbx-gitguard snapshot");
                assert!(
                    stderr(&out).contains("MAC"),
                    "{who:?} {what}: {}",
                    stderr(&out)
                );
            }
            assert!(!outside.exists(), "{who:?} {what}: written outside");
            assert!(!f.dir.parent().unwrap().join("PWNED").exists());
            assert_eq!(
                f.sh(&f.w, "find . -printf '%p %s\\n' | sort").stdout,
                listing,
                "{who:?} {what}: a refused repair changed files"
            );
            assert_event(&f.audit, "setup_failed", "warn", |e| {
                e["error"].as_str().unwrap_or("").contains("MAC")
            });
        }
        let out = f.guard(&["repair", "--repo", w, "--against", snap.to_str().unwrap()]);
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
    }
}

#[test]
fn locked_repository_waits_then_says_so() {
    let f = Fixture::new(user_first());
    let w = f.w.to_str().unwrap();
    let o = f.sh(&f.w, "touch .git/index.lock");
    assert!(o.status.success());
    let snap = f.dir.join("s.json");
    let out = f.guard(&[
        "snapshot",
        "--repo",
        w,
        "--lock-wait",
        "200ms",
        "-o",
        snap.to_str().unwrap(),
    ]);
    assert_usage_error(&out, "locked by a concurrent git process");
    assert!(!snap.exists());
    let out = f.guard(&[
        "run",
        "--repo",
        w,
        "--lock-wait",
        "200ms",
        "--",
        "sh",
        "-c",
        "touch \"$MARK\"",
    ]);
    assert_usage_error(&out, "index.lock");
    assert!(!f.mark.exists());
    assert!(
        f.w.join(".git/index.lock").exists(),
        "a lock we did not plant was removed"
    );
    // A lock left behind by the command is removed afterwards.
    std::fs::remove_file(f.w.join(".git/index.lock")).unwrap();
    let out = f.run(&["--lock-wait", "100ms"], "touch .git/HEAD.lock");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(!f.w.join(".git/HEAD.lock").exists());
    assert_event(&f.audit, "git_integrity", "alert", |e| {
        e["check"] == "locks"
    });
}

#[test]
fn bad_flags_are_one_line() {
    let f = Fixture::new(user_first());
    let out = f.guard(&["run", "--repo", f.w.to_str().unwrap()]);
    assert_usage_error(&out, "CMD");
    let out = f.guard(&["snapshot", "--repo", f.w.to_str().unwrap()]);
    assert_usage_error(&out, "--output");
    let out = f.guard(&[
        "check",
        "--repo",
        f.w.to_str().unwrap(),
        "--lock-wait",
        "soon",
    ]);
    assert_usage_error(&out, "--lock-wait");
    let cfg = f.dir.join("cfg.json");
    std::fs::write(&cfg, r#"{"sbx-gitguard": {"repo": "/nonexistent/y"}}"#).unwrap();
    let out = f.guard(&["check", "--config", cfg.to_str().unwrap()]);
    assert_usage_error(&out, "/nonexistent/y");
}

#[test]
fn standalone_check_names_dangerous_config_and_planted_dirs() {
    let f = Fixture::new(user_first());
    let o = f.sh(
        &f.w,
        "git config core.fsmonitor \"touch $MARK\" && git init -q --bare evil.git",
    );
    assert!(o.status.success());
    let out = f.guard(&["check", "--repo", f.w.to_str().unwrap(), "--json"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let s = v.to_string();
    assert!(
        s.contains("core.fsmonitor") && s.contains("evil.git"),
        "{s}"
    );
    assert!(!f.mark.exists());
}

#[test]
fn ref_whose_snapshot_commit_is_gone_falls_back_to_the_reflog() {
    let f = Fixture::new(user_first());
    let w = f.w.to_str().unwrap();
    let snap = f.dir.join("s.json");
    assert_eq!(
        code(&f.guard(&["snapshot", "--repo", w, "-o", snap.to_str().unwrap()])),
        0
    );
    let (oid, path) = loose_path(&f, "HEAD");
    let parent = f.git_ok(&f.w, &["rev-parse", "HEAD~1"]).trim().to_string();
    std::fs::remove_file(path).unwrap();
    std::fs::write(f.w.join(".git/refs/heads/main"), "junk\n").unwrap();
    let out = f.guard(&["repair", "--repo", w, "--against", snap.to_str().unwrap()]);
    // The commit is gone for good: the repair fails, but the branch points
    // to the newest commit of its reflog that still exists.
    assert_usage_error(&out, "could not be brought back");
    let e = assert_event(&f.audit, "git_integrity", "alert", |e| e["check"] == "refs");
    assert!(e["action"].as_str().unwrap().contains("reflog"), "{e}");
    assert_eq!(f.git_ok(&f.w, &["rev-parse", "main"]).trim(), parent);
    assert_event(&f.audit, "git_integrity", "alert", |e| {
        e["check"] == "objects" && e["found"].as_str().unwrap().contains(&oid)
    });
}

#[test]
fn from_a_linked_worktree_and_on_a_bare_repository() {
    let f = Fixture::new(user_first());
    let wt = f.dir.join("wt");
    let before = f.state();
    let out = f.guard(&[
        "run",
        "--repo",
        wt.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "echo junk > \"$D/w/.git/worktrees/wt/HEAD\" && git -C \"$D/w\" config core.fsmonitor \"touch $MARK\"",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(f.state(), before);
    f.assert_nothing_runs();
    assert_event(&f.audit, "git_integrity", "alert", |e| e["check"] == "head");
    assert_event(&f.audit, "git_integrity", "alert", |e| {
        e["check"] == "config"
    });

    let o = f.sh(&f.dir, "git clone -q --bare w bare.git");
    assert!(o.status.success());
    let bare = f.dir.join("bare.git");
    let out = f.guard(&[
        "run",
        "--repo",
        bare.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "cd \"$D/bare.git\" && git config core.fsmonitor x && git update-ref -d refs/heads/feat && echo x > hooks/post-update",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let o = f.git(&bare, &["config", "core.fsmonitor"]);
    assert!(
        !o.status.success(),
        "config not reverted in the bare repository"
    );
    assert!(!bare.join("hooks/post-update").exists());
    f.git_ok(&bare, &["rev-parse", "--verify", "refs/heads/feat"]);
}

/// Root guarding a user's repository: what it restores keeps the user's
/// ownership, so the user's git keeps working.
#[test]
fn root_repairs_keep_the_users_ownership() {
    use std::os::unix::fs::MetadataExt;
    if !sbx_testutil::is_root() || sbx_testutil::test_user().is_none() {
        sbx_testutil::skip!("needs root and the test user");
    }
    let (uid, _) = sbx_testutil::test_user().unwrap();
    let f = Fixture::new(As::User);
    let mut c = sbx_testutil::tool("sbx-gitguard");
    c.args(["run", "--audit-log"])
        .arg(&f.audit)
        .args(["--repo", f.w.to_str().unwrap(), "--", "sh", "-c"])
        .arg("git -c safe.directory='*' branch -D feat >/dev/null && git -c safe.directory='*' config core.pager x && echo x > .git/hooks/pre-commit.sample && echo junk > .git/HEAD")
        .current_dir(&f.w)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", f.dir.join("gitconfig"));
    let out = common::within(common::LIMIT, c, "sbx-gitguard run");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    for p in [
        ".git/HEAD",
        ".git/refs/heads/feat",
        ".git/config",
        ".git/hooks/pre-commit.sample",
    ] {
        assert_eq!(
            std::fs::metadata(f.w.join(p)).unwrap().uid(),
            uid,
            "{p} not owned by the user"
        );
    }
    // The user's own git still works on it.
    let o = f.sh(
        &f.w,
        "git commit -q --allow-empty -m after && git branch -f feat HEAD && git config core.x y",
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    f.assert_fsck_clean();
}

#[test]
fn objects_dir_swapped_for_a_symlink_is_refused_not_followed() {
    let f = Fixture::new(user_first());
    let out = f.run(&[], "mv .git/objects \"$D/moved-objects\" && mkdir \"$D/empty\" && ln -s \"$D/empty\" .git/objects");
    assert_usage_error(&out, "could not be brought back");
    assert!(
        std::fs::read_dir(f.dir.join("empty"))
            .unwrap()
            .next()
            .is_none(),
        "gitguard wrote through the symlink"
    );
    assert_event(&f.audit, "git_integrity", "alert", |e| {
        e["check"] == "objects" && e["found"].as_str().unwrap().contains("not a directory")
    });
}

#[test]
fn config_file_settings_apply_to_the_subcommand() {
    let f = Fixture::new(user_first());
    let cfg = f.dir.join("gg.json");
    std::fs::write(
        &cfg,
        format!(r#"{{"sbx-gitguard": {{"repo": "{}", "json": true, "full": true, "lock-wait": "100ms"}}}}"#, f.w.display()),
    )
    .unwrap();
    sbx_testutil::chown_to_test_user(&cfg);
    let out = f.guard(&["check", "--config", cfg.to_str().unwrap()]);
    // The fixture's own (benign) post-checkout hook is the one finding.
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["full_check"], true);
    let findings = v["findings"].as_array().unwrap();
    assert!(
        !findings.is_empty()
            && findings
                .iter()
                .all(|f| f["check"] == "hooks" && f["severity"] == "warn"),
        "{v}"
    );
}

#[test]
fn a_new_submodule_is_kept() {
    let f = Fixture::new(user_first());
    let out = f.run(&[], "git -c protocol.file.allow=always submodule -q add \"$D/lib\" sub2 && git commit -qm 'add sub2'");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        f.w.join(".git/modules/sub2/HEAD").exists(),
        "the new submodule's git dir was removed"
    );
    assert_event(&f.audit, "git_integrity", "warn", |e| {
        e["found"]
            .as_str()
            .unwrap()
            .contains("new submodule git dir")
            && e["action"].as_str().unwrap().starts_with("kept")
    });
    f.git_ok(&f.w.join("sub2"), &["status"]);
    assert!(
        f.git_ok(&f.w, &["log", "--oneline", "-1"])
            .contains("add sub2")
    );
    f.assert_fsck_clean();
}

/// serde refuses a path that is not UTF-8 and `json!` panicked on it: a
/// repository under such a name made `run` die with exit 101 (a panic and
/// a backtrace) before the command ran. Now the path is in the audit log
/// escaped (`\xNN`) and the run is normal.
#[test]
fn a_repository_whose_path_is_not_utf8_is_guarded_normally() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    for who in identities() {
        let tmp = sbx_testutil::shared_tempdir();
        let repo = tmp.path().join(OsStr::from_bytes(b"r\xff"));
        let audit = tmp.path().join("audit.jsonl");
        let mut c = std::process::Command::new("sh");
        c.arg("-c")
            .arg("set -e; mkdir \"$R\"; cd \"$R\"; git init -q; git -c user.name=t -c user.email=t@t commit -q --allow-empty -m i")
            .env("R", &repo)
            .env("GIT_CONFIG_NOSYSTEM", "1");
        sbx_testutil::run_as(&mut c, who);
        let o = c.output().unwrap();
        assert!(o.status.success(), "fixture: {}", stderr(&o));
        let mut c = sbx_testutil::tool("sbx-gitguard");
        c.arg("--audit-log")
            .arg(&audit)
            .arg("run")
            .arg("--repo")
            .arg(&repo)
            .args(["--", "sh", "-c", "echo ran"]);
        sbx_testutil::run_as(&mut c, who);
        let out = c.output().unwrap();
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert_eq!(stdout(&out), "ran\n");
        assert_event(&audit, "git_snapshot", "info", |e| {
            e["repo"]
                .as_str()
                .is_some_and(|s| s.ends_with("/r\\xff/.git"))
        });
        // A snapshot file holds the repository's path as JSON: this one
        // cannot be saved, which is one line and exit 125, not a panic.
        let mut c = sbx_testutil::tool("sbx-gitguard");
        c.arg("snapshot")
            .arg("--repo")
            .arg(&repo)
            .arg("-o")
            .arg(tmp.path().join("snap"));
        sbx_testutil::run_as(&mut c, who);
        let out = c.output().unwrap();
        assert_usage_error(&out, "snapshot");
    }
}
