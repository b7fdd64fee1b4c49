//! sbx-wasm's flags: the plugin tier's grants, egress allowlist and limits.

use std::ffi::OsString;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{Argv, is_false, osv};

pub const TOOL: &str = "sbx-wasm";

pub const DEFAULT_MEMORY: &str = "1G";
pub const DEFAULT_MAX_STACK: &str = "512K";
pub const DEFAULT_MAX_TABLE_ELEMENTS: u64 = 100_000;
pub const DEFAULT_MAX_TABLES: usize = 10;
pub const DEFAULT_MAX_MEMORIES: usize = 1;
pub const DEFAULT_MAX_INSTANCES: usize = 10;

/// What sbx-wasm grants the module and how far it may run: every flag but
/// the module.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct WasmSpec {
    /// Preopen DIR read-only as GUEST (default: DIR's canonical path).
    #[arg(long, value_name = "DIR[:GUEST]")]
    #[serde(with = "osv", skip_serializing_if = "Vec::is_empty")]
    pub ro: Vec<OsString>,

    /// Preopen DIR writable as GUEST (default: DIR's canonical path).
    #[arg(long, value_name = "DIR[:GUEST]")]
    #[serde(with = "osv", skip_serializing_if = "Vec::is_empty")]
    pub rw: Vec<OsString>,

    /// Set K to V in the module's environment.
    #[arg(long, value_name = "K=V")]
    #[serde(with = "osv", skip_serializing_if = "Vec::is_empty")]
    pub setenv: Vec<OsString>,

    /// Pass the caller's variable NAME too, or every variable whose name
    /// starts with PREFIX (a secret-looking name only when named exactly).
    #[arg(long, value_name = "NAME|PREFIX*")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pass_env: Vec<String>,

    /// Let a component's outgoing HTTP (wasi:http) reach a DNS name (or
    /// *.domain, or an IP literal) on PORTS (default 80,443): sbx-net's
    /// --allow syntax and matcher. Without any, no request leaves. Repeat.
    #[arg(long, value_name = "NAME[:PORTS]")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,

    /// Read --allow entries from FILE, one per line (# comments).
    #[arg(long, value_name = "FILE")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allow_file: Vec<PathBuf>,

    /// Largest size of each linear memory.
    #[arg(long, value_name = "SIZE", default_value = DEFAULT_MEMORY)]
    #[serde(skip_serializing_if = "is_default_memory")]
    pub memory: String,

    /// End the run after DURATION (exit 124).
    #[arg(long, value_name = "DURATION")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,

    /// Give the module N units of fuel, about one per instruction (exit 124
    /// when it runs out).
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fuel: Option<u64>,

    /// Native stack WebAssembly may use (a deeper recursion traps).
    #[arg(long, value_name = "SIZE", default_value = DEFAULT_MAX_STACK)]
    #[serde(skip_serializing_if = "is_default_stack")]
    pub max_stack: String,

    /// Largest number of elements of each table.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_TABLE_ELEMENTS)]
    #[serde(skip_serializing_if = "is_default_table_elements")]
    pub max_table_elements: u64,

    /// Largest number of tables.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_TABLES)]
    #[serde(skip_serializing_if = "is_default_tables")]
    pub max_tables: usize,

    /// Largest number of linear memories.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_MEMORIES)]
    #[serde(skip_serializing_if = "is_default_memories")]
    pub max_memories: usize,

    /// Largest number of instances.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_INSTANCES)]
    #[serde(skip_serializing_if = "is_default_instances")]
    pub max_instances: usize,

    /// Compile the module even when a cached compilation exists (and
    /// replace it).
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub no_cache: bool,
}

fn is_default_memory(s: &str) -> bool {
    s == DEFAULT_MEMORY
}
fn is_default_stack(s: &str) -> bool {
    s == DEFAULT_MAX_STACK
}
fn is_default_table_elements(n: &u64) -> bool {
    *n == DEFAULT_MAX_TABLE_ELEMENTS
}
fn is_default_tables(n: &usize) -> bool {
    *n == DEFAULT_MAX_TABLES
}
fn is_default_memories(n: &usize) -> bool {
    *n == DEFAULT_MAX_MEMORIES
}
fn is_default_instances(n: &usize) -> bool {
    *n == DEFAULT_MAX_INSTANCES
}

impl Default for WasmSpec {
    fn default() -> Self {
        WasmSpec {
            ro: Vec::new(),
            rw: Vec::new(),
            setenv: Vec::new(),
            pass_env: Vec::new(),
            allow: Vec::new(),
            allow_file: Vec::new(),
            memory: DEFAULT_MEMORY.into(),
            timeout: None,
            fuel: None,
            max_stack: DEFAULT_MAX_STACK.into(),
            max_table_elements: DEFAULT_MAX_TABLE_ELEMENTS,
            max_tables: DEFAULT_MAX_TABLES,
            max_memories: DEFAULT_MAX_MEMORIES,
            max_instances: DEFAULT_MAX_INSTANCES,
            no_cache: false,
        }
    }
}

impl WasmSpec {
    /// sbx-wasm's flags for this spec (before `-- MODULE`).
    pub fn args(&self) -> Vec<OsString> {
        Argv::default()
            .each("--rw", &self.rw)
            .each("--ro", &self.ro)
            .each("--setenv", &self.setenv)
            .each("--pass-env", &self.pass_env)
            .each("--allow", &self.allow)
            .each("--allow-file", &self.allow_file)
            .unless_default("--memory", &self.memory, DEFAULT_MEMORY.into())
            .opt("--timeout", self.timeout.as_ref())
            .opt("--fuel", self.fuel.map(|n| n.to_string()))
            .unless_default("--max-stack", &self.max_stack, DEFAULT_MAX_STACK.into())
            .unless_default(
                "--max-table-elements",
                &self.max_table_elements,
                DEFAULT_MAX_TABLE_ELEMENTS,
            )
            .unless_default("--max-tables", &self.max_tables, DEFAULT_MAX_TABLES)
            .unless_default("--max-memories", &self.max_memories, DEFAULT_MAX_MEMORIES)
            .unless_default(
                "--max-instances",
                &self.max_instances,
                DEFAULT_MAX_INSTANCES,
            )
            .switch("--no-cache", self.no_cache)
            .done()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_round_trips() {
        let full = WasmSpec {
            ro: vec!["/src:/src".into()],
            rw: vec!["/p".into()],
            setenv: vec!["K=V".into()],
            pass_env: vec!["LANG".into(), "MY_*".into()],
            allow: vec!["example.com:8080".into(), "127.0.0.1:80".into()],
            allow_file: vec!["/f".into()],
            memory: "256M".into(),
            timeout: Some("10s".into()),
            fuel: Some(1_000_000),
            max_stack: "1M".into(),
            max_table_elements: 7,
            max_tables: 2,
            max_memories: 3,
            max_instances: 4,
            no_cache: true,
        };
        crate::roundtrip::check(&full, full.args());
        crate::roundtrip::check(&WasmSpec::default(), Vec::new());
    }
}
