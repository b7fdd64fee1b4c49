//! End-to-end on QEMU microvm (TCG here): each test boots the real guest
//! built by scripts/build-guest. Boots cost seconds, so each test checks
//! several promises per boot.

mod common;

use std::io::Write;
use std::process::Stdio;
use std::time::Duration;

use common::*;

/// `echo hello`, stdin, stdout/stderr, exit status 42, the guest audit log on
/// the host, --copy-in/--copy-out, --env; nothing left (root and the
/// unprivileged user).
#[test]
fn hello_stdio_status_audit_copy() {
    let guest = need_guest!();
    for who in identities() {
        let vm = Vm::new();
        let src = vm.tmp.path().join("src");
        std::fs::create_dir(&src).unwrap();
        std::fs::write(src.join("input.txt"), "from-the-host\n").unwrap();
        let out_dir = vm.tmp.path().join("out");
        chown_to_test_user(&src);
        chown_to_test_user(&src.join("input.txt"));
        let mut c = vm.cmd(&guest);
        c.arg("--copy-in")
            .arg(&src)
            .arg("--copy-out")
            .arg(&out_dir)
            .args(["--env", "GREETING=hi-there", "--"])
            .args([
                "sh",
                "-c",
                "echo hello; cat; cat input.txt; echo \"$GREETING\"; echo to-stderr >&2; \
                 echo result > made-in-guest.txt; exit 42",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        run_as(&mut c, who);
        let mut child = c.spawn().unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"through-stdin\n")
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let so = stdout(&out);
        assert_eq!(
            code(&out),
            42,
            "{who:?} stdout {so} stderr {}",
            stderr(&out)
        );
        assert_eq!(
            so, "hello\nthrough-stdin\nfrom-the-host\nhi-there\n",
            "{who:?}"
        );
        assert!(stderr(&out).contains("to-stderr"), "{}", stderr(&out));
        // The result came back.
        assert_eq!(
            std::fs::read_to_string(out_dir.join("made-in-guest.txt")).unwrap(),
            "result\n"
        );
        // Backend choice and reason; the guest's own events, marked.
        assert_event(&vm.audit, "vm_backend_selected", "info", |e| {
            e["backend"] == "qemu" && e["accel"].is_string() && e["reason"].is_string()
        });
        let host = assert_event(&vm.audit, "vm_started", "info", |_| true);
        let g = assert_event(&vm.audit, "guest_command_exited", "info", |e| {
            e["code"] == 42
        });
        assert_eq!(g["guest"], true);
        assert_eq!(g["tool"], "sbx-vm-init");
        assert_eq!(g["sbx_id"], host["sbx_id"]);
        assert_event(&vm.audit, "guest_root_mounted", "info", |_| true);
        assert_event(&vm.audit, "vm_destroyed", "info", |e| {
            e["exit"] == 42 && e["guest_audit_lines"].as_u64() >= Some(4)
        });
        vm.assert_clean();
    }
}

/// The root filesystem is read-only (the squashfs device refuses writes);
/// a file written to / or /tmp is gone in the next run; exit status by
/// signal (137) and 1 pass through.
#[test]
fn readonly_root_and_fresh_writable_layer() {
    let guest = need_guest!();
    let vm = Vm::new();
    let first = vm
        .cmd(&guest)
        .args(["--", "sh", "-c"])
        .arg(
            "echo x > /written || exit 3; echo y > /tmp/written || exit 3; \
             if dd if=/dev/zero of=/dev/vda bs=512 count=1 2>/dev/null; then exit 4; fi; \
             mkdir -p /mnt/again && mount -t squashfs -o ro /dev/vda /mnt/again || exit 5; \
             if touch /mnt/again/probe 2>/dev/null; then exit 6; fi; \
             grep -q '^overlay / overlay' /proc/mounts || exit 7; \
             kill -9 $$",
        )
        .output()
        .unwrap();
    assert_eq!(code(&first), 137, "stderr: {}", stderr(&first));
    assert_event(&vm.audit, "guest_command_exited", "warn", |e| {
        e["signal"] == 9
    });
    // Also: megabytes through stdin and back through stdout, intact (the
    // relay's back-pressure in both directions).
    let big: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let mut child = vm
        .cmd(&guest)
        .args([
            "--",
            "sh",
            "-c",
            "test -e /written && exit 10; test -e /tmp/written && exit 11; cat; exit 1",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let feed = big.clone();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&feed);
    });
    let second = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert!(
        second.stdout == big,
        "stdout differs from stdin ({} vs {} bytes)",
        second.stdout.len(),
        big.len()
    );
    assert_eq!(code(&second), 1, "stderr: {}", stderr(&second));
    vm.assert_clean();
}

/// A secret is in the command's environment and nowhere on the guest's
/// filesystem (fw_cfg unloaded), not in the audit log, not left on the host.
#[test]
fn secret_in_environment_only() {
    let guest = need_guest!();
    let vm = Vm::new();
    let value = "s3cr3t-v4lue-for-sbx-vm";
    let doc = vm.tmp.path().join("secrets.json");
    std::fs::write(
        &doc,
        format!(r#"{{"version":1,"env":{{"SBX_T_SECRET":"{value}"}}}}"#),
    )
    .unwrap();
    let script = format!(
        "echo \"env=$SBX_T_SECRET\"; echo \"env2=$SBX_T_OTHER\"; \
         test -e /sys/firmware/qemu_fw_cfg && echo fw_cfg-still-there; \
         for d in /etc /root /tmp /run /work /var /mnt /dev/shm /sys/firmware; do \
           grep -rqs {value} $d && echo found-in-$d; done; \
         grep -qs {value} /proc/1/environ && echo found-in-init-environ; \
         exit 0"
    );
    let out = vm
        .cmd(&guest)
        .arg("--secrets-from")
        .arg(&doc)
        .env("SBX_T_OTHER", "from-sbx-creds-in-front")
        .args(["--secret-env", "SBX_T_OTHER"])
        .args(["--", "sh", "-c", &script])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "stderr: {}", stderr(&out));
    let so = stdout(&out);
    assert_eq!(
        so.trim(),
        format!("env={value}\nenv2=from-sbx-creds-in-front"),
        "leaked: {so}"
    );
    let log = std::fs::read_to_string(&vm.audit).unwrap();
    assert!(!log.contains(value), "secret value in the audit log");
    assert_event(&vm.audit, "vm_guest_ready", "info", |e| {
        e["secrets"] == serde_json::json!(["SBX_T_OTHER", "SBX_T_SECRET"])
            && e["secrets_source"] == "fw_cfg"
    });
    vm.assert_clean();
}

/// --timeout kills a hanging command and the VM: exit 124, an alert, the
/// guest audit log still exported; nothing left.
#[test]
fn timeout_kills_hanging_guest() {
    let guest = need_guest!();
    let vm = Vm::new();
    let out = vm
        .cmd(&guest)
        .args(["--timeout", "2s", "--", "sleep", "1000"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 124, "stderr: {}", stderr(&out));
    assert_event(&vm.audit, "vm_timeout", "alert", |_| true);
    assert_event(&vm.audit, "guest_command_exited", "warn", |e| {
        e["signal"] == 9
    });
    vm.assert_clean();
}

/// SIGTERM to sbx-vm reaches the command in the guest (143), the audit log
/// is still exported; nothing left.
#[test]
fn sigterm_is_forwarded_and_audit_exported() {
    let guest = need_guest!();
    let vm = Vm::new();
    let child = vm
        .cmd(&guest)
        .args(["--", "sleep", "1000"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ready = wait_event(&vm.audit, Duration::from_secs(120), |e| {
        e["event"] == "vm_guest_ready"
    });
    assert!(ready.is_some(), "guest never got ready");
    // SAFETY: kill with integer arguments; the child is ours and not yet reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(code(&out), 143, "stderr: {}", stderr(&out));
    assert_event(&vm.audit, "guest_command_exited", "warn", |e| {
        e["signal"] == 15
    });
    vm.assert_clean();
}

/// An sbx chain inside the guest (`sbx-vm -- sbx-seccomp -- CMD`): the tool
/// runs under the guest kernel, gets the guest audit log's fd, and its
/// events reach the host's audit log, marked as from the guest. Builds its
/// own guest (with the sbx tools this workspace built) once.
#[test]
fn sbx_chain_inside_the_guest() {
    let _ = need_guest!();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let built = ["release", "debug"]
        .iter()
        .any(|p| root.join("target").join(p).join("sbx-seccomp").exists());
    if !built {
        skip!("sbx-seccomp not built (cargo build -p sbx-seccomp)");
    }
    if !is_root() {
        skip!("building a guest needs root (the kernel cache)");
    }
    let vm = Vm::new();
    let gdir = vm.tmp.path().join("guest");
    let st = std::process::Command::new(root.join("scripts/build-guest"))
        .arg(&gdir)
        .output()
        .unwrap();
    assert!(st.status.success(), "build-guest: {}", stderr(&st));
    // A build that takes minutes says which step it is in.
    for n in 1..=5 {
        assert!(
            stderr(&st).contains(&format!("build-guest: [{n}/5] ")),
            "no progress line {n}: {}",
            stderr(&st)
        );
    }
    let out = vm
        .cmd(&gdir)
        .args(["--", "sbx-seccomp", "--", "sh", "-c", "echo inside; exit 3"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 3, "stderr: {}", stderr(&out));
    assert_eq!(stdout(&out), "inside\n");
    let e = assert_event(&vm.audit, "seccomp_applied", "info", |e| e["guest"] == true);
    assert_eq!(e["tool"], "sbx-seccomp");
    let host = assert_event(&vm.audit, "vm_started", "info", |_| true);
    assert_eq!(e["sbx_id"], host["sbx_id"]);
    vm.assert_clean();
}

/// `sbx-net ... -- sbx-vm --net sbx-net -- CMD`: the VM's only way out is
/// QEMU's user-mode network inside sbx-net's namespace, so a connection
/// from the guest to an address not on the allowlist is denied by sbx-net's
/// gateway (alert), and so is a DNS name not on it; outside sbx-net the flag
/// is refused.
#[test]
fn net_through_sbx_net_gateway() {
    let guest = need_guest!();
    let net = bin("sbx-vm").with_file_name("sbx-net");
    if !net.exists() {
        skip!("sbx-net not built (cargo build -p sbx-net)");
    }
    let vm = Vm::new();
    let mut c = std::process::Command::new(&net);
    c.env("TMPDIR", vm.tmp.path().join("t"))
        .env("SBX_VM_GUEST_DIR", &guest)
        .env_remove("SBX_ID")
        .env_remove("SBX_AUDIT_FD")
        .env_remove("SBX_AUDIT_LOG")
        .arg("--audit-log")
        .arg(&vm.audit)
        .arg("--")
        .arg(bin("sbx-vm"))
        .args(["--backend", "qemu", "--memory", "256M", "--net", "sbx-net", "--", "sh", "-c"])
        .arg(
            "cat /etc/resolv.conf; \\
             echo \"bytes=$(printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 192.0.2.1 80 2>/dev/null | wc -c)\"; \\
             nslookup blocked.example 2>/dev/null | grep -q '^Name:' && echo resolved; exit 0",
        );
    let _ = std::fs::create_dir_all(vm.tmp.path().join("t"));
    let out = c.output().unwrap();
    assert_eq!(code(&out), 0, "stderr: {}", stderr(&out));
    let so = stdout(&out);
    assert!(so.contains("nameserver 10.0.2.3"), "{so}");
    // The gateway closes a denied connection: not a byte comes back.
    assert!(so.contains("bytes=0"), "{so}");
    assert!(!so.contains("resolved"), "{so}");
    assert_event(&vm.audit, "net_denied", "alert", |e| {
        e["dst"] == "192.0.2.1" && e["port"] == 80
    });
    assert_event(&vm.audit, "dns_refused", "alert", |e| {
        e["name"] == "blocked.example"
    });
    assert_event(&vm.audit, "guest_net_configured", "info", |e| {
        e["guest"] == true
    });
    vm.assert_clean();

    // Outside sbx-net: refused, nothing started.
    let out = vm
        .cmd(&guest)
        .args(["--net", "sbx-net", "--", "true"])
        .output()
        .unwrap();
    assert_usage_error(&out, "not inside sbx-net's network namespace");
}
