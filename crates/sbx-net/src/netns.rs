//! The sandbox side: runs in the forked child, before exec. It enters a new
//! network namespace (and a user namespace when it lacks CAP_SYS_ADMIN for
//! that), sets up `lo`, creates the gateway's listening sockets *inside*,
//! loads the nft rules, hands the sockets to the supervisor over SCM_RIGHTS
//! and lets the exec go on. Nothing here touches the host namespace.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use nix::sched::CloneFlags;
use sbx_core::passfd;

use crate::netlink::{LO_INDEX, Rtnl};
use crate::nft::{Batch, Layout};

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("socketpair: {0}")]
    SocketPair(io::Error),
    #[error("receiving the sandbox's sockets: {0}")]
    Recv(io::Error),
    #[error("sandbox set-up: {0}")]
    Child(String),
}

/// What the child needs, prepared before fork (no allocation after it
/// except on the error path).
pub struct Prepared {
    pub ruleset: Batch,
    pub layout: Layout,
    /// The child's end of the hand-over socket.
    pub chan: OwnedFd,
    pub uid: u32,
    pub gid: u32,
    /// Phantom credentials: the sandbox's CA bundle (a file sbx-net
    /// wrote, by path: a mount source must be reached from the new mount
    /// namespace) bound read-only over the system bundle in a mount
    /// namespace of the command's own.
    pub trust: Option<TrustBind>,
}

/// Paths prepared before the fork (no allocation in the child).
pub struct TrustBind {
    pub source: std::ffi::CString,
    pub target: std::ffi::CString,
}

impl TrustBind {
    pub fn new(source: &std::path::Path, target: &str) -> io::Result<TrustBind> {
        use std::os::unix::ffi::OsStrExt;
        let source =
            std::ffi::CString::new(source.as_os_str().as_bytes()).map_err(io::Error::other)?;
        let target = std::ffi::CString::new(target).map_err(io::Error::other)?;
        Ok(TrustBind { source, target })
    }

    /// In the child: a mount namespace of its own (no propagation back to
    /// the host's) with the bundle bound read-only over the system one.
    fn apply(&self) -> io::Result<()> {
        // SAFETY: plain syscalls on C strings prepared before the fork.
        unsafe {
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_SLAVE,
                std::ptr::null(),
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            if libc::mount(
                self.source.as_ptr(),
                self.target.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            if libc::mount(
                std::ptr::null(),
                self.target.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND
                    | libc::MS_REMOUNT
                    | libc::MS_RDONLY
                    | libc::MS_NOSUID
                    | libc::MS_NODEV,
                std::ptr::null(),
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// The sockets created inside (no IPv6 pair on a kernel without IPv6).
pub struct Handed {
    pub tcp4: OwnedFd,
    pub udp4: OwnedFd,
    pub v6: Option<(OwnedFd, OwnedFd)>,
    /// The SYN queue (nfnetlink), bound inside.
    pub synq: OwnedFd,
}

pub fn channel() -> Result<(OwnedFd, OwnedFd), NetnsError> {
    sbx_core::passfd::seqpacket_pair().map_err(NetnsError::SocketPair)
}

fn write_file(path: &std::ffi::CStr, data: &[u8]) -> io::Result<()> {
    // SAFETY: `path` is a NUL-terminated CStr that outlives the call.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is open; `data` is valid for
    // `data.len()` bytes for the whole call.
    let n = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
    let e = io::Error::last_os_error();
    // SAFETY: fd is ours, open, and closed exactly once here.
    unsafe { libc::close(fd) };
    if n < 0 || n as usize != data.len() {
        return Err(e);
    }
    Ok(())
}

fn listener(ip: IpAddr, port: u16, tcp: bool) -> io::Result<OwnedFd> {
    let (dom, ty) = (
        if ip.is_ipv4() {
            libc::AF_INET
        } else {
            libc::AF_INET6
        },
        if tcp {
            libc::SOCK_STREAM
        } else {
            libc::SOCK_DGRAM
        },
    );
    // SAFETY: socket(2) takes no pointers; the fd is owned just below.
    let fd = unsafe { libc::socket(dom, ty | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by socket(2), is open and nothing else
    // owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let one: libc::c_int = 1;
    // SAFETY: `fd` is an open socket borrowed for the call; the option
    // value points to `one`, a live c_int, with its exact size.
    let setopt = |level, opt| unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            std::ptr::from_ref::<libc::c_int>(&one).cast(),
            std::mem::size_of::<libc::c_int>() as u32,
        )
    };
    setopt(libc::SOL_SOCKET, libc::SO_REUSEADDR);
    let r = match ip {
        IpAddr::V4(a) => {
            let sa = libc::sockaddr_in {
                sin_family: libc::AF_INET as u16,
                sin_port: port.to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: `sa` is a fully initialised sockaddr_in on the stack,
            // passed with its own size; `fd` is an open socket.
            unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    std::ptr::from_ref::<libc::sockaddr_in>(&sa).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as u32,
                )
            }
        }
        IpAddr::V6(a) => {
            setopt(libc::IPPROTO_IPV6, libc::IPV6_V6ONLY);
            let sa = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as u16,
                sin6_port: port.to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr {
                    s6_addr: a.octets(),
                },
                sin6_scope_id: 0,
            };
            // SAFETY: `sa` is a fully initialised sockaddr_in6 on the
            // stack, passed with its own size; `fd` is an open socket.
            unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    std::ptr::from_ref::<libc::sockaddr_in6>(&sa).cast(),
                    std::mem::size_of::<libc::sockaddr_in6>() as u32,
                )
            }
        }
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: listen(2) on the open socket `fd`; no pointers.
    if tcp && unsafe { libc::listen(fd.as_raw_fd(), 1024) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

impl Prepared {
    /// Runs in the child after fork. On failure the reason is sent to the
    /// supervisor as text and the exec is stopped.
    pub fn child_setup(&self) -> io::Result<()> {
        let mut why = String::new();
        match self.setup(&mut why) {
            Ok(h) => {
                // No allocation here (a forked child): the fds on the stack.
                let v4 = [h.synq.as_fd(), h.tcp4.as_fd(), h.udp4.as_fd()];
                let both;
                let fds: &[BorrowedFd<'_>] = match &h.v6 {
                    Some((t6, u6)) => {
                        both = [v4[0], v4[1], v4[2], t6.as_fd(), u6.as_fd()];
                        &both
                    }
                    None => &v4,
                };
                passfd::send_fds(self.chan.as_fd(), b"ok", fds)?;
                Ok(())
                // `h` drops here: the sandbox keeps no handle on them.
            }
            Err(e) => {
                let msg = format!("E{why}: {e}");
                let _ = passfd::send_fds(self.chan.as_fd(), msg.as_bytes(), &[]);
                Err(e)
            }
        }
    }

    fn setup(&self, why: &mut String) -> io::Result<Handed> {
        // A new network namespace; a user namespace too only when we lack
        // the capability for the first.
        if nix::sched::unshare(CloneFlags::CLONE_NEWNET).is_err() {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EPERM) {
                why.push_str("unshare(CLONE_NEWNET)");
                return Err(e);
            }
            if nix::sched::unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNET).is_err() {
                why.push_str("unshare(CLONE_NEWUSER|CLONE_NEWNET) (are unprivileged user namespaces disabled? run `sbx-doctor --check userns`)");
                return Err(io::Error::last_os_error());
            }
            // The same ids inside: the command runs as itself, and loses
            // the namespace's capabilities at exec.
            let mut b = [0u8; 64];
            why.push_str("writing /proc/self/{setgroups,uid_map,gid_map}");
            write_file(c"/proc/self/setgroups", b"deny")?;
            let n = fmt_map(&mut b, self.uid);
            write_file(c"/proc/self/uid_map", &b[..n])?;
            let n = fmt_map(&mut b, self.gid);
            write_file(c"/proc/self/gid_map", &b[..n])?;
            why.clear();
        }
        if let Some(t) = &self.trust {
            why.push_str("binding the CA bundle over the system one (mount namespace)");
            t.apply()?;
            why.clear();
        }
        let l = &self.layout;
        why.push_str("setting up lo over rtnetlink");
        let mut nl = Rtnl::open()?;
        nl.link_up(LO_INDEX)?;
        nl.add_addr(LO_INDEX, IpAddr::V4(l.v4), 32)?;
        nl.add_default_route(LO_INDEX, IpAddr::V4(l.v4))?;
        // A kernel without IPv6 (ipv6.disable=1) or with it disabled here:
        // the sandbox then has IPv4 only (and no IPv6 way out either).
        let v6 = match nl.add_addr(LO_INDEX, IpAddr::V6(l.v6), 128) {
            Ok(()) => {
                nl.add_default_route(LO_INDEX, IpAddr::V6(l.v6))?;
                true
            }
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EAFNOSUPPORT) | Some(libc::EACCES) | Some(libc::EOPNOTSUPP)
                ) =>
            {
                false
            }
            Err(e) => return Err(e),
        };
        drop(nl);
        why.clear();
        why.push_str("creating the gateway sockets");
        let lo4 = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
        let lo6 = IpAddr::V6(std::net::Ipv6Addr::LOCALHOST);
        let (tcp4, udp4) = (
            listener(lo4, l.tcp_port, true)?,
            listener(lo4, l.dns_port, false)?,
        );
        let sock6 = if v6 {
            Some((
                listener(lo6, l.tcp_port, true)?,
                listener(lo6, l.dns_port, false)?,
            ))
        } else {
            None
        };
        why.clear();
        why.push_str("loading the nftables rules");
        self.ruleset.load()?;
        why.clear();
        why.push_str("setting up the SYN queue (nfnetlink_queue, NFQUEUE target)");
        let synq = crate::synq::child_setup(v6)?;
        why.clear();
        Ok(Handed {
            tcp4,
            udp4,
            v6: sock6,
            synq,
        })
    }
}

/// "ID ID 1\n" into `b`.
fn fmt_map(b: &mut [u8; 64], id: u32) -> usize {
    use std::io::Write;
    let mut c = std::io::Cursor::new(&mut b[..]);
    let _ = writeln!(c, "{id} {id} 1");
    c.position() as usize
}

/// Supervisor side: the sockets, or the child's reason for failing. `None`
/// when the child sent nothing (it failed before the set-up ran).
pub fn receive(chan: &OwnedFd) -> Result<Option<Handed>, NetnsError> {
    let mut buf = [0u8; 4096];
    // Not waiting: the child sends before its exec, and Supervisor::spawn
    // returned after that exec (or its failure).
    let (n, fds) = match passfd::try_recv_fds(chan.as_fd(), &mut buf) {
        Ok(Some(m)) => (m.len, m.fds),
        // The child closed its end without a word.
        Ok(None) => (0, Vec::new()),
        Err(e) if e.would_block() => return Ok(None),
        Err(e) => return Err(NetnsError::Recv(e.into())),
    };
    let msg = &buf[..n];
    if let Some(t) = msg.strip_prefix(b"E") {
        return Err(NetnsError::Child(String::from_utf8_lossy(t).into_owned()));
    }
    if msg != b"ok" || (fds.len() != 3 && fds.len() != 5) {
        return Err(NetnsError::Recv(io::Error::other(
            "malformed hand-over message",
        )));
    }
    let mut it = fds.into_iter();
    let synq = it.next().unwrap();
    let tcp4 = it.next().unwrap();
    let udp4 = it.next().unwrap();
    let v6 = match (it.next(), it.next()) {
        (Some(t), Some(u)) => Some((t, u)),
        _ => None,
    };
    Ok(Some(Handed {
        tcp4,
        udp4,
        v6,
        synq,
    }))
}
