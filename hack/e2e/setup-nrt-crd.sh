#!/usr/bin/env bash
# Fetches the NodeResourceTopology CRD (topology.node.k8s.io, served v1alpha1 + v1alpha2, the one
# the scheduler-plugins NodeResourceTopologyMatch plugin reads) from its Go module
# github.com/k8stopologyawareschedwg/noderesourcetopology-api, for the e2e tests that check the
# agent's NodeResourceTopology objects against the real schema. Idempotent; cached under
# /var/cache/kunpeng-tap (never inside the checkout):
#   /var/cache/kunpeng-tap/nrt/crd.yaml   the CRD, as the module ships it
#   /var/cache/kunpeng-tap/go/pkg/mod     GOMODCACHE (shared with setup-kube.sh, setup-helm.sh)
set -euo pipefail

NRT_API_VERSION="${NRT_API_VERSION:-v0.1.2}"
MODULE=github.com/k8stopologyawareschedwg/noderesourcetopology-api
CACHE=/var/cache/kunpeng-tap
OUT="$CACHE/nrt"
STAMP="$OUT/crd-$NRT_API_VERSION.stamp"
mkdir -p "$OUT" "$CACHE/go/pkg/mod" "$CACHE/go/cache"

if [ -f "$STAMP" ] && [ -s "$OUT/crd.yaml" ]; then
  echo "NodeResourceTopology CRD $NRT_API_VERSION already in $OUT"
  exit 0
fi
# shellcheck source=hack/lib/go-cache.sh
. "$(dirname "$0")/../lib/go-cache.sh"
go_cache_env "$CACHE"
dir="$(go mod download -json "$MODULE@$NRT_API_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
[ -f "$dir/manifests/crd.yaml" ] || { echo "setup-nrt-crd: no manifests/crd.yaml in $MODULE@$NRT_API_VERSION" >&2; exit 1; }
grep -q 'name: v1alpha2' "$dir/manifests/crd.yaml" \
  || { echo "setup-nrt-crd: $MODULE@$NRT_API_VERSION has no v1alpha2" >&2; exit 1; }
cp "$dir/manifests/crd.yaml" "$OUT/crd.yaml.tmp"
mv "$OUT/crd.yaml.tmp" "$OUT/crd.yaml"
echo "$NRT_API_VERSION" > "$STAMP"
echo "NodeResourceTopology CRD $NRT_API_VERSION in $OUT/crd.yaml"
