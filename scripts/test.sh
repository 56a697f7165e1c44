#!/usr/bin/env bash
# The test command: installs what is missing, builds everything (CUDA code included when the
# toolkit is present), checks formatting, runs every test that needs no GPU.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${PARAMD_BUILD_DIR:-$root/build}
start=$(date +%s)

"$root/scripts/setup.sh"
"$root/scripts/check_format.sh"
"$root/scripts/build.sh"
# UCX over loopback needs its device named (DESIGN.md §6).
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
ctest --test-dir "$build" -LE gpu --output-on-failure -j "$(nproc)" --timeout 600
echo "test.sh: all tests passed in $(( $(date +%s) - start )) s"
