#!/usr/bin/env bash
# Regenerates docs/architecture.svg from docs/architecture.dot (Graphviz, Debian's `graphviz`).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v dot >/dev/null || { echo "gen-architecture: install graphviz (apt-get install graphviz)" >&2; exit 1; }
dot -Tsvg docs/architecture.dot -o docs/architecture.svg
echo "wrote docs/architecture.svg"
