#!/usr/bin/env bash
# Installs promtool, the rule checker the chart's PrometheusRule is tested with
# (e2e/tests/e2e/prometheus_rules.rs: `promtool check rules` and `promtool test rules`). Debian ships
# it in the `prometheus` package; the Prometheus server that comes with it is never started
# (a policy-rc.d keeps the package scripts from starting its service) and the tests never use it.
# Idempotent; quick when installed.
set -euo pipefail

if command -v promtool >/dev/null 2>&1; then
  promtool --version 2>&1 | head -1
  exit 0
fi
echo "setup-promtool: installing Debian's prometheus package (for promtool)"
start=$(date +%s)
. "$(dirname "$0")/../lib/debian-apt.sh"
apt_install_quietly --no-install-recommends prometheus
command -v promtool >/dev/null 2>&1 || {
  echo "setup-promtool: the prometheus package installed no promtool" >&2
  exit 1
}
promtool --version 2>&1 | head -1
echo "setup-promtool: installed in $(( $(date +%s) - start ))s"
