//! The connection to Vault/OpenBao: a vaultrs client (rustls) and the few
//! raw calls vaultrs has no typed endpoint for (health, mount lookup, any
//! engine path, leases), made on the same HTTP client.

use std::path::PathBuf;
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

/// Where the server is and how to reach it.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub addr: String,
    pub ca_cert: Option<PathBuf>,
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
        let mut ca = Vec::new();
        if let Some(p) = &cfg.ca_cert {
            let text =
                sbx_core::input::read_regular(p, sbx_core::input::CONFIG_CAP).map_err(|e| {
                    VaultError::CaCert {
                        path: p.clone(),
                        why: e.to_string(),
                    }
                })?;
            reqwest::Certificate::from_pem_bundle(&text).map_err(|e| VaultError::CaCert {
                path: p.clone(),
                why: format!("not a PEM certificate bundle: {e}"),
            })?;
            if url.scheme() != "https" {
                return Err(VaultError::CaCert {
                    path: p.clone(),
                    why: "given for an http:// address".into(),
                });
            }
            ca.push(p.to_string_lossy().into_owned());
        }
        let mut b = VaultClientSettingsBuilder::default();
        b.address(url.as_str().trim_end_matches('/'))
            .ca_certs(ca)
            .timeout(Some(cfg.timeout))
            .token(String::new())
            .verify(true)
            .identity(None);
        if let Some(ns) = &cfg.namespace {
            b.set_namespace(ns.clone());
        }
        let settings = b.build().map_err(|e| VaultError::Client(e.to_string()))?;
        let client =
            VaultClient::new(settings).map_err(|e| VaultError::Client(crate::vault::chain(&e)))?;
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
