//! One run: reap stale containers, create the container (and its network),
//! attach stdio, start, wait (forwarding SIGINT/SIGTERM/SIGHUP/SIGQUIT, with
//! the timeout), collect the exit status (OOM kill: 137), clean up whatever
//! happened.

use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::models::{
    ContainerCreateBody, HostConfig, Mount as EMount, MountTmpfsOptions, MountType,
    ResourcesUlimits,
};
use bollard::query_parameters as qp;
use futures_util::StreamExt;
use sbx_core::Severity;
use sbx_core::audit::emit;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use crate::mounts::Mount;
use crate::netguard;
use crate::owner::{self, Owner};
use crate::spec::{Net, RunSpec};

/// Exit status when --timeout fired (as timeout(1) and sbx-cgroup).
pub const TIMED_OUT: i32 = 124;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("engine: {0}")]
    Engine(#[from] bollard::errors::Error),
    #[error("{0}")]
    Net(#[from] netguard::NetError),
    #[error("{0}")]
    SbxNet(#[from] crate::sbxnet::SbxNetError),
    #[error("hidden-file placeholder: {0}")]
    Hide(#[from] std::io::Error),
    #[error("container {0}: the engine reported no exit status")]
    NoStatus(String),
}

/// What was created on the engine, for the clean-up.
#[derive(Debug, Default)]
pub struct Created {
    pub container: Option<String>,
    pub network: Option<String>,
    pub guard: Option<netguard::Guard>,
    /// The host directory holding the empty file bound over hidden files.
    pub hide_dir: Option<std::path::PathBuf>,
    /// Its registry entry, until the container naming it exists.
    pub hide_entry: Option<sbx_core::registry::Entry>,
}

/// Removes stale sbx-container objects of dead owners on this machine.
pub async fn reap(docker: &Docker, me: &Owner) -> Result<(), bollard::errors::Error> {
    let filters: HashMap<&str, Vec<String>> = HashMap::from([(
        "label",
        vec![format!("{}={}", owner::L_TOOL, owner::TOOL_VALUE)],
    )]);
    let opts = qp::ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    for c in docker.list_containers(Some(opts)).await? {
        let labels = c.labels.clone().unwrap_or_default();
        if !owner::is_stale(&labels, me) {
            continue;
        }
        let Some(id) = c.id.clone() else { continue };
        let rm = qp::RemoveContainerOptionsBuilder::default()
            .force(true)
            .v(true)
            .build();
        let r = docker.remove_container(&id, Some(rm)).await;
        // The dead run's private directory goes with it (only once the
        // container is gone: it may still bind the files).
        if r.is_ok()
            && let Some(d) = labels.get(owner::L_HIDE)
        {
            crate::hide::remove_stale(d);
        }
        emit(
            "stale_container_reaped",
            Severity::Warn,
            json!({
                "container": c.names.and_then(|n| n.first().cloned()).unwrap_or_default(),
                "stale_sbx_id": labels.get(owner::L_ID),
                "owner_pid": labels.get(owner::L_PID),
                "ok": r.is_ok(),
            }),
        );
    }
    let nopts = qp::ListNetworksOptionsBuilder::default()
        .filters(&filters)
        .build();
    for n in docker.list_networks(Some(nopts)).await? {
        let labels = n.labels.clone().unwrap_or_default();
        if !owner::is_stale(&labels, me) {
            continue;
        }
        let Some(name) = n.name.clone() else { continue };
        if let Some(id) = labels.get(owner::L_ID) {
            netguard::remove_guard_for(id, &labels);
        }
        let r = docker.remove_network(&name).await;
        if gone(&r) {
            continue;
        }
        emit(
            "stale_network_reaped",
            Severity::Warn,
            json!({"network": name, "stale_sbx_id": labels.get(owner::L_ID), "ok": r.is_ok()}),
        );
    }
    Ok(())
}

fn gone<T>(r: &Result<T, bollard::errors::Error>) -> bool {
    matches!(
        r,
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            ..
        })
    )
}

/// The exit status for a container the runtime could not start: 127 when
/// the command does not exist, 126 when it cannot be executed (as `docker
/// run` reports them), None for other failures.
pub fn start_failure_code(e: &bollard::errors::Error) -> Option<i32> {
    let bollard::errors::Error::DockerResponseServerError { message, .. } = e else {
        return None;
    };
    let m = message.to_lowercase();
    if m.contains("not found") || m.contains("no such file or directory") {
        Some(sbx_core::exit::NOT_FOUND)
    } else if m.contains("permission denied")
        || m.contains("exec format error")
        || m.contains("is a directory")
    {
        Some(sbx_core::exit::NOT_EXECUTABLE)
    } else {
        None
    }
}

fn engine_mounts(spec: &RunSpec, empty: Option<&std::path::Path>) -> Vec<EMount> {
    let mut v = Vec::new();
    for m in &spec.mounts.mounts {
        v.push(match m {
            Mount::Bind { src, dst, ro } => EMount {
                target: Some(dst.to_string_lossy().into_owned()),
                source: Some(src.to_string_lossy().into_owned()),
                typ: Some(MountType::BIND),
                read_only: Some(*ro),
                ..Default::default()
            },
            Mount::HideFile { dst } => EMount {
                target: Some(dst.to_string_lossy().into_owned()),
                source: Some(empty.expect("hide file").to_string_lossy().into_owned()),
                typ: Some(MountType::BIND),
                read_only: Some(true),
                ..Default::default()
            },
            Mount::HideDir { dst } => EMount {
                target: Some(dst.to_string_lossy().into_owned()),
                typ: Some(MountType::TMPFS),
                read_only: Some(true),
                tmpfs_options: Some(MountTmpfsOptions {
                    size_bytes: Some(4096),
                    mode: Some(0),
                    ..Default::default()
                }),
                ..Default::default()
            },
        });
    }
    v
}

/// The container's create body: every restriction is set here.
pub fn create_body(
    spec: &RunSpec,
    labels: HashMap<String, String>,
    network: &str,
    main_cmd: Vec<String>,
    empty: Option<&std::path::Path>,
    seccomp: Option<&str>,
) -> ContainerCreateBody {
    let tmpfs = HashMap::from([(
        "/tmp".to_string(),
        format!("rw,nosuid,nodev,size={},mode=1777", spec.tmp_size),
    )]);
    let host = HostConfig {
        memory: Some(spec.memory as i64),
        // No swap beyond the memory limit.
        memory_swap: Some(spec.memory as i64),
        nano_cpus: Some((spec.cpus * 1e9) as i64),
        pids_limit: Some(spec.pids as i64),
        readonly_rootfs: Some(true),
        tmpfs: Some(tmpfs),
        cap_drop: Some(vec!["ALL".into()]),
        security_opt: Some(spec.security_opt(seccomp)),
        network_mode: Some(network.to_string()),
        mounts: Some(engine_mounts(spec, empty)),
        init: Some(spec.init),
        privileged: Some(false),
        auto_remove: Some(false),
        ipc_mode: Some("private".into()),
        ulimits: Some(
            spec.ulimits
                .iter()
                .map(|(n, s, h)| ResourcesUlimits {
                    name: Some(n.clone()),
                    soft: Some(*s as i64),
                    hard: Some(*h as i64),
                })
                .collect(),
        ),
        ..Default::default()
    };
    ContainerCreateBody {
        image: Some(spec.image.clone()),
        cmd: Some(main_cmd),
        entrypoint: Some(vec![]),
        user: Some(spec.user.clone()),
        env: Some(spec.env.clone()),
        working_dir: Some(spec.workdir.clone()),
        labels: Some(labels),
        attach_stdin: Some(true),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        open_stdin: Some(true),
        stdin_once: Some(true),
        tty: Some(false),
        network_disabled: Some(matches!(spec.net, Net::None)),
        host_config: Some(host),
        ..Default::default()
    }
}

/// Signals sbx-container forwards (blocked by run_main): read on a thread
/// with sigwait, sent to the runtime.
fn signal_thread() -> mpsc::UnboundedReceiver<i32> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        let set = sbx_core::signals::forwarded_set();
        loop {
            match set.wait() {
                Ok(sig) => {
                    if tx.send(sig as i32).is_err() {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
    });
    rx
}

/// Our stdin, read on a thread (a blocking read never holds up the exit).
fn stdin_thread() -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel(4);
    std::thread::spawn(move || {
        use std::io::Read;
        let mut buf = vec![0u8; 64 * 1024];
        let mut sin = std::io::stdin().lock();
        loop {
            match sin.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx.blocking_send(buf[..n].to_vec()).is_err() {
                        return;
                    }
                }
            }
        }
    });
    rx
}

fn write_out(o: LogOutput) {
    match o {
        LogOutput::StdOut { message } | LogOutput::Console { message } => {
            let mut s = std::io::stdout().lock();
            let _ = s.write_all(&message);
            let _ = s.flush();
        }
        LogOutput::StdErr { message } => {
            let mut s = std::io::stderr().lock();
            let _ = s.write_all(&message);
            let _ = s.flush();
        }
        LogOutput::StdIn { .. } => {}
    }
}

enum End {
    /// The output stream ended: the process exited.
    Done,
    Timeout,
    /// The sbx tool supervising sbx-container (SBX_SUPERVISOR) died.
    ParentDied,
}

/// Fires when the supervising sbx tool's process ends (its pidfd becomes
/// readable); never when there is none.
fn parent_thread() -> mpsc::Receiver<()> {
    let (tx, rx) = mpsc::channel(1);
    if let Some(fd) = sbx_core::supervise::parent_pidfd() {
        std::thread::spawn(move || {
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            loop {
                // SAFETY: `p` is one live pollfd; its fd is sbx-core's
                // process-wide parent pidfd, never closed.
                let n = unsafe { libc::poll(&mut p, 1, -1) };
                if n > 0 {
                    let _ = tx.blocking_send(());
                    return;
                }
                if n < 0
                    && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted
                {
                    return;
                }
            }
        });
    } else {
        std::mem::forget(tx);
    }
    rx
}

/// Pumps stdio until the output ends, forwarding signals and honouring the
/// timeout. `kill` sends a signal to the container.
async fn pump(
    docker: &Docker,
    container: &str,
    mut output: std::pin::Pin<
        Box<dyn futures_util::Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>,
    >,
    mut input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
    timeout: Option<Duration>,
    grace: Duration,
) -> End {
    let mut sigs = signal_thread();
    let mut stdin = stdin_thread();
    let mut parent = parent_thread();
    let mut stdin_open = true;
    let sleep = tokio::time::sleep(timeout.unwrap_or(Duration::from_secs(u64::MAX / 4)));
    tokio::pin!(sleep);
    let mut kill_at: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    loop {
        tokio::select! {
            item = output.next() => match item {
                Some(Ok(o)) => write_out(o),
                Some(Err(e)) => {
                    tracing::debug!("attach stream: {e}");
                    return End::Done;
                }
                None => return End::Done,
            },
            data = stdin.recv(), if stdin_open => match data {
                Some(d) => {
                    if input.write_all(&d).await.is_err() {
                        stdin_open = false;
                    }
                }
                None => {
                    stdin_open = false;
                    let _ = input.shutdown().await;
                }
            },
            Some(sig) = sigs.recv() => {
                let name = nix::sys::signal::Signal::try_from(sig).map(|s| s.as_str().to_string()).unwrap_or_else(|_| sig.to_string());
                emit("signal_forwarded", Severity::Info, json!({"signal": name, "container": container}));
                let opts = qp::KillContainerOptionsBuilder::default().signal(&name).build();
                let _ = docker.kill_container(container, Some(opts)).await;
                if kill_at.is_none() {
                    kill_at = Some(Box::pin(tokio::time::sleep(grace)));
                }
            },
            _ = async { kill_at.as_mut().unwrap().await }, if kill_at.is_some() => {
                kill_at = None;
                emit("kill_after_grace", Severity::Warn, json!({"container": container, "grace_ms": grace.as_millis() as u64}));
                let opts = qp::KillContainerOptionsBuilder::default().signal("SIGKILL").build();
                let _ = docker.kill_container(container, Some(opts)).await;
            },
            _ = &mut sleep, if timeout.is_some() => {
                return End::Timeout;
            },
            Some(()) = parent.recv() => {
                return End::ParentDied;
            },
        }
    }
}

/// The container's state from a raw inspect: (running, exit code, OOM killed).
async fn state(id: &str) -> Option<(bool, Option<i64>, bool)> {
    let (code, body) = crate::engine::raw_get(&format!("/containers/{id}/json")).await?;
    if code != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let st = &v["State"];
    Some((
        st["Running"].as_bool().unwrap_or(false),
        st["ExitCode"].as_i64(),
        st["OOMKilled"].as_bool().unwrap_or(false),
    ))
}

async fn exit_code(docker: &Docker, id: &str) -> Result<(i64, bool), RunError> {
    // The output ended: the process has exited or is about to. Quick
    // inspects first (Podman's wait polls every 250 ms), then the engine's
    // wait for a command that closed its output but runs on.
    let mut delay = Duration::from_millis(2);
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(1) {
        match state(id).await {
            Some((false, Some(code), oom)) => return Ok((code, oom)),
            Some(_) => {}
            None => break,
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(100));
    }
    let opts = qp::WaitContainerOptionsBuilder::default()
        .condition("not-running")
        .build();
    let mut w = docker.wait_container(id, Some(opts));
    let waited = match w.next().await {
        Some(Ok(r)) => Some(r.status_code),
        Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => Some(code),
        _ => None,
    };
    let (code, oom) = match state(id).await {
        Some((_, Some(c), oom)) => (Some(c), oom),
        _ => (None, false),
    };
    let code = waited
        .or(code)
        .ok_or_else(|| RunError::NoStatus(id.to_string()))?;
    Ok((code, oom))
}

/// `--net sbx`: the container's process, made but not yet running CMD,
/// must be in sbx-net's namespace (ours); otherwise it is killed.
async fn check_netns(
    docker: &Docker,
    id: &str,
    netns: Option<&crate::sbxnet::Netns>,
) -> Result<(), RunError> {
    let Some(n) = netns else { return Ok(()) };
    if let Err(e) = crate::sbxnet::init_and_verify(id, n).await {
        let opts = qp::KillContainerOptionsBuilder::default()
            .signal("SIGKILL")
            .build();
        let _ = docker.kill_container(id, Some(opts)).await;
        return Err(e.into());
    }
    Ok(())
}

fn one_line(e: &bollard::errors::Error) -> String {
    e.to_string().replace('\n', " ")
}

/// Removes what the run created; every step is tried, each result logged.
pub async fn cleanup(docker: &Docker, created: &mut Created) {
    let mut fields = serde_json::Map::new();
    if let Some(c) = created.container.take() {
        let rm = qp::RemoveContainerOptionsBuilder::default()
            .force(true)
            .v(true)
            .build();
        let r = docker.remove_container(&c, Some(rm)).await;
        fields.insert("container".into(), json!(c));
        fields.insert("container_removed".into(), json!(r.is_ok()));
        if let Err(e) = r {
            fields.insert("container_error".into(), json!(e.to_string()));
        }
    }
    if let Some(d) = created.hide_dir.take() {
        fields.insert(
            "hide_dir_removed".into(),
            json!(sbx_core::rmtree::remove_tree(&d).is_ok()),
        );
    }
    drop(created.hide_entry.take());
    if let Some(g) = created.guard.take() {
        fields.insert("firewall_removed".into(), json!(g.remove().is_ok()));
    }
    if let Some(n) = created.network.take() {
        let r = docker.remove_network(&n).await;
        fields.insert("network".into(), json!(n));
        fields.insert("network_removed".into(), json!(r.is_ok()));
    }
    let ok = fields
        .iter()
        .filter(|(k, _)| k.ends_with("_removed"))
        .all(|(_, v)| v == &json!(true));
    emit(
        "container_cleanup",
        if ok { Severity::Info } else { Severity::Warn },
        serde_json::Value::Object(fields),
    );
}

/// The whole run; returns the exit status. `created` is filled as objects
/// are made, so the caller cleans up even when this fails half-way.
pub async fn run(
    docker: &Docker,
    kind: &str,
    spec: &RunSpec,
    netns: Option<&crate::sbxnet::Netns>,
    created: &mut Created,
) -> Result<i32, RunError> {
    let me = Owner::me();
    let sbx_id = sbx_core::id::get().unwrap_or("-").to_string();
    let name = format!("sbx-{sbx_id}-{}", me.pid);
    // Secrets never go into the container's configuration: with secrets the
    // container's own process only waits, and the command runs as an exec
    // whose environment is given at exec time.
    let secrets = !spec.secret_env.is_empty();
    let id = create(
        docker,
        kind,
        spec,
        netns,
        me.labels(&sbx_id),
        &name,
        created,
    )
    .await?;
    // --net sbx: the runtime container is made (its process waits before
    // CMD) and checked to be in sbx-net's namespace before anything runs.
    check_netns(docker, &id, netns).await?;
    let (end, code, oom) = if secrets {
        run_exec(docker, spec, &id, &name).await?
    } else {
        match run_attached(docker, spec, &id, &name).await? {
            Ok(r) => r,
            // The command could not start: its status, as a shell gives it.
            Err(code) => return Ok(code),
        }
    };
    Ok(finish(docker, spec, &id, &name, end, code, oom).await)
}

/// Creates the container (its network, the hidden-file placeholder, the
/// seccomp profile where the engine needs a file) and records what it made
/// in `created`; returns its id.
async fn create(
    docker: &Docker,
    kind: &str,
    spec: &RunSpec,
    netns: Option<&crate::sbxnet::Netns>,
    mut labels: HashMap<String, String>,
    name: &str,
    created: &mut Created,
) -> Result<String, RunError> {
    let network = match spec.net {
        Net::None => "none".to_string(),
        Net::Internal => {
            let (net, guard) = netguard::create_internal(docker, name, labels.clone()).await?;
            created.network = Some(net.clone());
            created.guard = Some(guard);
            net
        }
        Net::Sbx => netns.expect("--net sbx checked").mode.clone(),
    };
    let main_cmd = if spec.secret_env.is_empty() {
        spec.cmd.clone()
    } else {
        vec!["sleep".to_string(), "2147483647".to_string()]
    };
    let hide = spec
        .mounts
        .mounts
        .iter()
        .any(|m| matches!(m, Mount::HideFile { .. }));
    // Docker takes a custom profile inline; Podman a path on its host.
    let podman_profile = spec.seccomp_profile.as_ref().filter(|_| kind == "podman");
    if hide || podman_profile.is_some() {
        let (d, entry) = crate::hide::new_dir()?;
        created.hide_dir = Some(d.clone());
        created.hide_entry = entry;
        labels.insert(owner::L_HIDE.into(), d.to_string_lossy().into_owned());
    }
    let empty = match &created.hide_dir {
        Some(d) if hide => Some(crate::hide::hidden_file(d)?),
        _ => None,
    };
    let seccomp = match (&created.hide_dir, podman_profile) {
        (Some(d), Some(p)) => {
            let f = d.join("seccomp.json");
            std::fs::write(&f, p)?;
            Some(f.to_string_lossy().into_owned())
        }
        _ => spec.seccomp_profile.clone(),
    };
    let body = create_body(
        spec,
        labels,
        &network,
        main_cmd,
        empty.as_deref(),
        seccomp.as_deref(),
    );
    sbx_core::registry::test_kill_point("container-hide-filled");
    let opts = qp::CreateContainerOptionsBuilder::default()
        .name(name)
        .build();
    let resp = docker.create_container(Some(opts), body).await?;
    let id = resp.id;
    created.container = Some(id.clone());
    // The container's label names the directory now: its reaping takes
    // over from the registry entry.
    drop(created.hide_entry.take());
    emit(
        "container_create",
        Severity::Info,
        json!({
            "container": name,
            "id": id,
            "image": spec.image,
            "cmd": spec.cmd,
            "memory": spec.memory,
            "cpus": spec.cpus,
            "pids": spec.pids,
            "tmp_size": spec.tmp_size,
            "net": spec.net.name(),
            "netns": netns.map(|n| n.id.clone()),
            "user": spec.user,
            "seccomp": spec.seccomp_name(),
            "mounts": spec.mounts.mounts.len(),
            "hidden": spec.mounts.hidden,
            "protected": spec.mounts.protected,
            "secrets": spec.secret_env.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(),
            "warnings": resp.warnings,
        }),
    );
    if let Some(g) = created.guard.as_mut() {
        g.attach_container(docker, &id).await?;
    }
    Ok(id)
}

/// With secrets: starts the waiting container and runs the command as an
/// exec that carries them; how it ended, its status and the OOM flag.
async fn run_exec(
    docker: &Docker,
    spec: &RunSpec,
    id: &str,
    name: &str,
) -> Result<(End, i64, bool), RunError> {
    docker
        .start_container(id, None::<qp::StartContainerOptions>)
        .await?;
    emit(
        "container_start",
        Severity::Info,
        json!({"container": name, "mode": "exec"}),
    );
    let mut env = spec.env.clone();
    for (k, v) in &spec.secret_env {
        env.push(format!("{k}={v}"));
    }
    let exec = docker
        .create_exec(
            id,
            bollard::models::ExecConfig {
                attach_stdin: Some(true),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                tty: Some(false),
                env: Some(env),
                cmd: Some(spec.cmd.clone()),
                user: Some(spec.user.clone()),
                working_dir: Some(spec.workdir.clone()),
                privileged: Some(false),
                ..Default::default()
            },
        )
        .await?;
    let started = docker
        .start_exec(&exec.id, None::<bollard::exec::StartExecOptions>)
        .await?;
    let end = match started {
        bollard::exec::StartExecResults::Attached { output, input } => {
            pump(docker, id, output, input, spec.timeout, spec.kill_grace).await
        }
        bollard::exec::StartExecResults::Detached => End::Done,
    };
    if matches!(end, End::Timeout | End::ParentDied) {
        return Ok((end, 0, false));
    }
    // The exec's own status; the container's OOM flag covers it too.
    let mut code = None;
    for _ in 0..50 {
        let ins = docker.inspect_exec(&exec.id).await?;
        if ins.running != Some(true) {
            code = ins.exit_code;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let oom = state(id).await.map(|s| s.2).unwrap_or(false);
    Ok((
        end,
        code.ok_or_else(|| RunError::NoStatus(id.to_string()))?,
        oom,
    ))
}

/// Without secrets: attaches to the container and starts it; how it
/// ended, its status and the OOM flag, or (inner Err) the status of a
/// command that could not start.
async fn run_attached(
    docker: &Docker,
    spec: &RunSpec,
    id: &str,
    name: &str,
) -> Result<Result<(End, i64, bool), i32>, RunError> {
    let aopts = qp::AttachContainerOptionsBuilder::default()
        .stream(true)
        .stdin(true)
        .stdout(true)
        .stderr(true)
        .build();
    // Podman prepares the runtime container at attach, Docker at start:
    // a command that cannot run fails at either.
    let started = match docker.attach_container(id, Some(aopts)).await {
        Ok(att) => docker
            .start_container(id, None::<qp::StartContainerOptions>)
            .await
            .map(|()| att),
        Err(e) => Err(e),
    };
    let att = match started {
        Ok(att) => att,
        Err(e) => {
            if let Some(code) = start_failure_code(&e) {
                sbx_core::cli::stderr_line(&format!(
                    "sbx-container: {}: {}",
                    spec.cmd.first().map(String::as_str).unwrap_or(""),
                    one_line(&e)
                ));
                emit(
                    "container_exit",
                    Severity::Info,
                    json!({"container": name, "exit_code": code, "start_failed": one_line(&e)}),
                );
                return Ok(Err(code));
            }
            return Err(e.into());
        }
    };
    emit(
        "container_start",
        Severity::Info,
        json!({"container": name, "mode": "attach"}),
    );
    let end = pump(
        docker,
        id,
        att.output,
        att.input,
        spec.timeout,
        spec.kill_grace,
    )
    .await;
    if matches!(end, End::Timeout | End::ParentDied) {
        return Ok(Ok((end, 0, false)));
    }
    let (code, oom) = exit_code(docker, id).await?;
    Ok(Ok((end, code, oom)))
}

/// The run's exit status, and its audit events: the container killed when
/// the supervisor died or the timeout fired, an OOM kill an alert.
async fn finish(
    docker: &Docker,
    spec: &RunSpec,
    id: &str,
    name: &str,
    end: End,
    code: i64,
    oom: bool,
) -> i32 {
    if let End::ParentDied | End::Timeout = end {
        let opts = qp::KillContainerOptionsBuilder::default()
            .signal("SIGKILL")
            .build();
        let _ = docker.kill_container(id, Some(opts)).await;
    }
    if let End::ParentDied = end {
        emit(
            "supervisor_died",
            Severity::Warn,
            json!({"container": name, "note": "the supervising sbx tool died: container killed"}),
        );
        return 128 + libc::SIGKILL;
    }
    if let End::Timeout = end {
        emit(
            "timeout",
            Severity::Alert,
            json!({"container": name, "timeout_ms": spec.timeout.map(|t| t.as_millis() as u64)}),
        );
        return TIMED_OUT;
    }
    let code = code as i32;
    // Engines do not always set OOMKilled: a SIGKILL death under a memory
    // limit is reported as such too, with the engine's flag alongside.
    let sev = if oom || code == 137 {
        Severity::Alert
    } else {
        Severity::Info
    };
    emit(
        "container_exit",
        sev,
        json!({"container": name, "exit_code": code, "oom_killed": oom, "killed": code == 137}),
    );
    if oom {
        emit(
            "oom_kill",
            Severity::Alert,
            json!({"container": name, "memory": spec.memory}),
        );
        return 137;
    }
    code
}
