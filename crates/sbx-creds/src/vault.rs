//! The connection to Vault/OpenBao: a vaultrs client (rustls) and the few
//! raw calls vaultrs has no typed endpoint for (health, mount lookup, any
//! engine path, leases), made on the same HTTP client.

use std::path::{Path, PathBuf};
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::de::DeserializeOwned;
use vaultrs::client::{VaultClient, VaultClientSettingsBuilder};
use zeroize::Zeroize;

use crate::secret::describe_decode_error;

#[derive(Debug, thiserror::Error)]
pub enum VaultError {
    #[error("--vault-addr '{0}': {1}")]
    BadAddr(String, String),
    #[error("--vault-addr is not set and VAULT_ADDR is empty")]
    NoAddr,
    #[error("--ca-cert {path}: {why}")]
    CaCert { path: PathBuf, why: String },
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
    #[error("{what}: cannot reach {addr}: {why}")]
    Unreachable {
        what: String,
        addr: String,
        why: String,
    },
    #[error("{what}: timed out after {secs:.1}s waiting for {addr}")]
    Timeout {
        what: String,
        addr: String,
        secs: f64,
    },
    #[error("{what}: server answered {code}: {msg}")]
    Api {
        what: String,
        code: u16,
        msg: String,
    },
    #[error("{what}: the server's answer is not what the API promises ({why})")]
    Malformed { what: String, why: String },
    #[error("server {addr} is {state}")]
    NotReady { addr: String, state: &'static str },
}

impl VaultError {
    /// The HTTP status of an API error.
    pub fn status(&self) -> Option<u16> {
        match self {
            VaultError::Api { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// The CAs of `--ca-cert`: the file read once (a bounded regular file) and
/// checked when the flags are, so the certificates checked are the very
/// ones the TLS client trusts (no second read, nothing to swap between
/// check and use), and only those: the system roots are not used with them.
#[derive(Clone)]
pub struct CaCert {
    path: PathBuf,
    certs: Vec<reqwest::Certificate>,
}

impl std::fmt::Debug for CaCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaCert")
            .field("path", &self.path)
            .field("certs", &self.certs.len())
            .finish()
    }
}

/// What the PEM blocks of `text` are ("PRIVATE KEY", ...), for a message.
fn pem_labels(text: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(text);
    let mut out: Vec<String> = Vec::new();
    for part in text.split("-----BEGIN ").skip(1) {
        let Some(end) = part.find("-----") else {
            continue;
        };
        let label = one_line(&part[..end]);
        if !label.is_empty() && label.len() <= 60 && !out.contains(&label) {
            out.push(label);
        }
        if out.len() == 4 {
            break;
        }
    }
    out
}

/// The TLS client that trusts exactly `certs` (the only place one is made,
/// so what `CaCert::load` checks is what `Vault::new` uses).
fn tls_client(
    certs: Option<&[reqwest::Certificate]>,
    timeout: Option<Duration>,
) -> reqwest::Result<reqwest::Client> {
    let mut b = reqwest::ClientBuilder::new()
        .tls_backend_rustls()
        .tls_danger_accept_invalid_certs(false);
    if let Some(t) = timeout {
        b = b.timeout(t);
    }
    if let Some(c) = certs {
        b = b.tls_certs_only(c.iter().cloned());
    }
    b.build()
}

impl CaCert {
    /// Reads `path` once (a regular file of at most 4 MiB; a FIFO, a device
    /// or /proc file is refused without reading it) and checks that it
    /// holds at least one PEM certificate and that every certificate in it
    /// is one rustls can trust. `addr` is the server address: a CA file
    /// for an http:// address is a mistake (it would be ignored).
    pub fn load(path: &Path, addr: &str) -> Result<CaCert, VaultError> {
        let bad = |why: String| VaultError::CaCert {
            path: path.to_path_buf(),
            why,
        };
        if url::Url::parse(addr).is_ok_and(|u| u.scheme() == "http") {
            return Err(bad(format!("given for an http:// address ({addr})")));
        }
        // Zeroed when dropped: a key file named by mistake is a secret.
        let text = sbx_core::input::read_regular(path, sbx_core::input::CONFIG_CAP)
            .map(zeroize::Zeroizing::new)
            .map_err(|e| bad(e.to_string()))?;
        if text.iter().all(u8::is_ascii_whitespace) {
            return Err(bad(
                "empty: expected PEM certificates (-----BEGIN CERTIFICATE-----)".into(),
            ));
        }
        let certs = reqwest::Certificate::from_pem_bundle(&text)
            .map_err(|e| bad(format!("not a PEM certificate bundle: {}", chain(&e))))?;
        if certs.is_empty() {
            let labels = pem_labels(&text);
            return Err(bad(if labels.is_empty() {
                "holds no PEM certificate (no -----BEGIN CERTIFICATE----- block)".into()
            } else {
                format!(
                    "holds no PEM certificate, only {} (expected -----BEGIN CERTIFICATE-----)",
                    labels.join(", ")
                )
            }));
        }
        // rustls parses each certificate into a trust anchor when the
        // client is built: one that fails is named.
        if let Err(e) = tls_client(Some(&certs), None) {
            let n = certs.len();
            let which = (0..n)
                .find(|&i| tls_client(Some(&certs[i..=i]), None).is_err())
                .map(|i| format!("certificate {} of {n}", i + 1))
                .unwrap_or_else(|| "the certificates".into());
            // The innermost cause says what rustls found wrong.
            let mut why = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(x) = src {
                why = x.to_string();
                src = x.source();
            }
            return Err(bad(format!(
                "{which} is not a usable X.509 CA certificate ({})",
                one_line(&why)
            )));
        }
        Ok(CaCert {
            path: path.to_path_buf(),
            certs,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many certificates the file held.
    pub fn count(&self) -> usize {
        self.certs.len()
    }
}

/// Where the server is and how to reach it.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub addr: String,
    /// The CAs to trust (only these) for an https:// server; None: the
    /// system roots.
    pub ca_cert: Option<CaCert>,
    pub namespace: Option<String>,
    /// Bound on each request (connect included).
    pub timeout: Duration,
}

pub struct Vault {
    pub client: VaultClient,
    addr: String,
    namespace: Option<String>,
    timeout: Duration,
}

impl Drop for Vault {
    fn drop(&mut self) {
        self.client.settings.token.zeroize();
        self.client.middle.token.zeroize();
    }
}

fn reqwest_error(what: &str, addr: &str, timeout: Duration, e: &reqwest::Error) -> VaultError {
    if e.is_timeout() {
        return VaultError::Timeout {
            what: what.into(),
            addr: addr.into(),
            secs: timeout.as_secs_f64(),
        };
    }
    // The innermost cause names the problem (refused, TLS, DNS).
    let mut why = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        why = s.to_string();
        src = s.source();
    }
    VaultError::Unreachable {
        what: what.into(),
        addr: addr.into(),
        why,
    }
}

fn one_line(s: &str) -> String {
    let s: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let s = s.trim().to_string();
    if s.len() > 300 {
        let mut cut = 300;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("{}...", &s[..cut])
    } else {
        s
    }
}

impl Vault {
    pub fn new(cfg: &ServerConfig) -> Result<Self, VaultError> {
        if cfg.addr.is_empty() {
            return Err(VaultError::NoAddr);
        }
        let url = url::Url::parse(&cfg.addr)
            .map_err(|e| VaultError::BadAddr(cfg.addr.clone(), e.to_string()))?;
        if url.scheme() != "http" && url.scheme() != "https" {
            return Err(VaultError::BadAddr(
                cfg.addr.clone(),
                "scheme must be http or https".into(),
            ));
        }
        if url.host_str().is_none() {
            return Err(VaultError::BadAddr(cfg.addr.clone(), "no host".into()));
        }
        if let Some(ca) = &cfg.ca_cert
            && url.scheme() != "https"
        {
            return Err(VaultError::CaCert {
                path: ca.path.clone(),
                why: "given for an http:// address".into(),
            });
        }
        // The HTTP client is ours (vaultrs would read the CA file again, by
        // path): it trusts the certificates read and checked once.
        let certs: Option<&[reqwest::Certificate]> = if url.scheme() == "http" {
            // No roots to load for plain http (reqwest#2988).
            Some(&[])
        } else {
            cfg.ca_cert.as_ref().map(|c| c.certs.as_slice())
        };
        let http = tls_client(certs, Some(cfg.timeout))
            .map_err(|e| VaultError::Client(crate::vault::chain(&e)))?;
        let mut b = VaultClientSettingsBuilder::default();
        b.address(url.as_str().trim_end_matches('/'))
            .ca_certs(Vec::new())
            .timeout(Some(cfg.timeout))
            .token(String::new())
            .verify(true)
            .identity(None);
        if let Some(ns) = &cfg.namespace {
            b.set_namespace(ns.clone());
        }
        let settings = b.build().map_err(|e| VaultError::Client(e.to_string()))?;
        let middle = vaultrs::api::EndpointMiddleware {
            token: String::new(),
            version: format!("v{}", settings.version),
            wrap: None,
            namespace: settings.namespace.clone(),
        };
        let client = VaultClient {
            http: rustify::clients::reqwest::Client::new(settings.address.as_str(), http),
            middle,
            settings,
        };
        Ok(Vault {
            client,
            addr: url.as_str().trim_end_matches('/').to_string(),
            namespace: cfg.namespace.clone(),
            timeout: cfg.timeout,
        })
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Makes `token` the one vaultrs' typed calls use (the previous one is
    /// zeroed first).
    pub fn set_token(&mut self, token: &SecretString) {
        self.client.settings.token.zeroize();
        self.client.middle.token.zeroize();
        self.client.settings.token = token.expose_secret().to_string();
        self.client.middle.token = token.expose_secret().to_string();
    }

    /// Maps a vaultrs error to one line that never quotes a response body
    /// (which could hold a secret).
    pub fn map_err(&self, what: &str, e: vaultrs::error::ClientError) -> VaultError {
        use rustify::errors::ClientError as R;
        use vaultrs::error::ClientError as C;
        match e {
            C::APIError { code, errors } => VaultError::Api {
                what: what.into(),
                code,
                msg: if errors.is_empty() {
                    "no error message".into()
                } else {
                    one_line(&errors.join("; "))
                },
            },
            C::RestClientError { source } => match source {
                R::RequestError { source, .. } => match source.downcast_ref::<reqwest::Error>() {
                    Some(re) => reqwest_error(what, &self.addr, self.timeout, re),
                    None => VaultError::Unreachable {
                        what: what.into(),
                        addr: self.addr.clone(),
                        why: one_line(&source.to_string()),
                    },
                },
                R::ServerResponseError { code, .. } => VaultError::Api {
                    what: what.into(),
                    code,
                    msg: "error without a JSON body".into(),
                },
                R::ResponseParseError { .. } | R::ResponseConversionError { .. } => {
                    VaultError::Malformed {
                        what: what.into(),
                        why: "undecodable body".into(),
                    }
                }
                other => VaultError::Unreachable {
                    what: what.into(),
                    addr: self.addr.clone(),
                    why: other.to_string(),
                },
            },
            C::JsonParseError { source } => VaultError::Malformed {
                what: what.into(),
                why: describe_decode_error(&source),
            },
            C::ResponseEmptyError | C::ResponseDataEmptyError => VaultError::Malformed {
                what: what.into(),
                why: "no data in the answer".into(),
            },
            C::WrapInvalidError => VaultError::Api {
                what: what.into(),
                code: 400,
                msg: "the wrapping token does not exist or is no longer valid".into(),
            },
            other => VaultError::Malformed {
                what: what.into(),
                why: other.to_string(),
            },
        }
    }

    /// A raw call: `method` on /v1/`path`, `body` as JSON, the answer decoded
    /// as `T` (never through a `Value`: secrets go straight to zeroizing
    /// types). `token` None sends no token. An empty answer (204) decodes
    /// from `null`.
    pub async fn raw<T: DeserializeOwned>(
        &self,
        what: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<&serde_json::Value>,
        token: Option<&SecretString>,
    ) -> Result<T, VaultError> {
        let url = format!("{}/v1/{}", self.addr, path.trim_start_matches('/'));
        let mut req = self.client.http.http.request(method, &url);
        if let Some(t) = token {
            let mut hv =
                reqwest::header::HeaderValue::from_str(t.expose_secret()).map_err(|_| {
                    VaultError::Malformed {
                        what: what.into(),
                        why: "the token is not a valid header value".into(),
                    }
                })?;
            hv.set_sensitive(true);
            req = req.header("X-Vault-Token", hv);
        }
        if let Some(ns) = &self.namespace {
            req = req.header("X-Vault-Namespace", ns);
        }
        req = req.header("X-Vault-Request", "true");
        if let Some(b) = body {
            req = req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(b.to_string());
        }
        let resp = req
            .send()
            .await
            .map_err(|e| reqwest_error(what, &self.addr, self.timeout, &e))?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| reqwest_error(what, &self.addr, self.timeout, &e))?;
        let mut buf = bytes.to_vec();
        drop(bytes);
        let out = if !status.is_success() {
            #[derive(serde::Deserialize)]
            struct Errs {
                #[serde(default)]
                errors: Vec<String>,
            }
            let msg = serde_json::from_slice::<Errs>(&buf)
                .ok()
                .filter(|e| !e.errors.is_empty())
                .map(|e| one_line(&e.errors.join("; ")))
                .unwrap_or_else(|| status.canonical_reason().unwrap_or("error").to_string());
            Err(VaultError::Api {
                what: what.into(),
                code: status.as_u16(),
                msg,
            })
        } else {
            let slice: &[u8] = if buf.iter().all(|c| c.is_ascii_whitespace()) {
                b"null"
            } else {
                &buf
            };
            serde_json::from_slice::<T>(slice).map_err(|e| VaultError::Malformed {
                what: what.into(),
                why: describe_decode_error(&e),
            })
        };
        buf.zeroize();
        out
    }

    /// GET /v1/sys/health ourselves (vaultrs' typed call wants a field
    /// OpenBao does not send). Any status with a health body is an answer;
    /// the server must be initialized and unsealed.
    pub async fn health(&self) -> Result<(), VaultError> {
        #[derive(serde::Deserialize)]
        struct Health {
            initialized: bool,
            sealed: bool,
        }
        let url = format!(
            "{}/v1/sys/health?standbyok=true&perfstandbyok=true",
            self.addr
        );
        let resp = self
            .client
            .http
            .http
            .get(&url)
            .send()
            .await
            .map_err(|e| reqwest_error("health check", &self.addr, self.timeout, &e))?;
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| reqwest_error("health check", &self.addr, self.timeout, &e))?;
        let h: Health = serde_json::from_slice(&bytes).map_err(|e| VaultError::Malformed {
            what: "health check (GET /v1/sys/health)".into(),
            why: describe_decode_error(&e),
        })?;
        if !h.initialized {
            return Err(VaultError::NotReady {
                addr: self.addr.clone(),
                state: "not initialized",
            });
        }
        if h.sealed {
            return Err(VaultError::NotReady {
                addr: self.addr.clone(),
                state: "sealed",
            });
        }
        Ok(())
    }
}

/// `err: source: source` on one line.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        s.push_str(": ");
        s.push_str(&x.to_string());
        src = x.source();
    }
    one_line(&s)
}
