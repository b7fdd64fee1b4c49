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

/// Modules loaded from the initramfs, in this order (dependencies first).
/// A module that is absent or fails to load is skipped (e.g. qemu_fw_cfg
/// under Firecracker, which has no fw_cfg).
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
