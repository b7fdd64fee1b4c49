complete -c sbx-creds -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-creds -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-creds -l vault-addr -d 'Server address (http:// or https://)' -r
complete -c sbx-creds -l ca-cert -d 'PEM file of the CA(s) to trust for an https:// server, instead of the system roots (VAULT_SKIP_VERIFY is never honoured)' -r -F
complete -c sbx-creds -l namespace -d 'Vault Enterprise / OpenBao namespace' -r
complete -c sbx-creds -l auth -d 'How to authenticate' -r -f -a "token\t'A token from --token-file or VAULT_TOKEN'
approle\t'AppRole login with --role-id-file and --secret-id-file'
kubernetes\t'Kubernetes login: the service-account token (--kubernetes-token-file) and --kubernetes-role'"
complete -c sbx-creds -l token-file -d 'File holding the token (--auth token); else VAULT_TOKEN' -r -F
complete -c sbx-creds -l role-id-file -d 'File holding the AppRole role-id (--auth approle)' -r -F
complete -c sbx-creds -l secret-id-file -d 'File holding the AppRole secret-id, or a response-wrapping token for it with --secret-id-wrapped (--auth approle)' -r -F
complete -c sbx-creds -l approle-mount -d 'Mount of the AppRole auth method' -r
complete -c sbx-creds -l kubernetes-role -d 'Role to log in as (--auth kubernetes)' -r
complete -c sbx-creds -l kubernetes-token-file -d 'File holding the pod\'s service-account token, a JWT (--auth kubernetes; a projected token with the audience the server\'s role expects, e.g. /var/run/secrets/tokens/vault)' -r -F
complete -c sbx-creds -l kubernetes-mount -d 'Mount of the Kubernetes (or JWT) auth method (--auth kubernetes)' -r
complete -c sbx-creds -l secret -d 'ENV=MOUNT/PATH#KEY: a KV secret\'s KEY as ENV (repeatable)' -r
complete -c sbx-creds -l secret-all -d 'PREFIX=MOUNT/PATH: every key K of the secret as PREFIX_K (repeatable)' -r
complete -c sbx-creds -l lease -d 'ENV=PATH[?NAME=VALUE&...]#FIELD: a dynamic secret with a lease, renewed during the session, revoked at its end (repeatable)' -r
complete -c sbx-creds -l child-token -d 'Create a short-lived token for the command, as ENV' -r
complete -c sbx-creds -l policy -d 'A policy of the child token (repeatable)' -r
complete -c sbx-creds -l child-ttl -d 'TTL of the child token (never more than --ttl)' -r
complete -c sbx-creds -l child-num-uses -d 'Number of uses of the child token (0: unlimited)' -r
complete -c sbx-creds -l ttl -d 'The session bound: every token and lease expires no later; the command is stopped when it outlives it' -r
complete -c sbx-creds -l timeout -d 'Bound on each request to the server, connecting included' -r
complete -c sbx-creds -l kill-grace -d 'Time between SIGTERM and SIGKILL when the TTL stops the command' -r
complete -c sbx-creds -l kill-after -d 'After a forwarded SIGTERM/SIGINT/SIGHUP/SIGQUIT, SIGKILL the command if it still runs this long after (default 10s, or SBX_KILL_AFTER; 0 = at once)' -r
complete -c sbx-creds -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-creds -l secret-id-wrapped -d 'The secret-id file holds a response-wrapping token to unwrap'
complete -c sbx-creds -l kv1 -d 'KV mounts are version 1 (no detection)'
complete -c sbx-creds -l child-orphan -d 'Make the child token an orphan (needs sudo on auth/token/create-orphan)'
complete -c sbx-creds -l no-enforce-ttl -d 'Do not stop the command at the TTL (credentials are still revoked)'
complete -c sbx-creds -s h -l help -d 'Print help (see more with \'--help\')'
complete -c sbx-creds -s V -l version -d 'Print version'
