//! The apply against crafted upper layers: what an overlay makes, and what
//! a hostile one could hold (the sandbox never writes the upper directly,
//! but the apply must not trust it).

use super::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};

struct T {
    _d: tempfile::TempDir,
    upper: PathBuf,
    host: PathBuf,
    outside: PathBuf,
}

fn setup() -> T {
    let d = tempfile::tempdir().unwrap();
    let base = d.path().canonicalize().unwrap();
    let (upper, host, outside) = (base.join("upper"), base.join("host"), base.join("outside"));
    for p in [&upper, &host, &outside] {
        std::fs::create_dir(p).unwrap();
    }
    T {
        _d: d,
        upper,
        host,
        outside,
    }
}

fn layer(t: &T, skip: &[&str], pins: &[&str]) -> Layer {
    let m = std::fs::metadata(&t.host).unwrap();
    Layer {
        k: 0,
        host: t.host.clone(),
        dev: m.dev(),
        ino: m.ino(),
        rules: Rules {
            skip: skip.iter().map(PathBuf::from).collect(),
            pins: pins.iter().map(PathBuf::from).collect(),
        },
    }
}

fn run(t: &T, l: &Layer, j: Option<&Journal>) -> Report {
    let u = std::fs::File::open(&t.upper).unwrap();
    apply(u.as_raw_fd(), l, j).unwrap()
}

fn whiteout(p: &Path) {
    let c = cstr(p).unwrap();
    // SAFETY: a valid C string; char 0/0 is a whiteout (no CAP_MKNOD needed).
    let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR, 0) };
    assert_eq!(
        r,
        0,
        "mknod whiteout {}: {}",
        p.display(),
        io::Error::last_os_error()
    );
}

fn set_opaque(p: &Path) {
    let c = cstr(p).unwrap();
    // SAFETY: valid C strings and a 1-byte value.
    let r = unsafe {
        libc::setxattr(
            c.as_ptr(),
            c"user.overlay.opaque".as_ptr(),
            b"y".as_ptr().cast(),
            1,
            0,
        )
    };
    assert_eq!(r, 0, "setxattr: {}", io::Error::last_os_error());
}

#[test]
fn legitimate_changes_land_exactly() {
    let t = setup();
    let (h, u) = (&t.host, &t.upper);
    // Host before: a, gone, d/{x,y}, r/old, keep.
    std::fs::write(h.join("a"), "old").unwrap();
    std::fs::write(h.join("gone"), "bye").unwrap();
    std::fs::create_dir_all(h.join("d")).unwrap();
    std::fs::write(h.join("d/x"), "x").unwrap();
    std::fs::write(h.join("d/y"), "y").unwrap();
    std::fs::create_dir_all(h.join("r")).unwrap();
    std::fs::write(h.join("r/old"), "1").unwrap();
    std::fs::write(h.join("keep"), "same").unwrap();
    // Upper: a modified, gone deleted, d replaced (opaque) holding only z,
    // r renamed to r2 (copy + whiteout), a new tree with a symlink and a
    // hard link, a mode change.
    std::fs::write(u.join("a"), "new content").unwrap();
    std::fs::set_permissions(u.join("a"), std::fs::Permissions::from_mode(0o640)).unwrap();
    whiteout(&u.join("gone"));
    std::fs::create_dir(u.join("d")).unwrap();
    set_opaque(&u.join("d"));
    std::fs::write(u.join("d/z"), "z").unwrap();
    whiteout(&u.join("r"));
    std::fs::create_dir(u.join("r2")).unwrap();
    std::fs::write(u.join("r2/old"), "1").unwrap();
    std::fs::create_dir_all(u.join("n/m")).unwrap();
    std::fs::write(u.join("n/m/f"), "deep").unwrap();
    std::fs::hard_link(u.join("n/m/f"), u.join("n/hl")).unwrap();
    symlink("m/f", u.join("n/s")).unwrap();
    let rep = run(&t, &layer(&t, &[], &[]), None);
    assert_eq!(std::fs::read_to_string(h.join("a")).unwrap(), "new content");
    assert_eq!(
        std::fs::metadata(h.join("a")).unwrap().mode() & 0o7777,
        0o640
    );
    assert!(!h.join("gone").exists());
    let mut d: Vec<_> = std::fs::read_dir(h.join("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    d.sort();
    assert_eq!(d, vec![OsString::from("z")]);
    assert!(!h.join("r").exists());
    assert_eq!(std::fs::read_to_string(h.join("r2/old")).unwrap(), "1");
    assert_eq!(std::fs::read_to_string(h.join("n/s")).unwrap(), "deep");
    assert_eq!(
        std::fs::read_link(h.join("n/s")).unwrap(),
        PathBuf::from("m/f")
    );
    assert_eq!(
        std::fs::metadata(h.join("n/hl")).unwrap().ino(),
        std::fs::metadata(h.join("n/m/f")).unwrap().ino()
    );
    assert_eq!(std::fs::read_to_string(h.join("keep")).unwrap(), "same");
    assert_eq!((rep.refused, rep.errors), (0, 0), "{rep:?}");
    // No temporary name is left anywhere.
    let left = std::process::Command::new("find")
        .arg(h)
        .args(["-name", ".sbx-apply.*"])
        .output()
        .unwrap();
    assert!(
        left.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&left.stdout)
    );
}

#[test]
fn a_hostile_upper_does_not_escape() {
    let t = setup();
    let (h, u) = (&t.host, &t.upper);
    std::fs::write(t.outside.join("secret"), "s").unwrap();
    // The host holds a symlink to the outside where the upper has a
    // directory: the apply must replace the link, not write through it.
    symlink(&t.outside, h.join("esc")).unwrap();
    std::fs::create_dir(u.join("esc")).unwrap();
    std::fs::write(u.join("esc/secret"), "overwritten").unwrap();
    whiteout(&u.join("esc2"));
    symlink(&t.outside, h.join("esc2")).unwrap();
    // A symlink to the outside is applied as a symlink (never followed).
    symlink(t.outside.join("secret"), u.join("link")).unwrap();
    // A FIFO, a setuid file, a socket, a device node (as root).
    let fifo = cstr(&u.join("fifo")).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    std::fs::write(u.join("suid"), "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(u.join("suid"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(u.join("sock")).unwrap();
    let root = sbx_testutil::is_root();
    if root {
        let c = cstr(&u.join("null")).unwrap();
        // SAFETY: a valid C string; char 1/3 (/dev/null).
        let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
        assert_eq!(r, 0);
    }
    let rep = run(&t, &layer(&t, &[], &[]), None);
    assert_eq!(
        std::fs::read_to_string(t.outside.join("secret")).unwrap(),
        "s"
    );
    assert!(
        std::fs::symlink_metadata(h.join("esc")).unwrap().is_dir(),
        "the symlink was replaced by a real directory"
    );
    assert_eq!(
        std::fs::read_to_string(h.join("esc/secret")).unwrap(),
        "overwritten"
    );
    assert!(t.outside.exists() && std::fs::symlink_metadata(h.join("esc2")).is_err());
    assert_eq!(
        std::fs::read_link(h.join("link")).unwrap(),
        t.outside.join("secret")
    );
    assert!(!h.join("fifo").exists() && !h.join("sock").exists() && !h.join("null").exists());
    let m = std::fs::metadata(h.join("suid")).unwrap().mode();
    assert_eq!(m & 0o7777, 0o755, "setuid bit stripped: {m:o}");
    // fifo, socket, setuid (+ the device as root).
    assert_eq!(rep.refused, if root { 4 } else { 3 }, "{rep:?}");
}

#[test]
fn protected_paths_stay() {
    let t = setup();
    let (h, u) = (&t.host, &t.upper);
    std::fs::create_dir_all(h.join("sub/.git")).unwrap();
    std::fs::write(h.join("sub/.git/HEAD"), "ref: refs/heads/main\n").unwrap();
    std::fs::write(h.join("sub/other"), "o").unwrap();
    std::fs::create_dir_all(h.join(".claude")).unwrap();
    std::fs::write(h.join(".claude/settings.json"), "{}").unwrap();
    // A whiteout of the directory above a protected path, an opaque pinned
    // directory, and a file under a mount point.
    whiteout(&u.join("sub"));
    std::fs::create_dir(u.join(".claude")).unwrap();
    std::fs::write(u.join(".claude/settings.json"), "{\"hooks\":1}").unwrap();
    let l = layer(&t, &["sub/.git/HEAD", ".claude"], &["sub", "sub/.git"]);
    let rep = run(&t, &l, None);
    assert_eq!(
        std::fs::read_to_string(h.join("sub/.git/HEAD")).unwrap(),
        "ref: refs/heads/main\n"
    );
    assert!(h.join("sub/other").exists());
    assert_eq!(
        std::fs::read_to_string(h.join(".claude/settings.json")).unwrap(),
        "{}"
    );
    assert!(rep.refused >= 1, "{rep:?}");
}

#[test]
fn a_killed_apply_leaves_only_journaled_temporaries_which_recover_removes() {
    let t = setup();
    let (j, reaper) = Journal::new().unwrap();
    // What a kill between a temporary's creation and its rename leaves.
    let prefix = format!("{TEMP_PREFIX}999.");
    std::fs::create_dir(t.host.join("sub")).unwrap();
    j.note(&t.host.join("sub").join(&prefix)).unwrap();
    std::fs::write(t.host.join("sub").join(format!("{prefix}1")), "half").unwrap();
    symlink("x", t.host.join("sub").join(format!("{prefix}2"))).unwrap();
    // Another run's temporary, a user's file: left alone.
    std::fs::write(t.host.join("sub").join(format!("{TEMP_PREFIX}998.1")), "x").unwrap();
    std::fs::write(t.host.join("sub/user-file"), "x").unwrap();
    // A prefix that is not ours: ignored.
    j.note(&t.host.join("sub/user-")).unwrap();
    // A journaled directory that became a symlink to the outside: not followed.
    std::fs::write(t.outside.join(format!("{prefix}1")), "outside").unwrap();
    symlink(&t.outside, t.host.join("sw")).unwrap();
    j.note(&t.host.join("sw").join(&prefix)).unwrap();
    let mut removed = recover(&reaper);
    removed.sort();
    assert_eq!(
        removed,
        vec![
            t.host.join("sub").join(format!("{prefix}1")),
            t.host.join("sub").join(format!("{prefix}2"))
        ]
    );
    assert!(
        t.host
            .join("sub")
            .join(format!("{TEMP_PREFIX}998.1"))
            .exists()
    );
    assert!(t.host.join("sub/user-file").exists());
    assert!(t.outside.join(format!("{prefix}1")).exists());
    // A journal of a completed apply names directories with nothing left.
    std::fs::write(t.upper.join("f"), "f").unwrap();
    let (j2, r2) = Journal::new().unwrap();
    run(&t, &layer(&t, &[], &[]), Some(&j2));
    assert!(recover(&r2).is_empty());
    assert_eq!(std::fs::read_to_string(t.host.join("f")).unwrap(), "f");
}

#[test]
fn a_host_directory_swapped_after_the_bind_is_refused() {
    let t = setup();
    let mut l = layer(&t, &[], &[]);
    l.ino += 1;
    let u = std::fs::File::open(&t.upper).unwrap();
    let e = apply(u.as_raw_fd(), &l, None).unwrap_err();
    assert!(e.to_string().contains("no longer the directory"), "{e}");
}

#[test]
fn project_quota_detection_says_why_not() {
    let why = prjquota(Path::new("/")).unwrap_err();
    assert!(!why.is_empty());
}

/// A sparse file made inside stays sparse on the host: the apply must not
/// turn a 1 GiB hole (nothing against the budget) into 1 GiB of the host's
/// disk.
#[test]
fn a_sparse_file_stays_sparse() {
    let t = setup();
    let f = std::fs::File::create(t.upper.join("sparse")).unwrap();
    f.set_len(1 << 30).unwrap();
    std::os::unix::fs::FileExt::write_at(&f, b"tail", (1 << 30) - 4).unwrap();
    drop(f);
    run(&t, &layer(&t, &[], &[]), None);
    let m = std::fs::metadata(t.host.join("sparse")).unwrap();
    assert_eq!(m.len(), 1 << 30);
    assert!(m.blocks() * 512 < 1 << 20, "{} blocks", m.blocks());
    let mut b = [0u8; 4];
    let h = std::fs::File::open(t.host.join("sparse")).unwrap();
    std::os::unix::fs::FileExt::read_exact_at(&h, &mut b, (1 << 30) - 4).unwrap();
    assert_eq!(&b, b"tail");
}
