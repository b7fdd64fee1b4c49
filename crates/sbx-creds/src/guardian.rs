//! A guardian that outlives a SIGKILLed sbx-creds and revokes what it
//! created.
//!
//! An `sbx_core::guardian`, forked before any thread exists: sbx-creds
//! sends it, right after each creation and before the command starts,
//! what it needs to revoke it: the tokens themselves (in the pipe and the
//! guardian's memory only, never in a file; its pipe is close-on-exec: the
//! command never has it) and the lease ids. After its own revocation
//! sbx-creds releases it. Gone without releasing it means sbx-creds died
//! without revoking: the guardian revokes (leases with the session's
//! token, each created token with revoke-self, which also revokes its
//! non-orphan children and its leases) and says so in an `alert` audit
//! event.
//!
//! Limit: a token the server created while sbx-creds was killed in the
//! middle of its creation request never reached sbx-creds and so cannot be
//! revoked by anyone but its TTL (the role's for the login token, --ttl for
//! the orphan session token that replaces it).

use std::io::Write;
use std::sync::Mutex;

use sbx_core::Severity;
use sbx_core::audit::emit;
use sbx_core::guardian::{Ending, Guardian, Watch};
use secrecy::{ExposeSecret, SecretString};
use serde_json::json;
use zeroize::Zeroizing;

use crate::vault::{ServerConfig, Vault};

static GUARDIAN: Mutex<Option<Guardian>> = Mutex::new(None);

/// The cross-run record: a registry entry (its flock held by sbx-creds and,
/// inherited over the fork, by the guardian) naming a file with the server
/// address, the accessors and lease ids (never a token).
struct Record {
    _entry: sbx_core::registry::Entry,
    file: std::path::PathBuf,
    data: serde_json::Value,
}

static RECORD: Mutex<Option<Record>> = Mutex::new(None);

/// The registry kind of a run's credentials.
pub const KIND: &str = "creds";

/// Starts the record (before [`spawn`], so the guardian holds the lock
/// too). Without a registry there is no record (a warning says so).
pub fn record_start(addr: &str, ttl: std::time::Duration) {
    let r = (|| -> std::io::Result<Record> {
        let d = sbx_core::registry::dir()?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|t| t.as_nanos())
            .unwrap_or(0);
        let file = d.join(format!(".rec-{KIND}-{}-{now}", std::process::id()));
        // Everything created is capped to the TTL: past it, nothing is left.
        let expires = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|t| t.as_secs())
            .unwrap_or(0)
            + ttl.as_secs()
            + 1;
        let data = json!({"addr": addr, "expires_unix": expires, "accessors": [], "leases": []});
        // Registered before the file exists: a SIGKILL at any point leaves
        // an entry the next run reaps (with the file, or its temporary).
        let entry = sbx_core::registry::register(KIND, &file)?;
        write_record(&file, &data)?;
        Ok(Record {
            _entry: entry,
            file,
            data,
        })
    })();
    match r {
        Ok(r) => *RECORD.lock().unwrap_or_else(|e| e.into_inner()) = Some(r),
        Err(e) => emit(
            "record_missing",
            Severity::Warn,
            json!({"why": e.to_string(), "note": "a later run cannot revoke what this run leaves if it and its guardian are killed"}),
        ),
    }
}

/// The temporary a record is written to before its rename.
pub fn record_tmp(file: &std::path::Path) -> std::path::PathBuf {
    file.with_extension("tmp")
}

/// What a dead run's record holds: its temporary when that is complete
/// (killed between the write and the rename: it holds one id more),
/// else the record; None when neither parses (nothing was created yet).
pub fn read_record(file: &std::path::Path) -> Option<serde_json::Value> {
    let parse = |p: &std::path::Path| -> Option<serde_json::Value> {
        let b = sbx_core::input::read_regular(p, 1 << 20).ok()?;
        serde_json::from_slice(&b).ok()
    };
    parse(&record_tmp(file)).or_else(|| parse(file))
}

fn write_record(file: &std::path::Path, data: &serde_json::Value) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = record_tmp(file);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(&tmp)?;
    f.write_all(data.to_string().as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, file)
}

fn record(field: &str, id: &str) {
    let mut g = RECORD.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(r) = g.as_mut() {
        if let Some(a) = r.data[field].as_array_mut() {
            a.push(json!(id));
        }
        if let Err(e) = write_record(&r.file, &r.data) {
            emit(
                "record_failed",
                Severity::Warn,
                json!({"file": r.file, "error": e.to_string()}),
            );
        }
    }
}

/// One message: a kind letter and its fields, space-separated.
fn send(msg: &str) {
    let mut g = GUARDIAN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(guardian) = g.as_ref() {
        // A dead guardian (EPIPE) leaves the normal revocation in charge.
        if guardian.send(msg.as_bytes()).is_err() {
            *g = None;
        }
    }
}

/// Records the auth token leases are created with (given or created).
pub fn auth_token(token: &SecretString) {
    send(&format!("A {}", token.expose_secret()));
}

/// Records a token created for the session: revoked (revoke-self) if
/// sbx-creds dies.
pub fn created_token(accessor: &str, token: &SecretString) {
    // The guardian first (one write to a pipe), then the file (several
    // system calls).
    send(&format!("T {accessor} {}", token.expose_secret()));
    record("accessors", accessor);
}

/// Records a lease.
pub fn lease(id: &str) {
    send(&format!("L {id}"));
    record("leases", id);
}

/// sbx-creds revoked everything itself: the guardian leaves.
pub fn done() {
    if let Some(g) = GUARDIAN.lock().unwrap_or_else(|e| e.into_inner()).take() {
        g.release();
    }
    forget_record();
}

/// Forks the guardian. Must run before any thread exists; if one does, or
/// the fork fails, there is no guardian (a warning says so).
pub fn spawn(server: &ServerConfig) {
    if !sbx_core::guardian::single_threaded() {
        emit(
            "guardian_missing",
            Severity::Warn,
            json!({"why": "more than one thread at start-up", "note": "after a SIGKILL of sbx-creds its tokens live until their TTL"}),
        );
        return;
    }
    // SAFETY: single-threaded (checked above), so the child may run any code.
    match unsafe { Guardian::spawn(|w| guard(w, server)) } {
        Ok(g) => *GUARDIAN.lock().unwrap_or_else(|e| e.into_inner()) = Some(g),
        Err(e) => emit(
            "guardian_missing",
            Severity::Warn,
            json!({"why": format!("fork: {e}")}),
        ),
    }
}

fn guard(w: Watch, server: &ServerConfig) -> i32 {
    // SAFETY: plain signal dispositions; the guardian waits for sbx-creds
    // only (a terminal's ^C to the group must not end it before sbx-creds).
    unsafe {
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
            libc::signal(s, libc::SIG_IGN);
        }
        libc::setsid();
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::dup2(null, 1);
            libc::close(null);
        }
    }
    let Ending::OwnerGone(msgs) = w.wait() else {
        // sbx-creds revoked and removes the record itself.
        return 0;
    };
    let msgs: Vec<Zeroizing<String>> = msgs
        .into_iter()
        .map(|m| {
            Zeroizing::new(
                String::from_utf8(m)
                    .map_err(|e| Zeroizing::new(e.into_bytes()))
                    .unwrap_or_default(),
            )
        })
        .collect();
    let mut auth: Option<SecretString> = None;
    let mut tokens: Vec<(String, SecretString)> = Vec::new();
    let mut leases: Vec<String> = Vec::new();
    for m in &msgs {
        let mut it = m.splitn(3, ' ');
        match (it.next(), it.next(), it.next()) {
            (Some("A"), Some(t), _) => auth = Some(SecretString::from(t.to_string())),
            (Some("T"), Some(a), Some(t)) => {
                tokens.push((a.to_string(), SecretString::from(t.to_string())))
            }
            (Some("L"), Some(id), _) => leases.push(id.to_string()),
            _ => {}
        }
    }
    if tokens.is_empty() && leases.is_empty() {
        forget_record();
        return 0;
    }
    // The tests kill the guardian too: the registry record is then the
    // next run's to revoke.
    sbx_core::registry::test_kill_point("creds-guardian");
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return 1;
    };
    let code = rt.block_on(revoke(server, auth, tokens, leases));
    if code == 0 {
        // Nothing left for a later run: the record and its entry go.
        forget_record();
    }
    code
}

fn forget_record() {
    if let Some(r) = RECORD.lock().unwrap_or_else(|e| e.into_inner()).take() {
        let _ = std::fs::remove_file(record_tmp(&r.file));
        let _ = std::fs::remove_file(&r.file);
    }
}

async fn revoke(
    server: &ServerConfig,
    auth: Option<SecretString>,
    tokens: Vec<(String, SecretString)>,
    leases: Vec<String>,
) -> i32 {
    let mut vault = match Vault::new(server) {
        Ok(v) => v,
        Err(e) => {
            emit(
                "revocation_failed",
                Severity::Alert,
                json!({"by": "guardian", "error": e.to_string()}),
            );
            return 1;
        }
    };
    let mut revoked = Vec::new();
    let mut failed = Vec::new();
    for id in &leases {
        let r = vault
            .raw::<serde_json::Value>(
                &format!("revocation of lease {id} (sys/leases/revoke)"),
                reqwest::Method::PUT,
                "sys/leases/revoke",
                Some(&json!({"lease_id": id})),
                auth.as_ref(),
            )
            .await;
        match r {
            Ok(_) => revoked.push(json!({"kind": "lease", "id": id})),
            // Revoking the session token below revokes its leases.
            Err(e) if e.status() == Some(403) && !tokens.is_empty() => {
                revoked.push(json!({"kind": "lease", "id": id, "via": "the session token"}))
            }
            Err(e) => failed.push(json!({"kind": "lease", "id": id, "error": e.to_string()})),
        }
    }
    // Children before the session token: an orphan child survives its parent.
    for (acc, t) in tokens.iter().rev() {
        vault.set_token(t);
        let r = vaultrs::token::revoke_self(&vault.client)
            .await
            .map_err(|e| vault.map_err("revocation of a token (auth/token/revoke-self)", e));
        match r {
            Ok(_) => revoked.push(json!({"kind": "token", "accessor": acc})),
            // Already gone with its parent (or expired): nothing alive.
            Err(e) if e.status() == Some(403) => {
                revoked.push(json!({"kind": "token", "accessor": acc, "note": "already invalid"}))
            }
            Err(e) => {
                failed.push(json!({"kind": "token", "accessor": acc, "error": e.to_string()}))
            }
        }
    }
    emit(
        "guardian_revoked",
        Severity::Alert,
        json!({"note": "sbx-creds died without revoking; its guardian revoked what it had created",
               "revoked": revoked, "failed": failed}),
    );
    if failed.is_empty() { 0 } else { 1 }
}
