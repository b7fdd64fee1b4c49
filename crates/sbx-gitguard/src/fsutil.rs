//! File snapshots and their atomic restoration, keeping the owner.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    File,
    Symlink,
    Dir,
}

/// One file, symlink or directory as it was.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileSnap {
    pub kind: Kind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Contents (or link target) when it is UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Contents in hex otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hex: Option<String>,
    /// A file over [`MAX_KEPT`] is not kept: its identity (size, inode,
    /// mtime, ctime: any write changes ctime, which a user cannot set back)
    /// stands for its contents. It can be compared, never restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub big: Option<String>,
}

impl FileSnap {
    pub fn bytes(&self) -> Vec<u8> {
        match (&self.text, &self.hex) {
            (Some(t), _) => t.as_bytes().to_vec(),
            (None, Some(h)) => hex::decode(h).unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    /// Whether the contents were too large to keep (compare only).
    pub fn is_big(&self) -> bool {
        self.big.is_some()
    }

    /// Same kind and contents (mode and owner differences are not tampering
    /// git cares about, except the executable bit of a hook).
    pub fn same(&self, other: &FileSnap) -> bool {
        self.kind == other.kind
            && self.text == other.text
            && self.hex == other.hex
            && self.big == other.big
            && (self.mode & 0o111 != 0) == (other.mode & 0o111 != 0)
    }
}

fn encode(data: Vec<u8>) -> (Option<String>, Option<String>) {
    match String::from_utf8(data) {
        Ok(s) => (Some(s), None),
        Err(e) => (None, Some(hex::encode(e.into_bytes()))),
    }
}

/// Reads `p` without following a final symlink; None when it does not exist.
pub fn read(p: &Path) -> io::Result<Option<FileSnap>> {
    let md = match fs::symlink_metadata(p) {
        Ok(m) => m,
        Err(e)
            if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR) =>
        {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let ft = md.file_type();
    let (kind, data) = if ft.is_symlink() {
        (
            Kind::Symlink,
            fs::read_link(p)?.into_os_string().into_encoded_bytes(),
        )
    } else if ft.is_dir() {
        (Kind::Dir, Vec::new())
    } else if ft.is_file() {
        if md.size() > MAX_KEPT {
            let big = format!(
                "size={} ino={} mtime={}.{} ctime={}.{}",
                md.size(),
                md.ino(),
                md.mtime(),
                md.mtime_nsec(),
                md.ctime(),
                md.ctime_nsec()
            );
            return Ok(Some(FileSnap {
                kind: Kind::File,
                mode: md.mode() & 0o7777,
                uid: md.uid(),
                gid: md.gid(),
                text: None,
                hex: None,
                big: Some(big),
            }));
        }
        (Kind::File, read_bounded(p, MAX_KEPT)?)
    } else {
        // A fifo or device planted in .git: record it as an empty file of
        // mode 0 so it never compares equal to a real file.
        (Kind::File, b"\0special\0".to_vec())
    };
    let (text, hex) = encode(data);
    Ok(Some(FileSnap {
        kind,
        mode: md.mode() & 0o7777,
        uid: md.uid(),
        gid: md.gid(),
        text,
        hex,
        big: None,
    }))
}

/// Files larger than this are not kept in a snapshot by content (a hook,
/// an info/ file, a config): see [`FileSnap::big`].
pub const MAX_KEPT: u64 = 16 << 20;

/// Most bytes of a config file that are parsed (git's own are kilobytes).
pub const MAX_CONFIG: u64 = 4 << 20;

/// Most bytes of a ref, HEAD, a `.git` file, a `commondir`/`gitdir` file.
pub const MAX_SMALL: u64 = 64 << 10;

/// The error of a file over its bound.
pub fn too_large(p: &Path, size: u64, max: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::FileTooLarge,
        format!(
            "{}: {size} bytes, more than the {max} read from such a file",
            p.display()
        ),
    )
}

/// Opens `p` for reading only when it is a regular file: the final
/// component is never followed (O_NOFOLLOW), the open never waits (a FIFO
/// planted in `.git` opens at once with O_NONBLOCK instead of hanging until
/// a writer comes), and fstat on the open fd decides (no race between a
/// check and the open).
pub fn open_regular(p: &Path) -> io::Result<(fs::File, fs::Metadata)> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(p)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: is a symlink, not a regular file", p.display()),
                )
            } else {
                e
            }
        })?;
    let md = f.metadata()?;
    if !md.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: not a regular file ({})", p.display(), type_name(&md)),
        ));
    }
    Ok((f, md))
}

/// What kind of file `md` describes (for messages).
pub fn type_name(md: &fs::Metadata) -> &'static str {
    sbx_core::input::kind_of(&md.file_type())
}

/// Reads a regular file of at most `max` bytes ([`open_regular`]; a file
/// that grows while it is read is cut at `max + 1` and refused too).
pub fn read_bounded(p: &Path, max: u64) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let (f, md) = open_regular(p)?;
    if md.size() > max {
        return Err(too_large(p, md.size(), max));
    }
    let mut out = Vec::with_capacity(md.size() as usize);
    f.take(max + 1).read_to_end(&mut out)?;
    if out.len() as u64 > max {
        return Err(too_large(p, out.len() as u64, max));
    }
    Ok(out)
}

/// [`read_bounded`] as text (lossy UTF-8); None when it does not exist.
pub fn read_text(p: &Path, max: u64) -> io::Result<Option<String>> {
    match read_bounded(p, max) {
        Ok(b) => Ok(Some(String::from_utf8_lossy(&b).into_owned())),
        Err(e)
            if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Every entry under `dir` (relative paths, directories included), not
/// following symlinks.
pub fn read_tree(dir: &Path) -> io::Result<BTreeMap<String, FileSnap>> {
    let mut out = BTreeMap::new();
    walk(dir, "", &mut out, 0)?;
    Ok(out)
}

fn walk(
    dir: &Path,
    prefix: &str,
    out: &mut BTreeMap<String, FileSnap>,
    depth: usize,
) -> io::Result<()> {
    if depth > 32 {
        return Ok(());
    }
    let rd = match fs::read_dir(dir) {
        Ok(r) => r,
        Err(e)
            if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR) =>
        {
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    let mut names: Vec<_> = rd.filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
    names.sort();
    for n in names {
        let name = n.to_string_lossy().into_owned();
        let rel = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        let p = dir.join(&n);
        if let Some(s) = read(&p)? {
            let is_dir = s.kind == Kind::Dir;
            out.insert(rel.clone(), s);
            if is_dir {
                walk(&p, &rel, out, depth + 1)?;
            }
        }
    }
    Ok(())
}

/// Whether `e` says the process ran out of something (file descriptors,
/// memory), not what the file is: such a read proves nothing about it.
pub fn exhausted(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM)
    )
}

/// The error of listing something that is not (or no longer) a directory:
/// no entries, unlike any other error.
pub fn no_directory(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}

/// FIFOs, sockets and devices under `dir` (symlinks never followed,
/// entries named `skip_prefix` skipped): git makes none, and opening one
/// can block forever. Bounded in depth and in count.
pub fn specials(dir: &Path, skip_prefix: &str) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), 0usize)];
    while let Some((d, depth)) = stack.pop() {
        // Listed once per process while unchanged (the object store's 256
        // fan-out directories are walked before and after the command).
        let Ok(l) = crate::dirlist::list(&d) else {
            continue;
        };
        // A fan-out directory of loose objects only: no directory and
        // nothing special in it.
        if l.entries.only_objects() {
            continue;
        }
        for (name, t) in l.entries.iter() {
            if name.to_string_lossy().starts_with(skip_prefix) {
                continue;
            }
            if t.is_dir() {
                if depth < 64 {
                    stack.push((d.join(name), depth + 1));
                }
            } else if !t.is_file() && !t.is_symlink() {
                out.push(d.join(name));
                if out.len() >= 1000 {
                    return out;
                }
            }
        }
    }
    out.sort();
    out
}

/// Removes a file, symlink or whole directory (never following symlinks,
/// at any depth: `sbx_core::rmtree`).
pub fn remove(p: &Path) -> io::Result<()> {
    sbx_core::rmtree::remove_tree(p)
}

fn chown(p: &Path, uid: u32, gid: u32) {
    if nix::unistd::geteuid().as_raw() == 0 {
        let _ = std::os::unix::fs::lchown(p, Some(uid), Some(gid));
    }
}

/// Puts `s` back at `p` atomically (a temp file beside it, then rename),
/// with its mode and, when we are root, its owner.
pub fn restore(p: &Path, s: &FileSnap) -> io::Result<()> {
    let parent = p.parent().unwrap_or(Path::new("/"));
    if let Ok(m) = fs::symlink_metadata(p)
        && (m.is_dir() != (s.kind == Kind::Dir) || m.file_type().is_symlink())
    {
        remove(p)?;
    }
    match s.kind {
        Kind::Dir => {
            if !p.is_dir() {
                fs::create_dir_all(p)?;
            }
            fs::set_permissions(p, fs::Permissions::from_mode(s.mode))?;
            chown(p, s.uid, s.gid);
        }
        Kind::Symlink => {
            let tmp = parent.join(format!(".sbx-gitguard.{}.tmp", std::process::id()));
            let _ = fs::remove_file(&tmp);
            let target = std::ffi::OsString::from_encoded_bytes_checked(s.bytes());
            std::os::unix::fs::symlink(target, &tmp)?;
            chown(&tmp, s.uid, s.gid);
            fs::rename(&tmp, p)?;
        }
        Kind::File => write_atomic(p, &s.bytes(), s.mode, Some((s.uid, s.gid)))?,
    }
    Ok(())
}

trait FromBytesChecked {
    fn from_encoded_bytes_checked(b: Vec<u8>) -> std::ffi::OsString;
}
impl FromBytesChecked for std::ffi::OsString {
    fn from_encoded_bytes_checked(b: Vec<u8>) -> std::ffi::OsString {
        use std::os::unix::ffi::OsStringExt;
        std::ffi::OsString::from_vec(b)
    }
}

/// Writes `data` to `p` atomically with `mode`.
pub fn write_atomic(p: &Path, data: &[u8], mode: u32, owner: Option<(u32, u32)>) -> io::Result<()> {
    let parent = p.parent().unwrap_or(Path::new("/"));
    let mut tmp = tempfile::Builder::new()
        .prefix(".sbx-gitguard.")
        .suffix(".tmp")
        .tempfile_in(parent)?;
    tmp.write_all(data)?;
    tmp.as_file().sync_all()?;
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(mode))?;
    if let Some((u, g)) = owner {
        chown(tmp.path(), u, g);
    }
    tmp.persist(p).map_err(|e| e.error)?;
    Ok(())
}

/// uid/gid of `p`.
pub fn owner(p: &Path) -> Option<(u32, u32)> {
    fs::symlink_metadata(p).ok().map(|m| (m.uid(), m.gid()))
}

/// Creates every missing directory of `p`, owned like `owner_of`.
pub fn create_dirs_owned(p: &Path, owner_of: &Path) -> io::Result<()> {
    if p.is_dir() {
        return Ok(());
    }
    if let Some(parent) = p.parent() {
        create_dirs_owned(parent, owner_of)?;
    }
    fs::create_dir(p)?;
    if let Some((u, g)) = owner(owner_of) {
        chown(p, u, g);
    }
    Ok(())
}

/// The first component of `rel` below `base` (the last one excluded) that is
/// a symlink or not a directory: a path through it would leave `base`.
pub fn unsafe_parent(base: &Path, rel: &str) -> Option<std::path::PathBuf> {
    let mut p = base.to_path_buf();
    let comps: Vec<&str> = rel.split('/').filter(|c| !c.is_empty()).collect();
    for c in comps.iter().take(comps.len().saturating_sub(1)) {
        p.push(c);
        match fs::symlink_metadata(&p) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Some(p),
            Err(_) => return None,
        }
    }
    None
}

/// Makes every parent of `base/rel` a real directory again (a symlink or
/// file planted in its place is removed; nothing outside `base` is touched).
pub fn make_parents_safe(base: &Path, rel: &str) -> io::Result<()> {
    while let Some(bad) = unsafe_parent(base, rel) {
        fs::remove_file(&bad)?;
    }
    Ok(())
}

/// Whether `p` is a real directory (not a symlink).
pub fn is_real_dir(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok_and(|m| m.is_dir())
}
