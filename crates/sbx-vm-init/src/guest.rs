//! PID 1 of the guest.
//!
//! 1. mounts /dev, /proc, /sys of the initramfs; loads the virtio modules;
//! 2. opens the control channel (virtio-serial port `sbx.0`, or vsock to the
//!    host), reads the secrets (fw_cfg `opt/sbx/secrets`, then unloads the
//!    fw_cfg driver; or MMDS v2 under Firecracker) into memory only;
//! 3. says Ready, receives the spec;
//! 4. mounts the squashfs (/dev/vda) read-only as the lower layer and a
//!    size-limited tmpfs as the upper layer of an overlay, and moves into it;
//! 5. extracts the copy-in archive into /work; runs the command with the
//!    secrets in its environment only; relays stdin/stdout/stderr and
//!    signals; kills what is left when it exits;
//! 6. sends /work back (copy-out), the guest audit log, the exit status;
//!    powers off.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::proto::{self, Decoder, ExitReport, Ready, Spec, kind};
use crate::sys;

const TOOL: &str = "sbx-vm-init";
const AUDIT_DIR: &str = "/run/sbx";
const AUDIT_FILE: &str = "/run/sbx/audit.log";
const FW_CFG_SECRETS: &str = "/sys/firmware/qemu_fw_cfg/by_name/opt/sbx/secrets/raw";

/// The control channel to the host.
struct Chan {
    f: File,
    dec: Decoder,
}

impl Chan {
    fn send(&mut self, k: u8, payload: &[u8]) -> io::Result<()> {
        self.f.write_all(&proto::encode(k, payload))
    }

    /// Blocks until one frame arrives.
    fn recv(&mut self) -> io::Result<(u8, Vec<u8>)> {
        let mut buf = vec![0u8; 65536];
        loop {
            if let Some(fr) = self.dec.next_frame().map_err(io::Error::other)? {
                return Ok(fr);
            }
            let n = self.f.read(&mut buf)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "host closed the channel",
                ));
            }
            self.dec.push(&buf[..n]);
        }
    }
}

/// The guest's own audit events (sent to the host at the end).
struct Audit {
    sbx_id: String,
    lines: Vec<String>,
}

impl Audit {
    fn emit(&mut self, event: &str, severity: &str, fields: Value) {
        let mut m = serde_json::Map::new();
        m.insert("ts".into(), Value::String(timestamp()));
        m.insert("sbx_id".into(), Value::String(self.sbx_id.clone()));
        m.insert("tool".into(), Value::String(TOOL.into()));
        m.insert("pid".into(), Value::from(std::process::id()));
        m.insert("event".into(), Value::String(event.into()));
        m.insert("severity".into(), Value::String(severity.into()));
        m.insert("guest".into(), Value::Bool(true));
        if let Value::Object(extra) = fields {
            for (k, v) in extra {
                m.entry(k).or_insert(v);
            }
        }
        self.lines.push(Value::Object(m).to_string());
    }
}

fn timestamp() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs() as i64;
    let days = secs.div_euclid(86400);
    let rem = secs.rem_euclid(86400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        now.subsec_millis()
    )
}

/// Kernel command line settings this init reads (`sbx.chan=`, `sbx.debug`).
struct Boot {
    vsock: bool,
    mmds: bool,
    fw_cfg: bool,
    net: bool,
    debug: bool,
}

fn boot_settings() -> Boot {
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let mut b = Boot {
        vsock: false,
        mmds: false,
        fw_cfg: false,
        net: false,
        debug: false,
    };
    for w in cmdline.split_whitespace() {
        match w {
            "sbx.chan=vsock" => b.vsock = true,
            "sbx.debug" => b.debug = true,
            "sbx.mmds" => b.mmds = true,
            "sbx.fwcfg" => b.fw_cfg = true,
            "sbx.net=slirp" => b.net = true,
            _ => {}
        }
    }
    b
}

fn console(msg: &str) {
    let _ = writeln!(io::stderr(), "sbx-vm-init: {msg}");
}

pub fn main() -> ! {
    if std::process::id() != 1 {
        eprintln!("sbx-vm-init: this is the init of an sbx-vm guest; it only runs as PID 1");
        std::process::exit(125);
    }
    let mut chan = None;
    if let Err(e) = run(&mut chan) {
        console(&format!("{e}"));
        if let Some(c) = chan.as_mut() {
            let _ = c.send(kind::FAIL, e.to_string().as_bytes());
        }
    }
    sys::power_off()
}

fn early_mounts() -> io::Result<()> {
    sys::mount(
        "devtmpfs",
        "/dev",
        "devtmpfs",
        libc::MS_NOSUID,
        Some("mode=0755"),
    )?;
    sys::mount(
        "proc",
        "/proc",
        "proc",
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    )?;
    sys::mount(
        "sysfs",
        "/sys",
        "sysfs",
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    )?;
    if let Ok(c) = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/console")
    {
        for fd in 0..3 {
            // SAFETY: c keeps the console open for the call; dup2 onto 0-2 replaces them, as
            // intended.
            unsafe { libc::dup2(c.as_raw_fd(), fd) };
        }
    }
    Ok(())
}

fn load_modules(boot: &Boot) {
    let debug = boot.debug;
    for m in crate::modules_with_net(boot.vsock, boot.mmds, boot.fw_cfg, boot.net) {
        let p = Path::new("/lib/modules").join(format!("{m}.ko"));
        if !p.exists() {
            continue;
        }
        if let Err(e) = sys::load_module(&p)
            && debug
        {
            console(&format!("module {m}: {e}"));
        }
    }
}

/// Waits (bounded) for `cond`, polling.
fn wait_for<T>(what: &str, limit: Duration, mut cond: impl FnMut() -> Option<T>) -> io::Result<T> {
    let start = std::time::Instant::now();
    loop {
        if let Some(v) = cond() {
            return Ok(v);
        }
        if start.elapsed() > limit {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{what} did not appear"),
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn open_serial_port() -> io::Result<File> {
    let dev = wait_for("virtio-serial port sbx.0", Duration::from_secs(30), || {
        let rd = std::fs::read_dir("/sys/class/virtio-ports").ok()?;
        for e in rd.flatten() {
            let name = std::fs::read_to_string(e.path().join("name")).unwrap_or_default();
            if name.trim() == proto::PORT_NAME {
                let dev = Path::new("/dev").join(e.file_name());
                if dev.exists() {
                    return Some(dev);
                }
            }
        }
        None
    })?;
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(dev)
}

fn open_vsock() -> io::Result<File> {
    wait_for(
        "vsock connection to the host",
        Duration::from_secs(30),
        || {
            let s =
                // SAFETY: socket with integer arguments; the fd is owned or closed below.
                unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
            if s < 0 {
                return None;
            }
            // SAFETY: sockaddr_vm is plain integers: all-zero is a valid value.
            let mut a: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
            a.svm_family = libc::AF_VSOCK as libc::sa_family_t;
            a.svm_cid = libc::VMADDR_CID_HOST;
            a.svm_port = proto::VSOCK_PORT;
            // SAFETY: s is our open socket; a is a live sockaddr_vm of the size passed.
            let r = unsafe {
                libc::connect(
                    s,
                    std::ptr::from_ref::<libc::sockaddr_vm>(&a).cast(),
                    std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t,
                )
            };
            if r == 0 {
                // SAFETY: s was just made by socket (>= 0) and is owned by no one else.
                Some(unsafe { File::from_raw_fd(s) })
            } else {
                // SAFETY: s is ours and not used after.
                unsafe { libc::close(s) };
                None
            }
        },
    )
}

/// Secrets as (name, value), from fw_cfg (then the driver is unloaded, so no
/// file shows them any more) or from MMDS.
fn read_secrets(vsock: bool, mmds: bool) -> io::Result<(Vec<(String, String)>, &'static str)> {
    let doc: Option<Value> = if vsock {
        if !mmds {
            return Ok((Vec::new(), "none"));
        }
        let v = crate::mmds::fetch("eth0").map_err(|e| io::Error::other(format!("MMDS: {e}")))?;
        Some(v.get("secrets").cloned().unwrap_or(Value::Null))
    } else {
        let raw = std::fs::read(FW_CFG_SECRETS).ok();
        let _ = sys::unload_module("qemu_fw_cfg");
        match raw {
            Some(b) => Some(
                serde_json::from_slice(&b)
                    .map_err(|e| io::Error::other(format!("fw_cfg secrets: {e}")))?,
            ),
            None => None,
        }
    };
    let Some(doc) = doc else {
        return Ok((Vec::new(), "none"));
    };
    let mut out = Vec::new();
    // The sbx-creds document: {"env": {"NAME": "value", ...}, ...}.
    if let Some(env) = doc.get("env").and_then(Value::as_object) {
        for (k, v) in env {
            if let Some(s) = v.as_str() {
                out.push((k.clone(), s.to_string()));
            }
        }
    }
    Ok((out, if vsock { "mmds" } else { "fw_cfg" }))
}

fn mount_root(tmpfs_bytes: u64) -> io::Result<()> {
    wait_for("root disk /dev/vda", Duration::from_secs(30), || {
        Path::new("/dev/vda").exists().then_some(())
    })?;
    sys::mount(
        "/dev/vda",
        "/mnt/lower",
        "squashfs",
        libc::MS_RDONLY | libc::MS_NODEV,
        None,
    )?;
    sys::mount(
        "tmpfs",
        "/mnt/rw",
        "tmpfs",
        libc::MS_NODEV | libc::MS_NOSUID,
        Some(&format!("size={tmpfs_bytes},mode=0755")),
    )?;
    std::fs::create_dir_all("/mnt/rw/upper")?;
    std::fs::create_dir_all("/mnt/rw/work")?;
    sys::mount(
        "overlay",
        "/mnt/root",
        "overlay",
        libc::MS_NODEV,
        Some("lowerdir=/mnt/lower,upperdir=/mnt/rw/upper,workdir=/mnt/rw/work"),
    )?;
    for d in ["dev", "proc", "sys"] {
        sys::move_mount(&format!("/{d}"), &format!("/mnt/root/{d}"))?;
    }
    std::env::set_current_dir("/mnt/root")?;
    sys::move_mount(".", "/")?;
    sys::chroot_here()?;
    sys::mount(
        "tmpfs",
        "/run",
        "tmpfs",
        libc::MS_NODEV | libc::MS_NOSUID,
        Some("size=16m,mode=0755"),
    )?;
    std::fs::create_dir_all(AUDIT_DIR)?;
    std::fs::set_permissions(AUDIT_DIR, std::fs::Permissions::from_mode(0o700))?;
    let _ = sys::mount(
        "devpts",
        "/dev/pts",
        "devpts",
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some("mode=0620,ptmxmode=0666"),
    );
    let _ = sys::mount(
        "tmpfs",
        "/dev/shm",
        "tmpfs",
        libc::MS_NODEV | libc::MS_NOSUID,
        Some("mode=1777"),
    );
    Ok(())
}

/// QEMU user-mode networking (under sbx-net): the fixed slirp addresses.
fn setup_net() -> io::Result<()> {
    use std::net::Ipv4Addr;
    crate::mmds::configure_addr(
        "lo",
        Ipv4Addr::new(127, 0, 0, 1),
        Ipv4Addr::new(255, 0, 0, 0),
        true,
    )
    .map_err(|e| io::Error::other(format!("lo: {e}")))?;
    wait_for("eth0", Duration::from_secs(10), || {
        Path::new("/sys/class/net/eth0").exists().then_some(())
    })?;
    crate::mmds::configure_addr(
        "eth0",
        Ipv4Addr::new(10, 0, 2, 15),
        Ipv4Addr::new(255, 255, 255, 0),
        true,
    )
    .map_err(|e| io::Error::other(format!("eth0: {e}")))?;
    crate::mmds::default_route(Ipv4Addr::new(10, 0, 2, 2))
        .map_err(|e| io::Error::other(format!("default route: {e}")))?;
    std::fs::write("/etc/resolv.conf", "nameserver 10.0.2.3\n")
}

/// Feeds COPY_IN frames to `tar -x` in /work.
fn copy_in(chan: &mut Chan) -> io::Result<()> {
    std::fs::create_dir_all("/work")?;
    let mut tar = Command::new("/bin/busybox")
        .args(["tar", "-x", "-f", "-", "-C", "/work"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()?;
    let mut stdin = tar.stdin.take();
    loop {
        let (k, data) = chan.recv()?;
        match k {
            kind::COPY_IN => {
                if let Some(s) = stdin.as_mut() {
                    s.write_all(&data)?;
                }
            }
            kind::COPY_IN_END => break,
            _ => {
                return Err(io::Error::other(format!(
                    "unexpected frame {:?} during copy-in",
                    k as char
                )));
            }
        }
    }
    drop(stdin);
    let st = tar.wait()?;
    if !st.success() {
        return Err(io::Error::other(format!("copy-in: tar -x failed ({st})")));
    }
    Ok(())
}

fn copy_out(chan: &mut Chan) -> io::Result<()> {
    let _ = std::fs::create_dir_all("/work");
    let mut tar = Command::new("/bin/busybox")
        .args(["tar", "-c", "-f", "-", "-C", "/work", "."])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut out = tar.stdout.take().expect("piped");
    let mut buf = vec![0u8; proto::CHUNK];
    loop {
        let n = out.read(&mut buf)?;
        if n == 0 {
            break;
        }
        chan.send(kind::COPY_OUT, &buf[..n])?;
    }
    let _ = tar.wait();
    chan.send(kind::COPY_OUT_END, b"")
}

fn run(chan_slot: &mut Option<Chan>) -> io::Result<()> {
    early_mounts()?;
    let boot = boot_settings();
    load_modules(&boot);
    let f = if boot.vsock {
        open_vsock()?
    } else {
        open_serial_port()?
    };
    *chan_slot = Some(Chan {
        f,
        dec: Decoder::default(),
    });
    let chan = chan_slot.as_mut().expect("set");

    let (secrets, source) = read_secrets(boot.vsock, boot.mmds)?;
    let ready = Ready {
        uptime_ms: sys::uptime_ms(),
        secrets: secrets.iter().map(|(k, _)| k.clone()).collect(),
        secrets_source: source.to_string(),
    };
    chan.send(
        kind::READY,
        &serde_json::to_vec(&ready).map_err(io::Error::other)?,
    )?;
    let spec: Spec = loop {
        let (k, data) = chan.recv()?;
        if k == kind::START {
            break serde_json::from_slice(&data)
                .map_err(|e| io::Error::other(format!("bad spec: {e}")))?;
        }
    };
    sys::set_clock_ms(spec.now_unix_ms);
    let mut audit = Audit {
        sbx_id: spec.sbx_id.clone(),
        lines: Vec::new(),
    };
    audit.emit(
        "guest_booted",
        "info",
        json!({"uptime_ms": ready.uptime_ms}),
    );
    mount_root(spec.tmpfs_bytes)?;
    if boot.net {
        setup_net()?;
        audit.emit(
            "guest_net_configured",
            "info",
            json!({"dev": "eth0", "addr": "10.0.2.15/24", "gateway": "10.0.2.2", "dns": "10.0.2.3"}),
        );
    }
    audit.emit(
        "guest_root_mounted",
        "info",
        json!({"lower": "squashfs /dev/vda (read-only)", "upper": "tmpfs", "upper_bytes": spec.tmpfs_bytes}),
    );
    if !secrets.is_empty() {
        audit.emit(
            "guest_secrets_loaded",
            "info",
            json!({"source": source, "names": ready.secrets, "delivered_to": "command environment only"}),
        );
    }
    if spec.copy_in {
        copy_in(chan)?;
        audit.emit("guest_copy_in", "info", json!({"dir": "/work"}));
    }
    let report = run_command(chan, &spec, &secrets, &mut audit)?;
    audit.emit(
        "guest_command_exited",
        if report.signal.is_some() {
            "warn"
        } else {
            "info"
        },
        json!({"code": report.code, "signal": report.signal, "error": report.error}),
    );
    if spec.copy_out {
        copy_out(chan)?;
    }
    // The guest audit log: init's events, then what sbx tools in the guest
    // appended to /run/sbx/audit.log.
    let mut log = String::new();
    for l in &audit.lines {
        log.push_str(l);
        log.push('\n');
    }
    if let Ok(tools) = std::fs::read_to_string(AUDIT_FILE) {
        log.push_str(&tools);
    }
    send_lines(chan, &log)?;
    chan.send(
        kind::EXIT,
        &serde_json::to_vec(&report).map_err(io::Error::other)?,
    )?;
    Ok(())
}

/// Sends whole lines in AUDIT frames.
fn send_lines(chan: &mut Chan, text: &str) -> io::Result<()> {
    let mut cur = String::new();
    for line in text.lines() {
        if cur.len() + line.len() + 1 > proto::CHUNK && !cur.is_empty() {
            chan.send(kind::AUDIT, cur.as_bytes())?;
            cur.clear();
        }
        cur.push_str(line);
        cur.push('\n');
    }
    if !cur.is_empty() {
        chan.send(kind::AUDIT, cur.as_bytes())?;
    }
    Ok(())
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds is a live array of two ints for the kernel to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 just returned both fds, owned by no one else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Whether `p` (as the command names it, resolved with the guest's PATH)
/// is one of the sbx tool binaries of the read-only root (/usr/bin, or
/// beside this init): by file identity, never by name (a `/work/sbx-x` copied
/// in gets nothing). Nothing untrusted runs in the guest yet when this is
/// asked, so the path cannot change before the spawn.
fn is_sbx_tool(p: &str, path_var: Option<&str>) -> bool {
    use std::os::unix::fs::MetadataExt;
    const TOOLS: &[&str] = &[
        "sbx-cgroup",
        "sbx-fs",
        "sbx-seccomp",
        "sbx-net",
        "sbx-gitguard",
        "sbx-creds",
        "sbx-policy",
        "sbx-path",
        "sbx-audit",
    ];
    let resolved = if p.contains('/') {
        Some(std::path::PathBuf::from(p))
    } else {
        path_var
            .unwrap_or("/usr/local/bin:/usr/bin:/bin")
            .split(':')
            .map(|d| Path::new(d).join(p))
            .find(|c| c.is_file())
    };
    let Some(id) = resolved
        .and_then(|r| std::fs::metadata(r).ok())
        .map(|m| (m.dev(), m.ino()))
    else {
        return false;
    };
    // scripts/build-guest installs the tools in /usr/bin of the read-only
    // root, this init in /sbin.
    let mut dirs = vec![std::path::PathBuf::from("/usr/bin")];
    dirs.extend(
        std::fs::read_link("/proc/self/exe")
            .ok()
            .and_then(|e| e.parent().map(Path::to_path_buf)),
    );
    dirs.iter().any(|dir| {
        TOOLS
            .iter()
            .any(|n| std::fs::metadata(dir.join(n)).is_ok_and(|m| (m.dev(), m.ino()) == id))
    })
}

fn run_command(
    chan: &mut Chan,
    spec: &Spec,
    secrets: &[(String, String)],
    audit: &mut Audit,
) -> io::Result<ExitReport> {
    let sigfd = sys::signalfd(&[libc::SIGCHLD])?;
    let Some(prog) = spec.argv.first() else {
        return Ok(ExitReport {
            code: Some(127),
            signal: None,
            error: Some("empty command".into()),
        });
    };
    let (in_r, in_w) = pipe()?;
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let mut cmd = Command::new(prog);
    cmd.args(&spec.argv[1..]).env_clear();
    for (k, v) in &spec.env {
        cmd.env(k, v);
    }
    for (k, v) in secrets {
        cmd.env(k, v);
    }
    cmd.env("SBX_ID", &spec.sbx_id);
    let cwd = if spec.copy_in { "/work" } else { "/" };
    cmd.current_dir(cwd);
    cmd.stdin(Stdio::from(in_r))
        .stdout(Stdio::from(out_w))
        .stderr(Stdio::from(err_w));
    // An sbx tool as the command (a chain inside the guest) gets the guest
    // audit log's fd; nothing else does.
    let path_var = spec
        .env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str());
    let audit_fd: Option<OwnedFd> = if is_sbx_tool(prog, path_var) {
        let f = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(AUDIT_FILE)?;
        let fd: OwnedFd = f.into();
        cmd.env("SBX_AUDIT_FD", fd.as_raw_fd().to_string());
        Some(fd)
    } else {
        None
    };
    let keep: RawFd = audit_fd.as_ref().map_or(-1, |f| f.as_raw_fd());
    // SAFETY: the pre_exec closure only makes raw syscalls on integers (async-signal-safe).
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
            if keep >= 0 {
                libc::fcntl(keep, libc::F_SETFD, 0);
            }
            Ok(())
        });
    }
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let code = match e.kind() {
                io::ErrorKind::NotFound => 127,
                _ => 126,
            };
            let msg = format!("{prog}: {e}");
            chan.send(kind::STDERR, format!("sbx-vm: {msg}\n").as_bytes())?;
            return Ok(ExitReport {
                code: Some(code),
                signal: None,
                error: Some(msg),
            });
        }
    };
    drop(cmd);
    drop(audit_fd);
    let pid = child.id() as i32;
    audit.emit(
        "guest_command_started",
        "info",
        json!({"argv0": prog, "cwd": cwd}),
    );

    let in_w = Some(in_w);
    relay(chan, pid, sigfd, in_w, out_r, err_r)
}

/// The relay loop: host frames to stdin/signals, stdout/stderr to frames,
/// until the command has exited and its output is drained.
fn relay(
    chan: &mut Chan,
    pid: i32,
    sigfd: OwnedFd,
    mut in_w: Option<OwnedFd>,
    out_r: OwnedFd,
    err_r: OwnedFd,
) -> io::Result<ExitReport> {
    let chan_fd = chan.f.as_raw_fd();
    if let Some(w) = &in_w {
        sys::set_nonblocking(w.as_raw_fd());
    }
    sys::set_nonblocking(out_r.as_raw_fd());
    sys::set_nonblocking(err_r.as_raw_fd());
    let mut outs: [Option<OwnedFd>; 2] = [Some(out_r), Some(err_r)];
    let mut stdin_buf: VecDeque<u8> = VecDeque::new();
    let mut stdin_eof = false;
    let mut status: Option<ExitReport> = None;
    let mut chan_open = true;
    let mut buf = vec![0u8; proto::CHUNK];
    // Frames the host sent right behind START (stdin, its EOF, a signal)
    // may already sit in the decoder, read together with START: no new
    // byte on the channel would wake poll for them, and `echo x | sbx-vm
    // -- cat` waited for ever (seen under load, where they coalesce). The
    // first poll does not block, and decoded frames are handled on every
    // pass, whatever woke it.
    let mut first = true;
    loop {
        if status.is_some() && outs.iter().all(Option::is_none) {
            break;
        }
        let mut pfds = vec![
            libc::pollfd {
                fd: sigfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: if chan_open { chan_fd } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: outs[0].as_ref().map_or(-1, |f| f.as_raw_fd()),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: outs[1].as_ref().map_or(-1, |f| f.as_raw_fd()),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: match &in_w {
                    Some(w) if !stdin_buf.is_empty() => w.as_raw_fd(),
                    _ => -1,
                },
                events: libc::POLLOUT,
                revents: 0,
            },
        ];
        sys::poll(&mut pfds, if first { 0 } else { -1 })?;
        first = false;
        // Child exits: reap everything (we are PID 1).
        if pfds[0].revents != 0 {
            let mut si = [0u8; 128];
            while let Ok(Some(n)) = sys::read_nb(sigfd.as_raw_fd(), &mut si) {
                if n == 0 {
                    break;
                }
            }
            loop {
                let mut st = 0;
                // SAFETY: st is a live int; WNOHANG: never blocks.
                let r = unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG) };
                if r <= 0 {
                    break;
                }
                if r == pid {
                    let rep = if libc::WIFEXITED(st) {
                        ExitReport {
                            code: Some(libc::WEXITSTATUS(st)),
                            signal: None,
                            error: None,
                        }
                    } else {
                        ExitReport {
                            code: None,
                            signal: Some(libc::WTERMSIG(st)),
                            error: None,
                        }
                    };
                    status = Some(rep);
                    // Nothing outlives the command in the guest.
                    // SAFETY: kill with integer arguments: as the guest's PID 1, kill(-1)
                    // spares this process.
                    unsafe { libc::kill(-1, libc::SIGKILL) };
                    in_w = None;
                }
            }
        }
        if pfds[1].revents != 0 {
            match sys::read_nb(chan_fd, &mut buf)? {
                Some(0) => chan_open = false,
                Some(n) => chan.dec.push(&buf[..n]),
                None => {}
            }
        }
        {
            while let Some((k, data)) = chan.dec.next_frame().map_err(io::Error::other)? {
                match k {
                    kind::STDIN if !stdin_eof && status.is_none() => stdin_buf.extend(data),
                    kind::STDIN_EOF => {
                        stdin_eof = true;
                        if stdin_buf.is_empty() {
                            in_w = None;
                        }
                    }
                    kind::SIGNAL => {
                        let sig = i32::from(data.first().copied().unwrap_or(libc::SIGTERM as u8));
                        if sig == libc::SIGKILL {
                            // SAFETY: kill with integer arguments: as the guest's PID 1,
                            // kill(-1) spares this process.
                            unsafe { libc::kill(-1, libc::SIGKILL) };
                        } else if status.is_none() {
                            // SAFETY: kill with integer arguments: the command's process group
                            // (its own session).
                            unsafe { libc::kill(-pid, sig) };
                        }
                    }
                    _ => {}
                }
            }
        }
        for (i, k) in [(2, kind::STDOUT), (3, kind::STDERR)] {
            if pfds[i].revents != 0 {
                let fd = outs[i - 2].as_ref().expect("polled").as_raw_fd();
                match sys::read_nb(fd, &mut buf)? {
                    Some(0) => outs[i - 2] = None,
                    Some(n) => chan.send(k, &buf[..n])?,
                    None => {}
                }
            }
        }
        if pfds[4].revents != 0 {
            if pfds[4].revents & (libc::POLLERR | libc::POLLHUP) != 0 {
                // The command closed its stdin.
                in_w = None;
                stdin_buf.clear();
            } else if let Some(w) = &in_w {
                let (a, _) = stdin_buf.as_slices();
                // SAFETY: w is the command's open stdin pipe; a is a live slice of a.len()
                // bytes.
                let n = unsafe { libc::write(w.as_raw_fd(), a.as_ptr().cast(), a.len()) };
                if n > 0 {
                    stdin_buf.drain(..n as usize);
                }
                if stdin_buf.is_empty() && stdin_eof {
                    in_w = None;
                }
            }
        }
    }
    Ok(status.expect("loop ends with a status"))
}
