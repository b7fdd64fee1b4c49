//! `--rlimit NAME=SOFT[:HARD]`: parsing, a pre-flight check, and applying
//! the limits in the child between fork and exec.

use sbx_core::units;

#[derive(Debug, thiserror::Error)]
pub enum RlimitError {
    #[error("--rlimit '{0}': expected NAME=SOFT[:HARD] (e.g. nofile=1024:4096, fsize=100M)")]
    Syntax(String),
    #[error("--rlimit '{0}': unknown limit '{1}' (known: {known})", known = NAMES.iter().map(|n| n.0).collect::<Vec<_>>().join(", "))]
    UnknownName(String, String),
    #[error("--rlimit '{0}': invalid value '{1}' ({2})")]
    Value(String, String, &'static str),
    #[error("--rlimit '{0}': the soft limit is above the hard limit")]
    SoftAboveHard(String),
    #[error("--rlimit {0}: cannot set soft={1} hard={2}: {3}")]
    Apply(&'static str, String, String, std::io::Error),
}

/// How a limit's value is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Bytes: sizes with suffixes (100M).
    Bytes,
    /// A count (files, processes, signals...).
    Count,
    /// CPU seconds (a plain number or a duration: 90, 1m30s).
    Seconds,
    /// Microseconds (RLIMIT_RTTIME).
    Micros,
}

const NAMES: &[(&str, libc::__rlimit_resource_t, Kind)] = &[
    ("as", libc::RLIMIT_AS, Kind::Bytes),
    ("core", libc::RLIMIT_CORE, Kind::Bytes),
    ("cpu", libc::RLIMIT_CPU, Kind::Seconds),
    ("data", libc::RLIMIT_DATA, Kind::Bytes),
    ("fsize", libc::RLIMIT_FSIZE, Kind::Bytes),
    ("locks", libc::RLIMIT_LOCKS, Kind::Count),
    ("memlock", libc::RLIMIT_MEMLOCK, Kind::Bytes),
    ("msgqueue", libc::RLIMIT_MSGQUEUE, Kind::Bytes),
    ("nice", libc::RLIMIT_NICE, Kind::Count),
    ("nofile", libc::RLIMIT_NOFILE, Kind::Count),
    ("nproc", libc::RLIMIT_NPROC, Kind::Count),
    ("rss", libc::RLIMIT_RSS, Kind::Bytes),
    ("rtprio", libc::RLIMIT_RTPRIO, Kind::Count),
    ("rttime", libc::RLIMIT_RTTIME, Kind::Micros),
    ("sigpending", libc::RLIMIT_SIGPENDING, Kind::Count),
    ("stack", libc::RLIMIT_STACK, Kind::Bytes),
];

/// One parsed `--rlimit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rlimit {
    pub name: &'static str,
    pub resource: libc::__rlimit_resource_t,
    pub soft: u64,
    pub hard: u64,
}

fn show(v: u64) -> String {
    if v == libc::RLIM_INFINITY {
        "unlimited".into()
    } else {
        v.to_string()
    }
}

impl Rlimit {
    pub fn parse(spec: &str) -> Result<Self, RlimitError> {
        let (name, vals) = spec
            .split_once('=')
            .ok_or_else(|| RlimitError::Syntax(spec.into()))?;
        let name = name.trim().to_ascii_lowercase();
        let name = name.strip_prefix("rlimit_").unwrap_or(&name);
        let &(name, resource, kind) = NAMES
            .iter()
            .find(|n| n.0 == name)
            .ok_or_else(|| RlimitError::UnknownName(spec.into(), name.into()))?;
        let (soft_s, hard_s) = match vals.split_once(':') {
            Some((s, h)) => (s, Some(h)),
            None => (vals, None),
        };
        let soft = parse_value(spec, soft_s, kind)?;
        let hard = match hard_s {
            Some(h) => parse_value(spec, h, kind)?,
            None => soft,
        };
        if soft > hard {
            return Err(RlimitError::SoftAboveHard(spec.into()));
        }
        Ok(Rlimit {
            name,
            resource,
            soft,
            hard,
        })
    }

    /// Sets the limit on the calling process. Async-signal-safe (one
    /// syscall): usable between fork and exec.
    pub fn apply(&self) -> std::io::Result<()> {
        let r = libc::rlimit {
            rlim_cur: self.soft,
            rlim_max: self.hard,
        };
        // SAFETY: r is a live rlimit read by the kernel for the call.
        if unsafe { libc::setrlimit(self.resource, &r) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    pub fn describe(&self) -> String {
        format!("{}={}:{}", self.name, show(self.soft), show(self.hard))
    }
}

fn parse_value(spec: &str, v: &str, kind: Kind) -> Result<u64, RlimitError> {
    let v = v.trim();
    if v.eq_ignore_ascii_case("unlimited") || v.eq_ignore_ascii_case("infinity") {
        return Ok(libc::RLIM_INFINITY);
    }
    let bad = |why| RlimitError::Value(spec.into(), v.into(), why);
    match kind {
        Kind::Bytes => {
            units::parse_size(v).map_err(|_| bad("a size such as 4096, 64K, 100M or 'unlimited'"))
        }
        Kind::Count | Kind::Micros => v
            .parse::<u64>()
            .map_err(|_| bad("a whole number or 'unlimited'")),
        Kind::Seconds => units::parse_duration(v)
            .map(|d| d.as_secs())
            .map_err(|_| bad("seconds or a duration such as 90s, 5m, or 'unlimited'")),
    }
}

/// Checks, before anything is created, that the limits can be set: a
/// throwaway child tries them and reports the first failure (raising a hard
/// limit needs CAP_SYS_RESOURCE; `nofile` cannot exceed fs.nr_open).
pub fn preflight(limits: &[Rlimit]) -> Result<(), RlimitError> {
    if limits.is_empty() {
        return Ok(());
    }
    let mut fds = [0; 2];
    // SAFETY: fds is a live array of two ints for the kernel to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Ok(()); // the real apply reports it then
    }
    // SAFETY: the child only calls setrlimit, write and _exit (async-signal-safe), whatever
    // threads exist.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // Child: only async-signal-safe calls.
        for (i, l) in limits.iter().enumerate() {
            if l.apply().is_err() {
                let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
                let msg = [i as u8, e as u8];
                // SAFETY: fds[1] is the child's open write end; msg is a live 2-byte buffer.
                unsafe { libc::write(fds[1], msg.as_ptr().cast(), 2) };
                // SAFETY: the throwaway child leaves without running the parent's destructors.
                unsafe { libc::_exit(1) };
            }
        }
        // SAFETY: the throwaway child leaves without running the parent's destructors.
        unsafe { libc::_exit(0) };
    }
    // SAFETY: our copy of the write end, not used after.
    unsafe { libc::close(fds[1]) };
    let mut msg = [0u8; 2];
    // SAFETY: fds[0] is our open read end; msg is a live 2-byte buffer.
    let n = unsafe { libc::read(fds[0], msg.as_mut_ptr().cast(), 2) };
    // SAFETY: our read end, not used after.
    unsafe { libc::close(fds[0]) };
    if pid > 0 {
        let mut st = 0;
        // SAFETY: pid is our own child, reaped once; st is a live int.
        unsafe { libc::waitpid(pid, &mut st, 0) };
    }
    if n == 2 {
        let l = &limits[msg[0] as usize];
        return Err(RlimitError::Apply(
            l.name,
            show(l.soft),
            show(l.hard),
            std::io::Error::from_raw_os_error(i32::from(msg[1])),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        let r = Rlimit::parse("nofile=1024:4096").unwrap();
        assert_eq!(
            (r.resource, r.soft, r.hard),
            (libc::RLIMIT_NOFILE, 1024, 4096)
        );
        let r = Rlimit::parse("fsize=1M").unwrap();
        assert_eq!((r.soft, r.hard), (1 << 20, 1 << 20));
        let r = Rlimit::parse("core=0:unlimited").unwrap();
        assert_eq!((r.soft, r.hard), (0, libc::RLIM_INFINITY));
        let r = Rlimit::parse("cpu=1m").unwrap();
        assert_eq!(r.soft, 60);
        assert!(Rlimit::parse("RLIMIT_AS=1G").is_ok());
    }

    #[test]
    fn rejects() {
        assert!(matches!(
            Rlimit::parse("bogus=1"),
            Err(RlimitError::UnknownName(..))
        ));
        assert!(matches!(
            Rlimit::parse("nofile"),
            Err(RlimitError::Syntax(..))
        ));
        assert!(matches!(
            Rlimit::parse("nofile=x"),
            Err(RlimitError::Value(..))
        ));
        assert!(matches!(
            Rlimit::parse("nofile=10:5"),
            Err(RlimitError::SoftAboveHard(..))
        ));
        assert!(matches!(
            Rlimit::parse("fsize=12Q"),
            Err(RlimitError::Value(..))
        ));
    }

    #[test]
    fn preflight_catches_an_impossible_limit() {
        // nofile above fs.nr_open fails even for root.
        let r = Rlimit::parse("nofile=unlimited").unwrap();
        assert!(matches!(preflight(&[r]), Err(RlimitError::Apply(..))));
        let r = Rlimit::parse("core=0").unwrap();
        preflight(&[r]).unwrap();
    }
}
