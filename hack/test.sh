#!/usr/bin/env bash
# The project's test command (README): `bash hack/test.sh [unit|arm64|e2e|containerd2|all]`
# (default all: unit, arm64, e2e, containerd2).
#   unit: cargo fmt --check, cargo clippy -D warnings (the product's own code also without
#         unwrap/expect/panic/todo/unimplemented), cargo deny check licenses bans sources
#         (cargo-deny built once, hack/setup-cargo-deny.sh), cargo test --workspace, instructions per placement
#         operation against their baseline (hack/bench-ir.sh)
#   arm64: builds the agent for aarch64 (static musl) in a Debian trixie chroot and runs the
#         engine's and the agent's tests under qemu-user, and the arm64 agent's --explain
#         against the amd64 one; then builds what the arm64 NUMA guest of the e2e tier runs
#         (hack/build-arm64.sh --agent-only --test --dev-agent --guest; root)
#   e2e:  installs and starts real components (hack/e2e/*.sh) and runs the e2e tier (TAP_E2E=1);
#         with TAP_CONTAINERD2_VERSIONS set, also the containerd2 tier's tests for those versions
#   containerd2: builds containerd 2.x (hack/e2e/setup-containerd2.sh; TAP_CONTAINERD2_VERSIONS,
#         default "v2.3.7 v2.4.2") and runs the NRI tests against each (docs/design/nri.md, "containerd
#         versions tested")
set -euo pipefail
cd "$(dirname "$0")/.."
tier="${1:-all}"
usage="usage: hack/test.sh [unit|arm64|e2e|containerd2|all]"
case "$tier" in
  unit | arm64 | e2e | containerd2 | all) ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
# CI keeps Cargo's build output outside the fresh clone so later runs on the same machine
# start warm; locally the usual ./target is used.
if [ "${CI:-}" = "true" ] && [ -z "${CARGO_TARGET_DIR:-}" ]; then
  export CARGO_TARGET_DIR=/var/cache/kunpeng-tap/target
  mkdir -p "$CARGO_TARGET_DIR"
fi
bash hack/ensure-protoc.sh

unit() {
  # rust-version (Cargo.toml) is no older than any locked dependency needs (clippy's
  # incompatible_msrv, below, checks the workspace's own code against it).
  bash hack/check-rust-version.sh
  cargo fmt --all --check
  # Every relative link of the README, the CHANGELOG, docs/ and the chart's README resolves.
  python3 hack/check-md-links.py
  cargo clippy --workspace --all-targets -- -D warnings
  # The product never panics on its own (docs/design/reliability.md): its libraries and binaries,
  # tests excluded, may not unwrap, expect, panic, todo or unimplemented.
  cargo clippy -p tap-engine -p tap-api -p tap-bin-support -p node-agent -p tap-operator \
    --lib --bins -- -D warnings -D clippy::unwrap_used -D clippy::expect_used \
    -D clippy::panic -D clippy::todo -D clippy::unimplemented
  deny
  cargo test --workspace
  # Instructions per placement operation against engine/benches/ir-baseline.txt (valgrind;
  # a count the machine's load does not move): a start-path regression fails here.
  bash hack/bench-ir.sh
}

# The dependency tree's licenses, duplicate crates (warnings) and sources (crates.io only), as
# deny.toml says, on every run: cargo-deny is built once into /var/cache/kunpeng-tap
# (hack/setup-cargo-deny.sh; about 5 minutes cold). Advisories are not checked: they need the
# RustSec database from the network.
deny() {
  bash hack/setup-cargo-deny.sh
  /var/cache/kunpeng-tap/bin/cargo-deny check --hide-inclusion-graph licenses bans sources
}

arm64() {
  # The agent checked, run and compared is the aarch64 tests' own build (static musl, dev
  # profile): the release build added about 17 min to a cold run and nothing its tests check
  # (`bash hack/build-arm64.sh` builds the release binaries). The amd64 agent of the --explain
  # comparison: the dev build the unit tier has made.
  # --guest: also the numa_vm test binary and tap-touch for the arm64 NUMA guest (e2e tier),
  # built beside the tests (a cargo build of their own would compile every dependency again).
  bash hack/build-arm64.sh --agent-only --test --dev-agent --guest --amd64-profile dev
}

e2e() {
  for s in hack/e2e/setup-*.sh; do
    [ -e "$s" ] || continue
    # containerd 2.x builds take minutes: only for the containerd2 tier.
    [ "$s" = hack/e2e/setup-containerd2.sh ] && continue
    echo "== $s"
    bash "$s"
  done
  # The churn tests also run four seeded rounds after their phases, each at rest within the
  # bound (seeds that once ended on a shared container still holding an exclusive CPU); a
  # longer soak: TAP_CHURN_SEEDS=1-40 (docs/design/reliability.md).
  # The tests that need real components are #[ignore]d (a plain cargo test lists them as
  # ignored): --include-ignored runs them; --skip in_guest leaves out the NUMA guest's own side,
  # which the numa_vm tests run inside their guests. --no-fail-fast: a failing test binary does
  # not hide the results of the ones after it.
  TAP_E2E=1 TAP_CHURN_SEEDS="${TAP_CHURN_SEEDS-11,17,29,33}" cargo test -p tap-e2e --no-fail-fast -- \
    --include-ignored --test-threads=1 --skip in_guest
  # The DRA comparison (docs/user/comparison.md): kubernetes-sigs/dra-driver-cpu, then
  # kunpeng-tap's DRA driver, one after the other as the node's only NRI plugin, in a cluster
  # of their own (the run above installs the chart's agent); about a minute.
  TAP_E2E=1 TAP_CLUSTER_SCENARIOS=dra_peer cargo test -p tap-e2e --test e2e -- --include-ignored \
    --test-threads=1 cluster::cluster_tier
  if [ -n "${TAP_CONTAINERD2_VERSIONS:-}" ]; then
    containerd2
  fi
}

# The NRI tests against containerd 2.x releases, each built from its Go module into
# /var/cache/kunpeng-tap/containerd-<version>/root (hack/e2e/setup-containerd2.sh) and taken
# with TAP_CONTAINERD_ROOT. Every version runs, a failure fails the tier at the end.
containerd2() {
  local versions="${TAP_CONTAINERD2_VERSIONS:-v2.3.7 v2.4.2}" v t failed=""
  # shellcheck disable=SC2086
  bash hack/e2e/setup-containerd2.sh $versions
  for v in $versions; do
    v="v${v#v}"
    # Test-name filters of the e2e binary (substrings: nri:: also matches faults_nri::).
    for t in "churn_containerd::churn_nri" "nri:: --skip faults_nri::" "faults_nri::"; do
      echo "== containerd $v: $t"
      # shellcheck disable=SC2086
      set -- $t
      TAP_E2E=1 TAP_CHURN_SEEDS="${TAP_CHURN_SEEDS-11,17,29,33}" \
        TAP_CONTAINERD_ROOT="/var/cache/kunpeng-tap/containerd-$v/root" \
        cargo test -p tap-e2e --test e2e -- --include-ignored --test-threads=1 "$@" ||
        failed="$failed $v:$1"
    done
  done
  if [ -n "$failed" ]; then
    echo "containerd 2.x NRI tests failed:$failed" >&2
    return 1
  fi
}

case "$tier" in
  unit) unit ;;
  arm64) arm64 ;;
  e2e) e2e ;;
  containerd2) containerd2 ;;
  all) unit; arm64; e2e; containerd2 ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
