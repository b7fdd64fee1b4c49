//! The sandbox image: `sbx-container build` assembles a build context
//! (the committed Containerfile and a rootfs/ with the static sbx tools,
//! busybox-static, CA certificates, passwd and group), hashes it, and builds
//! it over the Engine API as `sbx-sandbox:<hash>` (and `sbx-sandbox:latest`).
//!
//! The context tar is reproducible: entries sorted, owner 0:0, mtime 0,
//! fixed modes; so its SHA-256 (the tag) depends on the inputs' bytes only.

use std::collections::BTreeMap;

use std::path::{Path, PathBuf};

use futures_util::StreamExt;
use sha2::{Digest, Sha256};

pub const CONTAINERFILE: &str = include_str!("../Containerfile");
pub const REPO: &str = "sbx-sandbox";
pub const LATEST: &str = "sbx-sandbox:latest";
/// The image may not exceed this (the budget).
pub const MAX_SIZE: u64 = 50 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("{what} {path}: {source}")]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path}: not a static executable (build the tools with RUSTFLAGS='-C target-feature=+crt-static')"
    )]
    NotStatic { path: PathBuf },
    #[error("--tools {0}: no sbx-* executables in it")]
    NoTools(PathBuf),
    #[error("image build failed: {0}")]
    Build(String),
    #[error("the built image is {size} bytes, over the {max} byte budget")]
    TooBig { size: u64, max: u64 },
    #[error(
        "image {image} not found on the engine (build it with `sbx-container build --tools DIR`, or name another with --image)"
    )]
    Missing { image: String },
    #[error("engine: {0}")]
    Engine(#[from] bollard::errors::Error),
}

/// One file of the context: path inside the tar, mode, content or link.
#[derive(Debug, Clone)]
enum Entry {
    File { mode: u32, data: Vec<u8> },
    Dir,
    Link(String),
}

pub struct Inputs {
    pub tools: PathBuf,
    pub busybox: PathBuf,
    pub ca_certs: PathBuf,
}

/// Files put into an image are read as every input is: a regular file
/// (never a FIFO, /dev/zero or a directory), at most 1 GiB, a termination
/// signal stops the read.
fn read(what: &'static str, p: &Path) -> Result<Vec<u8>, ImageError> {
    sbx_core::input::read_regular(p, 1 << 30).map_err(|source| ImageError::Read {
        what,
        path: p.to_path_buf(),
        source,
    })
}

/// Whether an ELF file has no program interpreter (statically linked).
pub fn is_static_elf(data: &[u8]) -> bool {
    if data.len() < 64 || &data[..4] != b"\x7fELF" || data[4] != 2 {
        return false;
    }
    let u16_at = |o: usize| u16::from_le_bytes([data[o], data[o + 1]]) as usize;
    let u64_at = |o: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&data[o..o + 8]);
        u64::from_le_bytes(b) as usize
    };
    let phoff = u64_at(32);
    let phentsize = u16_at(54);
    let phnum = u16_at(56);
    for i in 0..phnum {
        let o = phoff + i * phentsize;
        if o + 4 > data.len() {
            return false;
        }
        // PT_INTERP = 3
        if u32::from_le_bytes([data[o], data[o + 1], data[o + 2], data[o + 3]]) == 3 {
            return false;
        }
    }
    true
}

/// busybox's applet names (from `busybox --list`).
fn applets(busybox: &Path) -> Result<Vec<String>, ImageError> {
    let out = std::process::Command::new(busybox)
        .arg("--list")
        .output()
        .map_err(|source| ImageError::Read {
            what: "--busybox",
            path: busybox.to_path_buf(),
            source,
        })?;
    let mut v: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty() && !l.contains('/') && l != "busybox")
        .collect();
    v.sort();
    v.dedup();
    Ok(v)
}

fn entries(inp: &Inputs) -> Result<BTreeMap<String, Entry>, ImageError> {
    let mut m = BTreeMap::new();
    m.insert(
        "Containerfile".into(),
        Entry::File {
            mode: 0o644,
            data: CONTAINERFILE.as_bytes().to_vec(),
        },
    );
    for d in [
        "rootfs",
        "rootfs/bin",
        "rootfs/sbx",
        "rootfs/sbx/bin",
        "rootfs/etc",
        "rootfs/etc/ssl",
        "rootfs/etc/ssl/certs",
        "rootfs/tmp",
        "rootfs/proc",
        "rootfs/dev",
        "rootfs/sys",
        "rootfs/work",
    ] {
        m.insert(d.into(), Entry::Dir);
    }
    let bb = read("--busybox", &inp.busybox)?;
    if !is_static_elf(&bb) {
        return Err(ImageError::NotStatic {
            path: inp.busybox.clone(),
        });
    }
    m.insert(
        "rootfs/bin/busybox".into(),
        Entry::File {
            mode: 0o755,
            data: bb,
        },
    );
    for a in applets(&inp.busybox)? {
        m.insert(format!("rootfs/bin/{a}"), Entry::Link("busybox".into()));
    }
    m.insert(
        "rootfs/etc/ssl/certs/ca-certificates.crt".into(),
        Entry::File {
            mode: 0o644,
            data: read("--ca-certs", &inp.ca_certs)?,
        },
    );
    m.insert(
        "rootfs/etc/passwd".into(),
        Entry::File {
            mode: 0o644,
            data: b"root:x:0:0:root:/tmp:/bin/sh\nnobody:x:65534:65534:sandbox:/tmp:/bin/sh\n"
                .to_vec(),
        },
    );
    m.insert(
        "rootfs/etc/group".into(),
        Entry::File {
            mode: 0o644,
            data: b"root:x:0:\nnogroup:x:65534:\n".to_vec(),
        },
    );
    let rd = std::fs::read_dir(&inp.tools).map_err(|source| ImageError::Read {
        what: "--tools",
        path: inp.tools.clone(),
        source,
    })?;
    let mut n = 0;
    let mut names: Vec<_> = rd.flatten().map(|e| e.file_name()).collect();
    names.sort();
    for name in names {
        let Some(s) = name.to_str() else { continue };
        if !s.starts_with("sbx-") || s.ends_with(".d") || s.contains('.') {
            continue;
        }
        let p = inp.tools.join(s);
        if !p.is_file() {
            continue;
        }
        let data = read("--tools", &p)?;
        if !is_static_elf(&data) {
            return Err(ImageError::NotStatic { path: p });
        }
        m.insert(
            format!("rootfs/sbx/bin/{s}"),
            Entry::File { mode: 0o755, data },
        );
        n += 1;
    }
    if n == 0 {
        return Err(ImageError::NoTools(inp.tools.clone()));
    }
    Ok(m)
}

/// The reproducible context tar and its SHA-256 (hex).
pub fn context(inp: &Inputs) -> Result<(Vec<u8>, String), ImageError> {
    let m = entries(inp)?;
    let mut b = tar::Builder::new(Vec::new());
    b.mode(tar::HeaderMode::Deterministic);
    for (path, e) in &m {
        let mut h = tar::Header::new_gnu();
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        let io = |e: std::io::Error| ImageError::Build(format!("context tar: {e}"));
        match e {
            Entry::Dir => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(if path == "rootfs/tmp" { 0o1777 } else { 0o755 });
                h.set_size(0);
                b.append_data(&mut h, format!("{path}/"), std::io::empty())
                    .map_err(io)?;
            }
            Entry::File { mode, data } => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*mode);
                h.set_size(data.len() as u64);
                b.append_data(&mut h, path, &data[..]).map_err(io)?;
            }
            Entry::Link(t) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                b.append_link(&mut h, path, t).map_err(io)?;
            }
        }
    }
    let data = b
        .into_inner()
        .map_err(|e| ImageError::Build(format!("context tar: {e}")))?;
    let hash = hex(&Sha256::digest(&data));
    Ok((data, hash))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The tag for a context hash.
pub fn tag_for(hash: &str) -> String {
    format!("{REPO}:{}", &hash[..16])
}

/// Builds the image (unless a same-tag image exists) and tags it latest too.
/// Returns the tag and the image size in bytes.
pub async fn build(docker: &bollard::Docker, inp: &Inputs) -> Result<(String, u64), ImageError> {
    let (tar, hash) = context(inp)?;
    let tag = tag_for(&hash);
    if docker.inspect_image(&tag).await.is_err() {
        let opts = bollard::query_parameters::BuildImageOptionsBuilder::default()
            .dockerfile("Containerfile")
            .t(&tag)
            .rm(true)
            .forcerm(true)
            .build();
        // Progress on stderr: a first build takes a while, and a silent
        // wait looks like a hang. One line per Containerfile step.
        sbx_core::cli::stderr_line(&format!(
            "sbx-container build: building {tag} (once per context; later runs reuse it)"
        ));
        let mut s = docker.build_image(opts, None, Some(bollard::body_full(tar.into())));
        let mut last = String::new();
        while let Some(item) = s.next().await {
            let info = item.map_err(|e| ImageError::Build(e.to_string()))?;
            if let Some(err) = info.error_detail.and_then(|d| d.message) {
                return Err(ImageError::Build(err));
            }
            if let Some(st) = info.stream {
                let line = st.trim_end();
                // Docker says "Step 2/6 : COPY ...", Podman "STEP 2/6: COPY ...".
                if line.starts_with("Step ") || line.starts_with("STEP ") {
                    sbx_core::cli::stderr_line(&format!(
                        "sbx-container build: {}",
                        sbx_core::violations::escape(line)
                    ));
                }
                tracing::debug!("build: {line}");
                last = st;
            }
        }
        tracing::info!("build: {}", last.trim_end());
    }
    let (repo, t) = tag.split_once(':').unwrap_or((REPO, "latest"));
    let _ = t;
    let opts = bollard::query_parameters::TagImageOptionsBuilder::default()
        .repo(repo)
        .tag("latest")
        .build();
    docker.tag_image(&tag, Some(opts)).await?;
    let size = docker.inspect_image(&tag).await?.size.unwrap_or(0) as u64;
    if size > MAX_SIZE {
        return Err(ImageError::TooBig {
            size,
            max: MAX_SIZE,
        });
    }
    Ok((tag, size))
}

/// Checks that `image` exists on the engine (nothing is pulled: the sandbox
/// never reaches a registry on its own).
pub async fn ensure(docker: &bollard::Docker, image: &str) -> Result<(), ImageError> {
    match docker.inspect_image(image).await {
        Ok(_) => Ok(()),
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => Err(ImageError::Missing {
            image: image.to_string(),
        }),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_detection() {
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert!(!is_static_elf(&me), "test binaries are dynamic");
        if let Ok(bb) = std::fs::read("/bin/busybox") {
            // Debian's busybox-static.
            assert!(is_static_elf(&bb));
        }
        assert!(!is_static_elf(b"#!/bin/sh\n"));
    }
}
