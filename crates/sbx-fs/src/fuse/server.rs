//! The guard file system's server: it runs in the outer sbx-fs (outside
//! the sandbox's PID namespace: the sandboxed program can neither kill nor
//! ptrace it) on the /dev/fuse fd the sandbox's init opened and mounted.
//! One thread, one request at a time: every request is answered from
//! memory or from one syscall on a host fd, never by waiting on the
//! sandbox. When it dies, the connection is aborted and every access to
//! a guard node fails with ENOTCONN: still refused.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirEntryExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::proto::{self, Attr, Out, Request, op};
use crate::guard::{self, Alerts, GuardNode, NodeKind};

/// How long the kernel may cache entries and attributes (seconds).
const VALID_FIXED: u64 = 3600;
const VALID_PASS: u64 = 1;
/// Largest WRITE the kernel may send (none is ever accepted).
const MAX_WRITE: u32 = 64 * 1024;
/// The read buffer: a request never exceeds MAX_WRITE plus its headers.
const BUF: usize = MAX_WRITE as usize + 64 * 1024;
/// The uid/gid the kernel shows for ids that are not mapped.
const OVERFLOW_ID: u32 = 65534;

/// How host ids appear in the mount's user namespace.
#[derive(Debug, Clone, Copy)]
pub struct Ids {
    pub userns: bool,
    pub outer_uid: u32,
    pub outer_gid: u32,
    /// What outer_uid/gid are inside (the sandbox's identity with a user
    /// namespace).
    pub inner_uid: u32,
    pub inner_gid: u32,
}

impl Ids {
    fn uid(&self, host: u32) -> u32 {
        match (self.userns, host == self.outer_uid) {
            (false, _) => host,
            (true, true) => self.inner_uid,
            (true, false) => OVERFLOW_ID,
        }
    }
    fn gid(&self, host: u32) -> u32 {
        match (self.userns, host == self.outer_gid) {
            (false, _) => host,
            (true, true) => self.inner_gid,
            (true, false) => OVERFLOW_ID,
        }
    }
    /// The owner of the deny/empty nodes: what owned the old placeholders
    /// (the sandbox's init: the caller).
    fn owner(&self) -> (u32, u32) {
        (self.uid(self.outer_uid), self.gid(self.outer_gid))
    }

    /// The attributes as sent to the kernel. An id the mount's user
    /// namespace cannot map makes the kernel refuse every write to the
    /// node with EACCES before asking the server (the VFS will not write
    /// back an owner it cannot represent): a write to a protected file of a
    /// root-group project would fail with no alert. Such ids are shown as
    /// the sandbox's own; the server still refuses the write, and sees it.
    /// Permission checks (`Server::may`) keep the unmapped view.
    fn shown(&self, mut a: Attr) -> Attr {
        if self.userns {
            if a.uid == OVERFLOW_ID {
                a.uid = self.inner_uid;
            }
            if a.gid == OVERFLOW_ID {
                a.gid = self.inner_gid;
            }
        }
        a
    }
}

/// What a node id stands for.
#[derive(Debug)]
enum Node {
    /// The FUSE root: its entries are the guard nodes (only init sees it).
    Root,
    /// Guard node `g`, looked up as a directory or a file.
    Top { g: usize, dir: bool },
    /// Something inside a passthrough directory.
    Child {
        fd: OwnedFd,
        path: PathBuf,
        key: (u64, u64),
        nlookup: u64,
    },
}

/// How a request on a node is treated.
enum Class<'a> {
    Root,
    Deny(&'a Path),
    Empty(&'a Path),
    Pass(&'a Path, RawFd),
}

enum Handle {
    File(OwnedFd),
    Dir(Vec<(u64, u32, Vec<u8>)>),
    Empty,
}

pub struct Server {
    dev: OwnedFd,
    guards: Vec<GuardNode>,
    ids: Ids,
    alerts: Arc<Mutex<Alerts>>,
    nodes: HashMap<u64, Node>,
    by_key: HashMap<(u64, u64), u64>,
    next_id: u64,
    handles: HashMap<u64, Handle>,
    next_fh: u64,
    started: (i64, u32),
}

fn top_id(g: usize, dir: bool) -> u64 {
    2 + 2 * g as u64 + u64::from(dir)
}

fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

impl Server {
    pub fn new(dev: OwnedFd, guards: Vec<GuardNode>, ids: Ids, alerts: Arc<Mutex<Alerts>>) -> Self {
        let mut nodes = HashMap::new();
        nodes.insert(proto::ROOT_ID, Node::Root);
        let next_id = top_id(guards.len(), false) + 2;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Server {
            dev,
            guards,
            ids,
            alerts,
            nodes,
            by_key: HashMap::new(),
            next_id,
            handles: HashMap::new(),
            next_fh: 1,
            started: (now.as_secs() as i64, now.subsec_nanos()),
        }
    }

    /// Serves until the connection ends (the sandbox's mount namespace is
    /// gone: ENODEV) or DESTROY.
    pub fn run(mut self) {
        let mut buf = vec![0u8; BUF];
        loop {
            // SAFETY: dev is the open /dev/fuse fd; buf is a live buffer of buf.len() bytes.
            let n = unsafe { libc::read(self.dev.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                match io::Error::last_os_error().raw_os_error() {
                    // Interrupted, or the request was aborted meanwhile.
                    Some(libc::EINTR | libc::EAGAIN | libc::ENOENT) => continue,
                    _ => return,
                }
            }
            if n == 0 {
                return;
            }
            let req = match Request::parse(&buf[..n as usize]) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!("guard fs: {e}");
                    continue;
                }
            };
            let destroy = req.opcode == op::DESTROY;
            if let Some(msg) = self.handle(&req) {
                // ENOENT: the request was interrupted; nothing to do.
                // SAFETY: dev is the open /dev/fuse fd; msg is a live buffer of msg.len()
                // bytes.
                unsafe { libc::write(self.dev.as_raw_fd(), msg.as_ptr().cast(), msg.len()) };
            }
            if destroy {
                return;
            }
        }
    }

    fn class(&self, nodeid: u64) -> Option<Class<'_>> {
        Some(match self.nodes.get(&nodeid)? {
            Node::Root => Class::Root,
            Node::Top { g, .. } => {
                let n = &self.guards[*g];
                match &n.kind {
                    NodeKind::Deny => Class::Deny(&n.path),
                    NodeKind::Empty => Class::Empty(&n.path),
                    NodeKind::Pass(fd) => Class::Pass(&n.path, fd.as_raw_fd()),
                }
            }
            Node::Child { fd, path, .. } => Class::Pass(path, fd.as_raw_fd()),
        })
    }

    fn deny(&self, path: &Path, access: &'static str, pid: u32) {
        if let Ok(mut a) = self.alerts.lock() {
            a.denied(path, access, pid);
        }
    }

    fn write_denied(&self, path: &Path, opname: &'static str, pid: u32) {
        if let Ok(mut a) = self.alerts.lock() {
            a.write_denied(path, opname, pid);
        }
    }

    fn fixed_attr(&self, ino: u64, dir: bool, perm: u32) -> Attr {
        let (uid, gid) = self.ids.owner();
        Attr {
            ino,
            mode: perm | if dir { libc::S_IFDIR } else { libc::S_IFREG },
            nlink: if dir { 2 } else { 1 },
            uid,
            gid,
            blksize: 4096,
            atime: self.started,
            mtime: self.started,
            ctime: self.started,
            ..Attr::default()
        }
    }

    fn pass_attr(&self, fd: RawFd) -> io::Result<Attr> {
        // SAFETY: libc::stat is plain integers: all-zero is a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: the empty path is a NUL-ended literal and st a live stat for the kernel to
        // fill.
        let r = unsafe {
            libc::fstatat(
                fd,
                c"".as_ptr(),
                &mut st,
                libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Attr {
            ino: st.st_ino,
            size: st.st_size as u64,
            blocks: st.st_blocks as u64,
            atime: (st.st_atime, st.st_atime_nsec as u32),
            mtime: (st.st_mtime, st.st_mtime_nsec as u32),
            ctime: (st.st_ctime, st.st_ctime_nsec as u32),
            mode: st.st_mode,
            nlink: st.st_nlink as u32,
            uid: self.ids.uid(st.st_uid),
            gid: self.ids.gid(st.st_gid),
            rdev: st.st_rdev as u32,
            blksize: st.st_blksize as u32,
        })
    }

    fn attr(&self, nodeid: u64) -> Result<(Attr, u64), i32> {
        match self.nodes.get(&nodeid).ok_or(libc::ENOENT)? {
            Node::Root => Ok((self.fixed_attr(nodeid, true, 0o555), VALID_FIXED)),
            Node::Top { g, dir } => match &self.guards[*g].kind {
                NodeKind::Deny => Ok((self.fixed_attr(nodeid, *dir, 0o000), VALID_FIXED)),
                NodeKind::Empty => Ok((
                    self.fixed_attr(nodeid, *dir, if *dir { 0o555 } else { 0o444 }),
                    VALID_FIXED,
                )),
                NodeKind::Pass(fd) => self
                    .pass_attr(fd.as_raw_fd())
                    .map(|a| (a, VALID_PASS))
                    .map_err(|e| errno(&e)),
            },
            Node::Child { fd, .. } => self
                .pass_attr(fd.as_raw_fd())
                .map(|a| (a, VALID_PASS))
                .map_err(|e| errno(&e)),
        }
    }

    /// One request; the reply (None for FORGET, INTERRUPT ...).
    fn handle(&mut self, r: &Request) -> Option<Vec<u8>> {
        let res = match self.dispatch(r) {
            Ok(None) => return None,
            Ok(Some(body)) => Ok(body),
            Err(e) => Err(e),
        };
        Some(match res {
            Ok(body) => proto::reply(r.unique, 0, &body),
            Err(e) => proto::reply(r.unique, -e, &[]),
        })
    }

    fn dispatch(&mut self, r: &Request) -> Result<Option<Vec<u8>>, i32> {
        let bad = |_| libc::EINVAL;
        let pid = r.pid;
        match r.opcode {
            op::INIT => {
                let major = r.u32(0).map_err(bad)?;
                let minor = r.u32(4).map_err(bad)?;
                let readahead = r.u32(8).map_err(bad)?;
                if major != proto::KERNEL_VERSION {
                    return Err(libc::EPROTO);
                }
                let minor = minor.min(proto::KERNEL_MINOR);
                Ok(Some(proto::init_out(minor, readahead, MAX_WRITE)))
            }
            op::DESTROY => Ok(Some(Vec::new())),
            op::INTERRUPT => Ok(None),
            op::FORGET => {
                let n = r.u64(0).map_err(bad)?;
                self.forget(r.nodeid, n);
                Ok(None)
            }
            op::BATCH_FORGET => {
                let count = r.u32(0).map_err(bad)? as usize;
                for i in 0..count {
                    let (Ok(id), Ok(n)) = (r.u64(8 + 16 * i), r.u64(16 + 16 * i)) else {
                        break;
                    };
                    self.forget(id, n);
                }
                Ok(None)
            }
            op::LOOKUP => {
                let name = r.name(0).map_err(bad)?;
                self.may(r, libc::X_OK)?;
                self.lookup(r.nodeid, name, pid).map(Some)
            }
            op::GETATTR => {
                let (a, valid) = self.attr(r.nodeid)?;
                Ok(Some(proto::attr_out(valid, &self.ids.shown(a))))
            }
            op::READLINK => match self.class(r.nodeid).ok_or(libc::ENOENT)? {
                Class::Pass(_, fd) => {
                    let mut b = vec![0u8; libc::PATH_MAX as usize];
                    // SAFETY: fd is a node's open O_PATH fd; b is a live buffer of b.len()
                    // bytes.
                    let n = unsafe {
                        libc::readlinkat(fd, c"".as_ptr(), b.as_mut_ptr().cast(), b.len())
                    };
                    if n < 0 {
                        return Err(errno(&io::Error::last_os_error()));
                    }
                    b.truncate(n as usize);
                    Ok(Some(b))
                }
                Class::Deny(p) => {
                    self.deny(p, "read", pid);
                    Err(libc::EACCES)
                }
                _ => Err(libc::EINVAL),
            },
            op::OPEN => {
                let flags = r.u32(0).map_err(bad)? as i32;
                if flags & libc::O_ACCMODE == libc::O_RDONLY && flags & libc::O_TRUNC == 0 {
                    self.may(r, libc::R_OK)?;
                }
                self.open(r.nodeid, flags, pid).map(Some)
            }
            op::READ => {
                let fh = r.u64(0).map_err(bad)?;
                let off = r.u64(8).map_err(bad)?;
                let size = r.u32(16).map_err(bad)? as usize;
                match self.handles.get(&fh) {
                    Some(Handle::File(f)) => {
                        let mut b = vec![0u8; size.min(BUF)];
                        // SAFETY: f is an open handle's fd; b is a live buffer of b.len()
                        // bytes.
                        let n = unsafe {
                            libc::pread(f.as_raw_fd(), b.as_mut_ptr().cast(), b.len(), off as i64)
                        };
                        if n < 0 {
                            return Err(errno(&io::Error::last_os_error()));
                        }
                        b.truncate(n as usize);
                        Ok(Some(b))
                    }
                    Some(Handle::Empty) => Ok(Some(Vec::new())),
                    _ => Err(libc::EBADF),
                }
            }
            op::RELEASE | op::RELEASEDIR => {
                let fh = r.u64(0).map_err(bad)?;
                self.handles.remove(&fh);
                Ok(Some(Vec::new()))
            }
            op::FLUSH | op::FSYNC | op::FSYNCDIR => Ok(Some(Vec::new())),
            op::OPENDIR => {
                self.may(r, libc::R_OK)?;
                self.opendir(r.nodeid, pid).map(Some)
            }
            op::READDIR => {
                let fh = r.u64(0).map_err(bad)?;
                let off = r.u64(8).map_err(bad)? as usize;
                let size = r.u32(16).map_err(bad)? as usize;
                let Some(Handle::Dir(entries)) = self.handles.get(&fh) else {
                    return Err(libc::EBADF);
                };
                let mut o = Out::default();
                for (i, (ino, typ, name)) in entries.iter().enumerate().skip(off) {
                    if !proto::dirent(&mut o, size, *ino, i as u64 + 1, *typ, name) {
                        break;
                    }
                }
                Ok(Some(o.0))
            }
            op::ACCESS => {
                let mask = r.u32(0).map_err(bad)? as i32;
                match self.class(r.nodeid).ok_or(libc::ENOENT)? {
                    Class::Deny(p) if mask != libc::F_OK => {
                        self.deny(p, "access", pid);
                        Err(libc::EACCES)
                    }
                    Class::Empty(p) | Class::Pass(p, _) if mask & libc::W_OK != 0 => {
                        self.write_denied(p, "access-write", pid);
                        Err(libc::EROFS)
                    }
                    _ => {
                        self.may(r, mask)?;
                        Ok(Some(Vec::new()))
                    }
                }
            }
            op::STATFS => {
                // SAFETY: libc::statvfs is plain integers: all-zero is a valid value.
                let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
                st.f_bsize = 4096;
                st.f_frsize = 4096;
                st.f_namemax = 255;
                Ok(Some(proto::statfs_out(&st)))
            }
            op::GETXATTR => {
                // No extended attribute is shown (nor refused with an alert:
                // ls and cp ask for security.* on every file).
                self.class(r.nodeid).ok_or(libc::ENOENT)?;
                Err(libc::ENODATA)
            }
            op::LISTXATTR => {
                let size = r.u32(0).map_err(bad)?;
                if size == 0 {
                    Ok(Some(proto::xattr_size_out(0)))
                } else {
                    Ok(Some(Vec::new()))
                }
            }
            // Write-class operations on the node itself.
            op::SETATTR => {
                let valid = r.u32(0).map_err(bad)?;
                let what = if valid & proto::FATTR_SIZE != 0 {
                    "truncate"
                } else {
                    "setattr"
                };
                self.refuse_on(r.nodeid, None, what, pid)
            }
            op::WRITE => self.refuse_on(r.nodeid, None, "write", pid),
            op::FALLOCATE => self.refuse_on(r.nodeid, None, "fallocate", pid),
            op::SETXATTR => self.refuse_on(r.nodeid, None, "setxattr", pid),
            op::REMOVEXATTR => self.refuse_on(r.nodeid, None, "removexattr", pid),
            // Write-class operations on a name in the node (a directory).
            op::CREATE => self.refuse_on(r.nodeid, r.name(16).ok(), "create", pid),
            op::MKNOD => self.refuse_on(r.nodeid, r.name(16).ok(), "mknod", pid),
            op::MKDIR => self.refuse_on(r.nodeid, r.name(8).ok(), "mkdir", pid),
            op::SYMLINK => self.refuse_on(r.nodeid, r.name(0).ok(), "symlink", pid),
            op::UNLINK => self.refuse_on(r.nodeid, r.name(0).ok(), "unlink", pid),
            op::RMDIR => self.refuse_on(r.nodeid, r.name(0).ok(), "rmdir", pid),
            op::RENAME => self.refuse_on(r.nodeid, r.name(8).ok(), "rename", pid),
            op::RENAME2 => self.refuse_on(r.nodeid, r.name(16).ok(), "rename", pid),
            op::LINK => self.refuse_on(r.nodeid, r.name(8).ok(), "link", pid),
            op::TMPFILE => self.refuse_on(r.nodeid, None, "tmpfile", pid),
            _ => Err(libc::ENOSYS),
        }
    }

    /// The permission check the kernel would make (the mount has no
    /// `default_permissions`, so it is ours): a passthrough node is read
    /// with the server's identity, which may be more than the caller's
    /// (root running the sandbox as --uid N). Owner, group, other bits of
    /// the file as the sandbox sees it; supplementary groups are not known
    /// (FUSE does not send them), so only the primary group counts. A plain
    /// EACCES, not an alert: this is the file's own mode, not sbx policy.
    fn may(&self, r: &Request, want: i32) -> Result<(), i32> {
        let Some(Class::Pass(..)) = self.class(r.nodeid) else {
            return Ok(());
        };
        let (a, _) = self.attr(r.nodeid)?;
        let bits = if r.uid == a.uid {
            a.mode >> 6
        } else if r.gid == a.gid {
            a.mode >> 3
        } else {
            a.mode
        } & 0o7;
        let need = (if want & libc::R_OK != 0 { 4 } else { 0 })
            | (if want & libc::X_OK != 0 { 1 } else { 0 });
        if bits & need == need {
            Ok(())
        } else {
            Err(libc::EACCES)
        }
    }

    /// Refuses a write-class operation on `nodeid` (or on `name` in it):
    /// EACCES + fs_denied on a deny node, EROFS + fs_write_denied on a
    /// guarded one.
    fn refuse_on(
        &self,
        nodeid: u64,
        name: Option<&[u8]>,
        what: &'static str,
        pid: u32,
    ) -> Result<Option<Vec<u8>>, i32> {
        let join = |p: &Path| match name {
            Some(n) => p.join(OsStr::from_bytes(n)),
            None => p.to_path_buf(),
        };
        match self.class(nodeid).ok_or(libc::ENOENT)? {
            Class::Root => Err(libc::EROFS),
            Class::Deny(p) => {
                self.deny(&join(p), what, pid);
                Err(libc::EACCES)
            }
            Class::Empty(p) | Class::Pass(p, _) => {
                self.write_denied(&join(p), what, pid);
                Err(libc::EROFS)
            }
        }
    }

    fn forget(&mut self, nodeid: u64, n: u64) {
        let gone = match self.nodes.get_mut(&nodeid) {
            Some(Node::Child { nlookup, key, .. }) => {
                *nlookup = nlookup.saturating_sub(n);
                (*nlookup == 0).then_some(*key)
            }
            _ => None,
        };
        if let Some(key) = gone {
            self.nodes.remove(&nodeid);
            self.by_key.remove(&key);
        }
    }

    fn lookup(&mut self, parent: u64, name: &[u8], pid: u32) -> Result<Vec<u8>, i32> {
        let (dirfd, path) = match self.class(parent).ok_or(libc::ENOENT)? {
            Class::Root => {
                let (g, dir) = guard::parse_node_name(name).ok_or(libc::ENOENT)?;
                if g >= self.guards.len() {
                    return Err(libc::ENOENT);
                }
                let id = top_id(g, dir);
                self.nodes.insert(id, Node::Top { g, dir });
                let (a, valid) = self.attr(id)?;
                return Ok(proto::entry_out(id, valid, &self.ids.shown(a)));
            }
            Class::Deny(p) => {
                self.deny(&p.join(OsStr::from_bytes(name)), "lookup", pid);
                return Err(libc::EACCES);
            }
            Class::Empty(..) => return Err(libc::ENOENT),
            Class::Pass(p, fd) => (fd, p.join(OsStr::from_bytes(name))),
        };
        let c = std::ffi::CString::new(name).map_err(|_| libc::EINVAL)?;
        // SAFETY: c is a NUL-ended name alive for the call; the fd is owned just below.
        let fd = unsafe {
            libc::openat(
                dirfd,
                c.as_ptr(),
                libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(errno(&io::Error::last_os_error()));
        }
        // SAFETY: fd was just returned by openat (>= 0) and is owned by no one else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let a = self.pass_attr(fd.as_raw_fd()).map_err(|e| errno(&e))?;
        let st = crate::sys::fstat(fd.as_raw_fd()).map_err(|e| errno(&e))?;
        let key = (st.st_dev, st.st_ino);
        let id = match self.by_key.get(&key) {
            Some(id) => {
                if let Some(Node::Child { nlookup, .. }) = self.nodes.get_mut(id) {
                    *nlookup += 1;
                }
                *id
            }
            None => {
                let id = self.next_id;
                self.next_id += 1;
                self.by_key.insert(key, id);
                self.nodes.insert(
                    id,
                    Node::Child {
                        fd,
                        path,
                        key,
                        nlookup: 1,
                    },
                );
                id
            }
        };
        Ok(proto::entry_out(id, VALID_PASS, &self.ids.shown(a)))
    }

    fn new_handle(&mut self, h: Handle) -> u64 {
        let fh = self.next_fh;
        self.next_fh += 1;
        self.handles.insert(fh, h);
        fh
    }

    fn open(&mut self, nodeid: u64, flags: i32, pid: u32) -> Result<Vec<u8>, i32> {
        let acc = flags & libc::O_ACCMODE;
        let writes = acc != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        let h = match self.class(nodeid).ok_or(libc::ENOENT)? {
            Class::Root => return Err(libc::EISDIR),
            Class::Deny(p) => {
                self.deny(p, if writes { "write" } else { "read" }, pid);
                return Err(libc::EACCES);
            }
            Class::Empty(p) | Class::Pass(p, _) if writes => {
                let what = if acc == libc::O_RDONLY {
                    "truncate"
                } else {
                    "open-write"
                };
                self.write_denied(p, what, pid);
                return Err(libc::EROFS);
            }
            Class::Empty(..) => Handle::Empty,
            Class::Pass(_, fd) => {
                // Regular files only: the server opens on the host, where
                // the sandbox's nodev does not apply (a device or FIFO
                // planted in the tree is not opened for it).
                let st = crate::sys::fstat(fd).map_err(|e| errno(&e))?;
                if !crate::sys::is_reg(&st) {
                    return Err(libc::EACCES);
                }
                let proc = format!("/proc/self/fd/{fd}");
                let c = std::ffi::CString::new(proc).map_err(|_| libc::EINVAL)?;
                // SAFETY: c is a NUL-ended path alive for the call; the fd is owned just below.
                let f = unsafe {
                    libc::open(
                        c.as_ptr(),
                        libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK,
                    )
                };
                if f < 0 {
                    return Err(errno(&io::Error::last_os_error()));
                }
                // SAFETY: f was just returned by open (>= 0) and is owned by no one else.
                Handle::File(unsafe { OwnedFd::from_raw_fd(f) })
            }
        };
        let fh = self.new_handle(h);
        Ok(proto::open_out(fh))
    }

    fn opendir(&mut self, nodeid: u64, pid: u32) -> Result<Vec<u8>, i32> {
        let dots = |ino: u64| {
            vec![
                (ino, u32::from(libc::DT_DIR), b".".to_vec()),
                (ino, u32::from(libc::DT_DIR), b"..".to_vec()),
            ]
        };
        let h = match self.class(nodeid).ok_or(libc::ENOENT)? {
            Class::Root => Handle::Dir(dots(nodeid)),
            Class::Deny(p) => {
                self.deny(p, "list", pid);
                return Err(libc::EACCES);
            }
            Class::Empty(..) => Handle::Dir(dots(nodeid)),
            Class::Pass(_, fd) => {
                let rd = std::fs::read_dir(format!("/proc/self/fd/{fd}")).map_err(|e| errno(&e))?;
                let mut v = dots(nodeid);
                for e in rd.flatten() {
                    let typ = match e.file_type() {
                        Ok(t) if t.is_dir() => libc::DT_DIR,
                        Ok(t) if t.is_file() => libc::DT_REG,
                        Ok(t) if t.is_symlink() => libc::DT_LNK,
                        _ => libc::DT_UNKNOWN,
                    };
                    v.push((e.ino(), u32::from(typ), e.file_name().as_bytes().to_vec()));
                }
                Handle::Dir(v)
            }
        };
        let fh = self.new_handle(h);
        Ok(proto::open_out(fh))
    }
}
