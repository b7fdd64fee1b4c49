//! Asking the upstream servers (UDP, falling back to TCP on truncation).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("no upstream configured")]
    NoUpstream,
    #[error("upstream {0} did not answer in time")]
    Timeout(SocketAddr),
    #[error("upstream {addr}: {source}")]
    Io {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("upstream {addr} answered {rcode}")]
    Rcode {
        addr: SocketAddr,
        rcode: ResponseCode,
    },
    #[error("upstream {addr} sent an answer that does not parse")]
    Garbage { addr: SocketAddr },
    #[error("query could not be encoded: {0}")]
    Encode(String),
    #[error("query deadline passed")]
    Deadline,
}

fn build_query(
    name: &Name,
    qtype: RecordType,
    dnssec: bool,
) -> Result<(u16, Vec<u8>), UpstreamError> {
    let id: u16 = rand::random();
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    let mut q = Query::query(name.clone(), qtype);
    q.set_query_class(DNSClass::IN);
    m.add_query(q);
    let mut edns = Edns::new();
    edns.set_max_payload(1232);
    edns.flags_mut().dnssec_ok = dnssec;
    m.set_edns(edns);
    let bytes = m
        .to_vec()
        .map_err(|e| UpstreamError::Encode(e.to_string()))?;
    Ok((id, bytes))
}

/// Whether `resp` answers the query `id` for `name`/`qtype`.
fn matches(resp: &Message, id: u16, name: &Name, qtype: RecordType) -> bool {
    resp.metadata.id == id
        && resp.metadata.message_type == MessageType::Response
        && resp.queries.len() == 1
        && resp.queries[0].query_type() == qtype
        && resp.queries[0].name().eq_ignore_root(name)
}

/// Rounds over the upstreams: a silent upstream (a lost datagram) is asked
/// again, with a fresh id and port, while the deadline allows.
const ROUNDS: usize = 3;

/// Asks the upstreams in order until one gives a usable answer (NOERROR or
/// NXDOMAIN), each attempt bounded by `per_try`, the whole by `deadline`;
/// when every upstream timed out, the round is repeated (at most
/// [`ROUNDS`] rounds) while time is left.
pub async fn exchange(
    upstreams: &[SocketAddr],
    name: &Name,
    qtype: RecordType,
    dnssec: bool,
    per_try: Duration,
    deadline: Instant,
) -> Result<Message, UpstreamError> {
    if upstreams.is_empty() {
        return Err(UpstreamError::NoUpstream);
    }
    let mut last = UpstreamError::Deadline;
    for _ in 0..ROUNDS {
        let mut only_timeouts = true;
        for &addr in upstreams {
            let now = Instant::now();
            if now >= deadline {
                return Err(last);
            }
            let budget = per_try.min(deadline - now);
            match tokio::time::timeout(budget, one(addr, name, qtype, dnssec)).await {
                Ok(Ok(m)) => match m.metadata.response_code {
                    ResponseCode::NoError | ResponseCode::NXDomain => return Ok(m),
                    rcode => {
                        only_timeouts = false;
                        last = UpstreamError::Rcode { addr, rcode }
                    }
                },
                Ok(Err(e)) => {
                    only_timeouts = false;
                    last = e
                }
                Err(_) => last = UpstreamError::Timeout(addr),
            }
        }
        if !only_timeouts {
            break;
        }
    }
    Err(last)
}

async fn one(
    addr: SocketAddr,
    name: &Name,
    qtype: RecordType,
    dnssec: bool,
) -> Result<Message, UpstreamError> {
    let (id, bytes) = build_query(name, qtype, dnssec)?;
    let io = |source| UpstreamError::Io { addr, source };
    let local: SocketAddr = match addr.ip() {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let sock = UdpSocket::bind(local).await.map_err(io)?;
    sock.connect(addr).await.map_err(io)?;
    sock.send(&bytes).await.map_err(io)?;
    // We advertise 1232 bytes; a larger datagram is cut, fails to parse and
    // is ignored (a real answer that large comes truncated, then by TCP).
    // Small, because thousands of these wait at once when the upstream is
    // silent.
    let mut buf = vec![0u8; 2048];
    loop {
        let n = match sock.recv(&mut buf).await {
            Ok(n) => n,
            // ICMP port unreachable from a dead upstream: no answer.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Err(io(e)),
            Err(e) => return Err(io(e)),
        };
        if n >= buf.len() {
            // Cut by our buffer: ask over TCP for the whole answer.
            return tcp(addr, name, qtype, dnssec).await;
        }
        let Ok(m) = Message::from_vec(&buf[..n]) else {
            // A spoofed or broken datagram: keep waiting for the real one.
            continue;
        };
        if !matches(&m, id, name, qtype) {
            continue;
        }
        if m.metadata.truncation {
            return tcp(addr, name, qtype, dnssec).await;
        }
        return Ok(m);
    }
}

async fn tcp(
    addr: SocketAddr,
    name: &Name,
    qtype: RecordType,
    dnssec: bool,
) -> Result<Message, UpstreamError> {
    let (id, bytes) = build_query(name, qtype, dnssec)?;
    let io = |source| UpstreamError::Io { addr, source };
    let mut s = TcpStream::connect(addr).await.map_err(io)?;
    let mut framed = Vec::with_capacity(bytes.len() + 2);
    framed.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
    framed.extend_from_slice(&bytes);
    s.write_all(&framed).await.map_err(io)?;
    let mut len = [0u8; 2];
    s.read_exact(&mut len).await.map_err(io)?;
    let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
    s.read_exact(&mut buf).await.map_err(io)?;
    let m = Message::from_vec(&buf).map_err(|_| UpstreamError::Garbage { addr })?;
    if !matches(&m, id, name, qtype) {
        return Err(UpstreamError::Garbage { addr });
    }
    Ok(m)
}
