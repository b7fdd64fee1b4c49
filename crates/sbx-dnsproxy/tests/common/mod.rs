//! Test harness: a real upstream (dnsmasq on 127.0.0.1, random port,
//! serving test zones from its command line, logging every query it gets),
//! the sbx-dnsproxy daemon on random ports, and a small DNS client.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData, RecordType};
use sbx_testutil::As;

#[allow(unused_imports)]
pub use sbx_testutil::{assert_event, assert_usage_error, audit_events, have, run_as, skip};

/// The test zones every upstream serves. Public-looking names answer in
/// the documentation ranges (192.0.32.0/24, 2a00:db8::/32); the rebinding
/// names answer internal addresses.
pub const ZONES: &[&str] = &[
    "--address=/allowed.test/192.0.32.10",
    "--address=/allowed.test/2a00:db8::10",
    "--host-record=exact.test,192.0.32.20",
    "--host-record=target.allowed.test,192.0.32.30",
    "--cname=alias.allowed.test,target.allowed.test",
    "--cname=hop1.allowed.test,hop2.allowed.test",
    "--cname=hop2.allowed.test,exact.test",
    "--cname=bad.allowed.test,www.evil.test",
    "--host-record=www.evil.test,198.51.200.66",
    "--host-record=evil.test,198.51.200.66",
    "--txt-record=txt.allowed.test,secret-data",
    "--host-record=loop.rebind.test,127.0.0.1",
    "--host-record=priv.rebind.test,10.0.0.5",
    "--host-record=ll.rebind.test,169.254.169.254",
    "--host-record=v6.rebind.test,::1",
    "--host-record=mixed.rebind.test,192.0.32.40",
    "--host-record=mixed.rebind.test,10.9.9.9",
    "--host-record=svc.internal.test,10.1.2.3",
    // HTTPS records: "1 . alpn=h2" and "1 . ipv4hint=10.0.0.1".
    "--dns-rr=h.allowed.test,65,00010000010003026832",
    "--dns-rr=hint.rebind.test,65,000100000400040a000001",
];

/// A dnsmasq the test started (killed on drop).
pub struct Upstream {
    pub addr: SocketAddr,
    child: Child,
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    // UDP and TCP free on the same port.
    for _ in 0..50 {
        let u = UdpSocket::bind("127.0.0.1:0").unwrap();
        let p = u.local_addr().unwrap().port();
        if std::net::TcpListener::bind(("127.0.0.1", p)).is_ok() {
            return p;
        }
    }
    panic!("no free port");
}

impl Upstream {
    pub fn start(extra: &[&str]) -> Option<Upstream> {
        let bin = ["/usr/sbin/dnsmasq", "/usr/bin/dnsmasq"]
            .into_iter()
            .find(|p| Path::new(p).exists())?;
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("queries.log");
        for attempt in 0..5 {
            let port = free_port();
            // free_port's port is free only when it looks: a parallel test
            // may start its own dnsmasq there first, and ours then dies on
            // the TCP bind while theirs answers. Ready means this
            // instance answered, told by a record only it serves.
            let nonce = format!("{}-{attempt}-{port}", std::process::id());
            let mut cmd = Command::new(bin);
            cmd.args([
                "--keep-in-foreground",
                "--no-resolv",
                "--no-hosts",
                "--no-poll",
                "--bind-interfaces",
                "--listen-address=127.0.0.1",
                "--pid-file=",
                "--log-queries",
                "--local-ttl=300",
                "--cache-size=0",
            ])
            .arg(format!("--port={port}"))
            .arg(format!("--log-facility={}", log.display()))
            .arg(format!("--txt-record=ready.test,{nonce}"))
            .args(ZONES)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
            if sbx_testutil::is_root() {
                cmd.arg("--user=root");
            }
            let mut child = cmd.spawn().expect("spawn dnsmasq");
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
            // Ready when it answers.
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                let ours = udp_query(
                    addr,
                    "ready.test",
                    RecordType::TXT,
                    Duration::from_millis(200),
                )
                .is_some_and(|m| {
                    m.answers.iter().any(|r| match &r.data {
                        RData::TXT(t) => t.to_string() == nonce,
                        _ => false,
                    })
                });
                if ours {
                    return Some(Upstream {
                        addr,
                        child,
                        log,
                        _dir: dir,
                    });
                }
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("dnsmasq did not start");
    }

    /// The queries dnsmasq received (its log lines `query[TYPE] NAME from ...`).
    pub fn queries(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once("query[").map(|(_, r)| r.to_string()))
            .collect()
    }

    /// Whether dnsmasq was ever asked about `name` (any type).
    pub fn was_asked(&self, name: &str) -> bool {
        self.queries().iter().any(|q| {
            q.split_whitespace()
                .nth(1)
                .is_some_and(|n| n.eq_ignore_ascii_case(name))
        })
    }

    pub fn times_asked(&self, name: &str) -> usize {
        self.queries()
            .iter()
            .filter(|q| {
                q.split_whitespace()
                    .nth(1)
                    .is_some_and(|n| n.eq_ignore_ascii_case(name))
            })
            .count()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts dnsmasq or skips the test.
#[macro_export]
macro_rules! upstream {
    ($($extra:expr),* $(,)?) => {
        match common::Upstream::start(&[$($extra),*]) {
            Some(u) => u,
            None => sbx_testutil::skip!("dnsmasq not installed (scripts/setup installs dnsmasq-base)"),
        }
    };
}

/// A running sbx-dnsproxy daemon (SIGTERM + wait on drop).
pub struct Proxy {
    pub addr: SocketAddr,
    pub addrs: Vec<SocketAddr>,
    pub child: Child,
    pub audit: PathBuf,
    pub stdout: BufReader<std::process::ChildStdout>,
    pub dir: tempfile::TempDir,
}

impl Proxy {
    /// Starts the daemon on 127.0.0.1:0 (plus `args`) as `who`.
    pub fn start(up: &Upstream, args: &[&str], who: As) -> Proxy {
        let mut full = vec!["--listen".to_string(), "127.0.0.1:0".to_string()];
        full.push("--upstream".into());
        full.push(up.addr.to_string());
        full.extend(args.iter().map(|s| s.to_string()));
        Self::start_raw(&full, who)
    }

    pub fn start_raw(args: &[String], who: As) -> Proxy {
        let dir = sbx_testutil::shared_tempdir();
        let audit = dir.path().join("audit.log");
        let mut cmd = sbx_testutil::tool("sbx-dnsproxy");
        cmd.arg("--audit-log")
            .arg(&audit)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        run_as(&mut cmd, who);
        let mut child = cmd.spawn().expect("spawn sbx-dnsproxy");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut addrs = Vec::new();
        // One "listening ADDR" line per --listen, then nothing until exit.
        let want = args.iter().filter(|a| *a == "--listen").count().max(1);
        while addrs.len() < want {
            let mut line = String::new();
            let n = stdout.read_line(&mut line).unwrap();
            assert!(
                n > 0,
                "sbx-dnsproxy exited before listening: {:?}",
                child.try_wait()
            );
            let a = line
                .trim()
                .strip_prefix("listening ")
                .unwrap_or_else(|| panic!("unexpected line {line:?}"));
            addrs.push(a.parse().unwrap());
        }
        Proxy {
            addr: addrs[0],
            addrs,
            child,
            audit,
            stdout,
            dir,
        }
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) takes no pointers; a Proxy's child is reaped only
        // in `stop` or Drop, so while `self` lives its pid is not reused.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// SIGTERM, then the exit code and the rest of stdout.
    pub fn stop(mut self) -> (i32, String) {
        self.signal(libc::SIGTERM);
        let mut rest = String::new();
        let _ = self.stdout.read_to_string(&mut rest);
        let st = wait_bounded(&mut self.child, Duration::from_secs(15))
            .expect("sbx-dnsproxy did not exit after SIGTERM");
        (st, rest)
    }

    pub fn ask(&self, name: &str, t: RecordType) -> Message {
        udp_query(self.addr, name, t, Duration::from_secs(8))
            .unwrap_or_else(|| panic!("no answer for {name} {t}"))
    }

    pub fn ask_tcp(&self, name: &str, t: RecordType) -> Message {
        tcp_query(self.addr, &query_bytes(name, t, true))
            .unwrap_or_else(|| panic!("no TCP answer for {name} {t}"))
    }

    pub fn events(&self) -> Vec<serde_json::Value> {
        audit_events(&self.audit)
    }

    /// The alerts about `name` with `reason`.
    pub fn refusals(&self, name: &str, reason: &str) -> usize {
        self.events()
            .iter()
            .filter(|e| e["event"] == "dns_refused" && e["name"] == name && e["reason"] == reason)
            .count()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.signal(libc::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

pub fn wait_bounded(child: &mut Child, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(sbx_testutil::code(&std::process::Output {
                status: st,
                stdout: vec![],
                stderr: vec![],
            }));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

pub fn query_bytes(name: &str, t: RecordType, edns: bool) -> Vec<u8> {
    query_bytes_id(name, t, edns, rand_id())
}

pub fn query_bytes_id(name: &str, t: RecordType, edns: bool, id: u16) -> Vec<u8> {
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    let mut q = Query::query(Name::from_ascii(name).unwrap(), t);
    q.set_query_class(DNSClass::IN);
    m.add_query(q);
    if edns {
        let mut e = Edns::new();
        e.set_max_payload(1232);
        m.set_edns(e);
    }
    m.to_vec().unwrap()
}

fn rand_id() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static N: AtomicU16 = AtomicU16::new(1);
    N.fetch_add(7919, Ordering::Relaxed) ^ (std::process::id() as u16)
}

pub fn udp_query(
    addr: SocketAddr,
    name: &str,
    t: RecordType,
    timeout: Duration,
) -> Option<Message> {
    udp_exchange(addr, &query_bytes(name, t, true), timeout)
}

/// Sends one datagram, returns the reply whose id matches (or None on timeout).
pub fn udp_exchange(addr: SocketAddr, q: &[u8], timeout: Duration) -> Option<Message> {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.connect(addr).unwrap();
    s.send(q).ok()?;
    let deadline = Instant::now() + timeout;
    let mut buf = [0u8; 65535];
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        let n = s.recv(&mut buf).ok()?;
        if let Ok(m) = Message::from_vec(&buf[..n])
            && q.len() >= 2
            && m.metadata.id == u16::from_be_bytes([q[0], q[1]])
        {
            return Some(m);
        }
    }
}

pub fn tcp_query(addr: SocketAddr, q: &[u8]) -> Option<Message> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    let mut framed = (q.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(q);
    s.write_all(&framed).ok()?;
    let mut len = [0u8; 2];
    s.read_exact(&mut len).ok()?;
    let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
    s.read_exact(&mut buf).ok()?;
    Message::from_vec(&buf).ok()
}

/// The addresses of an answer.
pub fn ips(m: &Message) -> Vec<String> {
    m.answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(a.0.to_string()),
            RData::AAAA(a) => Some(a.0.to_string()),
            _ => None,
        })
        .collect()
}

pub fn rcode(m: &Message) -> ResponseCode {
    m.metadata.response_code
}
