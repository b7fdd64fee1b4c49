//! What the sandbox sees of a repository run with `sbx-fs --git-stage`:
//! the host's git dir under the stage's overlay upper layer. Computed from
//! the two directories without mounting anything, with overlayfs's rules:
//! an upper file hides the lower one, a whiteout (a 0:0 character device)
//! deletes it, an opaque upper directory hides the whole lower directory.
//! `git gc` in the sandbox moves loose refs into an upper packed-refs and
//! whiteouts the loose ones: only the merged view says no ref was deleted.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use crate::refs::{self, RefsError, Value};

/// One upper-layer entry, as overlayfs reads it.
#[derive(Debug, PartialEq, Eq)]
enum Upper {
    Absent,
    Whiteout,
    File,
    Dir { opaque: bool },
    Other,
}

fn xattr_is_y(p: &Path, name: &str) -> bool {
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    let n = std::ffi::CString::new(name).expect("static name");
    let mut buf = [0u8; 2];
    let r = unsafe { libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), 2) };
    r == 1 && buf[0] == b'y'
}

fn upper_entry(p: &Path) -> Upper {
    match fs::symlink_metadata(p) {
        Err(_) => Upper::Absent,
        Ok(m) if m.file_type().is_char_device() && m.rdev() == 0 => Upper::Whiteout,
        Ok(m) if m.is_file() => Upper::File,
        Ok(m) if m.is_dir() => Upper::Dir {
            // trusted.* when sbx-fs ran as root, user.* (userxattr) in a
            // user namespace.
            opaque: xattr_is_y(p, "trusted.overlay.opaque")
                || xattr_is_y(p, "user.overlay.opaque"),
        },
        Ok(_) => Upper::Other,
    }
}

/// Loose refs under `dir` (refs/...), lower layer: plain files.
fn loose(base: &Path, rel: &str, out: &mut BTreeMap<String, Value>) -> Result<(), RefsError> {
    let d = base.join(rel);
    let rd = match fs::read_dir(&d) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(RefsError::Io { path: d, source }),
    };
    for e in rd.filter_map(|e| e.ok()) {
        let name = format!("{rel}/{}", e.file_name().to_string_lossy());
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            loose(base, &name, out)?;
        } else if ft.is_file() && !name.ends_with(".lock") {
            let v = match fs::read(e.path()) {
                Ok(b) => Value::parse(&String::from_utf8_lossy(&b)),
                Err(e) => Value::Invalid(e.to_string()),
            };
            out.insert(name, v);
        }
    }
    Ok(())
}

/// Applies the upper layer's `rel` directory onto `merged` (the lower's
/// loose refs).
fn apply_upper(
    upper: &Path,
    rel: &str,
    merged: &mut BTreeMap<String, Value>,
) -> Result<(), RefsError> {
    let d = upper.join(rel);
    let rd = match fs::read_dir(&d) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(RefsError::Io { path: d, source }),
    };
    for e in rd.filter_map(|e| e.ok()) {
        let name = format!("{rel}/{}", e.file_name().to_string_lossy());
        let under = |k: &String| k == &name || k.starts_with(&format!("{name}/"));
        match upper_entry(&e.path()) {
            Upper::Whiteout => merged.retain(|k, _| !under(k)),
            Upper::Dir { opaque } => {
                if opaque {
                    merged.retain(|k, _| !under(k));
                }
                apply_upper(upper, &name, merged)?;
            }
            Upper::File if !name.ends_with(".lock") => {
                merged.retain(|k, _| !k.starts_with(&format!("{name}/")));
                let v = match fs::read(e.path()) {
                    Ok(b) => Value::parse(&String::from_utf8_lossy(&b)),
                    Err(e) => Value::Invalid(e.to_string()),
                };
                merged.insert(name, v);
            }
            // A symlink, fifo, socket or device in refs/ is not a ref;
            // the importer never follows it.
            _ => {}
        }
    }
    Ok(())
}

/// The refs and HEAD the sandbox left: every ref by name (loose over
/// packed), and HEAD's value.
pub fn sandbox_refs(
    gitdir: &Path,
    upper: &Path,
) -> Result<(BTreeMap<String, Value>, Value), RefsError> {
    let mut out = match upper_entry(&upper.join("packed-refs")) {
        Upper::File => refs::read_packed(upper)?,
        Upper::Whiteout => BTreeMap::new(),
        _ => refs::read_packed(gitdir)?,
    };
    let mut merged = BTreeMap::new();
    match upper_entry(&upper.join("refs")) {
        Upper::Whiteout => {}
        Upper::Dir { opaque: true } => {}
        _ => loose(gitdir, "refs", &mut merged)?,
    }
    apply_upper(upper, "refs", &mut merged)?;
    out.extend(merged);
    let head_path = match upper_entry(&upper.join("HEAD")) {
        Upper::File => upper.join("HEAD"),
        _ => gitdir.join("HEAD"),
    };
    let head = match fs::read(&head_path) {
        Ok(b) => Value::parse(&String::from_utf8_lossy(&b)),
        Err(e) => Value::Invalid(e.to_string()),
    };
    Ok((out, head))
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "1111111111111111111111111111111111111111";
    const B: &str = "2222222222222222222222222222222222222222";

    fn w(p: &Path, s: &str) {
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, s).unwrap();
    }

    fn whiteout(p: &Path) {
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR, 0) };
        assert_eq!(r, 0, "mknod whiteout: {}", io::Error::last_os_error());
    }

    #[test]
    fn gc_in_the_sandbox_deletes_no_ref() {
        let g = tempfile::tempdir().unwrap();
        let u = tempfile::tempdir().unwrap();
        w(&g.path().join("refs/heads/main"), &format!("{A}\n"));
        w(&g.path().join("refs/tags/v1"), &format!("{A}\n"));
        w(&g.path().join("HEAD"), "ref: refs/heads/main\n");
        // The sandbox committed, then `git gc` packed every ref.
        w(
            &u.path().join("packed-refs"),
            &format!("# pack-refs with: peeled fully-peeled sorted \n{B} refs/heads/main\n{A} refs/tags/v1\n"),
        );
        whiteout(&u.path().join("refs/heads/main"));
        whiteout(&u.path().join("refs/tags/v1"));
        let (r, head) = sandbox_refs(g.path(), u.path()).unwrap();
        assert_eq!(r.get("refs/heads/main"), Some(&Value::Oid(B.into())));
        assert_eq!(r.get("refs/tags/v1"), Some(&Value::Oid(A.into())));
        assert_eq!(head, Value::Sym("refs/heads/main".into()));
    }

    #[test]
    fn whiteouts_delete_and_upper_files_override() {
        let g = tempfile::tempdir().unwrap();
        let u = tempfile::tempdir().unwrap();
        w(&g.path().join("refs/heads/main"), &format!("{A}\n"));
        w(&g.path().join("refs/heads/old"), &format!("{A}\n"));
        w(&g.path().join("refs/heads/dir/x"), &format!("{A}\n"));
        w(&g.path().join("HEAD"), "ref: refs/heads/main\n");
        whiteout(&u.path().join("refs/heads/old"));
        whiteout(&u.path().join("refs/heads/dir"));
        w(&u.path().join("refs/heads/feature"), &format!("{B}\n"));
        w(&u.path().join("HEAD"), "ref: refs/heads/feature\n");
        let (r, head) = sandbox_refs(g.path(), u.path()).unwrap();
        let names: Vec<_> = r.keys().cloned().collect();
        assert_eq!(names, ["refs/heads/feature", "refs/heads/main"]);
        assert_eq!(head, Value::Sym("refs/heads/feature".into()));
    }
}
