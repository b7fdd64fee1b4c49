//! `sbx-gitguard plants`: repositories planted anywhere in a writable
//! directory (git project or not), found the way git's setup.c finds them,
//! are quarantined; the user's own repositories (known by device, inode and
//! content) are never touched, and one renamed away is put back. Every test
//! runs as root and as the unprivileged test user, and judges with the real
//! git CLI run as that identity.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sbx_testutil::{As, assert_event, assert_usage_error, code, identities, run_as, stderr};

struct Proj {
    who: As,
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    /// The writable project (not a git repository itself).
    p: PathBuf,
    q: PathBuf,
    mark: PathBuf,
    audit: PathBuf,
}

/// The bound on every command these tests run (git, sh, sbx-gitguard).
const LIMIT: std::time::Duration = std::time::Duration::from_secs(180);

const GITCONFIG: &str = "[user]\n\tname = T\n\temail = t@example.invalid\n[init]\n\tdefaultBranch = main\n[commit]\n\tgpgsign = false\n";

/// Plants git takes for repositories, one per directory, each with a
/// program git runs there (`git status`: fsmonitor; `git st`: the alias),
/// each writing its own marker.
pub const PLANTS: &str = r#"set -e
mk() { mkdir -p "$1"; printf 'ref: refs/heads/main\n' > "$1/HEAD"; printf '[core]\n\tfsmonitor = touch %s-%s\n[alias]\n\tst = !touch %s-%s\n' "$MARK" "$2" "$MARK" "$2" > "$1/config"; }
# objects and refs are executable *files*: git only checks access(X_OK)
mk a/.git a; : > a/.git/objects; : > a/.git/refs; chmod +x a/.git/objects a/.git/refs
# HEAD and a commondir naming a directory elsewhere in the tree
mkdir -p deep/b/.git common/objects common/refs
printf 'ref: refs/heads/main\n' > deep/b/.git/HEAD; echo ../../../common > deep/b/.git/commondir
printf '[core]\n\tfsmonitor = touch %s-b\n' "$MARK" > common/config
# a .git file naming a git dir
mk hidden c; mkdir hidden/objects hidden/refs; mkdir c; echo 'gitdir: ../hidden' > c/.git
# a .git symlink
mk hidden2 d; mkdir hidden2/objects hidden2/refs; mkdir d; ln -s ../hidden2 d/.git
# a bare-repository-shaped directory, deep down
mk x/y/z/e e; mkdir x/y/z/e/objects x/y/z/e/refs
"#;

const PLANTED: &[(&str, &str)] = &[
    ("a", "a"),
    ("deep/b", "b"),
    ("c", "c"),
    ("d", "d"),
    ("x/y/z/e", "e"),
];

impl Proj {
    fn new(who: As) -> Proj {
        let tmp = sbx_testutil::shared_tempdir();
        let dir = tmp.path().to_path_buf();
        std::fs::write(dir.join("gitconfig"), GITCONFIG).unwrap();
        let pr = Proj {
            who,
            p: dir.join("p"),
            q: dir.join("quarantine"),
            mark: dir.join("MARK"),
            audit: dir.join("audit.jsonl"),
            dir,
            _tmp: tmp,
        };
        // The user's own: a nested repository with a commit, and files.
        let o = pr.sh(
            &pr.dir,
            "set -e; mkdir p; cd p; echo data > notes.txt; git init -q keep; cd keep; echo k > k; git add k; git commit -qm keep",
        );
        assert!(o.status.success(), "fixture: {}", stderr(&o));
        pr
    }

    fn env(&self, c: &mut Command) {
        c.env("GIT_CONFIG_GLOBAL", self.dir.join("gitconfig"))
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("MARK", &self.mark)
            .env_remove("GIT_DIR")
            .env_remove("GIT_WORK_TREE")
            .env_remove("GIT_COMMON_DIR");
        run_as(c, self.who);
    }

    fn sh(&self, cwd: &Path, script: &str) -> Output {
        let mut c = Command::new("sh");
        c.arg("-c").arg(script).current_dir(cwd);
        self.env(&mut c);
        sbx_testutil::output_within(&mut c, LIMIT)
    }

    /// `sbx-gitguard plants --dir P --quarantine Q [extra] -- sh -c SCRIPT` in P.
    fn plants(&self, extra: &[&str], script: &str) -> Output {
        let mut c = sbx_testutil::tool("sbx-gitguard");
        c.arg("plants")
            .arg("--audit-log")
            .arg(&self.audit)
            .arg("--dir")
            .arg(&self.p)
            .arg("--quarantine")
            .arg(&self.q)
            .args(extra)
            .args(["--", "sh", "-c", script])
            .current_dir(&self.p);
        self.env(&mut c);
        sbx_testutil::output_within(&mut c, LIMIT)
    }

    /// Runs what the owner's prompt and fingers would run in `rel`, and
    /// returns whether the marker `tag` appeared.
    fn git_runs_plant(&self, rel: &str, tag: &str) -> bool {
        let d = self.p.join(rel);
        if d.is_dir() {
            self.sh(
                &d,
                "echo x > f 2>/dev/null; git status >/dev/null 2>&1; git st >/dev/null 2>&1; true",
            );
        }
        Path::new(&format!("{}-{tag}", self.mark.display())).exists()
    }

    fn keep_ok(&self) {
        let o = self.sh(
            &self.p.join("keep"),
            "git log --format=%s && git status --porcelain --untracked-files=no",
        );
        assert!(o.status.success(), "{:?}: keep: {}", self.who, stderr(&o));
        assert_eq!(String::from_utf8_lossy(&o.stdout), "keep\n");
        assert_eq!(
            std::fs::read_to_string(self.p.join("notes.txt")).unwrap(),
            "data\n"
        );
    }
}

fn ino(p: &Path) -> u64 {
    std::fs::symlink_metadata(p).unwrap().ino()
}

#[test]
fn control_without_plants_the_planted_repositories_run_code() {
    for who in identities() {
        let pr = Proj::new(who);
        let o = pr.sh(&pr.p, PLANTS);
        assert!(o.status.success(), "{}", stderr(&o));
        for (rel, tag) in PLANTED {
            assert!(
                pr.git_runs_plant(rel, tag),
                "{who:?}: control: git in {rel} did not run the plant (the test would prove nothing)"
            );
        }
    }
}

#[test]
fn every_planted_shape_is_quarantined_in_a_project_that_is_not_a_repository() {
    for who in identities() {
        let pr = Proj::new(who);
        let keep_ino = ino(&pr.p.join("keep/.git"));
        let out = pr.plants(&[], PLANTS);
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        for (rel, tag) in PLANTED {
            assert!(
                !pr.git_runs_plant(rel, tag),
                "{who:?}: git in {rel} ran the plant after sbx-gitguard plants"
            );
        }
        for p in [
            "a/.git",
            "deep/b/.git",
            "c/.git",
            "d/.git",
            "hidden",
            "x/y/z/e",
        ] {
            let full = pr.p.join(p);
            assert_event(&pr.audit, "git_repo_planted", "alert", |e| {
                e["path"] == full.to_str().unwrap()
                    && e["action"]
                        .as_str()
                        .unwrap()
                        .contains(pr.q.to_str().unwrap())
            });
        }
        // The .git entries went whole; the quarantine holds them.
        assert!(!pr.p.join("a/.git").exists());
        assert!(std::fs::symlink_metadata(pr.p.join("d/.git")).is_err());
        let err = stderr(&out);
        assert!(err.contains("planted repository"), "{err}");
        // The user's repository and files are untouched.
        assert_eq!(ino(&pr.p.join("keep/.git")), keep_ino);
        pr.keep_ok();
        assert_event(&pr.audit, "git_plants_checked", "alert", |_| true);
    }
}

#[test]
fn a_renamed_users_repository_is_put_back_and_its_replacement_quarantined() {
    for who in identities() {
        let pr = Proj::new(who);
        let keep_ino = ino(&pr.p.join("keep/.git"));
        let out = pr.plants(
            &[],
            r#"set -e
mv keep/.git keep/old-git
mkdir -p keep/.git/objects keep/.git/refs
printf 'ref: refs/heads/main\n' > keep/.git/HEAD
printf '[core]\n\tfsmonitor = touch %s-k\n' "$MARK" > keep/.git/config
"#,
        );
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert_eq!(
            ino(&pr.p.join("keep/.git")),
            keep_ino,
            "{who:?}: the user's .git is not back"
        );
        assert!(!pr.p.join("keep/old-git").exists());
        assert!(!pr.git_runs_plant("keep", "k"));
        pr.keep_ok();
        assert_event(&pr.audit, "git_repo_moved", "alert", |e| {
            e["found_at"]
                .as_str()
                .is_some_and(|s| s.ends_with("keep/old-git"))
        });
        assert_event(&pr.audit, "git_repo_planted", "alert", |e| {
            e["path"].as_str().is_some_and(|s| s.ends_with("keep/.git"))
                && e["dangerous_keys"].to_string().contains("core.fsmonitor")
        });
    }
}

#[test]
fn a_users_repository_changed_in_place_is_restored() {
    for who in identities() {
        let pr = Proj::new(who);
        let out = pr.plants(
            &[],
            r#"set -e
printf '[core]\n\tfsmonitor = touch %s-k\n' "$MARK" >> keep/.git/config
printf '#!/bin/sh\ntouch %s-k\n' "$MARK" > keep/.git/hooks/post-checkout; chmod +x keep/.git/hooks/post-checkout
echo ../../common > keep/.git/commondir; mkdir -p common/objects common/refs
"#,
        );
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        let cfg = std::fs::read_to_string(pr.p.join("keep/.git/config")).unwrap();
        assert!(!cfg.contains("fsmonitor"), "{cfg}");
        assert!(!pr.p.join("keep/.git/hooks/post-checkout").exists());
        assert!(!pr.p.join("keep/.git/commondir").exists());
        let o = pr.sh(&pr.p.join("keep"), "git checkout -q main; git status");
        assert!(o.status.success());
        assert!(!pr.git_runs_plant("keep", "k"));
        pr.keep_ok();
        assert_event(&pr.audit, "git_repo_changed", "alert", |e| {
            let r = e["restored"].to_string();
            r.contains("config")
                && r.contains("commondir")
                && e["quarantined"].to_string().contains("hooks/post-checkout")
        });
    }
}

#[test]
fn the_scan_budget_fails_closed_with_an_alert() {
    for who in identities() {
        let pr = Proj::new(who);
        // Before: over budget, the command does not run.
        let out = pr.plants(&["--max-entries", "3"], "touch ran");
        assert_usage_error(&out, "--max-entries");
        assert!(!pr.p.join("ran").exists());
        assert_event(&pr.audit, "plant_scan_budget", "alert", |e| {
            e["action"].as_str().unwrap().contains("did not run")
        });
        // After: the command made the tree too big to check: exit 125 and
        // an alert saying the directories were not fully checked.
        let out = pr.plants(
            &["--max-entries", "200"],
            "mkdir many; cd many; for i in $(seq 1 300); do : > f$i; done",
        );
        assert_eq!(code(&out), 125, "{who:?}: {}", stderr(&out));
        assert_event(&pr.audit, "plant_scan_budget", "alert", |e| {
            e["action"].as_str().unwrap().contains("not fully checked")
        });
    }
}

#[test]
fn names_are_escaped_on_the_terminal() {
    for who in identities() {
        let pr = Proj::new(who);
        // A directory name that would erase the alert line and paint a fake
        // "ok", set the window title and write the clipboard (OSC 0/52).
        let out = pr.plants(
            &[],
            r#"set -e
n=$(printf 'x\r\033[2Kok: all clean\033]0;t\007\033]52;c;ZXZpbA==\007')
mkdir -p "$n/objects" "$n/refs"; printf 'ref: refs/heads/main\n' > "$n/HEAD"
"#,
        );
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains("planted repository"), "{err}");
        assert!(
            !err.contains('\r') && !err.contains('\u{1b}') && !err.contains('\u{7}'),
            "raw control characters reached the terminal: {err:?}"
        );
        assert!(
            err.contains("x\\r\\e[2Kok: all clean\\e]0;t\\x07\\e]52;c;"),
            "{err}"
        );
    }
}

/// serde refuses a path that is not UTF-8 and `json!` panicked on it: a
/// repository planted under such a name (or a directory made unlistable, or
/// the user's repository moved to one) stopped the check half-way with exit
/// 101, and every plant after it in the walk stayed in the project.
#[test]
fn names_that_are_not_utf8_never_stop_the_check_half_way() {
    for who in identities() {
        let pr = Proj::new(who);
        let out = pr.plants(
            &[],
            r#"set -e
mk() { mkdir -p "$1/objects" "$1/refs"; printf 'ref: refs/heads/main\n' > "$1/HEAD"; printf '[core]\n\tfsmonitor = touch %s-%s\n' "$MARK" "$2" > "$1/config"; }
for i in $(seq 1 20); do mk z$i/.git z$i; done
mk "$(printf 'a\377b')/.git" ff
mkdir -p "$(printf 'u\376')/v"; mk "$(printf 'u\376')/v/.git" fe; chmod 000 "$(printf 'u\376')"
mv keep/.git "keep/$(printf 'old\375')"
"#,
        );
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
        for i in 1..=20 {
            assert!(
                !pr.git_runs_plant(&format!("z{i}"), &format!("z{i}")),
                "{who:?}: z{i} was left in the project"
            );
        }
        assert!(!pr.p.join("keep/old\u{fffd}").exists());
        pr.keep_ok();
        assert_event(&pr.audit, "git_repo_planted", "alert", |e| {
            e["path"]
                .as_str()
                .is_some_and(|s| s.ends_with("/a\\xffb/.git"))
        });
        assert_event(&pr.audit, "git_repo_moved", "alert", |e| {
            e["found_at"]
                .as_str()
                .is_some_and(|s| s.ends_with("keep/old\\xfd"))
        });
        assert_event(&pr.audit, "git_plants_checked", "alert", |e| {
            e["failed"].is_null()
        });
    }
}

#[test]
fn bad_input_is_one_line() {
    for who in identities() {
        let pr = Proj::new(who);
        let mut c = sbx_testutil::tool("sbx-gitguard");
        c.args(["plants", "--dir", "/nonexistent/x", "--", "true"]);
        run_as(&mut c, who);
        assert_usage_error(
            &sbx_testutil::output_within(&mut c, LIMIT),
            "--dir /nonexistent/x",
        );
        let q = pr.p.join("q");
        let mut c = sbx_testutil::tool("sbx-gitguard");
        c.arg("plants")
            .arg("--dir")
            .arg(&pr.p)
            .arg("--quarantine")
            .arg(&q)
            .args(["--", "touch", "ran"])
            .current_dir(&pr.p);
        run_as(&mut c, who);
        let out = sbx_testutil::output_within(&mut c, LIMIT);
        assert_usage_error(&out, "where the command can write");
        assert!(!pr.p.join("ran").exists());
    }
}

/// `plants` as [`Proj::plants`], killed and failed after 60 s: a FIFO the
/// command left must never make the check wait.
fn plants_within_60s(pr: &Proj, script: &str) -> Output {
    let mut c = sbx_testutil::tool("sbx-gitguard");
    c.arg("plants")
        .arg("--audit-log")
        .arg(&pr.audit)
        .arg("--dir")
        .arg(&pr.p)
        .arg("--quarantine")
        .arg(&pr.q)
        .args(["--", "sh", "-c", script])
        .current_dir(&pr.p);
    pr.env(&mut c);
    sbx_testutil::output_within(&mut c, std::time::Duration::from_secs(60))
}

/// A FIFO as a HEAD anywhere in the tree never blocks the check (it is
/// opened non-blocking and counts as a plant: git would hang on it), and a
/// directory the command made unlistable (`chmod 111`: git still reaches a
/// `.git` below it) hides nothing: it is made listable again with an alert
/// and the plants are quarantined.
#[test]
fn fifos_and_unlistable_directories_hide_no_plant() {
    for who in identities() {
        let pr = Proj::new(who);
        let script = r#"set -e
mk() { mkdir -p "$1/objects" "$1/refs"; printf 'ref: refs/heads/main\n' > "$1/HEAD"; printf '[core]\n\tfsmonitor = touch %s-%s\n[alias]\n\tst = !touch %s-%s\n' "$MARK" "$2" "$MARK" "$2" > "$1/config"; }
mk evil/.git f
mkdir -p zz/objects zz/refs; mkfifo zz/HEAD
mk hid/deep/.git h; chmod 111 hid
"#;
        let out = plants_within_60s(&pr, script);
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        let _ = std::fs::set_permissions(
            pr.p.join("hid"),
            <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755),
        );
        assert!(!pr.git_runs_plant("evil", "f"), "{who:?}: evil ran");
        assert!(
            !pr.git_runs_plant("hid/deep", "h"),
            "{who:?}: hidden plant ran"
        );
        assert!(!pr.p.join("zz/HEAD").exists(), "{who:?}: FIFO HEAD left");
        assert_event(&pr.audit, "git_plants_checked", "alert", |_| true);
        if who != As::Root {
            // Root lists a 0111 directory anyway; the test user cannot.
            assert_event(&pr.audit, "plant_scan_unreadable", "alert", |e| {
                e["path"].as_str().is_some_and(|p| p.ends_with("/hid"))
            });
        }
        pr.keep_ok();
    }
}

/// `objects` and `refs` as dangling symlinks: no repository for git now,
/// one as soon as the target is made (`mkdir target`, any build): counted
/// as a plant when it is planted. A hook of the user's repository
/// rewritten in place with its mtime put back is still a changed hook
/// (the ctime moved): quarantined, with an alert.
#[test]
fn dangling_links_and_hooks_rewritten_in_place_are_caught() {
    for who in identities() {
        let pr = Proj::new(who);
        let script = r#"set -e
mkdir -p tools/.git
printf 'ref: refs/heads/main\n' > tools/.git/HEAD
printf '[core]\n\tfsmonitor = touch %s-t\n' "$MARK" > tools/.git/config
ln -s ../../target tools/.git/objects; ln -s ../../target tools/.git/refs
H=keep/.git/hooks/pre-commit.sample
m=$(stat -c %Y "$H"); s=$(stat -c %s "$H")
head -c "$s" /dev/zero | tr '\0' '#' 1<> "$H"
touch -d "@$m" "$H"
"#;
        let out = plants_within_60s(&pr, script);
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        std::fs::create_dir_all(pr.p.join("target")).unwrap();
        if who == As::User {
            sbx_testutil::chown_to_test_user(&pr.p.join("target"));
        }
        assert!(
            !pr.git_runs_plant("tools", "t"),
            "{who:?}: the dangling plant ran"
        );
        assert_event(&pr.audit, "git_repo_planted", "alert", |e| {
            e["path"]
                .as_str()
                .is_some_and(|p| p.ends_with("tools/.git"))
        });
        assert_event(&pr.audit, "git_repo_changed", "alert", |e| {
            e["quarantined"].to_string().contains("pre-commit.sample")
        });
        assert!(
            !pr.p.join("keep/.git/hooks/pre-commit.sample").exists(),
            "{who:?}: the rewritten hook is still in place"
        );
        pr.keep_ok();
    }
}

/// Plants inside known repositories: a git dir planted in a user's
/// `.git/modules` with a `.git` file naming it (before, such a file was
/// kept as a submodule's), a user's bare repository's config and hooks,
/// and `config.worktree` where the user's config enables it.
const INNER_PLANTS: &str = r#"set -e
mkdir -p keep/.git/modules/evil/objects keep/.git/modules/evil/refs keep/evil
printf 'ref: refs/heads/main\n' > keep/.git/modules/evil/HEAD
printf '[core]\n\tfsmonitor = touch %s-m\n[alias]\n\tst = !touch %s-m\n' "$MARK" "$MARK" > keep/.git/modules/evil/config
echo 'gitdir: ../.git/modules/evil' > keep/evil/.git
printf '[core]\n\tfsmonitor = touch %s-w\n' "$MARK" > keep/.git/config.worktree
printf '[alias]\n\tst = !touch %s-b\n' "$MARK" >> bare.git/config
printf '#!/bin/sh\ntouch %s-b\n' "$MARK" > bare.git/hooks/post-update; chmod +x bare.git/hooks/post-update
"#;

#[test]
fn plants_inside_known_repositories_are_found() {
    for who in identities() {
        // Control: without `plants`, each of them runs its program.
        let pr = Proj::new(who);
        let o = pr.sh(
            &pr.p,
            "set -e; git -C keep config extensions.worktreeConfig true; git init -q --bare bare.git",
        );
        assert!(o.status.success(), "{}", stderr(&o));
        let o = pr.sh(&pr.p, INNER_PLANTS);
        assert!(o.status.success(), "{}", stderr(&o));
        for (rel, tag) in [("keep/evil", "m"), ("keep", "w"), ("bare.git", "b")] {
            assert!(
                pr.git_runs_plant(rel, tag),
                "{who:?}: control: git in {rel} did not run the plant"
            );
        }
        // With `plants`: none runs, the user's repositories are as they were.
        let pr = Proj::new(who);
        let o = pr.sh(
            &pr.p,
            "set -e; git -C keep config extensions.worktreeConfig true; git init -q --bare bare.git",
        );
        assert!(o.status.success(), "{}", stderr(&o));
        let bare_cfg = std::fs::read(pr.p.join("bare.git/config")).unwrap();
        let out = pr.plants(&[], INNER_PLANTS);
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        for (rel, tag) in [("keep/evil", "m"), ("keep", "w"), ("bare.git", "b")] {
            assert!(
                !pr.git_runs_plant(rel, tag),
                "{who:?}: git in {rel} ran the plant"
            );
        }
        assert_eq!(
            std::fs::read(pr.p.join("bare.git/config")).unwrap(),
            bare_cfg
        );
        assert!(!pr.p.join("bare.git/hooks/post-update").exists());
        assert!(!pr.p.join("keep/.git/config.worktree").exists());
        assert!(!pr.p.join("keep/.git/modules/evil/HEAD").exists());
        pr.keep_ok();
        let evil = pr.p.join("keep/.git/modules/evil");
        assert_event(&pr.audit, "git_repo_planted", "alert", |e| {
            e["path"] == evil.to_str().unwrap()
        });
        for rel in ["keep/.git", "bare.git"] {
            let want = pr.p.join(rel);
            assert_event(&pr.audit, "git_repo_changed", "alert", |e| {
                e["path"] == want.to_str().unwrap()
            });
        }
    }
}

impl Proj {
    /// Makes the project itself a repository (one commit), as `run` needs.
    fn make_repository(&self) {
        let o = self.sh(
            &self.p,
            "set -e; git init -q; printf 'keep/\\n' > .gitignore; git add .gitignore notes.txt; git commit -qm top",
        );
        assert!(o.status.success(), "fixture: {}", stderr(&o));
    }

    /// `sbx-gitguard run --repo P --plants P --plants-quarantine Q [extra]
    /// -- sh -c SCRIPT` in P: the plant check in `run`'s own process.
    fn run_plants_cmd(&self, extra: &[&str], script: &str) -> Command {
        let mut c = sbx_testutil::tool("sbx-gitguard");
        c.arg("--audit-log")
            .arg(&self.audit)
            .arg("run")
            .arg("--repo")
            .arg(&self.p)
            .arg("--plants")
            .arg(&self.p)
            .arg("--plants-quarantine")
            .arg(&self.q)
            .args(extra)
            .args(["--", "sh", "-c", script])
            .current_dir(&self.p);
        self.env(&mut c);
        c
    }

    /// [`Proj::run_plants_cmd`], its output.
    fn run_plants(&self, extra: &[&str], script: &str) -> Output {
        sbx_testutil::output_within(&mut self.run_plants_cmd(extra, script), LIMIT)
    }
}

/// `run --plants` (what sbx-policy chain and scripts/sbx-run use in a
/// repository) is `plants` inside `run`, in one process: every planted
/// shape is quarantined with its alert, before the repository's own check,
/// and the user's repositories stay as they were.
#[test]
fn run_plants_quarantines_every_planted_shape_before_the_repository_check() {
    for who in identities() {
        let pr = Proj::new(who);
        pr.make_repository();
        let keep_ino = ino(&pr.p.join("keep/.git"));
        let out = pr.run_plants(&[], PLANTS);
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        for (rel, tag) in PLANTED {
            assert!(
                !pr.git_runs_plant(rel, tag),
                "{who:?}: git in {rel} ran the plant after run --plants"
            );
        }
        for p in ["a/.git", "deep/b/.git", "c/.git", "d/.git", "x/y/z/e"] {
            let full = pr.p.join(p);
            assert_event(&pr.audit, "git_repo_planted", "alert", |e| {
                e["path"] == full.to_str().unwrap()
                    && e["action"]
                        .as_str()
                        .unwrap()
                        .contains(pr.q.to_str().unwrap())
            });
        }
        assert_eq!(ino(&pr.p.join("keep/.git")), keep_ino);
        pr.keep_ok();
        // One process: the plant events come between the snapshot and the
        // repository's verdict, as with `plants` as the layer inside `run`.
        let log = std::fs::read_to_string(&pr.audit).unwrap();
        let at = |ev: &str| {
            log.find(&format!("\"event\":\"{ev}\""))
                .unwrap_or_else(|| panic!("{ev}: {log}"))
        };
        assert!(at("git_snapshot") < at("git_plant_snapshot"));
        assert!(at("git_plant_snapshot") < at("git_plants_checked"));
        assert!(at("git_plants_checked") < at("git_verified"));
        let pids: std::collections::BTreeSet<String> = log
            .lines()
            .filter(|l| l.contains("\"event\":\"git_"))
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["pid"].to_string())
            .collect();
        assert_eq!(pids.len(), 1, "{who:?}: one sbx-gitguard process: {log}");
    }
}

/// Over --plants-max-entries nothing runs and no git stage is made; a
/// tree grown past it by the command fails the run (125) with the alert.
#[test]
fn run_plants_budget_fails_closed_before_the_stage_exists() {
    for who in identities() {
        let pr = Proj::new(who);
        pr.make_repository();
        let stage = pr.dir.join("sbx-git-stage-budget");
        let out = pr.run_plants(
            &[
                "--plants-max-entries",
                "3",
                "--stage",
                stage.to_str().unwrap(),
            ],
            "touch ran",
        );
        assert_usage_error(&out, "--max-entries");
        assert!(!pr.p.join("ran").exists());
        assert!(!stage.exists(), "{who:?}: a stage was made for nothing");
        assert_event(&pr.audit, "plant_scan_budget", "alert", |e| {
            e["action"].as_str().unwrap().contains("did not run")
        });
        let out = pr.run_plants(
            &["--plants-max-entries", "200"],
            "mkdir many; cd many; for i in $(seq 1 300); do : > f$i; done",
        );
        assert_eq!(code(&out), 125, "{who:?}: {}", stderr(&out));
        assert_event(&pr.audit, "plant_scan_budget", "alert", |e| {
            e["action"].as_str().unwrap().contains("not fully checked")
        });
        // The repository's own check still ran.
        assert_event(&pr.audit, "git_verified", "info", |_| true);
        // The inventory is of what the command finds: with 300 loose
        // objects, `run`'s keep links (one per object, in .git) are in it,
        // as they were for `plants` inside `run`: over budget, refused up
        // front (helper-45: taken before the links, it let the command
        // run and failed only after it).
        let o = pr.sh(
            &pr.dir,
            "set -e; mkdir objs; for i in $(seq 1 300); do echo $i > objs/$i; done; ls -d \"$PWD\"/objs/* | git -C p hash-object -w --stdin-paths >/dev/null",
        );
        assert!(o.status.success(), "{}", stderr(&o));
        let out = pr.run_plants(&["--plants-max-entries", "250"], "touch ran");
        assert_usage_error(&out, "--max-entries");
        assert!(!pr.p.join("ran").exists());
        // --plants-quarantine and --plants-max-entries need --plants.
        let mut c = sbx_testutil::tool("sbx-gitguard");
        c.arg("run")
            .arg("--repo")
            .arg(&pr.p)
            .args(["--plants-max-entries", "5", "--", "true"]);
        run_as(&mut c, who);
        assert_usage_error(&sbx_testutil::output_within(&mut c, LIMIT), "--plants");
    }
}

/// The commit a hostile command moves `main` to (an empty tree).
const EVIL_MAIN: &str = "t=$(git mktree </dev/null); c=$(echo evil | git commit-tree $t); git update-ref refs/heads/main $c";

impl Proj {
    fn main_is_top(&self) -> bool {
        let o = self.sh(&self.p, "git log -1 --format=%s main");
        String::from_utf8_lossy(&o.stdout).trim() == "top"
    }
}

/// A termination signal that comes while `run --plants` checks the plants
/// (after the command ended, the signals still held) is taken and
/// reported as the exit status: it never skips the stage's import and the
/// repository's check, as it did not when `plants` was a process of its
/// own (helper-45: the command grows the tree to widen the window, moves
/// `main`, and the signal came before the repair).
#[test]
fn run_plants_a_signal_during_the_check_skips_neither_the_import_nor_the_check() {
    for who in identities() {
        let pr = Proj::new(who);
        pr.make_repository();
        let pidfile = pr.dir.join("gitguard.pid");
        // A tree whose plant check takes a while (15,000 directories), then
        // the supervisor's pid for the test: the command's last act.
        let script = format!(
            "set -e; {EVIL_MAIN}; mkdir many; cd many; seq 1 15000 | xargs mkdir; echo $PPID > {}.tmp; mv {0}.tmp {0}",
            pidfile.display()
        );
        let killer = {
            let pidfile = pidfile.clone();
            std::thread::spawn(move || {
                let start = std::time::Instant::now();
                while !pidfile.exists() {
                    assert!(start.elapsed() < LIMIT, "the command never finished");
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                std::thread::sleep(std::time::Duration::from_millis(30));
                let pid = std::fs::read_to_string(&pidfile).unwrap();
                let st = Command::new("kill")
                    .args(["-TERM", pid.trim()])
                    .status()
                    .unwrap();
                assert!(st.success());
            })
        };
        let out = pr.run_plants(&[], &script);
        killer.join().unwrap();
        assert_eq!(
            code(&out),
            143,
            "{who:?}: the signal is the exit status: {}",
            stderr(&out)
        );
        assert!(pr.main_is_top(), "{who:?}: main was not restored");
        assert_event(&pr.audit, "git_plants_checked", "info", |_| true);
        assert_event(&pr.audit, "git_verified", "alert", |_| true);
    }
}

/// With stderr gone (a pipe whose reader left), lines are lost, never a
/// step: the plants are quarantined and the repository repaired.
/// helper-45: `eprintln!` panicked in the plant check and `run` exited 101
/// before its repair; helper-46: with the log at debug (every audit event
/// a tracing line too) tracing-subscriber's own `eprintln!` did.
#[test]
fn run_plants_a_closed_stderr_skips_neither_the_plants_nor_the_repair() {
    for who in identities() {
        for log in [None, Some("debug")] {
            let pr = Proj::new(who);
            pr.make_repository();
            let (r, w) = std::io::pipe().unwrap();
            drop(r);
            let mut c = pr.run_plants_cmd(&[], &format!("set -e; {EVIL_MAIN}; {PLANTS}"));
            if let Some(l) = log {
                c.env("SBX_LOG", l);
            }
            c.stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(w);
            let out = sbx_testutil::wait_within(&mut c, LIMIT);
            assert_eq!(code(&out), 0, "{who:?} {log:?}");
            assert!(pr.main_is_top(), "{who:?} {log:?}: main was not restored");
            for (rel, tag) in PLANTED {
                assert!(!pr.git_runs_plant(rel, tag), "{who:?} {log:?}: {rel}");
            }
            assert_event(&pr.audit, "git_plants_checked", "alert", |_| true);
            assert_event(&pr.audit, "git_verified", "alert", |_| true);
        }
    }
}

/// SIGTERM to the sbx-gitguard whose command line holds `needle` (its
/// stage's name: unique to the test).
fn term_the_run(needle: &str) {
    let pid = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|p| {
            std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| {
                let c = String::from_utf8_lossy(&c);
                c.contains(needle) && c.contains("sbx-gitguard")
            })
        })
        .expect("the sbx-gitguard run");
    let st = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
}

/// A termination signal while `run --plants` takes its plant inventory
/// (signals held, no command yet) stops the run there: the command never
/// starts, the stage made for it is removed, exit 128+N, as when `plants`
/// was a process of its own and died of it. Before, it stayed pending and
/// was forwarded to the command, which could ignore it and run
/// (helper-46).
#[test]
fn run_plants_a_signal_during_the_inventory_starts_no_command() {
    for who in identities() {
        let pr = Proj::new(who);
        pr.make_repository();
        // A writable directory besides the project whose inventory takes
        // a while (20,000 directories); the project's own snapshot does
        // not walk it.
        let big = pr.dir.join("big");
        let o = pr.sh(
            &pr.dir,
            "set -e; mkdir big; cd big; seq 1 20000 | xargs mkdir",
        );
        assert!(o.status.success(), "{}", stderr(&o));
        let stage = pr.dir.join("sbx-git-stage-inventory");
        let killer = {
            let stage = stage.clone();
            std::thread::spawn(move || {
                let start = std::time::Instant::now();
                // The stage exists: the snapshot is done, the inventory
                // is next.
                while !stage.exists() {
                    assert!(start.elapsed() < LIMIT, "no stage");
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                term_the_run("sbx-git-stage-inventory");
            })
        };
        let out = pr.run_plants(
            &[
                "--plants",
                big.to_str().unwrap(),
                "--plants-max-entries",
                "10000000",
                "--stage",
                stage.to_str().unwrap(),
            ],
            "trap '' TERM; touch ran; sleep 1",
        );
        killer.join().unwrap();
        assert_eq!(code(&out), 143, "{who:?}: {}", stderr(&out));
        assert!(!pr.p.join("ran").exists(), "{who:?}: the command ran");
        assert!(!stage.exists(), "{who:?}: the stage was left");
    }
}

/// A termination signal during the stage's import (held there) no longer
/// skips the repository's check: it becomes the exit status after it
/// (helper-46: the check was skipped and a planted bare repository
/// stayed, at 594e72b too).
#[test]
fn a_signal_during_the_import_skips_not_the_check() {
    for who in identities() {
        let pr = Proj::new(who);
        pr.make_repository();
        let stage = pr.dir.join("sbx-git-stage-import");
        let mark = pr.dir.join("command-done");
        // 5,000 objects for the import to read and verify, a repository
        // planted in the work tree for the check to remove.
        let script = format!(
            "set -e; o={s}/git/upper/objects; mkdir -p $o ../objs; for i in $(seq 1 5000); do echo $i > ../objs/f$i; done; \
             ls -d \"$(cd ../objs; pwd)\"/f* | GIT_OBJECT_DIRECTORY=$o git hash-object -w --stdin-paths >/dev/null; \
             mkdir -p evil/objects evil/refs; echo 'ref: refs/heads/main' > evil/HEAD; touch {m}",
            s = stage.display(),
            m = mark.display()
        );
        let killer = {
            let mark = mark.clone();
            std::thread::spawn(move || {
                let start = std::time::Instant::now();
                while !mark.exists() {
                    assert!(start.elapsed() < LIMIT, "the command never finished");
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
                term_the_run("sbx-git-stage-import");
            })
        };
        let mut c = sbx_testutil::tool("sbx-gitguard");
        c.arg("--audit-log")
            .arg(&pr.audit)
            .arg("run")
            .arg("--repo")
            .arg(&pr.p)
            .arg("--stage")
            .arg(&stage)
            .args(["--", "sh", "-c", &script])
            .current_dir(&pr.p);
        pr.env(&mut c);
        let out = sbx_testutil::output_within(&mut c, LIMIT);
        killer.join().unwrap();
        assert_eq!(code(&out), 143, "{who:?}: {}", stderr(&out));
        assert!(
            !pr.p.join("evil").exists(),
            "{who:?}: the check did not run: the planted repository stayed"
        );
        assert_event(&pr.audit, "objects_imported", "info", |_| true);
        assert_event(&pr.audit, "git_verified", "alert", |_| true);
        assert!(!stage.exists(), "{who:?}: the stage was left");
    }
}
