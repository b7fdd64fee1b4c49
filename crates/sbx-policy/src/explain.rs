//! `sbx-policy explain`: what the sandbox allows and denies, as a table a
//! person reads, and which rules could not be enforced.

use std::fmt::Write;

use sbx_spec::{ChainSpec, FsSpec, Layer, NetSpec};

use crate::map::{Policy, Status};

/// The low-trust chain `chain` would run for this policy (the same
/// ChainSpec it renders; the command is a placeholder), its sbx-fs and
/// sbx-net specs: what the tables below read.
struct Chain {
    spec: ChainSpec,
    fs: FsSpec,
    net: NetSpec,
}

impl Chain {
    fn of(p: &Policy) -> Chain {
        let (spec, _) = crate::chain::low_spec(p, Some("ID"), true, &[], &[], &["CMD".into()]);
        let fs = spec
            .find(|l| match l {
                Layer::Fs(f) => Some(f),
                _ => None,
            })
            .cloned()
            .unwrap_or_default();
        let net = spec
            .find(|l| match l {
                Layer::Net(n) => Some(n),
                _ => None,
            })
            .cloned()
            .unwrap_or_default();
        Chain { spec, fs, net }
    }

    /// One line per layer, outermost first: the tool and its arguments.
    fn layer_lines(&self) -> Vec<String> {
        self.spec
            .layers
            .iter()
            .map(|l| {
                let prog = match l {
                    Layer::Argv(v) => v.first().cloned().unwrap_or_default(),
                    _ => l.tool().unwrap_or_default().to_string(),
                };
                std::iter::once(prog)
                    .chain(
                        l.args()
                            .iter()
                            .map(|a| crate::chain::quote(&a.to_string_lossy())),
                    )
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect()
    }
}

/// The sbx-fs invariants, present whatever the rules say.
pub const INVARIANTS: &[&str] = &[
    "nothing of the host is visible unless granted; the system (/usr, /bin, /lib*, /etc) read-only",
    "$HOME and /tmp are empty private tmpfs; /proc shows only the sandbox; minimal /dev",
    "hidden: /etc/shadow, /etc/gshadow, .env and .env.* at any depth, ~/.aws, ~/.netrc, credentials* under a home (fs_denied alert)",
    "read-only in a writable project, at any depth: .git/config, .git/hooks, .git/info, .claude (settings*.json, skills, commands, agents, hooks), .mcp.json, .vscode, .idea, .envrc, .gitmodules, .cargo/config[.toml], .npmrc, .yarnrc[.yml], .pnpmfile.cjs, .pre-commit-config.yaml, .cursor, .continue, .devcontainer, .direnv, .tool-versions, [.]mise.toml, .python-version, and the scripts hooks run (fs_write_denied alert; created during the run: moved to a quarantine at the end, fs_protected_created alert)",
    "never written on the host: .git/HEAD, .git/objects, .git/refs (git commits into a stage; sbx-gitguard verifies and imports it after the command)",
    "no mount, unmount, chroot, pivot_root; no TIOCSTI (syscall_denied alert)",
];

/// Why `git config --local` fails inside, and what to do instead (the
/// same words as sbx-fs's fs_write_denied hint).
pub const GIT_CONFIG_NOTE: &str = sbx_spec::invariants::GIT_CONFIG_HINT;

/// A table a person reads. Every cell is escaped for the terminal: rules,
/// paths and file names come from the project's `.claude/settings*.json`,
/// which a cloned repository or an earlier run can ship, and a rule holding
/// ESC sequences or a newline painted over the table or forged a row.
fn table(out: &mut String, head: &[&str], rows: &[Vec<String>]) {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| esc(c)).collect())
        .collect();
    let rows = &rows[..];
    let n = head.len();
    let mut w: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate().take(n - 1) {
            w[i] = w[i].max(c.chars().count()).min(48);
        }
    }
    let line = |out: &mut String, cells: &[String]| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 < n {
                let _ = write!(s, "{:<width$}  ", c, width = w[i]);
            } else {
                s.push_str(c);
            }
        }
        out.push_str(s.trim_end());
        out.push('\n');
    };
    line(out, &head.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    line(
        out,
        &w.iter()
            .take(n - 1)
            .map(|&x| "-".repeat(x))
            .chain(["-".repeat(head[n - 1].len())])
            .collect::<Vec<_>>(),
    );
    for r in rows {
        line(out, r);
    }
}

/// (ACCESS, WHAT) rows: what the low-trust chain allows.
fn allows(p: &Policy, c: &Chain) -> Vec<Vec<String>> {
    let mut rows: Vec<Vec<String>> = Vec::new();
    for d in &c.fs.rw {
        rows.push(vec!["write".into(), d.to_string_lossy().into_owned()]);
    }
    for d in &c.fs.ro {
        rows.push(vec!["read".into(), d.to_string_lossy().into_owned()]);
    }
    rows.push(vec![
        "read".into(),
        "the system: /usr /bin /sbin /lib* /etc (read-only)".into(),
    ]);
    rows.push(vec![
        "git identity".into(),
        if c.fs.git_identity {
            "the host's user.name/user.email (only) as ~/.gitconfig in the sandbox's HOME (off: --no-git-identity, settings \"sbx\": {\"gitIdentity\": false})".into()
        } else {
            "none offered (--no-git-identity or sbx.gitIdentity false): git commit needs git -c user.email=... or GIT_AUTHOR_*/GIT_COMMITTER_*".into()
        },
    ]);
    for d in &c.net.allow {
        rows.push(vec![
            "connect".into(),
            format!("{d} ports 80,443 (and its DNS lookups)"),
        ]);
    }
    match &p.exec_allow {
        Some(x) if !x.any => {
            for r in &x.allow {
                rows.push(vec![
                    "run".into(),
                    format!("{} (the agent's command)", r.rule),
                ]);
            }
            if x.kernel_enforced() {
                for f in &x.files {
                    rows.push(vec!["execute".into(), f.display().to_string()]);
                }
                rows.push(vec![
                    "execute".into(),
                    "the command itself, sh, bash, env, #! interpreters, git's helpers, the dynamic loader".into(),
                ]);
            } else {
                rows.push(vec![
                    "execute".into(),
                    "anything an allowed command starts (invoke mode)".into(),
                ]);
            }
        }
        _ => rows.push(vec![
            "execute".into(),
            "any program visible in the sandbox".into(),
        ]),
    }
    rows
}

/// (DENY, WHAT) rows: what it denies, the invariants last.
fn denies(p: &Policy, c: &Chain) -> Vec<Vec<String>> {
    let mut rows: Vec<Vec<String>> = Vec::new();
    for d in &c.fs.deny {
        rows.push(vec!["hidden".into(), d.to_string_lossy().into_owned()]);
    }
    rows.push(vec![
        "hidden".into(),
        "every other host path not granted above".into(),
    ]);
    rows.push(vec![
        "connect".into(),
        "every other name, every raw IP, non-TCP traffic other than DNS; no inbound".into(),
    ]);
    if let Some(x) = &p.exec_allow {
        if !x.any {
            rows.push(vec![
                "run".into(),
                "any other command as the agent's command (126, command_denied alert)".into(),
            ]);
        }
        for r in &x.deny {
            rows.push(vec![
                "run".into(),
                format!("{} (the agent's command)", r.rule),
            ]);
        }
        if x.kernel_enforced() {
            rows.push(vec![
                "execute".into(),
                "every program not listed above (Landlock; exec_denied alert)".into(),
            ]);
        }
    }
    rows.push(vec![
        "syscalls".into(),
        "the default seccomp profile (mount, unshare of namespaces, ptrace, bpf, kexec, ...)"
            .into(),
    ]);
    for inv in INVARIANTS {
        rows.push(vec!["always".into(), inv.to_string()]);
    }
    rows.push(vec!["always".into(), GIT_CONFIG_NOTE.into()]);
    rows
}

/// `explain --json`: the same account as [`render`], one object.
pub fn json(p: &Policy) -> serde_json::Value {
    use serde_json::json;
    let pairs = |rows: Vec<Vec<String>>, k: &str| -> Vec<serde_json::Value> {
        rows.into_iter()
            .map(|r| json!({ k: r[0], "what": r[1] }))
            .collect()
    };
    let lp = crate::limitplan::plan(&p.limits, &crate::limitplan::detect(), true);
    let c = Chain::of(p);
    json!({
        "project": p.cwd,
        "project_why": p.project_why,
        "start": p.start,
        "settings": p.files,
        "sandbox_enabled": p.sandbox_enabled,
        "allows": pairs(allows(p, &c), "access"),
        "denies": pairs(denies(p, &c), "deny"),
        "chain": serde_json::to_value(&c.spec).unwrap_or_default(),
        "limits_source": lp.source,
        "limits": lp.rows.iter().map(|r| json!({
            "limit": r.limit, "value": r.value, "applies": r.applies, "how": r.how,
        })).collect::<Vec<_>>(),
        "rules": p.rows.iter().map(|r| json!({
            "status": r.status.label(), "rule": r.rule, "from": r.from, "effect": r.effect,
        })).collect::<Vec<_>>(),
        "bash_rules": p.exec_allow.as_ref().map(|x| json!({
            "mode": x.mode.name(), "consequences": x.mode.consequences(),
        })),
        "not_enforced": p.rows.iter().filter(|r| r.status == Status::NotEnforced).count(),
        "warnings": p.warnings,
    })
}

/// `s` with control characters (ESC, CR, LF...) and bidi controls shown
/// as escapes.
fn esc(s: &str) -> String {
    sbx_core::escape::terminal(s).into_owned()
}

/// The text `explain` prints: untrusted text in it (rules, paths, file
/// names) escaped for the terminal.
pub fn render(p: &Policy) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "Project: {}", sbx_core::escape::path(&p.cwd));
    if !p.project_why.is_empty() {
        let _ = writeln!(o, "  chosen as {}", esc(&p.project_why));
    }
    if p.start != p.cwd {
        let _ = writeln!(
            o,
            "  the command starts in {}",
            sbx_core::escape::path(&p.start)
        );
    }
    o.push('\n');
    let _ = writeln!(
        o,
        "Settings read (lowest precedence first; managed > local > project > user, arrays merge, deny beats allow):"
    );
    if p.files.is_empty() {
        let _ = writeln!(o, "  (none: only the defaults below)");
    }
    for f in &p.files {
        let _ = writeln!(o, "  {}", esc(f));
    }
    if p.sandbox_enabled == Some(false) {
        let _ = writeln!(
            o,
            "  note: sandbox.enabled is false in these settings; sbx-policy chain sandboxes anyway (the last line of defence)"
        );
    }
    o.push('\n');
    let c = Chain::of(p);
    let _ = writeln!(o, "What the sandbox (low trust chain) allows:");
    let rows = allows(p, &c);
    table(&mut o, &["ACCESS", "WHAT"], &rows);
    o.push('\n');
    let _ = writeln!(o, "What it denies:");
    let rows = denies(p, &c);
    table(&mut o, &["DENY", "WHAT"], &rows);
    o.push('\n');
    let _ = writeln!(
        o,
        "The low trust chain (outermost first; `chain --print` shows it with this run's paths, `compile` writes the same specs):"
    );
    for l in c.layer_lines() {
        let _ = writeln!(o, "  {}", esc(&l));
    }
    o.push('\n');
    if let Some(x) = &p.exec_allow {
        let _ = writeln!(
            o,
            "Bash rules: {} mode (--exec-allowlist {}; the other mode: {}):",
            x.mode.name(),
            x.mode.name(),
            match x.mode {
                crate::bash::ExecMode::Invoke => "strict",
                crate::bash::ExecMode::Strict => "invoke",
            }
        );
        let _ = writeln!(o, "  {}.", x.mode.consequences());
        o.push('\n');
    }
    let _ = writeln!(o, "{}\n", GVISOR_TIER);
    let _ = writeln!(o, "{}\n", PLUGIN_TIER);
    let lp = crate::limitplan::plan(&p.limits, &crate::limitplan::detect(), true);
    let _ = writeln!(
        o,
        "Limits in this run (low trust; override with chain --memory/--pids/--cpus/--timeout/--tmp-size/--fsize):"
    );
    let _ = writeln!(o, "  {}", esc(&lp.source));
    let rows: Vec<Vec<String>> = lp
        .rows
        .iter()
        .map(|r| {
            vec![
                r.limit.to_string(),
                r.value.clone(),
                if r.applies { "applies" } else { "NOT APPLIED" }.to_string(),
                r.how.clone(),
            ]
        })
        .collect();
    table(&mut o, &["LIMIT", "VALUE", "IN THIS RUN", "HOW"], &rows);
    o.push('\n');
    let _ = writeln!(o, "Rules:");
    let rows: Vec<Vec<String>> = p
        .rows
        .iter()
        .map(|r| {
            vec![
                r.status.label().to_string(),
                r.rule.clone(),
                r.from.clone(),
                r.effect.clone(),
            ]
        })
        .collect();
    if rows.is_empty() {
        let _ = writeln!(o, "  (no rules)");
    } else {
        table(&mut o, &["STATUS", "RULE", "FROM", "IN THE SANDBOX"], &rows);
    }
    let not: Vec<_> = p
        .rows
        .iter()
        .filter(|r| r.status == Status::NotEnforced)
        .collect();
    o.push('\n');
    let invocation = p
        .rows
        .iter()
        .filter(|r| r.status == Status::Invocation)
        .count();
    if invocation > 0 {
        let _ = writeln!(
            o,
            "Checked at invocation ({invocation}): sbx-policy chain judges the agent's command against these before the chain starts; no kernel layer checks what that command starts."
        );
    }
    if not.is_empty() {
        let _ = writeln!(
            o,
            "Every other rule is enforced by a kernel layer (or wider)."
        );
    } else {
        let _ = writeln!(
            o,
            "NOT ENFORCED by any kernel layer ({}): the agent's own checks are all that stands behind these:",
            not.len()
        );
        for r in not {
            let _ = writeln!(
                o,
                "  {}  [{}]: {}",
                esc(&r.rule),
                esc(&r.from),
                esc(&r.effect)
            );
        }
    }
    o
}

/// What differs in the plugin tier (chain --trust plugin).
const PLUGIN_TIER: &str = "In the plugin tier (chain --trust plugin, or --plugin: CMD is a WebAssembly/WASI module or component run by sbx-wasm): the directory grants are the module's preopens, made by sbx-fs with the same denies and invariants (a file grant is not a preopen); nothing else of the host; no sockets; a component's outgoing HTTP (wasi:http) reaches the allowed domains only (sbx-net's allowlist code; none allowed: no network); no processes (Bash rules have nothing to run); the module's environment is sbx-fs's allowlist plus the env names; memory and the wall clock as below; a trap is exit 134 and an alert (wasm_trap).";

/// What differs in the zero-trust gVisor tier (chain --trust zero).
const GVISOR_TIER: &str = "In the gVisor tier (chain --trust zero, runsc installed): the same grants, denies, invariants and git stage (commits are imported after sbx-gitguard's checks); the Bash rules judge the command as here, and strict mode's execute allowlist is enforced by gVisor's kernel (every mount noexec but the listed programs and the dynamic loaders, memfd_create refused; exec_denied alerts from runsc's exec trace); the network is sbx-net's, as in the namespace chain (the same domain allowlist, DNS proxy and alerts; runsc --network=host inside sbx-net's filtered namespace); limits: as root the whole gVisor sandbox inside sbx-cgroup, unprivileged (runsc --rootless, no cgroup) memory per process through RLIMIT_AS enforced by gVisor's kernel, processes, file size and the wall clock, but no total memory or CPU limit; uid 0 inside, without capabilities, is the caller (as root, root; unprivileged, runsc --rootless shows the caller's own files as owned by 0).";
