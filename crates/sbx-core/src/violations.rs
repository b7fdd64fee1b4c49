//! What the sandbox was refused, told to the caller (the agent) in a form
//! it can act on: at the end of a run, the tool that owns the run's log
//! (the one that opened it, or the tool it exec'd into) prints one block on
//! stderr,
//!
//! ```text
//! <sandbox_violations sbx_id="..." count="N">
//! fs_denied path=/home/u/.ssh/id_rsa (sbx-fs)
//! syscall_denied syscall=unshare (sbx-seccomp) x3
//! </sandbox_violations>
//! ```
//!
//! and, when `SBX_VIOLATIONS=FILE` is set, writes the same as one JSON
//! object to FILE (created 0600, replaced): `{sbx_id, count, violations:
//! [{tool, event, subject, count}]}`. Both come from the audit log lines of
//! this run (this `sbx_id`, severity `alert`, after the offset where the run
//! started). Without `--audit-log` the first tool keeps the run's lines in
//! an in-memory log (a memfd handed down the chain like a log file, see
//! [`crate::audit`]), so the summary is printed all the same, with a last
//! line saying how to keep the details; alerts are not also lines on stderr
//! as they happen (`tests/netgaps.rs`
//! `without_an_audit_log_alerts_and_the_summary_reach_stderr`).

use std::os::fd::RawFd;

use serde_json::{Map, Value, json};

/// Where the run's lines start in the log, for a tool exec'd in place
/// that takes over the summary.
pub const ENV_START: &str = "SBX_AUDIT_START";
/// A file the caller reads the summary from.
pub const ENV_FILE: &str = "SBX_VIOLATIONS";

/// The last line inside the block of a run without `--audit-log`.
pub const NO_LOG_NOTE: &str =
    "(no audit log kept: every event with its details: rerun with --audit-log FILE)\n";

/// Most distinct violations listed.
const MAX_LISTED: usize = 30;

/// The keys that name what an event was about, in order of preference.
pub const SUBJECT_KEYS: &[&str] = &[
    "path", "name", "syscall", "program", "domain", "dest", "addr", "repo", "ref", "error",
];

/// `key=value` of an event's subject, control characters escaped.
pub fn subject(m: &Map<String, Value>) -> String {
    SUBJECT_KEYS
        .iter()
        .find_map(|k| {
            m.get(*k).filter(|x| !x.is_null()).map(|x| {
                let t = match x {
                    Value::String(t) => t.clone(),
                    o => o.to_string(),
                };
                format!("{k}={}", escape(&t))
            })
        })
        .unwrap_or_default()
}

/// A name chosen inside the sandbox, escaped for a terminal (one place:
/// [`crate::escape::terminal`]).
pub fn escape(s: &str) -> String {
    crate::escape::terminal(s).into_owned()
}

/// The summary of the alerts of `sbx_id` in `text` (JSON lines).
pub fn summarize(text: &[u8], sbx_id: &str) -> Option<Value> {
    // (tool, event, subject, count, hint: what to do, from the first event
    // of the kind that carries one)
    let mut list: Vec<(String, String, String, u64, Option<String>)> = Vec::new();
    let mut total = 0u64;
    for l in text.split(|b| *b == b'\n') {
        let Ok(Value::Object(m)) = serde_json::from_slice::<Value>(l) else {
            continue;
        };
        if m.get("sbx_id").and_then(Value::as_str) != Some(sbx_id)
            || m.get("severity").and_then(Value::as_str) != Some("alert")
        {
            continue;
        }
        total += 1;
        let tool = escape(m.get("tool").and_then(Value::as_str).unwrap_or("-"));
        let event = escape(m.get("event").and_then(Value::as_str).unwrap_or("-"));
        let subj = subject(&m);
        let hint = m.get("hint").and_then(Value::as_str).map(escape);
        match list
            .iter_mut()
            .find(|(t, e, s, _, _)| *t == tool && *e == event && *s == subj)
        {
            Some(x) => {
                x.3 += 1;
                if x.4.is_none() {
                    x.4 = hint;
                }
            }
            None => list.push((tool, event, subj, 1, hint)),
        }
    }
    if total == 0 {
        return None;
    }
    let more = list.len().saturating_sub(MAX_LISTED);
    list.truncate(MAX_LISTED);
    Some(json!({
        "sbx_id": sbx_id,
        "count": total,
        "more": more,
        "violations": list.iter().map(|(t, e, s, n, h)| {
            let mut v = json!({ "tool": t, "event": e, "subject": s, "count": n });
            if let Some(h) = h {
                v["hint"] = json!(h);
            }
            v
        }).collect::<Vec<_>>(),
    }))
}

/// The block for stderr.
pub fn render(v: &Value) -> String {
    let mut s = format!(
        "<sandbox_violations sbx_id=\"{}\" count=\"{}\">\n",
        v["sbx_id"].as_str().unwrap_or("-"),
        v["count"]
    );
    for x in v["violations"].as_array().into_iter().flatten() {
        let n = x["count"].as_u64().unwrap_or(1);
        s.push_str(&format!(
            "{} {} ({}){}\n",
            x["event"].as_str().unwrap_or("-"),
            x["subject"].as_str().unwrap_or(""),
            x["tool"].as_str().unwrap_or("-"),
            if n > 1 {
                format!(" x{n}")
            } else {
                String::new()
            }
        ));
        if let Some(h) = x["hint"].as_str() {
            s.push_str(&format!("  hint: {h}\n"));
        }
    }
    if v["more"].as_u64().unwrap_or(0) > 0 {
        s.push_str(&format!(
            "... {} more kinds: see the audit log\n",
            v["more"]
        ));
    }
    s.push_str("</sandbox_violations>\n");
    s
}

/// Reads the log from `start` (through `fd`, opened readable) and reports.
pub(crate) fn report(fd: RawFd, start: u64, file: Option<&std::path::Path>, mem: bool) {
    let Some(id) = crate::id::get() else { return };
    let mut text = Vec::new();
    let mut off = start;
    let mut buf = vec![0u8; 65536];
    loop {
        // SAFETY: reads into a live buffer.
        let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), off as libc::off_t) };
        if n <= 0 || text.len() > 64 << 20 {
            break;
        }
        text.extend_from_slice(&buf[..n as usize]);
        off += n as u64;
    }
    let Some(v) = summarize(&text, id) else {
        return;
    };
    let mut block = render(&v);
    if mem {
        // Where the details are: nowhere yet, so say how to keep them.
        let end = block.len() - "</sandbox_violations>\n".len();
        block.insert_str(end, NO_LOG_NOTE);
    }
    // Not `eprint!`: with stderr gone (a pipe whose reader left) that
    // panics, and the tool's exit status would be 101 instead of its own.
    let _ = std::io::Write::write_all(&mut std::io::stderr(), block.as_bytes());
    if let Some(p) = file {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let r = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(p)
            .and_then(|mut f| writeln!(f, "{v}"));
        if let Err(e) = r {
            let tool = crate::audit::get().map_or("sbx", |a| a.tool());
            crate::cli::stderr_line(&crate::cli::fail_line(
                tool,
                &format!("{ENV_FILE} {}: {e}", p.display()),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_counts_and_escapes() {
        let log = concat!(
            r#"{"sbx_id":"a","tool":"sbx-fs","event":"fs_denied","severity":"alert","path":"/x\u001b[2J"}"#,
            "\n",
            r#"{"sbx_id":"a","tool":"sbx-fs","event":"fs_denied","severity":"alert","path":"/x\u001b[2J"}"#,
            "\n",
            r#"{"sbx_id":"a","tool":"sbx-seccomp","event":"syscall_denied","severity":"alert","syscall":"unshare"}"#,
            "\n",
            r#"{"sbx_id":"a","tool":"sbx-fs","event":"start","severity":"info"}"#,
            "\n",
            r#"{"sbx_id":"b","tool":"sbx-fs","event":"fs_denied","severity":"alert","path":"/y"}"#,
            "\n",
        );
        let v = summarize(log.as_bytes(), "a").unwrap();
        assert_eq!(v["count"], 3);
        let r = render(&v);
        assert!(r.starts_with("<sandbox_violations sbx_id=\"a\" count=\"3\">\n"));
        assert!(r.contains("fs_denied path=/x\\e[2J (sbx-fs) x2\n"), "{r}");
        assert!(r.contains("syscall_denied syscall=unshare (sbx-seccomp)\n"));
        assert!(!r.contains("/y") && !r.contains('\x1b'));
        assert!(summarize(log.as_bytes(), "c").is_none());
    }

    #[test]
    fn a_hint_is_shown_under_its_kind() {
        let log = concat!(
            r#"{"sbx_id":"a","tool":"sbx-fs","event":"fs_write_denied","severity":"alert","path":"/p/.git/config","hint":"use git -c\u001b"}"#,
            "\n",
        );
        let r = render(&summarize(log.as_bytes(), "a").unwrap());
        assert!(
            r.contains("fs_write_denied path=/p/.git/config (sbx-fs)\n  hint: use git -c\\e\n"),
            "{r}"
        );
    }
}
