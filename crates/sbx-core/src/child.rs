//! A helper program run for a bounded time with bounded output (`git
//! config` for sbx-fs's identity, the doctor's probes): what it prints is
//! read while it runs (a full pipe never stalls it), and one that
//! overruns is killed and reaped, never waited for.

use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::process::{Child, ChildStderr, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// What the program printed, and how it ended.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Why there is no [`Finished`].
#[derive(Debug, thiserror::Error)]
pub enum Overrun {
    #[error("spawn: {0}")]
    Spawn(#[source] io::Error),
    #[error("no answer within {} s", .0.as_secs())]
    Time(Duration),
    #[error("more than {0} bytes of output")]
    Size(usize),
    #[error("read its output: {0}")]
    Io(#[source] io::Error),
}

/// Runs `cmd` (stdin from /dev/null, stdout and stderr read here) for at
/// most `limit`, keeping at most `cap` bytes of each stream.
pub fn output_within(cmd: &mut Command, limit: Duration, cap: usize) -> Result<Finished, Overrun> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(Overrun::Spawn)?;
    let r = collect(&mut child, Instant::now() + limit, limit, cap);
    if r.is_err() {
        let _ = child.kill();
        let _ = child.wait();
    }
    r
}

fn collect(
    child: &mut Child,
    end: Instant,
    limit: Duration,
    cap: usize,
) -> Result<Finished, Overrun> {
    let mut so: Option<ChildStdout> = child.stdout.take();
    let mut se: Option<ChildStderr> = child.stderr.take();
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let mut buf = [0u8; 8192];
    while so.is_some() || se.is_some() {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Overrun::Time(limit));
        }
        let fds: Vec<i32> = [
            so.as_ref().map(|s| s.as_raw_fd()),
            se.as_ref().map(|s| s.as_raw_fd()),
        ]
        .into_iter()
        .flatten()
        .collect();
        let mut p: Vec<libc::pollfd> = fds
            .iter()
            .map(|&fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let ms = left.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: a live array of p.len() pollfds, for the call only.
        let n = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Overrun::Io(e));
        }
        for q in p.iter().filter(|q| q.revents != 0) {
            let (stream, out): (&mut dyn Read, &mut Vec<u8>) = match (so.as_mut(), se.as_mut()) {
                (Some(s), _) if s.as_raw_fd() == q.fd => (s, &mut stdout),
                (_, Some(s)) => (s, &mut stderr),
                _ => continue,
            };
            match stream.read(&mut buf) {
                Ok(0) => {
                    if so.as_ref().is_some_and(|s| s.as_raw_fd() == q.fd) {
                        so = None;
                    } else {
                        se = None;
                    }
                }
                Ok(k) if out.len() + k <= cap => out.extend_from_slice(&buf[..k]),
                Ok(_) => return Err(Overrun::Size(cap)),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Overrun::Io(e)),
            }
        }
    }
    // Both streams closed: the program has ended, or is about to.
    loop {
        if let Some(status) = child.try_wait().map_err(Overrun::Io)? {
            return Ok(Finished {
                status,
                stdout,
                stderr,
            });
        }
        if Instant::now() >= end {
            return Err(Overrun::Time(limit));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_status_and_the_bounds() {
        let f = output_within(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(10),
            1024,
        )
        .unwrap();
        assert_eq!(f.status.code(), Some(3));
        assert_eq!(f.stdout, b"out\n");
        assert_eq!(f.stderr, b"err\n");
        // More than a pipe holds is read while it runs.
        let f = output_within(
            Command::new("sh").args(["-c", "head -c 200000 /dev/zero"]),
            Duration::from_secs(10),
            1 << 20,
        )
        .unwrap();
        assert_eq!(f.stdout.len(), 200_000);
        let t = Instant::now();
        let e = output_within(
            Command::new("sleep").arg("30"),
            Duration::from_millis(300),
            1024,
        )
        .unwrap_err();
        assert!(matches!(e, Overrun::Time(_)), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5));
        // Output closed but still running: bounded too.
        let e = output_within(
            Command::new("sh").args(["-c", "exec >&- 2>&-; sleep 30"]),
            Duration::from_millis(300),
            1024,
        )
        .unwrap_err();
        assert!(matches!(e, Overrun::Time(_)), "{e}");
        let e = output_within(
            Command::new("sh").args(["-c", "head -c 5000 /dev/zero"]),
            Duration::from_secs(10),
            1000,
        )
        .unwrap_err();
        assert!(matches!(e, Overrun::Size(1000)), "{e}");
        assert!(matches!(
            output_within(
                &mut Command::new("/nonexistent/x"),
                Duration::from_secs(1),
                1
            ),
            Err(Overrun::Spawn(_))
        ));
    }
}
