//! Every denied syscall family of the default profile, called directly
//! (raw syscall(2), int 0x80, x32 numbers), fails as documented in the man
//! page: EPERM, ENOSYS (clone3, calls newer than the table) or a SIGSYS
//! kill. Run as root and as the unprivileged user; as root the same probe
//! without a filter gives another answer, so the denial is the filter's.

mod common;
use common::*;

/// Calls the default profile answers with EPERM.
const EPERM_CALLS: &[&str] = &[
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "swapon",
    "swapoff",
    "reboot",
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "request_key",
    "userfaultfd",
    "unshare",
    "setns",
    "clone_newuser",
    "clone_newns",
    "clone_newnet",
    "clone_newpid",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "name_to_handle_at",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "acct",
    "quotactl",
    "syslog",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "personality_bsd",
    "personality_no_aslr",
    "tiocsti",
    "tioclinux",
];

/// Calls that kill the process (only an exploit makes them).
const KILL_CALLS: &[&str] = &[
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "iopl",
    "ioperm",
    "modify_ldt",
    "open_by_handle_at",
    "x32_getpid",
    "i386_getpid",
];

/// Calls the default profile must let through.
const ALLOWED: &[&str] = &[
    "getpid",
    "getppid",
    "clone_plain",
    "personality_query",
    "personality_linux",
    "tiocgwinsz",
    "socket_inet",
    "socket_unix",
    "socketpair",
];

#[test]
fn denied_families_fail_with_eperm() {
    let lab = Lab::new();
    for who in identities() {
        let (out, got) = probes(&lab, who, &[], EPERM_CALLS);
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        for name in EPERM_CALLS {
            assert_eq!(
                got.get(*name).map(String::as_str),
                Some(EPERM),
                "{who:?} {name}: {got:?}"
            );
        }
        if who == As::Root {
            let base = baseline(&lab, who, EPERM_CALLS);
            for name in EPERM_CALLS {
                assert_ne!(
                    base.get(*name).map(String::as_str),
                    Some(EPERM),
                    "root baseline {name}: {base:?}"
                );
            }
        }
    }
}

#[test]
fn clone_with_namespace_flags_fails_plain_clone_works() {
    let lab = Lab::new();
    for who in identities() {
        let names = ["clone_newuser", "clone_newns", "clone_plain", "clone3"];
        let (_, got) = probes(&lab, who, &[], &names);
        assert_eq!(got["clone_newuser"], EPERM, "{who:?}");
        assert_eq!(got["clone_newns"], EPERM, "{who:?}");
        assert!(got["clone_plain"].starts_with("ok "), "{who:?}: {got:?}");
        // clone3: ENOSYS, so libc falls back to clone, whose flags are checked.
        assert_eq!(got["clone3"], ENOSYS, "{who:?}");
    }
}

#[test]
fn unshare_setns_and_the_new_mount_api_fail() {
    let lab = Lab::new();
    for who in identities() {
        let names = [
            "unshare",
            "setns",
            "fsopen",
            "open_tree",
            "move_mount",
            "fsmount",
        ];
        let (_, got) = probes(&lab, who, &[], &names);
        for n in names {
            assert_eq!(got[n], EPERM, "{who:?} {n}");
        }
        // And the real tool, through libc.
        let out = seccomp(who, &[], &[&"unshare", &"-Ur", &"true"]);
        assert_ne!(code(&out), 0, "unshare -Ur worked under the filter");
    }
}

#[test]
fn kill_list_dies_of_sigsys() {
    let lab = Lab::new();
    for who in identities() {
        for name in KILL_CALLS {
            let (out, got) = probes(&lab, who, &[], &["getpid", name]);
            // The probe ran (getpid answered) and died at the call.
            assert!(
                got.contains_key("getpid"),
                "{who:?} {name}: {}",
                stderr(&out)
            );
            assert!(!got.contains_key(*name), "{who:?} {name} returned: {got:?}");
            assert_eq!(code(&out), SIGSYS_EXIT, "{who:?} {name}: {}", stderr(&out));
        }
    }
}

#[test]
fn x32_and_i386_syscalls_are_killed() {
    let lab = Lab::new();
    for who in identities() {
        // Without a filter the x32 call fails (ENOSYS where the kernel lacks
        // the ABI) and int 0x80 works: the kill is the filter's.
        let base = baseline(&lab, who, &["x32_getpid", "i386_getpid"]);
        assert!(base["i386_getpid"].starts_with("ok "), "{base:?}");
        for name in ["x32_getpid", "i386_getpid"] {
            let (out, _) = probes(&lab, who, &[], &[name]);
            assert_eq!(code(&out), SIGSYS_EXIT, "{who:?} {name}");
            // Even with no profile, any filter carries the ABI prelude.
            let (out, _) = probes(&lab, who, &["--profile", "none", "--deny", "acct"], &[name]);
            assert_eq!(code(&out), SIGSYS_EXIT, "{who:?} {name} (profile none)");
        }
    }
}

#[test]
fn syscalls_newer_than_the_table_get_enosys() {
    let lab = Lab::new();
    for who in identities() {
        let (_, got) = probes(&lab, who, &[], &["unknown_467"]);
        assert_eq!(got["unknown_467"], ENOSYS, "{who:?}");
    }
}

#[test]
fn normal_calls_are_allowed() {
    let lab = Lab::new();
    for who in identities() {
        let (out, got) = probes(&lab, who, &[], ALLOWED);
        assert_eq!(code(&out), 0);
        for n in ALLOWED {
            assert!(got[*n].starts_with("ok "), "{who:?} {n}: {got:?}");
        }
    }
}

/// A static C program (no dynamic loader, no vDSO clock read) that reads
/// the TSC when given an argument. glibc's ld.so and the vDSO's
/// clock_gettime read the TSC themselves, so a dynamically linked program
/// cannot run under --no-tsc at all (documented in docs/seccomp.md).
fn static_rdtsc(lab: &Lab) -> Option<std::path::PathBuf> {
    let src = lab.path().join("rdtsc.c");
    let bin = lab.path().join("rdtsc");
    std::fs::write(
        &src,
        "#include <stdio.h>\n#include <x86intrin.h>\n\
         int main(int c, char **v) { puts(\"start\"); fflush(stdout);\n\
         if (c > 1) printf(\"tsc %llu\\n\", (unsigned long long)__rdtsc());\n return 0; }\n",
    )
    .unwrap();
    let st = std::process::Command::new("gcc")
        .args(["-static", "-O1", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .ok()?;
    st.success().then_some(bin)
}

#[test]
fn rdtsc_traps_under_no_tsc() {
    let lab = Lab::new();
    let Some(bin) = static_rdtsc(&lab) else {
        sbx_testutil::skip!("gcc -static (build-essential, libc6-dev) is missing");
    };
    for who in identities() {
        let out = seccomp(who, &[], &[&bin, &"rdtsc"]);
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        assert!(stdout(&out).contains("tsc "));
        // The program runs under --no-tsc until it reads the TSC.
        let out = seccomp(who, &["--no-tsc"], &[&bin]);
        assert_eq!(code(&out), 0, "{who:?}: {}", stderr(&out));
        let out = seccomp(who, &["--no-tsc"], &[&bin, &"rdtsc"]);
        assert_eq!(stdout(&out), "start\n");
        assert_eq!(code(&out), 128 + libc::SIGSEGV, "{who:?}");
    }
}

#[test]
fn no_network_blocks_inet_keeps_unix() {
    let lab = Lab::new();
    let names = [
        "socket_inet",
        "socket_inet6",
        "socket_packet",
        "socket_netlink",
        "io_uring_setup",
        "socket_unix",
        "socketpair",
    ];
    for who in identities() {
        for profile in ["default", "none"] {
            let (out, got) = probes(&lab, who, &["--profile", profile, "--no-network"], &names);
            assert_eq!(code(&out), 0, "{}", stderr(&out));
            for n in &names[..5] {
                assert_eq!(got[*n], EPERM, "{who:?} {profile} {n}");
            }
            assert!(got["socket_unix"].starts_with("ok "), "{got:?}");
            assert!(got["socketpair"].starts_with("ok "), "{got:?}");
        }
        // A real client: curl cannot even create its socket.
        let out = seccomp(
            who,
            &["--no-network"],
            &[&"curl", &"-sS", &"--max-time", &"5", &"http://127.0.0.1:9/"],
        );
        assert_ne!(code(&out), 0);
    }
    // As root, AF_PACKET works without the flag: the denial is the filter's.
    if sbx_testutil::is_root() {
        let (_, got) = probes(&lab, As::Root, &[], &["socket_packet"]);
        assert!(got["socket_packet"].starts_with("ok "), "{got:?}");
    }
}

#[test]
fn allow_ptrace_lets_debuggers_work() {
    let lab = Lab::new();
    for who in identities() {
        let names = [
            "ptrace",
            "process_vm_readv",
            "personality_no_aslr",
            "personality_bsd",
            "mount",
        ];
        let (_, got) = probes(&lab, who, &["--allow-ptrace"], &names);
        // ESRCH: no such tracee; the call itself went through.
        assert_eq!(got["ptrace"], "err 3", "{who:?}");
        assert_ne!(got["process_vm_readv"], EPERM, "{got:?}");
        assert!(got["personality_no_aslr"].starts_with("ok "), "{got:?}");
        assert_eq!(got["personality_bsd"], EPERM);
        assert_eq!(got["mount"], EPERM);
    }
}

#[test]
fn allow_deny_and_action_on_top_of_a_profile() {
    let lab = Lab::new();
    for who in identities() {
        let (_, got) = probes(&lab, who, &["--deny", "getppid"], &["getppid", "getpid"]);
        assert_eq!(got["getppid"], EPERM);
        assert!(got["getpid"].starts_with("ok "));

        let (_, got) = probes(&lab, who, &["--allow", "unshare"], &["unshare", "acct"]);
        assert_eq!(got["unshare"], "ok 0", "{who:?}");
        assert_eq!(got["acct"], EPERM);

        // --action kill: a probed call now kills.
        let (out, got) = probes(&lab, who, &["--action", "kill"], &["getpid", "bpf"]);
        assert!(!got.contains_key("bpf"));
        assert_eq!(code(&out), SIGSYS_EXIT);
        // ... but clone3 keeps ENOSYS (glibc's pthread_create needs the fallback).
        let (_, got) = probes(&lab, who, &["--action", "kill"], &["clone3"]);
        assert_eq!(got["clone3"], ENOSYS);

        // --action errno: an exploit-only call now fails instead of killing.
        let (out, got) = probes(&lab, who, &["--action", "errno"], &["iopl"]);
        assert_eq!(code(&out), 0);
        assert_eq!(got["iopl"], EPERM);

        // --action log: allowed (and logged by the kernel).
        let (_, got) = probes(&lab, who, &["--action", "log"], &["unshare"]);
        assert_eq!(got["unshare"], "ok 0", "{who:?}");
    }
}

#[test]
fn strict_profile_is_an_allowlist() {
    let lab = Lab::new();
    for who in identities() {
        let names = [
            "getpid",
            "mknod",
            "socket_unix",
            "socket_inet",
            "clone_plain",
            "clone3",
            "mount",
        ];
        let (out, got) = probes(&lab, who, &["--profile", "strict"], &names);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(got["getpid"].starts_with("ok "));
        assert!(got["clone_plain"].starts_with("ok "));
        assert!(got["socket_unix"].starts_with("ok "));
        assert_eq!(got["socket_inet"], EPERM);
        assert_eq!(
            got["mknod"], EPERM,
            "mknodat is not in the strict allowlist"
        );
        assert_eq!(got["clone3"], ENOSYS);
        assert_eq!(got["mount"], EPERM);
        let (_, got) = probes(
            &lab,
            who,
            &["--profile", "strict", "--allow", "mknodat"],
            &["mknod"],
        );
        assert_eq!(got["mknod"], "err 2", "ENOENT: the call ran");
        // A shell pipeline works under strict.
        let out = seccomp(
            who,
            &["--profile", "strict"],
            &[&"sh", &"-c", &"echo a b | tr a-z A-Z | wc -w"],
        );
        assert_eq!(stdout(&out).trim(), "2", "{}", stderr(&out));
    }
}

#[test]
fn policy_file_in_seccompiler_format() {
    let lab = Lab::new();
    let pol = lab.path().join("policy.json");
    std::fs::write(
        &pol,
        r#"{"main": {"mismatch_action": "allow", "filter_action": {"errno": 13},
             "filter": [{"syscall": "getppid"},
                        {"syscall": "socket", "args": [{"index": 0, "type": "dword", "op": "eq", "val": 2}]}]}}"#,
    )
    .unwrap();
    let p = pol.to_str().unwrap();
    for who in identities() {
        // --policy alone: only the file's filter.
        let (out, got) = probes(
            &lab,
            who,
            &["--policy", p],
            &["getppid", "socket_inet", "socket_inet6", "bpf"],
        );
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert_eq!(got["getppid"], "err 13");
        assert_eq!(got["socket_inet"], "err 13");
        assert!(got["socket_inet6"].starts_with("ok "));
        assert_ne!(got["bpf"], EPERM);
        // With an explicit profile both apply.
        let (_, got) = probes(
            &lab,
            who,
            &["--profile", "default", "--policy", p],
            &["getppid", "bpf"],
        );
        assert_eq!(got["getppid"], "err 13");
        assert_eq!(got["bpf"], EPERM);
    }
}

#[test]
fn sigterm_reaches_the_command() {
    for who in identities() {
        let mut c = sbx_testutil::tool("sbx-seccomp");
        c.args(["--", "sleep", "30"])
            .env("PATH", "/usr/local/bin:/usr/bin:/bin");
        run_as(&mut c, who);
        let mut child = c.spawn().unwrap();
        // The pid is sleep's once sbx-seccomp has exec'd: wait for that
        // (bounded), then SIGTERM must end it.
        let pid = child.id() as i32;
        let mut execd = false;
        for _ in 0..500 {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if comm.trim() == "sleep" {
                execd = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(execd, "sbx-seccomp did not exec sleep");
        // SAFETY: kill with integer arguments; pid is our own unreaped child.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let st = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(st.signal(), Some(libc::SIGTERM), "{who:?}: {st:?}");
    }
}

#[test]
fn no_new_privs_and_the_filters_are_in_place() {
    for who in identities() {
        let out = seccomp(who, &[], &[&"cat", &"/proc/self/status"]);
        let s = stdout(&out);
        let field = |k: &str| {
            s.lines()
                .find_map(|l| l.strip_prefix(k).map(|v| v.trim().to_string()))
                .unwrap_or_else(|| panic!("{k} missing in {s}"))
        };
        assert_eq!(field("NoNewPrivs:"), "1", "{who:?}");
        assert_eq!(field("Seccomp:"), "2", "{who:?}: filter mode");
        assert_eq!(
            field("Seccomp_filters:"),
            "3",
            "{who:?}: enosys, eperm, kill"
        );
    }
}

#[test]
fn setuid_binaries_do_not_raise_privileges() {
    if !sbx_testutil::is_root() || sbx_testutil::test_user().is_none() {
        sbx_testutil::skip!("needs root (to make a setuid-root program) and the test user");
    }
    let lab = Lab::new();
    let id = lab.path().join("id-setuid");
    std::fs::copy("/usr/bin/id", &id).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&id, std::fs::Permissions::from_mode(0o4755)).unwrap();
    // Without sbx-seccomp the setuid bit works here (the dir is not nosuid).
    let mut c = std::process::Command::new(&id);
    c.arg("-u");
    run_as(&mut c, As::User);
    let out = sbx_testutil::output(&mut c);
    if stdout(&out).trim() != "0" {
        sbx_testutil::skip!(
            "setuid does not take effect on {} here",
            lab.path().display()
        );
    }
    let out = seccomp(As::User, &[], &[&id, &"-u"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_ne!(
        stdout(&out).trim(),
        "0",
        "setuid raised privileges under no_new_privs"
    );
}
