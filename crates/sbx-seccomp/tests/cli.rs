//! Bad input: one clear line, exit 125, the command never runs. `--print`.

mod common;
use common::*;

use sbx_testutil::assert_usage_error;

fn run(args: &[&str]) -> std::process::Output {
    let mut c = sbx_testutil::tool("sbx-seccomp");
    c.args(args);
    sbx_testutil::output(&mut c)
}

#[test]
fn bad_input_is_one_line_125_and_nothing_runs() {
    let lab = Lab::new();
    let marker = lab.path().join("ran");
    let m = marker.to_str().unwrap().to_string();
    let touch = ["--", "touch", m.as_str()];
    let malformed = lab.path().join("malformed.json");
    std::fs::write(&malformed, "{\"main\": {\"mismatch_action\": \"allow\",").unwrap();
    let bad_name = lab.path().join("badname.json");
    std::fs::write(
        &bad_name,
        r#"{"main": {"mismatch_action": "allow", "filter_action": "trap", "filter": [{"syscall": "nosuchcall"}]}}"#,
    )
    .unwrap();
    let unknown_key = lab.path().join("unknownkey.json");
    std::fs::write(
        &unknown_key,
        r#"{"main": {"mismatch_action": "allow", "filter_action": "trap", "filter": [], "extra": 1}}"#,
    )
    .unwrap();
    let same_actions = lab.path().join("same.json");
    std::fs::write(
        &same_actions,
        r#"{"main": {"mismatch_action": "allow", "filter_action": "allow", "filter": []}}"#,
    )
    .unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--deny".into(), "nosuchcall".into()],
            "--deny nosuchcall: unknown syscall",
        ),
        (
            vec!["--allow".into(), "bogus_call".into()],
            "--allow bogus_call: unknown syscall",
        ),
        (
            vec![
                "--deny".into(),
                "mount".into(),
                "--allow".into(),
                "mount".into(),
            ],
            "both name mount",
        ),
        (vec!["--action".into(), "explode".into()], "--action"),
        (vec!["--profile".into(), "lax".into()], "--profile"),
        (
            vec!["--policy".into(), malformed.display().to_string()],
            "not a seccompiler policy",
        ),
        (
            vec!["--policy".into(), "/nonexistent/policy.json".into()],
            "--policy /nonexistent/policy.json",
        ),
        (
            vec!["--policy".into(), bad_name.display().to_string()],
            "nosuchcall",
        ),
        (
            vec!["--policy".into(), unknown_key.display().to_string()],
            "extra",
        ),
        (
            vec!["--policy".into(), same_actions.display().to_string()],
            "filter 'main'",
        ),
        (vec!["--bogus".into()], "--bogus"),
    ];
    for (args, needle) in cases {
        let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
        all.extend(touch);
        let out = run(&all);
        assert_usage_error(&out, needle);
        assert!(!marker.exists(), "{args:?}: the command ran");
    }
    // No command at all.
    assert_usage_error(&run(&[]), "CMD");
    // Not found / not executable: 127 / 126, as env(1).
    assert_eq!(code(&run(&["--", "/nonexistent/cmd"])), 127);
    assert_eq!(code(&run(&["--", "/etc/hostname"])), 126);
}

#[test]
fn config_file_takes_the_same_settings() {
    let lab = Lab::new();
    let cfg = lab.path().join("cfg.json");
    std::fs::write(
        &cfg,
        r#"{"sbx-seccomp": {"no-network": true, "deny": ["getppid"]}}"#,
    )
    .unwrap();
    let (out, got) = probes(
        &lab,
        identities()[0],
        &["--config", cfg.to_str().unwrap()],
        &["getppid", "socket_inet", "socket_unix"],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(got["getppid"], EPERM);
    assert_eq!(got["socket_inet"], EPERM);
    assert!(got["socket_unix"].starts_with("ok "));
    std::fs::write(&cfg, r#"{"sbx-seccomp": {"no-networks": true}}"#).unwrap();
    let out = run(&["--config", cfg.to_str().unwrap(), "--", "true"]);
    assert_usage_error(&out, "unknown key");
}

fn row_in(s: &str, sys: &str) -> String {
    s.lines()
        .find(|l| l.split_whitespace().nth(1) == Some(sys))
        .unwrap_or_else(|| panic!("no row for {sys} in\n{s}"))
        .to_string()
}

#[test]
fn print_shows_the_filter_as_a_table() {
    let out = run(&["--print"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let s = stdout(&out);
    let row = |sys: &str| row_in(&s, sys);
    assert!(s.lines().nth(1).unwrap().starts_with("FILTER"));
    assert!(row("mount").ends_with("notify(EPERM)"));
    assert!(row("clone3").ends_with("errno(ENOSYS)"));
    assert!(row("kexec_load").ends_with("kill_process"));
    assert!(row("(x32").contains("0x40000000"));
    assert!(s.contains("CLONE_NEWUSER"));
    assert!(row("clone").contains(&format!(" {} ", libc::SYS_clone)));
    // Options show up; nothing is executed.
    let out = run(&[
        "--print",
        "--no-network",
        "--deny",
        "getppid",
        "--",
        "false",
    ]);
    assert_eq!(code(&out), 0);
    let s = stdout(&out);
    assert!(s.contains("not AF_UNIX"), "{s}");
    assert!(row_in(&s, "getppid").ends_with("notify(EPERM)"), "{s}");
    let out = run(&["--print", "--profile", "none"]);
    assert!(stdout(&out).contains("no filter"));
    let out = run(&["--print", "--profile", "strict"]);
    assert!(stdout(&out).contains("strict-allow"));
}
