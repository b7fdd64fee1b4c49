//! Which of the caller's environment variables reach the sandboxed command.
//!
//! The one place this is decided: sbx-fs (the layer that builds the
//! sandbox's world) and sbx-gvisor call [`filter`]; sbx-vm and
//! sbx-container build their command's environment from scratch already.
//!
//! - By default only an allowlist passes ([`DEFAULT_NAMES`], `LC_*`).
//! - `--pass-env NAME` passes one more variable, `--pass-env 'PREFIX*'`
//!   every variable whose name starts with PREFIX, except those that look
//!   like secrets ([`looks_secret`]): a secret passes only when named
//!   exactly (or with `--keep-env`, which keeps the whole environment).
//! - `SBX_PASS_ENV` (comma-separated, same syntax) is read as more
//!   `--pass-env` values and never reaches the command: sbx-creds adds the
//!   names of the secrets it injects there, so they reach the command
//!   through sbx-fs further down the chain.
//! - A variable that looks like a secret and is dropped is named (never
//!   its value) in one warning line on stderr and in an
//!   `env_secret_dropped` warn event.
//! - A variable whose *value* holds a credential ([`secret_value_kind`]:
//!   a URL with a password in it, a GitHub/GitLab/Slack/OpenAI/Anthropic
//!   token, an AWS access key id, a JWT, a PEM private key) passes only
//!   when named exactly (or with `--keep-env`), whatever its name: passed
//!   by a prefix pattern or the default allowlist it is dropped, named
//!   (never the value) on stderr and in an `env_secret_value_dropped`
//!   alert.

use std::ffi::OsString;

use serde_json::json;

use crate::Severity;

/// Names (`--pass-env` syntax, comma-separated) an earlier layer asks the
/// sandbox-building layer to pass: sbx-creds adds its secrets' names here.
pub const ENV_PASS: &str = "SBX_PASS_ENV";

/// What passes by default. TMPDIR is not here: the layer that makes the
/// sandbox's fresh /tmp sets it (the caller's may not exist inside).
pub const DEFAULT_NAMES: &[&str] = &[
    "PATH",
    "HOME",
    "TERM",
    "LANG",
    "LANGUAGE",
    "TZ",
    "USER",
    "LOGNAME",
    "SHELL",
    "COLORTERM",
    "NO_COLOR",
    "SBX_ID",
    "SBX_LOG",
    // Where the trusted CA certificates are (paths, no secret): TLS inside
    // must keep working where the host uses its own CA.
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "CURL_CA_BUNDLE",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
    "AWS_CA_BUNDLE",
    "PIP_CERT",
];

/// Name prefixes that pass by default (the locale categories).
pub const DEFAULT_PREFIXES: &[&str] = &["LC_"];

/// Words of a variable name (split on `_`) that make it look like a secret.
const SECRET_WORDS: &[&str] = &[
    "TOKEN",
    "TOKENS",
    "SECRET",
    "SECRETS",
    "PASSWORD",
    "PASSWD",
    "PASS",
    "PASSPHRASE",
    "KEY",
    "KEYS",
    "APIKEY",
    "CREDENTIAL",
    "CREDENTIALS",
    "CREDS",
    "AUTH",
    "COOKIE",
    "DSN",
    "PAT",
];

/// Substrings (of the upper-cased name) that make it look like a secret.
const SECRET_PARTS: &[&str] = &[
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "APIKEY",
    "API_KEY",
    "PRIVATE_KEY",
    "ACCESS_KEY",
    "CREDENTIAL",
    "AUTHORIZATION",
    "DATABASE_URL",
    "CONNECTION_STRING",
];

/// Names that match the patterns but hold no secret (socket and file
/// paths, region and profile names).
const NOT_SECRETS: &[&str] = &[
    "SSH_AUTH_SOCK",
    "GPG_AGENT_INFO",
    "AWS_CA_BUNDLE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_PROFILE",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
];

/// Prefixes of whole families of credentials.
const SECRET_PREFIXES: &[&str] = &["AWS_", "AZURE_", "ARM_CLIENT", "OP_SESSION_"];

/// One `--pass-env` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pass {
    /// Exactly this name (a secret passes only this way).
    Name(String),
    /// Every name starting with this (`PREFIX*`; `*` alone is every name),
    /// secrets excepted.
    Prefix(String),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{flag} '{value}': {why}")]
pub struct PassError {
    pub flag: String,
    pub value: String,
    pub why: &'static str,
}

/// Parses one value: `NAME` or `PREFIX*` (letters, digits, `_`; not
/// starting with a digit).
pub fn parse_pass(flag: &str, raw: &str) -> Result<Pass, PassError> {
    let bad = |why| PassError {
        flag: flag.to_string(),
        value: raw.to_string(),
        why,
    };
    let (stem, prefix) = match raw.strip_suffix('*') {
        Some(s) => (s, true),
        None => (raw, false),
    };
    if !prefix && stem.is_empty() {
        return Err(bad("empty name"));
    }
    if !stem.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err(bad(
            "a variable name is letters, digits and '_', optionally ending in '*' (a prefix)",
        ));
    }
    if stem.as_bytes().first().is_some_and(u8::is_ascii_digit) {
        return Err(bad("a variable name cannot start with a digit"));
    }
    Ok(if prefix {
        Pass::Prefix(stem.to_string())
    } else {
        Pass::Name(stem.to_string())
    })
}

/// Parses a comma-separated list (SBX_PASS_ENV); empty items are ignored.
pub fn parse_list(flag: &str, raw: &str) -> Result<Vec<Pass>, PassError> {
    raw.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| parse_pass(flag, s))
        .collect()
}

/// Whether a variable's name looks like it holds a secret.
pub fn looks_secret(name: &str) -> bool {
    let up = name.to_ascii_uppercase();
    // sbx's own variables carry ids, levels and fd numbers; agent socket
    // paths hold no secret (and no host socket is reachable inside).
    if up.starts_with("SBX_") || NOT_SECRETS.contains(&up.as_str()) {
        return false;
    }
    if SECRET_PREFIXES.iter().any(|p| up.starts_with(p))
        || SECRET_PARTS.iter().any(|p| up.contains(p))
    {
        return true;
    }
    let words: Vec<&str> = up.split('_').filter(|w| !w.is_empty()).collect();
    if words.iter().any(|w| SECRET_WORDS.contains(w)) {
        return true;
    }
    // MYSQL_PWD, PGPASSFILE-like names; PWD and OLDPWD alone are the
    // working directory.
    words.len() > 1 && words.contains(&"PWD")
}

/// Token prefixes of well-known credentials, with the shortest length a
/// whole token has (so a word that merely starts the same is not one).
const TOKEN_PREFIXES: &[(&str, usize, &str)] = &[
    ("github_pat_", 40, "github_token"),
    ("ghp_", 36, "github_token"),
    ("gho_", 36, "github_token"),
    ("ghu_", 36, "github_token"),
    ("ghs_", 36, "github_token"),
    ("ghr_", 36, "github_token"),
    ("glpat-", 20, "gitlab_token"),
    ("xoxb-", 20, "slack_token"),
    ("xoxp-", 20, "slack_token"),
    ("xoxa-", 20, "slack_token"),
    ("xoxr-", 20, "slack_token"),
    ("xoxs-", 20, "slack_token"),
    ("sk-ant-", 24, "anthropic_key"),
    ("sk-", 24, "api_key"),
    ("AKIA", 20, "aws_access_key_id"),
    ("ASIA", 20, "aws_access_key_id"),
    ("npm_", 36, "npm_token"),
    ("pypi-", 40, "pypi_token"),
    ("hvs.", 24, "vault_token"),
];

fn token_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.'
}

/// What kind of credential a value holds, if it holds one (the value is
/// never shown; this names the kind only).
pub fn secret_value_kind(v: &[u8]) -> Option<&'static str> {
    let text = String::from_utf8_lossy(v);
    if text.contains("-----BEGIN") && text.contains("PRIVATE KEY") {
        return Some("pem_private_key");
    }
    // Every token of the value (split on what cannot be in a token).
    for tok in text
        .split(|c: char| !(c.is_ascii() && token_char(c as u8)) && c != ':' && c != '/' && c != '@')
        .filter(|t| !t.is_empty())
    {
        if let Some(k) = url_userinfo(tok) {
            return Some(k);
        }
        for part in tok.split([':', '/', '@']) {
            for (p, min, kind) in TOKEN_PREFIXES {
                if part.starts_with(p)
                    && part.len() >= *min
                    && part.bytes().all(token_char)
                    // AKIA... ids are upper-case letters and digits.
                    && (!p.starts_with('A') || part.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit()))
                {
                    return Some(kind);
                }
            }
            if looks_jwt(part) {
                return Some("jwt");
            }
        }
    }
    None
}

/// `scheme://user:password@host...` (or a long token as the user name,
/// as GitHub and GitLab take them).
fn url_userinfo(tok: &str) -> Option<&'static str> {
    let (_, rest) = tok.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let (userinfo, _) = authority.rsplit_once('@')?;
    match userinfo.split_once(':') {
        Some((_, pw)) if !pw.is_empty() => Some("url_with_password"),
        _ if userinfo.len() >= 20 => Some("url_with_token"),
        _ => None,
    }
}

/// Three base64url segments, the first a JSON header (`eyJ`).
fn looks_jwt(t: &str) -> bool {
    let segs: Vec<&str> = t.split('.').collect();
    segs.len() == 3
        && segs[0].starts_with("eyJ")
        && segs[0].len() >= 10
        && segs[1].len() >= 10
        && segs.iter().all(|s| {
            s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

fn default_allowed(name: &str) -> bool {
    DEFAULT_NAMES.contains(&name) || DEFAULT_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The policy of one run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// `--keep-env`: the whole environment passes (secrets too).
    pub keep_all: bool,
    /// `--pass-env` values and SBX_PASS_ENV's.
    pub pass: Vec<Pass>,
}

impl Policy {
    /// Adds the names of SBX_PASS_ENV as it is in this process's
    /// environment (an error names the variable and the bad item).
    pub fn add_from_env(&mut self) -> Result<(), PassError> {
        if let Some(v) = std::env::var_os(ENV_PASS) {
            let s = v.to_str().ok_or_else(|| PassError {
                flag: ENV_PASS.to_string(),
                value: v.to_string_lossy().into_owned(),
                why: "not UTF-8",
            })?;
            self.pass.extend(parse_list(ENV_PASS, s)?);
        }
        Ok(())
    }

    fn named(&self, name: &str) -> bool {
        self.pass
            .iter()
            .any(|p| matches!(p, Pass::Name(n) if n == name))
    }

    fn prefixed(&self, name: &str) -> bool {
        self.pass
            .iter()
            .any(|p| matches!(p, Pass::Prefix(s) if name.starts_with(s.as_str())))
    }
}

/// What [`filter`] did.
#[derive(Debug, Default)]
pub struct Filtered {
    /// The environment the command gets.
    pub env: Vec<(OsString, OsString)>,
    /// Names dropped that do not look like secrets.
    pub dropped: Vec<String>,
    /// Names dropped that look like secrets (warned about).
    pub secrets_dropped: Vec<String>,
    /// Names that look like secrets and pass (named exactly, --keep-env).
    pub secrets_passed: Vec<String>,
    /// Names whose value holds a credential, dropped (name, kind of
    /// credential): they matched a prefix pattern or the default list only.
    pub secret_values_dropped: Vec<(String, &'static str)>,
}

/// Applies the policy to an environment. SBX_PASS_ENV itself never passes.
pub fn filter(env: Vec<(OsString, OsString)>, p: &Policy) -> Filtered {
    let mut out = Filtered::default();
    for (k, v) in env {
        let Some(name) = k.to_str().map(str::to_string) else {
            // A name that is not UTF-8 matches nothing: only --keep-env keeps it.
            if p.keep_all {
                out.env.push((k, v));
            } else {
                out.dropped.push(k.to_string_lossy().into_owned());
            }
            continue;
        };
        if name == ENV_PASS {
            continue;
        }
        let secret = looks_secret(&name);
        let exact = p.keep_all || p.named(&name);
        let pass = if exact {
            true
        } else if secret {
            false
        } else {
            default_allowed(&name) || p.prefixed(&name)
        };
        // A credential in the value of a variable passed by a pattern.
        if pass
            && !exact
            && let Some(kind) = secret_value_kind(v.as_encoded_bytes())
        {
            out.secret_values_dropped.push((name, kind));
            continue;
        }
        match (pass, secret) {
            (true, true) => out.secrets_passed.push(name),
            (false, true) => out.secrets_dropped.push(name),
            (false, false) => out.dropped.push(name),
            (true, false) => {}
        }
        if pass {
            out.env.push((k, v));
        }
    }
    for l in [
        &mut out.dropped,
        &mut out.secrets_dropped,
        &mut out.secrets_passed,
    ] {
        l.sort();
    }
    out.secret_values_dropped.sort();
    out
}

/// Variable names for a stderr line, each escaped (a name may hold any
/// byte but `=` and NUL).
fn shown<'a>(names: impl Iterator<Item = &'a str>) -> String {
    names
        .map(|n| crate::escape::terminal(n).into_owned())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Reports a filtering: one warning line on stderr naming the secrets
/// dropped (never a value) and an `env_secret_dropped` warn event; an
/// `env` info event with the names passed and dropped.
pub fn report(tool: &str, f: &Filtered) {
    let log = crate::audit::get().filter(|a| a.raw_fd().is_some());
    if !f.secrets_dropped.is_empty() {
        crate::cli::stderr_line(&format!(
            "{tool}: warning: not passed into the sandbox (they look like secrets): {}; --pass-env NAME passes one",
            shown(f.secrets_dropped.iter().map(String::as_str))
        ));
        if let Some(a) = log {
            a.record(
                "env_secret_dropped",
                Severity::Warn,
                json!({ "names": f.secrets_dropped }),
            );
        }
    }
    if !f.secret_values_dropped.is_empty() {
        let names: Vec<&str> = f
            .secret_values_dropped
            .iter()
            .map(|(n, _)| n.as_str())
            .collect();
        crate::cli::stderr_line(&format!(
            "{tool}: warning: not passed into the sandbox (their values hold credentials): {}; --pass-env NAME (exact) passes one",
            shown(names.iter().copied())
        ));
        let kinds: Vec<&str> = f.secret_values_dropped.iter().map(|(_, k)| *k).collect();
        // An alert: an earlier layer's variable was about to carry a
        // credential into the sandbox under an innocent name.
        if let Some(a) = log {
            a.record(
                "env_secret_value_dropped",
                Severity::Alert,
                json!({ "names": names, "kinds": kinds, "name": names.join(",") }),
            );
        }
    }
    if let Some(a) = log {
        let passed: Vec<String> = f
            .env
            .iter()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        a.record(
            "env",
            Severity::Info,
            json!({
                "passed": passed,
                "dropped": f.dropped,
                "secrets_passed": f.secrets_passed,
            }),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(names: &[&str]) -> Vec<(OsString, OsString)> {
        names.iter().map(|n| (n.into(), "v".into())).collect()
    }

    fn names(e: &[(OsString, OsString)]) -> Vec<String> {
        e.iter()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn secrets_are_recognised() {
        for s in [
            "AWS_SECRET_ACCESS_KEY",
            "AWS_ACCESS_KEY_ID",
            "AWS_SESSION_TOKEN",
            "AWS_SECURITY_TOKEN",
            "GITHUB_TOKEN",
            "GH_TOKEN",
            "ANTHROPIC_API_KEY",
            "OPENAI_API_KEY",
            "VAULT_TOKEN",
            "NPM_TOKEN",
            "DB_PASSWORD",
            "PGPASSWORD",
            "MYSQL_PWD",
            "STRIPE_SECRET",
            "CLIENT_SECRET_VALUE",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "AZURE_CLIENT_SECRET",
            "DATABASE_URL",
            "SENTRY_DSN",
            "HTTP_AUTHORIZATION",
            "DOCKER_AUTH_CONFIG",
            "SSH_PRIVATE_KEY",
            "api_key",
            "TOKEN",
        ] {
            assert!(looks_secret(s), "{s}");
        }
        for s in [
            "PATH",
            "HOME",
            "PWD",
            "OLDPWD",
            "TERM",
            "LANG",
            "LC_ALL",
            "GIT_AUTHOR_NAME",
            "KEYBOARD",
            "EDITOR",
            "CARGO_HOME",
            "SBX_ID",
            "SBX_AUDIT_FD",
            "XDG_SESSION_ID",
            "PASSENGER",
            "SSH_AUTH_SOCK",
            "AWS_CA_BUNDLE",
            "AWS_REGION",
        ] {
            assert!(!looks_secret(s), "{s}");
        }
        for n in DEFAULT_NAMES {
            assert!(!looks_secret(n), "a default name looks secret: {n}");
        }
    }

    #[test]
    fn default_is_the_allowlist() {
        let f = filter(
            env(&[
                "PATH",
                "HOME",
                "LC_ALL",
                "EDITOR",
                "GITHUB_TOKEN",
                "AWS_SECRET_ACCESS_KEY",
                "SBX_PASS_ENV",
                "TMPDIR",
            ]),
            &Policy::default(),
        );
        assert_eq!(names(&f.env), ["PATH", "HOME", "LC_ALL"]);
        assert_eq!(f.dropped, ["EDITOR", "TMPDIR"]);
        assert_eq!(f.secrets_dropped, ["AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN"]);
        assert!(f.secrets_passed.is_empty());
    }

    #[test]
    fn pass_names_prefixes_and_keep_all() {
        let p = Policy {
            keep_all: false,
            pass: vec![
                parse_pass("--pass-env", "EDITOR").unwrap(),
                parse_pass("--pass-env", "MY_*").unwrap(),
                parse_pass("--pass-env", "DB_TOKEN").unwrap(),
            ],
        };
        let f = filter(
            env(&["EDITOR", "MY_A", "MY_TOKEN", "DB_TOKEN", "OTHER"]),
            &p,
        );
        assert_eq!(names(&f.env), ["EDITOR", "MY_A", "DB_TOKEN"]);
        assert_eq!(
            f.secrets_dropped,
            ["MY_TOKEN"],
            "a prefix never passes a secret"
        );
        assert_eq!(f.secrets_passed, ["DB_TOKEN"]);
        let star = Policy {
            keep_all: false,
            pass: vec![parse_pass("--pass-env", "*").unwrap()],
        };
        let f = filter(env(&["A", "B_KEY"]), &star);
        assert_eq!(names(&f.env), ["A"]);
        let all = Policy {
            keep_all: true,
            pass: vec![],
        };
        let f = filter(env(&["A", "B_KEY", "SBX_PASS_ENV"]), &all);
        assert_eq!(names(&f.env), ["A", "B_KEY"]);
        assert_eq!(f.secrets_passed, ["B_KEY"]);
    }

    #[test]
    fn credential_values_are_recognised() {
        for (v, kind) in [
            (
                "https://user:tok3n@git.example.com/x.git",
                "url_with_password",
            ),
            (
                "https://oauth2:glpat-abcdefghijklmnopqrst@gitlab.com",
                "url_with_password",
            ),
            (
                "https://x-access-token-abcdefghij1234@github.com/o/r",
                "url_with_token",
            ),
            ("ghp_0123456789abcdefghijABCDEFGHIJ012345", "github_token"),
            (
                "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
                "github_token",
            ),
            ("glpat-AbCdEfGhIjKlMnOpQrSt", "gitlab_token"),
            ("xoxb-1234567890-abcdefghij", "slack_token"),
            ("xoxp-1234567890-abcdefghij", "slack_token"),
            ("sk-proj-abcdefghijklmnopqrstuvwx", "api_key"),
            ("sk-ant-api03-abcdefghijklmnopqrstuvwxyz", "anthropic_key"),
            ("AKIAIOSFODNN7EXAMPLE", "aws_access_key_id"),
            (
                "--token=ghp_0123456789abcdefghijABCDEFGHIJ012345 -v",
                "github_token",
            ),
            (
                "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
                "jwt",
            ),
            (
                "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n",
                "pem_private_key",
            ),
        ] {
            assert_eq!(secret_value_kind(v.as_bytes()), Some(kind), "{v}");
        }
        for v in [
            "/usr/local/bin:/usr/bin:/bin",
            "https://example.com/path",
            "ssh://git@github.com/o/r.git",
            "git@github.com:o/r.git",
            "xterm-256color",
            "en_US.UTF-8",
            "sk-SK",
            "AKIA",
            "ghp_short",
            "a.b.c",
            "-----BEGIN CERTIFICATE-----",
            "/home/u/.config",
        ] {
            assert_eq!(secret_value_kind(v.as_bytes()), None, "{v}");
        }
    }

    /// A value that holds a credential passes only by its exact name.
    #[test]
    fn credential_values_pass_only_by_exact_name() {
        let tok = "ghp_0123456789abcdefghijABCDEFGHIJ012345";
        let env: Vec<(OsString, OsString)> = vec![
            ("MY_URL".into(), "https://u:p4ss@h.example/".into()),
            ("MY_OK".into(), "plain".into()),
            ("LC_EVIL".into(), tok.into()),
            ("EXACT_URL".into(), "https://u:p4ss@h.example/".into()),
        ];
        let p = Policy {
            keep_all: false,
            pass: vec![
                parse_pass("--pass-env", "MY_*").unwrap(),
                parse_pass("--pass-env", "EXACT_URL").unwrap(),
            ],
        };
        let f = filter(env, &p);
        assert_eq!(names(&f.env), ["MY_OK", "EXACT_URL"]);
        assert_eq!(
            f.secret_values_dropped,
            [
                ("LC_EVIL".to_string(), "github_token"),
                ("MY_URL".to_string(), "url_with_password")
            ]
        );
    }

    #[test]
    fn bad_values_are_named() {
        for bad in ["", "A-B", "A=B", "1A", "A*B", "**"] {
            let e = parse_pass("--pass-env", bad).unwrap_err();
            assert!(e.to_string().starts_with("--pass-env '"), "{e}");
        }
        assert_eq!(
            parse_list("SBX_PASS_ENV", "A, B_*,,").unwrap(),
            [Pass::Name("A".into()), Pass::Prefix("B_".into())]
        );
        assert!(parse_list("SBX_PASS_ENV", "A,B C").is_err());
    }

    /// The warnings return with stderr gone (a pipe whose reader left:
    /// EPIPE; a full device: ENOSPC), where `eprintln!` panicked and ended
    /// sbx-fs, sbx-gvisor and sbx-wasm with 101 before their command ran.
    /// In a forked child, so that only its fd 2 is replaced.
    #[test]
    fn report_survives_a_gone_stderr() {
        use std::os::fd::{AsRawFd, OwnedFd};
        let f = Filtered {
            secrets_dropped: vec!["GITHUB_TOKEN".into()],
            secret_values_dropped: vec![("LC_EVIL".into(), "github_token")],
            ..Default::default()
        };
        let (r, pipe) = crate::fds::pipe().unwrap();
        drop(r);
        let full: OwnedFd = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap()
            .into();
        for gone in [pipe, full] {
            // SAFETY: nextest runs this test alone in its process; the child only replaces its
            // fd 2, reports and _exits.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // SAFETY: dup2 of an fd we own onto 2, in the child only.
                unsafe { libc::dup2(gone.as_raw_fd(), 2) };
                let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    report("sbx-test", &f)
                }))
                .is_ok();
                // SAFETY: the forked child leaves without running the test harness's destructors.
                unsafe { libc::_exit(if ok { 0 } else { 1 }) };
            }
            let mut st = 0;
            // SAFETY: pid is our own child, reaped once; st is a live int.
            assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
            assert!(
                libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
                "status {st}"
            );
        }
    }
}
