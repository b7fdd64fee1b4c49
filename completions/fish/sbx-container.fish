# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_sbx_container_global_optspecs
    string join \n audit-log= config= v/verbose engine= image= ro= rw= no-default-deny memory= cpus= pids= tmp-size= net= seccomp= user= chdir= setenv= secret-env= creds-config= rlimit= timeout= kill-grace= init h/help V/version
end

function __fish_sbx_container_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_sbx_container_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_sbx_container_using_subcommand
    set -l cmd (__fish_sbx_container_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c sbx-container -n "__fish_sbx_container_needs_command" -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-container -n "__fish_sbx_container_needs_command" -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-container -n "__fish_sbx_container_needs_command" -l engine -d 'Engine address: unix:///PATH or tcp://HOST:PORT (default: DOCKER_HOST, else unix:///var/run/docker.sock)' -r
complete -c sbx-container -n "__fish_sbx_container_needs_command" -l image -d 'Image to run (default sbx-sandbox:latest, made by `sbx-container build`); never pulled' -r
complete -c sbx-container -n "__fish_sbx_container_needs_command" -l ro -d 'Bind SRC read-only at DST (default: the same path; repeatable)' -r
complete -c sbx-container -n "__fish_sbx_container_needs_command" -l rw -d 'Bind SRC writable at DST (default: the same path), except deny-listed and write-protected entries (repeatable)' -r
complete -c sbx-container -n "__fish_sbx_container_needs_command" -l memory -d 'Memory limit (default 512M); no swap beyond it' -r
complete -c sbx-container -n "__fish_sbx_container_needs_command" -l cpus -d 'CPU limit in CPUs (default 1)' -r
complete -c sbx-container -n "__fish_sbx_container_needs_command" -l pids -d 'Maximum number of processes and threads (default 512)' -r
complete -c sbx-container -n "__fish_sbx_container_needs_command" -l tmp-size -d 'Size of the tmpfs on /tmp (default 64M)' -r
complete -c sbx-container -n "__fish_sbx_container_needs_command" -l net -d 'Network: none (default), internal (own network; the host blocked) or sbx (join sbx-net\'s namespace: run under sbx-net, Podman only)' -r -f -a "none\t'No network interface but loopback'
internal\t'A network of its own, the host blocked'
sbx\t'sbx-net\'s namespace, the one sbx-container runs in'"
complete -c sbx-container -n "__fish_sbx_container_needs_command" -l seccomp -d 'Seccomp profile: engine (the engine\'s default, the default) or sbx (sbx-seccomp\'s default profile, translated)' -r -f -a "engine\t'The engine\'s default profile'
sbx\t'sbx-seccomp\'s default profile, translated'"
complete -c sbx-container -n "__fish_sbx_container_needs_command" -l user -d 'UID[:GID] inside the container (default 65534:65534; never 0)' -r
complete -c sbx-container -n "__fish_sbx_container_needs_command" -l chdir -d 'Working directory inside the container (default /). Old spelling: --workdir' -r -F
complete -c sbx-container -n "__fish_sbx_container_needs_command" -l setenv -d 'Environment for the command: NAME=VALUE, or NAME to pass sbx-container\'s own (repeatable; visible in inspect). Old spelling: --env' -r
complete -c sbx-container -n "__fish_sbx_container_needs_command" -l secret-env -d 'Pass this variable of sbx-container\'s environment as a secret: exec-time only, never in inspect (repeatable)' -r
complete -c sbx-container -n "__fish_sbx_container_needs_command" -l creds-config -d 'Fetch secrets with the sbx-creds library: FILE holds an "sbx-creds" section (sbx-creds\' flags as keys); they reach the command at exec time only and are revoked at the end. VAULT_TOKEN is taken from the environment' -r -F
complete -c sbx-container -n "__fish_sbx_container_needs_command" -l rlimit -d 'A resource limit NAME=SOFT[:HARD] (repeatable), e.g. nofile=1024. Old spelling: --ulimit' -r
complete -c sbx-container -n "__fish_sbx_container_needs_command" -l timeout -d 'Wall-clock limit (30s, 5m); then the container is killed (exit 124)' -r
complete -c sbx-container -n "__fish_sbx_container_needs_command" -l kill-grace -d 'After a forwarded SIGINT/SIGTERM, SIGKILL the container when it is still running this long after (default 5s)' -r
complete -c sbx-container -n "__fish_sbx_container_needs_command" -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-container -n "__fish_sbx_container_needs_command" -l no-default-deny -d 'Do not apply sbx-fs\'s default deny list to the binds (the invariants still apply)'
complete -c sbx-container -n "__fish_sbx_container_needs_command" -l init -d 'Run the engine\'s init (docker-init, catatonit) as PID 1, so that forwarded signals reach a command that does not handle them'
complete -c sbx-container -n "__fish_sbx_container_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c sbx-container -n "__fish_sbx_container_needs_command" -s V -l version -d 'Print version'
complete -c sbx-container -n "__fish_sbx_container_needs_command" -a "build" -d 'Build the sandbox image (FROM scratch) on the engine and print its tag and size'
complete -c sbx-container -n "__fish_sbx_container_needs_command" -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c sbx-container -n "__fish_sbx_container_using_subcommand build" -l tools -d 'Directory with the static sbx-* executables to put in /sbx/bin' -r -F
complete -c sbx-container -n "__fish_sbx_container_using_subcommand build" -l busybox -d 'A static busybox (Debian\'s busybox-static)' -r -F
complete -c sbx-container -n "__fish_sbx_container_using_subcommand build" -l ca-certs -d 'The CA certificate bundle' -r -F
complete -c sbx-container -n "__fish_sbx_container_using_subcommand build" -l engine -d 'Engine address: unix:///PATH or tcp://HOST:PORT (default: DOCKER_HOST, else unix:///var/run/docker.sock)' -r
complete -c sbx-container -n "__fish_sbx_container_using_subcommand build" -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-container -n "__fish_sbx_container_using_subcommand build" -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-container -n "__fish_sbx_container_using_subcommand build" -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-container -n "__fish_sbx_container_using_subcommand build" -s h -l help -d 'Print help'
complete -c sbx-container -n "__fish_sbx_container_using_subcommand help; and not __fish_seen_subcommand_from build help" -f -a "build" -d 'Build the sandbox image (FROM scratch) on the engine and print its tag and size'
complete -c sbx-container -n "__fish_sbx_container_using_subcommand help; and not __fish_seen_subcommand_from build help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
