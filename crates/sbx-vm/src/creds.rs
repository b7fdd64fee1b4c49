//! Secrets fetched by sbx-vm itself through the sbx-creds library: the
//! sbx-creds flags (`--vault-addr`, `--token-file`, `--secret`, `--lease`,
//! `--child-token`, `--ttl`, ...; [`sbx_creds::Args`], flattened into
//! sbx-vm's own) are checked before anything is created, the session logs
//! in and fetches before the VMM starts, its document
//! ([`sbx_creds::Session::to_json`]) is what fw_cfg / MMDS deliver, its
//! leases and tokens are renewed while the VM runs, and everything it
//! created is revoked when sbx-vm ends.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sbx_core::exit::Failure;
use sbx_creds::{Request, Session};
use secrecy::SecretString;
use serde_json::Value;
use zeroize::Zeroizing;

/// The variables sbx-creds authenticates with: never passed on.
pub const TOKEN_VARS: &[&str] = &["VAULT_TOKEN", "BAO_TOKEN"];

/// Whether the sbx-creds options ask for anything (any of --secret,
/// --secret-all, --lease, --child-token).
pub fn wanted(a: &sbx_creds::Args) -> bool {
    !a.secret.is_empty()
        || !a.secret_all.is_empty()
        || !a.lease.is_empty()
        || a.child_token.is_some()
}

/// Whether an sbx-creds option that only makes sense with something to
/// fetch was given on its own (then it is an error, as in sbx-creds).
fn stray(a: &sbx_creds::Args) -> bool {
    a.token_file.is_some()
        || a.role_id_file.is_some()
        || a.secret_id_file.is_some()
        || a.secret_id_wrapped
        || a.kv1
        || a.no_enforce_ttl
        || a.kubernetes_role.is_some()
        || a.auth != sbx_creds::AuthKind::Token
}

/// The checked request (no server contacted yet).
#[derive(Debug)]
pub struct CredsPlan {
    pub req: Request,
    /// Stop the VM when the session TTL is reached (not --no-enforce-ttl).
    pub enforce_ttl: bool,
    /// VAULT_TOKEN, taken out of sbx-vm's environment at start-up.
    pub env_token: Option<SecretString>,
}

/// Checks the sbx-creds options: None when none asks for anything.
/// `static_names` are the names from --secrets-from / --secret-env; a name
/// given twice is an error.
pub fn plan(
    a: &sbx_creds::Args,
    timeout: &str,
    static_names: &[String],
    env_token: Option<SecretString>,
) -> Result<Option<CredsPlan>, Failure> {
    if !wanted(a) {
        if stray(a) {
            // The same error sbx-creds gives ("nothing to fetch ...").
            a.request("vault-timeout", timeout)?;
        }
        return Ok(None);
    }
    let req = a.request("vault-timeout", timeout)?;
    req.validate()?;
    let mut names: Vec<&str> = req.secrets.iter().map(|s| s.env.as_str()).collect();
    names.extend(req.leases.iter().map(|l| l.env.as_str()));
    if let Some(c) = &req.child_token {
        names.push(&c.env);
    }
    if let Some(n) = names.iter().find(|n| static_names.iter().any(|s| s == *n)) {
        return Err(Failure::new(format!(
            "secret {n}: given both by the sbx-creds options and by --secrets-from/--secret-env"
        )));
    }
    Ok(Some(CredsPlan {
        req,
        enforce_ttl: !a.no_enforce_ttl,
        env_token,
    }))
}

/// An open session: the runtime that renews, the session, the renewal task.
pub struct Creds {
    rt: tokio::runtime::Runtime,
    session: Arc<Session>,
    stop: tokio::sync::watch::Sender<bool>,
    maint: Option<tokio::task::JoinHandle<()>>,
    pub enforce_ttl: bool,
    ttl: Duration,
}

/// Logs in and fetches (on failure the library revokes what it created);
/// starts the renewals.
pub fn open(p: CredsPlan) -> Result<Creds, Failure> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .thread_name("sbx-vm-creds")
        .build()
        .map_err(|e| Failure::new(format!("tokio runtime: {e}")))?;
    let session = Arc::new(rt.block_on(Session::open(&p.req, p.env_token))?);
    let (stop, rx) = tokio::sync::watch::channel(false);
    let maint = Some(rt.spawn(session.clone().maintain(rx)));
    Ok(Creds {
        rt,
        session,
        stop,
        maint,
        enforce_ttl: p.enforce_ttl,
        ttl: p.req.ttl,
    })
}

impl Creds {
    /// When the session ends (every token and lease expires, the renewal
    /// task revokes what is left).
    pub fn deadline(&self) -> Instant {
        self.session.deadline()
    }

    /// The session TTL (--ttl).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// One `secret_injected` event per variable (as sbx-creds emits when
    /// it starts CMD): called once the guest has read the secrets.
    pub fn audit_injected(&self) {
        self.session.audit_injected();
    }

    /// The session's document with the static secrets (--secrets-from,
    /// --secret-env) added to its `env`, and the names. A name given by
    /// both is an error (the caller revokes).
    pub fn document(
        &self,
        static_doc: Option<&str>,
    ) -> Result<(Zeroizing<String>, Vec<String>), Failure> {
        let doc = self.session.to_json();
        let mut v: Value = serde_json::from_str(&doc)
            .map_err(|e| Failure::new(format!("secrets document: {e}")))?;
        let extra: Value = match static_doc {
            Some(s) => serde_json::from_str(s).unwrap_or(Value::Null),
            None => Value::Null,
        };
        let env = v
            .get_mut("env")
            .and_then(Value::as_object_mut)
            .ok_or_else(|| Failure::new("secrets document: no env object"))?;
        if let Some(m) = extra.get("env").and_then(Value::as_object) {
            for (k, val) in m {
                if env.contains_key(k) {
                    return Err(Failure::new(format!(
                        "secret {k}: given both by the sbx-creds options and by --secrets-from/--secret-env"
                    )));
                }
                env.insert(k.clone(), val.clone());
            }
        }
        let names = env.keys().cloned().collect();
        let text = Zeroizing::new(v.to_string());
        zero_value(&mut v);
        Ok((text, names))
    }

    /// Stops the renewals and revokes every token and lease of the session
    /// (idempotent); a failure is an alert (by the library) and a line on
    /// stderr, and does not change the exit status.
    pub fn close(mut self) {
        let _ = self.stop.send(true);
        if let Some(m) = self.maint.take() {
            let _ = self.rt.block_on(m);
        }
        let rep = self.rt.block_on(self.session.revoke_all());
        for f in &rep.failed {
            sbx_core::cli::stderr_line(&sbx_core::cli::fail_line(
                crate::TOOL,
                &format!("revocation failed: {f}"),
            ));
        }
        self.rt.shutdown_timeout(Duration::from_secs(1));
    }
}

/// Overwrites the strings of a JSON value before it is dropped.
fn zero_value(v: &mut Value) {
    match v {
        Value::String(s) => zeroize::Zeroize::zeroize(s),
        Value::Object(m) => m.values_mut().for_each(zero_value),
        Value::Array(a) => a.iter_mut().for_each(zero_value),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn zero_value_clears_strings() {
        let mut v = serde_json::json!({"env": {"A": "secret"}, "n": 1});
        super::zero_value(&mut v);
        assert_eq!(v["env"]["A"], "");
    }
}
