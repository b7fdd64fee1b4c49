//! Recognising sbx-net's network namespace from inside it: the tiers that
//! bring their own network (sbx-vm `--net sbx-net`, sbx-container `--net
//! sbx`) run only when sbx-net is the layer outside them.

/// Whether the routing table (`/proc/net/route`'s text) holds only routes
/// via `lo`, a default route among them: what sbx-net sets up (its NAT
/// rules turn the default route on lo into its gateway).
pub fn routes_only_lo(table: &str) -> bool {
    let rows: Vec<Vec<&str>> = table
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    let has_default = rows
        .iter()
        .any(|r| r.get(1) == Some(&"00000000") && r.first() == Some(&"lo"));
    has_default && rows.iter().all(|r| r.first() == Some(&"lo"))
}

/// Whether this process's routes are those of an sbx-net namespace.
pub fn in_sbx_net_namespace() -> bool {
    routes_only_lo(&std::fs::read_to_string("/proc/self/net/route").unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sbx_net_namespace_is_recognised_by_its_routes() {
        let head =
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n";
        assert!(routes_only_lo(&format!(
            "{head}lo\t00000000\t00000000\t0001\t0\t0\t0\t00000000\t0\t0\t0\n"
        )));
        assert!(!routes_only_lo(&format!(
            "{head}eth0\t00000000\t0100A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
        )));
        assert!(!routes_only_lo(head));
    }
}
