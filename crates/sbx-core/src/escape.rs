//! Escaping of untrusted text (file names, ref names, git output) before it
//! reaches a terminal.
//!
//! A name the sandbox chose can hold `\r`, ESC sequences (erase line, cursor
//! moves, OSC 0 to set the window title, OSC 52 to write the clipboard), C1
//! controls (a lone 0x9b byte is a CSI on some terminals) or bidi overrides
//! that reorder what is shown. Printed raw on stderr it could paint a fake
//! "ok" over an alert or write the user's clipboard. Every such character is
//! shown as a visible escape instead; a backslash is doubled so the output
//! stays unambiguous.

use std::borrow::Cow;
use std::ffi::OsStr;
use std::fmt::Write;
use std::os::unix::ffi::OsStrExt;

/// Whether `c` must not reach a terminal as it is.
fn dangerous(c: char) -> bool {
    c.is_control() // C0, DEL, C1 (U+0080..U+009F)
        || matches!(c,
            '\u{200e}' | '\u{200f}'          // LRM, RLM
            | '\u{202a}'..='\u{202e}'        // embeddings and overrides
            | '\u{2066}'..='\u{2069}'        // isolates
            | '\u{2028}' | '\u{2029}'        // line and paragraph separators
            | '\u{feff}')
}

/// `s` with every control character, bidi control and backslash escaped
/// (`\r`, `\n`, `\t`, `\e`, `\\`, `\xNN`, `\u{NNNN}`); borrowed when nothing
/// needs escaping.
pub fn terminal(s: &str) -> Cow<'_, str> {
    if !s.chars().any(|c| c == '\\' || dangerous(c)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        push(&mut out, c);
    }
    Cow::Owned(out)
}

/// [`terminal`] for a line whose backslashes are escapes of its own (a
/// tracing line quoting JSON or `{:?}` text, already escaped): control and
/// bidi characters are shown the same way, a backslash is left as it is
/// (doubled, `\"` in a JSON field would read `\\\"`).
pub fn controls(s: &str) -> Cow<'_, str> {
    if !s.chars().any(dangerous) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push(c),
            c => push(&mut out, c),
        }
    }
    Cow::Owned(out)
}

fn push(out: &mut String, c: char) {
    match c {
        '\\' => out.push_str("\\\\"),
        '\r' => out.push_str("\\r"),
        '\n' => out.push_str("\\n"),
        '\t' => out.push_str("\\t"),
        '\u{1b}' => out.push_str("\\e"),
        c if (c as u32) < 0x100 && dangerous(c) => {
            let _ = write!(out, "\\x{:02x}", c as u32);
        }
        c if dangerous(c) => {
            let _ = write!(out, "\\u{{{:04x}}}", c as u32);
        }
        c => out.push(c),
    }
}

/// A path or other OS string, escaped as by [`terminal`]; bytes that are
/// not UTF-8 are shown as `\xNN`.
pub fn os(s: &OsStr) -> String {
    bytes(s.as_bytes())
}

/// Raw bytes escaped as by [`terminal`]; invalid UTF-8 as `\xNN`.
pub fn bytes(mut b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len());
    loop {
        match std::str::from_utf8(b) {
            Ok(s) => {
                out.push_str(&terminal(s));
                return out;
            }
            Err(e) => {
                let (good, rest) = b.split_at(e.valid_up_to());
                // `good` is valid UTF-8 by construction.
                out.push_str(&terminal(std::str::from_utf8(good).unwrap_or("")));
                let n = e.error_len().unwrap_or(rest.len()).max(1);
                for x in &rest[..n] {
                    let _ = write!(out, "\\x{x:02x}");
                }
                b = &rest[n..];
            }
        }
    }
}

/// A path escaped for a terminal.
pub fn path(p: &std::path::Path) -> String {
    os(p.as_os_str())
}

/// Undoes /proc/self/mountinfo's escapes of a field: the kernel writes a
/// space, tab, newline or backslash in a path as `\ooo` (three octal
/// digits). Anything else stays as it is.
pub fn mountinfo_field(f: &str) -> Vec<u8> {
    let b = f.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        if b[i] == b'\\'
            && let Some(d) = oct
            && d[0] <= b'3'
        {
            out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_fields_are_unescaped() {
        assert_eq!(mountinfo_field(r"/a\040b\011c\134d"), b"/a b\tc\\d");
        // Not an escape the kernel writes: kept as it is.
        assert_eq!(mountinfo_field(r"/x\777\12"), br"/x\777\12");
    }

    #[test]
    fn plain_text_is_borrowed() {
        assert!(matches!(terminal("src/app/main.rs"), Cow::Borrowed(_)));
    }

    #[test]
    fn controls_and_escapes_are_visible() {
        // A fake "ok" over the alert: carriage return and erase line.
        let s = "evil\r\u{1b}[2Kok: all clean";
        let e = terminal(s);
        assert_eq!(e, "evil\\r\\e[2Kok: all clean");
        assert!(!e.contains('\r') && !e.contains('\u{1b}'));
        // OSC 52 (clipboard) and OSC 0 (title), BEL and ST terminated.
        let osc = "x\u{1b}]52;c;ZWNobyBwd25lZA==\u{7}y\u{1b}]0;title\u{1b}\\";
        let e = terminal(osc);
        assert!(!e.chars().any(|c| c.is_control()), "{e}");
        assert!(e.contains("\\e]52;c;"));
        assert!(e.contains("\\x07"));
        // C1 CSI, DEL, bidi override, backslash.
        assert_eq!(terminal("a\u{9b}b\u{7f}"), "a\\x9bb\\x7f");
        assert_eq!(terminal("a\u{202e}b"), "a\\u{202e}b");
        assert_eq!(terminal("a\\b"), "a\\\\b");
    }

    #[test]
    fn controls_escapes_the_same_and_keeps_backslashes() {
        let s = "a\nb\rc\u{1b}d\u{1}e\\f";
        assert_eq!(terminal(s), "a\\nb\\rc\\ed\\x01e\\\\f");
        assert_eq!(controls(s), "a\\nb\\rc\\ed\\x01e\\f");
        assert!(matches!(controls("x\\y"), Cow::Borrowed(_)));
    }

    #[test]
    fn invalid_utf8_bytes_are_hex() {
        assert_eq!(bytes(b"a\xffb\x1b"), "a\\xffb\\e");
        assert_eq!(bytes(b"\x9b31m"), "\\x9b31m");
    }
}
