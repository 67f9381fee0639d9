#!/usr/bin/env bash
# Installs what the NRI and cluster e2e tiers need, without touching the system's packages or
# services: containerd 1.7 (Debian trixie), runc, busybox-static and containernetworking-plugins
# (bridge, host-local, loopback: the cluster tier's CNI; Debian bookworm), each unpacked with
# `dpkg -x` under /var/cache/kunpeng-tap/containerd/root, plus a busybox image tarball
# (docker-archive) built locally from busybox-static, tagged as the pause and busybox image.
# Uses a private apt configuration (its own sources, lists and archive cache), so the system's
# apt sources are never changed. The Debian archive those sources name is the one the system's
# own apt configuration uses (read from `apt-cache policy`): no host is written here.
# Idempotent; quick when cached.
set -euo pipefail

CACHE=/var/cache/kunpeng-tap/containerd
ROOT="$CACHE/root"
APT="$CACHE/apt"
IMG="$CACHE/images"
STAMP="$CACHE/.installed-v2"
IMAGE_STAMP="$IMG/.built-v1"

mkdir -p "$CACHE" "$IMG"

# debian_archive, private_apt_options
. "$(dirname "$0")/../lib/debian-apt.sh"
# busybox_image
. "$(dirname "$0")/../lib/busybox-image.sh"

# The CRI client crate (k8s-cri) generates its bindings with protoc at build time.
bash "$(dirname "$0")/../ensure-protoc.sh"

if [ ! -e "$STAMP" ] || [ ! -x "$ROOT/usr/bin/containerd" ] || [ ! -x "$ROOT/usr/lib/cni/bridge" ]; then
  private_apt_options "$APT"
  archive=$(debian_archive)
  [ -n "$archive" ] || { echo "setup-containerd: no Debian archive in this system's apt sources" >&2; exit 1; }
  echo "setup-containerd: Debian archive from the system's apt configuration: $archive"
  for suite in trixie bookworm; do
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $archive $suite main"
  done > "$APT/etc/sources.list"
  echo "setup-containerd: apt-get update (private lists)"
  flock /var/lock/kunpeng-tap-apt apt-get "${aptopts[@]}" -qq update
  cd "$APT/archives"
  rm -f ./*.deb
  echo "setup-containerd: downloading containerd/trixie runc/bookworm busybox-static/bookworm containernetworking-plugins/bookworm"
  flock /var/lock/kunpeng-tap-apt apt-get "${aptopts[@]}" -qq download \
    containerd/trixie runc/bookworm busybox-static/bookworm containernetworking-plugins/bookworm
  rm -rf "$ROOT"
  mkdir -p "$ROOT"
  for d in ./*.deb; do dpkg -x "$d" "$ROOT"; done
  "$ROOT/usr/bin/containerd" --version
  "$ROOT/usr/sbin/runc" --version | head -1
  for p in bridge host-local loopback; do
    [ -x "$ROOT/usr/lib/cni/$p" ] || { echo "setup-containerd: CNI plugin $p missing" >&2; exit 1; }
  done
  touch "$STAMP"
  # v2 is a superset of v1 (which had no CNI plugins): an older copy of this script, run from
  # another checkout on this machine, then finds its own stamp and keeps this install.
  touch "$CACHE/.installed-v1"
  rm -f "$IMAGE_STAMP"
fi

# The image: one busybox layer; `tap.local/pause:1` (sandbox image) and `tap.local/busybox:1`.
if [ ! -e "$IMAGE_STAMP" ]; then
  busybox_image "$ROOT/bin/busybox" amd64 "$IMG/busybox.tar" hack/e2e/setup-containerd.sh
  touch "$IMAGE_STAMP"
  echo "setup-containerd: built $IMG/busybox.tar"
fi
echo "setup-containerd: ready ($ROOT)"
