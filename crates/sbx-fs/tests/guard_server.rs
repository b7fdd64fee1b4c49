//! The guard file system's server dying: every access to a node then fails
//! (ENOTCONN), it is never let through. Driven through the library: a
//! forked child makes its own user and mount namespaces, mounts the guard
//! file system (as sbx-fs's init does), serves it from a grandchild
//! process, checks a denied open is EACCES, SIGKILLs the server and checks
//! the same open, and a stat, now fail with ENOTCONN.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use sbx_fs::fuse::{mount, server};
use sbx_fs::guard::{Alerts, GuardNode, NodeKind};

fn errno_of(r: i32) -> i32 {
    if r >= 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
    }
}

/// Runs in the forked child; the exit code says what failed.
fn child() -> i32 {
    // SAFETY: geteuid/getegid cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let mut flags = libc::CLONE_NEWNS;
    if uid != 0 {
        flags |= libc::CLONE_NEWUSER;
    }
    // SAFETY: unshare with integer flags, on this (forked, one-thread) process only.
    if unsafe { libc::unshare(flags) } != 0 {
        return 10;
    }
    if uid != 0 && sbx_fs::namespaces::write_maps(uid, uid, gid, gid).is_err() {
        return 11;
    }
    let Ok(dev) = mount::open_dev() else {
        return 77; // no usable /dev/fuse: skipped
    };
    let Ok(mnt) = mount::mount(&dev, uid, gid) else {
        return 12;
    };
    // The server, in its own process (as in sbx-fs: another process than
    // the one using the mount).
    // SAFETY: this forked test child has one thread; the server child only serves and _exits.
    let srv = unsafe { libc::fork() };
    if srv == 0 {
        let nodes = vec![GuardNode {
            path: PathBuf::from("/p/.env"),
            kind: NodeKind::Deny,
        }];
        let ids = server::Ids {
            userns: uid != 0,
            outer_uid: uid,
            outer_gid: gid,
            inner_uid: uid,
            inner_gid: gid,
        };
        server::Server::new(dev, nodes, ids, Arc::new(Mutex::new(Alerts::default()))).run();
        // SAFETY: the server child leaves without running the test's destructors.
        unsafe { libc::_exit(0) }
    }
    drop(dev);
    let open = |name: &std::ffi::CStr| {
        // SAFETY: mnt is an open fd and name a NUL-ended literal, alive for the call.
        let fd = unsafe { libc::openat(mnt.as_raw_fd(), name.as_ptr(), libc::O_RDONLY) };
        let e = errno_of(fd);
        if fd >= 0 {
            // SAFETY: fd was just returned by openat (fd >= 0) and is owned by no one else.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        e
    };
    if open(c"0.f") != libc::EACCES {
        return 13;
    }
    // SAFETY: srv is our own unreaped child: killed, then reaped once.
    unsafe {
        libc::kill(srv, libc::SIGKILL);
        libc::waitpid(srv, std::ptr::null_mut(), 0);
    }
    if open(c"0.f") != libc::ENOTCONN {
        return 14;
    }
    // SAFETY: libc::stat is plain integers: all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: mnt is open, the name a NUL-ended literal and st a live stat.
    let r = unsafe { libc::fstatat(mnt.as_raw_fd(), c"0.d".as_ptr(), &mut st, 0) };
    if errno_of(r) != libc::ENOTCONN {
        return 15;
    }
    0
}

#[test]
fn a_dead_server_still_denies() {
    for who in sbx_testutil::identities() {
        // SAFETY: nextest runs this test alone in its process, and the child only runs child()
        // and _exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            if who == sbx_testutil::As::User {
                let (uid, gid) = sbx_testutil::test_user().unwrap();
                // SAFETY: id changes on this forked child only; a null list with size 0 is what
                // setgroups allows.
                unsafe {
                    if libc::setgroups(0, std::ptr::null()) != 0
                        || libc::setgid(gid) != 0
                        || libc::setuid(uid) != 0
                    {
                        libc::_exit(9)
                    }
                    // setuid cleared it; /proc/self/uid_map needs it.
                    libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0);
                }
            }
            let code = child();
            // SAFETY: the forked child leaves without running the test harness's destructors.
            unsafe { libc::_exit(code) }
        }
        let mut st = 0;
        // SAFETY: pid is our own child, reaped once; st is a live int.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        assert!(libc::WIFEXITED(st), "child died: {st:#x}");
        let code = libc::WEXITSTATUS(st);
        if code == 77 {
            sbx_testutil::skip!("/dev/fuse cannot be opened as {who:?} (run scripts/setup)");
        }
        assert_eq!(
            code, 0,
            "as {who:?}: step {code} failed (see the test's source)"
        );
    }
}
