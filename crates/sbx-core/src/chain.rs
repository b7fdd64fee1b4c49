//! Running the next command of the chain: PATH resolution as the sandbox
//! sees it, `execve` in place, and the 126/127 rules.

use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use crate::exit::{self, Failure};

/// PATH used when the environment has none (as execvp's default, minus ".").
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Whether `program` names an sbx tool (basename starts with `sbx-`): such a
/// next command receives the audit fd and may need capabilities.
pub fn is_sbx_tool(program: &OsStr) -> bool {
    Path::new(program)
        .file_name()
        .is_some_and(|n| n.as_bytes().starts_with(b"sbx-"))
}

/// Resolves `program` as `execvp` would with `path` (a PATH value).
/// Errors are exit-status failures: 127 not found, 126 not executable.
pub fn resolve(program: &OsStr, path: Option<&OsStr>) -> Result<PathBuf, Failure> {
    let shown = program.to_string_lossy();
    if program.is_empty() {
        return Err(Failure::with_code(exit::NOT_FOUND, "empty command name"));
    }
    if program.as_bytes().contains(&b'/') {
        return Ok(PathBuf::from(program));
    }
    let path = path.unwrap_or(OsStr::new(DEFAULT_PATH));
    let mut found_not_exec = None;
    for dir in path.as_bytes().split(|b| *b == b':') {
        let dir = if dir.is_empty() { b"." as &[u8] } else { dir };
        let cand = Path::new(OsStr::from_bytes(dir)).join(program);
        let Ok(meta) = std::fs::metadata(&cand) else {
            continue;
        };
        if !meta.is_file() {
            continue;
        }
        if access_x(&cand) {
            return Ok(cand);
        }
        found_not_exec.get_or_insert(cand);
    }
    match found_not_exec {
        Some(p) => Err(Failure::with_code(
            exit::NOT_EXECUTABLE,
            format!("{}: permission denied", p.display()),
        )),
        None => Err(Failure::with_code(
            exit::NOT_FOUND,
            format!("{shown}: command not found"),
        )),
    }
}

fn access_x(p: &Path) -> bool {
    let Ok(c) = CString::new(p.as_os_str().as_bytes()) else {
        return false;
    };
    unsafe { libc::access(c.as_ptr(), libc::X_OK) == 0 }
}

fn cstrings<I, S>(items: I) -> Result<Vec<CString>, Failure>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    items
        .into_iter()
        .map(|s| {
            CString::new(s.as_ref().as_bytes())
                .map_err(|_| Failure::new("argument or environment contains a NUL byte"))
        })
        .collect()
}

fn env_strings(env: &[(OsString, OsString)]) -> Result<Vec<CString>, Failure> {
    cstrings(env.iter().map(|(k, v)| {
        let mut s = k.clone();
        s.push("=");
        s.push(v);
        s
    }))
}

fn path_of(env: &[(OsString, OsString)]) -> Option<&OsStr> {
    env.iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_os_str())
}

/// Replaces this process with `argv` (resolved with the PATH in `env`).
/// Returns only on failure, with the 126/127 status and a message.
pub fn exec(argv: &[OsString], env: &[(OsString, OsString)]) -> Failure {
    let Some(prog) = argv.first() else {
        return Failure::new("no command given after --");
    };
    let path = match resolve(prog, path_of(env)) {
        Ok(p) => p,
        Err(f) => return f,
    };
    let (cpath, cargv, cenv) = match (
        CString::new(path.as_os_str().as_bytes()).map_err(|_| Failure::new("NUL in path")),
        cstrings(argv),
        env_strings(env),
    ) {
        (Ok(a), Ok(b), Ok(c)) => (a, b, c),
        (Err(f), _, _) | (_, Err(f), _) | (_, _, Err(f)) => return f,
    };
    let argv_p = ptrs(&cargv);
    let env_p = ptrs(&cenv);
    // run_main blocked the forwarded signals; the next program starts clean.
    let _ = crate::signals::unblock_all();
    unsafe { libc::execve(cpath.as_ptr(), argv_p.as_ptr(), env_p.as_ptr()) };
    exec_failure(&path)
}

/// `execveat(fd, "", AT_EMPTY_PATH)`: runs a program opened earlier (e.g.
/// before a pivot_root made its path unreachable). Returns only on failure.
pub fn exec_fd(fd: BorrowedFd<'_>, argv: &[OsString], env: &[(OsString, OsString)]) -> Failure {
    let (cargv, cenv) = match (cstrings(argv), env_strings(env)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(f), _) | (_, Err(f)) => return f,
    };
    let argv_p = ptrs(&cargv);
    let env_p = ptrs(&cenv);
    let _ = crate::signals::unblock_all();
    unsafe {
        libc::syscall(
            libc::SYS_execveat,
            fd.as_raw_fd(),
            c"".as_ptr(),
            argv_p.as_ptr(),
            env_p.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    };
    exec_failure(Path::new(
        argv.first().map(|s| s.as_os_str()).unwrap_or_default(),
    ))
}

fn ptrs(v: &[CString]) -> Vec<*const libc::c_char> {
    v.iter()
        .map(|c| c.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

fn exec_failure(path: &Path) -> Failure {
    let e = std::io::Error::last_os_error();
    let code = exit::for_exec_errno(e.raw_os_error().unwrap_or(libc::EACCES));
    Failure::with_code(code, format!("exec {}: {e}", path.display()))
}

/// The current environment as owned pairs, for building the next one.
pub fn current_env() -> Vec<(OsString, OsString)> {
    std::env::vars_os().collect()
}

/// Sets (or replaces) `key` in an environment vector.
pub fn set_env(
    env: &mut Vec<(OsString, OsString)>,
    key: impl Into<OsString>,
    val: impl Into<OsString>,
) {
    let key = key.into();
    let val = val.into();
    match env.iter_mut().find(|(k, _)| *k == key) {
        Some(slot) => slot.1 = val,
        None => env.push((key, val)),
    }
}

/// Removes `key` from an environment vector.
pub fn unset_env(env: &mut Vec<(OsString, OsString)>, key: &OsStr) {
    env.retain(|(k, _)| k != key);
}

/// Converts an OsString argument for messages.
pub fn show(argv: &[OsString]) -> String {
    argv.iter()
        .map(|a| String::from_utf8_lossy(&a.clone().into_vec()).into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sbx_tool_detection() {
        assert!(is_sbx_tool(OsStr::new("sbx-seccomp")));
        assert!(is_sbx_tool(OsStr::new("/usr/bin/sbx-fs")));
        assert!(!is_sbx_tool(OsStr::new("bash")));
        assert!(!is_sbx_tool(OsStr::new("/opt/sbx-dir/bash")));
    }

    #[test]
    fn resolve_rules() {
        let p = resolve(OsStr::new("sh"), Some(OsStr::new("/nonexistent:/bin"))).unwrap();
        assert_eq!(p, PathBuf::from("/bin/sh"));
        let f = resolve(OsStr::new("no-such-cmd-xyz"), Some(OsStr::new("/bin"))).unwrap_err();
        assert_eq!(f.code, 127);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("noexec"), "x").unwrap();
        let f = resolve(OsStr::new("noexec"), Some(dir.path().as_os_str())).unwrap_err();
        // root passes access(X_OK) only when some x bit is set: none is here.
        assert_eq!(f.code, 126);
    }

    #[test]
    fn env_helpers() {
        let mut env = vec![("A".into(), "1".into())];
        set_env(&mut env, "A", "2");
        set_env(&mut env, "B", "3");
        assert_eq!(env.len(), 2);
        assert_eq!(env[0].1, "2");
        unset_env(&mut env, OsStr::new("A"));
        assert_eq!(env.len(), 1);
    }
}
