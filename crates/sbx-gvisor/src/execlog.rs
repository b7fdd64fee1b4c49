//! Refused execs inside gVisor, read from runsc's exec trace.

use std::ffi::OsString;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Duration;

use sbx_core::{Failure, Severity};
use serde_json::json;

use crate::os;

/// Refused execs inside gVisor: runsc's strace of execve/execveat goes to
/// a FIFO this process reads, and every exec that failed with EACCES (a
/// noexec mount: not on the allowlist) becomes an exec_denied alert. No
/// file grows with the run; only those lines are kept.
pub(crate) struct ExecLog {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<(String, String, String)>>,
}

/// Alerts of exec_denied beyond this many become one event with a count.
const EXEC_ALERTS: usize = 20;

impl ExecLog {
    /// Makes the FIFO at `path`, starts the reader; returns runsc's flags.
    pub(crate) fn start(path: &Path) -> Result<(ExecLog, Vec<OsString>), Failure> {
        use std::os::unix::ffi::OsStrExt;
        let err = |e: std::io::Error| Failure::new(format!("{}: {e}", path.display()));
        let c = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|_| Failure::new("exec log path with a NUL"))?;
        // SAFETY: a valid C string.
        if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
            return Err(err(std::io::Error::last_os_error()));
        }
        // Read and write: never blocks on open, never an early EOF.
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
            .map_err(err)?;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let st = stop.clone();
        let thread = std::thread::spawn(move || read_exec_log(f, &st));
        let mut log = os("--debug-log=");
        log.push(path);
        Ok((
            ExecLog { stop, thread },
            vec![
                os("--oci-seccomp"),
                os("--strace"),
                os("--strace-syscalls=execve,execveat"),
                os("--strace-log-size=256"),
                log,
            ],
        ))
    }

    pub(crate) fn report(self, id: &str) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let denied = self.thread.join().unwrap_or_default();
        for (program, path, syscall) in denied.iter().take(EXEC_ALERTS) {
            sbx_core::audit::emit(
                "exec_denied",
                Severity::Alert,
                json!({"path": path, "program": program, "syscall": syscall,
                       "enforced_by": "gvisor noexec mounts", "container": id}),
            );
        }
        if denied.len() > EXEC_ALERTS {
            sbx_core::audit::emit(
                "exec_denied",
                Severity::Alert,
                json!({"suppressed": denied.len() - EXEC_ALERTS, "container": id}),
            );
        }
    }
}

fn read_exec_log(
    mut f: std::fs::File,
    stop: &std::sync::atomic::AtomicBool,
) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut line: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        // Read after looking: what runsc wrote before it ended is read.
        let stopping = stop.load(std::sync::atomic::Ordering::Relaxed);
        match f.read(&mut buf) {
            Ok(n) if n > 0 => {
                for &c in &buf[..n] {
                    if c == b'\n' {
                        if let Some(d) = denied_exec(&String::from_utf8_lossy(&line)) {
                            out.push(d);
                        }
                        line.clear();
                    } else if line.len() < 8192 {
                        line.push(c);
                    }
                }
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            _ => {}
        }
        // Nothing to read: once runsc has ended, everything is read.
        if stopping {
            return out;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// (program, path, syscall) of a strace exit line of runsc for an exec that
/// failed with EACCES: `[ 2: 2] sh X execve(0x5616 /usr/bin/id, ...) = 0
/// (0x0) errno=13 (permission denied)`.
fn denied_exec(l: &str) -> Option<(String, String, String)> {
    let (head, rest) = l.split_once(" X execve")?;
    if !rest.contains("errno=13 ") {
        return None;
    }
    let program = head.rsplit(' ').next().unwrap_or("").to_string();
    let (syscall, args) = if let Some(r) = rest.strip_prefix("at(") {
        // execveat(dirfd, 0xADDR path, ...)
        ("execveat", r.split_once(", ").map(|x| x.1).unwrap_or(r))
    } else {
        ("execve", rest.strip_prefix('(')?)
    };
    let path = args.split_once(' ')?.1.split(", ").next()?.to_string();
    Some((program, path, syscall.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_execs_are_read_from_runsc_strace() {
        let l = "I1203 14:02:05.064511    1951 strace.go:605] [   2:   2] sh X execve(0x56162c13c568 /usr/bin/id, 0x56162c13c538 [\"id\"], 0x56162c13c548 [\"HOME=/root\"]) = 0 (0x0) errno=13 (permission denied) (10.05004ms)";
        assert_eq!(
            denied_exec(l),
            Some(("sh".into(), "/usr/bin/id".into(), "execve".into()))
        );
        assert_eq!(
            denied_exec(&l.replace("errno=13 (permission denied) ", "")),
            None
        );
        assert_eq!(denied_exec(&l.replace(" X ", " E ")), None);
    }
}
