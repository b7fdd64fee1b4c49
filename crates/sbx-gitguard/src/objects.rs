//! The object store: a fast structural check (pack and index checksums,
//! loose object headers, ref tips) and a full connectivity check.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fs;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

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
        mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
        ctime_ns: m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128,
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
    let mut f = fs::File::open(p)?;
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
    let mut fi = fs::File::open(idx).map_err(|x| e(idx, format!("cannot open index: {x}")))?;
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
    let n = u32::from_be_bytes(last.try_into().unwrap()) as u64;
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
    let mut fp = fs::File::open(pack).map_err(|x| e(pack, format!("cannot open pack: {x}")))?;
    if ps.size < 12 + hl64 {
        return Err(e(pack, "pack too short".into()));
    }
    let ph = read_at(&mut fp, 0, 12).map_err(|x| e(pack, x.to_string()))?;
    let ver = u32::from_be_bytes(ph[4..8].try_into().unwrap());
    if &ph[..4] != b"PACK" || !(ver == 2 || ver == 3) {
        return Err(e(pack, "bad pack header".into()));
    }
    let count = u32::from_be_bytes(ph[8..12].try_into().unwrap()) as u64;
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

/// Inflates the start of every loose object and checks its header
/// (`TYPE SIZE\0`); returns the problems and the loose object ids.
pub fn check_loose(objects: &Path) -> (Vec<Problem>, BTreeSet<String>) {
    let mut problems = Vec::new();
    let mut ids = BTreeSet::new();
    let Ok(rd) = fs::read_dir(objects) else {
        return (problems, ids);
    };
    for d in rd.filter_map(|e| e.ok()) {
        let dn = d.file_name();
        let dn = dn.to_string_lossy();
        if dn.len() != 2 || !dn.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        let Ok(rd2) = fs::read_dir(d.path()) else {
            continue;
        };
        for f in rd2.filter_map(|e| e.ok()) {
            let n = f.file_name();
            let n = n.to_string_lossy();
            if !n.bytes().all(|b| b.is_ascii_hexdigit()) || !(n.len() == 38 || n.len() == 62) {
                continue;
            }
            let p = f.path();
            ids.insert(format!("{dn}{n}"));
            if let Err(what) = loose_header(&p) {
                problems.push(problem(Some(&p), format!("loose object {dn}{n}: {what}")));
            }
        }
    }
    (problems, ids)
}

fn loose_header(p: &Path) -> Result<(), String> {
    let mut f = fs::File::open(p).map_err(|e| e.to_string())?;
    let mut inb = [0u8; 256];
    let n = f.read(&mut inb).map_err(|e| e.to_string())?;
    let mut out = [0u8; 64];
    let mut z = flate2::Decompress::new(true);
    let _ = z.decompress(&inb[..n], &mut out, flate2::FlushDecompress::None);
    let got = z.total_out() as usize;
    let h = &out[..got];
    let Some(nul) = h.iter().position(|&b| b == 0) else {
        return Err("not a zlib stream with an object header".into());
    };
    let h = std::str::from_utf8(&h[..nul]).map_err(|_| "bad header".to_string())?;
    let Some((ty, size)) = h.split_once(' ') else {
        return Err("bad header".into());
    };
    if !matches!(ty, "commit" | "tree" | "blob" | "tag")
        || size.is_empty()
        || !size.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(format!("bad header '{}'", h.escape_default()));
    }
    Ok(())
}

/// Checks that `oid` exists and, when `want_commit`, is a commit (an
/// annotated tag must lead to an existing object).
pub fn check_tip(
    repo: &git2::Repository,
    name: &str,
    oid: &str,
    want_commit: bool,
) -> Option<Problem> {
    let Ok(id) = git2::Oid::from_str(oid) else {
        return Some(problem(
            None,
            format!("{name}: '{oid}' is not an object id"),
        ));
    };
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
pub fn full(repo: &git2::Repository, roots: &[(String, String)]) -> Vec<Problem> {
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
