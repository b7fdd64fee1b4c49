//! Bad input: one clear line, exit 125, the command never started, nothing
//! left alive on the server.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// Runs sbx-creds (root) with `args` before `-- touch MARKER`; asserts 125,
/// one line containing `needle`, and that the command did not run.
fn refused(b_addr: &str, token: Option<&str>, args: &[&str], needle: &str) -> std::process::Output {
    let w = Work::new();
    let marker: PathBuf = w.path("started");
    let mut c = tool("sbx-creds");
    c.env("VAULT_ADDR", b_addr)
        .env_remove("VAULT_TOKEN")
        .env_remove("BAO_TOKEN");
    if let Some(t) = token {
        c.env("VAULT_TOKEN", t);
    }
    let out = c
        .args(args)
        .arg("--")
        .arg("touch")
        .arg(&marker)
        .output()
        .unwrap();
    assert_usage_error(&out, needle);
    assert!(!marker.exists(), "the command ran for {args:?}");
    out
}

#[test]
fn malformed_specs_and_flags() {
    // No server needed: checked before any request.
    let addr = "http://127.0.0.1:9";
    let t = Some("whatever");
    for (args, needle) in [
        (&["--secret", "DB"][..], "expected ENV=MOUNT/PATH#KEY"),
        (
            &["--secret", "DB=secret/app"],
            "expected ENV=MOUNT/PATH#KEY",
        ),
        (
            &["--secret", "DB=secret/app#"],
            "expected ENV=MOUNT/PATH#KEY",
        ),
        (&["--secret", "DB=app#k"], "must be MOUNT/PATH"),
        (&["--secret", "DB=secret/../x#k"], "'..'"),
        (
            &["--secret", "1DB=secret/app#db"],
            "not a valid environment variable name",
        ),
        (
            &["--secret", "DB-X=secret/app#db"],
            "not a valid environment variable name",
        ),
        (
            &["--secret-all", "A B=secret/app"],
            "not a valid environment variable name",
        ),
        (&["--lease", "C=pki/issue/web?cn#certificate"], "ENV=PATH"),
        (
            &["--child-token", "9X"],
            "not a valid environment variable name",
        ),
        (
            &[
                "--secret",
                "A=secret/app#db",
                "--secret",
                "A=secret/app#api",
            ],
            "more than one secret",
        ),
        (&["--secret", "A=secret/app#db", "--ttl", "soon"], "--ttl"),
        (&["--secret", "A=secret/app#db", "--ttl", "0s"], "--ttl"),
        (
            &["--secret", "A=secret/app#db", "--timeout", "x"],
            "--timeout",
        ),
        (
            &["--secret", "A=secret/app#db", "--vault-addr", "ftp://x"],
            "--vault-addr",
        ),
        (
            &["--secret", "A=secret/app#db", "--vault-addr", "not a url"],
            "--vault-addr",
        ),
        (&[][..], "nothing to fetch"),
        (
            &["--auth", "approle", "--secret", "A=secret/app#db"],
            "--role-id-file",
        ),
        (
            &["--auth", "kubernetes", "--secret", "A=secret/app#db"],
            "--kubernetes-role",
        ),
        (
            &["--kubernetes-role", "r", "--secret", "A=secret/app#db"],
            "--kubernetes-role needs --auth kubernetes",
        ),
        (
            &[
                "--auth",
                "kubernetes",
                "--kubernetes-role",
                "r",
                "--kubernetes-token-file",
                "/nonexistent/sa-token",
                "--secret",
                "A=secret/app#db",
            ],
            "/nonexistent/sa-token",
        ),
        (
            &[
                "--secret",
                "A=secret/app#db",
                "--token-file",
                "/nonexistent/tok",
            ],
            "/nonexistent/tok",
        ),
    ] {
        refused(addr, t, args, needle);
    }
    // No token at all.
    refused(addr, None, &["--secret", "A=secret/app#db"], "VAULT_TOKEN");
}

#[test]
fn unreachable_server_fails_within_the_timeout() {
    // A closed port: refused at once.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    refused(
        &format!("http://127.0.0.1:{port}"),
        Some("t"),
        &["--secret", "A=secret/app#db"],
        "cannot reach",
    );
    // A server that accepts and never answers: bounded by --timeout.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("http://{}", l.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in l.incoming().take(8) {
            held.push(s);
        }
    });
    let t0 = Instant::now();
    refused(
        &addr,
        Some("t"),
        &["--timeout", "1s", "--secret", "A=secret/app#db"],
        "timed out",
    );
    assert!(t0.elapsed() < Duration::from_secs(30));
}

/// A tiny HTTP server whose answers are not what the API promises.
fn fake_server(answer: impl Fn(&str) -> (u16, String) + Send + 'static) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("http://{}", l.local_addr().unwrap());
    std::thread::spawn(move || {
        for s in l.incoming().take(32) {
            let Ok(mut s) = s else { continue };
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let head = String::from_utf8_lossy(&buf).to_string();
            let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
            let (code, body) = answer(&path);
            let _ = write!(
                s,
                "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr
}

#[test]
fn answers_not_as_the_api_promises() {
    let health = r#"{"initialized":true,"sealed":false,"standby":false,"version":"fake"}"#;
    // Health that is not JSON.
    let addr = fake_server(|_| (200, "<html>proxy login</html>".into()));
    refused(
        &addr,
        Some("t"),
        &["--secret", "A=secret/app#db"],
        "not what the API promises",
    );
    // A token lookup whose data is not an object.
    let addr = fake_server(move |p| {
        if p.starts_with("/v1/sys/health") {
            (200, health.into())
        } else {
            (200, r#"{"data":"surprise"}"#.into())
        }
    });
    refused(
        &addr,
        Some("t"),
        &["--secret", "A=secret/app#db"],
        "not what the API promises",
    );
    // A sealed server.
    let addr = fake_server(|_| (503, r#"{"initialized":true,"sealed":true}"#.into()));
    refused(&addr, Some("t"), &["--secret", "A=secret/app#db"], "sealed");
}

#[test]
fn server_refusals() {
    let b = bao_or_skip!();
    let t = b.app_token("10m");
    refused(
        &b.addr,
        Some("not-a-token"),
        &["--secret", "A=secret/app#db"],
        "403",
    );
    refused(
        &b.addr,
        Some(&t),
        &["--secret", "A=secret/nope#db"],
        "not found",
    );
    refused(
        &b.addr,
        Some(&t),
        &["--secret", "A=secret/app#nokey"],
        "key 'nokey' is not in secret secret/app",
    );
    refused(
        &b.addr,
        Some(&t),
        &["--secret", "A=kv1/nope#pw"],
        "not found",
    );
    // A path the policy does not grant.
    refused(
        &b.addr,
        Some(&t),
        &["--secret", "A=locked/app#k"],
        "permission denied",
    );
    let w = Work::new();
    let rid = w.cred("rid", &b.role_id("sbx"), As::Root);
    let sid = w.cred("sid", "00000000-0000-0000-0000-000000000000", As::Root);
    refused(
        &b.addr,
        None,
        &[
            "--auth",
            "approle",
            "--role-id-file",
            rid.to_str().unwrap(),
            "--secret-id-file",
            sid.to_str().unwrap(),
            "--secret",
            "A=secret/app#db",
        ],
        "approle login",
    );
    // A used wrapping token (unwrapped once already) is refused.
    let wrapped = b.wrapped_secret_id("sbx");
    b.call(
        "POST",
        "sys/wrapping/unwrap",
        Some(serde_json::json!({"token": wrapped})),
    );
    let wsid = w.cred("wsid", &wrapped, As::Root);
    refused(
        &b.addr,
        None,
        &[
            "--auth",
            "approle",
            "--secret-id-wrapped",
            "--role-id-file",
            rid.to_str().unwrap(),
            "--secret-id-file",
            wsid.to_str().unwrap(),
            "--secret",
            "A=secret/app#db",
        ],
        "unwrap",
    );
}

/// CMD not found: 127, and the credentials made for it are revoked.
#[test]
fn command_not_found_revokes() {
    let b = bao_or_skip!();
    let w = Work::new();
    let out = creds(b, &w, As::Root)
        .env("VAULT_TOKEN", b.app_token("10m"))
        .args(["--child-token", "CT", "--", "/nonexistent/cmd"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 127, "{}", stderr(&out));
    let r = assert_event(&w.audit(), "revoked", "info", |e| {
        e["kind"] == "child_token"
    });
    assert_eq!(b.accessor_ttl(r["id"].as_str().unwrap()), None);
    let _ = Command::new("true");
}
