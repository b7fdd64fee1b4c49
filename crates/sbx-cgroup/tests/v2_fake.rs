//! cgroup v2 logic against a fake cgroupfs in a temp dir (as youki and
//! Firecracker's jailer test theirs): discovery, the delegation checks, the
//! files the limits are written to, the figures read back, cgroup.kill and
//! removal. The kernel side (joining, limits taking effect) is tested on the
//! real v1 controllers in attacks.rs and cli.rs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sbx_cgroup::discover::{Host, Mode, discover};
use sbx_cgroup::group::{GroupError, SandboxGroup, plan};
use sbx_cgroup::limits::{Limits, Raw};
use sbx_cgroup::owner::{Owner, read_owner};

const OWN: &str = "/user.slice/user-1000.slice/user@1000.service/app.slice/run-1.scope";

struct Fake {
    tmp: tempfile::TempDir,
    host: Host,
}

impl Fake {
    /// A pure v2 host; the caller's cgroup is OWN, offering `controllers`.
    fn new(controllers: &str) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        std::fs::create_dir_all(root.join("proc/self")).unwrap();
        std::fs::write(root.join("proc/self/cgroup"), format!("0::{OWN}\n")).unwrap();
        std::fs::write(
            root.join("proc/self/mountinfo"),
            "22 1 0:21 / /sys rw - sysfs sysfs rw\n\
             30 22 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n",
        )
        .unwrap();
        let f = Fake {
            host: Host::new(root),
            tmp,
        };
        f.mkgroup(OWN, controllers, "");
        f
    }

    fn dir(&self, cg: &str) -> PathBuf {
        self.tmp
            .path()
            .join("sys/fs/cgroup")
            .join(cg.trim_start_matches('/'))
    }

    fn mkgroup(&self, cg: &str, controllers: &str, subtree: &str) {
        let d = self.dir(cg);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("cgroup.controllers"), controllers).unwrap();
        std::fs::write(d.join("cgroup.subtree_control"), subtree).unwrap();
        std::fs::write(d.join("cgroup.procs"), "").unwrap();
    }
}

fn limits(
    memory: Option<&str>,
    swap: Option<&str>,
    cpus: Option<&str>,
    pids: Option<&str>,
    io: Option<&str>,
) -> Limits {
    Limits::parse(&Raw {
        memory,
        memory_swap: swap,
        cpus,
        cpu_weight: Some("300"),
        pids,
        io_weight: io,
        rlimits: &[],
        timeout: None,
    })
    .unwrap()
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn discovery_finds_the_own_v2_group() {
    let f = Fake::new("cpu io memory pids");
    let l = discover(&f.host).unwrap();
    assert_eq!(l.mode(), Mode::V2);
    let h = l.v2.unwrap();
    assert_eq!(h.dir_of(&h.own).unwrap(), f.dir(OWN));
}

#[test]
fn limits_go_to_the_v2_files_and_controllers_are_delegated_down() {
    let f = Fake::new("cpuset cpu io memory pids");
    let l = discover(&f.host).unwrap();
    let lim = limits(Some("256M"), None, Some("0.5"), Some("64"), Some("200"));
    let targets = plan(&l, None, &lim).unwrap();
    assert_eq!(targets.len(), 1);
    assert_eq!(targets[0].parent, f.dir(OWN));
    let me = Owner::me("fake1");
    let mut g = SandboxGroup::create(&f.host, &targets, "sbx-fake1", &lim, &me).unwrap();
    let d = f.dir(OWN).join("sbx-fake1");
    assert_eq!(g.dirs[0].path, d);
    assert_eq!(
        read(&f.dir(OWN).join("cgroup.subtree_control")),
        "+memory +pids +cpu +io"
    );
    assert_eq!(read(&d.join("memory.max")), (256u64 << 20).to_string());
    // Default: no swap beyond the memory limit.
    assert_eq!(read(&d.join("memory.swap.max")), "0");
    assert_eq!(read(&d.join("pids.max")), "64");
    assert_eq!(read(&d.join("cpu.max")), "50000 100000");
    assert_eq!(read(&d.join("cpu.weight")), "300");
    assert_eq!(read(&d.join("io.weight")), "default 200");
    // The owner record (an xattr on the temp dir's filesystem).
    if let Some(o) = read_owner(&d) {
        assert_eq!(o, me);
    }
    // The join fds are open on cgroup.procs.
    assert_eq!(g.procs_fds().len(), 1);

    // Figures as the kernel would report them.
    std::fs::write(d.join("memory.peak"), "12345678\n").unwrap();
    std::fs::write(
        d.join("memory.events"),
        "low 0\nhigh 0\nmax 9\noom 2\noom_kill 2\noom_group_kill 0\n",
    )
    .unwrap();
    std::fs::write(d.join("pids.events"), "max 5\n").unwrap();
    std::fs::write(
        d.join("cpu.stat"),
        "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n",
    )
    .unwrap();
    let s = g.stats();
    assert_eq!(s.peak_memory_bytes, Some(12_345_678));
    assert_eq!(s.oom_kills, 2);
    assert_eq!(s.pids_limit_hits, 5);
    assert_eq!(s.cpu_time_ns, Some(1_500_000));

    g.destroy(Duration::from_secs(1)).unwrap();
    assert!(!d.exists());
    // Only the sandbox group was removed.
    assert!(f.dir(OWN).join("cgroup.procs").exists());
}

#[test]
fn memory_swap_is_the_total_on_v2_too() {
    let f = Fake::new("memory pids");
    let l = discover(&f.host).unwrap();
    let lim = Limits::parse(&Raw {
        memory: Some("1G"),
        memory_swap: Some("3G"),
        ..Default::default()
    })
    .unwrap();
    let t = plan(&l, None, &lim).unwrap();
    let mut g = SandboxGroup::create(&f.host, &t, "sbx-swap", &lim, &Owner::me("swap")).unwrap();
    let d = f.dir(OWN).join("sbx-swap");
    assert_eq!(read(&d.join("memory.max")), (1u64 << 30).to_string());
    assert_eq!(read(&d.join("memory.swap.max")), (2u64 << 30).to_string());
    // Controllers already enabled are not written again.
    g.destroy(Duration::from_secs(1)).unwrap();
}

#[test]
fn a_controller_the_parent_does_not_delegate_is_one_clear_error_and_nothing_is_created() {
    let f = Fake::new("memory pids");
    let l = discover(&f.host).unwrap();
    let lim = limits(None, None, Some("1"), None, None);
    let e = plan(&l, None, &lim).unwrap_err();
    assert!(
        matches!(e, GroupError::NoController { ctrl: "cpu", .. }),
        "{e}"
    );
    assert!(
        e.to_string().contains("--cpus needs the cpu controller"),
        "{e}"
    );
    let entries: Vec<_> = std::fs::read_dir(f.dir(OWN))
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .collect();
    assert!(entries.is_empty());
    assert_eq!(read(&f.dir(OWN).join("cgroup.subtree_control")), "");
}

#[test]
fn parent_paths_absolute_relative_and_missing() {
    let f = Fake::new("memory pids");
    f.mkgroup("/sandboxes", "memory pids", "memory pids");
    f.mkgroup(&format!("{OWN}/inner"), "memory pids", "memory pids");
    let l = discover(&f.host).unwrap();
    let lim = Limits::default();
    let t = plan(&l, Some("/sandboxes"), &lim).unwrap();
    assert_eq!(t[0].parent, f.dir("/sandboxes"));
    // Already enabled: nothing to write.
    assert!(t[0].enable.is_empty());
    let t = plan(&l, Some("inner"), &lim).unwrap();
    assert_eq!(t[0].parent, f.dir(&format!("{OWN}/inner")));
    let e = plan(&l, Some("/nope"), &lim).unwrap_err();
    assert!(e.to_string().contains("no such cgroup"), "{e}");
    let e = plan(&l, Some("inner/../../x"), &lim).unwrap_err();
    assert!(e.to_string().contains("'..'"), "{e}");
}

#[test]
fn kill_writes_cgroup_kill_and_signals_what_is_listed() {
    let f = Fake::new("memory pids");
    let l = discover(&f.host).unwrap();
    let lim = Limits::default();
    let t = plan(&l, None, &lim).unwrap();
    let mut g = SandboxGroup::create(&f.host, &t, "sbx-kill", &lim, &Owner::me("kill")).unwrap();
    let d = f.dir(OWN).join("sbx-kill");
    // A real process listed in the fake group; a thread reaps it when it dies.
    let mut sleeper = std::process::Command::new("sleep")
        .arg("1000")
        .spawn()
        .unwrap();
    let pid = sleeper.id();
    std::fs::write(d.join("cgroup.procs"), format!("{pid}\n")).unwrap();
    std::fs::write(d.join("cgroup.kill"), "").unwrap();
    let reaper = std::thread::spawn(move || sleeper.wait().unwrap());
    g.kill_all(Duration::from_secs(10)).unwrap();
    assert_eq!(read(&d.join("cgroup.kill")), "1");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(reaper.join().unwrap().signal(), Some(libc::SIGKILL));
    assert_eq!(g.killed, 1);
    g.destroy(Duration::from_secs(1)).unwrap();
    assert!(!d.exists());
}

/// Set in the re-executed test binary (as the unprivileged user): the root
/// of the parent's fake cgroupfs.
const CHILD_ENV: &str = "SBX_CG_FAKE_ROOT";

fn refused_as_not_delegated(host: &Host) -> bool {
    let l = discover(host).unwrap();
    match plan(&l, None, &Limits::default()) {
        Err(e) => {
            let m = e.to_string();
            m.contains("not delegated") && m.contains("systemd-run --user --scope -p Delegate=yes")
        }
        Ok(_) => false,
    }
}

#[test]
fn a_non_delegated_v2_parent_is_refused_for_an_unprivileged_caller() {
    if let Some(root) = std::env::var_os(CHILD_ENV) {
        // The re-executed child, running as the test user.
        assert!(refused_as_not_delegated(&Host::new(PathBuf::from(root))));
        return;
    }
    let f = Fake::new("memory pids");
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        // The fake files are ours: make them read-only.
        for p in ["cgroup.procs", "cgroup.subtree_control"] {
            let fp = f.dir(OWN).join(p);
            std::fs::set_permissions(&fp, std::os::unix::fs::PermissionsExt::from_mode(0o444))
                .unwrap();
        }
        assert!(refused_as_not_delegated(&f.host));
        return;
    }
    // As root: the same test binary, re-executed as the unprivileged test
    // user, checks the root-owned fake group (not delegated to it).
    if sbx_testutil::test_user().is_none() {
        sbx_testutil::skip!("test user missing (scripts/setup)");
    }
    let st = std::process::Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(f.tmp.path())
        .status()
        .unwrap();
    assert!(st.success());
    let mut c = std::process::Command::new(std::env::current_exe().unwrap());
    c.args([
        "a_non_delegated_v2_parent_is_refused_for_an_unprivileged_caller",
        "--exact",
        "--nocapture",
    ])
    .env(CHILD_ENV, f.tmp.path());
    sbx_testutil::run_as(&mut c, sbx_testutil::As::User);
    match c.output() {
        Ok(out) => assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed"),
            "the unprivileged caller was not refused: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            sbx_testutil::skip!("the test binary is not reachable by the test user: {e}");
        }
        Err(e) => panic!("re-exec: {e}"),
    }
}

#[test]
fn a_supervisor_alone_in_its_delegated_group_steps_into_a_leaf_and_back() {
    use sbx_cgroup::leaf::Leaf;
    let f = Fake::new("memory pids");
    let own = f.dir(OWN);
    std::fs::write(
        own.join("cgroup.procs"),
        format!("{}\n", std::process::id()),
    )
    .unwrap();
    let l = discover(&f.host).unwrap();
    let lim = Limits::default();
    let t = plan(&l, None, &lim).unwrap();
    assert_eq!(t[0].enable, vec!["memory", "pids"]);
    let me = Owner::me("leaf");
    // Not for an explicit --parent.
    assert!(
        Leaf::enter_if_needed(&t[0], false, "sbx-leaf", &me, false)
            .unwrap()
            .is_none()
    );
    let leaf = Leaf::enter_if_needed(&t[0], true, "sbx-leaf", &me, false)
        .unwrap()
        .expect("a leaf");
    assert_eq!(leaf.leaf, own.join("sbx-leaf.supervisor"));
    // The supervisor moved itself ("0" = the writer) into the leaf.
    assert_eq!(read(&leaf.leaf.join("cgroup.procs")), "0");
    let mut g = SandboxGroup::create(&f.host, &t, "sbx-leaf", &lim, &me).unwrap();
    assert_eq!(read(&own.join("cgroup.subtree_control")), "+memory +pids");
    g.destroy(Duration::from_secs(1)).unwrap();
    leaf.leave().unwrap();
    // The controllers it enabled are disabled again, it moved back, the leaf is gone.
    assert_eq!(read(&own.join("cgroup.subtree_control")), "-memory -pids");
    assert_eq!(read(&own.join("cgroup.procs")), "0");
    assert!(!leaf.leaf.exists());
}

#[test]
fn other_processes_in_the_own_v2_group_are_one_clear_error() {
    use sbx_cgroup::leaf::Leaf;
    let f = Fake::new("memory pids");
    let own = f.dir(OWN);
    std::fs::write(
        own.join("cgroup.procs"),
        format!("1\n{}\n", std::process::id()),
    )
    .unwrap();
    let l = discover(&f.host).unwrap();
    let t = plan(&l, None, &Limits::default()).unwrap();
    let e = Leaf::enter_if_needed(&t[0], true, "sbx-busy", &Owner::me("busy"), false).unwrap_err();
    assert!(matches!(e, GroupError::Busy(_)), "{e}");
    assert!(
        e.to_string()
            .contains("systemd-run --user --scope -p Delegate=yes"),
        "{e}"
    );
    let dirs: Vec<_> = std::fs::read_dir(&own)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .collect();
    assert!(dirs.is_empty(), "nothing created");
}
