# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_sbx_gitguard_global_optspecs
    string join \n audit-log= config= v/verbose h/help V/version
end

function __fish_sbx_gitguard_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_sbx_gitguard_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_sbx_gitguard_using_subcommand
    set -l cmd (__fish_sbx_gitguard_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c sbx-gitguard -n "__fish_sbx_gitguard_needs_command" -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-gitguard -n "__fish_sbx_gitguard_needs_command" -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-gitguard -n "__fish_sbx_gitguard_needs_command" -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_needs_command" -s h -l help -d 'Print help'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_needs_command" -s V -l version -d 'Print version'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_needs_command" -f -a "run" -d 'Snapshot the repository, run CMD under supervision, verify, repair, report'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_needs_command" -f -a "snapshot" -d 'Write a snapshot of the repository to FILE'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_needs_command" -f -a "check" -d 'Check the repository (against a snapshot, when given); change nothing'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_needs_command" -f -a "repair" -d 'Compare the repository with a snapshot and repair it'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_needs_command" -f -a "import" -d 'Import a git stage (commits made in a sandbox) into the repository, then remove the stage'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_needs_command" -f -a "plants" -d 'Snapshot the repositories of writable directories, run CMD, then quarantine every repository planted there (for any project, git or not)'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand run" -l repo -d 'The repository: the top of a work tree (main or linked) or a bare git dir' -r -F
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand run" -l lock-wait -d 'How long to wait for a concurrent git process\'s lock files to go' -r
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand run" -l stage -d 'Create a git stage DIR (named sbx-git-stage-*, must not exist) for sbx-fs --git-stage; after the command, import it and remove it' -r -F
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand run" -l stage-max-objects -d 'Most files and objects an import reads from a stage' -r
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand run" -l stage-max-bytes -d 'Most bytes of object files (loose objects and packs) an import reads from a stage, and most bytes the new objects inflate to' -r
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand run" -l plants -d 'Also do what `plants --dir DIR` does (repeatable), in this process: the plant check right after the command, before the repository\'s own (one process and one walk of the work tree fewer than `plants` as a layer of its own)' -r -F
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand run" -l plants-quarantine -d '`plants --quarantine` for --plants' -r -F
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand run" -l plants-max-entries -d '`plants --max-entries` for --plants' -r
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand run" -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand run" -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand run" -l alert-only -d 'Report and alert only; repair nothing'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand run" -l full -d 'Run the full connectivity check before and after the command (not only on signs of damage)'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand run" -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand run" -s h -l help -d 'Print help'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand snapshot" -l repo -d 'The repository: the top of a work tree (main or linked) or a bare git dir' -r -F
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand snapshot" -l lock-wait -d 'How long to wait for a concurrent git process\'s lock files to go' -r
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand snapshot" -s o -l output -d 'Where to write the snapshot (created 0600, atomically)' -r -F
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand snapshot" -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand snapshot" -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand snapshot" -l full -d 'Check the repository in full (the equivalent of git fsck) before taking the snapshot, not only structurally'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand snapshot" -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand snapshot" -s h -l help -d 'Print help'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand check" -l repo -d 'The repository: the top of a work tree (main or linked) or a bare git dir' -r -F
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand check" -l lock-wait -d 'How long to wait for a concurrent git process\'s lock files to go' -r
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand check" -l against -d 'Compare with this snapshot' -r -F
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand check" -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand check" -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand check" -l full -d 'Run the full connectivity check (the equivalent of git fsck)'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand check" -l json -d 'Print the report as JSON'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand check" -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand check" -s h -l help -d 'Print help'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand repair" -l repo -d 'The repository: the top of a work tree (main or linked) or a bare git dir' -r -F
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand repair" -l lock-wait -d 'How long to wait for a concurrent git process\'s lock files to go' -r
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand repair" -l against -d 'The snapshot to bring the repository back to' -r -F
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand repair" -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand repair" -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand repair" -l full -d 'Run the full connectivity check'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand repair" -l json -d 'Print the report as JSON'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand repair" -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand repair" -s h -l help -d 'Print help'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand import" -l repo -d 'The repository: the top of a work tree (main or linked) or a bare git dir' -r -F
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand import" -l lock-wait -d 'How long to wait for a concurrent git process\'s lock files to go' -r
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand import" -l stage -d 'The stage directory (named sbx-git-stage-*)' -r -F
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand import" -l stage-max-objects -d 'Most files and objects an import reads from a stage' -r
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand import" -l stage-max-bytes -d 'Most bytes of object files (loose objects and packs) an import reads from a stage, and most bytes the new objects inflate to' -r
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand import" -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand import" -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand import" -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand import" -s h -l help -d 'Print help'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand plants" -l dir -d 'A writable directory to check (repeatable): every directory the command can write, at any depth' -r -F
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand plants" -l quarantine -d 'Where planted repositories are moved (default: $XDG_STATE_HOME/sbx/quarantine, else ~/.local/state/sbx/quarantine)' -r -F
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand plants" -l max-entries -d 'Most directory entries walked per scan; over it the run refuses to start (before) or fails with an alert (after), never silently' -r
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand plants" -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand plants" -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand plants" -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand plants" -s h -l help -d 'Print help'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand help; and not __fish_seen_subcommand_from run snapshot check repair import plants help" -f -a "run" -d 'Snapshot the repository, run CMD under supervision, verify, repair, report'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand help; and not __fish_seen_subcommand_from run snapshot check repair import plants help" -f -a "snapshot" -d 'Write a snapshot of the repository to FILE'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand help; and not __fish_seen_subcommand_from run snapshot check repair import plants help" -f -a "check" -d 'Check the repository (against a snapshot, when given); change nothing'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand help; and not __fish_seen_subcommand_from run snapshot check repair import plants help" -f -a "repair" -d 'Compare the repository with a snapshot and repair it'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand help; and not __fish_seen_subcommand_from run snapshot check repair import plants help" -f -a "import" -d 'Import a git stage (commits made in a sandbox) into the repository, then remove the stage'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand help; and not __fish_seen_subcommand_from run snapshot check repair import plants help" -f -a "plants" -d 'Snapshot the repositories of writable directories, run CMD, then quarantine every repository planted there (for any project, git or not)'
complete -c sbx-gitguard -n "__fish_sbx_gitguard_using_subcommand help; and not __fish_seen_subcommand_from run snapshot check repair import plants help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
