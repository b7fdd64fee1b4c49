//! Issue 15: a connection to a destination that is not allowed is refused
//! at SYN time (connect() fails with ECONNREFUSED at once; it never
//! succeeds to be reset afterwards), with the `net_denied` alert; allowed
//! names and addresses still connect and carry data.

mod common;

use sbx_testutil::{assert_event, audit_events, identities, stderr, stdout};

/// Inside the sandbox: connect() to each target, print `TAG=ok|refused|<error>
/// SECONDS`; for the allowed name, fetch a page and print it.
const PROBE: &str = r#"
import socket, sys, time
def probe(tag, host, port):
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(5)
    t = time.monotonic()
    try:
        s.connect((host, port))
        r = "ok"
    except ConnectionRefusedError:
        r = "refused"
    except OSError as e:
        r = "error:%s" % e.errno
    print("%s=%s %.4f" % (tag, r, time.monotonic() - t), flush=True)
    return s if r == "ok" else None
for spec in sys.argv[1:]:
    tag, host, port = spec.split(",")
    s = probe(tag, host, int(port))
    if s is not None and tag.startswith("GET"):
        s.sendall(b"GET / HTTP/1.0\r\nHost: allowed.test\r\n\r\n")
        body = b""
        while True:
            b = s.recv(4096)
            if not b:
                break
            body += b
        print("%s_BODY=%r" % (tag, body.split(b"\r\n\r\n", 1)[-1]), flush=True)
"#;

fn result<'a>(out: &'a str, tag: &str) -> (&'a str, f64) {
    let v = out
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{tag}=")))
        .unwrap_or_else(|| panic!("no {tag}= in:\n{out}"));
    let (r, t) = v.split_once(' ').unwrap();
    (r, t.parse().unwrap())
}

#[test]
fn denied_connects_are_refused_at_syn_time_and_allowed_ones_carry_data() {
    let w = world_or_skip!();
    let dir = sbx_testutil::shared_tempdir();
    let probe = dir.path().join("probe.py");
    std::fs::write(&probe, PROBE).unwrap();
    sbx_testutil::chown_to_test_user(&probe);
    let (a, b) = (w.a.ip, w.b.ip);
    let script = format!(
        "{py} {probe} GET_NAME,allowed.test,80 GET_CIDR,{a},8080 \
         DENY_ADDR,{b},80 DENY_PORT,{a},443 DENY_V6,2001:db8::5,443 DENY_V6A,{a6},22",
        py = common::PY,
        probe = probe.display(),
        a6 = w.a.ip6,
    );
    let args = [
        "--allow=allowed.test:80".to_string(),
        // The test hosts have private addresses.
        "--dns-rebind-allow=allowed.test".to_string(),
        format!("--allow-cidr={a}/32:8080"),
    ];
    for who in identities() {
        let (_d, log) = common::World::audit_dir();
        let out = w.sbx_net(who, &log, &args, &script);
        let so = stdout(&out);
        let diag = format!("{who:?}: {so}{}", stderr(&out));
        assert!(out.status.success(), "{diag}");

        // Refused, and at once: the first SYN was answered (a dropped SYN
        // is retransmitted after 1 s; an accepted one would be "ok").
        for (tag, dst, port) in [
            ("DENY_ADDR", b.to_string(), 80u16),
            ("DENY_PORT", a.to_string(), 443),
            ("DENY_V6", "2001:db8::5".to_string(), 443),
            ("DENY_V6A", w.a.ip6.to_string(), 22),
        ] {
            let (r, secs) = result(&so, tag);
            assert_eq!(r, "refused", "{tag}: {diag}");
            assert!(secs < 0.5, "{tag} took {secs} s: {diag}");
            assert_event(&log, "net_denied", "alert", |e| {
                e["dst"] == dst.as_str() && e["port"] == port && e["proto"] == "tcp"
            });
        }
        // Allowed through a name and through a CIDR: connected, data both
        // ways.
        let (r, _) = result(&so, "GET_NAME");
        assert_eq!(r, "ok", "{diag}");
        assert!(so.contains("GET_NAME_BODY=b'hello from A\\n'"), "{diag}");
        let (r, _) = result(&so, "GET_CIDR");
        assert_eq!(r, "ok", "{diag}");
        assert!(so.contains("GET_CIDR_BODY=b'hello from A\\n'"), "{diag}");
        // Each refused connection is counted once (no second decision by
        // the gateway: the connection never reached it).
        let ev = audit_events(&log);
        let end = ev
            .iter()
            .find(|e| e["event"] == "net_end")
            .expect("net_end");
        assert_eq!(end["connections_denied"], 4, "{diag}");
        assert_eq!(end["connections_allowed"], 2, "{diag}");
    }
    // Nothing was created in the host's namespace.
    let tables = std::process::Command::new("nft")
        .args(["list", "tables"])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&tables.stdout).contains("sbx_syn"),
        "a SYN-queue table in the host namespace"
    );
}
