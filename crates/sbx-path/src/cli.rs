//! `sbx-path check` and `sbx-path normalise`: the library's rules from a
//! shell script.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand};
use sbx_core::Severity;
use sbx_core::cli::CommonArgs;
use serde_json::{Value, json};

use crate::{Access, Mode, PathError, PathResolver, Resolution};

const TOOL: &str = "sbx-path";

/// Exit status of a refused path.
pub const DENIED: i32 = 1;

pub const MAN: sbx_core::man::ManInfo = sbx_core::man::ManInfo {
    about: "sbx-path is the \"Minimal\" level of sbx: a library (the Rust crate sbx-path) for agents that \
run in-process without kernel isolation, and this command, which applies the same rules from a script. \
A PathResolver holds an allowlist of (path, read|write) rules; write implies read. Before every file \
operation the agent calls validate(path, mode), which normalises the path (collapses //, drops .), \
refuses any .. component, requires an absolute path (or one relative to --base), finds the governing \
rule (the longest rule path the path is beneath, compared component by component: /a/bc is not \
beneath /a/b; a narrower rule overrides a wider one), and opens the path with \
openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS) relative to an O_PATH fd of the rule's root, opened \
once, without following symlinks, when the resolver is built. The library hands back that fd, so \
there is no window between the check and the use.\n\n\
sbx-path check PATH MODE answers whether PATH may be used for MODE (read or write): it builds the \
resolver from --allow-read and --allow-write, validates PATH, and exits 0 when it is allowed, 1 with \
one line on stderr naming the rule or component that refused it. A write of a name that does not \
exist yet is allowed when its parent directory resolves beneath the rule (the library then creates \
it with O_CREAT|O_EXCL|O_NOFOLLOW). check opens the path with O_PATH only: it has no effect on the \
file (a FIFO or device is not opened for data) and does not test the file's own permission bits, \
only the rules, the path's existence and the absence of symlinks.\n\n\
sbx-path normalise PATH... prints the normalised form of each PATH, one per line, without touching \
the file system.",
    exit_status: "0: the path is allowed (check), or every path normalised (normalise).\n\n\
1: the path is refused: outside every rule, a write under a read-only rule, a .. component, a \
symlink in any component, a component that does not exist (for a write: the parent), a relative \
path without --base, or the system refused to resolve it. One line on stderr says which rule or \
component refused which path; --json also prints the verdict on stdout.\n\n\
125: sbx-path itself failed: bad usage (unknown flag, missing PATH or MODE, a MODE other than read \
or write), a rule that cannot be set up (its path has a .. or a symlink in it, or its parent does \
not exist), a bad --base, an unreadable --config, an unopenable --audit-log. One line on stderr.",
    inherited_state: "sbx-path runs no command: nothing is inherited from it. It does not modify \
the file system (check opens O_PATH fds only and closes them when it exits).",
    environment: "",
    extra: &[
        (
            "RULES",
            "- A rule is a path and a mode; --allow-write P allows reading and writing P and everything beneath it.\n\
- The governing rule is the longest rule path that the path is beneath, component-wise. /a write with /a/b read leaves /a/b read-only; /a/b read with /a write leaves everything else under /a writable.\n\
- The same path given as read and write keeps write.\n\
- Rule paths are normalised like any path and must not contain .. or a symlink: name the real path (/var/run, a symlink to /run on most systems, is refused as a rule).\n\
- A rule may name a file, or a name that does not exist yet: it is pinned through its parent directory, which must exist.\n\
- Rule roots are pinned when the resolver is built: a rule directory renamed or replaced later keeps pointing at the directory that was there.",
        ),
        (
            "AUDIT",
            "With --audit-log PATH (or SBX_AUDIT_LOG), check writes one JSON line per verdict: path_allowed (info) or path_denied. A denial by a rule (kinds traversal, not_allowed, read_only, symlink, escape) is an alert; any other refusal (not_found, not_a_directory, permission_denied, relative, nul_byte, empty, io) is a warn. Each event carries path, mode, kind, reason and, where there is one, rule and rule_mode.",
        ),
        (
            "ERROR KINDS",
            "Stable names (the library's PathError::kind(), the audit event's kind, the --json output's kind): traversal, not_allowed, read_only, symlink, escape, not_found, not_a_directory, exists, permission_denied, relative, nul_byte, empty, io, bad_rule, bad_base.",
        ),
        (
            "LIMITS",
            "This level protects code that calls validate before every file operation. It is not isolation: a process, library or subprocess that opens files by itself is not constrained, and nothing stops code from skipping the check. Use sbx-fs and the rest of the chain for kernel-enforced isolation.\n\n\
Hard links: a hard link is a second name for the same file, indistinguishable from the original. A hard link planted inside an allowed tree to a file outside it (for instance to ~/.ssh/id_rsa, on the same file system, by someone who may link it) is allowed by any path rule. Path rules cannot detect this; mount-based isolation (sbx-fs binds) or separate file systems can. Protected hard links (fs.protected_hardlinks=1) limit who can create them.\n\n\
Bind mounts and mount points inside an allowed tree are crossed: what is mounted there is allowed.\n\n\
check answers for the moment it runs; a script that then opens the path by name has a window in which it can change. The library does not have this window: it hands back the fd.",
        ),
        (
            "FALLBACK",
            "Where the kernel lacks openat2 (before Linux 5.6, or under a seccomp filter that refuses it), each component is opened with openat(O_PATH | O_NOFOLLOW) from the previous component's fd and checked with fstat to be a directory and not a symlink; the last with O_NOFOLLOW. The result is the same: no symlink is followed and no component is resolved twice. --resolve-with walk forces it (for tests).",
        ),
        (
            "EXAMPLES",
            "sbx-path check --allow-read /srv/repo --allow-write /srv/repo/out /srv/repo/src/main.rs read\n\n\
sbx-path check --allow-read /srv/repo /srv/repo/../etc/passwd read   (exit 1: traversal)\n\n\
sbx-path check --json --base /srv/repo --allow-write . build/log.txt write\n\n\
sbx-path normalise '/srv//repo/./src/'   (prints /srv/repo/src)",
        ),
    ],
};

#[derive(Parser, Debug)]
#[command(
    name = "sbx-path",
    version,
    about = "Check paths against an allowlist: no .., no symlinks, resolved beneath the rule (the Minimal level)",
    subcommand_required = true,
    arg_required_else_help = false
)]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonArgs,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Exit 0 when PATH may be used for MODE under the rules, 1 (one line on stderr) when it is refused.
    Check(CheckArgs),
    /// Print the normalised form of each PATH (no file system access); exit 1 if one is refused.
    #[command(alias = "normalize")]
    Normalise(NormaliseArgs),
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// Allow reading PATH and everything beneath it (repeatable).
    #[arg(long, value_name = "PATH")]
    pub allow_read: Vec<PathBuf>,

    /// Allow reading and writing PATH and everything beneath it (repeatable).
    #[arg(long, value_name = "PATH")]
    pub allow_write: Vec<PathBuf>,

    /// Take relative paths (PATH and the rules) relative to DIR (absolute); without it they are refused.
    #[arg(long, value_name = "DIR")]
    pub base: Option<PathBuf>,

    /// Print the verdict as one JSON object on stdout (allowed or not).
    #[arg(long)]
    pub json: bool,

    /// How to resolve: openat2, the openat(O_NOFOLLOW) walk, or auto (openat2 when the kernel has it).
    #[arg(long, value_name = "HOW", default_value = "auto", value_parser = parse_resolution)]
    pub resolve_with: Resolution,

    /// The path to check.
    #[arg(value_name = "PATH")]
    pub path: OsString,

    /// read (r, ro) or write (w, rw).
    #[arg(value_name = "MODE", value_parser = parse_mode)]
    pub mode: Mode,
}

#[derive(Args, Debug)]
pub struct NormaliseArgs {
    /// Take relative paths relative to DIR (absolute); without it they are refused.
    #[arg(long, value_name = "DIR")]
    pub base: Option<PathBuf>,

    /// The paths to normalise.
    #[arg(value_name = "PATH", required = true)]
    pub paths: Vec<OsString>,
}

fn parse_mode(s: &str) -> Result<Mode, String> {
    s.parse()
}

fn parse_resolution(s: &str) -> Result<Resolution, String> {
    s.parse()
}

pub fn main() -> ! {
    sbx_core::cli::run_main(TOOL, || {
        let cli: Cli = sbx_core::cli::parse(TOOL)?;
        // Every refusal has check's own line on stderr: no second one.
        sbx_core::cli::init_tracing_quiet_level(cli.common.verbose, "error");
        sbx_core::cli::init(TOOL, &cli.common)?;
        match cli.command {
            Command::Check(a) => check(a),
            Command::Normalise(a) => normalise(a),
        }
    })
}

fn check(a: CheckArgs) -> Result<i32, sbx_core::Failure> {
    let mut b = PathResolver::builder().resolution(a.resolve_with);
    if let Some(base) = &a.base {
        b = b.base(base);
    }
    for p in &a.allow_read {
        b = b.allow_read(p);
    }
    for p in &a.allow_write {
        b = b.allow_write(p);
    }
    let resolver = b.build().map_err(|e| match &e {
        PathError::BadRule { path, mode, reason } => sbx_core::Failure::new(format!(
            "--allow-{} {}: {reason}",
            mode.as_str(),
            path.display()
        )),
        PathError::BadBase { path, reason } => {
            sbx_core::Failure::new(format!("--base {}: {reason}", path.display()))
        }
        PathError::Io { op: "openat2", .. } => sbx_core::Failure::new(format!(
            "--resolve-with openat2: this kernel does not offer openat2 ({e})"
        )),
        _ => sbx_core::Failure::from(e),
    })?;
    let path = Path::new(&a.path);
    match resolver.validate_with(path, a.mode, Access::Path) {
        Ok(v) => {
            let fields = json!({
                "path": v.path().to_string_lossy(),
                "mode": a.mode.as_str(),
                "rule": v.rule().path.to_string_lossy(),
                "rule_mode": v.rule().mode.as_str(),
                "exists": v.exists(),
                "resolution": resolver.resolution().as_str(),
            });
            sbx_core::audit::emit("path_allowed", Severity::Info, fields.clone());
            if a.json {
                let mut out = json!({ "allowed": true });
                merge(&mut out, fields);
                println!("{out}");
            }
            Ok(0)
        }
        Err(e) => {
            let mut fields = json!({
                "path": e.path().unwrap_or(path).to_string_lossy(),
                "mode": a.mode.as_str(),
                "kind": e.kind(),
                "reason": e.to_string(),
                "resolution": resolver.resolution().as_str(),
            });
            if let Some(r) = e.rule() {
                merge(
                    &mut fields,
                    json!({ "rule": r.path.to_string_lossy(), "rule_mode": r.mode.as_str() }),
                );
            }
            if let PathError::Symlink { component, .. }
            | PathError::NotFound { component, .. }
            | PathError::NotADirectory { component, .. } = &e
            {
                merge(
                    &mut fields,
                    json!({ "component": component.to_string_lossy() }),
                );
            }
            let severity = if e.is_policy_denial() {
                Severity::Alert
            } else {
                Severity::Warn
            };
            sbx_core::audit::emit("path_denied", severity, fields.clone());
            if a.json {
                let mut out = json!({ "allowed": false });
                merge(&mut out, fields);
                println!("{out}");
            }
            sbx_core::cli::stderr_line(&format!("{TOOL}: {}", one_line(&e.to_string())));
            Ok(DENIED)
        }
    }
}

fn normalise(a: NormaliseArgs) -> Result<i32, sbx_core::Failure> {
    if let Some(b) = &a.base
        && !b.is_absolute()
    {
        return Err(sbx_core::Failure::new(format!(
            "--base {}: must be an absolute path",
            b.display()
        )));
    }
    let mut code = 0;
    for p in &a.paths {
        let p = Path::new(p);
        match crate::normalise(p, a.base.as_deref()) {
            Ok(n) => {
                let mut line = std::os::unix::ffi::OsStrExt::as_bytes(n.as_os_str()).to_vec();
                line.push(b'\n');
                sbx_core::cli::write_stdout(&line)?;
            }
            Err(e) => {
                sbx_core::cli::stderr_line(&format!(
                    "{TOOL}: {}: {e}",
                    one_line(&p.to_string_lossy())
                ));
                code = DENIED;
            }
        }
    }
    Ok(code)
}

fn merge(into: &mut Value, from: Value) {
    if let (Value::Object(a), Value::Object(b)) = (into, from) {
        a.extend(b);
    }
}

/// Paths may hold newlines: keep the reason on one line.
fn one_line(s: &str) -> String {
    sbx_core::escape::terminal(s).into_owned()
}
