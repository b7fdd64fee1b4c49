complete -c sbx-gvisor -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-gvisor -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-gvisor -l runsc -d 'The runsc binary' -r -F
complete -c sbx-gvisor -l cgroup-bin -d 'Run runsc inside sbx-cgroup (this binary) with the limits below' -r -F
complete -c sbx-gvisor -l ro -d 'Bind SRC read-only (as sbx-fs --ro)' -r
complete -c sbx-gvisor -l rw -d 'Bind SRC writable (as sbx-fs --rw)' -r
complete -c sbx-gvisor -l deny -d 'Hide PATH (as sbx-fs --deny)' -r
complete -c sbx-gvisor -l chdir -d 'Working directory inside' -r -F
complete -c sbx-gvisor -l tmp-size -d 'Size of the /tmp, /dev/shm and $HOME tmpfs inside' -r
complete -c sbx-gvisor -l memory -d 'Memory limit: of the whole sandbox under --cgroup-bin, else per process (RLIMIT_AS, enforced by gVisor\'s kernel)' -r
complete -c sbx-gvisor -l pids -d 'Processes and threads: sbx-cgroup\'s pids limit under --cgroup-bin; RLIMIT_NPROC inside ((N - 128) / 16 under --cgroup-bin, at least 8)' -r
complete -c sbx-gvisor -l cpus -d 'CPU limit in CPUs (under --cgroup-bin)' -r
complete -c sbx-gvisor -l timeout -d 'Wall-clock limit: the run ends with 124 (a timeout alert)' -r
complete -c sbx-gvisor -l allow-exec -d 'The execute allowlist (as sbx-seccomp --allow-exec): every mount is noexec but these files (and the dynamic loaders)' -r -F
complete -c sbx-gvisor -l git-stage -d 'A git stage made by sbx-gitguard run --stage (as sbx-fs --git-stage)' -r -F
complete -c sbx-gvisor -l fsize -d 'Largest file the command may write (RLIMIT_FSIZE)' -r
complete -c sbx-gvisor -l pass-env -d 'Pass the caller\'s variable NAME (or PREFIX*) too (as sbx-fs --pass-env)' -r
complete -c sbx-gvisor -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-gvisor -l keep-env -d 'Pass the caller\'s whole environment (as sbx-fs --keep-env)'
complete -c sbx-gvisor -l host-network -d 'Give the sandbox the network namespace runsc runs in, through gVisor\'s own network stack over host sockets (runsc --network=host), instead of none. The chain runs this step inside sbx-net, so what the sandbox reaches is sbx-net\'s filtered namespace: its allowlist, DNS proxy and alerts'
complete -c sbx-gvisor -s h -l help -d 'Print help'
complete -c sbx-gvisor -s V -l version -d 'Print version'
