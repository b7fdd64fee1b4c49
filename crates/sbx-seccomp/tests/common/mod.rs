//! Shared by the sbx-seccomp end-to-end tests: the built tool, the test
//! helper programs (examples of this crate), probes run as root and as the
//! unprivileged user.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub use sbx_testutil::{As, code, identities, run_as, stderr, stdout};

/// A helper program built from this crate's examples/.
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test-binary> -> target/<profile>/examples/<name>
    let p = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .join("examples")
        .join(name);
    assert!(
        p.exists(),
        "{} not built (cargo builds examples with the tests)",
        p.display()
    );
    p
}

/// A temp dir both identities can use, holding copies of the helpers (the
/// unprivileged user may not reach the target dir).
pub struct Lab {
    pub dir: tempfile::TempDir,
}

impl Lab {
    pub fn new() -> Self {
        let dir = sbx_testutil::shared_tempdir();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        Lab { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A copy of example `name` inside the lab, executable by everyone.
    pub fn helper(&self, name: &str) -> PathBuf {
        let dst = self.path().join(name);
        if !dst.exists() {
            std::fs::copy(example(name), &dst).unwrap();
            std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        dst
    }

    pub fn probe(&self) -> PathBuf {
        self.helper("sbx_seccomp_probe")
    }
}

/// `sbx-seccomp ARGS -- CMD...` as `who`.
pub fn seccomp(who: As, args: &[&str], cmd: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let mut c = sbx_testutil::tool("sbx-seccomp");
    c.args(args).arg("--");
    for a in cmd {
        c.arg(a);
    }
    c.env("PATH", "/usr/local/bin:/usr/bin:/bin");
    run_as(&mut c, who);
    sbx_testutil::output(&mut c)
}

/// Runs the probe for `names` under `sbx-seccomp ARGS` and returns the
/// process output and each probe's result ("ok N" / "err ERRNO").
pub fn probes(
    lab: &Lab,
    who: As,
    args: &[&str],
    names: &[&str],
) -> (Output, BTreeMap<String, String>) {
    let probe = lab.probe();
    let mut cmd: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&probe];
    for n in names {
        cmd.push(n);
    }
    let out = seccomp(who, args, &cmd);
    (out.clone(), parse(&out))
}

/// The probe without any filter (the baseline).
pub fn baseline(lab: &Lab, who: As, names: &[&str]) -> BTreeMap<String, String> {
    let mut c = Command::new(lab.probe());
    c.args(names);
    run_as(&mut c, who);
    parse(&sbx_testutil::output(&mut c))
}

fn parse(out: &Output) -> BTreeMap<String, String> {
    stdout(out)
        .lines()
        .filter_map(|l| {
            let mut it = l.splitn(2, ' ');
            Some((it.next()?.to_string(), it.next()?.to_string()))
        })
        .collect()
}

pub const EPERM: &str = "err 1";
pub const ENOSYS: &str = "err 38";
pub const SIGSYS_EXIT: i32 = 128 + libc::SIGSYS;

/// The test helper supervisors live outside the tools' directory: tell them
/// (as the caller of a first tool may) which files are the real sbx tools,
/// by identity (`SBX_TOOL_IDS`, see sbx_core::toolid).
pub fn trust_built_tools(c: &mut Command) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(sbx_testutil::bin("sbx-seccomp")).unwrap();
    c.env("SBX_TOOL_IDS", format!("{}:{}", m.dev(), m.ino()));
}
