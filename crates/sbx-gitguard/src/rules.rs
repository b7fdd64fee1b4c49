//! The data that decides what is protected, what may appear and which
//! configuration keys run code. Extend these tables, not the code.

/// What to do with a protected path of a git dir when it differs from the
/// snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// One file: restore its snapshot bytes and mode; remove it when the
    /// snapshot had none.
    Revert,
    /// A directory: every file in it is reverted; files that are new are
    /// removed, files that are gone are restored.
    RevertTree,
}

/// A protected path inside a git dir (relative to it).
pub struct Rule {
    pub path: &'static str,
    pub action: Action,
    /// The check it belongs to in reports.
    pub check: &'static str,
}

/// The clean-up list: paths inside every git dir (main, submodule, linked
/// worktree, nested) that are snapshotted and brought back.
pub const PROTECTED: &[Rule] = &[
    Rule {
        path: "config",
        action: Action::Revert,
        check: "config",
        // Why: repository configuration (may name programs git runs).
    },
    Rule {
        path: "config.worktree",
        action: Action::Revert,
        check: "extra_files",
        // Why: per-worktree configuration.
    },
    Rule {
        path: "commondir",
        action: Action::Revert,
        check: "extra_files",
        // Why: redirects the repository to another git dir.
    },
    Rule {
        path: "gitdir",
        action: Action::Revert,
        check: "extra_files",
        // Why: redirects the worktree link.
    },
    Rule {
        path: "shallow",
        action: Action::Revert,
        check: "extra_files",
        // Why: hides history.
    },
    Rule {
        path: "objects/info/alternates",
        action: Action::Revert,
        check: "extra_files",
        // Why: borrows objects from another store.
    },
    Rule {
        path: "objects/info/http-alternates",
        action: Action::Revert,
        check: "extra_files",
        // Why: borrows objects from elsewhere.
    },
    Rule {
        path: "info",
        action: Action::RevertTree,
        check: "extra_files",
        // Why: attributes (filters, diff drivers), exclude, grafts, sparse-checkout.
    },
    Rule {
        path: "hooks",
        action: Action::RevertTree,
        check: "hooks",
        // Why: programs git runs.
    },
];

/// Top-level entries of a git dir that git itself creates and removes in
/// normal work: they may appear without an alert. Anything else new at the
/// top level is removed. `*` at the end matches a prefix.
pub const TRANSIENT_TOP_LEVEL: &[&str] = &[
    "HEAD",
    "config",
    "description",
    "hooks",
    "info",
    "objects",
    "refs",
    "logs",
    "packed-refs",
    "index",
    "worktrees",
    "modules",
    "branches",
    "remotes",
    "ORIG_HEAD",
    "FETCH_HEAD",
    "MERGE_HEAD",
    "MERGE_MSG",
    "MERGE_MODE",
    "MERGE_RR",
    "AUTO_MERGE",
    "CHERRY_PICK_HEAD",
    "REVERT_HEAD",
    "REBASE_HEAD",
    "BISECT_*",
    "COMMIT_EDITMSG",
    "TAG_EDITMSG",
    "SQUASH_MSG",
    "NOTES_EDITMSG",
    "EDIT_DESCRIPTION",
    "rebase-merge",
    "rebase-apply",
    "sequencer",
    "rr-cache",
    "gc.pid",
    "gc.log",
    "lfs",
    "sharedindex.*",
    "fsmonitor--daemon*",
    "commondir",
    "gitdir",
    "config.worktree",
    "shallow",
    "index.stash.*",
    "next-index-*",
];

/// Whether a new top-level name is one git makes in normal work.
pub fn is_transient(name: &str) -> bool {
    TRANSIENT_TOP_LEVEL
        .iter()
        .any(|p| match p.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == *p,
        })
}

/// How the subsection of a dangerous key is matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sub {
    /// `section.name` only.
    No,
    /// `section.<anything>.name` only.
    Any,
    /// Both.
    Either,
}

/// A configuration key that makes git run a program, fetch from elsewhere
/// or change what it trusts.
pub struct Danger {
    pub section: &'static str,
    pub sub: Sub,
    /// Lower-case key name; "*" matches every name.
    pub name: &'static str,
    /// Dangerous only when the value starts with '!' (a shell command).
    pub bang_only: bool,
}

const fn d(section: &'static str, sub: Sub, name: &'static str) -> Danger {
    Danger {
        section,
        sub,
        name,
        bang_only: false,
    }
}

pub const DANGEROUS_KEYS: &[Danger] = &[
    d("core", Sub::No, "fsmonitor"),
    d("core", Sub::No, "hookspath"),
    d("core", Sub::No, "sshcommand"),
    d("core", Sub::No, "pager"),
    d("core", Sub::No, "editor"),
    d("core", Sub::No, "askpass"),
    d("core", Sub::No, "gitproxy"),
    d("core", Sub::No, "worktree"),
    d("core", Sub::No, "attributesfile"),
    d("credential", Sub::Either, "helper"),
    d("filter", Sub::Any, "*"),
    d("diff", Sub::Any, "textconv"),
    d("diff", Sub::Any, "command"),
    d("diff", Sub::No, "external"),
    d("merge", Sub::Any, "driver"),
    Danger {
        section: "alias",
        sub: Sub::Either,
        name: "*",
        bang_only: true,
    },
    Danger {
        section: "submodule",
        sub: Sub::Any,
        name: "update",
        bang_only: true,
    },
    d("include", Sub::No, "path"),
    d("includeif", Sub::Any, "*"),
    d("protocol", Sub::Either, "allow"),
    d("uploadpack", Sub::Either, "*"),
    d("receive", Sub::Either, "*"),
    d("sequence", Sub::No, "editor"),
    d("gpg", Sub::Either, "program"),
    d("pager", Sub::No, "*"),
    d("remote", Sub::Any, "uploadpack"),
    d("remote", Sub::Any, "receivepack"),
    d("remote", Sub::Any, "vcs"),
    d("mergetool", Sub::Any, "cmd"),
    d("difftool", Sub::Any, "cmd"),
    d("web", Sub::No, "browser"),
    d("browser", Sub::Any, "cmd"),
    d("man", Sub::Any, "cmd"),
    d("safe", Sub::No, "directory"),
    // Commands git runs for a signature, an archive format, a trailer,
    // a tool, an interactive filter, alternate refs or mail.
    d("gpg", Sub::Any, "defaultkeycommand"),
    d("tar", Sub::Any, "command"),
    d("trailer", Sub::Any, "command"),
    d("trailer", Sub::Any, "cmd"),
    d("core", Sub::No, "alternaterefscommand"),
    d("core", Sub::No, "alternaterefsprefixes"),
    d("interactive", Sub::No, "difffilter"),
    d("guitool", Sub::Any, "cmd"),
    d("mergetool", Sub::Any, "path"),
    d("difftool", Sub::Any, "path"),
    d("sendemail", Sub::Either, "*"),
    d("instaweb", Sub::No, "httpd"),
];

/// Whether a parsed key is dangerous (section and name lower-case).
pub fn is_dangerous(section: &str, sub: Option<&str>, name: &str, value: Option<&str>) -> bool {
    DANGEROUS_KEYS.iter().any(|k| {
        k.section == section
            && matches!(
                (k.sub, sub),
                (Sub::No, None) | (Sub::Any, Some(_)) | (Sub::Either, _)
            )
            && (k.name == "*" || k.name == name)
            && (!k.bang_only || value.is_some_and(|v| v.trim_start().starts_with('!')))
    })
}

/// The names git runs as hooks (a planted core.hooksPath directory loses
/// these when its config is reverted).
pub const HOOK_NAMES: &[&str] = &[
    "applypatch-msg",
    "pre-applypatch",
    "post-applypatch",
    "pre-commit",
    "pre-merge-commit",
    "prepare-commit-msg",
    "commit-msg",
    "post-commit",
    "pre-rebase",
    "post-checkout",
    "post-merge",
    "pre-push",
    "pre-receive",
    "update",
    "proc-receive",
    "post-receive",
    "post-update",
    "reference-transaction",
    "push-to-checkout",
    "pre-auto-gc",
    "post-rewrite",
    "sendemail-validate",
    "fsmonitor-watchman",
    "p4-changelist",
    "p4-prepare-changelist",
    "p4-post-changelist",
    "p4-pre-submit",
    "post-index-change",
];

/// Names of lock files git takes; one that stays is a concurrent git process.
pub fn is_lock(name: &str) -> bool {
    name.ends_with(".lock")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dangerous_keys_match() {
        assert!(is_dangerous("core", None, "fsmonitor", Some("x")));
        assert!(!is_dangerous("core", None, "bare", Some("false")));
        assert!(is_dangerous(
            "gpg",
            Some("ssh"),
            "defaultkeycommand",
            Some("x")
        ));
        assert!(is_dangerous("tar", Some("tgz"), "command", Some("x")));
        assert!(is_dangerous("trailer", Some("x"), "cmd", Some("x")));
        assert!(is_dangerous(
            "credential",
            Some("https://x"),
            "helper",
            Some("x")
        ));
        assert!(is_dangerous("filter", Some("lfs"), "clean", Some("x")));
        assert!(!is_dangerous("filter", None, "clean", Some("x")));
        assert!(is_dangerous("alias", None, "st", Some("!sh -c x")));
        assert!(!is_dangerous("alias", None, "st", Some("status")));
        assert!(is_dangerous(
            "includeif",
            Some("gitdir:/x"),
            "path",
            Some("y")
        ));
        assert!(is_dangerous("diff", Some("pdf"), "textconv", Some("y")));
    }

    #[test]
    fn transient() {
        assert!(is_transient("ORIG_HEAD"));
        assert!(is_transient("BISECT_LOG"));
        assert!(!is_transient("evil"));
    }
}
