//! The object store: a fast structural check (pack and index checksums,
//! loose object headers, ref tips) and a full connectivity check.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fs;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// What identifies a pack or index file that was verified: any write,
/// rename or chmod changes ctime, which a user cannot set back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stat {
    pub size: u64,
    pub ino: u64,
    pub mtime_ns: i128,
    pub ctime_ns: i128,
}

fn stat(p: &Path) -> io::Result<Stat> {
    let m = fs::metadata(p)?;
    Ok(Stat {
        size: m.size(),
        ino: m.ino(),
        mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
    })
}

/// Refreshes the recorded stat of pack files whose inode and size are
/// unchanged (after hard links changed their ctime).
pub fn restat(objects: &Path, packs: &mut BTreeMap<String, Stat>) {
    for (name, st) in packs.iter_mut() {
        if let Ok(now) = stat(&objects.join("pack").join(name))
            && now.ino == st.ino
            && now.size == st.size
        {
            *st = now;
        }
    }
}

/// One problem found in the object store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub path: Option<String>,
    pub what: String,
}

fn problem(path: Option<&Path>, what: impl Into<String>) -> Problem {
    Problem {
        path: path.map(|p| p.display().to_string()),
        what: what.into(),
    }
}

fn hash_len(sha256: bool) -> usize {
    if sha256 { 32 } else { 20 }
}

fn hash_prefix(p: &Path, len: u64, sha256: bool) -> io::Result<Vec<u8>> {
    use sha1::Digest;
    let (mut f, _) = crate::fsutil::open_regular(p)?;
    let mut left = len;
    let mut buf = vec![0u8; 1 << 20];
    let mut h1 = sha1::Sha1::new();
    let mut h2 = sha2::Sha256::new();
    while left > 0 {
        let want = left.min(buf.len() as u64) as usize;
        let n = f.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "file shorter than its size",
            ));
        }
        if sha256 {
            h2.update(&buf[..n]);
        } else {
            h1.update(&buf[..n]);
        }
        left -= n as u64;
    }
    Ok(if sha256 {
        h2.finalize().to_vec()
    } else {
        h1.finalize().to_vec()
    })
}

fn read_at(f: &mut fs::File, off: u64, n: usize) -> io::Result<Vec<u8>> {
    let mut b = vec![0u8; n];
    f.seek(SeekFrom::Start(off))?;
    f.read_exact(&mut b)?;
    Ok(b)
}

/// Which packs get their checksums recomputed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hash {
    /// Every pack and index (`--full`).
    All,
    /// Those whose stat differs from the snapshot's (after a command).
    Changed,
    /// None: headers, sizes and trailers only (a snapshot without `--full`:
    /// its cost must not grow with the size of the packs).
    Nothing,
}

/// Checks every pack and its index: header, size against the object count,
/// the pack trailer against the checksum the index records. Per `hash`, the
/// checksums are recomputed too; a pair whose stat equals the one in
/// `verified` is never rehashed except for `Hash::All`. Returns the problems
/// and the stats of the pairs that passed (for a snapshot).
pub fn check_packs(
    objects: &Path,
    verified: &BTreeMap<String, Stat>,
    sha256: bool,
    hash: Hash,
) -> (Vec<Problem>, BTreeMap<String, Stat>) {
    let dir = objects.join("pack");
    let mut problems = Vec::new();
    let mut ok = BTreeMap::new();
    let Ok(rd) = fs::read_dir(&dir) else {
        return (problems, ok);
    };
    let mut packs: Vec<String> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".pack") && !n.starts_with("tmp_"))
        .collect();
    packs.sort();
    for name in packs {
        let pack = dir.join(&name);
        let stem = name.trim_end_matches(".pack");
        let idx = dir.join(format!("{stem}.idx"));
        match check_pack(&pack, &idx, verified, sha256, hash) {
            Ok(Some((ps, is))) => {
                ok.insert(name.clone(), ps);
                ok.insert(format!("{stem}.idx"), is);
            }
            Ok(None) => {}
            Err(p) => problems.push(p),
        }
    }
    (problems, ok)
}

type PairStat = (Stat, Stat);

fn check_pack(
    pack: &Path,
    idx: &Path,
    verified: &BTreeMap<String, Stat>,
    sha256: bool,
    hash: Hash,
) -> Result<Option<PairStat>, Problem> {
    let hl = hash_len(sha256);
    let e = |p: &Path, what: String| problem(Some(p), what);
    let ps = stat(pack).map_err(|x| e(pack, format!("cannot stat pack: {x}")))?;
    let is = stat(idx).map_err(|x| e(idx, format!("pack has no usable index: {x}")))?;
    let pname = pack.file_name().unwrap().to_string_lossy().into_owned();
    let iname = idx.file_name().unwrap().to_string_lossy().into_owned();
    let cached =
        hash != Hash::All && verified.get(&pname) == Some(&ps) && verified.get(&iname) == Some(&is);

    // Index structure.
    let (mut fi, _) =
        crate::fsutil::open_regular(idx).map_err(|x| e(idx, format!("cannot open index: {x}")))?;
    if is.size < (8 + 1024 + 2 * hl) as u64 {
        return Err(e(idx, "index too short".into()));
    }
    let head = read_at(&mut fi, 0, 8).map_err(|x| e(idx, x.to_string()))?;
    let v2 = head[..4] == [0xff, b't', b'O', b'c'];
    let fan_off = if v2 { 8 } else { 0 };
    if v2 && u32::from_be_bytes(head[4..8].try_into().unwrap()) != 2 {
        return Err(e(idx, "unsupported index version".into()));
    }
    let last = read_at(&mut fi, fan_off + 255 * 4, 4).map_err(|x| e(idx, x.to_string()))?;
    let n = u64::from(u32::from_be_bytes(last.try_into().unwrap()));
    let hl64 = hl as u64;
    let min = if v2 {
        8 + 1024 + n * (hl64 + 8) + 2 * hl64
    } else {
        1024 + n * (4 + hl64) + 2 * hl64
    };
    if is.size < min || (v2 && (is.size - min) % 8 != 0) || (!v2 && is.size != min) {
        return Err(e(
            idx,
            format!("index size {} does not fit {n} objects", is.size),
        ));
    }
    let trailer =
        read_at(&mut fi, is.size - 2 * hl64, 2 * hl).map_err(|x| e(idx, x.to_string()))?;
    let (pack_sum_in_idx, idx_sum) = trailer.split_at(hl);

    // Pack header and trailer.
    let (mut fp, _) =
        crate::fsutil::open_regular(pack).map_err(|x| e(pack, format!("cannot open pack: {x}")))?;
    if ps.size < 12 + hl64 {
        return Err(e(pack, "pack too short".into()));
    }
    let ph = read_at(&mut fp, 0, 12).map_err(|x| e(pack, x.to_string()))?;
    let ver = u32::from_be_bytes(ph[4..8].try_into().unwrap());
    if &ph[..4] != b"PACK" || !(ver == 2 || ver == 3) {
        return Err(e(pack, "bad pack header".into()));
    }
    let count = u64::from(u32::from_be_bytes(ph[8..12].try_into().unwrap()));
    if count != n {
        return Err(e(
            pack,
            format!("pack holds {count} objects, its index {n}"),
        ));
    }
    let pack_sum = read_at(&mut fp, ps.size - hl64, hl).map_err(|x| e(pack, x.to_string()))?;
    if pack_sum != pack_sum_in_idx {
        return Err(e(pack, "pack checksum does not match its index".into()));
    }
    if cached {
        return Ok(None);
    }
    if hash == Hash::Nothing {
        return Ok(Some((ps, is)));
    }
    let got = hash_prefix(pack, ps.size - hl64, sha256).map_err(|x| e(pack, x.to_string()))?;
    if got != pack_sum {
        return Err(e(pack, "pack checksum mismatch (contents damaged)".into()));
    }
    let got = hash_prefix(idx, is.size - hl64, sha256).map_err(|x| e(idx, x.to_string()))?;
    if got != idx_sum {
        return Err(e(idx, "index checksum mismatch (contents damaged)".into()));
    }
    Ok(Some((ps, is)))
}

/// What identifies a loose object file that was verified in full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LooseStat {
    pub ino: u64,
    pub size: u64,
    pub ctime_ns: i128,
}

fn loose_stat(m: &fs::Metadata) -> LooseStat {
    LooseStat {
        ino: m.ino(),
        size: m.size(),
        ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
    }
}

/// Refreshes the recorded stat of loose objects whose inode and size are
/// unchanged (after the keep links changed their ctime).
pub fn restat_loose(objects: &Path, loose: &mut crate::looseset::LooseSet) {
    loose.restat(|id, st| {
        let (a, b) = id.split_at(2);
        match fs::symlink_metadata(objects.join(a).join(b)) {
            Ok(m) if m.ino() == st.ino && m.size() == st.size => loose_stat(&m),
            _ => st,
        }
    });
}

/// The result of the loose-object check.
#[derive(Debug, Default)]
pub struct Loose {
    pub problems: Vec<Problem>,
    /// Every loose object present (damaged ones included), with the stat
    /// of the ones verified in full (or unchanged since they were).
    pub objs: crate::looseset::LooseSet,
    /// Damaged ones: libgit2 must never read them (a truncated zlib stream
    /// sends libgit2 1.9 into an endless loop, libgit2 issue 7342).
    pub damaged: BTreeSet<String>,
    /// Per fan-out directory ("ab") whose loose objects were all verified:
    /// its stat and entries when it was listed (see [`check_loose`]'s
    /// `same_dirs`).
    pub dirs: BTreeMap<String, crate::dirlist::Seen>,
    /// The fan-out directories whose objects were taken as verified by
    /// the directory's stat alone, without a stat of each file: each of
    /// their objects is stat'ed when libgit2 is first about to read it
    /// ([`Damaged::contains`]).
    pub unstated: BTreeSet<String>,
}

impl Loose {
    /// The gate in front of libgit2's reads of this store's loose objects.
    pub fn gate<'a>(&'a self, objects: &Path, sha256: bool) -> Damaged<'a> {
        Damaged::new(&self.damaged, objects, sha256, &self.objs, &self.unstated)
    }
}

/// The stat of an object file, and its link count.
fn loose_stat_at(
    dir: &std::os::fd::OwnedFd,
    name: &std::ffi::OsStr,
) -> io::Result<(LooseStat, u64)> {
    let st = nix::sys::stat::fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
        .map_err(io::Error::from)?;
    Ok((
        LooseStat {
            ino: st.st_ino,
            size: st.st_size as u64,
            ctime_ns: i128::from(st.st_ctime) * 1_000_000_000 + i128::from(st.st_ctime_nsec),
        },
        st.st_nlink as u64,
    ))
}

/// Checks every loose object. A file whose (inode, size, ctime) equals the
/// one in `verified` (checked in full before; any write or rename changes
/// ctime, which a user cannot set back) costs one stat; every other one is
/// read in full by [`verify_loose`]: inflated to its end, header, size,
/// no trailing bytes, and its hash equal to its name. So a snapshot reads
/// every loose object once, and the check after a command only what
/// changed.
///
/// `same_dirs` (only for a git dir the command could not write: a staged
/// one, whose writes went to the stage's overlay): the stats of the fan-out
/// directories when `verified` was made. A directory whose stat is still
/// that one holds the same files (no entry added, removed or renamed, see
/// [`crate::dirlist`]), and nothing could write them in place, so its
/// objects in `verified` are taken as they are, without a stat each.
pub fn check_loose(
    objects: &Path,
    verified: &crate::looseset::LooseSet,
    sha256: bool,
    same_dirs: Option<&BTreeMap<String, crate::dirlist::Seen>>,
) -> Loose {
    use crate::looseset::Dir;
    let mut out = Loose::default();
    let Ok(top) = crate::dirlist::list(objects) else {
        return out;
    };
    let mut dirs: Vec<&std::ffi::OsStr> = top
        .entries
        .iter()
        .map(|(n, _)| n.as_os_str())
        .filter(|n| n.len() == 2 && n.as_encoded_bytes().iter().all(|b| b.is_ascii_hexdigit()))
        .collect();
    dirs.sort();
    for dn in dirs {
        let dn = dn.to_string_lossy();
        let dir = objects.join(&*dn);
        let Ok(mut sub) = crate::dirlist::list(&dir) else {
            continue;
        };
        let known = verified.dir(&dn.to_ascii_lowercase());
        let before = same_dirs
            .and_then(|s| s.get(&*dn))
            .filter(|before| before.stat.unchanged(&sub.stat));
        if let (Some(_), Some(known)) = (before, known) {
            // The directory is as it was when `verified` was made, and
            // all its objects verified then: they are taken as they are
            // (when `verified` holds exactly its entries), and stat'ed
            // only when libgit2 is about to read one ([`Damaged`]).
            // A listing made from these very objects (the cache's) holds
            // them by construction; otherwise the names are compared.
            let matches = if sub.entries.objects().is_some_and(|d| Arc::ptr_eq(d, known)) {
                true
            } else {
                let names = object_names(&sub.entries);
                known.all_verified()
                    && known.len() == names.len()
                    && known.names().zip(&names).all(|(k, n)| k == *n)
            };
            if matches {
                out.unstated.insert(dn.to_string());
                out.objs.add(&dn, known.clone());
                out.dirs.insert(
                    dn.into_owned(),
                    crate::dirlist::Seen {
                        stat: sub.stat,
                        entries: sub.entries,
                    },
                );
                continue;
            }
        }
        // Stat'ed file by file: through the open directory.
        let fd = match sub.fd.take() {
            Some(fd) => fd,
            None => match crate::dirlist::list_open(&dir) {
                Ok(crate::dirlist::Listed {
                    fd: Some(fd),
                    stat,
                    entries,
                }) => {
                    sub.stat = stat;
                    sub.entries = entries;
                    fd
                }
                _ => continue,
            },
        };
        let mut all_good = true;
        // A file linked from elsewhere (a local clone shares the objects
        // of the repository it was cloned from) can be written in place
        // through the other name, by a run that drops only that git
        // dir's cache: its directory is never taken by its stat.
        let mut shared = false;
        let names = object_names(&sub.entries);
        let mut items = Vec::with_capacity(names.len());
        for n in names {
            let lower = n.to_ascii_lowercase();
            let name = std::ffi::OsStr::from_bytes(n);
            let st = loose_stat_at(&fd, name);
            shared |= st.as_ref().is_ok_and(|(_, links)| *links > 1);
            if let Ok((st, _)) = &st
                && known.and_then(|k| k.get(&lower)) == Some(*st)
            {
                items.push((lower, Some(*st)));
                continue;
            }
            // ASCII hex digits only (checked above).
            let id = format!(
                "{}{}",
                dn.to_ascii_lowercase(),
                String::from_utf8_lossy(&lower)
            );
            let p = dir.join(name);
            match verify_loose(&p, &id, sha256) {
                Ok(st) => items.push((lower, Some(st))),
                Err(what) => {
                    all_good = false;
                    out.problems
                        .push(problem(Some(&p), format!("loose object {id}: {what}")));
                    out.damaged.insert(id);
                    items.push((lower, None));
                }
            }
        }
        if let Some(d) = Dir::build(items) {
            out.objs.add(&dn, Arc::new(d));
        }
        // Only a directory named as git names them (lowercase) is taken by
        // its stat later: its objects are the ones under its name.
        if all_good && !shared && sub.stat.trusted && !dn.bytes().any(|b| b.is_ascii_uppercase()) {
            out.dirs.insert(
                dn.into_owned(),
                crate::dirlist::Seen {
                    stat: sub.stat,
                    entries: sub.entries,
                },
            );
        }
    }
    out
}

/// The names in a fan-out directory that are object names, sorted.
fn object_names(e: &crate::dirlist::Entries) -> Vec<&[u8]> {
    let mut v: Vec<&[u8]> = e
        .iter()
        .map(|(n, _)| n.as_encoded_bytes())
        .filter(|n| crate::dirlist::is_object_name(n))
        .collect();
    v.sort_unstable();
    v
}

/// Reads one loose object file in full, in bounded memory: a regular file
/// (never a FIFO or a symlink), one zlib stream to its end with nothing
/// after it, a `TYPE SIZE\0` header whose size is the body's, and a hash
/// equal to `id`. Returns the stat of the file that was read.
pub fn verify_loose(p: &Path, id: &str, sha256: bool) -> Result<LooseStat, String> {
    use sha1::Digest;
    let (mut f, md) = crate::fsutil::open_regular(p).map_err(|e| e.to_string())?;
    let mut z = flate2::Decompress::new(true);
    let mut inb = vec![0u8; 64 << 10];
    let mut outb = vec![0u8; 64 << 10];
    let mut h1 = sha1::Sha1::new();
    let mut h2 = sha2::Sha256::new();
    let mut header: Vec<u8> = Vec::new();
    let mut declared: Option<u64> = None;
    let mut body: u64 = 0;
    let (mut in_start, mut in_end) = (0usize, 0usize);
    let mut eof = false;
    loop {
        if in_start == in_end && !eof {
            in_end = f.read(&mut inb).map_err(|e| e.to_string())?;
            in_start = 0;
            eof = in_end == 0;
        }
        let (before_in, before_out) = (z.total_in(), z.total_out());
        let status = z
            .decompress(
                &inb[in_start..in_end],
                &mut outb,
                if eof {
                    flate2::FlushDecompress::Finish
                } else {
                    flate2::FlushDecompress::None
                },
            )
            .map_err(|e| format!("not a valid zlib stream ({e})"))?;
        let used = (z.total_in() - before_in) as usize;
        let made = (z.total_out() - before_out) as usize;
        in_start += used;
        let mut chunk = &outb[..made];
        if sha256 {
            h2.update(chunk);
        } else {
            h1.update(chunk);
        }
        if declared.is_none() {
            let take = chunk
                .iter()
                .position(|&b| b == 0)
                .map(|i| i + 1)
                .unwrap_or(chunk.len());
            header.extend_from_slice(&chunk[..take]);
            chunk = &chunk[take..];
            if header.last() == Some(&0) {
                declared = Some(parse_header(&header[..header.len() - 1])?);
            } else if header.len() > 64 {
                return Err("no object header (TYPE SIZE) at its start".into());
            }
        }
        body += chunk.len() as u64;
        if let Some(d) = declared
            && body > d
        {
            return Err(format!("longer than the {d} bytes its header says"));
        }
        match status {
            flate2::Status::StreamEnd => break,
            _ if used == 0 && made == 0 && in_start < in_end => {
                return Err("not a valid zlib stream (no progress)".into());
            }
            _ if eof && used == 0 && made == 0 => {
                return Err("truncated (the zlib stream ends early)".into());
            }
            _ => {}
        }
    }
    // Nothing may follow the stream (git: "garbage at end of loose object").
    let trailing = (in_end - in_start) as u64 + {
        let mut one = [0u8; 1];
        f.read(&mut one).map_err(|e| e.to_string())? as u64
    };
    if trailing > 0 {
        return Err("garbage after the end of its zlib stream".into());
    }
    let Some(d) = declared else {
        return Err("no object header (TYPE SIZE) at its start".into());
    };
    if body != d {
        return Err(format!("truncated: {body} bytes, its header says {d}"));
    }
    let got = if sha256 {
        hex::encode(h2.finalize())
    } else {
        hex::encode(h1.finalize())
    };
    if got != id {
        return Err(format!("its contents hash to {got}, not to its name"));
    }
    Ok(loose_stat(&md))
}

fn parse_header(h: &[u8]) -> Result<u64, String> {
    let h = std::str::from_utf8(h).map_err(|_| "bad header".to_string())?;
    let Some((ty, size)) = h.split_once(' ') else {
        return Err("bad header".into());
    };
    if !matches!(ty, "commit" | "tree" | "blob" | "tag")
        || size.is_empty()
        || size.len() > 19
        || !size.bytes().all(|b| b.is_ascii_digit())
        || (size.len() > 1 && size.starts_with('0'))
    {
        return Err(format!("bad header '{h}'"));
    }
    size.parse().map_err(|_| "bad header".to_string())
}

/// Checks that `oid` exists and, when `want_commit`, is a commit (an
/// annotated tag must lead to an existing object).
pub fn check_tip(
    repo: &git2::Repository,
    name: &str,
    oid: &str,
    want_commit: bool,
    damaged: &Damaged,
) -> Option<Problem> {
    let Ok(id) = git2::Oid::from_str(oid) else {
        return Some(problem(
            None,
            format!("{name}: '{oid}' is not an object id"),
        ));
    };
    if damaged.contains(&id) {
        return Some(problem(
            None,
            format!("{name} points to {oid}, whose loose object file is damaged"),
        ));
    }
    let odb = match repo.odb() {
        Ok(o) => o,
        Err(e) => return Some(problem(None, format!("object database: {}", e.message()))),
    };
    match odb.read_header(id) {
        Err(e) => Some(problem(
            None,
            format!(
                "{name} points to {oid}, which is missing or unreadable ({})",
                e.message()
            ),
        )),
        Ok((_, git2::ObjectType::Commit)) => None,
        Ok((_, git2::ObjectType::Tag)) if !want_commit => match repo.find_tag(id) {
            Ok(t) if damaged.contains(&t.target_id()) => Some(problem(
                None,
                format!(
                    "{name}: tag {oid} points to damaged object {}",
                    t.target_id()
                ),
            )),
            Ok(t) => match odb.read_header(t.target_id()) {
                Ok(_) => None,
                Err(_) => Some(problem(
                    None,
                    format!(
                        "{name}: tag {oid} points to missing object {}",
                        t.target_id()
                    ),
                )),
            },
            Err(e) => Some(problem(
                None,
                format!("{name}: tag {oid} unreadable ({})", e.message()),
            )),
        },
        Ok((_, t)) if want_commit => Some(problem(
            None,
            format!("{name} points to {oid}, a {t} and not a commit"),
        )),
        Ok(_) => None,
    }
}

/// The full check (the equivalent of `git fsck` for what matters here):
/// every object reachable from `roots` is read once (libgit2 verifies each
/// object's hash on read); each missing or damaged one is reported with the
/// root and the object (and tree entry) that needed it.
/// The gate in front of every libgit2 read of a loose object: objects
/// whose file failed [`verify_loose`] are never handed to libgit2 (which
/// loops forever on a truncated one, libgit2 issue 7342).
///
/// Objects of a fan-out directory taken as verified by the directory's
/// stat alone ([`Loose::unstated`]: the directory is as an earlier check
/// left it, so no object was added, removed or replaced there) are stat'ed
/// when they are first asked about, and read in full when their stat is
/// not the verified one: a file written in place keeps its directory's
/// stat, only its own ctime moves. So what libgit2 reads is always a file
/// verified since its last change, at the price of one stat per object it
/// reads rather than one per object in the store.
pub struct Damaged<'a> {
    known: RefCell<HashSet<git2::Oid>>,
    objects: std::path::PathBuf,
    sha256: bool,
    verified: &'a crate::looseset::LooseSet,
    unstated: &'a BTreeSet<String>,
    /// Every loose object is checked when first asked about (a store no
    /// check of this process listed: [`Damaged::for_store`]).
    every: bool,
    /// Objects of `unstated` directories found sound by this process.
    passed: RefCell<HashSet<git2::Oid>>,
}

impl<'a> Damaged<'a> {
    pub fn new(
        damaged: &BTreeSet<String>,
        objects: &Path,
        sha256: bool,
        verified: &'a crate::looseset::LooseSet,
        unstated: &'a BTreeSet<String>,
    ) -> Damaged<'a> {
        Damaged {
            known: RefCell::new(
                damaged
                    .iter()
                    .filter_map(|i| git2::Oid::from_str(i).ok())
                    .collect(),
            ),
            objects: objects.to_path_buf(),
            sha256,
            verified,
            unstated,
            every: false,
            passed: RefCell::default(),
        }
    }

    /// A gate for the object store of `git_dir`, which this process did
    /// not list: every loose object is read in full before libgit2 first
    /// reads it (the import's reads of the host's objects: a commit's
    /// tree, an index entry's blob, the history between a ref's old and
    /// new commit).
    pub fn for_git_dir(git_dir: &Path) -> Damaged<'static> {
        Damaged {
            every: true,
            ..Damaged::none_at(
                &git_dir.join("objects"),
                crate::snapshot::is_sha256(git_dir),
            )
        }
    }

    fn none_at(objects: &Path, sha256: bool) -> Damaged<'static> {
        static NO_STATS: crate::looseset::LooseSet = crate::looseset::LooseSet::EMPTY;
        static NO_DIRS: BTreeSet<String> = BTreeSet::new();
        Damaged::new(&BTreeSet::new(), objects, sha256, &NO_STATS, &NO_DIRS)
    }

    /// A gate that knows of no damaged object (the store was checked by
    /// another unit's gate).
    pub fn none() -> Damaged<'static> {
        Damaged::none_at(Path::new(""), false)
    }

    /// Whether libgit2 must not read `id` (its loose file is damaged).
    pub fn contains(&self, id: &git2::Oid) -> bool {
        if self.known.borrow().contains(id) {
            return true;
        }
        if (!self.every && self.unstated.is_empty()) || self.passed.borrow().contains(id) {
            return false;
        }
        let hex = id.to_string();
        if !self.every && !self.unstated.contains(&hex[..2]) {
            return false;
        }
        let p = self.objects.join(&hex[..2]).join(&hex[2..]);
        let sound = match fs::symlink_metadata(&p) {
            // Not loose (packed, or missing: libgit2 says so itself).
            Err(_) => true,
            Ok(m) => {
                self.verified.get(&hex) == Some(loose_stat(&m))
                    || verify_loose(&p, &hex, self.sha256).is_ok()
            }
        };
        if sound {
            self.passed.borrow_mut().insert(*id);
        } else {
            self.known.borrow_mut().insert(*id);
        }
        !sound
    }

    /// Whether no loose object can be damaged: nothing was found damaged
    /// and every object was stat'ed (libgit2's own graph walks may then
    /// read any object).
    pub fn is_empty(&self) -> bool {
        !self.every && self.unstated.is_empty() && self.known.borrow().is_empty()
    }
}

/// Whether `new` descends from `old`, reading commits through libgit2 but
/// never a damaged one (a damaged `old` is recognised by its id in a
/// child's parent list, without reading it). Bounded: after `limit`
/// commits, libgit2's own graph walk decides when nothing is damaged.
pub fn descends(
    repo: &git2::Repository,
    new: git2::Oid,
    old: git2::Oid,
    damaged: &Damaged,
) -> bool {
    if new == old {
        return false;
    }
    let limit = 10_000usize;
    let mut seen: HashSet<git2::Oid> = HashSet::new();
    let mut stack = vec![new];
    while let Some(c) = stack.pop() {
        if !seen.insert(c) || damaged.contains(&c) {
            continue;
        }
        if seen.len() > limit {
            return damaged.is_empty() && repo.graph_descendant_of(new, old).unwrap_or(false);
        }
        let Ok(commit) = repo.find_commit(c) else {
            continue;
        };
        for p in commit.parent_ids() {
            if p == old {
                return true;
            }
            stack.push(p);
        }
    }
    false
}

pub fn full(
    repo: &git2::Repository,
    roots: &[(String, String)],
    damaged: &Damaged,
) -> Vec<Problem> {
    use git2::ObjectType as T;
    let mut problems = Vec::new();
    let mut seen: HashSet<git2::Oid> = HashSet::new();
    // (object, expected type, the object that needed it)
    type Item = (git2::Oid, Option<T>, Option<git2::Oid>);
    for (root, oid) in roots {
        let Ok(id) = git2::Oid::from_str(oid) else {
            continue;
        };
        let mut stack: Vec<Item> = vec![(id, None, None)];
        while let Some((id, want, parent)) = stack.pop() {
            if !seen.insert(id) {
                continue;
            }
            let via = || match parent {
                None => root.clone(),
                Some(p) => describe_parent(repo, p, id),
            };
            if damaged.contains(&id) {
                problems.push(problem(
                    None,
                    format!(
                        "object {id} damaged: its loose object file is not what it names (needed by {}, from {root})",
                        via()
                    ),
                ));
                continue;
            }
            let obj = match repo.find_object(id, None) {
                Ok(o) => o,
                Err(e) => {
                    let what = match want {
                        Some(t) => format!("{t} {id}"),
                        None => format!("object {id}"),
                    };
                    let why = if e.code() == git2::ErrorCode::NotFound {
                        "missing".to_string()
                    } else {
                        format!("damaged: {}", e.message())
                    };
                    problems.push(problem(
                        None,
                        format!("{what} {why} (needed by {}, from {root})", via()),
                    ));
                    if problems.len() >= 100 {
                        return problems;
                    }
                    continue;
                }
            };
            let kind = obj.kind();
            if let (Some(w), Some(k)) = (want, kind)
                && w != k
            {
                problems.push(problem(
                    None,
                    format!(
                        "{id} is a {k}, expected a {w} (needed by {}, from {root})",
                        via()
                    ),
                ));
                continue;
            }
            match kind {
                Some(T::Commit) => {
                    if let Some(c) = obj.as_commit() {
                        let t = c.tree_id();
                        if !seen.contains(&t) {
                            stack.push((t, Some(T::Tree), Some(id)));
                        }
                        for p in c.parent_ids() {
                            if !seen.contains(&p) {
                                stack.push((p, Some(T::Commit), Some(id)));
                            }
                        }
                    }
                }
                Some(T::Tree) => {
                    if let Some(t) = obj.as_tree() {
                        for ent in t.iter() {
                            // A submodule's commit lives in its own repository.
                            if ent.filemode() == 0o160000 || seen.contains(&ent.id()) {
                                continue;
                            }
                            stack.push((ent.id(), ent.kind(), Some(id)));
                        }
                    }
                }
                Some(T::Tag) => {
                    if let Some(t) = obj.as_tag()
                        && !seen.contains(&t.target_id())
                    {
                        stack.push((t.target_id(), t.target_type(), Some(id)));
                    }
                }
                _ => {}
            }
        }
    }
    problems
}

/// "tree X entry 'name'", "commit X" or "tag X" (only for reports).
fn describe_parent(repo: &git2::Repository, parent: git2::Oid, child: git2::Oid) -> String {
    match repo.find_object(parent, None) {
        Ok(o) => match o.kind() {
            Some(git2::ObjectType::Tree) => {
                let name = o
                    .as_tree()
                    .and_then(|t| {
                        t.iter()
                            .find(|e| e.id() == child)
                            .map(|e| e.name().unwrap_or("?").to_string())
                    })
                    .unwrap_or_default();
                format!("tree {parent} entry '{name}'")
            }
            Some(k) => format!("{k} {parent}"),
            None => format!("object {parent}"),
        },
        Err(_) => format!("object {parent}"),
    }
}
