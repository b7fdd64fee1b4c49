//! `--net internal`: a network of its own, created `Internal` (no route out,
//! no NAT), plus what engines leave open: on an internal bridge the host
//! itself is still reachable at the gateway address (and any host address
//! routed through it), so every service listening on 0.0.0.0 would be. The
//! guard is an nftables table of its own (`inet sbx_ctr_<n>`) that drops
//! every packet from the network's subnets in the input and forward hooks.
//! It needs root and a local engine; otherwise `--net internal` is refused
//! before anything is created. The table's name is a label of the network,
//! so a stale network's table is removed with it.

use std::collections::HashMap;
use std::process::Command;

use bollard::Docker;
use bollard::models::NetworkCreateRequest;
use sbx_core::Severity;
use sbx_core::audit::emit;
use serde_json::json;

pub const L_TABLE: &str = "io.sbx.nft.table";

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("--net internal: {0}")]
    Refused(String),
    #[error("--net internal: {0}")]
    Engine(#[from] bollard::errors::Error),
    #[error("--net internal: nft: {0}")]
    Nft(String),
}

#[derive(Debug)]
pub struct Guard {
    pub table: String,
    pub subnets: Vec<String>,
}

/// Whether the guard can be installed here: root, nft present, a local
/// (unix socket) engine.
pub fn check_possible(engine_url: &str) -> Result<(), NetError> {
    if !engine_url.starts_with("unix://") {
        return Err(NetError::Refused(
            "the host behind an internal network is reachable at its gateway; sbx-container blocks that with host \
             nftables rules, which needs a local engine (unix socket): use --net none"
                .into(),
        ));
    }
    if nix::unistd::geteuid().as_raw() != 0 {
        return Err(NetError::Refused(
            "the host behind an internal network is reachable at its gateway; blocking it needs root (host nftables \
             rules): use --net none"
                .into(),
        ));
    }
    if Command::new("nft").arg("--version").output().is_err() {
        return Err(NetError::Refused(
            "nft (nftables) not found: cannot block the gateway; use --net none".into(),
        ));
    }
    Ok(())
}

fn nft(script: &str) -> Result<(), NetError> {
    use std::io::Write;
    let mut c = Command::new("nft")
        .arg("-f")
        .arg("-")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| NetError::Nft(e.to_string()))?;
    c.stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .map_err(|e| NetError::Nft(e.to_string()))?;
    let out = c
        .wait_with_output()
        .map_err(|e| NetError::Nft(e.to_string()))?;
    if !out.status.success() {
        return Err(NetError::Nft(
            String::from_utf8_lossy(&out.stderr)
                .trim()
                .replace('\n', "; "),
        ));
    }
    Ok(())
}

fn table_name(container_name: &str) -> String {
    let s: String = container_name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("sbx_ctr_{}", &s[s.len().saturating_sub(40)..])
}

/// Creates the internal network and its guard (guard first in effect:
/// nothing runs on the network before the table exists).
pub async fn create_internal(
    docker: &Docker,
    name: &str,
    mut labels: HashMap<String, String>,
) -> Result<(String, Guard), NetError> {
    let table = table_name(name);
    labels.insert(L_TABLE.into(), table.clone());
    let req = NetworkCreateRequest {
        name: name.to_string(),
        driver: Some("bridge".into()),
        internal: Some(true),
        labels: Some(labels),
        ..Default::default()
    };
    docker.create_network(req).await?;
    let ins = docker
        .inspect_network(
            name,
            None::<bollard::query_parameters::InspectNetworkOptions>,
        )
        .await?;
    let subnets: Vec<String> = ins
        .ipam
        .and_then(|i| i.config)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|c| c.subnet)
        .collect();
    let guard = Guard { table, subnets };
    if guard.subnets.is_empty() {
        let _ = docker.remove_network(name).await;
        return Err(NetError::Refused(format!(
            "network {name} has no subnet to guard"
        )));
    }
    if let Err(e) = guard.install() {
        let _ = docker.remove_network(name).await;
        return Err(e);
    }
    emit(
        "network_create",
        Severity::Info,
        json!({"network": name, "internal": true, "subnets": guard.subnets, "nft_table": guard.table}),
    );
    Ok((name.to_string(), guard))
}

impl Guard {
    fn install(&self) -> Result<(), NetError> {
        let mut rules = String::new();
        for s in &self.subnets {
            let fam = if s.contains(':') { "ip6" } else { "ip" };
            rules.push_str(&format!("{fam} saddr {s} counter drop\n"));
        }
        let t = &self.table;
        nft(&format!(
            "table inet {t} {{\n chain input {{ type filter hook input priority -300; policy accept;\n{rules} }}\n chain forward {{ type filter hook forward priority -300; policy accept;\n{rules} }}\n}}\n"
        ))
    }

    /// Nothing to do per container (the rules match the whole subnet); kept
    /// as the place where a per-container rule would go.
    pub async fn attach_container(&mut self, _docker: &Docker, _id: &str) -> Result<(), NetError> {
        Ok(())
    }

    /// Packets the guard dropped (counters), for the audit log.
    pub fn dropped(&self) -> u64 {
        let Ok(out) = Command::new("nft")
            .args(["list", "table", "inet", &self.table])
            .output()
        else {
            return 0;
        };
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .collect::<Vec<_>>()
            .windows(2)
            .filter(|w| w[0] == "packets")
            .filter_map(|w| w[1].parse::<u64>().ok())
            .sum()
    }

    pub fn remove(self) -> Result<(), NetError> {
        let n = self.dropped();
        if n > 0 {
            emit(
                "host_access_blocked",
                Severity::Alert,
                json!({"packets": n, "subnets": self.subnets, "why": "internal network tried to reach the host"}),
            );
        }
        nft(&format!("delete table inet {}\n", self.table))
    }
}

/// Removes the guard table named in a stale network's labels.
pub fn remove_guard_for(_id: &str, labels: &HashMap<String, String>) {
    if let Some(t) = labels.get(L_TABLE)
        && t.starts_with("sbx_ctr_")
        && t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        let _ = nft(&format!("delete table inet {t}\n"));
    }
}
