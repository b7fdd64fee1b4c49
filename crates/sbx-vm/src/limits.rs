//! What the guest can carry, checked before anything is created (no VM
//! boots for input that would fail in it):
//!
//! - the command's environment and arguments: the guest kernel's execve
//!   limits (no NUL byte in a value, one `NAME=VALUE` at most
//!   `MAX_ARG_STRLEN`, all of them at most a quarter of the 8 MiB stack
//!   rlimit the guest init keeps);
//! - the run spec (argv and --setenv): one control-channel frame;
//! - the --copy-in tree: it is extracted into the guest's tmpfs, which holds
//!   `--tmpfs` bytes and, as tmpfs does by default, one inode per two pages
//!   of the guest's RAM. The tree is walked without following a symlink or
//!   opening anything but its directories (a FIFO, a device or a socket in
//!   it is an entry, never read), the walk stops at the first limit passed,
//!   and the archive sent later is capped at what was checked.

use std::collections::HashSet;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use sbx_core::exit::Failure;
use sbx_vm_init::proto::{MAX_FRAME, Spec};

/// Linux's MAX_ARG_STRLEN: one argument or `NAME=VALUE`, its NUL included.
pub const MAX_ARG_STRLEN: u64 = 32 * 4096;
/// What execve takes in all (strings with their NULs, and the pointers to
/// them): a quarter of the stack rlimit, 8 MiB in the guest.
pub const MAX_EXEC_BYTES: u64 = 2 << 20;
/// Kept back for what the guest adds to the command: SBX_ID, SBX_AUDIT_FD,
/// the program's path, a script's interpreter.
const EXEC_RESERVE: u64 = 8 << 10;
/// The guest's PATH_MAX: the longest name busybox tar can create.
const PATH_MAX: usize = 4096;
/// Inodes of the guest's tmpfs the guest itself uses (overlay upper and
/// work directories, /work, what the command creates first).
const INODE_RESERVE: u64 = 64;
/// RAM the guest keeps for itself beyond what the kernel reserves.
const GUEST_HEADROOM: u64 = 32 << 20;

pub use sbx_core::units::human_bytes as human;

/// Why the guest cannot put `value` into the command's environment as
/// `name` (never quoting the value: it may be a secret).
pub fn env_value_problem(name: &str, value: &str) -> Option<String> {
    if value.contains('\0') {
        return Some(
            "the value contains a NUL byte (an environment variable cannot hold one)".into(),
        );
    }
    let n = name.len() as u64 + 1 + value.len() as u64 + 1;
    (n > MAX_ARG_STRLEN).then(|| {
        format!(
            "NAME=VALUE is {}, over the guest kernel's limit of {} for one environment string",
            human(n),
            human(MAX_ARG_STRLEN)
        )
    })
}

/// Why `name` cannot be an environment variable's name in the guest.
pub fn env_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("the name is empty")
    } else if name.contains('=') {
        Some("the name contains '='")
    } else if name.contains('\0') {
        Some("the name contains a NUL byte")
    } else {
        None
    }
}

/// The (name, value) pairs of a secrets document's `env` object.
fn doc_env(doc: Option<&str>) -> Vec<(String, String)> {
    let Some(doc) = doc else {
        return Vec::new();
    };
    let v: serde_json::Value = serde_json::from_str(doc).unwrap_or_default();
    let mut out = Vec::new();
    if let Some(m) = v.get("env").and_then(|e| e.as_object()) {
        for (k, val) in m {
            out.push((k.clone(), val.as_str().unwrap_or_default().to_string()));
        }
    }
    out
}

/// Checks every secret of `doc` (its `env` object) and that CMD, the
/// environment and the secrets together fit in one execve in the guest.
/// `origin` names where the secrets came from, for the message.
pub fn check_exec(
    argv: &[String],
    env: &[(String, String)],
    doc: Option<&str>,
    origin: &str,
) -> Result<(), Failure> {
    let mut secrets = doc_env(doc);
    let res = (|| {
        for (k, v) in &secrets {
            if let Some(why) = env_name_problem(k) {
                return Err(Failure::new(format!("{origin}: env.{k}: {why}")));
            }
            if let Some(why) = env_value_problem(k, v) {
                return Err(Failure::new(format!("{origin}: env.{k}: {why}")));
            }
        }
        for (k, v) in env {
            if let Some(why) = env_value_problem(k, v) {
                return Err(Failure::new(format!("--setenv {k}: {why}")));
            }
        }
        for a in argv {
            if a.contains('\0') || a.len() as u64 + 1 > MAX_ARG_STRLEN {
                return Err(Failure::new(format!(
                    "CMD: an argument of {} is over the guest kernel's limit of {} for one argument",
                    human(a.len() as u64 + 1),
                    human(MAX_ARG_STRLEN)
                )));
            }
        }
        let ptr = std::mem::size_of::<usize>() as u64;
        let cost = |k: &str, v: &str| k.len() as u64 + v.len() as u64 + 2 + ptr;
        let plain: u64 = argv.iter().map(|a| a.len() as u64 + 1 + ptr).sum::<u64>()
            + env.iter().map(|(k, v)| cost(k, v)).sum::<u64>();
        let of_secrets: u64 = secrets.iter().map(|(k, v)| cost(k, v)).sum();
        let total = plain + of_secrets + EXEC_RESERVE;
        if total > MAX_EXEC_BYTES {
            let what = match secrets.iter().max_by_key(|(k, v)| cost(k, v)) {
                Some((k, v)) if of_secrets > 0 => format!(
                    "{origin}: the secrets ({} in all, env.{k} the largest at {}) with CMD and --setenv",
                    human(of_secrets),
                    human(cost(k, v))
                ),
                _ => "CMD and --setenv".to_string(),
            };
            return Err(Failure::new(format!(
                "{what} make a command of {}, over the guest kernel's limit of {} for arguments and environment together",
                human(total),
                human(MAX_EXEC_BYTES)
            )));
        }
        Ok(())
    })();
    for (_, v) in &mut secrets {
        zeroize::Zeroize::zeroize(v);
    }
    res
}

/// The run spec (CMD and --setenv, sent as JSON in one frame) must fit in
/// one control-channel frame.
pub fn check_spec_frame(argv: &[String], env: &[(String, String)]) -> Result<(), Failure> {
    let spec = Spec {
        argv: argv.to_vec(),
        env: env.to_vec(),
        sbx_id: "x".repeat(128),
        now_unix_ms: u64::MAX,
        tmpfs_bytes: u64::MAX,
        copy_in: true,
        copy_out: true,
    };
    let n = serde_json::to_vec(&spec)
        .map(|v| v.len())
        .unwrap_or(usize::MAX);
    if n > MAX_FRAME {
        return Err(Failure::new(format!(
            "CMD and --setenv: the run spec is {}, over the control channel's limit of {} per frame",
            human(n as u64),
            human(MAX_FRAME as u64)
        )));
    }
    Ok(())
}

/// What the guest's tmpfs can take from --copy-in.
#[derive(Debug, Clone)]
pub struct CopyInLimits {
    /// Bytes of file data (tmpfs pages).
    pub bytes: u64,
    /// What bounds `bytes`, for a message.
    pub bytes_why: String,
    /// Files, directories, links and other entries.
    pub inodes: u64,
    /// --memory as given, for a message.
    pub memory: String,
}

impl CopyInLimits {
    /// `mem` and `tmpfs` in bytes; `memory` the --memory flag's value.
    /// The guest's MemTotal is what --memory gives less what its kernel
    /// reserves (measured with the Debian cloud kernel: 36 MiB at 128M,
    /// 52 MiB at 1G; counted here as 40 MiB + 1/32); tmpfs allows one
    /// inode per two pages of it.
    pub fn new(mem: u64, tmpfs: u64, memory: &str, tmpfs_given: bool) -> Self {
        let total = mem.saturating_sub((40 << 20) + mem / 32);
        let ram = total.saturating_sub(GUEST_HEADROOM);
        let tmpfs_why = if tmpfs_given {
            format!("the guest's tmpfs of {} (--tmpfs)", human(tmpfs))
        } else {
            format!(
                "the guest's tmpfs of {} (half of --memory {memory}; see --tmpfs)",
                human(tmpfs)
            )
        };
        let (bytes, bytes_why) = if ram < tmpfs {
            (
                ram,
                format!(
                    "the guest's free memory of about {} (--memory {memory}; --tmpfs is {})",
                    human(ram),
                    human(tmpfs)
                ),
            )
        } else {
            (tmpfs, tmpfs_why)
        };
        CopyInLimits {
            bytes,
            bytes_why,
            inodes: (total / 8192).saturating_sub(INODE_RESERVE),
            memory: memory.to_string(),
        }
    }
}

/// What the walk of the --copy-in tree found.
#[derive(Debug, Clone, Copy, Default)]
pub struct CopyInScan {
    pub entries: u64,
    /// tmpfs bytes the files take.
    pub bytes: u64,
    /// An upper bound of the tar archive of the tree as it was (GNU
    /// format): what is sent is capped at this.
    pub archive: u64,
}

fn round_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to).saturating_mul(to)
}

fn accessible(p: &Path, mode: libc::c_int) -> std::io::Result<()> {
    let c = std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: a NUL-ended path alive for the call.
    if unsafe { libc::access(c.as_ptr(), mode) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A path cut for a message (a deep tree has long ones).
fn shown(p: &Path) -> String {
    let s = p.display().to_string();
    if s.len() <= 200 {
        return s;
    }
    let head: String = s.chars().take(30).collect();
    let tail: Vec<char> = s.chars().rev().take(160).collect();
    let tail: String = tail.into_iter().rev().collect();
    format!("{head}...{tail}")
}

/// Walks `dir` (the --copy-in directory) and checks that what tar would
/// send fits in the guest: every entry readable, no name too long for the
/// guest, the entries within its tmpfs' inodes, the file data within its
/// bytes. Stops at the first limit passed (a directory of a million
/// entries costs no more than the limit's worth).
pub fn scan_copy_in(dir: &Path, lim: &CopyInLimits) -> Result<CopyInScan, Failure> {
    let flag = format!("--copy-in {}", shown(dir));
    let bad = |what: String| Failure::new(format!("{flag}: {what}"));
    let meta = std::fs::metadata(dir).map_err(|e| bad(e.to_string()))?;
    if !meta.is_dir() {
        return Err(bad("not a directory".into()));
    }
    let base = dir.as_os_str().len();
    // The archive's own end (two zero blocks) and its padding to a 10 KiB
    // record, and the "./" entry.
    let mut scan = CopyInScan {
        entries: 1,
        bytes: 0,
        archive: 2 * 10240 + 512,
    };
    let mut seen: HashSet<(u64, u64)> = HashSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        accessible(&d, libc::R_OK | libc::X_OK)
            .map_err(|e| bad(format!("{}: not readable ({e})", shown(&d))))?;
        let rd = std::fs::read_dir(&d).map_err(|e| bad(format!("{}: {e}", shown(&d))))?;
        for ent in rd {
            let ent = ent.map_err(|e| bad(format!("{}: {e}", shown(&d))))?;
            scan.entries += 1;
            if scan.entries.is_multiple_of(1024)
                && let Some(sig) = sbx_core::signals::pending_termination()
            {
                return Err(bad(format!("stopped by signal {sig} while checking it")));
            }
            if scan.entries > lim.inodes {
                return Err(bad(format!(
                    "more than {} files and directories, over what the guest's tmpfs can hold with --memory {} (raise --memory)",
                    lim.inodes, lim.memory
                )));
            }
            let p = ent.path();
            // Its name in the archive: "./" + the path below `dir`.
            let name_len = (p.as_os_str().len() - base) as u64 + 1;
            if name_len as usize + 1 >= PATH_MAX {
                return Err(bad(format!(
                    "{}: its path is over the guest's limit of {PATH_MAX} bytes",
                    shown(&p)
                )));
            }
            // lstat: a symlink is an entry, never followed.
            let m = ent
                .metadata()
                .map_err(|e| bad(format!("{}: {e}", shown(&p))))?;
            let ft = m.file_type();
            scan.archive += 512;
            if name_len >= 100 {
                // GNU tar's long-name entry.
                scan.archive += 512 + round_up(name_len + 1, 512);
            }
            if ft.is_dir() {
                stack.push(p);
            } else if ft.is_file() {
                accessible(&p, libc::R_OK)
                    .map_err(|e| bad(format!("{}: not readable ({e})", shown(&p))))?;
                // A hard link to a file seen already: a header, no data.
                if m.nlink() > 1 && !seen.insert((m.dev(), m.ino())) {
                    continue;
                }
                let size = m.len();
                if size > lim.bytes {
                    return Err(bad(format!(
                        "{} is {}, more than fits in {}",
                        shown(&p),
                        human(size),
                        lim.bytes_why
                    )));
                }
                scan.bytes = scan.bytes.saturating_add(round_up(size, 4096));
                if scan.bytes > lim.bytes {
                    return Err(bad(format!(
                        "its files total more than {} (passed at {}), more than fits in {}",
                        human(lim.bytes),
                        shown(&p),
                        lim.bytes_why
                    )));
                }
                scan.archive = scan.archive.saturating_add(round_up(size, 512));
            } else if ft.is_symlink() {
                let target = m.len();
                if target >= 100 {
                    scan.archive += 512 + round_up(target + 1, 512);
                }
                // tmpfs keeps a target over 128 bytes in a page of its own.
                if target > 128 {
                    scan.bytes += 4096;
                }
            }
            // A FIFO, a device node or a socket: a header (tar never reads
            // them; it leaves sockets out).
        }
    }
    Ok(scan)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_problems() {
        assert!(env_value_problem("K", "a\0b").unwrap().contains("NUL"));
        assert!(env_value_problem("K", &"x".repeat(131_069)).is_none());
        assert!(
            env_value_problem("K", &"x".repeat(131_070))
                .unwrap()
                .contains("one environment string")
        );
        assert!(env_name_problem("A=B").is_some());
        assert!(env_name_problem("").is_some());
        assert!(env_name_problem("OK").is_none());
    }

    #[test]
    fn exec_total_counts_everything() {
        let argv = vec!["true".to_string()];
        let env = vec![("PATH".to_string(), "/bin".to_string())];
        let big = "x".repeat(100 << 10);
        let mut m = serde_json::Map::new();
        for i in 0..25 {
            m.insert(format!("S{i}"), big.clone().into());
        }
        let doc = serde_json::json!({ "env": m }).to_string();
        let e = check_exec(&argv, &env, Some(&doc), "--secrets-from f").unwrap_err();
        assert!(
            e.message.contains("--secrets-from f: the secrets"),
            "{}",
            e.message
        );
        assert!(!e.message.contains("xxxx"));
        let mut m = serde_json::Map::new();
        for i in 0..15 {
            m.insert(format!("S{i}"), big.clone().into());
        }
        let doc = serde_json::json!({ "env": m }).to_string();
        check_exec(&argv, &env, Some(&doc), "--secrets-from f").unwrap();
    }

    #[test]
    fn limits_follow_memory_and_tmpfs() {
        let l = CopyInLimits::new(256 << 20, 128 << 20, "256M", false);
        assert_eq!(l.bytes, 128 << 20);
        // Measured: 27844 inodes with 256M.
        assert!(l.inodes > 20_000 && l.inodes < 27_844, "{}", l.inodes);
        let l = CopyInLimits::new(256 << 20, 250 << 20, "256M", true);
        assert!(l.bytes < 200 << 20);
        assert!(l.bytes_why.contains("free memory"));
        let l = CopyInLimits::new(1 << 30, 512 << 20, "1G", false);
        // Measured: 124468 inodes with 1G.
        assert!(l.inodes > 110_000 && l.inodes < 124_468, "{}", l.inodes);
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(2 << 30), "2.0 GiB");
        assert_eq!(human(128 << 20), "128 MiB");
        assert_eq!(human(100), "100 bytes");
    }
}
