#!/usr/bin/env bash
# The CRI bindings (crate k8s-cri, used by the e2e crate and the CRI proxy) run protoc at build
# time, so every tier that compiles the workspace needs it. Installs Debian's
# protobuf-compiler when protoc is missing; quick no-op otherwise.
set -euo pipefail
if command -v protoc >/dev/null 2>&1; then
  exit 0
fi
echo "ensure-protoc: installing protobuf-compiler"
flock /var/lock/kunpeng-tap-apt sh -c \
  'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq protobuf-compiler'
protoc --version
