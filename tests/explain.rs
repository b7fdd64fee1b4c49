//! `sbx-policy explain` tells the whole truth, and `chain` enforces what it
//! says (issue 21): a grant a deny takes away is shown revoked, not
//! dropped; `additionalDirectories` read as Claude Code reads them
//! (absolute paths stay absolute); the managed settings' managed-only
//! switches set lower files' entries aside, each shown as ignored;
//! `--json` is the same account as one object. As root and as the
//! unprivileged test user; the grants are checked inside the sandbox.

mod common;
use common::*;

use std::process::Output;

use sbx_testutil::{As, identities, stderr, stdout};

struct Case {
    t: ChainTree,
    data: std::path::PathBuf,
    managed: std::path::PathBuf,
}

/// A project whose settings allow a domain, a read of a data directory
/// outside the project and name it in additionalDirectories by its
/// absolute path.
fn case(who: As, project: &str, managed: Option<&str>) -> Case {
    let t = ChainTree::new();
    let base = t.proj.parent().unwrap().to_path_buf();
    let data = base.join("data");
    write(&data.join("note.txt"), "outside data\n");
    let project = project.replace("DATA", &data.display().to_string());
    write(&t.proj.join(".claude/settings.json"), &project);
    let m = base.join("managed.json");
    if let Some(s) = managed {
        write(&m, s);
    }
    t.own(who);
    Case {
        t,
        data,
        managed: m,
    }
}

fn policy(c: &Case, who: As, args: &[&str]) -> Output {
    let mut cmd = sbx_testutil::tool("sbx-policy");
    cmd.arg(args[0])
        .arg("--managed")
        .arg(&c.managed)
        .arg("--home")
        .arg(&c.t.home)
        .args(&args[1..]);
    cmd.current_dir(&c.t.proj)
        .env("PATH", PATH)
        .env("XDG_STATE_HOME", &c.t.state)
        .env_remove("SBX_AUDIT_LOG");
    sbx_testutil::run_as(&mut cmd, who);
    cmd.env("HOME", &c.t.home);
    sbx_testutil::output_within(&mut cmd, std::time::Duration::from_secs(120))
}

fn explain_json(c: &Case, who: As) -> serde_json::Value {
    let out = policy(c, who, &["explain", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    serde_json::from_str(&stdout(&out)).unwrap_or_else(|e| panic!("{e}: {}", stdout(&out)))
}

fn rule<'a>(j: &'a serde_json::Value, text: &str) -> Vec<&'a serde_json::Value> {
    j["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["rule"] == text)
        .collect()
}

fn chain(c: &Case, who: As, script: &str) -> Output {
    policy(c, who, &["chain", "--", "sh", "-c", script])
}

#[test]
fn a_grant_a_deny_takes_away_is_shown_revoked_and_not_granted() {
    for who in identities() {
        let c = case(
            who,
            r#"{"permissions": {"allow": ["WebFetch(domain:example.com)"], "deny": ["WebFetch"]}}"#,
            None,
        );
        let out = policy(&c, who, &["explain"]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let text = stdout(&out);
        let line = text
            .lines()
            .find(|l| l.contains("WebFetch(domain:example.com)"))
            .unwrap_or_else(|| panic!("{who:?}: the revoked grant vanished:\n{text}"));
        assert!(line.starts_with("revoked by deny"), "{line}");
        let j = explain_json(&c, who);
        assert_eq!(
            rule(&j, "WebFetch(domain:example.com)")[0]["status"],
            "revoked by deny"
        );
        let print = policy(&c, who, &["chain", "--print", "--", "true"]);
        assert!(
            !stdout(&print).contains("--allow example.com"),
            "{}",
            stdout(&print)
        );
    }
}

#[test]
fn additional_directories_keep_absolute_paths_absolute() {
    for who in identities() {
        let c = case(
            who,
            r#"{"permissions": {"additionalDirectories": ["DATA"]}}"#,
            None,
        );
        let label = format!("permissions.additionalDirectories: {}", c.data.display());
        let j = explain_json(&c, who);
        let r = rule(&j, &label);
        assert_eq!(r.len(), 1, "{j}");
        assert_eq!(r[0]["status"], "enforced", "{j}");
        assert!(
            j["allows"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a["access"] == "read" && a["what"] == c.data.display().to_string()),
            "{j}"
        );
        // What explain says, chain does: the file is readable inside, and
        // read-only.
        let f = c.data.join("note.txt");
        let out = chain(
            &c,
            who,
            &format!("cat '{0}'; echo x >> '{0}' || echo READONLY", f.display()),
        );
        let so = stdout(&out);
        assert!(so.contains("outside data"), "{who:?}: {so}{}", stderr(&out));
        assert!(so.contains("READONLY"), "{who:?}: {so}");
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "outside data\n");
    }
}

#[test]
fn managed_only_switches_set_lower_entries_aside_and_say_so() {
    let project = r#"{"permissions": {"allow": ["Read(/data-link/**)", "WebFetch(domain:example.com)"],
        "deny": ["Read(./private.txt)"], "additionalDirectories": []},
        "sandbox": {"network": {"allowedDomains": ["pypi.org"]}},
        "allowManagedPermissionRulesOnly": true}"#;
    let managed = r#"{"allowManagedPermissionRulesOnly": true,
        "sandbox": {"network": {"allowManagedDomainsOnly": true, "allowedDomains": ["crates.io"]}}}"#;
    for who in identities() {
        let c = case(who, project, Some(managed));
        write(&c.t.proj.join("private.txt"), "private\n");
        c.t.own(who);
        let j = explain_json(&c, who);
        for text in [
            "WebFetch(domain:example.com)",
            "sandbox.network.allowedDomains: pypi.org",
        ] {
            let r = rule(&j, text);
            assert_eq!(r.len(), 1, "{text}: {j}");
            assert_eq!(r[0]["status"], "ignored", "{text}: {j}");
        }
        // The project's deny still narrows the sandbox.
        assert_eq!(
            rule(&j, "Read(./private.txt)")[0]["status"],
            "enforced",
            "{j}"
        );
        // The switch in the project file itself changes nothing.
        let own = rule(&j, "allowManagedPermissionRulesOnly");
        assert!(
            own.iter().any(|r| r["status"] == "NOT ENFORCED"
                && r["from"].as_str().unwrap().contains("(project)")),
            "{j}"
        );
        assert!(
            own.iter()
                .any(|r| r["status"] == "enforced"
                    && r["from"].as_str().unwrap().contains("(managed)")),
            "{j}"
        );
        let print = stdout(&policy(&c, who, &["chain", "--print", "--", "true"]));
        assert!(print.contains("--allow crates.io"), "{print}");
        assert!(
            !print.contains("pypi.org") && !print.contains("example.com"),
            "{print}"
        );
        let out = chain(&c, who, "cat private.txt || echo HIDDEN");
        assert!(stdout(&out).contains("HIDDEN"), "{who:?}: {}", stdout(&out));
    }
}

#[test]
fn explain_json_is_the_tables_account() {
    for who in identities() {
        let c = case(
            who,
            r#"{"permissions": {"allow": ["Bash(git:*)"], "deny": ["Read(./x)"]},
                "sandbox": {"excludedCommands": ["docker"]}}"#,
            None,
        );
        let j = explain_json(&c, who);
        let text = stdout(&policy(&c, who, &["explain"]));
        for r in j["rules"].as_array().unwrap() {
            let rule = r["rule"].as_str().unwrap();
            assert!(
                text.lines()
                    .any(|l| l.starts_with(r["status"].as_str().unwrap()) && l.contains(rule)),
                "{rule} not in the tables:\n{text}"
            );
        }
        for l in j["limits"].as_array().unwrap() {
            assert!(text.contains(l["limit"].as_str().unwrap()), "{l}");
            assert!(l["applies"].is_boolean(), "{l}");
        }
        assert!(j["not_enforced"].as_u64().unwrap() >= 1, "{j}");
        assert!(
            text.contains(&format!(
                "NOT ENFORCED by any kernel layer ({})",
                j["not_enforced"]
            )),
            "{text}"
        );
        assert_eq!(j["project"], c.t.proj.display().to_string());
    }
}

#[test]
fn listed_unix_sockets_are_bound_and_local_binding_works_inside() {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    for who in identities() {
        let c = case(
            who,
            r#"{"sandbox": {"network": {"allowUnixSockets": ["SOCK", "MISSING"], "allowLocalBinding": true}}}"#,
            None,
        );
        let base = c.t.proj.parent().unwrap().to_path_buf();
        let sock = base.join("agent.sock");
        let other = base.join("other.sock");
        let settings = c.t.proj.join(".claude/settings.json");
        let text = std::fs::read_to_string(&settings)
            .unwrap()
            .replace("SOCK", &sock.display().to_string())
            .replace("MISSING", &base.join("missing.sock").display().to_string());
        write(&settings, &text);
        let mut servers = Vec::new();
        for p in [&sock, &other] {
            let l = std::os::unix::net::UnixListener::bind(p).unwrap();
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).unwrap();
            l.set_nonblocking(false).unwrap();
            servers.push(std::thread::spawn(move || {
                // One answer per connection, until the test ends.
                for s in l.incoming().take(4) {
                    let _ = s.map(|mut s| s.write_all(b"from-host"));
                }
            }));
        }
        c.t.own(who);
        let j = explain_json(&c, who);
        let row = |t: String| rule(&j, &t).first().map(|r| r["status"].clone());
        assert_eq!(
            row(format!(
                "sandbox.network.allowUnixSockets: {}",
                sock.display()
            )),
            Some("enforced".into()),
            "{j}"
        );
        assert_eq!(
            row(format!(
                "sandbox.network.allowUnixSockets: {}",
                base.join("missing.sock").display()
            )),
            Some("NOT ENFORCED".into()),
            "{j}"
        );
        assert_eq!(
            row("sandbox.network.allowLocalBinding".into()),
            Some("enforced".into()),
            "{j}"
        );
        let script = format!(
            "import socket\n\
             def ask(p):\n    try:\n        c = socket.socket(socket.AF_UNIX); c.connect(p); return c.recv(20).decode()\n    except OSError as e:\n        return type(e).__name__\n\
             print('listed', ask('{}'))\n\
             print('other', ask('{}'))\n\
             s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n\
             c = socket.create_connection(s.getsockname()); a, _ = s.accept(); c.send(b'lo')\n\
             print('local', a.recv(2).decode())\n",
            sock.display(),
            other.display()
        );
        let out = policy(&c, who, &["chain", "--", "python3", "-c", &script]);
        let so = stdout(&out);
        assert!(
            so.contains("listed from-host"),
            "{who:?}: {so}{}",
            stderr(&out)
        );
        assert!(so.contains("other FileNotFoundError"), "{who:?}: {so}");
        assert!(so.contains("local lo"), "{who:?}: {so}");
        // Unblock the servers' remaining accepts.
        for p in [&sock, &other] {
            for _ in 0..4 {
                let _ = std::os::unix::net::UnixStream::connect(p);
            }
        }
        for s in servers {
            s.join().unwrap();
        }
    }
}

/// `explain` reads the ChainSpec `chain` renders (issue 18): its chain
/// section is `chain --print`'s layers, tool for tool and flag for flag
/// (the tools named without their directory, the per-run git stage named
/// ID), and `--json` carries the same spec.
#[test]
fn explain_shows_the_chain_that_chain_runs() {
    let stage = |s: &str| {
        s.split(' ')
            .map(|w| match w.find("sbx-git-stage-") {
                Some(i) => format!("{}sbx-git-stage-ID", &w[..i]),
                None => w.to_string(),
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    for who in identities() {
        let c = case(
            who,
            r#"{"permissions": {"allow": ["WebFetch(domain:example.com)", "Read(DATA/**)"],
                                "deny": ["Read(./secret)"]}}"#,
            None,
        );
        std::process::Command::new("git")
            .args(["init", "-q"])
            .current_dir(&c.t.proj)
            .status()
            .unwrap();
        c.t.own(who);
        let text = stdout(&policy(&c, who, &["explain"]));
        let shown: Vec<String> = text
            .lines()
            .skip_while(|l| !l.starts_with("The low trust chain"))
            .skip(1)
            .take_while(|l| !l.is_empty())
            .map(|l| stage(l.trim()))
            .collect();
        let print = policy(&c, who, &["chain", "--print", "--", "true"]);
        assert_eq!(print.status.code(), Some(0), "{}", stderr(&print));
        let printed: Vec<String> = stdout(&print)
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .map(|l| {
                let l = l.trim().trim_end_matches('\\').trim_end();
                let l = l.strip_suffix(" --").unwrap_or(l);
                let (prog, rest) = l.split_once(' ').unwrap_or((l, ""));
                let name = prog.rsplit('/').next().unwrap();
                stage(format!("{name} {rest}").trim_end())
            })
            .collect();
        assert!(shown.len() >= 4, "{who:?}: no chain section:\n{text}");
        assert_eq!(
            shown,
            printed[..printed.len() - 1],
            "{who:?}: explain and chain --print disagree"
        );
        assert!(
            shown.iter().any(|l| l.contains("--allow example.com")),
            "{shown:?}"
        );
        assert!(
            shown.iter().any(|l| l.starts_with("sbx-gitguard run")),
            "{shown:?}"
        );
        let j = explain_json(&c, who);
        assert_eq!(j["chain"]["layers"].as_array().unwrap().len(), shown.len());
    }
}
