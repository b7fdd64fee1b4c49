//! The committed completions work in each shell: for every tool and every
//! visible subcommand, typing the start of one of its long options and
//! pressing TAB offers that option (bash, zsh and fish, the real shells).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use sbx_testutil::skip;

/// One completion to try: the words typed, the last one a prefix of `want`.
struct Case {
    tool: String,
    words: Vec<String>,
    want: String,
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// For the top level and each visible subcommand: one long option that is
/// its own (not inherited from the parent), typed as its first letters.
fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for (cmd, _) in xtask::tools() {
        let tool = cmd.get_name().to_string();
        let mut levels = vec![(Vec::new(), cmd.clone())];
        for sub in cmd
            .get_subcommands()
            .filter(|s| s.get_name() != "help" && !s.is_hide_set())
        {
            levels.push((vec![sub.get_name().to_string()], sub.clone()));
        }
        for (path, c) in levels {
            let globals: Vec<String> = if path.is_empty() {
                Vec::new()
            } else {
                cmd.get_arguments()
                    .filter_map(|a| a.get_long().map(str::to_string))
                    .collect()
            };
            let Some(long) = c
                .get_arguments()
                .filter(|a| !a.is_hide_set() && !a.is_positional())
                .filter_map(|a| a.get_long())
                .find(|l| !globals.iter().any(|g| g == l) && *l != "help" && l.len() > 3)
            else {
                continue;
            };
            let mut words = vec![tool.clone()];
            words.extend(path);
            words.push(format!("--{}", &long[..3]));
            out.push(Case {
                tool: tool.clone(),
                words,
                want: format!("--{long}"),
            });
        }
    }
    assert!(out.len() > 15, "too few completion cases: {}", out.len());
    out
}

fn shell_runs(shell: &str) -> bool {
    Command::new(shell)
        .arg("-c")
        .arg("exit 0")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The shell's stdout; a shell still running after 30 s is killed and fails
/// the test (a completion must never hang it).
fn run(cmd: &mut Command) -> String {
    let out = sbx_testutil::output_within(cmd, Duration::from_secs(30));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[test]
fn bash_completes_subcommand_options() {
    if !shell_runs("bash") {
        skip!("bash not installed");
    }
    let mut failed = Vec::new();
    for c in cases() {
        let file: PathBuf = root().join("completions/bash").join(&c.tool);
        let func = format!("_{}", c.tool.replace('-', "__"));
        let words: Vec<String> = c.words.iter().map(|w| quote(w)).collect();
        let n = c.words.len();
        let script = format!(
            "source {file}; COMP_WORDS=({words}); COMP_CWORD={cword}; {func} {cmd} {cur} {prev}; \
             printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            file = quote(&file.display().to_string()),
            words = words.join(" "),
            cword = n - 1,
            cmd = quote(&c.words[0]),
            cur = quote(&c.words[n - 1]),
            prev = quote(&c.words[n - 2]),
        );
        let got = run(Command::new("bash").arg("--norc").arg("-c").arg(&script));
        if !got.lines().any(|l| l.trim() == c.want) {
            failed.push(format!("{:?} -> {:?} (want {})", c.words, got, c.want));
        }
    }
    assert!(failed.is_empty(), "bash completions: {failed:#?}");
}

#[test]
fn fish_completes_subcommand_options() {
    if !shell_runs("fish") {
        skip!("fish not installed (scripts/setup installs it)");
    }
    let mut failed = Vec::new();
    for c in cases() {
        let file = root().join(format!("completions/fish/{}.fish", c.tool));
        let script = format!(
            "source {}; complete -C {}",
            quote(&file.display().to_string()),
            quote(&c.words.join(" "))
        );
        let got = run(Command::new("fish")
            .arg("--no-config")
            .arg("-c")
            .arg(&script));
        if !got
            .lines()
            .any(|l| l.split('\t').next() == Some(c.want.as_str()))
        {
            failed.push(format!("{:?} -> {:?} (want {})", c.words, got, c.want));
        }
    }
    assert!(failed.is_empty(), "fish completions: {failed:#?}");
}

/// zsh completes only in its line editor: an interactive zsh in a zpty with
/// compinit over completions/zsh, `compadd` wrapped to print what it is
/// given, the line typed and TAB pressed.
#[test]
fn zsh_completes_subcommand_options() {
    if !shell_runs("zsh") {
        skip!("zsh not installed (scripts/setup installs it)");
    }
    let fpath = root().join("completions/zsh");
    let mut failed = Vec::new();
    for c in cases() {
        // clap_complete's zsh script puts sbx-container's run-form positional
        // (CMD) before its subcommands, ignoring args_conflicts_with_subcommands:
        // `sbx-container build --<TAB>` completes as a command line. Known,
        // recorded in docs/container.md; bash and fish complete it.
        if c.words[..2] == ["sbx-container", "build"] {
            continue;
        }
        let line = c.words.join(" ");
        let script = format!(
            r#"zmodload zsh/zpty
zpty z zsh -f -i
zpty -w z "fpath=({fpath} \$fpath); autoload -Uz compinit; compinit -u -D"
zpty -w z 'compadd () {{ local h; builtin compadd -O __hits "$@"; for h in $__hits; do print -r -- "<<$h>>"; done; }}'
zpty -n -w z {line}$'\t'
out=
for i in {{1..50}}; do
  sleep 0.1
  while zpty -r -t z chunk; do out+=$chunk; done
  [[ $out == *"<<{want}>>"* ]] && break
done
zpty -d z
print -r -- "$out"
"#,
            fpath = quote(&fpath.display().to_string()),
            line = quote(&line),
            want = c.want,
        );
        let got = run(Command::new("zsh").arg("-f").arg("-c").arg(&script));
        if !got.contains(&format!("<<{}>>", c.want)) {
            failed.push(format!("{line:?} (want {})", c.want));
        }
    }
    assert!(failed.is_empty(), "zsh completions: {failed:#?}");
}
