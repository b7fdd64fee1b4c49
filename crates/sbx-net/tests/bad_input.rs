//! Bad input: one clear line, exit 125, the command never runs, nothing left.

use sbx_testutil::{assert_usage_error, identities, run_as, shared_tempdir};

fn run(who: sbx_testutil::As, args: &[&str], marker: &std::path::Path) -> std::process::Output {
    let mut c = sbx_testutil::tool("sbx-net");
    c.args(args).arg("--").arg("/usr/bin/touch").arg(marker);
    run_as(&mut c, who);
    c.output().unwrap()
}

#[test]
fn bad_allowlist_entries_are_one_line_125_and_nothing_runs() {
    let d = shared_tempdir();
    let marker = d.path().join("ran");
    let unreadable = d.path().join("secret-allow");
    std::fs::write(&unreadable, "example.com\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&unreadable, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let bad_line = d.path().join("bad-allow");
    std::fs::write(&bad_line, "# ok\nexample.com:443\n*.com\n").unwrap();
    sbx_testutil::chown_to_test_user(&bad_line);
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["--allow=*.com".into()], "--allow '*.com'"),
        (vec!["--allow=*".into()], "--allow '*'"),
        (vec!["--allow=example.com:0".into()], "port 0"),
        (vec!["--allow=example.com:70000".into()], "port 70000"),
        (vec!["--allow=example.com:9-1".into()], "reversed"),
        (vec!["--allow=exa mple.com".into()], "--allow"),
        (
            vec!["--allow-cidr=10.0.0.0/33".into()],
            "--allow-cidr '10.0.0.0/33'",
        ),
        (vec!["--allow-cidr=10.0.0.1/8".into()], "host bits"),
        (vec!["--allow-cidr=example.com".into()], "--allow-cidr"),
        (vec!["--allow-cidr=300.1.2.3/8".into()], "--allow-cidr"),
        (
            vec!["--allow-file=/nonexistent/allow".into()],
            "--allow-file /nonexistent/allow",
        ),
        (
            vec![format!("--allow-file={}", bad_line.display())],
            "line 3",
        ),
        (vec!["--connect-timeout=soon".into()], "--connect-timeout"),
        (
            vec!["--allow-host-address=example.com".into()],
            "--allow-host-address",
        ),
    ];
    for who in identities() {
        for (args, needle) in &cases {
            let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
            let out = run(who, &a, &marker);
            assert_usage_error(&out, needle);
            assert!(!marker.exists(), "{args:?}: the command ran");
        }
        if who == sbx_testutil::As::User {
            // Root's 0600 file, read by the test user.
            let out = run(
                who,
                &[&format!("--allow-file={}", unreadable.display())],
                &marker,
            );
            assert_usage_error(&out, "Permission denied");
            assert!(!marker.exists());
        }
    }
}

#[test]
fn missing_command_is_127_and_not_executable_126() {
    let d = shared_tempdir();
    let plain = d.path().join("plain");
    std::fs::write(&plain, "#!/bin/sh\n").unwrap();
    sbx_testutil::chown_to_test_user(&plain);
    for who in identities() {
        let mut c = sbx_testutil::tool("sbx-net");
        c.args(["--", "/nonexistent/cmd"]);
        run_as(&mut c, who);
        assert_eq!(c.output().unwrap().status.code(), Some(127));
        let mut c = sbx_testutil::tool("sbx-net");
        c.arg("--").arg(&plain);
        run_as(&mut c, who);
        assert_eq!(c.output().unwrap().status.code(), Some(126));
    }
}

#[test]
fn exit_status_passes_through() {
    for who in identities() {
        let mut c = sbx_testutil::tool("sbx-net");
        c.args(["--", "/bin/sh", "-c", "exit 7"]);
        run_as(&mut c, who);
        assert_eq!(c.output().unwrap().status.code(), Some(7));
        let mut c = sbx_testutil::tool("sbx-net");
        c.args(["--", "/bin/sh", "-c", "kill -TERM $$"]);
        run_as(&mut c, who);
        assert_eq!(c.output().unwrap().status.code(), Some(128 + 15));
    }
}

#[test]
fn config_file_takes_the_same_settings() {
    let d = shared_tempdir();
    let cfg = d.path().join("c.json");
    let log = d.path().join("audit.log");
    std::fs::write(
        &cfg,
        r#"{"sbx-net": {"allow": ["example.com:443"], "allow_cidr": "10.9.0.0/16:22", "sni_check": true, "dns_upstream": ["192.0.2.1"]}}"#,
    )
    .unwrap();
    let bad = d.path().join("bad.json");
    std::fs::write(&bad, r#"{"sbx-net": {"alow": ["example.com"]}}"#).unwrap();
    for p in [&cfg, &bad] {
        sbx_testutil::chown_to_test_user(p);
    }
    for who in identities() {
        let _ = std::fs::remove_file(&log);
        let mut c = sbx_testutil::tool("sbx-net");
        c.arg("--config")
            .arg(&cfg)
            .arg("--audit-log")
            .arg(&log)
            .args(["--", "true"]);
        run_as(&mut c, who);
        let out = c.output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", sbx_testutil::stderr(&out));
        let ev = sbx_testutil::assert_event(&log, "net_start", "info", |_| true);
        assert_eq!(ev["names"], serde_json::json!(["example.com:443"]));
        assert_eq!(ev["cidrs"], serde_json::json!(["10.9.0.0/16:22"]));
        assert_eq!(ev["sni_check"], true);
        let mut c = sbx_testutil::tool("sbx-net");
        c.arg("--config").arg(&bad).args(["--", "true"]);
        run_as(&mut c, who);
        assert_usage_error(&c.output().unwrap(), "sbx-net.alow: unknown key");
    }
}
