//! The mount plan: the list of mount operations that build the sandbox
//! root, computed on the host before any namespace exists. A plan is plain
//! data (testable without privileges); `mounts` executes it.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::spec::Spec;
use crate::sys;

pub use sbx_spec::invariants::Kind;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum What {
    /// A bind of `sources[src]`, recursive.
    Bind {
        src: usize,
        ro: bool,
    },
    /// A fresh tmpfs; `owned` gives its root to the identity inside.
    Tmpfs {
        size: u64,
        mode: u32,
        owned: bool,
    },
    /// The PID namespace's own /proc.
    Proc,
    /// A new devpts instance.
    Devpts,
    Symlink {
        target: PathBuf,
    },
    /// Hidden: an empty, unreadable (mode 000) read-only file or directory.
    Deny,
    /// Protected placeholder: an empty read-only file or directory.
    Empty,
    /// The object already at `dst` bound onto itself read-only.
    ReadOnly,
    /// An overlay of the sources `lower` (read-only), `upper` and `work`
    /// (`--git-stage`): writes land in `upper`, never in `lower`.
    Overlay {
        lower: usize,
        upper: usize,
        work: usize,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    pub dst: PathBuf,
    pub kind: Kind,
    pub what: What,
    /// Skip (never create) when the destination does not exist: the masks
    /// in /proc, whose entries depend on the kernel.
    pub optional: bool,
    /// Why this op exists (for the audit log and messages).
    pub why: &'static str,
}

impl Op {
    pub fn new(dst: impl Into<PathBuf>, kind: Kind, what: What, why: &'static str) -> Op {
        Op {
            dst: dst.into(),
            kind,
            what,
            optional: false,
            why,
        }
    }
}

/// A bind source, opened on the host before any namespace exists: the bind
/// is made from this fd, so what was checked is what is mounted.
#[derive(Debug)]
pub struct Source {
    pub fd: OwnedFd,
    /// Canonical host path (from the fd), for rules and messages.
    pub path: PathBuf,
    pub kind: Kind,
    pub dev: u64,
    pub ino: u64,
    pub rw: bool,
    /// A system directory (the defaults): not scanned for name patterns.
    pub system: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("{flag} {path}: cannot open bind source")]
    Source {
        flag: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{flag} {path}: only directories, regular files, character devices and Unix sockets can be bound"
    )]
    SourceType { flag: &'static str, path: PathBuf },
    #[error("--rw {path}: inside {protected}, which sbx-fs always keeps read-only")]
    RwProtected { path: PathBuf, protected: String },
    #[error("cannot read {path}")]
    Host {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The system directories bound read-only by default (symlinks, as on
/// merged-/usr systems, are recreated as symlinks).
pub const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
];

/// The whole plan: the sources to bind and the ops, ordered so that a
/// mount point's parents are mounted first.
#[derive(Debug, Default)]
pub struct Plan {
    pub sources: Vec<Source>,
    pub ops: Vec<Op>,
    /// Directories bound onto themselves so that they cannot be renamed or
    /// removed (the ancestors of protected paths inside writable binds,
    /// see [`crate::protect::pins`]); mounted parent first, before any op
    /// deeper than them.
    pub pins: Vec<PathBuf>,
    /// `--write-quota`: the writable directory binds seen through an
    /// overlay over the budget's tmpfs.
    pub quota: Option<QuotaPlan>,
}

/// The budget and the sources of the binds under it (the position in
/// `srcs` is the bind's layer number).
#[derive(Debug, Clone)]
pub struct QuotaPlan {
    pub budget: crate::quota::Budget,
    pub srcs: Vec<usize>,
}

impl QuotaPlan {
    /// The layer number of a user bind op of a source under the budget.
    pub fn layer_of(&self, op: &Op) -> Option<usize> {
        match op.what {
            What::Bind { src, ro: false } if op.why == "bind" => {
                self.srcs.iter().position(|s| *s == src)
            }
            _ => None,
        }
    }
}

/// Opens `path` (following the symlinks of the path the user gave, never a
/// magic link) as an O_PATH fd and records what it is.
pub fn open_source(
    flag: &'static str,
    path: &Path,
    rw: bool,
    system: bool,
) -> Result<Source, PlanError> {
    let err = |source| PlanError::Source {
        flag,
        path: path.to_path_buf(),
        source,
    };
    let fd = sys::openat2(
        libc::AT_FDCWD,
        path,
        libc::O_PATH,
        0,
        sys::RESOLVE_NO_MAGICLINKS,
    )
    .map_err(err)?;
    let st = sys::fstat(fd.as_raw_fd()).map_err(err)?;
    let kind = if sys::is_dir(&st) {
        Kind::Dir
    } else if sys::is_reg(&st)
        || st.st_mode & libc::S_IFMT == libc::S_IFCHR
        // A Unix socket the caller names (Claude Code's allowUnixSockets):
        // reaching its server is the grant; nothing else goes through it.
        || st.st_mode & libc::S_IFMT == libc::S_IFSOCK
    {
        Kind::File
    } else {
        return Err(PlanError::SourceType {
            flag,
            path: path.to_path_buf(),
        });
    };
    let canon = sys::fd_path(fd.as_raw_fd()).map_err(err)?;
    Ok(Source {
        fd,
        path: canon,
        kind,
        dev: st.st_dev,
        ino: st.st_ino,
        rw,
        system,
    })
}

/// Number of components (for parent-first ordering).
pub fn depth(p: &Path) -> usize {
    p.components().count()
}

/// Sorts ops parent-first, keeping the given order among equals.
pub fn order(ops: &mut [Op]) {
    ops.sort_by_key(|o| depth(&o.dst));
}

/// System binds, /proc, /dev, /tmp: the skeleton every sandbox has.
pub fn skeleton(plan: &mut Plan, spec: &Spec) -> Result<(), PlanError> {
    if spec.system {
        for d in SYSTEM_DIRS {
            let p = Path::new(d);
            let Ok(meta) = std::fs::symlink_metadata(p) else {
                continue;
            };
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(p).map_err(|source| PlanError::Host {
                    path: p.to_path_buf(),
                    source,
                })?;
                plan.ops
                    .push(Op::new(p, Kind::File, What::Symlink { target }, "system"));
            } else if meta.is_dir() {
                let src = open_source("system", p, false, true)?;
                plan.sources.push(src);
                let i = plan.sources.len() - 1;
                plan.ops.push(Op::new(
                    p,
                    Kind::Dir,
                    What::Bind { src: i, ro: true },
                    "system",
                ));
            }
        }
    }
    crate::proc::ops(plan);
    crate::dev::ops(plan, spec)?;
    plan.ops.push(Op::new(
        "/tmp",
        Kind::Dir,
        What::Tmpfs {
            size: spec.tmp_size,
            mode: 0o1777,
            owned: false,
        },
        "tmp",
    ));
    Ok(())
}

/// Whether a writable bind source lies inside an invariant path (the
/// list is [`crate::protect::CONTROL`]).
pub fn rw_inside_invariant(path: &Path) -> Option<String> {
    crate::protect::invariant_of(path).map(|(p, _)| p)
}

pub use crate::protect::is_claude_settings;

/// The `.git` entries that a `--git-stage` overlay protects instead of a
/// read-only bind: git writes them there, sbx-gitguard imports what it
/// verifies. config and hooks stay read-only whatever the stage.
pub const STAGED_GIT: &[&str] = &["HEAD", "objects", "refs"];

/// The invariant ops for one writable bind (source `s` at `dst`); `staged`
/// is the git dir of a `--git-stage` (its overlay op gets its source
/// indexes from the caller). Fails closed: when the tree holds more than
/// [`crate::protect::DEFAULT_SCAN_LIMIT`] entries, the whole bind is
/// hidden (sbx-fs itself calls [`invariants_limited`] and refuses to start).
pub fn invariants(s: &Source, dst: &Path, staged: Option<&Path>) -> Vec<Op> {
    match invariants_limited(s, dst, staged, crate::protect::DEFAULT_SCAN_LIMIT) {
        Ok(ops) => ops,
        Err(e) => {
            e.alert();
            vec![Op::new(dst, s.kind, What::Deny, "deny")]
        }
    }
}

/// [`invariants`], with the walk bounded by `limit` entries (an error
/// beyond it, never a silent stop). Every directory holding a control
/// entry, at any depth, has its invariants protected.
pub fn invariants_limited(
    s: &Source,
    dst: &Path,
    staged: Option<&Path>,
    limit: usize,
) -> Result<Vec<Op>, crate::protect::ScanError> {
    if s.kind != Kind::Dir {
        return Ok(Vec::new());
    }
    let mut ops = invariants_in(s, Path::new(""), dst, true, staged)?;
    for rel in crate::protect::control_dirs(&s.path, limit)? {
        ops.extend(invariants_in(s, &rel, &dst.join(&rel), false, staged)?);
    }
    Ok(ops)
}

/// Whether `dotgit` is a regular `.git` file naming `G/worktrees/NAME` of
/// the staged git dir `G` (read without following a symlink, bounded).
fn staged_worktree_link(dotgit: &Path, g: &Path) -> bool {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(dotgit)
    else {
        return false;
    };
    if !f.metadata().is_ok_and(|m| m.is_file()) {
        return false;
    }
    let mut t = String::new();
    if f.take(4096).read_to_string(&mut t).is_err() {
        return false;
    }
    let Some(target) = t.lines().next().and_then(|l| l.strip_prefix("gitdir:")) else {
        return false;
    };
    let mut norm = PathBuf::new();
    for c in dotgit
        .parent()
        .unwrap_or(Path::new("/"))
        .join(target.trim())
        .components()
    {
        match c {
            std::path::Component::ParentDir => {
                norm.pop();
            }
            std::path::Component::CurDir => {}
            c => norm.push(c),
        }
    }
    norm.parent() == Some(g.join("worktrees").as_path())
        && norm
            .file_name()
            .is_some_and(|n| !n.as_encoded_bytes().starts_with(b"."))
}

/// The invariant ops for the directory `rel` of a writable bind, mounted at
/// `dst`. At the bind's root (`top`), a missing `.git` or `.claude` becomes
/// a placeholder; deeper, only what exists is protected.
fn invariants_in(
    s: &Source,
    rel_dir: &Path,
    dst: &Path,
    top: bool,
    staged: Option<&Path>,
) -> Result<Vec<Op>, crate::protect::ScanError> {
    let mut ops = Vec::new();
    let mut refused = None;
    // Where the bind's root is mounted (`dst` is this directory's place).
    let mut root_dst = dst.to_path_buf();
    for _ in rel_dir.components() {
        root_dst.pop();
    }
    let base = s.path.join(rel_dir);
    // Another sandbox's placeholder counts as missing: this one then holds
    // it as its own placeholder too.
    let look = |rel: &str| {
        let p = base.join(rel);
        std::fs::symlink_metadata(&p)
            .ok()
            .filter(|_| !crate::placeholder::is_placeholder(&p))
    };
    let mut overlay = None;
    let mut protect = |rel: String, kind: Kind, exists: Option<std::fs::Metadata>| match exists {
        // What git, Claude Code and VS Code read through it: its target.
        Some(m) if m.file_type().is_symlink() => {
            match crate::protect::link_ops(&s.path, &root_dst, &base.join(&rel)) {
                Ok(v) => ops.extend(v),
                Err(e) => refused = refused.take().or(Some(e)),
            }
        }
        Some(m) => {
            ops.push(Op::new(
                dst.join(&rel),
                if m.is_dir() { Kind::Dir } else { Kind::File },
                What::ReadOnly,
                "invariant",
            ));
            // Symlinks inside a protected directory (a hook linked to a
            // script of the project): their targets too.
            if m.is_dir() {
                match crate::protect::inner_link_ops(&s.path, &root_dst, &base.join(&rel)) {
                    Ok(v) => ops.extend(v),
                    Err(e) => refused = refused.take().or(Some(e)),
                }
            }
        }
        None => ops.push(Op::new(dst.join(&rel), kind, What::Empty, "invariant")),
    };
    // .git: each control entry read-only (git still writes the index,
    // logs, ORIG_HEAD ... beside them); a missing entry is a placeholder.
    match look(".git") {
        None if !top => {}
        None => protect(".git".to_string(), Kind::Dir, None),
        Some(m) if m.is_dir() => {
            let stage_here = staged == Some(base.join(".git").as_path());
            if stage_here {
                overlay = Some(Op::new(
                    dst.join(".git"),
                    Kind::Dir,
                    What::Overlay {
                        lower: usize::MAX,
                        upper: usize::MAX,
                        work: usize::MAX,
                    },
                    "git stage",
                ));
            }
            for inv in crate::protect::CONTROL {
                let Some(name) = inv.rel.strip_prefix(".git/") else {
                    continue;
                };
                if stage_here && STAGED_GIT.contains(&name) {
                    continue;
                }
                // info/ is new to the list: protected where it exists (a
                // placeholder would show in every repository without one).
                let found = look(inv.rel);
                if name == "info" && found.is_none() {
                    continue;
                }
                protect(inv.rel.to_string(), inv.kind, found);
            }
        }
        // A linked worktree of the staged repository: `git worktree remove`
        // deletes it, and sbx-gitguard checks it against the admin dir it
        // imports (or removes it with that dir's refusal).
        Some(_) if staged.is_some_and(|g| staged_worktree_link(&base.join(".git"), g)) => {}
        // A gitfile (worktree): it names the repository, keep it as it is.
        Some(m) => protect(".git".to_string(), Kind::File, Some(m)),
    }
    // .claude: read-only as a whole. That covers settings*.json for every
    // name, existing or not, and skills/ and commands/, without creating
    // anything in the user's tree; a missing .claude is a placeholder.
    let is_claude_dir = top && s.path.file_name().is_some_and(|n| n == ".claude");
    if !is_claude_dir && (top || look(".claude").is_some()) {
        protect(".claude".to_string(), Kind::Dir, look(".claude"));
        // The project's scripts its settings run (hooks, statusLine),
        // existing or not; those in .claude are covered by it already.
        for rel in crate::protect::project_hook_scripts(&base) {
            let first = Path::new(&rel).iter().next().unwrap_or_default();
            if crate::protect::is_control_name(first) {
                continue;
            }
            let found = look(&rel);
            protect(rel, Kind::File, found);
        }
    }
    // The other control entries, where they exist (one that appears
    // during the run is the end sweep's: see crate::protect::Sweep).
    for inv in crate::protect::CONTROL {
        if inv.rel.starts_with(".git/") || inv.rel == ".claude" {
            continue;
        }
        if let Some(m) = look(inv.rel) {
            protect(inv.rel.to_string(), inv.kind, Some(m));
        }
    }
    // A bind of a .claude directory itself (~/.claude, the agent's own state
    // directory): its settings*.json, skills/ and commands/.
    if is_claude_dir {
        for inv in crate::protect::CLAUDE_DIR {
            protect(inv.rel.to_string(), inv.kind, look(inv.rel));
        }
        // The scripts its settings run (hooks, statusLine), existing or not.
        for rel in crate::protect::claude_hook_scripts(&base) {
            // Inside a directory protected as a whole already.
            let first = Path::new(&rel).iter().next().unwrap_or_default();
            if crate::protect::CLAUDE_DIR
                .iter()
                .any(|i| i.kind == Kind::Dir && first == i.rel)
            {
                continue;
            }
            let found = look(&rel);
            protect(rel, Kind::File, found);
        }
        if let Ok(rd) = std::fs::read_dir(&base) {
            for e in rd.flatten() {
                let n = e.file_name();
                let Some(n) = n.to_str() else { continue };
                if is_claude_settings(n) && n != "settings.json" && n != "settings.local.json" {
                    protect(n.to_string(), Kind::File, look(n));
                }
            }
        }
    }
    ops.extend(overlay);
    refused.map_or(Ok(ops), Err)
}

/// The environment the command starts with: the caller's through the
/// environment policy (sbx_core::envpolicy; what it dropped is returned to
/// be reported), TMPDIR pointed at the sandbox's fresh /tmp when the caller
/// had one, then --unsetenv/--setenv. With --clearenv nothing of the
/// caller's is looked at.
pub fn command_env(
    spec: &Spec,
) -> (
    Vec<(OsString, OsString)>,
    Option<sbx_core::envpolicy::Filtered>,
) {
    let mut filtered = None;
    let mut env = if spec.clearenv {
        Vec::new()
    } else {
        let caller = sbx_core::chain::current_env();
        let had_tmpdir = caller.iter().any(|(k, _)| k == "TMPDIR");
        let mut f = sbx_core::envpolicy::filter(caller, &spec.env_policy);
        let mut env = std::mem::take(&mut f.env);
        // The caller's TMPDIR is a host path: inside, /tmp is the sandbox's
        // own. Passed as it is only when asked for (--pass-env TMPDIR).
        if had_tmpdir && !env.iter().any(|(k, _)| k == "TMPDIR") {
            sbx_core::chain::set_env(&mut env, "TMPDIR", "/tmp");
        }
        f.env = env.clone();
        filtered = Some(f);
        env
    };
    for op in &spec.env_ops {
        match op {
            crate::spec::EnvOp::Set(k, v) => {
                sbx_core::chain::set_env(&mut env, k.clone(), v.clone())
            }
            crate::spec::EnvOp::Unset(k) => sbx_core::chain::unset_env(&mut env, k),
        }
    }
    (env, filtered)
}

/// The deepest op before `i` whose destination is a directory containing
/// `ops[i].dst`.
pub fn enclosing(ops: &[Op], i: usize) -> Option<usize> {
    let dst = &ops[i].dst;
    (0..i)
        .rev()
        .find(|&j| ops[j].kind == Kind::Dir && dst.starts_with(&ops[j].dst) && dst != &ops[j].dst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordering_is_parent_first_and_stable() {
        let mut ops = vec![
            Op::new("/a/b/c", Kind::File, What::Deny, "t"),
            Op::new("/a", Kind::Dir, What::Proc, "t"),
            Op::new("/x/y", Kind::Dir, What::Devpts, "t"),
            Op::new("/a/b", Kind::Dir, What::Devpts, "t"),
        ];
        order(&mut ops);
        let d: Vec<_> = ops.iter().map(|o| o.dst.to_str().unwrap()).collect();
        assert_eq!(d, ["/a", "/x/y", "/a/b", "/a/b/c"]);
        assert_eq!(enclosing(&ops, 3), Some(2));
        assert_eq!(enclosing(&ops, 1), None);
    }

    #[test]
    fn invariant_paths_refused_for_rw() {
        assert_eq!(
            rw_inside_invariant(Path::new("/p/.git")).as_deref(),
            Some(".git")
        );
        assert_eq!(
            rw_inside_invariant(Path::new("/p/.git/hooks/x")).as_deref(),
            Some(".git/hooks")
        );
        assert_eq!(
            rw_inside_invariant(Path::new("/p/.git/info")).as_deref(),
            Some(".git/info")
        );
        assert_eq!(rw_inside_invariant(Path::new("/p/.git/logs")), None);
        assert_eq!(
            rw_inside_invariant(Path::new("/p/.claude/settings.local.json")).as_deref(),
            Some(".claude/settings.local.json")
        );
        assert_eq!(
            rw_inside_invariant(Path::new("/p/.claude/agents")).as_deref(),
            Some(".claude/agents")
        );
        assert_eq!(rw_inside_invariant(Path::new("/home/u/.claude")), None);
        assert_eq!(rw_inside_invariant(Path::new("/p/src")), None);
    }

    #[test]
    fn invariants_cover_existing_and_missing() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join(".git/objects")).unwrap();
        std::fs::write(d.path().join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
        let s = open_source("--rw", d.path(), true, false).unwrap();
        let ops = invariants(&s, Path::new("/w"), None);
        let find = |p: &str| ops.iter().find(|o| o.dst == Path::new(p)).unwrap().clone();
        assert_eq!(find("/w/.git/HEAD").what, What::ReadOnly);
        assert_eq!(find("/w/.git/objects").what, What::ReadOnly);
        assert_eq!(find("/w/.git/objects").kind, Kind::Dir);
        assert_eq!(find("/w/.git/config").what, What::Empty);
        assert_eq!(find("/w/.git/config").kind, Kind::File);
        assert_eq!(find("/w/.git/hooks").kind, Kind::Dir);
        assert_eq!(find("/w/.claude").what, What::Empty);
    }
}
