//! sbx-wasm end to end: a real WASI program (tests/data/probe.c, compiled
//! here with clang --target=wasm32-wasi against Debian's wasi-libc) run by
//! the built binary, as root and as the unprivileged test user. Every
//! refusal is asserted on the host and in the audit log. The promise
//! numbers (W1...) are those of docs/wasm.md.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use sbx_testutil::{As, assert_event, audit_events, code, identities, run_as, stderr, stdout};

const LIMIT: Duration = Duration::from_secs(120);

/// A scratch tree the test user owns: the compiled probe, a registry (the
/// module cache), an audit log, a project.
struct Scratch {
    dir: tempfile::TempDir,
    who: As,
    /// The registry (module cache): shared by the tests of this run unless
    /// a test needs its own (compiling is the slow part of a debug build).
    reg: PathBuf,
}

/// A registry shared by every test of this build (the cache key holds the
/// module's hash and the engine's settings): a sticky world-writable
/// directory, in which each user's registry is a private 0700 directory.
fn shared_registry() -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let d = std::env::temp_dir().join("sbx-wasm-test-registry");
    let _ = std::fs::create_dir(&d);
    let m = std::fs::symlink_metadata(&d).unwrap();
    assert!(m.is_dir(), "{} is not a directory", d.display());
    if m.permissions().mode() & 0o7777 != 0o1777 && sbx_testutil::is_root() {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
    }
    d
}

impl Scratch {
    fn new(who: As) -> Option<Scratch> {
        if !sbx_testutil::have("clang") || !Path::new("/usr/include/wasm32-wasi").exists() {
            return None;
        }
        let dir = sbx_testutil::shared_tempdir();
        let s = Scratch {
            dir,
            who,
            reg: shared_registry(),
        };
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/probe.c");
        let out = Command::new("clang")
            .args(["--target=wasm32-wasi", "-O1", "-o"])
            .arg(s.path("probe.wasm"))
            .arg(&src)
            .output()
            .expect("clang");
        assert!(out.status.success(), "clang: {}", stderr(&out));
        for d in ["reg", "proj", "outside"] {
            std::fs::create_dir(s.path(d)).unwrap();
        }
        std::fs::write(s.path("outside/secret.txt"), "OUTSIDE").unwrap();
        std::fs::write(s.path("proj/in.txt"), "INSIDE").unwrap();
        s.chown_all();
        Some(s)
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn log(&self) -> PathBuf {
        self.path("audit.jsonl")
    }

    /// Everything below the scratch dir belongs to the test user and its
    /// group (when it runs the tool): a group unmapped in sbx-fs's user
    /// namespace makes the guard refuse with EACCES before it can log.
    fn chown_all(&self) {
        if self.who != As::User {
            return;
        }
        let out = Command::new("chown")
            .arg("-R")
            .arg(format!("{0}:{0}", sbx_testutil::TEST_USER))
            .arg(self.dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "chown: {}", stderr(&out));
    }

    /// `sbx-wasm FLAGS -- probe.wasm ARGS`, audit log and registry ours.
    fn run(&self, flags: &[&str], args: &[&str]) -> Output {
        let mut c = sbx_testutil::tool("sbx-wasm");
        c.arg("--audit-log")
            .arg(self.log())
            .env("SBX_REGISTRY_DIR", &self.reg)
            .args(flags)
            .arg("--")
            .arg(self.path("probe.wasm"))
            .args(args);
        run_as(&mut c, self.who);
        sbx_testutil::output_within(&mut c, LIMIT)
    }
}

macro_rules! scratch {
    ($who:expr) => {
        match Scratch::new($who) {
            Some(s) => s,
            None => sbx_testutil::skip!(
                "clang and wasi-libc (wasm32-wasi) are needed to build the test module (run scripts/setup)"
            ),
        }
    };
}

fn ok(out: &Output) -> String {
    assert_eq!(
        code(out),
        0,
        "stdout: {}\nstderr: {}",
        stdout(out),
        stderr(out)
    );
    stdout(out)
}

fn refused(out: &Output, what: &str) -> String {
    assert_eq!(
        code(out),
        1,
        "{what} should have been refused; stdout: {}\nstderr: {}",
        stdout(out),
        stderr(out)
    );
    stdout(out)
}

/// W1: stdout, arguments and the exit status pass through.
#[test]
fn stdout_args_and_exit_status() {
    for who in identities() {
        let s = scratch!(who);
        let out = s.run(&[], &["hello"]);
        assert_eq!(ok(&out), "hello from wasm\n");
        let out = s.run(&[], &["args", "a b", "--c"]);
        let want = format!("{}\nargs\na b\n--c\n", s.path("probe.wasm").display());
        assert_eq!(ok(&out), want);
        let out = s.run(&[], &["exit", "7"]);
        assert_eq!(code(&out), 7, "{}", stderr(&out));
        assert_event(&s.log(), "wasm_end", "info", |e| e["status"] == 7);
        assert_event(&s.log(), "wasm_start", "info", |e| e["tool"] == "sbx-wasm");
    }
}

/// W2: the environment is the allowlist plus --setenv: an unlisted and a
/// secret-looking variable of the caller do not reach the module.
#[test]
fn environment_is_only_what_is_passed() {
    for who in identities() {
        let s = scratch!(who);
        let mut c = sbx_testutil::tool("sbx-wasm");
        c.env("SBX_REGISTRY_DIR", &s.reg)
            .env("LANG", "C.UTF-8")
            .env("PLAIN_VAR", "plain")
            .env("MY_API_TOKEN", "sekrit")
            .args(["--setenv", "GIVEN=yes", "--pass-env", "PLAIN_VAR", "--"])
            .arg(s.path("probe.wasm"))
            .args(["env", "GIVEN", "LANG", "PLAIN_VAR", "MY_API_TOKEN", "OTHER"]);
        c.env("OTHER", "other");
        run_as(&mut c, who);
        let out = sbx_testutil::output_within(&mut c, LIMIT);
        assert_eq!(
            ok(&out),
            "GIVEN=yes\nLANG=C.UTF-8\nPLAIN_VAR=plain\nMY_API_TOKEN=(unset)\nOTHER=(unset)\n"
        );
        // The same through sbx-fs (a grant): the variables travel by name.
        let mut c = sbx_testutil::tool("sbx-wasm");
        c.env("SBX_REGISTRY_DIR", &s.reg)
            .env("LANG", "C.UTF-8")
            .env("MY_API_TOKEN", "sekrit")
            .arg("--rw")
            .arg(format!("{}:/proj", s.path("proj").display()))
            .args(["--setenv", "GIVEN=yes", "--"])
            .arg(s.path("probe.wasm"))
            .args(["env", "GIVEN", "LANG", "MY_API_TOKEN", "HOME"]);
        run_as(&mut c, who);
        let out = sbx_testutil::output_within(&mut c, LIMIT);
        let so = ok(&out);
        assert!(
            so.starts_with("GIVEN=yes\nLANG=C.UTF-8\nMY_API_TOKEN=(unset)\n"),
            "{so}"
        );
    }
}

/// W3: files inside a writable preopen can be written and read; nothing
/// outside the preopens is reachable (absolute paths, `..`), and a
/// read-only preopen cannot be written.
#[test]
fn file_io_inside_and_outside_preopens() {
    for who in identities() {
        let s = scratch!(who);
        let rw = format!("{}:/proj", s.path("proj").display());
        let out = s.run(&["--rw", &rw], &["write", "/proj/out.txt", "made"]);
        ok(&out);
        assert_eq!(
            std::fs::read_to_string(s.path("proj/out.txt")).unwrap(),
            "made"
        );
        assert_eq!(
            ok(&s.run(&["--rw", &rw], &["read", "/proj/in.txt"])),
            "INSIDE"
        );
        // Outside every preopen.
        let secret = s.path("outside/secret.txt");
        refused(
            &s.run(&["--rw", &rw], &["read", secret.to_str().unwrap()]),
            "a host path",
        );
        refused(
            &s.run(&["--rw", &rw], &["read", "/etc/passwd"]),
            "/etc/passwd",
        );
        refused(
            &s.run(&["--rw", &rw], &["read", "/proj/../outside/secret.txt"]),
            "..",
        );
        refused(&s.run(&["--rw", &rw], &["write", "/tmp/x", "x"]), "/tmp");
        // Without any grant: nothing at all.
        refused(&s.run(&[], &["read", "/proj/in.txt"]), "no preopen");
        // Read-only.
        let ro = format!("{}:/data", s.path("proj").display());
        assert_eq!(
            ok(&s.run(&["--ro", &ro], &["read", "/data/in.txt"])),
            "INSIDE"
        );
        refused(
            &s.run(&["--ro", &ro], &["write", "/data/new.txt", "x"]),
            "a read-only preopen",
        );
        refused(
            &s.run(&["--ro", &ro], &["unlink", "/data/in.txt"]),
            "a read-only preopen",
        );
        assert!(!s.path("proj/new.txt").exists());
        assert!(s.path("proj/in.txt").exists());
    }
}

/// W4: a symlink that leaves the preopen is refused, whether it was there
/// before (absolute or relative target) or the module made it.
#[test]
fn symlink_escapes_are_refused() {
    for who in identities() {
        let s = scratch!(who);
        std::os::unix::fs::symlink(s.path("outside"), s.path("proj/abs")).unwrap();
        std::os::unix::fs::symlink("../outside", s.path("proj/rel")).unwrap();
        std::os::unix::fs::symlink("in.txt", s.path("proj/inner")).unwrap();
        s.chown_all();
        let rw = format!("{}:/proj", s.path("proj").display());
        refused(
            &s.run(&["--rw", &rw], &["read", "/proj/abs/secret.txt"]),
            "an absolute symlink",
        );
        refused(
            &s.run(&["--rw", &rw], &["read", "/proj/rel/secret.txt"]),
            "a relative symlink out",
        );
        refused(
            &s.run(&["--rw", &rw], &["write", "/proj/rel/planted", "x"]),
            "a write through a symlink",
        );
        assert!(!s.path("outside/planted").exists());
        // A symlink that stays inside works.
        assert_eq!(
            ok(&s.run(&["--rw", &rw], &["read", "/proj/inner"])),
            "INSIDE"
        );
        // One the module makes itself.
        ok(&s.run(&["--rw", &rw], &["symlink", "../outside", "/proj/made"]));
        refused(
            &s.run(&["--rw", &rw], &["read", "/proj/made/secret.txt"]),
            "a planted symlink",
        );
        // The same without sbx-fs around the engine is not possible: a
        // grant always runs inside it (see the invariants test).
    }
}

fn fuse_usable(who: As) -> bool {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata("/dev/fuse") {
        Ok(m) => who == As::Root || m.permissions().mode() & 0o006 == 0o006,
        Err(_) => false,
    }
}

/// W5: sbx-fs's invariants and deny list hold inside a writable preopen:
/// the module cannot write .git/config, .git/hooks/, .claude/settings.json
/// or read .env of a granted project; sbx-fs logs the alerts.
#[test]
fn invariants_and_deny_list_inside_preopens() {
    for who in identities() {
        let s = scratch!(who);
        if !fuse_usable(who) {
            sbx_testutil::skip!("/dev/fuse is not usable as {who:?} (run scripts/setup)");
        }
        let p = s.path("proj");
        let g = Command::new("git")
            .arg("init")
            .arg("-q")
            .arg(&p)
            .output()
            .unwrap();
        assert!(g.status.success());
        std::fs::create_dir_all(p.join(".claude")).unwrap();
        std::fs::write(p.join(".claude/settings.json"), "{}").unwrap();
        std::fs::write(p.join(".env"), "API_KEY=1").unwrap();
        s.chown_all();
        let config = std::fs::read(p.join(".git/config")).unwrap();
        let rw = format!("{}:/proj", p.display());
        let flags = ["--rw", rw.as_str()];
        refused(
            &s.run(
                &flags,
                &["write", "/proj/.git/config", "[core]\n\thooksPath=/x\n"],
            ),
            ".git/config",
        );
        refused(
            &s.run(
                &flags,
                &["write", "/proj/.git/hooks/pre-commit", "#!/bin/sh\n"],
            ),
            ".git/hooks",
        );
        refused(
            &s.run(
                &flags,
                &["write", "/proj/.claude/settings.json", "{\"hooks\":1}"],
            ),
            ".claude/settings.json",
        );
        refused(
            &s.run(&flags, &["unlink", "/proj/.claude/settings.json"]),
            "removing .claude/settings.json",
        );
        refused(
            &s.run(&flags, &["rename", "/proj/.git", "/proj/git2"]),
            "renaming .git",
        );
        refused(&s.run(&flags, &["read", "/proj/.env"]), ".env");
        assert_eq!(std::fs::read(p.join(".git/config")).unwrap(), config);
        assert!(!p.join(".git/hooks/pre-commit").exists());
        assert_eq!(
            std::fs::read_to_string(p.join(".claude/settings.json")).unwrap(),
            "{}"
        );
        // Ordinary files still work.
        ok(&s.run(&flags, &["write", "/proj/src.txt", "ok"]));
        let log = s.log();
        let ends = |e: &serde_json::Value, suffix: &str| {
            e["path"].as_str().is_some_and(|x| x.ends_with(suffix))
        };
        assert_event(&log, "fs_write_denied", "alert", |e| ends(e, ".git/config"));
        assert_event(&log, "fs_write_denied", "alert", |e| {
            ends(e, ".claude/settings.json")
        });
        assert_event(&log, "fs_denied", "alert", |e| ends(e, ".env"));
        // The engine ran inside sbx-fs, and sbx-fs started it as a tool.
        assert_event(&log, "start", "info", |e| e["tool"] == "sbx-fs");
        assert_event(&log, "wasm_start", "info", |e| {
            e["preopens"]
                .as_array()
                .is_some_and(|a| a.iter().any(|p| p == "rw /proj"))
        });
    }
}

/// W6: an infinite loop ends at --timeout (124, wasm_timeout) and at
/// --fuel (124, wasm_fuel_exhausted).
#[test]
fn infinite_loop_timeout_and_fuel() {
    for who in identities() {
        let s = scratch!(who);
        let out = s.run(&["--timeout", "1s"], &["loop"]);
        assert_eq!(code(&out), 124, "{}", stderr(&out));
        assert_event(&s.log(), "wasm_timeout", "alert", |e| {
            e["timeout_ms"] == 1000
        });
        let out = s.run(&["--fuel", "5000000"], &["loop"]);
        assert_eq!(code(&out), 124, "{}", stderr(&out));
        assert_event(&s.log(), "wasm_fuel_exhausted", "alert", |e| {
            e["fuel"] == 5000000
        });
        // Enough fuel for a short program.
        assert_eq!(
            ok(&s.run(&["--fuel", "50000000"], &["hello"])),
            "hello from wasm\n"
        );
        // Inside sbx-fs too.
        let rw = format!("{}:/proj", s.path("proj").display());
        let out = s.run(&["--rw", &rw, "--timeout", "1s"], &["loop"]);
        assert_eq!(code(&out), 124, "{}", stderr(&out));
    }
}

/// W7: a memory bomb is held at --memory: malloc fails inside the module,
/// alert wasm_limit.
#[test]
fn memory_bomb_is_bounded() {
    for who in identities() {
        let s = scratch!(who);
        let out = s.run(&["--memory", "32M"], &["bomb"]);
        assert_eq!(code(&out), 2, "{}{}", stdout(&out), stderr(&out));
        let so = stdout(&out);
        let mb: u64 = so
            .trim()
            .strip_prefix("malloc failed after ")
            .and_then(|r| r.strip_suffix(" MiB"))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{so}"));
        assert!(mb < 32, "{so}");
        assert_event(&s.log(), "wasm_limit", "alert", |e| {
            e["limit"] == "memory" && e["max"] == 32 << 20
        });
    }
}

/// W8: a stack overflow and an explicit trap end with 134 and wasm_trap.
#[test]
fn stack_overflow_and_trap() {
    for who in identities() {
        let s = scratch!(who);
        let out = s.run(&[], &["recurse"]);
        assert_eq!(code(&out), 134, "{}", stderr(&out));
        assert_event(&s.log(), "wasm_trap", "alert", |e| {
            e["trap"]
                .as_str()
                .is_some_and(|t| t.contains("call stack exhausted"))
        });
        let out = s.run(&[], &["trap"]);
        assert_eq!(code(&out), 134, "{}", stderr(&out));
        assert_event(&s.log(), "wasm_trap", "alert", |e| {
            e["trap"]
                .as_str()
                .is_some_and(|t| t.contains("unreachable"))
        });
    }
}

/// W9: bad input is one line and 125; a missing module 127; a file that
/// is not WebAssembly 126.
#[test]
fn bad_input_and_module_statuses() {
    for who in identities() {
        let s = scratch!(who);
        let mut c = sbx_testutil::tool("sbx-wasm");
        c.args(["--memory", "lots", "--", "x.wasm"]);
        run_as(&mut c, who);
        sbx_testutil::assert_usage_error(&sbx_testutil::output_within(&mut c, LIMIT), "--memory");
        let file = s.path("proj/in.txt");
        let ro = format!("{}", file.display());
        let out = s.run(&["--ro", &ro], &["hello"]);
        sbx_testutil::assert_usage_error(&out, "not a directory");
        let out = s.run(&["--timeout", "soon"], &["hello"]);
        sbx_testutil::assert_usage_error(&out, "--timeout");
        let mut c = sbx_testutil::tool("sbx-wasm");
        c.arg("--").arg(s.path("missing.wasm"));
        run_as(&mut c, who);
        let out = sbx_testutil::output_within(&mut c, LIMIT);
        assert_eq!(code(&out), 127, "{}", stderr(&out));
        let mut c = sbx_testutil::tool("sbx-wasm");
        c.arg("--").arg(&file);
        run_as(&mut c, who);
        let out = sbx_testutil::output_within(&mut c, LIMIT);
        assert_eq!(code(&out), 126, "{}", stderr(&out));
        assert!(
            stderr(&out).contains("not a WebAssembly module"),
            "{}",
            stderr(&out)
        );
    }
}

/// W10: the compiled module is cached (a second run loads it), the file
/// is private, and a damaged artifact is never loaded: it is compiled again.
#[test]
fn compiled_module_cache() {
    for who in identities() {
        let mut s = scratch!(who);
        s.reg = s.path("reg");
        ok(&s.run(&[], &["hello"]));
        ok(&s.run(&[], &["hello"]));
        let starts: Vec<_> = audit_events(&s.log())
            .into_iter()
            .filter(|e| e["event"] == "wasm_start")
            .collect();
        assert_eq!(starts[0]["cached"], false);
        assert_eq!(starts[1]["cached"], true);
        let cache = find_cwasm(&s.path("reg"));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&cache).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{}: {mode:o}", cache.display());
        // Flip a byte in the middle: the checksum no longer matches.
        let mut b = std::fs::read(&cache).unwrap();
        let mid = b.len() / 2;
        b[mid] ^= 0xff;
        std::fs::write(&cache, &b).unwrap();
        ok(&s.run(&[], &["hello"]));
        let last = audit_events(&s.log())
            .into_iter()
            .rfind(|e| e["event"] == "wasm_start")
            .unwrap();
        assert_eq!(last["cached"], false, "a damaged artifact was loaded");
    }
}

/// SIGKILLed while the compiled artifact is written (fault injection,
/// `SBX_TEST_KILL_AT=wasm-cache-tmp-written`: written, not yet renamed):
/// the temporary was registered before it was made, and the next run
/// removes it. As root and as the test user.
#[test]
fn a_sigkill_while_caching_leaves_no_temporary_after_the_next_run() {
    use std::os::unix::process::ExitStatusExt;
    for who in identities() {
        let mut s = scratch!(who);
        s.reg = s.path("reg");
        let temporaries = || {
            let mut v = Vec::new();
            let mut stack = vec![s.path("reg")];
            while let Some(d) = stack.pop() {
                for e in std::fs::read_dir(&d).unwrap().flatten() {
                    let p = e.path();
                    if p.is_dir() {
                        stack.push(p);
                    } else if p
                        .extension()
                        .is_some_and(|x| x.to_string_lossy().starts_with("tmp"))
                    {
                        v.push(p);
                    }
                }
            }
            v
        };
        let mut c = sbx_testutil::tool("sbx-wasm");
        c.arg("--audit-log")
            .arg(s.log())
            .env("SBX_REGISTRY_DIR", &s.reg)
            .env("SBX_TEST_KILL_AT", "wasm-cache-tmp-written")
            .arg("--")
            .arg(s.path("probe.wasm"))
            .arg("hello");
        run_as(&mut c, who);
        let out = sbx_testutil::output_within(&mut c, LIMIT);
        assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{who:?}: {out:?}");
        assert_eq!(temporaries().len(), 1, "{who:?}: the temporary was made");
        ok(&s.run(&[], &["hello"]));
        assert!(
            temporaries().is_empty(),
            "{who:?}: left {:?}",
            temporaries()
        );
    }
}

fn find_cwasm(dir: &Path) -> PathBuf {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "cwasm") {
                return p;
            }
        }
    }
    panic!("no .cwasm below {}", dir.display())
}

/// W11: `sbx-policy chain --trust plugin` runs the module with sbx-wasm:
/// the project (granted writable by the policy) is a preopen at its own
/// path, its .claude/settings.json stays protected, and the alert is in
/// the one log of the chain.
#[test]
fn policy_chain_plugin_tier() {
    for who in identities() {
        let s = scratch!(who);
        if !fuse_usable(who) {
            sbx_testutil::skip!("/dev/fuse is not usable as {who:?} (run scripts/setup)");
        }
        let p = s.path("proj");
        std::fs::create_dir_all(p.join(".claude")).unwrap();
        std::fs::write(p.join(".claude/settings.json"), "{}").unwrap();
        std::fs::create_dir_all(s.path("home")).unwrap();
        s.chown_all();
        let chain = |args: &[&str]| {
            let mut c = sbx_testutil::tool("sbx-policy");
            c.arg("chain")
                .arg("--cwd")
                .arg(&p)
                .arg("--home")
                .arg(s.path("home"))
                .arg("--managed")
                .arg(p.join("no-managed.json"))
                .args(["--trust", "plugin", "--audit-log"])
                .arg(s.log())
                .env("SBX_REGISTRY_DIR", &s.reg)
                .current_dir(&p)
                .arg("--")
                .arg(s.path("probe.wasm"))
                .args(args);
            run_as(&mut c, who);
            sbx_testutil::output_within(&mut c, LIMIT)
        };
        let out_txt = p.join("out.txt");
        ok(&chain(&[
            "write",
            out_txt.to_str().unwrap(),
            "from the plugin",
        ]));
        assert_eq!(
            std::fs::read_to_string(&out_txt).unwrap(),
            "from the plugin"
        );
        let settings = p.join(".claude/settings.json");
        refused(
            &chain(&["write", settings.to_str().unwrap(), "{\"hooks\":1}"]),
            "settings.json",
        );
        assert_eq!(std::fs::read_to_string(&settings).unwrap(), "{}");
        assert_event(&s.log(), "fs_write_denied", "alert", |e| {
            e["path"]
                .as_str()
                .is_some_and(|x| x.ends_with(".claude/settings.json"))
        });
        assert_event(&s.log(), "chain", "info", |e| {
            e["tier"].as_str().is_some_and(|t| t.contains("sbx-wasm"))
        });
        // A trap through the chain: 134 and the alert.
        let out = chain(&["trap"]);
        assert_eq!(code(&out), 134, "{}", stderr(&out));
        assert_event(&s.log(), "wasm_trap", "alert", |_| true);
    }
}
