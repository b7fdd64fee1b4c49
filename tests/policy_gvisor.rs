//! End to end: `sbx-policy chain --trust zero` (not latency-sensitive) runs
//! the command in gVisor (runsc --platform=ptrace, an OCI bundle built from
//! the grants): the command sees gVisor's kernel, its edits land in the
//! project, denied paths cannot be read, the control files stay read-only,
//! the network is sbx-net's (allowed names only), the exit status passes through, and nothing is
//! left behind (temp dir, runsc state, processes, placeholders), also when
//! the sandbox is SIGKILLed. As root (inside sbx-cgroup) and as the
//! unprivileged test user (runsc --rootless).

mod common;
use common::*;

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sbx_testutil::testnet::TestNet;
use sbx_testutil::{As, assert_event, audit_events, code, identities, run_as, stderr, stdout};

fn runsc() -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")])
        .map(|d| d.join("runsc"))
        .find(|p| p.is_file())
}

struct Project {
    _d: tempfile::TempDir,
    root: PathBuf,
    home: PathBuf,
    log: PathBuf,
}

const SETTINGS: &str = r#"{
  "permissions": {
    "allow": ["Read(~/**)", "Edit(./src/**)"],
    "deny": ["Read(~/.ssh/**)", "Read(./.env)", "Edit(./docs/**)"]
  }
}
"#;

fn project(who: As) -> Project {
    project_with(who, SETTINGS)
}

fn project_with(who: As, settings: &str) -> Project {
    let d = sbx_testutil::shared_tempdir();
    let base = d.path().canonicalize().unwrap();
    let root = base.join("proj");
    let home = base.join("home");
    write(&root.join("src/lib.sh"), "one() { echo 1; }\n");
    write(&root.join("docs/readme.txt"), "docs\n");
    write(&root.join(".env"), "API_KEY=sk-live-secret\n");
    write(
        &home.join(".ssh/id_rsa"),
        "-----BEGIN OPENSSH PRIVATE KEY-----\n",
    );
    write(&home.join(".gitconfig"), "[user]\n\tname = agent\n");
    git(&root, &["init", "-q", "-b", "main"]);
    git(&root, &["add", "-A"]);
    git(&root, &["commit", "-qm", "init"]);
    write(&root.join(".claude/settings.json"), settings);
    if who == As::User {
        chown_r(&base);
    }
    let log = base.join("audit.jsonl");
    Project {
        _d: d,
        root,
        home,
        log,
    }
}

fn chain_cmd(p: &Project, script: &str, who: As) -> Command {
    chain_with(p, &[], &["sh", "-c", script], who)
}

/// `sbx-policy chain --trust zero EXTRA... -- ARGV...` in the project.
fn chain_with(p: &Project, extra: &[&str], argv: &[&str], who: As) -> Command {
    let mut c = sbx_testutil::tool("sbx-policy");
    c.arg("--audit-log").arg(&p.log);
    c.args([
        "chain",
        "--trust",
        "zero",
        "--managed",
        "/nonexistent/m.json",
    ]);
    c.arg("--home").arg(&p.home);
    c.args(["--memory", "512M", "--tmp-size", "32M"]);
    if !extra.contains(&"--pids") {
        c.args(["--pids", "256"]);
    }
    c.args(extra).arg("--").args(argv);
    c.current_dir(&p.root)
        .env("PATH", PATH)
        .env("HOME", &p.home)
        .env("H", &p.home)
        // Only an allowlist of the caller's variables reaches the sandbox.
        .env("SBX_PASS_ENV", "H");
    run_as(&mut c, who);
    c
}

fn marker(out: &str, key: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in:\n{out}"))
        .to_string()
}

/// Processes whose command line mentions `needle` (runsc's, with the
/// private directory's path in their --root/--bundle).
fn procs_with(needle: &str) -> Vec<String> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if !e
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            let c = String::from_utf8_lossy(&c).replace('\0', " ");
            if c.contains(needle) {
                v.push(format!("{}: {c}", e.file_name().to_string_lossy()));
            }
        }
    }
    v
}

/// The private directory sbx-gvisor made (from its audit event).
fn private_dir(p: &Project) -> PathBuf {
    let evs = audit_events(&p.log);
    let e = evs
        .iter()
        .find(|e| e["event"] == "gvisor_start")
        .unwrap_or_else(|| panic!("no gvisor_start event: {evs:?}"));
    PathBuf::from(e["dir"].as_str().unwrap())
}

/// Nothing of the sandbox is left: no private directory (runsc's state is
/// in it), no process of it, no placeholder in the project. Waits (bounded)
/// for the guardian when the sandbox was killed.
fn assert_nothing_left(p: &Project, within: Duration) {
    let dir = private_dir(p);
    let needle = dir.display().to_string();
    assert!(needle.contains("sbx-gvisor-"), "{needle}");
    let deadline = Instant::now() + within;
    loop {
        let exists = dir.exists();
        let procs = procs_with(&needle);
        if !exists && procs.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left behind: dir {needle} exists={exists}, processes {procs:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The sbx-fs placeholders for the invariants are gone from the tree.
    let st = git(&p.root, &["status", "--porcelain", "--ignored"]);
    for l in st.lines() {
        assert!(
            l.ends_with("src/lib.sh")
                || l.contains(".claude/")
                || l.contains("src/new.txt")
                || l.contains("src/agent.sh")
                || l == "!! .env",
            "unexpected change in the project: {st}"
        );
    }
}

#[test]
fn zero_trust_runs_in_gvisor_with_the_grants() {
    if runsc().is_none() {
        sbx_testutil::skip!("runsc not installed (scripts/setup installs Debian's runsc)");
    }
    if let Some(why) = TestNet::unavailable() {
        sbx_testutil::skip!("{why}");
    }
    if !sbx_testutil::have("dnsmasq") {
        sbx_testutil::skip!("dnsmasq not installed (scripts/setup)");
    }
    // Test hosts (own network namespaces): a DNS server naming
    // allowed.test (the web host) and denied.test (the other web host), and
    // a server on the host's loopback. Only allowed.test may be reached,
    // through sbx-net's filtered namespace, as in the namespace chain.
    let mut net = TestNet::new().expect("test network");
    let dns = net.add_host("gv-dns").unwrap();
    let web = net.add_host("gv-web").unwrap();
    let other = net.add_host("gv-other").unwrap();
    net.spawn_dnsmasq(
        &dns,
        &[
            format!("--host-record=allowed.test,{}", web.ip),
            format!("--host-record=denied.test,{}", other.ip),
        ],
    )
    .unwrap();
    let srv = tempfile::tempdir().unwrap();
    write(&srv.path().join("index.html"), "hello\n");
    net.spawn(
        &web,
        "gvweb",
        &[
            PY,
            "-m",
            "http.server",
            "-b",
            &web.ip.to_string(),
            "-d",
            srv.path().to_str().unwrap(),
            "80",
        ],
    )
    .unwrap();
    net.wait_tcp(SocketAddr::new(web.ip.into(), 80), Duration::from_secs(20))
        .unwrap();
    let lo = TcpListener::bind("127.0.0.1:0").unwrap();
    let lo_port = lo.local_addr().unwrap().port();

    for who in identities() {
        let settings = SETTINGS.replace(
            r#""Edit(./src/**)"]"#,
            r#""Edit(./src/**)", "WebFetch(domain:allowed.test)"]"#,
        );
        let p = project_with(who, &settings);
        let layers = p.root.parent().unwrap().join("layers.json");
        write(
            &layers,
            &format!(
                r#"{{"sbx-net": {{"dns-upstream": ["{}"], "dns-rebind-allow": ["test"]}}}}"#,
                dns.ip
            ),
        );
        if who == As::User {
            chown_r(&layers);
        }
        let script = format!(
            r#"
uname -r; echo KERNEL=$(uname -r)
dmesg 2>/dev/null | grep -q gVisor; echo DMESG=$?
echo 'two() {{ echo 2; }}' >> src/lib.sh; echo EDIT=$?
echo new > src/new.txt; echo NEW=$?
cat .env 2>/dev/null; echo DOTENV=$?
cat "$H/.ssh/id_rsa" 2>/dev/null; echo SSH=$?
cat "$H/.gitconfig" >/dev/null; echo GITCONFIG=$?
echo x >> docs/readme.txt 2>/dev/null; echo DOCS=$?
echo '{{"permissions":{{"allow":["Bash"]}}}}' > .claude/settings.json 2>/dev/null; echo SETTINGS=$?
printf '#!/bin/sh\necho evil\n' > .git/hooks/pre-commit 2>/dev/null; echo HOOK=$?
cat /etc/shadow >/dev/null 2>&1; echo SHADOW=$?
[ -e /proc/{hostpid} ]; echo HOSTPROC=$?
{PY} -c 'import socket; socket.create_connection(("127.0.0.1", {lo_port}), 5)' 2>/dev/null; echo LOOPBACK=$?
{PY} -c 'import socket; socket.create_connection(("{ip}", 80), 5)' 2>/dev/null; echo RAWIP=$?
{PY} -c 'import urllib.request as u; print("FETCHED=" + u.urlopen("http://allowed.test/", timeout=10).read().decode().strip())'
{PY} -c 'import urllib.request as u; u.urlopen("http://denied.test/", timeout=10)' 2>/dev/null; echo DENIED=$?
echo IFACES=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\n' ,)
exit 7
"#,
            hostpid = std::process::id(),
            ip = other.ip,
        );
        let out = sbx_testutil::output_within(
            &mut chain_with(
                &p,
                &["--layers", layers.to_str().unwrap()],
                &["sh", "-c", &script],
                who,
            ),
            Duration::from_secs(120),
        );
        let so = stdout(&out);
        let se = stderr(&out);
        let ctx = format!("{who:?}\nstdout:\n{so}\nstderr:\n{se}");
        assert_eq!(code(&out), 7, "exit status passed through: {ctx}");
        // gVisor's kernel, not the host's.
        let host_release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        assert_ne!(marker(&so, "KERNEL"), host_release.trim(), "{ctx}");
        assert_eq!(marker(&so, "DMESG"), "0", "gVisor's dmesg: {ctx}");
        // Work lands in the project.
        assert_eq!(marker(&so, "EDIT"), "0", "{ctx}");
        assert_eq!(marker(&so, "NEW"), "0", "{ctx}");
        assert!(
            std::fs::read_to_string(p.root.join("src/lib.sh"))
                .unwrap()
                .contains("two()")
        );
        assert_eq!(
            std::fs::read_to_string(p.root.join("src/new.txt")).unwrap(),
            "new\n"
        );
        assert_eq!(marker(&so, "GITCONFIG"), "0", "Read(~/**): {ctx}");
        // Denied and protected paths.
        for k in [
            "DOTENV", "SSH", "DOCS", "SETTINGS", "HOOK", "SHADOW", "HOSTPROC",
        ] {
            assert_ne!(marker(&so, k), "0", "{k} must fail: {ctx}");
        }
        assert!(
            !so.contains("sk-live-secret") && !so.contains("OPENSSH"),
            "{ctx}"
        );
        assert_eq!(
            std::fs::read_to_string(p.root.join("docs/readme.txt")).unwrap(),
            "docs\n"
        );
        assert_eq!(
            std::fs::read_to_string(p.root.join(".claude/settings.json")).unwrap(),
            settings
        );
        assert!(!p.root.join(".git/hooks/pre-commit").exists());
        // sbx-net's egress policy: the allowed name only; neither the
        // host's loopback, nor a denied name, nor a raw IP.
        assert_eq!(marker(&so, "FETCHED"), "hello", "{ctx}");
        assert_ne!(marker(&so, "LOOPBACK"), "0", "{ctx}");
        assert_ne!(marker(&so, "RAWIP"), "0", "{ctx}");
        assert_ne!(marker(&so, "DENIED"), "0", "{ctx}");
        assert_eq!(marker(&so, "IFACES"), "lo,", "only loopback inside: {ctx}");
        assert_event(&p.log, "dns_refused", "alert", |e| {
            e["name"] == "denied.test"
        });
        assert_event(&p.log, "net_denied", "alert", |e| {
            e.to_string().contains(&other.ip.to_string())
        });
        // The log: the chain's tier, then the gVisor step.
        assert_event(&p.log, "chain", "info", |e| {
            e["tier"].as_str().unwrap_or("").contains("gVisor")
        });
        assert_event(&p.log, "gvisor_start", "info", |e| {
            e["platform"] == "ptrace"
                && e["network"].as_str().unwrap_or("").contains("sbx-net")
                && e["rootless"] == (who == As::User)
                && e["cgroup"] == (who == As::Root)
        });
        let ids: std::collections::BTreeSet<String> = audit_events(&p.log)
            .iter()
            .map(|e| e["sbx_id"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(ids.len(), 1, "one SBX_ID: {ids:?}");
        assert_nothing_left(&p, Duration::from_secs(5));
    }
    drop(lo);
}

#[test]
fn zero_trust_print_shows_the_gvisor_step() {
    if runsc().is_none() {
        sbx_testutil::skip!("runsc not installed (scripts/setup installs Debian's runsc)");
    }
    for who in identities() {
        let p = project(who);
        let mut c2 = sbx_testutil::tool("sbx-policy");
        c2.args([
            "chain",
            "--print",
            "--trust",
            "zero",
            "--managed",
            "/nonexistent/m.json",
        ]);
        c2.arg("--home").arg(&p.home);
        c2.args(["--", "make", "test"]);
        c2.current_dir(&p.root)
            .env("PATH", PATH)
            .env("HOME", &p.home);
        run_as(&mut c2, who);
        let out = c2.output().unwrap();
        let so = stdout(&out);
        assert_eq!(code(&out), 0, "{so}{}", stderr(&out));
        assert!(so.contains("# tier: zero trust: gVisor"), "{so}");
        assert!(so.contains("/sbx-gvisor --runsc "), "{so}");
        assert!(so.contains("--rw ") && so.contains("--deny "), "{so}");
        assert_eq!(
            so.contains("--cgroup-bin"),
            who == As::Root,
            "sbx-cgroup as root only: {so}"
        );
        assert!(so.trim_end().ends_with("make test"), "{so}");
    }
}

#[test]
fn zero_trust_killed_leaves_nothing_behind() {
    if runsc().is_none() {
        sbx_testutil::skip!("runsc not installed (scripts/setup installs Debian's runsc)");
    }
    for who in identities() {
        let p = project(who);
        let mut c = chain_cmd(&p, "echo READY; exec sleep 600", who);
        c.stdout(Stdio::piped()).stderr(Stdio::null());
        let mut child = c.spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().map(|l| l.unwrap());
        assert_eq!(first.as_deref(), Some("READY"), "{who:?}");
        // Everything of the sandbox is up (runsc processes with the
        // private directory in their command line).
        let dir = private_dir(&p);
        assert!(!procs_with(&dir.display().to_string()).is_empty());
        // SIGKILL the chain's outermost layer (sbx-policy exec'd it): the
        // layers below, sbx-gvisor too, die without their cleanup code.
        child.kill().unwrap();
        child.wait().unwrap();
        assert_nothing_left(&p, Duration::from_secs(30));
    }
}

#[test]
fn zero_trust_bombs_are_bounded_as_root() {
    if runsc().is_none() {
        sbx_testutil::skip!("runsc not installed (scripts/setup installs Debian's runsc)");
    }
    if !sbx_testutil::is_root() {
        sbx_testutil::skip!(
            "sbx-cgroup needs root here: the gVisor tier has no cgroup unprivileged"
        );
    }
    // Fork bomb: bounded twice. gVisor refuses the guest's forks past
    // RLIMIT_NPROC (derived from --pids: 56 guest processes for 1024), the
    // command goes on and its status passes through (3). But with the
    // ptrace platform each guest process also costs gVisor host tasks (its
    // stub, tracer threads, Go runtime threads, more under load), and the
    // host-side pids limit of sbx-cgroup can be met first: runsc then ends
    // the whole sandbox (2) and the summary counts the hit (an alert).
    // Either way the bomb is bounded and nothing is left; seen both ways
    // on this machine under load, so both are accepted, each checked.
    // The sleeps outlive the loop however slow it runs, so a limit is met.
    let p = project(As::Root);
    let script = "i=0; n=0; while [ $i -lt 300 ]; do (sleep 30 &) 2>/dev/null || n=$((n+1)); i=$((i+1)); done; echo FAILED=$n; exit 3";
    let out = chain_with(&p, &["--pids", "1024"], &["sh", "-c", script], As::Root)
        .output()
        .unwrap();
    let so = stdout(&out);
    let events = sbx_testutil::audit_events(&p.log);
    let summary = events
        .iter()
        .find(|e| e["event"] == "cgroup_summary")
        .cloned()
        .unwrap_or_default();
    let ctx = format!(
        "stdout:\n{so}\nstderr:\n{}\ncgroup_summary: {summary}",
        stderr(&out)
    );
    match code(&out) {
        3 => assert_ne!(marker(&so, "FAILED"), "0", "forks refused inside: {ctx}"),
        2 => assert!(
            summary["pids_limit_hits"].as_u64().unwrap_or(0) >= 1,
            "runsc ended without the host pids limit met: {ctx}"
        ),
        c => panic!("exit {c}: neither the guest's limit nor the host's: {ctx}"),
    }
    assert_eq!(summary["exit_code"], code(&out), "{ctx}");
    assert_nothing_left(&p, Duration::from_secs(5));

    // Memory bomb: the whole gVisor sandbox is inside sbx-cgroup's memory
    // limit: it is OOM-killed there (137), the host is not touched.
    let p = project(As::Root);
    let script = format!("{PY} -c 'b=[]\nwhile True: b.append(b\"x\" * (8<<20))'; echo SURVIVED");
    let out = chain_cmd(&p, &script, As::Root).output().unwrap();
    let so = stdout(&out);
    let ctx = format!("stdout:\n{so}\nstderr:\n{}", stderr(&out));
    assert_eq!(code(&out), 137, "{ctx}");
    assert!(!so.contains("SURVIVED"), "{ctx}");
    assert_event(&p.log, "cgroup_summary", "alert", |e| {
        e["oom_kills"].as_u64().unwrap_or(0) >= 1
    });
    assert_nothing_left(&p, Duration::from_secs(5));
}

/// Unprivileged (runsc --rootless, no cgroup) a memory bomb is bounded per
/// process: gVisor's kernel enforces RLIMIT_AS (from --memory) and the
/// allocation fails inside, instead of growing until the host runs out.
#[test]
fn zero_trust_memory_is_bounded_per_process_unprivileged() {
    if runsc().is_none() {
        sbx_testutil::skip!("runsc not installed (scripts/setup installs Debian's runsc)");
    }
    if !identities().contains(&As::User) {
        sbx_testutil::skip!("needs root to run as the unprivileged test user");
    }
    let p = project(As::User);
    let script = format!(
        "{PY} -c '\nb=[]\ntry:\n    while True: b.append(b\"x\" * (8<<20))\nexcept MemoryError: print(\"MEMERR=%d\" % (len(b) * 8))\n'; echo DONE=$?"
    );
    let mut c = chain_with(&p, &["--timeout", "60s"], &["sh", "-c", &script], As::User);
    let out = sbx_testutil::output_within(&mut c, Duration::from_secs(90));
    let so = stdout(&out);
    let ctx = format!("stdout:\n{so}\nstderr:\n{}", stderr(&out));
    assert_eq!(code(&out), 0, "{ctx}");
    let mb: u64 = marker(&so, "MEMERR").parse().unwrap();
    assert!(mb <= 512, "at most --memory 512M per process: {ctx}");
    assert_event(&p.log, "gvisor_start", "info", |e| {
        e["rootless"] == true && e["cgroup"] == false
    });
    assert_nothing_left(&p, Duration::from_secs(5));
}

#[test]
fn zero_trust_command_not_found_or_not_executable() {
    if runsc().is_none() {
        sbx_testutil::skip!("runsc not installed (scripts/setup installs Debian's runsc)");
    }
    for who in identities() {
        let p = project(who);
        let plain = p.root.join("src/lib.sh");
        for (prog, want) in [
            ("no-such-program-sbx", 127),
            ("./no/such/file", 127),
            (plain.to_str().unwrap(), 126),
        ] {
            let mut c = sbx_testutil::tool("sbx-policy");
            c.args([
                "chain",
                "--trust",
                "zero",
                "--managed",
                "/nonexistent/m.json",
            ]);
            c.arg("--home").arg(&p.home);
            c.args(["--", prog]);
            c.current_dir(&p.root)
                .env("PATH", PATH)
                .env("HOME", &p.home);
            run_as(&mut c, who);
            let out = c.output().unwrap();
            assert_eq!(code(&out), want, "{who:?} {prog}: {}", stderr(&out));
            assert_eq!(stderr(&out).trim().lines().count(), 1, "{}", stderr(&out));
        }
    }
}

/// The Bash rules hold in gVisor. Invoke mode: an unlisted command is
/// refused before anything starts (126, command_denied). Strict mode: a
/// script the rules allow runs, and every mount is noexec but the listed
/// programs (and the dynamic loaders), so an unlisted program it starts is
/// refused with EACCES (126) by gVisor's kernel and an exec_denied alert
/// is logged (from runsc's exec trace); memfd_create is refused; `--print`
/// says so. uid 0 inside is the caller: what it creates is the caller's.
#[test]
fn zero_trust_applies_the_exec_allowlist() {
    if runsc().is_none() {
        sbx_testutil::skip!("runsc not installed (scripts/setup installs Debian's runsc)");
    }
    let settings = r#"{"permissions": {"allow": ["Bash(git:*)", "Bash(python3:*)",
        "Bash(./src/agent.sh)", "Edit(./**)"]}}"#;
    // A memfd would run whatever the mounts say: memfd_create is refused.
    let script = "#!/bin/sh\nid -u; echo ID=$?; git --version >/dev/null; echo GIT=$?\n\
        python3 -c 'import os; os.memfd_create(\"x\")' 2>/dev/null; echo MEMFD=$?\n\
        echo made > src/new.txt; exit 5\n";
    for who in identities() {
        let p = project_with(who, settings);
        let agent = p.root.join("src/agent.sh");
        write(&agent, script);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();

        // Invoke mode (the default): `id` is not the agent's to run.
        let out = sbx_testutil::output_within(
            &mut chain_with(&p, &[], &["id", "-u"], who),
            Duration::from_secs(60),
        );
        assert_eq!(code(&out), 126, "{who:?}: {}", stderr(&out));
        assert_event(&p.log, "command_denied", "alert", |e| {
            e["refused"] == "id -u"
        });
        assert!(
            !audit_events(&p.log)
                .iter()
                .any(|e| e["event"] == "gvisor_start"),
            "nothing started"
        );

        // Strict mode: the script runs; what it starts is checked.
        let out = sbx_testutil::output_within(
            &mut chain_with(
                &p,
                &["--exec-allowlist", "strict"],
                &["./src/agent.sh"],
                who,
            ),
            Duration::from_secs(120),
        );
        let so = stdout(&out);
        let ctx = format!("{who:?}\nstdout:\n{so}\nstderr:\n{}", stderr(&out));
        assert_eq!(code(&out), 5, "{ctx}");
        assert_eq!(marker(&so, "ID"), "126", "id is not listed: {ctx}");
        assert_eq!(marker(&so, "GIT"), "0", "git is listed: {ctx}");
        assert_eq!(marker(&so, "MEMFD"), "1", "memfd_create refused: {ctx}");
        assert_event(&p.log, "exec_denied", "alert", |e| {
            e["path"].as_str().is_some_and(|x| x.ends_with("/id"))
                && e["enforced_by"] == "gvisor noexec mounts"
        });
        // The caller owns what the command made.
        use std::os::unix::fs::MetadataExt;
        let want = match who {
            As::Root => 0,
            As::User => sbx_testutil::test_user().unwrap().0,
        };
        assert_eq!(
            std::fs::metadata(p.root.join("src/new.txt")).unwrap().uid(),
            want,
            "{ctx}"
        );
        assert_nothing_left(&p, Duration::from_secs(5));

        let mut c = sbx_testutil::tool("sbx-policy");
        c.args([
            "chain",
            "--print",
            "--trust",
            "zero",
            "--managed",
            "/nonexistent/m.json",
            "--exec-allowlist",
            "strict",
        ]);
        c.arg("--home").arg(&p.home);
        c.args(["--", "git", "status"]);
        c.current_dir(&p.root)
            .env("PATH", PATH)
            .env("HOME", &p.home);
        run_as(&mut c, who);
        let out = c.output().unwrap();
        let so = stdout(&out);
        assert_eq!(code(&out), 0, "{so}{}", stderr(&out));
        assert!(
            so.contains("gvisor --runsc") && so.contains("--allow-exec "),
            "{so}"
        );
        assert!(
            so.contains("execute allowlist") && so.contains("noexec"),
            "{so}"
        );
        assert!(
            so.contains("uid 0 inside without capabilities is the caller"),
            "{so}"
        );
    }
}

/// Denied names fail at once inside gVisor: sbx-net's DNS proxy refuses
/// them (as in the namespace chain), with its alert, instead of 70-90 s of
/// retries against an unreachable resolver. And the git stage: a commit, a
/// branch, a stash and a gc made inside land on the host after
/// sbx-gitguard's checks.
#[test]
fn zero_trust_names_fail_at_once_and_commits_land() {
    if runsc().is_none() {
        sbx_testutil::skip!("runsc not installed (scripts/setup installs Debian's runsc)");
    }
    let settings = r#"{"permissions": {"allow": ["Edit(./**)"]}}"#;
    for who in identities() {
        let p = project_with(who, settings);
        // .env is hidden inside (an unreadable cover): git cannot index a
        // tracked file it cannot read, so it is untracked here.
        git(&p.root, &["rm", "-q", "--cached", ".env"]);
        git(&p.root, &["commit", "-qm", "untrack .env"]);
        write(&p.root.join(".git/info/exclude"), ".env\n");
        if who == As::User {
            // What the host's git just wrote (as root) is the user's too.
            chown_r(&p.root);
        }
        let before = git(&p.root, &["rev-parse", "HEAD"]);
        let script = format!(
            r#"
timeout 5 {PY} -c '
import socket
try:
    socket.getaddrinfo("denied.example.com", 443)
    print("GAI=resolved")
except socket.gaierror as e:
    print("GAI=%d" % e.errno)
'
echo DNS=$?
G="git -c user.name=agent -c user.email=agent@example.invalid"
echo more > src/more.txt
$G add src/more.txt && $G commit -qm inside; echo COMMIT=$?
$G checkout -q -b feat; echo BRANCH=$?
echo wip >> src/lib.sh; $G stash -q; echo STASH=$?
$G gc -q; echo GC=$?
"#
        );
        // Room for git gc's processes (as root, --pids 256 leaves the guest
        // 8: see guest_nproc).
        let mut c = chain_with(&p, &["--pids", "1024"], &["sh", "-c", &script], who);
        let out = sbx_testutil::output_within(&mut c, Duration::from_secs(120));
        let so = stdout(&out);
        let ctx = format!("{who:?}\nstdout:\n{so}\nstderr:\n{}", stderr(&out));
        assert_eq!(code(&out), 0, "{ctx}");
        // Refused (EAI_AGAIN, -3) or no such name (EAI_NONAME, -2) within
        // `timeout 5`, not a resolver that never answers (124).
        assert_eq!(marker(&so, "DNS"), "0", "{ctx}");
        assert!(["-2", "-3"].contains(&marker(&so, "GAI").as_str()), "{ctx}");
        assert_event(&p.log, "dns_refused", "alert", |e| {
            e["name"] == "denied.example.com"
        });
        for k in ["COMMIT", "BRANCH", "STASH", "GC"] {
            assert_eq!(marker(&so, k), "0", "{k}: {ctx}");
        }
        // On the host: verified, the refs moved.
        git(&p.root, &["fsck", "--strict"]);
        let main = git(&p.root, &["rev-parse", "refs/heads/main"]);
        assert_ne!(main, before, "{ctx}");
        assert_eq!(git(&p.root, &["rev-parse", "refs/heads/feat"]), main);
        assert_eq!(
            git(&p.root, &["symbolic-ref", "HEAD"]).trim(),
            "refs/heads/feat"
        );
        assert_eq!(git(&p.root, &["show", "main:src/more.txt"]), "more\n");
        git(&p.root, &["rev-parse", "--verify", "refs/stash"]);
        assert_event(&p.log, "git_stage_imported", "info", |_| true);
        assert_nothing_left(&p, Duration::from_secs(5));
    }
}
