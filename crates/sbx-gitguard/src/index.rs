//! What the sandbox's index may not carry to the host: anything that makes
//! `git status` and `git diff` on the host show less than the work tree
//! holds.
//!
//! - `skip-worktree` (extended flag) and `assume-unchanged` (the "valid"
//!   flag): git does not look at the file at all; a backdoored file marked
//!   so is invisible to `git status`, `git diff` and `git add -A`. Cleared,
//!   with an alert naming the paths.
//! - Sparse directory entries (sparse index: a tree entry, mode 040000, for
//!   a whole directory outside the sparse cone, always skip-worktree): they
//!   hide every file below. Dropped (the host's git sees those files as
//!   untracked or compares them with HEAD again), with the same alert.
//! - Stat data (ctime, mtime, size, inode, device): git trusts an entry
//!   whose stat data matches the file and does not read it again, so an
//!   index written by hand with the backdoored file's stat data and the
//!   clean blob's id hides the change. Every entry's stat data is zeroed:
//!   the host's git reads each file once and refreshes its index.
//! - Extensions: the index is written anew by libgit2, which writes none of
//!   the ones that hide changes: the untracked cache (`UNTR`: a stale cache
//!   claims a directory has no untracked files), the fsmonitor token
//!   (`FSMN`: entries marked clean without a stat), split index (`link`),
//!   sparse index (`sdir`); cached trees (`TREE`) are cleared before writing.
//!   Resolve-undo (`REUC`) and the offset tables hide nothing.

/// git's "valid" flag: assume-unchanged.
pub const ASSUME_VALID: u16 = 0x8000;
/// Extended flag: skip-worktree.
pub const SKIP_WORKTREE: u16 = 1 << 14;
/// The flag saying extended flags follow.
const EXTENDED: u16 = 0x4000;
const S_IFMT: u32 = 0o170000;
const S_IFDIR: u32 = 0o040000;

/// What was taken out of the sandbox's index.
#[derive(Debug, Default, Clone)]
pub struct Hidden {
    pub skip_worktree: Vec<String>,
    pub assume_unchanged: Vec<String>,
    pub sparse_dirs: Vec<String>,
}

impl Hidden {
    pub fn is_empty(&self) -> bool {
        self.skip_worktree.is_empty()
            && self.assume_unchanged.is_empty()
            && self.sparse_dirs.is_empty()
    }
}

/// Clears what hides the entry's file from the host's git; returns false
/// when the entry must be dropped (a sparse directory entry).
pub fn sanitize(e: &mut git2::IndexEntry, h: &mut Hidden) -> bool {
    let path = String::from_utf8_lossy(&e.path).into_owned();
    if e.mode & S_IFMT == S_IFDIR {
        h.sparse_dirs.push(path);
        return false;
    }
    if e.flags_extended & SKIP_WORKTREE != 0 {
        e.flags_extended &= !SKIP_WORKTREE;
        h.skip_worktree.push(path.clone());
    }
    if e.flags & ASSUME_VALID != 0 {
        e.flags &= !ASSUME_VALID;
        h.assume_unchanged.push(path);
    }
    if e.flags_extended == 0 {
        // No extended flag left: the entry is written in the short form.
        e.flags &= !EXTENDED;
    }
    e.ctime = git2::IndexTime::new(0, 0);
    e.mtime = git2::IndexTime::new(0, 0);
    e.file_size = 0;
    e.ino = 0;
    e.dev = 0;
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(mode: u32, flags: u16, ext: u16) -> git2::IndexEntry {
        git2::IndexEntry {
            ctime: git2::IndexTime::new(5, 0),
            mtime: git2::IndexTime::new(5, 0),
            dev: 1,
            ino: 2,
            mode,
            uid: 0,
            gid: 0,
            file_size: 9,
            id: git2::Oid::zero(),
            flags,
            flags_extended: ext,
            path: b"a/b".to_vec(),
        }
    }

    #[test]
    fn bits_cleared_stat_zeroed_sparse_dirs_dropped() {
        let mut h = Hidden::default();
        let mut e = entry(0o100644, ASSUME_VALID | 3, SKIP_WORKTREE);
        assert!(sanitize(&mut e, &mut h));
        assert_eq!(e.flags, 3, "the name length bits stay");
        assert_eq!(e.flags_extended, 0);
        assert_eq!((e.mtime.seconds(), e.file_size, e.ino), (0, 0, 0));
        assert_eq!(h.skip_worktree, ["a/b"]);
        assert_eq!(h.assume_unchanged, ["a/b"]);
        let mut d = entry(0o040000, 0, SKIP_WORKTREE);
        assert!(!sanitize(&mut d, &mut h));
        assert_eq!(h.sparse_dirs, ["a/b"]);
    }
}
