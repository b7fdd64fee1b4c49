//! `--git-identity`: the invoking user's git `user.name` and `user.email`
//! offered to the sandbox, and nothing else of their git configuration.
//!
//! The host's `~/.gitconfig` is not visible inside (the sandbox's `$HOME`
//! is a fresh tmpfs), so `git commit` would fail with "unable to
//! auto-detect email address", and `git config user.email` cannot help:
//! `.git/config` is an invariant. The two values are read on the host with
//! git itself (`git config --global --includes -z --get-regexp`, run from `/` with an
//! environment of HOME and PATH only: no repository, no system file), as
//! the invoking user (root run through sudo reads `SUDO_USER`'s home), then
//! checked (one line of printable text, at most [`MAX_LEN`] bytes, no `<`
//! or `>`) and written as the only content of `~/.gitconfig` in the
//! sandbox's `$HOME` tmpfs: global scope, so the command's own `git config
//! --global`, `git -c` and `GIT_AUTHOR_*`/`GIT_COMMITTER_*` still win.
//! Credential helpers, aliases, hooks, includes and every other key stay
//! on the host. A refused value is dropped with the alert
//! `git_identity_refused` (the other one still passes).

use std::path::{Path, PathBuf};

use sbx_core::{Severity, audit};

/// Longest value passed, in bytes.
pub const MAX_LEN: usize = 256;

/// The values found (each already checked).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Identity {
    pub name: Option<String>,
    pub email: Option<String>,
}

impl Identity {
    pub fn is_empty(&self) -> bool {
        self.name.is_none() && self.email.is_none()
    }

    /// The `~/.gitconfig` text: a `[user]` section, values quoted.
    pub fn gitconfig(&self) -> Vec<u8> {
        let mut s =
            String::from("# The host's git identity, offered by sbx-fs --git-identity.\n[user]\n");
        for (k, v) in [("name", &self.name), ("email", &self.email)] {
            if let Some(v) = v {
                s.push_str(&format!("\t{k} = \"{}\"\n", quote(v)));
            }
        }
        s.into_bytes()
    }
}

fn quote(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"")
}

/// Why a value is refused, if it is.
pub fn check(v: &[u8]) -> Result<&str, &'static str> {
    if v.is_empty() {
        return Err("empty");
    }
    if v.len() > MAX_LEN {
        return Err("longer than 256 bytes");
    }
    if v.iter().any(|c| *c < 0x20 || *c == 0x7f) {
        return Err("holds a control character (newline, tab, escape...)");
    }
    if v.iter().any(|c| *c == b'<' || *c == b'>') {
        return Err("holds '<' or '>'");
    }
    std::str::from_utf8(v).map_err(|_| "not UTF-8")
}

/// The home whose git configuration is the invoking user's: as root with
/// `SUDO_USER` set (to another user), that user's home from the password
/// database; else `$HOME`.
fn invoking_home() -> Option<(PathBuf, String)> {
    // SAFETY: plain getter.
    if unsafe { libc::geteuid() } == 0
        && let Ok(u) = std::env::var("SUDO_USER")
        && !u.is_empty()
        && u != "root"
        && let Ok(Some(pw)) = nix::unistd::User::from_name(&u)
    {
        return Some((pw.dir, u));
    }
    let h = PathBuf::from(std::env::var_os("HOME")?);
    let who = std::env::var("USER").unwrap_or_else(|_| "-".into());
    h.is_absolute().then_some((h, who))
}

/// Reads and checks the identity. Never fails: no git, no home or no
/// value is simply no identity (an info event says what was found).
pub fn read() -> Identity {
    let mut id = Identity::default();
    let Some((home, user)) = invoking_home() else {
        return id;
    };
    for (key, raw) in git_get(&home) {
        match check(&raw) {
            Ok(v) if key == "user.name" => id.name = Some(v.to_string()),
            Ok(v) => id.email = Some(v.to_string()),
            Err(why) => {
                if key == "user.name" {
                    id.name = None;
                } else {
                    id.email = None;
                }
                audit::emit(
                    "git_identity_refused",
                    Severity::Alert,
                    serde_json::json!({
                        "name": key,
                        "user": user,
                        "reason": why,
                        "action": "not passed to the sandbox",
                    }),
                )
            }
        }
    }
    audit::emit(
        "git_identity",
        Severity::Info,
        serde_json::json!({
            "user": user,
            "name": id.name.is_some(),
            "email": id.email.is_some(),
        }),
    );
    id
}

/// user.name and user.email as `git config --global --includes` gives
/// them with `home` as HOME: (key, value) in the file's order (a later
/// value of a key replaces an earlier one, as git reads it); nothing when
/// unset or git failed. A plain `~/.gitconfig` is read here ([`plain_get`]:
/// a git process is a fifth of sbx-fs's run); anything else by git.
fn git_get(home: &Path) -> Vec<(&'static str, Vec<u8>)> {
    // A FIFO or a device where git reads its configuration would block it:
    // not read at all (git is bounded by GIT_DEADLINE for what it includes).
    for f in [home.join(".gitconfig"), home.join(".config/git/config")] {
        if std::fs::metadata(&f).is_ok_and(|m| !m.is_file()) {
            audit::emit(
                "git_identity_refused",
                Severity::Alert,
                serde_json::json!({
                    "name": "user.name, user.email",
                    "reason": format!("{} is not a regular file (git would block on it)", f.display()),
                    "action": "not passed to the sandbox",
                }),
            );
            return Vec::new();
        }
    }
    plain_get(home).unwrap_or_else(|| git_run(home))
}

/// The common case without git: `~/.gitconfig` alone (no
/// `~/.config/git/config`, which git versions read differently), a
/// regular file of at most 1 MiB, UTF-8, no `[include]`, no line
/// continued with a backslash, and in `[user]` only plain `key = value`
/// lines (no quotes, no escapes). Anything else: None, and git reads it.
fn plain_get(home: &Path) -> Option<Vec<(&'static str, Vec<u8>)>> {
    match std::fs::symlink_metadata(home.join(".config/git/config")) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        _ => return None,
    }
    // Never blocks: a FIFO, a file of /proc or one over 1 MiB is refused.
    match sbx_core::input::read_regular_string(&home.join(".gitconfig"), 1 << 20) {
        Ok(text) => parse_plain(&text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(Vec::new()),
        Err(_) => None,
    }
}

/// git's whitespace (ASCII space and tab only).
fn git_trim(s: &str) -> &str {
    s.trim_matches([' ', '\t'])
}

/// [`plain_get`]'s parser: None for anything it does not read exactly as
/// git does.
fn parse_plain(text: &str) -> Option<Vec<(&'static str, Vec<u8>)>> {
    let mut out = Vec::new();
    let mut in_user = false;
    for line in text.lines() {
        let l = git_trim(line);
        if l.is_empty() || l.starts_with('#') || l.starts_with(';') {
            continue;
        }
        if l.ends_with('\\') {
            return None;
        }
        if let Some(rest) = l.strip_prefix('[') {
            let (inner, after) = rest.split_once(']')?;
            let after = git_trim(after);
            if !(after.is_empty() || after.starts_with('#') || after.starts_with(';')) {
                return None;
            }
            let (name, sub) = match inner.split_once([' ', '\t']) {
                Some((n, s)) => (n, Some(git_trim(s))),
                None => (inner, None),
            };
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
                || sub.is_some_and(|s| !s.starts_with('"'))
            {
                return None;
            }
            let name = name.to_ascii_lowercase();
            if name == "include" || name == "includeif" {
                return None;
            }
            in_user = name == "user" && sub.is_none();
            continue;
        }
        if !in_user {
            continue;
        }
        if l.contains(['"', '\\']) {
            return None;
        }
        // `key = value`; a key alone is a boolean, which git prints apart.
        let (key, value) = l.split_once('=')?;
        let key = git_trim(key);
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return None;
        }
        let k = match key.to_ascii_lowercase().as_str() {
            "name" => "user.name",
            "email" => "user.email",
            _ => continue,
        };
        let v = git_trim(value.split(['#', ';']).next().unwrap_or(""));
        let mut v = v.as_bytes().to_vec();
        v.truncate(MAX_LEN + 1);
        out.push((k, v));
    }
    Some(out)
}

/// `git config --global --includes -z --get-regexp` of user.name and
/// user.email (one git run, from `/`, with HOME and PATH only).
fn git_run(home: &Path) -> Vec<(&'static str, Vec<u8>)> {
    let mut c = std::process::Command::new("git");
    c.env_clear()
        .env("HOME", home)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .current_dir("/")
        .args([
            "config",
            "--global",
            "--includes",
            "-z",
            "--get-regexp",
            r"^user\.(name|email)$",
        ]);
    if let Some(p) = std::env::var_os("PATH") {
        c.env("PATH", p);
    }
    match sbx_core::child::output_within(&mut c, GIT_DEADLINE, 1 << 20) {
        Ok(f) if f.status.success() => parse_z(&f.stdout),
        Err(e @ (sbx_core::child::Overrun::Time(_) | sbx_core::child::Overrun::Size(_))) => {
            // Killed (a FIFO it opened blocks it for ever).
            audit::emit(
                "git_identity_refused",
                Severity::Warn,
                serde_json::json!({
                    "name": "user.name, user.email",
                    "reason": format!("git config did not answer ({e}; a FIFO or a huge file in its configuration?): killed"),
                    "action": "not passed to the sandbox",
                }),
            );
            Vec::new()
        }
        _ => Vec::new(),
    }
}

/// How long git may take to print two values.
const GIT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

/// git's `-z` output: `KEY\nVALUE\0` per entry; each value bounded.
fn parse_z(b: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    b.split(|c| *c == 0)
        .filter_map(|e| {
            let nl = e.iter().position(|c| *c == b'\n')?;
            let key = match &e[..nl] {
                b"user.name" => "user.name",
                b"user.email" => "user.email",
                _ => return None,
            };
            let mut v = e[nl + 1..].to_vec();
            // Bounded before it is looked at further.
            v.truncate(MAX_LEN + 1);
            Some((key, v))
        })
        .collect()
}

/// Where the file goes: `$HOME/.gitconfig` when `$HOME` is the sandbox's
/// own tmpfs (a bind of the host's home shows its own file).
pub fn target(plan: &crate::plan::Plan) -> Option<PathBuf> {
    plan.ops
        .iter()
        .find(|o| o.why == "home")
        .map(|o| o.dst.join(".gitconfig"))
}

/// In the sandbox's init, after the pivot: creates the file (never
/// through a link, never over something), owned by the identity inside.
pub fn write(path: &std::path::Path, content: &[u8], uid: u32, gid: u32) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    f.write_all(content)?;
    // SAFETY: fchown of our own open fd.
    if unsafe { libc::fchown(f.as_raw_fd(), uid, gid) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_checked() {
        assert_eq!(check(b"Ada Lovelace"), Ok("Ada Lovelace"));
        assert_eq!(check("Zoë".as_bytes()), Ok("Zoë"));
        assert!(check(b"").is_err());
        assert!(check(b"a\nb").is_err());
        assert!(check(b"a\x1b[2Jb").is_err());
        assert!(check(b"a<b>").is_err());
        assert!(check(&[b'a'; 257]).is_err());
        assert!(check(&[b'a'; 256]).is_ok());
        assert!(check(b"\xff").is_err());
    }

    /// Each config read without git gives exactly what git gives; what
    /// it cannot read exactly is left to git.
    #[test]
    fn plain_configs_read_as_git_reads_them() {
        let git_ok = std::process::Command::new("git")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        let plain = [
            "[user]\n\tname = Ada Lovelace\n\temail = ada@example.org\n",
            "[User]\nNAME=Ada\nEmail =  a@b  \n",
            "# c\n; c\n[core]\n\teditor = vim\n[user] # c\n  name = Ada # inline\n  email = a@b;x\n",
            "[alias]\n\tlg = \"log --graph\"\n[remote \"origin\"]\n\turl = x\n[user]\nname = Ada\n",
            "[user]\nname = first\nname = second\n[user \"x\"]\nname = sub\n[user.y]\nname = old\n",
            "[user]\r\nname = Crlf\r\nemail = c@d\r\n",
            "[user]\nname =\nemail = e@f\n",
            "[core]\nx = y\n",
            "",
            "[user]\nsigningkey = K\nname = Ada  Byron\n",
        ];
        let not_plain = [
            "[include]\npath = other\n[user]\nname = A\n",
            "[includeIf \"gitdir:/x/\"]\npath = other\n",
            "[alias]\nx = a \\\n[user]\nname = Hidden\n",
            "[user]\nname = \"Quoted\"\n",
            "[user]\nname = A\\tB\n",
            "[user] name = Same line\n",
            "[user]\nname\n",
            "[bad section]\nx = y\n",
        ];
        for t in not_plain {
            assert_eq!(parse_plain(t), None, "{t:?}");
        }
        for t in plain {
            let mine = parse_plain(t).unwrap_or_else(|| panic!("not plain: {t:?}"));
            if !git_ok {
                continue;
            }
            let d = tempfile::tempdir().unwrap();
            std::fs::write(d.path().join(".gitconfig"), t).unwrap();
            assert_eq!(plain_get(d.path()), Some(mine.clone()), "{t:?}");
            assert_eq!(mine, git_run(d.path()), "{t:?}");
        }
        // Not plain: git reads it (an include followed).
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("other"), "[user]\nname = Included\n").unwrap();
        std::fs::write(d.path().join(".gitconfig"), not_plain[0]).unwrap();
        if git_ok {
            assert_eq!(
                git_get(d.path()),
                vec![
                    ("user.name", b"Included".to_vec()),
                    ("user.name", b"A".to_vec())
                ]
            );
        }
        // A FIFO is never opened for reading by the plain path.
        let f = tempfile::tempdir().unwrap();
        sbx_testutil::mkfifo(&f.path().join(".gitconfig"));
        assert_eq!(plain_get(f.path()), None);
        let t = std::time::Instant::now();
        assert!(git_get(f.path()).is_empty());
        assert!(t.elapsed() < GIT_DEADLINE, "{:?}", t.elapsed());
        // git itself on a FIFO (an include can name one): killed at the
        // deadline, no identity, never a hang.
        if git_ok {
            let g = tempfile::tempdir().unwrap();
            sbx_testutil::mkfifo(&g.path().join("fifo"));
            std::fs::write(
                g.path().join(".gitconfig"),
                "[include]\npath = fifo\n[user]\nname = A\n",
            )
            .unwrap();
            let t = std::time::Instant::now();
            assert!(git_get(g.path()).is_empty());
            assert!(t.elapsed() < GIT_DEADLINE * 3, "{:?}", t.elapsed());
        }
        // An XDG config: git decides.
        let x = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(x.path().join(".config/git")).unwrap();
        std::fs::write(x.path().join(".config/git/config"), "[user]\nname = X\n").unwrap();
        assert_eq!(plain_get(x.path()), None);
    }

    #[test]
    fn z_output_is_parsed() {
        let v = parse_z(b"user.name\nA B\0user.email\na\nb@x\0user.other\nz\0");
        assert_eq!(
            v,
            vec![
                ("user.name", b"A B".to_vec()),
                ("user.email", b"a\nb@x".to_vec())
            ]
        );
        assert!(parse_z(b"").is_empty());
    }

    #[test]
    fn gitconfig_quotes() {
        let id = Identity {
            name: Some("A \"B\" \\C".into()),
            email: None,
        };
        let t = String::from_utf8(id.gitconfig()).unwrap();
        assert!(
            t.contains("[user]\n\tname = \"A \\\"B\\\" \\\\C\"\n"),
            "{t}"
        );
        assert!(!t.contains("email"));
    }
}
