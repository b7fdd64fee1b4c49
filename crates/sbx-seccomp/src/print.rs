//! `--print`: the filter as a table.

use std::fmt::Write;

use crate::compile;
use crate::model::{Cond, Document, Op};

fn show_cond(c: &Cond) -> String {
    let arg = format!("arg{}", c.index);
    let v = format!("{:#x}", c.val);
    let s = match &c.op {
        Op::Eq => format!("{arg} == {v}"),
        Op::Ne => format!("{arg} != {v}"),
        Op::Ge => format!("{arg} >= {v}"),
        Op::Gt => format!("{arg} > {v}"),
        Op::Le => format!("{arg} <= {v}"),
        Op::Lt => format!("{arg} < {v}"),
        Op::MaskedEq(m) => format!("{arg} & {m:#x} == {v}"),
    };
    match &c.comment {
        Some(cm) => format!("{s} ({cm})"),
        None => s,
    }
}

/// Renders the document as the rows the kernel will evaluate, in order.
/// With `notify` (no --action), the EPERM answers of the notify filter are
/// shown as `notify(EPERM)`: EPERM plus a `syscall_denied` alert when an
/// audit log is configured.
pub fn table(doc: &Document, header: &str, notify: bool) -> String {
    let mut rows: Vec<[String; 5]> = Vec::new();
    let row = |f: &str, s: &str, nr: &str, w: &str, a: &str| -> [String; 5] {
        [f.into(), s.into(), nr.into(), w.into(), a.into()]
    };
    if !doc.is_empty() {
        let arch = compile::ARCH_NAME;
        rows.push(row(
            "(prelude)",
            &format!("(arch != {arch})"),
            "-",
            "i386 int 0x80, foreign ABIs",
            "kill_process",
        ));
        if cfg!(target_arch = "x86_64") {
            rows.push(row(
                "(prelude)",
                "(x32 ABI)",
                ">=0x40000000",
                "any",
                "kill_process",
            ));
        }
        rows.push(row(
            "(prelude)",
            "(newer than the table)",
            &format!(">={}", compile::FIRST_UNKNOWN_NR),
            "any",
            "errno(ENOSYS)",
        ));
    }
    for (name, f) in doc {
        let fname = name.split_once('-').map(|(_, n)| n).unwrap_or(name);
        for r in &f.rules {
            let nr = compile::syscall_nr(&r.syscall)
                .map(|n| n.to_string())
                .unwrap_or("?".into());
            let when = match &r.args {
                None => "always".to_string(),
                Some(cs) => cs.iter().map(show_cond).collect::<Vec<_>>().join(" && "),
            };
            let action = if notify
                && (name == crate::notify::NOTIFY_FILTER
                    || (name == crate::notify::DENY_FILTER
                        && crate::notify::deny_mergeable(doc, crate::notify::NOTIFY_FILTER)))
                && f.match_action == crate::model::Action::Errno(libc::EPERM as u32)
            {
                "notify(EPERM)".to_string()
            } else {
                f.match_action.show()
            };
            rows.push(row(fname, &r.syscall, &nr, &when, &action));
        }
        rows.push(row(
            fname,
            "(any other)",
            "-",
            "-",
            &f.mismatch_action.show(),
        ));
    }
    let mut w = [0usize; 5];
    let titles = ["FILTER", "SYSCALL", "NR", "WHEN", "ACTION"];
    for r in rows
        .iter()
        .map(|r| r.each_ref().map(|s| s.len()))
        .chain([titles.map(str::len)])
    {
        for i in 0..5 {
            w[i] = w[i].max(r[i]);
        }
    }
    let mut out = String::new();
    let _ = writeln!(out, "# {header}");
    if doc.is_empty() {
        let _ = writeln!(out, "# no filter: every syscall is allowed");
        return out;
    }
    let line = |out: &mut String, r: [&str; 5]| {
        let _ = writeln!(
            out,
            "{:<w0$}  {:<w1$}  {:<w2$}  {:<w3$}  {}",
            r[0],
            r[1],
            r[2],
            r[3],
            r[4],
            w0 = w[0],
            w1 = w[1],
            w2 = w[2],
            w3 = w[3]
        );
    };
    line(&mut out, titles);
    for r in &rows {
        line(&mut out, r.each_ref().map(String::as_str));
    }
    let _ = writeln!(
        out,
        "# every filter runs; the most restrictive answer wins (kill > errno > notify > log > allow)"
    );
    if notify && doc.contains_key(crate::notify::NOTIFY_FILTER) {
        let _ = writeln!(
            out,
            "# notify(EPERM): the call fails with EPERM and, with an audit log, a notifier writes a syscall_denied alert (ENOSYS if the notifier is gone)"
        );
    }
    out
}
