//! sbx-audit: proves an sbx audit log was neither cut nor edited (its hash
//! chain, see `sbx_core::auditchain`) and shows it for people.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};
use sbx_core::Failure;
use sbx_core::auditchain::{ZERO, line_hash};
use sbx_core::cli::CommonArgs;
use serde_json::{Value, json};

pub const TOOL: &str = "sbx-audit";

pub const MAN: sbx_core::man::ManInfo = sbx_core::man::ManInfo {
    about: "sbx-audit reads the JSON-lines audit log the sbx tools write. Every line carries seq (0 for the first line of the file, then one more per line) and prev (the SHA-256, hex, of the exact bytes of the line before, newline included; 64 zeros for the first line). `verify` walks that chain and says where it breaks: a line that was edited breaks the next line's prev, a line removed, inserted or moved breaks seq, a line appended without the chain has no seq/prev, a log whose first lines were cut starts with seq > 0, a torn last line has no newline. A cut tail or an emptied file leaves a valid shorter chain: keep the anchor verify prints (SEQ:HASH of the last line) somewhere the sandbox cannot write and pass it back with --anchor. The chain is a plain hash chain: it proves order and integrity against a writer without the whole tail; someone who can rewrite the file can also recompute it (the sbx tools never hand the sandboxed command a writable handle on the log). `show` and `tail` print the events for people: time, tool, severity, event and its subject (path, name, syscall, program, destination), coloured by severity on a terminal only, with control characters escaped.",
    exit_status: "verify: 0 the chain is whole (and matches --anchor), 1 it is broken (the first broken line is named), 125 bad input (unreadable file, bad flag).\n\nshow, tail: 0, or 125 on bad input.",
    inherited_state: "sbx-audit runs no command.",
    environment: "- NO_COLOR: when set and not empty, --color auto prints no colours.\n- TERM: dumb means no colours with --color auto.",
    extra: &[(
        "COMMANDS",
        "verify [--json] [--anchor SEQ:HASH] LOG\n\nCheck the chain. Prints `LOG: ok, N lines, anchor SEQ:HASH` or `LOG:LINE: broken: WHY`; --json prints one object: log, ok, lines, anchor, broken_line, reason.\n\nshow [--severity LEVEL] [--event NAME]... [--sbx-id ID] [--color WHEN] LOG\n\nOne line per event; --severity keeps events at or above LEVEL (info, warn, alert).\n\ntail [-n N] [filters] LOG\n\nThe last N (default 10) events that pass the filters.",
    )],
};

#[derive(Parser, Debug)]
#[command(
    name = "sbx-audit",
    version,
    about = "Verify an sbx audit log's hash chain; show its events for people"
)]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Check the hash chain; say where it breaks.
    Verify(VerifyArgs),
    /// Print the events for people.
    Show(ShowArgs),
    /// Print the last events for people.
    Tail(TailArgs),
}

#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// One JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// SEQ:HASH of a line recorded earlier (as printed by verify): it must
    /// still be there, unchanged (detects a cut tail or an emptied log).
    #[arg(long, value_name = "SEQ:HASH")]
    pub anchor: Option<String>,
    /// The audit log.
    pub log: PathBuf,
}

#[derive(Args, Debug, Clone)]
pub struct Filters {
    /// Only events at or above this severity.
    #[arg(long, value_enum)]
    pub severity: Option<Level>,
    /// Only these events (repeatable).
    #[arg(long, value_name = "NAME")]
    pub event: Vec<String>,
    /// Only this sandbox.
    #[arg(long, value_name = "ID")]
    pub sbx_id: Option<String>,
    /// Colour by severity: auto (on a terminal), always, never.
    #[arg(long, value_enum, default_value_t = When::Auto)]
    pub color: When,
}

#[derive(Args, Debug)]
pub struct ShowArgs {
    #[command(flatten)]
    pub filters: Filters,
    /// The audit log.
    pub log: PathBuf,
}

#[derive(Args, Debug)]
pub struct TailArgs {
    /// How many events.
    #[arg(short = 'n', long, default_value_t = 10)]
    pub lines: usize,
    #[command(flatten)]
    pub filters: Filters,
    /// The audit log.
    pub log: PathBuf,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Info,
    Warn,
    Alert,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    Auto,
    Always,
    Never,
}

/// What [`verify`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub lines: u64,
    /// SEQ:HASH of the last whole line, when there is one.
    pub anchor: Option<String>,
    /// (1-based line number, why) of the first break.
    pub broken: Option<(u64, String)>,
}

/// Walks the chain of `text` (a whole log); `anchor` is SEQ:HASH of a line
/// that must still be there.
pub fn verify(text: &[u8], anchor: Option<(u64, &str)>) -> Verdict {
    let mut v = Verdict {
        lines: 0,
        anchor: None,
        broken: None,
    };
    let mut prev_hash = ZERO.to_string();
    let mut next_seq = 0u64;
    let mut anchor_seen = false;
    for (i, line) in text.split_inclusive(|b| *b == b'\n').enumerate() {
        let n = i as u64 + 1;
        let brk = |why: String| Some((n, why));
        if line.last() != Some(&b'\n') {
            v.broken = brk(
                "torn line (no newline): the log was cut mid-line or written without the chain"
                    .into(),
            );
            return v;
        }
        let Ok(Value::Object(m)) = serde_json::from_slice::<Value>(line) else {
            v.broken = brk("not a JSON object".into());
            return v;
        };
        let (Some(seq), Some(prev)) = (
            m.get("seq").and_then(Value::as_u64),
            m.get("prev").and_then(Value::as_str),
        ) else {
            v.broken =
                brk("no seq/prev: a line not written by an sbx tool (forged, or unchained)".into());
            return v;
        };
        if seq != next_seq {
            v.broken = brk(if n == 1 {
                format!("the first line has seq {seq}: {seq} earlier lines were removed")
            } else {
                format!("seq {seq}, expected {next_seq}: a line was removed, inserted or moved")
            });
            return v;
        }
        if prev != prev_hash {
            v.broken = brk(if n == 1 {
                "the first line does not start the chain (prev is not zero)".into()
            } else {
                format!("prev does not match line {}: that line was edited", n - 1)
            });
            return v;
        }
        prev_hash = line_hash(line);
        if let Some((aseq, ahash)) = anchor
            && aseq == seq
        {
            if ahash != prev_hash {
                v.broken = brk(format!(
                    "the anchor {aseq}:{ahash} does not match this line: it was rewritten"
                ));
                return v;
            }
            anchor_seen = true;
        }
        next_seq = seq + 1;
        v.lines = n;
        v.anchor = Some(format!("{seq}:{prev_hash}"));
    }
    if let Some((aseq, _)) = anchor
        && !anchor_seen
    {
        v.broken = Some((
            v.lines + 1,
            format!(
                "no line with seq {aseq} (the anchor): the log was cut after line {}",
                v.lines
            ),
        ));
    }
    v
}

fn parse_anchor(s: &str) -> Result<(u64, &str), Failure> {
    let bad = || Failure::new(format!("--anchor '{s}': want SEQ:HASH (as verify prints)"));
    let (q, h) = s.split_once(':').ok_or_else(bad)?;
    let q = q.parse().map_err(|_| bad())?;
    if h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    Ok((q, h))
}

/// Logs larger than this are refused whole (one line, 125), not read into
/// memory: rotate them.
const LOG_CAP: u64 = 1 << 30;

/// The log, read as every file named on a command line is (a regular file,
/// never a FIFO, /dev/zero or a directory; capped; a termination signal
/// stops the read).
fn read(p: &Path) -> Result<Vec<u8>, Failure> {
    sbx_core::input::read_regular(p, LOG_CAP)
        .map_err(|e| Failure::new(format!("read {}: {e}", p.display())))
}

fn cmd_verify(a: VerifyArgs) -> Result<i32, Failure> {
    let anchor = a.anchor.as_deref().map(parse_anchor).transpose()?;
    let text = read(&a.log)?;
    let v = verify(&text, anchor);
    let shown = a.log.display();
    if a.json {
        let o = json!({
            "log": a.log,
            "ok": v.broken.is_none(),
            "lines": v.lines,
            "anchor": v.anchor,
            "broken_line": v.broken.as_ref().map(|b| b.0),
            "reason": v.broken.as_ref().map(|b| b.1.clone()),
        });
        println!("{o}");
    } else {
        match &v.broken {
            None => println!(
                "{shown}: ok, {} lines, anchor {}",
                v.lines,
                v.anchor.as_deref().unwrap_or("none (empty)")
            ),
            Some((n, why)) => println!("{shown}:{n}: broken: {why}"),
        }
    }
    Ok(if v.broken.is_none() { 0 } else { 1 })
}

/// Control characters, bidi overrides and backslashes escaped (shared with
/// the end-of-run summary).
pub use sbx_core::violations::escape;

fn level(v: &Value) -> Level {
    match v["severity"].as_str() {
        Some("alert") => Level::Alert,
        Some("warn") => Level::Warn,
        _ => Level::Info,
    }
}

fn passes(f: &Filters, v: &Value) -> bool {
    f.severity.is_none_or(|s| level(v) >= s)
        && (f.event.is_empty() || f.event.iter().any(|e| v["event"] == *e.as_str()))
        && f.sbx_id
            .as_ref()
            .is_none_or(|id| v["sbx_id"] == *id.as_str())
}

/// One event as a line for people.
pub fn render(v: &Value, color: bool) -> String {
    let s = |k: &str| v[k].as_str().map(escape).unwrap_or_else(|| "-".into());
    let subject = v
        .as_object()
        .map(sbx_core::violations::subject)
        .unwrap_or_default();
    let sev = s("severity");
    let sev_shown = if color {
        let code = match level(v) {
            Level::Alert => "1;31",
            Level::Warn => "33",
            Level::Info => "2",
        };
        format!("\x1b[{code}m{sev:<5}\x1b[0m")
    } else {
        format!("{sev:<5}")
    };
    format!(
        "{} {:<12} {sev_shown} {:<20} {subject}",
        s("ts"),
        s("tool"),
        s("event")
    )
    .trim_end()
    .to_string()
}

fn use_color(w: When) -> bool {
    match w {
        When::Always => true,
        When::Never => false,
        // no-color.org: any non-empty NO_COLOR turns colour off in auto.
        When::Auto => {
            std::io::stdout().is_terminal()
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
                && std::env::var_os("TERM").is_none_or(|t| t != "dumb")
        }
    }
}

fn events(text: &[u8], f: &Filters) -> Vec<String> {
    let color = use_color(f.color);
    text.split(|b| *b == b'\n')
        .enumerate()
        .filter(|(_, l)| !l.is_empty())
        .filter_map(|(i, l)| match serde_json::from_slice::<Value>(l) {
            Ok(v) if v.is_object() => passes(f, &v).then(|| render(&v, color)),
            _ => Some(format!("(line {}: not a JSON object)", i + 1)),
        })
        .collect()
}

/// A closed pipe (`| head`) ends us quietly, as coreutils; another failed
/// write (a full device) is a failure: the events were not shown.
fn print(lines: &[String]) -> Result<i32, Failure> {
    let mut text = String::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
    for l in lines {
        text.push_str(l);
        text.push('\n');
    }
    sbx_core::cli::write_stdout(text.as_bytes())?;
    Ok(0)
}

pub fn main() -> ! {
    sbx_core::cli::run_main(TOOL, || {
        let cli: Cli = sbx_core::cli::parse(TOOL)?;
        sbx_core::cli::init_tracing(cli.common.verbose);
        match cli.command {
            Command::Verify(a) => cmd_verify(a),
            Command::Show(a) => print(&events(&read(&a.log)?, &a.filters)),
            Command::Tail(a) => {
                let all = events(&read(&a.log)?, &a.filters);
                print(&all[all.len().saturating_sub(a.lines)..])
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(n: usize) -> Vec<String> {
        let mut prev = ZERO.to_string();
        (0..n)
            .map(|i| {
                let l = format!(
                    "{{\"seq\":{i},\"prev\":\"{prev}\",\"event\":\"e{i}\",\"severity\":\"alert\"}}\n"
                );
                prev = line_hash(l.as_bytes());
                l
            })
            .collect()
    }

    #[test]
    fn whole_chain_is_ok_and_each_tampering_is_found_where_it_is() {
        let c = chain(4);
        let ok = verify(c.concat().as_bytes(), None);
        assert_eq!(ok.broken, None);
        assert_eq!(ok.lines, 4);
        // edited line 2 -> line 3 breaks
        let mut e = c.clone();
        e[1] = e[1].replace("e1", "ex");
        assert_eq!(verify(e.concat().as_bytes(), None).broken.unwrap().0, 3);
        // removed line 2
        let mut r = c.clone();
        r.remove(1);
        assert_eq!(verify(r.concat().as_bytes(), None).broken.unwrap().0, 2);
        // reordered
        let mut o = c.clone();
        o.swap(1, 2);
        assert_eq!(verify(o.concat().as_bytes(), None).broken.unwrap().0, 2);
        // head cut
        assert!(
            verify(c[1..].concat().as_bytes(), None)
                .broken
                .unwrap()
                .1
                .contains("removed")
        );
        // forged line appended without the chain
        let f = format!("{}{{\"event\":\"forged\"}}\n", c.concat());
        assert_eq!(verify(f.as_bytes(), None).broken.unwrap().0, 5);
        // torn tail
        let t = c.concat();
        assert_eq!(
            verify(&t.as_bytes()[..t.len() - 3], None).broken.unwrap().0,
            4
        );
        // tail cut: only the anchor tells
        let a = ok.anchor.unwrap();
        let (q, h) = parse_anchor(&a).unwrap();
        assert_eq!(verify(c.concat().as_bytes(), Some((q, h))).broken, None);
        assert!(verify(c[..3].concat().as_bytes(), None).broken.is_none());
        assert!(
            verify(c[..3].concat().as_bytes(), Some((q, h)))
                .broken
                .is_some()
        );
        assert!(verify(b"", Some((q, h))).broken.is_some());
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(escape("a\x1b[2Jb\n"), "a\\e[2Jb\\n");
        assert_eq!(escape("x\u{202e}y"), "x\\u{202e}y");
        let v = json!({"ts":"t","tool":"sbx-fs","event":"fs_denied","severity":"alert","path":"/p\x1b]0;x\x07"});
        let r = render(&v, false);
        assert!(!r.contains('\x1b') && !r.contains('\x07'), "{r:?}");
        assert!(r.contains("path=/p\\e]0;x\\x07"));
    }
}
