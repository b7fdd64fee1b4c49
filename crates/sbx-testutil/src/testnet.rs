//! A small private internet for network tests: test hosts in network
//! namespaces the test creates, each linked to the host namespace by a veth
//! pair with private addresses from 10.200.SLOT.0/24 (IPv4) and
//! fd5b:200:SLOT::/48 (IPv6). The host namespace gets routes only for
//! those subnets (the connected routes of its veth ends); nothing is
//! forwarded between hosts through it. Everything (processes, links,
//! namespaces) is removed in Drop, also when the test panics.
//!
//! A SLOT is held with an flock on /run/sbx-testnet/SLOT.lock for the life
//! of the [`TestNet`], so tests in parallel processes never share one; what
//! a killed run left in a slot is removed by the next holder before use.
//!
//! Needs root and `ip` (iproute2). Servers are real programs (dnsmasq,
//! python3 -m http.server, openssl s_server, iperf3...) started by the test
//! with [`TestNet::spawn`].

use std::fs::File;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// One test host: a network namespace with one veth link to the host.
#[derive(Debug, Clone)]
pub struct Host {
    pub label: String,
    /// Name of its network namespace (for `ip netns exec`).
    pub netns: String,
    /// Its address.
    pub ip: Ipv4Addr,
    pub ip6: Ipv6Addr,
    /// The host namespace's end of the link.
    pub peer: Ipv4Addr,
    pub peer6: Ipv6Addr,
    link: String,
}

pub struct TestNet {
    pub slot: u8,
    hosts: Vec<Host>,
    procs: Vec<(String, Child)>,
    extra_links: Vec<String>,
    _lock: File,
    pub dir: tempfile::TempDir,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

fn ip_quiet(args: &[&str]) {
    let _ = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

fn ns_name(slot: u8, k: usize) -> String {
    format!("sbxt{slot}n{k}")
}

fn link_name(slot: u8, k: usize) -> String {
    format!("sbxt{slot}h{k}")
}

const MAX_HOSTS: usize = 12;

impl TestNet {
    /// Why a test network cannot be built here, if it cannot.
    pub fn unavailable() -> Option<String> {
        if !crate::is_root() {
            return Some("the test network needs root".into());
        }
        if !crate::have("ip") {
            return Some("ip (iproute2) not installed".into());
        }
        None
    }

    /// Takes a free slot and clears what a killed run may have left in it.
    pub fn new() -> Result<TestNet, String> {
        if let Some(why) = Self::unavailable() {
            return Err(why);
        }
        let dir = Path::new("/run/sbx-testnet");
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let routes = Command::new("ip")
            .args(["-4", "route", "show"])
            .output()
            .map_err(|e| format!("ip route: {e}"))?;
        let routes = String::from_utf8_lossy(&routes.stdout).into_owned();
        // Start at a pid-dependent slot so parallel runs rarely contend.
        let start = (std::process::id() % 200) as usize;
        for i in 0..200 {
            let slot = (1 + (start + i) % 200) as u8;
            let f = File::create(dir.join(format!("{slot}.lock"))).map_err(|e| e.to_string())?;
            // SAFETY: flock on the open file f keeps alive.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                continue;
            }
            // Clear leftovers of a killed run in this slot (ours: we hold it).
            for k in 0..MAX_HOSTS {
                ip_quiet(&["link", "del", &link_name(slot, k)]);
                ip_quiet(&["netns", "del", &ns_name(slot, k)]);
            }
            // Someone else (not a test network) uses this range: skip it.
            let prefix = format!("10.200.{slot}.");
            if routes
                .lines()
                .any(|l| l.starts_with(&prefix) && !l.contains("sbxt"))
            {
                continue;
            }
            return Ok(TestNet {
                slot,
                hosts: Vec::new(),
                procs: Vec::new(),
                extra_links: Vec::new(),
                _lock: f,
                dir: tempfile::Builder::new()
                    .prefix("sbx-testnet-")
                    .tempdir()
                    .map_err(|e| e.to_string())?,
            });
        }
        Err("no free test network slot".into())
    }

    /// Adds a test host: a namespace with lo up and a veth link to the host
    /// namespace (addresses 10.200.SLOT.(16k+2)/28 and fd5b:200:SLOT:k::2/64;
    /// the host's end .16k+1 / ::1).
    pub fn add_host(&mut self, label: &str) -> Result<Host, String> {
        let k = self.hosts.len();
        if k >= MAX_HOSTS {
            return Err("too many test hosts".into());
        }
        let s = self.slot;
        let netns = ns_name(s, k);
        let link = link_name(s, k);
        let peer_if = format!("sbxt{s}p{k}");
        let base = 16 * k as u8;
        let peer = Ipv4Addr::new(10, 200, s, base + 1);
        let hip = Ipv4Addr::new(10, 200, s, base + 2);
        let peer6: Ipv6Addr = format!("fd5b:200:{s:x}:{k:x}::1").parse().unwrap();
        let hip6: Ipv6Addr = format!("fd5b:200:{s:x}:{k:x}::2").parse().unwrap();
        // Registered first, so Drop removes a half-made host too.
        let h = Host {
            label: label.into(),
            netns: netns.clone(),
            ip: hip,
            ip6: hip6,
            peer,
            peer6,
            link: link.clone(),
        };
        self.hosts.push(h.clone());
        ip(&["netns", "add", &netns])?;
        ip(&[
            "link", "add", &link, "type", "veth", "peer", "name", &peer_if,
        ])?;
        ip(&["link", "set", &peer_if, "netns", &netns])?;
        ip(&["addr", "add", &format!("{peer}/28"), "dev", &link])?;
        ip(&[
            "-6",
            "addr",
            "add",
            &format!("{peer6}/64"),
            "dev",
            &link,
            "nodad",
        ])?;
        ip(&["link", "set", &link, "up"])?;
        let n = |args: &[&str]| -> Result<(), String> {
            let mut v = vec!["-n", netns.as_str()];
            v.extend_from_slice(args);
            ip(&v)
        };
        n(&["link", "set", "lo", "up"])?;
        n(&["addr", "add", &format!("{hip}/28"), "dev", &peer_if])?;
        n(&[
            "-6",
            "addr",
            "add",
            &format!("{hip6}/64"),
            "dev",
            &peer_if,
            "nodad",
        ])?;
        n(&["link", "set", &peer_if, "up"])?;
        Ok(h)
    }

    /// Links two test hosts directly (a veth pair between their namespaces,
    /// 10.200.SLOT.240/30: `a` gets .241, `b` .242), not through the host.
    pub fn link_hosts(&mut self, a: &Host, b: &Host) -> Result<(Ipv4Addr, Ipv4Addr), String> {
        let s = self.slot;
        let (la, lb) = (format!("sbxt{s}xa"), format!("sbxt{s}xb"));
        ip(&[
            "-n", &a.netns, "link", "add", &la, "type", "veth", "peer", "name", &lb, "netns",
            &b.netns,
        ])?;
        self.extra_links.push(la.clone());
        let (ia, ib) = (
            Ipv4Addr::new(10, 200, s, 241),
            Ipv4Addr::new(10, 200, s, 242),
        );
        ip(&[
            "-n",
            &a.netns,
            "addr",
            "add",
            &format!("{ia}/30"),
            "dev",
            &la,
        ])?;
        ip(&[
            "-n",
            &b.netns,
            "addr",
            "add",
            &format!("{ib}/30"),
            "dev",
            &lb,
        ])?;
        ip(&["-n", &a.netns, "link", "set", &la, "up"])?;
        ip(&["-n", &b.netns, "link", "set", &lb, "up"])?;
        Ok((ia, ib))
    }

    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// A Command that runs `argv` in `host`'s namespace (as root).
    pub fn command(&self, host: &Host, argv: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &host.netns]).args(argv);
        c
    }

    /// dnsmasq on `host` as the test network's DNS server: foreground, no
    /// host files or resolvers, answering on the host's address only;
    /// `records` are its own flags (`--host-record=NAME,IP`...).
    pub fn spawn_dnsmasq(&mut self, host: &Host, records: &[String]) -> Result<PathBuf, String> {
        let listen = format!("--listen-address={}", host.ip);
        let mut argv = vec![
            "dnsmasq",
            "--keep-in-foreground",
            "--conf-file=/dev/null",
            "--no-resolv",
            "--no-hosts",
            "--bind-interfaces",
            listen.as_str(),
            "--user=root",
            "--pid-file=",
        ];
        argv.extend(records.iter().map(String::as_str));
        self.spawn(host, "dnsmasq", &argv)
    }

    /// Starts a server in `host`; it is killed in Drop. stdout and stderr
    /// go to a log file under [`TestNet::dir`] named after `tag`.
    pub fn spawn(&mut self, host: &Host, tag: &str, argv: &[&str]) -> Result<PathBuf, String> {
        let log = self.dir.path().join(format!("{tag}.log"));
        let f = File::create(&log).map_err(|e| e.to_string())?;
        let f2 = f.try_clone().map_err(|e| e.to_string())?;
        let child = self
            .command(host, argv)
            .stdin(Stdio::null())
            .stdout(f)
            .stderr(f2)
            .spawn()
            .map_err(|e| format!("{}: {e}", argv[0]))?;
        self.procs.push((tag.to_string(), child));
        Ok(log)
    }

    /// Runs `argv` in `host` to completion.
    pub fn run(&self, host: &Host, argv: &[&str]) -> Output {
        self.command(host, argv)
            .stdin(Stdio::null())
            .output()
            .expect("ip netns exec")
    }

    /// Kills the server started under `tag`.
    pub fn stop(&mut self, tag: &str) {
        self.procs.retain_mut(|(t, c)| {
            if t == tag {
                let _ = c.kill();
                let _ = c.wait();
                false
            } else {
                true
            }
        });
    }

    /// Waits (bounded) until a TCP connect to `addr` succeeds from the host
    /// namespace.
    pub fn wait_tcp(&mut self, addr: SocketAddr, within: Duration) -> Result<(), String> {
        let end = Instant::now() + within;
        loop {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            for (t, c) in &mut self.procs {
                if let Ok(Some(st)) = c.try_wait() {
                    return Err(format!("server {t} exited ({st}) before {addr} answered"));
                }
            }
            if Instant::now() > end {
                return Err(format!("{addr} did not answer within {within:?}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits (bounded) until a DNS server answers an A query for `name`
    /// over UDP at `server:53`; returns the answer's size.
    pub fn wait_dns(
        &self,
        server: Ipv4Addr,
        name: &str,
        within: Duration,
    ) -> Result<usize, String> {
        let end = Instant::now() + within;
        let sock = std::net::UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
        sock.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let q = dns_query(0x5b5b, name, 1);
        loop {
            let _ = sock.send_to(&q, (server, 53));
            let mut b = [0u8; 1500];
            if let Ok((n, _)) = sock.recv_from(&mut b)
                && n >= 12
                && b[0..2] == [0x5b, 0x5b]
            {
                return Ok(n);
            }
            if Instant::now() > end {
                return Err(format!(
                    "DNS server {server} did not answer within {within:?}"
                ));
            }
        }
    }
}

/// A DNS query message for `name` of type `qtype` (1 = A, 16 = TXT...).
pub fn dns_query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut q = Vec::new();
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.trim_end_matches('.').split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&1u16.to_be_bytes());
    q
}

impl Drop for TestNet {
    fn drop(&mut self) {
        for (_, c) in &mut self.procs {
            let _ = c.kill();
            let _ = c.wait();
        }
        for h in &self.hosts {
            ip_quiet(&["link", "del", &h.link]);
            ip_quiet(&["netns", "del", &h.netns]);
        }
        let _ = &self.extra_links; // gone with their namespaces
    }
}
