//! Where the repository is: its git dirs (main, linked worktrees,
//! submodules, nested repositories) and its work trees.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("--repo {0}: no such directory")]
    Missing(PathBuf),
    #[error(
        "--repo {0}: not a git repository (no .git here; give the top of a work tree or a bare git dir)"
    )]
    NotRepo(PathBuf),
    #[error("--repo {path}: .git file does not name a git dir ({what})")]
    BadGitFile { path: PathBuf, what: String },
    #[error("--repo {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{0}: reftable ref storage is not supported")]
    Reftable(PathBuf),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnitKind {
    /// The repository's common git dir.
    Main,
    /// A linked worktree's private git dir (`worktrees/NAME`).
    Worktree,
    /// A submodule's git dir (`modules/NAME`).
    Submodule,
    /// A repository nested in the work tree (`sub/.git`).
    Nested,
}

impl UnitKind {
    pub fn has_objects(self) -> bool {
        self != UnitKind::Worktree
    }
}

/// One git dir to check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    pub path: PathBuf,
    pub kind: UnitKind,
    /// The work tree whose relative paths (core.hooksPath) it uses.
    pub work_tree: Option<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct Layout {
    /// The work tree given (None for a bare repository).
    pub work_tree: Option<PathBuf>,
    /// The git dir of the given work tree (may be a linked worktree's).
    pub git_dir: PathBuf,
    /// The common git dir (refs, objects, config).
    pub common_dir: PathBuf,
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> LayoutError + '_ {
    move |source| LayoutError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Whether `p` has the shape git accepts as a git dir: HEAD, objects/, refs/
/// (followed through symlinks, as git follows them).
pub fn is_git_dir_shaped(p: &Path) -> bool {
    let f = |n: &str| fs::metadata(p.join(n));
    matches!(f("HEAD"), Ok(m) if !m.is_dir())
        && matches!(f("objects"), Ok(m) if m.is_dir())
        && matches!(f("refs"), Ok(m) if m.is_dir())
}

/// The target of a `.git` file (`gitdir: X`), resolved against its directory.
pub fn read_gitfile(p: &Path) -> Option<PathBuf> {
    let text = crate::fsutil::read_text(p, crate::fsutil::MAX_SMALL).ok()??;
    let t = text.lines().next()?.strip_prefix("gitdir:")?.trim();
    if t.is_empty() {
        return None;
    }
    Some(p.parent().unwrap_or(Path::new("/")).join(t))
}

/// Finds the repository at `dir` (no search upwards).
pub fn find(dir: &Path) -> Result<Layout, LayoutError> {
    find_with(dir, false)
}

/// [`find`] for a repository that may be damaged (HEAD deleted or replaced
/// by a directory, refs/ or objects/ removed): a work tree's `.git`
/// directory, or a bare dir with a config and one of HEAD/refs/objects,
/// is accepted; the snapshot's identity check (device and inode of the git
/// dir) then says whether it is the repository the snapshot was taken of.
pub fn find_damaged(dir: &Path) -> Result<Layout, LayoutError> {
    find_with(dir, true)
}

fn damaged_shape(p: &Path) -> bool {
    crate::fsutil::is_real_dir(p)
        && p.join("config").is_file()
        && ["HEAD", "refs", "objects"]
            .iter()
            .any(|n| fs::symlink_metadata(p.join(n)).is_ok())
}

fn find_with(dir: &Path, lenient: bool) -> Result<Layout, LayoutError> {
    let shaped = |p: &Path| is_git_dir_shaped(p) || (lenient && damaged_shape(p));
    if !dir.is_dir() {
        return Err(LayoutError::Missing(dir.to_path_buf()));
    }
    let dir = fs::canonicalize(dir).map_err(io_err(dir))?;
    let dotgit = dir.join(".git");
    let (work_tree, git_dir) = match fs::symlink_metadata(&dotgit) {
        Ok(m) if m.is_dir() => (Some(dir.clone()), dotgit),
        Ok(m) if m.is_file() => {
            let Some(t) = read_gitfile(&dotgit) else {
                return Err(LayoutError::BadGitFile {
                    path: dir,
                    what: "no 'gitdir:' line".into(),
                });
            };
            let t = fs::canonicalize(&t).map_err(|e| LayoutError::BadGitFile {
                path: dir.clone(),
                what: format!("{}: {e}", t.display()),
            })?;
            (Some(dir.clone()), t)
        }
        _ if shaped(&dir) => (None, dir.clone()),
        _ => return Err(LayoutError::NotRepo(dir)),
    };
    if !shaped(&git_dir) && !git_dir.join("commondir").is_file() {
        return Err(LayoutError::NotRepo(dir));
    }
    let common_dir =
        match crate::fsutil::read_text(&git_dir.join("commondir"), crate::fsutil::MAX_SMALL) {
            Ok(Some(c)) => fs::canonicalize(git_dir.join(c.trim())).map_err(io_err(&git_dir))?,
            _ => git_dir.clone(),
        };
    if !shaped(&common_dir) {
        return Err(LayoutError::NotRepo(dir));
    }
    if let Ok(Some(cfg)) =
        crate::fsutil::read_text(&common_dir.join("config"), crate::fsutil::MAX_CONFIG)
        && let Ok(e) = crate::gitconfig::parse(&cfg)
        && e.iter().any(|e| {
            e.section == "extensions"
                && e.name == "refstorage"
                && e.value.as_deref() == Some("reftable")
        })
    {
        return Err(LayoutError::Reftable(common_dir));
    }
    Ok(Layout {
        work_tree,
        git_dir,
        common_dir,
    })
}

impl Layout {
    /// The main work tree (of the common dir), when it is not bare.
    pub fn main_work_tree(&self) -> Option<PathBuf> {
        if self.common_dir.file_name().is_some_and(|n| n == ".git") {
            self.common_dir.parent().map(Path::to_path_buf)
        } else {
            None
        }
    }

    /// Work trees to scan: the given one, the main one, every linked one.
    pub fn work_trees(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = Vec::new();
        let mut push = |p: PathBuf| {
            if p.is_dir() && !v.contains(&p) {
                v.push(p);
            }
        };
        if let Some(w) = &self.work_tree {
            push(w.clone());
        }
        if let Some(w) = self.main_work_tree() {
            push(w);
        }
        for wt in worktree_dirs(&self.common_dir) {
            if let Ok(Some(g)) =
                crate::fsutil::read_text(&wt.join("gitdir"), crate::fsutil::MAX_SMALL)
                && let Some(p) = Path::new(g.trim()).parent()
            {
                push(p.to_path_buf());
            }
        }
        v
    }

    /// Every git dir: the common one, linked worktrees, submodules (and
    /// theirs), and the repositories nested in the work trees (`nested`).
    pub fn units(&self, nested: &BTreeSet<PathBuf>) -> Vec<Unit> {
        let mut out = self.own_units();
        out.extend(nested_units(nested));
        out
    }

    /// The git dirs known without a scan of the work trees: the common
    /// one, linked worktrees, submodules (and theirs). [`Layout::units`]
    /// starts with these.
    pub fn own_units(&self) -> Vec<Unit> {
        let mut out = vec![Unit {
            path: self.common_dir.clone(),
            kind: UnitKind::Main,
            work_tree: self.main_work_tree().or(self.work_tree.clone()),
        }];
        for wt in worktree_dirs(&self.common_dir) {
            out.push(Unit {
                path: wt,
                kind: UnitKind::Worktree,
                work_tree: None,
            });
        }
        modules(&self.common_dir, &mut out);
        out
    }
}

/// The repositories nested in the work trees (found by their scans), and
/// their submodules: the rest of [`Layout::units`].
pub fn nested_units(nested: &BTreeSet<PathBuf>) -> Vec<Unit> {
    let mut out = Vec::new();
    for n in nested {
        let wt = n.parent().map(Path::to_path_buf);
        out.push(Unit {
            path: n.clone(),
            kind: UnitKind::Nested,
            work_tree: wt,
        });
        modules(n, &mut out);
    }
    out
}

/// `worktrees/*` of a common dir.
pub fn worktree_dirs(common: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(common.join("worktrees"))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.join("HEAD").exists())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Submodule git dirs under `git_dir/modules` (names may contain '/'), and
/// theirs, recursively.
pub fn modules(git_dir: &Path, out: &mut Vec<Unit>) {
    fn rec(d: &Path, out: &mut Vec<Unit>, depth: usize) {
        if depth > 16 {
            return;
        }
        let Ok(rd) = fs::read_dir(d) else { return };
        let mut ps: Vec<PathBuf> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        ps.sort();
        for p in ps {
            if !fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir()) {
                continue;
            }
            if is_git_dir_shaped(&p) {
                out.push(Unit {
                    path: p.clone(),
                    kind: UnitKind::Submodule,
                    work_tree: None,
                });
                rec(&p.join("modules"), out, depth + 1);
            } else {
                rec(&p, out, depth + 1);
            }
        }
    }
    rec(&git_dir.join("modules"), out, 0)
}

/// What a work tree holds that git could take for a repository.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scan {
    /// Directories shaped like a bare repository (HEAD + objects/ + refs/),
    /// other than `.git` dirs.
    pub bare_shaped: BTreeSet<PathBuf>,
    /// `.git` directories below the top (nested repositories).
    pub nested: BTreeSet<PathBuf>,
    /// `.git` files below the top and where they point.
    pub gitfiles: BTreeMap<PathBuf, PathBuf>,
    /// Directories that could not be listed, with why: whatever is below
    /// them was not seen.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unlisted: BTreeMap<PathBuf, String>,
}

/// Walks a work tree (not following symlinks, not entering git dirs).
/// Each directory is listed through [`crate::dirlist`]: the walk after the
/// command lists again only the directories whose stat changed (one
/// `stat` for each of the others).
pub fn scan(root: &Path) -> Scan {
    use crate::dirlist::Listed;
    let mut s = Scan::default();
    // A directory is listed when it is found, and its fd closed at once:
    // the walk holds listings, not descriptors (a directory of a thousand
    // subdirectories took every descriptor of the process while the git
    // dirs were read beside it: attacker helper-54).
    let listed = |p: &Path, s: &mut Scan| match crate::dirlist::list(p) {
        Ok(l) => Some(Listed { fd: None, ..l }),
        Err(e) if crate::fsutil::no_directory(&e) => None,
        Err(e) => {
            s.unlisted.insert(p.to_path_buf(), e.to_string());
            None
        }
    };
    let mut stack = vec![(root.to_path_buf(), 0usize, listed(root, &mut s))];
    while let Some((d, depth, listed_d)) = stack.pop() {
        let Some(Listed { entries, .. }) = listed_d else {
            continue;
        };
        let top = d == root;
        for (name, kind) in entries.iter() {
            let p = d.join(name);
            if name == ".git" {
                // The top's own `.git` file (a linked worktree) is recorded
                // too: rewritten to name another repository, git would run
                // that repository's config.
                if top && !kind.is_file() {
                    continue;
                }
                if kind.is_dir() {
                    s.nested.insert(p);
                } else if kind.is_file() {
                    let t = read_gitfile(&p).unwrap_or_default();
                    s.gitfiles.insert(p, t);
                }
                continue;
            }
            if !kind.is_dir() {
                continue;
            }
            // By stat, as git looks: a directory the command made
            // unlistable (mode 0111) is still a repository for git, and a
            // case-folding file system finds `head` as HEAD.
            if is_git_dir_shaped(&p) {
                s.bare_shaped.insert(p);
                continue;
            }
            if depth < 64 {
                let sub = listed(&p, &mut s);
                stack.push((p, depth + 1, sub));
            }
        }
    }
    s
}

/// (dev, ino) of a path.
pub fn ident(p: &Path) -> Option<(u64, u64)> {
    fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}
