complete -c sbx-fs -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-fs -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-fs -l ro -d 'Bind SRC read-only at DST (default: the same path)' -r
complete -c sbx-fs -l rw -d 'Bind SRC writable at DST (default: the same path)' -r
complete -c sbx-fs -l tmpfs -d 'A fresh tmpfs at DST, SIZE bytes at most (default --tmp-size)' -r
complete -c sbx-fs -l deny -d 'Hide PATH (a host path, ~/path, or a name pattern such as .env.*)' -r
complete -c sbx-fs -l chdir -d 'Working directory of the command inside the sandbox' -r -F
complete -c sbx-fs -l hostname -d 'Hostname inside the sandbox (new UTS namespace)' -r
complete -c sbx-fs -l setenv -d 'Set K to V in the command\'s environment' -r
complete -c sbx-fs -l unsetenv -d 'Remove K from the command\'s environment' -r
complete -c sbx-fs -l pass-env -d 'Pass the caller\'s variable NAME too, or every variable whose name starts with PREFIX (a secret-looking name only when named exactly)' -r
complete -c sbx-fs -l uid -d 'User id inside the sandbox (default: the caller\'s)' -r
complete -c sbx-fs -l gid -d 'Group id inside the sandbox (default: the caller\'s)' -r
complete -c sbx-fs -l git-stage -d 'Show the .git directory named in DIR/gitdir through an overlay whose upper layer is DIR/git/upper: git can commit there, the host\'s .git is not written (sbx-gitguard run --stage makes DIR and imports it)' -r -F
complete -c sbx-fs -l scan-limit -d 'How many directory entries the search for protected names (.env, credentials*, .git, .claude ...) may read per bind; beyond it sbx-fs refuses to start (exit 125) rather than leave part of the tree unprotected' -r
complete -c sbx-fs -l quarantine -d 'Where control files created during the run (a new .claude/, .vscode/, .mcp.json ... in a writable bind) are moved at the end (default $XDG_STATE_HOME/sbx/quarantine or ~/.local/state/sbx/quarantine). It must exist, be the caller\'s alone and lie outside every writable bind, also through a bind mount alias (exit 125 otherwise)' -r -F
complete -c sbx-fs -l tmp-size -d 'Size limit of /tmp, /dev/shm and the $HOME tmpfs' -r
complete -c sbx-fs -l write-quota -d 'A budget for the writable directory binds together: the bytes a run may add (beyond it writes fail with ENOSPC, alert write_quota_exceeded). Overlay mode: the binds are seen through an overlay over a tmpfs of SIZE, applied to the host when the run ends' -r
complete -c sbx-fs -l write-inodes -d 'How many new inodes (files, directories, symlinks, copied-up directories, deletions) the budget allows (needs --write-quota; default 1000000)' -r
complete -c sbx-fs -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-fs -l clearenv -d 'Start the command with an empty environment (before --setenv)'
complete -c sbx-fs -l keep-env -d 'Pass the caller\'s whole environment (secrets included), not only the allowlist'
complete -c sbx-fs -l no-system -d 'Do not bind /usr, /bin, /sbin, /lib*, /etc'
complete -c sbx-fs -l no-default-deny -d 'Drop the default deny list (the --deny entries still apply)'
complete -c sbx-fs -l git-identity -d 'Offer the invoking user\'s git user.name and user.email (their global git config; SUDO_USER\'s as root via sudo), and nothing else of it, as ~/.gitconfig in the sandbox\'s own $HOME tmpfs'
complete -c sbx-fs -s h -l help -d 'Print help'
complete -c sbx-fs -s V -l version -d 'Print version'
