#!/usr/bin/env bash
# Builds the agent's and/or the operator's image for amd64 and arm64 from prebuilt static
# binaries and writes each as one OCI archive holding an OCI image index of both platforms.
#
#   bash hack/build-images.sh --out DIR [--arches "amd64 arm64"] agent|operator...
#
# Input: target/image/<arch>/kunpeng-tap (agent) and target/image/<arch>/kunpeng-tap-operator
# (operator) in the checkout, for every arch: amd64 from the host's cargo (`+crt-static`,
# e2e/src/images.rs or hack/release.sh), arm64 from hack/build-arm64.sh --copy-to. Each must be
# a static ELF file of its architecture, or the script stops naming it.
# Output: DIR/kunpeng-tap-<agent|operator>-<version>.oci.tar, its index naming the image
# docker.io/kunpeng-tap/kunpeng-tap-<agent|operator>:<version> (the chart's default image), so
# `ctr -n k8s.io images import [--platform linux/arm64] FILE` on a node serves the chart's
# default without a registry; `skopeo copy --all oci-archive:FILE docker://...` pushes both.
#
# Tool: buildah (Debian's package, hack/e2e/setup-buildah.sh): `buildah build --platform
# linux/<arch> --manifest <list>` of Dockerfile.agent/Dockerfile.operator (BINARIES=prebuilt:
# COPY only, so no emulator is needed to build arm64), then `buildah manifest push --all`.
# Its storage is private to the run (a temp folder, vfs driver); nothing is left behind.
set -euo pipefail
cd "$(dirname "$0")/.."
die() { echo "build-images: $*" >&2; exit 1; }

out="" arches="amd64 arm64" names=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=${2:?--out DIR}; shift 2 ;;
    --arches) arches=${2:?--arches LIST}; shift 2 ;;
    agent|operator) names+=("$1"); shift ;;
    *) die "usage: hack/build-images.sh --out DIR [--arches \"amd64 arm64\"] agent|operator..." ;;
  esac
done
[ -n "$out" ] && [ ${#names[@]} -gt 0 ] ||
  die "usage: hack/build-images.sh --out DIR [--arches \"amd64 arm64\"] agent|operator..."
command -v buildah >/dev/null 2>&1 || die "buildah not found: bash hack/e2e/setup-buildah.sh"
. hack/lib/workspace.sh
version=$(workspace_version)
[ -n "$version" ] || die "no [workspace.package] version in Cargo.toml"

# elf_check FILE ARCH: a static 64-bit little-endian ELF executable for ARCH.
elf_check() {
  local f=$1 arch=$2 want machine interp
  case "$arch" in amd64) want=62 ;; arm64) want=183 ;; *) die "unknown arch $arch" ;; esac
  [ -f "$f" ] || die "$f missing (amd64: e2e/src/images.rs or hack/release.sh build it; arm64: bash hack/build-arm64.sh --copy-to target/image/arm64)"
  [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] || die "$f is no ELF file"
  machine=$(od -An -t u2 -j 18 -N 2 "$f" | tr -d ' ')
  [ "$machine" = "$want" ] || die "$f is for ELF machine $machine, not $arch ($want)"
  interp=$(LC_ALL=C readelf -l "$f" 2>/dev/null | grep -c 'Requesting program interpreter' || true)
  [ "$interp" = 0 ] || die "$f is not statically linked"
}

work=$(mktemp -d /tmp/kunpeng-tap-images.XXXXXX)
bh=(buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs)
cleanup() {
  "${bh[@]}" rm --all >/dev/null 2>&1 || true
  "${bh[@]}" rmi --all --force >/dev/null 2>&1 || true
  awk -v p="$work" 'index($2, p) == 1 {print $2}' /proc/self/mounts | sort -r |
    while read -r m; do umount -l "$m" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$out"

for name in "${names[@]}"; do
  case "$name" in agent) bin=kunpeng-tap ;; operator) bin=kunpeng-tap-operator ;; esac
  list="docker.io/kunpeng-tap/kunpeng-tap-$name:$version"
  file="$out/kunpeng-tap-$name-$version.oci.tar"
  for arch in $arches; do
    elf_check "target/image/$arch/$bin" "$arch"
    s=$(date +%s)
    "${bh[@]}" build --quiet --platform "linux/$arch" --manifest "$list" \
      --build-arg BINARIES=prebuilt -f "Dockerfile.$name" . > "$work/build-$name-$arch.log" 2>&1 ||
      { tail -30 "$work/build-$name-$arch.log" >&2; die "buildah build of Dockerfile.$name for linux/$arch failed"; }
    echo "build-images: $name linux/$arch built in $(( $(date +%s) - s ))s"
  done
  rm -f "$file"
  "${bh[@]}" manifest push --quiet --all "$list" "oci-archive:$file:$list" >/dev/null
  tar -tf "$file" oci-layout index.json >/dev/null 2>&1 || die "$file is no OCI image layout"
  echo "build-images: $file ($(stat -c %s "$file") bytes; $arches)"
done
