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

/// A daemon the command leaves behind: waits for `go`, then connects to
/// the allowed address and writes the outcome to `result`.
const DAEMON: &str = r#"
import os, socket, sys, time
d, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if os.fork():
    sys.exit(0)
os.setsid()
if os.fork():
    os._exit(0)
open(os.path.join(d, "ready"), "w").close()
end = time.monotonic() + 20
while not os.path.exists(os.path.join(d, "go")) and time.monotonic() < end:
    time.sleep(0.02)
s = socket.socket()
s.settimeout(3)
try:
    s.connect((host, port))
    r = "ok"
except ConnectionRefusedError:
    r = "refused"
except socket.timeout:
    r = "timeout"
except OSError as e:
    r = "error:%s" % e.errno
with open(os.path.join(d, "result.tmp"), "w") as f:
    f.write(r)
os.rename(os.path.join(d, "result.tmp"), os.path.join(d, "result"))
"#;

#[test]
fn with_the_supervisor_gone_a_syn_is_dropped_not_accepted() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let w = world_or_skip!();
    let a = w.a.ip;
    for who in identities() {
        let dir = sbx_testutil::shared_tempdir();
        let d = dir.path();
        std::fs::write(d.join("daemon.py"), DAEMON).unwrap();
        sbx_testutil::chown_to_test_user(&d.join("daemon.py"));
        let (_l, log) = common::World::audit_dir();
        let script = format!(
            "{py} {d}/daemon.py {d} {a} 8080 </dev/null >/dev/null 2>&1; echo STARTED; exec sleep 30",
            py = common::PY,
            d = d.display(),
        );
        let mut c = sbx_testutil::tool("sbx-net");
        c.arg("--audit-log").arg(&log);
        c.arg(format!("--allow-cidr={a}/32:8080"));
        c.args(["--", "/bin/sh", "-c", &script]);
        c.env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .current_dir("/");
        c.stdout(Stdio::piped()).stderr(Stdio::inherit());
        sbx_testutil::run_as(&mut c, who);
        let mut child = c.spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        assert!(
            lines.any(|l| l.is_ok_and(|l| l == "STARTED")),
            "{who:?}: the command did not start"
        );
        let wait_for = |p: &std::path::Path, what: &str| {
            let end = Instant::now() + Duration::from_secs(15);
            while !p.exists() {
                assert!(Instant::now() < end, "{who:?}: no {what}");
                std::thread::sleep(Duration::from_millis(20));
            }
        };
        wait_for(&d.join("ready"), "daemon");
        child.kill().unwrap(); // SIGKILL to the supervisor
        child.wait().unwrap();
        std::fs::write(d.join("go"), "").unwrap();
        wait_for(&d.join("result"), "result from the daemon");
        let r = std::fs::read_to_string(d.join("result")).unwrap();
        // No listener on the queue: the kernel drops the SYN (no bypass);
        // it is neither accepted nor answered.
        assert_eq!(r, "timeout", "{who:?}");
    }
}
