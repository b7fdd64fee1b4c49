//! The WebAssembly engine: configuration, limits, one run of a WASI
//! command, and how its end becomes an exit status.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;
use wasmtime::{Config, Engine, Linker, Module, ResourceLimiter, Store, Trap};
use wasmtime_wasi::p1::{self, WasiP1Ctx};
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtxBuilder};

use sbx_core::{Severity, audit};

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

struct State {
    wasi: WasiP1Ctx,
    limits: Limits,
    hits: Hits,
}

impl ResourceLimiter for State {
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

/// Runs `module`'s `_start` with the guest's view and the limits.
pub fn run(
    engine: &Engine,
    module: &Module,
    guest: &Guest,
    limits: &Limits,
) -> Result<Ran, EngineError> {
    let mut b = WasiCtxBuilder::new();
    b.inherit_stdio().args(&guest.args).envs(&guest.env);
    // WASI calls run on this thread: no thread pool for file I/O.
    b.allow_blocking_current_thread(true);
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
    let state = State {
        wasi: b.build_p1(),
        limits: limits.clone(),
        hits: Hits::default(),
    };
    let mut linker: Linker<State> = Linker::new(engine);
    p1::add_to_linker_sync(&mut linker, |s: &mut State| &mut s.wasi)
        .map_err(werr("linking WASI"))?;
    let mut store = Store::new(engine, state);
    store.limiter(|s| s as &mut dyn ResourceLimiter);
    if let Some(f) = limits.fuel {
        store.set_fuel(f).map_err(werr("setting fuel"))?;
    }
    // One epoch tick ends the run: the ticker thread advances the epoch
    // once, when the timeout has elapsed.
    store.set_epoch_deadline(1);
    let done = Arc::new(AtomicBool::new(false));
    if let Some(t) = limits.timeout {
        let (engine, done) = (engine.clone(), done.clone());
        std::thread::Builder::new()
            .name("sbx-wasm-timeout".into())
            .spawn(move || {
                std::thread::sleep(t);
                if !done.load(Ordering::Relaxed) {
                    engine.increment_epoch();
                }
            })
            .map_err(|e| EngineError::Wasmtime {
                op: "starting the timeout thread",
                msg: e.to_string(),
            })?;
    }
    let t0 = std::time::Instant::now();
    let ran = |outcome, instantiate, store: &Store<State>| Ran {
        outcome,
        instantiate,
        fuel_used: limits
            .fuel
            .and_then(|f| Some(f.saturating_sub(store.get_fuel().ok()?))),
    };
    let instance = match linker.instantiate(&mut store, module) {
        Ok(i) => i,
        Err(e) => {
            let o = classify(e).or_else(|e| {
                // A limit refused at instantiation (a memory minimum
                // beyond --memory, too many instances, tables or
                // memories): the module's doing, an alert; anything else
                // (an import sbx-wasm does not provide) cannot run here.
                let msg = format!("{e:#}");
                if msg.contains("limit") {
                    Ok(Outcome::Refused(msg))
                } else {
                    Err(EngineError::NotRunnable(format!(
                        "instantiating the module: {msg}"
                    )))
                }
            })?;
            return Ok(ran(o, None, &store));
        }
    };
    let instantiated = t0.elapsed();
    let start = instance
        .get_typed_func::<(), ()>(&mut store, "_start")
        .map_err(|_| {
            EngineError::NotRunnable(
                "the module exports no function _start (not a WASI command)".into(),
            )
        })?;
    let r = start.call(&mut store, ());
    done.store(true, Ordering::Relaxed);
    let o = match r {
        Ok(()) => Outcome::Exit(0),
        Err(e) => classify(e).map_err(werr("running the module"))?,
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
