# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_sbx_path_global_optspecs
    string join \n audit-log= config= v/verbose h/help V/version
end

function __fish_sbx_path_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_sbx_path_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_sbx_path_using_subcommand
    set -l cmd (__fish_sbx_path_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c sbx-path -n "__fish_sbx_path_needs_command" -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-path -n "__fish_sbx_path_needs_command" -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-path -n "__fish_sbx_path_needs_command" -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-path -n "__fish_sbx_path_needs_command" -s h -l help -d 'Print help'
complete -c sbx-path -n "__fish_sbx_path_needs_command" -s V -l version -d 'Print version'
complete -c sbx-path -n "__fish_sbx_path_needs_command" -f -a "check" -d 'Exit 0 when PATH may be used for MODE under the rules, 1 (one line on stderr) when it is refused'
complete -c sbx-path -n "__fish_sbx_path_needs_command" -f -a "normalise" -d 'Print the normalised form of each PATH (no file system access); exit 1 if one is refused'
complete -c sbx-path -n "__fish_sbx_path_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c sbx-path -n "__fish_sbx_path_using_subcommand check" -l allow-read -d 'Allow reading PATH and everything beneath it (repeatable)' -r -F
complete -c sbx-path -n "__fish_sbx_path_using_subcommand check" -l allow-write -d 'Allow reading and writing PATH and everything beneath it (repeatable)' -r -F
complete -c sbx-path -n "__fish_sbx_path_using_subcommand check" -l base -d 'Take relative paths (PATH and the rules) relative to DIR (absolute); without it they are refused' -r -F
complete -c sbx-path -n "__fish_sbx_path_using_subcommand check" -l resolve-with -d 'How to resolve: openat2, the openat(O_NOFOLLOW) walk, or auto (openat2 when the kernel has it)' -r
complete -c sbx-path -n "__fish_sbx_path_using_subcommand check" -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-path -n "__fish_sbx_path_using_subcommand check" -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-path -n "__fish_sbx_path_using_subcommand check" -l json -d 'Print the verdict as one JSON object on stdout (allowed or not)'
complete -c sbx-path -n "__fish_sbx_path_using_subcommand check" -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-path -n "__fish_sbx_path_using_subcommand check" -s h -l help -d 'Print help'
complete -c sbx-path -n "__fish_sbx_path_using_subcommand normalise" -l base -d 'Take relative paths relative to DIR (absolute); without it they are refused' -r -F
complete -c sbx-path -n "__fish_sbx_path_using_subcommand normalise" -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-path -n "__fish_sbx_path_using_subcommand normalise" -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-path -n "__fish_sbx_path_using_subcommand normalise" -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-path -n "__fish_sbx_path_using_subcommand normalise" -s h -l help -d 'Print help'
complete -c sbx-path -n "__fish_sbx_path_using_subcommand help; and not __fish_seen_subcommand_from check normalise help" -f -a "check" -d 'Exit 0 when PATH may be used for MODE under the rules, 1 (one line on stderr) when it is refused'
complete -c sbx-path -n "__fish_sbx_path_using_subcommand help; and not __fish_seen_subcommand_from check normalise help" -f -a "normalise" -d 'Print the normalised form of each PATH (no file system access); exit 1 if one is refused'
complete -c sbx-path -n "__fish_sbx_path_using_subcommand help; and not __fish_seen_subcommand_from check normalise help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
