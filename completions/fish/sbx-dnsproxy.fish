complete -c sbx-dnsproxy -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-dnsproxy -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-dnsproxy -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-dnsproxy -s h -l help -d 'Print help'
complete -c sbx-dnsproxy -s V -l version -d 'Print version'
