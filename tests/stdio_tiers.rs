//! Issue 16, data loss in the gVisor tier: with stdout a regular file,
//! `{ echo before; sbx-policy chain --trust zero -- ...; } > log` wrote at
//! offset 0 over "before", and `2>&1` lost lines. Every tier that runs here
//! (the low-trust chain, gVisor, sbx-vm on QEMU, sbx-container on Podman)
//! must leave the caller's offsets and O_APPEND alone: what the command
//! writes lands after what the shell wrote before, nothing is lost, and the
//! shell's later writes land after it.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Command;

const SCRIPT: &str = "echo out1; echo err1 >&2; echo out2; echo err2 >&2";

struct Fx {
    _d: tempfile::TempDir,
    base: PathBuf,
    repo: PathBuf,
    settings: PathBuf,
}

fn fx() -> Fx {
    let d = sbx_testutil::shared_tempdir();
    let base = d.path().canonicalize().unwrap();
    let repo = base.join("proj");
    write(&repo.join("a.txt"), "a\n");
    git(&repo, &["init", "-q", "-b", "main"]);
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "init"]);
    let settings = base.join("settings.json");
    write(&settings, "{}");
    Fx {
        _d: d,
        base,
        repo,
        settings,
    }
}

fn sh_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', "'\\''"))
}

/// Runs `tier -- sh -c SCRIPT` in bash between two shell writes, once with
/// `> log 2>&1` (offset, shared description) and once with `>> log 2>&1`
/// onto an existing file (O_APPEND); returns the two logs.
fn run_tier(fx: &Fx, name: &str, tier: &str, env: &[(&str, &str)]) -> (String, String) {
    let log = fx.base.join(format!("{name}.log"));
    std::fs::write(&log, "old\n").unwrap();
    let inner = format!("{tier} -- sh -c '{SCRIPT}'");
    let script = format!(
        "{{ echo before; {inner}; echo \"status $?\"; echo after; }} > {log} 2>&1; \
         {{ echo before; {inner}; echo \"status $?\"; echo after; }} >> {log}.app 2>&1",
        log = sh_quote(&log)
    );
    let app = PathBuf::from(format!("{}.app", log.display()));
    std::fs::write(&app, "old\n").unwrap();
    let mut c = Command::new("timeout");
    c.args(["300", "bash", "-c", &script]).env("PATH", PATH);
    for (k, v) in env {
        c.env(k, v);
    }
    let st = c.status().unwrap();
    assert!(st.success(), "{name}: bash: {st:?}");
    (
        std::fs::read_to_string(&log).unwrap(),
        std::fs::read_to_string(&app).unwrap(),
    )
}

/// Nothing lost, nothing overwritten; `exact`: stdout and stderr in the
/// order written (one description, one pipe); else each stream's order.
fn assert_log(name: &str, got: &str, prefix: &str, exact: bool) {
    let lines: Vec<&str> = got.lines().collect();
    let want_head: Vec<&str> = prefix.lines().chain(["before"]).collect();
    assert_eq!(
        &lines[..want_head.len().min(lines.len())],
        &want_head[..],
        "{name}: the earlier content was overwritten: {got:?}"
    );
    let tail = &lines[want_head.len()..];
    assert_eq!(
        tail.last().copied(),
        Some("after"),
        "{name}: the later write is not last: {got:?}"
    );
    assert!(
        tail.contains(&"status 0"),
        "{name}: the command failed: {got:?}"
    );
    let body: Vec<&str> = tail
        .iter()
        .copied()
        .filter(|l| l.starts_with("out") || l.starts_with("err"))
        .collect();
    if exact {
        assert_eq!(
            body,
            ["out1", "err1", "out2", "err2"],
            "{name}: lines lost or reordered: {got:?}"
        );
    } else {
        let mut sorted = body.clone();
        sorted.sort();
        assert_eq!(
            sorted,
            ["err1", "err2", "out1", "out2"],
            "{name}: lines lost: {got:?}"
        );
        let pos = |s: &str| body.iter().position(|l| *l == s).unwrap();
        assert!(
            pos("out1") < pos("out2") && pos("err1") < pos("err2"),
            "{name}: {got:?}"
        );
    }
}

fn policy(fx: &Fx, trust: &str) -> String {
    format!(
        "{} chain --trust {trust} --settings {} --managed /nonexistent --chdir {} --home {}",
        sh_quote(&sbx_testutil::bin("sbx-policy")),
        sh_quote(&fx.settings),
        sh_quote(&fx.repo),
        sh_quote(&fx.base)
    )
}

#[test]
fn low_trust_chain_keeps_offsets_and_append() {
    let fx = fx();
    let (log, app) = run_tier(&fx, "chain", &policy(&fx, "low"), &[]);
    assert_log("chain >", &log, "", true);
    assert_log("chain >>", &app, "old", true);
}

#[test]
fn gvisor_keeps_offsets_and_append() {
    if !sbx_testutil::have("runsc") {
        sbx_testutil::skip!("runsc not installed (scripts/setup installs Debian's runsc)");
    }
    let fx = fx();
    let (log, app) = run_tier(&fx, "gvisor", &policy(&fx, "zero"), &[]);
    assert_log("gvisor >", &log, "", true);
    assert_log("gvisor >>", &app, "old", true);
}

#[test]
fn qemu_vm_keeps_offsets_and_append() {
    if !sbx_testutil::have("qemu-system-x86_64") {
        sbx_testutil::skip!("qemu-system-x86_64 not installed (scripts/setup)");
    }
    let guest = std::env::var_os("SBX_VM_GUEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/local/share/sbx/guest"));
    if !guest.join("vmlinux").is_file() {
        sbx_testutil::skip!("guest not built (scripts/build-guest)");
    }
    let fx = fx();
    let tmp = fx.base.join("t");
    std::fs::create_dir_all(&tmp).unwrap();
    let tier = format!(
        "{} --backend qemu --memory 256M",
        sh_quote(&sbx_testutil::bin("sbx-vm"))
    );
    let (log, app) = run_tier(
        &fx,
        "qemu",
        &tier,
        &[
            ("SBX_VM_GUEST_DIR", guest.to_str().unwrap()),
            ("TMPDIR", tmp.to_str().unwrap()),
        ],
    );
    // The guest's stdout and stderr travel on two channels: each keeps
    // its order, nothing is lost or overwritten.
    assert_log("qemu >", &log, "", false);
    assert_log("qemu >>", &app, "old", false);
}

#[test]
fn podman_container_keeps_offsets_and_append() {
    let Some(pod) = sbx_testutil::container::Podman::start() else {
        sbx_testutil::skip!("needs root and podman (scripts/setup installs it)");
    };
    let image = pod.image();
    let fx = fx();
    let tier = format!(
        "{} --engine {} --image {}",
        sh_quote(&sbx_testutil::bin("sbx-container")),
        pod.url,
        image
    );
    let (log, app) = run_tier(&fx, "container", &tier, &[]);
    assert_log("container >", &log, "", false);
    assert_log("container >>", &app, "old", false);
}
