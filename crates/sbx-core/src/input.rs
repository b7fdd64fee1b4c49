//! Bounded reading of the files a user names on the command line: configs,
//! settings, allow and policy files, snapshots.
//!
//! A file is read only when it is a regular file (opened with O_NONBLOCK, so
//! a FIFO without a writer does not block the open, then checked with
//! fstat), only up to a size cap, and a pending SIGTERM/SIGINT/SIGHUP/SIGQUIT
//! (blocked by `run_main`, so it would otherwise wait) stops the read between
//! chunks. `--config /dev/zero`, a FIFO, a directory or a file over the cap
//! is therefore one error, never an endless read or a hang.
//!
//! The errors are `io::Error`s whose text says what is wrong, so a caller
//! keeps its own error type and the message it wraps them in (which names
//! the flag and the path).

use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Cap for JSON documents: `--config`, Claude Code settings, seccomp
/// policies, sbx-policy `--layers`, sbx-vm secrets (4 MiB).
pub const CONFIG_CAP: u64 = 4 << 20;
/// Cap for line lists: allow files of sbx-net and sbx-dnsproxy (16 MiB).
pub const LIST_CAP: u64 = 16 << 20;

/// Bytes read between two looks for a pending signal.
const CHUNK: u64 = 1 << 20;

/// What kind of file `ft` is, for a message ("a FIFO", "a directory").
pub fn kind_of(ft: &std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "a directory"
    } else if ft.is_symlink() {
        "a symlink"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "a regular file"
    }
}

/// The kernel-interface file systems whose "regular" files are no data:
/// reading one may block or consume (/proc/kmsg, a tracefs pipe), writing
/// one changes the kernel. (magic from linux/magic.h, name)
const KERNEL_FS: &[(u32, &str)] = &[
    (0x9fa0, "procfs"),
    (0x6265_6572, "sysfs"),
    (0x6462_6720, "debugfs"),
    (0x7472_6163, "tracefs"),
    (0x7363_6673, "securityfs"),
    (0x0027_e0eb, "cgroupfs"),
    (0x6367_7270, "cgroup2fs"),
    (0xcafe_4a11, "bpffs"),
    (0x6265_6570, "configfs"),
    (0xde5e_81e4, "efivarfs"),
    (0x6165_676c, "pstore"),
    (0xf97c_ff8c, "selinuxfs"),
    (0x4341_5d53, "smackfs"),
    (0x6573_5543, "fusectl"),
    (0x4249_4e4d, "binfmt_misc"),
    (0x6e73_6673, "nsfs"),
    (0x1980_0202, "mqueue"),
    (0x0904_1934, "anon_inodefs"),
    (0x5049_5045, "pipefs"),
    (0x534f_434b, "sockfs"),
    (0x1cd1, "devpts"),
    (0x6759_6969, "rpc_pipefs"),
];

/// The name of the kernel-interface file system `fd` is on (procfs, sysfs,
/// debugfs, cgroupfs...), None for a file system that holds data (or when
/// fstatfs fails: the caller's other checks still apply).
pub fn kernel_fs(fd: std::os::fd::RawFd) -> Option<&'static str> {
    // SAFETY: statfs is plain integers: all-zero is a valid value.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs fills the live struct; a bad fd is an error return.
    if unsafe { libc::fstatfs(fd, &mut fs) } != 0 {
        return None;
    }
    // The magic numbers are 32-bit; f_type's width varies by target.
    let magic = fs.f_type as u32;
    KERNEL_FS.iter().find(|(m, _)| *m == magic).map(|(_, n)| *n)
}

/// Reads the regular file `path` whole, at most `cap` bytes.
pub fn read_regular(path: &Path, cap: u64) -> io::Result<Vec<u8>> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let m = f.metadata()?;
    let ft = m.file_type();
    if !ft.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not a regular file ({})", kind_of(&ft)),
        ));
    }
    // Files of /proc say size 0 and some block or consume (/proc/kmsg);
    // sysfs, debugfs and the like are kernel interfaces too: none is an
    // input.
    if let Some(fs) = kernel_fs(std::os::fd::AsRawFd::as_raw_fd(&f)) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a file of {fs} (not an input)"),
        ));
    }
    if m.len() > cap {
        return Err(too_large(cap));
    }
    let mut out = Vec::with_capacity(m.len() as usize);
    let mut f = f;
    loop {
        if let Some(sig) = crate::signals::pending_termination() {
            return Err(io::Error::new(
                io::ErrorKind::Interrupted,
                format!("reading stopped by signal {sig}"),
            ));
        }
        // Straight into `out` (no bounce buffer), a chunk at a time so a
        // signal is seen between chunks.
        let n = (&mut f).take(CHUNK).read_to_end(&mut out)?;
        if n == 0 {
            break;
        }
        // The file may grow while it is read.
        if out.len() as u64 > cap {
            return Err(too_large(cap));
        }
    }
    Ok(out)
}

/// [`read_regular`] as UTF-8 text.
pub fn read_regular_string(path: &Path, cap: u64) -> io::Result<String> {
    String::from_utf8(read_regular(path, cap)?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text"))
}

fn too_large(cap: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("larger than the cap of {}", crate::units::human_bytes(cap)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn refuses_what_is_not_a_bounded_regular_file() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let big = d.path().join("big");
        std::fs::write(&big, vec![b'x'; 1025]).unwrap();
        let t0 = Instant::now();
        for (p, want) in [
            (Path::new("/dev/zero"), "character device"),
            (fifo.as_path(), "FIFO"),
            (d.path(), "directory"),
            (big.as_path(), "larger than the cap of 1 KiB"),
        ] {
            let e = read_regular(p, 1024).unwrap_err();
            assert!(e.to_string().contains(want), "{}: {e}", p.display());
        }
        for (p, want) in [
            ("/proc/self/status", "a file of procfs"),
            ("/sys/kernel/uevent_seqnum", "a file of sysfs"),
        ] {
            if Path::new(p).exists() {
                let e = read_regular(Path::new(p), 1024).unwrap_err();
                assert!(e.to_string().contains(want), "{p}: {e}");
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(2));
        std::fs::write(&big, b"ok").unwrap();
        assert_eq!(read_regular_string(&big, 1024).unwrap(), "ok");
        assert!(
            read_regular(&d.path().join("none"), 1).unwrap_err().kind() == io::ErrorKind::NotFound
        );
    }
}
