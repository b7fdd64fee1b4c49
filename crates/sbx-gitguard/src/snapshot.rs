//! The snapshot: what a repair needs, written 0600 atomically, with a
//! format version and the repository's identity.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::fsutil::{self, FileSnap};
use crate::layout::{self, Layout, Scan, Unit, UnitKind};
use crate::objects::Stat;
use crate::refs;
use crate::rules::{self, Action};

pub const FORMAT: &str = "sbx-gitguard-snapshot";
pub const VERSION: u32 = 2;
/// Most bytes of a snapshot file read.
pub const MAX_FILE: u64 = 1 << 30;

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("cannot read snapshot {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not an sbx-gitguard snapshot ({what})")]
    Format { path: PathBuf, what: String },
    #[error("snapshot {path} is of another repository ({theirs}), not {ours}")]
    OtherRepo {
        path: PathBuf,
        theirs: String,
        ours: String,
    },
    #[error("cannot write snapshot {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Refs(#[from] refs::RefsError),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// The common git dir (canonical path).
    pub common_dir: PathBuf,
    pub work_tree: Option<PathBuf>,
    pub dev: u64,
    pub ino: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RefsSnap {
    /// Every ref (loose over packed): an oid or `ref: NAME`.
    pub refs: BTreeMap<String, String>,
    pub packed_refs: Option<FileSnap>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UnitSnap {
    pub path: PathBuf,
    pub kind: UnitKind,
    pub work_tree: Option<PathBuf>,
    pub dev: u64,
    pub ino: u64,
    pub head: Option<FileSnap>,
    /// The protected paths of the clean-up list (relative to the git dir;
    /// trees are listed entry by entry).
    pub files: BTreeMap<String, FileSnap>,
    /// Files the configs include (absolute; None: did not exist).
    pub includes: BTreeMap<PathBuf, Option<FileSnap>>,
    /// core.hooksPath and its contents, when set.
    pub hooks_path: Option<(PathBuf, BTreeMap<String, FileSnap>)>,
    pub top_level: BTreeSet<String>,
    pub refs: Option<RefsSnap>,
    /// Pack and index files checksummed at snapshot time.
    pub packs: BTreeMap<String, Stat>,
    /// Loose objects at snapshot time (one that is gone and not packed
    /// either is a sign of damage), with the stat of those verified in
    /// full (hash, size, zlib stream): after a command only the others
    /// are read.
    #[serde(default)]
    pub loose: crate::looseset::LooseSet,
    /// Entries git never makes in objects/, logs/, worktrees/, modules/
    /// that were there at snapshot time (usually none): others are planted.
    #[serde(default)]
    pub odd: BTreeSet<String>,
    pub sha256: bool,
    /// The fan-out directories' stats when `loose` was made, for a git
    /// dir the command cannot write (a staged one, set by `run --stage`):
    /// after the command an unchanged directory's objects are not stat'ed
    /// again ([`crate::objects::check_loose`]). Never read from a snapshot
    /// file (`check`/`repair` always stat every object).
    #[serde(skip)]
    pub same_dirs: Option<BTreeMap<String, crate::dirlist::Seen>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snapshot {
    pub format: String,
    pub version: u32,
    pub created: String,
    pub identity: Identity,
    pub units: Vec<UnitSnap>,
    /// Per work tree: the bare-shaped dirs, nested repos and .git files.
    pub scans: BTreeMap<PathBuf, Scan>,
}

impl Snapshot {
    pub fn unit(&self, p: &Path) -> Option<&UnitSnap> {
        self.units.iter().find(|u| u.path == p)
    }
}

pub fn identity(l: &Layout) -> Result<Identity, SnapshotError> {
    let (dev, ino) = layout::ident(&l.common_dir).ok_or_else(|| SnapshotError::Io {
        path: l.common_dir.clone(),
        source: io::Error::from(io::ErrorKind::NotFound),
    })?;
    Ok(Identity {
        common_dir: l.common_dir.clone(),
        work_tree: l.work_tree.clone(),
        dev,
        ino,
    })
}

/// Reads the configs of a git dir (config, config.worktree) as entries.
pub fn config_entries(git_dir: &Path) -> Vec<(PathBuf, Vec<crate::gitconfig::Entry>)> {
    ["config", "config.worktree"]
        .iter()
        .map(|n| git_dir.join(n))
        .filter_map(|p| {
            let t = crate::fsutil::read_text(&p, crate::fsutil::MAX_CONFIG).ok()??;
            Some((p, crate::gitconfig::parse(&t).unwrap_or_default()))
        })
        .collect()
}

/// Included files, transitively (bounded), of a git dir's configs.
pub fn include_files(git_dir: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut todo: Vec<(PathBuf, Vec<crate::gitconfig::Entry>)> = config_entries(git_dir);
    while let Some((file, entries)) = todo.pop() {
        for inc in crate::gitconfig::includes(&entries, &file) {
            if out.len() > 64 || !out.insert(inc.clone()) {
                continue;
            }
            if let Ok(Some(t)) = crate::fsutil::read_text(&inc, crate::fsutil::MAX_CONFIG) {
                todo.push((inc, crate::gitconfig::parse(&t).unwrap_or_default()));
            }
        }
    }
    out
}

/// core.hooksPath of a git dir, resolved.
pub fn hooks_path(git_dir: &Path, work_tree: Option<&Path>) -> Option<PathBuf> {
    let cfgs = config_entries(git_dir);
    let v = cfgs
        .iter()
        .rev()
        .find_map(|(_, e)| crate::gitconfig::get(e, "core", "hookspath"))?;
    let p = if let Some(rest) = v.strip_prefix("~/") {
        PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(rest)
    } else {
        work_tree.unwrap_or(git_dir).join(v)
    };
    Some(p)
}

pub fn is_sha256(git_dir: &Path) -> bool {
    config_entries(git_dir).iter().any(|(_, e)| {
        e.iter().any(|e| {
            e.section == "extensions"
                && e.name == "objectformat"
                && e.value.as_deref() == Some("sha256")
        })
    })
}

/// The protected files of a git dir, per the clean-up list.
pub fn protected_files(git_dir: &Path) -> Result<BTreeMap<String, FileSnap>, SnapshotError> {
    let mut files = BTreeMap::new();
    for r in rules::PROTECTED {
        let p = git_dir.join(r.path);
        let io = |source| SnapshotError::Io {
            path: p.clone(),
            source,
        };
        match r.action {
            Action::Revert => {
                if let Some(s) = fsutil::read(&p).map_err(io)? {
                    files.insert(r.path.to_string(), s);
                }
            }
            Action::RevertTree => {
                if let Some(s) = fsutil::read(&p).map_err(io)? {
                    let is_dir = s.kind == fsutil::Kind::Dir;
                    files.insert(r.path.to_string(), s);
                    if is_dir {
                        for (k, v) in fsutil::read_tree(&p).map_err(io)? {
                            files.insert(format!("{}/{k}", r.path), v);
                        }
                    }
                }
            }
        }
    }
    Ok(files)
}

/// The entries of a git dir. An error is the caller's: read as "no
/// entries", every entry found after the command would be taken for a
/// planted one, and every one planted missed (attacker helper-54: with
/// the process out of file descriptors).
pub fn top_level(git_dir: &Path) -> io::Result<BTreeSet<String>> {
    fs::read_dir(git_dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect()
}

fn hex_name(n: &str, lens: &[usize]) -> bool {
    lens.contains(&n.len()) && n.bytes().all(|b| b.is_ascii_hexdigit())
}

fn pack_name(n: &str) -> bool {
    if n.starts_with("tmp_") || n.starts_with("multi-pack-index") || n.starts_with(".tmp-") {
        return true;
    }
    let Some(rest) = n.strip_prefix("pack-") else {
        return false;
    };
    let Some((h, ext)) = rest.split_once('.') else {
        return false;
    };
    hex_name(h, &[40, 64])
        && matches!(
            ext,
            "pack" | "idx" | "rev" | "bitmap" | "keep" | "promisor" | "mtimes"
        )
}

/// A directory's entries; one that does not exist, or is not a directory,
/// has none. Any other error is the caller's (see [`top_level`]).
fn list(d: &Path) -> io::Result<Vec<(String, crate::dirlist::Kind)>> {
    match crate::dirlist::list(d) {
        Ok(l) => Ok(l
            .entries
            .iter()
            .map(|(n, k)| (n.to_string_lossy().into_owned(), *k))
            .collect()),
        Err(e) if fsutil::no_directory(&e) => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Entries (relative to the git dir) that git never makes in objects/,
/// logs/, worktrees/ and modules/: an object store holds fan-out dirs of
/// hex-named objects, pack-*.{pack,idx,rev,bitmap,keep,promisor,mtimes},
/// info/{alternates,http-alternates,packs,commit-graph,commit-graphs/};
/// logs/ holds HEAD and refs/**; worktrees/ and modules/ hold directories.
pub fn odd_entries(git_dir: &Path, has_objects: bool) -> io::Result<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    let objs = git_dir.join("objects");
    if has_objects && crate::fsutil::is_real_dir(&objs) {
        for (n, t) in list(&objs)? {
            let rel = format!("objects/{n}");
            if t.is_dir() && hex_name(&n, &[2]) {
                // Up to thousands of entries each: names checked as bytes,
                // a string made only for an odd one.
                let l = match crate::dirlist::list(&objs.join(&n)) {
                    Ok(l) => l,
                    Err(e) if fsutil::no_directory(&e) => continue,
                    Err(e) => return Err(e),
                };
                if l.entries.only_objects() {
                    continue;
                }
                for (m, t2) in l.entries.iter() {
                    let b = m.as_encoded_bytes();
                    let object = crate::dirlist::is_object_name(b);
                    if !(t2.is_file() && (object || b.starts_with(b"tmp_obj_"))) {
                        out.insert(format!("{rel}/{}", m.to_string_lossy()));
                    }
                }
            } else if t.is_dir() && n == "pack" {
                for (m, t2) in list(&objs.join(&n))? {
                    if !(t2.is_file() && pack_name(&m)) {
                        out.insert(format!("{rel}/{m}"));
                    }
                }
            } else if t.is_dir() && n == "info" {
                for (m, t2) in list(&objs.join(&n))? {
                    let ok = match m.as_str() {
                        "alternates" | "http-alternates" | "packs" | "commit-graph" => {
                            t2.is_file() || t2.is_symlink()
                        }
                        "commit-graphs" => t2.is_dir(),
                        _ => m.starts_with("tmp_") || m.starts_with("commit-graph-"),
                    };
                    if !ok {
                        out.insert(format!("{rel}/{m}"));
                    }
                }
            } else if !(t.is_dir() && (n.starts_with("incoming-") || n.starts_with("tmp_objdir"))) {
                out.insert(rel);
            }
        }
    }
    let logs = git_dir.join("logs");
    if crate::fsutil::is_real_dir(&logs) {
        for (n, t) in list(&logs)? {
            let ok = (n == "HEAD" && t.is_file()) || (n == "refs" && t.is_dir());
            if !ok {
                out.insert(format!("logs/{n}"));
            }
        }
    }
    for d in ["worktrees", "modules"] {
        for (n, t) in list(&git_dir.join(d))? {
            if !t.is_dir() {
                out.insert(format!("{d}/{n}"));
            }
        }
    }
    Ok(out)
}

/// Captures one git dir. Pack stats are filled in by the caller once the
/// packs passed their checksums.
pub fn capture_unit(u: &Unit) -> Result<UnitSnap, SnapshotError> {
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| SnapshotError::Io { path: p, source }
    };
    let (dev, ino) = layout::ident(&u.path).unwrap_or((0, 0));
    let head = fsutil::read(&u.path.join("HEAD")).map_err(io(&u.path))?;
    let files = protected_files(&u.path)?;
    let mut includes = BTreeMap::new();
    for inc in include_files(&u.path) {
        let s = fsutil::read(&inc).map_err(io(&inc))?;
        includes.insert(inc, s);
    }
    let hooks_path = match hooks_path(&u.path, u.work_tree.as_deref()) {
        Some(p) => {
            let t = fsutil::read_tree(&p).map_err(io(&p))?;
            Some((p, t))
        }
        None => None,
    };
    let refs = if u.kind.has_objects() {
        let r = refs::read_all(&u.path)?;
        let packed_refs = fsutil::read(&u.path.join("packed-refs")).map_err(io(&u.path))?;
        Some(RefsSnap {
            refs: r.into_iter().map(|(k, v)| (k, v.to_text())).collect(),
            packed_refs,
        })
    } else {
        None
    };
    Ok(UnitSnap {
        path: u.path.clone(),
        kind: u.kind,
        work_tree: u.work_tree.clone(),
        dev,
        ino,
        head,
        files,
        includes,
        hooks_path,
        top_level: top_level(&u.path).map_err(io(&u.path))?,
        refs,
        packs: BTreeMap::new(),
        loose: Default::default(),
        odd: odd_entries(&u.path, u.kind.has_objects()).map_err(io(&u.path))?,
        sha256: is_sha256(&u.path),
        same_dirs: None,
    })
}

/// Scans the work trees: each one's scan, and the directories in them
/// shaped as git dirs (nested repositories).
pub fn scan_work_trees(l: &Layout) -> (BTreeMap<PathBuf, Scan>, BTreeSet<PathBuf>) {
    let mut scans = BTreeMap::new();
    let mut nested = BTreeSet::new();
    for wt in l.work_trees() {
        let s = layout::scan(&wt);
        nested.extend(
            s.nested
                .iter()
                .filter(|p| layout::is_git_dir_shaped(p))
                .cloned(),
        );
        scans.insert(wt, s);
    }
    (scans, nested)
}

/// Scans the work trees and lists every git dir.
pub fn discover(l: &Layout) -> (BTreeMap<PathBuf, Scan>, Vec<Unit>) {
    let (scans, nested) = scan_work_trees(l);
    (scans, l.units(&nested))
}

/// Captures every git dir, and runs `check` over them (the snapshot's
/// soundness check), its results returned in the order of the units. The
/// work trees are scanned on a second thread meanwhile (issue 19: the scan
/// and the git dirs' capture were a third of a staged run each, one after
/// the other): the git dirs known without the scan are captured and
/// checked first, then the nested ones the scan found. Both only read;
/// nothing else writes the repository now (its locks were waited for).
pub fn capture_checked<T>(
    l: &Layout,
    check: impl Fn(&[Unit]) -> T,
) -> Result<(Snapshot, Vec<T>), SnapshotError> {
    let own = l.own_units();
    let ((scans, nested), first) = std::thread::scope(|s| {
        // No thread to be had (the caller's process limit): one after the
        // other, as before.
        let scan = std::thread::Builder::new()
            .spawn_scoped(s, || scan_work_trees(l))
            .ok();
        let first = own
            .iter()
            .map(capture_unit)
            .collect::<Result<Vec<_>, _>>()
            .map(|snaps| (snaps, check(&own)));
        let found = match scan.map(|t| t.join()) {
            Some(Ok(found)) => found,
            Some(Err(panic)) => std::panic::resume_unwind(panic),
            None => scan_work_trees(l),
        };
        (found, first)
    });
    let (mut snaps, first) = first?;
    let mut checked = vec![first];
    let more = layout::nested_units(&nested);
    if !more.is_empty() {
        for u in &more {
            snaps.push(capture_unit(u)?);
        }
        checked.push(check(&more));
    }
    Ok((
        Snapshot {
            format: FORMAT.into(),
            version: VERSION,
            created: sbx_core::audit::timestamp_now(),
            identity: identity(l)?,
            units: snaps,
            scans,
        },
        checked,
    ))
}

/// Writes the snapshot 0600, atomically (a temp file beside it, renamed).
pub fn save(s: &Snapshot, path: &Path) -> Result<(), SnapshotError> {
    let w = |source| SnapshotError::Write {
        path: path.to_path_buf(),
        source,
    };
    let data = serde_json::to_vec(s).map_err(|e| w(io::Error::other(e)))?;
    let data = crate::snapmac::seal(&data).map_err(w)?;
    // The temp file is written and renamed in one go (no stray temp file).
    let _hold = crate::sig::Hold::new();
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".sbx-gitguard-snap.")
        .tempfile_in(parent)
        .map_err(w)?;
    use std::io::Write;
    tmp.write_all(&data).map_err(w)?;
    tmp.as_file().sync_all().map_err(w)?;
    // tempfile creates 0600 already; say it explicitly.
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o600)).map_err(w)?;
    tmp.persist(path).map_err(|e| w(e.error))?;
    Ok(())
}

/// Reads a snapshot and checks it belongs to the repository of `l`.
pub fn load(path: &Path, l: &Layout) -> Result<Snapshot, SnapshotError> {
    // sbx-core's reader of files named on the command line: a regular file
    // (opened non-blocking, checked on the fd), at most MAX_FILE bytes, a
    // termination signal stops it; never a FIFO, /dev/zero or a directory.
    let data =
        sbx_core::input::read_regular(path, MAX_FILE).map_err(|source| SnapshotError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    let fmt = |what: String| SnapshotError::Format {
        path: path.to_path_buf(),
        what,
    };
    // Nothing in it is looked at before its MAC verifies (snapmac.rs).
    let data = crate::snapmac::open(&data).map_err(fmt)?;
    // The marker and version first (a small struct), then the whole.
    #[derive(Deserialize)]
    struct Head {
        format: Option<String>,
        version: Option<u64>,
    }
    let h: Head = serde_json::from_slice(data).map_err(|e| fmt(format!("not JSON: {e}")))?;
    if h.format.as_deref() != Some(FORMAT) {
        return Err(fmt("no format marker".into()));
    }
    let ver = h.version.unwrap_or(0);
    if ver != u64::from(VERSION) {
        return Err(fmt(format!(
            "format version {ver}, this tool reads {VERSION}"
        )));
    }
    let s: Snapshot = serde_json::from_slice(data).map_err(|e| fmt(e.to_string()))?;
    let ours = identity(l)?;
    if s.identity.common_dir != ours.common_dir {
        return Err(SnapshotError::OtherRepo {
            path: path.to_path_buf(),
            theirs: s.identity.common_dir.display().to_string(),
            ours: ours.common_dir.display().to_string(),
        });
    }
    if (s.identity.dev, s.identity.ino) != (ours.dev, ours.ino) {
        return Err(SnapshotError::OtherRepo {
            path: path.to_path_buf(),
            theirs: format!(
                "{} as it was before it was replaced",
                s.identity.common_dir.display()
            ),
            ours: ours.common_dir.display().to_string(),
        });
    }
    Ok(s)
}
