//! A git-config reader for what gitguard needs: every key with its value,
//! and the files a config includes. It does not follow includes itself;
//! each file is snapshotted and compared on its own.

use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Lower-case section.
    pub section: String,
    /// Subsection as written (case-sensitive), if any.
    pub sub: Option<String>,
    /// Lower-case key name.
    pub name: String,
    /// None for a bare key (boolean true).
    pub value: Option<String>,
}

impl Entry {
    /// `section.sub.name` as git prints it.
    pub fn key(&self) -> String {
        match &self.sub {
            Some(s) => format!("{}.{}.{}", self.section, s, self.name),
            None => format!("{}.{}", self.section, self.name),
        }
    }

    pub fn is_dangerous(&self) -> bool {
        crate::rules::is_dangerous(
            &self.section,
            self.sub.as_deref(),
            &self.name,
            self.value.as_deref(),
        )
    }
}

#[derive(Debug, thiserror::Error)]
#[error("line {line}: {what}")]
pub struct ParseError {
    pub line: usize,
    pub what: &'static str,
}

/// Parses a config file's text.
pub fn parse(text: &str) -> Result<Vec<Entry>, ParseError> {
    let c: Vec<char> = text.chars().collect();
    let mut i = 0;
    let mut line = 1;
    let mut out = Vec::new();
    let mut section: Option<(String, Option<String>)> = None;
    let err = |line, what| Err(ParseError { line, what });
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
            continue;
        }
        if ch.is_whitespace() {
            i += 1;
            continue;
        }
        if ch == '#' || ch == ';' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
            continue;
        }
        if ch == '\u{feff}' && i == 0 {
            i += 1;
            continue;
        }
        if ch == '[' {
            i += 1;
            let mut name = String::new();
            while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '-' || c[i] == '.') {
                name.push(c[i].to_ascii_lowercase());
                i += 1;
            }
            if name.is_empty() {
                return err(line, "empty section name");
            }
            let mut sub = None;
            if i < c.len() && c[i] == ' ' || i < c.len() && c[i] == '\t' {
                while i < c.len() && (c[i] == ' ' || c[i] == '\t') {
                    i += 1;
                }
                if i >= c.len() || c[i] != '"' {
                    return err(line, "bad section header");
                }
                i += 1;
                let mut s = String::new();
                loop {
                    if i >= c.len() || c[i] == '\n' {
                        return err(line, "unterminated subsection");
                    }
                    if c[i] == '"' {
                        i += 1;
                        break;
                    }
                    if c[i] == '\\' && i + 1 < c.len() && c[i + 1] != '\n' {
                        i += 1;
                    }
                    s.push(c[i]);
                    i += 1;
                }
                sub = Some(s);
            } else if let Some((a, b)) = name.split_once('.') {
                // Deprecated [section.sub] syntax: the subsection is lower-cased.
                sub = Some(b.to_string());
                name = a.to_string();
            }
            if i >= c.len() || c[i] != ']' {
                return err(line, "bad section header");
            }
            i += 1;
            section = Some((name, sub));
            continue;
        }
        if ch.is_ascii_alphabetic() {
            let Some((sec, sub)) = &section else {
                return err(line, "key outside a section");
            };
            let mut name = String::new();
            while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '-') {
                name.push(c[i].to_ascii_lowercase());
                i += 1;
            }
            while i < c.len() && (c[i] == ' ' || c[i] == '\t') {
                i += 1;
            }
            let value = if i < c.len() && c[i] == '=' {
                i += 1;
                let (v, ni, nl) =
                    parse_value(&c, i, line).map_err(|what| ParseError { line, what })?;
                i = ni;
                line = nl;
                Some(v)
            } else if i >= c.len() || c[i] == '\n' || c[i] == '#' || c[i] == ';' || c[i] == '\r' {
                None
            } else {
                return err(line, "bad key");
            };
            out.push(Entry {
                section: sec.clone(),
                sub: sub.clone(),
                name,
                value,
            });
            continue;
        }
        return err(line, "unexpected character");
    }
    Ok(out)
}

fn parse_value(
    c: &[char],
    mut i: usize,
    mut line: usize,
) -> Result<(String, usize, usize), &'static str> {
    let mut v = String::new();
    let mut quoted = false;
    let mut pending_ws = String::new();
    while i < c.len() && (c[i] == ' ' || c[i] == '\t') {
        i += 1;
    }
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            if quoted {
                return Err("newline in a quoted value");
            }
            break;
        }
        if !quoted && (ch == '#' || ch == ';') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
            break;
        }
        if !quoted && (ch == ' ' || ch == '\t' || ch == '\r') {
            pending_ws.push(ch);
            i += 1;
            continue;
        }
        v.push_str(&pending_ws);
        pending_ws.clear();
        if ch == '"' {
            quoted = !quoted;
            i += 1;
            continue;
        }
        if ch == '\\' {
            i += 1;
            match c.get(i) {
                Some('\n') => line += 1,
                Some('n') => v.push('\n'),
                Some('t') => v.push('\t'),
                Some('b') => {
                    v.pop();
                }
                Some('\\') => v.push('\\'),
                Some('"') => v.push('"'),
                Some('\r') if c.get(i + 1) == Some(&'\n') => {
                    i += 1;
                    line += 1;
                }
                _ => return Err("bad escape in value"),
            }
            i += 1;
            continue;
        }
        v.push(ch);
        i += 1;
    }
    if quoted {
        return Err("unterminated quote");
    }
    Ok((v, i, line))
}

/// Files a config includes (`include.path`, `includeIf.*.path`), resolved
/// like git does: `~/` from HOME, relative to the including file's directory.
pub fn includes(entries: &[Entry], file: &Path) -> Vec<PathBuf> {
    let base = file.parent().unwrap_or(Path::new("/"));
    entries
        .iter()
        .filter(|e| {
            e.name == "path"
                && (e.section == "include" && e.sub.is_none()
                    || e.section == "includeif" && e.sub.is_some())
        })
        .filter_map(|e| e.value.as_deref())
        .map(|v| {
            if let Some(rest) = v.strip_prefix("~/") {
                PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(rest)
            } else {
                base.join(v)
            }
        })
        .collect()
}

/// The last value of `section.name` (no subsection).
pub fn get<'a>(entries: &'a [Entry], section: &str, name: &str) -> Option<&'a str> {
    entries
        .iter()
        .rev()
        .find(|e| e.section == section && e.sub.is_none() && e.name == name)
        .and_then(|e| e.value.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_git_syntax() {
        let t = "[core]\n\tbare = false\n\tfsmonitor = \"echo x\" # c\n[remote \"origin\"]\n\turl = /x\n[alias] st = !sh -c \\\n  'x'\n[Filter.Lfs]\n\tclean\n";
        let e = parse(t).unwrap();
        assert_eq!(e[0].key(), "core.bare");
        assert_eq!(e[1].value.as_deref(), Some("echo x"));
        assert!(e[1].is_dangerous());
        assert_eq!(e[2].key(), "remote.origin.url");
        assert_eq!(e[3].key(), "alias.st");
        assert!(e[3].value.as_deref().unwrap().starts_with("!sh -c "));
        assert!(e[3].is_dangerous());
        assert_eq!(e[4].key(), "filter.lfs.clean");
        assert!(e[4].is_dangerous());
        assert!(parse("[core\n").is_err());
        assert!(parse("x = 1\n").is_err());
    }

    #[test]
    fn include_paths() {
        let e =
            parse("[include]\npath = extra.cfg\n[includeIf \"gitdir:/x/\"]\npath = ~/y\n").unwrap();
        let inc = includes(&e, Path::new("/r/.git/config"));
        assert_eq!(inc[0], PathBuf::from("/r/.git/extra.cfg"));
        assert!(inc[1].ends_with("y"));
    }
}
