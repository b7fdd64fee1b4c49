//! sbx-cgroup as a user runs it: exit statuses, limits really set, rlimits,
//! bad input, the unprivileged case, the chain hand-off.

mod common;

use common::*;

#[test]
fn exit_status_passes_through() {
    let p = parent_or_skip!();
    let out = run(p.cmd().args(["--", "sh", "-c", "exit 42"]));
    assert_eq!(code(&out), 42);
    let out = run(p.cmd().args(["--", "sh", "-c", "kill -TERM $$"]));
    assert_eq!(code(&out), 128 + 15);
    let out = run(p.cmd().args(["--", "/nonexistent/cmd"]));
    assert_eq!(code(&out), 127);
    let noexec = p.tmp.path().join("noexec");
    std::fs::write(&noexec, "#!/bin/sh\n").unwrap();
    let out = run(p.cmd().arg("--").arg(&noexec));
    assert_eq!(code(&out), 126);
    let out = run(p.cmd().args(["--", "sh", "-c", "echo out; echo err >&2"]));
    assert_eq!(stdout(&out), "out\n");
    assert!(stderr(&out).contains("err"));
    p.assert_no_group();
}

#[test]
fn the_command_runs_inside_the_group_with_the_limits_set() {
    let p = parent_or_skip!();
    // The child reads its own groups' files (found through /proc/self/cgroup).
    let script = r#"
g() { echo /sys/fs/cgroup/$1$(grep -E "^[0-9]+:([^:]*,)?$1(,[^:]*)?:" /proc/self/cgroup | cut -d: -f3); }
cat $(g memory)/memory.limit_in_bytes $(g memory)/memory.memsw.limit_in_bytes $(g pids)/pids.max \
    $(g cpu)/cpu.cfs_quota_us $(g cpu)/cpu.cfs_period_us $(g cpu)/cpu.shares
basename $(g pids)
ulimit -n; ulimit -Hn; ulimit -c
"#;
    let out = run(p
        .cmd()
        .args([
            "--memory",
            "64M",
            "--pids",
            "10",
            "--cpus",
            "0.5",
            "--cpu-weight",
            "200",
        ])
        .args([
            "--rlimit",
            "nofile=64:128",
            "--rlimit",
            "core=0",
            "--",
            "sh",
            "-c",
            script,
        ])
        .env("SBX_ID", unique("lim")));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    assert_eq!(
        &lines[..6],
        &["67108864", "67108864", "10", "50000", "100000", "2048"],
        "{}",
        stdout(&out)
    );
    assert!(lines[6].starts_with("sbx-lim"), "{}", lines[6]);
    assert_eq!(&lines[7..], &["64", "128", "0"]);
    let ev = summary(&p.log());
    assert_eq!(ev["severity"], "info");
    assert_eq!(ev["limits"]["memory"], 64 << 20);
    assert_eq!(ev["mode"], "hybrid");
    p.assert_no_group();
}

#[test]
fn memory_swap_sets_the_total() {
    let p = parent_or_skip!();
    let script = r#"d=/sys/fs/cgroup/memory$(grep :memory: /proc/self/cgroup | cut -d: -f3); cat $d/memory.memsw.limit_in_bytes"#;
    let out = run(p.cmd().args([
        "--memory",
        "64M",
        "--memory-swap",
        "128M",
        "--",
        "sh",
        "-c",
        script,
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), (128u64 << 20).to_string());
}

#[test]
fn bad_input_is_one_line_125_and_creates_no_group() {
    let p = parent_or_skip!();
    let cases: &[(&[&str], &str)] = &[
        (&["--memory", "12Q"], "--memory"),
        (&["--memory", "10"], "--memory"),
        (&["--memory-swap", "1G"], "--memory-swap"),
        (
            &["--memory", "1G", "--memory-swap", "512M"],
            "--memory-swap",
        ),
        (&["--cpus", "0"], "--cpus"),
        (&["--cpus", "x"], "--cpus"),
        (&["--cpu-weight", "0"], "--cpu-weight"),
        (&["--io-weight", "99999"], "--io-weight"),
        (&["--pids", "0"], "--pids"),
        (&["--timeout", "5x"], "--timeout"),
        (&["--rlimit", "bogus=1"], "unknown limit"),
        (&["--rlimit", "nofile"], "--rlimit"),
        (&["--rlimit", "nofile=10:5"], "soft limit"),
        (&["--rlimit", "nofile=unlimited"], "--rlimit nofile"),
        (&["--parent", "../escape"], "--parent"),
    ];
    for (args, needle) in cases {
        let out = run(p.cmd().args(*args).args(["--", "true"]));
        assert_usage_error(&out, needle);
        p.assert_no_group();
    }
    // The failure is in the audit log too.
    assert_event(&p.log(), "setup_failed", "warn", |e| {
        e["error"].as_str().is_some_and(|m| m.contains("--cpus"))
    });
    // A parent that does not exist.
    let out = run(tool("sbx-cgroup").args(["--parent", &unique("no-such-"), "--", "true"]));
    assert_usage_error(&out, "no such cgroup");
    // No command.
    let out = run(p.cmd().args(["--memory", "1G"]));
    assert_usage_error(&out, "CMD");
    p.assert_no_group();
}

#[test]
fn unprivileged_without_a_delegated_cgroup_gets_one_clear_line() {
    let p = parent_or_skip!();
    if test_user().is_none() {
        skip!("test user {TEST_USER} missing (scripts/setup)");
    }
    for parent in [None, Some(p.name.as_str())] {
        let mut c = tool("sbx-cgroup");
        if let Some(par) = parent {
            c.args(["--parent", par]);
        }
        c.args(["--memory", "64M", "--", "true"]);
        run_as(&mut c, As::User);
        let out = run(&mut c);
        assert_usage_error(&out, "not delegated");
        assert!(stderr(&out).contains("systemd-run --user --scope -p Delegate=yes"));
    }
    p.assert_no_group();
}

#[test]
fn signals_are_forwarded_to_the_command() {
    let p = parent_or_skip!();
    let mut child = p
        .cmd()
        .args([
            "--",
            "sh",
            "-c",
            "trap 'exit 9' TERM; echo ready; while :; do sleep 0.05; done",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line, "ready\n");
    // SAFETY: kill with integer arguments; the child is ours and not yet reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(9));
    p.assert_no_group();
}

#[test]
fn the_audit_fd_is_handed_to_a_next_sbx_tool_only() {
    let p = parent_or_skip!();
    // A plain command gets neither the fd nor the variable.
    let out = run(p.cmd().args([
        "--",
        "sh",
        "-c",
        "echo ${SBX_AUDIT_FD:-none}; ls /proc/self/fd | wc -l",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let s = stdout(&out);
    let mut l = s.lines();
    assert_eq!(l.next(), Some("none"));
    // 0, 1, 2 and the fd ls opens for the listing.
    assert_eq!(l.next().map(str::trim), Some("4"), "{s}");
    // A nested sbx-cgroup (an sbx tool) gets the fd and logs through it.
    std::fs::remove_file(p.log()).unwrap();
    let inner = bin("sbx-cgroup");
    let out = run(p
        .cmd()
        .args(["--"])
        .arg(&inner)
        .args(["--pids", "8", "--", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let evs: Vec<_> = audit_events(&p.log())
        .into_iter()
        .filter(|e| e["event"] == "cgroup_summary")
        .collect();
    assert_eq!(evs.len(), 2, "{evs:?}");
    let ids: Vec<_> = evs.iter().map(|e| e["sbx_id"].clone()).collect();
    assert!(
        ids.windows(2).all(|w| w[0] == w[1]),
        "one SBX_ID along the chain: {ids:?}"
    );
    p.assert_no_group();
}

#[test]
fn chain_with_sbx_fs_and_sbx_seccomp_when_built() {
    let p = parent_or_skip!();
    let dir = bin("sbx-cgroup").parent().unwrap().to_path_buf();
    let (fs, sc) = (dir.join("sbx-fs"), dir.join("sbx-seccomp"));
    if !fs.exists() || !sc.exists() {
        skip!("sbx-fs / sbx-seccomp not built (run scripts/test, which builds every tool)");
    }
    // sbx-fs's own flags are its business: the default root with the host's
    // /usr etc. read-only is what its man page promises for `--`.
    let out = run(p
        .cmd()
        .args(["--memory", "128M", "--pids", "64", "--"])
        .arg(&fs)
        .arg("--")
        .arg(&sc)
        .args(["--", "sh", "-c", "echo chained"]));
    if code(&out) != 0 {
        skip!(
            "the chain did not run (sbx-fs/sbx-seccomp still being built?): {}",
            stderr(&out)
        );
    }
    assert_eq!(stdout(&out).trim(), "chained");
    let ev = summary(&p.log());
    assert_eq!(ev["exit_code"], 0);
    p.assert_no_group();
}

#[test]
fn io_weight_is_set_where_the_hierarchy_has_it() {
    let p = parent_or_skip!();
    let script = r#"d=/sys/fs/cgroup/blkio$(grep :blkio: /proc/self/cgroup | cut -d: -f3); cat $d/blkio.weight 2>/dev/null || cat $d/blkio.bfq.weight"#;
    let out = run(p
        .cmd()
        .args(["--io-weight", "300", "--", "sh", "-c", script]));
    if code(&out) == 125 {
        // No I/O scheduler with weights: one clear line, nothing left.
        assert_usage_error(&out, "--io-weight");
    } else {
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        // v2 weight 300 maps to v1 blkio weight 510.
        assert_eq!(stdout(&out).trim(), "510");
    }
    p.assert_no_group();
}

#[test]
fn unprivileged_with_a_parent_chowned_to_it_works() {
    let p = parent_or_skip!();
    let Some((uid, gid)) = test_user() else {
        skip!("test user {TEST_USER} missing (scripts/setup)");
    };
    // Delegate the test's parent group to the test user (v1: the dir and
    // the files used to join it).
    for d in &p.dirs {
        for f in [d.clone(), d.join("cgroup.procs"), d.join("tasks")] {
            std::os::unix::fs::chown(&f, Some(uid), Some(gid)).unwrap();
        }
    }
    let logdir = shared_tempdir();
    let log = logdir.path().join("audit.log");
    let mut c = tool("sbx-cgroup");
    c.args([
        "--parent",
        &p.name,
        "--memory",
        "64M",
        "--pids",
        "16",
        "--audit-log",
    ])
    .arg(&log)
    .args(["--", "sh", "-c", "grep -c sbx- /proc/self/cgroup; id -u"]);
    run_as(&mut c, As::User);
    let out = run(&mut c);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines, ["4", uid.to_string().as_str()], "{text}");
    let ev = summary(&log);
    assert_eq!(ev["removed"], true);
    p.assert_no_group();
}

#[test]
fn settings_come_from_a_config_file_too() {
    let p = parent_or_skip!();
    let cfg = p.tmp.path().join("cfg.json");
    std::fs::write(
        &cfg,
        r#"{"sbx-cgroup": {"memory": "48M", "pids": 12, "rlimit": ["nofile=32"]}}"#,
    )
    .unwrap();
    let script = r#"d=/sys/fs/cgroup/pids$(grep :pids: /proc/self/cgroup | cut -d: -f3); cat $d/pids.max; ulimit -n"#;
    let out = run(p
        .cmd()
        .arg("--config")
        .arg(&cfg)
        .args(["--", "sh", "-c", script]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "12\n32\n");
    let ev = summary(&p.log());
    assert_eq!(ev["limits"]["memory"], 48 << 20);
    let bad = p.tmp.path().join("bad.json");
    std::fs::write(&bad, r#"{"sbx-cgroup": {"memroy": "48M"}}"#).unwrap();
    let out = run(p.cmd().arg("--config").arg(&bad).args(["--", "true"]));
    assert_usage_error(&out, "unknown key");
    p.assert_no_group();
}
