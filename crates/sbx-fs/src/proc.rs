//! The sandbox's /proc: a new proc instance for the new PID namespace
//! (so /proc/1 is the sandbox's init and no host process is visible), with
//! the entries that reveal or reach the host kernel masked or read-only, as
//! runc does.

use crate::plan::{Kind, Op, Plan, What};

/// /proc entries hidden (as runc's masked paths).
pub const PROC_MASKED: &[(&str, Kind)] = &[
    ("/proc/kcore", Kind::File),
    ("/proc/keys", Kind::File),
    ("/proc/key-users", Kind::File),
    ("/proc/sysrq-trigger", Kind::File),
    ("/proc/timer_list", Kind::File),
    ("/proc/timer_stats", Kind::File),
    ("/proc/sched_debug", Kind::File),
    ("/proc/latency_stats", Kind::File),
    ("/proc/kallsyms", Kind::File),
    ("/proc/kmsg", Kind::File),
    ("/proc/interrupts", Kind::File),
    ("/proc/acpi", Kind::Dir),
    ("/proc/asound", Kind::Dir),
    ("/proc/scsi", Kind::Dir),
];

/// /proc entries kept read-only (as runc's readonly paths).
pub const PROC_READONLY: &[&str] = &["/proc/sys", "/proc/bus", "/proc/fs", "/proc/irq"];

/// The /proc ops: the mount, then the masks (optional: an entry this
/// kernel lacks is skipped, never created).
pub fn ops(plan: &mut Plan) {
    plan.ops
        .push(Op::new("/proc", Kind::Dir, What::Proc, "proc"));
    for (p, k) in PROC_MASKED {
        let mut op = Op::new(*p, *k, What::Deny, "proc mask");
        op.optional = true;
        plan.ops.push(op);
    }
    for p in PROC_READONLY {
        let mut op = Op::new(*p, Kind::Dir, What::ReadOnly, "proc read-only");
        op.optional = true;
        plan.ops.push(op);
    }
}
