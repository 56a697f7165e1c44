#!/usr/bin/env bash
# Configures and builds paramd into build/ (or $PARAMD_BUILD_DIR). CUDA and NCCL are used when the
# toolkit is found; without them the build is CPU-only and says so.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${PARAMD_BUILD_DIR:-$root/build}
extra=()
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  extra+=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${extra[@]}" "$@" \
  | grep -E "paramd|Error|error|Warning" || true
cmake --build "$build" -j "$(nproc)"
