//! Where the cgroup hierarchies are and where this process sits in them.
//!
//! Everything is read through a [`Host`]: a root directory under which
//! `/proc/self/cgroup`, `/proc/self/mountinfo` and the cgroup mounts are
//! found. The real host is `/`; the tests point it at a fake cgroupfs in a
//! temp dir (as youki and Firecracker's jailer do), which is how the v2 logic
//! is tested on this hybrid machine.

use std::io;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    #[error("read {0}")]
    Read(PathBuf, #[source] io::Error),
    #[error("no cgroup hierarchy with controllers is mounted (neither v1 controllers nor cgroup2)")]
    NoHierarchy,
    #[error("this process is in no cgroup of the {0} hierarchy (/proc/self/cgroup)")]
    NotInHierarchy(String),
    #[error(
        "{0}: this process's cgroup {1} is outside the mount (mount root {2}); is /sys/fs/cgroup a bind mount of another namespace?"
    )]
    OutsideMount(PathBuf, String, String),
}

/// The filesystem seam: all paths the tool reads or writes are under `root`.
#[derive(Debug, Clone)]
pub struct Host {
    pub root: PathBuf,
}

impl Default for Host {
    fn default() -> Self {
        Host {
            root: PathBuf::from("/"),
        }
    }
}

impl Host {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Host { root: root.into() }
    }

    /// `p` (absolute on the host) under this host's root.
    pub fn path(&self, p: &Path) -> PathBuf {
        self.root.join(p.strip_prefix("/").unwrap_or(p))
    }

    fn read(&self, p: &str) -> Result<String, DiscoverError> {
        let full = self.path(Path::new(p));
        std::fs::read_to_string(&full).map_err(|e| DiscoverError::Read(full, e))
    }
}

/// A mounted cgroup hierarchy and this process's place in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    pub v2: bool,
    /// v1: the controllers of this mount (`memory`, `cpu`+`cpuacct`...).
    /// v2: empty here (read per group from `cgroup.controllers`).
    pub controllers: Vec<String>,
    /// Mount point, under the host root.
    pub mount: PathBuf,
    /// This process's cgroup, as in /proc/self/cgroup (`/a/b`).
    pub own: String,
    /// The cgroup path the mount shows at its top (mountinfo field 4).
    pub mount_root: String,
}

impl Hierarchy {
    /// Directory of cgroup `path` (a path as in /proc/self/cgroup).
    pub fn dir_of(&self, path: &str) -> Option<PathBuf> {
        let rel = strip_cgroup_prefix(path, &self.mount_root)?;
        Some(if rel.is_empty() {
            self.mount.clone()
        } else {
            self.mount.join(rel)
        })
    }

    pub fn has(&self, c: &str) -> bool {
        self.controllers.iter().any(|x| x == c)
    }

    /// A short name for messages: `memory`, `cpu,cpuacct`, `v2`.
    pub fn name(&self) -> String {
        if self.v2 {
            "cgroup2".into()
        } else {
            self.controllers.join(",")
        }
    }
}

fn strip_cgroup_prefix<'a>(path: &'a str, root: &str) -> Option<&'a str> {
    let root = root.trim_end_matches('/');
    let rest = path.strip_prefix(root)?;
    if !(rest.is_empty() || rest.starts_with('/')) {
        return None;
    }
    Some(rest.trim_start_matches('/'))
}

/// All hierarchies of the host.
#[derive(Debug, Clone)]
pub struct Layout {
    /// v1 hierarchies with controllers (named ones like `name=systemd` left out).
    pub v1: Vec<Hierarchy>,
    pub v2: Option<Hierarchy>,
}

/// Which cgroup mode the host runs, for messages and the audit event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    V1,
    Hybrid,
    V2,
}

impl Layout {
    pub fn mode(&self) -> Mode {
        match (self.v1.is_empty(), self.v2.is_some()) {
            (false, true) => Mode::Hybrid,
            (false, false) => Mode::V1,
            (true, _) => Mode::V2,
        }
    }

    /// The v1 hierarchy that holds controller `c`.
    pub fn v1_with(&self, c: &str) -> Option<&Hierarchy> {
        self.v1.iter().find(|h| h.has(c))
    }
}

struct Mount {
    root: String,
    point: String,
    fstype: String,
    super_opts: String,
}

fn parse_mountinfo(text: &str) -> Vec<Mount> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let l: Vec<&str> = left.split_whitespace().collect();
        let r: Vec<&str> = right.split_whitespace().collect();
        if l.len() < 5 || r.len() < 3 {
            continue;
        }
        out.push(Mount {
            root: unescape(l[3]),
            point: unescape(l[4]),
            fstype: r[0].to_string(),
            super_opts: r[2].to_string(),
        });
    }
    out
}

/// mountinfo escapes space, tab, newline and backslash as \ooo.
fn unescape(s: &str) -> String {
    String::from_utf8_lossy(&sbx_core::escape::mountinfo_field(s)).into_owned()
}

/// Reads the layout of `host`.
pub fn discover(host: &Host) -> Result<Layout, DiscoverError> {
    let cg = host.read("/proc/self/cgroup")?;
    let mi = host.read("/proc/self/mountinfo")?;
    layout_from(host, &cg, &mi)
}

/// Builds the layout from the texts of /proc/self/cgroup and mountinfo.
pub fn layout_from(
    host: &Host,
    proc_cgroup: &str,
    mountinfo: &str,
) -> Result<Layout, DiscoverError> {
    // (controllers, path) from /proc/self/cgroup; v2 has hierarchy id 0 and
    // an empty controller list.
    let mut own_v1: Vec<(Vec<String>, String)> = Vec::new();
    let mut own_v2: Option<String> = None;
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if id == "0" && ctrls.is_empty() {
            own_v2 = Some(path.to_string());
        } else {
            let c: Vec<String> = ctrls
                .split(',')
                .filter(|c| !c.is_empty())
                .map(String::from)
                .collect();
            own_v1.push((c, path.to_string()));
        }
    }
    let mut layout = Layout {
        v1: Vec::new(),
        v2: None,
    };
    for m in parse_mountinfo(mountinfo) {
        match m.fstype.as_str() {
            "cgroup" => {
                let ctrls: Vec<String> = m
                    .super_opts
                    .split(',')
                    .filter(|o| is_v1_controller(o))
                    .map(String::from)
                    .collect();
                if ctrls.is_empty() || layout.v1.iter().any(|h| h.controllers == ctrls) {
                    continue;
                }
                let Some((_, own)) = own_v1.iter().find(|(c, _)| {
                    let mut a = c.clone();
                    let mut b = ctrls.clone();
                    a.sort();
                    b.sort();
                    a == b
                }) else {
                    return Err(DiscoverError::NotInHierarchy(ctrls.join(",")));
                };
                let h = Hierarchy {
                    v2: false,
                    controllers: ctrls,
                    mount: host.path(Path::new(&m.point)),
                    own: own.clone(),
                    mount_root: m.root.clone(),
                };
                if h.dir_of(&h.own).is_none() {
                    return Err(DiscoverError::OutsideMount(h.mount, h.own, h.mount_root));
                }
                layout.v1.push(h);
            }
            "cgroup2" if layout.v2.is_none() => {
                let Some(own) = own_v2.clone() else { continue };
                let h = Hierarchy {
                    v2: true,
                    controllers: Vec::new(),
                    mount: host.path(Path::new(&m.point)),
                    own,
                    mount_root: m.root.clone(),
                };
                if h.dir_of(&h.own).is_none() {
                    return Err(DiscoverError::OutsideMount(h.mount, h.own, h.mount_root));
                }
                layout.v2 = Some(h);
            }
            _ => {}
        }
    }
    if layout.v1.is_empty() && layout.v2.is_none() {
        return Err(DiscoverError::NoHierarchy);
    }
    Ok(layout)
}

fn is_v1_controller(opt: &str) -> bool {
    matches!(
        opt,
        "cpu"
            | "cpuacct"
            | "cpuset"
            | "memory"
            | "devices"
            | "freezer"
            | "net_cls"
            | "blkio"
            | "perf_event"
            | "net_prio"
            | "hugetlb"
            | "pids"
            | "rdma"
            | "misc"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID_CG: &str = "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/abc\n2:cpu,cpuacct:/x\n6:freezer:/\n0::/\n";
    const HYBRID_MI: &str = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn hybrid() {
        let l = layout_from(&Host::default(), HYBRID_CG, HYBRID_MI).unwrap();
        assert_eq!(l.mode(), Mode::Hybrid);
        assert_eq!(l.v1.len(), 4);
        let m = l.v1_with("memory").unwrap();
        assert_eq!(
            m.dir_of(&m.own).unwrap(),
            PathBuf::from("/sys/fs/cgroup/memory/process_api/abc")
        );
        let c = l.v1_with("cpuacct").unwrap();
        assert_eq!(
            c.dir_of(&c.own).unwrap(),
            PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/x")
        );
        assert_eq!(
            l.v2.as_ref().unwrap().mount,
            PathBuf::from("/sys/fs/cgroup/unified")
        );
    }

    #[test]
    fn pure_v2_with_a_bind_mounted_root() {
        let mi = "41 31 0:38 /user.slice /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        let cg = "0::/user.slice/user-1000.slice/session-2.scope\n";
        let l = layout_from(&Host::new("/tmp/fake"), cg, mi).unwrap();
        assert_eq!(l.mode(), Mode::V2);
        let h = l.v2.unwrap();
        assert_eq!(
            h.dir_of(&h.own).unwrap(),
            PathBuf::from("/tmp/fake/sys/fs/cgroup/user-1000.slice/session-2.scope")
        );
        let cg = "0::/system.slice\n";
        assert!(matches!(
            layout_from(&Host::default(), cg, mi),
            Err(DiscoverError::OutsideMount(..))
        ));
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape("/a\\040b"), "/a b");
    }
}
