//! sbx-seccomp: no_new_privs + a seccomp-BPF syscall filter, then `execve`
//! of the next command in place (no fork).
//!
//! Modules: [`model`] (seccompiler's JSON policy format), [`policy`] (from
//! options to a policy document), [`compile`] (to BPF with seccompiler, plus
//! our prelude for foreign ABIs), [`install`] (prctl/seccomp), [`print`]
//! (`--print`).

use std::ffi::OsString;

use clap::Parser;
use sbx_core::cli::CommonArgs;
use sbx_core::{Failure, Severity};

mod compile;
mod execwatch;
mod install;
pub mod landlock;
pub mod model;
mod notify;
pub mod policy;
mod print;

pub use policy::{DenyAction, Profile};

pub const TOOL: &str = "sbx-seccomp";

pub const MAN: sbx_core::man::ManInfo = sbx_core::man::ManInfo {
    about: "Sets no_new_privs, installs a seccomp-BPF syscall filter and executes CMD in place \
(execve, no fork): CMD and everything it starts run under the filter, which nothing in the \
sandbox can remove. The default profile allows normal programs (shells, compilers, \
interpreters, package managers, git, headless browsers) and denies the kernel's attack \
surface. It is the innermost layer of an sbx chain: `sbx-cgroup ... -- sbx-fs ... -- \
sbx-seccomp -- CMD`. Profiles are seccompiler JSON documents built into the binary and \
checked at build time; --policy FILE takes the same format.",
    exit_status: "The status of CMD, unchanged (sbx-seccomp becomes CMD). A process killed by \
the filter dies of SIGSYS: a supervising parent sees 159 (128+31) and, if it is an sbx \
supervisor, logs a seccomp_kill alert. 125: sbx-seccomp itself failed (bad option, unknown \
syscall name, malformed or missing policy file, the kernel refused the filter). 126: CMD \
found but not executable. 127: CMD not found. --print exits 0.",
    inherited_state: "CMD inherits the filter (for good: seccomp filters cannot be removed, and \
every child inherits them), no_new_privs (setuid and file capabilities no longer raise \
privileges), with --no-tsc the TSC trap (rdtsc raises SIGSEGV), an empty signal mask, and everything else of this \
process unchanged: environment, fds 0-2 (every other fd is closed at exec), namespaces, \
credentials, cgroup, rlimits. With --allow-exec, a Landlock domain that lets only the listed \
files be executed (inherited by every child, like the filter). The audit log fd is passed on \
only when CMD is another sbx tool.",
    environment: "",
    extra: &[
        (
            "DEFAULT PROFILE",
            "EPERM, and with an audit log a syscall_denied alert (see OBSERVABLE DENIALS; calls \
programs probe for, so they fall back gracefully): mount, umount2, \
pivot_root, chroot; the new mount API fsopen, fsconfig, fsmount, fspick, move_mount, \
open_tree, mount_setattr; unshare, setns; clone with any of CLONE_NEWNS, CLONE_NEWCGROUP, \
CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET; keyctl, add_key, \
request_key; bpf; perf_event_open; userfaultfd; io_uring_setup, io_uring_enter, \
io_uring_register; ptrace, process_vm_readv, process_vm_writev, pidfd_getfd (see \
--allow-ptrace); swapon, swapoff; reboot; acct; quotactl, quotactl_fd; syslog; \
settimeofday, clock_settime, clock_adjtime, adjtimex; clock_gettime(CLOCK_MONOTONIC_RAW) as a system call (the vDSO still answers it; see TIMERS in docs/seccomp.md); sethostname, setdomainname; \
name_to_handle_at; lookup_dcookie; vhangup; uselib, ustat, sysfs, _sysctl; personality \
with any value but PER_LINUX (0) and the query 0xffffffff; ioctl TIOCSTI and TIOCLINUX.\n\n\
ENOSYS: clone3, whose flags live in memory a filter cannot read: glibc and musl then fall \
back to clone, whose flags the filter checks.\n\n\
KILL (SIGSYS, the whole process; only an exploit makes these calls): kexec_load, \
kexec_file_load; init_module, finit_module, delete_module (and the obsolete create_module, \
get_kernel_syms, query_module); iopl, ioperm; open_by_handle_at (the 'shocker' escape); \
modify_ldt; nfsservctl; any call through a foreign architecture (i386 int 0x80) or the x32 \
ABI (syscall numbers with bit 30 set).\n\n\
Syscalls newer than seccompiler's table (numbers >= 463 on x86_64, e.g. open_tree_attr) \
get ENOSYS. Everything else is allowed, without argument checks where possible so that \
the kernel's constant-action cache answers it without running the filter.",
        ),
        (
            "OBSERVABLE DENIALS",
            "With an audit log (--audit-log, or the fd an outer sbx tool hands down) and no --action, \
the default profile's EPERM denials (and --deny's, unless a --deny name is also answered by \
another filter, like clone3) are installed as SECCOMP_RET_USER_NOTIF and a notifier \
process answers each with EPERM (the call is never carried out) after writing a \
syscall_denied alert: syscall name and number, the caller's pid, the flags of clone and \
unshare, the request of ioctl. Alerts are rate-limited (a burst of 50, then 5 per second); \
the number suppressed is in a final syscall_denied_suppressed alert. The notifier is forked \
before the filter is installed (it runs without it), double-forked so that it is not a \
child of CMD, in a session of its own, not dumpable, holding only the listener and the \
audit log; it exits when no filtered process is left. CMD never holds the listener. CMD \
cannot signal the notifier: kill, tkill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo and \
pidfd_open aimed at it or at its watcher (their pids, the notifier's process group, or \
kill(-1)) are refused EPERM with a notifier_attacked alert; every pidfd_send_signal goes to \
the notifier, which copies the caller's fd (pidfd_getfd), refuses it (EPERM, alert) when it \
refers to the notifier or its watcher (a pidfd or a /proc/PID directory fd), and otherwise \
sends the signal itself through the copy. If the notifier is killed anyway (from outside), \
its watcher (sbx-seccomp-wd) logs seccomp_notifier_died (alert) and kills CMD (status 137): \
the run never goes on with refusals that would be silent ENOSYS; a killed watcher is the \
same. Under sbx-fs its init also reaps the notifier and logs seccomp_notifier_died. The first alert the rate limit \
holds back is itself an alert_budget_exhausted alert (once). Without \
an audit log the alerts are lines on stderr (sbx-seccomp: ALERT ...) while CMD runs. With \
--action errno, denials are silent EPERM as plain seccomp gives. \
--print shows these rows as notify(EPERM).",
        ),
        (
            "EXEC ALLOWLIST",
            "--allow-exec PATH (repeatable, absolute; a directory allows everything beneath it) \
restricts execution with Landlock (ABI 1 or later; sbx-seccomp fails with 125 when the \
kernel has no Landlock): after the notifier is forked and before the filter is installed, \
sbx-seccomp puts itself in a Landlock domain that handles only execute and allows it for \
the listed files and the system's dynamic loaders (ld-linux*, ld-musl*), then executes \
CMD. Any other file, a binary the sandbox built or copied, a #! script's unlisted \
interpreter, CMD itself when not listed, fails with EACCES (a shell reports 126). A hard \
link of a listed file is the same inode and runs. Paths that do not exist are skipped.\n\n\
With an audit log, execve and execveat also go to the notifier, which reads the path from \
the caller's memory (process_vm_readv, then SECCOMP_IOCTL_NOTIF_ID_VALID), resolves it as \
the kernel will (the caller's cwd or dirfd through /proc/PID/cwd and /proc/PID/fd/N, \
symlinks followed, AT_EMPTY_PATH as the fd's file, #! and ELF interpreters followed), and \
when the file is not listed writes an exec_denied alert (path, caller_pid, requested, \
syscall, reason), deduplicated per path and rate-limited like syscall_denied; the count \
suppressed (and the most repeated paths) is in a final exec_denied_suppressed alert. It \
then answers SECCOMP_USER_NOTIF_FLAG_CONTINUE: Landlock enforces, the alert is best effort \
(a caller that changes its memory, cwd, fds or a symlink between the look and the exec can \
make the log wrong, never run an unlisted file). One exception: Landlock lets every file on \
a kernel-internal mount run, that is a memfd (a program written into memfd_create's file and \
run with execveat or /proc/self/fd/N). So memfd_create goes to the notifier too, which \
creates the memfd itself with MFD_NOEXEC_SEAL (Linux 6.3+: no execute bit, and none can be \
added) and installs it in the caller (SECCOMP_IOCTL_NOTIF_ADDFD, SEND); MFD_EXEC is refused \
with EACCES and an exec_denied alert (syscall memfd_create); and an exec of an unlisted \
memfd is answered EACCES by the notifier (enforced_by: notifier). If the notifier is \
killed, every exec and memfd_create fails (ENOSYS). Without an audit log the notifier still \
runs (the memfd handling) and its alerts are lines on stderr. On kernels before 6.3 the memfd \
is created by the kernel as asked and only the notifier's exec check (subject to the race \
above) stands in the way. Landlock:cannot). Landlock: Landlock checks \
execve, not mmap(PROT_EXEC): a listed dynamic loader can map an unlisted ELF (ld.so \
./prog) and a listed interpreter runs any script given as an argument (sh ./x.sh).",
        ),
        (
            "STRICT PROFILE",
            "The default profile plus an allowlist of about 240 syscalls for simple \
workloads (file I/O, memory, processes, signals, time, polling, local AF_UNIX sockets); \
any other call fails with EPERM (or per --action).",
        ),
        (
            "KILL REPORTING",
            "sbx-seccomp replaces itself with CMD, so it cannot see a kill. The supervising \
sbx tool that reaps the process (sbx-fs's init, sbx-cgroup, any sbx supervisor) sees the \
SIGSYS status and writes a seccomp_kill alert to the audit log. The kernel logs every \
KILL_PROCESS as an audit record (type=1326 ... syscall=N), which appears in the kernel \
log (/dev/kmsg) when no audit daemon takes it; when the supervisor can read /dev/kmsg \
(root) the alert carries the syscall number from that record.",
        ),
        (
            "LIMITS",
            "--no-tsc makes every rdtsc fault, and glibc's dynamic loader reads the TSC at \
start-up while the vDSO's clock_gettime reads it when the clocksource is tsc: under --no-tsc \
dynamically linked glibc programs and programs reading the clock through the vDSO die of \
SIGSEGV at once. Use it for static programs that take time through system calls.\n\n\
The syscall number of a kill comes from the kernel log, which the kernel rate-limits \
(10 lines per 5 s by default): under a burst of kills some alerts have no number.\n\n\
The ABI prelude (x32, foreign architectures, unknown new calls) is part of the first \
installed filter: --profile none with no other filter option installs nothing.",
        ),
        (
            "EXAMPLES",
            "sbx-seccomp -- make test\n\n\
sbx-seccomp --no-network --no-tsc -- python3 job.py\n\n\
sbx-seccomp --profile strict --allow mknod -- ./build.sh\n\n\
sbx-seccomp --allow-ptrace -- gdb ./prog\n\n\
sbx-seccomp --audit-log a.log --allow-exec /usr/bin/python3 --allow-exec /usr/bin/git -- python3 agent.py   (python3 may run git, nothing else)\n\n\
sbx-seccomp --action log -- ./agent   (audit mode: denied calls are allowed and logged)\n\n\
sbx-seccomp --print --no-network",
        ),
    ],
};

#[derive(Parser, Debug)]
#[command(
    name = "sbx-seccomp",
    version,
    about = "Run CMD under no_new_privs and a seccomp-BPF syscall filter"
)]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonArgs,

    /// The filter and the execute allowlist (the flags; sbx-spec).
    #[command(flatten)]
    pub spec: sbx_spec::SeccompSpec,

    /// Print the filter as a table and exit 0 (CMD is not needed).
    #[arg(long)]
    pub print: bool,

    /// The command to run under the filter.
    #[arg(last = true, required_unless_present = "print", value_name = "CMD")]
    pub cmd: Vec<OsString>,
}

impl Cli {
    pub fn options(&self) -> policy::Options {
        policy::Options {
            profile: self.spec.profile,
            policy: self.spec.policy.clone(),
            deny: self.spec.deny.clone(),
            allow: self.spec.allow.clone(),
            action: self.spec.action,
            no_network: self.spec.no_network,
            allow_ptrace: self.spec.allow_ptrace,
        }
    }
}

fn run(cli: Cli) -> Result<i32, Failure> {
    let opts = cli.options();
    for p in &cli.spec.allow_exec {
        if !p.is_absolute() {
            return Err(Failure::new(format!(
                "--allow-exec {}: must be an absolute path",
                p.display()
            )));
        }
    }
    if !cli.spec.allow_exec.is_empty() && !cli.print {
        landlock::abi()
            .map_err(|e| Failure::new(landlock::LandlockError::Unavailable(e).to_string()))?;
    }
    // Everything that can fail on bad input happens before anything is applied.
    let doc = policy::build(&opts)?;
    let progs = compile::programs(&doc, opts.builtins_pristine())?;
    let profile = policy::effective_profile(&opts);
    // Observable denials (see notify.rs): the default action, with an audit
    // log to write the alerts to, and a filter with EPERM answers.
    let audit_fd = sbx_core::audit::get().and_then(|a| a.raw_fd());
    // Also without an audit log: the notifier then writes the alerts to
    // the caller's stderr (docs/audit.md).
    let notify_filter = (opts.action.is_none() && doc.contains_key(notify::NOTIFY_FILTER))
        .then_some(notify::NOTIFY_FILTER);
    // Observable exec refusals (see execwatch.rs): with --allow-exec,
    // unless a filter denies execve itself. Also without an audit log: the
    // notifier refuses memfd execs, which Landlock lets through.
    // (Only with --allow-exec: finding the dynamic loaders lists the
    // library directories, thousands of entries.)
    let allowed_exec = if cli.spec.allow_exec.is_empty() {
        Vec::new()
    } else {
        landlock::allowlist(&cli.spec.allow_exec)
    };
    let exec_watch = !cli.spec.allow_exec.is_empty() && !execwatch::exec_denied_by(&doc);
    let intercept_memfd = exec_watch && !execwatch::memfd_denied_by(&doc);

    if cli.print {
        let header = format!(
            "sbx-seccomp filter for {}: profile {}{}, {} filter(s), {} BPF instructions",
            compile::ARCH_NAME,
            profile.name(),
            opts.policy
                .as_ref()
                .map(|p| format!(" + policy {}", p.display()))
                .unwrap_or_default(),
            progs.len(),
            progs.iter().map(|(_, p)| p.len()).sum::<usize>()
        );
        print!("{}", print::table(&doc, &header, opts.action.is_none()));
        if exec_watch {
            println!(
                "execve, execveat: notify(CONTINUE): the exec watch of --allow-exec (Landlock \
allows executing only: {})",
                allowed_exec
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        return Ok(0);
    }

    let env = sbx_core::chain::current_env();
    let path_var = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.clone());
    sbx_core::chain::resolve(&cli.cmd[0], path_var.as_deref())?;

    install::no_new_privs()?;
    let mut progs = match notify_filter {
        Some(nf) => notify::merge_deny(&doc, nf, progs)?,
        None => progs,
    };
    // The filter that gets the listener: the notify filter, else (exec
    // watch only) a small one of its own.
    let listener_filter = match (notify_filter, exec_watch) {
        (Some(nf), _) => Some(nf),
        (None, true) => {
            progs.push((
                execwatch::EXEC_FILTER.to_string(),
                execwatch::standalone(progs.is_empty(), intercept_memfd),
            ));
            Some(execwatch::EXEC_FILTER)
        }
        (None, false) => None,
    };
    let notifier = match listener_filter {
        Some(_) => {
            // Numbered by the notifier itself, after the fork: off the
            // command's path to its exec (a number per name is a compile
            // of a one-rule filter, a few milliseconds for a profile).
            let names: std::collections::BTreeSet<String> = doc
                .values()
                .flat_map(|f| f.rules.iter())
                .map(|r| r.syscall.clone())
                .collect();
            let watch = exec_watch.then(|| execwatch::ExecWatch::new(&allowed_exec));
            Some(
                notify::Notifier::spawn(names, audit_fd, watch)
                    .map_err(|e| Failure::new(compile::one_line(&e)))?,
            )
        }
        None => None,
    };
    // The execute allowlist: after the notifier is forked (it never
    // executes anything), before the filters (whose exec notifications
    // then only observe what Landlock decides).
    if !cli.spec.allow_exec.is_empty() {
        landlock::restrict_exec(&allowed_exec).map_err(|e| Failure::new(e.to_string()))?;
    }
    let mut notifier_pid = None;
    let mut exec_observed = false;
    match (notifier, listener_filter) {
        (Some(n), Some(lf)) => {
            let mut listener = None;
            for (name, prog) in &progs {
                if name == lf {
                    let mut p = prog.clone();
                    let denials = notify_filter.is_some() && notify::rewrite(&mut p);
                    if exec_watch && lf != execwatch::EXEC_FILTER {
                        execwatch::insert_block(&mut p, intercept_memfd);
                    }
                    // Signals and pidfds aimed at the notifier go to it.
                    notify::insert_guard(&mut p, &[n.pid, n.watcher]);
                    if denials || exec_watch {
                        match notify::install_with_listener(&p) {
                            Ok(fd) => {
                                listener = Some(fd);
                                exec_observed = exec_watch;
                                continue;
                            }
                            // A listener already in the stack (nested
                            // sbx-seccomp): plain EPERM, silent; exec
                            // refusals unobserved.
                            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                                tracing::warn!(
                                    "a seccomp listener is already installed: denials stay silent EPERM"
                                );
                                if lf == execwatch::EXEC_FILTER {
                                    continue;
                                }
                            }
                            Err(source) => {
                                return Err(Failure::new(compile::one_line(
                                    &install::InstallError::Seccomp {
                                        name: name.clone(),
                                        source,
                                    },
                                )));
                            }
                        }
                    }
                }
                install::filters(std::slice::from_ref(&(name.clone(), prog.clone())))?;
            }
            if let Some(fd) = listener {
                notifier_pid = Some(n.pid);
                n.pass(fd)
                    .map_err(|e| Failure::new(compile::one_line(&e)))?;
            }
        }
        _ => install::filters(&progs)?,
    }

    if !cli.spec.allow_exec.is_empty() {
        sbx_core::audit::emit(
            "exec_allowlist",
            Severity::Info,
            serde_json::json!({
                "allowed": allowed_exec.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
                "abi": landlock::abi().ok(),
                "observed": exec_observed,
            }),
        );
    }
    sbx_core::audit::emit(
        "seccomp_applied",
        Severity::Info,
        serde_json::json!({
            "profile": profile,
            "policy": opts.policy,
            "deny": opts.deny,
            "allow": opts.allow,
            "action": opts.action,
            "notify": notifier_pid.is_some(),
            "notifier_pid": notifier_pid,
            "no_network": opts.no_network,
            "no_tsc": cli.spec.no_tsc,
            "allow_ptrace": opts.allow_ptrace,
            "filters": progs.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            "allow_exec": cli.spec.allow_exec,
            "instructions": progs.iter().map(|(_, p)| p.len()).sum::<usize>(),
            "command": sbx_core::chain::show(&cli.cmd),
        }),
    );

    // run_main blocked the signals a supervisor forwards; CMD must not
    // inherit that mask (Ctrl-C and SIGTERM would not reach it).
    sbx_core::signals::unblock_all().map_err(|e| Failure::new(format!("sigprocmask: {e}")))?;
    // The TSC trap last, just before the exec: it is inherited by CMD, but
    // not by the notifier (forked earlier), and nothing here reads the
    // clock after it (a timestamp through the vDSO executes rdtsc, and an
    // audit line needs one: the in-memory log of a run without
    // --audit-log too).
    if cli.spec.no_tsc {
        install::no_tsc()?;
    }
    // Only 0, 1, 2 reach CMD (chain::exec hands the audit fd to a next
    // sbx tool, by identity).
    sbx_core::fds::cloexec_all_except(&[])
        .map_err(|e| Failure::new(format!("close-on-exec: {e}")))?;
    Err(sbx_core::chain::exec(&cli.cmd, &env))
}

pub fn main() -> ! {
    sbx_core::cli::run_main(TOOL, || {
        let cli: Cli = sbx_core::cli::parse(TOOL)?;
        sbx_core::cli::init(TOOL, &cli.common)?;
        run(cli)
    })
}
