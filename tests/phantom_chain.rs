//! Phantom credentials through the composed chains: `scripts/sbx-run -s`
//! and `sbx-policy chain --secret`, as root and as the test user. The
//! declared host receives the real value (curl over HTTP/1.1 and HTTP/2,
//! the CA bundle found through sbx-fs's /etc); inside, every process's
//! environment holds the placeholder only (/proc/*/environ in the
//! sandbox's PID namespace); a placeholder in a DNS name is refused with
//! secret_leak_blocked; the value is nowhere in the audit log or stderr.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::chown_r;
use sbx_testutil::phantom::{World, secret_value, unavailable};
use sbx_testutil::{As, audit_events, identities, run_as, stderr, stdout};

const PATH: &str = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin";

fn marker(out: &str, key: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in:\n{out}"))
        .to_string()
}

fn bin_dir() -> PathBuf {
    sbx_testutil::bin("sbx-fs").parent().unwrap().to_path_buf()
}

/// The script inside: `resolve` is curl's --resolve for sbx-run (whose
/// DNS is the host's), empty for the policy chain (the test DNS through
/// --layers).
fn script(resolve: &str, tag: &str) -> String {
    format!(
        r#"echo "ENV=$K_API"
echo PROCS; cat /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n' | grep -a '^K_API='; echo
curl -sS {resolve} --http1.1 -H "Authorization: Bearer $K_API" https://api.test/{tag}-h1; echo H1=$?
curl -sS {resolve} --http2 -H "x-api-key: $K_API" https://api.test/{tag}-h2; echo H2=$?
getent hosts "$K_API.example.com" >/dev/null; echo DNS=$?
"#
    )
}

fn check(
    w: &World,
    who: As,
    how: &str,
    tag: &str,
    api: &str,
    log: &Path,
    out: &std::process::Output,
) {
    let (so, se) = (stdout(out), stderr(out));
    let diag = format!("{who:?} {how}: {so}\n--- stderr\n{se}");
    assert_eq!(out.status.code(), Some(0), "{diag}");
    let p = marker(&so, "ENV");
    assert!(p.starts_with("sbx-phantom-"), "{diag}");
    assert!(
        so.contains(&format!("K_API={p}")),
        "/proc/*/environ: {diag}"
    );
    assert!(!so.contains(api), "the real value inside: {diag}");
    assert!(!se.contains(api), "the real value on stderr: {diag}");
    assert_eq!(marker(&so, "H1"), "0", "{diag}");
    assert_eq!(marker(&so, "H2"), "0", "{diag}");
    assert_ne!(marker(&so, "DNS"), "0", "{diag}");
    let reqs = World::requests(&w.api_log);
    let got = |path: &str, header: &str| {
        reqs.iter().any(|r| {
            r["uri"].as_str().unwrap_or("").ends_with(path)
                && r["headers"][header].as_str().unwrap_or("").contains(api)
        })
    };
    assert!(
        got(&format!("/{tag}-h1"), "authorization"),
        "{diag}\n{reqs:#?}"
    );
    assert!(got(&format!("/{tag}-h2"), "x-api-key"), "{diag}\n{reqs:#?}");
    let raw = std::fs::read_to_string(log).unwrap_or_default();
    assert!(!raw.contains(api), "the value in the audit log");
    let evs = audit_events(log);
    assert!(
        evs.iter().any(|e| e["event"] == "secret_leak_blocked"
            && e["severity"] == "alert"
            && e["secret"] == "K_API"
            && e["where"] == "dns"),
        "{diag}\n{evs:#?}"
    );
}

fn setup(who: As) -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
    let d = sbx_testutil::shared_tempdir();
    let base = d.path().canonicalize().unwrap();
    let proj = base.join("proj");
    let home = base.join("home");
    std::fs::create_dir_all(&proj).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    if who == As::User {
        chown_r(&base);
    }
    let log = base.join("audit.jsonl");
    (d, proj, home, log)
}

#[test]
fn phantom_credentials_through_sbx_run_and_the_policy_chain() {
    if let Some(why) = unavailable() {
        sbx_testutil::skip!("{why}");
    }
    let w = World::new();
    let sbx_run = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/sbx-run");
    for who in identities() {
        // scripts/sbx-run -s: the host's DNS, so curl is told the address.
        let api = secret_value("RUN", 44);
        let (_d, proj, _home, log) = setup(who);
        let resolve = format!("--resolve api.test:443:{}", w.api.ip);
        let mut c = Command::new("timeout");
        c.args(["-s", "KILL", "120", "/bin/sh"])
            .arg(&sbx_run)
            .arg("-C")
            .arg(&proj)
            .arg("-l")
            .arg(&log)
            .args(["-s", "K_API@api.test"])
            .args(["-a", &format!("{}:443", w.api.ip)])
            .args(["--", "/bin/sh", "-c", &script(&resolve, "run")])
            .env("SBX_BIN", bin_dir())
            .env("K_API", &api)
            .env("SSL_CERT_FILE", &w.ca)
            .env("PATH", PATH)
            .env_remove("SBX_ID")
            .env_remove("SBX_AUDIT_LOG")
            .current_dir(&proj);
        run_as(&mut c, who);
        let out = sbx_testutil::output_within(&mut c, std::time::Duration::from_secs(150));
        check(&w, who, "sbx-run", "run", &api, &log, &out);

        // sbx-policy chain --secret, the test DNS through --layers.
        let api = secret_value("CHAIN", 44);
        let (_d, proj, home, log) = setup(who);
        let layers = proj.parent().unwrap().join("layers.json");
        std::fs::write(
            &layers,
            format!(
                r#"{{"sbx-net": {{"dns-upstream": ["{}"], "dns-rebind-allow": ["test"]}}}}"#,
                w.dns.ip
            ),
        )
        .unwrap();
        if who == As::User {
            chown_r(&layers);
        }
        let mut c = sbx_testutil::tool("sbx-policy");
        c.arg("--audit-log").arg(&log);
        c.args(["chain", "--managed", "/nonexistent/managed.json", "--home"])
            .arg(&home)
            .arg("--layers")
            .arg(&layers)
            .args(["--secret", "K_API@api.test"])
            .args(["--", "/bin/sh", "-c", &script("", "chain")])
            .env("K_API", &api)
            .env("SSL_CERT_FILE", &w.ca)
            .env("PATH", PATH)
            .env_remove("SBX_ID")
            .env_remove("SBX_AUDIT_LOG")
            .current_dir(&proj);
        run_as(&mut c, who);
        let out = sbx_testutil::output_within(&mut c, std::time::Duration::from_secs(150));
        check(&w, who, "sbx-policy chain", "chain", &api, &log, &out);
    }
}
