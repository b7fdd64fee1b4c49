//! The guest's kernel, initramfs and root filesystem: where they are by
//! default and whether they are what they claim to be.

use std::io::Read;
use std::path::{Path, PathBuf};

/// Where scripts/build-guest installs the guest by default.
pub const DEFAULT_DIR: &str = "/usr/local/share/sbx/guest";
pub const ENV_DIR: &str = "SBX_VM_GUEST_DIR";

#[derive(Debug, Clone)]
pub struct GuestFiles {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub rootfs: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum GuestFileError {
    #[error("{flag} {path}: {what}")]
    Bad {
        flag: &'static str,
        path: PathBuf,
        what: String,
    },
}

pub fn default_dir() -> PathBuf {
    std::env::var_os(ENV_DIR)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DIR))
}

fn head(p: &Path, n: usize) -> std::io::Result<Vec<u8>> {
    let mut f = std::fs::File::open(p)?;
    let mut b = vec![0u8; n];
    let mut got = 0;
    while got < n {
        let k = f.read(&mut b[got..])?;
        if k == 0 {
            break;
        }
        got += k;
    }
    b.truncate(got);
    Ok(b)
}

fn check(
    flag: &'static str,
    p: &Path,
    what_magic: &str,
    ok: impl Fn(&[u8]) -> bool,
    n: usize,
) -> Result<(), GuestFileError> {
    let bad = |what: String| GuestFileError::Bad {
        flag,
        path: p.to_path_buf(),
        what,
    };
    let meta = std::fs::metadata(p).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            bad(format!(
                "does not exist (build the guest with scripts/build-guest, or set {ENV_DIR})"
            ))
        } else {
            bad(e.to_string())
        }
    })?;
    if !meta.is_file() {
        return Err(bad("not a regular file".into()));
    }
    let h = head(p, n).map_err(|e| bad(e.to_string()))?;
    if !ok(&h) {
        return Err(bad(format!("not {what_magic}")));
    }
    Ok(())
}

/// Finds and checks the three files. `vmlinux`: Firecracker wants the ELF
/// kernel, QEMU the bzImage.
pub fn locate(
    vmlinux: bool,
    kernel: Option<&Path>,
    initrd: Option<&Path>,
    rootfs: Option<&Path>,
) -> Result<GuestFiles, GuestFileError> {
    let dir = default_dir();
    let kernel = kernel
        .map(Path::to_path_buf)
        .unwrap_or_else(|| dir.join(if vmlinux { "vmlinux" } else { "vmlinuz" }));
    let initrd = initrd
        .map(Path::to_path_buf)
        .unwrap_or_else(|| dir.join("initrd.img"));
    let rootfs = rootfs
        .map(Path::to_path_buf)
        .unwrap_or_else(|| dir.join("rootfs.squashfs"));
    if vmlinux {
        check(
            "--kernel",
            &kernel,
            "an ELF kernel (vmlinux)",
            |h| h.starts_with(b"\x7fELF"),
            4,
        )?;
    } else {
        // bzImage: "HdrS" at 0x202; an ELF vmlinux also boots with QEMU's -kernel (PVH).
        check(
            "--kernel",
            &kernel,
            "a Linux kernel (bzImage or ELF vmlinux)",
            |h| h.starts_with(b"\x7fELF") || h.get(0x202..0x206) == Some(b"HdrS"),
            0x210,
        )?;
    }
    // newc cpio ("070701"), or a compressed one (gzip, xz, zstd, lz4).
    check(
        "--initrd",
        &initrd,
        "an initramfs (cpio archive)",
        |h| {
            h.starts_with(b"070701")
                || h.starts_with(&[0x1f, 0x8b])
                || h.starts_with(&[0xfd, b'7', b'z', b'X', b'Z'])
                || h.starts_with(&[0x28, 0xb5, 0x2f, 0xfd])
                || h.starts_with(&[0x02, 0x21, 0x4c, 0x18])
        },
        6,
    )?;
    check(
        "--rootfs",
        &rootfs,
        "a squashfs image",
        |h| h.starts_with(b"hsqs"),
        4,
    )?;
    Ok(GuestFiles {
        kernel,
        initrd,
        rootfs,
    })
}
