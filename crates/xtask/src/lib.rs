//! Renders man pages and shell completions from the one clap definition of
//! each tool. `cargo xtask gen` writes them; a test compares them with the
//! committed files.

use std::path::PathBuf;

use clap::CommandFactory;
use clap_complete::Shell;
use sbx_core::man::ManInfo;

/// Every tool: its clap command and its man page text.
pub fn tools() -> Vec<(clap::Command, &'static ManInfo)> {
    vec![
        (sbx_path::cli::Cli::command(), &sbx_path::cli::MAN),
        (sbx_fs::Cli::command(), &sbx_fs::MAN),
        (sbx_seccomp::Cli::command(), &sbx_seccomp::MAN),
        (sbx_cgroup::Cli::command(), &sbx_cgroup::MAN),
        (sbx_dnsproxy::Cli::command(), &sbx_dnsproxy::MAN),
        (sbx_net::Cli::command(), &sbx_net::MAN),
        (sbx_creds::Cli::command(), &sbx_creds::MAN),
        (sbx_gitguard::Cli::command(), &sbx_gitguard::MAN),
        (sbx_vm::Cli::command(), &sbx_vm::MAN),
        (sbx_container::Cli::command(), &sbx_container::MAN),
        (sbx_gvisor::Cli::command(), &sbx_gvisor::MAN),
        (sbx_policy::Cli::command(), &sbx_policy::MAN),
        (sbx_audit::Cli::command(), &sbx_audit::MAN),
        (sbx_doctor::Cli::command(), &sbx_doctor::MAN),
        (sbx_wasm::Cli::command(), &sbx_wasm::MAN),
    ]
}

/// (relative path, contents) of every generated file.
pub fn render_all() -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for (cmd, info) in tools() {
        let name = cmd.get_name().to_string();
        out.push((
            PathBuf::from(format!("man/{name}.1")),
            man_page(cmd.clone(), info),
        ));
        // git-style pages for subcommands (the SUBCOMMANDS section names them).
        for sub in cmd
            .get_subcommands()
            .filter(|s| s.get_name() != "help" && !s.is_hide_set())
        {
            // clap names are 'static; xtask is a short-lived generator.
            let full: &'static str =
                Box::leak(format!("{name}-{}", sub.get_name()).into_boxed_str());
            let page = sub
                .clone()
                .name(full)
                .bin_name(format!("{name} {}", sub.get_name()));
            out.push((PathBuf::from(format!("man/{full}.1")), man_page(page, info)));
        }
        for (shell, file) in [
            (Shell::Bash, format!("completions/bash/{name}")),
            (Shell::Zsh, format!("completions/zsh/_{name}")),
            (Shell::Fish, format!("completions/fish/{name}.fish")),
        ] {
            let mut buf = Vec::new();
            let mut c = cmd.clone();
            clap_complete::generate(shell, &mut c, name.clone(), &mut buf);
            if shell == Shell::Bash {
                buf = fix_bash_states(&name, buf);
            }
            out.push((PathBuf::from(file), buf));
        }
    }
    out
}

/// clap_complete's bash script spells a subcommand's state one way in its
/// dispatch loop (`sbx__policy__subcmd__chain`) and another in the case arms
/// (`sbx__subcmd__policy__subcmd__chain`) when the binary name holds a
/// hyphen (clap-rs/clap#6421), so no subcommand option ever completed.
/// Spell the arms the way the loop does.
fn fix_bash_states(bin: &str, script: Vec<u8>) -> Vec<u8> {
    let text = String::from_utf8(script).expect("clap_complete writes UTF-8");
    let wrong = format!("{}__subcmd__", bin.replace('-', "__subcmd__"));
    let right = format!("{}__subcmd__", bin.replace('-', "__"));
    text.replace(&wrong, &right).into_bytes()
}

fn man_page(cmd: clap::Command, info: &ManInfo) -> Vec<u8> {
    // A subcommand's page keeps its own description.
    let cmd = if cmd.get_bin_name().is_some_and(|b| b.contains(' ')) {
        cmd
    } else {
        cmd.long_about(info.about)
    };
    let man = clap_mangen::Man::new(cmd.clone()).date("");
    let mut buf = Vec::new();
    let _ = man.render_title(&mut buf);
    let _ = man.render_name_section(&mut buf);
    let _ = man.render_synopsis_section(&mut buf);
    let _ = man.render_description_section(&mut buf);
    let _ = man.render_options_section(&mut buf);
    if cmd.get_subcommands().next().is_some() {
        let _ = man.render_subcommands_section(&mut buf);
    }
    section(&mut buf, "EXIT STATUS", info.exit_status);
    section(&mut buf, "INHERITED STATE", info.inherited_state);
    section(
        &mut buf,
        "ENVIRONMENT",
        &format!(
            "{}\n{}",
            info.environment,
            sbx_core::man::COMMON_ENVIRONMENT
        ),
    );
    for (title, text) in info.extra {
        section(&mut buf, title, text);
    }
    section(&mut buf, "SEE ALSO", &see_also(&cmd));
    if cmd.get_version().is_some() {
        let _ = man.render_version_section(&mut buf);
    }
    buf
}

/// The other tools' pages (a subcommand's page names its tool's first),
/// and where the tool's full documentation is.
fn see_also(cmd: &clap::Command) -> String {
    let bin = cmd.get_bin_name().unwrap_or(cmd.get_name());
    let tool = bin.split(' ').next().unwrap_or(bin);
    let mut names: Vec<String> = Vec::new();
    if tool != bin {
        names.push(format!("{tool}(1)"));
    }
    for (c, _) in tools() {
        if c.get_name() != tool {
            names.push(format!("{}(1)", c.get_name()));
        }
    }
    let doc = tool.strip_prefix("sbx-").unwrap_or(tool);
    format!(
        "{}\n\ndocs/{doc}.md and docs/DESIGN.md in the sbx source tree.",
        names.join(", ")
    )
}

/// A roff section: paragraphs split on blank lines, lines starting with
/// "- " become tagged bullets, text escaped.
fn section(buf: &mut Vec<u8>, title: &str, text: &str) {
    buf.extend_from_slice(format!(".SH \"{title}\"\n").as_bytes());
    for para in text.trim().split("\n\n") {
        let mut first = true;
        for line in para.lines() {
            let line = line.trim_end();
            if let Some(item) = line.strip_prefix("- ") {
                buf.extend_from_slice(b".IP \\(bu 2\n");
                buf.extend_from_slice(escape(item).as_bytes());
                buf.push(b'\n');
                first = false;
            } else if first {
                buf.extend_from_slice(b".PP\n");
                buf.extend_from_slice(escape(line.trim_start()).as_bytes());
                buf.push(b'\n');
                first = false;
            } else {
                buf.extend_from_slice(escape(line.trim_start()).as_bytes());
                buf.push(b'\n');
            }
        }
    }
}

fn escape(s: &str) -> String {
    let s = s.replace('\\', "\\\\").replace('-', "\\-");
    if s.starts_with('.') || s.starts_with('\'') {
        format!("\\&{s}")
    } else {
        s
    }
}
