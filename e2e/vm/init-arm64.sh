#!/bin/busybox sh
# /init of the arm64 guest (e2e/src/vm.rs). Its userland is this busybox: the host's binaries are
# x86, so nothing of the host's / is shared. The exchange folder (9p tag `xchg`, writable) is
# mounted at /xchg; the guest runs `/xchg/run.sh` with proc, sysfs and devtmpfs mounted, writes
# its exit code to `/xchg/rc` and powers off. Messages start with "GUEST:".
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for pass in 1 2 3 4; do for m in /mods/*.ko; do insmod "$m" 2>/dev/null; done; done
mkdir -p /xchg /tmp
mount -t tmpfs tmpfs /tmp
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 xchg /xchg || echo "GUEST: 9p mount of the exchange folder failed"
echo "GUEST: up in $(cut -d' ' -f1 /proc/uptime) s, running /xchg/run.sh"
sh /xchg/run.sh > /xchg/run.log 2>&1
echo $? > /xchg/rc
sync
echo "GUEST: done in $(cut -d' ' -f1 /proc/uptime) s, rc $(cat /xchg/rc)"
poweroff -f
