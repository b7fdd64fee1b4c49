//! One run: run directory, VMM, session, teardown, exit status.

use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sbx_core::Severity;
use sbx_core::audit;
use sbx_core::exit::Failure;
use sbx_core::supervise::{Supervisor, Wake};
use sbx_vm_init::proto::Spec;
use serde_json::json;

use crate::options::{Plan, Vmm};
use crate::rundir::RunDir;
use crate::session::{self, Session, SessionError};

/// Exit status when --timeout fired.
pub const TIMED_OUT: i32 = 124;

/// The last non-empty line of a file (the kernel console, a VMM log).
pub fn tail(p: &Path) -> Option<String> {
    let t = std::fs::read_to_string(p).ok()?;
    t.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(|l| {
            let l: String = l.chars().filter(|c| !c.is_control()).collect();
            l.chars().take(200).collect()
        })
}

fn write_private(p: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(p)?;
    f.write_all(data)
}

/// The VMM process and what belongs to it.
pub struct Running {
    pub sup: Supervisor,
    /// Extra clean-up (Firecracker's jail directory).
    pub cleanup: Option<Box<dyn FnOnce()>>,
}

/// One run. With the sbx-creds options: the session logs in and fetches
/// first (before anything is created for the VM), its secrets join the
/// document fw_cfg / MMDS deliver, its leases and tokens are renewed while
/// the VM runs and all revoked when the run ends, however it ends.
pub fn run(mut plan: Plan) -> Result<i32, Failure> {
    // Before the sbx-creds runtime's thread: the fork is safe only then.
    let reaper = crate::firecracker::reaper(&plan)?;
    let Some(cp) = plan.creds.take() else {
        return run_vm(plan, None, reaper);
    };
    let creds = crate::creds::open(cp)?;
    if let Some(sig) = sbx_core::signals::pending_termination() {
        // As sbx-creds: a terminating signal while the secrets were
        // fetched, so no VM starts.
        audit::emit(
            "cancelled",
            Severity::Warn,
            json!({"signal": sig, "note": "a terminating signal arrived before the VM started"}),
        );
        creds.close();
        return Ok(128 + sig);
    }
    // The fetched values are checked as --secrets-from's are, before the
    // VM starts (a failure revokes them below).
    let doc = creds
        .document(plan.secrets.as_deref().map(String::as_str))
        .and_then(|(doc, names)| {
            crate::limits::check_exec(
                &plan.argv,
                &plan.env,
                Some(&doc),
                "the secrets fetched with the sbx-creds options",
            )?;
            Ok((doc, names))
        });
    let r = match doc {
        Ok((doc, names)) => {
            plan.secrets = Some(doc);
            plan.secret_names = names;
            run_vm(plan, Some(&creds), reaper)
        }
        Err(f) => Err(f),
    };
    creds.close();
    r
}

/// The VM's run; `reaper` is the jail reaper for Firecracker under the
/// jailer (released once the jail is cleaned up).
fn run_vm(
    plan: Plan,
    creds: Option<&crate::creds::Creds>,
    reaper: Option<sbx_core::guardian::Guardian>,
) -> Result<i32, Failure> {
    let (backend, accel) = match plan.vmm {
        Vmm::Qemu { kvm } => ("qemu", if kvm { "kvm" } else { "tcg" }),
        Vmm::Firecracker => ("firecracker", "kvm"),
    };
    audit::emit(
        "vm_backend_selected",
        Severity::Info,
        json!({"backend": backend, "accel": accel, "reason": plan.reason, "kvm": plan.kvm.reason, "vmm": plan.vmm_bin.display().to_string()}),
    );
    let (mut rd, reaped) = RunDir::create()?;
    for r in reaped {
        audit::emit("vm_stale_reaped", Severity::Warn, json!({"dir": r}));
    }
    let console = rd.join("console.log");
    let vmm_log = rd.join("vmm.log");
    let secrets_file = match &plan.secrets {
        Some(doc) => {
            let p = rd.join("secrets.json");
            write_private(&p, doc.as_bytes())
                .map_err(|e| Failure::new(format!("secrets file: {e}")))?;
            Some(p)
        }
        None => None,
    };
    let t0 = Instant::now();
    let (listener, mut running) = match plan.vmm {
        Vmm::Qemu { .. } => {
            let chan = rd.join("chan.sock");
            let listener = UnixListener::bind(&chan)
                .map_err(|e| Failure::new(format!("bind {}: {e}", chan.display())))?;
            let cmd =
                crate::qemu::command(&plan, &chan, &console, &vmm_log, secrets_file.as_deref())
                    .map_err(|e| Failure::new(format!("VMM log: {e}")))?;
            let r = Running {
                sup: Supervisor::spawn(cmd, &[])?,
                cleanup: None,
            };
            (listener, r)
        }
        Vmm::Firecracker => crate::firecracker::start(&plan, &rd, &console, &vmm_log, reaper)?,
    };
    audit::emit(
        "vm_started",
        Severity::Info,
        json!({"backend": backend, "vmm_pid": running.sup.pid(), "mem_mib": plan.mem >> 20, "vcpus": plan.vcpus,
               "tmpfs_mib": plan.tmpfs >> 20, "kernel": plan.files.kernel.display().to_string(),
               "rootfs": plan.files.rootfs.display().to_string(), "net": if plan.net { "sbx-net" } else { "none" }}),
    );
    let pidfd = sbx_core::pidfd::open(running.sup.pid())
        .map_err(|e| Failure::new(format!("pidfd_open: {e}")))?;
    let (c2, l2) = (console.clone(), vmm_log.clone());
    let vmm = session::Vmm {
        pidfd,
        describe: Box::new(move || describe(&c2, &l2)),
    };
    let spec = Spec {
        argv: plan.argv.clone(),
        env: plan.env.clone(),
        sbx_id: sbx_core::id::get().unwrap_or("-").to_string(),
        now_unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as u64,
        tmpfs_bytes: plan.tmpfs,
        copy_in: plan.copy_in.is_some(),
        copy_out: plan.copy_out.is_some(),
    };
    let sf: Option<PathBuf> = secrets_file.clone();
    let result = session::run(Session {
        listener,
        vmm: &vmm,
        spec,
        copy_in: plan.copy_in.clone(),
        copy_in_cap: plan.copy_in_cap,
        copy_out: plan.copy_out.clone(),
        boot_timeout: plan.boot_timeout,
        timeout: plan.timeout,
        on_ready: Box::new(move |_| {
            // The guest has read the secrets: no copy stays on the host.
            if let Some(p) = &sf {
                let _ = std::fs::remove_file(p);
            }
            if let Some(c) = creds {
                c.audit_injected();
            }
        }),
        ttl_deadline: creds
            .filter(|c| c.enforce_ttl)
            .map(|c| (c.deadline(), c.ttl())),
    });
    // Teardown: the guest powers off by itself after its Exit frame; give
    // it a moment, then kill.
    let grace = if result.is_ok() {
        Duration::from_secs(10)
    } else {
        Duration::ZERO
    };
    let vmm_status = match running.sup.wait(Some(Instant::now() + grace)) {
        Ok(Wake::Exited(st)) => Some(st),
        _ => running.sup.kill().ok(),
    };
    if let Some(c) = running.cleanup.take() {
        c();
    }
    let _ = rd.remove();
    let total_ms = t0.elapsed().as_millis();
    match result {
        Ok(o) => {
            let code = if o.timed_out {
                TIMED_OUT
            } else if let Some(r) = &o.report {
                r.status()
            } else if let Some(n) = o.signalled {
                128 + n
            } else {
                125
            };
            audit::emit(
                "vm_destroyed",
                if o.timed_out {
                    Severity::Warn
                } else {
                    Severity::Info
                },
                json!({"exit": code, "timed_out": o.timed_out, "guest_reported": o.report.is_some(),
                       "guest_audit_lines": o.audit_lines, "boot_ms": o.boot_ms, "total_ms": total_ms,
                       "vmm_status": vmm_status.map(|s| s.to_string())}),
            );
            if o.ttl_expired {
                sbx_core::cli::stderr_line(
                    "sbx-vm: the session TTL (--ttl) was reached: the command and the VM were killed",
                );
            } else if o.timed_out {
                sbx_core::cli::stderr_line(
                    "sbx-vm: --timeout fired: the command and the VM were killed",
                );
            }
            Ok(code)
        }
        Err(e) => {
            let sev = match e {
                SessionError::Signalled(_) | SessionError::ParentDied => Severity::Warn,
                _ => Severity::Alert,
            };
            // To the log only: the one stderr line is the failure itself.
            record(
                "vm_destroyed",
                sev,
                json!({"error": e.to_string(), "total_ms": total_ms, "vmm_status": vmm_status.map(|s| s.to_string())}),
            );
            match e {
                SessionError::Signalled(n) => Ok(128 + n),
                e => Err(Failure::new(sbx_core::exit::error_chain(&e))),
            }
        }
    }
}

fn describe(console: &Path, log: &Path) -> String {
    let mut parts = Vec::new();
    if let Some(l) = tail(log) {
        parts.push(format!("VMM: {l}"));
    }
    if let Some(l) = tail(console) {
        parts.push(format!("last console line: {l}"));
    }
    if parts.is_empty() {
        "no console output".into()
    } else {
        parts.join("; ")
    }
}

/// An audit event written to the log only (no diagnostic line on stderr).
pub fn record(event: &str, sev: Severity, fields: serde_json::Value) {
    if let Some(a) = audit::get() {
        a.record(event, sev, fields);
    }
}
