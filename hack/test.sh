#!/usr/bin/env bash
# The project's test command (README): `bash hack/test.sh [unit|e2e|all]` (default all).
#   unit: cargo fmt --check, cargo clippy -D warnings, cargo test --workspace
#   e2e:  installs and starts real components (hack/e2e/*.sh) and runs the e2e tier (TAP_E2E=1)
set -euo pipefail
cd "$(dirname "$0")/.."
tier="${1:-all}"

# k8s-cri (CRI proxy, CRI e2e client) compiles its protos at build time: it needs protoc.
command -v protoc >/dev/null 2>&1 || flock /var/lock/kunpeng-tap-apt sh -c \
  'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq protobuf-compiler'

unit() {
  cargo fmt --all --check
  cargo clippy --workspace --all-targets -- -D warnings
  cargo test --workspace
}

e2e() {
  for s in hack/e2e/setup-*.sh; do
    [ -e "$s" ] || continue
    echo "== $s"
    bash "$s"
  done
  TAP_E2E=1 cargo test -p tap-e2e -- --test-threads=1
}

case "$tier" in
  unit) unit ;;
  e2e) e2e ;;
  all) unit; e2e ;;
  *) echo "usage: hack/test.sh [unit|e2e|all]" >&2; exit 2 ;;
esac
