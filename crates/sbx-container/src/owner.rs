//! Who owns a container: labels that name the supervising sbx-container
//! (SBX_ID, pid, the pid's start time, the boot and the machine), and the
//! check that finds containers whose owner is gone.
//!
//! A pid alone could be reused; a pid with its start time (clock ticks since
//! boot, /proc/PID/stat field 22) and the boot id cannot, and the machine id
//! keeps two hosts sharing one engine from judging each other's containers.

use std::collections::HashMap;

pub const L_ID: &str = "io.sbx.id";
pub const L_PID: &str = "io.sbx.owner.pid";
pub const L_START: &str = "io.sbx.owner.start";
pub const L_BOOT: &str = "io.sbx.owner.boot";
pub const L_HOST: &str = "io.sbx.owner.host";
/// The run's private host directory (hide.rs), for the reaper.
pub const L_HIDE: &str = "io.sbx.hide-dir";
/// Set on everything sbx-container creates (containers, networks).
pub const L_TOOL: &str = "io.sbx.tool";
pub const TOOL_VALUE: &str = "sbx-container";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub pid: u32,
    pub start: u64,
    pub boot: String,
    pub host: String,
}

fn read_trim(p: &str) -> String {
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// This machine's id (/etc/machine-id, else the hostname).
pub fn host_id() -> String {
    let m = read_trim("/etc/machine-id");
    if !m.is_empty() {
        return m;
    }
    let h = read_trim("/proc/sys/kernel/hostname");
    if h.is_empty() { "unknown".into() } else { h }
}

pub fn boot_id() -> String {
    read_trim("/proc/sys/kernel/random/boot_id")
}

/// Start time of `pid` in clock ticks since boot, if it runs.
pub fn start_time(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after
    // the last ')'.
    let rest = &s[s.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

impl Owner {
    pub fn me() -> Owner {
        let pid = std::process::id();
        Owner {
            pid,
            start: start_time(pid).unwrap_or(0),
            boot: boot_id(),
            host: host_id(),
        }
    }

    pub fn labels(&self, sbx_id: &str) -> HashMap<String, String> {
        HashMap::from([
            (L_TOOL.to_string(), TOOL_VALUE.to_string()),
            (L_ID.to_string(), sbx_id.to_string()),
            (L_PID.to_string(), self.pid.to_string()),
            (L_START.to_string(), self.start.to_string()),
            (L_BOOT.to_string(), self.boot.clone()),
            (L_HOST.to_string(), self.host.clone()),
        ])
    }

    pub fn from_labels(l: &HashMap<String, String>) -> Option<Owner> {
        Some(Owner {
            pid: l.get(L_PID)?.parse().ok()?,
            start: l.get(L_START)?.parse().ok()?,
            boot: l.get(L_BOOT)?.clone(),
            host: l.get(L_HOST)?.clone(),
        })
    }
}

/// Whether an object with these labels belongs to a dead sbx-container of
/// this machine. Objects of other machines, or without complete labels, are
/// never judged stale.
pub fn is_stale(labels: &HashMap<String, String>, me: &Owner) -> bool {
    if labels.get(L_TOOL).map(String::as_str) != Some(TOOL_VALUE) {
        return false;
    }
    let Some(o) = Owner::from_labels(labels) else {
        return false;
    };
    if o.host != me.host {
        return false;
    }
    if o.boot != me.boot {
        // Same machine, an earlier boot: its owner cannot be running.
        return true;
    }
    if o.pid == me.pid && o.start == me.start {
        return false;
    }
    start_time(o.pid) != Some(o.start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn me_is_alive_and_a_dead_pid_is_stale() {
        let me = Owner::me();
        assert!(me.start > 0);
        let l = me.labels("x");
        assert!(!is_stale(&l, &me));
        // Same pid, other start time: pid reuse.
        let mut l2 = l.clone();
        l2.insert(L_START.into(), (me.start + 1).to_string());
        let other = Owner {
            pid: 1,
            ..me.clone()
        };
        assert!(is_stale(&l2, &other));
        // Another machine: never.
        let mut l3 = l2.clone();
        l3.insert(L_HOST.into(), "elsewhere".into());
        assert!(!is_stale(&l3, &other));
        // Not ours: never.
        let mut l4 = l2.clone();
        l4.remove(L_TOOL);
        assert!(!is_stale(&l4, &other));
        // Earlier boot: stale.
        let mut l5 = l.clone();
        l5.insert(L_BOOT.into(), "old".into());
        assert!(is_stale(&l5, &other));
    }
}
