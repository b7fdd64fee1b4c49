//! The git stage: commits made inside a sandbox whose whole .git is an
//! overlay (lowerdir the real .git, upperdir DIR/git/upper, workdir
//! DIR/git/work) with config and hooks/ read-only on top, exactly as sbx-fs
//! --git-stage mounts it (built here with unshare + mount, as root and as
//! the unprivileged user with userxattr). The real `git` CLI works inside
//! and judges the repository afterwards.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::Fixture;
use sbx_testutil::{As, assert_event, assert_usage_error, code, identities, stderr};

/// Mounts the stage the way sbx-fs does, then runs $3 in the work tree.
const MOUNT: &str = r#"set -e
S=$1; R=$2
o=""; [ -n "$SBX_USERNS" ] && o=",userxattr"
mount -t overlay overlay -o "nosuid,nodev,lowerdir=$R/.git,upperdir=$S/git/upper,workdir=$S/git/work$o" "$R/.git"
for p in config hooks; do
  mount --bind "$R/.git/$p" "$R/.git/$p"
  mount -o remount,bind,ro "$R/.git/$p"
done
cd "$R"
exec sh -ec "$3"
"#;

fn stage_path(f: &Fixture, name: &str) -> PathBuf {
    f.dir.join(format!("sbx-git-stage-{name}"))
}

/// `sbx-gitguard run --repo W --stage S [extra] -- unshare ... <agent>`.
fn staged(f: &Fixture, stage: &Path, extra: &[&str], agent: &str) -> Output {
    let w = f.w.to_str().unwrap();
    let s = stage.to_str().unwrap();
    let mut args = vec!["run", "--repo", w, "--stage", s];
    args.extend_from_slice(extra);
    args.push("--");
    match f.who {
        As::Root => args.extend_from_slice(&["unshare", "-m"]),
        As::User => args.extend_from_slice(&["unshare", "-Urm", "env", "SBX_USERNS=1"]),
    }
    args.extend_from_slice(&["sh", "-c", MOUNT, "sh", s, w, agent]);
    f.guard(&args)
}

/// `run --stage STAGE -- sh -c SCRIPT` WITHOUT sbx-fs's overlay (a
/// misuse: the command writes the host's .git directly).
fn staged_without_overlay(f: &Fixture, stage: &Path, script: &str) -> std::process::Command {
    f.guard_cmd(&[
        "run",
        "--repo",
        w_of(f),
        "--stage",
        stage.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        script,
    ])
}

/// `run --stage STAGE -- true` (nothing written: what the run itself
/// makes, reaps and removes).
fn staged_true(f: &Fixture, stage: &Path) -> std::process::Command {
    f.guard_cmd(&[
        "run",
        "--repo",
        w_of(f),
        "--stage",
        stage.to_str().unwrap(),
        "--",
        "true",
    ])
}

/// The host's index matches the imported HEAD and the work tree.
fn clean_status(f: &Fixture) {
    assert_eq!(
        f.git_ok(&f.w, &["status", "--porcelain", "--untracked-files=no"]),
        "",
        "{:?}: git status is not clean",
        f.who
    );
}

fn fsck_strict(f: &Fixture) {
    let o = f.git(&f.w, &["fsck", "--strict", "--no-dangling"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && !err.contains("error") && !err.contains("missing"),
        "git fsck --strict ({}): {err}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout)
    );
    f.assert_fsck_clean();
}

/// The object id a name resolves to ("" when it does not).
fn rev(f: &Fixture, what: &str) -> String {
    let o = f.git(&f.w, &["rev-parse", "--verify", "-q", what]);
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

fn subjects(f: &Fixture, what: &str) -> String {
    f.git_ok(&f.w, &["log", "--format=%s", what])
}

#[test]
fn commits_branch_tag_and_gc_in_the_sandbox_are_imported() {
    for who in identities() {
        let f = Fixture::new(who);
        let s = stage_path(&f, "work");
        let main_before = rev(&f, "main");
        let out = staged(
            &f,
            &s,
            &[],
            "echo x > x; git add x; git commit -qm agent-one
             git checkout -q -b feature
             echo y > y; git add y; git commit -qm agent-two
             git tag v9
             git gc -q",
        );
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert!(!s.exists(), "{who:?}: the stage is still there");
        assert!(subjects(&f, "main").starts_with("agent-one\n"), "{who:?}");
        assert!(subjects(&f, "feature").starts_with("agent-two\nagent-one\n"));
        assert_eq!(rev(&f, "v9"), rev(&f, "feature"));
        assert_eq!(
            f.git_ok(&f.w, &["symbolic-ref", "HEAD"]).trim(),
            "refs/heads/feature"
        );
        clean_status(&f);
        fsck_strict(&f);
        assert_event(&f.audit, "ref_imported", "info", |e| {
            e["ref"] == "refs/heads/main"
                && e["old"] == main_before.as_str()
                && e["fast_forward"] == true
        });
        assert_event(&f.audit, "ref_imported", "info", |e| {
            e["ref"] == "HEAD" && e["new"] == "ref: refs/heads/feature"
        });
        assert_event(&f.audit, "ref_imported", "info", |e| {
            e["ref"] == "refs/tags/v9" && e["old"].is_null()
        });
        // The reflog is the sandbox's (git's own entries, so `main@{1}`
        // works in the next call; which sandbox moved it is in the audit
        // log's ref_imported).
        let log = f.git_ok(&f.w, &["reflog", "show", "--format=%gs", "main"]);
        assert!(log.starts_with("commit: agent-one\n"), "{log}");
        assert_eq!(rev(&f, "main@{1}"), main_before);
        // The sandbox's index came in, rebuilt: nothing reset or dropped.
        assert_event(&f.audit, "index_rebuilt", "info", |e| {
            e["reset_to_head"] == 0 && e["dropped"] == 0
        });
        assert_event(&f.audit, "git_stage_imported", "info", |e| {
            e["refused"] == 0 && e["head_changed"] == true
        });
        // Legitimate work raises no alert.
        let alerts: Vec<_> = sbx_testutil::audit_events(&f.audit)
            .into_iter()
            .filter(|e| e["severity"] == "alert")
            .collect();
        assert!(
            alerts.is_empty(),
            "{who:?}: alerts for legitimate work: {alerts:?}"
        );
    }
}

#[test]
fn amend_is_imported_and_logged() {
    for who in identities() {
        let f = Fixture::new(who);
        let s = stage_path(&f, "amend");
        let old = rev(&f, "main");
        let out = staged(&f, &s, &[], "git commit -q --amend -m amended");
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert!(subjects(&f, "main").starts_with("amended\n"));
        clean_status(&f);
        assert_event(&f.audit, "ref_imported", "info", |e| {
            e["ref"] == "refs/heads/main" && e["old"] == old.as_str() && e["fast_forward"] == false
        });
        fsck_strict(&f);
        assert!(!s.exists());
    }
}

#[test]
fn deleting_a_branch_is_imported_with_its_old_id_but_not_the_checked_out_one_or_a_tag() {
    for who in identities() {
        let f = Fixture::new(who);
        let s = stage_path(&f, "del");
        let feat = rev(&f, "feat");
        let main = rev(&f, "main");
        let v1 = rev(&f, "v1");
        let out = staged(
            &f,
            &s,
            &[],
            "git branch -D feat >/dev/null; git update-ref -d refs/heads/main; git tag -d v1 >/dev/null",
        );
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert_eq!(rev(&f, "feat"), "", "{who:?}: feat still exists");
        assert_event(&f.audit, "ref_deleted", "info", |e| {
            e["ref"] == "refs/heads/feat" && e["old"] == feat.as_str()
        });
        assert_eq!(rev(&f, "main"), main);
        assert_eq!(rev(&f, "v1"), v1);
        assert_event(&f.audit, "ref_refused", "alert", |e| {
            e["ref"] == "refs/heads/main" && e["reason"] == "deleting the checked-out branch"
        });
        assert_event(&f.audit, "ref_refused", "alert", |e| {
            e["ref"] == "refs/tags/v1" && e["reason"] == "deleting a tag"
        });
        fsck_strict(&f);
    }
}

/// git's rules allow `;`, `$`, `{`, `|`, backquotes and quotes in a ref
/// name. A branch the sandbox named `x;touch${IFS}MARK;#` (imported as a
/// new branch by one call) and deleted by the next: `ref_deleted` hands the
/// user a `restore` command, which ran the name as a shell command. Each
/// word is quoted now: the command brings the branch back and runs nothing
/// else.
#[test]
fn the_restore_command_of_a_deleted_branch_quotes_its_name() {
    for who in identities() {
        let f = Fixture::new(who);
        let evil = format!("x;touch${{IFS}}{};#'\"`", f.mark.display());
        let name = format!("refs/heads/{evil}");
        f.git_ok(&f.w, &["update-ref", &name, "feat"]);
        let feat = rev(&f, "feat");
        let s = stage_path(&f, "restore");
        let out = staged(
            &f,
            &s,
            &[],
            "git for-each-ref --format='%(refname)' refs/heads | grep ';' | while read -r r; do git update-ref -d \"$r\"; done",
        );
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert_eq!(rev(&f, &name), "", "{who:?}: the branch still exists");
        let e = assert_event(&f.audit, "ref_deleted", "info", |e| {
            e["ref"] == name.as_str()
        });
        let restore = e["restore"].as_str().unwrap().to_string();
        let o = f.sh(&f.w, &restore);
        assert!(o.status.success(), "{who:?}: {restore}: {}", stderr(&o));
        assert!(!f.mark.exists(), "{who:?}: {restore} ran the branch name");
        assert_eq!(
            rev(&f, &name),
            feat,
            "{who:?}: {restore} did not restore it"
        );
    }
}

#[test]
fn removing_the_refs_directories_deletes_no_checked_out_branch() {
    for who in identities() {
        // refs/heads whited out as a directory: each loose branch in it is
        // a deletion; main (checked out here) and wtb (checked out in the
        // linked worktree) are refused; the packed tags stay visible.
        attack(
            who,
            "rm -rf .git/refs/heads .git/refs/tags",
            "ref_refused",
            |e| e["ref"] == "refs/heads/wtb" && e["reason"] == "deleting the checked-out branch",
        );
        // refs/ itself whited out, or made opaque (removed and made anew):
        // every loose ref the host has is a deletion, by the same rules.
        attack(who, "rm -rf .git/refs", "ref_refused", |e| {
            e["ref"] == "refs/heads/main" && e["reason"] == "deleting the checked-out branch"
        });
        attack(
            who,
            "rm -rf .git/refs; mkdir -p .git/refs/heads .git/refs/tags",
            "ref_refused",
            |e| e["ref"] == "refs/heads/wtb" && e["reason"] == "deleting the checked-out branch",
        );
    }
}

/// A stage the sandbox nested past PATH_MAX and the fd limit (1,500
/// directories under refs/heads, `mkdir d && cd d`) is removed all the
/// same: a path-based removal failed with ENAMETOOLONG and left it in the
/// temp dir for good, the sandbox's content and all.
#[test]
fn a_stage_nested_deeper_than_path_max_is_removed() {
    for who in identities() {
        let f = Fixture::new(who);
        let s = stage_path(&f, "deep");
        let out = staged(
            &f,
            &s,
            &[],
            "cd .git/refs/heads; i=0; while [ $i -lt 1500 ]; do mkdir dir$i; cd dir$i; i=$((i+1)); done; echo $i > /dev/null",
        );
        let err = stderr(&out);
        assert!(!s.exists(), "{who:?}: the stage is still there: {err}");
        assert!(!err.contains("cannot remove the stage"), "{who:?}: {err}");
        fsck_strict(&f);
    }
}

/// An attack from inside the sandbox: refused with its alert, the
/// repository as it was, fsck clean, the stage gone.
fn attack(who: As, agent: &str, event: &str, pred: impl Fn(&serde_json::Value) -> bool) {
    let f = Fixture::new(who);
    let s = stage_path(&f, "attack");
    let before = f.state();
    let out = staged(&f, &s, &[], agent);
    assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
    assert_eq!(f.state(), before, "{who:?}: the repository changed");
    fsck_strict(&f);
    f.assert_nothing_runs();
    assert_event(&f.audit, event, "alert", pred);
    assert!(!s.exists(), "{who:?}: the stage is still there");
}

const ZERO_REF: &str = "1111111111111111111111111111111111111111";

#[test]
fn a_ref_to_a_missing_object_is_refused() {
    for who in identities() {
        attack(
            who,
            &format!("echo {ZERO_REF} > .git/refs/heads/evil"),
            "ref_refused",
            |e| {
                e["ref"] == "refs/heads/evil"
                    && e["reason"].as_str().unwrap().contains("does not exist")
            },
        );
    }
}

#[test]
fn a_commit_with_an_incomplete_history_is_refused_and_leaves_no_broken_link() {
    for who in identities() {
        // A well-formed commit whose tree does not exist anywhere: it must
        // not even reach the object store (fsck would report the broken
        // link of an unreachable object too).
        attack(
            who,
            "C=$(printf 'tree 0123456789012345678901234567890123456789\nparent %s\nauthor a <a@b> 1 +0000\ncommitter a <a@b> 1 +0000\n\nbroken\n' $(git rev-parse HEAD) | git hash-object -t commit -w --stdin --literally)
             echo $C > .git/refs/heads/broken
             git update-ref refs/heads/main $C",
            "ref_refused",
            |e| {
                e["ref"] == "refs/heads/broken"
                    && e["reason"]
                        .as_str()
                        .unwrap()
                        .contains("incomplete history: object 0123456789012345678901234567890123456789")
            },
        );
    }
}

#[test]
fn a_corrupt_loose_object_is_refused() {
    for who in identities() {
        // Garbage under an object name, and a real object moved under a
        // name it does not hash to; a branch points at each.
        attack(
            who,
            "mkdir -p .git/objects/ab .git/objects/cd
             printf garbage > .git/objects/ab/cdefabcdefabcdefabcdefabcdefabcdefabcd
             B=$(git commit-tree -m evil $(git rev-parse HEAD^{tree}))
             mv .git/objects/$(echo $B | cut -c1-2)/$(echo $B | cut -c3-) .git/objects/cd/ababababababababababababababababababab
             echo abcdefabcdefabcdefabcdefabcdefabcdefabcd > .git/refs/heads/evil1
             echo cdababababababababababababababababababab > .git/refs/heads/evil2",
            "object_refused",
            |e| e["object"] == "cdababababababababababababababababababab",
        );
    }
}

/// Issue 19: a staged run does not read again the loose objects an earlier
/// one verified (a cache by inode, size and ctime). An object damaged in
/// place between two runs changed its ctime, so it is read and found
/// before the command, as without the cache.
#[test]
fn a_loose_object_damaged_between_staged_runs_is_found_before_the_command() {
    for who in identities() {
        let f = Fixture::new(who);
        let out = staged(&f, &stage_path(&f, "first"), &[], "true");
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        let oid = rev(&f, "HEAD");
        let p =
            f.w.join(format!(".git/objects/{}/{}", &oid[..2], &oid[2..]));
        assert!(p.exists(), "fixture: HEAD should be a loose object");
        // Same size, same inode: only the ctime tells.
        let o = f.sh(
            &f.w,
            &format!(
                "chmod u+w {p} && printf XXXX | dd of={p} bs=1 seek=4 conv=notrunc 2>/dev/null",
                p = p.display()
            ),
        );
        assert!(o.status.success());
        let s = stage_path(&f, "second");
        let out = staged(&f, &s, &[], "touch \"$MARK\"");
        assert_usage_error(&out, "already damaged");
        assert!(
            !f.mark.exists(),
            "{who:?}: the command ran on a damaged repository"
        );
        assert!(!s.exists());
        assert_event(&f.audit, "git_damaged_before", "alert", |e| {
            e["found"].as_str().unwrap().contains(&oid)
        });
    }
}

/// Issue 19: after a staged command, a fan-out directory whose stat is
/// unchanged (nothing added, removed or renamed in it) is not stat'ed file
/// by file: the overlay keeps the sandbox from writing the objects. Here
/// the command runs WITHOUT the overlay (`run --stage` misused): an object
/// replaced by a rename changes its directory and is found by that run; one
/// written in place (same inode, same directory) is found before the next
/// command, as between turns.
#[test]
fn objects_changed_outside_the_overlay_of_a_staged_run_are_found() {
    for who in identities() {
        let f = Fixture::new(who);
        let out = staged(&f, &stage_path(&f, "first"), &[], "true");
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        // Directory stats younger than dirlist::RACY are never trusted: age
        // them so that the cheap path is the one taken.
        std::thread::sleep(std::time::Duration::from_millis(2100));
        let tip = rev(&f, "HEAD");
        let tree = rev(&f, "HEAD^{tree}");
        let path = |o: &str| format!(".git/objects/{}/{}", &o[..2], &o[2..]);
        let s = stage_path(&f, "rename");
        let swap = format!(
            "cp {t} x && chmod 444 x && mv -f x {p}",
            t = path(&tree),
            p = path(&tip)
        );
        let out = common::within(
            common::LIMIT,
            staged_without_overlay(&f, &s, &swap),
            "sbx-gitguard",
        );
        assert_eq!(code(&out), 125, "{who:?}: {}", stderr(&out));
        assert_event(&f.audit, "git_integrity", "alert", |e| {
            e["check"] == "objects" && e["found"].as_str().unwrap_or("").contains(&tip)
        });

        let f = Fixture::new(who);
        let out = staged(&f, &stage_path(&f, "first"), &[], "true");
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        std::thread::sleep(std::time::Duration::from_millis(2100));
        let tip = rev(&f, "HEAD");
        let s = stage_path(&f, "inplace");
        let poke = format!(
            "chmod u+w {p} && printf XXXX | dd of={p} bs=1 seek=4 conv=notrunc 2>/dev/null",
            p = path(&tip)
        );
        let out = common::within(
            common::LIMIT,
            staged_without_overlay(&f, &s, &poke),
            "sbx-gitguard",
        );
        assert!(
            code(&out) == 0 || code(&out) == 125,
            "{who:?}: {}",
            stderr(&out)
        );
        let out = staged(&f, &stage_path(&f, "next"), &[], "touch \"$MARK\"");
        assert_usage_error(&out, "already damaged");
        assert!(
            !f.mark.exists(),
            "{who:?}: the command ran on a damaged repository"
        );
        assert_event(&f.audit, "git_damaged_before", "alert", |e| {
            e["found"].as_str().unwrap().contains(&tip)
        });
    }
}

/// Writes 4 bytes into the loose object `oid` in place: same inode, same
/// size, same directory (only the file's own ctime tells).
fn poke(oid: &str) -> String {
    let p = format!(".git/objects/{}/{}", &oid[..2], &oid[2..]);
    format!("chmod u+w {p} && printf XXXX | dd of={p} bs=1 seek=4 conv=notrunc 2>/dev/null")
}

/// Two more commits on the host: HEAD~1 is then a loose commit no ref
/// names. Returns it, after the fan-out directories are old enough to be
/// trusted by their stat (dirlist::RACY).
fn loose_inner_commit(f: &Fixture) -> String {
    let o = f.sh(
        &f.w,
        "git commit -q --allow-empty -m inner && git commit -q --allow-empty -m top",
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let old = rev(f, "HEAD~1");
    assert!(
        f.w.join(format!(".git/objects/{}/{}", &old[..2], &old[2..]))
            .exists(),
        "fixture: HEAD~1 should be a loose object"
    );
    std::thread::sleep(std::time::Duration::from_millis(2100));
    old
}

/// The next staged run refuses to start ("already damaged", the alert
/// naming `oid`) and its command does not run.
fn refused_before_the_command(f: &Fixture, stage: &str, oid: &str) {
    let out = staged(f, &stage_path(f, stage), &[], "touch \"$MARK\"");
    assert_usage_error(&out, "already damaged");
    assert!(
        !f.mark.exists(),
        "{:?}: the command ran on a damaged repository",
        f.who
    );
    assert_event(&f.audit, "git_damaged_before", "alert", |e| {
        e["found"].as_str().unwrap().contains(oid)
    });
}

/// Issue 19: a staged run's snapshot takes a fan-out directory whose stat
/// is the one an earlier staged run saved as it was, without a stat of
/// each object. An object written in place between runs (same directory
/// stat) is then checked when libgit2 is first about to read it: here the
/// import, judging a new branch the sandbox points at it, finds it damaged
/// and refuses the branch; libgit2 never reads it.
#[test]
fn an_object_damaged_in_place_between_staged_runs_is_checked_before_it_is_read() {
    for who in identities() {
        let f = Fixture::new(who);
        let old = loose_inner_commit(&f);
        let out = staged(&f, &stage_path(&f, "first"), &[], "true");
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert!(f.sh(&f.w, &poke(&old)).status.success());
        let out = staged(
            &f,
            &stage_path(&f, "second"),
            &[],
            &format!("echo {old} > .git/refs/heads/evil"),
        );
        assert!(
            code(&out) == 0 || code(&out) == 125,
            "{who:?}: {}",
            stderr(&out)
        );
        assert_eq!(
            rev(&f, "refs/heads/evil"),
            "",
            "{who:?}: the branch came in"
        );
        assert_event(&f.audit, "ref_refused", "alert", |e| {
            e["ref"] == "refs/heads/evil" && e["reason"].as_str().unwrap_or("").contains("damaged")
        });
    }
}

/// Issue 19: what earlier staged runs verified is taken on trust only
/// while every command ran under the overlay. A run without a stage (its
/// command can write object files in place) drops it, so an object it
/// damaged in place is found by the next staged run before its command.
#[test]
fn an_object_written_in_place_by_a_run_without_the_overlay_is_found_by_the_next_staged_run() {
    for who in identities() {
        let f = Fixture::new(who);
        let old = loose_inner_commit(&f);
        let out = staged(&f, &stage_path(&f, "first"), &[], "true");
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        let out = f.guard(&["run", "--repo", w_of(&f), "--", "sh", "-c", &poke(&old)]);
        assert_eq!(code(&out), 125, "{who:?}: {}", stderr(&out));
        refused_before_the_command(&f, "next", &old);
    }
}

/// The import reads blobs of the host too (a `.gitattributes` a new tree
/// names, for git fsck --strict's checks): one truncated in place between
/// staged runs (its directory's stat unchanged) is checked before libgit2
/// reads it (which would loop forever, with signals held by the import).
/// The run ends, and the tree that needs the unreadable blob is refused.
#[test]
fn a_host_blob_the_import_reads_is_checked_first() {
    for who in identities() {
        let f = Fixture::new(who);
        let o = f.sh(
            &f.w,
            "printf '*.txt text\\n' > .gitattributes && git add .gitattributes && git commit -qm attrs",
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let blob = rev(&f, "HEAD:.gitattributes");
        std::thread::sleep(std::time::Duration::from_millis(2100));
        let out = staged(&f, &stage_path(&f, "first"), &[], "true");
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        let p = format!(".git/objects/{}/{}", &blob[..2], &blob[2..]);
        let o = f.sh(&f.w, &format!("chmod u+w {p} && truncate -s 20 {p}"));
        assert!(o.status.success());
        let before = rev(&f, "HEAD");
        let out = staged(
            &f,
            &stage_path(&f, "second"),
            &[],
            "echo y > sibling.txt && git add sibling.txt && git commit -qm sibling",
        );
        assert!(
            code(&out) == 0 || code(&out) == 125,
            "{who:?}: {}",
            stderr(&out)
        );
        assert_eq!(rev(&f, "HEAD"), before, "{who:?}: the commit came in");
        assert_event(&f.audit, "object_refused", "alert", |e| {
            e["reason"]
                .as_str()
                .unwrap_or("")
                .contains("gitattributesMissing")
        });
    }
}

/// A staged run while a run without a stage has its command running (which
/// can write object files in place) neither trusts nor saves the cache, so
/// an object damaged by that command is found by the staged run after it.
#[test]
fn a_staged_run_during_a_run_without_the_overlay_leaves_no_cache_behind() {
    for who in identities() {
        let f = Fixture::new(who);
        let old = loose_inner_commit(&f);
        let out = staged(&f, &stage_path(&f, "first"), &[], "true");
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        let mut bg = f.guard_cmd(&[
            "run",
            "--repo",
            w_of(&f),
            "--",
            "sh",
            "-c",
            &format!("sleep 3; {}", poke(&old)),
        ]);
        let child = bg
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1000));
        let out = staged(&f, &stage_path(&f, "during"), &[], "true");
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        let st = child.wait_with_output().unwrap().status;
        assert_eq!(st.code(), Some(125), "{who:?}: the run without a stage");
        refused_before_the_command(&f, "after", &old);
    }
}

/// A registry cache damaged on disk (every fan-out directory's records
/// zeroed, the head intact: a torn write) is no evidence: a directory known
/// only from it, changed by a command run with `--stage` but without the
/// overlay (a misuse), gets the full connectivity check, which finds the
/// object the command deleted (before the fix: nothing was reported, exit
/// 0, and `git fsck` found the commit missing).
#[test]
fn a_damaged_cache_never_hides_an_object_deleted_outside_the_overlay() {
    for who in identities() {
        let f = Fixture::new(who);
        let old = loose_inner_commit(&f);
        let o = f.sh(&f.dir, "mkdir -m 700 reg");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let reg = f.dir.join("reg");
        let run = |stage: &str, cmd: &str| {
            let mut c = staged_without_overlay(&f, &stage_path(&f, stage), cmd);
            c.env("SBX_REGISTRY_DIR", &reg);
            common::within(60, c, "sbx-gitguard")
        };
        let out = run("first", "true");
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        // The cache: its head, then the records, which are zeroed.
        let caches: Vec<PathBuf> = std::fs::read_dir(&reg)
            .unwrap()
            .flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap())
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "bin"))
            .collect();
        assert_eq!(caches.len(), 1, "{who:?}: one cache expected: {caches:?}");
        let mut data = std::fs::read(&caches[0]).unwrap();
        let magic = b"sbx-gitguard loose cache 4\n".len();
        let head = u64::from_le_bytes(data[magic..magic + 8].try_into().unwrap()) as usize;
        assert!(head < data.len(), "{who:?}: the cache holds no records");
        data[head..].fill(0);
        std::fs::write(&caches[0], &data).unwrap();
        let gone = format!(".git/objects/{}/{}", &old[..2], &old[2..]);
        let out = run("misuse", &format!("rm -f {gone}"));
        assert_eq!(code(&out), 125, "{who:?}: {}", stderr(&out));
        assert_event(&f.audit, "git_integrity", "alert", |e| {
            e["check"] == "objects" && e["found"].as_str().unwrap_or("").contains(&old)
        });
    }
}

/// A local clone shares the object files (hard links): a run without a
/// stage over the clone writes them in place and drops only the clone's
/// cache. A fan-out directory holding a file with more than one link is
/// therefore never taken by its stat: the next staged run of the original
/// finds the damage before its command.
#[test]
fn objects_shared_with_a_local_clone_are_never_taken_by_their_directory() {
    for who in identities() {
        let f = Fixture::new(who);
        let old = loose_inner_commit(&f);
        let clone = f.dir.join("clone");
        let o = f.sh(
            &f.dir,
            &format!("git clone -q {} {}", f.w.display(), clone.display()),
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::thread::sleep(std::time::Duration::from_millis(2100));
        let out = staged(&f, &stage_path(&f, "first"), &[], "true");
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        let out = f.guard(&[
            "run",
            "--repo",
            clone.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &format!("cd {} && {}", clone.display(), poke(&old)),
        ]);
        assert_eq!(code(&out), 125, "{who:?}: {}", stderr(&out));
        refused_before_the_command(&f, "next", &old);
    }
}

fn w_of(f: &Fixture) -> &str {
    f.w.to_str().unwrap()
}

#[test]
fn a_garbage_head_is_refused() {
    for who in identities() {
        attack(who, "printf garbage > .git/HEAD", "ref_refused", |e| {
            e["ref"] == "HEAD"
        });
        // Removed: a whiteout in the upper layer.
        attack(who, "rm .git/HEAD", "ref_refused", |e| {
            e["ref"] == "HEAD" && e["reason"].as_str().unwrap().contains("unreadable")
        });
        attack(
            who,
            "rm .git/HEAD; ln -s ../../HEAD .git/HEAD",
            "ref_refused",
            |e| e["ref"] == "HEAD" && e["reason"].as_str().unwrap().contains("unreadable"),
        );
        // A FIFO: opened without blocking, refused, never waited on.
        attack(who, "rm .git/HEAD; mkfifo .git/HEAD", "ref_refused", |e| {
            e["ref"] == "HEAD" && e["reason"].as_str().unwrap().contains("unreadable")
        });
    }
}

#[test]
fn head_to_a_missing_branch_or_outside_refs_is_refused() {
    for who in identities() {
        attack(
            who,
            "printf 'ref: refs/heads/nowhere\\n' > .git/HEAD",
            "ref_refused",
            |e| e["ref"] == "HEAD" && e["reason"].as_str().unwrap().contains("does not exist"),
        );
        attack(
            who,
            "printf 'ref: refs/../../config\\n' > .git/HEAD",
            "ref_refused",
            |e| e["ref"] == "HEAD",
        );
    }
}

#[test]
fn invalid_names_and_other_namespaces_are_refused() {
    for who in identities() {
        attack(
            who,
            "git rev-parse HEAD > '.git/refs/heads/bad..name'",
            "ref_refused",
            |e| {
                e["ref"] == "refs/heads/bad..name"
                    && e["reason"].as_str().unwrap().contains("invalid")
            },
        );
        attack(who, "git replace HEAD HEAD~1", "ref_refused", |e| {
            e["ref"].as_str().unwrap().starts_with("refs/replace/")
        });
    }
}

#[test]
fn moving_an_existing_tag_is_refused() {
    for who in identities() {
        // v2 is annotated and packed, v1 lightweight and packed.
        attack(
            who,
            "git tag -f v1 HEAD >/dev/null 2>&1; git tag -f -a -m x v2 HEAD >/dev/null 2>&1",
            "ref_refused",
            |e| e["ref"] == "refs/tags/v2" && e["reason"] == "moving an existing tag",
        );
    }
}

#[test]
fn symlinks_in_the_stage_are_refused_never_followed() {
    for who in identities() {
        attack(
            who,
            "mkdir -p .git/objects/pack
             ln -s /etc/passwd .git/objects/pack/pack-0000000000000000000000000000000000000000.pack
             ln -s /etc/passwd .git/objects/pack/pack-0000000000000000000000000000000000000000.idx
             mkdir -p .git/objects/ee && ln -s /etc/passwd .git/objects/ee/eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee
             ln -s /etc/passwd .git/refs/heads/link",
            "stage_entry_refused",
            |e| e["path"].as_str().unwrap().starts_with("objects/"),
        );
    }
    // The ref symlink has its own alert.
    let f = Fixture::new(identities()[0]);
    let s = stage_path(&f, "link");
    let out = staged(&f, &s, &[], "ln -s ../../HEAD .git/refs/heads/link");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_event(&f.audit, "ref_refused", "alert", |e| {
        e["ref"] == "refs/heads/link" && e["reason"].as_str().unwrap().contains("symbolic link")
    });
    assert_eq!(rev(&f, "refs/heads/link"), "");
}

#[test]
fn objects_or_refs_replaced_by_a_symlink_are_never_followed() {
    for who in identities() {
        // Another repository the host user can read (the sandbox would not
        // see it): .git/objects and .git/refs in the upper layer become
        // symlinks to its own; nothing of it may come in.
        let f = Fixture::new(who);
        let other = f.sh(
            &f.dir,
            "git init -q other && cd other && echo s > secret && git add secret && git commit -qm secret && git rev-parse HEAD",
        );
        assert!(other.status.success());
        let secret = String::from_utf8_lossy(&other.stdout).trim().to_string();
        let s = stage_path(&f, "symroot");
        let before = f.state();
        let out = staged(
            &f,
            &s,
            &[],
            "rm -rf .git/objects .git/refs
             ln -s \"$D/other/.git/objects\" .git/objects
             ln -s \"$D/other/.git/refs\" .git/refs",
        );
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert_eq!(f.state(), before, "{who:?}: the repository changed");
        for what in ["objects", "refs"] {
            assert_event(&f.audit, "stage_entry_refused", "alert", |e| {
                e["path"] == what && e["reason"].as_str().unwrap().contains("symbolic link")
            });
        }
        let o = f.git(&f.w, &["cat-file", "-e", &secret]);
        assert!(
            !o.status.success(),
            "{who:?}: the other repository's commit came in"
        );
        fsck_strict(&f);
        assert!(!s.exists());
    }
}

#[test]
fn what_git_writes_elsewhere_in_the_git_dir_never_reaches_the_host() {
    for who in identities() {
        // config and hooks/ are read-only inside (as sbx-fs mounts them);
        // what the sandbox can write elsewhere in .git (a submodule's
        // config, info/, logs, config.worktree) stays in the stage.
        let f = Fixture::new(who);
        let s = stage_path(&f, "elsewhere");
        let main = rev(&f, "main");
        let config = std::fs::read(f.w.join(".git/config")).unwrap();
        let out = staged(
            &f,
            &s,
            &[],
            "! git config core.fsmonitor \"touch $MARK\" 2>/dev/null
             ! cp /bin/true .git/hooks/pre-commit 2>/dev/null
             git -C sub config core.fsmonitor \"touch $MARK\"
             git config -f .git/config.worktree core.fsmonitor \"touch $MARK\"
             echo '* filter=evil' > .git/info/attributes
             echo '0000 1111 x <x> 1 +0000 evil' >> .git/logs/HEAD
             echo x > x; git add x; git commit -qm agent",
        );
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert!(subjects(&f, "main").starts_with("agent\n"), "{who:?}");
        assert_eq!(rev(&f, "main~1"), main);
        assert_eq!(std::fs::read(f.w.join(".git/config")).unwrap(), config);
        assert!(!f.w.join(".git/config.worktree").exists());
        assert!(!f.w.join(".git/hooks/pre-commit").exists());
        assert!(!f.w.join(".git/info/attributes").exists());
        let sub = f.git(&f.w.join("sub"), &["config", "--get-all", "core.fsmonitor"]);
        assert!(
            !String::from_utf8_lossy(&sub.stdout).contains("touch"),
            "{who:?}: the submodule's config changed"
        );
        clean_status(&f);
        fsck_strict(&f);
        f.assert_nothing_runs();
        assert!(!s.exists());
    }
}

#[test]
fn the_sandboxs_index_is_taken_without_cached_trees_or_missing_objects() {
    for who in identities() {
        // Staged without a commit: the blob comes in with the index, the
        // tree `git write-tree` cached does not (no ref needs it). An entry
        // naming an object that exists nowhere is reset to HEAD's version.
        let f = Fixture::new(who);
        let s = stage_path(&f, "index");
        let out = staged(
            &f,
            &s,
            &[],
            &format!(
                "echo q > q; git add q; git write-tree >/dev/null
                 git update-index --info-only --cacheinfo 100644,{ZERO_REF},a"
            ),
        );
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert_event(&f.audit, "index_rebuilt", "warn", |e| {
            e["reset_to_head"] == 1 && e["dropped"] == 0
        });
        // q is staged on the host, a is as HEAD has it.
        assert_eq!(
            f.git_ok(&f.w, &["status", "--porcelain", "--untracked-files=no"]),
            "A  q\n",
            "{who:?}"
        );
        // A commit on the host writes its own trees: no broken link.
        f.git_ok(&f.w, &["commit", "-qm", "host"]);
        assert_eq!(f.git_ok(&f.w, &["show", "HEAD:q"]), "q\n");
        clean_status(&f);
        fsck_strict(&f);
        assert!(!s.exists());
    }
}

#[test]
fn a_stage_over_its_limits_imports_nothing() {
    for who in identities() {
        let f = Fixture::new(who);
        let s = stage_path(&f, "big");
        let main = rev(&f, "main");
        let out = staged(
            &f,
            &s,
            &["--stage-max-objects", "2"],
            "for i in 1 2 3; do echo $i > n$i; done; git add n1 n2 n3; git commit -qm many",
        );
        assert_eq!(code(&out), 125, "{who:?}: {}", stderr(&out));
        // Said once, in the failure line (the alert is in the audit log).
        let err = stderr(&out);
        let lines: Vec<&str> = err
            .lines()
            .filter(|l| l.contains("--stage-max-objects"))
            .collect();
        assert_eq!(lines.len(), 1, "{who:?}: {}", stderr(&out));
        assert!(lines[0].contains("not imported"), "{}", stderr(&out));
        assert_eq!(rev(&f, "main"), main);
        assert_event(&f.audit, "stage_limit_exceeded", "alert", |_| true);
        assert!(!s.exists());
        fsck_strict(&f);
        // A blob that compresses to almost nothing still counts by its
        // inflated size (a zlib bomb).
        let s = stage_path(&f, "bomb");
        let out = staged(
            &f,
            &s,
            &["--stage-max-bytes", "64K"],
            "head -c 1000000 /dev/zero > zeros; git add zeros; git commit -qm zeros",
        );
        assert_eq!(code(&out), 125, "{who:?}: {}", stderr(&out));
        assert_eq!(rev(&f, "main"), main);
        assert_event(&f.audit, "stage_limit_exceeded", "alert", |e| {
            e["reason"].as_str().unwrap().contains("inflated")
        });
        assert!(!s.exists());
        fsck_strict(&f);
    }
}

/// A sparse index costs the sandbox nothing (`truncate -s 40G .git/index`
/// in the stage), yet the import copied it whole, twice, into the stage and
/// the git dir and libgit2 read it whole into memory: the host's disk and
/// memory filled. An index over `--stage-max-bytes` is now never copied or
/// read: `stage_entry_refused`, the host keeps its own index, the commit
/// still comes in.
#[test]
fn an_index_over_the_stage_limit_is_never_copied_or_read() {
    // Over --stage-max-bytes; over the index's own cap (128 MiB) under the
    // default --stage-max-bytes (2 GiB).
    let cases: [(&[&str], u64); 2] = [(&["--stage-max-bytes", "1M"], 64), (&[], 129)];
    for (who, (flags, mib)) in identities()
        .into_iter()
        .flat_map(|w| cases.iter().map(move |c| (w, *c)))
    {
        let f = Fixture::new(who);
        let s = stage_path(&f, "sparse-index");
        let index_before = std::fs::read(f.w.join(".git/index")).unwrap();
        let out = staged(
            &f,
            &s,
            flags,
            &format!(
                "echo x > x; git add x; git commit -qm agent-one; truncate -s {mib}M .git/index"
            ),
        );
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert_eq!(subjects(&f, "main").lines().next(), Some("agent-one"));
        assert_eq!(
            std::fs::read(f.w.join(".git/index")).unwrap(),
            index_before,
            "{who:?}: the host's index changed"
        );
        assert_event(&f.audit, "stage_entry_refused", "alert", |e| {
            e["path"] == "index" && e["size"] == mib << 20
        });
        assert!(
            stderr(&out).contains("over the index limit"),
            "{}",
            stderr(&out)
        );
        assert!(!s.exists());
        fsck_strict(&f);
    }
}

#[test]
fn bad_input_is_refused_before_anything_runs() {
    for who in identities() {
        let f = Fixture::new(who);
        let w = f.w.to_str().unwrap();
        let touch = format!("touch {}", f.mark.display());
        let run = |stage: &str, repo: &str| {
            f.guard(&[
                "run", "--repo", repo, "--stage", stage, "--", "sh", "-c", &touch,
            ])
        };
        // Not named sbx-git-stage-*.
        let bad = f.dir.join("mystage");
        assert_usage_error(&run(bad.to_str().unwrap(), w), "sbx-git-stage-");
        assert!(!bad.exists());
        // Exists already.
        let s = stage_path(&f, "exists");
        std::fs::create_dir(&s).unwrap();
        sbx_testutil::chown_to_test_user(&s);
        assert_usage_error(&run(s.to_str().unwrap(), w), "already exists");
        std::fs::remove_dir(&s).unwrap();
        // Inside the work tree.
        let inside = f.w.join("sbx-git-stage-in");
        assert_usage_error(
            &run(inside.to_str().unwrap(), w),
            "inside the repository's work tree",
        );
        assert!(!inside.exists());
        // Parent missing.
        let p = f.dir.join("nope/sbx-git-stage-x");
        assert_usage_error(&run(p.to_str().unwrap(), w), "parent");
        // A linked worktree (a .git file), not a plain .git directory.
        let s = stage_path(&f, "wt");
        let wt = f.dir.join("wt");
        assert_usage_error(
            &run(s.to_str().unwrap(), wt.to_str().unwrap()),
            "plain .git directory",
        );
        assert!(!s.exists());
        // A size that does not parse.
        let o = f.guard(&[
            "run",
            "--repo",
            w,
            "--stage",
            s.to_str().unwrap(),
            "--stage-max-bytes",
            "lots",
            "--",
            "true",
        ]);
        assert_usage_error(&o, "--stage-max-bytes");
        assert!(!f.mark.exists(), "the command ran");
        // import: a stage of another repository.
        let other = stage_path(&f, "other");
        std::fs::create_dir(&other).unwrap();
        for d in ["git/upper", "git/work"] {
            std::fs::create_dir_all(other.join(d)).unwrap();
        }
        std::fs::write(other.join("gitdir"), "/elsewhere/.git\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o700)).unwrap();
        if who == As::User {
            let mut c = std::process::Command::new("chown");
            c.args(["-R", "sbxtest:", other.to_str().unwrap()]);
            assert!(common::within(common::LIMIT, c, "chown").status.success());
        }
        let o = f.guard(&["import", "--repo", w, "--stage", other.to_str().unwrap()]);
        assert_usage_error(&o, "not of");
        assert!(other.exists(), "a refused stage must not be deleted");
    }
}

/// Starts `run --stage S -- <sandbox running agent>`; returns once the agent
/// said it is up (through a fifo), the stage then exists.
fn start_killable(f: &Fixture, s: &Path, agent: &str) -> std::process::Child {
    let fifo = f
        .dir
        .join(format!("up-{}", s.file_name().unwrap().to_string_lossy()));
    let mut mk = std::process::Command::new("mkfifo");
    mk.arg(&fifo);
    assert!(common::within(common::LIMIT, mk, "mkfifo").status.success());
    sbx_testutil::chown_to_test_user(&fifo);
    let w = f.w.to_str().unwrap();
    let agent = format!("{agent}\necho up > {}; exec sleep 600", fifo.display());
    let mut c = sbx_testutil::tool("sbx-gitguard");
    c.args(["run", "--repo", w, "--stage"]).arg(s).arg("--");
    match f.who {
        As::Root => c.args(["unshare", "-m"]),
        As::User => c.args(["unshare", "-Urm", "env", "SBX_USERNS=1"]),
    };
    c.args(["sh", "-c", MOUNT, "sh"])
        .arg(s)
        .args([w, &agent])
        .current_dir(&f.w)
        .env("GIT_CONFIG_GLOBAL", f.dir.join("gitconfig"))
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    sbx_testutil::run_as(&mut c, f.who);
    std::os::unix::process::CommandExt::process_group(&mut c, 0);
    let mut child = c.spawn().unwrap();
    // Waits for the agent to say it is up, at most LIMIT seconds: a run
    // that never gets there fails the test (its process group killed)
    // instead of blocking it on the fifo.
    let (tx, rx) = std::sync::mpsc::channel();
    let rd = fifo.clone();
    std::thread::spawn(move || {
        let _ = tx.send(std::fs::read_to_string(&rd));
    });
    let up = match rx.recv_timeout(std::time::Duration::from_secs(common::LIMIT)) {
        Ok(r) => r.unwrap(),
        Err(_) => {
            // SAFETY: kill(2) of the process group this test created.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            // Releases the reader blocked in open(2) on the fifo.
            let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
            panic!(
                "the sandboxed agent did not come up within {}s",
                common::LIMIT
            );
        }
    };
    assert_eq!(up.trim(), "up");
    assert!(s.join("git/upper").is_dir());
    child
}

#[test]
fn a_killed_runs_stage_can_be_imported_by_hand_or_is_reaped_by_the_next_run() {
    for who in identities() {
        let f = Fixture::new(who);
        let w = f.w.to_str().unwrap();
        // 1. A run killed after its agent committed: `import` refuses the
        // stage while the run lives, takes the commit once it is dead.
        let sa = stage_path(&f, "killed-a");
        let mut a = start_killable(&f, &sa, "echo z > z; git add z; git commit -qm by-hand");
        let o = f.guard(&["import", "--repo", w, "--stage", sa.to_str().unwrap()]);
        assert_usage_error(&o, "in use");
        a.kill().unwrap();
        a.wait().unwrap();
        assert!(sa.exists(), "the killed run's stage should be left behind");
        let o = f.guard(&["import", "--repo", w, "--stage", sa.to_str().unwrap()]);
        assert_eq!(code(&o), 0, "{who:?}: {}", stderr(&o));
        assert!(subjects(&f, "main").starts_with("by-hand\n"), "{who:?}");
        clean_status(&f);
        assert!(!sa.exists());
        fsck_strict(&f);
        // 2. A run killed, then the next run beside it reaps its stage.
        let sb = stage_path(&f, "killed-b");
        let mut b = start_killable(&f, &sb, "true");
        b.kill().unwrap();
        b.wait().unwrap();
        assert!(sb.exists());
        let sc = stage_path(&f, "next");
        let out = common::within(common::LIMIT, staged_true(&f, &sc), "sbx-gitguard");
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(!sb.exists(), "{who:?}: the stale stage was not reaped");
        assert!(!sc.exists());
        assert_event(&f.audit, "git_stage_reaped", "warn", |e| {
            e["stage"] == sb.to_str().unwrap()
        });
        fsck_strict(&f);
    }
}

/// A work tree of many directories, with sbx-gitguard held to 128 file
/// descriptors (attacker helper-54): the walk kept one open per directory
/// still to be walked, so the git dirs, read beside it, could not be
/// opened and the snapshot recorded "Too many open files" as a branch's
/// value (the command's rewrite of it then stood), and the walk after the
/// command skipped the directories it could not open (repositories
/// planted in them stayed, with a config that runs a program).
#[test]
fn a_work_tree_of_many_directories_keeps_the_snapshot_and_the_check_whole() {
    use std::os::unix::process::CommandExt;
    for who in identities() {
        let f = Fixture::new(who);
        let made = f.sh(&f.w, "for i in $(seq 0 399); do mkdir d$i; done");
        assert!(made.status.success(), "{}", stderr(&made));
        let feat = rev(&f, "feat");
        // A rewrite (not a fast-forward: an orphan commit), which the
        // check puts back.
        let attack = r#"c=$(git commit-tree -m evil "$(git rev-parse 'HEAD^{tree}')")
git update-ref refs/heads/feat "$c"
for i in $(seq 0 299); do
  mkdir -p p$i/.git/objects p$i/.git/refs
  echo 'ref: refs/heads/main' > p$i/.git/HEAD
  printf '[core]\n\tfsmonitor = touch %s\n' "$MARK" > p$i/.git/config
done"#;
        let mut c = staged_without_overlay(&f, &stage_path(&f, "fds"), attack);
        // SAFETY: setrlimit on the child before it executes sbx-gitguard:
        // async-signal-safe, no allocation.
        unsafe {
            c.pre_exec(|| {
                let r = libc::rlimit {
                    rlim_cur: 128,
                    rlim_max: 128,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let out = common::within(common::LIMIT, c, "sbx-gitguard");
        let err = stderr(&out);
        assert_eq!(code(&out), 0, "{who:?}: {err}");
        assert!(!err.contains("Too many open files"), "{who:?}: {err}");
        let log = std::fs::read_to_string(&f.audit).unwrap();
        assert!(!log.contains("Too many open files"), "{who:?}: {log}");
        assert_eq!(rev(&f, "feat"), feat, "{who:?}: the rewrite of feat stood");
        let left: Vec<_> = (0..300)
            .filter(|i| f.w.join(format!("p{i}/.git")).exists())
            .collect();
        assert!(
            left.is_empty(),
            "{who:?}: planted repositories left: {left:?}"
        );
        assert_event(&f.audit, "git_integrity", "alert", |e| {
            e["check"] == "bare_repo" && e["path"].as_str().unwrap_or("").ends_with("/p299/.git")
        });
        f.git_ok(&f.w.join("d0"), &["status", "--short"]);
        assert!(!f.mark.exists(), "{who:?}: a planted config ran");
        f.assert_fsck_clean();
    }
}

/// When the command leaves no room for one more thread (sbx-gitguard
/// under a pids limit the command filled, attacker helper-54), the stage
/// is removed on the main thread and the repository is still checked and
/// repaired: the removal's thread was a panic (101) that skipped the
/// check. Root only: the limit is sbx-cgroup's pids controller, and the
/// unprivileged user's RLIMIT_NPROC is shared with every test running.
#[test]
fn no_thread_to_be_had_still_checks_the_repository() {
    if !sbx_testutil::is_root() {
        sbx_testutil::skip!("needs root (a pids cgroup)");
    }
    let f = Fixture::new(As::Root);
    let s = stage_path(&f, "nproc");
    // A child of its own session keeps the group full (it takes every
    // slot that frees, the command's own when it exits); the command ends
    // once no fork succeeds.
    let fill = f.dir.join("fill.py");
    const FILL: &str = r#"import os, time
if os.fork() == 0:
    os.setsid()
    while True:
        try:
            if os.fork() == 0:
                time.sleep(60)
                os._exit(0)
        except OSError:
            pass
while True:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
"#;
    std::fs::write(&fill, FILL).unwrap();
    let attack = format!(
        "git config core.fsmonitor \"touch $MARK\"; exec python3 {}",
        fill.display()
    );
    let mut c = sbx_testutil::tool("sbx-cgroup");
    c.args(["--pids", "12", "--"])
        .arg(sbx_testutil::bin("sbx-gitguard"))
        .args(["run", "--audit-log"])
        .arg(&f.audit)
        .args(["--repo", w_of(&f), "--stage", s.to_str().unwrap()])
        .args(["--", "sh", "-c", &attack])
        .current_dir(&f.w)
        .env("GIT_CONFIG_GLOBAL", f.dir.join("gitconfig"))
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("MARK", &f.mark);
    let out = common::within(common::LIMIT, c, "sbx-cgroup sbx-gitguard");
    let err = stderr(&out);
    assert_ne!(code(&out), 101, "{err}");
    let cfg = std::fs::read_to_string(f.w.join(".git/config")).unwrap();
    assert!(
        !cfg.contains("fsmonitor"),
        "the config stayed changed: {cfg}\n{err}"
    );
    assert_event(&f.audit, "git_integrity", "alert", |e| {
        e["check"] == "config"
    });
    assert!(!s.exists(), "the stage stayed: {err}");
    f.git_ok(&f.w, &["status", "--short"]);
    assert!(!f.mark.exists(), "the planted fsmonitor ran");
}

/// `modules` and `worktrees` in the git dir as plain files (nothing git
/// makes, but nothing that stops it either): the snapshot takes them for
/// no entries, as before, and is not refused for "not a directory".
#[test]
fn modules_and_worktrees_as_files_do_not_stop_a_run() {
    for who in identities() {
        let f = Fixture::new(who);
        let made = f.sh(&f.w, "git worktree remove --force ../wt && echo x > .git/worktrees && echo x > .git/modules.tmp && rm -rf .git/modules && mv .git/modules.tmp .git/modules");
        assert!(made.status.success(), "{who:?}: {}", stderr(&made));
        let out = common::within(
            common::LIMIT,
            staged_without_overlay(&f, &stage_path(&f, "files"), "true"),
            "sbx-gitguard",
        );
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert!(f.w.join(".git/modules").is_file(), "{who:?}");
    }
}

/// A run killed while it writes its stage's `gitdir` (the stage still
/// under its building name, `gitdir` empty): the next staged run of the
/// repository removes it through the registry. It was taken for another
/// repository's stage and stayed (the fault-injection test found it).
#[test]
fn a_run_killed_while_it_names_its_stages_git_dir_leaves_nothing() {
    for who in identities() {
        let f = Fixture::new(who);
        let s = stage_path(&f, "half");
        let mut c = staged_true(&f, &s);
        c.env("SBX_TEST_KILL_AT", "stage-gitdir");
        let out = common::within(common::LIMIT, c, "sbx-gitguard");
        assert_eq!(code(&out), 137, "{who:?}: {}", stderr(&out));
        let building = f.dir.join(".sbx-git-stage-new.sbx-git-stage-half");
        assert_eq!(
            std::fs::read(building.join("gitdir")).ok().as_deref(),
            Some(&b""[..]),
            "{who:?}: not killed where the test wants"
        );
        let next = stage_path(&f, "after");
        let out = common::within(common::LIMIT, staged_true(&f, &next), "sbx-gitguard");
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert!(!building.exists(), "{who:?}: the half-made stage stayed");
        assert!(!s.exists() && !next.exists(), "{who:?}");
    }
}
