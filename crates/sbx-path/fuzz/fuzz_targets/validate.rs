//! validate over a real tree with symlinks in it: whatever the path, an
//! allowed result's fd is really beneath the governing rule (per
//! /proc/self/fd), no `..` path is ever allowed, and openat2 and the walk
//! fallback agree. O_PATH access only: nothing is created.
#![no_main]

use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sbx_path::normalise::{has_dotdot, is_beneath};
use sbx_path::{Access, Mode, PathResolver, Resolution, Target};

struct Fixture {
    resolvers: [PathResolver; 2],
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("sbx-path-fuzz-{}", std::process::id()));
        ROOT.set(root.clone()).unwrap();
        // SAFETY: registering a plain function.
        unsafe { libc::atexit(cleanup) };
        let p = |r: &str| root.join(r);
        fs::create_dir_all(p("a/b")).unwrap();
        fs::write(p("a/b/f"), "in").unwrap();
        fs::create_dir_all(p("a/w")).unwrap();
        fs::write(p("a/w/f"), "in").unwrap();
        fs::create_dir_all(p("o")).unwrap();
        fs::write(p("o/f"), "out").unwrap();
        let _ = symlink("../o", p("a/l"));
        let _ = symlink(p("o"), p("a/s"));
        let _ = symlink("/", p("a/r"));
        let _ = symlink("../b", p("a/w/l"));
        let _ = symlink("f", p("a/b/g"));
        let mk = |how| {
            PathResolver::builder()
                .resolution(how)
                .base(&root)
                .allow_read("a")
                .allow_write("a/w")
                .build()
                .unwrap()
        };
        Fixture { resolvers: [mk(Resolution::Openat2), mk(Resolution::Walk)] }
    })
}

static ROOT: OnceLock<PathBuf> = OnceLock::new();

/// Removes the tree when the fuzzer exits (normally or at -max_total_time).
extern "C" fn cleanup() {
    if let Some(r) = ROOT.get() {
        let _ = fs::remove_dir_all(r);
    }
}

fn fd_path(fd: i32) -> PathBuf {
    fs::read_link(format!("/proc/self/fd/{fd}")).unwrap()
}

fuzz_target!(|data: &[u8]| {
    let Some((&m, rest)) = data.split_first() else { return };
    let mode = if m & 1 == 0 { Mode::Read } else { Mode::Write };
    let path = Path::new(std::ffi::OsStr::from_bytes(rest));
    let f = fixture();
    let mut kinds = [""; 2];
    for (i, r) in f.resolvers.iter().enumerate() {
        match r.validate_with(path, mode, Access::Path) {
            Ok(v) => {
                assert!(!has_dotdot(rest), "allowed a '..' path {path:?}");
                let rule = v.rule().path.clone();
                assert!(v.rule().mode.allows(mode));
                assert!(is_beneath(v.path().as_os_str().as_bytes(), rule.as_os_str().as_bytes()));
                let real = match v.target() {
                    Target::Existing(fd) => fd_path(fd.as_raw_fd()),
                    Target::Missing { parent, name } => {
                        fd_path(parent.as_raw_fd()).join(std::ffi::OsStr::from_bytes(name))
                    }
                };
                assert!(real.starts_with(&rule), "{path:?} -> {real:?} not beneath {rule:?}");
                assert_eq!(real, v.path());
                kinds[i] = "ok";
            }
            Err(e) => {
                if has_dotdot(rest) && !rest.contains(&0) {
                    assert_eq!(e.kind(), "traversal");
                }
                kinds[i] = e.kind();
            }
        }
    }
    assert_eq!(kinds[0], kinds[1], "openat2 and walk disagree on {path:?}");
});
