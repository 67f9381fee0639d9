#!/usr/bin/env bash
# Installs buildah (Debian's package), the tool that assembles the agent's and the operator's
# amd64 and arm64 images into one OCI image index (hack/build-images.sh, e2e/tests/e2e/images_multiarch.rs):
# `buildah build --platform ... --manifest` and `buildah manifest push --all`. Its storage is
# never the system's: the scripts and tests give it a private --root/--runroot.
# Idempotent; quick when installed.
set -euo pipefail

if command -v buildah >/dev/null 2>&1; then
  buildah --version
  exit 0
fi
echo "setup-buildah: installing Debian's buildah package"
start=$(date +%s)
. "$(dirname "$0")/../lib/debian-apt.sh"
apt_install_quietly --no-install-recommends buildah
command -v buildah >/dev/null 2>&1 || {
  echo "setup-buildah: the buildah package installed no buildah" >&2
  exit 1
}
buildah --version
echo "setup-buildah: installed in $(( $(date +%s) - start ))s"
