#!/usr/bin/env bash
# Builds the kube-scheduler of kubernetes-sigs/scheduler-plugins (the NUMA-aware
# NodeResourceTopologyMatch plugin among others) from its Go module at a pinned tag, unchanged:
# the module's own go.mod and go.sum, only the packages `cmd/scheduler` needs downloaded (not
# `all`). Cached as /var/cache/kunpeng-tap/bin/kube-scheduler-plugins-$SCHED_PLUGINS_VERSION
# (idempotent; GOPATH/GOMODCACHE/GOCACHE under /var/cache/kunpeng-tap/go). The
# NodeResourceTopology CRD it reads: hack/e2e/setup-nrt-crd.sh.
set -euo pipefail

SCHED_PLUGINS_VERSION="${SCHED_PLUGINS_VERSION:-v0.35.4-devel}"
CACHE=/var/cache/kunpeng-tap
BIN="$CACHE/bin"
OUT="$BIN/kube-scheduler-plugins-$SCHED_PLUGINS_VERSION"
# v2: reports the Kubernetes version it is built on.
STAMP="$OUT.v2.stamp"
mkdir -p "$BIN" "$CACHE/go"

cached() {
  [ -x "$OUT" ] && [ -f "$STAMP" ] || return 1
  echo "scheduler-plugins $SCHED_PLUGINS_VERSION already cached: $OUT"
}
# shellcheck source=hack/lib/build-once.sh
. "$(dirname "$0")/../lib/build-once.sh"
build_once sched-plugins cached

# shellcheck source=hack/lib/go-cache.sh
. "$(dirname "$0")/../lib/go-cache.sh"
go_cache_env "$CACHE"

start=$(date +%s)
work="$CACHE/go/build-scheduler-plugins-$SCHED_PLUGINS_VERSION"
go_module_copy sigs.k8s.io/scheduler-plugins "$SCHED_PLUGINS_VERSION" "$work"
cd "$work"
# The version the binary reports is the Kubernetes release it is built on (its go.mod's
# k8s.io/kubernetes): the scheduler checks its emulation version against it.
k8s="$(sed -n 's#^\s*k8s.io/kubernetes => k8s.io/kubernetes \(v1\.[0-9.]*\)$#\1#p' go.mod)"
[ -n "$k8s" ] || { echo "no k8s.io/kubernetes version in the module's go.mod" >&2; exit 1; }
minor="$(echo "$k8s" | cut -d. -f2)"
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=${k8s} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${minor}"
echo "setup-scheduler-plugins: building cmd/scheduler $SCHED_PLUGINS_VERSION"
nice -n 10 go build -trimpath -ldflags "$ldflags" -o "$OUT.tmp" ./cmd/scheduler
mv "$OUT.tmp" "$OUT"
"$OUT" --version
cd /
rm -rf "$work"
echo "scheduler-plugins $SCHED_PLUGINS_VERSION built in $(( $(date +%s) - start ))s" | tee "$STAMP"
