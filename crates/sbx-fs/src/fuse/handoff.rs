//! Init -> outer sbx-fs messages over a SOCK_SEQPACKET socketpair made
//! before the clone: a tag byte, a text, and at most one fd (SCM_RIGHTS).
//! The /dev/fuse fd must be opened inside the sandbox's user namespace
//! (the kernel checks the opener's), but served outside its PID namespace.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The /dev/fuse fd of the mounted guard file system.
pub const TAG_FUSE: u8 = b'F';
/// The guard file system could not be set up: the text says why.
pub const TAG_UNAVAILABLE: u8 = b'E';
/// An O_PATH fd of the sandbox's /tmp (watched for "full").
pub const TAG_TMP: u8 = b'T';

pub fn pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut p = [0 as RawFd; 2];
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            p.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) })
}

const CMSG_SPACE: usize = 64;

pub fn send(sock: RawFd, tag: u8, text: &str, fd: Option<RawFd>) -> io::Result<()> {
    let mut data = Vec::with_capacity(1 + text.len());
    data.push(tag);
    data.extend_from_slice(text.as_bytes());
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    let mut cbuf = [0u8; CMSG_SPACE];
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
        }
    }
    loop {
        let r = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
        if r >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// One message: (tag, text, fd). None at end of stream.
pub fn recv(sock: &OwnedFd) -> io::Result<Option<(u8, String, Option<OwnedFd>)>> {
    let mut data = [0u8; 4096];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    let mut cbuf = [0u8; CMSG_SPACE];
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = cbuf.len() as _;
    let n = loop {
        let r = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if r >= 0 {
            break r as usize;
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    };
    let mut fd = None;
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let raw = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<RawFd>());
                fd = Some(OwnedFd::from_raw_fd(raw));
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if n == 0 {
        return Ok(None);
    }
    let text = String::from_utf8_lossy(&data[1..n]).into_owned();
    Ok(Some((data[0], text, fd)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_fd_crosses() {
        let (a, b) = pair().unwrap();
        let f = std::fs::File::open("/proc/self/status").unwrap();
        send(a.as_raw_fd(), TAG_TMP, "x", Some(f.as_raw_fd())).unwrap();
        send(a.as_raw_fd(), TAG_UNAVAILABLE, "why", None).unwrap();
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
