//! Where the caller stands must not matter: from a nested subdirectory of a
//! repository, `scripts/sbx-run` and `sbx-policy chain` take the
//! repository's top level as the project (its deny rules apply, git
//! commits inside and the commit lands on the host) and start the command
//! in the subdirectory; `sbx-policy explain` names the project and why.
//! As root and as the unprivileged test user.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sbx_testutil::{As, assert_event, identities, run_as, stderr, stdout};

const SETTINGS: &str = r#"{"permissions": {"deny": ["Read(./secret.txt)"]}}"#;

const SCRIPT: &str = "pwd; cat ../../secret.txt; echo CAT=$?; \
    git -c user.email=t@example.invalid -c user.name=t commit -q --allow-empty -m inside && echo COMMITTED";

struct Tree {
    _d: tempfile::TempDir,
    base: PathBuf,
    root: PathBuf,
    sub: PathBuf,
    home: PathBuf,
}

/// A repository with the project's settings and a denied file, a nested
/// subdirectory, and a home; owned by `who`.
fn tree(who: As) -> Tree {
    let d = sbx_testutil::shared_tempdir();
    let base = d.path().canonicalize().unwrap();
    let root = base.join("proj");
    let sub = root.join("a/b");
    let home = base.join("home");
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    write(&root.join(".claude/settings.json"), SETTINGS);
    write(&root.join("secret.txt"), "the secret\n");
    write(&sub.join("f"), "f\n");
    git(&root, &["init", "-q", "-b", "main"]);
    git(&root, &["add", "-A"]);
    git(&root, &["commit", "-qm", "init"]);
    if who == As::User {
        chown_r(&base);
    }
    Tree {
        _d: d,
        base,
        root,
        sub,
        home,
    }
}

fn sbx_run(t: &Tree, log: &Path, who: As, script: &str) -> Output {
    let mut c = Command::new("sh");
    c.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/sbx-run"))
        .arg("-l")
        .arg(log)
        .args(["--", "sh", "-c", script]);
    c.env("SBX_BIN", sbx_testutil::bin("sbx-fs").parent().unwrap());
    finish(c, t, who)
}

fn policy(t: &Tree, log: &Path, who: As, args: &[&str]) -> Output {
    let mut c = sbx_testutil::tool("sbx-policy");
    c.arg("--audit-log").arg(log);
    c.arg(args[0])
        .args(["--managed", "/nonexistent/managed.json", "--home"])
        .arg(&t.home)
        .args(&args[1..]);
    finish(c, t, who)
}

fn finish(mut c: Command, t: &Tree, who: As) -> Output {
    c.current_dir(&t.sub)
        .env("PATH", PATH)
        .env("XDG_STATE_HOME", t.base.join("state"))
        .env_remove("SBX_ID")
        .env_remove("SBX_AUDIT_LOG");
    run_as(&mut c, who);
    c.env("HOME", &t.home);
    c.output().unwrap()
}

#[test]
fn from_a_subdirectory_the_repository_is_the_project() {
    for who in identities() {
        for chain in ["scripts/sbx-run", "sbx-policy chain"] {
            let t = tree(who);
            let log = t.base.join("audit.jsonl");
            let out = if chain == "scripts/sbx-run" {
                // sbx-run reads no settings: the deny is sbx-policy's.
                sbx_run(&t, &log, who, SCRIPT)
            } else {
                policy(&t, &log, who, &["chain", "--", "sh", "-c", SCRIPT])
            };
            let so = stdout(&out);
            let ctx = format!("{who:?} {chain}\nstdout:\n{so}\nstderr:\n{}", stderr(&out));
            assert_eq!(out.status.code(), Some(0), "{ctx}");
            // The command starts where the caller stands.
            assert!(so.starts_with(&format!("{}\n", t.sub.display())), "{ctx}");
            assert!(so.contains("COMMITTED"), "{ctx}");
            assert_eq!(
                git(&t.root, &["log", "-1", "--format=%s"]),
                "inside\n",
                "the commit landed on the host: {ctx}"
            );
            git(&t.root, &["fsck", "--strict", "--no-progress"]);
            assert_event(&log, "git_verified", "info", |e| {
                e["tool"] == "sbx-gitguard"
            });
            if chain == "sbx-policy chain" {
                // The project's deny rule applies from the subdirectory.
                assert!(so.contains("CAT=1"), "{ctx}");
                assert!(!so.contains("the secret"), "{ctx}");
                let secret = t.root.join("secret.txt");
                assert_event(&log, "fs_denied", "alert", |e| {
                    e["path"] == secret.to_str().unwrap()
                });
            } else {
                assert!(so.contains("CAT=0"), "{ctx}");
            }
        }
    }
}

#[test]
fn explain_from_a_subdirectory_names_the_project_and_its_denies() {
    for who in identities() {
        let t = tree(who);
        let log = t.base.join("audit.jsonl");
        let out = policy(&t, &log, who, &["explain"]);
        let so = stdout(&out);
        let ctx = format!("{who:?}\nstdout:\n{so}\nstderr:\n{}", stderr(&out));
        assert_eq!(out.status.code(), Some(0), "{ctx}");
        assert!(
            so.starts_with(&format!("Project: {}\n", t.root.display())),
            "{ctx}"
        );
        assert!(
            so.contains("the repository's top level, found from"),
            "{ctx}"
        );
        assert!(
            so.contains(&format!("the command starts in {}", t.sub.display())),
            "{ctx}"
        );
        let settings = t.root.join(".claude/settings.json");
        assert!(
            so.contains(&format!("{} (project)", settings.display())),
            "{ctx}"
        );
        assert!(
            so.contains(&format!(
                "hidden    {}",
                t.root.join("secret.txt").display()
            )),
            "{ctx}"
        );
        // chain --print: the project is writable, the command starts below.
        let out = policy(&t, &log, who, &["chain", "--print", "--", "true"]);
        let so = stdout(&out);
        assert!(
            so.contains(&format!("--rw {}", t.root.display()))
                && so.contains(&format!("--chdir {}", t.sub.display()))
                && so.contains(&format!("--repo {}", t.root.display())),
            "{who:?}\n{so}"
        );
    }
}

#[test]
fn outside_git_the_nearest_dot_claude_is_the_project() {
    for who in identities() {
        let t = tree(who);
        std::fs::remove_dir_all(t.root.join(".git")).unwrap();
        let log = t.base.join("audit.jsonl");
        let out = policy(&t, &log, who, &["explain"]);
        let so = stdout(&out);
        let ctx = format!("{who:?}\nstdout:\n{so}\nstderr:\n{}", stderr(&out));
        assert_eq!(out.status.code(), Some(0), "{ctx}");
        assert!(
            so.starts_with(&format!("Project: {}\n", t.root.display())),
            "{ctx}"
        );
        assert!(so.contains("holding .claude/"), "{ctx}");
        let out = policy(
            &t,
            &log,
            who,
            &["chain", "--", "sh", "-c", "cat ../../secret.txt"],
        );
        assert_ne!(out.status.code(), Some(0), "{who:?}: {}", stdout(&out));
        let secret = t.root.join("secret.txt");
        assert_event(&log, "fs_denied", "alert", |e| {
            e["path"] == secret.to_str().unwrap()
        });
    }
}

/// As root in the test user's repository git refuses it ("dubious
/// ownership"). Through both chains, from a subdirectory: sbx-gitguard is
/// in the chain (its events are in the log) and the sandboxed command's
/// git accepts the repository (safe.directory in git's command-line scope,
/// for that top level only); no config file of the host gains it.
#[test]
fn as_root_in_the_test_users_repository_git_works_inside_and_gitguard_runs() {
    if !sbx_testutil::is_root() || sbx_testutil::test_user().is_none() {
        sbx_testutil::skip!("needs root and the test user");
    }
    let script = "git log -1 --format=LOG=%s; echo GIT=$?; git config --get-all safe.directory";
    for chain in ["scripts/sbx-run", "sbx-policy chain"] {
        let t = tree(As::User);
        // Premise: git refuses the repository as root.
        let o = Command::new("git")
            .args(["rev-parse", "--git-dir"])
            .current_dir(&t.sub)
            .env("HOME", &t.home)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .output()
            .unwrap();
        assert!(
            !o.status.success() && stderr(&o).contains("dubious ownership"),
            "premise: {}",
            stderr(&o)
        );
        let log = t.base.join("audit.jsonl");
        let out = if chain == "scripts/sbx-run" {
            sbx_run(&t, &log, As::Root, script)
        } else {
            policy(&t, &log, As::Root, &["chain", "--", "sh", "-c", script])
        };
        let so = stdout(&out);
        let ctx = format!("{chain}\nstdout:\n{so}\nstderr:\n{}", stderr(&out));
        assert_eq!(out.status.code(), Some(0), "{ctx}");
        assert!(so.contains("LOG=init\nGIT=0\n"), "{ctx}");
        assert!(!stderr(&out).contains("dubious ownership"), "{ctx}");
        // Only this top level, nothing wider.
        assert!(
            so.ends_with(&format!("GIT=0\n{}\n", t.root.display())),
            "{ctx}"
        );
        for ev in ["git_snapshot", "git_verified", "git_plants_checked"] {
            assert_event(&log, ev, "info", |e| e["tool"] == "sbx-gitguard");
        }
        // Nothing was written to a config file of the host.
        assert!(!t.home.join(".gitconfig").exists(), "{ctx}");
        let cfg = std::fs::read_to_string(t.root.join(".git/config")).unwrap();
        assert!(!cfg.contains("safe"), "{ctx}\n{cfg}");
    }
}

/// Every key sbx does not map is a NOT ENFORCED row of explain; an unknown
/// tool in a rule is a warning and a NOT ENFORCED row, and the chain runs
/// (never 125). From a subdirectory, as root and as the test user.
#[test]
fn explain_lists_unmapped_keys_and_unknown_tools_as_not_enforced() {
    const S: &str = r#"{"permissions": {"deny": ["Read(./secret.txt)", "ListMcpResourcesTool"],
        "allow": ["FutureTool(x)"], "defaultMode": "acceptEdits"},
      "sandbox": {"enabled": true, "excludedCommands": ["docker"],
        "allowUnsandboxedCommands": false, "autoAllowBashIfSandboxed": true,
        "failIfUnavailable": true, "someFutureKey": 1,
        "network": {"allowUnixSockets": ["/run/x.sock"], "allowLocalBinding": true,
          "httpProxyPort": 3128, "allowManagedDomainsOnly": true}}}"#;
    for who in identities() {
        let t = tree(who);
        write(&t.root.join(".claude/settings.json"), S);
        chown_r(&t.root.join(".claude"));
        let log = t.base.join("audit.jsonl");
        let out = policy(&t, &log, who, &["explain"]);
        let so = stdout(&out);
        let se = stderr(&out);
        let ctx = format!("{who:?}\nstdout:\n{so}\nstderr:\n{se}");
        assert_eq!(out.status.code(), Some(0), "{ctx}");
        let tail = so
            .split("NOT ENFORCED by any kernel layer")
            .nth(1)
            .unwrap_or_else(|| panic!("{ctx}"));
        for k in [
            "sandbox.excludedCommands",
            "sandbox.allowUnsandboxedCommands",
            "sandbox.autoAllowBashIfSandboxed",
            "sandbox.failIfUnavailable",
            "sandbox.someFutureKey",
            // A listed path that is no socket binds nothing
            // (allowLocalBinding is mapped: tests/explain.rs).
            "sandbox.network.allowUnixSockets",
            "sandbox.network.httpProxyPort",
            "sandbox.network.allowManagedDomainsOnly",
            "permissions.defaultMode",
            "ListMcpResourcesTool",
            "FutureTool(x)",
        ] {
            assert!(tail.contains(k), "{k} must be NOT ENFORCED: {ctx}");
        }
        assert!(
            tail.contains("these commands still run inside the sandbox"),
            "{ctx}"
        );
        for tool in ["ListMcpResourcesTool", "FutureTool"] {
            assert!(
                se.contains("warning:") && se.contains(&format!("unknown tool '{tool}'")),
                "{ctx}"
            );
        }
        // The chain runs, and the project's deny still applies.
        let out = policy(
            &t,
            &log,
            who,
            &[
                "chain",
                "--",
                "sh",
                "-c",
                "cat ../../secret.txt; echo CAT=$?",
            ],
        );
        let so = stdout(&out);
        assert_eq!(out.status.code(), Some(0), "{who:?}: {}", stderr(&out));
        assert!(so.contains("CAT=1"), "{who:?}: {so}");
        let secret = t.root.join("secret.txt");
        assert_event(&log, "fs_denied", "alert", |e| {
            e["path"] == secret.to_str().unwrap()
        });
        assert_event(&log, "rule_not_enforced", "warn", |e| {
            e["rule"] == "ListMcpResourcesTool"
        });
    }
}
