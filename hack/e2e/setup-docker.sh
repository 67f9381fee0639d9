#!/usr/bin/env bash
# Installs what the Docker proxy e2e tier needs: dockerd, runc and busybox-static from Debian
# (docker.io pulls containerd 1.6 for dockerd's own use), plus a busybox-static rootfs tarball
# that the harness turns into an image with `docker import`. The tests start their own dockerd
# on a private socket/data-root/exec-root; this script never starts or enables docker.service.
# Idempotent; quick when installed.
set -euo pipefail

CACHE=/var/cache/kunpeng-tap/docker
ROOTFS_TAR="$CACHE/busybox-rootfs.tar"
STAMP="$CACHE/.rootfs-v1"

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v runc >/dev/null 2>&1 || need+=(runc)
[ -x /bin/busybox ] && file -L /bin/busybox 2>/dev/null | grep -q 'statically linked' || need+=(busybox-static)
command -v docker >/dev/null 2>&1 || need+=(docker.io)
if [ "${#need[@]}" -gt 0 ]; then
  echo "setup-docker: installing ${need[*]}"
  # Never start the system's docker service: the tests run private daemons. A policy-rc.d
  # (only if none exists) keeps the package scripts from starting it.
  . "$(dirname "$0")/../lib/debian-apt.sh"
  apt_install_quietly docker.io runc busybox-static
fi
dockerd --version
runc --version | head -1

mkdir -p "$CACHE"
if [ ! -e "$STAMP" ] || [ ! -s "$ROOTFS_TAR" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/rootfs/bin" "$work/rootfs/etc" "$work/rootfs/tmp" "$work/rootfs/proc" \
    "$work/rootfs/sys" "$work/rootfs/dev"
  cp /bin/busybox "$work/rootfs/bin/busybox"
  for a in sh sleep cat ls echo grep true seq; do ln -s busybox "$work/rootfs/bin/$a"; done
  echo 'root:x:0:0:root:/:/bin/sh' > "$work/rootfs/etc/passwd"
  echo 'root:x:0:' > "$work/rootfs/etc/group"
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$work/rootfs" \
    -cf "$ROOTFS_TAR.tmp" .
  mv "$ROOTFS_TAR.tmp" "$ROOTFS_TAR"
  touch "$STAMP"
fi
echo "setup-docker: ready ($ROOTFS_TAR)"
