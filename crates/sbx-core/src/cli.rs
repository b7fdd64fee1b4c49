//! argv, `--config`, diagnostics and the one place where failures become an
//! exit status.
//!
//! `--config FILE` holds the same settings as the flags: the section named
//! after the tool is an object whose keys are long flag names and whose
//! values are strings, numbers, booleans (a switch) or arrays (a repeated
//! flag). They are turned into flags placed before the command line's own,
//! so a flag given on the command line overrides a single-valued setting and
//! adds to a repeated one. Nothing after the first `--` is ever parsed.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::ArgAction;
use serde_json::Value;

use crate::exit::Failure;

/// Tool sections a config file may hold (a file compiled by sbx-policy holds
/// several); any other top-level key is an error.
pub const TOOLS: &[&str] = &[
    "sbx-creds",
    "sbx-gitguard",
    "sbx-cgroup",
    "sbx-net",
    "sbx-dnsproxy",
    "sbx-fs",
    "sbx-seccomp",
    "sbx-container",
    "sbx-gvisor",
    "sbx-vm",
    "sbx-path",
    "sbx-policy",
    "sbx-audit",
    "sbx-doctor",
    "sbx-wasm",
];

/// The long name of `--config` (one definition: the flag, its search in
/// argv and [`config_args`]).
const CONFIG_LONG: &str = "config";

/// `--config FILE`, as a chain passes a tool its section.
pub fn config_args(file: &Path) -> [OsString; 2] {
    [format!("--{CONFIG_LONG}").into(), file.into()]
}

/// Flags every tool takes.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct CommonArgs {
    /// Append audit events (JSON lines) to PATH; the file is created 0600.
    #[arg(long, value_name = "PATH", env = "SBX_AUDIT_LOG", global = true)]
    pub audit_log: Option<PathBuf>,

    /// Read settings from FILE (JSON; the section named after the tool, keys
    /// are the long flag names).
    #[arg(long = CONFIG_LONG, value_name = "FILE", global = true)]
    pub config: Option<PathBuf>,

    /// More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG
    /// takes a tracing filter and wins.
    #[arg(short, long, action = ArgAction::Count, global = true)]
    pub verbose: u8,
}

/// Runs a tool's real main and exits: `Ok(code)` exits with code, a
/// [`Failure`] prints `tool: message` on stderr and exits with its code.
/// Blocks the forwarded signals first, so every thread inherits the mask.
/// A write to a closed stdout pipe (`sbx-policy compile | true`) ends the
/// tool quietly by SIGPIPE, as coreutils do; any other failed write to
/// stdout is one line and 125 ([`quiet_broken_pipe`]).
pub fn run_main<F>(tool: &'static str, f: F) -> !
where
    F: FnOnce() -> Result<i32, Failure>,
{
    quiet_broken_pipe(tool);
    // The environment settings first: bad input, before anything is set up.
    let code = match check_env()
        .and_then(|()| {
            crate::signals::block_forwarded().map_err(|e| Failure::new(format!("sigprocmask: {e}")))
        })
        .and_then(|()| f())
    {
        // A run that went through: what the sandbox was refused (a tool
        // failure stays one line).
        Ok(c) => {
            crate::audit::finish_run();
            c
        }
        Err(fail) => {
            // To the audit log only: the one stderr line below says it
            // (a tracing line too would make bad input two lines).
            if fail.code == crate::exit::TOOL_FAILED
                && let Some(a) = crate::audit::get()
            {
                a.record(
                    "setup_failed",
                    crate::Severity::Warn,
                    serde_json::json!({ "error": fail.message }),
                );
            }
            // (Not `eprintln!`, which panics when stderr is gone: the
            // exit status stays the failure's.)
            stderr_line(&fail_line(tool, &fail.message));
            fail.code
        }
    };
    std::process::exit(code)
}

/// Writes `line` and a newline to stderr, ignoring a failure: with stderr
/// gone (a pipe whose reader left) `eprintln!` panics, which would skip a
/// tool's clean-up and make its exit status 101.
pub fn stderr_line(line: &str) {
    let mut b = Vec::with_capacity(line.len() + 1);
    b.extend_from_slice(line.as_bytes());
    b.push(b'\n');
    let _ = std::io::Write::write_all(&mut std::io::stderr(), &b);
}

/// `tool: message` as one stderr line: the message holds the raw text
/// (paths and values the sandbox or the caller may have chosen) and is
/// escaped here, once ([`crate::escape::terminal`]: a newline is `\n`, ESC
/// `\e`, never a space or a second line), and capped at [`MESSAGE_CAP`].
/// Escape nothing before: a message escaped twice shows `\\e`.
pub fn fail_line(tool: &str, message: &str) -> String {
    format!("{tool}: {}", crate::escape::terminal(&capped(message)))
}

/// A failure's message at most [`MESSAGE_CAP`] bytes: messages quote the
/// input that was wrong, and a one-megabyte allow-file line is no line
/// for a terminal (the audit log keeps the whole message).
const MESSAGE_CAP: usize = 4096;

fn capped(m: &str) -> std::borrow::Cow<'_, str> {
    if m.len() <= MESSAGE_CAP {
        return std::borrow::Cow::Borrowed(m);
    }
    let mut end = MESSAGE_CAP;
    while !m.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!("{}... ({} bytes more)", &m[..end], m.len() - end))
}

/// Makes a failed `println!` end the process as a failed write, not as a
/// panic (exit 101 and a backtrace). A broken stdout ends it quietly, the
/// way coreutils end with SIGPIPE's default action: "failed printing to
/// stdout: Broken pipe" (the Rust runtime ignores SIGPIPE, so a write
/// returns EPIPE) becomes death by SIGPIPE, with no message. Any other
/// write error (a full device, EIO) is one line naming stdout and exit
/// 125, like [`write_stdout`]'s. SIGPIPE itself stays ignored, so a
/// supervisor writing to a dead socket or pipe still sees EPIPE and
/// carries on; every other panic keeps the default report.
pub fn quiet_broken_pipe(tool: &'static str) {
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if let Some(why) = msg.strip_prefix("failed printing to stdout: ") {
            if is_epipe_text(msg) {
                die_of_sigpipe();
            }
            stderr_line(&format!("{tool}: write stdout: {why}"));
            std::process::exit(crate::exit::TOOL_FAILED);
        }
        prev(info)
    }));
}

fn is_epipe_text(msg: &str) -> bool {
    msg.contains(&format!("(os error {})", libc::EPIPE))
}

/// Ends the process the way a write to a closed pipe ends a C program:
/// killed by SIGPIPE (status 128+13 in a shell), nothing on stderr.
pub fn die_of_sigpipe() -> ! {
    // SAFETY: restoring the default action and raising the signal touch
    // only this process's signal state; _exit is the fallback if SIGPIPE
    // could not be delivered (it never returns).
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(libc::SIGPIPE);
        libc::_exit(128 + libc::SIGPIPE)
    }
}

/// Writes `bytes` to stdout: EPIPE ends the tool quietly
/// ([`die_of_sigpipe`]), another error is a [`Failure`] naming stdout.
/// For printing loops that must stop at a closed reader.
pub fn write_stdout(bytes: &[u8]) -> Result<(), Failure> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EPIPE) => die_of_sigpipe(),
        Err(e) => Err(Failure::new(format!("write stdout: {e}"))),
    }
}

/// Parses argv for a tool whose clap type is `C` (which flattens
/// [`CommonArgs`]), merging `--config`, then sets up tracing, SBX_ID, the
/// audit log and the parent watch. Help and version exit 0 here.
pub fn parse<C: clap::Parser>(tool: &'static str) -> Result<C, Failure> {
    parse_from(tool, std::env::args_os().collect())
}

/// [`parse`] over explicit arguments (argv[0] first).
pub fn parse_from<C: clap::Parser>(tool: &'static str, argv: Vec<OsString>) -> Result<C, Failure> {
    let cmd = C::command().args_override_self(true);
    let argv = with_config(&cmd, tool, argv)?;
    let matches = match cmd.try_get_matches_from(argv) {
        Ok(m) => m,
        Err(e) => return Err(clap_failure(e)),
    };
    let c = C::from_arg_matches(&matches).map_err(clap_failure)?;
    Ok(c)
}

/// Sets up what every tool needs once flags are parsed: diagnostics, SBX_ID,
/// the audit sink and the supervising-parent watch.
pub fn init(tool: &'static str, common: &CommonArgs) -> Result<(), Failure> {
    init_tracing(common.verbose);
    crate::id::ensure()?;
    crate::audit::init(tool, common.audit_log.as_deref())?;
    crate::supervise::init_parent_watch()?;
    Ok(())
}

fn clap_failure(e: clap::Error) -> Failure {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            std::process::exit(0);
        }
        _ => {
            let kind = e.kind();
            let mut first = clap_message(e);
            if first.is_empty() {
                first = "invalid arguments".into();
            }
            let hint = if kind == ErrorKind::MissingRequiredArgument && first.contains("CMD") {
                " (usage: ... -- CMD [ARGS...])"
            } else {
                ""
            };
            Failure::new(format!("{first}{hint}"))
        }
    }
}

/// clap's message on one line, without its "error: " prefix, usage and
/// tips, quoting every value whole: a value holding a newline cut the
/// message at it, and clap's rendering drops an ESC sequence or a control
/// character from the text (so `'a\x1b[2Kb'` was shown as `'ab'`). The
/// caller's strings are swapped for tokens before clap renders them and put
/// back raw after; the one stderr line escapes them ([`fail_line`]).
fn clap_message(mut e: clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let text = |e: &clap::Error, k| match e.get(k) {
        Some(ContextValue::String(s)) => Some(s.clone()),
        _ => None,
    };
    // A value parser's error is clap's source, not a context value: the
    // message is clap's wording, made here with the error whole.
    if e.kind() == ErrorKind::ValueValidation
        && let (Some(arg), Some(v), Some(src)) = (
            text(&e, ContextKind::InvalidArg),
            text(&e, ContextKind::InvalidValue),
            std::error::Error::source(&e),
        )
    {
        return format!("invalid value '{v}' for '{arg}': {src}");
    }
    let nonce = crate::id::random_suffix();
    let mut held: Vec<(String, String)> = Vec::new();
    let mut hold = |v: String| -> String {
        if !v.chars().any(char::is_control) {
            return v;
        }
        let token = format!("\u{e000}{nonce}{}\u{e001}", held.len());
        held.push((token.clone(), v));
        token
    };
    for k in [
        ContextKind::InvalidValue,
        ContextKind::InvalidArg,
        ContextKind::InvalidSubcommand,
    ] {
        let swapped = match e.get(k) {
            Some(ContextValue::String(v)) => ContextValue::String(hold(v.clone())),
            Some(ContextValue::Strings(v)) => {
                ContextValue::Strings(v.iter().cloned().map(&mut hold).collect())
            }
            _ => continue,
        };
        e.insert(k, swapped);
    }
    let rendered = e.render().to_string();
    let mut lines = rendered.lines();
    let first = lines.next().unwrap_or("");
    let first = first.strip_prefix("error: ").unwrap_or(first);
    // "the following required arguments were not provided:" lists them on
    // the next lines: keep them on the one line.
    let mut first = first.to_string();
    if first.ends_with(':') {
        for l in lines.take_while(|l| !l.trim().is_empty()) {
            first.push(' ');
            first.push_str(l.trim());
        }
    }
    for (token, v) in &held {
        first = first.replace(token.as_str(), v);
    }
    first
}

/// The environment settings every tool reads, checked before anything is
/// set up: a bad one is one line naming the variable and its value, exit
/// 125, never ignored or only warned about (`SBX_KILL_AFTER=10x` used to
/// mean 10 s, `SBX_LOG=sbx=verbose` the default level). Empty is unset.
pub fn check_env() -> Result<(), Failure> {
    for name in [LOG_ENV, crate::supervise::ENV_KILL_AFTER, crate::id::ENV] {
        let Some(raw) = std::env::var_os(name) else {
            continue;
        };
        let Some(v) = raw.to_str() else {
            return Err(Failure::new(format!(
                "{name} '{}': not UTF-8",
                raw.to_string_lossy()
            )));
        };
        // SBX_ID's value is checked by `id::ensure` (only a value that is
        // not UTF-8 was taken for unset).
        if v.is_empty() || name == crate::id::ENV {
            continue;
        }
        let bad = |why: String| Err(Failure::new(format!("{name} '{v}': {why}")));
        if name == LOG_ENV {
            if v.chars().any(char::is_control) {
                return bad("a control character in a diagnostics filter".into());
            }
            if let Err(e) = tracing_subscriber::EnvFilter::try_new(v) {
                return bad(format!(
                    "not a diagnostics filter (e.g. debug, sbx_fs=trace): {e}"
                ));
            }
        } else if let Err(e) = crate::units::parse_duration(v) {
            return bad(e.to_string());
        }
    }
    Ok(())
}

/// The diagnostics filter variable.
pub const LOG_ENV: &str = "SBX_LOG";

/// Inserts the `--config` section's settings as flags after argv[0] (and
/// after a leading subcommand name, for tools with subcommands).
fn with_config(
    cmd: &clap::Command,
    tool: &str,
    argv: Vec<OsString>,
) -> Result<Vec<OsString>, Failure> {
    let Some(path) = find_config_flag(&argv)? else {
        return Ok(argv);
    };
    let section = load_section(&path, tool)?;
    let Some(section) = section else {
        return Ok(argv);
    };
    // A tool with subcommands: the settings belong to the subcommand named,
    // wherever it stands among the global flags.
    let (target, insert_at) = match subcommand_at(cmd, &argv) {
        Some((sub, i)) => (sub, i + 1),
        None => (cmd, 1),
    };
    let flags = section_to_flags(target, &path, tool, &section)?;
    let mut out = argv[..insert_at.min(argv.len())].to_vec();
    out.extend(flags);
    out.extend(argv.into_iter().skip(insert_at));
    Ok(out)
}

/// The subcommand named in argv and its index: the first word before `--`
/// that is not a global flag or a global flag's value.
fn subcommand_at<'a>(
    cmd: &'a clap::Command,
    argv: &[OsString],
) -> Option<(&'a clap::Command, usize)> {
    let mut i = 1;
    while let Some(a) = argv.get(i).and_then(|a| a.to_str()) {
        if a == "--" {
            return None;
        }
        if let Some(long) = a.strip_prefix("--") {
            let takes = cmd
                .get_arguments()
                .find(|x| x.get_long() == Some(long))
                .is_some_and(|x| x.get_action().takes_values());
            i += if takes { 2 } else { 1 };
            continue;
        }
        if a.starts_with('-') {
            i += 1;
            continue;
        }
        return cmd.find_subcommand(a).map(|s| (s, i));
    }
    None
}

/// Finds `--config FILE` / `--config=FILE` before the first `--`.
fn find_config_flag(argv: &[OsString]) -> Result<Option<PathBuf>, Failure> {
    let flag = format!("--{CONFIG_LONG}");
    let mut it = argv.iter().skip(1);
    while let Some(a) = it.next() {
        if a == "--" {
            break;
        }
        if *a == *flag {
            return match it.next() {
                Some(v) if v != "--" => Ok(Some(PathBuf::from(v))),
                _ => Err(Failure::new("--config needs a FILE")),
            };
        }
        if let Some(v) = a
            .to_str()
            .and_then(|s| s.strip_prefix(flag.as_str())?.strip_prefix('='))
        {
            return Ok(Some(PathBuf::from(v)));
        }
    }
    Ok(None)
}

/// Reads `path` and returns the object under `tool`, checking that every
/// top-level key is a known tool.
pub fn load_section(
    path: &Path,
    tool: &str,
) -> Result<Option<serde_json::Map<String, Value>>, Failure> {
    let text = crate::input::read_regular_string(path, crate::input::CONFIG_CAP)
        .map_err(|e| Failure::new(format!("--config {}: {e}", path.display())))?;
    let v: Value = serde_json::from_str(&text)
        .map_err(|e| Failure::new(format!("--config {}: not valid JSON: {e}", path.display())))?;
    let Value::Object(top) = v else {
        return Err(Failure::new(format!(
            "--config {}: top level must be an object of tool sections",
            path.display()
        )));
    };
    for k in top.keys() {
        if !TOOLS.contains(&k.as_str()) {
            return Err(Failure::new(format!(
                "--config {}: unknown section '{k}' (expected one of {})",
                path.display(),
                TOOLS.join(", ")
            )));
        }
    }
    match top.get(tool) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m.clone())),
        Some(_) => Err(Failure::new(format!(
            "--config {}: section '{tool}' must be an object",
            path.display()
        ))),
    }
}

fn section_to_flags(
    cmd: &clap::Command,
    path: &Path,
    tool: &str,
    section: &serde_json::Map<String, Value>,
) -> Result<Vec<OsString>, Failure> {
    let bad = |key: &str, what: &str| {
        Failure::new(format!("--config {}: {tool}.{key}: {what}", path.display()))
    };
    let mut out = Vec::new();
    for (key, val) in section {
        let long = key.replace('_', "-");
        if long == CONFIG_LONG {
            return Err(bad(key, "a config file cannot name another"));
        }
        let Some(arg) = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(long.as_str()))
        else {
            return Err(bad(key, "unknown key"));
        };
        let flag = OsString::from(format!("--{long}"));
        let takes_value = arg.get_action().takes_values();
        let mut push_scalar = |v: &Value| -> Result<(), Failure> {
            let s = match v {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                _ => return Err(bad(key, "expected a string or number")),
            };
            out.push(flag.clone());
            out.push(OsString::from(s));
            Ok(())
        };
        match (val, takes_value) {
            (Value::Null, _) => {}
            (Value::Bool(b), false) => {
                if *b {
                    out.push(flag.clone());
                }
            }
            (Value::Number(n), false) if matches!(arg.get_action(), ArgAction::Count) => {
                for _ in 0..n.as_u64().unwrap_or(0).min(8) {
                    out.push(flag.clone());
                }
            }
            (_, false) => return Err(bad(key, "is a switch: expected true or false")),
            (Value::Array(items), true) => {
                for i in items {
                    push_scalar(i)?;
                }
            }
            (v, true) => push_scalar(v)?,
        }
    }
    Ok(out)
}

/// tracing to stderr: SBX_LOG (a filter) wins, else the -v count.
pub fn init_tracing(verbose: u8) {
    init_tracing_quiet_level(verbose, "warn")
}

/// [`init_tracing`] with another level for no `-v` (a tool whose every
/// refusal already has its own stderr line says "error").
///
/// The HTTP, TLS and Vault client libraries never log, whatever the level:
/// at their debug levels they print request and response bodies, which hold
/// secrets (sbx-creds, sbx-vm, sbx-container fetch them), and at error level
/// multi-line dumps.
pub fn init_tracing_quiet_level(verbose: u8, quiet: &str) {
    use tracing_subscriber::EnvFilter;
    const SILENCED: &str =
        "vaultrs=off,rustify=off,reqwest=off,hyper=off,hyper_util=off,rustls=off,h2=off";
    // SBX_LOG was checked by `run_main` ([`check_env`]).
    let base = match std::env::var(LOG_ENV) {
        Ok(f) if !f.is_empty() => f,
        _ => match verbose {
            0 => quiet,
            1 => "info",
            2 => "debug",
            _ => "trace",
        }
        .to_string(),
    };
    let filter = EnvFilter::try_new(format!("{base},{SILENCED}"))
        .unwrap_or_else(|_| EnvFilter::new(format!("warn,{SILENCED}")));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(EscapedStderr)
        .with_target(false)
        .with_ansi(false)
        // Escaped by the writer, the one way every stderr line is.
        .with_ansi_sanitization(false)
        // A stderr that is gone (a pipe whose reader left) loses the
        // lines, never the tool: tracing-subscriber would report the
        // failed write with `eprintln!`, which panics there.
        .log_internal_errors(false)
        .try_init();
}

/// stderr for tracing: each event is one line whose control characters
/// are escaped ([`crate::escape::controls`]: a name holding a newline or a
/// carriage return in a warning neither makes a second line nor paints
/// over this one).
struct EscapedStderr;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for EscapedStderr {
    type Writer = EscapedLine;
    fn make_writer(&'a self) -> EscapedLine {
        EscapedLine
    }
}

struct EscapedLine;

impl std::io::Write for EscapedLine {
    /// tracing-subscriber writes each event whole, newline last.
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let (body, nl) = match buf.strip_suffix(b"\n") {
            Some(b) => (b, true),
            None => (buf, false),
        };
        let text = String::from_utf8_lossy(body);
        let mut out = crate::escape::controls(&text).into_owned().into_bytes();
        if nl {
            out.push(b'\n');
        }
        std::io::Write::write_all(&mut std::io::stderr(), &out)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::Write::flush(&mut std::io::stderr())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::io::Write;

    #[derive(Parser, Debug)]
    #[command(name = "sbx-demo")]
    struct Demo {
        #[command(flatten)]
        common: CommonArgs,
        #[arg(long)]
        ro: Vec<String>,
        #[arg(long)]
        hostname: Option<String>,
        #[arg(long)]
        clearenv: bool,
        #[arg(last = true, required = true, value_name = "CMD")]
        cmd: Vec<OsString>,
    }

    fn args(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn nothing_after_dashdash_is_parsed() {
        let d: Demo = parse_from(
            "sbx-demo",
            args(&["x", "--ro", "/a", "--", "cmd", "--ro", "--", "-v"]),
        )
        .unwrap();
        assert_eq!(d.ro, vec!["/a"]);
        assert_eq!(d.cmd, args(&["cmd", "--ro", "--", "-v"]));
    }

    #[test]
    fn missing_dashdash_and_unknown_flag_are_one_line_125() {
        let f = parse_from::<Demo>("sbx-demo", args(&["x", "--ro", "/a"])).unwrap_err();
        assert_eq!(f.code, 125);
        assert!(!f.message.contains('\n'));
        #[derive(Parser, Debug)]
        #[command(name = "sbx-demo")]
        struct Two {
            a: String,
            b: String,
        }
        let f = parse_from::<Two>("sbx-demo", args(&["x"])).unwrap_err();
        assert!(!f.message.contains('\n'));
        assert!(f.message.contains("<A> <B>"), "{}", f.message);
        let f = parse_from::<Demo>("sbx-demo", args(&["x", "--bogus", "--", "true"])).unwrap_err();
        assert_eq!(f.code, 125);
        assert!(f.message.contains("--bogus"), "{}", f.message);
    }

    /// A value holding a newline (or any control character) is quoted whole
    /// on one line, whatever part of clap's message quotes it: the value
    /// itself, a value parser's error, an unknown flag.
    #[test]
    fn a_value_with_control_characters_is_quoted_whole() {
        #[derive(Parser, Debug)]
        #[command(name = "sbx-demo")]
        struct Typed {
            #[arg(long)]
            listen: Option<std::net::SocketAddr>,
            #[arg(long, value_parser = ["a", "b"])]
            mode: Option<String>,
            #[arg(long, value_parser = |s: &str| -> Result<String, String> {
                Err(format!("'{s}' is not a name\nsecond line"))
            })]
            name: Option<String>,
        }
        let v = "a\nb\rc\u{1b}d\u{1}e";
        for (argv, want) in [
            (vec!["x", "--listen", v], v.to_string()),
            (vec!["x", "--mode", v], v.to_string()),
            (
                vec!["x", "--name", v],
                format!("'{v}' is not a name\nsecond line"),
            ),
        ] {
            let f = parse_from::<Typed>("sbx-demo", args(&argv)).unwrap_err();
            assert_eq!(f.code, 125);
            assert!(f.message.contains(&want), "{argv:?}: {:?}", f.message);
            assert!(
                !f.message.contains("For more information"),
                "{:?}",
                f.message
            );
            let line = fail_line("sbx-demo", &f.message);
            assert!(!line.chars().any(char::is_control), "{line:?}");
            assert!(line.contains("a\\nb\\rc\\ed\\x01e"), "{line}");
        }
        let arg = format!("--bo{v}gus");
        let f = parse_from::<Typed>("sbx-demo", args(&["x", &arg])).unwrap_err();
        assert!(f.message.contains(&arg), "{:?}", f.message);
    }

    #[test]
    fn config_merges_and_cli_overrides() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        write!(
            f,
            r#"{{"sbx-net": null, "sbx-fs": {{"ro": ["/a", "/b"], "hostname": "cfg", "clearenv": true}}}}"#
        )
        .unwrap();
        let p = f.path().to_str().unwrap();
        let d: Demo = parse_from(
            "sbx-fs",
            args(&[
                "x",
                "--config",
                p,
                "--ro",
                "/c",
                "--hostname",
                "cli",
                "--",
                "true",
            ]),
        )
        .unwrap();
        assert_eq!(d.ro, vec!["/a", "/b", "/c"]);
        assert_eq!(d.hostname.as_deref(), Some("cli"));
        assert!(d.clearenv);
    }

    #[test]
    fn config_errors() {
        let cases = [
            (r#"{"sbx-fs": {"nope": 1}}"#, "unknown key"),
            (r#"{"sbx-bogus": {}}"#, "unknown section"),
            (r#"{"sbx-fs": {"clearenv": "yes"}}"#, "switch"),
            (r#"{"sbx-fs": {"ro": [{}]}}"#, "string or number"),
            ("{not json", "not valid JSON"),
        ];
        for (text, want) in cases {
            let mut f = tempfile::NamedTempFile::new().unwrap();
            f.write_all(text.as_bytes()).unwrap();
            let p = f.path().to_str().unwrap();
            let e = parse_from::<Demo>("sbx-fs", args(&["x", "--config", p, "--", "true"]))
                .unwrap_err();
            assert_eq!(e.code, 125);
            assert!(e.message.contains(want), "{text}: {}", e.message);
        }
        let e = parse_from::<Demo>(
            "sbx-fs",
            args(&["x", "--config", "/nonexistent/c.json", "--", "true"]),
        )
        .unwrap_err();
        assert!(e.message.contains("/nonexistent/c.json"));
    }

    #[derive(Parser, Debug)]
    #[command(name = "sbx-demo2")]
    struct Sub {
        #[command(flatten)]
        common: CommonArgs,
        #[command(subcommand)]
        cmd: SubCmd,
    }

    #[derive(clap::Subcommand, Debug)]
    enum SubCmd {
        Check {
            #[arg(long)]
            repo: Option<String>,
        },
    }

    /// The section applies to the subcommand wherever the global flags put
    /// it: `tool --audit-log X check --config F` as well as `tool check ...`.
    #[test]
    fn config_reaches_a_subcommand_after_global_flags() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        write!(f, r#"{{"sbx-gitguard": {{"repo": "/r"}}}}"#).unwrap();
        let p = f.path().to_str().unwrap();
        for argv in [
            vec!["x", "check", "--config", p],
            vec!["x", "--audit-log", "/dev/null", "check", "--config", p],
            vec!["x", "-v", "--config", p, "check"],
            vec!["x", "--audit-log=/dev/null", "check", "--config", p],
        ] {
            let d: Sub = parse_from("sbx-gitguard", args(&argv)).unwrap();
            let SubCmd::Check { repo } = d.cmd;
            assert_eq!(repo.as_deref(), Some("/r"), "{argv:?}");
        }
    }
}
