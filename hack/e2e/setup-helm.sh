#!/usr/bin/env bash
# Installs helm for the e2e tier (chart lint/template/dry-run): built from its Go module with
# `go install`, no binary downloads. Idempotent; everything is cached under
# /var/cache/kunpeng-tap (never inside the checkout):
#   /var/cache/kunpeng-tap/bin/helm       the binary
#   /var/cache/kunpeng-tap/go/pkg/mod     GOMODCACHE (module sources)
#   /var/cache/kunpeng-tap/go/cache       GOCACHE (compiled packages)
# (the same layout as hack/e2e/setup-kube.sh, so the two builds share downloads and packages)
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.19.5}"
CACHE=/var/cache/kunpeng-tap
BIN="$CACHE/bin"
mkdir -p "$BIN" "$CACHE/go/pkg/mod" "$CACHE/go/cache"

if [ -x "$BIN/helm" ] && "$BIN/helm" version --template '{{.Version}}' 2>/dev/null | grep -qx "$HELM_VERSION"; then
  echo "helm $HELM_VERSION already in $BIN"
  exit 0
fi

command -v go >/dev/null || { echo "setup-helm: go is required (Go toolchain >= 1.24)" >&2; exit 1; }
echo "building helm $HELM_VERSION from helm.sh/helm/v3 (go install)"
start=$(date +%s)
# The version stamp is what `helm version` prints (go install gives no VCS stamp otherwise).
GOBIN="$BIN" GOPATH="$CACHE/go" GOMODCACHE="$CACHE/go/pkg/mod" GOCACHE="$CACHE/go/cache" GOFLAGS=-buildvcs=false \
  CGO_ENABLED=0 nice -n 10 go install \
  -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
  "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
echo "helm $HELM_VERSION built in $(( $(date +%s) - start ))s: $("$BIN/helm" version --short)"
