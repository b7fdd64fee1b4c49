//! Hard links to the object files of a git dir, taken before the command
//! (`run` only): objects the command deletes, or files it replaces, can be
//! linked back. Links cost no space and no copying; they do not protect a
//! file modified in place (same inode), which the checks still report.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The prefix of the keep directory inside a git dir (the top-level check
/// skips it).
pub const PREFIX: &str = ".sbx-gitguard-keep.";

pub struct Keep {
    pub dir: PathBuf,
    objects: PathBuf,
}

impl Keep {
    /// Links every pack file and the listed loose objects of `git_dir`.
    pub fn create(git_dir: &Path, loose: &BTreeSet<String>) -> io::Result<Keep> {
        remove_stale(git_dir);
        let dir = git_dir.join(format!("{PREFIX}{}", std::process::id()));
        if dir.exists() {
            fs::remove_dir_all(&dir)?;
        }
        fs::DirBuilder::new().mode(0o700).create(&dir)?;
        let keep = Keep {
            dir,
            objects: git_dir.join("objects"),
        };
        let r = keep.fill(loose);
        if r.is_err() {
            let _ = fs::remove_dir_all(&keep.dir);
        }
        r.map(|()| keep)
    }

    fn fill(&self, loose: &BTreeSet<String>) -> io::Result<()> {
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
        for id in loose {
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
                        && unsafe { libc::geteuid() } == 0
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
        let _ = fs::remove_dir_all(&self.dir);
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

/// Keep directories of runs that died without cleaning up.
fn remove_stale(git_dir: &Path) {
    let Ok(rd) = fs::read_dir(git_dir) else {
        return;
    };
    for e in rd.filter_map(|e| e.ok()) {
        let n = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = n.strip_prefix(PREFIX).and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        let alive = unsafe { libc::kill(pid, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
        if !alive {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}
