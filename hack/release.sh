#!/usr/bin/env bash
# `make release`: what a release ships, written to dist/ (gitignored):
#   kunpeng-tap-<chart version>.tgz                       the Helm chart (`helm package`)
#   kunpeng-tap-agent-<version>-linux-<arch>.oci.tar      the agent image, an OCI image-layout archive
#   kunpeng-tap-operator-<version>-linux-<arch>.oci.tar   the operator image, likewise
#   SHA256SUMS                                             their SHA-256 sums (`sha256sum -c SHA256SUMS`)
#
# The images are for this machine's architecture and built as e2e/tests/images.rs builds them:
# static binaries on the host (cargo, `+crt-static`), then BuildKit's `docker build
# --build-arg BINARIES=prebuilt` of Dockerfile.agent and Dockerfile.operator. `docker save` of
# Docker 20.10 (Debian's) writes Docker's own archive format, so skopeo copies each saved image
# into an OCI archive. RELEASE_BINARIES=build compiles inside the Dockerfiles' Rust stage
# instead (it pulls the Rust image from a registry). TAP_IMAGE_PROFILE=dev builds unoptimised
# binaries (a quick try of this script, not a release).
#
# Needs: cargo; helm (hack/e2e/setup-helm.sh, or $HELM, or on PATH); a docker CLI that builds
# with BuildKit (20.10, or a newer one with buildx; $DOCKER picks one) and a Docker daemon
# ($DOCKER_HOST or the system's; when none answers and dockerd is installed, the script runs a
# private one in a temp folder, as the e2e tests do, and stops it); skopeo (Debian `skopeo`).
# hack/e2e/setup-docker.sh installs Docker. A missing piece stops the script, naming it.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DIST="${DIST:-$ROOT/dist}"
BINARIES="${RELEASE_BINARIES:-prebuilt}"

die() { echo "release: $*" >&2; exit 1; }
step() { echo "== release: $*"; }
t0=$(date +%s)

# --- versions -------------------------------------------------------------------------------
version=$(awk '/^\[workspace.package\]/{p=1; next} /^\[/{p=0} p && /^version *=/{gsub(/[" ]/, "", $0); sub(/^version=/, "", $0); print; exit}' Cargo.toml)
chart_version=$(awk '/^version:/{print $2; exit}' charts/kunpeng-tap/Chart.yaml | tr -d '"')
app_version=$(awk '/^appVersion:/{print $2; exit}' charts/kunpeng-tap/Chart.yaml | tr -d '"')
[ -n "$version" ] || die "no [workspace.package] version in Cargo.toml"
[ "$app_version" = "$version" ] ||
  die "Chart.yaml appVersion $app_version is not the workspace version $version (the images' tag)"
case "$(uname -m)" in
  x86_64) arch=amd64 ;;
  aarch64) arch=arm64 ;;
  *) die "unsupported architecture $(uname -m)" ;;
esac
triple="$(uname -m)-unknown-linux-gnu"
case "${TAP_IMAGE_PROFILE:-release}" in
  dev) profile=dev; profile_dir=debug; echo "release: TAP_IMAGE_PROFILE=dev: unoptimised binaries, not for shipping" ;;
  *) profile=release; profile_dir=release ;;
esac

# --- tools ----------------------------------------------------------------------------------
helm_bin=${HELM:-}
if [ -z "$helm_bin" ]; then
  if [ -x /var/cache/kunpeng-tap/bin/helm ]; then helm_bin=/var/cache/kunpeng-tap/bin/helm
  elif command -v helm >/dev/null 2>&1; then helm_bin=$(command -v helm)
  else die "helm not found: run hack/e2e/setup-helm.sh or set HELM"; fi
fi
[ -x "$helm_bin" ] || command -v "$helm_bin" >/dev/null 2>&1 || die "HELM=$helm_bin is not a program"
command -v cargo >/dev/null 2>&1 || die "cargo not found"
command -v sha256sum >/dev/null 2>&1 || die "sha256sum not found (coreutils)"
command -v skopeo >/dev/null 2>&1 ||
  die "skopeo not found: apt-get install skopeo (it turns the saved images into OCI archives)"

# A docker CLI whose `docker build` uses BuildKit: 20.10's own, or a newer one with buildx
# (from 23 on, DOCKER_BUILDKIT=1 without buildx fails).
buildkit_cli() {
  local c=$1 major
  command -v "$c" >/dev/null 2>&1 || return 1
  "$c" buildx version >/dev/null 2>&1 && return 0
  major=$("$c" --version 2>/dev/null | sed -n 's/^Docker version \([0-9]*\)\..*/\1/p')
  [ -n "$major" ] && [ "$major" -lt 23 ]
}
docker_cli=""
for c in ${DOCKER:-} docker /usr/bin/docker; do
  if buildkit_cli "$c"; then docker_cli=$c; break; fi
done
[ -n "$docker_cli" ] || die "no docker CLI that builds with BuildKit (Docker 20.10, or one with the buildx plugin): install docker.io (hack/e2e/setup-docker.sh) or set DOCKER"

work=$(mktemp -d /tmp/kunpeng-tap-release.XXXXXX)
dockerd_pid=""
cleanup() {
  if [ -n "$dockerd_pid" ]; then
    local ctr_pid=""
    [ -f "$work/exec/containerd/containerd.pid" ] && ctr_pid=$(cat "$work/exec/containerd/containerd.pid")
    kill -TERM "$dockerd_pid" 2>/dev/null || true
    for _ in $(seq 150); do kill -0 "$dockerd_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$dockerd_pid" 2>/dev/null || true
    [ -n "$ctr_pid" ] && kill -KILL "$ctr_pid" 2>/dev/null || true
    awk -v p="$work" 'index($2, p) == 1 {print $2}' /proc/self/mounts | sort -r |
      while read -r m; do umount -l "$m" 2>/dev/null || true; done
  fi
  rm -rf "$work"
}
trap cleanup EXIT
export DOCKER_BUILDKIT=1 DOCKER_CONFIG="$work/cli"

if ! "$docker_cli" info >/dev/null 2>&1; then
  command -v dockerd >/dev/null 2>&1 ||
    die "no Docker daemon answers ($docker_cli info failed) and dockerd is not installed (hack/e2e/setup-docker.sh)"
  [ "$(id -u)" = 0 ] || die "no Docker daemon answers, and a private dockerd needs root"
  step "no Docker daemon answers: starting a private dockerd in $work"
  echo '{}' > "$work/daemon.json"
  dockerd --config-file="$work/daemon.json" --data-root="$work/data" --exec-root="$work/exec" \
    --pidfile="$work/dockerd.pid" --host="unix://$work/docker.sock" \
    --iptables=false --ip-masq=false --bridge=none --storage-driver=vfs > "$work/dockerd.log" 2>&1 &
  dockerd_pid=$!
  export DOCKER_HOST="unix://$work/docker.sock"
  for _ in $(seq 120); do
    "$docker_cli" info >/dev/null 2>&1 && break
    kill -0 "$dockerd_pid" 2>/dev/null || { tail -20 "$work/dockerd.log" >&2; die "the private dockerd exited"; }
    sleep 0.5
  done
  "$docker_cli" info >/dev/null 2>&1 || { tail -20 "$work/dockerd.log" >&2; die "the private dockerd did not answer in 60 s"; }
fi
echo "release: kunpeng-tap $version (chart $chart_version), linux/$arch, docker CLI $docker_cli, $("$docker_cli" version --format 'daemon {{.Server.Version}}' 2>/dev/null)"

mkdir -p "$DIST"
rm -f "$DIST/kunpeng-tap-$chart_version.tgz" "$DIST"/kunpeng-tap-*-"$version"-linux-"$arch".oci.tar "$DIST/SHA256SUMS"

# --- chart ----------------------------------------------------------------------------------
step "helm lint and package"
"$helm_bin" lint --strict charts/kunpeng-tap >/dev/null
"$helm_bin" package charts/kunpeng-tap --destination "$DIST" >/dev/null
[ -s "$DIST/kunpeng-tap-$chart_version.tgz" ] || die "helm package wrote no kunpeng-tap-$chart_version.tgz"

# --- images ---------------------------------------------------------------------------------
# package, binary, Dockerfile, image name (the chart's default repositories)
images=(
  "node-agent kunpeng-tap Dockerfile.agent kunpeng-tap/kunpeng-tap-agent"
  "tap-operator kunpeng-tap-operator Dockerfile.operator kunpeng-tap/kunpeng-tap-operator"
)
target_dir="${CARGO_TARGET_DIR:-$ROOT/target}/image-build"
for spec in "${images[@]}"; do
  read -r package bin dockerfile image <<< "$spec"
  if [ "$BINARIES" = prebuilt ]; then
    step "static $bin ($profile)"
    s=$(date +%s)
    env CARGO_TARGET_DIR="$target_dir" \
      "CARGO_TARGET_$(echo "$triple" | tr 'a-z-' 'A-Z_')_RUSTFLAGS=-C target-feature=+crt-static" \
      CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols \
      CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_DEV_STRIP=symbols \
      cargo build --profile "$profile" --locked -p "$package" --bin "$bin" --target "$triple"
    built="$target_dir/$triple/$profile_dir/$bin"
    if readelf -l "$built" 2>/dev/null | grep -q 'Requesting program interpreter'; then
      die "$built is not statically linked"
    fi
    install -D -m 0755 "$built" "target/image/$bin"
    echo "release: $bin built in $(( $(date +%s) - s ))s"
  fi
  step "docker build -f $dockerfile ($BINARIES binaries)"
  ref="$image:$version"
  "$docker_cli" build --progress=plain --build-arg "BINARIES=$BINARIES" -f "$dockerfile" -t "$ref" . \
    > "$work/build-$bin.log" 2>&1 || { tail -30 "$work/build-$bin.log" >&2; die "docker build -f $dockerfile failed"; }
  "$docker_cli" save -o "$work/$bin.docker.tar" "$ref"
  out="$DIST/$(basename "$image")-$version-linux-$arch.oci.tar"
  # Named as every runtime names the chart's default image (docker.io/<repository>:<tag>), so
  # `ctr -n k8s.io images import <file>` on a node serves the chart's defaults without a
  # registry.
  skopeo --insecure-policy copy --quiet "docker-archive:$work/$bin.docker.tar" "oci-archive:$out:docker.io/$ref" >/dev/null
  tar -tf "$out" oci-layout index.json >/dev/null 2>&1 || die "$out is no OCI image layout"
done

# --- checksums ------------------------------------------------------------------------------
step "SHA256SUMS"
(cd "$DIST" && sha256sum "kunpeng-tap-$chart_version.tgz" ./*-"$version"-linux-"$arch".oci.tar |
  sed 's#  \./#  #' > SHA256SUMS && sha256sum -c --quiet SHA256SUMS)
cat "$DIST/SHA256SUMS"
echo "release: done in $(( $(date +%s) - t0 ))s; dist: $DIST"
echo "release: push with skopeo copy oci-archive:<file> docker://<registry>/<name>:$version, or on a node ctr -n k8s.io images import <file>"
