//! Which directory is the project, wherever in it the caller stands.
//!
//! The project is the top level of the git repository the start directory
//! is in (what `git rev-parse --show-toplevel` answers), else the nearest
//! ancestor holding a `.claude/` directory (where Claude Code finds the
//! project's settings), else the start directory itself. git is never run
//! to find it: as root in another user's repository git refuses ("dubious
//! ownership") precisely so that nobody runs that repository's config, and
//! reading a few names needs no program. The command still starts in the
//! start directory.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The project found from a start directory, and why it is that one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Project {
    /// The project directory (granted writable, its settings read, its
    /// repository checked by sbx-gitguard).
    pub root: PathBuf,
    /// Where the command starts (the caller's directory or --chdir).
    pub start: PathBuf,
    /// One line for explain: how `root` was chosen.
    pub why: String,
}

/// Whether `dir/.git` makes `dir` a work tree's top level the way git's
/// discovery accepts it: a `.git` directory holding HEAD, objects and refs,
/// or a `.git` file naming one (`gitdir: ...`: worktrees, submodules).
fn is_top_level(dir: &Path) -> bool {
    let dot = dir.join(".git");
    let Ok(m) = std::fs::metadata(&dot) else {
        return false;
    };
    if m.is_dir() {
        return is_git_dir(&dot);
    }
    let Some(s) = small(&dot) else {
        return false;
    };
    let Some(target) = s.trim_end().strip_prefix("gitdir: ") else {
        return false;
    };
    is_git_dir(&dir.join(target))
}

/// A gitfile or `commondir` (a few bytes of text): a file an earlier run
/// left can be a FIFO, huge, or a link to `/proc/kmsg`, whose read blocks;
/// only a regular file of at most 4 KiB outside /proc is read, without
/// blocking (sbx_core::input).
fn small(p: &Path) -> Option<String> {
    sbx_core::input::read_regular_string(p, 4096).ok()
}

/// git's `is_git_directory`, by names only: HEAD, objects/ and refs/
/// (a `commondir` file may hold the last two, as in a linked worktree).
fn is_git_dir(g: &Path) -> bool {
    if !g.join("HEAD").is_file() {
        return false;
    }
    let common = small(&g.join("commondir"))
        .map(|c| g.join(c.trim_end()))
        .unwrap_or_else(|| g.to_path_buf());
    common.join("objects").is_dir() && common.join("refs").is_dir()
}

/// For a linked worktree `top` (its `.git` a file naming
/// `M/.git/worktrees/NAME`) that lies inside its main work tree `M`: `M`.
/// The sandbox's git then works through `M`'s staged `.git` (sbx-gitguard
/// carries the worktree's admin dir across calls), which a project of
/// `top` alone could not reach.
fn nesting_main(top: &Path) -> Option<PathBuf> {
    let dot = top.join(".git");
    let m = std::fs::symlink_metadata(&dot).ok()?;
    if !m.is_file() {
        return None;
    }
    let s = small(&dot)?;
    let target = top.join(s.lines().next()?.strip_prefix("gitdir: ")?.trim());
    let admin = std::fs::canonicalize(target).ok()?;
    let worktrees = admin.parent()?;
    let git = worktrees.parent()?;
    let main = git.parent()?;
    (worktrees.file_name()? == "worktrees"
        && git.file_name()? == ".git"
        && top.starts_with(main)
        && top != main
        && std::fs::symlink_metadata(git).is_ok_and(|m| m.is_dir())
        && is_git_dir(git))
    .then(|| main.to_path_buf())
}

fn dev(p: &Path) -> Option<u64> {
    std::fs::metadata(p).ok().map(|m| m.dev())
}

/// Finds the project from `start` (absolute and canonical). `home` is never
/// chosen (its `.claude/` holds the user settings, and a dotfiles
/// repository there would make the whole home writable), nor `/`: then the
/// project stays the start directory and `why` says so.
pub fn find(start: &Path, home: Option<&Path>) -> Project {
    let refused = |d: &Path| d == Path::new("/") || home.is_some_and(|h| h == d);
    let here = |why: String| Project {
        root: start.to_path_buf(),
        start: start.to_path_buf(),
        why,
    };
    // git does not cross into another file system while looking up
    // (GIT_DISCOVERY_ACROSS_FILESYSTEM unset): neither do we.
    let start_dev = dev(start);
    let mut git_top = None;
    for d in start.ancestors() {
        if dev(d) != start_dev {
            break;
        }
        if is_top_level(d) {
            git_top = Some(d.to_path_buf());
            break;
        }
    }
    // A repository whose top level is refused is ignored (noted in `why`).
    let mut note = String::new();
    match git_top {
        Some(top) if refused(&top) => {
            note = format!(
                "; the repository at {} is never made the project (the home or /)",
                top.display()
            );
        }
        Some(top) if let Some(main) = nesting_main(&top).filter(|m| !refused(m)) => {
            let why = format!(
                "the main work tree of the linked worktree {} inside it (its .git and git stage are the main one's)",
                top.display()
            );
            return Project {
                root: main,
                start: start.to_path_buf(),
                why,
            };
        }
        Some(top) => {
            let why = if top == start {
                "the repository's top level (the start directory)".to_string()
            } else {
                format!(
                    "the repository's top level, found from {} (as git rev-parse --show-toplevel)",
                    start.display()
                )
            };
            return Project {
                root: top,
                start: start.to_path_buf(),
                why,
            };
        }
        None => {}
    }
    for d in start.ancestors() {
        if refused(d) {
            break;
        }
        if d.join(".claude").is_dir() {
            let why = if d == start {
                format!("the start directory (it holds .claude/; not in a git repository{note})")
            } else {
                format!(
                    "the nearest directory above {} holding .claude/ (not in a git repository{note})",
                    start.display()
                )
            };
            return Project {
                root: d.to_path_buf(),
                start: start.to_path_buf(),
                why,
            };
        }
    }
    here(format!(
        "the start directory (no git repository and no .claude/ above it{note})"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mkrepo(d: &Path) {
        std::fs::create_dir_all(d.join(".git/objects")).unwrap();
        std::fs::create_dir_all(d.join(".git/refs")).unwrap();
        std::fs::write(d.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    }

    #[test]
    fn repository_top_level_from_a_subdirectory() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().canonicalize().unwrap().join("p");
        let sub = root.join("a/b");
        std::fs::create_dir_all(&sub).unwrap();
        mkrepo(&root);
        // A nearer .claude/ inside the repository does not win.
        std::fs::create_dir_all(root.join("a/.claude")).unwrap();
        let p = find(&sub, None);
        assert_eq!(p.root, root);
        assert_eq!(p.start, sub);
        assert!(p.why.contains("top level, found from"), "{}", p.why);
        assert_eq!(find(&root, None).root, root);
    }

    #[test]
    fn an_invalid_dot_git_is_skipped_like_git_does() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().canonicalize().unwrap();
        mkrepo(&root);
        let inner = root.join("x");
        // No HEAD: git keeps looking up.
        std::fs::create_dir_all(inner.join(".git/objects")).unwrap();
        std::fs::create_dir_all(inner.join("s")).unwrap();
        assert_eq!(find(&inner.join("s"), None).root, root);
        // A .git file naming a git directory (a linked worktree).
        let wt = root.join("wt");
        std::fs::create_dir_all(wt.join("s")).unwrap();
        let gd = root.join("gd");
        std::fs::create_dir_all(&gd).unwrap();
        std::fs::write(gd.join("HEAD"), "ref: refs/heads/x\n").unwrap();
        std::fs::write(gd.join("commondir"), "../.git\n").unwrap();
        std::fs::write(wt.join(".git"), "gitdir: ../gd\n").unwrap();
        assert_eq!(find(&wt.join("s"), None).root, wt);
    }

    #[test]
    fn a_linked_worktree_inside_its_main_work_tree_makes_that_the_project() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().canonicalize().unwrap().join("p");
        mkrepo(&root);
        let admin = root.join(".git/worktrees/f2");
        std::fs::create_dir_all(&admin).unwrap();
        std::fs::write(admin.join("HEAD"), "ref: refs/heads/f2\n").unwrap();
        std::fs::write(admin.join("commondir"), "../..\n").unwrap();
        let wt = root.join(".wt/f2");
        std::fs::create_dir_all(wt.join("s")).unwrap();
        std::fs::write(wt.join(".git"), format!("gitdir: {}\n", admin.display())).unwrap();
        let p = find(&wt.join("s"), None);
        assert_eq!(p.root, root);
        assert_eq!(p.start, wt.join("s"));
        assert!(p.why.contains("linked worktree"), "{}", p.why);
        // One outside its main work tree stays its own project.
        let out = t.path().canonicalize().unwrap().join("out");
        std::fs::create_dir_all(&out).unwrap();
        std::fs::write(out.join(".git"), format!("gitdir: {}\n", admin.display())).unwrap();
        assert_eq!(find(&out, None).root, out);
    }

    #[test]
    fn outside_git_the_nearest_dot_claude_but_never_home() {
        let t = tempfile::tempdir().unwrap();
        let base = t.path().canonicalize().unwrap();
        let home = base.join("home");
        let proj = home.join("proj");
        let sub = proj.join("src/deep");
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::create_dir_all(home.join(".claude")).unwrap();
        // Only the home holds .claude/: the start directory stays.
        let p = find(&sub, Some(&home));
        assert_eq!(p.root, sub);
        assert!(p.why.contains("no git repository"), "{}", p.why);
        std::fs::create_dir_all(proj.join(".claude")).unwrap();
        let p = find(&sub, Some(&home));
        assert_eq!(p.root, proj);
        assert!(p.why.contains("holding .claude/"), "{}", p.why);
        // A dotfiles repository in the home is not the project.
        mkrepo(&home);
        let p = find(&sub, Some(&home));
        assert_eq!(p.root, proj);
        assert!(p.why.contains("never made the project"), "{}", p.why);
        std::fs::remove_dir_all(proj.join(".claude")).unwrap();
        assert_eq!(find(&sub, Some(&home)).root, sub);
    }
}
