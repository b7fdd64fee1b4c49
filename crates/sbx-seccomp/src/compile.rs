//! From the policy document to BPF: seccompiler compiles each filter; the
//! first installed filter gets a prelude of our own in front.
//!
//! seccompiler checks the architecture only, and its rules are per syscall
//! number. On x86_64 that leaves two holes a denylist must close itself:
//! the x32 ABI (the same calls with bit 30 set in the number, which no
//! per-number rule matches) and syscalls newer than seccompiler's table
//! (e.g. `open_tree_attr`), which no rule can name. The prelude kills the
//! first and answers ENOSYS to the second, as Docker does for calls its
//! profile does not know (libc then falls back to an older call).

use std::sync::OnceLock;

use seccompiler::{BpfProgram, TargetArch, sock_filter};

use crate::model::{Action, Document, Filter};

#[cfg(target_arch = "x86_64")]
pub const ARCH: TargetArch = TargetArch::x86_64;
#[cfg(target_arch = "x86_64")]
pub const ARCH_NAME: &str = "x86_64";
#[cfg(target_arch = "x86_64")]
pub const AUDIT_ARCH: u32 = 62 | 0x8000_0000 | 0x4000_0000;
/// First syscall number above seccompiler 0.5's x86_64 table (mseal = 462).
#[cfg(target_arch = "x86_64")]
pub const FIRST_UNKNOWN_NR: u32 = 463;

#[cfg(target_arch = "aarch64")]
pub const ARCH: TargetArch = TargetArch::aarch64;
#[cfg(target_arch = "aarch64")]
pub const ARCH_NAME: &str = "aarch64";
#[cfg(target_arch = "aarch64")]
pub const AUDIT_ARCH: u32 = 183 | 0x8000_0000 | 0x4000_0000;
#[cfg(target_arch = "aarch64")]
pub const FIRST_UNKNOWN_NR: u32 = 463;

/// The x32 ABI marks its syscall numbers with this bit.
pub const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// BPF_LD | BPF_W | BPF_ABS.
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JMP_JEQ_K: u16 = 0x05 | 0x10;
const BPF_JMP_JGE_K: u16 = 0x05 | 0x30;
const BPF_RET_K: u16 = 0x06;
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error("{0}")]
    Seccompiler(#[from] seccompiler::Error),
    #[error("filter '{0}': {1}")]
    Filter(String, String),
}

/// `err: source` on one line.
pub fn one_line(e: &dyn std::error::Error) -> String {
    sbx_core::exit::error_chain(e)
}

/// Compiles one filter with seccompiler.
pub fn filter_bpf(name: &str, f: &Filter) -> Result<BpfProgram, CompileError> {
    let one: Document = [(name.to_string(), f.clone())].into();
    let json = serde_json::to_vec(&one).expect("serialise a filter");
    let mut map = seccompiler::compile_from_json(json.as_slice(), ARCH)?;
    map.remove(name)
        .ok_or_else(|| CompileError::Filter(name.into(), "missing after compilation".into()))
}

/// The prelude: wrong architecture (i386 through `int 0x80`, ...) and x32
/// numbers kill the process; numbers above the table get ENOSYS.
pub fn prelude() -> Vec<sock_filter> {
    let kill = u32::from(seccompiler::SeccompAction::KillProcess);
    let enosys = u32::from(seccompiler::SeccompAction::Errno(libc::ENOSYS as u32));
    let mut p = vec![
        stmt(BPF_LD_W_ABS, OFF_ARCH),
        jump(BPF_JMP_JEQ_K, AUDIT_ARCH, 1, 0),
        stmt(BPF_RET_K, kill),
        stmt(BPF_LD_W_ABS, OFF_NR),
    ];
    if cfg!(target_arch = "x86_64") {
        p.push(jump(BPF_JMP_JGE_K, X32_SYSCALL_BIT, 0, 1));
        p.push(stmt(BPF_RET_K, kill));
    }
    p.push(jump(BPF_JMP_JGE_K, FIRST_UNKNOWN_NR, 0, 1));
    p.push(stmt(BPF_RET_K, enosys));
    p
}

/// One BPF instruction as build.rs writes it: (code, jt, jf, k).
type Insn = (u16, u8, u8, u32);

include!(concat!(env!("OUT_DIR"), "/builtin_bpf.rs"));

/// The BPF build.rs compiled for a built-in profile's filter, named as in
/// the policy document (`0-default-eperm`, `1-strict-allow`).
pub fn precompiled(doc_name: &str) -> Option<BpfProgram> {
    let (profile, filter) = match doc_name.split_once('-')? {
        ("0", rest) => ("default", rest.strip_prefix("default-")?),
        ("1", rest) => ("strict", rest.strip_prefix("strict-")?),
        _ => return None,
    };
    BUILTIN_BPF
        .iter()
        .find(|(p, f, _)| *p == profile && *f == filter)
        .map(|(_, _, insns)| {
            insns
                .iter()
                .map(|&(code, jt, jf, k)| sock_filter { code, jt, jf, k })
                .collect()
        })
}

/// The programs to install, in order (the prelude in front of the first).
/// With `pristine_builtins` (no option edited the profile) the built-in
/// filters are taken as build.rs compiled them.
pub fn programs(
    doc: &Document,
    pristine_builtins: bool,
) -> Result<Vec<(String, BpfProgram)>, CompileError> {
    let mut out = Vec::with_capacity(doc.len());
    for (name, f) in doc {
        let pre = if pristine_builtins {
            precompiled(name)
        } else {
            None
        };
        let mut prog = match pre {
            Some(p) => p,
            None => filter_bpf(name, f)?,
        };
        if out.is_empty() {
            let mut p = prelude();
            p.append(&mut prog);
            prog = p;
        }
        if prog.len() > 4096 {
            return Err(CompileError::Filter(
                name.clone(),
                format!("{} BPF instructions (max 4096)", prog.len()),
            ));
        }
        out.push((name.clone(), prog));
    }
    Ok(out)
}

/// The number of syscall `name` on this architecture, from seccompiler's
/// own table: a one-rule filter is compiled and the number read from its
/// first comparison (arch check: 3 instructions, load nr, JEQ nr).
pub fn syscall_nr(name: &str) -> Option<u32> {
    // The built-in profiles' names were numbered by build.rs the same way.
    if let Ok(i) = BUILTIN_NRS.binary_search_by(|(n, _)| (*n).cmp(name)) {
        return Some(BUILTIN_NRS[i].1);
    }
    static CACHE: OnceLock<std::sync::Mutex<std::collections::HashMap<String, Option<u32>>>> =
        OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(v) = cache.lock().ok()?.get(name) {
        return *v;
    }
    let f = Filter {
        mismatch_action: Action::Allow,
        match_action: Action::Trap,
        rules: vec![crate::model::Rule {
            syscall: name.into(),
            args: None,
            comment: None,
        }],
    };
    let nr = filter_bpf("probe", &f).ok().and_then(|p| {
        let i = p.get(4)?;
        (i.code == BPF_JMP_JEQ_K).then_some(i.k)
    });
    cache.lock().ok()?.insert(name.to_string(), nr);
    nr
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syscall_numbers_match_libc() {
        assert_eq!(syscall_nr("getppid"), Some(libc::SYS_getppid as u32));
        assert_eq!(syscall_nr("clone3"), Some(libc::SYS_clone3 as u32));
        assert_eq!(syscall_nr("read"), Some(libc::SYS_read as u32));
        assert_eq!(syscall_nr("no_such_call"), None);
    }

    /// build.rs numbered the built-in profiles' syscalls as a compile of
    /// a one-rule filter does now, and every name of them is there.
    #[test]
    fn the_built_in_numbers_are_seccompilers() {
        assert!(BUILTIN_NRS.windows(2).all(|w| w[0].0 < w[1].0), "sorted");
        for (name, nr) in BUILTIN_NRS {
            let f = Filter {
                mismatch_action: Action::Allow,
                match_action: Action::Trap,
                rules: vec![crate::model::Rule {
                    syscall: (*name).into(),
                    args: None,
                    comment: None,
                }],
            };
            assert_eq!(filter_bpf("probe", &f).unwrap()[4].k, *nr, "{name}");
        }
        for p in [
            crate::policy::Profile::Default,
            crate::policy::Profile::Strict,
        ] {
            for f in crate::policy::builtin(p).values() {
                for r in &f.rules {
                    assert!(
                        BUILTIN_NRS.iter().any(|(n, _)| *n == r.syscall),
                        "{}",
                        r.syscall
                    );
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn first_unknown_is_above_the_table() {
        assert_eq!(syscall_nr("mseal"), Some(FIRST_UNKNOWN_NR - 1));
    }

    #[test]
    fn builtins_compile_within_limits() {
        for p in [
            crate::policy::Profile::Default,
            crate::policy::Profile::Strict,
        ] {
            let doc = crate::policy::builtin(p);
            let progs = programs(&doc, false).unwrap();
            assert_eq!(progs.len(), doc.len());
            assert!(progs[0].1.starts_with(&prelude()));
            // build.rs compiled the same programs.
            assert_eq!(programs(&doc, true).unwrap(), progs);
            for (name, f) in &doc {
                assert_eq!(
                    precompiled(name).unwrap(),
                    filter_bpf(name, f).unwrap(),
                    "{name}"
                );
            }
        }
    }
}
