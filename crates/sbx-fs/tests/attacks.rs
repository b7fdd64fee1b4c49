//! Every attack of issue 2, tried from inside the sandbox as root and as
//! the unprivileged test user: each must fail, and nothing may be left on
//! the host. The kernel refuses these attempts (EACCES, EROFS, EPERM,
//! ENOENT) without sbx-fs seeing them, so there is no audit event for them
//! (see docs/fs.md, "What is logged"); the runs' start/end events are
//! checked, and the one attack sbx-fs can observe (a process killed by
//! seccomp) is asserted as an alert.

mod common;

use common::*;
use sbx_testutil::assert_event;

fn ok_lines(out: &std::process::Output) -> String {
    let so = stdout(out);
    assert!(
        !so.contains("ESCAPED"),
        "an attack succeeded:\n{so}\nstderr:\n{}",
        stderr(out)
    );
    so
}

fn assert_ran(out: &std::process::Output, log: &std::path::Path) {
    assert_eq!(
        code(out),
        0,
        "stdout: {}\nstderr: {}",
        stdout(out),
        stderr(out)
    );
    assert_event(log, "start", "info", |_| true);
    assert_event(log, "end", "info", |e| e["status"] == 0);
}

#[test]
fn path_traversal_out_of_a_bind() {
    for who in identities() {
        let s = Scratch::new(who);
        let before = s.snapshot();
        let secret = s.path("secret.txt");
        let secret = secret.display();
        let script = format!(
            "for p in ../secret.txt ../../secret.txt ./../secret.txt {secret} sub/../../secret.txt; do \
               if cat $p 2>/dev/null; then echo ESCAPED $p; else echo refused $p; fi; done; \
             ls -a .. | grep -q secret && echo ESCAPED-listing; true"
        );
        let (out, log) = s.run_rw(&[], &script);
        assert_ran(&out, &log);
        let so = ok_lines(&out);
        assert_refused(&out, "HOST-SECRET-OUTSIDE", "traversal");
        assert_eq!(so.matches("refused").count(), 5, "{so}");
        s.assert_clean(&before);
    }
}

#[test]
fn planted_symlinks_to_shadow_and_ssh_key() {
    for who in identities() {
        let s = Scratch::new(who);
        s.write("home/.ssh/id_rsa", "PRIVATE-KEY-MATERIAL\n");
        // Planted before the sandbox starts (on the host) ...
        s.symlink(std::path::Path::new("/etc/shadow"), "proj/shadow-link");
        s.symlink(&s.path("home/.ssh/id_rsa"), "proj/key-link");
        let before = s.snapshot();
        let home = s.home();
        let home = home.to_str().unwrap();
        // ... and planted from inside.
        let script = format!(
            "ln -s /etc/shadow in-shadow; ln -s {home}/.ssh/id_rsa in-key; \
             for p in shadow-link key-link in-shadow in-key {home}/.ssh/id_rsa /etc/shadow; do \
               if cat $p 2>/dev/null; then echo ESCAPED $p; else echo refused $p; fi; done; \
             rm -f in-shadow in-key"
        );
        // The home is bound read-only so ~/.ssh (default deny) is hidden there.
        let (out, log) = s.run_rw(&["--ro", home], &script);
        assert_ran(&out, &log);
        let so = ok_lines(&out);
        assert_refused(&out, "PRIVATE-KEY-MATERIAL", "ssh key");
        assert!(!so.contains("root:"), "shadow leaked: {so}");
        assert_eq!(so.matches("refused").count(), 6, "{so}");
        s.assert_clean(&before);
    }
}

#[test]
fn reading_denied_paths() {
    for who in identities() {
        let s = Scratch::new(who);
        s.write("proj/.env", "DOTENV-SECRET\n");
        s.write("proj/deep/er/.env.production", "DOTENV-SECRET\n");
        s.write("proj/private/token", "DOTENV-SECRET\n");
        s.write("proj/notes.key", "DOTENV-SECRET\n");
        s.write("home/.aws/credentials", "DOTENV-SECRET\n");
        s.write("home/project/credentials.json", "DOTENV-SECRET\n");
        s.write("home/.netrc", "DOTENV-SECRET\n");
        let before = s.snapshot();
        let private = s.path("proj/private");
        let home = s.home();
        let home = home.to_str().unwrap();
        let script = format!(
            "for p in .env deep/er/.env.production private/token notes.key /etc/shadow /etc/gshadow \
                      {home}/.aws/credentials {home}/project/credentials.json {home}/.netrc; do \
               if cat $p 2>/dev/null; then echo ESCAPED $p; else echo refused $p; fi; done; \
             ls private 2>/dev/null | grep -q token && echo ESCAPED-list; \
             cat .env.production 2>/dev/null; true"
        );
        let (out, log) = s.run_rw(
            &[
                "--deny",
                private.to_str().unwrap(),
                "--deny",
                "*.key",
                "--ro",
                home,
            ],
            &script,
        );
        assert_ran(&out, &log);
        let so = ok_lines(&out);
        assert_refused(&out, "DOTENV-SECRET", "denied");
        assert_eq!(so.matches("refused").count(), 9, "{so}");
        assert!(
            assert_event(&log, "start", "info", |_| true)["denied"]
                .as_u64()
                .unwrap()
                >= 7
        );
        s.assert_clean(&before);
    }
}

#[test]
fn creating_denied_paths_that_did_not_exist() {
    for who in identities() {
        let s = Scratch::new(who);
        let before = s.snapshot();
        let newsecret = s.path("proj/new-secret");
        // The home is bound writable: ~/.ssh and ~/.aws do not exist there
        // and must stay impossible to create (authorized_keys planting).
        let home = s.home();
        let home = home.to_str().unwrap();
        let script = format!(
            "if echo x > new-secret 2>/dev/null; then echo ESCAPED write; else echo refused write; fi; \
             if mkdir new-secret/d 2>/dev/null; then echo ESCAPED mkdir; else echo refused mkdir; fi; \
             if mkdir -p {home}/.ssh && echo key > {home}/.ssh/authorized_keys 2>/dev/null; then echo ESCAPED ssh; else echo refused ssh; fi; \
             if echo x > {home}/.aws/credentials 2>/dev/null; then echo ESCAPED aws; else echo refused aws; fi; \
             if echo x > {home}/.netrc 2>/dev/null; then echo ESCAPED netrc; else echo refused netrc; fi; \
             echo fine > {home}/allowed && echo wrote-allowed"
        );
        let (out, log) = s.run_rw(
            &["--deny", newsecret.to_str().unwrap(), "--rw", home],
            &script,
        );
        assert_ran(&out, &log);
        let so = ok_lines(&out);
        assert_eq!(so.matches("refused").count(), 5, "{so}");
        assert!(so.contains("wrote-allowed"), "{so}");
        // The legitimate write stays; nothing else changed.
        let mut want = before.clone();
        want.insert(
            "home/allowed".into(),
            s.snapshot()[std::path::Path::new("home/allowed")].clone(),
        );
        s.assert_clean(&want);
    }
}

const INVARIANT_FILES: &[&str] = &[
    ".git/HEAD",
    ".git/config",
    ".git/objects/ab/cdef",
    ".git/refs/heads/main",
    ".git/hooks/pre-commit",
    ".claude/settings.json",
    ".claude/settings.local.json",
    ".claude/settings.team.json",
    ".claude/skills/evil/SKILL.md",
    ".claude/commands/evil.md",
];

fn write_all_script() -> String {
    let mut s = String::new();
    for p in INVARIANT_FILES {
        s.push_str(&format!(
            "if mkdir -p $(dirname {p}) 2>/dev/null && echo EVIL > {p} 2>/dev/null; then echo ESCAPED {p}; else echo refused {p}; fi; "
        ));
    }
    for p in [
        ".git/hooks",
        ".git/objects",
        ".git/refs",
        ".claude/skills",
        ".claude/commands",
    ] {
        s.push_str(&format!(
            "if test -e {p}; then mv {p} {p}.old 2>/dev/null || rm -rf {p} 2>/dev/null; test -e {p} || echo ESCAPED rm {p}; fi; "
        ));
    }
    s
}

#[test]
fn writing_existing_invariant_paths() {
    for who in identities() {
        let s = Scratch::new(who);
        for p in INVARIANT_FILES {
            s.write(&format!("proj/{p}"), "ORIGINAL\n");
        }
        let before = s.snapshot();
        let (out, log) = s.run_rw(&[], &write_all_script());
        assert_ran(&out, &log);
        let so = ok_lines(&out);
        // settings.team.json is protected because it exists.
        assert_eq!(so.matches("refused").count(), INVARIANT_FILES.len(), "{so}");
        s.assert_clean(&before);
    }
}

#[test]
fn writing_missing_invariant_paths() {
    for who in identities() {
        // An empty .git: none of HEAD, config, objects, refs, hooks exist.
        let s = Scratch::new(who);
        s.mkdir("proj/.git");
        let before = s.snapshot();
        let (out, log) = s.run_rw(&[], &write_all_script());
        assert_ran(&out, &log);
        let so = ok_lines(&out);
        // Only settings.team.json (not one of the fixed names and absent)
        // is creatable: .claude does not exist, so it cannot be made at all.
        assert_eq!(so.matches("refused").count(), INVARIANT_FILES.len(), "{so}");
        // The placeholders (.git/HEAD, .git/hooks, .claude, ...) are gone.
        s.assert_clean(&before);

        // No .git at all: a repository cannot be planted.
        let s = Scratch::new(who);
        let before = s.snapshot();
        let (out, log) = s.run_rw(
            &[],
            "if mkdir .git/hooks 2>/dev/null || git init -q . 2>/dev/null; then echo ESCAPED init; else echo refused init; fi",
        );
        assert_ran(&out, &log);
        let so = ok_lines(&out);
        assert!(so.contains("refused init"), "{so}");
        s.assert_clean(&before);
    }
}

#[test]
fn remounting_a_read_only_bind_writable() {
    for who in identities() {
        let s = Scratch::new(who);
        s.write("data/file", "RO\n");
        let before = s.snapshot();
        let data = s.path("data");
        let d = data.to_str().unwrap();
        let script = format!(
            "mount -o remount,rw {d} 2>/dev/null && echo ESCAPED remount; \
             mount -o remount,bind,rw {d} 2>/dev/null && echo ESCAPED remount-bind; \
             unshare -Urm sh -c 'mount -o remount,bind,rw {d} && echo x > {d}/file' 2>/dev/null && echo ESCAPED userns-remount; \
             if echo x > {d}/file 2>/dev/null; then echo ESCAPED write; else echo refused write; fi"
        );
        let (out, log) = s.run_rw(&["--ro", d], &script);
        assert_ran(&out, &log);
        let so = ok_lines(&out);
        assert!(so.contains("refused write"), "{so}");
        s.assert_clean(&before);
    }
}

#[test]
fn mount_and_umount_of_anything() {
    for who in identities() {
        let s = Scratch::new(who);
        s.write("proj/.env", "DOTENV-SECRET\n");
        let before = s.snapshot();
        let script = "mount -t tmpfs none /tmp 2>/dev/null && echo ESCAPED mount-tmpfs; \
             mount --bind / /tmp 2>/dev/null && echo ESCAPED mount-bind; \
             umount .env 2>/dev/null && echo ESCAPED umount-deny; \
             umount -l /usr 2>/dev/null && echo ESCAPED umount-usr; \
             umount -l /proc 2>/dev/null && echo ESCAPED umount-proc; \
             umount .git/HEAD 2>/dev/null && echo ESCAPED umount-invariant; \
             unshare -Urm sh -c 'umount .env; cat .env' 2>/dev/null; \
             unshare -Urm sh -c 'umount -l /etc/shadow; cat /etc/shadow' 2>/dev/null; \
             cat .env 2>/dev/null; echo done";
        let (out, log) = s.run_rw(&[], script);
        assert_ran(&out, &log);
        ok_lines(&out);
        assert_refused(&out, "DOTENV-SECRET", "umount");
        assert!(!stdout(&out).contains("root:"), "shadow leaked");
        s.assert_clean(&before);
    }
}

#[test]
fn host_processes_through_proc() {
    for who in identities() {
        let s = Scratch::new(who);
        let marker = sbx_testutil::unique("HOSTENVMARKER");
        let log = s.log();
        let script = "cat /proc/1/environ 2>/dev/null | tr '\\0' '\\n'; \
             ls /proc/1/root/ 2>/dev/null; \
             ls -d /proc/[0-9]* | wc -l | sed 's/^/procs=/'; \
             tr '\\0' '\\n' < /proc/1/cmdline | head -1; \
             cat /proc/kcore 2>/dev/null | head -c1 | wc -c | sed 's/^/kcore=/'; \
             cat /proc/keys 2>/dev/null && echo ESCAPED keys; \
             echo 1 > /proc/sysrq-trigger 2>/dev/null && echo ESCAPED sysrq; \
             echo x > /proc/sys/kernel/hostname 2>/dev/null && echo ESCAPED procsys; true";
        let out = s
            .cmd(&log, &["--unsetenv", "SBX_MARK"], script)
            .env("SBX_MARK", &marker)
            .output()
            .unwrap();
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let so = ok_lines(&out);
        assert!(
            !so.contains(&marker),
            "host/init environment readable: {so}"
        );
        // Only the sandbox's own processes exist: init, sh, and the pipeline.
        let procs: usize = so
            .lines()
            .find_map(|l| l.strip_prefix("procs="))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(procs <= 6, "{so}");
        assert!(
            so.contains("sbx-fs"),
            "/proc/1 is not the sandbox's init: {so}"
        );
        assert!(so.contains("kcore=0"), "{so}");
        assert_event(&log, "end", "info", |_| true);
    }
}

#[test]
fn tiocsti_injection() {
    if !std::path::Path::new("/usr/bin/python3").exists() {
        sbx_testutil::skip!("/usr/bin/python3 missing");
    }
    let inject = "import fcntl,termios,sys\ntry:\n  fcntl.ioctl(0, termios.TIOCSTI, b'X')\n  print('ESCAPED tiocsti')\nexcept OSError as e:\n  print('refused', e.errno)\n";
    for who in identities() {
        let s = Scratch::new(who);
        let script = format!("/usr/bin/python3 -c \"{}\"", inject.replace('"', "\\\""));
        // Control: outside the sandbox, on a terminal that is ours, the
        // injection works (so the test proves something).
        let mut ctl = Command::new("/usr/bin/python3");
        ctl.args(["-c", inject]);
        run_as(&mut ctl, who);
        let ctl_out = on_pty(ctl);
        if !stdout(&ctl_out).contains("ESCAPED") {
            // dev.tty.legacy_tiocsti=0: the kernel refuses TIOCSTI to
            // everyone, so the attack is impossible whatever sbx-fs does.
            eprintln!(
                "TIOCSTI disabled on this kernel ({}): nothing to escape",
                stdout(&ctl_out).trim()
            );
            return;
        }
        let log = s.log();
        let out = on_pty(s.cmd(&log, &[], &script));
        let so = ok_lines(&out);
        assert!(so.contains("refused"), "{so} {}", stderr(&out));
    }
}

use std::process::Command;

/// Runs `cmd` with a new pty as its controlling terminal and stdin.
fn on_pty(mut cmd: Command) -> std::process::Output {
    use std::os::fd::FromRawFd;
    use std::os::unix::process::CommandExt;
    // SAFETY: posix_openpt with integer flags; the fd is ours.
    let master = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY) };
    assert!(master >= 0);
    // SAFETY: master is our open pty master.
    unsafe {
        assert_eq!(libc::grantpt(master), 0);
        assert_eq!(libc::unlockpt(master), 0);
    }
    // SAFETY: ptsname of our open master returns a NUL-ended static name, copied at once (no
    // other pty call between).
    let name = unsafe { std::ffi::CStr::from_ptr(libc::ptsname(master)) }.to_owned();
    // SAFETY: name is NUL-ended and alive for the call.
    let slave = unsafe { libc::open(name.as_ptr(), libc::O_RDWR | libc::O_NOCTTY) };
    assert!(slave >= 0);
    // SAFETY: slave was just opened (>= 0) and is given to the Stdio alone.
    let stdin = unsafe { std::process::Stdio::from_raw_fd(slave) };
    cmd.stdin(stdin);
    // SAFETY: the pre_exec closure only makes raw syscalls (async-signal-safe) between fork and
    // exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            if libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    // SAFETY: master is ours and not used after.
    unsafe { libc::close(master) };
    out
}

#[test]
fn chroot_and_pivot_root_escapes() {
    for who in identities() {
        let s = Scratch::new(who);
        let before = s.snapshot();
        let secret = s.path("secret.txt");
        let sp = secret.to_str().unwrap();
        let script = format!(
            "chroot / /bin/true 2>/dev/null && echo ESCAPED chroot; \
             mkdir -p /tmp/new && pivot_root /tmp /tmp/new 2>/dev/null && echo ESCAPED pivot; \
             unshare -Urm sh -c 'mkdir -p /tmp/x/old; mount -t tmpfs t /tmp/x; mkdir -p /tmp/x/old; cd /tmp/x && pivot_root . old; cat old/{sp}; cd /; cat {sp}' 2>/dev/null; \
             unshare -Ur sh -c 'mkdir -p /tmp/j; chroot /tmp/j /bin/true; cd /; for i in 1 2 3 4 5 6; do cd ..; done; cat {sp}' 2>/dev/null; \
             cat /proc/1/root{sp} 2>/dev/null; echo done"
        );
        let (out, log) = s.run_rw(&[], &script);
        assert_ran(&out, &log);
        ok_lines(&out);
        assert_refused(&out, "HOST-SECRET-OUTSIDE", "chroot/pivot_root");
        s.assert_clean(&before);
    }
}

#[test]
fn writing_outside_the_binds() {
    for who in identities() {
        let s = Scratch::new(who);
        s.write("data/file", "RO\n");
        let before = s.snapshot();
        let data = s.path("data");
        let d = data.to_str().unwrap();
        let script = format!(
            "for p in /newfile /usr/newfile /etc/newfile /bin/newfile /dev/newfile-x {d}/file {d}/new /proc/newfile; do \
               if echo x > $p 2>/dev/null; then echo ESCAPED $p; else echo refused $p; fi; done; \
             mkdir /newdir 2>/dev/null && echo ESCAPED mkdir; \
             echo x > ../secret.txt; \
             echo ok > inside-proj && echo wrote-proj; rm inside-proj"
        );
        let (out, log) = s.run_rw(&["--ro", d], &script);
        assert_ran(&out, &log);
        let so = ok_lines(&out);
        assert_eq!(so.matches("refused").count(), 8, "{so}");
        // ../secret.txt was written in the sandbox's own /tmp, not on the
        // host: the tree is unchanged.
        assert!(so.contains("wrote-proj"), "{so}");
        s.assert_clean(&before);
        assert!(!std::path::Path::new("/newfile").exists());
    }
}

#[test]
fn tmp_files_are_gone_after_the_sandbox() {
    for who in identities() {
        let s = Scratch::new(who);
        let name = sbx_testutil::unique("sbx-fs-tmp-");
        let (out, log) = s.run(
            &[],
            &format!("echo data > /tmp/{name} && echo > /dev/shm/{name} && ls /tmp"),
        );
        assert_ran(&out, &log);
        assert!(stdout(&out).contains(&name));
        assert!(!std::path::Path::new("/tmp").join(&name).exists());
        assert!(!std::path::Path::new("/dev/shm").join(&name).exists());
        let (out, _) = s.run(
            &[],
            &format!("test -e /tmp/{name} && echo ESCAPED persisted; echo checked"),
        );
        ok_lines(&out);
        assert!(stdout(&out).contains("checked"));
    }
}

#[test]
fn nothing_left_after_sigkill_of_sbx_fs() {
    for who in identities() {
        let s = Scratch::new(who);
        let before = s.snapshot();
        let marker = sbx_testutil::unique("SBXFSKILL");
        let log = s.log();
        let p = s.proj();
        let pp = p.to_str().unwrap();
        // No .git and no .claude in the project: placeholders appear on the
        // host while the sandbox runs.
        let mut c = s.cmd(
            &log,
            &["--rw", pp, "--chdir", pp],
            &format!("sleep 600; : {marker}"),
        );
        c.stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let mut child = c.spawn().unwrap();
        assert!(
            eventually(|| p.join(".git").exists() && !pids_with(&marker).is_empty()),
            "sandbox did not start"
        );
        // SAFETY: kill with integer arguments; the child is ours and not yet reaped.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        child.wait().unwrap();
        assert!(
            eventually(|| pids_with(&marker).is_empty()),
            "sandbox processes survived"
        );
        // The reaper waits (boundedly: 20 s for the sandbox's init, 20 s
        // for its shared locks) for the dying sandbox: wait longer than
        // both, so a failure is the reaper's, not the load's.
        let gone = || !p.join(".git").exists() && !p.join(".claude").exists();
        assert!(
            (0..5).any(|_| eventually(gone)),
            "placeholders survived; locks held on them: {}; sbx-fs processes: {}; log: {}",
            lock_holders(&[p.join(".git"), p.join(".claude")]),
            processes_named("sbx-fs"),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        assert!(
            !std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("cleanup_incomplete"),
            "the reaper left entries behind"
        );
        s.assert_clean(&before);
    }
}

/// SIGKILLed at each step of making the placeholders (fault injection,
/// `SBX_TEST_KILL_AT`): the first one announced to the reaper but still
/// under its temporary name, the first one in place, and all twelve in
/// place (ten levels of a nested destination, .git and .claude) before the
/// sandbox exists. The reaper, forked before the first one was made,
/// removes every one, deepest first.
#[test]
fn killed_at_any_step_of_making_placeholders_leaves_nothing() {
    for who in identities() {
        for point in [
            "fs-placeholder-announced",
            "fs-placeholder-made",
            "fs-placeholders-made",
        ] {
            let s = Scratch::new(who);
            s.write("data/file", "x\n");
            let before = s.snapshot();
            let p = s.proj();
            let deep = p.join("d/1/2/3/4/5/6/7/8/9");
            let data = format!("{}:{}", s.path("data").display(), deep.display());
            let pp = p.to_str().unwrap();
            let log = s.log();
            let out = s
                .cmd(&log, &["--rw", pp, "--ro", &data, "--chdir", pp], "true")
                .env("SBX_TEST_KILL_AT", point)
                .output()
                .unwrap();
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{point}: {out:?}");
            // Nothing made: the snapshot (hidden temporaries included) is
            // what it was before.
            assert!(
                eventually(|| s.snapshot() == before),
                "{point} ({who:?}): left {:?}",
                s.snapshot()
                    .keys()
                    .filter(|k| !before.contains_key(*k))
                    .collect::<Vec<_>>()
            );
            assert!(
                !std::fs::read_to_string(&log)
                    .unwrap_or_default()
                    .contains("cleanup_incomplete"),
                "{point}: the reaper left entries behind"
            );
            s.assert_clean(&before);
        }
    }
}

/// Who holds a lock on these paths (from /proc/locks), for the message of
/// a failure.
/// For a failure message: every process whose comm is `name`, with its
/// state and what it waits in (a reaper stuck somewhere shows here).
fn processes_named(name: &str) -> String {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let d = e.path();
        let comm = std::fs::read_to_string(d.join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let stat = std::fs::read_to_string(d.join("stat")).unwrap_or_default();
        let wchan = std::fs::read_to_string(d.join("wchan")).unwrap_or_default();
        out.push(format!("{} [{stat}] wchan {wchan}", d.display()));
    }
    format!("{out:?}")
}

fn lock_holders(paths: &[std::path::PathBuf]) -> String {
    use std::os::unix::fs::MetadataExt;
    let inos: Vec<u64> = paths
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok().map(|m| m.ino()))
        .collect();
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    let mut out = Vec::new();
    for l in locks.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (Some(pid), Some(id)) = (f.get(4), f.get(5)) else {
            continue;
        };
        let ino = id.rsplit(':').next().and_then(|i| i.parse::<u64>().ok());
        if ino.is_some_and(|i| inos.contains(&i)) {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
                .unwrap_or_default();
            out.push(format!("[{l}] pid {pid}: {cmd}"));
        }
    }
    format!("{out:?}")
}

#[test]
fn seccomp_style_kill_is_reported_as_an_alert() {
    for who in identities() {
        let s = Scratch::new(who);
        let (out, log) = s.run(&[], "kill -SYS $$");
        assert_eq!(code(&out), 128 + libc::SIGSYS);
        assert_event(&log, "seccomp_kill", "alert", |e| e["signal"] == "SIGSYS");
    }
}

#[test]
fn claude_state_dir_bind() {
    for who in identities() {
        // A writable ~/.claude (the agent's own state directory): the agent
        // may write its state, never its settings, skills or commands.
        let s = Scratch::new(who);
        s.write("home/.claude/settings.json", "{\"ORIGINAL\": 1}\n");
        s.mkdir("home/.claude/skills");
        let before = s.snapshot();
        let dir = s.path("home/.claude");
        let d = dir.to_str().unwrap();
        let script = format!(
            "cd {d}; for p in settings.json settings.local.json settings.x.json skills/evil.md commands/evil.md; do \
               if mkdir -p $(dirname $p) 2>/dev/null && echo EVIL > $p 2>/dev/null; then echo wrote $p; else echo refused $p; fi; done; \
             mkdir -p projects && echo state > projects/s && echo wrote-state && rm -r projects"
        );
        let (out, log) = s.run(&["--rw", d], &script);
        assert_ran(&out, &log);
        let so = stdout(&out);
        for p in [
            "settings.json",
            "settings.local.json",
            "skills/evil.md",
            "commands/evil.md",
        ] {
            assert!(so.contains(&format!("refused {p}")), "{so}");
        }
        assert!(so.contains("wrote-state"), "{so}");
        // settings.x.json did not exist: the directory is writable, so it is
        // the one name that can appear (documented); remove it and compare.
        let _ = std::fs::remove_file(dir.join("settings.x.json"));
        s.assert_clean(&before);
    }
}

#[test]
fn concurrent_sandboxes_share_placeholders() {
    // Several agents on one project at once: each must see .claude and
    // .git protected for its whole run, and the last one out removes the
    // shared placeholders.
    let whos = identities();
    let s = Scratch::new(*whos.last().unwrap());
    let before = s.snapshot();
    let p = s.proj();
    let pp = p.to_str().unwrap().to_string();
    let script = "for i in 1 2 3 4 5 6 7 8 9 10; do \
          test -d .claude || echo MISSING; \
          touch .claude/x 2>/dev/null && echo ESCAPED claude; \
          mkdir .git/hooks/x 2>/dev/null && echo ESCAPED hooks; done; true";
    let mut children = Vec::new();
    for i in 0..8 {
        let who = whos[i % whos.len()];
        let log = s.log();
        let mut c = sbx_testutil::tool("sbx-fs");
        run_as(&mut c, who);
        c.env("HOME", s.home())
            .args([
                "--audit-log",
                log.to_str().unwrap(),
                "--rw",
                &pp,
                "--chdir",
                &pp,
                "--",
            ])
            .args(["/bin/sh", "-c", script])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        children.push(c.spawn().unwrap());
    }
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let so = stdout(&out);
        assert!(!so.contains("ESCAPED") && !so.contains("MISSING"), "{so}");
    }
    s.assert_clean(&before);
}

#[test]
fn nested_repositories_are_protected() {
    for who in identities() {
        // A writable parent directory holding several projects.
        let s = Scratch::new(who);
        for p in [".git/HEAD", ".git/config", ".git/hooks/pre-commit"] {
            s.write(&format!("proj/apps/web/{p}"), "ORIGINAL\n");
        }
        s.mkdir("proj/apps/web/.git/objects");
        s.mkdir("proj/apps/web/.git/refs");
        s.write("proj/tools/.claude/settings.json", "ORIGINAL\n");
        let before = s.snapshot();
        let script = "for p in apps/web/.git/HEAD apps/web/.git/config apps/web/.git/hooks/pre-commit \
                        apps/web/.git/hooks/post-checkout apps/web/.git/objects/x apps/web/.git/refs/x \
                        tools/.claude/settings.json tools/.claude/settings.local.json tools/.claude/commands/x.md; do \
               if mkdir -p $(dirname $p) 2>/dev/null && echo EVIL > $p 2>/dev/null; then echo ESCAPED $p; else echo refused $p; fi; done; \
             echo ok > apps/web/notes && echo wrote-notes && rm apps/web/notes";
        let (out, log) = s.run_rw(&[], script);
        assert_ran(&out, &log);
        let so = ok_lines(&out);
        assert_eq!(so.matches("refused").count(), 9, "{so}");
        assert!(so.contains("wrote-notes"), "{so}");
        s.assert_clean(&before);
    }
}
