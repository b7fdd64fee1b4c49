//! `--net sbx`: the container joins the network namespace sbx-container
//! itself runs in, which must be the one sbx-net made
//! (`sbx-net --allow NAME ... -- sbx-container --net sbx ... -- CMD`). Every
//! connection and DNS query of the container is then caught by sbx-net's
//! redirect rules and decided by its gateway (allowlist, DNS proxy, audit
//! alerts), exactly as for a process sbx-net started itself.
//!
//! The engine is handed the namespace as `ns:/proc/<our pid>/ns/net`
//! (Podman's `--network ns:PATH`; sbx-container lives as long as the
//! container, so the path stays valid). Docker Engine cannot join a
//! namespace by path (only `container:ID`): refused. Before anything is
//! created: the engine is local (a unix socket: the path is opened on its
//! host), this is sbx-net's namespace (only `lo`, sbx-net's address on it,
//! the default route on `lo`, not PID 1's namespace) and sbx-container is in
//! the initial PID namespace (so the engine's `/proc/<pid>` is this
//! process). Before the start, the runtime container is made (Podman's
//! `init`) and its waiting process checked to be in this very namespace;
//! otherwise it is killed before CMD runs (`netns_mismatch`, alert).

use std::net::Ipv4Addr;

use sbx_core::Severity;
use sbx_core::audit::emit;
use serde_json::json;

/// The extra address sbx-net puts on `lo` inside its namespace
/// (`sbx_net::nft::Layout::default().v4`; the end-to-end test runs the real
/// sbx-net, so a change there fails it).
pub const SBX_NET_V4: Ipv4Addr = Ipv4Addr::new(10, 254, 0, 1);

/// The inode number of the initial PID namespace (PROC_PID_INIT_INO).
const PID_INIT_INO: u64 = 0xEFFF_FFFC;

const HOW: &str = "run sbx-net --allow NAME ... -- sbx-container --net sbx ... -- CMD";

#[derive(Debug, thiserror::Error)]
pub enum SbxNetError {
    #[error("--net sbx: {0}")]
    Refused(String),
    #[error(
        "--net sbx: the container is in network namespace {theirs}, not sbx-net's {ours}: killed"
    )]
    Mismatch { ours: String, theirs: String },
}

/// The namespace the container joins.
#[derive(Debug, Clone)]
pub struct Netns {
    /// `ns:/proc/<pid>/ns/net`, as the engine takes it.
    pub mode: String,
    /// `net:[INODE]` of this process.
    pub id: String,
}

fn link(p: &str) -> Option<String> {
    std::fs::read_link(p)
        .ok()
        .map(|l| l.to_string_lossy().into_owned())
}

/// Interface names of this process's network namespace (/proc/self/net/dev).
pub fn interfaces(dev: &str) -> Vec<String> {
    dev.lines()
        .skip(2)
        .filter_map(|l| l.split_once(':').map(|(n, _)| n.trim().to_string()))
        .collect()
}

/// Why this process is not in a namespace made by sbx-net, if it is not.
pub fn not_in_sbx_net() -> Option<String> {
    let ours = link("/proc/self/ns/net")?;
    if link("/proc/1/ns/net").is_some_and(|p1| p1 == ours) {
        return Some(format!(
            "not inside sbx-net's network namespace: this is PID 1's ({HOW})"
        ));
    }
    let ifs = interfaces(&std::fs::read_to_string("/proc/self/net/dev").unwrap_or_default());
    if ifs.is_empty() || ifs.iter().any(|i| i != "lo") {
        return Some(format!(
            "not inside sbx-net's network namespace: it has interfaces {} besides lo ({HOW})",
            ifs.iter()
                .filter(|i| *i != "lo")
                .cloned()
                .collect::<Vec<_>>()
                .join(",")
        ));
    }
    // The address is local only when it is on an interface of ours.
    if std::net::UdpSocket::bind((SBX_NET_V4, 0)).is_err() {
        return Some(format!(
            "not inside sbx-net's network namespace: {SBX_NET_V4} is not on lo ({HOW})"
        ));
    }
    if !sbx_core::sbxnet::in_sbx_net_namespace() {
        return Some(format!(
            "not inside sbx-net's network namespace: no default route on lo ({HOW})"
        ));
    }
    None
}

/// Everything that can be checked before the engine is contacted.
pub fn check_possible(engine_url: &str) -> Result<Netns, SbxNetError> {
    if !engine_url.starts_with("unix://") {
        return Err(SbxNetError::Refused(
            "the engine joins this process's network namespace by its /proc path, which needs a local engine \
             (unix socket)"
                .into(),
        ));
    }
    if let Some(why) = not_in_sbx_net() {
        return Err(SbxNetError::Refused(why));
    }
    let pidns = link("/proc/self/ns/pid").unwrap_or_default();
    if pidns != format!("pid:[{PID_INIT_INO}]") {
        return Err(SbxNetError::Refused(format!(
            "sbx-container is in a PID namespace of its own ({pidns}): the engine could not find its network \
             namespace by pid (put sbx-container before tools that make a PID namespace: {HOW})"
        )));
    }
    let id = link("/proc/self/ns/net")
        .ok_or_else(|| SbxNetError::Refused("cannot read /proc/self/ns/net".into()))?;
    Ok(Netns {
        mode: format!("ns:/proc/{}/ns/net", std::process::id()),
        id,
    })
}

/// Docker Engine takes `container:ID` only, never a namespace path.
pub fn check_engine(kind: &str) -> Result<(), SbxNetError> {
    if kind == "podman" {
        Ok(())
    } else {
        Err(SbxNetError::Refused(format!(
            "the engine is {kind}, which cannot join a network namespace by path (Docker Engine takes only \
             container:ID): --net sbx needs Podman"
        )))
    }
}

/// Before the start: Podman makes the runtime container (`init`: the
/// runtime's process has joined the namespaces and waits before CMD), and
/// that process must be in our network namespace. Anything else (the
/// process cannot be found or is elsewhere) stops the run before CMD runs.
pub async fn init_and_verify(container: &str, ns: &Netns) -> Result<(), SbxNetError> {
    let cant = |why: String| {
        SbxNetError::Refused(format!(
            "cannot check the container's network namespace: {why}"
        ))
    };
    match crate::engine::raw_post(&format!("/libpod/containers/{container}/init")).await {
        Some((204 | 304, _)) => {}
        Some((code, body)) => {
            return Err(cant(format!(
                "init answered {code}: {}",
                body.trim().replace('\n', " ")
            )));
        }
        None => return Err(cant("the engine did not answer init".into())),
    }
    let body = match crate::engine::raw_get(&format!("/containers/{container}/json")).await {
        Some((200, body)) => body,
        _ => return Err(cant("inspect failed".into())),
    };
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let pid = v["State"]["Pid"].as_i64().unwrap_or(0);
    if pid <= 0 {
        return Err(cant("the engine reports no process".into()));
    }
    let theirs = link(&format!("/proc/{pid}/ns/net"))
        .ok_or_else(|| cant(format!("/proc/{pid}/ns/net is not readable")))?;
    if theirs == ns.id {
        emit(
            "netns_joined",
            Severity::Info,
            json!({"container": container, "netns": ns.id, "container_pid": pid}),
        );
        return Ok(());
    }
    emit(
        "netns_mismatch",
        Severity::Alert,
        json!({"container": container, "expected": ns.id, "found": theirs, "container_pid": pid}),
    );
    Err(SbxNetError::Mismatch {
        ours: ns.id.clone(),
        theirs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interfaces_are_read_from_proc_net_dev() {
        let dev = "Inter-|   Receive\n face |bytes\n    lo: 0 0 0\n  eth0: 1 2 3\n";
        assert_eq!(interfaces(dev), ["lo", "eth0"]);
    }

    #[test]
    fn the_test_process_is_not_inside_sbx_net_and_docker_is_refused() {
        // The test runs in the host's (or a CI container's) namespace.
        assert!(not_in_sbx_net().is_some());
        assert!(check_possible("unix:///x.sock").is_err());
        assert!(check_possible("tcp://127.0.0.1:2375").is_err());
        assert!(check_engine("docker").is_err());
        assert!(check_engine("podman").is_ok());
    }
}
