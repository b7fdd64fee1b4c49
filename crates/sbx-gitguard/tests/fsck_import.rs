//! The stage imports only what `git fsck --strict` / transfer.fsckObjects
//! would accept (issue 14): objects crafted the way git's own tests craft
//! them (t7450-bad-git-dotfiles, t1450-fsck, t3800-mktag) land in a stage's
//! upper layer as loose objects with a branch or tag naming each; the
//! import refuses every one with an `object_refused` alert naming git's
//! message id, nothing of it reaches the host's store, and a well-formed
//! commit written beside them comes in. Bounded in time.

mod common;

use common::Fixture;
use std::process::Output;

use sbx_testutil::{assert_event, code, identities, stderr};

/// Writes loose objects (zlib, SHA-1) into $S/git/upper/objects and a ref
/// per case into $S/git/upper/refs; prints nothing.
const CRAFT: &str = r#"
import hashlib, os, sys, zlib
up = sys.argv[1] + "/git/upper"
main = sys.argv[2]
part = sys.argv[3]
def obj(kind, body):
    data = ("%s %d\0" % (kind, len(body))).encode() + body
    h = hashlib.sha1(data).hexdigest()
    d = os.path.join(up, "objects", h[:2])
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, h[2:]), "wb") as f:
        f.write(zlib.compress(data))
    return h
def tree(entries):
    out = b""
    for mode, name, h in entries:
        out += mode.encode() + b" " + name.encode() + b"\0" + bytes.fromhex(h)
    return obj("tree", out)
ID = "A U Thor <a@example.invalid> 1700000000 +0000"
def commit(t, author=ID, committer=ID, extra=""):
    body = "tree %s\nparent %s\n%sauthor %s\ncommitter %s\n\nmsg\n" % (t, main, extra, author, committer)
    return obj("commit", body.encode())
def ref(name, h):
    p = os.path.join(up, name)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "w") as f:
        f.write(h + "\n")
blob = obj("blob", b"x\n")
link = obj("blob", b"../../outside")
def gm(text):
    return obj("blob", text.encode())
cases = {} if part != "trees" else {
    "dotgit": tree([("100644", ".git", blob)]),
    "dotgit-upper": tree([("40000", ".GIT", tree([("100644", "config", blob)]))]),
    "dotgit-ntfs-short": tree([("100644", "git~1", blob)]),
    "dotgit-ntfs-dot": tree([("100644", ".git.", blob)]),
    "dotgit-hfs": tree([("100644", ".g\u200cit", blob)]),
    "dotdot": tree([("100644", "..", blob)]),
    "gitmodules-name": tree([("100644", ".gitmodules", gm('[submodule "../../modules/evil"]\n\tpath = x\n\turl = ./x\n')), ("160000", "x", main)]),
    "gitmodules-url": tree([("100644", ".gitmodules", gm('[submodule "a"]\n\tpath = a\n\turl = --upload-pack=touch$IFS$MARK\n'))]),
    "gitmodules-update": tree([("100644", ".gitmodules", gm('[submodule "a"]\n\tpath = a\n\tupdate = !touch $MARK\n'))]),
    "gitmodules-symlink": tree([("120000", ".gitmodules", link)]),
    "zero-padded": tree([("0100644", "a", blob)]),
    "bad-mode": tree([("100664", "a", blob)]),
    "unsorted": tree([("100644", "b", blob), ("100644", "a", blob)]),
    "duplicate": tree([("100644", "a", blob), ("100644", "a", blob)]),
}
good_tree = tree([("100644", "good", blob)])
if part == "trees":
    for name, t in cases.items():
        ref("refs/heads/evil-" + name, commit(t))
    sys.exit(0)
ref("refs/heads/evil-no-email", commit(good_tree, author="A U Thor 1700000000 +0000"))
ref("refs/heads/evil-zero-date", commit(good_tree, author="A <a@x> 01700000000 +0000"))
ref("refs/heads/evil-bad-tz", commit(good_tree, committer="C <c@x> 1700000000 0000"))
ref("refs/heads/evil-no-author", obj("commit", ("tree %s\nparent %s\ncommitter %s\n\nm\n" % (good_tree, main, ID)).encode()))
ref("refs/heads/evil-bad-tree-id", obj("commit", ("tree %s\nparent %s\nauthor %s\ncommitter %s\n\nm\n" % (good_tree[:39], main, ID, ID)).encode()))
ref("refs/tags/evil-tag-type", obj("tag", ("object %s\ntype bogus\ntag t\ntagger %s\n\nm\n" % (main, ID)).encode()))
ref("refs/tags/evil-tag-tagger", obj("tag", ("object %s\ntype commit\ntag t\ntagger T <t@x>\n\nm\n" % main).encode()))
ref("refs/heads/good", commit(good_tree))
# A truncated loose object (libgit2 issue 7342 loops forever reading one).
t = obj("commit", ("tree %s\nparent %s\nauthor %s\ncommitter %s\n\ntruncated\n" % (good_tree, main, ID, ID)).encode())
tp = os.path.join(up, "objects", t[:2], t[2:])
with open(tp, "rb") as f:
    z = f.read()
with open(tp, "wb") as f:
    f.write(z[: len(z) // 2])
ref("refs/heads/evil-truncated", t)
"#;

const REFUSED: &[(&str, &str)] = &[
    ("refs/heads/evil-dotgit", "hasDotgit"),
    ("refs/heads/evil-dotgit-upper", "hasDotgit"),
    ("refs/heads/evil-dotgit-ntfs-short", "hasDotgit"),
    ("refs/heads/evil-dotgit-ntfs-dot", "hasDotgit"),
    ("refs/heads/evil-dotgit-hfs", "hasDotgit"),
    ("refs/heads/evil-dotdot", "hasDotdot"),
    ("refs/heads/evil-gitmodules-name", "gitmodulesName"),
    ("refs/heads/evil-gitmodules-url", "gitmodulesUrl"),
    ("refs/heads/evil-gitmodules-update", "gitmodulesUpdate"),
    ("refs/heads/evil-gitmodules-symlink", "gitmodulesSymlink"),
    ("refs/heads/evil-zero-padded", "zeroPaddedFilemode"),
    ("refs/heads/evil-bad-mode", "badFilemode"),
    ("refs/heads/evil-unsorted", "treeNotSorted"),
    ("refs/heads/evil-duplicate", "duplicateEntries"),
    ("refs/heads/evil-no-email", "missingEmail"),
    ("refs/heads/evil-zero-date", "zeroPaddedDate"),
    ("refs/heads/evil-bad-tz", "badTimezone"),
    ("refs/heads/evil-no-author", "missingAuthor"),
    ("refs/heads/evil-bad-tree-id", "badTreeSha1"),
    ("refs/tags/evil-tag-type", "badType"),
    ("refs/tags/evil-tag-tagger", "missingSpaceBeforeDate"),
];

#[test]
fn objects_git_fsck_strict_rejects_never_reach_the_host() {
    for who in identities() {
        let f = Fixture::new(who);
        let before = f.state();
        let main = f.git_ok(&f.w, &["rev-parse", "main"]).trim().to_string();
        std::fs::write(f.dir.join("craft.py"), CRAFT).unwrap();
        // Two runs (trees; commits and tags) keep each under the 20 alerts
        // of a kind that are logged one by one.
        for part in ["trees", "others"] {
            let stage = f.dir.join(format!("sbx-git-stage-{part}"));
            let script = format!(
                "python3 {} {} {main} {part}",
                f.dir.join("craft.py").display(),
                stage.display()
            );
            // The stage's upper layer is written directly (what git in the
            // sandbox writes through the overlay lands there).
            let out = f.run_within(120, &["--stage", stage.to_str().unwrap()], &script);
            assert_eq!(code(&out), 0, "{}", stderr(&out));
            assert!(!stage.exists(), "the stage was not removed");
        }
        let refs = f.git_ok(&f.w, &["for-each-ref", "--format=%(refname)"]);
        assert!(!refs.contains("evil-truncated"), "{refs}");
        assert_event(&f.audit, "object_refused", "alert", |e| {
            e["reason"].as_str().unwrap_or("").contains("truncated")
        });
        for (r, id) in REFUSED {
            assert!(!refs.contains(r), "{r} came in:\n{refs}");
            assert_event(&f.audit, "object_refused", "alert", |e| {
                e["reason"]
                    .as_str()
                    .unwrap_or("")
                    .starts_with(&format!("git fsck --strict: {id}"))
            });
            assert_event(&f.audit, "ref_refused", "alert", |e| e["ref"] == *r);
        }
        // The well-formed commit beside them came in, and nothing refused
        // reached the store: git fsck --strict accepts every object.
        assert!(refs.contains("refs/heads/good"), "{refs}");
        let o = f.git(&f.w, &["fsck", "--full", "--strict", "--no-dangling"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success() && !err.contains("error"), "{err}");
        let o = f.git(&f.w, &["count-objects", "-v"]);
        assert!(o.status.success());
        f.git_ok(&f.w, &["branch", "-D", "good"]);
        assert_eq!(f.state(), before);
        assert!(!f.mark.exists());
    }
}

/// A `.gitmodules` blob no tree names (issue 14): git checks a blob as a
/// `.gitmodules` only through a tree that names it so, so the import never
/// brings in a blob nothing names (it would be unchecked), checks the index
/// entries the sandbox stages as the tree entries they become on the
/// host's next commit, and checks a tree naming a blob the host's store
/// already had against that blob.
#[test]
fn a_gitmodules_blob_no_tree_names_never_comes_in_unchecked() {
    for who in identities() {
        let f = Fixture::new(who);
        let evil = f.dir.join("evil.gitmodules");
        std::fs::write(
            &evil,
            "[submodule \"../../modules/evil\"]\n\tpath = x\n\turl = ./x\n",
        )
        .unwrap();
        sbx_testutil::chown_to_test_user(&evil);
        let head_gm = f.git_ok(&f.w, &["rev-parse", "HEAD:.gitmodules"]);
        let in_store = |id: &str| f.git(&f.w, &["cat-file", "-e", id]).status.success();
        // Writes into the stage's upper layer what git inside would: the
        // blob (hash-object into the stage's objects) and, with $INDEX, the
        // sandbox's index naming it at $INDEX.
        let turn = |name: &str, write: bool, extra: &str| -> (Output, String) {
            let stage = f.dir.join(format!("sbx-git-stage-{name}"));
            let script = format!(
                "set -e; U={s}/git/upper; mkdir -p $U/objects
                 B=$(GIT_OBJECT_DIRECTORY=$U/objects git hash-object {w} {e}); echo B=$B
                 {extra}",
                s = stage.display(),
                e = evil.display(),
                w = if write { "-w" } else { "" },
            );
            let out = f.run_within(120, &["--stage", stage.to_str().unwrap()], &script);
            assert_eq!(code(&out), 0, "{name}: {}", stderr(&out));
            let b = String::from_utf8_lossy(&out.stdout)
                .lines()
                .find_map(|l| l.strip_prefix("B="))
                .unwrap_or_else(|| panic!("{name}: no blob: {}", stderr(&out)))
                .to_string();
            (out, b)
        };
        // 1. Dangling: not imported.
        let (_, b) = turn("dangling", true, "");
        assert!(!in_store(&b), "a blob nothing names came in");
        assert_event(&f.audit, "objects_imported", "info", |e| {
            e["not_needed"].as_u64().unwrap_or(0) >= 1
        });
        // 2. Staged as .gitmodules (and below a directory): refused, never
        // in the store; the host's index keeps HEAD's .gitmodules and gets
        // no entry for the other path.
        let stage_idx = |paths: &[&str]| {
            let mut s = "cp .git/index $U/index".to_string();
            for p in paths {
                s.push_str(&format!(
                    " && GIT_INDEX_FILE=$U/index GIT_OBJECT_DIRECTORY=$U/objects GIT_ALTERNATE_OBJECT_DIRECTORIES=$PWD/.git/objects git update-index --add --cacheinfo 100644,$B,{p}"
                ));
            }
            s
        };
        turn(
            "index",
            true,
            &stage_idx(&[".gitmodules", "lib2/.gitmodules"]),
        );
        assert!(!in_store(&b), "the refused .gitmodules blob came in");
        let ls = f.git_ok(&f.w, &["ls-files", "-s"]);
        assert!(ls.contains(head_gm.trim()), "{ls}");
        assert!(!ls.contains("lib2/"), "{ls}");
        for p in [".gitmodules", "lib2/.gitmodules"] {
            assert_event(&f.audit, "object_refused", "alert", |e| {
                e["path"] == format!("index: {p}")
                    && e["reason"]
                        .as_str()
                        .unwrap_or("")
                        .starts_with("git fsck --strict: gitmodulesName")
            });
        }
        // 3. The blob already in the host's store (how it got there does
        // not matter): an index entry naming it as .gitmodules is refused
        // all the same, and so is a tree naming it.
        let b2 = f.git_ok(&f.w, &["hash-object", "-w", evil.to_str().unwrap()]);
        assert_eq!(b2.trim(), b);
        let tree = "&& T=$(printf '100644 blob %s\\t.gitmodules\\n' $B | GIT_OBJECT_DIRECTORY=$U/objects GIT_ALTERNATE_OBJECT_DIRECTORIES=$PWD/.git/objects git mktree) \
             && C=$(GIT_OBJECT_DIRECTORY=$U/objects GIT_ALTERNATE_OBJECT_DIRECTORIES=$PWD/.git/objects git commit-tree -m evil -p HEAD $T) \
             && mkdir -p $U/refs/heads && echo $C > $U/refs/heads/evil-gm";
        // Not in the stage this time: the checks read it from the store.
        turn(
            "present",
            false,
            &format!("{} {tree}", stage_idx(&["lib3/.gitmodules"])),
        );
        let ls = f.git_ok(&f.w, &["ls-files", "-s"]);
        assert!(!ls.contains("lib3/"), "{ls}");
        assert_event(&f.audit, "object_refused", "alert", |e| {
            e["path"] == "index: lib3/.gitmodules"
        });
        let refs = f.git_ok(&f.w, &["for-each-ref", "--format=%(refname)"]);
        assert!(!refs.contains("evil-gm"), "{refs}");
        assert_event(&f.audit, "ref_refused", "alert", |e| {
            e["ref"] == "refs/heads/evil-gm"
        });
        assert_event(&f.audit, "object_refused", "alert", |e| {
            e["reason"]
                .as_str()
                .unwrap_or("")
                .starts_with("git fsck --strict: gitmodulesName")
                && e["path"] == "loose objects"
        });
        // What the host has is what git fsck --strict accepts (the blob
        // the owner wrote is dangling: git checks it through no tree).
        let o = f.git(&f.w, &["fsck", "--full", "--strict", "--no-dangling"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success() && !err.contains("error"), "{err}");
        assert!(!f.mark.exists());
    }
}
