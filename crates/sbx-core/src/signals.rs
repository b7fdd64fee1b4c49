//! Signals a supervisor forwards to its child.
//!
//! They are blocked in the main thread at start-up, before any other thread
//! exists, so every thread inherits the mask and a signalfd receives them.
//! Children start with an empty mask (Supervisor::spawn resets it).

use nix::sys::signal::{SigSet, SigmaskHow, Signal, pthread_sigmask};

/// What a supervisor forwards to the sandbox.
pub const FORWARDED: &[Signal] = &[
    Signal::SIGHUP,
    Signal::SIGINT,
    Signal::SIGQUIT,
    Signal::SIGTERM,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGWINCH,
    Signal::SIGALRM,
    Signal::SIGCONT,
];

pub fn forwarded_set() -> SigSet {
    let mut s = SigSet::empty();
    for sig in FORWARDED {
        s.add(*sig);
    }
    s
}

/// Blocks the forwarded signals in the calling thread (call first in main).
pub fn block_forwarded() -> nix::Result<()> {
    pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&forwarded_set()), None)
}

/// Restores an empty mask (for a tool that execs in place).
pub fn unblock_all() -> nix::Result<()> {
    pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)
}

/// A terminating signal (TERM, INT, HUP, QUIT) that arrived while the
/// forwarded signals were blocked and is still pending: a tool that spent
/// time before starting its command (fetching secrets) then does not start
/// it.
pub fn pending_termination() -> Option<i32> {
    // SAFETY: sigpending fills the zeroed set it is given.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        if libc::sigpending(&mut set) != 0 {
            return None;
        }
        [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT]
            .into_iter()
            .find(|&s| libc::sigismember(&set, s) == 1)
    }
}
