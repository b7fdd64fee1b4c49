//! Just enough rtnetlink to set up the sandbox's `lo`: link up, an address,
//! a default route. Raw messages on a NETLINK_ROUTE socket: a few hundred
//! microseconds in all, where spawning `ip` costs milliseconds per call.
//! Runs in the forked child before exec, so it allocates nothing but
//! fixed buffers on the stack.

use std::io;
use std::net::IpAddr;

const NLMSG_HDRLEN: usize = 16;
const RTM_NEWLINK: u16 = 16;
const RTM_NEWADDR: u16 = 20;
const RTM_NEWROUTE: u16 = 24;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLMSG_ERROR: u16 = 2;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const IFA_F_NODAD: u8 = 0x02;
const RTA_OIF: u16 = 4;
const RTA_PREFSRC: u16 = 7;
const RT_TABLE_MAIN: u8 = 254;
const RTPROT_BOOT: u8 = 3;
const RT_SCOPE_UNIVERSE: u8 = 0;
const RT_SCOPE_LINK: u8 = 253;
const RTN_UNICAST: u8 = 1;

/// The loopback device of a fresh network namespace is always index 1.
pub const LO_INDEX: u32 = 1;

struct Msg {
    buf: [u8; 256],
    len: usize,
}

impl Msg {
    fn new(ty: u16, flags: u16, seq: u32) -> Self {
        let mut m = Msg {
            buf: [0; 256],
            len: NLMSG_HDRLEN,
        };
        m.buf[4..6].copy_from_slice(&ty.to_ne_bytes());
        m.buf[6..8].copy_from_slice(&(flags | NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        m.buf[8..12].copy_from_slice(&seq.to_ne_bytes());
        m
    }

    fn put(&mut self, bytes: &[u8]) {
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
        self.len = (self.len + 3) & !3;
    }

    fn attr(&mut self, ty: u16, data: &[u8]) {
        let l = (4 + data.len()) as u16;
        let start = self.len;
        self.buf[start..start + 2].copy_from_slice(&l.to_ne_bytes());
        self.buf[start + 2..start + 4].copy_from_slice(&ty.to_ne_bytes());
        self.buf[start + 4..start + 4 + data.len()].copy_from_slice(data);
        self.len = (start + l as usize + 3) & !3;
    }

    fn finish(&mut self) -> &[u8] {
        let l = self.len as u32;
        self.buf[0..4].copy_from_slice(&l.to_ne_bytes());
        &self.buf[..self.len]
    }
}

fn ip_bytes(ip: &IpAddr, out: &mut [u8; 16]) -> usize {
    match ip {
        IpAddr::V4(a) => {
            out[..4].copy_from_slice(&a.octets());
            4
        }
        IpAddr::V6(a) => {
            out.copy_from_slice(&a.octets());
            16
        }
    }
}

fn family(ip: &IpAddr) -> u8 {
    if ip.is_ipv4() {
        libc::AF_INET as u8
    } else {
        libc::AF_INET6 as u8
    }
}

/// A NETLINK_ROUTE socket that sends one request at a time and checks the ack.
pub struct Rtnl {
    fd: i32,
    seq: u32,
}

impl Rtnl {
    pub fn open() -> io::Result<Self> {
        // SAFETY: socket(2) takes no pointers; the fd is owned by the Rtnl
        // returned (closed in its Drop).
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Rtnl { fd, seq: 1 })
    }

    fn request(&mut self, m: &mut Msg) -> io::Result<()> {
        let b = m.finish();
        // SAFETY: self.fd is the open netlink socket this Rtnl owns; `b`
        // is valid for `b.len()` bytes during the call.
        let n = unsafe { libc::send(self.fd, b.as_ptr().cast(), b.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut rb = [0u8; 1024];
        loop {
            // SAFETY: self.fd is open; recv writes at most `rb.len()` bytes
            // into `rb`, which lives across the call.
            let n = unsafe { libc::recv(self.fd, rb.as_mut_ptr().cast(), rb.len(), 0) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            let n = n as usize;
            if n < NLMSG_HDRLEN + 4 {
                return Err(io::Error::other("short netlink reply"));
            }
            let ty = u16::from_ne_bytes([rb[4], rb[5]]);
            let seq = u32::from_ne_bytes([rb[8], rb[9], rb[10], rb[11]]);
            if seq != self.seq {
                continue;
            }
            self.seq += 1;
            if ty == NLMSG_ERROR {
                let err = i32::from_ne_bytes([rb[16], rb[17], rb[18], rb[19]]);
                if err == 0 {
                    return Ok(());
                }
                return Err(io::Error::from_raw_os_error(-err));
            }
            return Err(io::Error::other("unexpected netlink reply"));
        }
    }

    /// `ip link set dev INDEX up`.
    pub fn link_up(&mut self, index: u32) -> io::Result<()> {
        let mut m = Msg::new(RTM_NEWLINK, 0, self.seq);
        // struct ifinfomsg { family u8, pad u8, type u16, index i32, flags u32, change u32 }
        let mut ifi = [0u8; 16];
        ifi[4..8].copy_from_slice(&(index as i32).to_ne_bytes());
        ifi[8..12].copy_from_slice(&(libc::IFF_UP as u32).to_ne_bytes());
        ifi[12..16].copy_from_slice(&(libc::IFF_UP as u32).to_ne_bytes());
        m.put(&ifi);
        self.request(&mut m)
    }

    /// `ip addr add IP/PREFIX dev INDEX` (IPv6 without DAD).
    pub fn add_addr(&mut self, index: u32, ip: IpAddr, prefix: u8) -> io::Result<()> {
        let mut m = Msg::new(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, self.seq);
        // struct ifaddrmsg { family u8, prefixlen u8, flags u8, scope u8, index u32 }
        let mut ifa = [0u8; 8];
        ifa[0] = family(&ip);
        ifa[1] = prefix;
        ifa[2] = if ip.is_ipv6() { IFA_F_NODAD } else { 0 };
        ifa[3] = RT_SCOPE_UNIVERSE;
        ifa[4..8].copy_from_slice(&index.to_ne_bytes());
        m.put(&ifa);
        let mut a = [0u8; 16];
        let n = ip_bytes(&ip, &mut a);
        m.attr(IFA_LOCAL, &a[..n]);
        m.attr(IFA_ADDRESS, &a[..n]);
        self.request(&mut m)
    }

    /// `ip route add default dev INDEX src SRC`.
    pub fn add_default_route(&mut self, index: u32, src: IpAddr) -> io::Result<()> {
        let mut m = Msg::new(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, self.seq);
        // struct rtmsg { family, dst_len, src_len, tos, table, protocol, scope, type: u8; flags u32 }
        let mut rt = [0u8; 12];
        rt[0] = family(&src);
        rt[4] = RT_TABLE_MAIN;
        rt[5] = RTPROT_BOOT;
        rt[6] = if src.is_ipv4() {
            RT_SCOPE_LINK
        } else {
            RT_SCOPE_UNIVERSE
        };
        rt[7] = RTN_UNICAST;
        m.put(&rt);
        m.attr(RTA_OIF, &index.to_ne_bytes());
        let mut a = [0u8; 16];
        let n = ip_bytes(&src, &mut a);
        m.attr(RTA_PREFSRC, &a[..n]);
        self.request(&mut m)
    }
}

impl Drop for Rtnl {
    fn drop(&mut self) {
        // SAFETY: self.fd came from socket(2) in `open`, is owned only by
        // this Rtnl and is closed once, here.
        unsafe { libc::close(self.fd) };
    }
}
