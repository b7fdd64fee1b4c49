//! Property tests of the normaliser, the component-wise prefix logic, the
//! allowlist, and validate over a real tree with symlinks (both
//! resolutions).

use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use proptest::prelude::*;
use sbx_path::normalise::{components, is_beneath, normalise_bytes};
use sbx_path::{Allowlist, Mode, NormaliseError, PathResolver, Resolution};

const SEGMENTS: &[&str] = &[
    "", ".", "..", "a", "b", "ab", "a.", "..a", "...", "file", "link", "abs", "root", "dir", "new",
];

/// Paths built from segments that exercise every rule, absolute or not.
fn seg_path() -> impl Strategy<Value = Vec<u8>> {
    (
        any::<bool>(),
        prop::collection::vec(prop::sample::select(SEGMENTS), 0..8),
        any::<bool>(),
    )
        .prop_map(|(abs, segs, trailing)| {
            let mut s = if abs {
                String::from("/")
            } else {
                String::new()
            };
            s.push_str(&segs.join("/"));
            if trailing {
                s.push('/');
            }
            s.into_bytes()
        })
}

/// Any bytes, with '/' and '.' made common.
fn any_path() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop_oneof![
            4 => Just(b'/'),
            3 => Just(b'.'),
            3 => prop::sample::select(&b"abc"[..]),
            1 => any::<u8>(),
        ],
        0..40,
    )
}

fn path_strategy() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![seg_path(), any_path()]
}

fn comps(p: &[u8]) -> Vec<&[u8]> {
    components(p).collect()
}

fn has_dotdot(p: &[u8]) -> bool {
    p.split(|&b| b == b'/').any(|c| c == b"..")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn dotdot_is_always_refused(p in path_strategy(), base in prop::option::of(seg_path())) {
        if has_dotdot(&p) && !p.contains(&0) && !p.is_empty() {
            prop_assert_eq!(normalise_bytes(&p, base.as_deref()), Err(NormaliseError::Traversal));
        }
    }

    #[test]
    fn normalise_is_idempotent_and_canonical(p in path_strategy()) {
        if let Ok(n) = normalise_bytes(&p, None) {
            prop_assert_eq!(normalise_bytes(&n, None), Ok(n.clone()));
            prop_assert_eq!(n[0], b'/');
            prop_assert!(n == b"/" || !n.ends_with(b"/"));
            prop_assert!(!n.windows(2).any(|w| w == b"//"));
            for c in n.split(|&b| b == b'/').skip(1) {
                prop_assert!(c != b"." && c != b".." && (n == b"/" || !c.is_empty()));
            }
            // Nothing but `//`, `.` and a trailing slash was dropped.
            prop_assert_eq!(comps(&n), comps(&p));
        }
    }

    #[test]
    fn errors_are_the_documented_ones(p in path_strategy()) {
        let r = normalise_bytes(&p, None);
        let want = if p.is_empty() {
            Err(NormaliseError::Empty)
        } else if p.contains(&0) {
            Err(NormaliseError::Nul)
        } else if has_dotdot(&p) {
            Err(NormaliseError::Traversal)
        } else if p[0] != b'/' {
            Err(NormaliseError::Relative)
        } else {
            Ok(())
        };
        prop_assert_eq!(r.map(|_| ()), want);
    }

    #[test]
    fn relative_joins_the_base(p in seg_path(), base in seg_path()) {
        let mut b = base.clone();
        b.insert(0, b'/');
        if p.first() != Some(&b'/') && !p.is_empty() {
            let mut joined = b.clone();
            joined.push(b'/');
            joined.extend_from_slice(&p);
            prop_assert_eq!(normalise_bytes(&p, Some(&b)), normalise_bytes(&joined, None));
        }
    }

    /// is_beneath is exactly "the rule's components are a prefix of the
    /// path's components" (so /a/bc is not beneath /a/b).
    #[test]
    fn component_prefix(p in seg_path(), r in seg_path()) {
        let (Ok(p), Ok(r)) = (normalise_bytes(&p, Some(b"/")), normalise_bytes(&r, Some(b"/"))) else {
            return Ok(());
        };
        let (pc, rc) = (comps(&p), comps(&r));
        let reference = pc.len() >= rc.len() && pc[..rc.len()] == rc[..];
        prop_assert_eq!(is_beneath(&p, &r), reference, "{:?} {:?}", String::from_utf8_lossy(&p), String::from_utf8_lossy(&r));
        // The byte-prefix trap: a byte prefix is not enough.
        let mut longer = r.clone();
        longer.extend_from_slice(b"x");
        if r != b"/" {
            prop_assert!(!is_beneath(&longer, &r));
        }
    }

    /// Allowed => beneath the governing rule, which is the longest rule the
    /// path is beneath, and whose mode allows the request; refused =>
    /// no rule, or the governing rule is read-only for a write.
    #[test]
    fn allowlist_verdicts(
        p in seg_path(),
        rules in prop::collection::vec((seg_path(), any::<bool>()), 0..5),
        write in any::<bool>(),
    ) {
        let Ok(p) = normalise_bytes(&p, Some(b"/")) else { return Ok(()) };
        let mut list = Allowlist::new();
        for (r, w) in &rules {
            if let Ok(n) = normalise_bytes(r, Some(b"/")) {
                list.add(PathBuf::from(std::ffi::OsStr::from_bytes(&n)), if *w { Mode::Write } else { Mode::Read });
            }
        }
        let mode = if write { Mode::Write } else { Mode::Read };
        let path = Path::new(std::ffi::OsStr::from_bytes(&p));
        let covering: Vec<_> = list.rules().iter().filter(|r| is_beneath(&p, r.path.as_os_str().as_bytes())).collect();
        match list.check(path, mode) {
            Ok(i) => {
                let rule = &list.rules()[i];
                prop_assert!(is_beneath(&p, rule.path.as_os_str().as_bytes()));
                prop_assert!(rule.mode.allows(mode));
                prop_assert!(covering.iter().all(|r| r.path.as_os_str().len() <= rule.path.as_os_str().len()));
            }
            Err(_) => {
                let longest = covering.iter().max_by_key(|r| r.path.as_os_str().len());
                prop_assert!(longest.is_none_or(|r| !r.mode.allows(mode)));
            }
        }
    }
}

/// A fixed tree with symlinks in it, shared by the validate properties:
///   <t>/a/          read rule
///   <t>/a/b/file
///   <t>/a/link -> ../outside, <t>/a/abs -> <t>/outside, <t>/a/root -> /
///   <t>/a/dir/      write rule, with file and link -> ../b
///   <t>/outside/file
struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

static FIXTURE: OnceLock<Fixture> = OnceLock::new();

/// Statics are never dropped: the fixture's tree is removed at exit.
extern "C" fn remove_fixture() {
    if let Some(f) = FIXTURE.get() {
        let _ = fs::remove_dir_all(&f.root);
    }
}

fn fixture() -> &'static Fixture {
    FIXTURE.get_or_init(|| {
        // SAFETY: remove_fixture is an extern "C" fn without arguments, as atexit takes.
        unsafe { libc::atexit(remove_fixture) };
        let dir = tempfile::Builder::new()
            .prefix("sbx-path-p")
            .tempdir()
            .unwrap();
        let root = fs::canonicalize(dir.path()).unwrap();
        let p = |r: &str| root.join(r);
        fs::create_dir_all(p("a/b")).unwrap();
        fs::write(p("a/b/file"), "in").unwrap();
        fs::create_dir_all(p("a/dir")).unwrap();
        fs::write(p("a/dir/file"), "in").unwrap();
        fs::create_dir_all(p("outside")).unwrap();
        fs::write(p("outside/file"), "out").unwrap();
        symlink("../outside", p("a/link")).unwrap();
        symlink(p("outside"), p("a/abs")).unwrap();
        symlink("/", p("a/root")).unwrap();
        symlink("../b", p("a/dir/link")).unwrap();
        Fixture { _dir: dir, root }
    })
}

/// Where an fd really is, per the kernel.
fn fd_path(fd: i32) -> PathBuf {
    fs::read_link(format!("/proc/self/fd/{fd}")).unwrap()
}

const TREE_SEGMENTS: &[&str] = &[
    "", ".", "..", "a", "b", "file", "link", "abs", "root", "dir", "new", "outside",
];

fn tree_path() -> impl Strategy<Value = String> {
    (
        prop::sample::select(
            &[
                "a/", "a/", "a/", "a/dir/", "a/dir/", "", "outside/", "./a//",
            ][..],
        ),
        prop::collection::vec(prop::sample::select(TREE_SEGMENTS), 0..5),
        any::<bool>(),
    )
        .prop_map(|(prefix, segs, trailing)| {
            format!(
                "{prefix}{}{}",
                segs.join("/"),
                if trailing { "/" } else { "" }
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    /// validate over a real tree: whatever the path, an allowed result's fd
    /// (or, for a new name, its parent's fd) is really beneath the rule, per
    /// the kernel; the two resolutions agree.
    #[test]
    fn validate_stays_beneath_the_rule(rel in tree_path(), write in any::<bool>()) {
        let f = fixture();
        let mode = if write { Mode::Write } else { Mode::Read };
        let mut kinds = Vec::new();
        for how in [Resolution::Openat2, Resolution::Walk] {
            let r = PathResolver::builder()
                .resolution(how)
                .base(&f.root)
                .allow_read("a")
                .allow_write("a/dir")
                .build()
                .unwrap();
            match r.validate_with(&rel, mode, sbx_path::Access::Path) {
                Ok(v) => {
                    let rule = v.rule().path.clone();
                    prop_assert!(is_beneath(v.path().as_os_str().as_bytes(), rule.as_os_str().as_bytes()));
                    prop_assert!(v.rule().mode.allows(mode));
                    let real = match v.target() {
                        sbx_path::Target::Existing(fd) => fd_path(fd.as_raw_fd()),
                        sbx_path::Target::Missing { parent, name } => {
                            fd_path(parent.as_raw_fd()).join(std::ffi::OsStr::from_bytes(name))
                        }
                    };
                    prop_assert!(real.starts_with(&rule), "{} -> {} not beneath {}", rel, real.display(), rule.display());
                    prop_assert_eq!(real, v.path().to_path_buf());
                    kinds.push("ok");
                }
                Err(e) => {
                    if rel.split('/').any(|c| c == "..") {
                        prop_assert_eq!(e.kind(), "traversal");
                    }
                    kinds.push(e.kind());
                }
            }
        }
        prop_assert_eq!(kinds[0], kinds[1], "openat2 and walk disagree on {:?}", rel);
    }
}
