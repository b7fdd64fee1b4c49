//! What earlier runs verified in a staged repository's object store (issue
//! 19): the loose objects verified in full, by stat (inode, size, ctime),
//! and the fan-out directories whose objects all verified, by the
//! directory's own stat and entries. The next staged run's snapshot neither
//! lists nor stats file by file a directory whose stat is unchanged (no
//! entry added, removed or renamed), and reads only objects whose stat
//! differs in the others. Used only for the git dir a `--stage` covers:
//! there the sandbox cannot write the objects (sbx-fs lays the stage over
//! the whole .git), so they change only by the user's own git (which never
//! writes an object file in place) and by the import. A run without the
//! overlay drops the cache before its command ([`forget`]); an object
//! written in place by anything else is checked when libgit2 is first
//! about to read it ([`crate::objects::Damaged`]). The cache lives in
//! sbx's registry directory (0700, outside the repository), never in the
//! repository the command can write.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::dirlist::{DirStat, EntryList, Kind, Seen};
use crate::looseset::{Dir, LooseSet};

/// Most bytes of a cache file read (about 10 million objects).
const MAX_FILE: u64 = 1 << 30;
/// Most bytes of a cache file's part before the records (256 directories
/// and their listings).
const HEAD: u64 = 16 << 20;
/// Caches kept (the most recently saved): repositories that are gone leave
/// theirs behind, and the registry directory is often a tmpfs.
const KEEP: usize = 32;
const PREFIX: &str = "gitguard-loose-";
const TMP_PREFIX: &str = ".gitguard-loose.";
/// The format (binary: a JSON file of 100,000 objects took longer to parse
/// than the rest of the run).
const MAGIC: &[u8] = b"sbx-gitguard loose cache 4\n";

/// What an earlier run verified in a staged git dir's object store.
#[derive(Debug, Default, PartialEq)]
pub struct Cache {
    /// Loose objects verified in full, by stat (each fan-out directory's
    /// records as they are in the file: read, not decoded, until used).
    pub objs: LooseSet,
    /// Fan-out directories ("ab") whose objects all verified: their stat
    /// and entries when they were listed. One whose stat is still that
    /// one holds the same entries, and (nothing writes object files in
    /// place: git never does, and the sandbox writes the stage's overlay)
    /// the same verified files; it is neither listed nor stat'ed file by
    /// file again (issue 19).
    pub dirs: BTreeMap<String, Seen>,
}

impl PartialEq for Seen {
    fn eq(&self, o: &Seen) -> bool {
        self.stat.unchanged(&o.stat)
            && (Arc::ptr_eq(&self.entries, &o.entries) || self.entries == o.entries)
    }
}

fn file(git_dir: &Path) -> Option<PathBuf> {
    let (dev, ino) = crate::layout::ident(git_dir)?;
    let dir = sbx_core::registry::dir().ok()?;
    Some(dir.join(format!("{PREFIX}{dev}-{ino}.bin")))
}

/// The cache of `git_dir` (empty when there is none or it is unusable:
/// then every object is listed and read, as without a cache).
pub fn load(git_dir: &Path) -> Cache {
    file(git_dir).and_then(|p| open(&p)).unwrap_or_default()
}

/// Reads the cache file's directories and listings; each directory's
/// object records are read only when it is first used (a run over 100,000
/// loose objects in unchanged directories reads none of them). The file
/// is replaced by a rename, never written in place, so the open file
/// stays the one read.
fn open(p: &Path) -> Option<Cache> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(p)
        .ok()?;
    let m = f.metadata().ok()?;
    if !m.is_file() || m.len() > MAX_FILE {
        return None;
    }
    // The directories and listings come first (their length after the
    // magic), the records after them.
    use std::os::unix::fs::FileExt;
    let mut len = [0u8; 8];
    f.read_exact_at(&mut len, MAGIC.len() as u64).ok()?;
    let head_len = u64::from_le_bytes(len);
    if head_len > HEAD.min(m.len()) {
        return None;
    }
    let mut head = vec![0u8; usize::try_from(head_len).ok()?];
    f.read_exact_at(&mut head, 0).ok()?;
    decode(&head, &Arc::new(f), m.len())
}

/// Drops the cache of `git_dir`: a command ran that could write its
/// object files in place (a run without a stage over this git dir).
pub fn forget(git_dir: &Path) {
    if let Some(p) = file(git_dir) {
        let _ = fs::remove_file(p);
    }
}

/// The marker of runs without a stage over `git_dir` (next to its cache,
/// kept and pruned with it).
fn marker(git_dir: &Path) -> Option<PathBuf> {
    file(git_dir).map(|p| p.with_extension("unstaged"))
}

/// What a staged run saw of the runs without a stage: a cache it saves
/// must have been loaded with the same [`Generation`] (no such run began
/// or ended in between), and none is loaded or saved while one runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Generation {
    /// No run without a stage ever marked this git dir.
    Never,
    /// The marker's (inode, ctime): each such run writes it at its start
    /// and at its end.
    At(u64, i128),
    /// One runs now (or the marker cannot be read): no cache.
    Busy,
}

/// The current [`Generation`] of `git_dir`.
pub fn generation(git_dir: &Path) -> Generation {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let Some(p) = marker(git_dir) else {
        return Generation::Busy;
    };
    let f = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&p)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Generation::Never,
        Err(_) => return Generation::Busy,
    };
    // SAFETY: flock(2) on `f`, open for the duration of the call.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Generation::Busy;
    }
    match f.metadata() {
        Ok(m) if m.is_file() => Generation::At(
            m.ino(),
            i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
        ),
        _ => Generation::Busy,
    }
}

/// Held by a run without a stage over a git dir from before its command
/// to after its check: the command can write object files in place, so
/// the cache is dropped at both ends and staged runs meanwhile neither
/// load nor save one (a shared lock on the marker; each end writes it,
/// which moves its ctime: a staged run that loaded the cache before does
/// not save it after).
pub struct Unstaged {
    git_dir: PathBuf,
    marker: Option<fs::File>,
}

impl Unstaged {
    pub fn begin(git_dir: &Path) -> Unstaged {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let f = marker(git_dir).and_then(|p| {
            let f = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
                .open(&p)
                .ok()?;
            let _ = f.set_permissions(fs::Permissions::from_mode(0o600));
            // SAFETY: flock(2) on `f`, which this value keeps open.
            (unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH) } == 0).then_some(f)
        });
        let u = Unstaged {
            git_dir: git_dir.to_path_buf(),
            marker: f,
        };
        u.mark();
        forget(git_dir);
        u
    }

    fn mark(&self) {
        use std::os::unix::fs::FileExt;
        if let Some(f) = &self.marker {
            let _ = f.write_all_at(b"x", 0);
        }
    }
}

impl Drop for Unstaged {
    fn drop(&mut self) {
        forget(&self.git_dir);
        self.mark();
    }
}

/// Replaces the cache of `git_dir` (atomically; a failure only costs the
/// next run a full read), unless it holds `now` already (`loaded`: what
/// [`load`] gave this run).
pub fn save(git_dir: &Path, now: &Cache, loaded: Option<&Cache>) {
    if loaded == Some(now) {
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
        let data = encode(now);
        let mut tmp = tempfile::Builder::new()
            .prefix(TMP_PREFIX)
            .tempfile_in(dir)?;
        tmp.write_all(&data)?;
        tmp.persist(&p).map_err(|e| e.error)?;
        Ok(())
    })();
    if let Err(e) = r {
        tracing::warn!(cache = %p.display(), "cannot save the verified loose objects: {e}");
        let _ = fs::remove_file(&p);
    }
    // The JSON cache of an earlier version, for the same git dir.
    let _ = fs::remove_file(p.with_extension("json"));
    prune(dir);
}

/// The file: the head, then each directory's object records
/// ([`crate::looseset::Dir`], verified objects only). The head: MAGIC;
/// its own length; the count of fan-out directories with objects, then
/// for each its name, its records' name width, their count and their
/// offset after the head; the count of directories taken by their stat,
/// then for each its name, its stat and either 1 (its entries are exactly
/// its objects) or 0, whether its entries are all objects, and the
/// entries.
fn encode(c: &Cache) -> Vec<u8> {
    let short = |out: &mut Vec<u8>, b: &[u8]| {
        out.extend_from_slice(&(b.len() as u16).to_le_bytes());
        out.extend_from_slice(b);
    };
    // Unverified objects are not kept (read in full next time anyway).
    let kept: Vec<(&String, std::borrow::Cow<'_, Arc<Dir>>)> = c
        .objs
        .dirs()
        .filter_map(|(k, d)| {
            if d.all_verified() {
                Some((k, std::borrow::Cow::Borrowed(d)))
            } else {
                let items = d
                    .iter()
                    .filter(|(_, s)| s.is_some())
                    .map(|(n, s)| (n.to_vec(), s))
                    .collect();
                Dir::build(items).map(|d| (k, std::borrow::Cow::Owned(Arc::new(d))))
            }
        })
        .filter(|(_, d)| d.len() > 0)
        .collect();
    let mut head = Vec::with_capacity(64 << 10);
    head.extend_from_slice(MAGIC);
    head.extend_from_slice(&0u64.to_le_bytes());
    head.extend_from_slice(&(kept.len() as u64).to_le_bytes());
    let mut at = 0u64;
    for (name, d) in &kept {
        let (n, width, raw) = d.raw();
        short(&mut head, name.as_bytes());
        head.push(width as u8);
        head.extend_from_slice(&(n as u64).to_le_bytes());
        head.extend_from_slice(&at.to_le_bytes());
        at += raw.len() as u64;
    }
    head.extend_from_slice(&(c.dirs.len() as u64).to_le_bytes());
    for (name, seen) in &c.dirs {
        short(&mut head, name.as_bytes());
        seen.stat.encode(&mut head);
        if exactly_objects(&seen.entries, c.objs.dir(name)) {
            head.push(1);
            continue;
        }
        head.push(0);
        head.push(u8::from(seen.entries.only_objects()));
        head.extend_from_slice(&(seen.entries.len() as u64).to_le_bytes());
        for (n, k) in seen.entries.iter() {
            head.push(k.byte());
            short(&mut head, n.as_bytes());
        }
    }
    let len = head.len() as u64;
    head[MAGIC.len()..MAGIC.len() + 8].copy_from_slice(&len.to_le_bytes());
    let mut out = head;
    out.reserve(at as usize);
    for (_, d) in &kept {
        out.extend_from_slice(d.raw().2);
    }
    out
}

/// Whether a listing is the names of `objs`, regular files all, every one
/// verified (then the file keeps the names once, as records).
fn exactly_objects(e: &EntryList, objs: Option<&Arc<Dir>>) -> bool {
    let Some(d) = objs else { return false };
    if e.objects().is_some_and(|o| Arc::ptr_eq(o, d)) {
        return true;
    }
    d.all_verified()
        && e.only_objects()
        && e.count() == d.len()
        && e.iter()
            .all(|(n, _)| !n.as_bytes().iter().any(u8::is_ascii_uppercase))
}

/// Reads the head [`encode`] wrote (`head`: the first bytes of `file`,
/// of `len` bytes); None for anything else (a short, damaged or older
/// file: the run then reads in full). The records are neither read nor
/// decoded: each directory's are read and checked when first used.
fn decode(head: &[u8], file: &Arc<fs::File>, len: u64) -> Option<Cache> {
    struct Cur<'a>(&'a [u8]);
    impl<'a> Cur<'a> {
        fn take(&mut self, n: usize) -> Option<&'a [u8]> {
            if self.0.len() < n {
                return None;
            }
            let (a, b) = self.0.split_at(n);
            self.0 = b;
            Some(a)
        }
        fn arr<const N: usize>(&mut self) -> Option<[u8; N]> {
            self.take(N)?.try_into().ok()
        }
        fn u64(&mut self) -> Option<u64> {
            Some(u64::from_le_bytes(self.arr()?))
        }
        fn short(&mut self) -> Option<&'a [u8]> {
            let n = u16::from_le_bytes(self.arr()?);
            self.take(usize::from(n))
        }
        /// A count, bounded by what is left (each item is at least `min`
        /// bytes): a damaged count cannot make a huge allocation.
        fn count(&mut self, min: usize) -> Option<usize> {
            let n = usize::try_from(self.u64()?).ok()?;
            (n <= self.0.len() / min).then_some(n)
        }
    }
    let mut c = Cur(head.strip_prefix(MAGIC)?);
    let head_len = c.u64()?;
    let rest = usize::try_from(head_len)
        .ok()?
        .checked_sub(MAGIC.len() + 8)?;
    c.0 = c.0.get(..rest)?;
    let mut out = Cache::default();
    // What is read is checked as a listing would be (names as git makes
    // them, no path separators), though only this user can write it.
    let hex = |b: &[u8]| b.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
    // The records follow each other, in the order of the directories, to
    // the end of the file.
    let mut at = 0u64;
    let mut last: Option<&[u8]> = None;
    for _ in 0..c.count(2 + 2 + 1 + 8 + 8)? {
        let name = c.short()?;
        if name.len() != 2 || !hex(name) || last.is_some_and(|l| l >= name) {
            return None;
        }
        last = Some(name);
        let width = usize::from(c.take(1)?[0]);
        let n = usize::try_from(c.u64()?).ok()?;
        if c.u64()? != at {
            return None;
        }
        let dir = Dir::in_file(file, head_len.checked_add(at)?, len, n, width)?;
        at += u64::try_from(Dir::size(n, width)).ok()?;
        out.objs.add(std::str::from_utf8(name).ok()?, Arc::new(dir));
    }
    if head_len.checked_add(at)? != len {
        return None;
    }
    for _ in 0..c.count(2 + DirStat::ENCODED + 1)? {
        let name = c.short()?;
        if name.len() != 2 || !hex(name) {
            return None;
        }
        let name = std::str::from_utf8(name).ok()?.to_owned();
        let stat = DirStat::decode(&c.arr()?);
        let entries = match c.take(1)?[0] {
            1 => EntryList::of_objects(out.objs.dir(&name)?.clone()),
            0 => {
                let only_objects = match c.take(1)?[0] {
                    0 => false,
                    1 => true,
                    _ => return None,
                };
                let n = c.count(3)?;
                let mut entries = Vec::with_capacity(n.min(1 << 16));
                let mut all_objects = true;
                for _ in 0..n {
                    let k = Kind::from_byte(c.take(1)?[0])?;
                    let e = c.short()?;
                    if e.is_empty()
                        || e == b"."
                        || e == b".."
                        || e.contains(&b'/')
                        || e.contains(&0)
                    {
                        return None;
                    }
                    all_objects &= k.is_file() && crate::dirlist::is_object_name(e);
                    entries.push((OsStr::from_bytes(e).to_os_string(), k));
                }
                if only_objects != all_objects {
                    return None;
                }
                EntryList::known(entries, all_objects)
            }
            _ => return None,
        };
        out.dirs.insert(
            name,
            Seen {
                stat,
                entries: Arc::new(entries),
            },
        );
    }
    c.0.is_empty().then_some(out)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::LooseStat;

    /// `d` as a cache file, opened as [`load`] does.
    fn read(d: &[u8]) -> Option<Cache> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.bin");
        std::fs::write(&p, d).unwrap();
        let c = open(&p)?;
        // (Records are read when used: before the file goes.)
        for (_, d) in c.objs.dirs() {
            d.len();
        }
        Some(c)
    }

    fn sample() -> Cache {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("0123"), b"x").unwrap();
        let l = crate::dirlist::list(dir.path()).unwrap();
        let stat = DirStat::decode(&{
            let mut b = Vec::new();
            l.stat.encode(&mut b);
            b.try_into().unwrap()
        });
        let st = |i: u64| LooseStat {
            ino: i,
            size: 99,
            ctime_ns: -3,
        };
        let mut c = Cache {
            objs: [
                ("ab".repeat(20), Some(st(7))),
                ("cd".repeat(20), Some(st(8))),
            ]
            .into_iter()
            .collect(),
            ..Cache::default()
        };
        // A listing kept as it is, and one that is exactly the objects.
        c.dirs.insert(
            "ab".into(),
            Seen {
                stat,
                entries: l.entries,
            },
        );
        c.dirs.insert(
            "cd".into(),
            Seen {
                stat,
                entries: Arc::new(EntryList::new(vec![(
                    OsStr::new(&"cd".repeat(19)).to_os_string(),
                    Kind::File,
                )])),
            },
        );
        c
    }

    #[test]
    fn a_cache_reads_back_as_it_was_written() {
        let c = sample();
        let d = read(&encode(&c)).unwrap();
        assert_eq!(d, c);
        // The listing that is exactly the objects is read back as them.
        assert!(d.dirs["cd"].entries.objects().is_some());
        assert!(d.dirs["ab"].entries.objects().is_none());
    }

    /// A cache cut short at any byte, with a byte more, or of another
    /// format is no cache (the run reads in full), never a panic.
    #[test]
    fn a_damaged_cache_is_no_cache() {
        let d = encode(&sample());
        for n in 0..d.len() {
            assert_eq!(read(&d[..n]), None, "cut at {n}");
        }
        let mut longer = d.clone();
        longer.push(0);
        assert_eq!(read(&longer), None);
        // A count of 2^63 entries: refused without allocating it.
        let mut huge = MAGIC.to_vec();
        huge.extend_from_slice(&(MAGIC.len() as u64 + 16).to_le_bytes());
        huge.extend_from_slice(&(1u64 << 63).to_le_bytes());
        assert_eq!(read(&huge), None);
        assert_eq!(read(b"{\"json\": 1}"), None);
    }
}
