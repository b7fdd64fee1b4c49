//! Repositories planted by the sandboxed command, through the two composed
//! chains (scripts/sbx-run and sbx-policy chain), in a project that is a git
//! repository and in one that is not: afterwards no git command run in the
//! project by its owner runs a planted program, the user's own nested
//! repository is untouched, and the alert is in the audit log. As root and
//! as the unprivileged test user; and as root in the test user's repository
//! (git's "dubious ownership"), where sbx-gitguard must stay in the chain.

mod common;
use common::*;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sbx_testutil::{As, assert_event, audit_events, identities, run_as, stderr, stdout};

/// One planted repository per shape git accepts (see
/// crates/sbx-gitguard/tests/plants.rs): executable objects/refs files, a
/// commondir, a .git file, a .git symlink, a deep bare-shaped directory.
/// No `set -e`: what the sandbox refuses to create is fine too.
const PLANTS: &str = r#"
mk() { mkdir -p "$1"; printf 'ref: refs/heads/main\n' > "$1/HEAD"; printf '[core]\n\tfsmonitor = touch %s-%s\n[alias]\n\tst = !touch %s-%s\n' "$MARK" "$2" "$MARK" "$2" > "$1/config"; }
mk a/.git a; : > a/.git/objects; : > a/.git/refs; chmod +x a/.git/objects a/.git/refs
mkdir -p deep/b/.git common/objects common/refs
printf 'ref: refs/heads/main\n' > deep/b/.git/HEAD; echo ../../../common > deep/b/.git/commondir
printf '[core]\n\tfsmonitor = touch %s-b\n' "$MARK" > common/config
mk hidden c; mkdir hidden/objects hidden/refs; mkdir c; echo 'gitdir: ../hidden' > c/.git
mk hidden2 d; mkdir hidden2/objects hidden2/refs; mkdir d; ln -s ../hidden2 d/.git
mk x/y/z/e e; mkdir x/y/z/e/objects x/y/z/e/refs
echo PLANTED=done
"#;

const PLANTED: &[(&str, &str)] = &[
    ("a", "a"),
    ("deep/b", "b"),
    ("c", "c"),
    ("d", "d"),
    ("x/y/z/e", "e"),
];

const SETTINGS: &str = r#"{"permissions": {"allow": ["Edit(./**)", "Bash(sh:*)", "Bash(mkdir)", "Bash(printf)", "Bash(chmod)", "Bash(ln)", "Bash(echo)", "Bash(git:*)", "Bash(true)"]}}"#;

struct Proj {
    _d: tempfile::TempDir,
    base: PathBuf,
    root: PathBuf,
    home: PathBuf,
    mark: PathBuf,
    log: PathBuf,
}

#[derive(Clone, Copy, Debug)]
enum Chain {
    SbxRun,
    Policy,
}

fn project(git_project: bool, owner: As) -> Proj {
    let d = sbx_testutil::shared_tempdir();
    let base = d.path().canonicalize().unwrap();
    let root = base.join("proj");
    let home = base.join("home");
    write(&root.join("src/main.sh"), "echo hi\n");
    write(&home.join(".gitconfig"), "[user]\n\tname = agent\n");
    write(&root.join(".claude/settings.json"), SETTINGS);
    if git_project {
        git(&root, &["init", "-q", "-b", "main"]);
        write(&root.join(".gitignore"), "keep/\n.claude/\n");
        git(&root, &["add", "-A"]);
        git(&root, &["commit", "-qm", "init"]);
    }
    // The user's own nested repository.
    let keep = root.join("keep");
    std::fs::create_dir_all(&keep).unwrap();
    git(&keep, &["init", "-q", "-b", "main"]);
    write(&keep.join("k"), "k\n");
    git(&keep, &["add", "k"]);
    git(&keep, &["commit", "-qm", "keep"]);
    if owner == As::User {
        chown_r(&base);
    }
    Proj {
        _d: d,
        mark: base.join("MARK"),
        log: base.join("audit.jsonl"),
        base,
        root,
        home,
    }
}

fn run(p: &Proj, chain: Chain, who: As, script: &str) -> Output {
    let mut c = match chain {
        Chain::SbxRun => {
            let mut c = Command::new("sh");
            c.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/sbx-run"))
                .arg("-C")
                .arg(&p.root)
                .arg("-l")
                .arg(&p.log)
                .args(["--", "sh", "-c", script]);
            c.env("SBX_BIN", sbx_testutil::bin("sbx-fs").parent().unwrap())
                .env_remove("SBX_ID")
                .env_remove("SBX_AUDIT_LOG");
            c
        }
        Chain::Policy => {
            let mut c = sbx_testutil::tool("sbx-policy");
            c.arg("--audit-log").arg(&p.log);
            c.args(["chain", "--managed", "/nonexistent/managed.json", "--home"])
                .arg(&p.home);
            c.args(["--", "sh", "-c", script]);
            c
        }
    };
    // The quarantine goes to a directory of the test, outside the project.
    c.current_dir(&p.root)
        .env("PATH", PATH)
        .env("MARK", &p.mark)
        .env("XDG_STATE_HOME", p.base.join("state"));
    run_as(&mut c, who);
    c.output().unwrap()
}

/// What the owner's prompt and fingers run in `rel`; whether the planted
/// program `tag` ran.
fn git_runs_plant(p: &Proj, who: As, rel: &str, tag: &str) -> bool {
    let d = p.root.join(rel);
    if d.is_dir() {
        let mut c = Command::new("sh");
        c.args([
            "-c",
            "echo x > f 2>/dev/null; git status >/dev/null 2>&1; git st >/dev/null 2>&1; true",
        ])
        .current_dir(&d)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", &p.home)
        .env_remove("GIT_DIR");
        run_as(&mut c, who);
        let _ = c.status();
    }
    Path::new(&format!("{}-{tag}", p.mark.display())).exists()
}

fn ino(p: &Path) -> u64 {
    std::fs::symlink_metadata(p).unwrap().ino()
}

#[test]
fn planted_repositories_are_quarantined_through_both_chains_git_project_or_not() {
    for who in identities() {
        for git_project in [false, true] {
            for chain in [Chain::SbxRun, Chain::Policy] {
                let p = project(git_project, who);
                let keep_ino = ino(&p.root.join("keep/.git"));
                let out = run(&p, chain, who, PLANTS);
                let so = stdout(&out);
                let ctx = format!(
                    "{who:?} {chain:?} git_project={git_project}\nstdout:\n{so}\nstderr:\n{}",
                    stderr(&out)
                );
                assert_eq!(out.status.code(), Some(0), "{ctx}");
                assert!(so.contains("PLANTED=done"), "{ctx}");
                for (rel, tag) in PLANTED {
                    assert!(
                        !git_runs_plant(&p, who, rel, tag),
                        "git in {rel} ran the planted program: {ctx}"
                    );
                }
                // What landed on the host was quarantined, with its alert.
                for rel in ["a/.git", "x/y/z/e"] {
                    let full = p.root.join(rel);
                    assert_event(&p.log, "git_repo_planted", "alert", |e| {
                        e["path"] == full.to_str().unwrap()
                            && e["action"]
                                .as_str()
                                .is_some_and(|a| a.contains("quarantined in"))
                    });
                }
                assert!(!p.root.join("a/.git").exists(), "{ctx}");
                // The user's own repository is untouched.
                assert_eq!(ino(&p.root.join("keep/.git")), keep_ino, "{ctx}");
                assert_eq!(git(&p.root.join("keep"), &["log", "--format=%s"]), "keep\n");
                if git_project {
                    git(&p.root, &["fsck", "--strict", "--no-progress"]);
                    assert_event(&p.log, "git_verified", "info", |_| true);
                }
                let evs = audit_events(&p.log);
                let ids: std::collections::BTreeSet<_> =
                    evs.iter().map(|e| e["sbx_id"].to_string()).collect();
                assert_eq!(ids.len(), 1, "one sandbox id: {ctx}");
            }
        }
    }
}

#[test]
fn as_root_in_the_test_users_repository_gitguard_stays_in_the_chain() {
    if !sbx_testutil::is_root() || sbx_testutil::test_user().is_none() {
        sbx_testutil::skip!("needs root and the test user");
    }
    for chain in [Chain::SbxRun, Chain::Policy] {
        // The repository belongs to the test user; root runs the chain:
        // git itself refuses the repository ("dubious ownership").
        let p = project(true, As::User);
        let o = Command::new("git")
            .args(["rev-parse", "--git-dir"])
            .current_dir(&p.root)
            .env("HOME", &p.home)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .output()
            .unwrap();
        assert!(
            !o.status.success() && stderr(&o).contains("dubious ownership"),
            "premise: git refuses the repository as root: {}",
            stderr(&o)
        );
        let head = git(&p.root, &["rev-parse", "HEAD"]);
        let out = run(&p, chain, As::Root, "echo RAN=$?");
        let ctx = format!(
            "{chain:?}\nstdout:\n{}\nstderr:\n{}",
            stdout(&out),
            stderr(&out)
        );
        assert_eq!(out.status.code(), Some(0), "{ctx}");
        assert!(stdout(&out).contains("RAN=0"), "{ctx}");
        // sbx-gitguard was in the chain: snapshot, stage, verification, and
        // the plant check; the repository is as it was.
        for ev in [
            "git_snapshot",
            "git_stage_created",
            "git_stage_imported",
            "git_verified",
            "git_plants_checked",
        ] {
            assert_event(&p.log, ev, "info", |e| e["tool"] == "sbx-gitguard");
        }
        assert_eq!(git(&p.root, &["rev-parse", "HEAD"]), head, "{ctx}");
        git(&p.root, &["fsck", "--strict", "--no-progress"]);
        // The stage is gone.
        let leftover: Vec<_> = std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| {
                let ev = audit_events(&p.log);
                ev.iter().any(|x| {
                    x["event"] == "git_stage_created" && x["stage"].as_str() == e.path().to_str()
                })
            })
            .collect();
        assert!(leftover.is_empty(), "stage left behind: {ctx}");
    }
}
