//! `--seccomp sbx`: sbx-seccomp's default profile (the same document
//! sbx-seccomp compiles, `sbx_seccomp::policy::DEFAULT_JSON`) translated into
//! the OCI/Docker seccomp profile format, for the engine to install instead
//! of its own default. Each filter of the document becomes rules with its
//! action (errno N, kill-process), conditions ANDed within a rule, rules of
//! one syscall ORed; calls no rule matches are allowed (every filter of the
//! default profile allows on mismatch).
//!
//! Delivery: Docker Engine takes the profile's JSON inline
//! (`seccomp=<json>`, as the docker CLI sends it); Podman's compatible API
//! takes a path on the engine host, so sbx-container writes it into its
//! per-run directory, removed at clean-up.

use sbx_seccomp::model::{Action, Document, Op};
use serde_json::{Value, json};

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("--seccomp sbx: the built-in profile does not parse: {0}")]
    Parse(String),
    #[error(
        "--seccomp sbx: filter '{0}' does not allow on mismatch: an engine profile has one default action"
    )]
    Mismatch(String),
    #[error("--seccomp sbx: action {0:?} has no engine equivalent")]
    Action(String),
}

fn action(a: &Action) -> Result<(Value, Option<u32>), SeccompError> {
    Ok(match a {
        Action::Allow => (json!("SCMP_ACT_ALLOW"), None),
        Action::Errno(n) => (json!("SCMP_ACT_ERRNO"), Some(*n)),
        Action::KillProcess => (json!("SCMP_ACT_KILL_PROCESS"), None),
        Action::KillThread => (json!("SCMP_ACT_KILL_THREAD"), None),
        Action::Log => (json!("SCMP_ACT_LOG"), None),
        Action::Trap => (json!("SCMP_ACT_TRAP"), None),
        Action::Trace(_) => return Err(SeccompError::Action("trace".into())),
    })
}

/// The engine profile (JSON text) for sbx-seccomp's default document.
pub fn sbx_default_profile() -> Result<String, SeccompError> {
    let doc: Document = serde_json::from_str(sbx_seccomp::policy::DEFAULT_JSON)
        .map_err(|e| SeccompError::Parse(e.to_string()))?;
    let mut rules = Vec::new();
    for (name, f) in &doc {
        if f.mismatch_action != Action::Allow {
            return Err(SeccompError::Mismatch(name.clone()));
        }
        let (act, errno) = action(&f.match_action)?;
        for r in &f.rules {
            let mut rule = json!({"names": [r.syscall], "action": act});
            if let Some(n) = errno {
                rule["errnoRet"] = json!(n);
            }
            if let Some(args) = &r.args {
                let a: Vec<Value> = args
                    .iter()
                    .map(|c| {
                        let (op, value, two) = match c.op {
                            Op::Eq => ("SCMP_CMP_EQ", c.val, 0),
                            Op::Ne => ("SCMP_CMP_NE", c.val, 0),
                            Op::Lt => ("SCMP_CMP_LT", c.val, 0),
                            Op::Le => ("SCMP_CMP_LE", c.val, 0),
                            Op::Gt => ("SCMP_CMP_GT", c.val, 0),
                            Op::Ge => ("SCMP_CMP_GE", c.val, 0),
                            // libseccomp: (arg & value) == valueTwo
                            Op::MaskedEq(mask) => ("SCMP_CMP_MASKED_EQ", mask, c.val),
                        };
                        json!({"index": c.index, "value": value, "valueTwo": two, "op": op})
                    })
                    .collect();
                rule["args"] = Value::Array(a);
            }
            rules.push(rule);
        }
    }
    Ok(json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "syscalls": rules,
    })
    .to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_profile_translates() {
        let p: Value = serde_json::from_str(&sbx_default_profile().unwrap()).unwrap();
        let rules = p["syscalls"].as_array().unwrap();
        assert!(rules.len() >= 60, "{}", rules.len());
        let mount = rules.iter().find(|r| r["names"][0] == "mount").unwrap();
        assert_eq!(mount["action"], "SCMP_ACT_ERRNO");
        assert_eq!(mount["errnoRet"], 1);
        let clone_ns = rules
            .iter()
            .find(|r| r["names"][0] == "clone" && r["args"][0]["op"] == "SCMP_CMP_MASKED_EQ")
            .unwrap();
        assert_eq!(
            clone_ns["args"][0]["value"],
            clone_ns["args"][0]["valueTwo"]
        );
        assert!(
            rules
                .iter()
                .any(|r| r["names"][0] == "kexec_load" && r["action"] == "SCMP_ACT_KILL_PROCESS")
        );
    }
}
