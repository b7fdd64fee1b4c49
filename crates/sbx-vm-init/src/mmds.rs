//! Firecracker MMDS v2 client (guest side): brings the first NIC up with a
//! link-local address, takes a session token (PUT /latest/api/token), reads
//! the `sbx` object as JSON, then takes the NIC down again so the command
//! cannot query MMDS itself.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

pub const MMDS_ADDR: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);
/// The guest's address on the MMDS link.
pub const GUEST_ADDR: Ipv4Addr = Ipv4Addr::new(169, 254, 0, 2);

#[repr(C)]
struct IfReqAddr {
    name: [libc::c_char; libc::IFNAMSIZ],
    addr: libc::sockaddr_in,
    _pad: [u8; 8],
}

#[repr(C)]
struct IfReqFlags {
    name: [libc::c_char; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

fn ifname(name: &str) -> [libc::c_char; libc::IFNAMSIZ] {
    let mut n = [0 as libc::c_char; libc::IFNAMSIZ];
    for (i, b) in name.bytes().take(libc::IFNAMSIZ - 1).enumerate() {
        n[i] = b as libc::c_char;
    }
    n
}

fn sin(a: Ipv4Addr) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(a.octets()),
        },
        sin_zero: [0; 8],
    }
}

/// Sets `dev` up (or down) with the MMDS link address.
pub fn configure(dev: &str, up: bool) -> io::Result<()> {
    configure_addr(dev, GUEST_ADDR, Ipv4Addr::new(255, 255, 0, 0), up)
}

/// Sets `dev` up with `addr`/`mask`, or down.
pub fn configure_addr(dev: &str, addr: Ipv4Addr, mask: Ipv4Addr, up: bool) -> io::Result<()> {
    // SAFETY: socket with integer arguments; closed at the end of the function.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(io::Error::last_os_error());
    }
    let res = (|| {
        if up {
            let mut r = IfReqAddr {
                name: ifname(dev),
                addr: sin(addr),
                _pad: [0; 8],
            };
            // SAFETY: s is our open socket; r is a live ifreq-sized struct.
            if unsafe { libc::ioctl(s, libc::SIOCSIFADDR, &mut r) } < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut m = IfReqAddr {
                name: ifname(dev),
                addr: sin(mask),
                _pad: [0; 8],
            };
            // SAFETY: s is our open socket; m is a live ifreq-sized struct.
            if unsafe { libc::ioctl(s, libc::SIOCSIFNETMASK, &mut m) } < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        let mut f = IfReqFlags {
            name: ifname(dev),
            flags: 0,
            _pad: [0; 22],
        };
        // SAFETY: s is our open socket; f is a live ifreq-sized struct for the kernel to fill.
        if unsafe { libc::ioctl(s, libc::SIOCGIFFLAGS, &mut f) } < 0 {
            return Err(io::Error::last_os_error());
        }
        if up {
            f.flags |= libc::IFF_UP as libc::c_short;
        } else {
            f.flags &= !(libc::IFF_UP as libc::c_short);
        }
        // SAFETY: s is our open socket; f is a live ifreq-sized struct.
        if unsafe { libc::ioctl(s, libc::SIOCSIFFLAGS, &mut f) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    })();
    // SAFETY: s is ours and not used after.
    unsafe { libc::close(s) };
    res
}

fn request(req: &str) -> io::Result<(u16, Vec<u8>)> {
    let addr = SocketAddr::from((MMDS_ADDR, 80));
    let mut last = None;
    for _ in 0..50 {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
            Ok(mut s) => {
                s.set_read_timeout(Some(Duration::from_secs(5)))?;
                s.write_all(req.as_bytes())?;
                let mut out = Vec::new();
                s.read_to_end(&mut out)?;
                let text_end = out
                    .windows(4)
                    .position(|w| w == b"\r\n\r\n")
                    .unwrap_or(out.len());
                let head = String::from_utf8_lossy(&out[..text_end]).to_string();
                let status = head
                    .split_whitespace()
                    .nth(1)
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(0);
                let body = out.get(text_end + 4..).unwrap_or_default().to_vec();
                return Ok((status, body));
            }
            Err(e) => {
                last = Some(e);
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("MMDS unreachable")))
}

/// Reads the `sbx` object from MMDS (v2 session).
pub fn fetch(dev: &str) -> io::Result<serde_json::Value> {
    configure(dev, true)?;
    let res = (|| {
        let (st, token) = request(
            "PUT /latest/api/token HTTP/1.1\r\nHost: 169.254.169.254\r\n\
             X-metadata-token-ttl-seconds: 60\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )?;
        if st != 200 {
            return Err(io::Error::other(format!("MMDS token: HTTP {st}")));
        }
        let token = String::from_utf8_lossy(&token).trim().to_string();
        let (st, body) = request(&format!(
            "GET /sbx HTTP/1.1\r\nHost: 169.254.169.254\r\nAccept: application/json\r\n\
             X-metadata-token: {token}\r\nConnection: close\r\n\r\n"
        ))?;
        if st != 200 {
            return Err(io::Error::other(format!("MMDS /sbx: HTTP {st}")));
        }
        serde_json::from_slice(&body).map_err(|e| io::Error::other(format!("MMDS /sbx: {e}")))
    })();
    let _ = configure(dev, false);
    res
}

#[repr(C)]
struct RtEntry {
    rt_pad1: libc::c_ulong,
    rt_dst: libc::sockaddr_in,
    rt_gateway: libc::sockaddr_in,
    rt_genmask: libc::sockaddr_in,
    rt_flags: libc::c_ushort,
    rt_pad2: libc::c_short,
    rt_pad3: libc::c_ulong,
    rt_tos: libc::c_uchar,
    rt_class: libc::c_uchar,
    rt_pad4: [libc::c_short; 3],
    rt_metric: libc::c_short,
    rt_dev: *mut libc::c_char,
    rt_mtu: libc::c_ulong,
    rt_window: libc::c_ulong,
    rt_irtt: libc::c_ushort,
}

/// Adds the default route via `gw`.
pub fn default_route(gw: Ipv4Addr) -> io::Result<()> {
    // SAFETY: socket with integer arguments; closed at the end of the function.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: RtEntry is integers and raw pointers: all-zero (null) is a valid value.
    let mut rt: RtEntry = unsafe { std::mem::zeroed() };
    rt.rt_dst = sin(Ipv4Addr::UNSPECIFIED);
    rt.rt_genmask = sin(Ipv4Addr::UNSPECIFIED);
    rt.rt_gateway = sin(gw);
    rt.rt_flags = (libc::RTF_UP | libc::RTF_GATEWAY) as libc::c_ushort;
    // SAFETY: s is our open socket; rt is a live rtentry (its dev pointer null).
    let r = unsafe { libc::ioctl(s, libc::SIOCADDRT, &mut rt) };
    let res = if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    };
    // SAFETY: s is ours and not used after.
    unsafe { libc::close(s) };
    res
}
