//! `--git-stage DIR`: git commits inside the sandbox land in the stage's
//! upper layer; the host's .git is not written; config and hooks stay
//! read-only; a stage that is not well formed is refused before anything.

mod common;
use common::*;
use std::path::{Path, PathBuf};

fn git(dir: &Path, who: As, args: &[&str]) -> String {
    let mut c = std::process::Command::new("git");
    c.current_dir(dir)
        .args(["-c", "user.email=t@t", "-c", "user.name=t"])
        .args(args);
    run_as(&mut c, who);
    let out = c.output().unwrap();
    assert!(out.status.success(), "git {args:?}: {}", stderr(&out));
    stdout(&out)
}

/// A repository with one commit in s/proj and a stage beside it.
fn repo_and_stage(s: &Scratch) -> PathBuf {
    s.write("proj/f", "1\n");
    git(&s.proj(), s.who, &["init", "-q", "-b", "main"]);
    git(&s.proj(), s.who, &["add", "f"]);
    git(&s.proj(), s.who, &["commit", "-qm", "one"]);
    let stage = s.path("sbx-git-stage-t");
    s.mkdir("sbx-git-stage-t/git/upper");
    s.mkdir("sbx-git-stage-t/git/work");
    s.write(
        "sbx-git-stage-t/gitdir",
        &format!("{}\n", s.proj().join(".git").display()),
    );
    for d in ["", "git", "git/upper", "git/work"] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(stage.join(d), std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    stage
}

#[test]
fn commits_branches_and_tags_land_in_the_stage_only() {
    for who in identities() {
        let s = Scratch::new(who);
        let stage = repo_and_stage(&s);
        let gitdir_before = snapshot(&s.proj().join(".git"));
        let st = stage.to_str().unwrap().to_string();
        let (out, log) = s.run_rw(
            &["--git-stage", &st],
            "set -e; G='git -c user.email=t@t -c user.name=t'; echo 2 > f; $G commit -qam two; \
             $G checkout -qb feature; echo 3 > f; $G commit -qam three; $G tag v1; $G gc -q; \
             echo COUNT=$($G rev-list --all | wc -l); \
             if echo x >> .git/config; then echo CONFIG=written; else echo CONFIG=refused; fi; \
             $G config core.hooksPath /tmp 2>/dev/null || true; \
             if touch .git/hooks/pre-commit; then echo HOOK=written; else echo HOOK=refused; fi",
        );
        let so = stdout(&out);
        assert_eq!(code(&out), 0, "{who:?} {so} {}", stderr(&out));
        assert!(so.contains("COUNT=3"), "{so}");
        assert!(so.contains("CONFIG=refused"), "{so}");
        assert!(so.contains("HOOK=refused"), "{so}");
        // The host's .git is exactly as it was (objects, refs, HEAD, index).
        assert_eq!(gitdir_before, snapshot(&s.proj().join(".git")));
        assert_eq!(
            git(&s.proj(), who, &["rev-list", "--all"]).lines().count(),
            1
        );
        // What git wrote is in the upper layer.
        let upper = stage.join("git/upper");
        assert_eq!(
            std::fs::read_to_string(upper.join("HEAD")).unwrap(),
            "ref: refs/heads/feature\n"
        );
        assert!(upper.join("packed-refs").exists() || upper.join("refs/tags/v1").exists());
        assert!(upper.join("objects").read_dir().unwrap().next().is_some());
        // sbx-fs left no mount on the host.
        assert!(mounts_mentioning(&s.root()).is_empty());
        // The refusals are seen (guard nodes over the overlay); HEAD is
        // staged, so git's HEAD.lock is no alert.
        let events = sbx_testutil::audit_events(&log);
        let denied: Vec<String> = events
            .iter()
            .filter(|e| e["event"] == "fs_write_denied")
            .map(|e| e["path"].as_str().unwrap_or("").to_string())
            .collect();
        let git = s.proj().join(".git");
        for p in ["config", "hooks/pre-commit"] {
            let want = git.join(p).display().to_string();
            assert!(
                denied.contains(&want),
                "{who:?}: no alert for {want}: {denied:?}"
            );
        }
        assert!(
            !denied.iter().any(|p| p.ends_with(".git/HEAD")),
            "{denied:?}"
        );
    }
}

#[test]
fn a_stage_that_is_not_well_formed_is_refused() {
    for who in identities() {
        let s = Scratch::new(who);
        let stage = repo_and_stage(&s);
        let st = stage.to_str().unwrap().to_string();
        // The git dir is not inside a writable bind: only --ro.
        let p = s.proj().to_str().unwrap().to_string();
        let (out, _) = s.run(&["--ro", &p, "--git-stage", &st], "echo RAN");
        sbx_testutil::assert_usage_error(&out, "is not the .git directory of a writable bind");
        // A stage whose upper is not empty (used twice).
        s.write("sbx-git-stage-t/git/upper/x", "");
        let (out, _) = s.run_rw(&["--git-stage", &st], "echo RAN");
        sbx_testutil::assert_usage_error(&out, "is not empty");
        std::fs::remove_file(stage.join("git/upper/x")).unwrap();
        // gitdir naming something that is not a .git directory.
        s.write("sbx-git-stage-t/gitdir", "/etc\n");
        let (out, _) = s.run_rw(&["--git-stage", &st], "echo RAN");
        sbx_testutil::assert_usage_error(&out, "must be the absolute path of a .git directory");
        // Missing stage.
        let (out, _) = s.run_rw(&["--git-stage", "/nonexistent/sbx-git-stage-x"], "echo RAN");
        sbx_testutil::assert_usage_error(&out, "--git-stage /nonexistent/sbx-git-stage-x");
    }
}
