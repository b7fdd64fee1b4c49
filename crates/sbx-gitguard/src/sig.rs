//! Termination signals. sbx-core blocks the forwarded signals for a whole
//! supervisor's life; sbx-gitguard mostly reads (a `check --full` of a big
//! repository can take minutes), so SIGTERM, SIGINT, SIGHUP and SIGQUIT are
//! delivered (default action: the process ends) except while a short step
//! that must not be cut in half runs: one repair write, the snapshot's
//! rename, the command's supervision (where they are forwarded).

use nix::sys::signal::{SigSet, SigmaskHow, Signal, pthread_sigmask};

fn termination() -> SigSet {
    let mut s = SigSet::empty();
    for sig in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        s.add(sig);
    }
    s
}

/// Lets the termination signals in (a pending one ends the process now).
pub fn allow() {
    let _ = pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&termination()), None);
}

/// Holds the termination signals back until dropped (then the mask is
/// what it was, and a signal that came meanwhile is delivered).
pub struct Hold {
    old: Option<SigSet>,
}

impl Hold {
    pub fn new() -> Hold {
        let mut old = SigSet::empty();
        let ok = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&termination()), Some(&mut old));
        Hold {
            old: ok.ok().map(|()| old),
        }
    }
}

impl Hold {
    /// Takes the termination signal that came while held, if one did (it
    /// is consumed: the end of the hold does not deliver it).
    pub fn take(&self) -> Option<i32> {
        let set = termination();
        let zero = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let mut first = None;
        loop {
            // SAFETY: a valid signal set, no siginfo wanted (null), and a
            // live zero timeout: returns at once, a pending signal or -1.
            let s = unsafe { libc::sigtimedwait(set.as_ref(), std::ptr::null_mut(), &zero) };
            if s <= 0 {
                return first;
            }
            first.get_or_insert(s);
        }
    }
}

impl Default for Hold {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some(old) = self.old {
            let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
        }
    }
}
