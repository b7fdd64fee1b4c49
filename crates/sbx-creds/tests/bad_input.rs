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
        // The chain's own variables (a secret named SBX_TOOL_IDS would
        // steer which tool gets the audit log).
        (
            &["--secret", "SBX_TOOL_IDS=secret/app#db"],
            "'SBX_TOOL_IDS' is reserved",
        ),
        (&["--secret-all", "SBX=secret/app"], "'SBX_*' is reserved"),
        (
            &["--child-token", "SBX_PASS_ENV"],
            "'SBX_PASS_ENV' is reserved",
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

/// --ca-cert (and VAULT_CACERT) naming anything but a readable PEM bundle
/// of usable certificates: one line naming the flag, the file and what is
/// wrong, 125, within a moment (a FIFO without a writer, /dev/zero and a
/// 2 GB sparse file are not read), before any connection to the server,
/// the command never started.
#[test]
fn ca_cert_without_a_usable_certificate_is_refused_before_any_request() {
    let w = Work::new();
    let d = w.dir.path();
    let file = |name: &str, text: &str| {
        let p = d.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let empty = file("empty.pem", "");
    let blank = file("blank.pem", " \n\t\n");
    let garbage = file("garbage.pem", "this is not a certificate\n");
    let key = file("key.pem", KEY_ONLY);
    // Base64 that is no certificate; PEM whose base64 is broken.
    let bad_der = file(
        "bad-der.pem",
        "-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n",
    );
    let bad_b64 = file(
        "bad-b64.pem",
        "-----BEGIN CERTIFICATE-----\n!!!not base64!!!\n-----END CERTIFICATE-----\n",
    );
    let unended = file("unended.pem", "-----BEGIN CERTIFICATE-----\nMIIB\n");
    // A good CA first, then a bad one: the bad one is named.
    let second_bad = file(
        "second-bad.pem",
        &format!(
            "{OTHER_CA}-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n"
        ),
    );
    let fifo = d.join("fifo.pem");
    mkfifo(&fifo);
    let fifo = fifo.display().to_string();
    let sparse = d.join("sparse.pem");
    std::fs::File::create(&sparse)
        .unwrap()
        .set_len(2 << 30)
        .unwrap();
    let sparse = sparse.display().to_string();
    let dir = d.display().to_string();
    let cases: Vec<(&str, &str)> = vec![
        (&empty, "empty"),
        (&blank, "empty"),
        (&garbage, "holds no PEM certificate"),
        (&key, "holds no PEM certificate, only PRIVATE KEY"),
        (
            &bad_der,
            "certificate 1 of 1 is not a usable X.509 CA certificate",
        ),
        (
            &second_bad,
            "certificate 2 of 2 is not a usable X.509 CA certificate",
        ),
        (&bad_b64, "not a PEM certificate bundle"),
        (&unended, "not a PEM certificate bundle"),
        (&fifo, "not a regular file (a FIFO)"),
        ("/dev/zero", "not a regular file (a character device)"),
        (&sparse, "larger than the cap of 4 MiB"),
        (&dir, "not a regular file (a directory)"),
        ("/proc/self/status", "(not an input)"),
        ("/nonexistent/ca.pem", "No such file"),
    ];
    // The server: a listener that must see no connection.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let addr = format!("https://{}", l.local_addr().unwrap());
    let marker = w.path("started");
    for via_env in [false, true] {
        for (path, why) in &cases {
            let mut c = tool("sbx-creds");
            c.env("VAULT_ADDR", &addr)
                .env("VAULT_TOKEN", "t")
                .env_remove("BAO_TOKEN")
                .env_remove("VAULT_CACERT");
            if via_env {
                c.env("VAULT_CACERT", path);
            } else {
                c.args(["--ca-cert", path]);
            }
            c.args(["--secret", "A=secret/app#db", "--", "touch"])
                .arg(&marker);
            let t0 = Instant::now();
            let out = output_within(&mut c, Duration::from_secs(30));
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "{path}: took {:?}",
                t0.elapsed()
            );
            assert_usage_error(&out, &format!("--ca-cert {path}: "));
            assert_usage_error(&out, why);
            assert!(!marker.exists(), "the command ran with --ca-cert {path}");
            assert!(
                l.accept().is_err(),
                "--ca-cert {path}: sbx-creds connected to the server"
            );
        }
    }
    // A CA file for a plain http:// server is a mistake, not ignored.
    let ca = file("ca.pem", OTHER_CA);
    let out = refused(
        &format!("http://{}", l.local_addr().unwrap()),
        Some("t"),
        &["--ca-cert", &ca, "--secret", "A=secret/app#db"],
        "given for an http:// address",
    );
    assert!(stderr(&out).contains(&format!("--ca-cert {ca}")));
    assert!(l.accept().is_err());
}
