//! The run's settings, validated before the engine is contacted: a bad
//! value is one line and exit 125 with nothing created.

use std::ffi::OsString;
use std::time::Duration;

use crate::Cli;
use crate::mounts::{self, MountError, Plan};

pub const DEFAULT_MEMORY: u64 = 512 * 1024 * 1024;
pub const DEFAULT_PIDS: u64 = 512;
pub const DEFAULT_TMP: u64 = 64 * 1024 * 1024;
pub const DEFAULT_USER: &str = "65534:65534";
pub const BASE_PATH: &str = "/sbx/bin:/bin:/usr/local/bin:/usr/bin:/usr/sbin:/sbin";

pub use sbx_spec::container::{Net, Seccomp};

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("--{flag} {value}: {why}")]
    Bad {
        flag: &'static str,
        value: String,
        why: String,
    },
    #[error("{0}")]
    Mount(#[from] MountError),
    #[error("CMD: arguments must be valid UTF-8 (the Engine API carries JSON strings)")]
    NotUtf8,
    #[error("--secret-env {0}: not set in sbx-container's environment")]
    SecretUnset(String),
}

#[derive(Debug)]
pub struct RunSpec {
    pub image: String,
    pub cmd: Vec<String>,
    pub env: Vec<String>,
    /// (NAME, value): exec-time environment only.
    pub secret_env: Vec<(String, String)>,
    pub memory: u64,
    pub cpus: f64,
    pub pids: u64,
    pub tmp_size: u64,
    pub net: Net,
    pub user: String,
    pub workdir: String,
    pub timeout: Option<Duration>,
    pub kill_grace: Duration,
    pub init: bool,
    pub ulimits: Vec<(String, u64, u64)>,
    pub mounts: Plan,
    /// sbx-seccomp's profile in the engine's format; None: the engine's default.
    pub seccomp_profile: Option<String>,
}

fn bad(flag: &'static str, value: &str, why: impl Into<String>) -> SpecError {
    SpecError::Bad {
        flag,
        value: value.to_string(),
        why: why.into(),
    }
}

fn size(flag: &'static str, v: &str, min: u64) -> Result<u64, SpecError> {
    let n = sbx_core::units::parse_size(v).map_err(|e| bad(flag, v, e.to_string()))?;
    if n < min {
        return Err(bad(flag, v, format!("must be at least {min} bytes")));
    }
    Ok(n)
}

fn env_name_ok(n: &str) -> bool {
    !n.is_empty()
        && !n.starts_with(|c: char| c.is_ascii_digit())
        && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

pub const ULIMITS: &[&str] = &[
    "core",
    "cpu",
    "data",
    "fsize",
    "locks",
    "memlock",
    "msgqueue",
    "nice",
    "nofile",
    "nproc",
    "rss",
    "rtprio",
    "rttime",
    "sigpending",
    "stack",
];

pub fn from_cli(cli: &Cli, cmd: &[OsString]) -> Result<RunSpec, SpecError> {
    let memory = match &cli.spec.memory {
        Some(m) => size("memory", m, 6 * 1024 * 1024)?,
        None => DEFAULT_MEMORY,
    };
    let cpus = match &cli.spec.cpus {
        Some(c) => {
            let v: f64 = c
                .parse()
                .map_err(|_| bad("cpus", c, "expected a number of CPUs, e.g. 1 or 0.5"))?;
            if !(v.is_finite() && (0.01..=1024.0).contains(&v)) {
                return Err(bad("cpus", c, "must be between 0.01 and 1024"));
            }
            v
        }
        None => 1.0,
    };
    let pids = match &cli.spec.pids {
        Some(p) => {
            let v: u64 = p
                .parse()
                .map_err(|_| bad("pids", p, "expected a whole number"))?;
            if v < 1 {
                return Err(bad("pids", p, "must be at least 1"));
            }
            v
        }
        None => DEFAULT_PIDS,
    };
    let tmp_size = match &cli.spec.tmp_size {
        Some(t) => size("tmp-size", t, 4096)?,
        None => DEFAULT_TMP,
    };
    let net = cli.spec.net.unwrap_or(Net::None);
    let timeout = match &cli.spec.timeout {
        Some(t) => {
            Some(sbx_core::units::parse_duration(t).map_err(|e| bad("timeout", t, e.to_string()))?)
        }
        None => None,
    };
    let kill_grace = match &cli.spec.kill_grace {
        Some(t) => {
            sbx_core::units::parse_duration(t).map_err(|e| bad("kill-grace", t, e.to_string()))?
        }
        None => Duration::from_secs(5),
    };
    let user = cli
        .spec
        .user
        .clone()
        .unwrap_or_else(|| DEFAULT_USER.to_string());
    let uid = user.split(':').next().unwrap_or("");
    if uid.is_empty()
        || !user
            .split(':')
            .all(|p| p.chars().all(|c| c.is_ascii_digit()) && !p.is_empty())
        || user.split(':').count() > 2
    {
        return Err(bad("user", &user, "expected UID or UID:GID (numbers)"));
    }
    if uid == "0" {
        return Err(bad("user", &user, "the sandbox never runs as root"));
    }
    let workdir = match &cli.spec.chdir {
        Some(d) => d
            .to_str()
            .ok_or_else(|| {
                bad(
                    "chdir",
                    &d.to_string_lossy(),
                    "not UTF-8 (the Engine API carries JSON strings)",
                )
            })?
            .to_string(),
        None => "/".to_string(),
    };
    if !workdir.starts_with('/') {
        return Err(bad("chdir", &workdir, "must be absolute"));
    }
    let mut env = vec![
        format!("PATH={BASE_PATH}"),
        "HOME=/tmp".to_string(),
        format!("SBX_ID={}", sbx_core::id::get().unwrap_or("-")),
    ];
    for e in &cli.spec.setenv {
        match e.split_once('=') {
            Some((k, _)) if env_name_ok(k) => env.push(e.clone()),
            None if env_name_ok(e) => {
                if let Ok(v) = std::env::var(e) {
                    env.push(format!("{e}={v}"));
                }
            }
            _ => return Err(bad("setenv", e, "expected NAME=VALUE or NAME")),
        }
    }
    let mut secret_env = Vec::new();
    for n in &cli.spec.secret_env {
        if !env_name_ok(n) {
            return Err(bad("secret-env", n, "expected a variable NAME"));
        }
        let v = std::env::var(n).map_err(|_| SpecError::SecretUnset(n.clone()))?;
        secret_env.push((n.clone(), v));
    }
    let mut ulimits = Vec::new();
    for u in &cli.spec.rlimit {
        let (n, v) = u
            .split_once('=')
            .ok_or_else(|| bad("rlimit", u, "expected NAME=SOFT[:HARD]"))?;
        if !ULIMITS.contains(&n) {
            return Err(bad(
                "rlimit",
                u,
                format!("unknown limit '{n}' (one of {})", ULIMITS.join(", ")),
            ));
        }
        let (s, h) = v.split_once(':').unwrap_or((v, v));
        let p = |x: &str| {
            x.parse::<u64>()
                .map_err(|_| bad("rlimit", u, "limits are whole numbers"))
        };
        let (s, h) = (p(s)?, p(h)?);
        if s > h {
            return Err(bad("rlimit", u, "soft limit above hard limit"));
        }
        ulimits.push((n.to_string(), s, h));
    }
    let mut cmd_s = Vec::new();
    for a in cmd {
        cmd_s.push(a.to_str().ok_or(SpecError::NotUtf8)?.to_string());
    }
    let seccomp_profile = match cli.spec.seccomp {
        None | Some(Seccomp::Engine) => None,
        Some(Seccomp::Sbx) => Some(
            crate::seccomp::sbx_default_profile()
                .map_err(|e| bad("seccomp", "sbx", e.to_string()))?,
        ),
    };
    let mounts = mounts::plan(&cli.spec.ro, &cli.spec.rw, !cli.spec.no_default_deny)?;
    Ok(RunSpec {
        image: cli
            .spec
            .image
            .clone()
            .unwrap_or_else(|| crate::image::LATEST.to_string()),
        cmd: cmd_s,
        env,
        secret_env,
        memory,
        cpus,
        pids,
        tmp_size,
        net,
        user,
        workdir,
        timeout,
        kill_grace,
        init: cli.spec.init,
        ulimits,
        mounts,
        seccomp_profile,
    })
}

impl RunSpec {
    /// no-new-privileges always; the seccomp profile is the engine's
    /// default (never turned off) unless `seccomp` names the custom one
    /// (inline JSON or a path, as the engine takes it).
    pub fn security_opt(&self, seccomp: Option<&str>) -> Vec<String> {
        let mut v = vec!["no-new-privileges".to_string()];
        if let Some(s) = seccomp {
            v.push(format!("seccomp={s}"));
        }
        v
    }

    pub fn seccomp_name(&self) -> &'static str {
        if self.seccomp_profile.is_some() {
            "sbx-seccomp-default"
        } else {
            "engine-default"
        }
    }
}
