//! The FUSE wire protocol (linux/fuse.h, protocol 7.x), the few messages
//! sbx-fs's guard file system needs. Requests are parsed from and replies
//! written to plain byte buffers (little-endian, as the kernel's structs
//! are on every architecture Linux runs FUSE on here), so there is no
//! unsafe struct casting.

/// The protocol major version; the minor one is negotiated at INIT.
pub const KERNEL_VERSION: u32 = 7;
/// The minor version we speak (7.31: the 64-byte fuse_init_out).
pub const KERNEL_MINOR: u32 = 31;
/// The root node's id.
pub const ROOT_ID: u64 = 1;
/// A request's header size (struct fuse_in_header).
pub const IN_HEADER: usize = 40;
/// A reply's header size (struct fuse_out_header).
pub const OUT_HEADER: usize = 16;

/// Opcodes (enum fuse_opcode).
pub mod op {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const RENAME2: u32 = 45;
    pub const TMPFILE: u32 = 51;
}

/// FATTR_* bits of fuse_setattr_in.valid that change the file.
pub const FATTR_SIZE: u32 = 1 << 3;

#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    #[error("short FUSE request: {got} bytes, the header says {want}")]
    Short { got: usize, want: usize },
    #[error("FUSE request {opcode}: argument too short")]
    Arg { opcode: u32 },
}

/// A request as read from /dev/fuse.
#[derive(Debug)]
pub struct Request<'a> {
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    /// The caller's pid in the PID namespace of the mounter (the sandbox).
    pub pid: u32,
    /// The operation's arguments (after the header).
    pub arg: &'a [u8],
}

impl<'a> Request<'a> {
    pub fn parse(buf: &'a [u8]) -> Result<Request<'a>, ProtoError> {
        if buf.len() < IN_HEADER {
            return Err(ProtoError::Short {
                got: buf.len(),
                want: IN_HEADER,
            });
        }
        let len = u32_at(buf, 0) as usize;
        if len > buf.len() || len < IN_HEADER {
            return Err(ProtoError::Short {
                got: buf.len(),
                want: len,
            });
        }
        Ok(Request {
            opcode: u32_at(buf, 4),
            unique: u64_at(buf, 8),
            nodeid: u64_at(buf, 16),
            uid: u32_at(buf, 24),
            gid: u32_at(buf, 28),
            pid: u32_at(buf, 32),
            arg: &buf[IN_HEADER..len],
        })
    }

    pub fn u32(&self, off: usize) -> Result<u32, ProtoError> {
        self.need(off + 4)?;
        Ok(u32_at(self.arg, off))
    }

    pub fn u64(&self, off: usize) -> Result<u64, ProtoError> {
        self.need(off + 8)?;
        Ok(u64_at(self.arg, off))
    }

    fn need(&self, n: usize) -> Result<(), ProtoError> {
        if self.arg.len() < n {
            return Err(ProtoError::Arg {
                opcode: self.opcode,
            });
        }
        Ok(())
    }

    /// The NUL-terminated name starting at `off` of the arguments.
    pub fn name(&self, off: usize) -> Result<&'a [u8], ProtoError> {
        let rest = self.arg.get(off..).ok_or(ProtoError::Arg {
            opcode: self.opcode,
        })?;
        let end = rest.iter().position(|b| *b == 0).unwrap_or(rest.len());
        Ok(&rest[..end])
    }
}

pub fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}

pub fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

/// A reply body under construction.
#[derive(Default)]
pub struct Out(pub Vec<u8>);

impl Out {
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    pub fn pad8(&mut self) -> &mut Self {
        while !self.0.len().is_multiple_of(8) {
            self.0.push(0);
        }
        self
    }
}

/// A whole reply message: header (error is a negative errno or 0) + body.
pub fn reply(unique: u64, error: i32, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(OUT_HEADER + body.len());
    v.extend_from_slice(&((OUT_HEADER + body.len()) as u32).to_le_bytes());
    v.extend_from_slice(&error.to_le_bytes());
    v.extend_from_slice(&unique.to_le_bytes());
    v.extend_from_slice(body);
    v
}

/// struct fuse_attr (88 bytes), from what stat(2) says (uid/gid already in
/// the view of the mount's user namespace).
#[derive(Debug, Clone, Copy, Default)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
}

impl Attr {
    pub fn write(&self, o: &mut Out) {
        o.u64(self.ino)
            .u64(self.size)
            .u64(self.blocks)
            .u64(self.atime.0 as u64)
            .u64(self.mtime.0 as u64)
            .u64(self.ctime.0 as u64)
            .u32(self.atime.1)
            .u32(self.mtime.1)
            .u32(self.ctime.1)
            .u32(self.mode)
            .u32(self.nlink)
            .u32(self.uid)
            .u32(self.gid)
            .u32(self.rdev)
            .u32(self.blksize)
            .u32(0);
    }
}

/// struct fuse_entry_out.
pub fn entry_out(nodeid: u64, valid_secs: u64, attr: &Attr) -> Vec<u8> {
    let mut o = Out::default();
    o.u64(nodeid)
        .u64(0)
        .u64(valid_secs)
        .u64(valid_secs)
        .u32(0)
        .u32(0);
    attr.write(&mut o);
    o.0
}

/// struct fuse_attr_out.
pub fn attr_out(valid_secs: u64, attr: &Attr) -> Vec<u8> {
    let mut o = Out::default();
    o.u64(valid_secs).u32(0).u32(0);
    attr.write(&mut o);
    o.0
}

/// struct fuse_open_out.
pub fn open_out(fh: u64) -> Vec<u8> {
    let mut o = Out::default();
    o.u64(fh).u32(0).u32(0);
    o.0
}

/// struct fuse_init_out (7.31 layout, 64 bytes): no optional feature is
/// asked for; reads are synchronous and small writes are never accepted.
pub fn init_out(minor: u32, max_readahead: u32, max_write: u32) -> Vec<u8> {
    let mut o = Out::default();
    o.u32(KERNEL_VERSION)
        .u32(minor)
        .u32(max_readahead)
        .u32(0) // flags
        .u16(16) // max_background
        .u16(12) // congestion_threshold
        .u32(max_write)
        .u32(1) // time_gran: nanoseconds
        .u16(0) // max_pages (only with FUSE_MAX_PAGES)
        .u16(0)
        .u32(0); // flags2
    for _ in 0..7 {
        o.u32(0);
    }
    o.0
}

/// struct fuse_kstatfs inside fuse_statfs_out.
pub fn statfs_out(st: &libc::statvfs) -> Vec<u8> {
    let mut o = Out::default();
    o.u64(st.f_blocks)
        .u64(st.f_bfree)
        .u64(st.f_bavail)
        .u64(st.f_files)
        .u64(st.f_ffree)
        .u32(st.f_bsize as u32)
        .u32(st.f_namemax as u32)
        .u32(st.f_frsize as u32)
        .u32(0);
    for _ in 0..6 {
        o.u32(0);
    }
    o.0
}

/// One struct fuse_dirent (padded to 8 bytes); None when it does not fit.
pub fn dirent(o: &mut Out, room: usize, ino: u64, next_off: u64, typ: u32, name: &[u8]) -> bool {
    let len = (24 + name.len()).next_multiple_of(8);
    if o.0.len() + len > room {
        return false;
    }
    o.u64(ino)
        .u64(next_off)
        .u32(name.len() as u32)
        .u32(typ)
        .bytes(name)
        .pad8();
    true
}

/// struct fuse_getxattr_out (the size of a list/value when asked with 0).
pub fn xattr_size_out(size: u32) -> Vec<u8> {
    let mut o = Out::default();
    o.u32(size).u32(0);
    o.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_linux_fuse_h() {
        assert_eq!(entry_out(2, 1, &Attr::default()).len(), 128);
        assert_eq!(attr_out(1, &Attr::default()).len(), 104);
        assert_eq!(init_out(31, 0, 4096).len(), 64);
        assert_eq!(open_out(1).len(), 16);
        // SAFETY: libc::statvfs is plain integers: all-zero is a valid value.
        let st: libc::statvfs = unsafe { std::mem::zeroed() };
        assert_eq!(statfs_out(&st).len(), 80);
        let mut o = Out::default();
        assert!(dirent(&mut o, 4096, 1, 1, 4, b"abc"));
        assert_eq!(o.0.len(), 32);
        assert!(!dirent(&mut o, 40, 1, 2, 4, b"abcdefgh"));
    }

    #[test]
    fn header_is_parsed() {
        let mut b = Vec::new();
        b.extend_from_slice(&44u32.to_le_bytes());
        b.extend_from_slice(&op::LOOKUP.to_le_bytes());
        b.extend_from_slice(&7u64.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(&1000u32.to_le_bytes());
        b.extend_from_slice(&1000u32.to_le_bytes());
        b.extend_from_slice(&42u32.to_le_bytes());
        b.extend_from_slice(&[0; 4]);
        b.extend_from_slice(b"abc\0");
        let r = Request::parse(&b).unwrap();
        assert_eq!(
            (r.opcode, r.unique, r.nodeid, r.pid),
            (op::LOOKUP, 7, 1, 42)
        );
        assert_eq!(r.name(0).unwrap(), b"abc");
        assert!(Request::parse(&b[..30]).is_err());
    }
}
