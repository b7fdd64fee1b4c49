# sbx-fs (sourced by scripts/setup, bash, as root): /dev/fuse usable by
# every user. Debian's fuse3 package intends /dev/fuse to be mode 0666 (its
# udev rule, 99-fuse3.rules, sets it; fuse is safe for unprivileged users:
# the kernel confines each mount to its owner unless allow_other, and a
# mount in a user namespace to that namespace). udev does not run in this
# container, so the mode the package wants is set here. Without it, sbx-fs
# run by an unprivileged user falls back to plain placeholders (and logs
# fs_guard_unavailable).
sbx_fs_setup() {
    if [ -c /dev/fuse ] && [ "$(stat -c %a /dev/fuse)" != 666 ]; then
        chmod 0666 /dev/fuse
        echo "setup: /dev/fuse made 0666 (as the fuse3 package's udev rule does)"
    fi
}
sbx_fs_setup
