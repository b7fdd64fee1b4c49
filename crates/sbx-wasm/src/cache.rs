//! Compiled modules and components, cached in sbx's per-user registry directory so a
//! second run skips compilation.
//!
//! Key: the SHA-256 of the module's bytes and the engine's compatibility
//! hash (wasmtime version, target, every setting that changes the code).
//! File: the precompiled artifact followed by its own SHA-256, written
//! under a temporary name (0600, O_EXCL) and renamed into place.

use std::hash::{Hash, Hasher};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::Engine;

use crate::engine::Program;

/// Largest artifact read back (a module bigger than this is compiled).
const ARTIFACT_CAP: u64 = 1 << 30;

/// The cache directory (created 0700; `None` when sbx's registry cannot
/// be used, then every run compiles).
pub fn dir() -> Option<PathBuf> {
    // Temporaries of dead runs (SIGKILLed while writing an artifact).
    sbx_core::registry::reap(TMP_KIND, remove_tmp);
    let d = sbx_core::registry::dir().ok()?.join("wasm-cache");
    match std::fs::DirBuilder::new().mode(0o700).create(&d) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(_) => return None,
    }
    private(&std::fs::symlink_metadata(&d).ok()?, true).then_some(d)
}

use std::os::unix::fs::DirBuilderExt;

fn euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// Ours and writable by nobody else (a directory: nobody else may even
/// look into it).
fn private(m: &std::fs::Metadata, is_dir: bool) -> bool {
    let bad = if is_dir { 0o077 } else { 0o022 };
    m.uid() == euid() && m.mode() & bad == 0 && if is_dir { m.is_dir() } else { m.is_file() }
}

/// The artifact's file name for `module` under `engine`.
pub fn key(engine: &Engine, module: &[u8]) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    env!("CARGO_PKG_VERSION").hash(&mut h);
    format!("{}-{:016x}.cwasm", hex(&Sha256::digest(module)), h.finish())
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Reads an artifact written by [`store`] and checks it: a regular file
/// (not a symlink) of ours that nobody else can write, whose trailing
/// SHA-256 matches its content. `Ok(None)` when absent or not valid (it
/// is then compiled and written again).
pub fn load(engine: &Engine, path: &Path) -> io::Result<Option<Program>> {
    let mut f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Ok(None),
        Err(e) => return Err(e),
    };
    let m = f.metadata()?;
    if !private(&m, false) || m.len() < 32 || m.len() > ARTIFACT_CAP {
        return Ok(None);
    }
    let mut buf = Vec::with_capacity(m.len() as usize);
    f.read_to_end(&mut buf)?;
    let (art, sum) = buf.split_at(buf.len() - 32);
    if Sha256::digest(art).as_slice() != sum {
        return Ok(None);
    }
    // SAFETY: `deserialize` trusts its input to be an artifact this
    // wasmtime produced (it checks the version and the engine settings,
    // not the code). These bytes were written by sbx-wasm's own
    // `precompile_module` into a 0700 directory of the caller's registry
    // (checked private, ours, not a symlink), the file is a regular file
    // of ours that no other user can write (checked on the open fd), and
    // its content matches the SHA-256 stored with it, so it is what we
    // wrote and not half-written or damaged. Someone able to write it
    // already runs code as the caller.
    match unsafe { Program::deserialize(engine, art) } {
        Ok(m) => Ok(Some(m)),
        Err(_) => Ok(None),
    }
}

/// The registry kind of an artifact's temporary (`sbx_core::registry`).
const TMP_KIND: &str = "wasm-cache-tmp";

/// Removes a dead run's temporary: only a file of a `wasm-cache`
/// directory (never through a symlink: remove_file does not follow one).
fn remove_tmp(p: &Path) -> io::Result<()> {
    let in_cache = p
        .parent()
        .and_then(|d| d.file_name())
        .is_some_and(|n| n == "wasm-cache");
    let named = p
        .extension()
        .is_some_and(|x| x.as_encoded_bytes().starts_with(b"tmp"));
    if in_cache && named {
        std::fs::remove_file(p)?;
    }
    Ok(())
}

/// Writes `artifact` (with its SHA-256) as `path`, atomically. The
/// temporary is registered before it is made: a SIGKILL while it is
/// written leaves it to the next run's [`dir`].
pub fn store(path: &Path, artifact: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let _entry = sbx_core::registry::register(TMP_KIND, &tmp)?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    let r = f
        .write_all(artifact)
        .and_then(|()| f.write_all(&Sha256::digest(artifact)))
        .and_then(|()| {
            sbx_core::registry::test_kill_point("wasm-cache-tmp-written");
            std::fs::rename(&tmp, path)
        });
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}
