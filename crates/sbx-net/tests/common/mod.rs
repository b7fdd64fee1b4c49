//! The test world: a DNS server (dnsmasq) with test zones, two web hosts
//! (A allowed, B denied) and an attacker's authoritative DNS reached only
//! through the upstream DNS, all on test hosts of sbx_testutil::testnet.
#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use sbx_testutil::testnet::{Host, TestNet};
use sbx_testutil::{As, run_as};

pub const PY: &str = "/usr/bin/python3";

pub struct World {
    pub net: TestNet,
    pub dns: Host,
    pub a: Host,
    pub b: Host,
    pub attacker: Host,
    pub dns_log: PathBuf,
    pub attacker_log: PathBuf,
    pub udp_log: PathBuf,
    pub dir: tempfile::TempDir,
}

/// Why the world cannot be built, if it cannot.
pub fn unavailable() -> Option<String> {
    if let Some(w) = TestNet::unavailable() {
        return Some(w);
    }
    for p in ["dnsmasq", "curl", "git", "socat", "openssl"] {
        if !sbx_testutil::have(p) {
            return Some(format!("{p} not installed (scripts/setup)"));
        }
    }
    if !Path::new(PY).exists() {
        return Some(format!("{PY} missing"));
    }
    None
}

#[macro_export]
macro_rules! world_or_skip {
    () => {{
        if let Some(why) = common::unavailable() {
            sbx_testutil::skip!("{why}");
        }
        common::World::new()
    }};
}

fn write(p: &Path, s: &str) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, s).unwrap();
}

fn sh(cmd: &mut Command) {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl World {
    pub fn new() -> World {
        let mut net = TestNet::new().expect("test network");
        let dns = net.add_host("dns").unwrap();
        let a = net.add_host("web-a").unwrap();
        let b = net.add_host("web-b").unwrap();
        let attacker = net.add_host("attacker").unwrap();
        // The attacker's DNS is reachable by the upstream DNS server only.
        let (dns_side, att_side) = net.link_hosts(&dns, &attacker).unwrap();
        let dir = tempfile::Builder::new()
            .prefix("sbx-net-world-")
            .tempdir()
            .unwrap();
        let d = dir.path();

        // Web content: A serves a page, a dumb-HTTP git repo and a package
        // index; B serves another page.
        write(&d.join("a/index.html"), "hello from A\n");
        write(&d.join("b/index.html"), "hello from B\n");
        make_repo(&d.join("a/repo.git"));
        make_index(&d.join("a/simple"));
        make_cert(d);

        // Upstream DNS with the test zone; evil.test is delegated (forwarded)
        // to the attacker.
        let dns_log = d.join("dnsmasq.log");
        let attacker_log = d.join("attacker.log");
        let recs = [
            format!("--host-record=allowed.test,{},{}", a.ip, a.ip6),
            format!("--host-record=www.allowed.test,{}", a.ip),
            format!("--host-record=denied.test,{}", b.ip),
            format!("--host-record=alias-of-a.test,{}", a.ip),
            "--host-record=rebind.test,127.0.0.1".to_string(),
            format!("--host-record=rebind2.test,{}", a.ip),
            "--txt-record=allowed.test,secret-txt".to_string(),
            format!("--server=/evil.test/{att_side}"),
        ];
        let mut argv: Vec<String> = vec![
            "dnsmasq".into(),
            "--keep-in-foreground".into(),
            "--conf-file=/dev/null".into(),
            "--no-resolv".into(),
            "--no-hosts".into(),
            "--bind-interfaces".into(),
            format!("--listen-address={}", dns.ip),
            "--user=root".into(),
            "--pid-file=".into(),
            "--log-queries".into(),
            format!("--log-facility={}", dns_log.display()),
            "--cache-size=0".into(),
        ];
        argv.extend(recs);
        let argv_ref: Vec<&str> = argv.iter().map(|s| s.as_str()).collect();
        net.spawn(&dns, "dnsmasq", &argv_ref).unwrap();
        let att_argv = vec![
            "dnsmasq".to_string(),
            "--keep-in-foreground".into(),
            "--conf-file=/dev/null".into(),
            "--no-resolv".into(),
            "--no-hosts".into(),
            "--bind-interfaces".into(),
            format!("--listen-address={att_side}"),
            "--user=root".into(),
            "--pid-file=".into(),
            "--log-queries".into(),
            format!("--log-facility={}", attacker_log.display()),
            format!("--address=/evil.test/{}", b.ip),
        ];
        let att_ref: Vec<&str> = att_argv.iter().map(|s| s.as_str()).collect();
        net.spawn(&attacker, "attacker-dns", &att_ref).unwrap();
        let _ = dns_side;

        let a_root = d.join("a");
        let b_root = d.join("b");
        for (h, port, root, tag) in [
            (&a, "80", &a_root, "a80"),
            (&a, "8080", &a_root, "a8080"),
            (&b, "80", &b_root, "b80"),
        ] {
            net.spawn(
                h,
                tag,
                &[
                    PY,
                    "-m",
                    "http.server",
                    port,
                    "--bind",
                    "::",
                    "--directory",
                    root.to_str().unwrap(),
                ],
            )
            .unwrap();
        }
        let cert = d.join("cert.pem");
        let key = d.join("key.pem");
        net.spawn(
            &a,
            "a443",
            &[
                "openssl",
                "s_server",
                "-quiet",
                "-accept",
                "443",
                "-cert",
                cert.to_str().unwrap(),
                "-key",
                key.to_str().unwrap(),
                "-www",
            ],
        )
        .unwrap();
        // A line server that holds many idle connections: answers "pong"
        // to each line.
        let pong = d.join("pong.py");
        std::fs::write(
            &pong,
            "import asyncio\n\
             async def h(r, w):\n    \
                 while await r.readline():\n        \
                     w.write(b'pong\\n')\n        \
                     await w.drain()\n    \
                 w.close()\n\
             async def main():\n    \
                 s = await asyncio.start_server(h, '0.0.0.0', 8081, backlog=1024)\n    \
                 await s.serve_forever()\n\
             asyncio.run(main())\n",
        )
        .unwrap();
        net.spawn(&a, "a8081", &[PY, pong.to_str().unwrap()])
            .unwrap();
        // An echo server (full duplex, for relay integrity) and a 4 MiB file.
        net.spawn(
            &a,
            "a8082",
            &["socat", "TCP-LISTEN:8082,fork,reuseaddr", "EXEC:cat"],
        )
        .unwrap();
        let big: Vec<u8> = (0..4u32 << 20)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        std::fs::write(d.join("a/big.bin"), &big).unwrap();
        // A UDP sink: anything that arrives is logged.
        let udp_log = d.join("udp.log");
        net.spawn(
            &a,
            "udp",
            &[
                "socat",
                "-u",
                "UDP4-RECV:9999",
                &format!("CREATE:{}", udp_log.display()),
            ],
        )
        .unwrap();

        for (ip, port) in [
            (a.ip, 80),
            (a.ip, 8080),
            (a.ip, 8081),
            (b.ip, 80),
            (a.ip, 443),
        ] {
            net.wait_tcp(SocketAddr::new(ip.into(), port), Duration::from_secs(20))
                .unwrap();
        }
        net.wait_dns(dns.ip, "allowed.test", Duration::from_secs(20))
            .unwrap();
        // The attacker answers too (a sanity check that it is reachable
        // through the upstream, so "never forwarded" means something).
        net.wait_dns(dns.ip, "probe.evil.test", Duration::from_secs(20))
            .unwrap();
        World {
            net,
            dns,
            a,
            b,
            attacker,
            dns_log,
            attacker_log,
            udp_log,
            dir,
        }
    }

    /// A temp dir + audit log the test user can write.
    pub fn audit_dir() -> (tempfile::TempDir, PathBuf) {
        let d = sbx_testutil::shared_tempdir();
        let log = d.path().join("audit.log");
        (d, log)
    }

    /// Runs sbx-net with `args` then `-- sh -c script` as `who`.
    pub fn sbx_net(&self, who: As, log: &Path, args: &[String], script: &str) -> Output {
        let mut c = sbx_testutil::tool("sbx-net");
        c.arg("--audit-log").arg(log);
        c.arg(format!("--dns-upstream={}", self.dns.ip));
        c.args(args).args(["--", "/bin/sh", "-c", script]);
        c.env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin");
        c.current_dir("/");
        run_as(&mut c, who);
        c.output().expect("spawn sbx-net")
    }

    /// Puts the test DNS client in `dir` (readable by the test user);
    /// returns the command prefix to run it.
    pub fn dnsq(dir: &Path) -> String {
        let p = dir.join("dnsq.py");
        std::fs::write(&p, include_str!("../data/dnsq.py")).unwrap();
        sbx_testutil::chown_to_test_user(&p);
        format!("{PY} {}", p.display())
    }

    pub fn attacker_saw(&self, needle: &str) -> bool {
        std::fs::read_to_string(&self.attacker_log)
            .unwrap_or_default()
            .contains(needle)
    }

    pub fn upstream_saw(&self, needle: &str) -> bool {
        std::fs::read_to_string(&self.dns_log)
            .unwrap_or_default()
            .contains(needle)
    }
}

fn make_repo(bare: &Path) {
    let work = bare.with_extension("work");
    std::fs::create_dir_all(&work).unwrap();
    let git = |dir: &Path, args: &[&str]| {
        sh(Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@t")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@t")
            .env("HOME", dir));
    };
    git(&work, &["init", "-q", "-b", "main"]);
    std::fs::write(work.join("README"), "repo over dumb http\n").unwrap();
    git(&work, &["add", "README"]);
    git(&work, &["commit", "-q", "-m", "first"]);
    git(
        bare.parent().unwrap(),
        &[
            "clone",
            "-q",
            "--bare",
            work.to_str().unwrap(),
            bare.to_str().unwrap(),
        ],
    );
    git(bare, &["update-server-info"]);
}

/// A PEP 503 simple index with one pure-Python wheel.
fn make_index(simple: &Path) {
    let script = format!(
        r#"
import zipfile, hashlib, base64, os
d = {simple:?}
os.makedirs(d + "/sbxdemo", exist_ok=True)
whl = "sbxdemo-1.0-py3-none-any.whl"
files = {{
  "sbxdemo/__init__.py": b"X = 1\n",
  "sbxdemo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: sbxdemo\nVersion: 1.0\n",
  "sbxdemo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: sbx\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}}
rec = []
for n, b in files.items():
    h = base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b"=").decode()
    rec.append(f"{{n}},sha256={{h}},{{len(b)}}")
rec.append("sbxdemo-1.0.dist-info/RECORD,,")
with zipfile.ZipFile(d + "/sbxdemo/" + whl, "w") as z:
    for n, b in files.items():
        z.writestr(n, b)
    z.writestr("sbxdemo-1.0.dist-info/RECORD", "\n".join(rec) + "\n")
open(d + "/sbxdemo/index.html", "w").write(f'<html><body><a href="{{whl}}">{{whl}}</a></body></html>')
open(d + "/index.html", "w").write('<html><body><a href="sbxdemo/">sbxdemo</a></body></html>')
"#,
        simple = simple.to_str().unwrap()
    );
    sh(Command::new(PY).args(["-c", &script]));
}

fn make_cert(d: &Path) {
    sh(Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=allowed.test",
        ])
        .arg("-keyout")
        .arg(d.join("key.pem"))
        .arg("-out")
        .arg(d.join("cert.pem"))
        .stderr(std::process::Stdio::null()));
}

pub fn ipv4(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}
