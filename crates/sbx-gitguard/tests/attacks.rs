//! Every attack of the issue runs as the command under `sbx-gitguard run`
//! in a real repository; afterwards git fsck is clean, status and log are
//! as before, no planted program runs, and the alert is in the audit log.

mod common;

use common::Fixture;
use sbx_testutil::{As, assert_event, code, identities, stderr};

fn attack(who: As, script: &str, check: &str) -> Fixture {
    let f = Fixture::new(who);
    let before = f.state();
    let out = f.run(&[], script);
    assert_eq!(code(&out), 0, "run failed: {}", stderr(&out));
    assert_eq!(
        f.state(),
        before,
        "status/log changed after repair; stderr: {}",
        stderr(&out)
    );
    f.assert_fsck_clean();
    f.assert_nothing_runs();
    assert_event(&f.audit, "git_integrity", "alert", |e| e["check"] == check);
    f
}

macro_rules! attacks {
    ($($name:ident: $check:literal, $script:literal;)*) => {$(
        #[test]
        fn $name() {
            for who in identities() {
                attack(who, $script, $check);
            }
        }
    )*};
}

attacks! {
    head_deleted: "head", "rm .git/HEAD";
    head_outside_refs: "head", "echo 'ref: ../../../etc/passwd' > .git/HEAD";
    head_dangling: "head", "echo 'ref: refs/heads/nowhere' > .git/HEAD";
    head_garbage: "head", "printf 'garbage' > .git/HEAD";
    packed_ref_deleted: "refs", "git branch -D feat >/dev/null && git tag -d v1 >/dev/null";
    ref_rewritten_backwards: "refs", "git update-ref refs/heads/main HEAD~2";
    tag_moved: "refs", "git tag -f v2 HEAD >/dev/null 2>&1";
    packed_refs_edited: "refs", "T=$(git rev-parse HEAD^{tree}) && F=$(git rev-parse feat) && sed -i \"s/^$F refs.heads.feat$/$T refs\\/heads\\/feat/\" .git/packed-refs && grep -q $T .git/packed-refs";
    packed_refs_garbage: "refs", "echo 'not a ref line' >> .git/packed-refs";
    loose_ref_garbage: "refs", "echo junk > .git/refs/heads/main";
    replace_ref_added: "refs", "git replace HEAD HEAD~1";
    config_fsmonitor: "config", "git config core.fsmonitor \"touch $MARK\"";
    config_hooks_path: "config", "mkdir -p hk && printf '#!/bin/sh\\ntouch %s\\n' \"$MARK\" > hk/post-checkout && chmod +x hk/post-checkout && git config core.hooksPath hk";
    config_ssh_command: "config", "git config core.sshCommand \"touch $MARK; false\"";
    config_pager: "config", "git config core.pager \"touch $MARK; cat\"";
    config_alias: "config", "git config alias.st \"!touch $MARK\"";
    config_filter_and_attributes: "config", "git config filter.ev.clean \"touch $MARK; cat\" && git config filter.ev.smudge \"touch $MARK; cat\" && echo '* filter=ev' >> .git/info/attributes";
    config_textconv: "config", "git config diff.ev.textconv \"touch $MARK; cat\" && echo '* diff=ev' > .git/info/attributes";
    config_include: "config", "printf '[core]\\n\\tfsmonitor = touch %s\\n' \"$MARK\" > .git/evil.cfg && git config include.path evil.cfg";
    config_include_if: "config", "printf '[alias]\\n\\tst = !touch %s\\n' \"$MARK\" > \"$D/inc.cfg\" && git config includeIf.gitdir:/.path \"$D/inc.cfg\"";
    hook_planted: "hooks", "printf '#!/bin/sh\\ntouch %s\\n' \"$MARK\" > .git/hooks/post-checkout.new && mv .git/hooks/post-checkout.new .git/hooks/post-checkout && cp .git/hooks/post-checkout .git/hooks/pre-commit";
    hook_sample_deleted: "hooks", "rm -f .git/hooks/*.sample";
    info_exclude_changed: "extra_files", "echo '*.secret' >> .git/info/exclude";
    config_worktree_planted: "extra_files", "printf '[core]\\n\\tfsmonitor = touch %s\\n' \"$MARK\" > .git/config.worktree";
    commondir_planted: "extra_files", "echo /tmp > .git/commondir";
    alternates_planted: "extra_files", "echo /tmp/evil-objects > .git/objects/info/alternates";
    top_level_planted: "extra_files", "echo x > .git/planted && mkdir .git/stash-dir";
    bare_repo_planted: "bare_repo", "git init -q --bare evil.git && git -C evil.git config core.fsmonitor \"touch $MARK\"";
    bare_shape_by_hand: "bare_repo", "mkdir -p planted/objects planted/refs && echo 'ref: refs/heads/main' > planted/HEAD && printf '[core]\\n\\tfsmonitor = touch %s\\n' \"$MARK\" > planted/config";
    // Unlistable (mode 0111) for a user: git still finds HEAD, objects and
    // refs by path, so the scan must too.
    bare_shape_unlistable: "bare_repo", "mkdir -p locked/objects locked/refs && echo 'ref: refs/heads/main' > locked/HEAD && printf '[core]\\n\\tfsmonitor = touch %s\\n' \"$MARK\" > locked/config && chmod 0111 locked";
    bare_shape_with_symlinks: "bare_repo", "git init -q --bare \"$D/real.git\" && mkdir -p sym && ln -s \"$D/real.git/objects\" sym/objects && ln -s \"$D/real.git/refs\" sym/refs && echo 'ref: refs/heads/main' > sym/HEAD && printf '[core]\\n\\tfsmonitor = touch %s\\n' \"$MARK\" > sym/config";
    nested_repo_planted: "bare_repo", "mkdir evil && cd evil && git init -q && git config core.fsmonitor \"touch $MARK\"";
    gitfile_outside: "bare_repo", "git init -q --bare \"$D/outside.git\" && git -C \"$D/outside.git\" config core.fsmonitor \"touch $MARK\" && mkdir -p evil && echo \"gitdir: $D/outside.git\" > evil/.git";
    submodule_config: "config", "git -C sub config core.fsmonitor \"touch $MARK\"";
    submodule_hook: "hooks", "printf '#!/bin/sh\\ntouch %s\\n' \"$MARK\" > .git/modules/sub/hooks/post-checkout && chmod +x .git/modules/sub/hooks/post-checkout";
    submodule_head: "head", "echo garbage > .git/modules/sub/HEAD";
    submodule_ref_deleted: "refs", "git -C sub update-ref -d refs/heads/main";
    new_submodule_git_dir_with_config: "extra_files", "mkdir -p .git/modules/evil && git init -q --bare .git/modules/evil && git -C .git/modules/evil config core.fsmonitor \"touch $MARK\"";
    worktree_head: "head", "echo garbage > .git/worktrees/wt/HEAD";
    worktree_config_planted: "extra_files", "printf '[core]\\n\\tfsmonitor = touch %s\\n' \"$MARK\" > .git/worktrees/wt/config.worktree";
    worktree_gitdir_redirected: "extra_files", "echo /tmp/elsewhere/.git > .git/worktrees/wt/gitdir";
    nested_repo_config: "config", "git -C nested config core.fsmonitor \"touch $MARK\"";
    nested_repo_hook: "hooks", "printf '#!/bin/sh\\ntouch %s\\n' \"$MARK\" > nested/.git/hooks/post-checkout && chmod +x nested/.git/hooks/post-checkout";
}

/// The proof commands do run a planted program when nobody repairs: the
/// assertions above are not vacuous.
#[test]
fn control_without_gitguard_the_plant_runs() {
    let who = identities()[0];
    let f = Fixture::new(who);
    let o = f.sh(&f.w, "git config core.fsmonitor \"touch $MARK\"");
    assert!(o.status.success());
    let o = f.sh(&f.w, "git status >/dev/null 2>&1; true");
    assert!(o.status.success());
    assert!(
        f.mark.exists(),
        "the control attack did not run: the proof is too weak"
    );
}

#[test]
fn several_attacks_at_once_and_alert_names_dangerous_keys() {
    for who in identities() {
        let f = attack(
            who,
            "git config core.fsmonitor \"touch $MARK\" && git config credential.helper \"!touch $MARK\" && git config protocol.ext.allow always && git branch -D feat >/dev/null && rm .git/HEAD",
            "config",
        );
        let e = assert_event(&f.audit, "git_integrity", "alert", |e| {
            e["check"] == "config"
        });
        let keys = e["dangerous_keys"].to_string();
        for k in ["core.fsmonitor", "credential.helper", "protocol.ext.allow"] {
            assert!(keys.contains(k), "{k} not named in {e}");
        }
        assert_event(&f.audit, "git_integrity", "alert", |e| e["check"] == "head");
        assert_event(&f.audit, "git_integrity", "alert", |e| {
            e["check"] == "refs" && e["found"].as_str().unwrap().contains("refs/heads/feat")
        });
    }
}

/// In the chain: sbx-fs protects the git dir inside the sandbox, gitguard
/// repairs what was writable (a bare repository planted in the work tree),
/// and both log to the same audit log with the same sandbox id.
#[test]
fn in_the_chain_with_sbx_fs() {
    let fs_bin = sbx_testutil::bin("sbx-gitguard").with_file_name("sbx-fs");
    if !fs_bin.exists() {
        sbx_testutil::skip!("sbx-fs is not built ({})", fs_bin.display());
    }
    for who in identities() {
        let f = Fixture::new(who);
        let before = f.state();
        let w = f.w.to_str().unwrap();
        let script = "rm -f .git/HEAD; git config core.fsmonitor \"touch $MARK\"; git init -q --bare evil.git && git -C evil.git config core.fsmonitor \"touch $MARK\"; exit 5";
        let out = f.guard(&[
            "run",
            "--repo",
            w,
            "--",
            fs_bin.to_str().unwrap(),
            // The work tree only: the audit log beside it must stay out of
            // every writable bind (sbx-fs refuses a log inside one).
            "--rw",
            w,
            "--chdir",
            w,
            "--",
            "sh",
            "-c",
            script,
        ]);
        assert_eq!(code(&out), 5, "{}", stderr(&out));
        assert_eq!(f.state(), before);
        f.assert_fsck_clean();
        f.assert_nothing_runs();
        let e = assert_event(&f.audit, "git_integrity", "alert", |e| {
            e["check"] == "bare_repo"
        });
        let evs = sbx_testutil::audit_events(&f.audit);
        assert!(
            evs.iter()
                .any(|x| x["tool"] == "sbx-fs" && x["sbx_id"] == e["sbx_id"]),
            "sbx-fs did not log with the same id"
        );
    }
}

/// Symlinks planted to turn a repair into a deletion elsewhere: the links
/// are removed, what they point to is untouched.
#[test]
fn symlinks_never_lead_a_repair_outside() {
    for who in identities() {
        let f = Fixture::new(who);
        // A directory outside the repository with a file named like a
        // planted path and a "hook".
        let victim = f.dir.join("victim");
        std::fs::create_dir_all(victim.join("alternates")).unwrap();
        std::fs::write(victim.join("post-checkout"), "keep me").unwrap();
        std::fs::write(victim.join("alternates/x"), "keep me").unwrap();
        sbx_testutil::chown_to_test_user(&victim);
        sbx_testutil::chown_to_test_user(&victim.join("alternates"));
        sbx_testutil::chown_to_test_user(&victim.join("post-checkout"));
        let before = f.state();
        let script = format!(
            "rm -rf .git/objects/info && ln -s {v} .git/objects/info && git config core.hooksPath {v} && ln -s {v} .git/modules/evil",
            v = victim.display()
        );
        let out = f.run(&[], &script);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert_eq!(
            std::fs::read_to_string(victim.join("post-checkout")).unwrap(),
            "keep me"
        );
        assert_eq!(
            std::fs::read_to_string(victim.join("alternates/x")).unwrap(),
            "keep me"
        );
        assert_eq!(f.state(), before);
        f.assert_fsck_clean();
        assert_event(&f.audit, "git_integrity", "alert", |e| {
            e["check"] == "config"
        });
    }
}

/// A worktree link rewritten to name another directory does not make
/// gitguard scan (or clean) that directory.
#[test]
fn rewritten_worktree_link_does_not_widen_the_scan() {
    let who = *identities().last().unwrap();
    let f = Fixture::new(who);
    let other = f.dir.join("other");
    let o = f.sh(&f.dir, "mkdir other && git init -q --bare other/keep.git");
    assert!(o.status.success());
    let out = f.run(
        &[],
        &format!("echo {}/.git > .git/worktrees/wt/gitdir", other.display()),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        other.join("keep.git/HEAD").exists(),
        "a repository outside the work trees was removed"
    );
    assert_event(&f.audit, "git_integrity", "alert", |e| {
        e["check"] == "extra_files"
    });
}

/// The keep directory lives in the git dir, which the command of a run
/// without a stage can write: one it nested deeper than the open-file
/// limit (where `std::fs::remove_dir_all`, one fd per level, gives up with
/// EMFILE) is removed all the same (`sbx_core::rmtree`), and the
/// repository is as it was.
#[test]
fn a_keep_directory_nested_deeper_than_the_fd_limit_is_removed() {
    for who in identities() {
        let f = Fixture::new(who);
        let before = f.state();
        let out = f.run(
            &[],
            // Deeper than the open-file limit gitguard inherits (capped).
            "cd .git/.sbx-gitguard-keep.* && python3 -c 'import os, resource\nfor _ in range(min(resource.getrlimit(resource.RLIMIT_NOFILE)[0] + 100, 30000)):\n    os.mkdir(\"d\"); os.chdir(\"d\")'",
        );
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        let left: Vec<_> = std::fs::read_dir(f.w.join(".git"))
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(".sbx-gitguard-keep")
            })
            .map(|e| e.path())
            .collect();
        assert!(left.is_empty(), "{who:?}: left: {left:?}");
        assert_eq!(f.state(), before, "{who:?}");
        f.assert_fsck_clean();
    }
}
