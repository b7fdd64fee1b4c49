//! A realistic workload runs under the default profile, as root and as the
//! unprivileged user: gcc builds and runs a threaded C program, git init +
//! commit, python3 with threads and a subprocess, curl to an HTTP server on
//! loopback that the test starts, a shell pipeline with fork/exec.

mod common;
use common::*;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `python3 -m http.server` on 127.0.0.1, a free port; returns the port.
fn http_server(dir: &std::path::Path) -> (Server, u16) {
    let mut child = Command::new("/usr/bin/python3")
        .args([
            "-u",
            "-m",
            "http.server",
            "0",
            "--bind",
            "127.0.0.1",
            "--directory",
        ])
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 http.server");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    // "Serving HTTP on 127.0.0.1 port 43567 (http://127.0.0.1:43567/) ..."
    let port = line
        .split_whitespace()
        .skip_while(|w| *w != "port")
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"));
    (Server(child), port)
}

const SCRIPT: &str = r#"set -eu
cd "$WORK"
export HOME="$WORK" GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@example.invalid GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@example.invalid
cat > hello.c <<'END'
#include <pthread.h>
#include <stdio.h>
static void *run(void *a) { return a; }
int main(void) {
    pthread_t t[4]; long s = 0;
    for (long i = 0; i < 4; i++) pthread_create(&t[i], 0, run, (void *)i);
    for (int i = 0; i < 4; i++) { void *r; pthread_join(t[i], &r); s += (long)r; }
    printf("threads %ld\n", s);
    return 0;
}
END
gcc -O1 -pthread -o hello hello.c
./hello
git init -q repo
cd repo
echo hello > f
git add f
git commit -qm init
echo "commits $(git rev-list --count HEAD)"
git fsck --strict 2>/dev/null && echo fsck ok
cd ..
python3 -c 'import threading, subprocess, hashlib
r = []
ts = [threading.Thread(target=lambda: r.append(hashlib.sha256(b"x").hexdigest())) for _ in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
print("python", len(r), subprocess.run(["echo", "sub"], capture_output=True, text=True).stdout.strip())'
curl -sS --max-time 10 "http://127.0.0.1:$PORT/served.txt"
echo "pipeline $(seq 1 1000 | sort -rn | head -3 | tr '\n' ' ')"
"#;

#[test]
fn realistic_workload_under_the_default_profile() {
    for prog in ["gcc", "git", "curl", "python3"] {
        if !sbx_testutil::have(prog) {
            sbx_testutil::skip!("{prog} missing (scripts/setup installs it)");
        }
    }
    let lab = Lab::new();
    let www = lab.path().join("www");
    std::fs::create_dir(&www).unwrap();
    std::fs::write(www.join("served.txt"), "served over loopback\n").unwrap();
    let (_server, port) = http_server(&www);
    for who in identities() {
        let work = lab.path().join(format!("work-{who:?}"));
        std::fs::create_dir(&work).unwrap();
        if who == As::User {
            sbx_testutil::chown_to_test_user(&work);
        }
        // With an audit log: the denials go through the notifier.
        let log = lab.path().join(sbx_testutil::unique("audit-"));
        let mut c = sbx_testutil::tool("sbx-seccomp");
        c.arg("--audit-log")
            .arg(&log)
            .args(["--", "sh", "-c", SCRIPT])
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("WORK", &work)
            .env("PORT", port.to_string());
        run_as(&mut c, who);
        let out = sbx_testutil::output(&mut c);
        let s = stdout(&out);
        assert_eq!(
            code(&out),
            0,
            "{who:?}: stdout {s}\nstderr {}",
            stderr(&out)
        );
        for want in [
            "threads 6",
            "commits 1",
            "fsck ok",
            "python 4 sub",
            "served over loopback",
            "pipeline 1000 999 998",
        ] {
            assert!(s.contains(want), "{who:?}: {want:?} missing in {s}");
        }
    }
}

/// A small Rust project builds and runs under the default profile (cargo,
/// rustc with its threads and jobserver, the linker). As the identity that
/// owns the toolchain running these tests (root here; the unprivileged user
/// cannot read it).
#[test]
fn rust_project_builds_under_the_default_profile() {
    let cargo = env!("CARGO");
    let lab = Lab::new();
    let work = lab.path().join("rust");
    std::fs::create_dir(&work).unwrap();
    let script = format!(
        "set -eu; cd '{w}'; '{cargo}' new -q --vcs none hello; cd hello; \
         CARGO_TARGET_DIR='{w}/target' '{cargo}' build -q --offline; '{w}/target/debug/hello'",
        w = work.display()
    );
    let mut c = sbx_testutil::tool("sbx-seccomp");
    c.args(["--", "sh", "-c", &script]);
    let out = sbx_testutil::output(&mut c);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "Hello, world!\n");
}
