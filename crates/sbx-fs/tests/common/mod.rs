//! Shared helpers of the sbx-fs end-to-end tests: a scratch tree the test
//! user can use (a project with .git, secrets beside it, a fake home), a
//! way to run sbx-fs on it as root or as the test user, and checks that
//! nothing was left on the host.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub use sbx_testutil::{As, code, identities, run_as, stderr, stdout};

pub struct Scratch {
    pub dir: tempfile::TempDir,
    logs: tempfile::TempDir,
    pub who: As,
    log_n: std::cell::Cell<u32>,
}

impl Scratch {
    /// root/proj (a git-like project), root/secret.txt (outside every
    /// bind), root/home (the caller's $HOME for sbx-fs).
    pub fn new(who: As) -> Scratch {
        let dir = sbx_testutil::shared_tempdir();
        let logs = sbx_testutil::shared_tempdir();
        if who == As::Root {
            let _ = std::os::unix::fs::chown(dir.path(), Some(0), Some(0));
        }
        let s = Scratch {
            dir,
            logs,
            who,
            log_n: std::cell::Cell::new(0),
        };
        s.write("proj/README", "hello\n");
        s.write("secret.txt", "HOST-SECRET-OUTSIDE\n");
        s.mkdir("home");
        s
    }

    pub fn root(&self) -> PathBuf {
        self.dir.path().canonicalize().unwrap()
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root().join(rel)
    }

    pub fn proj(&self) -> PathBuf {
        self.path("proj")
    }

    pub fn home(&self) -> PathBuf {
        self.path("home")
    }

    pub fn write(&self, rel: &str, data: &str) {
        let p = self.dir.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, data).unwrap();
        self.own();
    }

    pub fn mkdir(&self, rel: &str) {
        std::fs::create_dir_all(self.dir.path().join(rel)).unwrap();
        self.own();
    }

    pub fn symlink(&self, target: &Path, rel: &str) {
        std::os::unix::fs::symlink(target, self.dir.path().join(rel)).unwrap();
        self.own();
    }

    /// Gives the whole tree to the test user (when we are root).
    pub fn own(&self) {
        if self.who != As::User {
            return;
        }
        if let (true, Some((uid, gid))) = (sbx_testutil::is_root(), sbx_testutil::test_user()) {
            chown_r(self.dir.path(), uid, gid);
        }
    }

    /// A fresh audit log path for one run.
    pub fn log(&self) -> PathBuf {
        let n = self.log_n.get() + 1;
        self.log_n.set(n);
        self.logs.path().join(format!("audit-{n}.log"))
    }

    /// sbx-fs ARGS -- /bin/sh -c SCRIPT, as `who`, with $HOME the fake home
    /// and the audit log at `log`.
    pub fn cmd(&self, log: &Path, args: &[&str], script: &str) -> Command {
        let mut c = sbx_testutil::tool("sbx-fs");
        run_as(&mut c, self.who);
        c.env("HOME", self.home())
            .current_dir(self.root())
            .arg("--audit-log")
            .arg(log)
            .args(args)
            .args(["--", "/bin/sh", "-c", script]);
        c
    }

    pub fn run(&self, args: &[&str], script: &str) -> (Output, PathBuf) {
        let log = self.log();
        let out = self.cmd(&log, args, script).output().expect("spawn sbx-fs");
        (out, log)
    }

    /// Runs with the project bound read-write (the common case).
    pub fn run_rw(&self, extra: &[&str], script: &str) -> (Output, PathBuf) {
        let p = self.proj();
        let rw = p.to_str().unwrap().to_string();
        let mut args = vec!["--rw", rw.as_str(), "--chdir", rw.as_str()];
        args.extend_from_slice(extra);
        self.run(&args, script)
    }

    pub fn snapshot(&self) -> BTreeMap<PathBuf, String> {
        snapshot(&self.root())
    }

    /// Asserts nothing sbx-fs made is left: the tree is `before`, and no
    /// mount on the host mentions the scratch dir.
    pub fn assert_clean(&self, before: &BTreeMap<PathBuf, String>) {
        let after = self.snapshot();
        assert_eq!(before, &after, "the scratch tree changed on the host");
        let root = self.root();
        let m = mounts_mentioning(&root);
        assert!(m.is_empty(), "mounts left on the host: {m:?}");
    }
}

pub fn chown_r(p: &Path, uid: u32, gid: u32) {
    let _ = std::os::unix::fs::lchown(p, Some(uid), Some(gid));
    if let Ok(m) = std::fs::symlink_metadata(p)
        && m.is_dir()
    {
        for e in std::fs::read_dir(p).unwrap().flatten() {
            chown_r(&e.path(), uid, gid);
        }
    }
}

/// Every path under `root` with its type, mode, size and content.
pub fn snapshot(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut m = BTreeMap::new();
    fn walk(root: &Path, p: &Path, m: &mut BTreeMap<PathBuf, String>) {
        let Ok(md) = std::fs::symlink_metadata(p) else {
            return;
        };
        let rel = p.strip_prefix(root).unwrap().to_path_buf();
        let desc = if md.file_type().is_symlink() {
            // Entries may vanish under the walk (a reaper still at work);
            // what vanished is simply not in this snapshot.
            match std::fs::read_link(p) {
                Ok(t) => format!("link -> {}", t.display()),
                Err(_) => return,
            }
        } else if md.is_dir() {
            format!("dir {:o}", md.mode() & 0o7777)
        } else {
            format!(
                "file {:o} {:?}",
                md.mode() & 0o7777,
                std::fs::read(p).map(|b| String::from_utf8_lossy(&b).into_owned())
            )
        };
        m.insert(rel, desc);
        if md.is_dir() && !md.file_type().is_symlink() {
            let Ok(dir) = std::fs::read_dir(p) else {
                return;
            };
            for e in dir.flatten() {
                walk(root, &e.path(), m);
            }
        }
    }
    walk(root, root, &mut m);
    m
}

/// Lines of the host's mount table naming `p`.
pub fn mounts_mentioning(p: &Path) -> Vec<String> {
    let s = p.to_str().unwrap();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(s))
        .map(String::from)
        .collect()
}

/// A denial must be a failure that printed nothing of the secret.
pub fn assert_refused(out: &Output, secret: &str, what: &str) {
    let so = stdout(out);
    assert!(!so.contains(secret), "{what}: secret leaked: {so}");
}

/// Polls `f` up to ~10 s (bounded), returning whether it became true.
pub fn eventually(mut f: impl FnMut() -> bool) -> bool {
    for _ in 0..1000 {
        if f() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    false
}

/// Host pids whose command line contains `marker`.
pub fn pids_with(marker: &str) -> Vec<i32> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if let Ok(c) = std::fs::read(e.path().join("cmdline"))
            && String::from_utf8_lossy(&c).contains(marker)
        {
            v.push(pid);
        }
    }
    v
}
