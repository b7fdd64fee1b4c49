//! Passing fds between processes over a Unix socket (SCM_RIGHTS).
//!
//! Several tools hand an fd across a namespace boundary that they cannot
//! cross by inheritance: sbx-fs's init opens /dev/fuse inside the sandbox's
//! user namespace and hands it out, sbx-net creates the gateway's sockets
//! inside the new network namespace, sbx-seccomp hands the notify listener
//! to its notifier. They all do it here, one way:
//!
//! - a message is a datagram on a SOCK_SEQPACKET pair ([`seqpacket_pair`]):
//!   some data bytes and up to [`MAX_FDS`] fds, delivered whole;
//! - it carries at least one data byte: a zero-length read is end of
//!   stream, and a message of fds alone would look like one;
//! - sending never raises SIGPIPE (MSG_NOSIGNAL: a dead peer is EPIPE) and
//!   never allocates (sbx-net sends from a forked child, before exec);
//! - received fds are close-on-exec from the start (MSG_CMSG_CLOEXEC), so
//!   no thread's concurrent exec can leak them;
//! - EINTR is retried on both sides;
//! - a receive whose fds were cut short (MSG_CTRUNC) is refused: the fds
//!   that fit are closed again, so the receiver never works with half a
//!   set. A truncated data part is not refused: the data is the caller's
//!   to judge (its protocols put texts there whose tail is expendable).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// The most fds one message carries (the tools pass at most four). Both
/// sides hold to it: a send of more is refused, a receive of more is cut
/// short by the kernel and so refused as [`PassFdError::Truncated`].
pub const MAX_FDS: usize = 16;

/// Room for the control message of `MAX_FDS` fds (CMSG_SPACE(64) is 80 on
/// 64-bit Linux), as u64s so that the cmsghdr inside is aligned.
type CmsgBuf = [u64; 16];

const FD_SIZE: usize = std::mem::size_of::<RawFd>();

#[derive(Debug, thiserror::Error)]
pub enum PassFdError {
    #[error("{0} fds in one message (at most {MAX_FDS})")]
    TooMany(usize),
    #[error("an fd-passing message needs at least one data byte")]
    Empty,
    #[error("sendmsg: {0}")]
    Send(#[source] io::Error),
    #[error("recvmsg: {0}")]
    Recv(#[source] io::Error),
    #[error(
        "the passed fds were cut short (MSG_CTRUNC): more than {MAX_FDS} sent, or the fd limit reached"
    )]
    Truncated,
}

impl PassFdError {
    /// A non-blocking receive found no message ([`try_recv_fds`]).
    pub fn would_block(&self) -> bool {
        matches!(self, PassFdError::Recv(e) if e.kind() == io::ErrorKind::WouldBlock)
    }
}

/// Callers whose errors are `io::Error` keep the OS error as it was.
impl From<PassFdError> for io::Error {
    fn from(e: PassFdError) -> io::Error {
        match e {
            PassFdError::Send(e) | PassFdError::Recv(e) => e,
            PassFdError::TooMany(_) | PassFdError::Empty => {
                io::Error::new(io::ErrorKind::InvalidInput, e)
            }
            PassFdError::Truncated => io::Error::other(e),
        }
    }
}

/// A connected SOCK_SEQPACKET pair, both ends close-on-exec. SEQPACKET
/// rather than STREAM: each message arrives whole and alone, so its fds
/// cannot be attached to a neighbour's bytes.
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut sv = [0 as RawFd; 2];
    // SAFETY: sv is a live array of two fds for the kernel to fill; they are owned just below.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            sv.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: socketpair succeeded; both fds are new and ours alone.
    Ok(unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) })
}

/// Sends `data` (at least one byte) with `fds` (at most [`MAX_FDS`], may be
/// none) as one message. Returns the data bytes sent. Async-signal-safe:
/// no allocation, usable between fork and exec.
pub fn send_fds(
    sock: BorrowedFd<'_>,
    data: &[u8],
    fds: &[BorrowedFd<'_>],
) -> Result<usize, PassFdError> {
    if data.is_empty() {
        return Err(PassFdError::Empty);
    }
    if fds.len() > MAX_FDS {
        return Err(PassFdError::TooMany(fds.len()));
    }
    let mut iov = libc::iovec {
        iov_base: data.as_ptr().cast_mut().cast(),
        iov_len: data.len(),
    };
    let mut cbuf: CmsgBuf = [0; 16];
    // SAFETY: an all-zero msghdr is a valid empty one.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let bytes = (fds.len() * FD_SIZE) as u32;
        // SAFETY: CMSG_* only compute offsets; the buffer holds CMSG_SPACE
        // of MAX_FDS fds (checked by a test), and the header written is the
        // first of `msg`'s control buffer.
        unsafe {
            msg.msg_control = cbuf.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(bytes) as _;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(bytes) as _;
            #[expect(
                clippy::cast_ptr_alignment,
                reason = "accessed with read/write_unaligned only"
            )]
            let p = libc::CMSG_DATA(c).cast::<RawFd>();
            for (i, fd) in fds.iter().enumerate() {
                std::ptr::write_unaligned(p.add(i), fd.as_raw_fd());
            }
        }
    }
    loop {
        // SAFETY: `msg` points at live buffers for the whole call.
        let r = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(PassFdError::Send(e));
        }
    }
}

/// One received message: its data is `buf[..len]` of the caller's buffer.
#[derive(Debug)]
pub struct Received {
    pub len: usize,
    /// In the order sent; close-on-exec.
    pub fds: Vec<OwnedFd>,
}

/// Waits for one message into `buf`. `None` at end of stream (the peer
/// closed its end). A message longer than `buf` is cut to it.
pub fn recv_fds(sock: BorrowedFd<'_>, buf: &mut [u8]) -> Result<Option<Received>, PassFdError> {
    recv(sock, buf, 0)
}

/// Like [`recv_fds`] but never waits: with no message queued it errs with
/// [`PassFdError::would_block`] true.
pub fn try_recv_fds(sock: BorrowedFd<'_>, buf: &mut [u8]) -> Result<Option<Received>, PassFdError> {
    recv(sock, buf, libc::MSG_DONTWAIT)
}

fn recv(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    flags: libc::c_int,
) -> Result<Option<Received>, PassFdError> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf: CmsgBuf = [0; 16];
    // SAFETY: an all-zero msghdr is a valid empty one.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    // Exactly MAX_FDS' worth: a message with more is cut short by the
    // kernel (MSG_CTRUNC), whatever spare room the buffer has.
    // SAFETY: CMSG_SPACE only computes a size.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE((MAX_FDS * FD_SIZE) as u32) } as _;
    let n = loop {
        // SAFETY: `msg` points at live buffers for the whole call.
        let r =
            unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, flags | libc::MSG_CMSG_CLOEXEC) };
        if r >= 0 {
            break r as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(PassFdError::Recv(e));
        }
    };
    // Take ownership of every fd the kernel installed before judging the
    // message, so that each path below closes what it does not return.
    let mut fds = Vec::new();
    // SAFETY: the kernel filled the control buffer and set msg_controllen;
    // CMSG_FIRSTHDR/NXTHDR stay inside it. SCM_RIGHTS data is an array of
    // fds just installed in this process, owned by no one else yet.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / FD_SIZE;
                #[expect(
                    clippy::cast_ptr_alignment,
                    reason = "accessed with read/write_unaligned only"
                )]
                let p = libc::CMSG_DATA(c).cast::<RawFd>();
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(p.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(PassFdError::Truncated);
    }
    if n == 0 {
        return Ok(None);
    }
    Ok(Some(Received { len: n, fds }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn same_file(a: BorrowedFd<'_>, b: BorrowedFd<'_>) -> bool {
        let st = |fd: BorrowedFd<'_>| {
            // SAFETY: libc::stat is plain integers: all-zero is a valid value.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: the borrowed fd is open; st is a live stat for the kernel to fill.
            assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
            (st.st_dev, st.st_ino)
        };
        st(a) == st(b)
    }

    fn cloexec(fd: BorrowedFd<'_>) -> bool {
        // SAFETY: F_GETFD on a borrowed open fd only reads its flags.
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) & libc::FD_CLOEXEC != 0 }
    }

    /// A pipe whose read end reports EOF (0) only once every copy of the
    /// write end is closed, and EAGAIN while one is open.
    fn pipe() -> (OwnedFd, OwnedFd) {
        let mut p = [0; 2];
        assert_eq!(
            // SAFETY: p is a live array of two ints for the kernel to fill.
            unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) },
            0
        );
        // SAFETY: pipe2 just returned both fds, owned by no one else.
        unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) }
    }

    fn write_ends_all_closed(r: &OwnedFd) -> bool {
        let mut b = [0u8; 1];
        // SAFETY: r is open (borrowed); b is a live 1-byte buffer.
        unsafe { libc::read(r.as_raw_fd(), b.as_mut_ptr().cast(), 1) == 0 }
    }

    #[test]
    fn control_buffer_holds_max_fds() {
        // SAFETY: CMSG_SPACE only computes a size.
        let space = unsafe { libc::CMSG_SPACE((MAX_FDS * FD_SIZE) as u32) } as usize;
        assert!(space <= std::mem::size_of::<CmsgBuf>(), "{space}");
    }

    #[test]
    fn one_fd_and_a_byte_cross_close_on_exec() {
        let (a, b) = seqpacket_pair().unwrap();
        let f = std::fs::File::open("/proc/self/status").unwrap();
        assert_eq!(send_fds(a.as_fd(), &[0], &[f.as_fd()]).unwrap(), 1);
        let mut buf = [9u8; 8];
        let m = recv_fds(b.as_fd(), &mut buf).unwrap().unwrap();
        assert_eq!((m.len, buf[0], m.fds.len()), (1, 0, 1));
        assert!(same_file(m.fds[0].as_fd(), f.as_fd()));
        assert_ne!(m.fds[0].as_raw_fd(), f.as_raw_fd());
        assert!(cloexec(m.fds[0].as_fd()));
    }

    #[test]
    fn several_fds_keep_their_order_and_text() {
        let (a, b) = seqpacket_pair().unwrap();
        let files: Vec<std::fs::File> = ["/proc/self/status", "/dev/null", "/proc/self/stat", "/"]
            .iter()
            .map(|p| std::fs::File::open(p).unwrap())
            .collect();
        let fds: Vec<BorrowedFd<'_>> = files.iter().map(|f| f.as_fd()).collect();
        send_fds(a.as_fd(), b"ok", &fds).unwrap();
        send_fds(a.as_fd(), b"Ewhy", &[]).unwrap();
        let mut buf = [0u8; 64];
        let m = recv_fds(b.as_fd(), &mut buf).unwrap().unwrap();
        assert_eq!(&buf[..m.len], b"ok");
        assert_eq!(m.fds.len(), 4);
        for (got, sent) in m.fds.iter().zip(&files) {
            assert!(same_file(got.as_fd(), sent.as_fd()));
        }
        let m = recv_fds(b.as_fd(), &mut buf).unwrap().unwrap();
        assert_eq!((&buf[..m.len], m.fds.len()), (&b"Ewhy"[..], 0));
    }

    #[test]
    fn end_of_stream_is_none() {
        let (a, b) = seqpacket_pair().unwrap();
        drop(a);
        assert!(recv_fds(b.as_fd(), &mut [0u8; 4]).unwrap().is_none());
    }

    #[test]
    fn nothing_queued_would_block() {
        let (_a, b) = seqpacket_pair().unwrap();
        let e = try_recv_fds(b.as_fd(), &mut [0u8; 4]).unwrap_err();
        assert!(e.would_block(), "{e}");
        assert_eq!(io::Error::from(e).kind(), io::ErrorKind::WouldBlock);
    }

    #[test]
    fn empty_data_and_too_many_fds_are_refused_before_sending() {
        let (a, b) = seqpacket_pair().unwrap();
        let f = std::fs::File::open("/dev/null").unwrap();
        assert!(matches!(
            send_fds(a.as_fd(), b"", &[f.as_fd()]),
            Err(PassFdError::Empty)
        ));
        let many = vec![f.as_fd(); MAX_FDS + 1];
        assert!(matches!(
            send_fds(a.as_fd(), b"x", &many),
            Err(PassFdError::TooMany(n)) if n == MAX_FDS + 1
        ));
        // Nothing reached the peer.
        assert!(
            try_recv_fds(b.as_fd(), &mut [0u8; 4])
                .unwrap_err()
                .would_block()
        );
    }

    #[test]
    fn a_sender_gets_epipe_not_sigpipe() {
        let (a, b) = seqpacket_pair().unwrap();
        drop(b);
        match send_fds(a.as_fd(), b"x", &[]) {
            Err(PassFdError::Send(e)) => assert_eq!(e.raw_os_error(), Some(libc::EPIPE)),
            other => panic!("{other:?}"),
        }
    }

    /// Sends `n` copies of `fd` with raw sendmsg (past MAX_FDS).
    fn raw_send(sock: BorrowedFd<'_>, fd: BorrowedFd<'_>, n: usize) {
        let mut cbuf = vec![0u64; 64];
        let mut byte = [b'x'];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let bytes = (n * FD_SIZE) as u32;
        // SAFETY: msghdr is plain data (all-zero is valid); CMSG_* stay inside cbuf, sized by
        // CMSG_SPACE (asserted); iov and cbuf outlive sendmsg.
        unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = cbuf.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(bytes) as _;
            assert!(msg.msg_controllen as usize <= cbuf.len() * 8);
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(bytes) as _;
            #[expect(
                clippy::cast_ptr_alignment,
                reason = "accessed with read/write_unaligned only"
            )]
            let p = libc::CMSG_DATA(c).cast::<RawFd>();
            for i in 0..n {
                std::ptr::write_unaligned(p.add(i), fd.as_raw_fd());
            }
            assert_eq!(libc::sendmsg(sock.as_raw_fd(), &msg, 0), 1);
        }
    }

    #[test]
    fn cut_short_fds_are_refused_and_closed() {
        let (a, b) = seqpacket_pair().unwrap();
        let (r, w) = pipe();
        raw_send(a.as_fd(), w.as_fd(), MAX_FDS + 4);
        let e = recv_fds(b.as_fd(), &mut [0u8; 4]).unwrap_err();
        assert!(matches!(e, PassFdError::Truncated), "{e}");
        drop(w);
        // Had any received copy of the write end stayed open, the pipe
        // would not be at EOF.
        assert!(write_ends_all_closed(&r));
    }

    #[test]
    fn unread_fds_are_closed_with_the_message() {
        let (a, b) = seqpacket_pair().unwrap();
        let (r, w) = pipe();
        send_fds(a.as_fd(), b"x", &[w.as_fd(), w.as_fd()]).unwrap();
        drop(w);
        let m = recv_fds(b.as_fd(), &mut [0u8; 4]).unwrap().unwrap();
        assert_eq!(m.fds.len(), 2);
        assert!(!write_ends_all_closed(&r));
        drop(m);
        assert!(write_ends_all_closed(&r));
    }
}
