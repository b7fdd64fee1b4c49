//! The agent's own toolchain and identity inside the low-trust chain
//! (issue 25, issue 23's `git config --local`): a rustup toolchain in the
//! home reached through read-only binds (`scripts/sbx-run -r`, settings
//! `permissions.additionalDirectories`), the host's git identity (name and
//! email only) offered by default and turned off on request, refused when
//! malformed, the EBUSY of `.git/config` explained, and the alerts of a run
//! without an audit log told once at the end. As root and as the
//! unprivileged test user, through `scripts/sbx-run` and `sbx-policy chain`.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sbx_testutil::{As, assert_event, audit_events, identities, run_as, stderr, stdout};

const CHAIN_NAMES: [&str; 2] = ["scripts/sbx-run", "sbx-policy chain"];

struct Tree {
    _d: tempfile::TempDir,
    base: PathBuf,
    proj: PathBuf,
    home: PathBuf,
}

/// A git repository with one commit and an empty home, owned by `who`.
fn tree(who: As) -> Tree {
    let d = sbx_testutil::shared_tempdir();
    let base = d.path().canonicalize().unwrap();
    let proj = base.join("proj");
    let home = base.join("home");
    std::fs::create_dir_all(&proj).unwrap();
    std::fs::create_dir_all(home.join(".claude")).unwrap();
    std::fs::create_dir_all(base.join("state")).unwrap();
    write(&proj.join("a"), "a\n");
    git(&proj, &["init", "-q", "-b", "main"]);
    git(&proj, &["add", "-A"]);
    git(&proj, &["commit", "-qm", "init"]);
    if who == As::User {
        chown_r(&base);
    }
    Tree {
        _d: d,
        base,
        proj,
        home,
    }
}

/// One call: `run_args` go to sbx-run before `--`, `policy_args` to
/// `sbx-policy chain`; `log` false: no audit log at all.
struct Call<'a> {
    run_args: &'a [&'a str],
    policy_args: &'a [&'a str],
    log: bool,
    script: &'a str,
    env: &'a [(&'a str, &'a str)],
}

/// `script` with the defaults: no extra flags, a log, no extra variables.
fn call(script: &str) -> Call<'_> {
    Call {
        run_args: &[],
        policy_args: &[],
        log: true,
        script,
        env: &[],
    }
}

/// Runs the call through one chain as `who`, HOME the tree's home.
fn run(t: &Tree, chain: &str, who: As, k: Call<'_>) -> Output {
    let Call {
        run_args,
        policy_args,
        log,
        script,
        env,
    } = k;
    let logf = t.base.join("audit.jsonl");
    let mut c = if chain == "scripts/sbx-run" {
        let mut c = Command::new("sh");
        c.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/sbx-run"));
        if log {
            c.arg("-l").arg(&logf);
        }
        c.args(run_args);
        c.env("SBX_BIN", sbx_testutil::bin("sbx-fs").parent().unwrap());
        c
    } else {
        let mut c = sbx_testutil::tool("sbx-policy");
        if log {
            c.arg("--audit-log").arg(&logf);
        }
        c.args(["chain", "--managed", "/nonexistent/managed.json", "--home"])
            .arg(&t.home)
            .args(policy_args);
        c
    };
    c.args(["--", "sh", "-c", script]);
    c.current_dir(&t.proj)
        .env("PATH", PATH)
        .env("XDG_STATE_HOME", t.base.join("state"))
        .env_remove("SBX_ID")
        .env_remove("SBX_AUDIT_LOG")
        .env_remove("SUDO_USER");
    run_as(&mut c, who);
    c.env("HOME", &t.home)
        .env("CLAUDE_CONFIG_DIR", t.home.join(".claude"));
    for (k, v) in env {
        c.env(k, v);
    }
    sbx_testutil::output_within(&mut c, std::time::Duration::from_secs(120))
}

fn ctx(who: As, chain: &str, out: &Output) -> String {
    format!(
        "{who:?} {chain}: exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        stdout(out),
        stderr(out)
    )
}

/// Links (or copies) `src` to `dst`.
fn place(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
    if std::fs::hard_link(src, dst).is_err() {
        std::fs::copy(src, dst).unwrap();
    }
}

/// A rustup-style layout in `home`: ~/.rustup/toolchains/t/bin/cargo (the
/// real cargo that builds this test) and ~/.cargo/bin/cargo, the real
/// rustup proxy when rustup is installed (with ~/.rustup/settings.toml
/// naming the toolchain), else a link to the toolchain's cargo.
fn rustup_home(home: &Path) {
    let cargo = PathBuf::from(env!("CARGO"));
    let real = std::fs::canonicalize(&cargo).unwrap();
    place(&real, &home.join(".rustup/toolchains/t/bin/cargo"));
    let rustup = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain(cargo.parent().map(Path::to_path_buf))
        .map(|d| d.join("rustup"))
        .find(|p| p.is_file());
    let bin = home.join(".cargo/bin");
    std::fs::create_dir_all(&bin).unwrap();
    match rustup {
        Some(r) => {
            place(&std::fs::canonicalize(r).unwrap(), &bin.join("rustup"));
            std::os::unix::fs::symlink("rustup", bin.join("cargo")).unwrap();
            write(
                &home.join(".rustup/settings.toml"),
                "version = \"12\"\ndefault_toolchain = \"t\"\n",
            );
        }
        None => {
            std::os::unix::fs::symlink("../../.rustup/toolchains/t/bin/cargo", bin.join("cargo"))
                .unwrap()
        }
    }
    // A credential beside it stays hidden (the deny list applies inside).
    write(
        &home.join(".cargo/credentials.toml"),
        "token = \"s3cret\"\n",
    );
    let _ = Command::new("chmod")
        .arg("-R")
        .arg("a+rX")
        .arg(home)
        .status();
}

#[test]
fn cargo_from_a_rustup_toolchain_in_the_home() {
    for who in identities() {
        for chain in CHAIN_NAMES {
            let t = tree(who);
            rustup_home(&t.home);
            let settings = t.base.join("settings.json");
            write(
                &settings,
                r#"{"permissions": {"additionalDirectories": ["~/.cargo", "~/.rustup"]}}"#,
            );
            let cargo = t.home.join(".cargo").display().to_string();
            let rustup = t.home.join(".rustup").display().to_string();
            let path = format!("{cargo}/bin:{PATH}");
            let script = "cargo --version; echo CARGO=$?; cat ~/.cargo/credentials.toml; echo CRED=$?; touch ~/.cargo/x; echo W=$?";
            let out = run(
                &t,
                chain,
                who,
                Call {
                    run_args: &["-r", &cargo, "-r", &rustup],
                    policy_args: &["--settings", settings.to_str().unwrap()],
                    log: true,
                    script,
                    env: &[("PATH", &path)],
                },
            );
            let c = ctx(who, chain, &out);
            let so = stdout(&out);
            assert_eq!(out.status.code(), Some(0), "{c}");
            assert!(so.contains("cargo 1."), "{c}");
            assert!(so.contains("CARGO=0"), "{c}");
            // Read-only, and its secrets still hidden.
            assert!(!so.contains("s3cret") && !so.contains("CRED=0"), "{c}");
            assert!(!so.contains("W=0"), "{c}");
            assert!(!t.home.join(".cargo/x").exists(), "{c}");
            // Without the binds, there is no cargo.
            let out = run(
                &t,
                chain,
                who,
                Call {
                    log: true,
                    script: "cargo --version",
                    env: &[("PATH", &path)],
                    ..call("")
                },
            );
            assert_eq!(out.status.code(), Some(127), "{}", ctx(who, chain, &out));
        }
    }
}

#[test]
fn bad_ro_binds_are_one_line_and_exit_125() {
    for who in identities() {
        let t = tree(who);
        let home = t.home.display().to_string();
        let proj = t.proj.display().to_string();
        let sub = t.proj.join("sub");
        std::fs::create_dir_all(&sub).unwrap();
        let sub = sub.display().to_string();
        let link = t.base.join("link-to-root");
        std::os::unix::fs::symlink("/", &link).unwrap();
        let link = link.display().to_string();
        for (arg, want) in [
            ("/nonexistent/toolchain", "no such directory"),
            ("/tmp/a\nb", "control characters"),
            ("/tmp/a\x1b[2Jb", "control characters"),
            ("/opt:/x", "':'"),
            ("/", "the whole host"),
            (link.as_str(), "the whole host"),
            (home.as_str(), "private HOME"),
            ("/proc/self", "runtime"),
            // The home of this test lies under /tmp: either reason.
            ("/tmp", "refused"),
            (proj.as_str(), "overlaps the writable project"),
            (sub.as_str(), "overlaps the writable project"),
        ] {
            let out = run(
                &t,
                "scripts/sbx-run",
                who,
                Call {
                    run_args: &["-r", arg],
                    policy_args: &[],
                    log: true,
                    script: "echo RAN",
                    env: &[],
                },
            );
            let c = format!("-r {arg:?}: {}", ctx(who, "scripts/sbx-run", &out));
            assert_eq!(out.status.code(), Some(125), "{c}");
            let se = stderr(&out);
            assert_eq!(se.lines().count(), 1, "{c}");
            assert!(se.starts_with("sbx-run: -r "), "{c}");
            assert!(se.contains(want), "{c}");
            assert!(!se.contains('\x1b'), "{c}");
            assert!(!stdout(&out).contains("RAN"), "{c}");
        }
    }
}

const IDENTITY: &str = "[user]\n\tname = Host Person\n\temail = host@example.invalid\n\
[alias]\n\tsecretalias = !echo ALIAS-RAN\n[credential]\n\thelper = store\n";

/// What the sandboxed git sees of its global config, then a commit.
const COMMIT: &str =
    "git config --global --list; echo x >> a; git commit -qam inside && echo COMMITTED";

#[test]
fn git_commit_uses_the_host_identity_and_only_it() {
    for who in identities() {
        for chain in CHAIN_NAMES {
            let t = tree(who);
            write(&t.home.join(".gitconfig"), IDENTITY);
            chown_r(&t.home);
            let out = run(&t, chain, who, call(COMMIT));
            let c = ctx(who, chain, &out);
            let so = stdout(&out);
            assert_eq!(out.status.code(), Some(0), "{c}");
            assert!(so.contains("COMMITTED"), "{c}");
            assert!(so.contains("user.name=Host Person"), "{c}");
            // Name and email only: no alias, no credential helper.
            assert!(!so.contains("alias") && !so.contains("credential"), "{c}");
            assert_eq!(
                git(&t.proj, &["log", "-1", "--format=%s|%an|%ae|%cn|%ce"]),
                "inside|Host Person|host@example.invalid|Host Person|host@example.invalid\n",
                "{c}"
            );
            git(&t.proj, &["fsck", "--strict", "--no-progress"]);
            assert_event(&t.base.join("audit.jsonl"), "git_identity", "info", |e| {
                e["name"] == true && e["email"] == true
            });

            // Turned off: git fails as without sbx's help.
            let offs: Vec<(&[&str], &[&str])> =
                vec![(&["--no-git-identity"], &["--no-git-identity"])];
            for (ra, pa) in offs {
                let out = run(
                    &t,
                    chain,
                    who,
                    Call {
                        run_args: ra,
                        policy_args: pa,
                        log: true,
                        script: COMMIT,
                        env: &[],
                    },
                );
                let c = ctx(who, chain, &out);
                assert_ne!(out.status.code(), Some(0), "{c}");
                assert!(!stdout(&out).contains("COMMITTED"), "{c}");
                assert!(stderr(&out).contains("Please tell me who you are"), "{c}");
            }
            if chain == "sbx-policy chain" {
                // The settings' equivalent, and explain says it.
                let s = t.base.join("off.json");
                write(&s, r#"{"sbx": {"gitIdentity": false}}"#);
                let sa = ["--settings", s.to_str().unwrap()];
                let out = run(
                    &t,
                    chain,
                    who,
                    Call {
                        run_args: &[],
                        policy_args: &sa,
                        log: true,
                        script: COMMIT,
                        env: &[],
                    },
                );
                let c = ctx(who, chain, &out);
                assert!(!stdout(&out).contains("COMMITTED"), "{c}");
                let mut e = sbx_testutil::tool("sbx-policy");
                e.args(["explain", "--managed", "/nonexistent", "--home"])
                    .arg(&t.home)
                    .args(sa)
                    .current_dir(&t.proj);
                let ex = stdout(&e.output().unwrap());
                assert!(ex.contains("sbx.gitIdentity: false"), "{ex}");
                assert!(ex.contains("none offered"), "{ex}");
            }
        }
    }
}

#[test]
fn as_root_under_sudo_the_identity_is_the_invoking_users() {
    if !sbx_testutil::is_root() || sbx_testutil::test_user().is_none() {
        sbx_testutil::skip!("needs root and the test user");
    }
    for chain in CHAIN_NAMES {
        // Root's own home has an identity; SUDO_USER names the test user,
        // whose home (from the password database) has none: root's must
        // not be offered.
        let t = tree(As::Root);
        write(&t.home.join(".gitconfig"), IDENTITY);
        let out = run(
            &t,
            chain,
            As::Root,
            Call {
                log: true,
                script: "git config --global user.email; echo E=$?",
                env: &[("SUDO_USER", sbx_testutil::TEST_USER)],
                ..call("")
            },
        );
        let c = ctx(As::Root, chain, &out);
        assert!(!stdout(&out).contains("host@example.invalid"), "{c}");
        assert!(stdout(&out).contains("E=1"), "{c}");
        assert_event(&t.base.join("audit.jsonl"), "git_identity", "info", |e| {
            e["user"] == sbx_testutil::TEST_USER && e["email"] == false
        });
    }
}

#[test]
fn an_identity_with_a_newline_is_dropped_with_an_alert() {
    for who in identities() {
        for chain in CHAIN_NAMES {
            let t = tree(who);
            write(
                &t.home.join(".gitconfig"),
                "[user]\n\tname = Fine Name\n\temail = \"evil@example.invalid\\n[core]\\n\\tfsmonitor = x\"\n",
            );
            chown_r(&t.home);
            let out = run(
                &t,
                chain,
                who,
                call("cat ~/.gitconfig; git config --global user.email; echo E=$?"),
            );
            let c = ctx(who, chain, &out);
            let so = stdout(&out);
            assert!(so.contains("Fine Name"), "{c}");
            assert!(!so.contains("evil") && !so.contains("fsmonitor"), "{c}");
            assert!(so.contains("E=1"), "{c}");
            assert_event(
                &t.base.join("audit.jsonl"),
                "git_identity_refused",
                "alert",
                |e| {
                    e["name"] == "user.email"
                        && e["reason"]
                            .as_str()
                            .unwrap_or("")
                            .contains("control character")
                },
            );
        }
    }
}

/// A FIFO where git reads its configuration (a sandbox with a writable
/// home could leave one) would block the git that reads the identity, and
/// with it every later run: it is not read, the run goes on without an
/// identity, and the alert says why. An include naming a FIFO reaches git,
/// which is killed at its deadline.
#[test]
fn a_fifo_for_the_git_config_is_never_waited_for() {
    for who in identities() {
        for chain in CHAIN_NAMES {
            for include in [false, true] {
                let t = tree(who);
                let fifo = if include {
                    write(
                        &t.home.join(".gitconfig"),
                        "[include]\n\tpath = ~/pipe\n[user]\n\tname = Fine Name\n",
                    );
                    t.home.join("pipe")
                } else {
                    t.home.join(".gitconfig")
                };
                sbx_testutil::mkfifo(&fifo);
                chown_r(&t.home);
                let out = run(
                    &t,
                    chain,
                    who,
                    call("git config --global user.name; echo E=$?"),
                );
                let c = ctx(who, chain, &out);
                assert_eq!(out.status.code(), Some(0), "{c}");
                assert!(stdout(&out).contains("E=1"), "{c}");
                let (sev, why) = if include {
                    ("warn", "did not answer")
                } else {
                    ("alert", "not a regular file")
                };
                assert_event(
                    &t.base.join("audit.jsonl"),
                    "git_identity_refused",
                    sev,
                    |e| e["reason"].as_str().unwrap_or("").contains(why),
                );
            }
        }
    }
}

#[test]
fn git_config_local_ebusy_is_explained() {
    for who in identities() {
        for chain in CHAIN_NAMES {
            let t = tree(who);
            for log in [true, false] {
                let out = run(
                    &t,
                    chain,
                    who,
                    Call {
                        log,
                        script: "git config user.email me@example.invalid; echo C=$?",
                        env: &[],
                        ..call("")
                    },
                );
                let c = format!("log={log} {}", ctx(who, chain, &out));
                assert!(!stdout(&out).contains("C=0"), "{c}");
                let se = stderr(&out);
                // In the end-of-run summary: why, and what to do instead.
                let block = &se[se
                    .find("<sandbox_violations")
                    .unwrap_or_else(|| panic!("{c}"))..];
                assert!(block.contains(".git/config (sbx-fs)"), "{c}");
                assert!(
                    block.contains("hint: .git/config is read-only inside"),
                    "{c}"
                );
                for w in ["git -c KEY=VALUE", "GIT_AUTHOR_", "git config --global"] {
                    assert!(block.contains(w), "{w}: {c}");
                }
                if log {
                    assert_event(
                        &t.base.join("audit.jsonl"),
                        "fs_write_denied",
                        "alert",
                        |e| {
                            e["path"].as_str().unwrap_or("").ends_with(".git/config")
                                && e["hint"].as_str().unwrap_or("").contains("git -c")
                        },
                    );
                }
            }
            // The global config in the sandbox's HOME works instead.
            let out = run(
                &t,
                chain,
                who,
                call(
                    "git config --global user.email other@example.invalid && git config user.email",
                ),
            );
            assert!(
                stdout(&out).contains("other@example.invalid"),
                "{}",
                ctx(who, chain, &out)
            );
        }
    }
    // explain says it, as a row.
    let t = tree(As::Root);
    let mut e = sbx_testutil::tool("sbx-policy");
    e.args(["explain", "--managed", "/nonexistent", "--home"])
        .arg(&t.home)
        .current_dir(&t.proj);
    let ex = stdout(&e.output().unwrap());
    assert!(
        ex.lines().any(|l| l.starts_with("always")
            && l.contains("git config --local` fails with EBUSY")
            && l.contains("git -c KEY=VALUE")),
        "{ex}"
    );
    assert!(ex.lines().any(|l| l.starts_with("git identity")), "{ex}");
}

#[test]
fn without_an_audit_log_alerts_are_one_summary_at_the_end() {
    for who in identities() {
        for chain in CHAIN_NAMES {
            let t = tree(who);
            let out = run(
                &t,
                chain,
                who,
                Call {
                    log: false,
                    script: "for i in 1 2 3; do unshare -U true 2>/dev/null; echo step$i >&2; done; echo done",
                    env: &[],
                    ..call("")
                },
            );
            let c = ctx(who, chain, &out);
            let se = stderr(&out);
            assert_eq!(out.status.code(), Some(0), "{c}");
            // The command's own stderr is not interleaved with alerts.
            assert!(!se.contains("ALERT"), "{c}");
            assert!(se.starts_with("step1\nstep2\nstep3\n"), "{c}");
            // Once, at the end: what, how often, where to see more.
            assert_eq!(se.matches("<sandbox_violations").count(), 1, "{c}");
            let block = &se[se.find("<sandbox_violations").unwrap()..];
            assert!(
                block.contains("syscall_denied syscall=unshare (sbx-seccomp) x3"),
                "{c}"
            );
            assert!(block.contains("rerun with --audit-log FILE"), "{c}");
            assert!(block.trim_end().ends_with("</sandbox_violations>"), "{c}");
            assert!(audit_events(&t.base.join("audit.jsonl")).is_empty(), "{c}");
        }
    }
}
