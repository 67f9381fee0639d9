#!/usr/bin/env bash
# Installs helm for the e2e tier (chart lint/template/install): built from its Go module with
# `go install`, no binary downloads. Idempotent; everything is cached under
# /var/cache/kunpeng-tap (never inside the checkout):
#   /var/cache/kunpeng-tap/bin/helm       the binary (+ helm-<version>.stamp)
#   /var/cache/kunpeng-tap/go/pkg/mod     GOMODCACHE (module sources)
#   /var/cache/kunpeng-tap/go/cache       GOCACHE (compiled packages)
# (the same layout as hack/e2e/setup-kube.sh, so the two builds share downloads and packages)
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.19.5}"
CACHE=/var/cache/kunpeng-tap
BIN="$CACHE/bin"
STAMP="$BIN/helm-$HELM_VERSION.stamp"
mkdir -p "$BIN" "$CACHE/go/pkg/mod" "$CACHE/go/cache"

if [ -f "$STAMP" ] && [ -x "$BIN/helm" ] \
   && "$BIN/helm" version --template '{{.Version}}' 2>/dev/null | grep -qx "$HELM_VERSION"; then
  echo "helm $HELM_VERSION already in $BIN"
  exit 0
fi

# Go toolchain >= 1.24.
# shellcheck source=hack/lib/go-cache.sh
. "$(dirname "$0")/../lib/go-cache.sh"
go_cache_env "$CACHE"
start=$(date +%s)

# Helm's Makefile stamps the Kubernetes version it assumes offline (`helm template`,
# `helm lint`: .Capabilities.KubeVersion, kubeVersion checks) from its client-go version
# (v0.X.Y -> 1.X); without it helm assumes v1.20. Do the same from its go.mod.
gomod="$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
[ -f "$gomod" ] || { echo "setup-helm: cannot download helm.sh/helm/v3@$HELM_VERSION" >&2; exit 1; }
k8s_minor="$(sed -n 's#^\s*k8s\.io/client-go v0\.\([0-9]*\)\..*#\1#p' "$gomod" | head -1)"
[ -n "$k8s_minor" ] || { echo "setup-helm: no k8s.io/client-go in $gomod" >&2; exit 1; }

echo "building helm $HELM_VERSION (Kubernetes 1.$k8s_minor) from helm.sh/helm/v3 (go install)"
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  ldflags="$ldflags -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
done
GOBIN="$BIN" nice -n 10 go install -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
"$BIN/helm" version --short
echo "$HELM_VERSION k8s 1.$k8s_minor" > "$STAMP"
echo "helm $HELM_VERSION built in $(( $(date +%s) - start ))s"
