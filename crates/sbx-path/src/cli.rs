//! `sbx-path check` (being built).

use clap::Parser;
use sbx_core::cli::CommonArgs;

pub const MAN: sbx_core::man::ManInfo = sbx_core::man::ManInfo {
    about: "sbx-path",
    exit_status: "125 when the tool fails.",
    inherited_state: "Nothing yet.",
    extra: &[],
};

#[derive(Parser, Debug)]
#[command(name = "sbx-path", version, about = "sbx-path (being built)")]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonArgs,
}

pub fn main() -> ! {
    sbx_core::cli::run_main("sbx-path", || {
        let cli: Cli = sbx_core::cli::parse("sbx-path")?;
        sbx_core::cli::init("sbx-path", &cli.common)?;
        Err(sbx_core::Failure::new("not built yet"))
    })
}
