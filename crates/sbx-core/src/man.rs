//! What a tool's man page says beyond its flags (rendered by xtask).

pub struct ManInfo {
    /// One paragraph under DESCRIPTION.
    pub about: &'static str,
    /// The EXIT STATUS section.
    pub exit_status: &'static str,
    /// The INHERITED STATE section: what the next command inherits
    /// (namespaces, fds, environment, credentials, limits).
    pub inherited_state: &'static str,
    /// Further sections: (TITLE, text). Paragraphs are separated by blank lines.
    pub extra: &'static [(&'static str, &'static str)],
}
