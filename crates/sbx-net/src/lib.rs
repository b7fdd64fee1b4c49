//! sbx-net: runs a command in a new network namespace whose only way out is
//! an allowlisting egress gateway in the supervisor.
//!
//! Inside there is only `lo` (with an extra address and the default routes
//! on it); nftables rules redirect every TCP connection and every DNS packet
//! to sockets created inside and handed to the supervisor; everything else
//! is dropped. The supervisor, in the host namespace, decides each
//! connection from its original destination, connects out itself and
//! splices. See docs/net.md.

/// The allowlist is the sbx-allow crate (sbx-wasm matches with it too).
pub use sbx_allow as allow;
mod dns;
mod gateway;
mod http;
mod mitm;
mod netlink;
mod netns;
mod nfnl;
pub mod nft;
mod phantom;
mod relay;
mod sniff;
mod synq;

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use serde_json::json;

use sbx_core::Failure;
use sbx_core::Severity;
use sbx_core::audit;
use sbx_core::cli::CommonArgs;
use sbx_core::supervise::Supervisor;

use crate::allow::Policy;
use crate::gateway::{AlertBudget, Gateway, Stats};

pub const TOOL: &str = "sbx-net";

pub const MAN: sbx_core::man::ManInfo = sbx_core::man::ManInfo {
    about: "Run a command with default-deny network egress: a new network namespace whose only way out is an \
allowlisting gateway (domains and IP:port) and an allowlisting DNS proxy; nothing can connect in.",
    exit_status: "The command's exit status; 128+N when it was killed by signal N. 125 when sbx-net itself \
failed (bad allowlist entry, unreadable --allow-file, namespace or nf_tables set-up refused); 126 when \
CMD is not executable; 127 when it is not found.",
    inherited_state: "The command gets a new network namespace (and, when sbx-net runs without \
CAP_SYS_ADMIN, a new user namespace mapping the caller's uid and gid to themselves, so the command runs \
as itself without capabilities). Inside there is only lo, holding 127.0.0.1, ::1, 10.254.0.1 and \
fd5b:5b5b:5b5b::1, with the default routes on it, and an nftables table sbx_net that redirects TCP and \
DNS to the gateway and drops all else. Environment, cwd, rlimits and fds 0-2 pass through; other fds are \
closed; the audit log fd is handed on only to a next sbx tool. /etc/resolv.conf is not changed: DNS to \
any server address is answered by the gateway.",
    environment: "- SBX_NET_RELAY: threads or async forces one engine for the TCP relay (default: both, chosen per connection).",
    extra: &[
        (
            "ALLOWLIST",
            "--allow NAME[:PORTS] allows an exact DNS name, or *.example.com for every name under \
example.com (not the apex). --allow-cidr CIDR[:PORTS] allows addresses (10.0.0.0/8:443, 192.0.2.7:22, \
[2001:db8::]/32:443). PORTS is 443, 80,443, 8000-8100 or a mix; without PORTS an entry gets 80 and 443. \
--allow-file FILE holds one entry per line as --allow takes them (names or addresses), # comments. A \
connection is allowed when its original destination is in an allowed CIDR on an allowed port, or when \
the DNS proxy answered that address for an allowed name (within the answer's TTL plus a grace period) \
and the port is one of that name's. The host's loopback is never reachable.",
        ),
        (
            "DNS",
            "Every DNS packet (UDP or TCP port 53, to any server address, loopback resolvers such as \
127.0.0.53 included) is answered by the sbx-dnsproxy library in the supervisor, whatever \
/etc/resolv.conf says. Only allowlisted names are forwarded to the upstream (--dns-upstream, default \
the nameservers of the host's /etc/resolv.conf); others are REFUSED (NXDOMAIN with --dns-nxdomain) \
without any packet leaving. Only A, AAAA, CNAME, HTTPS and SVCB are answered; long or high-entropy \
labels and floods of distinct subdomains (tunnelling) are refused; answers that point a name at a \
loopback, private, link-local or host address are dropped unless the name is under a \
--dns-rebind-allow DOMAIN.",
        ),
        (
            "SNI CHECK",
            "With --sni-check, a connection allowed through a name must say which host it wants: the \
TLS ClientHello's server name, or the Host header of a plain HTTP/1 request, must be an allowed name \
for that port that the DNS proxy answered with the destination address. Otherwise (another name, no \
SNI, another protocol) the connection is denied. Connections allowed by --allow-cidr are not checked.",
        ),
        (
            "AUDIT",
            "net_start (info) lists the allowlist. Every denied connection is an alert net_denied with \
dst, port, reason and the names the address was resolved from (alerts beyond a burst of 50 and 20 a \
second are counted, not written). net_allowed (info) per allowed connection. net_end (info) carries \
connections_allowed, connections_denied, connections_failed, bytes_out, bytes_in and DNS counters.",
        ),
        (
            "PHANTOM CREDENTIALS",
            "--secret NAME@HOST[,HOST...] declares a credential and the hosts it may go to. Its value is \
read at start from sbx-net's own environment variable NAME (which is then overwritten in sbx-net's \
memory, so /proc/PID/environ no longer shows it), or from a file (NAME@HOST=file:PATH, a regular file) \
or an inherited file descriptor (NAME@HOST=fd:N, a regular file or a pipe whose writer closes it within \
10s; the fd is closed and never reaches the command); one trailing newline of a file or fd is dropped. \
Refused with exit 125: an empty value, more than 16384 bytes, control characters, a FIFO path, a NAME \
that is not a variable name, a HOST that is not an exact DNS name. Inside, NAME holds a placeholder: \
sbx-phantom- followed by random letters and digits, as long as the value (at least 36 characters), new \
for every run. Each HOST is allowed on port 443 (as --allow HOST:443). For connections to those hosts \
(TLS whose server name is the host, to an address the DNS proxy answered for it) the gateway ends the \
TLS itself with a certificate of a certificate authority made at start in sbx-net's memory (its key \
is never written anywhere; name-constrained to the declared hosts), speaks HTTP/1.1 or HTTP/2 (ALPN) \
to the command and to the real server, whose certificate it verifies against the host's trust store \
(sbx-net's own SSL_CERT_FILE/SSL_CERT_DIR, else the system's; an unverified server is an alert \
net_upstream_refused and the connection is closed). In request headers to one of its hosts the \
placeholder is replaced by the value; in bodies only with --secret-in-body NAME (Content-Length is \
then dropped). Responses are passed on as they arrive (streams such as SSE are not buffered). The \
sandbox trusts the CA through a bundle (what sbx-net trusts followed by the CA certificate) bound \
read-only over the system bundle (/etc/ssl/certs/ca-certificates.crt or the distribution's \
equivalent) in a mount namespace of the command's own, and SSL_CERT_FILE, NODE_EXTRA_CA_CERTS, \
REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE and GIT_SSL_CAINFO set to that path; NAME and SBX_PASS_ENV are set \
so that a later sbx-fs passes NAME. A placeholder seen anywhere else is cut and an alert \
secret_leak_blocked (secret, host, where) is logged, never the value: in a request to a declared host \
it does not belong to (url, header or body: HTTP 403), in what the command sends on any other \
connection (plain text such as HTTP, or a TLS ClientHello: the connection is cut), and in a DNS query \
name (REFUSED, never forwarded). What travels inside TLS to a host that is not declared is not \
intercepted (certificate pinning keeps working) and so not checked; the placeholder is useless there.",
        ),
        (
            "SECURITY",
            "Nothing leads out of the namespace but the gateway: there is no interface but lo, so even a \
program that flushes the rules (as root inside) has no route anywhere. No host network state is \
created (no veth, no host firewall rules). With --secret one file is: the sandbox's CA bundle (public \
certificates only, mode 0644), sbx-net-ca-PID-TAG.pem in $TMPDIR, from start-up until the command \
runs (its name is removed then; the bind keeps the content); it is registered before it is made, so \
the bundle of an sbx-net killed in between is removed by the next sbx-net. When the supervisor dies the command is killed (PR_SET_PDEATHSIG) and \
its connections die with the supervisor's sockets. Run as root, sbx-net alone does not stop a root \
program from leaving through other namespaces: put sbx-fs (PID and mount namespaces) and sbx-seccomp \
after it.",
        ),
    ],
};

#[derive(Parser, Debug)]
#[command(
    name = "sbx-net",
    version,
    about = "Run a command with default-deny egress through an allowlisting gateway",
    after_help = "Example: sbx-net --allow pypi.org --allow files.pythonhosted.org -- pip download requests"
)]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonArgs,

    /// The egress policy (sbx-spec's NetSpec: one definition for these
    /// flags, `--config` and sbx-policy's chain).
    #[command(flatten)]
    pub spec: sbx_spec::NetSpec,

    /// The command to run inside.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<OsString>,
}

/// Builds the allowlist from the flags and files.
pub fn policy(cli: &Cli) -> Result<Policy, Failure> {
    let mut p = Policy::default();
    for a in &cli.spec.allow {
        p.add(allow::parse_allow("--allow", a).map_err(|e| Failure::new(e.to_string()))?);
    }
    for f in &cli.spec.allow_file {
        for e in allow::read_allow_file(f).map_err(|e| Failure::new(e.to_string()))? {
            p.add(e);
        }
    }
    // The DNS proxy's own rules for names (public suffixes and the like).
    for n in &p.names {
        sbx_dnsproxy::parse_allow_entry(&n.dns_entry())
            .map_err(|e| Failure::new(format!("--allow '{}': {e}", n.dns_entry())))?;
    }
    for c in &cli.spec.allow_cidr {
        p.cidrs
            .push(allow::parse_allow_cidr(c).map_err(|e| Failure::new(e.to_string()))?);
    }
    Ok(p)
}

/// Phantom credentials: the secrets (values read, sbx-net's own copy in
/// its environment overwritten), the CA and TLS configurations, and the
/// sandbox's CA bundle in an open file (unlinked once the command runs).
struct Phantoms {
    intercept: Arc<http::Intercept>,
    bundle_target: &'static str,
    /// Removed when dropped: after the spawn, or on any error before it.
    bundle_file: Option<TempFile>,
}

/// The bundle file and its registry entry (`sbx_core::registry`, taken
/// before the file exists): a SIGKILLed run's file is removed by the next
/// sbx-net ([`reap_bundles`]).
struct TempFile(PathBuf, Option<sbx_core::registry::Entry>);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        // The entry goes after the file (a failed removal keeps nothing
        // registered either: the file was ours and is public).
        drop(self.1.take());
    }
}

/// The registry kind of CA bundle files.
const BUNDLE_KIND: &str = "net-ca";

/// Removes the CA bundle files of dead sbx-net runs (SIGKILLed between
/// writing one and dropping its name), whatever their TMPDIR was.
fn reap_bundles() {
    for p in sbx_core::registry::reap(BUNDLE_KIND, |p| {
        // Only a file of ours by that name, never through a symlink.
        let ours = p
            .file_name()
            .is_some_and(|n| n.as_encoded_bytes().starts_with(b"sbx-net-ca-"));
        if !ours {
            return Ok(());
        }
        use std::os::unix::fs::MetadataExt;
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        match std::fs::symlink_metadata(p) {
            Ok(m) if m.is_file() && m.uid() == me => std::fs::remove_file(p),
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        }
    }) {
        tracing::info!(file = %p.display(), "removed a dead run's CA bundle");
    }
}

fn phantoms(cli: &Cli, policy: &mut Policy) -> Result<Option<Phantoms>, Failure> {
    if cli.spec.secret.is_empty() {
        if let Some(n) = cli.spec.secret_in_body.first() {
            return Err(Failure::new(format!(
                "--secret-in-body {n}: no --secret declared"
            )));
        }
        return Ok(None);
    }
    let specs = cli
        .spec
        .secret
        .iter()
        .map(|s| phantom::parse_spec(s))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Failure::new(e.to_string()))?;
    let secrets =
        phantom::load(&specs, &cli.spec.secret_in_body).map_err(|e| Failure::new(e.to_string()))?;
    for s in &specs {
        if s.source == phantom::Source::Env {
            phantom::scrub_env(&s.name);
        }
    }
    let mut hosts: Vec<String> = secrets.iter().flat_map(|s| s.hosts.clone()).collect();
    hosts.sort();
    hosts.dedup();
    for h in &hosts {
        policy.add(
            allow::parse_allow("--secret", &format!("{h}:443"))
                .map_err(|e| Failure::new(e.to_string()))?,
        );
    }
    let ca = Arc::new(mitm::Ca::new(&hosts).map_err(|e| Failure::new(e.to_string()))?);
    let server = mitm::server_config(ca.clone()).map_err(|e| Failure::new(e.to_string()))?;
    let (client, client_h1) = mitm::client_configs().map_err(|e| Failure::new(e.to_string()))?;
    let (bundle, target) = mitm::bundle(&ca).map_err(|e| Failure::new(e.to_string()))?;
    let (path, entry) = write_bundle(&bundle)?;
    Ok(Some(Phantoms {
        intercept: Arc::new(http::Intercept {
            secrets: Arc::new(secrets),
            server,
            client,
            client_h1,
        }),
        bundle_target: target,
        bundle_file: Some(TempFile(path, entry)),
    }))
}

/// Writes the sandbox's bundle (public certificates only) to a new file in
/// the temp dir, for the bind; the name goes as soon as the command runs.
/// Each name is registered before the file is made (without a registry a
/// warning says a SIGKILL could leave it).
fn write_bundle(b: &[u8]) -> Result<(PathBuf, Option<sbx_core::registry::Entry>), Failure> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = std::env::temp_dir();
    let mut last = None;
    for _ in 0..8 {
        let tag = phantom::placeholder(0).map_err(Failure::new)?;
        let p = dir.join(format!(
            "sbx-net-ca-{}-{}.pem",
            std::process::id(),
            &tag[phantom::PREFIX.len()..][..12]
        ));
        let entry = sbx_core::registry::register(BUNDLE_KIND, &p)
            .map_err(|e| tracing::warn!(file = %p.display(), "CA bundle not registered: {e}"))
            .ok();
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&p)
        {
            Ok(mut f) => {
                sbx_core::registry::test_kill_point("net-ca-created");
                if let Err(e) = f.write_all(b) {
                    let _ = std::fs::remove_file(&p);
                    return Err(Failure::new(format!("writing {}: {e}", p.display())));
                }
                sbx_core::registry::test_kill_point("net-ca-written");
                return Ok((p, entry));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(Failure::new(format!("creating {}: {e}", p.display()))),
        }
    }
    Err(Failure::new(format!(
        "creating the CA bundle in {}: {}",
        dir.display(),
        last.map(|e| e.to_string()).unwrap_or_default()
    )))
}

fn run(cli: Cli) -> Result<i32, Failure> {
    reap_bundles();
    let mut policy = policy(&cli)?;
    let mut phantoms = phantoms(&cli, &mut policy)?;
    let connect_timeout =
        sbx_core::units::parse_duration(&cli.spec.connect_timeout).map_err(|e| {
            Failure::new(format!(
                "--connect-timeout '{}': {e}",
                cli.spec.connect_timeout
            ))
        })?;
    let upstreams =
        dns::upstreams(&cli.spec.dns_upstream).map_err(|e| Failure::new(e.to_string()))?;
    let dns = dns::Dns::new(sbx_dnsproxy::ProxyConfig {
        allow: policy.names.iter().map(|n| n.dns_entry()).collect(),
        upstreams,
        rebind_allow: cli.spec.dns_rebind_allow.clone(),
        nxdomain_for_refused: cli.spec.dns_nxdomain,
        // Every DNS client here is the sandbox: rate limits and tunnelling
        // budgets are the sandbox's, whatever source address it uses.
        client_prefix_v4: 0,
        client_prefix_v6: 0,
        ..Default::default()
    })
    .map_err(|e| Failure::new(e.to_string()))?;
    let layout = nft::Layout::default();
    let (ours, theirs) = netns::channel().map_err(|e| Failure::new(e.to_string()))?;
    let prep = Arc::new(netns::Prepared {
        ruleset: nft::ruleset(&layout),
        layout,
        chan: theirs,
        // SAFETY: getuid(2) takes no arguments and always succeeds.
        uid: unsafe { libc::getuid() },
        // SAFETY: getgid(2) takes no arguments and always succeeds.
        gid: unsafe { libc::getgid() },
        trust: match &phantoms {
            Some(Phantoms {
                bundle_file: Some(f),
                bundle_target,
                ..
            }) => Some(
                netns::TrustBind::new(&f.0, bundle_target)
                    .map_err(|e| Failure::new(format!("CA bundle: {e}")))?,
            ),
            _ => None,
        },
    });

    let mut cmd = sbx_core::supervise::command(&cli.cmd, None)?;
    if let Some(p) = &phantoms {
        let mut pass: Vec<String> = std::env::var(sbx_core::envpolicy::ENV_PASS)
            .ok()
            .filter(|v| !v.is_empty())
            .into_iter()
            .collect();
        for s in p.intercept.secrets.iter() {
            cmd.env(&s.name, &s.placeholder);
            pass.push(s.name.clone());
        }
        for v in [
            "SSL_CERT_FILE",
            "NODE_EXTRA_CA_CERTS",
            "REQUESTS_CA_BUNDLE",
            "CURL_CA_BUNDLE",
            "GIT_SSL_CAINFO",
        ] {
            cmd.env(v, p.bundle_target);
        }
        cmd.env(sbx_core::envpolicy::ENV_PASS, pass.join(","));
    }
    let keep: Vec<i32> = audit::get()
        .and_then(|a| a.handoff(&cli.cmd[0], &mut cmd))
        .into_iter()
        .collect();
    let p2 = prep.clone();
    // SAFETY: runs in the forked child of a single-threaded process (the
    // gateway's threads start only after the spawn).
    unsafe {
        cmd.pre_exec(move || {
            p2.child_setup()?;
            // The command starts with no signal blocked (run_main blocked
            // the forwarded ones in this process; the mask survives exec).
            sbx_core::signals::unblock_all().map_err(std::io::Error::from)
        });
    }
    let spawned = Supervisor::spawn(cmd, &keep);
    drop(prep);
    // The command's mount namespace holds the bundle now (or it failed):
    // its name on the host goes.
    if let Some(p) = &mut phantoms {
        p.bundle_file = None;
    }
    let handed = netns::receive(&ours);
    let mut sup = match (spawned, handed) {
        (Ok(s), Ok(Some(h))) => (s, h),
        (_, Err(e)) => return Err(Failure::new(e.to_string())),
        (Err(f), Ok(_)) => return Err(f),
        (Ok(_), Ok(None)) => return Err(Failure::new("sandbox set-up sent nothing")),
    };
    drop(ours);
    // Every relayed connection costs the gateway two sockets (and, while
    // threaded, two pipes): raise our soft fd limit to the hard one, after
    // the fork, so the command's own limits are untouched.
    raise_nofile();

    audit::emit(
        "net_start",
        Severity::Info,
        json!({
            "names": policy.names.iter().map(|n| format!("{}:{}", n.dns_entry(), n.ports)).collect::<Vec<_>>(),
            "cidrs": policy.cidrs.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
            "sni_check": cli.spec.sni_check,
            "child": sup.0.pid(),
            "secrets": phantoms.as_ref().map(|p| p.intercept.secrets.iter().map(|s| json!({
                "name": s.name, "hosts": s.hosts, "in_body": s.in_body,
            })).collect::<Vec<_>>()).unwrap_or_default(),
            "ca_bundle": phantoms.as_ref().map(|p| p.bundle_target),
        }),
    );

    let gw = Arc::new(Gateway {
        policy,
        dns: Some(Arc::new(dns)),
        sni_check: cli.spec.sni_check,
        connect_timeout,
        sniff_timeout: Duration::from_secs(10),
        stats: Stats::default(),
        alert_budget: AlertBudget::new(50, 20),
        relay: gateway::RelayMode::from_env(),
        threaded: Default::default(),
        dns_tcp_conns: Default::default(),
        host_allow: cli.spec.allow_host_address.clone(),
        host_addrs: Default::default(),
        intercept: phantoms.as_ref().map(|p| p.intercept.clone()),
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("sbx-net-gw")
        .enable_all()
        .build()
        .map_err(|e| Failure::new(format!("starting the gateway runtime: {e}")))?;
    let h = sup.1;
    // The SYN queue: a thread of its own, so a busy runtime never delays
    // a connect().
    {
        let gw = gw.clone();
        let synq = h.synq;
        std::thread::Builder::new()
            .name("sbx-net-syn".into())
            .spawn(move || synq::serve(synq, |d| gw.syn_allowed(d)))
            .map_err(|e| Failure::new(format!("starting the SYN queue thread: {e}")))?;
    }
    rt.spawn(gw.clone().serve_tcp(h.tcp4, false));
    rt.spawn(gw.clone().serve_udp(h.udp4));
    if let Some((tcp6, udp6)) = h.v6 {
        rt.spawn(gw.clone().serve_tcp(tcp6, true));
        rt.spawn(gw.clone().serve_udp(udp6));
    } else {
        tracing::info!("no IPv6 in the sandbox (the kernel has it disabled)");
    }

    let code = sup
        .0
        .run_to_end()
        .map_err(|e| Failure::new(format!("waiting for the command: {e}")))?;
    rt.shutdown_background();
    let mut end = gw.stats.json();
    end["exit_code"] = json!(code);
    audit::emit("net_end", Severity::Info, end);
    Ok(code)
}

fn raise_nofile() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((cur, max)) = getrlimit(Resource::RLIMIT_NOFILE)
        && cur < max
    {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, max, max);
    }
}

pub fn main() -> ! {
    sbx_core::cli::run_main(TOOL, || {
        let cli: Cli = sbx_core::cli::parse(TOOL)?;
        sbx_core::cli::init(TOOL, &cli.common)?;
        run(cli)
    })
}
