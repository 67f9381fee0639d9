#!/bin/busybox sh
# /init of the NUMA guests (e2e/src/vm.rs), x86 and arm64. The guest's root (the host's / for
# x86, a folder of Debian arm64 packages for arm64) is shared read-only over 9p (tag
# `host`) and made writable with an overlay whose upper layer is guest RAM; the exchange folder
# (tag `xchg`, writable) is mounted at the same path as on the host. The guest runs
# `<xchg>/run.sh` chrooted in the overlay with proc, sysfs, devtmpfs, cgroup2 and tmpfs /tmp
# and /run, writes its exit code to `<xchg>/rc` and powers off. Messages start with "GUEST:".
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
# Module order does not matter: a few passes load each once its dependencies are in.
for pass in 1 2 3 4; do for m in /mods/*.ko; do insmod "$m" 2>/dev/null; done; done
xchg=$(sed -n 's/.* xchg=\([^ ]*\).*/\1/p' /proc/cmdline)
mkdir -p /host /upper /merged
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 host /host || echo "GUEST: 9p mount of / failed"
mount -t tmpfs tmpfs /upper; mkdir -p /upper/u /upper/w
mount -t overlay overlay -o lowerdir=/host,upperdir=/upper/u,workdir=/upper/w /merged || echo "GUEST: overlay failed"
mkdir -p /merged/proc /merged/sys /merged/dev /merged/tmp /merged/run
# A root of unpacked packages (arm64) has busybox but no links to it yet.
[ -e /merged/bin/sh ] || chroot /merged /bin/busybox --install -s /bin
mount -t proc proc /merged/proc; mount -t sysfs sys /merged/sys; mount -t devtmpfs dev /merged/dev
mkdir -p /merged/dev/pts /merged/dev/shm
mount -t devpts devpts /merged/dev/pts; mount -t tmpfs tmpfs /merged/dev/shm
mount -t cgroup2 none /merged/sys/fs/cgroup || echo "GUEST: cgroup2 mount failed"
echo "+cpuset +cpu +memory +pids" > /merged/sys/fs/cgroup/cgroup.subtree_control
mount -t tmpfs tmpfs /merged/tmp; mount -t tmpfs tmpfs /merged/run
mkdir -p "/merged$xchg"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 xchg "/merged$xchg" || echo "GUEST: 9p mount of the exchange folder failed"
ip link set lo up
echo "GUEST: up in $(cut -d' ' -f1 /proc/uptime) s, running $xchg/run.sh"
chroot /merged /bin/sh "$xchg/run.sh" > "/merged$xchg/run.log" 2>&1
echo $? > "/merged$xchg/rc"
sync
echo "GUEST: done in $(cut -d' ' -f1 /proc/uptime) s, rc $(cat "/merged$xchg/rc")"
poweroff -f
