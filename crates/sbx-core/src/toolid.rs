//! Which programs are the real sbx tools: decided by file identity (device
//! and inode), never by name.
//!
//! A next program that is an sbx tool receives things the sandboxed command
//! must never hold: the writable audit log fd (`SBX_AUDIT_FD`), a host-side
//! exec before `pivot_root` (sbx-fs), the supervisor pid to watch. A program
//! called `./sbx-x` inside the sandbox must get none of them, so the test is
//! "is this open file one of the installed tool binaries?":
//!
//! - the set is the (dev, ino) of `/proc/self/exe` and of the files named in
//!   [`TOOLS`] beside it, recorded at start-up ([`init`], from
//!   `audit::init`), before any namespace or root change;
//! - a tool that hands the audit fd on also hands this set on (`SBX_TOOL_IDS`),
//!   so a tool that runs inside the new root (where its siblings may not be
//!   visible, or where a writable directory could hold look-alikes) trusts
//!   exactly what the first tool trusted on the host;
//! - the caller opens the next program once, checks the open file, and
//!   executes that same file (`execveat`, or `/proc/self/fd/N` for a spawned
//!   child): no window in which the path could be swapped.
//!
//! `SBX_TOOL_IDS` from the environment is believed: only the caller of the
//! first tool or a trusted tool sets it. A sandboxed program can set it for
//! tools it runs itself, but those hold nothing it does not already hold.

use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::OnceLock;

/// The file names of the sbx tools that take part in a chain.
pub const TOOLS: &[&str] = &[
    "sbx-audit",
    "sbx-cgroup",
    "sbx-container",
    "sbx-creds",
    "sbx-dnsproxy",
    "sbx-fs",
    "sbx-gitguard",
    "sbx-gvisor",
    "sbx-net",
    "sbx-path",
    "sbx-policy",
    "sbx-seccomp",
    "sbx-vm",
    "sbx-wasm",
];

/// The trusted set handed from tool to tool: `dev:ino` pairs, comma-separated.
pub const ENV: &str = "SBX_TOOL_IDS";

/// A file's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
}

static SET: OnceLock<Vec<FileId>> = OnceLock::new();

/// Records the trusted set (once). Call at start-up, before any namespace,
/// mount or root change; [`is_tool`] calls it too, for tools that never did.
pub fn init() {
    let _ = set();
}

fn set() -> &'static [FileId] {
    SET.get_or_init(|| {
        let from_env = std::env::var_os(ENV);
        // SAFETY: read at start-up, single-threaded; it is passed on only
        // explicitly, to a next tool.
        unsafe { std::env::remove_var(ENV) };
        let mut ids = Vec::new();
        if let Some(v) = from_env.as_deref().and_then(parse) {
            ids = v;
        } else {
            ids.extend(beside_own_exe());
        }
        ids.extend(own_exe());
        ids.sort();
        ids.dedup();
        ids
    })
}

fn parse(v: &OsStr) -> Option<Vec<FileId>> {
    let s = std::str::from_utf8(v.as_bytes()).ok()?;
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (d, i) = p.split_once(':')?;
            Some(FileId {
                dev: d.parse().ok()?,
                ino: i.parse().ok()?,
            })
        })
        .collect()
}

fn own_exe() -> Option<FileId> {
    let f = open_path(Path::new("/proc/self/exe")).ok()?;
    id_of(f.as_fd())
}

fn beside_own_exe() -> Vec<FileId> {
    let Ok(exe) = std::fs::read_link("/proc/self/exe") else {
        return Vec::new();
    };
    let Some(dir) = exe.parent() else {
        return Vec::new();
    };
    TOOLS
        .iter()
        .filter_map(|n| {
            let f = open_path(&dir.join(n)).ok()?;
            id_of(f.as_fd())
        })
        .collect()
}

/// The identity of an open regular file (None for anything else).
pub fn id_of(fd: BorrowedFd<'_>) -> Option<FileId> {
    // SAFETY: libc::stat is plain integers: all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on a borrowed, open fd into a local buffer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return None;
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return None;
    }
    Some(FileId {
        dev: st.st_dev,
        ino: st.st_ino,
    })
}

/// Whether the open file `fd` is one of the trusted sbx tool binaries.
pub fn is_tool(fd: BorrowedFd<'_>) -> bool {
    id_of(fd).is_some_and(|id| set().binary_search(&id).is_ok())
}

/// Opens `path` as an exec handle (`O_PATH`, close-on-exec).
pub fn open_path(path: &Path) -> std::io::Result<OwnedFd> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a NUL-terminated path; the returned fd is owned below.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The value of [`ENV`] for a next tool.
pub fn env_value() -> String {
    set()
        .iter()
        .map(|i| format!("{}:{}", i.dev, i.ino))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_ids() {
        assert_eq!(
            parse(OsStr::new("1:2,3:4")),
            Some(vec![FileId { dev: 1, ino: 2 }, FileId { dev: 3, ino: 4 }])
        );
        assert_eq!(parse(OsStr::new("1:x")), None);
        assert_eq!(parse(OsStr::new("")), Some(vec![]));
    }

    #[test]
    fn own_exe_is_trusted_a_copy_is_not() {
        let me = open_path(Path::new("/proc/self/exe")).unwrap();
        assert!(is_tool(me.as_fd()));
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("sbx-seccomp");
        std::fs::copy("/proc/self/exe", &copy).unwrap();
        let c = open_path(&copy).unwrap();
        assert!(!is_tool(c.as_fd()));
    }
}
