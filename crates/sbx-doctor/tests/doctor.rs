//! sbx-doctor end to end: on this machine as root and as the test user,
//! with conditions faked through SBX_DOCTOR_ROOT, and against real servers
//! on 127.0.0.1 and a real unix socket.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Output};

use sbx_testutil::{As, code, identities, run_as, stderr, stdout};
use serde_json::Value;

const IDS: &[&str] = &[
    "userns",
    "fuse",
    "cgroup",
    "landlock",
    "seccomp",
    "nftables",
    "runsc",
    "qemu",
    "kvm",
    "firecracker",
    "engine",
    "vault",
];

fn doctor(who: As, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = sbx_testutil::tool("sbx-doctor");
    c.args(args)
        .env_remove("SBX_DOCTOR_ROOT")
        .env_remove("VAULT_ADDR")
        .env_remove("BAO_ADDR");
    for (k, v) in env {
        c.env(k, v);
    }
    run_as(&mut c, who);
    c.output().expect("spawn sbx-doctor")
}

fn json(out: &Output) -> Value {
    serde_json::from_str(&stdout(out))
        .unwrap_or_else(|e| panic!("--json is not JSON ({e}): {}", stdout(out)))
}

fn check<'a>(v: &'a Value, id: &str) -> &'a Value {
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("no check {id} in {v}"))
}

/// A temp dir the test user can read, holding faked files.
fn fake(files: &[(&str, &str)]) -> tempfile::TempDir {
    let d = sbx_testutil::shared_tempdir();
    for (p, text) in files {
        let f = d.path().join(p.trim_start_matches('/'));
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(&f, text).unwrap();
    }
    let _ = Command::new("chmod")
        .arg("-R")
        .arg("a+rX")
        .arg(d.path())
        .status();
    d
}

/// Every check runs on this machine for root and the test user; the exit
/// status agrees with the report; every warn and fail has its fix; the
/// kernel features this machine has (user namespaces, seccomp notify,
/// Landlock, nftables in a throwaway netns) are found working.
#[test]
fn every_check_runs_on_this_machine_as_root_and_as_the_test_user() {
    for who in identities() {
        let out = doctor(who, &["--json"], &[]);
        let v = json(&out);
        let failed = v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["status"] == "fail");
        assert_eq!(code(&out), if failed { 1 } else { 0 }, "{who:?}: {v}");
        assert_eq!(v["ok"], !failed);
        let ids: Vec<&str> = v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, IDS, "{who:?}");
        for c in v["checks"].as_array().unwrap() {
            let st = c["status"].as_str().unwrap();
            assert!(["ok", "warn", "fail", "skip"].contains(&st), "{c}");
            assert_eq!(
                c["fix"].is_string(),
                st == "warn" || st == "fail",
                "{who:?}: a fix exactly for warn and fail: {c}"
            );
        }
        if sbx_testutil::must_work() {
            // DESIGN.md's measured machine: these work for both.
            for id in ["userns", "fuse", "seccomp", "landlock", "nftables"] {
                assert_eq!(check(&v, id)["status"], "ok", "{who:?}: {}", check(&v, id));
            }
        }
        assert_eq!(check(&v, "vault")["status"], "skip");
        // kvm_pvm (this machine's /dev/kvm) boots no guest: said so.
        if Path::new("/sys/module/kvm_pvm").exists() && Path::new("/dev/kvm").exists() {
            let k = check(&v, "kvm");
            assert_eq!(k["status"], "warn", "{k}");
            if who == As::Root {
                assert!(k["summary"].as_str().unwrap().contains("kvm_pvm"), "{k}");
            }
        }
        // The text report: one line per check plus fixes, and a count.
        let out = doctor(who, &[], &[]);
        let text = stdout(&out);
        for id in IDS {
            assert!(
                text.lines()
                    .any(|l| l.split_whitespace().nth(1) == Some(id)),
                "{who:?}: no line for {id}: {text}"
            );
        }
        assert!(text.trim_end().ends_with("skipped"), "{text}");
        assert_eq!(code(&out), if failed { 1 } else { 0 });
    }
}

/// user.max_user_namespaces = 0 (faked): the test user's userns check
/// fails with its fix line and exit 1; for root it is a warn and exit 0.
#[test]
fn blocked_user_namespaces_fail_with_the_fix_line() {
    let d = fake(&[("/proc/sys/user/max_user_namespaces", "0\n")]);
    let root = d.path().to_str().unwrap();
    for who in identities() {
        let out = doctor(who, &["--check", "userns"], &[("SBX_DOCTOR_ROOT", root)]);
        let text = stdout(&out);
        assert!(text.contains("SBX_DOCTOR_ROOT="), "{text}");
        let fix = "fix: sudo sysctl -w user.max_user_namespaces=15000";
        assert!(text.contains(fix), "{who:?}: {text}");
        match who {
            As::User => {
                assert_eq!(code(&out), 1, "{text}");
                assert!(text.contains("FAIL  userns"), "{text}");
                assert!(text.contains("user.max_user_namespaces is 0"), "{text}");
            }
            As::Root => {
                assert_eq!(code(&out), 0, "{text}");
                assert!(text.contains("warn  userns"), "{text}");
            }
        }
        let out = doctor(
            who,
            &["--check", "userns", "--json"],
            &[("SBX_DOCTOR_ROOT", root)],
        );
        let v = json(&out);
        let c = check(&v, "userns");
        assert_eq!(v["checks"].as_array().unwrap().len(), 1);
        assert_eq!(v["fake_root"], root);
        let want = if who == As::User { "fail" } else { "warn" };
        assert_eq!(c["status"], want, "{v}");
        assert_eq!(v["ok"], who == As::Root);
        assert!(
            c["fix"]
                .as_str()
                .unwrap()
                .starts_with("sudo sysctl -w user.max_user_namespaces=")
        );
    }
}

/// Ubuntu's AppArmor restriction, faked, for the test user.
#[test]
fn apparmor_restriction_fails_with_its_fix() {
    let d = fake(&[(
        "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
        "1\n",
    )]);
    let who = *identities().last().unwrap();
    if who != As::User {
        sbx_testutil::skip!("needs the unprivileged test user");
    }
    let out = doctor(
        who,
        &["--check", "userns", "--json"],
        &[("SBX_DOCTOR_ROOT", d.path().to_str().unwrap())],
    );
    assert_eq!(code(&out), 1);
    let v = json(&out);
    let c = check(&v, "userns");
    assert!(
        c["summary"]
            .as_str()
            .unwrap()
            .contains("apparmor_restrict_unprivileged_userns is 1")
    );
    assert!(
        c["fix"]
            .as_str()
            .unwrap()
            .contains("apparmor_restrict_unprivileged_userns=0")
    );
}

/// seccomp without user notification and no cgroup mounted (faked): both
/// fail, exit 1; a missing /dev/kvm and /dev/fuse only warn.
#[test]
fn faked_kernel_gaps_fail_or_warn_as_documented() {
    let d = fake(&[
        (
            "/proc/sys/kernel/seccomp/actions_avail",
            "kill_process errno allow\n",
        ),
        (
            "/proc/self/mountinfo",
            "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n",
        ),
    ]);
    let root = d.path().to_str().unwrap();
    let out = doctor(
        As::Root,
        &[
            "--json", "--check", "seccomp", "--check", "cgroup", "--check", "kvm", "--check",
            "fuse",
        ],
        &[("SBX_DOCTOR_ROOT", root)],
    );
    assert_eq!(code(&out), 1, "{}", stdout(&out));
    let v = json(&out);
    assert_eq!(check(&v, "seccomp")["status"], "fail");
    assert_eq!(check(&v, "cgroup")["status"], "fail");
    assert_eq!(check(&v, "kvm")["status"], "warn");
    assert!(
        check(&v, "kvm")["summary"]
            .as_str()
            .unwrap()
            .starts_with("no /dev/kvm")
    );
    assert_eq!(check(&v, "fuse")["status"], "warn");
}

/// VAULT_ADDR / BAO_ADDR against a real HTTP server on 127.0.0.1: up is
/// ok, sealed fails with the unseal fix, a closed port fails.
#[test]
fn vault_reachability_against_a_local_server() {
    fn serve(status: &'static str) -> String {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        std::thread::spawn(move || {
            if let Ok((mut s, _)) = l.accept() {
                let mut b = [0u8; 1024];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut b) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got.extend_from_slice(&b[..n]),
                    }
                }
                assert!(got.starts_with(b"GET /v1/sys/health "), "{got:?}");
                let _ = write!(s, "HTTP/1.1 {status}\r\nContent-Length: 2\r\n\r\n{{}}");
            }
        });
        format!("http://{a}")
    }
    let out = doctor(
        As::Root,
        &["--check", "vault"],
        &[("VAULT_ADDR", &serve("200 OK"))],
    );
    assert_eq!(code(&out), 0, "{}", stdout(&out));
    assert!(stdout(&out).contains("ok    vault"), "{}", stdout(&out));
    // BAO_ADDR wins over VAULT_ADDR.
    let out = doctor(
        As::Root,
        &["--check", "vault"],
        &[
            ("VAULT_ADDR", "http://127.0.0.1:1"),
            ("BAO_ADDR", &serve("503 Service Unavailable")),
        ],
    );
    assert_eq!(code(&out), 1, "{}", stdout(&out));
    assert!(stdout(&out).contains("is sealed"), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("fix: bao operator unseal"),
        "{}",
        stdout(&out)
    );
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = format!("http://{}", l.local_addr().unwrap());
    drop(l);
    let out = doctor(As::Root, &["--check", "vault"], &[("VAULT_ADDR", &closed)]);
    assert_eq!(code(&out), 1);
    assert!(stdout(&out).contains("unreachable"), "{}", stdout(&out));
}

/// DOCKER_HOST pointing at a real unix socket that answers /_ping like
/// Podman: the engine check is ok and says Podman; a socket path with
/// nothing behind it warns (exit 0: an optional backend).
#[test]
fn engine_socket_is_pinged() {
    let d = tempfile::tempdir().unwrap();
    let sock = d.path().join("engine.sock");
    let l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut b = [0u8; 1024];
        let mut got = Vec::new();
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut b) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&b[..n]),
            }
        }
        assert!(got.starts_with(b"GET /_ping "), "{got:?}");
        s.write_all(b"HTTP/1.1 200 OK\r\nLibpod-Api-Version: 4.3.1\r\nContent-Length: 2\r\n\r\nOK")
            .unwrap();
    });
    let host = format!("unix://{}", sock.display());
    let out = doctor(As::Root, &["--check", "engine"], &[("DOCKER_HOST", &host)]);
    t.join().unwrap();
    assert_eq!(code(&out), 0);
    assert!(
        stdout(&out).contains("ok    engine       Podman API at"),
        "{}",
        stdout(&out)
    );
    let gone = format!("unix://{}", d.path().join("none.sock").display());
    let out = doctor(As::Root, &["--check", "engine"], &[("DOCKER_HOST", &gone)]);
    assert_eq!(code(&out), 0);
    assert!(stdout(&out).contains("warn  engine"), "{}", stdout(&out));
    assert!(stdout(&out).contains("fix: "), "{}", stdout(&out));
}

/// Bad usage is one line and 125; --audit-log records the report.
#[test]
fn bad_usage_and_the_audit_event() {
    let out = doctor(As::Root, &["--check", "bogus"], &[]);
    sbx_testutil::assert_usage_error(&out, "'bogus'");
    let out = doctor(As::Root, &["extra"], &[]);
    sbx_testutil::assert_usage_error(&out, "extra");
    let d = tempfile::tempdir().unwrap();
    let log = d.path().join("audit.jsonl");
    let fk = fake(&[("/proc/sys/kernel/seccomp/actions_avail", "allow\n")]);
    let out = doctor(
        As::Root,
        &["--check", "seccomp", "--audit-log", log.to_str().unwrap()],
        &[("SBX_DOCTOR_ROOT", fk.path().to_str().unwrap())],
    );
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    sbx_testutil::assert_event(&log, "doctor_report", "warn", |e| {
        e["failed"] == serde_json::json!(["seccomp"])
    });
    assert!(Path::new(&log).exists());
}
