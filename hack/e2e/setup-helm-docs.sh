#!/usr/bin/env bash
# Installs helm-docs (the chart README is generated from the values' comments; a test checks it
# for drift): built from its Go module with `go install`, no binary downloads. Idempotent;
# cached under /var/cache/kunpeng-tap like helm (hack/e2e/setup-helm.sh):
#   /var/cache/kunpeng-tap/bin/helm-docs   the binary (+ helm-docs-<version>.stamp)
# Regenerate the README after changing values.yaml:
#   /var/cache/kunpeng-tap/bin/helm-docs --chart-search-root charts --skip-version-footer
set -euo pipefail

HELM_DOCS_VERSION="${HELM_DOCS_VERSION:-v1.14.2}"
CACHE=/var/cache/kunpeng-tap
BIN="$CACHE/bin"
STAMP="$BIN/helm-docs-$HELM_DOCS_VERSION.stamp"
mkdir -p "$BIN" "$CACHE/go/pkg/mod" "$CACHE/go/cache"

if [ -f "$STAMP" ] && [ -x "$BIN/helm-docs" ]; then
  echo "helm-docs $HELM_DOCS_VERSION already in $BIN"
  exit 0
fi
# shellcheck source=hack/lib/go-cache.sh
. "$(dirname "$0")/../lib/go-cache.sh"
go_cache_env "$CACHE"
start=$(date +%s)
GOBIN="$BIN" nice -n 10 go install "github.com/norwoodj/helm-docs/cmd/helm-docs@$HELM_DOCS_VERSION"
echo "$HELM_DOCS_VERSION" > "$STAMP"
echo "helm-docs $HELM_DOCS_VERSION built in $(( $(date +%s) - start ))s"
