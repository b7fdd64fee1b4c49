//! sbx-creds: fetches short-lived secrets from Vault/OpenBao, injects them
//! as environment variables of the command, revokes them at the end.
//!
//! The library side ([`Request`], [`Session`]) is what sbx-vm uses to get
//! the same secrets as a JSON document ([`Session::to_json`]) for MMDS or
//! fw_cfg instead of environment variables.

mod auth;
mod guardian;
mod run;
mod secret;
mod session;
mod spec;
mod vault;

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use sbx_core::Failure;
use sbx_core::cli::CommonArgs;

pub use auth::{AuthConfig, AuthMethod, Login};
pub use run::take_env_token;
pub use session::{ChildTokenSpec, Request, RevokeReport, Session, SessionError};
pub use spec::{LeaseSpec, SecretAllSpec, SecretSpec};
pub use vault::{CaCert, ServerConfig};

pub const TOOL: &str = "sbx-creds";

pub const MAN: sbx_core::man::ManInfo = sbx_core::man::ManInfo {
    about: "sbx-creds logs in to Vault or OpenBao, fetches the secrets named by --secret, --secret-all, --lease and --child-token, and runs CMD with them as environment variables, and nowhere else. It supervises CMD (fork, wait, forward signals), keeps leases renewed while CMD runs, stops CMD when the session TTL (--ttl) is reached, and revokes every token and lease it created for the session before it exits, whether CMD exited, failed or was signalled. The token sbx-creds authenticates with (--token-file, VAULT_TOKEN, or the AppRole or Kubernetes login token; the service-account token too) never reaches CMD: VAULT_TOKEN and BAO_TOKEN are removed from CMD's environment and wiped from sbx-creds' own /proc/PID/environ, and sbx-creds makes itself non-dumpable so a CMD of the same uid cannot ptrace it or read its memory. It is the outermost layer of a chain: sbx-creds ... -- sbx-fs ... -- CMD.",
    exit_status: "CMD's exit status, unchanged; 128+N when CMD was killed by signal N (also when sbx-creds stopped it at the TTL: 143 for SIGTERM, 137 for SIGKILL). 125 when sbx-creds itself failed: bad usage, a malformed spec, an unreachable server (within --timeout), a failed login, a missing secret or key, an answer that is not what the API promises; in each case CMD was not started and whatever had been created on the server was revoked first. 126 when CMD is not executable, 127 when it is not found (secrets revoked first). A revocation that fails at the end does not change the status: it is an alert in the audit log and a line on stderr.",
    inherited_state: "CMD inherits sbx-creds' environment minus VAULT_TOKEN and BAO_TOKEN, plus one variable per secret; fds 0, 1 and 2 (and the audit log fd when CMD is an sbx tool); no credentials of sbx-creds: it holds the Vault token, CMD only the values (and the --child-token, when asked for).",
    environment: "- VAULT_ADDR, VAULT_CACERT, VAULT_NAMESPACE: --vault-addr, --ca-cert and --namespace when those are not given.\n- VAULT_TOKEN: the token for --auth token. VAULT_TOKEN and BAO_TOKEN are never passed to the command.",
    extra: &[
        (
            "SECRETS",
            "--secret ENV=MOUNT/PATH#KEY sets ENV to KEY of the KV secret MOUNT/PATH. The mount and its KV version are looked up on the server (sys/internal/ui/mounts); when the token may not look up, MOUNT is the first component and the engine is KV version 2, or version 1 with --kv1 (which also forces version 1 for every mount).\n\n--secret-all PREFIX=MOUNT/PATH sets PREFIX_KEY for every KEY of the secret (KEY upper-cased, characters other than letters, digits and '_' turned into '_').\n\n--lease ENV=PATH[?NAME=VALUE&...]#FIELD reads a dynamic secret (a GET of PATH, e.g. database/creds/ro) or, with parameters, writes them (a POST, e.g. pki/issue/web?common_name=a.example) and sets ENV to FIELD of its data. The lease is renewed while CMD runs (up to the session TTL) and revoked at the end. A write asks for ttl=the time the session has left unless a shorter ttl is given.\n\n--child-token ENV --policy P ... creates a token for CMD itself (child of the session token, or an orphan with --child-orphan), with --child-ttl (default: the session TTL; never more) and --child-num-uses, and explicit_max_ttl set to what the session has left. Its accessor is audited, it is revoked at the end.\n\nNo variable name may start with SBX_ (ENV, PREFIX_, the child token's ENV, and every name the server's keys make): those are the sbx tools' own variables (SBX_AUDIT_FD, SBX_TOOL_IDS, SBX_PASS_ENV, ...), and a secret that set one would steer the next tools of the chain; refused with 125 before the command starts.",
        ),
        (
            "THE TTL PROMISE",
            "--ttl DURATION (default 1h) bounds the session. Child tokens are created with explicit_max_ttl at most that; leases are requested with a ttl at most that, and a lease or login token granted for longer is renewed with an increment that brings it down to the session's remaining time, and checked. What the server still grants for longer is an audit warning (ttl_not_capped) and is revoked by sbx-creds when the TTL is reached. When CMD outlives the TTL, sbx-creds sends it SIGTERM, then SIGKILL after --kill-grace (unless --no-enforce-ttl; the credentials are revoked at the TTL either way).\n\nAt the end (CMD exited, was signalled, failed to start, or sbx-creds received SIGTERM, SIGINT, SIGHUP or SIGQUIT, which it forwards to CMD and then waits for it) every token and lease created for the session is revoked before sbx-creds exits. After a SIGKILL of sbx-creds nothing can revoke: then the TTL is what bounds the damage, as every credential created for the session expires on the server by itself no later than --ttl after the start (except one reported as ttl_not_capped). A token given with --auth token is not created for the session and is left alone.",
        ),
        (
            "WHY THERE IS NO --file",
            "sbx-creds deliberately cannot write a secret to a file for CMD. A file outlives the process: it can be copied, left on disk after a crash, picked up by backups or caches, read by anything else that can reach the path, and it cannot be revoked. The environment of the final process is the only place secrets go; it dies with the process and is readable only by its owner (and root). A program that insists on a file can write one itself from its environment, into a tmpfs of the sandbox (sbx-fs), where it dies with the sandbox.",
        ),
        (
            "AUDIT",
            "One event per secret injected (secret_injected: env, source, path, key, lease_id, ttl), per renewal (renewed, renewal_failed), per revocation (revoked), plus login, ttl_capped, ttl_not_capped, ttl_reached and ttl_expired. A failed revocation is revocation_failed with severity alert. No event and no diagnostic ever holds a secret value or a token; they name variables, paths, keys, lease ids and token accessors.",
        ),
        (
            "POLICY NEEDED",
            "The session token needs read on the KV paths (and on sys/internal/ui/mounts/* for the KV version detection, which the default policy grants), the engine paths of --lease, update on sys/leases/renew and sys/leases/revoke for leases (without revoke, a lease of an AppRole session is revoked with the session token), and create/update on auth/token/create (auth/token/create-orphan with sudo for --child-orphan) for --child-token.",
        ),
    ],
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AuthKind {
    /// A token from --token-file or VAULT_TOKEN.
    Token,
    /// AppRole login with --role-id-file and --secret-id-file.
    Approle,
    /// Kubernetes login: the service-account token (--kubernetes-token-file) and --kubernetes-role.
    Kubernetes,
}

#[derive(Parser, Debug)]
#[command(
    name = "sbx-creds",
    version,
    about = "Run CMD with short-lived secrets from Vault/OpenBao in its environment; revoke them at the end"
)]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonArgs,

    /// Server, authentication and what to fetch (shared with sbx-vm).
    #[command(flatten)]
    pub args: Args,

    /// Bound on each request to the server, connecting included.
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub timeout: String,

    /// Time between SIGTERM and SIGKILL when the TTL stops the command.
    #[arg(long, value_name = "DURATION", default_value = "5s")]
    pub kill_grace: String,

    /// After a forwarded SIGTERM/SIGINT/SIGHUP/SIGQUIT, SIGKILL the command if it still runs this long after (default 10s, or SBX_KILL_AFTER; 0 = at once).
    #[arg(long, value_name = "DURATION")]
    pub kill_after: Option<String>,

    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<OsString>,
}

/// The flags that say where the secrets come from and what they are: the
/// server, the authentication, the secrets, leases and child token, and the
/// session TTL. sbx-creds flattens them into its [`Cli`]; sbx-vm flattens
/// the same struct, so the flags mean the same in both tools.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Server address (http:// or https://).
    #[arg(long, value_name = "URL", env = "VAULT_ADDR")]
    pub vault_addr: Option<String>,

    /// PEM file of the CA(s) to trust for an https:// server, instead of the
    /// system roots (VAULT_SKIP_VERIFY is never honoured).
    #[arg(long, value_name = "FILE", env = "VAULT_CACERT")]
    pub ca_cert: Option<PathBuf>,

    /// Vault Enterprise / OpenBao namespace.
    #[arg(long, value_name = "NS", env = "VAULT_NAMESPACE")]
    pub namespace: Option<String>,

    /// How to authenticate.
    #[arg(long, value_enum, default_value = "token")]
    pub auth: AuthKind,

    /// File holding the token (--auth token); else VAULT_TOKEN.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,

    /// File holding the AppRole role-id (--auth approle).
    #[arg(long, value_name = "FILE")]
    pub role_id_file: Option<PathBuf>,

    /// File holding the AppRole secret-id, or a response-wrapping token for
    /// it with --secret-id-wrapped (--auth approle).
    #[arg(long, value_name = "FILE")]
    pub secret_id_file: Option<PathBuf>,

    /// The secret-id file holds a response-wrapping token to unwrap.
    #[arg(long)]
    pub secret_id_wrapped: bool,

    /// Mount of the AppRole auth method.
    #[arg(long, value_name = "MOUNT", default_value = "approle")]
    pub approle_mount: String,

    /// Role to log in as (--auth kubernetes).
    #[arg(long, value_name = "ROLE")]
    pub kubernetes_role: Option<String>,

    /// File holding the pod's service-account token, a JWT (--auth kubernetes; a projected token with the audience the server's role expects, e.g. /var/run/secrets/tokens/vault).
    #[arg(
        long,
        value_name = "FILE",
        default_value = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    )]
    pub kubernetes_token_file: PathBuf,

    /// Mount of the Kubernetes (or JWT) auth method (--auth kubernetes).
    #[arg(long, value_name = "MOUNT", default_value = "kubernetes")]
    pub kubernetes_mount: String,

    /// ENV=MOUNT/PATH#KEY: a KV secret's KEY as ENV (repeatable).
    #[arg(long, value_name = "ENV=MOUNT/PATH#KEY")]
    pub secret: Vec<String>,

    /// PREFIX=MOUNT/PATH: every key K of the secret as PREFIX_K (repeatable).
    #[arg(long, value_name = "PREFIX=MOUNT/PATH")]
    pub secret_all: Vec<String>,

    /// KV mounts are version 1 (no detection).
    #[arg(long)]
    pub kv1: bool,

    /// ENV=PATH[?NAME=VALUE&...]#FIELD: a dynamic secret with a lease,
    /// renewed during the session, revoked at its end (repeatable).
    #[arg(long, value_name = "ENV=PATH#FIELD")]
    pub lease: Vec<String>,

    /// Create a short-lived token for the command, as ENV.
    #[arg(long, value_name = "ENV")]
    pub child_token: Option<String>,

    /// A policy of the child token (repeatable).
    #[arg(long, value_name = "P", requires = "child_token")]
    pub policy: Vec<String>,

    /// Make the child token an orphan (needs sudo on auth/token/create-orphan).
    #[arg(long, requires = "child_token")]
    pub child_orphan: bool,

    /// TTL of the child token (never more than --ttl).
    #[arg(long, value_name = "DURATION", requires = "child_token")]
    pub child_ttl: Option<String>,

    /// Number of uses of the child token (0: unlimited).
    #[arg(long, value_name = "N", requires = "child_token")]
    pub child_num_uses: Option<u64>,

    /// The session bound: every token and lease expires no later; the
    /// command is stopped when it outlives it.
    #[arg(long, value_name = "DURATION", default_value = "1h")]
    pub ttl: String,

    /// Do not stop the command at the TTL (credentials are still revoked).
    #[arg(long)]
    pub no_enforce_ttl: bool,
}

fn duration(flag: &str, s: &str) -> Result<Duration, Failure> {
    sbx_core::units::parse_duration(s).map_err(|e| Failure::new(format!("--{flag}: {e}")))
}

impl Cli {
    pub fn kill_grace(&self) -> Duration {
        duration("kill-grace", &self.kill_grace).unwrap_or(Duration::from_secs(5))
    }

    /// The library request these flags describe (every spec checked).
    pub fn request(&self) -> Result<Request, Failure> {
        self.args.request_checked("timeout", &self.timeout, || {
            duration("kill-grace", &self.kill_grace)?;
            if let Some(v) = &self.kill_after {
                sbx_core::supervise::parse_kill_after(v)?;
            }
            Ok(())
        })
    }
}

impl Args {
    /// The library request these flags describe (every spec checked);
    /// `timeout` (given as the flag `--{timeout_flag}`) bounds each request
    /// to the server.
    pub fn request(&self, timeout_flag: &str, timeout: &str) -> Result<Request, Failure> {
        self.request_checked(timeout_flag, timeout, || Ok(()))
    }

    fn request_checked(
        &self,
        timeout_flag: &str,
        timeout: &str,
        more: impl FnOnce() -> Result<(), Failure>,
    ) -> Result<Request, Failure> {
        let ttl = duration("ttl", &self.ttl)?;
        if ttl < Duration::from_secs(1) {
            return Err(Failure::new(format!(
                "--ttl {}: must be at least 1s",
                self.ttl
            )));
        }
        let timeout = duration(timeout_flag, timeout)?;
        if timeout.is_zero() {
            return Err(Failure::new(format!(
                "--{timeout_flag}: must be more than 0"
            )));
        }
        more()?;
        let child_ttl = self
            .child_ttl
            .as_deref()
            .map(|s| duration("child-ttl", s))
            .transpose()?;
        let addr = self.vault_addr.clone().unwrap_or_default();
        if addr.is_empty() {
            return Err(Failure::new(
                "--vault-addr: not given and VAULT_ADDR is not set",
            ));
        }
        if self.auth != AuthKind::Kubernetes && self.kubernetes_role.is_some() {
            return Err(Failure::new("--kubernetes-role needs --auth kubernetes"));
        }
        let auth = match self.auth {
            AuthKind::Kubernetes => {
                if self.token_file.is_some()
                    || self.role_id_file.is_some()
                    || self.secret_id_file.is_some()
                {
                    return Err(Failure::new(
                        "--token-file/--role-id-file/--secret-id-file do not go with --auth kubernetes",
                    ));
                }
                let Some(role) = self.kubernetes_role.clone().filter(|r| !r.is_empty()) else {
                    return Err(Failure::new("--auth kubernetes needs --kubernetes-role"));
                };
                AuthConfig::Kubernetes {
                    mount: self.kubernetes_mount.trim_matches('/').to_string(),
                    role,
                    token_file: self.kubernetes_token_file.clone(),
                }
            }
            AuthKind::Token => {
                if self.role_id_file.is_some()
                    || self.secret_id_file.is_some()
                    || self.secret_id_wrapped
                {
                    return Err(Failure::new(
                        "--role-id-file/--secret-id-file need --auth approle",
                    ));
                }
                AuthConfig::Token {
                    file: self.token_file.clone(),
                }
            }
            AuthKind::Approle => {
                if self.token_file.is_some() {
                    return Err(Failure::new("--token-file needs --auth token"));
                }
                match (&self.role_id_file, &self.secret_id_file) {
                    (Some(r), Some(s)) => AuthConfig::AppRole {
                        mount: self.approle_mount.trim_matches('/').to_string(),
                        role_id_file: r.clone(),
                        secret_id_file: s.clone(),
                        wrapped: self.secret_id_wrapped,
                    },
                    _ => {
                        return Err(Failure::new(
                            "--auth approle needs --role-id-file and --secret-id-file",
                        ));
                    }
                }
            }
        };
        let parse = |v: &[String]| -> Result<Vec<_>, Failure> {
            v.iter().map(|s| s.parse().map_err(Failure::from)).collect()
        };
        let secrets: Vec<SecretSpec> = parse(&self.secret)?;
        let secret_all: Vec<SecretAllSpec> = self
            .secret_all
            .iter()
            .map(|s| s.parse().map_err(Failure::from))
            .collect::<Result<_, _>>()?;
        let leases: Vec<LeaseSpec> = self
            .lease
            .iter()
            .map(|s| s.parse().map_err(Failure::from))
            .collect::<Result<_, _>>()?;
        if secrets.is_empty()
            && secret_all.is_empty()
            && leases.is_empty()
            && self.child_token.is_none()
        {
            return Err(Failure::new(
                "nothing to fetch: give --secret, --secret-all, --lease or --child-token",
            ));
        }
        let child_token = self.child_token.as_ref().map(|env| ChildTokenSpec {
            env: env.clone(),
            policies: self.policy.clone(),
            orphan: self.child_orphan,
            ttl: child_ttl,
            num_uses: self.child_num_uses,
        });
        // Read once, here, before any request: what is checked is what the
        // TLS client trusts.
        let ca_cert = self
            .ca_cert
            .as_deref()
            .map(|p| vault::CaCert::load(p, &addr))
            .transpose()?;
        let req = Request {
            server: ServerConfig {
                addr,
                ca_cert,
                namespace: self.namespace.clone(),
                timeout,
            },
            auth,
            secrets,
            secret_all,
            leases,
            child_token,
            ttl,
            kv1: self.kv1,
        };
        req.validate()?;
        Ok(req)
    }
}

pub fn main() -> ! {
    sbx_core::cli::run_main(TOOL, || {
        // Before anything else (and before any thread): the token leaves
        // the environment.
        let env_token = take_env_token();
        let cli: Cli = sbx_core::cli::parse(TOOL)?;
        sbx_core::cli::init(TOOL, &cli.common)?;
        run::run(cli, env_token)
    })
}
