//! Test helper: a minimal sbx supervisor, `sbx_seccomp_testsup AUDIT_LOG --
//! CMD...`. It forks CMD with sbx_core's Supervisor (which reports a SIGSYS
//! death as a `seccomp_kill` alert) and exits with CMD's status. The
//! sbx-seccomp tests use it to check kill reporting without depending on
//! sbx-fs or sbx-cgroup. Not installed.

use std::ffi::OsString;
use std::path::Path;

fn main() {
    sbx_core::cli::run_main("sbx-testsup", || {
        let args: Vec<OsString> = std::env::args_os().skip(1).collect();
        if args.len() < 3 || args[1] != "--" {
            return Err(sbx_core::Failure::new(
                "usage: sbx_seccomp_testsup AUDIT_LOG -- CMD...",
            ));
        }
        sbx_core::id::ensure()?;
        sbx_core::audit::init("sbx-testsup", Some(Path::new(&args[0])))?;
        let argv = &args[2..];
        let mut cmd = sbx_core::supervise::command(argv, None)?;
        let keep: Vec<i32> = sbx_core::audit::get()
            .and_then(|a| a.handoff(&argv[0], &mut cmd))
            .into_iter()
            .collect();
        let mut sup = sbx_core::supervise::Supervisor::spawn(cmd, &keep)?;
        Ok(sup.run_to_end()?)
    })
}
