//! What a tool's man page says beyond its flags (rendered by xtask).

pub struct ManInfo {
    /// One paragraph under DESCRIPTION.
    pub about: &'static str,
    /// The EXIT STATUS section.
    pub exit_status: &'static str,
    /// The INHERITED STATE section: what the next command inherits
    /// (namespaces, fds, environment, credentials, limits).
    pub inherited_state: &'static str,
    /// The tool's own variables, for the ENVIRONMENT section (the ones
    /// every tool reads, [`COMMON_ENVIRONMENT`], follow them).
    pub environment: &'static str,
    /// Further sections: (TITLE, text). Paragraphs are separated by blank lines.
    pub extra: &'static [(&'static str, &'static str)],
}

/// The variables every sbx tool reads or sets (ENVIRONMENT section).
pub const COMMON_ENVIRONMENT: &str = "\
- SBX_AUDIT_LOG: the audit log's path when --audit-log is not given; removed from the next command's environment.
- SBX_AUDIT_FD: the open audit log handed from one sbx tool to the next sbx tool of the chain (never to the sandboxed command); set by the tools, not by users.
- SBX_TOOL_IDS: the identities (device and inode) of the sbx tools the chain trusts to receive SBX_AUDIT_FD; set by the tools.
- SBX_ID: the run's identifier in every audit line; the first tool makes one when it is unset.
- SBX_LOG: diagnostics filter (tracing's EnvFilter syntax, e.g. debug or sbx_fs=trace); -v and -q when unset.
- SBX_KILL_AFTER: grace between a forwarded SIGINT/SIGTERM and SIGKILL when --kill-after is not given (default 10s).
- SBX_SUPERVISOR: the pid of the supervising sbx tool, set for a next command that is an sbx tool, which then ends when its supervisor dies.
- SBX_PASS_ENV: names an earlier layer asks the sandbox-building layer to pass (sbx-creds adds its secrets' names).
- SBX_REGISTRY_DIR, XDG_RUNTIME_DIR: where each user's registry of live sandboxes (stages, keep directories, scratch files) lives, for the cleanup of a run killed with SIGKILL.";
