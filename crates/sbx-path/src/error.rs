//! The one error type of the resolver: every refusal names the path, and the
//! rule (or component) that refused it, on one line; `kind()` is a stable
//! name for audit logs and scripts.

use std::fmt;
use std::io;
use std::path::PathBuf;

use crate::rules::{Mode, Rule};

#[derive(Debug)]
#[non_exhaustive]
pub enum PathError {
    /// The path is empty.
    Empty,
    /// The path contains a NUL byte.
    Nul { path: PathBuf },
    /// The path is relative and the resolver has no base directory.
    Relative { path: PathBuf },
    /// The path has a `..` component (refused whatever it would resolve to).
    Traversal { path: PathBuf },
    /// No rule covers the path.
    NotAllowed {
        path: PathBuf,
        mode: Mode,
        nearest_rule: Option<Rule>,
    },
    /// A write under a rule that allows reading only.
    ReadOnly { path: PathBuf, rule: Rule },
    /// A component of the path (the path itself or a directory on the way)
    /// is a symlink.
    Symlink { path: PathBuf, component: PathBuf },
    /// Resolution would have left the rule's tree (RESOLVE_BENEATH refused).
    Escape { path: PathBuf, rule: Rule },
    /// A component does not exist (for a read; for a write, the parent).
    NotFound { path: PathBuf, component: PathBuf },
    /// A component on the way is not a directory.
    NotADirectory { path: PathBuf, component: PathBuf },
    /// `create`/`mkdir` of a name that exists (or a symlink planted there).
    Exists { path: PathBuf },
    /// The system refused the open (permissions), not a rule.
    PermissionDenied { path: PathBuf, source: io::Error },
    /// Any other system error.
    Io {
        path: PathBuf,
        op: &'static str,
        source: io::Error,
    },
    /// A rule could not be set up (its path is invalid, has a symlink in
    /// it, or its parent does not exist).
    BadRule {
        path: PathBuf,
        mode: Mode,
        reason: String,
    },
    /// The base directory for relative paths is invalid.
    BadBase { path: PathBuf, reason: String },
}

impl PathError {
    /// Stable name of the error, for audit logs and scripts.
    pub fn kind(&self) -> &'static str {
        match self {
            PathError::Empty => "empty",
            PathError::Nul { .. } => "nul_byte",
            PathError::Relative { .. } => "relative",
            PathError::Traversal { .. } => "traversal",
            PathError::NotAllowed { .. } => "not_allowed",
            PathError::ReadOnly { .. } => "read_only",
            PathError::Symlink { .. } => "symlink",
            PathError::Escape { .. } => "escape",
            PathError::NotFound { .. } => "not_found",
            PathError::NotADirectory { .. } => "not_a_directory",
            PathError::Exists { .. } => "exists",
            PathError::PermissionDenied { .. } => "permission_denied",
            PathError::Io { .. } => "io",
            PathError::BadRule { .. } => "bad_rule",
            PathError::BadBase { .. } => "bad_base",
        }
    }

    /// Whether a policy rule refused the path (as opposed to the path not
    /// existing, the system refusing, or bad configuration). These are the
    /// refusals worth an alert: traversal, outside the allowlist, write to a
    /// read-only rule, symlink, escape.
    pub fn is_policy_denial(&self) -> bool {
        matches!(
            self,
            PathError::Traversal { .. }
                | PathError::NotAllowed { .. }
                | PathError::ReadOnly { .. }
                | PathError::Symlink { .. }
                | PathError::Escape { .. }
        )
    }

    /// Whether the error is about the resolver's configuration (rules, base)
    /// rather than about a path being validated.
    pub fn is_config_error(&self) -> bool {
        matches!(self, PathError::BadRule { .. } | PathError::BadBase { .. })
    }

    /// The path the error is about, if it has one.
    pub fn path(&self) -> Option<&std::path::Path> {
        match self {
            PathError::Empty => None,
            PathError::Nul { path }
            | PathError::Relative { path }
            | PathError::Traversal { path }
            | PathError::NotAllowed { path, .. }
            | PathError::ReadOnly { path, .. }
            | PathError::Symlink { path, .. }
            | PathError::Escape { path, .. }
            | PathError::NotFound { path, .. }
            | PathError::NotADirectory { path, .. }
            | PathError::Exists { path }
            | PathError::PermissionDenied { path, .. }
            | PathError::Io { path, .. }
            | PathError::BadRule { path, .. }
            | PathError::BadBase { path, .. } => Some(path),
        }
    }

    /// The rule involved, if any (the governing rule, or the nearest one).
    pub fn rule(&self) -> Option<&Rule> {
        match self {
            PathError::NotAllowed { nearest_rule, .. } => nearest_rule.as_ref(),
            PathError::ReadOnly { rule, .. } | PathError::Escape { rule, .. } => Some(rule),
            _ => None,
        }
    }
}

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathError::Empty => write!(f, "refused an empty path"),
            PathError::Nul { path } => {
                write!(f, "{}: refused: contains a NUL byte", path.display())
            }
            PathError::Relative { path } => write!(
                f,
                "{}: refused: not an absolute path (no base directory is set)",
                path.display()
            ),
            PathError::Traversal { path } => {
                write!(f, "{}: refused: contains a '..' component", path.display())
            }
            PathError::NotAllowed {
                path,
                mode,
                nearest_rule,
            } => {
                write!(
                    f,
                    "{}: refused for {mode}: not under any allowed path",
                    path.display()
                )?;
                match nearest_rule {
                    Some(r) => write!(f, " (nearest rule: {r})"),
                    None => write!(f, " (no rules)"),
                }
            }
            PathError::ReadOnly { path, rule } => write!(
                f,
                "{}: refused for write: rule {rule} allows reading only",
                path.display()
            ),
            PathError::Symlink { path, component } => write!(
                f,
                "{}: refused: {} is a symlink (symlinks are never followed)",
                path.display(),
                component.display()
            ),
            PathError::Escape { path, rule } => write!(
                f,
                "{}: refused: resolution would leave the tree of rule {rule}",
                path.display()
            ),
            PathError::NotFound { path, component } => {
                if path == component {
                    write!(f, "{}: does not exist", path.display())
                } else {
                    write!(
                        f,
                        "{}: {} does not exist",
                        path.display(),
                        component.display()
                    )
                }
            }
            PathError::NotADirectory { path, component } => write!(
                f,
                "{}: {} is not a directory",
                path.display(),
                component.display()
            ),
            PathError::Exists { path } => write!(f, "{}: already exists", path.display()),
            PathError::PermissionDenied { path, source } => {
                write!(f, "{}: the system refused access: {source}", path.display())
            }
            PathError::Io { path, op, source } => write!(f, "{}: {op}: {source}", path.display()),
            PathError::BadRule { path, mode, reason } => {
                write!(f, "rule {} ({mode}): {reason}", path.display())
            }
            PathError::BadBase { path, reason } => {
                write!(f, "base directory {}: {reason}", path.display())
            }
        }
    }
}

impl std::error::Error for PathError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        // The io errors are already part of the message.
        None
    }
}
