#!/usr/bin/env bash
# Instructions per placement operation, against the baseline in the repository.
#
#   bash hack/bench-ir.sh            measure and compare with engine/benches/ir-baseline.txt;
#                                    fails when an operation costs more than TOLERANCE_PCT
#                                    (default 5) percent over its baseline
#   bash hack/bench-ir.sh --update   measure and write the baseline (commit it with the change
#                                    that moved it, saying why)
#
# What is counted: engine/examples/placement_workload.rs (release build) under valgrind's
# cachegrind, without cache simulation: the instructions of N operations on the criterion
# bench's state (largest fixture, 1,000 containers) minus those of the setup alone, divided
# by N. Unlike a timing, the count does not move with the machine's load, so the unit tier
# checks it on CI's shared 2-core machine; it moves with the compiler (the baseline names the
# rustc it was taken with; another one is reported, and may shift counts by a few percent).
# Wall-clock figures stay with criterion (cargo bench -p tap-engine --bench placement).
# valgrind: Debian's package, installed when missing and run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
BASELINE=engine/benches/ir-baseline.txt
FIXTURE_NAME=synthetic-4s-8numa-smt-384t
N=${N:-1000}
TOLERANCE_PCT=${TOLERANCE_PCT:-5}
ROWS=(
  "topology-aware decide-burstable"
  "topology-aware create-remove-burstable"
  "topology-aware decide-guaranteed"
  "topology-aware create-remove-guaranteed"
  "numa-aware decide-burstable"
  "numa-aware create-remove-burstable"
)
die() { echo "bench-ir: $*" >&2; exit 1; }
mode=check
case "${1:-}" in
  "") ;;
  --update) mode=update ;;
  *) die "usage: hack/bench-ir.sh [--update]" ;;
esac

if ! command -v valgrind >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || die "valgrind not found (Debian package valgrind)"
  echo "bench-ir: installing Debian's valgrind"
  . hack/lib/debian-apt.sh
  apt_install_quietly --no-install-recommends valgrind
fi
cargo build -q --release --locked -p tap-engine --example placement_workload --example fixture_dir
bin="${CARGO_TARGET_DIR:-target}/release/examples/placement_workload"
# The fixture as a folder (its dump written out under the target dir), read as /sys is.
FIXTURE=$("${CARGO_TARGET_DIR:-target}/release/examples/fixture_dir" "$FIXTURE_NAME")
rustc_v=$(rustc -V)

instructions() { # policy operation n
  valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \
    "$bin" "$FIXTURE" "$@" 2>&1 >/dev/null |
    awk '/I *refs:/ { gsub(/,/, "", $NF); print $NF }'
}

declare -A base=()
base_rustc=""
if [ -f "$BASELINE" ]; then
  base_rustc=$(sed -n 's/^# rustc: //p' "$BASELINE")
  while read -r pol op ir; do
    base["$pol $op"]=$ir
  done < <(grep -v '^#' "$BASELINE")
fi
[ "$mode" = update ] || [ -f "$BASELINE" ] || die "$BASELINE missing: bash hack/bench-ir.sh --update"
[ "$mode" = update ] || [ "$base_rustc" = "$rustc_v" ] ||
  echo "bench-ir: baseline taken with $base_rustc, measuring with $rustc_v: counts may differ by a few percent"

out=$(mktemp)
trap 'rm -f "$out"' EXIT
{
  echo "# Instructions per placement operation (hack/bench-ir.sh; valgrind cachegrind, N=$N,"
  echo "# fixture $(basename "$FIXTURE"), 1,000 containers placed). Update with --update."
  echo "# rustc: $rustc_v"
} > "$out"
fail=0
declare -A setup=()
printf '%-16s %-26s %10s %10s %8s\n' policy operation baseline now ratio
for row in "${ROWS[@]}"; do
  read -r pol op <<< "$row"
  [ -n "${setup[$pol]:-}" ] || setup[$pol]=$(instructions "$pol" setup 0)
  total=$(instructions "$pol" "$op" "$N")
  [ -n "$total" ] && [ -n "${setup[$pol]}" ] || die "no instruction count for $row"
  now=$(( (total - setup[$pol]) / N ))
  echo "$pol $op $now" >> "$out"
  was=${base[$row]:-}
  if [ -n "$was" ] && [ "$was" -gt 0 ]; then
    ratio=$(awk -v a="$now" -v b="$was" 'BEGIN { printf "%.3f", a / b }')
    verdict=""
    if [ $(( now * 100 )) -gt $(( was * (100 + TOLERANCE_PCT) )) ]; then
      verdict="  REGRESSION (> ${TOLERANCE_PCT}%)"; fail=1
    elif [ $(( now * 100 )) -lt $(( was * (100 - TOLERANCE_PCT) )) ]; then
      verdict="  faster: bash hack/bench-ir.sh --update"
    fi
  else
    ratio="-"; verdict=""
  fi
  printf '%-16s %-26s %10s %10s %8s%s\n' "$pol" "$op" "${was:--}" "$now" "$ratio" "$verdict"
done
if [ "$mode" = update ]; then
  cp "$out" "$BASELINE"
  echo "bench-ir: wrote $BASELINE"
elif [ "$fail" = 1 ]; then
  die "instructions per operation over the baseline: find the cause (callgrind), or update the baseline saying why"
fi
