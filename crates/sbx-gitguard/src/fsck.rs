//! The object checks of `git fsck --strict` / `transfer.fsckObjects`
//! (git's fsck.c, with warnings counted as errors as `--strict` does),
//! applied to every object a git stage brings in before it reaches the
//! host's store: trees (`.git` in any case and in its HFS and NTFS
//! spellings, `.`/`..`, empty names, slashes, zero-padded and bad modes,
//! order, duplicates, a `.gitmodules` symlink, a `.gitmodules` whose
//! submodule names, URLs, paths or update commands attack a later clone),
//! commits and tags (their header lines, object ids and idents). Messages
//! name git's message ids (`gitmodulesName`, `hasDotgit`...) so a refusal
//! can be looked up in git's documentation.

/// An object's kind, as the check needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Commit,
    Tree,
    Blob,
    Tag,
}

impl Kind {
    pub fn from_git2(k: git2::ObjectType) -> Option<Kind> {
        match k {
            git2::ObjectType::Commit => Some(Kind::Commit),
            git2::ObjectType::Tree => Some(Kind::Tree),
            git2::ObjectType::Blob => Some(Kind::Blob),
            git2::ObjectType::Tag => Some(Kind::Tag),
            _ => None,
        }
    }
}

/// [`check`] for an object read through libgit2; blobs a tree names are
/// looked up in `src` (the stage, whose loose objects were verified) then
/// in `store` (quarantine and real store), a loose one of the real store
/// only once `host` passed it (libgit2 loops forever on a truncated one).
/// The refusal reads `git fsck --strict: ID: what`.
pub fn check_git2(
    obj: &git2::OdbObject,
    src: &git2::Odb,
    store: &git2::Odb,
    host: &crate::objects::Damaged,
) -> Result<(), String> {
    let Some(kind) = Kind::from_git2(obj.kind()) else {
        return Err("git fsck --strict: unknown object type".into());
    };
    let hl = obj.id().as_bytes().len();
    let blob = |raw: &[u8]| -> Option<Vec<u8>> {
        let id = git2::Oid::from_bytes(raw).ok()?;
        let o = match src.read(id) {
            Ok(o) => o,
            Err(_) if host.contains(&id) => return None,
            Err(_) => store.read(id).ok()?,
        };
        (o.kind() == git2::ObjectType::Blob).then(|| o.data().to_vec())
    };
    check(kind, obj.data(), hl, &blob).map_err(|e| format!("git fsck --strict: {e}"))
}

/// git refuses a `.gitmodules` blob over this size (GITMODULES_LARGE).
const MAX_GITMODULES: usize = 1 << 20;
/// ... and a `.gitattributes` blob over this (GITATTRIBUTES_LARGE), or
/// with a line longer than [`MAX_ATTR_LINE`].
const MAX_GITATTRIBUTES: usize = 100 << 20;
const MAX_ATTR_LINE: usize = 2048;

/// Checks one object. `blob` returns the contents of a blob by its raw id
/// (for the `.gitmodules` and `.gitattributes` a tree names); None when it
/// cannot be found, which refuses the tree (nothing unverified comes in).
pub fn check(
    kind: Kind,
    data: &[u8],
    hash_len: usize,
    blob: &dyn Fn(&[u8]) -> Option<Vec<u8>>,
) -> Result<(), String> {
    match kind {
        Kind::Commit => check_commit(data, hash_len),
        Kind::Tag => check_tag(data, hash_len),
        Kind::Tree => check_tree(data, hash_len, blob),
        Kind::Blob => Ok(()),
    }
}

fn err(id: &str, what: impl std::fmt::Display) -> Result<(), String> {
    Err(format!("{id}: {what}"))
}

/// Code points HFS+ ignores when it compares names.
fn hfs_ignorable(c: char) -> bool {
    matches!(c as u32, 0x200c..=0x200f | 0x202a..=0x202e | 0x206a..=0x206f | 0xfeff)
}

/// `name` equals `needle` (lower-case ASCII) on HFS+: case-insensitive,
/// ignorable code points skipped.
fn is_hfs(name: &[u8], needle: &str) -> bool {
    let s = String::from_utf8_lossy(name);
    let folded: String = s
        .chars()
        .filter(|c| !hfs_ignorable(*c))
        .map(|c| c.to_ascii_lowercase())
        .collect();
    folded == needle
}

/// `name` names `dotname` (".git", ".gitmodules") or one of its 8.3 short
/// names on NTFS: any backslash-separated component, case-insensitive,
/// an alternate data stream (`:...`) and trailing spaces and dots ignored.
fn is_ntfs(name: &[u8], dotname: &str, shorts: &[&str]) -> bool {
    name.split(|&b| b == b'\\').any(|comp| {
        let comp = match comp.iter().position(|&b| b == b':') {
            Some(i) => &comp[..i],
            None => comp,
        };
        let mut end = comp.len();
        while end > 0 && (comp[end - 1] == b' ' || comp[end - 1] == b'.') {
            end -= 1;
        }
        let c = String::from_utf8_lossy(&comp[..end]).to_ascii_lowercase();
        c == dotname || shorts.contains(&c.as_str())
    })
}

pub fn is_dotgit(name: &[u8]) -> bool {
    is_hfs(name, ".git") || is_ntfs(name, ".git", &["git~1"])
}

pub fn is_dotgitmodules(name: &[u8]) -> bool {
    is_hfs(name, ".gitmodules")
        || is_ntfs(
            name,
            ".gitmodules",
            &[
                "gitmod~1", "gitmod~2", "gitmod~3", "gitmod~4", "gi7eba~1", "gi7eba~2", "gi7eba~3",
                "gi7eba~4", "gi7eba~5", "gi7eba~6", "gi7eba~7", "gi7eba~8", "gi7eba~9",
            ],
        )
}

fn is_dotgitattributes(name: &[u8]) -> bool {
    is_hfs(name, ".gitattributes")
        || is_ntfs(
            name,
            ".gitattributes",
            &["gitatt~1", "gitatt~2", "gitatt~3", "gitatt~4", "gi7d29~1"],
        )
}

/// git's tree order: a directory compares as if its name ended in '/'.
fn tree_cmp(a: &[u8], a_dir: bool, b: &[u8], b_dir: bool) -> std::cmp::Ordering {
    let n = a.len().min(b.len());
    match a[..n].cmp(&b[..n]) {
        std::cmp::Ordering::Equal => {}
        o => return o,
    }
    let ca = a.get(n).copied().unwrap_or(if a_dir { b'/' } else { 0 });
    let cb = b.get(n).copied().unwrap_or(if b_dir { b'/' } else { 0 });
    ca.cmp(&cb)
}

fn check_tree(
    data: &[u8],
    hl: usize,
    blob: &dyn Fn(&[u8]) -> Option<Vec<u8>>,
) -> Result<(), String> {
    let mut rest = data;
    let mut prev: Option<(Vec<u8>, bool)> = None;
    while !rest.is_empty() {
        let sp = rest
            .iter()
            .position(|&b| b == b' ')
            .ok_or("badTree: entry without a mode")?;
        let mode = &rest[..sp];
        let nul = rest[sp + 1..]
            .iter()
            .position(|&b| b == 0)
            .ok_or("badTree: entry without a name end")?
            + sp
            + 1;
        let name = &rest[sp + 1..nul];
        if rest.len() < nul + 1 + hl {
            return err("badTree", "truncated entry");
        }
        let id = &rest[nul + 1..nul + 1 + hl];
        rest = &rest[nul + 1 + hl..];
        let shown = String::from_utf8_lossy(name);
        if mode.is_empty() || !mode.iter().all(|b| (b'0'..=b'7').contains(b)) {
            return err("badTree", format!("bad mode of '{shown}'"));
        }
        if mode[0] == b'0' {
            return err("zeroPaddedFilemode", format!("'{shown}'"));
        }
        let m = u32::from_str_radix(std::str::from_utf8(mode).unwrap_or("0"), 8).unwrap_or(0);
        // 100664 is accepted by a lenient fsck only.
        if !matches!(m, 0o100644 | 0o100755 | 0o120000 | 0o40000 | 0o160000) {
            return err("badFilemode", format!("{m:o} of '{shown}'"));
        }
        if name.is_empty() {
            return err("emptyName", "an entry with an empty name");
        }
        if name.contains(&b'/') {
            return err("fullPathname", format!("'{shown}' contains '/'"));
        }
        if name == b"." {
            return err("hasDot", "an entry named '.'");
        }
        if name == b".." {
            return err("hasDotdot", "an entry named '..'");
        }
        if is_dotgit(name) {
            return err("hasDotgit", format!("an entry named '{shown}' (.git)"));
        }
        let is_dir = m == 0o40000;
        if let Some((p, pd)) = &prev {
            match tree_cmp(p, *pd, name, is_dir) {
                std::cmp::Ordering::Less => {}
                std::cmp::Ordering::Equal => {
                    return err("duplicateEntries", format!("'{shown}'"));
                }
                std::cmp::Ordering::Greater => {
                    return err("treeNotSorted", format!("'{shown}' out of order"));
                }
            }
            // A file and a directory of the same name compare unequal in
            // tree order but are still duplicates.
            if p.as_slice() == name {
                return err("duplicateEntries", format!("'{shown}'"));
            }
        }
        prev = Some((name.to_vec(), is_dir));
        dotfile(name, m, &|| blob(id))?;
    }
    Ok(())
}

/// git's checks of an entry named `.gitmodules` or `.gitattributes` (any
/// spelling) of mode `m`: git fsck reads every such entry that is not a
/// symlink as a blob (fsck_finish), so a directory or a gitlink there is
/// `gitmodulesBlob`/`gitattributesBlob`, a missing blob
/// `gitmodulesMissing`, and the blob's contents are checked.
fn dotfile(name: &[u8], m: u32, blob: &dyn Fn() -> Option<Vec<u8>>) -> Result<(), String> {
    let shown = String::from_utf8_lossy(name);
    if is_dotgitmodules(name) {
        if m == 0o120000 {
            return err("gitmodulesSymlink", format!("'{shown}' is a symlink"));
        }
        if m == 0o40000 || m == 0o160000 {
            return err("gitmodulesBlob", format!("'{shown}' is not a blob"));
        }
        let b = blob().ok_or_else(|| {
            format!("gitmodulesMissing: the .gitmodules blob of '{shown}' is not in the stage or the store")
        })?;
        check_gitmodules(&b)?;
    }
    if is_dotgitattributes(name) && m != 0o120000 {
        if m == 0o40000 || m == 0o160000 {
            return err("gitattributesBlob", format!("'{shown}' is not a blob"));
        }
        let b = blob().ok_or_else(|| {
            format!(
                "gitattributesMissing: the .gitattributes blob of '{shown}' is not in the stage or the store"
            )
        })?;
        if b.len() > MAX_GITATTRIBUTES {
            return err("gitattributesLarge", format!("{} bytes", b.len()));
        }
        if b.split(|&c| c == b'\n').any(|l| l.len() > MAX_ATTR_LINE) {
            return err("gitattributesLineLength", "a line over 2048 bytes");
        }
    }
    Ok(())
}

/// The checks `git fsck --strict` applies to the tree entries an index
/// entry becomes when the host's git commits it (`path`, `mode`, its blob
/// by `blob`): every component a valid entry name (no `.git` in any
/// spelling, no `.`, `..` or empty one), a `.gitmodules` or
/// `.gitattributes` component above it is a directory (`...Blob`), and
/// the entry itself as [`dotfile`] says. The index is where a blob the
/// sandbox wrote can become a `.gitmodules` without a tree naming it.
pub fn check_index_entry(
    path: &[u8],
    mode: u32,
    blob: &dyn Fn() -> Option<Vec<u8>>,
) -> Result<(), String> {
    let r = (|| {
        let comps: Vec<&[u8]> = path.split(|&b| b == b'/').collect();
        for (i, c) in comps.iter().enumerate() {
            let shown = String::from_utf8_lossy(c);
            if c.is_empty() {
                return err("emptyName", "an empty path component");
            }
            if *c == b"." || *c == b".." {
                return err("hasDotdot", format!("a component '{shown}'"));
            }
            if is_dotgit(c) {
                return err("hasDotgit", format!("a component '{shown}' (.git)"));
            }
            let last = i + 1 == comps.len();
            if last {
                dotfile(c, mode, blob)?;
            } else if is_dotgitmodules(c) {
                return err("gitmodulesBlob", format!("'{shown}' is a directory"));
            } else if is_dotgitattributes(c) {
                return err("gitattributesBlob", format!("'{shown}' is a directory"));
            }
        }
        Ok(())
    })();
    r.map_err(|e| format!("git fsck --strict: {e}"))
}

/// A submodule name git accepts: no `..` path component (either slash).
pub fn submodule_name_ok(name: &str) -> bool {
    !name.is_empty() && !name.split(['/', '\\']).any(|c| c == "..")
}

fn check_gitmodules(b: &[u8]) -> Result<(), String> {
    if b.len() > MAX_GITMODULES {
        return err("gitmodulesLarge", format!("{} bytes", b.len()));
    }
    let text = String::from_utf8_lossy(b);
    // Unparseable: git only notes it (gitmodulesParse is info).
    let Ok(entries) = crate::gitconfig::parse(&text) else {
        return Ok(());
    };
    for e in entries.iter().filter(|e| e.section == "submodule") {
        let Some(name) = &e.sub else { continue };
        if !submodule_name_ok(name) {
            return err("gitmodulesName", format!("submodule name '{name}'"));
        }
        let v = e.value.as_deref().unwrap_or("");
        match e.name.as_str() {
            "url" => {
                if v.starts_with('-') {
                    return err("gitmodulesUrl", format!("'{v}' looks like an option"));
                }
                if v.chars().any(|c| c.is_control()) {
                    return err("gitmodulesUrl", "a control character in a URL");
                }
                if url_escapes_root(v) {
                    return err("gitmodulesUrl", format!("'{v}' climbs out of the remote"));
                }
            }
            "path" if v.starts_with('-') => {
                return err("gitmodulesPath", format!("'{v}' looks like an option"));
            }
            "update" if v.starts_with('!') => {
                return err("gitmodulesUpdate", format!("'{v}' runs a command"));
            }
            _ => {}
        }
    }
    Ok(())
}

/// A relative URL (`./`, `../`) whose `..` climbs above the remote's root
/// into a scheme (`../../../../ext::...`): git's check_submodule_url.
fn url_escapes_root(u: &str) -> bool {
    if !(u.starts_with("./") || u.starts_with("../")) {
        return false;
    }
    let ups = u
        .split('/')
        .take_while(|c| *c == ".." || *c == ".")
        .filter(|c| *c == "..")
        .count();
    let rest: Vec<&str> = u
        .split('/')
        .skip_while(|c| *c == ".." || *c == ".")
        .collect();
    ups > 0 && rest.first().is_some_and(|c| c.contains(':'))
}

fn hex_id(s: &[u8], hl: usize) -> bool {
    s.len() == hl * 2 && s.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The header (up to the first empty line); a NUL in it is refused.
fn header(data: &[u8]) -> Result<&[u8], String> {
    let end = data
        .windows(2)
        .position(|w| w == b"\n\n")
        .map(|i| i + 1)
        .unwrap_or(data.len());
    let h = &data[..end];
    if h.contains(&0) {
        return Err("nulInHeader: a NUL byte in the header".into());
    }
    Ok(h)
}

/// `KEY VALUE\n` at the start of `rest`: the value, and what follows.
fn line<'a>(rest: &'a [u8], key: &str) -> Option<(&'a [u8], &'a [u8])> {
    let r = rest.strip_prefix(key.as_bytes())?.strip_prefix(b" ")?;
    let nl = r.iter().position(|&b| b == b'\n')?;
    Some((&r[..nl], &r[nl + 1..]))
}

fn check_commit(data: &[u8], hl: usize) -> Result<(), String> {
    let h = header(data)?;
    let (tree, mut rest) = line(h, "tree").ok_or("missingTree: no tree line first")?;
    if !hex_id(tree, hl) {
        return err("badTreeSha1", String::from_utf8_lossy(tree));
    }
    while let Some((p, r)) = line(rest, "parent") {
        if !hex_id(p, hl) {
            return err("badParentSha1", String::from_utf8_lossy(p));
        }
        rest = r;
    }
    let (author, r) = line(rest, "author").ok_or("missingAuthor: no author line")?;
    ident(author)?;
    rest = r;
    if line(rest, "author").is_some() {
        return err("multipleAuthors", "more than one author line");
    }
    let (committer, _) = line(rest, "committer").ok_or("missingCommitter: no committer line")?;
    ident(committer)?;
    Ok(())
}

fn check_tag(data: &[u8], hl: usize) -> Result<(), String> {
    let h = header(data)?;
    let (obj, rest) = line(h, "object").ok_or("missingObject: no object line first")?;
    if !hex_id(obj, hl) {
        return err("badObjectSha1", String::from_utf8_lossy(obj));
    }
    let (ty, rest) = line(rest, "type").ok_or("missingTypeEntry: no type line")?;
    if !matches!(ty, b"commit" | b"tree" | b"blob" | b"tag") {
        return err("badType", String::from_utf8_lossy(ty));
    }
    let (_name, rest) = line(rest, "tag").ok_or("missingTagEntry: no tag line")?;
    // A bad tag name and a missing tagger are only notes in git (info).
    if let Some((tagger, _)) = line(rest, "tagger") {
        ident(tagger)?;
    }
    Ok(())
}

/// git's fsck_ident: `NAME <EMAIL> SECONDS +ZZZZ`.
fn ident(id: &[u8]) -> Result<(), String> {
    let shown = || String::from_utf8_lossy(id).into_owned();
    let stop = |s: &[u8]| {
        s.iter()
            .position(|b| b"<>\n".contains(b))
            .unwrap_or(s.len())
    };
    if id.first() == Some(&b'<') {
        return err("missingNameBeforeEmail", shown());
    }
    let i = stop(id);
    match id.get(i) {
        Some(b'>') => return err("badName", shown()),
        Some(b'<') => {}
        _ => return err("missingEmail", shown()),
    }
    if i == 0 || id[i - 1] != b' ' {
        return err("missingSpaceBeforeEmail", shown());
    }
    let r = &id[i + 1..];
    let j = stop(r);
    if r.get(j) != Some(&b'>') {
        return err("badEmail", shown());
    }
    let r = &r[j + 1..];
    let Some(r) = r.strip_prefix(b" ") else {
        return err("missingSpaceBeforeDate", shown());
    };
    let digits = r.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return err("badDate", shown());
    }
    if r[0] == b'0' && digits > 1 {
        return err("zeroPaddedDate", shown());
    }
    // git's timestamps are unsigned 64-bit; past that it overflows.
    if std::str::from_utf8(&r[..digits])
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .is_none()
    {
        return err("badDateOverflow", shown());
    }
    let r = &r[digits..];
    let Some(tz) = r.strip_prefix(b" ") else {
        return err("badDate", shown());
    };
    if tz.len() != 5 || !(tz[0] == b'+' || tz[0] == b'-') || !tz[1..].iter().all(u8::is_ascii_digit)
    {
        return err("badTimezone", shown());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut v = Vec::new();
        for (mode, name) in entries {
            v.extend_from_slice(mode.as_bytes());
            v.push(b' ');
            v.extend_from_slice(name);
            v.push(0);
            v.extend_from_slice(&[0x11; 20]);
        }
        v
    }

    fn no_blob(_: &[u8]) -> Option<Vec<u8>> {
        None
    }

    fn tree_err(entries: &[(&str, &[u8])], blob: &dyn Fn(&[u8]) -> Option<Vec<u8>>) -> String {
        check(Kind::Tree, &tree(entries), 20, blob).unwrap_err()
    }

    #[test]
    fn dotgit_in_every_spelling() {
        for n in [
            ".git",
            ".GIT",
            ".Git",
            "git~1",
            "GIT~1",
            ".git ",
            ".git.",
            ".git. . ",
            ".git::$INDEX_ALLOCATION",
            "x\\.git",
            ".g\u{200c}it",
            "\u{feff}.git",
            ".gi\u{206a}T",
        ] {
            let e = tree_err(&[("100644", n.as_bytes())], &no_blob);
            assert!(e.starts_with("hasDotgit"), "{n:?}: {e}");
        }
        for n in [".gitx", "git", ".gi", "x.git", ".github"] {
            assert!(
                check(Kind::Tree, &tree(&[("100644", n.as_bytes())]), 20, &no_blob).is_ok(),
                "{n}"
            );
        }
    }

    #[test]
    fn tree_entries_modes_and_order() {
        assert!(tree_err(&[("100644", b".")], &no_blob).starts_with("hasDot:"));
        assert!(tree_err(&[("40000", b"..")], &no_blob).starts_with("hasDotdot"));
        assert!(tree_err(&[("100644", b"")], &no_blob).starts_with("emptyName"));
        assert!(tree_err(&[("100644", b"a/b")], &no_blob).starts_with("fullPathname"));
        assert!(tree_err(&[("0100644", b"a")], &no_blob).starts_with("zeroPaddedFilemode"));
        assert!(tree_err(&[("040000", b"a")], &no_blob).starts_with("zeroPaddedFilemode"));
        assert!(tree_err(&[("100664", b"a")], &no_blob).starts_with("badFilemode"));
        assert!(tree_err(&[("100600", b"a")], &no_blob).starts_with("badFilemode"));
        assert!(
            tree_err(&[("100644", b"b"), ("100644", b"a")], &no_blob).starts_with("treeNotSorted")
        );
        assert!(
            tree_err(&[("100644", b"a"), ("100644", b"a")], &no_blob)
                .starts_with("duplicateEntries")
        );
        assert!(
            tree_err(&[("100644", b"a"), ("40000", b"a")], &no_blob)
                .starts_with("duplicateEntries")
        );
        // "a-" sorts before the directory "a" (compared as "a/"), after the file "a".
        assert!(
            check(
                Kind::Tree,
                &tree(&[("100644", b"a-"), ("40000", b"a")]),
                20,
                &no_blob
            )
            .is_ok()
        );
        assert!(
            check(
                Kind::Tree,
                &tree(&[("100644", b"a"), ("100644", b"a-")]),
                20,
                &no_blob
            )
            .is_ok()
        );
        assert!(
            tree_err(&[("40000", b"a"), ("100644", b"a-")], &no_blob).starts_with("treeNotSorted")
        );
        let mut t = tree(&[("100644", b"a")]);
        t.truncate(t.len() - 3);
        assert!(
            check(Kind::Tree, &t, 20, &no_blob)
                .unwrap_err()
                .starts_with("badTree")
        );
    }

    #[test]
    fn gitmodules_attacks() {
        let bad = |text: &'static str| move |_: &[u8]| Some(text.as_bytes().to_vec());
        let cases: &[(&str, &str)] = &[
            (
                "[submodule \"../../hooks\"]\n\tpath = x\n\turl = ./x\n",
                "gitmodulesName",
            ),
            (
                "[submodule \"a\\\\..\\\\b\"]\n\tpath = x\n",
                "gitmodulesName",
            ),
            (
                "[submodule \"a\"]\n\turl = --upload-pack=touch$IFS/tmp/x\n",
                "gitmodulesUrl",
            ),
            ("[submodule \"a\"]\n\tpath = --x\n", "gitmodulesPath"),
            (
                "[submodule \"a\"]\n\tupdate = !touch /tmp/x\n",
                "gitmodulesUpdate",
            ),
            (
                "[submodule \"a\"]\n\turl = ../../../../../ext::sh -c touch\n",
                "gitmodulesUrl",
            ),
        ];
        for (text, id) in cases {
            for name in [".gitmodules", ".GITMODULES", "gitmod~1", ".gitmodules "] {
                let e = tree_err(&[("100644", name.as_bytes())], &bad(text));
                assert!(e.starts_with(id), "{name} {text}: {e}");
            }
        }
        assert!(tree_err(&[("120000", b".gitmodules")], &no_blob).starts_with("gitmodulesSymlink"));
        assert!(tree_err(&[("120000", b".gitmoduleS")], &no_blob).starts_with("gitmodulesSymlink"));
        assert!(tree_err(&[("100644", b".gitmodules")], &no_blob).starts_with("gitmodulesMissing"));
        let good = "[submodule \"lib\"]\n\tpath = lib\n\turl = ../lib.git\n";
        assert!(
            check(
                Kind::Tree,
                &tree(&[("100644", b".gitmodules")]),
                20,
                &bad(good)
            )
            .is_ok()
        );
        let long = "a".repeat(3000);
        let long: &'static str = Box::leak(long.into_boxed_str());
        assert!(
            tree_err(&[("100644", b".gitattributes")], &bad(long))
                .starts_with("gitattributesLineLength")
        );
    }

    #[test]
    fn gitmodules_and_gitattributes_that_are_not_blobs() {
        for (mode, name, id) in [
            ("40000", ".gitmodules", "gitmodulesBlob"),
            ("160000", ".gitmodules", "gitmodulesBlob"),
            ("40000", ".gitattributes", "gitattributesBlob"),
        ] {
            let e = tree_err(&[(mode, name.as_bytes())], &no_blob);
            assert!(e.starts_with(id), "{mode} {name}: {e}");
        }
        // A symlinked .gitattributes is only noted by git (info).
        assert!(
            check(
                Kind::Tree,
                &tree(&[("120000", b".gitattributes")]),
                20,
                &no_blob
            )
            .is_ok()
        );
    }

    #[test]
    fn index_entries_are_checked_as_the_trees_they_become() {
        let evil = || Some(b"[submodule \"../../modules/x\"]\n\tpath = x\n".to_vec());
        let good = || Some(b"[submodule \"x\"]\n\tpath = x\n\turl = ./x\n".to_vec());
        let none = || None;
        let e = |p: &str, m: u32, b: &dyn Fn() -> Option<Vec<u8>>| {
            check_index_entry(p.as_bytes(), m, b).unwrap_err()
        };
        for p in [".gitmodules", "sub/dir/.GITMODULES", "gitmod~1"] {
            assert!(e(p, 0o100644, &evil).contains("gitmodulesName"), "{p}");
            assert!(
                check_index_entry(p.as_bytes(), 0o100644, &good).is_ok(),
                "{p}"
            );
        }
        assert!(e(".gitmodules", 0o120000, &good).contains("gitmodulesSymlink"));
        assert!(e(".gitmodules", 0o160000, &none).contains("gitmodulesBlob"));
        assert!(e(".gitmodules", 0o100644, &none).contains("gitmodulesMissing"));
        assert!(e(".gitmodules/x", 0o100644, &none).contains("gitmodulesBlob"));
        assert!(e(".gitattributes/x", 0o100644, &none).contains("gitattributesBlob"));
        assert!(e(".git/config", 0o100644, &none).contains("hasDotgit"));
        assert!(e("a/.GIT/hooks/x", 0o100644, &none).contains("hasDotgit"));
        assert!(e("a/../b", 0o100644, &none).contains("hasDotdot"));
        assert!(e("a//b", 0o100644, &none).contains("emptyName"));
        // Ordinary paths never read their blob.
        assert!(check_index_entry(b"src/main.rs", 0o100644, &none).is_ok());
        assert!(check_index_entry(b"sub", 0o160000, &none).is_ok());
        assert!(check_index_entry(b"dir/.gitmodules.bak", 0o100644, &none).is_ok());
    }

    const T: &str = "tree 1111111111111111111111111111111111111111\n";

    fn commit(rest: &str) -> Result<(), String> {
        check(Kind::Commit, format!("{T}{rest}").as_bytes(), 20, &no_blob)
    }

    #[test]
    fn commits_and_idents() {
        let ok = "author A U Thor <a@x> 1234567890 +0000\ncommitter C <c@x> 1 -0130\n\nmsg\n";
        assert!(commit(ok).is_ok());
        assert!(commit(&format!("parent {}\n{ok}", "2".repeat(40))).is_ok());
        let cases: &[(&str, &str)] = &[
            (
                "parent 12\nauthor A <a@x> 1 +0000\ncommitter C <c@x> 1 +0000\n",
                "badParentSha1",
            ),
            ("committer C <c@x> 1 +0000\n", "missingAuthor"),
            ("author A <a@x> 1 +0000\n\n", "missingCommitter"),
            (
                "author A <a@x> 1 +0000\nauthor B <b@x> 1 +0000\ncommitter C <c@x> 1 +0000\n",
                "multipleAuthors",
            ),
            (
                "author <a@x> 1 +0000\ncommitter C <c@x> 1 +0000\n",
                "missingNameBeforeEmail",
            ),
            (
                "author A> <a@x> 1 +0000\ncommitter C <c@x> 1 +0000\n",
                "badName",
            ),
            (
                "author A 1 +0000\ncommitter C <c@x> 1 +0000\n",
                "missingEmail",
            ),
            (
                "author A<a@x> 1 +0000\ncommitter C <c@x> 1 +0000\n",
                "missingSpaceBeforeEmail",
            ),
            (
                "author A <a<x> 1 +0000\ncommitter C <c@x> 1 +0000\n",
                "badEmail",
            ),
            (
                "author A <a@x>1 +0000\ncommitter C <c@x> 1 +0000\n",
                "missingSpaceBeforeDate",
            ),
            (
                "author A <a@x> 01 +0000\ncommitter C <c@x> 1 +0000\n",
                "zeroPaddedDate",
            ),
            (
                "author A <a@x> 99999999999999999999999 +0000\ncommitter C <c@x> 1 +0000\n",
                "badDateOverflow",
            ),
            (
                "author A <a@x> x +0000\ncommitter C <c@x> 1 +0000\n",
                "badDate",
            ),
            (
                "author A <a@x> 1 0000\ncommitter C <c@x> 1 +0000\n",
                "badTimezone",
            ),
            (
                "author A <a@x> 1 +00000\ncommitter C <c@x> 1 +0000\n",
                "badTimezone",
            ),
            (
                "author A \0<a@x> 1 +0000\ncommitter C <c@x> 1 +0000\n",
                "nulInHeader",
            ),
        ];
        for (text, id) in cases {
            let e = commit(text).unwrap_err();
            assert!(e.starts_with(id), "{text:?}: {e}");
        }
        let e = check(Kind::Commit, b"tree 12\n", 20, &no_blob).unwrap_err();
        assert!(e.starts_with("badTreeSha1"), "{e}");
        let e = check(Kind::Commit, b"parent x\n", 20, &no_blob).unwrap_err();
        assert!(e.starts_with("missingTree"), "{e}");
    }

    #[test]
    fn tags() {
        let o = format!("object {}\n", "1".repeat(40));
        let ok = format!("{o}type commit\ntag v1\ntagger T <t@x> 1 +0000\n\nmsg\n");
        assert!(check(Kind::Tag, ok.as_bytes(), 20, &no_blob).is_ok());
        // No tagger: a note in git, accepted.
        let ok2 = format!("{o}type commit\ntag v1\n\nmsg\n");
        assert!(check(Kind::Tag, ok2.as_bytes(), 20, &no_blob).is_ok());
        let cases = [
            (
                "object 12\ntype commit\ntag v\n".to_string(),
                "badObjectSha1",
            ),
            ("type commit\ntag v\n".to_string(), "missingObject"),
            (format!("{o}tag v\n"), "missingTypeEntry"),
            (format!("{o}type bogus\ntag v\n"), "badType"),
            (format!("{o}type commit\n\n"), "missingTagEntry"),
            (
                format!("{o}type commit\ntag v\ntagger T <t@x> +0000\n"),
                "badDate",
            ),
        ];
        for (text, id) in cases {
            let e = check(Kind::Tag, text.as_bytes(), 20, &no_blob).unwrap_err();
            assert!(e.starts_with(id), "{text:?}: {e}");
        }
    }
}
