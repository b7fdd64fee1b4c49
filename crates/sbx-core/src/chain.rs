//! Running the next command of the chain: PATH resolution as the sandbox
//! sees it, `execve` in place, and the 126/127 rules.

use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use crate::exit::{self, Failure};

/// PATH used when the environment has none (as execvp's default, minus ".").
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Whether `program` is one of the real sbx tool binaries, by identity
/// ([`crate::toolid`]), never by name: such a next command receives the audit
/// fd and may need capabilities. `program` is resolved with this process's
/// PATH; a program pinned by [`spawn_program`] is judged by its pinned file.
pub fn is_sbx_tool(program: &OsStr) -> bool {
    if let Some(t) = pinned(program) {
        return t;
    }
    let path = std::env::var_os("PATH");
    open_tool(program, path.as_deref()).is_some()
}

/// Resolves `program` with `path` and opens it once; returns the open file
/// only when it is a trusted sbx tool (then execute *that* file, e.g. with
/// [`exec_fd`], so the check and the exec see the same inode).
pub fn open_tool(program: &OsStr, path: Option<&OsStr>) -> Option<OwnedFd> {
    RAN_NEXT.store(true, std::sync::atomic::Ordering::Relaxed);
    let p = resolve(program, path).ok()?;
    let fd = crate::toolid::open_path(&p).ok()?;
    crate::toolid::is_tool(fd.as_fd()).then_some(fd)
}

/// Whether this process set up a next command (a run, not a check or a
/// daemon): only then is there an end-of-run summary to print.
static RAN_NEXT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub fn ran_next() -> bool {
    RAN_NEXT.load(std::sync::atomic::Ordering::Relaxed)
}

/// Files opened by [`spawn_program`]: they stay open until this process
/// execs or exits (a supervisor spawns one next command).
static PINNED: std::sync::Mutex<Vec<OwnedFd>> = std::sync::Mutex::new(Vec::new());

const PROC_FD: &str = "/proc/self/fd/";

/// The program path a spawned child should exec for the resolved program
/// `resolved`: when it is a trusted sbx tool, the file is opened now and the
/// child execs `/proc/self/fd/N` (that very file, whatever happens to the
/// path meanwhile); anything else is executed by its path.
pub fn spawn_program(resolved: PathBuf) -> PathBuf {
    RAN_NEXT.store(true, std::sync::atomic::Ordering::Relaxed);
    let Ok(fd) = crate::toolid::open_path(&resolved) else {
        return resolved;
    };
    if !crate::toolid::is_tool(fd.as_fd()) {
        return resolved;
    }
    let p = PathBuf::from(format!("{PROC_FD}{}", fd.as_raw_fd()));
    PINNED.lock().unwrap_or_else(|e| e.into_inner()).push(fd);
    p
}

/// Some(trusted) when `program` is a path made by [`spawn_program`].
fn pinned(program: &OsStr) -> Option<bool> {
    let n: i32 = std::str::from_utf8(program.as_bytes().strip_prefix(PROC_FD.as_bytes())?)
        .ok()?
        .parse()
        .ok()?;
    let list = PINNED.lock().unwrap_or_else(|e| e.into_inner());
    let fd = list.iter().find(|f| f.as_raw_fd() == n)?;
    Some(crate::toolid::is_tool(fd.as_fd()))
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
    // SAFETY: c is NUL-ended and alive for the call.
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
/// A trusted sbx tool is opened once and executed from that file, with the
/// audit fd handed on; anything else is executed by path and gets neither
/// the audit fd nor its variables. Returns only on failure, with the 126/127
/// status and a message.
pub fn exec(argv: &[OsString], env: &[(OsString, OsString)]) -> Failure {
    let Some(prog) = argv.first() else {
        return Failure::new("no command given after --");
    };
    let path = match resolve(prog, path_of(env)) {
        Ok(p) => p,
        Err(f) => return f,
    };
    if let Ok(fd) = crate::toolid::open_path(&path)
        && crate::toolid::is_tool(fd.as_fd())
    {
        return exec_fd(fd.as_fd(), argv, env);
    }
    let mut env = env.to_vec();
    crate::audit::prepare_exec_env(&mut env, false);
    let (cpath, cargv, cenv) = match (
        CString::new(path.as_os_str().as_bytes()).map_err(|_| Failure::new("NUL in path")),
        cstrings(argv),
        env_strings(&env),
    ) {
        (Ok(a), Ok(b), Ok(c)) => (a, b, c),
        (Err(f), _, _) | (_, Err(f), _) | (_, _, Err(f)) => return f,
    };
    let argv_p = ptrs(&cargv);
    let env_p = ptrs(&cenv);
    // run_main blocked the forwarded signals; the next program starts clean.
    let _ = crate::signals::unblock_all();
    // SAFETY: cpath, and argv/env (null-ended pointer arrays into cargv/cenv), live on this
    // frame for the call.
    unsafe { libc::execve(cpath.as_ptr(), argv_p.as_ptr(), env_p.as_ptr()) };
    exec_failure(&path)
}

/// `execveat(fd, "", AT_EMPTY_PATH)`: runs a program opened earlier (e.g.
/// before a pivot_root made its path unreachable). When that file is a
/// trusted sbx tool it receives the audit fd. Returns only on failure.
pub fn exec_fd(fd: BorrowedFd<'_>, argv: &[OsString], env: &[(OsString, OsString)]) -> Failure {
    let mut env = env.to_vec();
    crate::audit::prepare_exec_env(&mut env, crate::toolid::is_tool(fd));
    let (cargv, cenv) = match (cstrings(argv), env_strings(&env)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(f), _) | (_, Err(f)) => return f,
    };
    let argv_p = ptrs(&cargv);
    let env_p = ptrs(&cenv);
    let _ = crate::signals::unblock_all();
    // SAFETY: NUL-terminated argv/envp arrays that outlive the call.
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
    fn sbx_tool_detection_is_by_identity_not_name() {
        // This test binary is trusted as "own exe"; a look-alike named
        // sbx-* is not, nor is an ordinary program.
        let me = std::fs::read_link("/proc/self/exe").unwrap();
        assert!(is_sbx_tool(me.as_os_str()));
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("sbx-seccomp");
        std::fs::copy(&me, &fake).unwrap();
        assert!(!is_sbx_tool(fake.as_os_str()));
        assert!(!is_sbx_tool(OsStr::new("/bin/sh")));
        let pinned = spawn_program(me.clone());
        assert!(pinned.starts_with(PROC_FD));
        assert!(is_sbx_tool(pinned.as_os_str()));
        assert_eq!(spawn_program(fake.clone()), fake);
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
