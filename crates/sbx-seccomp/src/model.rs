//! The policy document: seccompiler's JSON format, read and written with
//! serde so that profiles can be edited (`--allow`, `--deny`, `--action`)
//! before seccompiler compiles them.
//!
//! A document is an object of named filters; each filter is
//! `{"mismatch_action": A, "filter_action": A, "filter": [RULE...]}` and a
//! rule is `{"syscall": NAME, "args": [COND...], "comment": "..."}`. A rule
//! without `args` matches every call of the syscall; the conditions of a
//! rule are ANDed, the rules of one syscall ORed. This file is also compiled
//! into build.rs, which checks the built-in profiles.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The action of a filter (seccompiler's `SeccompAction` JSON form).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Allow,
    Errno(u32),
    KillThread,
    KillProcess,
    Log,
    Trace(u32),
    Trap,
}

/// Operand width of a condition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ArgLen {
    Dword,
    Qword,
}

/// Comparison of a condition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Eq,
    Ge,
    Gt,
    Le,
    Lt,
    MaskedEq(u64),
    Ne,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cond {
    pub index: u8,
    #[serde(rename = "type")]
    pub len: ArgLen,
    pub op: Op,
    pub val: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub syscall: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<Cond>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Filter {
    #[serde(alias = "default_action")]
    pub mismatch_action: Action,
    #[serde(alias = "filter_action", rename = "match_action")]
    pub match_action: Action,
    #[serde(rename = "filter")]
    pub rules: Vec<Rule>,
}

/// Named filters, installed in name order.
pub type Document = BTreeMap<String, Filter>;

impl Action {
    /// The kernel's precedence: higher wins when stacked filters disagree.
    pub fn precedence(&self) -> u8 {
        match self {
            Action::KillProcess => 7,
            Action::KillThread => 6,
            Action::Trap => 5,
            Action::Errno(_) => 4,
            Action::Trace(_) => 2,
            Action::Log => 1,
            Action::Allow => 0,
        }
    }

    /// Short form for tables: `allow`, `errno(EPERM)`, `kill_process`, ...
    pub fn show(&self) -> String {
        match self {
            Action::Allow => "allow".into(),
            Action::Errno(n) => format!("errno({})", errno_name(*n)),
            Action::KillThread => "kill_thread".into(),
            Action::KillProcess => "kill_process".into(),
            Action::Log => "log".into(),
            Action::Trace(n) => format!("trace({n})"),
            Action::Trap => "trap".into(),
        }
    }
}

/// Symbolic names of the errnos a policy commonly returns.
pub fn errno_name(n: u32) -> String {
    match n {
        1 => "EPERM".into(),
        13 => "EACCES".into(),
        38 => "ENOSYS".into(),
        22 => "EINVAL".into(),
        97 => "EAFNOSUPPORT".into(),
        _ => n.to_string(),
    }
}

impl Filter {
    /// A filter that denies (its matches are not allowed, the rest is).
    pub fn is_denylist(&self) -> bool {
        self.mismatch_action == Action::Allow && self.match_action != Action::Allow
    }

    /// A filter that allows its matches and denies the rest.
    pub fn is_allowlist(&self) -> bool {
        self.match_action == Action::Allow && self.mismatch_action != Action::Allow
    }
}
