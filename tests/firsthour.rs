//! Issue 21, a user's first hour: `scripts/install` (and `make install`)
//! puts the tools, their man pages and their completions where each program
//! looks, for root into a PREFIX and for an unprivileged user into
//! ~/.local; `--uninstall` removes exactly that; `scripts/package` builds a
//! .deb and a static tarball.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Command;

use sbx_testutil::{As, code, identities, run_as, stderr, stdout};

const TOOLS: &[&str] = &[
    "sbx-audit",
    "sbx-cgroup",
    "sbx-container",
    "sbx-creds",
    "sbx-dnsproxy",
    "sbx-doctor",
    "sbx-fs",
    "sbx-gitguard",
    "sbx-gvisor",
    "sbx-net",
    "sbx-path",
    "sbx-policy",
    "sbx-seccomp",
    "sbx-vm",
    "sbx-wasm",
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The directory holding the built tools.
fn bin_dir() -> PathBuf {
    sbx_testutil::bin("sbx-fs").parent().unwrap().to_path_buf()
}

/// A copy of what scripts/install reads (the script, sbx-run, man/,
/// completions/) in `dir`, so the test user can read it wherever the
/// checkout lives.
fn source_copy(dir: &Path) -> PathBuf {
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("scripts")).unwrap();
    for f in ["scripts/install", "scripts/sbx-run", "scripts/package"] {
        std::fs::copy(root().join(f), src.join(f)).unwrap();
    }
    for d in ["man", "completions"] {
        let st = Command::new("cp")
            .arg("-r")
            .arg(root().join(d))
            .arg(&src)
            .status()
            .unwrap();
        assert!(st.success());
    }
    std::fs::copy(root().join("README.md"), src.join("README.md")).unwrap();
    std::fs::copy(root().join("Cargo.toml"), src.join("Cargo.toml")).unwrap();
    chown_r(dir);
    src
}

fn man_pages() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root().join("man"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".1"))
        .collect();
    v.sort();
    assert!(v.len() > TOOLS.len(), "man pages: {v:?}");
    v
}

/// Every file an install puts under `prefix`.
fn expected_files(prefix: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for t in TOOLS {
        v.push(prefix.join("bin").join(t));
        v.push(prefix.join("share/bash-completion/completions").join(t));
        v.push(
            prefix
                .join("share/zsh/site-functions")
                .join(format!("_{t}")),
        );
        v.push(
            prefix
                .join("share/fish/vendor_completions.d")
                .join(format!("{t}.fish")),
        );
    }
    v.push(prefix.join("bin/sbx-run"));
    for m in man_pages() {
        v.push(prefix.join("share/man/man1").join(m));
    }
    v.push(prefix.join("share/sbx/install-manifest"));
    v
}

/// Runs `c` as `who` with HOME = `home` (run_as sets the test user's own).
fn run(mut c: Command, who: As, home: &Path) -> std::process::Output {
    run_as(&mut c, who);
    c.env("HOME", home);
    c.output().expect("spawn")
}

/// Files below `dir` whose name mentions sbx.
fn sbx_leftovers(dir: &Path) -> Vec<String> {
    let out = Command::new("find")
        .arg(dir)
        .args(["-name", "*sbx*"])
        .output()
        .unwrap();
    stdout(&out).lines().map(str::to_string).collect()
}

/// Installs as root into a temp PREFIX and as the test user into its
/// ~/.local (the default), then checks that man finds the pages, each
/// shell loads the completion from where it was put, and that uninstall
/// leaves nothing behind.
#[test]
fn install_finds_man_pages_and_completions_and_uninstall_leaves_nothing() {
    for who in identities() {
        let d = sbx_testutil::shared_tempdir();
        let src = source_copy(d.path());
        let home = d.path().join("home");
        std::fs::create_dir(&home).unwrap();
        chown_r(&home);
        // Root names a PREFIX; the user takes the default, ~/.local.
        let prefix = match who {
            As::Root => d.path().join("prefix"),
            As::User => home.join(".local"),
        };
        let mut c = Command::new(src.join("scripts/install"));
        c.arg("--bin-dir")
            .arg(bin_dir())
            .env("HOME", &home)
            .env_remove("PREFIX")
            .env_remove("DESTDIR");
        if who == As::Root {
            c.arg("--prefix").arg(&prefix);
        }
        let out = run(c, who, &home);
        assert_eq!(code(&out), 0, "{who:?}: install: {}", stderr(&out));
        assert!(
            stdout(&out).contains(&format!("installed sbx into {}", prefix.display())),
            "{}",
            stdout(&out)
        );
        for f in expected_files(&prefix) {
            assert!(f.is_file(), "{who:?}: missing {}", f.display());
        }
        // The installed binary runs.
        let mut c = Command::new(prefix.join("bin/sbx-doctor"));
        c.arg("--version");
        let out = run(c, who, &home);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(stdout(&out).starts_with("sbx-doctor "));

        // man: through MANPATH, and through PATH alone (man-db maps
        // PREFIX/bin to PREFIX/share/man), as `man sbx-fs` would.
        for page in ["sbx-fs", "sbx-policy-chain", "sbx-doctor"] {
            let mut c = Command::new("man");
            c.args(["-w", page])
                .env("MANPATH", prefix.join("share/man"))
                .env("HOME", &home);
            let out = run(c, who, &home);
            assert_eq!(
                stdout(&out).trim(),
                prefix
                    .join(format!("share/man/man1/{page}.1"))
                    .to_str()
                    .unwrap(),
                "{who:?}: man -w {page}: {}",
                stderr(&out)
            );
        }
        let mut c = Command::new("man");
        c.args(["-w", "sbx-fs"])
            .env_remove("MANPATH")
            .env("HOME", &home)
            .env("PATH", format!("{}:{PATH}", prefix.join("bin").display()));
        let out = run(c, who, &home);
        assert!(
            stdout(&out).trim().ends_with("man1/sbx-fs.1")
                && stdout(&out).starts_with(prefix.to_str().unwrap()),
            "{who:?}: man -w sbx-fs through PATH: {} {}",
            stdout(&out),
            stderr(&out)
        );

        // Completions, loaded the way each shell finds them: the user's
        // own data dir for ~/.local, XDG_DATA_DIRS for another PREFIX.
        let path = format!("{}:{PATH}", prefix.join("bin").display());
        let xdg = format!(
            "{}:/usr/local/share:/usr/share",
            prefix.join("share").display()
        );
        let with_env = |c: &mut Command| {
            c.env("HOME", &home)
                .env("PATH", &path)
                .env_remove("XDG_DATA_HOME");
            if who == As::Root {
                c.env("XDG_DATA_DIRS", &xdg);
            } else {
                c.env_remove("XDG_DATA_DIRS");
            }
        };
        let bc = Path::new("/usr/share/bash-completion/bash_completion");
        if bc.exists() {
            let mut c = Command::new("bash");
            c.arg("-c").arg(format!(
                "source {}; __load_completion sbx-policy && complete -p sbx-policy",
                bc.display()
            ));
            with_env(&mut c);
            let out = run(c, who, &home);
            assert!(
                stdout(&out).contains("-F _sbx__policy sbx-policy"),
                "{who:?}: bash did not load the completion: {} {}",
                stdout(&out),
                stderr(&out)
            );
        } else if sbx_testutil::must_work() {
            panic!("bash-completion is not installed (scripts/setup installs it)");
        }
        let mut c = Command::new("zsh");
        c.arg("-f").arg("-c").arg(format!(
            "fpath=({} $fpath); autoload -Uz compinit; compinit -u -D; print -r -- $_comps[sbx-doctor]",
            prefix.join("share/zsh/site-functions").display()
        ));
        with_env(&mut c);
        let out = run(c, who, &home);
        assert_eq!(
            stdout(&out).trim(),
            "_sbx-doctor",
            "{who:?}: zsh: {}",
            stderr(&out)
        );
        let mut c = Command::new("fish");
        c.arg("-c").arg("complete -C 'sbx-doctor --js'");
        with_env(&mut c);
        let out = run(c, who, &home);
        assert!(
            stdout(&out).starts_with("--json"),
            "{who:?}: fish did not complete: {} {}",
            stdout(&out),
            stderr(&out)
        );

        // Uninstall: nothing that was installed remains.
        let mut c = Command::new(src.join("scripts/install"));
        c.arg("--uninstall").env("HOME", &home).env_remove("PREFIX");
        if who == As::Root {
            c.arg("--prefix").arg(&prefix);
        }
        let out = run(c, who, &home);
        assert_eq!(code(&out), 0, "{who:?}: uninstall: {}", stderr(&out));
        for f in expected_files(&prefix) {
            assert!(!f.exists(), "{who:?}: left {}", f.display());
        }
        assert_eq!(sbx_leftovers(&home), Vec::<String>::new(), "{who:?}");
        if who == As::Root {
            // The install made the prefix: uninstall took it away again.
            assert!(!prefix.exists(), "{} is left", prefix.display());
        } else {
            // Only what the shells made for themselves remains.
            for dir in [
                "bin",
                "share/man",
                "share/bash-completion",
                "share/zsh",
                "share/sbx",
            ] {
                assert!(!prefix.join(dir).exists(), "left {dir}");
            }
        }
    }
}

/// A file changed after the install is kept by --uninstall (exit 1, named);
/// an install over a file it did not put there is refused with nothing
/// written; a second install over the first is refused.
#[test]
fn uninstall_keeps_changed_files_and_install_never_overwrites() {
    let d = tempfile::tempdir().unwrap();
    let prefix = d.path().join("p");
    let install = |extra: &[&str]| {
        let mut c = Command::new(root().join("scripts/install"));
        c.arg("--prefix")
            .arg(&prefix)
            .arg("--bin-dir")
            .arg(bin_dir())
            .args(extra)
            .env_remove("DESTDIR");
        c.output().unwrap()
    };
    // Someone else's file where sbx-fs would go.
    write(&prefix.join("bin/sbx-fs"), "not ours\n");
    let out = install(&[]);
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert_eq!(
        stderr(&out).trim_end().lines().count(),
        1,
        "{}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("bin/sbx-fs exists"),
        "{}",
        stderr(&out)
    );
    // Nothing half-applied: only the foreign file is there.
    let left: Vec<String> = Command::new("find")
        .arg(&prefix)
        .args(["-type", "f"])
        .output()
        .map(|o| stdout(&o).lines().map(str::to_string).collect())
        .unwrap();
    assert_eq!(left, vec![prefix.join("bin/sbx-fs").display().to_string()]);
    assert!(!prefix.join("share").exists());
    std::fs::remove_file(prefix.join("bin/sbx-fs")).unwrap();

    let out = install(&[]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = install(&[]);
    assert_eq!(code(&out), 125);
    assert!(
        stderr(&out).contains("already installed"),
        "{}",
        stderr(&out)
    );

    let changed = prefix.join("share/man/man1/sbx-fs.1");
    std::fs::write(&changed, "edited\n").unwrap();
    let out = install(&["--uninstall"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("kept {}", changed.display())),
        "{}",
        stderr(&out)
    );
    assert_eq!(std::fs::read_to_string(&changed).unwrap(), "edited\n");
    assert!(!prefix.join("bin/sbx-fs").exists());
    assert!(!prefix.join("share/sbx/install-manifest").exists());
}

/// DESTDIR stages the tree while the manifest names PREFIX paths; the
/// Makefile's install/uninstall targets call the script with PREFIX,
/// DESTDIR and BIN_DIR; bad usage is one line and exit 125.
#[test]
fn destdir_make_targets_and_bad_usage() {
    let d = tempfile::tempdir().unwrap();
    let stage = d.path().join("stage");
    let mut c = Command::new("make");
    c.arg("-s")
        .arg("-C")
        .arg(root())
        .arg("install")
        .arg("PREFIX=/usr")
        .arg(format!("DESTDIR={}", stage.display()))
        .arg(format!("BIN_DIR={}", bin_dir().display()));
    let out = c.output().unwrap();
    assert_eq!(code(&out), 0, "make install: {}", stderr(&out));
    for f in expected_files(Path::new("/usr")) {
        let staged = stage.join(f.strip_prefix("/").unwrap());
        assert!(staged.is_file(), "missing {}", staged.display());
    }
    let manifest = std::fs::read_to_string(stage.join("usr/share/sbx/install-manifest")).unwrap();
    assert!(manifest.contains(" /usr/bin/sbx-fs\n"), "{manifest}");
    assert!(!manifest.contains(stage.to_str().unwrap()), "{manifest}");
    let out = Command::new("make")
        .arg("-s")
        .arg("-C")
        .arg(root())
        .arg("uninstall")
        .arg("PREFIX=/usr")
        .arg(format!("DESTDIR={}", stage.display()))
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "make uninstall: {}", stderr(&out));
    assert_eq!(sbx_leftovers(&stage), Vec::<String>::new());

    let bad = |args: &[&str], needle: &str| {
        let out = Command::new(root().join("scripts/install"))
            .args(args)
            .output()
            .unwrap();
        sbx_testutil::assert_usage_error(&out, needle);
    };
    bad(&["--bogus"], "unknown argument '--bogus'");
    bad(
        &["--prefix", "rel/dir"],
        "--prefix 'rel/dir': must be an absolute path",
    );
    bad(&["--prefix"], "--prefix: missing DIR");
    bad(
        &[
            "--prefix",
            d.path().join("none").to_str().unwrap(),
            "--uninstall",
        ],
        "no manifest",
    );
    // No binaries to take and no cargo to build them with.
    let src = source_copy(d.path());
    let out = Command::new(src.join("scripts/install"))
        .arg("--prefix")
        .arg(d.path().join("p"))
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    sbx_testutil::assert_usage_error(&out, "no cargo on PATH");
    assert!(!d.path().join("p").exists(), "nothing written");
    let out = Command::new(root().join("scripts/package"))
        .arg("--bogus")
        .output()
        .unwrap();
    sbx_testutil::assert_usage_error(&out, "unknown argument '--bogus'");
}

/// The .deb built from the workspace's binaries lists every tool, man page
/// and completion (dpkg-deb -c), says what it is (dpkg-deb -f), and once
/// unpacked `man -w` finds its pages.
#[test]
fn deb_package_holds_every_tool_man_page_and_completion() {
    if !sbx_testutil::have("dpkg-deb") {
        sbx_testutil::skip!("dpkg-deb is not installed");
    }
    let d = tempfile::tempdir().unwrap();
    let out = Command::new(root().join("scripts/package"))
        .arg("--deb")
        .arg("--bin-dir")
        .arg(bin_dir())
        .arg("--out")
        .arg(d.path())
        // The debug binaries are big: fast compression keeps this short.
        .env("SBX_PACKAGE_GZIP_LEVEL", "1")
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "scripts/package --deb: {}", stderr(&out));
    let deb = PathBuf::from(stdout(&out).trim());
    assert!(
        deb.is_file() && deb.starts_with(d.path()),
        "{}",
        deb.display()
    );
    assert!(
        deb.file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("sbx_0.")
    );

    let list = Command::new("dpkg-deb")
        .arg("-c")
        .arg(&deb)
        .output()
        .unwrap();
    assert_eq!(code(&list), 0, "{}", stderr(&list));
    let list = stdout(&list);
    let has = |p: &str| list.lines().any(|l| l.ends_with(&format!(" ./{p}")));
    for t in TOOLS {
        assert!(has(&format!("usr/bin/{t}")), "no {t} in:\n{list}");
        assert!(
            has(&format!("usr/share/bash-completion/completions/{t}")),
            "{t} bash"
        );
        assert!(
            has(&format!("usr/share/zsh/vendor-completions/_{t}")),
            "{t} zsh"
        );
        assert!(
            has(&format!("usr/share/fish/vendor_completions.d/{t}.fish")),
            "{t} fish"
        );
    }
    assert!(has("usr/bin/sbx-run"));
    for m in man_pages() {
        assert!(has(&format!("usr/share/man/man1/{m}.gz")), "no {m}.gz");
    }
    assert!(
        !list.contains("install-manifest"),
        "dpkg keeps its own list"
    );
    assert!(
        list.lines()
            .filter(|l| l.contains("./usr/"))
            .all(|l| l.contains(" root/root ")),
        "owned by root"
    );

    let field = |f: &str| {
        let o = Command::new("dpkg-deb")
            .args(["-f"])
            .arg(&deb)
            .arg(f)
            .output()
            .unwrap();
        stdout(&o).trim().to_string()
    };
    assert_eq!(field("Package"), "sbx");
    assert!(field("Version").starts_with("0."), "{}", field("Version"));
    assert!(
        field("Depends").contains("libc6"),
        "dynamic binaries: {}",
        field("Depends")
    );

    let x = d.path().join("x");
    let st = Command::new("dpkg-deb")
        .arg("-x")
        .arg(&deb)
        .arg(&x)
        .status()
        .unwrap();
    assert!(st.success());
    let out = Command::new("man")
        .args(["-w", "sbx-doctor"])
        .env("MANPATH", x.join("usr/share/man"))
        .output()
        .unwrap();
    assert!(
        stdout(&out)
            .trim()
            .ends_with("usr/share/man/man1/sbx-doctor.1.gz"),
        "{} {}",
        stdout(&out),
        stderr(&out)
    );
    let out = Command::new(x.join("usr/bin/sbx-doctor"))
        .args(["--check", "seccomp"])
        .output()
        .unwrap();
    assert_eq!(
        code(&out),
        0,
        "the packaged (stripped) doctor runs: {}",
        stderr(&out)
    );
}

/// The tarball takes static binaries only: a dynamic one is refused with
/// one line naming it, and nothing is written.
#[test]
fn tarball_refuses_a_dynamic_binary() {
    let d = tempfile::tempdir().unwrap();
    let out = Command::new(root().join("scripts/package"))
        .arg("--tar")
        .arg("--bin-dir")
        .arg(bin_dir())
        .arg("--out")
        .arg(d.path())
        .output()
        .unwrap();
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert_eq!(
        stderr(&out).trim_end().lines().count(),
        1,
        "{}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("is not statically linked"),
        "{}",
        stderr(&out)
    );
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
}

/// The release packages proper: a static release build of every tool
/// (minutes when cold), both artifacts. Runs with SBX_TEST_PACKAGE=1
/// (scripts/test leaves it off: a cold static release build costs CI
/// ~8 min); otherwise it says it was skipped.
#[test]
fn static_release_tarball_and_deb() {
    if std::env::var("SBX_TEST_PACKAGE").as_deref() != Ok("1") {
        eprintln!(
            "skipped: set SBX_TEST_PACKAGE=1 for the static release build (off in scripts/test: CI time)"
        );
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let out = Command::new(root().join("scripts/package"))
        .arg("--out")
        .arg(d.path())
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "scripts/package: {}", stderr(&out));
    let made: Vec<PathBuf> = stdout(&out).lines().map(PathBuf::from).collect();
    let tar = made
        .iter()
        .find(|p| p.to_string_lossy().ends_with("-linux-static.tar.gz"))
        .expect("a tarball");
    let deb = made
        .iter()
        .find(|p| p.to_string_lossy().ends_with(".deb"))
        .expect("a .deb");
    // Unpacked the way the README says, into a fresh prefix.
    let prefix = d.path().join("prefix");
    std::fs::create_dir(&prefix).unwrap();
    let st = Command::new("tar")
        .arg("-xzf")
        .arg(tar)
        .arg("-C")
        .arg(&prefix)
        .arg("--strip-components=1")
        .status()
        .unwrap();
    assert!(st.success());
    for f in expected_files(&prefix) {
        if f.ends_with("install-manifest") {
            continue;
        }
        assert!(f.is_file(), "tarball lacks {}", f.display());
    }
    for t in TOOLS {
        let ldd = Command::new("ldd")
            .arg(prefix.join("bin").join(t))
            .output()
            .unwrap();
        let s = format!("{}{}", stdout(&ldd), stderr(&ldd));
        assert!(
            s.contains("not a dynamic executable") || s.contains("statically linked"),
            "{t} is not static: {s}"
        );
    }
    let out = Command::new(prefix.join("bin/sbx-doctor"))
        .args(["--check", "seccomp", "--check", "landlock"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let o = Command::new("dpkg-deb")
        .args(["-f"])
        .arg(deb)
        .arg("Depends")
        .output()
        .unwrap();
    assert_eq!(stdout(&o).trim(), "", "static binaries depend on nothing");
}

/// A namespace the kernel refuses (EPERM, as when unprivileged user
/// namespaces are blocked; produced here by a seccomp filter on the one
/// call) gives sbx-fs and sbx-net one line that names the doctor check, as
/// root and as the test user.
#[test]
fn a_refused_namespace_names_the_doctor_check() {
    for who in identities() {
        for (tool, call, args) in [
            (
                "sbx-fs",
                "clone",
                &[
                    "--ro", "/usr", "--ro", "/bin", "--ro", "/lib", "--ro", "/lib64",
                ][..],
            ),
            ("sbx-net", "unshare", &[][..]),
        ] {
            let mut c = sbx_testutil::tool("sbx-seccomp");
            c.args([
                "--profile",
                "none",
                "--action",
                "errno",
                "--deny",
                call,
                "--",
            ])
            .arg(sbx_testutil::bin(tool))
            .args(args)
            .args(["--", "/bin/true"]);
            run_as(&mut c, who);
            let out = c.output().unwrap();
            let err = stderr(&out);
            assert_eq!(code(&out), 125, "{who:?} {tool}: {err}");
            assert_eq!(err.trim_end().lines().count(), 1, "{who:?} {tool}: {err}");
            assert!(
                err.contains("run `sbx-doctor --check userns`")
                    && err.contains("Operation not permitted"),
                "{who:?} {tool}: {err}"
            );
        }
    }
}

/// landlock_create_ruleset refused (EPERM through a seccomp filter, as in
/// a container whose profile lacks it): sbx-seccomp --allow-exec names the
/// doctor check, and the doctor's landlock check warns with its fix.
#[test]
fn a_refused_landlock_names_the_doctor_check_and_the_doctor_sees_it() {
    let deny = |c: &mut Command| {
        c.args([
            "--profile",
            "none",
            "--action",
            "errno",
            "--deny",
            "landlock_create_ruleset",
            "--",
        ]);
    };
    let mut c = sbx_testutil::tool("sbx-seccomp");
    deny(&mut c);
    c.arg(sbx_testutil::bin("sbx-seccomp")).args([
        "--allow-exec",
        "/usr",
        "--allow-exec",
        "/bin",
        "--",
        "/bin/true",
    ]);
    let out = c.output().unwrap();
    sbx_testutil::assert_usage_error(&out, "(run `sbx-doctor --check landlock`)");
    let mut c = sbx_testutil::tool("sbx-seccomp");
    deny(&mut c);
    c.arg(sbx_testutil::bin("sbx-doctor"))
        .args(["--check", "landlock", "--json"]);
    let out = c.output().unwrap();
    assert_eq!(code(&out), 0, "a warn: {}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let l = &v["checks"][0];
    assert_eq!(l["id"], "landlock");
    assert_eq!(l["status"], "warn", "{v}");
    assert!(
        l["summary"].as_str().unwrap().contains("refused (EPERM)"),
        "{v}"
    );
    assert!(
        l["fix"]
            .as_str()
            .unwrap()
            .contains("landlock_create_ruleset"),
        "{v}"
    );
}

/// The live probes see real refusals (a seccomp filter around the doctor
/// answering EPERM to unshare and seccomp): userns, nftables and seccomp
/// fail with their fixes and exit 1 for the test user; as root the userns
/// check only warns (root needs no user namespace).
#[test]
fn the_doctor_live_probes_report_refused_namespaces_and_seccomp() {
    for who in identities() {
        let mut c = sbx_testutil::tool("sbx-seccomp");
        c.args([
            "--profile",
            "none",
            "--action",
            "errno",
            "--deny",
            "unshare",
            "--deny",
            "seccomp",
            "--",
        ])
        .arg(sbx_testutil::bin("sbx-doctor"))
        .args([
            "--json", "--check", "userns", "--check", "nftables", "--check", "seccomp",
        ]);
        run_as(&mut c, who);
        let out = c.output().unwrap();
        assert_eq!(code(&out), 1, "{who:?}: {}", stdout(&out));
        let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
        let get = |id: &str| {
            v["checks"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["id"] == id)
                .cloned()
                .unwrap()
        };
        let u = get("userns");
        assert_eq!(
            u["status"],
            if who == As::Root { "warn" } else { "fail" },
            "{u}"
        );
        assert!(
            u["summary"]
                .as_str()
                .unwrap()
                .contains("Operation not permitted"),
            "{u}"
        );
        for id in ["nftables", "seccomp"] {
            let c = get(id);
            assert_eq!(c["status"], "fail", "{who:?}: {c}");
            assert!(c["fix"].is_string(), "{c}");
        }
        assert!(
            get("seccomp")["summary"]
                .as_str()
                .unwrap()
                .contains("user notification")
        );
    }
}
