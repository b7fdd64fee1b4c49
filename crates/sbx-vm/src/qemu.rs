//! The QEMU microvm command line.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::options::{Plan, Vmm};

/// TSC frequency (kHz) for `tsc_early_khz=`: microvm has no timer to
/// calibrate the TSC against, and the kernel hangs without it.
pub fn tsc_khz() -> u64 {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    info.lines()
        .find(|l| l.starts_with("cpu MHz"))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|mhz| (mhz * 1000.0) as u64)
        .filter(|k| *k > 0)
        .unwrap_or(2_000_000)
}

pub fn kernel_cmdline(extra: &str) -> String {
    format!(
        "console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init tsc_early_khz={} nokaslr i8042.noaux {extra}",
        tsc_khz()
    )
}

/// The command that starts QEMU for `plan`: the control channel connects to
/// `chan` (sbx-vm listens), the console goes to `console`, the secrets
/// document (if any) is `secrets`.
pub fn command(
    plan: &Plan,
    chan: &Path,
    console: &Path,
    log: &Path,
    secrets: Option<&Path>,
) -> std::io::Result<Command> {
    let kvm = matches!(plan.vmm, Vmm::Qemu { kvm: true });
    let mut c = Command::new(&plan.vmm_bin);
    // Nothing of sbx-vm's environment (which may hold --secret-env values).
    c.env_clear();
    c.args(["-M", "microvm,rtc=on,acpi=on"]);
    c.args(["-accel", if kvm { "kvm" } else { "tcg" }]);
    c.args(["-cpu", if kvm { "host" } else { "max" }]);
    c.arg("-m").arg(format!("{}M", plan.mem >> 20));
    c.arg("-smp").arg(plan.vcpus.to_string());
    c.args([
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
    ]);
    c.args([
        "-sandbox",
        "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
    ]);
    c.arg("-kernel").arg(&plan.files.kernel);
    c.arg("-initrd").arg(&plan.files.initrd);
    c.arg("-append").arg(kernel_cmdline(&format!(
        "sbx.chan=virtio-serial{}{}",
        if secrets.is_some() { " sbx.fwcfg" } else { "" },
        if plan.net { " sbx.net=slirp" } else { "" }
    )));
    c.arg("-serial").arg(format!("file:{}", console.display()));
    c.arg("-drive").arg(format!(
        "id=root,file={},format=raw,if=none,readonly=on",
        plan.files.rootfs.display()
    ));
    c.args(["-device", "virtio-blk-device,drive=root"]);
    c.arg("-chardev")
        .arg(format!("socket,id=sbx0,path={}", chan.display()));
    c.args(["-device", "virtio-serial-device,max_ports=2"]);
    c.args([
        "-device",
        &format!(
            "virtserialport,chardev=sbx0,name={}",
            sbx_vm_init::proto::PORT_NAME
        ),
    ]);
    if plan.net {
        // User-mode networking: the guest's connections become sockets of
        // this QEMU process, in sbx-net's namespace, where its NAT rules send
        // every one of them to the allowlisting gateway.
        c.args([
            "-netdev",
            "user,id=n0,ipv6=off",
            "-device",
            "virtio-net-device,netdev=n0",
        ]);
    }
    if let Some(s) = secrets {
        c.arg("-fw_cfg")
            .arg(format!("name=opt/sbx/secrets,file={}", s.display()));
    }
    c.stdin(Stdio::null()).stdout(Stdio::null());
    c.stderr(Stdio::from(std::fs::File::create(log)?));
    Ok(c)
}
