//! The hash chain of the audit log: each line carries `seq` (0 for the first
//! line of the file, then +1) and `prev`, the SHA-256 (hex) of the exact
//! bytes of the line before it, newline included ([`ZERO`] for the first).
//!
//! So an edited line breaks the `prev` of the next one, a removed or
//! reordered line breaks `seq` and `prev`, a line appended without the chain
//! lacks them, and a log whose head was cut starts with `seq` != 0; a cut
//! tail is seen against an anchor kept elsewhere (the `seq` and hash of the
//! last line, which `sbx-audit verify` prints and checks with `--head`).
//! A plain hash chain proves order and integrity against anyone who cannot
//! rewrite the whole tail; someone who can write the file can recompute it.
//! Together with "the sandbox never holds a writable handle to the log"
//! (docs/audit.md) that is the promise.
//!
//! Several sbx processes share one log: each append takes a POSIX write
//! lock on the file (per process, unlike flock on a shared open file
//! description, which every tool of a chain shares), reads the last line,
//! and writes its line with one `write(2)` on the `O_APPEND` fd.
//!
//! The wait for that lock is bounded ([`LOCK_WAIT`]): anyone who can open
//! the log for reading can hold a read lock on it (F_RDLCK needs no write
//! access, and a log outside the writable binds is still readable inside
//! the sandbox), and an unbounded F_SETLKW would then hang every tool at
//! its next event. A writer holds the lock for the microseconds of one
//! append, so a lock held for seconds is no writer: the line is written
//! anyway (an event is never dropped, the `O_APPEND` write keeps it whole),
//! chained to the last line as read, and the append reports it
//! ([`Unlocked`]) so the tool says so on stderr and logs an
//! `audit_lock_timeout` alert. Two writers racing meanwhile may chain to
//! the same line, which `sbx-audit verify` reports: the holder can make
//! the chain look broken, never make lines go missing or a tool hang.
//! Later appends of the same writer wait at most [`LOCK_WAIT_AFTER_TIMEOUT`]
//! until they get the lock again.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// `prev` of the first line of a log.
pub const ZERO: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Hex SHA-256 of a line's exact bytes (newline included).
pub fn line_hash(bytes: &[u8]) -> String {
    let d = Sha256::digest(bytes);
    let mut s = String::with_capacity(64);
    for b in d {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Per-process state of the appender.
pub struct Writer {
    /// A readable handle on the log (the fd itself when it is O_RDWR, else
    /// a reopening of it), to read the last line.
    read: Option<ReadFd>,
    /// (file size after our last line, its hash, its seq): when the size
    /// is unchanged nobody appended since, and nothing needs reading.
    last: Option<(u64, String, u64)>,
    /// The bound on the wait for the lock ([`LOCK_WAIT`]).
    lock_wait: Duration,
    /// The last append went without the lock: the next ones wait at most
    /// [`LOCK_WAIT_AFTER_TIMEOUT`].
    degraded: bool,
    /// An append without the lock was reported already.
    reported: bool,
}

/// How long an append waits for the log's lock before it writes its line
/// without it (a writer holds it for one append: microseconds).
pub const LOCK_WAIT: Duration = Duration::from_secs(2);

/// The wait of the appends after one went without the lock: a holder that
/// never lets go must not cost every later line [`LOCK_WAIT`].
pub const LOCK_WAIT_AFTER_TIMEOUT: Duration = Duration::from_millis(50);

/// An append that went without the lock, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unlocked {
    /// The first such append of this writer (the one to report).
    pub first: bool,
    /// What kept the lock: "held by pid N for 2s", or the lock's error.
    pub why: String,
    /// The pid holding a conflicting lock, when the kernel names one.
    pub holder: Option<i32>,
}

enum ReadFd {
    Same,
    Own(OwnedFd),
}

impl Writer {
    pub fn new(fd: Option<RawFd>) -> Self {
        let read = fd.and_then(|fd| {
            // SAFETY: F_GETFL on an fd the audit sink owns.
            let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
            if fl >= 0 && fl & libc::O_ACCMODE == libc::O_RDWR {
                return Some(ReadFd::Same);
            }
            let p = std::ffi::CString::new(format!("/proc/self/fd/{fd}")).ok()?;
            // SAFETY: a NUL-terminated path; the fd is owned below.
            let r = unsafe { libc::open(p.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
            // SAFETY: a fresh fd nobody else owns.
            (r >= 0).then(|| ReadFd::Own(unsafe { OwnedFd::from_raw_fd(r) }))
        });
        Writer {
            read,
            last: None,
            lock_wait: LOCK_WAIT,
            degraded: false,
            reported: false,
        }
    }

    /// Appends the line `build(seq, prev)` to `fd` under the file lock,
    /// waiting for it at most [`LOCK_WAIT`]. The line is written even when
    /// the lock cannot be had: `Ok(Some(_))` says so (see the module doc).
    pub fn append(
        &mut self,
        fd: RawFd,
        build: impl FnOnce(u64, &str) -> String,
    ) -> std::io::Result<Option<Unlocked>> {
        let wait = if self.degraded {
            LOCK_WAIT_AFTER_TIMEOUT.min(self.lock_wait)
        } else {
            self.lock_wait
        };
        let unlocked = match lock_within(fd, wait) {
            Ok(None) => None,
            Ok(Some(holder)) => Some((
                match holder {
                    Some(p) => format!("a lock on it held by pid {p} for over {wait:?}"),
                    None => format!("a lock on it held by another process for over {wait:?}"),
                },
                holder,
            )),
            Err(e) => Some((format!("cannot lock it: {e}"), None)),
        };
        let r = self.append_line(fd, build);
        if unlocked.is_none() {
            let _ = setlk(fd, libc::F_UNLCK);
        }
        r?;
        self.degraded = unlocked.is_some();
        Ok(unlocked.map(|(why, holder)| {
            let first = !self.reported;
            self.reported = true;
            Unlocked { first, why, holder }
        }))
    }

    fn append_line(
        &mut self,
        fd: RawFd,
        build: impl FnOnce(u64, &str) -> String,
    ) -> std::io::Result<()> {
        let size = file_size(fd)?;
        let mut prefix = "";
        let (seq, prev) = match &self.last {
            Some((s, h, q)) if *s == size => (q + 1, h.clone()),
            _ => match self.read_last(fd, size) {
                None => (0, ZERO.to_string()),
                Some((mut line, complete)) => {
                    if !complete {
                        // A torn last line: end it, so ours starts a line
                        // (the verifier reports the torn one).
                        line.push(b'\n');
                        prefix = "\n";
                    }
                    let seq = serde_json::from_slice::<serde_json::Value>(&line)
                        .ok()
                        .and_then(|v| v["seq"].as_u64())
                        .map_or(0, |q| q + 1);
                    (seq, line_hash(&line))
                }
            },
        };
        let line = format!("{prefix}{}", build(seq, &prev));
        write_all(fd, line.as_bytes())?;
        self.last = Some((
            size + line.len() as u64,
            line_hash(&line.as_bytes()[prefix.len()..]),
            seq,
        ));
        Ok(())
    }

    /// The last line (bytes, whether it ends with a newline), None when the
    /// file is empty or unreadable.
    fn read_last(&self, fd: RawFd, size: u64) -> Option<(Vec<u8>, bool)> {
        if size == 0 {
            return None;
        }
        let rfd = match self.read.as_ref()? {
            ReadFd::Same => fd,
            ReadFd::Own(o) => o.as_raw_fd(),
        };
        let mut end = size;
        let mut tail: Vec<u8> = Vec::new();
        let mut complete = None;
        loop {
            let start = end.saturating_sub(8192);
            let mut buf = vec![0u8; (end - start) as usize];
            let n = pread_full(rfd, &mut buf, start)?;
            buf.truncate(n);
            buf.extend_from_slice(&tail);
            tail = buf;
            let c = *complete.get_or_insert(tail.last() == Some(&b'\n'));
            // The newline that ends the line before the last one.
            let search_end = if c { tail.len() - 1 } else { tail.len() };
            if let Some(i) = tail[..search_end].iter().rposition(|b| *b == b'\n') {
                return Some((tail[i + 1..].to_vec(), c));
            }
            if start == 0 {
                return Some((tail, c));
            }
            end = start;
        }
    }
}

fn pread_full(fd: RawFd, buf: &mut [u8], off: u64) -> Option<usize> {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: reads into the unfilled part of a live buffer.
        let n = unsafe {
            libc::pread(
                fd,
                buf[got..].as_mut_ptr().cast(),
                buf.len() - got,
                (off + got as u64) as libc::off_t,
            )
        };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return None;
        }
        if n == 0 {
            break;
        }
        got += n as usize;
    }
    Some(got)
}

/// The size of the open file (0 when fstat fails).
pub fn size_of(fd: RawFd) -> u64 {
    file_size(fd).unwrap_or(0)
}

fn file_size(fd: RawFd) -> std::io::Result<u64> {
    // SAFETY: libc::stat is plain integers: all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat into a local buffer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st.st_size as u64)
}

/// Takes the write lock on the whole file, waiting at most `wait`:
/// `Ok(None)` when held, `Ok(Some(holder))` when another process kept it
/// that long (its pid when the kernel names one), `Err` when the file
/// cannot be locked at all. Polls (F_SETLK) rather than blocks: a wait in
/// F_SETLKW has no bound, and the forwarded signals are blocked.
fn lock_within(fd: RawFd, wait: Duration) -> std::io::Result<Option<Option<i32>>> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(50);
    loop {
        match setlk(fd, libc::F_WRLCK) {
            Ok(()) => return Ok(None),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => {}
            Err(e) => return Err(e),
        }
        let spent = start.elapsed();
        if spent >= wait {
            return Ok(Some(holder(fd)));
        }
        std::thread::sleep(pause.min(wait - spent));
        pause = (pause * 2).min(Duration::from_millis(10));
    }
}

/// The pid of a process holding a lock that conflicts with a write lock on
/// the whole file (None for an OFD lock, or when it cannot be told).
fn holder(fd: RawFd) -> Option<i32> {
    let mut fl = whole_file(libc::F_WRLCK);
    // SAFETY: F_GETLK with a filled flock struct, which it overwrites.
    if unsafe { libc::fcntl(fd, libc::F_GETLK, &mut fl) } != 0 {
        return None;
    }
    (i32::from(fl.l_type) != libc::F_UNLCK && fl.l_pid > 0).then_some(fl.l_pid)
}

fn whole_file(kind: i32) -> libc::flock {
    // SAFETY: libc::flock is plain integers: all-zero is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl
}

/// One non-blocking F_SETLK on the whole file (EINTR retried).
fn setlk(fd: RawFd, kind: i32) -> std::io::Result<()> {
    let fl = whole_file(kind);
    loop {
        // SAFETY: F_SETLK with a filled flock struct.
        if unsafe { libc::fcntl(fd, libc::F_SETLK, &fl) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

pub(crate) fn write_all(fd: RawFd, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: writes from a live buffer.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::OpenOptionsExt;

    fn open(p: &std::path::Path, read: bool) -> std::fs::File {
        std::fs::OpenOptions::new()
            .read(read)
            .append(true)
            .create(true)
            .mode(0o600)
            .open(p)
            .unwrap()
    }

    fn lines(p: &std::path::Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(p)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn two_writers_on_one_file_keep_one_chain() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log");
        let a = open(&p, true);
        let b = open(&p, false); // write-only: reads through /proc
        let mut wa = Writer::new(Some(a.as_raw_fd()));
        let mut wb = Writer::new(Some(b.as_raw_fd()));
        for i in 0..5 {
            let (w, f) = if i % 2 == 0 {
                (&mut wa, &a)
            } else {
                (&mut wb, &b)
            };
            w.append(f.as_raw_fd(), |seq, prev| {
                format!("{{\"seq\":{seq},\"prev\":\"{prev}\",\"i\":{i}}}\n")
            })
            .unwrap();
        }
        let text = std::fs::read_to_string(&p).unwrap();
        let raw: Vec<&str> = text.split_inclusive('\n').collect();
        let v = lines(&p);
        assert_eq!(v.len(), 5);
        assert_eq!(v[0]["prev"], ZERO);
        for i in 1..5 {
            assert_eq!(v[i]["seq"], i as u64);
            assert_eq!(v[i]["prev"], line_hash(raw[i - 1].as_bytes()));
        }
    }

    /// A read lock held by someone else (an OFD lock here: it conflicts
    /// with this process's own record locks, as another process's would)
    /// costs one bounded wait; the line is written and chained all the
    /// same, and the append says it went without the lock.
    #[test]
    fn a_held_read_lock_bounds_the_wait_and_loses_no_line() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log");
        let f = open(&p, true);
        let reader = std::fs::File::open(&p).unwrap();
        let ofd = |kind: i32| {
            let fl = whole_file(kind);
            // SAFETY: F_OFD_SETLK with a filled flock struct (l_pid 0).
            unsafe { libc::fcntl(reader.as_raw_fd(), libc::F_OFD_SETLK, &fl) }
        };
        assert_eq!(ofd(libc::F_RDLCK), 0);
        let mut w = Writer::new(Some(f.as_raw_fd()));
        w.lock_wait = Duration::from_millis(300);
        let line = |seq: u64, prev: &str| format!("{{\"seq\":{seq},\"prev\":\"{prev}\"}}\n");
        let t0 = Instant::now();
        let u = w.append(f.as_raw_fd(), line).unwrap().expect("unlocked");
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(2),
            "{took:?}"
        );
        assert!(u.first && u.why.contains("held by"), "{u:?}");
        let t0 = Instant::now();
        let u = w
            .append(f.as_raw_fd(), line)
            .unwrap()
            .expect("still unlocked");
        assert!(!u.first);
        assert!(
            t0.elapsed() < Duration::from_millis(250),
            "{:?}",
            t0.elapsed()
        );
        assert_eq!(ofd(libc::F_UNLCK), 0);
        assert_eq!(w.append(f.as_raw_fd(), line).unwrap(), None);
        let text = std::fs::read_to_string(&p).unwrap();
        let raw: Vec<&str> = text.split_inclusive('\n').collect();
        let v = lines(&p);
        assert_eq!(v.len(), 3);
        for i in 1..3 {
            assert_eq!(v[i]["seq"], i as u64);
            assert_eq!(v[i]["prev"], line_hash(raw[i - 1].as_bytes()));
        }
    }

    #[test]
    fn a_torn_last_line_is_ended_and_chained_to() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log");
        std::fs::write(&p, "{\"seq\":0,\"x\":1}\n{\"torn").unwrap();
        let f = open(&p, true);
        let mut w = Writer::new(Some(f.as_raw_fd()));
        w.append(f.as_raw_fd(), |seq, prev| {
            format!("{{\"seq\":{seq},\"prev\":\"{prev}\"}}\n")
        })
        .unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
        assert_eq!(last["prev"], line_hash(b"{\"torn\n"));
        assert_eq!(last["seq"], 0);
    }
}
