//! Issue 14's attacks on `.git` (crates/sbx-gitguard/tests/{hang,corruption,
//! fsck_import}.rs try them against `sbx-gitguard run` alone) made inside
//! the two composed low-trust chains, `scripts/sbx-run` and `sbx-policy
//! chain`, as root and as the unprivileged test user. Inside, `.git` is an
//! overlay whose upper layer is sbx-gitguard's stage (sbx-fs
//! `--git-stage`), with `.git/config` and `.git/hooks` read-only on top;
//! after the command sbx-gitguard imports what it verifies. Each test
//! asserts the exit code, the host repository (`git fsck --full --strict`
//! clean, refs as expected) and the alert in the audit log. Every command
//! is bounded in time (`sbx_testutil::output_within`: a hung chain fails
//! the test) and everything lives in a temporary directory removed at the
//! end.

mod common;
use common::gitproj::git_out;
use common::*;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use sbx_testutil::{
    As, assert_event, audit_events, identities, output_within, run_as, stderr, stdout,
};

/// The bound on one chain run (and on each git command of a test).
const T: Duration = Duration::from_secs(120);

/// Programs the attacks run (sbx-policy's Landlock execute allowlist).
const SETTINGS: &str = r#"{"permissions": {"allow": ["Edit(./**)", "Bash(sh:*)", "Bash(git:*)", "Bash(python3:*)", "Bash(rm)", "Bash(mkfifo)", "Bash(mkdir)", "Bash(printf)", "Bash(echo)", "Bash(head)", "Bash(chmod)", "Bash(mv)", "Bash(cat)", "Bash(true)"]}}"#;

#[derive(Clone, Copy, Debug)]
enum Chain {
    SbxRun,
    Policy,
}

const CHAINS: [Chain; 2] = [Chain::SbxRun, Chain::Policy];

struct Proj {
    _d: tempfile::TempDir,
    who: As,
    base: PathBuf,
    root: PathBuf,
    home: PathBuf,
    log: PathBuf,
    mark: PathBuf,
}

fn git_ok(dir: &Path, args: &[&str]) -> String {
    let o = git_out(dir, args);
    assert!(o.status.success(), "git {args:?}: {}", stderr(&o));
    stdout(&o)
}

/// A repository: `one` (packed, with branch feat and tag v1, refs packed),
/// then `two` (loose objects, loose ref main).
fn project(who: As) -> Proj {
    let d = sbx_testutil::shared_tempdir();
    let base = d.path().canonicalize().unwrap();
    let root = base.join("proj");
    let home = base.join("home");
    write(&home.join(".gitconfig"), "[user]\n\tname = agent\n");
    write(&root.join("a"), "a\n");
    write(&root.join(".gitignore"), ".claude/\n");
    let g = |args: &[&str]| {
        git_ok(&root, args);
    };
    g(&["init", "-q", "-b", "main"]);
    g(&["add", "-A"]);
    g(&["commit", "-qm", "one"]);
    g(&["branch", "feat"]);
    g(&["tag", "v1"]);
    g(&["gc", "-q"]);
    g(&["pack-refs", "--all"]);
    write(&root.join("b"), "b\n");
    g(&["add", "b"]);
    g(&["commit", "-qm", "two"]);
    write(&root.join(".claude/settings.json"), SETTINGS);
    if who == As::User {
        chown_r(&base);
    }
    assert!(root.join(".git/packed-refs").is_file());
    assert!(root.join(".git/refs/heads/main").is_file());
    Proj {
        _d: d,
        who,
        log: base.join("audit.jsonl"),
        mark: base.join("MARK"),
        base,
        root,
        home,
    }
}

impl Proj {
    /// The chain around `sh -c SCRIPT` in the project, bounded in time.
    fn run(&self, chain: Chain, script: &str) -> Output {
        let mut c = match chain {
            Chain::SbxRun => {
                let mut c = Command::new("sh");
                c.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/sbx-run"))
                    .arg("-C")
                    .arg(&self.root)
                    .arg("-l")
                    .arg(&self.log)
                    .args(["--", "sh", "-c", script]);
                c.env("SBX_BIN", sbx_testutil::bin("sbx-fs").parent().unwrap())
                    .env_remove("SBX_ID")
                    .env_remove("SBX_AUDIT_LOG");
                c
            }
            Chain::Policy => {
                let mut c = sbx_testutil::tool("sbx-policy");
                c.arg("--audit-log").arg(&self.log);
                c.args(["chain", "--managed", "/nonexistent/managed.json", "--home"])
                    .arg(&self.home);
                c.args(["--", "sh", "-c", script]);
                c
            }
        };
        c.current_dir(&self.root)
            .env("PATH", PATH)
            .env("HOME", &self.home)
            .env("XDG_STATE_HOME", self.base.join("state"));
        run_as(&mut c, self.who);
        output_within(&mut c, T)
    }

    fn git(&self, args: &[&str]) -> String {
        git_ok(&self.root, args)
    }

    /// Every ref with its value, and HEAD.
    fn refs(&self) -> BTreeMap<String, String> {
        let mut m: BTreeMap<String, String> = self
            .git(&["for-each-ref", "--format=%(refname) %(objectname)"])
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        let head = std::fs::read_to_string(self.root.join(".git/HEAD")).unwrap();
        m.insert("HEAD".into(), head.trim().to_string());
        m
    }

    /// `git fsck --full --strict` accepts the host repository.
    fn assert_fsck_strict(&self, ctx: &str) {
        let o = git_out(&self.root, &["fsck", "--full", "--strict", "--no-dangling"]);
        let err = stderr(&o);
        assert!(
            o.status.success() && !err.contains("error") && !err.contains("missing"),
            "git fsck --full --strict: {err}\n{ctx}"
        );
    }

    /// Every event of the log carries one sandbox id.
    fn assert_one_sandbox(&self, ctx: &str) {
        let ids: std::collections::BTreeSet<_> = audit_events(&self.log)
            .iter()
            .map(|e| e["sbx_id"].to_string())
            .collect();
        assert_eq!(ids.len(), 1, "one sandbox id: {ids:?}\n{ctx}");
    }

    /// The owner's everyday git commands in the project, as the owner; the
    /// marker `self.mark` is what a planted program would create.
    fn owner_git(&self) {
        let mut c = Command::new("sh");
        c.args([
            "-c",
            "git status >/dev/null 2>&1; git rebase --continue >/dev/null 2>&1; \
             git commit -q --allow-empty -m owner >/dev/null 2>&1; git diff >/dev/null 2>&1; true",
        ])
        .current_dir(&self.root)
        .env("HOME", &self.home)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_EDITOR", "true")
        .env("GIT_AUTHOR_EMAIL", "o@example.invalid")
        .env("GIT_COMMITTER_EMAIL", "o@example.invalid")
        .env_remove("GIT_DIR");
        run_as(&mut c, self.who);
        assert!(output_within(&mut c, T).status.success());
    }

    /// The file of a loose object of the host.
    fn loose(&self, id: &str) -> PathBuf {
        let p = self.root.join(".git/objects").join(&id[..2]).join(&id[2..]);
        assert!(p.is_file(), "{id} is not loose: {}", p.display());
        p
    }
}

fn ctx(p: &Proj, chain: Chain, out: &Output) -> String {
    format!(
        "{:?} {chain:?}\nstdout:\n{}\nstderr:\n{}",
        p.who,
        stdout(out),
        stderr(out)
    )
}

fn field(e: &serde_json::Value, k: &str) -> String {
    e[k].as_str().unwrap_or("").to_string()
}

#[test]
fn fifos_as_packed_refs_a_loose_ref_head_and_config_never_hang_the_chain() {
    for who in identities() {
        for chain in CHAINS {
            let p = project(who);
            let before = p.refs();
            let config = std::fs::read(p.root.join(".git/config")).unwrap();
            let packed = std::fs::read(p.root.join(".git/packed-refs")).unwrap();
            let out = p.run(
                chain,
                "rm .git/packed-refs && mkfifo .git/packed-refs && echo P=ok
                 rm .git/refs/heads/main && mkfifo .git/refs/heads/main && echo R=ok
                 mkfifo .git/refs/heads/fifo2 && echo R2=ok
                 rm .git/HEAD && mkfifo .git/HEAD && echo H=ok
                 rm -f .git/config 2>/dev/null; mkfifo .git/config 2>/dev/null; echo C=$?
                 printf x > .git/config 2>/dev/null; echo W=$?
                 exit 0",
            );
            let c = ctx(&p, chain, &out);
            let so = stdout(&out);
            assert_eq!(out.status.code(), Some(0), "{c}");
            // The FIFOs were made inside (the test proves something).
            for m in ["P=ok", "R=ok", "R2=ok", "H=ok"] {
                assert!(so.contains(m), "{m}: {c}");
            }
            // `.git/config` is read-only inside: no FIFO, no write.
            assert!(!so.contains("C=0") && !so.contains("W=0"), "{c}");
            // The host: as it was, every file a regular one.
            assert_eq!(p.refs(), before, "{c}");
            assert_eq!(std::fs::read(p.root.join(".git/config")).unwrap(), config);
            assert_eq!(
                std::fs::read(p.root.join(".git/packed-refs")).unwrap(),
                packed
            );
            assert!(p.root.join(".git/refs/heads/main").is_file(), "{c}");
            assert!(!p.root.join(".git/refs/heads/fifo2").exists(), "{c}");
            p.assert_fsck_strict(&c);
            assert_event(&p.log, "stage_entry_refused", "alert", |e| {
                e["path"] == "packed-refs" && field(e, "reason").contains("not a regular file")
            });
            for r in ["refs/heads/main", "refs/heads/fifo2"] {
                assert_event(&p.log, "ref_refused", "alert", |e| {
                    e["ref"] == r && field(e, "reason").contains("not a regular file")
                });
            }
            assert_event(&p.log, "ref_refused", "alert", |e| e["ref"] == "HEAD");
            let cfg = p.root.join(".git/config");
            assert_event(&p.log, "fs_write_denied", "alert", |e| {
                e["path"] == cfg.to_str().unwrap()
            });
            p.assert_one_sandbox(&c);
        }
    }
}

/// Flips one byte of a file in the middle (as python3, inside).
const FLIP: &str = "python3 -c 'import sys; p=sys.argv[1]; b=bytearray(open(p,\"rb\").read()); b[len(b)//2]^=0x40; open(p,\"wb\").write(bytes(b))'";

#[test]
fn loose_objects_truncated_or_bit_flipped_inside_never_reach_the_host() {
    for who in identities() {
        for chain in CHAINS {
            let p = project(who);
            let before = p.refs();
            let tip = p.git(&["rev-parse", "main"]).trim().to_string();
            let blob = p.git(&["rev-parse", "main:b"]).trim().to_string();
            let (tip_file, blob_file) = (p.loose(&tip), p.loose(&blob));
            let (tip_bytes, blob_bytes) = (
                std::fs::read(&tip_file).unwrap(),
                std::fs::read(&blob_file).unwrap(),
            );
            let t = format!(".git/objects/{}/{}", &tip[..2], &tip[2..]);
            let b = format!(".git/objects/{}/{}", &blob[..2], &blob[2..]);
            let script = format!(
                "set -e; head -c 20 {t} > .git/t; chmod 444 .git/t; mv -f .git/t {t}
                 chmod u+w {b}; {FLIP} {b}; echo DAMAGED; exit 0"
            );
            let out = p.run(chain, &script);
            let c = ctx(&p, chain, &out);
            assert_eq!(out.status.code(), Some(0), "{c}");
            assert!(stdout(&out).contains("DAMAGED"), "{c}");
            // The host's objects are the originals.
            assert_eq!(std::fs::read(&tip_file).unwrap(), tip_bytes, "{c}");
            assert_eq!(std::fs::read(&blob_file).unwrap(), blob_bytes, "{c}");
            assert!(!p.root.join(".git/t").exists(), "{c}");
            assert_eq!(p.refs(), before, "{c}");
            p.assert_fsck_strict(&c);
            for id in [&tip, &blob] {
                assert_event(&p.log, "object_refused", "alert", |e| {
                    e["object"] == id.as_str()
                });
            }
            p.assert_one_sandbox(&c);
        }
    }
}

#[test]
fn a_legitimate_commit_survives_a_damaged_tip_inside() {
    for who in identities() {
        for chain in CHAINS {
            let p = project(who);
            let before = p.refs();
            let old = p.git(&["rev-parse", "main"]).trim().to_string();
            let t = format!(".git/objects/{}/{}", &old[..2], &old[2..]);
            // The agent's work first (it needs the tip readable), then the
            // tip's object damaged in place.
            let script = format!(
                "set -e; echo n > n; git add n
                 git -c user.email=a@example.invalid -c user.name=agent commit -qm agent
                 echo NEW=$(git rev-parse HEAD)
                 head -c 20 {t} > .git/t; chmod 444 .git/t; mv -f .git/t {t}; exit 0"
            );
            let out = p.run(chain, &script);
            let c = ctx(&p, chain, &out);
            assert_eq!(out.status.code(), Some(0), "{c}");
            let new = stdout(&out)
                .lines()
                .find_map(|l| l.strip_prefix("NEW="))
                .unwrap_or_else(|| panic!("no commit made: {c}"))
                .to_string();
            assert_ne!(new, old);
            // main is the agent's commit, never put back onto the old tip,
            // and the old tip is intact.
            assert_eq!(p.git(&["rev-parse", "main"]).trim(), new, "{c}");
            assert_eq!(p.git(&["rev-parse", "main~1"]).trim(), old, "{c}");
            let mut want = before.clone();
            want.insert("refs/heads/main".into(), new.clone());
            assert_eq!(p.refs(), want, "{c}");
            assert_eq!(
                p.git(&["log", "--format=%s", "-3", "main"]),
                "agent\ntwo\none\n"
            );
            p.assert_fsck_strict(&c);
            assert_event(&p.log, "object_refused", "alert", |e| {
                e["object"] == old.as_str()
            });
            assert_event(&p.log, "ref_imported", "info", |e| {
                e["ref"] == "refs/heads/main" && e["new"] == new.as_str()
            });
            p.assert_one_sandbox(&c);
        }
    }
}

#[test]
fn a_planted_hook_fsmonitor_and_rebase_exec_never_run_on_the_host() {
    for who in identities() {
        for chain in CHAINS {
            let p = project(who);
            let before = p.refs();
            let config = std::fs::read(p.root.join(".git/config")).unwrap();
            let m = p.mark.display();
            let script = format!(
                "printf '#!/bin/sh\\ntouch {m}-hook\\n' > .git/hooks/pre-commit 2>/dev/null; echo HOOK=$?
                 git config core.fsmonitor 'touch {m}-fsmonitor' 2>/dev/null; echo FSM=$?
                 printf '[core]\\n\\tfsmonitor = touch {m}-fsm2\\n' >> .git/config 2>/dev/null; echo CFG=$?
                 set -e
                 mkdir .git/rebase-merge
                 printf 'exec touch {m}-rebase\\n' > .git/rebase-merge/git-rebase-todo
                 git rev-parse HEAD > .git/rebase-merge/onto
                 git rev-parse HEAD > .git/rebase-merge/orig-head
                 echo refs/heads/main > .git/rebase-merge/head-name
                 : > .git/rebase-merge/interactive
                 echo PLANTED; exit 0"
            );
            let out = p.run(chain, &script);
            let c = ctx(&p, chain, &out);
            let so = stdout(&out);
            assert_eq!(out.status.code(), Some(0), "{c}");
            assert!(so.contains("PLANTED"), "{c}");
            for k in ["HOOK=0", "FSM=0", "CFG=0"] {
                assert!(!so.contains(k), "{k}: {c}");
            }
            assert!(!p.root.join(".git/hooks/pre-commit").exists(), "{c}");
            assert!(!p.root.join(".git/rebase-merge").exists(), "{c}");
            assert_eq!(std::fs::read(p.root.join(".git/config")).unwrap(), config);
            assert_eq!(p.refs(), before, "{c}");
            p.assert_fsck_strict(&c);
            // The owner's git runs none of it.
            p.owner_git();
            let ran: Vec<_> = ["hook", "fsmonitor", "fsm2", "rebase"]
                .iter()
                .filter(|t| Path::new(&format!("{m}-{t}")).exists())
                .collect();
            assert!(ran.is_empty(), "planted programs ran: {ran:?}\n{c}");
            let hook = p.root.join(".git/hooks/pre-commit");
            assert_event(&p.log, "fs_write_denied", "alert", |e| {
                e["path"] == hook.to_str().unwrap()
            });
            let cfg = p.root.join(".git/config");
            assert_event(&p.log, "fs_write_denied", "alert", |e| {
                e["path"] == cfg.to_str().unwrap()
            });
            assert_event(&p.log, "stage_entry_dropped", "alert", |e| {
                e["path"] == "rebase-merge"
            });
            p.assert_one_sandbox(&c);
        }
    }
}

#[test]
fn new_refs_to_a_tree_or_a_missing_object_are_refused_not_a_failed_turn() {
    for who in identities() {
        for chain in CHAINS {
            let p = project(who);
            let missing = "0123456789abcdef0123456789abcdef01234567";
            let script = format!(
                "set -e; git rev-parse 'HEAD^{{tree}}' > .git/refs/heads/on-tree
                 echo {missing} > .git/refs/heads/missing
                 echo {missing} > .git/refs/tags/missing-tag
                 git -c user.email=a@example.invalid -c user.name=agent commit -q --allow-empty -m legit
                 echo NEW=$(git rev-parse HEAD); exit 0"
            );
            let out = p.run(chain, &script);
            let c = ctx(&p, chain, &out);
            assert_eq!(out.status.code(), Some(0), "{c}");
            let new = stdout(&out)
                .lines()
                .find_map(|l| l.strip_prefix("NEW="))
                .unwrap_or_else(|| panic!("no commit made: {c}"))
                .to_string();
            let refs = p.refs();
            for r in [
                "refs/heads/on-tree",
                "refs/heads/missing",
                "refs/tags/missing-tag",
            ] {
                assert!(!refs.contains_key(r), "{r} came in: {refs:?}\n{c}");
            }
            // The legitimate work of the same turn came in.
            assert_eq!(refs["refs/heads/main"], new, "{c}");
            p.assert_fsck_strict(&c);
            assert_event(&p.log, "ref_refused", "alert", |e| {
                e["ref"] == "refs/heads/on-tree" && field(e, "reason").contains("is a tree")
            });
            for r in ["refs/heads/missing", "refs/tags/missing-tag"] {
                assert_event(&p.log, "ref_refused", "alert", |e| {
                    e["ref"] == r && field(e, "reason").contains("does not exist")
                });
            }
            p.assert_one_sandbox(&c);
        }
    }
}

/// Writes loose objects git's fsck --strict rejects into .git/objects
/// (through the overlay: into the stage) and a branch naming each, then a
/// well-formed commit on refs/heads/good. Prints `BAD=<id>` per object.
const CRAFT: &str = r#"python3 - "$(git rev-parse HEAD)" <<'EOF'
import hashlib, os, sys, zlib
main = sys.argv[1]
def obj(kind, body):
    data = ("%s %d\0" % (kind, len(body))).encode() + body
    h = hashlib.sha1(data).hexdigest()
    d = os.path.join(".git/objects", h[:2])
    os.makedirs(d, exist_ok=True)
    p = os.path.join(d, h[2:])
    if not os.path.exists(p):
        with open(p, "wb") as f:
            f.write(zlib.compress(data))
    return h
def tree(entries):
    out = b""
    for mode, name, h in entries:
        out += mode.encode() + b" " + name.encode() + b"\0" + bytes.fromhex(h)
    return obj("tree", out)
ID = "A U Thor <a@example.invalid> 1700000000 +0000"
def commit(t):
    return obj("commit", ("tree %s\nparent %s\nauthor %s\ncommitter %s\n\nmsg\n" % (t, main, ID, ID)).encode())
def ref(name, h):
    with open(os.path.join(".git", name), "w") as f:
        f.write(h + "\n")
blob = obj("blob", b"x\n")
gm = obj("blob", b'[submodule "../../modules/evil"]\n\tpath = x\n\turl = ./x\n')
for name, t in {
    "dotgit": tree([("100644", ".git", blob)]),
    "zero-padded": tree([("0100644", "a", blob)]),
    "gitmodules-name": tree([("100644", ".gitmodules", gm), ("160000", "x", main)]),
}.items():
    print("BAD=" + t)
    ref("refs/heads/evil-" + name, commit(t))
ref("refs/heads/good", commit(tree([("100644", "good", blob)])))
print("GM=" + gm)
print("CRAFTED")
EOF
"#;

#[test]
fn objects_git_fsck_strict_rejects_are_refused_at_the_import() {
    for who in identities() {
        for chain in CHAINS {
            let p = project(who);
            let before = p.refs();
            let out = p.run(chain, CRAFT);
            let c = ctx(&p, chain, &out);
            assert_eq!(out.status.code(), Some(0), "{c}");
            let so = stdout(&out);
            assert!(so.contains("CRAFTED"), "{c}");
            let bad: Vec<&str> = so.lines().filter_map(|l| l.strip_prefix("BAD=")).collect();
            assert_eq!(bad.len(), 3, "{c}");
            let refs = p.refs();
            for (name, id) in [
                ("evil-dotgit", "hasDotgit"),
                ("evil-zero-padded", "zeroPaddedFilemode"),
                ("evil-gitmodules-name", "gitmodulesName"),
            ] {
                let r = format!("refs/heads/{name}");
                assert!(!refs.contains_key(&r), "{r} came in\n{c}");
                assert_event(&p.log, "ref_refused", "alert", |e| e["ref"] == r.as_str());
                assert_event(&p.log, "object_refused", "alert", |e| {
                    field(e, "reason").starts_with(&format!("git fsck --strict: {id}"))
                });
            }
            // Nothing refused is in the host's store.
            for id in &bad {
                let o = git_out(&p.root, &["cat-file", "-e", id]);
                assert!(!o.status.success(), "{id} reached the host's store\n{c}");
            }
            // Nor the .gitmodules blob of the refused tree: nothing names
            // it any more, and git would check it only through a tree.
            let gm = so.lines().find_map(|l| l.strip_prefix("GM=")).unwrap();
            let o = git_out(&p.root, &["cat-file", "-e", gm]);
            assert!(!o.status.success(), "the .gitmodules blob came in\n{c}");
            // The well-formed commit beside them came in.
            assert!(refs.contains_key("refs/heads/good"), "{c}");
            p.assert_fsck_strict(&c);
            let mut want = before.clone();
            want.insert("refs/heads/good".into(), refs["refs/heads/good"].clone());
            assert_eq!(refs, want, "{c}");
            p.assert_one_sandbox(&c);
        }
    }
}

/// Control for the test above: the same rebase state, put in place on the
/// host, does run its `exec` line on the owner's `git rebase --continue`.
#[test]
fn control_a_planted_rebase_exec_runs_when_it_reaches_the_host() {
    let p = project(*identities().last().unwrap());
    let m = p.mark.display();
    let rm = p.root.join(".git/rebase-merge");
    std::fs::create_dir(&rm).unwrap();
    let head = p.git(&["rev-parse", "HEAD"]);
    write(
        &rm.join("git-rebase-todo"),
        &format!("exec touch {m}-rebase\n"),
    );
    write(&rm.join("onto"), &head);
    write(&rm.join("orig-head"), &head);
    write(&rm.join("head-name"), "refs/heads/main\n");
    write(&rm.join("interactive"), "");
    if p.who == As::User {
        chown_r(&rm);
    }
    p.owner_git();
    assert!(
        Path::new(&format!("{m}-rebase")).exists(),
        "the planted exec did not run: the test above proves nothing"
    );
}
