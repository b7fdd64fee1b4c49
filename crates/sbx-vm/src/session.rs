//! The host side of the control channel: waits for the guest init, sends
//! the spec (and the copy-in archive), relays stdin/stdout/stderr and
//! signals, receives the copy-out archive and the guest audit log, and the
//! exit status; enforces --boot-timeout and --timeout.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signalfd::{SfdFlags, SignalFd};
use sbx_core::Severity;
use sbx_core::audit;
use sbx_vm_init::proto::{self, Decoder, ExitReport, Ready, Spec, kind};
use serde_json::{Value, json};

/// How long a guest has, after a timeout or a signal, to report back (its
/// audit log) before the VMM is killed.
pub const GRACE: Duration = Duration::from_secs(20);

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("the guest did not report back within {0:?} (boot timeout)")]
    BootTimeout(Duration),
    #[error("the VMM exited before the guest reported back ({0})")]
    VmmDied(String),
    #[error("the guest failed: {0}")]
    GuestFailed(String),
    #[error("the guest stopped without reporting an exit status ({0})")]
    Lost(String),
    #[error("control channel: {0}")]
    Proto(String),
    #[error("{0}")]
    CopyIn(String),
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("stopped by signal {0} before the guest was ready")]
    Signalled(i32),
    #[error("the supervising sbx tool died")]
    ParentDied,
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> SessionError {
    let what = what.into();
    move |source| SessionError::Io { what, source }
}

/// How the run ended.
#[derive(Debug)]
pub struct Outcome {
    pub report: Option<ExitReport>,
    pub timed_out: bool,
    /// The stop was the session TTL's (with `timed_out`).
    pub ttl_expired: bool,
    pub signalled: Option<i32>,
    pub audit_lines: usize,
    pub boot_ms: u128,
}

/// What the session needs to know about the VMM process.
pub struct Vmm {
    pub pidfd: OwnedFd,
    /// Describes the VMM's death (console tail, log) when it exits early.
    pub describe: Box<dyn Fn() -> String>,
}

impl Vmm {
    pub fn exited(&self) -> bool {
        sbx_core::pidfd::exited(self.pidfd.as_fd())
    }
}

fn signalfd() -> Result<SignalFd, SessionError> {
    SignalFd::with_flags(
        &sbx_core::signals::forwarded_set(),
        SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK,
    )
    .map_err(|e| SessionError::Io {
        what: "signalfd".into(),
        source: e.into(),
    })
}

/// What poll woke up for.
enum Wake {
    Ready,
    Vmm,
    Signal(i32),
    Parent,
    Deadline,
}

fn wait_fd(fd: RawFd, vmm: &Vmm, sig: &SignalFd, deadline: Instant) -> Result<Wake, SessionError> {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Ok(Wake::Deadline);
        }
        let ms = (deadline - now).as_millis().min(i32::MAX as u128) as i32 + 1;
        let mut p = vec![
            libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: vmm.pidfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: sig.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: sbx_core::supervise::parent_pidfd().unwrap_or(-1),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: p is a live array of p.len() pollfds.
        let n = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(io_err("poll")(e));
        }
        if p[2].revents != 0
            && let Ok(Some(info)) = sig.read_signal()
        {
            return Ok(Wake::Signal(info.ssi_signo as i32));
        }
        if p[0].revents != 0 {
            return Ok(Wake::Ready);
        }
        if p[3].revents != 0 {
            return Ok(Wake::Parent);
        }
        if p[1].revents != 0 {
            return Ok(Wake::Vmm);
        }
    }
}

/// Writes one guest audit line to our audit log, marked as from the guest
/// and tagged with our sandbox id (the guest cannot speak for another).
fn export_audit_line(line: &str) -> bool {
    let Ok(Value::Object(mut m)) = serde_json::from_str::<Value>(line) else {
        return false;
    };
    m.insert("guest".into(), Value::Bool(true));
    m.insert(
        "sbx_id".into(),
        Value::String(sbx_core::id::get().unwrap_or("-").into()),
    );
    for k in ["ts", "tool", "pid", "event", "severity"] {
        if !m.contains_key(k) {
            return false;
        }
    }
    let Some(a) = audit::get() else { return true };
    // With no log at all, a guest's alert is a line on stderr, as the host
    // tools' are; the in-memory log's summary lists it at the end.
    if a.alerts_live() && m.get("severity") == Some(&Value::from("alert")) {
        sbx_core::cli::stderr_line(&format!(
            "sbx-vm: ALERT (guest) {} {}",
            sbx_core::violations::escape(m.get("event").and_then(Value::as_str).unwrap_or("-")),
            sbx_core::violations::subject(&m)
        ));
    }
    // Chained like every line (sbx_core::auditchain): the guest's own
    // seq/prev are replaced by ours.
    a.append_object(m);
    true
}

pub struct Session<'a> {
    pub listener: UnixListener,
    pub vmm: &'a Vmm,
    pub spec: Spec,
    pub copy_in: Option<PathBuf>,
    /// The most archive bytes --copy-in may send (checked before boot).
    pub copy_in_cap: u64,
    pub copy_out: Option<PathBuf>,
    pub boot_timeout: Duration,
    pub timeout: Option<Duration>,
    /// Called once the guest said Ready (e.g. to delete the secrets file).
    pub on_ready: Box<dyn FnMut(&Ready) + 'a>,
    /// The credentials' session deadline and TTL: CMD and the VM are
    /// stopped when they outlive it (as --timeout does).
    pub ttl_deadline: Option<(Instant, Duration)>,
}

fn accept(s: &Session, sig: &SignalFd, deadline: Instant) -> Result<UnixStream, SessionError> {
    match wait_fd(s.listener.as_raw_fd(), s.vmm, sig, deadline)? {
        Wake::Ready => {
            let (c, _) = s
                .listener
                .accept()
                .map_err(io_err("accept on the control socket"))?;
            Ok(c)
        }
        Wake::Vmm => Err(SessionError::VmmDied((s.vmm.describe)())),
        Wake::Signal(n) => Err(SessionError::Signalled(n)),
        Wake::Parent => Err(SessionError::ParentDied),
        Wake::Deadline => Err(SessionError::BootTimeout(s.boot_timeout)),
    }
}

fn read_frame(
    c: &mut UnixStream,
    dec: &mut Decoder,
    s: &Session,
    sig: &SignalFd,
    deadline: Instant,
) -> Result<(u8, Vec<u8>), SessionError> {
    let mut buf = vec![0u8; 65536];
    loop {
        if let Some(f) = dec
            .next_frame()
            .map_err(|e| SessionError::Proto(e.to_string()))?
        {
            return Ok(f);
        }
        match wait_fd(c.as_raw_fd(), s.vmm, sig, deadline)? {
            Wake::Ready => {
                let n = c.read(&mut buf).map_err(io_err("read from the guest"))?;
                if n == 0 {
                    return Err(SessionError::VmmDied((s.vmm.describe)()));
                }
                dec.push(&buf[..n]);
            }
            Wake::Vmm => {
                // Take what the guest wrote before it went.
                match recv_nb(c, &mut buf) {
                    Ok(n) if n > 0 => {
                        dec.push(&buf[..n]);
                        continue;
                    }
                    _ => return Err(SessionError::VmmDied((s.vmm.describe)())),
                }
            }
            Wake::Signal(n) => return Err(SessionError::Signalled(n)),
            Wake::Parent => return Err(SessionError::ParentDied),
            Wake::Deadline => return Err(SessionError::BootTimeout(s.boot_timeout)),
        }
    }
}

fn send(c: &mut UnixStream, k: u8, data: &[u8]) -> Result<(), SessionError> {
    c.write_all(&proto::encode(k, data))
        .map_err(io_err("write to the guest"))
}

/// Sends `dir` as a GNU tar archive, at most `cap` bytes of it: the tree
/// was checked before boot against what the guest can take; one that grew
/// since is cut off here instead of filling the guest.
fn send_copy_in(c: &mut UnixStream, dir: &Path, cap: u64) -> Result<(), SessionError> {
    let mut tar = Command::new("tar")
        .arg("-C")
        .arg(dir)
        .args(["-c", "-f", "-", "--format=gnu", "--numeric-owner", "."])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io_err("copy-in: tar"))?;
    let mut out = tar.stdout.take().expect("piped");
    let mut buf = vec![0u8; proto::CHUNK];
    let mut sent = 0u64;
    loop {
        let n = out.read(&mut buf).map_err(io_err("copy-in: read tar"))?;
        if n == 0 {
            break;
        }
        sent += n as u64;
        if sent > cap {
            let _ = tar.kill();
            let _ = tar.wait();
            return Err(SessionError::CopyIn(format!(
                "--copy-in {}: grew past what was checked before the boot while it was copied (archive over {} bytes)",
                dir.display(),
                cap
            )));
        }
        send(c, kind::COPY_IN, &buf[..n])?;
    }
    let o = tar.wait_with_output().map_err(io_err("copy-in: tar"))?;
    if !o.status.success() {
        return Err(SessionError::Proto(format!(
            "copy-in: tar -c {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .next()
                .unwrap_or("")
        )));
    }
    send(c, kind::COPY_IN_END, b"")
}

/// Copy-out receiver: `tar -x` into the directory.
struct CopyOut {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl CopyOut {
    fn start(dir: &Path) -> Result<Self, SessionError> {
        std::fs::create_dir_all(dir).map_err(io_err(format!("--copy-out {}", dir.display())))?;
        let mut child = Command::new("tar")
            .arg("-C")
            .arg(dir)
            .args(["-x", "-f", "-", "--no-same-owner", "--no-overwrite-dir"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(io_err("copy-out: tar"))?;
        let stdin = child.stdin.take();
        Ok(Self { child, stdin })
    }

    fn finish(mut self) -> bool {
        drop(self.stdin.take());
        self.child.wait().is_ok_and(|s| s.success())
    }
}

pub fn run(mut s: Session) -> Result<Outcome, SessionError> {
    let sig = signalfd()?;
    let t0 = Instant::now();
    let boot_deadline = t0 + s.boot_timeout;
    let mut c = accept(&s, &sig, boot_deadline)?;
    let mut dec = Decoder::default();
    let ready: Ready = {
        let (k, data) = read_frame(&mut c, &mut dec, &s, &sig, boot_deadline)?;
        match k {
            kind::READY => serde_json::from_slice(&data)
                .map_err(|e| SessionError::Proto(format!("bad Ready: {e}")))?,
            kind::FAIL => {
                return Err(SessionError::GuestFailed(
                    String::from_utf8_lossy(&data).into_owned(),
                ));
            }
            _ => {
                return Err(SessionError::Proto(format!(
                    "unexpected frame {:?} before Ready",
                    k as char
                )));
            }
        }
    };
    let boot_ms = t0.elapsed().as_millis();
    (s.on_ready)(&ready);
    audit::emit(
        "vm_guest_ready",
        Severity::Info,
        json!({"boot_ms": boot_ms, "guest_uptime_ms": ready.uptime_ms, "secrets": ready.secrets, "secrets_source": ready.secrets_source}),
    );
    s.spec.now_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64;
    let spec = serde_json::to_vec(&s.spec).map_err(|e| SessionError::Proto(e.to_string()))?;
    send(&mut c, kind::START, &spec)?;
    if let Some(d) = s.copy_in.clone() {
        send_copy_in(&mut c, &d, s.copy_in_cap)?;
    }

    // From here on: a writer thread owns the sending side; stdin is read by
    // its own thread; this thread reads the guest.
    let (tx, rx) = mpsc::channel::<Vec<u8>>();
    let mut wc = c.try_clone().map_err(io_err("control socket"))?;
    std::thread::spawn(move || {
        for f in rx {
            if wc.write_all(&f).is_err() {
                break;
            }
        }
    });
    let stx = tx.clone();
    std::thread::spawn(move || {
        let mut stdin = io::stdin().lock();
        let mut buf = vec![0u8; proto::CHUNK];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => {
                    let _ = stx.send(proto::encode(kind::STDIN_EOF, b""));
                    break;
                }
                Ok(n) => {
                    if stx.send(proto::encode(kind::STDIN, &buf[..n])).is_err() {
                        break;
                    }
                }
            }
        }
    });

    let started = Instant::now();
    let ttl_at = s.ttl_deadline.map(|(d, _)| d);
    let mut deadline = match (s.timeout.map(|t| started + t), ttl_at) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let mut timed_out = false;
    let mut ttl_expired = false;
    let mut signalled = None;
    let mut in_grace = false;
    let mut audit_lines = 0;
    let mut copy_out: Option<CopyOut> = None;
    let mut stdout = io::stdout().lock();
    let mut stderr = io::stderr();
    let mut buf = vec![0u8; 65536];
    let report: Option<ExitReport> = 'outer: loop {
        let dl = deadline.unwrap_or(Instant::now() + Duration::from_secs(3600));
        let wake = wait_fd(c.as_raw_fd(), s.vmm, &sig, dl)?;
        match wake {
            Wake::Ready => {}
            Wake::Vmm => {}
            Wake::Signal(n) => {
                audit::emit("vm_signal_forwarded", Severity::Info, json!({"signal": n}));
                signalled = Some(n);
                let _ = tx.send(proto::encode(kind::SIGNAL, &[n as u8]));
                if !in_grace {
                    in_grace = true;
                    deadline = Some(Instant::now() + GRACE);
                }
                continue;
            }
            Wake::Parent => return Err(SessionError::ParentDied),
            Wake::Deadline => {
                if in_grace {
                    break 'outer None;
                }
                timed_out = true;
                in_grace = true;
                if let Some((at, ttl)) = s.ttl_deadline
                    && Instant::now() >= at
                {
                    // sbx-creds' event for a command that outlives the TTL.
                    ttl_expired = true;
                    audit::emit(
                        "ttl_expired",
                        Severity::Warn,
                        json!({"ttl": ttl.as_secs(), "action": "SIGKILL to the command, then the VM is destroyed"}),
                    );
                } else {
                    audit::emit(
                        "vm_timeout",
                        Severity::Alert,
                        json!({"timeout_ms": s.timeout.map(|t| t.as_millis() as u64)}),
                    );
                }
                let _ = tx.send(proto::encode(kind::SIGNAL, &[libc::SIGKILL as u8]));
                deadline = Some(Instant::now() + GRACE);
                continue;
            }
        }
        // Read all that is there.
        let mut eof = false;
        loop {
            match recv_nb(&c, &mut buf) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => dec.push(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    eof = true;
                    break;
                }
            }
        }
        while let Some((k, data)) = dec
            .next_frame()
            .map_err(|e| SessionError::Proto(e.to_string()))?
        {
            match k {
                kind::STDOUT => {
                    let _ = stdout.write_all(&data);
                    let _ = stdout.flush();
                }
                kind::STDERR => {
                    let _ = stderr.write_all(&data);
                }
                kind::AUDIT => {
                    for l in String::from_utf8_lossy(&data).lines() {
                        if export_audit_line(l) {
                            audit_lines += 1;
                        }
                    }
                }
                kind::COPY_OUT => {
                    if let Some(d) = &s.copy_out {
                        if copy_out.is_none() {
                            copy_out = Some(CopyOut::start(d)?);
                        }
                        if let Some(w) = copy_out.as_mut().and_then(|c| c.stdin.as_mut()) {
                            let _ = w.write_all(&data);
                        }
                    }
                }
                kind::COPY_OUT_END => {
                    if let Some(co) = copy_out.take() {
                        let ok = co.finish();
                        audit::emit(
                            "vm_copy_out",
                            if ok { Severity::Info } else { Severity::Warn },
                            json!({"dir": s.copy_out.as_ref().map(|d| d.display().to_string()), "ok": ok}),
                        );
                    } else if let Some(d) = &s.copy_out {
                        let _ = std::fs::create_dir_all(d);
                    }
                }
                kind::EXIT => {
                    let r: ExitReport = serde_json::from_slice(&data)
                        .map_err(|e| SessionError::Proto(format!("bad Exit: {e}")))?;
                    break 'outer Some(r);
                }
                kind::FAIL => {
                    return Err(SessionError::GuestFailed(
                        String::from_utf8_lossy(&data).into_owned(),
                    ));
                }
                _ => {
                    return Err(SessionError::Proto(format!(
                        "unexpected frame {:?}",
                        k as char
                    )));
                }
            }
        }
        if eof || (wake_is_vmm(&wake) && s.vmm.exited()) {
            break None;
        }
    };
    let _ = stdout.flush();
    if report.is_none() && !timed_out && signalled.is_none() {
        return Err(SessionError::Lost((s.vmm.describe)()));
    }
    Ok(Outcome {
        report,
        timed_out,
        ttl_expired,
        signalled,
        audit_lines,
        boot_ms,
    })
}

fn wake_is_vmm(w: &Wake) -> bool {
    matches!(w, Wake::Vmm)
}

/// A non-blocking read of the control socket that leaves the socket itself
/// blocking (the writer thread shares it: O_NONBLOCK on the shared file
/// would make its writes fail with EAGAIN).
fn recv_nb(c: &UnixStream, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: c keeps the socket open; buf is a live buffer of buf.len() bytes.
    let n = unsafe {
        libc::recv(
            c.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}
