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
    if m.len() > cap {
        return Err(too_large(cap));
    }
    // Files of /proc say size 0 and some block or consume (/proc/kmsg):
    // none is an input.
    // SAFETY: statfs is plain integers: all-zero is a valid value.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs fills the live struct for an fd that f keeps open.
    if unsafe { libc::fstatfs(std::os::fd::AsRawFd::as_raw_fd(&f), &mut fs) } == 0
        && fs.f_type == libc::PROC_SUPER_MAGIC
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a file of /proc (not an input)",
        ));
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
        format!("larger than the cap of {}", human(cap)),
    )
}

fn human(n: u64) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else {
        format!("{n} bytes")
    }
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
            (big.as_path(), "larger than the cap of 1024 bytes"),
        ] {
            let e = read_regular(p, 1024).unwrap_err();
            assert!(e.to_string().contains(want), "{}: {e}", p.display());
        }
        assert!(t0.elapsed() < Duration::from_secs(2));
        std::fs::write(&big, b"ok").unwrap();
        assert_eq!(read_regular_string(&big, 1024).unwrap(), "ok");
        assert!(
            read_regular(&d.path().join("none"), 1).unwrap_err().kind() == io::ErrorKind::NotFound
        );
    }
}
