//! The write budget of the writable binds (issue 24): `sbx-fs
//! --write-quota/--write-inodes` alone, through `scripts/sbx-run` and
//! through `sbx-policy chain`, as root and as the unprivileged test user.
//! Writing past the budget fails with ENOSPC and is logged
//! (write_quota_exceeded), many small files hit the inode cap, legitimate
//! work under the budget lands on the host exactly, special files and
//! setuid bits never reach it, and a SIGKILL of sbx-fs mid-run or mid-apply
//! leaves no mount, process or temporary behind and every file whole.

mod common;
use common::*;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sbx_testutil::{As, assert_event, audit_events, identities, run_as, stderr, stdout};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Entry {
    Fs,
    SbxRun,
    Chain,
}

struct Project {
    _d: tempfile::TempDir,
    base: PathBuf,
    root: PathBuf,
    home: PathBuf,
    log: PathBuf,
}

fn project(who: As, git_repo: bool) -> Project {
    let d = sbx_testutil::shared_tempdir();
    let base = d.path().canonicalize().unwrap();
    let root = base.join("proj");
    let home = base.join("home");
    write(&root.join("keep.txt"), "original\n");
    write(&root.join("gone.txt"), "delete me\n");
    write(&root.join("old.txt"), "renamed content\n");
    write(&root.join("dir1/x"), "in dir1\n");
    write(&root.join("deldir/a/b"), "deep\n");
    write(&root.join("untouched/u"), "same\n");
    std::fs::create_dir_all(&home).unwrap();
    if git_repo {
        git(&root, &["init", "-q", "-b", "main"]);
        git(&root, &["add", "-A"]);
        git(&root, &["commit", "-qm", "init"]);
        write(&root.join(".claude/settings.json"), "{}\n");
    }
    if who == As::User {
        chown_r(&base);
    }
    let log = base.join("audit.jsonl");
    Project {
        _d: d,
        base,
        root,
        home,
        log,
    }
}

/// Runs `script` in the project through `entry` with a budget of `bytes`
/// and `inodes`.
fn run(
    p: &Project,
    entry: Entry,
    who: As,
    bytes: &str,
    inodes: &str,
    script: &str,
) -> std::process::Output {
    let mut c = match entry {
        Entry::Fs => {
            let mut c = sbx_testutil::tool("sbx-fs");
            c.arg("--audit-log")
                .arg(&p.log)
                .arg("--rw")
                .arg(&p.root)
                .arg("--chdir")
                .arg(&p.root)
                .args(["--write-quota", bytes, "--write-inodes", inodes]);
            c.args(["--", "sh", "-c", script]);
            c
        }
        Entry::SbxRun => {
            let mut c = Command::new("sh");
            c.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/sbx-run"))
                .arg("-C")
                .arg(&p.root)
                .arg("-l")
                .arg(&p.log)
                .args(["--", "sh", "-c", script]);
            c.env("SBX_BIN", sbx_testutil::bin("sbx-fs").parent().unwrap())
                .env("SBX_WRITE_QUOTA", bytes)
                .env("SBX_WRITE_INODES", inodes)
                .env_remove("SBX_AUDIT_LOG");
            c
        }
        Entry::Chain => {
            let mut c = sbx_testutil::tool("sbx-policy");
            c.arg("--audit-log").arg(&p.log);
            c.args(["chain", "--managed", "/nonexistent/managed.json", "--home"])
                .arg(&p.home)
                .args(["--write-quota", bytes, "--write-inodes", inodes]);
            c.args(["--", "sh", "-c", script]);
            c
        }
    };
    c.current_dir(&p.root)
        .env("PATH", PATH)
        .env_remove("SBX_ID");
    run_as(&mut c, who);
    c.output().unwrap()
}

fn marker(out: &str, key: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in:\n{out}"))
        .to_string()
}

/// Legitimate work (create, modify, delete, rename files and directories,
/// symlinks and a hard link inside), then a write past the budget.
const WORK: &str = "echo modified > keep.txt; rm gone.txt; mv old.txt renamed.txt; \
    mv dir1 dir2; rm -rf deldir; mkdir -p new/sub; echo deep > new/sub/f; \
    ln -s ../keep.txt new/link; ln new/sub/f new/hard; chmod 640 new/sub/f; echo W=$?; \
    dd if=/dev/zero of=big bs=64k count=256 2>/tmp/dd.err; echo DD=$?; \
    grep -c 'No space left' /tmp/dd.err";

fn check_work_landed(root: &Path, quota: u64) {
    let read =
        |r: &str| std::fs::read_to_string(root.join(r)).unwrap_or_else(|e| panic!("{r}: {e}"));
    assert_eq!(read("keep.txt"), "modified\n");
    assert!(!root.join("gone.txt").exists());
    assert!(!root.join("old.txt").exists());
    assert_eq!(read("renamed.txt"), "renamed content\n");
    assert!(!root.join("dir1").exists());
    assert_eq!(read("dir2/x"), "in dir1\n");
    assert!(!root.join("deldir").exists());
    assert_eq!(read("new/sub/f"), "deep\n");
    assert_eq!(
        std::fs::metadata(root.join("new/sub/f")).unwrap().mode() & 0o777,
        0o640
    );
    assert_eq!(
        std::fs::read_link(root.join("new/link")).unwrap(),
        PathBuf::from("../keep.txt")
    );
    assert_eq!(
        std::fs::metadata(root.join("new/hard")).unwrap().ino(),
        std::fs::metadata(root.join("new/sub/f")).unwrap().ino()
    );
    assert_eq!(read("untouched/u"), "same\n");
    let big = std::fs::metadata(root.join("big")).unwrap().len();
    assert!(
        big < 16 << 20 && big <= quota,
        "the fill stopped at the budget: {big}"
    );
    no_leftovers(root);
}

/// No temporary of the apply, no placeholder, no mount of the budget.
fn no_leftovers(root: &Path) {
    let out = Command::new("find")
        .arg(root)
        .args(["-name", ".sbx-apply.*"])
        .output()
        .unwrap();
    assert!(out.stdout.is_empty(), "temporaries left: {}", stdout(&out));
    let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mi.lines().any(|l| l.contains(root.to_str().unwrap())),
        "a mount of the project is left: {mi}"
    );
}

fn budget_exceeded(entry: Entry) {
    for who in identities() {
        let p = project(who, entry != Entry::Fs);
        let quota = 1u64 << 20;
        let out = run(&p, entry, who, "1M", "1000", WORK);
        let o = stdout(&out);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{entry:?} {who:?}: {o}\n{}",
            stderr(&out)
        );
        assert_eq!(marker(&o, "W"), "0", "{o}\n{}", stderr(&out));
        assert_ne!(
            marker(&o, "DD"),
            "0",
            "the write past the budget failed: {o}"
        );
        assert!(o.lines().any(|l| l == "1"), "dd said ENOSPC: {o}");
        check_work_landed(&p.root, quota);
        let e = assert_event(&p.log, "write_quota_exceeded", "alert", |e| {
            e["bind"] == p.root.to_str().unwrap() && e["resource"] == "bytes"
        });
        assert_eq!(e["quota_bytes"], quota, "{e}");
        assert!(e["used_bytes"].as_u64().unwrap() > quota / 2, "{e}");
        assert_event(&p.log, "write_quota_applied", "info", |e| {
            e["bind"] == p.root.to_str().unwrap()
        });
        if entry != Entry::Fs {
            // git still commits (the stage overlay lies on top of the
            // budget's) and nothing of .git came through the budget.
            assert!(p.root.join(".git/HEAD").exists());
        }
        let _ = &p.base;
    }
}

fn inode_cap(entry: Entry) {
    for who in identities() {
        let p = project(who, entry != Entry::Fs);
        let out = run(
            &p,
            entry,
            who,
            "64M",
            "60",
            "n=0; while [ $n -lt 200 ]; do touch f$n 2>/dev/null || break; n=$((n+1)); done; echo N=$n",
        );
        let o = stdout(&out);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{entry:?} {who:?}: {o}\n{}",
            stderr(&out)
        );
        let n: u64 = marker(&o, "N").parse().unwrap();
        assert!(
            (30..=66).contains(&n),
            "the inode cap stopped the files: {n}"
        );
        let made = (0..200)
            .filter(|i| p.root.join(format!("f{i}")).exists())
            .count() as u64;
        assert_eq!(made, n, "every file made inside landed, no more");
        assert_event(&p.log, "write_quota_exceeded", "alert", |e| {
            e["bind"] == p.root.to_str().unwrap() && e["resource"] == "inodes"
        });
        no_leftovers(&p.root);
    }
}

#[test]
fn sbx_fs_budget_exceeded_fails_with_enospc_and_the_work_lands() {
    budget_exceeded(Entry::Fs);
}

#[test]
fn sbx_run_budget_exceeded_fails_with_enospc_and_the_work_lands() {
    budget_exceeded(Entry::SbxRun);
}

#[test]
fn chain_budget_exceeded_fails_with_enospc_and_the_work_lands() {
    budget_exceeded(Entry::Chain);
}

#[test]
fn sbx_fs_inode_cap() {
    inode_cap(Entry::Fs);
}

#[test]
fn sbx_run_inode_cap() {
    inode_cap(Entry::SbxRun);
}

#[test]
fn chain_inode_cap() {
    inode_cap(Entry::Chain);
}

#[test]
fn special_files_and_setuid_bits_never_reach_the_host() {
    for who in identities() {
        let p = project(who, false);
        let out = run(
            &p,
            Entry::Fs,
            who,
            "8M",
            "1000",
            "mkfifo fifo; echo F=$?; echo x > suid; chmod 4755 suid; echo S=$?; \
             mknod dev c 1 3 2>/dev/null; echo D=$?; ln -s /etc/passwd esc; \
             python3 -c 'import socket; s=socket.socket(socket.AF_UNIX); s.bind(\"sock\")'; echo K=$?",
        );
        let o = stdout(&out);
        assert_eq!(marker(&o, "F"), "0", "{o}{}", stderr(&out));
        assert_eq!(marker(&o, "S"), "0", "{o}");
        assert_ne!(marker(&o, "D"), "0", "no device node inside: {o}");
        assert_eq!(marker(&o, "K"), "0", "{o}");
        assert!(std::fs::symlink_metadata(p.root.join("fifo")).is_err());
        assert!(std::fs::symlink_metadata(p.root.join("sock")).is_err());
        assert!(std::fs::symlink_metadata(p.root.join("dev")).is_err());
        let m = std::fs::metadata(p.root.join("suid")).unwrap().mode();
        assert_eq!(m & 0o7777, 0o755, "{m:o}");
        assert_eq!(
            std::fs::read_link(p.root.join("esc")).unwrap(),
            PathBuf::from("/etc/passwd")
        );
        for kind in ["fifo", "socket", "setuid file"] {
            assert_event(&p.log, "write_apply_refused", "alert", |e| {
                e["kind"] == kind
            });
        }
        no_leftovers(&p.root);
    }
}

fn processes_with(needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(c) = std::fs::read(format!("/proc/{pid}/cmdline"))
            && String::from_utf8_lossy(&c).contains(needle)
        {
            out.push(pid);
        }
    }
    out
}

fn wait_until(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(secs), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn spawn_fs(p: &Project, who: As, script: &str) -> std::process::Child {
    let mut c = sbx_testutil::tool("sbx-fs");
    c.arg("--audit-log")
        .arg(&p.log)
        .arg("--rw")
        .arg(&p.root)
        .arg("--chdir")
        .arg(&p.root)
        .args(["--write-quota", "256M", "--", "sh", "-c", script])
        .current_dir(&p.root)
        .env("PATH", PATH)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    run_as(&mut c, who);
    c.spawn().unwrap()
}

#[test]
fn sigkill_mid_run_leaves_the_host_untouched_and_nothing_behind() {
    use std::io::BufRead;
    for who in identities() {
        let p = project(who, false);
        let tag = sbx_testutil::unique("qk");
        let mut child = spawn_fs(
            &p,
            who,
            &format!(
                "echo new > added; echo changed > keep.txt; echo ready; exec sh -c 'sleep 30; : {tag}'"
            ),
        );
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "ready\n");
        wait_until("the sleep runs", 5, || !processes_with(&tag).is_empty());
        child.kill().unwrap();
        child.wait().unwrap();
        // The sandbox dies with sbx-fs, and with it the overlay and tmpfs.
        wait_until("the sandbox is gone", 5, || processes_with(&tag).is_empty());
        assert!(!p.root.join("added").exists(), "nothing applied");
        assert_eq!(
            std::fs::read_to_string(p.root.join("keep.txt")).unwrap(),
            "original\n"
        );
        // The reaper took out the placeholders (.git, .claude).
        wait_until("placeholders removed", 5, || {
            !p.root.join(".git").exists() && !p.root.join(".claude").exists()
        });
        no_leftovers(&p.root);
    }
}

#[test]
fn sigkill_mid_apply_leaves_every_file_whole_and_no_temporary() {
    for who in identities() {
        let p = project(who, false);
        let n = 3000;
        let script = format!(
            "mkdir many; i=0; while [ $i -lt {n} ]; do echo \"file $i\" > many/f$i; i=$((i+1)); done; \
             head -c 33554432 /dev/zero > many/big; echo changed > keep.txt"
        );
        let mut child = spawn_fs(&p, who, &script);
        // The apply starts once the command ended; entries go in name
        // order: many/big, then many/f0, many/f1, ...: kill once f1 landed.
        let t = Instant::now();
        while !p.root.join("many/f1").exists() {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "the apply never began"
            );
            if child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let _ = child.kill();
        child.wait().unwrap();
        // The reaper removes the temporaries of the interrupted apply.
        wait_until("temporaries removed", 10, || {
            let out = Command::new("find")
                .arg(&p.root)
                .args(["-name", ".sbx-apply.*"])
                .output()
                .unwrap();
            out.stdout.is_empty()
        });
        let mut applied = 0;
        for i in 0..n {
            if let Ok(s) = std::fs::read_to_string(p.root.join(format!("many/f{i}"))) {
                assert_eq!(s, format!("file {i}\n"), "f{i} is whole");
                applied += 1;
            }
        }
        if let Ok(m) = std::fs::metadata(p.root.join("many/big")) {
            assert_eq!(m.len(), 33554432, "big is whole or absent");
        }
        let keep = std::fs::read_to_string(p.root.join("keep.txt")).unwrap();
        assert!(keep == "original\n" || keep == "changed\n", "{keep:?}");
        eprintln!("{who:?}: {applied} of {n} files applied before the kill");
        assert!(applied >= 2, "killed after f0 and f1 landed: {applied}");
        assert!(p.root.join("many/big").exists(), "big came first, whole");
        wait_until("placeholders removed", 5, || {
            !p.root.join(".git").exists() && !p.root.join(".claude").exists()
        });
        no_leftovers(&p.root);
        let evs = audit_events(&p.log);
        assert!(evs.iter().any(|e| e["event"] == "start"), "{evs:?}");
    }
}

#[test]
fn bad_budgets_are_one_line_and_125() {
    let out = sbx_testutil::tool("sbx-fs")
        .args(["--write-inodes", "5", "--", "true"])
        .output()
        .unwrap();
    sbx_testutil::assert_usage_error(&out, "--write-inodes");
    let out = sbx_testutil::tool("sbx-fs")
        .args(["--write-quota", "lots", "--", "true"])
        .output()
        .unwrap();
    sbx_testutil::assert_usage_error(&out, "--write-quota");
}

#[test]
fn config_keys_set_the_budget() {
    let p = project(As::Root, false);
    let cfg = p.base.join("config.json");
    std::fs::write(
        &cfg,
        r#"{"sbx-fs": {"write-quota": "1M", "write-inodes": 50}}"#,
    )
    .unwrap();
    let out = sbx_testutil::tool("sbx-fs")
        .arg("--config")
        .arg(&cfg)
        .arg("--audit-log")
        .arg(&p.log)
        .arg("--rw")
        .arg(&p.root)
        .arg("--chdir")
        .arg(&p.root)
        .args([
            "--",
            "sh",
            "-c",
            "dd if=/dev/zero of=big bs=64k count=64 2>/dev/null; echo DD=$?",
        ])
        .env("PATH", PATH)
        .output()
        .unwrap();
    assert_ne!(marker(&stdout(&out), "DD"), "0", "{}", stderr(&out));
    let e = assert_event(&p.log, "start", "info", |e| e["write_quota"].is_object());
    assert_eq!(e["write_quota"]["bytes"], 1 << 20);
    assert_eq!(e["write_quota"]["inodes"], 50);
    assert_event(&p.log, "write_quota_exceeded", "alert", |e| {
        e["resource"] == "bytes"
    });
}

#[test]
fn chain_passes_the_documented_default_and_off_drops_it() {
    let p = project(As::Root, false);
    let print = |extra: &[&str]| {
        let out = sbx_testutil::tool("sbx-policy")
            .args(["chain", "--managed", "/nonexistent/m.json", "--home"])
            .arg(&p.home)
            .args(extra)
            .args(["--print", "--", "true"])
            .current_dir(&p.root)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        stdout(&out)
    };
    let s = print(&[]);
    assert!(s.contains("--write-quota 2G --write-inodes 500000"), "{s}");
    let s = print(&["--write-quota", "off"]);
    assert!(!s.contains("--write-quota") && s.contains("sbx-fs"), "{s}");
    let out = sbx_testutil::tool("sbx-policy")
        .args([
            "chain",
            "--managed",
            "/nonexistent/m.json",
            "--write-inodes",
            "0",
            "--print",
            "--",
            "true",
        ])
        .current_dir(&p.root)
        .output()
        .unwrap();
    sbx_testutil::assert_usage_error(&out, "--write-inodes");
}
