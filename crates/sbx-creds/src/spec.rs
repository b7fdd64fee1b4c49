//! The secret specifications of the command line, checked before anything
//! is asked of the server.

use std::collections::BTreeSet;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    #[error("--{flag} '{spec}': expected {want}")]
    Malformed {
        flag: &'static str,
        spec: String,
        want: &'static str,
    },
    #[error(
        "--{flag} '{spec}': '{name}' is not a valid environment variable name (letters, digits, '_', not starting with a digit)"
    )]
    BadEnvName {
        flag: &'static str,
        spec: String,
        name: String,
    },
    #[error(
        "--{flag} '{spec}': '{name}' is reserved: names starting with SBX_ are the sbx tools' own variables (SBX_AUDIT_FD, SBX_TOOL_IDS, SBX_PASS_ENV, ...), which no secret may set"
    )]
    Reserved {
        flag: &'static str,
        spec: String,
        name: String,
    },
    #[error("--{flag} '{spec}': path '{path}' {why}")]
    BadPath {
        flag: &'static str,
        spec: String,
        path: String,
        why: &'static str,
    },
    #[error("environment variable {0} is set by more than one secret")]
    Duplicate(String),
}

/// `ENV=MOUNT/PATH#KEY`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretSpec {
    pub env: String,
    /// MOUNT/PATH as given (the mount is found on the server, else its first
    /// component).
    pub path: String,
    pub key: String,
}

/// `PREFIX=MOUNT/PATH`: every key K of the secret as PREFIX_K.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretAllSpec {
    pub prefix: String,
    pub path: String,
}

/// `ENV=PATH[?K=V&...]#FIELD`: a dynamic secret; a read (GET) without
/// parameters, a write (POST of the parameters as JSON) with them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSpec {
    pub env: String,
    pub path: String,
    pub params: Vec<(String, String)>,
    pub field: String,
}

pub fn valid_env_name(s: &str) -> bool {
    let mut b = s.bytes();
    matches!(b.next(), Some(c) if c == b'_' || c.is_ascii_alphabetic())
        && b.all(|c| c == b'_' || c.is_ascii_alphanumeric())
}

/// Whether `s` is one of the names the sbx tools pass among themselves
/// (SBX_AUDIT_FD, SBX_TOOL_IDS, SBX_PASS_ENV, SBX_SUPERVISOR, ...): a
/// secret that set one would steer the next tools of the chain.
pub fn reserved_env_name(s: &str) -> bool {
    s.starts_with("SBX_")
}

fn check_path(flag: &'static str, spec: &str, path: &str, need_two: bool) -> Result<(), SpecError> {
    let bad = |why| SpecError::BadPath {
        flag,
        spec: spec.to_string(),
        path: path.to_string(),
        why,
    };
    if path.is_empty() {
        return Err(bad("is empty"));
    }
    if path.starts_with('/') || path.ends_with('/') {
        return Err(bad("must not start or end with '/'"));
    }
    let parts: Vec<&str> = path.split('/').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(bad("has an empty component"));
    }
    if parts.iter().any(|p| *p == "." || *p == "..") {
        return Err(bad("has a '.' or '..' component"));
    }
    if path
        .bytes()
        .any(|c| c.is_ascii_control() || c == b' ' || c == b'?' || c == b'#' || c == b'%')
    {
        return Err(bad("has a space, control character, '?', '#' or '%'"));
    }
    if need_two && parts.len() < 2 {
        return Err(bad("must be MOUNT/PATH"));
    }
    Ok(())
}

/// `env`, given with `--flag spec`, as a variable name: valid, and not one
/// of the sbx tools' (for --secret-all, `env` is the prefix of every name).
pub fn check_env_name(flag: &'static str, spec: &str, env: &str) -> Result<(), SpecError> {
    if !valid_env_name(env) {
        return Err(SpecError::BadEnvName {
            flag,
            spec: spec.to_string(),
            name: env.to_string(),
        });
    }
    let all = flag == "secret-all";
    if reserved_env_name(env) || (all && reserved_env_name(&format!("{env}_"))) {
        return Err(SpecError::Reserved {
            flag,
            spec: spec.to_string(),
            name: if all {
                format!("{env}_*")
            } else {
                env.to_string()
            },
        });
    }
    Ok(())
}

fn split_env<'a>(
    flag: &'static str,
    spec: &'a str,
    want: &'static str,
) -> Result<(&'a str, &'a str), SpecError> {
    let (env, rest) = spec.split_once('=').ok_or_else(|| SpecError::Malformed {
        flag,
        spec: spec.to_string(),
        want,
    })?;
    check_env_name(flag, spec, env)?;
    Ok((env, rest))
}

impl std::str::FromStr for SecretSpec {
    type Err = SpecError;
    fn from_str(spec: &str) -> Result<Self, SpecError> {
        const WANT: &str = "ENV=MOUNT/PATH#KEY";
        let (env, rest) = split_env("secret", spec, WANT)?;
        let (path, key) = rest.rsplit_once('#').ok_or_else(|| SpecError::Malformed {
            flag: "secret",
            spec: spec.to_string(),
            want: WANT,
        })?;
        if key.is_empty() {
            return Err(SpecError::Malformed {
                flag: "secret",
                spec: spec.to_string(),
                want: WANT,
            });
        }
        check_path("secret", spec, path, true)?;
        Ok(SecretSpec {
            env: env.into(),
            path: path.into(),
            key: key.into(),
        })
    }
}

impl std::str::FromStr for SecretAllSpec {
    type Err = SpecError;
    fn from_str(spec: &str) -> Result<Self, SpecError> {
        let (prefix, path) = split_env("secret-all", spec, "PREFIX=MOUNT/PATH")?;
        check_path("secret-all", spec, path, true)?;
        Ok(SecretAllSpec {
            prefix: prefix.into(),
            path: path.into(),
        })
    }
}

impl std::str::FromStr for LeaseSpec {
    type Err = SpecError;
    fn from_str(spec: &str) -> Result<Self, SpecError> {
        const WANT: &str = "ENV=PATH[?NAME=VALUE&...]#FIELD";
        let malformed = || SpecError::Malformed {
            flag: "lease",
            spec: spec.to_string(),
            want: WANT,
        };
        let (env, rest) = split_env("lease", spec, WANT)?;
        let (target, field) = rest.rsplit_once('#').ok_or_else(malformed)?;
        if field.is_empty() {
            return Err(malformed());
        }
        let (path, query) = match target.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (target, None),
        };
        check_path("lease", spec, path, true)?;
        let mut params = Vec::new();
        if let Some(q) = query {
            for pair in q.split('&') {
                let (k, v) = pair.split_once('=').ok_or_else(malformed)?;
                if k.is_empty() {
                    return Err(malformed());
                }
                params.push((k.to_string(), v.to_string()));
            }
        }
        Ok(LeaseSpec {
            env: env.into(),
            path: path.into(),
            params,
            field: field.into(),
        })
    }
}

/// The variable name `--secret-all` gives key `key` under `prefix`:
/// PREFIX_KEY, the key upper-cased and every character other than a
/// letter, digit or '_' turned into '_'.
pub fn all_env_name(prefix: &str, key: &str) -> String {
    let k: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("{prefix}_{k}")
}

/// Linux's MAX_ARG_STRLEN (32 pages): the longest argument or
/// `NAME=VALUE` string execve takes, its NUL included. sbx-vm's limit for
/// one environment string is the same.
pub const MAX_ENV_STRING: usize = 32 * 4096;

pub use sbx_core::units::human_bytes as human;

/// A name the server chose (a key of a secret, a variable derived from
/// one), cut for a message: at most 64 characters and the length. The one
/// stderr line escapes control characters; this keeps a huge key from
/// pushing the reason out of it.
pub fn shown(s: &str) -> String {
    const MAX: usize = 64;
    match s.char_indices().nth(MAX) {
        None => s.to_string(),
        Some((end, _)) => format!("{}... ({} bytes)", &s[..end], s.len()),
    }
}

/// Why `NAME=VALUE` cannot go into a command's environment (checked after
/// the fetch, before the command starts, so that execve cannot fail
/// late), or None. Never quotes the value: it is a secret.
pub fn env_problem(name: &str, value: &str) -> Option<String> {
    if !valid_env_name(name) {
        return Some(format!(
            "'{}' is not a valid environment variable name (letters, digits, '_', not starting with a digit)",
            shown(name)
        ));
    }
    if reserved_env_name(name) {
        return Some(format!(
            "'{}' is reserved: names starting with SBX_ are the sbx tools' own variables",
            shown(name)
        ));
    }
    if value.contains('\0') {
        return Some(
            "the value contains a NUL byte (an environment variable cannot hold one)".into(),
        );
    }
    let n = name.len() + 1 + value.len() + 1;
    (n > MAX_ENV_STRING).then(|| {
        format!(
            "NAME=VALUE would be {n} bytes, over the kernel's limit of {MAX_ENV_STRING} bytes ({}) for one environment string",
            human(MAX_ENV_STRING as u64)
        )
    })
}

/// Checks that no variable is set twice among the fixed names.
pub fn check_unique<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<(), SpecError> {
    let mut seen = BTreeSet::new();
    for n in names {
        if !seen.insert(n) {
            return Err(SpecError::Duplicate(n.to_string()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_specs() {
        let s: SecretSpec = "DB_PASS=secret/app/db#password".parse().unwrap();
        assert_eq!(s.env, "DB_PASS");
        assert_eq!(s.path, "secret/app/db");
        assert_eq!(s.key, "password");
        for bad in [
            "nopath",
            "A=secret/x",
            "A=secret/x#",
            "A=secret#k",
            "A=/secret/x#k",
            "A=secret//x#k",
            "A=secret/../x#k",
            "=secret/x#k",
        ] {
            assert!(bad.parse::<SecretSpec>().is_err(), "{bad}");
        }
        assert!(matches!(
            "1A=secret/x#k".parse::<SecretSpec>(),
            Err(SpecError::BadEnvName { .. })
        ));
        assert!(matches!(
            "A-B=secret/x#k".parse::<SecretSpec>(),
            Err(SpecError::BadEnvName { .. })
        ));
    }

    #[test]
    fn lease_specs() {
        let l: LeaseSpec = "CERT=pki/issue/web?common_name=a.example&ttl=5m#certificate"
            .parse()
            .unwrap();
        assert_eq!(l.path, "pki/issue/web");
        assert_eq!(
            l.params,
            vec![
                ("common_name".into(), "a.example".into()),
                ("ttl".into(), "5m".into())
            ]
        );
        assert_eq!(l.field, "certificate");
        let l: LeaseSpec = "P=database/creds/ro#password".parse().unwrap();
        assert!(l.params.is_empty());
        assert!(
            "P=database/creds/ro?x#password"
                .parse::<LeaseSpec>()
                .is_err()
        );
        assert!("P=database/creds/ro".parse::<LeaseSpec>().is_err());
    }

    #[test]
    fn names() {
        assert!(valid_env_name("_A1"));
        assert!(!valid_env_name(""));
        assert!(!valid_env_name("A B"));
        assert_eq!(all_env_name("APP", "db-pass.x"), "APP_DB_PASS_X");
        assert!(check_unique(["A", "B", "A"]).is_err());
        for (flag, spec) in [
            ("--secret", "SBX_AUDIT_FD=secret/app#k"),
            ("--secret-all", "SBX=secret/app"),
            ("--secret-all", "SBX_X=secret/app"),
            (
                "--lease",
                "SBX_PASS_ENV=pki/issue/web?common_name=a#certificate",
            ),
        ] {
            let e = match flag {
                "--secret" => spec.parse::<SecretSpec>().map(drop),
                "--secret-all" => spec.parse::<SecretAllSpec>().map(drop),
                _ => spec.parse::<LeaseSpec>().map(drop),
            };
            assert!(
                matches!(e, Err(SpecError::Reserved { .. })),
                "{flag} {spec}: {e:?}"
            );
        }
        // Only the prefix the tools use: SBXA, Sbx_ and SBX itself are names.
        assert!("SBXA=secret/app#k".parse::<SecretSpec>().is_ok());
        assert!("SBX=secret/app#k".parse::<SecretSpec>().is_ok());
        assert!("SBXA=secret/app".parse::<SecretAllSpec>().is_ok());
        assert!(
            env_problem("SBX_PASS_ENV", "A")
                .unwrap()
                .contains("reserved")
        );
    }

    #[test]
    fn environment_strings() {
        assert!(env_problem("K", "plain").is_none());
        assert!(env_problem("K", "").is_none());
        let nul = env_problem("K", "s3cr3t\0tail").unwrap();
        assert!(nul.contains("NUL byte") && !nul.contains("s3cr3t"), "{nul}");
        for bad in ["", "A=B", "A\0B", "1A", "A B", "É"] {
            assert!(
                env_problem(bad, "v").unwrap().contains("not a valid"),
                "{bad:?}"
            );
        }
        // K=VALUE and its NUL: exactly MAX_ENV_STRING passes.
        let edge = "x".repeat(MAX_ENV_STRING - 3);
        assert!(env_problem("K", &edge).is_none());
        let over = env_problem("K", &format!("{edge}x")).unwrap();
        assert!(over.contains("128 KiB") && !over.contains("xxxx"), "{over}");
        assert_eq!(shown("short"), "short");
        let long = shown(&"k".repeat(1000));
        assert!(long.len() < 100 && long.ends_with("(1000 bytes)"), "{long}");
        assert_eq!(human(128 << 10), "128 KiB");
        assert_eq!(human(3 << 19), "1.5 MiB");
    }
}
