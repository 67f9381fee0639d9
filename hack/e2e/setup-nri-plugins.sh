#!/usr/bin/env bash
# Builds the topology-aware NRI plugin of containers/nri-plugins (the Go reference this project is
# compared with) for the start-path benchmark (e2e/src/bin/start_path/main.rs, row (d)); cached in
# /var/cache/kunpeng-tap/bin/nri-topology-aware-$NRI_PLUGINS_VERSION (idempotent; GOPATH,
# GOMODCACHE and GOCACHE under /var/cache/kunpeng-tap/go as for setup-kube.sh).
#
# The module's go.mod has `replace` directives, which are ignored when it is a dependency, so the
# build module below re-creates them:
#   - a replace to another module version is copied as it is;
#   - a replace to a folder of the repository (`github.com/containers/nri-plugins/pkg/topology
#     v0.0.0 => ./pkg/topology`, a nested module the release zip leaves out) becomes the same
#     nested module at the release commit (its pseudo-version), which only the Go module proxy
#     can give: this machine reaches no VCS host.
# When the proxy does not serve such a nested module, the plugin cannot be built from the proxy:
# the script says so and exits 0 (the benchmark then skips row (d) and says why), or 1 with
# TAP_REQUIRE_NRI_PLUGINS=1.
#
# Its build time is not known (it never got past the module download here); Go builds of this
# size took 40 minutes and more on the 2-core VM (setup-kube.sh), so under CI (CI=true) the
# script does nothing unless TAP_NRI_PLUGINS=1.
set -euo pipefail

NRI_PLUGINS_VERSION="${NRI_PLUGINS_VERSION:-v0.12.1}"
MOD=github.com/containers/nri-plugins
CACHE=/var/cache/kunpeng-tap
BIN="$CACHE/bin"
OUT="$BIN/nri-topology-aware-$NRI_PLUGINS_VERSION"
STAMP="$OUT.stamp"
mkdir -p "$BIN" "$CACHE/go"

cached() {
  [ -x "$OUT" ] && [ -f "$STAMP" ] || return 1
  echo "nri-plugins topology-aware $NRI_PLUGINS_VERSION already cached: $OUT"
}
if [ "${CI:-}" = "true" ] && [ "${TAP_NRI_PLUGINS:-}" != "1" ] && ! { [ -x "$OUT" ] && [ -f "$STAMP" ]; }; then
  echo "setup-nri-plugins: skipped under CI (a long Go build; set TAP_NRI_PLUGINS=1 to run it)"
  exit 0
fi

unavailable() {
  echo "setup-nri-plugins: cannot build $MOD $NRI_PLUGINS_VERSION from the Go module proxy: $*" >&2
  echo "setup-nri-plugins: the start-path benchmark skips row (d) (docs/design/start-path.md)" >&2
  if [ "${TAP_REQUIRE_NRI_PLUGINS:-}" = "1" ]; then exit 1; fi
  exit 0
}

# shellcheck source=hack/lib/build-once.sh
. "$(dirname "$0")/../lib/build-once.sh"
build_once nri-plugins cached

# shellcheck source=hack/lib/go-cache.sh
. "$(dirname "$0")/../lib/go-cache.sh"
go_cache_env "$CACHE"
# Only the module proxy: a fallback to `direct` would try git hosts this machine cannot reach.
GOPROXY="$(go env GOPROXY | cut -d, -f1)"
export GOPROXY

info_json="$(go mod download -json "$MOD@$NRI_PLUGINS_VERSION" 2>&1)" ||
  unavailable "the module itself is not served ($(echo "$info_json" | grep -m1 '"Error"' || true))"
gomod_file="$(echo "$info_json" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
info_file="$(echo "$info_json" | sed -n 's/.*"Info": "\(.*\)".*/\1/p')"
[ -f "$gomod_file" ] && [ -f "$info_file" ] || unavailable "no go.mod/info in the download"

# The release commit's time and hash give the pseudo-version of a nested module at that commit.
commit_time="$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$info_file")"
commit_hash="$(sed -n 's/.*"Hash":"\([0-9a-f]*\)".*/\1/p' "$info_file")"
[ -n "$commit_time" ] && [ -n "$commit_hash" ] || unavailable "no commit time/hash in $info_file"
stamp_time="$(date -u -d "$commit_time" +%Y%m%d%H%M%S)"
pseudo="v0.0.0-${stamp_time}-${commit_hash:0:12}"

# The replace lines, one per line: "old oldver => new [newver]".
replaces="$(awk '/^replace \($/{r=1;next} r&&/^\)$/{r=0} r{print} /^replace [^(]/{sub(/^replace /,"");print}' "$gomod_file")"
work="$CACHE/go/build-nri-plugins-$NRI_PLUGINS_VERSION"
mkdir -p "$work"
lines=()
while IFS= read -r line; do
  case "$line" in *"=>"*) ;; *) continue ;; esac
  # "path [version] => path [version]": the version on either side is optional.
  left="$(echo "${line%%=>*}" | xargs)"
  right="$(echo "${line#*=>}" | xargs)"
  old="${left%% *}"
  new="${right%% *}"
  case "$new" in
    ./*)
      # A folder of the repository: the nested module at the release commit.
      if ! err="$(go mod download -json "$old@$pseudo" 2>&1)"; then
        unavailable "the nested module $old (replaced by $new in $MOD's go.mod) is not served at the release commit ($old@$pseudo: $(echo "$err" | sed -n 's/.*"Error": "\(.*\)".*/\1/p' | head -c 300))"
      fi
      lines+=("	$left => $old $pseudo")
      ;;
    *) lines+=("	$left => $right") ;;
  esac
done <<< "$replaces"

cd "$work"
{
  echo "module kunpeng-tap.local/nripluginsbuild"
  echo
  grep -E '^go [0-9]' "$gomod_file"
  echo
  echo "require $MOD $NRI_PLUGINS_VERSION"
  echo
  echo "replace ("
  printf '%s\n' "${lines[@]}"
  echo ")"
} > go.mod
cat > tools.go <<'EOF'
//go:build tools

package nripluginsbuild

import _ "github.com/containers/nri-plugins/cmd/plugins/topology-aware"
EOF
rm -f go.sum
start=$(date +%s)
nice -n 10 go mod tidy
echo "setup-nri-plugins: building $MOD/cmd/plugins/topology-aware $NRI_PLUGINS_VERSION"
nice -n 10 go build -trimpath -ldflags "-s -w" -o "$OUT.tmp" "$MOD/cmd/plugins/topology-aware"
mv "$OUT.tmp" "$OUT"
echo "$NRI_PLUGINS_VERSION topology-aware built in $(( $(date +%s) - start ))s" | tee "$STAMP"
