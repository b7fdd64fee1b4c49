//! The sandbox id: set by the first tool of a chain, inherited by the rest.

use std::sync::OnceLock;

pub const ENV: &str = "SBX_ID";

static ID: OnceLock<String> = OnceLock::new();

#[derive(Debug, thiserror::Error)]
#[error("SBX_ID '{0}' is invalid: use 1-64 characters from [A-Za-z0-9_.-]")]
pub struct InvalidId(String);

/// A valid id is safe to put in a cgroup, file or container name.
pub fn is_valid(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

/// Returns SBX_ID, generating and exporting one when it is unset.
///
/// Call it while the process is still single-threaded (start of `main`):
/// it may set the environment variable.
pub fn ensure() -> Result<&'static str, InvalidId> {
    if let Some(id) = ID.get() {
        return Ok(id);
    }
    let id = match std::env::var(ENV) {
        Ok(v) if is_valid(&v) => v,
        Ok(v) => return Err(InvalidId(v)),
        Err(_) => {
            let v = generate();
            // SAFETY: called at start-up before any thread is spawned.
            unsafe { std::env::set_var(ENV, &v) };
            v
        }
    };
    Ok(ID.get_or_init(|| id))
}

/// The id, if [`ensure`] has run.
pub fn get() -> Option<&'static str> {
    ID.get().map(String::as_str)
}

/// 12 unpredictable characters for a private temporary name (nothing can
/// be planted at the name in advance; the caller's mkdir refuses an
/// existing path anyway).
pub fn random_suffix() -> String {
    let mut buf = [0u8; 9];
    // SAFETY: buf is a live 9-byte buffer.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n != buf.len() as isize {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        buf.copy_from_slice(&t.to_le_bytes()[..9]);
    }
    const ABC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-";
    let mut out = String::new();
    for c in buf.chunks(3) {
        let v = u32::from(c[0]) << 16 | u32::from(c[1]) << 8 | u32::from(c[2]);
        for k in (0..4).rev() {
            out.push(ABC[(v >> (6 * k)) as usize & 63] as char);
        }
    }
    out
}

fn generate() -> String {
    let mut buf = [0u8; 8];
    // getrandom(2) never returns short for <= 256 bytes once the pool is ready.
    // SAFETY: buf is a live 8-byte buffer.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n != buf.len() as isize {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        buf = (t ^ u64::from(std::process::id()) << 32).to_le_bytes();
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validity() {
        assert!(is_valid("a1b2c3"));
        assert!(is_valid("run-42_x.y"));
        assert!(!is_valid(""));
        assert!(!is_valid("../x"));
        assert!(!is_valid(".hidden"));
        assert!(!is_valid("a b"));
        assert!(!is_valid(&"x".repeat(65)));
        assert_eq!(generate().len(), 16);
    }
}
