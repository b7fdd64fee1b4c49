//! The invariant list: the entries of a writable directory that make the
//! next host session run code (git's control files, agent and editor
//! configuration, tool version files), which stay read-only in every
//! tier. sbx-fs enforces it (plan, guard, end sweep); sbx-policy explains
//! it; both read it here, so the two cannot disagree.

use std::ffi::OsStr;
use std::path::Path;

/// Whether a protected entry is a directory or a file (what a missing one
/// is created as, to be mounted over).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
}

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
    // Issue 13 gaps, item 3: each makes the next host session run code
    // (docs/fs.md says how; CI files and rule files are left out there).
    inv(
        ".cargo/config.toml",
        Kind::File,
        ".cargo/config.toml (build.rustc-wrapper, runners, aliases cargo runs) stays read-only",
    ),
    inv(
        ".cargo/config",
        Kind::File,
        ".cargo/config (build.rustc-wrapper, runners, aliases cargo runs) stays read-only",
    ),
    inv(
        ".npmrc",
        Kind::File,
        ".npmrc (script-shell, node-options npm runs) stays read-only",
    ),
    inv(
        ".yarnrc",
        Kind::File,
        ".yarnrc (yarn-path: the script yarn runs) stays read-only",
    ),
    inv(
        ".yarnrc.yml",
        Kind::File,
        ".yarnrc.yml (yarnPath, plugins yarn runs) stays read-only",
    ),
    inv(
        ".pnpmfile.cjs",
        Kind::File,
        ".pnpmfile.cjs (pnpm runs it on install) stays read-only",
    ),
    inv(
        ".pre-commit-config.yaml",
        Kind::File,
        ".pre-commit-config.yaml (the hooks the next commit runs) stays read-only",
    ),
    inv(
        ".cursor",
        Kind::Dir,
        ".cursor (mcp.json servers Cursor starts) stays read-only",
    ),
    inv(
        ".continue",
        Kind::Dir,
        ".continue (MCP servers and commands Continue starts) stays read-only",
    ),
    inv(
        ".devcontainer",
        Kind::Dir,
        ".devcontainer (initializeCommand runs on the host) stays read-only",
    ),
    inv(
        ".direnv",
        Kind::Dir,
        ".direnv (layouts direnv puts on PATH) stays read-only",
    ),
    inv(
        ".tool-versions",
        Kind::File,
        ".tool-versions (tools asdf/mise install and put on PATH) stays read-only",
    ),
    inv(
        "mise.toml",
        Kind::File,
        "mise.toml (hooks, env scripts, tools mise runs) stays read-only",
    ),
    inv(
        ".mise.toml",
        Kind::File,
        ".mise.toml (hooks, env scripts, tools mise runs) stays read-only",
    ),
    inv(
        ".python-version",
        Kind::File,
        ".python-version (the interpreter pyenv/uv/mise run) stays read-only",
    ),
];

/// Control entries below a directory that is not one themselves
/// (`.cargo/config.toml`): (directory, entry names).
pub fn nested() -> Vec<(&'static str, Vec<&'static str>)> {
    let mut out: Vec<(&'static str, Vec<&'static str>)> = Vec::new();
    for i in CONTROL.iter().filter(|i| !i.rel.starts_with(".git/")) {
        let Some((d, n)) = i.rel.split_once('/') else {
            continue;
        };
        match out.iter_mut().find(|(x, _)| *x == d) {
            Some((_, v)) => v.push(n),
            None => out.push((d, vec![n])),
        }
    }
    out
}

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
        .filter(|i| !i.rel.contains('/'))
        .map(|i| i.rel)
        .collect();
    v.dedup();
    v
}

/// Whether a directory entry named `name` marks its directory as one whose
/// invariants must be protected.
pub fn is_control_name(name: &OsStr) -> bool {
    name == ".git"
        || CONTROL.iter().any(|i| {
            OsStr::new(i.rel) == name
                || (!i.rel.starts_with(".git/")
                    && i.rel
                        .split_once('/')
                        .is_some_and(|(d, _)| OsStr::new(d) == name))
        })
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
        } else if let Some(n) = next
            && let Some(x) = CONTROL
                .iter()
                .find(|x| !x.rel.starts_with(".git/") && x.rel.split_once('/') == Some((c, n)))
        {
            return Some((x.rel.to_string(), x.note));
        }
    }
    None
}

pub fn is_claude_settings(name: &str) -> bool {
    name.starts_with("settings") && name.ends_with(".json")
}

/// What `git config --local` failing with EBUSY means, and what to do
/// instead: the `hint` of the config.lock alert, shown in the end-of-run
/// summary, and a row of `sbx-policy explain`.
pub const GIT_CONFIG_HINT: &str = ".git/config is read-only inside (an invariant), so `git config --local` fails with EBUSY; instead use `git -c KEY=VALUE`, GIT_AUTHOR_NAME/GIT_AUTHOR_EMAIL (and GIT_COMMITTER_*), or `git config --global` (the sandbox's own HOME, this run only; it holds the host's user.name/user.email unless --no-git-identity)";
