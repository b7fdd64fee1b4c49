//! The command: open the session, run CMD with the secrets in its
//! environment under a [`Supervisor`], stop it at the TTL, revoke at the end.

use std::ffi::OsString;
use std::sync::Arc;
use std::time::Duration;

use sbx_core::Failure;
use sbx_core::Severity;
use sbx_core::audit::emit;
use sbx_core::supervise::{self, Supervisor, Wake};
use secrecy::{ExposeSecret, SecretString};
use serde_json::json;

use crate::session::{RevokeReport, Session};
use crate::spec;
use crate::{Cli, TOOL};

/// Variables that hold the token sbx-creds authenticates with: never passed on.
pub const SCRUBBED: &[&str] = &["VAULT_TOKEN", "BAO_TOKEN"];

/// Takes VAULT_TOKEN out of this process: its value into zeroizing memory,
/// the bytes of the original environment block (what /proc/PID/environ
/// shows) overwritten, the variables removed. Also makes this process
/// non-dumpable, so a command of the same uid can neither ptrace it nor
/// read its /proc files. Call at start-up, before any thread exists.
pub fn take_env_token() -> Option<SecretString> {
    let _ = nix::sys::prctl::set_dumpable(false);
    let token = std::env::var("VAULT_TOKEN").ok().map(SecretString::from);
    for name in SCRUBBED {
        wipe_environ_value(name);
        // SAFETY: called at start-up before any thread exists (see above),
        // so no other thread reads or writes the environment meanwhile.
        unsafe { std::env::remove_var(name) };
    }
    token
}

/// Overwrites `NAME=value` in place in the process's environment strings.
fn wipe_environ_value(name: &str) {
    unsafe extern "C" {
        static mut environ: *mut *mut libc::c_char;
    }
    let prefix = format!("{name}=");
    // SAFETY: single-threaded start-up (the caller's contract), so nothing
    // changes the environment meanwhile; `environ` is libc's NULL-terminated
    // array of NUL-terminated, writable strings; each slice covers exactly
    // `strlen` bytes of one of them and only bytes after `NAME=` are
    // overwritten, never a terminator.
    unsafe {
        let mut p = environ;
        if p.is_null() {
            return;
        }
        while !(*p).is_null() {
            let s = *p;
            let len = libc::strlen(s);
            let bytes = std::slice::from_raw_parts_mut(s.cast::<u8>(), len);
            if bytes.starts_with(prefix.as_bytes()) {
                for b in &mut bytes[prefix.len()..] {
                    std::ptr::write_volatile(b, b'\0');
                }
            }
            p = p.add(1);
        }
    }
}

/// Kept back, within the kernel's execve limit, for what is added after
/// the check: the program's path (the kernel copies it onto the new stack
/// too), a script's interpreter line and path, the variables the
/// supervisor and the audit hand-off set (as sbx-vm keeps for its guest).
const EXEC_RESERVE: u64 = 8 << 10;

/// What one execve takes in all, strings and the argv/envp pointers
/// (fs/exec.c, bprm_stack_limits): a quarter of the stack rlimit (which
/// the command inherits), at most three quarters of the kernel's 8 MiB
/// `_STK_LIM`, at least `ARG_MAX` (32 pages); glibc's
/// `sysconf(_SC_ARG_MAX)` is the same without the 6 MiB cap. Measured by
/// `tests::exec_limit_is_the_kernels`.
fn exec_limit() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct it is given, alive for the call.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_STACK, &mut r) } == 0;
    let stack = if ok && r.rlim_cur != libc::RLIM_INFINITY {
        r.rlim_cur
    } else {
        u64::MAX
    };
    (stack / 4).clamp(32 * 4096, 6 << 20)
}

/// Bytes of the new stack `NAME=VALUE` takes: the string, its NUL, its
/// envp pointer.
fn env_cost(k: &[u8], v: &[u8]) -> u64 {
    (k.len() + v.len() + 2 + std::mem::size_of::<usize>()) as u64
}

/// Bytes of the new stack argv and envp take in all.
fn exec_cost(argv: &[OsString], env: &[(OsString, OsString)]) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let ptr = std::mem::size_of::<usize>() as u64;
    argv.iter().map(|a| a.len() as u64 + 1 + ptr).sum::<u64>()
        + env
            .iter()
            .map(|(k, v)| env_cost(k.as_bytes(), v.as_bytes()))
            .sum::<u64>()
}

/// The secrets one by one ([`Session::check_env`]), then CMD and the whole
/// environment against the kernel's execve limit: bad input is one line
/// now, not an E2BIG (or std's "nul byte found") when CMD is spawned.
fn check_exec(
    session: &Session,
    argv: &[OsString],
    env: &[(OsString, OsString)],
) -> Result<(), Failure> {
    session.check_env()?;
    let limit = exec_limit();
    let total = exec_cost(argv, env) + EXEC_RESERVE;
    if total <= limit {
        return Ok(());
    }
    let secrets = session.env();
    let cost =
        |(k, v): &(String, SecretString)| env_cost(k.as_bytes(), v.expose_secret().as_bytes());
    let of_secrets: u64 = secrets.iter().map(cost).sum();
    // The first of the largest (max_by_key keeps the last).
    let what = match secrets.iter().rev().max_by_key(|kv| cost(kv)) {
        Some(kv) => format!(
            "the secrets ({} in all; the largest {} at {}, from {}) with CMD and the rest of the environment",
            spec::human(of_secrets),
            spec::shown(&kv.0),
            spec::human(cost(kv)),
            session.origin(&kv.0).unwrap_or("?")
        ),
        None => "CMD and the environment".to_string(),
    };
    Err(Failure::new(format!(
        "{what} come to {}, over the kernel's limit of {} for a command's arguments and environment together (a quarter of the stack limit, ulimit -s, at most 6 MiB; {} of it kept for the program's path and the tools' own variables)",
        spec::human(total),
        spec::human(limit),
        spec::human(EXEC_RESERVE)
    )))
}

fn report_failures(rep: &RevokeReport) {
    for f in &rep.failed {
        sbx_core::cli::stderr_line(&format!("{TOOL}: revocation failed: {f}"));
    }
}

pub fn run(cli: Cli, env_token: Option<SecretString>) -> Result<i32, Failure> {
    let req = cli.request()?;
    req.validate()?;
    // Before the runtime's threads exist.
    crate::guardian::record_start(&req.server.addr, req.ttl);
    crate::guardian::spawn(&req.server);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .thread_name("sbx-creds-io")
        .build()
        .map_err(|e| Failure::new(format!("tokio runtime: {e}")))?;
    let session = match rt.block_on(Session::open(&req, env_token)) {
        // open revoked what it had created.
        Ok(s) => Arc::new(s),
        Err(e) => {
            crate::guardian::done();
            return Err(e.into());
        }
    };
    // What a dead run left when its guardian died too.
    sbx_core::registry::reap(crate::guardian::KIND, |rec| {
        let forget = || {
            let _ = std::fs::remove_file(crate::guardian::record_tmp(rec));
            let _ = std::fs::remove_file(rec);
        };
        let Some(data) = crate::guardian::read_record(rec) else {
            // Killed before its first record was complete: it had created
            // nothing yet.
            forget();
            return Ok(());
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|t| t.as_secs())
            .unwrap_or(0);
        if data["expires_unix"].as_u64().is_some_and(|e| e < now) {
            // Past the dead run's TTL: its credentials expired by themselves.
            forget();
            return Ok(());
        }
        let r = rt.block_on(session.revoke_stale(&data));
        if r.is_ok() {
            forget();
        }
        r
    });
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let maint = rt.spawn(session.clone().maintain(stop_rx));

    let finish = |code: Result<i32, Failure>| -> Result<i32, Failure> {
        let _ = stop_tx.send(true);
        let _ = rt.block_on(maint);
        let rep = rt.block_on(session.revoke_all());
        crate::guardian::done();
        report_failures(&rep);
        code
    };

    if let Some(sig) = sbx_core::signals::pending_termination() {
        emit(
            "cancelled",
            Severity::Warn,
            json!({"signal": sig, "note": "a terminating signal arrived before the command started"}),
        );
        return finish(Ok(128 + sig));
    }

    // The child's environment: ours without the token variables, plus the
    // secrets.
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| !SCRUBBED.iter().any(|s| k == *s))
        .collect();
    let mut names: Vec<String> = std::env::var(sbx_core::envpolicy::ENV_PASS)
        .map(|v| v.split(',').map(str::to_string).collect())
        .unwrap_or_default();
    for (k, v) in session.env() {
        sbx_core::chain::set_env(&mut env, k.as_str(), v.expose_secret());
        names.push(k.to_string());
    }
    // sbx-fs (and sbx-gvisor) pass only an allowlist of the caller's
    // variables: these are named for them, so the secrets reach the command.
    names.retain(|n| !n.is_empty());
    if !names.is_empty() {
        sbx_core::chain::set_env(&mut env, sbx_core::envpolicy::ENV_PASS, names.join(","));
    }
    // The server's answer is untrusted input: checked before anything of
    // the command exists (the failure revokes everything, in `finish`).
    let cmd = check_exec(&session, &cli.cmd, &env)
        .and_then(|()| supervise::command(&cli.cmd, Some(&env)));
    for (_, v) in env.drain(..) {
        let mut b = std::os::unix::ffi::OsStringExt::into_vec(v);
        zeroize::Zeroize::zeroize(&mut b);
    }
    let mut cmd = match cmd {
        Ok(c) => c,
        Err(f) => return finish(Err(f)),
    };
    // The command starts with an empty signal mask whatever this process
    // inherited or blocked (std does not reset it on every path).
    // SAFETY: the closure runs in the forked child before exec and only
    // calls sigemptyset and pthread_sigmask on a local set: async-signal-
    // safe, no allocation, no lock; an all-zero sigset_t is a valid value.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
            Ok(())
        });
    }
    let keep: Vec<i32> = sbx_core::audit::get()
        .and_then(|a| a.handoff(&cli.cmd[0], &mut cmd))
        .into_iter()
        .collect();
    let mut sup = match Supervisor::spawn(cmd, &keep) {
        Ok(s) => s,
        Err(f) => return finish(Err(f)),
    };
    session.audit_injected();

    let deadline = (!cli.args.no_enforce_ttl).then(|| session.deadline());
    let code = match sup.wait(deadline) {
        Ok(Wake::Exited(st)) => Ok(sbx_core::exit::from_status(st)),
        Ok(Wake::Deadline) => {
            emit(
                "ttl_expired",
                Severity::Warn,
                json!({"ttl": req.ttl.as_secs(), "pid": sup.pid(), "action": "SIGTERM, then SIGKILL after the grace period"}),
            );
            sup.terminate(cli.kill_grace())
                .map(sbx_core::exit::from_status)
                .map_err(|e| Failure::new(format!("stopping the command: {e}")))
        }
        Ok(Wake::ParentDied) => sup
            .kill()
            .map(sbx_core::exit::from_status)
            .map_err(|e| Failure::new(format!("killing the command: {e}"))),
        Err(e) => {
            let _ = sup.kill();
            Err(Failure::new(format!("waiting for the command: {e}")))
        }
    };
    let out = finish(code);
    rt.shutdown_timeout(Duration::from_secs(1));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An environment whose strings and pointers (with `argv`'s) cost
    /// exactly `target` bytes, in values of about 100 KiB.
    fn env_of_cost(target: u64, argv: &[OsString]) -> Vec<(OsString, OsString)> {
        let left = target - exec_cost(argv, &[]);
        let each = env_cost(b"V0000", b"");
        let n = left.div_ceil(100 << 10);
        let room = left - n * each;
        (0..n)
            .map(|i| {
                let len = room / n + if i == 0 { room % n } else { 0 };
                (
                    OsString::from(format!("V{i:04}")),
                    OsString::from("x".repeat(len as usize)),
                )
            })
            .collect()
    }

    /// The bound is the kernel's, measured: argv and envp (with the
    /// program's path, which the kernel copies too) exactly at the limit
    /// start; one byte more is E2BIG.
    #[test]
    fn exec_limit_is_the_kernels() {
        let limit = exec_limit();
        let prog = "/bin/true";
        let argv = vec![OsString::from(prog)];
        let path = prog.len() as u64 + 1;
        for (cost, fits) in [(limit - path, true), (limit - path + 1, false)] {
            let env = env_of_cost(cost, &argv);
            assert_eq!(exec_cost(&argv, &env), cost);
            let r = std::process::Command::new(prog)
                .env_clear()
                .envs(env.iter().map(|(k, v)| (k, v)))
                .status();
            if fits {
                assert!(r.unwrap().success(), "limit {limit}: refused at the limit");
            } else {
                assert_eq!(
                    r.map(|_| ()).unwrap_err().raw_os_error(),
                    Some(libc::E2BIG),
                    "limit {limit}: one byte over it started"
                );
            }
        }
    }
}
