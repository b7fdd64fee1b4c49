//! Issue 23's "done when": one project's everyday agent session, each step
//! its own sandboxed call (as Claude Code's Bash tool runs them): build,
//! test, edit, status, diff, commit, branch, stash and pop across calls,
//! worktree add / commit / remove across calls, rebase, gc. Through
//! `scripts/sbx-run`, `sbx-policy chain` (Bash rules in invoke mode) and
//! `sbx-policy chain --exec-allowlist strict`, as root and as the test
//! user. After every step the host repository passes `git fsck --full
//! --strict` and has the refs the step made.

mod common;
use common::gitproj::*;
use common::write;

use sbx_testutil::{audit_events, identities};

/// The agent's permissions: the programs of the session (strict mode puts
/// exactly these, with the helpers, on the kernel's execute list).
const SETTINGS: &str = r#"{"permissions": {"allow": ["Edit(./**)", "Bash(sh:*)", "Bash(git:*)",
    "Bash(make:*)", "Bash(python3:*)", "Bash(sed:*)", "Bash(cat:*)", "Bash(echo:*)", "Bash(mkdir:*)",
    "Bash(cd:*)"]}}"#;

/// A small Python project with a Makefile and a test suite.
fn setup(root: &std::path::Path) {
    write(
        &root.join(".gitignore"),
        ".claude/\n__pycache__/\n.pytest_cache/\n.wt/\nbuild/\n",
    );
    write(&root.join("calc.py"), "def add(a, b):\n    return a + b\n");
    write(
        &root.join("test_calc.py"),
        "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
    );
    write(
        &root.join("Makefile"),
        "build:\n\tmkdir -p build && python3 -m py_compile calc.py && echo BUILT\n\
         test:\n\tpython3 -m pytest -q -p no:cacheprovider test_calc.py\n",
    );
    write(&root.join("README"), "calc\n");
    commit(root, "README", "calc\n", "init");
}

#[test]
fn an_everyday_session_across_calls_lands_on_the_host() {
    session(&[Chain::SbxRun, Chain::Policy, Chain::PolicyStrict]);
}

/// The zero-trust tier (gVisor; runsc from scripts/setup) does the same
/// work through the same git stage.
#[test]
fn an_everyday_session_in_gvisor_lands_on_the_host() {
    session(&[Chain::PolicyZero]);
}

fn session(chains: &[Chain]) {
    for who in identities() {
        for &chain in chains {
            let p = project_with(who, SETTINGS, setup);
            let step = |script: &str, want: &str| p.step(chain, script, want).1;

            // Build and test.
            step("make build", "BUILT");
            step("make test", "1 passed");
            // Edit, status, diff: the edit is the host's at once.
            let c = step(
                "sed -i 's/a + b/b + a/' calc.py && git status --short && git diff --stat",
                "M calc.py",
            );
            assert!(
                std::fs::read_to_string(p.root.join("calc.py"))
                    .unwrap()
                    .contains("b + a"),
                "{c}"
            );
            // Commit.
            let before = p.git(&["rev-parse", "HEAD"]);
            let c = step("git commit -qam 'swap operands' && echo DONE", "DONE");
            assert_eq!(p.git(&["rev-parse", "HEAD~1"]), before, "{c}");
            p.assert_clean(&c);
            // Branch.
            let c = step(
                "git checkout -q -b feature && echo more >> README && git commit -qam feature && echo DONE",
                "DONE",
            );
            assert_eq!(
                p.git(&["symbolic-ref", "HEAD"]),
                "refs/heads/feature",
                "{c}"
            );
            p.assert_clean(&c);
            // Stash in one call, pop in the next.
            let c = step("echo wip >> README && git stash -q && echo DONE", "DONE");
            p.assert_clean(&c);
            assert_eq!(p.git(&["stash", "list"]).lines().count(), 1, "{c}");
            let c = step(
                "git stash list && git stash pop -q && echo DONE",
                "stash@{0}",
            );
            assert!(
                std::fs::read_to_string(p.root.join("README"))
                    .unwrap()
                    .contains("wip"),
                "{c}"
            );
            assert_eq!(p.git(&["stash", "list"]), "", "{c}");
            step("git commit -qam wip && echo DONE", "DONE");
            // A worktree: add, commit in it, remove, each its own call.
            let c = step("git worktree add -q .wt/x -b wt && echo DONE", "DONE");
            assert!(p.git(&["worktree", "list"]).contains(".wt/x"), "{c}");
            let c = step(
                "cd .wt/x && echo y > y && git add y && git commit -qm in-worktree && echo DONE",
                "DONE",
            );
            assert_eq!(
                p.git(&["log", "-1", "--format=%s", "wt"]),
                "in-worktree",
                "{c}"
            );
            let c = step("git worktree remove .wt/x && echo DONE", "DONE");
            assert!(!p.git(&["worktree", "list"]).contains(".wt/x"), "{c}");
            assert!(!p.root.join(".wt/x").exists(), "{c}");
            // Rebase the feature on a main that moved.
            let c = step(
                "git checkout -q main && echo m > m && git add m && git commit -qm main2 && \
                 git checkout -q feature && git rebase -q main && echo DONE",
                "DONE",
            );
            let main = p.git(&["rev-parse", "main"]);
            assert_eq!(p.git(&["merge-base", "main", "feature"]), main, "{c}");
            p.assert_clean(&c);
            p.assert_nothing_in_progress(&c);
            // gc.
            let c = step("git gc -q && echo DONE", "DONE");
            assert!(p.git(&["count-objects", "-v"]).contains("packs: "), "{c}");
            p.assert_clean(&c);
            // Everyday work drops nothing: no stage entry was refused.
            let dropped: Vec<_> = audit_events(&p.log)
                .into_iter()
                .filter(|e| e["event"] == "stage_entry_dropped")
                .collect();
            assert!(dropped.is_empty(), "{who:?} {chain:?}: {dropped:?}");
        }
    }
}
