#!/usr/bin/env bash
# The README's first command: installs the few packages the main job needs (scripts/setup.sh main),
# builds what it runs (the daemon, paramctl, the example trainer; CPU-only, no tests, in
# build-main/ or $PARAMD_MAIN_BUILD_DIR), then runs it (scripts/main_job.sh: the daemon plus a
# 2-rank training job through it, checked bit for bit), and says how long each phase took.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${PARAMD_MAIN_BUILD_DIR:-$root/build-main}
start=$(date +%s)

"$root/scripts/setup.sh" main
installed=$(date +%s)

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPARAMD_TESTS=OFF \
  -DPARAMD_CUDA=OFF -DPARAMD_NCCL=OFF -DPARAMD_UCX=OFF -DPARAMD_PYTHON=OFF \
  | grep -E "paramd|Error|error|Warning" || true
cmake --build "$build" -j "$(nproc)" --target paramd paramctl paramd_train_mlp
built=$(date +%s)

status=0
PARAMD_BUILD_DIR=$build "$root/scripts/main_job.sh" || status=$?
ran=$(date +%s)
echo "run_main_job: packages $(( installed - start )) s, build $(( built - installed )) s" \
  "($(nproc) cores), main job $(( ran - built )) s; $(( ran - start )) s in all"
exit "$status"
