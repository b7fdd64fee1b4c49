//! Issue 13, the gaps an attacker pass found after the first round:
//! symlinked control entries, the scripts hooks run, more control files,
//! paths beyond PATH_MAX, repositories inside repositories, and the
//! quarantine itself. Each attack runs through both composed chains
//! (`scripts/sbx-run`, `sbx-policy chain`), as root and as the
//! unprivileged test user; each test asserts the host is unchanged (or
//! only what is allowed changed) and the alert is in the audit log.

mod common;
use common::*;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;

use sbx_testutil::{As, assert_event, identities, stderr, stdout};
use serde_json::Value;

/// Every entry below `dir`: file contents, symlink targets, directories.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(dir.join(&rel)) else {
            continue;
        };
        for e in rd.flatten() {
            let r = rel.join(e.file_name());
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            let v = if m.file_type().is_symlink() {
                format!("link:{}", std::fs::read_link(e.path()).unwrap().display())
            } else if m.is_dir() {
                stack.push(r.clone());
                "dir".to_string()
            } else {
                format!(
                    "file:{}",
                    String::from_utf8_lossy(&std::fs::read(e.path()).unwrap_or_default())
                )
            };
            out.insert(r, v);
        }
    }
    out
}

fn assert_same(before: &BTreeMap<PathBuf, String>, after: &BTreeMap<PathBuf, String>, ctx: &str) {
    for (k, v) in before {
        assert_eq!(after.get(k), Some(v), "{} changed\n{ctx}", k.display());
    }
    for k in after.keys() {
        assert!(before.contains_key(k), "{} appeared\n{ctx}", k.display());
    }
}

fn ctx(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        stdout(out),
        stderr(out)
    )
}

/// The attack ran to its end, nothing escaped, `refused` writes failed.
fn ran(out: &Output, refused: usize) -> String {
    let c = ctx(out);
    assert_eq!(out.status.code(), Some(0), "{c}");
    let so = stdout(out);
    assert!(so.contains("attacked"), "{c}");
    assert!(!so.contains("ESCAPED"), "{c}");
    assert_eq!(so.matches("refused").count(), refused, "{c}");
    c
}

const TRY: &str =
    "try() { if sh -c \"$1\" 2>/dev/null; then echo ESCAPED \"$1\"; else echo refused; fi; }; ";

fn host(t: &ChainTree, rel: &str) -> String {
    t.proj.join(rel).display().to_string()
}

fn path_is(e: &Value, p: &str) -> bool {
    e["path"].as_str() == Some(p)
}

/// Runs `f` for each identity that can use the guard file system and
/// each chain.
fn each(f: impl Fn(As, &str, ChainRunner)) {
    for who in identities() {
        if !fuse_usable(who) {
            sbx_testutil::skip!("/dev/fuse is not usable as {who:?} (run scripts/setup)");
        }
        for (name, run) in CHAINS {
            f(who, name, *run);
        }
    }
}

// ---- 1. symlinked control entries -------------------------------------

#[test]
fn gap1_symlinked_control_entries_protect_their_targets() {
    each(|who, chain, run| {
        let t = ChainTree::new();
        write(&t.proj.join("shared/claude-cfg/settings.json"), "{}\n");
        write(&t.proj.join("shared/vs/tasks.json"), "{\"tasks\":[]}\n");
        std::os::unix::fs::symlink("shared/claude-cfg", t.proj.join(".claude")).unwrap();
        std::os::unix::fs::symlink("shared/vs", t.proj.join(".vscode")).unwrap();
        // Deeper down, a package's own link.
        write(&t.proj.join("shared/claude2/settings.json"), "{}\n");
        std::fs::create_dir_all(t.proj.join("pkgs/web")).unwrap();
        std::os::unix::fs::symlink("../../shared/claude2", t.proj.join("pkgs/web/.claude"))
            .unwrap();
        // A link inside a protected directory: its target too.
        write(&t.proj.join("conf/run.xml"), "<run/>\n");
        std::fs::create_dir_all(t.proj.join(".idea/runConfigurations")).unwrap();
        std::os::unix::fs::symlink(
            "../../conf/run.xml",
            t.proj.join(".idea/runConfigurations/run.xml"),
        )
        .unwrap();
        // Dangling at the start: what appears there during the run goes.
        std::fs::create_dir_all(t.proj.join("pkg")).unwrap();
        std::os::unix::fs::symlink("../shared/vs-new", t.proj.join("pkg/.vscode")).unwrap();
        t.own(who);
        let before = snapshot(&t.proj);
        let log = t.log("gap1");
        let script = format!(
            "{TRY} try 'echo evil >> shared/claude-cfg/settings.json'; \
             try 'echo {{}} > shared/claude-cfg/settings.local.json'; \
             try 'echo evil > shared/vs/tasks.json'; \
             try 'echo evil >> shared/claude2/settings.json'; \
             try 'echo evil >> conf/run.xml'; \
             try 'mv shared shared.orig'; \
             mkdir -p shared/vs-new && echo evil > shared/vs-new/tasks.json; \
             mkdir -p sub && ln -s ../shared/vs-new sub/.vscode && ln -s shared/vs-new .mcp.json; \
             echo attacked"
        );
        let out = run(&t, &log, &script, who);
        let c = format!("{chain} as {who:?}\n{}", ran(&out, 6));
        let mut want = before.clone();
        // The directory made during the run stays, its control link goes.
        want.insert("sub".into(), "dir".into());
        assert_same(&want, &snapshot(&t.proj), &c);
        for rel in [
            "shared/claude-cfg/settings.json",
            "shared/vs/tasks.json",
            "shared/claude2/settings.json",
            "conf/run.xml",
        ] {
            let p = host(&t, rel);
            assert_event(&log, "fs_write_denied", "alert", |e| path_is(e, &p));
        }
        let p = host(&t, "shared/claude-cfg/settings.local.json");
        assert_event(&log, "fs_write_denied", "alert", |e| {
            path_is(e, &p) && e["op"] == "create"
        });
        let vs_new = host(&t, "shared/vs-new");
        let via = host(&t, "pkg/.vscode");
        assert_event(&log, "fs_protected_created", "alert", |e| {
            path_is(e, &vs_new) && e["via"] == via.as_str() && e["quarantined"].is_string()
        });
        for rel in ["sub/.vscode", ".mcp.json"] {
            let p = host(&t, rel);
            assert_event(&log, "fs_protected_created", "alert", |e| {
                path_is(e, &p) && e["quarantined"].is_string()
            });
        }
        // Through another symlink: what it names could change during the
        // run, so the run is refused (one line, 125, alert), nothing runs.
        std::os::unix::fs::symlink("shared/vs", t.proj.join("hop")).unwrap();
        std::os::unix::fs::symlink("hop", t.proj.join(".cursor")).unwrap();
        let log = t.log("gap1-chained");
        let out = run(&t, &log, "echo RAN", who);
        let c = format!("{chain} as {who:?}\n{}", ctx(&out));
        assert_eq!(out.status.code(), Some(125), "{c}");
        assert!(!stdout(&out).contains("RAN"), "{c}");
        assert!(
            stderr(&out)
                .lines()
                .any(|l| l.contains(".cursor") && l.contains("symlink")),
            "{c}"
        );
        let p = host(&t, ".cursor");
        assert_event(&log, "fs_protected_link", "alert", |e| path_is(e, &p));
    });
}

// ---- 2. the scripts hooks run ------------------------------------------

#[test]
fn gap2_scripts_named_by_hook_commands_stay_read_only() {
    each(|who, chain, run| {
        let t = ChainTree::new();
        let proj = t.proj.display().to_string();
        let hooks = serde_json::json!({
            "hooks": {
                "PostToolUse": [{"matcher": "Edit", "hooks": [
                    {"type": "command", "command": "sh tools/a.sh"},
                    {"type": "command", "command": "bash -e tools/b.sh --flag"},
                    {"type": "command", "command": "node lib/c.js"},
                    {"type": "command", "command": "python3 py/d.py --x 1"},
                    {"type": "command", "command": "make -C build all"},
                    {"type": "command", "command": "./run.sh --fast"},
                    {"type": "command", "command": "sh tools/missing.sh"}
                ]}]
            },
            "statusLine": {"type": "command", "command": "cat conf/status.txt | sh"}
        });
        write(&t.proj.join(".claude/settings.json"), &hooks.to_string());
        for rel in [
            "tools/a.sh",
            "tools/b.sh",
            "lib/c.js",
            "py/d.py",
            "build/Makefile",
            "run.sh",
            "conf/status.txt",
            "tools/f.py",
            "tools/g.js",
            "tools/free.sh",
        ] {
            write(&t.proj.join(rel), "true\n");
        }
        // The user's own settings and a plugin's hooks.json run in every
        // project: the project files they name are protected too.
        let user = serde_json::json!({"hooks": {"Stop": [{"hooks": [
            {"type": "command", "command": format!("python3 {proj}/tools/f.py")}
        ]}]}});
        write(&t.home.join(".claude/settings.json"), &user.to_string());
        let plugin = serde_json::json!({"hooks": {"Stop": [{"hooks": [
            {"type": "command", "command": format!("node \"{proj}/tools/g.js\"")}
        ]}]}});
        write(
            &t.home.join(".claude/plugins/acme/hooks/hooks.json"),
            &plugin.to_string(),
        );
        t.own(who);
        let before = snapshot(&t.proj);
        let log = t.log("gap2");
        let mut script = TRY.to_string();
        let targets = [
            "tools/a.sh",
            "tools/b.sh",
            "lib/c.js",
            "py/d.py",
            "build/Makefile",
            "run.sh",
            "conf/status.txt",
            "tools/f.py",
            "tools/g.js",
        ];
        for rel in targets {
            script.push_str(&format!("try 'echo evil >> {rel}'; "));
        }
        script.push_str(
            "try 'echo evil > tools/missing.sh'; try 'mv tools tools.orig'; \
             echo evil > build/GNUmakefile; echo ok >> tools/free.sh; echo attacked",
        );
        let out = run(&t, &log, &script, who);
        let c = format!("{chain} as {who:?}\n{}", ran(&out, targets.len() + 2));
        // The one file no hook names was written; everything else is as it was.
        let mut want = before.clone();
        want.insert("tools/free.sh".into(), "file:true\nok\n".into());
        assert_same(&want, &snapshot(&t.proj), &c);
        for rel in targets.iter().chain(&["tools/missing.sh"]) {
            let p = host(&t, rel);
            assert_event(&log, "fs_write_denied", "alert", |e| path_is(e, &p));
        }
        // A makefile that would take precedence is taken out at the end.
        let p = host(&t, "build/GNUmakefile");
        assert_event(&log, "fs_protected_created", "alert", |e| {
            path_is(e, &p) && e["quarantined"].is_string()
        });
    });
}

// ---- 3. more control files -----------------------------------------------

/// Files (and directories' files) that make the next host session run
/// code: always read-only, existing or not, at any depth.
const MORE_CONTROL: &[&str] = &[
    ".cargo/config.toml",
    ".cargo/config",
    ".npmrc",
    ".yarnrc",
    ".yarnrc.yml",
    ".pnpmfile.cjs",
    ".pre-commit-config.yaml",
    ".cursor/mcp.json",
    ".continue/config.json",
    ".devcontainer/devcontainer.json",
    ".direnv/bin/ls",
    ".tool-versions",
    "mise.toml",
    ".mise.toml",
    ".python-version",
];

/// Left writable on purpose (docs/fs.md says why): they run in CI, not in
/// the next host session, or they are instructions like CLAUDE.md.
const NOT_CONTROL: &[&str] = &[
    ".github/workflows/ci.yml",
    ".gitlab-ci.yml",
    ".cursorrules",
    ".windsurfrules",
];

#[test]
fn gap3_more_control_files_are_read_only_existing_or_not() {
    each(|who, chain, run| {
        let t = ChainTree::new();
        for rel in MORE_CONTROL {
            write(&t.proj.join(rel), "orig\n");
            write(&t.proj.join("pkgs/a/b").join(rel), "orig\n");
        }
        for rel in NOT_CONTROL {
            write(&t.proj.join(rel), "orig\n");
        }
        t.own(who);
        let before = snapshot(&t.proj);
        let log = t.log("gap3");
        let mut script = TRY.to_string();
        for rel in MORE_CONTROL {
            script.push_str(&format!(
                "try 'echo evil >> {rel}'; try 'echo evil >> pkgs/a/b/{rel}'; \
                 mkdir -p $(dirname new/x/y/{rel}) && echo evil > new/x/y/{rel}; "
            ));
        }
        for rel in NOT_CONTROL {
            script.push_str(&format!("echo more >> {rel}; "));
        }
        script.push_str("echo attacked");
        let out = run(&t, &log, &script, who);
        let c = format!("{chain} as {who:?}\n{}", ran(&out, 2 * MORE_CONTROL.len()));
        let mut want = before.clone();
        for rel in NOT_CONTROL {
            want.insert(PathBuf::from(rel), "file:orig\nmore\n".into());
        }
        // The directories made during the run stay (empty of control files).
        let after = snapshot(&t.proj);
        let swept_whole = [".cursor", ".continue", ".devcontainer", ".direnv"];
        for (k, v) in &after {
            if k.starts_with("new")
                && v == "dir"
                && !k.iter().any(|c| swept_whole.iter().any(|s| c == *s))
            {
                want.insert(k.clone(), v.clone());
            }
        }
        assert_same(&want, &after, &c);
        for rel in MORE_CONTROL {
            for at in [rel.to_string(), format!("pkgs/a/b/{rel}")] {
                let p = host(&t, &at);
                assert_event(&log, "fs_write_denied", "alert", |e| path_is(e, &p));
            }
            // Created: the first component that is a control entry goes.
            let top = if rel.starts_with(".cargo/") {
                rel.to_string()
            } else {
                rel.split('/').next().unwrap().to_string()
            };
            let p = host(&t, &format!("new/x/y/{top}"));
            assert_event(&log, "fs_protected_created", "alert", |e| {
                path_is(e, &p) && e["quarantined"].is_string()
            });
        }
    });
}

// ---- 4. beyond PATH_MAX --------------------------------------------------

/// Makes a tree 90 levels of 50-byte names deep (more than 4096 bytes of
/// path) and control files and a repository at its bottom, walking with
/// relative chdir (as an attacker would: no path is ever too long).
const DEEP: &str = "python3 -c \"
import os
for i in range(90):
    os.mkdir('d'*50); os.chdir('d'*50)
os.mkdir('.claude'); open('.claude/settings.json','w').write('{}')
os.mkdir('.vscode'); open('.vscode/tasks.json','w').write('{}')
open('.mcp.json','w').write('{}')
os.mkdir('.git'); open('.git/HEAD','w').write('ref: refs/heads/main')
os.mkdir('.git/objects'); os.mkdir('.git/refs')
print('attacked')\"";

/// `find DIR -name NAME` (find walks with fds: any depth).
fn find_named(dir: &Path, names: &[&str]) -> String {
    let mut c = std::process::Command::new("find");
    c.arg(dir).arg("(");
    for (i, n) in names.iter().enumerate() {
        if i > 0 {
            c.arg("-o");
        }
        c.args(["-name", n]);
    }
    c.arg(")");
    let out = c.output().unwrap();
    assert!(out.status.success(), "find: {}", stderr(&out));
    stdout(&out)
}

#[test]
fn gap4_control_files_beyond_path_max_are_swept_or_refused() {
    each(|who, chain, run| {
        let t = ChainTree::new();
        write(&t.proj.join("README"), "hello\n");
        t.own(who);
        let log = t.log("gap4");
        let out = run(&t, &log, DEEP, who);
        let c = format!("{chain} as {who:?}\n{}", ran(&out, 0));
        // The control files at the bottom are gone from the host: moved to
        // the quarantine at the end, each alerted with its whole path.
        assert_eq!(
            find_named(&t.proj, &[".claude", ".vscode", ".mcp.json"]),
            "",
            "{c}"
        );
        for name in ["/.claude", "/.vscode", "/.mcp.json"] {
            assert_event(&log, "fs_protected_created", "alert", |e| {
                e["path"]
                    .as_str()
                    .is_some_and(|p| p.len() > 4096 && p.ends_with(name))
                    && e["quarantined"].is_string()
            });
        }
        // The repository down there is beyond git's reach, and said so.
        assert_event(&log, "plant_scan_too_deep", "alert", |e| {
            e["entries"].as_u64().is_some_and(|n| n > 0)
        });
        // The next run refuses to start on a tree it cannot protect.
        let log2 = t.log("gap4-next");
        let out = run(&t, &log2, "echo RAN", who);
        let c = format!("{chain} as {who:?}\n{}", ctx(&out));
        assert_eq!(out.status.code(), Some(125), "{c}");
        assert!(!stdout(&out).contains("RAN"), "{c}");
        assert!(
            stderr(&out)
                .lines()
                .any(|l| l.contains("PATH_MAX") && l.contains("refusing to start")),
            "{c}"
        );
        assert_event(&log2, "scan_too_deep", "alert", |e| {
            e["len"].as_u64().is_some_and(|n| n > 3840)
        });
    });
}

// ---- 5. repositories inside repositories ---------------------------------

/// Runs `sh -c script` in `dir` as `who` with a clean git environment.
fn sh_as(who: As, dir: &Path, script: &str) -> Output {
    let mut c = std::process::Command::new("sh");
    c.arg("-c")
        .arg(script)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_COMMON_DIR");
    sbx_testutil::run_as(&mut c, who);
    c.output().unwrap()
}

#[test]
fn gap5_plants_look_inside_known_repositories() {
    each(|who, chain, run| {
        let t = ChainTree::new();
        let p = &t.proj;
        // The user's: a nested repository with a submodule (its git dir in
        // keep/.git/modules/sub) and worktree config on, and a bare one.
        git(p, &["init", "-q", "-b", "main", "subsrc"]);
        write(&p.join("subsrc/f"), "f\n");
        git(&p.join("subsrc"), &["add", "f"]);
        git(&p.join("subsrc"), &["commit", "-qm", "sub"]);
        git(p, &["init", "-q", "-b", "main", "keep"]);
        write(&p.join("keep/k"), "k\n");
        git(&p.join("keep"), &["add", "k"]);
        git(&p.join("keep"), &["commit", "-qm", "keep"]);
        git(
            &p.join("keep"),
            &[
                "-c",
                "protocol.file.allow=always",
                "submodule",
                "add",
                "-q",
                "../subsrc",
                "sub",
            ],
        );
        git(&p.join("keep"), &["commit", "-qm", "submodule"]);
        git(
            &p.join("keep"),
            &["config", "extensions.worktreeConfig", "true"],
        );
        git(p, &["init", "-q", "--bare", "-b", "main", "backup.git"]);
        assert!(p.join("keep/.git/modules/sub/HEAD").is_file());
        t.own(who);
        let before = snapshot(p);
        let m = |tag: &str| t.state.join(format!("MARK-{tag}")).display().to_string();
        let log = t.log("gap5");
        let script = format!(
            "set -e; \
             printf '[core]\\n\\tfsmonitor = touch {sub}\\n' >> keep/.git/modules/sub/config; \
             printf '[core]\\n\\tfsmonitor = touch {wt}\\n' > keep/.git/config.worktree; \
             printf '#!/bin/sh\\ntouch {hook}\\n' > backup.git/hooks/post-update; chmod +x backup.git/hooks/post-update; \
             printf '[alias]\\n\\tst = !touch {bare}\\n' >> backup.git/config; \
             mkdir -p keep/.git/modules/evil/objects keep/.git/modules/evil/refs keep/evil; \
             printf 'ref: refs/heads/main\\n' > keep/.git/modules/evil/HEAD; \
             printf '[core]\\n\\tfsmonitor = touch {evil}\\n[alias]\\n\\tst = !touch {evil}\\n' > keep/.git/modules/evil/config; \
             echo 'gitdir: ../.git/modules/evil' > keep/evil/.git; echo attacked",
            sub = m("sub"),
            wt = m("wt"),
            hook = m("hook"),
            bare = m("bare"),
            evil = m("evil"),
        );
        let out = run(&t, &log, &script, who);
        let c = format!("{chain} as {who:?}\n{}", ran(&out, 0));
        // The owner's git, where the plants would run: nothing runs.
        for (dir, cmd) in [
            ("keep/sub", "echo x > f; git status >/dev/null 2>&1; true"),
            ("keep", "echo y > k; git status >/dev/null 2>&1; true"),
            (
                "keep/evil",
                "git status >/dev/null 2>&1; git st >/dev/null 2>&1; true",
            ),
            ("backup.git", "git st >/dev/null 2>&1; true"),
        ] {
            if p.join(dir).is_dir() {
                sh_as(who, &p.join(dir), cmd);
            }
        }
        for tag in ["sub", "wt", "hook", "bare", "evil"] {
            assert!(!Path::new(&m(tag)).exists(), "{tag} ran\n{c}");
        }
        // Put the files back as the checks above left them, then compare:
        // the user's repositories are as they were, the plant is gone.
        write(&p.join("keep/sub/f"), "f\n");
        write(&p.join("keep/k"), "k\n");
        let after = snapshot(p);
        for rel in [
            "keep/.git/modules/sub/config",
            "keep/.git/config",
            "backup.git/config",
            "backup.git/HEAD",
        ] {
            assert_eq!(
                after.get(Path::new(rel)),
                before.get(Path::new(rel)),
                "{rel}\n{c}"
            );
        }
        for rel in [
            "keep/.git/config.worktree",
            "backup.git/hooks/post-update",
            "keep/.git/modules/evil/HEAD",
        ] {
            assert!(!after.contains_key(Path::new(rel)), "{rel} left\n{c}");
        }
        let at = |rel: &str| p.join(rel).display().to_string();
        for rel in ["keep/.git/modules/sub", "keep/.git", "backup.git"] {
            let want = at(rel);
            assert_event(&log, "git_repo_changed", "alert", |e| path_is(e, &want));
        }
        let evil = at("keep/.git/modules/evil");
        assert_event(&log, "git_repo_planted", "alert", |e| path_is(e, &evil));
    });
}

// ---- 6. the quarantine -----------------------------------------------------

/// Files below `dir`, with their apparent size and allocated bytes.
fn sizes_below(dir: &Path) -> Vec<(PathBuf, u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            if m.is_dir() {
                stack.push(e.path());
            } else if m.is_file() {
                out.push((e.path(), m.len(), m.blocks() * 512));
            }
        }
    }
    out
}

#[test]
fn gap6_a_sparse_file_quarantined_across_file_systems_stays_sparse() {
    each(|who, chain, run| {
        let mut t = ChainTree::new();
        // The quarantine on another file system (tmpfs) than the project:
        // the sweep copies; a 4 GiB sparse file must not become 4 GiB.
        let shm = tempfile::Builder::new()
            .prefix("sbx-test-q-")
            .tempdir_in("/dev/shm")
            .unwrap();
        t.state = shm.path().to_path_buf();
        write(&t.proj.join("README"), "hello\n");
        t.own(who);
        if who == As::User {
            chown_r(&t.state);
        }
        let before = snapshot(&t.proj);
        let log = t.log("gap6-sparse");
        let out = run(
            &t,
            &log,
            "mkdir -p pkg/.vscode && truncate -s 4G pkg/.vscode/big.bin && \
             printf tail >> pkg/.vscode/big.bin && echo '{}' > pkg/.vscode/tasks.json && echo attacked",
            who,
        );
        let c = format!("{chain} as {who:?}\n{}", ran(&out, 0));
        let mut want = before.clone();
        want.insert("pkg".into(), "dir".into());
        assert_same(&want, &snapshot(&t.proj), &c);
        let vs = host(&t, "pkg/.vscode");
        assert_event(&log, "fs_protected_created", "alert", |e| {
            path_is(e, &vs) && e["truncated"] == false && e["quarantined"].is_string()
        });
        let files = sizes_below(&t.state);
        let big = files
            .iter()
            .find(|(p, _, _)| p.ends_with("pkg/.vscode/big.bin"))
            .unwrap_or_else(|| panic!("not quarantined: {files:?}\n{c}"));
        assert_eq!(big.1, (4 << 30) + 4, "{c}");
        assert!(big.2 < 1 << 20, "the copy takes {} bytes\n{c}", big.2);
        let mut tail = [0u8; 4];
        use std::os::unix::fs::FileExt;
        std::fs::File::open(&big.0)
            .unwrap()
            .read_exact_at(&mut tail, 4 << 30)
            .unwrap();
        assert_eq!(&tail, b"tail", "{c}");
        // The test user's quarantine holds mode-000 slots of gitguard's
        // (none here) and 0700 dirs: root removes it with the tempdir.
        drop(shm);
    });
}

/// A bind mount of `src` on `dst` (made by root, in the host's mount
/// namespace, on a directory the test made), undone on drop.
struct Alias(PathBuf);

impl Alias {
    fn new(src: &Path, dst: &Path) -> Alias {
        std::fs::create_dir_all(dst).unwrap();
        let st = std::process::Command::new("mount")
            .arg("--bind")
            .arg(src)
            .arg(dst)
            .status()
            .unwrap();
        assert!(st.success(), "mount --bind");
        Alias(dst.to_path_buf())
    }
}

impl Drop for Alias {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn gap6_a_quarantine_reached_through_an_alias_of_the_project_is_refused() {
    if !sbx_testutil::is_root() {
        sbx_testutil::skip!("making a bind mount needs root (the test user runs under it)");
    }
    each(|who, chain, run| {
        let t = ChainTree::new();
        write(&t.proj.join("README"), "hello\n");
        let inner = t.proj.join("inner");
        std::fs::create_dir_all(&inner).unwrap();
        t.own(who);
        // XDG_STATE_HOME reaches a directory inside the project through
        // a bind mount (no ancestor in common): the default quarantine
        // there is skipped, the next one (the home's) is used.
        let alias_dir = t.proj.parent().unwrap().join("alias");
        let _alias = Alias::new(&inner, &alias_dir);
        let t2 = ChainTree {
            _d: tempfile::tempdir().unwrap(),
            proj: t.proj.clone(),
            home: t.home.clone(),
            state: alias_dir.clone(),
        };
        let before = snapshot(&t.proj);
        let log = t.log("gap6-alias");
        let out = run(
            &t2,
            &log,
            "echo '{}' > .mcp.json; mkdir -p x/.git/objects x/.git/refs; \
             printf 'ref: refs/heads/main\\n' > x/.git/HEAD; echo attacked",
            who,
        );
        let c = format!("{chain} as {who:?}\n{}", ran(&out, 0));
        // Nothing of the quarantines was made inside the project (`x`,
        // made in the run, stays without its .git).
        let mut want = before.clone();
        want.insert("x".into(), "dir".into());
        assert_same(&want, &snapshot(&t.proj), &c);
        let mcp = host(&t, ".mcp.json");
        let home_q = t.home.join(".local/state/sbx/quarantine");
        // sbx-gitguard plants' default quarantine skips the alias too.
        let x = host(&t, "x/.git");
        assert_event(&log, "git_repo_planted", "alert", |e| {
            path_is(e, &x)
                && e["quarantine"]
                    .as_str()
                    .is_some_and(|q| q.starts_with(home_q.to_str().unwrap()))
        });
        assert_event(&log, "fs_protected_created", "alert", |e| {
            path_is(e, &mcp)
                && e["quarantined"]
                    .as_str()
                    .is_some_and(|q| q.starts_with(home_q.to_str().unwrap()))
        });
        // sbx-fs --quarantine ALIAS: refused before anything runs.
        let mut cmd = sbx_testutil::tool("sbx-fs");
        let log2 = t.log("gap6-flag");
        cmd.arg("--audit-log")
            .arg(&log2)
            .arg("--rw")
            .arg(&t.proj)
            .arg("--quarantine")
            .arg(&alias_dir)
            .args(["--", "sh", "-c", "echo ran > ran.txt"])
            .current_dir(&t.proj);
        sbx_testutil::run_as(&mut cmd, who);
        let out = cmd.output().unwrap();
        sbx_testutil::assert_usage_error(&out, "inside the writable bind");
        assert!(!t.proj.join("ran.txt").exists(), "the command ran");
        assert_event(&log2, "fs_quarantine_refused", "alert", |e| {
            e["path"] == alias_dir.to_str().unwrap()
        });
        // Not a directory, or missing: refused the same way.
        for bad in [t.proj.join("README"), t.proj.parent().unwrap().join("nope")] {
            let mut cmd = sbx_testutil::tool("sbx-fs");
            cmd.arg("--rw")
                .arg(&t.proj)
                .arg("--quarantine")
                .arg(&bad)
                .args(["--", "true"]);
            sbx_testutil::run_as(&mut cmd, who);
            let out = cmd.output().unwrap();
            sbx_testutil::assert_usage_error(&out, "--quarantine");
        }
    });
}

// ---- host-side reads of what an earlier run left ---------------------

/// A `.git` an earlier run left whose gitfile or `commondir` is a link to
/// `/proc/kmsg` (a regular file of size 0 whose read blocks, and consumes
/// the kernel log), a FIFO or a 2 GB file: the chains' own project
/// discovery (scripts/sbx-run's shell, sbx-policy's project.rs) reads at
/// most 4 KiB of a non-empty regular file outside /proc, without blocking;
/// the run ends (it runs, or sbx-gitguard refuses the damaged repository
/// with 125), never hangs.
#[test]
fn a_planted_gitfile_or_commondir_is_never_read_unbounded() {
    each(|who, chain, run| {
        for plant in [
            "kmsg-commondir",
            "kmsg-gitfile",
            "fifo-commondir",
            "huge-gitfile",
        ] {
            let t = ChainTree::new();
            let git = t.proj.join(".git");
            let target = |p: &Path| match plant.split_once('-').unwrap().0 {
                "kmsg" => std::os::unix::fs::symlink("/proc/kmsg", p).unwrap(),
                "fifo" => sbx_testutil::mkfifo(p),
                _ => {
                    let f = std::fs::File::create(p).unwrap();
                    f.set_len(2 << 30).unwrap();
                }
            };
            if plant.ends_with("commondir") {
                std::fs::create_dir_all(git.join("objects")).unwrap();
                std::fs::create_dir_all(git.join("refs")).unwrap();
                write(&git.join("HEAD"), "garbage\n");
                target(&git.join("commondir"));
            } else {
                target(&git);
            }
            t.own(who);
            let log = t.log("plant");
            let out = run(&t, &log, "echo ran", who);
            let c = format!("{chain} {who:?} {plant}: {}", ctx(&out));
            match out.status.code() {
                Some(0) => assert!(stdout(&out).contains("ran"), "{c}"),
                Some(125) => assert_eq!(stderr(&out).trim().lines().count(), 1, "{c}"),
                _ => panic!("{c}"),
            }
        }
    });
}
