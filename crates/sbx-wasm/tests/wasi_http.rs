//! sbx-wasm's wasi:http egress end to end: a real WASI preview-2 component
//! (tests/data/http_get.c, compiled here with clang for wasm32 without
//! libc and wrapped into a component with the wit-component crate over the
//! WIT files of wasmtime-wasi-http) makes real requests to HTTP servers on
//! 127.0.0.1, run by the built binary as root and as the unprivileged test
//! user. Every refusal is asserted in the guest (the wasi:http error
//! HTTP-request-denied, case 15), on the server (no connection) and in the
//! audit log (`net_denied`). The promise numbers (W12...) are those of
//! docs/wasm.md.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use sbx_testutil::{As, assert_event, audit_events, code, identities, run_as, stderr, stdout};

const LIMIT: Duration = Duration::from_secs(120);

/// HTTP-request-denied in wasi:http's error-code.
const DENIED: &str = "error 15 (response)";

/// The component, built once per test process (None: no clang).
fn component() -> Option<&'static [u8]> {
    static C: OnceLock<Option<Vec<u8>>> = OnceLock::new();
    C.get_or_init(|| {
        if !sbx_testutil::have("clang") {
            return None;
        }
        let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
        let dir = tempfile::tempdir().unwrap();
        let core = dir.path().join("http_get.core.wasm");
        let out = Command::new("clang")
            .args([
                "--target=wasm32",
                "-nostdlib",
                "-O2",
                "-Wl,--no-entry",
                "-o",
            ])
            .arg(&core)
            .arg(data.join("http_get.c"))
            .output()
            .expect("clang");
        assert!(out.status.success(), "clang: {}", stderr(&out));
        let mut module = std::fs::read(&core).unwrap();
        let mut resolve = wit_parser::Resolve::default();
        let (pkg, _) = resolve.push_dir(data.join("wit")).expect("tests/data/wit");
        let world = resolve
            .select_world(&[pkg], Some("http-get"))
            .expect("world");
        wit_component::embed_component_metadata(
            &mut module,
            &resolve,
            world,
            wit_component::StringEncoding::UTF8,
        )
        .expect("component metadata");
        let c = wit_component::ComponentEncoder::default()
            .module(&module)
            .expect("core module")
            .validate(true)
            .encode()
            .expect("component");
        Some(c)
    })
    .as_deref()
}

/// A test HTTP server on 127.0.0.1: answers every request with
/// "hello from PORT" and records the request lines it got.
struct Server {
    port: u16,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Server {
    fn start() -> Server {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { continue };
                let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
                let mut r = BufReader::new(c.try_clone().unwrap());
                let mut first = String::new();
                let _ = r.read_line(&mut first);
                let mut line = String::new();
                while r.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                s.lock().unwrap().push(first.trim().to_string());
                let body = format!("hello from {port}\n");
                let _ = write!(
                    c,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Server { port, seen }
    }

    fn hits(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

/// A registry shared by the tests of this run (as tests/wasm.rs does): a
/// sticky world-writable directory holding each user's private registry.
fn shared_registry() -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let d = std::env::temp_dir().join("sbx-wasm-test-registry");
    let _ = std::fs::create_dir(&d);
    if sbx_testutil::is_root() {
        let m = std::fs::symlink_metadata(&d).unwrap();
        if m.permissions().mode() & 0o7777 != 0o1777 {
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
        }
    }
    d
}

struct Scratch {
    dir: tempfile::TempDir,
    who: As,
}

impl Scratch {
    fn new(who: As) -> Option<Scratch> {
        let c = component()?;
        let s = Scratch {
            dir: sbx_testutil::shared_tempdir(),
            who,
        };
        std::fs::write(s.path("http_get.wasm"), c).unwrap();
        std::fs::create_dir(s.path("proj")).unwrap();
        s.chown_all();
        Some(s)
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn log(&self) -> PathBuf {
        self.path("audit.jsonl")
    }

    fn chown_all(&self) {
        if self.who != As::User {
            return;
        }
        let out = Command::new("chown")
            .arg("-R")
            .arg(format!("{0}:{0}", sbx_testutil::TEST_USER))
            .arg(self.dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "chown: {}", stderr(&out));
    }

    /// `sbx-wasm FLAGS -- http_get.wasm SCHEME AUTHORITY PATH`.
    fn get(&self, flags: &[&str], scheme: &str, authority: &str) -> Output {
        let mut c = sbx_testutil::tool("sbx-wasm");
        c.arg("--audit-log")
            .arg(self.log())
            .env("SBX_REGISTRY_DIR", shared_registry())
            .args(flags)
            .arg("--")
            .arg(self.path("http_get.wasm"))
            .args([scheme, authority, "/index.txt"]);
        run_as(&mut c, self.who);
        sbx_testutil::output_within(&mut c, LIMIT)
    }
}

macro_rules! scratch {
    ($who:expr) => {
        match Scratch::new($who) {
            Some(s) => s,
            None => sbx_testutil::skip!(
                "clang (wasm32) is needed to build the test component (run scripts/setup)"
            ),
        }
    };
}

fn fuse_usable(who: As) -> bool {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata("/dev/fuse") {
        Ok(m) => who == As::Root || m.permissions().mode() & 0o006 == 0o006,
        Err(_) => false,
    }
}

#[track_caller]
fn fetched(out: &Output, port: u16) {
    assert_eq!(
        code(out),
        0,
        "stdout: {}\nstderr: {}",
        stdout(out),
        stderr(out)
    );
    assert_eq!(stdout(out), format!("status 200\nhello from {port}\n"));
}

#[track_caller]
fn denied(out: &Output, log: &Path, dst: &str, port: u16, reason: &str) {
    assert_eq!(
        code(out),
        1,
        "should have been refused; stdout: {}\nstderr: {}",
        stdout(out),
        stderr(out)
    );
    assert!(stdout(out).contains(DENIED), "{}", stdout(out));
    assert_event(log, "net_denied", "alert", |e| {
        e["dst"] == dst && e["port"] == port && e["proto"] == "wasi-http" && e["reason"] == reason
    });
}

/// W12: an allowed name and port is fetched (the body arrives, the
/// server saw the request, `net_allowed`); another port of that name,
/// another name, an IP literal of the same host are refused in the guest
/// (HTTP-request-denied) with `net_denied` and never reach a server; an
/// address entry allows the literal.
#[test]
fn allowlisted_requests_only() {
    for who in identities() {
        let s = scratch!(who);
        let (a, b) = (Server::start(), Server::start());
        let allow = format!("localhost:{}", a.port);
        let flags = ["--allow", allow.as_str()];

        fetched(
            &s.get(&flags, "http", &format!("localhost:{}", a.port)),
            a.port,
        );
        assert_eq!(a.hits(), ["GET /index.txt HTTP/1.1"]);
        assert_event(&s.log(), "net_allowed", "info", |e| {
            e["dst"] == "localhost" && e["port"] == a.port && e["scheme"] == "http"
        });
        assert_event(&s.log(), "wasm_start", "info", |e| e["kind"] == "component");

        let out = s.get(&flags, "http", &format!("localhost:{}", b.port));
        denied(
            &out,
            &s.log(),
            "localhost",
            b.port,
            "port not allowed for this name",
        );
        // https to the same name: port 443, not listed either.
        let out = s.get(&flags, "https", "localhost");
        denied(
            &out,
            &s.log(),
            "localhost",
            443,
            "port not allowed for this name",
        );
        // Another name (never resolved: refused before any lookup).
        let other = format!("sbx-not-allowed.example:{}", a.port);
        let out = s.get(&flags, "http", &other);
        denied(
            &out,
            &s.log(),
            "sbx-not-allowed.example",
            a.port,
            "name not allowlisted",
        );
        // The allowed host's address, written as a literal.
        let lit = format!("127.0.0.1:{}", a.port);
        let out = s.get(&flags, "http", &lit);
        let why = "address not allowlisted (an IP literal needs an address entry)";
        denied(&out, &s.log(), "127.0.0.1", a.port, why);
        let out = s.get(&flags, "http", &format!("[::ffff:127.0.0.1]:{}", a.port));
        denied(&out, &s.log(), "[::ffff:127.0.0.1]", a.port, why);
        // User information in the authority.
        let out = s.get(&flags, "http", &format!("x@localhost:{}", a.port));
        assert_eq!(code(&out), 1, "{}", stdout(&out));
        assert_eq!(a.hits().len(), 1, "a refused request reached the server");
        assert!(b.hits().is_empty(), "a refused request reached the server");

        // An address entry allows the literal (and only on its port).
        let out = s.get(&["--allow", &lit], "http", &lit);
        fetched(&out, a.port);
        let out = s.get(&["--allow", &lit], "http", &format!("127.0.0.1:{}", b.port));
        denied(
            &out,
            &s.log(),
            "127.0.0.1",
            b.port,
            "port not allowed for this address",
        );
        assert!(b.hits().is_empty());
    }
}

/// W13: without an allowlist a component reaches nothing (every request
/// refused, `net_denied`), and the same holds inside sbx-fs (with a
/// grant, where --allow travels to the inner run and works there).
#[test]
fn no_allowlist_no_network() {
    for who in identities() {
        let s = scratch!(who);
        let a = Server::start();
        let target = format!("localhost:{}", a.port);
        let out = s.get(&[], "http", &target);
        denied(
            &out,
            &s.log(),
            "localhost",
            a.port,
            "no network: no --allow entry",
        );
        let lit = format!("127.0.0.1:{}", a.port);
        let out = s.get(&[], "http", &lit);
        denied(
            &out,
            &s.log(),
            "127.0.0.1",
            a.port,
            "no network: no --allow entry",
        );
        assert!(a.hits().is_empty());

        if fuse_usable(who) {
            let proj = s.path("proj");
            let ro = format!("{}:/proj", proj.display());
            let out = s.get(&["--ro", &ro], "http", &target);
            denied(
                &out,
                &s.log(),
                "localhost",
                a.port,
                "no network: no --allow entry",
            );
            let allow = format!("localhost:{}", a.port);
            let out = s.get(&["--ro", &ro, "--allow", &allow], "http", &target);
            fetched(&out, a.port);
            assert_event(&s.log(), "start", "info", |_| true);
        }
    }
}

/// W14: the limits hold for a component: --fuel ends it (124,
/// `wasm_fuel_exhausted`), a wait on a server that never answers ends at
/// --timeout (124, `wasm_timeout`), --max-memories below its one memory
/// refuses it (134, `wasm_instantiate_refused`).
#[test]
fn limits_apply_to_components() {
    for who in identities() {
        let s = scratch!(who);
        let a = Server::start();
        let allow = format!("localhost:{}", a.port);
        let target = format!("localhost:{}", a.port);
        let out = s.get(&["--allow", &allow, "--fuel", "50"], "http", &target);
        assert_eq!(code(&out), 124, "{}", stderr(&out));
        assert_event(&s.log(), "wasm_fuel_exhausted", "alert", |_| true);

        // A server that accepts and never answers.
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = silent.local_addr().unwrap().port();
        let allow = format!("localhost:{port}");
        let out = s.get(
            &["--allow", &allow, "--timeout", "2s"],
            "http",
            &format!("localhost:{port}"),
        );
        assert_eq!(code(&out), 124, "{}\n{}", stdout(&out), stderr(&out));
        assert_event(&s.log(), "wasm_timeout", "alert", |_| true);
        drop(silent);

        let out = s.get(&["--max-memories", "0"], "http", &target);
        assert_eq!(code(&out), 134, "{}", stderr(&out));
        assert_event(&s.log(), "wasm_instantiate_refused", "alert", |_| true);
    }
}

/// W15: `sbx-policy chain --trust plugin` gives sbx-wasm the policy's
/// domain allowlist: with a WebFetch(domain:localhost) rule a request to
/// localhost on a port the rule does not cover is refused as "port not
/// allowed for this name" (the name is listed); without the rule, as no
/// network.
#[test]
fn policy_chain_passes_the_domain_allowlist() {
    for who in identities() {
        let s = scratch!(who);
        if !fuse_usable(who) {
            sbx_testutil::skip!("/dev/fuse is not usable as {who:?} (run scripts/setup)");
        }
        let a = Server::start();
        let p = s.path("proj");
        std::fs::create_dir_all(p.join(".claude")).unwrap();
        std::fs::create_dir_all(s.path("home")).unwrap();
        s.chown_all();
        let target = format!("localhost:{}", a.port);
        let chain = || {
            let mut c = sbx_testutil::tool("sbx-policy");
            c.arg("chain")
                .arg("--cwd")
                .arg(&p)
                .arg("--home")
                .arg(s.path("home"))
                .arg("--managed")
                .arg(p.join("no-managed.json"))
                .args(["--trust", "plugin", "--audit-log"])
                .arg(s.log())
                .env("SBX_REGISTRY_DIR", shared_registry())
                .current_dir(&p)
                .arg("--")
                .arg(s.path("http_get.wasm"))
                .args(["http", &target, "/"]);
            run_as(&mut c, who);
            sbx_testutil::output_within(&mut c, LIMIT)
        };
        let out = chain();
        denied(
            &out,
            &s.log(),
            "localhost",
            a.port,
            "no network: no --allow entry",
        );
        std::fs::write(
            p.join(".claude/settings.json"),
            r#"{"permissions":{"allow":["WebFetch(domain:localhost)"]}}"#,
        )
        .unwrap();
        s.chown_all();
        let out = chain();
        denied(
            &out,
            &s.log(),
            "localhost",
            a.port,
            "port not allowed for this name",
        );
        assert!(a.hits().is_empty());
        let n = audit_events(&s.log())
            .iter()
            .filter(|e| e["event"] == "wasm_start" && e["allow"][0] == "localhost:80,443")
            .count();
        assert_eq!(n, 1, "the chain's sbx-wasm got the policy's domain");
    }
}
