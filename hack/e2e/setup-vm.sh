#!/usr/bin/env bash
# Installs what the NUMA guest tier (e2e/tests/numa_vm.rs) needs: QEMU (system emulators, TCG:
# this machine has no usable KVM) from the system's own apt, and Debian's stock kernel
# (linux-image-*-amd64) unpacked with `dpkg -x` under /var/cache/kunpeng-tap/vm/x86, with the
# modules the guest's init loads (virtio, 9p, overlay). No root image is built: the guest mounts
# the host's / read-only over 9p with an overlay on top and runs the host's own containerd, runc
# and test binaries (docs/design/numa-vm.md). The busybox of the guest's initramfs is the one
# setup-containerd.sh unpacks (run first: hack/test.sh runs the setup scripts in name order).
# The kernel comes from a private apt configuration whose archive is read from the system's own
# apt configuration (no host is written here). Idempotent; quick when cached.
set -euo pipefail

CACHE=/var/cache/kunpeng-tap/vm
X86="$CACHE/x86"
ARM="$CACHE/arm64"
APT="$CACHE/apt"
STAMP="$X86/.installed-v1"
ARM_STAMP="$ARM/.installed-v1"
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

# debian_archive, private_apt_options
. "$(dirname "$0")/../lib/debian-apt.sh"

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
