//! The name a connection claims: the SNI of a TLS ClientHello, or the Host
//! header of a plain HTTP request (for `--sni-check`).

/// What the first bytes of a connection say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sniff {
    /// Not enough bytes yet.
    NeedMore,
    /// A TLS ClientHello; its SNI if it has one.
    Tls(Option<String>),
    /// An HTTP/1 request; its Host if it has one.
    Http(Option<String>),
    /// Neither.
    Other,
}

/// Largest prefix we wait for (one full TLS record plus its header, or an
/// HTTP request head).
pub const MAX: usize = 16 * 1024 + 5;

pub fn sniff(b: &[u8]) -> Sniff {
    match b.first() {
        None => Sniff::NeedMore,
        Some(0x16) => tls(b),
        Some(c) if c.is_ascii_uppercase() => http(b),
        Some(_) => Sniff::Other,
    }
}

struct Rd<'a> {
    b: &'a [u8],
    p: usize,
}

impl<'a> Rd<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.p..self.p + n)?;
        self.p += n;
        Some(s)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|s| s[0] as usize)
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2).map(|s| (s[0] as usize) << 8 | s[1] as usize)
    }
    fn u24(&mut self) -> Option<usize> {
        self.take(3)
            .map(|s| (s[0] as usize) << 16 | (s[1] as usize) << 8 | s[2] as usize)
    }
}

fn tls(b: &[u8]) -> Sniff {
    if b.len() < 5 {
        return Sniff::NeedMore;
    }
    if b[1] != 3 {
        return Sniff::Other;
    }
    let rec_len = (b[3] as usize) << 8 | b[4] as usize;
    if b.len() < 5 + rec_len {
        return if 5 + rec_len > MAX {
            Sniff::Other
        } else {
            Sniff::NeedMore
        };
    }
    let rec = &b[5..5 + rec_len];
    let mut r = Rd { b: rec, p: 0 };
    let parse = |r: &mut Rd| -> Option<Option<String>> {
        if r.u8()? != 1 {
            return None; // not a ClientHello
        }
        let hs_len = r.u24()?;
        let hs = r.take(hs_len)?;
        let mut r = Rd { b: hs, p: 0 };
        r.take(2 + 32)?; // version, random
        let sid = r.u8()?;
        r.take(sid)?;
        let cs = r.u16()?;
        r.take(cs)?;
        let comp = r.u8()?;
        r.take(comp)?;
        if r.p == hs.len() {
            return Some(None);
        }
        let ext_len = r.u16()?;
        let exts = r.take(ext_len)?;
        let mut r = Rd { b: exts, p: 0 };
        while r.p < exts.len() {
            let ty = r.u16()?;
            let len = r.u16()?;
            let data = r.take(len)?;
            if ty == 0 {
                let mut r = Rd { b: data, p: 0 };
                let list = r.u16()?;
                let list = r.take(list)?;
                let mut r = Rd { b: list, p: 0 };
                while r.p < list.len() {
                    let nt = r.u8()?;
                    let nl = r.u16()?;
                    let name = r.take(nl)?;
                    if nt == 0 {
                        let s = std::str::from_utf8(name).ok()?;
                        return Some(Some(s.to_ascii_lowercase()));
                    }
                }
                return Some(None);
            }
        }
        Some(None)
    };
    match parse(&mut r) {
        Some(name) => Sniff::Tls(name),
        // A ClientHello split over several records, or garbage.
        None => Sniff::Other,
    }
}

fn http(b: &[u8]) -> Sniff {
    let Some(end) = b.windows(4).position(|w| w == b"\r\n\r\n") else {
        return if b.len() >= 8192 {
            Sniff::Other
        } else {
            looks_http_so_far(b)
        };
    };
    let Ok(head) = std::str::from_utf8(&b[..end]) else {
        return Sniff::Other;
    };
    let mut lines = head.split("\r\n");
    let first = lines.next().unwrap_or("");
    let mut parts = first.split(' ');
    let (Some(method), Some(_target), Some(ver)) = (parts.next(), parts.next(), parts.next())
    else {
        return Sniff::Other;
    };
    if !method.bytes().all(|c| c.is_ascii_uppercase()) || !ver.starts_with("HTTP/1.") {
        return Sniff::Other;
    }
    let mut host = None;
    for l in lines {
        if let Some((k, v)) = l.split_once(':')
            && k.trim().eq_ignore_ascii_case("host")
        {
            if host.is_some() {
                // Two Host headers: ambiguous, refuse to pick one.
                return Sniff::Http(None);
            }
            host = Some(strip_port(v.trim()).to_ascii_lowercase());
        }
    }
    Sniff::Http(host)
}

fn looks_http_so_far(b: &[u8]) -> Sniff {
    let method_ok = b
        .iter()
        .take_while(|c| **c != b' ')
        .all(|c| c.is_ascii_uppercase());
    if method_ok {
        Sniff::NeedMore
    } else {
        Sniff::Other
    }
}

fn strip_port(h: &str) -> &str {
    if let Some(r) = h.strip_prefix('[') {
        return r.split(']').next().unwrap_or(r);
    }
    match h.rsplit_once(':') {
        Some((a, p)) if p.bytes().all(|c| c.is_ascii_digit()) => a,
        _ => h,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ClientHello carrying `sni`.
    pub fn client_hello(sni: &str) -> Vec<u8> {
        let name = sni.as_bytes();
        let mut sn = Vec::new();
        sn.extend_from_slice(&((name.len() + 3) as u16).to_be_bytes());
        sn.push(0);
        sn.extend_from_slice(&(name.len() as u16).to_be_bytes());
        sn.extend_from_slice(name);
        let mut ext = Vec::new();
        ext.extend_from_slice(&0u16.to_be_bytes());
        ext.extend_from_slice(&(sn.len() as u16).to_be_bytes());
        ext.extend_from_slice(&sn);
        let mut hs = vec![3, 3];
        hs.extend_from_slice(&[7; 32]);
        hs.push(0);
        hs.extend_from_slice(&[0, 2, 0x13, 0x01]);
        hs.extend_from_slice(&[1, 0]);
        hs.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        hs.extend_from_slice(&ext);
        let mut msg = vec![1];
        msg.extend_from_slice(&(hs.len() as u32).to_be_bytes()[1..]);
        msg.extend_from_slice(&hs);
        let mut rec = vec![0x16, 3, 1];
        rec.extend_from_slice(&(msg.len() as u16).to_be_bytes());
        rec.extend_from_slice(&msg);
        rec
    }

    #[test]
    fn tls_sni() {
        let ch = client_hello("Denied.Test");
        assert_eq!(sniff(&ch), Sniff::Tls(Some("denied.test".into())));
        assert_eq!(sniff(&ch[..10]), Sniff::NeedMore);
        assert_eq!(sniff(&[0x16, 9, 9, 9, 9]), Sniff::Other);
    }

    #[test]
    fn http_host() {
        assert_eq!(
            sniff(b"GET / HTTP/1.1\r\nHost: allowed.test:8080\r\nX: y\r\n\r\n"),
            Sniff::Http(Some("allowed.test".into()))
        );
        assert_eq!(sniff(b"GET / HTTP/1.1\r\nHo"), Sniff::NeedMore);
        assert_eq!(sniff(b"GET / HTTP/1.0\r\n\r\n"), Sniff::Http(None));
        assert_eq!(
            sniff(b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n"),
            Sniff::Http(None)
        );
        assert_eq!(sniff(b"SSH-2.0-OpenSSH\r\n"), Sniff::Other);
        assert_eq!(sniff(b"\x00\x01"), Sniff::Other);
    }
}
