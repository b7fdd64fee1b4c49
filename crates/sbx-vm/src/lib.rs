//! sbx-vm: runs a command in its own microVM, one VM per run.
//!
//! Modules: [`options`] validates the flags into a [`options::Plan`],
//! [`guestfiles`] finds and checks the kernel, initrd and squashfs root,
//! [`kvm`] decides whether KVM can boot a guest here, [`rundir`] owns the
//! per-run private directory and reaps stale ones, [`qemu`] and
//! [`firecracker`] start the VMM, [`session`] speaks to the guest init
//! (stdio, signals, copy-in/out, audit export, exit status), [`run`] ties
//! them together.

use std::ffi::OsString;

use clap::Parser;
use sbx_core::cli::CommonArgs;

mod creds;
pub mod firecracker;
mod guestfiles;
pub mod jailcg;
pub mod kvm;
mod limits;
mod options;
mod qemu;
mod run;
mod rundir;
mod session;

pub const TOOL: &str = "sbx-vm";

pub const MAN: sbx_core::man::ManInfo = sbx_core::man::ManInfo {
    about: "Runs CMD in its own microVM and destroys the VM afterwards. The guest boots its own kernel \
(the Debian cloud kernel built by scripts/build-guest) with a read-only squashfs root filesystem \
(busybox, the sbx tools, the guest init) under an overlay whose writable layer is a size-limited tmpfs \
that dies with the VM. The guest init runs CMD with stdin, stdout and stderr connected to sbx-vm's, passes \
its exit status through, puts secrets (--secrets-from, --secret-env, or fetched by sbx-vm itself from Vault/OpenBao \
with the sbx-creds options --vault-addr, --secret, --lease, --child-token, ...) into CMD's environment only, and before the VM is \
destroyed sends the guest's audit log to the host, where it is appended to sbx-vm's audit log (each line \
marked \"guest\": true). Backends: QEMU (qemu-system-x86_64 -M microvm, KVM when it can boot a guest, \
TCG otherwise) and Firecracker (driven through its API socket, under the jailer when run as root). \
One VM per run, nothing shared between runs: every VMM process, socket, jail directory and temporary file \
is removed when sbx-vm exits, also after SIGTERM, a timeout or a guest panic; after SIGKILL of sbx-vm the \
VMM dies with it (parent-death signal) and the next sbx-vm removes the stale run directory.",
    exit_status: "CMD's exit status, unchanged; 128+N when CMD was killed by signal N in the guest. \
124 when --timeout fired, or the session TTL (--ttl) of the sbx-creds options was reached (CMD and the VM were \
killed; the audit log was still exported when the guest answered). 125 when sbx-vm itself failed: bad usage (one line on stderr, nothing created), a missing or \
invalid kernel, initrd or root filesystem, no VMM binary, a failed login or fetch with the sbx-creds options \
(whatever had been created on the server revoked first), KVM unusable with --backend firecracker, --memory \
below what the guest needs, a guest that panicked or never reported back within --boot-timeout. \
126 when CMD was found in the guest but could not be executed, 127 when it was not found there.",
    inherited_state: "CMD runs as root in the guest (uid 0 of the guest kernel, not of the host), in /work when \
--copy-in was given, else in /. Its environment is only PATH, HOME=/root, TERM (from the caller), SBX_ID, \
the --setenv settings and the secrets; nothing else of the host's environment crosses. No fd of the host \
crosses: its stdin, stdout and stderr are pipes in the guest relayed through the control channel. It sees \
no host filesystem (only what --copy-in copied) and no network (--net none: the VM has no network device; \
--net sbx-net: QEMU user-mode networking inside sbx-net's namespace, so every connection and DNS query goes \
through sbx-net's allowlisting gateway; sbx-vm refuses it when not run under sbx-net). \
When CMD is an sbx tool (an sbx chain inside the guest) it receives the guest audit log's fd, which the \
guest init exports to the host at the end; a plain CMD gets no handle to any log or control channel.",
    environment: "- SBX_VM_GUEST_DIR: where the guest kernel and root file system are looked for (scripts/build-guest makes them).\n- VAULT_TOKEN, BAO_TOKEN: read for the sbx-creds options, never passed to the guest.\n- TERM: passed to CMD in the guest.",
    extra: &[
        (
            "BACKENDS",
            "--backend auto (the default) takes Firecracker when its binary is found (--firecracker, else \
firecracker on PATH, else /opt/sbx-firecracker/bin/firecracker) and KVM can boot a guest, else QEMU; the choice \
and the reason are logged (vm_backend_selected). KVM counts as usable when /dev/kvm opens read-write and the \
hypervisor module is kvm_intel or kvm_amd; kvm_pvm (a software hypervisor that starts VMMs but boots no Linux \
guest) and a missing /dev/kvm count as unusable.\n\n\
--backend qemu runs qemu-system-x86_64 -M microvm (or --qemu PATH) with -accel kvm when KVM is usable, else \
-accel tcg (--accel overrides), no default devices, no network, -no-reboot, the root disk read-only, and QEMU's \
own seccomp sandbox. The control channel is a virtio-serial port named sbx.0 whose host side is a Unix socket \
in the private run directory; the kernel console goes to a file there (used in error messages). Secrets go \
through fw_cfg (opt/sbx/secrets, from a 0600 file in the run directory, deleted once the guest has read it); \
the guest init unloads the fw_cfg driver after reading, so no file in the guest shows them.\n\n\
--backend firecracker drives the Firecracker binary through its API socket: PUT /machine-config \
(vcpus, memory), /boot-source (vmlinux, initrd, kernel command line), /drives/rootfs (read-only), /vsock (the \
control channel: the guest connects to host CID 2 port 1024, Firecracker forwards it to a Unix socket), \
/mmds/config (V2, on the network interface eth0, whose host side is a tap device only when one is needed) and \
/mmds (the secrets under sbx.secrets), then /actions InstanceStart. As root it runs under the jailer \
(--jailer, chroot under --jail-base, uid/gid --jail-uid/--jail-gid, Firecracker's seccomp filters on, \
cgroup settings from --jail-cgroup in a group nested under sbx-vm's own cgroup); \
jail directories and the tap device are removed at the end. Firecracker loses the parent-death signal with the \
jailer's uid drop, so a reaper process forked by sbx-vm kills it and removes the jail when sbx-vm dies without \
doing so (SIGKILL); stale jails left when both are killed are reaped at the next start. \
It refuses to start when KVM cannot boot a guest, unless --no-kvm-check is given (which tests the \
configuration path on such hosts; the guest then never reports back).",
        ),
        (
            "WORK DIRECTORY",
            "Nothing of the host filesystem is shared with the guest. --copy-in DIR sends DIR as a tar archive \
(tar -c on the host, busybox tar -x in the guest) into /work, which lives in the tmpfs layer, before CMD starts. \
--copy-out DIR receives /work back as a tar archive after CMD exited and extracts it into DIR, which must be \
empty or not exist; owners are not restored and GNU tar's protections against absolute names, .. and \
symlinks pointing out apply. A run that fails or times out writes nothing to DIR beyond what arrived. \
The --copy-in tree is checked before the VM starts, from its metadata (symlinks are not followed, FIFOs and \
devices are entries that are never read): its file data must fit in the guest's tmpfs (--tmpfs, and the guest's \
memory), its entries in the tmpfs' inodes (about one per 8 KiB of --memory), every file must be readable and \
no path longer than 4095 bytes; otherwise it is refused (125, one line naming the file or the limit) without a boot, \
and the archive sent is cut off at what was checked should the tree grow meanwhile.",
        ),
        (
            "SECRETS",
            "--secrets-from FILE takes a JSON document {\"env\": {\"NAME\": \"value\", ...}} (the document the \
sbx-creds library yields, Session::to_json; other keys are ignored). --secret-env NAME takes NAME's value from \
sbx-vm's own environment, for sbx-creds ... -- sbx-vm --secret-env NAME -- CMD (sbx-creds renews and revokes \
around the VM); the VMM itself gets an empty environment. The values reach CMD's environment only: \
on QEMU through fw_cfg (unloaded after reading), on Firecracker through MMDS v2 (read by the guest init with a \
session token, after which the guest's network interface is taken down). The audit log records the names, \
never the values. --setenv K=V sets plain settings. What the guest cannot put into CMD's environment is refused \
before the VM starts (125, one line naming the file and the variable, never the value): a value with a NUL byte, \
a NAME=VALUE over 128 KiB, or secrets that with CMD and --setenv pass the guest kernel's 2 MiB limit for \
execve; secrets fetched with the sbx-creds options are checked after the fetch, and revoked when refused.\n\n\
The sbx-creds options (--vault-addr, --ca-cert, --namespace, --auth, --token-file, --role-id-file, --secret-id-file, \
--secret-id-wrapped, --approle-mount, --kubernetes-role, --kubernetes-token-file, --kubernetes-mount, --secret, --secret-all, --kv1, --lease, --child-token, --policy, --child-orphan, \
--child-ttl, --child-num-uses, --ttl, --no-enforce-ttl; sbx-creds' own flag definitions, see sbx-creds(1)) make \
sbx-vm fetch the secrets itself through the sbx-creds library: VAULT_TOKEN leaves sbx-vm's environment at start-up \
and sbx-vm becomes non-dumpable; every spec is checked before anything is created; the session logs in and \
fetches before the VM is started (a failure revokes what was created: one line, 125, no VM); its document \
(Session::to_json, merged with --secrets-from and --secret-env; a name given twice is an error) is delivered as \
above; leases and the login token are renewed while the VM runs; CMD and the VM are stopped at the session TTL \
(exit 124, event ttl_expired) unless --no-enforce-ttl; and when the run ends (CMD exited, --timeout, the TTL, \
a forwarded signal, a failure) every lease and token created for the session is revoked before sbx-vm exits. \
After SIGKILL of sbx-vm, the TTL bounds them. --vault-timeout is sbx-creds' --timeout (each request to the \
server). The audit events are sbx-creds' own (login, secret_injected once the guest has read the secrets, \
renewed, revoked, revocation_failed as an alert, ttl_capped, ttl_reached, ...), never with a value or a token.",
        ),
        (
            "GUEST FILES",
            "--kernel, --initrd, --rootfs name the guest files; by default they are vmlinuz (QEMU) or vmlinux \
(Firecracker), initrd.img and rootfs.squashfs in $SBX_VM_GUEST_DIR, else /usr/local/share/sbx/guest, where \
scripts/build-guest puts them. The root filesystem must be a squashfs image (checked by its magic).",
        ),
    ],
};

pub use sbx_spec::vm::{Accel, Backend, Net};

/// sbx-vm's flags.
#[derive(Parser, Debug)]
#[command(
    name = "sbx-vm",
    version,
    about = "Run a command in its own microVM (Firecracker or QEMU microvm), read-only root, tmpfs writable layer, destroyed afterwards"
)]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonArgs,

    /// The microVM (sbx-spec's VmSpec: one definition for these flags,
    /// `--config` and sbx-policy's chain).
    #[command(flatten)]
    pub spec: sbx_spec::VmSpec,

    /// The sbx-creds options (--vault-addr, --token-file, --secret,
    /// --secret-all, --lease, --child-token, --ttl, ...): sbx-vm fetches
    /// the secrets itself before boot, renews them while the VM runs and
    /// revokes them all when it ends.
    #[command(flatten)]
    pub creds: sbx_creds::Args,

    /// The command to run in the guest.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<OsString>,
}

pub fn main() -> ! {
    sbx_core::cli::run_main(TOOL, || {
        let cli: Cli = sbx_core::cli::parse(TOOL)?;
        // With the sbx-creds options, VAULT_TOKEN leaves the environment
        // (and /proc/PID/environ) before any thread exists, and sbx-vm
        // becomes non-dumpable, as sbx-creds does.
        let env_token = if creds::wanted(&cli.creds) {
            sbx_creds::take_env_token()
        } else {
            None
        };
        let plan = options::plan(&cli, env_token)?;
        sbx_core::cli::init(TOOL, &cli.common)?;
        run::run(plan)
    })
}
