#!/usr/bin/env bash
# Checks the workspace's `rust-version` (Cargo.toml) against the lock file: no package Cargo
# resolves (Cargo.lock, every platform) may declare a newer `rust-version` than the workspace
# does, else the workspace's minimum is not true. The workspace's own code is checked by clippy
# (`incompatible_msrv`, on in the unit tier): it flags std APIs newer than `rust-version`.
# Packages that declare no rust-version cannot be checked this way.
# Prints the packages that set the minimum. Needs cargo and jq.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v jq >/dev/null || {
  echo "check-rust-version: installing jq"
  flock /var/lock/kunpeng-tap-apt sh -c \
    'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq jq' >/dev/null
}

meta=$(cargo metadata --locked --format-version 1)
# "VERSION NAME PKGVERSION" for every resolved package with a rust-version; workspace members
# are marked with a leading "ws".
rows=$(jq -r '
  (.workspace_members | map({(.): true}) | add) as $ws
  | (.resolve.nodes | map({(.id): true}) | add) as $resolved
  | .packages[]
  | select($resolved[.id] and .rust_version != null)
  | (if $ws[.id] then "ws " else "dep " end) + "\(.rust_version) \(.name) \(.version)"' <<<"$meta")

norm() { # 1.89 -> 1.89.0
  local v=$1
  case "$v" in *.*.*) ;; *) v=$v.0 ;; esac
  echo "$v"
}
need=$(awk '$1 == "dep" {print $2}' <<<"$rows" | while read -r v; do norm "$v"; done | sort -V | tail -1)
[ -n "$need" ] || { echo "check-rust-version: no dependency declares a rust-version" >&2; exit 1; }
echo "check-rust-version: the lock file needs Rust $need, set by:"
awk -v need="$need" '$1 == "dep" { v = $2; if (v !~ /\.[0-9]+\.[0-9]+$/) v = v ".0"; if (v == need) print "  " $3 " " $4 }' <<<"$rows"

bad=0
while read -r _ v name _; do
  if [ "$(printf '%s\n%s\n' "$(norm "$v")" "$need" | sort -V | head -1)" != "$need" ]; then
    echo "check-rust-version: $name says rust-version = \"$v\", but the lock file needs $need" >&2
    bad=1
  fi
done < <(awk '$1 == "ws"' <<<"$rows")
members=$(jq '.workspace_members | length' <<<"$meta")
declared=$(awk '$1 == "ws"' <<<"$rows" | wc -l)
if [ "$declared" != "$members" ]; then
  echo "check-rust-version: $((members - declared)) workspace member(s) set no rust-version" >&2
  bad=1
fi
[ "$bad" = 0 ] || exit 1
echo "check-rust-version: every workspace member says $(awk '$1 == "ws" {print $2; exit}' <<<"$rows"): ok"
