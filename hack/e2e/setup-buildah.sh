#!/usr/bin/env bash
# Installs buildah (Debian's package), the tool that assembles the agent's and the operator's
# amd64 and arm64 images into one OCI image index (hack/build-images.sh, e2e/tests/e2e/images_multiarch.rs):
# `buildah build --platform ... --manifest` and `buildah manifest push --all`. Its storage is
# never the system's: the scripts and tests give it a private --root/--runroot.
# Idempotent; quick when installed.
set -euo pipefail

# apt_tool
. "$(dirname "$0")/../lib/debian-apt.sh"
apt_tool setup-buildah buildah buildah
buildah --version
