#!/usr/bin/env bash
# Installs promtool, the rule checker the chart's PrometheusRule is tested with
# (e2e/tests/e2e/prometheus_rules.rs: `promtool check rules` and `promtool test rules`). Debian ships
# it in the `prometheus` package; the Prometheus server that comes with it is never started
# (a policy-rc.d keeps the package scripts from starting its service) and the tests never use it.
# Idempotent; quick when installed.
set -euo pipefail

# apt_tool
. "$(dirname "$0")/../lib/debian-apt.sh"
apt_tool setup-promtool promtool prometheus
promtool --version 2>&1 | head -1
