#!/usr/bin/env bash
# Installs what the kube and cluster e2e tests need (idempotent; caches outside the checkout):
#   - etcd from Debian (etcd-server)
#   - openssl (test certificates are generated at test time)
#   - kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kubectl, built in ONE
#     `go build` from the Go module k8s.io/kubernetes at a pinned release, cached in
#     /var/cache/kunpeng-tap/kube-<version>/ (one folder per release, so a checkout of another
#     release never finds binaries that are not its own; e2e/src/kube.rs names it; GOPATH,
#     GOMODCACHE and GOCACHE under /var/cache/kunpeng-tap/go so later runs reuse the downloads
#     and the build cache).
# The k8s.io/kubernetes go.mod points its staging modules (k8s.io/api, ...) at ./staging/src via
# `replace`; replaces of a dependency are ignored, so the build module below re-creates each of
# them at the matching v0.X.Y release.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.37.2}"
CACHE=/var/cache/kunpeng-tap
BIN="$CACHE/kube-$K8S_VERSION"
CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)
# v2: the five commands (v1 built only kube-apiserver and kubectl).
STAMP="$BIN/kube-${K8S_VERSION}-v2.stamp"
mkdir -p "$BIN" "$CACHE/go"

apt_install() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  flock /var/lock/kunpeng-tap-apt bash -c "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q ${missing[*]}"
}
apt_install etcd-server openssl
command -v etcd >/dev/null || { echo "etcd not found after install" >&2; exit 1; }

all_built() {
  [ -f "$STAMP" ] || return 1
  for c in "${CMDS[@]}"; do [ -x "$BIN/$c" ] || return 1; done
}
if all_built; then
  echo "${CMDS[*]} $K8S_VERSION already cached in $BIN"
  exit 0
fi

# One build at a time on this machine (a second caller waits, then finds the stamp).
exec 9>/var/lock/kunpeng-tap-kube-build
flock 9
if all_built; then
  echo "${CMDS[*]} $K8S_VERSION already cached in $BIN"
  exit 0
fi

# shellcheck source=hack/lib/go-cache.sh
. "$(dirname "$0")/../lib/go-cache.sh"
go_cache_env "$CACHE"
staging_version="v0.${K8S_VERSION#v1.}"

work="$CACHE/go/build-$K8S_VERSION-v2"
mkdir -p "$work"
cd "$work"
gomod_file="$(go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
[ -f "$gomod_file" ] || { echo "cannot download k8s.io/kubernetes@$K8S_VERSION" >&2; exit 1; }
{
  echo "module kunpeng-tap.local/kubebuild"
  echo
  grep -E '^go [0-9]' "$gomod_file"
  echo
  echo "require k8s.io/kubernetes ${K8S_VERSION}"
  echo
  echo "replace ("
  sed -n 's#^\s*\(k8s\.io/[a-z0-9-]*\) => \./staging/src/.*#\t\1 => \1 '"$staging_version"'#p' "$gomod_file"
  echo ")"
} > go.mod
{
  echo "//go:build tools"
  echo
  echo "package kubebuild"
  echo
  echo "import ("
  for c in "${CMDS[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$c\""; done
  echo ")"
} > tools.go
rm -f go.sum
start=$(date +%s)
go mod tidy
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=${K8S_VERSION} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
out="$BIN/.build-$K8S_VERSION"
rm -rf "$out"
mkdir -p "$out"
pkgs=()
for c in "${CMDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
echo "setup-kube: building ${CMDS[*]} $K8S_VERSION in one go build"
nice -n 10 go build -trimpath -ldflags "$ldflags" -o "$out/" "${pkgs[@]}"
for c in "${CMDS[@]}"; do mv "$out/$c" "$BIN/$c"; done
rmdir "$out"
echo "$K8S_VERSION (${CMDS[*]}) built in $(( $(date +%s) - start ))s" | tee "$STAMP"
# v2 is a superset of v1 (kube-apiserver and kubectl only): an older copy of this script, run
# from another checkout on this machine, then finds its stamp and does not rebuild.
cp "$STAMP" "$BIN/kube-${K8S_VERSION}.stamp"
"$BIN/kube-apiserver" --version
"$BIN/kubelet" --version
