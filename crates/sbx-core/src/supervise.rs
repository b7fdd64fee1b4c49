//! Supervising the next command: fork+exec, signal forwarding, waiting with a
//! deadline, die-with-parent.
//!
//! Die-with-parent is done twice, because each way alone has holes:
//! `PR_SET_PDEATHSIG(SIGKILL)` on the child (set after fork, then the parent
//! is checked again so a parent that died in between is noticed), and a pidfd
//! on the supervising parent that every sbx supervisor polls in its wait loop
//! (`SBX_SUPERVISOR`). PDEATHSIG is cleared by a credential change (setuid
//! exec, or a uid switch inside a user namespace) and fires on the death of
//! the forking *thread*; the pidfd does neither.
//!
//! Stopping: a terminating signal (TERM, INT, HUP, QUIT) forwarded to a
//! command that ignores it would leave the command running until some
//! timeout. Every supervisor therefore escalates, as `timeout(1)
//! --kill-after` and `docker stop` do: [`Escalation`] sends SIGKILL when the
//! command still runs [`kill_after`] (default [`DEFAULT_KILL_AFTER`], set by
//! a tool's `--kill-after` or `SBX_KILL_AFTER`) after the first such signal,
//! and logs `kill_after` (warn).

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::sys::signalfd::{SfdFlags, SignalFd};

use crate::chain;
use crate::exit::{self, Failure};

/// Set by a supervisor in the environment of a next command that is an sbx
/// tool: the pid that tool should watch.
pub const ENV_SUPERVISOR: &str = "SBX_SUPERVISOR";

/// Grace between the first forwarded terminating signal and SIGKILL.
pub const DEFAULT_KILL_AFTER: Duration = Duration::from_secs(10);

/// Environment variable with the grace (a duration: `10s`, `500ms`), read
/// when no `--kill-after` was given.
pub const ENV_KILL_AFTER: &str = "SBX_KILL_AFTER";

static KILL_AFTER: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();

/// Sets the grace for this process (a tool's `--kill-after`). The first
/// call wins.
pub fn set_kill_after(d: Duration) {
    let _ = KILL_AFTER.set(d);
}

/// The grace: `--kill-after`, else `SBX_KILL_AFTER`, else 10 s.
pub fn kill_after() -> Duration {
    // SBX_KILL_AFTER was checked by `cli::check_env` (empty is unset).
    *KILL_AFTER.get_or_init(|| {
        std::env::var(ENV_KILL_AFTER)
            .ok()
            .and_then(|v| crate::units::parse_duration(&v).ok())
            .unwrap_or(DEFAULT_KILL_AFTER)
    })
}

/// Parses a `--kill-after` value (a duration, 0 = SIGKILL at once) and sets
/// it; the error names the flag.
pub fn parse_kill_after(v: &str) -> Result<Duration, Failure> {
    let d = crate::units::parse_duration(v)
        .map_err(|e| Failure::new(format!("--kill-after {v:?}: {e}")))?;
    set_kill_after(d);
    Ok(d)
}

/// Whether `sig` asks the command to stop (and so starts the grace).
pub fn is_terminating(sig: i32) -> bool {
    matches!(
        sig,
        libc::SIGTERM | libc::SIGINT | libc::SIGHUP | libc::SIGQUIT
    )
}

/// The SIGTERM-then-SIGKILL escalation every supervisor shares: feed it
/// each signal it forwards ([`Escalation::forwarded`]), bound its poll
/// timeout with [`Escalation::timeout_ms`], and when [`Escalation::due`]
/// says so, SIGKILL the command (the event is logged here).
#[derive(Debug, Clone)]
pub struct Escalation {
    grace: Duration,
    since: Option<(Instant, i32)>,
    done: bool,
}

impl Default for Escalation {
    fn default() -> Self {
        Self::new(kill_after())
    }
}

impl Escalation {
    pub fn new(grace: Duration) -> Self {
        Escalation {
            grace,
            since: None,
            done: false,
        }
    }

    /// A signal was forwarded to the command.
    pub fn forwarded(&mut self, sig: i32) {
        if self.since.is_none() && is_terminating(sig) {
            self.since = Some((Instant::now(), sig));
        }
    }

    /// When SIGKILL is due, if a terminating signal was forwarded.
    pub fn kill_at(&self) -> Option<Instant> {
        match self.since {
            Some((t, _)) if !self.done => Some(t + self.grace),
            _ => None,
        }
    }

    /// `other` (a poll timeout in ms, -1 = none) bounded by the kill time.
    pub fn timeout_ms(&self, other: i32) -> i32 {
        let Some(at) = self.kill_at() else {
            return other;
        };
        let ms = at
            .saturating_duration_since(Instant::now())
            .as_millis()
            .min(i32::MAX as u128 - 1) as i32
            + 1;
        if other < 0 { ms } else { other.min(ms) }
    }

    /// True once, when the grace has passed: the caller sends SIGKILL.
    /// Logs `kill_after` (warn) with the pid, the signal and the grace.
    pub fn due(&mut self, pid: i32) -> bool {
        match self.kill_at() {
            Some(at) if Instant::now() >= at => {
                self.done = true;
                let sig = self.since.map(|s| s.1).unwrap_or(0);
                crate::audit::emit(
                    "kill_after",
                    crate::Severity::Warn,
                    serde_json::json!({
                        "child_pid": pid,
                        "signal": sig,
                        "grace_ms": self.grace.as_millis() as u64,
                    }),
                );
                tracing::warn!(
                    pid,
                    sig,
                    "command still runs {:?} after the signal: SIGKILL",
                    self.grace
                );
                true
            }
            _ => false,
        }
    }
}

/// Why [`Supervisor::wait`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// The child exited (reaped).
    Exited(ExitStatus),
    /// The deadline passed; the child is still running.
    Deadline,
    /// Our own supervising parent died: the sandbox must go too.
    ParentDied,
}

/// Builds the `Command` for `argv`, resolved with the PATH of `env` (or of
/// this process when `env` is None). Not-found and not-executable are
/// reported here with 127/126, before anything is forked.
pub fn command(
    argv: &[OsString],
    env: Option<&[(OsString, OsString)]>,
) -> Result<Command, Failure> {
    let Some(prog) = argv.first() else {
        return Err(Failure::new("no command given after --"));
    };
    let path_var = match env {
        Some(e) => e.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.clone()),
        None => std::env::var_os("PATH"),
    };
    let resolved = chain::resolve(prog, path_var.as_deref())?;
    let mut cmd = Command::new(chain::spawn_program(resolved));
    cmd.arg0(prog).args(&argv[1..]);
    if let Some(e) = env {
        cmd.env_clear();
        cmd.envs(e.iter().map(|(k, v)| (k, v)));
    }
    Ok(cmd)
}

pub struct Supervisor {
    pid: i32,
    pidfd: OwnedFd,
    sigfd: SignalFd,
    parent: Option<RawFd>,
    status: Option<ExitStatus>,
    child_is_sbx: bool,
    escalation: Escalation,
}

static PARENT: std::sync::OnceLock<Option<OwnedFd>> = std::sync::OnceLock::new();

/// Opens (once, at start-up) the pidfd of our supervising parent, if an sbx
/// supervisor started us. Errs (the sandbox must not start) when that
/// parent is already gone.
pub fn init_parent_watch() -> Result<(), Failure> {
    if PARENT.get().is_none() {
        let p = parent_watch()?;
        let _ = PARENT.set(p);
    }
    Ok(())
}

/// The raw pidfd of our supervising parent, if any.
pub fn parent_pidfd() -> Option<RawFd> {
    PARENT.get().and_then(|p| p.as_ref().map(|f| f.as_raw_fd()))
}

fn parent_watch() -> Result<Option<OwnedFd>, Failure> {
    let Ok(v) = std::env::var(ENV_SUPERVISOR) else {
        return Ok(None);
    };
    // SAFETY: read once at start-up; the value must not reach the command.
    unsafe { std::env::remove_var(ENV_SUPERVISOR) };
    let Ok(pid) = v.parse::<i32>() else {
        return Ok(None);
    };
    // SAFETY: getppid cannot fail.
    let ppid = unsafe { libc::getppid() };
    // In a new PID namespace the parent is outside (ppid 0): the previous
    // tool is then responsible for us (a namespace init).
    if ppid == 0 {
        return Ok(None);
    }
    if ppid != pid {
        return Err(Failure::new("the supervising sbx tool died before start"));
    }
    crate::pidfd::open(pid)
        .map(Some)
        .map_err(|e| Failure::new(format!("pidfd_open of supervisor {pid}: {e}")))
}

impl Supervisor {
    /// Forks and execs `cmd`. Only 0-2 and `keep_fds` reach it. The
    /// forwarded signals must have been blocked at start-up
    /// ([`crate::signals::block_forwarded`], done by `run_main`).
    pub fn spawn(mut cmd: Command, keep_fds: &[RawFd]) -> Result<Self, Failure> {
        let keep: Vec<RawFd> = keep_fds.to_vec();
        // SAFETY: getpid cannot fail.
        let me = unsafe { libc::getpid() };
        // argv[0] names the tool even when the program path was resolved.
        cmd.env_remove(ENV_SUPERVISOR);
        if chain::is_sbx_tool(cmd.get_program()) {
            cmd.env(ENV_SUPERVISOR, me.to_string());
        }
        // SAFETY: the pre_exec closure only makes raw syscalls on integers and `keep`
        // (allocated before the fork): async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The parent may have died before the prctl took effect.
                if libc::getppid() != me {
                    libc::_exit(exit::TOOL_FAILED);
                }
                // The forwarded signals are blocked in the supervisor; std's
                // spawn does not reset the mask, so the child would start
                // with SIGTERM, SIGINT... blocked.
                let mut empty: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut empty);
                libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
                crate::fds::cloexec_all_except(&keep)
            });
        }
        init_parent_watch()?;
        let parent = parent_pidfd();
        let prog = cmd.get_program().to_string_lossy().into_owned();
        let child_is_sbx = chain::is_sbx_tool(cmd.get_program());
        let child = cmd.spawn().map_err(|e| {
            let errno = e.raw_os_error().unwrap_or(libc::EIO);
            let code = match errno {
                libc::EAGAIN | libc::ENOMEM => exit::TOOL_FAILED,
                n => exit::for_exec_errno(n),
            };
            Failure::with_code(code, format!("{prog}: {e}"))
        })?;
        let pid = child.id() as i32;
        // std's Child would not be waited for by Drop; we reap with waitpid.
        drop(child);
        let pidfd =
            crate::pidfd::open(pid).map_err(|e| Failure::new(format!("pidfd_open {pid}: {e}")))?;
        let sigfd = SignalFd::with_flags(
            &crate::signals::forwarded_set(),
            SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK,
        )
        .map_err(|e| Failure::new(format!("signalfd: {e}")))?;
        Ok(Self {
            pid,
            pidfd,
            sigfd,
            parent,
            status: None,
            child_is_sbx,
            escalation: Escalation::default(),
        })
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The child's exit status once reaped.
    pub fn status(&self) -> Option<ExitStatus> {
        self.status
    }

    /// Sends `sig` to the child (through its pidfd: no pid-reuse race).
    pub fn signal(&self, sig: Signal) -> io::Result<()> {
        if self.status.is_some() {
            return Ok(());
        }
        crate::pidfd::send_signal(self.pidfd.as_fd(), sig as i32)
    }

    /// Waits until the child exits, the deadline passes or our parent dies,
    /// forwarding the blocked signals to the child meanwhile.
    pub fn wait(&mut self, deadline: Option<Instant>) -> io::Result<Wake> {
        if let Some(st) = self.status {
            return Ok(Wake::Exited(st));
        }
        loop {
            if self.escalation.due(self.pid) {
                self.signal(Signal::SIGKILL)?;
            }
            let timeout_ms = match deadline {
                None => -1,
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Ok(Wake::Deadline);
                    }
                    (d - now).as_millis().min(i32::MAX as u128 - 1) as i32 + 1
                }
            };
            let timeout_ms = self.escalation.timeout_ms(timeout_ms);
            let mut fds = vec![
                libc::pollfd {
                    fd: self.pidfd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.sigfd.as_fd().as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            if let Some(p) = self.parent {
                fds.push(libc::pollfd {
                    fd: p,
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            // SAFETY: fds is a live array of fds.len() pollfds.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if fds[1].revents != 0 {
                while let Ok(Some(info)) = self.sigfd.read_signal() {
                    if let Ok(sig) = Signal::try_from(info.ssi_signo as i32) {
                        tracing::debug!(?sig, "forwarding signal");
                        self.signal(sig)?;
                        self.escalation.forwarded(sig as i32);
                    }
                }
            }
            if fds[0].revents != 0 {
                return self.reap().map(Wake::Exited);
            }
            if fds.len() > 2 && fds[2].revents != 0 {
                crate::deathwatch::supervisor_died("parent sbx tool");
                return Ok(Wake::ParentDied);
            }
        }
    }

    fn reap(&mut self) -> io::Result<ExitStatus> {
        let mut st = 0;
        loop {
            // SAFETY: self.pid is our own child; st is a live int.
            let r = unsafe { libc::waitpid(self.pid, &mut st, 0) };
            if r == self.pid {
                break;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        let status = ExitStatus::from_raw(st);
        self.status = Some(status);
        crate::sigsys::report_child_exit_of(self.pid, status, self.child_is_sbx);
        crate::deathwatch::child_tool_exited(self.pid, status, self.child_is_sbx);
        Ok(status)
    }

    /// SIGTERM, then SIGKILL after `grace`; returns the child's status.
    pub fn terminate(&mut self, grace: Duration) -> io::Result<ExitStatus> {
        if let Some(st) = self.status {
            return Ok(st);
        }
        self.signal(Signal::SIGTERM)?;
        if let Wake::Exited(st) = self.wait(Some(Instant::now() + grace))? {
            return Ok(st);
        }
        self.kill()
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) -> io::Result<ExitStatus> {
        if let Some(st) = self.status {
            return Ok(st);
        }
        self.signal(Signal::SIGKILL)?;
        self.reap()
    }

    /// Waits for the child; on parent death kills it. Returns the exit code
    /// per the chain rules (status, 128+N).
    pub fn run_to_end(&mut self) -> io::Result<i32> {
        match self.wait(None)? {
            Wake::Exited(st) => Ok(exit::from_status(st)),
            Wake::ParentDied | Wake::Deadline => {
                let st = self.kill()?;
                Ok(exit::from_status(st))
            }
        }
    }
}

impl Drop for Supervisor {
    /// A supervisor that unwinds never leaves its child running.
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = self.kill();
        }
    }
}
