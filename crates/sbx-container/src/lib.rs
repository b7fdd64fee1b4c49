//! sbx-container: runs a command in one container per run over the Docker
//! Engine API (Docker Engine, or Podman's compatible socket), built FROM
//! scratch, with a read-only root, read-only (or deny-listed writable)
//! volume mounts, no network or an internal one the host is blocked from,
//! CPU/memory/pids limits, no capabilities, no-new-privileges, a non-root
//! user, and a clean-up that always runs.
//!
//! Modules: [`spec`] validates the options, [`mounts`] turns binds into
//! engine mounts with sbx-fs's deny list and invariants, [`engine`] connects
//! and checks the API version, [`image`] builds the sandbox image,
//! [`owner`] labels what is created and judges stale objects, [`netguard`]
//! makes `--net internal` unable to reach the host, [`sbxnet`] joins
//! sbx-net's namespace for `--net sbx`, [`run`] ties them
//! together.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use sbx_core::Failure;
use sbx_core::cli::CommonArgs;

mod creds;
mod engine;
mod hide;
mod image;
mod mounts;
mod netguard;
mod owner;
mod run;
mod sbxnet;
mod seccomp;
mod spec;

pub const TOOL: &str = "sbx-container";

pub const MAN: sbx_core::man::ManInfo = sbx_core::man::ManInfo {
    about: "Runs CMD in a container of its own, created over the Docker Engine API (Docker Engine, or Podman's \
Docker-compatible service), and removes it whatever happens. The container is made from the sandbox image \
(`sbx-container build`: FROM scratch, the sbx tools built static, busybox, CA certificates) or --image, with: a read-only \
root filesystem; the --ro and --rw binds only, where sbx-fs's deny list hides secrets (.env, .env.*, ~/.ssh, ...) and its \
invariants keep .git/HEAD, .git/config, .git/hooks, .git/objects, .git/refs and .claude read-only inside writable binds; \
a size-limited tmpfs on /tmp; memory (default 512 MiB, no swap), CPU (default 1) and process (default 512) limits; every \
capability dropped, no-new-privileges, the engine's default seccomp profile (or sbx-seccomp's default profile with \
--seccomp sbx); a non-root user (65534:65534); no network \
(--net none, the default), an internal network from which the host is blocked too (--net internal), or, under sbx-net, \
sbx-net's own namespace, where its allowlisting gateway decides every connection (--net sbx). stdin, stdout and \
stderr are attached; the exit status is the command's.",
    exit_status: "The command's exit status, unchanged; 128+N when it was killed by signal N, 137 after an OOM kill \
(whether or not the engine sets OOMKilled). 124 when --timeout fired (the container was killed). 125 when sbx-container \
itself failed: bad usage, an unreachable engine, an Engine API older than 1.41, a missing image, a mount source that does \
not exist, a limit that does not parse (one line on stderr, nothing created on the engine). 126/127 as reported by the \
engine's runtime for a command that cannot be executed or is not found.",
    inherited_state: "Nothing of the caller's process reaches the container but what is named: the binds, the variables \
given with --setenv and --secret-env, and stdio. The environment starts from PATH, HOME=/tmp and SBX_ID. The container runs \
as 65534:65534 (--user) in the image's root, read-only. The audit log stays with sbx-container: the container never \
holds it nor the engine's socket.",
    environment: "- DOCKER_HOST: the engine's address (unix:// only) when --engine is not given; else unix:///var/run/docker.sock.\n- VAULT_TOKEN: the token for --creds-config.",
    extra: &[
        (
            "LIFECYCLE",
            "One container per run, named sbx-<SBX_ID>-<pid>, labelled io.sbx.id (SBX_ID), io.sbx.owner.pid, \
io.sbx.owner.start (the owner's start time in clock ticks since boot), io.sbx.owner.boot (the boot id) and \
io.sbx.owner.host (the machine id). After the command exits, after SIGINT, SIGTERM, SIGHUP or SIGQUIT (forwarded to the \
container; SIGKILL after --kill-grace, default 5s), after --timeout, and when the sbx tool supervising sbx-container dies (SBX_SUPERVISOR), the container is removed with its anonymous \
volumes, and the network and firewall table it created are removed too. If sbx-container itself is killed (SIGKILL), \
the next sbx-container run against the same engine from the same machine removes every sbx-container object whose \
owner no longer runs (the pid with that start time, in this boot): stale_container_reaped, stale_network_reaped.",
        ),
        (
            "NETWORK",
            "--net none (default): no network interface but loopback. --net internal: a network of its own created \
Internal (no route out); since the host stays reachable at the bridge's gateway address on an internal network, \
sbx-container adds an nftables table (inet sbx_ctr_<name>) that drops every packet from that network's subnets in the \
input and forward hooks, for the life of the run; packets it dropped are reported as host_access_blocked (alert). \
This needs root and a local engine (unix socket); otherwise --net internal is refused (exit 125). --net sbx: run \
under sbx-net (sbx-net --allow NAME ... -- sbx-container --net sbx ... -- CMD), the container joins the network \
namespace sbx-container is in (the engine is given ns:/proc/<pid>/ns/net), so each of its connections and DNS queries \
goes through sbx-net's gateway: its allowlist, DNS proxy and alerts (net_denied, dns_refused) apply as to any command \
sbx-net runs. Refused (exit 125, nothing created) when sbx-container is not inside sbx-net's namespace (only lo, holding \
10.254.0.1, the default route on lo), is in a PID namespace of its own, or talks to a non-local engine (not a unix \
socket), and on Docker Engine, which can join another network namespace only as container:ID (--net sbx needs \
Podman). Before CMD runs, the runtime container is made (Podman's init) and its waiting process checked to be in \
that namespace (netns_joined); if it is not, the container is removed before CMD runs (netns_mismatch, alert) and \
the run fails with 125.",
        ),
        (
            "SECRETS",
            "--secret-env NAME passes the variable NAME of sbx-container's own environment (as put there by sbx-creds \
in a chain: sbx-creds ... -- sbx-container --secret-env DB_PASSWORD -- CMD) to the command only: the container is \
created with a process that only waits, and CMD runs as an exec whose environment is given at exec time. The value is \
never in the container's configuration, labels, image or a file, so `inspect` of the container does not show it. \
--creds-config FILE does the same with secrets fetched by the sbx-creds library: FILE holds an \"sbx-creds\" section \
(sbx-creds' flags as keys: vault-addr, secret, secret-all, lease, auth, ...); VAULT_TOKEN is taken out of the \
environment at start-up, leases are renewed while the command runs and everything is revoked at the end.",
        ),
        (
            "IMAGE",
            "sbx-container build --tools DIR assembles a reproducible context (entries sorted, owner 0:0, mtime 0): the \
Containerfile (FROM scratch), the static sbx-* executables of DIR (built with RUSTFLAGS='-C target-feature=+crt-static' \
cargo build --release --target x86_64-unknown-linux-gnu --target-dir target/static), busybox-static with its applet \
links, the CA certificates, passwd and group; builds it over the API as sbx-sandbox:<first 16 hex digits of the \
context's SHA-256>, tags it sbx-sandbox:latest, and prints the tag and size. Over 50 MB is an error. Runs use \
sbx-sandbox:latest unless --image names another; a missing image is an error (nothing is ever pulled).",
        ),
        (
            "LIMITATIONS",
            "sbx-fs also keeps a protected name from being created when it does not exist yet (a placeholder); an \
engine would create that mount point in the host directory, so sbx-container protects existing entries only. Hidden \
files are covered by an empty host file of mode 000 (in <tmp>/sbx-container-<name>/, removed at clean-up), bound \
read-only; hidden directories by an empty read-only tmpfs of mode 000. Without --init the command is PID 1 and, as \
in any container, ignores forwarded signals it has no handler for (SIGKILL follows after --kill-grace). --net sbx works with \
Podman only, and only when sbx-container is in the initial PID namespace (no tool that makes a PID namespace, such as \
sbx-fs, may come before it in the chain). With --seccomp sbx, Podman needs the \
profile as a file on its host: it is written to <tmp>/sbx-container-<name>/seccomp.json for the run. The memory limit covers the container's cgroup, \
with swap equal to it.",
        ),
    ],
};

#[derive(Subcommand, Debug)]
pub enum Sub {
    /// Build the sandbox image (FROM scratch) on the engine and print its tag and size.
    Build(BuildArgs),
}

#[derive(clap::Args, Debug)]
pub struct BuildArgs {
    /// Directory with the static sbx-* executables to put in /sbx/bin.
    #[arg(long, value_name = "DIR")]
    pub tools: PathBuf,
    /// A static busybox (Debian's busybox-static).
    #[arg(long, value_name = "PATH", default_value = "/bin/busybox")]
    pub busybox: PathBuf,
    /// The CA certificate bundle.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/etc/ssl/certs/ca-certificates.crt"
    )]
    pub ca_certs: PathBuf,
    /// Engine address: unix:///PATH or tcp://HOST:PORT (default: DOCKER_HOST, else unix:///var/run/docker.sock).
    #[arg(long, value_name = "URL")]
    pub engine: Option<String>,
}

/// sbx-container's flags.
#[derive(Parser, Debug)]
#[command(
    name = "sbx-container",
    version,
    about = "Run a command in one locked-down container per run over the Docker Engine API; always cleaned up",
    subcommand_negates_reqs = true,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonArgs,

    #[command(subcommand)]
    pub sub: Option<Sub>,

    /// The container (sbx-spec's ContainerSpec: one definition for these
    /// flags, `--config` and sbx-policy's chain).
    #[command(flatten)]
    pub spec: sbx_spec::ContainerSpec,

    /// The command to run.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<OsString>,
}

fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(format!("tokio runtime: {e}")))
}

fn build(b: &BuildArgs) -> Result<i32, Failure> {
    let url = engine::address(b.engine.as_deref());
    engine::check_address(&url)?;
    let inputs = image::Inputs {
        tools: b.tools.clone(),
        busybox: b.busybox.clone(),
        ca_certs: b.ca_certs.clone(),
    };
    // Inputs are read (and checked) before the engine is contacted.
    image::context(&inputs)?;
    let rt = runtime()?;
    rt.block_on(async {
        let eng = engine::connect(&url).await?;
        let (tag, size) = image::build(&eng.docker, &inputs).await?;
        sbx_core::audit::emit(
            "image_build",
            sbx_core::Severity::Info,
            serde_json::json!({"image": tag, "size": size, "engine": eng.kind}),
        );
        println!("{tag} {size}");
        Ok(0)
    })
}

fn run_cmd(cli: &Cli) -> Result<i32, Failure> {
    let url = engine::address(cli.spec.engine.as_deref());
    engine::check_address(&url)?;
    let mut spec = spec::from_cli(cli, &cli.cmd)?;
    if spec.net == spec::Net::Internal {
        netguard::check_possible(&url)?;
    }
    let netns = if spec.net == spec::Net::Sbx {
        Some(sbxnet::check_possible(&url)?)
    } else {
        None
    };
    let creds_req = match &cli.spec.creds_config {
        Some(p) => Some(creds::request(p)?),
        None => None,
    };
    // Before any thread exists: the token leaves our environment.
    let token = if creds_req.is_some() {
        sbx_creds::take_env_token()
    } else {
        None
    };
    let rt = runtime()?;
    rt.block_on(async {
        let eng = engine::connect(&url).await?;
        if netns.is_some() {
            sbxnet::check_engine(&eng.kind)?;
        }
        let me = owner::Owner::me();
        if let Err(e) = run::reap(&eng.docker, &me).await {
            // In the log, not only on stderr: a dead run's objects stay.
            sbx_core::audit::emit(
                "stale_reap_failed",
                sbx_core::Severity::Warn,
                serde_json::json!({ "error": e.to_string() }),
            );
        }
        // Run directories of dead runs that never got their container.
        for d in hide::reap_registered() {
            sbx_core::audit::emit(
                "stale_hide_dir_removed",
                sbx_core::Severity::Warn,
                serde_json::json!({ "dir": d }),
            );
        }
        image::ensure(&eng.docker, &spec.image).await?;
        let creds = match &creds_req {
            Some(req) => {
                let c = creds::open(req, token).await?;
                spec.secret_env.extend(c.env());
                Some(c)
            }
            None => None,
        };
        let mut created = run::Created::default();
        let r = run::run(&eng.docker, &eng.kind, &spec, netns.as_ref(), &mut created).await;
        run::cleanup(&eng.docker, &mut created).await;
        for (_, v) in spec.secret_env.iter_mut() {
            // Overwrite the copies this process made.
            // SAFETY: all-zero bytes are valid UTF-8 (NUL characters), so
            // the String stays valid.
            unsafe { v.as_bytes_mut().fill(0) };
        }
        if let Some(c) = creds {
            c.close().await;
        }
        Ok(r?)
    })
}

pub fn main() -> ! {
    sbx_core::cli::run_main(TOOL, || {
        let cli: Cli = sbx_core::cli::parse(TOOL)?;
        sbx_core::cli::init(TOOL, &cli.common)?;
        match &cli.sub {
            Some(Sub::Build(b)) => build(b),
            None => run_cmd(&cli),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn clap_definition_is_valid() {
        Cli::command().debug_assert();
    }

    #[test]
    fn build_subcommand_and_run_form_parse() {
        let b: Cli = sbx_core::cli::parse_from(
            TOOL,
            ["x", "build", "--tools", "/t"].map(OsString::from).to_vec(),
        )
        .unwrap();
        assert!(matches!(b.sub, Some(Sub::Build(ref a)) if a.tools == std::path::Path::new("/t")));
        let r: Cli = sbx_core::cli::parse_from(
            TOOL,
            ["x", "--memory", "1G", "--ro", "/a:/b", "--", "build", "--x"]
                .map(OsString::from)
                .to_vec(),
        )
        .unwrap();
        assert!(r.sub.is_none());
        assert_eq!(r.cmd, ["build", "--x"].map(OsString::from).to_vec());
        let e = sbx_core::cli::parse_from::<Cli>(
            TOOL,
            ["x", "--memory", "1G"].map(OsString::from).to_vec(),
        )
        .unwrap_err();
        assert_eq!(e.code, 125);
    }
}
