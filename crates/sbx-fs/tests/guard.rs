//! The guard file system: refused file accesses are observable. Reading a
//! denied path and writing a protected one fail as before AND leave an
//! alert in the audit log (`fs_denied`, `fs_write_denied`); reading the
//! protected files still returns their real content; a flood is one line;
//! a full /tmp is an alert (`tmp_full`); without a usable /dev/fuse the
//! sandbox still runs, with plain placeholders and one warn event. As root
//! and as the unprivileged test user.

mod common;

use std::process::Command;

use common::*;
use sbx_testutil::{assert_event, audit_events};
use serde_json::Value;

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

/// Whether `who` can open /dev/fuse (scripts/setup makes it 0666, as the
/// fuse3 package intends); the alert tests skip otherwise (and fail under
/// SBX_MUST_WORK=1).
fn fuse_usable(who: sbx_testutil::As) -> bool {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata("/dev/fuse") {
        Ok(m) => who == sbx_testutil::As::Root || m.permissions().mode() & 0o006 == 0o006,
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

fn ends(e: &Value, suffix: &str) -> bool {
    e["path"].as_str().is_some_and(|p| p.ends_with(suffix))
}

fn has_caller(e: &Value) -> bool {
    e["caller_pid"].as_u64().is_some_and(|p| p > 0)
}

/// A real git repository with one commit, a .claude/settings.json, a hook
/// sample (made on the host, as the test identity).
fn project(s: &Scratch) {
    s.write(
        ".claude-settings",
        "{\"permissions\":{\"deny\":[\"Read(.env)\"]}}\n",
    );
    s.write(
        "proj/.claude/settings.json",
        "{\"permissions\":{\"deny\":[\"Read(.env)\"]}}\n",
    );
    let p = s.proj();
    // Older than the index git writes: not "racily clean", so a `git
    // status` inside does not rewrite the index (the test compares the
    // host tree before and after).
    std::fs::File::options()
        .write(true)
        .open(p.join("README"))
        .and_then(|f| {
            f.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(10))
        })
        .unwrap();
    for args in [
        &["init", "-q", "-b", "main", "."][..],
        &["add", "README"][..],
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "-m",
            "first commit",
        ][..],
    ] {
        let mut c = Command::new("git");
        run_as(&mut c, s.who);
        let st = c
            .args(args)
            .current_dir(&p)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", s.home())
            .status()
            .unwrap();
        assert!(st.success(), "git {args:?}");
    }
    s.own();
}

#[test]
fn reading_denied_paths_is_refused_and_logged() {
    for who in identities() {
        need_fuse!(who);
        let s = Scratch::new(who);
        s.write("home/.ssh/id_ed25519", "PRIVATE-KEY-MATERIAL\n");
        s.write("home/.ssh/config", "Host x\n");
        s.write("home/.aws/credentials", "AWS-SECRET\n");
        s.write("home/work/credentials.json", "CRED-SECRET\n");
        s.write("proj/.env", "DOTENV-SECRET\n");
        let before = s.snapshot();
        let home = s.home();
        let home = home.to_str().unwrap();
        let script = format!(
            "for p in {home}/.ssh/id_ed25519 .env {home}/work/credentials.json {home}/.aws/credentials; do \
               if cat $p 2>/dev/null; then echo ESCAPED $p; else echo refused $p; fi; done; \
             if ls {home}/.ssh 2>/dev/null; then echo ESCAPED-list; else echo refused list; fi; \
             stat -c '%a %s' .env"
        );
        let (out, log) = s.run_rw(&["--ro", home], &script);
        let so = ok(&out);
        assert_eq!(so.matches("refused").count(), 5, "{so}");
        // stat shows the old placeholder: mode 000, empty.
        assert!(so.contains("0 0"), "{so}");
        assert_refused(&out, "SECRET", "denied");
        assert_refused(&out, "PRIVATE-KEY-MATERIAL", "ssh key");
        let key = format!("{home}/.ssh/id_ed25519");
        assert_event(&log, "fs_denied", "alert", |e| {
            e["path"] == key.as_str() && e["access"] == "lookup" && has_caller(e)
        });
        assert_event(&log, "fs_denied", "alert", |e| {
            ends(e, "/proj/.env") && e["access"] == "read" && has_caller(e)
        });
        assert_event(&log, "fs_denied", "alert", |e| {
            ends(e, "/work/credentials.json") && e["access"] == "read"
        });
        assert_event(&log, "fs_denied", "alert", |e| {
            ends(e, "/.aws/credentials") && e["access"] == "lookup"
        });
        let ssh = format!("{home}/.ssh");
        assert_event(&log, "fs_denied", "alert", |e| {
            e["path"] == ssh.as_str() && e["access"] == "list"
        });
        assert!(
            !audit_events(&log)
                .iter()
                .any(|e| e["event"] == "fs_guard_unavailable"),
            "the guard fs was not used (is /dev/fuse 0666? run scripts/setup)"
        );
        s.assert_clean(&before);
    }
}

#[test]
fn writing_protected_paths_is_refused_and_logged_reading_works() {
    if !sbx_testutil::have("git") {
        sbx_testutil::skip!("git not installed");
    }
    for who in identities() {
        need_fuse!(who);
        let s = Scratch::new(who);
        project(&s);
        let before = s.snapshot();
        let script = "export GIT_CONFIG_NOSYSTEM=1; \
             if echo '{\"permissions\":{\"allow\":[\"Bash(*)\"]}}' > .claude/settings.json; then echo ESCAPED-settings; fi; \
             if echo '{}' > .claude/settings.local.json; then echo ESCAPED-local; fi; \
             if cp README .git/hooks/pre-commit; then echo ESCAPED-hook; fi; \
             if git config core.hooksPath /tmp; then echo ESCAPED-hookspath; fi; \
             if chmod 777 .git/hooks; then echo ESCAPED-chmod; fi; \
             echo settings: $(cat .claude/settings.json); \
             grep -q '^\\[core\\]' .git/config && echo config-read; \
             git status --short && echo status-ok; \
             git log --oneline | grep -q 'first commit' && echo log-ok; \
             ls .git/hooks | grep -q sample && echo hooks-listed; true";
        let (out, log) = s.run_rw(&[], script);
        let so = ok(&out);
        assert!(so.contains("settings: {\"permissions\":{\"deny\""), "{so}");
        for want in ["config-read", "status-ok", "log-ok", "hooks-listed"] {
            assert!(so.contains(want), "{want} missing:\n{so}\n{}", stderr(&out));
        }
        assert_event(&log, "fs_write_denied", "alert", |e| {
            ends(e, "/.claude/settings.json") && e["op"] == "open-write" && has_caller(e)
        });
        assert_event(&log, "fs_write_denied", "alert", |e| {
            ends(e, "/.claude/settings.local.json") && e["op"] == "create" && has_caller(e)
        });
        assert_event(&log, "fs_write_denied", "alert", |e| {
            ends(e, "/.git/hooks/pre-commit") && e["op"] == "create" && has_caller(e)
        });
        assert_event(&log, "fs_write_denied", "alert", |e| {
            ends(e, "/.git/config") && e["op"] == "replace"
        });
        assert_event(&log, "fs_write_denied", "alert", |e| {
            ends(e, "/.git/hooks") && e["op"] == "setattr"
        });
        // Nothing changed on the host.
        s.assert_clean(&before);
        let cfg = std::fs::read_to_string(s.path("proj/.git/config")).unwrap();
        assert!(!cfg.contains("hooksPath"), "{cfg}");
    }
}

/// Protected entries whose group or owner the sandbox's user namespace
/// cannot map (a project of group root; a settings file root made in the
/// user's project): a write is refused by the guard with its alert, not by
/// the kernel with a bare EACCES (it refuses writes to inodes with unmapped
/// ids before asking the file system). Reading still works.
#[test]
fn writes_to_protected_entries_with_unmapped_ids_are_alerts() {
    for who in identities() {
        need_fuse!(who);
        let s = Scratch::new(who);
        project(&s);
        let proj = s.proj();
        let st = Command::new("chown")
            .args(["-R", ":0"])
            .arg(&proj)
            .status()
            .unwrap();
        assert!(st.success());
        std::os::unix::fs::chown(proj.join(".claude/settings.json"), Some(0), Some(0)).unwrap();
        let before = s.snapshot();
        let script = "if echo x > .claude/settings.json; then echo ESCAPED-settings; fi; \
             if echo y > .claude/new.json; then echo ESCAPED-new; fi; \
             if echo z > .git/hooks/pre-commit; then echo ESCAPED-hook; fi; \
             echo settings: $(cat .claude/settings.json)";
        let (out, log) = s.run_rw(&[], script);
        let so = ok(&out);
        assert!(so.contains("settings: {\"permissions\""), "{so}");
        assert!(
            stderr(&out).contains("Read-only file system"),
            "{who:?}: refused by the kernel, not by the guard:\n{}",
            stderr(&out)
        );
        for (path, op) in [
            ("/.claude/settings.json", "open-write"),
            ("/.claude/new.json", "create"),
            ("/.git/hooks/pre-commit", "create"),
        ] {
            assert_event(&log, "fs_write_denied", "alert", |e| {
                ends(e, path) && e["op"] == op && has_caller(e)
            });
        }
        s.assert_clean(&before);
    }
}

#[test]
fn a_flood_of_denied_opens_is_one_line() {
    if !sbx_testutil::have("python3") {
        sbx_testutil::skip!("python3 not installed");
    }
    for who in identities() {
        need_fuse!(who);
        let s = Scratch::new(who);
        s.write("proj/.env", "DOTENV-SECRET\n");
        let script = "python3 -c '\nimport os\nn=0\nfor i in range(10000):\n  try:\n    os.close(os.open(\".env\", os.O_RDONLY))\n  except PermissionError:\n    n+=1\nprint(\"refused\", n)'";
        let (out, log) = s.run_rw(&[], script);
        let so = ok(&out);
        assert!(so.contains("refused 10000"), "{so}");
        let evs = audit_events(&log);
        let denied = evs.iter().filter(|e| e["event"] == "fs_denied").count();
        assert_eq!(denied, 1, "one line for the same path and access");
        assert!(evs.len() < 10, "{} lines", evs.len());
        assert_event(&log, "fs_guard", "info", |e| {
            e["alerts_suppressed"].as_u64().is_some_and(|n| n >= 9999)
        });
    }
}

#[test]
fn filling_tmp_is_an_alert() {
    for who in identities() {
        let s = Scratch::new(who);
        let script = "dd if=/dev/zero of=/tmp/fill bs=64k count=200 2>/dev/null && echo ESCAPED-fill; \
                      df -k /tmp | tail -1; true";
        let (out, log) = s.run(&["--tmp-size", "2M"], script);
        ok(&out);
        assert_event(&log, "tmp_full", "alert", |e| {
            e["path"] == "/tmp" && e["size"] == 2 * 1024 * 1024
        });
        assert_eq!(
            audit_events(&log)
                .iter()
                .filter(|e| e["event"] == "tmp_full")
                .count(),
            1
        );
    }
}

/// Without an openable /dev/fuse (here: a mode-000 file bound over it in a
/// private mount namespace made for this run), the sandbox runs with the
/// plain placeholders: the attacks still fail, one warn event says why.
#[test]
fn without_dev_fuse_it_falls_back_and_says_so() {
    if !sbx_testutil::is_root() {
        sbx_testutil::skip!("needs root to hide /dev/fuse in a private mount namespace");
    }
    if !sbx_testutil::have("unshare") {
        sbx_testutil::skip!("unshare (util-linux) not installed");
    }
    for who in identities() {
        let s = Scratch::new(who);
        s.write("proj/.env", "DOTENV-SECRET\n");
        s.write("proj/.claude/settings.json", "{}\n");
        let blocker = s.path("no-fuse");
        std::fs::write(&blocker, "").unwrap();
        std::fs::set_permissions(
            &blocker,
            std::os::unix::fs::PermissionsExt::from_mode(0o000),
        )
        .unwrap();
        let before = s.snapshot();
        let log = s.log();
        let inner = s.cmd(
            &log,
            &[
                "--rw",
                s.proj().to_str().unwrap(),
                "--chdir",
                s.proj().to_str().unwrap(),
            ],
            "if cat .env 2>/dev/null; then echo ESCAPED-read; fi; \
             if echo x > .claude/settings.json; then echo ESCAPED-write; fi; echo ran",
        );
        // unshare -m (private), bind the blocker over /dev/fuse, then the
        // same sbx-fs command line as `who` (setpriv after the mount).
        let switch = match who {
            sbx_testutil::As::User => {
                let (uid, gid) = sbx_testutil::test_user().unwrap();
                format!("setpriv --reuid={uid} --regid={gid} --clear-groups ")
            }
            sbx_testutil::As::Root => String::new(),
        };
        let mut c = Command::new("unshare");
        c.args(["-m", "--propagation", "private", "sh", "-c"])
            .arg(format!(
                "mount --bind {} /dev/fuse && exec {switch}\"$0\" \"$@\"",
                blocker.display()
            ))
            .arg(inner.get_program())
            .args(inner.get_args())
            .current_dir(s.root())
            .env("HOME", s.home())
            .env_remove("SBX_AUDIT_LOG")
            .env_remove("SBX_AUDIT_FD")
            .env_remove("SBX_ID");
        let out = c.output().unwrap();
        let so = ok(&out);
        assert!(so.contains("ran"), "{so}");
        assert_refused(&out, "DOTENV-SECRET", "denied");
        let evs = audit_events(&log);
        let un: Vec<_> = evs
            .iter()
            .filter(|e| e["event"] == "fs_guard_unavailable")
            .collect();
        assert_eq!(un.len(), 1, "{evs:?}");
        assert_eq!(un[0]["severity"], "warn");
        assert!(un[0]["reason"].as_str().is_some_and(|r| !r.is_empty()));
        assert!(!evs.iter().any(|e| e["event"] == "fs_denied"));
        assert_event(&log, "end", "info", |e| e["status"] == 0);
        std::fs::remove_file(&blocker).unwrap();
        let mut before = before;
        before.retain(|p, _| !p.ends_with("no-fuse"));
        s.assert_clean(&before);
    }
}

/// The server reads protected files with its own identity; it still
/// applies the files' modes for the caller (root running the sandbox as
/// another --uid must not read through it what that uid could not).
#[test]
fn passthrough_keeps_file_modes() {
    if !sbx_testutil::is_root() {
        sbx_testutil::skip!("needs root to run the sandbox as another uid");
    }
    need_fuse!(sbx_testutil::As::Root);
    let s = Scratch::new(sbx_testutil::As::Root);
    s.write("proj/.claude/settings.json", "{\"ok\":1}\n");
    s.write("proj/.claude/private.json", "ROOT-ONLY\n");
    std::fs::set_permissions(
        s.path("proj/.claude/private.json"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let (out, log) = s.run_rw(
        &["--uid", "4242", "--gid", "4242"],
        "cat .claude/settings.json; if cat .claude/private.json 2>/dev/null; then echo ESCAPED; fi; true",
    );
    let so = ok(&out);
    assert!(so.contains("{\"ok\":1}"), "{so}");
    assert_refused(&out, "ROOT-ONLY", "mode 0600 of another user");
    assert_event(&log, "end", "info", |e| e["status"] == 0);
}

/// Protected entries that do not exist are empty guarded nodes: creating
/// anything in them fails and is logged.
#[test]
fn creating_missing_protected_entries_is_logged() {
    for who in identities() {
        need_fuse!(who);
        let s = Scratch::new(who);
        // A repository without hooks, a project without .claude.
        s.mkdir("proj/.git/objects");
        s.mkdir("proj/.git/refs");
        s.write("proj/.git/HEAD", "ref: refs/heads/main\n");
        let before = s.snapshot();
        let script = "if mkdir -p .claude/commands; then echo ESCAPED-mkdir; fi; \
             if echo '{}' > .claude/settings.json; then echo ESCAPED-settings; fi; \
             if echo x > .git/hooks/post-checkout; then echo ESCAPED-hook; fi; \
             ls -a .claude .git/hooks; true";
        let (out, log) = s.run_rw(&[], script);
        ok(&out);
        assert_event(&log, "fs_write_denied", "alert", |e| {
            ends(e, "/proj/.claude/commands") && e["op"] == "mkdir" && has_caller(e)
        });
        assert_event(&log, "fs_write_denied", "alert", |e| {
            ends(e, "/proj/.claude/settings.json") && e["op"] == "create"
        });
        assert_event(&log, "fs_write_denied", "alert", |e| {
            ends(e, "/proj/.git/hooks/post-checkout") && e["op"] == "create"
        });
        s.assert_clean(&before);
    }
}
