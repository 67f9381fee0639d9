#!/usr/bin/env bash
# Installs what the NUMA guest tier (e2e/tests/numa_vm.rs) needs: QEMU (system emulators, TCG:
# this machine has no usable KVM) from the system's own apt, and Debian's stock kernel
# (linux-image-*-amd64) unpacked with `dpkg -x` under /var/cache/kunpeng-tap/vm/x86, with the
# modules the guest's init loads (virtio, 9p, overlay). No root image is built: the guest mounts
# the host's / read-only over 9p with an overlay on top and runs the host's own containerd, runc
# and test binaries (docs/design/numa-vm.md). The busybox of the guest's initramfs is the one
# setup-containerd.sh unpacks (run first: hack/test.sh runs the setup scripts in name order).
# The kernel comes from a private apt configuration whose archive is read from the system's own
# apt configuration (no host is written here). The arm64 guest gets a root of its own (its
# binaries are not the host's): Debian's arm64 packages unpacked under $ARM/root, and the
# programs it runs built for aarch64 by hack/build-arm64.sh --guest. Idempotent; quick when
# cached.
set -euo pipefail

CACHE=/var/cache/kunpeng-tap/vm
X86="$CACHE/x86"
ARM="$CACHE/arm64"
APT="$CACHE/apt"
STAMP="$X86/.installed-v1"
ARM_STAMP="$ARM/.installed-v1"
ROOT_STAMP="$ARM/.root-v1"
BUSYBOX=/var/cache/kunpeng-tap/containerd/root/bin/busybox
# The kernel series the guest runs: Debian bookworm's stock kernel.
KERNEL_META=linux-image-amd64

mkdir -p "$CACHE"

if ! command -v qemu-system-x86_64 >/dev/null || ! command -v qemu-system-aarch64 >/dev/null \
  || ! command -v cpio >/dev/null; then
  echo "setup-vm: installing qemu-system-x86, qemu-system-arm and cpio (system apt)"
  flock /var/lock/kunpeng-tap-apt apt-get -qq update
  DEBIAN_FRONTEND=noninteractive flock /var/lock/kunpeng-tap-apt \
    apt-get install -y -qq --no-install-recommends qemu-system-x86 qemu-system-arm cpio >/dev/null
fi
qemu-system-x86_64 --version | head -1
qemu-system-aarch64 --version | head -1

HACK=$(cd "$(dirname "$0")/.." && pwd)
# debian_archive, private_apt_options
. "$HACK/lib/debian-apt.sh"
# busybox_image
. "$HACK/lib/busybox-image.sh"

# A private apt configuration for bookworm amd64 and arm64 (its own lists and archive cache).
aptopts=()
private_apt() {
  [ ${#aptopts[@]} -eq 0 ] || return 0
  local archive
  archive=$(debian_archive)
  [ -n "$archive" ] || { echo "setup-vm: no Debian archive in this system's apt sources" >&2; exit 1; }
  echo "setup-vm: Debian archive from the system's apt configuration: $archive"
  private_apt_options "$APT"
  echo "deb [arch=amd64,arm64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $archive bookworm main" > "$APT/etc/sources.list"
  aptopts+=(-o "APT::Architecture=amd64" -o "APT::Architectures=amd64,arm64")
  flock /var/lock/kunpeng-tap-apt apt-get "${aptopts[@]}" -qq update
}

if [ ! -e "$STAMP" ] || ! ls "$X86"/kimg/boot/vmlinuz-* >/dev/null 2>&1; then
  private_apt
  # The metapackage names the current kernel package (linux-image-6.1.0-N-amd64).
  pkg=$(apt-cache "${aptopts[@]}" depends "$KERNEL_META" | awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
  [ -n "$pkg" ] || { echo "setup-vm: $KERNEL_META names no kernel package" >&2; exit 1; }
  echo "setup-vm: downloading $pkg"
  cd "$APT/archives"
  rm -f ./*.deb
  flock /var/lock/kunpeng-tap-apt apt-get "${aptopts[@]}" -qq download "$pkg"
  rm -rf "$X86/kimg"
  mkdir -p "$X86/kimg"
  dpkg-deb -x ./"$pkg"_*.deb "$X86/kimg"
  rm -f ./*.deb
  touch "$STAMP"
fi

kernel=$(ls "$X86"/kimg/boot/vmlinuz-* | head -1)
kver=${kernel##*/vmlinuz-}
[ -x "$BUSYBOX" ] || { echo "setup-vm: $BUSYBOX is missing: run hack/e2e/setup-containerd.sh first" >&2; exit 1; }
for m in drivers/virtio/virtio_pci.ko net/9p/9pnet_virtio.ko fs/9p/9p.ko fs/overlayfs/overlay.ko; do
  [ -e "$X86/kimg/lib/modules/$kver/kernel/$m" ] || { echo "setup-vm: $m missing from $kver" >&2; exit 1; }
done
echo "setup-vm: guest kernel $kver ready under $X86"

# The arm64 guest: Debian's arm64 kernel and busybox-static (its userland: the host's binaries
# are x86), as foreign-architecture downloads, unpacked, never installed.
if [ ! -e "$ARM_STAMP" ] || ! ls "$ARM"/kimg/boot/vmlinuz-* >/dev/null 2>&1 || [ ! -x "$ARM/bb/bin/busybox" ]; then
  private_apt
  pkg=$(apt-cache "${aptopts[@]}" depends linux-image-arm64:arm64 | awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
  pkg=${pkg%:arm64}
  [ -n "$pkg" ] || { echo "setup-vm: linux-image-arm64 names no kernel package" >&2; exit 1; }
  echo "setup-vm: downloading $pkg:arm64 busybox-static:arm64"
  cd "$APT/archives"
  rm -f ./*.deb
  flock /var/lock/kunpeng-tap-apt apt-get "${aptopts[@]}" -qq download "$pkg:arm64" busybox-static:arm64
  rm -rf "$ARM/kimg" "$ARM/bb"
  mkdir -p "$ARM/kimg" "$ARM/bb"
  dpkg-deb -x ./"$pkg"_*_arm64.deb "$ARM/kimg"
  dpkg-deb -x ./busybox-static_*_arm64.deb "$ARM/bb"
  rm -f ./*.deb
  touch "$ARM_STAMP"
fi
echo "setup-vm: arm64 guest kernel $(ls "$ARM"/kimg/boot/vmlinuz-* | head -1 | sed 's/.*vmlinuz-//') ready under $ARM"

# The arm64 guest's root, which it mounts as its / (the x86 guest mounts the host's): Debian's
# arm64 busybox-static, libc6 and libseccomp2 (bookworm), and containerd 1.7 (trixie) and runc
# (bookworm), the releases setup-containerd.sh takes for amd64, unpacked with `dpkg -x`, never
# installed. containerd, runc and an arm64 busybox image sit at the paths the e2e harness uses
# on the host (/var/cache/kunpeng-tap/containerd/...), so the same code runs in both guests.
arm64_root() {
  local new="$ARM/root.new" apt64="$CACHE/apt-arm64" archive ctd bin interp lib
  archive=$(debian_archive)
  [ -n "$archive" ] || { echo "setup-vm: no Debian archive in this system's apt sources" >&2; exit 1; }
  private_apt_options "$apt64"
  for suite in trixie bookworm; do
    echo "deb [arch=arm64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $archive $suite main"
  done > "$apt64/etc/sources.list"
  aptopts+=(-o "APT::Architecture=arm64" -o "APT::Architectures=arm64")
  flock /var/lock/kunpeng-tap-apt apt-get "${aptopts[@]}" -qq update
  echo "setup-vm: downloading the arm64 guest's containerd/trixie runc libseccomp2 libc6 busybox-static (bookworm)"
  cd "$apt64/archives"
  rm -f ./*.deb
  flock /var/lock/kunpeng-tap-apt apt-get "${aptopts[@]}" -qq download \
    containerd/trixie runc/bookworm libseccomp2/bookworm libc6/bookworm busybox-static/bookworm
  rm -rf "$new"
  ctd="$new/var/cache/kunpeng-tap/containerd"
  mkdir -p "$ctd/root" "$new/etc"
  for d in ./libc6_*.deb ./libseccomp2_*.deb ./busybox-static_*.deb; do dpkg-deb -x "$d" "$new"; done
  for d in ./containerd_*.deb ./runc_*.deb; do dpkg-deb -x "$d" "$ctd/root"; done
  rm -f ./*.deb
  echo 'root:x:0:0:root:/root:/bin/sh' > "$new/etc/passwd"
  echo 'root:x:0:' > "$new/etc/group"
  echo '127.0.0.1 localhost' > "$new/etc/hosts"
  : > "$new/etc/resolv.conf"
  busybox_image "$new/bin/busybox" arm64 "$ctd/images/busybox.tar" hack/e2e/setup-vm.sh
  # Each program finds its loader and libraries in the root.
  for bin in "$ctd"/root/usr/bin/containerd "$ctd"/root/usr/bin/containerd-shim-runc-v2 \
    "$ctd"/root/usr/bin/ctr "$ctd"/root/usr/sbin/runc; do
    interp=$(readelf -l "$bin" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
    [ -e "$new$interp" ] || { echo "setup-vm: $bin needs $interp, not in the arm64 root" >&2; exit 1; }
    for lib in $(readelf -d "$bin" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p'); do
      [ -e "$new/lib/aarch64-linux-gnu/$lib" ] || [ -e "$new/usr/lib/aarch64-linux-gnu/$lib" ] ||
        { echo "setup-vm: $bin needs $lib, not in the arm64 root" >&2; exit 1; }
    done
  done
  rm -rf "$ARM/root"
  mv "$new" "$ARM/root"
  touch "$ROOT_STAMP"
}
if [ ! -e "$ROOT_STAMP" ] || [ ! -x "$ARM/root/bin/busybox" ]; then
  arm64_root
fi
echo "setup-vm: arm64 guest root ready under $ARM/root ($(du -sh "$ARM/root" | cut -f1))"

# What the arm64 guest runs besides that root: the numa_vm test binary, tap-touch and the agent,
# built for aarch64 with the arm64 tier's tests (seconds when that tier has run on this
# checkout).
bash "$HACK/build-arm64.sh" --guest
