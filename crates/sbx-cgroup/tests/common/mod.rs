//! Shared by the sbx-cgroup end-to-end tests: a dedicated parent group per
//! test, created under this test process's own cgroup in every v1
//! hierarchy (and removed again), so a test can neither leak into nor touch
//! anything else on the machine.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use sbx_cgroup::discover::{Host, discover};
pub use sbx_testutil::*;

pub struct TestParent {
    /// `--parent` value: relative to the caller's own cgroup.
    pub name: String,
    /// The parent dir in each hierarchy.
    pub dirs: Vec<PathBuf>,
    pub tmp: tempfile::TempDir,
}

impl TestParent {
    /// None (and a skip message) when not root or no v1 controllers.
    pub fn new() -> Option<Self> {
        if !is_root() {
            return None;
        }
        let layout = discover(&Host::default()).ok()?;
        if layout.v1.is_empty() {
            return None;
        }
        let name = unique("sbxt-");
        let mut dirs = Vec::new();
        for h in &layout.v1 {
            let own = h.dir_of(&h.own)?;
            let d = own.join(&name);
            std::fs::create_dir(&d).unwrap_or_else(|e| panic!("mkdir {}: {e}", d.display()));
            dirs.push(d);
        }
        Some(TestParent {
            name,
            dirs,
            tmp: tempfile::Builder::new()
                .prefix("sbx-cg-test-")
                .tempdir()
                .unwrap(),
        })
    }

    pub fn log(&self) -> PathBuf {
        self.tmp.path().join("audit.log")
    }

    /// sbx-cgroup with --parent and --audit-log set.
    pub fn cmd(&self) -> Command {
        let mut c = tool("sbx-cgroup");
        c.arg("--parent")
            .arg(&self.name)
            .arg("--audit-log")
            .arg(self.log());
        c
    }

    /// The group dirs (sbx-*) currently under the parent, in any hierarchy.
    pub fn children(&self) -> Vec<PathBuf> {
        let mut v = Vec::new();
        for d in &self.dirs {
            if let Ok(rd) = std::fs::read_dir(d) {
                for e in rd.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        v.push(e.path());
                    }
                }
            }
        }
        v
    }

    /// Asserts no group is left under the parent.
    pub fn assert_no_group(&self) {
        let c = self.children();
        assert!(c.is_empty(), "groups left behind: {c:?}");
    }

    /// The dir of this parent in the hierarchy holding `controller`.
    pub fn dir_with(&self, controller: &str) -> PathBuf {
        self.dirs
            .iter()
            .find(|d| {
                d.ancestors().any(|a| {
                    a.file_name().is_some_and(|n| {
                        n.to_str().unwrap_or("").split(',').any(|c| c == controller)
                    })
                })
            })
            .cloned()
            .unwrap_or_else(|| panic!("no {controller} hierarchy"))
    }
}

impl Drop for TestParent {
    fn drop(&mut self) {
        // Kill and remove anything left (only below our own parent).
        for _ in 0..100 {
            let mut busy = false;
            for c in self.children() {
                // A test that froze a group and failed must not leave
                // frozen (unkillable) processes behind.
                let _ = std::fs::write(c.join("freezer.state"), "THAWED");
                for p in pids_in(&c) {
                    // SAFETY: kill with integer arguments; the pids are left in the test's own
                    // cgroup.
                    unsafe { libc::kill(p, libc::SIGKILL) };
                }
                if std::fs::remove_dir(&c).is_err() {
                    busy = true;
                }
            }
            if !busy {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        for d in &self.dirs {
            for _ in 0..50 {
                if std::fs::remove_dir(d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

pub fn pids_in(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Live processes whose command line contains `marker`.
pub fn procs_with(marker: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(cl) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cl = String::from_utf8_lossy(&cl).replace('\0', " ");
        // Zombies have an empty cmdline; they are not alive.
        if cl.contains(marker) && !cl.contains("sbx-cgroup") {
            v.push(pid);
        }
    }
    v
}

/// Polls `f` until it is true or `limit` passes.
pub fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}

pub fn run(c: &mut Command) -> Output {
    c.output().expect("spawn sbx-cgroup")
}

/// The cgroup_summary event (there must be exactly one).
pub fn summary(log: &Path) -> serde_json::Value {
    let evs: Vec<_> = audit_events(log)
        .into_iter()
        .filter(|e| e["event"] == "cgroup_summary")
        .collect();
    assert_eq!(
        evs.len(),
        1,
        "want one cgroup_summary in {}: {evs:?}",
        log.display()
    );
    evs[0].clone()
}

#[macro_export]
macro_rules! parent_or_skip {
    () => {
        match common::TestParent::new() {
            Some(p) => p,
            None => {
                sbx_testutil::skip!("needs root and cgroup v1 controllers (this host's layout)");
            }
        }
    };
}
