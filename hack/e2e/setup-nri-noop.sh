#!/usr/bin/env bash
# Builds hack/e2e/nri-noop (an NRI plugin that changes nothing, on containerd's own stub
# library) for the start-path benchmark's row (e): what the NRI hop alone costs a plugin.
# Cached in /var/cache/kunpeng-tap/bin/nri-noop (idempotent: rebuilt when main.go or the NRI
# version changes; GOPATH, GOMODCACHE and GOCACHE under /var/cache/kunpeng-tap/go as for
# setup-kube.sh). Only the Go module proxy is used.
set -euo pipefail

NRI_VERSION="${NRI_VERSION:-v0.8.0}"   # the NRI library containerd 1.7 speaks
HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE=/var/cache/kunpeng-tap
OUT="$CACHE/bin/nri-noop"
BUILD="$CACHE/go/build-nri-noop"
key="$NRI_VERSION $(sha256sum "$HERE/nri-noop/main.go" | cut -d' ' -f1)"
if [ -x "$OUT" ] && [ "$(cat "$OUT.stamp" 2>/dev/null)" = "$key" ]; then
  echo "nri-noop already built: $OUT"
  exit 0
fi
command -v go >/dev/null || { echo "go not found on PATH" >&2; exit 1; }
exec 9>/var/lock/kunpeng-tap-nri-noop-build
flock 9
export GOPATH="$CACHE/go" GOMODCACHE="$CACHE/go/pkg/mod" GOCACHE="$CACHE/go/cache"
export GOFLAGS="-buildvcs=false -mod=mod" CGO_ENABLED=0
# Only the module proxy: a fallback to `direct` would try git hosts this machine cannot reach.
GOPROXY="$(go env GOPROXY | cut -d, -f1)"
export GOPROXY
mkdir -p "$BUILD" "$CACHE/bin"
cp "$HERE/nri-noop/main.go" "$BUILD/main.go"
cd "$BUILD"
rm -f go.mod go.sum
go mod init kunpeng-tap.local/nri-noop >/dev/null 2>&1
go mod edit -require="github.com/containerd/nri@$NRI_VERSION"
nice -n 10 go mod tidy
nice -n 10 go build -trimpath -ldflags "-s -w" -o "$OUT.tmp" .
mv "$OUT.tmp" "$OUT"
echo "$key" > "$OUT.stamp"
echo "built $OUT"
