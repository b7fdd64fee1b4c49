complete -c sbx-seccomp -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-seccomp -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-seccomp -l profile -d 'Built-in profile (default: `default`, or `none` when --policy is given)' -r -f -a "default\t'Allows normal programs, denies the kernel attack surface'
strict\t'An allowlist for simple workloads, on top of `default`'
none\t'No built-in filter'"
complete -c sbx-seccomp -l policy -d 'A policy in seccompiler\'s JSON format; its filters are installed after the profile\'s (an explicit --profile stays, otherwise none is used)' -r -F
complete -c sbx-seccomp -l deny -d 'Deny SYSCALL too (EPERM, or per --action). Repeatable' -r
complete -c sbx-seccomp -l allow -d 'Allow SYSCALL although the profile denies it. Repeatable' -r
complete -c sbx-seccomp -l action -d 'What a denied call gets: errno (silent EPERM), kill (SIGSYS) or log (allowed, logged: audit mode). Default: the profile\'s per-call choice, its EPERM denials alerted through a notifier when there is an audit log' -r -f -a "errno\t'Fail with EPERM'
kill\t'Kill the process (SIGSYS; the kernel logs it)'
log\t'Allow but log (audit mode)'"
complete -c sbx-seccomp -l allow-exec -d 'Only this file may be executed (repeatable; a directory allows everything beneath it): a Landlock execute allowlist for CMD and everything it starts (EACCES, 126, for any other file). CMD itself, its shells and interpreters must be listed; the dynamic loaders are added. With an audit log every refused exec is an exec_denied alert' -r -F
complete -c sbx-seccomp -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-seccomp -l no-network -d 'Deny socket() for every family but AF_UNIX (AF_INET, AF_INET6, AF_PACKET, AF_NETLINK, ...), and io_uring'
complete -c sbx-seccomp -l no-tsc -d 'Make rdtsc/rdtscp raise SIGSEGV (PR_SET_TSC): no precise timer for timing side channels. glibc\'s dynamic loader and the vDSO clock read the TSC too: suits static programs only (see LIMITS)'
complete -c sbx-seccomp -l allow-ptrace -d 'Allow ptrace, process_vm_readv/writev, pidfd_getfd and personality(ADDR_NO_RANDOMIZE), for debuggers'
complete -c sbx-seccomp -l print -d 'Print the filter as a table and exit 0 (CMD is not needed)'
complete -c sbx-seccomp -s h -l help -d 'Print help (see more with \'--help\')'
complete -c sbx-seccomp -s V -l version -d 'Print version'
