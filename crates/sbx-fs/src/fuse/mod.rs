//! sbx-fs's own FUSE file system, spoken directly on /dev/fuse: the guard
//! nodes ([`crate::guard`]) that make refused file accesses observable.
//!
//! - [`proto`]: the wire format (linux/fuse.h).
//! - [`server`]: the request loop (in the outer sbx-fs).
//! - [`mount`]: opening /dev/fuse and mounting it (in the sandbox's init,
//!   inside the user namespace that owns the mount: the kernel requires
//!   the /dev/fuse opener's user namespace to be the mounter's).
//! - [`handoff`]: passing fds from init to the outer sbx-fs (SCM_RIGHTS).

pub mod handoff;
pub mod mount;
pub mod proto;
pub mod server;
