//! Publishing answered addresses to nftables sets (like dnsmasq's
//! `--nftset`), so a host or container firewall can allow exactly the IPs
//! that allowlisted names resolved to.
//!
//! Each set is named `FAMILY:TABLE:SET`; its element type (`ipv4_addr` or
//! `ipv6_addr`) says which answers go in, and when it has the `timeout`
//! flag every element expires with its answer (TTL + grace). Updates go
//! through `nft -f -` in one atomic batch per answer, before the client
//! receives the answer.

use std::net::IpAddr;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncWriteExt;

#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("--nftset '{spec}': {why}")]
    Spec { spec: String, why: String },
    #[error("--nftset '{spec}': {why}")]
    Missing { spec: String, why: String },
    #[error("nft: {0}")]
    Run(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftSet {
    pub family: String,
    pub table: String,
    pub set: String,
    pub v6: bool,
    pub timeout: bool,
}

/// The sets answers are published to.
#[derive(Debug)]
pub struct NftSets {
    sets: Vec<NftSet>,
    nft: String,
    lock: tokio::sync::Mutex<()>,
}

fn ident_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
        && s.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
}

/// Parses `FAMILY:TABLE:SET`.
pub fn parse_spec(spec: &str) -> Result<(String, String, String), NftError> {
    let bad = |why: &str| NftError::Spec {
        spec: spec.to_string(),
        why: why.to_string(),
    };
    let parts: Vec<&str> = spec.split(':').collect();
    let [family, table, set] = parts[..] else {
        return Err(bad("expected FAMILY:TABLE:SET (e.g. inet:filter:allowed4)"));
    };
    if !matches!(family, "ip" | "ip6" | "inet" | "bridge" | "netdev") {
        return Err(bad("family must be ip, ip6, inet, bridge or netdev"));
    }
    if !ident_ok(table) || !ident_ok(set) {
        return Err(bad("table and set must be nftables identifiers"));
    }
    Ok((family.into(), table.into(), set.into()))
}

impl NftSets {
    /// Checks every set exists and learns its type (runs `nft`).
    pub fn open(specs: &[String]) -> Result<NftSets, NftError> {
        let nft = which_nft();
        let mut sets = Vec::new();
        for spec in specs {
            let (family, table, set) = parse_spec(spec)?;
            let out = std::process::Command::new(&nft)
                .args(["-j", "list", "set", &family, &table, &set])
                .stdin(Stdio::null())
                .output()
                .map_err(|e| NftError::Missing {
                    spec: spec.clone(),
                    why: format!("cannot run {nft}: {e}"),
                })?;
            if !out.status.success() {
                let err = String::from_utf8_lossy(&out.stderr);
                let first = err
                    .lines()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("no such set");
                return Err(NftError::Missing {
                    spec: spec.clone(),
                    why: format!("the set must exist (nft list set: {})", first.trim()),
                });
            }
            let v: serde_json::Value =
                serde_json::from_slice(&out.stdout).map_err(|e| NftError::Missing {
                    spec: spec.clone(),
                    why: format!("unreadable nft output: {e}"),
                })?;
            let info = v["nftables"]
                .as_array()
                .and_then(|a| a.iter().find_map(|o| o.get("set")))
                .ok_or_else(|| NftError::Missing {
                    spec: spec.clone(),
                    why: "nft did not describe the set".into(),
                })?;
            let v6 = match info["type"].as_str() {
                Some("ipv4_addr") => false,
                Some("ipv6_addr") => true,
                other => {
                    return Err(NftError::Spec {
                        spec: spec.clone(),
                        why: format!("set type {other:?} is not ipv4_addr or ipv6_addr"),
                    });
                }
            };
            let timeout = info["flags"]
                .as_array()
                .is_some_and(|f| f.iter().any(|x| x == "timeout"));
            sets.push(NftSet {
                family,
                table,
                set,
                v6,
                timeout,
            });
        }
        Ok(NftSets {
            sets,
            nft,
            lock: tokio::sync::Mutex::new(()),
        })
    }

    pub fn sets(&self) -> &[NftSet] {
        &self.sets
    }

    /// The `nft -f` script that puts `ips` in every matching set.
    pub fn script(&self, ips: &[IpAddr], timeout: Duration) -> String {
        let secs = timeout.as_secs().max(1);
        let mut s = String::new();
        for set in &self.sets {
            let elems: Vec<String> = ips
                .iter()
                .filter(|ip| ip.is_ipv6() == set.v6)
                .map(|ip| ip.to_string())
                .collect();
            if elems.is_empty() {
                continue;
            }
            let target = format!("{} {} {}", set.family, set.table, set.set);
            let list = elems.join(", ");
            if set.timeout {
                // add (so it exists), delete, add with the new timeout: one
                // atomic batch, so the element is never absent to packets.
                let timed: Vec<String> = elems
                    .iter()
                    .map(|e| format!("{e} timeout {secs}s"))
                    .collect();
                s.push_str(&format!("add element {target} {{ {list} }}\n"));
                s.push_str(&format!("delete element {target} {{ {list} }}\n"));
                s.push_str(&format!(
                    "add element {target} {{ {} }}\n",
                    timed.join(", ")
                ));
            } else {
                s.push_str(&format!("add element {target} {{ {list} }}\n"));
            }
        }
        s
    }

    /// Adds `ips` to the sets of their family, expiring after `timeout`
    /// where the set has timeouts.
    pub async fn add(&self, ips: &[IpAddr], timeout: Duration) -> Result<(), NftError> {
        let script = self.script(ips, timeout);
        if script.is_empty() {
            return Ok(());
        }
        let _g = self.lock.lock().await;
        let mut child = tokio::process::Command::new(&self.nft)
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| NftError::Run(e.to_string()))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(script.as_bytes())
                .await
                .map_err(|e| NftError::Run(e.to_string()))?;
        }
        let out = child
            .wait_with_output()
            .await
            .map_err(|e| NftError::Run(e.to_string()))?;
        if !out.status.success() {
            return Err(NftError::Run(
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .next()
                    .unwrap_or("failed")
                    .to_string(),
            ));
        }
        Ok(())
    }
}

fn which_nft() -> String {
    for p in ["/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft"] {
        if std::path::Path::new(p).exists() {
            return p.to_string();
        }
    }
    "nft".to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs() {
        assert_eq!(
            parse_spec("inet:filter:allowed4").unwrap(),
            ("inet".into(), "filter".into(), "allowed4".into())
        );
        for bad in [
            "inet:filter",
            "foo:t:s",
            "inet:t:s:x",
            "inet::s",
            "inet:t:s;flush ruleset",
        ] {
            assert!(parse_spec(bad).is_err(), "{bad}");
        }
    }
}
