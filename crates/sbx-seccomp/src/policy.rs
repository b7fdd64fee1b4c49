//! From the options to the policy document: a built-in profile or a
//! `--policy` file, then `--allow`, `--allow-ptrace`, `--action`, `--deny`
//! and `--no-network` on top.

use std::path::{Path, PathBuf};

use crate::compile;
use crate::model::{Action, ArgLen, Cond, Document, Filter, Op, Rule};

/// The built-in profiles, checked at build time by build.rs.
pub const DEFAULT_JSON: &str = include_str!("../profiles/default.json");
pub const STRICT_JSON: &str = include_str!("../profiles/strict.json");

/// EPERM and ENOSYS.
pub const EPERM: u32 = libc::EPERM as u32;
pub const ENOSYS: u32 = libc::ENOSYS as u32;

/// The ptrace family `--allow-ptrace` lets through.
pub const PTRACE_FAMILY: &[&str] = &[
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
];

/// `personality(ADDR_NO_RANDOMIZE)`: debuggers turn ASLR off.
pub const ADDR_NO_RANDOMIZE: u64 = 0x0040000;

/// The profiles and actions are values of sbx-seccomp's flags (sbx-spec).
pub use sbx_spec::seccomp::{DenyAction, Profile};

/// The filter action of a `--action` value.
pub fn deny_action(a: DenyAction) -> Action {
    match a {
        DenyAction::Errno => Action::Errno(EPERM),
        DenyAction::Kill => Action::KillProcess,
        DenyAction::Log => Action::Log,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("--policy {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--policy {path}: not a seccompiler policy: {msg}")]
    Parse { path: PathBuf, msg: String },
    #[error("--policy {path}: filter '{filter}': {msg}")]
    Compile {
        path: PathBuf,
        filter: String,
        msg: String,
    },
    #[error("--{flag} {name}: unknown syscall on {arch}")]
    UnknownSyscall {
        flag: &'static str,
        name: String,
        arch: &'static str,
    },
    #[error("--allow and --deny both name {0}")]
    AllowDeny(String),
}

/// What the options ask for.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub profile: Option<Profile>,
    pub policy: Option<PathBuf>,
    pub deny: Vec<String>,
    pub allow: Vec<String>,
    pub action: Option<DenyAction>,
    pub no_network: bool,
    pub allow_ptrace: bool,
}

impl Options {
    /// Whether the built-in profile's filters are installed as compiled at
    /// build time (no option edits them).
    pub fn builtins_pristine(&self) -> bool {
        self.allow.is_empty() && !self.allow_ptrace && self.action.is_none()
    }
}

/// The profile used: `--profile`, else `default` unless `--policy` is given.
pub fn effective_profile(o: &Options) -> Profile {
    match (o.profile, &o.policy) {
        (Some(p), _) => p,
        (None, Some(_)) => Profile::None,
        (None, None) => Profile::Default,
    }
}

fn parse_builtin(text: &str) -> Document {
    // build.rs already parsed and compiled it: this cannot fail.
    serde_json::from_str(text).expect("built-in profile checked at build time")
}

/// The built-in profile's filters, their names prefixed so that they sort
/// (and are installed) before a policy file's.
pub fn builtin(p: Profile) -> Document {
    let mut doc = Document::new();
    let mut add = |prefix: &str, text: &str| {
        for (k, v) in parse_builtin(text) {
            doc.insert(format!("{prefix}{k}"), v);
        }
    };
    match p {
        Profile::None => {}
        Profile::Default => add("0-default-", DEFAULT_JSON),
        Profile::Strict => {
            add("0-default-", DEFAULT_JSON);
            add("1-strict-", STRICT_JSON);
        }
    }
    doc
}

/// Reads a `--policy` file and checks that seccompiler compiles each filter.
pub fn read_policy(path: &Path) -> Result<Document, PolicyError> {
    let text = sbx_core::input::read_regular_string(path, sbx_core::input::CONFIG_CAP).map_err(
        |source| PolicyError::Read {
            path: path.to_path_buf(),
            source,
        },
    )?;
    let doc: Document = serde_json::from_str(&text).map_err(|e| PolicyError::Parse {
        path: path.to_path_buf(),
        msg: e.to_string(),
    })?;
    if doc.is_empty() {
        return Err(PolicyError::Parse {
            path: path.to_path_buf(),
            msg: "no filters".into(),
        });
    }
    for (name, f) in &doc {
        compile::filter_bpf(name, f).map_err(|e| PolicyError::Compile {
            path: path.to_path_buf(),
            filter: name.clone(),
            msg: crate::compile::one_line(&e),
        })?;
    }
    // A policy file's filters come after the built-in ones.
    Ok(doc
        .into_iter()
        .map(|(k, v)| (format!("2-policy-{k}"), v))
        .collect())
}

fn check_names(flag: &'static str, names: &[String]) -> Result<(), PolicyError> {
    for n in names {
        if compile::syscall_nr(n).is_none() {
            return Err(PolicyError::UnknownSyscall {
                flag,
                name: n.clone(),
                arch: compile::ARCH_NAME,
            });
        }
    }
    Ok(())
}

/// Builds the whole policy document for `o`. Nothing is installed here.
pub fn build(o: &Options) -> Result<Document, PolicyError> {
    check_names("deny", &o.deny)?;
    check_names("allow", &o.allow)?;
    if let Some(n) = o.allow.iter().find(|n| o.deny.contains(n)) {
        return Err(PolicyError::AllowDeny(n.clone()));
    }
    let mut doc = builtin(effective_profile(o));
    if let Some(p) = &o.policy {
        doc.extend(read_policy(p)?);
    }

    let mut allow: Vec<String> = o.allow.clone();
    if o.allow_ptrace {
        allow.extend(PTRACE_FAMILY.iter().map(|s| s.to_string()));
        for f in doc.values_mut().filter(|f| f.is_denylist()) {
            for r in f.rules.iter_mut().filter(|r| r.syscall == "personality") {
                if let Some(args) = &mut r.args
                    && args.iter().all(|c| c.op == Op::Ne)
                {
                    args.push(cond(
                        0,
                        Op::Ne,
                        ADDR_NO_RANDOMIZE,
                        "ADDR_NO_RANDOMIZE (--allow-ptrace)",
                    ));
                }
            }
        }
    }
    for name in &allow {
        allow_syscall(&mut doc, name);
    }

    if let Some(a) = o.action {
        set_action(&mut doc, deny_action(a));
    }

    let deny_action = o.action.map(deny_action).unwrap_or(Action::Errno(EPERM));
    if !o.deny.is_empty() {
        let rules = o
            .deny
            .iter()
            .map(|n| Rule {
                syscall: n.clone(),
                args: None,
                comment: Some("--deny".into()),
            })
            .collect();
        doc.insert("3-deny".into(), denylist(deny_action.clone(), rules));
    }
    if o.no_network {
        let mut rules = vec![Rule {
            syscall: "socket".into(),
            args: Some(vec![cond(0, Op::Ne, libc::AF_UNIX as u64, "not AF_UNIX")]),
            comment: Some("--no-network: only AF_UNIX sockets".into()),
        }];
        // io_uring can create sockets (IORING_OP_SOCKET) without socket(2).
        for s in ["io_uring_setup", "io_uring_enter", "io_uring_register"] {
            rules.push(Rule {
                syscall: s.into(),
                args: None,
                comment: Some("--no-network: io_uring can open sockets".into()),
            });
        }
        doc.insert("4-no-network".into(), denylist(deny_action, rules));
    }
    Ok(doc)
}

fn cond(index: u8, op: Op, val: u64, comment: &str) -> Cond {
    Cond {
        index,
        len: ArgLen::Dword,
        op,
        val,
        comment: Some(comment.into()),
    }
}

fn denylist(action: Action, rules: Vec<Rule>) -> Filter {
    Filter {
        mismatch_action: Action::Allow,
        match_action: action,
        rules,
    }
}

/// `--allow NAME`: removed from every denylist, added (unconditionally) to
/// every allowlist.
fn allow_syscall(doc: &mut Document, name: &str) {
    for f in doc.values_mut() {
        if f.is_denylist() {
            f.rules.retain(|r| r.syscall != name);
        } else if f.is_allowlist() {
            f.rules.retain(|r| r.syscall != name);
            f.rules.push(Rule {
                syscall: name.into(),
                args: None,
                comment: Some("--allow".into()),
            });
        }
    }
}

/// `--action`: the action of every denial. An ENOSYS answer (clone3) is a
/// redirection to a call the filter can check, not a denial: it stays.
fn set_action(doc: &mut Document, a: Action) {
    for f in doc.values_mut() {
        if f.is_denylist() && f.match_action != Action::Errno(ENOSYS) {
            f.match_action = a.clone();
        } else if f.is_allowlist() {
            f.mismatch_action = a.clone();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules_for<'a>(doc: &'a Document, name: &str) -> Vec<(&'a str, &'a Rule)> {
        doc.iter()
            .flat_map(|(k, f)| {
                f.rules
                    .iter()
                    .filter(move |r| r.syscall == name)
                    .map(move |r| (k.as_str(), r))
            })
            .collect()
    }

    #[test]
    fn default_profile_has_the_issue_list() {
        let doc = builtin(Profile::Default);
        for s in [
            "mount",
            "umount2",
            "pivot_root",
            "chroot",
            "swapon",
            "swapoff",
            "reboot",
            "kexec_load",
            "kexec_file_load",
            "init_module",
            "finit_module",
            "delete_module",
            "bpf",
            "perf_event_open",
            "keyctl",
            "add_key",
            "request_key",
            "userfaultfd",
            "unshare",
            "setns",
            "clone",
            "clone3",
            "fsopen",
            "fsconfig",
            "fsmount",
            "fspick",
            "move_mount",
            "open_tree",
            "mount_setattr",
            "open_by_handle_at",
            "name_to_handle_at",
            "ptrace",
            "process_vm_readv",
            "process_vm_writev",
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
            "iopl",
            "ioperm",
            "acct",
            "quotactl",
            "syslog",
            "settimeofday",
            "clock_settime",
            "clock_adjtime",
            "adjtimex",
            "personality",
            "ioctl",
        ] {
            assert!(
                !rules_for(&doc, s).is_empty(),
                "{s} not in the default profile"
            );
        }
        assert_eq!(doc["0-default-enosys"].match_action, Action::Errno(ENOSYS));
    }

    #[test]
    fn only_clone_ioctl_personality_clock_gettime_socket_carry_argument_checks() {
        // Everything else is argument-free, so the kernel's action cache
        // answers allowed calls without running the filter (clock_gettime
        // reaches the filter rarely: the vDSO answers it without a syscall).
        let doc = builtin(Profile::Default);
        let mut with_args: Vec<&str> = doc
            .values()
            .flat_map(|f| f.rules.iter())
            .filter(|r| r.args.is_some())
            .map(|r| r.syscall.as_str())
            .collect();
        with_args.sort();
        with_args.dedup();
        // socket: the address family (AF_VSOCK is refused).
        assert_eq!(
            with_args,
            ["clock_gettime", "clone", "ioctl", "personality", "socket"]
        );
    }

    #[test]
    fn allow_and_action_and_ptrace() {
        let o = Options {
            allow: vec!["mount".into()],
            allow_ptrace: true,
            action: Some(DenyAction::Kill),
            ..Default::default()
        };
        let doc = build(&o).unwrap();
        assert!(rules_for(&doc, "mount").is_empty());
        assert!(rules_for(&doc, "ptrace").is_empty());
        assert!(!rules_for(&doc, "unshare").is_empty());
        assert_eq!(doc["0-default-eperm"].match_action, Action::KillProcess);
        // clone3 keeps ENOSYS: glibc must fall back to clone.
        assert_eq!(doc["0-default-enosys"].match_action, Action::Errno(ENOSYS));
        let p = &rules_for(&doc, "personality")[0].1;
        assert!(
            p.args
                .as_ref()
                .unwrap()
                .iter()
                .any(|c| c.val == ADDR_NO_RANDOMIZE)
        );
    }

    #[test]
    fn strict_allow_adds_to_the_allowlist() {
        let o = Options {
            profile: Some(Profile::Strict),
            allow: vec!["mknod".into()],
            ..Default::default()
        };
        let doc = build(&o).unwrap();
        assert!(
            doc["1-strict-allow"]
                .rules
                .iter()
                .any(|r| r.syscall == "mknod")
        );
    }

    #[test]
    fn bad_names() {
        let o = Options {
            deny: vec!["nosuchcall".into()],
            ..Default::default()
        };
        assert!(
            build(&o)
                .unwrap_err()
                .to_string()
                .contains("--deny nosuchcall: unknown syscall")
        );
        let o = Options {
            deny: vec!["mount".into()],
            allow: vec!["mount".into()],
            ..Default::default()
        };
        assert!(matches!(build(&o), Err(PolicyError::AllowDeny(_))));
    }
}
