//! Bad input: one clear line on stderr, exit 125, nothing served.

mod common;

use std::net::UdpSocket;
use std::os::unix::fs::PermissionsExt;

use sbx_testutil::{As, assert_usage_error, identities, output, run_as, tool};

fn run(args: &[&str], who: As) -> std::process::Output {
    let mut c = tool("sbx-dnsproxy");
    c.args(args);
    run_as(&mut c, who);
    output(&mut c)
}

const BASE: &[&str] = &["--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9"];

fn with(extra: &[&str]) -> Vec<String> {
    BASE.iter().chain(extra).map(|s| s.to_string()).collect()
}

#[test]
fn bad_allowlist_entries() {
    for who in identities() {
        for (entry, needle) in [
            ("*.com", "'*.com'"),
            ("*", "bare '*'"),
            ("*.co.uk", "public suffix"),
            ("a.*.example.com", "'a.*.example.com'"),
            ("exa mple.com", "'exa mple.com'"),
            ("a..example.com", "empty label"),
            ("10.0.0.0/8", "CIDR"),
        ] {
            let args = with(&["--allow", "ok.example.com", "--allow", entry]);
            let a: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = run(&a, who);
            assert_usage_error(&out, needle);
            assert!(out.stdout.is_empty(), "nothing was served for {entry}");
        }
    }
}

#[test]
fn bad_allowlist_files() {
    let dir = sbx_testutil::shared_tempdir();
    let bad = dir.path().join("bad.txt");
    std::fs::write(&bad, "# comment\nok.example.com\n\n*.com\n").unwrap();
    sbx_testutil::chown_to_test_user(&bad);
    for who in identities() {
        let out = run(
            &[BASE, &["--allow-file", bad.to_str().unwrap()]].concat(),
            who,
        );
        assert_usage_error(&out, &format!("{}:4", bad.display()));
        let out = run(
            &[BASE, &["--allow-file", "/nonexistent/allow.txt"]].concat(),
            who,
        );
        assert_usage_error(&out, "/nonexistent/allow.txt");
    }
    // Unreadable (as the unprivileged user: root reads anything).
    if identities().contains(&As::User) {
        let secret = dir.path().join("secret.txt");
        std::fs::write(&secret, "ok.example.com\n").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o000)).unwrap();
        std::os::unix::fs::chown(&secret, Some(0), Some(0)).unwrap();
        let out = run(
            &[BASE, &["--allow-file", secret.to_str().unwrap()]].concat(),
            As::User,
        );
        assert_usage_error(&out, "Permission denied");
    }
}

#[test]
fn listen_address_in_use() {
    let busy = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    for who in identities() {
        let out = run(
            &[
                "--listen",
                "127.0.0.1:0",
                "--listen",
                &addr,
                "--upstream",
                "127.0.0.1:9",
                "--allow",
                "a.test",
            ],
            who,
        );
        assert_usage_error(&out, &format!("--listen {addr}"));
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn bad_options() {
    for who in identities() {
        for (args, needle) in [
            (
                vec![
                    "--listen",
                    "127.0.0.1:0",
                    "--upstream",
                    "dns.example.com",
                    "--allow",
                    "a.test",
                ],
                "--upstream",
            ),
            (
                vec![
                    "--listen",
                    "127.0.0.1:0",
                    "--upstream",
                    "127.0.0.1:0",
                    "--allow",
                    "a.test",
                ],
                "port 0",
            ),
            (
                vec!["--listen", "127.0.0.1:0", "--allow", "a.test"],
                "--upstream",
            ),
            (
                vec![
                    "--listen",
                    "localhost:53",
                    "--upstream",
                    "127.0.0.1",
                    "--allow",
                    "a.test",
                ],
                "--listen",
            ),
            (
                vec![
                    "--listen",
                    "127.0.0.1:0",
                    "--upstream",
                    "127.0.0.1",
                    "--qtypes",
                    "A,BOGUS",
                ],
                "BOGUS",
            ),
            (
                vec![
                    "--listen",
                    "127.0.0.1:0",
                    "--upstream",
                    "127.0.0.1",
                    "--qtypes",
                    "A,AXFR",
                ],
                "AXFR",
            ),
            (
                vec![
                    "--listen",
                    "127.0.0.1:0",
                    "--upstream",
                    "127.0.0.1",
                    "--client-prefix4",
                    "33",
                ],
                "--client-prefix4",
            ),
            (
                vec![
                    "--listen",
                    "127.0.0.1:0",
                    "--upstream",
                    "127.0.0.1",
                    "--client-prefix6",
                    "129",
                ],
                "--client-prefix6",
            ),
            (
                vec![
                    "--listen",
                    "127.0.0.1:0",
                    "--upstream",
                    "127.0.0.1",
                    "--rebind-allow",
                    "bad name",
                ],
                "bad name",
            ),
            (
                vec![
                    "--listen",
                    "127.0.0.1:0",
                    "--upstream",
                    "127.0.0.1",
                    "--query-timeout",
                    "0",
                ],
                "timeout",
            ),
            (
                vec![
                    "--listen",
                    "127.0.0.1:0",
                    "--upstream",
                    "127.0.0.1",
                    "--nftset",
                    "inet:t",
                ],
                "FAMILY:TABLE:SET",
            ),
            (
                vec![
                    "--listen",
                    "127.0.0.1:0",
                    "--upstream",
                    "127.0.0.1",
                    "--nftset",
                    "inet:sbxnosuchtable:s",
                ],
                "inet:sbxnosuchtable:s",
            ),
        ] {
            let out = run(&args, who);
            assert_usage_error(&out, needle);
        }
    }
}
