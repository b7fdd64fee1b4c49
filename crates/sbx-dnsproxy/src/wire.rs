//! The fast path's wire format: reading the common query shape (one
//! question, optionally one OPT record, plain lower/upper-case LDH names)
//! without building a message, and answering from a prebuilt response
//! template whose TTLs are patched in place. Anything else goes through
//! hickory-proto (the slow path), which gives the same answers.

/// A query in the common shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FastQuery {
    pub id: u16,
    /// RD and CD as asked (copied to the reply).
    pub rd: bool,
    pub cd: bool,
    /// The question as sent (name, type, class), echoed in the reply.
    pub question_end: usize,
    /// Lower case, no trailing dot.
    pub name: String,
    pub qtype: u16,
    pub qclass: u16,
    /// The EDNS UDP payload size, when the query has an OPT record.
    pub edns: Option<u16>,
}

fn be16(b: &[u8], i: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(i)?, *b.get(i + 1)?]))
}

/// Reads a query of the common shape; `None` sends it to the slow path.
pub fn parse_query(b: &[u8]) -> Option<FastQuery> {
    if b.len() < 17 || b.len() > 512 {
        return None;
    }
    let flags = be16(b, 2)?;
    // QR=0, opcode QUERY, AA=0, TC=0, Z=0, AD=0, RCODE=0.
    if flags & 0xfa7f != 0 {
        return None;
    }
    let (qd, an, ns, ar) = (be16(b, 4)?, be16(b, 6)?, be16(b, 8)?, be16(b, 10)?);
    if qd != 1 || an != 0 || ns != 0 || ar > 1 {
        return None;
    }
    let mut i = 12;
    let mut name = String::with_capacity(64);
    loop {
        let l = *b.get(i)? as usize;
        i += 1;
        if l == 0 {
            break;
        }
        if l > 63 {
            return None; // a pointer or a reserved label type
        }
        let label = b.get(i..i + l)?;
        if !name.is_empty() {
            name.push('.');
        }
        for &c in label {
            if !(c.is_ascii_alphanumeric() || c == b'-' || c == b'_') {
                return None;
            }
            name.push(c.to_ascii_lowercase() as char);
        }
        i += l;
        if i - 12 > 255 {
            return None;
        }
    }
    if name.is_empty() {
        return None; // the root: rare, slow path
    }
    let qtype = be16(b, i)?;
    let qclass = be16(b, i + 2)?;
    i += 4;
    let question_end = i;
    let mut edns = None;
    if ar == 1 {
        // OPT: root name, type 41, class = payload, ttl = ext-rcode,
        // version, flags; rdata = options (skipped).
        if *b.get(i)? != 0 || be16(b, i + 1)? != 41 {
            return None;
        }
        let payload = be16(b, i + 3)?;
        let (ext, version) = (*b.get(i + 5)?, *b.get(i + 6)?);
        if ext != 0 || version != 0 {
            return None;
        }
        // DO (DNSSEC OK): the slow path keeps the signatures.
        if *b.get(i + 7)? & 0x80 != 0 {
            return None;
        }
        let rdlen = be16(b, i + 9)? as usize;
        i += 11 + rdlen;
        edns = Some(payload.max(512));
    }
    if i != b.len() {
        return None;
    }
    Some(FastQuery {
        id: be16(b, 0)?,
        rd: flags & 0x0100 != 0,
        cd: flags & 0x0010 != 0,
        question_end,
        name,
        qtype,
        qclass,
        edns,
    })
}

/// A response prebuilt for one (name, type): the answer and authority
/// sections as bytes (their names compressed against the question at
/// offset 12, which every reply to that name shares) and where their TTLs
/// are.
#[derive(Debug, Clone)]
pub struct Template {
    pub rcode: u8,
    pub an: u16,
    pub ns: u16,
    /// The sections after the question.
    pub sections: Vec<u8>,
    /// (offset in `sections`, TTL to count down from).
    pub ttls: Vec<(usize, u32)>,
}

fn skip_name(b: &[u8], mut i: usize) -> Option<usize> {
    loop {
        let l = *b.get(i)?;
        if l & 0xc0 == 0xc0 {
            b.get(i + 1)?;
            return Some(i + 2);
        }
        if l & 0xc0 != 0 {
            return None;
        }
        i += 1;
        if l == 0 {
            return Some(i);
        }
        i += l as usize;
    }
}

impl Template {
    /// From a whole response (written by hickory for the lower-case
    /// question, without OPT): finds the sections and their TTL fields;
    /// each TTL is capped at `ttl_cap`.
    pub fn from_response(resp: &[u8], ttl_cap: u32) -> Option<Template> {
        let rcode = *resp.get(3)? & 0x0f;
        let (qd, an, ns, ar) = (
            be16(resp, 4)?,
            be16(resp, 6)?,
            be16(resp, 8)?,
            be16(resp, 10)?,
        );
        if qd != 1 || ar != 0 {
            return None;
        }
        let mut i = skip_name(resp, 12)? + 4;
        let start = i;
        let mut ttls = Vec::new();
        for _ in 0..(u32::from(an) + u32::from(ns)) {
            i = skip_name(resp, i)?;
            let ttl_at = i + 4;
            let ttl = u32::from_be_bytes(resp.get(ttl_at..ttl_at + 4)?.try_into().ok()?);
            ttls.push((ttl_at - start, ttl.min(ttl_cap)));
            let rdlen = be16(resp, i + 8)? as usize;
            i += 10 + rdlen;
        }
        if i != resp.len() {
            return None;
        }
        Some(Template {
            rcode,
            an,
            ns,
            sections: resp[start..].to_vec(),
            ttls,
        })
    }
}

/// A reply to `q` (whose wire bytes are `query`): the header, the question
/// as asked, then `t`'s sections with TTLs aged by `age` seconds (or no
/// sections and `rcode`), then an OPT record when the query had one.
/// `limit`: the largest reply allowed (UDP); beyond it the reply is sent
/// truncated, without sections.
pub fn reply(
    query: &[u8],
    q: &FastQuery,
    t: Option<&Template>,
    rcode: u8,
    age: u32,
    udp_payload: u16,
    limit: Option<usize>,
) -> Vec<u8> {
    let sections = t.map_or(0, |t| t.sections.len());
    let opt = if q.edns.is_some() { 11 } else { 0 };
    let len = q.question_end + sections + opt;
    let truncated = limit.is_some_and(|l| len > l);
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&q.id.to_be_bytes());
    let mut flags: u16 = 0x8080; // QR, RA
    if q.rd {
        flags |= 0x0100;
    }
    if q.cd {
        flags |= 0x0010;
    }
    if truncated {
        flags |= 0x0200;
    }
    let rcode = t.map_or(rcode, |t| t.rcode);
    flags |= u16::from(rcode & 0x0f);
    out.extend_from_slice(&flags.to_be_bytes());
    let (an, ns) = match t {
        Some(t) if !truncated => (t.an, t.ns),
        _ => (0, 0),
    };
    out.extend_from_slice(&1u16.to_be_bytes());
    out.extend_from_slice(&an.to_be_bytes());
    out.extend_from_slice(&ns.to_be_bytes());
    out.extend_from_slice(&u16::from(opt != 0).to_be_bytes());
    out.extend_from_slice(&query[12..q.question_end]);
    if let (Some(t), false) = (t, truncated) {
        let base = out.len();
        out.extend_from_slice(&t.sections);
        for &(at, ttl) in &t.ttls {
            let v = ttl.saturating_sub(age);
            out[base + at..base + at + 4].copy_from_slice(&v.to_be_bytes());
        }
    }
    if opt != 0 {
        out.push(0);
        out.extend_from_slice(&41u16.to_be_bytes());
        out.extend_from_slice(&udp_payload.to_be_bytes());
        out.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(name: &[&str], qtype: u16, opt: bool) -> Vec<u8> {
        let mut b = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, u8::from(opt)];
        for l in name {
            b.push(l.len() as u8);
            b.extend_from_slice(l.as_bytes());
        }
        b.push(0);
        b.extend_from_slice(&qtype.to_be_bytes());
        b.extend_from_slice(&1u16.to_be_bytes());
        if opt {
            b.extend_from_slice(&[0, 0, 41, 0x04, 0xd0, 0, 0, 0, 0, 0, 0]);
        }
        b
    }

    #[test]
    fn parses_the_common_shape() {
        let b = q(&["WWW", "Example", "com"], 1, true);
        let p = parse_query(&b).unwrap();
        assert_eq!(p.name, "www.example.com");
        assert_eq!(
            (p.id, p.qtype, p.qclass, p.edns, p.rd),
            (0x1234, 1, 1, Some(1232), true)
        );
        let b = q(&["a"], 28, false);
        assert_eq!(parse_query(&b).unwrap().edns, None);
        // DO set: the slow path (it keeps the signatures).
        let mut d = q(&["a", "test"], 1, true);
        let at = d.len() - 4;
        d[at] = 0x80;
        assert!(parse_query(&d).is_none());
    }

    #[test]
    fn unusual_shapes_go_to_the_slow_path() {
        let good = q(&["a", "test"], 1, true);
        for i in 0..good.len() {
            assert!(parse_query(&good[..i]).is_none(), "truncated at {i}");
        }
        let mut resp = good.clone();
        resp[2] |= 0x80;
        assert!(parse_query(&resp).is_none());
        let mut opcode = good.clone();
        opcode[2] |= 0x28;
        assert!(parse_query(&opcode).is_none());
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(parse_query(&trailing).is_none());
        assert!(parse_query(&q(&["a b"], 1, false)).is_none());
        assert!(parse_query(&q(&["a\\.b"], 1, false)).is_none());
        let mut ptr = good[..12].to_vec();
        ptr.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1]);
        assert!(parse_query(&ptr).is_none());
    }
}
