#!/usr/bin/env bash
# Builds the DRA CPU driver of kubernetes-sigs/dra-driver-cpu (`cmd/dracpu`, the peer the
# comparison runs next to kunpeng-tap's own DRA driver) from its Go module at a pinned tag,
# unchanged: the module's own go.mod and go.sum, only the packages `cmd/dracpu` needs
# downloaded (not `all`), static (CGO off). Cached as
# /var/cache/kunpeng-tap/bin/dracpu-$DRA_DRIVER_CPU_VERSION (idempotent; GOPATH/GOMODCACHE/GOCACHE
# under the cache's go/). TAP_CACHE=<dir> builds under another cache root (an empty one
# measures the cold build: docs/measurements/ci.md).
#
# `hack/test.sh e2e` runs it with the other set-ups and then the cluster tier's `dra_peer`
# scenario in a cluster of its own (docs/user/comparison.md). Cold: about 2 min on a quiet
# machine, 4.5 min at load 7 (docs/measurements/ci.md).
set -euo pipefail

DRA_DRIVER_CPU_VERSION="${DRA_DRIVER_CPU_VERSION:-v0.2.0}"
MODULE=github.com/kubernetes-sigs/dra-driver-cpu
CACHE="${TAP_CACHE:-/var/cache/kunpeng-tap}"
BIN="$CACHE/bin"
OUT="$BIN/dracpu-$DRA_DRIVER_CPU_VERSION"
STAMP="$OUT.stamp"
mkdir -p "$BIN" "$CACHE/go"

cached() {
  [ -x "$OUT" ] && [ -f "$STAMP" ] || return 1
  echo "dra-driver-cpu $DRA_DRIVER_CPU_VERSION already cached: $OUT"
}
# shellcheck source=hack/lib/build-once.sh
. "$(dirname "$0")/../lib/build-once.sh"
build_once dra-driver-cpu cached

# shellcheck source=hack/lib/go-cache.sh
. "$(dirname "$0")/../lib/go-cache.sh"
go_cache_env "$CACHE"

start=$(date +%s)
work="$CACHE/go/build-dra-driver-cpu-$DRA_DRIVER_CPU_VERSION"
go_module_copy "$MODULE" "$DRA_DRIVER_CPU_VERSION" "$work"
cd "$work"
echo "setup-dra-driver-cpu: building cmd/dracpu $DRA_DRIVER_CPU_VERSION"
# The upstream Dockerfile's flags (-ldflags "-s -w"), static as CGO_ENABLED=0 makes it.
nice -n 10 go build -trimpath -ldflags "-s -w" -o "$OUT.tmp" ./cmd/dracpu
mv "$OUT.tmp" "$OUT"
help="$("$OUT" --help 2>&1 || true)"
grep -q -- '-cpu-device-mode' <<<"$help" || {
  echo "$OUT does not look like dracpu (no --cpu-device-mode flag)" >&2
  exit 1
}
cd /
rm -rf "$work"
secs=$(( $(date +%s) - start ))
echo "dra-driver-cpu $DRA_DRIVER_CPU_VERSION built in ${secs}s (load $(cut -d' ' -f1-3 /proc/loadavg))" | tee "$STAMP"
