//! Turning the flags into a checked configuration. Pure: nothing here
//! touches the host, so every bad input is refused before anything exists.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Default size of the fresh /tmp (and of the empty $HOME).
pub const DEFAULT_TMP_SIZE: &str = sbx_spec::fs::DEFAULT_TMP_SIZE;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    #[error("{flag} '{value}': {why}")]
    Bad {
        flag: &'static str,
        value: String,
        why: String,
    },
}

fn bad(flag: &'static str, value: &OsStr, why: impl Into<String>) -> SpecError {
    SpecError::Bad {
        flag,
        value: value.to_string_lossy().into_owned(),
        why: why.into(),
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindSpec {
    pub flag: &'static str,
    pub src: PathBuf,
    /// None: the same path as the (canonical) source.
    pub dst: Option<PathBuf>,
    pub rw: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TmpfsSpec {
    pub dst: PathBuf,
    pub size: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvOp {
    Set(OsString, OsString),
    Unset(OsString),
}

#[derive(Debug, Clone)]
pub struct Spec {
    /// `--scan-limit`: entries one bind's search for protected names may
    /// read (beyond it the run is refused).
    pub scan_limit: usize,
    /// `--quarantine`: where the end sweep moves what it takes out.
    pub quarantine: Option<PathBuf>,
    pub binds: Vec<BindSpec>,
    pub tmpfs: Vec<TmpfsSpec>,
    pub deny: Vec<OsString>,
    pub chdir: Option<PathBuf>,
    pub hostname: Option<String>,
    pub clearenv: bool,
    pub env_ops: Vec<EnvOp>,
    /// Which of the caller's variables pass (unless --clearenv).
    pub env_policy: sbx_core::envpolicy::Policy,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub system: bool,
    pub default_deny: bool,
    pub tmp_size: u64,
    pub git_stage: Option<PathBuf>,
    /// `--write-quota`/`--write-inodes`: the writable binds' budget.
    pub write_quota: Option<crate::quota::Budget>,
}

/// A sandbox path: absolute, no `..`, `.` and duplicate slashes removed,
/// not `/` itself.
pub fn sandbox_path(flag: &'static str, raw: &OsStr) -> Result<PathBuf, SpecError> {
    let p = Path::new(raw);
    if !p.is_absolute() {
        return Err(bad(flag, raw, "destination must be an absolute path"));
    }
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => {
                return Err(bad(flag, raw, "'..' is not allowed in a destination"));
            }
            Component::Normal(n) => out.push(n),
            Component::Prefix(_) => return Err(bad(flag, raw, "not a Linux path")),
        }
    }
    if out == Path::new("/") {
        return Err(bad(flag, raw, "cannot mount over the sandbox root"));
    }
    if out.starts_with("/proc") {
        return Err(bad(flag, raw, "destination inside /proc is not allowed"));
    }
    Ok(out)
}

/// `SRC[:DST]`: the last `:` followed by `/` separates a destination.
pub fn parse_bind(flag: &'static str, raw: &OsStr, rw: bool) -> Result<BindSpec, SpecError> {
    let b = raw.as_bytes();
    if b.is_empty() {
        return Err(bad(flag, raw, "empty source"));
    }
    let split = b
        .iter()
        .rposition(|c| *c == b':')
        .filter(|&i| b.get(i + 1) == Some(&b'/'));
    let (src, dst) = match split {
        Some(i) => (
            OsStr::from_bytes(&b[..i]),
            Some(sandbox_path(flag, OsStr::from_bytes(&b[i + 1..]))?),
        ),
        None => (raw, None),
    };
    if src.is_empty() {
        return Err(bad(flag, raw, "empty source"));
    }
    Ok(BindSpec {
        flag,
        src: PathBuf::from(src),
        dst,
        rw,
    })
}

/// `DST[:SIZE]`.
pub fn parse_tmpfs(raw: &str, default_size: u64) -> Result<TmpfsSpec, SpecError> {
    let flag = "--tmpfs";
    let (dst, size) = match raw.rsplit_once(':') {
        Some((d, s)) => {
            let size = sbx_core::units::parse_size(s)
                .map_err(|e| bad(flag, OsStr::new(raw), e.to_string()))?;
            (d, size)
        }
        None => (raw, default_size),
    };
    if size == 0 {
        return Err(bad(flag, OsStr::new(raw), "size must be greater than 0"));
    }
    Ok(TmpfsSpec {
        dst: sandbox_path(flag, OsStr::new(dst))?,
        size,
    })
}

pub fn parse_size_flag(flag: &'static str, raw: &str) -> Result<u64, SpecError> {
    let v =
        sbx_core::units::parse_size(raw).map_err(|e| bad(flag, OsStr::new(raw), e.to_string()))?;
    if v == 0 {
        return Err(bad(flag, OsStr::new(raw), "size must be greater than 0"));
    }
    Ok(v)
}

/// `--write-quota SIZE` and `--write-inodes N` (which needs the first).
pub fn parse_budget(
    size: Option<&str>,
    inodes: Option<u64>,
) -> Result<Option<crate::quota::Budget>, SpecError> {
    let Some(size) = size else {
        return match inodes {
            Some(n) => Err(bad(
                "--write-inodes",
                OsStr::new(&n.to_string()),
                "needs --write-quota",
            )),
            None => Ok(None),
        };
    };
    let bytes = parse_size_flag("--write-quota", size)?;
    let inodes = inodes.unwrap_or(crate::quota::DEFAULT_INODES);
    if inodes == 0 {
        return Err(bad(
            "--write-inodes",
            OsStr::new("0"),
            "must be greater than 0",
        ));
    }
    Ok(Some(crate::quota::Budget { bytes, inodes }))
}

pub fn parse_setenv(raw: &OsStr) -> Result<EnvOp, SpecError> {
    let b = raw.as_bytes();
    let Some(i) = b.iter().position(|c| *c == b'=') else {
        return Err(bad("--setenv", raw, "expected K=V"));
    };
    if i == 0 {
        return Err(bad("--setenv", raw, "empty variable name"));
    }
    Ok(EnvOp::Set(
        OsStr::from_bytes(&b[..i]).to_owned(),
        OsStr::from_bytes(&b[i + 1..]).to_owned(),
    ))
}

pub fn parse_unsetenv(raw: &OsStr) -> Result<EnvOp, SpecError> {
    if raw.is_empty() || raw.as_bytes().contains(&b'=') {
        return Err(bad("--unsetenv", raw, "expected a variable name"));
    }
    Ok(EnvOp::Unset(raw.to_owned()))
}

pub fn check_hostname(raw: &str) -> Result<(), SpecError> {
    let ok = !raw.is_empty()
        && raw.len() <= 64
        && raw
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'.' || c == b'_');
    if ok {
        Ok(())
    } else {
        Err(bad(
            "--hostname",
            OsStr::new(raw),
            "expected 1-64 characters of [A-Za-z0-9._-]",
        ))
    }
}

pub fn check_deny(raw: &OsStr) -> Result<(), SpecError> {
    if raw.is_empty() {
        return Err(bad("--deny", raw, "empty path"));
    }
    if Path::new(raw)
        .components()
        .any(|c| c == Component::ParentDir)
    {
        return Err(bad("--deny", raw, "'..' is not allowed"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations() {
        assert_eq!(
            sandbox_path("--ro", OsStr::new("/a//b/./c/")).unwrap(),
            PathBuf::from("/a/b/c")
        );
        assert!(sandbox_path("--ro", OsStr::new("a")).is_err());
        assert!(sandbox_path("--ro", OsStr::new("/a/../b")).is_err());
        assert!(sandbox_path("--ro", OsStr::new("/")).is_err());
        assert!(sandbox_path("--ro", OsStr::new("/proc/sys")).is_err());
        assert!(sandbox_path("--ro", OsStr::new("/proc")).is_err());
        assert!(sandbox_path("--ro", OsStr::new("/procfoo")).is_ok());
    }

    #[test]
    fn binds() {
        let b = parse_bind("--ro", OsStr::new("/src"), false).unwrap();
        assert_eq!(b.dst, None);
        let b = parse_bind("--rw", OsStr::new("./a:b:/x"), true).unwrap();
        assert_eq!(b.src, PathBuf::from("./a:b"));
        assert_eq!(b.dst, Some(PathBuf::from("/x")));
        let b = parse_bind("--ro", OsStr::new("a:b"), false).unwrap();
        assert_eq!(b.src, PathBuf::from("a:b"));
        assert!(parse_bind("--ro", OsStr::new(":/x"), false).is_err());
        assert!(parse_bind("--ro", OsStr::new("/a:/proc/x"), false).is_err());
    }

    #[test]
    fn tmpfs_and_sizes() {
        let t = parse_tmpfs("/cache:64M", 1).unwrap();
        assert_eq!(t.size, 64 << 20);
        assert_eq!(parse_tmpfs("/cache", 7).unwrap().size, 7);
        assert!(parse_tmpfs("/cache:lots", 1).is_err());
        assert!(parse_tmpfs("/cache:0", 1).is_err());
        assert!(parse_size_flag("--tmp-size", "12Q").is_err());
        let b = parse_budget(Some("64M"), None).unwrap().unwrap();
        assert_eq!(
            (b.bytes, b.inodes),
            (64 << 20, crate::quota::DEFAULT_INODES)
        );
        assert_eq!(
            parse_budget(Some("1M"), Some(5)).unwrap().unwrap().inodes,
            5
        );
        assert_eq!(parse_budget(None, None).unwrap(), None);
        let e = parse_budget(None, Some(5)).unwrap_err().to_string();
        assert!(
            e.contains("--write-inodes") && e.contains("needs --write-quota"),
            "{e}"
        );
        assert!(parse_budget(Some("0"), None).is_err());
        assert!(parse_budget(Some("lots"), None).is_err());
        assert!(parse_budget(Some("1M"), Some(0)).is_err());
    }

    #[test]
    fn env_and_names() {
        assert_eq!(
            parse_setenv(OsStr::new("A=b=c")).unwrap(),
            EnvOp::Set("A".into(), "b=c".into())
        );
        assert!(parse_setenv(OsStr::new("A")).is_err());
        assert!(parse_setenv(OsStr::new("=x")).is_err());
        assert!(parse_unsetenv(OsStr::new("A=")).is_err());
        assert!(check_hostname("box-1").is_ok());
        assert!(check_hostname("a b").is_err());
        assert!(check_deny(OsStr::new("../x")).is_err());
    }
}
