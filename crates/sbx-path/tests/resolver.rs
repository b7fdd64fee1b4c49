//! The resolver against a real temporary tree, with planted symlinks, over
//! both resolutions (openat2 and the openat(O_NOFOLLOW) walk fallback).

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use sbx_path::{Access, Mode, PathError, PathResolver, Resolution};

const BOTH: [Resolution; 2] = [Resolution::Openat2, Resolution::Walk];

/// A tree:
///   ok/                 (read rule)
///   ok/sub/file         "inside"
///   rw/                 (write rule)
///   rw/ro/              (read rule, narrower)
///   outside/secret      "SECRET"
struct Tree {
    dir: tempfile::TempDir,
}

impl Tree {
    fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("sbx-path-t")
            .tempdir()
            .unwrap();
        let t = Tree { dir };
        fs::create_dir_all(t.p("ok/sub")).unwrap();
        fs::write(t.p("ok/sub/file"), "inside").unwrap();
        fs::create_dir_all(t.p("rw/ro")).unwrap();
        fs::write(t.p("rw/ro/f"), "ro").unwrap();
        fs::create_dir_all(t.p("outside")).unwrap();
        fs::write(t.p("outside/secret"), "SECRET").unwrap();
        t
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn resolver(&self, how: Resolution) -> PathResolver {
        PathResolver::builder()
            .resolution(how)
            .allow_read(self.p("ok"))
            .allow_write(self.p("rw"))
            .allow_read(self.p("rw/ro"))
            .build()
            .unwrap()
    }
}

fn read_all(v: sbx_path::Validated) -> String {
    let mut s = String::new();
    v.into_file()
        .expect("exists")
        .read_to_string(&mut s)
        .unwrap();
    s
}

fn component(e: &PathError) -> PathBuf {
    match e {
        PathError::Symlink { component, .. } => component.clone(),
        other => panic!("want a symlink error, got {other:?} ({})", other.kind()),
    }
}

#[test]
fn allowed_read_returns_a_readable_fd() {
    let t = Tree::new();
    for how in BOTH {
        let r = t.resolver(how);
        assert_eq!(r.resolution(), how);
        let v = r.validate(t.p("ok//sub/./file"), Mode::Read).unwrap();
        assert_eq!(v.path(), t.p("ok/sub/file"));
        assert_eq!(v.rule().path, t.p("ok"));
        assert_eq!(read_all(v), "inside");
        // The rule's root itself, and a directory beneath it.
        assert!(r.validate(t.p("ok"), Mode::Read).unwrap().exists());
        assert!(r.validate(t.p("ok/sub/"), Mode::Read).unwrap().exists());
        // O_PATH access.
        assert!(
            r.validate_with(t.p("ok/sub/file"), Mode::Read, Access::Path)
                .unwrap()
                .exists()
        );
    }
}

#[test]
fn refusals_name_the_rule_and_the_path() {
    let t = Tree::new();
    for how in BOTH {
        let r = t.resolver(how);
        // Traversal, even when it would land inside.
        let e = r
            .validate(t.p("ok/sub/../sub/file"), Mode::Read)
            .unwrap_err();
        assert_eq!(e.kind(), "traversal");
        let e = r
            .validate(t.p("ok/../outside/secret"), Mode::Read)
            .unwrap_err();
        assert_eq!(e.kind(), "traversal");
        assert!(e.to_string().contains("'..'"), "{e}");
        // Outside every rule; the nearest rule is named.
        let e = r.validate(t.p("outside/secret"), Mode::Read).unwrap_err();
        assert_eq!(e.kind(), "not_allowed");
        assert!(e.to_string().contains("nearest rule"), "{e}");
        // Component-wise: okx is not beneath ok.
        fs::create_dir_all(t.p("okx")).unwrap();
        assert_eq!(
            r.validate(t.p("okx"), Mode::Read).unwrap_err().kind(),
            "not_allowed"
        );
        // Write under a read rule, and under the narrower read rule inside a write rule.
        let e = r.validate(t.p("ok/sub/file"), Mode::Write).unwrap_err();
        assert!(
            matches!(&e, PathError::ReadOnly { rule, .. } if rule.path == t.p("ok")),
            "{e:?}"
        );
        let e = r.validate(t.p("rw/ro/f"), Mode::Write).unwrap_err();
        assert!(
            matches!(&e, PathError::ReadOnly { rule, .. } if rule.path == t.p("rw/ro")),
            "{e:?}"
        );
        assert!(e.to_string().contains("allows reading only"), "{e}");
        assert!(e.is_policy_denial());
        // Relative without a base.
        assert_eq!(
            r.validate("ok/sub/file", Mode::Read).unwrap_err().kind(),
            "relative"
        );
        // Missing.
        let e = r.validate(t.p("ok/nope/x"), Mode::Read).unwrap_err();
        assert!(
            matches!(&e, PathError::NotFound { component, .. } if *component == t.p("ok/nope")),
            "{e:?}"
        );
        assert!(!e.is_policy_denial());
        let e = r.validate(t.p("ok/sub/file/x"), Mode::Read).unwrap_err();
        assert_eq!(e.kind(), "not_a_directory", "{e:?}");
    }
}

#[test]
fn base_directory_for_relative_paths() {
    let t = Tree::new();
    for how in BOTH {
        let r = PathResolver::builder()
            .resolution(how)
            .base(t.dir.path())
            .allow_read("ok")
            .build()
            .unwrap();
        assert_eq!(r.rules()[0].path, t.p("ok"));
        assert_eq!(
            read_all(r.validate("ok/sub/file", Mode::Read).unwrap()),
            "inside"
        );
        assert_eq!(
            r.validate("ok/../outside/secret", Mode::Read)
                .unwrap_err()
                .kind(),
            "traversal"
        );
    }
}

#[test]
fn symlink_in_a_middle_component_is_refused() {
    let t = Tree::new();
    // ok/link -> ../outside (relative) and ok/abs -> <tmp>/outside (absolute).
    symlink("../outside", t.p("ok/link")).unwrap();
    symlink(t.p("outside"), t.p("ok/abs")).unwrap();
    // A symlink that stays inside is refused too: no symlink is ever followed.
    symlink("sub", t.p("ok/inner")).unwrap();
    for how in BOTH {
        let r = t.resolver(how);
        for name in ["link", "abs", "inner"] {
            let target = if name == "inner" { "file" } else { "secret" };
            let e = r
                .validate(t.p(&format!("ok/{name}/{target}")), Mode::Read)
                .unwrap_err();
            assert_eq!(component(&e), t.p(&format!("ok/{name}")), "{how:?}");
            assert!(e.to_string().contains("is a symlink"), "{e}");
        }
    }
}

#[test]
fn symlink_as_final_component_is_refused_in_every_mode() {
    let t = Tree::new();
    symlink(t.p("outside/secret"), t.p("ok/secret")).unwrap();
    symlink(t.p("outside/secret"), t.p("rw/secret")).unwrap();
    // Dangling: a write through it would create a file outside.
    symlink(t.p("outside/new"), t.p("rw/dangling")).unwrap();
    for how in BOTH {
        let r = t.resolver(how);
        for access in [Access::Data, Access::Path] {
            let e = r
                .validate_with(t.p("ok/secret"), Mode::Read, access)
                .unwrap_err();
            assert_eq!(component(&e), t.p("ok/secret"));
            let e = r
                .validate_with(t.p("rw/secret"), Mode::Write, access)
                .unwrap_err();
            assert_eq!(component(&e), t.p("rw/secret"));
            let e = r
                .validate_with(t.p("rw/dangling"), Mode::Write, access)
                .unwrap_err();
            assert_eq!(component(&e), t.p("rw/dangling"), "{how:?} {access:?}");
        }
    }
    assert!(!t.p("outside/new").exists());
    assert_eq!(fs::read_to_string(t.p("outside/secret")).unwrap(), "SECRET");
}

#[test]
fn symlink_to_root_is_refused() {
    let t = Tree::new();
    symlink("/", t.p("ok/root")).unwrap();
    symlink("/", t.p("rw/root")).unwrap();
    for how in BOTH {
        let r = t.resolver(how);
        let e = r
            .validate(t.p("ok/root/etc/passwd"), Mode::Read)
            .unwrap_err();
        assert_eq!(component(&e), t.p("ok/root"));
        let e = r.validate(t.p("rw/root/tmp/x"), Mode::Write).unwrap_err();
        assert_eq!(component(&e), t.p("rw/root"));
        let e = r.validate(t.p("ok/root"), Mode::Read).unwrap_err();
        assert_eq!(component(&e), t.p("ok/root"));
    }
}

#[test]
fn rules_with_symlinks_are_refused_at_build() {
    let t = Tree::new();
    symlink(t.p("outside"), t.p("ruleln")).unwrap();
    for how in BOTH {
        let e = PathResolver::builder()
            .resolution(how)
            .allow_read(t.p("ruleln/x"))
            .build()
            .unwrap_err();
        assert_eq!(e.kind(), "bad_rule");
        assert!(e.to_string().contains("is a symlink"), "{e}");
        let e = PathResolver::builder()
            .resolution(how)
            .allow_read(t.p("ruleln"))
            .build()
            .unwrap_err();
        assert_eq!(e.kind(), "bad_rule", "{e}");
        let e = PathResolver::builder()
            .resolution(how)
            .allow_read(t.p("nope/x"))
            .build()
            .unwrap_err();
        assert_eq!(e.kind(), "bad_rule", "{e}");
        let e = PathResolver::builder()
            .allow_read(t.p("a/../b"))
            .build()
            .unwrap_err();
        assert!(e.to_string().contains("'..'"), "{e}");
    }
}

#[test]
fn swapped_between_calls() {
    let t = Tree::new();
    for how in BOTH {
        let r = t.resolver(how);
        // First call: a real directory; the fd stays valid after the swap
        // and still reads the original file.
        let v = r.validate(t.p("ok/sub/file"), Mode::Read).unwrap();
        fs::rename(t.p("ok/sub"), t.p("ok/sub.orig")).unwrap();
        symlink(t.p("outside"), t.p("ok/sub")).unwrap();
        fs::write(t.p("outside/file"), "OUTSIDE").unwrap();
        assert_eq!(read_all(v), "inside");
        // Second call: the same path now goes through a symlink: refused.
        let e = r.validate(t.p("ok/sub/file"), Mode::Read).unwrap_err();
        assert_eq!(component(&e), t.p("ok/sub"));
        // Swap back.
        fs::remove_file(t.p("ok/sub")).unwrap();
        fs::rename(t.p("ok/sub.orig"), t.p("ok/sub")).unwrap();
        fs::remove_file(t.p("outside/file")).unwrap();
        assert_eq!(
            read_all(r.validate(t.p("ok/sub/file"), Mode::Read).unwrap()),
            "inside"
        );
    }
}

#[test]
fn create_after_validate_refuses_a_planted_symlink() {
    let t = Tree::new();
    for how in BOTH {
        let r = t.resolver(how);
        let name = format!("rw/new-{how:?}");
        let v = r.validate(t.p(&name), Mode::Write).unwrap();
        assert!(!v.exists());
        // Between validate and create, plant a symlink at the name.
        symlink(t.p("outside/secret"), t.p(&name)).unwrap();
        let e = v.create(0o600).unwrap_err();
        assert_eq!(e.kind(), "symlink", "{e:?}");
        fs::remove_file(t.p(&name)).unwrap();
        // Without interference create works, once.
        let mut f = v.create(0o600).unwrap();
        f.write_all(b"hello").unwrap();
        assert_eq!(fs::read_to_string(t.p(&name)).unwrap(), "hello");
        assert_eq!(v.create(0o600).unwrap_err().kind(), "exists");
        // Now it exists: validate hands back an O_WRONLY fd.
        let v = r.validate(t.p(&name), Mode::Write).unwrap();
        assert!(v.exists());
        let mut f = v.into_file().unwrap();
        f.write_all(b"HELLO").unwrap();
        let mut s = String::new();
        assert!(f.read_to_string(&mut s).is_err(), "O_WRONLY");
        // mkdir of a new directory.
        let d = format!("rw/dir-{how:?}");
        let v = r.validate(t.p(&d), Mode::Write).unwrap();
        v.mkdir(0o700).unwrap();
        assert!(t.p(&d).is_dir());
    }
    assert_eq!(fs::read_to_string(t.p("outside/secret")).unwrap(), "SECRET");
}

#[test]
fn write_of_a_new_name_needs_its_parent_beneath_the_rule() {
    let t = Tree::new();
    symlink(t.p("outside"), t.p("rw/out")).unwrap();
    for how in BOTH {
        let r = t.resolver(how);
        let e = r.validate(t.p("rw/out/new"), Mode::Write).unwrap_err();
        assert_eq!(component(&e), t.p("rw/out"));
        let e = r.validate(t.p("rw/nope/new"), Mode::Write).unwrap_err();
        assert_eq!(e.kind(), "not_found");
        // A read of a missing file is not_found, not a parent to create in.
        assert_eq!(
            r.validate(t.p("ok/new"), Mode::Read).unwrap_err().kind(),
            "not_found"
        );
    }
    assert!(!t.p("outside/new").exists());
}

#[test]
fn rule_roots_are_pinned_at_build() {
    let t = Tree::new();
    for how in BOTH {
        let r = t.resolver(how);
        // Replace the rule's directory by a symlink to outside after build:
        // resolution stays beneath the directory that was pinned.
        fs::rename(t.p("ok"), t.p("ok.moved")).unwrap();
        symlink(t.p("outside"), t.p("ok")).unwrap();
        fs::write(t.p("outside/file"), "OUTSIDE").unwrap();
        assert_eq!(
            read_all(r.validate(t.p("ok/sub/file"), Mode::Read).unwrap()),
            "inside"
        );
        let e = r.validate(t.p("ok/secret"), Mode::Read).unwrap_err();
        assert_eq!(e.kind(), "not_found", "{e:?}");
        fs::remove_file(t.p("ok")).unwrap();
        fs::remove_file(t.p("outside/file")).unwrap();
        fs::rename(t.p("ok.moved"), t.p("ok")).unwrap();
    }
}

#[test]
fn file_and_future_rules_are_pinned_through_their_parent() {
    let t = Tree::new();
    for how in BOTH {
        let r = PathResolver::builder()
            .resolution(how)
            .allow_read(t.p("outside/secret"))
            .allow_write(t.p("outside/later"))
            .build()
            .unwrap();
        assert_eq!(
            read_all(r.validate(t.p("outside/secret"), Mode::Read).unwrap()),
            "SECRET"
        );
        // The sibling is not allowed.
        fs::write(t.p("outside/other"), "x").unwrap();
        assert_eq!(
            r.validate(t.p("outside/other"), Mode::Read)
                .unwrap_err()
                .kind(),
            "not_allowed"
        );
        let v = r.validate(t.p("outside/later"), Mode::Write).unwrap();
        assert!(!v.exists());
        v.mkdir(0o700).unwrap();
        let v = r.validate(t.p("outside/later/f"), Mode::Write).unwrap();
        v.create(0o600).unwrap();
        assert!(t.p("outside/later/f").is_file());
        fs::remove_dir_all(t.p("outside/later")).unwrap();
    }
}

/// A thread flips `ok/flip` between a real directory and a symlink to
/// outside while validate runs: every success must read the inside file,
/// never the secret. Bounded iterations; no timing assumptions.
#[test]
fn concurrent_swap_never_leaks_the_outside() {
    let t = Tree::new();
    fs::create_dir(t.p("ok/flip.dir")).unwrap();
    fs::write(t.p("ok/flip.dir/secret"), "inside").unwrap();
    symlink(t.p("outside"), t.p("ok/flip.link")).unwrap();
    fs::rename(t.p("ok/flip.dir"), t.p("ok/flip")).unwrap();
    for how in BOTH {
        let r = t.resolver(how);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flipper = {
            let stop = stop.clone();
            let (flip, dir, link) = (t.p("ok/flip"), t.p("ok/flip.dir"), t.p("ok/flip.link"));
            std::thread::spawn(move || {
                let mut n = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && n < 200_000 {
                    // flip is the dir: move it away, put the link in place.
                    fs::rename(&flip, &dir).unwrap();
                    fs::rename(&link, &flip).unwrap();
                    fs::rename(&flip, &link).unwrap();
                    fs::rename(&dir, &flip).unwrap();
                    n += 1;
                }
            })
        };
        let (mut ok, mut refused) = (0, 0);
        for _ in 0..3000 {
            match r.validate(t.p("ok/flip/secret"), Mode::Read) {
                Ok(v) => {
                    assert_eq!(read_all(v), "inside");
                    ok += 1;
                }
                Err(e) => {
                    assert!(matches!(e.kind(), "symlink" | "not_found"), "{e:?}");
                    refused += 1;
                }
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        flipper.join().unwrap();
        eprintln!("{how:?}: {ok} allowed, {refused} refused");
    }
}

/// Documented limitation: a hard link inside an allowed tree to a file
/// outside it is the same file; path rules cannot tell.
#[test]
fn hard_link_to_outside_is_not_detectable() {
    let t = Tree::new();
    fs::hard_link(t.p("outside/secret"), t.p("ok/hardlink")).unwrap();
    let r = t.resolver(Resolution::Auto);
    assert_eq!(
        read_all(r.validate(t.p("ok/hardlink"), Mode::Read).unwrap()),
        "SECRET"
    );
}

/// Linux >= 5.6 has openat2: Auto must pick it there (unless a seccomp
/// filter hides it, which the test machine does not have).
#[test]
fn auto_picks_openat2_on_a_kernel_that_has_it() {
    let r = PathResolver::new([("/", Mode::Read)]).unwrap();
    let rel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut it = rel
        .trim()
        .split(['.', '-'])
        .map(|x| x.parse::<u32>().unwrap_or(0));
    let (maj, min) = (it.next().unwrap(), it.next().unwrap());
    if (maj, min) >= (5, 6) {
        assert_eq!(r.resolution(), Resolution::Openat2, "kernel {rel}");
    }
    assert!(
        r.validate("/etc/hostname", Mode::Read).is_ok() || !Path::new("/etc/hostname").exists()
    );
}

/// /proc's magic links (/proc/PID/root, /proc/self, /proc/PID/fd/N) lead
/// anywhere: they are symlinks to the resolver and refused, even under a
/// rule that allows all of /proc.
#[test]
fn proc_magic_links_are_refused() {
    let t = Tree::new();
    let f = fs::File::open(t.p("outside/secret")).unwrap();
    let pid = std::process::id();
    for how in BOTH {
        let r = PathResolver::builder()
            .resolution(how)
            .allow_read("/proc")
            .build()
            .unwrap();
        for p in [
            format!("/proc/{pid}/root/etc/passwd"),
            format!("/proc/{pid}/cwd"),
            format!("/proc/{pid}/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&f)),
            "/proc/self/status".to_string(),
        ] {
            let e = r.validate(&p, Mode::Read).unwrap_err();
            assert_eq!(e.kind(), "symlink", "{how:?} {p}: {e}");
        }
        assert!(
            r.validate(format!("/proc/{pid}/status"), Mode::Read)
                .is_ok()
        );
    }
}

/// A FIFO is opened without blocking (and the fd is then blocking again).
#[test]
fn fifo_read_does_not_block() {
    let t = Tree::new();
    let fifo = t.p("ok/fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: c is NUL-ended and alive for the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    for how in BOTH {
        let v = t.resolver(how).validate(&fifo, Mode::Read).unwrap();
        // SAFETY: F_GETFL on the validated open fd only reads its flags.
        let fl = unsafe {
            libc::fcntl(
                std::os::fd::AsRawFd::as_raw_fd(&v.fd().unwrap()),
                libc::F_GETFL,
            )
        };
        assert_eq!(fl & libc::O_NONBLOCK, 0);
    }
}

#[test]
fn resolver_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<PathResolver>();
    check::<sbx_path::Validated>();
    check::<PathError>();
}
