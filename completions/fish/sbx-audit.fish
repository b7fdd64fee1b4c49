# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_sbx_audit_global_optspecs
    string join \n audit-log= config= v/verbose h/help V/version
end

function __fish_sbx_audit_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_sbx_audit_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_sbx_audit_using_subcommand
    set -l cmd (__fish_sbx_audit_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c sbx-audit -n "__fish_sbx_audit_needs_command" -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-audit -n "__fish_sbx_audit_needs_command" -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-audit -n "__fish_sbx_audit_needs_command" -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-audit -n "__fish_sbx_audit_needs_command" -s h -l help -d 'Print help'
complete -c sbx-audit -n "__fish_sbx_audit_needs_command" -s V -l version -d 'Print version'
complete -c sbx-audit -n "__fish_sbx_audit_needs_command" -f -a "verify" -d 'Check the hash chain; say where it breaks'
complete -c sbx-audit -n "__fish_sbx_audit_needs_command" -f -a "show" -d 'Print the events for people'
complete -c sbx-audit -n "__fish_sbx_audit_needs_command" -f -a "tail" -d 'Print the last events for people'
complete -c sbx-audit -n "__fish_sbx_audit_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c sbx-audit -n "__fish_sbx_audit_using_subcommand verify" -l anchor -d 'SEQ:HASH of a line recorded earlier (as printed by verify): it must still be there, unchanged (detects a cut tail or an emptied log)' -r
complete -c sbx-audit -n "__fish_sbx_audit_using_subcommand verify" -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-audit -n "__fish_sbx_audit_using_subcommand verify" -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-audit -n "__fish_sbx_audit_using_subcommand verify" -l json -d 'One JSON object on stdout'
complete -c sbx-audit -n "__fish_sbx_audit_using_subcommand verify" -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-audit -n "__fish_sbx_audit_using_subcommand verify" -s h -l help -d 'Print help'
complete -c sbx-audit -n "__fish_sbx_audit_using_subcommand show" -l severity -d 'Only events at or above this severity' -r -f -a "info\t''
warn\t''
alert\t''"
complete -c sbx-audit -n "__fish_sbx_audit_using_subcommand show" -l event -d 'Only these events (repeatable)' -r
complete -c sbx-audit -n "__fish_sbx_audit_using_subcommand show" -l sbx-id -d 'Only this sandbox' -r
complete -c sbx-audit -n "__fish_sbx_audit_using_subcommand show" -l color -d 'Colour by severity: auto (on a terminal), always, never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c sbx-audit -n "__fish_sbx_audit_using_subcommand show" -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-audit -n "__fish_sbx_audit_using_subcommand show" -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-audit -n "__fish_sbx_audit_using_subcommand show" -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-audit -n "__fish_sbx_audit_using_subcommand show" -s h -l help -d 'Print help'
complete -c sbx-audit -n "__fish_sbx_audit_using_subcommand tail" -s n -l lines -d 'How many events' -r
complete -c sbx-audit -n "__fish_sbx_audit_using_subcommand tail" -l severity -d 'Only events at or above this severity' -r -f -a "info\t''
warn\t''
alert\t''"
complete -c sbx-audit -n "__fish_sbx_audit_using_subcommand tail" -l event -d 'Only these events (repeatable)' -r
complete -c sbx-audit -n "__fish_sbx_audit_using_subcommand tail" -l sbx-id -d 'Only this sandbox' -r
complete -c sbx-audit -n "__fish_sbx_audit_using_subcommand tail" -l color -d 'Colour by severity: auto (on a terminal), always, never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c sbx-audit -n "__fish_sbx_audit_using_subcommand tail" -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-audit -n "__fish_sbx_audit_using_subcommand tail" -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-audit -n "__fish_sbx_audit_using_subcommand tail" -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-audit -n "__fish_sbx_audit_using_subcommand tail" -s h -l help -d 'Print help'
complete -c sbx-audit -n "__fish_sbx_audit_using_subcommand help; and not __fish_seen_subcommand_from verify show tail help" -f -a "verify" -d 'Check the hash chain; say where it breaks'
complete -c sbx-audit -n "__fish_sbx_audit_using_subcommand help; and not __fish_seen_subcommand_from verify show tail help" -f -a "show" -d 'Print the events for people'
complete -c sbx-audit -n "__fish_sbx_audit_using_subcommand help; and not __fish_seen_subcommand_from verify show tail help" -f -a "tail" -d 'Print the last events for people'
complete -c sbx-audit -n "__fish_sbx_audit_using_subcommand help; and not __fish_seen_subcommand_from verify show tail help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
