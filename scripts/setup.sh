#!/usr/bin/env bash
# Installs what paramd needs on Debian 12 (apt), only what is missing. Safe to run again.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git curl ca-certificates
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev grpc-proto
  libucx-dev ucx-utils prometheus-cpp-dev libgtest-dev libgmock-dev libbenchmark-dev
  clang-format iperf3 prometheus python3
  clang-14 libclang-rt-14-dev
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -q
  "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
