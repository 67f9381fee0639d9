#!/usr/bin/env bash
# `make release`: what a release ships, written to dist/ (gitignored):
#   kunpeng-tap-<chart version>.tgz              the Helm chart (`helm package`)
#   kunpeng-tap-agent-<version>.oci.tar          the agent image, linux/amd64 and linux/arm64 in
#                                                one OCI image index (an OCI image-layout archive)
#   kunpeng-tap-operator-<version>.oci.tar       the operator image, likewise
#   SHA256SUMS                                   their SHA-256 sums (`sha256sum -c SHA256SUMS`)
#
# The images are built from static binaries (hack/build-images.sh, buildah): amd64 with the
# host's cargo (glibc, `+crt-static`, hack/static-rustflags), arm64 with hack/build-arm64.sh (musl, in its Debian
# trixie chroot: about 35 min the first time, seconds when nothing changed). Run as root on an
# amd64 host (the arm64 build needs a chroot). RELEASE_ARCHES="amd64" builds one architecture
# only; TAP_IMAGE_PROFILE=dev builds unoptimised amd64 binaries (a quick try of this script, not
# a release).
#
# Needs: cargo; helm (hack/e2e/setup-helm.sh, or $HELM, or on PATH); buildah
# (hack/e2e/setup-buildah.sh); sha256sum. A missing piece stops the script, naming it.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DIST="${DIST:-$ROOT/dist}"
ARCHES="${RELEASE_ARCHES:-amd64 arm64}"

die() { echo "release: $*" >&2; exit 1; }
step() { echo "== release: $*"; }
t0=$(date +%s)

# --- versions -------------------------------------------------------------------------------
. hack/lib/workspace.sh
version=$(workspace_version)
chart_version=$(awk '/^version:/{print $2; exit}' charts/kunpeng-tap/Chart.yaml | tr -d '"')
app_version=$(awk '/^appVersion:/{print $2; exit}' charts/kunpeng-tap/Chart.yaml | tr -d '"')
[ -n "$version" ] || die "no [workspace.package] version in Cargo.toml"
[ "$app_version" = "$version" ] ||
  die "Chart.yaml appVersion $app_version is not the workspace version $version (the images' tag)"
[ "$(uname -m)" = x86_64 ] || die "release builds run on an amd64 host (arm64 is cross-built), not $(uname -m)"
triple=x86_64-unknown-linux-gnu
case "${TAP_IMAGE_PROFILE:-release}" in
  dev) profile=dev; profile_dir=debug; echo "release: TAP_IMAGE_PROFILE=dev: unoptimised binaries, not for shipping" ;;
  *) profile=release; profile_dir=release ;;
esac
for a in $ARCHES; do
  case "$a" in amd64|arm64) ;; *) die "RELEASE_ARCHES: amd64 and/or arm64, not $a" ;; esac
done

# --- tools ----------------------------------------------------------------------------------
helm_bin=${HELM:-}
if [ -z "$helm_bin" ]; then
  if [ -x /var/cache/kunpeng-tap/bin/helm ]; then helm_bin=/var/cache/kunpeng-tap/bin/helm
  elif command -v helm >/dev/null 2>&1; then helm_bin=$(command -v helm)
  else die "helm not found: run hack/e2e/setup-helm.sh or set HELM"; fi
fi
[ -x "$helm_bin" ] || command -v "$helm_bin" >/dev/null 2>&1 || die "HELM=$helm_bin is not a program"
command -v cargo >/dev/null 2>&1 || die "cargo not found"
command -v sha256sum >/dev/null 2>&1 || die "sha256sum not found (coreutils)"
command -v buildah >/dev/null 2>&1 || die "buildah not found: bash hack/e2e/setup-buildah.sh"
case " $ARCHES " in *" arm64 "*) [ "$(id -u)" = 0 ] || die "the arm64 build (hack/build-arm64.sh) needs root" ;; esac
echo "release: kunpeng-tap $version (chart $chart_version), linux: $ARCHES, $(buildah --version)"

mkdir -p "$DIST"
rm -f "$DIST/kunpeng-tap-$chart_version.tgz" "$DIST"/kunpeng-tap-*-"$version".oci.tar "$DIST/SHA256SUMS"

# --- chart ----------------------------------------------------------------------------------
step "helm lint and package"
"$helm_bin" lint --strict charts/kunpeng-tap >/dev/null
"$helm_bin" package charts/kunpeng-tap --destination "$DIST" >/dev/null
[ -s "$DIST/kunpeng-tap-$chart_version.tgz" ] || die "helm package wrote no kunpeng-tap-$chart_version.tgz"

# --- binaries -------------------------------------------------------------------------------
if [[ " $ARCHES " == *" amd64 "* ]]; then
  target_dir="${CARGO_TARGET_DIR:-$ROOT/target}/image-build"
  static_rustflags=$(grep -v '^#' hack/static-rustflags | tail -n 1)
  for spec in "node-agent kunpeng-tap" "tap-operator kunpeng-tap-operator"; do
    read -r package bin <<< "$spec"
    step "static $bin for amd64 ($profile)"
    s=$(date +%s)
    env CARGO_TARGET_DIR="$target_dir" \
      "CARGO_TARGET_$(echo "$triple" | tr 'a-z-' 'A-Z_')_RUSTFLAGS=$static_rustflags" \
      CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols \
      CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_DEV_STRIP=symbols \
      cargo build --profile "$profile" --locked -p "$package" --bin "$bin" --target "$triple"
    install -D -m 0755 "$target_dir/$triple/$profile_dir/$bin" "target/image/amd64/$bin"
    echo "release: $bin built in $(( $(date +%s) - s ))s"
  done
fi
if [[ " $ARCHES " == *" arm64 "* ]]; then
  step "static agent and operator for arm64 (hack/build-arm64.sh)"
  bash hack/build-arm64.sh --copy-to "$ROOT/target/image/arm64"
fi

# --- images ---------------------------------------------------------------------------------
step "images (hack/build-images.sh: $ARCHES)"
bash hack/build-images.sh --out "$DIST" --arches "$ARCHES" agent operator

# --- checksums ------------------------------------------------------------------------------
step "SHA256SUMS"
(cd "$DIST" && sha256sum "kunpeng-tap-$chart_version.tgz" ./*-"$version".oci.tar |
  sed 's#  \./#  #' > SHA256SUMS && sha256sum -c --quiet SHA256SUMS)
cat "$DIST/SHA256SUMS"
echo "release: done in $(( $(date +%s) - t0 ))s; dist: $DIST"
echo "release: push with skopeo copy --all oci-archive:<file> docker://<registry>/<name>:$version, or on a node ctr -n k8s.io images import <file>"
