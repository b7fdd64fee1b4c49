//! What `Bash(...)` rules mean in the sandbox: the execute allowlist and
//! its two modes (docs/policy.md "Bash rules").
//!
//! - invoke (the default, Claude Code's meaning): a rule says which
//!   commands the agent may run. The chain's command is judged against the
//!   rules before anything starts (Claude Code's matching: exact, `prefix:*`,
//!   `*` globs; compound commands and `sh -c` split, every part judged); what
//!   an allowed command starts is not restricted.
//! - strict: the same check, and a kernel (Landlock) execute allowlist for
//!   every program started inside: the programs the rules name plus a
//!   curated set of shells and helpers ([`STRICT_HELPERS`]).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// How the Bash allow rules bind programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ExecMode {
    /// Claude Code's meaning: the rules say which commands the agent may run (checked before the chain starts); what those commands start is not restricted.
    #[default]
    Invoke,
    /// The same check, and a kernel (Landlock) execute allowlist for every program started inside: the programs the rules name and a curated set of shells and helpers.
    Strict,
}

impl ExecMode {
    pub fn name(self) -> &'static str {
        match self {
            ExecMode::Invoke => "invoke",
            ExecMode::Strict => "strict",
        }
    }

    /// What the mode means, for explain and chain --print.
    pub fn consequences(self) -> &'static str {
        match self {
            ExecMode::Invoke => {
                "the Bash allow rules say which commands the agent may run (Claude Code's meaning): sbx-policy chain judges its command before anything starts (refused: exit 126, command_denied alert); what an allowed command starts (npm's script shell, make's recipes, git's helpers) is not restricted, so an allowed interpreter or build tool can run anything (--exec-allowlist strict restricts them)"
            }
            ExecMode::Strict => {
                "the command is judged as in invoke mode, and every program started inside must also be on a kernel execute allowlist (Landlock, sbx-seccomp --allow-exec: the programs the rules name, the command itself, sh, bash, env, the #! interpreters of listed scripts, git's helper directory); any other exec fails with EACCES (126) and an exec_denied alert, so an npm script's tools or make's recipes need their own rules"
            }
        }
    }
}

/// Shells and helpers that strict mode lets run whatever the rules say,
/// with why (docs/policy.md lists them).
pub const STRICT_HELPERS: &[(&str, &str)] = &[
    (
        "sh",
        "npm/yarn run scripts, make runs recipes, git runs aliases with /bin/sh -c",
    ),
    (
        "bash",
        "scripts that name it on their #! line; bash -c wrappers",
    ),
    (
        "env",
        "#!/usr/bin/env node|python3 scripts (npm itself, node_modules/.bin tools)",
    ),
];

/// How a rule matches a command line (Claude Code's forms).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// `Bash(npm run build)`: exactly that command.
    Exact(String),
    /// `Bash(npm run test:*)`: that command, alone or followed by arguments.
    Prefix(String),
    /// `Bash(git * main)`: `*` matches any characters; a single trailing
    /// ` *` also matches nothing (`Bash(ls *)` matches `ls`).
    Glob(String),
}

impl Pattern {
    pub fn parse(spec: &str) -> Pattern {
        let s = spec.split_whitespace().collect::<Vec<_>>().join(" ");
        if let Some(p) = s.strip_suffix(":*") {
            Pattern::Prefix(p.trim_end().to_string())
        } else if s.contains('*') {
            Pattern::Glob(s)
        } else {
            Pattern::Exact(s)
        }
    }

    pub fn matches(&self, cmd: &str) -> bool {
        match self {
            Pattern::Exact(e) => cmd == e,
            Pattern::Prefix(p) => {
                cmd == p || (cmd.starts_with(p.as_str()) && cmd[p.len()..].starts_with(' '))
            }
            Pattern::Glob(g) => {
                glob(g.as_bytes(), cmd.as_bytes())
                    || (g.matches('*').count() == 1
                        && g.strip_suffix(" *").is_some_and(|head| head == cmd))
            }
        }
    }
}

/// `*` matches any run of bytes (spaces included); everything else itself.
fn glob(p: &[u8], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, si));
            pi += 1;
        } else if pi < p.len() && p[pi] == s[si] {
            pi += 1;
            si += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// One Bash rule with a command pattern.
#[derive(Debug, Clone)]
pub struct BashRule {
    /// The rule as written (`Bash(npm run test:*)`).
    pub rule: String,
    pub pattern: Pattern,
}

/// The execute allowlist a policy's Bash rules make (None in the policy
/// when no allow rule names a program, or `Bash`/`Bash(*)` allows all).
#[derive(Debug, Clone)]
pub struct ExecAllowlist {
    pub mode: ExecMode,
    /// Any command may be run (a `Bash`/`Bash(*)` allow rule, or no allow
    /// rule with a pattern): only the deny rules are checked, nothing is
    /// kernel-enforced.
    pub any: bool,
    /// Allow rules: what the agent may run.
    pub allow: Vec<BashRule>,
    /// Deny rules with a pattern: refused even when an allow rule matches.
    pub deny: Vec<BashRule>,
    /// The files the allow rules' programs are (every copy on PATH): the
    /// kernel list of strict mode, before the helpers.
    pub files: Vec<PathBuf>,
}

/// A command the agent may run, and the rule that allows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    pub command: String,
    pub rule: String,
}

/// Why the chain's command is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The (part of the) command refused.
    pub command: String,
    pub reason: String,
}

/// Programs that only wrap the command (Claude Code strips them before
/// matching): `timeout`, `nice`, `nohup`, `time`.
fn strip_wrappers(mut w: &[String]) -> &[String] {
    loop {
        let Some(first) = w.first() else { return w };
        let rest = &w[1..];
        let next = match first.as_str() {
            "nohup" => Some(rest),
            "time" => Some(if rest.first().is_some_and(|a| a == "-p") {
                &rest[1..]
            } else {
                rest
            }),
            "nice" => match rest.first().map(String::as_str) {
                Some("-n") if rest.len() > 1 => Some(&rest[2..]),
                Some(a) if a.starts_with("--adjustment=") => Some(&rest[1..]),
                Some(a) if a.len() > 1 && a[1..].parse::<i32>().is_ok() && a.starts_with('-') => {
                    Some(&rest[1..])
                }
                _ => Some(rest),
            },
            "timeout" => {
                let mut i = 0;
                while let Some(a) = rest.get(i) {
                    match a.as_str() {
                        "--preserve-status" | "--foreground" | "-v" | "--verbose" => i += 1,
                        "-s" | "-k" | "--signal" | "--kill-after" => i += 2,
                        a if a.starts_with("--signal=") || a.starts_with("--kill-after=") => i += 1,
                        _ => break,
                    }
                }
                // The duration: digits with an optional unit.
                match rest.get(i) {
                    Some(d)
                        if d.trim_end_matches(['s', 'm', 'h', 'd'])
                            .parse::<f64>()
                            .is_ok() =>
                    {
                        Some(&rest[i + 1..])
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        match next {
            Some(n) if !n.is_empty() => w = n,
            _ => return w,
        }
    }
}

/// Builtins that start no program and change nothing but the shell's own
/// state: allowed between the parts of a compound command.
const INERT: &[&str] = &["cd", "true", "false", ":"];

const SHELLS: &[&str] = &["sh", "bash", "dash", "ash", "ksh", "zsh"];

/// The script of `sh -c SCRIPT ...` (options like `-e`, `-x`, `-lc` before it).
fn shell_script(w: &[String]) -> Option<&str> {
    let name = Path::new(w.first()?).file_name()?.to_str()?;
    if !SHELLS.contains(&name) {
        return None;
    }
    let mut saw_c = false;
    for (i, a) in w.iter().enumerate().skip(1) {
        if let Some(flags) = a.strip_prefix('-')
            && !flags.is_empty()
            && flags.chars().all(|c| "cexuvl".contains(c))
        {
            saw_c |= flags.contains('c');
            continue;
        }
        return if saw_c { Some(w[i].as_str()) } else { None };
    }
    None
}

/// The command line as a person types it (words shell-quoted when needed),
/// which is what the rules' patterns match.
pub fn line(words: &[String]) -> String {
    words
        .iter()
        .map(|w| crate::chain::quote(w))
        .collect::<Vec<_>>()
        .join(" ")
}

impl ExecAllowlist {
    /// Whether the chain carries a kernel execute allowlist (strict mode,
    /// with allow rules that name commands).
    pub fn kernel_enforced(&self) -> bool {
        self.mode == ExecMode::Strict && !self.any
    }

    /// Judges the chain's command: Ok with what allowed each part, or the
    /// part refused and why. Anything that cannot be judged is refused.
    pub fn judge(&self, argv: &[OsString]) -> Result<Vec<Allowed>, Refusal> {
        let words: Vec<String> = argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let mut out = Vec::new();
        self.judge_words(&words, 0, false, &mut out)?;
        Ok(out)
    }

    fn judge_words(
        &self,
        words: &[String],
        depth: usize,
        in_script: bool,
        out: &mut Vec<Allowed>,
    ) -> Result<(), Refusal> {
        let w = strip_wrappers(words);
        let cmd = line(w);
        if let Some(d) = self.deny.iter().find(|r| r.pattern.matches(&cmd)) {
            return Err(Refusal {
                command: cmd,
                reason: format!("denied by {}", d.rule),
            });
        }
        if let Some(a) = self.allow.iter().find(|r| r.pattern.matches(&cmd)) {
            out.push(Allowed {
                command: cmd,
                rule: a.rule.clone(),
            });
            return Ok(());
        }
        if in_script && w.first().is_some_and(|p| INERT.contains(&p.as_str())) {
            return Ok(());
        }
        if let Some(script) = shell_script(w) {
            if depth >= 3 {
                return Err(Refusal {
                    command: cmd,
                    reason: "shells nested too deep to judge".into(),
                });
            }
            // bash and zsh read `&>` as a redirection; sh may be dash.
            let bash_like = Path::new(&w[0])
                .file_name()
                .is_some_and(|n| n == "bash" || n == "zsh");
            let parts = match split_script(script, bash_like) {
                Ok(p) => p,
                // Nothing to judge it against.
                Err(_) if self.any && self.deny.is_empty() => Vec::new(),
                Err(why) => {
                    return Err(Refusal {
                        command: cmd,
                        reason: format!("cannot be judged: {why}"),
                    });
                }
            };
            for p in parts {
                self.judge_words(&p, depth + 1, true, out)?;
            }
            return Ok(());
        }
        if self.any {
            out.push(Allowed {
                command: cmd,
                rule: "any command (no Bash allow rule restricts them)".into(),
            });
            return Ok(());
        }
        Err(Refusal {
            command: cmd,
            reason: "no Bash allow rule matches it".into(),
        })
    }

    /// The kernel list of strict mode: the rules' files, the command itself,
    /// the helpers, and the #! interpreters of all of them; git's helper
    /// directory when git is on it.
    pub fn strict_files(&self, cmd: &[OsString], start: &Path) -> Vec<PathBuf> {
        let mut extra: Vec<PathBuf> = self.files.clone();
        if let Some(prog) = cmd.first() {
            extra.extend(crate::map::find_program(&prog.to_string_lossy(), start));
        }
        for (sh, _) in STRICT_HELPERS {
            extra.extend(crate::map::find_program(sh, start));
        }
        let interps: Vec<PathBuf> = extra.iter().flat_map(|x| interpreter(x, start)).collect();
        extra.extend(interps);
        // git runs most subcommands and transports from its exec path
        // (git-core): part of git, not another program.
        let gits: Vec<PathBuf> = extra
            .iter()
            .filter(|x| x.file_name().is_some_and(|n| n == "git"))
            .cloned()
            .collect();
        for g in gits {
            if let Ok(o) = std::process::Command::new(&g).arg("--exec-path").output()
                && o.status.success()
                && let Ok(d) = Path::new(String::from_utf8_lossy(&o.stdout).trim()).canonicalize()
            {
                extra.push(d);
            }
        }
        // Sorted: one list whatever the command (compile's and chain's
        // differ only by the command's own program).
        extra.sort();
        extra.dedup();
        extra
    }
}

/// The interpreter a script names on its #! line (`env X` resolves X).
fn interpreter(file: &Path, cwd: &Path) -> Vec<PathBuf> {
    use std::io::Read;
    let mut buf = [0u8; 256];
    let Ok(mut f) = std::fs::File::open(file) else {
        return Vec::new();
    };
    let n = f.read(&mut buf).unwrap_or(0);
    let Some(rest) = buf[..n].strip_prefix(b"#!") else {
        return Vec::new();
    };
    let line = String::from_utf8_lossy(rest.split(|&b| b == b'\n').next().unwrap_or(b""));
    let mut words = line.split_whitespace();
    let Some(first) = words.next() else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = Path::new(first).canonicalize().into_iter().collect();
    if first.ends_with("/env")
        && let Some(prog) = words.find(|w| !w.starts_with('-'))
    {
        out.extend(crate::map::find_program(prog, cwd));
    }
    out
}

const KEYWORDS: &[&str] = &[
    "if", "then", "else", "elif", "fi", "for", "while", "until", "do", "done", "case", "esac",
    "function", "select", "[[", "]]", "!", "{", "}", "coproc",
];

/// Splits a shell command line into its simple commands (at `&&`, `||`,
/// `;`, `|`, `&`, newlines), each as its words with quotes removed and
/// redirections dropped. Whatever this cannot read exactly as the shell
/// would (command or process substitution, subshells, groups, control
/// structures, here-documents, assignments or expansions where the program
/// is named) is an error saying what it is: the command is then refused.
pub fn split_script(s: &str, bash_like: bool) -> Result<Vec<Vec<String>>, String> {
    #[derive(PartialEq)]
    enum Tok {
        Word(String, bool),
        Sep,
        Redir,
    }
    let b: Vec<char> = s.chars().collect();
    let mut toks: Vec<Tok> = Vec::new();
    let mut i = 0;
    let mut cur = String::new();
    let mut in_word = false;
    // Whether the word has an unquoted expansion or glob character.
    let mut wild = false;
    macro_rules! flush {
        () => {
            if in_word {
                toks.push(Tok::Word(std::mem::take(&mut cur), wild));
                in_word = false;
                wild = false;
            }
        };
    }
    while i < b.len() {
        let c = b[i];
        match c {
            '\'' => {
                in_word = true;
                let end = b[i + 1..]
                    .iter()
                    .position(|&x| x == '\'')
                    .ok_or("an unterminated ' quote")?;
                cur.extend(&b[i + 1..i + 1 + end]);
                i += end + 2;
            }
            '"' => {
                in_word = true;
                i += 1;
                loop {
                    let Some(&x) = b.get(i) else {
                        return Err("an unterminated \" quote".into());
                    };
                    match x {
                        '"' => break,
                        '`' => return Err("command substitution (`...`)".into()),
                        '$' if b.get(i + 1) == Some(&'(') => {
                            return Err("command substitution ($(...))".into());
                        }
                        '$' => {
                            wild = true;
                            cur.push(x)
                        }
                        '\\' if matches!(b.get(i + 1), Some('"' | '\\' | '$' | '`')) => {
                            cur.push(b[i + 1]);
                            i += 1;
                        }
                        _ => cur.push(x),
                    }
                    i += 1;
                }
                i += 1;
            }
            '\\' => {
                match b.get(i + 1) {
                    Some('\n') => {}
                    Some(&x) => {
                        in_word = true;
                        cur.push(x)
                    }
                    None => return Err("a trailing backslash".into()),
                }
                i += 2;
            }
            '`' => return Err("command substitution (`...`)".into()),
            '$' if b.get(i + 1) == Some(&'(') => {
                return Err("command substitution ($(...))".into());
            }
            '(' | ')' => return Err("a subshell or function definition ( ... )".into()),
            '#' if !in_word => {
                while i < b.len() && b[i] != '\n' {
                    i += 1;
                }
            }
            ' ' | '\t' => {
                flush!();
                i += 1;
            }
            '\n' | ';' => {
                flush!();
                if b.get(i + 1) == Some(&';') {
                    return Err("a case clause (;;)".into());
                }
                toks.push(Tok::Sep);
                i += 1;
            }
            '&' | '|' => {
                // `&>` is a redirection in bash but `&` then a command in
                // sh (dash): the shells disagree on what runs.
                if c == '&' && b.get(i + 1) == Some(&'>') {
                    if !bash_like {
                        return Err(
                            "`&>` (a redirection in bash, a background `&` in sh: use `>file 2>&1`)"
                                .into(),
                        );
                    }
                    flush!();
                    toks.push(Tok::Redir);
                    i += if b.get(i + 2) == Some(&'>') { 3 } else { 2 };
                    continue;
                }
                flush!();
                toks.push(Tok::Sep);
                i += if matches!(b.get(i + 1), Some('&' | '|')) && b[i + 1] == c
                    || (c == '|' && b.get(i + 1) == Some(&'&'))
                {
                    2
                } else {
                    1
                };
            }
            '<' | '>' => {
                // A number right before is the fd (2>): part of the operator.
                if in_word && cur.chars().all(|x| x.is_ascii_digit()) && !wild {
                    cur.clear();
                    in_word = false;
                }
                flush!();
                let two: String = b[i..(i + 2).min(b.len())].iter().collect();
                if two == "<<" {
                    return Err("a here-document (<<)".into());
                }
                if two == "<(" || two == ">(" {
                    return Err("process substitution".into());
                }
                i += 1;
                if matches!(b.get(i), Some('>' | '|' | '&')) {
                    let amp = b[i] == '&';
                    i += 1;
                    // >&2, >&- : the target is the fd itself.
                    if amp {
                        let start = i;
                        while i < b.len() && (b[i].is_ascii_digit() || b[i] == '-') {
                            i += 1;
                        }
                        // `>&2echo` is a redirection to the file `2echo` in
                        // bash, not `>&2` then `echo`: only a whole word of
                        // digits (or `-`) is an fd.
                        if i > start
                            && b.get(i).is_some_and(|x| {
                                !matches!(x, ' ' | '\t' | '\n' | ';' | '&' | '|' | '<' | '>')
                            })
                        {
                            return Err("a redirection `>&FD` joined to a word".into());
                        }
                        if i > start {
                            continue;
                        }
                    }
                }
                toks.push(Tok::Redir);
            }
            '$' | '*' | '?' | '[' | '~' | '{' | '}' => {
                wild = true;
                in_word = true;
                cur.push(c);
                i += 1;
            }
            _ => {
                in_word = true;
                cur.push(c);
                i += 1;
            }
        }
    }
    if in_word {
        toks.push(Tok::Word(cur, wild));
    }
    let mut out: Vec<Vec<String>> = Vec::new();
    let mut words: Vec<String> = Vec::new();
    let mut it = toks.into_iter();
    let end = |words: &mut Vec<String>, out: &mut Vec<Vec<String>>| {
        if !words.is_empty() {
            out.push(std::mem::take(words));
        }
    };
    while let Some(t) = it.next() {
        match t {
            Tok::Sep => end(&mut words, &mut out),
            Tok::Redir => match it.next() {
                Some(Tok::Word(..)) => {}
                _ => return Err("a redirection without a target".into()),
            },
            Tok::Word(w, wild) => {
                if words.is_empty() {
                    if KEYWORDS.contains(&w.as_str()) {
                        return Err(format!("a shell control structure ({w})"));
                    }
                    if wild {
                        return Err(format!(
                            "the program is named by an expansion or pattern ({w})"
                        ));
                    }
                    if w.contains('=') && !w.starts_with('=') {
                        return Err(format!("a variable assignment before the command ({w})"));
                    }
                    if w.is_empty() {
                        return Err("an empty program name".into());
                    }
                }
                words.push(w);
            }
        }
    }
    end(&mut words, &mut out);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn al(allow: &[&str], deny: &[&str]) -> ExecAllowlist {
        let r = |v: &[&str]| {
            v.iter()
                .map(|s| BashRule {
                    rule: format!("Bash({s})"),
                    pattern: Pattern::parse(s),
                })
                .collect()
        };
        ExecAllowlist {
            mode: ExecMode::Invoke,
            any: false,
            allow: r(allow),
            deny: r(deny),
            files: Vec::new(),
        }
    }

    fn judge(a: &ExecAllowlist, argv: &[&str]) -> Result<Vec<Allowed>, Refusal> {
        a.judge(&argv.iter().map(OsString::from).collect::<Vec<_>>())
    }

    #[test]
    fn patterns_match_as_claude_code_matches() {
        let p = Pattern::parse("npm run test:*");
        assert!(p.matches("npm run test"));
        assert!(p.matches("npm run test --watch"));
        assert!(!p.matches("npm run testx"));
        assert!(!p.matches("npm run build"));
        let e = Pattern::parse("npm run build");
        assert!(e.matches("npm run build"));
        assert!(!e.matches("npm run build --prod"));
        let g = Pattern::parse("ls *");
        assert!(g.matches("ls") && g.matches("ls -la") && !g.matches("lsof"));
        let g = Pattern::parse("ls*");
        assert!(g.matches("lsof"));
        let g = Pattern::parse("git * main");
        assert!(g.matches("git checkout main") && !g.matches("git checkout dev"));
    }

    #[test]
    fn compound_commands_need_every_part_allowed() {
        let a = al(&["git:*", "make"], &["git push:*"]);
        assert!(judge(&a, &["git", "status"]).is_ok());
        assert!(judge(&a, &["ls"]).is_err());
        assert!(judge(&a, &["sh", "-c", "git status && make"]).is_ok());
        assert!(judge(&a, &["bash", "-lc", "cd sub; git log | git status"]).is_ok());
        let r = judge(&a, &["sh", "-c", "git status && ls"]).unwrap_err();
        assert_eq!(r.command, "ls");
        let r = judge(&a, &["sh", "-c", "git push origin"]).unwrap_err();
        assert!(r.reason.contains("git push"), "{r:?}");
        assert!(judge(&a, &["git", "push"]).is_err());
        // Redirections do not hide the program; wrappers are stripped.
        assert!(judge(&a, &["sh", "-c", "git log > out.txt 2>&1"]).is_ok());
        assert!(judge(&a, &["timeout", "5", "git", "status"]).is_ok());
        assert!(judge(&a, &["nice", "-n", "5", "make"]).is_ok());
        assert!(judge(&a, &["make", "all"]).is_err(), "exact rule");
    }

    #[test]
    fn redirections_the_shells_read_differently_are_refused() {
        let a = al(&["git:*", "echo:*"], &[]);
        // dash: `echo hi &` then `>out id`; bash: one echo to `out`.
        assert!(judge(&a, &["sh", "-c", "echo hi &>out id >&2"]).is_err());
        // bash reads it as a redirection: one echo, its output to `out`.
        assert!(judge(&a, &["bash", "-c", "echo hi &>out"]).is_ok());
        assert!(judge(&a, &["bash", "-c", "git log &>>out; echo x"]).is_ok());
        // bash: `>&2echo` writes to the file 2echo, then `id` runs.
        assert!(judge(&a, &["bash", "-c", ">&2echo id"]).is_err());
        assert!(judge(&a, &["sh", "-c", "git log >&2 2>&1"]).is_ok());
        assert!(judge(&a, &["sh", "-c", "git log 2>&-; echo x>&2"]).is_ok());
    }

    #[test]
    fn what_cannot_be_judged_is_refused() {
        let a = al(&["git:*"], &[]);
        for s in [
            "git $(id)",
            "git `id`",
            "(ls)",
            "if true; then ls; fi",
            "X=1 git status",
            "$G status",
            "git log <<EOF",
            "diff <(git log)",
            "{ ls; }",
            "git log 'unterminated",
            "f() { ls; }",
        ] {
            let r = judge(&a, &["sh", "-c", s]).unwrap_err();
            assert!(r.reason.starts_with("cannot be judged"), "{s}: {r:?}");
        }
        // Nested shells are judged too.
        assert!(judge(&a, &["sh", "-c", "sh -c 'git status'"]).is_ok());
        assert!(judge(&a, &["sh", "-c", "sh -c 'ls'"]).is_err());
        // Only deny rules: anything else runs, but a deny cannot be hidden.
        let mut d = al(&[], &["git push:*"]);
        d.any = true;
        assert!(judge(&d, &["ls", "-l"]).is_ok());
        assert!(judge(&d, &["sh", "-c", "ls; git push origin"]).is_err());
        assert!(judge(&d, &["sh", "-c", "git $(echo push)"]).is_err());
        // `Bash(sh)` is exact: a script is judged by its parts.
        let e = al(&["sh"], &[]);
        assert!(judge(&e, &["sh"]).is_ok());
        assert!(judge(&e, &["sh", "-c", "ls"]).is_err());
        // A rule that allows the shell itself allows any script: the user said so.
        let s = al(&["sh:*"], &[]);
        assert!(judge(&s, &["sh", "-c", "if true; then ls; fi"]).is_ok());
    }
}
