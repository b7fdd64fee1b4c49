//! sbx-creds (being built).

use clap::Parser;
use sbx_core::cli::CommonArgs;

pub const MAN: sbx_core::man::ManInfo = sbx_core::man::ManInfo {
    about: "sbx-creds",
    exit_status: "125 when the tool fails.",
    inherited_state: "Nothing yet.",
    extra: &[],
};

#[derive(Parser, Debug)]
#[command(name = "sbx-creds", version, about = "sbx-creds (being built)")]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonArgs,
}

pub fn main() -> ! {
    sbx_core::cli::run_main("sbx-creds", || {
        let cli: Cli = sbx_core::cli::parse("sbx-creds")?;
        sbx_core::cli::init("sbx-creds", &cli.common)?;
        Err(sbx_core::Failure::new("not built yet"))
    })
}
