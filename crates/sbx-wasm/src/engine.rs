//! The WebAssembly engine: configuration, limits, one run of a WASI
//! command, and how its end becomes an exit status.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use wasmtime::component::{self, Component, ResourceTable};
use wasmtime::{Config, Engine, Linker, Module, Precompiled, ResourceLimiter, Store, Trap};
use wasmtime_wasi::p1::{self, WasiP1Ctx};
use wasmtime_wasi::p2::bindings::sync::Command;
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use sbx_allow::Policy;
use sbx_core::{Severity, audit};

use crate::egress::Egress;

/// A trap (unreachable, out-of-bounds access, stack overflow, ...) or a
/// module that cannot be instantiated within the limits: what an aborting
/// native program gives (128+SIGABRT), as the wasmtime CLI does.
pub const EXIT_TRAP: i32 = 134;
/// --timeout elapsed or --fuel ran out (as timeout(1)).
pub const EXIT_BUDGET: i32 = 124;

/// The settings that change the compiled code (part of the cache key
/// through the engine's compatibility hash).
#[derive(Debug, Clone, Copy)]
pub struct EngineOpts {
    /// Count fuel (only with --fuel: it costs speed).
    pub fuel: bool,
    /// Bytes of native stack wasm may use (stack overflow traps beyond).
    pub max_stack: usize,
}

pub fn engine(o: EngineOpts) -> wasmtime::Result<Engine> {
    let mut c = Config::new();
    c.epoch_interruption(true);
    c.consume_fuel(o.fuel);
    c.max_wasm_stack(o.max_stack);
    Engine::new(&c)
}

/// Limits of one run.
#[derive(Debug, Clone)]
pub struct Limits {
    pub memory: u64,
    pub table_elements: u64,
    pub instances: usize,
    pub tables: usize,
    pub memories: usize,
    pub timeout: Option<Duration>,
    pub fuel: Option<u64>,
}

/// A preopened directory: the directory (already opened) and its name in
/// the guest.
pub struct Preopen {
    /// A path that names the directory for this process: a checked fd
    /// (`/proc/self/fd/N`) or a path in sbx-fs's mount namespace.
    pub host: PathBuf,
    pub guest: String,
    pub writable: bool,
}

/// What the guest is given besides the module.
pub struct Guest {
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub preopens: Vec<Preopen>,
}

/// Which limit stopped a growth (reported once each).
#[derive(Default)]
struct Hits {
    memory: bool,
    table: bool,
}

/// A store's data: the WASI state of the guest's kind (preview 1 for a
/// core module, [`P2`] for a component) and the limits.
struct State<W> {
    wasi: W,
    limits: Limits,
    hits: Hits,
}

/// A component's WASI state: preview 2 and wasi:http, whose every outgoing
/// request goes through [`Egress`].
struct P2 {
    ctx: WasiCtx,
    table: ResourceTable,
    http: WasiHttpCtx,
    egress: Egress,
}

impl WasiView for State<P2> {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi.ctx,
            table: &mut self.wasi.table,
        }
    }
}

impl WasiHttpView for State<P2> {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.wasi.http,
            table: &mut self.wasi.table,
            hooks: &mut self.wasi.egress,
        }
    }
}

impl<W: Send> ResourceLimiter for State<W> {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _max: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let ok = desired as u64 <= self.limits.memory;
        if !ok && !self.hits.memory {
            self.hits.memory = true;
            audit::emit(
                "wasm_limit",
                Severity::Alert,
                json!({ "limit": "memory", "max": self.limits.memory, "current": current, "desired": desired }),
            );
        }
        Ok(ok)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _max: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let ok = desired as u64 <= self.limits.table_elements;
        if !ok && !self.hits.table {
            self.hits.table = true;
            audit::emit(
                "wasm_limit",
                Severity::Alert,
                json!({ "limit": "table_elements", "max": self.limits.table_elements, "current": current, "desired": desired }),
            );
        }
        Ok(ok)
    }

    fn instances(&self) -> usize {
        self.limits.instances
    }

    fn tables(&self) -> usize {
        self.limits.tables
    }

    fn memories(&self) -> usize {
        self.limits.memories
    }
}

/// How a run ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// `_start` returned (0) or the guest called `proc_exit(N)`.
    Exit(i32),
    Timeout,
    OutOfFuel,
    /// A trap; the text names it.
    Trap(String),
    /// The module could not be instantiated (a limit, a missing import).
    Refused(String),
}

impl Outcome {
    /// The exit status, and the audit event for an abnormal end.
    pub fn report(&self, limits: &Limits) -> i32 {
        match self {
            Outcome::Exit(n) => *n,
            Outcome::Timeout => {
                audit::emit(
                    "wasm_timeout",
                    Severity::Alert,
                    json!({ "timeout_ms": limits.timeout.map(|t| t.as_millis() as u64) }),
                );
                EXIT_BUDGET
            }
            Outcome::OutOfFuel => {
                audit::emit(
                    "wasm_fuel_exhausted",
                    Severity::Alert,
                    json!({ "fuel": limits.fuel }),
                );
                EXIT_BUDGET
            }
            Outcome::Trap(t) => {
                audit::emit("wasm_trap", Severity::Alert, json!({ "trap": t }));
                EXIT_TRAP
            }
            Outcome::Refused(e) => {
                audit::emit(
                    "wasm_instantiate_refused",
                    Severity::Alert,
                    json!({ "error": e }),
                );
                EXIT_TRAP
            }
        }
    }
}

/// A run: how it ended, how long instantiation took, the fuel used.
pub struct Ran {
    pub outcome: Outcome,
    pub instantiate: Option<Duration>,
    pub fuel_used: Option<u64>,
}

/// Errors that are sbx-wasm's own (exit 125).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("preopen {path} as {guest}: {msg}")]
    Preopen {
        path: String,
        guest: String,
        msg: String,
    },
    #[error("{op}: {msg}")]
    Wasmtime { op: &'static str, msg: String },
    /// The module cannot run here (exit 126): a missing import, no _start.
    #[error("{0}")]
    NotRunnable(String),
}

fn werr(op: &'static str) -> impl Fn(wasmtime::Error) -> EngineError {
    move |e| EngineError::Wasmtime {
        op,
        msg: format!("{e:#}"),
    }
}

/// What runs: a core module (a WASI preview-1 command) or a component (a
/// WASI preview-2 command, which may use wasi:http).
pub enum Program {
    Module(Module),
    Component(Component),
}

/// Whether `bytes` (a binary that starts with `\0asm`) is a component:
/// its version field's layer is 1 (a core module's is 0).
pub fn is_component(bytes: &[u8]) -> bool {
    bytes.get(6..8) == Some(&[1, 0])
}

impl Program {
    pub fn compile(engine: &Engine, bytes: &[u8]) -> wasmtime::Result<Self> {
        Ok(if is_component(bytes) {
            Program::Component(Component::new(engine, bytes)?)
        } else {
            Program::Module(Module::new(engine, bytes)?)
        })
    }

    pub fn serialize(&self) -> wasmtime::Result<Vec<u8>> {
        match self {
            Program::Module(m) => m.serialize(),
            Program::Component(c) => c.serialize(),
        }
    }

    /// Loads a precompiled artifact of either kind.
    ///
    /// # Safety
    /// As `Module::deserialize`: `art` must be an artifact this wasmtime
    /// produced (it checks the version and settings, not the code).
    pub unsafe fn deserialize(engine: &Engine, art: &[u8]) -> wasmtime::Result<Self> {
        // SAFETY: the caller's promise, passed on.
        unsafe {
            Ok(match Engine::detect_precompiled(art) {
                Some(Precompiled::Component) => {
                    Program::Component(Component::deserialize(engine, art)?)
                }
                _ => Program::Module(Module::deserialize(engine, art)?),
            })
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Program::Module(_) => "module",
            Program::Component(_) => "component",
        }
    }
}

/// A host call that blocks (a sleep, a wait on a socket) sees no epoch:
/// when the run has not ended this long after --timeout, the process ends.
const TIMEOUT_GRACE: Duration = Duration::from_secs(2);

/// Runs `program` (a module's `_start`, a component's `wasi:cli/run`)
/// with the guest's view, the limits and, for a component's wasi:http,
/// the egress allowlist.
pub fn run(
    engine: &Engine,
    program: &Program,
    guest: &Guest,
    limits: &Limits,
    allow: &Policy,
) -> Result<Ran, EngineError> {
    let mut b = WasiCtxBuilder::new();
    b.inherit_stdio().args(&guest.args).envs(&guest.env);
    // WASI calls run on this thread: no thread pool for file I/O.
    b.allow_blocking_current_thread(true);
    // No wasi:sockets: no TCP, no UDP, no name lookup, no address.
    b.allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .socket_addr_check(|_, _| Box::pin(async { false }));
    for p in &guest.preopens {
        let perms = if p.writable {
            FsPerms::ReadWrite
        } else {
            FsPerms::ReadOnly
        };
        b.preopened_dir(&p.host, &p.guest, perms)
            .map_err(|e| EngineError::Preopen {
                path: p.host.display().to_string(),
                guest: p.guest.clone(),
                msg: format!("{e:#}"),
            })?;
    }
    let done = Arc::new(AtomicBool::new(false));
    if let Some(t) = limits.timeout {
        let (engine, done, limits) = (engine.clone(), done.clone(), limits.clone());
        std::thread::Builder::new()
            .name("sbx-wasm-timeout".into())
            .spawn(move || {
                std::thread::sleep(t);
                if done.load(Ordering::Relaxed) {
                    return;
                }
                // The running code traps at its next check.
                engine.increment_epoch();
                let t1 = Instant::now();
                while t1.elapsed() < TIMEOUT_GRACE {
                    std::thread::sleep(Duration::from_millis(20));
                    if done.load(Ordering::Relaxed) {
                        return;
                    }
                }
                std::process::exit(Outcome::Timeout.report(&limits));
            })
            .map_err(|e| EngineError::Wasmtime {
                op: "starting the timeout thread",
                msg: e.to_string(),
            })?;
    }
    // Waits of the HTTP client end a little after the timeout, so that
    // the guest is back in its own code, where the epoch ends it.
    let deadline = limits
        .timeout
        .map(|t| Instant::now() + t + TIMEOUT_GRACE / 2);
    let r = match program {
        Program::Module(m) => run_module(engine, m, b.build_p1(), limits),
        Program::Component(c) => {
            let wasi = P2 {
                ctx: b.build(),
                table: ResourceTable::new(),
                http: WasiHttpCtx::new(),
                egress: Egress {
                    policy: allow.clone(),
                    deadline,
                },
            };
            run_component(engine, c, wasi, limits)
        }
    };
    done.store(true, Ordering::Relaxed);
    r
}

/// A store for one run: the limits, the fuel, and the epoch deadline (one
/// tick ends the run: the timeout thread advances the epoch once).
fn store<W: Send>(
    engine: &Engine,
    wasi: W,
    limits: &Limits,
) -> Result<Store<State<W>>, EngineError> {
    let state = State {
        wasi,
        limits: limits.clone(),
        hits: Hits::default(),
    };
    let mut store = Store::new(engine, state);
    store.limiter(|s| s as &mut dyn ResourceLimiter);
    if let Some(f) = limits.fuel {
        store.set_fuel(f).map_err(werr("setting fuel"))?;
    }
    store.set_epoch_deadline(1);
    Ok(store)
}

fn ran<W>(outcome: Outcome, instantiate: Option<Duration>, store: &Store<State<W>>) -> Ran {
    Ran {
        outcome,
        instantiate,
        fuel_used: store
            .data()
            .limits
            .fuel
            .and_then(|f| Some(f.saturating_sub(store.get_fuel().ok()?))),
    }
}

/// Why instantiation failed: a limit (the guest's doing, an alert) or
/// anything else (an import sbx-wasm does not provide: it cannot run here).
fn not_instantiated(e: wasmtime::Error) -> Result<Outcome, EngineError> {
    classify(e).or_else(|e| {
        let msg = format!("{e:#}");
        if msg.contains("limit") {
            Ok(Outcome::Refused(msg))
        } else {
            Err(EngineError::NotRunnable(format!("instantiating: {msg}")))
        }
    })
}

fn run_module(
    engine: &Engine,
    module: &Module,
    wasi: WasiP1Ctx,
    limits: &Limits,
) -> Result<Ran, EngineError> {
    let mut linker: Linker<State<WasiP1Ctx>> = Linker::new(engine);
    p1::add_to_linker_sync(&mut linker, |s: &mut State<WasiP1Ctx>| &mut s.wasi)
        .map_err(werr("linking WASI"))?;
    let mut store = store(engine, wasi, limits)?;
    let t0 = Instant::now();
    let instance = match linker.instantiate(&mut store, module) {
        Ok(i) => i,
        Err(e) => return Ok(ran(not_instantiated(e)?, None, &store)),
    };
    let instantiated = t0.elapsed();
    let start = instance
        .get_typed_func::<(), ()>(&mut store, "_start")
        .map_err(|_| {
            EngineError::NotRunnable(
                "the module exports no function _start (not a WASI command)".into(),
            )
        })?;
    let o = match start.call(&mut store, ()) {
        Ok(()) => Outcome::Exit(0),
        Err(e) => classify(e).map_err(werr("running the module"))?,
    };
    Ok(ran(o, Some(instantiated), &store))
}

fn run_component(
    engine: &Engine,
    component: &Component,
    wasi: P2,
    limits: &Limits,
) -> Result<Ran, EngineError> {
    let mut linker: component::Linker<State<P2>> = component::Linker::new(engine);
    // WASI preview 2 (its sockets are disabled in the context) and
    // wasi:http (every request through Egress).
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(werr("linking WASI"))?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_sync(&mut linker)
        .map_err(werr("linking wasi:http"))?;
    let mut store = store(engine, wasi, limits)?;
    let t0 = Instant::now();
    let command = match Command::instantiate(&mut store, component, &linker) {
        Ok(c) => c,
        Err(e) => return Ok(ran(not_instantiated(e)?, None, &store)),
    };
    let instantiated = t0.elapsed();
    let o = match command.wasi_cli_run().call_run(&mut store) {
        Ok(Ok(())) => Outcome::Exit(0),
        // run returned an error: what the wasmtime CLI gives, 1.
        Ok(Err(())) => Outcome::Exit(1),
        Err(e) => classify(e).map_err(werr("running the component"))?,
    };
    Ok(ran(o, Some(instantiated), &store))
}

/// A guest's end from the error a call returned: `proc_exit` or a trap;
/// anything else is given back.
fn classify(e: wasmtime::Error) -> Result<Outcome, wasmtime::Error> {
    if let Some(x) = e.downcast_ref::<I32Exit>() {
        return Ok(Outcome::Exit(x.0));
    }
    if let Some(t) = e.downcast_ref::<Trap>() {
        return Ok(match t {
            Trap::Interrupt => Outcome::Timeout,
            Trap::OutOfFuel => Outcome::OutOfFuel,
            t => Outcome::Trap(t.to_string()),
        });
    }
    Err(e)
}
