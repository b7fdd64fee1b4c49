//! A git repository driven through the composed chains one call at a
//! time, as an agent's tool calls are (each step its own `scripts/sbx-run`
//! or `sbx-policy chain` call, as root or as the test user), with the
//! host-side checks every step needs. Used by the suites of issues 23/25.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use sbx_testutil::{As, assert_event, output_within, run_as, stderr, stdout};

use super::{PATH, chown_r, write};

pub const T: Duration = Duration::from_secs(120);

pub const SETTINGS: &str = r#"{"permissions": {"allow": ["Edit(./**)", "Bash(sh:*)", "Bash(git:*)", "Bash(rm)", "Bash(mkfifo)", "Bash(mkdir)", "Bash(printf)", "Bash(echo)", "Bash(head)", "Bash(ln)", "Bash(cat)", "Bash(true)", "Bash(test)", "Bash([)", "Bash(tr)"]}}"#;

/// What every step's script starts with: an identity for commits (the
/// sandbox's home is private) and no editor.
pub const ENV: &str = "export GIT_AUTHOR_NAME=agent GIT_AUTHOR_EMAIL=a@example.invalid \
GIT_COMMITTER_NAME=agent GIT_COMMITTER_EMAIL=a@example.invalid GIT_EDITOR=true; ";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chain {
    SbxRun,
    /// `sbx-policy chain` (the Bash rules in invoke mode, the default).
    Policy,
    /// `sbx-policy chain --exec-allowlist strict`.
    PolicyStrict,
    /// `sbx-policy chain --trust zero` (gVisor).
    PolicyZero,
}
pub const CHAINS: [Chain; 2] = [Chain::SbxRun, Chain::Policy];

pub struct Proj {
    pub _d: tempfile::TempDir,
    pub who: As,
    pub base: PathBuf,
    pub root: PathBuf,
    pub home: PathBuf,
    pub log: PathBuf,
}

pub fn git_out(dir: &Path, args: &[&str]) -> Output {
    let mut c = Command::new("git");
    c.arg("-C")
        .arg(dir)
        .args([
            "-c",
            "safe.directory=*",
            "-c",
            "user.email=t@example.invalid",
            "-c",
            "user.name=t",
        ])
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env_remove("GIT_DIR");
    output_within(&mut c, T)
}

pub fn git_ok(dir: &Path, args: &[&str]) -> String {
    let o = git_out(dir, args);
    assert!(o.status.success(), "git {args:?}: {}", stderr(&o));
    stdout(&o).trim().to_string()
}

/// A repository made by `setup` (git commands run in it, files written
/// with `w`), given to the test user when it runs as that user.
pub fn project(who: As, setup: impl FnOnce(&Path)) -> Proj {
    project_with(who, SETTINGS, setup)
}

/// [`project`] with its own `.claude/settings.json`.
pub fn project_with(who: As, settings: &str, setup: impl FnOnce(&Path)) -> Proj {
    let d = sbx_testutil::shared_tempdir();
    let base = d.path().canonicalize().unwrap();
    let root = base.join("proj");
    let home = base.join("home");
    write(&home.join(".gitconfig"), "[user]\n\tname = agent\n");
    write(&root.join(".gitignore"), ".claude/\n");
    git_ok(&root, &["init", "-q", "-b", "main"]);
    setup(&root);
    write(&root.join(".claude/settings.json"), settings);
    if who == As::User {
        chown_r(&base);
    }
    Proj {
        _d: d,
        who,
        log: base.join("audit.jsonl"),
        base,
        root,
        home,
    }
}

/// Writes `f` = `text` and commits everything with `msg`.
pub fn commit(root: &Path, f: &str, text: &str, msg: &str) -> String {
    write(&root.join(f), text);
    git_ok(root, &["add", "-A"]);
    git_ok(root, &["commit", "-qm", msg]);
    git_ok(root, &["rev-parse", "HEAD"])
}

impl Proj {
    /// One call: the chain around `sh -c ENV+SCRIPT`, bounded in time.
    pub fn run(&self, chain: Chain, script: &str) -> Output {
        self.run_in(chain, &self.root, script)
    }

    /// The same, started in `dir` (the project is found from there).
    pub fn run_in(&self, chain: Chain, dir: &Path, script: &str) -> Output {
        let script = format!("{ENV}{script}");
        let mut c = match chain {
            Chain::SbxRun => {
                let mut c = Command::new("sh");
                c.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/sbx-run"))
                    .arg("-C")
                    .arg(dir)
                    .arg("-l")
                    .arg(&self.log)
                    .args(["--", "sh", "-c", &script]);
                c.env("SBX_BIN", sbx_testutil::bin("sbx-fs").parent().unwrap())
                    .env_remove("SBX_ID")
                    .env_remove("SBX_AUDIT_LOG");
                c
            }
            Chain::Policy | Chain::PolicyStrict | Chain::PolicyZero => {
                let mut c = sbx_testutil::tool("sbx-policy");
                c.arg("--audit-log").arg(&self.log);
                c.args(["chain", "--managed", "/nonexistent/managed.json", "--home"])
                    .arg(&self.home);
                if chain == Chain::PolicyStrict {
                    c.args(["--exec-allowlist", "strict"]);
                }
                if chain == Chain::PolicyZero {
                    c.args(["--trust", "zero"]);
                }
                c.args(["--", "sh", "-c", &script]);
                c
            }
        };
        c.current_dir(dir)
            .env("PATH", PATH)
            .env("HOME", &self.home)
            .env("XDG_STATE_HOME", self.base.join("state"));
        run_as(&mut c, self.who);
        output_within(&mut c, T)
    }

    /// A call that must succeed and print `want`; returns the context.
    pub fn step(&self, chain: Chain, script: &str, want: &str) -> (Output, String) {
        let out = self.run(chain, script);
        let c = format!(
            "{:?} {chain:?} step {script:?}\nstdout:\n{}\nstderr:\n{}",
            self.who,
            stdout(&out),
            stderr(&out)
        );
        assert_eq!(out.status.code(), Some(0), "{c}");
        assert!(stdout(&out).contains(want), "no {want:?}: {c}");
        self.assert_fsck_strict(&c);
        (out, c)
    }

    pub fn git(&self, args: &[&str]) -> String {
        git_ok(&self.root, args)
    }

    pub fn gitfile(&self, name: &str) -> PathBuf {
        self.root.join(".git").join(name)
    }

    pub fn assert_fsck_strict(&self, ctx: &str) {
        let o = git_out(&self.root, &["fsck", "--full", "--strict", "--no-dangling"]);
        let err = stderr(&o);
        assert!(
            o.status.success() && !err.contains("error") && !err.contains("missing"),
            "git fsck --full --strict: {err}\n{ctx}"
        );
    }

    pub fn assert_clean(&self, ctx: &str) {
        assert_eq!(self.git(&["status", "--porcelain"]), "", "{ctx}");
    }

    /// No in-progress state is left on the host.
    pub fn assert_nothing_in_progress(&self, ctx: &str) {
        for n in [
            "MERGE_HEAD",
            "CHERRY_PICK_HEAD",
            "REVERT_HEAD",
            "rebase-merge",
            "rebase-apply",
            "sequencer",
            "BISECT_LOG",
            "BISECT_START",
        ] {
            assert!(!self.gitfile(n).exists(), "{n} left behind: {ctx}");
        }
        // (An emptied refs/bisect directory may stay: libgit2 deletes refs
        // without pruning their directories.)
        assert_eq!(
            self.git(&["for-each-ref", "refs/bisect", "refs/rewritten"]),
            "",
            "{ctx}"
        );
    }

    pub fn dropped(&self, path: &str, reason: &str) {
        assert_event(&self.log, "stage_entry_dropped", "alert", |e| {
            e["path"] == path && e["reason"].as_str().unwrap_or("").contains(reason)
        });
    }
}
