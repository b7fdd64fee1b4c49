//! Hard links to the object files of a git dir, taken before the command
//! (`run` only): objects the command deletes, or files it replaces, can be
//! linked back. Links cost no space and no copying; they do not protect a
//! file modified in place (same inode), which the checks still report.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The prefix of the keep directory inside a git dir (the top-level check
/// skips it).
pub const PREFIX: &str = ".sbx-gitguard-keep.";

/// The registry kind of keep directories (sbx_core::registry): a dead
/// run's is found by any later run, whatever repository it guards.
pub const REG_KIND: &str = "gitguard-keep";

pub struct Keep {
    pub dir: PathBuf,
    objects: PathBuf,
    /// Dropped after the directory is removed (field order).
    _entry: Option<sbx_core::registry::Entry>,
}

impl Keep {
    /// Links every pack file and the listed loose objects of `git_dir`.
    pub fn create(git_dir: &Path, loose: &crate::looseset::LooseSet) -> io::Result<Keep> {
        sbx_core::registry::reap(REG_KIND, remove_registered);
        remove_stale(git_dir);
        let dir = git_dir.join(format!("{PREFIX}{}", std::process::id()));
        if dir.exists() {
            sbx_core::rmtree::remove_tree(&dir)?;
        }
        // Registered before it exists: a SIGKILL from here on leaves an
        // entry the next run reaps.
        let entry = sbx_core::registry::register(REG_KIND, &dir)
            .map_err(|e| tracing::warn!(keep = %dir.display(), "not registered: {e}"))
            .ok();
        fs::DirBuilder::new().mode(0o700).create(&dir)?;
        let keep = Keep {
            dir,
            objects: git_dir.join("objects"),
            _entry: entry,
        };
        let r = keep.fill(loose);
        if r.is_err() {
            let _ = sbx_core::rmtree::remove_tree(&keep.dir);
        }
        r.map(|()| keep)
    }

    fn fill(&self, loose: &crate::looseset::LooseSet) -> io::Result<()> {
        if let Ok(rd) = fs::read_dir(self.objects.join("pack")) {
            fs::DirBuilder::new()
                .mode(0o700)
                .create(self.dir.join("pack"))?;
            for e in rd.filter_map(|e| e.ok()) {
                let n = e.file_name();
                if n.to_string_lossy().starts_with("tmp_")
                    || !e.file_type().is_ok_and(|t| t.is_file())
                {
                    continue;
                }
                link(&e.path(), &self.dir.join("pack").join(&n))?;
            }
        }
        for id in loose.ids() {
            let (a, b) = id.split_at(2);
            let d = self.dir.join(a);
            if !d.exists() {
                fs::DirBuilder::new().mode(0o700).create(&d)?;
            }
            link(&self.objects.join(a).join(b), &d.join(b))?;
        }
        Ok(())
    }

    /// Links back every kept file that is gone or was replaced by another
    /// file; returns the paths restored.
    pub fn restore(&self) -> Vec<PathBuf> {
        // Files linked back: the directories are listed again.
        crate::dirlist::Settled::changed();
        let mut out = Vec::new();
        // Never link into a directory the command put in place of objects/.
        if !crate::fsutil::is_real_dir(&self.objects) {
            return out;
        }
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return out;
        };
        for sub in rd.filter_map(|e| e.ok()) {
            let name = sub.file_name();
            let Ok(files) = fs::read_dir(sub.path()) else {
                continue;
            };
            for f in files.filter_map(|e| e.ok()) {
                let kept = f.path();
                let target = self.objects.join(&name).join(f.file_name());
                let same = match (fs::symlink_metadata(&kept), fs::symlink_metadata(&target)) {
                    (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
                    _ => false,
                };
                if same {
                    continue;
                }
                let parent = self.objects.join(&name);
                if !crate::fsutil::is_real_dir(&parent) {
                    let _ = crate::fsutil::remove(&parent);
                    if fs::create_dir_all(&parent).is_err() {
                        continue;
                    }
                    if let Some((u, g)) = crate::fsutil::owner(&self.objects)
                        && nix::unistd::geteuid().as_raw() == 0
                    {
                        let _ = std::os::unix::fs::chown(&parent, Some(u), Some(g));
                    }
                }
                // A new link beside it, renamed over whatever is there.
                let tmp = parent.join(format!(".sbx-gitguard-restore.{}", std::process::id()));
                let _ = fs::remove_file(&tmp);
                if fs::hard_link(&kept, &tmp).is_ok() && fs::rename(&tmp, &target).is_ok() {
                    out.push(target);
                } else {
                    let _ = fs::remove_file(&tmp);
                }
            }
        }
        out
    }
}

impl Drop for Keep {
    fn drop(&mut self) {
        let _ = sbx_core::rmtree::remove_tree(&self.dir);
    }
}

fn link(from: &Path, to: &Path) -> io::Result<()> {
    match fs::hard_link(from, to) {
        Ok(()) => Ok(()),
        // Gone meanwhile (a concurrent gc): nothing to keep.
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// The registry's removal of a dead run's keep directory: only a keep
/// directory of ours in a real git dir (never through a symlink).
fn remove_registered(dir: &Path) -> io::Result<()> {
    let named = dir
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with(PREFIX));
    let parent_real = dir.parent().is_some_and(crate::fsutil::is_real_dir);
    if !named || !parent_real {
        return Err(io::Error::new(io::ErrorKind::NotFound, "not a keep dir"));
    }
    let m = fs::symlink_metadata(dir)?;
    if !m.is_dir() || m.uid() != nix::unistd::geteuid().as_raw() {
        return Err(io::Error::other("not a directory of ours"));
    }
    sbx_core::rmtree::remove_tree(dir)
}

/// Keep directories of runs that died without cleaning up and were not
/// registered (no registry then): ours, and no live run registered them
/// (the registry's flock decides, not `kill(pid, 0)`, which zombies and
/// reused pids fool). Another user's are left to that user's runs.
fn remove_stale(git_dir: &Path) {
    let Ok(rd) = fs::read_dir(git_dir) else {
        return;
    };
    let me = nix::unistd::geteuid().as_raw();
    for e in rd.filter_map(|e| e.ok()) {
        let n = e.file_name().to_string_lossy().into_owned();
        if !n.starts_with(PREFIX) {
            continue;
        }
        let p = e.path();
        let ours = fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir() && m.uid() == me);
        if ours && !sbx_core::registry::is_live(REG_KIND, &p) {
            let _ = sbx_core::rmtree::remove_tree(&p);
        }
    }
}
