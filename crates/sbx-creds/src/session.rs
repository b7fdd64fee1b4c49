//! A credential session: log in, fetch every secret (in parallel), keep the
//! leases alive until the session TTL, revoke everything created for it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use reqwest::Method;
use sbx_core::Severity;
use sbx_core::audit::emit;
use secrecy::{ExposeSecret, SecretString};
use serde_json::json;
use zeroize::Zeroizing;

use crate::auth::{AuthConfig, AuthError, Login};
use crate::secret::{SecretMap, SecretText};
use crate::spec::{self, LeaseSpec, SecretAllSpec, SecretSpec, SpecError};
use crate::vault::{ServerConfig, Vault, VaultError};

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("{0}")]
    Spec(#[from] SpecError),
    #[error("{0}")]
    Auth(#[from] AuthError),
    #[error("{0}")]
    Vault(#[from] VaultError),
    #[error("--{flag} {env}: secret {path} not found")]
    NotFound {
        flag: &'static str,
        env: String,
        path: String,
    },
    #[error("--{flag} {env}: key '{key}' is not in secret {path} (it has: {keys})")]
    NoKey {
        flag: &'static str,
        env: String,
        path: String,
        key: String,
        keys: String,
    },
    #[error("--{flag} {env}: {path} is on a '{kind}' mount, not a KV secrets engine")]
    NotKv {
        flag: &'static str,
        env: String,
        path: String,
        kind: String,
    },
    #[error("{what}: the server granted {granted}s, more than the {cap}s asked for")]
    OverGranted {
        what: String,
        granted: u64,
        cap: u64,
    },
    #[error("--child-token {0}: the server returned no token")]
    NoChildToken(String),
    #[error("--ttl: must be at least 1s")]
    TtlTooShort,
    /// A value (or a name derived from the answer) the command's
    /// environment cannot hold: `origin` names the flag, path and key,
    /// never the value.
    #[error("{origin}: {why}")]
    Unusable { origin: String, why: String },
    #[error("environment variable {env} is set by more than one secret: {first}, and {second}")]
    Collision {
        env: String,
        first: String,
        second: String,
    },
}

/// `--child-token ENV --policy P ...`
#[derive(Debug, Clone)]
pub struct ChildTokenSpec {
    pub env: String,
    pub policies: Vec<String>,
    pub orphan: bool,
    /// Capped by the session TTL; the session TTL when None.
    pub ttl: Option<Duration>,
    pub num_uses: Option<u64>,
}

/// Everything a session needs: what sbx-vm builds to get the same secrets
/// as sbx-creds would inject.
#[derive(Debug, Clone)]
pub struct Request {
    pub server: ServerConfig,
    pub auth: AuthConfig,
    pub secrets: Vec<SecretSpec>,
    pub secret_all: Vec<SecretAllSpec>,
    pub leases: Vec<LeaseSpec>,
    pub child_token: Option<ChildTokenSpec>,
    /// The session bound: every token and lease expires no later.
    pub ttl: Duration,
    /// Treat every KV mount as version 1 (no detection).
    pub kv1: bool,
}

impl Request {
    /// Checks what can be checked without the server.
    pub fn validate(&self) -> Result<(), SessionError> {
        if self.ttl < Duration::from_secs(1) {
            return Err(SessionError::TtlTooShort);
        }
        let mut names: Vec<&str> = self.secrets.iter().map(|s| s.env.as_str()).collect();
        names.extend(self.leases.iter().map(|l| l.env.as_str()));
        if let Some(c) = &self.child_token {
            spec::check_env_name("child-token", &c.env, &c.env)?;
            names.push(&c.env);
        }
        spec::check_unique(names)?;
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Lease,
    ChildToken,
    SessionToken,
    /// A login token whose replacement succeeded but whose revoke-self
    /// failed: revoked again at the end.
    LoginToken,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Lease => "lease",
            Kind::ChildToken => "child_token",
            Kind::SessionToken => "session_token",
            Kind::LoginToken => "login_token",
        }
    }
}

/// Something created on the server for this session.
struct Tracked {
    kind: Kind,
    /// Lease id, or token accessor.
    id: String,
    env: Option<String>,
    path: String,
    token: Option<SecretString>,
    renewable: bool,
    expires: Instant,
    renew_at: Option<Instant>,
    revoked: bool,
}

#[derive(Default)]
struct State {
    items: Vec<Tracked>,
}

/// What revocation did.
#[derive(Debug, Default, Clone)]
pub struct RevokeReport {
    pub revoked: usize,
    /// `kind id: error` of each item that could not be revoked.
    pub failed: Vec<String>,
}

pub struct Session {
    vault: Vault,
    login: Login,
    deadline: Instant,
    ttl: Duration,
    env: Vec<(String, SecretString)>,
    /// Per variable: (path, lease id, ttl) for the audit events.
    meta: Vec<InjectMeta>,
    state: tokio::sync::Mutex<State>,
}

#[derive(Debug, Clone)]
struct InjectMeta {
    env: String,
    kind: &'static str,
    path: String,
    key: String,
    lease_id: Option<String>,
    /// Accessor of a child token.
    accessor: Option<String>,
    ttl: u64,
    /// Where the value comes from, for a message: the flag, its variable
    /// or prefix, the path and the key (never the value).
    origin: String,
}

struct MountInfo {
    path: String,
    version: u8,
}

/// A login token lives for what the auth method's role says (AppRole's
/// `token_ttl`): the login request cannot ask for less. It is replaced at
/// once by an orphan token capped to the session TTL (`ttl`, and
/// `explicit_max_ttl` = the session TTL), whose accessor is recorded before
/// anything else, and then revoked (revoke-self); the orphan survives its
/// creator. Returns the session's token, and the login token when its
/// revocation failed (revoked again at the end). When the server refuses
/// the orphan (the role's policies lack `update` on
/// `auth/token/create-orphan`) or the token is a batch token, the login
/// token stays the session's (then renewed down to the TTL: `cap_login`).
async fn replace_login(
    vault: &mut Vault,
    login: Login,
    deadline: Instant,
) -> (Login, Option<Login>) {
    use vaultrs::api::token::requests::CreateOrphanTokenRequest;
    let cap = secs_until(deadline);
    if login.ttl == 0 || login.ttl > cap {
        let note = "the login request cannot set a TTL: until sbx-creds replaces it, and \
                    forever if sbx-creds is killed while the login request is in flight, \
                    this token lives for the role's token_ttl; set the role's token_ttl \
                    to at most --ttl";
        tracing::warn!(
            "the {} login token lives {}s, longer than --ttl ({cap}s): {note}",
            login.method,
            login.ttl
        );
        emit(
            "login_ttl_above_session_ttl",
            Severity::Warn,
            json!({"method": login.method, "accessor": login.accessor, "ttl": login.ttl,
                   "session_ttl": cap, "note": note}),
        );
    }
    if login.batch {
        return (login, None);
    }
    let ttl = if login.ttl == 0 {
        cap
    } else {
        login.ttl.min(cap)
    };
    let meta: HashMap<String, String> = [
        (
            "sbx_id".to_string(),
            sbx_core::id::get().unwrap_or("-").to_string(),
        ),
        ("created_by".to_string(), "sbx-creds".to_string()),
    ]
    .into();
    let mut b = CreateOrphanTokenRequest::builder();
    b.ttl(format!("{ttl}s"))
        .explicit_max_ttl(format!("{cap}s"))
        .display_name("sbx-creds-session")
        .meta(meta)
        .renewable(login.renewable);
    let created = vaultrs::token::new_orphan(&vault.client, Some(&mut b))
        .await
        .map_err(|e| vault.map_err("session token creation (auth/token/create-orphan)", e))
        .and_then(|a| {
            if a.client_token.is_empty() {
                Err(VaultError::Malformed {
                    what: "session token creation (auth/token/create-orphan)".into(),
                    why: "no token returned".into(),
                })
            } else {
                Ok(a)
            }
        });
    let auth = match created {
        Ok(a) => a,
        Err(e) => {
            emit(
                "login_token_kept",
                Severity::Warn,
                json!({"accessor": login.accessor, "error": e.to_string(),
                       "note": "grant update on auth/token/create-orphan to the role's token policies so that the login token is replaced by one capped to --ttl; it is renewed down to --ttl instead where it is renewable"}),
            );
            return (login, None);
        }
    };
    let token = SecretString::from(auth.client_token);
    // Recorded before the login token goes, as the login token was.
    crate::guardian::auth_token(&token);
    crate::guardian::created_token(&auth.accessor, &token);
    let revoked = vaultrs::token::revoke_self(&vault.client)
        .await
        .map_err(|e| vault.map_err("revocation of the login token (auth/token/revoke-self)", e));
    vault.set_token(&token);
    let session = Login {
        token,
        accessor: auth.accessor,
        ttl: auth.lease_duration,
        renewable: auth.renewable,
        created: true,
        batch: false,
        method: login.method,
    };
    emit(
        "session_token",
        Severity::Info,
        json!({"accessor": session.accessor, "ttl": session.ttl, "path": "auth/token/create-orphan",
               "replaces": login.accessor}),
    );
    match revoked {
        Ok(()) => {
            emit(
                "revoked",
                Severity::Info,
                json!({"kind": "login_token", "id": login.accessor, "via": "auth/token/revoke-self",
                       "note": "replaced by the session token at once"}),
            );
            (session, None)
        }
        Err(e) => {
            emit(
                "revocation_failed",
                Severity::Alert,
                json!({"kind": "login_token", "id": login.accessor, "error": e.to_string(),
                       "note": "tried again at the end of the session"}),
            );
            (session, Some(login))
        }
    }
}

fn secs_until(deadline: Instant) -> u64 {
    deadline
        .saturating_duration_since(Instant::now())
        .as_secs()
        .max(1)
}

impl Session {
    /// Logs in and fetches everything. On any failure every token and lease
    /// already created is revoked before the error is returned.
    pub async fn open(
        req: &Request,
        env_token: Option<SecretString>,
    ) -> Result<Session, SessionError> {
        req.validate()?;
        let method = req.auth.method(env_token)?;
        let mut vault = Vault::new(&req.server)?;
        let start = Instant::now();
        let deadline = start + req.ttl;
        vault.health().await?;
        let login = method.login(&mut vault).await?;
        // Before anything else (even the audit event): the guardian knows
        // the token and the registry record its accessor, so a SIGKILL from
        // here on does not leave it alive.
        crate::guardian::auth_token(&login.token);
        if login.created {
            crate::guardian::created_token(&login.accessor, &login.token);
        }
        sbx_core::registry::test_kill_point("creds-after-login");
        emit(
            "login",
            Severity::Info,
            json!({"method": login.method, "accessor": login.accessor, "ttl": login.ttl, "created": login.created}),
        );
        let (login, kept) = if login.created {
            replace_login(&mut vault, login, deadline).await
        } else {
            (login, None)
        };
        let mut s = Session {
            vault,
            login,
            deadline,
            ttl: req.ttl,
            env: Vec::new(),
            meta: Vec::new(),
            state: tokio::sync::Mutex::new(State::default()),
        };
        if s.login.created {
            let token = s.login.token.clone();
            s.state.get_mut().items.push(Tracked {
                kind: Kind::SessionToken,
                id: s.login.accessor.clone(),
                env: None,
                path: format!("auth ({})", s.login.method),
                token: Some(token),
                renewable: s.login.renewable,
                expires: Instant::now() + Duration::from_secs(s.login.ttl),
                renew_at: None,
                revoked: false,
            });
        }
        if let Some(k) = kept {
            s.state.get_mut().items.push(Tracked {
                kind: Kind::LoginToken,
                id: k.accessor.clone(),
                env: None,
                path: format!("auth ({})", k.method),
                token: Some(k.token),
                renewable: false,
                expires: Instant::now() + Duration::from_secs(k.ttl),
                renew_at: None,
                revoked: false,
            });
        }
        match s.fetch(req).await {
            Ok(()) => Ok(s),
            Err(e) => {
                let rep = s.revoke_all().await;
                if !rep.failed.is_empty() {
                    tracing::error!(
                        "after the failure, revocation failed for: {}",
                        rep.failed.join(", ")
                    );
                }
                Err(e)
            }
        }
    }

    /// Revokes, with this session's token, what a dead run recorded
    /// (`{"addr","accessors","leases"}`) when it is on this server: leases
    /// with `sys/leases/revoke`, tokens with `auth/token/revoke-accessor`
    /// (needs that permission; a 403 keeps the record for a later run). An
    /// id already gone counts as revoked. Emits `stale_revoked` (alert).
    pub async fn revoke_stale(&self, rec: &serde_json::Value) -> std::io::Result<()> {
        let addr = rec["addr"].as_str().unwrap_or("");
        if addr.trim_end_matches('/') != self.vault.addr().trim_end_matches('/') {
            return Err(std::io::Error::other("another server"));
        }
        let token = self.login.token.clone();
        let mut revoked = Vec::new();
        let mut failed = Vec::new();
        let ids = |f: &str| -> Vec<String> {
            rec[f]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut calls = Vec::new();
        for l in ids("leases") {
            calls.push((
                "lease",
                l.clone(),
                "sys/leases/revoke",
                json!({"lease_id": l}),
            ));
        }
        for a in ids("accessors").into_iter().rev() {
            calls.push((
                "token",
                a.clone(),
                "auth/token/revoke-accessor",
                json!({"accessor": a}),
            ));
        }
        for (kind, id, path, body) in calls {
            let r = self
                .vault
                .raw::<serde_json::Value>(
                    &format!("revocation of a dead run's {kind} {id} ({path})"),
                    Method::PUT,
                    path,
                    Some(&body),
                    Some(&token),
                )
                .await;
            match r {
                Ok(_) => revoked.push(json!({"kind": kind, "id": id})),
                // Already invalid (expired, or revoked with its parent).
                Err(e) if e.status() == Some(400) => {
                    revoked.push(json!({"kind": kind, "id": id, "note": "already invalid"}))
                }
                Err(e) => failed.push(json!({"kind": kind, "id": id, "error": e.to_string()})),
            }
        }
        emit(
            "stale_revoked",
            Severity::Alert,
            json!({"note": "a killed run and its guardian left these credentials; revoked now",
                   "revoked": revoked, "failed": failed}),
        );
        if failed.is_empty() {
            Ok(())
        } else {
            Err(std::io::Error::other("some revocations failed"))
        }
    }

    /// When the session ends at the latest.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The variables for the command, in order.
    pub fn env(&self) -> &[(String, SecretString)] {
        &self.env
    }

    /// The same secrets as a JSON document, for sbx-vm (MMDS, fw_cfg):
    /// `{"version":1,"sbx_id":..,"ttl_seconds":N,"expires_unix":T,"env":{"NAME":"value",...}}`.
    /// The returned text is zeroed when dropped.
    pub fn to_json(&self) -> Zeroizing<String> {
        struct Env<'a>(&'a [(String, SecretString)]);
        impl serde::Serialize for Env<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_map(self.0.iter().map(|(k, v)| (k, v.expose_secret())))
            }
        }
        #[derive(serde::Serialize)]
        struct Doc<'a> {
            version: u32,
            sbx_id: Option<&'a str>,
            ttl_seconds: u64,
            expires_unix: u64,
            env: Env<'a>,
        }
        let left = self.deadline.saturating_duration_since(Instant::now());
        let now_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let doc = Doc {
            version: 1,
            sbx_id: sbx_core::id::get(),
            ttl_seconds: left.as_secs(),
            expires_unix: (now_unix + left).as_secs(),
            env: Env(&self.env),
        };
        Zeroizing::new(serde_json::to_string(&doc).unwrap_or_default())
    }

    /// One `secret_injected` audit event per variable (names, paths, lease
    /// ids and TTLs; never values).
    pub fn audit_injected(&self) {
        for m in &self.meta {
            emit(
                "secret_injected",
                Severity::Info,
                json!({"env": m.env, "source": m.kind, "path": m.path, "key": m.key, "lease_id": m.lease_id, "accessor": m.accessor, "ttl": m.ttl}),
            );
        }
    }

    fn push(&mut self, env: String, value: SecretString, meta: InjectMeta) {
        self.env.push((env, value));
        self.meta.push(meta);
    }

    async fn fetch(&mut self, req: &Request) -> Result<(), SessionError> {
        // First bring a login token down to the session TTL: it bounds
        // everything created with it.
        self.cap_login().await;
        let token = self.login.token.clone();
        // KV: every distinct secret path once, all in parallel.
        let mut paths: Vec<(&'static str, String, String)> = Vec::new();
        for s in &req.secrets {
            if !paths.iter().any(|p| p.2 == s.path) {
                paths.push(("secret", s.env.clone(), s.path.clone()));
            }
        }
        for s in &req.secret_all {
            if !paths.iter().any(|p| p.2 == s.path) {
                paths.push(("secret-all", s.prefix.clone(), s.path.clone()));
            }
        }
        let mounts = self.detect_mounts(&paths, req.kv1, &token).await?;
        let reads = paths
            .iter()
            .map(|(flag, env, path)| self.read_kv(flag, env, path, &mounts, req.kv1));
        let mut maps: HashMap<String, (SecretMap, u8)> = HashMap::new();
        let results = join_all(reads).await;
        for (r, (_, _, path)) in results.into_iter().zip(&paths) {
            maps.insert(path.clone(), r?);
        }
        for s in &req.secrets {
            let (m, v) = &maps[&s.path];
            let Some(val) = m.0.get(&s.key) else {
                return Err(SessionError::NoKey {
                    flag: "secret",
                    env: s.env.clone(),
                    path: s.path.clone(),
                    key: s.key.clone(),
                    keys: m.0.keys().cloned().collect::<Vec<_>>().join(", "),
                });
            };
            let meta = InjectMeta {
                env: s.env.clone(),
                kind: if *v == 1 { "kv1" } else { "kv2" },
                path: s.path.clone(),
                key: s.key.clone(),
                lease_id: None,
                accessor: None,
                ttl: 0,
                origin: format!("--secret {}: key '{}' of secret {}", s.env, s.key, s.path),
            };
            self.push(s.env.clone(), val.0.clone(), meta);
        }
        for s in &req.secret_all {
            let (m, v) = &maps[&s.path];
            for (k, val) in &m.0 {
                let env = spec::all_env_name(&s.prefix, k);
                if !spec::valid_env_name(&env) {
                    return Err(SpecError::BadEnvName {
                        flag: "secret-all",
                        spec: format!("{}={}", s.prefix, s.path),
                        name: env,
                    }
                    .into());
                }
                let meta = InjectMeta {
                    env: env.clone(),
                    kind: if *v == 1 { "kv1" } else { "kv2" },
                    path: s.path.clone(),
                    key: k.clone(),
                    lease_id: None,
                    accessor: None,
                    ttl: 0,
                    origin: format!(
                        "--secret-all {}: key '{}' of secret {} (variable {})",
                        s.prefix,
                        spec::shown(k),
                        s.path,
                        spec::shown(&env)
                    ),
                };
                self.push(env, val.0.clone(), meta);
            }
        }
        // Dynamic secrets and the child token, in parallel; everything that
        // was created is tracked before any result is checked.
        let lease_futs = req.leases.iter().map(|l| self.create_lease(l, &token));
        let child_fut = async {
            match &req.child_token {
                Some(c) => Some(self.create_child(c).await),
                None => None,
            }
        };
        let (leases, child) = futures::join!(join_all(lease_futs), child_fut);
        let mut first_err: Option<SessionError> = None;
        let mut created: Vec<Tracked> = Vec::new();
        let mut injected = Vec::new();
        for (l, r) in req.leases.iter().zip(leases) {
            match r {
                Ok((tracked, value, meta)) => {
                    if let Some(t) = tracked {
                        created.push(t);
                    }
                    match value {
                        Ok(v) => injected.push((l.env.clone(), v, meta)),
                        Err(e) => {
                            first_err.get_or_insert(e);
                        }
                    }
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match child {
            Some(Ok((t, v, meta))) => {
                injected.push((meta.env.clone(), v, meta));
                created.push(t);
            }
            Some(Err(e)) => {
                first_err.get_or_insert(e);
            }
            None => {}
        }
        self.state.get_mut().items.extend(created);
        for (env, v, meta) in injected {
            self.push(env, v, meta);
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        // A --secret-all name is derived from a key the server chose: two
        // keys ("a-b", "a_b") or a key and another flag's variable can give
        // the same name. Said with both sources.
        let mut seen: HashMap<&str, &InjectMeta> = HashMap::new();
        for m in &self.meta {
            if let Some(first) = seen.insert(m.env.as_str(), m) {
                return Err(SessionError::Collision {
                    env: spec::shown(&m.env),
                    first: first.origin.clone(),
                    second: m.origin.clone(),
                });
            }
        }
        Ok(())
    }

    /// Checks every variable the command would get before it starts (the
    /// server's answer is untrusted input): a valid name, no NUL byte in
    /// the value, `NAME=VALUE` within the kernel's limit for one
    /// environment string. The error names the flag, path and key, never
    /// the value. The total (with CMD and the rest of the environment) is
    /// the caller's to check ([`Session::origin`] names a variable's source).
    pub fn check_env(&self) -> Result<(), SessionError> {
        for ((name, value), m) in self.env.iter().zip(&self.meta) {
            if let Some(why) = spec::env_problem(name, value.expose_secret()) {
                return Err(SessionError::Unusable {
                    origin: m.origin.clone(),
                    why,
                });
            }
        }
        Ok(())
    }

    /// Where variable `env` comes from (flag, path, key), for a message.
    pub fn origin(&self, env: &str) -> Option<&str> {
        self.meta
            .iter()
            .find(|m| m.env == env)
            .map(|m| m.origin.as_str())
    }

    /// Mount of every path: one lookup per distinct first component, all in
    /// parallel (sys/internal/ui/mounts answers for any path the token may
    /// read). A token that may not look up gets the default (v2, first
    /// component as the mount).
    async fn detect_mounts(
        &self,
        paths: &[(&'static str, String, String)],
        kv1: bool,
        token: &SecretString,
    ) -> Result<BTreeMap<String, MountInfo>, SessionError> {
        let mut firsts: Vec<(&'static str, &str, &str)> = Vec::new();
        for (flag, env, p) in paths {
            let first = p.split('/').next().unwrap_or(p);
            if !firsts.iter().any(|f| f.2.split('/').next() == Some(first)) {
                firsts.push((flag, env, p));
            }
        }
        #[derive(serde::Deserialize)]
        struct Resp {
            data: Data,
        }
        #[derive(serde::Deserialize)]
        struct Data {
            path: String,
            #[serde(rename = "type")]
            kind: String,
            #[serde(default)]
            options: Option<HashMap<String, serde_json::Value>>,
        }
        let looks = firsts.iter().map(|(flag, env, p)| async move {
            let r: Result<Resp, VaultError> = self
                .vault
                .raw(
                    &format!("mount lookup for {p} (sys/internal/ui/mounts)"),
                    Method::GET,
                    &format!("sys/internal/ui/mounts/{p}"),
                    None,
                    Some(token),
                )
                .await;
            match r {
                Ok(resp) => {
                    let d = resp.data;
                    if d.kind != "kv" && d.kind != "generic" {
                        return Err(SessionError::NotKv {
                            flag,
                            env: env.to_string(),
                            path: p.to_string(),
                            kind: d.kind,
                        });
                    }
                    let version = d
                        .options
                        .as_ref()
                        .and_then(|o| o.get("version"))
                        .and_then(|v| {
                            v.as_str()
                                .map(str::to_string)
                                .or_else(|| v.as_u64().map(|n| n.to_string()))
                        })
                        .map(|v| if v == "2" { 2 } else { 1 })
                        .unwrap_or(1);
                    let version = if kv1 { 1 } else { version };
                    Ok(Some(MountInfo {
                        path: d.path.trim_end_matches('/').to_string(),
                        version,
                    }))
                }
                // Not allowed to look up, or an old server: use the default.
                Err(e) if matches!(e.status(), Some(400 | 403 | 404 | 405)) => Ok(None),
                Err(e) => Err(e.into()),
            }
        });
        let mut out = BTreeMap::new();
        for ((_, _, p), r) in firsts.iter().zip(join_all(looks).await) {
            if let Some(m) = r? {
                out.insert(p.split('/').next().unwrap_or(p).to_string(), m);
            }
        }
        Ok(out)
    }

    async fn read_kv(
        &self,
        flag: &'static str,
        env: &str,
        path: &str,
        mounts: &BTreeMap<String, MountInfo>,
        kv1: bool,
    ) -> Result<(SecretMap, u8), SessionError> {
        let first = path.split('/').next().unwrap_or(path);
        let (mount, rest, version) = match mounts.get(first) {
            Some(m)
                if path.starts_with(&format!("{}/", m.path)) && path.len() > m.path.len() + 1 =>
            {
                (m.path.as_str(), &path[m.path.len() + 1..], m.version)
            }
            _ => (first, &path[first.len() + 1..], if kv1 { 1 } else { 2 }),
        };
        let what = format!("--{flag} {env}: read of {path}");
        let r = if version == 1 {
            vaultrs::kv1::get::<SecretMap>(&self.vault.client, mount, rest).await
        } else {
            vaultrs::kv2::read::<SecretMap>(&self.vault.client, mount, rest).await
        };
        match r {
            Ok(m) => Ok((m, version)),
            Err(e) => {
                let e = self.vault.map_err(&what, e);
                if e.status() == Some(404) {
                    return Err(SessionError::NotFound {
                        flag,
                        env: env.to_string(),
                        path: path.to_string(),
                    });
                }
                Err(e.into())
            }
        }
    }

    /// Creates one dynamic secret. The tracked lease (if any) is returned
    /// even when the field is missing, so that it is revoked.
    #[allow(clippy::type_complexity)]
    async fn create_lease(
        &self,
        l: &LeaseSpec,
        token: &SecretString,
    ) -> Result<
        (
            Option<Tracked>,
            Result<SecretString, SessionError>,
            InjectMeta,
        ),
        SessionError,
    > {
        #[derive(serde::Deserialize)]
        struct Resp {
            #[serde(default)]
            lease_id: String,
            #[serde(default)]
            lease_duration: u64,
            #[serde(default)]
            renewable: bool,
            data: Option<SecretMap>,
        }
        let what = format!("--lease {}: {}", l.env, l.path);
        let cap = secs_until(self.deadline);
        let (method, body) = if l.params.is_empty() {
            (Method::GET, None)
        } else {
            let mut m = serde_json::Map::new();
            for (k, v) in &l.params {
                m.insert(k.clone(), serde_json::Value::String(v.clone()));
            }
            // Ask for no more than the session has left.
            let asked = m
                .get("ttl")
                .and_then(|v| v.as_str())
                .and_then(|s| sbx_core::units::parse_duration(s).ok())
                .map(|d| d.as_secs());
            if asked.is_none_or(|a| a > cap) {
                m.insert("ttl".into(), json!(format!("{cap}s")));
            }
            (Method::POST, Some(serde_json::Value::Object(m)))
        };
        let resp: Resp = self
            .vault
            .raw(&what, method, &l.path, body.as_ref(), Some(token))
            .await?;
        let mut ttl = resp.lease_duration;
        let mut tracked = None;
        if !resp.lease_id.is_empty() {
            crate::guardian::lease(&resp.lease_id);
            if ttl > cap {
                ttl = self
                    .cap_lease(&resp.lease_id, resp.renewable, ttl, cap, token)
                    .await;
            }
            let now = Instant::now();
            let expires = now + Duration::from_secs(ttl);
            tracked = Some(Tracked {
                kind: Kind::Lease,
                id: resp.lease_id.clone(),
                env: Some(l.env.clone()),
                path: l.path.clone(),
                token: None,
                renewable: resp.renewable,
                expires,
                renew_at: renew_time(now, ttl, resp.renewable, self.deadline),
                revoked: false,
            });
        }
        let meta = InjectMeta {
            env: l.env.clone(),
            kind: "lease",
            path: l.path.clone(),
            key: l.field.clone(),
            lease_id: (!resp.lease_id.is_empty()).then(|| resp.lease_id.clone()),
            accessor: None,
            ttl,
            origin: format!("--lease {}: field '{}' of {}", l.env, l.field, l.path),
        };
        let value = match resp.data {
            None => Err(VaultError::Malformed {
                what,
                why: "no data in the answer".into(),
            }
            .into()),
            Some(mut d) => match d.0.remove(&l.field) {
                Some(SecretText(v)) => Ok(v),
                None => Err(SessionError::NoKey {
                    flag: "lease",
                    env: l.env.clone(),
                    path: l.path.clone(),
                    key: l.field.clone(),
                    keys: d.0.keys().cloned().collect::<Vec<_>>().join(", "),
                }),
            },
        };
        Ok((tracked, value, meta))
    }

    /// Brings a lease down to `cap` seconds by renewing it with that
    /// increment; returns the TTL it has now. One that cannot be capped is
    /// revoked at the session TTL by [`Session::maintain`] (and audited).
    async fn cap_lease(
        &self,
        id: &str,
        renewable: bool,
        ttl: u64,
        cap: u64,
        token: &SecretString,
    ) -> u64 {
        let mut now_ttl = ttl;
        if renewable && let Ok(r) = self.renew_lease(id, cap, token).await {
            now_ttl = r;
        }
        if now_ttl > cap {
            emit(
                "ttl_not_capped",
                Severity::Warn,
                json!({"kind": "lease", "lease_id": id, "ttl": now_ttl, "session_ttl": cap,
                       "note": "revoked by sbx-creds at the session TTL; after a SIGKILL of sbx-creds it lives until its own TTL"}),
            );
        }
        now_ttl
    }

    async fn renew_lease(
        &self,
        id: &str,
        increment: u64,
        token: &SecretString,
    ) -> Result<u64, VaultError> {
        #[derive(serde::Deserialize)]
        struct Resp {
            lease_duration: u64,
        }
        let r: Resp = self
            .vault
            .raw(
                &format!("renewal of lease {id} (sys/leases/renew)"),
                Method::PUT,
                "sys/leases/renew",
                Some(&json!({"lease_id": id, "increment": increment})),
                Some(token),
            )
            .await?;
        Ok(r.lease_duration)
    }

    async fn create_child(
        &self,
        c: &ChildTokenSpec,
    ) -> Result<(Tracked, SecretString, InjectMeta), SessionError> {
        use vaultrs::api::token::requests::{CreateOrphanTokenRequest, CreateTokenRequest};
        let cap = secs_until(self.deadline);
        let ttl = c.ttl.map(|d| d.as_secs().max(1)).unwrap_or(cap).min(cap);
        let meta: HashMap<String, String> = [
            (
                "sbx_id".to_string(),
                sbx_core::id::get().unwrap_or("-").to_string(),
            ),
            ("created_by".to_string(), "sbx-creds".to_string()),
        ]
        .into();
        let what = format!("--child-token {}", c.env);
        let auth = if c.orphan {
            let mut b = CreateOrphanTokenRequest::builder();
            b.ttl(format!("{ttl}s"))
                .explicit_max_ttl(format!("{cap}s"))
                .display_name("sbx-creds")
                .meta(meta)
                .renewable(true);
            if !c.policies.is_empty() {
                b.policies(c.policies.clone());
            }
            if let Some(n) = c.num_uses {
                b.num_uses(n);
            }
            vaultrs::token::new_orphan(&self.vault.client, Some(&mut b)).await
        } else {
            let mut b = CreateTokenRequest::builder();
            b.ttl(format!("{ttl}s"))
                .explicit_max_ttl(format!("{cap}s"))
                .display_name("sbx-creds")
                .meta(meta)
                .renewable(true);
            if !c.policies.is_empty() {
                b.policies(c.policies.clone());
            }
            if let Some(n) = c.num_uses {
                b.num_uses(n);
            }
            vaultrs::token::new(&self.vault.client, Some(&mut b)).await
        }
        .map_err(|e| self.vault.map_err(&format!("{what}: token creation"), e))?;
        let token = SecretString::from(auth.client_token);
        if token.expose_secret().is_empty() {
            return Err(SessionError::NoChildToken(c.env.clone()));
        }
        crate::guardian::created_token(&auth.accessor, &token);
        let tracked = Tracked {
            kind: Kind::ChildToken,
            id: auth.accessor.clone(),
            env: Some(c.env.clone()),
            path: if c.orphan {
                "auth/token/create-orphan".into()
            } else {
                "auth/token/create".into()
            },
            token: Some(token.clone()),
            renewable: false,
            expires: Instant::now() + Duration::from_secs(auth.lease_duration),
            renew_at: None,
            revoked: false,
        };
        let meta = InjectMeta {
            env: c.env.clone(),
            kind: "child_token",
            path: tracked.path.clone(),
            key: String::new(),
            lease_id: None,
            accessor: Some(auth.accessor.clone()),
            ttl: auth.lease_duration,
            origin: format!("--child-token {}: the token from {}", c.env, tracked.path),
        };
        if auth.lease_duration > cap + 1 || auth.lease_duration == 0 {
            // Tracked by the caller? Not yet: revoke it here before failing.
            let _ = vaultrs::token::revoke(&self.vault.client, token.expose_secret()).await;
            return Err(SessionError::OverGranted {
                what,
                granted: auth.lease_duration,
                cap,
            });
        }
        Ok((tracked, token, meta))
    }

    /// A token created by logging in is brought down to the session TTL
    /// (renew-self with that increment shortens it) and checked.
    async fn cap_login(&mut self) {
        if !self.login.created {
            return;
        }
        let cap = secs_until(self.deadline);
        let mut ttl = self.login.ttl;
        if (ttl == 0 || ttl > cap)
            && self.login.renewable
            && let Ok(a) =
                vaultrs::token::renew_self(&self.vault.client, Some(&format!("{cap}s"))).await
        {
            ttl = a.lease_duration;
        }
        if ttl == 0 || ttl > cap {
            emit(
                "ttl_not_capped",
                Severity::Warn,
                json!({"kind": "session_token", "accessor": self.login.accessor, "ttl": ttl, "session_ttl": cap,
                "note": if self.login.batch {
                    "a batch token: the server can neither shorten nor revoke it; it lives until its own TTL"
                } else {
                    "revoked by sbx-creds at the session TTL; after a SIGKILL of sbx-creds it lives until its own TTL"
                }}),
            );
        } else {
            emit(
                "ttl_capped",
                Severity::Info,
                json!({"kind": "session_token", "accessor": self.login.accessor, "ttl": ttl}),
            );
        }
        let now = Instant::now();
        let renewable = self.login.renewable;
        let deadline = self.deadline;
        if let Some(t) = self
            .state
            .get_mut()
            .items
            .iter_mut()
            .find(|t| t.kind == Kind::SessionToken)
        {
            t.expires = now + Duration::from_secs(ttl);
            t.renew_at = renew_time(now, ttl, renewable, deadline);
        }
        self.login.ttl = ttl;
    }

    /// Keeps leases and the session token alive until the session deadline,
    /// then revokes everything. Returns when `stop` changes or at the deadline.
    pub async fn maintain(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        loop {
            let next = {
                let st = self.state.lock().await;
                st.items
                    .iter()
                    .filter(|t| !t.revoked)
                    .filter_map(|t| t.renew_at)
                    .min()
            };
            let wake = next.map_or(self.deadline, |n| n.min(self.deadline));
            tokio::select! {
                _ = tokio::time::sleep_until(tokio::time::Instant::from_std(wake)) => {}
                r = stop.changed() => {
                    if r.is_err() || *stop.borrow() {
                        return;
                    }
                }
            }
            if Instant::now() >= self.deadline {
                emit(
                    "ttl_reached",
                    Severity::Info,
                    json!({"ttl": self.ttl.as_secs(), "action": "revoking every token and lease of the session"}),
                );
                let _ = self.revoke_all().await;
                return;
            }
            self.renew_due().await;
        }
    }

    async fn renew_due(&self) {
        let mut st = self.state.lock().await;
        let now = Instant::now();
        let token = self.login.token.clone();
        for t in st.items.iter_mut().filter(|t| !t.revoked) {
            let Some(at) = t.renew_at else { continue };
            if at > now {
                continue;
            }
            let increment = secs_until(self.deadline);
            let r = match t.kind {
                Kind::Lease => self.renew_lease(&t.id, increment, &token).await,
                Kind::SessionToken => {
                    vaultrs::token::renew_self(&self.vault.client, Some(&format!("{increment}s")))
                        .await
                        .map(|a| a.lease_duration)
                        .map_err(|e| {
                            self.vault
                                .map_err("renewal of the session token (auth/token/renew-self)", e)
                        })
                }
                Kind::ChildToken | Kind::LoginToken => continue,
            };
            let now = Instant::now();
            match r {
                Ok(ttl) => {
                    t.expires = now + Duration::from_secs(ttl);
                    t.renew_at = renew_time(now, ttl, t.renewable, self.deadline);
                    emit(
                        "renewed",
                        Severity::Info,
                        json!({"kind": t.kind.name(), "id": t.id, "env": t.env, "path": t.path, "ttl": ttl}),
                    );
                }
                Err(e) => {
                    let left = t.expires.saturating_duration_since(now);
                    // Retry while it is alive, at most every 10s.
                    t.renew_at = (left > Duration::from_secs(1))
                        .then(|| now + (left / 2).min(Duration::from_secs(10)));
                    emit(
                        "renewal_failed",
                        Severity::Warn,
                        json!({"kind": t.kind.name(), "id": t.id, "env": t.env, "path": t.path, "error": e.to_string()}),
                    );
                }
            }
        }
    }

    /// Revokes every token and lease created for the session (leases and
    /// child tokens in parallel, the session token last). Idempotent. Each
    /// revocation is an audit event; each failure an `alert`.
    pub async fn revoke_all(&self) -> RevokeReport {
        let mut st = self.state.lock().await;
        let token = self.login.token.clone();
        let mut report = RevokeReport::default();
        let pending: Vec<usize> = (0..st.items.len())
            .filter(|&i| !st.items[i].revoked && st.items[i].kind != Kind::SessionToken)
            .collect();
        let futs = pending.iter().map(|&i| {
            let t = &st.items[i];
            let token = token.clone();
            async move {
                match t.kind {
                    Kind::Lease => self
                        .vault
                        .raw::<serde_json::Value>(
                            &format!("revocation of lease {} (sys/leases/revoke)", t.id),
                            Method::PUT,
                            "sys/leases/revoke",
                            Some(&json!({"lease_id": t.id})),
                            Some(&token),
                        )
                        .await
                        .map(|_| "sys/leases/revoke"),
                    _ => self.revoke_child(t).await,
                }
            }
        });
        let results = join_all(futs).await;
        let owns_session_token = st
            .items
            .iter()
            .any(|t| t.kind == Kind::SessionToken && !t.revoked);
        let mut via_token = Vec::new();
        for (&i, r) in pending.iter().zip(results) {
            let t = &mut st.items[i];
            match r {
                Ok(how) => {
                    t.revoked = true;
                    report.revoked += 1;
                    emit(
                        "revoked",
                        Severity::Info,
                        json!({"kind": t.kind.name(), "id": t.id, "env": t.env, "path": t.path, "via": how}),
                    );
                }
                // Leases die with the token that created them: when that is
                // our session token, revoking it below revokes them.
                Err(e)
                    if owns_session_token && t.kind == Kind::Lease && e.status() == Some(403) =>
                {
                    via_token.push(i)
                }
                Err(e) => {
                    report
                        .failed
                        .push(format!("{} {}: {e}", t.kind.name(), t.id));
                    emit(
                        "revocation_failed",
                        Severity::Alert,
                        json!({"kind": t.kind.name(), "id": t.id, "env": t.env, "path": t.path, "error": e.to_string()}),
                    );
                }
            }
        }
        if let Some(t) = st
            .items
            .iter_mut()
            .find(|t| t.kind == Kind::SessionToken && !t.revoked)
        {
            let r = vaultrs::token::revoke_self(&self.vault.client)
                .await
                .map_err(|e| {
                    self.vault.map_err(
                        "revocation of the session token (auth/token/revoke-self)",
                        e,
                    )
                });
            match r {
                Ok(()) => {
                    t.revoked = true;
                    report.revoked += 1;
                    emit(
                        "revoked",
                        Severity::Info,
                        json!({"kind": t.kind.name(), "id": t.id, "path": t.path, "via": "auth/token/revoke-self"}),
                    );
                }
                Err(e) => {
                    report.failed.push(format!("session_token {}: {e}", t.id));
                    emit(
                        "revocation_failed",
                        Severity::Alert,
                        json!({"kind": t.kind.name(), "id": t.id, "path": t.path, "error": e.to_string()}),
                    );
                }
            }
        }
        let session_revoked = st
            .items
            .iter()
            .any(|t| t.kind == Kind::SessionToken && t.revoked);
        for i in via_token {
            let t = &mut st.items[i];
            if session_revoked {
                t.revoked = true;
                report.revoked += 1;
                emit(
                    "revoked",
                    Severity::Info,
                    json!({"kind": t.kind.name(), "id": t.id, "env": t.env, "path": t.path, "via": "revocation of the session token"}),
                );
            } else {
                report.failed.push(format!("lease {}: not revoked", t.id));
                emit(
                    "revocation_failed",
                    Severity::Alert,
                    json!({"kind": t.kind.name(), "id": t.id, "env": t.env, "path": t.path, "error": "permission denied on sys/leases/revoke and the session token could not be revoked"}),
                );
            }
        }
        report
    }

    /// A child token: revoked with our token (auth/token/revoke, which also
    /// revokes its children); when our policy does not allow that, with its
    /// own revoke-self. A token already gone (uses exhausted) counts as
    /// revoked.
    async fn revoke_child(&self, t: &Tracked) -> Result<&'static str, VaultError> {
        let Some(child) = &t.token else {
            return Ok("nothing to revoke");
        };
        let first = match vaultrs::token::revoke(&self.vault.client, child.expose_secret()).await {
            Ok(()) => return Ok("auth/token/revoke"),
            Err(e) => self
                .vault
                .map_err(&format!("revocation of child token {}", t.id), e),
        };
        let second: Result<serde_json::Value, VaultError> = self
            .vault
            .raw(
                "revoke-self",
                Method::POST,
                "auth/token/revoke-self",
                None,
                Some(child),
            )
            .await;
        match second {
            Ok(_) => Ok("auth/token/revoke-self"),
            Err(e) if e.status() == Some(403) => {
                // Either gone already, or a real refusal: look it up.
                let look: Result<serde_json::Value, VaultError> = self
                    .vault
                    .raw(
                        "lookup-self",
                        Method::GET,
                        "auth/token/lookup-self",
                        None,
                        Some(child),
                    )
                    .await;
                match look {
                    Err(e) if e.status() == Some(403) => Ok("already expired or used up"),
                    _ => Err(first),
                }
            }
            Err(_) => Err(first),
        }
    }
}

/// When to renew something that lives `ttl` seconds from `now`: at two
/// thirds of its life, if it is renewable and would expire before the
/// session deadline.
fn renew_time(now: Instant, ttl: u64, renewable: bool, deadline: Instant) -> Option<Instant> {
    let expires = now + Duration::from_secs(ttl);
    (renewable && ttl > 0 && expires < deadline).then(|| now + Duration::from_secs(ttl) * 2 / 3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_schedule() {
        let now = Instant::now();
        let dl = now + Duration::from_secs(3600);
        assert_eq!(
            renew_time(now, 30, true, dl),
            Some(now + Duration::from_secs(20))
        );
        assert_eq!(renew_time(now, 30, false, dl), None);
        assert_eq!(renew_time(now, 7200, true, dl), None);
        assert_eq!(renew_time(now, 0, true, dl), None);
    }
}
