//! sbx-fs: the filesystem layer. The command runs in new mount, PID, IPC
//! and UTS namespaces (and a user namespace when sbx-fs lacks
//! CAP_SYS_ADMIN), under a root built only from what was granted.
//!
//! Flow: flags are checked (nothing exists yet); bind sources are opened
//! on the host as O_PATH fds; the mount plan is computed; mount points that
//! must exist in the user's tree are created and handed to a reaper; then
//! a clone makes PID 1 of the new namespaces ([`init`]), which builds the
//! root from the plan ([`mounts`]), pivots, and runs the command. The outer
//! sbx-fs forwards signals, waits, removes the placeholders and exits with
//! the command's status.

mod auditlog;
mod caps;
pub mod deny;
mod dev;
pub mod fuse;
mod gitident;
mod gitstage;
pub mod guard;
mod init;
mod lockwatch;
mod mounts;
pub mod namespaces;
pub mod placeholder;
pub mod plan;
mod proc;
mod protect;
mod quarantine;
mod quota;
pub mod spec;
mod sys;
mod tmpwatch;

use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use clap::Parser;
use nix::sys::signalfd::{SfdFlags, SignalFd};
use sbx_core::cli::CommonArgs;
use sbx_core::{Failure, Severity, audit, chain};

use plan::{Kind, Op, Plan, What};
use spec::Spec;

pub const TOOL: &str = "sbx-fs";

pub const MAN: sbx_core::man::ManInfo = sbx_core::man::ManInfo {
    about: "Runs CMD in new mount, PID, IPC and UTS namespaces (plus a user namespace when sbx-fs lacks CAP_SYS_ADMIN) under a root made only of what is granted: the system directories read-only, the --ro/--rw binds, a fresh /proc of the new PID namespace with the host-revealing entries masked, a minimal /dev, a fresh size-limited /tmp and an empty tmpfs $HOME. The host's secrets (a default deny list plus --deny) are hidden, and .git/.claude control files inside writable binds are always read-only. A PID-1 init inside reaps zombies, forwards signals and exits with the command's status. sbx-fs creates no network namespace: that is sbx-net's job, before sbx-fs in the chain.",
    exit_status: "The command's exit status, unchanged; 128+N when it was killed by signal N. 125 when sbx-fs itself fails (bad usage, a bind source that does not exist, a refused mount, a setup step inside the namespaces), with one line on stderr; nothing is left mounted or created on the host. 126 when CMD was found but could not be executed, 127 when it was not found (looked up with the sandbox's PATH, inside the new root).",
    inherited_state: "CMD inherits: the new mount, PID, IPC and UTS namespaces (and the user namespace when one was made), its own session (setsid: it has no controlling terminal, so TIOCSTI cannot inject into the caller's), no capability at all (bounding, ambient, permitted, effective and inheritable sets empty) and no_new_privs, the identity --uid/--gid (default the caller's), an environment made of an allowlist of the caller's variables (see ENVIRONMENT) and then --clearenv/--unsetenv/--setenv, fds 0, 1 and 2 only, and the working directory --chdir (default: the caller's directory when it exists inside, else $HOME, else /). The network namespace is the caller's. When CMD is one of the real sbx tool binaries (by file identity, not name) it also inherits the audit log fd (SBX_AUDIT_FD), and it is executed from an fd opened before the root changed, so it need not exist inside the sandbox; any other CMD never sees the audit log and is looked up with PATH inside the sandbox.",
    environment: "- HOME, CLAUDE_CONFIG_DIR, XDG_STATE_HOME: where the agent's own settings and state live, kept read-only or hidden.\n- SBX_PASS_ENV: names to pass besides --pass-env (see below).",
    extra: &[
        (
            "FILESYSTEM",
            "The root is a read-only tmpfs. Default mounts: /usr, /bin, /sbin, /lib, /lib32, /lib64, /libx32 and /etc bound read-only from the host (symlinks such as /bin -> usr/bin on merged-/usr systems are recreated as symlinks; --no-system drops them); /proc, a new proc instance for the new PID namespace, with /proc/kcore, /proc/keys, /proc/key-users, /proc/sysrq-trigger, /proc/timer_list, /proc/timer_stats, /proc/sched_debug, /proc/latency_stats, /proc/kallsyms, /proc/kmsg, /proc/interrupts, /proc/acpi, /proc/asound and /proc/scsi masked and /proc/sys, /proc/bus, /proc/fs and /proc/irq read-only; /dev, a tmpfs holding null, zero, full, random, urandom and tty bound from the host, a new devpts instance on /dev/pts with /dev/ptmx -> pts/ptmx, a tmpfs /dev/shm, and the fd, stdin, stdout and stderr symlinks; /tmp, a fresh tmpfs of --tmp-size (default 512M) that is gone when the sandbox ends; $HOME, an empty tmpfs owned by the identity inside (unless a bind covers it; with --git-identity it holds .gitconfig with the invoking user's git user.name and user.email, nothing else). There is no /run and no host socket (docker.sock, D-Bus, X11, ssh-agent) unless bound.\n\nEvery bind source is opened once on the host (O_PATH; symlinks in the path given are resolved then, magic links refused) and the bind is made from that fd with the new mount API (open_tree, mount_setattr, move_mount): what was checked is what is mounted, so a symlink swapped in meanwhile cannot redirect it. Every destination is opened beneath the new root with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS) and the mount is made onto that fd; a destination that crosses a symlink is refused. Binds are nosuid (and nodev for directories). Nested destinations are mounted parent first, whatever the order of the flags.",
        ),
        (
            "DENIED PATHS",
            "Hidden paths cannot be read, listed or created: each denied path is covered by a node of sbx-fs's own FUSE file system (see GUARD FILE SYSTEM) that stat shows as an empty mode-000 file or directory and that refuses everything else with EACCES, logging fs_denied; without a usable /dev/fuse, by an empty mode-000 read-only file or tmpfs as before. A --deny PATH is hidden in every bind that contains it (PATH is a host path; ~/ is the caller's home); when it does not exist and a writable bind contains it, a placeholder makes it impossible to create. A --deny without a slash is a name pattern (*, ?, [...]) matched in every user bind at any depth (.git is not searched; at most --scan-limit entries per bind, default 1000000: beyond it sbx-fs refuses to start, exit 125, alert scan_limit, rather than leave part of the tree unsearched); a file matching it that is created during the run is hidden from the next run; a pattern in the last component of a path (/etc/ssh/*_key) is matched in that directory. A bind that lies inside a denied directory is hidden entirely.\n\nThe default deny list (--no-default-deny drops it): /etc/shadow, /etc/shadow-, /etc/gshadow, /etc/gshadow-, /etc/sudoers, /etc/sudoers.d, /etc/security/opasswd, /etc/ssl/private, /etc/krb5.keytab, /etc/ssh/*_key; ~/.ssh, ~/.aws, ~/.gnupg, ~/.kube, ~/.docker/config.json, ~/.netrc, ~/.config/gcloud, ~/.git-credentials, ~/.vault-token, ~/.config/gh/hosts.yml, ~/.config/hub, ~/.npmrc, ~/.pypirc, ~/.cargo/credentials, ~/.cargo/credentials.toml, ~/.gem/credentials, ~/.claude/.credentials.json (when it exists), ~/.azure, ~/.terraform.d/credentials.tfrc.json, ~/.config/doctl (they matter when a bind is the home or contains it); .env and .env.* in every user bind; credentials* in every bind under a home (/home, /root, $HOME). Symlinks are never hidden themselves: inside the sandbox they resolve inside the sandbox, where their target is subject to the same rules.",
        ),
        (
            "ENVIRONMENT",
            "Only an allowlist of the caller's environment reaches the command: PATH, HOME, TERM, LANG, LANGUAGE, LC_*, TZ, USER, LOGNAME, SHELL, COLORTERM, NO_COLOR, the CA-certificate paths SSL_CERT_FILE, SSL_CERT_DIR, CURL_CA_BUNDLE, REQUESTS_CA_BUNDLE, NODE_EXTRA_CA_CERTS, GIT_SSL_CAINFO, AWS_CA_BUNDLE and PIP_CERT, and sbx's own SBX_ID and SBX_LOG (SBX_AUDIT_FD is set again for a next sbx tool only). TMPDIR, when the caller has one, is set to /tmp (the sandbox's fresh /tmp; the caller's is a host path). --pass-env NAME passes one more variable, --pass-env 'PREFIX*' every variable whose name starts with PREFIX ('*' alone: every variable), both repeatable; --keep-env passes the whole environment, secrets included. SBX_PASS_ENV (comma-separated names or PREFIX*, as --pass-env) adds to --pass-env and never reaches the command: sbx-creds, earlier in the chain, names the secrets it injects there, so they reach the command. A variable whose name looks like a secret (TOKEN, SECRET, PASSWORD, PASSWD, KEY, APIKEY, CREDENTIAL(S), CREDS, AUTH, COOKIE, DSN, PAT as a word of the name; TOKEN, SECRET, PASSWORD, API_KEY, PRIVATE_KEY, ACCESS_KEY, CREDENTIAL, AUTHORIZATION, DATABASE_URL, CONNECTION_STRING anywhere in it; AWS_*, AZURE_*, ARM_CLIENT*, OP_SESSION_*; a word PWD besides PWD and OLDPWD themselves; not SBX_*, SSH_AUTH_SOCK, GPG_AGENT_INFO, AWS_CA_BUNDLE, AWS_REGION, AWS_DEFAULT_REGION, AWS_PROFILE, AWS_CONFIG_FILE, AWS_SHARED_CREDENTIALS_FILE) passes only when named exactly (--pass-env NAME, SBX_PASS_ENV, --setenv) or with --keep-env: a PREFIX* never passes one. Each run that drops such variables prints, once the sandbox is set up, one line on stderr naming them (never a value) and logs env_secret_dropped (warn: names); the env event (info) lists the names passed and dropped. With --clearenv nothing of the caller's is looked at.",
        ),
        (
            "INVARIANTS",
            "Whatever the configuration, inside every writable bind these are read-only: .git/HEAD, .git/config, .git/objects/, .git/refs/ and .git/hooks/ (.git/objects and .git/refs bound onto themselves read-only, the others guard file system nodes; git can still write its index, logs and the like), and .git/info/ where it exists, and the whole .claude directory, a guard file system node too (so .claude/settings*.json, whatever the name, .claude/skills/, commands/, agents/ and hooks/ can be neither written nor created); .mcp.json, .envrc, .gitmodules, .vscode/, .idea/, .cargo/config[.toml], .npmrc, .yarnrc[.yml], .pnpmfile.cjs, .pre-commit-config.yaml, .cursor/, .continue/, .devcontainer/, .direnv/, .tool-versions, [.]mise.toml and .python-version where they exist; the target of any of these that is a symlink (a link through another link is refused, exit 125); and every file the hook and statusLine commands of the project's and the user's settings and plugins' hooks.json name (sh x.sh, node x.js, python3 x.py, ./x.sh, make -C DIR, $CLAUDE_PROJECT_DIR/..., any word naming an existing file), script words existing or not. An entry deeper than PATH_MAX cannot be protected by a mount: the run is refused (scan_too_deep). Entries that do not exist are covered by an empty read-only file or directory so they cannot be created; when .git or .claude does not exist at all, an empty read-only directory takes its place. A .git file (a worktree's gitfile) is kept read-only as it is, except one naming .git/worktrees/NAME of the repository whose .git is staged (--git-stage): git worktree remove deletes it, and sbx-gitguard checks it against the admin dir it imports. A writable bind of a .claude directory itself (such as ~/.claude, the agent's state directory) stays writable except its settings*.json, skills/, commands/, agents/, hooks/, plugins/ and every script a command of its settings' hooks or statusLine names inside it (these cannot be created when missing either). They are enforced at the top of each writable bind and in every directory holding one of them, at any depth (the same --scan-limit); a missing .git or .claude gets a placeholder only at the top. Every directory between a writable bind's root and a protected or denied path is bound onto itself, so that it cannot be renamed, exchanged or removed (EBUSY, EXDEV): no rename of an ancestor carries a protection away. Control files created during the run anywhere else (a new .claude/, .vscode/, .idea/, .mcp.json, .envrc, .gitmodules) are moved at the end, after the sandbox is gone, to the quarantine directory (--quarantine), each with the alert fs_protected_created. A --rw whose source lies inside one of them is refused.",
        ),
        (
            "GIT STAGE",
            "--git-stage DIR lets git commit inside the sandbox while .git/HEAD, .git/objects/ and .git/refs/ of the host stay unwritten. DIR is made by sbx-gitguard run --stage (or by hand): DIR/gitdir names the canonical path of one .git directory, which must lie in a writable bind; DIR/git/upper and DIR/git/work are empty directories on one file system; all three are owned by the caller and writable by nobody else, or sbx-fs refuses to start (exit 125). That .git is then shown through an overlay (lower: the real .git, opened and checked like every bind source; upper: DIR/git/upper), so every write git makes there (objects, refs, HEAD, index, logs, packed-refs) lands in DIR/git/upper and none in the host's .git. .git/config and .git/hooks/ stay protected on top of the overlay (guard nodes, alerts as above). After the command, sbx-gitguard verifies what DIR/git/upper holds and imports it (objects re-hashed, refs and HEAD checked); nothing else is ever copied back. Without sbx-gitguard, DIR/git/upper is simply what the sandbox tried to write. The overlay is volatile (Linux 5.10+): fsync inside it returns at once and DIR/git/upper is not synced when the sandbox ends (what reaches the repository is written durably by the import), so after a machine crash during a run the stage may hold torn objects, which an import refuses.",
        ),
        (
            "WHAT EXISTS ON THE HOST WHILE IT RUNS",
            "Mounts exist only in the sandbox's mount namespace; nothing propagates to the host, and the namespace dies with the sandbox. In the user's own tree, sbx-fs creates a mount point only where one is needed and missing: a destination nested inside a bind, or a denied/invariant path that does not exist inside a writable bind (for example an empty .git directory, .git/hooks, .claude, or a file named like the denied path). These placeholders are empty, mode 0755 (directories) or 0644 (files), marked with the extended attribute user.sbx-fs.placeholder, and are removed when the sandbox ends: by sbx-fs, and, if sbx-fs is killed (SIGKILL), by a small reaper process that sbx-fs forks before it creates the first one and tells of each one before it takes its name, which watches sbx-fs through a pidfd and removes them at once when it dies. A placeholder is removed only while it is still the inode sbx-fs created, and a directory only while empty. Concurrent sandboxes of one tree share placeholders (marked with the extended attribute user.sbx-fs.placeholder, held with a shared flock): the last one to end removes them. Only a SIGKILL of both sbx-fs and the reaper (for example of the whole process group) can leave one behind.",
        ),
        (
            "THE NEXT PROGRAM",
            "When CMD is an sbx tool (sbx-seccomp, typically), it is looked up with PATH on the host, opened before the root changes and executed by fd (execveat), so the chain works without binding the sbx binaries. Any other CMD is looked up with PATH inside the sandbox. Capabilities are always dropped before CMD runs: the only sbx tool meant to follow sbx-fs, sbx-seccomp, needs none.",
        ),
        (
            "AUDIT",
            "Events: start (info: namespaces, binds, counts, guarded), end (info: status), git_identity (info: user, name, email: whether each was found) and git_identity_refused (alert: name, user, reason: the value is not passed) with --git-identity, env (info: passed, dropped, secrets_passed: names only), env_secret_dropped (warn: names) when variables that look like secrets were not passed, setup_failed (warn) for every refused setup step, seccomp_kill (alert) when a process of the sandbox dies of SIGSYS. fs_denied (alert: path as seen inside, access, caller_pid) when a denied path is read, listed, looked into, created or changed; fs_write_denied (alert: path, op, caller_pid) when a protected path is opened for writing, truncated, created, removed, renamed, linked, chmod-ed or given xattrs, and (op replace, caller_pid null, via) when git's config.lock/HEAD.lock appears beside a protected .git/config or .git/HEAD (for config.lock with a hint: why git config --local fails with EBUSY and what to use instead, shown in the end-of-run summary); each distinct (path, access) is logged once; the first alert of each protected path is always logged, further ones (other accesses, names below it) at most 200 per sandbox, and fs_guard (info, at the end) counts alerts and alerts_suppressed. fs_protected_created / fs_protected_replaced (alert: path, quarantined) and fs_protected_moved (alert: path, found_at, restored) from the end sweep; scan_limit (alert: bind, limit, flag) when a bind holds more than --scan-limit entries. fs_guard_unavailable (warn, once: reason) when /dev/fuse could not be used. tmp_full (alert, once: path /tmp, size, free) when /tmp fills up (checked every 200 ms and at the end: a fill-and-delete in between is bounded by --tmp-size but may not be logged). Remounting, mounting, unmounting, chroot and pivot_root are refused by the kernel (EPERM) without sbx-fs seeing them: those have no event here (sbx-seccomp reports them).",
        ),
        (
            "WRITE BUDGET",
            "--write-quota SIZE (and --write-inodes N, default 1000000) bound what a run may add to all its writable directory binds together. Each is shown through an overlay whose upper layer lies on one tmpfs of that size and inode count, made inside the sandbox and never visible to it: past the budget writes fail with ENOSPC, the alert write_quota_exceeded names the bind that grew (once per bind) and the command goes on. The changes reach the host only when the command has ended: sbx-fs then applies each upper layer to its directory without following any symlink (files under a temporary name renamed into place; whiteouts and opaque directories delete), never creates FIFOs, sockets or device nodes, never sets set-user/group-ID bits of files (write_apply_refused), never touches the protected and denied paths, then runs the end sweep. A SIGKILL of sbx-fs during the run applies nothing; during the apply, the reaper removes the temporaries it journaled (each file is old or new). The budget is memory (tmpfs) and counts whole copied-up files; its overlays are volatile (Linux 5.10+), so fsync inside them returns at once (nothing written there is durable before the apply anyway). Project quotas (ext4/XFS prjquota) are detected and reported in the start event, not used.",
        ),
        (
            "GUARD FILE SYSTEM",
            "Denied paths and the protected .git/config, .git/HEAD, .git/hooks/ and .claude entries are nodes of a FUSE file system that sbx-fs serves itself: the sandbox's init opens /dev/fuse inside the sandbox's user namespace, mounts it (allow_other, no default_permissions: every access is asked of the server) and passes the /dev/fuse fd to the outer sbx-fs, which serves it from outside the sandbox's PID namespace. Protected entries are a read-only passthrough to the real files, opened by sbx-fs on the host before the sandbox started (their modes apply to the caller; only regular files are opened); write-class operations fail with EROFS. Entries that do not exist are empty nodes. If the server dies, accesses fail with ENOTCONN. The mounts live only in the sandbox's mount namespace. When /dev/fuse cannot be opened or mounted (it must be mode 0666, as Debian's fuse3 package's udev rule makes it), sbx-fs falls back to plain placeholders and read-only binds and logs fs_guard_unavailable; the run goes on.",
        ),
    ],
};

/// sbx-fs [OPTIONS] -- CMD [ARGS...]
#[derive(Parser, Debug)]
#[command(
    name = "sbx-fs",
    version,
    about = "Run a command in its own mount, PID, IPC and UTS namespaces under a root made only of what is granted"
)]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonArgs,

    /// What is granted, hidden and set up (the flags; sbx-spec).
    #[command(flatten)]
    pub spec: sbx_spec::FsSpec,

    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<OsString>,
}

pub fn main() -> ! {
    sbx_core::cli::run_main(TOOL, || {
        let cli: Cli = sbx_core::cli::parse(TOOL)?;
        sbx_core::cli::init(TOOL, &cli.common)?;
        run(cli)
    })
}

/// Checks every flag; nothing on the host is touched.
pub fn build_spec(cli: &sbx_spec::FsSpec) -> Result<Spec, Failure> {
    let tmp_size = spec::parse_size_flag("--tmp-size", &cli.tmp_size)?;
    let write_quota = spec::parse_budget(cli.write_quota.as_deref(), cli.write_inodes)?;
    let mut binds = Vec::new();
    for r in &cli.ro {
        binds.push(spec::parse_bind("--ro", r, false)?);
    }
    for r in &cli.rw {
        binds.push(spec::parse_bind("--rw", r, true)?);
    }
    let tmpfs = cli
        .tmpfs
        .iter()
        .map(|t| spec::parse_tmpfs(t, tmp_size))
        .collect::<Result<Vec<_>, _>>()?;
    for d in &cli.deny {
        spec::check_deny(d)?;
    }
    if let Some(h) = &cli.hostname {
        spec::check_hostname(h)?;
    }
    if let Some(d) = &cli.chdir
        && !d.is_absolute()
    {
        return Err(Failure::new(format!(
            "--chdir '{}': must be an absolute path",
            d.display()
        )));
    }
    let mut env_ops = Vec::new();
    for u in &cli.unsetenv {
        env_ops.push(spec::parse_unsetenv(u)?);
    }
    for s in &cli.setenv {
        env_ops.push(spec::parse_setenv(s)?);
    }
    if let Some(q) = &cli.quarantine
        && !q.is_absolute()
    {
        return Err(Failure::new(format!(
            "--quarantine '{}': must be an absolute path",
            q.display()
        )));
    }
    let mut env_policy = sbx_core::envpolicy::Policy {
        keep_all: cli.keep_env,
        pass: Vec::new(),
    };
    for p in &cli.pass_env {
        env_policy.pass.push(
            sbx_core::envpolicy::parse_pass("--pass-env", p)
                .map_err(|e| Failure::new(e.to_string()))?,
        );
    }
    env_policy
        .add_from_env()
        .map_err(|e| Failure::new(e.to_string()))?;
    Ok(Spec {
        scan_limit: cli.scan_limit,
        quarantine: cli.quarantine.clone(),
        binds,
        tmpfs,
        deny: cli.deny.clone(),
        chdir: cli.chdir.clone(),
        hostname: cli.hostname.clone(),
        clearenv: cli.clearenv,
        env_ops,
        env_policy,
        uid: cli.uid,
        gid: cli.gid,
        system: !cli.no_system,
        default_deny: !cli.no_default_deny,
        tmp_size,
        git_stage: cli.git_stage.clone(),
        write_quota,
    })
}

fn env_get<'a>(env: &'a [(OsString, OsString)], k: &str) -> Option<&'a OsString> {
    env.iter().find(|(n, _)| n == k).map(|(_, v)| v)
}

/// Computes the whole plan on the host (opening every bind source).
pub fn build_plan(spec: &Spec, env: &[(OsString, OsString)]) -> Result<Plan, Failure> {
    let host_home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|h| h.is_absolute());
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let mut plan = Plan::default();
    plan::skeleton(&mut plan, spec)?;

    // User binds, then tmpfs.
    let mut user_binds: Vec<(usize, PathBuf)> = Vec::new();
    for b in &spec.binds {
        let src = plan::open_source(b.flag, &b.src, b.rw, false)?;
        let dst = match &b.dst {
            Some(d) => d.clone(),
            None => spec::sandbox_path(b.flag, src.path.as_os_str())?,
        };
        if b.rw
            && let Some(p) = plan::rw_inside_invariant(&src.path)
        {
            return Err(plan::PlanError::RwProtected {
                path: src.path.clone(),
                protected: p,
            }
            .into());
        }
        let kind = src.kind;
        plan.sources.push(src);
        let i = plan.sources.len() - 1;
        user_binds.push((i, dst.clone()));
        plan.ops
            .push(Op::new(dst, kind, What::Bind { src: i, ro: !b.rw }, "bind"));
    }
    for t in &spec.tmpfs {
        plan.ops.push(Op::new(
            &t.dst,
            Kind::Dir,
            What::Tmpfs {
                size: t.size,
                mode: 0o755,
                owned: true,
            },
            "tmpfs",
        ));
    }
    // $HOME inside: an empty tmpfs unless something already covers it.
    if let Some(home) = env_get(env, "HOME").map(PathBuf::from)
        && let Ok(home) = spec::sandbox_path("HOME", home.as_os_str())
    {
        // Covered: a user bind at or above it, or a --tmpfs exactly there.
        let covered = plan.ops.iter().any(|o| match o.what {
            What::Bind { .. } => o.why == "bind" && home.starts_with(&o.dst),
            What::Tmpfs { .. } => o.why == "tmpfs" && home == o.dst,
            _ => false,
        });
        let under_system = plan::SYSTEM_DIRS.iter().any(|d| home.starts_with(d));
        if !covered && !under_system {
            plan.ops.push(Op::new(
                home,
                Kind::Dir,
                What::Tmpfs {
                    size: spec.tmp_size,
                    mode: 0o700,
                    owned: true,
                },
                "home",
            ));
        }
    }

    // Deny rules over every bind, then the invariants of writable binds.
    let mut rules = if spec.default_deny {
        deny::defaults(host_home.as_deref())
    } else {
        Vec::new()
    };
    for d in &spec.deny {
        rules.push(deny::parse_rule(d, host_home.as_deref(), &cwd));
    }
    let bind_dsts: Vec<(usize, PathBuf)> = plan
        .ops
        .iter()
        .filter_map(|o| match o.what {
            What::Bind { src, .. } if o.why != "dev" => Some((src, o.dst.clone())),
            _ => None,
        })
        .collect();
    let mut extra = Vec::new();
    for (i, dst) in &bind_dsts {
        let ops = deny::apply_limited(
            &rules,
            &plan.sources[*i],
            dst,
            host_home.as_deref(),
            spec.scan_limit,
        )
        .inspect_err(|e| e.alert())
        .map_err(|e| Failure::new(e.to_string()))?;
        extra.extend(ops);
    }
    let stage = match &spec.git_stage {
        Some(d) => Some(gitstage::open(d)?),
        None => None,
    };
    let mut staged = false;
    for (i, dst) in &user_binds {
        if plan.sources[*i].rw {
            let g = stage.as_ref().map(|s| s.gitdir.as_path());
            let ops = plan::invariants_limited(&plan.sources[*i], dst, g, spec.scan_limit)
                .inspect_err(|e| e.alert())
                .map_err(|e| Failure::new(e.to_string()))?;
            staged |= ops.iter().any(|o| matches!(o.what, What::Overlay { .. }));
            extra.extend(ops);
        }
    }
    if let Some(s) = &stage {
        if !staged {
            return Err(gitstage::StageError::Bad {
                dir: spec.git_stage.clone().unwrap_or_default(),
                why: format!(
                    "{} is not the .git directory of a writable bind (--rw)",
                    s.gitdir.display()
                ),
            }
            .into());
        }
        // The overlay's layers are bind sources: opened now, checked again
        // inside the namespace like every other.
        for (flag, p) in [
            ("--git-stage", &s.gitdir),
            ("--git-stage", &s.upper),
            ("--git-stage", &s.work),
        ] {
            plan.sources.push(plan::open_source(flag, p, true, false)?);
        }
        let n = plan.sources.len();
        for o in extra.iter_mut() {
            if let What::Overlay { lower, upper, work } = &mut o.what {
                (*lower, *upper, *work) = (n - 3, n - 2, n - 1);
            }
        }
    }
    // Targets of control symlinks that lie in another writable bind.
    let rw: Vec<(&std::path::Path, &std::path::Path)> = user_binds
        .iter()
        .filter(|(i, _)| plan.sources[*i].rw)
        .map(|(i, d)| (plan.sources[*i].path.as_path(), d.as_path()))
        .collect();
    protect::place_link_targets(&mut extra, &rw)
        .inspect_err(|e| e.alert())
        .map_err(|e| Failure::new(e.to_string()))?;
    plan.ops.extend(extra);
    plan::order(&mut plan.ops);
    plan.pins = pins_of(&plan, &user_binds);
    if let Some(budget) = spec.write_quota {
        let mut srcs: Vec<usize> = Vec::new();
        for (i, _) in &user_binds {
            let s = &plan.sources[*i];
            if s.rw && s.kind == Kind::Dir && !srcs.contains(i) {
                srcs.push(*i);
            }
        }
        // Without a writable directory bind there is nothing to budget.
        if !srcs.is_empty() {
            plan.quota = Some(plan::QuotaPlan { budget, srcs });
        }
    }
    Ok(plan)
}

/// What the outer sbx-fs needs to apply each layer of the budget: the host
/// directory and the paths inside it that the apply must leave alone (every
/// mount point of the plan below the bind, and the pins).
pub fn quota_layers(plan: &Plan) -> Vec<quota::Layer> {
    let Some(q) = &plan.quota else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (k, src) in q.srcs.iter().enumerate() {
        let s = &plan.sources[*src];
        // Where it is bound (the first user bind of that source).
        let Some(dst) = plan
            .ops
            .iter()
            .find(|o| q.layer_of(o) == Some(k))
            .map(|o| o.dst.clone())
        else {
            continue;
        };
        let rel = |p: &std::path::Path| {
            p.strip_prefix(&dst)
                .ok()
                .filter(|r| !r.as_os_str().is_empty())
                .map(|r| r.to_path_buf())
        };
        let skip = plan.ops.iter().filter_map(|o| rel(&o.dst)).collect();
        let pins = plan.pins.iter().filter_map(|p| rel(p)).collect();
        out.push(quota::Layer {
            k,
            host: s.path.clone(),
            dev: s.dev,
            ino: s.ino,
            rules: quota::Rules { skip, pins },
        });
    }
    out
}

/// The ancestors of every protected path inside a writable bind (up to the
/// bind's root): they are pinned (bound onto themselves) so that no rename
/// of a directory above a protection can carry it away.
fn pins_of(plan: &Plan, user_binds: &[(usize, PathBuf)]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for (i, dst) in user_binds {
        if !plan.sources[*i].rw || plan.sources[*i].kind != Kind::Dir {
            continue;
        }
        let protected: Vec<&std::path::Path> = plan
            .ops
            .iter()
            .filter(|o| {
                matches!(
                    o.what,
                    What::Deny | What::Empty | What::ReadOnly | What::Overlay { .. }
                ) && o.dst.starts_with(dst)
                    && &o.dst != dst
            })
            .map(|o| o.dst.as_path())
            .collect();
        out.extend(protect::pins(dst, &protected));
    }
    // A path that is a mount point of the plan already needs no pin.
    out.retain(|p| !plan.ops.iter().any(|o| &o.dst == p));
    out.sort_by(|a, b| plan::depth(a).cmp(&plan::depth(b)).then(a.cmp(b)));
    out.dedup();
    out
}

/// Creates the mount points the plan needs inside binds (on the host),
/// recorded in `ph` (whose reaper is forked before the first one).
pub fn host_placeholders(
    plan: &Plan,
    mut ph: placeholder::Placeholders,
) -> Result<placeholder::Placeholders, Failure> {
    for i in 0..plan.ops.len() {
        let op = &plan.ops[i];
        // ReadOnly ops too: what they protect may be another sandbox's
        // placeholder, which this one must hold while it runs.
        if op.optional {
            continue;
        }
        let Some(j) = plan::enclosing(&plan.ops, i) else {
            continue;
        };
        let What::Bind { src, .. } = plan.ops[j].what else {
            continue;
        };
        let s = &plan.sources[src];
        let Ok(rel) = op.dst.strip_prefix(&plan.ops[j].dst) else {
            continue;
        };
        if let Err(e) = ph.ensure(s, rel, op.kind) {
            ph.cleanup();
            return Err(e.into());
        }
    }
    Ok(ph)
}

/// Step 1: what the sandbox is made of, from the flags (nothing exists
/// yet when this fails).
struct Prepared {
    spec: Spec,
    env: Vec<(OsString, OsString)>,
    filtered: Option<sbx_core::envpolicy::Filtered>,
    userns: bool,
    /// The caller's ids, and the identity inside.
    outer: (u32, u32),
    inner: (u32, u32),
    /// The next program when it is a real sbx tool (by file identity, not
    /// name): opened now, on the host, and executed from that fd; anything
    /// else is looked up inside the sandbox.
    exec_fd: Option<OwnedFd>,
    plan: Plan,
    checks: EndChecks,
    fallback_dirs: Vec<PathBuf>,
    gitconfig: Option<(PathBuf, Vec<u8>)>,
}

/// Step 2: what exists on the host for this run, undone by the reaper if
/// sbx-fs dies.
struct HostSetup {
    ph: placeholder::Placeholders,
    /// The write budget's layers, and the journal of the apply's
    /// temporary names (the reaper has its copy).
    layers: Vec<quota::Layer>,
    budget: Option<quota::Budget>,
    journal: Option<quota::Journal>,
}

impl HostSetup {
    /// A failed step after the host setup: the placeholders go first.
    fn or_cleanup<T>(&mut self, r: Result<T, Failure>) -> Result<T, Failure> {
        if r.is_err() {
            self.ph.cleanup();
        }
        r
    }
}

/// The steps, in order:
/// 1. check the flags and compute the plan (`prepare`);
/// 2. on the host: the mount points the plan needs, the write budget's
///    journal, and the reaper that undoes them if sbx-fs dies
///    (`host_setup`);
/// 3. the `start` event;
/// 4. clone init into the new namespaces: it builds the root from the plan
///    and runs the command (`init::run`);
/// 5. serve the guard file system and watch the protected lock files
///    (`serve_guards`);
/// 6. supervise: forward signals, watch /tmp and the budget, until init
///    ends;
/// 7. finish: apply the write budget, sweep the control files created,
///    remove the placeholders, the `end` event (`finish`).
fn run(cli: Cli) -> Result<i32, Failure> {
    let p = prepare(&cli)?;
    let mut host = host_setup(&p)?;
    let mut guards = guard::select(&p.plan);
    let flags = namespaces::flags(p.userns);
    // Said once the sandbox is set up: a refused setup stays one line.
    if let Some(f) = &p.filtered {
        sbx_core::envpolicy::report(TOOL, f);
    }
    emit_start(&cli, &p, &host, &guards, flags);

    let owner = sys::pidfd_open(std::process::id() as i32)
        .map_err(|e| Failure::new(format!("pidfd_open self: {e}")));
    let owner = host.or_cleanup(owner)?;
    let sigfd = SignalFd::with_flags(
        &sbx_core::signals::forwarded_set(),
        SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK,
    )
    .map_err(|e| Failure::new(format!("signalfd: {e}")));
    let sigfd = host.or_cleanup(sigfd)?;
    // Init -> sbx-fs: the guard fs's /dev/fuse fd, the /tmp fd. Made after
    // the reaper was forked, so only sbx-fs and init hold it.
    let pair = fuse::handoff::pair().map_err(|e| Failure::new(format!("socketpair: {e}")));
    let (chan, init_chan) = host.or_cleanup(pair)?;
    let pid = namespaces::clone_into(flags).map_err(Failure::from);
    let pid = host.or_cleanup(pid)?;
    if pid == 0 {
        drop(sigfd);
        drop(chan);
        for fd in host.ph.fds() {
            // SAFETY: in init (the clone's child), these are its copies of sbx-fs's fds, closed
            // once; ph is forgotten so they are not closed again.
            unsafe { libc::close(fd) };
        }
        std::mem::forget(host.ph);
        init::run(init::InitArgs {
            plan: p.plan,
            userns: p.userns,
            uid: p.inner.0,
            gid: p.inner.1,
            outer_uid: p.outer.0,
            outer_gid: p.outer.1,
            hostname: p.spec.hostname.clone(),
            chdir: p.spec.chdir.clone(),
            fallback_dirs: p.fallback_dirs,
            argv: cli.cmd.clone(),
            env: p.env,
            exec_fd: p.exec_fd,
            owner,
            guards,
            chan: Some(init_chan),
            gitconfig: p.gitconfig,
        });
    }
    drop(init_chan);
    host.ph.tell_sandbox(pid);
    drop(p.plan);
    drop(p.exec_fd);
    drop(owner);

    let ids = fuse::server::Ids {
        userns: p.userns,
        outer_uid: p.outer.0,
        outer_gid: p.outer.1,
        inner_uid: p.inner.0,
        inner_gid: p.inner.1,
    };
    let (alerts, locks, served) = serve_guards(&chan, &mut guards, ids);
    let mut watch = Watch {
        chan: Some(chan),
        tmp: None,
        tmp_size: p.spec.tmp_size,
        quota: None,
        budget: host.budget.map(|b| (b, std::mem::take(&mut host.layers))),
        locks,
        alerts,
    };
    let code = supervise(pid, &sigfd, &mut watch);
    finish(code, watch, served, &mut host, &p.checks);
    Ok(code)
}

fn prepare(cli: &Cli) -> Result<Prepared, Failure> {
    let spec = build_spec(&cli.spec)?;
    let (env, filtered) = plan::command_env(&spec);
    let userns = !namespaces::have_cap_sys_admin();
    // SAFETY: geteuid/getegid cannot fail.
    let outer = unsafe { (libc::geteuid(), libc::getegid()) };
    let inner = (spec.uid.unwrap_or(outer.0), spec.gid.unwrap_or(outer.1));
    let exec_fd = chain::open_tool(&cli.cmd[0], env_get(&env, "PATH").map(|p| p.as_os_str()));
    // --quarantine first: a bad one is refused before any walk.
    quarantine::check_flag(&spec)?;
    // The walks below (deny patterns, control directories, the sweeps'
    // records) share one listing of each writable tree.
    let walks = protect::shared_walks();
    let plan = build_plan(&spec, &env)?;
    auditlog::refuse_log_in_writable_bind(&plan)?;
    let checks = start_sweeps(&spec, &plan)?;
    drop(walks);
    let mut fallback_dirs = Vec::new();
    if let Ok(c) = std::env::current_dir() {
        fallback_dirs.push(c);
    }
    if let Some(h) = env_get(&env, "HOME") {
        fallback_dirs.push(PathBuf::from(h));
    }
    // Read before any fork: git runs on the host, as the caller.
    let gitconfig = if cli.spec.git_identity {
        let id = gitident::read();
        gitident::target(&plan)
            .filter(|_| !id.is_empty())
            .map(|t| (t, id.gitconfig()))
    } else {
        None
    };
    Ok(Prepared {
        spec,
        env,
        filtered,
        userns,
        outer,
        inner,
        exec_fd,
        plan,
        checks,
        fallback_dirs,
        gitconfig,
    })
}

fn host_setup(p: &Prepared) -> Result<HostSetup, Failure> {
    // The journal and the reaper's `after` exist before the first
    // placeholder: the reaper is forked with them, before anything of the
    // user's tree changes.
    let budget = p.plan.quota.as_ref().map(|q| q.budget);
    let (journal, reaper_journal) = match budget {
        Some(_) => {
            let (a, b) = quota::Journal::new()
                .map_err(|e| Failure::new(format!("memfd for the apply journal: {e}")))?;
            (Some(a), Some(b))
        }
        None => (None, None),
    };
    let reaper_fds = reaper_journal.iter().map(|b| b.raw_fd()).collect();
    // The reaper also runs the end sweep if sbx-fs is killed (after taking
    // out what a killed apply left half-made).
    let (sweeps, mcp, quarantine) = &p.checks;
    let after: Option<Box<dyn FnOnce()>> = if sweeps.is_empty()
        && mcp.is_none()
        && reaper_journal.is_none()
    {
        None
    } else {
        let (sw, m, q) = (sweeps.clone(), mcp.clone(), quarantine.clone());
        Some(Box::new(move || {
            if let Some(j) = &reaper_journal {
                let left = quota::recover(j);
                if !left.is_empty() {
                    audit::emit(
                        "write_apply_interrupted",
                        Severity::Warn,
                        serde_json::json!({ "removed": left.iter().map(|p| p.display().to_string()).collect::<Vec<_>>() }),
                    );
                }
            }
            end_checks(&sw, m.as_ref(), &q)
        }))
    };
    let ph = host_placeholders(&p.plan, placeholder::Placeholders::new(after, reaper_fds))?;
    sbx_core::registry::test_kill_point("fs-placeholders-made");
    let mut host = HostSetup {
        ph,
        layers: quota_layers(&p.plan),
        budget,
        journal,
    };
    let started = host.ph.start_reaper().map_err(Failure::from);
    host.or_cleanup(started)?;
    Ok(host)
}

fn emit_start(
    cli: &Cli,
    p: &Prepared,
    host: &HostSetup,
    guards: &guard::Guards,
    flags: libc::c_int,
) {
    let plan = &p.plan;
    audit::emit(
        "start",
        Severity::Info,
        serde_json::json!({
            "namespaces": namespaces::describe(flags),
            "uid": p.inner.0,
            "gid": p.inner.1,
            "binds": plan.ops.iter().filter_map(|o| match o.what {
                What::Bind { src, ro } if o.why == "bind" => Some(format!("{}{}:{}", if ro { "ro " } else { "rw " }, plan.sources[src].path.display(), o.dst.display())),
                _ => None,
            }).collect::<Vec<_>>(),
            "mounts": plan.ops.len(),
            "denied": plan.ops.iter().filter(|o| o.what == What::Deny && o.why != "proc mask").count(),
            "placeholders": host.ph.list.iter().map(|p| p.shown.display().to_string()).collect::<Vec<_>>(),
            "guarded": guards.nodes.len(),
            "write_quota": host.budget.map(|b| serde_json::json!({
                "mode": "overlay",
                "bytes": b.bytes,
                "inodes": b.inodes,
                "binds": host.layers.iter().map(|l| l.host.display().to_string()).collect::<Vec<_>>(),
                "prjquota": host.layers.first().map(|l| quota::prjquota(&l.host).err().unwrap_or_default()),
            })),
            "command": chain::show(&cli.cmd),
        }),
    );
}

/// Step 5: the guard file system served on a thread when init sent its
/// /dev/fuse fd, and the lock files of protected .git entries watched
/// (only with the guard served: the fallback logs no file refusal at all;
/// the watch forks, so it starts before the server's thread). Returns the
/// alerts, the lock watch and whether the guard is served.
fn serve_guards(
    chan: &OwnedFd,
    guards: &mut guard::Guards,
    ids: fuse::server::Ids,
) -> (
    Arc<Mutex<guard::Alerts>>,
    Option<lockwatch::LockWatch>,
    bool,
) {
    let alerts = Arc::new(Mutex::new(guard::Alerts::for_nodes(
        guards.nodes.iter().map(|n| n.path.clone()),
    )));
    let git_dirs = std::mem::take(&mut guards.git_dirs);
    let dev = if guards.is_empty() {
        None
    } else {
        guard_fd(chan)
    };
    let locks = match dev {
        Some(_) => {
            let guarded = guards.nodes.iter().map(|n| n.path.clone()).collect();
            lockwatch::LockWatch::start(&git_dirs, guarded)
                .inspect_err(|e| {
                    audit::emit(
                        "lockwatch_unavailable",
                        Severity::Warn,
                        serde_json::json!({ "reason": e.to_string() }),
                    )
                })
                .ok()
                .flatten()
        }
        None => None,
    };
    drop(git_dirs);
    let served = match dev {
        Some(dev) => {
            let nodes = std::mem::take(&mut guards.nodes);
            let server = fuse::server::Server::new(dev, nodes, ids, alerts.clone());
            std::thread::Builder::new()
                .name("guard-fs".into())
                .spawn(move || server.run())
                .is_ok()
        }
        None => false,
    };
    (alerts, locks, served)
}

/// Step 7, once init has ended.
fn finish(code: i32, mut watch: Watch, served: bool, host: &mut HostSetup, checks: &EndChecks) {
    // Messages init sent that the loop did not read (a short command).
    while watch.chan.is_some() {
        watch.on_chan();
    }
    if let Some(l) = &mut watch.locks {
        l.finish(&watch.alerts);
    }
    // A last look at /tmp (the fd keeps the tmpfs alive).
    if let Some(t) = &mut watch.tmp {
        t.check();
    }
    if served && let Ok(a) = watch.alerts.lock() {
        audit::emit(
            "fs_guard",
            Severity::Info,
            serde_json::json!({ "alerts": a.emitted, "alerts_suppressed": a.suppressed }),
        );
    }
    // The sandbox is gone (its PID namespace died with init) and nothing
    // has run on the host since: take out the control files it created
    // (placeholders are skipped; the reaper is released only after, so a
    // kill meanwhile leaves the sweep to it).
    // The write budget's layers land on the host first: the end sweep then
    // judges the tree as it will stay.
    if let Some(q) = &mut watch.quota {
        q.apply_all(host.journal.as_ref());
    } else if watch.budget.is_some() && code != sbx_core::exit::TOOL_FAILED {
        // (A refused setup has said why already; nothing ran.)
        audit::emit(
            "write_apply_failed",
            Severity::Warn,
            serde_json::json!({ "op": "receive the write budget", "error": "the sandbox ended before it was set up" }),
        );
    }
    drop(watch.quota.take());
    let (sweeps, mcp, quarantine) = checks;
    end_checks(sweeps, mcp.as_ref(), quarantine);
    let left = host.ph.cleanup();
    if !left.is_empty() {
        audit::emit(
            "cleanup_incomplete",
            Severity::Warn,
            serde_json::json!({ "left": left.iter().map(|p| p.display().to_string()).collect::<Vec<_>>() }),
        );
    }
    // Our helpers are reaped by us, not left as init's zombies, which an
    // enclosing sbx-cgroup would wait for.
    if let Some(l) = watch.locks.take() {
        l.reap();
    }
    audit::emit("end", Severity::Info, serde_json::json!({ "status": code }));
}

/// Records the control entries of every writable bind (for the end sweep)
/// and picks the quarantine directory, which must lie outside every
/// writable bind (the sandbox could plant symlinks there otherwise).
/// The end sweep of every writable bind and the MCP servers check.
fn end_checks(sweeps: &[protect::Sweep], mcp: Option<&protect::McpGuard>, q: &std::path::Path) {
    for s in sweeps {
        s.finish(q);
    }
    if let Some(m) = mcp {
        m.finish(q);
    }
}

type EndChecks = (Vec<protect::Sweep>, Option<protect::McpGuard>, PathBuf);

fn start_sweeps(spec: &Spec, plan: &Plan) -> Result<EndChecks, Failure> {
    let rw_all: Vec<&plan::Source> = plan
        .ops
        .iter()
        .filter_map(|o| match o.what {
            What::Bind { src, ro: false } if o.why == "bind" => Some(&plan.sources[src]),
            _ => None,
        })
        .collect();
    // ~/.claude.json under a writable bind (or bound itself).
    let mcp = std::env::var_os("HOME")
        .map(|h| protect::canonical_prefix(&PathBuf::from(h).join(".claude.json")))
        .filter(|p| rw_all.iter().any(|s| p.starts_with(&s.path)))
        .and_then(|p| protect::McpGuard::start(&p));
    let rw: Vec<&plan::Source> = rw_all
        .into_iter()
        .filter(|s| s.kind == Kind::Dir || mcp.is_some())
        .collect();
    if rw.is_empty() {
        return Ok((Vec::new(), None, PathBuf::new()));
    }
    // By path, identity and mount alias (a bind mount of a directory
    // inside a writable bind reaches it by another path).
    let rw_paths: Vec<PathBuf> = rw.iter().map(|s| s.path.clone()).collect();
    let inside = |q: &std::path::Path| quarantine::inside(q, &rw_paths);
    let q = match &spec.quarantine {
        Some(q) => {
            if let Some(b) = inside(q) {
                return Err(Failure::new(format!(
                    "--quarantine {}: inside the writable bind {} (it must lie outside every writable bind)",
                    q.display(),
                    b.display()
                )));
            }
            protect::canonical_prefix(q)
        }
        None => sbx_core::registry::default_quarantines()
            .into_iter()
            .find(|q| inside(q).is_none())
            .map(|q| protect::canonical_prefix(&q))
            .ok_or_else(|| {
                Failure::new(
                    "no quarantine directory outside the writable binds: set --quarantine DIR",
                )
            })?,
    };
    let mut sweeps = Vec::new();
    for s in rw.into_iter().filter(|s| s.kind == Kind::Dir) {
        let sw = protect::Sweep::start(&s.path, spec.scan_limit)
            .inspect_err(|e| e.alert())
            .map_err(|e| Failure::new(e.to_string()))?;
        sweeps.push(sw);
    }
    Ok((sweeps, mcp, q))
}

/// Waits for init's word on the guard file system: the /dev/fuse fd when
/// it is mounted. When /dev/fuse could not be used, one warn event says
/// why; the sandbox then runs with plain placeholders.
fn guard_fd(chan: &OwnedFd) -> Option<OwnedFd> {
    use fuse::handoff;
    // Init sends exactly one of these before anything else, or dies (EOF).
    match handoff::recv(chan) {
        Ok(Some((handoff::TAG_FUSE, _, Some(dev)))) => Some(dev),
        Ok(Some((handoff::TAG_UNAVAILABLE, reason, _))) => {
            audit::emit(
                "fs_guard_unavailable",
                Severity::Warn,
                serde_json::json!({
                    "reason": reason,
                    "fallback": "denied paths are mode-000 placeholders and protected paths read-only binds; their refusals are not logged",
                }),
            );
            None
        }
        _ => None,
    }
}

/// What the outer loop watches besides the sandbox.
struct Watch {
    /// Init's channel (the /tmp fd arrives there).
    chan: Option<OwnedFd>,
    tmp: Option<tmpwatch::TmpWatch>,
    tmp_size: u64,
    /// The write budget's tmpfs, once init sent it.
    quota: Option<quota::Watch>,
    budget: Option<(quota::Budget, Vec<quota::Layer>)>,
    locks: Option<lockwatch::LockWatch>,
    alerts: Arc<Mutex<guard::Alerts>>,
}

impl Watch {
    fn on_chan(&mut self) {
        let Some(c) = &self.chan else { return };
        match fuse::handoff::recv(c) {
            Ok(Some((fuse::handoff::TAG_TMP, _, Some(fd)))) => {
                self.tmp = Some(tmpwatch::TmpWatch::new(fd, self.tmp_size));
            }
            Ok(Some((fuse::handoff::TAG_QUOTA, _, Some(fd)))) => {
                if let Some((b, l)) = self.budget.take() {
                    self.quota = Some(quota::Watch::new(fd, b, l));
                }
            }
            Ok(Some(_)) => {}
            _ => self.chan = None,
        }
    }
}

/// The outer loop: forwards signals to PID 1, kills it when our own
/// supervising sbx tool dies, watches /tmp, returns its status.
fn supervise(pid: libc::pid_t, sigfd: &SignalFd, watch: &mut Watch) -> i32 {
    use std::os::fd::AsFd;
    let pidfd = match sys::pidfd_open(pid) {
        Ok(f) => f,
        Err(_) => return wait_blocking(pid),
    };
    let parent = sbx_core::supervise::parent_pidfd();
    // SIGKILL of PID 1 (and so of the whole namespace) when the command
    // ignores a forwarded SIGTERM for --kill-after (issue 16).
    let mut escalation = sbx_core::supervise::Escalation::default();
    loop {
        if escalation.due(pid) {
            let _ = sys::pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL);
        }
        let mut fds = vec![
            libc::pollfd {
                fd: pidfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: sigfd.as_fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        fds.push(libc::pollfd {
            fd: parent.unwrap_or(-1),
            events: libc::POLLIN,
            revents: 0,
        });
        fds.push(libc::pollfd {
            fd: watch.chan.as_ref().map_or(-1, |c| c.as_raw_fd()),
            events: libc::POLLIN,
            revents: 0,
        });
        fds.push(libc::pollfd {
            fd: watch.locks.as_ref().map_or(-1, |l| l.raw_fd()),
            events: libc::POLLIN,
            revents: 0,
        });
        let timeout = if watch.tmp.is_some() || watch.quota.is_some() {
            tmpwatch::INTERVAL.as_millis() as i32
        } else {
            -1
        };
        let timeout = escalation.timeout_ms(timeout);
        // SAFETY: fds is a live array of fds.len() pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if n < 0 {
            continue;
        }
        if let Some(t) = &mut watch.tmp {
            t.check();
        }
        if let Some(q) = &mut watch.quota {
            q.check();
        }
        if fds[3].revents != 0 {
            watch.on_chan();
        }
        if fds[4].revents != 0
            && let Some(l) = &mut watch.locks
        {
            l.drain(&watch.alerts);
        }
        if fds[1].revents != 0 {
            while let Ok(Some(info)) = sigfd.read_signal() {
                let _ = sys::pidfd_send_signal(pidfd.as_fd(), info.ssi_signo as i32);
                escalation.forwarded(info.ssi_signo as i32);
            }
        }
        if fds[0].revents != 0 {
            return wait_blocking(pid);
        }
        if fds[2].revents != 0 {
            let _ = sys::pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL);
            return wait_blocking(pid);
        }
    }
}

fn wait_blocking(pid: libc::pid_t) -> i32 {
    let mut st = 0;
    loop {
        // SAFETY: pid is our own child; st is a live int.
        let r = unsafe { libc::waitpid(pid, &mut st, 0) };
        if r == pid {
            return sbx_core::exit::from_raw_wait(st);
        }
        if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return sbx_core::exit::TOOL_FAILED;
        }
    }
}
