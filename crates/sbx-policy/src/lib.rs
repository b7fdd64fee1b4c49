//! sbx-policy: Claude Code permission rules to the configuration of each
//! sbx layer (`compile`), a readable account of it (`explain`), and the
//! assembled chain for a trust level (`chain`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand};
use sbx_core::Failure;
use sbx_core::Severity;
use sbx_core::cli::CommonArgs;
use serde_json::json;

mod bash;
pub mod chain;
mod explain;
mod limitplan;
mod map;
mod project;
mod rules;
mod settings;

pub const TOOL: &str = "sbx-policy";

/// Where Claude Code reads managed settings on Linux.
pub const MANAGED: &str = "/etc/claude-code/managed-settings.json";

pub const MAN: sbx_core::man::ManInfo = sbx_core::man::ManInfo {
    about: "sbx-policy turns the permission rules of Claude Code settings files into the configuration of each \
sbx layer and assembles the chain. It reads the user (~/.claude/settings.json), project (.claude/settings.json), \
local (.claude/settings.local.json) and managed (/etc/claude-code/managed-settings.json) files, or the files given \
with --settings (the managed file is always read when it exists), and merges them as Claude Code does: managed > \
local > project > user for single values, arrays merged, and deny beats allow whatever file each rule is in. \
Every mapping is a union of grants; nothing is granted beyond the project directory (writable, as Claude Code's \
sandbox does), the system directories (read-only) and what the rules grant, and the hard-coded invariants of \
sbx-fs are always there.\n\n\
compile prints the configuration as one JSON object with a section per tool whose keys are the tools' long flag \
names: the file every sbx tool takes with --config, for every tier (the namespace chain's tools, sbx-gvisor when \
runsc is installed, sbx-vm, sbx-container, sbx-wasm), each section what chain gives that tool but the parts made \
per run (the git stage, gVisor's sbx-cgroup). explain prints the same as tables: what is allowed, what is \
denied, the limits, and each rule with what became of it; rules no kernel layer can enforce are listed as NOT \
ENFORCED, never dropped. chain execs (or with --print prints) the canonical chain for the trust level. The \
settings are read once, when chain starts: a change made while the command runs applies to the next command \
(turn), never to the running one.",
    exit_status: "compile, explain: 0 when the configuration was printed. chain: the exit status of the chain (the \
command's status, passed through unchanged by every layer; 128+N for a signal), or 0 with --print. 125 when \
sbx-policy itself failed: a settings file that is not JSON, --exec-allowlist strict with a tier that cannot enforce it, an unknown rule kind, a rule that does not parse, a path \
prefix that does not resolve (one line naming the file, the line when known, and the rule; nothing runs), a tier \
that is not available here (one line naming it), bad usage. 126 when the Bash rules refuse the command (one line \
naming it and why; a command_denied alert, also a line on stderr without --audit-log; nothing runs). 126/127 when the first program of the chain cannot be \
executed or is not found.",
    inherited_state: "chain replaces itself (execve) with the outermost layer: the chain inherits sbx-policy's \
environment, with SBX_ID set (if it was not) and the audit log handed down as SBX_AUDIT_FD when --audit-log was \
given; each layer then passes on what its own page says. In the full-trust tier the command itself is executed, \
with SBX_PATH_ALLOW_READ and SBX_PATH_ALLOW_WRITE (colon-separated paths) for the agent's in-process sbx-path \
resolver.",
    environment: "- HOME, CLAUDE_CONFIG_DIR: where the user settings are (~/.claude/settings.json) when --home is not given.\n- SBX_BIN: a directory searched for the sbx tools after --bin-dir and the directory of sbx-policy itself.",
    extra: &[
        (
            "MAPPING",
            "- Read(P), Glob(P), Grep(P), LS(P) allow, permissions.additionalDirectories: read-only bind of P (sbx-fs --ro).\n\
- Read(P) deny, sandbox.filesystem.denyRead: P hidden (--deny); a grant at or beneath P is removed.\n\
- Edit(P), Write(P), MultiEdit(P), NotebookEdit(P) allow, sandbox.filesystem.allowWrite: writable bind (--rw).\n\
- Edit(P) deny, sandbox.filesystem.denyWrite: a read-only bind over the writable binds (--ro P); when P does not exist, --deny P (it cannot be created); writable grants at or beneath P become read-only.\n\
- Bash(cmd), Bash(cmd:*), Bash(cmd *) allow: the agent may run that command (Claude Code's matching: exact, prefix at a word boundary, * globs; timeout/nice/nohup/time stripped). chain judges its command before anything starts; a shell -c script is split at &&, ||, ;, |, & and newlines and every part must be allowed; what cannot be judged ($(...), subshells, control structures, assignments, here-documents) is refused; a refused command: exit 126, one line, a command_denied alert. --exec-allowlist invoke (default, Claude Code's meaning): what an allowed command starts is not restricted. --exec-allowlist strict: also a Landlock execute allowlist (sbx-seccomp --allow-exec in the namespace chain; noexec mounts in the gVisor tier; other tiers refuse strict) of the programs the rules name, the command, sh, bash, env, #! interpreters and git's exec path; any other exec: EACCES and an exec_denied alert. Bash / Bash(*) allow: any command. Bash(cmd ...) deny: a matching command is refused (deny beats allow); one naming a whole program also hides it (--deny). Argument patterns bind the agent's command only: no kernel layer sees arguments.\n\
- WebFetch(domain:D), sandbox.network.allowedDomains: sbx-net --allow D (D or *.D, ports 80,443; *.D covers subdomains, not D).\n\
- WebSearch allow: the search domains (--search-domain, default api.anthropic.com).\n\
- sandbox.network.deniedDomains, WebFetch(domain:D) deny: D removed from the allowlist whatever else says; a wildcard that covers a denied name is dropped whole (sbx-net cannot subtract).\n\
- env (the top-level object): the names of its variables pass into the sandbox (sbx-fs --pass-env NAME, also sbx-gvisor's), as do --pass-env NAME|PREFIX*; the rest of the caller's environment is sbx-fs's allowlist (PATH, HOME, TERM, LANG, LC_*, TZ, USER...; secret-looking names are dropped with a warning naming them). sbx-creds' secrets (a --layers section) arrive through SBX_PASS_ENV.\n\
- ask rules, agent-only kinds (Task, TodoWrite, mcp__*...): listed, nothing granted.",
        ),
        (
            "PATHS",
            "//abs: absolute. ~/p: the home directory (--home, else $HOME). /p: relative to the settings file (the directory holding its .claude directory). ./p or p: relative to the project (found from --chdir). gitignore patterns: * and ? within a component, ** across; a pattern without a slash matches at any depth (a deny becomes an sbx-fs name pattern; an allow of one grants nothing and is reported). dir/*glob* grants are expanded from one directory listing when the turn starts; the project tree is never walked.",
        ),
        (
            "DECISION MATRIX",
            "--trust plugin (or --plugin): CMD is a WebAssembly module (WASI preview 1) or component (preview 2) run by sbx-wasm: the directory grants are its preopens (inside sbx-fs, so the deny list and the invariants hold), no sockets, a component's outgoing HTTP (wasi:http) to the allowed domains only (sbx-wasm --allow), --memory and --timeout as below, traps and exhausted budgets are alerts (exit 134, 124). --trust full: no kernel isolation, the path allowlist for sbx-path. --trust low (default): sbx-creds (when --layers has an sbx-creds section), sbx-gitguard run (when the project is a git repository; with --stage, and sbx-fs --git-stage, when the grants make its .git writable: git commits inside land in the stage and are imported after verification), sbx-cgroup (with the limits that apply in this run: as root or with a delegated cgroup memory, pids and CPU; unprivileged without one RLIMIT_DATA, RLIMIT_NPROC in its own user namespace, the wall clock; through systemd-run --user --scope -p Delegate=yes when a systemd user manager on cgroup v2 offers one), sbx-net, sbx-fs, sbx-seccomp --profile default (with --allow-exec in strict mode when Bash rules name programs). --trust low --container: one \
container per run (sbx-container; the rules' own denies and the domain allowlist are not carried: no network; git commits fail: .git is read-only and there is no git stage). --trust zero --latency-sensitive: sbx-vm --backend firecracker (the project is copied in and nothing comes back: commits stay in the VM). --trust zero: gVisor when runsc is installed (behind the same sbx-gitguard run --stage and plants as the namespace chain: commits inside land on the host verified), else sbx-vm. The gVisor layer is sbx-gvisor (sbx-gvisor(1)): an OCI bundle from sbx-fs's mount plan for the same grants (read-only empty root, the system directories read-only, the grants, every deny and invariant, no capability, no_new_privs, rlimits), run by runsc --platform=ptrace --network=host inside sbx-net (the chain's sbx-net layer: the same domain allowlist, DNS proxy and alerts as the namespace chain; uid 0 inside is the caller: unprivileged, runsc --rootless shows the caller's files as owned by 0), with the git stage and, in strict mode, every mount noexec but the allowlist's files (refused execs are exec_denied alerts); as root inside sbx-cgroup with the limits below, unprivileged with runsc --rootless (memory per process through RLIMIT_AS; the wall clock is enforced, exit 124); always cleaned up, by a guardian process when killed. A tier whose binary is not installed is one line naming it, exit 125.",
        ),
        (
            "DEFAULT LIMITS",
            "Low trust: memory 4G (half the RAM when that is less; tmpfs files count), 2048 processes and threads, three quarters of the CPUs (at least 1), /tmp, /dev/shm and $HOME 1G each, 2h wall clock, no file larger than 8G, the writable binds grow by at most 2G and 500000 new inodes per run (sbx-fs overlay mode: the changes reach the host when the command ends). Builds, test suites and package installs fit; a fork bomb, a memory bomb, a /tmp fill or a runaway loop hit a limit instead of the host. Override with --memory, --pids, --cpus, --tmp-size, --timeout, --fsize, --write-quota, --write-inodes.",
        ),
        (
            "EXAMPLES",
            "sbx-policy explain\n\n\
sbx-policy compile > sbx.json; sbx-fs --config sbx.json -- make\n\n\
sbx-policy chain -- claude\n\n\
sbx-policy chain --print --trust zero -- make test\n\n\
sbx-policy chain --settings team.json --memory 8G --timeout 30m -- npm test",
        ),
    ],
};

#[derive(Parser, Debug)]
#[command(
    name = "sbx-policy",
    version,
    about = "Claude Code permission rules to sandbox configuration (compile, explain) and the assembled chain"
)]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the sandbox configuration as JSON: one section per tool, keys = long flag names (a --config file).
    Compile(SourceArgs),
    /// Print what the sandbox allows and denies, and which rules are not enforced, as tables (--json: one object).
    Explain(ExplainArgs),
    /// Exec (or --print) the chain for a trust level around CMD.
    Chain(ChainArgs),
}

#[derive(Args, Debug, Clone)]
pub struct ExplainArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// One JSON object instead of tables: project, settings, allows, denies, limits (with whether each applies in this run), rules (status, rule, from, effect), not_enforced, warnings.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug, Clone)]
pub struct SourceArgs {
    /// Read FILE instead of the user, project and local settings (repeatable; later ones take precedence).
    #[arg(long, value_name = "FILE")]
    pub settings: Vec<PathBuf>,
    /// The managed settings file (read when it exists; always highest).
    #[arg(long, value_name = "FILE", default_value = MANAGED)]
    pub managed: PathBuf,
    /// Where the command starts (default: the current directory); the project is found from it: the git repository's top level (for a linked worktree inside its main work tree, the main one), else the nearest directory holding .claude/, else DIR (explain says which). Old spelling: --cwd.
    #[arg(long = "chdir", alias = "cwd", value_name = "DIR")]
    pub cwd: Option<PathBuf>,
    /// The home directory for ~/ (default: $HOME).
    #[arg(long, value_name = "DIR")]
    pub home: Option<PathBuf>,
    /// Do not offer the host's git user.name/user.email inside (the default offers them, and nothing else of the git config, as ~/.gitconfig in the sandbox's HOME; settings: "sbx": {"gitIdentity": false}).
    #[arg(long)]
    pub no_git_identity: bool,
    /// A domain a WebSearch allow rule opens (repeatable; default api.anthropic.com).
    #[arg(long, value_name = "DOMAIN")]
    pub search_domain: Vec<String>,
    /// Memory limit of the low-trust chain (default 4G or half the RAM).
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<String>,
    /// Process and thread limit (default 2048).
    #[arg(long, value_name = "N")]
    pub pids: Option<String>,
    /// CPU quota in CPUs (default three quarters of the machine's).
    #[arg(long, value_name = "N.N")]
    pub cpus: Option<String>,
    /// Size of /tmp, /dev/shm and $HOME (default 1G).
    #[arg(long, value_name = "SIZE")]
    pub tmp_size: Option<String>,
    /// Wall-clock limit (default 2h).
    #[arg(long, value_name = "DURATION")]
    pub timeout: Option<String>,
    /// Largest file the command may write (default 8G).
    #[arg(long, value_name = "SIZE")]
    pub fsize: Option<String>,
    /// What a run may add to the writable binds together (sbx-fs
    /// --write-quota, default 2G; "off": no budget, writes reach the host
    /// live instead of at the end).
    #[arg(long, value_name = "SIZE")]
    pub write_quota: Option<String>,
    /// New inodes a run may add to the writable binds (sbx-fs
    /// --write-inodes, default 500000).
    #[arg(long, value_name = "N")]
    pub write_inodes: Option<String>,
    /// Pass the caller's variable NAME (or every PREFIX*) into the sandbox besides the allowlist (sbx-fs --pass-env).
    #[arg(long, value_name = "NAME|PREFIX*")]
    pub pass_env: Vec<String>,
    /// What Bash(...) allow rules bind: invoke (default, Claude Code's meaning: the command the agent runs is judged, what it starts is not restricted) or strict (also a kernel execute allowlist for every program started inside).
    #[arg(long, value_enum, value_name = "MODE", default_value = "invoke")]
    pub exec_allowlist: bash::ExecMode,
}

#[derive(Args, Debug)]
pub struct ChainArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// How far the command is trusted: full (path allowlist only), low (namespace chain), zero (gVisor or a microVM), plugin (CMD is a WebAssembly module: sbx-wasm).
    #[arg(long, value_enum, default_value = "low")]
    pub trust: chain::Trust,
    /// With --trust zero: prefer the fastest-starting isolation (Firecracker).
    #[arg(long)]
    pub latency_sensitive: bool,
    /// CMD is a plugin, a WebAssembly/WASI module (as --trust plugin: sbx-wasm).
    #[arg(long)]
    pub plugin: bool,
    /// Print the chain (one layer per line) instead of running it.
    #[arg(long)]
    pub print: bool,
    /// A --config file whose sections are passed to each layer (sbx-creds is included when it has a section).
    #[arg(long, value_name = "FILE")]
    pub layers: Option<PathBuf>,
    /// Where the sbx binaries are (default: $SBX_BIN, beside sbx-policy, PATH).
    #[arg(long, value_name = "DIR")]
    pub bin_dir: Option<PathBuf>,
    /// Include sbx-cgroup (the default with --trust low, given only the limits that apply in this run: explain says which; with --trust zero the default is only as root).
    #[arg(long, overrides_with = "no_cgroup")]
    pub cgroup: bool,
    /// Leave sbx-cgroup out.
    #[arg(long)]
    pub no_cgroup: bool,
    /// With --trust low: one container per run (sbx-container, Docker/Podman) instead of the namespace chain.
    #[arg(long)]
    pub container: bool,
    /// A phantom credential (sbx-net --secret NAME@HOST[,HOST...][=file:PATH|=fd:N], repeatable): inside, NAME holds a placeholder; sbx-net puts the caller's value into request headers to HOST only. Namespace chain only.
    #[arg(long, value_name = "NAME@HOST")]
    pub secret: Vec<String>,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<OsString>,
}

/// Reads, merges and maps the settings.
pub fn policy(a: &SourceArgs) -> Result<map::Policy, Failure> {
    let cwd = match &a.cwd {
        Some(c) => c.clone(),
        None => {
            std::env::current_dir().map_err(|e| Failure::new(format!("current directory: {e}")))?
        }
    };
    let cwd = cwd
        .canonicalize()
        .map_err(|e| Failure::new(format!("--chdir {}: {e}", cwd.display())))?;
    let home = a.home.clone().or_else(|| {
        std::env::var_os("HOME")
            .filter(|h| !h.is_empty())
            .map(PathBuf::from)
    });
    let proj = project::find(&cwd, home.as_deref());
    let cwd = proj.root.clone();
    let mut files: Vec<(settings::Scope, PathBuf)> = if a.settings.is_empty() {
        settings::default_files(&cwd, home.as_deref(), Path::new("/nonexistent"))
            .map_err(|e| Failure::new(format!("settings {e}")))?
    } else {
        let mut v = Vec::new();
        for (i, f) in a.settings.iter().enumerate() {
            if !settings::present(f).map_err(|e| Failure::new(format!("--settings {e}")))? {
                return Err(Failure::new(format!(
                    "--settings {}: no such file",
                    f.display()
                )));
            }
            v.push((settings::Scope::Given(i), f.clone()));
        }
        v
    };
    if settings::present(&a.managed).map_err(|e| Failure::new(format!("--managed {e}")))? {
        files.push((settings::Scope::Managed, a.managed.clone()));
    }
    let merged = settings::load(&files)?;
    let mut limits = map::Limits::defaults();
    let units = sbx_core::units::parse_size;
    for (flag, v, slot) in [
        ("--memory", &a.memory, &mut limits.memory),
        ("--tmp-size", &a.tmp_size, &mut limits.tmp_size),
        ("--fsize", &a.fsize, &mut limits.fsize),
        ("--write-quota", &a.write_quota, &mut limits.write_quota),
    ] {
        if let Some(v) = v {
            if !(flag == "--write-quota" && v == "off") {
                units(v).map_err(|e| Failure::new(format!("{flag} {v}: {e}")))?;
            }
            *slot = v.clone();
        }
    }
    if let Some(n) = &a.write_inodes {
        match n.parse::<u64>() {
            Ok(k) if k > 0 => limits.write_inodes = n.clone(),
            _ => {
                return Err(Failure::new(format!(
                    "--write-inodes {n}: expected a positive integer"
                )));
            }
        }
    }
    if let Some(t) = &a.timeout {
        sbx_core::units::parse_duration(t)
            .map_err(|e| Failure::new(format!("--timeout {t}: {e}")))?;
        limits.timeout = t.clone();
    }
    if let Some(n) = &a.pids {
        match n.parse::<u64>() {
            Ok(k) if k > 0 => limits.pids = n.clone(),
            _ => {
                return Err(Failure::new(format!(
                    "--pids {n}: expected a positive integer"
                )));
            }
        }
    }
    if let Some(c) = &a.cpus {
        match c.parse::<f64>() {
            Ok(x) if x > 0.0 && x.is_finite() => limits.cpus = c.clone(),
            _ => {
                return Err(Failure::new(format!(
                    "--cpus {c}: expected a positive number"
                )));
            }
        }
    }
    for d in &a.search_domain {
        rules::check_domain(d).map_err(|e| Failure::new(format!("--search-domain: {e}")))?;
    }
    let search_domains = if a.search_domain.is_empty() {
        vec!["api.anthropic.com".to_string()]
    } else {
        a.search_domain.clone()
    };
    for e in &a.pass_env {
        sbx_core::envpolicy::parse_pass("--pass-env", e)
            .map_err(|e| Failure::new(e.to_string()))?;
    }
    let mut p = map::build(map::Inputs {
        merged: &merged,
        ctx: rules::Ctx { cwd, home },
        exec_mode: a.exec_allowlist,
        search_domains,
        limits,
    })?;
    for w in &p.warnings {
        sbx_core::cli::stderr_line(&format!("sbx-policy: warning: {w}"));
    }
    p.start = proj.start;
    p.project_why = proj.why;
    if a.no_git_identity {
        p.git_identity = false;
    }
    for e in &a.pass_env {
        if !p.pass_env.contains(e) {
            p.pass_env.push(e.clone());
        }
    }
    Ok(p)
}

fn run_chain(c: ChainArgs) -> Result<i32, Failure> {
    let p = policy(&c.source)?;
    let opts = chain::Options {
        trust: c.trust,
        latency_sensitive: c.latency_sensitive,
        plugin: c.plugin,
        layers: c.layers.clone(),
        bin_dir: c.bin_dir.clone(),
        container: c.container,
        secrets: c.secret.clone(),
        cgroup: if c.no_cgroup {
            Some(false)
        } else if c.cgroup {
            Some(true)
        } else {
            None
        },
    };
    let mut plan = chain::plan(&p, &opts, &c.cmd)?;
    // The Bash rules judge the command the agent runs (both modes).
    let judged = p.exec_allow.as_ref().map(|x| x.judge(&c.cmd));
    match &judged {
        Some(Ok(v)) => plan.notes.push(format!(
            "the command is allowed: {}",
            v.iter()
                .map(|a| format!("`{}` by {}", a.command, a.rule))
                .collect::<Vec<_>>()
                .join(", ")
        )),
        Some(Err(r)) => plan.notes.push(format!(
            "the command is REFUSED (exit 126, command_denied alert): `{}`: {}",
            r.command, r.reason
        )),
        None => {}
    }
    if c.print {
        print!("{}", plan.render());
        return Ok(0);
    }
    if let (Some(x), Some(Err(r))) = (&p.exec_allow, &judged) {
        sbx_core::audit::emit(
            "command_denied",
            Severity::Alert,
            json!({
                "command": sbx_core::chain::show(&c.cmd),
                "refused": r.command,
                "reason": r.reason,
                "mode": x.mode.name(),
            }),
        );
        return Err(Failure::with_code(
            126,
            format!(
                "command refused by the Bash rules ({} mode): `{}`: {} (sbx-policy explain lists the rules)",
                x.mode.name(),
                r.command,
                r.reason
            ),
        ));
    }
    let not: Vec<String> = p
        .rows
        .iter()
        .filter(|r| r.status == map::Status::NotEnforced)
        .map(|r| format!("{} [{}]", r.rule, r.from))
        .collect();
    let argv = plan.argv();
    sbx_core::audit::emit(
        "chain",
        Severity::Info,
        json!({
            "tier": plan.tier,
            "settings": p.files,
            "not_enforced": not,
            "notes": plan.notes,
            "exec_allowlist": p.exec_allow.as_ref().map(|x| x.mode.name()),
            "argv": sbx_core::chain::show(&argv),
        }),
    );
    // To the log only: explain is where a person reads them.
    if let Some(a) = sbx_core::audit::get() {
        for r in p
            .rows
            .iter()
            .filter(|r| r.status == map::Status::NotEnforced)
        {
            a.record(
                "rule_not_enforced",
                Severity::Warn,
                json!({ "rule": r.rule, "from": r.from, "reason": r.effect }),
            );
        }
    }
    let mut env = sbx_core::chain::current_env();
    for (k, v) in &plan.env {
        sbx_core::chain::set_env(&mut env, k.clone(), v.clone());
    }
    // chain::exec hands the audit fd to a next sbx tool (by identity).
    Err(sbx_core::chain::exec(&argv, &env))
}

pub fn main() -> ! {
    sbx_core::cli::run_main(TOOL, || {
        let cli: Cli = sbx_core::cli::parse(TOOL)?;
        sbx_core::cli::init(TOOL, &cli.common)?;
        match cli.command {
            Command::Compile(a) => {
                let p = policy(&a)?;
                let v = p
                    .to_config()
                    .map_err(|e| Failure::new(format!("compile: {e}")))?;
                println!(
                    "{}",
                    serde_json::to_string_pretty(&v).map_err(|e| Failure::new(e.to_string()))?
                );
                Ok(0)
            }
            Command::Explain(a) => {
                let p = policy(&a.source)?;
                if a.json {
                    println!("{}", explain::json(&p));
                } else {
                    print!("{}", explain::render(&p));
                }
                Ok(0)
            }
            Command::Chain(c) => run_chain(c),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }
}
