//! Phantom credentials: a secret declared with the hosts it may go to
//! (`--secret NAME@HOST[,HOST...][=file:PATH|=fd:N]`). The command sees a
//! placeholder in NAME; the gateway puts the real value back into requests
//! to those hosts only (see [`crate::http`]) and blocks the placeholder
//! anywhere else. The real value lives in this process's memory only
//! (zeroed when dropped) and never in an event, a message or a file.

use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::PathBuf;

use zeroize::Zeroizing;

/// The mark every placeholder starts with.
pub const PREFIX: &str = "sbx-phantom-";

/// The largest value accepted (an API key or token, not a file).
pub const MAX_VALUE: usize = 16 * 1024;

/// Random characters in the shortest placeholder (guessing one is hopeless).
const MIN_RANDOM: usize = 24;

#[derive(Debug, thiserror::Error)]
#[error("--secret '{spec}': {why}")]
pub struct SecretError {
    pub spec: String,
    pub why: String,
}

/// Where the value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// sbx-net's own environment variable NAME.
    Env,
    File(PathBuf),
    Fd(i32),
}

/// A parsed `--secret` (no value yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub name: String,
    pub hosts: Vec<String>,
    pub source: Source,
}

/// A secret with its value and this run's placeholder.
pub struct Secret {
    pub name: String,
    pub hosts: Vec<String>,
    value: Zeroizing<Vec<u8>>,
    pub placeholder: String,
    /// `--secret-in-body NAME`: replaced in request bodies too.
    pub in_body: bool,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the value.
        f.debug_struct("Secret")
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

impl Secret {
    pub fn for_host(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.');
        self.hosts.iter().any(|h| h.eq_ignore_ascii_case(host))
    }
}

fn valid_name(n: &str) -> bool {
    let mut c = n.chars();
    matches!(c.next(), Some(x) if x.is_ascii_alphabetic() || x == '_')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
        && !n.starts_with("SBX_")
}

fn valid_host(h: &str) -> bool {
    h.len() <= 253
        && h.contains('.')
        && h.parse::<std::net::IpAddr>().is_err()
        && h.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
        })
}

/// Parses `NAME@HOST[,HOST...][=file:PATH|=fd:N]`.
pub fn parse_spec(spec: &str) -> Result<Spec, SecretError> {
    let err = |why: &str| SecretError {
        spec: spec.escape_default().to_string(),
        why: why.to_string(),
    };
    let (name, rest) = spec
        .split_once('@')
        .ok_or_else(|| err("expected NAME@HOST[,HOST...][=file:PATH|=fd:N]"))?;
    if !valid_name(name) {
        return Err(err(
            "NAME must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*, not SBX_*)",
        ));
    }
    let (hosts, source) = match rest.split_once('=') {
        None => (rest, Source::Env),
        Some((h, src)) => {
            let source = if let Some(p) = src.strip_prefix("file:") {
                if p.is_empty() {
                    return Err(err("file: needs a PATH"));
                }
                Source::File(PathBuf::from(p))
            } else if let Some(n) = src.strip_prefix("fd:") {
                match n.parse::<i32>() {
                    Ok(n) if n > 2 => Source::Fd(n),
                    _ => return Err(err("fd: needs a file descriptor number above 2")),
                }
            } else {
                return Err(err("the value source must be file:PATH or fd:N"));
            };
            (h, source)
        }
    };
    let hosts: Vec<String> = hosts
        .split(',')
        .map(|h| h.trim_end_matches('.').to_ascii_lowercase())
        .collect();
    if let Some(bad) = hosts.iter().find(|h| !valid_host(h)) {
        return Err(err(&format!(
            "'{}' is not a DNS host name (exact names only: no wildcard, no address)",
            bad.escape_default()
        )));
    }
    Ok(Spec {
        name: name.to_string(),
        hosts,
        source,
    })
}

/// Reads a value from a regular file or a pipe, at most [`MAX_VALUE`]
/// bytes (a bigger source is refused, not cut).
fn read_bounded(f: std::fs::File, what: &str) -> Result<Zeroizing<Vec<u8>>, String> {
    let mut v = Zeroizing::new(Vec::with_capacity(256));
    f.take(MAX_VALUE as u64 + 1)
        .read_to_end(&mut v)
        .map_err(|e| format!("reading {what}: {e}"))?;
    if v.len() > MAX_VALUE {
        return Err(format!("{what} holds more than {MAX_VALUE} bytes"));
    }
    Ok(v)
}

fn value_of(spec: &Spec) -> Result<Zeroizing<Vec<u8>>, String> {
    let mut v = match &spec.source {
        Source::Env => {
            let Some(v) = std::env::var_os(&spec.name) else {
                return Err(format!(
                    "sbx-net's environment has no {} (or give =file:PATH or =fd:N)",
                    spec.name
                ));
            };
            Zeroizing::new(std::os::unix::ffi::OsStringExt::into_vec(v))
        }
        Source::File(p) => {
            use std::os::unix::fs::OpenOptionsExt;
            // O_NONBLOCK: opening a FIFO must not wait for a writer.
            let f = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
                .open(p)
                .map_err(|e| format!("opening {}: {e}", p.display()))?;
            let md = f
                .metadata()
                .map_err(|e| format!("reading {}: {e}", p.display()))?;
            if !md.is_file() {
                return Err(format!("{} is not a regular file", p.display()));
            }
            if md.len() > MAX_VALUE as u64 {
                return Err(format!("{} holds more than {MAX_VALUE} bytes", p.display()));
            }
            read_bounded(f, &p.display().to_string())?
        }
        Source::Fd(n) => {
            // SAFETY: libc::stat is plain integers: all-zero is a valid value.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: fstat writes into `st`; a closed fd gives EBADF.
            if unsafe { libc::fstat(*n, &mut st) } != 0 {
                return Err(format!("fd {n}: {}", std::io::Error::last_os_error()));
            }
            let ty = st.st_mode & libc::S_IFMT;
            if ty != libc::S_IFREG && ty != libc::S_IFIFO {
                return Err(format!("fd {n} is neither a regular file nor a pipe"));
            }
            // SAFETY: the fd is open (fstat succeeded) and named by the
            // user for us: we take it over and close it after reading, so
            // it never reaches the command.
            let fd = unsafe { OwnedFd::from_raw_fd(*n) };
            if ty == libc::S_IFIFO {
                wait_for_eof(&fd, *n)?;
            }
            read_bounded(std::fs::File::from(fd), &format!("fd {n}"))?
        }
    };
    // A file or here-string usually ends with one newline.
    if !matches!(spec.source, Source::Env) && v.last() == Some(&b'\n') {
        v.pop();
        if v.last() == Some(&b'\r') {
            v.pop();
        }
    }
    if v.is_empty() {
        return Err("the value is empty".into());
    }
    if v.len() > MAX_VALUE {
        return Err(format!("the value is longer than {MAX_VALUE} bytes"));
    }
    if v.iter().any(|c| *c < 0x20 || *c == 0x7f) {
        return Err("the value holds control characters (it must fit in an HTTP header)".into());
    }
    Ok(v)
}

/// A pipe must be closed by its writer within 10 s (a here-string or
/// `printf ... |` is; a pipe left open would hang the start).
fn wait_for_eof(fd: &OwnedFd, n: i32) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // Readable data alone is not the end: wait for POLLHUP (all writers
    // gone) while the pipe holds at most one value.
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(format!(
                "fd {n}: the pipe's writer did not close it within 10s"
            ));
        }
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(1000) as i32) };
        if r > 0 && pfd.revents & libc::POLLHUP != 0 {
            return Ok(());
        }
        let mut queued: libc::c_int = 0;
        // SAFETY: FIONREAD writes an int.
        if unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &mut queued) } == 0
            && queued as usize > MAX_VALUE
        {
            return Err(format!("fd {n} holds more than {MAX_VALUE} bytes"));
        }
        if r > 0 && pfd.revents & libc::POLLIN == 0 {
            return Err(format!("fd {n}: poll error"));
        }
        if r > 0 {
            // Data but writers left open: sleep a little (poll would
            // report POLLIN at once again).
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// A placeholder for a value of `len` bytes: PREFIX and random letters and
/// digits, as long as the value when that leaves at least [`MIN_RANDOM`]
/// random characters.
pub fn placeholder(len: usize) -> Result<String, String> {
    const ALPHA: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let n = len.saturating_sub(PREFIX.len()).max(MIN_RANDOM);
    let mut raw = vec![0u8; n * 2];
    let mut got = 0;
    while got < raw.len() {
        // SAFETY: writes at most the rest of `raw`.
        let r = unsafe { libc::getrandom(raw[got..].as_mut_ptr().cast(), raw.len() - got, 0) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(format!("getrandom: {e}"));
        }
        got += r as usize;
    }
    // Rejection sampling (62 letters): no bias.
    let mut out = String::from(PREFIX);
    for b in raw {
        if out.len() == PREFIX.len() + n {
            break;
        }
        if (b as usize) < 62 * 4 {
            out.push(ALPHA[b as usize % 62] as char);
        }
    }
    while out.len() < PREFIX.len() + n {
        // Astronomically unlikely: too many rejections; top up.
        out.push_str(&placeholder(0)?[PREFIX.len()..][..1]);
    }
    Ok(out)
}

/// Reads every secret's value and makes its placeholder.
pub fn load(specs: &[Spec], in_body: &[String]) -> Result<Vec<Secret>, SecretError> {
    let mut out: Vec<Secret> = Vec::new();
    for s in specs {
        let err = |why: String| SecretError {
            spec: format!("{}@{}", s.name, s.hosts.join(",")),
            why,
        };
        if out.iter().any(|o| o.name == s.name) {
            return Err(err("declared twice".into()));
        }
        let value = value_of(s).map_err(err)?;
        let placeholder = placeholder(value.len()).map_err(err)?;
        out.push(Secret {
            name: s.name.clone(),
            hosts: s.hosts.clone(),
            value,
            placeholder,
            in_body: in_body.contains(&s.name),
        });
    }
    if let Some(n) = in_body.iter().find(|n| !out.iter().any(|s| s.name == **n)) {
        return Err(SecretError {
            spec: n.clone(),
            why: "--secret-in-body names no declared --secret".into(),
        });
    }
    Ok(out)
}

/// Overwrites NAME's value in this process's original environment block
/// (what /proc/PID/environ shows) and removes NAME from the environment, so
/// that the only copy left is the one in [`Secret`]. Call before any
/// thread starts.
pub fn scrub_env(name: &str) {
    // SAFETY: single-threaded (called at start, before the gateway's
    // threads); `environ` is a NULL-terminated array of C strings that we
    // only overwrite within their own length.
    unsafe {
        unsafe extern "C" {
            static mut environ: *mut *mut libc::c_char;
        }
        let mut p = environ;
        while !p.is_null() && !(*p).is_null() {
            let s = *p;
            let len = libc::strlen(s);
            let bytes = std::slice::from_raw_parts_mut(s.cast::<u8>(), len);
            if bytes.len() > name.len()
                && bytes[name.len()] == b'='
                && &bytes[..name.len()] == name.as_bytes()
            {
                for b in &mut bytes[name.len() + 1..] {
                    *b = b'x';
                }
            }
            p = p.add(1);
        }
        std::env::remove_var(name);
    }
}

/// Finds the first secret whose placeholder occurs in `hay` (bytes as
/// sent). With `fold`, letters are compared without case and '.' in `hay`
/// is skipped (DNS names: a placeholder split into labels).
pub fn find<'a>(secrets: &'a [Secret], hay: &[u8], fold: bool) -> Option<&'a Secret> {
    if fold {
        let flat: Vec<u8> = hay
            .iter()
            .filter(|c| **c != b'.')
            .map(|c| c.to_ascii_lowercase())
            .collect();
        return secrets.iter().find(|s| {
            let p = s.placeholder.to_ascii_lowercase();
            contains(&flat, p.as_bytes())
        });
    }
    secrets
        .iter()
        .find(|s| contains(hay, s.placeholder.as_bytes()))
}

pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// `hay` with every occurrence of `s`'s placeholder replaced by its value.
pub fn replace(s: &Secret, hay: &[u8]) -> Zeroizing<Vec<u8>> {
    let p = s.placeholder.as_bytes();
    let mut out = Zeroizing::new(Vec::with_capacity(hay.len() + s.value.len()));
    let mut i = 0;
    while i < hay.len() {
        if hay[i..].starts_with(p) {
            out.extend_from_slice(&s.value);
            i += p.len();
        } else {
            out.push(hay[i]);
            i += 1;
        }
    }
    out
}

/// The longest placeholder (bytes a stream scanner must hold back).
pub fn longest(secrets: &[Secret]) -> usize {
    secrets
        .iter()
        .map(|s| s.placeholder.len())
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
pub fn test_secret(name: &str, hosts: &[&str], value: &str) -> Secret {
    Secret {
        name: name.into(),
        hosts: hosts.iter().map(|h| h.to_string()).collect(),
        value: Zeroizing::new(value.as_bytes().to_vec()),
        placeholder: placeholder(value.len()).unwrap(),
        in_body: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs() {
        let s = parse_spec("API_KEY@api.example.com,Other.Example.com.").unwrap();
        assert_eq!(s.name, "API_KEY");
        assert_eq!(s.hosts, ["api.example.com", "other.example.com"]);
        assert_eq!(s.source, Source::Env);
        assert_eq!(
            parse_spec("K@a.test=file:/x/y").unwrap().source,
            Source::File("/x/y".into())
        );
        assert_eq!(parse_spec("K@a.test=fd:3").unwrap().source, Source::Fd(3));
        for bad in [
            "K",
            "1K@a.test",
            "K-X@a.test",
            "SBX_ID@a.test",
            "K@",
            "K@localhost",
            "K@*.a.test",
            "K@10.0.0.1",
            "K@a.test=fd:1",
            "K@a.test=http:x",
            "K@a.test=file:",
            "K@a..test",
        ] {
            let e = parse_spec(bad).unwrap_err().to_string();
            assert!(!e.contains('\n'), "{bad}: {e}");
        }
    }

    #[test]
    fn placeholders() {
        let a = placeholder(51).unwrap();
        let b = placeholder(51).unwrap();
        assert_ne!(a, b);
        assert_eq!(a.len(), 51);
        assert!(a.starts_with(PREFIX));
        assert_eq!(placeholder(5).unwrap().len(), PREFIX.len() + MIN_RANDOM);
        assert!(a[PREFIX.len()..].bytes().all(|c| c.is_ascii_alphanumeric()));
    }

    #[test]
    fn find_and_replace() {
        let s = test_secret("K", &["a.test"], "real-value");
        let v = vec![s];
        let msg = format!("Bearer {}", v[0].placeholder);
        assert!(find(&v, msg.as_bytes(), false).is_some());
        assert_eq!(&*replace(&v[0], msg.as_bytes()), b"Bearer real-value");
        // Split into DNS labels and upper-cased.
        let p = v[0].placeholder.to_ascii_uppercase();
        let dns = format!("{}.{}.evil.test", &p[..20], &p[20..]);
        assert!(find(&v, dns.as_bytes(), true).is_some());
        assert!(find(&v, b"nothing here", true).is_none());
        assert!(v[0].for_host("A.test."));
        assert!(!v[0].for_host("b.test"));
        assert!(!format!("{:?}", v[0]).contains("real-value"));
    }
}
