complete -c sbx-vm -l audit-log -d 'Append audit events (JSON lines) to PATH; the file is created 0600' -r -F
complete -c sbx-vm -l config -d 'Read settings from FILE (JSON; the section named after the tool, keys are the long flag names)' -r -F
complete -c sbx-vm -l backend -d 'Which VMM: auto (Firecracker when KVM can boot a guest, else QEMU), qemu, firecracker' -r -f -a "auto\t''
qemu\t''
firecracker\t''"
complete -c sbx-vm -l accel -d 'QEMU accelerator: auto (KVM when it can boot a guest, else TCG), kvm, tcg' -r -f -a "auto\t''
kvm\t''
tcg\t''"
complete -c sbx-vm -l kernel -d 'Guest kernel (bzImage for QEMU, vmlinux for Firecracker)' -r -F
complete -c sbx-vm -l initrd -d 'Guest initramfs (holds the guest init and the virtio modules)' -r -F
complete -c sbx-vm -l rootfs -d 'Guest root filesystem (a squashfs image, attached read-only)' -r -F
complete -c sbx-vm -l qemu -d 'The QEMU binary (default: qemu-system-x86_64 on PATH)' -r -F
complete -c sbx-vm -l firecracker -d 'The Firecracker binary (default: firecracker on PATH, else /opt/sbx-firecracker/bin/firecracker)' -r -F
complete -c sbx-vm -l jailer -d 'The jailer binary, used when root (default: beside the Firecracker binary)' -r -F
complete -c sbx-vm -l jail-base -d 'Chroot base directory of the jailer' -r -F
complete -c sbx-vm -l jail-uid -d 'uid the jailer drops to' -r
complete -c sbx-vm -l jail-gid -d 'gid the jailer drops to' -r
complete -c sbx-vm -l jail-cgroup -d 'A cgroup setting for the jailed Firecracker, FILE=VALUE (repeatable, e.g. pids.max=256); the group is created under sbx-vm\'s own cgroup' -r
complete -c sbx-vm -l memory -d 'Guest memory (e.g. 512M, 1G); at least 128M. Old spelling: --mem' -r
complete -c sbx-vm -l vcpus -d 'Number of virtual CPUs (1-32)' -r
complete -c sbx-vm -l tmpfs -d 'Size of the tmpfs writable layer (default: half of --memory)' -r
complete -c sbx-vm -l timeout -d 'Wall-clock limit for CMD (30s, 5m); then CMD and the VM are killed (exit 124)' -r
complete -c sbx-vm -l boot-timeout -d 'How long the guest may take to boot and report to the host' -r
complete -c sbx-vm -l net -d 'Network of the VM: none (no network device), or sbx-net (QEMU user-mode networking; sbx-vm must run under sbx-net)' -r -f -a "none\t''
sbx-net\t''"
complete -c sbx-vm -l setenv -d 'Set K=V in CMD\'s environment (repeatable). Old spelling: --env' -r
complete -c sbx-vm -l secrets-from -d 'JSON document {"env": {"NAME": "value"}} of secrets for CMD\'s environment (fw_cfg / MMDS)' -r -F
complete -c sbx-vm -l secret-env -d 'Deliver the value of NAME in sbx-vm\'s own environment as a secret (repeatable): `sbx-creds ... -- sbx-vm --secret-env DB_PASSWORD -- CMD`' -r
complete -c sbx-vm -l vault-timeout -d 'Bound on each request to the Vault/OpenBao server (sbx-creds\' --timeout; --timeout here bounds CMD)' -r
complete -c sbx-vm -l copy-in -d 'Copy DIR into the guest\'s /work before CMD starts' -r -F
complete -c sbx-vm -l copy-out -d 'Copy the guest\'s /work into DIR (empty or new) after CMD exits' -r -F
complete -c sbx-vm -l vault-addr -d 'Server address (http:// or https://)' -r
complete -c sbx-vm -l ca-cert -d 'PEM file of the CA(s) to trust for an https:// server, instead of the system roots (VAULT_SKIP_VERIFY is never honoured)' -r -F
complete -c sbx-vm -l namespace -d 'Vault Enterprise / OpenBao namespace' -r
complete -c sbx-vm -l auth -d 'How to authenticate' -r -f -a "token\t'A token from --token-file or VAULT_TOKEN'
approle\t'AppRole login with --role-id-file and --secret-id-file'
kubernetes\t'Kubernetes login: the service-account token (--kubernetes-token-file) and --kubernetes-role'"
complete -c sbx-vm -l token-file -d 'File holding the token (--auth token); else VAULT_TOKEN' -r -F
complete -c sbx-vm -l role-id-file -d 'File holding the AppRole role-id (--auth approle)' -r -F
complete -c sbx-vm -l secret-id-file -d 'File holding the AppRole secret-id, or a response-wrapping token for it with --secret-id-wrapped (--auth approle)' -r -F
complete -c sbx-vm -l approle-mount -d 'Mount of the AppRole auth method' -r
complete -c sbx-vm -l kubernetes-role -d 'Role to log in as (--auth kubernetes)' -r
complete -c sbx-vm -l kubernetes-token-file -d 'File holding the pod\'s service-account token, a JWT (--auth kubernetes; a projected token with the audience the server\'s role expects, e.g. /var/run/secrets/tokens/vault)' -r -F
complete -c sbx-vm -l kubernetes-mount -d 'Mount of the Kubernetes (or JWT) auth method (--auth kubernetes)' -r
complete -c sbx-vm -l secret -d 'ENV=MOUNT/PATH#KEY: a KV secret\'s KEY as ENV (repeatable)' -r
complete -c sbx-vm -l secret-all -d 'PREFIX=MOUNT/PATH: every key K of the secret as PREFIX_K (repeatable)' -r
complete -c sbx-vm -l lease -d 'ENV=PATH[?NAME=VALUE&...]#FIELD: a dynamic secret with a lease, renewed during the session, revoked at its end (repeatable)' -r
complete -c sbx-vm -l child-token -d 'Create a short-lived token for the command, as ENV' -r
complete -c sbx-vm -l policy -d 'A policy of the child token (repeatable)' -r
complete -c sbx-vm -l child-ttl -d 'TTL of the child token (never more than --ttl)' -r
complete -c sbx-vm -l child-num-uses -d 'Number of uses of the child token (0: unlimited)' -r
complete -c sbx-vm -l ttl -d 'The session bound: every token and lease expires no later; the command is stopped when it outlives it' -r
complete -c sbx-vm -s v -l verbose -d 'More diagnostics on stderr (-v info, -vv debug, -vvv trace); SBX_LOG takes a tracing filter and wins'
complete -c sbx-vm -l no-kvm-check -d 'Start Firecracker even when KVM cannot boot a guest here (tests the API path; the guest never reports back)'
complete -c sbx-vm -l secret-id-wrapped -d 'The secret-id file holds a response-wrapping token to unwrap'
complete -c sbx-vm -l kv1 -d 'KV mounts are version 1 (no detection)'
complete -c sbx-vm -l child-orphan -d 'Make the child token an orphan (needs sudo on auth/token/create-orphan)'
complete -c sbx-vm -l no-enforce-ttl -d 'Do not stop the command at the TTL (credentials are still revoked)'
complete -c sbx-vm -s h -l help -d 'Print help (see more with \'--help\')'
complete -c sbx-vm -s V -l version -d 'Print version'
