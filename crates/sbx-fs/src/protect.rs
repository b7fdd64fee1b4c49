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

use crate::plan::{Kind, Op, What};

/// Default for `--scan-limit`: entries one bind's walk may read.
pub const DEFAULT_SCAN_LIMIT: usize = sbx_spec::fs::DEFAULT_SCAN_LIMIT;

pub use sbx_spec::invariants::{
    CLAUDE_DIR, CONTROL, invariant_of, is_claude_settings, is_control_name, nested, swept_names,
};

/// The files inside the `.claude` directory `base` (`~/.claude`) that its
/// `settings*.json` and its plugins' `hooks.json` run: every word of a
/// hook's or the status line's `command` that names a path inside it
/// (`~/.claude/…`, `$HOME/.claude/…`, `$CLAUDE_CONFIG_DIR/…`, or its
/// absolute path), see [`hook_words`]. Relative paths, without `..`.
pub fn claude_hook_scripts(base: &Path) -> Vec<String> {
    let mut cmds = settings_commands(base);
    cmds.extend(plugin_commands(&base.join("plugins")));
    let mut exp: Vec<(&str, PathBuf)> = vec![
        ("$CLAUDE_CONFIG_DIR", base.to_path_buf()),
        ("${CLAUDE_CONFIG_DIR}", base.to_path_buf()),
    ];
    if base.file_name() == Some(OsStr::new(".claude"))
        && let Some(home) = base.parent()
    {
        for h in ["~", "$HOME", "${HOME}"] {
            exp.push((h, home.to_path_buf()));
        }
    }
    // Hooks run in the project directory, not here: relative words name
    // nothing inside it.
    inside(base, hook_words(&cmds, None, &exp))
}

/// The files of the project directory `base` that hooks and the status
/// line run, from its `.claude/settings*.json` and from the user's
/// (`$CLAUDE_CONFIG_DIR` or `~/.claude`: settings and plugins' `hooks.json`),
/// which run in every project: see [`hook_words`]. Relative to `base`,
/// without `..`.
pub fn project_hook_scripts(base: &Path) -> Vec<String> {
    inside(
        base,
        hook_words(
            &project_commands(base),
            Some(base),
            &project_expansions(base),
        ),
    )
}

fn home_and_config() -> (Option<PathBuf>, Option<PathBuf>) {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|h| h.is_absolute());
    let config = std::env::var_os("CLAUDE_CONFIG_DIR")
        .map(PathBuf::from)
        .filter(|c| c.is_absolute())
        .or_else(|| home.as_ref().map(|h| h.join(".claude")));
    (home, config)
}

/// The hook commands that run in the project directory `base`: its own
/// settings' and the user's.
fn project_commands(base: &Path) -> Vec<String> {
    let mut cmds = settings_commands(&base.join(".claude"));
    let (_, config) = home_and_config();
    if let Some(c) = &config {
        // The project may be the home: its .claude is the user's then.
        if c != &base.join(".claude") {
            cmds.extend(settings_commands(c));
        }
        cmds.extend(plugin_commands(&c.join("plugins")));
    }
    cmds
}

fn project_expansions(base: &Path) -> Vec<(&'static str, PathBuf)> {
    let (home, config) = home_and_config();
    let mut exp: Vec<(&str, PathBuf)> = vec![
        ("$CLAUDE_PROJECT_DIR", base.to_path_buf()),
        ("${CLAUDE_PROJECT_DIR}", base.to_path_buf()),
    ];
    if let Some(h) = &home {
        for n in ["~", "$HOME", "${HOME}"] {
            exp.push((n, h.clone()));
        }
    }
    if let Some(c) = &config {
        exp.push(("$CLAUDE_CONFIG_DIR", c.clone()));
        exp.push(("${CLAUDE_CONFIG_DIR}", c.clone()));
    }
    exp
}

/// The paths of `words` inside `base`, relative, once each.
fn inside(base: &Path, words: Vec<PathBuf>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for w in words {
        let Ok(rel) = w.strip_prefix(base) else {
            continue;
        };
        let Some(r) = rel.to_str().filter(|r| !r.is_empty()) else {
            continue;
        };
        if !out.iter().any(|o| o == r) {
            out.push(r.to_string());
        }
    }
    out
}

/// Programs whose first argument that is not an option is a script they
/// run.
const INTERPRETERS: &[&str] = &[
    "sh",
    "bash",
    "dash",
    "zsh",
    "ksh",
    "fish",
    "source",
    ".",
    "node",
    "nodejs",
    "deno",
    "bun",
    "tsx",
    "ts-node",
    "python",
    "python3",
    "python2",
    "pypy3",
    "uv",
    "perl",
    "ruby",
    "php",
    "lua",
    "Rscript",
    "osascript",
    "pwsh",
];

/// The files a shell command line names, as absolute paths (lexically
/// normalised), read conservatively: quotes are dropped, the line is cut
/// into words at blanks and `;&|()<>`, `NAME/…` and `NAME` prefixes of
/// `exp` (`$HOME`, `~`, `$CLAUDE_PROJECT_DIR`) are expanded, relative
/// words are taken from `cwd` (when known). Kept: every word that names an
/// existing regular file (whatever the program: `cat x | sh`, `make -f
/// x`); a word that starts with `./`, an expanded prefix or `/` or follows
/// an interpreter (`sh x.sh`, `bash -e x.sh`, `node x.js`, `python3 x.py`)
/// existing or not (the sandbox could create it); for `make` the makefiles
/// of `-C DIR` (or of `cwd`), existing or, when none is, `Makefile`.
/// Not followed: what those scripts source or import, command
/// substitution, variables other than those in `exp`, `cd` in the line.
pub fn hook_words(cmds: &[String], cwd: Option<&Path>, exp: &[(&str, PathBuf)]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for c in cmds {
        let c: String = c.chars().filter(|ch| *ch != '"' && *ch != '\'').collect();
        let words: Vec<&str> = c
            .split(|ch: char| ch.is_whitespace() || ";&|()<>`".contains(ch))
            .filter(|w| !w.is_empty())
            .collect();
        let resolve = |w: &str| -> Option<(PathBuf, bool)> {
            for (name, to) in exp {
                if w == *name {
                    return Some((to.clone(), true));
                }
                if let Some(rest) = w.strip_prefix(name).and_then(|r| r.strip_prefix('/')) {
                    return Some((lexical(&to.join(rest)), true));
                }
            }
            if w.starts_with('$') || w.starts_with('~') || w.contains('=') {
                return None;
            }
            if w.starts_with('/') {
                return Some((lexical(Path::new(w)), true));
            }
            let cwd = cwd?;
            Some((lexical(&cwd.join(w)), w.starts_with("./")))
        };
        let mut after_interp = false;
        let mut make: Option<Option<PathBuf>> = None;
        let mut make_dir_next = false;
        for w in &words {
            let prog = Path::new(w)
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("");
            if make_dir_next {
                make_dir_next = false;
                if let Some((p, _)) = resolve(w) {
                    make = Some(Some(p));
                }
                continue;
            }
            if make.is_some() && *w == "-C" {
                make_dir_next = true;
                continue;
            }
            if make.is_some()
                && let Some(d) = w.strip_prefix("-C")
                && !d.is_empty()
            {
                make = resolve(d).map(|(p, _)| Some(p)).or(make);
                continue;
            }
            let Some((p, explicit)) = resolve(w) else {
                after_interp = false;
                continue;
            };
            // `sh -c CODE`, `node -e CODE`, `python3 -m MOD`: what follows
            // is code or a module, not a script file.
            if after_interp && matches!(*w, "-c" | "-e" | "-m" | "-p" | "--eval" | "--print") {
                after_interp = false;
                continue;
            }
            let script =
                after_interp && !w.starts_with('-') && (w.contains('/') || w.contains('.'));
            let file = std::fs::metadata(&p).is_ok_and(|m| m.is_file());
            if file || ((explicit || script) && std::fs::symlink_metadata(&p).is_err()) {
                out.push(p.clone());
            }
            if script {
                after_interp = false;
            } else if INTERPRETERS.contains(&prog) {
                after_interp = true;
            }
            if prog == "make" || prog == "gmake" {
                make = Some(None);
            }
        }
        if let Some(dir) = make {
            let Some(dir) = dir.or_else(|| cwd.map(Path::to_path_buf)) else {
                continue;
            };
            // make takes the first of these that exists: the existing ones
            // are protected; one that would take precedence is not made a
            // placeholder (an empty makefile would break make inside) but
            // watched: the end sweep takes it out (see [`hook_watch`]).
            let files: Vec<PathBuf> = MAKEFILES
                .iter()
                .map(|n| dir.join(n))
                .filter(|p| std::fs::symlink_metadata(p).is_ok())
                .collect();
            if files.is_empty() {
                out.push(dir.join("Makefile"));
            }
            out.extend(files);
        }
    }
    out
}

/// The makefiles GNU make looks for, in its order.
const MAKEFILES: &[&str] = &["GNUmakefile", "makefile", "Makefile"];

/// Paths that hooks of the project directory `base` would run if they
/// appeared, but that cannot be placeholders: makefiles that would take
/// precedence over the one `make` (or `make -C DIR`) reads now. The end
/// sweep moves out any that appear. Absolute.
pub fn hook_watch(base: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for w in hook_words(
        &project_commands(base),
        Some(base),
        &project_expansions(base),
    ) {
        let Some(n) = w.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(i) = MAKEFILES.iter().position(|m| *m == n) else {
            continue;
        };
        let dir = w.parent().unwrap_or(base);
        for m in &MAKEFILES[..i] {
            let p = dir.join(m);
            if std::fs::symlink_metadata(&p).is_err() && p.starts_with(base) && !out.contains(&p) {
                out.push(p);
            }
        }
    }
    out
}

/// The `command`s of the `hooks` and `statusLine` of the `settings*.json`
/// in `dir`.
fn settings_commands(dir: &Path) -> Vec<String> {
    let mut cmds = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let n = e.file_name();
            if !n.to_str().is_some_and(is_claude_settings) {
                continue;
            }
            json_commands(&e.path(), &["hooks", "statusLine"], &mut cmds);
        }
    }
    cmds
}

/// The hook `command`s of every plugin's `hooks.json` below `plugins`.
fn plugin_commands(plugins: &Path) -> Vec<String> {
    let mut cmds = Vec::new();
    if !plugins.is_dir() {
        return cmds;
    }
    let mut files = Vec::new();
    let _ = walk(plugins, usize::MAX, &mut |rel, n, dir| {
        if !dir && n == "hooks.json" {
            files.push(plugins.join(rel).join(n));
        }
        Step::Descend
    });
    for f in files {
        json_commands(&f, &["hooks"], &mut cmds);
    }
    cmds
}

/// Every string `command` below the `keys` of the JSON file `p`.
fn json_commands(p: &Path, keys: &[&str], out: &mut Vec<String>) {
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
    let Ok(text) = std::fs::read_to_string(p) else {
        return;
    };
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
        for key in keys {
            if let Some(h) = v.get(*key) {
                commands(h, out);
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error(
        "searching {bind} for protected names stopped at {limit} entries: refusing to start with part of it unprotected (raise --scan-limit, or bind less)"
    )]
    Limit { bind: PathBuf, limit: usize },
    #[error(
        "{link}: a control entry that is a symlink {why}: refusing to start with what it names writable (replace the link by its target, or point it straight at a path without symlinks)"
    )]
    Link { link: PathBuf, why: &'static str },
    #[error(
        "searching {bind} for protected names: cannot open a directory of {dir}… ({err}): refusing to go on with part of the tree unread"
    )]
    Open {
        bind: PathBuf,
        dir: String,
        err: std::io::Error,
    },
    #[error(
        "{bind}: {path}… is {len} bytes long, beyond what a mount can protect (PATH_MAX {max}): refusing to start with what lies below it unprotected (flatten the tree, or bind less)"
    )]
    TooDeep {
        bind: PathBuf,
        /// The first bytes of the path (it is too long to print).
        path: String,
        len: usize,
        max: usize,
    },
}

impl ScanError {
    /// The alert the refusal leaves in the audit log (the log only: the
    /// refusal's one line on stderr says it).
    pub fn alert(&self) {
        let emit = |event: &str, fields: serde_json::Value| {
            if let Some(a) = audit::get() {
                a.record(event, Severity::Alert, fields);
            }
        };
        match self {
            ScanError::Limit { bind, limit } => emit(
                "scan_limit",
                json!({ "bind": bind.display().to_string(), "limit": limit, "flag": "--scan-limit" }),
            ),
            ScanError::Link { link, why } => emit(
                "fs_protected_link",
                json!({ "path": link.display().to_string(), "reason": why, "action": "refused" }),
            ),
            ScanError::Open { bind, dir, err } => emit(
                "scan_limit",
                json!({ "bind": bind.display().to_string(), "dir": dir, "reason": err.to_string() }),
            ),
            ScanError::TooDeep {
                bind,
                path,
                len,
                max,
            } => emit(
                "scan_too_deep",
                json!({ "bind": bind.display().to_string(), "path": path, "len": len, "path_max": max, "action": "refused" }),
            ),
        }
    }
}

/// `p` with `.` and `..` resolved as text (no file system access).
pub fn lexical(p: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::RootDir => out.push("/"),
            Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
        }
    }
    out
}

/// Where a control entry that is a symlink leads: the path git, Claude
/// Code and VS Code read through it.
#[derive(Debug, PartialEq, Eq)]
pub enum LinkTarget {
    /// It resolves, in one step, to this canonical path.
    Resolved(PathBuf, Kind),
    /// Its target does not exist (yet): this path, which nothing on the
    /// way to is a symlink.
    Dangling(PathBuf),
    /// It resolves through another symlink (or to itself, or to one of its
    /// own directories): what it names could change during the run.
    Chained,
}

/// Resolves the symlink `link` (an absolute host path without symlinks in
/// its directories).
pub fn resolve_link(link: &Path) -> LinkTarget {
    let Ok(t) = std::fs::read_link(link) else {
        return LinkTarget::Chained;
    };
    let want = lexical(&link.parent().unwrap_or(Path::new("/")).join(t));
    if link.starts_with(&want) {
        return LinkTarget::Chained;
    }
    match std::fs::canonicalize(link) {
        Ok(c) if c == want => {
            let kind = if std::fs::metadata(&c).is_ok_and(|m| m.is_dir()) {
                Kind::Dir
            } else {
                Kind::File
            };
            LinkTarget::Resolved(c, kind)
        }
        Ok(_) => LinkTarget::Chained,
        Err(_) => {
            // Dangling: no component of the way may be a symlink either.
            let mut cur = PathBuf::new();
            for c in want.iter() {
                cur.push(c);
                match std::fs::symlink_metadata(&cur) {
                    Ok(m) if m.file_type().is_symlink() => return LinkTarget::Chained,
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            LinkTarget::Dangling(want)
        }
    }
}

/// Why an op protects the target of a control symlink outside its own
/// bind: [`place_link_targets`] maps it into the bind that holds it.
pub const LINK_TARGET: &str = "invariant link";

/// The ops that protect what the control symlink `link` (inside the
/// writable bind `bind_src` mounted at `bind_dst`) names: its target, read
/// only (a `.git` link: the target's control entries). A target outside
/// this bind gets an op at its canonical host path, placed by
/// [`place_link_targets`]. A chained link is refused.
pub fn link_ops(bind_src: &Path, bind_dst: &Path, link: &Path) -> Result<Vec<Op>, ScanError> {
    let (c, kind) = match resolve_link(link) {
        LinkTarget::Resolved(c, k) => (c, k),
        // Nothing to protect yet; the end sweep takes out what appears.
        LinkTarget::Dangling(_) => return Ok(Vec::new()),
        LinkTarget::Chained => {
            return Err(ScanError::Link {
                link: link.to_path_buf(),
                why: "resolves through another symlink or into its own directory",
            });
        }
    };
    let place = |p: &Path| match p.strip_prefix(bind_src) {
        Ok(rel) => (bind_dst.join(rel), "invariant"),
        Err(_) => (p.to_path_buf(), LINK_TARGET),
    };
    let mut ops = Vec::new();
    if link.file_name() == Some(OsStr::new(".git")) && kind == Kind::Dir {
        for inv in CONTROL.iter().filter(|i| i.rel.starts_with(".git/")) {
            let p = c.join(&inv.rel[5..]);
            if let Ok(m) = std::fs::symlink_metadata(&p)
                && !m.file_type().is_symlink()
            {
                let (dst, why) = place(&p);
                let k = if m.is_dir() { Kind::Dir } else { Kind::File };
                ops.push(Op::new(dst, k, What::ReadOnly, why));
            }
        }
    } else {
        let (dst, why) = place(&c);
        ops.push(Op::new(dst, kind, What::ReadOnly, why));
    }
    Ok(ops)
}

/// The ops for the symlinks inside the protected directory `dir` (at any
/// depth; not `.git/objects` and `.git/refs`, which hold no program):
/// each one's target, as [`link_ops`] protects a control symlink's. A
/// dangling one needs nothing now (its target can be created, but nothing
/// reads it through the link that did not before the run: see the limits
/// in docs/fs.md).
pub fn inner_link_ops(bind_src: &Path, bind_dst: &Path, dir: &Path) -> Result<Vec<Op>, ScanError> {
    if dir.ends_with(".git/objects") || dir.ends_with(".git/refs") {
        return Ok(Vec::new());
    }
    let mut links = Vec::new();
    walk_links(dir, DEFAULT_SCAN_LIMIT, true, &mut |rel, n, _| {
        let p = dir.join(rel).join(n);
        if std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_symlink()) {
            links.push(p);
        }
        Step::Descend
    })?;
    let mut ops = Vec::new();
    for l in links {
        // A link to a place inside the protected directory itself is
        // protected with it.
        if let LinkTarget::Resolved(c, _) = resolve_link(&l)
            && c.starts_with(dir)
        {
            continue;
        }
        ops.extend(link_ops(bind_src, bind_dst, &l)?);
    }
    Ok(ops)
}

/// Puts the [`LINK_TARGET`] ops where the sandbox shows their host path
/// and drops invariants that a denied path hides already:
/// inside the writable bind (host source, sandbox destination) that holds
/// it, as an ordinary invariant; a target in no writable bind is read-only
/// or invisible inside anyway, and its op is dropped.
pub fn place_link_targets(ops: &mut Vec<Op>, rw: &[(&Path, &Path)]) -> Result<(), ScanError> {
    let mut err = None;
    ops.retain_mut(|o| {
        if o.why != LINK_TARGET {
            return true;
        }
        let Some((src, dst)) = rw.iter().find(|(src, _)| o.dst.starts_with(src)) else {
            return false;
        };
        let rel = o.dst.strip_prefix(src).unwrap_or(Path::new(""));
        if rel.as_os_str().is_empty() {
            // A whole writable bind: it cannot be made read-only.
            err.get_or_insert(ScanError::Link {
                link: o.dst.clone(),
                why: "names the root of a writable bind",
            });
            return false;
        }
        o.dst = dst.join(rel);
        o.why = "invariant";
        true
    });
    // Hidden wins: an invariant at or below a denied path (`~/.npmrc` in a
    // home bind is both) would show what the deny node hides.
    let denied: Vec<PathBuf> = ops
        .iter()
        .filter(|o| o.what == What::Deny)
        .map(|o| o.dst.clone())
        .collect();
    ops.retain(|o| {
        !(o.why == "invariant"
            && matches!(o.what, What::ReadOnly | What::Empty)
            && denied.iter().any(|d| o.dst.starts_with(d)))
    });
    err.map_or(Ok(()), Err)
}

/// What the walk tells its visitor to do with a directory entry.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    Descend,
    Skip,
}

/// PATH_MAX: the longest path a system call takes.
pub const PATH_MAX: usize = libc::PATH_MAX as usize;

/// The longest host path the walks at the start let through: what lies
/// deeper cannot be mounted over (a mount takes a path), so finding such an
/// entry refuses the run (room is left for a control entry's own suffix
/// and a different mount destination).
pub const START_PATH_MAX: usize = PATH_MAX - 256;

/// Walks `root` depth-first without following symlinks, at any depth,
/// calling `f(rel_dir, name, is_dir)` for every entry but symlinks;
/// `.git` directories are not entered. Reading more than `limit` entries
/// is an error, and so is an entry whose path is longer than
/// [`START_PATH_MAX`] (it could not be protected).
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
    walk_at(root, limit, links, false, f)
}

/// The walk itself. Each directory is opened relative to its parent's fd
/// (`openat`, never following a symlink) and listed on that fd, so no
/// path longer than PATH_MAX is ever handed to the kernel: with `deep` the
/// walk goes on below PATH_MAX (the end sweep, which reaches such entries
/// through [`Reach`]); without it an entry deeper than [`START_PATH_MAX`]
/// is an error. Directories are
/// opened when they are walked, so the fds held are those of the
/// directories with siblings still to walk (at most the depth).
///
/// While a [`SharedWalks`] lives (the start-up walks), a walk that is not
/// `deep` goes over the one listing of `root`'s tree taken for all of
/// them ([`shared_tree`]) instead of opening each directory again.
fn walk_at(
    root: &Path,
    limit: usize,
    links: bool,
    deep: bool,
    f: &mut dyn FnMut(&Path, &OsStr, bool) -> Step,
) -> Result<(), ScanError> {
    if !deep && let Some(tree) = shared_tree(root, limit) {
        let mut left = limit;
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            // Not in the tree: a directory that could not be opened or
            // listed, which the walk below skips too.
            let Some(entries) = tree.get(&rel) else {
                continue;
            };
            visit(
                root,
                &rel,
                entries,
                &mut left,
                limit,
                links,
                deep,
                f,
                &mut |n| stack.push(rel.join(n)),
            )?;
        }
        return Ok(());
    }
    let mut left = limit;
    traverse(root, &mut |rel, entries, descend| {
        visit(
            root, rel, entries, &mut left, limit, links, deep, f, descend,
        )
    })
}

/// The traversal under every walk: each directory opened relative to its
/// parent's fd (`openat`, never following a symlink) and listed on it,
/// then `on_dir(rel, entries, descend)`, where `descend(name)` enters a
/// subdirectory. A directory that cannot be opened or listed is skipped;
/// out of fds, or an error of `on_dir`, ends it. The fds held are those
/// of the directories with siblings still to walk (at most the depth).
type OnDir<'a> =
    dyn FnMut(&Path, &Listing, &mut dyn FnMut(&OsString)) -> Result<(), ScanError> + 'a;

fn traverse(root: &Path, on_dir: &mut OnDir<'_>) -> Result<(), ScanError> {
    use std::rc::Rc;
    let Ok(top) = open_dir_at(libc::AT_FDCWD, root.as_os_str(), root) else {
        return Ok(());
    };
    // (the parent's fd, this directory's name, its path relative to root)
    let mut stack: Vec<(Option<Rc<std::os::fd::OwnedFd>>, OsString, PathBuf)> =
        vec![(None, OsString::new(), PathBuf::new())];
    let mut first = Some(top);
    while let Some((parent, name, rel)) = stack.pop() {
        let Some(fd) = open_next(root, parent.as_deref(), &name, &rel, &mut first)? else {
            continue;
        };
        drop(parent);
        let fd = Rc::new(fd);
        let Some(entries) = listing(&fd) else {
            continue;
        };
        on_dir(&rel, &entries, &mut |n| {
            stack.push((Some(fd.clone()), n.clone(), rel.join(n)))
        })?;
    }
    Ok(())
}

/// Opens the next directory of a walk: the root (already open, in
/// `first`) or `name` of `parent`. None: it cannot be opened (skipped, as
/// git skips it too); out of fds is an error, never a silent stop.
fn open_next(
    root: &Path,
    parent: Option<&std::os::fd::OwnedFd>,
    name: &OsStr,
    rel: &Path,
    first: &mut Option<std::os::fd::OwnedFd>,
) -> Result<Option<std::os::fd::OwnedFd>, ScanError> {
    use std::os::fd::AsRawFd;
    let Some(p) = parent else {
        return Ok(first.take());
    };
    match open_dir_at(p.as_raw_fd(), name, &root.join(rel)) {
        Ok(fd) => Ok(Some(fd)),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
            let dir: String = root.join(rel).to_string_lossy().chars().take(120).collect();
            Err(ScanError::Open {
                bind: root.to_path_buf(),
                dir,
                err: e,
            })
        }
        Err(_) => Ok(None),
    }
}

/// One directory's entries for a walk: the budget, the depth bound, `f`,
/// and `descend(name)` for each directory `f` wants entered (never a
/// symlink, never `.git`).
#[allow(clippy::too_many_arguments)]
fn visit(
    root: &Path,
    rel: &Path,
    entries: &Listing,
    left: &mut usize,
    limit: usize,
    links: bool,
    deep: bool,
    f: &mut dyn FnMut(&Path, &OsStr, bool) -> Step,
    descend: &mut dyn FnMut(&OsString),
) -> Result<(), ScanError> {
    let base_len = root.as_os_str().len();
    for (n, ft) in entries.iter() {
        if *left == 0 {
            return Err(ScanError::Limit {
                bind: root.to_path_buf(),
                limit,
            });
        }
        *left -= 1;
        let len = base_len + 1 + rel.as_os_str().len() + 1 + n.len();
        if !deep && len > START_PATH_MAX {
            let shown = root.join(rel).join(n);
            let head: String = String::from_utf8_lossy(shown.as_os_str().as_bytes())
                .chars()
                .take(120)
                .collect();
            return Err(ScanError::TooDeep {
                bind: root.to_path_buf(),
                path: head,
                len,
                max: PATH_MAX,
            });
        }
        let dir = ft.is_dir();
        if ft.is_symlink() {
            if links {
                f(rel, n, false);
            }
            continue;
        }
        if f(rel, n, dir) == Step::Descend && dir && n != ".git" {
            descend(n);
        }
    }
    Ok(())
}

/// A tree as the start-up walks see it: each directory below the root
/// (relative; the root is the empty path) that could be opened and
/// listed, with its entries. `.git` directories, symlinks and directories
/// deeper than [`START_PATH_MAX`] are not entered (no walk at the start
/// enters them).
type Tree = std::collections::HashMap<PathBuf, Listing>;

thread_local! {
    /// While a [`SharedWalks`] lives: each root's tree (None: over the
    /// budget of the walk that asked first, or out of fds; walks of that
    /// root then open each directory themselves, as without the guard).
    static SHARED: std::cell::RefCell<Option<std::collections::HashMap<PathBuf, Option<std::rc::Rc<Tree>>>>> =
        const { std::cell::RefCell::new(None) };
}

/// The start-up walks (deny patterns, control directories, the sweep's
/// record) each go over the whole of every writable bind: while this
/// lives, they go over one listing of each tree taken by the first of
/// them, instead of opening and listing every directory four times (in a
/// 100-directory project, about 1,500 system calls less). They are one
/// picture of the tree at one moment, before the command exists, which is
/// what each of them was too; the end sweep, after the command, always
/// lists again (`deep` walks never use the shared tree), and so does any
/// walk once this is dropped.
pub struct SharedWalks(());

impl Drop for SharedWalks {
    fn drop(&mut self) {
        SHARED.with(|s| *s.borrow_mut() = None);
    }
}

/// Starts sharing the start-up walks' listings (see [`SharedWalks`]).
pub fn shared_walks() -> SharedWalks {
    SHARED.with(|s| *s.borrow_mut() = Some(Default::default()));
    SharedWalks(())
}

/// `root`'s shared tree, taken on first use; None without a
/// [`SharedWalks`], or when the whole tree is over `limit` entries (the
/// walk that asked may still be within it, by skipping subtrees).
fn shared_tree(root: &Path, limit: usize) -> Option<std::rc::Rc<Tree>> {
    if let Some(t) = SHARED.with(|s| s.borrow().as_ref().map(|m| m.get(root).cloned()))? {
        return t;
    }
    let t = record(root, limit).map(std::rc::Rc::new);
    SHARED.with(|s| {
        if let Some(m) = s.borrow_mut().as_mut() {
            m.insert(root.to_path_buf(), t.clone());
        }
    });
    t
}

/// Lists the whole tree below `root` (as [`walk_at`] opens it: by fd,
/// never following a symlink). None when it has more than `limit` entries
/// or the fds run out.
fn record(root: &Path, limit: usize) -> Option<Tree> {
    let mut tree = Tree::new();
    let base_len = root.as_os_str().len();
    let mut left = limit;
    traverse(root, &mut |rel, entries, descend| {
        for (n, ft) in entries.iter() {
            left = left.checked_sub(1).ok_or_else(|| ScanError::Limit {
                bind: root.to_path_buf(),
                limit,
            })?;
            let len = base_len + 1 + rel.as_os_str().len() + 1 + n.len();
            if ft.is_dir() && n != ".git" && len <= START_PATH_MAX {
                descend(n);
            }
        }
        tree.insert(rel.to_path_buf(), entries.clone());
        Ok(())
    })
    .ok()?;
    Some(tree)
}

/// Opens the directory `name` of `dirfd` without following a symlink. A
/// directory of ours that cannot be read (the command ran `chmod 111` on
/// it: programs still reach a control file or a `.git` below it by name)
/// is made ours to list again, with an alert; one that is not ours (the
/// command could not have made it) is skipped as before.
fn open_dir_at(dirfd: i32, name: &OsStr, shown: &Path) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let c = std::ffi::CString::new(name.as_bytes())?;
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
    let nofollow = if dirfd == libc::AT_FDCWD {
        0
    } else {
        libc::O_NOFOLLOW
    };
    for attempt in 0..2 {
        // SAFETY: openat with a NUL-terminated name; the fd is owned below.
        let fd = unsafe { libc::openat(dirfd, c.as_ptr(), flags | nofollow) };
        if fd >= 0 {
            // SAFETY: fd was just returned by openat and is ours alone.
            return Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
        }
        let err = std::io::Error::last_os_error();
        if attempt > 0 || err.raw_os_error() != Some(libc::EACCES) {
            return Err(err);
        }
        let p = if dirfd == libc::AT_FDCWD {
            PathBuf::from(name)
        } else {
            Path::new(&format!("/proc/self/fd/{dirfd}")).join(name)
        };
        if regain_as(&p, shown, 0o700).is_none() {
            return Err(err);
        }
    }
    Err(std::io::Error::from_raw_os_error(libc::EACCES))
}

/// A directory's entries as a walk sees them: name and type (from
/// readdir, without following a symlink).
type Listing = std::sync::Arc<Vec<(OsString, sbx_core::dirents::Kind)>>;

/// The entries of the open directory `fd`. The walks at the start (deny
/// patterns, control directories, symlinks in protected directories) go
/// over the same trees: a directory whose stat (device, inode, size, link
/// count, mtime, ctime) is the one of its last listing in this process,
/// and whose ctime was at least 2 s old then, is not listed again.
/// Creating, removing or renaming an entry moves mtime and ctime, and
/// nobody can set a ctime back; the 2 s is the clock tick of the coarsest
/// file systems, within which a change can leave the ctime as it was.
fn listing(fd: &std::os::fd::OwnedFd) -> Option<Listing> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    type Stamp = (u64, u64, i64, i64, i64, i64);
    type Memo = HashMap<(u64, u64), (Stamp, Listing)>;
    static MEMO: OnceLock<Mutex<Memo>> = OnceLock::new();
    let before = std::time::SystemTime::now();
    let st = nix::sys::stat::fstat(fd).ok()?;
    let key = (st.st_dev, st.st_ino);
    let stamp: Stamp = (
        st.st_size as u64,
        st.st_nlink as u64,
        st.st_mtime,
        st.st_mtime_nsec,
        st.st_ctime,
        st.st_ctime_nsec,
    );
    let memo = MEMO.get_or_init(Default::default);
    if let Some((s, l)) = memo.lock().ok()?.get(&key)
        && *s == stamp
    {
        return Some(l.clone());
    }
    let l: Listing = std::sync::Arc::new(sbx_core::dirents::read(fd).ok()?);
    let old = before
        .checked_sub(std::time::Duration::from_secs(2))
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .is_some_and(|t| i128::from(st.st_ctime) < i128::from(t.as_secs()));
    // (and only where the file system keeps honest ctimes: not FUSE or
    // NFS, whose server says what they are, nor FAT).
    if old
        && sbx_core::fsstamp::ctime_vouches_on(st.st_dev, std::os::fd::AsFd::as_fd(fd))
        && let Ok(mut m) = memo.lock()
    {
        m.insert(key, (stamp, l.clone()));
    }
    Some(l)
}

/// A path that can be handed to the kernel for `root/rel`, however long:
/// the path itself when it is short enough, else `/proc/self/fd/N/NAME`
/// with N the parent directory, opened component by component without
/// following symlinks (and kept open as long as this lives).
pub struct Reach {
    _fd: Option<std::os::fd::OwnedFd>,
    pub path: PathBuf,
}

impl Reach {
    pub fn new(root: &Path, rel: &Path) -> Option<Reach> {
        use std::os::fd::AsRawFd;
        let full = root.join(rel);
        if full.as_os_str().len() < PATH_MAX - 1 {
            return Some(Reach {
                _fd: None,
                path: full,
            });
        }
        let name = rel.file_name()?;
        let mut fd = open_path_at(libc::AT_FDCWD, root.as_os_str())?;
        for c in rel.parent()?.iter() {
            fd = open_path_at(fd.as_raw_fd(), c)?;
        }
        let path = Path::new(&format!("/proc/self/fd/{}", fd.as_raw_fd())).join(name);
        Some(Reach {
            _fd: Some(fd),
            path,
        })
    }
}

fn open_path_at(dirfd: i32, name: &OsStr) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let c = std::ffi::CString::new(name.as_bytes()).ok()?;
    let nofollow = if dirfd == libc::AT_FDCWD {
        0
    } else {
        libc::O_NOFOLLOW
    };
    // SAFETY: openat with a NUL-terminated name; the fd is owned below.
    let fd = unsafe {
        libc::openat(
            dirfd,
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC | nofollow,
        )
    };
    // SAFETY: fd was just returned by openat and is ours alone.
    (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Adds `bits` to the mode of directory `d` when it is ours and lacks them
/// (logged as `fs_dir_mode_restored`, alert); None when it is not ours.
fn regain(d: &Path, bits: u32) -> Option<()> {
    regain_as(d, d, bits)
}

/// [`regain`] of `d`, alerted as `shown` (its real path; `d` may be a
/// `/proc/self/fd` one).
fn regain_as(d: &Path, shown: &Path, bits: u32) -> Option<()> {
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
        json!({ "path": shown, "mode": format!("{:o}", m.mode() & 0o7777), "added": format!("{bits:o}") }),
    );
    Some(())
}

/// Directories below a writable bind's root (relative) that hold a control
/// entry ([`is_control_name`]): their invariants are protected too.
pub fn control_dirs(root: &Path, limit: usize) -> Result<Vec<PathBuf>, ScanError> {
    let mut out: Vec<PathBuf> = Vec::new();
    // Symlinks too: a control entry that is a symlink protects its target.
    walk_links(root, limit, true, &mut |rel, n, _| {
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
    /// A symlink's resolved target inside the bind and its identity then
    /// (None: it did not exist): what appears there is taken out.
    target: Option<(PathBuf, Option<(u64, u64)>)>,
}

/// The control entries of one writable bind at the start, and the check
/// at the end.
#[derive(Debug, Clone)]
pub struct Sweep {
    root: PathBuf,
    known: Vec<Known>,
    /// The `.git` directories at the start (relative, device, inode).
    repos: Vec<(PathBuf, u64, u64)>,
    /// Paths that did not exist at the start and that a hook would run
    /// if they appeared ([`hook_watch`]): taken out at the end.
    watch: Vec<PathBuf>,
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
    deep: bool,
) -> Result<(Vec<PathBuf>, Vec<(PathBuf, u64, u64)>), ScanError> {
    let names = swept_names();
    let nested = nested();
    let mut out = Vec::new();
    let mut gits = Vec::new();
    let exists =
        |r: &Path| Reach::new(root, r).is_some_and(|x| std::fs::symlink_metadata(&x.path).is_ok());
    walk_at(root, limit, true, deep, &mut |rel, n, dir| {
        if names.iter().any(|x| OsStr::new(x) == n) {
            out.push(rel.join(n));
            return Step::Skip;
        }
        if dir && let Some((_, kids)) = nested.iter().find(|(d, _)| OsStr::new(d) == n) {
            for k in kids {
                let r = rel.join(n).join(k);
                if exists(&r) {
                    out.push(r);
                }
            }
        }
        if n == ".git" && dir {
            let r = rel.join(n);
            if let Some((dev, ino)) = Reach::new(root, &r).and_then(|x| identity(&x.path)) {
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
            if exists(&rel) {
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
        let (found, gits) = find_controls(root, limit, None, false)?;
        let mut watch = hook_watch(root);
        for rel in &found {
            if rel.file_name() == Some(OsStr::new(".claude"))
                && let Some(d) = rel.parent().filter(|d| !d.as_os_str().is_empty())
            {
                watch.extend(hook_watch(&root.join(d)));
            }
        }
        let known = found
            .into_iter()
            .filter(|rel| !crate::placeholder::is_placeholder(&root.join(rel)))
            .filter_map(|rel| {
                let p = root.join(&rel);
                let link = std::fs::read_link(&p).ok();
                let target = link.as_ref().and_then(|_| match resolve_link(&p) {
                    LinkTarget::Resolved(c, _) if c.starts_with(root) => {
                        let id = identity(&c);
                        Some((c, id))
                    }
                    LinkTarget::Dangling(l) if l.starts_with(root) => Some((l, None)),
                    _ => None,
                });
                identity(&p).map(|(dev, ino)| Known {
                    rel,
                    dev,
                    ino,
                    link,
                    target,
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
            watch,
        })
    }

    /// After the sandbox is gone (nothing of it runs) and the placeholders
    /// were removed: every control entry that was not there at the start
    /// is moved to `quarantine`; an original moved away is put back.
    /// Each finding is an alert.
    pub fn finish(&self, quarantine: &Path) {
        // Unbounded: the sandbox could grow the tree past any limit to hide
        // a control file behind it (the next run's search refuses to start
        // on such a tree instead).
        // Deep too: a control file below PATH_MAX is reached through its
        // directory's fd (the next run refuses to start on such a tree).
        let found = match find_controls(&self.root, usize::MAX, Some(&self.repos), true) {
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
            let shown = self.root.join(&rel);
            let Some(reach) = Reach::new(&self.root, &rel) else {
                continue;
            };
            let p = reach.path.clone();
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
                    "path": shown.display().to_string(),
                    "quarantined": moved.as_ref().ok().map(|_| dest.display().to_string()),
                    "truncated": moved.as_ref().ok().copied().unwrap_or(false),
                    "error": moved.as_ref().err().map(|e| e.to_string()),
                }),
            );
        }
        // What a hook would run had it appeared (a makefile that takes
        // precedence over the one `make` reads).
        for w in &self.watch {
            if std::fs::symlink_metadata(w).is_err() {
                continue;
            }
            let rel = w.strip_prefix(&self.root).unwrap_or(w);
            let dest = quarantine_path(quarantine, &self.root, rel);
            let moved = move_out(quarantine, w, &dest);
            audit::emit(
                "fs_protected_created",
                Severity::Alert,
                json!({
                    "path": w.display().to_string(),
                    "via": "hook",
                    "quarantined": moved.as_ref().ok().map(|_| dest.display().to_string()),
                    "truncated": moved.as_ref().ok().copied().unwrap_or(false),
                    "error": moved.as_ref().err().map(|e| e.to_string()),
                }),
            );
        }
        // A control symlink of the user's whose target did not exist at the
        // start (or was replaced): what is there now is taken out.
        for k in &self.known {
            let Some((t, id)) = &k.target else { continue };
            let p = self.root.join(&k.rel);
            if identity(&p) != Some((k.dev, k.ino)) || std::fs::read_link(&p).ok() != k.link {
                continue;
            }
            let now = identity(t);
            if now.is_none() || now == *id {
                continue;
            }
            let rel = t.strip_prefix(&self.root).unwrap_or(t);
            let dest = quarantine_path(quarantine, &self.root, rel);
            let moved = move_out(quarantine, t, &dest);
            audit::emit(
                if id.is_some() {
                    "fs_protected_replaced"
                } else {
                    "fs_protected_created"
                },
                Severity::Alert,
                json!({
                    "path": t.display().to_string(),
                    "via": p.display().to_string(),
                    "quarantined": moved.as_ref().ok().map(|_| dest.display().to_string()),
                    "truncated": moved.as_ref().ok().copied().unwrap_or(false),
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
        let _ = walk_at(&self.root, usize::MAX, true, true, &mut |rel, n, _| {
            let Some(reach) = Reach::new(&self.root, &rel.join(n)) else {
                return Step::Descend;
            };
            let p = reach.path.clone();
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

/// `quarantine/<sbx id>/<bind root, flattened>/<rel>`; a `rel` too long
/// to be a path there becomes `deep-<n>/<its last name>` (the alert names
/// the original path).
fn quarantine_path(quarantine: &Path, root: &Path, rel: &Path) -> PathBuf {
    static DEEP: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let short;
    let rel = if rel.as_os_str().len() > 1024 {
        let n = DEEP.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        short =
            Path::new(&format!("deep-{n}")).join(rel.file_name().unwrap_or(OsStr::new("entry")));
        short.as_path()
    } else {
        rel
    };
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
fn copy_out(quarantine: &Path, from: &Path, to: &Path) -> std::io::Result<bool> {
    prepare_quarantine(quarantine, to)?;
    let start = crate::quarantine::budget(quarantine);
    let mut budget = start;
    let r = copy_tree(from, to, &mut budget);
    crate::quarantine::spent(start - budget);
    r
}

/// Moves `from` to `to` (a rename; across file systems a copy, then the
/// removal of `from`). Symlinks are moved as symlinks, never followed.
/// Returns whether data was left out of a copy (see
/// [`crate::quarantine::COPY_CAP`]).
fn move_out(quarantine: &Path, from: &Path, to: &Path) -> std::io::Result<bool> {
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
        Ok(()) => Ok(false),
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            let start = crate::quarantine::budget(quarantine);
            let mut budget = start;
            let truncated = copy_tree(from, to, &mut budget);
            crate::quarantine::spent(start - budget);
            let truncated = truncated?;
            remove_tree(from)?;
            Ok(truncated)
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

/// Copies a tree into the quarantine: files keep their holes and at most
/// `budget` data bytes are copied in all (a sparse file of terabytes, or
/// many large files, cannot fill the quarantine's disk). Returns whether
/// data was left out.
fn copy_tree(from: &Path, to: &Path, budget: &mut u64) -> std::io::Result<bool> {
    let m = std::fs::symlink_metadata(from)?;
    if m.file_type().is_symlink() {
        std::os::unix::fs::symlink(std::fs::read_link(from)?, to)?;
        Ok(false)
    } else if m.is_dir() {
        std::fs::create_dir(to)?;
        let mut cut = false;
        for e in std::fs::read_dir(from)? {
            let e = e?;
            cut |= copy_tree(&e.path(), &to.join(e.file_name()), budget)?;
        }
        Ok(cut)
    } else if m.is_file() {
        crate::quarantine::copy_sparse(from, to, budget)
    } else {
        // FIFOs, sockets, devices: nothing to keep, they are removed.
        Ok(false)
    }
}

/// At any depth (the sandbox made the tree): `sbx_core::rmtree`.
fn remove_tree(p: &Path) -> std::io::Result<()> {
    std::fs::symlink_metadata(p)?;
    sbx_core::rmtree::remove_tree(p)
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
        assert_eq!(
            f("/p/a/.cargo/config.toml").as_deref(),
            Some(".cargo/config.toml")
        );
        assert_eq!(f("/p/.cargo/registry/x"), None);
        assert_eq!(f("/p/.npmrc").as_deref(), Some(".npmrc"));
        assert_eq!(
            f("/p/.devcontainer/devcontainer.json").as_deref(),
            Some(".devcontainer")
        );
        assert_eq!(f("/p/.github/workflows/ci.yml"), None);
        assert!(is_control_name(OsStr::new(".cargo")));
        assert!(is_control_name(OsStr::new("mise.toml")));
        assert!(!is_control_name(OsStr::new(".cursorrules")));
        assert_eq!(nested(), vec![(".cargo", vec!["config.toml", "config"])]);
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
    fn hook_words_name_the_scripts_a_command_runs() {
        let d = tempfile::tempdir().unwrap();
        let b = d.path();
        for f in ["a.sh", "t/b.sh", "c.js", "conf", "m/Makefile"] {
            std::fs::create_dir_all(b.join(f).parent().unwrap()).unwrap();
            std::fs::write(b.join(f), "").unwrap();
        }
        let cmds: Vec<String> = [
            "sh a.sh",
            "bash -e t/b.sh --x",
            "node c.js",
            "python3 missing.py",
            "cat conf | sh",
            "make -C m all",
            "./run.sh --fast",
            "node -e console.log(1)",
            "python3 -m black .",
            "$CLAUDE_PROJECT_DIR/hooks/x.sh",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let exp = vec![("$CLAUDE_PROJECT_DIR", b.to_path_buf())];
        let got = inside(b, hook_words(&cmds, Some(b), &exp));
        for want in [
            "a.sh",
            "t/b.sh",
            "c.js",
            "missing.py",
            "conf",
            "m/Makefile",
            "run.sh",
            "hooks/x.sh",
        ] {
            assert!(got.iter().any(|g| g == want), "{want} missing from {got:?}");
        }
        assert!(!got.iter().any(|g| g.contains("console")), "{got:?}");
        assert_eq!(got.len(), 8, "{got:?}");
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

    /// Every (dir, name, is_dir) a walk shows, in order, skipping `skip`.
    fn seen(root: &Path, limit: usize, deep: bool, skip: &str) -> Result<Vec<String>, ScanError> {
        let mut v = Vec::new();
        walk_at(root, limit, true, deep, &mut |rel, n, dir| {
            v.push(format!("{}/{}:{dir}", rel.display(), n.to_string_lossy()));
            if n == skip { Step::Skip } else { Step::Descend }
        })?;
        Ok(v)
    }

    #[test]
    fn shared_walks_see_what_live_walks_see_and_end_with_their_guard() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        for d in ["a/b/c", "a/.git/hooks", "big/1", "big/2", "big/3", "e"] {
            std::fs::create_dir_all(r.join(d)).unwrap();
        }
        std::fs::write(r.join("a/b/f"), "").unwrap();
        std::os::unix::fs::symlink("a", r.join("link")).unwrap();
        let live = seen(r, 100, false, "").unwrap();
        let walks = shared_walks();
        assert_eq!(seen(r, 100, false, "").unwrap(), live);
        assert_eq!(seen(r, 100, false, "").unwrap(), live, "replayed");
        // An entry made after the tree was taken: the start-up walks keep
        // their one picture; the end sweep's (deep) walk lists again.
        std::fs::write(r.join("e/new"), "").unwrap();
        assert_eq!(seen(r, 100, false, "").unwrap(), live);
        assert!(
            seen(r, 100, true, "")
                .unwrap()
                .contains(&"e/new:false".to_string())
        );
        drop(walks);
        assert!(
            seen(r, 100, false, "")
                .unwrap()
                .contains(&"e/new:false".to_string())
        );
        // The budget: the whole tree is over it, the walk that skips `big`
        // is not; with a shared tree it gets the same answers as without.
        let live_skip = seen(r, 10, false, "big");
        let _walks = shared_walks();
        assert_eq!(seen(r, 10, false, "big").ok(), live_skip.ok());
        assert!(matches!(
            seen(r, 10, false, ""),
            Err(ScanError::Limit { .. })
        ));
        assert!(seen(r, 10, false, "big").is_ok());
    }
}
