//! A snapshot file is read back by `check` and `repair --against`, and
//! `repair` writes what it says: the repository's files, included config
//! files and a hooksPath directory anywhere, by absolute path. A snapshot
//! the sandbox could have written (or anyone but this user) must therefore
//! never be believed. `snapshot` appends an HMAC-SHA256 of the snapshot's
//! bytes under a key only this user can read (32 random bytes, 0600, in
//! the user's private registry directory, made on first use); `load`
//! refuses a file whose MAC is missing or does not verify, before it
//! looks at a single path in it. The file stays JSON: the snapshot, then a
//! second JSON value on its own line, `{"mac":"HEX"}`.

use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::PathBuf;

use sha2::{Digest, Sha256};

const KEY_FILE: &str = "gitguard-snapshot.key";
const KEY_LEN: usize = 32;

fn key_path() -> io::Result<PathBuf> {
    Ok(sbx_core::registry::dir()?.join(KEY_FILE))
}

/// This user's key: read, or made when there is none (`create`).
fn key(create: bool) -> io::Result<[u8; KEY_LEN]> {
    let p = key_path()?;
    match read_key(&p) {
        Err(e) if e.kind() == io::ErrorKind::NotFound && create => {}
        other => return other,
    }
    let mut k = [0u8; KEY_LEN];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut k)?;
    // Written into a file with no name (O_TMPFILE) and linked into place:
    // a concurrent maker's key wins whole, a reader never sees a short
    // one, and a SIGKILL halfway leaves nothing behind. Where O_TMPFILE or
    // /proc is missing (FUSE, older overlayfs), under a temporary name.
    let named = |e: io::Error| io::Error::new(e.kind(), format!("the key {}: {e}", p.display()));
    let made = match unnamed_key(&p, &k) {
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL | libc::ENOENT)
            ) =>
        {
            named_key(&p, &k)
        }
        r => r,
    };
    match made {
        Ok(()) => Ok(k),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => read_key(&p).map_err(named),
        Err(e) => Err(named(e)),
    }
}

fn unnamed_key(p: &std::path::Path, k: &[u8]) -> io::Result<()> {
    let dir = p.parent().unwrap_or(std::path::Path::new("/"));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
        .open(dir)?;
    f.write_all(k)?;
    f.sync_all()?;
    link_unnamed(&f, p)
}

/// The same under a temporary name, removed after the link (a SIGKILL in
/// between leaves it: the next maker uses another name).
fn named_key(p: &std::path::Path, k: &[u8]) -> io::Result<()> {
    let tmp = p.with_file_name(format!(".{KEY_FILE}.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    let r = f
        .write_all(k)
        .and_then(|()| f.sync_all())
        .and_then(|()| std::fs::hard_link(&tmp, p));
    let _ = std::fs::remove_file(&tmp);
    r
}

/// Gives the O_TMPFILE file `f` the name `to` (never replacing one).
fn link_unnamed(f: &std::fs::File, to: &std::path::Path) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let from = std::ffi::CString::new(format!("/proc/self/fd/{}", f.as_raw_fd()))?;
    let to = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(to.as_os_str()))?;
    // SAFETY: both paths are NUL-ended and alive for the call.
    let r = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn read_key(p: &std::path::Path) -> io::Result<[u8; KEY_LEN]> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(p)?;
    let m = f.metadata()?;
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if !m.is_file() || m.uid() != me || m.mode() & 0o077 != 0 || m.len() != KEY_LEN as u64 {
        return Err(io::Error::other(format!(
            "{} is not a private {KEY_LEN}-byte key of this user",
            p.display()
        )));
    }
    let mut k = [0u8; KEY_LEN];
    f.read_exact(&mut k)?;
    Ok(k)
}

/// HMAC-SHA256 (RFC 2104) of `data` under `key`.
fn hmac(key: &[u8; KEY_LEN], data: &[u8]) -> [u8; 32] {
    let mut ipad = [0x36u8; 64];
    let mut opad = [0x5cu8; 64];
    for (i, b) in key.iter().enumerate() {
        ipad[i] ^= b;
        opad[i] ^= b;
    }
    let inner = Sha256::new()
        .chain_update(ipad)
        .chain_update(data)
        .finalize();
    Sha256::new()
        .chain_update(opad)
        .chain_update(inner)
        .finalize()
        .into()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The snapshot's bytes with their MAC line appended (making the key on
/// first use).
pub fn seal(data: &[u8]) -> io::Result<Vec<u8>> {
    let k = key(true)?;
    let mut out = data.to_vec();
    out.extend_from_slice(format!("\n{{\"mac\":\"{}\"}}\n", hex(&hmac(&k, data))).as_bytes());
    Ok(out)
}

/// The snapshot's bytes of a sealed file, or why it is not to be believed.
pub fn open(file: &[u8]) -> Result<&[u8], String> {
    let mut it = serde_json::Deserializer::from_slice(file).into_iter::<serde::de::IgnoredAny>();
    match it.next() {
        Some(Ok(_)) => {}
        Some(Err(e)) => return Err(format!("not JSON: {e}")),
        None => return Err("empty".into()),
    }
    let end = it.byte_offset();
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Mac {
        mac: String,
    }
    let tail = serde_json::from_slice::<Mac>(&file[end..]).map_err(|_| {
        "no MAC: made by an older sbx-gitguard, or not by `sbx-gitguard snapshot`; take a new snapshot".to_string()
    })?;
    let k = key(false).map_err(|e| {
        format!("its MAC cannot be checked ({e}): take a new snapshot as this user")
    })?;
    let want = hex(&hmac(&k, &file[..end]));
    // Constant time: the MAC is a secret's image.
    let same = want.len() == tail.mac.len()
        && want
            .bytes()
            .zip(tail.mac.bytes())
            .fold(0u8, |a, (x, y)| a | (x ^ y))
            == 0;
    if !same {
        return Err(
            "its MAC does not verify: changed since it was written, or made by another user or key; take a new snapshot"
                .into(),
        );
    }
    Ok(&file[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both ways of making the key leave exactly the key (0600, whole) and
    /// no temporary; the named one is the fallback where O_TMPFILE or /proc
    /// is missing (attacker helper-52: snapshots failed on FUSE).
    #[test]
    fn both_key_makers_leave_only_the_key() {
        use std::os::unix::fs::PermissionsExt;
        for unnamed in [true, false] {
            let d = tempfile::tempdir().unwrap();
            let p = d.path().join(KEY_FILE);
            let k = [7u8; KEY_LEN];
            if unnamed {
                unnamed_key(&p, &k).unwrap();
            } else {
                named_key(&p, &k).unwrap();
            }
            assert_eq!(read_key(&p).unwrap(), k);
            let names: Vec<_> = std::fs::read_dir(d.path())
                .unwrap()
                .flatten()
                .map(|e| e.file_name())
                .collect();
            assert_eq!(
                names,
                [std::ffi::OsString::from(KEY_FILE)],
                "unnamed {unnamed}"
            );
            assert_eq!(
                std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
                0o600
            );
            // A second maker finds it there.
            let again = if unnamed {
                unnamed_key(&p, &k)
            } else {
                named_key(&p, &k)
            };
            assert_eq!(again.unwrap_err().kind(), io::ErrorKind::AlreadyExists);
        }
    }

    #[test]
    fn hmac_matches_rfc_4231_case_2_shape() {
        // RFC 4231 test case 2 uses a 4-byte key; with our fixed 32-byte
        // keys the construction is checked against a key padded with zeros,
        // which HMAC defines as the same key.
        let mut k = [0u8; KEY_LEN];
        k[..4].copy_from_slice(b"Jefe");
        assert_eq!(
            hex(&hmac(&k, b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn sealed_opens_and_every_change_is_refused() {
        let d = tempfile::tempdir().unwrap();
        // SAFETY: this test alone sets the variable in its process
        // (nextest runs each test in its own process).
        unsafe { std::env::set_var("SBX_REGISTRY_DIR", d.path()) };
        let s = seal(br#"{"format":"x","units":[]}"#).unwrap();
        assert_eq!(open(&s).unwrap(), br#"{"format":"x","units":[]}"#);
        let mut forged = s.clone();
        forged[11] = b'y';
        assert!(open(&forged).unwrap_err().contains("does not verify"));
        let bare = br#"{"format":"x","units":[]}"#;
        assert!(open(bare).unwrap_err().contains("no MAC"));
        let mut extra = s.clone();
        extra.extend_from_slice(b"{}");
        assert!(open(&extra).is_err());
        // Another key (another user's, or a new one) does not verify it.
        std::fs::remove_file(key_path().unwrap()).unwrap();
        let _ = seal(b"{}").unwrap();
        assert!(open(&s).unwrap_err().contains("does not verify"));
    }
}
