//! sbx-net in a chain: the audit fd is handed to the next sbx tool (one log,
//! one sandbox id), and the layers compose: `sbx-net -- sbx-net` (the inner
//! gateway's traffic goes through the outer one) and
//! `sbx-net -- sbx-fs -- sbx-seccomp -- CMD`.

mod common;

use std::path::PathBuf;

use sbx_testutil::{As, audit_events, identities, run_as, stderr, stdout};

fn sibling(name: &str) -> Option<PathBuf> {
    let p = sbx_testutil::bin("sbx-net").with_file_name(name);
    p.exists().then_some(p)
}

fn marker(out: &str, key: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.strip_prefix(&format!("{key}=")))
        .map(str::to_string)
        .collect()
}

fn one_id_two_tools(log: &std::path::Path, tools: &[&str]) {
    let evs = audit_events(log);
    let ids: std::collections::BTreeSet<String> = evs
        .iter()
        .map(|e| e["sbx_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 1, "one sandbox id across the chain: {ids:?}");
    for t in tools {
        assert!(evs.iter().any(|e| e["tool"] == *t), "no event from {t}");
    }
}

#[test]
fn nested_sbx_net_goes_through_both_gateways_with_one_audit_log() {
    let w = world_or_skip!();
    let inner = sbx_testutil::bin("sbx-net");
    for who in identities() {
        let (_d, log) = common::World::audit_dir();
        let script = "curl -sS -m5 http://allowed.test/; echo A=$?; \
             curl -sS -m5 -o /dev/null http://denied.test/ 2>/dev/null; echo D=$?";
        let mut c = sbx_testutil::tool("sbx-net");
        c.arg("--audit-log").arg(&log);
        c.arg(format!("--dns-upstream={}", w.dns.ip));
        c.args([
            "--allow=allowed.test",
            "--dns-rebind-allow=allowed.test",
            "--",
        ]);
        // The inner sbx-net allows more than the outer one: the outer still
        // bounds it. Its upstream is whatever resolv.conf says: redirected.
        c.arg(&inner).args([
            "--allow=allowed.test",
            "--allow=denied.test",
            "--dns-rebind-allow=test",
            "--dns-upstream=192.0.2.53",
            "--",
            "/bin/sh",
            "-c",
            script,
        ]);
        c.env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .current_dir("/");
        run_as(&mut c, who);
        let out = c.output().unwrap();
        let so = stdout(&out);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{who:?}: {so}\n{}",
            stderr(&out)
        );
        assert!(so.contains("hello from A"), "{so}");
        assert_eq!(marker(&so, "A"), ["0"], "{so}");
        assert_ne!(
            marker(&so, "D"),
            ["0"],
            "the outer allowlist must still hold: {so}"
        );
        one_id_two_tools(&log, &["sbx-net"]);
        let starts = audit_events(&log)
            .iter()
            .filter(|e| e["event"] == "net_start")
            .count();
        assert_eq!(starts, 2, "both layers log to the handed-down fd");
        sbx_testutil::assert_event(&log, "dns_refused", "alert", |e| e["name"] == "denied.test");
    }
}

#[test]
fn composes_with_sbx_fs_and_sbx_seccomp() {
    let (Some(fs), Some(sec)) = (sibling("sbx-fs"), sibling("sbx-seccomp")) else {
        sbx_testutil::skip!("sbx-fs / sbx-seccomp not built");
    };
    let w = world_or_skip!();
    for who in identities() {
        let (_d, log) = common::World::audit_dir();
        let run = |script: &str, log: &std::path::Path| {
            let mut c = sbx_testutil::tool("sbx-net");
            c.arg("--audit-log").arg(log);
            c.arg(format!("--dns-upstream={}", w.dns.ip));
            c.args([
                "--allow=allowed.test",
                "--dns-rebind-allow=allowed.test",
                "--",
            ]);
            c.arg(&fs)
                .arg("--")
                .arg(&sec)
                .args(["--", "/bin/sh", "-c", script]);
            c.env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
                .current_dir("/");
            run_as(&mut c, who);
            c.output().unwrap()
        };
        let probe = run("true", &log);
        if probe.status.code() != Some(0) {
            sbx_testutil::skip!(
                "the sbx-fs/sbx-seccomp chain does not run here: {}",
                stderr(&probe)
            );
        }
        let (_d2, log) = common::World::audit_dir();
        let out = run(
            "curl -sS -m5 http://allowed.test/; echo A=$?; \
             curl -sS -m5 -o /dev/null http://denied.test/ 2>/dev/null; echo D=$?",
            &log,
        );
        let so = stdout(&out);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{who:?}: {so}\n{}",
            stderr(&out)
        );
        assert!(so.contains("hello from A"), "{so}");
        assert_ne!(marker(&so, "D"), ["0"], "{so}");
        one_id_two_tools(&log, &["sbx-net", "sbx-fs", "sbx-seccomp"]);
        let _ = As::Root;
    }
}
