//! The loose objects of a staged repository verified in full by an earlier
//! run, by stat (inode, size, ctime): the next run's snapshot reads only the
//! others (issue 19). Used only for the git dir a `--stage` covers: there
//! the sandbox cannot write the objects (sbx-fs lays the stage over the
//! whole .git), so they change only by the user's own git and by the
//! import, and any change of a file changes its ctime, which a user cannot
//! set back. The cache lives in sbx's registry directory (0700, outside the
//! repository), never in the repository the command can write.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::objects::LooseStat;

/// Most bytes of a cache file read (about 10 million objects).
const MAX_FILE: u64 = 1 << 30;
/// Caches kept (the most recently saved): repositories that are gone leave
/// theirs behind, and the registry directory is often a tmpfs.
const KEEP: usize = 32;
const PREFIX: &str = "gitguard-loose-";
const TMP_PREFIX: &str = ".gitguard-loose.";

fn file(git_dir: &Path) -> Option<PathBuf> {
    let (dev, ino) = crate::layout::ident(git_dir)?;
    let dir = sbx_core::registry::dir().ok()?;
    Some(dir.join(format!("{PREFIX}{dev}-{ino}.json")))
}

/// The cached stats of `git_dir`'s loose objects (empty when there is none
/// or it is unusable: then every object is read, as without a cache).
pub fn load(git_dir: &Path) -> BTreeMap<String, LooseStat> {
    file(git_dir)
        .and_then(|p| sbx_core::input::read_regular(&p, MAX_FILE).ok())
        .and_then(|d| serde_json::from_slice(&d).ok())
        .unwrap_or_default()
}

/// Replaces the cache of `git_dir` (atomically; a failure only costs the
/// next run a full read), unless it holds `stats` already (`loaded`: what
/// [`load`] gave this run).
pub fn save(
    git_dir: &Path,
    stats: &BTreeMap<String, LooseStat>,
    loaded: Option<&BTreeMap<String, LooseStat>>,
) {
    if loaded == Some(stats) {
        return;
    }
    let Some(p) = file(git_dir) else {
        return;
    };
    // A run killed between writing its temporary file and renaming it left
    // that file: the next save removes every one (a concurrent save whose
    // file goes too only fails, and its next run reads in full).
    let dir = p.parent().unwrap_or(Path::new("/"));
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.filter_map(|e| e.ok()) {
            if e.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
                let _ = fs::remove_file(e.path());
            }
        }
    }
    let r = (|| -> std::io::Result<()> {
        let data = serde_json::to_vec(stats).map_err(std::io::Error::other)?;
        let mut tmp = tempfile::Builder::new()
            .prefix(TMP_PREFIX)
            .tempfile_in(p.parent().unwrap_or(Path::new("/")))?;
        tmp.write_all(&data)?;
        tmp.persist(&p).map_err(|e| e.error)?;
        Ok(())
    })();
    if let Err(e) = r {
        tracing::warn!(cache = %p.display(), "cannot save the verified loose objects: {e}");
        let _ = fs::remove_file(&p);
    }
    prune(p.parent().unwrap_or(Path::new("/")));
}

/// Removes all but the [`KEEP`] most recently saved caches.
fn prune(dir: &Path) {
    let Ok(rd) = fs::read_dir(dir) else {
        return;
    };
    let mut caches: Vec<(std::time::SystemTime, PathBuf)> = rd
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(PREFIX))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    if caches.len() <= KEEP {
        return;
    }
    caches.sort_by_key(|c| std::cmp::Reverse(c.0));
    for (_, p) in &caches[KEEP..] {
        let _ = fs::remove_file(p);
    }
}
