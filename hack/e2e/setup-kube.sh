#!/usr/bin/env bash
# Installs what the kube e2e tests need (idempotent; caches outside the checkout):
#   - etcd from Debian (etcd-server)
#   - openssl (test certificates are generated at test time)
#   - kube-apiserver and kubectl built with `go build` from the Go module k8s.io/kubernetes at a
#     pinned release, cached in /var/cache/kunpeng-tap/bin/ (GOPATH/GOMODCACHE under
#     /var/cache/kunpeng-tap/go so later runs reuse the downloads and the build cache).
# The k8s.io/kubernetes go.mod points its staging modules (k8s.io/api, ...) at ./staging/src via
# `replace`; replaces of a dependency are ignored, so the build module below re-creates each of
# them at the matching v0.X.Y release.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.34.4}"
CACHE=/var/cache/kunpeng-tap
BIN="$CACHE/bin"
STAMP="$BIN/kube-${K8S_VERSION}.stamp"
mkdir -p "$BIN" "$CACHE/go"

apt_install() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  flock /var/lock/kunpeng-tap-apt bash -c "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q ${missing[*]}"
}
apt_install etcd-server openssl
command -v etcd >/dev/null || { echo "etcd not found after install" >&2; exit 1; }

if [ -f "$STAMP" ] && [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/kubectl" ]; then
  echo "kube-apiserver/kubectl $K8S_VERSION already cached in $BIN"
  exit 0
fi

command -v go >/dev/null || { echo "go not found on PATH" >&2; exit 1; }
export GOPATH="$CACHE/go"
export GOMODCACHE="$CACHE/go/pkg/mod"
export GOCACHE="$CACHE/go/cache"
export GOFLAGS="-buildvcs=false -mod=mod"
export CGO_ENABLED=0
staging_version="v0.${K8S_VERSION#v1.}"

work="$CACHE/go/build-$K8S_VERSION"
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
cat > tools.go <<'GO'
//go:build tools

package kubebuild

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
rm -f go.sum
start=$(date +%s)
go mod tidy
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=${K8S_VERSION} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
go build -trimpath -ldflags "$ldflags" -o "$BIN/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver
go build -trimpath -ldflags "$ldflags" -o "$BIN/kubectl.tmp" k8s.io/kubernetes/cmd/kubectl
mv "$BIN/kube-apiserver.tmp" "$BIN/kube-apiserver"
mv "$BIN/kubectl.tmp" "$BIN/kubectl"
echo "$K8S_VERSION built in $(( $(date +%s) - start ))s" | tee "$STAMP"
"$BIN/kube-apiserver" --version
