//! sbx-wasm: the plugin tier. Runs a WebAssembly module (a WASI preview-1
//! command) or component (a WASI preview-2 command) in wasmtime: instruction-level isolation, the directories
//! granted as WASI preopens and nothing else of the host, the environment
//! and arguments passed, memory, time, fuel, table and instance limits,
//! and for a component outgoing HTTP (wasi:http) to allowlisted hosts only
//! (sbx-net's allowlist code; see [`egress`]).
//!
//! Without grants the module runs in this process. With grants, sbx-wasm
//! becomes `sbx-fs [the grants] -- sbx-wasm --inner ...`: the engine runs
//! inside sbx-fs's mount namespace, where every granted directory is a
//! bind made from a checked fd and the deny list and the invariants
//! (.git/config, .claude/, hooks ...) hold as for any command, and its
//! preopens are those binds. See docs/wasm.md.

mod cache;
mod egress;
mod engine;

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::json;

use sbx_core::cli::CommonArgs;
use sbx_core::{Failure, Severity, audit};

use engine::{EngineOpts, Guest, Limits, Outcome, Preopen};

pub const TOOL: &str = "sbx-wasm";

/// Where the inner sbx-wasm finds its directories and the artifact in
/// sbx-fs's root.
const INNER_ROOT: &str = "/.sbx-wasm";
/// The guest's variables travel from the outer sbx-wasm to the inner one
/// as `SBX_WASM_ENV_<i>=K=V` (named exactly in SBX_PASS_ENV, never in an
/// argv that other users can read).
const ENV_PREFIX: &str = "SBX_WASM_ENV_";
/// Largest module read.
const MODULE_CAP: u64 = 256 << 20;

pub const MAN: sbx_core::man::ManInfo = sbx_core::man::ManInfo {
    about: "Runs MODULE, a WebAssembly module that is a WASI preview-1 command or a component that is a WASI \
preview-2 command, in the wasmtime engine: the plugin tier. The module reaches nothing of the host but the \
directories granted with --ro and --rw (WASI preopens), its arguments, the environment passed and stdin, \
stdout and stderr; it has no sockets, and a component's outgoing HTTP (wasi:http) reaches only the hosts \
allowed with --allow (none by default). Its \
memory, run time (--timeout, wall clock), instruction budget (--fuel), tables and instances are bounded, \
and a trap or a limit hit is an audit alert with its own exit status. Compiled modules are cached, so a \
second run starts in microseconds.",
    exit_status: "The module's exit status: 0 when its _start returns, N when it calls proc_exit(N) (exit(N) in C). \
124 when --timeout elapsed or --fuel ran out (alert wasm_timeout or wasm_fuel_exhausted). 134 when the module \
trapped (unreachable, out-of-bounds memory access, stack overflow, integer overflow or division by zero, an \
indirect call of the wrong type; alert wasm_trap naming it; what an aborting C program gives, 128+SIGABRT, \
as with the wasmtime CLI) or could not be instantiated within the limits (a memory minimum above --memory, \
more tables, memories or instances than allowed; alert wasm_instantiate_refused). A memory.grow beyond \
--memory fails inside the module (malloc returns NULL; alert wasm_limit): what the module does then decides \
its status. 125 when sbx-wasm itself failed (bad usage, a grant that is not a directory, set-up refused), \
with one line on stderr. 1 when a component's wasi:cli/run returns an error (as with the wasmtime CLI). \
126 when MODULE exists but cannot run (not readable, not WebAssembly, an import sbx-wasm does not provide, \
no _start, a component that does not export wasi:cli/run), 127 when MODULE does not exist. With grants, sbx-fs's statuses \
apply to its own failures (125).",
    inherited_state: "The module inherits only what WASI gives it: its arguments (MODULE as argv[0], then ARGS), \
the environment built below (see ENVIRONMENT), stdin, stdout and stderr of sbx-wasm, the preopened directories, \
the clocks and random numbers. There is no other file, no socket, no process and no signal it can reach: \
WebAssembly code makes no system calls; every access goes through a WASI function of the engine.",
    environment: "- The module's environment: an allowlist of the caller's variables, the same as sbx-fs's (PATH, HOME, TERM, LANG, LC_*, TZ, USER ... ; secret-looking names pass only when named), plus --pass-env and SBX_PASS_ENV, then --setenv. Nothing else.\n- SBX_REGISTRY_DIR: for tests, the registry (and so the module cache) lives beneath it.",
    extra: &[
        (
            "GRANTS",
            "--ro DIR[:GUEST] and --rw DIR[:GUEST] (repeatable) make the host directory DIR visible to the module as \
the preopened directory GUEST (an absolute path; default: DIR's canonical path), read-only or writable. \
Nothing else of the host file system is reachable: WASI resolves every path beneath a preopen, and a path \
with .. or a symlink that leaves it is refused (ENOTCAPABLE), whatever the symlink's target. With a grant, \
sbx-wasm runs the engine inside sbx-fs (the same grants as sbx-fs --ro/--rw): its default deny list hides \
the host's secrets (.env, credentials*, ~/.ssh ...) in every grant, and inside writable grants its \
invariants hold: .git/config, .git/HEAD, .git/hooks/, .git/objects/, .git/refs/, the whole .claude \
directory, .mcp.json, .envrc, .gitmodules, .vscode/ and the rest of sbx-fs's list are read-only and \
cannot be created; an attempt is refused by the kernel and logged by sbx-fs (fs_write_denied, fs_denied). \
A grant that is not a directory is refused (exit 125).",
        ),
        (
            "LIMITS",
            "--memory SIZE (default 1G) bounds each linear memory. --timeout DURATION ends the run when it elapses \
(epoch interruption: checked at every loop back-edge and function entry). --fuel N gives the module N units \
of fuel (about one per WebAssembly instruction): a deterministic budget, the same on every machine and \
load. --max-stack SIZE (default 512K) bounds the native stack WebAssembly may use (deeper recursion traps \
with a stack overflow). --max-table-elements N (default 100000), --max-tables N (default 10), \
--max-memories N (default 1) and --max-instances N (default 10) bound the rest of the store.",
        ),
        (
            "CACHE",
            "A compiled module is stored in sbx's per-user registry directory ($XDG_RUNTIME_DIR/sbx, /run/sbx-UID \
or /tmp/sbx-registry-UID; a 0700 directory of the caller's), under wasm-cache/, keyed by the SHA-256 of the \
module and the engine's settings (wasmtime version, target, fuel on or off, stack size). The file holds \
the compiled code and its SHA-256. A run reads it back only when it is a regular file (not a symlink) of \
the caller's that nobody else can write, in that private directory, and its content matches its \
checksum; otherwise the module is compiled again. --no-cache compiles and rewrites it.",
        ),
        (
            "NETWORK",
            "None by default. A core module (preview 1) has no network interface at all. A component (preview 2) \
is given wasi:sockets with TCP, UDP and name lookup disabled (every use fails), and wasi:http's outgoing \
handler, whose every request is checked before anything is resolved or connected: the target (scheme http \
or https, host, port: 80 or 443 by default) must be allowed by --allow NAME[:PORTS] (or --allow-file), the \
syntax and matcher of sbx-net (*.domain for subdomains, PORTS 80,443 by default). A host written as an IP \
address is allowed only by an address entry (--allow 127.0.0.1:8080), never by a name; a name is resolved \
only when allowed; an authority with user information is refused. A refused request fails in the module \
with the wasi:http error HTTP-request-denied and is an alert net_denied (dst, port, scheme, reason); an \
allowed one is net_allowed. Waits for a response end at --timeout. The host's resolver answers allowed \
names: run sbx-wasm inside sbx-net to add its DNS filtering (rebinding) and its gateway.",
        ),
        (
            "AUDIT",
            "wasm_start (info: module, kind module or component, sha256, cached, preopens, allow, limits), net_allowed \
(info) and net_denied (alert: dst, port, scheme, reason) for a component's requests, wasm_end (info: status, outcome, \
load_us, instantiate_us, fuel_used). Alerts: wasm_trap (trap), wasm_timeout (timeout_ms), \
wasm_fuel_exhausted (fuel), wasm_limit (limit memory or table_elements, max, desired; once per kind), \
wasm_instantiate_refused (error). With grants, sbx-fs's events (start, end, fs_denied, fs_write_denied ...) \
are in the same log.",
        ),
    ],
};

/// sbx-wasm [OPTIONS] -- MODULE.wasm [ARGS...]
#[derive(Parser, Debug)]
#[command(
    name = "sbx-wasm",
    version,
    about = "Run a WebAssembly (WASI) module with only the granted directories, bounded memory, time and fuel",
    after_help = "Example: sbx-wasm --rw ~/proj:/proj --memory 256M --timeout 10s -- plugin.wasm /proj"
)]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonArgs,

    #[command(flatten)]
    pub spec: sbx_spec::WasmSpec,

    /// (internal) Run inside sbx-fs: the artifact and preopens are given.
    #[arg(long, hide = true)]
    pub inner: bool,

    /// (internal) The compiled module to load (with --inner).
    #[arg(long, hide = true, value_name = "PATH")]
    pub artifact: Option<PathBuf>,

    /// (internal) The module's SHA-256, for the audit log (with --inner).
    #[arg(long, hide = true, value_name = "HEX")]
    pub module_sha256: Option<String>,

    /// (internal) ro|rw:PATH:GUEST (with --inner).
    #[arg(long, hide = true, value_name = "SPEC")]
    pub preopen: Vec<String>,

    /// The module and its arguments.
    #[arg(last = true, required = true, value_name = "MODULE")]
    pub cmd: Vec<OsString>,
}

pub fn main() -> ! {
    sbx_core::cli::run_main(TOOL, || {
        let cli: Cli = sbx_core::cli::parse(TOOL)?;
        sbx_core::cli::init(TOOL, &cli.common)?;
        // The engine runs in this process: nothing forwards signals, so
        // SIGTERM, SIGINT and the like end it as they end any program
        // (run_main blocked them for supervisors).
        sbx_core::signals::unblock_all().map_err(|e| Failure::new(format!("sigprocmask: {e}")))?;
        if cli.inner { inner(cli) } else { run(cli) }
    })
}

/// A granted directory, checked.
struct Grant {
    flag: &'static str,
    src: PathBuf,
    guest: String,
    rw: bool,
}

fn grants(cli: &Cli) -> Result<Vec<Grant>, Failure> {
    let mut out = Vec::new();
    let all = cli
        .spec
        .ro
        .iter()
        .map(|r| ("--ro", r, false))
        .chain(cli.spec.rw.iter().map(|r| ("--rw", r, true)));
    for (flag, raw, rw) in all {
        let b = sbx_fs::spec::parse_bind(flag, raw, rw)?;
        let shown = b.src.display().to_string();
        let src = std::fs::canonicalize(&b.src)
            .map_err(|e| Failure::new(format!("{flag} {shown}: {e}")))?;
        if !src.is_dir() {
            return Err(Failure::new(format!(
                "{flag} {shown}: not a directory (a WASI preopen is a directory)"
            )));
        }
        let guest = b.dst.unwrap_or_else(|| src.clone());
        let guest = guest
            .to_str()
            .ok_or_else(|| Failure::new(format!("{flag} {shown}: the guest path is not UTF-8")))?
            .to_string();
        out.push(Grant {
            flag,
            src,
            guest,
            rw,
        });
    }
    Ok(out)
}

/// The egress allowlist of a component's wasi:http: --allow and the
/// --allow-file entries, parsed by sbx-net's own code.
fn allowlist(spec: &sbx_spec::WasmSpec) -> Result<Vec<sbx_allow::Entry>, Failure> {
    let mut out = Vec::new();
    for a in &spec.allow {
        out.push(sbx_allow::parse_allow("--allow", a).map_err(|e| Failure::new(e.to_string()))?);
    }
    for f in &spec.allow_file {
        out.extend(sbx_allow::read_allow_file(f).map_err(|e| Failure::new(e.to_string()))?);
    }
    Ok(out)
}

fn policy(entries: &[sbx_allow::Entry]) -> sbx_allow::Policy {
    let mut p = sbx_allow::Policy::default();
    for e in entries {
        p.add(e.clone());
    }
    p
}

/// An entry as --allow takes it again.
fn entry_arg(e: &sbx_allow::Entry) -> String {
    match e {
        sbx_allow::Entry::Name(n) => format!("{}:{}", n.dns_entry(), n.ports),
        sbx_allow::Entry::Cidr(c) => c.to_string(),
    }
}

fn limits(cli: &Cli) -> Result<(EngineOpts, Limits), Failure> {
    let size = |flag: &'static str, v: &str| sbx_fs::spec::parse_size_flag(flag, v);
    let memory = size("--memory", &cli.spec.memory)?;
    let max_stack = size("--max-stack", &cli.spec.max_stack)?;
    let timeout = match &cli.spec.timeout {
        Some(t) => Some(
            sbx_core::units::parse_duration(t)
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    Failure::new(format!(
                        "--timeout '{t}': expected a duration such as 10s or 500ms"
                    ))
                })?,
        ),
        None => None,
    };
    if cli.spec.fuel == Some(0) {
        return Err(Failure::new("--fuel 0: the budget must be at least 1"));
    }
    let max_stack = usize::try_from(max_stack)
        .ok()
        .filter(|s| *s <= 1 << 30)
        .ok_or_else(|| Failure::new(format!("--max-stack '{}': at most 1G", cli.spec.max_stack)))?;
    Ok((
        EngineOpts {
            fuel: cli.spec.fuel.is_some(),
            max_stack,
        },
        Limits {
            memory,
            table_elements: cli.spec.max_table_elements,
            instances: cli.spec.max_instances,
            tables: cli.spec.max_tables,
            memories: cli.spec.max_memories,
            timeout,
            fuel: cli.spec.fuel,
        },
    ))
}

/// The module's environment: the caller's allowlisted variables (sbx-fs's
/// rules, issue 12), then --setenv.
fn guest_env(cli: &Cli) -> Result<Vec<(String, String)>, Failure> {
    let mut policy = sbx_core::envpolicy::Policy {
        keep_all: false,
        pass: Vec::new(),
    };
    for p in &cli.spec.pass_env {
        policy.pass.push(
            sbx_core::envpolicy::parse_pass("--pass-env", p)
                .map_err(|e| Failure::new(e.to_string()))?,
        );
    }
    policy
        .add_from_env()
        .map_err(|e| Failure::new(e.to_string()))?;
    let filtered = sbx_core::envpolicy::filter(sbx_core::chain::current_env(), &policy);
    sbx_core::envpolicy::report(TOOL, &filtered);
    let mut env = filtered.env.clone();
    for s in &cli.spec.setenv {
        match sbx_fs::spec::parse_setenv(s)? {
            sbx_fs::spec::EnvOp::Set(k, v) => sbx_core::chain::set_env(&mut env, k, v),
            sbx_fs::spec::EnvOp::Unset(k) => sbx_core::chain::unset_env(&mut env, &k),
        }
    }
    env.into_iter()
        .map(|(k, v)| match (k.to_str(), v.to_str()) {
            (Some(k), Some(v)) => Ok((k.to_string(), v.to_string())),
            // WASI strings are UTF-8: a variable that is not is not passed.
            _ => Err(Failure::new(format!(
                "environment variable {}: not UTF-8 (WASI passes UTF-8 only)",
                k.to_string_lossy()
            ))),
        })
        .collect()
}

fn guest_args(cmd: &[OsString]) -> Result<Vec<String>, Failure> {
    cmd.iter()
        .map(|a| {
            a.to_str().map(str::to_string).ok_or_else(|| {
                Failure::new(format!(
                    "argument '{}': not UTF-8 (WASI passes UTF-8 only)",
                    a.to_string_lossy()
                ))
            })
        })
        .collect()
}

/// Reads MODULE: 127 when it does not exist, 126 when it cannot be read
/// or is not WebAssembly.
fn read_module(path: &Path) -> Result<Vec<u8>, Failure> {
    let shown = path.display();
    let bytes = sbx_core::input::read_regular(path, MODULE_CAP).map_err(|e| {
        let code = match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => sbx_core::exit::NOT_FOUND,
            _ => sbx_core::exit::NOT_EXECUTABLE,
        };
        Failure::with_code(code, format!("{shown}: {e}"))
    })?;
    if !bytes.starts_with(b"\0asm") {
        return Err(Failure::with_code(
            sbx_core::exit::NOT_EXECUTABLE,
            format!("{shown}: not a WebAssembly module (no \\0asm header)"),
        ));
    }
    Ok(bytes)
}

/// The compiled module or component, from the cache or compiled now (and
/// cached). Also returns the cache file and whether it was a hit.
fn compile(
    engine: &wasmtime::Engine,
    path: &Path,
    bytes: &[u8],
    no_cache: bool,
) -> Result<(engine::Program, Option<PathBuf>, bool), Failure> {
    let file = cache::dir().map(|d| d.join(cache::key(engine, bytes)));
    if !no_cache
        && let Some(f) = &file
        && let Ok(Some(m)) = cache::load(engine, f)
    {
        return Ok((m, file, true));
    }
    let m = engine::Program::compile(engine, bytes).map_err(|e| {
        Failure::with_code(
            sbx_core::exit::NOT_EXECUTABLE,
            format!("{}: not valid WebAssembly: {e:#}", path.display()),
        )
    })?;
    let mut stored = None;
    if let Some(f) = file {
        match m.serialize().map(|a| cache::store(&f, &a)) {
            Ok(Ok(())) => stored = Some(f),
            Ok(Err(e)) => tracing::warn!("caching the compiled module as {}: {e}", f.display()),
            Err(e) => tracing::warn!("serializing the compiled module: {e:#}"),
        }
    }
    Ok((m, stored, false))
}

fn run(cli: Cli) -> Result<i32, Failure> {
    let grants = grants(&cli)?;
    let (opts, limits) = limits(&cli)?;
    let allow = allowlist(&cli.spec)?;
    let env = guest_env(&cli)?;
    let args = guest_args(&cli.cmd)?;
    let module_path = PathBuf::from(&cli.cmd[0]);
    let bytes = read_module(&module_path)?;
    let sha = cache::hex(&sha2_digest(&bytes));
    let t0 = Instant::now();
    let engine =
        engine::engine(opts).map_err(|e| Failure::new(format!("wasmtime engine: {e:#}")))?;
    let (module, artifact, cached) = compile(&engine, &module_path, &bytes, cli.spec.no_cache)?;
    let load = t0.elapsed();
    if grants.is_empty() {
        let guest = Guest {
            args,
            env,
            preopens: Vec::new(),
        };
        return execute(
            &engine,
            &module,
            &guest,
            &limits,
            &policy(&allow),
            &module_path,
            &sha,
            cached,
            load,
        );
    }
    // With grants: the engine runs inside sbx-fs, over the compiled file.
    let artifact = artifact.ok_or_else(|| {
        Failure::new("no module cache directory (sbx's registry is unusable): grants need one")
    })?;
    drop(module);
    reexec_in_fs(&cli, &grants, &allow, &artifact, &sha, &env)
}

fn sha2_digest(b: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(b).to_vec()
}

/// `sbx-fs --ro/--rw GRANT:/.sbx-wasm/dir/I ... --ro ARTIFACT -- sbx-wasm
/// --inner ...`, in place of this process.
fn reexec_in_fs(
    cli: &Cli,
    grants: &[Grant],
    allow: &[sbx_allow::Entry],
    artifact: &Path,
    sha: &str,
    guest_env: &[(String, String)],
) -> Result<i32, Failure> {
    let me = std::env::current_exe()
        .map_err(|e| Failure::new(format!("finding sbx-wasm's own binary: {e}")))?;
    let fs = me.with_file_name("sbx-fs");
    if !fs.is_file() {
        return Err(Failure::new(format!(
            "a grant runs the module inside sbx-fs, which is not installed beside sbx-wasm ({})",
            fs.display()
        )));
    }
    let mut argv: Vec<OsString> = vec![fs.clone().into()];
    let mut inner: Vec<OsString> = vec![me.clone().into(), "--inner".into()];
    let inner_artifact = format!("{INNER_ROOT}/module.cwasm");
    argv.push("--ro".into());
    argv.push(cat(&[
        artifact.as_os_str(),
        OsStr::new(":"),
        OsStr::new(&inner_artifact),
    ]));
    inner.push("--artifact".into());
    inner.push(inner_artifact.into());
    inner.push("--module-sha256".into());
    inner.push(sha.into());
    for (i, g) in grants.iter().enumerate() {
        let at = format!("{INNER_ROOT}/dir/{i}");
        argv.push(g.flag.into());
        argv.push(cat(&[g.src.as_os_str(), OsStr::new(":"), OsStr::new(&at)]));
        inner.push("--preopen".into());
        inner.push(format!("{}:{at}:{}", if g.rw { "rw" } else { "ro" }, g.guest).into());
    }
    argv.extend(["--chdir".into(), "/".into()]);
    // The limits and the allowlist as given (the allow files read here:
    // they need not be visible inside sbx-fs).
    let spec = sbx_spec::WasmSpec {
        ro: Vec::new(),
        rw: Vec::new(),
        setenv: Vec::new(),
        pass_env: Vec::new(),
        allow: allow.iter().map(entry_arg).collect(),
        allow_file: Vec::new(),
        no_cache: false,
        ..cli.spec.clone()
    };
    inner.extend(spec.args());
    for _ in 0..cli.common.verbose {
        inner.push("-v".into());
    }
    inner.push("--".into());
    inner.extend(cli.cmd.iter().cloned());
    argv.push("--".into());
    argv.extend(inner);
    // sbx-fs keeps the caller's environment (it reads HOME and the like to
    // place its protections); the guest's variables ride along under
    // names of our own, passed by exact name.
    // The caller's secrets were judged above for the module; sbx-fs needs
    // none of them (it would only warn about them again).
    let mut env = sbx_core::chain::current_env();
    env.retain(|(k, _)| {
        k.to_str()
            .is_some_and(|k| !k.starts_with(ENV_PREFIX) && !sbx_core::envpolicy::looks_secret(k))
    });
    let mut names = Vec::new();
    for (i, (k, v)) in guest_env.iter().enumerate() {
        let name = format!("{ENV_PREFIX}{i}");
        sbx_core::chain::set_env(&mut env, name.clone(), format!("{k}={v}"));
        names.push(name);
    }
    sbx_core::chain::set_env(&mut env, sbx_core::envpolicy::ENV_PASS, names.join(","));
    Err(sbx_core::chain::exec(&argv, &env))
}

fn cat(parts: &[&OsStr]) -> OsString {
    let mut o = OsString::new();
    for p in parts {
        o.push(p);
    }
    o
}

/// Inside sbx-fs: load the artifact, open the preopens, run.
fn inner(cli: Cli) -> Result<i32, Failure> {
    let (opts, limits) = limits(&cli)?;
    let args = guest_args(&cli.cmd)?;
    let artifact = cli
        .artifact
        .clone()
        .ok_or_else(|| Failure::new("--inner needs --artifact"))?;
    let mut preopens = Vec::new();
    for p in &cli.preopen {
        let mut it = p.splitn(3, ':');
        let (Some(mode), Some(host), Some(guest)) = (it.next(), it.next(), it.next()) else {
            return Err(Failure::new(format!(
                "--preopen '{p}': expected ro|rw:PATH:GUEST"
            )));
        };
        preopens.push(Preopen {
            host: PathBuf::from(host),
            guest: guest.to_string(),
            writable: mode == "rw",
        });
    }
    let mut env: Vec<(usize, (String, String))> = std::env::vars()
        .filter_map(|(k, v)| {
            let i = k.strip_prefix(ENV_PREFIX)?.parse().ok()?;
            let (k, v) = v.split_once('=')?;
            Some((i, (k.to_string(), v.to_string())))
        })
        .collect();
    env.sort();
    let env = env.into_iter().map(|(_, kv)| kv).collect();
    let t0 = Instant::now();
    let engine =
        engine::engine(opts).map_err(|e| Failure::new(format!("wasmtime engine: {e:#}")))?;
    let module = cache::load(&engine, &artifact)
        .map_err(|e| Failure::new(format!("{}: {e}", artifact.display())))?
        .ok_or_else(|| {
            Failure::new(format!(
                "{}: not a valid compiled module of ours",
                artifact.display()
            ))
        })?;
    let load = t0.elapsed();
    let guest = Guest {
        args,
        env,
        preopens,
    };
    let sha = cli.module_sha256.clone().unwrap_or_default();
    let path = PathBuf::from(&cli.cmd[0]);
    let allow = policy(&allowlist(&cli.spec)?);
    execute(
        &engine, &module, &guest, &limits, &allow, &path, &sha, true, load,
    )
}

#[allow(clippy::too_many_arguments)]
fn execute(
    engine: &wasmtime::Engine,
    module: &engine::Program,
    guest: &Guest,
    limits: &Limits,
    allow: &sbx_allow::Policy,
    path: &Path,
    sha: &str,
    cached: bool,
    load: Duration,
) -> Result<i32, Failure> {
    audit::emit(
        "wasm_start",
        Severity::Info,
        json!({
            "module": path.display().to_string(),
            "kind": module.kind(),
            "allow": allow.names.iter().map(|n| format!("{}:{}", n.dns_entry(), n.ports)).chain(allow.cidrs.iter().map(|c| c.to_string())).collect::<Vec<_>>(),
            "sha256": sha,
            "cached": cached,
            "preopens": guest.preopens.iter().map(|p| format!("{} {}", if p.writable { "rw" } else { "ro" }, p.guest)).collect::<Vec<_>>(),
            "memory": limits.memory,
            "timeout_ms": limits.timeout.map(|t| t.as_millis() as u64),
            "fuel": limits.fuel,
        }),
    );
    let ran = engine::run(engine, module, guest, limits, allow).map_err(|e| match e {
        engine::EngineError::NotRunnable(m) => Failure::with_code(
            sbx_core::exit::NOT_EXECUTABLE,
            format!("{}: {m}", path.display()),
        ),
        e => Failure::from(e),
    })?;
    let code = ran.outcome.report(limits);
    audit::emit(
        "wasm_end",
        Severity::Info,
        json!({
            "status": code,
            "outcome": match &ran.outcome {
                Outcome::Exit(_) => "exit",
                Outcome::Timeout => "timeout",
                Outcome::OutOfFuel => "fuel_exhausted",
                Outcome::Trap(_) => "trap",
                Outcome::Refused(_) => "instantiate_refused",
            },
            "load_us": load.as_micros() as u64,
            "instantiate_us": ran.instantiate.map(|d| d.as_micros() as u64),
            "fuel_used": ran.fuel_used,
        }),
    );
    Ok(code)
}
