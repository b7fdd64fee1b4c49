//! `--git-stage DIR`: the repository's `.git` seen through an overlay whose
//! upper layer is `DIR/git/upper`. git commits, branches and tags inside the
//! sandbox, while the host's `.git` (HEAD, objects/, refs/: invariants) is
//! never written by it; sbx-gitguard verifies what landed in the stage and
//! imports it after the command (`sbx-gitguard run --stage DIR`).
//!
//! The stage, made by sbx-gitguard: `DIR/gitdir` (one line, the canonical
//! git dir), `DIR/git/upper/` and `DIR/git/work/` (empty, one file
//! system), all owned by the caller and writable by nobody else.

use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error("--git-stage {dir}: {why}")]
    Bad { dir: PathBuf, why: String },
}

/// A checked stage: the git dir it is for and its two overlay directories.
#[derive(Debug)]
pub struct Stage {
    pub gitdir: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
}

fn bad(dir: &Path, why: impl Into<String>) -> StageError {
    StageError::Bad {
        dir: dir.to_path_buf(),
        why: why.into(),
    }
}

/// A directory owned by `uid`, not a symlink, writable by nobody else.
fn private_dir(dir: &Path, p: &Path, uid: u32, empty: bool) -> Result<(), StageError> {
    let m = std::fs::symlink_metadata(p).map_err(|e| bad(dir, format!("{}: {e}", p.display())))?;
    if !m.is_dir() {
        return Err(bad(dir, format!("{} is not a directory", p.display())));
    }
    if m.uid() != uid || m.mode() & 0o022 != 0 {
        return Err(bad(
            dir,
            format!(
                "{} must be owned by uid {uid} and writable by nobody else",
                p.display()
            ),
        ));
    }
    if empty
        && std::fs::read_dir(p)
            .map_err(|e| bad(dir, format!("{}: {e}", p.display())))?
            .next()
            .is_some()
    {
        return Err(bad(dir, format!("{} is not empty", p.display())));
    }
    Ok(())
}

/// Checks the stage; nothing is created or changed.
pub fn open(dir: &Path) -> Result<Stage, StageError> {
    if !dir.is_absolute() {
        return Err(bad(dir, "must be an absolute path"));
    }
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    private_dir(dir, dir, uid, false)?;
    private_dir(dir, &dir.join("git"), uid, false)?;
    let upper = dir.join("git/upper");
    let work = dir.join("git/work");
    private_dir(dir, &upper, uid, true)?;
    private_dir(dir, &work, uid, true)?;
    let (u, w) = (
        std::fs::metadata(&upper).map_err(|e| bad(dir, e.to_string()))?,
        std::fs::metadata(&work).map_err(|e| bad(dir, e.to_string()))?,
    );
    if u.dev() != w.dev() {
        return Err(bad(dir, "upper and work must be on one file system"));
    }
    let mut text = String::new();
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(dir.join("gitdir"))
        .and_then(|f| f.take(4096).read_to_string(&mut text))
        .map_err(|e| bad(dir, format!("gitdir: {e}")))?;
    let named = PathBuf::from(text.trim_end_matches('\n'));
    if !named.is_absolute() || named.file_name().is_none_or(|n| n != ".git") {
        return Err(bad(
            dir,
            format!(
                "gitdir '{}' must be the absolute path of a .git directory",
                named.display()
            ),
        ));
    }
    let gitdir = std::fs::canonicalize(&named)
        .map_err(|e| bad(dir, format!("gitdir {}: {e}", named.display())))?;
    if gitdir != named || !gitdir.is_dir() {
        return Err(bad(
            dir,
            format!(
                "gitdir '{}' must be the canonical path of a .git directory",
                named.display()
            ),
        ));
    }
    if upper.starts_with(&gitdir) || gitdir.starts_with(dir) {
        return Err(bad(dir, "the stage and the git dir must not overlap"));
    }
    Ok(Stage {
        gitdir,
        upper,
        work,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn stage(gitdir: &str) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        for s in ["git", "git/upper", "git/work"] {
            std::fs::create_dir(d.path().join(s)).unwrap();
            std::fs::set_permissions(d.path().join(s), std::fs::Permissions::from_mode(0o700))
                .unwrap();
        }
        std::fs::write(d.path().join("gitdir"), format!("{gitdir}\n")).unwrap();
        d
    }

    #[test]
    fn accepts_a_well_formed_stage() {
        let repo = tempfile::tempdir().unwrap();
        let g = repo.path().canonicalize().unwrap().join(".git");
        std::fs::create_dir(&g).unwrap();
        let s = stage(g.to_str().unwrap());
        let st = open(s.path()).unwrap();
        assert_eq!(st.gitdir, g);
        assert_eq!(st.upper, s.path().join("git/upper"));
    }

    #[test]
    fn refuses_what_is_not_a_stage() {
        let repo = tempfile::tempdir().unwrap();
        let g = repo.path().canonicalize().unwrap().join(".git");
        std::fs::create_dir(&g).unwrap();
        let msg = |s: &tempfile::TempDir| open(s.path()).unwrap_err().to_string();
        // Not a .git directory.
        let s = stage(repo.path().to_str().unwrap());
        assert!(
            msg(&s).contains("must be the absolute path of a .git"),
            "{}",
            msg(&s)
        );
        // Relative.
        assert!(msg(&stage(".git")).contains("absolute"));
        // Group-writable upper.
        let s = stage(g.to_str().unwrap());
        std::fs::set_permissions(
            s.path().join("git/upper"),
            std::fs::Permissions::from_mode(0o770),
        )
        .unwrap();
        assert!(msg(&s).contains("writable by nobody else"), "{}", msg(&s));
        // A non-empty upper (a stage used twice).
        let s = stage(g.to_str().unwrap());
        std::fs::write(s.path().join("git/upper/HEAD"), "x").unwrap();
        assert!(msg(&s).contains("not empty"), "{}", msg(&s));
        // gitdir a symlink.
        let s = stage(g.to_str().unwrap());
        std::fs::remove_file(s.path().join("gitdir")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", s.path().join("gitdir")).unwrap();
        assert!(msg(&s).contains("gitdir:"), "{}", msg(&s));
    }
}
