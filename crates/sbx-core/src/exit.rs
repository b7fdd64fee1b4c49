//! Exit status rules (the GNU `env`/`chroot`/`timeout` family).

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

/// The tool itself failed: bad usage, bad config, setup failure.
pub const TOOL_FAILED: i32 = 125;
/// CMD was found but could not be executed.
pub const NOT_EXECUTABLE: i32 = 126;
/// CMD was not found.
pub const NOT_FOUND: i32 = 127;

/// The status a chain-loader reports for its child: the exit code unchanged,
/// 128+N for death by signal N.
pub fn from_status(status: ExitStatus) -> i32 {
    if let Some(code) = status.code() {
        code
    } else if let Some(sig) = status.signal() {
        128 + sig
    } else {
        TOOL_FAILED
    }
}

/// Same as [`from_status`] for a raw `wait(2)` status word.
pub fn from_raw_wait(status: i32) -> i32 {
    from_status(ExitStatus::from_raw(status))
}

/// The status for an `execve` that failed with `errno`.
pub fn for_exec_errno(errno: i32) -> i32 {
    match errno {
        libc::ENOENT | libc::ENOTDIR | libc::ELOOP | libc::ENAMETOOLONG => NOT_FOUND,
        _ => NOT_EXECUTABLE,
    }
}

/// A failure of the tool itself, carried up to `main` and turned into one
/// line on stderr and an exit status in one place ([`crate::cli::run_main`]).
#[derive(Debug)]
pub struct Failure {
    pub code: i32,
    pub message: String,
}

impl Failure {
    /// Exit 125 with `message`.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            code: TOOL_FAILED,
            message: message.into(),
        }
    }

    /// A failure with a specific status (126/127 for exec failures).
    pub fn with_code(code: i32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// Any typed library error becomes a 125 failure whose message is the error
/// and its sources joined by ": " (so it names the operation and the path).
impl<E: std::error::Error> From<E> for Failure {
    fn from(err: E) -> Self {
        Failure::new(error_chain(&err))
    }
}

/// `err: source: source ...`, the raw text: a newline in a message stays
/// one (never a space), and the one stderr line escapes it as `\n`
/// ([`crate::cli::fail_line`]), as it escapes every other control character.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut msg = err.to_string();
    let mut src = err.source();
    while let Some(s) = src {
        let s_msg = s.to_string();
        if !msg.ends_with(&s_msg) {
            msg.push_str(": ");
            msg.push_str(&s_msg);
        }
        src = s.source();
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_and_exit_mapping() {
        assert_eq!(from_raw_wait(0), 0);
        assert_eq!(from_raw_wait(42 << 8), 42);
        assert_eq!(from_raw_wait(libc::SIGKILL), 128 + 9);
        assert_eq!(for_exec_errno(libc::ENOENT), 127);
        assert_eq!(for_exec_errno(libc::EACCES), 126);
        assert_eq!(for_exec_errno(libc::ENOEXEC), 126);
    }

    #[test]
    fn error_chain_joins_sources() {
        let inner = std::io::Error::from_raw_os_error(libc::ENOENT);
        #[derive(Debug, thiserror::Error)]
        #[error("open /x")]
        struct Outer(#[source] std::io::Error);
        let f: Failure = Outer(inner).into();
        assert_eq!(f.code, 125);
        assert!(
            f.message.starts_with("open /x: No such file"),
            "{}",
            f.message
        );
    }
}
