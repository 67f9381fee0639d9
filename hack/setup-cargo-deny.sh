#!/usr/bin/env bash
# Installs cargo-deny, the unit tier's check of the dependency tree's licenses, bans and sources
# (deny.toml), with `cargo install --locked` from crates.io, cached as
#   /var/cache/kunpeng-tap/bin/cargo-deny   (+ cargo-deny-<version>.stamp)
# The unit tier (hack/test.sh) calls it on every run: building it cold took 5 min 20 s on the
# project's 2-core machine (with other builds running), once per machine. Idempotent.
set -euo pipefail

VERSION="${CARGO_DENY_VERSION:-0.20.2}"
CACHE=/var/cache/kunpeng-tap
BIN="$CACHE/bin"
ROOT="$CACHE/cargo-deny"
STAMP="$BIN/cargo-deny-$VERSION.stamp"
mkdir -p "$BIN"

if [ -f "$STAMP" ] && [ -x "$BIN/cargo-deny" ]; then
  echo "cargo-deny $VERSION already in $BIN"
  exit 0
fi
command -v cargo >/dev/null || { echo "setup-cargo-deny: cargo is required" >&2; exit 1; }
have=""
if [ -x "$ROOT/bin/cargo-deny" ]; then
  have=$("$ROOT/bin/cargo-deny" --version 2>/dev/null | awk '{print $2}')
fi
if [ "$have" != "$VERSION" ]; then
  echo "setup-cargo-deny: building cargo-deny $VERSION (several minutes)"
  start=$(date +%s)
  nice -n 10 cargo install cargo-deny --locked --version "$VERSION" --root "$ROOT"
  echo "setup-cargo-deny: built in $(( $(date +%s) - start ))s"
fi
ln -sf "$ROOT/bin/cargo-deny" "$BIN/cargo-deny"
"$BIN/cargo-deny" --version
touch "$STAMP"
