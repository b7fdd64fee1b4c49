//! Whether a directory's stat can vouch for its entries: the listings kept
//! while a directory's stat is unchanged (sbx-gitguard's dirlist, sbx-fs's
//! start-up walks) rely on the kernel moving a directory's ctime whenever
//! an entry is added, removed or renamed, and on nobody being able to set
//! a ctime back. Local file systems keep that promise; a network or FUSE
//! file system reports what its server says (a user can set it), and FAT
//! keeps no ctime of its own. So a listing is kept only on the file
//! systems below; anywhere else every scan lists again.

use std::os::fd::{AsRawFd, BorrowedFd};

/// ext2/3/4, XFS, Btrfs, F2FS, tmpfs, overlayfs (whose directories take
/// their stat from such layers), ZFS.
const HONEST: [i64; 7] = [
    0xEF53,      // ext2/3/4
    0x5846_5342, // XFS
    0x9123_683E, // Btrfs
    0xF2F5_2010, // F2FS
    0x0102_1994, // tmpfs
    0x794C_7630, // overlayfs
    0x2FC1_2FC1, // ZFS
];

/// [`ctime_vouches`] for `fd` on device `dev` (its `st_dev`), asked of
/// the kernel once per device in this process (a walk meets one or two).
pub fn ctime_vouches_on(dev: u64, fd: BorrowedFd<'_>) -> bool {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static SEEN: OnceLock<Mutex<HashMap<u64, bool>>> = OnceLock::new();
    let seen = SEEN.get_or_init(Default::default);
    if let Some(v) = seen.lock().ok().and_then(|m| m.get(&dev).copied()) {
        return v;
    }
    let v = ctime_vouches(fd);
    if let Ok(mut m) = seen.lock() {
        m.insert(dev, v);
    }
    v
}

/// Whether the file system of `fd` keeps honest directory ctimes (see the
/// module documentation). False when it cannot be told.
pub fn ctime_vouches(fd: BorrowedFd<'_>) -> bool {
    // SAFETY: statfs is plain integers: all-zero is a valid value.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs fills the live struct for an fd the caller keeps open.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut fs) } != 0 {
        return false;
    }
    #[allow(clippy::unnecessary_cast)]
    let t = fs.f_type as i64;
    HONEST.contains(&t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn the_temporary_directory_vouches_and_proc_does_not() {
        // (This machine's and CI's /tmp: ext4 or tmpfs.)
        let t = std::fs::File::open(std::env::temp_dir()).unwrap();
        assert!(ctime_vouches(t.as_fd()));
        let f = std::fs::File::open("/proc/self").unwrap();
        assert!(!ctime_vouches(f.as_fd()));
    }
}
