//! sbx-policy from the command line: bad input, the compiled --config file
//! as each tool reads it, merging, explain, and the decision matrix.

use std::path::{Path, PathBuf};
use std::process::Command;

use sbx_testutil::{assert_usage_error, code, stderr, stdout};
use serde_json::Value;

struct Proj {
    _d: tempfile::TempDir,
    root: PathBuf,
    home: PathBuf,
}

fn proj() -> Proj {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("proj").canonicalize().unwrap_or_else(|_| {
        std::fs::create_dir_all(d.path().join("proj")).unwrap();
        d.path().join("proj").canonicalize().unwrap()
    });
    std::fs::create_dir_all(root.join(".claude")).unwrap();
    std::fs::create_dir_all(root.join("src")).unwrap();
    let home = d.path().join("home").canonicalize().unwrap_or_else(|_| {
        std::fs::create_dir_all(d.path().join("home/.ssh")).unwrap();
        d.path().join("home").canonicalize().unwrap()
    });
    Proj { _d: d, root, home }
}

fn policy(p: &Proj, args: &[&str]) -> Command {
    let mut c = sbx_testutil::tool("sbx-policy");
    // Defaults right after the subcommand: a later flag overrides them.
    c.args(&args[..1.min(args.len())]);
    if args
        .first()
        .is_some_and(|a| ["compile", "explain", "chain"].contains(a))
    {
        c.arg("--cwd")
            .arg(&p.root)
            .arg("--home")
            .arg(&p.home)
            .arg("--managed")
            .arg(p.root.join("no-managed.json"));
    }
    c.args(args.iter().skip(1)).current_dir(&p.root);
    c
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn compile(p: &Proj) -> Value {
    compile_with(p, &[])
}

fn compile_with(p: &Proj, extra: &[&str]) -> Value {
    let mut args = vec!["compile"];
    args.extend_from_slice(extra);
    let out = policy(p, &args).output().unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    serde_json::from_str(&stdout(&out)).unwrap()
}

fn strs(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(|s| s.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

#[test]
fn bad_input_is_one_line_naming_file_line_and_rule_and_nothing_runs() {
    let p = proj();
    let s = p.root.join(".claude/settings.json");
    let marker = p.root.join("ran");
    let cases: &[(&str, &[&str])] = &[
        (
            "{\n  \"permissions\": {\n    \"allow\": [\"Read(./x)\"\n",
            &["not valid JSON", ":4"],
        ),
        (
            "{\n  \"permissions\": {\n    \"allow\": [\"read(x)\"]\n  }\n}\n",
            &[
                "unknown rule kind 'read' (did you mean 'Read'?)",
                ":3",
                "read(x)",
            ],
        ),
        (
            "{\n  \"permissions\": {\n    \"deny\": [\n      \"Read(./a\"\n    ]\n  }\n}\n",
            &["Read(./a", ":4", "')'"],
        ),
        (
            "{\"permissions\": {\"allow\": [\"Read(~bob/x)\"]}}",
            &["~user", "Read(~bob/x)", ":1"],
        ),
        (
            "{\"permissions\": {\"allow\": [\"Edit(//../../x)\"]}}",
            &["does not resolve"],
        ),
        (
            "{\"permissions\": {\"allow\": [\"WebFetch(https://x)\"]}}",
            &["domain:"],
        ),
        (
            "{\"sandbox\": {\"network\": {\"allowedDomains\": [\"bad domain\"]}}}",
            &["allowedDomains", "bad domain"],
        ),
        (
            "{\"permissions\": {\"allow\": \"Read(x)\"}}",
            &["must be an array"],
        ),
        ("[1]", &["top level"]),
    ];
    for (text, needles) in cases {
        write(&s, text);
        for sub in ["compile", "explain"] {
            let out = policy(&p, &[sub]).output().unwrap();
            assert_usage_error(&out, needles[0]);
            let e = stderr(&out);
            assert!(e.contains(&s.display().to_string()), "names the file: {e}");
            for n in *needles {
                assert!(e.contains(n), "{text:?}: wants {n:?} in {e}");
            }
        }
        let out = policy(&p, &["chain", "--print", "--", "touch"])
            .arg(&marker)
            .output()
            .unwrap();
        assert_eq!(code(&out), 125);
        let out = policy(&p, &["chain", "--", "touch"])
            .arg(&marker)
            .output()
            .unwrap();
        assert_eq!(code(&out), 125, "{}", stderr(&out));
        assert!(!marker.exists(), "nothing runs on bad settings");
    }
    std::fs::remove_file(&s).unwrap();
    for (args, needle) in [
        (
            &["compile", "--settings", "/nonexistent/s.json"][..],
            "/nonexistent/s.json",
        ),
        (&["compile", "--memory", "lots"][..], "--memory"),
        (&["compile", "--pids", "0"][..], "--pids"),
        (&["compile", "--timeout", "soon"][..], "--timeout"),
        (&["chain", "--trust", "some", "--", "true"][..], "--trust"),
        (&["chain", "--print"][..], "CMD"),
        (&["bogus"][..], "bogus"),
    ] {
        let out = policy(&p, args).output().unwrap();
        assert_usage_error(&out, needle);
    }
}

#[test]
fn compiled_config_is_read_by_every_tool_with_config() {
    let p = proj();
    std::fs::write(p.home.join(".gitconfig"), "[user]\n").unwrap();
    write(
        &p.root.join(".claude/settings.json"),
        r#"{"permissions": {"allow": ["Read(~/.gitconfig)", "Edit(./src/**)", "Bash(git:*)", "WebFetch(domain:example.com)"],
             "deny": ["Read(~/.ssh/**)", "Bash(curl:*)"]},
            "sandbox": {"network": {"allowedDomains": ["*.pypi.org"]}}}"#,
    );
    std::process::Command::new("git")
        .arg("init")
        .arg("-q")
        .arg(&p.root)
        .status()
        .unwrap();
    // Strict mode: the kernel execute allowlist is in sbx-seccomp's section.
    let v = compile_with(&p, &["--exec-allowlist", "strict"]);
    let cfg = p.root.join("sbx.json");
    std::fs::write(&cfg, serde_json::to_string(&v).unwrap()).unwrap();
    for (tool, sub) in [
        ("sbx-fs", None),
        ("sbx-net", None),
        ("sbx-seccomp", None),
        ("sbx-cgroup", None),
        ("sbx-gitguard", Some("run")),
        ("sbx-path", Some("check")),
    ] {
        let mut c = sbx_testutil::tool(tool);
        if let Some(s) = sub {
            c.arg(s);
        }
        // --help after the config: the config's keys are checked first.
        c.arg("--config").arg(&cfg).arg("--help");
        let out = c.output().unwrap();
        assert_eq!(
            code(&out),
            0,
            "{tool} rejects its section: {}",
            stderr(&out)
        );
    }
    assert_eq!(strs(&v["sbx-net"]["allow"]), ["example.com", "*.pypi.org"]);
    assert!(strs(&v["sbx-fs"]["ro"]).contains(&p.home.join(".gitconfig").display().to_string()));
    assert!(strs(&v["sbx-fs"]["rw"]).contains(&p.root.display().to_string()));
    assert!(strs(&v["sbx-fs"]["deny"]).contains(&p.home.join(".ssh").display().to_string()));
    assert!(
        strs(&v["sbx-fs"]["deny"])
            .iter()
            .any(|d| d.ends_with("/curl"))
    );
    assert!(
        strs(&v["sbx-seccomp"]["allow-exec"])
            .iter()
            .any(|d| d.ends_with("/git"))
    );
    // Invoke mode (the default): no kernel execute allowlist.
    assert!(compile(&p)["sbx-seccomp"].get("allow-exec").is_none());
    assert_eq!(v["sbx-gitguard"]["repo"], p.root.display().to_string());
    assert_eq!(v["sbx-seccomp"]["profile"], "default");
    assert!(v["sbx-cgroup"]["memory"].is_string() && v["sbx-cgroup"]["pids"] == "2048");
    // No rule removes an invariant: the default deny list is never dropped.
    assert!(v["sbx-fs"].get("no-default-deny").is_none());
}

#[test]
fn files_merge_as_claude_code_merges_them() {
    let p = proj();
    std::fs::create_dir_all(p.root.join("docs")).unwrap();
    std::fs::create_dir_all(p.root.join("data")).unwrap();
    std::fs::create_dir_all(p.home.join("notes")).unwrap();
    // user: grants; project: more grants; local: a deny; managed: a network deny.
    write(
        &p.home.join(".claude/settings.json"),
        r#"{"permissions": {"allow": ["Read(~/notes/**)", "Edit(./docs/**)", "WebFetch(domain:a.example)"]}}"#,
    );
    write(
        &p.root.join(".claude/settings.json"),
        r#"{"permissions": {"allow": ["Edit(/data/**)", "WebFetch(domain:b.example)"]}}"#,
    );
    write(
        &p.root.join(".claude/settings.local.json"),
        r#"{"permissions": {"deny": ["Edit(./docs/**)"]}}"#,
    );
    let managed = p.root.join("managed.json");
    write(
        &managed,
        r#"{"sandbox": {"network": {"deniedDomains": ["b.example"]}}}"#,
    );
    let out = policy(&p, &["compile", "--managed"])
        .arg(&managed)
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let rw = strs(&v["sbx-fs"]["rw"]);
    let ro = strs(&v["sbx-fs"]["ro"]);
    let d = |s: &str| p.root.join(s).display().to_string();
    // `/data` is relative to the project's settings file (and, inside the
    // writable project, needs no mount of its own).
    assert_eq!(rw, [p.root.display().to_string()], "{rw:?}");
    let ex = policy(&p, &["explain", "--managed"])
        .arg(&managed)
        .output()
        .unwrap();
    assert!(
        stdout(&ex).contains(&format!("--rw {}", d("data"))),
        "{}",
        stdout(&ex)
    );
    assert!(
        !rw.contains(&d("docs")),
        "deny beats allow (local deny over user allow): {rw:?}"
    );
    assert!(
        ro.contains(&d("docs")),
        "a denied write over a writable grant is read-only: {ro:?}"
    );
    assert!(ro.contains(&p.home.join("notes").display().to_string()));
    assert_eq!(
        strs(&v["sbx-net"]["allow"]),
        ["a.example"],
        "managed deniedDomains removes b.example"
    );
    // Explain names every file with its scope.
    let out = policy(&p, &["explain", "--managed"])
        .arg(&managed)
        .output()
        .unwrap();
    let e = stdout(&out);
    for s in [
        "(user)",
        "(project)",
        "(local)",
        "(managed)",
        "revoked by deny",
    ] {
        assert!(e.contains(s), "{s}: {e}");
    }
}

#[test]
fn explain_lists_what_is_not_enforced() {
    let p = proj();
    write(
        &p.root.join(".claude/settings.json"),
        "{\"permissions\": {\n\"allow\": [\"Bash(npm run test:*)\", \"Task\", \"Read(**/*.md)\", \"WebFetch\"],\n\"deny\": [\"Bash(git push:*)\", \"Edit(*.lock)\"],\n\"ask\": [\"Bash(rm:*)\"]}}",
    );
    let out = policy(&p, &["explain"]).output().unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let e = stdout(&out);
    let tail = e
        .split("NOT ENFORCED by any kernel layer")
        .nth(1)
        .unwrap_or_else(|| panic!("{e}"));
    // Argument patterns are checked on the agent's command only.
    for r in ["Bash(git push:*)", "Bash(npm run test:*)"] {
        assert!(
            e.lines()
                .any(|l| l.contains("checked at invocation") && l.contains(r)),
            "{r} must be checked at invocation: {e}"
        );
    }
    assert!(e.contains("Bash rules: invoke mode"), "{e}");
    for r in [
        "Edit(*.lock)",
        "Task",
        "Read(**/*.md)",
        "WebFetch",
        "Bash(rm:*)",
    ] {
        assert!(tail.contains(r), "{r} must be listed as not enforced: {e}");
    }
    assert!(
        tail.contains(":3 (project)") && tail.contains(":4 (project)"),
        "file:line of each: {e}"
    );
    for s in ["ACCESS", "DENY", "LIMIT", "STATUS", "memory", ".git/hooks"] {
        assert!(e.contains(s), "{s}: {e}");
    }
}

/// The project's `.claude/settings.json` can come with a cloned repository:
/// its rules are untrusted text. `explain` printed them raw, so a rule
/// holding ESC sequences (set the window title, erase the line, OSC 52 to
/// the clipboard), a carriage return, a C1 CSI, a bidi override or a
/// newline reached the user's terminal, painted over the tables or forged
/// a row. Every such character is shown escaped now.
#[test]
fn explain_escapes_control_characters_of_the_rules() {
    let p = proj();
    let e = "\u{1b}]0;PWN\u{7}\u{1b}]52;c;ZXZpbA==\u{7}\u{1b}[2K\r\u{9b}\u{202e}";
    let settings = serde_json::json!({"permissions": {
        "allow": [format!("Read(/opt/x{e}/**)"), format!("Bash(git{e}:*)"), format!("Read(./sec\nret{e})")],
        "deny": [format!("Bash(rm{e}:*)")],
    }});
    write(&p.root.join(".claude/settings.json"), &settings.to_string());
    let out = policy(&p, &["explain"]).output().unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(
        !text.contains(['\u{1b}', '\u{7}', '\r', '\u{9b}', '\u{202e}']),
        "raw control characters reached the terminal: {text:?}"
    );
    assert!(
        text.contains(
            "Read(./sec\\nret\\e]0;PWN\\x07\\e]52;c;ZXZpbA==\\x07\\e[2K\\r\\x9b\\u{202e})"
        ),
        "{text}"
    );
    assert!(
        !text.lines().any(|l| l.starts_with("ret")),
        "a rule split a line: {text}"
    );
}

#[test]
fn invariants_win_over_rules() {
    let p = proj();
    std::fs::create_dir_all(p.root.join(".git/hooks")).unwrap();
    write(
        &p.root.join(".claude/settings.json"),
        r#"{"permissions": {"allow": ["Edit(./.git/hooks/**)", "Edit(./.claude/settings.json)"]}}"#,
    );
    let v = compile(&p);
    let rw = strs(&v["sbx-fs"]["rw"]);
    assert_eq!(
        rw,
        [p.root.display().to_string()],
        "no writable grant inside an invariant: {rw:?}"
    );
    let out = policy(&p, &["explain"]).output().unwrap();
    assert!(stdout(&out).contains("invariant wins"), "{}", stdout(&out));
}

#[test]
fn decision_matrix() {
    let p = proj();
    let print = |args: &[&str]| {
        let mut a = vec!["chain", "--print"];
        a.extend_from_slice(args);
        a.extend_from_slice(&["--", "make", "test"]);
        policy(&p, &a).output().unwrap()
    };
    let out = print(&["--trust", "low", "--cgroup"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let s = stdout(&out);
    let order = [
        "sbx-cgroup ",
        "sbx-net ",
        "sbx-fs ",
        "sbx-seccomp ",
        "make test",
    ];
    let pos: Vec<usize> = order
        .iter()
        .map(|w| s.find(w).unwrap_or_else(|| panic!("{w}: {s}")))
        .collect();
    assert!(pos.windows(2).all(|w| w[0] < w[1]), "canonical order: {s}");
    assert!(
        !s.contains("sbx-gitguard run"),
        "no repository, no gitguard run: {s}"
    );
    // Something is writable: repositories planted there are checked.
    assert!(
        s.contains("sbx-gitguard plants --dir "),
        "the plant check is in every chain with a writable directory: {s}"
    );
    assert!(
        s.contains("--profile default") && s.contains("--memory") && s.contains("--timeout 2h")
    );
    let out = print(&[
        "--trust", "low", "--memory", "1G", "--pids", "99", "--cgroup",
    ]);
    let s = stdout(&out);
    assert!(s.contains("--memory 1G") && s.contains("--pids 99"), "{s}");
    // --layers: each tool gets its section; an sbx-creds section brings sbx-creds in, outermost.
    let layers = p.root.join("layers.json");
    std::fs::write(
        &layers,
        r#"{"sbx-creds": {"vault-addr": "http://127.0.0.1:8200"}, "sbx-net": {"dns-upstream": ["10.0.0.53"]}}"#,
    )
    .unwrap();
    let out = print(&["--layers", layers.to_str().unwrap(), "--no-cgroup"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let s = stdout(&out);
    let creds = s
        .find("sbx-creds --config")
        .unwrap_or_else(|| panic!("{s}"));
    let net = s.find("sbx-net --config").unwrap_or_else(|| panic!("{s}"));
    assert!(
        creds < net && !s.contains("sbx-fs --config") && !s.contains("sbx-cgroup --"),
        "{s}"
    );
    std::fs::write(&layers, r#"{"sbx-bogus": {}}"#).unwrap();
    assert_usage_error(
        &print(&["--layers", layers.to_str().unwrap()]),
        "unknown section",
    );
    let out = print(&["--trust", "full"]);
    let s = stdout(&out);
    assert!(
        s.contains("sbx-path") && s.contains("SBX_PATH_ALLOW_WRITE=") && !s.contains("sbx-fs"),
        "{s}"
    );
    if sbx_testutil::bin("sbx-policy")
        .with_file_name("sbx-container")
        .exists()
    {
        let out = print(&["--container"]);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let s = stdout(&out);
        assert!(
            s.contains("sbx-container --rw") && s.contains("--net none") && !s.contains("sbx-fs"),
            "{s}"
        );
    }
    // The plugin tier: sbx-wasm with the directory grants as preopens.
    for args in [&["--plugin"][..], &["--trust", "plugin"][..]] {
        let out = print(args);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let s = stdout(&out);
        // sbx-wasm runs sbx-fs itself: no sbx-fs layer in the chain.
        assert!(
            s.contains("sbx-wasm --rw") && s.contains("--memory") && !s.contains("/sbx-fs "),
            "{s}"
        );
    }
    let out = print(&["--trust", "zero", "--latency-sensitive"]);
    if sbx_testutil::bin("sbx-policy")
        .with_file_name("sbx-vm")
        .exists()
    {
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(
            stdout(&out).contains("sbx-vm --backend firecracker"),
            "{}",
            stdout(&out)
        );
    }
    // Alone, without the other binaries: each tier says it is not available.
    let d = tempfile::tempdir().unwrap();
    let lone = d.path().join("sbx-policy");
    std::fs::copy(sbx_testutil::bin("sbx-policy"), &lone).unwrap();
    for (args, needle) in [
        (
            &["--trust", "zero", "--latency-sensitive"][..],
            "Firecracker microVM tier (sbx-vm)",
        ),
        (&["--trust", "zero"][..], "sbx-vm"),
        (&["--trust", "low"][..], "low trust"),
        (&["--container"][..], "container tier (sbx-container)"),
        (&["--trust", "plugin"][..], "plugin tier (sbx-wasm)"),
    ] {
        let mut c = Command::new(&lone);
        c.args(["chain", "--print", "--cwd"])
            .arg(&p.root)
            .args(args)
            .args(["--", "true"]);
        c.env("PATH", "/usr/bin:/bin").env_remove("SBX_BIN");
        let out = c.output().unwrap();
        if args.len() == 2 && args[1] == "zero" && sbx_testutil::have("runsc") {
            continue;
        }
        assert_usage_error(&out, needle);
        assert!(stderr(&out).contains("not installed"), "{}", stderr(&out));
    }
}

#[test]
fn network_and_bash_mapping() {
    let p = proj();
    write(
        &p.root.join(".claude/settings.json"),
        r#"{"permissions": {"allow": ["WebFetch(domain:*.github.com)", "WebFetch(domain:api.example.com)",
                                      "WebFetch(domain:docs.example.com)", "WebSearch", "Bash(sh)"],
                            "deny": ["WebFetch(domain:docs.example.com)", "Bash(curl:*)"]},
            "sandbox": {"network": {"allowedDomains": ["pypi.org", "*.example.com"],
                                    "deniedDomains": ["evil.github.com"]}}}"#,
    );
    let out = policy(
        &p,
        &[
            "compile",
            "--search-domain",
            "search.example.net",
            "--exec-allowlist",
            "strict",
        ],
    )
    .output()
    .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let allow = strs(&v["sbx-net"]["allow"]);
    // The wildcard covering a denied name is dropped whole; a denied name is
    // removed; a wildcard that covers a denied name is dropped too.
    assert!(!allow.iter().any(|a| a.contains("github")), "{allow:?}");
    assert!(
        !allow.contains(&"docs.example.com".to_string()),
        "{allow:?}"
    );
    assert!(!allow.contains(&"*.example.com".to_string()), "{allow:?}");
    assert!(
        allow.contains(&"api.example.com".to_string()) && allow.contains(&"pypi.org".to_string()),
        "{allow:?}"
    );
    assert!(
        allow.contains(&"search.example.net".to_string()),
        "WebSearch opens the search domains: {allow:?}"
    );
    // Bash deny hides the program; the allowlist holds sh.
    assert!(
        strs(&v["sbx-fs"]["deny"])
            .iter()
            .any(|d| d.ends_with("/curl"))
    );
    let exec = strs(&v["sbx-seccomp"]["allow-exec"]);
    assert!(
        exec.iter()
            .any(|d| d.ends_with("sh") || d.ends_with("dash")),
        "{exec:?}"
    );
    // `Bash` alone lifts the allowlist.
    write(
        &p.root.join(".claude/settings.json"),
        r#"{"permissions": {"allow": ["Bash", "Bash(sh)"]}}"#,
    );
    assert!(
        compile_with(&p, &["--exec-allowlist", "strict"])["sbx-seccomp"]
            .get("allow-exec")
            .is_none()
    );
}

/// With stderr gone, settings with a warning (a rule of an unknown tool)
/// compile, explain and print the chain as with stderr open, and bad
/// input is 125: the warning was an `eprintln!` that panicked (101).
#[test]
fn a_gone_stderr_changes_neither_the_status_nor_stdout() {
    let p = proj();
    write(
        &p.root.join(".claude/settings.json"),
        "{\"permissions\": {\"allow\": [\"Frobnicate(x)\"]}}",
    );
    let runs: &[&[&str]] = &[
        &["compile"],
        &["explain"],
        &["chain", "--print", "--", "make", "test"],
    ];
    for args in runs {
        let open = policy(&p, args).output().unwrap();
        assert_eq!(code(&open), 0, "{args:?}: {}", stderr(&open));
        assert!(
            stderr(&open).contains("sbx-policy: warning: ")
                && stderr(&open).contains("unknown tool 'Frobnicate'"),
            "{args:?}: {}",
            stderr(&open)
        );
        for how in sbx_testutil::STDERR_GONE {
            let mut c = policy(&p, args);
            sbx_testutil::stderr_gone(&mut c, how);
            let out = c.output().unwrap();
            assert_eq!(code(&out), 0, "{args:?} {how}");
            assert_eq!(stdout(&out), stdout(&open), "{args:?} {how}");
        }
    }
    for how in sbx_testutil::STDERR_GONE {
        let mut c = policy(&p, &["compile", "--memory", "lots"]);
        sbx_testutil::stderr_gone(&mut c, how);
        let out = c.output().unwrap();
        assert_eq!(code(&out), 125, "{how}");
        assert_eq!(stdout(&out), "", "{how}");
    }
}
