//! sbx-gitguard: `.git` integrity protection, detection and repair.
//!
//! `run` snapshots a repository, runs a command under supervision, then
//! compares the repository with the snapshot and repairs what the command
//! tampered with (HEAD, refs, config and its includes, hooks, files planted
//! in the git dir, repository-shaped directories planted in the work tree),
//! for the main git dir, linked worktrees, submodules and nested
//! repositories alike. `snapshot`, `check` and `repair` are the same steps
//! one at a time.

/// One line on stderr that never stops the run: with stderr gone (a pipe
/// whose reader left), `eprintln!` panics, which in `run` would skip the
/// import, the check and the repair after the command.
macro_rules! say {
    ($($t:tt)*) => {
        sbx_core::cli::stderr_line(&format!($($t)*))
    };
}

mod dirlist;
mod fsck;
mod fsutil;
mod gitconfig;
mod import;
mod index;
mod inprogress;
mod journal;
mod keep;
mod layout;
mod loosecache;
mod looseset;
mod objects;
mod plant;
mod reflog;
mod refs;
mod rules;
mod sig;
mod snapmac;
mod snapshot;
mod stage;
mod verify;
mod worktree;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use sbx_core::cli::CommonArgs;
use sbx_core::{Failure, Severity};
use serde_json::json;

use crate::verify::{Mode, Report};

pub const TOOL: &str = "sbx-gitguard";

pub const MAN: sbx_core::man::ManInfo = sbx_core::man::ManInfo {
    about: "sbx-gitguard protects a git repository from the command it runs. `run` snapshots the repository's git dirs (HEAD, every ref and packed-refs, config and the files it includes, hooks and a core.hooksPath directory, info/, the other protected files of the clean-up list, the list of top-level entries, the pack checksums, and the repository-shaped directories already in the work tree), runs the command under supervision, then verifies and repairs: a deleted, unreadable or out-of-refs HEAD is restored; deleted or rewritten refs are restored (from the snapshot, else from the reflog); config and included files are reverted and the keys that make git run programs are named; new or changed hooks are removed or restored; files planted in the git dir are removed; bare-repository-shaped directories and new .git dirs or foreign .git files planted in the work tree are removed; linked worktrees, submodules (.git/modules) and nested repositories get the same checks. The object store gets a fast structural check every time and a full connectivity check (the equivalent of git fsck) with --full or on any sign of damage. Every finding is an audit alert saying what was found and what was done. `snapshot`, `check` and `repair` do the same steps separately, for Makefile targets and hooks that run between an agent's turns. With --stage, commits made inside an sbx-fs sandbox land in a stage (the upper layer of an overlay over the whole .git; the host's .git stays untouched) that sbx-gitguard imports afterwards, object by object and ref by ref, by the rules of GIT STAGE; `import` does that step alone.",
    exit_status: "run: the command's status (128+N when it was killed by signal N, or when sbx-gitguard got termination signal N after the command ended and before its check: the plant check, the import and the check still run; 128+N without running the command when the signal came while the run was being set up after the snapshot); 125 when sbx-gitguard failed, when the repository was already damaged before the command (nothing is run then), or when the repository could not be brought back (objects gone, the git dir replaced, a repair that failed); 126/127 when the command could not be executed or found.\n\nsnapshot: 0, or 125 (not a repository, locked, already damaged, cannot write).\n\ncheck: 0 when nothing was found, 1 when something was (alerts or warnings), 125 on bad input.\n\nrepair: 0 when the repository matches the snapshot's rules afterwards (whether or not something was repaired), 125 when it could not be brought back or on bad input.",
    inherited_state: "run: the command inherits everything sbx-gitguard has (environment, working directory, namespaces, limits) except the audit log, which only a next sbx tool receives (SBX_AUDIT_FD). sbx-gitguard changes nothing before the command; it only reads the repository, and writes after the command has exited.",
    environment: "- XDG_STATE_HOME: where keep directories and the plants quarantine go by default (else ~/.local/state/sbx).\n- GIT_OBJECT_DIRECTORY: honoured when telling a planted repository from a directory git cannot use.",
    extra: &[
        (
            "COMMANDS",
            "run --repo DIR [--alert-only] [--full] [--lock-wait DURATION] [--stage DIR [--stage-max-objects N] [--stage-max-bytes SIZE]] [--plants DIR... [--plants-quarantine Q] [--plants-max-entries N]] -- CMD [ARGS...]\n\nSnapshot the repository, run CMD under supervision (signals forwarded, killed when sbx-gitguard dies), verify and repair, report. --alert-only reports and alerts but repairs nothing. --full checks the object store in full before and after the command (default: structurally, and in full on any sign of damage). --stage DIR creates a git stage for sbx-fs --git-stage DIR before the command and imports it after (see GIT STAGE), before the check. --plants DIR (repeatable) does in the same process what `plants --dir DIR -- CMD` inside `run` would do, with the same events and exit status: the plant inventory just before the command starts (over --plants-max-entries nothing is run, and a stage made for it is removed), and the plant check right after the command, before the import and the repository's check (a failure or a panic in it skips neither); --plants-quarantine and --plants-max-entries are plants' --quarantine and --max-entries. sbx-policy chain and scripts/sbx-run use it in a repository: one process and one walk of the work tree fewer.\n\nimport --repo DIR --stage DIR [--stage-max-objects N] [--stage-max-bytes SIZE]\n\nImport a git stage on its own (for a stage whose run died, or Makefile recipes), then remove it. Refused (125, the stage left as it is) when the stage is not 0700 and the caller's, names another git dir, or its lock is held by a live run.\n\nplants --dir DIR [--dir DIR]... [--quarantine Q] [--max-entries N] -- CMD [ARGS...]\n\nFor any project, git repository or not: list every entry of the --dir trees that git could take for a repository (as git's setup.c decides: a .git directory or a bare-shaped directory whose HEAD is valid and whose objects and refs, or those of the directory its commondir names, can be entered, executable files included; every .git file or symlink), run CMD, then move every new one into the quarantine Q (default $XDG_STATE_HOME/sbx/quarantine), put back a user's repository that was renamed away, restore one whose config, commondir or .git file changed and quarantine new hooks in it. The user's repositories are known by device, inode and content. Over --max-entries (default 1000000) the run refuses to start, or fails with 125 afterwards, with a plant_scan_budget alert.\n\nsnapshot --repo DIR -o FILE [--full] [--lock-wait DURATION]\n\nWrite a snapshot (0600, atomically) after checking the repository is sound, sealed with an HMAC-SHA256 under this user's key (gitguard-snapshot.key in the user's private registry directory, made on first use): check and repair refuse, with 125, a snapshot whose MAC is missing or does not verify, before any path in it is used (a forged one could name files anywhere to write or remove).\n\ncheck --repo DIR [--against FILE] [--full] [--json] [--lock-wait DURATION]\n\nWithout --against: damage, dangerous configuration keys, installed hooks and repository-shaped directories in the work tree. With --against: everything that differs from the snapshot. Changes nothing. --json prints one JSON object: repo, mode, ok, unrecoverable, full_check, findings (check, repo, path, found, action, severity, dangerous_keys, unrecoverable).\n\nrepair --repo DIR --against FILE [--full] [--json] [--lock-wait DURATION]\n\nBring the repository back to the snapshot by the rules of WHAT IS KEPT.\n\n--repo is the top of a work tree (main or linked) or a bare git dir; there is no search upwards. --lock-wait (default 2s) bounds the wait for a concurrent git process. With --config FILE, the settings of the sbx-gitguard section apply to the subcommand named first (keys are its long flag names).",
        ),
        (
            "AUDIT EVENTS",
            "git_snapshot (info); git_integrity, one per finding (alert for tampering, warn for what was kept but is notable, info for kept new commits), with check (head, refs, objects, config, hooks, extra_files, bare_repo, locks, repository), repo, path, found, action, dangerous_keys, unrecoverable; git_damaged_before (alert), damage found before the command; git_verified, the summary. With a git stage: git_stage_created (info) {stage, gitdir}; git_stage_reaped (warn) {stage, reason}; objects_imported (info) {written, present, not_needed, skipped_files, whiteouts_ignored}; object_refused (alert) {path, object, reason}; stage_entry_refused (alert) {path, reason}; stage_entry_dropped (alert; warn for info/, modules/, worktrees/) {path, reason}; ref_refused (alert) {ref, reason}; ref_imported (info) {ref, old, new, fast_forward}; ref_deleted (info) {ref, old, restore}; index_rebuilt (info or warn) {entries, reset_to_head, dropped}; index_unreadable (warn); index_hidden_cleared (alert) {skip_worktree, assume_unchanged, sparse_dirs, count}; import_recovered (warn) {journal, state, action: completed or undone; an undone import leaves the verified objects it wrote, closed under links, to git gc}; stage_limit_exceeded (alert) {reason, action}; git_stage_imported (info, alert when something was refused) {stage, objects_written, refs, head_changed, refused, exceeded}. With plants: git_plant_snapshot (info); git_repo_planted (alert) {path, kind, found, dangerous_keys, action, quarantine}; git_repo_moved (alert); git_repo_changed (alert) {restored, quarantined}; plant_scan_budget (alert); git_plants_checked (summary). Alerts of one name beyond 20 per import (info and warn events beyond 1000) become one event of that name {suppressed: N}. The events go to the audit log only: on stderr, `run` prints one readable line per alert or warning, and a failure is one line.",
        ),
        (
            "WHAT IS KEPT",
            "The user's own work is never thrown away. A ref that moved forward (its new commit descends from the snapshot's commit, e.g. new commits on the current branch) is kept and reported as kept. A ref is restored only when it was deleted, made unreadable, or rewritten away from the history the snapshot had; the commit it pointed to stays in the object store and the reflog, and the alert names it. New branches and tags are kept and reported (refs/replace/* are removed: they change what git shows). HEAD switched to another existing branch or commit is kept and reported; a HEAD that is missing, unreadable, outside refs/ or dangling is restored. New files in the work tree are not touched, except repository-shaped directories (HEAD + objects/ + refs/), new .git directories and .git files that point outside the repository's git dirs. A new submodule or linked worktree git dir is kept when it has no hooks and no dangerous config, removed otherwise. Object files the command deleted are linked back from the hard links taken before it; objects that are still gone or damaged are reported precisely (which object, which ref or object needed it) and make the repair fail (exit 125).",
        ),
        (
            "DANGEROUS CONFIGURATION KEYS",
            "Any change to a config file is reverted. The alert names the keys that make git run programs or trust other places: core.fsmonitor, core.hooksPath, core.sshCommand, core.pager, core.editor, core.askPass, core.gitProxy, core.worktree, core.attributesFile, credential.helper, filter.*, diff.*.textconv, diff.*.command, diff.external, merge.*.driver, alias.* starting with '!', submodule.*.update starting with '!', include.path, includeIf.*, protocol.*.allow, uploadpack.*, receive.*, sequence.editor, gpg.program, pager.*, remote.*.uploadpack, remote.*.receivepack, remote.*.vcs, mergetool.*.cmd, difftool.*.cmd, web.browser, browser.*.cmd, man.*.cmd, safe.directory. The list is data (rules.rs).",
        ),
        (
            "SNAPSHOT FILES",
            "A snapshot is JSON written 0600 by a rename (never half-written), with a format marker and version and the identity of the repository (the common git dir's path, device and inode). A snapshot of another repository, or of a git dir that was since replaced, is refused. Keep snapshot files where the command cannot write them.",
        ),
        (
            "OBJECTS",
            "The structural check, every time: each pack index (magic, version, size against its object count) and pack (header, object count, trailer against the checksum its index records); packs and indexes whose inode, size, mtime or ctime changed since the snapshot are checksummed in full (all of them with --full); every loose object verified in full (inflated to its end, size as its header says, nothing after the stream, hash equal to its name) at snapshot time and, afterwards, every new or changed one (by inode, size and ctime; with --stage, whose overlay keeps the command from writing object files, only in the fan-out directories whose own stat changed, and at snapshot time only what changed since an earlier staged run verified it, kept in the registry directory and dropped by any run without the overlay), a damaged one never read by libgit2 nor restored to (an object not stat'ed by this run is stat'ed, and read in full when it changed, before libgit2 first reads it); FIFOs, sockets and devices in a git dir removed before anything is read (a snapshot refuses them); loose objects of the snapshot that are gone and not packed; changed and new ref tips and HEAD resolve (a branch and HEAD to a commit). The full check reads every object reachable from every ref, HEAD and every ref of the snapshot, verifying its hash, and names each missing or damaged object with what needed it. Before the command, `run` keeps hard links to every pack file and loose object (in .sbx-gitguard-keep.PID inside the git dir, removed when the run ends): object files the command deletes or replaces are linked back and the full check must then pass. Files modified in place, and objects lost without kept links (repair between turns), make the repair fail (exit 125).",
        ),
        (
            "LOCKS",
            "Before a snapshot or a repair, sbx-gitguard waits up to --lock-wait for lock files of a concurrent git process (index.lock, HEAD.lock, config.lock, packed-refs.lock, refs/**.lock) to go, then fails with exit 125 saying which. After `run`'s command has exited, locks that remain were left by it and are removed.",
        ),
        (
            "GIT STAGE",
            "sbx-fs keeps .git/objects, .git/refs and .git/HEAD read-only inside the sandbox; with a stage, commits made there go to the stage, which sbx-gitguard imports afterwards. run --stage DIR creates, for a repository with a plain .git directory: DIR (0700, the caller's; its name must start with sbx-git-stage-, it must not exist, and not be inside the work tree), DIR/gitdir (the canonical path of the .git directory), DIR/git/upper and DIR/git/work (empty, 0700: the upper and work dirs of one overlay over the whole .git, whose lower layer is the real .git) and DIR/.lock (flocked while the run lives). sbx-fs --git-stage DIR mounts that overlay (with userxattr in a user namespace) and keeps .git/config and .git/hooks read-only on top: every git command works inside (checkout -b, switch, rebase, gc included) and the host's .git is never written by the sandbox. The stage is built under a temporary name with its lock held, then renamed into place; it is removed after the import, on error paths too; and each run --stage removes the sibling sbx-git-stage-* directories of the same uid whose lock is free (their sbx-gitguard died).\n\nImport, never a blind copy: only objects/, refs/, HEAD, packed-refs, index and the state of an operation in progress are read from DIR/git/upper; everything else there (config, hooks, logs, info/, modules/, worktrees/) never reaches the host (stage_entry_dropped: an alert for hooks, config and commondir, whose contents would run commands; a warning for info/, modules/ and worktrees/). A merge, rebase, cherry-pick/revert sequence or bisect the sandbox left stopped (MERGE_HEAD, MERGE_MSG, MERGE_MODE, ORIG_HEAD, CHERRY_PICK_HEAD, REVERT_HEAD, REBASE_HEAD, AUTO_MERGE, SQUASH_MSG, BISECT_*, rebase-merge/, rebase-apply/, sequencer/, refs/bisect/*, refs/rewritten/*) comes over so the next call goes on with it, each file checked against what git writes there (object ids that exist after the import, refs inside the repository, todo lists of git's own commands, bounded sizes, no control characters where git writes none, regular files only); an exec line in a todo list is code: the whole state is refused; whatever is not carried is said once (stage_entry_dropped, alert), and objects/ or refs/ replaced by a symlink are refused, never followed. Objects: loose objects and packs (with their index) are copied without following symlinks to a private directory and read through libgit2 with hash verification into a quarantine (a private repository that sees the real store as an alternate); they move into the real object store only when an accepted ref or HEAD needs them with a complete history, or, for a blob, when the sandbox's index names it at a path git fsck --strict accepts as a tree entry (a .gitmodules blob checked as one; a .git, . or .. component refused); a blob nothing names does not come in (git checks a .gitmodules only through what names it), so nothing refused leaves a broken link behind and nothing unchecked reaches the store. Whiteouts (objects git gc pruned) are ignored: nothing is ever deleted. Symlinks and special files are refused (stage_entry_refused), objects that do not hash to their names (object_refused). Refs: each file of refs/ is an update; a whiteout is a deletion (resolved against the sandbox's packed-refs); an opaque or whited-out directory deletes the host's loose refs below it; each entry the sandbox's packed-refs adds, changes or drops against the host's is an update too. Accepted: names valid by git's rules under refs/heads, refs/tags, refs/remotes, refs/notes or refs/stash, and refs/bisect or refs/rewritten as commit ids; a hex id of an existing object with a complete history (a commit for refs/heads), or ref: to a valid name in those namespaces; a new tag (an existing tag is never moved or deleted); deleting a branch that is checked out nowhere (ref_deleted names the old id and the command that restores it); a loose ref removed by hand over a stale packed value is a deletion, never a rewind. Non-fast-forward branch updates (amend, rebase) are allowed and logged. Written with libgit2, reflog message 'sbx-gitguard: from sandbox SBX_ID'. HEAD: ref: refs/heads/NAME of an existing branch, or the id of an existing commit (detached); anything else (garbage, removed, a symlink) is refused and HEAD stays. Every refusal is a ref_refused alert and changes nothing. The index the sandbox wrote replaces the host's (so git status on the host shows what it showed inside) once libgit2 reads it, rewritten without cached trees and with entries whose blob did not come in, or that git fsck --strict refuses as tree entries (object_refused, path 'index: PATH'), reset to HEAD's version; skip-worktree and assume-unchanged bits are cleared, sparse directory entries dropped and every entry's stat data zeroed, so nothing the sandbox hid escapes git status and git diff on the host (index_hidden_cleared alert); an index libgit2 cannot read is not taken. The import is a transaction: decided first, then a journal in .git/sbx-gitguard-import (the objects about to be written, then every ref's old and new value, HEAD's and the prepared index, each fsync'd) before refs, HEAD and the index are applied; run and import complete a committed journal a killed sbx-gitguard left, or undo a pending one, which leaves its verified objects to git gc (import_recovered). Over --stage-max-objects (default 1000000) or --stage-max-bytes (default 2G) nothing is imported (stage_limit_exceeded) and run exits 125.",
        ),
        (
            "EXAMPLES",
            "sbx-gitguard --audit-log audit.jsonl run --repo ~/src/app -- sbx-fs --rw ~/src/app -- agent\n\nS=$XDG_RUNTIME_DIR/sbx-git-stage-$$; sbx-gitguard run --repo ~/src/app --stage $S -- sbx-fs --git-stage $S --rw ~/src/app -- agent\n\nsbx-gitguard snapshot --repo . -o /var/lib/agent/snap.json\n\nsbx-gitguard check --repo . --against /var/lib/agent/snap.json --json\n\nsbx-gitguard repair --repo . --against /var/lib/agent/snap.json",
        ),
    ],
};

#[derive(Parser, Debug)]
#[command(
    name = "sbx-gitguard",
    version,
    about = "Snapshot, verify and repair a git repository around an untrusted command"
)]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Snapshot the repository, run CMD under supervision, verify, repair, report.
    Run(RunArgs),
    /// Write a snapshot of the repository to FILE.
    Snapshot(SnapshotArgs),
    /// Check the repository (against a snapshot, when given); change nothing.
    Check(CheckArgs),
    /// Compare the repository with a snapshot and repair it.
    Repair(RepairArgs),
    /// Import a git stage (commits made in a sandbox) into the repository,
    /// then remove the stage.
    Import(ImportArgs),
    /// Snapshot the repositories of writable directories, run CMD, then
    /// quarantine every repository planted there (for any project, git or not).
    Plants(plant::PlantsArgs),
}

/// The repository and import limits are flags of `run` too (sbx-spec).
pub use sbx_spec::gitguard::{RepoSpec as RepoArgs, StageLimits as StageLimitArgs};

fn stage_limits(a: &StageLimitArgs) -> Result<import::Limits, Failure> {
    let b = sbx_core::units::parse_size(&a.stage_max_bytes)
        .map_err(|e| Failure::new(format!("--stage-max-bytes {}: {e}", a.stage_max_bytes)))?;
    Ok(import::Limits {
        max_objects: a.stage_max_objects,
        max_bytes: b,
    })
}

#[derive(Args, Debug)]
pub struct ImportArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// The stage directory (named sbx-git-stage-*).
    #[arg(long, value_name = "DIR")]
    pub stage: PathBuf,
    #[command(flatten)]
    pub limits: StageLimitArgs,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The repository, the stage and the checks (the flags; sbx-spec).
    #[command(flatten)]
    pub spec: sbx_spec::GitguardRunSpec,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<OsString>,
}

#[derive(Args, Debug)]
pub struct SnapshotArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// Where to write the snapshot (created 0600, atomically).
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: PathBuf,
    /// Check the repository in full (the equivalent of git fsck) before
    /// taking the snapshot, not only structurally.
    #[arg(long)]
    pub full: bool,
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// Compare with this snapshot.
    #[arg(long, value_name = "FILE")]
    pub against: Option<PathBuf>,
    /// Run the full connectivity check (the equivalent of git fsck).
    #[arg(long)]
    pub full: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct RepairArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// The snapshot to bring the repository back to.
    #[arg(long, value_name = "FILE")]
    pub against: PathBuf,
    /// Run the full connectivity check.
    #[arg(long)]
    pub full: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn main() -> ! {
    sbx_core::cli::run_main(TOOL, || {
        let cli: Cli = sbx_core::cli::parse(TOOL)?;
        sbx_core::cli::init(TOOL, &cli.common)?;
        // We read repositories owned by others (root guarding a user's
        // repository): libgit2's ownership check must not refuse them.
        // SAFETY: libgit2's owner-check flag is an unsynchronised global:
        // this is start-up, before any thread exists or any libgit2 call.
        unsafe {
            let _ = git2::opts::set_verify_owner_validation(false);
        }
        // The checks judge the repository by its own files: libgit2 reads no
        // system, XDG or global configuration (the user's ~/.gitconfig could
        // be a FIFO, which would block the open for ever, or change what
        // libgit2 reads).
        for level in [
            git2::ConfigLevel::System,
            git2::ConfigLevel::XDG,
            git2::ConfigLevel::Global,
            git2::ConfigLevel::ProgramData,
        ] {
            // SAFETY: as above: start-up, no thread, no libgit2 call yet.
            unsafe {
                let _ = git2::opts::set_search_path(level, "");
            }
        }
        // Objects read from a git stage must hash to their names (the
        // default already; said explicitly), and refs must name objects
        // that exist.
        git2::opts::strict_hash_verification(true);
        git2::opts::strict_object_creation(true);
        // Stoppable while reading; see sig.rs for what holds them back.
        sig::allow();
        match cli.command {
            Command::Run(a) => run(a),
            Command::Snapshot(a) => cmd_snapshot(a),
            Command::Check(a) => cmd_check(a),
            Command::Repair(a) => cmd_repair(a),
            Command::Import(a) => cmd_import(a),
            Command::Plants(a) => plant::cmd_plants(a),
        }
    })
}

fn lock_wait(a: &RepoArgs) -> Result<Duration, Failure> {
    sbx_core::units::parse_duration(&a.lock_wait)
        .map_err(|e| Failure::new(format!("--lock-wait {}: {e}", a.lock_wait)))
}

fn open_layout(a: &RepoArgs) -> Result<layout::Layout, Failure> {
    Ok(layout::find(&a.repo)?)
}

/// Waits for a concurrent git process; fails when it does not finish.
fn ensure_unlocked(l: &layout::Layout, wait: Duration) -> Result<(), Failure> {
    let units = l.units(&Default::default());
    let left = verify::wait_locks(&units, wait);
    if let Some(p) = left.first() {
        return Err(Failure::new(format!(
            "{}: repository is locked by a concurrent git process ({} still exists after {:?}); try again when it has finished",
            l.common_dir.display(),
            p.display(),
            wait
        )));
    }
    Ok(())
}

/// Takes a snapshot after checking the repository is sound; damage found
/// now is reported (alerts) and refused.
/// The snapshot, checked. `staged`: the git dir a stage covers, whose
/// loose objects verified by an earlier run are not read again (see
/// [`loosecache`]; `--full` reads them all).
fn take_snapshot(
    l: &layout::Layout,
    full: bool,
    staged: Option<&Path>,
) -> Result<snapshot::Snapshot, Failure> {
    // Nothing below writes the repository: each directory is stat'ed
    // once by all the scans of the snapshot.
    let _settled = dirlist::Settled::begin();
    // Not while a run without a stage may be writing the objects; and
    // saved only if none began or ended since it was loaded.
    let generation = staged.map(loosecache::generation);
    let usable = generation.is_some_and(|g| g != loosecache::Generation::Busy);
    let cache: BTreeMap<PathBuf, _> = staged
        .filter(|_| !full && usable)
        .map(|g| (g.to_path_buf(), loosecache::load(g)))
        .into_iter()
        .collect();
    // Fan-out directories unchanged since the cache was saved are not
    // listed again, by any scan of this process (dirlist's rule).
    for (g, c) in &cache {
        for (name, seen) in &c.dirs {
            dirlist::seed(&g.join("objects").join(name), seen);
        }
    }
    let (mut snap, checked) =
        snapshot::capture_checked(l, |units| verify::assess(l, units, full, &cache))?;
    let mut report = verify::Report::default();
    let mut stats = BTreeMap::new();
    for (r, s) in checked {
        report.absorb(r);
        stats.extend(s);
    }
    if let Some(first) = report
        .findings
        .iter()
        .find(|f| f.severity == Severity::Alert)
    {
        for f in &report.findings {
            audit("git_damaged_before", Severity::Alert, finding_fields(f));
        }
        return Err(Failure::new(format!(
            "{}: repository is already damaged ({}{}); nothing was changed — repair it by hand (git fsck) first",
            l.common_dir.display(),
            first.found,
            if report.findings.len() > 1 {
                format!(", and {} more in the audit log", report.findings.len() - 1)
            } else {
                String::new()
            }
        )));
    }
    for u in &mut snap.units {
        let Some(s) = stats.remove(&u.path) else {
            continue;
        };
        u.packs = s.packs;
        u.loose = s.loose;
        if staged == Some(u.path.as_path())
            && usable
            && generation == Some(loosecache::generation(&u.path))
        {
            // (The directories are shared, not copied.)
            let now = loosecache::Cache {
                objs: u.loose.clone(),
                dirs: s.loose_dirs.clone(),
            };
            loosecache::save(&u.path, &now, cache.get(&u.path));
        }
        // The git dirs the stage's overlay covers (the main one and its
        // modules/): the command writes the overlay, never these files.
        if staged.is_some_and(|g| u.path.starts_with(g)) {
            u.same_dirs = Some(s.loose_dirs);
        }
    }
    Ok(snap)
}

/// A path as an audit field: as it is when it is UTF-8, else escaped
/// (`\xNN`, [`sbx_core::escape::path`]). serde refuses a path that is not UTF-8 and
/// `json!` then panics (in `plants`, a repository planted under such a name
/// stopped the check half-way and left every later plant in place).
pub(crate) fn jpath(p: &Path) -> serde_json::Value {
    match p.to_str() {
        Some(s) => s.into(),
        None => sbx_core::escape::path(p).into(),
    }
}

/// Appends one event to the audit log (one write, O_APPEND, as sbx-core
/// does) without echoing it on stderr: a failure must stay one line there,
/// and findings are printed readably by the commands themselves.
fn audit(event: &str, severity: Severity, fields: serde_json::Value) {
    tracing::debug!(event, %fields, "audit");
    let Some(a) = sbx_core::audit::get() else {
        return;
    };
    // Chained like every line (sbx_core::auditchain).
    a.record(event, severity, fields);
}

fn finding_fields(f: &verify::Finding) -> serde_json::Value {
    let mut v = serde_json::to_value(f).unwrap_or(json!({}));
    if let Some(m) = v.as_object_mut() {
        m.remove("severity");
    }
    v
}

fn emit_report(r: &Report, mode: Mode) {
    for f in &r.findings {
        audit("git_integrity", f.severity, finding_fields(f));
    }
    let sev = if r.unrecoverable().is_some() || r.problems() > 0 {
        Severity::Alert
    } else {
        Severity::Info
    };
    audit(
        "git_verified",
        sev,
        json!({
            "mode": format!("{mode:?}").to_lowercase(),
            "findings": r.findings.len(),
            "problems": r.problems(),
            "unrecoverable": r.unrecoverable().is_some(),
            "full_check": r.full_check,
        }),
    );
}

fn text_line(f: &verify::Finding) -> String {
    let sev = match f.severity {
        Severity::Alert => "alert",
        Severity::Warn => "warn",
        Severity::Info => "info",
    };
    let mut s = format!("{sev}: {}: {}", f.check, f.found);
    if let Some(p) = &f.path
        && !f.found.contains(p.as_str())
    {
        s.push_str(&format!(" [{p}]"));
    }
    if !f.dangerous_keys.is_empty() {
        s.push_str(&format!(" (dangerous: {})", f.dangerous_keys.join(", ")));
    }
    s.push_str(&format!(" -> {}", f.action));
    // Names come from the repository the command wrote: no control
    // character reaches the terminal.
    sbx_core::escape::terminal(&s).into_owned()
}

fn print_report(r: &Report, l: &layout::Layout, json_out: bool, mode: Mode) {
    if json_out {
        let v = json!({
            "repo": l.common_dir,
            "mode": format!("{mode:?}").to_lowercase(),
            "ok": r.problems() == 0,
            "unrecoverable": r.unrecoverable().is_some(),
            "full_check": r.full_check,
            "findings": r.findings,
        });
        println!("{v}");
    } else {
        for f in &r.findings {
            println!("{}", text_line(f));
        }
        if r.findings.is_empty() {
            println!("ok: {}", sbx_core::escape::path(&l.common_dir));
        }
    }
}

fn run(args: RunArgs) -> Result<i32, Failure> {
    let a = &args.spec;
    let wait = lock_wait(&a.repo)?;
    let limits = stage_limits(&a.limits)?;
    let l = open_layout(&a.repo)?;
    // An import a killed sbx-gitguard left half done is finished (or
    // undone) before anything else looks at the repository.
    journal::recover_at_start(&l.common_dir)?;
    // The stage's preconditions before anything is done.
    let stage_plan = match &a.stage {
        Some(dir) => {
            let dir = stage::resolve(dir)?;
            let git_dir = stage::plain_git_dir(&l)?;
            stage::outside_work_tree(&dir, &l)?;
            if std::fs::symlink_metadata(&dir).is_ok() {
                return Err(stage::StageError::Exists(dir).into());
            }
            Some((dir, git_dir))
        }
        None => None,
    };
    ensure_unlocked(&l, wait)?;
    let staged = stage_plan.as_ref().map(|(_, g)| g.as_path());
    let snap = take_snapshot(&l, a.full, staged)?;
    // A command without a stage's overlay over a git dir can write its
    // object files in place: what earlier staged runs verified there is
    // not taken on trust during it nor after it (loosecache.rs). Held to
    // the end of this function.
    let _unstaged: Vec<loosecache::Unstaged> = snap
        .units
        .iter()
        .filter(|u| staged != Some(u.path.as_path()))
        .map(|u| loosecache::Unstaged::begin(&u.path))
        .collect();
    audit(
        "git_snapshot",
        Severity::Info,
        json!({ "repo": jpath(&l.common_dir), "units": snap.units.len() }),
    );
    let stage = match &stage_plan {
        Some((dir, git_dir)) => {
            for p in stage::reap_siblings(dir) {
                audit(
                    "git_stage_reaped",
                    Severity::Warn,
                    json!({ "stage": jpath(&p), "reason": "left by an sbx-gitguard that died (its lock was free)" }),
                );
            }
            let s = stage::Stage::create(dir, git_dir)?;
            audit(
                "git_stage_created",
                Severity::Info,
                json!({ "stage": jpath(&s.paths.dir), "gitdir": jpath(git_dir) }),
            );
            Some(s)
        }
        None => None,
    };

    // From here to the end of the import, termination signals are held
    // back: one that comes before the command starts stops the run there,
    // the supervisor forwards those that come while it runs, and one that
    // comes after it ended becomes the exit status. The check afterwards
    // is stoppable again.
    let hold = sig::Hold::new();
    // Hard links to the object files, so objects the command deletes can
    // be linked back (repair mode only). Not for the git dirs a stage
    // covers: the sandbox writes the stage, never their objects (O(objects)
    // links saved on every run, issue 19).
    let keeps: std::collections::BTreeMap<PathBuf, keep::Keep> = if a.alert_only {
        Default::default()
    } else {
        snap.units
            .iter()
            .filter(|u| u.kind.has_objects())
            .filter(|u| !staged.is_some_and(|g| u.path.starts_with(g)))
            .filter_map(|u| match keep::Keep::create(&u.path, &u.loose) {
                Ok(k) => Some((u.path.clone(), k)),
                Err(e) => {
                    tracing::warn!(repo = %u.path.display(), "cannot keep links to the objects: {e}");
                    None
                }
            })
            .collect()
    };
    // Linking changed the ctime of the pack files: record their stat again
    // (same inode and size) so unchanged packs are not rehashed afterwards.
    let mut snap = snap;
    for u in &mut snap.units {
        if keeps.contains_key(&u.path) {
            objects::restat(&u.path.join("objects"), &mut u.packs);
            objects::restat_loose(&u.path.join("objects"), &mut u.loose);
        }
    }
    // --plants: `plants` in this process, its inventory taken of what the
    // command will find (the keep links included), just before it starts.
    // Its walks list the work tree through the same memo as the snapshot's.
    let plants = match a.plants_spec().map(|p| plant::Plants::start(&p)) {
        Some(Err(e)) => {
            // Over budget: nothing runs, and the stage made for it goes.
            if let Some(st) = stage {
                let _ = st.remove();
            }
            return Err(e);
        }
        p => p.and_then(Result::ok),
    };
    // A termination signal held since the hold began (the keep links, the
    // plant inventory): the command is not started, as `plants` killed
    // during its inventory did not start it.
    if let Some(sig) = hold.take() {
        drop(keeps);
        if let Some(st) = stage {
            let _ = st.remove();
        }
        return Ok(128 + sig);
    }
    let mut cmd = sbx_core::supervise::command(&args.cmd, None)?;
    let keep: Vec<i32> = sbx_core::audit::get()
        .and_then(|au| au.handoff(&args.cmd[0], &mut cmd))
        .into_iter()
        .collect();
    let mut code = {
        let mut sup = sbx_core::supervise::Supervisor::spawn(cmd, &keep)?;
        sup.run_to_end()
            .map_err(|e| Failure::new(format!("waiting for the command: {e}")))?
    };
    // The plant check before the stage's import and the repository's
    // check, as `plants` between `run` and the command had it, with the
    // signals still held. Nothing in it stops what follows: a panic is a
    // failed check (exit 125).
    let plants_failed = plants.and_then(|p| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.finish())).unwrap_or_else(|_| {
            Some(Failure::new(
                "planted repositories: the check stopped half-way (see the audit log)",
            ))
        })
    });

    // The stage first: what it brings in is expected by the check below.
    let mut exceeded = None;
    let mut import_failed = None;
    if let Some(st) = &stage {
        let (_, git_dir) = stage_plan.as_ref().unwrap();
        let outcome = import_stage(git_dir, st, &limits);
        // A failed import still gets the check and repair below.
        match outcome {
            Ok(outcome) => {
                expect_imported(&mut snap, git_dir, &outcome);
                exceeded = outcome.exceeded;
            }
            Err(e) => import_failed = Some(e),
        }
    }
    // The check below does not look at the stage (it is outside the work
    // tree): it is removed meanwhile, on a second thread (an unlink or
    // rmdir per entry of the overlay's layers, on the stage's file system:
    // a tenth of a staged run, issue 19). The thread inherits the signals
    // blocked here: termination signals are never its to take. When no
    // thread can be had (the caller's process limit, which the command
    // may have filled), the stage goes here and now, unreported as on any
    // error path (its Drop), and the check still runs (attacker helper-54:
    // a panic there skipped the check).
    let removal = stage.and_then(|st| {
        let dir = st.paths.dir.clone();
        std::thread::Builder::new()
            .spawn(move || st.remove())
            .ok()
            .map(|t| (dir, t))
    });
    // A termination signal that came since the command ended (during the
    // plant check or the import) is taken and becomes the exit status
    // (128+N, as the `plants` layer killed by it was): it is not
    // delivered before the check, which it would skip. The check is
    // stoppable again.
    if let Some(sig) = hold.take() {
        code = 128 + sig;
    }
    drop(hold);
    let mode = if a.alert_only {
        Mode::AlertOnly
    } else {
        Mode::Repair
    };
    let report = verify::verify(&l, &snap, mode, a.full, wait, &keeps);
    drop(keeps);
    emit_report(&report, mode);
    if report.unrecoverable().is_none() || mode != Mode::Repair {
        for f in report
            .findings
            .iter()
            .filter(|f| f.severity != Severity::Info)
        {
            say!("{TOOL}: {}", text_line(f));
        }
    }
    if let Some((dir, removing)) = removal {
        let failed = match removing.join() {
            Ok(r) => r.err().map(|e| e.to_string()),
            Err(_) => Some("the removal stopped half-way".to_string()),
        };
        if let Some(e) = failed {
            say!(
                "{TOOL}: warn: cannot remove the stage {}: {e}",
                dir.display()
            );
        }
    }
    if mode == Mode::Repair
        && let Some(f) = report.unrecoverable()
    {
        return Err(Failure::new(format!(
            "repository could not be brought back: {}: {} ({})",
            f.check, f.found, f.action
        )));
    }
    if let Some(e) = import_failed {
        return Err(e);
    }
    if let Some(e) = exceeded {
        return Err(Failure::new(format!(
            "git stage not imported: {e}; the command's commits were dropped"
        )));
    }
    if let Some(e) = plants_failed {
        return Err(e);
    }
    Ok(code)
}

/// Imports a stage, logging its events (alerts also on stderr).
fn import_stage(
    git_dir: &Path,
    st: &stage::Stage,
    limits: &import::Limits,
) -> Result<import::Outcome, Failure> {
    let sbx_id = sbx_core::id::get().unwrap_or("unknown");
    // An import writes refs, HEAD and the index: not cut in half.
    let _hold = sig::Hold::new();
    let mut ev = import::Events::default();
    let r = import::import(git_dir, &st.paths, limits, sbx_id, &mut ev);
    ev.finish();
    for (name, sev, fields) in &ev.list {
        audit(name, *sev, fields.clone());
        // A limit exceeded is the run's failure line, said once there.
        if *sev == Severity::Alert && *name != "stage_limit_exceeded" {
            let what = fields
                .get("ref")
                .or_else(|| fields.get("object"))
                .or_else(|| fields.get("path"))
                .and_then(|v| v.as_str())
                .map(|w| format!("{}: ", sbx_core::escape::terminal(w)))
                .unwrap_or_default();
            let why = fields.get("reason").and_then(|v| v.as_str()).unwrap_or("");
            say!(
                "{TOOL}: alert: {name}: {what}{}",
                sbx_core::escape::terminal(why)
            );
        }
    }
    let o = r.map_err(|e| {
        if e.busy() {
            // Nothing written: the stage stays for a later import.
            st.keep();
            let (d, g) = (st.paths.dir.display(), git_dir.display());
            Failure::new(format!(
                "git stage import: {e}; the stage is kept: `sbx-gitguard import --repo {g} \
                 --stage {d}` imports it (before the next `run --stage` of the repository, \
                 which reaps it)"
            ))
        } else {
            Failure::new(format!("git stage import: {e}"))
        }
    })?;
    audit(
        "git_stage_imported",
        if ev.alerts().next().is_some() {
            Severity::Alert
        } else {
            Severity::Info
        },
        json!({
            "stage": jpath(&st.paths.dir),
            "objects_written": o.objects_written,
            "refs": o.refs.len(),
            "head_changed": o.head_changed,
            "refused": ev.alerts().count(),
            "exceeded": o.exceeded,
        }),
    );
    Ok(o)
}

/// What the import wrote becomes what the check expects, so it is not
/// "repaired" away.
fn expect_imported(snap: &mut snapshot::Snapshot, git_dir: &Path, o: &import::Outcome) {
    let Some(u) = snap
        .units
        .iter_mut()
        .find(|u| u.path == git_dir && u.kind == layout::UnitKind::Main)
    else {
        return;
    };
    if let Some(r) = &mut u.refs {
        for (name, v) in &o.refs {
            match v {
                Some(v) => {
                    r.refs.insert(name.clone(), v.to_text());
                }
                None => {
                    r.refs.remove(name);
                }
            }
        }
    }
    if o.head_changed
        && let Ok(Some(h)) = fsutil::read(&git_dir.join("HEAD"))
    {
        u.head = Some(h);
    }
    // Linked worktrees the import wrote or removed (worktree.rs): what the
    // check expects, not a new or vanished git dir to report.
    snap.units
        .retain(|u| !o.worktrees.removed.contains(&u.path));
    // (Captured again whole: `git worktree move` rewrites its gitdir.)
    for w in &o.worktrees.written {
        let unit = layout::Unit {
            path: w.clone(),
            kind: layout::UnitKind::Worktree,
            work_tree: None,
        };
        if let Ok(us) = snapshot::capture_unit(&unit) {
            snap.units.retain(|u| &u.path != w);
            snap.units.push(us);
        }
    }
}

fn cmd_import(a: ImportArgs) -> Result<i32, Failure> {
    let wait = lock_wait(&a.repo)?;
    let limits = stage_limits(&a.limits)?;
    let l = open_layout(&a.repo)?;
    let git_dir = stage::plain_git_dir(&l)?;
    let st = stage::Stage::open(&a.stage, &git_dir)?;
    if let Err(f) = journal::recover_at_start(&git_dir) {
        // Nothing of it was imported: it stays for a later import.
        st.keep();
        return Err(f);
    }
    ensure_unlocked(&l, wait)?;
    let o = import_stage(&git_dir, &st, &limits)?;
    let dir = st.paths.dir.clone();
    st.remove()
        .map_err(|e| Failure::new(format!("cannot remove the stage {}: {e}", dir.display())))?;
    if let Some(e) = o.exceeded {
        return Err(Failure::new(format!("git stage not imported: {e}")));
    }
    println!(
        "imported: {} object(s), {} ref(s){}",
        o.objects_written,
        o.refs.len(),
        if o.head_changed { ", HEAD" } else { "" }
    );
    Ok(0)
}

fn cmd_snapshot(a: SnapshotArgs) -> Result<i32, Failure> {
    let wait = lock_wait(&a.repo)?;
    let l = open_layout(&a.repo)?;
    ensure_unlocked(&l, wait)?;
    let snap = take_snapshot(&l, a.full, None)?;
    snapshot::save(&snap, &a.output)?;
    audit(
        "git_snapshot",
        Severity::Info,
        json!({ "repo": jpath(&l.common_dir), "file": jpath(&a.output), "units": snap.units.len() }),
    );
    Ok(0)
}

fn load(against: &Path, l: &layout::Layout) -> Result<snapshot::Snapshot, Failure> {
    Ok(snapshot::load(against, l)?)
}

fn cmd_check(a: CheckArgs) -> Result<i32, Failure> {
    let wait = lock_wait(&a.repo)?;
    // Against a snapshot, a damaged repository (HEAD gone) is still found:
    // the snapshot's identity check says whether it is the same one.
    let l = if a.against.is_some() {
        layout::find_damaged(&a.repo.repo)?
    } else {
        open_layout(&a.repo)?
    };
    let report = match &a.against {
        Some(f) => {
            let snap = load(f, &l)?;
            verify::verify(&l, &snap, Mode::Check, a.full, wait, &Default::default())
        }
        None => {
            ensure_unlocked(&l, wait)?;
            verify::check_alone(&l, a.full)
        }
    };
    emit_report(&report, Mode::Check);
    print_report(&report, &l, a.json, Mode::Check);
    Ok(if report.problems() > 0 { 1 } else { 0 })
}

fn cmd_repair(a: RepairArgs) -> Result<i32, Failure> {
    let wait = lock_wait(&a.repo)?;
    let l = layout::find_damaged(&a.repo.repo)?;
    let snap = load(&a.against, &l)?;
    // Locks still there after --lock-wait are not a concurrent git's
    // (between turns nothing else runs): they are removed and reported,
    // never a reason to leave what was planted beside them.
    let report = verify::verify(&l, &snap, Mode::Repair, a.full, wait, &Default::default());
    emit_report(&report, Mode::Repair);
    print_report(&report, &l, a.json, Mode::Repair);
    if let Some(f) = report.unrecoverable() {
        return Err(Failure::new(format!(
            "repository could not be brought back: {}: {} ({})",
            f.check, f.found, f.action
        )));
    }
    Ok(0)
}
