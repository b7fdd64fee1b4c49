//! The server's answer is untrusted input: a value (or a name derived
//! from one) the command's environment cannot hold is one line naming the
//! flag, path and key (never the value), exit 125, after the fetch and
//! before the command starts; the command never runs, every token created
//! (AppRole login and session tokens, the child token) is revoked, the
//! guardian and the registry record are gone. As root and as the
//! unprivileged user.

mod common;

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

/// Never printed: the value part before the NUL byte.
const SEEN: &str = "do-not-print-me";
const NUL_VALUE: &str = "do-not-print-me\u{0}tail";
/// Linux's MAX_ARG_STRLEN: one `NAME=VALUE` with its NUL.
const MAX_ENV_STRING: usize = 32 * 4096;

fn kv(b: &Bao, path: &str, data: Value) {
    b.call(
        "POST",
        &format!("secret/data/{path}"),
        Some(json!({ "data": data })),
    );
}

/// The secrets of these tests (idempotent: the server may be shared).
fn provision(b: &Bao) {
    // Tokens shorter than the runs' --ttl: no warning line on stderr.
    b.call(
        "POST",
        "auth/approle/role/envvals",
        Some(json!({"token_ttl": "5m", "token_max_ttl": "10m", "token_policies": ["app"]})),
    );
    kv(b, "env/nul", json!({ "ok": "fine", "bad": NUL_VALUE }));
    kv(
        b,
        "env/big",
        json!({ "big": format!("{SEEN}{}", "x".repeat(MAX_ENV_STRING - 3 - SEEN.len() + 1)) }),
    );
    kv(b, "env/all", json!({ "ok": "fine", "with nul": NUL_VALUE }));
    kv(b, "env/longkey", json!({ "k".repeat(1000): NUL_VALUE }));
    // "a\nb" and "a_b" both give D_A_B.
    kv(b, "env/dup", json!({ "a\nb": "1", "a_b": "2" }));
    // Not strings: converted (secret.rs), and a NUL inside an object is
    // JSON text ("\u0000"), not a byte. `edge` is exactly the kernel's
    // limit as E=VALUE.
    kv(
        b,
        "env/odd",
        json!({ "n": 42, "f": 1.5, "t": true, "o": {"k": [1, "z\u{0}"]}, "u": null,
                "edge": "x".repeat(MAX_ENV_STRING - 3) }),
    );
    let chunk = "y".repeat(100 << 10);
    let many: serde_json::Map<String, Value> = (0..6)
        .map(|i| (format!("k{i}"), Value::from(chunk.clone())))
        .collect();
    kv(b, "env/many", Value::Object(many));
    let some: serde_json::Map<String, Value> = (0..4)
        .map(|i| (format!("k{i}"), Value::from(chunk.clone())))
        .collect();
    kv(b, "env/some", Value::Object(some));
}

struct Run {
    out: Output,
    w: Work,
    marker: PathBuf,
    /// In the environment of sbx-creds and its guardian: finds them in /proc.
    tag: String,
}

/// sbx-creds logging in with AppRole (login token replaced by a session
/// token), creating a child token, with `args`; CMD touches a marker.
/// `stack`: the stack rlimit it runs with (the execve limit is a quarter).
fn run(b: &Bao, who: As, args: &[&str], stack: Option<u64>, cmd: &[&str]) -> Run {
    let w = Work::new();
    let reg = w.path("registry");
    std::fs::create_dir(&reg).unwrap();
    chown_to_test_user(&reg);
    let rid = w.cred("role-id", &b.role_id("envvals"), who);
    let sid = w.cred("secret-id", &b.secret_id("envvals"), who);
    let marker = w.path("scratch/started");
    let tag = unique("env-values-");
    let mut c = creds(b, &w, who);
    c.env("SBX_REGISTRY_DIR", &reg)
        .env("SBX_TEST_TAG", &tag)
        .args(["--auth", "approle", "--role-id-file"])
        .arg(&rid)
        .arg("--secret-id-file")
        .arg(&sid)
        .args(["--ttl", "10m", "--child-token", "CT"])
        .args(args)
        .arg("--");
    if cmd.is_empty() {
        c.arg("touch").arg(&marker);
    } else {
        c.args(cmd);
    }
    if let Some(s) = stack {
        // SAFETY: the closure runs in the forked child before exec and only
        // calls getrlimit/setrlimit on a local struct: async-signal-safe.
        unsafe {
            c.pre_exec(move || {
                let mut r = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                if libc::getrlimit(libc::RLIMIT_STACK, &mut r) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                r.rlim_cur = s.min(r.rlim_max);
                if libc::setrlimit(libc::RLIMIT_STACK, &r) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let out = output_within(&mut c, Duration::from_secs(60));
    Run {
        out,
        w,
        marker,
        tag,
    }
}

/// Processes whose environment holds `SBX_TEST_TAG=tag` (sbx-creds and its
/// guardian); root only (their /proc files are root's: non-dumpable).
fn tagged(tag: &str) -> Vec<String> {
    let needle = format!("SBX_TEST_TAG={tag}\0");
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let env = std::fs::read(e.path().join("environ")).unwrap_or_default();
        if String::from_utf8_lossy(&env).contains(&needle) {
            v.push(name);
        }
    }
    v
}

fn accessor(ev: &Value) -> String {
    ev["accessor"].as_str().unwrap().to_string()
}

/// The refusal: one line holding `needle`, 125, no value anywhere, the
/// command not run, `setup_failed` in the audit log, every token created
/// revoked (checked on the server), no guardian or record left.
fn assert_refused(b: &Bao, who: As, r: &Run, needle: &str, in_audit: &str) {
    let se = stderr(&r.out);
    assert_usage_error(&r.out, needle);
    assert!(!se.contains(SEEN), "{who:?}: the value on stderr: {se}");
    assert!(!r.marker.exists(), "{who:?}: the command ran");
    let audit = r.w.audit();
    let log = std::fs::read_to_string(&audit).unwrap();
    assert!(!log.contains(SEEN), "{who:?}: the value in the audit log");
    assert!(events(&audit, "secret_injected").is_empty(), "{log}");
    assert_event(&audit, "setup_failed", "warn", |e| {
        e["error"].as_str().is_some_and(|m| m.contains(in_audit))
    });
    // The AppRole login token (replaced at once), the session token and
    // the child token: all gone on the server.
    let login = accessor(&events(&audit, "login")[0]);
    let session = accessor(&events(&audit, "session_token")[0]);
    let child = assert_event(&audit, "revoked", "info", |e| e["kind"] == "child_token");
    let child = child["id"].as_str().unwrap();
    for (what, acc) in [("login", &*login), ("session", &*session), ("child", child)] {
        assert_eq!(
            b.accessor_ttl(acc),
            None,
            "{who:?}: the {what} token is still alive"
        );
    }
    assert!(events(&audit, "revocation_failed").is_empty(), "{log}");
    // sbx-creds revoked itself: the guardian was released (it has nothing
    // to say) and is gone, the registry record with it.
    if is_root() {
        assert!(
            wait_until(Duration::from_secs(10), || tagged(&r.tag).is_empty()),
            "{who:?}: still running: {:?}",
            tagged(&r.tag)
        );
    }
    assert!(events(&audit, "guardian_revoked").is_empty(), "{log}");
    let reg = r.w.path("registry");
    let left: Vec<_> = std::fs::read_dir(&reg)
        .unwrap()
        .flatten()
        .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "{who:?}: registry left {left:?}");
}

#[test]
fn unusable_values_are_refused_before_the_command() {
    let b = bao_or_skip!();
    provision(b);
    for who in identities() {
        let cases: [(&[&str], &str, &str); 5] = [
            (
                &[
                    "--secret",
                    "OK=secret/env/nul#ok",
                    "--secret",
                    "S=secret/env/nul#bad",
                ],
                "--secret S: key 'bad' of secret secret/env/nul: the value contains a NUL byte",
                "key 'bad' of secret secret/env/nul",
            ),
            (
                &["--secret", "B=secret/env/big#big"],
                "--secret B: key 'big' of secret secret/env/big: NAME=VALUE would be 131073 bytes, over the kernel's limit of 131072 bytes (128 KiB) for one environment string",
                "key 'big' of secret secret/env/big",
            ),
            (
                &["--secret-all", "BAD=secret/env/all"],
                "--secret-all BAD: key 'with nul' of secret secret/env/all (variable BAD_WITH_NUL): the value contains a NUL byte",
                "(variable BAD_WITH_NUL)",
            ),
            (
                &["--secret-all", "L=secret/env/longkey"],
                "... (1000 bytes)' of secret secret/env/longkey (variable L_KKK",
                "the value contains a NUL byte",
            ),
            (
                &["--secret-all", "D=secret/env/dup"],
                "environment variable D_A_B is set by more than one secret: --secret-all D: key 'a\\nb' of secret secret/env/dup (variable D_A_B), and --secret-all D: key 'a_b'",
                "is set by more than one secret",
            ),
        ];
        for (args, needle, in_audit) in cases {
            let r = run(b, who, args, None, &[]);
            assert_refused(b, who, &r, needle, in_audit);
        }
    }
}

/// Values that are not strings are converted (numbers, booleans, compact
/// JSON, null as empty), and a value exactly at the kernel's limit for one
/// environment string reaches the command.
#[test]
fn odd_values_and_the_edge_reach_the_command() {
    let b = bao_or_skip!();
    provision(b);
    for who in identities() {
        let mut args = Vec::new();
        for (env, key) in [
            ("N", "n"),
            ("F", "f"),
            ("T", "t"),
            ("O", "o"),
            ("U", "u"),
            ("E", "edge"),
        ] {
            args.push("--secret".to_string());
            args.push(format!("{env}=secret/env/odd#{key}"));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let r = run(
            b,
            who,
            &args,
            None,
            &[
                "sh",
                "-c",
                r#"printf '%s|%s|%s|%s|%s|%s\n' "$N" "$F" "$T" "$O" "$U" "${#E}""#,
            ],
        );
        assert_eq!(code(&r.out), 0, "{who:?}: {}", stderr(&r.out));
        assert_eq!(
            stdout(&r.out),
            format!(
                "42|1.5|true|{{\"k\":[1,\"z\\u0000\"]}}||{}\n",
                MAX_ENV_STRING - 3
            )
        );
    }
}

/// CMD, the environment and the secrets together over the kernel's execve
/// limit (a quarter of the stack rlimit: 512 KiB with a 2 MiB stack) are
/// one line naming the largest secret, before the command starts; below
/// it, the command runs.
#[test]
fn secrets_over_the_execve_limit_are_refused() {
    let b = bao_or_skip!();
    provision(b);
    for who in identities() {
        let r = run(
            b,
            who,
            &["--secret-all", "M=secret/env/many"],
            Some(2 << 20),
            &[],
        );
        assert_refused(
            b,
            who,
            &r,
            "the secrets (600.1 KiB in all; the largest M_K0 at 100.0 KiB, from --secret-all M: key 'k0' of secret secret/env/many (variable M_K0)) with CMD and the rest of the environment come to",
            "over the kernel's limit of 512 KiB for a command's arguments and environment together",
        );
        let r = run(
            b,
            who,
            &["--secret-all", "S=secret/env/some"],
            Some(2 << 20),
            &["sh", "-c", r#"echo "${#S_K0} ${#S_K3}""#],
        );
        assert_eq!(code(&r.out), 0, "{who:?}: {}", stderr(&r.out));
        assert_eq!(stdout(&r.out), format!("{0} {0}\n", 100 << 10));
    }
}
