complete -c sbx-wasm -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-wasm -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-wasm -l ro -d 'Preopen DIR read-only as GUEST (default: DIR\'s canonical path)' -r
complete -c sbx-wasm -l rw -d 'Preopen DIR writable as GUEST (default: DIR\'s canonical path)' -r
complete -c sbx-wasm -l setenv -d 'Set K to V in the module\'s environment' -r
complete -c sbx-wasm -l pass-env -d 'Pass the caller\'s variable NAME too, or every variable whose name starts with PREFIX (a secret-looking name only when named exactly)' -r
complete -c sbx-wasm -l allow -d 'Let a component\'s outgoing HTTP (wasi:http) reach a DNS name (or *.domain, or an IP literal) on PORTS (default 80,443): sbx-net\'s --allow syntax and matcher. Without any, no request leaves. Repeat' -r
complete -c sbx-wasm -l allow-file -d 'Read --allow entries from FILE, one per line (# comments)' -r -F
complete -c sbx-wasm -l memory -d 'Largest size of each linear memory' -r
complete -c sbx-wasm -l timeout -d 'End the run after DURATION (exit 124)' -r
complete -c sbx-wasm -l fuel -d 'Give the module N units of fuel, about one per instruction (exit 124 when it runs out)' -r
complete -c sbx-wasm -l max-stack -d 'Native stack WebAssembly may use (a deeper recursion traps)' -r
complete -c sbx-wasm -l max-table-elements -d 'Largest number of elements of each table' -r
complete -c sbx-wasm -l max-tables -d 'Largest number of tables' -r
complete -c sbx-wasm -l max-memories -d 'Largest number of linear memories' -r
complete -c sbx-wasm -l max-instances -d 'Largest number of instances' -r
complete -c sbx-wasm -l artifact -d '(internal) The compiled module to load (with --inner)' -r -F
complete -c sbx-wasm -l module-sha256 -d '(internal) The module\'s SHA-256, for the audit log (with --inner)' -r
complete -c sbx-wasm -l preopen -d '(internal) ro|rw:PATH:GUEST (with --inner)' -r
complete -c sbx-wasm -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-wasm -l no-cache -d 'Compile the module even when a cached compilation exists (and replace it)'
complete -c sbx-wasm -l inner -d '(internal) Run inside sbx-fs: the artifact and preopens are given'
complete -c sbx-wasm -s h -l help -d 'Print help'
complete -c sbx-wasm -s V -l version -d 'Print version'
