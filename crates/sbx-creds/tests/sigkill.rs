//! SIGKILL of sbx-creds at several moments: its guardian revokes every token
//! and lease it created, checked through the real OpenBao, and says so in
//! an alert.

mod common;

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::Duration;

use common::*;

/// Every token accessor the server knows (the root token lists them).
fn accessors(b: &Bao) -> BTreeSet<String> {
    let (code, v) = b
        .try_call("LIST", "auth/token/accessors", Some(&b.root), None)
        .unwrap();
    assert_eq!(code, 200, "{v}");
    v["data"]["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap().to_string())
        .collect()
}

/// Whether the accessor still names a token. A kill while the server is
/// creating a token cancels the request half-way: the server can leave the
/// accessor index entry behind with no token entry (it logs "failed to
/// persist lease entry: context canceled"). The root token's lookup then
/// answers 403: there is no token to use, so it is not alive.
fn names_a_token(b: &Bao, accessor: &str) -> bool {
    let (code, v) = b
        .try_call(
            "POST",
            "auth/token/lookup-accessor",
            Some(&b.root),
            Some(&serde_json::json!({"accessor": accessor})),
        )
        .unwrap();
    match code {
        200 => true,
        403 | 400 => false,
        _ => panic!("lookup-accessor {accessor}: {code} {v}"),
    }
}

/// Starts an AppRole sbx-creds (role token_ttl 1h) with a child token and a
/// lease, running `sleep 60`; `wait` decides when to SIGKILL it. Returns
/// the accessors and leases created by the run that are still alive
/// `bound` after the kill.
fn kill_and_check(b: &Bao, w: &Work, wait: impl Fn(&Work)) -> (BTreeSet<String>, usize) {
    let who = As::Root;
    let rid = w.cred("role-id", &b.role_id("sbx"), who);
    let sid = w.cred("secret-id", &b.secret_id("sbx"), who);
    let before = accessors(b);
    let leases_before = b.lease_count("pki/issue/web/");
    let mut child = creds(b, w, who)
        .env("SBX_REGISTRY_DIR", registry(w))
        .args(["--auth", "approle", "--ttl", "10m", "--role-id-file"])
        .arg(&rid)
        .arg("--secret-id-file")
        .arg(&sid)
        .args([
            "--child-token",
            "CT",
            "--lease",
            "CERT=pki/issue/web?common_name=k.sbx.test#certificate",
            "--",
            "sleep",
            "60",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait(w);
    // SAFETY: kill(2) takes no pointers; `child` is not reaped yet.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    let mut alive = BTreeSet::new();
    let mut leases = 0;
    // The bound: the guardian revokes within a few seconds.
    wait_until(Duration::from_secs(10), || {
        alive = accessors(b)
            .difference(&before)
            .filter(|a| names_a_token(b, a))
            .cloned()
            .collect();
        leases = b
            .lease_count("pki/issue/web/")
            .saturating_sub(leases_before);
        alive.is_empty() && leases == 0
    });
    (alive, leases)
}

/// The accessor of the token that replaced the AppRole login token.
fn session_accessor(w: &Work) -> String {
    events(&w.audit(), "session_token")[0]["accessor"]
        .as_str()
        .unwrap()
        .to_string()
}

/// A private registry for the run (0700, ours).
fn registry(w: &Work) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let d = w.path("registry");
    let _ = std::fs::create_dir(&d);
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    d
}

/// Nothing is left in the registry once the guardian is done.
/// The files of the registry (sbx_core::registry keeps them in a
/// directory per user beneath SBX_REGISTRY_DIR).
fn registry_files(w: &Work) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(registry(w)).unwrap().flatten() {
        if e.path().is_dir() {
            out.extend(
                std::fs::read_dir(e.path())
                    .unwrap()
                    .flatten()
                    .map(|e| e.path()),
            );
        } else {
            out.push(e.path());
        }
    }
    out
}

fn registry_empty(w: &Work) -> bool {
    wait_until(Duration::from_secs(10), || registry_files(w).is_empty())
}

fn guardian_event(w: &Work) -> serde_json::Value {
    assert!(wait_until(Duration::from_secs(10), || !events(
        &w.audit(),
        "guardian_revoked"
    )
    .is_empty()));
    assert_event(&w.audit(), "guardian_revoked", "alert", |_| true)
}

/// Killed while the command runs (the tokens, checked on the server, live
/// no longer than --ttl although the role allows 1h): the session token,
/// the child token and the lease are revoked by the guardian; the alert names them.
#[test]
fn sigkill_while_the_command_runs() {
    let b = bao_or_skip!();
    let w = Work::new();
    let (alive, leases) = kill_and_check(b, &w, |w| {
        assert!(wait_until(Duration::from_secs(20), || events(
            &w.audit(),
            "secret_injected"
        )
        .len()
            >= 2));
        // Before the kill, through the server: the AppRole login token (the
        // role allows 1h) is gone already, replaced by a session token
        // that, like the child token, lives no longer than --ttl.
        let login = events(&w.audit(), "login")[0]["accessor"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(b.accessor_ttl(&login), None, "login token alive");
        let session = session_accessor(w);
        let ttl = b.accessor_ttl(&session).expect("session token alive");
        assert!(ttl <= 600, "session token ttl {ttl} > --ttl 10m");
        for e in events(&w.audit(), "secret_injected") {
            if let Some(acc) = e["accessor"].as_str() {
                let ttl = b.accessor_ttl(acc).expect("child token alive");
                assert!(ttl <= 600, "child token ttl {ttl} > --ttl 10m");
            }
        }
    });
    assert!(alive.is_empty(), "tokens alive after the kill: {alive:?}");
    assert_eq!(leases, 0, "leases alive after the kill");
    let ev = guardian_event(&w);
    let session = session_accessor(&w);
    let child = events(&w.audit(), "secret_injected")
        .into_iter()
        .find(|e| e["env"] == "CT")
        .unwrap()["accessor"]
        .as_str()
        .unwrap()
        .to_string();
    let text = ev["revoked"].to_string();
    assert!(text.contains(&session), "{ev}");
    assert!(text.contains(&child), "{ev}");
    assert!(text.contains("lease"), "{ev}");
    assert!(registry_empty(&w), "registry entries left");
}

/// Killed right after the login (the 1h AppRole token) and before the
/// command: revoked.
#[test]
fn sigkill_after_login() {
    let b = bao_or_skip!();
    let w = Work::new();
    let (alive, leases) = kill_and_check(b, &w, |w| {
        assert!(wait_until(Duration::from_secs(20), || !events(
            &w.audit(),
            "login"
        )
        .is_empty()));
    });
    assert!(alive.is_empty(), "tokens alive after the kill: {alive:?}");
    assert_eq!(leases, 0, "leases alive after the kill");
    let ev = guardian_event(&w);
    let session = events(&w.audit(), "login")[0]["accessor"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(ev["revoked"].to_string().contains(&session), "{ev}");
}

/// Killed right after the start, at several delays (before, around and
/// after the login): nothing the run created stays valid, with two
/// documented exceptions, each a token whose creation request was in
/// flight (the server made it, sbx-creds never received it, so no accessor
/// is recorded anywhere): killed during the login request (no login event),
/// the login token, alive until the role's TTL; killed during the request
/// that replaces the login token (a login event, no session_token event),
/// that orphan token, alive until --ttl at most (capped at its creation).
/// At most one such token; the test revokes it itself.
#[test]
fn sigkill_right_after_start() {
    let b = bao_or_skip!();
    for ms in [0, 5, 15, 30, 60, 120] {
        let w = Work::new();
        let (alive, leases) =
            kill_and_check(b, &w, |_| std::thread::sleep(Duration::from_millis(ms)));
        assert_eq!(leases, 0, "{ms} ms: leases alive after the kill");
        let logged_in = !events(&w.audit(), "login").is_empty();
        let replaced = !events(&w.audit(), "session_token").is_empty();
        if logged_in {
            guardian_event(&w);
        }
        if replaced {
            assert!(
                alive.is_empty(),
                "{ms} ms: tokens alive after the kill: {alive:?}"
            );
        }
        assert!(alive.len() <= 1, "{ms} ms: tokens alive: {alive:?}");
        for a in &alive {
            let (_, v) = b
                .try_call(
                    "POST",
                    "auth/token/lookup-accessor",
                    Some(&b.root),
                    Some(&serde_json::json!({"accessor": a})),
                )
                .unwrap();
            if logged_in {
                assert_eq!(
                    v["data"]["path"], "auth/token/create-orphan",
                    "{ms} ms: {v}"
                );
                assert!(v["data"]["ttl"].as_u64().unwrap() <= 600, "{ms} ms: {v}");
            } else {
                assert_eq!(v["data"]["path"], "auth/approle/login", "{ms} ms: {v}");
            }
            b.call(
                "POST",
                "auth/token/revoke-accessor",
                Some(serde_json::json!({"accessor": a})),
            );
        }
    }
}

/// SIGKILL of sbx-creds and of its guardian: the registry record (accessors
/// and lease ids, no token) lets the next sbx-creds start revoke them
/// (here with a token allowed `auth/token/revoke-accessor`: root), with a
/// `stale_revoked` alert; the record is then gone.
#[test]
fn next_run_revokes_what_a_dead_run_and_guardian_left() {
    let b = bao_or_skip!();
    let w = Work::new();
    let who = As::Root;
    let rid = w.cred("role-id", &b.role_id("sbx"), who);
    let sid = w.cred("secret-id", &b.secret_id("sbx"), who);
    let mut child = creds(b, &w, who)
        .env("SBX_REGISTRY_DIR", registry(&w))
        .args(["--auth", "approle", "--ttl", "10m", "--role-id-file"])
        .arg(&rid)
        .arg("--secret-id-file")
        .arg(&sid)
        .args(["--child-token", "CT", "--", "sleep", "60"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let ready = wait_until(Duration::from_secs(20), || {
        !events(&w.audit(), "secret_injected").is_empty()
    });
    let pid = child.id();
    let kids = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
    for k in kids.split_whitespace() {
        let comm = std::fs::read_to_string(format!("/proc/{k}/comm")).unwrap_or_default();
        if comm.trim() == "sbx-creds" {
            // SAFETY: kill(2) takes no pointers; `k` is a child of our
            // unreaped `child`, read from its /proc children list.
            unsafe { libc::kill(k.parse().unwrap(), libc::SIGKILL) };
        }
    }
    // SAFETY: kill(2) takes no pointers; `child` (pid) is not reaped yet.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let _ = child.wait();
    assert!(ready, "the command never started");
    let session = session_accessor(&w);
    let ct = events(&w.audit(), "secret_injected")[0]["accessor"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(b.accessor_ttl(&session).is_some() && b.accessor_ttl(&ct).is_some());
    assert!(events(&w.audit(), "guardian_revoked").is_empty());
    let rec = registry_files(&w)
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(rec.contains(&session), "no record: {rec}");

    let out = creds(b, &w, who)
        .env("SBX_REGISTRY_DIR", registry(&w))
        .env("VAULT_TOKEN", &b.root)
        .args(["--secret", "DB=secret/app#db", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(b.accessor_ttl(&session), None, "session token alive");
    assert_eq!(b.accessor_ttl(&ct), None, "child token alive");
    let ev = assert_event(&w.audit(), "stale_revoked", "alert", |_| true);
    assert!(ev["revoked"].to_string().contains(&session), "{ev}");
    assert!(registry_empty(&w), "registry entries left");
}

/// Runs an AppRole sbx-creds (role token_ttl 1h, --ttl 10m) with
/// `SBX_TEST_KILL_AT=points`: SIGKILLed right after the login, before
/// anything but the record (no event, no replacement of the login token).
/// Returns the accessors the server created meanwhile.
fn killed_right_after_login(b: &Bao, w: &Work, points: &str) -> BTreeSet<String> {
    let who = As::Root;
    let rid = w.cred("role-id", &b.role_id("sbx"), who);
    let sid = w.cred("secret-id", &b.secret_id("sbx"), who);
    let before = accessors(b);
    let st = creds(b, w, who)
        .env("SBX_REGISTRY_DIR", registry(w))
        .env("SBX_TEST_KILL_AT", points)
        .args(["--auth", "approle", "--ttl", "10m", "--role-id-file"])
        .arg(&rid)
        .arg("--secret-id-file")
        .arg(&sid)
        .args(["--child-token", "CT", "--", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(st.signal(), Some(libc::SIGKILL), "not killed: {st:?}");
    assert!(events(&w.audit(), "login").is_empty(), "killed too late");
    accessors(b).difference(&before).cloned().collect()
}

/// SIGKILL right after the AppRole login (the login token lives the role's
/// 1h: the login request cannot set a TTL): the guardian revokes it.
#[test]
fn sigkill_right_after_login_guardian_revokes_the_login_token() {
    let b = bao_or_skip!();
    let w = Work::new();
    let created = killed_right_after_login(b, &w, "creds-after-login");
    // (Listed only if the guardian had not revoked it yet.)
    assert!(created.len() <= 1, "{created:?}");
    let ev = guardian_event(&w);
    // It revoked exactly the login token it was told of, and that token
    // is gone.
    let tokens: Vec<String> = ev["revoked"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "token")
        .map(|r| r["accessor"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(tokens.len(), 1, "{ev}");
    assert!(created.iter().all(|a| *a == tokens[0]), "{created:?} {ev}");
    assert_eq!(b.accessor_ttl(&tokens[0]), None, "login token alive");
    assert!(ev["failed"].as_array().unwrap().is_empty(), "{ev}");
    assert!(registry_empty(&w), "registry entries left");
}

/// SIGKILL right after the AppRole login and of the guardian too: the
/// registry record names the login token's accessor; the next start
/// revokes it (`stale_revoked` alert) and the record goes.
#[test]
fn sigkill_right_after_login_and_of_the_guardian_next_start_revokes() {
    let b = bao_or_skip!();
    let w = Work::new();
    let created = killed_right_after_login(b, &w, "creds-after-login,creds-guardian");
    assert_eq!(created.len(), 1, "{created:?}");
    let login = created.iter().next().unwrap().clone();
    // Alive with the role's TTL (nobody revoked it), recorded.
    let ttl = b.accessor_ttl(&login).expect("login token alive");
    assert!(ttl > 600, "the role's 1h, not capped: {ttl}");
    // The guardian dies at its own kill point: wait until its lock is free.
    assert!(
        wait_until(Duration::from_secs(10), || registry_files(&w).iter().all(
            |p| {
                use std::os::fd::AsRawFd;
                let Ok(f) = std::fs::File::open(p) else {
                    return true;
                };
                // SAFETY: flock(2) on `f`, open for the call; no pointers.
                unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
            }
        )),
        "the guardian did not die"
    );
    assert!(events(&w.audit(), "guardian_revoked").is_empty());
    let rec = registry_files(&w)
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(rec.contains(&login), "no record of {login}: {rec}");
    let out = creds(b, &w, As::Root)
        .env("SBX_REGISTRY_DIR", registry(&w))
        .env("VAULT_TOKEN", &b.root)
        .args(["--secret", "DB=secret/app#db", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(b.accessor_ttl(&login), None, "login token alive");
    let ev = assert_event(&w.audit(), "stale_revoked", "alert", |_| true);
    assert!(ev["revoked"].to_string().contains(&login), "{ev}");
    assert!(registry_empty(&w), "registry entries left");
}
