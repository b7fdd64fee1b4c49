//! nfnetlink: messages built in a fixed buffer (nothing allocated, so the
//! child side may build and send them after fork), the NETLINK_NETFILTER
//! socket, and the wait for an ack. One builder for the ruleset's batch
//! ([`crate::nft`]) and the SYN queue's messages ([`crate::synq`]).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// struct nlmsghdr
pub(crate) const HDR: usize = 16;
pub(crate) const NLM_F_REQUEST: u16 = 1;
pub(crate) const NLM_F_ACK: u16 = 4;
pub(crate) const NLM_F_CREATE: u16 = 0x400;
pub(crate) const NLM_F_APPEND: u16 = 0x800;
const NLMSG_ERROR: u16 = 2;
const NLA_F_NESTED: u16 = 0x8000;
pub(crate) const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
pub(crate) const NFNL_MSG_BATCH_END: u16 = 0x11;
pub(crate) const NFNL_SUBSYS_NFTABLES: u16 = 10;

/// Netlink messages (one, or a batch) in a buffer of `N` bytes. Writing
/// past it panics: the messages built here are fixed by the code, so that
/// is a bug a test meets, never input.
pub(crate) struct Buf<const N: usize> {
    b: [u8; N],
    len: usize,
    /// Start of the message being built, and of the open nests.
    msg: usize,
    nests: [usize; 8],
    depth: usize,
}

impl<const N: usize> Buf<N> {
    pub(crate) fn new() -> Self {
        Buf {
            b: [0; N],
            len: 0,
            msg: 0,
            nests: [0; 8],
            depth: 0,
        }
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.b[..self.len]
    }

    /// Starts a message: nlmsghdr and nfgenmsg.
    pub(crate) fn begin(&mut self, ty: u16, flags: u16, seq: u32, family: u8, res_id: u16) {
        self.msg = self.len;
        let s = self.len;
        self.b[s..s + HDR + 4].fill(0);
        self.b[s + 4..s + 6].copy_from_slice(&ty.to_ne_bytes());
        self.b[s + 6..s + 8].copy_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
        self.b[s + 8..s + 12].copy_from_slice(&seq.to_ne_bytes());
        self.b[s + 16] = family;
        self.b[s + 18..s + 20].copy_from_slice(&res_id.to_be_bytes());
        self.len = s + HDR + 4;
    }

    pub(crate) fn end(&mut self) {
        let l = (self.len - self.msg) as u32;
        self.b[self.msg..self.msg + 4].copy_from_slice(&l.to_ne_bytes());
    }

    pub(crate) fn attr(&mut self, ty: u16, data: &[u8]) {
        let s = self.len;
        let l = (4 + data.len()) as u16;
        let end = (s + l as usize + 3) & !3;
        self.b[s..end].fill(0);
        self.b[s..s + 2].copy_from_slice(&l.to_ne_bytes());
        self.b[s + 2..s + 4].copy_from_slice(&ty.to_ne_bytes());
        self.b[s + 4..s + 4 + data.len()].copy_from_slice(data);
        self.len = end;
    }

    /// A NUL-terminated string attribute.
    pub(crate) fn attr_str(&mut self, ty: u16, s: &str) {
        let at = self.len;
        let l = (4 + s.len() + 1) as u16;
        let end = (at + l as usize + 3) & !3;
        self.b[at..end].fill(0);
        self.b[at..at + 2].copy_from_slice(&l.to_ne_bytes());
        self.b[at + 2..at + 4].copy_from_slice(&ty.to_ne_bytes());
        self.b[at + 4..at + 4 + s.len()].copy_from_slice(s.as_bytes());
        self.len = end;
    }

    /// A big-endian u32 attribute (nf_tables' numbers).
    pub(crate) fn attr_be32(&mut self, ty: u16, v: u32) {
        self.attr(ty, &v.to_be_bytes());
    }

    pub(crate) fn nest(&mut self, ty: u16) {
        self.nests[self.depth] = self.len;
        self.depth += 1;
        self.b[self.len + 2..self.len + 4].copy_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
        self.len += 4;
    }

    pub(crate) fn unnest(&mut self) {
        self.depth -= 1;
        let s = self.nests[self.depth];
        let l = (self.len - s) as u16;
        self.b[s..s + 2].copy_from_slice(&l.to_ne_bytes());
    }
}

pub(crate) fn netlink_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the fd is owned at once.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_NETFILTER,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by socket(2) and is ours.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub(crate) fn send(fd: &OwnedFd, b: &[u8]) -> io::Result<()> {
    // SAFETY: b is a valid buffer for its length.
    let n = unsafe { libc::send(fd.as_raw_fd(), b.as_ptr().cast(), b.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sends `b` and waits for the ack of the message numbered `seq`; the
/// first error the kernel reports (for any message of a batch, in order)
/// is the result.
pub(crate) fn request(fd: &OwnedFd, b: &[u8], seq: u32) -> io::Result<()> {
    send(fd, b)?;
    let mut rb = [0u8; 1024];
    loop {
        // SAFETY: rb is a valid buffer for its length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), rb.as_mut_ptr().cast(), rb.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let n = n as usize;
        if n < HDR + 4 {
            return Err(io::Error::other("short netlink reply"));
        }
        let ty = u16::from_ne_bytes([rb[4], rb[5]]);
        let s = u32::from_ne_bytes([rb[8], rb[9], rb[10], rb[11]]);
        if ty != NLMSG_ERROR {
            continue;
        }
        let err = i32::from_ne_bytes([rb[16], rb[17], rb[18], rb[19]]);
        if err != 0 {
            return Err(io::Error::from_raw_os_error(-err));
        }
        if s == seq {
            return Ok(());
        }
    }
}
