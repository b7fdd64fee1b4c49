//! Whether KVM can boot a Linux guest on this host.
//!
//! /dev/kvm existing is not enough: kvm_pvm (a software hypervisor) lets
//! VMMs start but boots no Linux guest. KVM counts as usable when /dev/kvm
//! opens read-write, KVM_GET_API_VERSION answers 12, and the hypervisor
//! module is kvm_intel or kvm_amd.

use std::path::Path;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvmState {
    pub usable: bool,
    pub reason: String,
}

const KVM_GET_API_VERSION: libc::c_ulong = 0xAE00;

pub fn probe() -> KvmState {
    probe_at(Path::new("/dev/kvm"), Path::new("/sys/module"))
}

pub fn probe_at(dev: &Path, modules: &Path) -> KvmState {
    let no = |r: String| KvmState {
        usable: false,
        reason: r,
    };
    let f = match std::fs::OpenOptions::new().read(true).write(true).open(dev) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return no(format!("no {}", dev.display()));
        }
        Err(e) => return no(format!("cannot open {}: {e}", dev.display())),
    };
    use std::os::fd::AsRawFd;
    // SAFETY: f keeps /dev/kvm open; KVM_GET_API_VERSION takes no pointer.
    let v = unsafe { libc::ioctl(f.as_raw_fd(), KVM_GET_API_VERSION as _, 0) };
    if v != 12 {
        return no(format!("{}: KVM_GET_API_VERSION gave {v}", dev.display()));
    }
    if modules.join("kvm_pvm").exists() {
        return no("kvm_pvm: a software hypervisor that boots no Linux guest".into());
    }
    for m in ["kvm_intel", "kvm_amd"] {
        if modules.join(m).exists() {
            return KvmState {
                usable: true,
                reason: m.to_string(),
            };
        }
    }
    no("neither kvm_intel nor kvm_amd is loaded".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_device() {
        let s = probe_at(Path::new("/nonexistent/kvm"), Path::new("/sys/module"));
        assert!(!s.usable);
        assert!(s.reason.contains("no /nonexistent/kvm"));
    }
}
