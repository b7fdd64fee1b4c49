//! The loose objects of one object store, by fan-out directory, each
//! directory's objects held once and shared (issue 19). A directory whose
//! stat is unchanged since an earlier run verified it is taken whole: the
//! registry cache, the snapshot and the check after the command hold the
//! same [`Dir`], so such a directory costs nothing per object (no string
//! per id, no map insert, no comparison of the snapshot's ids with the
//! check's), and a run over 100,000 loose objects does about what a run
//! over 1,000 does.
//!
//! A [`Dir`] is a run of fixed-width records sorted by name (looked up by
//! binary search, never decoded into a map): the name (the id without its
//! first two digits, lowercase hex, zero-padded to the directory's widest
//! name), a byte saying whether the object verified in full, and its stat.
//! Records read from the cache are checked (names, flags, order) the first
//! time the directory is used; a directory whose records are not sound is
//! taken as empty, so its objects are read in full when used.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use crate::objects::LooseStat;

/// An object's name in its directory and its stat when it verified.
type Item = (Vec<u8>, Option<LooseStat>);

/// Bytes after the name in a record: verified flag, inode, size, ctime.
pub const TAIL: usize = 1 + 8 + 8 + 16;

/// One fan-out directory's loose objects.
#[derive(Debug)]
pub struct Dir {
    /// The records: made here, or read from `file` when first used.
    data: OnceLock<Vec<u8>>,
    /// The cache file and the offset of the records in it (a directory
    /// whose objects are never asked about is never read).
    file: Option<(Arc<std::fs::File>, u64)>,
    n: usize,
    /// Bytes of a record's name: 38 (SHA-1) or 62 (SHA-256, or a SHA-1
    /// directory that also holds a longer name).
    width: usize,
    /// Whether the records are well formed and in order (checked once, on
    /// first use, for records read from a file).
    sound: OnceLock<bool>,
}

fn valid_width(w: usize) -> bool {
    w == 38 || w == 62
}

impl Dir {
    /// A directory of `items` (names as in the directory, any case; the
    /// stat of the ones verified in full). None when a name is not an
    /// object name.
    pub fn build(mut items: Vec<Item>) -> Option<Dir> {
        let width = items.iter().map(|(n, _)| n.len()).max().unwrap_or(38);
        if !items.iter().all(|(n, _)| crate::dirlist::is_object_name(n)) {
            return None;
        }
        for (n, _) in &mut items {
            n.make_ascii_lowercase();
        }
        items.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        items.dedup_by(|a, b| a.0 == b.0);
        let mut buf = Vec::with_capacity(items.len() * (width + TAIL));
        for (n, st) in &items {
            buf.extend_from_slice(n);
            buf.resize(buf.len() + width - n.len(), 0);
            buf.push(u8::from(st.is_some()));
            let st = st.unwrap_or(LooseStat {
                ino: 0,
                size: 0,
                ctime_ns: 0,
            });
            buf.extend_from_slice(&st.ino.to_le_bytes());
            buf.extend_from_slice(&st.size.to_le_bytes());
            buf.extend_from_slice(&st.ctime_ns.to_le_bytes());
        }
        Some(Dir {
            data: OnceLock::from(buf),
            file: None,
            n: items.len(),
            width,
            sound: OnceLock::from(true),
        })
    }

    /// `n` records of `width`-byte names at `offset` in `file` (a cache
    /// file of `len` bytes), read and checked when first used. None when
    /// they do not fit.
    pub fn in_file(
        file: &Arc<std::fs::File>,
        offset: u64,
        len: u64,
        n: usize,
        width: usize,
    ) -> Option<Dir> {
        let bytes = u64::try_from(n.checked_mul(width + TAIL)?).ok()?;
        (valid_width(width) && offset.checked_add(bytes)? <= len).then(|| Dir {
            data: OnceLock::new(),
            file: Some((file.clone(), offset)),
            n,
            width,
            sound: OnceLock::new(),
        })
    }

    /// Bytes a directory of `n` records of `width`-byte names takes.
    pub fn size(n: usize, width: usize) -> usize {
        n * (width + TAIL)
    }

    /// This directory's records, their name width and bytes (what
    /// [`Dir::in_file`] takes); none when they are not sound.
    pub fn raw(&self) -> (usize, usize, &[u8]) {
        match self.len() {
            0 => (0, self.width, &[]),
            n => (n, self.width, self.records()),
        }
    }

    fn records(&self) -> &[u8] {
        self.data.get_or_init(|| {
            use std::os::unix::fs::FileExt;
            let mut v = vec![0u8; Dir::size(self.n, self.width)];
            match &self.file {
                Some((f, at)) if f.read_exact_at(&mut v, *at).is_ok() => v,
                _ => Vec::new(),
            }
        })
    }

    /// Record `i` (only of sound records: all there).
    fn rec(&self, i: usize) -> &[u8] {
        let w = self.width + TAIL;
        &self.records()[i * w..(i + 1) * w]
    }

    fn is_sound(&self) -> bool {
        *self.sound.get_or_init(|| {
            if self.records().len() != Dir::size(self.n, self.width) {
                return false;
            }
            let mut prev: Option<&[u8]> = None;
            (0..self.n).all(|i| {
                let r = self.rec(i);
                let name = &r[..self.width];
                let len = name.iter().position(|&b| b == 0).unwrap_or(self.width);
                let ok = valid_width(len)
                    && name[..len]
                        .iter()
                        .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
                    && name[len..].iter().all(|&b| b == 0)
                    && r[self.width] <= 1
                    && prev.is_none_or(|p| p < name);
                prev = Some(name);
                ok
            })
        })
    }

    /// Objects in the directory (0 when its records are not sound).
    pub fn len(&self) -> usize {
        if self.is_sound() { self.n } else { 0 }
    }

    fn name_of(&self, i: usize) -> &[u8] {
        let name = &self.rec(i)[..self.width];
        &name[..name.iter().position(|&b| b == 0).unwrap_or(self.width)]
    }

    fn stat_of(&self, i: usize) -> Option<LooseStat> {
        let r = &self.rec(i)[self.width..];
        let u = |a: usize| u64::from_le_bytes(r[a..a + 8].try_into().unwrap_or_default());
        (r[0] == 1).then(|| LooseStat {
            ino: u(1),
            size: u(9),
            ctime_ns: i128::from_le_bytes(r[17..33].try_into().unwrap_or_default()),
        })
    }

    /// The names (ids without their directory), in order.
    pub fn names(&self) -> impl Iterator<Item = &[u8]> + '_ {
        (0..self.len()).map(|i| self.name_of(i))
    }

    /// Every object: its name, and its stat when it verified in full.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Option<LooseStat>)> + '_ {
        (0..self.len()).map(|i| (self.name_of(i), self.stat_of(i)))
    }

    /// Whether every object verified in full.
    pub fn all_verified(&self) -> bool {
        (0..self.len()).all(|i| self.rec(i)[self.width] == 1)
    }

    fn find(&self, name: &[u8]) -> Option<usize> {
        if name.len() > self.width || self.len() == 0 {
            return None;
        }
        let mut key = [0u8; 62];
        key[..name.len()].copy_from_slice(name);
        let key = &key[..self.width];
        let (mut lo, mut hi) = (0, self.n);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.rec(mid)[..self.width].cmp(key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(mid),
            }
        }
        None
    }

    /// The stat of `name` when it verified in full.
    pub fn get(&self, name: &[u8]) -> Option<LooseStat> {
        self.find(name).and_then(|i| self.stat_of(i))
    }

    fn contains(&self, name: &[u8]) -> bool {
        self.find(name).is_some()
    }
}

impl PartialEq for Dir {
    fn eq(&self, o: &Dir) -> bool {
        self.len() == o.len() && self.iter().eq(o.iter())
    }
}

/// The loose objects of one store, by fan-out directory ("ab", lowercase).
#[derive(Debug, Clone, Default)]
pub struct LooseSet {
    dirs: BTreeMap<String, Arc<Dir>>,
}

impl PartialEq for LooseSet {
    /// Shared directories are equal without a look at their records.
    fn eq(&self, o: &LooseSet) -> bool {
        self.dirs.len() == o.dirs.len()
            && self
                .dirs
                .iter()
                .zip(&o.dirs)
                .all(|((a, x), (b, y))| a == b && (Arc::ptr_eq(x, y) || x == y))
    }
}

fn split(id: &str) -> Option<(&str, &[u8])> {
    (id.len() > 2 && id.is_char_boundary(2)).then(|| (&id[..2], &id.as_bytes()[2..]))
}

impl LooseSet {
    pub const EMPTY: LooseSet = LooseSet {
        dirs: BTreeMap::new(),
    };

    /// Adds the objects of fan-out directory `name` (merged with what is
    /// there under the same lowercase name).
    pub fn add(&mut self, name: &str, d: Arc<Dir>) {
        let key = name.to_ascii_lowercase();
        // (Not `len`: that checks records read from a file, which waits
        // until the directory is used.)
        if d.n == 0 {
            return;
        }
        match self.dirs.remove(&key) {
            None => {
                self.dirs.insert(key, d);
            }
            Some(old) => {
                let items = old
                    .iter()
                    .chain(d.iter())
                    .map(|(n, s)| (n.to_vec(), s))
                    .collect();
                if let Some(m) = Dir::build(items) {
                    self.dirs.insert(key, Arc::new(m));
                }
            }
        }
    }

    /// The objects of fan-out directory `name`.
    pub fn dir(&self, name: &str) -> Option<&Arc<Dir>> {
        self.dirs.get(name)
    }

    pub fn dirs(&self) -> impl Iterator<Item = (&String, &Arc<Dir>)> {
        self.dirs.iter()
    }

    /// The stat of object `id` when it verified in full.
    pub fn get(&self, id: &str) -> Option<LooseStat> {
        let (d, n) = split(id)?;
        self.dirs.get(d)?.get(n)
    }

    #[cfg(test)]
    fn contains(&self, id: &str) -> bool {
        split(id).is_some_and(|(d, n)| self.dirs.get(d).is_some_and(|x| x.contains(n)))
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.dirs.values().map(|d| d.len()).sum()
    }

    /// Every object id and its stat when it verified, in order.
    pub fn iter(&self) -> impl Iterator<Item = (String, Option<LooseStat>)> + '_ {
        self.dirs.iter().flat_map(|(k, d)| {
            d.iter().map(move |(n, s)| {
                let mut id = String::with_capacity(2 + n.len());
                id.push_str(k);
                // Lowercase hex digits (checked when built or read).
                id.extend(n.iter().map(|&b| char::from(b)));
                (id, s)
            })
        })
    }

    pub fn ids(&self) -> impl Iterator<Item = String> + '_ {
        self.iter().map(|(id, _)| id)
    }

    /// The ids in `self` that are not in `now`. A directory both share is
    /// skipped whole.
    pub fn gone<'a>(&'a self, now: &'a LooseSet) -> impl Iterator<Item = String> + 'a {
        self.dirs
            .iter()
            .filter(move |(k, d)| now.dirs.get(*k).is_none_or(|n| !Arc::ptr_eq(d, n)))
            .flat_map(move |(k, d)| {
                let there = now.dirs.get(k);
                d.names()
                    .filter(move |n| there.is_none_or(|t| !t.contains(n)))
                    .map(move |n| {
                        let mut id = k.clone();
                        id.extend(n.iter().map(|&b| char::from(b)));
                        id
                    })
            })
    }

    /// Whether a directory of `self` that `now` does not share holds
    /// records that are not sound (a damaged cache): what it held is not
    /// known, so which of its objects are gone cannot be told.
    pub fn unknown_in(&self, now: &LooseSet) -> bool {
        self.dirs
            .iter()
            .any(|(k, d)| now.dirs.get(k).is_none_or(|n| !Arc::ptr_eq(d, n)) && !d.is_sound())
    }

    /// Every record's stat replaced by `f` (kept links changed the ctimes).
    pub fn restat(&mut self, mut f: impl FnMut(&str, LooseStat) -> LooseStat) {
        for (k, d) in self.dirs.iter_mut() {
            let items = d
                .iter()
                .map(|(n, s)| {
                    let id = format!("{k}{}", String::from_utf8_lossy(n));
                    (n.to_vec(), s.map(|s| f(&id, s)))
                })
                .collect();
            if let Some(n) = Dir::build(items) {
                *d = Arc::new(n);
            }
        }
    }
}

impl FromIterator<(String, Option<LooseStat>)> for LooseSet {
    /// Ids that are not object ids are left out.
    fn from_iter<I: IntoIterator<Item = (String, Option<LooseStat>)>>(it: I) -> LooseSet {
        let mut by: BTreeMap<String, Vec<Item>> = BTreeMap::new();
        for (id, s) in it {
            if let Some((d, n)) = split(&id)
                && d.bytes().all(|b| b.is_ascii_hexdigit())
            {
                by.entry(d.to_ascii_lowercase())
                    .or_default()
                    .push((n.to_vec(), s));
            }
        }
        let mut out = LooseSet::default();
        for (d, items) in by {
            if let Some(x) = Dir::build(items) {
                out.add(&d, Arc::new(x));
            }
        }
        out
    }
}

/// In a snapshot file: a map of id to its stat (null: not verified).
impl serde::Serialize for LooseSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter())
    }
}

impl<'de> serde::Deserialize<'de> for LooseSet {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<LooseSet, D::Error> {
        let m: BTreeMap<String, Option<LooseStat>> = serde::Deserialize::deserialize(d)?;
        Ok(m.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(i: u64) -> LooseStat {
        LooseStat {
            ino: i,
            size: i * 2,
            ctime_ns: -i128::from(i),
        }
    }

    #[test]
    fn lookups_find_what_was_built_and_nothing_else() {
        let a = "ab".to_string() + &"1".repeat(38);
        let b = "ab".to_string() + &"f".repeat(62);
        let c = "0c".to_string() + &"2".repeat(38);
        let s: LooseSet = [
            (a.clone(), Some(st(1))),
            (b.clone(), None),
            (c.clone(), Some(st(3))),
        ]
        .into_iter()
        .collect();
        assert_eq!(s.get(&a), Some(st(1)));
        assert_eq!(s.get(&b), None);
        assert!(s.contains(&b));
        assert_eq!(s.get(&c), Some(st(3)));
        assert!(!s.contains(&("ab".to_string() + &"1".repeat(37))));
        assert!(!s.contains("a"));
        assert_eq!(s.len(), 3);
        assert_eq!(
            s.ids().collect::<Vec<_>>(),
            vec![c.clone(), a.clone(), b.clone()]
        );
        let t: LooseSet = [(a.clone(), Some(st(1)))].into_iter().collect();
        assert_eq!(s.gone(&t).collect::<Vec<_>>(), vec![c, b]);
        assert_eq!(t.gone(&s).count(), 0);
    }

    /// Records read from a file that are out of order, badly named or
    /// flagged are no objects (read in full when used), never a panic.
    #[test]
    fn unsound_records_are_an_empty_directory() {
        let good = Dir::build(vec![
            (b"1".repeat(38), Some(st(1))),
            (b"2".repeat(38), Some(st(2))),
        ])
        .unwrap();
        let (n, w, raw) = good.raw();
        let file = |b: &[u8]| {
            let mut f = tempfile::tempfile().unwrap();
            std::io::Write::write_all(&mut f, b).unwrap();
            Arc::new(f)
        };
        let len = raw.len() as u64;
        let f = file(raw);
        let d = Dir::in_file(&f, 0, len, n, w).unwrap();
        assert_eq!(d, good);
        assert!(Dir::in_file(&f, 1, len, n, w).is_none());
        assert!(Dir::in_file(&f, 0, len, n, 40).is_none());
        // Cut short after it was opened: no objects.
        let d = Dir::in_file(&f, 0, len, n, w).unwrap();
        f.set_len(len - 1).unwrap();
        assert_eq!(d.len(), 0);
        for bad in [
            |b: &mut Vec<u8>| b[0] = b'G',
            |b: &mut Vec<u8>| b[38] = 2,
            |b: &mut Vec<u8>| b[71] = b'0',
        ] {
            let mut v = raw.to_vec();
            bad(&mut v);
            let d = Dir::in_file(&file(&v), 0, len, n, w).unwrap();
            assert_eq!(d.len(), 0);
            assert_eq!(d.get(&b"1".repeat(38)), None);
        }
    }
}
