//! Directory listings read once per process and kept while the directory's
//! own stat says nothing was added, removed or renamed in it (issue 19: the
//! snapshot, the FIFO scan and the planted-file scan each listed every
//! fan-out directory of the object store, before and after the command).
//!
//! Why the stat is enough: creating, removing or renaming an entry (and
//! replacing one by a rename) updates the directory's mtime and ctime, and
//! nobody can set a ctime back (`utimensat` sets mtime and itself moves the
//! ctime). Coarse timestamps are the one gap: a change within the same
//! clock tick as the stat (up to 2 s on some file systems) can leave the
//! ctime equal, so a listing is kept, and a stat is [`DirStat::trusted`],
//! only when the directory's ctime is older than [`RACY`] before the stat
//! (git's "racy git" rule for its index).

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A directory changed less than this before its stat is listed again
/// every time (coarse timestamps: a tick, 1-2 s on some file systems).
pub const RACY: Duration = Duration::from_secs(2);

/// What says a directory's entries are the same as when it was listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirStat {
    dev: u64,
    ino: u64,
    size: u64,
    nlink: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    /// Its ctime was older than [`RACY`] when it was taken: a later change
    /// cannot have left the same stat.
    pub trusted: bool,
}

impl DirStat {
    fn of(m: &fs::Metadata, before: SystemTime) -> DirStat {
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        let ctime_ns = ns(m.ctime(), m.ctime_nsec());
        let limit = before
            .checked_sub(RACY)
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_nanos() as i128)
            .unwrap_or(0);
        DirStat {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            nlink: m.nlink(),
            mtime_ns: ns(m.mtime(), m.mtime_nsec()),
            ctime_ns,
            trusted: ctime_ns < limit,
        }
    }

    /// Appends the stat of a trusted listing (for [`crate::loosecache`]).
    pub fn encode(&self, out: &mut Vec<u8>) {
        for v in [self.dev, self.ino, self.size, self.nlink] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in [self.mtime_ns, self.ctime_ns] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }

    /// Bytes [`DirStat::encode`] writes.
    pub const ENCODED: usize = 4 * 8 + 2 * 16;

    /// The stat [`DirStat::encode`] wrote (of a listing that was trusted
    /// when it was taken).
    pub fn decode(b: &[u8; Self::ENCODED]) -> DirStat {
        let u = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap_or_default());
        let t = |i: usize| {
            i128::from_le_bytes(b[32 + i * 16..48 + i * 16].try_into().unwrap_or_default())
        };
        DirStat {
            dev: u(0),
            ino: u(1),
            size: u(2),
            nlink: u(3),
            mtime_ns: t(0),
            ctime_ns: t(1),
            trusted: true,
        }
    }

    /// Whether `now` shows the directory as it was when `self` was taken
    /// (only ever for a trusted `self`).
    pub fn unchanged(&self, now: &DirStat) -> bool {
        self.trusted
            && (
                self.dev,
                self.ino,
                self.size,
                self.nlink,
                self.mtime_ns,
                self.ctime_ns,
            ) == (
                now.dev,
                now.ino,
                now.size,
                now.nlink,
                now.mtime_ns,
                now.ctime_ns,
            )
    }
}

pub use sbx_core::dirents::Kind;

pub type Entries = Arc<EntryList>;

/// Whether a fan-out directory's entry name is a loose object's: 38 or 62
/// hex digits (the rest of a SHA-1 or SHA-256 id).
pub fn is_object_name(b: &[u8]) -> bool {
    (b.len() == 38 || b.len() == 62) && b.iter().all(u8::is_ascii_hexdigit)
}

/// A directory's entries, and whether they are all loose objects (worked
/// out once per listing: the scans for planted and special files skip such
/// a directory instead of looking at thousands of names each).
#[derive(Debug, Default)]
pub struct EntryList {
    items: OnceLock<Vec<(OsString, Kind)>>,
    /// The objects whose names are the entries (a listing saved with them
    /// in [`crate::loosecache`]): the names are made only if asked for.
    of: Option<Arc<crate::looseset::Dir>>,
    only_objects: OnceLock<bool>,
}

impl EntryList {
    pub fn new(items: Vec<(OsString, Kind)>) -> EntryList {
        EntryList {
            items: OnceLock::from(items),
            of: None,
            only_objects: OnceLock::new(),
        }
    }

    /// A list whose [`EntryList::only_objects`] is known already (saved
    /// with it, [`crate::loosecache`]).
    pub fn known(items: Vec<(OsString, Kind)>, only_objects: bool) -> EntryList {
        EntryList {
            items: OnceLock::from(items),
            of: None,
            only_objects: OnceLock::from(only_objects),
        }
    }

    /// The listing of a directory that held exactly the objects of `d`,
    /// regular files all (saved so, [`crate::loosecache`]).
    pub fn of_objects(d: Arc<crate::looseset::Dir>) -> EntryList {
        EntryList {
            items: OnceLock::new(),
            of: Some(d),
            only_objects: OnceLock::from(true),
        }
    }

    /// The objects this listing was made from ([`EntryList::of_objects`]).
    pub fn objects(&self) -> Option<&Arc<crate::looseset::Dir>> {
        self.of.as_ref()
    }

    /// Entries, without making the names of a listing of objects.
    pub fn count(&self) -> usize {
        match (&self.of, self.items.get()) {
            (_, Some(i)) => i.len(),
            (Some(d), None) => d.len(),
            (None, None) => 0,
        }
    }

    /// Whether every entry is a regular file named as a loose object (38
    /// or 62 hex digits): nothing git would not make in a fan-out
    /// directory, and nothing special.
    pub fn only_objects(&self) -> bool {
        *self.only_objects.get_or_init(|| {
            self.iter()
                .all(|(n, k)| k.is_file() && is_object_name(n.as_encoded_bytes()))
        })
    }
}

impl std::ops::Deref for EntryList {
    type Target = [(OsString, Kind)];
    fn deref(&self) -> &Self::Target {
        self.items.get_or_init(|| {
            self.of
                .iter()
                .flat_map(|d| d.names())
                .map(|n| (std::ffi::OsStr::from_bytes(n).to_os_string(), Kind::File))
                .collect()
        })
    }
}

impl PartialEq for EntryList {
    fn eq(&self, o: &EntryList) -> bool {
        match (&self.of, &o.of) {
            (Some(a), Some(b)) if Arc::ptr_eq(a, b) => true,
            _ => **self == **o,
        }
    }
}

impl Eq for EntryList {}

/// A directory's entries and the stat that vouches for them.
#[derive(Debug, Clone)]
pub struct Seen {
    pub stat: DirStat,
    pub entries: Entries,
}

/// A directory's stat and entries (and the open directory, when it was
/// read).
pub struct Listed {
    /// For `fstatat` of the entries (one path component each, not the
    /// whole path walked again per file). None when the listing came from
    /// memory ([`list`]); [`list_open`] always gives one.
    pub fd: Option<OwnedFd>,
    pub stat: DirStat,
    pub entries: Entries,
}

/// Per directory: its listing, the stat that vouches for it, and the
/// [`Settled`] stretch in which that stat was last seen (0: none).
type Memo = HashMap<PathBuf, (DirStat, Entries, u64)>;

fn memo() -> &'static Mutex<Memo> {
    static M: std::sync::OnceLock<Mutex<Memo>> = std::sync::OnceLock::new();
    M.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The current [`Settled`] stretch (0: none).
static STRETCH: AtomicU64 = AtomicU64::new(0);
static STRETCHES: AtomicU64 = AtomicU64::new(0);

/// A stretch of this process in which nothing it does changes the
/// directories it lists (the scans of a snapshot; the check after the
/// command, which ends a stretch at each repair, [`Settled::changed`]):
/// within it each directory is stat'ed once, not once per scan (the 256
/// fan-out directories were stat'ed three times before and three times
/// after the command). What others change meanwhile is the race any scan
/// has: the scans see the directory as it was at its first stat.
pub struct Settled(());

impl Settled {
    pub fn begin() -> Settled {
        STRETCH.store(
            STRETCHES.fetch_add(1, Ordering::SeqCst) + 1,
            Ordering::SeqCst,
        );
        Settled(())
    }

    /// This process changed a directory: a stretch starts again (each
    /// directory is stat'ed again when next listed).
    pub fn changed() {
        let _ = STRETCH.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |cur| {
            (cur != 0).then(|| STRETCHES.fetch_add(1, Ordering::SeqCst) + 1)
        });
    }
}

impl Drop for Settled {
    fn drop(&mut self) {
        STRETCH.store(0, Ordering::SeqCst);
    }
}

/// The memo of `dir` when its stat is trusted and the same as `now`'s
/// (None: it must be read), marked seen in the current stretch.
fn remembered(dir: &Path, now: Option<&DirStat>) -> Option<(DirStat, Entries)> {
    let stretch = STRETCH.load(Ordering::SeqCst);
    let mut m = memo().lock().ok()?;
    let (st, e, seen) = m.get_mut(dir)?;
    let same = match now {
        None => stretch != 0 && *seen == stretch,
        Some(now) => st.unchanged(now),
    };
    if !same {
        return None;
    }
    *seen = stretch;
    Some((*st, e.clone()))
}

/// Takes `seen` as the listing of `dir` while its stat stays the same: a
/// listing an earlier process saved where the sandbox cannot write it
/// ([`crate::loosecache`]), so that an unchanged directory is not read
/// again (issue 19).
pub fn seed(dir: &Path, seen: &Seen) {
    if seen.stat.trusted
        && let Ok(mut m) = memo().lock()
    {
        m.entry(dir.to_path_buf())
            .or_insert_with(|| (seen.stat, seen.entries.clone(), 0));
    }
}

/// Lists `dir` (following a symlink to a directory, as `read_dir` does),
/// from memory when its stat is trusted and the same as at the last
/// listing of this process: then one `stat` and no open (the object
/// store's 256 fan-out directories are scanned six times a run).
pub fn list(dir: &Path) -> io::Result<Listed> {
    // Seen already in this settled stretch: not even a stat.
    if let Some((stat, entries)) = remembered(dir, None) {
        return Ok(Listed {
            fd: None,
            stat,
            entries,
        });
    }
    // Never listed: open it at once (its stat through the open fd).
    let known = memo().lock().is_ok_and(|m| m.contains_key(dir));
    let before = SystemTime::now();
    if known
        && let Ok(m) = fs::metadata(dir)
        && m.is_dir()
    {
        let stat = DirStat::of(&m, before);
        if let Some((_, entries)) = remembered(dir, Some(&stat)) {
            return Ok(Listed {
                fd: None,
                stat,
                entries,
            });
        }
    }
    list_open(dir)
}

/// [`list`], with the directory open (its entries from memory when its
/// stat, taken through the open directory, allows).
pub fn list_open(dir: &Path) -> io::Result<Listed> {
    let before = SystemTime::now();
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)?;
    let mut stat = DirStat::of(&f.metadata()?, before);
    // Only where the file system keeps honest ctimes (not FUSE or NFS,
    // whose server says what they are, nor FAT).
    stat.trusted &= sbx_core::fsstamp::ctime_vouches_on(stat.dev, f.as_fd());
    let fd: OwnedFd = f.into();
    if let Some((_, entries)) = remembered(dir, Some(&stat)) {
        return Ok(Listed {
            fd: Some(fd),
            stat,
            entries,
        });
    }
    let entries: Entries = Arc::new(EntryList::new(sbx_core::dirents::read(&fd)?));
    if stat.trusted
        && let Ok(mut m) = memo().lock()
    {
        let stretch = STRETCH.load(Ordering::SeqCst);
        m.insert(dir.to_path_buf(), (stat, entries.clone(), stretch));
    }
    Ok(Listed {
        fd: Some(fd),
        stat,
        entries,
    })
}
