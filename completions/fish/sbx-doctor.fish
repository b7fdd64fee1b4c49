complete -c sbx-doctor -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-doctor -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-doctor -l check -d 'Run only this check (repeatable; default: all)' -r -f -a "userns\t''
fuse\t''
cgroup\t''
landlock\t''
seccomp\t''
nftables\t''
runsc\t''
qemu\t''
kvm\t''
firecracker\t''
engine\t''
vault\t''"
complete -c sbx-doctor -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-doctor -l json -d 'One JSON object on stdout instead of lines'
complete -c sbx-doctor -s h -l help -d 'Print help'
complete -c sbx-doctor -s V -l version -d 'Print version'
