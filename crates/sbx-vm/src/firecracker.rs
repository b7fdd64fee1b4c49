//! Firecracker backend (filled in below).
use crate::options::Plan;
use crate::run::Running;
use crate::rundir::RunDir;
use sbx_core::exit::Failure;
use std::path::Path;

pub fn start(_plan: &Plan, _rd: &RunDir, _console: &Path, _log: &Path) -> Result<Running, Failure> {
    Err(Failure::new("firecracker backend: not implemented"))
}
