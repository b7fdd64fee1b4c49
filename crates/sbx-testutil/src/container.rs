//! sbx-container's test fixture: a real rootful Podman engine, started per
//! test as `podman system service --time=0 unix://<private socket>` with a
//! containers.conf the test owns (runtime runc, the ulimits this machine
//! allows, a netavark network config dir of its own) and a storage root
//! shared by the test run under the temp dir (so the sandbox image is
//! built once), stopped when the fixture is dropped.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The root shared by this machine's sbx-container test runs.
pub fn shared_root() -> PathBuf {
    let p = std::env::temp_dir().join("sbx-container-tests");
    std::fs::create_dir_all(&p).unwrap();
    p
}

pub struct Podman {
    child: Child,
    pub dir: tempfile::TempDir,
    pub sock: PathBuf,
    pub url: String,
}

const CONF: &str = r#"[containers]
default_ulimits = ["nofile=20000:20000","nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
[network]
network_backend = "netavark"
network_config_dir = "NETDIR"
"#;

fn flock(path: &Path) -> std::fs::File {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: flock on the open file f keeps alive.
    assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
    f
}

impl Podman {
    /// Starts a private engine; None when podman is not installed or we are
    /// not root (rootful engine).
    pub fn start() -> Option<Podman> {
        if !crate::is_root() || !crate::have("podman") {
            return None;
        }
        let root = shared_root();
        let dir = tempfile::Builder::new()
            .prefix("sbx-podman-")
            .tempdir()
            .unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let netdir = root.join("net");
        std::fs::create_dir_all(&netdir).unwrap();
        let conf = dir.path().join("containers.conf");
        std::fs::write(&conf, CONF.replace("NETDIR", netdir.to_str().unwrap())).unwrap();
        let storage = dir.path().join("storage.conf");
        std::fs::write(
            &storage,
            format!(
                "[storage]\ndriver = \"overlay\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
                root.join("graph").display(),
                root.join("run").display()
            ),
        )
        .unwrap();
        let sock = dir.path().join("engine.sock");
        let url = format!("unix://{}", sock.display());
        let log = std::fs::File::create(dir.path().join("service.log")).unwrap();
        let mut cmd = Command::new("podman");
        cmd.args(["system", "service", "--time=0", &url])
            .env("CONTAINERS_CONF", &conf)
            .env("CONTAINERS_STORAGE_CONF", &storage)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        // SAFETY: the pre_exec closure only calls prctl with integers (async-signal-safe).
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let child = cmd.spawn().ok()?;
        let p = Podman {
            child,
            dir,
            sock,
            url,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if p.sock.exists() && p.get("/_ping").0 == 200 {
                return Some(p);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "podman service did not come up: {}",
            std::fs::read_to_string(p.dir.path().join("service.log")).unwrap_or_default()
        );
    }

    /// Lets the unprivileged test user reach the socket (as a member of a
    /// docker group would).
    pub fn share_with_test_user(&self) {
        crate::chown_to_test_user(&self.sock);
    }

    /// An HTTP request over the socket (curl): (status, body).
    pub fn request(&self, method: &str, path: &str) -> (u16, String) {
        let out = Command::new("curl")
            .args(["-s", "-X", method, "-w", "\n%{http_code}", "--unix-socket"])
            .arg(&self.sock)
            .arg(format!("http://d/v1.41{path}"))
            .output()
            .expect("curl");
        let s = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = s.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), body.to_string())
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        self.request("GET", path)
    }

    pub fn json(&self, path: &str) -> Value {
        let (c, b) = self.get(path);
        assert_eq!(c, 200, "GET {path}: {b}");
        serde_json::from_str(&b).unwrap()
    }

    /// Containers (all states) labelled with this SBX_ID.
    pub fn containers_of(&self, sbx_id: &str) -> Vec<Value> {
        let f = format!("{{\"label\":[\"io.sbx.id={sbx_id}\"]}}");
        let v = self.json(&format!("/containers/json?all=true&filters={}", urlenc(&f)));
        v.as_array().cloned().unwrap_or_default()
    }

    pub fn networks_of(&self, sbx_id: &str) -> Vec<Value> {
        let f = format!("{{\"label\":[\"io.sbx.id={sbx_id}\"]}}");
        let v = self.json(&format!("/networks?filters={}", urlenc(&f)));
        v.as_array().cloned().unwrap_or_default()
    }

    /// Anonymous and named volumes labelled with this SBX_ID or none at all
    /// that appeared: the count of all volumes.
    pub fn volume_count(&self) -> usize {
        let v = self.json("/volumes");
        v["Volumes"].as_array().map(|a| a.len()).unwrap_or(0)
    }

    /// Builds (once per content) the sandbox image and returns its tag.
    pub fn image(&self) -> String {
        let tools = static_tools();
        let _l = flock(&shared_root().join("image.lock"));
        let out = crate::tool("sbx-container")
            .args(["build", "--engine", &self.url, "--tools"])
            .arg(&tools)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "image build failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        // SAFETY: kill with integer arguments; the child is ours and not yet reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn urlenc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The workspace root (crates/sbx-testutil/../..).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// A directory with the static sbx tools for the image: SBX_STATIC_TOOLS,
/// else built here (release, crt-static, target/static; incremental).
pub fn static_tools() -> PathBuf {
    if let Some(d) = std::env::var_os("SBX_STATIC_TOOLS") {
        return PathBuf::from(d);
    }
    let ws = workspace();
    let _l = flock(&shared_root().join("static.lock"));
    // Once per test run: every test process of one run has the same parent
    // (the test runner); its pid and start time name the run.
    // SAFETY: getppid cannot fail.
    let ppid = unsafe { libc::getppid() };
    let start = std::fs::read_to_string(format!("/proc/{ppid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()
                .map(|r| r.split_whitespace().nth(19).unwrap_or("0").to_string())
        })
        .unwrap_or_default();
    let out = shared_root().join("tools");
    let stamp = out.join(format!(".run-{ppid}-{start}"));
    if stamp.exists() {
        return out;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = Command::new(cargo)
        .current_dir(&ws)
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .args([
            "build",
            "--release",
            "--locked",
            "--target",
            "x86_64-unknown-linux-gnu",
            "--target-dir",
            "target/static",
            "-p",
            "sbx-seccomp",
            "-p",
            "sbx-fs",
        ])
        .stdout(Stdio::null())
        .status()
        .expect("cargo");
    assert!(st.success(), "static build of the sbx tools failed");
    let rel = ws.join("target/static/x86_64-unknown-linux-gnu/release");
    // Only the executables (not the .d files or libraries).
    std::fs::create_dir_all(&out).unwrap();
    for e in std::fs::read_dir(&out).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with(".run-") {
            let _ = std::fs::remove_file(e.path());
        }
    }
    for n in ["sbx-seccomp", "sbx-fs"] {
        let dst = out.join(n);
        let tmp = out.join(format!(".{n}.tmp"));
        std::fs::copy(rel.join(n), &tmp).unwrap();
        std::fs::rename(&tmp, &dst).unwrap();
    }
    std::fs::write(&stamp, "").unwrap();
    out
}
