//! sbx-spec: the configuration of each sbx layer as one plain struct, the
//! role oci-spec plays for youki.
//!
//! Each tool's clap `Cli` flattens its spec (`#[command(flatten)]`), so the
//! flags, `--config` sections, man pages and completions come from the
//! fields here; sbx-policy fills the same structs and renders them
//! ([`FsSpec::args`] and the like) for `chain`, or serialises them for
//! `compile`. Serde keys are the long flag names (kebab-case), the format
//! of `--config` (sbx-core's cli.rs); fields at their default are left out.
//! A flag renamed here changes the tool, the chain and the compiled
//! configuration together; the round-trip tests check that each `args()`
//! parses back to the same spec.

use std::ffi::{OsStr, OsString};

use serde::{Deserialize, Serialize};

pub mod cgroup;
pub mod container;
pub mod fs;
pub mod gitguard;
pub mod gvisor;
pub mod invariants;
pub mod net;
pub mod seccomp;
pub mod vm;
pub mod wasm;

pub use cgroup::CgroupSpec;
pub use container::ContainerSpec;
pub use fs::FsSpec;
pub use gitguard::{GitguardRunSpec, PlantsSpec, RepoSpec, StageLimits};
pub use gvisor::GvisorSpec;
pub use net::NetSpec;
pub use seccomp::{DenyAction, Profile, SeccompSpec};
pub use vm::VmSpec;
pub use wasm::WasmSpec;

/// One layer of a chain: a tool and its spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layer {
    /// `sbx-gitguard run`.
    Gitguard(GitguardRunSpec),
    /// `sbx-gitguard plants`.
    Plants(PlantsSpec),
    Cgroup(CgroupSpec),
    Net(NetSpec),
    Fs(FsSpec),
    Seccomp(SeccompSpec),
    /// sbx-gvisor.
    Gvisor(GvisorSpec),
    /// The microVM tier.
    Vm(VmSpec),
    /// The container tier.
    Container(ContainerSpec),
    /// The plugin tier (WebAssembly).
    Wasm(WasmSpec),
    /// An sbx tool given only its `--config` section (sbx-creds).
    Tool {
        tool: String,
    },
    /// A program run as written, not an sbx tool (a systemd scope).
    Argv(Vec<String>),
}

impl Layer {
    /// The sbx binary that runs this layer (None: [`Layer::Argv`]).
    pub fn tool(&self) -> Option<&str> {
        Some(match self {
            Layer::Gitguard(_) | Layer::Plants(_) => gitguard::TOOL,
            Layer::Cgroup(_) => cgroup::TOOL,
            Layer::Net(_) => net::TOOL,
            Layer::Fs(_) => fs::TOOL,
            Layer::Seccomp(_) => seccomp::TOOL,
            Layer::Gvisor(_) => gvisor::TOOL,
            Layer::Vm(_) => vm::TOOL,
            Layer::Container(_) => container::TOOL,
            Layer::Wasm(_) => wasm::TOOL,
            Layer::Tool { tool } => tool,
            Layer::Argv(_) => return None,
        })
    }

    /// The arguments after the program (the subcommand first, where the
    /// tool has subcommands).
    pub fn args(&self) -> Vec<OsString> {
        match self {
            Layer::Gitguard(s) => s.args(),
            Layer::Plants(s) => s.args(),
            Layer::Cgroup(s) => s.args(),
            Layer::Net(s) => s.args(),
            Layer::Fs(s) => s.args(),
            Layer::Seccomp(s) => s.args(),
            Layer::Gvisor(s) => s.args(),
            Layer::Vm(s) => s.args(),
            Layer::Container(s) => s.args(),
            Layer::Wasm(s) => s.args(),
            Layer::Tool { .. } => Vec::new(),
            Layer::Argv(v) => v.iter().skip(1).map(OsString::from).collect(),
        }
    }

    /// Whether the layer's tool reads its section of a `--config` file
    /// (`plants` takes none: its section belongs to `run`).
    pub fn takes_config(&self) -> bool {
        !matches!(self, Layer::Plants(_) | Layer::Argv(_))
    }
}

/// The layers in the order they wrap each other (the outermost first),
/// then the command.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChainSpec {
    pub layers: Vec<Layer>,
    #[serde(with = "osv")]
    pub cmd: Vec<OsString>,
}

impl ChainSpec {
    /// The first layer of this kind (`pick` returns its spec).
    pub fn find<'a, T>(&'a self, pick: impl Fn(&'a Layer) -> Option<&'a T>) -> Option<&'a T> {
        self.layers.iter().find_map(pick)
    }
}

/// Builds a tool's argv from its fields; the flag names are written once,
/// next to the fields, in each spec's `args`.
#[derive(Default)]
pub(crate) struct Argv(Vec<OsString>);

impl Argv {
    pub(crate) fn word(&mut self, w: impl AsRef<OsStr>) -> &mut Self {
        self.0.push(w.as_ref().to_os_string());
        self
    }

    /// `--flag VALUE`.
    pub(crate) fn val(&mut self, flag: &str, v: impl AsRef<OsStr>) -> &mut Self {
        self.word(flag).word(v)
    }

    /// `--flag VALUE` when there is one.
    pub(crate) fn opt<V: AsRef<OsStr>>(&mut self, flag: &str, v: Option<V>) -> &mut Self {
        if let Some(v) = v {
            self.val(flag, v);
        }
        self
    }

    /// `--flag V` for each value.
    pub(crate) fn each<V: AsRef<OsStr>>(
        &mut self,
        flag: &str,
        vs: impl IntoIterator<Item = V>,
    ) -> &mut Self {
        for v in vs {
            self.val(flag, v);
        }
        self
    }

    /// A switch.
    pub(crate) fn switch(&mut self, flag: &str, on: bool) -> &mut Self {
        if on {
            self.word(flag);
        }
        self
    }

    /// `--flag VALUE` unless VALUE is the default (which the tool supplies).
    pub(crate) fn unless_default<V: PartialEq + ToString>(
        &mut self,
        flag: &str,
        v: &V,
        default: V,
    ) -> &mut Self {
        if *v != default {
            self.val(flag, v.to_string());
        }
        self
    }

    pub(crate) fn done(&mut self) -> Vec<OsString> {
        std::mem::take(&mut self.0)
    }
}

pub(crate) fn is_false(b: &bool) -> bool {
    !*b
}

/// `Vec<OsString>` as an array of strings: `--config` is JSON, which holds
/// no bytes that are not UTF-8 (serialising one is an error naming it,
/// never a lossy copy).
pub(crate) mod osv {
    use std::ffi::OsString;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(v: &[OsString], s: S) -> Result<S::Ok, S::Error> {
        let strs = v
            .iter()
            .map(|o| {
                o.to_str().ok_or_else(|| {
                    serde::ser::Error::custom(format!("{} is not UTF-8", o.to_string_lossy()))
                })
            })
            .collect::<Result<Vec<&str>, _>>()?;
        strs.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<OsString>, D::Error> {
        Ok(Vec::<String>::deserialize(d)?
            .into_iter()
            .map(OsString::from)
            .collect())
    }
}

#[cfg(test)]
pub(crate) mod roundtrip {
    use clap::{Args, FromArgMatches};

    /// Parses `args` as clap would for a Cli flattening `T`, and checks
    /// serde too: JSON (the `--config` format) and back.
    pub fn check<T>(spec: &T, args: Vec<std::ffi::OsString>)
    where
        T: Args + FromArgMatches + PartialEq + std::fmt::Debug + serde::Serialize,
        T: serde::de::DeserializeOwned,
    {
        let cmd = T::augment_args(clap::Command::new("t").no_binary_name(true));
        let m = cmd
            .try_get_matches_from(&args)
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        let back = T::from_arg_matches(&m).unwrap();
        assert_eq!(&back, spec, "{args:?}");
        let json = serde_json::to_string(spec).unwrap();
        let back: T = serde_json::from_str(&json).unwrap();
        assert_eq!(&back, spec, "{json}");
    }
}
