//! Bad input, exit status pass-through, and the options, as root and as
//! the unprivileged test user.

mod common;

use common::*;
use sbx_testutil::{assert_event, assert_usage_error};

fn bad(s: &Scratch, args: &[&str], needle: &str) {
    let before = s.snapshot();
    let log = s.log();
    let mut c = sbx_testutil::tool("sbx-fs");
    run_as(&mut c, s.who);
    c.current_dir(s.root())
        .env("SBX_AUDIT_LOG", &log)
        .args(args);
    let out = c.output().unwrap();
    assert_usage_error(&out, needle);
    s.assert_clean(&before);
}

#[test]
fn bad_input_is_one_line_125_and_nothing_left() {
    for who in identities() {
        let s = Scratch::new(who);
        let p = s.proj();
        let proj = p.to_str().unwrap();
        let cfgdir = s.path("proj");
        let cfg = cfgdir.to_str().unwrap();
        bad(&s, &["--bogus", "--", "true"], "--bogus");
        bad(&s, &["--ro", proj, "true"], "");
        bad(
            &s,
            &["--ro", "/nonexistent/sbx-src", "--", "true"],
            "/nonexistent/sbx-src",
        );
        bad(
            &s,
            &["--rw", &format!("{proj}:/proc/evil"), "--", "true"],
            "/proc",
        );
        bad(&s, &["--tmpfs", "/proc/x", "--", "true"], "/proc");
        bad(&s, &["--tmp-size", "12Q", "--", "true"], "12Q");
        bad(&s, &["--tmpfs", "/cache:lots", "--", "true"], "lots");
        bad(&s, &["--config", cfg, "--", "true"], cfg);
        bad(
            &s,
            &["--config", "/nonexistent/sbx.json", "--", "true"],
            "/nonexistent/sbx.json",
        );
        bad(&s, &["--setenv", "NOEQUALS", "--", "true"], "--setenv");
        bad(&s, &["--rw", &format!("{proj}:relative"), "--", "true"], "");
        bad(&s, &["--hostname", "bad name", "--", "true"], "--hostname");
        // Refused inside the namespaces: still one line, 125, logged.
        let before = s.snapshot();
        let (out, log) = s.run(&["--chdir", "/nonexistent-dir"], "true");
        assert_usage_error(&out, "--chdir");
        assert_event(&log, "setup_failed", "warn", |e| {
            e["error"].as_str().unwrap().contains("--chdir")
        });
        s.assert_clean(&before);
        // A destination that would cross a symlink (/bin -> usr/bin on
        // merged-/usr systems) is refused.
        if std::fs::symlink_metadata("/bin").is_ok_and(|m| m.file_type().is_symlink()) {
            let (out, log) = s.run(&["--ro", &format!("{proj}:/bin/evil")], "true");
            assert_usage_error(&out, "/bin/evil");
            assert_event(&log, "setup_failed", "warn", |_| true);
            s.assert_clean(&before);
        }
        // A nonexistent source after init: logged as a refused step.
        let (out, log) = s.run(&["--ro", "/nonexistent/sbx-src2"], "true");
        assert_usage_error(&out, "/nonexistent/sbx-src2");
        assert_event(&log, "setup_failed", "warn", |e| {
            e["error"]
                .as_str()
                .unwrap()
                .contains("/nonexistent/sbx-src2")
        });
        // A writable bind inside an invariant path is refused.
        s.mkdir("proj/.git/hooks");
        let before = s.snapshot();
        let hooks = s.path("proj/.git/hooks");
        let (out, _) = s.run(&["--rw", hooks.to_str().unwrap()], "true");
        assert_usage_error(&out, ".git/hooks");
        s.assert_clean(&before);
    }
}

#[test]
fn exit_status_passes_through() {
    for who in identities() {
        let s = Scratch::new(who);
        for (script, want) in [
            ("exit 0", 0),
            ("exit 1", 1),
            ("exit 42", 42),
            ("kill -TERM $$", 128 + libc::SIGTERM),
            ("kill -KILL $$", 128 + libc::SIGKILL),
        ] {
            let (out, log) = s.run(&[], script);
            assert_eq!(code(&out), want, "{script}: {}", stderr(&out));
            assert_event(&log, "end", "info", |e| e["status"] == want);
        }
        // 127: not found inside; 126: found, not executable.
        let log = s.log();
        let mut c = sbx_testutil::tool("sbx-fs");
        run_as(&mut c, who);
        let out = c
            .args([
                "--audit-log",
                log.to_str().unwrap(),
                "--",
                "no-such-command-xyz",
            ])
            .output()
            .unwrap();
        assert_eq!(code(&out), 127, "{}", stderr(&out));
        assert_eq!(
            stderr(&out).trim_end().lines().count(),
            1,
            "{}",
            stderr(&out)
        );
        s.write("proj/noexec", "#!/bin/sh\necho hi\n");
        let ne = s.path("proj/noexec");
        let ne = ne.to_str().unwrap();
        let mut c = sbx_testutil::tool("sbx-fs");
        run_as(&mut c, who);
        let out = c.args(["--ro", ne, "--", ne]).output().unwrap();
        assert_eq!(code(&out), 126, "{}", stderr(&out));
    }
}

#[test]
fn signals_are_forwarded_and_status_is_128_plus_n() {
    for who in identities() {
        let s = Scratch::new(who);
        let marker = sbx_testutil::unique("SBXFSSIG");
        let log = s.log();
        let mut c = s.cmd(&log, &[], &format!("sleep 600; : {marker}"));
        let child = c.spawn().unwrap();
        assert!(
            eventually(|| !pids_with(&marker).is_empty()),
            "did not start"
        );
        // SAFETY: kill with integer arguments; the child is ours and not yet reaped.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let out = child.wait_with_output().unwrap();
        assert_eq!(code(&out), 128 + libc::SIGTERM, "{}", stderr(&out));
        assert!(
            eventually(|| pids_with(&marker).is_empty()),
            "sandbox processes survived"
        );
    }
}

#[test]
fn init_reaps_orphans() {
    for who in identities() {
        let s = Scratch::new(who);
        let script = "(sh -c 'exit 0' &); (sleep 0 &); \
            i=0; while [ $i -lt 500 ]; do \
              z=$(cat /proc/[0-9]*/stat 2>/dev/null | awk '$3==\"Z\"' | wc -l); \
              [ \"$z\" = 0 ] && { echo reaped; exit 0; }; i=$((i+1)); done; echo zombies; exit 1";
        let (out, _) = s.run(&[], script);
        assert_eq!(code(&out), 0, "{} {}", stdout(&out), stderr(&out));
    }
}

#[test]
fn options_work() {
    for who in identities() {
        let s = Scratch::new(who);
        s.write("data/file.txt", "DATA\n");
        let data = s.path("data/file.txt");
        let d = data.to_str().unwrap();
        let (uid, gid) = if who == As::Root {
            ("1234", "2345")
        } else {
            ("0", "0")
        };
        let script = "echo host=$(hostname); echo A=$A; echo B=${B-unset}; echo PWD=$(pwd); \
             echo id=$(id -u):$(id -g); cat /ro/file.txt; \
             echo > /cache/x && echo cache-ok; df -k /cache | tail -1 | awk '{print \"cache=\"$2}'; \
             test -e /run && echo has-run; test -e /var/run/docker.sock && echo has-docker; \
             ls /proc/self/fd | tr '\\n' ' '; echo; echo fdenv=${SBX_AUDIT_FD-none}; \
             test -d $HOME && echo home-ok; ls -A $HOME | wc -l | sed 's/^/homefiles=/'; \
             grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs)' /proc/self/status | tr -s '\t' ' '";
        let (out, log) = s.run(
            &[
                "--hostname",
                "sbxbox",
                "--setenv",
                "A=1",
                "--setenv",
                "B=2",
                "--unsetenv",
                "B",
                "--chdir",
                "/tmp",
                "--uid",
                uid,
                "--gid",
                gid,
                "--ro",
                &format!("{}:/ro", s.path("data").display()),
                "--tmpfs",
                "/cache:2M",
            ],
            script,
        );
        let so = stdout(&out);
        assert_eq!(code(&out), 0, "{so} {}", stderr(&out));
        let _ = d;
        for want in [
            "host=sbxbox",
            "A=1",
            "B=2",
            "PWD=/tmp",
            &format!("id={uid}:{gid}"),
            "DATA",
            "cache-ok",
            "cache=2048",
            "fdenv=none",
            "home-ok",
            "homefiles=0",
            "CapInh: 0000000000000000",
            "CapPrm: 0000000000000000",
            "CapEff: 0000000000000000",
            "CapBnd: 0000000000000000",
            "CapAmb: 0000000000000000",
            "NoNewPrivs: 1",
        ] {
            assert!(so.contains(want), "missing {want}: {so}");
        }
        assert!(
            !so.contains("has-run") && !so.contains("has-docker"),
            "{so}"
        );
        // Only 0-2 (and ls's own directory fd) are open.
        let fds = so.lines().find(|l| l.starts_with("0 ")).unwrap();
        assert_eq!(fds.split_whitespace().count(), 4, "{so}");
        assert_event(&log, "start", "info", |e| {
            e["uid"].as_u64() == uid.parse().ok()
        });

        // --clearenv.
        let (out, _) = s.run(
            &["--clearenv", "--setenv", "ONLY=1"],
            "env | grep -v '^PWD=' | sort | tr '\\n' ' '",
        );
        assert_eq!(stdout(&out).trim(), "ONLY=1", "{}", stderr(&out));

        // --config takes the same settings.
        s.write(
            "cfg.json",
            r#"{"sbx-fs": {"hostname": "cfgbox", "setenv": ["C=3"]}}"#,
        );
        let cfg = s.path("cfg.json");
        let (out, _) = s.run(&["--config", cfg.to_str().unwrap()], "echo $(hostname) $C");
        assert_eq!(stdout(&out).trim(), "cfgbox 3", "{}", stderr(&out));

        // --no-system: nothing of the host's system directories.
        let (out, _) = s.run(&["--no-system"], "true");
        assert_eq!(code(&out), 127, "{}", stderr(&out));
    }
}

#[test]
fn next_sbx_tool_is_found_after_the_pivot() {
    for who in identities() {
        let s = Scratch::new(who);
        let bin = sbx_testutil::bin("sbx-fs");
        let dir = bin.parent().unwrap();
        let log = s.log();
        let mut c = sbx_testutil::tool("sbx-fs");
        run_as(&mut c, who);
        // The sbx binaries are not bound: the next tool is opened on the
        // host and executed by fd; it receives the audit fd.
        let out = c
            .env("PATH", format!("{}:/usr/bin:/bin", dir.display()))
            .args([
                "--audit-log",
                log.to_str().unwrap(),
                "--",
                "sbx-fs",
                "--version",
            ])
            .output()
            .unwrap();
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(stdout(&out).starts_with("sbx-fs "), "{}", stdout(&out));
        // And the binary is really not reachable by path inside.
        let (out, _) = s.run(
            &[],
            &format!("test -e {} && echo visible; echo checked", bin.display()),
        );
        assert_eq!(stdout(&out).trim(), "checked");
    }
}
