#!/usr/bin/env bash
# Builds containerd 2.x releases for the NRI e2e tests (docs/design/nri.md, "containerd versions
# tested"): `bash hack/e2e/setup-containerd2.sh [VERSION...]` (default: $TAP_CONTAINERD2_VERSIONS,
# else the versions below). Each is built from its Go module with `go install` (no binary
# downloads), static (CGO_ENABLED=0: no btrfs snapshotter, which needs cgo and which the tests do
# not use), into a root laid out like the containerd 1.7 one (hack/e2e/setup-containerd.sh),
# which the tests take with TAP_CONTAINERD_ROOT=<root>:
#   /var/cache/kunpeng-tap/containerd-<version>/root/usr/bin/containerd
#   /var/cache/kunpeng-tap/containerd-<version>/root/usr/bin/containerd-shim-runc-v2
#   /var/cache/kunpeng-tap/containerd-<version>/root/usr/bin/ctr
#   /var/cache/kunpeng-tap/containerd-<version>/root/usr/sbin/runc      -> the 1.7 root's
#   /var/cache/kunpeng-tap/containerd-<version>/root/usr/lib/cni        -> the 1.7 root's
#   /var/cache/kunpeng-tap/containerd-<version>/root/bin/busybox        -> the 1.7 root's
# runc, the CNI plugins and the busybox image are the 1.7 install's (this script runs
# setup-containerd.sh first). Go's caches are under /var/cache/kunpeng-tap/go, as for helm-docs
# (hack/e2e/setup-helm-docs.sh); TAP_GO_CACHE_ROOT=<empty dir> measures a cold build.
# Idempotent (a stamp per version); prints the build time and the MB of modules fetched.
set -euo pipefail

DEFAULT_VERSIONS="v2.3.7 v2.4.2"
CACHE=/var/cache/kunpeng-tap
BASE="$CACHE/containerd/root"
GOROOT_CACHE="${TAP_GO_CACHE_ROOT:-$CACHE/go}"
PKG=github.com/containerd/containerd/v2
# As containerd's Makefile for a static build (STATIC=1); the shim without gRPC, as there.
TAGS="urfave_cli_no_docs osusergo netgo static_build"

if [ "$#" -eq 0 ]; then
  # shellcheck disable=SC2086
  set -- ${TAP_CONTAINERD2_VERSIONS:-$DEFAULT_VERSIONS}
fi

bash "$(dirname "$0")/setup-containerd.sh"

install_version() {
  local v="$1" dir root stamp bin start mb0 mb1
  case "$v" in v*) ;; *) v="v$v" ;; esac
  case "$v" in v2.*) ;; *) echo "setup-containerd2: $v is not a 2.x version" >&2; return 1 ;; esac
  dir="$CACHE/containerd-$v"
  root="$dir/root"
  stamp="$dir/.installed-v1"
  mkdir -p "$dir"
  exec 9>"$dir/.lock"
  flock 9
  if [ -f "$stamp" ] && [ -x "$root/usr/bin/containerd" ] && [ -x "$root/usr/bin/ctr" ] \
    && [ -x "$root/usr/bin/containerd-shim-runc-v2" ] && [ -e "$root/usr/sbin/runc" ]; then
    echo "setup-containerd2: containerd $v already in $root"
    exec 9>&-
    return 0
  fi
  command -v go >/dev/null || { echo "setup-containerd2: go is required" >&2; return 1; }
  mkdir -p "$GOROOT_CACHE/pkg/mod" "$GOROOT_CACHE/cache"
  export GOPATH="$GOROOT_CACHE" GOMODCACHE="$GOROOT_CACHE/pkg/mod" GOCACHE="$GOROOT_CACHE/cache"
  export GOFLAGS=-buildvcs=false CGO_ENABLED=0
  bin="$dir/bin.new"
  rm -rf "$bin"
  mkdir -p "$bin"
  mb0=$(du -sm "$GOMODCACHE/cache/download" 2>/dev/null | cut -f1 || echo 0)
  start=$(date +%s)
  local ldflags="-s -w -X $PKG/version.Version=$v"
  GOBIN="$bin" nice -n 10 go install -trimpath -tags "$TAGS" -ldflags "$ldflags" \
    "$PKG/cmd/containerd@$v" "$PKG/cmd/ctr@$v"
  GOBIN="$bin" nice -n 10 go install -trimpath -tags "$TAGS no_grpc" -ldflags "$ldflags" \
    "$PKG/cmd/containerd-shim-runc-v2@$v"
  mb1=$(du -sm "$GOMODCACHE/cache/download" 2>/dev/null | cut -f1 || echo 0)
  rm -rf "$root"
  mkdir -p "$root/usr/bin" "$root/usr/sbin" "$root/usr/lib" "$root/bin"
  mv "$bin"/containerd "$bin"/ctr "$bin"/containerd-shim-runc-v2 "$root/usr/bin/"
  rmdir "$bin"
  ln -s "$BASE/usr/sbin/runc" "$root/usr/sbin/runc"
  ln -s "$BASE/usr/lib/cni" "$root/usr/lib/cni"
  ln -s "$BASE/bin/busybox" "$root/bin/busybox"
  "$root/usr/bin/containerd" --version
  echo "$v" > "$stamp"
  echo "setup-containerd2: containerd $v built in $(( $(date +%s) - start ))s" \
    "($(( mb1 - mb0 )) MB of modules fetched; $root)"
  exec 9>&-
}

for v in "$@"; do
  install_version "$v"
done
