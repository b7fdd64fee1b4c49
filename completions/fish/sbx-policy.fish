# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_sbx_policy_global_optspecs
    string join \n audit-log= config= v/verbose h/help V/version
end

function __fish_sbx_policy_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_sbx_policy_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_sbx_policy_using_subcommand
    set -l cmd (__fish_sbx_policy_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c sbx-policy -n "__fish_sbx_policy_needs_command" -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-policy -n "__fish_sbx_policy_needs_command" -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-policy -n "__fish_sbx_policy_needs_command" -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-policy -n "__fish_sbx_policy_needs_command" -s h -l help -d 'Print help'
complete -c sbx-policy -n "__fish_sbx_policy_needs_command" -s V -l version -d 'Print version'
complete -c sbx-policy -n "__fish_sbx_policy_needs_command" -f -a "compile" -d 'Print the sandbox configuration as JSON: one section per tool, keys = long flag names (a --config file)'
complete -c sbx-policy -n "__fish_sbx_policy_needs_command" -f -a "explain" -d 'Print what the sandbox allows and denies, and which rules are not enforced, as tables (--json: one object)'
complete -c sbx-policy -n "__fish_sbx_policy_needs_command" -f -a "chain" -d 'Exec (or --print) the chain for a trust level around CMD'
complete -c sbx-policy -n "__fish_sbx_policy_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand compile" -l settings -d 'Read FILE instead of the user, project and local settings (repeatable; later ones take precedence)' -r -F
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand compile" -l managed -d 'The managed settings file (read when it exists; always highest)' -r -F
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand compile" -l chdir -d 'Where the command starts (default: the current directory); the project is found from it: the git repository\'s top level (for a linked worktree inside its main work tree, the main one), else the nearest directory holding .claude/, else DIR (explain says which). Old spelling: --cwd' -r -F
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand compile" -l home -d 'The home directory for ~/ (default: $HOME)' -r -F
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand compile" -l search-domain -d 'A domain a WebSearch allow rule opens (repeatable; default api.anthropic.com)' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand compile" -l memory -d 'Memory limit of the low-trust chain (default 4G or half the RAM)' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand compile" -l pids -d 'Process and thread limit (default 2048)' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand compile" -l cpus -d 'CPU quota in CPUs (default three quarters of the machine\'s)' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand compile" -l tmp-size -d 'Size of /tmp, /dev/shm and $HOME (default 1G)' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand compile" -l timeout -d 'Wall-clock limit (default 2h)' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand compile" -l fsize -d 'Largest file the command may write (default 8G)' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand compile" -l write-quota -d 'What a run may add to the writable binds together (sbx-fs --write-quota, default 2G; "off": no budget, writes reach the host live instead of at the end)' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand compile" -l write-inodes -d 'New inodes a run may add to the writable binds (sbx-fs --write-inodes, default 500000)' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand compile" -l pass-env -d 'Pass the caller\'s variable NAME (or every PREFIX*) into the sandbox besides the allowlist (sbx-fs --pass-env)' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand compile" -l exec-allowlist -d 'What Bash(...) allow rules bind: invoke (default, Claude Code\'s meaning: the command the agent runs is judged, what it starts is not restricted) or strict (also a kernel execute allowlist for every program started inside)' -r -f -a "invoke\t'Claude Code\'s meaning: the rules say which commands the agent may run (checked before the chain starts); what those commands start is not restricted'
strict\t'The same check, and a kernel (Landlock) execute allowlist for every program started inside: the programs the rules name and a curated set of shells and helpers'"
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand compile" -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand compile" -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand compile" -l no-git-identity -d 'Do not offer the host\'s git user.name/user.email inside (the default offers them, and nothing else of the git config, as ~/.gitconfig in the sandbox\'s HOME; settings: "sbx": {"gitIdentity": false})'
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand compile" -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand compile" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand explain" -l settings -d 'Read FILE instead of the user, project and local settings (repeatable; later ones take precedence)' -r -F
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand explain" -l managed -d 'The managed settings file (read when it exists; always highest)' -r -F
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand explain" -l chdir -d 'Where the command starts (default: the current directory); the project is found from it: the git repository\'s top level (for a linked worktree inside its main work tree, the main one), else the nearest directory holding .claude/, else DIR (explain says which). Old spelling: --cwd' -r -F
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand explain" -l home -d 'The home directory for ~/ (default: $HOME)' -r -F
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand explain" -l search-domain -d 'A domain a WebSearch allow rule opens (repeatable; default api.anthropic.com)' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand explain" -l memory -d 'Memory limit of the low-trust chain (default 4G or half the RAM)' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand explain" -l pids -d 'Process and thread limit (default 2048)' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand explain" -l cpus -d 'CPU quota in CPUs (default three quarters of the machine\'s)' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand explain" -l tmp-size -d 'Size of /tmp, /dev/shm and $HOME (default 1G)' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand explain" -l timeout -d 'Wall-clock limit (default 2h)' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand explain" -l fsize -d 'Largest file the command may write (default 8G)' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand explain" -l write-quota -d 'What a run may add to the writable binds together (sbx-fs --write-quota, default 2G; "off": no budget, writes reach the host live instead of at the end)' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand explain" -l write-inodes -d 'New inodes a run may add to the writable binds (sbx-fs --write-inodes, default 500000)' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand explain" -l pass-env -d 'Pass the caller\'s variable NAME (or every PREFIX*) into the sandbox besides the allowlist (sbx-fs --pass-env)' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand explain" -l exec-allowlist -d 'What Bash(...) allow rules bind: invoke (default, Claude Code\'s meaning: the command the agent runs is judged, what it starts is not restricted) or strict (also a kernel execute allowlist for every program started inside)' -r -f -a "invoke\t'Claude Code\'s meaning: the rules say which commands the agent may run (checked before the chain starts); what those commands start is not restricted'
strict\t'The same check, and a kernel (Landlock) execute allowlist for every program started inside: the programs the rules name and a curated set of shells and helpers'"
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand explain" -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand explain" -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand explain" -l no-git-identity -d 'Do not offer the host\'s git user.name/user.email inside (the default offers them, and nothing else of the git config, as ~/.gitconfig in the sandbox\'s HOME; settings: "sbx": {"gitIdentity": false})'
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand explain" -l json -d 'One JSON object instead of tables: project, settings, allows, denies, limits (with whether each applies in this run), rules (status, rule, from, effect), not_enforced, warnings'
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand explain" -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand explain" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand chain" -l settings -d 'Read FILE instead of the user, project and local settings (repeatable; later ones take precedence)' -r -F
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand chain" -l managed -d 'The managed settings file (read when it exists; always highest)' -r -F
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand chain" -l chdir -d 'Where the command starts (default: the current directory); the project is found from it: the git repository\'s top level (for a linked worktree inside its main work tree, the main one), else the nearest directory holding .claude/, else DIR (explain says which). Old spelling: --cwd' -r -F
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand chain" -l home -d 'The home directory for ~/ (default: $HOME)' -r -F
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand chain" -l search-domain -d 'A domain a WebSearch allow rule opens (repeatable; default api.anthropic.com)' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand chain" -l memory -d 'Memory limit of the low-trust chain (default 4G or half the RAM)' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand chain" -l pids -d 'Process and thread limit (default 2048)' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand chain" -l cpus -d 'CPU quota in CPUs (default three quarters of the machine\'s)' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand chain" -l tmp-size -d 'Size of /tmp, /dev/shm and $HOME (default 1G)' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand chain" -l timeout -d 'Wall-clock limit (default 2h)' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand chain" -l fsize -d 'Largest file the command may write (default 8G)' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand chain" -l write-quota -d 'What a run may add to the writable binds together (sbx-fs --write-quota, default 2G; "off": no budget, writes reach the host live instead of at the end)' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand chain" -l write-inodes -d 'New inodes a run may add to the writable binds (sbx-fs --write-inodes, default 500000)' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand chain" -l pass-env -d 'Pass the caller\'s variable NAME (or every PREFIX*) into the sandbox besides the allowlist (sbx-fs --pass-env)' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand chain" -l exec-allowlist -d 'What Bash(...) allow rules bind: invoke (default, Claude Code\'s meaning: the command the agent runs is judged, what it starts is not restricted) or strict (also a kernel execute allowlist for every program started inside)' -r -f -a "invoke\t'Claude Code\'s meaning: the rules say which commands the agent may run (checked before the chain starts); what those commands start is not restricted'
strict\t'The same check, and a kernel (Landlock) execute allowlist for every program started inside: the programs the rules name and a curated set of shells and helpers'"
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand chain" -l trust -d 'How far the command is trusted: full (path allowlist only), low (namespace chain), zero (gVisor or a microVM), plugin (CMD is a WebAssembly module: sbx-wasm)' -r -f -a "full\t'Path allowlist only (sbx-path): for agents you trust'
low\t'The Linux namespace chain'
zero\t'A separate kernel: gVisor or a microVM'
plugin\t'A WebAssembly/WASI module (sbx-wasm): the plugin tier'"
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand chain" -l layers -d 'A --config file whose sections are passed to each layer (sbx-creds is included when it has a section)' -r -F
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand chain" -l bin-dir -d 'Where the sbx binaries are (default: $SBX_BIN, beside sbx-policy, PATH)' -r -F
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand chain" -l secret -d 'A phantom credential (sbx-net --secret NAME@HOST[,HOST...][=file:PATH|=fd:N], repeatable): inside, NAME holds a placeholder; sbx-net puts the caller\'s value into request headers to HOST only. Namespace chain only' -r
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand chain" -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand chain" -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand chain" -l no-git-identity -d 'Do not offer the host\'s git user.name/user.email inside (the default offers them, and nothing else of the git config, as ~/.gitconfig in the sandbox\'s HOME; settings: "sbx": {"gitIdentity": false})'
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand chain" -l latency-sensitive -d 'With --trust zero: prefer the fastest-starting isolation (Firecracker)'
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand chain" -l plugin -d 'CMD is a plugin, a WebAssembly/WASI module (as --trust plugin: sbx-wasm)'
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand chain" -l print -d 'Print the chain (one layer per line) instead of running it'
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand chain" -l cgroup -d 'Include sbx-cgroup (the default with --trust low, given only the limits that apply in this run: explain says which; with --trust zero the default is only as root)'
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand chain" -l no-cgroup -d 'Leave sbx-cgroup out'
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand chain" -l container -d 'With --trust low: one container per run (sbx-container, Docker/Podman) instead of the namespace chain'
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand chain" -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand chain" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand help; and not __fish_seen_subcommand_from compile explain chain help" -f -a "compile" -d 'Print the sandbox configuration as JSON: one section per tool, keys = long flag names (a --config file)'
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand help; and not __fish_seen_subcommand_from compile explain chain help" -f -a "explain" -d 'Print what the sandbox allows and denies, and which rules are not enforced, as tables (--json: one object)'
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand help; and not __fish_seen_subcommand_from compile explain chain help" -f -a "chain" -d 'Exec (or --print) the chain for a trust level around CMD'
complete -c sbx-policy -n "__fish_sbx_policy_using_subcommand help; and not __fish_seen_subcommand_from compile explain chain help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
