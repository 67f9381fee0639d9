# Sourced by the setup scripts that build Go programs from the Go module proxy
# (hack/e2e/setup-kube.sh, setup-nri-plugins.sh, setup-scheduler-plugins.sh).

# go_cache_env CACHE: fails without go on PATH; else points GOPATH, GOMODCACHE and GOCACHE
# under CACHE/go (shared by every such build on this machine, so downloads and the build cache
# are reused), resolves modules by the module files (-mod=mod) and builds static binaries.
go_cache_env() {
  command -v go >/dev/null || { echo "go not found on PATH" >&2; return 1; }
  export GOPATH="$1/go"
  export GOMODCACHE="$1/go/pkg/mod"
  export GOCACHE="$1/go/cache"
  export GOFLAGS="-buildvcs=false -mod=mod"
  export CGO_ENABLED=0
}

# go_module_copy MODULE VERSION WORK: downloads MODULE@VERSION through the module proxy (into
# GOMODCACHE: go_cache_env first) and copies it, as published and writable, to a fresh WORK
# (the module cache is read-only).
go_module_copy() {
  local dir
  dir="$(go mod download -json "$1@$2" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
  [ -d "$dir" ] || { echo "cannot download $1@$2" >&2; return 1; }
  rm -rf "$3"
  mkdir -p "$3"
  cp -a "$dir/." "$3/"
  chmod -R u+w "$3"
}
