//! sbx-gitguard (being built).

use clap::Parser;
use sbx_core::cli::CommonArgs;

pub const MAN: sbx_core::man::ManInfo = sbx_core::man::ManInfo {
    about: "sbx-gitguard",
    exit_status: "125 when the tool fails.",
    inherited_state: "Nothing yet.",
    extra: &[],
};

#[derive(Parser, Debug)]
#[command(name = "sbx-gitguard", version, about = "sbx-gitguard (being built)")]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonArgs,
}

pub fn main() -> ! {
    sbx_core::cli::run_main("sbx-gitguard", || {
        let cli: Cli = sbx_core::cli::parse("sbx-gitguard")?;
        sbx_core::cli::init("sbx-gitguard", &cli.common)?;
        Err(sbx_core::Failure::new("not built yet"))
    })
}
