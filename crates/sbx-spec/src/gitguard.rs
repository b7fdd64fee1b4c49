//! sbx-gitguard's `run` and `plants` flags as the chain uses them.

use std::ffi::OsString;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{Argv, is_false};

pub const TOOL: &str = "sbx-gitguard";

/// Default of `--lock-wait`.
pub const DEFAULT_LOCK_WAIT: &str = "2s";
/// Defaults of `--stage-max-objects` and `--stage-max-bytes`.
pub const DEFAULT_STAGE_MAX_OBJECTS: u64 = 1_000_000;
pub const DEFAULT_STAGE_MAX_BYTES: &str = "2G";
/// Default of `plants --max-entries`.
pub const DEFAULT_MAX_ENTRIES: u64 = 1_000_000;

/// The repository every subcommand works on.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct RepoSpec {
    /// The repository: the top of a work tree (main or linked) or a bare git dir.
    #[arg(long, value_name = "DIR")]
    pub repo: PathBuf,
    /// How long to wait for a concurrent git process's lock files to go.
    #[arg(long, value_name = "DURATION", default_value = DEFAULT_LOCK_WAIT)]
    #[serde(skip_serializing_if = "is_default_lock_wait")]
    pub lock_wait: String,
}

fn is_default_lock_wait(s: &str) -> bool {
    s == DEFAULT_LOCK_WAIT
}

impl Default for RepoSpec {
    fn default() -> Self {
        RepoSpec {
            repo: PathBuf::new(),
            lock_wait: DEFAULT_LOCK_WAIT.into(),
        }
    }
}

impl RepoSpec {
    fn push(&self, a: &mut Argv) {
        a.val("--repo", &self.repo).unless_default(
            "--lock-wait",
            &self.lock_wait,
            DEFAULT_LOCK_WAIT.into(),
        );
    }
}

/// How much an import may read from a git stage.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct StageLimits {
    /// Most files and objects an import reads from a stage.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_STAGE_MAX_OBJECTS)]
    #[serde(skip_serializing_if = "is_default_objects")]
    pub stage_max_objects: u64,
    /// Most bytes of object files (loose objects and packs) an import reads
    /// from a stage, and most bytes the new objects inflate to.
    #[arg(long, value_name = "SIZE", default_value = DEFAULT_STAGE_MAX_BYTES)]
    #[serde(skip_serializing_if = "is_default_bytes")]
    pub stage_max_bytes: String,
}

fn is_default_objects(n: &u64) -> bool {
    *n == DEFAULT_STAGE_MAX_OBJECTS
}

fn is_default_bytes(s: &str) -> bool {
    s == DEFAULT_STAGE_MAX_BYTES
}

impl Default for StageLimits {
    fn default() -> Self {
        StageLimits {
            stage_max_objects: DEFAULT_STAGE_MAX_OBJECTS,
            stage_max_bytes: DEFAULT_STAGE_MAX_BYTES.into(),
        }
    }
}

impl StageLimits {
    fn push(&self, a: &mut Argv) {
        a.unless_default(
            "--stage-max-objects",
            &self.stage_max_objects,
            DEFAULT_STAGE_MAX_OBJECTS,
        )
        .unless_default(
            "--stage-max-bytes",
            &self.stage_max_bytes,
            DEFAULT_STAGE_MAX_BYTES.into(),
        );
    }
}

/// `sbx-gitguard run`: every flag but the command.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct GitguardRunSpec {
    #[command(flatten)]
    #[serde(flatten)]
    pub repo: RepoSpec,
    /// Report and alert only; repair nothing.
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub alert_only: bool,
    /// Run the full connectivity check before and after the command (not
    /// only on signs of damage).
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub full: bool,
    /// Create a git stage DIR (named sbx-git-stage-*, must not exist) for
    /// sbx-fs --git-stage; after the command, import it and remove it.
    #[arg(long, value_name = "DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stage: Option<PathBuf>,
    #[command(flatten)]
    #[serde(flatten)]
    pub limits: StageLimits,
    /// Also do what `plants --dir DIR` does (repeatable), in this process:
    /// the plant check right after the command, before the repository's
    /// own (one process and one walk of the work tree fewer than `plants`
    /// as a layer of its own).
    #[arg(long = "plants", value_name = "DIR")]
    #[serde(rename = "plants", skip_serializing_if = "Vec::is_empty")]
    pub plants: Vec<PathBuf>,
    /// `plants --quarantine` for --plants.
    #[arg(long, value_name = "DIR", requires = "plants")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plants_quarantine: Option<PathBuf>,
    /// `plants --max-entries` for --plants.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_ENTRIES, requires = "plants")]
    #[serde(skip_serializing_if = "is_default_entries")]
    pub plants_max_entries: u64,
}

impl Default for GitguardRunSpec {
    fn default() -> Self {
        GitguardRunSpec {
            repo: RepoSpec::default(),
            alert_only: false,
            full: false,
            stage: None,
            limits: StageLimits::default(),
            plants: Vec::new(),
            plants_quarantine: None,
            plants_max_entries: DEFAULT_MAX_ENTRIES,
        }
    }
}

impl GitguardRunSpec {
    /// `run` and its flags (before `-- CMD`).
    pub fn args(&self) -> Vec<OsString> {
        let mut a = Argv::default();
        a.word("run");
        self.repo.push(&mut a);
        a.switch("--alert-only", self.alert_only)
            .switch("--full", self.full)
            .opt("--stage", self.stage.as_ref());
        self.limits.push(&mut a);
        a.each("--plants", &self.plants)
            .opt("--plants-quarantine", self.plants_quarantine.as_ref())
            .unless_default(
                "--plants-max-entries",
                &self.plants_max_entries,
                DEFAULT_MAX_ENTRIES,
            );
        a.done()
    }

    /// The plant check `--plants` asks for, as `plants` takes it.
    pub fn plants_spec(&self) -> Option<PlantsSpec> {
        (!self.plants.is_empty()).then(|| PlantsSpec {
            dirs: self.plants.clone(),
            quarantine: self.plants_quarantine.clone(),
            max_entries: self.plants_max_entries,
        })
    }
}

/// `sbx-gitguard plants`: every flag but the command.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct PlantsSpec {
    /// A writable directory to check (repeatable): every directory the
    /// command can write, at any depth.
    #[arg(long = "dir", value_name = "DIR", required = true)]
    #[serde(rename = "dir", skip_serializing_if = "Vec::is_empty")]
    pub dirs: Vec<PathBuf>,
    /// Where planted repositories are moved (default:
    /// $XDG_STATE_HOME/sbx/quarantine, else ~/.local/state/sbx/quarantine).
    #[arg(long, value_name = "DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quarantine: Option<PathBuf>,
    /// Most directory entries walked per scan; over it the run refuses to
    /// start (before) or fails with an alert (after), never silently.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_ENTRIES)]
    #[serde(skip_serializing_if = "is_default_entries")]
    pub max_entries: u64,
}

fn is_default_entries(n: &u64) -> bool {
    *n == DEFAULT_MAX_ENTRIES
}

impl Default for PlantsSpec {
    fn default() -> Self {
        PlantsSpec {
            dirs: Vec::new(),
            quarantine: None,
            max_entries: DEFAULT_MAX_ENTRIES,
        }
    }
}

impl PlantsSpec {
    /// `plants` and its flags (before `-- CMD`).
    pub fn args(&self) -> Vec<OsString> {
        let mut a = Argv::default();
        a.word("plants")
            .each("--dir", &self.dirs)
            .opt("--quarantine", self.quarantine.as_ref())
            .unless_default("--max-entries", &self.max_entries, DEFAULT_MAX_ENTRIES);
        a.done()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_round_trips() {
        let full = GitguardRunSpec {
            repo: RepoSpec {
                repo: "/r".into(),
                lock_wait: "5s".into(),
            },
            alert_only: true,
            full: true,
            stage: Some("/tmp/sbx-git-stage-1".into()),
            limits: StageLimits {
                stage_max_objects: 9,
                stage_max_bytes: "1M".into(),
            },
            plants: vec!["/r".into(), "/w".into()],
            plants_quarantine: Some("/q".into()),
            plants_max_entries: 7,
        };
        let args = full.args();
        assert_eq!(args[0], "run");
        assert_eq!(
            full.plants_spec(),
            Some(PlantsSpec {
                dirs: vec!["/r".into(), "/w".into()],
                quarantine: Some("/q".into()),
                max_entries: 7,
            })
        );
        crate::roundtrip::check(&full, args[1..].to_vec());
        let plain = GitguardRunSpec {
            repo: RepoSpec {
                repo: "/r".into(),
                ..RepoSpec::default()
            },
            ..GitguardRunSpec::default()
        };
        crate::roundtrip::check(&plain, plain.args()[1..].to_vec());
        assert_eq!(serde_json::to_string(&plain).unwrap(), r#"{"repo":"/r"}"#);

        let full = PlantsSpec {
            dirs: vec!["/a".into(), "/b".into()],
            quarantine: Some("/q".into()),
            max_entries: 3,
        };
        let args = full.args();
        assert_eq!(args[0], "plants");
        crate::roundtrip::check(&full, args[1..].to_vec());
        assert_eq!(
            serde_json::to_string(&full).unwrap(),
            r#"{"dir":["/a","/b"],"quarantine":"/q","max-entries":3}"#
        );
    }
}
