//! Protections that hold by *path*, whatever happens to the directories
//! above them, for names that appear during the run, at any depth, without
//! silent budgets (issue 13).
//!
//! - **The invariant list** ([`CONTROL`], [`CLAUDE_DIR`]): the files that
//!   make the next host session run code. One list: the plan, the end
//!   sweep, `--rw` checks and sbx-policy all read it.
//! - **Pinned ancestors** ([`pins`]): every directory between a writable
//!   bind's root and a protected path is bound onto itself in the
//!   sandbox. The kernel refuses to rename or remove a mount point of the
//!   caller's mount namespace (`EBUSY`, in `vfs_rename`/`vfs_rmdir`, for
//!   either side of a rename, `RENAME_EXCHANGE` included), so no ancestor
//!   can be moved away with the protections mounted below it.
//! - **The walk** ([`walk`]): one bounded, depth-unlimited search per bind;
//!   reaching `--scan-limit` is an error (exit 125), never a silent stop.
//! - **The end sweep** ([`Sweep`]): after the sandbox is gone, control
//!   entries that did not exist at the start (a `.claude/` or `.vscode/` in
//!   a directory made during the run, say) are moved to a quarantine
//!   directory outside the project and alerted; protected entries that
//!   were moved or replaced are put back.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use sbx_core::{Severity, audit};
use serde_json::json;

use crate::plan::Kind;

/// Default for `--scan-limit`: entries one bind's walk may read.
pub const DEFAULT_SCAN_LIMIT: usize = 1_000_000;

/// One protected entry, relative to any directory of a writable bind.
#[derive(Debug, Clone, Copy)]
pub struct Invariant {
    /// Relative path (`.git/hooks`, `.mcp.json`).
    pub rel: &'static str,
    pub kind: Kind,
    /// Why it is protected (sbx-policy explain prints it).
    pub note: &'static str,
}

const fn inv(rel: &'static str, kind: Kind, note: &'static str) -> Invariant {
    Invariant { rel, kind, note }
}

/// The invariants of every directory inside a writable bind (the top of
/// the bind and every directory holding one of them, at any depth).
pub const CONTROL: &[Invariant] = &[
    inv(
        ".git/HEAD",
        Kind::File,
        ".git/HEAD, config, objects, refs, hooks and info stay read-only",
    ),
    inv(
        ".git/config",
        Kind::File,
        ".git/HEAD, config, objects, refs, hooks and info stay read-only",
    ),
    inv(
        ".git/objects",
        Kind::Dir,
        ".git/HEAD, config, objects, refs, hooks and info stay read-only",
    ),
    inv(
        ".git/refs",
        Kind::Dir,
        ".git/HEAD, config, objects, refs, hooks and info stay read-only",
    ),
    inv(
        ".git/hooks",
        Kind::Dir,
        ".git/HEAD, config, objects, refs, hooks and info stay read-only",
    ),
    inv(
        ".git/info",
        Kind::Dir,
        ".git/HEAD, config, objects, refs, hooks and info stay read-only",
    ),
    inv(
        ".claude",
        Kind::Dir,
        ".claude (settings*.json, skills, commands, agents, hooks) stays read-only",
    ),
    inv(
        ".mcp.json",
        Kind::File,
        ".mcp.json (MCP servers the next session starts) stays read-only",
    ),
    inv(
        ".vscode",
        Kind::Dir,
        ".vscode (tasks, settings, launch) stays read-only",
    ),
    inv(
        ".idea",
        Kind::Dir,
        ".idea (run configurations) stays read-only",
    ),
    inv(
        ".envrc",
        Kind::File,
        ".envrc (direnv runs it) stays read-only",
    ),
    inv(".gitmodules", Kind::File, ".gitmodules stays read-only"),
];

/// In a writable bind of a `.claude` directory itself (`~/.claude`, which
/// Claude Code must write): what stays read-only there. `plugins` holds
/// the plugins' hooks.json and scripts. `settings*.json` other than these
/// two are found by name.
pub const CLAUDE_DIR: &[Invariant] = &[
    inv(
        "settings.json",
        Kind::File,
        "~/.claude/settings*.json stay read-only",
    ),
    inv(
        "settings.local.json",
        Kind::File,
        "~/.claude/settings*.json stay read-only",
    ),
    inv(
        "skills",
        Kind::Dir,
        "~/.claude/skills, commands, agents, hooks and plugins stay read-only",
    ),
    inv(
        "commands",
        Kind::Dir,
        "~/.claude/skills, commands, agents, hooks and plugins stay read-only",
    ),
    inv(
        "agents",
        Kind::Dir,
        "~/.claude/skills, commands, agents, hooks and plugins stay read-only",
    ),
    inv(
        "hooks",
        Kind::Dir,
        "~/.claude/skills, commands, agents, hooks and plugins stay read-only",
    ),
    inv(
        "plugins",
        Kind::Dir,
        "~/.claude/skills, commands, agents, hooks and plugins stay read-only",
    ),
];

/// First components of [`CONTROL`] outside `.git`: the names the end
/// sweep looks for in every directory.
pub fn swept_names() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = CONTROL
        .iter()
        .filter(|i| !i.rel.starts_with(".git/"))
        .map(|i| i.rel)
        .collect();
    v.dedup();
    v
}

/// Whether a directory entry named `name` marks its directory as one whose
/// invariants must be protected.
pub fn is_control_name(name: &OsStr) -> bool {
    name == ".git" || CONTROL.iter().any(|i| OsStr::new(i.rel) == name)
}

/// Whether `path` (host or sandbox) is, or lies inside, a protected entry:
/// the protected prefix as written (`.git/hooks`, `.claude/settings.local.json`,
/// `.mcp.json`) and the note. A `.claude` directory itself is not (a
/// `~/.claude` bind keeps only [`CLAUDE_DIR`] read-only).
pub fn invariant_of(path: &Path) -> Option<(String, &'static str)> {
    let comps: Vec<&OsStr> = path.iter().collect();
    for (i, c) in comps.iter().enumerate() {
        let next = comps.get(i + 1).and_then(|n| n.to_str());
        let c = c.to_str().unwrap_or("");
        if c == ".git" {
            match next {
                None => return Some((".git".into(), CONTROL[0].note)),
                Some(n) => {
                    if let Some(x) = CONTROL
                        .iter()
                        .find(|x| x.rel.strip_prefix(".git/") == Some(n))
                    {
                        return Some((format!(".git/{n}"), x.note));
                    }
                }
            }
        } else if c == ".claude" {
            if let Some(n) = next
                && (is_claude_settings(n) || CLAUDE_DIR.iter().any(|x| x.rel == n))
            {
                return Some((format!(".claude/{n}"), CLAUDE_DIR[2].note));
            }
        } else if c != ".claude"
            && let Some(x) = CONTROL.iter().find(|x| x.rel == c)
        {
            return Some((c.to_string(), x.note));
        }
    }
    None
}

pub fn is_claude_settings(name: &str) -> bool {
    name.starts_with("settings") && name.ends_with(".json")
}

/// The files inside the `.claude` directory `base` (`~/.claude`) that its
/// `settings*.json` run: every word of a hook's or the status line's
/// `command` that names a path inside it (`~/.claude/…`, `$HOME/.claude/…`,
/// `$CLAUDE_CONFIG_DIR/…`, or its absolute path). Relative paths, without
/// `..`.
pub fn claude_hook_scripts(base: &Path) -> Vec<String> {
    let abs = format!("{}/", base.display());
    hook_scripts(
        base,
        &[
            "~/.claude/",
            "$HOME/.claude/",
            "${HOME}/.claude/",
            "$CLAUDE_CONFIG_DIR/",
            "${CLAUDE_CONFIG_DIR}/",
            abs.as_str(),
        ],
    )
}

/// The files of the project directory `base` that its
/// `.claude/settings*.json` run (hooks and the status line run in the
/// project directory): words of their commands starting with
/// `$CLAUDE_PROJECT_DIR/`, `./` or the project's absolute path. Relative
/// to `base`, without `..`.
pub fn project_hook_scripts(base: &Path) -> Vec<String> {
    let abs = format!("{}/", base.display());
    hook_scripts(
        &base.join(".claude"),
        &[
            "$CLAUDE_PROJECT_DIR/",
            "${CLAUDE_PROJECT_DIR}/",
            "./",
            abs.as_str(),
        ],
    )
}

/// Words of the `command`s in the `hooks` and `statusLine` of the
/// `settings*.json` in `settings_dir` that start with one of `prefixes`,
/// the prefix removed (quotes dropped first: `"$CLAUDE_PROJECT_DIR"/x`).
fn hook_scripts(settings_dir: &Path, prefixes: &[&str]) -> Vec<String> {
    fn commands(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    if k == "command"
                        && let Some(c) = x.as_str()
                    {
                        out.push(c.to_string());
                    }
                    commands(x, out);
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| commands(x, out)),
            _ => {}
        }
    }
    let mut cmds = Vec::new();
    if let Ok(rd) = std::fs::read_dir(settings_dir) {
        for e in rd.flatten() {
            let n = e.file_name();
            if !n.to_str().is_some_and(is_claude_settings) {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(e.path()) else {
                continue;
            };
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
                for key in ["hooks", "statusLine"] {
                    if let Some(h) = v.get(key) {
                        commands(h, &mut cmds);
                    }
                }
            }
        }
    }
    let mut out = Vec::new();
    for c in cmds {
        let c: String = c.chars().filter(|ch| *ch != '"' && *ch != '\'').collect();
        for w in c.split(|ch: char| {
            ch.is_whitespace() || ch == ';' || ch == '&' || ch == '|' || ch == '(' || ch == ')'
        }) {
            let Some(rest) = prefixes.iter().find_map(|p| w.strip_prefix(p)) else {
                continue;
            };
            let rel = Path::new(rest);
            if rest.is_empty()
                || !rel
                    .components()
                    .all(|c| matches!(c, std::path::Component::Normal(_)))
            {
                continue;
            }
            if !out.iter().any(|o| o == rest) {
                out.push(rest.to_string());
            }
        }
    }
    out
}

#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error(
        "searching {bind} for protected names stopped at {limit} entries: refusing to start with part of it unprotected (raise --scan-limit, or bind less)"
    )]
    Limit { bind: PathBuf, limit: usize },
}

impl ScanError {
    /// The alert the refusal leaves in the audit log.
    pub fn alert(&self) {
        let ScanError::Limit { bind, limit } = self;
        audit::emit(
            "scan_limit",
            Severity::Alert,
            json!({ "bind": bind.display().to_string(), "limit": limit, "flag": "--scan-limit" }),
        );
    }
}

/// What the walk tells its visitor to do with a directory entry.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    Descend,
    Skip,
}

/// Walks `root` depth-first without following symlinks, at any depth,
/// calling `f(rel_dir, name, is_dir)` for every entry but symlinks;
/// `.git` directories are not entered. Reading more than `limit` entries
/// is an error.
pub fn walk(
    root: &Path,
    limit: usize,
    f: &mut dyn FnMut(&Path, &OsStr, bool) -> Step,
) -> Result<(), ScanError> {
    walk_links(root, limit, false, f)
}

/// [`walk`], and with `links` symlinks are shown too (as not directories,
/// never entered): a control file may be a symlink.
pub fn walk_links(
    root: &Path,
    limit: usize,
    links: bool,
    f: &mut dyn FnMut(&Path, &OsStr, bool) -> Step,
) -> Result<(), ScanError> {
    let mut left = limit;
    let mut stack: Vec<PathBuf> = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let Some(rd) = list_dir(&root.join(&rel)) else {
            continue;
        };
        for e in rd.flatten() {
            if left == 0 {
                return Err(ScanError::Limit {
                    bind: root.to_path_buf(),
                    limit,
                });
            }
            left -= 1;
            let Ok(ft) = e.file_type() else { continue };
            let n = e.file_name();
            let dir = ft.is_dir() && !ft.is_symlink();
            if ft.is_symlink() {
                if links {
                    f(&rel, &n, false);
                }
                continue;
            }
            if f(&rel, &n, dir) == Step::Descend && dir && n != ".git" {
                stack.push(rel.join(&n));
            }
        }
    }
    Ok(())
}

/// Lists `d`. A directory of ours that cannot be listed (the command ran
/// `chmod 111` on it: programs still reach a control file or a `.git`
/// below it by name) is made ours to list again, with an alert; one that
/// is not ours (the command could not have made it) is skipped as before.
fn list_dir(d: &Path) -> Option<std::fs::ReadDir> {
    match std::fs::read_dir(d) {
        Ok(rd) => Some(rd),
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
            regain(d, 0o700)?;
            std::fs::read_dir(d).ok()
        }
        Err(_) => None,
    }
}

/// Adds `bits` to the mode of directory `d` when it is ours and lacks them
/// (logged as `fs_dir_mode_restored`, alert); None when it is not ours.
fn regain(d: &Path, bits: u32) -> Option<()> {
    use std::os::unix::fs::PermissionsExt;
    let m = std::fs::symlink_metadata(d).ok()?;
    // SAFETY: geteuid has no preconditions.
    if !m.is_dir() || m.uid() != unsafe { libc::geteuid() } {
        return None;
    }
    if m.mode() & bits == bits {
        return Some(());
    }
    std::fs::set_permissions(
        d,
        std::fs::Permissions::from_mode((m.mode() | bits) & 0o7777),
    )
    .ok()?;
    audit::emit(
        "fs_dir_mode_restored",
        Severity::Alert,
        json!({ "path": d, "mode": format!("{:o}", m.mode() & 0o7777), "added": format!("{bits:o}") }),
    );
    Some(())
}

/// Directories below a writable bind's root (relative) that hold a control
/// entry ([`is_control_name`]): their invariants are protected too.
pub fn control_dirs(root: &Path, limit: usize) -> Result<Vec<PathBuf>, ScanError> {
    let mut out: Vec<PathBuf> = Vec::new();
    walk(root, limit, &mut |rel, n, _| {
        if is_control_name(n) {
            if !rel.as_os_str().is_empty() && out.last().map(|p| p.as_path()) != Some(rel) {
                out.push(rel.to_path_buf());
            }
            // Inside a .claude/.vscode/.idea nothing more is looked for:
            // the whole directory is protected.
            return Step::Skip;
        }
        Step::Descend
    })?;
    out.sort();
    out.dedup();
    Ok(out)
}

/// The directories to pin for protections at `dsts` inside a writable bind
/// mounted at `bind_dst`: every ancestor strictly between the bind's root
/// and each protected path (the root is a mount point already).
pub fn pins(bind_dst: &Path, dsts: &[&Path]) -> Vec<PathBuf> {
    let mut set: HashSet<PathBuf> = HashSet::new();
    for d in dsts {
        let Ok(rel) = d.strip_prefix(bind_dst) else {
            continue;
        };
        let mut cur = bind_dst.to_path_buf();
        let comps: Vec<_> = rel.iter().collect();
        for c in comps.iter().take(comps.len().saturating_sub(1)) {
            cur.push(c);
            set.insert(cur.clone());
        }
    }
    let mut v: Vec<PathBuf> = set.into_iter().collect();
    v.sort();
    v
}

/// One protected entry as it was at the start (host path, identity).
#[derive(Debug, Clone)]
struct Known {
    rel: PathBuf,
    dev: u64,
    ino: u64,
    /// A symlink's target (a removed symlink cannot be found by inode:
    /// it is made again).
    link: Option<PathBuf>,
}

/// The control entries of one writable bind at the start, and the check
/// at the end.
#[derive(Debug, Clone)]
pub struct Sweep {
    root: PathBuf,
    known: Vec<Known>,
    /// The `.git` directories at the start (relative, device, inode).
    repos: Vec<(PathBuf, u64, u64)>,
}

fn identity(p: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(p)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// Finds every control entry (first component of [`CONTROL`] outside
/// `.git`, and the `.git` entries of the repositories in `repos`, or of
/// every repository when None) below `root`; also returns the `.git`
/// directories found (relative, device, inode).
#[allow(clippy::type_complexity)]
fn find_controls(
    root: &Path,
    limit: usize,
    repos: Option<&[(PathBuf, u64, u64)]>,
) -> Result<(Vec<PathBuf>, Vec<(PathBuf, u64, u64)>), ScanError> {
    let names = swept_names();
    let mut out = Vec::new();
    let mut gits = Vec::new();
    walk_links(root, limit, true, &mut |rel, n, dir| {
        if names.iter().any(|x| OsStr::new(x) == n) {
            out.push(rel.join(n));
            return Step::Skip;
        }
        if n == ".git" && dir {
            let r = rel.join(n);
            if let Some((dev, ino)) = identity(&root.join(&r)) {
                gits.push((r, dev, ino));
            }
        }
        Step::Descend
    })?;
    for g in &gits {
        // A repository that appeared during the run is planted or made by
        // the agent: sbx-gitguard's to judge (issue 13 section 4), not
        // taken apart here.
        if repos.is_some_and(|r| !r.contains(g)) {
            continue;
        }
        for i in CONTROL.iter().filter(|i| i.rel.starts_with(".git/")) {
            let rel = g.0.join(&i.rel[5..]);
            if std::fs::symlink_metadata(root.join(&rel)).is_ok() {
                out.push(rel);
            }
        }
    }
    Ok((out, gits))
}

impl Sweep {
    /// Records the control entries of the writable bind `root` (before any
    /// placeholder exists).
    pub fn start(root: &Path, limit: usize) -> Result<Sweep, ScanError> {
        let (found, gits) = find_controls(root, limit, None)?;
        let known = found
            .into_iter()
            .filter(|rel| !crate::placeholder::is_placeholder(&root.join(rel)))
            .filter_map(|rel| {
                let p = root.join(&rel);
                let link = std::fs::read_link(&p).ok();
                identity(&p).map(|(dev, ino)| Known {
                    rel,
                    dev,
                    ino,
                    link,
                })
            })
            .collect();
        let repos = gits
            .into_iter()
            .filter(|(r, _, _)| !crate::placeholder::is_placeholder(&root.join(r)))
            .collect();
        Ok(Sweep {
            root: root.to_path_buf(),
            known,
            repos,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// After the sandbox is gone (nothing of it runs) and the placeholders
    /// were removed: every control entry that was not there at the start
    /// is moved to `quarantine`; an original moved away is put back.
    /// Each finding is an alert.
    pub fn finish(&self, quarantine: &Path) {
        // Unbounded: the sandbox could grow the tree past any limit to hide
        // a control file behind it (the next run's search refuses to start
        // on such a tree instead).
        let found = match find_controls(&self.root, usize::MAX, Some(&self.repos)) {
            Ok((f, _)) => f,
            Err(e) => {
                audit::emit(
                    "fs_sweep_incomplete",
                    Severity::Alert,
                    json!({ "bind": self.root.display().to_string(), "reason": e.to_string() }),
                );
                return;
            }
        };
        // A symlink's inode number may be reused by the one that replaced
        // it: its target is part of its identity.
        let known: HashSet<(&Path, u64, u64, Option<&Path>)> = self
            .known
            .iter()
            .map(|k| (k.rel.as_path(), k.dev, k.ino, k.link.as_deref()))
            .collect();
        for rel in found {
            let p = self.root.join(&rel);
            let Some((dev, ino)) = identity(&p) else {
                continue;
            };
            let link = std::fs::read_link(&p).ok();
            if known.contains(&(rel.as_path(), dev, ino, link.as_deref())) {
                continue;
            }
            // Another sandbox's placeholder (empty, marked): not ours to move.
            if crate::placeholder::is_placeholder(&p) && is_empty(&p) {
                continue;
            }
            let replaced = self.known.iter().any(|k| k.rel == rel);
            let dest = quarantine_path(quarantine, &self.root, &rel);
            let moved = move_out(quarantine, &p, &dest);
            audit::emit(
                if replaced {
                    "fs_protected_replaced"
                } else {
                    "fs_protected_created"
                },
                Severity::Alert,
                json!({
                    "path": p.display().to_string(),
                    "quarantined": moved.as_ref().ok().map(|_| dest.display().to_string()),
                    "error": moved.as_ref().err().map(|e| e.to_string()),
                }),
            );
        }
        // Originals that are no longer at their path: put back (the pinned
        // ancestors make this unreachable inside the sandbox; a second line).
        let gone: Vec<&Known> = self
            .known
            .iter()
            .filter(|k| {
                let p = self.root.join(&k.rel);
                identity(&p) != Some((k.dev, k.ino)) || std::fs::read_link(&p).ok() != k.link
            })
            .collect();
        if gone.is_empty() {
            return;
        }
        let mut whereabouts: Vec<(usize, PathBuf)> = Vec::new();
        let _ = walk_links(&self.root, usize::MAX, true, &mut |rel, n, _| {
            let p = self.root.join(rel).join(n);
            // Same inode and, as inode numbers are reused, the same target
            // (or none): a new file that took a removed link's number is not it.
            if let Some(id) = identity(&p)
                && let Some(i) = gone
                    .iter()
                    .position(|k| (k.dev, k.ino) == id && std::fs::read_link(&p).ok() == k.link)
            {
                whereabouts.push((i, rel.join(n)));
            }
            Step::Descend
        });
        for (i, k) in gone.iter().enumerate() {
            let orig = self.root.join(&k.rel);
            let at = whereabouts.iter().find(|(j, _)| *j == i).map(|(_, r)| r);
            let restored = match (at, &k.link) {
                (Some(r), _) if std::fs::symlink_metadata(&orig).is_err() => {
                    std::fs::rename(self.root.join(r), &orig).is_ok()
                }
                (None, Some(target)) if std::fs::symlink_metadata(&orig).is_err() => {
                    std::os::unix::fs::symlink(target, &orig).is_ok()
                }
                _ => false,
            };
            audit::emit(
                "fs_protected_moved",
                Severity::Alert,
                json!({
                    "path": orig.display().to_string(),
                    "found_at": at.map(|r| self.root.join(r).display().to_string()),
                    "restored": restored,
                }),
            );
        }
    }
}

/// The MCP servers of `~/.claude.json` (a file Claude Code writes all the
/// time, so it cannot be read-only): when a writable bind covers it, its
/// `mcpServers` (top level and each project's) are recorded at the start
/// and put back at the end if the run changed them.
#[derive(Debug, Clone)]
pub struct McpGuard {
    path: PathBuf,
    original: Vec<u8>,
    servers: serde_json::Value,
}

fn mcp_servers(v: &serde_json::Value) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    out.insert("".into(), v.get("mcpServers").cloned().unwrap_or_default());
    if let Some(p) = v.get("projects").and_then(|p| p.as_object()) {
        for (k, x) in p {
            out.insert(k.clone(), x.get("mcpServers").cloned().unwrap_or_default());
        }
    }
    serde_json::Value::Object(out)
}

impl McpGuard {
    /// `path` is `~/.claude.json` when a writable bind covers it.
    pub fn start(path: &Path) -> Option<McpGuard> {
        let m = std::fs::symlink_metadata(path).ok()?;
        if !m.is_file() {
            return None;
        }
        let original = std::fs::read(path).ok()?;
        let v: serde_json::Value = serde_json::from_slice(&original).ok()?;
        Some(McpGuard {
            path: path.to_path_buf(),
            servers: mcp_servers(&v),
            original,
        })
    }

    /// After the sandbox is gone: the servers as they were, the rest of the
    /// file as the run left it; the changed file goes to the quarantine.
    pub fn finish(&self, quarantine: &Path) {
        let now = std::fs::symlink_metadata(&self.path)
            .ok()
            .filter(|m| m.is_file())
            .and_then(|_| std::fs::read(&self.path).ok());
        let parsed = now
            .as_ref()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(b).ok());
        let fixed = match &parsed {
            Some(v) if mcp_servers(v) == self.servers => return,
            Some(v) => {
                let mut v = v.clone();
                if let Some(o) = v.as_object_mut() {
                    match self.servers.get("") {
                        Some(serde_json::Value::Null) | None => {
                            o.remove("mcpServers");
                        }
                        Some(x) => {
                            o.insert("mcpServers".into(), x.clone());
                        }
                    }
                }
                if let Some(p) = v.get_mut("projects").and_then(|p| p.as_object_mut()) {
                    for (k, x) in p.iter_mut() {
                        let Some(o) = x.as_object_mut() else { continue };
                        match self.servers.get(k) {
                            Some(serde_json::Value::Null) | None => {
                                o.remove("mcpServers");
                            }
                            Some(s) => {
                                o.insert("mcpServers".into(), s.clone());
                            }
                        }
                    }
                }
                serde_json::to_vec_pretty(&v).unwrap_or_else(|_| self.original.clone())
            }
            // Not a JSON file any more (or not a file): the original.
            None => self.original.clone(),
        };
        let dest = quarantine_path(quarantine, Path::new("/"), Path::new(".claude.json"));
        let result = if now.is_some() {
            // Kept in place (its inode, mode and owner): a copy of what the
            // run left goes to the quarantine, then the content is fixed.
            copy_out(quarantine, &self.path, &dest).and_then(|_| {
                use std::io::Write;
                use std::os::unix::fs::OpenOptionsExt;
                std::fs::OpenOptions::new()
                    .write(true)
                    .truncate(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&self.path)?
                    .write_all(&fixed)
            })
        } else {
            move_out(quarantine, &self.path, &dest).and_then(|_| {
                use std::io::Write;
                use std::os::unix::fs::OpenOptionsExt;
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&self.path)?
                    .write_all(&fixed)
            })
        };
        audit::emit(
            "fs_protected_restored",
            Severity::Alert,
            json!({
                "path": self.path.display().to_string(),
                "key": "mcpServers",
                "quarantined": result.as_ref().ok().map(|_| dest.display().to_string()),
                "error": result.err().map(|e| e.to_string()),
            }),
        );
    }
}

fn is_empty(p: &Path) -> bool {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => std::fs::read_dir(p).is_ok_and(|mut r| r.next().is_none()),
        Ok(m) => m.len() == 0,
        Err(_) => true,
    }
}

/// The default quarantine directories, in order of preference:
/// `$XDG_STATE_HOME/sbx/quarantine`, `~/.local/state/sbx/quarantine`,
/// `/var/tmp/sbx-quarantine-<uid>` (the first one outside every writable
/// bind is used).
pub fn default_quarantines() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(x) = std::env::var_os("XDG_STATE_HOME").map(PathBuf::from)
        && x.is_absolute()
    {
        v.push(x.join("sbx/quarantine"));
    }
    if let Some(h) = std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|h| h.is_absolute())
    {
        v.push(h.join(".local/state/sbx/quarantine"));
    }
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    v.push(PathBuf::from(format!("/var/tmp/sbx-quarantine-{uid}")));
    v
}

/// `path` resolved as far as it exists (the rest appended): for
/// comparing it with the canonical bind sources.
pub fn canonical_prefix(path: &Path) -> PathBuf {
    let mut canon = path.to_path_buf();
    let mut tail = Vec::new();
    while std::fs::symlink_metadata(&canon).is_err() {
        let (Some(parent), Some(name)) = (canon.parent(), canon.file_name()) else {
            break;
        };
        tail.push(name.to_os_string());
        canon = parent.to_path_buf();
    }
    let mut canon = canon.canonicalize().unwrap_or(canon);
    canon.extend(tail.iter().rev());
    canon
}

/// `quarantine/<sbx id>/<bind root, flattened>/<rel>`.
fn quarantine_path(quarantine: &Path, root: &Path, rel: &Path) -> PathBuf {
    let id = sbx_core::id::get()
        .map(str::to_string)
        .unwrap_or_else(|| format!("pid-{}", std::process::id()));
    let flat: OsString = OsString::from(
        String::from_utf8_lossy(root.as_os_str().as_bytes())
            .trim_start_matches('/')
            .replace('/', "_"),
    );
    quarantine.join(id).join(flat).join(rel)
}

/// Copies `from` to `to` inside the quarantine (checked as for [`move_out`]).
fn copy_out(quarantine: &Path, from: &Path, to: &Path) -> std::io::Result<()> {
    prepare_quarantine(quarantine, to)?;
    copy_tree(from, to)
}

/// Moves `from` to `to` (a rename; across file systems a copy, then the
/// removal of `from`). Symlinks are moved as symlinks, never followed.
fn move_out(quarantine: &Path, from: &Path, to: &Path) -> std::io::Result<()> {
    prepare_quarantine(quarantine, to)?;
    // A parent the command made read-only (chmod 555) must not keep the
    // entry in place: it is ours, so it is made writable again.
    if let Some(parent) = from.parent() {
        let _ = regain(parent, 0o700);
    }
    // A directory moved across file systems is copied: it must be listable.
    if std::fs::symlink_metadata(from).is_ok_and(|m| m.is_dir()) {
        let _ = regain(from, 0o700);
    }
    match std::fs::rename(from, to) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            copy_tree(from, to)?;
            remove_tree(from)
        }
        Err(e) => Err(e),
    }
}

/// Creates the quarantine (0700) and `to`'s parent in it; the quarantine
/// must be a directory of ours that nobody else can write.
fn prepare_quarantine(quarantine: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(quarantine)?;
    // Ours, a real directory (a shared /var/tmp could hold another's).
    let m = std::fs::symlink_metadata(quarantine)?;
    // SAFETY: geteuid cannot fail.
    if !m.is_dir() || m.uid() != unsafe { libc::geteuid() } || m.mode() & 0o022 != 0 {
        return Err(std::io::Error::other(format!(
            "{}: not a directory of ours, writable by nobody else",
            quarantine.display()
        )));
    }
    if let Some(parent) = to.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)?;
    }
    Ok(())
}

fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    let m = std::fs::symlink_metadata(from)?;
    if m.file_type().is_symlink() {
        std::os::unix::fs::symlink(std::fs::read_link(from)?, to)
    } else if m.is_dir() {
        std::fs::create_dir(to)?;
        for e in std::fs::read_dir(from)? {
            let e = e?;
            copy_tree(&e.path(), &to.join(e.file_name()))?;
        }
        Ok(())
    } else if m.is_file() {
        std::fs::copy(from, to).map(|_| ())
    } else {
        // FIFOs, sockets, devices: nothing to keep, they are removed.
        Ok(())
    }
}

fn remove_tree(p: &Path) -> std::io::Result<()> {
    let m = std::fs::symlink_metadata(p)?;
    if m.is_dir() {
        std::fs::remove_dir_all(p)
    } else {
        std::fs::remove_file(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invariant_of_names_the_protected_prefix() {
        let f = |p: &str| invariant_of(Path::new(p)).map(|(s, _)| s);
        assert_eq!(f("/p/.git").as_deref(), Some(".git"));
        assert_eq!(f("/p/.git/hooks/x").as_deref(), Some(".git/hooks"));
        assert_eq!(f("/p/.git/info/attributes").as_deref(), Some(".git/info"));
        assert_eq!(f("/p/.git/logs"), None);
        assert_eq!(
            f("/p/.claude/agents/a.md").as_deref(),
            Some(".claude/agents")
        );
        assert_eq!(
            f("/p/.claude/settings.local.json").as_deref(),
            Some(".claude/settings.local.json")
        );
        assert_eq!(f("/home/u/.claude"), None);
        assert_eq!(f("/p/a/b/.vscode/tasks.json").as_deref(), Some(".vscode"));
        assert_eq!(f("/p/.mcp.json").as_deref(), Some(".mcp.json"));
        assert_eq!(f("/p/src/.envrc").as_deref(), Some(".envrc"));
        assert_eq!(f("/p/src"), None);
    }

    #[test]
    fn the_walk_has_no_depth_limit_and_fails_closed() {
        let d = tempfile::tempdir().unwrap();
        let mut deep = d.path().to_path_buf();
        for i in 0..12 {
            deep.push(format!("d{i}"));
        }
        std::fs::create_dir_all(deep.join(".claude")).unwrap();
        let dirs = control_dirs(d.path(), 1000).unwrap();
        assert_eq!(dirs.len(), 1);
        assert!(dirs[0].ends_with("d11"), "{dirs:?}");
        let err = control_dirs(d.path(), 5).unwrap_err();
        assert!(err.to_string().contains("--scan-limit"), "{err}");
    }

    #[test]
    fn pins_are_the_ancestors_inside_the_bind() {
        let p = pins(
            Path::new("/w"),
            &[
                Path::new("/w/a/b/.env"),
                Path::new("/w/a/c/.claude"),
                Path::new("/w/.git/HEAD"),
            ],
        );
        let want: Vec<PathBuf> = ["/w/.git", "/w/a", "/w/a/b", "/w/a/c"]
            .iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(p, want);
    }
}
