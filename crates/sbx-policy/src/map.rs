//! The mapping: merged settings to the configuration of each layer, plus a
//! row per rule saying what became of it (for `explain`).
//!
//! Every grant is a union; deny beats allow: a read deny removes every grant
//! at or beneath it, a write deny turns writable grants at or beneath it
//! read-only and lays a read-only bind over a writable grant above it. The
//! sbx-fs invariants are never removed (no `--no-default-deny` is ever
//! emitted, and a writable grant inside a protected path is dropped).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};

use sbx_spec::FsSpec;
use serde_json::{Map, Value, json};

use crate::bash::{BashRule, ExecAllowlist, ExecMode, Pattern};
use crate::rules::{self, Ctx, Shape};
use crate::settings::{Entry, List, Merged, SettingsError};

/// What became of a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Enforced by a kernel layer as written.
    Enforced,
    /// Enforced, but wider than written (a deny over-approximated) or as of
    /// the start of the turn (a glob expanded then).
    Approximated,
    /// No kernel layer enforces it; listed, never silently "enforced".
    NotEnforced,
    /// An sbx-fs invariant wins over the rule.
    Invariant,
    /// Revoked by a deny rule (deny beats allow).
    Revoked,
    /// Set aside by a managed-only switch of the managed settings.
    Ignored,
    /// Checked by sbx-policy on the command the agent runs, before the
    /// chain starts; not on what that command starts.
    Invocation,
}

impl Status {
    pub fn label(self) -> &'static str {
        match self {
            Status::Enforced => "enforced",
            Status::Approximated => "approximated",
            Status::NotEnforced => "NOT ENFORCED",
            Status::Invariant => "invariant wins",
            Status::Revoked => "revoked by deny",
            Status::Ignored => "ignored",
            Status::Invocation => "checked at invocation",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Row {
    pub rule: String,
    pub from: String,
    pub status: Status,
    pub effect: String,
}

/// Default limits of the low-trust chain (each overridable).
#[derive(Debug, Clone)]
pub struct Limits {
    pub memory: String,
    pub pids: String,
    pub cpus: String,
    pub timeout: String,
    pub tmp_size: String,
    pub fsize: String,
    /// sbx-fs --write-quota / --write-inodes: what a run may add to the
    /// writable binds together.
    pub write_quota: String,
    pub write_inodes: String,
}

impl Limits {
    /// memory: 4G, or half the machine's RAM when that is less; pids 2048;
    /// CPUs: three quarters of the machine's (at least 1); /tmp 1G (counted
    /// in the memory limit: it is tmpfs); 2h wall clock; no single file
    /// larger than 8G.
    pub fn defaults() -> Limits {
        let mem = meminfo_total()
            .map(|t| (t / 2).min(4 << 30))
            .unwrap_or(4 << 30);
        let ncpu = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1) as f64;
        let cpus = (ncpu * 0.75).max(1.0);
        Limits {
            memory: format!("{}M", mem >> 20),
            pids: "2048".into(),
            cpus: format!("{cpus}"),
            timeout: "2h".into(),
            tmp_size: "1G".into(),
            fsize: "8G".into(),
            write_quota: crate::chain::WRITE_QUOTA.into(),
            write_inodes: crate::chain::WRITE_INODES.into(),
        }
    }
}

fn meminfo_total() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let l = s.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = l.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The layers' configuration.
#[derive(Debug, Clone)]
pub struct Policy {
    /// The project (src/project.rs): granted writable, its repository
    /// checked by sbx-gitguard, relative rules resolved against it.
    pub cwd: PathBuf,
    /// Where the command starts (inside the project, or the project).
    pub start: PathBuf,
    /// How the project was chosen (explain prints it).
    pub project_why: String,
    pub rw: Vec<PathBuf>,
    pub ro: Vec<PathBuf>,
    pub deny: Vec<String>,
    pub net_allow: Vec<String>,
    /// The Bash rules' execute allowlist (its mode, the rules, the files
    /// they name); None when no Bash rule has a pattern.
    pub exec_allow: Option<crate::bash::ExecAllowlist>,
    pub limits: Limits,
    pub git_repo: bool,
    pub rows: Vec<Row>,
    pub files: Vec<String>,
    /// `sandbox.enabled` as the settings say (sbx applies the chain anyway).
    pub sandbox_enabled: Option<bool>,
    /// The caller's variables passed into the sandbox besides sbx-fs's
    /// allowlist (sbx-fs --pass-env): the names of the settings' `env`
    /// object and --pass-env.
    pub pass_env: Vec<String>,
    /// Printed on stderr by every subcommand (unknown tools in rules).
    pub warnings: Vec<String>,
    /// The host's git user.name/user.email offered inside (sbx-fs
    /// --git-identity): settings `sbx.gitIdentity`, chain
    /// --no-git-identity; default on.
    pub git_identity: bool,
}

pub struct Inputs<'a> {
    pub merged: &'a Merged,
    pub ctx: Ctx,
    /// What the Bash allow rules bind (docs/policy.md "Bash rules").
    pub exec_mode: crate::bash::ExecMode,
    pub search_domains: Vec<String>,
    pub limits: Limits,
}

fn row(
    rows: &mut Vec<Row>,
    rule: impl Into<String>,
    e: &Entry,
    status: Status,
    effect: impl Into<String>,
) {
    rows.push(Row {
        rule: rule.into(),
        from: format!("{} ({})", e.origin.at(), e.origin.scope.name()),
        status,
        effect: effect.into(),
    });
}

/// A path pattern granted (read-only or writable).
fn grant_shape(
    rows: &mut Vec<Row>,
    grants: &mut Vec<(PathBuf, bool, String)>,
    shape: &Shape,
    writable: bool,
    label: String,
    e: &Entry,
) {
    let what = if writable {
        "writable bind (--rw)"
    } else {
        "read-only bind (--ro)"
    };
    match shape {
        Shape::Exact(p) | Shape::Tree(p) => {
            if !p.exists() {
                row(
                    rows,
                    label,
                    e,
                    Status::NotEnforced,
                    format!(
                        "{} does not exist: nothing to bind, nothing granted",
                        p.display()
                    ),
                );
                return;
            }
            // Its row is written after the deny and invariant checks.
            grants.push((p.clone(), writable, label));
        }
        Shape::DirGlob(d, pat) => {
            let mut n = 0;
            if let Ok(rd) = std::fs::read_dir(d) {
                for ent in rd.flatten() {
                    let name = ent.file_name().to_string_lossy().into_owned();
                    if rules::glob_match(pat, &name) {
                        grants.push((d.join(&name), writable, label.clone()));
                        n += 1;
                    }
                }
            }
            row(
                rows,
                label,
                e,
                Status::Approximated,
                format!(
                    "{what} of the {n} entries of {} matching '{pat}' when the turn starts",
                    d.display()
                ),
            );
        }
        Shape::Name(d, pat) | Shape::Deep(d, pat) => {
            row(
                rows,
                label,
                e,
                Status::NotEnforced,
                format!(
                    "a pattern at any depth ({}/**/{pat}) cannot be bound without walking the tree: nothing granted (write DIR/** instead)",
                    d.display()
                ),
            );
        }
    }
}

/// Paths an sbx-fs invariant keeps read-only (or hidden) wherever they are.
fn invariant_of(p: &Path, home: Option<&Path>) -> Option<&'static str> {
    // The one list, which sbx-fs enforces (`sbx_spec::invariants::CONTROL`).
    if let Some((_, note)) = sbx_spec::invariants::invariant_of(p) {
        return Some(note);
    }
    if p == Path::new("/etc/shadow") || p == Path::new("/etc/gshadow") {
        return Some("/etc/shadow and /etc/gshadow stay hidden");
    }
    if let Some(h) = home
        && [".aws", ".netrc"].iter().any(|n| p.starts_with(h.join(n)))
    {
        return Some("~/.aws and ~/.netrc stay hidden");
    }
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if name == ".env" || name.starts_with(".env.") {
        return Some(".env and .env.* stay hidden");
    }
    None
}

fn spec_of(e: &Entry, rule: &rules::Rule, ctx: &Ctx) -> Result<Shape, SettingsError> {
    let spec = rule.spec.as_deref().unwrap_or("");
    rules::resolve(spec, &e.origin.base, ctx)
        .map_err(|w| e.origin.err(format!("rule '{}': {w}", e.text)))
}

fn path_of(e: &Entry, key: &str, ctx: &Ctx) -> Result<Shape, SettingsError> {
    // Claude Code reads additionalDirectories and socket paths as plain
    // paths: `/p` is absolute there, not relative to the settings file as
    // in a rule.
    let plain = [
        "permissions.additionalDirectories",
        "sandbox.network.allowUnixSockets",
    ];
    let text = match e.text.strip_prefix('/') {
        Some(r) if plain.contains(&key) && !r.starts_with('/') => format!("//{r}"),
        _ => e.text.clone(),
    };
    rules::resolve(&text, &e.origin.base, ctx)
        .map_err(|w| e.origin.err(format!("{key} '{}': {w}", e.text)))
}

/// The canonical paths `program` names on PATH (the caller's PATH, then the
/// default one), or itself when it has a slash.
pub fn find_program(program: &str, cwd: &Path) -> Vec<PathBuf> {
    let mut out = BTreeSet::new();
    if program.contains('/') {
        let p = cwd.join(program);
        if let Ok(c) = p.canonicalize() {
            out.insert(c);
        }
        return out.into_iter().collect();
    }
    let path = std::env::var("PATH").unwrap_or_default();
    for d in path
        .split(':')
        .chain(sbx_core::chain::DEFAULT_PATH.split(':'))
    {
        if d.is_empty() || !d.starts_with('/') {
            continue;
        }
        let p = Path::new(d).join(program);
        if p.is_file()
            && let Ok(c) = p.canonicalize()
        {
            out.insert(c);
        }
    }
    out.into_iter().collect()
}

fn is_socket(p: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket())
}

/// A rule or list entry, parsed, with the path it names (for the kinds that
/// name one).
type ParsedRule<'m> = (List, &'m Entry, rules::Rule, Option<Shape>);
/// A filesystem list entry of the sandbox settings, with its key.
type FsEntry<'m> = (&'static str, &'m Entry, Shape);
/// (path, writable, the rule that granted it)
type Grant = (PathBuf, bool, String);
/// A deny of reading or writing: the path, its label, its entry.
type Deny<'m> = (Shape, String, &'m Entry);
type KindRule<'m> = (List, &'m Entry, rules::Rule);

/// The rules sorted by the layer that enforces them.
struct Sorted<'m> {
    grants: Vec<Grant>,
    read_denies: Vec<Deny<'m>>,
    write_denies: Vec<Deny<'m>>,
    bash_rules: Vec<KindRule<'m>>,
    web_rules: Vec<KindRule<'m>>,
}

/// sbx-fs's grants: the binds and the deny list.
struct Files {
    rw: Vec<PathBuf>,
    ro: Vec<PathBuf>,
    deny: Vec<String>,
}

/// The mapping, as named steps: parse everything (a bad rule stops it
/// before anything runs), sort the rules by layer, then one mapper per
/// concern (files, network, programs) and the rows of what no layer maps.
pub fn build(inp: Inputs<'_>) -> Result<Policy, SettingsError> {
    let m = inp.merged;
    let ctx = &inp.ctx;
    let mut rows = Vec::new();
    let mut warnings: Vec<String> = Vec::new();

    let (parsed, fs_lists) = parse_all(m, ctx)?;
    let sorted = sort_rules(&parsed, &fs_lists, ctx, &mut rows, &mut warnings);
    let mut files = map_files(
        sorted.grants,
        &sorted.read_denies,
        &sorted.write_denies,
        ctx,
        &mut rows,
    );
    fill_origins(&mut rows, &parsed, &fs_lists);
    let net_allow = map_network(&sorted.web_rules, m, &inp.search_domains, &mut rows);
    let exec_allow = bash_rules_map(
        &sorted.bash_rules,
        inp.exec_mode,
        ctx,
        &mut rows,
        &mut files.deny,
    );
    settings_rows(m, &mut rows);
    let git_identity = m.git_identity.as_ref().is_none_or(|(b, _)| *b);
    Ok(Policy {
        cwd: ctx.cwd.clone(),
        start: ctx.cwd.clone(),
        project_why: String::new(),
        rw: files.rw,
        ro: files.ro,
        deny: files.deny,
        net_allow,
        exec_allow,
        limits: inp.limits,
        git_repo: ctx.cwd.join(".git").exists(),
        rows,
        files: m
            .files
            .iter()
            .map(|(s, p)| format!("{} ({})", p.display(), s.name()))
            .collect(),
        sandbox_enabled: m.sandbox_enabled,
        pass_env: pass_env_of(m),
        warnings,
        git_identity,
    })
}

/// Every rule, path list and domain parsed and checked.
fn parse_all<'m>(
    m: &'m Merged,
    ctx: &Ctx,
) -> Result<(Vec<ParsedRule<'m>>, Vec<FsEntry<'m>>), SettingsError> {
    let mut parsed = Vec::new();
    for (list, e) in &m.rules {
        let r =
            rules::parse(&e.text).map_err(|w| e.origin.err(format!("rule '{}': {w}", e.text)))?;
        let shape = if (rules::READ_KINDS.contains(&r.kind.as_str())
            || rules::EDIT_KINDS.contains(&r.kind.as_str()))
            && r.spec.is_some()
        {
            Some(spec_of(e, &r, ctx)?)
        } else {
            None
        };
        parsed.push((*list, e, r, shape));
    }
    let mut fs_lists = Vec::new();
    for (key, list) in [
        ("sandbox.filesystem.allowWrite", &m.allow_write),
        ("sandbox.filesystem.denyRead", &m.deny_read),
        ("sandbox.filesystem.denyWrite", &m.deny_write),
        (
            "permissions.additionalDirectories",
            &m.additional_directories,
        ),
        ("sandbox.network.allowUnixSockets", &m.unix_sockets),
    ] {
        for e in list {
            fs_lists.push((key, e, path_of(e, key, ctx)?));
        }
    }
    for (key, list) in [
        ("sandbox.network.allowedDomains", &m.allowed_domains),
        ("sandbox.network.deniedDomains", &m.denied_domains),
    ] {
        for e in list {
            rules::check_domain(&e.text).map_err(|w| e.origin.err(format!("{key}: {w}")))?;
        }
    }
    Ok((parsed, fs_lists))
}

/// Sorts the rules by the layer that enforces them; a rule no layer sees
/// gets its row here.
fn sort_rules<'m>(
    parsed: &[ParsedRule<'m>],
    fs_lists: &[FsEntry<'m>],
    ctx: &Ctx,
    rows: &mut Vec<Row>,
    warnings: &mut Vec<String>,
) -> Sorted<'m> {
    let mut s = Sorted {
        grants: vec![(
            ctx.cwd.clone(),
            true,
            "the project (working directory)".into(),
        )],
        read_denies: Vec::new(),
        write_denies: Vec::new(),
        bash_rules: Vec::new(),
        web_rules: Vec::new(),
    };
    for (list, e, r, shape) in parsed {
        let e: &'m Entry = e;
        let k = r.kind.as_str();
        let is_read = rules::READ_KINDS.contains(&k);
        let is_edit = rules::EDIT_KINDS.contains(&k);
        if is_read || is_edit {
            let Some(shape) = shape else {
                let effect = match list {
                    List::Allow => format!(
                        "{k} of anything: sbx grants no path without one named; the project stays {}",
                        if is_edit { "writable" } else { "readable" }
                    ),
                    List::Deny => format!(
                        "{k} denied everywhere: a command needs files to run; not enforced by the sandbox (the agent's own check)"
                    ),
                    List::Ask => "ask: the sandbox cannot prompt; grants nothing".into(),
                };
                row(rows, &e.text, e, Status::NotEnforced, effect);
                continue;
            };
            match (list, is_edit) {
                (List::Allow, w) => grant_shape(rows, &mut s.grants, shape, w, e.text.clone(), e),
                (List::Deny, false) => s.read_denies.push((shape.clone(), e.text.clone(), e)),
                (List::Deny, true) => s.write_denies.push((shape.clone(), e.text.clone(), e)),
                (List::Ask, _) => row(
                    rows,
                    &e.text,
                    e,
                    Status::NotEnforced,
                    "ask: the sandbox cannot prompt; grants nothing",
                ),
            }
        } else if k == "Bash" {
            s.bash_rules.push((*list, e, r.clone()));
        } else if k == "WebFetch" || k == "WebSearch" {
            s.web_rules.push((*list, e, r.clone()));
        } else if !rules::is_known(k) {
            warnings.push(format!(
                "{}: rule '{}': unknown tool '{k}': NOT ENFORCED",
                e.origin.at(),
                e.text
            ));
            row(
                rows,
                &e.text,
                e,
                Status::NotEnforced,
                format!(
                    "{}: unknown tool '{k}' (sbx does not know it): nothing enforced",
                    list.name()
                ),
            );
        } else {
            row(
                rows,
                &e.text,
                e,
                Status::NotEnforced,
                format!(
                    "{}: a decision inside the agent, no kernel layer sees it",
                    list.name()
                ),
            );
        }
    }
    for (key, e, shape) in fs_lists {
        let e: &'m Entry = e;
        let label = format!("{key}: {}", e.text);
        match *key {
            "sandbox.filesystem.allowWrite" => {
                grant_shape(rows, &mut s.grants, shape, true, label, e)
            }
            "permissions.additionalDirectories" => {
                grant_shape(rows, &mut s.grants, shape, false, label, e)
            }
            "sandbox.network.allowUnixSockets" => match shape {
                Shape::Exact(p) if is_socket(p) => {
                    grant_shape(rows, &mut s.grants, shape, false, label, e)
                }
                _ => row(
                    rows,
                    label,
                    e,
                    Status::NotEnforced,
                    "not an existing Unix socket (an absolute path, no glob): nothing bound",
                ),
            },
            "sandbox.filesystem.denyRead" => s.read_denies.push((shape.clone(), label, e)),
            _ => s.write_denies.push((shape.clone(), label, e)),
        }
    }
    s
}

/// Grants sorted by path (component order keeps a subtree contiguous), so
/// "every grant at or beneath P" is a range, not a scan per rule.
struct ByPath(Vec<(PathBuf, usize)>);

impl ByPath {
    fn new(grants: &[Grant]) -> ByPath {
        let mut v: Vec<(PathBuf, usize)> = grants
            .iter()
            .enumerate()
            .map(|(i, g)| (g.0.clone(), i))
            .collect();
        v.sort();
        ByPath(v)
    }

    fn beneath(&self, p: &Path) -> Vec<usize> {
        let start = self.0.partition_point(|(q, _)| q.as_path() < p);
        self.0[start..]
            .iter()
            .take_while(|(q, _)| q.starts_with(p))
            .map(|(_, i)| *i)
            .collect()
    }
}

/// sbx-fs's binds and deny list from the grants and the denies: a read
/// deny removes every grant at or beneath it, a write deny makes them
/// read-only (or lays a read-only bind over a writable grant above it),
/// the invariants win, and redundant binds are dropped.
fn map_files(
    mut grants: Vec<Grant>,
    read_denies: &[Deny<'_>],
    write_denies: &[Deny<'_>],
    ctx: &Ctx,
    rows: &mut Vec<Row>,
) -> Files {
    let mut deny: Vec<String> = Vec::new();
    let by_path = ByPath::new(&grants);
    let removed = apply_read_denies(read_denies, &by_path, ctx, rows, &mut deny);
    let ro_over = apply_write_denies(write_denies, &mut grants, &by_path, rows, &mut deny);
    let (mut rw, mut ro) = bind_lists(&grants, &removed, ctx.home.as_deref(), rows);
    ro.extend(ro_over);
    dedup(&mut rw);
    dedup(&mut ro);
    minimise(&mut rw, &mut ro, write_denies);
    let mut seen = BTreeSet::new();
    deny.retain(|d| seen.insert(d.clone()));
    Files { rw, ro, deny }
}

/// The read denies: hidden paths and names; returns the grants they
/// remove (index: the deny's label).
fn apply_read_denies(
    read_denies: &[Deny<'_>],
    by_path: &ByPath,
    ctx: &Ctx,
    rows: &mut Vec<Row>,
    deny: &mut Vec<String>,
) -> HashMap<usize, String> {
    let mut removed: HashMap<usize, String> = HashMap::new();
    for (shape, label, e) in read_denies {
        match shape {
            Shape::Exact(p) | Shape::Tree(p) => {
                deny.push(p.display().to_string());
                for i in by_path.beneath(p) {
                    removed.entry(i).or_insert_with(|| label.clone());
                }
                row(
                    rows,
                    label,
                    e,
                    Status::Enforced,
                    format!("hidden (--deny {})", p.display()),
                );
            }
            Shape::DirGlob(d, pat) => {
                deny.push(format!("{}/{pat}", d.display()));
                row(
                    rows,
                    label,
                    e,
                    Status::Enforced,
                    format!("hidden (--deny {}/{pat})", d.display()),
                );
            }
            Shape::Name(d, pat) => {
                deny.push(pat.clone());
                let st = if *d == ctx.cwd {
                    Status::Enforced
                } else {
                    Status::Approximated
                };
                row(
                    rows,
                    label,
                    e,
                    st,
                    format!(
                        "name pattern hidden in every bind (--deny {pat}; searched 6 levels deep when the turn starts)"
                    ),
                );
            }
            Shape::Deep(d, rest) => {
                let last = rest.rsplit('/').next().unwrap_or("");
                if !last.is_empty() && last != "*" && last != "**" {
                    deny.push(last.to_string());
                    row(
                        rows,
                        label,
                        e,
                        Status::Approximated,
                        format!("wider: every name '{last}' hidden in every bind (--deny {last})"),
                    );
                } else {
                    deny.push(d.display().to_string());
                    row(
                        rows,
                        label,
                        e,
                        Status::Approximated,
                        format!("wider: all of {} hidden", d.display()),
                    );
                }
            }
        }
    }
    removed
}

/// The write denies: grants at or beneath them become read-only; a path
/// inside a writable grant gets a read-only bind over it (returned), or a
/// deny when it does not exist yet (it cannot be created).
fn apply_write_denies(
    write_denies: &[Deny<'_>],
    grants: &mut [Grant],
    by_path: &ByPath,
    rows: &mut Vec<Row>,
    deny: &mut Vec<String>,
) -> Vec<PathBuf> {
    let mut ro_over: Vec<PathBuf> = Vec::new();
    let mut rw_now: HashSet<PathBuf> = grants.iter().filter(|g| g.1).map(|g| g.0.clone()).collect();
    for (shape, label, e) in write_denies {
        match shape {
            Shape::Exact(p) | Shape::Tree(p) => {
                let inside = p.ancestors().skip(1).any(|a| rw_now.contains(a));
                for i in by_path.beneath(p) {
                    if grants[i].1 {
                        grants[i].1 = false;
                        rw_now.remove(&grants[i].0);
                    }
                }
                if !inside {
                    row(
                        rows,
                        label,
                        e,
                        Status::Enforced,
                        format!(
                            "{} is not writable (no writable grant covers it)",
                            p.display()
                        ),
                    );
                } else if p.exists() {
                    ro_over.push(p.clone());
                    row(
                        rows,
                        label,
                        e,
                        Status::Enforced,
                        format!(
                            "read-only bind over the writable grant (--ro {})",
                            p.display()
                        ),
                    );
                } else {
                    deny.push(p.display().to_string());
                    row(
                        rows,
                        label,
                        e,
                        Status::Enforced,
                        format!("does not exist: cannot be created (--deny {})", p.display()),
                    );
                }
            }
            Shape::DirGlob(d, pat) | Shape::Name(d, pat) | Shape::Deep(d, pat) => {
                let inside = d.ancestors().any(|a| rw_now.contains(a))
                    || by_path.beneath(d).iter().any(|&i| grants[i].1);
                if inside {
                    row(
                        rows,
                        label,
                        e,
                        Status::NotEnforced,
                        format!(
                            "a pattern ({pat} under {}) inside a writable grant: sbx-fs has no read-only name pattern",
                            d.display()
                        ),
                    );
                } else {
                    row(
                        rows,
                        label,
                        e,
                        Status::Enforced,
                        format!(
                            "{} is not writable (no writable grant covers it)",
                            d.display()
                        ),
                    );
                }
            }
        }
    }
    ro_over
}

/// The grants that survive the denies and the invariants, as writable and
/// read-only lists, each with its row.
fn bind_lists(
    grants: &[Grant],
    removed: &HashMap<usize, String>,
    home: Option<&Path>,
    rows: &mut Vec<Row>,
) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut rw = Vec::new();
    let mut ro = Vec::new();
    let mut has_row: HashSet<String> = rows.iter().map(|r| r.rule.clone()).collect();
    for (i, (p, w, label)) in grants.iter().enumerate() {
        if let Some(by) = removed.get(&i) {
            rows.push(Row {
                rule: label.clone(),
                from: String::new(),
                status: Status::Revoked,
                effect: format!("{} not bound: denied by {by}", p.display()),
            });
            continue;
        }
        if let Some(inv) = invariant_of(p, home)
            && (*w || !inv.contains("read-only"))
        {
            rows.push(Row {
                rule: label.clone(),
                from: String::new(),
                status: Status::Invariant,
                effect: format!("{} refused: {inv}", fs_grant(p, *w)),
            });
            continue;
        }
        if *w {
            rw.push(p.clone());
        } else {
            ro.push(p.clone());
        }
        if i > 0 && has_row.insert(label.clone()) {
            rows.push(Row {
                rule: label.clone(),
                from: String::new(),
                status: Status::Enforced,
                effect: fs_grant(p, *w),
            });
        }
    }
    (rw, ro)
}

/// The sbx-fs argument a grant becomes (`--rw PATH`), as its spec renders
/// it: explain's text follows a renamed flag.
fn fs_grant(p: &Path, writable: bool) -> String {
    let one = vec![p.as_os_str().to_os_string()];
    let spec = if writable {
        FsSpec {
            rw: one,
            ..FsSpec::default()
        }
    } else {
        FsSpec {
            ro: one,
            ..FsSpec::default()
        }
    };
    let args: Vec<String> = spec
        .args()
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    args.join(" ")
}

/// Fewer, consistent binds. A path both read-only and writable: read-only
/// wins only when a deny made it so (the ro list then holds it); a plain
/// Read grant under a writable one is redundant. A grant beneath a writable
/// one adds nothing unless a read-only bind lies between them.
fn minimise(rw: &mut Vec<PathBuf>, ro: &mut Vec<PathBuf>, write_denies: &[Deny<'_>]) {
    let rw_set: HashSet<PathBuf> = rw.iter().cloned().collect();
    let denied_w: HashSet<&PathBuf> = write_denies
        .iter()
        .filter_map(|(s, _, _)| match s {
            Shape::Exact(x) | Shape::Tree(x) => Some(x),
            _ => None,
        })
        .collect();
    ro.retain(|p| !rw_set.contains(p) || denied_w.contains(p));
    let ro_set: HashSet<PathBuf> = ro.iter().cloned().collect();
    rw.retain(|p| !ro_set.contains(p));
    let rw_set: HashSet<PathBuf> = rw.iter().cloned().collect();
    let covered = |p: &PathBuf| {
        for a in p.ancestors().skip(1) {
            if ro_set.contains(a) {
                return false;
            }
            if rw_set.contains(a) {
                return true;
            }
        }
        false
    };
    rw.retain(|p| !covered(p));
    ro.retain(|p| denied_w.contains(p) || !covered(p));
}

/// Fills in the "from" of the grant rows written without one.
fn fill_origins(rows: &mut [Row], parsed: &[ParsedRule<'_>], fs_lists: &[FsEntry<'_>]) {
    let mut from_of: HashMap<String, String> = HashMap::new();
    for (_, e, _, _) in parsed.iter().rev() {
        from_of.insert(
            e.text.clone(),
            format!("{} ({})", e.origin.at(), e.origin.scope.name()),
        );
    }
    for (k, e, _) in fs_lists {
        from_of
            .entry(format!("{k}: {}", e.text))
            .or_insert_with(|| format!("{} ({})", e.origin.at(), e.origin.scope.name()));
    }
    for r in rows.iter_mut().filter(|r| r.from.is_empty()) {
        if let Some(f) = from_of.get(&r.rule) {
            r.from = f.clone();
        }
    }
}

/// sbx-net's allowlist: the WebFetch/WebSearch rules and the sandbox's
/// domain lists; deny beats allow, and a wildcard that covers a denied
/// name is dropped whole (sbx-net cannot subtract a name from it).
fn map_network(
    web_rules: &[KindRule<'_>],
    m: &Merged,
    search_domains: &[String],
    rows: &mut Vec<Row>,
) -> Vec<String> {
    let mut allow: Vec<(String, String, &Entry)> = Vec::new();
    let mut denied: Vec<(String, String, &Entry)> = Vec::new();
    let mut all_web_denied: Option<&Entry> = None;
    for (list, e, r) in web_rules {
        let d = r
            .spec
            .as_deref()
            .and_then(|s| s.strip_prefix("domain:"))
            .map(str::to_string);
        match (list, r.kind.as_str(), d) {
            (List::Allow, "WebFetch", Some(d)) => allow.push((d, e.text.clone(), e)),
            (List::Deny, "WebFetch", Some(d)) => denied.push((d, e.text.clone(), e)),
            (List::Allow, "WebFetch", None) => row(
                rows,
                &e.text,
                e,
                Status::NotEnforced,
                "WebFetch of any domain: sbx-net has no allow-all; nothing granted (name the domains)",
            ),
            (List::Deny, "WebFetch", None) => {
                all_web_denied = Some(e);
                row(
                    rows,
                    &e.text,
                    e,
                    Status::Enforced,
                    "every WebFetch domain grant removed",
                );
            }
            (List::Allow, _, _) => {
                for sd in search_domains {
                    allow.push((sd.clone(), e.text.clone(), e));
                }
                row(
                    rows,
                    &e.text,
                    e,
                    Status::Enforced,
                    format!("search domains allowed: {}", search_domains.join(", ")),
                );
            }
            (List::Deny, _, _) => row(
                rows,
                &e.text,
                e,
                Status::Enforced,
                "search domains not added",
            ),
            (List::Ask, _, _) => row(
                rows,
                &e.text,
                e,
                Status::NotEnforced,
                "ask: the sandbox cannot prompt; grants nothing",
            ),
        }
    }
    if let Some(by) = all_web_denied {
        // Shown as revoked, not dropped: the user sees what the deny took.
        allow.retain(|(d, label, e)| {
            if !label.starts_with("WebFetch") {
                return true;
            }
            row(
                rows,
                label,
                e,
                Status::Revoked,
                format!(
                    "{d} not allowed: denied by {} ({})",
                    by.text,
                    by.origin.at()
                ),
            );
            false
        });
    }
    for e in &m.allowed_domains {
        allow.push((
            e.text.clone(),
            format!("sandbox.network.allowedDomains: {}", e.text),
            e,
        ));
    }
    for e in &m.denied_domains {
        denied.push((
            e.text.clone(),
            format!("sandbox.network.deniedDomains: {}", e.text),
            e,
        ));
    }
    let mut net_allow: Vec<String> = Vec::new();
    for (d, label, e) in &allow {
        if let Some((dd, dl, _)) = denied.iter().find(|(dd, _, _)| rules::domain_covers(dd, d)) {
            row(
                rows,
                label,
                e,
                Status::Revoked,
                format!("{d} not allowed: denied by {dl} ({dd})"),
            );
            continue;
        }
        if let Some((dd, dl, _)) = denied.iter().find(|(dd, _, _)| rules::domain_covers(d, dd)) {
            row(
                rows,
                label,
                e,
                Status::Revoked,
                format!(
                    "{d} dropped entirely: it covers {dd}, denied by {dl}, and sbx-net cannot subtract a name from a wildcard"
                ),
            );
            continue;
        }
        let flag = d.to_ascii_lowercase();
        if !net_allow.contains(&flag) {
            net_allow.push(flag);
        }
        if !label.starts_with("WebSearch") {
            row(
                rows,
                label,
                e,
                Status::Enforced,
                format!("egress to {d} on ports 80,443 (sbx-net --allow {d})"),
            );
        }
    }
    for (d, label, e) in &denied {
        row(
            rows,
            label,
            e,
            Status::Enforced,
            format!("{d} never allowed (egress is allowlist-only)"),
        );
    }
    net_allow
}

/// The rows of the settings that no layer maps: managed-only switches,
/// ignored entries, keys sbx reads but does not map (never dropped
/// silently), and the git identity choice.
fn settings_rows(m: &Merged, rows: &mut Vec<Row>) {
    for e in &m.managed_only {
        row(
            rows,
            &e.text,
            e,
            Status::Enforced,
            "only the managed settings' entries of this kind apply (the others: ignored rows)",
        );
    }
    for (e, why) in &m.ignored {
        row(rows, &e.text, e, Status::Ignored, *why);
    }
    for e in &m.unmapped_keys {
        // Binding the loopback is what every sandbox already may do.
        let status = if e.text.ends_with(".allowLocalBinding") {
            Status::Enforced
        } else {
            Status::NotEnforced
        };
        row(rows, &e.text, e, status, unmapped_effect(&e.text));
    }
    if let Some((b, o)) = &m.git_identity {
        rows.push(Row {
            rule: format!("sbx.gitIdentity: {b}"),
            from: format!("{} ({})", o.at(), o.scope.name()),
            status: Status::Enforced,
            effect: if *b {
                "the host's git user.name/user.email as ~/.gitconfig in the sandbox's HOME (sbx-fs --git-identity)".into()
            } else {
                "no git identity offered: git commit inside needs one (git -c, GIT_AUTHOR_*/GIT_COMMITTER_*)".into()
            },
        });
    }
}

/// What a settings key sbx does not map means for the sandbox.
pub fn unmapped_effect(key: &str) -> String {
    let last = key.rsplit('.').next().unwrap_or(key);
    match last {
        "excludedCommands" => "these commands still run inside the sandbox (sbx excludes nothing)",
        "allowUnsandboxedCommands" => "sbx never runs a command unsandboxed",
        "autoAllowBashIfSandboxed" => {
            "an approval decision inside the agent; the sandbox is the same"
        }
        "failIfUnavailable" => {
            "sbx always fails closed: a layer that cannot be set up stops the run (125)"
        }
        "allowAllUnixSockets" => {
            "not honoured: only the sockets listed in allowUnixSockets are bound"
        }
        "allowLocalBinding" => {
            "always so: the sandbox has its own loopback (sbx-net's namespace); a server it binds there is reachable from inside only, never from the host"
        }
        "httpProxyPort" | "socksProxyPort" => "sbx-net runs its own proxy: this port is not used",
        "allowManagedDomainsOnly" | "allowManagedPermissionRulesOnly" => {
            "honoured in the managed settings only: here it changes nothing"
        }
        _ => "not mapped by sbx: changes nothing in the sandbox",
    }
    .to_string()
}

/// The names of the settings' `env` objects that are variable names (the
/// user set them for the agent's commands: they pass into the sandbox).
fn pass_env_of(m: &Merged) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for e in &m.env_names {
        if sbx_core::envpolicy::parse_pass("env", &e.text)
            .is_ok_and(|p| matches!(p, sbx_core::envpolicy::Pass::Name(_)))
            && !v.contains(&e.text)
        {
            v.push(e.text.clone());
        }
    }
    v
}

fn dedup(v: &mut Vec<PathBuf>) {
    let mut seen = BTreeSet::new();
    v.retain(|p| seen.insert(p.clone()));
}

fn strs(v: &[PathBuf]) -> Value {
    Value::Array(
        v.iter()
            .map(|p| Value::String(p.display().to_string()))
            .collect(),
    )
}

impl Policy {
    /// Whether the start directory (in the project) is inside the sandbox
    /// (a deny may remove it): the command starts there.
    pub fn project_visible(&self) -> bool {
        self.start
            .ancestors()
            .any(|a| self.rw.iter().chain(self.ro.iter()).any(|g| g == a))
    }

    /// The `--config` sections of each tool (keys = long flag names): the
    /// specs `chain` renders (crate::chain), without what is made per run
    /// (the git stage) and with every limit (`chain` gives sbx-cgroup only
    /// those that apply on its host). A path that is not UTF-8 cannot be
    /// written in JSON: an error names it.
    pub fn to_config(&self) -> Result<Value, serde_json::Error> {
        use crate::chain;
        let mut top = Map::new();
        top.insert(
            sbx_spec::fs::TOOL.into(),
            serde_json::to_value(chain::fs_spec(self, None))?,
        );
        top.insert(
            sbx_spec::net::TOOL.into(),
            serde_json::to_value(chain::net_spec(self))?,
        );
        // The strict execute allowlist as for a command that is one of the
        // allowed programs or shells (chain adds the command's own).
        top.insert(
            sbx_spec::seccomp::TOOL.into(),
            serde_json::to_value(chain::seccomp_spec(self, &[]))?,
        );
        top.insert(
            sbx_spec::cgroup::TOOL.into(),
            serde_json::to_value(crate::limitplan::everywhere(&self.limits))?,
        );
        if let Some(g) = chain::gitguard_spec(self, None) {
            top.insert(sbx_spec::gitguard::TOOL.into(), serde_json::to_value(g)?);
        }
        // The other tiers' tools, each as the tier's chain has it (the
        // per-run parts left out: gVisor's sbx-cgroup and git stage).
        top.insert(
            sbx_spec::vm::TOOL.into(),
            serde_json::to_value(chain::vm_spec(self))?,
        );
        top.insert(
            sbx_spec::container::TOOL.into(),
            serde_json::to_value(chain::container_spec(self))?,
        );
        top.insert(
            sbx_spec::wasm::TOOL.into(),
            serde_json::to_value(chain::wasm_spec(self).0)?,
        );
        if let Some(runsc) = chain::find_tool("runsc", None) {
            top.insert(
                sbx_spec::gvisor::TOOL.into(),
                serde_json::to_value(chain::gvisor_spec(
                    self,
                    &runsc,
                    None,
                    None,
                    &chain::exec_files(self, &[]).unwrap_or_default(),
                ))?,
            );
        }
        top.insert(
            "sbx-path".into(),
            json!({ "allow-read": strs(&self.ro), "allow-write": strs(&self.rw) }),
        );
        Ok(Value::Object(top))
    }
}

/// The Bash rules: what the agent may run (the invocation check of both
/// modes) and the files they name (strict mode's kernel list); a deny
/// naming a whole program also hides it (`--deny`). Rows say which mode
/// enforces what, and where.
fn bash_rules_map(
    bash_rules: &[(List, &Entry, rules::Rule)],
    mode: ExecMode,
    ctx: &Ctx,
    rows: &mut Vec<Row>,
    deny: &mut Vec<String>,
) -> Option<ExecAllowlist> {
    let strict = mode == ExecMode::Strict;
    let mut any = false;
    let mut allow: Vec<BashRule> = Vec::new();
    let mut denies: Vec<BashRule> = Vec::new();
    let mut files: Vec<PathBuf> = Vec::new();
    let mut hidden: Vec<PathBuf> = Vec::new();
    for (list, e, r) in bash_rules {
        let spec = r.spec.as_deref().map(str::trim).unwrap_or("*");
        let pattern = Pattern::parse(spec);
        if matches!(&pattern, Pattern::Glob(g) if g == "*") || spec.is_empty() {
            match list {
                List::Allow => {
                    any = true;
                    row(
                        rows,
                        &e.text,
                        e,
                        Status::Enforced,
                        "any command may run (no execute allowlist)",
                    );
                }
                _ => row(
                    rows,
                    &e.text,
                    e,
                    Status::NotEnforced,
                    format!(
                        "every command {}: the sandbox runs a command; not enforced by sbx",
                        list.name()
                    ),
                ),
            }
            continue;
        }
        if *list == List::Ask {
            row(
                rows,
                &e.text,
                e,
                Status::NotEnforced,
                "ask: the sandbox cannot prompt; grants nothing (the command is refused unless an allow rule matches it)",
            );
            continue;
        }
        let text = match &pattern {
            Pattern::Exact(s) => format!("exactly `{s}`"),
            Pattern::Prefix(s) => format!("`{s}` with any arguments"),
            Pattern::Glob(s) => format!("commands matching `{s}`"),
        };
        let rule = BashRule {
            rule: e.text.clone(),
            pattern: pattern.clone(),
        };
        // The program: the pattern's first word, when it names one.
        let (head, args) = match &pattern {
            Pattern::Exact(s) | Pattern::Prefix(s) | Pattern::Glob(s) => {
                let mut it = s.splitn(2, ' ');
                (
                    it.next().unwrap_or("").to_string(),
                    it.next().filter(|a| *a != "*").map(str::to_string),
                )
            }
        };
        let found = if rules::has_glob(&head) || head.is_empty() {
            Vec::new()
        } else {
            find_program(&head, &ctx.cwd)
        };
        let shown = found
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ");
        match list {
            List::Allow => {
                allow.push(rule);
                files.extend(found.iter().cloned());
                let (status, effect) = if !strict {
                    (
                        Status::Invocation,
                        format!(
                            "the agent may run {text} (invoke mode: judged before the chain starts, any other command refused with 126 and command_denied); what it starts is not restricted"
                        ),
                    )
                } else if found.is_empty() {
                    (
                        Status::Invocation,
                        format!(
                            "the agent may run {text}; '{head}' names no file on PATH: nothing added to the kernel execute allowlist"
                        ),
                    )
                } else if let Some(a) = &args {
                    (
                        Status::Invocation,
                        format!(
                            "the agent may run {text}; inside, {shown} may be executed with any arguments (no kernel layer sees arguments: '{a}' is checked at invocation only)"
                        ),
                    )
                } else {
                    (
                        Status::Enforced,
                        format!(
                            "the agent may run {text}; {shown} on the kernel execute allowlist (Landlock: sbx-seccomp --allow-exec; other programs refused with an exec_denied alert)"
                        ),
                    )
                };
                row(rows, &e.text, e, status, effect);
            }
            List::Deny => {
                denies.push(rule);
                if args.is_none() && !found.is_empty() {
                    hidden.extend(found.iter().cloned());
                    for f in &found {
                        deny.push(f.display().to_string());
                    }
                    row(
                        rows,
                        &e.text,
                        e,
                        Status::Enforced,
                        format!(
                            "{shown} hidden (--deny): cannot be read or executed, by the agent or anything it runs"
                        ),
                    );
                } else {
                    row(
                        rows,
                        &e.text,
                        e,
                        Status::Invocation,
                        format!(
                            "the agent may not run {text} (refused before the chain starts: 126, command_denied); a program it may run can still run it (no kernel layer sees arguments)"
                        ),
                    );
                }
            }
            List::Ask => unreachable!(),
        }
    }
    if allow.is_empty() && denies.is_empty() {
        return None;
    }
    files.retain(|p| !hidden.contains(p));
    dedup(&mut files);
    Some(ExecAllowlist {
        mode,
        // No allow pattern (or an allow-all rule): any command may be run,
        // only the deny rules are checked.
        any: any || allow.is_empty(),
        allow,
        deny: denies,
        files,
    })
}
