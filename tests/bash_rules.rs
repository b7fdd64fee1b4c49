//! What `Bash(...)` rules mean (docs/policy.md "Bash rules"), with real
//! toolchains through `sbx-policy chain --settings`, as root and as the
//! unprivileged test user:
//!
//! - invoke (the default, Claude Code's meaning): the agent's command is
//!   judged against the rules; what an allowed command starts runs (npm's
//!   script shell and a node_modules/.bin tool, make's recipes, pytest's
//!   subprocess, git's alias shell); a command no rule allows is refused
//!   before anything starts (126, `command_denied` alert);
//! - strict (`--exec-allowlist strict`): the same check, and every program
//!   started inside must be on the kernel execute allowlist: the descendant
//!   is refused (EACCES, `exec_denied` alert).
//!
//! scripts/sbx-run takes no settings (it has no Bash rules to apply).

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use sbx_testutil::{As, assert_event, audit_events, code, identities, stderr, stdout};

struct Case {
    t: ChainTree,
    settings: PathBuf,
    n: std::cell::Cell<u32>,
    /// More variables for sbx-policy (PATH among them).
    env: Vec<(&'static str, String)>,
}

/// A project with `files`, the settings (outside the project) allowing
/// `allow`, owned by `who`.
fn case(who: As, allow: &[&str], files: &[(&str, &str)]) -> Case {
    let t = ChainTree::new();
    for (p, s) in files {
        write(&t.proj.join(p), s);
    }
    let settings = t.proj.parent().unwrap().join("settings.json");
    let rules: Vec<String> = allow.iter().map(|r| format!("{r:?}")).collect();
    write(
        &settings,
        &format!(r#"{{"permissions": {{"allow": [{}]}}}}"#, rules.join(", ")),
    );
    t.own(who);
    Case {
        t,
        settings,
        n: 0.into(),
        env: Vec::new(),
    }
}

/// `sbx-policy chain --settings S [--exec-allowlist MODE] -- ARGV` as
/// `who`, with a fresh audit log (returned).
fn run(c: &Case, who: As, mode: Option<&str>, extra: &[&str], argv: &[&str]) -> (Output, PathBuf) {
    c.n.set(c.n.get() + 1);
    let log = c.t.log(&format!("run{}", c.n.get()));
    let mut cmd = sbx_testutil::tool("sbx-policy");
    cmd.arg("--audit-log").arg(&log);
    cmd.args([
        "chain",
        "--managed",
        "/nonexistent/managed.json",
        "--settings",
    ])
    .arg(&c.settings)
    .arg("--home")
    .arg(&c.t.home)
    .args(["--pass-env", "npm_config_update_notifier"]);
    if let Some(m) = mode {
        cmd.args(["--exec-allowlist", m]);
    }
    cmd.args(extra).arg("--").args(argv);
    cmd.current_dir(&c.t.proj)
        .env("PATH", PATH)
        .env("npm_config_update_notifier", "false")
        .env_remove("SBX_ID")
        .env_remove("SBX_AUDIT_LOG");
    for (k, v) in &c.env {
        cmd.env(k, v);
    }
    sbx_testutil::run_as(&mut cmd, who);
    cmd.env("HOME", &c.t.home);
    let out = sbx_testutil::output_within(&mut cmd, Duration::from_secs(180));
    (out, log)
}

fn ok(out: &Output, what: &str) {
    assert_eq!(code(out), 0, "{what}: {}\n{}", stdout(out), stderr(out));
}

/// Refused before anything starts: 126, one line naming the command, and
/// the alert.
fn refused(out: &Output, log: &Path, refused: &str, why: &str, what: &str) {
    let se = stderr(out);
    assert_eq!(code(out), 126, "{what}: {}\n{se}", stdout(out));
    assert!(
        se.contains("command refused by the Bash rules") && se.contains(why),
        "{what}: {se}"
    );
    assert_event(log, "command_denied", "alert", |e| {
        e["refused"] == refused && e["reason"].as_str().is_some_and(|r| r.contains(why))
    });
    // Nothing of the chain started.
    assert!(
        !audit_events(log).iter().any(|e| e["tool"] != "sbx-policy"),
        "{what}: a layer ran"
    );
}

/// The descendant refused by the kernel in strict mode.
fn exec_denied(log: &Path, ends: &str) {
    assert_event(log, "exec_denied", "alert", |e| {
        e["path"].as_str().is_some_and(|p| p.ends_with(ends))
    });
}

const PACKAGE: &str = r#"{"name": "p", "version": "1.0.0", "private": true,
  "scripts": {"test": "fakemocha --reporter dot"}}"#;
const FAKEMOCHA: &str =
    "#!/usr/bin/env node\nconsole.log('MOCHA=ran ' + process.argv.slice(2).join(' '));\n";

#[test]
fn npm_scripts_run_their_tools_in_invoke_mode_only() {
    if !sbx_testutil::have("npm") {
        assert!(!sbx_testutil::must_work(), "npm missing (scripts/setup)");
        return;
    }
    for who in identities() {
        let c = case(
            who,
            &["Bash(npm run test:*)"],
            &[
                ("package.json", PACKAGE),
                ("node_modules/fakemocha/bin/fakemocha.js", FAKEMOCHA),
            ],
        );
        let js = c.t.proj.join("node_modules/fakemocha/bin/fakemocha.js");
        let bin = c.t.proj.join("node_modules/.bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::os::unix::fs::symlink("../fakemocha/bin/fakemocha.js", bin.join("fakemocha")).unwrap();
        std::process::Command::new("chmod")
            .arg("755")
            .arg(&js)
            .status()
            .unwrap();
        c.t.own(who);
        let ctx = format!("{who:?}");
        // Invoke (the default): npm's script shell starts the local tool.
        let (out, _) = run(&c, who, None, &[], &["npm", "run", "test"]);
        ok(&out, &ctx);
        assert!(
            stdout(&out).contains("MOCHA=ran --reporter dot"),
            "{ctx}: {}",
            stdout(&out)
        );
        // Another npm command is not allowed.
        let (out, log) = run(&c, who, None, &[], &["npm", "install", "left-pad"]);
        refused(
            &out,
            &log,
            "npm install left-pad",
            "no Bash allow rule",
            &ctx,
        );
        // Strict: npm and its shell run, the tool it starts is refused.
        let (out, log) = run(&c, who, Some("strict"), &[], &["npm", "run", "test"]);
        assert_ne!(code(&out), 0, "{ctx}: {}", stdout(&out));
        assert!(!stdout(&out).contains("MOCHA=ran"), "{ctx}");
        exec_denied(&log, "fakemocha.js");
    }
}

#[test]
fn make_recipes_run_in_invoke_mode_only() {
    for who in identities() {
        let c = case(
            who,
            &["Bash(make:*)"],
            &[("Makefile", "all:\n\t@ls -d . >/dev/null && echo MAKE=ran\n")],
        );
        let ctx = format!("{who:?}");
        let (out, _) = run(&c, who, None, &[], &["make", "all"]);
        ok(&out, &ctx);
        assert!(stdout(&out).contains("MAKE=ran"), "{ctx}");
        // A compound command is judged part by part: `touch` is not allowed,
        // so nothing runs (not even the allowed make).
        let (out, log) = run(&c, who, None, &[], &["sh", "-c", "make all && touch made"]);
        refused(&out, &log, "touch made", "no Bash allow rule", &ctx);
        assert!(!c.t.proj.join("made").exists(), "{ctx}");
        // Strict: make (and its sh) run, the recipe's ls is refused.
        let (out, log) = run(&c, who, Some("strict"), &[], &["make", "all"]);
        assert_ne!(code(&out), 0, "{ctx}: {}", stdout(&out));
        assert!(!stdout(&out).contains("MAKE=ran"), "{ctx}");
        exec_denied(&log, "/ls");
    }
}

#[test]
fn pytest_runs_subprocesses_in_invoke_mode_only() {
    if !Path::new("/usr/bin/pytest").exists() {
        assert!(
            !sbx_testutil::must_work(),
            "pytest missing (scripts/setup: python3-pytest)"
        );
        return;
    }
    let test = "import subprocess\n\ndef test_git_runs():\n    assert subprocess.run(['git', '--version']).returncode == 0\n";
    for who in identities() {
        let c = case(who, &["Bash(pytest:*)"], &[("test_sub.py", test)]);
        let ctx = format!("{who:?}");
        let argv = ["pytest", "-q", "-p", "no:cacheprovider", "test_sub.py"];
        let (out, _) = run(&c, who, None, &[], &argv);
        ok(&out, &ctx);
        assert!(stdout(&out).contains("1 passed"), "{ctx}: {}", stdout(&out));
        let (out, log) = run(&c, who, None, &[], &["python3", "-m", "pytest"]);
        refused(&out, &log, "python3 -m pytest", "no Bash allow rule", &ctx);
        // Strict: pytest (and its #! interpreter) run; git is refused.
        let (out, log) = run(&c, who, Some("strict"), &[], &argv);
        assert_eq!(code(&out), 1, "{ctx}: the test fails: {}", stdout(&out));
        exec_denied(&log, "/git");
    }
}

#[test]
fn cargo_runs_its_toolchain_in_invoke_mode_only() {
    // rustup lives in root's home: the test user cannot reach it.
    let (cargo, rustup) = (Path::new("/root/.cargo"), Path::new("/root/.rustup"));
    if !sbx_testutil::is_root() || !cargo.join("bin/cargo").exists() || !rustup.is_dir() {
        return;
    }
    let c = case(
        As::Root,
        &[
            "Bash(cargo:*)",
            "Read(//root/.cargo/**)",
            "Read(//root/.rustup/**)",
        ],
        &[],
    );
    let mut c = c;
    c.env = vec![
        ("RUSTUP_HOME", rustup.display().to_string()),
        ("CARGO_HOME", cargo.display().to_string()),
        ("PATH", format!("{}:{PATH}", cargo.join("bin").display())),
    ];
    let extra = ["--pass-env", "RUSTUP_HOME", "--pass-env", "CARGO_HOME"];
    let go = |mode| run(&c, As::Root, mode, &extra, &["cargo", "--version"]);
    let (out, _) = go(None);
    ok(&out, "cargo --version");
    assert!(stdout(&out).starts_with("cargo "), "{}", stdout(&out));
    // Strict: the rustup proxy runs, the toolchain's cargo it execs does not.
    let (out, log) = go(Some("strict"));
    assert_ne!(code(&out), 0, "{}", stdout(&out));
    exec_denied(&log, "/bin/cargo");
}

#[test]
fn git_only_policy_refuses_ls_but_git_runs_its_helpers() {
    for who in identities() {
        let c = case(who, &["Bash(git:*)"], &[("a.txt", "a\n")]);
        git(&c.t.proj, &["init", "-q", "-b", "main"]);
        git(&c.t.proj, &["add", "-A"]);
        git(&c.t.proj, &["commit", "-qm", "init"]);
        c.t.own(who);
        let ctx = format!("{who:?}");
        let (out, log) = run(&c, who, None, &[], &["ls"]);
        refused(&out, &log, "ls", "no Bash allow rule", &ctx);
        let (out, _) = run(&c, who, None, &[], &["git", "status", "--short"]);
        ok(&out, &ctx);
        // git starts a shell and ls for an alias: its descendants run.
        let alias = ["git", "-c", "alias.l=!ls -d a.txt && echo LS=ran", "l"];
        let (out, _) = run(&c, who, None, &[], &alias);
        ok(&out, &ctx);
        assert!(stdout(&out).contains("LS=ran"), "{ctx}: {}", stdout(&out));
        // Compound commands: every part must be allowed.
        let (out, _) = run(
            &c,
            who,
            None,
            &[],
            &[
                "sh",
                "-c",
                "git status --short && git log -1 --format=LOG=%s",
            ],
        );
        ok(&out, &ctx);
        assert!(stdout(&out).contains("LOG=init"), "{ctx}");
        let (out, log) = run(&c, who, None, &[], &["sh", "-c", "git status; ls"]);
        refused(&out, &log, "ls", "no Bash allow rule", &ctx);
        // What cannot be judged is refused.
        let (out, log) = run(&c, who, None, &[], &["sh", "-c", "git $(echo status)"]);
        refused(
            &out,
            &log,
            "sh -c 'git $(echo status)'",
            "command substitution",
            &ctx,
        );
        // Strict: the alias's ls is refused by the kernel.
        let (out, log) = run(&c, who, Some("strict"), &[], &alias);
        assert_ne!(code(&out), 0, "{ctx}: {}", stdout(&out));
        assert!(!stdout(&out).contains("LS=ran"), "{ctx}");
        exec_denied(&log, "/ls");
        // And still refuses ls as the agent's command.
        let (out, log) = run(&c, who, Some("strict"), &[], &["ls"]);
        refused(&out, &log, "ls", "no Bash allow rule", &ctx);
        // Deny beats allow, on the agent's command (and inside a script).
        write(
            &c.settings,
            r#"{"permissions": {"allow": ["Bash(git:*)"], "deny": ["Bash(git push:*)"]}}"#,
        );
        c.t.own(who);
        let (out, log) = run(&c, who, None, &[], &["git", "push", "origin", "main"]);
        refused(
            &out,
            &log,
            "git push origin main",
            "denied by Bash(git push:*)",
            &ctx,
        );
        let (out, log) = run(&c, who, None, &[], &["sh", "-c", "git status && git push"]);
        refused(&out, &log, "git push", "denied by Bash(git push:*)", &ctx);
    }
}

#[test]
fn explain_and_print_state_the_mode() {
    let c = case(As::Root, &["Bash(git:*)"], &[]);
    let explain = |mode: &str| {
        let mut cmd = sbx_testutil::tool("sbx-policy");
        cmd.args(["explain", "--managed", "/nonexistent/m.json", "--settings"])
            .arg(&c.settings)
            .args(["--exec-allowlist", mode])
            .current_dir(&c.t.proj)
            .env("PATH", PATH);
        sbx_testutil::output_within(&mut cmd, Duration::from_secs(60))
    };
    let out = explain("invoke");
    ok(&out, "explain");
    let e = stdout(&out);
    assert!(e.contains("Bash rules: invoke mode"), "{e}");
    assert!(e.contains("what an allowed command starts"), "{e}");
    assert!(e.contains("checked at invocation"), "{e}");
    let out = explain("strict");
    let e = stdout(&out);
    assert!(
        e.contains("Bash rules: strict mode") && e.contains("exec_denied"),
        "{e}"
    );
    // --print: the mode, and the judgement of this command.
    let (out, _) = run(&c, As::Root, None, &["--print"], &["ls"]);
    ok(&out, "print");
    let s = stdout(&out);
    assert!(
        s.contains("# exec allowlist: invoke") && s.contains("REFUSED"),
        "{s}"
    );
    assert!(!s.contains("--allow-exec"), "{s}");
    let (out, _) = run(
        &c,
        As::Root,
        Some("strict"),
        &["--print"],
        &["git", "status"],
    );
    let s = stdout(&out);
    assert!(
        s.contains("# exec allowlist: strict") && s.contains("--allow-exec"),
        "{s}"
    );
    assert!(
        s.contains("the command is allowed: `git status` by Bash(git:*)"),
        "{s}"
    );
    // Strict cannot be carried by a tier without the namespace chain.
    let (out, _) = run(
        &c,
        As::Root,
        Some("strict"),
        &["--print", "--trust", "full"],
        &["git", "status"],
    );
    sbx_testutil::assert_usage_error(&out, "--exec-allowlist strict");
}

/// Redirections the shells read differently (an attacker's pass): under
/// dash `echo hi &>out id` runs `id` as a command of its own, under bash
/// `>&2echo id` writes to the file `2echo` and runs `id`. Both are refused
/// before anything starts, and `id` never runs.
#[test]
fn redirections_the_shells_read_differently_are_refused() {
    for who in identities() {
        let c = case(who, &["Bash(git:*)", "Bash(echo:*)"], &[]);
        let ctx = format!("{who:?}");
        for (shell, script, why) in [
            ("sh", "echo hi &>out id >&2", "`&>`"),
            ("bash", ">&2echo id", "joined to a word"),
        ] {
            let (out, log) = run(&c, who, None, &[], &[shell, "-c", script]);
            refused(&out, &log, &format!("{shell} -c '{script}'"), why, &ctx);
            assert!(!stdout(&out).contains("uid="), "{ctx}: {}", stdout(&out));
        }
        // bash's own `&>` is a redirection there, and allowed.
        let (out, _) = run(
            &c,
            who,
            None,
            &[],
            &["bash", "-c", "echo ok &>/dev/null; echo done"],
        );
        ok(&out, &ctx);
        assert!(stdout(&out).contains("done"), "{ctx}");
    }
}
