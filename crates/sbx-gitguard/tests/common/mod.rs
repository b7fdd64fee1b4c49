//! A real repository made with the git CLI: commits, branches, tags (one
//! annotated), packed refs, loose objects, a submodule, a linked worktree, a
//! nested repository and a benign hook; owned by the identity under test.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sbx_testutil::{As, run_as};

/// The bound on every command a test runs through the fixture (git, sh,
/// sbx-gitguard): a hang fails the test instead of stalling it.
pub const LIMIT: u64 = 180;

pub struct Fixture {
    pub who: As,
    _tmp: tempfile::TempDir,
    pub dir: PathBuf,
    pub w: PathBuf,
    pub mark: PathBuf,
    pub audit: PathBuf,
}

const BUILD: &str = r#"
set -e
cd "$D"
git init -q lib
cd lib
echo l > l
git add l
git commit -qm lib1
cd "$D"
git init -q w
cd w
echo a > a
git add a
git commit -qm one
git tag v1
git tag -a v2 -m v2
git branch feat
echo b > b
git add b
git commit -qm two
git gc -q
git submodule -q add "$D/lib" sub
git commit -qm 'add sub'
git worktree add -q ../wt -b wtb
printf '#!/bin/sh\nexit 0\n' > .git/hooks/post-checkout
chmod +x .git/hooks/post-checkout
git init -q nested
cd nested
echo n > n
git add n
git commit -qm nested1
cd ..
echo nested >> .git/info/exclude
echo c > c
git add c
git commit -qm three
"#;

impl Fixture {
    pub fn new(who: As) -> Fixture {
        let tmp = sbx_testutil::shared_tempdir();
        let dir = tmp.path().to_path_buf();
        std::fs::write(
            dir.join("gitconfig"),
            "[user]\n\tname = T\n\temail = t@example.invalid\n[protocol \"file\"]\n\tallow = always\n[init]\n\tdefaultBranch = main\n[commit]\n\tgpgsign = false\n[advice]\n\tdetachedHead = false\n",
        )
        .unwrap();
        let f = Fixture {
            who,
            w: dir.join("w"),
            mark: dir.join("MARKER"),
            audit: dir.join("audit.jsonl"),
            dir,
            _tmp: tmp,
        };
        let out = f.sh(&f.dir, BUILD);
        assert!(
            out.status.success(),
            "fixture: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        f
    }

    fn env(&self, c: &mut Command) {
        c.env("GIT_CONFIG_GLOBAL", self.dir.join("gitconfig"))
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("D", &self.dir)
            .env("MARK", &self.mark)
            .env_remove("GIT_DIR")
            .env_remove("GIT_WORK_TREE");
        run_as(c, self.who);
    }

    /// A shell script as the identity under test.
    pub fn sh(&self, cwd: &Path, script: &str) -> Output {
        let mut c = Command::new("sh");
        c.arg("-c").arg(script).current_dir(cwd);
        self.env(&mut c);
        within(LIMIT, c, "sh")
    }

    /// git as the identity under test.
    pub fn git(&self, cwd: &Path, args: &[&str]) -> Output {
        let mut c = Command::new("git");
        c.args(args).current_dir(cwd);
        self.env(&mut c);
        within(LIMIT, c, "git")
    }

    pub fn git_ok(&self, cwd: &Path, args: &[&str]) -> String {
        let o = self.git(cwd, args);
        assert!(
            o.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// sbx-gitguard as the identity under test (audit log in the fixture).
    pub fn guard(&self, args: &[&str]) -> Output {
        within(LIMIT, self.guard_cmd(args), "sbx-gitguard")
    }

    /// The command [`Fixture::guard`] runs.
    pub fn guard_cmd(&self, args: &[&str]) -> Command {
        let mut c = sbx_testutil::tool("sbx-gitguard");
        c.arg(args[0])
            .arg("--audit-log")
            .arg(&self.audit)
            .args(&args[1..])
            .current_dir(&self.w);
        self.env(&mut c);
        c
    }

    /// [`Fixture::guard`] bounded in time: the tool is killed after `secs`
    /// seconds and the test fails (a hang is a defect, never a wait).
    pub fn guard_within(&self, secs: u64, args: &[&str]) -> Output {
        within(
            secs,
            self.guard_cmd(args),
            &format!("sbx-gitguard {args:?}"),
        )
    }

    /// [`Fixture::run`] bounded in time.
    pub fn run_within(&self, secs: u64, extra: &[&str], script: &str) -> Output {
        let w = self.w.to_str().unwrap();
        let mut args = vec!["run", "--repo", w];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sh", "-c", script]);
        self.guard_within(secs, &args)
    }

    /// `run --repo W -- sh -c SCRIPT` (the attack, run in W).
    pub fn run(&self, extra: &[&str], script: &str) -> Output {
        let w = self.w.to_str().unwrap();
        let mut args = vec!["run", "--repo", w];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sh", "-c", script]);
        self.guard(&args)
    }

    /// What the user sees: status and history of every part.
    pub fn state(&self) -> String {
        let mut s = String::new();
        for (dir, args) in [
            (self.w.clone(), &["status", "--porcelain=v1", "-b"][..]),
            (
                self.w.clone(),
                &["log", "--oneline", "--all", "--decorate"][..],
            ),
            (self.w.clone(), &["show-ref"][..]),
            (self.w.join("sub"), &["status", "--porcelain=v1", "-b"][..]),
            (self.w.join("sub"), &["log", "--oneline", "--all"][..]),
            (self.dir.join("wt"), &["status", "--porcelain=v1", "-b"][..]),
            (self.w.join("nested"), &["log", "--oneline", "--all"][..]),
        ] {
            let o = self.git(&dir, args);
            s.push_str(&format!(
                "== {} {args:?} ({})\n{}{}",
                dir.display(),
                o.status,
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ));
        }
        s
    }

    /// `git fsck --full` is clean in the repository and its submodule.
    pub fn assert_fsck_clean(&self) {
        for d in [self.w.clone(), self.w.join("sub"), self.w.join("nested")] {
            let o = self.git(&d, &["fsck", "--full", "--no-dangling"]);
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(
                o.status.success() && !err.contains("error") && !err.contains("missing"),
                "fsck in {}: {err}",
                d.display()
            );
        }
    }

    /// Runs the git commands that would run a planted hook, fsmonitor,
    /// pager, alias, filter, textconv or sshCommand, and asserts none ran.
    pub fn assert_nothing_runs(&self) {
        let script = r#"
git status >/dev/null 2>&1
git diff HEAD~1 >/dev/null 2>&1
git log -p -1 >/dev/null 2>&1
touch a b c; git status >/dev/null 2>&1; git add -A --dry-run >/dev/null 2>&1
git checkout -q main >/dev/null 2>&1
git st >/dev/null 2>&1
git ls-remote ssh://127.0.0.1:1/x >/dev/null 2>&1
GIT_PAGER= git -p log -1 >/dev/null 2>&1
(cd sub && git status >/dev/null 2>&1 && git checkout -q HEAD >/dev/null 2>&1)
(cd ../wt && git status >/dev/null 2>&1)
(cd nested && git status >/dev/null 2>&1)
for d in evil evil.git planted sym; do [ -d "$d" ] && (cd "$d" && git status >/dev/null 2>&1); done
true
"#;
        let o = self.sh(&self.w, script);
        assert!(o.status.success());
        assert!(
            !self.mark.exists(),
            "a planted program ran: {} exists",
            self.mark.display()
        );
    }
}

/// Runs `c` (stdout and stderr captured), killing its process group after
/// `secs` seconds and failing the test.
pub fn within(secs: u64, mut c: Command, _what: &str) -> Output {
    sbx_testutil::output_within(&mut c, std::time::Duration::from_secs(secs))
}
