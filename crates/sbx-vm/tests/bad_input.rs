//! Bad input and failed guests: one clear line, exit 125, nothing left.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;

fn one_line(vm: &Vm, out: &std::process::Output, needle: &str) {
    assert_usage_error(out, needle);
    vm.assert_clean();
}

#[test]
fn bad_flags_and_files() {
    let guest = need_guest!();
    let vm = Vm::new();
    let junk = vm.tmp.path().join("junk.img");
    std::fs::write(&junk, vec![0u8; 8192]).unwrap();
    let full = vm.tmp.path().join("full");
    std::fs::create_dir(&full).unwrap();
    std::fs::write(full.join("x"), "x").unwrap();
    let bad_json = vm.tmp.path().join("bad.json");
    std::fs::write(&bad_json, "{\"env\": {\"K\": \"do-not-print-me\"").unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--jail-cgroup".into(), "nope".into()],
            "--jail-cgroup nope: expected FILE=VALUE",
        ),
        (
            vec!["--jail-cgroup".into(), "bogusctl.max=1".into()],
            "--jail-cgroup bogusctl.max=1",
        ),
        (
            vec!["--kernel".into(), "/nonexistent/vmlinuz".into()],
            "--kernel /nonexistent/vmlinuz: does not exist",
        ),
        (
            vec!["--kernel".into(), junk.display().to_string()],
            "not a Linux kernel",
        ),
        (
            vec!["--rootfs".into(), "/nonexistent/root.sqfs".into()],
            "--rootfs /nonexistent/root.sqfs: does not exist",
        ),
        (
            vec!["--rootfs".into(), junk.display().to_string()],
            "not a squashfs image",
        ),
        (
            vec!["--initrd".into(), junk.display().to_string()],
            "not an initramfs",
        ),
        (
            vec!["--qemu".into(), "/nonexistent/qemu".into()],
            "--qemu /nonexistent/qemu: not an executable file",
        ),
        (
            vec!["--memory".into(), "64M".into()],
            "--memory 64M: below what the guest needs",
        ),
        // The old spelling is a hidden alias for one release.
        (vec!["--mem".into(), "lots".into()], "--memory lots"),
        (vec!["--vcpus".into(), "0".into()], "--vcpus 0"),
        (vec!["--tmpfs".into(), "1G".into()], "--tmpfs 1G"),
        (vec!["--timeout".into(), "soon".into()], "--timeout soon"),
        (
            vec!["--boot-timeout".into(), "0s".into()],
            "--boot-timeout 0s",
        ),
        (
            vec!["--setenv".into(), "NOEQUALS".into()],
            "--setenv NOEQUALS: expected K=V",
        ),
        (
            vec!["--net".into(), "sbx-net".into()],
            "--net sbx-net: not inside sbx-net's network namespace",
        ),
        (vec!["--net".into(), "host".into()], "--net"),
        (
            vec!["--secrets-from".into(), bad_json.display().to_string()],
            "not valid JSON",
        ),
        (
            vec!["--secrets-from".into(), "/nonexistent/s.json".into()],
            "--secrets-from /nonexistent/s.json",
        ),
        (
            vec!["--copy-in".into(), "/nonexistent/dir".into()],
            "--copy-in /nonexistent/dir: not a directory",
        ),
        (
            vec!["--copy-out".into(), full.display().to_string()],
            "directory is not empty",
        ),
        (
            vec![
                "--firecracker".into(),
                "/nonexistent/fc".into(),
                "--backend".into(),
                "firecracker".into(),
            ],
            "--firecracker /nonexistent/fc",
        ),
    ];
    for (args, needle) in cases {
        let out = vm
            .cmd(&guest)
            .args(&args)
            .args(["--", "true"])
            .output()
            .unwrap();
        one_line(&vm, &out, needle);
        assert!(
            !stderr(&out).contains("do-not-print-me"),
            "secret echoed: {}",
            stderr(&out)
        );
    }
    // No CMD at all.
    let out = vm.cmd(&guest).output().unwrap();
    one_line(&vm, &out, "CMD");
    // No VMM on PATH.
    let out = vm
        .cmd(&guest)
        .env("PATH", "/nonexistent")
        .args(["--", "true"])
        .output()
        .unwrap();
    one_line(&vm, &out, "no VMM binary");
}

#[test]
fn firecracker_refused_when_kvm_cannot_boot() {
    let guest = need_guest!();
    let fc = std::path::Path::new("/opt/sbx-firecracker/bin/firecracker");
    if !fc.exists() {
        skip!("Firecracker not installed (scripts/setup)");
    }
    let vm = Vm::new();
    let out = vm
        .cmd(&guest)
        .args(["--backend", "firecracker", "--firecracker"])
        .arg(fc)
        .args(["--", "true"])
        .output()
        .unwrap();
    let kvm_real = std::path::Path::new("/sys/module/kvm_intel").exists()
        || std::path::Path::new("/sys/module/kvm_amd").exists();
    if std::path::Path::new("/sys/module/kvm_pvm").exists() || !kvm_real {
        one_line(&vm, &out, "KVM cannot boot a guest here");
    }
}

/// A guest that never reports back (boot timeout) and a guest whose kernel
/// panics (no init in the initramfs): 125, one line, VMM gone, nothing left.
#[test]
fn guest_never_reports_back_or_panics() {
    let guest = need_guest!();
    let vm = Vm::new();
    let out = vm
        .cmd(&guest)
        .args(["--boot-timeout", "1s", "--", "true"])
        .output()
        .unwrap();
    one_line(&vm, &out, "did not report back within 1s");
    assert_event(&vm.audit, "vm_destroyed", "alert", |e| {
        e["error"]
            .as_str()
            .is_some_and(|s| s.contains("boot timeout"))
    });

    // An initramfs without /init: the kernel panics, QEMU exits (-no-reboot).
    let ird = vm.tmp.path().join("empty-initrd");
    std::fs::create_dir(&ird).unwrap();
    std::fs::create_dir(ird.join("nothing")).unwrap();
    let cpio = vm.tmp.path().join("empty.cpio");
    let st = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "cd {} && echo nothing | cpio --quiet -o -H newc > {}",
            ird.display(),
            cpio.display()
        ))
        .status()
        .unwrap();
    assert!(st.success());
    let out = vm
        .cmd(&guest)
        .arg("--initrd")
        .arg(&cpio)
        .args(["--boot-timeout", "300s", "--", "true"])
        .output()
        .unwrap();
    one_line(&vm, &out, "exited before the guest reported back");
}

/// SIGKILL of sbx-vm: the VMM dies with it (parent-death signal); the stale
/// run directory is removed by the next start.
#[test]
fn sigkill_of_sbx_vm_takes_the_vmm_and_next_run_reaps() {
    let guest = need_guest!();
    let vm = Vm::new();
    let mut child = vm
        .cmd(&guest)
        .args(["--", "sleep", "1000"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = wait_event(&vm.audit, Duration::from_secs(60), |e| {
        e["event"] == "vm_started"
    })
    .expect("vm_started");
    let vmm = started["vmm_pid"].as_i64().unwrap() as i32;
    // SAFETY: kill with integer arguments; the child is ours and not yet reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{vmm}")).exists()
        && !std::fs::read_to_string(format!("/proc/{vmm}/stat"))
            .unwrap_or_default()
            .contains(") Z")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "VMM {vmm} survived SIGKILL of sbx-vm"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Its run directory is stale now; the next start reaps it.
    let stale: Vec<_> = vm
        .bases()
        .iter()
        .flat_map(|b| std::fs::read_dir(b).unwrap().flatten())
        .collect();
    assert_eq!(stale.len(), 1, "the killed run's directory should be there");
    let out = vm
        .cmd(&guest)
        .args(["--boot-timeout", "1s", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 125);
    assert_event(&vm.audit, "vm_stale_reaped", "warn", |_| true);
    vm.assert_clean();
}

/// With stderr gone (and every log line too), bad input is still 125 with
/// nothing left. Neither needs a VMM: the flag and the guest's files are
/// refused before one starts.
#[test]
fn a_gone_stderr_keeps_bad_input_at_125() {
    let vm = Vm::new();
    let no_guest = vm.tmp.path().join("no-guest");
    for how in sbx_testutil::STDERR_GONE {
        for log in [None, Some("debug")] {
            for args in [&["--vcpus", "0"][..], &[]] {
                let mut c = vm.cmd(&no_guest);
                c.args(args).args(["--", "true"]).stdin(Stdio::null());
                if let Some(l) = log {
                    c.env("SBX_LOG", l);
                }
                sbx_testutil::stderr_gone(&mut c, how);
                let out = c.output().unwrap();
                assert_eq!(code(&out), 125, "{args:?} {how} {log:?}");
                assert_eq!(stdout(&out), "", "{args:?} {how} {log:?}");
                vm.assert_clean();
            }
        }
    }
}

/// The sbx-creds options' --ca-cert is read and checked with the other
/// flags: a file holding no usable certificate (or none at all: a FIFO,
/// /dev/zero) is one line naming it, 125, before any connection and any
/// VM (no guest or VMM needed).
#[test]
fn ca_cert_without_a_certificate_is_refused_before_any_request() {
    let vm = Vm::new();
    let no_guest = vm.tmp.path().join("no-guest");
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let addr = format!("https://{}", l.local_addr().unwrap());
    let empty = vm.tmp.path().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let fifo = vm.tmp.path().join("ca.fifo");
    mkfifo(&fifo);
    for (ca, why) in [
        (empty.as_path(), "empty"),
        (fifo.as_path(), "not a regular file (a FIFO)"),
        (std::path::Path::new("/dev/zero"), "not a regular file"),
    ] {
        let mut c = vm.cmd(&no_guest);
        c.env("VAULT_TOKEN", "t")
            .env_remove("VAULT_CACERT")
            .args(["--vault-addr", &addr, "--secret", "S=secret/x#k"])
            .arg("--ca-cert")
            .arg(ca)
            .args(["--", "true"]);
        let t0 = std::time::Instant::now();
        let out = output_within(&mut c, Duration::from_secs(30));
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert_usage_error(&out, &format!("--ca-cert {}: {why}", ca.display()));
        assert!(l.accept().is_err(), "{}: connected", ca.display());
        vm.assert_clean();
    }
}
