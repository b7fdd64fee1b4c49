//! Issue 16, "Done when": fault injection over the whole chain.
//!
//! `scripts/sbx-run` (sbx-gitguard run, sbx-cgroup as root, sbx-net,
//! sbx-fs, sbx-seccomp) runs an agent-like command that commits in the
//! project; at a random moment a random sbx supervisor of the chain (or
//! none) gets SIGKILL. After each run, bounded in time, nothing of it is
//! left: no process (the command's marker, anything naming the test's
//! directory), no mount naming it, no sbx cgroup of its SBX_ID, and the
//! repository is either untouched or fully imported: `git fsck --strict`
//! is clean and the index holds HEAD's or the work tree's content (no refs moved without the index).
//! After the last run, a normal run reaps what killed runs had to leave to
//! the next one, and then the private TMPDIR holds nothing, the registry
//! (SBX_REGISTRY_DIR) has no entry, the project no `.sbx-fs-new-*` and the
//! git dir no `.sbx-gitguard-keep.*`.
//!
//! Bounded: at most 40 iterations or 90 s of injection, whichever is first.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sbx_testutil::{As, identities, run_as};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/sbx-run")
}

/// A small xorshift generator seeded from the clock (the seed is printed
/// so that a failure can be replayed with SBX_FAULT_SEED).
struct Rng(u64);
impl Rng {
    fn new() -> Rng {
        let seed = std::env::var("SBX_FAULT_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
                    | 1
            });
        eprintln!("fault injection seed: SBX_FAULT_SEED={seed}");
        Rng(seed)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn children_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(st) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        let Some(rest) = st.rfind(')').map(|i| &st[i + 2..]) else {
            continue;
        };
        if rest.split_whitespace().nth(1) == Some(&pid.to_string()) {
            out.push(p);
        }
    }
    out
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The sbx supervisors below `root` (the sbx-run shell), with their names.
fn supervisors(root: i32) -> Vec<(i32, String)> {
    // sbx-run ends with exec: the root itself is the outermost tool.
    let mut out = Vec::new();
    if comm(root).starts_with("sbx-") {
        out.push((root, comm(root)));
    }
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        for c in children_of(p) {
            let n = comm(c);
            if n.starts_with("sbx-") {
                out.push((c, n));
            }
            todo.push(c);
        }
    }
    out
}

/// Pids (not zombies) whose command line contains `needle`.
fn procs_naming(needle: &str) -> Vec<(i32, String)> {
    let me = std::process::id() as i32;
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if p == me {
            continue;
        }
        let cl = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
        let cl = String::from_utf8_lossy(&cl).replace('\0', " ");
        let zombie = std::fs::read_to_string(format!("/proc/{p}/stat"))
            .is_ok_and(|s| s.rfind(')').is_some_and(|i| s[i + 2..].starts_with('Z')));
        if cl.contains(needle) && !zombie {
            out.push((p, cl));
        }
    }
    out
}

fn mounts_naming(needle: &str) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_string)
        .collect()
}

/// sbx cgroups of `id` anywhere under the hierarchies of this process.
fn cgroups_of(id: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    for l in own.lines() {
        let mut f = l.splitn(3, ':');
        let (_, ctrl, path) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
        let ctrl = ctrl.split(',').next().unwrap_or("");
        let mount = if ctrl.is_empty() {
            PathBuf::from("/sys/fs/cgroup/unified")
        } else if let Some(n) = ctrl.strip_prefix("name=") {
            PathBuf::from(format!("/sys/fs/cgroup/{n}"))
        } else {
            PathBuf::from(format!("/sys/fs/cgroup/{ctrl}"))
        };
        let dir = mount.join(path.trim_start_matches('/'));
        if let Ok(rd) = std::fs::read_dir(&dir) {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().contains(id) {
                    out.push(e.path());
                }
            }
        }
    }
    out
}

fn eventually(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(secs) {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

fn git_ok(proj: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new("git")
        .arg("-C")
        .arg(proj)
        .args(["-c", "safe.directory=*"])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

struct Fx {
    _d: tempfile::TempDir,
    base: PathBuf,
    proj: PathBuf,
    tmp: PathBuf,
    registry: PathBuf,
}

fn fx(who: As) -> Fx {
    let d = sbx_testutil::shared_tempdir();
    let base = d.path().canonicalize().unwrap();
    let proj = base.join("proj");
    write(&proj.join("a.txt"), "a\n");
    git(&proj, &["init", "-q", "-b", "main"]);
    git(&proj, &["add", "-A"]);
    git(&proj, &["commit", "-qm", "init"]);
    let tmp = base.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let registry = base.join("registry");
    std::fs::create_dir(&registry).unwrap();
    if who == As::User {
        chown_r(&base);
    }
    Fx {
        _d: d,
        base,
        proj,
        tmp,
        registry,
    }
}

fn run_cmd(f: &Fx, who: As, id: &str, marker: &str) -> Command {
    let mut c = Command::new("sh");
    c.arg(script()).arg("-C").arg(&f.proj).args([
        "--",
        "sh",
        "-c",
        &format!(
            "echo {id} >> work.txt; git add work.txt && \
             git -c user.email=a@b.invalid -c user.name=agent commit -qm {id}; \
             sleep 0.3; : {marker}"
        ),
    ]);
    c.env("SBX_BIN", sbx_testutil::bin("sbx-fs").parent().unwrap())
        .env("SBX_ID", id)
        .env("TMPDIR", &f.tmp)
        .env("SBX_REGISTRY_DIR", &f.registry)
        .env_remove("SBX_AUDIT_LOG")
        .env("PATH", PATH)
        .current_dir(&f.base)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    run_as(&mut c, who);
    c
}

#[test]
fn random_kills_across_the_chain_leave_nothing() {
    let mut rng = Rng::new();
    let t0 = Instant::now();
    let ids = identities();
    let fxs: Vec<(As, Fx)> = ids.iter().map(|w| (*w, fx(*w))).collect();
    let mut killed: Vec<String> = Vec::new();
    for i in 0..40 {
        if t0.elapsed() > Duration::from_secs(90) {
            break;
        }
        let (who, f) = &fxs[i % fxs.len()];
        let id = sbx_testutil::unique(&format!("fi{i}x"));
        let marker = format!("FAULTMARK{id}");
        let mut child = run_cmd(f, *who, &id, &marker).spawn().unwrap();
        // A random moment: 0-1.5 s after the start (set-up, command, import).
        let at = Duration::from_millis(rng.below(1500));
        let start = Instant::now();
        let mut victim = None;
        while start.elapsed() < at {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if child.try_wait().unwrap().is_none() && rng.below(8) != 0 {
            let sv = supervisors(child.id() as i32);
            if !sv.is_empty() {
                let (pid, name) = &sv[rng.below(sv.len() as u64) as usize];
                // SAFETY: a process of this test's own run.
                unsafe { libc::kill(*pid, libc::SIGKILL) };
                victim = Some(format!("{name}@{}ms", at.as_millis()));
            }
        }
        let ctx = format!("iteration {i} ({who:?}), killed {victim:?}");
        let done = eventually(60, || child.try_wait().unwrap().is_some());
        if !done {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{ctx}: sbx-run did not end within 60 s");
        }
        killed.extend(victim.clone());
        let base = f.base.to_string_lossy().to_string();
        assert!(
            eventually(15, || procs_naming(&marker).is_empty()
                && procs_naming(&base).is_empty()),
            "{ctx}: processes left: {:?} {:?}",
            procs_naming(&marker),
            procs_naming(&base)
        );
        assert!(
            eventually(15, || mounts_naming(&base).is_empty()),
            "{ctx}: mounts left: {:?}",
            mounts_naming(&base)
        );
        assert!(
            eventually(15, || cgroups_of(&id).is_empty()),
            "{ctx}: cgroups left: {:?}",
            cgroups_of(&id)
        );
        let (ok, out) = git_ok(&f.proj, &["fsck", "--strict", "--no-progress"]);
        assert!(ok, "{ctx}: git fsck: {out}");
        // Untouched or fully imported: the index holds HEAD's work.txt
        // (nothing staged, or the commit imported with its index) or the
        // work tree's (the command's `git add` ran, its commit did not).
        // HEAD moved without the index (the half-applied import) leaves
        // the previous commit's content there: neither.
        // A path missing from the index or HEAD is None (git's two error
        // messages differ, so they must not be compared).
        let blob = |spec: &str| {
            let (ok, out) = git_ok(&f.proj, &["show", spec]);
            ok.then_some(out)
        };
        let staged = blob(":work.txt");
        let head = blob("HEAD:work.txt");
        let tree = std::fs::read_to_string(f.proj.join("work.txt")).ok();
        let (_, others) = git_ok(&f.proj, &["diff", "--cached", "--name-only"]);
        assert!(
            staged == head || staged == tree,
            "{ctx}: the index is neither HEAD's nor the work tree's: \
             index {staged:?} HEAD {head:?} tree {tree:?}"
        );
        assert!(
            others.lines().all(|l| l == "work.txt"),
            "{ctx}: staged beyond the command's work: {others}"
        );
    }
    // A normal run reaps what the killed ones left to the next run.
    for (who, f) in &fxs {
        let id = sbx_testutil::unique("fifinal");
        let st = run_cmd(f, *who, &id, "FAULTFINAL").status().unwrap();
        assert!(st.success(), "{who:?}: final run {st:?}");
        let left: Vec<_> = std::fs::read_dir(&f.tmp)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        assert!(left.is_empty(), "{who:?}: TMPDIR debris: {left:?}");
        // SBX_REGISTRY_DIR/UID/entries
        let reg: Vec<_> = std::fs::read_dir(&f.registry)
            .unwrap()
            .flatten()
            .flat_map(|u| std::fs::read_dir(u.path()).unwrap().flatten())
            .map(|e| e.path())
            .collect();
        assert!(reg.is_empty(), "{who:?}: registry entries left: {reg:?}");
        let debris = |d: &Path, pre: &str| -> Vec<PathBuf> {
            std::fs::read_dir(d)
                .unwrap()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(pre))
                .map(|e| e.path())
                .collect()
        };
        assert!(debris(&f.proj, ".sbx-fs-new-").is_empty(), "{who:?}");
        assert!(
            debris(&f.proj.join(".git"), ".sbx-gitguard-keep").is_empty(),
            "{who:?}: keep dirs: {:?}",
            debris(&f.proj.join(".git"), ".sbx-gitguard-keep")
        );
        let (ok, out) = git_ok(&f.proj, &["fsck", "--strict", "--no-progress"]);
        assert!(ok, "{out}");
        let (_, log) = git_ok(&f.proj, &["log", "-1", "--format=%s"]);
        assert_eq!(log.trim(), id, "{who:?}: the final commit was imported");
    }
    eprintln!("killed: {killed:?}");
}
