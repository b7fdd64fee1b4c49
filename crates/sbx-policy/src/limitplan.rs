//! Which of the policy's limits apply in this run and how (issue 16):
//! `explain` prints it, `chain` passes sbx-cgroup only what applies and
//! says what does not. Root or a delegated cgroup: memory, processes and
//! CPUs through the cgroup. Unprivileged without one: processes through
//! RLIMIT_NPROC in the command's own user namespace, memory per process
//! through RLIMIT_DATA (no total), no CPU limit; a systemd user manager on
//! a cgroup v2 host gives a delegated scope (`systemd-run --user --scope
//! -p Delegate=yes`), used when present. Wall clock, file size, the tmpfs
//! sizes and the SIGTERM → SIGKILL escalation apply everywhere.

use sbx_cgroup::applies::{Applicable, SYSTEMD_SCOPE};

use sbx_spec::CgroupSpec;

use crate::map::Limits;

/// One limit and what becomes of it in this run.
#[derive(Debug, Clone)]
pub struct Row {
    pub limit: &'static str,
    pub value: String,
    pub applies: bool,
    pub how: String,
}

/// The limits of one run.
#[derive(Debug, Clone)]
pub struct LimitPlan {
    pub rows: Vec<Row>,
    /// sbx-cgroup's limits (None: sbx-cgroup is left out).
    pub cgroup: Option<CgroupSpec>,
    /// The layer to put before sbx-cgroup (a delegated systemd user scope).
    pub prefix: Option<Vec<String>>,
    /// Where the cgroup comes from, for the notes.
    pub source: String,
}

impl LimitPlan {
    /// One note per limit that does not apply, and a summary line.
    pub fn notes(&self) -> Vec<String> {
        let yes: Vec<&str> = self
            .rows
            .iter()
            .filter(|r| r.applies)
            .map(|r| r.limit)
            .collect();
        let no: Vec<&str> = self
            .rows
            .iter()
            .filter(|r| !r.applies)
            .map(|r| r.limit)
            .collect();
        let mut v = vec![format!(
            "limits in this run ({}): applied: {}; NOT applied: {}",
            self.source,
            yes.join(", "),
            if no.is_empty() {
                "none".to_string()
            } else {
                no.join(", ")
            }
        )];
        for r in self.rows.iter().filter(|r| !r.applies) {
            v.push(format!("{} {}: NOT applied: {}", r.limit, r.value, r.how));
        }
        v
    }
}

fn kill_after() -> String {
    let d = sbx_core::supervise::kill_after();
    format!("{}s", d.as_secs_f64())
}

/// Decides for `l` with what `app` says can apply; `cgroup`: whether
/// sbx-cgroup is in the chain (`--no-cgroup` leaves it out).
pub fn plan(l: &Limits, app: &Applicable, cgroup: bool) -> LimitPlan {
    let mut rows = Vec::new();
    let scope = !app.root && !app.full() && cgroup && app.systemd_user.is_ok();
    // Through the cgroup: root, a delegation, or the systemd scope.
    let (mem, pids, cpu) = if scope {
        (true, true, true)
    } else {
        (app.memory, app.pids, app.cpu)
    };
    let source = if !cgroup {
        "sbx-cgroup left out (--no-cgroup)".to_string()
    } else if app.root {
        "root: cgroups".to_string()
    } else if scope {
        "unprivileged: a delegated cgroup from the systemd user manager (systemd-run --user --scope -p Delegate=yes)".to_string()
    } else if app.full() {
        "unprivileged: a delegated cgroup".to_string()
    } else {
        format!(
            "unprivileged, no cgroup delegation ({}); {}",
            app.why_not.as_deref().unwrap_or("not delegated"),
            app.systemd_user.as_ref().err().map_or("", |s| s.as_str())
        )
    };
    let left_out = "sbx-cgroup is left out (--no-cgroup)";
    let mut args = CgroupSpec::default();
    // memory
    if !cgroup {
        rows.push(Row {
            limit: "memory",
            value: l.memory.clone(),
            applies: false,
            how: left_out.into(),
        });
    } else if mem {
        args.memory = Some(l.memory.clone());
        rows.push(Row {
            limit: "memory",
            value: l.memory.clone(),
            applies: true,
            how: "cgroup memory limit (the whole sandbox; the OOM killer acts inside it)".into(),
        });
    } else {
        args.rlimit.push(format!("data={}", l.memory));
        rows.push(Row {
            limit: "memory (total)",
            value: l.memory.clone(),
            applies: false,
            how: "needs a cgroup memory controller (root or a delegated cgroup)".into(),
        });
        rows.push(Row {
            limit: "memory (per process)",
            value: l.memory.clone(),
            applies: true,
            how: "RLIMIT_DATA (heap and private mappings of each process; not a total)".into(),
        });
    }
    // processes
    if !cgroup {
        rows.push(Row {
            limit: "processes+threads",
            value: l.pids.clone(),
            applies: false,
            how: left_out.into(),
        });
    } else if pids {
        args.pids = Some(l.pids.clone());
        rows.push(Row {
            limit: "processes+threads",
            value: l.pids.clone(),
            applies: true,
            how: "cgroup pids limit".into(),
        });
    } else if app.userns && !mem && !cpu {
        args.pids = Some(l.pids.clone());
        rows.push(Row {
            limit: "processes+threads",
            value: l.pids.clone(),
            applies: true,
            how: "RLIMIT_NPROC in the command's own user namespace (counted per namespace since Linux 5.14)".into(),
        });
    } else {
        rows.push(Row {
            limit: "processes+threads",
            value: l.pids.clone(),
            applies: false,
            how: if app.userns {
                "the delegated cgroup has no pids controller".into()
            } else {
                "no cgroup pids controller and no unprivileged user namespace for RLIMIT_NPROC"
                    .into()
            },
        });
    }
    // CPUs
    if cgroup && cpu {
        args.cpus = Some(l.cpus.clone());
    }
    rows.push(Row {
        limit: "CPUs",
        value: l.cpus.clone(),
        applies: cgroup && cpu,
        how: if !cgroup {
            left_out.into()
        } else if cpu {
            "cgroup CPU quota".into()
        } else {
            "needs a cgroup cpu controller (root or a delegated cgroup)".into()
        },
    });
    if cgroup {
        args.timeout = Some(l.timeout.clone());
        args.rlimit.push(format!("fsize={}", l.fsize));
    }
    rows.push(Row {
        limit: "wall clock",
        value: l.timeout.clone(),
        applies: cgroup,
        how: if cgroup {
            "sbx-cgroup --timeout (the command is killed, exit 124)".into()
        } else {
            left_out.into()
        },
    });
    rows.push(Row {
        limit: "largest file",
        value: l.fsize.clone(),
        applies: cgroup,
        how: if cgroup {
            "RLIMIT_FSIZE".into()
        } else {
            left_out.into()
        },
    });
    rows.push(Row {
        limit: "/tmp, /dev/shm, $HOME",
        value: l.tmp_size.clone(),
        applies: true,
        how: "tmpfs size (sbx-fs)".into(),
    });
    let budget = l.write_quota != "off";
    rows.push(Row {
        limit: "project writes",
        value: if budget {
            format!("{} bytes, {} new inodes", l.write_quota, l.write_inodes)
        } else {
            "off".into()
        },
        applies: budget,
        how: if budget {
            "overlay on a size- and inode-limited tmpfs, applied to the project at the end (sbx-fs --write-quota)".into()
        } else {
            "none: the project is written live (the write budget is off)".into()
        },
    });
    rows.push(Row {
        limit: "kill-after",
        value: kill_after(),
        applies: true,
        how: "every supervisor sends SIGKILL this long after a forwarded SIGTERM/SIGINT/SIGHUP (--kill-after, SBX_KILL_AFTER)".into(),
    });
    LimitPlan {
        rows,
        cgroup: cgroup.then_some(args),
        prefix: scope.then(|| SYSTEMD_SCOPE.iter().map(|s| s.to_string()).collect()),
        source,
    }
}

/// sbx-cgroup's limits where every one applies (root, cgroups): what
/// `compile` prints, whatever this host offers.
pub fn everywhere(l: &Limits) -> CgroupSpec {
    let all = Applicable {
        root: true,
        mode: None,
        memory: true,
        pids: true,
        cpu: true,
        why_not: None,
        userns: true,
        systemd_user: Ok(()),
    };
    plan(l, &all, true).cgroup.unwrap_or_default()
}

/// What applies for this process on this host.
pub fn detect() -> Applicable {
    sbx_cgroup::applies::here()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(root: bool, cg: bool, userns: bool, systemd: bool) -> Applicable {
        Applicable {
            root,
            mode: None,
            memory: cg,
            pids: cg,
            cpu: cg,
            why_not: (!cg).then(|| "not delegated".into()),
            userns,
            systemd_user: if systemd {
                Ok(())
            } else {
                Err("no systemd user manager".into())
            },
        }
    }

    fn limits() -> Limits {
        Limits {
            memory: "2G".into(),
            pids: "50".into(),
            cpus: "1".into(),
            timeout: "1h".into(),
            tmp_size: "1G".into(),
            fsize: "8G".into(),
            write_quota: "2G".into(),
            write_inodes: "500000".into(),
        }
    }

    /// The write budget is a row of its own; `off` says it does not apply.
    #[test]
    fn the_write_budget_is_a_row() {
        let on = plan(&limits(), &app(false, false, true, false), true);
        assert!(applies(&on, "project writes"));
        let mut l = limits();
        l.write_quota = "off".into();
        let off = plan(&l, &app(false, false, true, false), true);
        assert!(!applies(&off, "project writes"));
    }

    fn applies(p: &LimitPlan, name: &str) -> bool {
        p.rows.iter().find(|r| r.limit == name).unwrap().applies
    }

    /// A systemd user manager (detected: sbx_cgroup::applies) and no
    /// delegation: the chain runs sbx-cgroup in a delegated scope with
    /// every cgroup limit.
    #[test]
    fn systemd_user_scope_when_present() {
        let p = plan(&limits(), &app(false, false, true, true), true);
        assert_eq!(
            p.prefix.as_deref().unwrap()[..3],
            ["systemd-run", "--user", "--scope"]
        );
        assert!(applies(&p, "memory") && applies(&p, "CPUs"));
        let a = p.cgroup.unwrap();
        assert!(a.memory.is_some() && a.cpus.is_some());
    }

    /// Without it: no prefix, only what needs no cgroup, and every limit
    /// that does not apply says so; --no-cgroup leaves sbx-cgroup out.
    #[test]
    fn only_what_applies_without_delegation() {
        let p = plan(&limits(), &app(false, false, true, false), true);
        assert!(p.prefix.is_none());
        assert_eq!(
            p.cgroup.clone().unwrap(),
            CgroupSpec {
                rlimit: vec!["data=2G".into(), "fsize=8G".into()],
                pids: Some("50".into()),
                timeout: Some("1h".into()),
                ..CgroupSpec::default()
            }
        );
        assert!(!applies(&p, "memory (total)") && !applies(&p, "CPUs"));
        assert!(applies(&p, "processes+threads") && applies(&p, "memory (per process)"));
        let notes = p.notes().join("\n");
        assert!(notes.contains("CPUs 1: NOT applied"), "{notes}");
        // No user namespaces either: processes are not bounded.
        let p = plan(&limits(), &app(false, false, false, false), true);
        assert!(!applies(&p, "processes+threads"));
        assert!(p.cgroup.unwrap().pids.is_none());
        let p = plan(&limits(), &app(true, true, true, false), false);
        assert!(p.cgroup.is_none() && !applies(&p, "wall clock"));
        let p = plan(&limits(), &app(true, true, true, false), true);
        assert!(p.rows.iter().all(|r| r.applies) && p.prefix.is_none());
        assert_eq!(p.cgroup, Some(everywhere(&limits())));
    }
}
