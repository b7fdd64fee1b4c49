//! How sbx-creds proves who it is. Every method implements [`AuthMethod`];
//! a new one (OIDC, ...) is one more implementation and one more arm in
//! [`AuthConfig::method`].

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use secrecy::{ExposeSecret, SecretString};
use zeroize::Zeroizing;

use crate::secret::SecretText;
use crate::vault::{Vault, VaultError};

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("{flag} {path}: {why}")]
    File {
        flag: &'static str,
        path: PathBuf,
        why: String,
    },
    #[error("--auth token: no token (give --token-file FILE or set VAULT_TOKEN)")]
    NoToken,
    #[error("--auth approle needs --role-id-file and --secret-id-file")]
    AppRoleIncomplete,
    #[error("--auth kubernetes needs --kubernetes-role")]
    KubernetesIncomplete,
    #[error("{0}")]
    Vault(#[from] VaultError),
}

/// The token a method produced.
pub struct Login {
    pub token: SecretString,
    /// Accessor (for audit and revocation); empty if unknown.
    pub accessor: String,
    /// Seconds left; 0 for a token that never expires (root).
    pub ttl: u64,
    pub renewable: bool,
    /// Whether this token was created for the session (and so must be
    /// revoked at its end) or given to us (and left alone).
    pub created: bool,
    /// A batch token: can be neither renewed (so not shortened) nor revoked.
    pub batch: bool,
    pub method: &'static str,
}

#[async_trait]
pub trait AuthMethod: Send + Sync {
    fn name(&self) -> &'static str;
    /// Logs in; `vault` has no token yet.
    async fn login(&self, vault: &mut Vault) -> Result<Login, AuthError>;
}

/// Which method, from the command line.
#[derive(Debug, Clone)]
pub enum AuthConfig {
    Token {
        file: Option<PathBuf>,
    },
    AppRole {
        mount: String,
        role_id_file: PathBuf,
        secret_id_file: PathBuf,
        wrapped: bool,
    },
    /// The pod's service-account token (a JWT) posted with a role to
    /// `auth/MOUNT/login`: OpenBao/Vault's Kubernetes method, or its JWT
    /// method (the same request) where the server checks the token against
    /// the cluster's signing keys.
    Kubernetes {
        mount: String,
        role: String,
        token_file: PathBuf,
    },
}

impl AuthConfig {
    /// The method object, reading its credential files now (before any
    /// request and before the command could see them).
    pub fn method(
        &self,
        env_token: Option<SecretString>,
    ) -> Result<Box<dyn AuthMethod>, AuthError> {
        match self {
            AuthConfig::Token { file } => {
                let token = match file {
                    Some(p) => read_secret_file("--token-file", p)?,
                    None => env_token.ok_or(AuthError::NoToken)?,
                };
                if token.expose_secret().is_empty() {
                    return Err(AuthError::NoToken);
                }
                Ok(Box::new(TokenAuth { token }))
            }
            AuthConfig::AppRole {
                mount,
                role_id_file,
                secret_id_file,
                wrapped,
            } => Ok(Box::new(AppRoleAuth {
                mount: mount.clone(),
                role_id: read_secret_file("--role-id-file", role_id_file)?,
                secret_id: read_secret_file("--secret-id-file", secret_id_file)?,
                wrapped: *wrapped,
            })),
            AuthConfig::Kubernetes {
                mount,
                role,
                token_file,
            } => Ok(Box::new(KubernetesAuth {
                mount: mount.clone(),
                role: role.clone(),
                jwt: read_secret_file("--kubernetes-token-file", token_file)?,
            })),
        }
    }
}

/// Reads a credential file: its content, trimmed, into zeroizing memory.
pub fn read_secret_file(flag: &'static str, path: &Path) -> Result<SecretString, AuthError> {
    let err = |why: String| AuthError::File {
        flag,
        path: path.to_path_buf(),
        why,
    };
    let raw = Zeroizing::new(
        sbx_core::input::read_regular(path, sbx_core::input::CONFIG_CAP)
            .map_err(|e| err(e.to_string()))?,
    );
    let text = std::str::from_utf8(&raw).map_err(|_| err("not UTF-8 text".into()))?;
    let t = text.trim();
    if t.is_empty() {
        return Err(err("is empty".into()));
    }
    if t.contains(['\n', '\r', '\0']) {
        return Err(err("holds more than one line".into()));
    }
    Ok(SecretString::from(t.to_string()))
}

/// A token given to us. Not created for the session: never revoked by us.
pub struct TokenAuth {
    token: SecretString,
}

#[async_trait]
impl AuthMethod for TokenAuth {
    fn name(&self) -> &'static str {
        "token"
    }
    async fn login(&self, vault: &mut Vault) -> Result<Login, AuthError> {
        vault.set_token(&self.token);
        let me = vaultrs::token::lookup_self(&vault.client)
            .await
            .map_err(|e| vault.map_err("token lookup (auth/token/lookup-self)", e))?;
        Ok(Login {
            token: self.token.clone(),
            accessor: me.accessor,
            ttl: me.ttl,
            renewable: me.renewable.unwrap_or(false),
            created: false,
            batch: false,
            method: "token",
        })
    }
}

/// AppRole: role-id and secret-id (plain, or a response-wrapping token
/// that unwraps to the secret-id).
pub struct AppRoleAuth {
    mount: String,
    role_id: SecretString,
    secret_id: SecretString,
    wrapped: bool,
}

#[async_trait]
impl AuthMethod for AppRoleAuth {
    fn name(&self) -> &'static str {
        "approle"
    }
    async fn login(&self, vault: &mut Vault) -> Result<Login, AuthError> {
        let secret_id = if self.wrapped {
            #[derive(serde::Deserialize)]
            struct Unwrapped {
                secret_id: SecretText,
            }
            // The wrapping token authenticates the unwrap itself.
            vault.set_token(&self.secret_id);
            let u: Unwrapped = vaultrs::sys::wrapping::unwrap(&vault.client, None)
                .await
                .map_err(|e| vault.map_err("unwrap of the secret-id (sys/wrapping/unwrap)", e))?;
            vault.set_token(&SecretString::from(String::new()));
            u.secret_id.0
        } else {
            self.secret_id.clone()
        };
        let auth = vaultrs::auth::approle::login(
            &vault.client,
            &self.mount,
            self.role_id.expose_secret(),
            secret_id.expose_secret(),
        )
        .await
        .map_err(|e| vault.map_err(&format!("approle login (auth/{}/login)", self.mount), e))?;
        Ok(created_login(vault, auth, "approle"))
    }
}

/// A token a login request created for the session (revoked at its end).
fn created_login(vault: &mut Vault, auth: vaultrs::api::AuthInfo, method: &'static str) -> Login {
    let batch = auth.token_type == "batch";
    let token = SecretString::from(auth.client_token);
    vault.set_token(&token);
    Login {
        batch,
        token,
        accessor: auth.accessor,
        ttl: auth.lease_duration,
        renewable: auth.renewable,
        created: true,
        method,
    }
}

/// Kubernetes: the service-account token (read before the command starts,
/// never passed on) and a role. The server decides what the token proves
/// (the Kubernetes method asks the cluster's TokenReview API; the JWT
/// method checks its signature, issuer, audience and subject).
pub struct KubernetesAuth {
    mount: String,
    role: String,
    jwt: SecretString,
}

#[async_trait]
impl AuthMethod for KubernetesAuth {
    fn name(&self) -> &'static str {
        "kubernetes"
    }
    async fn login(&self, vault: &mut Vault) -> Result<Login, AuthError> {
        let auth = vaultrs::auth::kubernetes::login(
            &vault.client,
            &self.mount,
            &self.role,
            self.jwt.expose_secret(),
        )
        .await
        .map_err(|e| {
            vault.map_err(
                &format!(
                    "kubernetes login (auth/{}/login, role {})",
                    self.mount, self.role
                ),
                e,
            )
        })?;
        Ok(created_login(vault, auth, "kubernetes"))
    }
}
