complete -c sbx-cgroup -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-cgroup -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-cgroup -l memory -d 'Hard memory limit (e.g. 512M, 2G); the OOM killer acts inside the group only' -r
complete -c sbx-cgroup -l memory-swap -d 'Memory + swap total (at least --memory). Default: no swap beyond --memory' -r
complete -c sbx-cgroup -l cpus -d 'CPU quota in CPUs (e.g. 0.5, 2)' -r
complete -c sbx-cgroup -l cpu-weight -d 'Relative CPU weight, 1-10000 (default 100)' -r
complete -c sbx-cgroup -l pids -d 'Maximum number of processes and threads in the group (fork-bomb limit)' -r
complete -c sbx-cgroup -l io-weight -d 'Relative I/O weight, 1-10000, where the hierarchy has it' -r
complete -c sbx-cgroup -l rlimit -d 'A resource limit for the command, NAME=SOFT[:HARD] (repeatable), e.g. nofile=1024, fsize=100M, core=0' -r
complete -c sbx-cgroup -l timeout -d 'Wall-clock limit (30s, 5m, 1h30m); then the whole group is killed (exit 124)' -r
complete -c sbx-cgroup -l kill-after -d 'After a forwarded SIGTERM/SIGINT/SIGHUP/SIGQUIT, SIGKILL the command if it still runs this long after (default 10s, or SBX_KILL_AFTER; 0 = at once)' -r
complete -c sbx-cgroup -l parent -d 'Parent cgroup: absolute cgroup path, or relative to the caller\'s own cgroup. Default: the caller\'s own' -r
complete -c sbx-cgroup -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-cgroup -s h -l help -d 'Print help'
complete -c sbx-cgroup -s V -l version -d 'Print version'
