//! Init -> outer sbx-fs messages over a SOCK_SEQPACKET socketpair made
//! before the clone: a tag byte, a text, and at most one fd (SCM_RIGHTS).
//! The /dev/fuse fd must be opened inside the sandbox's user namespace
//! (the kernel checks the opener's), but served outside its PID namespace.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use sbx_core::passfd;

/// The /dev/fuse fd of the mounted guard file system.
pub const TAG_FUSE: u8 = b'F';
/// The guard file system could not be set up: the text says why.
pub const TAG_UNAVAILABLE: u8 = b'E';
/// An O_PATH fd of the sandbox's /tmp (watched for "full").
pub const TAG_TMP: u8 = b'T';
/// An O_PATH fd of the root of the write budget's tmpfs (`--write-quota`).
pub const TAG_QUOTA: u8 = b'Q';

pub fn pair() -> io::Result<(OwnedFd, OwnedFd)> {
    passfd::seqpacket_pair()
}

/// Sends one message. `sock` None (init was given no channel) fails as a
/// closed fd would.
pub fn send(
    sock: Option<BorrowedFd<'_>>,
    tag: u8,
    text: &str,
    fd: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let Some(sock) = sock else {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    };
    let mut data = Vec::with_capacity(1 + text.len());
    data.push(tag);
    data.extend_from_slice(text.as_bytes());
    passfd::send_fds(sock, &data, fd.as_slice())?;
    Ok(())
}

/// One message: (tag, text, fd). None at end of stream.
pub fn recv(sock: &OwnedFd) -> io::Result<Option<(u8, String, Option<OwnedFd>)>> {
    let mut data = [0u8; 4096];
    let Some(m) = passfd::recv_fds(sock.as_fd(), &mut data)? else {
        return Ok(None);
    };
    let text = String::from_utf8_lossy(&data[1..m.len]).into_owned();
    Ok(Some((data[0], text, m.fds.into_iter().next())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_fd_crosses() {
        let (a, b) = pair().unwrap();
        let f = std::fs::File::open("/proc/self/status").unwrap();
        send(Some(a.as_fd()), TAG_TMP, "x", Some(f.as_fd())).unwrap();
        send(Some(a.as_fd()), TAG_UNAVAILABLE, "why", None).unwrap();
        let (t, s, fd) = recv(&b).unwrap().unwrap();
        assert_eq!((t, s.as_str()), (TAG_TMP, "x"));
        assert!(fd.is_some());
        let (t, s, fd) = recv(&b).unwrap().unwrap();
        assert_eq!(
            (t, s.as_str(), fd.is_none()),
            (TAG_UNAVAILABLE, "why", true)
        );
        drop(a);
        assert!(recv(&b).unwrap().is_none());
    }
}
