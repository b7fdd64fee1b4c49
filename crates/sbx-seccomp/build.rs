//! Compiles the built-in profiles (profiles/*.json) at build time, as
//! Firecracker does: each must parse as a policy document and compile with
//! seccompiler for the target architecture, so a mistake in a profile is a
//! build error. The BPF goes to $OUT_DIR/builtin_bpf.rs (used as is when a
//! profile is not edited by options); the JSON is embedded too
//! (include_str!) for --print and for edits.

#[path = "src/model.rs"]
#[allow(dead_code)]
mod model;

use std::path::Path;

fn main() {
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").expect("target arch");
    let target = match arch.as_str() {
        "x86_64" => seccompiler::TargetArch::x86_64,
        "aarch64" => seccompiler::TargetArch::aarch64,
        "riscv64" => seccompiler::TargetArch::riscv64,
        other => panic!("sbx-seccomp: unsupported target architecture {other}"),
    };
    let dir = Path::new("profiles");
    println!("cargo:rerun-if-changed=profiles");
    println!("cargo:rerun-if-changed=src/model.rs");
    let mut out = String::from(
        "/// (profile, filter, BPF as (code, jt, jf, k)), compiled by build.rs.\n\
         pub static BUILTIN_BPF: &[(&str, &str, &[Insn])] = &[\n",
    );
    // Every syscall the profiles name (numbered below).
    let mut names = std::collections::BTreeSet::new();
    for name in ["default", "strict"] {
        let path = dir.join(format!("{name}.json"));
        println!("cargo:rerun-if-changed={}", path.display());
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("profile {}: {e}", path.display()));
        let doc: model::Document = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("profile {}: {e}", path.display()));
        assert!(!doc.is_empty(), "profile {}: no filters", path.display());
        for f in doc.values() {
            names.extend(f.rules.iter().map(|r| r.syscall.clone()));
        }
        for (fname, filter) in &doc {
            let one: model::Document = [(fname.clone(), filter.clone())].into();
            let json = serde_json::to_string(&one).unwrap();
            let map = seccompiler::compile_from_json(json.as_bytes(), target)
                .unwrap_or_else(|e| panic!("profile {} filter {fname}: {e}", path.display()));
            let prog = &map[fname];
            assert!(prog.len() < 4096, "profile {name} filter {fname}: too long");
            out.push_str(&format!("    ({name:?}, {fname:?}, &["));
            for i in prog {
                out.push_str(&format!("({}, {}, {}, {:#x}),", i.code, i.jt, i.jf, i.k));
            }
            out.push_str("]),\n");
        }
    }
    out.push_str("];\n");
    // The number of every syscall the built-in profiles name, found as at
    // run time (compile::syscall_nr: a one-rule filter, its comparison
    // read): seccompiler builds its whole table for every compile, and the
    // notifier numbered each name at every start (issue 19).
    out.push_str("/// (syscall, number) of every syscall the built-in profiles name, sorted.\n");
    out.push_str("pub static BUILTIN_NRS: &[(&str, u32)] = &[\n");
    for n in &names {
        let probe = model::Filter {
            mismatch_action: model::Action::Allow,
            match_action: model::Action::Trap,
            rules: vec![model::Rule {
                syscall: n.clone(),
                args: None,
                comment: None,
            }],
        };
        let one: model::Document = [("probe".to_string(), probe)].into();
        let json = serde_json::to_string(&one).unwrap();
        let map = seccompiler::compile_from_json(json.as_bytes(), target)
            .unwrap_or_else(|e| panic!("syscall {n}: {e}"));
        // Arch check (3 instructions), load nr, JEQ nr.
        let i = &map["probe"][4];
        assert_eq!(i.code, 0x05 | 0x10, "syscall {n}: not a JEQ");
        out.push_str(&format!("    ({n:?}, {}),\n", i.k));
    }
    out.push_str("];\n");
    let dst = Path::new(&std::env::var("OUT_DIR").unwrap()).join("builtin_bpf.rs");
    std::fs::write(dst, out).expect("write builtin_bpf.rs");
}
