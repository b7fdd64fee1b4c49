//! Input the guest cannot carry is refused before any VM boots: one line
//! naming the flag, the file or key and the limit, exit 125, nothing left
//! behind, within a moment. No VMM or guest is needed: the checks come
//! before sbx-vm looks for them (a guest directory that does not exist
//! makes a run that passes them stop at --kernel, still before any boot).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// A guest directory that does not exist: passing every input check ends
/// at "--kernel ...: does not exist".
fn no_guest(vm: &Vm) -> PathBuf {
    vm.tmp.path().join("no-guest")
}

/// Runs `c` (bounded), asserts a one-line 125 naming `needles`, quickly, and
/// nothing left behind.
fn refused(vm: &Vm, c: &mut Command, needles: &[&str]) -> String {
    let t0 = Instant::now();
    let out = output_within(c, Duration::from_secs(60));
    let took = t0.elapsed();
    for n in needles {
        assert_usage_error(&out, n);
    }
    assert!(
        took < Duration::from_secs(10),
        "took {took:?}: {}",
        stderr(&out)
    );
    assert!(
        !std::fs::read_to_string(&vm.audit)
            .unwrap_or_default()
            .contains("vm_started"),
        "a VM was started"
    );
    vm.assert_clean();
    stderr(&out)
}

fn write_doc(p: &Path, env: &serde_json::Map<String, serde_json::Value>) {
    std::fs::write(p, serde_json::json!({ "env": env }).to_string()).unwrap();
}

/// --secrets-from values the guest cannot put into the command's
/// environment (a NUL byte, one NAME=VALUE over MAX_ARG_STRLEN, all of them
/// over execve's total) and a run spec over one control-channel frame: 125
/// up front, naming the file and the key, never the value.
#[test]
fn secrets_the_guest_cannot_carry_are_refused_before_boot() {
    let vm = Vm::new();
    let guest = no_guest(&vm);
    let d = vm.tmp.path();
    let nul = d.join("nul.json");
    std::fs::write(
        &nul,
        r#"{"env":{"OK":"fine","TOKEN":"do-not-print-me\u0000tail"}}"#,
    )
    .unwrap();
    let one = d.join("one.json");
    let mut m = serde_json::Map::new();
    m.insert("CERT".into(), "do-not-print-me".repeat(10_000).into());
    write_doc(&one, &m);
    let many = d.join("many.json");
    let chunk = "do-not-print-me".repeat(6_000);
    let mut m = serde_json::Map::new();
    for i in 0..25 {
        m.insert(format!("S{i}"), chunk.clone().into());
    }
    write_doc(&many, &m);
    let d_s = |p: &Path| p.display().to_string();
    for (file, needles) in [
        (
            &nul,
            vec![
                format!("--secrets-from {}: env.TOKEN: ", d_s(&nul)),
                "NUL byte".to_string(),
            ],
        ),
        (
            &one,
            vec![
                format!("--secrets-from {}: env.CERT: ", d_s(&one)),
                "limit of 128 KiB for one environment string".to_string(),
            ],
        ),
        (
            &many,
            vec![
                format!("--secrets-from {}: the secrets", d_s(&many)),
                "limit of 2 MiB".to_string(),
            ],
        ),
    ] {
        let mut c = vm.cmd(&guest);
        c.arg("--secrets-from").arg(file).args(["--", "true"]);
        let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
        let err = refused(&vm, &mut c, &needles);
        assert!(!err.contains("do-not-print-me"), "value printed: {err}");
    }

    // --secret-env adds to the total: each fits (and fits sbx-vm's own
    // environment), together with the file they do not.
    let seventeen = d.join("seventeen.json");
    let mut m = serde_json::Map::new();
    for i in 0..17 {
        m.insert(format!("F{i}"), chunk.clone().into());
    }
    write_doc(&seventeen, &m);
    let mut c = vm.cmd(&guest);
    c.arg("--secrets-from").arg(&seventeen);
    for i in 0..7 {
        c.env(format!("SBX_TEST_E{i}"), &chunk)
            .args(["--secret-env", &format!("SBX_TEST_E{i}")]);
    }
    c.args(["--", "true"]);
    let err = refused(
        &vm,
        &mut c,
        &[&format!(
            "--secrets-from {} and --secret-env: the secrets",
            d_s(&seventeen)
        )],
    );
    assert!(!err.contains("do-not-print-me"));
    // Alone, the file passes every check (and the run stops at the kernel).
    let mut c = vm.cmd(&guest);
    c.arg("--secrets-from").arg(&seventeen).args(["--", "true"]);
    refused(&vm, &mut c, &["--kernel"]);

    // The run spec (CMD and --setenv) is one frame of at most 1 MiB.
    let mut c = vm.cmd(&guest);
    let v = "v".repeat(110_000);
    for i in 0..10 {
        c.args(["--setenv", &format!("K{i}={v}")]);
    }
    c.args(["--", "true"]);
    refused(&vm, &mut c, &["CMD and --setenv: the run spec is", "1 MiB"]);
}

/// --copy-in of what the guest's tmpfs cannot take (a 2 GB file, files
/// that together pass --tmpfs, more entries than its inodes): refused from
/// the tree's metadata before boot, naming the flag, the file and the
/// limit. FIFOs, devices and symlinks (to /dev/zero, to the big file) in
/// the tree are entries, never read; hard links count once; a FIFO or
/// /dev/zero as --copy-in is no directory.
#[test]
fn copy_in_over_what_the_guest_holds_is_refused_before_boot() {
    let vm = Vm::new();
    let guest = no_guest(&vm);
    let d = vm.tmp.path();
    let sparse = |p: &Path, len: u64| {
        std::fs::File::create(p).unwrap().set_len(len).unwrap();
    };
    let copy_in = |dir: &Path, extra: &[&str]| {
        let mut c = vm.cmd(&guest);
        c.args(extra).arg("--copy-in").arg(dir).args(["--", "true"]);
        c
    };
    let flag = |dir: &Path| format!("--copy-in {}: ", dir.display());

    // One 2 GB (sparse) file; --memory 256M (Vm::cmd's) gives a 128 MiB tmpfs.
    let big = d.join("big");
    std::fs::create_dir(&big).unwrap();
    sparse(&big.join("disk.img"), 2 << 30);
    refused(
        &vm,
        &mut copy_in(&big, &[]),
        &[
            &flag(&big),
            &format!("{} is 2.0 GiB", big.join("disk.img").display()),
            "the guest's tmpfs of 128 MiB (half of --memory 256M",
        ],
    );
    // Reached through a symlink given as --copy-in: the same.
    let link = d.join("link-to-big");
    std::os::unix::fs::symlink(&big, &link).unwrap();
    refused(&vm, &mut copy_in(&link, &[]), &[&flag(&link), "2.0 GiB"]);
    // With --tmpfs: that is the limit named.
    refused(
        &vm,
        &mut copy_in(&big, &["--tmpfs", "64M"]),
        &[&flag(&big), "the guest's tmpfs of 64 MiB (--tmpfs)"],
    );

    // Several files that fit one by one but not together (later --memory
    // flags win over Vm::cmd's).
    let sum = d.join("sum");
    std::fs::create_dir_all(sum.join("sub")).unwrap();
    for n in ["a", "b", "sub/c"] {
        sparse(&sum.join(n), 50 << 20);
    }
    refused(
        &vm,
        &mut copy_in(&sum, &[]),
        &[&flag(&sum), "its files total more than 128 MiB"],
    );

    // More entries than the guest's tmpfs has inodes (about 11700 with
    // --memory 128M): refused without reading them all.
    let wide = d.join("wide");
    std::fs::create_dir(&wide).unwrap();
    for i in 0..12_000 {
        std::fs::File::create(wide.join(i.to_string())).unwrap();
    }
    refused(
        &vm,
        &mut copy_in(&wide, &["--memory", "128M"]),
        &[&flag(&wide), "files and directories", "--memory 128M"],
    );

    // What tar archives without reading: a FIFO, symlinks to /dev/zero and
    // to the big file; hard links to one file count once (3 x 100 MiB of
    // names, 100 MiB of data, in 128 MiB). The checks pass: the run stops
    // at the missing kernel.
    let odd = d.join("odd");
    std::fs::create_dir(&odd).unwrap();
    mkfifo(&odd.join("fifo"));
    std::os::unix::fs::symlink("/dev/zero", odd.join("zero")).unwrap();
    std::os::unix::fs::symlink(big.join("disk.img"), odd.join("disk.img")).unwrap();
    sparse(&odd.join("data"), 100 << 20);
    std::fs::hard_link(odd.join("data"), odd.join("data2")).unwrap();
    std::fs::hard_link(odd.join("data"), odd.join("data3")).unwrap();
    refused(&vm, &mut copy_in(&odd, &[]), &["--kernel"]);

    // Not a directory: a FIFO, /dev/zero (never opened).
    let fifo = d.join("fifo");
    mkfifo(&fifo);
    for p in [fifo.as_path(), Path::new("/dev/zero")] {
        refused(
            &vm,
            &mut copy_in(p, &[]),
            &[&format!("--copy-in {}: not a directory", p.display())],
        );
    }

    // A file the caller cannot read would fail tar -c after the boot.
    if is_root() && test_user().is_some() {
        let locked = d.join("locked");
        std::fs::create_dir(&locked).unwrap();
        chown_to_test_user(&locked);
        std::fs::write(locked.join("secret"), "x").unwrap();
        std::fs::set_permissions(
            locked.join("secret"),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        let mut c = copy_in(&locked, &[]);
        run_as(&mut c, As::User);
        refused(
            &vm,
            &mut c,
            &[
                &format!("{}: not readable", locked.join("secret").display()),
                "Permission denied",
            ],
        );
    }
}

/// A --copy-in tree that grows after the check (a file swapped for a
/// 2 GB one while the guest boots) is cut off at what was checked: one
/// line naming the flag and the directory, 125, right away instead of
/// after filling the guest's tmpfs; nothing left behind.
#[test]
fn copy_in_that_grows_after_the_check_is_cut_off() {
    let guest = need_guest!();
    let vm = Vm::new();
    let dir = vm.tmp.path().join("in");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("small"), "x").unwrap();
    let mut c = vm.cmd(&guest);
    c.arg("--copy-in")
        .arg(&dir)
        .args(["--boot-timeout", "300s", "--", "true"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = c.spawn().unwrap();
    // The VMM is up (the check is long done); the guest asks for the tree
    // only once it has booted.
    let started = wait_event(&vm.audit, Duration::from_secs(60), |e| {
        e["event"] == "vm_started"
    });
    std::fs::File::create(dir.join("small"))
        .unwrap()
        .set_len(2 << 30)
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(started.is_some(), "no VM started: {}", stderr(&out));
    assert_usage_error(
        &out,
        &format!(
            "--copy-in {}: grew past what was checked before the boot",
            dir.display()
        ),
    );
    vm.assert_clean();
}
