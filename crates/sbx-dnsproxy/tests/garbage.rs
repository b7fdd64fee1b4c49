//! Malformed, truncated, oversized and random packets never crash the
//! server: throw garbage at a running one, then ask a good question.

mod common;

use std::io::Write;
use std::net::{TcpStream, UdpSocket};
use std::time::Duration;

use common::*;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use sbx_testutil::identities;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn nasty_packets(rng: &mut Rng) -> Vec<Vec<u8>> {
    let good = query_bytes("a.allowed.test", RecordType::A, true);
    let mut v: Vec<Vec<u8>> = Vec::new();
    // Every truncation of a good query.
    for i in 0..good.len() {
        v.push(good[..i].to_vec());
    }
    // Single bit flips of a good query.
    for i in 0..good.len() * 8 {
        let mut g = good.clone();
        g[i / 8] ^= 1 << (i % 8);
        v.push(g);
    }
    // Random datagrams of every size class, oversized ones too.
    for _ in 0..1500 {
        let n = (rng.next() % 600) as usize;
        v.push(rng.bytes(n));
    }
    for n in [1500usize, 4096, 9000, 65000] {
        v.push(rng.bytes(n));
    }
    // A valid header claiming 65535 questions and records.
    let mut h = good[..12].to_vec();
    h[4..12].copy_from_slice(&[0xff; 8]);
    v.push(h);
    // A compression pointer to itself (a loop), and a forward pointer.
    v.push([&good[..12], &[0xc0, 0x0c, 0, 1, 0, 1][..]].concat());
    v.push([&good[..12], &[0xc0, 0xff, 0, 1, 0, 1][..]].concat());
    // A label length running past the end.
    v.push([&good[..12], &[63, b'a', b'b'][..]].concat());
    // A response (QR set) and an UPDATE / NOTIFY / unknown opcodes.
    for flags in [0x80u8, 0x28, 0x20, 0x78] {
        let mut g = good.clone();
        g[2] = flags;
        v.push(g);
    }
    // A 255-byte name of 63-byte labels and an over-long one.
    let mut long = good[..12].to_vec();
    for _ in 0..5 {
        long.push(63);
        long.extend(std::iter::repeat_n(b'x', 63));
    }
    long.extend_from_slice(&[0, 0, 1, 0, 1]);
    v.push(long);
    v
}

#[test]
fn garbage_then_a_good_question() {
    let up = upstream!();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d ^ u64::from(std::process::id()));
    for who in identities() {
        let mut p = Proxy::start(&up, &["--allow", "*.allowed.test"], who);
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.connect(p.addr).unwrap();
        for pkt in nasty_packets(&mut rng) {
            let _ = s.send(&pkt);
        }
        // TCP: garbage framing, a length prefix promising more than comes,
        // a zero length, random bytes, and the whole set framed properly.
        for pkt in nasty_packets(&mut rng).into_iter().step_by(37) {
            if let Ok(mut t) = TcpStream::connect(p.addr) {
                let mut framed = (pkt.len() as u16).to_be_bytes().to_vec();
                framed.extend_from_slice(&pkt);
                let _ = t.write_all(&framed);
            }
        }
        for raw in [
            vec![0xffu8, 0xff, 1, 2, 3],
            vec![0, 0],
            rng.bytes(3000),
            vec![0],
        ] {
            if let Ok(mut t) = TcpStream::connect(p.addr) {
                let _ = t.write_all(&raw);
            }
        }
        // Still alive, still answering.
        assert!(p.child.try_wait().unwrap().is_none(), "sbx-dnsproxy died");
        // The garbage used up this client's refusal budget; a good question
        // from a fresh socket is answered anyway (allowlisted names are not
        // rate-limited).
        let m = udp_query(
            p.addr,
            "a.allowed.test",
            RecordType::A,
            Duration::from_secs(8),
        )
        .expect("answer after garbage");
        assert_eq!(rcode(&m), ResponseCode::NoError);
        assert_eq!(ips(&m), ["192.0.32.10"]);
        let m = p.ask_tcp("b.allowed.test", RecordType::A);
        assert_eq!(ips(&m), ["192.0.32.10"]);
        assert!(
            p.events()
                .iter()
                .any(|e| e["event"] == "dns_refused" && e["reason"] == "malformed")
        );
        let (code, _) = p.stop();
        assert_eq!(code, 0);
    }
}
