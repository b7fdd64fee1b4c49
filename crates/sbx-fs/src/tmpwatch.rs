//! Noticing a full /tmp: the sandbox's /tmp is a size-limited tmpfs, so
//! filling it cannot hurt the host, but an agent filling it is worth an
//! alert. The outer sbx-fs holds an O_PATH fd of the tmpfs (handed over by
//! init) and checks fstatfs every [`INTERVAL`] plus once at the end. A
//! fill-and-delete faster than the interval is still bounded by the size,
//! but may not be logged.

use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use sbx_core::{Severity, audit};

/// How often the free space is looked at.
pub const INTERVAL: Duration = Duration::from_millis(200);
/// "Full": less free space than this (a write larger than what is left
/// fails with ENOSPC).
pub const FULL_BELOW: u64 = 64 * 1024;

const TMPFS_MAGIC: libc::c_long = 0x0102_1994;

pub struct TmpWatch {
    fd: OwnedFd,
    size: u64,
    alerted: bool,
}

impl TmpWatch {
    pub fn new(fd: OwnedFd, size: u64) -> TmpWatch {
        TmpWatch {
            fd,
            size,
            alerted: false,
        }
    }

    /// Checks once; emits `tmp_full` the first time it is full.
    pub fn check(&mut self) {
        if self.alerted {
            return;
        }
        // SAFETY: libc::statfs is plain integers: all-zero is a valid value.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: self.fd is open; st is a live statfs for the kernel to fill.
        if unsafe { libc::fstatfs(self.fd.as_raw_fd(), &mut st) } != 0 {
            return;
        }
        // Only the sandbox's own tmpfs (a user bind over /tmp is not ours
        // to report on).
        if st.f_type != TMPFS_MAGIC {
            self.alerted = true;
            return;
        }
        let free = st.f_bavail * st.f_bsize as u64;
        if free < FULL_BELOW.min(self.size / 2) || st.f_bavail == 0 {
            self.alerted = true;
            audit::emit(
                "tmp_full",
                Severity::Alert,
                serde_json::json!({
                    "path": "/tmp",
                    "size": self.size,
                    "free": free,
                }),
            );
        }
    }
}
