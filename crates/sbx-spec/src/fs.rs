//! sbx-fs's flags.

use std::ffi::OsString;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{Argv, is_false, osv};

pub const TOOL: &str = "sbx-fs";

/// Default size of the fresh /tmp (and of the empty $HOME).
pub const DEFAULT_TMP_SIZE: &str = "512M";

/// Default of `--scan-limit`: entries one bind's search for protected
/// names may read.
pub const DEFAULT_SCAN_LIMIT: usize = 1_000_000;

/// What sbx-fs grants, hides and sets up: every flag but the command.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct FsSpec {
    /// Bind SRC read-only at DST (default: the same path).
    #[arg(long, value_name = "SRC[:DST]")]
    #[serde(with = "osv", skip_serializing_if = "Vec::is_empty")]
    pub ro: Vec<OsString>,

    /// Bind SRC writable at DST (default: the same path).
    #[arg(long, value_name = "SRC[:DST]")]
    #[serde(with = "osv", skip_serializing_if = "Vec::is_empty")]
    pub rw: Vec<OsString>,

    /// A fresh tmpfs at DST, SIZE bytes at most (default --tmp-size).
    #[arg(long, value_name = "DST[:SIZE]")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tmpfs: Vec<String>,

    /// Hide PATH (a host path, ~/path, or a name pattern such as .env.*).
    #[arg(long, value_name = "PATH")]
    #[serde(with = "osv", skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<OsString>,

    /// Working directory of the command inside the sandbox.
    #[arg(long, value_name = "DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chdir: Option<PathBuf>,

    /// Hostname inside the sandbox (new UTS namespace).
    #[arg(long, value_name = "NAME")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,

    /// Set K to V in the command's environment.
    #[arg(long, value_name = "K=V")]
    #[serde(with = "osv", skip_serializing_if = "Vec::is_empty")]
    pub setenv: Vec<OsString>,

    /// Remove K from the command's environment.
    #[arg(long, value_name = "K")]
    #[serde(with = "osv", skip_serializing_if = "Vec::is_empty")]
    pub unsetenv: Vec<OsString>,

    /// Start the command with an empty environment (before --setenv).
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub clearenv: bool,

    /// Pass the caller's variable NAME too, or every variable whose name
    /// starts with PREFIX (a secret-looking name only when named exactly).
    #[arg(long, value_name = "NAME|PREFIX*")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pass_env: Vec<String>,

    /// Pass the caller's whole environment (secrets included), not only
    /// the allowlist.
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub keep_env: bool,

    /// User id inside the sandbox (default: the caller's).
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,

    /// Group id inside the sandbox (default: the caller's).
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,

    /// Do not bind /usr, /bin, /sbin, /lib*, /etc.
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub no_system: bool,

    /// Drop the default deny list (the --deny entries still apply).
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub no_default_deny: bool,

    /// Show the .git directory named in DIR/gitdir through an overlay whose
    /// upper layer is DIR/git/upper: git can commit there, the host's .git is
    /// not written (sbx-gitguard run --stage makes DIR and imports it).
    #[arg(long, value_name = "DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub git_stage: Option<PathBuf>,

    /// Offer the invoking user's git user.name and user.email (their
    /// global git config; SUDO_USER's as root via sudo), and nothing else
    /// of it, as ~/.gitconfig in the sandbox's own $HOME tmpfs.
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub git_identity: bool,

    /// How many directory entries the search for protected names (.env,
    /// credentials*, .git, .claude ...) may read per bind; beyond it sbx-fs
    /// refuses to start (exit 125) rather than leave part of the tree
    /// unprotected.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_SCAN_LIMIT)]
    #[serde(skip_serializing_if = "is_default_scan_limit")]
    pub scan_limit: usize,

    /// Where control files created during the run (a new .claude/, .vscode/,
    /// .mcp.json ... in a writable bind) are moved at the end (default
    /// $XDG_STATE_HOME/sbx/quarantine or ~/.local/state/sbx/quarantine).
    /// It must exist, be the caller's alone and lie outside every writable
    /// bind, also through a bind mount alias (exit 125 otherwise).
    #[arg(long, value_name = "DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quarantine: Option<PathBuf>,

    /// Size limit of /tmp, /dev/shm and the $HOME tmpfs.
    #[arg(long, value_name = "SIZE", default_value = DEFAULT_TMP_SIZE)]
    #[serde(skip_serializing_if = "is_default_tmp_size")]
    pub tmp_size: String,

    /// A budget for the writable directory binds together: the bytes a run
    /// may add (beyond it writes fail with ENOSPC, alert
    /// write_quota_exceeded). Overlay mode: the binds are seen through an
    /// overlay over a tmpfs of SIZE, applied to the host when the run ends.
    #[arg(long, value_name = "SIZE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_quota: Option<String>,

    /// How many new inodes (files, directories, symlinks, copied-up
    /// directories, deletions) the budget allows (needs --write-quota;
    /// default 1000000).
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_inodes: Option<u64>,
}

fn is_default_scan_limit(n: &usize) -> bool {
    *n == DEFAULT_SCAN_LIMIT
}

fn is_default_tmp_size(s: &str) -> bool {
    s == DEFAULT_TMP_SIZE
}

impl Default for FsSpec {
    /// The defaults of sbx-fs's flags.
    fn default() -> Self {
        FsSpec {
            ro: Vec::new(),
            rw: Vec::new(),
            tmpfs: Vec::new(),
            deny: Vec::new(),
            chdir: None,
            hostname: None,
            setenv: Vec::new(),
            unsetenv: Vec::new(),
            clearenv: false,
            pass_env: Vec::new(),
            keep_env: false,
            uid: None,
            gid: None,
            no_system: false,
            no_default_deny: false,
            git_stage: None,
            git_identity: false,
            scan_limit: DEFAULT_SCAN_LIMIT,
            quarantine: None,
            tmp_size: DEFAULT_TMP_SIZE.into(),
            write_quota: None,
            write_inodes: None,
        }
    }
}

impl FsSpec {
    /// sbx-fs's flags for this spec (before `-- CMD`).
    pub fn args(&self) -> Vec<OsString> {
        Argv::default()
            .each("--rw", &self.rw)
            .each("--ro", &self.ro)
            .each("--tmpfs", &self.tmpfs)
            .each("--deny", &self.deny)
            .each("--pass-env", &self.pass_env)
            .switch("--keep-env", self.keep_env)
            .opt("--chdir", self.chdir.as_ref())
            .opt("--hostname", self.hostname.as_ref())
            .unless_default("--tmp-size", &self.tmp_size, DEFAULT_TMP_SIZE.into())
            .opt("--write-quota", self.write_quota.as_ref())
            .opt("--write-inodes", self.write_inodes.map(|n| n.to_string()))
            .opt("--git-stage", self.git_stage.as_ref())
            .switch("--clearenv", self.clearenv)
            .each("--unsetenv", &self.unsetenv)
            .each("--setenv", &self.setenv)
            .switch("--git-identity", self.git_identity)
            .opt("--uid", self.uid.map(|n| n.to_string()))
            .opt("--gid", self.gid.map(|n| n.to_string()))
            .switch("--no-system", self.no_system)
            .switch("--no-default-deny", self.no_default_deny)
            .unless_default("--scan-limit", &self.scan_limit, DEFAULT_SCAN_LIMIT)
            .opt("--quarantine", self.quarantine.as_ref())
            .done()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_round_trips() {
        let full = FsSpec {
            ro: vec!["/a".into(), "/b:/c".into()],
            rw: vec!["/w".into()],
            tmpfs: vec!["/cache:64M".into()],
            deny: vec![".env*".into()],
            chdir: Some("/w".into()),
            hostname: Some("h".into()),
            setenv: vec!["A=b=c".into()],
            unsetenv: vec!["X".into()],
            clearenv: true,
            pass_env: vec!["CARGO_*".into()],
            keep_env: true,
            uid: Some(0),
            gid: Some(7),
            no_system: true,
            no_default_deny: true,
            git_stage: Some("/tmp/s".into()),
            git_identity: true,
            scan_limit: 5,
            quarantine: Some("/q".into()),
            tmp_size: "1G".into(),
            write_quota: Some("2G".into()),
            write_inodes: Some(500_000),
        };
        crate::roundtrip::check(&full, full.args());
        crate::roundtrip::check(&FsSpec::default(), FsSpec::default().args());
        assert!(FsSpec::default().args().is_empty());
        assert_eq!(serde_json::to_string(&FsSpec::default()).unwrap(), "{}");
    }

    #[test]
    fn keys_are_the_long_flags() {
        let s = FsSpec {
            pass_env: vec!["A".into()],
            write_inodes: Some(3),
            ..FsSpec::default()
        };
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"pass-env":["A"],"write-inodes":3}"#
        );
    }
}
