//! Dynamic database credentials (the database engine against a local
//! PostgreSQL the test starts): leases renewed while the command runs,
//! capped to the session TTL, revoked at the end (the role is dropped).

mod common;

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::json;

fn pg_bin(name: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.flatten().map(|e| e.path().join("bin")).collect())
        .unwrap_or_default();
    dirs.sort();
    dirs.reverse();
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.exists())
}

struct Pg {
    port: u16,
    _dir: tempfile::TempDir,
}

/// PostgreSQL as the test user (it refuses to run as root), trust auth on
/// 127.0.0.1, killed with this process.
fn start_pg() -> Result<Pg, String> {
    let (Some(initdb), Some(postgres)) = (pg_bin("initdb"), pg_bin("postgres")) else {
        return Err("PostgreSQL server binaries missing (apt postgresql-15)".into());
    };
    let Some((uid, gid)) = test_user() else {
        return Err("test user missing (scripts/setup)".into());
    };
    if !is_root() {
        return Err("needs root to run PostgreSQL as the test user".into());
    }
    let dir = shared_tempdir();
    let data = dir.path().join("data");
    let drop_priv = move || {
        // SAFETY: runs only in a forked child before exec (pre_exec below):
        // setgroups with a count of 0 reads no list (null is allowed),
        // setgid/setuid take plain ids; all async-signal-safe.
        if unsafe {
            libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(gid) != 0
                || libc::setuid(uid) != 0
        } {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: the pre_exec closure (drop_priv) only makes async-signal-safe
    // calls and allocates nothing.
    let out = unsafe {
        Command::new(&initdb)
            .args(["-U", "postgres", "--auth=trust", "-N", "-E", "UTF8", "-D"])
            .arg(&data)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .pre_exec(drop_priv)
            .output()
            .map_err(|e| e.to_string())?
    };
    if !out.status.success() {
        return Err(format!("initdb: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (tx, rx) = std::sync::mpsc::channel();
    let (data2, sock) = (data.clone(), dir.path().to_path_buf());
    std::thread::spawn(move || {
        // SAFETY: the pre_exec closure only makes async-signal-safe calls
        // (set*id, prctl with plain integers) and allocates nothing; this
        // thread stays parked, so PDEATHSIG fires only when the test ends.
        let child = unsafe {
            Command::new(&postgres)
                .arg("-D")
                .arg(&data2)
                .args([
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    "fsync=off",
                    "-p",
                    &port.to_string(),
                    "-k",
                ])
                .arg(&sock)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .pre_exec(move || {
                    drop_priv()?;
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                })
                .spawn()
        };
        let _ = tx.send(child.map(|_| ()).map_err(|e| e.to_string()));
        loop {
            std::thread::park();
        }
    });
    rx.recv().unwrap()?;
    let pg = Pg { port, _dir: dir };
    if !wait_until(Duration::from_secs(30), || pg.sql("SELECT 1").is_some()) {
        return Err("postgres did not come up".into());
    }
    Ok(pg)
}

impl Pg {
    fn sql(&self, q: &str) -> Option<String> {
        let out = Command::new("psql")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-tAc",
                q,
            ])
            .env("PGCONNECT_TIMEOUT", "5")
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

#[test]
fn database_leases_renewed_capped_and_revoked() {
    let b = bao_or_skip!();
    if !have("psql") {
        skip!("psql missing (apt postgresql-client-15)");
    }
    let pg = match start_pg() {
        Ok(p) => p,
        Err(e) => skip!("{e}"),
    };
    b.call(
        "POST",
        "sys/mounts/database",
        Some(json!({"type": "database"})),
    );
    b.call(
        "POST",
        "database/config/pg",
        Some(json!({
            "plugin_name": "postgresql-database-plugin",
            "connection_url": format!("postgresql://{{{{username}}}}:{{{{password}}}}@127.0.0.1:{}/postgres?sslmode=disable", pg.port),
            "username": "postgres",
            "password": "unused-trust-auth",
            "allowed_roles": ["short", "long"],
            "verify_connection": true
        })),
    );
    let create =
        "CREATE ROLE \"{{name}}\" WITH LOGIN PASSWORD '{{password}}' VALID UNTIL '{{expiration}}';";
    // Leases of 3s (renewed during the session) and of an hour (capped).
    for (role, ttl) in [("short", "4s"), ("long", "1h")] {
        b.call(
            "POST",
            &format!("database/roles/{role}"),
            Some(json!({"db_name": "pg", "creation_statements": [create], "default_ttl": ttl, "max_ttl": "2h"})),
        );
    }
    b.call(
        "PUT",
        "sys/policies/acl/db",
        Some(json!({"policy": r#"
path "database/creds/*" { capabilities = ["read"] }
path "sys/leases/renew" { capabilities = ["update"] }
path "sys/leases/revoke" { capabilities = ["update"] }
"#})),
    );
    let token = b.call(
        "POST",
        "auth/token/create",
        Some(json!({"policies": ["db"], "ttl": "10m"})),
    )["auth"]["client_token"]
        .as_str()
        .unwrap()
        .to_string();
    let w = Work::new();
    let out = creds(b, &w, As::Root)
        .env("VAULT_TOKEN", &token)
        .args([
            "--ttl",
            "50s",
            "--lease",
            "SU=database/creds/short#username",
            "--lease",
            "LU=database/creds/long#username",
            "--",
            "sh",
            "-c",
            "echo \"$SU $LU\"; sleep 6",
        ])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let so = stdout(&out);
    let users: Vec<&str> = so.split_whitespace().collect();
    assert_eq!(users.len(), 2, "{so}");
    let short = assert_event(&w.audit(), "secret_injected", "info", |e| e["env"] == "SU");
    let long = assert_event(&w.audit(), "secret_injected", "info", |e| e["env"] == "LU");
    // The hour-long lease was brought down to the session.
    assert!(long["ttl"].as_u64().unwrap() <= 50, "{long}");
    let sid = short["lease_id"].as_str().unwrap();
    assert_event(&w.audit(), "renewed", "info", |e| {
        e["kind"] == "lease" && e["id"] == sid
    });
    for ev in [&short, &long] {
        let id = ev["lease_id"].as_str().unwrap();
        assert!(!b.lease_exists(id), "lease {id} alive");
    }
    for u in users {
        assert_eq!(
            pg.sql(&format!(
                "SELECT count(*) FROM pg_roles WHERE rolname = '{u}'"
            ))
            .as_deref(),
            Some("0"),
            "role {u} not dropped"
        );
    }
}
