//! Credentials through the sbx-creds library: `--creds-config FILE` holds an
//! `sbx-creds` section (the same keys as sbx-creds' flags: vault-addr,
//! secret, secret-all, lease, auth, ...), the session logs in and fetches
//! before the container is created, the secrets become exec-time
//! environment of the command (never the container's configuration), the
//! leases are renewed while it runs and everything is revoked at the end.

use std::ffi::OsString;
use std::path::Path;
use std::sync::Arc;

use sbx_core::Failure;
use sbx_creds::Session;
use secrecy::{ExposeSecret, SecretString};

pub struct Creds {
    pub session: Arc<Session>,
    stop: tokio::sync::watch::Sender<bool>,
    maint: tokio::task::JoinHandle<()>,
}

/// Parses the file's sbx-creds section as sbx-creds itself would (bad
/// input: one line, 125, before anything is created).
pub fn request(path: &Path) -> Result<sbx_creds::Request, Failure> {
    let argv: Vec<OsString> = vec![
        "sbx-creds".into(),
        "--config".into(),
        path.as_os_str().to_owned(),
        "--".into(),
        "true".into(),
    ];
    let cli: sbx_creds::Cli = sbx_core::cli::parse_from(sbx_creds::TOOL, argv)
        .map_err(|f| Failure::new(format!("--creds-config: {}", f.message)))?;
    let req = cli
        .request()
        .map_err(|f| Failure::new(format!("--creds-config: {}", f.message)))?;
    req.validate()
        .map_err(|e| Failure::new(format!("--creds-config: {e}")))?;
    Ok(req)
}

/// Logs in and fetches; starts lease renewal.
pub async fn open(req: &sbx_creds::Request, token: Option<SecretString>) -> Result<Creds, Failure> {
    let session = Arc::new(
        Session::open(req, token)
            .await
            .map_err(|e| Failure::new(format!("--creds-config: {e}")))?,
    );
    session.audit_injected();
    let (stop, rx) = tokio::sync::watch::channel(false);
    let maint = tokio::spawn(session.clone().maintain(rx));
    Ok(Creds {
        session,
        stop,
        maint,
    })
}

impl Creds {
    /// (NAME, value) pairs for the exec's environment.
    pub fn env(&self) -> Vec<(String, String)> {
        self.session
            .env()
            .iter()
            .map(|(k, v)| (k.clone(), v.expose_secret().to_string()))
            .collect()
    }

    /// Stops renewal and revokes everything; failures are logged by the library.
    pub async fn close(self) -> usize {
        let _ = self.stop.send(true);
        let _ = self.maint.await;
        let rep = self.session.revoke_all().await;
        for f in &rep.failed {
            tracing::error!("revocation failed: {f}");
        }
        rep.failed.len()
    }
}
