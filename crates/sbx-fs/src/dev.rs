//! The sandbox's minimal /dev: a small tmpfs with the harmless character
//! devices bound from the host, a private devpts instance, /dev/shm, and
//! the usual symlinks.

use std::path::Path;

use crate::plan::{Kind, Op, Plan, PlanError, What, open_source};
use crate::spec::Spec;

/// Host device nodes bound into the minimal /dev.
pub const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

pub const DEV_SIZE: u64 = 64 << 10;

/// The /dev ops.
pub fn ops(plan: &mut Plan, spec: &Spec) -> Result<(), PlanError> {
    plan.ops.push(Op::new(
        "/dev",
        Kind::Dir,
        What::Tmpfs {
            size: DEV_SIZE,
            mode: 0o755,
            owned: false,
        },
        "dev",
    ));
    for d in DEVICES {
        let host = Path::new("/dev").join(d);
        // /dev/tty may be missing in odd containers: then there is none.
        let Ok(src) = open_source("dev", &host, true, true) else {
            continue;
        };
        plan.sources.push(src);
        let i = plan.sources.len() - 1;
        plan.ops.push(Op::new(
            &host,
            Kind::File,
            What::Bind { src: i, ro: false },
            "dev",
        ));
    }
    plan.ops
        .push(Op::new("/dev/pts", Kind::Dir, What::Devpts, "dev"));
    plan.ops.push(Op::new(
        "/dev/shm",
        Kind::Dir,
        What::Tmpfs {
            size: spec.tmp_size,
            mode: 0o1777,
            owned: false,
        },
        "dev",
    ));
    for (name, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        plan.ops.push(Op::new(
            Path::new("/dev").join(name),
            Kind::File,
            What::Symlink {
                target: target.into(),
            },
            "dev",
        ));
    }
    Ok(())
}
