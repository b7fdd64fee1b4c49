//! The Firecracker backend: the jail (as root), the tap device MMDS needs,
//! and the API calls (machine config, boot source, drive, vsock, network
//! interface, MMDS v2 config and contents, InstanceStart).

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sbx_core::Severity;
use sbx_core::audit;
use sbx_core::exit::Failure;
use sbx_core::guardian::{Ending, Guardian};
use sbx_core::supervise::Supervisor;
use serde_json::{Value, json};

use crate::options::Plan;
use crate::run::Running;
use crate::rundir::{self, RunDir};

/// The guest's vsock context id.
pub const GUEST_CID: u32 = 3;

#[derive(Debug, thiserror::Error)]
pub enum FcError {
    #[error("Firecracker API {method} {path}: {source}")]
    Io {
        method: String,
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("Firecracker API {method} {path}: HTTP {status}: {body}")]
    Http {
        method: String,
        path: String,
        status: u16,
        body: String,
    },
    #[error("Firecracker API socket {0} did not appear")]
    NoSocket(PathBuf),
    #[error("jail {path}: {source}")]
    Jail {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("tap device {name}: {source}")]
    Tap {
        name: String,
        #[source]
        source: io::Error,
    },
}

/// One HTTP/1.1 request on the API socket; returns (status, body).
pub fn api(
    sock: &Path,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, String), FcError> {
    let ioe = |source| FcError::Io {
        method: method.into(),
        path: path.into(),
        source,
    };
    let mut s = UnixStream::connect(sock).map_err(ioe)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(ioe)?;
    let b = body.map(|b| b.to_string()).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
        b.len()
    );
    s.write_all(req.as_bytes()).map_err(ioe)?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = s.read(&mut chunk).map_err(ioe)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            let len = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                let status = head
                    .split_whitespace()
                    .nth(1)
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(0);
                let body = String::from_utf8_lossy(&buf[end + 4..end + 4 + len]).to_string();
                return Ok((status, body));
            }
        }
    }
    Err(ioe(io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "connection closed",
    )))
}

fn put(sock: &Path, path: &str, body: Value) -> Result<(), FcError> {
    let (status, b) = api(sock, "PUT", path, Some(&body))?;
    if !(200..300).contains(&status) {
        return Err(FcError::Http {
            method: "PUT".into(),
            path: path.into(),
            status,
            body: b.trim().to_string(),
        });
    }
    Ok(())
}

const TUNSETIFF: libc::c_ulong = 0x400454ca;
const TUNSETPERSIST: libc::c_ulong = 0x400454cb;
const TUNSETOWNER: libc::c_ulong = 0x400454cc;
const TUNSETGROUP: libc::c_ulong = 0x400454ce;

#[repr(C)]
struct IfReq {
    name: [libc::c_char; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Creates (persist) or deletes (!persist) a tap device owned by uid/gid.
pub fn tap(name: &str, persist: bool, uid: u32, gid: u32) -> Result<(), FcError> {
    let err = |source| FcError::Tap {
        name: name.into(),
        source,
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .map_err(err)?;
    let mut r = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short,
        _pad: [0; 22],
    };
    for (i, b) in name.bytes().take(libc::IFNAMSIZ - 1).enumerate() {
        r.name[i] = b as libc::c_char;
    }
    let fd = f.as_raw_fd();
    // SAFETY: f keeps the tun fd open; r is a live ifreq for TUNSETIFF.
    unsafe {
        if libc::ioctl(fd, TUNSETIFF as _, &mut r) < 0 {
            return Err(err(io::Error::last_os_error()));
        }
        if persist
            && (libc::ioctl(fd, TUNSETOWNER as _, libc::c_ulong::from(uid)) < 0
                || libc::ioctl(fd, TUNSETGROUP as _, libc::c_ulong::from(gid)) < 0)
        {
            return Err(err(io::Error::last_os_error()));
        }
        if libc::ioctl(fd, TUNSETPERSIST as _, libc::c_ulong::from(persist)) < 0 {
            return Err(err(io::Error::last_os_error()));
        }
    }
    Ok(())
}

fn tap_name(pid: i32) -> String {
    format!("sbxfc{pid}")
}

/// Jail ids: `sbx-<pid>-<start>` of the owning sbx-vm.
fn jail_id() -> String {
    let me = std::process::id() as i32;
    format!("sbx-{me}-{}", rundir::start_time(me).unwrap_or(0))
}

/// Pids of the jailed Firecracker of jail `id` (its argv holds `--id ID`;
/// the jailer pivots into the jail in a new mount namespace, so its root
/// link does not name the jail).
pub fn jailed_pids(id: &str) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cl) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cl.split(|b| *b == 0).collect();
        let is_fc = args.first().is_some_and(|a| a.ends_with(b"firecracker"));
        if is_fc
            && args
                .windows(2)
                .any(|w| w[0] == b"--id" && w[1] == id.as_bytes())
        {
            out.push(pid);
        }
    }
    out
}

/// Kills the jailed Firecracker of jail `id` and waits until it is gone
/// (its fds closed: a tap it holds cannot be deleted before). Bounded: a
/// process stuck in uninterruptible sleep leaves its tap to the next
/// start's reaping.
fn kill_jailed(id: &str) {
    // Through pidfds re-checked against the jail's list: a pid reused by
    // another process between the reading and the signal is not signalled.
    // A pidfd polls readable once its process has exited, fds closed.
    let jailed = sbx_core::pidfd::kill_listed(|| jailed_pids(id));
    sbx_core::pidfd::wait_exited(&jailed, Duration::from_secs(5));
}

/// Removes jails (and their tap) whose sbx-vm no longer runs.
pub fn reap_stale_jails(base: &Path) {
    let dir = base.join("firecracker");
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some((pid, start)) = rundir::parse_owner(&name, "sbx-") else {
            continue;
        };
        if rundir::alive(pid, start) {
            continue;
        }
        kill_jailed(&name);
        let _ = tap(&tap_name(pid), false, 0, 0);
        for parent in crate::jailcg::all_parents() {
            crate::jailcg::remove(&parent, &name);
        }
        if std::fs::remove_dir_all(e.path()).is_ok() {
            audit::emit(
                "vm_stale_reaped",
                Severity::Warn,
                json!({"jail": e.path().display().to_string()}),
            );
        }
    }
}

/// One step of a jailed run's clean-up. sbx-vm undoes its steps itself
/// ([`Undos`]); each is also sent to the jail
/// reaper as it is taken, which undoes the same steps when sbx-vm died
/// without doing so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Undo {
    /// The jailed Firecracker killed, the jail directory removed.
    Jail { id: String, dir: PathBuf },
    /// The jail's cgroup (under `parent`) removed.
    JailCgroup { parent: String, id: String },
    /// The tap device deleted.
    Tap(String),
    /// sbx-vm's run directory removed (the reaper's only).
    RunDir(PathBuf),
}

impl Undo {
    /// A message for the reaper: a kind byte, then the fields, NUL-separated.
    fn encode(&self) -> Vec<u8> {
        use std::os::unix::ffi::OsStrExt;
        let (kind, fields): (u8, Vec<&[u8]>) = match self {
            Undo::Jail { id, dir } => (b'j', vec![id.as_bytes(), dir.as_os_str().as_bytes()]),
            Undo::JailCgroup { parent, id } => (b'c', vec![parent.as_bytes(), id.as_bytes()]),
            Undo::Tap(name) => (b't', vec![name.as_bytes()]),
            Undo::RunDir(dir) => (b'r', vec![dir.as_os_str().as_bytes()]),
        };
        let mut m = vec![kind];
        m.extend(fields.join(&0u8));
        m
    }

    fn decode(m: &[u8]) -> Option<Undo> {
        use std::ffi::OsStr;
        use std::os::unix::ffi::OsStrExt;
        let (&kind, rest) = m.split_first()?;
        let f: Vec<&[u8]> = rest.split(|b| *b == 0).collect();
        let text = |b: &[u8]| String::from_utf8(b.to_vec()).ok();
        let path = |b: &[u8]| PathBuf::from(OsStr::from_bytes(b));
        Some(match (kind, f.as_slice()) {
            (b'j', [id, dir]) => Undo::Jail {
                id: text(id)?,
                dir: path(dir),
            },
            (b'c', [parent, id]) => Undo::JailCgroup {
                parent: text(parent)?,
                id: text(id)?,
            },
            (b't', [name]) => Undo::Tap(text(name)?),
            (b'r', [dir]) => Undo::RunDir(path(dir)),
            _ => return None,
        })
    }

    /// Undoes steps in the order that works: the jailed VMM killed first
    /// (a tap it holds cannot be deleted, a cgroup with it not removed),
    /// then the tap, the cgroup, the run directory.
    fn undo_all<'a>(steps: impl IntoIterator<Item = &'a Undo>) {
        let mut steps: Vec<&Undo> = steps.into_iter().collect();
        steps.sort_by_key(|u| match u {
            Undo::Jail { .. } => 0,
            Undo::Tap(_) => 1,
            Undo::JailCgroup { .. } => 2,
            Undo::RunDir(_) => 3,
        });
        for u in steps {
            u.undo();
        }
    }

    fn undo(&self) {
        match self {
            Undo::Jail { id, dir } => {
                kill_jailed(id);
                let _ = std::fs::remove_dir_all(dir);
            }
            Undo::JailCgroup { parent, id } => crate::jailcg::remove(parent, id),
            Undo::Tap(name) => {
                // Busy while the killed VMM's last threads still exit (its
                // fds go with the last one): retried, bounded.
                let deadline = Instant::now() + Duration::from_secs(5);
                while let Err(FcError::Tap { source, .. }) = tap(name, false, 0, 0)
                    && source.raw_os_error() == Some(libc::EBUSY)
                    && Instant::now() < deadline
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            Undo::RunDir(dir) => {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}

/// The steps taken so far, undone ([`Undo::undo_all`]) when dropped, on
/// a failure in [`start`] and at the end of the run; then the reaper is
/// released.
pub struct Undos {
    steps: Vec<Undo>,
    reaper: Option<Guardian>,
}

impl Undos {
    /// Tells the reaper about a step (before it is taken).
    fn reaper_only(&mut self, u: &Undo) -> Result<(), Failure> {
        let Some(r) = &self.reaper else {
            return Ok(());
        };
        r.send(&u.encode())
            .map_err(|e| Failure::new(format!("jail reaper: {e}")))
    }

    /// A step about to be taken: undone by sbx-vm, and by the reaper.
    fn push(&mut self, u: Undo) -> Result<(), Failure> {
        self.reaper_only(&u)?;
        self.steps.push(u);
        Ok(())
    }
}

impl Drop for Undos {
    fn drop(&mut self) {
        Undo::undo_all(&self.steps);
        // Done: the reaper may go.
        if let Some(g) = self.reaper.take() {
            g.release();
        }
    }
}

/// The jail reaper: forked by run::run before any thread exists (the
/// sbx-creds renewal runtime starts later), when Firecracker will run
/// under the jailer. It undoes the steps it was sent ([`Undo::undo_all`])
/// when sbx-vm dies without releasing it. The forwarded signals stay
/// blocked in it (as in sbx-vm), so a Ctrl-C to the group does not take it
/// before it is needed.
pub fn reaper(plan: &Plan) -> Result<Option<Guardian>, Failure> {
    if plan.jailer.is_none() {
        return Ok(None);
    }
    if !sbx_core::guardian::single_threaded() {
        return Err(Failure::new(
            "jail reaper: sbx-vm already runs more than one thread (it must fork before any)",
        ));
    }
    // SAFETY: one thread, checked just above (nothing in sbx-vm starts one
    // before run::run calls this).
    let g = unsafe {
        Guardian::spawn(|w| {
            if let Ending::OwnerGone(msgs) = w.wait() {
                let steps: Vec<Undo> = msgs.iter().filter_map(|m| Undo::decode(m)).collect();
                Undo::undo_all(&steps);
            }
            0
        })
    };
    g.map(Some)
        .map_err(|e| Failure::new(format!("start the jail reaper: {e}")))
}

/// Puts `src` into the jail as `name` (hard link, else copy), readable by the jail user.
fn place(src: &Path, root: &Path, name: &str) -> Result<(), FcError> {
    let dst = root.join(name);
    if std::fs::hard_link(src, &dst).is_err() {
        std::fs::copy(src, &dst).map_err(|source| FcError::Jail {
            path: dst.clone(),
            source,
        })?;
    }
    Ok(())
}

fn wait_socket(p: &Path, limit: Duration) -> Result<(), FcError> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if UnixStream::connect(p).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(FcError::NoSocket(p.to_path_buf()))
}

/// Firecracker's default --http-api-max-payload-size (and MMDS size limit).
const FC_DEFAULT_PAYLOAD: usize = 51200;

/// Starts Firecracker (under the jailer when root), configures it, and
/// starts the instance. Returns the control-channel listener and the VMM.
pub fn start(
    plan: &Plan,
    rd: &RunDir,
    console: &Path,
    log: &Path,
    reaper: Option<Guardian>,
) -> Result<(UnixListener, Running), Failure> {
    // SAFETY: geteuid cannot fail.
    let root_user = unsafe { libc::geteuid() } == 0;
    let port = sbx_vm_init::proto::VSOCK_PORT;
    // Where things are, seen from the host and from Firecracker.
    let (root, api_sock, mut cmd, names): (PathBuf, PathBuf, Command, [String; 4]);
    let mut cleanup = Undos {
        steps: Vec::new(),
        reaper,
    };
    if let Some(jailer) = &plan.jailer {
        reap_stale_jails(&plan.jail_base);
        let id = jail_id();
        let jail = plan.jail_base.join("firecracker").join(&id);
        // sbx-vm's run directory, should sbx-vm die (its Drop never runs).
        cleanup.reaper_only(&Undo::RunDir(rd.path.clone()))?;
        if let Some(cg) = &plan.jail_cgroups {
            cleanup.push(Undo::JailCgroup {
                parent: cg.parent.clone(),
                id: id.clone(),
            })?;
        }
        cleanup.push(Undo::Jail {
            id: id.clone(),
            dir: jail.clone(),
        })?;
        root = jail.join("root");
        std::fs::create_dir_all(&root).map_err(|source| FcError::Jail {
            path: root.clone(),
            source,
        })?;
        place(&plan.files.kernel, &root, "vmlinux")?;
        place(&plan.files.initrd, &root, "initrd.img")?;
        place(&plan.files.rootfs, &root, "rootfs.squashfs")?;
        api_sock = root.join("run/firecracker.socket");
        names = [
            "vmlinux".into(),
            "initrd.img".into(),
            "rootfs.squashfs".into(),
            "/vsock.sock".into(),
        ];
        cmd = Command::new(jailer);
        cmd.arg("--id")
            .arg(&id)
            .arg("--exec-file")
            .arg(&plan.vmm_bin)
            .arg("--uid")
            .arg(plan.jail_uid.to_string())
            .arg("--gid")
            .arg(plan.jail_gid.to_string())
            .arg("--chroot-base-dir")
            .arg(&plan.jail_base);
        if let Some(cg) = &plan.jail_cgroups {
            cmd.arg("--cgroup-version")
                .arg(cg.version.to_string())
                .arg("--parent-cgroup")
                .arg(&cg.parent);
            for s in &cg.settings {
                cmd.arg("--cgroup").arg(s);
            }
        }
        cmd.args([
            "--resource-limit",
            "no-file=1024",
            "--",
            "--api-sock",
            "/run/firecracker.socket",
        ]);
    } else {
        root = rd.path.clone();
        api_sock = rd.join("firecracker.socket");
        names = [
            plan.files.kernel.display().to_string(),
            plan.files.initrd.display().to_string(),
            plan.files.rootfs.display().to_string(),
            rd.join("vsock.sock").display().to_string(),
        ];
        cmd = Command::new(&plan.vmm_bin);
        cmd.arg("--api-sock").arg(&api_sock);
    }
    // Firecracker refuses an API body (and an MMDS store) over 51200 bytes
    // by default: the secrets document, checked against the guest's exec
    // limits before anything was created, must not fail here.
    let payload = plan
        .secrets
        .as_ref()
        .map_or(0, |doc| doc.len() + 4096)
        .max(FC_DEFAULT_PAYLOAD)
        .to_string();
    cmd.arg("--http-api-max-payload-size")
        .arg(&payload)
        .arg("--mmds-size-limit")
        .arg(&payload);
    let chan = root.join(format!("vsock.sock_{port}"));
    let listener = UnixListener::bind(&chan)
        .map_err(|e| Failure::new(format!("bind {}: {e}", chan.display())))?;
    if root_user {
        let _ = std::os::unix::fs::chown(&chan, Some(plan.jail_uid), Some(plan.jail_gid));
    }
    // MMDS needs a network interface: a tap owned by the jail user, with no
    // address and no route on the host (only MMDS answers on it).
    let tap_dev = if plan.secrets.is_some() {
        if !root_user {
            return Err(Failure::new(
                "--secrets-from with --backend firecracker needs root (MMDS needs a tap device)",
            ));
        }
        let name = tap_name(std::process::id() as i32);
        cleanup.push(Undo::Tap(name.clone()))?;
        tap(&name, true, plan.jail_uid, plan.jail_gid)?;
        Some(name)
    } else {
        None
    };
    // Nothing of sbx-vm's environment (which may hold --secret-env values).
    cmd.env_clear();
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(
            std::fs::File::create(console).map_err(|e| Failure::new(format!("console: {e}")))?,
        ))
        .stderr(Stdio::from(
            std::fs::File::create(log).map_err(|e| Failure::new(format!("VMM log: {e}")))?,
        ));
    let mut sup = Supervisor::spawn(cmd, &[])?;
    // The jailer's uid drop clears the VMM's parent-death signal: the jail
    // reaper (forked by run::run before any thread) has every step above
    // and takes them should sbx-vm die without doing so (SIGKILL).
    let run_cleanup = move || drop(cleanup);
    let configured = (|| -> Result<Value, FcError> {
        wait_socket(&api_sock, Duration::from_secs(10))?;
        let boot_args = crate::qemu::kernel_cmdline(&format!(
            "sbx.chan=vsock{} pci=off reboot=k",
            if tap_dev.is_some() { " sbx.mmds" } else { "" }
        ))
        .replace("i8042.noaux ", "");
        put(
            &api_sock,
            "/machine-config",
            json!({"vcpu_count": plan.vcpus, "mem_size_mib": plan.mem >> 20, "smt": false}),
        )?;
        put(
            &api_sock,
            "/boot-source",
            json!({"kernel_image_path": names[0], "initrd_path": names[1], "boot_args": boot_args}),
        )?;
        put(
            &api_sock,
            "/drives/rootfs",
            json!({"drive_id": "rootfs", "path_on_host": names[2], "is_root_device": false, "is_read_only": true}),
        )?;
        put(
            &api_sock,
            "/vsock",
            json!({"guest_cid": GUEST_CID, "uds_path": names[3]}),
        )?;
        if let (Some(t), Some(doc)) = (&tap_dev, &plan.secrets) {
            put(
                &api_sock,
                "/network-interfaces/eth0",
                json!({"iface_id": "eth0", "host_dev_name": t}),
            )?;
            put(
                &api_sock,
                "/mmds/config",
                json!({"version": "V2", "network_interfaces": ["eth0"], "ipv4_address": sbx_vm_init::mmds::MMDS_ADDR.to_string()}),
            )?;
            let secrets: Value = serde_json::from_str(doc).unwrap_or(Value::Null);
            put(&api_sock, "/mmds", json!({"sbx": {"secrets": secrets}}))?;
        }
        put(
            &api_sock,
            "/actions",
            json!({"action_type": "InstanceStart"}),
        )?;
        let (_, cfg) = api(&api_sock, "GET", "/vm/config", None)?;
        Ok(serde_json::from_str(&cfg).unwrap_or(Value::Null))
    })();
    match configured {
        Ok(cfg) => {
            // The configuration without the MMDS contents (secrets).
            audit::emit(
                "vm_firecracker_started",
                Severity::Info,
                json!({"api_socket": api_sock.display().to_string(), "jail_root": plan.jailer.as_ref().map(|_| root.display().to_string()),
                       "tap": tap_dev, "vm_config": cfg}),
            );
            Ok((
                listener,
                Running {
                    sup,
                    cleanup: Some(Box::new(run_cleanup)),
                },
            ))
        }
        Err(e) => {
            let _ = sup.kill();
            run_cleanup();
            Err(Failure::new(sbx_core::exit::error_chain(&e)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn undo_messages_round_trip() {
        use std::os::unix::ffi::OsStrExt;
        let odd = PathBuf::from(std::ffi::OsStr::from_bytes(b"/srv/j\xff/x"));
        for u in [
            Undo::Jail {
                id: "sbx-1-2".into(),
                dir: odd.clone(),
            },
            Undo::JailCgroup {
                parent: "/sys/fs/cgroup/a".into(),
                id: "sbx-1-2".into(),
            },
            Undo::Tap("sbxfc1".into()),
            Undo::RunDir(odd),
        ] {
            assert_eq!(Undo::decode(&u.encode()), Some(u));
        }
        assert_eq!(Undo::decode(b""), None);
        assert_eq!(Undo::decode(b"t"), Some(Undo::Tap(String::new())));
        assert_eq!(Undo::decode(b"jonly-one-field"), None);
    }
}
