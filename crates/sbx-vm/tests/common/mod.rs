//! Shared by sbx-vm's end-to-end tests: the guest (built once by
//! scripts/build-guest), a private TMPDIR per run (so "nothing left" is
//! checkable), and the checks that nothing survives a run.
#![allow(dead_code)]

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use sbx_testutil::*;

/// The guest directory: SBX_VM_GUEST_DIR or the default place; built once
/// per test process by scripts/build-guest when missing.
pub fn guest_dir() -> Option<PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::var_os("SBX_VM_GUEST_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/usr/local/share/sbx/guest"));
        let complete = |d: &Path| {
            ["vmlinuz", "vmlinux", "initrd.img", "rootfs.squashfs"]
                .iter()
                .all(|f| d.join(f).is_file())
        };
        if !complete(&dir) && is_root() {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/build-guest");
            let st = Command::new(script).arg(&dir).status();
            eprintln!("build-guest: {st:?}");
        }
        complete(&dir).then_some(dir)
    })
    .clone()
}

pub fn have_qemu() -> bool {
    have("qemu-system-x86_64")
}

/// Skips (or fails under SBX_MUST_WORK=1) when QEMU or the guest is missing.
#[macro_export]
macro_rules! need_guest {
    () => {{
        if !common::have_qemu() {
            sbx_testutil::skip!("qemu-system-x86_64 not installed (scripts/setup)");
        }
        match common::guest_dir() {
            Some(d) => d,
            None => sbx_testutil::skip!("guest not built (scripts/build-guest)"),
        }
    }};
}

/// A run of sbx-vm with its own TMPDIR (its run directories land there).
pub struct Vm {
    pub tmp: tempfile::TempDir,
    pub audit: PathBuf,
}

impl Vm {
    pub fn new() -> Self {
        let tmp = shared_tempdir();
        let audit = tmp.path().join("audit.log");
        Vm { tmp, audit }
    }

    pub fn cmd(&self, guest: &Path) -> Command {
        let mut c = tool("sbx-vm");
        c.env("TMPDIR", self.tmp.path().join("t"))
            .env("SBX_VM_GUEST_DIR", guest)
            .arg("--audit-log")
            .arg(&self.audit)
            .arg("--backend")
            .arg("qemu")
            .arg("--memory")
            .arg("256M");
        let _ = std::fs::create_dir_all(self.tmp.path().join("t"));
        chown_to_test_user(&self.tmp.path().join("t"));
        // Its own registry of run directories (sbx_core::registry): the
        // machine-wide one would let a concurrent test's run reap a killed
        // run's directory before this test looks at it.
        let reg = self.tmp.path().join("registry");
        let _ = std::fs::DirBuilder::new().mode(0o1777).create(&reg);
        let _ = std::fs::set_permissions(&reg, std::fs::Permissions::from_mode(0o1777));
        c.env("SBX_REGISTRY_DIR", &reg);
        c
    }

    /// The run-directory base of the identity that ran.
    pub fn bases(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.tmp.path().join("t"))
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default()
    }

    /// Nothing of the run is left on the host: no run directory, no
    /// process that names this test's TMPDIR (the VMM), no secrets file.
    pub fn assert_clean(&self) {
        for b in self.bases() {
            let left: Vec<_> = std::fs::read_dir(&b)
                .unwrap()
                .flatten()
                .map(|e| e.path())
                .collect();
            assert!(left.is_empty(), "left behind in {}: {left:?}", b.display());
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let procs = processes_naming(self.tmp.path());
            if procs.is_empty() {
                break;
            }
            assert!(Instant::now() < deadline, "processes left: {procs:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Pids whose command line mentions `needle`.
pub fn processes_naming(needle: &Path) -> Vec<(i32, String)> {
    let n = needle.to_string_lossy().to_string();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cl) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cl = String::from_utf8_lossy(&cl).replace('\0', " ");
        if cl.contains(&n) {
            out.push((pid, cl));
        }
    }
    out
}

/// Waits (bounded) until `pred` holds on the audit log.
pub fn wait_event(
    log: &Path,
    limit: Duration,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> Option<serde_json::Value> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(e) = audit_events(log).into_iter().find(|e| pred(e)) {
            return Some(e);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}
