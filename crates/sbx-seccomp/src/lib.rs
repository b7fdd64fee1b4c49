//! sbx-seccomp (being built).

use clap::Parser;
use sbx_core::cli::CommonArgs;

pub const MAN: sbx_core::man::ManInfo = sbx_core::man::ManInfo {
    about: "sbx-seccomp",
    exit_status: "125 when the tool fails.",
    inherited_state: "Nothing yet.",
    extra: &[],
};

#[derive(Parser, Debug)]
#[command(name = "sbx-seccomp", version, about = "sbx-seccomp (being built)")]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonArgs,
}

pub fn main() -> ! {
    sbx_core::cli::run_main("sbx-seccomp", || {
        let cli: Cli = sbx_core::cli::parse("sbx-seccomp")?;
        sbx_core::cli::init("sbx-seccomp", &cli.common)?;
        Err(sbx_core::Failure::new("not built yet"))
    })
}
