//! Conventions shared by every sbx tool.
//!
//! Each tool applies one layer and then runs the next command of the chain.
//! This crate holds what they must all do the same way: the argv rules
//! (`--`, `--config`), the exit status rules, SBX_ID, the audit log, tracing,
//! fd hygiene, fd passing, signal forwarding and die-with-parent.

pub mod addrclass;
pub mod audit;
pub mod auditchain;
pub mod chain;
pub mod child;
pub mod cli;
pub mod deathwatch;
pub mod dirents;
pub mod envpolicy;
pub mod escape;
pub mod exit;
pub mod fds;
pub mod fsstamp;
pub mod guardian;
pub mod id;
pub mod input;
pub mod man;
pub mod passfd;
pub mod pidfd;
pub mod registry;
pub mod rmtree;
pub mod sbxnet;
pub mod signals;
pub mod sigsys;
pub mod supervise;
pub mod toolid;
pub mod units;
pub mod violations;

pub use audit::Severity;
pub use exit::Failure;
