//! sbx-creds against a real OpenBao dev server.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::json;

/// KV v2 and v1 (detected, and forced with --kv1), --secret-all; the token
/// given to sbx-creds is in neither the child's environment nor its
/// /proc/PID/environ nor readable in sbx-creds' own; no value on disk, in
/// the audit log or on stderr. As root and as the unprivileged user.
#[test]
fn kv_injection_and_no_leak() {
    let b = bao_or_skip!();
    for who in identities() {
        let started = std::time::SystemTime::now();
        let w = Work::new();
        let token = b.app_token("10m");
        let script = r#"
            echo "DB=$DB"; echo "API=$APP_API"; echo "PW=$PW"
            echo "VT=${VAULT_TOKEN:-unset}"; echo "BT=${BAO_TOKEN:-unset}"
            echo "--- child environ"; tr '\0' '\n' < /proc/$$/environ
            echo "--- parent environ"; { tr '\0' '\n' < /proc/$PPID/environ; } 2>&1; true
        "#;
        let out = creds(b, &w, who)
            .env("VAULT_TOKEN", &token)
            .env("BAO_TOKEN", &token)
            .args([
                "--secret",
                "DB=secret/app#db",
                "--secret",
                "PW=kv1/app#pw",
                "--secret-all",
                "APP=secret/app",
                "--",
                "sh",
                "-c",
                script,
            ])
            .output()
            .unwrap();
        let so = stdout(&out);
        let se = stderr(&out);
        assert_eq!(code(&out), 0, "{who:?}: {se}");
        assert!(so.contains(&format!("DB={DB_PASS}\n")), "{so}");
        assert!(so.contains(&format!("API={API_KEY}\n")), "{so}");
        assert!(so.contains(&format!("PW={KV1_PASS}\n")), "{so}");
        assert!(so.contains("VT=unset") && so.contains("BT=unset"), "{so}");
        let (_, environ) = so.split_once("--- child environ\n").unwrap();
        let (child_env, parent_env) = environ.split_once("--- parent environ\n").unwrap();
        assert!(
            child_env.contains(&format!("DB={DB_PASS}")),
            "child environ unreadable: {child_env}"
        );
        assert!(
            !child_env.contains(&token),
            "token in /proc/<child>/environ"
        );
        // sbx-creds wiped it from its own environment block, and (being
        // non-dumpable) its /proc files are root's: the user cannot read them.
        assert!(
            !parent_env.contains(&token),
            "{who:?}: token in /proc/<sbx-creds>/environ"
        );
        if who == As::User {
            assert!(parent_env.contains("Permission denied"), "{parent_env}");
        }
        for v in [DB_PASS, API_KEY, KV1_PASS, token.as_str()] {
            assert!(!se.contains(v), "stderr holds a secret: {se}");
        }
        let log = std::fs::read_to_string(w.audit()).unwrap();
        for v in [DB_PASS, API_KEY, KV1_PASS, token.as_str()] {
            assert!(!log.contains(v), "audit log holds a secret");
        }
        let hits = files_containing(w.dir.path(), &[DB_PASS, API_KEY, KV1_PASS, &token]);
        assert!(hits.is_empty(), "secret on disk: {hits:?}");
        // Nor in the shared writable places (files written since the start).
        for shared in ["/tmp", "/dev/shm", "/var/tmp"] {
            let hits = files_containing_since(
                std::path::Path::new(shared),
                &[DB_PASS, API_KEY, KV1_PASS, &token],
                started,
            );
            assert!(hits.is_empty(), "secret on disk: {hits:?}");
        }
        assert_event(&w.audit(), "secret_injected", "info", |e| {
            e["env"] == "DB" && e["path"] == "secret/app" && e["source"] == "kv2"
        });
        assert_event(&w.audit(), "secret_injected", "info", |e| {
            e["env"] == "PW" && e["source"] == "kv1"
        });
        assert_event(&w.audit(), "secret_injected", "info", |e| {
            e["env"] == "APP_DB" && e["key"] == "db"
        });

        // --kv1 forces version 1 for a mount the token may not look up.
        let out = creds(b, &w, who)
            .env("VAULT_TOKEN", &token)
            .args([
                "--kv1",
                "--secret",
                "PW=kv1/app#pw",
                "--",
                "sh",
                "-c",
                "echo PW=$PW",
            ])
            .output()
            .unwrap();
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(stdout(&out).contains(&format!("PW={KV1_PASS}")));
    }
}

/// The child's status passes through; --token-file works.
#[test]
fn token_file_and_exit_status() {
    let b = bao_or_skip!();
    for who in identities() {
        let w = Work::new();
        let tf = w.cred("token", &format!("{}\n", b.app_token("10m")), who);
        let out = creds(b, &w, who)
            .arg("--token-file")
            .arg(&tf)
            .args([
                "--secret",
                "DB=secret/app#db",
                "--",
                "sh",
                "-c",
                "test \"$DB\" = \"$0\" && exit 7",
                DB_PASS,
            ])
            .output()
            .unwrap();
        assert_eq!(code(&out), 7, "{}", stderr(&out));
        let out = creds(b, &w, who)
            .arg("--token-file")
            .arg(&tf)
            .args([
                "--secret",
                "DB=secret/app#db",
                "--",
                "sh",
                "-c",
                "kill -TERM $$",
            ])
            .output()
            .unwrap();
        assert_eq!(code(&out), 143);
    }
}

/// The session token's accessor: the token that replaced an AppRole
/// login token, else the login token.
fn login_accessor(w: &Work) -> String {
    let replaced = events(&w.audit(), "session_token");
    let e = replaced
        .first()
        .cloned()
        .unwrap_or_else(|| events(&w.audit(), "login")[0].clone());
    e["accessor"].as_str().unwrap().to_string()
}

/// The AppRole login token's own accessor.
fn first_login_accessor(w: &Work) -> String {
    events(&w.audit(), "login")[0]["accessor"]
        .as_str()
        .unwrap()
        .to_string()
}

/// AppRole login with a plain and with a response-wrapped secret-id; the
/// login token is capped to --ttl although the role allows 1h, and it is
/// revoked at the end.
#[test]
fn approle_login_plain_and_wrapped() {
    let b = bao_or_skip!();
    for who in identities() {
        for wrapped in [false, true] {
            let w = Work::new();
            let rid = w.cred("role-id", &b.role_id("sbx"), who);
            let sid_val = if wrapped {
                b.wrapped_secret_id("sbx")
            } else {
                b.secret_id("sbx")
            };
            let sid = w.cred("secret-id", &sid_val, who);
            let mut c = creds(b, &w, who);
            c.args(["--auth", "approle", "--ttl", "45s", "--role-id-file"])
                .arg(&rid)
                .arg("--secret-id-file")
                .arg(&sid);
            if wrapped {
                c.arg("--secret-id-wrapped");
            }
            let out = c
                .args([
                    "--secret",
                    "DB=secret/app#db",
                    "--",
                    "sh",
                    "-c",
                    "echo DB=$DB",
                ])
                .output()
                .unwrap();
            assert_eq!(code(&out), 0, "{who:?} wrapped={wrapped}: {}", stderr(&out));
            assert!(stdout(&out).contains(&format!("DB={DB_PASS}")));
            let cap = assert_event(&w.audit(), "ttl_capped", "info", |e| {
                e["kind"] == "session_token"
            });
            assert!(cap["ttl"].as_u64().unwrap() <= 45, "{cap}");
            let acc = login_accessor(&w);
            assert_eq!(
                b.accessor_ttl(&acc),
                None,
                "session token still alive after the end"
            );
            assert_event(&w.audit(), "revoked", "info", |e| {
                e["kind"] == "session_token" && e["id"] == acc.as_str()
            });
            // The login token (the role's 1h) was replaced at once by an
            // orphan capped to --ttl, and revoked then; a warning says the
            // role's TTL is longer than --ttl.
            let login = first_login_accessor(&w);
            assert_ne!(login, acc);
            assert_event(&w.audit(), "revoked", "info", |e| {
                e["kind"] == "login_token" && e["id"] == login.as_str()
            });
            assert_event(&w.audit(), "login_ttl_above_session_ttl", "warn", |e| {
                e["ttl"].as_u64().unwrap() > 45 && e["session_ttl"].as_u64().unwrap() <= 45
            });
            assert!(
                stderr(&out).contains("longer than --ttl"),
                "{}",
                stderr(&out)
            );
            let log = std::fs::read_to_string(w.audit()).unwrap();
            assert!(!log.contains(&sid_val));
        }
    }
}

/// The child token works inside the command (it looks itself up), is
/// capped by --ttl and --child-num-uses, and is gone after the end. Orphan
/// too.
#[test]
fn child_token_works_and_is_revoked() {
    let b = bao_or_skip!();
    for who in identities() {
        for orphan in [false, true] {
            let w = Work::new();
            let mut c = creds(b, &w, who);
            // An orphan needs sudo on create-orphan: root's token here.
            let tok = if orphan {
                b.root.clone()
            } else {
                b.app_token("10m")
            };
            c.env("VAULT_TOKEN", &tok).args([
                "--ttl",
                "40s",
                "--child-token",
                "VAULT_TOKEN",
                "--policy",
                "child",
                "--child-ttl",
                "2h",
                "--child-num-uses",
                "5",
            ]);
            if orphan {
                c.arg("--child-orphan");
            }
            let out = c
                .args(["--", "sh", "-c", "curl -sf -H \"X-Vault-Token: $VAULT_TOKEN\" $VAULT_ADDR/v1/auth/token/lookup-self"])
                .output()
                .unwrap();
            assert_eq!(code(&out), 0, "{who:?} orphan={orphan}: {}", stderr(&out));
            let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
            let acc = v["data"]["accessor"].as_str().unwrap().to_string();
            let ttl = v["data"]["ttl"].as_u64().unwrap();
            assert!(ttl <= 40, "child ttl {ttl} above --ttl");
            assert_eq!(v["data"]["orphan"], orphan);
            // 5 uses given, the lookup itself used one.
            assert_eq!(v["data"]["num_uses"], 4, "{v}");
            assert!(
                v["data"]["policies"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|p| p == "child")
            );
            assert_eq!(b.accessor_ttl(&acc), None, "child token still alive");
            assert_event(&w.audit(), "revoked", "info", |e| {
                e["kind"] == "child_token" && e["id"] == acc.as_str()
            });
            assert!(!stderr(&out).contains(&tok));
        }
    }
}

/// A PKI lease: the certificate reaches the command, the lease is revoked
/// at the end (looked up: gone), events name the lease id.
#[test]
fn lease_is_revoked_at_the_end() {
    let b = bao_or_skip!();
    for who in identities() {
        let w = Work::new();
        let out = creds(b, &w, who)
            .env("VAULT_TOKEN", b.app_token("10m"))
            .args([
                "--ttl",
                "5m",
                "--lease",
                "CERT=pki/issue/web?common_name=a.sbx.test#certificate",
                "--lease",
                "KEY=pki/issue/web?common_name=b.sbx.test&ttl=2h#private_key",
                "--",
                "sh",
                "-c",
                "case \"$CERT\" in '-----BEGIN CERTIFICATE'*) echo cert-ok;; esac; case \"$KEY\" in '-----BEGIN'*) echo key-ok;; esac",
            ])
            .output()
            .unwrap();
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert!(
            stdout(&out).contains("cert-ok") && stdout(&out).contains("key-ok"),
            "{}",
            stdout(&out)
        );
        for env in ["CERT", "KEY"] {
            let ev = assert_event(&w.audit(), "secret_injected", "info", |e| {
                e["env"] == env && e["source"] == "lease"
            });
            let id = ev["lease_id"].as_str().unwrap().to_string();
            // ttl=2h asked: capped to the 5m session.
            assert!(ev["ttl"].as_u64().unwrap() <= 300, "{ev}");
            assert!(!b.lease_exists(&id), "lease {id} still exists");
            assert_event(&w.audit(), "revoked", "info", |e| {
                e["kind"] == "lease" && e["id"] == id.as_str()
            });
        }
    }
}

/// Leases and the session token are renewed while the command runs (the
/// role's tokens live 4s; the session 1m).
#[test]
fn renewal_during_the_session() {
    let b = bao_or_skip!();
    let w = Work::new();
    let who = As::Root;
    let rid = w.cred("role-id", &b.role_id("short"), who);
    let sid = w.cred("secret-id", &b.secret_id("short"), who);
    let out = creds(b, &w, who)
        .args(["--auth", "approle", "--ttl", "1m", "--role-id-file"])
        .arg(&rid)
        .arg("--secret-id-file")
        .arg(&sid)
        .args(["--secret", "DB=secret/app#db", "--", "sleep", "6"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let acc = login_accessor(&w);
    assert_event(&w.audit(), "renewed", "info", |e| {
        e["kind"] == "session_token" && e["id"] == acc.as_str()
    });
    assert_eq!(b.accessor_ttl(&acc), None);
    // The role's 4s is below --ttl: no warning.
    assert!(events(&w.audit(), "login_ttl_above_session_ttl").is_empty());
}

/// A role whose policies lack `auth/token/create-orphan`: the login token
/// cannot be replaced; it is kept (a `login_token_kept` warning), renewed
/// down to --ttl, and revoked at the end.
#[test]
fn approle_without_create_orphan_keeps_the_login_token() {
    let b = bao_or_skip!();
    let w = Work::new();
    let who = As::Root;
    let rid = w.cred("role-id", &b.role_id("basic"), who);
    let sid = w.cred("secret-id", &b.secret_id("basic"), who);
    let out = creds(b, &w, who)
        .args(["--auth", "approle", "--ttl", "30s", "--role-id-file"])
        .arg(&rid)
        .arg("--secret-id-file")
        .arg(&sid)
        .args(["--secret", "DB=secret/app#db", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let login = first_login_accessor(&w);
    assert_event(&w.audit(), "login_token_kept", "warn", |e| {
        e["accessor"] == login.as_str() && e["error"].as_str().unwrap().contains("403")
    });
    assert!(events(&w.audit(), "session_token").is_empty());
    let cap = assert_event(&w.audit(), "ttl_capped", "info", |e| {
        e["kind"] == "session_token" && e["accessor"] == login.as_str()
    });
    assert!(cap["ttl"].as_u64().unwrap() <= 30, "{cap}");
    assert_eq!(b.accessor_ttl(&login), None, "login token alive");
}

/// The command outlives --ttl: stopped (SIGTERM → 143), credentials revoked.
/// With --no-enforce-ttl it runs on but its child token dies at the TTL.
#[test]
fn ttl_is_enforced() {
    let b = bao_or_skip!();
    for who in identities() {
        let w = Work::new();
        let out = creds(b, &w, who)
            .env("VAULT_TOKEN", b.app_token("10m"))
            .args(["--ttl", "2s", "--child-token", "CT", "--", "sleep", "60"])
            .output()
            .unwrap();
        assert_eq!(code(&out), 143, "{}", stderr(&out));
        assert_event(&w.audit(), "ttl_expired", "warn", |_| true);
        let acc = events(&w.audit(), "secret_injected")[0]["accessor"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(b.accessor_ttl(&acc), None);

        let w = Work::new();
        let out = creds(b, &w, who)
            .env("VAULT_TOKEN", b.app_token("10m"))
            .args(["--ttl", "2s", "--no-enforce-ttl", "--child-token", "VAULT_TOKEN", "--", "sh", "-c"])
            .arg("sleep 4; if curl -sf -H \"X-Vault-Token: $VAULT_TOKEN\" $VAULT_ADDR/v1/auth/token/lookup-self >/dev/null; then echo alive; else echo dead; fi")
            .output()
            .unwrap();
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(stdout(&out).contains("dead"), "{}", stdout(&out));
        assert_event(&w.audit(), "ttl_reached", "info", |_| true);
    }
}

/// SIGTERM and SIGINT to sbx-creds during the command: forwarded, and every
/// lease and token is still revoked before it exits.
#[test]
fn signals_still_revoke() {
    let b = bao_or_skip!();
    for who in identities() {
        for (sig, want) in [(libc::SIGTERM, 143), (libc::SIGINT, 130)] {
            let w = Work::new();
            let child = creds(b, &w, who)
                .env("VAULT_TOKEN", b.app_token("10m"))
                .args([
                    "--child-token",
                    "CT",
                    "--lease",
                    "CERT=pki/issue/web?common_name=s.sbx.test#certificate",
                    "--",
                    "sleep",
                    "60",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            assert!(
                wait_until(Duration::from_secs(20), || events(
                    &w.audit(),
                    "secret_injected"
                )
                .len()
                    == 2),
                "secrets never injected"
            );
            // SAFETY: kill(2) takes no pointers; `child` is not reaped yet,
            // so its pid is still ours.
            unsafe { libc::kill(child.id() as i32, sig) };
            let out = child.wait_with_output().unwrap();
            assert_eq!(code(&out), want, "{}", stderr(&out));
            for e in events(&w.audit(), "secret_injected") {
                match e["source"].as_str().unwrap() {
                    "lease" => assert!(!b.lease_exists(e["lease_id"].as_str().unwrap())),
                    _ => assert_eq!(b.accessor_ttl(e["accessor"].as_str().unwrap()), None),
                }
            }
            assert_eq!(events(&w.audit(), "revoked").len(), 2);
        }
    }
}

/// SIGKILL of sbx-creds and of its guardian (tests/sigkill.rs covers the
/// guardian revoking): nothing revokes, the tokens expire at the TTL by
/// themselves (the role would allow an hour).
#[test]
fn sigkill_leaves_tokens_that_expire_at_the_ttl() {
    let b = bao_or_skip!();
    let w = Work::new();
    let who = As::Root;
    let rid = w.cred("role-id", &b.role_id("sbx"), who);
    let sid = w.cred("secret-id", &b.secret_id("sbx"), who);
    // Its own registry: the record this run leaves is the test's.
    let reg = w.path("registry");
    std::fs::create_dir(&reg).unwrap();
    std::fs::set_permissions(&reg, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let mut child = creds(b, &w, who)
        .env("SBX_REGISTRY_DIR", &reg)
        .args([
            "--auth",
            "approle",
            "--ttl",
            "6s",
            "--no-enforce-ttl",
            "--role-id-file",
        ])
        .arg(&rid)
        .arg("--secret-id-file")
        .arg(&sid)
        .args(["--child-token", "CT", "--", "sleep", "60"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_until(Duration::from_secs(20), || !events(
        &w.audit(),
        "secret_injected"
    )
    .is_empty()));
    // The guardian: a child of sbx-creds that did not exec (same comm).
    let pid = child.id();
    let kids = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
    let mut guardians = 0;
    for k in kids.split_whitespace() {
        let comm = std::fs::read_to_string(format!("/proc/{k}/comm")).unwrap_or_default();
        if comm.trim() == "sbx-creds" {
            // SAFETY: kill(2) takes no pointers; `k` is a child of our
            // unreaped `child`, read from its /proc children list.
            unsafe { libc::kill(k.parse().unwrap(), libc::SIGKILL) };
            guardians += 1;
        }
    }
    assert_eq!(guardians, 1, "no guardian among {kids}");
    // SAFETY: kill(2) takes no pointers; `child` is not reaped yet.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    let session = login_accessor(&w);
    let ct = events(&w.audit(), "secret_injected")[0]["accessor"]
        .as_str()
        .unwrap()
        .to_string();
    // Alive right after the kill (nothing revoked them), bounded by the TTL.
    for acc in [&session, &ct] {
        if let Some(ttl) = b.accessor_ttl(acc) {
            assert!(ttl <= 6, "ttl {ttl} beyond --ttl");
        }
    }
    // Nothing revoked them (the replaced login token excepted, and it is
    // gone).
    assert!(
        events(&w.audit(), "revoked")
            .iter()
            .all(|e| e["kind"] == "login_token")
    );
    assert_eq!(b.accessor_ttl(&first_login_accessor(&w)), None);
    assert!(
        wait_until(Duration::from_secs(20), || b
            .accessor_ttl(&session)
            .is_none()
            && b.accessor_ttl(&ct).is_none()),
        "tokens outlived the TTL"
    );
}

/// A failure after some credentials were created (a lease and a child token
/// created, then a key missing): 125, one line, no command, everything
/// revoked.
#[test]
fn failure_after_creation_revokes() {
    let b = bao_or_skip!();
    let w = Work::new();
    let before = b.lease_count("pki/issue/web/");
    let marker = w.path("started");
    let out = creds(b, &w, As::Root)
        .env("VAULT_TOKEN", b.app_token("10m"))
        .args([
            "--child-token",
            "CT",
            "--lease",
            "CERT=pki/issue/web?common_name=f.sbx.test#nosuchfield",
            "--",
            "touch",
        ])
        .arg(&marker)
        .output()
        .unwrap();
    assert_usage_error(&out, "nosuchfield");
    assert!(!marker.exists(), "the command ran");
    assert_eq!(b.lease_count("pki/issue/web/"), before, "a lease was left");
    let revoked = events(&w.audit(), "revoked");
    assert_eq!(revoked.len(), 2, "{revoked:?}");
    for r in revoked {
        if r["kind"] == "child_token" {
            assert_eq!(b.accessor_ttl(r["id"].as_str().unwrap()), None);
        }
    }
    let _ = json!({});
}

/// Chained in front of sbx-fs: the secret reaches the command inside the
/// sandbox, the token file does not exist there, both tools log to the one
/// audit log, and the credentials are revoked at the end.
#[test]
fn chained_in_front_of_sbx_fs() {
    let b = bao_or_skip!();
    let fs = match std::env::var_os("SBX_TEST_BIN_DIR") {
        Some(d) => std::path::Path::new(&d).join("sbx-fs"),
        None => bin("sbx-creds").with_file_name("sbx-fs"),
    };
    if !fs.exists() {
        skip!("sbx-fs not built ({})", fs.display());
    }
    for who in identities() {
        let w = Work::new();
        let tf = w.cred("token", &b.app_token("10m"), who);
        let script = format!(
            "echo DB=$DB; test -n \"$CT\" && echo ct-set; if cat {} 2>/dev/null; then echo token-file-visible; fi; echo VT=${{VAULT_TOKEN:-unset}}",
            tf.display()
        );
        let out = creds(b, &w, who)
            .arg("--token-file")
            .arg(&tf)
            .args(["--secret", "DB=secret/app#db", "--child-token", "CT", "--"])
            .arg(&fs)
            .args(["--", "sh", "-c", &script])
            .output()
            .unwrap();
        let so = stdout(&out);
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert!(so.contains(&format!("DB={DB_PASS}")), "{so}");
        assert!(so.contains("ct-set") && so.contains("VT=unset"), "{so}");
        assert!(!so.contains("token-file-visible"), "{so}");
        let evs = audit_events(&w.audit());
        assert!(
            evs.iter().any(|e| e["tool"] == "sbx-fs"),
            "sbx-fs logged nothing to the handed-down audit fd"
        );
        let r = assert_event(&w.audit(), "revoked", "info", |e| {
            e["kind"] == "child_token"
        });
        assert_eq!(b.accessor_ttl(r["id"].as_str().unwrap()), None);
    }
}

/// https with --ca-cert (rustls): trusted with the server's CA, refused
/// (one line, 125) without it.
#[test]
fn tls_with_ca_cert() {
    let _ = bao_or_skip!();
    let dir = shared_tempdir();
    let b = match common::start_tls(dir.path()) {
        Ok(b) => b,
        Err(e) => skip!("{e}"),
    };
    let ca = dir.path().join("vault-ca.pem");
    let marker = dir.path().join("started");
    for who in identities() {
        let w = Work::new();
        let tf = w.cred("token", &b.root, who);
        let out = creds(&b, &w, who)
            .arg("--token-file")
            .arg(&tf)
            .arg("--ca-cert")
            .arg(&ca)
            .args([
                "--child-token",
                "CT",
                "--",
                "sh",
                "-c",
                "test -n \"$CT\" && echo ct-ok",
            ])
            .output()
            .unwrap();
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert!(stdout(&out).contains("ct-ok"));
        let out = creds(&b, &w, who)
            .arg("--token-file")
            .arg(&tf)
            .args(["--child-token", "CT", "--", "touch"])
            .arg(&marker)
            .output()
            .unwrap();
        assert_usage_error(&out, "certificate");
        assert!(!marker.exists());
    }
}

/// --ca-cert is read once (the guardian, forked with the checked
/// certificates, never reads it again) and what it holds is all the TLS
/// client trusts: a bundle with the server's CA among others works, a CA
/// that did not sign the server's certificate is refused.
#[test]
fn ca_cert_read_once_and_only_its_cas_trusted() {
    let _ = bao_or_skip!();
    let dir = shared_tempdir();
    let b = match common::start_tls(dir.path()) {
        Ok(b) => b,
        Err(e) => skip!("{e}"),
    };
    let server_ca = std::fs::read_to_string(dir.path().join("vault-ca.pem")).unwrap();
    let w = Work::new();
    let tf = w.cred("token", &b.root, As::Root);
    let bundle = w.path("bundle.pem");
    std::fs::write(&bundle, format!("{OTHER_CA}{server_ca}")).unwrap();
    let other = w.path("other.pem");
    std::fs::write(&other, OTHER_CA).unwrap();
    let run = |ca: &Path, strace_log: Option<&Path>| {
        let mut c = match strace_log {
            Some(log) => {
                let mut c = Command::new("strace");
                c.args(["-f", "-qq", "-e", "trace=open,openat,openat2", "-o"])
                    .arg(log)
                    .arg(bin("sbx-creds"));
                c
            }
            None => tool("sbx-creds"),
        };
        c.env("VAULT_ADDR", &b.addr)
            .env_remove("VAULT_TOKEN")
            .env_remove("BAO_TOKEN")
            .env_remove("VAULT_CACERT")
            .arg("--token-file")
            .arg(&tf)
            .arg("--ca-cert")
            .arg(ca)
            .args([
                "--child-token",
                "CT",
                "--",
                "sh",
                "-c",
                "test -n \"$CT\" && echo ct-ok",
            ]);
        output_within(&mut c, Duration::from_secs(60))
    };
    let out = run(&bundle, None);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains("ct-ok"));
    // The system roots are not added to it either; a CA that did not sign
    // the server's certificate is no trust at all.
    let out = run(&other, None);
    assert_usage_error(&out, "certificate");
    if have("strace") {
        let log = w.path("strace.log");
        let out = run(&bundle, Some(&log));
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let trace = std::fs::read_to_string(&log).unwrap();
        let needle = format!("\"{}\"", bundle.display());
        let opens: Vec<&str> = trace.lines().filter(|l| l.contains(&needle)).collect();
        assert_eq!(
            opens.len(),
            1,
            "--ca-cert opened more than once: {opens:#?}"
        );
    } else if must_work() {
        panic!("strace not installed: the read-once check cannot run");
    }
}

/// A revocation the server refuses is an alert (and a line on stderr); the
/// command's status is kept. The lease is left to its (capped) TTL.
#[test]
fn failed_revocation_is_an_alert() {
    let b = bao_or_skip!();
    b.call(
        "PUT",
        "sys/policies/acl/norevoke",
        Some(json!({"policy": r#"path "pki/issue/web" { capabilities = ["update"] }"#})),
    );
    let token = b.call(
        "POST",
        "auth/token/create",
        Some(json!({"policies": ["norevoke"], "ttl": "10m"})),
    )["auth"]["client_token"]
        .as_str()
        .unwrap()
        .to_string();
    let w = Work::new();
    let out = creds(b, &w, As::Root)
        .env("VAULT_TOKEN", &token)
        .args([
            "--ttl",
            "1m",
            "--lease",
            "CERT=pki/issue/web?common_name=r.sbx.test#certificate",
            "--",
            "sh",
            "-c",
            "exit 3",
        ])
        .output()
        .unwrap();
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("revocation failed"),
        "{}",
        stderr(&out)
    );
    let ev = assert_event(&w.audit(), "revocation_failed", "alert", |e| {
        e["kind"] == "lease"
    });
    let id = ev["lease_id"]
        .as_str()
        .or(ev["id"].as_str())
        .unwrap()
        .to_string();
    assert!(b.lease_exists(&id));
    let inj = assert_event(&w.audit(), "secret_injected", "info", |e| {
        e["env"] == "CERT"
    });
    assert!(inj["ttl"].as_u64().unwrap() <= 60, "{inj}");
    b.call("PUT", "sys/leases/revoke", Some(json!({"lease_id": id})));
}

/// Settings from --config (the sbx-creds section, keys = long flag names).
#[test]
fn config_file() {
    let b = bao_or_skip!();
    let w = Work::new();
    let cfg = w.path("sbx.json");
    std::fs::write(
        &cfg,
        json!({"sbx-creds": {"secret": ["DB=secret/app#db"], "secret-all": ["APP=secret/app"], "ttl": "1m"}}).to_string(),
    )
    .unwrap();
    let out = creds(b, &w, As::Root)
        .env("VAULT_TOKEN", b.app_token("10m"))
        .arg("--config")
        .arg(&cfg)
        .args(["--", "sh", "-c", "echo \"$DB $APP_API\""])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), format!("{DB_PASS} {API_KEY}"));
    std::fs::write(&cfg, json!({"sbx-creds": {"file": "/tmp/x"}}).to_string()).unwrap();
    let out = creds(b, &w, As::Root)
        .env("VAULT_TOKEN", b.app_token("10m"))
        .arg("--config")
        .arg(&cfg)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_usage_error(&out, "unknown key");
}

/// A proxy to the server that holds every new connection for `delay`
/// before forwarding it, and reports each one.
fn slow_proxy(port: u16, delay: Duration) -> (String, std::sync::mpsc::Receiver<()>) {
    use std::net::{TcpListener, TcpStream};
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("http://{}", l.local_addr().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for c in l.incoming().take(64) {
            let Ok(c) = c else { continue };
            let tx = tx.clone();
            std::thread::spawn(move || {
                let _ = tx.send(());
                std::thread::sleep(delay);
                let Ok(up) = TcpStream::connect(("127.0.0.1", port)) else {
                    return;
                };
                let (mut a, mut b) = (c.try_clone().unwrap(), up.try_clone().unwrap());
                let t = std::thread::spawn(move || {
                    let _ = std::io::copy(&mut a, &mut b);
                    let _ = b.shutdown(std::net::Shutdown::Write);
                });
                let (mut c2, mut up2) = (c, up);
                let _ = std::io::copy(&mut up2, &mut c2);
                let _ = c2.shutdown(std::net::Shutdown::Write);
                let _ = t.join();
            });
        }
    });
    (addr, rx)
}

/// SIGTERM while the secrets are being fetched: the command never starts,
/// what was created is revoked, the status is 143.
#[test]
fn sigterm_before_the_command_starts() {
    let b = bao_or_skip!();
    let (addr, conns) = slow_proxy(b.port, Duration::from_millis(700));
    let w = Work::new();
    let marker = w.path("started");
    let child = creds(b, &w, As::Root)
        .env("VAULT_ADDR", &addr)
        .env("VAULT_TOKEN", b.app_token("10m"))
        .args([
            "--child-token",
            "CT",
            "--secret",
            "DB=secret/app#db",
            "--",
            "touch",
        ])
        .arg(&marker)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The first connection (health check) reached the proxy: sbx-creds is
    // past its start-up, with its signals blocked.
    conns
        .recv_timeout(Duration::from_secs(20))
        .expect("no request");
    // SAFETY: kill(2) takes no pointers; `child` is not reaped yet.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(code(&out), 143, "{}", stderr(&out));
    assert!(!marker.exists(), "the command started");
    assert_event(&w.audit(), "cancelled", "warn", |e| {
        e["signal"] == libc::SIGTERM
    });
    let r = assert_event(&w.audit(), "revoked", "info", |e| {
        e["kind"] == "child_token"
    });
    assert_eq!(b.accessor_ttl(r["id"].as_str().unwrap()), None);
}

/// --namespace: every request goes to the namespace (OpenBao namespaces).
#[test]
fn namespace() {
    let b = bao_or_skip!();
    let ns = unique("ns");
    b.call("POST", &format!("sys/namespaces/{ns}"), Some(json!({})));
    let nsh = [("X-Vault-Namespace", ns.as_str())];
    let put = |path: &str, body: serde_json::Value| {
        let (code, v) = b
            .try_call_h("POST", path, Some(&b.root), Some(&body), &nsh)
            .unwrap();
        assert!((200..300).contains(&code), "{path}: {code} {v}");
    };
    put(
        "sys/mounts/secret",
        json!({"type": "kv", "options": {"version": "2"}}),
    );
    put(
        "secret/data/app",
        json!({"data": {"db": "in-the-namespace"}}),
    );
    let w = Work::new();
    let out = creds(b, &w, As::Root)
        .env("VAULT_TOKEN", &b.root)
        .args([
            "--namespace",
            &ns,
            "--secret",
            "DB=secret/app#db",
            "--child-token",
            "CT",
            "--",
            "sh",
            "-c",
            "echo $DB",
        ])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "in-the-namespace");
    let r = assert_event(&w.audit(), "revoked", "info", |e| {
        e["kind"] == "child_token"
    });
    // The child token lived in the namespace and is gone.
    let (code, _) = b
        .try_call_h(
            "POST",
            "auth/token/lookup-accessor",
            Some(&b.root),
            Some(&json!({"accessor": r["id"]})),
            &nsh,
        )
        .unwrap();
    assert_ne!(code, 200);
}

/// A login token the server will not shorten (an AppRole issuing batch
/// tokens: neither renewable nor revocable) is reported as ttl_not_capped,
/// and its impossible revocation as an alert.
#[test]
fn uncappable_login_token_is_reported() {
    let b = bao_or_skip!();
    b.call(
        "POST",
        "auth/approle/role/batch",
        Some(json!({"token_ttl": "1h", "token_type": "batch", "token_policies": ["app"]})),
    );
    let w = Work::new();
    let rid = w.cred("role-id", &b.role_id("batch"), As::Root);
    let sid = w.cred("secret-id", &b.secret_id("batch"), As::Root);
    let out = creds(b, &w, As::Root)
        .args(["--auth", "approle", "--ttl", "1m", "--role-id-file"])
        .arg(&rid)
        .arg("--secret-id-file")
        .arg(&sid)
        .args(["--secret", "DB=secret/app#db", "--", "sh", "-c", "echo $DB"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), DB_PASS);
    let ev = assert_event(&w.audit(), "ttl_not_capped", "warn", |e| {
        e["kind"] == "session_token"
    });
    assert!(ev["ttl"].as_u64().unwrap() > 60, "{ev}");
    assert!(ev["note"].as_str().unwrap().contains("batch"), "{ev}");
    // Nothing can revoke a batch token: that is an alert, not silence.
    assert_event(&w.audit(), "revocation_failed", "alert", |e| {
        e["kind"] == "session_token"
    });
    assert!(stderr(&out).contains("revocation failed"));
}

/// A service-account token shaped as Kubernetes issues them (RS256; `iss`,
/// `sub` system:serviceaccount:NS:NAME, `aud`, `kubernetes.io`), signed
/// with `key` (openssl). Returns the JWT.
fn service_account_jwt(w: &Work, key: &std::path::Path, sub: &str) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let header = r#"{"alg":"RS256","typ":"JWT","kid":"sbx-test"}"#;
    let (ns, name) = sub
        .strip_prefix("system:serviceaccount:")
        .and_then(|r| r.split_once(':'))
        .unwrap();
    let payload = json!({
        "iss": "https://kubernetes.default.svc.cluster.local",
        "sub": sub,
        "aud": ["vault"],
        "iat": now, "nbf": now, "exp": now + 600,
        "kubernetes.io": {"namespace": ns, "serviceaccount": {"name": name, "uid": "0b1c2d3e"}},
    })
    .to_string();
    let script = r#"b64() { basenc --base64url -w0 | tr -d '='; }
h=$(printf '%s' "$H" | b64); p=$(printf '%s' "$P" | b64)
s=$(printf '%s.%s' "$h" "$p" | openssl dgst -sha256 -sign "$K" -binary | b64)
printf '%s.%s.%s' "$h" "$p" "$s""#;
    let out = std::process::Command::new("sh")
        .args(["-c", script])
        .env("H", header)
        .env("P", payload)
        .env("K", key)
        .current_dir(w.dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "sign: {}", stderr(&out));
    stdout(&out)
}

/// --auth kubernetes: the pod's service-account token and a role posted to
/// auth/MOUNT/login. Here the mount is OpenBao's JWT method configured
/// with the test's signing key (the same login request as the Kubernetes
/// method, whose server side would ask a cluster's TokenReview API): the
/// session token is capped to --ttl and revoked at the end, the JWT reaches
/// neither the command nor the audit log; a token of another service
/// account is refused (125, one line naming the login). As root and as the
/// unprivileged user.
#[test]
fn kubernetes_login_with_the_service_account_token() {
    let b = bao_or_skip!();
    let w = Work::new();
    let key = w.path("sa-key.pem");
    let pubkey = w.path("sa-pub.pem");
    for args in [
        vec![
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
        ],
        vec!["pkey", "-pubout", "-in"],
    ] {
        let mut c = std::process::Command::new("openssl");
        c.args(&args);
        if args[0] == "genpkey" {
            c.arg(&key);
        } else {
            c.arg(&key).arg("-out").arg(&pubkey);
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "openssl {args:?}: {}", stderr(&o));
    }
    let mount = format!("k8s-{}", sbx_testutil::openbao::random_hex(6));
    b.call(
        "POST",
        &format!("sys/auth/{mount}"),
        Some(json!({"type": "jwt"})),
    );
    b.call(
        "POST",
        &format!("auth/{mount}/config"),
        Some(json!({
            "jwt_validation_pubkeys": [std::fs::read_to_string(&pubkey).unwrap()],
            "bound_issuer": "https://kubernetes.default.svc.cluster.local",
        })),
    );
    b.call(
        "POST",
        &format!("auth/{mount}/role/sbx-agent"),
        Some(json!({
            "role_type": "jwt",
            "user_claim": "sub",
            "bound_audiences": ["vault"],
            "bound_subject": "system:serviceaccount:agents:sbx-agent",
            "token_policies": ["app"],
            "token_ttl": "1h",
            "token_max_ttl": "2h",
        })),
    );
    let good = service_account_jwt(&w, &key, "system:serviceaccount:agents:sbx-agent");
    let other = service_account_jwt(&w, &key, "system:serviceaccount:agents:intruder");
    for who in identities() {
        let w = Work::new();
        let tok = w.cred("token", &good, who);
        let out = creds(b, &w, who)
            .args(["--auth", "kubernetes", "--kubernetes-role", "sbx-agent"])
            .args(["--kubernetes-mount", &mount, "--kubernetes-token-file"])
            .arg(&tok)
            .args(["--ttl", "45s", "--secret", "DB=secret/app#db", "--"])
            .args(["sh", "-c", "echo DB=$DB; env"])
            .output()
            .unwrap();
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        let so = stdout(&out);
        assert!(so.contains(&format!("DB={DB_PASS}\n")), "{so}");
        assert!(!so.contains(&good), "the JWT reached the command");
        assert_event(&w.audit(), "login", "info", |e| e["method"] == "kubernetes");
        let cap = assert_event(&w.audit(), "ttl_capped", "info", |e| {
            e["kind"] == "session_token"
        });
        assert!(cap["ttl"].as_u64().unwrap() <= 45, "{cap}");
        let acc = login_accessor(&w);
        assert_eq!(
            b.accessor_ttl(&acc),
            None,
            "session token alive after the end"
        );
        assert_event(&w.audit(), "revoked", "info", |e| {
            e["kind"] == "session_token" && e["id"] == acc.as_str()
        });
        let log = std::fs::read_to_string(w.audit()).unwrap();
        assert!(!log.contains(&good), "the JWT is in the audit log");

        // Another service account's token: refused by the server.
        let bad = w.cred("other", &other, who);
        let out = creds(b, &w, who)
            .args(["--auth", "kubernetes", "--kubernetes-role", "sbx-agent"])
            .args(["--kubernetes-mount", &mount, "--kubernetes-token-file"])
            .arg(&bad)
            .args(["--secret", "DB=secret/app#db", "--", "sh", "-c", "echo RAN"])
            .output()
            .unwrap();
        assert_eq!(code(&out), 125, "{who:?}: {}", stderr(&out));
        assert!(!stdout(&out).contains("RAN"));
        let se = stderr(&out);
        assert_eq!(se.trim_end().lines().count(), 1, "{se}");
        assert!(
            se.contains(&format!(
                "kubernetes login (auth/{mount}/login, role sbx-agent)"
            )),
            "{se}"
        );
    }
}
