//! The test world of the phantom-credential tests: a DNS server (dnsmasq)
//! and two HTTPS/HTTP servers (examples/sbx_net_testhttps.rs of sbx-net)
//! on test hosts, with certificates from a test CA made here. api.test,
//! other-api.test, pinned.test and badcert.test (whose name the server's
//! certificate lacks) are the api host; sink.test and *.sink.test the
//! sink host. Each server records the requests it receives.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::testnet::{Host, TestNet};

pub struct World {
    pub net: TestNet,
    pub dns: Host,
    pub api: Host,
    pub sink: Host,
    pub dir: tempfile::TempDir,
    /// The test CA (sbx-net is given it as SSL_CERT_FILE).
    pub ca: PathBuf,
    pub api_log: PathBuf,
    pub sink_log: PathBuf,
    pub dns_log: PathBuf,
}

/// The test server, built with sbx-net's examples.
pub fn server_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let p = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .join("examples/sbx_net_testhttps");
    assert!(
        p.exists(),
        "{} not built (cargo build --workspace --all-targets)",
        p.display()
    );
    p
}

/// Why the world cannot be built, if it cannot.
pub fn unavailable() -> Option<String> {
    if let Some(w) = TestNet::unavailable() {
        return Some(w);
    }
    for p in ["dnsmasq", "curl", "openssl"] {
        if !crate::have(p) {
            return Some(format!("{p} not installed (scripts/setup)"));
        }
    }
    None
}

fn write(p: &Path, s: &str) {
    std::fs::write(p, s).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o644)).unwrap();
}

impl Default for World {
    fn default() -> Self {
        Self::new()
    }
}

impl World {
    pub fn new() -> World {
        let mut net = TestNet::new().expect("test network");
        let dns = net.add_host("pdns").unwrap();
        let api = net.add_host("api").unwrap();
        let sink = net.add_host("sink").unwrap();
        let dir = crate::shared_tempdir();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let d = dir.path();

        // The test CA and the servers' certificate.
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "sbx phantom test CA");
        let ca = rcgen::CertifiedIssuer::self_signed(p, ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let names = ["api.test", "other-api.test", "pinned.test", "sink.test"];
        let mut lp =
            rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        lp.distinguished_name
            .push(rcgen::DnType::CommonName, "api.test");
        let leaf = lp.signed_by(&key, &ca).unwrap();
        let ca_pem = d.join("ca.pem");
        write(&ca_pem, &ca.pem());
        let cert = d.join("cert.pem");
        write(&cert, &leaf.pem());
        let keyf = d.join("key.pem");
        write(&keyf, &key.serialize_pem());

        let dns_log = d.join("dnsmasq.log");
        net.spawn_dnsmasq(
            &dns,
            &[
                "--log-queries".into(),
                format!("--log-facility={}", dns_log.display()),
                "--cache-size=0".into(),
                format!("--host-record=api.test,{}", api.ip),
                format!("--host-record=other-api.test,{}", api.ip),
                format!("--host-record=pinned.test,{}", api.ip),
                format!("--host-record=badcert.test,{}", api.ip),
                format!("--address=/sink.test/{}", sink.ip),
            ],
        )
        .unwrap();
        let srv = server_bin();
        let api_log = d.join("api.jsonl");
        let sink_log = d.join("sink.jsonl");
        for (h, tag, log) in [(&api, "api", &api_log), (&sink, "sink", &sink_log)] {
            net.spawn(
                h,
                tag,
                &[
                    srv.to_str().unwrap(),
                    "--cert",
                    cert.to_str().unwrap(),
                    "--key",
                    keyf.to_str().unwrap(),
                    "--https",
                    "443",
                    "--http",
                    "80",
                    "--log",
                    log.to_str().unwrap(),
                ],
            )
            .unwrap();
        }
        for ip in [api.ip, sink.ip] {
            for port in [80, 443] {
                net.wait_tcp(SocketAddr::new(ip.into(), port), Duration::from_secs(20))
                    .unwrap();
            }
        }
        net.wait_dns(dns.ip, "api.test", Duration::from_secs(20))
            .unwrap();
        World {
            net,
            dns,
            api,
            sink,
            dir,
            ca: ca_pem,
            api_log,
            sink_log,
            dns_log,
        }
    }

    /// The requests a server recorded.
    pub fn requests(log: &Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// A file in the world's directory, readable by everyone.
    pub fn file(&self, name: &str, body: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        write(&p, body);
        p
    }
}

/// A value no test could guess: `tag` and random hex, `len` bytes.
pub fn secret_value(tag: &str, len: usize) -> String {
    let mut b = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .unwrap();
    let mut s = format!("REAL{tag}");
    for x in b.iter().cycle() {
        if s.len() >= len {
            break;
        }
        s.push_str(&format!("{x:02x}"));
    }
    s.truncate(len);
    s
}
