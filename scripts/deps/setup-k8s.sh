# deploy/k8s (sourced by scripts/setup, bash, as root): the subordinate ids
# rootful Podman gives user-namespaced pods. `podman kube play` maps a pod
# with `hostUsers: false` (Kubernetes' user namespaces) to `--userns=auto`,
# which takes each pod's range out of the ids /etc/subuid and /etc/subgid
# grant the user "containers"; without them the pod is refused ("could not
# find enough available IDs"). The range lies above every user's own.
sbx_k8s_setup() {
    local f
    for f in /etc/subuid /etc/subgid; do
        if ! grep -q '^containers:' "$f" 2>/dev/null; then
            echo "containers:1000000:1000000" >>"$f"
            echo "setup: $f: ids 1000000-1999999 for Podman's --userns=auto (hostUsers: false pods)"
        fi
    done
}
sbx_k8s_setup
