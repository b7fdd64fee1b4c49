//! The committed man pages and completions are what the clap definitions
//! produce; regenerate with `cargo xtask gen`.

#[test]
fn man_and_completions_are_fresh() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut stale = Vec::new();
    for (rel, want) in xtask::render_all() {
        match std::fs::read(root.join(&rel)) {
            Ok(have) if have == want => {}
            _ => stale.push(rel.display().to_string()),
        }
    }
    assert!(
        stale.is_empty(),
        "stale generated files (run `cargo xtask gen`): {stale:?}"
    );
}

#[test]
fn every_man_page_has_exit_status_inherited_state_environment_and_see_also() {
    for (rel, data) in xtask::render_all() {
        if rel.starts_with("man") {
            let text = String::from_utf8(data).unwrap();
            assert!(text.contains(".SH \"EXIT STATUS\""), "{}", rel.display());
            for section in ["INHERITED STATE", "ENVIRONMENT", "SEE ALSO"] {
                assert!(
                    text.contains(&format!(".SH \"{section}\"")),
                    "{}: no {section}",
                    rel.display()
                );
            }
        }
    }
}

/// One vocabulary (issue 21): the same idea has the same flag in every
/// tool; the old spellings still parse, hidden, for one release
/// (CHANGELOG.md).
#[test]
fn one_vocabulary_with_hidden_old_spellings() {
    // (tool, canonical, old, a value)
    let renamed = [
        ("sbx-container", "--setenv", "--env", "A=1"),
        ("sbx-container", "--chdir", "--workdir", "/w"),
        ("sbx-container", "--rlimit", "--ulimit", "nofile=64"),
        ("sbx-vm", "--memory", "--mem", "1G"),
        ("sbx-vm", "--setenv", "--env", "A=1"),
        ("sbx-policy chain", "--chdir", "--cwd", "/w"),
    ];
    let tools = xtask::tools();
    let find = |name: &str| {
        let mut parts = name.split(' ');
        let top = parts.next().unwrap();
        let mut c = tools
            .iter()
            .find(|(c, _)| c.get_name() == top)
            .unwrap_or_else(|| panic!("{top}"))
            .0
            .clone();
        if let Some(sub) = parts.next() {
            c = c.find_subcommand(sub).unwrap().clone();
        }
        c
    };
    for (tool, new, old, value) in renamed {
        let mut cmd = find(tool);
        let help = cmd.render_long_help().to_string();
        assert!(help.contains(new), "{tool}: {new} not in --help");
        assert!(
            !help
                .lines()
                .any(|l| l.trim_start().split([' ', '=', ',']).next() == Some(old)),
            "{tool}: old {old} shown in --help"
        );
        for flag in [new, old] {
            let argv = [
                tool.split(' ').next_back().unwrap(),
                flag,
                value,
                "--",
                "true",
            ];
            if let Err(e) = find(tool).try_get_matches_from(argv) {
                panic!("{tool} {flag} {value}: {e}");
            }
        }
    }
    // Every tool that binds takes SRC[:DST].
    for (tool, flag) in [
        ("sbx-fs", "--ro"),
        ("sbx-fs", "--rw"),
        ("sbx-container", "--ro"),
        ("sbx-container", "--rw"),
    ] {
        let arg = find(tool)
            .get_arguments()
            .find(|a| a.get_long() == flag.strip_prefix("--"))
            .unwrap()
            .clone();
        let names: Vec<_> = arg
            .get_value_names()
            .unwrap()
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert_eq!(names, ["SRC[:DST]"], "{tool} {flag}");
    }
}
