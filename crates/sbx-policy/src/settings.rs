//! Finding, reading and merging Claude Code settings files.
//!
//! Precedence, highest first: managed > local > project > user (files given
//! with `--settings` replace that list and rank in the order given, the last
//! highest). Arrays merge across every file (union, in precedence order);
//! scalars come from the highest file that sets them. Which list a rule is
//! in (allow, ask, deny) is kept per rule: deny beats allow whatever the
//! files, in the mapping (`map.rs`).

use std::path::{Path, PathBuf};

use serde_json::Value;

/// A settings file could not be used: names the file, the line when known,
/// the rule or key, and what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{}{}: {what}", file.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct SettingsError {
    pub file: PathBuf,
    pub line: Option<usize>,
    pub what: String,
}

/// Where a file sits in the precedence order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    User,
    Project,
    Local,
    /// `--settings FILE` (the n-th given).
    Given(usize),
    Managed,
}

impl Scope {
    /// The flag or place that named a file of this scope (for errors).
    pub fn flag(self) -> &'static str {
        match self {
            Scope::Given(_) => "--settings",
            Scope::Managed => "--managed",
            _ => "settings file",
        }
    }

    pub fn name(self) -> String {
        match self {
            Scope::User => "user".into(),
            Scope::Project => "project".into(),
            Scope::Local => "local".into(),
            Scope::Given(n) => format!("given#{}", n + 1),
            Scope::Managed => "managed".into(),
        }
    }
}

/// Where one string of the settings came from: enough to name it in an error
/// and to resolve the `/path` prefix against.
#[derive(Debug, Clone)]
pub struct Origin {
    pub file: PathBuf,
    pub line: Option<usize>,
    /// The directory `/path` is relative to: the directory holding the
    /// file's `.claude` directory when it is in one (the project root for
    /// `.claude/settings.json`, the home for `~/.claude/settings.json`),
    /// else the file's own directory.
    pub base: PathBuf,
    pub scope: Scope,
}

impl Origin {
    pub fn err(&self, what: impl Into<String>) -> SettingsError {
        SettingsError {
            file: self.file.clone(),
            line: self.line,
            what: what.into(),
        }
    }
    pub fn at(&self) -> String {
        match self.line {
            Some(l) => format!("{}:{l}", self.file.display()),
            None => self.file.display().to_string(),
        }
    }
}

/// Which permission list a rule is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum List {
    Allow,
    Ask,
    Deny,
}

impl List {
    pub fn name(self) -> &'static str {
        match self {
            List::Allow => "allow",
            List::Ask => "ask",
            List::Deny => "deny",
        }
    }
}

/// One string from an array in the settings, with its origin.
#[derive(Debug, Clone)]
pub struct Entry {
    pub text: String,
    pub origin: Origin,
}

/// Every file read, merged.
#[derive(Debug, Default)]
pub struct Merged {
    /// Files read, lowest precedence first.
    pub files: Vec<(Scope, PathBuf)>,
    /// Permission rules with the list they are in.
    pub rules: Vec<(List, Entry)>,
    pub additional_directories: Vec<Entry>,
    pub allow_write: Vec<Entry>,
    pub deny_read: Vec<Entry>,
    pub deny_write: Vec<Entry>,
    pub allowed_domains: Vec<Entry>,
    pub denied_domains: Vec<Entry>,
    /// Keys of `sandbox` (and `permissions`) that are read but have no
    /// kernel-level counterpart (listed by explain).
    pub unmapped_keys: Vec<Entry>,
    /// `sandbox.enabled` from the highest file that sets it.
    pub sandbox_enabled: Option<bool>,
    /// `sbx.gitIdentity` (sbx's own key) from the highest file that sets
    /// it: whether the host's git user.name/user.email are offered.
    pub git_identity: Option<(bool, Origin)>,
    /// The names (keys) of the top-level `env` objects: variables the user
    /// set for the agent's commands.
    pub env_names: Vec<Entry>,
    /// The managed-only switches the managed settings turn on
    /// (`allowManagedPermissionRulesOnly`,
    /// `sandbox.network.allowManagedDomainsOnly`).
    pub managed_only: Vec<Entry>,
    /// `sandbox.network.allowUnixSockets`: socket paths bound into the
    /// sandbox.
    pub unix_sockets: Vec<Entry>,
    /// Entries of lower scopes a managed-only switch set aside, with why
    /// (listed by explain, never silently dropped).
    pub ignored: Vec<(Entry, &'static str)>,
}

const RULES_ONLY: &str = "allowManagedPermissionRulesOnly";
const DOMAINS_ONLY: &str = "allowManagedDomainsOnly";
const WHY_RULES: &str = "set aside: the managed settings' allowManagedPermissionRulesOnly lets only managed allow and ask rules apply (deny rules of every file still apply)";
const WHY_DOMAINS: &str =
    "set aside: the managed settings' allowManagedDomainsOnly lets only managed domains apply";

impl Merged {
    fn switched_on(&self, key: &str) -> bool {
        self.managed_only.iter().any(|e| e.text.ends_with(key))
    }
}

/// A managed-only switch: honoured in the managed settings only (anywhere
/// else it is listed as not mapped, as Claude Code ignores it there).
fn managed_switch(m: &mut Merged, f: &FileCtx<'_>, v: Option<&Value>, key: &str) {
    let Some(v) = v else { return };
    let e = Entry {
        text: key.to_string(),
        origin: f.origin(Some(key.rsplit('.').next().unwrap_or(key))),
    };
    if f.scope != Scope::Managed {
        m.unmapped_keys.push(e);
    } else if v == &Value::Bool(true) {
        m.managed_only.push(e);
    }
}

/// Whether a settings file is there: absent (nothing of its path, or a
/// file where a directory of it should be) is `false`; one that cannot be
/// told (unreadable directory, symlink loop) is an error, never silently
/// absent (managed settings skipped that way would drop an admin's
/// denials).
pub fn present(p: &Path) -> Result<bool, String> {
    match std::fs::metadata(p) {
        Ok(_) => Ok(true),
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                || e.raw_os_error() == Some(libc::ENOTDIR) =>
        {
            Ok(false)
        }
        Err(e) => Err(format!("{}: {e}", p.display())),
    }
}

/// The default files, lowest precedence first, that exist.
pub fn default_files(
    cwd: &Path,
    home: Option<&Path>,
    managed: &Path,
) -> Result<Vec<(Scope, PathBuf)>, String> {
    let mut v = Vec::new();
    if let Some(h) = home {
        v.push((Scope::User, h.join(".claude/settings.json")));
    }
    v.push((Scope::Project, cwd.join(".claude/settings.json")));
    v.push((Scope::Local, cwd.join(".claude/settings.local.json")));
    v.push((Scope::Managed, managed.to_path_buf()));
    let mut out = Vec::new();
    for (scope, p) in v {
        if present(&p)? {
            out.push((scope, p));
        }
    }
    Ok(out)
}

/// The directory `/path` rules of `file` are relative to.
pub fn base_of(file: &Path) -> PathBuf {
    let abs = if file.is_absolute() {
        file.to_path_buf()
    } else {
        std::env::current_dir()
            .unwrap_or_else(|_| PathBuf::from("/"))
            .join(file)
    };
    let dir = abs
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("/"));
    if dir.file_name().is_some_and(|n| n == ".claude") {
        dir.parent().map(Path::to_path_buf).unwrap_or(dir)
    } else {
        dir
    }
}

/// Reads and merges `files` (lowest precedence first).
pub fn load(files: &[(Scope, PathBuf)]) -> Result<Merged, SettingsError> {
    let mut m = Merged::default();
    // Highest precedence first for arrays (their order shows in explain),
    // and so the first scalar seen wins.
    let mut order: Vec<&(Scope, PathBuf)> = files.iter().collect();
    order.sort_by_key(|(s, _)| std::cmp::Reverse(*s));
    for (scope, path) in order {
        let text = sbx_core::input::read_regular_string(path, sbx_core::input::CONFIG_CAP)
            .map_err(|e| SettingsError {
                file: path.clone(),
                line: None,
                what: format!("cannot read ({}): {e}", scope.flag()),
            })?;
        let v: Value = serde_json::from_str(&text).map_err(|e| SettingsError {
            file: path.clone(),
            line: Some(e.line()),
            what: format!("not valid JSON: {e}"),
        })?;
        let f = FileCtx {
            path,
            text: &text,
            base: base_of(path),
            scope: *scope,
        };
        merge_one(&mut m, &f, &v)?;
    }
    m.files = files.to_vec();
    Ok(m)
}

struct FileCtx<'a> {
    path: &'a Path,
    text: &'a str,
    base: PathBuf,
    scope: Scope,
}

impl FileCtx<'_> {
    fn origin(&self, needle: Option<&str>) -> Origin {
        Origin {
            file: self.path.to_path_buf(),
            line: needle.and_then(|n| line_of(self.text, n)),
            base: self.base.clone(),
            scope: self.scope,
        }
    }
    fn err(&self, needle: Option<&str>, what: impl Into<String>) -> SettingsError {
        self.origin(needle).err(what)
    }
}

/// The line of the first occurrence of `s` as a JSON string literal.
fn line_of(text: &str, s: &str) -> Option<usize> {
    let quoted = serde_json::to_string(s).ok()?;
    let at = text.find(&quoted).or_else(|| text.find(s))?;
    Some(text[..at].bytes().filter(|&b| b == b'\n').count() + 1)
}

fn merge_one(m: &mut Merged, f: &FileCtx<'_>, v: &Value) -> Result<(), SettingsError> {
    let Value::Object(top) = v else {
        return Err(f.err(None, "top level must be a JSON object"));
    };
    // The managed file is read first (highest precedence): its switches
    // hold before any lower file is merged.
    managed_switch(m, f, top.get(RULES_ONLY), RULES_ONLY);
    if let Some(n) = top.get("sandbox").and_then(|s| s.get("network")) {
        managed_switch(
            m,
            f,
            n.get(DOMAINS_ONLY),
            "sandbox.network.allowManagedDomainsOnly",
        );
    }
    let lower = f.scope != Scope::Managed;
    if let Some(p) = top.get("permissions") {
        let Value::Object(p) = p else {
            return Err(f.err(Some("permissions"), "'permissions' must be an object"));
        };
        for (key, list) in [
            ("allow", List::Allow),
            ("ask", List::Ask),
            ("deny", List::Deny),
        ] {
            for e in strings(f, p.get(key), &format!("permissions.{key}"))? {
                // A lower scope's deny still narrows the sandbox: sbx
                // only ever adds restrictions.
                if lower && list != List::Deny && m.switched_on(RULES_ONLY) {
                    m.ignored.push((e, WHY_RULES));
                } else if lower
                    && list == List::Allow
                    && e.text.starts_with("WebFetch(")
                    && m.switched_on(DOMAINS_ONLY)
                {
                    m.ignored.push((e, WHY_DOMAINS));
                } else {
                    m.rules.push((list, e));
                }
            }
        }
        m.additional_directories.extend(strings(
            f,
            p.get("additionalDirectories"),
            "permissions.additionalDirectories",
        )?);
        for k in p.keys() {
            if !["allow", "ask", "deny", "additionalDirectories"].contains(&k.as_str()) {
                m.unmapped_keys.push(Entry {
                    text: format!("permissions.{k}"),
                    origin: f.origin(Some(k)),
                });
            }
        }
    }
    // sbx's own keys, in an object of their own (Claude Code has none of
    // these): every other key in it is listed as not mapped.
    if let Some(x) = top.get("sbx") {
        let Value::Object(x) = x else {
            return Err(f.err(Some("sbx"), "'sbx' must be an object"));
        };
        for (k, v) in x {
            match (k.as_str(), v) {
                ("gitIdentity", Value::Bool(b)) => {
                    if m.git_identity.is_none() {
                        m.git_identity = Some((*b, f.origin(Some("gitIdentity"))));
                    }
                }
                ("gitIdentity", _) => {
                    return Err(f.err(Some("gitIdentity"), "sbx.gitIdentity must be true or false"));
                }
                _ => m.unmapped_keys.push(Entry {
                    text: format!("sbx.{k}"),
                    origin: f.origin(Some(k)),
                }),
            }
        }
    }
    if let Some(e) = top.get("env") {
        let Value::Object(e) = e else {
            return Err(f.err(Some("env"), "'env' must be an object"));
        };
        for k in e.keys() {
            m.env_names.push(Entry {
                text: k.clone(),
                origin: f.origin(Some(k)),
            });
        }
    }
    if let Some(s) = top.get("sandbox") {
        let Value::Object(s) = s else {
            return Err(f.err(Some("sandbox"), "'sandbox' must be an object"));
        };
        if m.sandbox_enabled.is_none()
            && let Some(Value::Bool(b)) = s.get("enabled")
        {
            m.sandbox_enabled = Some(*b);
        }
        if let Some(fs) = s.get("filesystem") {
            let Value::Object(fs) = fs else {
                return Err(f.err(Some("filesystem"), "'sandbox.filesystem' must be an object"));
            };
            for (k, _) in fs.iter() {
                if !["allowWrite", "denyRead", "denyWrite", "allowRead"].contains(&k.as_str()) {
                    m.unmapped_keys.push(Entry {
                        text: format!("sandbox.filesystem.{k}"),
                        origin: f.origin(Some(k)),
                    });
                }
            }
            m.allow_write.extend(strings(
                f,
                fs.get("allowWrite"),
                "sandbox.filesystem.allowWrite",
            )?);
            m.deny_read.extend(strings(
                f,
                fs.get("denyRead"),
                "sandbox.filesystem.denyRead",
            )?);
            m.deny_write.extend(strings(
                f,
                fs.get("denyWrite"),
                "sandbox.filesystem.denyWrite",
            )?);
        }
        if let Some(n) = s.get("network") {
            let Value::Object(n) = n else {
                return Err(f.err(Some("network"), "'sandbox.network' must be an object"));
            };
            for (k, _) in n.iter() {
                if ![
                    "allowedDomains",
                    "deniedDomains",
                    DOMAINS_ONLY,
                    "allowUnixSockets",
                ]
                .contains(&k.as_str())
                {
                    m.unmapped_keys.push(Entry {
                        text: format!("sandbox.network.{k}"),
                        origin: f.origin(Some(k)),
                    });
                }
            }
            for e in strings(f, n.get("allowedDomains"), "sandbox.network.allowedDomains")? {
                if lower && m.switched_on(DOMAINS_ONLY) {
                    let text = format!("sandbox.network.allowedDomains: {}", e.text);
                    m.ignored.push((Entry { text, ..e }, WHY_DOMAINS));
                } else {
                    m.allowed_domains.push(e);
                }
            }
            m.denied_domains.extend(strings(
                f,
                n.get("deniedDomains"),
                "sandbox.network.deniedDomains",
            )?);
            m.unix_sockets.extend(strings(
                f,
                n.get("allowUnixSockets"),
                "sandbox.network.allowUnixSockets",
            )?);
        }
        // Every other key of `sandbox` (excludedCommands, failIfUnavailable,
        // keys Claude Code adds later...): listed, never silently dropped.
        for k in s.keys() {
            if !["enabled", "filesystem", "network"].contains(&k.as_str()) {
                m.unmapped_keys.push(Entry {
                    text: format!("sandbox.{k}"),
                    origin: f.origin(Some(k)),
                });
            }
        }
    }
    Ok(())
}

/// An optional array of strings, each with its origin.
fn strings(f: &FileCtx<'_>, v: Option<&Value>, key: &str) -> Result<Vec<Entry>, SettingsError> {
    let last = key.rsplit('.').next().unwrap_or(key);
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| match i {
                Value::String(s) => Ok(Entry {
                    text: s.clone(),
                    origin: f.origin(Some(s)),
                }),
                other => Err(f.err(
                    Some(last),
                    format!("{key}: expected strings, found {other}"),
                )),
            })
            .collect(),
        Some(_) => Err(f.err(Some(last), format!("{key} must be an array of strings"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_is_the_dir_holding_dot_claude() {
        assert_eq!(
            base_of(Path::new("/p/.claude/settings.json")),
            PathBuf::from("/p")
        );
        assert_eq!(
            base_of(Path::new("/etc/claude-code/managed-settings.json")),
            PathBuf::from("/etc/claude-code")
        );
    }

    #[test]
    fn lines_are_found() {
        let t = "{\n \"permissions\": {\n  \"allow\": [\"Read(\"]\n }\n}";
        assert_eq!(line_of(t, "Read("), Some(3));
    }

    #[test]
    fn merge_precedence_and_union() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("a.json");
        let b = d.path().join("b.json");
        std::fs::write(
            &a,
            r#"{"permissions":{"allow":["Read(//a)"]},"sandbox":{"enabled":false}}"#,
        )
        .unwrap();
        std::fs::write(
            &b,
            r#"{"permissions":{"deny":["Read(//a)"]},"sandbox":{"enabled":true}}"#,
        )
        .unwrap();
        let m = load(&[(Scope::User, a), (Scope::Managed, b)]).unwrap();
        assert_eq!(m.rules.len(), 2);
        assert_eq!(m.sandbox_enabled, Some(true));
        assert_eq!(m.rules[0].0, List::Deny, "managed first");
    }

    #[test]
    fn every_unmapped_key_is_collected() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("s.json");
        std::fs::write(
            &a,
            r#"{"permissions": {"allow": [], "defaultMode": "plan"},
                "sandbox": {"enabled": true, "excludedCommands": ["docker"],
                  "allowUnsandboxedCommands": false, "autoAllowBashIfSandboxed": true,
                  "failIfUnavailable": true, "futureKey": 1,
                  "network": {"allowedDomains": [], "allowUnixSockets": ["/x.sock"],
                    "allowLocalBinding": true, "httpProxyPort": 8080,
                    "allowManagedDomainsOnly": true}}}"#,
        )
        .unwrap();
        let m = load(&[(Scope::Project, a)]).unwrap();
        let mut keys: Vec<&str> = m.unmapped_keys.iter().map(|e| e.text.as_str()).collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "permissions.defaultMode",
                "sandbox.allowUnsandboxedCommands",
                "sandbox.autoAllowBashIfSandboxed",
                "sandbox.excludedCommands",
                "sandbox.failIfUnavailable",
                "sandbox.futureKey",
                "sandbox.network.allowLocalBinding",
                "sandbox.network.allowManagedDomainsOnly",
                "sandbox.network.httpProxyPort",
            ]
        );
    }

    #[test]
    fn env_names_are_collected() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("s.json");
        std::fs::write(&a, r#"{"env": {"FOO": "1", "BAR_BAZ": "2"}}"#).unwrap();
        let m = load(&[(Scope::Project, a.clone())]).unwrap();
        let names: Vec<&str> = m.env_names.iter().map(|e| e.text.as_str()).collect();
        assert_eq!(names, ["BAR_BAZ", "FOO"]);
        std::fs::write(&a, r#"{"env": ["FOO"]}"#).unwrap();
        let e = load(&[(Scope::Project, a)]).unwrap_err();
        assert!(e.to_string().contains("'env' must be an object"), "{e}");
    }

    #[test]
    fn bad_json_names_file_and_line() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("s.json");
        std::fs::write(&a, "{\n \"permissions\": {\n").unwrap();
        let e = load(&[(Scope::Project, a.clone())]).unwrap_err();
        let s = e.to_string();
        assert!(s.starts_with(&format!("{}:", a.display())), "{s}");
        assert!(s.contains("not valid JSON"), "{s}");
    }
}
