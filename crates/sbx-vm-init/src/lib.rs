//! sbx-vm-init: PID 1 of an sbx-vm guest, and the protocol it speaks with
//! the host.
//!
//! The binary is linked statically (glibc, no NSS) by `scripts/build-guest`
//! and placed as `/init` in the guest's initramfs (and as
//! `/sbin/sbx-vm-init` in the squashfs root). [`guest`] is the init,
//! [`proto`] the framing shared with the host side (`sbx-vm`), [`mmds`] the
//! Firecracker metadata client, [`sys`] the few raw syscalls.

pub mod guest;
pub mod mmds;
pub mod proto;
pub mod sys;

/// Modules in the initramfs, in load order (dependencies first). The init
/// loads only those its channel needs ([`modules_for`]): each load costs
/// tens of milliseconds under TCG.
pub const MODULES: &[&str] = &[
    "virtio_ring",
    "virtio",
    "virtio_mmio",
    "virtio_blk",
    "virtio_console",
    "squashfs",
    "overlay",
    "failover",
    "net_failover",
    "virtio_net",
    "vsock",
    "vmw_vsock_virtio_transport_common",
    "vmw_vsock_virtio_transport",
    "qemu_fw_cfg",
];

/// The modules to load: the block device, squashfs and overlay always; the
/// virtio-serial port on QEMU, fw_cfg when secrets come that way; the
/// network (MMDS) and vsock on Firecracker.
pub fn modules_for(vsock: bool, mmds: bool, fw_cfg: bool) -> Vec<&'static str> {
    modules_with_net(vsock, mmds, fw_cfg, false)
}

/// [`modules_for`], plus the network driver when the VM has a network
/// (`--net sbx-net`).
pub fn modules_with_net(vsock: bool, mmds: bool, fw_cfg: bool, net: bool) -> Vec<&'static str> {
    MODULES
        .iter()
        .copied()
        .filter(|m| match *m {
            "virtio_console" => !vsock,
            "failover" | "net_failover" | "virtio_net" => (vsock && mmds) || net,
            "vsock" | "vmw_vsock_virtio_transport_common" | "vmw_vsock_virtio_transport" => vsock,
            "qemu_fw_cfg" => fw_cfg,
            _ => true,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn module_selection() {
        let q = super::modules_for(false, false, false);
        assert!(
            q.contains(&"virtio_console") && !q.contains(&"vsock") && !q.contains(&"qemu_fw_cfg")
        );
        let f = super::modules_for(true, true, false);
        assert!(
            f.contains(&"virtio_net")
                && f.contains(&"vmw_vsock_virtio_transport")
                && !f.contains(&"virtio_console")
        );
        // Dependencies stay before their users.
        let pos = |m| f.iter().position(|x| *x == m).unwrap();
        assert!(
            pos("virtio_ring") < pos("virtio_net")
                && pos("vsock") < pos("vmw_vsock_virtio_transport")
        );
    }
}
