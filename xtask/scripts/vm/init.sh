#!/bin/busybox sh
# /init of the nri-resize test VM (busybox-static in an initramfs; see xtask/src/vm.rs).
#
# 1. load the virtio / 9p / overlay / ext4 modules listed in /modules.order (dependencies first);
# 2. root = overlay of the host's `/` (9p tag `hostroot`, read-only) with a tmpfs upper layer, so
#    host-built test binaries run with the host's own libraries;
# 3. /tmp = the virtio disk (ext4: page cache there is disk-backed and reclaimable), the run
#    directory = 9p tag `run` (writable, shared with the host, mounted at the same path as on the
#    host), cgroup2 with every controller enabled, bpffs, tracefs;
# 4. chroot and run the generated `$nri_resize_run/guest.sh`, report its status on the console,
#    power off.
# The kernel passes unknown `key=value` boot parameters to init as environment: `nri_resize_run`,
# `nri_resize_init` (`systemd`: step 4 starts systemd as PID 1 instead), `nri_resize_userland`
# and `nri_resize_shell` (the arm64 guest, below) and, for a checkout below /tmp,
# `nri_resize_keep`.
/bin/busybox mkdir -p /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin

say() { echo "[vm-init] $*" >/dev/console; }
fail() {
    say "FAILED: $*"
    echo "NRI_RESIZE_VM_STATUS 125" >/dev/console
    poweroff -f
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null

while read -r m; do
    insmod "/modules/$m" || fail "insmod $m"
done </modules.order

[ -n "$nri_resize_run" ] || fail "no nri_resize_run= on the kernel command line"

mkdir -p /lower /upper /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 hostroot /lower ||
    fail "mount 9p hostroot"
mount -t tmpfs -o size=75% tmpfs /upper || fail "tmpfs upper"
mkdir -p /upper/data /upper/work
# `nri_resize_userland=1` (the arm64 guest): Debian's arm64 packages (9p tag `userland`) lie over
# the host's `/`, so the arm64 libraries, runtimes and busybox applets shadow the host's.
lower=/lower
if [ -n "$nri_resize_userland" ]; then
    mkdir -p /userland
    mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 userland /userland ||
        fail "mount 9p userland"
    lower=/userland:/lower
fi
mount -t overlay overlay -o lowerdir=$lower,upperdir=/upper/data,workdir=/upper/work /newroot ||
    fail "overlay root"

R=/newroot
mount -t proc proc $R/proc
mount -t sysfs sysfs $R/sys
mount -t devtmpfs devtmpfs $R/dev
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts devpts $R/dev/pts
mount -t tmpfs tmpfs $R/dev/shm
mount -t tmpfs tmpfs $R/run
# A checkout below /tmp (`nri_resize_keep`) stays visible: bound aside, then back over the disk.
if [ -n "$nri_resize_keep" ]; then
    mkdir -p /keep && mount --bind "$R$nri_resize_keep" /keep || fail "bind $nri_resize_keep"
fi
# `discard`: what the suites delete goes back to the host (QEMU `discard=unmap`).
mount -t ext4 -o discard /dev/vda $R/tmp || fail "mount /dev/vda (ext4) on /tmp"
chmod 1777 $R/tmp
if [ -n "$nri_resize_keep" ]; then
    mkdir -p "$R$nri_resize_keep" && mount --bind /keep "$R$nri_resize_keep" ||
        fail "bind $nri_resize_keep back"
fi
mkdir -p "$R$nri_resize_run"
mount -t 9p -o trans=virtio,version=9p2000.L,cache=none,msize=512000 run "$R$nri_resize_run" ||
    fail "mount 9p run"
mount -t cgroup2 cgroup2 $R/sys/fs/cgroup || fail "mount cgroup2"
for c in $(cat $R/sys/fs/cgroup/cgroup.controllers); do
    echo "+$c" >$R/sys/fs/cgroup/cgroup.subtree_control || say "cannot enable controller $c"
done
mount -t bpf bpf $R/sys/fs/bpf || fail "mount bpffs"
mount -t tracefs tracefs $R/sys/kernel/tracing || fail "mount tracefs"
mount -t debugfs debugfs $R/sys/kernel/debug 2>/dev/null
ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up

say "kernel $(uname -r), cgroup2 controllers: $(cat $R/sys/fs/cgroup/cgroup.subtree_control)"
# The new root goes *over* the initramfs's `/` (what `switch_root` does), not just under a chroot:
# a process joining a container's mount namespace (`runc exec`, i.e. CRI `ExecSync`, `ctr exec`)
# gets that namespace's `/` with the mounts stacked on it followed down (`setns` → LOOKUP_DOWN).
# With a bare chroot of /newroot nothing is stacked on the initramfs's `/`, so an exec'd process
# landed in the initramfs, outside the container's root. This init keeps its own view (its root
# is the initramfs's root directory itself) for the status line and the power-off below.
# `nri_resize_init=systemd`: systemd is PID 1 (kubelet's systemd cgroup driver needs it). It
# starts only `nri-resize-guest.service` (`systemd.unit=` on the kernel command line) and what
# that needs (D-Bus); the service runs the suites, prints the status line and powers off.
if [ "$nri_resize_init" = systemd ]; then
    unit=$R/etc/systemd/system/nri-resize-guest.service
    mkdir -p "$R/etc/systemd/system" || fail "mkdir /etc/systemd/system"
    # The host's fstab names the host's disks: systemd would wait for them.
    : >"$R/etc/fstab" || fail "empty /etc/fstab"
    {
        echo "[Unit]"
        echo "Description=nri-resize VM suites"
        echo "DefaultDependencies=no"
        echo "Requires=dbus.socket"
        echo "After=dbus.socket"
        echo "[Service]"
        echo "Type=oneshot"
        echo "TimeoutStartSec=infinity"
        echo "LimitNOFILE=1048576"
        echo "LimitMEMLOCK=infinity"
        echo "TasksMax=infinity"
        echo "StandardOutput=journal+console"
        echo "ExecStart=/bin/bash $nri_resize_run/systemd-guest.sh"
    } >"$unit" || fail "write $unit"
    {
        echo "bash $nri_resize_run/guest.sh"
        echo 's=$?'
        echo 'sync'
        echo 'echo "NRI_RESIZE_VM_STATUS $s" >/dev/console'
        echo 'systemctl poweroff --force --force'
    } >"$R$nri_resize_run/systemd-guest.sh" || fail "write systemd-guest.sh"
    # A host that is itself a container marks its `/` (`/.dockerenv`, `/run/.containerenv`):
    # systemd would take the guest for a container and ignore the kernel's command line.
    rm -f "$R/.dockerenv" "$R/run/.containerenv"
    say "starting systemd as PID 1"
    cd $R || fail "cd $R"
    mount --move . / || fail "move the new root over /"
    exec chroot . /lib/systemd/systemd
fi
cd $R || fail "cd $R"
mount --move . / || fail "move the new root over /"
chroot . "${nri_resize_shell:-/bin/bash}" "$nri_resize_run/guest.sh"
status=$?
cd /
sync
echo "NRI_RESIZE_VM_STATUS $status" >/dev/console
poweroff -f
