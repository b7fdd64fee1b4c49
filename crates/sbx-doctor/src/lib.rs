//! sbx-doctor: checks what this machine lets the sbx tools do (user
//! namespaces, cgroups, Landlock, seccomp, nftables, the VMMs, a container
//! engine, Vault/OpenBao) and prints a one-line fix for every gap.

mod checks;

use clap::{Parser, ValueEnum};
use sbx_core::cli::CommonArgs;
use serde_json::json;

pub use checks::{Finding, Status, Sys};

pub const TOOL: &str = "sbx-doctor";

pub const MAN: sbx_core::man::ManInfo = sbx_core::man::ManInfo {
    about: "sbx-doctor checks what this machine lets the sbx tools do, for the user who runs it, and prints one line per check: ok, warn (a feature is reduced or an optional backend is missing), FAIL (a core layer cannot work) or skip (not configured), each warn and FAIL followed by a one-line fix. The checks: userns (unprivileged user namespaces: kernel.unprivileged_userns_clone, user.max_user_namespaces, Ubuntu's kernel.apparmor_restrict_unprivileged_userns, and a real user namespace created in a child), fuse (/dev/fuse opens and a FUSE mount works in a throwaway namespace: sbx-fs's guard file system), cgroup (v1, v2 or hybrid, and whether this user may create groups below its own: delegation), landlock (landlock_create_ruleset with LANDLOCK_CREATE_RULESET_VERSION: the ABI), seccomp (filter mode and user notification, from /proc/sys/kernel/seccomp/actions_avail and SECCOMP_GET_ACTION_AVAIL), nftables (the nft binary adds a table in a throwaway network namespace: the kernel's nf_tables, which sbx-net programs over netlink), runsc, qemu, kvm (/dev/kvm opened, KVM_GET_API_VERSION, and kvm_intel or kvm_amd loaded: kvm_pvm boots no Linux guest), firecracker, engine (the Docker or Podman API socket answers /_ping), vault (when VAULT_ADDR or BAO_ADDR is set: /v1/sys/health answers). As root, what blocks only unprivileged users is a warn. Errors of the other tools that stem from one of these conditions name the check (`sbx-doctor --check userns`).",
    exit_status: "0 no check failed (warn and skip do not count), 1 at least one check failed, 125 bad usage (an unknown --check name, a bad flag).",
    inherited_state: "sbx-doctor runs no command. Its probes run in short-lived children (a user namespace, a network namespace with one nftables table) that end before it prints.",
    environment: "- VAULT_ADDR, BAO_ADDR: when set, the Vault/OpenBao check probes it.\n- DOCKER_HOST, XDG_RUNTIME_DIR: where the engine check looks for a socket.\n- SBX_DOCTOR_ROOT: a directory that stands in for / (/proc, /sys, /dev, /etc), for tests that fake a condition the machine cannot produce.",
    extra: &[
        (
            "OUTPUT",
            "One line per check: STATUS NAME SUMMARY, then `fix: ...` under a warn or a FAIL, then a count. --json prints one object instead: ok (no check failed), uid, checks (a list of objects with id, status, summary, fix).",
        ),
        (
            "ENVIRONMENT",
            "VAULT_ADDR, BAO_ADDR: the Vault or OpenBao server to try (BAO_ADDR wins). DOCKER_HOST: the engine socket (unix:///PATH), else /var/run/docker.sock, $XDG_RUNTIME_DIR/podman/podman.sock, /run/podman/podman.sock. PATH: where runsc, qemu-system-*, firecracker and nft are looked for (and /opt/sbx-firecracker/bin).\n\nSBX_DOCTOR_ROOT: for tests only. A directory prefixed to every file the checks read (/proc/sys/..., /proc/self/mountinfo, /proc/self/cgroup, /sys/fs/cgroup/..., /sys/module/..., /dev/fuse, /dev/kvm), so a test can fake a blocked condition; the live probes (namespaces, syscalls, sockets) are not redirected. The output says when it is set.",
        ),
        (
            "SEE ALSO",
            "sbx-fs(1), sbx-net(1), sbx-cgroup(1), sbx-seccomp(1), sbx-vm(1), sbx-container(1), sbx-gvisor(1), sbx-creds(1)",
        ),
    ],
};

/// The checks, by the name `--check` takes.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckId {
    Userns,
    Fuse,
    Cgroup,
    Landlock,
    Seccomp,
    Nftables,
    Runsc,
    Qemu,
    Kvm,
    Firecracker,
    Engine,
    Vault,
}

impl CheckId {
    pub const ALL: [CheckId; 12] = [
        CheckId::Userns,
        CheckId::Fuse,
        CheckId::Cgroup,
        CheckId::Landlock,
        CheckId::Seccomp,
        CheckId::Nftables,
        CheckId::Runsc,
        CheckId::Qemu,
        CheckId::Kvm,
        CheckId::Firecracker,
        CheckId::Engine,
        CheckId::Vault,
    ];
}

#[derive(Parser, Debug)]
#[command(
    name = "sbx-doctor",
    version,
    about = "Check what this machine lets sbx do; print a one-line fix for each gap"
)]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Run only this check (repeatable; default: all).
    #[arg(long = "check", value_enum, value_name = "NAME")]
    pub checks: Vec<CheckId>,
    /// One JSON object on stdout instead of lines.
    #[arg(long)]
    pub json: bool,
}

/// Runs the checks named (all when empty) against `sys`.
pub fn run(sys: &Sys, which: &[CheckId]) -> Vec<Finding> {
    let which: &[CheckId] = if which.is_empty() {
        &CheckId::ALL
    } else {
        which
    };
    let mut out = Vec::new();
    for id in CheckId::ALL {
        if which.contains(&id) {
            out.push(checks::run_one(sys, id));
        }
    }
    out
}

/// Whether any check failed (warn and skip do not count).
pub fn any_failed(f: &[Finding]) -> bool {
    f.iter().any(|x| x.status == Status::Fail)
}

/// The report for people.
pub fn render_text(sys: &Sys, f: &[Finding]) -> String {
    let mut s = String::new();
    if let Some(r) = sys.fake_root() {
        s.push_str(&format!(
            "note: SBX_DOCTOR_ROOT={} (test seam): files are read below it\n",
            r.display()
        ));
    }
    for x in f {
        s.push_str(&format!(
            "{:<4}  {:<11}  {}\n",
            x.status.label(),
            x.id,
            x.summary
        ));
        if let Some(fix) = &x.fix {
            s.push_str(&format!("{:<4}  {:<11}  fix: {fix}\n", "", ""));
        }
    }
    let count = |st: Status| f.iter().filter(|x| x.status == st).count();
    s.push_str(&format!(
        "{} ok, {} warn, {} failed, {} skipped\n",
        count(Status::Ok),
        count(Status::Warn),
        count(Status::Fail),
        count(Status::Skip)
    ));
    s
}

/// The report as one JSON object.
pub fn render_json(sys: &Sys, f: &[Finding]) -> serde_json::Value {
    json!({
        "tool": TOOL,
        "ok": !any_failed(f),
        "uid": sys.euid(),
        "fake_root": sys.fake_root(),
        "checks": f.iter().map(|x| json!({
            "id": x.id,
            "status": x.status.label().to_ascii_lowercase(),
            "summary": x.summary,
            "fix": x.fix,
        })).collect::<Vec<_>>(),
    })
}

pub fn main() -> ! {
    sbx_core::cli::run_main(TOOL, || {
        let cli: Cli = sbx_core::cli::parse(TOOL)?;
        sbx_core::cli::init(TOOL, &cli.common)?;
        let sys = Sys::from_env();
        let found = run(&sys, &cli.checks);
        if let Some(a) = sbx_core::audit::get() {
            let failed: Vec<&str> = found
                .iter()
                .filter(|x| x.status == Status::Fail)
                .map(|x| x.id)
                .collect();
            a.record(
                "doctor_report",
                if failed.is_empty() {
                    sbx_core::Severity::Info
                } else {
                    sbx_core::Severity::Warn
                },
                json!({ "failed": failed, "checks": found.len() }),
            );
        }
        let text = if cli.json {
            format!("{}\n", render_json(&sys, &found))
        } else {
            render_text(&sys, &found)
        };
        sbx_core::cli::write_stdout(text.as_bytes())?;
        Ok(if any_failed(&found) { 1 } else { 0 })
    })
}
