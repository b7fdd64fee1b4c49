//! The JSON-lines audit log.
//!
//! One event is one line, written with one `write(2)` on an `O_APPEND` fd, so
//! the lines of every tool of a chain interleave whole. The first tool opens
//! the file (`--audit-log PATH` or `SBX_AUDIT_LOG`); it hands the open fd to
//! the next tool through `SBX_AUDIT_FD` only when that next command is a
//! real sbx tool, decided by file identity ([`crate::toolid`]), never by
//! name; so the sandboxed program itself never holds a writable handle to the
//! log and needs no path to it inside the sandbox.
//!
//! Without `--audit-log` (nor an fd handed down), the first tool keeps the
//! run's events in an anonymous in-memory file (memfd `sbx-audit-mem`,
//! at most [`MEM_CAP`] bytes) handed down the same way: the end-of-run
//! `<sandbox_violations>` summary is made from it as from a file, and
//! alerts are not echoed line by line into the command's stderr (see
//! [`Audit::alerts_live`]).

use std::ffi::OsStr;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::{Map, Value};

pub const ENV_PATH: &str = "SBX_AUDIT_LOG";
pub const ENV_FD: &str = "SBX_AUDIT_FD";

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warn,
    Alert,
}

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("open audit log {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("SBX_AUDIT_FD '{0}' is not an open, writable fd")]
    BadFd(String),
    #[error("SBX_AUDIT_FD '{0}': a file of {1} (a kernel interface, not a log)")]
    KernelFd(String, &'static str),
}

/// The name of the in-memory log (memfd) of a run without `--audit-log`.
pub const MEM_NAME: &str = "sbx-audit-mem";
/// Bytes the in-memory log keeps at most; later events reach stderr only.
pub const MEM_CAP: u64 = 8 << 20;

pub struct Audit {
    tool: &'static str,
    fd: Option<OwnedFd>,
    /// The log is the in-memory one (no `--audit-log`): alerts also go to
    /// stderr, and it is capped at [`MEM_CAP`].
    mem: bool,
    chain: std::sync::Mutex<crate::auditchain::Writer>,
    /// Where this run's lines start, when this tool owns the end-of-run
    /// summary (it opened the log, or took over from the tool that
    /// exec'd it); see [`crate::violations`].
    summary_from: Option<u64>,
    /// SBX_VIOLATIONS: the file the summary also goes to.
    summary_file: Option<PathBuf>,
    /// The process that opened the sink: only it hands the summary over
    /// when it execs (a forked child, such as sbx-fs's init starting the
    /// next tool, leaves it with the process that stays).
    pid: u32,
}

static GLOBAL: OnceLock<Audit> = OnceLock::new();

/// The tools that become the next command (exec, no supervision): one
/// that owns the run's summary can never print it.
const EXEC_IN_PLACE: &[&str] = &["sbx-seccomp"];

/// Opens the audit sink for `tool`: `path` (the flag, which clap also fills
/// from SBX_AUDIT_LOG), else an fd handed down by the previous tool, else none.
pub fn init(tool: &'static str, path: Option<&Path>) -> Result<&'static Audit, AuditError> {
    if let Some(a) = GLOBAL.get() {
        return Ok(a);
    }
    // Before any namespace or root change: which files are the real tools.
    crate::toolid::init();
    let mut fd = match path {
        Some(p) => Some(open_log(p)?),
        None => inherited_fd()?,
    };
    let mut created_mem = false;
    if fd.is_none() {
        fd = mem_log();
        created_mem = fd.is_some();
    }
    let mem = fd.as_ref().is_some_and(|f| is_mem(f.as_raw_fd()));
    let summary_from = match (&fd, path) {
        (Some(f), Some(_)) => Some(crate::auditchain::size_of(f.as_raw_fd())),
        (Some(_), None) if created_mem => Some(0),
        (Some(_), None) => std::env::var(crate::violations::ENV_START)
            .ok()
            .and_then(|v| v.parse().ok()),
        _ => None,
    };
    let summary_file = std::env::var_os(crate::violations::ENV_FILE).map(PathBuf::from);
    // Do not let the variables leak further than this tool decides: the
    // handoff sets them again for a next sbx tool.
    // SAFETY: start-up, single-threaded.
    unsafe {
        std::env::remove_var(ENV_FD);
        std::env::remove_var(ENV_PATH);
        std::env::remove_var(crate::violations::ENV_START);
        std::env::remove_var(crate::violations::ENV_FILE);
    }
    let chain = std::sync::Mutex::new(crate::auditchain::Writer::new(
        fd.as_ref().map(|f| f.as_raw_fd()),
    ));
    Ok(GLOBAL.get_or_init(|| Audit {
        tool,
        fd,
        mem,
        chain,
        summary_from,
        summary_file,
        pid: std::process::id(),
    }))
}

fn open_log(path: &Path) -> Result<OwnedFd, AuditError> {
    let err = |source| AuditError::Open {
        path: path.to_path_buf(),
        source,
    };
    // Readable too: each line is chained to the hash of the one before.
    // Non-blocking until it is known to be a regular file: a FIFO, a
    // device or /proc file would block the run or swallow its events.
    let open = |create: bool| {
        let mut o = OpenOptions::new();
        o.read(true).append(true);
        let mut flags = libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK;
        if create {
            // A new log: never through a dangling symlink.
            o.create_new(true).mode(0o600);
            flags |= libc::O_NOFOLLOW;
        }
        o.custom_flags(flags).open(path)
    };
    let f = match open(false) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => match open(true) {
            // Another run of the chain made it first: append to that one.
            // Still not there: the name is a dangling symlink.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                open(false).map_err(|e| match e.kind() {
                    io::ErrorKind::NotFound => io::Error::other(
                        "a dangling symlink (a new log is never created through one)",
                    ),
                    _ => e,
                })
            }
            other => other,
        },
        other => other,
    }
    .map_err(err)?;
    let m = f.metadata().map_err(err)?;
    if !m.file_type().is_file() {
        return Err(err(io::Error::other(format!(
            "not a regular file ({})",
            crate::input::kind_of(&m.file_type())
        ))));
    }
    // A file of /proc or /sys is "regular" by type, but no log: writes to
    // it change the kernel or vanish, and reading it back is no chain.
    if let Some(fs) = crate::input::kernel_fs(f.as_raw_fd()) {
        return Err(err(io::Error::other(format!(
            "a file of {fs} (a kernel interface, not a log)"
        ))));
    }
    let fd: OwnedFd = f.into();
    // SAFETY: F_SETFL on our own fd: only O_NONBLOCK is dropped.
    unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, libc::O_APPEND) };
    Ok(fd)
}

/// The in-memory log of a run without `--audit-log` (None when memfds are
/// unavailable: then alerts reach stderr only, with no summary).
fn mem_log() -> Option<OwnedFd> {
    let name = std::ffi::CString::new(MEM_NAME).ok()?;
    // SAFETY: a NUL-terminated name; the fd is owned below.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a fresh fd nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // Appends from every tool of the chain land whole at the end.
    // SAFETY: F_SETFL on our own fd.
    unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, libc::O_APPEND) };
    Some(fd)
}

/// Whether `fd` is the in-memory log (what `/proc/self/fd/N` names).
fn is_mem(fd: RawFd) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{fd}")).is_ok_and(|p| {
        p.to_string_lossy()
            .starts_with(&format!("/memfd:{MEM_NAME}"))
    })
}

fn inherited_fd() -> Result<Option<OwnedFd>, AuditError> {
    let Ok(v) = std::env::var(ENV_FD) else {
        return Ok(None);
    };
    let fd: RawFd = v.parse().map_err(|_| AuditError::BadFd(v.clone()))?;
    if fd < 3 {
        return Err(AuditError::BadFd(v));
    }
    // SAFETY: F_GETFL on an fd number only reads its flags (an error for a closed one).
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if fl < 0 || (fl & libc::O_ACCMODE) == libc::O_RDONLY {
        return Err(AuditError::BadFd(v));
    }
    // As for --audit-log: a file of /proc or /sys is no log.
    if let Some(fs) = crate::input::kernel_fs(fd) {
        return Err(AuditError::KernelFd(v, fs));
    }
    // Mark it CLOEXEC at once: only an explicit handoff passes it on.
    // SAFETY: fd is open (checked above) and handed to us; only its flag changes.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    // SAFETY: the fd was handed to us by the previous tool and is ours now.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// The process-wide audit sink, once [`init`] ran.
pub fn get() -> Option<&'static Audit> {
    GLOBAL.get()
}

/// Emits an event through the global sink (and to tracing). Fields must be a
/// JSON object (or null). Never fails: an audit write error is reported on
/// stderr, it does not stop the sandbox.
pub fn emit(event: &str, severity: Severity, fields: Value) {
    match GLOBAL.get() {
        Some(a) => a.emit(event, severity, fields),
        None => trace_event("sbx", event, severity, &fields, false),
    }
}

/// An alert budget ran out (a rate limit or a cap of `event` alerts): says
/// so with one `alert_budget_exhausted` alert, the first time only, per
/// event name and process. What follows is counted, not logged one by one.
pub fn budget_exhausted(event: &str, fields: Value) {
    static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    {
        let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
        if said.iter().any(|e| e == event) {
            return;
        }
        said.push(event.to_string());
    }
    let mut m = match fields {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    m.insert("suppressed_event".into(), Value::String(event.to_string()));
    emit("alert_budget_exhausted", Severity::Alert, Value::Object(m));
}

/// Mirrors an event to the diagnostics. When a log file receives it, the
/// copy is at info level (`-v`): a second line per event on stderr would
/// break "bad input is one line" and cost a hot path (a DNS flood) dearly.
/// Without a log, warnings and alerts still reach stderr.
fn trace_event(tool: &str, event: &str, severity: Severity, fields: &Value, logged: bool) {
    match (severity, logged) {
        (Severity::Alert, false) => tracing::warn!(tool, event, %fields, "ALERT"),
        (Severity::Warn, false) => tracing::warn!(tool, event, %fields),
        (Severity::Alert, true) => tracing::info!(tool, event, %fields, "ALERT"),
        _ => tracing::info!(tool, event, %fields),
    }
}

impl Audit {
    pub fn tool(&self) -> &'static str {
        self.tool
    }

    /// The fd of the log, if there is one (to hand to the next sbx tool).
    pub fn raw_fd(&self) -> Option<RawFd> {
        self.fd.as_ref().map(|f| f.as_raw_fd())
    }

    /// Whether the log is the in-memory one of a run without
    /// `--audit-log`: nobody reads it but the end-of-run summary, so
    /// alerts must also be lines on stderr.
    pub fn is_mem(&self) -> bool {
        self.mem
    }

    /// Whether alerts must also be lines on stderr as they happen: only
    /// when nothing will tell them at the end. With a log file, the file
    /// has them; with the in-memory log, the end-of-run summary lists them
    /// (printed by the tool that owns it, which supervises the run), so
    /// they are not mixed into the command's own output line by line.
    /// The exceptions: no log at all, and sbx-seccomp owning the in-memory
    /// log (run first, it becomes the command: no summary is printed).
    pub fn alerts_live(&self) -> bool {
        self.fd.is_none()
            || (self.mem && self.summary_from.is_some() && EXEC_IN_PLACE.contains(&self.tool))
    }

    pub fn emit(&self, event: &str, severity: Severity, fields: Value) {
        trace_event(self.tool, event, severity, &fields, !self.alerts_live());
        self.record(event, severity, fields);
    }

    /// Writes the event to the log only (no tracing line on stderr).
    pub fn record(&self, event: &str, severity: Severity, fields: Value) {
        if self.fd.is_none() {
            return;
        }
        self.append_object(common(self.tool, event, severity, fields));
    }

    /// Appends a prepared event object (with its common keys) to the log,
    /// chained: `seq` and `prev` are set here (see [`crate::auditchain`]).
    /// For events relayed from elsewhere (a guest's log).
    pub fn append_object(&self, m: Map<String, Value>) {
        let Some(fd) = &self.fd else { return };
        if self.mem && crate::auditchain::size_of(fd.as_raw_fd()) >= MEM_CAP {
            return;
        }
        let mut w = self.chain.lock().unwrap_or_else(|e| e.into_inner());
        match w.append(fd.as_raw_fd(), chained(m)) {
            Ok(None) => {}
            Ok(Some(u)) => {
                if u.first {
                    self.lock_timeout(&mut w, fd.as_raw_fd(), &u);
                }
            }
            // (Not `eprintln!`: it panics when stderr is gone too.)
            Err(e) => crate::cli::stderr_line(&crate::cli::fail_line(
                self.tool,
                &format!("audit log {}: write failed: {e}", self.log_name()),
            )),
        }
    }

    /// The first line written without the log's lock (see
    /// [`crate::auditchain`]): one line on stderr naming the log and why,
    /// and an `audit_lock_timeout` alert in the log itself (written the
    /// same way: a holder that never lets go must cost no event).
    fn lock_timeout(
        &self,
        w: &mut crate::auditchain::Writer,
        fd: RawFd,
        u: &crate::auditchain::Unlocked,
    ) {
        let log = self.log_name();
        crate::cli::stderr_line(&crate::cli::fail_line(
            self.tool,
            &format!(
                "audit log {log}: {}: its lines are appended without the lock \
                 (a reader can hold one; the chain may show a break)",
                u.why
            ),
        ));
        let m = common(
            self.tool,
            "audit_lock_timeout",
            Severity::Alert,
            serde_json::json!({"path": log, "reason": u.why, "holder_pid": u.holder}),
        );
        let _ = w.append(fd, chained(m));
    }

    /// What to call the log in a message: its path (what /proc says the
    /// open file is), or "(in memory)".
    fn log_name(&self) -> String {
        if self.mem {
            return format!("({MEM_NAME}, in memory)");
        }
        self.fd
            .as_ref()
            .and_then(|f| std::fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd())).ok())
            .map_or_else(|| "(fd)".to_string(), |p| p.to_string_lossy().into_owned())
    }

    /// Environment for the next command spawned as `cmd` (built by
    /// [`crate::supervise::command`]): the fd (kept open across exec) and the
    /// trusted tool set when `cmd` execs a trusted sbx tool (by identity,
    /// see [`crate::toolid`]; `next_program` is only for messages), nothing
    /// otherwise. Returns the fd to keep.
    pub fn handoff(&self, next_program: &OsStr, cmd: &mut std::process::Command) -> Option<RawFd> {
        cmd.env_remove(ENV_PATH);
        cmd.env_remove(ENV_FD);
        cmd.env_remove(crate::toolid::ENV);
        if !crate::chain::is_sbx_tool(cmd.get_program()) {
            tracing::debug!(program = %next_program.to_string_lossy(), "not an sbx tool: no audit fd");
            return None;
        }
        cmd.env(crate::toolid::ENV, crate::toolid::env_value());
        let fd = self.raw_fd()?;
        cmd.env(ENV_FD, fd.to_string());
        Some(fd)
    }
}

/// At the end of a run (from `cli::run_main`): the tool that owns the
/// summary prints what the sandbox was refused (see [`crate::violations`]).
pub fn finish_run() {
    if !crate::chain::ran_next() {
        return;
    }
    let Some(a) = get() else { return };
    let (Some(fd), Some(start)) = (&a.fd, a.summary_from) else {
        return;
    };
    crate::violations::report(fd.as_raw_fd(), start, a.summary_file.as_deref(), a.mem);
}

/// For a tool that execs in place ([`crate::chain::exec`]): the audit
/// variables of `env` are dropped, then, when the next program is a trusted
/// sbx tool (`to_tool`), the trusted set and the audit fd (its close-on-exec
/// flag cleared) are set.
pub(crate) fn prepare_exec_env(
    env: &mut Vec<(std::ffi::OsString, std::ffi::OsString)>,
    to_tool: bool,
) {
    for k in [
        ENV_PATH,
        ENV_FD,
        crate::toolid::ENV,
        crate::violations::ENV_START,
        crate::violations::ENV_FILE,
    ] {
        crate::chain::unset_env(env, OsStr::new(k));
    }
    if !to_tool {
        return;
    }
    crate::chain::set_env(env, crate::toolid::ENV, crate::toolid::env_value());
    // The end-of-run summary is taken over by the tool we become.
    if let Some(a) = get()
        && let Some(start) = a.summary_from
        && a.pid == std::process::id()
    {
        crate::chain::set_env(env, crate::violations::ENV_START, start.to_string());
        if let Some(f) = &a.summary_file {
            crate::chain::set_env(env, crate::violations::ENV_FILE, f.as_os_str());
        }
    }
    if let Some(fd) = get().and_then(|a| a.raw_fd()) {
        // SAFETY: clears FD_CLOEXEC on our own open fd, just before exec.
        unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
        crate::chain::set_env(env, ENV_FD, fd.to_string());
    }
}

/// The line builder for [`crate::auditchain::Writer::append`]: the event
/// with its `seq` and `prev`.
fn chained(m: Map<String, Value>) -> impl FnOnce(u64, &str) -> String {
    move |seq, prev| {
        let mut m = m;
        m.insert("seq".into(), Value::from(seq));
        m.insert("prev".into(), Value::String(prev.to_string()));
        let mut s = Value::Object(m).to_string();
        s.push('\n');
        s
    }
}

/// One JSON line (unchained: no `seq`/`prev`; [`Audit::record`] chains):
/// the common keys, then the event's own fields.
pub fn render(tool: &str, event: &str, severity: Severity, fields: Value) -> String {
    let mut s = Value::Object(common(tool, event, severity, fields)).to_string();
    s.push('\n');
    s
}

/// The event object: common keys, then the event's fields (which cannot
/// override them, nor the chain's `seq`/`prev`).
fn common(tool: &str, event: &str, severity: Severity, fields: Value) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("ts".into(), Value::String(timestamp_now()));
    m.insert(
        "sbx_id".into(),
        Value::String(crate::id::get().unwrap_or("-").to_string()),
    );
    m.insert("tool".into(), Value::String(tool.to_string()));
    m.insert("pid".into(), Value::from(std::process::id()));
    m.insert("event".into(), Value::String(event.to_string()));
    m.insert(
        "severity".into(),
        serde_json::to_value(severity).unwrap_or(Value::Null),
    );
    if let Value::Object(extra) = fields {
        for (k, v) in extra {
            // The common keys cannot be overridden by an event's fields.
            if k != "seq" && k != "prev" {
                m.entry(k).or_insert(v);
            }
        }
    }
    m
}

/// RFC 3339 UTC with milliseconds, without a date-time dependency.
pub fn timestamp_now() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format_timestamp(now.as_secs() as i64, now.subsec_millis())
}

fn format_timestamp(secs: i64, millis: u32) -> String {
    let days = secs.div_euclid(86400);
    let rem = secs.rem_euclid(86400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(format_timestamp(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_timestamp(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(
            format_timestamp(1_796_232_000, 999),
            "2026-12-02T17:20:00.999Z"
        );
    }

    #[test]
    fn render_has_common_keys_that_fields_cannot_override() {
        let line = render(
            "sbx-test",
            "denied",
            Severity::Alert,
            serde_json::json!({"path": "/etc/shadow", "tool": "evil"}),
        );
        assert!(line.ends_with('\n'));
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["tool"], "sbx-test");
        assert_eq!(v["severity"], "alert");
        assert_eq!(v["event"], "denied");
        assert_eq!(v["path"], "/etc/shadow");
        assert!(v["pid"].as_u64().is_some());
        assert!(v["ts"].as_str().unwrap().ends_with('Z'));
    }
}
