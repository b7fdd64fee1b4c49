//! PathResolver (being built).

#[cfg(feature = "cli")]
pub mod cli;
