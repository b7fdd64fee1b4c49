//! End-to-end: the `sbx-path` binary, as root and as the unprivileged user.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sbx_testutil::{
    As, assert_event, assert_usage_error, code, identities, run_as, stderr, stdout,
};
use serde_json::Value;

struct Tree {
    dir: tempfile::TempDir,
}

impl Tree {
    /// ok/ (read), ok/file, ok/sub/ ; rw/ (write) ; rw/ro/ (read) ;
    /// outside/secret ; logs/ (where each run's audit log goes).
    fn new() -> Self {
        let dir = sbx_testutil::shared_tempdir();
        let t = Tree { dir };
        for d in ["ok/sub", "rw/ro", "outside", "logs"] {
            fs::create_dir_all(t.p(d)).unwrap();
        }
        fs::write(t.p("ok/file"), "inside").unwrap();
        fs::write(t.p("rw/ro/f"), "ro").unwrap();
        fs::write(t.p("outside/secret"), "SECRET").unwrap();
        for d in ["rw", "logs"] {
            sbx_testutil::chown_to_test_user(&t.p(d));
        }
        t
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn log(&self, who: As) -> PathBuf {
        self.p(&format!(
            "logs/{}.jsonl",
            sbx_testutil::unique(&format!("{who:?}-"))
        ))
    }

    /// `sbx-path check` with the tree's rules, an audit log, as `who`.
    fn check(&self, who: As, log: &Path, extra: &[&str], path: &Path, mode: &str) -> Output {
        let mut c = sbx_testutil::tool("sbx-path");
        c.arg("check")
            .arg("--audit-log")
            .arg(log)
            .arg("--allow-read")
            .arg(self.p("ok"))
            .arg("--allow-write")
            .arg(self.p("rw"))
            .arg("--allow-read")
            .arg(self.p("rw/ro"))
            .args(extra)
            .arg(path)
            .arg(mode);
        run(c, who)
    }
}

fn run(mut c: Command, who: As) -> Output {
    run_as(&mut c, who);
    sbx_testutil::output(&mut c)
}

fn assert_denied(out: &Output, needle: &str) {
    let err = stderr(out);
    assert_eq!(code(out), 1, "want exit 1 (denied); stderr: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "want one line, got: {err:?}"
    );
    assert!(err.starts_with("sbx-path: "), "{err}");
    assert!(err.contains(needle), "stderr {err:?} lacks {needle:?}");
}

fn kind_is<'a>(kind: &'a str, path: &'a Path) -> impl Fn(&Value) -> bool + 'a {
    move |e| e["kind"] == kind && e["path"] == path.to_str().unwrap()
}

#[test]
fn allowed_read_exits_0_and_is_logged() {
    let t = Tree::new();
    for who in identities() {
        let log = t.log(who);
        let out = t.check(who, &log, &[], &t.p("ok//./file"), "read");
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert_eq!(stderr(&out), "");
        assert_eq!(stdout(&out), "");
        assert_event(&log, "path_allowed", "info", |e| {
            e["path"] == t.p("ok/file").to_str().unwrap()
                && e["rule"] == t.p("ok").to_str().unwrap()
        });
        // A write of a new name under the write rule, in JSON.
        let out = t.check(who, &log, &["--json"], &t.p("rw/new.txt"), "write");
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        let v: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
        assert_eq!(v["allowed"], true);
        assert_eq!(v["exists"], false);
        assert_eq!(v["rule_mode"], "write");
        assert!(!t.p("rw/new.txt").exists(), "check creates nothing");
    }
}

#[test]
fn traversal_is_denied_with_an_alert() {
    let t = Tree::new();
    for who in identities() {
        let log = t.log(who);
        let p = PathBuf::from(format!("{}/ok/../outside/secret", t.dir.path().display()));
        let out = t.check(who, &log, &[], &p, "read");
        assert_denied(&out, "'..'");
        assert_event(&log, "path_denied", "alert", kind_is("traversal", &p));
        // Even when it would land back inside.
        let p = PathBuf::from(format!("{}/ok/sub/../file", t.dir.path().display()));
        assert_denied(&t.check(who, &log, &[], &p, "read"), "'..'");
    }
}

#[test]
fn planted_symlink_is_denied_with_an_alert() {
    let t = Tree::new();
    // In the read tree: to /etc/shadow and to a secret outside; in the write
    // tree, a dangling one (a write through it would create outside) and a
    // symlinked directory in the middle of the path.
    symlink("/etc/shadow", t.p("ok/shadow")).unwrap();
    symlink(t.p("outside/secret"), t.p("ok/id_rsa")).unwrap();
    symlink(t.p("outside/new"), t.p("rw/dangling")).unwrap();
    symlink(t.p("outside"), t.p("rw/dir")).unwrap();
    for who in identities() {
        for how in ["auto", "walk"] {
            let log = t.log(who);
            let extra = ["--resolve-with", how];
            for (rel, mode) in [
                ("ok/shadow", "read"),
                ("ok/id_rsa", "read"),
                ("rw/dangling", "write"),
            ] {
                let out = t.check(who, &log, &extra, &t.p(rel), mode);
                assert_denied(&out, "is a symlink");
                assert_event(&log, "path_denied", "alert", kind_is("symlink", &t.p(rel)));
            }
            let p = t.p("rw/dir/new");
            let out = t.check(who, &log, &extra, &p, "write");
            assert_denied(&out, &format!("{} is a symlink", t.p("rw/dir").display()));
            assert_event(&log, "path_denied", "alert", |e| {
                kind_is("symlink", &p)(e) && e["component"] == t.p("rw/dir").to_str().unwrap()
            });
        }
    }
    assert!(!t.p("outside/new").exists());
}

#[test]
fn write_to_read_only_rule_is_denied_with_an_alert() {
    let t = Tree::new();
    for who in identities() {
        let log = t.log(who);
        for (rel, rule) in [
            ("ok/file", "ok"),
            ("rw/ro/f", "rw/ro"),
            ("rw/ro/new", "rw/ro"),
        ] {
            let out = t.check(who, &log, &["--json"], &t.p(rel), "write");
            assert_denied(
                &out,
                &format!("rule {} (read) allows reading only", t.p(rule).display()),
            );
            let v: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
            assert_eq!(v["allowed"], false);
            assert_eq!(v["kind"], "read_only");
            assert_event(&log, "path_denied", "alert", |e| {
                kind_is("read_only", &t.p(rel))(e) && e["rule"] == t.p(rule).to_str().unwrap()
            });
        }
    }
}

#[test]
fn outside_every_rule_is_denied_with_an_alert() {
    let t = Tree::new();
    fs::create_dir_all(t.p("okx")).unwrap();
    for who in identities() {
        let log = t.log(who);
        for rel in ["outside/secret", "okx"] {
            let out = t.check(who, &log, &[], &t.p(rel), "read");
            assert_denied(&out, "not under any allowed path");
            assert_event(
                &log,
                "path_denied",
                "alert",
                kind_is("not_allowed", &t.p(rel)),
            );
        }
    }
}

#[test]
fn missing_and_unreachable_paths_are_denied_as_warnings() {
    let t = Tree::new();
    fs::create_dir_all(t.p("ok/private/inner")).unwrap();
    fs::set_permissions(
        t.p("ok/private"),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    for who in identities() {
        let log = t.log(who);
        let p = t.p("ok/nope");
        assert_denied(&t.check(who, &log, &[], &p, "read"), "does not exist");
        assert_event(&log, "path_denied", "warn", kind_is("not_found", &p));
        let p = t.p("ok/private/inner");
        let out = t.check(who, &log, &[], &p, "read");
        if who == As::User {
            assert_denied(&out, "the system refused access");
            assert_event(
                &log,
                "path_denied",
                "warn",
                kind_is("permission_denied", &p),
            );
        } else {
            assert_eq!(code(&out), 0, "{}", stderr(&out));
        }
    }
}

#[test]
fn relative_paths_need_a_base() {
    let t = Tree::new();
    for who in identities() {
        let log = t.log(who);
        assert_denied(
            &t.check(who, &log, &[], Path::new("ok/file"), "read"),
            "not an absolute path",
        );
        let base = t.dir.path().to_str().unwrap();
        let out = t.check(who, &log, &["--base", base], Path::new("ok/file"), "r");
        assert_eq!(code(&out), 0, "{}", stderr(&out));
    }
}

#[test]
fn bad_usage_is_125_and_one_line() {
    let t = Tree::new();
    symlink(t.p("outside"), t.p("link")).unwrap();
    let file = t.p("ok/file");
    let f = file.to_str().unwrap();
    let link_rule = t.p("link/x");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["check", "--bogus", f, "read"], "--bogus"),
        (vec!["check", f], "<MODE>"),
        (vec!["check"], "<PATH> <MODE>"),
        (vec!["check", f, "execute"], "not one of read, write"),
        (
            vec![
                "check",
                "--allow-read",
                link_rule.to_str().unwrap(),
                f,
                "read",
            ],
            "is a symlink",
        ),
        (
            vec!["check", "--allow-read", "/nonexistent-sbx/x", f, "read"],
            "--allow-read /nonexistent-sbx/x",
        ),
        (
            vec!["check", "--allow-write", "/tmp/../etc", f, "read"],
            "'..'",
        ),
        (vec!["check", "--base", "rel", f, "read"], "--base rel"),
        (vec!["check", "--resolve-with", "magic", f, "read"], "magic"),
        (
            vec!["check", "--config", "/nonexistent-sbx/c.json", f, "read"],
            "/nonexistent-sbx/c.json",
        ),
        (vec![], "requires a subcommand"),
        (vec!["frobnicate"], "frobnicate"),
    ];
    for who in identities() {
        for (args, needle) in &cases {
            let mut c = sbx_testutil::tool("sbx-path");
            c.args(args);
            let out = run(c, who);
            assert_usage_error(&out, needle);
        }
    }
}

#[test]
fn config_file_holds_the_rules() {
    let t = Tree::new();
    let cfg = t.p("logs/cfg.json");
    let rules = serde_json::json!({"sbx-path": {
        "allow-read": [t.p("ok")],
        "allow-write": [t.p("rw")],
        "json": true,
    }});
    fs::write(&cfg, rules.to_string()).unwrap();
    for who in identities() {
        let mut c = sbx_testutil::tool("sbx-path");
        c.arg("check")
            .arg("--config")
            .arg(&cfg)
            .arg(t.p("ok/file"))
            .arg("read");
        let out = run(c, who);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(
            stdout(&out).contains("\"allowed\":true"),
            "{}",
            stdout(&out)
        );
        let mut c = sbx_testutil::tool("sbx-path");
        c.arg("check")
            .arg("--config")
            .arg(&cfg)
            .arg(t.p("outside/secret"))
            .arg("read");
        assert_denied(&run(c, who), "not under any allowed path");
    }
}

#[test]
fn normalise_prints_or_refuses() {
    for who in identities() {
        let mut c = sbx_testutil::tool("sbx-path");
        c.args(["normalise", "/a//b/./c/", "//", "/x/.../y"]);
        let out = run(c, who);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert_eq!(stdout(&out), "/a/b/c\n/\n/x/.../y\n");
        let mut c = sbx_testutil::tool("sbx-path");
        c.args(["normalise", "--base", "/srv/r", "src//x", "/ok", "a/../b"]);
        let out = run(c, who);
        assert_eq!(code(&out), 1);
        assert_eq!(stdout(&out), "/srv/r/src/x\n/ok\n");
        assert!(
            stderr(&out).contains("a/../b: path contains a '..' component"),
            "{}",
            stderr(&out)
        );
    }
}

/// With stderr gone, a refusal keeps its status (1), its --json verdict
/// and its alert, normalise goes on past a refused path, and bad input is
/// 125: the refusal line was an `eprintln!` that panicked (101).
#[test]
fn a_gone_stderr_changes_neither_the_status_nor_stdout() {
    let t = Tree::new();
    let secret = t.p("outside/secret");
    for who in identities() {
        for how in sbx_testutil::STDERR_GONE {
            let log = t.log(who);
            let mut c = sbx_testutil::tool("sbx-path");
            c.args(["check", "--json", "--audit-log"])
                .arg(&log)
                .arg("--allow-read")
                .arg(t.p("ok"))
                .arg(&secret)
                .arg("read");
            sbx_testutil::stderr_gone(&mut c, how);
            let out = run(c, who);
            assert_eq!(code(&out), 1, "{who:?} {how}");
            assert!(
                stdout(&out).contains("\"allowed\":false"),
                "{who:?} {how}: {}",
                stdout(&out)
            );
            assert_event(&log, "path_denied", "alert", |e| {
                e["path"] == secret.to_str().unwrap()
            });

            let mut c = sbx_testutil::tool("sbx-path");
            c.args(["normalise", "/a/../b", "/x//y"]);
            sbx_testutil::stderr_gone(&mut c, how);
            let out = run(c, who);
            assert_eq!(code(&out), 1, "{who:?} {how}");
            assert_eq!(stdout(&out), "/x/y\n", "{who:?} {how}");

            let mut c = sbx_testutil::tool("sbx-path");
            c.args(["check", "--base", "rel"]).arg(&secret).arg("read");
            sbx_testutil::stderr_gone(&mut c, how);
            let out = run(c, who);
            assert_eq!(code(&out), 125, "{who:?} {how}");
            assert_eq!(stdout(&out), "", "{who:?} {how}");
        }
    }
}
