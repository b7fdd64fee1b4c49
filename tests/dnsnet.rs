//! Issue 15, "Network and DNS", through the composed chains: scripts/sbx-run
//! (by hand) and `sbx-policy chain` (from Claude Code settings), as root and
//! as the unprivileged test user. AF_VSOCK sockets are refused by the
//! default seccomp profile (EPERM and a syscall_denied alert); a DNS name
//! whose label hides a dot (`x\.allowed.test`) is refused by sbx-net's DNS
//! proxy under `*.allowed.test` (REFUSED and a dns_refused alert), never
//! forwarded.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{chown_r, write};
use sbx_testutil::{As, audit_events, identities, run_as, stderr, stdout};
use serde_json::Value;

const PATH: &str = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin";

/// Tries socket(AF_VSOCK) and prints `VSOCK=<errno or ok>`; then sends a
/// DNS query for the wire labels ["x.allowed", "test"] to any server (the
/// sandbox's DNS is redirected to the proxy) and prints `RCODE=<n>`.
const PROBE: &str = r#"
import errno, os, socket, struct
try:
    s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    print("VSOCK=ok", flush=True)
except OSError as e:
    print("VSOCK=" + errno.errorcode.get(e.errno, str(e.errno)), flush=True)
def q(labels):
    b = struct.pack(">HHHHHH", 0x4242, 0x0100, 1, 0, 0, 0)
    for l in labels:
        b += bytes([len(l)]) + l
    return b + b"\x00" + struct.pack(">HH", 1, 1)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(8)
try:
    u.sendto(q([b"x.allowed", b"test"]), ("192.0.2.53", 53))
    r = u.recv(4096)
    print("RCODE=%d" % (r[3] & 15), flush=True)
except OSError as e:
    print("RCODE=" + str(e), flush=True)
"#;

fn marker(out: &str, key: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in:\n{out}"))
        .to_string()
}

struct Case {
    _d: tempfile::TempDir,
    base: PathBuf,
    proj: PathBuf,
    log: PathBuf,
}

fn case(who: As) -> Case {
    let d = sbx_testutil::shared_tempdir();
    let base = d.path().canonicalize().unwrap();
    let proj = base.join("proj");
    write(&proj.join("probe.py"), PROBE);
    write(&base.join("home/.keep"), "");
    if who == As::User {
        chown_r(&base);
    }
    let log = base.join("audit.jsonl");
    Case {
        _d: d,
        base,
        proj,
        log,
    }
}

fn check(c: &Case, out: &Output, who: As, how: &str) {
    let so = stdout(out);
    let diag = format!("{who:?} {how}: {so}{}", stderr(out));
    assert_eq!(marker(&so, "VSOCK"), "EPERM", "{diag}");
    assert_eq!(marker(&so, "RCODE"), "5", "REFUSED: {diag}");
    let evs = audit_events(&c.log);
    let alert = |f: &dyn Fn(&Value) -> bool| evs.iter().any(|e| e["severity"] == "alert" && f(e));
    assert!(
        alert(&|e| e["event"] == "syscall_denied" && e["syscall"] == "socket"),
        "{diag}\n{evs:#?}"
    );
    assert!(
        alert(&|e| e["event"] == "dns_refused"
            && e["reason"] == "bad_name"
            && e["name"] == "x\\.allowed.test"),
        "{diag}\n{evs:#?}"
    );
}

fn bin_dir() -> PathBuf {
    sbx_testutil::bin("sbx-fs").parent().unwrap().to_path_buf()
}

#[test]
fn vsock_and_escaped_dot_names_through_sbx_run() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/sbx-run");
    for who in identities() {
        let c = case(who);
        let mut cmd = Command::new("sh");
        cmd.arg(&script)
            .arg("-C")
            .arg(&c.proj)
            .arg("-l")
            .arg(&c.log)
            .args(["-a", "*.allowed.test", "--", "/usr/bin/python3", "probe.py"])
            .env("SBX_BIN", bin_dir())
            .env_remove("SBX_ID")
            .env_remove("SBX_AUDIT_LOG")
            .env("PATH", PATH)
            .current_dir(&c.base);
        run_as(&mut cmd, who);
        let out = cmd.output().unwrap();
        check(&c, &out, who, "sbx-run");
    }
}

#[test]
fn vsock_and_escaped_dot_names_through_the_policy_chain() {
    for who in identities() {
        let c = case(who);
        write(
            &c.proj.join(".claude/settings.json"),
            r#"{"permissions": {"allow": ["Bash(/usr/bin/python3:*)", "WebFetch(domain:*.allowed.test)"]}}"#,
        );
        if who == As::User {
            chown_r(&c.base);
        }
        let mut cmd = sbx_testutil::tool("sbx-policy");
        cmd.arg("--audit-log").arg(&c.log);
        cmd.args(["chain", "--managed", "/nonexistent/managed.json", "--home"])
            .arg(c.base.join("home"))
            .args(["--", "/usr/bin/python3", "probe.py"])
            .current_dir(&c.proj)
            .env("PATH", PATH)
            .env_remove("SBX_ID")
            .env_remove("SBX_AUDIT_LOG");
        run_as(&mut cmd, who);
        let out = cmd.output().unwrap();
        check(&c, &out, who, "sbx-policy chain");
    }
}
