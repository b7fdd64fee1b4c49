//! Zero-copy relay between the sandbox's connection and the outside one:
//! splice(2) socket -> pipe -> socket in each direction, driven by tokio's
//! readiness, so the payload never enters user space.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::Interest;
use tokio::net::TcpStream;

const CHUNK: usize = 1 << 20;

/// A non-blocking pipe for splice.
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let (r, w) = sbx_core::fds::pipe()?;
    for fd in [&r, &w] {
        let _ = fcntl(fd, FcntlArg::F_SETFL(OFlag::O_NONBLOCK));
    }
    // A bigger pipe means fewer wake-ups per megabyte; the default 64 KiB
    // still works when the limit is lower.
    let _ = fcntl(&w, FcntlArg::F_SETPIPE_SZ(CHUNK as libc::c_int));
    Ok((r, w))
}

fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    // SAFETY: the callers pass fds they hold open for the call; null
    // offsets (sockets and pipes have none); no buffer is involved.
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

fn shutdown(s: &TcpStream, how: libc::c_int) {
    // SAFETY: shutdown(2) on the socket `s` keeps open across the call; no
    // pointers.
    unsafe { libc::shutdown(s.as_raw_fd(), how) };
}

/// Moves bytes from `src` to `dst` until EOF (then half-closes `dst`).
async fn pump(src: &TcpStream, dst: &TcpStream, count: &AtomicU64) -> io::Result<()> {
    let (pr, pw) = pipe()?;
    loop {
        let n = loop {
            src.readable().await?;
            match src.try_io(Interest::READABLE, || {
                splice(src.as_raw_fd(), pw.as_raw_fd(), CHUNK)
            }) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        };
        if n == 0 {
            shutdown(dst, libc::SHUT_WR);
            return Ok(());
        }
        let mut left = n;
        while left > 0 {
            dst.writable().await?;
            match dst.try_io(Interest::WRITABLE, || {
                splice(pr.as_raw_fd(), dst.as_raw_fd(), left)
            }) {
                Ok(m) => left -= m,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
        count.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Relays both ways until both directions ended. `out` counts bytes from
/// the sandbox, `inn` bytes to it.
pub async fn relay(inside: TcpStream, outside: TcpStream, out: &AtomicU64, inn: &AtomicU64) {
    let a = async {
        if let Err(e) = pump(&inside, &outside, out).await {
            tracing::debug!("relay out: {e}");
            shutdown(&inside, libc::SHUT_RDWR);
            shutdown(&outside, libc::SHUT_RDWR);
        }
    };
    let b = async {
        if let Err(e) = pump(&outside, &inside, inn).await {
            tracing::debug!("relay in: {e}");
            shutdown(&inside, libc::SHUT_RDWR);
            shutdown(&outside, libc::SHUT_RDWR);
        }
    };
    tokio::join!(a, b);
}

/// Blocking splice loop for one direction (a thread of its own): fewer
/// wake-ups than readiness-driven splicing for bulk transfers. `start` is a
/// pipe already holding `left` bytes for `dst` (handed over by the async
/// pump), or None.
fn pump_blocking(
    src: RawFd,
    dst: RawFd,
    count: &AtomicU64,
    start: Option<Handoff>,
) -> io::Result<()> {
    let (pr, pw, mut left) = match start {
        Some(h) => (h.pr, h.pw, h.left),
        None => {
            let (pr, pw) = pipe()?;
            (pr, pw, 0)
        }
    };
    // The pipe is non-blocking; the sockets are blocking, so splice waits
    // on them.
    let mut n = left;
    loop {
        while left > 0 {
            // SAFETY: `pr` is our open pipe; `dst` is open while the
            // caller's Arc holds its socket; null offsets, no buffers.
            let m = unsafe {
                libc::splice(
                    pr.as_raw_fd(),
                    std::ptr::null_mut(),
                    dst,
                    std::ptr::null_mut(),
                    left,
                    libc::SPLICE_F_MOVE,
                )
            };
            if m < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            left -= m as usize;
        }
        count.fetch_add(n as u64, Ordering::Relaxed);
        n = loop {
            // SAFETY: `src` is open while the caller's Arc holds its socket;
            // `pw` is our open pipe; null offsets, no buffers.
            let r = unsafe {
                libc::splice(
                    src,
                    std::ptr::null_mut(),
                    pw.as_raw_fd(),
                    std::ptr::null_mut(),
                    CHUNK,
                    libc::SPLICE_F_MOVE,
                )
            };
            if r >= 0 {
                break r as usize;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        };
        if n == 0 {
            // SAFETY: `dst` is open while the caller's Arc holds its socket;
            // no pointers.
            unsafe { libc::shutdown(dst, libc::SHUT_WR) };
            return Ok(());
        }
        left = n;
    }
}

/// A direction handed from the async pump to a thread: its pipe and the
/// bytes in it not yet written.
pub struct Handoff {
    pr: OwnedFd,
    pw: OwnedFd,
    left: usize,
}

enum End {
    Eof,
    Escalate(Handoff),
}

/// Bytes one direction moves on tokio's readiness before the connection is
/// handed to two threads (short exchanges never pay for the threads).
pub const ESCALATE_AFTER: u64 = 256 * 1024;

/// The async pump of [`relay_hybrid`]: returns at EOF, or when this
/// direction moved `limit` bytes or the other one did (signalled through
/// `tx`/`rx`), handing over its pipe.
async fn pump_hybrid(
    src: &TcpStream,
    dst: &TcpStream,
    count: &AtomicU64,
    tx: &tokio::sync::watch::Sender<bool>,
    mut rx: tokio::sync::watch::Receiver<bool>,
    limit: u64,
) -> io::Result<End> {
    let (pr, pw) = pipe()?;
    let mut moved = 0u64;
    loop {
        if *rx.borrow() {
            return Ok(End::Escalate(Handoff { pr, pw, left: 0 }));
        }
        let n = loop {
            tokio::select! {
                r = src.readable() => r?,
                _ = rx.changed() => return Ok(End::Escalate(Handoff { pr, pw, left: 0 })),
            }
            match src.try_io(Interest::READABLE, || {
                splice(src.as_raw_fd(), pw.as_raw_fd(), CHUNK)
            }) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        };
        if n == 0 {
            shutdown(dst, libc::SHUT_WR);
            return Ok(End::Eof);
        }
        let mut left = n;
        while left > 0 {
            tokio::select! {
                r = dst.writable() => r?,
                _ = rx.changed() => {
                    count.fetch_add((n - left) as u64, Ordering::Relaxed);
                    return Ok(End::Escalate(Handoff { pr, pw, left }));
                }
            }
            match dst.try_io(Interest::WRITABLE, || {
                splice(pr.as_raw_fd(), dst.as_raw_fd(), left)
            }) {
                Ok(m) => left -= m,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
        count.fetch_add(n as u64, Ordering::Relaxed);
        moved += n as u64;
        if moved >= limit {
            let _ = tx.send(true);
            return Ok(End::Escalate(Handoff { pr, pw, left: 0 }));
        }
    }
}

/// Relays both ways: on tokio's readiness first; once a direction moved
/// [`ESCALATE_AFTER`] bytes (and `escalate` allows it), both directions
/// still open go to two blocking threads with their pipes.
pub async fn relay_hybrid(
    inside: TcpStream,
    outside: TcpStream,
    g: std::sync::Arc<crate::gateway::Gateway>,
    escalate: bool,
) {
    let limit = if escalate { ESCALATE_AFTER } else { u64::MAX };
    let (tx, rx) = tokio::sync::watch::channel(false);
    let fail = |e: &io::Error, what: &str| {
        tracing::debug!("relay {what}: {e}");
        shutdown(&inside, libc::SHUT_RDWR);
        shutdown(&outside, libc::SHUT_RDWR);
    };
    let a = async {
        let r = pump_hybrid(
            &inside,
            &outside,
            &g.stats.bytes_out,
            &tx,
            rx.clone(),
            limit,
        )
        .await;
        if let Err(e) = &r {
            fail(e, "out");
        }
        r
    };
    let b = async {
        let r = pump_hybrid(&outside, &inside, &g.stats.bytes_in, &tx, rx.clone(), limit).await;
        if let Err(e) = &r {
            fail(e, "in");
        }
        r
    };
    let (ra, rb) = tokio::join!(a, b);
    let (ha, hb) = match (ra, rb) {
        (Ok(a), Ok(b)) => (a, b),
        _ => return,
    };
    if matches!((&ha, &hb), (End::Eof, End::Eof)) {
        return;
    }
    let (Ok(i), Ok(o)) = (inside.into_std(), outside.into_std()) else {
        return;
    };
    if i.set_nonblocking(false).is_err() || o.set_nonblocking(false).is_err() {
        return;
    }
    let i = std::sync::Arc::new(i);
    let o = std::sync::Arc::new(o);
    let mut tasks = Vec::new();
    for (end, out_dir) in [(ha, true), (hb, false)] {
        let End::Escalate(h) = end else { continue };
        let (i2, o2, g2) = (i.clone(), o.clone(), g.clone());
        tasks.push(tokio::task::spawn_blocking(move || {
            let (src, dst, count) = if out_dir {
                (i2.as_raw_fd(), o2.as_raw_fd(), &g2.stats.bytes_out)
            } else {
                (o2.as_raw_fd(), i2.as_raw_fd(), &g2.stats.bytes_in)
            };
            if let Err(e) = pump_blocking(src, dst, count, Some(h)) {
                tracing::debug!("relay: {e}");
                let _ = i2.shutdown(std::net::Shutdown::Both);
                let _ = o2.shutdown(std::net::Shutdown::Both);
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// [`relay`] on two threads of tokio's blocking pool, with the sockets in
/// blocking mode: the fastest path for bulk transfers.
pub async fn relay_threads(
    inside: TcpStream,
    outside: TcpStream,
    out: std::sync::Arc<crate::gateway::Gateway>,
) {
    let (Ok(i), Ok(o)) = (inside.into_std(), outside.into_std()) else {
        return;
    };
    if i.set_nonblocking(false).is_err() || o.set_nonblocking(false).is_err() {
        return;
    }
    let i = std::sync::Arc::new(i);
    let o = std::sync::Arc::new(o);
    let (i2, o2, g2) = (i.clone(), o.clone(), out.clone());
    let a = tokio::task::spawn_blocking(move || {
        if let Err(e) = pump_blocking(i2.as_raw_fd(), o2.as_raw_fd(), &g2.stats.bytes_out, None) {
            tracing::debug!("relay out: {e}");
            let _ = i2.shutdown(std::net::Shutdown::Both);
            let _ = o2.shutdown(std::net::Shutdown::Both);
        }
    });
    let (i3, o3, g3) = (i.clone(), o.clone(), out);
    let b = tokio::task::spawn_blocking(move || {
        if let Err(e) = pump_blocking(o3.as_raw_fd(), i3.as_raw_fd(), &g3.stats.bytes_in, None) {
            tracing::debug!("relay in: {e}");
            let _ = i3.shutdown(std::net::Shutdown::Both);
            let _ = o3.shutdown(std::net::Shutdown::Both);
        }
    });
    let _ = tokio::join!(a, b);
}

/// Relays both ways, the sandbox's bytes through `scan` (user space, so
/// that they can be looked at; the other direction is spliced). `scan`
/// gets a window of the last bytes seen plus the new chunk and says
/// whether they may go out; when not, both sides are cut before the chunk
/// is written.
pub async fn relay_scanned(
    inside: TcpStream,
    outside: TcpStream,
    out: &AtomicU64,
    inn: &AtomicU64,
    keep: usize,
    scan: impl Fn(&[u8]) -> bool,
) {
    let cut = || {
        shutdown(&inside, libc::SHUT_RDWR);
        shutdown(&outside, libc::SHUT_RDWR);
    };
    let a = async {
        let mut buf = vec![0u8; 64 * 1024];
        let mut window: Vec<u8> = Vec::new();
        loop {
            let n = loop {
                inside.readable().await?;
                match inside.try_read(&mut buf) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Err(e),
                }
            };
            if n == 0 {
                shutdown(&outside, libc::SHUT_WR);
                return Ok(());
            }
            window.extend_from_slice(&buf[..n]);
            if !scan(&window) {
                return Err(io::Error::other("a placeholder on its way out"));
            }
            let drop_to = window.len().saturating_sub(keep);
            window.drain(..drop_to);
            let mut off = 0;
            while off < n {
                outside.writable().await?;
                match outside.try_write(&buf[off..n]) {
                    Ok(m) => off += m,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Err(e),
                }
            }
            out.fetch_add(n as u64, Ordering::Relaxed);
        }
    };
    let a = async {
        if let Err(e) = a.await {
            tracing::debug!("relay out (scanned): {e}");
            cut();
        }
    };
    let b = async {
        if let Err(e) = pump(&outside, &inside, inn).await {
            tracing::debug!("relay in: {e}");
            cut();
        }
    };
    tokio::join!(a, b);
}
