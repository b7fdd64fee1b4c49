//! deploy/k8s on a real engine that reads Kubernetes pod specs: the sbx
//! base image (scripts/build-image, from the test binaries), the Job of one
//! agent turn run with `podman kube play` (deploy/k8s/podman-play: the
//! Job's pod, procMount -> privileged for Podman 4.3, in a `hostUsers:
//! false` pod), attacks (a protected file written, a denied file read, a
//! name outside the egress allowlist fetched) refused with their alerts in
//! the pod's log, the exit
//! status passed through, nothing left after the pod is removed; the doctor
//! init container failing the pod early; the manifests rendered and checked
//! against the Kubernetes schema.
//!
//! Root only: rootful Podman (the fixture of sbx-container's tests). As the
//! unprivileged user, `podman kube play` would be rootless Podman with a
//! user-namespaced pod inside its own user namespace: it needs a subordinate
//! id range of 65536 per pod beyond the user's own 65536 (/etc/subuid gives
//! sbxtest one range), so it is not run.

use std::path::{Path, PathBuf};
use std::process::Command;

use sbx_testutil::container::Podman;
use sbx_testutil::{code, stderr, stdout};
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Points `cmd` (podman, or a script that runs it) at the fixture's
/// configuration and storage (no service needed).
fn engine<'a>(p: &Podman, cmd: &'a mut Command) -> &'a mut Command {
    cmd.env("CONTAINERS_CONF", p.dir.path().join("containers.conf"))
        .env("CONTAINERS_STORAGE_CONF", p.dir.path().join("storage.conf"))
        .stdin(std::process::Stdio::null())
}

fn podman(p: &Podman) -> Command {
    let mut c = Command::new("podman");
    engine(p, &mut c);
    c
}

/// One pod of these manifests at a time on the shared storage: the tests
/// play the same names (the Job's pod, its ConfigMap volumes).
fn lock() -> std::fs::File {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(sbx_testutil::container::shared_root().join("k8s.lock"))
        .unwrap();
    // SAFETY: flock on an fd this function owns; released when it closes.
    assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
    f
}

fn play_script() -> PathBuf {
    root().join("deploy/k8s/podman-play")
}

/// The sbx base image built from the test binaries, on `p`'s storage.
fn image(p: &Podman) -> String {
    let bin = sbx_testutil::bin("sbx-fs").parent().unwrap().to_path_buf();
    let tag = "localhost/sbx:test";
    let out = engine(p, &mut Command::new(root().join("scripts/build-image")))
        .arg("--bin-dir")
        .arg(&bin)
        .args(["--tag", tag])
        .output()
        .unwrap();
    assert!(out.status.success(), "build-image: {}", stderr(&out));
    let lines: Vec<_> = stdout(&out).lines().map(String::from).collect();
    assert_eq!(lines[0], tag, "{lines:?}");
    let size: u64 = lines[1].parse().unwrap();
    assert!(size > 1_000_000, "image size {size}");
    tag.to_string()
}

/// podman-play render DIR ARGS... into FILE.
fn render(dir: &str, args: &[&str], file: &Path) {
    let out = Command::new(play_script())
        .arg("render")
        .arg(root().join(dir))
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "render: {}", stderr(&out));
    std::fs::write(file, &out.stdout).unwrap();
}

/// podman-play down FILE, then: no pod, container or volume of it left.
fn down_and_check_nothing_left(p: &Podman, file: &Path, pod: &str, volumes: &[&str]) {
    let out = engine(p, &mut Command::new(play_script()))
        .arg("down")
        .arg(file)
        .output()
        .unwrap();
    assert!(out.status.success(), "down: {}", stderr(&out));
    let q = |args: &[&str]| {
        let o = podman(p).args(args).output().unwrap();
        assert!(o.status.success(), "podman {args:?}: {}", stderr(&o));
        stdout(&o)
    };
    assert_eq!(
        q(&["pod", "ps", "-q", "--filter", &format!("name=^{pod}$")]),
        ""
    );
    assert_eq!(
        q(&["ps", "-a", "-q", "--filter", &format!("name=^{pod}-")]),
        ""
    );
    let vols = q(&["volume", "ls", "--format", "{{.Name}}"]);
    for v in volumes {
        assert!(!vols.lines().any(|l| l == *v), "volume {v} left: {vols}");
    }
    let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mi.contains(&format!("/volumes/{pod}-")),
        "a volume of {pod} is still mounted"
    );
}

/// The seed project: a git repository with a secret-looking .env, readable
/// by the pod's ids (other users on the host).
fn seed() -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("sbx-k8s-")
        .tempdir()
        .unwrap();
    let p = d.path();
    std::fs::write(p.join("README"), "hello from the project\n").unwrap();
    std::fs::write(p.join(".env"), "TOKEN=k8s-secret-value\n").unwrap();
    for args in [
        &["init", "-q", "."][..],
        &["add", "README"],
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.invalid",
            "commit",
            "-qm",
            "init",
        ],
    ] {
        let o = Command::new("git")
            .current_dir(p)
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "git {args:?}: {}", stderr(&o));
    }
    let o = Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(p)
        .output()
        .unwrap();
    assert!(o.status.success());
    d
}

fn json_lines(log: &str) -> Vec<Value> {
    log.lines()
        .filter(|l| l.starts_with("{\""))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
        .collect()
}

const TASK: &str = r#"echo "in the sandbox: uid $(id -u)"
cat README
echo pwned >> .git/config && echo WROTE-GIT-CONFIG
cat .env && echo READ-ENV
nc -w 5 192.0.2.1 80 </dev/null && echo CONNECTED
exit 7
"#;

#[test]
fn a_job_runs_its_turn_in_the_chain_refuses_an_attack_with_alerts_in_the_pod_log() {
    let Some(p) = Podman::start() else {
        sbx_testutil::skip!("needs root and podman (scripts/setup installs it)");
    };
    let _l = lock();
    let tag = image(&p);
    let src = seed();
    let before = std::fs::read(src.path().join(".git/config")).unwrap();
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("play.yaml");
    let task = format!("sbx-task.task.sh={TASK}");
    let source = format!("source={}", src.path().display());
    render(
        "deploy/k8s/job",
        &["--image", &tag, "--hostpath", &source, "--set", &task],
        &file,
    );
    let out = podman(&p)
        .args(["kube", "play"])
        .arg(&file)
        .output()
        .unwrap();
    let pod = "sbx-agent-turn";
    let vols = [
        "sbx-agent-turn-source",
        "sbx-agent-turn-work",
        "sbx-agent-turn-log",
        "sbx-agent-turn-tmp",
        "sbx-policy",
        "sbx-task",
    ];
    if !out.status.success() {
        down_and_check_nothing_left(&p, &file, pod, &vols);
        panic!("kube play: {}", stderr(&out));
    }
    let agent = format!("{pod}-agent");
    // The turn is short; podman wait returns when the container exits.
    let w = sbx_testutil::output_within(
        podman(&p).args(["wait", &agent]),
        std::time::Duration::from_secs(180),
    );
    let logs = podman(&p).args(["logs", &agent]).output().unwrap();
    let log = format!("{}{}", stdout(&logs), stderr(&logs));
    let inspect = podman(&p).args(["inspect", &agent]).output().unwrap();
    down_and_check_nothing_left(&p, &file, pod, &vols);

    // The Job's exit status: the task's, through sbx-pod and the chain.
    assert_eq!(stdout(&w).trim(), "7", "wait: {} log: {log}", stderr(&w));
    let info: Value = serde_json::from_slice(&inspect.stdout).unwrap();
    let c = &info[0];
    assert_eq!(c["State"]["ExitCode"], 7, "{log}");
    // hostUsers: false: the pod has a user namespace of its own.
    let uidmap = c["HostConfig"]["IDMappings"]["UidMap"].to_string();
    assert!(
        uidmap.contains(':') && !uidmap.contains("\"0:0:"),
        "not user-namespaced: {uidmap}"
    );
    assert!(log.contains("in the sandbox: uid 1000"), "{log}");
    assert!(log.contains("hello from the project"), "{log}");
    assert!(!log.contains("WROTE-GIT-CONFIG"), "{log}");
    assert!(!log.contains("k8s-secret-value"), "{log}");
    // The audit log reached the pod's log, one identity for every line.
    let ev = json_lines(&log);
    assert!(ev.len() > 5, "{log}");
    for e in &ev {
        assert_eq!(e["sbx_id"], pod, "{e}");
    }
    let has = |event: &str, path: &str| {
        ev.iter()
            .any(|e| e["event"] == event && e["severity"] == "alert" && e["path"] == path)
    };
    assert!(has("fs_write_denied", "/work/.git/config"), "{log}");
    assert!(has("fs_denied", "/work/.env"), "{log}");
    // Egress outside the allowlist (the policy allows api.anthropic.com;
    // an address: the image's static busybox has no working resolver).
    assert!(!log.contains("CONNECTED"), "{log}");
    assert!(
        ev.iter().any(|e| e["event"] == "net_denied"
            && e["severity"] == "alert"
            && e["dst"] == "192.0.2.1"),
        "{log}"
    );
    assert!(ev.iter().any(|e| e["event"] == "chain"), "{log}");
    // The seed (the pod's source) is untouched.
    assert_eq!(
        std::fs::read(src.path().join(".git/config")).unwrap(),
        before
    );
}

#[test]
fn the_doctor_init_container_fails_the_pod_before_the_agent_starts() {
    let Some(p) = Podman::start() else {
        sbx_testutil::skip!("needs root and podman (scripts/setup installs it)");
    };
    let _l = lock();
    let tag = image(&p);
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("play.yaml");
    // procMount kept: Podman 4.3 ignores it, so /proc is masked, as on a
    // cluster without procMount: Unmasked.
    render(
        "deploy/k8s/job",
        &[
            "--image",
            &tag,
            "--keep-procmount",
            "--set",
            "sbx-task.task.sh=echo AGENT-RAN",
        ],
        &file,
    );
    let out = podman(&p)
        .args(["kube", "play"])
        .arg(&file)
        .output()
        .unwrap();
    let pod = "sbx-agent-turn";
    let doctor = podman(&p)
        .args(["logs", &format!("{pod}-doctor")])
        .output()
        .unwrap();
    let agent = podman(&p)
        .args(["logs", &format!("{pod}-agent")])
        .output()
        .unwrap();
    down_and_check_nothing_left(
        &p,
        &file,
        pod,
        &[
            "sbx-agent-turn-source",
            "sbx-agent-turn-work",
            "sbx-agent-turn-log",
            "sbx-agent-turn-tmp",
            "sbx-policy",
            "sbx-task",
        ],
    );
    assert_ne!(code(&out), 0, "kube play: {}", stdout(&out));
    assert!(
        stderr(&out).contains("init container"),
        "kube play: {}",
        stderr(&out)
    );
    let d = stdout(&doctor);
    assert!(
        d.contains("FAIL  userns")
            && d.contains("mount a new /proc")
            && d.contains("procMount: Unmasked"),
        "doctor: {d}{}",
        stderr(&doctor)
    );
    assert!(!stdout(&agent).contains("AGENT-RAN"));
}

/// Each kustomization renders (kubectl kustomize when installed, else
/// podman-play's reading of the same resources) and passes the Kubernetes
/// schema check, strict (an unknown field fails it).
#[test]
fn the_manifests_render_and_pass_the_kubernetes_schema() {
    let validator = Path::new("/opt/sbx-py/bin/kubernetes-validate");
    if !validator.exists() {
        sbx_testutil::skip!("needs kubernetes-validate (scripts/setup: pip-k8s.txt)");
    }
    let have_kubectl = Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    let work = tempfile::tempdir().unwrap();
    for dir in ["deploy/k8s/job", "deploy/k8s/session"] {
        let out = if have_kubectl {
            Command::new("kubectl")
                .arg("kustomize")
                .arg(root().join(dir))
                .output()
                .unwrap()
        } else {
            Command::new(play_script())
                .arg("resources")
                .arg(root().join(dir))
                .output()
                .unwrap()
        };
        assert!(out.status.success(), "{dir}: {}", stderr(&out));
        let text = stdout(&out);
        for kind in ["ServiceAccount", "ConfigMap"] {
            assert!(text.contains(&format!("kind: {kind}")), "{dir}: {text}");
        }
        let file = work.path().join("r.yaml");
        std::fs::write(&file, &text).unwrap();
        let v = Command::new(validator)
            .args(["--strict", "-k", "1.33.0"])
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            v.status.success() && !stdout(&v).contains("FAIL"),
            "{dir}: {}{}",
            stdout(&v),
            stderr(&v)
        );
        // The check has teeth: a misspelt field fails it.
        let line = text
            .lines()
            .find(|l| l.trim() == "hostUsers: false")
            .unwrap();
        let indent = &line[..line.len() - line.trim_start().len()];
        let bad = text.replacen(line, &format!("{line}\n{indent}hostUserz: false"), 1);
        std::fs::write(&file, bad).unwrap();
        let v = Command::new(validator)
            .args(["--strict", "-k", "1.33.0"])
            .arg(&file)
            .output()
            .unwrap();
        assert!(!v.status.success(), "{dir}: a misspelt field passed");
    }
}

/// The session Pod: its program runs in the chain until the pod is
/// stopped; the stop's SIGTERM reaches the chain through sbx-pod, every
/// layer ends and logs its end (status 143) into the pod's log before the
/// engine's grace period, and nothing is left.
#[test]
fn a_stopped_session_pod_ends_its_chain_and_logs_the_end() {
    let Some(p) = Podman::start() else {
        sbx_testutil::skip!("needs root and podman (scripts/setup installs it)");
    };
    let _l = lock();
    let tag = image(&p);
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("play.yaml");
    render(
        "deploy/k8s/session",
        &[
            "--image",
            &tag,
            "--set",
            "sbx-task.task.sh=echo SESSION-UP; sleep 600",
        ],
        &file,
    );
    let pod = "sbx-agent-session";
    let vols = [
        "sbx-agent-session-source",
        "sbx-agent-session-work",
        "sbx-agent-session-log",
        "sbx-agent-session-tmp",
        "sbx-policy",
        "sbx-task",
    ];
    let out = podman(&p)
        .args(["kube", "play"])
        .arg(&file)
        .output()
        .unwrap();
    if !out.status.success() {
        down_and_check_nothing_left(&p, &file, pod, &vols);
        panic!("kube play: {}", stderr(&out));
    }
    let agent = format!("{pod}-agent");
    let logs = || {
        let o = podman(&p).args(["logs", &agent]).output().unwrap();
        format!("{}{}", stdout(&o), stderr(&o))
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !logs().contains("SESSION-UP") && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let up = logs().contains("SESSION-UP");
    // A grace period far above what the chain needs: a stop that ends by
    // SIGKILL would show as 137.
    let stop = sbx_testutil::output_within(
        podman(&p).args(["stop", "-t", "60", &agent]),
        std::time::Duration::from_secs(120),
    );
    let log = logs();
    let inspect = podman(&p).args(["inspect", &agent]).output().unwrap();
    down_and_check_nothing_left(&p, &file, pod, &vols);
    assert!(up, "the session never started: {log}");
    assert!(stop.status.success(), "stop: {}", stderr(&stop));
    let info: Value = serde_json::from_slice(&inspect.stdout).unwrap();
    assert_eq!(info[0]["State"]["ExitCode"], 143, "{log}");
    let ev = json_lines(&log);
    for tool in ["sbx-fs", "sbx-net"] {
        assert!(
            ev.iter().any(|e| e["tool"] == tool
                && (e["event"] == "end" || e["event"] == "net_end")
                && (e["status"] == 143 || e["exit_code"] == 143)),
            "no end of {tool}: {log}"
        );
    }
    for e in &ev {
        assert_eq!(e["sbx_id"], pod, "{e}");
    }
}
